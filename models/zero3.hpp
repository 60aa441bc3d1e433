#pragma once
// ZeRO-3 as each framework runs it (layout.zero_stage 3, training.framework): how a layer's
// sharded parameters are gathered before use and its gradients reduce-scattered to their
// owners. The plan builder emits its DP-stream ops from this policy (models/plan.cpp), the
// analytic engine times the same ops in closed form (sim/analytic_engine.cpp), the memory
// model sizes the gathered parameters from it (models/memory.cpp) and the verifier keeps the
// layers it keeps (models/verify). One fact, four readers.
//
// Framework behaviour, from each framework's source (the readings are cited per field):
//  - megatron (Megatron-FSDP, data_parallel_sharding_strategy optim_grads_params) and fsdp
//    (PyTorch FSDP2, fully_shard per transformer layer): one unit per transformer layer, one
//    AllGather of all its parameters (Megatron-FSDP: fsdp_unit_modules = TransformerLayer,
//    megatron/core/distributed/fsdp/mcore_fsdp_adapter.py, one _coalescing_manager batch per
//    unit; FSDP2: FSDPParamGroup, one all_gather_into_tensor in foreach_all_gather,
//    torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py), the next unit's gather issued
//    while the current one computes, re-gathered in backward (reshard_after_forward true for
//    non-root units), one ReduceScatter per unit and micro-batch.
//  - fsdp adds what FSDP2 runs on the compute stream around each collective
//    (_fsdp_collectives.py): the copy-out of the gathered flat buffer into the parameters
//    after every gather (foreach_all_gather_copy_out: split_with_sizes_copy), the chunk_cat
//    copy-in of the unsharded gradients before every ReduceScatter (foreach_reduce), and
//    post_backward's wait for the previous unit's ReduceScatter before the next is issued
//    (_fsdp_param_group.py post_backward: current_stream().wait_event on the previous
//    reduce-scatter state's event).
//  - deepspeed (DeepSpeed ZeRO stage 3, deepspeedai/DeepSpeed @edaa7221): hooks on every
//    module gather that module's direct parameters (parameter_offload.py
//    _register_deepspeed_module, partitioned_param_coordinator.py fetch_sub_module), one
//    coalesced all_gather_into_tensor per fetch (partition_parameters.py
//    _all_gather_coalesced); in the steady state each fetch takes one module's parameters, so
//    a layer's gather is one AllGather per linear module (BlockParams::linear_modules; the
//    norms and biases fall under stage3_param_persistence_threshold, 1e5 elements, and stay
//    gathered: counted with the layer's bytes here, a few thousand elements). A parameter used
//    again within stage3_max_reuse_distance elements of the module trace is not released
//    (__params_to_release), so the last layers of the forward stay gathered into the
//    backward (zero3_kept_layers). Every backward ends with
//    reduce_and_partition_stream.synchronize() (stage3.py
//    independent_gradient_partition_epilogue): the compute stream and the host wait for the
//    last gradient ReduceScatter. DeepSpeed fills reduce_bucket_size buckets (5e8 elements,
//    __reduce_and_partition_ipg_grads) and partitions each parameter on its own
//    (reduce_scatter_coalesced interleaves the bucket's parameters by rank); dtsim reduces
//    per layer, which moves the same bytes to the same owners (the verifier, models/verify,
//    splits a ReduceScatter's buffer into contiguous shards, so a bucket spanning layers
//    would hand elements to other owners than the per-layer gathers) with one collective per
//    layer instead of one per 5e8 elements: more latency terms at small layers.
#include <cstdint>

#include "models/experiment.hpp"

namespace dtsim {

/// The ZeRO-3 behaviour of an experiment's framework (all false unless layout.zero_stage is 3).
struct Zero3Policy {
  bool on = false;             // layout.zero_stage == 3
  bool per_module = false;     // deepspeed: one AllGather per linear module (Op::gather_parts)
  bool copy_kernels = false;   // fsdp: copy-out after each gather, chunk_cat before each ReduceScatter
  bool reduce_waits_previous = false;  // fsdp: a unit's ReduceScatter waits for the previous one's
  bool backward_end_sync = false;  // deepspeed: the host waits for the reduce stream after each backward
};
Zero3Policy zero3_policy(const Layout& l, const Training& t);
inline Zero3Policy zero3_policy(const Experiment& e) { return zero3_policy(e.layout, e.training); }

/// AllGathers, back to back on the DP stream, that gather one layer of kind `kind`
/// (blocks::LayerKind): {dense over DP x CP, routed experts over EDP}. 1 each unless the
/// policy gathers per module (then BlockParams::linear_modules / expert_linear_modules, at
/// least 1). The op keeps the layer's whole size; the engines time `parts` collectives of
/// size / parts each (Op::gather_parts): the latency and per-collective cost of DeepSpeed's
/// module-by-module gathers, with module sizes taken equal.
struct GatherParts {
  int dense = 1;
  int expert = 1;
};
GatherParts zero3_gather_parts(const ModelSpec& m, const Layout& l, const Training& t, int kind);
inline GatherParts zero3_gather_parts(const Experiment& e, int kind) {
  return zero3_gather_parts(e.model, e.layout, e.training, kind);
}

/// DeepSpeed ZeRO-3: the trailing layers of stage `stage` whose parameters stay gathered from
/// their forward to their backward, so that the backward gathers them no more. Layer i is kept
/// when the parameter elements fetched between its two uses, the layers after it twice
/// (forward and backward) plus the LM head, are at most training.stage3_max_reuse_distance,
/// and the kept layers together fit training.stage3_max_live_parameters. Elements per rank
/// (a parameter's ds_numel is the TP rank's tensor). 0 for other frameworks and with
/// pipeline parallelism (refused with ZeRO-3 by DeepSpeed).
int64_t zero3_kept_layers(const ModelSpec& m, const Layout& l, const Training& t, int64_t stage);
inline int64_t zero3_kept_layers(const Experiment& e, int64_t stage) {
  return zero3_kept_layers(e.model, e.layout, e.training, stage);
}

/// Bytes FSDP2's copy-out moves after gathering `params` elements: it reads the gathered
/// 16-bit flat buffer and writes each parameter (split_with_sizes_copy), 2 x 2 bytes each.
double fsdp_copy_out_bytes(double params);
/// Bytes of FSDP2's chunk_cat before a ReduceScatter of `params` gradient elements of
/// `grad_bytes` each: it reads the unsharded gradients and writes the padded send buffer.
double fsdp_grad_copy_in_bytes(double params, double grad_bytes);

}  // namespace dtsim
