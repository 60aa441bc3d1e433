#pragma once
// Precision recipes (training.precision): which GEMMs run at which tensor-core rate, the
// quantize kernels a recipe adds and their HBM bytes, and the memory it changes. Every
// consumer (plan ops, GEMM timing, memory, ZeRO parameter gathers, MFU) reads these facts.
//
// Recipes (names as training.precision takes them; Megatron-Core's flags beside them,
// megatron/core/transformer/transformer_config.py fp8 / fp8_recipe / fp4 / fp4_recipe,
// megatron/core/enums.py Fp8Recipe / Fp4Recipe):
//   bf16         every GEMM in BF16 (no --fp8-format).
//   fp8-delayed  --fp8-format hybrid --fp8-recipe delayed: Transformer Engine DelayedScaling,
//                one FP32 scale per tensor from the amax history of earlier steps; the
//                cast computes the amax it records in the same pass.
//   fp8-current  --fp8-recipe tensorwise: TE Float8CurrentScaling, the scale from this
//                tensor's own amax: one extra read of the tensor before the cast.
//   fp8-block    --fp8-recipe blockwise: TE Float8BlockScaling, DeepSeek-V3's fine-grained
//                quantization (arXiv 2412.19437 Sec 3.3.2): 1x128 tiles of activations and
//                gradients, 128x128 blocks of weights, FP32 scales; on Hopper the scales are
//                applied outside the MMA ("promotion to CUDA cores" every 128 elements, same
//                section), which the paper's FP8 GEMMs overlap with the next WGMMA.
//   mxfp8        --fp8-recipe mxfp8: TE MXFP8BlockScaling, OCP Microscaling FP8 (E4M3),
//                one E8M0 (1-byte) scale per 32 elements applied inside the tensor core
//                (Blackwell: needs GpuSpec::microscaling).
//   nvfp4        --fp4-format e2m1 --fp4-recipe nvfp4: TE NVFP4BlockScaling (arXiv 2509.25149;
//                TE docs/features/low_precision_training/nvfp4/nvfp4.rst): E2M1 values, one
//                E4M3 (1-byte) scale per 16 elements (16x16 blocks for weights) and an FP32
//                per-tensor scale from the tensor's amax (an extra read), Fprop, Dgrad and
//                Wgrad GEMMs at the FP4 rate; needs FP4 tensor cores (GpuSpec::peak_fp4_flops).
// training.dtype is kept as an alias: bf16 = bf16, fp8 = fp8-delayed.
//
// What stays in BF16 under every recipe (Megatron-Core with Transformer Engine): the
// attention core (fp8_dot_product_attention false by default), the LM head (GPTModel's
// output_layer is tensor_parallel.ColumnParallelLinear, not a TE module, so fp8_autocast does
// not reach it: megatron/core/models/gpt/gpt_model.py), the router (TopKRouter's
// torch.nn.functional.linear: megatron/core/transformer/moe/router.py), the embedding, and
// with first_last_layers_bf16 the first num_layers_at_start_in_bf16 and last
// num_layers_at_end_in_bf16 decoder layers (transformer_config.py; TransformerBlock runs them
// outside the FP8/FP4 context, megatron/core/transformer/transformer_block.py).
//
// Quantize kernels (TE, each low-precision linear layer): the input X of a forward GEMM is
// cast once per micro-batch (rowwise for Fprop and columnwise for Wgrad: Hopper FP8 GEMMs take
// only the TN layout and MX scales run along one direction, so both copies are written); the
// output gradient dY of a Dgrad GEMM is cast rowwise and columnwise (for the Wgrad); weights
// are cast once per step (TE caches them across micro-batches: Megatron sets
// is_first_microbatch, megatron/core/transformer/module.py / TE module/base.py), counted with
// the optimizer step. Memory: the Wgrad keeps the columnwise quantized input instead of its
// BF16 copy (TE linear.py saves the quantized inputmat), each low-precision weight holds its
// rowwise and columnwise quantized copies through the step, and with fp8_param_gather
// (Megatron --fp8-param-gather / --fp4-param-gather) the model weights themselves are stored
// and all-gathered quantized (fp8_utils.py quantize_param_shard) instead of in BF16.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "models/experiment.hpp"

namespace dtsim {

struct PrecisionRecipe {
  Precision id = Precision::bf16;
  const char* name = "";
  /// Megatron-LM flags selecting it.
  const char* megatron = "";
  /// Input dtype of the low-precision linear GEMMs (bf16 for the bf16 recipe).
  Dtype gemm_dtype = Dtype::bf16;
  /// Bytes per quantized element: 1 (FP8 E4M3/E5M2), 0.5 (FP4 E2M1); 2 for bf16.
  double element_bytes = 2.0;
  /// Elements per scale of activations / gradients (1xN tiles); 0 = one scale per tensor.
  double block = 0;
  /// Elements per scale of weights: 128 x 128 (fp8-block), 16 x 16 (nvfp4), else `block`.
  double weight_block = 0;
  /// Bytes per scale: 4 (FP32: per-tensor and fp8-block), 1 (E8M0 mxfp8, E4M3 nvfp4).
  double scale_bytes = 4.0;
  /// A separate read of the tensor for its amax before the cast (current scaling; NVFP4's
  /// per-tensor second-level scale): one more kernel reading the BF16 tensor.
  bool amax_pass = false;
  /// The tensor core must apply block scales (OCP MX / NVFP4).
  bool needs_microscaling = false;
  /// The recipe's source (recipe class of Transformer Engine, paper).
  const char* source = "";

  bool low_precision() const { return gemm_dtype != Dtype::bf16; }
  /// Bytes per element of one quantized copy of an activation or gradient, its scales
  /// included.
  double activation_copy_bytes() const;
  /// Bytes per element of one quantized copy of a weight, its scales included.
  double weight_copy_bytes() const;
};

/// The recipe `p`.
const PrecisionRecipe& precision_recipe(Precision p);
/// The recipe named `name` (case-sensitive, as the YAML key takes it), or nullptr.
const PrecisionRecipe* find_precision(std::string_view name);
/// Every recipe name, in registry order (for error messages and `dtsim presets`).
std::vector<std::string> precision_names();

/// Whether decoder layer `layer` (0-based; MTP depths count as layers >= model.layers and
/// follow the last layer) runs its linear GEMMs in the recipe's low precision: false for
/// bf16, and for the first / last layers that first_last_layers_bf16 keeps in BF16.
bool layer_low_precision(const Training& t, int64_t layers, int64_t layer);

/// Fraction of the model's decoder layers in the recipe's low precision (1 without
/// first_last_layers_bf16; 0 for bf16).
double low_precision_layer_fraction(const Training& t, int64_t layers);

/// GEMM weights (elements) of one rank of pipeline rank `stage` in low-precision layers, which
/// the recipe casts once per step and keeps quantized copies of: each low-precision layer's
/// TP-sharded linear weights / tp (`dense`) and its routed experts' / (ep etp) (`expert`),
/// MTP depths' layers included on the loss rank (models/flops.hpp stage_layer_kinds). The
/// TP-replicated weights (norms, router, MLA's down projections) are left in BF16 here.
/// Zero for bf16. Throws as stage_layer_kinds.
struct QuantizedWeights {
  double dense = 0;
  double expert = 0;
  double total() const { return dense + expert; }
};
QuantizedWeights stage_quantized_weights(const Experiment& e, int64_t stage);

/// Fraction of pipeline rank `stage`'s layers (MTP depths included on the loss rank) in the
/// recipe's low precision; 0 for bf16 or a rank without layers.
double stage_low_precision_fraction(const Experiment& e, int64_t stage);

/// Bytes of a parameter AllGather of `params` elements of which `quantized` are GEMM weights
/// of low-precision layers: with fp8_param_gather those travel at the recipe's weight bytes
/// (Megatron --fp8-param-gather: the distributed optimizer gathers the FP8 model weights),
/// the rest in BF16; without it all in BF16.
double param_gather_bytes(const Training& t, double params, double quantized);

/// HBM bytes of the recipe's once-per-step weight casts on one rank (models/plan.cpp
/// weight_quantize): each of the `quantized` low-precision GEMM weights read in BF16 and
/// written rowwise and columnwise; with fp8_param_gather the optimizer writes the `owned`
/// shard quantized from its FP32 main parameters (Megatron fp8_utils.py quantize_param_shard)
/// and every weight's columnwise copy is written from the gathered rowwise one. 0 when none.
double weight_quantize_bytes(const Training& t, double quantized, double owned);

/// Dense tensor-core rate of a GEMM with `dtype` inputs on `gpu`, FLOP/s (peak_bf16 /
/// peak_fp8 / peak_fp4; input checks make sure the GPU has the rate a recipe needs).
double gemm_peak_flops(const GpuSpec& gpu, Dtype dtype);

/// Peak the MFU of a step is measured against: the rate of the recipe's GEMM dtype (as
/// the engines report MFU against the FP8 peak for FP8 runs), FLOP/s.
double mfu_peak_flops(const GpuSpec& gpu, const Training& t);

/// Problems of the recipe against the GPU (a recipe the GPU lacks names both), the
/// options that need a low-precision recipe, and the BF16 layer counts. Empty when fine.
std::vector<std::string> precision_problems(const Training& t, const GpuSpec& gpu, int64_t layers);

}  // namespace dtsim
