// The numerical interpreter of a StepPlan; semantics in models/verify/verify.hpp.
//
// Execution unit: a lane, the ranks of one pipeline stage with equal TP and CP coordinates,
// one per DP replica. Replicas run the same ops on their own data with their own
// parameters, so a lane keeps their activations stacked by rows, replica-major (replica
// d's rows follow replica d-1's, each block laid out as one rank's tensor), and executes
// each op once, block by block wherever parameters or data enter (one kernel over all
// rows while the replicas' parameters are bitwise equal, see Impl::uniform). TP and CP
// collectives combine the lanes of a group element-wise, which reduces every replica's own
// group at once since the blocks line up; P2P messages go from lane to lane. Parameters,
// ZeRO ownership, Adam and the DP collectives stay per rank; the replicas' working
// gradients of a parameter sit side by side in their lane's buffer. The arithmetic is
// that of rank-by-rank execution (the same kernels and summation orders on each block;
// collectives add ranks in group order, as models/reference_math does). Sizes the plan
// states are per rank (a lane's tensor holds |DP| of them).
// Why lanes: with tiny tensors the cost of an op is mostly its bookkeeping, which a lane
// pays once for |DP| ranks.
//
// Threads: pipeline stages share nothing but P2P messages (Impl::mail, under a mutex) and
// the tied-embedding collective between the first and the last stage, so with
// VerifyOptions::threads > 1 the stages of a step run on several threads (Impl::work: a
// thread claims any stage that is not waiting, runs it until its next op must wait, and
// moves on). Each op records its comparisons, problems and notes into its stage's StageOut
// with its position in the serial order (Impl::Schedule, derived from the ops alone), and
// Impl::merge_outs folds them into the totals as the serial run would have, so the report
// is the same for every thread count. A plan problem on a stage thread stops the step and
// the verification is redone on one thread (Interpreter::rerun_serial), which reports it in
// the serial order; so does a plan the schedule shows to deadlock, and the
// pp-microbatch-swap injection (which takes the newest queued message: timing-dependent).
#include "models/verify/interpreter.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
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

/// refmath works on std::vector<double>; Mat storage is pooled (models/verify/tensor.hpp).
Vector vec(const Doubles& d) { return Vector(d.begin(), d.end()); }
void set(Doubles& dst, const Vector& src) { dst.assign(src.begin(), src.end()); }

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

/// A rank's working gradient of one parameter, stored in its lane's buffer: the replicas
/// of a lane keep the gradients of a parameter side by side (Lane::grads), which the
/// per-op accumulation touches together.
struct GradView {
  struct Span {
    double* p = nullptr;
    size_t n = 0;
    double& operator[](size_t i) const { return p[i]; }
    double* data() const { return p; }
    double* begin() const { return p; }
    double* end() const { return p + n; }
    size_t size() const { return n; }
  };
  int64_t rows = 0, cols = 0;
  Span v;
  int64_t size() const { return rows * cols; }
  double* row(int64_t i) const { return v.p + i * cols; }
};

struct LocalParam {
  LK kind = LK::word;
  int layer = -1;
  Mat value;                       // local shard
  GradView grad;                   // working gradient (since the last hand-off)
  std::vector<double> total;       // every local contribution this step (adam-before-sync)
  std::vector<int64_t> gidx;       // global flat index of each element
  bool tp_sharded = false;         // a distinct shard per TP rank
  bool z3 = false;                 // ZeRO-3: only owned elements are stored between uses
  bool materialized = true;        // z3: every element present (gathered)
  Doubles synced;                  // gradient after the DP collective (owned elements)
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

/// What a lane keeps for one (layer, micro-batch): tensors by slot, norm statistics, and
/// the row-parallel branches whose forward (or recompute) ran (dropout_residual_bwd
/// takes them back in reverse). Compact: a frame in flight usually holds one or a few
/// slots, so the Mats live in chunks of kChunk taken from the storage pool as slots are
/// first held (at stable addresses until reset(): references to them stay valid).
struct Frame {
  static constexpr int kChunk = 8;
  static constexpr int kChunks = (kSlots + kChunk - 1) / kChunk;
  std::array<int8_t, kSlots> pos;   // position of slot s in the chunks, -1: none since reset
  std::array<bool, kSlots> has{};   // slot s holds a tensor
  std::array<Mat*, kChunks> chunk{};
  int8_t used = 0;                  // positions given out
  std::array<NormCache*, 3> norm{};  // input_norm, post_attention_norm, final_norm (null: none)
  std::vector<Tag> tape;
  bool live = false;

  Frame() { pos.fill(-1); }
  ~Frame() { reset(); }
  Frame(const Frame&) = delete;
  Frame& operator=(const Frame&) = delete;

  Mat& at(int i) { return chunk[sz(i / kChunk)][i % kChunk]; }
  /// Slot s's Mat (held or not), given a position if it has none.
  Mat& slot(Slot s) {
    int8_t& p = pos[static_cast<size_t>(s)];
    if (p < 0) {
      p = used++;
      Mat*& c = chunk[sz(p / kChunk)];
      if (c == nullptr) {
        c = static_cast<Mat*>(pool_allocate(kChunk * sizeof(Mat)));
        for (int i = 0; i < kChunk; ++i) ::new (static_cast<void*>(c + i)) Mat();
      }
    }
    return at(p);
  }
  Mat* held(Slot s) { return has[static_cast<size_t>(s)] ? &at(pos[static_cast<size_t>(s)]) : nullptr; }
  NormCache& norm_slot(int i) {
    if (norm[sz(i)] == nullptr) norm[sz(i)] = ::new (pool_allocate(sizeof(NormCache))) NormCache();
    return *norm[sz(i)];
  }
  void reset() {
    for (Mat*& c : chunk) {
      if (c == nullptr) continue;
      for (int i = 0; i < kChunk; ++i) c[i].~Mat();
      pool_deallocate(c, kChunk * sizeof(Mat));
      c = nullptr;
    }
    pos.fill(-1);
    has.fill(false);
    used = 0;
    for (NormCache*& n : norm)
      if (n != nullptr) {
        n->~NormCache();
        pool_deallocate(n, sizeof(NormCache));
        n = nullptr;
      }
    tape.clear();
    live = false;
  }
};
int norm_ix(Slot s) { return s == Slot::n1 ? 0 : s == Slot::n2 ? 1 : 2; }

/// A rank's parameters, gradients, ZeRO state and loss.
struct RankState {
  int64_t rank = 0;
  RankCoord c;
  int stage = 0;
  int lane = 0;
  int64_t dpcp_index = 0;  // position in the DPxCP group
  std::vector<LocalParam> params;
  std::vector<int> index;  // (layer + 1) * kLKs + kind -> params index, -1 if not held
  double loss_scaled = 0;
  std::set<int> materialized_layers;
};

/// The ranks of a stage with one (TP, CP) coordinate: their activations, stacked.
struct Lane {
  int index = 0;
  int stage = 0;
  int64_t tp = 0, cp = 0;
  int tp_first = -1;  // the lane of this lane's TP group that runs a stage's ops first
  uint64_t norm_stamp = ~uint64_t{0};  // the last norm forward this lane ran: step << 32 | op index
  std::vector<int64_t> reps;   // the ranks, by DP coordinate
  std::vector<Frame*> frames;  // [layer slot * micro-batches + mb], null: none
  std::vector<int> ce_stage;   // [mb] TP reductions of the loss done
  Reg cur[3];                  // forward, recompute, backward chains
  // The replicas' working gradients: parameter pi of replica dd at goff[pi] + dd * size.
  std::vector<double> grads;
  std::vector<int64_t> goff;
  // Impl::uniform's memo, [param]: the parameter epoch of the last comparison, and whether
  // the replicas' values were bitwise equal then.
  std::vector<uint64_t> seen;
  std::vector<uint8_t> same;
  // The replicas' parameters, looked up here rather than through each rank: the index of
  // (layer, kind) (the same in every replica), [param * |DP| + replica] its value, [param]
  // its elements.
  std::vector<int> pidx;
  std::vector<Mat*> val;
  std::vector<int64_t> psize;
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
      // The TP AllReduce of sequence-parallel replicated gradients (models/plan.cpp adopted it
      // from the verifier's report).
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

constexpr size_t kMaxProblems = 40;  // problems listed (the rest are counted out)

/// What one pipeline stage's ops record during a step: rule accumulators (with the serial
/// position of the op that set each worst value), problems and notes. Merged into the
/// interpreter's totals after the step in the serial order of the ops (Impl::merge_outs),
/// so that the report is the same however the stages were spread over threads.
struct StageOut {
  Acc acc[kRules];
  int64_t key[kRules] = {};
  std::vector<std::pair<int64_t, std::string>> problems, notes;
  std::set<std::string> problem_seen, note_seen;
};

/// The op this thread executes: its stage, its index, its position in the serial order
/// (Impl::Schedule) and where its records go (null: straight to the totals).
struct ExecCtx {
  int stage = 0;
  size_t idx = 0;
  int64_t key = 0;
  StageOut* out = nullptr;
};
thread_local ExecCtx t_exec;

/// Scratch vectors of Impl::optimizer, one set per thread.
struct OptScratch {
  std::vector<int64_t> elems;
  std::vector<double> g, vals, grads;
};
thread_local OptScratch t_opt;

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
  int64_t nd = 1;  // replicas per lane (|DP|)
  int64_t B = 1;   // samples of a lane's micro-batch: nd x b
  bool sp = false;
  int zero = 0;
  double grad_bytes = 4;
  std::vector<RankState> ranks;
  std::vector<Lane> lanes;
  std::vector<std::vector<int64_t>> stage_ranks;
  std::vector<std::vector<int>> stage_lanes;
  std::vector<std::vector<int>> lane_at;  // [stage][cp * t + tp] -> lane
  std::vector<std::map<GroupKind, std::vector<std::vector<int64_t>>>> stage_groups;  // of ranks
  std::vector<std::map<GroupKind, std::vector<std::vector<int>>>> lane_groups;       // TP, CP: of lanes
  std::vector<std::vector<int>> layer_slot;  // [stage][layer + 1] -> frame slot, -1: not on the stage
  std::vector<int> stage_slots;              // [stage] frame slots per micro-batch
  std::deque<std::deque<Frame>> frame_store;  // [stage] every frame (stable addresses)
  std::vector<std::vector<Frame*>> frame_free;  // [stage] frames not in use
  std::vector<std::vector<Fn>> fns;
  std::vector<std::set<int>> stage_layers;                       // layers each stage's ops use
  std::vector<std::set<int>> gathered_layers;  // layers a per-layer dp_param_allgather gathers
  std::vector<std::map<int, std::pair<int, int>>> chunk_layers;  // [stage] chunk -> first, last layer
  bool per_mb_reduce = false;  // gradients reduced per micro-batch (ZeRO-2/3, reduce_every_micro_batch)
  // Gradient writes by op identity: [stage][op index] -> params written (static_writes),
  // and [stage][param][mb] -> index of the last op writing that gradient.
  std::vector<std::vector<std::vector<int>>> writes_at;
  std::vector<std::vector<std::vector<int64_t>>> last_write;
  std::vector<std::vector<std::vector<uint8_t>>> reduced_mb;  // [stage][param][mb]
  std::vector<std::vector<uint8_t>> reduced_step;              // [stage][param]
  // [stage] the tied word embedding (or its last-stage copy) when a DP collective of the
  // stage carries it in a bucket of its own (GradBucket::tied_embedding), else -1.
  std::vector<int> own_bucket_param;
  // step state
  const Batch* batch = nullptr;
  const RefStep* ref = nullptr;
  int step = 0;
  std::vector<std::map<int, std::function<void()>>> pending;
  struct Msg {
    int mb = -1;
    int64_t vs = -1;  // sender's virtual stage
    Reg reg;
  };
  std::map<std::tuple<int, int, int>, std::deque<Msg>> mail;  // (from lane, to lane, backward)
  std::mutex mail_mu;  // guards `mail` while stages run on several threads
  // rules
  Acc acc[kRules];
  std::vector<std::string> problems;
  std::set<std::string> problem_set;
  std::vector<std::string> notes;
  std::set<std::string> note_set;
  bool fatal = false;
  std::vector<StageOut> outs;   // [stage] records of the step's ops, not merged yet
  std::vector<uint64_t> epoch;  // [stage] bumped whenever a rank of the stage changes a parameter value

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
    nd = dp;
    B = nd * b;
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
    per_mb_reduce = grad_sync_policy(plan.exp).every_micro_batch;  // ZeRO-2/3, reduce_every_micro_batch
    if (sl * cp != S) throw InputError("verify: plan tokens_local * cp != seq_len");
    if (static_cast<int64_t>(plan.stages.size()) != pp) throw InputError("verify: plan has not pp stages");
    epoch.assign(sz(pp), 0);
    resolve_ops();
    build_ranks();
    build_lanes();
    build_write_table();
    pending.resize(sz(pp));
    outs.resize(sz(pp));
    build_schedule();
    start_workers();
  }
  ~Impl() { stop_workers(); }

  // ------------------------------------------------------------------ problems --------
  std::string where(const Op& op) const {
    return fmt::format("stage {} op #{} '{}' ({}{}{})", t_exec.stage, t_exec.idx, op.name, to_string(op.phase),
                       op.layer >= 0 ? fmt::format(", layer {}", op.layer) : std::string(),
                       op.micro_batch >= 0 ? fmt::format(", micro-batch {}", op.micro_batch) : std::string());
  }
  void problem(const std::string& p) {
    if (StageOut* o = t_exec.out) {  // kept with its stage until merge_outs
      if (problems.size() < kMaxProblems && !problem_set.count(p) && o->problems.size() < kMaxProblems &&
          o->problem_seen.insert(p).second)
        o->problems.emplace_back(t_exec.key, p);
      return;
    }
    if (problem_set.insert(p).second && problems.size() < kMaxProblems) problems.push_back(p);
  }
  void problem(const Op& op, const std::string& what) { problem(where(op) + ": " + what); }
  [[noreturn]] void die(const Op& op, const std::string& what) {
    problem(op, what);
    throw PlanFatal(what);
  }
  void note(const std::string& n) {
    if (StageOut* o = t_exec.out) {
      if (!note_set.count(n) && o->note_seen.insert(n).second) o->notes.emplace_back(t_exec.key, n);
      return;
    }
    if (note_set.insert(n).second) notes.push_back(n);
  }
  /// Moves the stages' records of the step into the totals, as if they had been recorded
  /// one op after another in the serial order: a rule's worst value is the first (in that
  /// order) of those with the largest error; problems and notes keep their first occurrence.
  void merge_outs() {
    for (int r = 0; r < kRules; ++r) {
      Acc& g = acc[r];
      double mx = g.max_err;
      int64_t n = 0;
      for (const StageOut& o : outs)
        if (o.acc[r].n > 0) {
          mx = std::max(mx, o.acc[r].max_err);
          n += o.acc[r].n;
        }
      if (g.worst.empty() || mx > g.max_err) {
        const StageOut* first = nullptr;
        for (const StageOut& o : outs)
          if (o.acc[r].n > 0 && o.acc[r].max_err == mx && (first == nullptr || o.key[r] < first->key[r])) first = &o;
        if (first != nullptr) {
          g.max_err = mx;
          g.worst = first->acc[r].worst;
        }
      }
      g.n += n;
    }
    auto merge_lines = [this](std::vector<std::pair<int64_t, std::string>> StageOut::*list, bool is_problem) {
      std::vector<std::pair<int64_t, std::string>*> all;
      for (StageOut& o : outs)
        for (auto& e : o.*list) all.push_back(&e);
      std::stable_sort(all.begin(), all.end(), [](const auto* a, const auto* b) { return a->first < b->first; });
      for (auto* e : all) {
        if (is_problem) {
          if (problem_set.insert(e->second).second && problems.size() < kMaxProblems) problems.push_back(e->second);
        } else if (note_set.insert(e->second).second) {
          notes.push_back(e->second);
        }
      }
    };
    merge_lines(&StageOut::problems, true);
    merge_lines(&StageOut::notes, false);
    for (StageOut& o : outs) o = StageOut();
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
    p.grad.rows = rows;  // storage: the lane's (build_lanes)
    p.grad.cols = cols;
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
    // The DP replicas of a (stage, TP, CP) coordinate hold the same parameter shards: built
    // once, copied to the others.
    std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> built;
    for (int64_t r = 0; r < world; ++r) {
      RankState& R = ranks[sz(r)];
      R.rank = r;
      R.c = grid.coord_of(r);
      R.stage = static_cast<int>(R.c.pp);
      const auto g = grid.group_of(r, GroupKind::DPxCP);
      R.dpcp_index = std::find(g.begin(), g.end(), r) - g.begin();
      stage_ranks[sz(R.c.pp)].push_back(r);
      const auto [it, first] = built.try_emplace({R.c.pp, R.c.tp, R.c.cp}, r);
      if (first) {
        build_params(R);
      } else {
        R.params = ranks[sz(it->second)].params;
        R.index = ranks[sz(it->second)].index;
      }
    }
    for (int64_t st = 0; st < pp; ++st)
      for (GroupKind k : {GroupKind::TP, GroupKind::DP, GroupKind::DPxCP}) {
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

  /// Lanes: the ranks of a stage by (TP, CP) coordinate, their replicas by DP coordinate;
  /// TP and CP groups of lanes in the rank grid's group order; frame slots per stage.
  void build_lanes() {
    lane_at.assign(sz(pp), std::vector<int>(sz(cp * t), -1));
    stage_lanes.assign(sz(pp), {});
    for (int64_t st = 0; st < pp; ++st)
      for (int64_t r : stage_ranks[sz(st)]) {
        RankState& R = ranks[sz(r)];
        int& li = lane_at[sz(st)][sz(R.c.cp * t + R.c.tp)];
        if (li < 0) {
          li = static_cast<int>(lanes.size());
          Lane L;
          L.index = li;
          L.stage = static_cast<int>(st);
          L.tp = R.c.tp;
          L.cp = R.c.cp;
          L.reps.assign(sz(dp), -1);
          lanes.push_back(std::move(L));
          stage_lanes[sz(st)].push_back(li);
        }
        R.lane = li;
        lanes[sz(li)].reps[sz(R.c.dp)] = r;
      }
    lane_groups.assign(sz(pp), {});
    for (int64_t st = 0; st < pp; ++st)
      for (GroupKind k : {GroupKind::TP, GroupKind::CP}) {
        std::set<std::vector<int>> seen;
        std::vector<std::vector<int>> gs;
        for (int li : stage_lanes[sz(st)]) {
          std::vector<int> g;
          for (int64_t r : grid.group_of(lanes[sz(li)].reps.front(), k)) g.push_back(ranks[sz(r)].lane);
          if (seen.insert(g).second) gs.push_back(std::move(g));
        }
        lane_groups[sz(st)][k] = std::move(gs);
      }
    for (int64_t st = 0; st < pp; ++st)
      for (const auto& g : lane_groups[sz(st)].at(GroupKind::TP)) {
        int first = g.front();  // the group's lane that comes first in stage_lanes (exec's order)
        for (int li : stage_lanes[sz(st)])
          if (std::find(g.begin(), g.end(), li) != g.end()) {
            first = li;
            break;
          }
        for (int li : g) lanes[sz(li)].tp_first = first;
      }
    layer_slot.assign(sz(pp), std::vector<int>(sz(M.layers + 1), -1));
    stage_slots.assign(sz(pp), 0);
    frame_store.clear();
    frame_store.resize(sz(pp));
    frame_free.assign(sz(pp), {});
    for (int64_t st = 0; st < pp; ++st) {
      int n = 0;
      layer_slot[sz(st)][0] = n++;  // layer -1: embedding, head, loss
      for (int l : stage_layers[sz(st)])
        if (l >= 0 && l < M.layers) layer_slot[sz(st)][sz(l + 1)] = n++;
      stage_slots[sz(st)] = n;
      for (int li : stage_lanes[sz(st)]) {
        Lane& L = lanes[sz(li)];
        L.frames.assign(sz(n * m_count), nullptr);
        L.ce_stage.assign(sz(m_count), 0);
        const size_t np = rep(L, 0).params.size();
        L.seen.assign(np, std::numeric_limits<uint64_t>::max());
        L.same.assign(np, 0);
        L.goff.assign(np, 0);
        int64_t total = 0;
        for (size_t pi = 0; pi < np; ++pi) {
          L.goff[pi] = total;
          total += rep(L, 0).params[pi].size() * nd;
        }
        L.grads.assign(sz(total), 0.0);
        L.pidx = rep(L, 0).index;
        L.val.assign(np * sz(nd), nullptr);
        L.psize.assign(np, 0);
        for (size_t pi = 0; pi < np; ++pi) L.psize[pi] = rep(L, 0).params[pi].size();
        for (int64_t dd = 0; dd < nd; ++dd) {
          RankState& R = rep(L, dd);
          if (R.params.size() != np || R.index != L.pidx)
            throw InputError("verify: replicas of a lane hold different parameters");
          for (size_t pi = 0; pi < np; ++pi) L.val[pi * sz(nd) + sz(dd)] = &R.params[pi].value;
          for (size_t pi = 0; pi < np; ++pi) {
            LocalParam& lp = R.params[pi];
            if (lp.size() != rep(L, 0).params[pi].size())
              throw InputError("verify: replicas of a lane hold different parameters");
            lp.grad.v.p = L.grads.data() + L.goff[pi] + dd * lp.size();
            lp.grad.v.n = sz(lp.size());
          }
        }
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
        ++epoch[sz(R.stage)];
        if (p.z3) free_param(R, p);
      }
  }

  void free_param(const RankState& R, LocalParam& p) {
    ++epoch[sz(R.stage)];
    for (int64_t e = 0; e < p.size(); ++e)
      if (!p.owned[sz(e)]) {
        p.value.v[sz(e)] = kNaN;  // poison: a use before the gather shows
        p.fresh[sz(e)] = 0;
      }
    p.materialized = false;
  }

  // ------------------------------------------------------------------ access ----------
  RankState& rep(const Lane& L, int64_t dd) { return ranks[sz(L.reps[sz(dd)])]; }
  const RankState& rep(const Lane& L, int64_t dd) const { return ranks[sz(L.reps[sz(dd)])]; }

  Frame* frame(Lane& L, int layer, int mb, bool create) {
    const auto& slots = layer_slot[sz(L.stage)];
    const int slot = layer + 1 >= 0 && layer + 1 < static_cast<int>(slots.size()) ? slots[sz(layer + 1)] : -1;
    if (slot < 0 || mb < 0 || mb >= m_count) {
      if (!create) return nullptr;
      problem(fmt::format("verifier: stage {} keeps a tensor of layer {}, micro-batch {}, outside its frames", L.stage,
                          layer, mb));
      throw PlanFatal("frame");
    }
    Frame*& f = L.frames[sz(slot * m_count + mb)];
    if (f == nullptr && create) {
      auto& free_list = frame_free[sz(L.stage)];
      if (free_list.empty()) {
        frame_store[sz(L.stage)].emplace_back();
        f = &frame_store[sz(L.stage)].back();
      } else {
        f = free_list.back();
        free_list.pop_back();
      }
      f->live = true;
    }
    return f;
  }
  void release_frame(Lane& L, int layer, int mb) {
    const int slot = layer_slot[sz(L.stage)][sz(layer + 1)];
    Frame*& f = L.frames[sz(slot * m_count + mb)];
    f->reset();
    frame_free[sz(L.stage)].push_back(f);
    f = nullptr;
  }
  Mat& put(Lane& L, int layer, int mb, Slot s, Mat m) {
    Frame& f = *frame(L, layer, mb, true);
    Mat& dst = f.slot(s);
    f.has[static_cast<size_t>(s)] = true;
    return dst = std::move(m);
  }
  Mat* find(Lane& L, int layer, int mb, Slot s) {
    Frame* f = frame(L, layer, mb, false);
    return f == nullptr ? nullptr : f->held(s);
  }
  Mat& need(Lane& L, int layer, int mb, Slot s, const Op& op, const char* what) {
    Mat* m = find(L, layer, mb, s);
    if (!m) die(op, fmt::format("needs {}, which no earlier op produced (or it was freed)", what));
    return *m;
  }
  void drop(Lane& L, int layer, int mb, Slot s) {
    Frame* f = frame(L, layer, mb, false);
    Mat* m = f == nullptr ? nullptr : f->held(s);
    if (m == nullptr) return;
    f->has[static_cast<size_t>(s)] = false;
    *m = Mat();
  }
  void drop_layer(Lane& L, int layer, int mb, bool keep_input) {
    Frame* f = frame(L, layer, mb, false);
    if (f == nullptr) return;
    Mat* in = f->held(Slot::x_in);
    if (keep_input && in != nullptr) {
      Mat x = std::move(*in);
      f->reset();
      f->live = true;
      f->slot(Slot::x_in) = std::move(x);
      f->has[static_cast<size_t>(Slot::x_in)] = true;
      return;
    }
    release_frame(L, layer, mb);
  }
  NormCache& put_norm(Lane& L, int layer, int mb, Slot s, NormCache c) {
    Frame& f = *frame(L, layer, mb, true);
    return f.norm_slot(norm_ix(s)) = std::move(c);
  }
  const NormCache* find_norm(Lane& L, int layer, int mb, Slot s) {
    Frame* f = frame(L, layer, mb, false);
    return f == nullptr ? nullptr : f->norm[sz(norm_ix(s))];
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

  int lane_pindex(const Lane& L, LK k, int layer) const {
    const size_t ix = sz((layer + 1) * kLKs + static_cast<int>(k));
    return ix < L.pidx.size() ? L.pidx[ix] : -1;
  }
  /// The index of parameter k in every replica of the lane (they hold the same
  /// parameters), with P()'s reports: missing (fatal), ZeRO-3 not gathered.
  int lane_param(Lane& L, LK k, int layer, const Op& op) {
    const int pi = lane_pindex(L, k, layer);
    if (pi < 0 || zero == 3)
      for (int64_t dd = 0; dd < nd; ++dd) P(rep(L, dd), k, layer, op);
    return pi;
  }
  /// Replica dd's value of parameter k: P(rep(L, dd), k, layer, op).value, whose reports
  /// (missing; ZeRO-3 not gathered) can only apply when the lane lacks k or with ZeRO-3.
  const Mat& lane_value(Lane& L, int64_t dd, LK k, int layer, const Op& op) {
    const int pi = lane_pindex(L, k, layer);
    if (pi < 0 || zero == 3) return P(rep(L, dd), k, layer, op).value;
    return *L.val[sz(pi) * sz(nd) + sz(dd)];
  }
  /// Replica dd's working gradient of parameter pi.
  double* lane_grad(Lane& L, int pi, int64_t dd) {
    return L.grads.data() + L.goff[sz(pi)] + dd * L.psize[sz(pi)];
  }
  /// Checks a gradient write of the lane against the op's static write-set (on one lane per
  /// stage: the write-sets are the same for every rank).
  void note_write(Lane& L, int pi, LK k, int layer) {
    const RankState& R = ranks[sz(stage_ranks[sz(L.stage)].front())];
    if (R.lane != L.index) return;
    const auto& w = writes_at[sz(L.stage)][t_exec.idx];
    if (std::find(w.begin(), w.end(), pi) == w.end())
      problem(fmt::format("verifier: stage {} op #{} '{}' wrote the gradient of {} (layer {}), which its static "
                          "write-set lacks (models/verify/interpreter.cpp static_writes)",
                          L.stage, t_exec.idx, plan.stages[sz(L.stage)].ops[t_exec.idx].name, lk_name(k), layer));
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
    own_bucket_param.assign(sz(pp), -1);
    for (int64_t st = 0; st < pp; ++st) {
      const RankState& R = ranks[sz(stage_ranks[sz(st)].front())];
      const auto& ops = plan.stages[sz(st)].ops;
      for (const Op& op : ops)
        if (op.grad_bucket == GradBucket::tied_embedding)
          own_bucket_param[sz(st)] = pindex(R, st == 0 ? LK::word : LK::head_w, -1);
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
  // ------------------------------------------------------------------ data ------------
  int64_t sample_of(const RankState& R, int mb, int64_t bi) const { return (mb * dp + R.c.dp) * b + bi; }
  /// Global sequence position of row `row` of a lane's token matrix of `rows` rows
  /// (seq_shard: an SP shard); every replica's block has the same positions.
  int64_t pos_of(const Lane& L, int64_t row, int64_t rows, bool seq_shard) const {
    const int64_t n = rows / B;
    const int64_t off = L.cp * sl + (seq_shard ? L.tp * (sl / t) : 0);
    return off + row % n;
  }
  std::vector<int64_t> positions(const Lane& L, int64_t rows, bool seq_shard) const {
    std::vector<int64_t> p(sz(rows));
    for (int64_t i = 0; i < rows; ++i) p[sz(i)] = pos_of(L, i, rows, seq_shard);
    return p;
  }
  /// Index into the batch of row `row` of one rank's full-sequence token matrix of `rows`.
  size_t rank_data_index(const RankState& R, int mb, int64_t row, int64_t rows) const {
    const int64_t n = rows / b;
    return sz(sample_of(R, mb, row / n) * S + R.c.cp * sl + row % n);
  }
  /// The same for row `row` of a lane's full-sequence token matrix of `rows` rows.
  size_t data_index(const Lane& L, int mb, int64_t row, int64_t rows) const {
    const int64_t rr = rows / nd;
    return rank_data_index(rep(L, row / rr), mb, row % rr, rr);
  }
  double loss_scale(const RankState& R, int mb) const {
    const double N = static_cast<double>(batch->n_valid);
    switch (opt.inject) {
      case Injection::dp_local_mean: {
        int64_t local = 0;
        for (int64_t row = 0; row < b * sl; ++row) local += batch->valid[rank_data_index(R, mb, row, b * sl)];
        return local > 0 ? 1.0 / (static_cast<double>(local) * static_cast<double>(m_count)) : 0.0;
      }
      case Injection::cp_loss_scale: return static_cast<double>(dp) / N;
      default: return static_cast<double>(dpcp) / N;
    }
  }

  // ------------------------------------------------------------------ comparisons -----
  /// Counts a compared value; `at` (called only for a new worst) says where it was.
  Acc& cur_acc(int rule) { return t_exec.out != nullptr ? t_exec.out->acc[rule] : acc[rule]; }
  template <class F>
  void record(int rule, double err, F&& at) {
    Acc& a = cur_acc(rule);
    ++a.n;
    if (err > a.max_err || (a.worst.empty() && err >= a.max_err)) {
      a.max_err = err;
      a.worst = at();
      if (t_exec.out != nullptr) t_exec.out->key[rule] = t_exec.key;
    }
  }
  std::string rank_str(const RankState& R) const {
    return fmt::format("rank {} (tp {} cp {} dp {} pp {})", R.rank, R.c.tp, R.c.cp, R.c.dp, R.c.pp);
  }
  /// Compares a lane's token matrix with the reference probe (each replica's rows mapped
  /// to its samples, columns from col0). Gradients (`grad`): a rank's loss is scaled by
  /// |DPxCP| / N_global and the reference's by 1 / N_global, so the rank's activation
  /// gradients are divided by |DPxCP| first.
  void compare_tokens(int rule, const Mat& local, Probe p, int layer, const Lane& L, int mb, bool seq_shard,
                      int64_t col0, const char* when, bool grad = false) {
    if (!ref) return;
    const Mat& g = ref->probe(p, layer);
    const int64_t rr = local.rows / nd, n = rr / b, cols = local.cols;
    const int64_t off = L.cp * sl + (seq_shard ? L.tp * (sl / t) : 0);
    const double k = grad ? 1.0 / static_cast<double>(dpcp) : 1.0;
    Acc& a = cur_acc(rule);
    // Block by block: the n tokens of one sample of one replica are consecutive rows here
    // and in the reference (global sample, positions off .. off + n - 1).
    for (int64_t dd = 0; dd < nd; ++dd) {
      const RankState& R = rep(L, dd);
      for (int64_t bi = 0; bi < b; ++bi) {
        const int64_t row0 = dd * rr + bi * n, grow0 = sample_of(R, mb, bi) * S + off;
        // The block's largest error first (four running maxima; a NaN sets `nan`);
        // element by element only when it may set the worst.
        double m0 = 0, m1 = 0, m2 = 0, m3 = 0;
        bool nan = false;
        for (int64_t r = 0; r < n; ++r) {
          const double* x = local.row(row0 + r);
          const double* y = g.row(grow0 + r) + col0;
          int64_t j = 0;
          for (; j + 4 <= cols; j += 4) {
            const double e0 = std::fabs(k * x[j] - y[j]), e1 = std::fabs(k * x[j + 1] - y[j + 1]);
            const double e2 = std::fabs(k * x[j + 2] - y[j + 2]), e3 = std::fabs(k * x[j + 3] - y[j + 3]);
            m0 = e0 > m0 ? e0 : m0;
            m1 = e1 > m1 ? e1 : m1;
            m2 = e2 > m2 ? e2 : m2;
            m3 = e3 > m3 ? e3 : m3;
            nan = nan || (e0 != e0) || (e1 != e1) || (e2 != e2) || (e3 != e3);
          }
          for (; j < cols; ++j) {
            const double e = std::fabs(k * x[j] - y[j]);
            m0 = e > m0 ? e : m0;
            nan = nan || e != e;
          }
        }
        const double block_max = std::max(std::max(m0, m1), std::max(m2, m3));
        if (!nan && block_max <= a.max_err && !a.worst.empty()) {
          a.n += n * cols;
          continue;
        }
        for (int64_t r = 0; r < n; ++r) {
          const double* x = local.row(row0 + r);
          const double* y = g.row(grow0 + r) + col0;
          for (int64_t j = 0; j < cols; ++j) {
            const double e = abs_err(k * x[j], y[j]);
            if (e > a.max_err || a.worst.empty())
              record(rule, e, [&] {
                return fmt::format("{} of layer {} (step {}, micro-batch {}, {}, {}): {} vs {}", to_string(p), layer,
                                   step, mb, rank_str(R), when, k * x[j], y[j]);
              });
            else
              ++a.n;
          }
        }
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

  bool probe_of(const Reg& r, bool backward) const {
    Probe p;
    int layer;
    return probe_of(r, backward, p, layer);
  }
  bool has_chunk_layers(const Lane& L, const Reg& r) const {
    return chunk_layers[sz(L.stage)].count(r.model_chunk) != 0;
  }
  /// What a chain register's comparison depends on besides its values (chain_collective):
  /// two lanes holding the same values with equal keys compare them with the same reference
  /// rows (the CP coordinate; sequence shards, which depend on the TP coordinate, never match).
  struct CompareKey {
    Tag tag = Tag::none;
    int layer = -1, mb = -1, model_chunk = 0;
    bool seq_shard = true, chunk = false, from_pp = false;
    int64_t cp = -1, rows = -1, cols = -1;
    bool operator==(const CompareKey&) const = default;
  };
  static CompareKey compare_key(const Reg& r, const Lane& L) {
    CompareKey k{r.tag, r.layer, r.mb, r.model_chunk, r.seq_shard, r.chunk, r.from_pp, L.cp, r.m.rows, r.m.cols};
    if (r.seq_shard) k.cp = -1 - L.tp;  // never equal across TP ranks
    return k;
  }

  void pp_probe(Lane& L, Reg& reg, bool backward) {
    reg.from_pp = false;
    auto it = chunk_layers[sz(L.stage)].find(reg.model_chunk);
    if (it == chunk_layers[sz(L.stage)].end()) return;  // a chunk without layers
    if (backward)
      compare_tokens(kPP, reg.m, Probe::d_x_out, it->second.second, L, reg.mb, reg.seq_shard, 0, "received gradient",
                     true);
    else
      compare_tokens(kPP, reg.m, Probe::x_in, it->second.first, L, reg.mb, reg.seq_shard, 0, "received activation");
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

  /// The reduction of an activation collective, for reduce_buffers (the arithmetic of
  /// refmath::all_reduce / reduce_scatter, without their copies).
  Reduce red(const Op& op) {
    switch (rop(op)) {
      case refmath::ReduceOp::sum: return Reduce::sum;
      case refmath::ReduceOp::avg: return Reduce::avg;
      case refmath::ReduceOp::max: return Reduce::max;
    }
    return Reduce::sum;
  }
  /// Concatenation of the buffers, in order (the result of refmath::all_gather).
  static Doubles concat(const std::vector<const Doubles*>& parts) {
    size_t n = 0;
    for (const Doubles* p : parts) n += p->size();
    Doubles out;
    out.reserve(n);
    for (const Doubles* p : parts) out.insert(out.end(), p->begin(), p->end());
    return out;
  }

  /// Groups of ranks (DP, DPxCP, TP for parameter gradients).
  const std::vector<std::vector<int64_t>>& groups(int st, const Op& op) {
    auto it = stage_groups[sz(st)].find(op.group);
    if (it == stage_groups[sz(st)].end())
      die(op, fmt::format("acts on parameters over {}, which holds no replicas of them", to_string(op.group)));
    return it->second;
  }
  /// Groups of lanes of a TP or CP collective on activations.
  const std::vector<std::vector<int>>& lane_groups_of(int st, const Op& op, GroupKind want, const char* what) {
    if (op.group != want)
      die(op, fmt::format("{} over {} (expected {})", what, to_string(op.group), to_string(want)));
    return lane_groups[sz(st)].at(want);
  }

  /// TP collective on the tensor each lane's chain produced last (blocking, or issued and
  /// delivered at its wait; ops in between must not move the chain on).
  void chain_collective(int st, const Op& op) {
    if (op.kind != CommKind::TP || op.group != GroupKind::TP)
      die(op, fmt::format("a chain collective over {} (expected TP)", to_string(op.group)));
    const int ph = phase_ix(op.phase);
    const bool backward = op.phase == Phase::backward;
    // AllReduce and AllGather hand every lane of the group the same values (copies of one
    // buffer), compared with the same reference rows: the first lane's comparison stands
    // for the others with the same chain state (chain_deliver).
    const bool identical = op.collective != Collective::ReduceScatter;
    std::vector<ChainPart> parts;
    for (const auto& g : lane_groups[sz(st)].at(GroupKind::TP)) {
      const int64_t n = static_cast<int64_t>(g.size());
      // The tensors go into the collective (the chain keeps what they are, not their data,
      // until the wait delivers the result).
      parts.push_back(ChainPart{&g, {}});
      std::vector<Reg>& vals = parts.back().vals;
      vals.reserve(g.size());
      for (int li : g) {
        Reg& cur = lanes[sz(li)].cur[ph];
        vals.push_back(std::move(cur));
        cur.tag = vals.back().tag;
        cur.layer = vals.back().layer;
        cur.mb = vals.back().mb;
        cur.m = Mat();
      }
      std::vector<Reg*> regs;
      for (Reg& r : vals) regs.push_back(&r);
      Reg& r0 = *regs.front();
      if (r0.m.empty()) die(op, "acts on the tensor produced last, but the stage's chain holds none");
      const double per_rank = static_cast<double>(r0.m.size() / nd);
      switch (op.collective) {
        case Collective::AllReduce: {
          if (r0.seq_shard || r0.chunk) die(op, "AllReduce of a sharded tensor");
          check_size(op, per_rank * kActBytes, "the tensor");
          std::vector<const double*> in;
          for (Reg* r : regs) {
            if (r->m.size() != r0.m.size()) die(op, "the TP ranks' tensors differ in size");
            in.push_back(r->m.v.data());
          }
          Doubles acc(r0.m.v.size());
          reduce_buffers(in.data(), in.size(), acc.size(), red(op), acc.data());
          for (Reg* r : regs) {
            std::copy(acc.begin(), acc.end(), r->m.v.begin());
            r->partial = false;
          }
          break;
        }
        case Collective::ReduceScatter: {
          if (r0.seq_shard || r0.chunk) die(op, "ReduceScatter of a sharded tensor");
          if (sl % n != 0) die(op, fmt::format("{} tokens per rank do not split over {} ranks", sl, n));
          check_size(op, per_rank * kActBytes, "the tensor (ReduceScatter input)");
          // Element-wise reduction of the full tensors (the rank order of every element as
          // in a packed ReduceScatter), then rank i keeps sequence shard i.
          std::vector<const double*> in;
          for (Reg* r : regs) {
            if (r->m.size() != r0.m.size()) die(op, "the TP ranks' tensors differ in size");
            in.push_back(r->m.v.data());
          }
          Mat acc = Mat::uninitialized(r0.m.rows, r0.m.cols);
          reduce_buffers(in.data(), in.size(), sz(acc.size()), red(op), acc.v.data());
          for (int64_t i = 0; i < n; ++i) {
            regs[sz(i)]->m = token_range(acc, B, i * sl / n, (i + 1) * sl / n);
            regs[sz(i)]->seq_shard = true;
            regs[sz(i)]->partial = false;
          }
          break;
        }
        case Collective::AllGather: {
          std::vector<const Doubles*> bufs;
          for (Reg* r : regs) bufs.push_back(&r->m.v);
          if (r0.chunk) {
            // Every lane holds its 1/t piece of each replica's flattened tensor.
            check_size(op, static_cast<double>(r0.full_rows * r0.full_cols) * kActBytes, "the gathered message");
            const Doubles out = concat(bufs);
            const int64_t full = r0.full_rows * r0.full_cols, piece = full / n;
            if (static_cast<int64_t>(out.size()) != nd * full || piece * n != full)
              die(op, "P2P chunks do not fill the tensor");
            for (int64_t i = 0; i < n; ++i) {
              Reg& r = *regs[sz(i)];
              Mat stacked = Mat::uninitialized(nd * r.full_rows, r.full_cols);
              for (int64_t dd = 0; dd < nd; ++dd)
                for (int64_t q = 0; q < n; ++q)
                  std::copy(out.begin() + (q * nd + dd) * piece, out.begin() + (q * nd + dd + 1) * piece,
                            stacked.v.begin() + dd * full + q * piece);
              r.m = std::move(stacked);
              r.chunk = false;
            }
          } else if (r0.seq_shard) {
            check_size(op, per_rank * static_cast<double>(n) * kActBytes, "the gathered tensor");
            const int64_t cols = r0.m.cols, srows = r0.m.rows;
            for (Reg* r : regs)
              if (r->m.rows != srows || r->m.cols != cols) die(op, "the TP ranks' shards differ in size");
            Mat full = Mat::uninitialized(B * sl, cols);
            for (int64_t q = 0; q < n; ++q) set_token_range(full, B, q * sl / n, regs[sz(q)]->m);
            for (int64_t i = 0; i < n; ++i) {
              Reg& r = *regs[sz(i)];
              r.m = i + 1 < n ? full : std::move(full);
              r.seq_shard = false;
            }
          } else {
            die(op, "AllGather of a tensor that is neither sequence-sharded nor a P2P chunk");
          }
          break;
        }
      }
    }
    if (op.type == OpType::issue) {
      auto held = std::make_shared<std::vector<ChainPart>>(std::move(parts));
      launch(st, op, [this, held, ph, backward, &op, identical] {
        for (ChainPart& p : *held) chain_deliver(p, ph, backward, op, identical);
      });
    } else {
      for (ChainPart& p : parts) chain_deliver(p, ph, backward, op, identical);
    }
  }

  /// A TP group's result of chain_collective, delivered to the lanes' chains at the wait.
  struct ChainPart {
    const std::vector<int>* g;  // the lanes (Impl::lane_groups, stable)
    std::vector<Reg> vals;      // their results
  };
  /// Hands each lane of the group its result and compares it (chain_collective). With
  /// `identical` results, the lanes after the first whose comparison would be the same add
  /// their counts only (their errors are the first lane's: no new worst value).
  void chain_deliver(ChainPart& part, int ph, bool backward, const Op& op, bool identical) {
    const std::vector<int>& g = *part.g;
    CompareKey first;
    for (size_t i = 0; i < g.size(); ++i) {
      Lane& L = lanes[sz(g[i])];
      Reg& cur = L.cur[ph];
      Reg& r = part.vals[i];
      if (cur.tag != r.tag || cur.layer != r.layer || cur.mb != r.mb)
        problem(op, "an op between the issue and the wait moved the chain on: the collective's result arrives "
                    "after its tensor was consumed");
      cur = std::move(r);
      const CompareKey key = compare_key(cur, L);
      if (i == 0) first = key;
      if (identical && i > 0 && key == first) {
        if (cur.from_pp && !cur.chunk) {  // pp_probe's comparison, counted
          cur.from_pp = false;
          if (ref != nullptr && has_chunk_layers(L, cur)) cur_acc(kPP).n += cur.m.size();
        } else if (ref != nullptr && probe_of(cur, backward)) {
          cur_acc(kTP).n += cur.m.size();
        }
        continue;
      }
      if (cur.from_pp && !cur.chunk) {
        pp_probe(L, cur, backward);
        continue;
      }
      Probe p;
      int layer;
      if (probe_of(cur, backward, p, layer))
        compare_tokens(kTP, cur.m, p, layer, L, cur.mb, cur.seq_shard, 0,
                       op.phase == Phase::recompute ? "recompute, after TP collective" : "after TP collective",
                       backward);
    }
  }


  /// The three TP AllReduces of the vocab-parallel cross entropy, in Megatron-LM's order
  /// (tensor_parallel/cross_entropy.py): the logits maximum (the shift), the target logit,
  /// the sum of exponentials.
  void ce_collective(int st, const Op& op) {
    for (const auto& g : lane_groups_of(st, op, GroupKind::TP, "a loss AllReduce")) {
      std::vector<Mat*> stats;
      std::vector<const double*> in;
      for (int li : g) {
        Lane& L = lanes[sz(li)];
        Mat& a = need(L, -1, op.micro_batch, Slot::ce_a, op, "the cross-entropy statistic (cross_entropy)");
        if (L.ce_stage[sz(op.micro_batch)] >= 3)
          die(op, "a fourth loss AllReduce: the vocab-parallel cross entropy needs three");
        check_size(op, static_cast<double>(a.size() / nd) * kLossStatBytes, "the per-token fp32 statistic");
        if (!stats.empty() && a.size() != stats.front()->size()) die(op, "the TP ranks' statistics differ in size");
        stats.push_back(&a);
        in.push_back(a.v.data());
      }
      if (lanes[sz(g.front())].ce_stage[sz(op.micro_batch)] == 0 && op.reduce != ReduceOp::max)
        note(fmt::format("the first loss AllReduce reduces the logits maximum with {} (Megatron uses MAX): any shift "
                         "common to all TP ranks leaves the loss and gradients unchanged",
                         to_string(op.reduce)));
      Doubles acc(stats.front()->v.size());
      reduce_buffers(in.data(), in.size(), acc.size(), red(op), acc.data());
      for (size_t i = 0; i < g.size(); ++i) {
        std::copy(acc.begin(), acc.end(), stats[i]->v.begin());
        ce_after_reduce(lanes[sz(g[i])], op.micro_batch, op);
      }
    }
  }

  void ce_after_reduce(Lane& L, int mb, const Op& op) {
    int& k = L.ce_stage[sz(mb)];
    Mat& a = need(L, -1, mb, Slot::ce_a, op, "the cross-entropy statistic");
    const Mat& logits = need(L, -1, mb, Slot::logits, op, "the logits (lm_head)");
    const int64_t rows = logits.rows;
    if (k == 0) {  // shift reduced: local target logit next
      put(L, -1, mb, Slot::ce_shift, a);
      Mat s(rows, 1);
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t y = batch->labels[data_index(L, mb, i, rows)] - L.tp * Vt;
        if (y >= 0 && y < Vt) s.v[sz(i)] = logits.at(i, y);
      }
      a = std::move(s);
    } else if (k == 1) {  // target logit reduced: local sum of exponentials next
      put(L, -1, mb, Slot::ce_tgt, a);
      const Mat& shift = *find(L, -1, mb, Slot::ce_shift);
      Mat s(rows, 1);
      for (int64_t i = 0; i < rows; ++i) {
        const double* li = logits.row(i);
        for (int64_t j = 0; j < logits.cols; ++j) s.v[sz(i)] += std::exp(li[j] - shift.v[sz(i)]);
      }
      a = std::move(s);
    } else if (k == 2) {  // sum of exponentials reduced: the loss
      put(L, -1, mb, Slot::ce_z, a);
      const Mat& shift = *find(L, -1, mb, Slot::ce_shift);
      const Mat& tgt = *find(L, -1, mb, Slot::ce_tgt);
      const int64_t rr = rows / nd;
      for (int64_t dd = 0; dd < nd; ++dd) {
        RankState& R = rep(L, dd);
        const double scale = loss_scale(R, mb);
        for (int64_t i = dd * rr; i < (dd + 1) * rr; ++i)
          if (batch->valid[data_index(L, mb, i, rows)])
            R.loss_scaled += scale * (std::log(a.v[sz(i)]) + shift.v[sz(i)] - tgt.v[sz(i)]);
      }
    }
    ++k;
  }

  /// Asynchronous (issue) or blocking collective: `deliver` runs at the wait, or now.
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
    for (const auto& g : lane_groups_of(st, op, GroupKind::TP, "tp_allgather_input")) {
      Slot src = Slot::n1, dst = Slot::re1;
      int layer = -1;
      int64_t rows = -1, cols = 0;
      const int64_t n = static_cast<int64_t>(g.size());
      std::vector<const Mat*> shards;
      for (int li : g) {
        Lane& L = lanes[sz(li)];
        regather_target(L.cur[2], src, dst, layer, op);
        const Mat& shard = need(L, layer, op.micro_batch, src, op, "the sequence shard of the norm output");
        if (rows >= 0 && (shard.rows != rows || shard.cols != cols)) die(op, "the TP ranks' shards differ in size");
        rows = shard.rows;
        cols = shard.cols;
        shards.push_back(&shard);
      }
      check_size(op, static_cast<double>(rows / nd * cols * n) * kActBytes, "the gathered norm output");
      // Gathered now (the shards are what they are at the issue), delivered at the wait.
      Mat full = Mat::uninitialized(B * sl, cols);
      for (int64_t q = 0; q < n; ++q) set_token_range(full, B, q * sl / n, *shards[sz(q)]);
      parts.push_back([this, g, full = std::move(full), layer, dst, mb = op.micro_batch] {
        for (size_t i = 0; i < g.size(); ++i) put(lanes[sz(g[i])], layer, mb, dst, full);
      });
    }
    launch(st, op, [parts] {
      for (const auto& p : parts) p();
    });
  }

  /// K and V of a lane's tokens, side by side: rows B*sl, columns [K | V].
  Mat pack_kv(const Mat& k, const Mat& v) const {
    Mat kv = Mat::uninitialized(k.rows, 2 * k.cols);
    set_col_range(kv, 0, k);
    set_col_range(kv, k.cols, v);
    return kv;
  }

  void cp_kv(int st, const Op& op) {
    std::vector<std::function<void()>> parts;
    for (const auto& g : lane_groups_of(st, op, GroupKind::CP, "cp_kv_allgather")) {
      std::vector<Mat> kvs;
      std::vector<const Doubles*> parts_in;
      int64_t cols = 0;
      for (int li : g) {
        Lane& L = lanes[sz(li)];
        kvs.push_back(pack_kv(need(L, op.layer, op.micro_batch, Slot::k, op, "K (qkv)"),
                              need(L, op.layer, op.micro_batch, Slot::v, op, "V (qkv)")));
        cols = kvs.back().cols;
        if (kvs.back().size() != kvs.front().size()) die(op, "the CP ranks' K/V differ in size");
      }
      for (const Mat& kv : kvs) parts_in.push_back(&kv.v);
      check_size(op, static_cast<double>(kvs.front().v.size() / sz(nd) * g.size()) * kActBytes,
                 "K and V of every CP rank");
      Mat all;
      all.v = concat(parts_in);
      all.cols = cols;
      all.rows = static_cast<int64_t>(all.v.size()) / cols;
      parts.push_back([this, g, all = std::move(all), layer = op.layer, mb = op.micro_batch] {
        for (size_t i = 0; i < g.size(); ++i) put(lanes[sz(g[i])], layer, mb, Slot::kv_all, all);
      });
    }
    launch(st, op, [parts] {
      for (const auto& p : parts) p();
    });
  }

  /// ReduceScatter (SUM) of every lane's dK/dV of all CP blocks: block j to its owner j.
  /// Read when delivered: ring attention streams the blocks as attention_bwd_remote
  /// produces them.
  void cp_dkv(int st, const Op& op) {
    if (op.type == OpType::issue)
      note("cp_dkv_reducescatter is issued before attention_bwd_remote produces the dK/dV it reduces; the "
           "verifier reads its input at the wait (ring attention streams dK/dV blocks). A plan field such as "
           "Op::input_ready_at_wait would state this instead of the op name");
    const auto gs = lane_groups_of(st, op, GroupKind::CP, "cp_dkv_reducescatter");
    launch(st, op, [this, gs, op, st] {
      t_exec.stage = st;
      for (const auto& g : gs) {
        std::vector<const double*> in;
        size_t len = 0;
        for (int li : g) {
          const Mat& dkv = need(lanes[sz(li)], op.layer, op.micro_batch, Slot::dkv_all, op, "dK/dV of every block");
          if (!in.empty() && dkv.v.size() != len) die(op, "the CP ranks' dK/dV differ in size");
          len = dkv.v.size();
          in.push_back(dkv.v.data());
        }
        check_size(op, static_cast<double>(len / sz(nd)) * kActBytes, "dK/dV of every CP block");
        if (len % g.size() != 0) die(op, "dK/dV do not split over the CP ranks");
        Doubles acc(len);
        reduce_buffers(in.data(), in.size(), len, red(op), acc.data());
        const size_t chunk = len / g.size();
        for (size_t i = 0; i < g.size(); ++i) {
          Lane& L = lanes[sz(g[i])];
          Mat own = Mat::uninitialized(B * sl, 2 * gl * d);
          if (sz(own.size()) != chunk) die(op, "dK/dV blocks do not match the CP ranks' tokens");
          std::copy(acc.begin() + static_cast<std::ptrdiff_t>(i * chunk),
                    acc.begin() + static_cast<std::ptrdiff_t>((i + 1) * chunk), own.v.begin());
          put(L, op.layer, op.micro_batch, Slot::dk, col_range(own, 0, gl * d));
          put(L, op.layer, op.micro_batch, Slot::dv, col_range(own, gl * d, 2 * gl * d));
          if (cp > 1) {
            compare_tokens(kCP, *find(L, op.layer, op.micro_batch, Slot::dk), Probe::dk, op.layer, L, op.micro_batch,
                           false, L.tp * gl * d, "dK at its owner after cp_dkv_reducescatter", true);
            compare_tokens(kCP, *find(L, op.layer, op.micro_batch, Slot::dv), Probe::dv, op.layer, L, op.micro_batch,
                           false, L.tp * gl * d, "dV at its owner after cp_dkv_reducescatter", true);
          }
        }
      }
    });
  }

  // ---- data-parallel gradients and ZeRO ----
  /// The gradients a DP collective carries (Op::grad_bucket): the tied word embedding's
  /// own bucket, or every complete and unreduced gradient but one that has its own bucket.
  Bucket ready_bucket(int st, const Op& op) {
    Bucket bk;
    const RankState& R0 = ranks[sz(stage_ranks[sz(st)].front())];
    const auto& lw = last_write[sz(st)];
    const int idx = static_cast<int>(t_exec.idx);
    const bool own = op.grad_bucket == GradBucket::tied_embedding;
    const int word = own_bucket_param[sz(st)];
    if (own && word < 0) die(op, "a tied word-embedding bucket on a stage without a tied word embedding");
    for (size_t p = 0; p < R0.params.size(); ++p) {
      if (own != (static_cast<int>(p) == word)) continue;
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
    if (own && bk.params.empty())
      die(op, "the tied word embedding's own bucket, but its gradient is not complete or already reduced");
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
      parts.push_back([this, g, sel, val = std::move(val), have = std::move(have), layer, skip, st] {
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
            ++epoch[sz(st)];
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

  /// TP AllReduce SUM of the gradients of parameters replicated over TP but computed on
  /// sequence shards, as they stand (TP peers shard their DP reductions alike).
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
  static double& grad_as_is(LocalParam& p, size_t e) { return p.has_synced[e] ? p.synced[e] : p.grad.v[e]; }

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
        va[sz(e)] = grad_as_is(a, sz(e));
        vb[sz(e)] = grad_as_is(bb, sz(e));
        mixed = mixed || (a.has_synced[sz(e)] != bb.has_synced[sz(e)]);
      }
      if (mixed && mixed_pairs++ == 0) {
        first_a = A.rank;
        first_b = B.rank;
      }
      const auto out = refmath::all_reduce({va, vb}, rop(op));
      for (int64_t e = 0; e < a.size(); ++e) {
        grad_as_is(a, sz(e)) = out[0][sz(e)];
        grad_as_is(bb, sz(e)) = out[1][sz(e)];
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
  /// The lane of the stage a send or receive talks to (Op::peer_stage, else the next or
  /// previous stage), with this lane's TP and CP coordinates.
  int peer(const Lane& L, const Op& op, int delta) const {
    const int64_t st = op.peer_stage >= 0 ? op.peer_stage : L.stage + delta;
    if (st < 0 || st >= pp) return -1;
    return lane_at[sz(st)][sz(L.cp * t + L.tp)];
  }
  int64_t virtual_stage(int stage, int chunk) const { return static_cast<int64_t>(chunk) * pp + stage; }

  void send(int st, const Op& op) {
    const bool fwd = op.dir == Direction::forward;
    const int ph = fwd ? 0 : 2;
    for (int li : stage_lanes[sz(st)]) {
      Lane& L = lanes[sz(li)];
      Reg& c = L.cur[ph];
      if (c.m.empty() || c.partial || c.chunk || (c.tag != Tag::stream && c.tag != Tag::embed_out))
        die(op, "sends the stage's output, but the chain does not hold a complete activation / gradient");
      const int to = peer(L, op, fwd ? 1 : -1);
      if (to < 0) die(op, "sends to a stage outside the pipeline");
      Reg msg;
      msg.tag = c.tag;
      msg.layer = c.layer;
      msg.seq_shard = c.seq_shard;
      msg.mb = op.micro_batch;
      if (!sp && t > 1) {  // Megatron scatter/gather: each TP rank sends 1/t of each replica's tensor
        const int64_t full = c.m.size() / nd, n = full / t;
        msg.full_rows = c.m.rows / nd;
        msg.full_cols = c.m.cols;
        msg.m = Mat(1, nd * n);
        for (int64_t dd = 0; dd < nd; ++dd)
          std::copy(c.m.v.begin() + dd * full + L.tp * n, c.m.v.begin() + dd * full + (L.tp + 1) * n,
                    msg.m.v.begin() + dd * n);
        msg.chunk = true;
      } else {
        msg.m = c.m;
      }
      check_size(op, static_cast<double>(msg.m.size() / nd) * kActBytes, "the message");
      const std::lock_guard<std::mutex> lock(mail_mu);
      mail[{li, to, fwd ? 0 : 1}].push_back({op.micro_batch, virtual_stage(st, op.chunk), std::move(msg)});
    }
  }

  bool recv_ready(int st, const Op& op) {
    const bool fwd = op.dir == Direction::forward;
    const std::lock_guard<std::mutex> lock(mail_mu);
    for (int li : stage_lanes[sz(st)]) {
      auto it = mail.find({peer(lanes[sz(li)], op, fwd ? -1 : 1), li, fwd ? 0 : 1});
      if (it == mail.end() || it->second.empty()) return false;
    }
    return true;
  }

  void recv(int st, const Op& op) {
    const bool fwd = op.dir == Direction::forward;
    const int64_t want_vs = virtual_stage(st, op.chunk) + (fwd ? -1 : 1);
    for (int li : stage_lanes[sz(st)]) {
      Lane& L = lanes[sz(li)];
      const bool swap = opt.inject == Injection::pp_microbatch_swap;
      Msg msg;
      {
        const std::lock_guard<std::mutex> lock(mail_mu);
        auto& q = mail[{peer(L, op, fwd ? -1 : 1), li, fwd ? 0 : 1}];
        msg = std::move(swap ? q.back() : q.front());
        if (swap) q.pop_back(); else q.pop_front();
      }
      if (!swap && (msg.mb != op.micro_batch || msg.vs != want_vs))
        problem(op, fmt::format("receives the message of micro-batch {} from virtual stage {} (wanted micro-batch {} "
                                "from virtual stage {}): sender and receiver orders differ",
                                msg.mb, msg.vs, op.micro_batch, want_vs));
      check_size(op, static_cast<double>(msg.reg.m.size() / nd) * kActBytes, "the message");
      Reg& c = L.cur[fwd ? 0 : 2];
      c = std::move(msg.reg);
      c.mb = op.micro_batch;
      c.tag = Tag::stream;
      c.model_chunk = op.chunk;
      auto cl = chunk_layers[sz(st)].find(op.chunk);
      c.layer = cl == chunk_layers[sz(st)].end() ? -1 : (fwd ? cl->second.first - 1 : cl->second.second + 1);
      c.from_pp = true;
      if (!c.chunk) pp_probe(L, c, !fwd);
    }
  }

  // ------------------------------------------------------------------ attention -------
  bool allowed(int64_t qpos, int64_t kpos) const {
    if (opt.inject == Injection::cp_causal_local) return kpos % sl <= qpos % sl;
    return kpos <= qpos;
  }
  /// K and V of CP block j for a lane (own block without CP): row r of K is k[r * stride].
  struct KV {
    const double* k = nullptr;
    const double* v = nullptr;
    int64_t stride = 0;
  };
  KV kv_block(Lane& L, int layer, int mb, int64_t j, const Op& op) {
    if (cp == 1 || j == L.cp) {
      if (j != L.cp) die(op, "K/V block outside the CP group");
      const Mat& k = need(L, layer, mb, Slot::k, op, "K (qkv)");
      const Mat& v = need(L, layer, mb, Slot::v, op, "V (qkv)");
      return {k.v.data(), v.v.data(), k.cols};
    }
    const Mat& all = need(L, layer, mb, Slot::kv_all, op, "K/V of the other CP ranks (cp_kv_allgather)");
    const double* base = all.row(j * B * sl);
    return {base, base + gl * d, all.cols};
  }

  /// Online softmax (Milakov & Gimelshein 2018; FlashAttention, Dao 2022 Alg. 1) of this
  /// lane's queries against CP block kb: running max M, exp-sum L, weighted output ACC.
  void online_block(Lane& L, int layer, int mb, int64_t kb, const Op& op) {
    const Mat& q = need(L, layer, mb, Slot::q, op, "Q (qkv)");
    const KV kv = kv_block(L, layer, mb, kb, op);
    Mat& Mx = *find(L, layer, mb, Slot::att_m);
    Mat& Ls = *find(L, layer, mb, Slot::att_l);
    Mat& Acc = *find(L, layer, mb, Slot::att_acc);
    const int64_t group = al / gl;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    std::vector<double> s(sz(sl));
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t hh = 0; hh < al; ++hh) {
        const int64_t kh = hh / group;
        for (int64_t tq = 0; tq < sl; ++tq) {
          const int64_t row = bi * sl + tq, qpos = L.cp * sl + tq;
          const double* qr = q.row(row) + hh * d;
          double mx = -INFINITY;
          for (int64_t u = 0; u < sl; ++u) {
            s[sz(u)] = -INFINITY;
            if (!allowed(qpos, kb * sl + u)) continue;
            const double* kr = kv.k + (bi * sl + u) * kv.stride + kh * d;
            double dot = 0;
            for (int64_t x = 0; x < d; ++x) dot += qr[x] * kr[x];
            s[sz(u)] = dot * scale;
            mx = std::max(mx, s[sz(u)]);
          }
          if (mx == -INFINITY) continue;
          const double m_old = Mx.at(row, hh), m_new = std::max(m_old, mx);
          const double f = m_old == -INFINITY ? 0.0 : std::exp(m_old - m_new);
          Ls.at(row, hh) *= f;
          double* acc_r = Acc.row(row) + hh * d;
          for (int64_t x = 0; x < d; ++x) acc_r[x] *= f;
          for (int64_t u = 0; u < sl; ++u) {
            if (s[sz(u)] == -INFINITY) continue;
            const double p = std::exp(s[sz(u)] - m_new);
            Ls.at(row, hh) += p;
            const double* vr = kv.v + (bi * sl + u) * kv.stride + kh * d;
            for (int64_t x = 0; x < d; ++x) acc_r[x] += p * vr[x];
          }
          Mx.at(row, hh) = m_new;
        }
      }
  }
  void online_init(Lane& L, int layer, int mb) {
    put(L, layer, mb, Slot::att_m, Mat(B * sl, al, -INFINITY));
    put(L, layer, mb, Slot::att_l, Mat(B * sl, al));
    put(L, layer, mb, Slot::att_acc, Mat(B * sl, al * d));
  }
  void online_finish(Lane& L, int layer, int mb, const Op& op) {
    const Mat& Mx = need(L, layer, mb, Slot::att_m, op, "the online-softmax state (attention_local)");
    const Mat& Ls = *find(L, layer, mb, Slot::att_l);
    const Mat& Acc = *find(L, layer, mb, Slot::att_acc);
    Mat ctx = Mat::uninitialized(B * sl, al * d), lse = Mat::uninitialized(B * sl, al);
    for (int64_t row = 0; row < B * sl; ++row)
      for (int64_t hh = 0; hh < al; ++hh) {
        lse.at(row, hh) = Mx.at(row, hh) + std::log(Ls.at(row, hh));
        for (int64_t x = 0; x < d; ++x) ctx.at(row, hh * d + x) = Acc.at(row, hh * d + x) / Ls.at(row, hh);
      }
    for (Slot s : {Slot::att_m, Slot::att_l, Slot::att_acc, Slot::kv_all}) drop(L, layer, mb, s);
    put(L, layer, mb, Slot::lse, std::move(lse));
    finish_ctx(L, layer, mb, std::move(ctx), op);
  }
  void finish_ctx(Lane& L, int layer, int mb, Mat ctx, const Op& op) {
    if (cp > 1) compare_tokens(kCP, ctx, Probe::ctx, layer, L, mb, false, L.tp * al * d, "attention output");
    Reg& c = L.cur[phase_ix(op.phase)];
    c = Reg{};
    c.m = ctx;
    c.tag = Tag::ctx;
    c.layer = layer;
    c.mb = mb;
    put(L, layer, mb, Slot::ctx, std::move(ctx));
    drop(L, layer, mb, Slot::kv_all);
  }

  /// FlashAttention backward of this lane's queries against CP block kb (Dao 2022 Alg. 2):
  /// P = exp(S - lse), dV_j += P^T dO, dS = P (dP - rowsum(dO o O)), dQ += dS K, dK_j += dS^T Q.
  void flash_bwd_block(Lane& L, int layer, int mb, int64_t kb, const Op& op) {
    const Mat& q = need(L, layer, mb, Slot::q, op, "Q");
    const Mat& ctx = need(L, layer, mb, Slot::ctx, op, "the attention output (forward or recompute)");
    const Mat& lse = need(L, layer, mb, Slot::lse, op, "the softmax log-sum-exp (forward or recompute)");
    const Mat& dctx = need(L, layer, mb, Slot::dctx, op, "the attention output gradient (out_proj_dgrad)");
    const KV kv = kv_block(L, layer, mb, kb, op);
    Mat* dq = find(L, layer, mb, Slot::dq);
    if (!dq) dq = &put(L, layer, mb, Slot::dq, Mat(B * sl, al * d));
    Mat* dkv = find(L, layer, mb, Slot::dkv_all);
    if (!dkv) dkv = &put(L, layer, mb, Slot::dkv_all, Mat(cp * B * sl, 2 * gl * d));
    const int64_t group = al / gl, kvw = gl * d;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t hh = 0; hh < al; ++hh) {
        const int64_t kh = hh / group;
        for (int64_t tq = 0; tq < sl; ++tq) {
          const int64_t row = bi * sl + tq, qpos = L.cp * sl + tq;
          const double* qr = q.row(row) + hh * d;
          const double* dor = dctx.row(row) + hh * d;
          const double* orow = ctx.row(row) + hh * d;
          double* dqr = dq->row(row) + hh * d;
          double D = 0;
          for (int64_t x = 0; x < d; ++x) D += dor[x] * orow[x];
          for (int64_t u = 0; u < sl; ++u) {
            if (!allowed(qpos, kb * sl + u)) continue;
            const int64_t krow = bi * sl + u, drow = kb * B * sl + krow;
            const double* kr = kv.k + krow * kv.stride + kh * d;
            const double* vr = kv.v + krow * kv.stride + kh * d;
            double dot = 0, dp = 0;
            for (int64_t x = 0; x < d; ++x) {
              dot += qr[x] * kr[x];
              dp += dor[x] * vr[x];
            }
            const double p = std::exp(dot * scale - lse.at(row, hh));
            const double ds = p * (dp - D) * scale;
            double* dk_r = dkv->row(drow) + kh * d;
            double* dv_r = dkv->row(drow) + kvw + kh * d;
            for (int64_t x = 0; x < d; ++x) {
              dv_r[x] += p * dor[x];
              dqr[x] += ds * kr[x];
              dk_r[x] += ds * qr[x];
            }
          }
        }
      }
  }

  /// Unfused attention: scores of this lane's queries against every key of the sequence
  /// (rows (sample, head, query), columns key position), masked.
  // Unfused attention, one (sample, head, CP block) at a time as small matrix products
  // (tensor.hpp's kernels: each dot product or sum in the order of the key / query index,
  // as the element loops they replace).
  /// Scratch for a transposed K or V block (d x sl), one per thread.
  static std::vector<double>& block_t(const double* rows, int64_t stride, int64_t n, int64_t width) {
    thread_local std::vector<double> t;
    t.resize(sz(n * width));
    for (int64_t u = 0; u < n; ++u)
      for (int64_t x = 0; x < width; ++x) t[sz(x * n + u)] = rows[u * stride + x];
    return t;
  }
  void scores(Lane& L, int layer, int mb, const Op& op) {
    const Mat& q = need(L, layer, mb, Slot::q, op, "Q (qkv)");
    Mat sc = Mat::uninitialized(B * al * sl, cp * sl);  // every element written below
    const int64_t group = al / gl;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    for (int64_t j = 0; j < cp; ++j) {
      const KV kv = kv_block(L, layer, mb, j, op);
      for (int64_t bi = 0; bi < B; ++bi)
        for (int64_t hh = 0; hh < al; ++hh) {
          // S = Q K^T (each dot product from 0), then scaled where the mask allows.
          const std::vector<double>& kt = block_t(kv.k + bi * sl * kv.stride + (hh / group) * d, kv.stride, sl, d);
          double* sb = sc.row((bi * al + hh) * sl) + j * sl;
          gemm_ld(q.row(bi * sl) + hh * d, q.cols, kt.data(), sl, sb, sc.cols, sl, d, sl, false);
          for (int64_t tq = 0; tq < sl; ++tq)
            for (int64_t u = 0; u < sl; ++u) {
              double& x = sb[tq * sc.cols + u];
              x = allowed(L.cp * sl + tq, j * sl + u) ? x * scale : -INFINITY;
            }
        }
    }
    put(L, layer, mb, Slot::probs, std::move(sc));
  }
  void values(Lane& L, int layer, int mb, const Op& op) {
    const Mat& p = need(L, layer, mb, Slot::probs, op, "the attention probabilities (softmax_dropout)");
    Mat ctx(B * sl, al * d);
    const int64_t group = al / gl;
    for (int64_t j = 0; j < cp; ++j) {
      const KV kv = kv_block(L, layer, mb, j, op);
      for (int64_t bi = 0; bi < B; ++bi)
        for (int64_t hh = 0; hh < al; ++hh)  // ctx += P V over the block's keys, in key order
          gemm_ld(p.row((bi * al + hh) * sl) + j * sl, p.cols, kv.v + bi * sl * kv.stride + (hh / group) * d,
                  kv.stride, ctx.row(bi * sl) + hh * d, ctx.cols, sl, sl, d, true);
    }
    finish_ctx(L, layer, mb, std::move(ctx), op);
  }

  // ------------------------------------------------------------------ helpers ---------
  Reg& chain(Lane& L, const Op& op) { return L.cur[phase_ix(op.phase)]; }
  Reg& expect(Lane& L, const Op& op, std::initializer_list<Tag> tags, const char* what, bool full_tokens) {
    Reg& c = chain(L, op);
    bool ok = false;
    for (Tag tg : tags) ok = ok || c.tag == tg;
    if (!ok || c.m.empty()) die(op, fmt::format("consumes {}, which the chain does not hold here", what));
    if (c.partial) die(op, fmt::format("consumes {} while it is still a TP partial sum (no TP reduction)", what));
    if (c.chunk) die(op, fmt::format("consumes {} while it is a P2P chunk (no pp_tp_allgather)", what));
    if (full_tokens && c.seq_shard)
      die(op, fmt::format("consumes {} while it is sequence-sharded (no TP AllGather)", what));
    return c;
  }
  void set_chain(Lane& L, const Op& op, Mat m, Tag tag, bool partial, bool seq_shard) {
    Reg& c = chain(L, op);
    c = Reg{};
    c.m = std::move(m);
    c.tag = tag;
    c.layer = op.layer;
    c.mb = op.micro_batch;
    c.partial = partial && t > 1;
    c.seq_shard = seq_shard;
  }
  const double* wptr(Lane& L, int64_t dd, LK k, int layer, const Op& op) {
    return lane_value(L, dd, k, layer, op).v.data();
  }

  /// True when every replica of the lane holds bitwise the same value of parameter k (the
  /// usual case; ZeRO shards not gathered yet, or a bug, make them differ). Then one kernel
  /// over all rows of a stacked matrix gives every block exactly what its own parameter
  /// would. Memoized until a parameter value of the stage changes (epoch).
  bool uniform(Lane& L, LK k, int layer) {
    if (nd == 1) return true;
    const int pi = lane_pindex(L, k, layer);
    if (pi < 0) return false;  // P() reports it
    const uint64_t now = epoch[sz(L.stage)];
    if (L.seen[sz(pi)] == now) return L.same[sz(pi)] != 0;
    L.seen[sz(pi)] = now;
    const Doubles& v0 = L.val[sz(pi) * sz(nd)]->v;
    uint8_t same = 1;
    for (int64_t dd = 1; dd < nd && same == 1; ++dd) {
      const Doubles& vd = L.val[sz(pi) * sz(nd) + sz(dd)]->v;
      if (vd.size() != v0.size() || std::memcmp(vd.data(), v0.data(), v0.size() * sizeof(double)) != 0) same = 0;
    }
    L.same[sz(pi)] = same;
    return same != 0;
  }

  // Per-replica blocks of a lane's stacked token matrix: replica dd owns rows
  // [dd * rows / nd, (dd + 1) * rows / nd) and uses its own parameters (one kernel over
  // every row when they are uniform).
  /// x W, or x W^T with `nt` (each block with its replica's parameter k). With `bias` (x W
  /// only), then + each replica's bias (add_bias; in the same pass when both the weight and
  /// the bias are uniform).
  Mat product(Lane& L, const Mat& x, LK k, int layer, const Op& op, bool nt, const LK* bias) {
    const bool one = uniform(L, k, layer);
    const int64_t blocks = one ? 1 : nd, rr = x.rows / blocks;
    Mat y;
    for (int64_t dd = 0; dd < blocks; ++dd) {
      const Mat& w = lane_value(L, dd, k, layer, op);
      const int64_t inner = nt ? w.cols : w.rows, out = nt ? w.rows : w.cols;
      if (inner != x.cols) die(op, fmt::format("{} does not fit its input ({} x {})", lk_name(k), x.rows, x.cols));
      if (dd == 0) y = Mat::uninitialized(x.rows, out);
      if (nt) {
        gemm_nt(x.row(dd * rr), w.v.data(), y.row(dd * rr), rr, x.cols, out, false);
      } else if (one && bias != nullptr && uniform(L, *bias, layer)) {
        gemm_bias(x.v.data(), w.v.data(), wptr(L, 0, *bias, layer, op), y.v.data(), x.rows, x.cols, out);
        return y;
      } else {
        gemm(x.row(dd * rr), w.v.data(), y.row(dd * rr), rr, x.cols, out, false);
      }
    }
    if (bias != nullptr) add_bias(L, y, *bias, layer, op);
    return y;
  }
  Mat linear(Lane& L, const Mat& x, LK k, int layer, const Op& op, const LK* bias = nullptr) {
    return product(L, x, k, layer, op, false, bias);
  }
  Mat linear_nt(Lane& L, const Mat& x, LK k, int layer, const Op& op) {
    return product(L, x, k, layer, op, true, nullptr);
  }
  /// Each replica's gradient of k += a^T g over its block (row by row into the gradient).
  void wgrad(Lane& L, LK k, int layer, const Mat& a, const Mat& g, const Op& op) {
    const int pi = lane_param(L, k, layer, op);
    const Mat& g0 = *L.val[sz(pi) * sz(nd)];  // the gradient's shape
    if (g0.rows != a.cols || g0.cols != g.cols || a.rows != g.rows)
      die(op, fmt::format("the gradient of {} does not fit ({} x {})", lk_name(k), a.cols, g.cols));
    const int64_t rr = a.rows / nd;
    gemm_tn_batched(a.v.data(), g.v.data(), lane_grad(L, pi, 0), rr, a.cols, g.cols, nd, rr * a.cols, rr * g.cols,
                    L.psize[sz(pi)]);
    note_write(L, pi, k, layer);
  }
  /// y = (y + r) + each replica's bias k, row by row (add_into then add_bias, in one pass).
  void add_residual_bias(Lane& L, Mat& y, const Mat& r, LK k, int layer, const Op& op) {
    if (y.rows != r.rows || y.cols != r.cols) add_into(y, r);  // throws its shape error
    const int64_t rr = uniform(L, k, layer) ? y.rows : y.rows / nd;
    for (int64_t dd = 0; dd < y.rows / rr; ++dd) {
      const double* bias = wptr(L, dd, k, layer, op);
      for (int64_t i = dd * rr; i < (dd + 1) * rr; ++i) {
        double* yi = y.row(i);
        const double* ri = r.row(i);
        for (int64_t j = 0; j < y.cols; ++j) yi[j] = (yi[j] + ri[j]) + bias[j];
      }
    }
  }
  /// Adds each replica's bias k to its rows.
  void add_bias(Lane& L, Mat& y, LK k, int layer, const Op& op) {
    const int64_t rr = uniform(L, k, layer) ? y.rows : y.rows / nd;
    for (int64_t dd = 0; dd < y.rows / rr; ++dd) {
      const double* bias = wptr(L, dd, k, layer, op);
      for (int64_t i = dd * rr; i < (dd + 1) * rr; ++i) {
        double* yi = y.row(i);
        for (int64_t j = 0; j < y.cols; ++j) yi[j] += bias[j];
      }
    }
  }
  /// Each replica's gradient of bias k += its block of g, row by row.
  void bias_grad(Lane& L, LK k, int layer, const Mat& g, const Op& op) {
    const int pi = lane_param(L, k, layer, op);
    if (rep(L, 0).params[sz(pi)].grad.size() != g.cols)
      die(op, fmt::format("the gradient of {} does not fit", lk_name(k)));
    const int64_t rr = g.rows / nd;
    for (int64_t dd = 0; dd < nd; ++dd) {
      double* s = lane_grad(L, pi, dd);
      for (int64_t i = dd * rr; i < (dd + 1) * rr; ++i) {
        const double* gi = g.row(i);
        for (int64_t j = 0; j < g.cols; ++j) s[j] += gi[j];
      }
    }
    note_write(L, pi, k, layer);
  }

  void norm_fwd(Lane& L, const Op& op, LK w, LK bb, Slot out, Tag tag) {
    const int layer = op.layer, mb = op.micro_batch;
    Mat x;
    if (op.phase == Phase::recompute && out == Slot::n1) {
      x = need(L, layer, mb, Slot::x_in, op, "the layer input (checkpoint)");
    } else {
      Reg& c = expect(L, op, {Tag::stream, Tag::embed_out}, "the residual stream", false);
      if (c.seq_shard != sp) die(op, sp ? "needs the sequence shard of the residual stream (sequence parallel)"
                                        : "needs the full residual stream");
      x = std::move(c.m);  // the chain moves on to the norm's output
      if (out == Slot::n1 && op.phase == Phase::forward) put(L, layer, mb, Slot::x_in, x);
    }
    const bool one = uniform(L, w, layer) && (!M.layernorm || uniform(L, bb, layer));
    const int64_t rr = one ? x.rows : x.rows / nd;
    NormCache cache;
    Mat y;
    const uint64_t stamp = (static_cast<uint64_t>(step) << 32) | static_cast<uint64_t>(t_exec.idx);
    if (!reuse_norm(L, op, x, w, bb, out, one, cache, y)) {
      cache.xhat = Mat::uninitialized(x.rows, x.cols);
      cache.rstd.assign(sz(x.rows), 0.0);
      y = Mat::uninitialized(x.rows, x.cols);
      for (int64_t dd = 0; dd < x.rows / rr; ++dd) {
        norm_forward_rows(x.row(dd * rr), rr, x.cols, wptr(L, dd, w, layer, op),
                          M.layernorm ? wptr(L, dd, bb, layer, op) : nullptr, M.layernorm, y.row(dd * rr),
                          cache.xhat.row(dd * rr), cache.rstd.data() + dd * rr);
      }
    }
    L.norm_stamp = stamp;
    put(L, layer, mb, Slot::res, std::move(x));
    put_norm(L, layer, mb, out, std::move(cache));
    put(L, layer, mb, out, y);
    set_chain(L, op, std::move(y), tag, false, sp);
  }
  /// Without sequence parallelism the TP ranks of a group normalize the same residual
  /// stream with the same (replicated) weights: when lane L's input and the weights each
  /// of its row blocks uses are bitwise those of the first lane of its TP group, which ran
  /// this op just before, that lane's output and statistics are L's (the same kernel on the
  /// same bits), copied instead of recomputed. False: L computes them itself.
  bool reuse_norm(Lane& L, const Op& op, const Mat& x, LK w, LK bb, Slot out, bool one, NormCache& cache, Mat& y) {
    if (sp || L.tp_first < 0 || L.tp_first == L.index) return false;
    Lane& D = lanes[sz(L.tp_first)];
    if (D.norm_stamp != ((static_cast<uint64_t>(step) << 32) | static_cast<uint64_t>(t_exec.idx))) return false;
    const int layer = op.layer, mb = op.micro_batch;
    const Mat* dx = find(D, layer, mb, Slot::res);
    const NormCache* dc = find_norm(D, layer, mb, out);
    const Mat* dy = find(D, layer, mb, out);
    if (dx == nullptr || dc == nullptr || dy == nullptr || dx->rows != x.rows || dx->cols != x.cols ||
        std::memcmp(dx->v.data(), x.v.data(), sz(x.size()) * sizeof(double)) != 0)
      return false;
    const bool one_d = uniform(D, w, layer) && (!M.layernorm || uniform(D, bb, layer));
    auto same = [&](LK k, int64_t dd) {
      const Mat& a = lane_value(L, one ? 0 : dd, k, layer, op);
      const Mat& b = lane_value(D, one_d ? 0 : dd, k, layer, op);
      return a.v.size() == b.v.size() && std::memcmp(a.v.data(), b.v.data(), a.v.size() * sizeof(double)) == 0;
    };
    for (int64_t dd = 0; dd < (one && one_d ? 1 : nd); ++dd)
      if (!same(w, dd) || (M.layernorm && !same(bb, dd))) return false;
    cache.xhat = dc->xhat;
    cache.rstd = dc->rstd;
    y = *dy;
    return true;
  }
  Mat norm_bwd(Lane& L, const Op& op, LK w, LK bb, Slot cache_slot, Tag dtag) {
    const int layer = op.layer, mb = op.micro_batch;
    const Reg& c = expect(L, op, {dtag}, "the norm output gradient", false);
    const NormCache* cache = find_norm(L, layer, mb, cache_slot);
    if (!cache) die(op, "needs the norm's forward statistics, which were not kept or recomputed");
    if (cache->xhat.rows != c.m.rows || cache->xhat.cols != c.m.cols)
      die(op, "the norm's output gradient does not fit its forward statistics");
    const int64_t rr = c.m.rows / nd;
    const int pw = lane_param(L, w, layer, op), pb = M.layernorm ? lane_param(L, bb, layer, op) : -1;
    const bool one = uniform(L, w, layer);
    Mat dx = Mat::uninitialized(c.m.rows, c.m.cols);
    for (int64_t dd = 0; dd < nd; ++dd) {
      const double* wv = L.val[sz(pw) * sz(nd) + sz(one ? 0 : dd)]->v.data();
      norm_backward_rows(c.m.row(dd * rr), rr, c.m.cols, wv, M.layernorm, cache->xhat.row(dd * rr),
                         cache->rstd.data() + dd * rr, lane_grad(L, pw, dd), pb >= 0 ? lane_grad(L, pb, dd) : nullptr,
                         dx.row(dd * rr));
    }
    note_write(L, pw, w, layer);
    if (pb >= 0) note_write(L, pb, bb, layer);
    return dx;
  }
  /// The full-token input of a column-parallel layer for its weight gradient: re-gathered
  /// with sequence parallelism, the kept norm output otherwise.
  const Mat& col_input(Lane& L, const Op& op, Slot norm_slot, Slot regathered, int layer) {
    if (sp) return need(L, layer, op.micro_batch, regathered, op, "the re-gathered norm output (tp_allgather_input)");
    return need(L, layer, op.micro_batch, norm_slot, op, "the norm output");
  }

  void layer_forward_done(Lane& L, int layer, int mb) {
    const Recompute rc = plan.exp.layout.recompute;
    drop(L, layer, mb, Slot::tmp_in);
    if (rc == Recompute::full) {
      drop_layer(L, layer, mb, /*keep_input=*/true);
    } else if (rc == Recompute::selective) {
      for (Slot s : {Slot::ctx, Slot::lse, Slot::probs}) drop(L, layer, mb, s);
    }
  }

  // ------------------------------------------------------------------ compute ---------
  void compute(Lane& L, Fn fn, const Op& op) {
    const int Ly = op.layer, mb = op.micro_batch;
    if (op.type == OpType::compute && zero == 3)  // ZeRO-3 frees gathered layers after use
      for (int64_t dd = 0; dd < nd; ++dd) {
        RankState& R = rep(L, dd);
        for (auto it = R.materialized_layers.begin(); it != R.materialized_layers.end();) {
          if (*it != Ly) {
            for (auto& p : R.params)
              if (p.layer == *it && p.z3) free_param(R, p);
            it = R.materialized_layers.erase(it);
          } else {
            ++it;
          }
        }
      }
    switch (fn) {
      // ---- forward ----
      case Fn::embedding: {
        const int64_t rows = B * sl, rr = rows / nd;
        Mat y(rows, h);
        for (int64_t dd = 0; dd < nd; ++dd) {
          RankState& R = rep(L, dd);
          const Mat& word = P(R, LK::word, -1, op).value;
          const Mat* pos = M.learned_pos ? &P(R, LK::pos, -1, op).value : nullptr;
          for (int64_t row = dd * rr; row < (dd + 1) * rr; ++row) {
            const int64_t tok = batch->tokens[data_index(L, mb, row, rows)] - L.tp * Vt;
            double* yr = y.row(row);
            if (tok >= 0 && tok < Vt)
              for (int64_t j = 0; j < h; ++j) yr[j] = word.at(tok, j);
            if (pos && L.tp == 0) {  // replicated positions: added once before the TP SUM
              const double* pr = pos->row(pos_of(L, row, rows, false));
              for (int64_t j = 0; j < h; ++j) yr[j] += pr[j];
            }
          }
        }
        set_chain(L, op, std::move(y), Tag::embed_out, true, false);
        break;
      }
      case Fn::input_norm: norm_fwd(L, op, LK::ln1_w, LK::ln1_b, Slot::n1, Tag::norm1); break;
      case Fn::post_attention_norm: norm_fwd(L, op, LK::ln2_w, LK::ln2_b, Slot::n2, Tag::norm2); break;
      case Fn::final_norm: norm_fwd(L, op, LK::final_w, LK::final_b, Slot::nf, Tag::normf); break;
      case Fn::qkv: {
        const Reg& c = expect(L, op, {Tag::norm1}, "the input_norm output", true);
        const LK qkv_b = LK::qkv_b;
        Mat y = linear(L, c.m, LK::qkv_w, Ly, op, M.bias ? &qkv_b : nullptr);
        put(L, Ly, mb, Slot::q, col_range(y, 0, al * d));
        put(L, Ly, mb, Slot::k, col_range(y, al * d, (al + gl) * d));
        put(L, Ly, mb, Slot::v, col_range(y, (al + gl) * d, (al + 2 * gl) * d));
        set_chain(L, op, Mat(1, 1), Tag::qkv, false, false);  // marker: Q, K, V live in slots
        break;
      }
      case Fn::rope: {
        const auto pos = positions(L, B * sl, false);
        rope_apply(need(L, Ly, mb, Slot::q, op, "Q"), al, d, pos, false);
        rope_apply(need(L, Ly, mb, Slot::k, op, "K"), gl, d, pos, false);
        break;
      }
      case Fn::attention:
        if (cp > 1) die(op, "unsplit attention with CP > 1: the other ranks' K/V blocks are never used");
        online_init(L, Ly, mb);
        online_block(L, Ly, mb, L.cp, op);
        online_finish(L, Ly, mb, op);
        break;
      case Fn::attention_local:
        online_init(L, Ly, mb);
        online_block(L, Ly, mb, L.cp, op);
        break;
      case Fn::attention_remote:
        for (int64_t j = 0; j < cp; ++j)
          if (j != L.cp) online_block(L, Ly, mb, j, op);
        online_finish(L, Ly, mb, op);
        break;
      case Fn::attention_scores: scores(L, Ly, mb, op); break;
      case Fn::softmax_dropout: {
        Mat& p = need(L, Ly, mb, Slot::probs, op, "the attention scores");
        for (int64_t i = 0; i < p.rows; ++i) {
          double* pi = p.row(i);
          double mx = -INFINITY, z = 0;
          for (int64_t j = 0; j < p.cols; ++j) mx = std::max(mx, pi[j]);
          for (int64_t j = 0; j < p.cols; ++j) z += (pi[j] = pi[j] == -INFINITY ? 0.0 : std::exp(pi[j] - mx));
          for (int64_t j = 0; j < p.cols; ++j) pi[j] /= z;
        }
        break;
      }
      case Fn::attention_values: values(L, Ly, mb, op); break;
      case Fn::out_proj: {
        const Reg& c = expect(L, op, {Tag::ctx}, "the attention output", true);
        set_chain(L, op, linear(L, c.m, LK::out_w, Ly, op), Tag::attn_out, true, false);
        break;
      }
      case Fn::dropout_residual: {
        Reg& c = expect(L, op, {Tag::attn_out, Tag::mlp_out}, "a row-parallel output", false);
        if (c.seq_shard != sp) die(op, sp ? "adds a full-sequence output to a sequence-shard residual (no ReduceScatter)"
                                          : "adds a sequence-sharded output to the full residual");
        const bool attn = c.tag == Tag::attn_out;
        Mat x = std::move(need(L, Ly, mb, Slot::res, op, "the residual"));  // consumed here
        drop(L, Ly, mb, Slot::res);
        if (M.bias)
          add_residual_bias(L, x, c.m, attn ? LK::out_b : LK::down_b, Ly, op);
        else
          add_into(x, c.m);
        frame(L, Ly, mb, true)->tape.push_back(c.tag);
        set_chain(L, op, std::move(x), Tag::stream, false, sp);
        if (!attn && op.phase == Phase::forward) layer_forward_done(L, Ly, mb);
        break;
      }
      case Fn::mlp_up: {
        const Reg& c = expect(L, op, {Tag::norm2}, "the post_attention_norm output", true);
        if (M.swiglu) put(L, Ly, mb, Slot::tmp_in, c.m);  // for mlp_gate
        const LK up_b = LK::up_b;
        Mat u = linear(L, c.m, LK::up_w, Ly, op, M.bias ? &up_b : nullptr);
        put(L, Ly, mb, Slot::u, u);
        set_chain(L, op, std::move(u), Tag::col_mlp, false, false);
        break;
      }
      case Fn::mlp_gate:
        put(L, Ly, mb, Slot::g, linear(L, need(L, Ly, mb, Slot::tmp_in, op, "the MLP input"), LK::gate_w, Ly, op));
        break;
      case Fn::gelu:
      case Fn::swiglu: {
        expect(L, op, {Tag::col_mlp}, "the mlp_up output", true);
        const Mat& u = need(L, Ly, mb, Slot::u, op, "the mlp_up output");
        Mat a = Mat::uninitialized(u.rows, u.cols);
        if (fn == Fn::swiglu) {
          const Mat& g = need(L, Ly, mb, Slot::g, op, "the mlp_gate output");
          for (int64_t i = 0; i < u.size(); ++i) a.v[sz(i)] = silu(g.v[sz(i)]) * u.v[sz(i)];
        } else {
          for (int64_t i = 0; i < u.size(); ++i) a.v[sz(i)] = gelu(u.v[sz(i)]);
        }
        put(L, Ly, mb, Slot::act, a);
        set_chain(L, op, std::move(a), Tag::act, false, false);
        break;
      }
      case Fn::mlp_down: {
        const Reg& c = expect(L, op, {Tag::act}, "the MLP activation", true);
        set_chain(L, op, linear(L, c.m, LK::down_w, Ly, op), Tag::mlp_out, true, false);
        break;
      }
      case Fn::lm_head: {
        const Reg& c = expect(L, op, {Tag::normf}, "the final_norm output", true);
        put(L, -1, mb, Slot::logits, linear_nt(L, c.m, head_kind(), -1, op));
        set_chain(L, op, Mat(1, 1), Tag::logits, false, false);
        break;
      }
      case Fn::cross_entropy: {
        expect(L, op, {Tag::logits}, "the logits", true);
        const Mat& lg = need(L, -1, mb, Slot::logits, op, "the logits");
        Mat mx(lg.rows, 1, -INFINITY);
        for (int64_t i = 0; i < lg.rows; ++i) {
          const double* li = lg.row(i);
          for (int64_t j = 0; j < lg.cols; ++j) mx.v[sz(i)] = std::max(mx.v[sz(i)], li[j]);
        }
        put(L, -1, mb, Slot::ce_a, std::move(mx));
        L.ce_stage[sz(mb)] = 0;
        if (t == 1)
          for (int k = 0; k < 3; ++k) ce_after_reduce(L, mb, op);  // a TP group of one: local = global
        set_chain(L, op, Mat(1, 1), Tag::ce, false, false);
        break;
      }
      // ---- backward ----
      case Fn::cross_entropy_bwd: {
        if (L.ce_stage[sz(mb)] != 3)
          die(op, fmt::format("needs the loss after 3 TP AllReduces (vocab-parallel cross entropy), found {}",
                              L.ce_stage[sz(mb)]));
        const Mat& lg = need(L, -1, mb, Slot::logits, op, "the logits");
        const Mat& shift = *find(L, -1, mb, Slot::ce_shift);
        const Mat& z = *find(L, -1, mb, Slot::ce_z);
        const int64_t rr = lg.rows / nd;
        Mat dl(lg.rows, lg.cols);
        for (int64_t dd = 0; dd < nd; ++dd) {
          const double scale = loss_scale(rep(L, dd), mb);
          for (int64_t i = dd * rr; i < (dd + 1) * rr; ++i) {
            const size_t di = data_index(L, mb, i, lg.rows);
            if (!batch->valid[di]) continue;
            const double* li = lg.row(i);
            double* dli = dl.row(i);
            for (int64_t j = 0; j < lg.cols; ++j) dli[j] = scale * std::exp(li[j] - shift.v[sz(i)]) / z.v[sz(i)];
            const int64_t y = batch->labels[di] - L.tp * Vt;
            if (y >= 0 && y < Vt) dli[y] -= scale;
          }
        }
        put(L, -1, mb, Slot::dlogits, dl);
        set_chain(L, op, std::move(dl), Tag::dlogits, false, false);
        break;
      }
      case Fn::lm_head_dgrad: {
        const Reg& c = expect(L, op, {Tag::dlogits}, "the logits gradient", true);
        set_chain(L, op, linear(L, c.m, head_kind(), -1, op), Tag::dnormf, true, false);
        break;
      }
      case Fn::lm_head_wgrad:
        wgrad(L, head_kind(), -1, need(L, -1, mb, Slot::dlogits, op, "the logits gradient"),
              col_input(L, op, Slot::nf, Slot::ref, -1), op);
        break;
      case Fn::final_norm_bwd: {
        Mat dx = norm_bwd(L, op, LK::final_w, LK::final_b, Slot::nf, Tag::dnormf);
        drop_layer(L, -1, mb, false);
        set_chain(L, op, std::move(dx), Tag::stream, false, sp);
        break;
      }
      case Fn::dropout_residual_bwd: {
        const Reg& c = expect(L, op, {Tag::stream}, "the residual-stream gradient", false);
        Frame* f = frame(L, Ly, mb, false);
        if (f == nullptr || f->tape.empty())
          die(op, "a residual backward with no matching forward branch (forward or recompute missing)");
        const Tag branch = f->tape.back();
        f->tape.pop_back();
        put(L, Ly, mb, Slot::dx_stream, c.m);
        if (M.bias) bias_grad(L, branch == Tag::attn_out ? LK::out_b : LK::down_b, Ly, c.m, op);
        Mat dm = std::move(c.m);  // the chain moves on to the branch's gradient
        set_chain(L, op, std::move(dm), branch == Tag::attn_out ? Tag::d_attn_out : Tag::d_mlp_out, false, sp);
        break;
      }
      case Fn::mlp_down_dgrad: {
        Reg& c = expect(L, op, {Tag::d_mlp_out}, "the MLP output gradient", true);
        Mat da = linear_nt(L, c.m, LK::down_w, Ly, op);
        put(L, Ly, mb, Slot::d_branch, std::move(c.m));
        set_chain(L, op, std::move(da), Tag::d_act, false, false);
        break;
      }
      case Fn::mlp_down_wgrad:
        wgrad(L, LK::down_w, Ly, need(L, Ly, mb, Slot::act, op, "the MLP activation"),
              need(L, Ly, mb, Slot::d_branch, op, "the MLP output gradient"), op);
        break;
      case Fn::gelu_bwd:
      case Fn::swiglu_bwd: {
        const Reg& c = expect(L, op, {Tag::d_act}, "the activation gradient", true);
        const Mat& u = need(L, Ly, mb, Slot::u, op, "the mlp_up output");
        Mat du = Mat::uninitialized(u.rows, u.cols);
        if (fn == Fn::swiglu_bwd) {
          const Mat& g = need(L, Ly, mb, Slot::g, op, "the mlp_gate output");
          Mat dg = Mat::uninitialized(u.rows, u.cols);
          for (int64_t i = 0; i < u.size(); ++i) {
            du.v[sz(i)] = c.m.v[sz(i)] * silu(g.v[sz(i)]);
            dg.v[sz(i)] = c.m.v[sz(i)] * u.v[sz(i)] * silu_grad(g.v[sz(i)]);
          }
          put(L, Ly, mb, Slot::dg, std::move(dg));
        } else {
          for (int64_t i = 0; i < u.size(); ++i) du.v[sz(i)] = c.m.v[sz(i)] * gelu_grad(u.v[sz(i)]);
        }
        put(L, Ly, mb, Slot::du, du);
        set_chain(L, op, std::move(du), Tag::d_col_mlp, false, false);
        break;
      }
      case Fn::mlp_up_dgrad: {
        const Reg& c = expect(L, op, {Tag::d_col_mlp}, "the mlp_up output gradient", true);
        Mat dn = linear_nt(L, c.m, LK::up_w, Ly, op);
        if (M.swiglu)
          add_into(dn, linear_nt(L, need(L, Ly, mb, Slot::dg, op, "the gate gradient"), LK::gate_w, Ly, op));
        set_chain(L, op, std::move(dn), Tag::dnorm2, true, false);
        break;
      }
      case Fn::mlp_up_wgrad: {
        const Mat& in = col_input(L, op, Slot::n2, Slot::re2, Ly);
        const Mat& du = need(L, Ly, mb, Slot::du, op, "the mlp_up output gradient");
        wgrad(L, LK::up_w, Ly, in, du, op);
        if (M.bias) bias_grad(L, LK::up_b, Ly, du, op);
        if (M.swiglu) wgrad(L, LK::gate_w, Ly, in, need(L, Ly, mb, Slot::dg, op, "the gate gradient"), op);
        break;
      }
      case Fn::post_attention_norm_bwd:
      case Fn::input_norm_bwd: {
        const bool ln2 = fn == Fn::post_attention_norm_bwd;
        Mat dx = norm_bwd(L, op, ln2 ? LK::ln2_w : LK::ln1_w, ln2 ? LK::ln2_b : LK::ln1_b, ln2 ? Slot::n2 : Slot::n1,
                          ln2 ? Tag::dnorm2 : Tag::dnorm1);
        add_into(dx, need(L, Ly, mb, Slot::dx_stream, op, "the residual-stream gradient"));
        if (ln2) {
          put(L, Ly, mb, Slot::dx_stream, dx);
        } else {
          drop_layer(L, Ly, mb, false);
        }
        set_chain(L, op, std::move(dx), Tag::stream, false, sp);
        break;
      }
      case Fn::out_proj_dgrad: {
        Reg& c = expect(L, op, {Tag::d_attn_out}, "the out_proj output gradient", true);
        Mat dctx = linear_nt(L, c.m, LK::out_w, Ly, op);
        put(L, Ly, mb, Slot::d_branch, std::move(c.m));
        put(L, Ly, mb, Slot::dctx, dctx);
        set_chain(L, op, std::move(dctx), Tag::d_ctx, false, false);
        break;
      }
      case Fn::out_proj_wgrad:
        wgrad(L, LK::out_w, Ly, need(L, Ly, mb, Slot::ctx, op, "the attention output (forward or recompute)"),
              need(L, Ly, mb, Slot::d_branch, op, "the out_proj output gradient"), op);
        break;
      case Fn::attention_bwd:
        if (cp > 1) die(op, "unsplit attention backward with CP > 1");
        flash_bwd_block(L, Ly, mb, L.cp, op);
        attention_bwd_done(L, op);
        break;
      case Fn::attention_bwd_local:
        flash_bwd_block(L, Ly, mb, L.cp, op);
        break;
      case Fn::attention_bwd_remote:
        for (int64_t j = 0; j < cp; ++j)
          if (j != L.cp) flash_bwd_block(L, Ly, mb, j, op);
        attention_bwd_done(L, op);
        break;
      case Fn::attention_values_bwd: {
        const Mat& p = need(L, Ly, mb, Slot::probs, op, "the attention probabilities (forward or recompute)");
        const Mat& dctx = need(L, Ly, mb, Slot::dctx, op, "the attention output gradient");
        Mat dp = Mat::uninitialized(p.rows, p.cols);  // every element written below
        Mat dkv(cp * B * sl, 2 * gl * d);
        const int64_t group = al / gl, kvw = gl * d;
        for (int64_t j = 0; j < cp; ++j) {
          const KV kv = kv_block(L, Ly, mb, j, op);
          for (int64_t bi = 0; bi < B; ++bi)
            for (int64_t hh = 0; hh < al; ++hh) {
              const int64_t kh = hh / group;
              const double* dob = dctx.row(bi * sl) + hh * d;
              const double* pb = p.row((bi * al + hh) * sl) + j * sl;
              // dP = dO V^T (each from 0); dV += P^T dO, over the queries in order (heads of
              // a KV group one after another).
              const std::vector<double>& vt = block_t(kv.v + bi * sl * kv.stride + kh * d, kv.stride, sl, d);
              gemm_ld(dob, dctx.cols, vt.data(), sl, dp.row((bi * al + hh) * sl) + j * sl, dp.cols, sl, d, sl, false);
              gemm_tn_ld(pb, p.cols, dob, dctx.cols, dkv.row(j * B * sl + bi * sl) + kvw + kh * d, dkv.cols, sl, sl, d,
                         true);
            }
        }
        put(L, Ly, mb, Slot::dprobs, std::move(dp));
        put(L, Ly, mb, Slot::dkv_all, std::move(dkv));
        break;
      }
      case Fn::softmax_dropout_bwd: {
        const Mat& p = need(L, Ly, mb, Slot::probs, op, "the attention probabilities");
        Mat& dp = need(L, Ly, mb, Slot::dprobs, op, "the probabilities gradient (attention_values_bwd)");
        for (int64_t i = 0; i < p.rows; ++i) {
          const double* pi = p.row(i);
          double* di = dp.row(i);
          double s = 0;
          for (int64_t j = 0; j < p.cols; ++j) s += pi[j] * di[j];
          for (int64_t j = 0; j < p.cols; ++j) di[j] = pi[j] * (di[j] - s);
        }
        break;
      }
      case Fn::attention_scores_bwd: {
        const Mat& q = need(L, Ly, mb, Slot::q, op, "Q");
        const Mat& ds = need(L, Ly, mb, Slot::dprobs, op, "the scores gradient (softmax_dropout_bwd)");
        Mat& dkv = need(L, Ly, mb, Slot::dkv_all, op, "dV (attention_values_bwd)");
        Mat dq(B * sl, al * d);
        const int64_t group = al / gl;
        const double scale = 1.0 / std::sqrt(static_cast<double>(d));
        for (int64_t j = 0; j < cp; ++j) {
          const KV kv = kv_block(L, Ly, mb, j, op);
          for (int64_t bi = 0; bi < B; ++bi)
            for (int64_t hh = 0; hh < al; ++hh)
              for (int64_t tq = 0; tq < sl; ++tq) {
                const double* qr = q.row(bi * sl + tq) + hh * d;
                double* dqr = dq.row(bi * sl + tq) + hh * d;
                for (int64_t u = 0; u < sl; ++u) {
                  const double g = ds.at((bi * al + hh) * sl + tq, j * sl + u) * scale;
                  if (g == 0) continue;
                  const int64_t kh = hh / group;
                  const double* kr = kv.k + (bi * sl + u) * kv.stride + kh * d;
                  double* dkr = dkv.row(j * B * sl + bi * sl + u) + kh * d;
                  for (int64_t e = 0; e < d; ++e) {
                    dqr[e] += g * kr[e];
                    dkr[e] += g * qr[e];
                  }
                }
              }
        }
        put(L, Ly, mb, Slot::dq, std::move(dq));
        drop(L, Ly, mb, Slot::dprobs);
        attention_bwd_done(L, op);
        break;
      }
      case Fn::rope_bwd: {
        const auto pos = positions(L, B * sl, false);
        rope_apply(need(L, Ly, mb, Slot::dq, op, "dQ"), al, d, pos, true);
        rope_apply(need(L, Ly, mb, Slot::dk, op, "dK (after cp_dkv_reducescatter)"), gl, d, pos, true);
        break;
      }
      case Fn::qkv_dgrad: {
        expect(L, op, {Tag::d_qkv}, "dQ, dK, dV", true);
        const Mat& dq = need(L, Ly, mb, Slot::dq, op, "dQ");
        const Mat& dk = need(L, Ly, mb, Slot::dk, op, "dK at its owner (cp_dkv_reducescatter)");
        const Mat& dv = need(L, Ly, mb, Slot::dv, op, "dV at its owner (cp_dkv_reducescatter)");
        Mat dqkv = Mat::uninitialized(B * sl, (al + 2 * gl) * d);
        set_col_range(dqkv, 0, dq);
        set_col_range(dqkv, al * d, dk);
        set_col_range(dqkv, (al + gl) * d, dv);
        Mat dn = linear_nt(L, dqkv, LK::qkv_w, Ly, op);
        put(L, Ly, mb, Slot::dqkv, std::move(dqkv));
        set_chain(L, op, std::move(dn), Tag::dnorm1, true, false);
        break;
      }
      case Fn::qkv_wgrad: {
        const Mat& dqkv = need(L, Ly, mb, Slot::dqkv, op, "dQ, dK, dV (qkv_dgrad)");
        wgrad(L, LK::qkv_w, Ly, col_input(L, op, Slot::n1, Slot::re1, Ly), dqkv, op);
        if (M.bias) bias_grad(L, LK::qkv_b, Ly, dqkv, op);
        break;
      }
      case Fn::embedding_bwd: {
        const Reg& c = expect(L, op, {Tag::stream}, "the embedding output gradient", true);
        const int64_t rows = c.m.rows, rr = rows / nd;
        const int pw = lane_param(L, LK::word, -1, op), pps = M.learned_pos ? lane_param(L, LK::pos, -1, op) : -1;
        for (int64_t dd = 0; dd < nd; ++dd) {
          double* gw = lane_grad(L, pw, dd);
          for (int64_t row = dd * rr; row < (dd + 1) * rr; ++row) {
            const int64_t tok = batch->tokens[data_index(L, mb, row, rows)] - L.tp * Vt;
            if (tok >= 0 && tok < Vt) {
              const double* cr = c.m.row(row);
              for (int64_t j = 0; j < h; ++j) gw[tok * h + j] += cr[j];
            }
          }
          if (pps >= 0) {
            double* gp = lane_grad(L, pps, dd);
            for (int64_t row = dd * rr; row < (dd + 1) * rr; ++row) {
              const int64_t ps = pos_of(L, row, rows, false);
              const double* cr = c.m.row(row);
              for (int64_t j = 0; j < h; ++j) gp[ps * h + j] += cr[j];
            }
          }
        }
        note_write(L, pw, LK::word, -1);
        if (pps >= 0) note_write(L, pps, LK::pos, -1);
        break;
      }
      default:
        die(op, "is not a compute op");
    }
  }

  void attention_bwd_done(Lane& L, const Op& op) {
    const int Ly = op.layer, mb = op.micro_batch;
    if (cp > 1)
      compare_tokens(kCP, need(L, Ly, mb, Slot::dq, op, "dQ"), Probe::dq, Ly, L, mb, false, L.tp * al * d,
                     "dQ after attention backward", true);
    if (cp == 1) {
      const Mat& dkv = need(L, Ly, mb, Slot::dkv_all, op, "dK/dV");
      put(L, Ly, mb, Slot::dk, col_range(dkv, 0, gl * d));
      put(L, Ly, mb, Slot::dv, col_range(dkv, gl * d, 2 * gl * d));
    }
    set_chain(L, op, Mat(1, 1), Tag::d_qkv, false, false);
  }

  // ------------------------------------------------------------------ optimizer -------
  void optimizer(int st, const Op& op) {
    ref->wait_done();  // the reference gradient is final (streamed reference steps)
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
        std::vector<int64_t>& elems = t_opt.elems;  // this thread's scratch, reused
        std::vector<double>& g = t_opt.g;
        elems.clear();
        g.assign(sz(p.size()), 0.0);
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
        Vector& vals = t_opt.vals;
        Vector& grads = t_opt.grads;
        vals.clear();
        grads.clear();
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
        ++epoch[sz(st)];
      }
    }
    if (local) {  // the bug's "sync": parameters averaged over DP x CP after local steps
      for (const auto& g : stage_groups[sz(st)].at(GroupKind::DPxCP)) {
        const size_t np = ranks[sz(g.front())].params.size();
        for (size_t p = 0; p < np; ++p) {
          if (ranks[sz(g.front())].params[p].z3) continue;
          std::vector<Vector> in;
          for (int64_t r : g) in.push_back(vec(ranks[sz(r)].params[p].value.v));
          const auto out = refmath::all_reduce(in, refmath::ReduceOp::avg);
          for (size_t i = 0; i < g.size(); ++i) {
            set(ranks[sz(g[i])].params[p].value.v, out[i]);
            ++epoch[sz(st)];
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
    t_exec.stage = st;
    t_exec.idx = idx;
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
        for (int li : stage_lanes[sz(st)]) compute(lanes[sz(li)], fn, op);
    }
  }

  // ------------------------------------------------------------------ schedule --------
  /// The serial order of the ops: the stages round-robin, each running until it waits for
  /// a message it has not received or at an embedding-group collective its partner stage
  /// has not reached (the partner that arrives last executes it). Derived from the ops
  /// alone: whether a message is there depends only on how many were sent. ok == false:
  /// the plan deadlocks or has a send / embedding collective that cannot run; run_serial
  /// then reports it.
  struct Schedule {
    bool ok = false;
    std::vector<std::vector<int64_t>> seq;     // [stage][op] position in the serial order
    std::vector<std::vector<uint8_t>> runs;    // [stage][op] embed_grad: this stage executes it
    std::vector<std::vector<int>> rendezvous;  // [stage][op] embed_grad: index of the pair
    int pairs = 0;
  };
  Schedule sched;

  void build_schedule() {
    Schedule& S = sched;
    S.seq.assign(sz(pp), {});
    S.runs.assign(sz(pp), {});
    S.rendezvous.assign(sz(pp), {});
    for (int64_t st = 0; st < pp; ++st) {
      const size_t n = plan.stages[sz(st)].ops.size();
      S.seq[sz(st)].assign(n, -1);
      S.runs[sz(st)].assign(n, 0);
      S.rendezvous[sz(st)].assign(n, -1);
    }
    std::map<std::tuple<int64_t, int64_t, int>, int64_t> queued;  // (from, to, backward) -> messages
    std::vector<size_t> pc(sz(pp), 0);
    int64_t next = 0;
    while (true) {
      bool done = true, progress = false;
      for (int64_t st = 0; st < pp; ++st) {
        const auto& ops = plan.stages[sz(st)].ops;
        size_t& i = pc[sz(st)];
        while (i < ops.size()) {
          const Op& op = ops[i];
          const Fn fn = fns[sz(st)][i];
          const int dir = op.dir == Direction::forward ? 0 : 1;
          if (op.type == OpType::recv) {
            const int64_t from = op.peer_stage >= 0 ? op.peer_stage : st + (dir == 0 ? -1 : 1);
            auto it = queued.find({from, st, dir});
            if (it == queued.end() || it->second == 0) break;
            --it->second;
          } else if (fn == Fn::embed_grad) {
            if (st != 0 && st != pp - 1) return;
            const int64_t other = st == 0 ? pp - 1 : 0;
            if (other == st) return;
            const size_t j = pc[sz(other)];
            if (j >= plan.stages[sz(other)].ops.size() || fns[sz(other)][j] != Fn::embed_grad) break;
            S.runs[sz(st)][i] = 1;
            S.rendezvous[sz(st)][i] = S.rendezvous[sz(other)][j] = S.pairs++;
            S.seq[sz(st)][i] = next++;
            ++i;
            ++pc[sz(other)];
            progress = true;
            continue;
          } else if (fn == Fn::send) {
            const int64_t to = op.peer_stage >= 0 ? op.peer_stage : st + (dir == 0 ? 1 : -1);
            if (to < 0 || to >= pp) return;
            ++queued[{st, to, dir}];
          }
          S.seq[sz(st)][i] = next++;
          ++i;
          progress = true;
        }
        if (i < ops.size()) done = false;
      }
      if (done) break;
      if (!progress) return;
    }
    S.ok = true;
    sched_ops = next;
  }
  int64_t sched_ops = 0;  // ops in the serial order (compare_rank's keys follow them)

  // ------------------------------------------------------------------ drivers ---------
  /// The ops in the serial order on this thread; reports deadlocks.
  void run_serial() {
    std::vector<size_t> pc(sz(pp), 0);
    int64_t next = 0;
    auto enter = [&](int st) {
      t_exec.stage = st;
      t_exec.idx = pc[sz(st)];
      t_exec.key = next;
      t_exec.out = &outs[sz(st)];
    };
    while (true) {
      bool done = true, progress = false;
      for (int st = 0; st < static_cast<int>(pp); ++st) {
        const auto& ops = plan.stages[sz(st)].ops;
        while (pc[sz(st)] < ops.size()) {
          const Op& op = ops[pc[sz(st)]];
          if (op.type == OpType::recv && !recv_ready(st, op)) break;
          if (fns[sz(st)][pc[sz(st)]] == Fn::embed_grad) {  // a collective across two stages
            enter(st);
            if (st != 0 && st != pp - 1) die(op, "an embedding-group collective on a middle stage");
            const int other = st == 0 ? static_cast<int>(pp - 1) : 0;
            if (other == st) die(op, "an embedding-group collective with one pipeline stage");
            const auto& oops = plan.stages[sz(other)].ops;
            if (pc[sz(other)] >= oops.size() || fns[sz(other)][pc[sz(other)]] != Fn::embed_grad) break;
            embed_grad(op);
            ++next;
            ++pc[sz(st)];
            ++pc[sz(other)];
            progress = true;
            continue;
          }
          enter(st);
          exec(st, pc[sz(st)]);
          ++next;
          ++pc[sz(st)];
          progress = true;
        }
        if (pc[sz(st)] < ops.size()) done = false;
      }
      if (done) break;
      if (!progress) {
        t_exec = ExecCtx{};
        merge_outs();
        std::string waiting;
        for (int st = 0; st < static_cast<int>(pp); ++st)
          if (pc[sz(st)] < plan.stages[sz(st)].ops.size()) {
            t_exec.stage = st;
            t_exec.idx = pc[sz(st)];
            waiting += (waiting.empty() ? "" : "; ") + where(plan.stages[sz(st)].ops[pc[sz(st)]]);
          }
        problem("deadlock: every stage waits for a message: " + waiting);
        throw PlanFatal("deadlock");
      }
    }
  }

  // Stages on several threads. A thread claims a stage (busy), runs its ops until the next
  // one waits for a message or a rendezvous, and releases it; stages touch only their own
  // ranks and lanes, except P2P messages (mail_mu) and the embedding-group collective, which
  // the stage that runs it in the serial order executes once its partner has arrived (the
  // partner is parked at it meanwhile). Every op records with its serial position
  // (Schedule::seq) into its stage's StageOut, merged after the step. An exception in a
  // stage (a plan problem) stops every thread; the step's state is then unusable and the
  // verification is redone on one thread (Interpreter::rerun_serial).
  int threads = 1;
  std::vector<std::thread> workers;
  std::function<void(int)> job;         // what the workers run when job_gen is bumped
  std::atomic<uint32_t> job_gen{0};     // bumped to start the workers on a job
  std::atomic<int> job_left{0};         // workers still on the step
  bool quitting = false;
  std::vector<size_t> run_pc;           // [stage] next op
  std::unique_ptr<std::atomic<uint8_t>[]> stage_busy, stage_done;
  std::unique_ptr<std::atomic<uint32_t>[]> inbox, blocked_at;  // [stage] see run_stage
  std::unique_ptr<std::atomic<uint8_t>[]> arrived, delivered;  // [rendezvous]
  std::atomic<int64_t> stages_left{0};
  std::atomic<uint32_t> events{0};      // bumped whenever a stage moved on (wakes waiting threads)
  std::atomic<bool> aborted{false};
  bool parallel_failed = false;
  const RefState* after_src = nullptr;  // the reference's state after this step
  bool last_step = false;               // free each stage's data once compared
  std::vector<uint8_t> stage_finished;  // [stage] finish_stage done this step

  bool parallel() const { return threads > 1; }

  void start_workers() {
    int n = opt.threads > 0 ? opt.threads : static_cast<int>(std::thread::hardware_concurrency());
    n = static_cast<int>(std::min<int64_t>(std::max(n, 1), pp));
    if (!sched.ok || opt.inject == Injection::pp_microbatch_swap) n = 1;  // swap: the newest message depends on timing
    threads = n;
    if (threads <= 1) return;
    stage_busy = std::make_unique<std::atomic<uint8_t>[]>(sz(pp));
    inbox = std::make_unique<std::atomic<uint32_t>[]>(sz(pp));
    blocked_at = std::make_unique<std::atomic<uint32_t>[]>(sz(pp));
    stage_done = std::make_unique<std::atomic<uint8_t>[]>(sz(pp));
    arrived = std::make_unique<std::atomic<uint8_t>[]>(sz(std::max(sched.pairs, 1)));
    delivered = std::make_unique<std::atomic<uint8_t>[]>(sz(std::max(sched.pairs, 1)));
    try {
      for (int w = 1; w < threads; ++w)
        workers.emplace_back([this, w] {
          uint32_t seen = 0;
          while (true) {
            job_gen.wait(seen);
            seen = job_gen.load();
            if (quitting) return;
            job(w);
            if (job_left.fetch_sub(1) == 1) job_left.notify_all();
          }
        });
    } catch (const std::system_error&) {  // no more threads: run on those started
      threads = static_cast<int>(workers.size()) + 1;
    }
  }
  /// Runs f(w) on every thread w (0: this one) and waits for all.
  void run_on_all(std::function<void(int)> f) {
    job = std::move(f);
    job_left.store(threads - 1);
    job_gen.fetch_add(1);
    job_gen.notify_all();
    job(0);
    for (int n = job_left.load(); n != 0; n = job_left.load()) job_left.wait(n);
  }
  /// Frees thread w's share of the stages' ranks, lanes and frames, then this thread's
  /// recycled storage: the interpreter's destruction on every thread.
  void free_stages(int w) {
    for (int64_t st = static_cast<int64_t>(w) * pp / threads; st < (static_cast<int64_t>(w) + 1) * pp / threads; ++st) {
      pending[sz(st)].clear();
      free_stage(st);
    }
    if (w > 0) pool_release();
  }
  void stop_workers() {
    if (workers.empty()) return;
    run_on_all([this](int w) { free_stages(w); });
    quitting = true;
    job_gen.fetch_add(1);
    job_gen.notify_all();
    for (auto& w : workers) w.join();
    workers.clear();
  }

  /// Runs the step's ops on `threads` threads; false when a stage failed.
  bool run_parallel() {
    run_pc.assign(sz(pp), 0);
    stage_finished.assign(sz(pp), 0);
    for (int64_t st = 0; st < pp; ++st) {
      inbox[sz(st)].store(0);
      blocked_at[sz(st)].store(std::numeric_limits<uint32_t>::max());
      stage_busy[sz(st)].store(0);
      stage_done[sz(st)].store(plan.stages[sz(st)].ops.empty() ? 1 : 0);
    }
    int64_t left = 0;
    for (int64_t st = 0; st < pp; ++st) left += stage_done[sz(st)].load() ? 0 : 1;
    for (int k = 0; k < sched.pairs; ++k) {
      arrived[sz(k)].store(0);
      delivered[sz(k)].store(0);
    }
    stages_left.store(left);
    aborted.store(false);
    run_on_all([this](int w) { work(w); });
    t_exec = ExecCtx{};
    if (aborted.load()) {
      parallel_failed = true;
      return false;
    }
    try {
      for (int64_t st = 0; st < pp; ++st)
        if (!stage_finished[sz(st)]) finish_stage(static_cast<int>(st));  // stages without ops
    } catch (...) {
      parallel_failed = true;
      return false;
    }
    return true;
  }

  void wake() {
    events.fetch_add(1, std::memory_order_release);
    events.notify_all();
  }

  /// One thread's share: claim any stage that is not busy or done (starting from this
  /// thread's part of the pipeline), run it as far as it goes, repeat; sleep when no stage
  /// moved on.
  void work(int w) {
    const int64_t first = static_cast<int64_t>(w) * pp / threads;
    try {
      while (stages_left.load() > 0 && !aborted.load()) {
        const uint32_t ev = events.load(std::memory_order_acquire);
        bool moved = false;
        for (int64_t k = 0; k < pp && !aborted.load(std::memory_order_relaxed); ++k) {
          const int64_t st = (first + k) % pp;
          if (stage_done[sz(st)].load(std::memory_order_acquire)) continue;
          if (blocked_at[sz(st)].load(std::memory_order_relaxed) == inbox[sz(st)].load(std::memory_order_acquire))
            continue;  // still waiting: nothing arrived since it stopped
          uint8_t idle = 0;
          if (!stage_busy[sz(st)].compare_exchange_strong(idle, 1, std::memory_order_acquire)) continue;
          const size_t before = run_pc[sz(st)];
          bool signalled = false;
          run_stage(static_cast<int>(st), signalled);
          const bool finished = run_pc[sz(st)] == plan.stages[sz(st)].ops.size();
          const bool progressed = run_pc[sz(st)] != before;
          if (finished) finish_stage(static_cast<int>(st));
          if (finished) stage_done[sz(st)].store(1, std::memory_order_release);
          stage_busy[sz(st)].store(0, std::memory_order_release);
          if (finished) stages_left.fetch_sub(1);
          if (progressed || signalled) {
            moved = true;
            wake();
          }
        }
        if (!moved && stages_left.load() > 0) events.wait(ev, std::memory_order_acquire);
      }
    } catch (...) {
      aborted.store(true);
      wake();
    }
    t_exec = ExecCtx{};
    if (last_step && w > 0) pool_release();  // this thread's recycled storage: no further use
  }

  /// Runs stage st's ops until one must wait. `signalled`: it arrived at a rendezvous.
  void run_stage(int st, bool& signalled) {
    const auto& ops = plan.stages[sz(st)].ops;
    size_t i = run_pc[sz(st)];  // a local copy: run_pc is shared with the other threads' stages
    struct Save {
      size_t& to;
      const size_t& from;
      ~Save() { to = from; }
    } save{run_pc[sz(st)], i};
    // Waiting: the stage's inbox count read before the check that failed (work() skips the
    // stage until something arrives for it).
    auto blocked = [&](uint32_t seen) { blocked_at[sz(st)].store(seen, std::memory_order_relaxed); };
    while (i < ops.size()) {
      const Op& op = ops[i];
      if (op.type == OpType::recv) {
        const uint32_t seen = inbox[sz(st)].load(std::memory_order_acquire);
        if (!recv_ready(st, op)) return blocked(seen);
      }
      if (fns[sz(st)][i] == Fn::embed_grad) {
        const size_t k = sz(sched.rendezvous[sz(st)][i]);
        const int64_t other = st == 0 ? pp - 1 : 0;
        const uint32_t seen = inbox[sz(st)].load(std::memory_order_acquire);
        if (sched.runs[sz(st)][i]) {
          if (!arrived[k].load(std::memory_order_acquire)) return blocked(seen);
          t_exec = ExecCtx{st, i, sched.seq[sz(st)][i], &outs[sz(st)]};
          embed_grad(op);
          delivered[k].store(1, std::memory_order_release);
          post(other);
        } else {
          if (!arrived[k].load(std::memory_order_relaxed)) {
            arrived[k].store(1, std::memory_order_release);
            post(other);
            signalled = true;
          }
          if (!delivered[k].load(std::memory_order_acquire)) return blocked(seen);
        }
        ++i;
        continue;
      }
      t_exec = ExecCtx{st, i, sched.seq[sz(st)][i], &outs[sz(st)]};
      exec(st, i);
      ++i;
      if (op.type == OpType::send) {  // the receiving stage may go on now
        post(op.peer_stage >= 0 ? op.peer_stage : st + (op.dir == Direction::forward ? 1 : -1));
        wake();
      }
    }
  }
  /// Something arrived for stage st (a message, a rendezvous partner or its result).
  void post(int64_t st) {
    if (st >= 0 && st < pp) inbox[sz(st)].fetch_add(1, std::memory_order_release);
  }

  void run_step(int s, const Batch& bt, const RefStep* rf, const RefState& after, bool last) {
    step = s;
    batch = &bt;
    ref = rf;
    after_src = &after;
    last_step = last;
    reduced_mb.assign(sz(pp), {});
    reduced_step.assign(sz(pp), {});
    for (int64_t st = 0; st < pp; ++st) {
      const size_t np = ranks[sz(stage_ranks[sz(st)].front())].params.size();
      reduced_mb[sz(st)].assign(np, std::vector<uint8_t>(sz(m_count), 0));
      reduced_step[sz(st)].assign(np, 0);
      pending[sz(st)].clear();
    }
    mail.clear();
    for (auto& L : lanes) {
      for (Frame*& f : L.frames)
        if (f != nullptr) {
          f->reset();
          frame_free[sz(L.stage)].push_back(f);
          f = nullptr;
        }
      std::fill(L.ce_stage.begin(), L.ce_stage.end(), 0);
      for (auto& c : L.cur) c = Reg{};
    }
    for (auto& R : ranks) {
      R.loss_scaled = 0;
      for (auto& p : R.params) {
        std::fill(p.grad.v.begin(), p.grad.v.end(), 0.0);
        p.total.assign(sz(p.size()), 0.0);
        p.synced.assign(sz(p.size()), 0.0);
        p.has_synced.assign(sz(p.size()), 0);
        if (dpcp == 1) p.owned.assign(sz(p.size()), 1);  // else: kept from the last ReduceScatter
      }
    }
    if (parallel()) {
      if (!run_parallel()) return;  // a stage failed: Interpreter::run_step falls back to one thread
    } else {
      try {
        run_serial();
      } catch (...) {
        t_exec = ExecCtx{};
        merge_outs();
        throw;
      }
    }
    t_exec = ExecCtx{};
    merge_outs();
    for (int64_t st = 0; st < pp; ++st)
      if (!pending[sz(st)].empty())
        problem(fmt::format("stage {}: {} issued collective(s) never waited for", st, pending[sz(st)].size()));
    for (const auto& [k, q] : mail)
      if (!q.empty())
        problem(fmt::format("stage {} -> {}: {} P2P message(s) never received", lanes[sz(std::get<0>(k))].stage,
                            lanes[sz(std::get<1>(k))].stage, q.size()));
    // Loss: each last-stage rank of TP rank 0 holds sum(l) x |DPxCP| / N of its tokens.
    double loss = 0;
    for (int64_t r : stage_ranks[sz(pp - 1)])
      if (ranks[sz(r)].c.tp == 0) loss += ranks[sz(r)].loss_scaled;
    loss /= static_cast<double>(dpcp);
    ref->wait_done();
    const double e = abs_err(loss, ref->loss);
    record(kLoss, e, [&] { return fmt::format("global loss at step {}: {} vs {}", step, loss, ref->loss); });
    if (!parallel()) {  // run_parallel compared each stage when it finished
      const auto state = after();
      compare_state(s, *state.first, *state.second);
    }
  }

  /// Rank R's parameters and Adam moments after step s against the reference's.
  void compare_rank(const RankState& R, int s, const std::vector<double>& ref_params,
                    const refmath::AdamState& ref_adam) {
    for (const auto& p : R.params) {
      // The parameter's largest error first; element by element only when it may set the
      // worst value (record's rule), else the count alone.
      double mx = 0;
      int64_t fresh = 0;
      for (int64_t e = 0; e < p.size(); ++e)
        if (p.fresh[sz(e)]) {
          mx = std::max(mx, abs_err(p.value.v[sz(e)], ref_params[sz(p.gidx[sz(e)])]));
          ++fresh;
        }
      Acc& a = cur_acc(kZeRO);
      if (!a.worst.empty() && mx <= a.max_err) {
        a.n += fresh;
      } else {
        for (int64_t e = 0; e < p.size(); ++e) {
          if (!p.fresh[sz(e)]) continue;  // not this step's value yet (gathered before its next use)
          const double want = ref_params[sz(p.gidx[sz(e)])];
          record(kZeRO, abs_err(p.value.v[sz(e)], want), [&] {
            return fmt::format("parameter {} (layer {}) element {} after step {} on {}: {} vs {}", lk_name(p.kind),
                               p.layer, e, s, rank_str(R), p.value.v[sz(e)], want);
          });
        }
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
  /// Every rank, in rank order, into the totals.
  void compare_state(int s, const std::vector<double>& ref_params, const refmath::AdamState& ref_adam) {
    t_exec = ExecCtx{};
    for (const auto& R : ranks) compare_rank(R, s, ref_params, ref_adam);
  }
  /// Stage st is done with the step (run_parallel): its ranks' comparison (recorded with
  /// keys after every op of the step, in rank order, as compare_state would), then, after
  /// the last step, its tensors and parameters are freed on this thread.
  void finish_stage(int st) {
    const auto state = (*after_src)();
    for (int64_t r : stage_ranks[sz(st)]) {
      t_exec = ExecCtx{st, 0, sched_ops + r, &outs[sz(st)]};
      compare_rank(ranks[sz(r)], step, *state.first, *state.second);
    }
    t_exec = ExecCtx{};
    if (last_step) free_stage(st);
    stage_finished[sz(st)] = 1;
  }
  /// The stage's frames, working gradients and parameters (after the last step).
  void free_stage(int64_t st) {
    for (int li : stage_lanes[sz(st)]) {
      Lane& L = lanes[sz(li)];
      for (Frame*& f : L.frames) f = nullptr;
      for (auto& c : L.cur) c = Reg{};
      std::vector<double>().swap(L.grads);
    }
    std::deque<Frame>().swap(frame_store[sz(st)]);
    std::vector<Frame*>().swap(frame_free[sz(st)]);
    for (int64_t r : stage_ranks[sz(st)]) {
      std::vector<LocalParam>().swap(ranks[sz(r)].params);
      ranks[sz(r)].materialized_layers.clear();
    }
  }
};

// ======================================================================================
Interpreter::Interpreter(const TinyModel& model, const StepPlan& plan, const VerifyOptions& opts)
    : impl_(std::make_unique<Impl>(model, plan, opts)) {}
Interpreter::~Interpreter() = default;

void Interpreter::load_params(const std::vector<double>& global) { impl_->load_params(global); }

void Interpreter::run_step(int step, const Batch& batch, const RefStep& ref, const RefState& after, bool last) {
  if (!runnable()) return;
  try {
    impl_->run_step(step, batch, &ref, after, last);
  } catch (const PlanFatal&) {
    impl_->fatal = true;
  }
}

bool Interpreter::runnable() const { return !impl_->fatal && !impl_->parallel_failed; }

bool Interpreter::rerun_serial() const { return impl_->parallel_failed; }

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
