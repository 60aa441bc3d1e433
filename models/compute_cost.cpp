#include "models/compute_cost.hpp"

#include <algorithm>

namespace dtsim {

double compute_time(const Op& op, const GpuSpec& gpu, Dtype dtype, double attention_work) {
  const double launch = gpu.kernel_overhead * std::max<int32_t>(op.kernels, 0);
  const double mem_bw = gpu.hbm_bandwidth * gpu.memory_efficiency;
  const double mem_t = mem_bw > 0 ? op.bytes / mem_bw : 0.0;
  switch (op.kernel) {
    case KernelKind::gemm:
    case KernelKind::attention: {
      // FP8 applies to the linear layers' GEMMs only; attention stays bf16 (Transformer
      // Engine's FP8 recipe keeps dot-product attention in higher precision).
      const bool fp8 = dtype == Dtype::fp8 && op.kernel == KernelKind::gemm && gpu.peak_fp8_flops > 0;
      const double peak = (fp8 ? gpu.peak_fp8_flops : gpu.peak_bf16_flops) * gpu.gemm_efficiency;
      const double work = op.kernel == KernelKind::attention ? op.flops * attention_work : op.flops;
      const double flop_t = peak > 0 ? work / peak : 0.0;
      return std::max(flop_t, mem_t) + launch;
    }
    case KernelKind::memory:
    case KernelKind::optimizer:
      return mem_t + launch;
  }
  return mem_t + launch;
}

}  // namespace dtsim
