#include "models/precision.hpp"

#include <algorithm>

#include "models/blocks/layer.hpp"
#include "models/flops.hpp"
#include "models/pipeline_split.hpp"
#include "models/scalar_text.hpp"

namespace dtsim {

namespace {

// The registry: one row per recipe (sources in models/precision.hpp). Fields left out keep
// PrecisionRecipe's defaults (no block scaling, FP32 scales, no amax pass, no MX hardware).
const std::vector<PrecisionRecipe>& registry() {
  static const std::vector<PrecisionRecipe> v = {
      {.id = Precision::bf16,
       .name = "bf16",
       .megatron = "--bf16",
       .gemm_dtype = Dtype::bf16,
       .element_bytes = 2.0,
       .scale_bytes = 0,
       .source = "BF16 mixed precision (Megatron-LM --bf16)"},
      {.id = Precision::fp8_delayed,
       .name = "fp8-delayed",
       .megatron = "--fp8-format hybrid --fp8-recipe delayed",
       .gemm_dtype = Dtype::fp8,
       .element_bytes = 1.0,  // E4M3 / E5M2
       .block = 0,            // one FP32 scale per tensor, from the amax history
       .scale_bytes = 4.0,
       .amax_pass = false,  // the cast records this tensor's amax for later steps
       .source = "Transformer Engine recipe.DelayedScaling (Micikevicius et al. 2022, arXiv 2209.05433)"},
      {.id = Precision::fp8_current,
       .name = "fp8-current",
       .megatron = "--fp8-format hybrid --fp8-recipe tensorwise",
       .gemm_dtype = Dtype::fp8,
       .element_bytes = 1.0,
       .block = 0,
       .scale_bytes = 4.0,
       .amax_pass = true,  // amax of this tensor first (TE Float8CurrentScalingQuantizer)
       .source = "Transformer Engine recipe.Float8CurrentScaling"},
      {.id = Precision::fp8_block,
       .name = "fp8-block",
       .megatron = "--fp8-format e4m3 --fp8-recipe blockwise",
       .gemm_dtype = Dtype::fp8,
       .element_bytes = 1.0,
       .block = 128,                 // 1 x 128 activation / gradient tiles
       .weight_block = 128.0 * 128,  // 128 x 128 weight blocks
       .scale_bytes = 4.0,           // FP32 scales (DeepSeek-V3 Sec 3.3.2)
       .source = "DeepSeek-V3 fine-grained quantization (arXiv 2412.19437 Sec 3.3.2); Transformer Engine "
                 "recipe.Float8BlockScaling"},
      {.id = Precision::mxfp8,
       .name = "mxfp8",
       .megatron = "--fp8-format e4m3 --fp8-recipe mxfp8",
       .gemm_dtype = Dtype::fp8,
       .element_bytes = 1.0,
       .block = 32,  // OCP Microscaling Formats (MX) v1.0 spec: k = 32
       .weight_block = 32,
       .scale_bytes = 1.0,  // E8M0
       .needs_microscaling = true,
       .source = "OCP Microscaling Formats (MX) Specification v1.0 Sec 5 (MXFP8, block 32, E8M0 scale); "
                 "Transformer Engine recipe.MXFP8BlockScaling"},
      {.id = Precision::nvfp4,
       .name = "nvfp4",
       .megatron = "--fp4-format e2m1 --fp4-recipe nvfp4",
       .gemm_dtype = Dtype::fp4,
       .element_bytes = 0.5,       // E2M1
       .block = 16,                // 1 x 16 blocks
       .weight_block = 16.0 * 16,  // 16 x 16 weight blocks
       .scale_bytes = 1.0,         // E4M3 block scale (plus one FP32 per tensor)
       .amax_pass = true,          // the per-tensor FP32 scale needs the tensor's amax
       .needs_microscaling = true,
       .source = "NVIDIA, Pretraining LLMs with NVFP4 (arXiv 2509.25149 Sec 2-4); Transformer Engine "
                 "recipe.NVFP4BlockScaling (docs/features/low_precision_training/nvfp4/nvfp4.rst)"},
  };
  return v;
}

// Calls fn(global layer index) for every layer of pipeline rank `stage` over its chunks, then
// its MTP depths' layers (index layers + d) when it holds the loss (models/flops.hpp
// stage_layer_kinds counts the same layers).
template <class Fn>
void for_each_stage_layer(const ModelSpec& m, const Layout& l, int64_t stage, Fn fn) {
  for (int64_t c = 0; c < chunks_of(l); ++c) {
    const VirtualStage vs = virtual_stage(m.layers, l, virtual_stage_of(l, stage, c));
    for (int64_t i = 0; i < vs.layers; ++i) fn(vs.first_layer + i);
  }
  if (rank_split(m.layers, l, stage).loss)
    for (int64_t d = 0; d < m.mtp_layers; ++d) fn(m.layers + d);
}

}  // namespace

double PrecisionRecipe::activation_copy_bytes() const {
  return element_bytes + (block > 0 ? scale_bytes / block : 0.0);
}

double PrecisionRecipe::weight_copy_bytes() const {
  const double wb = weight_block > 0 ? weight_block : block;
  return element_bytes + (wb > 0 ? scale_bytes / wb : 0.0);
}

const PrecisionRecipe& precision_recipe(Precision p) {
  for (const auto& r : registry())
    if (r.id == p) return r;
  return registry().front();
}

const PrecisionRecipe* find_precision(std::string_view name) {
  for (const auto& r : registry())
    if (name == r.name) return &r;
  return nullptr;
}

std::vector<std::string> precision_names() {
  std::vector<std::string> out;
  for (const auto& r : registry()) out.emplace_back(r.name);
  return out;
}

bool layer_low_precision(const Training& t, int64_t layers, int64_t layer) {
  if (!precision_recipe(t.precision).low_precision()) return false;
  if (!t.first_last_layers_bf16) return true;
  // MTP depths (layer >= layers) run after the last decoder layer: Megatron keeps them
  // in the FP8 context of the MTP block; they follow the last layer's precision here.
  const int64_t i = std::min(layer, layers - 1);
  return i >= t.num_layers_at_start_in_bf16 && i < layers - t.num_layers_at_end_in_bf16;
}

double low_precision_layer_fraction(const Training& t, int64_t layers) {
  if (!precision_recipe(t.precision).low_precision() || layers <= 0) return 0.0;
  if (!t.first_last_layers_bf16) return 1.0;
  const int64_t bf16 = std::min(layers, t.num_layers_at_start_in_bf16 + t.num_layers_at_end_in_bf16);
  return static_cast<double>(layers - bf16) / static_cast<double>(layers);
}

QuantizedWeights stage_quantized_weights(const Experiment& e, int64_t stage) {
  QuantizedWeights out;
  const Training& t = e.training;
  if (!precision_recipe(t.precision).low_precision()) return out;
  const ModelSpec& m = e.model;
  const Layout& l = e.layout;
  const blocks::ModelBlocks mb(m);
  const double tp = static_cast<double>(l.tp), ex = static_cast<double>(l.ep * l.expert_tp());
  auto add = [&](int64_t layer) {
    if (!layer_low_precision(t, m.layers, layer)) return;
    const blocks::BlockParams p = mb.layer(layer).parameters(m);
    out.dense += p.sharded_weights / tp;
    out.expert += p.expert_weights / ex;
  };
  if (!t.first_last_layers_bf16 && !m.moe.enabled() && m.attention.window <= 0) {
    // Every layer alike and low precision: the stage's layer count (MTP depths included).
    const auto kinds = stage_layer_kinds(m, l, stage);
    int64_t n = 0;
    for (int64_t k : kinds) n += k;
    const blocks::BlockParams p = mb.layer(0).parameters(m);
    out.dense = static_cast<double>(n) * (p.sharded_weights / tp);
    out.expert = static_cast<double>(n) * (p.expert_weights / ex);
    return out;
  }
  for_each_stage_layer(m, l, stage, add);
  return out;
}

double stage_low_precision_fraction(const Experiment& e, int64_t stage) {
  const Training& t = e.training;
  if (!precision_recipe(t.precision).low_precision()) return 0.0;
  const ModelSpec& m = e.model;
  int64_t low = 0, all = 0;
  auto add = [&](int64_t layer) {
    ++all;
    if (layer_low_precision(t, m.layers, layer)) ++low;
  };
  for_each_stage_layer(e.model, e.layout, stage, add);
  return all > 0 ? static_cast<double>(low) / static_cast<double>(all) : 0.0;
}

double weight_quantize_bytes(const Training& t, double quantized, double owned) {
  if (quantized <= 0) return 0.0;
  constexpr double kBf16 = 2.0, kFp32 = 4.0;
  const double wq = precision_recipe(t.precision).weight_copy_bytes();
  return t.fp8_param_gather ? owned * (kFp32 + wq) + quantized * 2.0 * wq : quantized * (kBf16 + 2.0 * wq);
}

double param_gather_bytes(const Training& t, double params, double quantized) {
  constexpr double kBf16 = 2.0;
  if (!t.fp8_param_gather) return params * kBf16;
  return (params - quantized) * kBf16 + quantized * precision_recipe(t.precision).weight_copy_bytes();
}

double gemm_peak_flops(const GpuSpec& gpu, Dtype dtype) {
  switch (dtype) {
    case Dtype::fp8: return gpu.peak_fp8_flops > 0 ? gpu.peak_fp8_flops : gpu.peak_bf16_flops;
    case Dtype::fp4: return gpu.peak_fp4_flops > 0 ? gpu.peak_fp4_flops : gemm_peak_flops(gpu, Dtype::fp8);
    case Dtype::bf16: break;
  }
  return gpu.peak_bf16_flops;
}

double mfu_peak_flops(const GpuSpec& gpu, const Training& t) {
  return gemm_peak_flops(gpu, precision_recipe(t.precision).gemm_dtype);
}

std::vector<std::string> precision_problems(const Training& t, const GpuSpec& gpu, int64_t layers) {
  std::vector<std::string> out;
  const PrecisionRecipe& r = precision_recipe(t.precision);
  const std::string which = "training.precision=" + std::string(r.name);
  if (r.gemm_dtype == Dtype::fp8 && !(gpu.peak_fp8_flops > 0))
    out.push_back(which + " needs FP8 tensor cores, but cluster.gpu " + gpu.name + " has peak_fp8=0");
  if (r.gemm_dtype == Dtype::fp4 && !(gpu.peak_fp4_flops > 0))
    out.push_back(which + " needs FP4 tensor cores, but cluster.gpu " + gpu.name + " has peak_fp4=0");
  if (r.needs_microscaling && !gpu.microscaling)
    out.push_back(which + " needs tensor cores that apply block scales (microscaling), but cluster.gpu " + gpu.name +
                  " has microscaling=false");
  if (!r.low_precision()) {
    if (t.fp8_param_gather) out.push_back("training.fp8_param_gather needs a low-precision training.precision (not bf16)");
    if (t.first_last_layers_bf16)
      out.push_back("training.first_last_layers_bf16 needs a low-precision training.precision (not bf16)");
  }
  if (t.num_layers_at_start_in_bf16 < 0 || t.num_layers_at_end_in_bf16 < 0)
    out.push_back("training.num_layers_at_start_in_bf16 and num_layers_at_end_in_bf16 must be >= 0");
  else if (t.first_last_layers_bf16 && layers > 0 && t.num_layers_at_start_in_bf16 + t.num_layers_at_end_in_bf16 > layers)
    out.push_back("training.num_layers_at_start_in_bf16 + num_layers_at_end_in_bf16 = " +
                  std::to_string(t.num_layers_at_start_in_bf16 + t.num_layers_at_end_in_bf16) +
                  " exceeds model.layers=" + std::to_string(layers));
  return out;
}

}  // namespace dtsim
