#pragma once
// Internal to models/verify/: the state of the StepPlan interpreter (Interpreter::Impl) and
// the types it shares between its files. The design is described at the top of
// models/verify/interpreter.cpp; the op semantics live one block family per file
// (ops_embedding, ops_norm, ops_attention, ops_mlp, ops_head), the collectives and P2P in
// ops_collectives.cpp, the kernels the blocks share in ops_common.cpp, the optimizer in
// optimizer.cpp, comparisons with the reference in compare.cpp, and the serial order,
// rendezvous and threads in schedule.cpp.
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

// Everything here is internal to the interpreter's files.
namespace interp {

using refmath::Vector;

// Bytes per element the plan sizes its transfers with (models/plan.cpp): bf16 activations
// and parameters (its kAct = 2), fp32 per-token statistics of the vocab-parallel cross
// entropy (4 x tokens); gradients use PlanShape::grad_bytes_per_param.
constexpr double kActBytes = 2.0;
constexpr double kLossStatBytes = 4.0;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

inline size_t sz(int64_t x) { return static_cast<size_t>(x); }

/// refmath works on std::vector<double>; Mat storage is pooled (models/verify/tensor.hpp).
inline Vector vec(const Doubles& d) { return Vector(d.begin(), d.end()); }
inline void set(Doubles& dst, const Vector& src) { dst.assign(src.begin(), src.end()); }

/// A problem that stops execution (the plan cannot be interpreted further).
struct PlanFatal : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ------------------------------------------------------------------ local parameters --
/// A rank's local parameter tensors (TP shards in Megatron's layout).
enum class LK { word, pos, ln1_w, ln1_b, qkv_w, qkv_b, out_w, out_b, ln2_w, ln2_b, up_w, up_b, gate_w, down_w,
                down_b, final_w, final_b, head_w,
                // MoE layers: the router (h x E) and this rank's E / ep local experts, each a
                // 1 / etp column shard: up / gate (E/ep h) x (fe/etp), down (E/ep fe/etp) x h
                // (models/verify/ops_moe.cpp). A MoE layer's shared expert is its up_w / gate_w /
                // down_w (shared_* ops run as the mlp_* ones).
                router_w, eup_w, egate_w, edown_w,
                // Multi-head latent attention layers (models/verify/ops_mla.cpp), in place of
                // qkv_w: the replicated down projections and latent norms (q_down_w h x dq,
                // q_norm_w 1 x dq, kv_down_w h x (dc + dr), kv_norm_w 1 x dc) and this rank's
                // heads of the column-parallel up projections (q_up_w q_in x al hd, kv_up_w
                // dc x al (dn + dv)); out_proj is out_w.
                q_down_w, q_norm_w, q_up_w, kv_down_w, kv_norm_w, kv_up_w };

inline const char* lk_name(LK k) {
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
    case LK::router_w: return "moe.router.weight";
    case LK::eup_w: return "moe.experts.up.weight";
    case LK::egate_w: return "moe.experts.gate.weight";
    case LK::edown_w: return "moe.experts.down.weight";
    case LK::q_down_w: return "mla.q_down.weight";
    case LK::q_norm_w: return "mla.q_norm.weight";
    case LK::q_up_w: return "mla.q_up.weight";
    case LK::kv_down_w: return "mla.kv_down.weight";
    case LK::kv_norm_w: return "mla.kv_norm.weight";
    case LK::kv_up_w: return "mla.kv_up.weight";
  }
  return "?";
}

/// MLA's parameters replicated over TP (the down projections and the latent norms,
/// models/verify/ops_mla.cpp): with sequence parallelism TP partial sums like the norms.
inline bool mla_replicated(LK k) {
  return k == LK::q_down_w || k == LK::q_norm_w || k == LK::kv_down_w || k == LK::kv_norm_w;
}
/// Replicated over TP but computed on sequence shards with sequence parallelism: their
/// gradients are TP partial sums (Megatron all-reduces them over TP:
/// megatron/core/distributed/finalize_model_grads.py, _allreduce_layernorm_grads).
inline bool sp_partial_grad(LK k) {
  return k == LK::ln1_w || k == LK::ln1_b || k == LK::ln2_w || k == LK::ln2_b || k == LK::final_w ||
         k == LK::final_b || k == LK::out_b || k == LK::down_b || k == LK::router_w || mla_replicated(k);
}
/// Routed-expert parameters: replicated over the expert-data-parallel group (GroupKind::EDP),
/// reduced there, not over DPxCP.
inline bool expert_param(LK k) { return k == LK::eup_w || k == LK::egate_w || k == LK::edown_w; }

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
                 dlogits, dnormf, dnorm1, dnorm2, d_attn_out, d_mlp_out, d_ctx, d_act, d_col_mlp, d_qkv,
                 // MoE layer with a shared expert: the shared expert's output (the MoE output
                 // once the routed output is added) and its input gradient (d norm2 once the
                 // routed experts' and the router's are added). Not compared by themselves.
                 shared_out, d_shared,
                 // MLA (models/verify/ops_mla.cpp): the latents [q_in | kv latent | k^R] that
                 // the up projections read, and their gradient (reduced over TP by the chain).
                 latent, d_latent };

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
                            dq, dkv_all, dk, dv, dprobs, du, dg, d_mlp, dqkv,
                            moe_out, moe_dx,  // MoE: routed output / input gradient waiting for the shared expert's
                            // MLA (models/verify/ops_mla.cpp): q_down / kv_down outputs, the
                            // latent norms' outputs, the latents on the down projections' tokens,
                            // gathered and re-gathered, and their gradients.
                            mla_ql, mla_kvd, mla_qn, mla_kvn, mla_lat, mla_lat_all, mla_re_lat, mla_dq, mla_dkv,
                            mla_dlat, mla_dql, mla_dkvd };

constexpr int kSlots = static_cast<int>(Slot::mla_dkvd) + 1;
constexpr int kLKs = static_cast<int>(LK::kv_up_w) + 1;

/// One rank's tensors of one MoE layer and micro-batch (models/verify/ops_moe.cpp). Copies are
/// (token, k-slot) pairs; rows of the matrices below follow the list beside them.
struct MoeCopy {
  int64_t src = 0;    // rank the token lives on
  int64_t index = 0;  // position in its rank's permuted list
  int64_t expert = 0;
};
struct MoeFrame {
  Mat x;                         // T x h: the MoE input rows of this rank
  Mat logits;                    // T x E
  std::vector<int64_t> sel;      // T x k
  std::vector<double> prob;      // T x k
  std::vector<int64_t> perm;     // permuted order: copy t k + i at position j (sorted by expert)
  Mat px;                        // permuted token rows
  std::vector<MoeCopy> recv;     // copies this rank's local experts received (dispatch)
  Mat rx;
  std::vector<MoeCopy> gath;     // after the ETP AllGather: the ETP group's received copies
  std::vector<int64_t> gath_owner;  // position in the ETP group of the rank that received it
  Mat gx, u, g, act, y;          // expert inputs, fc1 halves, SwiGLU output, (partial) outputs
  Mat ry;                        // the received copies' outputs (after the ETP ReduceScatter)
  Mat py;                        // permuted outputs back on the token's rank (combine)
  // backward
  Mat pdy;                       // permuted output gradients (unpermute_bwd)
  std::vector<double> dprob;     // T x k
  Mat rdy, gdy, da, du, dg, gdx, rdx, pdx;
  Mat dz;                        // T x E
  Mat dx;                        // T x h
};

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
  std::array<NormCache*, 5> norm{};  // input_norm, post_attention_norm, final_norm, MLA's q_norm, kv_norm (null: none)
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
inline int norm_ix(Slot s) {
  switch (s) {
    case Slot::n1: return 0;
    case Slot::n2: return 1;
    case Slot::mla_qn: return 3;
    case Slot::mla_kvn: return 4;
    default: return 2;
  }
}

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
  // [mb] the embedding's output gradient (the backward chain after the first layer's B),
  // kept when another micro-batch's backward moves the chain on before embedding_bwd (a
  // deferred W: Impl::keep_embedding_grads), and whether embedding_bwd ran.
  std::vector<Reg> emb_stash;
  std::vector<uint8_t> emb_done;
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
  // MoE (models/verify/ops_moe.cpp)
  router, router_topk, moe_permute, expert_up, expert_gate, expert_swiglu, expert_down, moe_unpermute,
  moe_unpermute_bwd, expert_down_dgrad, expert_down_wgrad, expert_swiglu_bwd, expert_up_dgrad, expert_up_wgrad,
  moe_permute_bwd, router_topk_bwd, router_dgrad, router_wgrad, moe_comm,
  // MLA (models/verify/ops_mla.cpp; q_up also stands for q_proj when q_lora_rank = 0)
  q_down, q_norm, kv_down, kv_norm, q_up, kv_up, q_up_dgrad, kv_up_dgrad, q_up_wgrad, kv_up_wgrad, kv_norm_bwd,
  kv_down_dgrad, q_norm_bwd, q_down_dgrad, kv_down_wgrad, q_down_wgrad,
  // collectives
  chain, ce_reduce, regather, cp_kv, cp_dkv, dp_grad, dp_param_gather, sp_grad_allreduce, embed_grad, mirror_grad,
  // p2p and waits
  send, recv, wait,
  // a precision recipe's casts (models/precision.hpp)
  cast,
};

inline const std::unordered_map<std::string_view, Fn>& fn_table() {
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
      // A precision recipe's casts (models/blocks/block_context.hpp quantize, plan.cpp
      // weight_quantize): they round values, which exact arithmetic does not model; the
      // verifier checks the parallel decomposition, so a cast is the identity here.
      {"quantize", Fn::cast}, {"quantize_grad", Fn::cast}, {"weight_quantize", Fn::cast},
      // FSDP2's copies around its collectives (models/zero3.hpp): data moves, values do not.
      {"fsdp_param_copy_out", Fn::cast}, {"fsdp_grad_copy_in", Fn::cast},
      {"tp_allreduce", Fn::chain}, {"tp_reducescatter", Fn::chain}, {"tp_allgather", Fn::chain},
      {"pp_tp_allgather", Fn::chain}, {"tp_allreduce_loss", Fn::ce_reduce}, {"tp_allreduce_loss_max", Fn::ce_reduce},
      {"tp_allgather_input", Fn::regather}, {"cp_kv_allgather", Fn::cp_kv},
      {"cp_dkv_reducescatter", Fn::cp_dkv}, {"dp_grad_allreduce", Fn::dp_grad},
      {"dp_grad_reducescatter", Fn::dp_grad}, {"dp_param_allgather", Fn::dp_param_gather},
      // The TP AllReduce of sequence-parallel replicated gradients (models/plan.cpp adopted it
      // from the verifier's report).
      {"tp_sp_grad_allreduce", Fn::sp_grad_allreduce},
      // MoE (models/blocks/moe.hpp): routed experts' gradients / parameters over EDP, the
      // shared expert as an MLP, the token AllToAlls and ETP collectives (Fn::moe_comm).
      {"edp_grad_allreduce", Fn::dp_grad}, {"edp_grad_reducescatter", Fn::dp_grad},
      {"edp_param_allgather", Fn::dp_param_gather},
      {"router", Fn::router}, {"router_topk", Fn::router_topk}, {"moe_permute", Fn::moe_permute},
      {"expert_up", Fn::expert_up}, {"expert_gate", Fn::expert_gate}, {"expert_swiglu", Fn::expert_swiglu},
      {"expert_down", Fn::expert_down}, {"moe_unpermute", Fn::moe_unpermute},
      {"moe_unpermute_bwd", Fn::moe_unpermute_bwd}, {"expert_down_dgrad", Fn::expert_down_dgrad},
      {"expert_down_wgrad", Fn::expert_down_wgrad}, {"expert_swiglu_bwd", Fn::expert_swiglu_bwd},
      {"expert_up_dgrad", Fn::expert_up_dgrad}, {"expert_up_wgrad", Fn::expert_up_wgrad},
      {"moe_permute_bwd", Fn::moe_permute_bwd}, {"router_topk_bwd", Fn::router_topk_bwd},
      {"router_dgrad", Fn::router_dgrad}, {"router_wgrad", Fn::router_wgrad},
      {"moe_dispatch", Fn::moe_comm}, {"moe_etp_allgather", Fn::moe_comm}, {"moe_etp_reducescatter", Fn::moe_comm},
      {"moe_combine", Fn::moe_comm}, {"moe_combine_bwd", Fn::moe_comm}, {"moe_etp_allgather_bwd", Fn::moe_comm},
      {"moe_etp_reducescatter_bwd", Fn::moe_comm}, {"moe_dispatch_bwd", Fn::moe_comm},
      {"shared_up", Fn::mlp_up}, {"shared_gate", Fn::mlp_gate}, {"shared_swiglu", Fn::swiglu},
      {"shared_down", Fn::mlp_down}, {"shared_down_dgrad", Fn::mlp_down_dgrad},
      {"shared_down_wgrad", Fn::mlp_down_wgrad}, {"shared_swiglu_bwd", Fn::swiglu_bwd},
      {"shared_up_dgrad", Fn::mlp_up_dgrad}, {"shared_up_wgrad", Fn::mlp_up_wgrad},
      // MLA (models/blocks/mla.hpp): its ops, and the SP AllGather of the latents (the chain).
      {"q_down", Fn::q_down}, {"q_norm", Fn::q_norm}, {"kv_down", Fn::kv_down}, {"kv_norm", Fn::kv_norm},
      {"q_up", Fn::q_up}, {"q_proj", Fn::q_up}, {"kv_up", Fn::kv_up}, {"q_up_dgrad", Fn::q_up_dgrad},
      {"q_proj_dgrad", Fn::q_up_dgrad}, {"kv_up_dgrad", Fn::kv_up_dgrad}, {"q_up_wgrad", Fn::q_up_wgrad},
      {"q_proj_wgrad", Fn::q_up_wgrad}, {"kv_up_wgrad", Fn::kv_up_wgrad}, {"kv_norm_bwd", Fn::kv_norm_bwd},
      {"kv_down_dgrad", Fn::kv_down_dgrad}, {"q_norm_bwd", Fn::q_norm_bwd}, {"q_down_dgrad", Fn::q_down_dgrad},
      {"kv_down_wgrad", Fn::kv_down_wgrad}, {"q_down_wgrad", Fn::q_down_wgrad},
      {"tp_allgather_latent", Fn::chain},
      {"embedding_grad_allreduce", Fn::embed_grad},
      // DualPipe: the two copies of a layer held by pipeline ranks r and pp - 1 - r.
      {"dualpipe_grad_allreduce", Fn::mirror_grad},
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
inline thread_local ExecCtx t_exec;

/// Scratch vectors of Impl::optimizer, one set per thread.
struct OptScratch {
  std::vector<int64_t> elems;
  std::vector<double> g, vals, grads;
};
inline thread_local OptScratch t_opt;

inline double abs_err(double a, double b) {
  const double e = std::fabs(a - b);
  return std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
}

inline int phase_ix(Phase p) {
  switch (p) {
    case Phase::forward: return 0;
    case Phase::recompute: return 1;
    case Phase::backward: return 2;
    case Phase::optimizer: return 2;
  }
  return 0;
}

}  // namespace interp
using namespace interp;

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
  int kept_from = 0;  // ZeRO-3 layers from here on stay gathered into their backward (models/zero3.hpp)
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
  // Deferred weight gradients (zero-bubble W, build_w_table): [stage][op] on a backward op
  // that frees its (layer, micro-batch)'s tensors (input_norm_bwd, final_norm_bwd), 1 when
  // a W op of the same (layer, micro-batch) follows it, so the tensors W reads are kept;
  // on that W op, 1 when it is the last one and frees them.
  std::vector<std::vector<uint8_t>> w_defer, w_release;
  std::vector<uint8_t> has_embedding_bwd;  // [stage] its ops include embedding_bwd
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

  Impl(const TinyModel& model, const StepPlan& p, const VerifyOptions& o);
  ~Impl() { stop_workers(); }

  // ------------------------------------------------------------------ problems --------
  std::string where(const Op& op) const {
    return fmt::format("stage {} op #{} '{}' ({}{}{})", t_exec.stage, t_exec.idx, op.name, to_string(op.phase),
                       op.layer >= 0 ? fmt::format(", layer {}", op.layer) : std::string(),
                       op.micro_batch >= 0 ? fmt::format(", micro-batch {}", op.micro_batch) : std::string());
  }
  void problem(const std::string& p);
  void problem(const Op& op, const std::string& what) { problem(where(op) + ": " + what); }
  [[noreturn]] void die(const Op& op, const std::string& what) {
    problem(op, what);
    throw PlanFatal(what);
  }
  void note(const std::string& n);
  /// Moves the stages' records of the step into the totals, as if they had been recorded
  /// one op after another in the serial order: a rule's worst value is the first (in that
  /// order) of those with the largest error; problems and notes keep their first occurrence.
  void merge_outs();
  void check_size(const Op& op, double expect_bytes, const char* what) {
    if (std::fabs(op.size_bytes - expect_bytes) > 0.5)
      problem(op, fmt::format("size_bytes {} but {} is {} bytes", op.size_bytes, what, expect_bytes));
  }

  // ------------------------------------------------------------------ setup -----------
  void add_param(RankState& R, LK k, int layer, int64_t rows, int64_t cols, bool tp_sharded,
                 const std::function<int64_t(int64_t, int64_t)>& gmap);

  void build_params(RankState& R);
  /// True when stage st's ops include one of `fs`.
  bool stage_has(int st, std::initializer_list<Fn> fs) const {
    for (Fn f : fns[sz(st)])
      if (std::find(fs.begin(), fs.end(), f) != fs.end()) return true;
    return false;
  }

  void build_ranks();

  /// Lanes: the ranks of a stage by (TP, CP) coordinate, their replicas by DP coordinate;
  /// TP and CP groups of lanes in the rank grid's group order; frame slots per stage.
  void build_lanes();

  void resolve_ops();
  void build_w_table();
  void build_chunk_stages();

  void load_params(const std::vector<double>& global);

  void free_param(const RankState& R, LocalParam& p);

  // ------------------------------------------------------------------ access ----------
  RankState& rep(const Lane& L, int64_t dd) { return ranks[sz(L.reps[sz(dd)])]; }
  const RankState& rep(const Lane& L, int64_t dd) const { return ranks[sz(L.reps[sz(dd)])]; }

  Frame* frame(Lane& L, int layer, int mb, bool create);
  void release_frame(Lane& L, int layer, int mb);
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
  void drop(Lane& L, int layer, int mb, Slot s);
  void drop_layer(Lane& L, int layer, int mb, bool keep_input);
  /// At the end of a (layer, micro-batch)'s B whose W is deferred: frees what only B needed,
  /// keeps what the weight-gradient ops read (norm outputs and their re-gathers, the
  /// attention output, the MLP activation, the output gradients of the GEMMs).
  void keep_for_w(Lane& L, int layer, int mb);
  /// drop_layer(L, layer, mb, false), or keep_for_w when the op being run frees a
  /// (layer, micro-batch) whose W follows (w_defer).
  void end_backward(Lane& L, int layer, int mb);
  NormCache& put_norm(Lane& L, int layer, int mb, Slot s, NormCache c) {
    Frame& f = *frame(L, layer, mb, true);
    return f.norm_slot(norm_ix(s)) = std::move(c);
  }
  const NormCache* find_norm(Lane& L, int layer, int mb, Slot s) {
    Frame* f = frame(L, layer, mb, false);
    return f == nullptr ? nullptr : f->norm[sz(norm_ix(s))];
  }

  LocalParam& P(RankState& R, LK k, int layer, const Op& op);
  int pindex(const RankState& R, LK k, int layer) const {
    const size_t ix = sz((layer + 1) * kLKs + static_cast<int>(k));
    return ix < R.index.size() ? R.index[ix] : -1;
  }
  /// The LM head's weight on `stage`: its own (untied), Megatron's copy of the word embedding
  /// (tied, on a stage without the embedding), or the embedding itself (tied, on a stage that
  /// holds both: pp == 1, or the first and last rank under DualPipe / DualPipeV).
  LK head_kind(int stage) const {
    return (!M.tied || (pp > 1 && !stage_has(stage, {Fn::embedding}))) ? LK::head_w : LK::word;
  }

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
  void note_write(Lane& L, int pi, LK k, int layer);

  /// The parameter gradients an op writes, by its identity. A layer's two
  /// dropout_residual_bwd ops are the MLP branch (first) and the attention branch (second),
  /// the reverse of the forward order.
  std::vector<LK> static_writes(Fn fn, int ordinal, int stage) const;

  void build_write_table();

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
  double loss_scale(const RankState& R, int mb) const;

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
                      int64_t col0, const char* when, bool grad = false);

  bool probe_of(const Reg& r, bool backward, Probe& p, int& layer) const;

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

  void pp_probe(Lane& L, Reg& reg, bool backward);

  // ------------------------------------------------------------------ collectives -----
  refmath::ReduceOp rop(const Op& op);

  /// The reduction of an activation collective, for reduce_buffers (the arithmetic of
  /// refmath::all_reduce / reduce_scatter, without their copies).
  Reduce red(const Op& op);
  /// Concatenation of the buffers, in order (the result of refmath::all_gather).
  static Doubles concat(const std::vector<const Doubles*>& parts);

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
  void chain_collective(int st, const Op& op);

  /// A TP group's result of chain_collective, delivered to the lanes' chains at the wait.
  struct ChainPart {
    const std::vector<int>* g;  // the lanes (Impl::lane_groups, stable)
    std::vector<Reg> vals;      // their results
  };
  /// Hands each lane of the group its result and compares it (chain_collective). With
  /// `identical` results, the lanes after the first whose comparison would be the same add
  /// their counts only (their errors are the first lane's: no new worst value).
  void chain_deliver(ChainPart& part, int ph, bool backward, const Op& op, bool identical);


  /// The three TP AllReduces of the vocab-parallel cross entropy, in Megatron-LM's order
  /// (tensor_parallel/cross_entropy.py): the logits maximum (the shift), the target logit,
  /// the sum of exponentials.
  void ce_collective(int st, const Op& op);

  void ce_after_reduce(Lane& L, int mb, const Op& op);

  /// Asynchronous (issue) or blocking collective: `deliver` runs at the wait, or now.
  void launch(int st, const Op& op, std::function<void()> deliver);

  Tag regather_target(const Reg& cur, Slot& src, Slot& dst, int& layer, const Op& op);

  void regather(int st, const Op& op);

  /// K and V of a lane's tokens, side by side: rows B*sl, columns [K | V].
  Mat pack_kv(const Mat& k, const Mat& v) const {
    Mat kv = Mat::uninitialized(k.rows, 2 * k.cols);
    set_col_range(kv, 0, k);
    set_col_range(kv, k.cols, v);
    return kv;
  }

  void cp_kv(int st, const Op& op);

  /// ReduceScatter (SUM) of every lane's dK/dV of all CP blocks: block j to its owner j.
  /// Read when delivered: ring attention streams the blocks as attention_bwd_remote
  /// produces them.
  void cp_dkv(int st, const Op& op);

  // ---- data-parallel gradients and ZeRO ----
  /// The gradients a DP collective carries (Op::grad_bucket): the tied word embedding's
  /// own bucket, or every complete and unreduced gradient but one that has its own bucket.
  Bucket ready_bucket(int st, const Op& op);

  Vector pack_grads(const RankState& R, const Bucket& bk) const;

  void dp_grad(int st, const Op& op);

  /// Parameter AllGather over DPxCP: every rank receives, element by element, the value of
  /// the rank that owns it (ZeRO-3: the layer's chunk; ZeRO-1/2: the chunk the gradient
  /// ReduceScatter gave it, updated by its optimizer). op.layer >= 0: that layer's
  /// parameters (ZeRO-3 before use; ZeRO-1/2 with overlap_param_gather, the previous
  /// step's update, gathered before the layer's first forward); -1: the stage's parameters
  /// that no per-layer gather covers (all of them with ZeRO-1/2 without overlap).
  void dp_param_gather(int st, const Op& op);

  /// TP AllReduce SUM of the gradients of parameters replicated over TP but computed on
  /// sequence shards, as they stand (TP peers shard their DP reductions alike).
  void sp_grad_allreduce(int st, const Op& op);

  /// A gradient as it stands: the DP-reduced value where this rank received one, the
  /// local gradient elsewhere.
  static double& grad_as_is(LocalParam& p, size_t e) { return p.has_synced[e] ? p.synced[e] : p.grad.v[e]; }

  /// Tied word embedding with pp > 1: AllReduce (Op::reduce) of the gradient of the
  /// first stage's embedding and the last stage's copy over the embedding group
  /// (GroupKind::EMB), on the gradients as they stand. Runs when both stages reached it.
  void embed_grad(const Op& op);
  /// dualpipe_grad_allreduce (DualPipe, DeepSeek-V3 Sec 3.2.1: every layer is held by
  /// pipeline ranks r and pp - 1 - r): SUMs, between each rank of the stage pair {st,
  /// pp - 1 - st} and its partner with the same TP/CP/DP coordinates, the gradients of every
  /// parameter both hold (same kind, layer and TP shard), as they stand (reduced over DP or
  /// not, like embed_grad); size_bytes must be those elements x grad_bytes_per_param, or
  /// after a DP ReduceScatter the elements the rank owns. Runs when both stages reached it
  /// (a rendezvous, Schedule).
  void mirror_grad(int st, const Op& op);
  /// The stage a two-stage collective (embedding_grad_allreduce: the first and the last
  /// stage; dualpipe_grad_allreduce: st and pp - 1 - st) pairs `st` with, -1 when it has
  /// none; `why` says why.
  int64_t partner_stage(int64_t st, Fn fn, std::string* why = nullptr) const;
  /// Executes a two-stage collective once both stages reached it.
  void rendezvous_op(int st, const Op& op, Fn fn);
  static bool two_stage(Fn fn) { return fn == Fn::embed_grad || fn == Fn::mirror_grad; }

  // ------------------------------------------------------------------ p2p -------------
  /// The lane of the stage a send or receive talks to (Op::peer_stage, else the next or
  /// previous stage), with this lane's TP and CP coordinates.
  int peer(const Lane& L, const Op& op, int delta) const {
    const int64_t st = op.peer_stage >= 0 ? op.peer_stage : L.stage + delta;
    if (st < 0 || st >= pp) return -1;
    return lane_at[sz(st)][sz(L.cp * t + L.tp)];
  }
  /// The virtual pipeline stage of a stage's model chunk: the position of the chunk's first
  /// layer among the first layers of every chunk of the plan (two chunks holding the same
  /// layers, as DualPipe's two directions do, share it), which is chunk * pp + stage for
  /// the interleaved schedule and 2 pp - 1 - stage for chunk 1 of a V-shape; chunk * pp +
  /// stage for a chunk without layers.
  int64_t virtual_stage(int stage, int chunk) const {
    const auto& m = chunk_vs[sz(stage)];
    const auto it = m.find(chunk);
    return it != m.end() ? it->second : static_cast<int64_t>(chunk) * pp + stage;
  }
  std::vector<std::map<int, int64_t>> chunk_vs;  // [stage] chunk -> virtual stage (resolve_ops)

  void send(int st, const Op& op);

  bool recv_ready(int st, const Op& op);

  void recv(int st, const Op& op);

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
  KV kv_block(Lane& L, int layer, int mb, int64_t j, const Op& op);

  /// Online softmax (Milakov & Gimelshein 2018; FlashAttention, Dao 2022 Alg. 1) of this
  /// lane's queries against CP block kb: running max M, exp-sum L, weighted output ACC.
  void online_block(Lane& L, int layer, int mb, int64_t kb, const Op& op);
  void online_init(Lane& L, int layer, int mb) {
    put(L, layer, mb, Slot::att_m, Mat(B * sl, al, -INFINITY));
    put(L, layer, mb, Slot::att_l, Mat(B * sl, al));
    put(L, layer, mb, Slot::att_acc, Mat(B * sl, al * d));
  }
  void online_finish(Lane& L, int layer, int mb, const Op& op);
  void finish_ctx(Lane& L, int layer, int mb, Mat ctx, const Op& op);

  /// FlashAttention backward of this lane's queries against CP block kb (Dao 2022 Alg. 2):
  /// P = exp(S - lse), dV_j += P^T dO, dS = P (dP - rowsum(dO o O)), dQ += dS K, dK_j += dS^T Q.
  void flash_bwd_block(Lane& L, int layer, int mb, int64_t kb, const Op& op);

  /// Unfused attention: scores of this lane's queries against every key of the sequence
  /// (rows (sample, head, query), columns key position), masked.
  // Unfused attention, one (sample, head, CP block) at a time as small matrix products
  // (tensor.hpp's kernels: each dot product or sum in the order of the key / query index,
  // as the element loops they replace).
  /// Scratch for a transposed K or V block (d x sl), one per thread.
  static std::vector<double>& block_t(const double* rows, int64_t stride, int64_t n, int64_t width);
  void scores(Lane& L, int layer, int mb, const Op& op);
  void values(Lane& L, int layer, int mb, const Op& op);

  // ------------------------------------------------------------------ helpers ---------
  Reg& chain(Lane& L, const Op& op) { return L.cur[phase_ix(op.phase)]; }
  Reg& expect(Lane& L, const Op& op, std::initializer_list<Tag> tags, const char* what, bool full_tokens);
  void set_chain(Lane& L, const Op& op, Mat m, Tag tag, bool partial, bool seq_shard);
  const double* wptr(Lane& L, int64_t dd, LK k, int layer, const Op& op) {
    return lane_value(L, dd, k, layer, op).v.data();
  }

  /// True when every replica of the lane holds bitwise the same value of parameter k (the
  /// usual case; ZeRO shards not gathered yet, or a bug, make them differ). Then one kernel
  /// over all rows of a stacked matrix gives every block exactly what its own parameter
  /// would. Memoized until a parameter value of the stage changes (epoch).
  bool uniform(Lane& L, LK k, int layer);

  // Per-replica blocks of a lane's stacked token matrix: replica dd owns rows
  // [dd * rows / nd, (dd + 1) * rows / nd) and uses its own parameters (one kernel over
  // every row when they are uniform).
  /// x W, or x W^T with `nt` (each block with its replica's parameter k). With `bias` (x W
  /// only), then + each replica's bias (add_bias; in the same pass when both the weight and
  /// the bias are uniform).
  Mat product(Lane& L, const Mat& x, LK k, int layer, const Op& op, bool nt, const LK* bias);
  Mat linear(Lane& L, const Mat& x, LK k, int layer, const Op& op, const LK* bias = nullptr) {
    return product(L, x, k, layer, op, false, bias);
  }
  Mat linear_nt(Lane& L, const Mat& x, LK k, int layer, const Op& op) {
    return product(L, x, k, layer, op, true, nullptr);
  }
  /// Each replica's gradient of k += a^T g over its block (row by row into the gradient).
  void wgrad(Lane& L, LK k, int layer, const Mat& a, const Mat& g, const Op& op);
  /// y = (y + r) + each replica's bias k, row by row (add_into then add_bias, in one pass).
  void add_residual_bias(Lane& L, Mat& y, const Mat& r, LK k, int layer, const Op& op);
  /// Adds each replica's bias k to its rows.
  void add_bias(Lane& L, Mat& y, LK k, int layer, const Op& op);
  /// Each replica's gradient of bias k += its block of g, row by row.
  void bias_grad(Lane& L, LK k, int layer, const Mat& g, const Op& op);

  void norm_fwd(Lane& L, const Op& op, LK w, LK bb, Slot out, Tag tag);
  /// Without sequence parallelism the TP ranks of a group normalize the same residual
  /// stream with the same (replicated) weights: when lane L's input and the weights each
  /// of its row blocks uses are bitwise those of the first lane of its TP group, which ran
  /// this op just before, that lane's output and statistics are L's (the same kernel on the
  /// same bits), copied instead of recomputed. False: L computes them itself.
  bool reuse_norm(Lane& L, const Op& op, const Mat& x, LK w, LK bb, Slot out, bool one, NormCache& cache, Mat& y);
  Mat norm_bwd(Lane& L, const Op& op, LK w, LK bb, Slot cache_slot, Tag dtag);
  /// The full-token input of a column-parallel layer for its weight gradient: re-gathered
  /// with sequence parallelism, the kept norm output otherwise.
  const Mat& col_input(Lane& L, const Op& op, Slot norm_slot, Slot regathered, int layer) {
    if (sp) return need(L, layer, op.micro_batch, regathered, op, "the re-gathered norm output (tp_allgather_input)");
    return need(L, layer, op.micro_batch, norm_slot, op, "the norm output");
  }

  void layer_forward_done(Lane& L, int layer, int mb);

  // ------------------------------------------------------------------ compute ---------
  void compute(Lane& L, Fn fn, const Op& op);
  // One function per block family (models/verify/ops_<family>.cpp): the semantics of its ops.
  void embedding_op(Lane& L, Fn fn, const Op& op);
  void norm_op(Lane& L, Fn fn, const Op& op);
  void attention_op(Lane& L, Fn fn, const Op& op);
  void mlp_op(Lane& L, Fn fn, const Op& op);
  void head_op(Lane& L, Fn fn, const Op& op);
  void moe_op(Lane& L, Fn fn, const Op& op);
  /// Multi-head latent attention (models/verify/ops_mla.cpp), RoPE and its backward included
  /// when the model has MLA.
  void mla_op(Lane& L, Fn fn, const Op& op);
  /// MLA's RMSNorm of `x` with the replicated weight w (q_norm / kv_norm): the output, its
  /// statistics kept under `out`.
  Mat mla_norm_fwd(Lane& L, const Op& op, const Mat& x, LK w, Slot out);
  /// Its backward on dy: dx, and w's gradient.
  Mat mla_norm_bwd(Lane& L, const Op& op, const Mat& dy, LK w, Slot cache_slot);
  /// The MoE token AllToAlls and ETP collectives (moe_dispatch, moe_combine, moe_etp_* and
  /// their backward), over the groups Op::group names, on every rank of the stage.
  void moe_comm(int st, const Op& op);
  /// [rank] (layer, micro-batch) -> the rank's MoE tensors; touched only by its stage.
  std::vector<std::map<std::pair<int, int>, MoeFrame>> moe_frames;
  MoeFrame& moe_frame(int64_t rank, int layer, int mb) { return moe_frames[sz(rank)][{layer, mb}]; }
  /// Position of `rank` in its group of kind k.
  int64_t group_pos(int64_t rank, GroupKind k) const {
    const auto g = grid.group_of(rank, k);
    return std::find(g.begin(), g.end(), rank) - g.begin();
  }

  void attention_bwd_done(Lane& L, const Op& op);

  // ------------------------------------------------------------------ optimizer -------
  void optimizer(int st, const Op& op);

  // ------------------------------------------------------------------ driver ----------
  void exec(int st, size_t idx);
  void run_op(int st, size_t idx, const Op& op, Fn fn);
  /// Before a backward op of stage st: each lane whose backward chain holds the embedding's
  /// output gradient of a micro-batch whose embedding_bwd has not run keeps a copy
  /// (Lane::emb_stash), unless `op` is that micro-batch's embedding W.
  void keep_embedding_grads(int st, const Op& op);
  /// The embedding's W (embedding_bwd, and with SP the TP AllGather of its output gradient,
  /// Op::pass W) of a micro-batch whose gradient the chain no longer holds: runs `f` with
  /// each lane's kept gradient as its backward chain. False: not such an op.
  bool run_on_kept_embedding_grad(int st, const Op& op, Fn fn, const std::function<void()>& f);

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

  void build_schedule();
  int64_t sched_ops = 0;  // ops in the serial order (compare_rank's keys follow them)

  // ------------------------------------------------------------------ drivers ---------
  /// The ops in the serial order on this thread; reports deadlocks.
  void run_serial();

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

  void start_workers();
  /// Runs f(w) on every thread w (0: this one) and waits for all.
  void run_on_all(std::function<void(int)> f);
  /// Frees thread w's share of the stages' ranks, lanes and frames, then this thread's
  /// recycled storage: the interpreter's destruction on every thread.
  void free_stages(int w);
  void stop_workers();

  /// Runs the step's ops on `threads` threads; false when a stage failed.
  bool run_parallel();

  void wake() {
    events.fetch_add(1, std::memory_order_release);
    events.notify_all();
  }

  /// One thread's share: claim any stage that is not busy or done (starting from this
  /// thread's part of the pipeline), run it as far as it goes, repeat; sleep when no stage
  /// moved on.
  void work(int w);

  /// Runs stage st's ops until one must wait. `signalled`: it arrived at a rendezvous.
  void run_stage(int st, bool& signalled);
  /// Something arrived for stage st (a message, a rendezvous partner or its result).
  void post(int64_t st) {
    if (st >= 0 && st < pp) inbox[sz(st)].fetch_add(1, std::memory_order_release);
  }

  void run_step(int s, const Batch& bt, const RefStep* rf, const RefState& after, bool last);

  /// Rank R's parameters and Adam moments after step s against the reference's.
  void compare_rank(const RankState& R, int s, const std::vector<double>& ref_params,
                    const refmath::AdamState& ref_adam);
  /// Every rank, in rank order, into the totals.
  void compare_state(int s, const std::vector<double>& ref_params, const refmath::AdamState& ref_adam) {
    t_exec = ExecCtx{};
    for (const auto& R : ranks) compare_rank(R, s, ref_params, ref_adam);
  }
  /// Stage st is done with the step (run_parallel): its ranks' comparison (recorded with
  /// keys after every op of the step, in rank order, as compare_state would), then, after
  /// the last step, its tensors and parameters are freed on this thread.
  void finish_stage(int st);
  /// The stage's frames, working gradients and parameters (after the last step).
  void free_stage(int64_t st);
};

}  // namespace dtsim::verify
