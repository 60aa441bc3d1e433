// The numerical interpreter of a StepPlan; semantics in models/verify/verify.hpp.
#include "models/verify/interpreter.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

#include "models/errors.hpp"
#include "models/rank_grid.hpp"

namespace dtsim::verify {

namespace {

using refmath::Vector;

// Bytes per element the plan sizes its transfers with (models/plan.cpp): bf16 activations
// and parameters (its kAct = 2), fp32 per-token statistics of the vocab-parallel cross
// entropy (4 x tokens); gradients use PlanShape::grad_bytes_per_param.
constexpr double kActBytes = 2.0;
constexpr double kLossStatBytes = 4.0;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

size_t sz(int64_t x) { return static_cast<size_t>(x); }

/// A problem that stops execution (the plan cannot be interpreted further).
struct PlanFatal : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ------------------------------------------------------------------ local parameters --
/// A rank's local parameter tensors (TP shards in Megatron's layout).
enum class LK { word, pos, ln1_w, ln1_b, qkv_w, qkv_b, out_w, out_b, ln2_w, ln2_b, up_w, up_b, gate_w, down_w,
                down_b, final_w, final_b, head_w };

const char* lk_name(LK k) {
  switch (k) {
    case LK::word: return "embedding.word";
    case LK::pos: return "embedding.position";
    case LK::ln1_w: return "input_norm.weight";
    case LK::ln1_b: return "input_norm.bias";
    case LK::qkv_w: return "qkv.weight";
    case LK::qkv_b: return "qkv.bias";
    case LK::out_w: return "out_proj.weight";
    case LK::out_b: return "out_proj.bias";
    case LK::ln2_w: return "post_attention_norm.weight";
    case LK::ln2_b: return "post_attention_norm.bias";
    case LK::up_w: return "mlp_up.weight";
    case LK::up_b: return "mlp_up.bias";
    case LK::gate_w: return "mlp_gate.weight";
    case LK::down_w: return "mlp_down.weight";
    case LK::down_b: return "mlp_down.bias";
    case LK::final_w: return "final_norm.weight";
    case LK::final_b: return "final_norm.bias";
    case LK::head_w: return "lm_head.weight";
  }
  return "?";
}

/// Replicated over TP but computed on sequence shards with sequence parallelism: their
/// gradients are TP partial sums (Megatron all-reduces them over TP:
/// megatron/core/distributed/finalize_model_grads.py, _allreduce_layernorm_grads).
bool sp_partial_grad(LK k) {
  return k == LK::ln1_w || k == LK::ln1_b || k == LK::ln2_w || k == LK::ln2_b || k == LK::final_w ||
         k == LK::final_b || k == LK::out_b || k == LK::down_b;
}

struct LocalParam {
  LK kind = LK::word;
  int layer = -1;
  Mat value, grad;                 // local shard; working gradient (since the last hand-off)
  std::vector<double> total;       // every local contribution this step (adam-before-sync)
  std::vector<int64_t> gidx;       // global flat index of each element
  bool tp_sharded = false;         // a distinct shard per TP rank
  bool z3 = false;                 // ZeRO-3: only owned elements are stored between uses
  bool materialized = true;        // z3: every element present (gathered)
  std::vector<double> synced;      // gradient after the DP collective (owned elements)
  std::vector<uint8_t> owned, has_synced;
  std::vector<uint8_t> fresh;      // holds this step's value (updated here or gathered since)
  refmath::AdamState adam;
  std::vector<int64_t> adam_idx;   // elements this rank's Adam updates
  bool adam_init = false;
  int64_t size() const { return value.size(); }
};

// --------------------------------------------------------------- chain and workspace --
/// What the tensor produced last by a stage's chain of ops is.
enum class Tag { none, embed_out, stream, norm1, norm2, normf, qkv, ctx, attn_out, col_mlp, act, mlp_out, logits, ce,
                 dlogits, dnormf, dnorm1, dnorm2, d_attn_out, d_mlp_out, d_ctx, d_act, d_col_mlp, d_qkv };

struct Reg {
  Mat m;
  Tag tag = Tag::none;
  int layer = -1;
  int mb = -1;
  bool partial = false;    // a TP partial sum
  bool seq_shard = false;  // sequence-parallel shard: tokens [r sl/t, (r+1) sl/t) of each sample
  bool chunk = false;      // a P2P chunk: elements [r n/t, (r+1) n/t) of the flattened tensor
  bool from_pp = false;    // arrived from another stage (not compared yet)
  int model_chunk = 0;     // model chunk (virtual stage) the message arrived for
  int64_t full_rows = 0, full_cols = 0;  // shape before chunking
};

enum class Slot : uint8_t { x_in, res, n1, n2, nf, re1, re2, ref, tmp_in, q, k, v, kv_all, att_m, att_l, att_acc, ctx,
                            lse, probs, u, g, act, logits, ce_a, ce_shift, ce_tgt, ce_z, dlogits, dx_stream, d_branch, dctx,
                            dq, dkv_all, dk, dv, dprobs, du, dg, dqkv };

constexpr int kSlots = static_cast<int>(Slot::dqkv) + 1;
constexpr int kLKs = static_cast<int>(LK::head_w) + 1;

/// What a rank keeps for one (layer, micro-batch): tensors by slot and norm statistics.
struct Frame {
  std::array<Mat, kSlots> m;
  std::array<bool, kSlots> has{};
  std::array<NormCache, 3> norm;  // input_norm, post_attention_norm, final_norm
  std::array<bool, 3> has_norm{};
};
int64_t fkey(int layer, int mb) {
  return (static_cast<int64_t>(layer + 1) << 32) | static_cast<int64_t>(static_cast<uint32_t>(mb + 1));
}
int norm_ix(Slot s) { return s == Slot::n1 ? 0 : s == Slot::n2 ? 1 : 2; }

struct RankState {
  int64_t rank = 0;
  RankCoord c;
  int stage = 0;
  int64_t dpcp_index = 0;  // position in the DPxCP group
  std::vector<LocalParam> params;
  std::vector<int> index;  // (layer + 1) * kLKs + kind -> params index, -1 if not held
  std::unordered_map<int64_t, Frame> frames;
  std::map<std::pair<int, int>, std::vector<Tag>> tape;  // (layer, mb): row-parallel branches done
  std::map<int, int> ce_stage;                            // mb -> TP reductions of the loss done
  Reg cur[3];                                             // forward, recompute, backward chains
  double loss_scaled = 0;
  std::set<int> materialized_layers;
};

/// Op identities the interpreter knows (op names are stable; see verify.hpp).
enum class Fn {
  embedding, input_norm, post_attention_norm, final_norm, qkv, rope, attention, attention_local, attention_remote,
  attention_scores, softmax_dropout, attention_values, out_proj, dropout_residual, mlp_up, mlp_gate, gelu, swiglu,
  mlp_down, lm_head, cross_entropy,
  cross_entropy_bwd, lm_head_dgrad, lm_head_wgrad, final_norm_bwd, dropout_residual_bwd, mlp_down_dgrad,
  mlp_down_wgrad, gelu_bwd, swiglu_bwd, mlp_up_dgrad, mlp_up_wgrad, post_attention_norm_bwd, out_proj_dgrad,
  out_proj_wgrad, attention_bwd, attention_bwd_local, attention_bwd_remote, attention_values_bwd,
  softmax_dropout_bwd, attention_scores_bwd, rope_bwd, qkv_dgrad, qkv_wgrad, input_norm_bwd, embedding_bwd,
  optimizer_adam,
  // collectives
  chain, ce_reduce, regather, cp_kv, cp_dkv, dp_grad, dp_param_gather, sp_grad_allreduce, embed_grad,
  // p2p and waits
  send, recv, wait,
};

const std::unordered_map<std::string_view, Fn>& fn_table() {
  static const std::unordered_map<std::string_view, Fn> t = {
      {"embedding", Fn::embedding}, {"input_norm", Fn::input_norm},
      {"post_attention_norm", Fn::post_attention_norm}, {"final_norm", Fn::final_norm}, {"qkv", Fn::qkv},
      {"rope", Fn::rope}, {"attention", Fn::attention}, {"attention_local", Fn::attention_local},
      {"attention_remote", Fn::attention_remote}, {"attention_scores", Fn::attention_scores},
      {"softmax_dropout", Fn::softmax_dropout}, {"attention_values", Fn::attention_values},
      {"out_proj", Fn::out_proj}, {"dropout_residual", Fn::dropout_residual}, {"mlp_up", Fn::mlp_up},
      {"mlp_gate", Fn::mlp_gate}, {"gelu", Fn::gelu}, {"swiglu", Fn::swiglu}, {"mlp_down", Fn::mlp_down},
      {"lm_head", Fn::lm_head}, {"cross_entropy", Fn::cross_entropy},
      {"cross_entropy_bwd", Fn::cross_entropy_bwd}, {"lm_head_dgrad", Fn::lm_head_dgrad},
      {"lm_head_wgrad", Fn::lm_head_wgrad}, {"final_norm_bwd", Fn::final_norm_bwd},
      {"dropout_residual_bwd", Fn::dropout_residual_bwd}, {"mlp_down_dgrad", Fn::mlp_down_dgrad},
      {"mlp_down_wgrad", Fn::mlp_down_wgrad}, {"gelu_bwd", Fn::gelu_bwd}, {"swiglu_bwd", Fn::swiglu_bwd},
      {"mlp_up_dgrad", Fn::mlp_up_dgrad}, {"mlp_up_wgrad", Fn::mlp_up_wgrad},
      {"post_attention_norm_bwd", Fn::post_attention_norm_bwd}, {"out_proj_dgrad", Fn::out_proj_dgrad},
      {"out_proj_wgrad", Fn::out_proj_wgrad}, {"attention_bwd", Fn::attention_bwd},
      {"attention_bwd_local", Fn::attention_bwd_local}, {"attention_bwd_remote", Fn::attention_bwd_remote},
      {"attention_values_bwd", Fn::attention_values_bwd}, {"softmax_dropout_bwd", Fn::softmax_dropout_bwd},
      {"attention_scores_bwd", Fn::attention_scores_bwd}, {"rope_bwd", Fn::rope_bwd},
      {"qkv_dgrad", Fn::qkv_dgrad}, {"qkv_wgrad", Fn::qkv_wgrad}, {"input_norm_bwd", Fn::input_norm_bwd},
      {"embedding_bwd", Fn::embedding_bwd}, {"optimizer_adam", Fn::optimizer_adam},
      {"tp_allreduce", Fn::chain}, {"tp_reducescatter", Fn::chain}, {"tp_allgather", Fn::chain},
      {"pp_tp_allgather", Fn::chain}, {"tp_allreduce_loss", Fn::ce_reduce}, {"tp_allreduce_loss_max", Fn::ce_reduce},
      {"tp_allgather_input", Fn::regather}, {"cp_kv_allgather", Fn::cp_kv},
      {"cp_dkv_reducescatter", Fn::cp_dkv}, {"dp_grad_allreduce", Fn::dp_grad},
      {"dp_grad_reducescatter", Fn::dp_grad}, {"dp_param_allgather", Fn::dp_param_gather},
      // Not in the plan yet: the TP AllReduce of sequence-parallel replicated gradients the
      // verifier asks for (see the report's SP note); interpreted when present.
      {"tp_sp_grad_allreduce", Fn::sp_grad_allreduce},
      {"embedding_grad_allreduce", Fn::embed_grad},
  };
  return t;
}

struct Bucket {
  std::vector<int> params;  // local parameter indices, canonical order
  int64_t elems = 0;
};

enum RuleIx { kLoss = 0, kDP, kTP, kCP, kPP, kZeRO, kRules };

struct Acc {
  double max_err = 0;
  int64_t n = 0;
  std::string worst;
};

double abs_err(double a, double b) {
  const double e = std::fabs(a - b);
  return std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
}

int phase_ix(Phase p) {
  switch (p) {
    case Phase::forward: return 0;
    case Phase::recompute: return 1;
    case Phase::backward: return 2;
    case Phase::optimizer: return 2;
  }
  return 0;
}

}  // namespace

// ======================================================================================
struct Interpreter::Impl {
  const TinyModel& M;
  const StepPlan& plan;
  VerifyOptions opt;
  RankGrid grid;
  int64_t t = 1, cp = 1, dp = 1, pp = 1, dpcp = 1, sl = 0, S = 0, b = 1, al = 1, gl = 1, d = 1, ft = 1, Vt = 1,
          h = 0, m_count = 1;
  bool sp = false;
  int zero = 0;
  double grad_bytes = 4;
  std::vector<RankState> ranks;
  std::vector<std::vector<int64_t>> stage_ranks;
  std::vector<std::map<GroupKind, std::vector<std::vector<int64_t>>>> stage_groups;
  std::vector<std::vector<Fn>> fns;
  std::vector<std::set<int>> stage_layers;                       // layers each stage's ops use
  std::vector<std::set<int>> gathered_layers;  // layers a per-layer dp_param_allgather gathers
  std::vector<std::map<int, std::pair<int, int>>> chunk_layers;  // [stage] chunk -> first, last layer
  bool per_mb_reduce = false;  // gradients reduced per micro-batch (ZeRO-3, reduce_every_micro_batch)
  // Gradient writes by op identity: [stage][op index] -> params written (static_writes),
  // and [stage][param][mb] -> index of the last op writing that gradient.
  std::vector<std::vector<std::vector<int>>> writes_at;
  std::vector<std::vector<std::vector<int64_t>>> last_write;
  std::vector<std::vector<std::vector<uint8_t>>> reduced_mb;  // [stage][param][mb]
  std::vector<std::vector<uint8_t>> reduced_step;              // [stage][param]
  // step state
  const Batch* batch = nullptr;
  const RefStep* ref = nullptr;
  int step = 0;
  int cur_stage = 0;
  size_t cur_idx = 0;
  std::vector<std::map<int, std::function<void()>>> pending;
  struct Msg {
    int mb = -1;
    int64_t vs = -1;  // sender's virtual stage
    Reg reg;
  };
  std::map<std::tuple<int64_t, int64_t, int>, std::deque<Msg>> mail;
  // rules
  Acc acc[kRules];
  std::vector<std::string> problems;
  std::set<std::string> problem_set;
  std::vector<std::string> notes;
  std::set<std::string> note_set;
  bool fatal = false;

  Impl(const TinyModel& model, const StepPlan& p, const VerifyOptions& o)
      : M(model), plan(p), opt(o), grid(p.exp.layout) {
    const Layout& l = plan.exp.layout;
    t = l.tp;
    cp = l.cp;
    dp = l.dp;
    pp = l.pp;
    dpcp = dp * cp;
    S = M.seq;
    sl = plan.shape.tokens_local;
    b = M.micro_batch;
    m_count = plan.shape.micro_batches;
    al = M.heads / t;
    gl = M.kv_heads / t;
    d = M.hd;
    ft = M.ffn / t;
    Vt = M.V / t;
    h = M.h;
    sp = l.sequence_parallel && t > 1;
    zero = l.zero_stage;
    grad_bytes = static_cast<double>(plan.shape.grad_bytes_per_param);
    per_mb_reduce = zero == 3 || plan.exp.training.reduce_every_micro_batch;
    if (sl * cp != S) throw InputError("verify: plan tokens_local * cp != seq_len");
    if (static_cast<int64_t>(plan.stages.size()) != pp) throw InputError("verify: plan has not pp stages");
    resolve_ops();
    build_ranks();
    build_write_table();
    pending.resize(sz(pp));
  }

  // ------------------------------------------------------------------ problems --------
  std::string where(const Op& op) const {
    return fmt::format("stage {} op #{} '{}' ({}{}{})", cur_stage, cur_idx, op.name, to_string(op.phase),
                       op.layer >= 0 ? fmt::format(", layer {}", op.layer) : std::string(),
                       op.micro_batch >= 0 ? fmt::format(", micro-batch {}", op.micro_batch) : std::string());
  }
  void problem(const std::string& p) {
    if (problem_set.insert(p).second && problems.size() < 40) problems.push_back(p);
  }
  void problem(const Op& op, const std::string& what) { problem(where(op) + ": " + what); }
  [[noreturn]] void die(const Op& op, const std::string& what) {
    problem(op, what);
    throw PlanFatal(what);
  }
  void note(const std::string& n) {
    if (note_set.insert(n).second) notes.push_back(n);
  }
  void check_size(const Op& op, double expect_bytes, const char* what) {
    if (std::fabs(op.size_bytes - expect_bytes) > 0.5)
      problem(op, fmt::format("size_bytes {} but {} is {} bytes", op.size_bytes, what, expect_bytes));
  }

  // ------------------------------------------------------------------ setup -----------
  void add_param(RankState& R, LK k, int layer, int64_t rows, int64_t cols, bool tp_sharded,
                 const std::function<int64_t(int64_t, int64_t)>& gmap) {
    LocalParam p;
    p.kind = k;
    p.layer = layer;
    p.value = Mat(rows, cols);
    p.grad = Mat(rows, cols);
    p.tp_sharded = tp_sharded && t > 1;
    p.gidx.resize(sz(rows * cols));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) p.gidx[sz(i * cols + j)] = gmap(i, j);
    const size_t ix = sz((layer + 1) * kLKs + static_cast<int>(k));
    if (R.index.size() <= ix) R.index.resize(ix + 1, -1);
    R.index[ix] = static_cast<int>(R.params.size());
    R.params.push_back(std::move(p));
  }

  void build_params(RankState& R) {
    const int64_t r = R.c.tp;
    const StagePlan& st = plan.stages[sz(R.stage)];
    auto full = [&](PKind k, int layer) {
      const PSeg s = M.seg(k, layer);
      return [s](int64_t i, int64_t j) { return s.offset + i * s.cols + j; };
    };
    const bool first = R.stage == 0, last = R.stage == pp - 1;
    if (first) {
      const PSeg w = M.seg(PKind::embed_word);
      add_param(R, LK::word, -1, Vt, h, true, [=, this](int64_t i, int64_t j) { return w.offset + (r * Vt + i) * h + j; });
      if (M.learned_pos) add_param(R, LK::pos, -1, S, h, false, full(PKind::embed_pos, -1));
    }
    for (const int l : stage_layers[sz(R.stage)]) {
      add_param(R, LK::ln1_w, l, 1, h, false, full(PKind::ln1_w, l));
      if (M.layernorm) add_param(R, LK::ln1_b, l, 1, h, false, full(PKind::ln1_b, l));
      const PSeg wq = M.seg(PKind::wq, l), wk = M.seg(PKind::wk, l), wv = M.seg(PKind::wv, l);
      const int64_t qc = al * d, kc = gl * d;
      // Megatron's column-parallel QKV: this rank's query heads, then its key and value heads.
      auto qkv_col = [=, this](const PSeg& q, const PSeg& k, const PSeg& v, int64_t i, int64_t j) {
        if (j < qc) return q.offset + i * q.cols + r * qc + j;
        if (j < qc + kc) return k.offset + i * k.cols + r * kc + (j - qc);
        return v.offset + i * v.cols + r * kc + (j - qc - kc);
      };
      add_param(R, LK::qkv_w, l, h, qc + 2 * kc, true, [=](int64_t i, int64_t j) { return qkv_col(wq, wk, wv, i, j); });
      if (M.bias) {
        const PSeg bq = M.seg(PKind::bq, l), bk = M.seg(PKind::bk, l), bv = M.seg(PKind::bv, l);
        add_param(R, LK::qkv_b, l, 1, qc + 2 * kc, true, [=](int64_t i, int64_t j) { return qkv_col(bq, bk, bv, i, j); });
      }
      const PSeg wo = M.seg(PKind::wo, l);
      add_param(R, LK::out_w, l, qc, h, true, [=, this](int64_t i, int64_t j) { return wo.offset + (r * qc + i) * h + j; });
      if (M.bias) add_param(R, LK::out_b, l, 1, h, false, full(PKind::bo, l));
      add_param(R, LK::ln2_w, l, 1, h, false, full(PKind::ln2_w, l));
      if (M.layernorm) add_param(R, LK::ln2_b, l, 1, h, false, full(PKind::ln2_b, l));
      const PSeg wu = M.seg(PKind::wu, l);
      const int64_t f = M.ffn;
      add_param(R, LK::up_w, l, h, ft, true, [=, this](int64_t i, int64_t j) { return wu.offset + i * f + r * ft + j; });
      if (M.bias) {
        const PSeg bu = M.seg(PKind::bu, l);
        add_param(R, LK::up_b, l, 1, ft, true, [=, this](int64_t, int64_t j) { return bu.offset + r * ft + j; });
      }
      if (M.swiglu) {
        const PSeg wg = M.seg(PKind::wg, l);
        add_param(R, LK::gate_w, l, h, ft, true, [=, this](int64_t i, int64_t j) { return wg.offset + i * f + r * ft + j; });
      }
      const PSeg wd = M.seg(PKind::wd, l);
      add_param(R, LK::down_w, l, ft, h, true, [=, this](int64_t i, int64_t j) { return wd.offset + (r * ft + i) * h + j; });
      if (M.bias) add_param(R, LK::down_b, l, 1, h, false, full(PKind::bd, l));
    }
    if (last) {
      add_param(R, LK::final_w, -1, 1, h, false, full(PKind::final_w, -1));
      if (M.layernorm) add_param(R, LK::final_b, -1, 1, h, false, full(PKind::final_b, -1));
      // Untied: the LM head; tied with pp > 1: Megatron's copy of the word embedding on
      // the last stage (same global parameter); tied with pp == 1: the embedding itself.
      if (!M.tied || pp > 1) {
        const PSeg w = M.seg(M.tied ? PKind::embed_word : PKind::head_w);
        add_param(R, LK::head_w, -1, Vt, h, true, [=, this](int64_t i, int64_t j) { return w.offset + (r * Vt + i) * h + j; });
      }
    }
    int64_t n = 0;
    for (auto& p : R.params) {
      n += p.size();
      p.fresh.assign(sz(p.size()), 1);
    }
    if (std::fabs(static_cast<double>(n) - st.params_per_rank) > 0.5)
      throw InputError(fmt::format("verify: stage {} of the plan counts {} parameters per rank, the tiny model holds {}",
                                   R.stage, st.params_per_rank, n));
  }

  void build_ranks() {
    const int64_t world = grid.world();
    ranks.resize(sz(world));
    stage_ranks.assign(sz(pp), {});
    stage_groups.assign(sz(pp), {});
    for (int64_t r = 0; r < world; ++r) {
      RankState& R = ranks[sz(r)];
      R.rank = r;
      R.c = grid.coord_of(r);
      R.stage = static_cast<int>(R.c.pp);
      const auto g = grid.group_of(r, GroupKind::DPxCP);
      R.dpcp_index = std::find(g.begin(), g.end(), r) - g.begin();
      stage_ranks[sz(R.c.pp)].push_back(r);
      build_params(R);
    }
    for (int64_t st = 0; st < pp; ++st)
      for (GroupKind k : {GroupKind::TP, GroupKind::CP, GroupKind::DP, GroupKind::PP, GroupKind::DPxCP}) {
        std::set<std::vector<int64_t>> seen;
        std::vector<std::vector<int64_t>> gs;
        for (int64_t r : stage_ranks[sz(st)]) {
          auto g = grid.group_of(r, k);
          if (seen.insert(g).second) gs.push_back(std::move(g));
        }
        stage_groups[sz(st)][k] = std::move(gs);
      }
    // ZeRO-3: layer parameters are sharded over DPxCP; each layer's parameters, flattened
    // in the stage's canonical order, split into equal chunks (the last padded).
    if (zero == 3 && dpcp > 1)
      for (auto& R : ranks)
        for (auto& p : R.params)
          if (p.layer >= 0) p.z3 = true;
    for (auto& R : ranks) {
      std::map<int, int64_t> offset, total;
      for (auto& p : R.params)
        if (p.z3) total[p.layer] += p.size();
      for (auto& p : R.params) {
        // Without ZeRO-3 an element gets an owner from the gradient collective (every rank
        // after an AllReduce, one after a ReduceScatter); with dp*cp == 1 the rank owns all.
        p.owned.assign(sz(p.size()), dpcp == 1 ? 1 : 0);
        if (!p.z3) continue;
        const int64_t P = total[p.layer], c = (P + dpcp - 1) / dpcp;
        const int64_t lo = R.dpcp_index * c, hi = std::min(P, lo + c);
        for (int64_t e = 0; e < p.size(); ++e) {
          const int64_t f = offset[p.layer] + e;
          p.owned[sz(e)] = f >= lo && f < hi;
        }
        offset[p.layer] += p.size();
      }
    }
  }

  void resolve_ops() {
    const auto& table = fn_table();
    fns.assign(sz(pp), {});
    for (int64_t st = 0; st < pp; ++st)
      for (const Op& op : plan.stages[sz(st)].ops) {
        Fn f = Fn::wait;
        switch (op.type) {
          case OpType::send: f = Fn::send; break;
          case OpType::recv: f = Fn::recv; break;
          case OpType::wait: f = Fn::wait; break;
          default: {
            auto it = table.find(op.name);
            if (it == table.end())
              throw InputError(fmt::format("verify: stage {} op '{}' ({}) has no interpretation; the verifier knows "
                                           "every op name of models/plan.cpp: add this one to models/verify/",
                                           st, op.name, to_string(op.phase)));
            f = it->second;
          }
        }
        fns[sz(st)].push_back(f);
      }
    stage_layers.assign(sz(pp), {});
    chunk_layers.assign(sz(pp), {});
    gathered_layers.assign(sz(pp), {});
    for (int64_t st = 0; st < pp; ++st)
      for (const Op& op : plan.stages[sz(st)].ops) {
        if (op.layer < 0) continue;
        if (std::string_view(op.name) == "dp_param_allgather") gathered_layers[sz(st)].insert(op.layer);
        stage_layers[sz(st)].insert(op.layer);
        auto [it, fresh] = chunk_layers[sz(st)].try_emplace(op.chunk, op.layer, op.layer);
        if (!fresh) {
          it->second.first = std::min(it->second.first, op.layer);
          it->second.second = std::max(it->second.second, op.layer);
        }
      }
  }

  void load_params(const std::vector<double>& global) {
    for (auto& R : ranks)
      for (auto& p : R.params) {
        for (int64_t e = 0; e < p.size(); ++e) p.value.v[sz(e)] = global[sz(p.gidx[sz(e)])];
        if (p.z3) free_param(p);
      }
  }

  void free_param(LocalParam& p) {
    for (int64_t e = 0; e < p.size(); ++e)
      if (!p.owned[sz(e)]) {
        p.value.v[sz(e)] = kNaN;  // poison: a use before the gather shows
        p.fresh[sz(e)] = 0;
      }
    p.materialized = false;
  }

  // ------------------------------------------------------------------ access ----------
  Mat& put(RankState& R, int layer, int mb, Slot s, Mat m) {
    Frame& f = R.frames[fkey(layer, mb)];
    f.has[static_cast<size_t>(s)] = true;
    return f.m[static_cast<size_t>(s)] = std::move(m);
  }
  Mat* find(RankState& R, int layer, int mb, Slot s) {
    auto it = R.frames.find(fkey(layer, mb));
    if (it == R.frames.end() || !it->second.has[static_cast<size_t>(s)]) return nullptr;
    return &it->second.m[static_cast<size_t>(s)];
  }
  Mat& need(RankState& R, int layer, int mb, Slot s, const Op& op, const char* what) {
    Mat* m = find(R, layer, mb, s);
    if (!m) die(op, fmt::format("needs {}, which no earlier op produced (or it was freed)", what));
    return *m;
  }
  void drop(RankState& R, int layer, int mb, Slot s) {
    auto it = R.frames.find(fkey(layer, mb));
    if (it == R.frames.end()) return;
    it->second.has[static_cast<size_t>(s)] = false;
    it->second.m[static_cast<size_t>(s)] = Mat();
  }
  void drop_layer(RankState& R, int layer, int mb, bool keep_input) {
    auto it = R.frames.find(fkey(layer, mb));
    if (it != R.frames.end()) {
      const bool had = it->second.has[static_cast<size_t>(Slot::x_in)];
      Mat x = std::move(it->second.m[static_cast<size_t>(Slot::x_in)]);
      R.frames.erase(it);
      if (keep_input && had) put(R, layer, mb, Slot::x_in, std::move(x));
    }
    R.tape.erase({layer, mb});
  }
  NormCache& put_norm(RankState& R, int layer, int mb, Slot s, NormCache c) {
    Frame& f = R.frames[fkey(layer, mb)];
    f.has_norm[sz(norm_ix(s))] = true;
    return f.norm[sz(norm_ix(s))] = std::move(c);
  }
  const NormCache* find_norm(RankState& R, int layer, int mb, Slot s) {
    auto it = R.frames.find(fkey(layer, mb));
    if (it == R.frames.end() || !it->second.has_norm[sz(norm_ix(s))]) return nullptr;
    return &it->second.norm[sz(norm_ix(s))];
  }

  LocalParam& P(RankState& R, LK k, int layer, const Op& op) {
    const int i = pindex(R, k, layer);
    if (i < 0)
      die(op, fmt::format("needs parameter {} of layer {}, which stage {} does not hold", lk_name(k), layer, R.stage));
    LocalParam& p = R.params[sz(i)];
    if (p.z3 && !p.materialized)
      problem(op, fmt::format("uses ZeRO-3 parameters of layer {} that no dp_param_allgather gathered", layer));
    return p;
  }
  int pindex(const RankState& R, LK k, int layer) const {
    const size_t ix = sz((layer + 1) * kLKs + static_cast<int>(k));
    return ix < R.index.size() ? R.index[ix] : -1;
  }
  LK head_kind() const { return (!M.tied || pp > 1) ? LK::head_w : LK::word; }

  void grad_add(RankState& R, LK k, int layer, int mb, const Mat& g, const Op& op) {
    LocalParam& p = P(R, k, layer, op);
    add_into(p.grad, g);
    note_write(R, k, layer, mb);
  }
  void grad_add(RankState& R, LK k, int layer, int mb, const std::vector<double>& g, const Op& op) {
    LocalParam& p = P(R, k, layer, op);
    for (size_t i = 0; i < g.size(); ++i) p.grad.v[i] += g[i];
    note_write(R, k, layer, mb);
  }
  /// Checks a gradient write against the op's static write-set (first rank of a stage).
  void note_write(RankState& R, LK k, int layer, int mb) {
    (void)mb;
    if (R.rank != stage_ranks[sz(R.stage)].front()) return;
    const int i = pindex(R, k, layer);
    const auto& w = writes_at[sz(R.stage)][cur_idx];
    if (std::find(w.begin(), w.end(), i) == w.end())
      problem(fmt::format("verifier: stage {} op #{} '{}' wrote the gradient of {} (layer {}), which its static "
                          "write-set lacks (models/verify/interpreter.cpp static_writes)",
                          R.stage, cur_idx, plan.stages[sz(R.stage)].ops[cur_idx].name, lk_name(k), layer));
  }

  /// The parameter gradients an op writes, by its identity. A layer's two
  /// dropout_residual_bwd ops are the MLP branch (first) and the attention branch (second),
  /// the reverse of the forward order.
  std::vector<LK> static_writes(Fn fn, int ordinal) const {
    std::vector<LK> w;
    auto add = [&](LK k, bool present = true) {
      if (present) w.push_back(k);
    };
    switch (fn) {
      case Fn::lm_head_wgrad: add(head_kind()); break;
      case Fn::final_norm_bwd: add(LK::final_w); add(LK::final_b, M.layernorm); break;
      case Fn::dropout_residual_bwd: add(ordinal == 0 ? LK::down_b : LK::out_b, M.bias); break;
      case Fn::mlp_down_wgrad: add(LK::down_w); break;
      case Fn::mlp_up_wgrad: add(LK::up_w); add(LK::up_b, M.bias); add(LK::gate_w, M.swiglu); break;
      case Fn::post_attention_norm_bwd: add(LK::ln2_w); add(LK::ln2_b, M.layernorm); break;
      case Fn::out_proj_wgrad: add(LK::out_w); break;
      case Fn::qkv_wgrad: add(LK::qkv_w); add(LK::qkv_b, M.bias); break;
      case Fn::input_norm_bwd: add(LK::ln1_w); add(LK::ln1_b, M.layernorm); break;
      case Fn::embedding_bwd: add(LK::word); add(LK::pos, M.learned_pos); break;
      default: break;
    }
    return w;
  }

  void build_write_table() {
    writes_at.assign(sz(pp), {});
    last_write.assign(sz(pp), {});
    for (int64_t st = 0; st < pp; ++st) {
      const RankState& R = ranks[sz(stage_ranks[sz(st)].front())];
      const auto& ops = plan.stages[sz(st)].ops;
      writes_at[sz(st)].assign(ops.size(), {});
      last_write[sz(st)].assign(R.params.size(), std::vector<int64_t>(sz(m_count), -1));
      std::map<std::pair<int, int>, int> ordinal;
      for (size_t i = 0; i < ops.size(); ++i) {
        const Op& op = ops[i];
        const Fn fn = fns[sz(st)][i];
        const int mb = op.micro_batch >= 0 ? op.micro_batch : static_cast<int>(m_count - 1);
        std::vector<int> ps;
        if (fn == Fn::sp_grad_allreduce) {
          for (size_t p = 0; p < R.params.size(); ++p)
            if (sp_partial_grad(R.params[p].kind)) ps.push_back(static_cast<int>(p));
        } else if (fn == Fn::embed_grad) {
          const int p = pindex(R, st == 0 ? LK::word : LK::head_w, -1);
          if (p >= 0) ps.push_back(p);
        } else {
          const int ord = fn == Fn::dropout_residual_bwd ? ordinal[{op.layer, op.micro_batch}]++ : 0;
          for (LK k : static_writes(fn, ord)) {
            const int p = pindex(R, k, op.layer);
            if (p >= 0) ps.push_back(p);
          }
        }
        // The SP and embedding-group AllReduces act on gradients as they stand (reduced
        // over DP or not), so they do not delay the DP collectives.
        if (fn != Fn::sp_grad_allreduce && fn != Fn::embed_grad)
          for (int p : ps)
            if (mb >= 0 && mb < m_count) last_write[sz(st)][sz(p)][sz(mb)] = static_cast<int64_t>(i);
        writes_at[sz(st)][i] = std::move(ps);
      }
    }
  }

  // ------------------------------------------------------------------ data ------------
  int64_t sample_of(const RankState& R, int mb, int64_t bi) const { return (mb * dp + R.c.dp) * b + bi; }
  /// Global sequence position of local row `row` of a token matrix (seq_shard: SP shard).
  int64_t pos_of(const RankState& R, int64_t row, int64_t rows, bool seq_shard) const {
    const int64_t n = rows / b;
    const int64_t off = R.c.cp * sl + (seq_shard ? R.c.tp * (sl / t) : 0);
    return off + row % n;
  }
  std::vector<int64_t> positions(const RankState& R, int64_t rows, bool seq_shard) const {
    std::vector<int64_t> p(sz(rows));
    for (int64_t i = 0; i < rows; ++i) p[sz(i)] = pos_of(R, i, rows, seq_shard);
    return p;
  }
  size_t data_index(const RankState& R, int mb, int64_t row, int64_t rows) const {
    const int64_t n = rows / b;
    return sz(sample_of(R, mb, row / n) * S + R.c.cp * sl + row % n);
  }
  double loss_scale(const RankState& R, int mb) const {
    const double N = static_cast<double>(batch->n_valid);
    switch (opt.inject) {
      case Injection::dp_local_mean: {
        int64_t local = 0;
        for (int64_t row = 0; row < b * sl; ++row) local += batch->valid[data_index(R, mb, row, b * sl)];
        return local > 0 ? 1.0 / (static_cast<double>(local) * static_cast<double>(m_count)) : 0.0;
      }
      case Injection::cp_loss_scale: return static_cast<double>(dp) / N;
      default: return static_cast<double>(dpcp) / N;
    }
  }

  // ------------------------------------------------------------------ comparisons -----
  void record(int rule, double err, const std::function<std::string()>& at) {
    Acc& a = acc[rule];
    ++a.n;
    if (err > a.max_err || (a.worst.empty() && err >= a.max_err)) {
      a.max_err = err;
      a.worst = at();
    }
  }
  std::string rank_str(const RankState& R) const {
    return fmt::format("rank {} (tp {} cp {} dp {} pp {})", R.rank, R.c.tp, R.c.cp, R.c.dp, R.c.pp);
  }
  /// Compares a local token matrix with the reference probe (rows mapped to the batch,
  /// columns from col0). Gradients (`grad`): a rank's loss is scaled by |DPxCP| / N_global
  /// and the reference's by 1 / N_global, so the rank's activation gradients are divided
  /// by |DPxCP| first.
  void compare_tokens(int rule, const Mat& local, Probe p, int layer, const RankState& R, int mb, bool seq_shard,
                      int64_t col0, const char* when, bool grad = false) {
    if (!ref) return;
    const Mat& g = ref->probe(p, layer);
    const int64_t n = local.rows / b;
    const double k = grad ? 1.0 / static_cast<double>(dpcp) : 1.0;
    for (int64_t row = 0; row < local.rows; ++row) {
      const int64_t grow = sample_of(R, mb, row / n) * S + pos_of(R, row, local.rows, seq_shard);
      for (int64_t j = 0; j < local.cols; ++j) {
        const double e = abs_err(k * local.at(row, j), g.at(grow, col0 + j));
        if (e > acc[rule].max_err || acc[rule].worst.empty())
          record(rule, e, [&] {
            return fmt::format("{} of layer {} (step {}, micro-batch {}, {}, {}): {} vs {}", to_string(p), layer, step,
                               mb, rank_str(R), when, k * local.at(row, j), g.at(grow, col0 + j));
          });
        else
          ++acc[rule].n;
      }
    }
  }

  bool probe_of(const Reg& r, bool backward, Probe& p, int& layer) const {
    layer = r.layer;
    switch (r.tag) {
      case Tag::embed_out: p = Probe::embed_out; layer = -1; return true;
      case Tag::attn_out: p = Probe::attn_out; return true;
      case Tag::mlp_out: p = Probe::mlp_out; return true;
      case Tag::norm1: p = Probe::ln1_out; return true;
      case Tag::norm2: p = Probe::ln2_out; return true;
      case Tag::normf: p = Probe::final_ln_out; layer = -1; return true;
      case Tag::dnorm1: p = Probe::d_ln1_out; return true;
      case Tag::dnorm2: p = Probe::d_ln2_out; return true;
      case Tag::dnormf: p = Probe::d_final_ln_out; layer = -1; return true;
      case Tag::d_attn_out: p = Probe::d_x_mid; return true;
      case Tag::d_mlp_out: p = Probe::d_x_out; return true;
      case Tag::stream:
        if (!backward) return false;
        p = Probe::d_x_in;
        return r.layer >= 0;
      default: return false;
    }
  }

  void pp_probe(RankState& R, Reg& reg, bool backward) {
    reg.from_pp = false;
    auto it = chunk_layers[sz(R.stage)].find(reg.model_chunk);
    if (it == chunk_layers[sz(R.stage)].end()) return;  // a chunk without layers
    if (backward)
      compare_tokens(kPP, reg.m, Probe::d_x_out, it->second.second, R, reg.mb, reg.seq_shard, 0, "received gradient",
                     true);
    else
      compare_tokens(kPP, reg.m, Probe::x_in, it->second.first, R, reg.mb, reg.seq_shard, 0, "received activation");
  }

  // ------------------------------------------------------------------ collectives -----
  refmath::ReduceOp rop(const Op& op) {
    ReduceOp r = op.reduce;
    if (opt.inject == Injection::tp_grad_avg && op.kind == CommKind::TP && op.phase == Phase::backward &&
        r == ReduceOp::sum)
      r = ReduceOp::avg;
    if (opt.inject == Injection::dp_grad_sum && op.kind == CommKind::DP && r == ReduceOp::avg) r = ReduceOp::sum;
    switch (r) {
      case ReduceOp::sum: return refmath::ReduceOp::sum;
      case ReduceOp::avg: return refmath::ReduceOp::avg;
      case ReduceOp::max: return refmath::ReduceOp::max;
      case ReduceOp::none: break;
    }
    die(op, fmt::format("a {} needs a reduce op, the plan says none", to_string(op.collective)));
  }

  const std::vector<std::vector<int64_t>>& groups(int st, const Op& op) {
    return stage_groups[sz(st)].at(op.group);
  }

  /// TP collective on the tensor each rank's chain produced last (blocking, or issued and
  /// delivered at its wait; ops in between must not move the chain on).
  void chain_collective(int st, const Op& op) {
    if (op.kind != CommKind::TP || op.group != GroupKind::TP)
      die(op, fmt::format("a chain collective over {} (expected TP)", to_string(op.group)));
    const int ph = phase_ix(op.phase);
    const bool backward = op.phase == Phase::backward;
    std::vector<std::function<void()>> parts;
    for (const auto& g : groups(st, op)) {
      const int64_t n = static_cast<int64_t>(g.size());
      auto vals = std::make_shared<std::vector<Reg>>();
      for (int64_t r : g) vals->push_back(ranks[sz(r)].cur[ph]);
      std::vector<Reg*> regs;
      for (Reg& r : *vals) regs.push_back(&r);
      Reg& r0 = *regs.front();
      if (r0.m.empty()) die(op, "acts on the tensor produced last, but the stage's chain holds none");
      std::vector<Vector> in;
      switch (op.collective) {
        case Collective::AllReduce: {
          if (r0.seq_shard || r0.chunk) die(op, "AllReduce of a sharded tensor");
          check_size(op, static_cast<double>(r0.m.size()) * kActBytes, "the tensor");
          for (Reg* r : regs) in.push_back(r->m.v);
          const auto out = refmath::all_reduce(in, rop(op));
          for (int64_t i = 0; i < n; ++i) {
            regs[sz(i)]->m.v = out[sz(i)];
            regs[sz(i)]->partial = false;
          }
          break;
        }
        case Collective::ReduceScatter: {
          if (r0.seq_shard || r0.chunk) die(op, "ReduceScatter of a sharded tensor");
          if (sl % n != 0) die(op, fmt::format("{} tokens per rank do not split over {} ranks", sl, n));
          check_size(op, static_cast<double>(r0.m.size()) * kActBytes, "the tensor (ReduceScatter input)");
          for (Reg* r : regs) {
            Vector packed;
            for (int64_t q = 0; q < n; ++q) {
              const Mat shard = token_range(r->m, b, q * sl / n, (q + 1) * sl / n);
              packed.insert(packed.end(), shard.v.begin(), shard.v.end());
            }
            in.push_back(std::move(packed));
          }
          const auto out = refmath::reduce_scatter(in, rop(op));
          for (int64_t i = 0; i < n; ++i) {
            Mat shard(b * sl / n, r0.m.cols);
            shard.v = out[sz(i)];
            regs[sz(i)]->m = std::move(shard);
            regs[sz(i)]->seq_shard = true;
            regs[sz(i)]->partial = false;
          }
          break;
        }
        case Collective::AllGather: {
          if (r0.chunk) {
            check_size(op, static_cast<double>(r0.full_rows * r0.full_cols) * kActBytes, "the gathered message");
            for (Reg* r : regs) in.push_back(r->m.v);
            const auto out = refmath::all_gather(in);
            for (int64_t i = 0; i < n; ++i) {
              Reg& r = *regs[sz(i)];
              Mat full(r.full_rows, r.full_cols);
              if (static_cast<int64_t>(out[sz(i)].size()) != full.size()) die(op, "P2P chunks do not fill the tensor");
              full.v = out[sz(i)];
              r.m = std::move(full);
              r.chunk = false;
            }
          } else if (r0.seq_shard) {
            check_size(op, static_cast<double>(r0.m.size() * n) * kActBytes, "the gathered tensor");
            for (Reg* r : regs) in.push_back(r->m.v);
            const auto out = refmath::all_gather(in);
            for (int64_t i = 0; i < n; ++i) {
              Reg& r = *regs[sz(i)];
              const int64_t cols = r.m.cols, srows = r.m.rows;
              Mat full(b * sl, cols);
              for (int64_t q = 0; q < n; ++q) {
                Mat shard(srows, cols);
                std::copy(out[sz(i)].begin() + q * srows * cols, out[sz(i)].begin() + (q + 1) * srows * cols,
                          shard.v.begin());
                set_token_range(full, b, q * sl / n, shard);
              }
              r.m = std::move(full);
              r.seq_shard = false;
            }
          } else {
            die(op, "AllGather of a tensor that is neither sequence-sharded nor a P2P chunk");
          }
          break;
        }
      }
      parts.push_back([this, g, vals, ph, backward, op] {
        for (size_t i = 0; i < g.size(); ++i) {
          RankState& R = ranks[sz(g[i])];
          Reg& cur = R.cur[ph];
          Reg& r = (*vals)[i];
          if (cur.tag != r.tag || cur.layer != r.layer || cur.mb != r.mb)
            problem(op, "an op between the issue and the wait moved the chain on: the collective's result arrives "
                        "after its tensor was consumed");
          cur = std::move(r);
          if (cur.from_pp && !cur.chunk) {
            pp_probe(R, cur, backward);
            continue;
          }
          Probe p;
          int layer;
          if (probe_of(cur, backward, p, layer))
            compare_tokens(kTP, cur.m, p, layer, R, cur.mb, cur.seq_shard, 0,
                           op.phase == Phase::recompute ? "recompute, after TP collective" : "after TP collective",
                           backward);
        }
      });
    }
    launch(st, op, [parts] {
      for (const auto& p : parts) p();
    });
  }

  /// The three TP AllReduces of the vocab-parallel cross entropy, in Megatron-LM's order
  /// (tensor_parallel/cross_entropy.py): the logits maximum (the shift), the target logit,
  /// the sum of exponentials.
  void ce_collective(int st, const Op& op) {
    for (const auto& g : groups(st, op)) {
      std::vector<Vector> in;
      for (int64_t r : g) {
        RankState& R = ranks[sz(r)];
        Mat& a = need(R, -1, op.micro_batch, Slot::ce_a, op, "the cross-entropy statistic (cross_entropy)");
        if (R.ce_stage[op.micro_batch] >= 3) die(op, "a fourth loss AllReduce: the vocab-parallel cross entropy needs three");
        check_size(op, static_cast<double>(a.size()) * kLossStatBytes, "the per-token fp32 statistic");
        in.push_back(a.v);
      }
      if (ranks[sz(g.front())].ce_stage[op.micro_batch] == 0 && op.reduce != ReduceOp::max)
        note(fmt::format("the first loss AllReduce reduces the logits maximum with {} (Megatron uses MAX): any shift "
                         "common to all TP ranks leaves the loss and gradients unchanged",
                         to_string(op.reduce)));
      const auto out = refmath::all_reduce(in, rop(op));
      for (size_t i = 0; i < g.size(); ++i) {
        RankState& R = ranks[sz(g[i])];
        find(R, -1, op.micro_batch, Slot::ce_a)->v = out[i];
        ce_after_reduce(R, op.micro_batch, op);
      }
    }
  }

  void ce_after_reduce(RankState& R, int mb, const Op& op) {
    int& k = R.ce_stage[mb];
    Mat& a = need(R, -1, mb, Slot::ce_a, op, "the cross-entropy statistic");
    const Mat& logits = need(R, -1, mb, Slot::logits, op, "the logits (lm_head)");
    const int64_t rows = logits.rows;
    if (k == 0) {  // shift reduced: local target logit next
      put(R, -1, mb, Slot::ce_shift, a);
      Mat s(rows, 1);
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t y = batch->labels[data_index(R, mb, i, rows)] - R.c.tp * Vt;
        if (y >= 0 && y < Vt) s.v[sz(i)] = logits.at(i, y);
      }
      a = s;
    } else if (k == 1) {  // target logit reduced: local sum of exponentials next
      put(R, -1, mb, Slot::ce_tgt, a);
      const Mat& shift = *find(R, -1, mb, Slot::ce_shift);
      Mat s(rows, 1);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < logits.cols; ++j) s.v[sz(i)] += std::exp(logits.at(i, j) - shift.v[sz(i)]);
      a = s;
    } else if (k == 2) {  // sum of exponentials reduced: the loss
      put(R, -1, mb, Slot::ce_z, a);
      const Mat& shift = *find(R, -1, mb, Slot::ce_shift);
      const Mat& tgt = *find(R, -1, mb, Slot::ce_tgt);
      const double scale = loss_scale(R, mb);
      for (int64_t i = 0; i < rows; ++i)
        if (batch->valid[data_index(R, mb, i, rows)])
          R.loss_scaled += scale * (std::log(a.v[sz(i)]) + shift.v[sz(i)] - tgt.v[sz(i)]);
    }
    ++k;
  }

  /// Asynchronous (issue) or blocking collective with explicit inputs: `start` runs now
  /// and returns what `wait` delivers.
  void launch(int st, const Op& op, std::function<void()> deliver) {
    if (op.type == OpType::issue) {
      if (pending[sz(st)].count(op.handle)) die(op, fmt::format("handle {} issued twice", op.handle));
      pending[sz(st)][op.handle] = std::move(deliver);
    } else {
      deliver();
    }
  }

  Tag regather_target(const Reg& cur, Slot& src, Slot& dst, int& layer, const Op& op) {
    layer = cur.layer;
    switch (cur.tag) {
      case Tag::dlogits: src = Slot::nf; dst = Slot::ref; layer = -1; return Tag::normf;
      case Tag::d_col_mlp: src = Slot::n2; dst = Slot::re2; return Tag::norm2;
      case Tag::d_qkv: src = Slot::n1; dst = Slot::re1; return Tag::norm1;
      default: break;
    }
    die(op, "re-gathers the input of a column-parallel layer, but the backward chain is not at one");
  }

  void regather(int st, const Op& op) {
    std::vector<std::function<void()>> parts;
    for (const auto& g : groups(st, op)) {
      std::vector<Vector> in;
      Slot src = Slot::n1, dst = Slot::re1;
      int layer = -1;
      int64_t rows = 0, cols = 0;
      for (int64_t r : g) {
        RankState& R = ranks[sz(r)];
        regather_target(R.cur[2], src, dst, layer, op);
        const Mat& shard = need(R, layer, op.micro_batch, src, op, "the sequence shard of the norm output");
        rows = shard.rows;
        cols = shard.cols;
        in.push_back(shard.v);
      }
      const int64_t n = static_cast<int64_t>(g.size());
      check_size(op, static_cast<double>(rows * cols * n) * kActBytes, "the gathered norm output");
      auto out = refmath::all_gather(in);
      parts.push_back([this, g, out = std::move(out), rows, cols, n, layer, dst, mb = op.micro_batch] {
        for (size_t i = 0; i < g.size(); ++i) {
          Mat full(b * sl, cols);
          for (int64_t q = 0; q < n; ++q) {
            Mat shard(rows, cols);
            std::copy(out[i].begin() + q * rows * cols, out[i].begin() + (q + 1) * rows * cols, shard.v.begin());
            set_token_range(full, b, q * sl / n, shard);
          }
          put(ranks[sz(g[i])], layer, mb, dst, std::move(full));
        }
      });
    }
    launch(st, op, [parts] {
      for (const auto& p : parts) p();
    });
  }

  /// K and V of a rank's tokens, side by side: rows b*sl, columns [K | V].
  Mat pack_kv(const Mat& k, const Mat& v) const {
    Mat kv(k.rows, 2 * k.cols);
    set_col_range(kv, 0, k);
    set_col_range(kv, k.cols, v);
    return kv;
  }

  void cp_kv(int st, const Op& op) {
    std::vector<std::function<void()>> parts;
    for (const auto& g : groups(st, op)) {
      std::vector<Vector> in;
      int64_t cols = 0;
      for (int64_t r : g) {
        RankState& R = ranks[sz(r)];
        const Mat kv = pack_kv(need(R, op.layer, op.micro_batch, Slot::k, op, "K (qkv)"),
                               need(R, op.layer, op.micro_batch, Slot::v, op, "V (qkv)"));
        cols = kv.cols;
        in.push_back(kv.v);
      }
      check_size(op, static_cast<double>(in.front().size() * g.size()) * kActBytes, "K and V of every CP rank");
      auto out = refmath::all_gather(in);
      parts.push_back([this, g, out = std::move(out), cols, layer = op.layer, mb = op.micro_batch] {
        for (size_t i = 0; i < g.size(); ++i) {
          Mat all(static_cast<int64_t>(out[i].size()) / cols, cols);
          all.v = out[i];
          put(ranks[sz(g[i])], layer, mb, Slot::kv_all, std::move(all));
        }
      });
    }
    launch(st, op, [parts] {
      for (const auto& p : parts) p();
    });
  }

  /// ReduceScatter (SUM) of every rank's dK/dV of all CP blocks: block j to its owner j.
  /// Read when delivered: ring attention streams the blocks as attention_bwd_remote
  /// produces them.
  void cp_dkv(int st, const Op& op) {
    if (op.type == OpType::issue)
      note("cp_dkv_reducescatter is issued before attention_bwd_remote produces the dK/dV it reduces; the "
           "verifier reads its input at the wait (ring attention streams dK/dV blocks). A plan field such as "
           "Op::input_ready_at_wait would state this instead of the op name");
    const auto gs = groups(st, op);
    launch(st, op, [this, gs, op, st] {
      cur_stage = st;
      for (const auto& g : gs) {
        std::vector<Vector> in;
        for (int64_t r : g)
          in.push_back(need(ranks[sz(r)], op.layer, op.micro_batch, Slot::dkv_all, op, "dK/dV of every block").v);
        check_size(op, static_cast<double>(in.front().size()) * kActBytes, "dK/dV of every CP block");
        const auto out = refmath::reduce_scatter(in, rop(op));
        for (size_t i = 0; i < g.size(); ++i) {
          RankState& R = ranks[sz(g[i])];
          Mat own(b * sl, 2 * gl * d);
          own.v = out[i];
          put(R, op.layer, op.micro_batch, Slot::dk, col_range(own, 0, gl * d));
          put(R, op.layer, op.micro_batch, Slot::dv, col_range(own, gl * d, 2 * gl * d));
          if (cp > 1) {
            compare_tokens(kCP, *find(R, op.layer, op.micro_batch, Slot::dk), Probe::dk, op.layer, R, op.micro_batch,
                           false, R.c.tp * gl * d, "dK at its owner after cp_dkv_reducescatter", true);
            compare_tokens(kCP, *find(R, op.layer, op.micro_batch, Slot::dv), Probe::dv, op.layer, R, op.micro_batch,
                           false, R.c.tp * gl * d, "dV at its owner after cp_dkv_reducescatter", true);
          }
        }
      }
    });
  }

  // ---- data-parallel gradients and ZeRO ----
  Bucket ready_bucket(int st, const Op& op) {
    Bucket bk;
    const RankState& R0 = ranks[sz(stage_ranks[sz(st)].front())];
    const auto& lw = last_write[sz(st)];
    const int idx = static_cast<int>(cur_idx);
    for (size_t p = 0; p < R0.params.size(); ++p) {
      bool ready = false;
      if (per_mb_reduce) {
        const int mb = op.micro_batch;
        if (mb < 0 || mb >= m_count) die(op, "a per-micro-batch gradient reduction without a micro-batch");
        const int64_t w = lw[p][sz(mb)];
        ready = w >= 0 && w < idx && !reduced_mb[sz(st)][p][sz(mb)];
        if (ready) reduced_mb[sz(st)][p][sz(mb)] = 1;
      } else {
        int64_t w = -1;
        for (int64_t x : lw[p]) w = std::max(w, x);
        ready = w >= 0 && w < idx && !reduced_step[sz(st)][p];
        if (ready) reduced_step[sz(st)][p] = 1;
      }
      if (ready) {
        bk.params.push_back(static_cast<int>(p));
        bk.elems += R0.params[p].size();
      }
    }
    return bk;
  }

  Vector pack_grads(const RankState& R, const Bucket& bk) const {
    Vector v;
    v.reserve(sz(bk.elems));
    for (int p : bk.params) {
      const auto& g = R.params[sz(p)].grad.v;
      v.insert(v.end(), g.begin(), g.end());
    }
    return v;
  }

  void dp_grad(int st, const Op& op) {
    if (op.group != GroupKind::DPxCP)
      problem(op, fmt::format("gradients reduced over {}; ranks holding the same weights form DPxCP", to_string(op.group)));
    const Bucket bk = ready_bucket(st, op);
    if (bk.params.empty()) die(op, "reduces gradients, but no gradient is complete and unreduced here");
    check_size(op, static_cast<double>(bk.elems) * grad_bytes,
               fmt::format("the {} completed gradient elements", bk.elems).c_str());
    if (opt.inject == Injection::adam_before_sync) {
      if (op.type == OpType::issue) launch(st, op, [] {});
      return;
    }
    const bool rs = op.collective == Collective::ReduceScatter;
    if (!rs && op.collective != Collective::AllReduce) die(op, "gradients need an AllReduce or a ReduceScatter");
    std::vector<std::function<void()>> parts;
    for (const auto& g : groups(st, op)) {
      const int64_t n = static_cast<int64_t>(g.size());
      const int64_t chunk = (bk.elems + n - 1) / n;
      std::vector<Vector> in;
      for (int64_t r : g) {
        RankState& R = ranks[sz(r)];
        Vector v = pack_grads(R, bk);
        if (rs) v.resize(sz(chunk * n), 0.0);  // pad to equal chunks
        in.push_back(std::move(v));
        for (int p : bk.params) {  // hand the gradient to the collective
          LocalParam& lp = R.params[sz(p)];
          for (int64_t e = 0; e < lp.size(); ++e) lp.total[sz(e)] += lp.grad.v[sz(e)];
          std::fill(lp.grad.v.begin(), lp.grad.v.end(), 0.0);
        }
      }
      auto out = rs ? refmath::reduce_scatter(in, rop(op)) : refmath::all_reduce(in, rop(op));
      parts.push_back([this, g, out = std::move(out), bk, rs, chunk, op] {
        for (size_t i = 0; i < g.size(); ++i) {
          RankState& R = ranks[sz(g[i])];
          const int64_t lo = rs ? static_cast<int64_t>(i) * chunk : 0;
          const int64_t hi = rs ? std::min(bk.elems, lo + chunk) : bk.elems;
          int64_t f = 0;
          for (int p : bk.params) {
            LocalParam& lp = R.params[sz(p)];
            for (int64_t e = 0; e < lp.size(); ++e, ++f) {
              const bool mine = f >= lo && f < hi;
              if (lp.z3 && mine != static_cast<bool>(lp.owned[sz(e)])) {
                problem(op, fmt::format("the gradient ReduceScatter hands {} of layer {} to other owners than the "
                                        "ZeRO-3 parameter AllGather gathers from",
                                        lk_name(lp.kind), lp.layer));
                continue;
              }
              lp.owned[sz(e)] = mine;
              if (!mine) continue;
              lp.synced[sz(e)] += out[i][sz(f - lo)];
              lp.has_synced[sz(e)] = 1;
              lp.owned[sz(e)] = 1;
            }
          }
        }
      });
    }
    launch(st, op, [parts] {
      for (const auto& p : parts) p();
    });
  }

  /// Parameter AllGather over DPxCP: every rank receives, element by element, the value of
  /// the rank that owns it (ZeRO-3: the layer's chunk; ZeRO-1/2: the chunk the gradient
  /// ReduceScatter gave it, updated by its optimizer). op.layer >= 0: that layer's
  /// parameters (ZeRO-3 before use; ZeRO-1/2 with overlap_param_gather, the previous
  /// step's update, gathered before the layer's first forward); -1: the stage's parameters
  /// that no per-layer gather covers (all of them with ZeRO-1/2 without overlap).
  void dp_param_gather(int st, const Op& op) {
    const bool skip = opt.inject == Injection::zero_skip_param_gather;
    const int layer = op.layer;
    std::vector<std::function<void()>> parts;
    for (const auto& g : groups(st, op)) {
      const RankState& R0 = ranks[sz(g.front())];
      std::vector<int> sel;
      int64_t total = 0;
      for (size_t p = 0; p < R0.params.size(); ++p) {
        const int pl = R0.params[p].layer;
        if (layer < 0 ? (pl < 0 || !gathered_layers[sz(st)].count(pl)) : pl == layer) {
          sel.push_back(static_cast<int>(p));
          total += R0.params[p].size();
        }
      }
      if (sel.empty()) die(op, fmt::format("gathers the parameters of layer {}, which stage {} does not hold", layer, st));
      check_size(op, static_cast<double>(total) * kActBytes,
                 layer < 0 ? "the stage's parameters" : fmt::format("layer {}'s parameters", layer).c_str());
      // Snapshot at issue: the owner's value of every element (none yet: keep the rank's).
      std::vector<std::vector<double>> val(sel.size());
      std::vector<std::vector<uint8_t>> have(sel.size());
      for (size_t k = 0; k < sel.size(); ++k) {
        const int64_t n = R0.params[sz(sel[k])].size();
        val[k].assign(sz(n), 0.0);
        have[k].assign(sz(n), 0);
        for (int64_t r : g) {
          const LocalParam& lp = ranks[sz(r)].params[sz(sel[k])];
          for (int64_t e = 0; e < n; ++e)
            if (lp.owned[sz(e)] && !have[k][sz(e)]) {
              val[k][sz(e)] = lp.value.v[sz(e)];
              have[k][sz(e)] = 1;
            }
        }
        const LocalParam& lp0 = R0.params[sz(sel[k])];
        if (lp0.z3 && std::find(have[k].begin(), have[k].end(), 0) != have[k].end())
          problem(op, fmt::format("no rank of the DPxCP group owns some elements of {} (layer {})", lk_name(lp0.kind),
                                  lp0.layer));
      }
      parts.push_back([this, g, sel, val = std::move(val), have = std::move(have), layer, skip] {
        if (skip) return;
        for (int64_t r : g) {
          RankState& R = ranks[sz(r)];
          for (size_t k = 0; k < sel.size(); ++k) {
            LocalParam& lp = R.params[sz(sel[k])];
            for (int64_t e = 0; e < lp.size(); ++e)
              if (have[k][sz(e)]) {
                lp.value.v[sz(e)] = val[k][sz(e)];
                lp.fresh[sz(e)] = 1;
              }
            if (lp.z3) lp.materialized = true;
          }
          if (layer >= 0 && zero == 3) R.materialized_layers.insert(layer);
        }
      });
    }
    launch(st, op, [parts] {
      for (const auto& p : parts) p();
    });
  }

  /// Proposed op (not in the plan yet): TP AllReduce SUM of the gradients of parameters
  /// replicated over TP but computed on sequence shards, as they stand (TP peers shard
  /// their DP reductions alike).
  void sp_grad_allreduce(int st, const Op& op) {
    for (const auto& g : groups(st, op)) {
      std::vector<Vector> in;
      for (int64_t r : g) {
        Vector v;
        for (auto& p : ranks[sz(r)].params)
          if (sp_partial_grad(p.kind))
            for (int64_t e = 0; e < p.size(); ++e) v.push_back(p.has_synced[sz(e)] ? p.synced[sz(e)] : p.grad.v[sz(e)]);
        in.push_back(std::move(v));
      }
      check_size(op, static_cast<double>(in.front().size()) * grad_bytes, "the sequence-parallel replicated gradients");
      const auto out = refmath::all_reduce(in, rop(op));
      for (size_t i = 0; i < g.size(); ++i) {
        size_t f = 0;
        for (auto& p : ranks[sz(g[i])].params)
          if (sp_partial_grad(p.kind))
            for (int64_t e = 0; e < p.size(); ++e, ++f) (p.has_synced[sz(e)] ? p.synced[sz(e)] : p.grad.v[sz(e)]) = out[i][f];
      }
    }
  }

  /// A gradient as it stands: the DP-reduced value where this rank received one, the
  /// local gradient elsewhere.
  static std::vector<double>& grad_as_is(LocalParam& p, size_t e, std::vector<double>*& which) {
    which = p.has_synced[e] ? &p.synced : &p.grad.v;
    return *which;
  }

  /// Tied word embedding with pp > 1: AllReduce (Op::reduce) of the gradient of the
  /// first stage's embedding and the last stage's copy over the embedding group
  /// (GroupKind::EMB), on the gradients as they stand. Runs when both stages reached it.
  void embed_grad(const Op& op) {
    int64_t mixed_pairs = 0, first_a = -1, first_b = -1;
    for (int64_t r : stage_ranks[0]) {
      const auto g = grid.group_of(r, op.group);
      if (g.size() != 2) die(op, fmt::format("expects a group of the first and the last stage, {} has {} rank(s)",
                                            to_string(op.group), g.size()));
      RankState& A = ranks[sz(g[0])];
      RankState& B = ranks[sz(g[1])];
      const int ia = pindex(A, LK::word, -1), ib = pindex(B, LK::head_w, -1);
      if (ia < 0 || ib < 0) die(op, "an embedding-group AllReduce without a tied word embedding on both ends");
      LocalParam& a = A.params[sz(ia)];
      LocalParam& bb = B.params[sz(ib)];
      check_size(op, static_cast<double>(a.size()) * grad_bytes, "the word-embedding gradient");
      Vector va(sz(a.size())), vb(sz(a.size()));
      bool mixed = false;
      for (int64_t e = 0; e < a.size(); ++e) {
        std::vector<double>* wa = nullptr;
        std::vector<double>* wb = nullptr;
        va[sz(e)] = grad_as_is(a, sz(e), wa)[sz(e)];
        vb[sz(e)] = grad_as_is(bb, sz(e), wb)[sz(e)];
        mixed = mixed || (a.has_synced[sz(e)] != bb.has_synced[sz(e)]);
      }
      if (mixed && mixed_pairs++ == 0) {
        first_a = A.rank;
        first_b = B.rank;
      }
      const auto out = refmath::all_reduce({va, vb}, rop(op));
      for (int64_t e = 0; e < a.size(); ++e) {
        std::vector<double>* wa = nullptr;
        std::vector<double>* wb = nullptr;
        grad_as_is(a, sz(e), wa);
        grad_as_is(bb, sz(e), wb);
        (*wa)[sz(e)] = out[0][sz(e)];
        (*wb)[sz(e)] = out[1][sz(e)];
      }
    }
    if (mixed_pairs > 0)
      problem(op, fmt::format("in {} of {} embedding groups (e.g. ranks {} and {}) the two stages' DP "
                              "ReduceScatters gave the word-embedding gradient different owners, so the SUM adds "
                              "reduced values to unreduced ones (Megatron-Core gives a shared embedding its own "
                              "gradient bucket with the distributed optimizer: param_and_grad_buffer.py "
                              "_does_param_require_new_bucket)",
                              mixed_pairs, stage_ranks[0].size(), first_a, first_b));
  }

  // ------------------------------------------------------------------ p2p -------------
  int64_t peer(const RankState& R, const Op& op, int delta) const {
    RankCoord c = R.c;
    c.pp = op.peer_stage >= 0 ? op.peer_stage : R.c.pp + delta;
    return grid.rank_of(c);
  }
  int64_t virtual_stage(int stage, int chunk) const { return static_cast<int64_t>(chunk) * pp + stage; }

  void send(int st, const Op& op) {
    const bool fwd = op.dir == Direction::forward;
    const int ph = fwd ? 0 : 2;
    for (int64_t r : stage_ranks[sz(st)]) {
      RankState& R = ranks[sz(r)];
      Reg& c = R.cur[ph];
      if (c.m.empty() || c.partial || c.chunk || (c.tag != Tag::stream && c.tag != Tag::embed_out))
        die(op, "sends the stage's output, but the chain does not hold a complete activation / gradient");
      Reg msg = c;
      msg.mb = op.micro_batch;
      if (!sp && t > 1) {  // Megatron scatter/gather: each TP rank sends 1/t of the tensor
        const int64_t n = c.m.size() / t;
        msg.full_rows = c.m.rows;
        msg.full_cols = c.m.cols;
        msg.m = Mat(1, n);
        std::copy(c.m.v.begin() + R.c.tp * n, c.m.v.begin() + (R.c.tp + 1) * n, msg.m.v.begin());
        msg.chunk = true;
      }
      check_size(op, static_cast<double>(msg.m.size()) * kActBytes, "the message");
      mail[{r, peer(R, op, fwd ? 1 : -1), fwd ? 0 : 1}].push_back(
          {op.micro_batch, virtual_stage(st, op.chunk), std::move(msg)});
    }
  }

  bool recv_ready(int st, const Op& op) {
    const bool fwd = op.dir == Direction::forward;
    for (int64_t r : stage_ranks[sz(st)]) {
      const RankState& R = ranks[sz(r)];
      auto it = mail.find({peer(R, op, fwd ? -1 : 1), r, fwd ? 0 : 1});
      if (it == mail.end() || it->second.empty()) return false;
    }
    return true;
  }

  void recv(int st, const Op& op) {
    const bool fwd = op.dir == Direction::forward;
    const int64_t want_vs = virtual_stage(st, op.chunk) + (fwd ? -1 : 1);
    for (int64_t r : stage_ranks[sz(st)]) {
      RankState& R = ranks[sz(r)];
      auto& q = mail[{peer(R, op, fwd ? -1 : 1), r, fwd ? 0 : 1}];
      const bool swap = opt.inject == Injection::pp_microbatch_swap;
      Msg msg = swap ? q.back() : q.front();
      if (swap) q.pop_back(); else q.pop_front();
      if (!swap && (msg.mb != op.micro_batch || msg.vs != want_vs))
        problem(op, fmt::format("receives the message of micro-batch {} from virtual stage {} (wanted micro-batch {} "
                                "from virtual stage {}): sender and receiver orders differ",
                                msg.mb, msg.vs, op.micro_batch, want_vs));
      check_size(op, static_cast<double>(msg.reg.m.size()) * kActBytes, "the message");
      Reg& c = R.cur[fwd ? 0 : 2];
      c = std::move(msg.reg);
      c.mb = op.micro_batch;
      c.tag = Tag::stream;
      c.model_chunk = op.chunk;
      auto cl = chunk_layers[sz(st)].find(op.chunk);
      c.layer = cl == chunk_layers[sz(st)].end() ? -1 : (fwd ? cl->second.first - 1 : cl->second.second + 1);
      c.from_pp = true;
      if (!c.chunk) pp_probe(R, c, !fwd);
    }
  }

  // ------------------------------------------------------------------ attention -------
  bool allowed(int64_t qpos, int64_t kpos) const {
    if (opt.inject == Injection::cp_causal_local) return kpos % sl <= qpos % sl;
    return kpos <= qpos;
  }
  /// K and V of CP block j for this rank (own block without CP).
  std::pair<Mat, Mat> kv_block(RankState& R, int layer, int mb, int64_t j, const Op& op) {
    if (cp == 1 || j == R.c.cp) {
      if (j != R.c.cp) die(op, "K/V block outside the CP group");
      return {need(R, layer, mb, Slot::k, op, "K (qkv)"), need(R, layer, mb, Slot::v, op, "V (qkv)")};
    }
    const Mat& all = need(R, layer, mb, Slot::kv_all, op, "K/V of the other CP ranks (cp_kv_allgather)");
    Mat blk(b * sl, all.cols);
    std::copy(all.v.begin() + j * b * sl * all.cols, all.v.begin() + (j + 1) * b * sl * all.cols, blk.v.begin());
    return {col_range(blk, 0, gl * d), col_range(blk, gl * d, 2 * gl * d)};
  }

  /// Online softmax (Milakov & Gimelshein 2018; FlashAttention, Dao 2022 Alg. 1) of this
  /// rank's queries against CP block kb: running max M, exp-sum L, weighted output ACC.
  void online_block(RankState& R, int layer, int mb, int64_t kb, const Op& op) {
    const Mat& q = need(R, layer, mb, Slot::q, op, "Q (qkv)");
    auto [K, V] = kv_block(R, layer, mb, kb, op);
    Mat& Mx = *find(R, layer, mb, Slot::att_m);
    Mat& Ls = *find(R, layer, mb, Slot::att_l);
    Mat& Acc = *find(R, layer, mb, Slot::att_acc);
    const int64_t group = al / gl;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    std::vector<double> s(sz(sl));
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t hh = 0; hh < al; ++hh) {
        const int64_t kh = hh / group;
        for (int64_t tq = 0; tq < sl; ++tq) {
          const int64_t row = bi * sl + tq, qpos = R.c.cp * sl + tq;
          double mx = -INFINITY;
          for (int64_t u = 0; u < sl; ++u) {
            s[sz(u)] = -INFINITY;
            if (!allowed(qpos, kb * sl + u)) continue;
            double dot = 0;
            for (int64_t x = 0; x < d; ++x) dot += q.at(row, hh * d + x) * K.at(bi * sl + u, kh * d + x);
            s[sz(u)] = dot * scale;
            mx = std::max(mx, s[sz(u)]);
          }
          if (mx == -INFINITY) continue;
          const double m_old = Mx.at(row, hh), m_new = std::max(m_old, mx);
          const double f = m_old == -INFINITY ? 0.0 : std::exp(m_old - m_new);
          Ls.at(row, hh) *= f;
          for (int64_t x = 0; x < d; ++x) Acc.at(row, hh * d + x) *= f;
          for (int64_t u = 0; u < sl; ++u) {
            if (s[sz(u)] == -INFINITY) continue;
            const double p = std::exp(s[sz(u)] - m_new);
            Ls.at(row, hh) += p;
            for (int64_t x = 0; x < d; ++x) Acc.at(row, hh * d + x) += p * V.at(bi * sl + u, kh * d + x);
          }
          Mx.at(row, hh) = m_new;
        }
      }
  }
  void online_init(RankState& R, int layer, int mb) {
    put(R, layer, mb, Slot::att_m, Mat(b * sl, al, -INFINITY));
    put(R, layer, mb, Slot::att_l, Mat(b * sl, al));
    put(R, layer, mb, Slot::att_acc, Mat(b * sl, al * d));
  }
  void online_finish(RankState& R, int layer, int mb, const Op& op) {
    const Mat& Mx = need(R, layer, mb, Slot::att_m, op, "the online-softmax state (attention_local)");
    const Mat& Ls = *find(R, layer, mb, Slot::att_l);
    const Mat& Acc = *find(R, layer, mb, Slot::att_acc);
    Mat ctx(b * sl, al * d), lse(b * sl, al);
    for (int64_t row = 0; row < b * sl; ++row)
      for (int64_t hh = 0; hh < al; ++hh) {
        lse.at(row, hh) = Mx.at(row, hh) + std::log(Ls.at(row, hh));
        for (int64_t x = 0; x < d; ++x) ctx.at(row, hh * d + x) = Acc.at(row, hh * d + x) / Ls.at(row, hh);
      }
    for (Slot s : {Slot::att_m, Slot::att_l, Slot::att_acc, Slot::kv_all}) drop(R, layer, mb, s);
    put(R, layer, mb, Slot::lse, std::move(lse));
    finish_ctx(R, layer, mb, std::move(ctx), op);
  }
  void finish_ctx(RankState& R, int layer, int mb, Mat ctx, const Op& op) {
    if (cp > 1) compare_tokens(kCP, ctx, Probe::ctx, layer, R, mb, false, R.c.tp * al * d, "attention output");
    Reg& c = R.cur[phase_ix(op.phase)];
    c = Reg{};
    c.m = ctx;
    c.tag = Tag::ctx;
    c.layer = layer;
    c.mb = mb;
    put(R, layer, mb, Slot::ctx, std::move(ctx));
    drop(R, layer, mb, Slot::kv_all);
  }

  /// FlashAttention backward of this rank's queries against CP block kb (Dao 2022 Alg. 2):
  /// P = exp(S - lse), dV_j += P^T dO, dS = P (dP - rowsum(dO o O)), dQ += dS K, dK_j += dS^T Q.
  void flash_bwd_block(RankState& R, int layer, int mb, int64_t kb, const Op& op) {
    const Mat& q = need(R, layer, mb, Slot::q, op, "Q");
    const Mat& ctx = need(R, layer, mb, Slot::ctx, op, "the attention output (forward or recompute)");
    const Mat& lse = need(R, layer, mb, Slot::lse, op, "the softmax log-sum-exp (forward or recompute)");
    const Mat& dctx = need(R, layer, mb, Slot::dctx, op, "the attention output gradient (out_proj_dgrad)");
    auto [K, V] = kv_block(R, layer, mb, kb, op);
    Mat* dq = find(R, layer, mb, Slot::dq);
    if (!dq) dq = &put(R, layer, mb, Slot::dq, Mat(b * sl, al * d));
    Mat* dkv = find(R, layer, mb, Slot::dkv_all);
    if (!dkv) dkv = &put(R, layer, mb, Slot::dkv_all, Mat(cp * b * sl, 2 * gl * d));
    const int64_t group = al / gl, kvw = gl * d;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t hh = 0; hh < al; ++hh) {
        const int64_t kh = hh / group;
        for (int64_t tq = 0; tq < sl; ++tq) {
          const int64_t row = bi * sl + tq, qpos = R.c.cp * sl + tq;
          double D = 0;
          for (int64_t x = 0; x < d; ++x) D += dctx.at(row, hh * d + x) * ctx.at(row, hh * d + x);
          for (int64_t u = 0; u < sl; ++u) {
            if (!allowed(qpos, kb * sl + u)) continue;
            const int64_t krow = bi * sl + u, drow = kb * b * sl + krow;
            double dot = 0, dp = 0;
            for (int64_t x = 0; x < d; ++x) {
              dot += q.at(row, hh * d + x) * K.at(krow, kh * d + x);
              dp += dctx.at(row, hh * d + x) * V.at(krow, kh * d + x);
            }
            const double p = std::exp(dot * scale - lse.at(row, hh));
            const double ds = p * (dp - D) * scale;
            for (int64_t x = 0; x < d; ++x) {
              dkv->at(drow, kvw + kh * d + x) += p * dctx.at(row, hh * d + x);
              dq->at(row, hh * d + x) += ds * K.at(krow, kh * d + x);
              dkv->at(drow, kh * d + x) += ds * q.at(row, hh * d + x);
            }
          }
        }
      }
  }

  /// Unfused attention: scores of this rank's queries against every key of the sequence
  /// (rows (bi, head, query), columns key position), masked.
  void scores(RankState& R, int layer, int mb, const Op& op) {
    const Mat& q = need(R, layer, mb, Slot::q, op, "Q (qkv)");
    Mat sc(b * al * sl, cp * sl, -INFINITY);
    const int64_t group = al / gl;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    for (int64_t j = 0; j < cp; ++j) {
      auto [K, V] = kv_block(R, layer, mb, j, op);
      for (int64_t bi = 0; bi < b; ++bi)
        for (int64_t hh = 0; hh < al; ++hh)
          for (int64_t tq = 0; tq < sl; ++tq)
            for (int64_t u = 0; u < sl; ++u) {
              if (!allowed(R.c.cp * sl + tq, j * sl + u)) continue;
              double dot = 0;
              for (int64_t x = 0; x < d; ++x) dot += q.at(bi * sl + tq, hh * d + x) * K.at(bi * sl + u, (hh / group) * d + x);
              sc.at((bi * al + hh) * sl + tq, j * sl + u) = dot * scale;
            }
    }
    put(R, layer, mb, Slot::probs, std::move(sc));
  }
  void values(RankState& R, int layer, int mb, const Op& op) {
    const Mat& p = need(R, layer, mb, Slot::probs, op, "the attention probabilities (softmax_dropout)");
    Mat ctx(b * sl, al * d);
    const int64_t group = al / gl;
    for (int64_t j = 0; j < cp; ++j) {
      auto [K, V] = kv_block(R, layer, mb, j, op);
      for (int64_t bi = 0; bi < b; ++bi)
        for (int64_t hh = 0; hh < al; ++hh)
          for (int64_t tq = 0; tq < sl; ++tq)
            for (int64_t u = 0; u < sl; ++u) {
              const double w = p.at((bi * al + hh) * sl + tq, j * sl + u);
              for (int64_t x = 0; x < d; ++x) ctx.at(bi * sl + tq, hh * d + x) += w * V.at(bi * sl + u, (hh / group) * d + x);
            }
    }
    finish_ctx(R, layer, mb, std::move(ctx), op);
  }

  // ------------------------------------------------------------------ helpers ---------
  Reg& chain(RankState& R, const Op& op) { return R.cur[phase_ix(op.phase)]; }
  Reg& expect(RankState& R, const Op& op, std::initializer_list<Tag> tags, const char* what, bool full_tokens) {
    Reg& c = chain(R, op);
    bool ok = false;
    for (Tag tg : tags) ok = ok || c.tag == tg;
    if (!ok || c.m.empty()) die(op, fmt::format("consumes {}, which the chain does not hold here", what));
    if (c.partial) die(op, fmt::format("consumes {} while it is still a TP partial sum (no TP reduction)", what));
    if (c.chunk) die(op, fmt::format("consumes {} while it is a P2P chunk (no pp_tp_allgather)", what));
    if (full_tokens && c.seq_shard)
      die(op, fmt::format("consumes {} while it is sequence-sharded (no TP AllGather)", what));
    return c;
  }
  void set_chain(RankState& R, const Op& op, Mat m, Tag tag, bool partial, bool seq_shard) {
    Reg& c = chain(R, op);
    c = Reg{};
    c.m = std::move(m);
    c.tag = tag;
    c.layer = op.layer;
    c.mb = op.micro_batch;
    c.partial = partial && t > 1;
    c.seq_shard = seq_shard;
  }
  Mat weight(RankState& R, LK k, int layer, const Op& op) { return P(R, k, layer, op).value; }
  const double* wptr(RankState& R, LK k, int layer, const Op& op) { return P(R, k, layer, op).value.v.data(); }
  double* gptr(RankState& R, LK k, int layer, int mb, const Op& op) {
    note_write(R, k, layer, mb);
    return P(R, k, layer, op).grad.v.data();
  }
  bool has(RankState& R, LK k, int layer) { return pindex(R, k, layer) >= 0; }

  void norm_fwd(RankState& R, const Op& op, LK w, LK bb, Slot out, Tag tag) {
    const int layer = op.layer, mb = op.micro_batch;
    Mat x;
    if (op.phase == Phase::recompute && out == Slot::n1) {
      x = need(R, layer, mb, Slot::x_in, op, "the layer input (checkpoint)");
    } else {
      const Reg& c = expect(R, op, {Tag::stream, Tag::embed_out}, "the residual stream", false);
      if (c.seq_shard != sp) die(op, sp ? "needs the sequence shard of the residual stream (sequence parallel)"
                                        : "needs the full residual stream");
      x = c.m;
      if (out == Slot::n1 && op.phase == Phase::forward) put(R, layer, mb, Slot::x_in, x);
    }
    put(R, layer, mb, Slot::res, x);
    NormCache cache;
    Mat y = norm_forward(x, wptr(R, w, layer, op), M.layernorm ? wptr(R, bb, layer, op) : nullptr, M.layernorm, cache);
    put_norm(R, layer, mb, out, std::move(cache));
    put(R, layer, mb, out, y);
    set_chain(R, op, std::move(y), tag, false, sp);
  }
  Mat norm_bwd(RankState& R, const Op& op, LK w, LK bb, Slot cache_slot, Tag dtag) {
    const int layer = op.layer, mb = op.micro_batch;
    const Reg& c = expect(R, op, {dtag}, "the norm output gradient", false);
    const NormCache* cache = find_norm(R, layer, mb, cache_slot);
    if (!cache) die(op, "needs the norm's forward statistics, which were not kept or recomputed");
    double* db = M.layernorm ? gptr(R, bb, layer, mb, op) : nullptr;
    return norm_backward(c.m, wptr(R, w, layer, op), M.layernorm, *cache, gptr(R, w, layer, mb, op), db);
  }
  /// The full-token input of a column-parallel layer for its weight gradient: re-gathered
  /// with sequence parallelism, the kept norm output otherwise.
  const Mat& col_input(RankState& R, const Op& op, Slot norm_slot, Slot regathered, int layer) {
    if (sp) return need(R, layer, op.micro_batch, regathered, op, "the re-gathered norm output (tp_allgather_input)");
    return need(R, layer, op.micro_batch, norm_slot, op, "the norm output");
  }

  void layer_forward_done(RankState& R, int layer, int mb) {
    const Recompute rc = plan.exp.layout.recompute;
    drop(R, layer, mb, Slot::tmp_in);
    if (rc == Recompute::full) {
      drop_layer(R, layer, mb, /*keep_input=*/true);
    } else if (rc == Recompute::selective) {
      for (Slot s : {Slot::ctx, Slot::lse, Slot::probs}) drop(R, layer, mb, s);
    }
  }

  // ------------------------------------------------------------------ compute ---------
  void compute(RankState& R, Fn fn, const Op& op) {
    const int L = op.layer, mb = op.micro_batch;
    if (op.type == OpType::compute && zero == 3)  // ZeRO-3 frees gathered layers after use
      for (auto it = R.materialized_layers.begin(); it != R.materialized_layers.end();) {
        if (*it != L) {
          for (auto& p : R.params)
            if (p.layer == *it && p.z3) free_param(p);
          it = R.materialized_layers.erase(it);
        } else {
          ++it;
        }
      }
    switch (fn) {
      // ---- forward ----
      case Fn::embedding: {
        const Mat& word = P(R, LK::word, -1, op).value;
        const Mat* pos = M.learned_pos ? &P(R, LK::pos, -1, op).value : nullptr;
        Mat y(b * sl, h);
        for (int64_t row = 0; row < b * sl; ++row) {
          const int64_t tok = batch->tokens[data_index(R, mb, row, b * sl)] - R.c.tp * Vt;
          if (tok >= 0 && tok < Vt)
            for (int64_t j = 0; j < h; ++j) y.at(row, j) = word.at(tok, j);
          if (pos && R.c.tp == 0)  // replicated positions: added once before the TP SUM
            for (int64_t j = 0; j < h; ++j) y.at(row, j) += pos->at(pos_of(R, row, b * sl, false), j);
        }
        set_chain(R, op, std::move(y), Tag::embed_out, true, false);
        break;
      }
      case Fn::input_norm: norm_fwd(R, op, LK::ln1_w, LK::ln1_b, Slot::n1, Tag::norm1); break;
      case Fn::post_attention_norm: norm_fwd(R, op, LK::ln2_w, LK::ln2_b, Slot::n2, Tag::norm2); break;
      case Fn::final_norm: norm_fwd(R, op, LK::final_w, LK::final_b, Slot::nf, Tag::normf); break;
      case Fn::qkv: {
        const Reg& c = expect(R, op, {Tag::norm1}, "the input_norm output", true);
        Mat y = matmul(c.m, weight(R, LK::qkv_w, L, op));
        if (M.bias) add_row_vector(y, wptr(R, LK::qkv_b, L, op));
        put(R, L, mb, Slot::q, col_range(y, 0, al * d));
        put(R, L, mb, Slot::k, col_range(y, al * d, (al + gl) * d));
        put(R, L, mb, Slot::v, col_range(y, (al + gl) * d, (al + 2 * gl) * d));
        set_chain(R, op, Mat(), Tag::qkv, false, false);
        chain(R, op).m = Mat(1, 1);  // marker: Q, K, V live in slots
        break;
      }
      case Fn::rope: {
        const auto pos = positions(R, b * sl, false);
        rope_apply(need(R, L, mb, Slot::q, op, "Q"), al, d, pos, false);
        rope_apply(need(R, L, mb, Slot::k, op, "K"), gl, d, pos, false);
        break;
      }
      case Fn::attention:
        if (cp > 1) die(op, "unsplit attention with CP > 1: the other ranks' K/V blocks are never used");
        online_init(R, L, mb);
        online_block(R, L, mb, R.c.cp, op);
        online_finish(R, L, mb, op);
        break;
      case Fn::attention_local:
        online_init(R, L, mb);
        online_block(R, L, mb, R.c.cp, op);
        break;
      case Fn::attention_remote:
        for (int64_t j = 0; j < cp; ++j)
          if (j != R.c.cp) online_block(R, L, mb, j, op);
        online_finish(R, L, mb, op);
        break;
      case Fn::attention_scores: scores(R, L, mb, op); break;
      case Fn::softmax_dropout: {
        Mat& p = need(R, L, mb, Slot::probs, op, "the attention scores");
        for (int64_t i = 0; i < p.rows; ++i) {
          double mx = -INFINITY, z = 0;
          for (int64_t j = 0; j < p.cols; ++j) mx = std::max(mx, p.at(i, j));
          for (int64_t j = 0; j < p.cols; ++j) z += (p.at(i, j) = p.at(i, j) == -INFINITY ? 0.0 : std::exp(p.at(i, j) - mx));
          for (int64_t j = 0; j < p.cols; ++j) p.at(i, j) /= z;
        }
        break;
      }
      case Fn::attention_values: values(R, L, mb, op); break;
      case Fn::out_proj: {
        const Reg& c = expect(R, op, {Tag::ctx}, "the attention output", true);
        set_chain(R, op, matmul(c.m, weight(R, LK::out_w, L, op)), Tag::attn_out, true, false);
        break;
      }
      case Fn::dropout_residual: {
        Reg& c = expect(R, op, {Tag::attn_out, Tag::mlp_out}, "a row-parallel output", false);
        if (c.seq_shard != sp) die(op, sp ? "adds a full-sequence output to a sequence-shard residual (no ReduceScatter)"
                                          : "adds a sequence-sharded output to the full residual");
        const bool attn = c.tag == Tag::attn_out;
        Mat x = need(R, L, mb, Slot::res, op, "the residual");
        add_into(x, c.m);
        const LK bias = attn ? LK::out_b : LK::down_b;
        if (M.bias) add_row_vector(x, wptr(R, bias, L, op));
        R.tape[{L, mb}].push_back(c.tag);
        set_chain(R, op, std::move(x), Tag::stream, false, sp);
        if (!attn && op.phase == Phase::forward) layer_forward_done(R, L, mb);
        break;
      }
      case Fn::mlp_up: {
        const Reg& c = expect(R, op, {Tag::norm2}, "the post_attention_norm output", true);
        put(R, L, mb, Slot::tmp_in, c.m);
        Mat u = matmul(c.m, weight(R, LK::up_w, L, op));
        if (M.bias) add_row_vector(u, wptr(R, LK::up_b, L, op));
        put(R, L, mb, Slot::u, u);
        set_chain(R, op, std::move(u), Tag::col_mlp, false, false);
        break;
      }
      case Fn::mlp_gate:
        put(R, L, mb, Slot::g, matmul(need(R, L, mb, Slot::tmp_in, op, "the MLP input"), weight(R, LK::gate_w, L, op)));
        break;
      case Fn::gelu:
      case Fn::swiglu: {
        expect(R, op, {Tag::col_mlp}, "the mlp_up output", true);
        const Mat& u = need(R, L, mb, Slot::u, op, "the mlp_up output");
        Mat a(u.rows, u.cols);
        if (fn == Fn::swiglu) {
          const Mat& g = need(R, L, mb, Slot::g, op, "the mlp_gate output");
          for (int64_t i = 0; i < u.size(); ++i) a.v[sz(i)] = silu(g.v[sz(i)]) * u.v[sz(i)];
        } else {
          for (int64_t i = 0; i < u.size(); ++i) a.v[sz(i)] = gelu(u.v[sz(i)]);
        }
        put(R, L, mb, Slot::act, a);
        set_chain(R, op, std::move(a), Tag::act, false, false);
        break;
      }
      case Fn::mlp_down: {
        const Reg& c = expect(R, op, {Tag::act}, "the MLP activation", true);
        set_chain(R, op, matmul(c.m, weight(R, LK::down_w, L, op)), Tag::mlp_out, true, false);
        break;
      }
      case Fn::lm_head: {
        const Reg& c = expect(R, op, {Tag::normf}, "the final_norm output", true);
        put(R, -1, mb, Slot::logits, matmul_nt(c.m, weight(R, head_kind(), -1, op)));
        set_chain(R, op, Mat(1, 1), Tag::logits, false, false);
        break;
      }
      case Fn::cross_entropy: {
        expect(R, op, {Tag::logits}, "the logits", true);
        const Mat& lg = need(R, -1, mb, Slot::logits, op, "the logits");
        Mat mx(lg.rows, 1, -INFINITY);
        for (int64_t i = 0; i < lg.rows; ++i)
          for (int64_t j = 0; j < lg.cols; ++j) mx.v[sz(i)] = std::max(mx.v[sz(i)], lg.at(i, j));
        put(R, -1, mb, Slot::ce_a, std::move(mx));
        R.ce_stage[mb] = 0;
        if (t == 1)
          for (int k = 0; k < 3; ++k) ce_after_reduce(R, mb, op);  // a TP group of one: local = global
        set_chain(R, op, Mat(1, 1), Tag::ce, false, false);
        break;
      }
      // ---- backward ----
      case Fn::cross_entropy_bwd: {
        if (R.ce_stage[mb] != 3)
          die(op, fmt::format("needs the loss after 3 TP AllReduces (vocab-parallel cross entropy), found {}", R.ce_stage[mb]));
        const Mat& lg = need(R, -1, mb, Slot::logits, op, "the logits");
        const Mat& shift = *find(R, -1, mb, Slot::ce_shift);
        const Mat& z = *find(R, -1, mb, Slot::ce_z);
        const double scale = loss_scale(R, mb);
        Mat dl(lg.rows, lg.cols);
        for (int64_t i = 0; i < lg.rows; ++i) {
          const size_t di = data_index(R, mb, i, lg.rows);
          if (!batch->valid[di]) continue;
          for (int64_t j = 0; j < lg.cols; ++j) dl.at(i, j) = scale * std::exp(lg.at(i, j) - shift.v[sz(i)]) / z.v[sz(i)];
          const int64_t y = batch->labels[di] - R.c.tp * Vt;
          if (y >= 0 && y < Vt) dl.at(i, y) -= scale;
        }
        put(R, -1, mb, Slot::dlogits, dl);
        set_chain(R, op, std::move(dl), Tag::dlogits, false, false);
        break;
      }
      case Fn::lm_head_dgrad: {
        const Reg& c = expect(R, op, {Tag::dlogits}, "the logits gradient", true);
        set_chain(R, op, matmul(c.m, weight(R, head_kind(), -1, op)), Tag::dnormf, true, false);
        break;
      }
      case Fn::lm_head_wgrad:
        grad_add(R, head_kind(), -1, mb,
                 matmul_tn(need(R, -1, mb, Slot::dlogits, op, "the logits gradient"),
                           col_input(R, op, Slot::nf, Slot::ref, -1)),
                 op);
        break;
      case Fn::final_norm_bwd: {
        Mat dx = norm_bwd(R, op, LK::final_w, LK::final_b, Slot::nf, Tag::dnormf);
        drop_layer(R, -1, mb, false);
        set_chain(R, op, std::move(dx), Tag::stream, false, sp);
        break;
      }
      case Fn::dropout_residual_bwd: {
        const Reg& c = expect(R, op, {Tag::stream}, "the residual-stream gradient", false);
        auto& tape = R.tape[{L, mb}];
        if (tape.empty()) die(op, "a residual backward with no matching forward branch (forward or recompute missing)");
        const Tag branch = tape.back();
        tape.pop_back();
        put(R, L, mb, Slot::dx_stream, c.m);
        if (M.bias) grad_add(R, branch == Tag::attn_out ? LK::out_b : LK::down_b, L, mb, col_sums(c.m), op);
        Mat dm = c.m;
        set_chain(R, op, std::move(dm), branch == Tag::attn_out ? Tag::d_attn_out : Tag::d_mlp_out, false, sp);
        break;
      }
      case Fn::mlp_down_dgrad: {
        const Reg& c = expect(R, op, {Tag::d_mlp_out}, "the MLP output gradient", true);
        put(R, L, mb, Slot::d_branch, c.m);
        set_chain(R, op, matmul_nt(c.m, weight(R, LK::down_w, L, op)), Tag::d_act, false, false);
        break;
      }
      case Fn::mlp_down_wgrad:
        grad_add(R, LK::down_w, L, mb,
                 matmul_tn(need(R, L, mb, Slot::act, op, "the MLP activation"),
                           need(R, L, mb, Slot::d_branch, op, "the MLP output gradient")),
                 op);
        break;
      case Fn::gelu_bwd:
      case Fn::swiglu_bwd: {
        const Reg& c = expect(R, op, {Tag::d_act}, "the activation gradient", true);
        const Mat& u = need(R, L, mb, Slot::u, op, "the mlp_up output");
        Mat du(u.rows, u.cols);
        if (fn == Fn::swiglu_bwd) {
          const Mat& g = need(R, L, mb, Slot::g, op, "the mlp_gate output");
          Mat dg(u.rows, u.cols);
          for (int64_t i = 0; i < u.size(); ++i) {
            du.v[sz(i)] = c.m.v[sz(i)] * silu(g.v[sz(i)]);
            dg.v[sz(i)] = c.m.v[sz(i)] * u.v[sz(i)] * silu_grad(g.v[sz(i)]);
          }
          put(R, L, mb, Slot::dg, std::move(dg));
        } else {
          for (int64_t i = 0; i < u.size(); ++i) du.v[sz(i)] = c.m.v[sz(i)] * gelu_grad(u.v[sz(i)]);
        }
        put(R, L, mb, Slot::du, du);
        set_chain(R, op, std::move(du), Tag::d_col_mlp, false, false);
        break;
      }
      case Fn::mlp_up_dgrad: {
        const Reg& c = expect(R, op, {Tag::d_col_mlp}, "the mlp_up output gradient", true);
        Mat dn = matmul_nt(c.m, weight(R, LK::up_w, L, op));
        if (M.swiglu) add_into(dn, matmul_nt(need(R, L, mb, Slot::dg, op, "the gate gradient"), weight(R, LK::gate_w, L, op)));
        set_chain(R, op, std::move(dn), Tag::dnorm2, true, false);
        break;
      }
      case Fn::mlp_up_wgrad: {
        const Mat& in = col_input(R, op, Slot::n2, Slot::re2, L);
        const Mat& du = need(R, L, mb, Slot::du, op, "the mlp_up output gradient");
        grad_add(R, LK::up_w, L, mb, matmul_tn(in, du), op);
        if (M.bias) grad_add(R, LK::up_b, L, mb, col_sums(du), op);
        if (M.swiglu) grad_add(R, LK::gate_w, L, mb, matmul_tn(in, need(R, L, mb, Slot::dg, op, "the gate gradient")), op);
        break;
      }
      case Fn::post_attention_norm_bwd:
      case Fn::input_norm_bwd: {
        const bool ln2 = fn == Fn::post_attention_norm_bwd;
        Mat dx = norm_bwd(R, op, ln2 ? LK::ln2_w : LK::ln1_w, ln2 ? LK::ln2_b : LK::ln1_b, ln2 ? Slot::n2 : Slot::n1,
                          ln2 ? Tag::dnorm2 : Tag::dnorm1);
        add_into(dx, need(R, L, mb, Slot::dx_stream, op, "the residual-stream gradient"));
        if (ln2) {
          put(R, L, mb, Slot::dx_stream, dx);
        } else {
          drop_layer(R, L, mb, false);
        }
        set_chain(R, op, std::move(dx), Tag::stream, false, sp);
        break;
      }
      case Fn::out_proj_dgrad: {
        const Reg& c = expect(R, op, {Tag::d_attn_out}, "the out_proj output gradient", true);
        put(R, L, mb, Slot::d_branch, c.m);
        Mat dctx = matmul_nt(c.m, weight(R, LK::out_w, L, op));
        put(R, L, mb, Slot::dctx, dctx);
        set_chain(R, op, std::move(dctx), Tag::d_ctx, false, false);
        break;
      }
      case Fn::out_proj_wgrad:
        grad_add(R, LK::out_w, L, mb,
                 matmul_tn(need(R, L, mb, Slot::ctx, op, "the attention output (forward or recompute)"),
                           need(R, L, mb, Slot::d_branch, op, "the out_proj output gradient")),
                 op);
        break;
      case Fn::attention_bwd:
        if (cp > 1) die(op, "unsplit attention backward with CP > 1");
        flash_bwd_block(R, L, mb, R.c.cp, op);
        attention_bwd_done(R, op);
        break;
      case Fn::attention_bwd_local:
        flash_bwd_block(R, L, mb, R.c.cp, op);
        break;
      case Fn::attention_bwd_remote:
        for (int64_t j = 0; j < cp; ++j)
          if (j != R.c.cp) flash_bwd_block(R, L, mb, j, op);
        attention_bwd_done(R, op);
        break;
      case Fn::attention_values_bwd: {
        const Mat& p = need(R, L, mb, Slot::probs, op, "the attention probabilities (forward or recompute)");
        const Mat& dctx = need(R, L, mb, Slot::dctx, op, "the attention output gradient");
        Mat dp(p.rows, p.cols);
        Mat dkv(cp * b * sl, 2 * gl * d);
        const int64_t group = al / gl, kvw = gl * d;
        for (int64_t j = 0; j < cp; ++j) {
          auto [K, V] = kv_block(R, L, mb, j, op);
          for (int64_t bi = 0; bi < b; ++bi)
            for (int64_t hh = 0; hh < al; ++hh)
              for (int64_t tq = 0; tq < sl; ++tq)
                for (int64_t u = 0; u < sl; ++u) {
                  const int64_t prow = (bi * al + hh) * sl + tq, col = j * sl + u, kh = hh / group;
                  double x = 0;
                  for (int64_t e = 0; e < d; ++e) {
                    x += dctx.at(bi * sl + tq, hh * d + e) * V.at(bi * sl + u, kh * d + e);
                    dkv.at(j * b * sl + bi * sl + u, kvw + kh * d + e) += p.at(prow, col) * dctx.at(bi * sl + tq, hh * d + e);
                  }
                  dp.at(prow, col) = x;
                }
        }
        put(R, L, mb, Slot::dprobs, std::move(dp));
        put(R, L, mb, Slot::dkv_all, std::move(dkv));
        break;
      }
      case Fn::softmax_dropout_bwd: {
        const Mat& p = need(R, L, mb, Slot::probs, op, "the attention probabilities");
        Mat& dp = need(R, L, mb, Slot::dprobs, op, "the probabilities gradient (attention_values_bwd)");
        for (int64_t i = 0; i < p.rows; ++i) {
          double s = 0;
          for (int64_t j = 0; j < p.cols; ++j) s += p.at(i, j) * dp.at(i, j);
          for (int64_t j = 0; j < p.cols; ++j) dp.at(i, j) = p.at(i, j) * (dp.at(i, j) - s);
        }
        break;
      }
      case Fn::attention_scores_bwd: {
        const Mat& q = need(R, L, mb, Slot::q, op, "Q");
        const Mat& ds = need(R, L, mb, Slot::dprobs, op, "the scores gradient (softmax_dropout_bwd)");
        Mat& dkv = need(R, L, mb, Slot::dkv_all, op, "dV (attention_values_bwd)");
        Mat dq(b * sl, al * d);
        const int64_t group = al / gl;
        const double scale = 1.0 / std::sqrt(static_cast<double>(d));
        for (int64_t j = 0; j < cp; ++j) {
          auto [K, V] = kv_block(R, L, mb, j, op);
          for (int64_t bi = 0; bi < b; ++bi)
            for (int64_t hh = 0; hh < al; ++hh)
              for (int64_t tq = 0; tq < sl; ++tq)
                for (int64_t u = 0; u < sl; ++u) {
                  const double g = ds.at((bi * al + hh) * sl + tq, j * sl + u) * scale;
                  if (g == 0) continue;
                  const int64_t kh = hh / group;
                  for (int64_t e = 0; e < d; ++e) {
                    dq.at(bi * sl + tq, hh * d + e) += g * K.at(bi * sl + u, kh * d + e);
                    dkv.at(j * b * sl + bi * sl + u, kh * d + e) += g * q.at(bi * sl + tq, hh * d + e);
                  }
                }
        }
        put(R, L, mb, Slot::dq, std::move(dq));
        drop(R, L, mb, Slot::dprobs);
        attention_bwd_done(R, op);
        break;
      }
      case Fn::rope_bwd: {
        const auto pos = positions(R, b * sl, false);
        rope_apply(need(R, L, mb, Slot::dq, op, "dQ"), al, d, pos, true);
        rope_apply(need(R, L, mb, Slot::dk, op, "dK (after cp_dkv_reducescatter)"), gl, d, pos, true);
        break;
      }
      case Fn::qkv_dgrad: {
        expect(R, op, {Tag::d_qkv}, "dQ, dK, dV", true);
        const Mat& dq = need(R, L, mb, Slot::dq, op, "dQ");
        const Mat& dk = need(R, L, mb, Slot::dk, op, "dK at its owner (cp_dkv_reducescatter)");
        const Mat& dv = need(R, L, mb, Slot::dv, op, "dV at its owner (cp_dkv_reducescatter)");
        Mat dqkv(b * sl, (al + 2 * gl) * d);
        set_col_range(dqkv, 0, dq);
        set_col_range(dqkv, al * d, dk);
        set_col_range(dqkv, (al + gl) * d, dv);
        put(R, L, mb, Slot::dqkv, dqkv);
        set_chain(R, op, matmul_nt(dqkv, weight(R, LK::qkv_w, L, op)), Tag::dnorm1, true, false);
        break;
      }
      case Fn::qkv_wgrad: {
        const Mat& dqkv = need(R, L, mb, Slot::dqkv, op, "dQ, dK, dV (qkv_dgrad)");
        grad_add(R, LK::qkv_w, L, mb, matmul_tn(col_input(R, op, Slot::n1, Slot::re1, L), dqkv), op);
        if (M.bias) grad_add(R, LK::qkv_b, L, mb, col_sums(dqkv), op);
        break;
      }
      case Fn::embedding_bwd: {
        const Reg& c = expect(R, op, {Tag::stream}, "the embedding output gradient", true);
        LocalParam& word = P(R, LK::word, -1, op);
        for (int64_t row = 0; row < c.m.rows; ++row) {
          const int64_t tok = batch->tokens[data_index(R, mb, row, c.m.rows)] - R.c.tp * Vt;
          if (tok >= 0 && tok < Vt)
            for (int64_t j = 0; j < h; ++j) word.grad.at(tok, j) += c.m.at(row, j);
        }
        note_write(R, LK::word, -1, mb);
        if (M.learned_pos) {
          LocalParam& pos = P(R, LK::pos, -1, op);
          for (int64_t row = 0; row < c.m.rows; ++row)
            for (int64_t j = 0; j < h; ++j) pos.grad.at(pos_of(R, row, c.m.rows, false), j) += c.m.at(row, j);
          note_write(R, LK::pos, -1, mb);
        }
        break;
      }
      default:
        die(op, "is not a compute op");
    }
  }

  void attention_bwd_done(RankState& R, const Op& op) {
    const int L = op.layer, mb = op.micro_batch;
    if (cp > 1)
      compare_tokens(kCP, need(R, L, mb, Slot::dq, op, "dQ"), Probe::dq, L, R, mb, false, R.c.tp * al * d,
                     "dQ after attention backward", true);
    if (cp == 1) {
      const Mat& dkv = need(R, L, mb, Slot::dkv_all, op, "dK/dV");
      put(R, L, mb, Slot::dk, col_range(dkv, 0, gl * d));
      put(R, L, mb, Slot::dv, col_range(dkv, gl * d, 2 * gl * d));
    }
    set_chain(R, op, Mat(1, 1), Tag::d_qkv, false, false);
  }

  // ------------------------------------------------------------------ optimizer -------
  void optimizer(int st, const Op& op) {
    const refmath::AdamHyper hp = verify_adam();
    const bool local = opt.inject == Injection::adam_before_sync;
    if (dpcp > 1 && !local) {  // every gradient reduced exactly once in its scope
      const RankState& R0 = ranks[sz(stage_ranks[sz(st)].front())];
      for (size_t p = 0; p < R0.params.size(); ++p) {
        const std::string name = fmt::format("{} (layer {})", lk_name(R0.params[p].kind), R0.params[p].layer);
        if (per_mb_reduce) {
          for (int64_t mbi = 0; mbi < m_count; ++mbi)
            if (last_write[sz(st)][p][sz(mbi)] >= 0 && !reduced_mb[sz(st)][p][sz(mbi)])
              problem(op, fmt::format("the gradient of {} from micro-batch {} was never reduced over DP x CP", name, mbi));
        } else if (!reduced_step[sz(st)][p]) {
          problem(op, fmt::format("the gradient of {} was never reduced over DP x CP", name));
        }
      }
    }
    for (int64_t r : stage_ranks[sz(st)]) {
      RankState& R = ranks[sz(r)];
      for (auto& p : R.params) {
        std::vector<int64_t> elems;
        std::vector<double> g(sz(p.size()));
        for (int64_t e = 0; e < p.size(); ++e) {
          bool use = false;
          if (local) {
            use = !p.z3 || p.owned[sz(e)];
            g[sz(e)] = p.total[sz(e)] + p.grad.v[sz(e)];
          } else if (dpcp == 1) {
            use = true;
            g[sz(e)] = p.grad.v[sz(e)];
          } else {
            use = p.owned[sz(e)] && p.has_synced[sz(e)];
            g[sz(e)] = p.synced[sz(e)];
            if (p.grad.v[sz(e)] != 0)
              problem(op, fmt::format("{} (layer {}) has gradient written after its DP reduction", lk_name(p.kind), p.layer));
          }
          if (use) elems.push_back(e);
        }
        if (!p.adam_init) {
          p.adam_idx = elems;
          p.adam_init = true;
        } else if (p.adam_idx != elems) {
          problem(op, fmt::format("{} (layer {}): the elements this rank's optimizer owns changed between steps",
                                  lk_name(p.kind), p.layer));
          continue;
        }
        if (elems.empty()) {
          std::fill(p.fresh.begin(), p.fresh.end(), 0);
          continue;
        }
        Vector vals, grads;
        for (int64_t e : elems) {
          vals.push_back(p.value.v[sz(e)]);
          grads.push_back(g[sz(e)]);
          const double want = ref->grad[sz(p.gidx[sz(e)])];
          const double err = abs_err(g[sz(e)], want);
          auto at = [&] {
            return fmt::format("gradient of {} (layer {}) element {} at the optimizer (step {}, {}): {} vs {}",
                               lk_name(p.kind), p.layer, e, step, rank_str(R), g[sz(e)], want);
          };
          record(kDP, err, at);
          if (p.tp_sharded) record(kTP, err, at);
        }
        const auto res = refmath::adam_step(vals, grads, p.adam, hp);
        // Elements this rank did not update hold last step's values until a gather.
        std::fill(p.fresh.begin(), p.fresh.end(), 0);
        for (size_t k = 0; k < elems.size(); ++k) {
          p.value.v[sz(elems[k])] = res.params[k];
          p.fresh[sz(elems[k])] = 1;
        }
      }
    }
    if (local) {  // the bug's "sync": parameters averaged over DP x CP after local steps
      for (const auto& g : stage_groups[sz(st)].at(GroupKind::DPxCP)) {
        const size_t np = ranks[sz(g.front())].params.size();
        for (size_t p = 0; p < np; ++p) {
          if (ranks[sz(g.front())].params[p].z3) continue;
          std::vector<Vector> in;
          for (int64_t r : g) in.push_back(ranks[sz(r)].params[p].value.v);
          const auto out = refmath::all_reduce(in, refmath::ReduceOp::avg);
          for (size_t i = 0; i < g.size(); ++i) {
            ranks[sz(g[i])].params[p].value.v = out[i];
            std::fill(ranks[sz(g[i])].params[p].fresh.begin(), ranks[sz(g[i])].params[p].fresh.end(), 1);
          }
        }
      }
    }
  }

  // ------------------------------------------------------------------ driver ----------
  void exec(int st, size_t idx) {
    const Op& op = plan.stages[sz(st)].ops[idx];
    const Fn fn = fns[sz(st)][idx];
    cur_stage = st;
    cur_idx = idx;
    switch (fn) {
      case Fn::send: send(st, op); return;
      case Fn::recv: recv(st, op); return;
      case Fn::wait: {
        auto& pend = pending[sz(st)];
        auto it = pend.find(op.handle);
        if (it == pend.end()) die(op, fmt::format("waits for handle {}, which is not in flight", op.handle));
        auto deliver = std::move(it->second);
        pend.erase(it);
        deliver();
        return;
      }
      case Fn::chain: chain_collective(st, op); return;
      case Fn::ce_reduce: ce_collective(st, op); return;
      case Fn::regather: regather(st, op); return;
      case Fn::cp_kv: cp_kv(st, op); return;
      case Fn::cp_dkv: cp_dkv(st, op); return;
      case Fn::dp_grad: dp_grad(st, op); return;
      case Fn::dp_param_gather: dp_param_gather(st, op); return;
      case Fn::sp_grad_allreduce: sp_grad_allreduce(st, op); return;
      case Fn::embed_grad: die(op, "an embedding-group collective outside the scheduler's rendezvous");
      case Fn::optimizer_adam: optimizer(st, op); return;
      default:
        if (op.type != OpType::compute) die(op, "is a compute name on a non-compute op");
        for (int64_t r : stage_ranks[sz(st)]) compute(ranks[sz(r)], fn, op);
    }
  }

  void run_step(int s, const Batch& bt, const RefStep* rf) {
    step = s;
    batch = &bt;
    ref = rf;
    reduced_mb.assign(sz(pp), {});
    reduced_step.assign(sz(pp), {});
    for (int64_t st = 0; st < pp; ++st) {
      const size_t np = ranks[sz(stage_ranks[sz(st)].front())].params.size();
      reduced_mb[sz(st)].assign(np, std::vector<uint8_t>(sz(m_count), 0));
      reduced_step[sz(st)].assign(np, 0);
      pending[sz(st)].clear();
    }
    mail.clear();
    for (auto& R : ranks) {
      R.frames.clear();
      R.tape.clear();
      R.ce_stage.clear();
      for (auto& c : R.cur) c = Reg{};
      R.loss_scaled = 0;
      for (auto& p : R.params) {
        std::fill(p.grad.v.begin(), p.grad.v.end(), 0.0);
        p.total.assign(sz(p.size()), 0.0);
        p.synced.assign(sz(p.size()), 0.0);
        p.has_synced.assign(sz(p.size()), 0);
        if (dpcp == 1) p.owned.assign(sz(p.size()), 1);  // else: kept from the last ReduceScatter
      }
    }
    std::vector<size_t> pc(sz(pp), 0);
    while (true) {
      bool done = true, progress = false;
      for (int st = 0; st < static_cast<int>(pp); ++st) {
        const auto& ops = plan.stages[sz(st)].ops;
        while (pc[sz(st)] < ops.size()) {
          const Op& op = ops[pc[sz(st)]];
          if (op.type == OpType::recv && !recv_ready(st, op)) break;
          if (fns[sz(st)][pc[sz(st)]] == Fn::embed_grad) {  // a collective across two stages
            cur_stage = st;
            cur_idx = pc[sz(st)];
            if (st != 0 && st != pp - 1) die(op, "an embedding-group collective on a middle stage");
            const int other = st == 0 ? static_cast<int>(pp - 1) : 0;
            if (other == st) die(op, "an embedding-group collective with one pipeline stage");
            const auto& oops = plan.stages[sz(other)].ops;
            if (pc[sz(other)] >= oops.size() || fns[sz(other)][pc[sz(other)]] != Fn::embed_grad) break;
            embed_grad(op);
            ++pc[sz(st)];
            ++pc[sz(other)];
            progress = true;
            continue;
          }
          exec(st, pc[sz(st)]);
          ++pc[sz(st)];
          progress = true;
        }
        if (pc[sz(st)] < ops.size()) done = false;
      }
      if (done) break;
      if (!progress) {
        std::string waiting;
        for (int st = 0; st < static_cast<int>(pp); ++st)
          if (pc[sz(st)] < plan.stages[sz(st)].ops.size()) {
            cur_stage = st;
            cur_idx = pc[sz(st)];
            waiting += (waiting.empty() ? "" : "; ") + where(plan.stages[sz(st)].ops[pc[sz(st)]]);
          }
        problem("deadlock: every stage waits for a message: " + waiting);
        throw PlanFatal("deadlock");
      }
    }
    for (int64_t st = 0; st < pp; ++st)
      if (!pending[sz(st)].empty())
        problem(fmt::format("stage {}: {} issued collective(s) never waited for", st, pending[sz(st)].size()));
    for (const auto& [k, q] : mail)
      if (!q.empty()) problem(fmt::format("rank {} -> {}: {} P2P message(s) never received", std::get<0>(k), std::get<1>(k), q.size()));
    // Loss: each last-stage rank of TP rank 0 holds sum(l) x |DPxCP| / N of its tokens.
    double loss = 0;
    for (int64_t r : stage_ranks[sz(pp - 1)])
      if (ranks[sz(r)].c.tp == 0) loss += ranks[sz(r)].loss_scaled;
    loss /= static_cast<double>(dpcp);
    const double e = abs_err(loss, ref->loss);
    record(kLoss, e, [&] { return fmt::format("global loss at step {}: {} vs {}", step, loss, ref->loss); });
  }

  void compare_state(int s, const std::vector<double>& ref_params, const refmath::AdamState& ref_adam) {
    for (const auto& R : ranks)
      for (const auto& p : R.params) {
        for (int64_t e = 0; e < p.size(); ++e) {
          if (!p.fresh[sz(e)]) continue;  // not this step's value yet (gathered before its next use)
          const double want = ref_params[sz(p.gidx[sz(e)])];
          record(kZeRO, abs_err(p.value.v[sz(e)], want), [&] {
            return fmt::format("parameter {} (layer {}) element {} after step {} on {}: {} vs {}", lk_name(p.kind),
                               p.layer, e, s, rank_str(R), p.value.v[sz(e)], want);
          });
        }
        for (size_t k = 0; k < p.adam_idx.size() && k < p.adam.m.size(); ++k) {
          const size_t gi = sz(p.gidx[sz(p.adam_idx[k])]);
          record(kZeRO, std::max(abs_err(p.adam.m[k], ref_adam.m[gi]), abs_err(p.adam.v[k], ref_adam.v[gi])), [&] {
            return fmt::format("Adam moments of {} (layer {}) element {} after step {} on {}", lk_name(p.kind), p.layer,
                               p.adam_idx[k], s, rank_str(R));
          });
        }
      }
  }
};

// ======================================================================================
Interpreter::Interpreter(const TinyModel& model, const StepPlan& plan, const VerifyOptions& opts)
    : impl_(std::make_unique<Impl>(model, plan, opts)) {}
Interpreter::~Interpreter() = default;

void Interpreter::load_params(const std::vector<double>& global) { impl_->load_params(global); }

void Interpreter::run_step(int step, const Batch& batch, const RefStep& ref) {
  if (impl_->fatal) return;
  try {
    impl_->run_step(step, batch, &ref);
  } catch (const PlanFatal&) {
    impl_->fatal = true;
  }
}

void Interpreter::compare_state(int step, const std::vector<double>& ref_params, const refmath::AdamState& ref_adam) {
  if (impl_->fatal) return;
  impl_->compare_state(step, ref_params, ref_adam);
}

bool Interpreter::runnable() const { return !impl_->fatal; }

std::vector<RuleResult> Interpreter::rules() const {
  const Impl& I = *impl_;
  struct Def {
    const char* name;
    const char* what;
    bool applicable;
    double tol;
  };
  const std::string zero_what =
      fmt::format("parameters and Adam moments after every step, on every rank = full Adam on one device "
                  "(ZeRO-{}: {})",
                  I.zero,
                  I.zero == 0 ? "replicated optimizer" : "owners update their shards; ReduceScatter + AllGather");
  const Def defs[kRules] = {
      {"loss", "global loss = sum of token losses / global valid-token count", true, kTolValues},
      {"DP", "gradient at the optimizer = full-batch gradient (DP x CP AVG of losses scaled by |DPxCP| / N_global)",
       true, kTolValues},
      {"TP", "after every TP collective: summed partial outputs / input grads = full-matrix results; TP-sharded "
             "parameter gradients = their slice (not averaged)",
       I.t > 1, kTolValues},
      {"CP", "ring attention (online softmax over K/V blocks) = full causal attention: output, dQ, dK/dV summed at "
             "their owners",
       I.cp > 1, kTolValues},
      {"PP", "activations and gradients received from neighbouring stages = the unsplit model's", I.pp > 1, kTolValues},
      {"ZeRO", zero_what.c_str(), true, kTolParams},
  };
  std::vector<RuleResult> out;
  for (int i = 0; i < kRules; ++i) {
    RuleResult r;
    r.name = defs[i].name;
    r.what = defs[i].what;
    r.applicable = defs[i].applicable;
    r.tolerance = defs[i].tol;
    r.values = I.acc[i].n;
    r.max_abs_error = I.acc[i].max_err;
    r.worst = I.acc[i].worst;
    r.passed = !I.fatal && r.max_abs_error <= r.tolerance && (r.values > 0 || !r.applicable);
    if (I.fatal) r.worst = "not evaluated to the end: the plan could not be executed (see rule plan)";
    else if (r.applicable && r.values == 0) r.worst = "nothing was compared";
    out.push_back(std::move(r));
  }
  RuleResult p;
  p.name = "plan";
  p.what = "every op interpreted; collective and message sizes match the tensors; every gradient reduced once; no "
           "tensor used before it exists";
  p.problems = I.problems;
  p.passed = I.problems.empty() && !I.fatal;
  out.push_back(std::move(p));
  return out;
}

std::vector<std::string> Interpreter::notes() const { return impl_->notes; }

}  // namespace dtsim::verify
