#include "models/plan.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "models/checked.hpp"
#include "models/combined_1f1b.hpp"
#include "models/compute_cost.hpp"
#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/flops.hpp"
#include "models/host_dispatch.hpp"
#include "models/blocks/block_context.hpp"
#include "models/blocks/layer.hpp"
#include "models/pipeline_split.hpp"
#include "models/precision.hpp"
#include "models/schedules/schedule.hpp"
#include "models/zero3.hpp"

namespace dtsim {

const char* to_string(CommKind k) {
  switch (k) {
    case CommKind::TP: return "TP";
    case CommKind::CP: return "CP";
    case CommKind::PP: return "PP";
    case CommKind::DP: return "DP";
    case CommKind::EP: return "EP";
  }
  return "?";
}

const char* to_string(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "AllReduce";
    case Collective::ReduceScatter: return "ReduceScatter";
    case Collective::AllGather: return "AllGather";
    case Collective::AllToAll: return "AllToAll";
  }
  return "?";
}

const char* to_string(ReduceOp r) {
  switch (r) {
    case ReduceOp::none: return "none";
    case ReduceOp::sum: return "SUM";
    case ReduceOp::avg: return "AVG";
    case ReduceOp::max: return "MAX";
  }
  return "?";
}

/// The reduce op a collective of `kind` carries (see ReduceOp).
ReduceOp reduce_op_for(CommKind kind, Collective c) {
  if (c == Collective::AllGather || c == Collective::AllToAll) return ReduceOp::none;
  return kind == CommKind::DP ? ReduceOp::avg : ReduceOp::sum;
}

const char* to_string(Phase p) {
  switch (p) {
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::recompute: return "recompute";
    case Phase::optimizer: return "optimizer";
  }
  return "?";
}

const char* to_string(BackwardPart p) {
  switch (p) {
    case BackwardPart::full: return "full";
    case BackwardPart::input: return "input";
    case BackwardPart::weight: return "weight";
  }
  return "?";
}

const char* to_string(Pass p) {
  switch (p) {
    case Pass::F: return "F";
    case Pass::B: return "B";
    case Pass::W: return "W";
  }
  return "?";
}

GradSyncPolicy grad_sync_policy(const Layout& l, const Training& t) {
  GradSyncPolicy g;
  g.group = l.dp * l.cp;
  g.reduced = g.group > 1;
  g.collective = l.zero_stage == 0 ? Collective::AllReduce : Collective::ReduceScatter;
  g.sharded_optimizer = l.zero_stage >= 1;
  g.sharded_grads = l.zero_stage >= 2;
  g.sharded_params = l.zero_stage >= 3;
  g.per_layer = l.zero_stage >= 3;
  // Sharded gradients are reduced in the backward of every micro-batch (see plan.hpp).
  g.every_micro_batch = g.sharded_grads || t.reduce_every_micro_batch;
  return g;
}

double grad_bucket_params(const Layout& l, const Training& t) {
  const double grad_bytes = t.main_grad == GradDtype::fp32 ? 4.0 : 2.0;
  if (t.grad_bucket_bytes > 0) return t.grad_bucket_bytes / grad_bytes;
  if (t.framework == Framework::deepspeed) return 5e8;  // reduce_bucket_size (zero/config.py)
  // Megatron-Core DistributedDataParallelConfig: bucket_size = max(40,000,000,
  // 1,000,000 * dp_size) parameters (megatron/core/distributed/distributed_data_parallel.py).
  return std::max(40e6, 1e6 * static_cast<double>(l.dp * l.cp));
}

RingCost ring_cost(Collective c, int64_t n, double size_bytes) {
  if (n <= 1) return {};
  const double frac = static_cast<double>(n - 1) / static_cast<double>(n);
  switch (c) {
    case Collective::AllReduce: return {2.0 * frac * size_bytes, 2 * (n - 1)};
    case Collective::ReduceScatter:
    case Collective::AllGather: return {frac * size_bytes, n - 1};
    // Direct exchange: (n-1)/n of the send buffer leaves each rank, all pairs at once (one
    // latency step; sim/collectives/alltoall_direct.cpp).
    case Collective::AllToAll: return {frac * size_bytes, 1};
  }
  return {};
}

namespace {

using blocks::kAct;  // bytes per bf16 activation / weight element (models/blocks/block_context.hpp)
// Fused Adam (apex/Megatron multi-tensor): read fp32 grad (4), read+write fp32 master,
// m and v (24), write bf16 param (2) = 30 bytes per parameter.
constexpr double kAdamBytesPerParam = 30.0;

class Builder {
 public:
  Builder(const Experiment& e, StagePlan& sp, const PlanShape& shape)
      : e_(e), m_(e.model), l_(e.layout), sp_(sp), shape_(shape), ctx_(e, sp, shape), blocks_(e.model) {
    t_ = static_cast<double>(l_.tp);
    h_ = static_cast<double>(m_.hidden);
    sp_on_ = l_.sequence_parallel && l_.tp > 1;
    dpcp_ = l_.dp * l_.cp;
    g_ = grad_sync_policy(e);
    edp_ = l_.edp();
    // Each layer kind's parameters on this rank (models/blocks/layer.hpp ModelBlocks::
    // rank_parameters; the dense part equals flops.hpp's layer_parameters_per_tp_rank).
    for (int k = 0; k < blocks::kLayerKinds; ++k) {
      const blocks::Layer& ly = blocks_.kind(k);
      kind_params_[static_cast<size_t>(k)] = {ly.parameters_per_tp_rank(m_, l_.tp),
                                              ly.parameters(m_).expert_weights / static_cast<double>(l_.ep * l_.expert_tp())};
    }
    const auto kinds = stage_layer_kinds(m_, l_, sp_.stage);
    for (int k = 0; k < blocks::kLayerKinds; ++k) {
      const double n = static_cast<double>(kinds[static_cast<size_t>(k)]);
      if (n == 0) continue;
      stage_layer_params_.dense += n * kind_params_[static_cast<size_t>(k)].dense;
      stage_layer_params_.expert += n * kind_params_[static_cast<size_t>(k)].expert;
      const blocks::BlockParams bp = blocks_.kind(k).parameters(m_);
      stage_replicated_ += n * (bp.replicated_weights + bp.replicated_biases);
    }
    for (int k = 0; k < blocks::kLayerKinds; ++k) {
      const blocks::BlockParams bp = blocks_.kind(k).parameters(m_);
      kind_quantized_[static_cast<size_t>(k)] = {bp.sharded_weights / t_,
                                                 bp.expert_weights / static_cast<double>(l_.ep * l_.expert_tp())};
    }
    stage_quantized_ = stage_quantized_weights(e_, sp_.stage);
    z3_ = zero3_policy(e_);
    for (int k = 0; k < blocks::kLayerKinds; ++k) gather_parts_[static_cast<size_t>(k)] = zero3_gather_parts(e_, k);
    kept_from_ = static_cast<int>(m_.layers + m_.mtp_layers - zero3_kept_layers(e_, sp_.stage));
  }
  /// Layer `layer`'s GEMM weights on this rank that the precision recipe quantizes (zero in
  /// a BF16 layer; models/precision.hpp stage_quantized_weights).
  blocks::RankParams layer_quantized(int layer) const {
    if (!layer_low_precision(e_.training, m_.layers, layer)) return {};
    return kind_quantized_[static_cast<size_t>(blocks::layer_kind(m_, layer))];
  }
  /// Parameters of global layer `layer` on this rank, by reducing group.
  const blocks::RankParams& layer_params(int layer) const {
    return kind_params_[static_cast<size_t>(blocks::layer_kind(m_, layer))];
  }

  // ---- primitive appenders (models/blocks/block_context.hpp) ----
  // The blocks append through ctx_; these forward the builder's own ops (P2P, DP sync,
  // optimizer) to it, stamped with the chunk being emitted (cur_chunk_).
  void compute(const char* name, Phase ph, int layer, int mb, KernelKind k, double flops, double bytes,
               int kernels = 1, double attention_work = 1.0) {
    ctx().compute(name, ph, layer, mb, k, flops, bytes, kernels, attention_work);
  }
  void collective(const char* name, Phase ph, int layer, int mb, CommKind kind, Collective c, GroupKind g,
                  double size) {
    ctx().collective(name, ph, layer, mb, kind, c, g, size);
  }
  /// Returns the handle, or -1 when the group has one rank (nothing to wait for).
  int issue(const char* name, Phase ph, int layer, int mb, CommKind kind, Collective c, GroupKind g,
            double size) {
    return ctx().issue(name, ph, layer, mb, kind, c, g, size);
  }
  void wait(int handle, CommKind kind, int layer, int mb, Phase ph) { ctx().wait(handle, kind, layer, mb, ph); }
  void p2p(OpType type, Direction dir, int mb, int chunk, int peer_stage) {
    ctx().p2p(type, dir, mb, chunk, peer_stage);
  }
  int64_t group_size(GroupKind g) const { return ctx_.group_size(g); }

  // ---- transformer layer, embedding, head (models/blocks/) ----
  /// Forward (Phase::forward) or full recomputation (Phase::recompute) of one layer.
  void layer_forward(int layer, int mb, Phase ph) {
    captured([&] { blocks_.layer(layer).forward(ctx(), layer, mb, ph); });
  }
  /// Backward of one layer, or its B or W part (BackwardPart, models/plan.hpp): the W part
  /// is the four weight-gradient GEMMs in autograd order (mlp_down, mlp_up, out_proj, qkv)
  /// with the SP re-gathers of the column-parallel inputs; norm weight gradients stay in B
  /// (fused in the norm's backward kernel; zero-bubble defers only the linear layers'
  /// wgrad GEMMs).
  void layer_backward(int layer, int mb, BackwardPart part = BackwardPart::full) {
    captured([&] { blocks_.layer(layer).backward(ctx(), layer, mb, part); });
  }
  /// Selective recomputation (ph = Phase::recompute) before a layer's backward: the
  /// attention core (Korthikanti 2022 Sec 5).
  void attention_core_forward(Phase ph, int layer, int mb) {
    (void)ph;  // always Phase::recompute: the forward runs the core inside layer_forward
    captured([&] { blocks_.layer(layer).selective_recompute(ctx(), layer, mb); });
  }
  /// What layout.recompute runs again before a layer's backward: the whole layer (full) or
  /// its attention core (selective).
  void recompute_layer(int layer, int mb) {
    if (l_.recompute == Recompute::full) layer_forward(layer, mb, Phase::recompute);
    if (l_.recompute == Recompute::selective) attention_core_forward(Phase::recompute, layer, mb);
  }
  /// training.cuda_graphs = layers: the ops `emit` appends (one layer's forward, backward or
  /// recompute) are one CUDA graph (Op::graph), as Megatron-Core's per-layer graphs capture
  /// a TransformerLayer's forward and its backward separately
  /// (megatron/core/transformer/cuda_graphs.py CudaGraphManager). full_iteration stamps the
  /// whole forward-backward in build_step_plan.
  template <class F>
  void captured(F emit) {
    const size_t from = sp_.ops.size();
    emit();
    if (e_.training.cuda_graphs != CudaGraphs::layers) return;
    const int32_t id = next_graph_++;
    for (size_t i = from; i < sp_.ops.size(); ++i) sp_.ops[i].graph = id;
  }
  void embedding_forward(int mb) { blocks_.embedding().forward(ctx(), -1, mb, Phase::forward); }
  /// All of the embedding's backward is W (BackwardPart::input emits nothing).
  void embedding_backward(int mb, BackwardPart part = BackwardPart::full) {
    blocks_.embedding().backward(ctx(), -1, mb, part);
  }
  void head_forward(int mb) { blocks_.head().forward(ctx(), -1, mb, Phase::forward); }
  /// Backward of the loss, LM head and final norm, or its B or W part (BackwardPart):
  /// W is lm_head_wgrad (with SP, after re-gathering the final norm's output).
  void head_backward(int mb, BackwardPart part = BackwardPart::full) {
    blocks_.head().backward(ctx(), -1, mb, part);
  }

  // ---- data-parallel gradient sync and ZeRO ----
  // What runs when comes from grad_sync_policy (plan.hpp), which memory.cpp reads too.
  bool dp_active() const { return g_.reduced; }
  Collective grad_collective() const { return g_.collective; }
  const char* grad_op_name() const {
    return g_.collective == Collective::AllReduce ? "dp_grad_allreduce" : "dp_grad_reducescatter";
  }
  /// Routed experts' gradients over the expert-data-parallel group (GroupKind::EDP): their own
  /// buckets (Megatron-Core keeps expert parameters in separate buffers,
  /// distributed_data_parallel.py expert_parallel_buffers, reduced over the expert data
  /// parallel group), with the dense rule of grad_sync_policy. The collective SUMs over EDP
  /// and the gradient is scaled by 1 / (DP x CP) as the dense one (Megatron-Core
  /// distributed_data_parallel.py: expert_gradient_scaling_factor = 1 / dp_cp size, or
  /// edp / dp_cp with average_in_collective): every token's contribution is counted once,
  /// and the result is the full-batch mean gradient. Reported as an AVG over EDP with that
  /// scaling (ReduceOp::avg; models/verify checks it on numbers).
  bool expert_active() const { return edp_ > 1 && m_.moe.enabled(); }
  void expert_grads_ready(double params, int layer, int mb, bool sync) {
    if (!expert_active() || params <= 0) return;
    if (g_.per_layer) {
      fsdp_before_reduce(params, layer, mb, /*dense=*/false);
      dp_handles_.push_back(issue("edp_grad_reducescatter", Phase::backward, layer, mb, CommKind::DP,
                                  Collective::ReduceScatter, GroupKind::EDP, params * shape_.grad_bytes_per_param));
      return;
    }
    if (!sync) return;
    pending_expert_ += params;
    if (e_.training.overlap_grad_reduce && pending_expert_ >= shape_.ddp_bucket_params) flush_expert_bucket(layer, mb);
  }
  const char* expert_grad_op_name() const {
    return g_.collective == Collective::AllReduce ? "edp_grad_allreduce" : "edp_grad_reducescatter";
  }
  void flush_expert_bucket(int layer, int mb) {
    if (pending_expert_ <= 0 || !expert_active()) return;
    const double size = pending_expert_ * shape_.grad_bytes_per_param;
    if (e_.training.overlap_grad_reduce)
      dp_handles_.push_back(issue(expert_grad_op_name(), Phase::backward, layer, mb, CommKind::DP, grad_collective(),
                                  GroupKind::EDP, size));
    else
      collective(expert_grad_op_name(), Phase::backward, layer, mb, CommKind::DP, grad_collective(), GroupKind::EDP, size);
    pending_expert_ = 0;
  }
  /// Both gradient parts of layer `layer` are complete.
  void layer_grads_ready(int layer, int mb, bool sync) {
    const blocks::RankParams& p = layer_params(layer);
    grads_ready(p.dense, layer, mb, sync);
    expert_grads_ready(p.expert, layer, mb, sync);
  }

  /// FSDP2 before a unit's ReduceScatter (models/zero3.hpp): the compute stream waits for the
  /// previous one, then copies the unsharded gradients into the send buffer (chunk_cat).
  /// (`dense`: the layer unit's own ReduceScatter; the routed experts' over EDP, a unit of
  /// their own, only copies.)
  void fsdp_before_reduce(double params, int layer, int mb, bool dense) {
    if (!z3_.copy_kernels) return;
    if (dense && z3_.reduce_waits_previous && last_unit_reduce_ >= 0) {
      wait(last_unit_reduce_, CommKind::DP, layer, mb, Phase::backward);
      dp_handles_.erase(std::find(dp_handles_.begin(), dp_handles_.end(), last_unit_reduce_));
      last_unit_reduce_ = -1;
    }
    compute("fsdp_grad_copy_in", Phase::backward, layer, mb, KernelKind::memory, 0,
            fsdp_grad_copy_in_bytes(params, static_cast<double>(shape_.grad_bytes_per_param)));
  }
  /// Called after the weight gradients of `params` elements are complete.
  void grads_ready(double params, int layer, int mb, bool sync) {
    if (!dp_active() || params <= 0) return;
    if (g_.per_layer) {
      // ZeRO-3: gradients are sharded, so each micro-batch reduce-scatters its layer's
      // grads to their owners (FSDP units; DeepSpeed's buckets, models/zero3.hpp).
      fsdp_before_reduce(params, layer, mb, /*dense=*/true);
      dp_handles_.push_back(issue("dp_grad_reducescatter", Phase::backward, layer, mb, CommKind::DP,
                                  Collective::ReduceScatter, GroupKind::DPxCP, params * shape_.grad_bytes_per_param));
      if (z3_.reduce_waits_previous) last_unit_reduce_ = dp_handles_.back();
      return;
    }
    if (!sync) return;
    if (!e_.training.overlap_grad_reduce) {
      pending_params_ += params;
      return;
    }
    pending_params_ += params;
    if (pending_params_ >= shape_.ddp_bucket_params) flush_bucket(layer, mb);
  }
  void flush_bucket(int layer, int mb) {
    if (pending_params_ <= 0 || !dp_active()) return;
    const double size = pending_params_ * shape_.grad_bytes_per_param;
    dp_handles_.push_back(
        issue(grad_op_name(), Phase::backward, layer, mb, CommKind::DP, grad_collective(), GroupKind::DPxCP, size));
    pending_params_ = 0;
  }
  /// Tied word embedding with pp > 1 and sharded gradients (ZeRO >= 1): the first stage's
  /// embedding and the last stage's copy each get a DP gradient bucket of their own, so
  /// that both stages' ReduceScatters give every element the same owner and the
  /// embedding_grad_allreduce after the DP sync (Megatron-Core finalize_model_grads:
  /// finish_grad_sync, then _allreduce_embedding_grads) adds matching shards
  /// (Megatron-Core param_and_grad_buffer.py _does_param_require_new_bucket: "ensures that
  /// the first and last pipeline stage partition optimizer state for the shared embedding
  /// parameters the same way across DP replicas"). Found missing by dtsim verify.
  bool word_embedding_own_bucket() const {
    return loss_stage_embeds(m_) && l_.pp > 1 && g_.collective == Collective::ReduceScatter && dp_active() &&
           rank_holds_.embedding != rank_holds_.loss;
  }
  /// The non-layer gradients of `params` elements are complete: the first stage's
  /// embedding (`first`) or the last stage's head. Megatron-Core fills buckets in reverse
  /// parameter order: on the first stage the position embedding closes the open bucket and
  /// the word embedding follows alone; on the last stage the word embedding's copy comes
  /// alone and the final norm opens the next bucket.
  void edge_grads_ready(double params, int mb, bool sync, bool first) {
    if (!word_embedding_own_bucket()) {
      grads_ready(params, -1, mb, sync);
      return;
    }
    const double word = static_cast<double>(m_.vocab * m_.hidden) / t_;
    if (first) grads_ready(params - word, -1, mb, sync);
    const double size = word * shape_.grad_bytes_per_param;
    if (!g_.per_layer) {
      if (!sync) return;
      if (!e_.training.overlap_grad_reduce) {
        pending_word_ = size;  // sent after the others at the end of the step (flush_pending)
        if (!first) grads_ready(params - word, -1, mb, sync);
        return;
      }
      flush_bucket(-1, mb);  // the open bucket closes where the embedding's own begins
    }
    dp_handles_.push_back(issue("dp_grad_reducescatter", Phase::backward, -1, mb, CommKind::DP,
                                Collective::ReduceScatter, GroupKind::DPxCP, size));
    sp_.ops.back().grad_bucket = GradBucket::tied_embedding;
    if (!first) grads_ready(params - word, -1, mb, sync);
  }
  /// ZeRO-3: gather a layer's parameters (bf16) before use; returns the handle. A MoE
  /// layer's routed experts are gathered over EDP first (their handle is waited for with the
  /// dense one's: the later of the two, issued second, completes last on the DP stream).
  /// DeepSpeed (models/zero3.hpp) gathers module by module (Op::gather_parts) and keeps the
  /// stage's last kept_from_.. layers gathered from their forward into their backward.
  int zero3_gather(int layer, int mb, Phase ph) {
    if (!g_.sharded_params) return -1;
    if (ph == Phase::backward && layer >= kept_from_) return -1;
    const blocks::RankParams& p = layer_params(layer);
    const GatherParts& parts = gather_parts_[static_cast<size_t>(blocks::layer_kind(m_, layer))];
    if (expert_active() && p.expert > 0) {
      expert_gather_[layer] = issue("edp_param_allgather", ph, layer, mb, CommKind::DP, Collective::AllGather,
                                    GroupKind::EDP, param_gather_bytes(e_.training, p.expert, layer_quantized(layer).expert));
      if (expert_gather_[layer] >= 0 && parts.expert > 1) sp_.ops.back().gather_parts = parts.expert;
    }
    if (!dp_active()) return -1;
    const int h = issue("dp_param_allgather", ph, layer, mb, CommKind::DP, Collective::AllGather, GroupKind::DPxCP,
                        param_gather_bytes(e_.training, p.dense, layer_quantized(layer).dense));
    if (h >= 0 && parts.dense > 1) sp_.ops.back().gather_parts = parts.dense;
    return h;
  }
  /// Waits for layer `layer`'s parameter gathers: the dense one (`handle`) and its experts'.
  /// FSDP2 then copies the gathered flat buffer into the parameters on the compute stream
  /// (models/zero3.hpp fsdp_copy_out_bytes).
  void wait_gather(int handle, int layer, int mb, Phase ph) {
    auto it = expert_gather_.find(layer);
    const bool expert = it != expert_gather_.end() && it->second >= 0;
    if (it != expert_gather_.end()) {
      wait(it->second, CommKind::DP, layer, mb, ph);
      expert_gather_.erase(it);
    }
    wait(handle, CommKind::DP, layer, mb, ph);
    if (z3_.copy_kernels && (handle >= 0 || expert)) {
      const blocks::RankParams& p = layer_params(layer);
      const double params = (handle >= 0 ? p.dense : 0.0) + (expert ? p.expert : 0.0);
      compute("fsdp_param_copy_out", ph, layer, mb, KernelKind::memory, 0, fsdp_copy_out_bytes(params));
    }
  }

  // ---- one model chunk (virtual stage) of this pipeline rank ----
  // Rank r holds chunks c = 0..v-1, chunk c being virtual stage virtual_stage_of(l, r, c)
  // (models/pipeline_split.hpp; c*p + r under Megatron-LM's interleaving, Narayanan 2021
  // Sec 2.2.2); without interleaving v = 1.
  struct Chunk {
    int index = 0;
    int64_t first_layer = 0, layers = 0;
    bool first = false, last = false;  // first / last virtual stage of the model
  };
  // The split of layers, embedding and loss over virtual stages (models/pipeline_split.hpp,
  // possibly uneven; a chunk may hold no layer when it holds the embedding or the loss).
  mutable std::vector<VirtualStage> split_;
  Chunk chunk(int c) const {
    if (split_.empty()) split_ = pipeline_split(m_, l_);
    const VirtualStage& vs = split_[static_cast<size_t>(virtual_stage_of(l_, sp_.stage, c))];
    Chunk ch;
    ch.index = c;
    ch.layers = vs.layers;
    ch.first_layer = vs.first_layer;
    ch.first = vs.embedding;
    ch.last = vs.loss;
    return ch;
  }
  /// Gradients are reduced on the chunk's last micro-batch (Megatron DDP and distributed
  /// optimizer) or on every micro-batch (ZeRO-2/3; reduce_every_micro_batch):
  /// GradSyncPolicy::every_micro_batch. A chunk's last micro-batch is the step's last, except
  /// with DualPipe, whose two directions each carry half of them.
  bool reduce_now(int c, int mb) const {
    return g_.every_micro_batch || mb == last_mb_[static_cast<size_t>(c)];
  }

  /// The pipeline message of chunk `c` to or from the chunk `to` (Place from the schedule):
  /// nothing when there is none or it sits on this rank (a V turn: a local hand-over).
  void p2p_with(OpType type, Direction dir, int mb, int c, const sched::Place& to) {
    if (!to.valid() || to.rank == sp_.stage) return;
    p2p(type, dir, mb, c, static_cast<int>(to.rank));
    for (auto it = sp_.ops.rbegin(); it != sp_.ops.rend(); ++it)
      if (it->type == type) {
        it->peer_chunk = static_cast<int32_t>(to.chunk);
        break;
      }
  }

  /// The loss chunk's work after its decoder layers, forward: each multi-token prediction
  /// depth (model.mtp_layers; Megatron-Core multi_token_prediction.py, placed with the loss):
  /// its entry (models/blocks/mtp.hpp), a layer of the last layer's kind at index
  /// layers + d (its parameters are the stage's layers', stage_layer_kinds) and the shared LM
  /// head + loss with the depth's own final norm; then the model's head + loss.
  void loss_forward(int mb) {
    for (int64_t d = 0; d < m_.mtp_layers; ++d) {
      const int layer = static_cast<int>(m_.layers + d);
      blocks_.mtp_entry().forward(ctx(), layer, mb, Phase::forward);
      const int h = first_use_gather(layer, mb, Phase::forward);
      wait_gather(h, layer, mb, Phase::forward);
      layer_forward(layer, mb, Phase::forward);
      blocks_.head().forward(ctx(), layer, mb, Phase::forward);
    }
    head_forward(mb);
  }
  /// Backward of loss_forward, or its B or W part (BackwardPart): the head, then the MTP
  /// depths last to first (head, layer after its recomputation, entry); with the weight
  /// gradients (full or W) the DP bookkeeping of each depth's layer and, last, of the head's
  /// parameters (head_params_rank, the entries' included).
  void loss_backward(int mb, BackwardPart part, bool sync) {
    const bool grads = part != BackwardPart::input;
    head_backward(mb, part);
    for (int64_t d = m_.mtp_layers - 1; d >= 0; --d) {
      const int layer = static_cast<int>(m_.layers + d);
      blocks_.head().backward(ctx(), layer, mb, part);
      if (part != BackwardPart::weight) {
        const int gather = zero3_gather(layer, mb, Phase::backward);  // ZeRO-3: gathered again
        wait_gather(gather, layer, mb, Phase::backward);
        // Full recomputation checkpoints the whole depth, entry and layer (Megatron-Core
        // multi_token_prediction.py _checkpointed_forward); its head is outside it.
        if (l_.recompute == Recompute::full) blocks_.mtp_entry().forward(ctx(), layer, mb, Phase::recompute);
        recompute_layer(layer, mb);
      }
      layer_backward(layer, mb, part);
      blocks_.mtp_entry().backward(ctx(), layer, mb, part);
      if (grads) layer_grads_ready(layer, mb, sync);
    }
    if (grads) edge_grads_ready(head_params_rank(), mb, sync, /*first=*/false);
  }

  void chunk_forward(int c, int mb) {
    const Chunk ch = chunk(c);
    cur_chunk_ = c;
    p2p_with(OpType::recv, Direction::forward, mb, c, sched_->prev(dims_, sp_.stage, c, mb));
    if (ch.first) embedding_forward(mb);
    if (aligned_param_gather()) wait_chunk_param_gather(c, mb);
    int next = ch.layers > 0 ? first_use_gather(static_cast<int>(ch.first_layer), mb, Phase::forward) : -1;
    for (int64_t i = 0; i < ch.layers; ++i) {
      const int layer = static_cast<int>(ch.first_layer + i);
      const int cur = next;
      next = (i + 1 < ch.layers) ? first_use_gather(layer + 1, mb, Phase::forward) : -1;  // prefetch
      wait_gather(cur, layer, mb, Phase::forward);
      layer_forward(layer, mb, Phase::forward);
    }
    if (ch.last) loss_forward(mb);
    p2p_with(OpType::send, Direction::forward, mb, c, sched_->next(dims_, sp_.stage, c, mb));
  }

  /// The backward of chunk `c` for micro-batch `mb`: fused (BackwardPart::full, the BW of
  /// models/schedules/schedule.hpp) or its input-gradient part B (BackwardPart::input), whose
  /// weight-gradient part W chunk_weight() emits later. The DP gradient bookkeeping follows
  /// the weight gradients, so it runs here only for a fused backward.
  void chunk_backward(int c, int mb, BackwardPart part) {
    const Chunk ch = chunk(c);
    cur_chunk_ = c;
    const bool fused = part == BackwardPart::full;
    const bool sync = reduce_now(c, mb);
    p2p_with(OpType::recv, Direction::backward, mb, c, sched_->next(dims_, sp_.stage, c, mb));
    if (ch.last) loss_backward(mb, part, sync);
    int next = ch.layers > 0 ? zero3_gather(static_cast<int>(ch.first_layer + ch.layers - 1), mb, Phase::backward) : -1;
    for (int64_t i = ch.layers - 1; i >= 0; --i) {
      const int layer = static_cast<int>(ch.first_layer + i);
      const int cur = next;
      next = i > 0 ? zero3_gather(layer - 1, mb, Phase::backward) : -1;
      wait_gather(cur, layer, mb, Phase::backward);
      recompute_layer(layer, mb);
      layer_backward(layer, mb, part);
      if (fused) layer_grads_ready(layer, mb, sync);
    }
    if (ch.first && fused) {
      embedding_backward(mb, part);
      edge_grads_ready(embedding_params_rank(), mb, sync, /*first=*/true);
    }
    if (fused) chunk_gradients_done(mb, sync);
    p2p_with(OpType::send, Direction::backward, mb, c, sched_->prev(dims_, sp_.stage, c, mb));
  }

  /// A combined forward-backward pass (sched::Step::paired): the forward of chunk `cf` for
  /// micro-batch `mf` beside the fused backward of chunk `cb` for `mb`, as Megatron-Core's
  /// TransformerModelChunkSchedulePlan.run (models/common/model_chunk_schedule_plan.py):
  /// both receives first; the backward's head; forward layer i merged with backward layer
  /// n - 1 - i (models/combined_1f1b.hpp) while both have layers, then the rest of either
  /// alone; the sends; the forward's head and the backward's embedding last.
  /// (training.overlap_moe_expert_parallel_comm refuses ZeRO-3, full recomputation and CUDA
  /// graphs, models/moe_checks.cpp, so no per-layer gathers or graphs are cut here.)
  void chunk_forward_backward(int cf, int mf, int cb, int mb) {
    const Chunk fch = chunk(cf), bch = chunk(cb);
    const bool sync = reduce_now(cb, mb);
    cur_chunk_ = cf;
    p2p_with(OpType::recv, Direction::forward, mf, cf, sched_->prev(dims_, sp_.stage, cf, mf));
    if (fch.first) embedding_forward(mf);
    if (aligned_param_gather()) wait_chunk_param_gather(cf, mf);
    cur_chunk_ = cb;
    p2p_with(OpType::recv, Direction::backward, mb, cb, sched_->next(dims_, sp_.stage, cb, mb));
    if (bch.last) loss_backward(mb, BackwardPart::full, sync);
    // Emits what `emit` appends for chunk `c`, cut out of the stage's ops.
    auto take = [&](int c, auto emit) {
      cur_chunk_ = c;
      const size_t from = sp_.ops.size();
      emit();
      std::vector<Op> ops(sp_.ops.begin() + static_cast<std::ptrdiff_t>(from), sp_.ops.end());
      sp_.ops.resize(from);
      return ops;
    };
    auto forward_layer = [&](int layer) {
      cur_chunk_ = cf;
      const int h = first_use_gather(layer, mf, Phase::forward);  // only a layer's first forward gathers
      wait_gather(h, layer, mf, Phase::forward);
      layer_forward(layer, mf, Phase::forward);
    };
    auto backward_layer = [&](int layer) {
      cur_chunk_ = cb;
      recompute_layer(layer, mb);
      layer_backward(layer, mb, BackwardPart::full);
      layer_grads_ready(layer, mb, sync);
    };
    const int64_t both = std::min(fch.layers, bch.layers);
    for (int64_t i = 0; i < both; ++i) {
      const int fl = static_cast<int>(fch.first_layer + i);
      const int bl = static_cast<int>(bch.first_layer + bch.layers - 1 - i);
      const std::vector<Op> fwd = take(cf, [&] { forward_layer(fl); });
      const std::vector<Op> rec = take(cb, [&] { recompute_layer(bl, mb); });
      const std::vector<Op> bwd = take(cb, [&] { layer_backward(bl, mb, BackwardPart::full); });
      merge_forward_backward(sp_.ops, fwd, rec, bwd, sp_.handles);
      cur_chunk_ = cb;
      layer_grads_ready(bl, mb, sync);
    }
    for (int64_t i = bch.layers - 1 - both; i >= 0; --i) backward_layer(static_cast<int>(bch.first_layer + i));
    for (int64_t i = both; i < fch.layers; ++i) forward_layer(static_cast<int>(fch.first_layer + i));
    cur_chunk_ = cf;
    p2p_with(OpType::send, Direction::forward, mf, cf, sched_->next(dims_, sp_.stage, cf, mf));
    cur_chunk_ = cb;
    p2p_with(OpType::send, Direction::backward, mb, cb, sched_->prev(dims_, sp_.stage, cb, mb));
    if (fch.last) {
      cur_chunk_ = cf;
      loss_forward(mf);
    }
    cur_chunk_ = cb;
    if (bch.first) {
      embedding_backward(mb);
      edge_grads_ready(embedding_params_rank(), mb, sync, /*first=*/true);
    }
    chunk_gradients_done(mb, sync);
  }

  /// The deferred weight-gradient part W of chunk `c` for micro-batch `mb` (Qi et al. 2024
  /// Sec 2): the weight-gradient GEMMs in the backward's order, then the DP bookkeeping
  /// that a fused backward does. Nothing waits for it but the DP sync and the optimizer.
  void chunk_weight(int c, int mb) {
    const Chunk ch = chunk(c);
    cur_chunk_ = c;
    const bool sync = reduce_now(c, mb);
    if (ch.last) loss_backward(mb, BackwardPart::weight, sync);
    for (int64_t i = ch.layers - 1; i >= 0; --i) {
      const int layer = static_cast<int>(ch.first_layer + i);
      layer_backward(layer, mb, BackwardPart::weight);
      layer_grads_ready(layer, mb, sync);
    }
    if (ch.first) {
      embedding_backward(mb, BackwardPart::weight);
      edge_grads_ready(embedding_params_rank(), mb, sync, /*first=*/true);
    }
    chunk_gradients_done(mb, sync);
  }

  /// A chunk's gradients of one micro-batch are complete. Reducing every micro-batch (ZeRO-2,
  /// DeepSpeed): this micro-batch's gradients leave now, in whatever bucket is still open, so
  /// buckets never mix micro-batches. Only the step's last chunk-backward leaves its bucket to
  /// finish_step; with interleaving that is chunk 0 of the last micro-batch, and the last
  /// micro-batch's other chunks, which run between other micro-batches' chunks, are flushed
  /// at their own end.
  void chunk_gradients_done(int mb, bool sync) {
    const bool last_backward = ++backwards_ == backwards_total_;
    if (sync && g_.every_micro_batch && !g_.per_layer && !last_backward) flush_pending(-1, mb);
    // DeepSpeed ZeRO-3 ends every backward with reduce_and_partition_stream.synchronize()
    // (models/zero3.hpp): the compute stream, and the host after it, wait for every
    // ReduceScatter (the last backward's wait before the optimizer, finish_step).
    if (z3_.backward_end_sync && !last_backward && !dp_handles_.empty()) {
      for (int hnd : dp_handles_) wait(hnd, CommKind::DP, -1, mb, Phase::backward);
      dp_handles_.clear();
      sp_.ops.back().host_sync = true;
    }
  }
  /// Sends the open expert bucket (dense and expert buffers are separate).
  void flush_expert(int layer, int mb) { flush_expert_bucket(layer, mb); }

  /// Sends the open bucket: asynchronously with overlap_grad_reduce, else blocking.
  void flush_pending(int layer, int mb) {
    flush_expert(layer, mb);
    if (!dp_active()) return;
    if (pending_params_ > 0) {
      if (e_.training.overlap_grad_reduce) {
        flush_bucket(layer, mb);
      } else {
        collective(grad_op_name(), Phase::backward, layer, mb, CommKind::DP, grad_collective(), GroupKind::DPxCP,
                   pending_params_ * shape_.grad_bytes_per_param);
        pending_params_ = 0;
      }
    }
    if (pending_word_ > 0) {  // the tied word embedding's own bucket (edge_grads_ready)
      collective("dp_grad_reducescatter", Phase::backward, layer, mb, CommKind::DP, Collective::ReduceScatter,
                 GroupKind::DPxCP, pending_word_);
      sp_.ops.back().grad_bucket = GradBucket::tied_embedding;
      pending_word_ = 0;
    }
  }

  /// Parameter gathers needed before a layer's forward: ZeRO-3 every micro-batch; with
  /// the distributed optimizer (ZeRO-1/2) and overlap_param_gather, the previous step's
  /// parameter AllGather is issued at the start of this step and each layer waits for
  /// its bucket before its first forward (Megatron --overlap-param-gather), which is the
  /// steady state of "overlapped with the next forward".
  int first_use_gather(int layer, int mb, Phase ph) {
    if (g_.sharded_params) return zero3_gather(layer, mb, ph);
    if (aligned_param_gather()) return -1;  // chunk gathers (chunk_param_gather)
    if (!param_gather_overlapped() || gathered_.count(layer)) return -1;
    gathered_.insert(layer);
    // A MoE layer's experts first, over EDP; the dense gather, issued after it on the same
    // in-order DP stream, completes last, so waiting for it waits for both.
    const blocks::RankParams& p = layer_params(layer);
    if (expert_active() && p.expert > 0)
      expert_gather_[layer] =
          issue("edp_param_allgather", ph, layer, mb, CommKind::DP, Collective::AllGather, GroupKind::EDP,
                param_gather_bytes(e_.training, p.expert, layer_quantized(layer).expert));
    return issue("dp_param_allgather", ph, layer, mb, CommKind::DP, Collective::AllGather, GroupKind::DPxCP,
                 param_gather_bytes(e_.training, p.dense, layer_quantized(layer).dense));
  }
  bool param_gather_overlapped() const {
    return dp_active() && g_.sharded_optimizer && !g_.sharded_params && e_.training.overlap_param_gather;
  }
  /// Megatron-Core's interleaved schedule with overlap_param_gather (align_param_gather, its
  /// default): config.param_sync_func is each model chunk's DDP.start_param_sync, which
  /// dispatches every bucket of the chunk at once (distributed_data_parallel.py
  /// start_param_sync); the schedule calls it for chunks 0 and 1 before the warm-up and for
  /// chunk c + 1 at the forward whose virtual micro-batch id plus the pipeline rank is the
  /// first micro-batch of chunk c, so that every rank launches together
  /// (pipeline_parallel/schedules.py forward_backward_pipelining_with_interleaving,
  /// "Synchronize params for first two model chunks" and forward_step_helper_preprocess; the
  /// id tables are this rank's forward order). Non-first chunks and ranks past the first are
  /// one bucket each (training.py get_model: per_chunk_disable_bucketing), so a chunk's
  /// gather is one collective here. Megatron turns align_param_gather off for the
  /// non-interleaved schedule (arguments.py), where first_use_gather's per-layer gathers run.
  bool aligned_param_gather() const {
    return param_gather_overlapped() && e_.layout.schedule == Schedule::interleaved && sched_->chunks(dims_) > 1;
  }
  /// Issues chunk `c`'s parameter gather (its layers' dense parameters over DP x CP, the
  /// experts' over EDP first) unless it was issued already.
  void chunk_param_gather(int c, int mb) {
    if (c < 0 || c >= static_cast<int>(chunk_gather_.size()) || chunk_gather_[static_cast<size_t>(c)].issued) return;
    auto& g = chunk_gather_[static_cast<size_t>(c)];
    g.issued = true;
    const Chunk ch = chunk(c);
    // The loss chunk's MTP layers follow its last layer (index model.layers + d).
    const int64_t gathered = ch.layers + (ch.last ? m_.mtp_layers : 0);
    if (gathered == 0) return;
    double dense = 0, expert = 0, q_dense = 0, q_expert = 0;
    for (int64_t i = 0; i < gathered; ++i) {
      const blocks::RankParams& p = layer_params(static_cast<int>(ch.first_layer + i));
      dense += p.dense;
      expert += p.expert;
      const blocks::RankParams q = layer_quantized(static_cast<int>(ch.first_layer + i));
      q_dense += q.dense;
      q_expert += q.expert;
    }
    const int saved = cur_chunk_;
    cur_chunk_ = c;
    const int layer = static_cast<int>(ch.first_layer);
    auto mark = [&](int handle) {  // the chunk's layers on the op just issued
      if (handle >= 0) sp_.ops.back().gather_layers = static_cast<int32_t>(gathered);
      return handle;
    };
    if (expert_active() && expert > 0)
      g.expert = mark(issue("edp_param_allgather", Phase::forward, layer, mb, CommKind::DP, Collective::AllGather,
                            GroupKind::EDP, param_gather_bytes(e_.training, expert, q_expert)));
    g.dense = mark(issue("dp_param_allgather", Phase::forward, layer, mb, CommKind::DP, Collective::AllGather,
                         GroupKind::DPxCP, param_gather_bytes(e_.training, dense, q_dense)));
    cur_chunk_ = saved;
  }
  /// Before chunk `c`'s first forward: its gather (dispatched now if the schedule did not,
  /// as DDP's forward pre-hook does: param_and_grad_buffer.py finish_param_sync).
  void wait_chunk_param_gather(int c, int mb) {
    auto& g = chunk_gather_[static_cast<size_t>(c)];
    if (g.waited) return;
    chunk_param_gather(c, mb);
    g.waited = true;
    const int layer = static_cast<int>(chunk(c).first_layer);
    if (g.expert >= 0) wait(g.expert, CommKind::DP, layer, mb, Phase::forward);
    if (g.dense >= 0) wait(g.dense, CommKind::DP, layer, mb, Phase::forward);
  }

  /// Parameters of the last stage's head on one rank: the final norm (replicated over
  /// TP), the vocab-parallel LM head unless tied, with tied weights or MTP and pp > 1
  /// Megatron's copy of the word embedding (loss_stage_embeds; with pp == 1 it is the
  /// embedding), and the MTP depths' entries (their layers are layers).
  double head_params_rank() const {
    double vocab_rows = 0;
    if (!m_.tied_embeddings) vocab_rows = static_cast<double>(lm_head_parameters(m_));
    if (loss_stage_embeds(m_) && !rank_holds_.embedding) vocab_rows += static_cast<double>(m_.vocab * m_.hidden);
    return vocab_rows / t_ + static_cast<double>(norm_parameters(m_)) + mtp_entry_parameters_per_rank(m_, l_.tp);
  }
  /// The first stage's embedding parameters on one rank: whatever the stage holds beyond
  /// its layers (and, when it is also the last stage, the head), so that every parameter
  /// of stage_parameters_per_rank has its gradient reduced exactly once.
  double embedding_params_rank() const {
    double rest = sp_.params_per_rank - stage_layer_params_.total();
    if (rank_holds_.loss) rest -= head_params_rank();
    return rest;
  }

  /// Emits the compute-stream order of one step for this pipeline rank: the registered
  /// schedule's order (models/schedules/), one chunk pass per step.
  void schedule(const std::vector<sched::Step>& order) {
    last_mb_.assign(static_cast<size_t>(sched_->chunks(dims_)), -1);
    backwards_total_ = 0;
    for (const sched::Step& st : order) {
      if (st.pass == sched::Pass::F)
        last_mb_[static_cast<size_t>(st.chunk)] = std::max(last_mb_[static_cast<size_t>(st.chunk)], st.mb);
      if (st.pass == sched::Pass::BW || st.pass == sched::Pass::W) ++backwards_total_;
    }
    // Megatron's aligned chunk parameter gathers (aligned_param_gather): chunks 0 and 1 before
    // the warm-up, chunk c + 1 at the forward k whose k + pipeline rank is chunk c's first.
    std::vector<const sched::Step*> forwards;
    for (const sched::Step& st : order)
      if (st.pass == sched::Pass::F) forwards.push_back(&st);
    const bool aligned = aligned_param_gather();
    if (aligned) {
      chunk_gather_.assign(static_cast<size_t>(sched_->chunks(dims_)), ChunkGather{});
      chunk_param_gather(0, 0);
      chunk_param_gather(1, 0);
    }
    size_t k = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      const sched::Step& st = order[i];
      if (aligned && st.pass == sched::Pass::F) {
        const size_t id = k++ + static_cast<size_t>(sp_.stage);
        if (id < forwards.size() && forwards[id]->mb == 0) {
          const int next_chunk = forwards[id]->chunk + 1;
          if (next_chunk > 1 && next_chunk < sched_->chunks(dims_)) chunk_param_gather(next_chunk, st.mb);
        }
      }
      if (st.paired) {  // F with the BW after it (sched::Step::paired)
        const sched::Step& bw = order.at(i + 1);
        chunk_forward_backward(st.chunk, st.mb, bw.chunk, bw.mb);
        ++i;
        continue;
      }
      switch (st.pass) {
        case sched::Pass::F: chunk_forward(st.chunk, st.mb); break;
        case sched::Pass::BW: chunk_backward(st.chunk, st.mb, BackwardPart::full); break;
        case sched::Pass::B: chunk_backward(st.chunk, st.mb, BackwardPart::input); break;
        case sched::Pass::W: chunk_weight(st.chunk, st.mb); break;
      }
    }
  }

  void finish_step() {
    cur_chunk_ = 0;
    const int last_layer = -1;
    const int mb = static_cast<int>(shape_.micro_batches - 1);
    if (!g_.per_layer) flush_pending(last_layer, mb);
    for (int hnd : dp_handles_) wait(hnd, CommKind::DP, -1, -1, Phase::optimizer);
    // Tied word embedding with pp > 1: the first and last stages each hold a copy and
    // SUM their gradients before the optimizer (Megatron-LM
    // _allreduce_word_embedding_grads, over the embedding group), fp32 main grads.
    // Counted as PP communication (models/result.hpp CommStats): the embedding group is the
    // first and last rank of a pipeline group, and the AllReduce exists because PP splits
    // the tied weight (reports/explain.cpp lists it under PP too).
    // (DualPipe: the first and last rank each hold embedding and head, and the mirror sum
    // below adds their copies.)
    // (A rank that holds both, as rank 0 under DualPipeV, ties them locally: no copy.)
    if (loss_stage_embeds(m_) && l_.pp > 1 && !sched_->params_twice() && rank_holds_.embedding != rank_holds_.loss)
      collective("embedding_grad_allreduce", Phase::optimizer, -1, mb, CommKind::PP, Collective::AllReduce,
                 GroupKind::EMB, static_cast<double>(m_.vocab * m_.hidden) / t_ * shape_.grad_bytes_per_param);
    if (!sp_.ops.empty() && std::string(sp_.ops.back().name) == "embedding_grad_allreduce")
      sp_.ops.back().reduce = ReduceOp::sum;  // two copies' partial gradients of one weight
    // DualPipe: ranks r and pp - 1 - r hold the same stages (each a copy) and SUM their
    // gradients before the optimizer (DeepSeek-V3 report Sec 3.2.1), after the DP sync as the
    // tied embedding's. Each chunk's gradients fill buckets of their own in layer order, so
    // both copies shard alike and, with a sharded optimizer, the ranks add only the shard
    // they own (the rule Megatron-Core applies to the tied embedding,
    // _does_param_require_new_bucket). PP communication, as the embedding's.
    if (sched_->params_twice() && l_.pp > 1) {
      const double owned_grads = owned_params();
      collective("dualpipe_grad_allreduce", Phase::optimizer, -1, mb, CommKind::PP, Collective::AllReduce,
                 GroupKind::MIRROR, owned_grads * shape_.grad_bytes_per_param);
      if (!sp_.ops.empty() && std::string(sp_.ops.back().name) == "dualpipe_grad_allreduce")
        sp_.ops.back().reduce = ReduceOp::sum;
    }
    // Sequence parallel: parameters replicated over TP but applied to sequence shards
    // (norm weights and biases, row-parallel biases) hold TP partial gradients, summed
    // over TP after the DP sync (Megatron-LM finalize_model_grads.py
    // _allreduce_layernorm_grads). Found missing by dtsim verify.
    if (sp_on_) {
      // The blocks' replicated parameters (norms, row-parallel biases, a MoE router).
      double replicated = stage_replicated_;
      if (rank_holds_.loss) replicated += static_cast<double>(norm_parameters(m_));
      collective("tp_sp_grad_allreduce", Phase::optimizer, -1, mb, CommKind::TP, Collective::AllReduce, GroupKind::TP,
                 replicated * shape_.grad_bytes_per_param);
    }
    // Optimizer: HBM-bound fused Adam over the parameters this rank owns.
    const double owned = owned_params();
    sp_.optimizer_params = owned;
    compute("optimizer_adam", Phase::optimizer, -1, -1, KernelKind::optimizer, 0, owned * kAdamBytesPerParam);
    // The precision recipe's weight casts, once per step (models/precision.hpp): each
    // low-precision GEMM weight read in BF16 and written rowwise and columnwise. Transformer
    // Engine casts them in the next step's first micro-batch and reuses them for the others
    // (is_first_microbatch); on the same compute stream, they are counted here. With
    // fp8_param_gather the optimizer writes its shard of the quantized weights from the FP32
    // main parameters (Megatron fp8_utils.py quantize_param_shard) and each rank writes the
    // columnwise copy from the gathered rowwise one.
    if (stage_quantized_.total() > 0) {
      const double owned_q = g_.sharded_optimizer ? stage_quantized_.dense / static_cast<double>(dpcp_) +
                                                        stage_quantized_.expert / static_cast<double>(edp_)
                                                  : stage_quantized_.total();
      compute("weight_quantize", Phase::optimizer, -1, -1, KernelKind::memory, 0,
              weight_quantize_bytes(e_.training, stage_quantized_.total(), owned_q));
    }
    // With per-layer gathers (ZeRO-1/2 with overlap_param_gather, and ZeRO-3), the stage's
    // non-layer parameters (embedding, final norm, LM head) are gathered after the step
    // and stay gathered through the next one: Megatron's distributed optimizer gathers
    // every bucket, and ZeRO-3 keeps them as FSDP keeps its root unit (PyTorch
    // torch.distributed.fsdp.fully_shard docs, reshard_after_forward: the root's is set to
    // False, its parameters being needed again in backward). Both found missing by dtsim
    // verify; models/memory.cpp counts them gathered.
    const double non_layer = sp_.params_per_rank - stage_layer_params_.total();
    if ((param_gather_overlapped() || (g_.sharded_params && dp_active())) && non_layer > 0)
      collective("dp_param_allgather", Phase::optimizer, -1, -1, CommKind::DP, Collective::AllGather,
                 GroupKind::DPxCP, non_layer * kAct);
    if (dp_active() && g_.sharded_optimizer && !g_.sharded_params && !param_gather_overlapped())
      collective("dp_param_allgather", Phase::optimizer, -1, -1, CommKind::DP, Collective::AllGather,
                 GroupKind::DPxCP,
                 param_gather_bytes(e_.training, sp_.params_per_rank - stage_layer_params_.expert, stage_quantized_.dense));
    if (expert_active() && g_.sharded_optimizer && !g_.sharded_params && stage_layer_params_.expert > 0 &&
        !param_gather_overlapped())
      collective("edp_param_allgather", Phase::optimizer, -1, -1, CommKind::DP, Collective::AllGather,
                 GroupKind::EDP, param_gather_bytes(e_.training, stage_layer_params_.expert, stage_quantized_.expert));
  }
  /// Parameters whose optimizer step this rank runs: with a sharded optimizer the dense ones'
  /// 1 / (DP x CP) share and the routed experts' 1 / EDP share (models/memory.hpp).
  double owned_params() const {
    const double expert = stage_layer_params_.expert, dense = sp_.params_per_rank - expert;
    if (!g_.sharded_optimizer) return sp_.params_per_rank;
    return dense / static_cast<double>(dpcp_) + expert / static_cast<double>(edp_);
  }

 private:
  const Experiment& e_;
  const ModelSpec& m_;
  const Layout& l_;
  StagePlan& sp_;
  const PlanShape& shape_;
  GradSyncPolicy g_;
  double t_ = 1, h_ = 0;
  bool sp_on_ = false;
  int64_t dpcp_ = 1;
  std::array<blocks::RankParams, blocks::kLayerKinds> kind_params_{};
  blocks::RankParams stage_layer_params_;  // the stage's layers on this rank
  double stage_replicated_ = 0;            // their TP-replicated parameters (sequence-parallel sum)
  std::array<blocks::RankParams, blocks::kLayerKinds> kind_quantized_{};  // quantizable GEMM weights per kind
  QuantizedWeights stage_quantized_;       // the stage's low-precision GEMM weights (models/precision.hpp)
  int64_t edp_ = 1;
  double pending_expert_ = 0;              // expert gradient elements of the open expert bucket
  std::map<int, int> expert_gather_;       // layer -> handle of its experts' parameter gather
  double pending_params_ = 0;
  double pending_word_ = 0;  // bytes of the tied word embedding's own bucket, not sent yet
  std::vector<int> dp_handles_;
  Zero3Policy z3_;                                            // models/zero3.hpp
  std::array<GatherParts, blocks::kLayerKinds> gather_parts_{};  // per layer kind
  int last_unit_reduce_ = -1;  // fsdp: the handle of the latest layer unit's ReduceScatter
  int kept_from_ = 0;  // first layer kept gathered from its forward into its backward (zero3_kept_layers)
  std::set<int> gathered_;  // layers whose overlapped parameter gather was issued
  struct ChunkGather {  // aligned_param_gather: one model chunk's gather
    bool issued = false, waited = false;
    int dense = -1, expert = -1;  // handles (-1: none)
  };
  std::vector<ChunkGather> chunk_gather_;
  int cur_chunk_ = 0;       // model chunk being emitted
  int32_t next_graph_ = 0;  // next CUDA graph id (captured)
  int64_t backwards_ = 0;   // chunk gradients completed so far (BW or W passes)
  int64_t backwards_total_ = 0;  // ... in the whole step
  const sched::PipelineSchedule* sched_ = &sched::schedule_of(e_.layout.schedule);
  sched::Dims dims_ = sched::dims_of(e_.layout, e_.training, shape_.micro_batches);
  std::vector<int> last_mb_;  // per chunk: its last micro-batch of the step
  /// Which of the embedding and the loss this rank's chunks hold (models/pipeline_split.hpp;
  /// both with pp == 1, and on the first and last rank under DualPipe).
  RankSplit rank_holds_ = rank_split(m_.layers, l_, sp_.stage);
  blocks::BlockContext ctx_;    // the blocks' appenders and sizes (models/blocks/block_context.hpp)
  blocks::ModelBlocks blocks_;  // embedding, layers, head (models/blocks/layer.hpp)
  /// The context, stamped with the chunk being emitted.
  blocks::BlockContext& ctx() {
    ctx_.cur_chunk = cur_chunk_;
    return ctx_;
  }
};

}  // namespace

std::map<std::string, int64_t> time_source_counts(const StepPlan& plan) {
  std::array<int64_t, calib::kTimeSources> n{};
  for (const auto& st : plan.stages)
    for (const auto& op : st.ops)
      if (op.type == OpType::compute) ++n[static_cast<size_t>(op.time_source)];
  std::map<std::string, int64_t> out;
  for (int i = 0; i < calib::kTimeSources; ++i)
    if (const int64_t c = n[static_cast<size_t>(i)]; c > 0) out[calib::to_string(static_cast<calib::TimeSource>(i))] = c;
  return out;
}

StepPlan build_step_plan(const Experiment& exp) {
  validate_experiment(exp);
  StepPlan plan;
  plan.exp = exp;
  const Layout& l = exp.layout;
  plan.shape.micro_batches = exp.training.accumulation(l);
  plan.shape.tokens_local = exp.training.seq_len / l.cp;
  // Gradients are reduced in the main-grad dtype: fp32 as Megatron (bf16 training forces
  // accumulate_allreduce_grads_in_fp32, Megatron-LM arguments.py), bf16 as DeepSpeed /
  // the ZeRO paper (2 bytes, ZeRO Sec 3.1).
  plan.shape.grad_bytes_per_param = exp.training.main_grad == GradDtype::fp32 ? 4 : 2;
  plan.shape.ddp_bucket_params = grad_bucket_params(l, exp.training);
  const sched::PipelineSchedule& schedule = sched::schedule_of(l.schedule);
  const auto orders = schedule.order(sched::dims_of(l, exp.training, plan.shape.micro_batches));
  for (int64_t s = 0; s < l.pp; ++s) {
    StagePlan sp;
    sp.stage = s;
    sp.first_layer = stage_first_layer(exp.model, l, s);
    sp.layers = stage_layer_count(exp.model, l, s);
    sp.params_per_rank = stage_parameters_per_rank(exp.model, l, exp.training.seq_len, s);
    sp.grad_sync_bytes = sp.params_per_rank * static_cast<double>(plan.shape.grad_bytes_per_param);
    Builder b(exp, sp, plan.shape);
    b.schedule(orders[static_cast<size_t>(s)]);
    // --cuda-graph-impl full_iteration: one graph around forward_backward_func (Megatron-Core
    // full_cuda_graph.py FullCudaGraphWrapper); the gradient sync's end and the optimizer
    // step (finish_step) stay eager.
    if (exp.training.cuda_graphs == CudaGraphs::full_iteration)
      for (Op& op : sp.ops) op.graph = 0;
    b.finish_step();
    assign_host_dispatch(sp, exp);
    plan.stages.push_back(std::move(sp));
  }
  return plan;
}

BackwardPartOps backward_part_ops(const Experiment& exp, BackwardPart part) {
  validate_experiment(exp);
  PlanShape shape;
  shape.micro_batches = exp.training.accumulation(exp.layout);
  shape.tokens_local = exp.training.seq_len / exp.layout.cp;
  StagePlan sp;
  sp.layers = stage_layer_count(exp.model, exp.layout, 0);
  sp.params_per_rank = stage_parameters_per_rank(exp.model, exp.layout, exp.training.seq_len, 0);
  Builder b(exp, sp, shape);
  BackwardPartOps out;
  b.layer_backward(0, 0, part);
  out.layer = std::move(sp.ops);
  sp.ops.clear();
  b.head_backward(0, part);
  out.head = std::move(sp.ops);
  sp.ops.clear();
  b.embedding_backward(0, part);
  out.embedding = std::move(sp.ops);
  return out;
}

int64_t plan_op_bound(const Experiment& exp) {
  const Layout& l = exp.layout;
  const Training& t = exp.training;
  // Each MTP depth (models/blocks/mtp.hpp) is a transformer layer on the last stage plus its
  // entry (norms, eh_proj) and its own output head and loss: counted as two layers.
  const int64_t mtp = std::clamp<int64_t>(exp.model.mtp_layers, 0, std::numeric_limits<int64_t>::max() / 4);
  const int64_t layers = std::max<int64_t>(exp.model.layers, 0) > std::numeric_limits<int64_t>::max() / 2 - 2 * mtp
                             ? std::numeric_limits<int64_t>::max() / 2
                             : std::max<int64_t>(exp.model.layers, 0) + 2 * mtp,
                pp = std::max<int64_t>(l.pp, 1), vp = std::max<int64_t>(l.vp, 1);
  const auto per_batch = checked::mul(t.micro_batch, std::max<int64_t>(l.dp, 1));
  const int64_t m = per_batch && *per_batch > 0 ? std::max<int64_t>(t.global_batch / *per_batch, 1) : 1;
  const auto per_mb = [&]() -> std::optional<int64_t> {
    const auto a = checked::mul(layers, kPlanOpsPerLayer), b = checked::product({pp, vp, kPlanOpsPerChunk});
    return a && b ? checked::add(*a, *b) : std::nullopt;
  }();
  const auto steps = per_mb ? checked::mul(m, *per_mb) : std::nullopt;
  const auto stage = checked::mul(pp, kPlanOpsPerStage), layer = checked::mul(layers, kPlanOpsPerLayer);
  const auto total = steps && stage ? checked::add(*steps, *stage) : std::nullopt;
  const auto all = total && layer ? checked::add(*total, *layer) : std::nullopt;
  return all ? *all : std::numeric_limits<int64_t>::max();
}

double plan_executed_flops(const StepPlan& plan) {
  const Layout& l = plan.exp.layout;
  const double ranks_per_stage = static_cast<double>(l.dp * l.tp * l.cp);
  double total = 0;
  for (const auto& st : plan.stages)
    for (const auto& op : st.ops)
      if (op.type == OpType::compute) total += op.flops * ranks_per_stage;
  return total;
}

}  // namespace dtsim
