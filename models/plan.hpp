#pragma once
// StepPlan: the contract between the models and the engines.
//
// One training step is described per pipeline stage, because every rank of a stage runs
// the same sequence of operations (only the groups it talks to differ; the engine
// resolves those from the RankGrid). A stage's plan is the ordered op list of its
// compute stream; asynchronous collectives are handed to per-kind communication streams
// (`issue`) and joined later (`wait`).
//
// Rules follow ../shared/design/MATH.md (carried here):
//  - TP: column-parallel QKV / MLP-up, row-parallel out-proj / MLP-down; forward SUM of
//    partial outputs (AllReduce, or ReduceScatter with sequence parallel), backward SUM
//    of input grads; never divided by TP. (Shoeybi 2019 Sec 3; Korthikanti 2022 Sec 4.2)
//  - CP: K/V blocks circulate around the CP ring (AllGather volume) in forward; in
//    backward K/V again and dK/dV summed back at their owners (ReduceScatter volume).
//  - PP: activations forward, activation grads backward, P2P between neighbouring
//    stages, 1F1B schedule (Narayanan 2021 Sec 2.2.1).
//  - DP: gradients reduced over the DP x CP group (ranks holding the same weights)
//    once per step (ZeRO-0: AllReduce; ZeRO-1: ReduceScatter then parameter AllGather
//    after the optimizer), or in every micro-batch's backward (ZeRO-2: ReduceScatter of
//    each bucket, then the parameter AllGather; ZeRO-0/1 with reduce_every_micro_batch);
//    ZeRO-3: parameter AllGather per layer in forward and backward, gradient
//    ReduceScatter per layer and micro-batch. GradSyncPolicy below is that rule.
//  - Adam runs after gradient sync.
#include <cstdint>
#include <string>
#include <map>
#include <vector>

#include "models/calibration/profile.hpp"
#include "models/experiment.hpp"
#include "models/rank_grid.hpp"

namespace dtsim {

/// EP: the MoE token dispatch / combine AllToAll over the expert-parallel group and the
/// expert-TP gathers around the expert GEMMs (models/blocks/moe.hpp); DP also carries the
/// expert gradients' reduction over the expert-data-parallel group.
enum class CommKind { TP = 0, CP = 1, PP = 2, DP = 3, EP = 4 };
inline constexpr int kCommKinds = 5;
const char* to_string(CommKind);

/// AllToAll: the MoE token dispatch and combine, a permutation of tokens between ranks (no
/// reduction: ReduceOp::none; nccl-tests size = the rank's send buffer).
enum class Collective { AllReduce, ReduceScatter, AllGather, AllToAll };
const char* to_string(Collective);

/// Reduce operation of a collective (MATH.md section 2): TP partial outputs and input
/// grads are SUMmed, never divided by TP; CP dK/dV are SUMmed at their owners; DP
/// gradients are AVeraGed (equal-size local means; with unequal valid tokens, a SUM of
/// token sums divided by the global count, which the verifier checks); the loss's logit
/// maximum is a MAX. AllGather: none.
enum class ReduceOp { none, sum, avg, max };
const char* to_string(ReduceOp);
/// SUM for TP/CP/PP reductions, AVG for DP gradients, none for AllGather.
ReduceOp reduce_op_for(CommKind kind, Collective c);

enum class Phase { forward, backward, recompute, optimizer };
const char* to_string(Phase);

/// Which part of a layer's (or the embedding's / head's) backward the builder emits. The
/// zero-bubble schedules (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR 2024,
/// Sec 2) split the backward into B, the gradient w.r.t. the layer's input, which the
/// previous pipeline stage waits for, and W, the gradients w.r.t. the weights, which
/// nothing downstream needs until the optimizer and which the schedule may defer.
///  - full: today's fused backward, ops in Megatron-LM's order (B and W interleaved, the
///    TP input-gradient reduction overlapped with the weight-gradient GEMM).
///  - input (B): every op that produces the input gradient: dgrad GEMMs, attention core
///    backward, element-wise and norm backward, and the TP / CP collectives on activations
///    and their gradients. The TP reduction of a column-parallel input gradient is a
///    blocking collective: with W deferred no GEMM is left to hide it.
///  - weight (W): the weight-gradient GEMMs (*_wgrad) and the embedding's scatter-add,
///    with what they alone need: with sequence parallelism the re-gather of the
///    column-parallel GEMM's input (blocking) and, for the embedding, the TP AllGather of
///    its output gradient.
/// Split as sail-sg/zero-bubble-pipeline-parallelism splits Megatron-LM (commit 39f2c18,
/// megatron/core/tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication
/// .backward with WeightGradStore.split_bw(): B runs the dgrad and the input-gradient
/// AllReduce / ReduceScatter with async_op=False; the SP input all-gather (pre_process) and
/// the wgrad GEMM are stored and run together in W, megatron/core/zbpp_utils.py
/// WeightGradStore.pop: func(*pre_func(async_op=False))). input + weight emit the same
/// compute ops as full (tests/unit/test_plan.cpp checks it).
enum class BackwardPart { full, input, weight };
const char* to_string(BackwardPart);

/// The pass of the zero-bubble schedules an op belongs to (Qi et al. 2024 Sec 2): F the
/// forward (and recomputed forward), B the backward, fused or its input part
/// (BackwardPart::full / input), W the weight-gradient part of a split backward
/// (BackwardPart::weight). W ops keep Phase::backward, so no consumer of Phase changes
/// meaning; Phase::optimizer ops carry F (they belong to no pass).
enum class Pass : uint8_t { F, B, W };
const char* to_string(Pass);

enum class OpType {
  compute,     // a GPU kernel (or fused run of kernels): time_s on the compute stream
  collective,  // blocking collective: the compute stream waits for it
  issue,       // asynchronous collective handed to the stream of its kind
  wait,        // compute stream waits until collective `handle` completed
  send,        // P2P send to the next (forward) or previous (backward) stage, async
  recv,        // P2P receive from the previous (forward) or next (backward) stage
};

enum class Direction { forward, backward };

/// What kind of kernel a compute op is; the cost model times each kind differently.
enum class KernelKind { gemm, attention, memory, optimizer };

/// Which gradients a DP gradient collective (dp_grad_allreduce / dp_grad_reducescatter)
/// carries. `ready`: the stage's gradients that are complete and not reduced yet (buckets
/// fill in backward order), except a parameter that has a bucket of its own;
/// `tied_embedding`: only the tied word embedding (first stage) or the last stage's copy
/// of it. With sharded gradients (ZeRO >= 1) Megatron-Core gives the shared embedding a
/// bucket of its own so that both stages shard it alike and embedding_grad_allreduce can
/// follow the ReduceScatter (megatron/core/distributed/param_and_grad_buffer.py,
/// _does_param_require_new_bucket).
enum class GradBucket : uint8_t { ready, tied_embedding };

struct Op {
  OpType type = OpType::compute;
  const char* name = "";  // static string: "qkv", "tp_allreduce", ...
  Phase phase = Phase::forward;
  Pass pass = Pass::F;        // zero-bubble pass (F, B or W); see Pass
  int32_t layer = -1;         // global layer index, -1 for embedding/head/optimizer
  int32_t micro_batch = -1;

  // compute
  KernelKind kernel = KernelKind::memory;
  double flops = 0;       // FLOPs executed by this rank
  double bytes = 0;       // HBM bytes moved by this rank
  double time_s = 0;      // filled by the compute cost model
  calib::TimeSource time_source = calib::TimeSource::roofline;  // where time_s came from
  int32_t kernels = 1;    // kernel launches this op stands for
  /// GEMM ops (kernel == gemm): the (m x k) @ (k x n) shape and operand layout the block
  /// declared (models/blocks/block_context.hpp BlockContext::gemm); the wave-fill model and
  /// calibration (models/calibration/plan_kernels.hpp kernel_for_op) read it. Zero otherwise.
  /// gemm.dtype is left bf16: kernel_for_op takes training.dtype for a linear-layer GEMM
  /// (gemm_linear) and bf16 for the others (the unfused attention GEMMs).
  calib::GemmShape gemm;
  bool gemm_linear = false;
  /// A grouped GEMM (the routed experts'): the number of GEMMs, one per local expert, that
  /// `gemm` is the sum of; 1 = a single GEMM. The experts share the token rows: m of a
  /// forward or input-gradient GEMM, k (the reduction over tokens) of a weight gradient
  /// (gemm_group_split_k). Kernel tables time it as gemm_groups GEMMs of ceil(rows /
  /// gemm_groups) rows each (kernel_for_op); the roofline as one GEMM of the whole shape.
  int32_t gemm_groups = 1;
  bool gemm_group_split_k = false;

  // collective / issue / wait
  CommKind kind = CommKind::TP;
  Collective collective = Collective::AllReduce;
  ReduceOp reduce = ReduceOp::none;
  GroupKind group = GroupKind::TP;
  /// nccl-tests "size": the full buffer in bytes (AllReduce: the tensor; ReduceScatter:
  /// the input, i.e. n x output; AllGather: the output, i.e. n x input). Send/recv: the
  /// message size.
  double size_bytes = 0;
  int32_t handle = -1;    // issue/wait pairing, unique within a stage
  GradBucket grad_bucket = GradBucket::ready;  // DP gradient collectives: what they carry
  /// TP communication overlap (training.tp_comm_overlap: Transformer Engine userbuffers,
  /// Megatron-Core --tp-comm-overlap; TE pytorch/module/base.py initialize_ub defaults). 0 =
  /// none. Otherwise this blocking TP collective carries a handle and is pipelined with
  /// its neighbouring GEMM in `overlap_splits` chunks; the numbers the ops compute do not
  /// change, only when they run:
  ///  - AllGather ("ring_exchange", splits = TP): the NEXT op (a GEMM) multiplies the local
  ///    chunk while the others arrive by peer-to-peer copies (copy engines: no SMs taken).
  ///    Engines: issue the AllGather, run (n-1)/n of the GEMM, wait, run the last 1/n, i.e.
  ///    t = g + max((n-1) g, C) with g = G/n: the closed form of the n-chunk pipeline.
  ///  - ReduceScatter ("pipeline", splits = 4): the PREVIOUS op (a GEMM) runs in chunks and
  ///    each chunk's output is reduce-scattered while the next chunk computes (SM-based
  ///    kernels: the comm_interference slowdown applies). Engines: run G/m, issue a
  ///    ReduceScatter of (m-1)/m of the buffer, run (m-1)/m of the GEMM, wait, then a
  ///    blocking ReduceScatter of the last 1/m (m-1 chunk collectives counted as one:
  ///    their latency once).
  ///  - wait of the CP K/V AllGather (ring attention, splits = CP > 2): the NEXT compute op
  ///    after it (skipping the issue of the dK/dV ReduceScatter in backward) holds the
  ///    cp - 1 remote blocks; block i runs while block i + 1 arrives. Engines: run
  ///    (cp - 2)/(cp - 1) of it, wait, run the last block, i.e.
  ///    t = max((cp - 2) g, C - local) + g with g = one block.
  int32_t overlap_splits = 0;
  /// SMs this collective's kernel holds while it runs, taken from the compute beside it
  /// (models/compute_cost.hpp comm_overlap_speed). 0: an NCCL kernel (kNcclBlocks); the EP
  /// AllToAll of the deepep / hybridep dispatchers: training.moe_deepep_num_sms /
  /// moe_hybridep_num_sms.
  int32_t comm_sms = 0;
  /// Parameter gathers (dp_param_allgather / edp_param_allgather before a forward): the
  /// consecutive layers from `layer` whose parameters it carries; 0 means the one layer
  /// (a whole model chunk under Megatron's aligned interleaved gathers, models/plan.cpp).
  int32_t gather_layers = 0;
  /// Parameter gathers under a per-module ZeRO-3 (DeepSpeed, models/zero3.hpp): the op stands
  /// for this many AllGathers back to back, of size_bytes / gather_parts each; both engines
  /// time them so. 0 or 1: one collective.
  int32_t gather_parts = 0;

  /// Host dispatch (models/host_dispatch.hpp assign_host_dispatch, after the plan is built):
  /// the host CPU seconds the rank's launching thread spends on this op before its kernels
  /// can start (cluster.host_dispatch per eager launch; one launch per CUDA graph replay,
  /// 0 for the other ops of a captured graph). The engines run a host clock through the
  /// rank's ops in program order that never waits for the GPU: an op starts no earlier than
  /// the host has dispatched it (host-bound time, StageResult::host_bound_s).
  double host_s = 0;
  /// CUDA graph the builder emitted this op inside (training.cuda_graphs): a capture
  /// region id unique within the stage, -1 = launched eagerly.
  int32_t graph = -1;
  /// Shapes that depend on the routing of this micro-batch (a dropless MoE layer's token
  /// permutation, expert GEMMs and AllToAlls): cannot be captured in a CUDA graph
  /// (Megatron-Core CudaGraphModule.moe is for drop-and-pad layers only), launched eagerly.
  bool dynamic_shape = false;
  /// The host waits here for the GPU to finish the ops before this one (a device-to-host
  /// read the next launches depend on): Megatron-Core's alltoall token dispatcher copies
  /// the tokens-per-expert counts to the host and synchronises once per MoE layer forward
  /// (moe/token_dispatcher.py MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize, at
  /// cuda_sync_point "before_ep_alltoall"), unless the routing is drop-and-pad; none in
  /// backward (the split sizes are reused). models/host_dispatch.hpp. On a wait it also
  /// waits for the awaited work (a side stream's synchronize(): DeepSpeed ZeRO-3's reduce
  /// stream at the end of each backward, models/zero3.hpp).
  bool host_sync = false;

  Direction dir = Direction::forward;  // send/recv
  int32_t peer_stage = -1;  // send/recv: pipeline rank at the other end
  int32_t peer_chunk = -1;  // send/recv: model chunk at the other end (its mailbox)
  int32_t chunk = 0;        // model chunk (virtual stage index on this rank; 0 without VP)
};

struct StagePlan {
  int64_t stage = 0;
  int64_t first_layer = 0;
  int64_t layers = 0;
  std::vector<Op> ops;
  int32_t handles = 0;             // number of issue handles used
  double params_per_rank = 0;      // elements, before ZeRO sharding
  double grad_sync_bytes = 0;      // bytes this rank contributes to DP gradient sync
  double optimizer_params = 0;     // elements the rank's optimizer updates
};

/// When a step's data-parallel gradient sync runs and what each rank keeps: the one fact
/// that the plan builder emits its DP gradient collectives from, that the memory model
/// (models/memory.cpp) sizes the gradient and optimizer states from, and that the analytic
/// engine and the verifier execute. It follows from the layout and training alone, so the
/// memory-only path of a sweep reads it without building a plan.
///  - collective: AllReduce with ZeRO-0, else a ReduceScatter to each shard's owner.
///  - every_micro_batch: each micro-batch's gradients are reduced in its own backward.
///    Always with ZeRO-2 and ZeRO-3, whose sharded gradients have nowhere to accumulate
///    otherwise: DeepSpeed's engine "communicates during non gradient accumulation
///    boundaries as well" when partition_gradients (deepspeed/runtime/engine.py
///    allreduce_gradients), and its ZeRO optimizer reduces each filled bucket in every
///    backward (deepspeed/runtime/zero/stage_1_and_2.py reduce_ready_partitions_and_remove_grads:
///    `if self.partition_gradients or self.is_gradient_accumulation_boundary()`); FSDP's
///    SHARD_GRAD_OP / FULL_SHARD and Megatron-FSDP's optim_grads likewise. ZeRO-0/1: only
///    with training.reduce_every_micro_batch, else on the last micro-batch (Megatron DDP and
///    distributed optimizer, DeepSpeed "Communicate only at gradient accumulation
///    boundaries", same function).
///  - sharded_grads: between micro-batches a rank keeps only the 1/N gradient shard it owns
///    (ZeRO-2: reduce_ipg_grads clears the gradients of the other partitions and copies its
///    own into the partition, copy_grads_in_partition; ZeRO-3 alike). Requires
///    every_micro_batch and a ReduceScatter. ZeRO-0/1 keep the whole gradient buffer.
///  - sharded_optimizer (ZeRO >= 1): a rank updates only its shard, so the updated
///    parameters are gathered after the optimizer (or per layer ahead of use).
///  - sharded_params (ZeRO-3): parameters gathered per layer in forward and backward, and
///    gradients reduce-scattered per layer (per_layer; models/zero3.hpp per framework).
/// With dp * cp == 1 there is no sync (`reduced` false) and N = 1 shards nothing.
struct GradSyncPolicy {
  bool reduced = false;     // dp * cp > 1
  int64_t group = 1;        // N = dp * cp: ranks holding the same weights
  Collective collective = Collective::AllReduce;
  bool every_micro_batch = false;
  bool per_layer = false;
  bool sharded_grads = false;
  bool sharded_optimizer = false;
  bool sharded_params = false;
};
GradSyncPolicy grad_sync_policy(const Layout& l, const Training& t);
inline GradSyncPolicy grad_sync_policy(const Experiment& e) { return grad_sync_policy(e.layout, e.training); }

/// Gradient elements per DP bucket (a bucket is reduced when full): training.grad_bucket /
/// grad bytes when given, else the framework's default: DeepSpeed's reduce_bucket_size, 5e8
/// elements (deepspeed/runtime/zero/config.py), otherwise Megatron-Core's max(40M, 1M x DP)
/// (megatron/core/distributed/distributed_data_parallel.py). The plan, the analytic engine
/// and the memory model read this one rule.
double grad_bucket_params(const Layout& l, const Training& t);

/// Sizes that the plan builder derives once from an experiment.
struct PlanShape {
  int64_t micro_batches = 0;   // gradient accumulation steps (per DP rank)
  int64_t tokens_local = 0;    // s / CP: query tokens per rank per sequence
  int64_t grad_bytes_per_param = 4;  // bytes per gradient element reduced over DP
  double ddp_bucket_params = 0;      // elements per DDP bucket
};

struct StepPlan {
  Experiment exp;
  PlanShape shape;
  std::vector<StagePlan> stages;
};

/// Builds the plan of one training step and times every compute op with the roofline
/// cost model (models/compute_cost.hpp). Throws InputError when the experiment is
/// invalid (validate_experiment).
StepPlan build_step_plan(const Experiment& exp);

/// Compute ops of `plan` per calib::TimeSource (to_string name), over every stage; sources
/// with no op are left out. StepResult::time_sources.
std::map<std::string, int64_t> time_source_counts(const StepPlan& plan);

/// The ops of one backward part (BackwardPart) of layer 0, of the head and of the
/// embedding for micro-batch 0, as build_step_plan emits them on stage 0 (the head as if
/// stage 0 held it): what a zero-bubble schedule's B and W of one layer cost, and what
/// tests/unit/test_plan.cpp checks the split against. Throws InputError as build_step_plan.
struct BackwardPartOps {
  std::vector<Op> layer, head, embedding;
};
BackwardPartOps backward_part_ops(const Experiment& exp, BackwardPart part);

/// Bytes of a message carried by each ring edge and the number of latency steps of a
/// ring collective over n ranks on a buffer of `size_bytes` (nccl-tests convention):
/// AllReduce 2(n-1)/n S over 2(n-1) steps; ReduceScatter and AllGather (n-1)/n S over
/// n-1 steps (Patarasuk & Yuan 2009; NCCL ring algorithm). n == 1 -> {0, 0}.
struct RingCost {
  double edge_bytes = 0;
  int64_t steps = 0;
};
RingCost ring_cost(Collective c, int64_t n, double size_bytes);

/// Total FLOPs the plan executes on all ranks of one step (sum over stages of rank FLOPs
/// times ranks per stage). Used to cross-check the plan against models/flops.hpp.
double plan_executed_flops(const StepPlan& plan);

/// An upper bound of the operations build_step_plan emits over all stages, computed
/// without building the plan (experiment validation refuses a plan above
/// models/checked.hpp limits::kMaxPlanOps before any work): micro-batches per step x
/// (layers x kPlanOpsPerLayer + pp x vp x kPlanOpsPerChunk) + pp x kPlanOpsPerStage +
/// layers x kPlanOpsPerLayer, with layers = model.layers + 2 x model.mtp_layers (an MTP depth:
/// a layer, its entry and its own head and loss). Checked arithmetic: INT64_MAX when it does
/// not fit. tests/unit/test_bounds.cpp checks it against the built plans of every shipped experiment.
int64_t plan_op_bound(const Experiment& exp);
/// Ops per layer and micro-batch: forward, recomputed forward and backward of one block,
/// with TP / CP / ZeRO-3 collectives, their waits and the DP bucket collectives (the
/// builder emits at most about 70; see layer_forward / layer_backward).
inline constexpr int64_t kPlanOpsPerLayer = 96;
/// Ops per model chunk and micro-batch outside the layers: embedding, head and loss,
/// pipeline sends and receives with their gathers.
inline constexpr int64_t kPlanOpsPerChunk = 48;
/// Ops per stage and step: flushes, waits, embedding / SP gradient reductions, optimizer,
/// parameter gathers.
inline constexpr int64_t kPlanOpsPerStage = 64;

}  // namespace dtsim
