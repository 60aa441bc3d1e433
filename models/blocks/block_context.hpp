#pragma once
// BlockContext: what every block of a layer (models/blocks/layer.hpp) appends its ops
// through. It holds the experiment, the stage plan being built and the sizes derived once
// from them, and the primitive appenders (compute, GEMM, blocking and asynchronous
// collectives, waits, P2P) that time each compute op with the cost model
// (models/compute_cost.hpp) and stamp it with the model chunk and the zero-bubble pass
// (Op::pass). The plan builder (models/plan.cpp) owns one per pipeline stage; the blocks
// hold no state of their own, so the same block list describes every layer.
//
// Sizes (elements unless stated; per rank):
//   b = micro-batch sequences, s = query tokens per rank (seq_len / CP), t = TP,
//   h = hidden, f = ffn_hidden, kvd = kv_heads * head_dim, V = vocabulary;
//   norm_tokens = b s / t with sequence parallelism (norms run on sequence shards), else b s.
// Collectives follow ../shared/design/MATH.md (models/plan.hpp carries the rules).
#include <cstdint>
#include <tuple>

#include "models/experiment.hpp"
#include "models/flops.hpp"
#include "models/plan.hpp"

namespace dtsim::blocks {

/// Bytes per bf16 activation / weight element.
inline constexpr double kAct = 2.0;
/// Chunks of Transformer Engine's "pipeline" GEMM + ReduceScatter overlap (num_splits 4 in
/// TE's userbuffers default configuration, transformer_engine/pytorch/module/base.py
/// initialize_ub; ring_exchange uses num_splits = TP). Op::overlap_splits.
inline constexpr int32_t kTeReduceScatterSplits = 4;

/// Which operand of a GEMM is transposed, as cuBLAS sees it (calib::GemmShape): a linear
/// layer's forward Y = X W^T is `b`, its input gradient dX = dY W `none`, its weight
/// gradient dW^T = X^T dY `a`.
enum class Transpose { none, a, b };

class BlockContext {
 public:
  /// `sp` is the stage plan the ops are appended to; it must outlive the context.
  BlockContext(const Experiment& e, StagePlan& sp, const PlanShape& shape);

  // ---- primitive appenders ----
  /// A compute op timed by the cost model (calibrated profile when it has the kernel, else
  /// the roofline); `attention_work` multiplies attention FLOPs (compute_cost.hpp).
  void compute(const char* name, Phase ph, int layer, int mb, KernelKind k, double flops, double bytes,
               int kernels = 1, double attention_work = 1.0);
  /// An (m x k) @ (k x n) GEMM: reads both operands and writes the result (bf16). Its shape
  /// travels on the op (Op::gemm, m n k truncated to whole elements; Op::gemm_linear =
  /// `linear`): a linear layer's GEMM is timed in the training dtype, the others (the unfused
  /// attention GEMMs, `linear` false) in bf16 (Transformer Engine's FP8 recipe keeps
  /// dot-product attention in higher precision).
  /// Under a low-precision recipe (models/precision.hpp) a linear GEMM of a low-precision
  /// layer reads its operands quantized (element and scale bytes), and Transformer Engine's
  /// casts come before it as a memory-bound "quantize" op: the input of a forward GEMM
  /// (Transpose::b; once for GEMMs sharing it, as the up and gate projections) and the output
  /// gradient of an input-gradient GEMM (Transpose::none), each read in BF16 and written
  /// rowwise and columnwise (plus one more read for its amax where the recipe needs it). The
  /// weight-gradient GEMM reads the columnwise copies those wrote; weights are cast once per
  /// step (models/plan.cpp, weight_quantize).
  /// `kernels`: launches the op stands for (a grouped GEMM: one per local expert).
  /// `weight_copies`: a grouped GEMM over that many experts, each with its own weight, so the
  /// weight operand (B, the k x n of a forward or input-gradient GEMM) or, with
  /// `weight_is_output`, the result (the m x n weight gradient) is read or written once per
  /// expert: bytes = kAct (m k + c_B k n + c_C m n) (TE / CUTLASS grouped GEMMs multiply
  /// each expert's tokens by that expert's weight; the token rows m are the sum over experts).
  void gemm(const char* name, Phase ph, int layer, int mb, double flops, double m, double n, double k,
            Transpose transpose, bool linear = true, int kernels = 1, double weight_copies = 1,
            bool weight_is_output = false);
  /// A blocking collective of `size` bytes (nccl-tests size); nothing when the group has one rank.
  void collective(const char* name, Phase ph, int layer, int mb, CommKind kind, Collective c, GroupKind g,
                  double size);
  /// An asynchronous collective; returns its handle, or -1 when the group has one rank.
  int issue(const char* name, Phase ph, int layer, int mb, CommKind kind, Collective c, GroupKind g, double size);
  /// The compute stream waits for `handle` (nothing for -1).
  void wait(int handle, CommKind kind, int layer, int mb, Phase ph);
  /// A P2P send or receive of one micro-batch's activation (forward) or its gradient
  /// (backward) with pipeline rank `peer_stage`; without SP a TP AllGather follows a receive.
  void p2p(OpType type, Direction dir, int mb, int chunk, int peer_stage);
  /// Marks the TP collective just appended as pipelined with its GEMM (Op::overlap_splits)
  /// when training.tp_comm_overlap is on (validation requires sequence parallelism).
  void overlap_with_gemm(int32_t splits);
  /// Marks the wait just appended (for the CP K/V AllGather) as a ring of cp - 1 remote
  /// blocks: ring attention (Liu et al. 2023, arXiv 2310.01889, Sec 3; Megatron-Core / TE
  /// context parallelism, attn_forward_func_with_cp) computes block i while block i + 1
  /// travels, so only the last block waits for the whole exchange (Op::overlap_splits).
  void ring_blocks();
  /// Ranks of group `g` for this stage (EMB: 2 on the first and last stage with pp > 1;
  /// MIRROR: 2 for pipeline ranks r and pp - 1 - r under DualPipe, 1 for the middle rank
  /// of an odd pp; models/rank_grid.hpp).
  int64_t group_size(GroupKind g) const;

  // ---- tensor-parallel regions (Shoeybi 2019 Sec 3; Korthikanti 2022 Sec 4.2) ----
  /// Entering a column-parallel GEMM: with SP the sequence-sharded input is all-gathered
  /// (g), else identity. `te_overlap`: the GEMM is a Transformer Engine linear layer
  /// (userbuffers overlap applies); the LM head is Megatron's own ColumnParallelLinear.
  void tp_enter(Phase ph, int layer, int mb, const char* name, bool te_overlap = true);
  /// Leaving a row-parallel GEMM: SUM of the partial outputs (AllReduce, or
  /// ReduceScatter with SP).
  void tp_exit(Phase ph, int layer, int mb, const char* name);
  /// Backward entry of a row-parallel region with SP: the output gradient is all-gathered
  /// (backward of the forward ReduceScatter), pipelined with the dgrad GEMM under
  /// tp_comm_overlap (TE "fc2_dgrad" / "proj_dgrad": ring_exchange). No SP: nothing.
  void tp_gather_output_grad(int layer, int mb);
  /// Backward of a column-parallel input region, as Megatron-LM's
  /// LinearWithGradAccumulationAndAsyncCommunication does it (tensor_parallel/layers.py;
  /// Korthikanti 2022 Sec 4.2.2): with SP the all-gathered input is gathered again while
  /// the input gradient is computed; then the input gradient is summed over TP
  /// (ReduceScatter back to the sequence shards with SP, AllReduce without) asynchronously
  /// while the weight gradient is computed, and waited for after it (`part` full).
  /// Split (BackwardPart, as sail-sg/zero-bubble-pipeline-parallelism's layers.py with
  /// WeightGradStore.split_bw()): B = dgrad, then the blocking TP reduction (async_op
  /// False: nothing is left to hide it); W = with SP the blocking re-gather of the input
  /// (WeightGradStore.pop runs pre_process(async_op=False)), then wgrad.
  /// `width`: elements per token of the gathered input and of its gradient (0 = h, the
  /// hidden state; MLA's latents are narrower, models/blocks/mla.hpp).
  template <class Dgrad, class Wgrad>
  void column_parallel_backward(int layer, int mb, BackwardPart part, Dgrad dgrad, Wgrad wgrad, double width = 0);

  // ---- the zero-bubble pass of the ops appended ----
  /// Op::pass of an op of phase `ph` appended now: W inside a WeightPart, else B for
  /// backward ops, F otherwise.
  Pass pass_of(Phase ph) const {
    if (weight_part_) return Pass::W;
    return ph == Phase::backward ? Pass::B : Pass::F;
  }
  /// While alive, the ops appended are the W part of a split backward (`on`).
  class WeightPart {
   public:
    WeightPart(BlockContext& c, bool on) : c_(c), prev_(c.weight_part_) { c_.weight_part_ = on; }
    ~WeightPart() { c_.weight_part_ = prev_; }
    WeightPart(const WeightPart&) = delete;
    WeightPart& operator=(const WeightPart&) = delete;

   private:
    BlockContext& c_;
    bool prev_;
  };

  // ---- inputs and derived sizes (read-only for the blocks) ----
  const Experiment& e;
  const ModelSpec& m;
  const Layout& l;
  StagePlan& sp;
  const PlanShape& shape;
  const double b, s, t, h, f, kvd, V;
  const bool sp_on;             // sequence parallelism in effect (sequence_parallel and tp > 1)
  const double norm_tokens;     // tokens a norm / residual kernel runs on (see header)
  const ForwardFlops fwd;       // one layer's forward FLOPs, whole layer (flops.hpp)
  const double attn_fwd_work;   // attention work factors (compute_cost.hpp kFlash*)
  const double attn_bwd_work;
  int cur_chunk = 0;            // model chunk being emitted (Op::chunk); set by the builder
  /// Marks the ops appended since index `from` as shaped by this micro-batch's routing
  /// (Op::dynamic_shape: not capturable in a CUDA graph) unless the routing is static: a
  /// capacity factor with pad_to_capacity (Megatron-Core's drop-and-pad, the only MoE layer
  /// CudaGraphModule.moe captures, megatron/core/transformer/enums.py).
  void mark_dynamic(size_t from);

 private:
  /// Times `op` with the cost model, stamps its chunk and appends it.
  void append_compute(Op op, double attention_work);
  /// A collective or issue op of `type` with the fields both carry (its chunk: cur_chunk).
  Op collective_op(OpType type, const char* name, Phase ph, int layer, int mb, CommKind kind, Collective c,
                   GroupKind g, double size) const;
  /// Appends the cast of a `rows` x `cols` BF16 tensor to the recipe's rowwise and
  /// columnwise copies (BlockContext::gemm).
  void quantize(const char* name, Phase ph, int layer, int mb, double rows, double cols);
  bool weight_part_ = false;
  /// The forward GEMM input cast last (layer, micro-batch, phase, chunk, rows, cols): a
  /// GEMM reading the same input does not cast it again.
  std::tuple<int, int, int, int, double, double> last_cast_{-1, -1, -1, -1, 0.0, 0.0};
};

template <class Dgrad, class Wgrad>
void BlockContext::column_parallel_backward(int layer, int mb, BackwardPart part, Dgrad dgrad, Wgrad wgrad,
                                            double width) {
  const Phase ph = Phase::backward;
  const char* reduce_name = sp_on ? "tp_reducescatter" : "tp_allreduce";
  const Collective reduce_c = sp_on ? Collective::ReduceScatter : Collective::AllReduce;
  const double act = kAct * b * s * (width > 0 ? width : h);
  switch (part) {
    case BackwardPart::full: {
      int regather = -1;
      if (sp_on)
        regather = issue("tp_allgather_input", ph, layer, mb, CommKind::TP, Collective::AllGather, GroupKind::TP, act);
      dgrad();
      wait(regather, CommKind::TP, layer, mb, ph);
      const int reduce = issue(reduce_name, ph, layer, mb, CommKind::TP, reduce_c, GroupKind::TP, act);
      wgrad();
      wait(reduce, CommKind::TP, layer, mb, ph);
      return;
    }
    case BackwardPart::input:
      dgrad();
      collective(reduce_name, ph, layer, mb, CommKind::TP, reduce_c, GroupKind::TP, act);
      return;
    case BackwardPart::weight:
      if (sp_on) collective("tp_allgather_input", ph, layer, mb, CommKind::TP, Collective::AllGather, GroupKind::TP, act);
      wgrad();
      return;
  }
}

}  // namespace dtsim::blocks
