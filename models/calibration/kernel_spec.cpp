#include "models/calibration/kernel_spec.hpp"

#include <fmt/format.h>

#include "models/compute_cost.hpp"

namespace dtsim::calib {

const char* to_string(KernelClass k) {
  switch (k) {
    case KernelClass::gemm: return "gemm";
    case KernelClass::attention: return "attention";
    case KernelClass::memory: return "memory";
    case KernelClass::optimizer: return "optimizer";
  }
  return "?";
}

double attention_executed_flops(const AttentionShape& a) {
  double f = 4.0 * static_cast<double>(a.batch) * static_cast<double>(a.heads) * static_cast<double>(a.seq_q) *
             static_cast<double>(a.seq_kv) * static_cast<double>(a.head_dim);
  if (a.causal) f *= kFlashCausalWork;
  if (a.backward) f *= kFlashBackwardWork;
  return f;
}

double KernelSpec::flops() const {
  switch (kind) {
    case KernelClass::gemm:
      return 2.0 * static_cast<double>(gemm.m) * static_cast<double>(gemm.n) * static_cast<double>(gemm.k);
    case KernelClass::attention: return attention_executed_flops(attention);
    default: return 0;
  }
}

std::string KernelSpec::key() const {
  switch (kind) {
    case KernelClass::gemm:
      return fmt::format("gemm m={} n={} k={} {} {}{}", gemm.m, gemm.n, gemm.k, to_string(gemm.dtype),
                         gemm.trans_a ? 'T' : 'N', gemm.trans_b ? 'T' : 'N');
    case KernelClass::attention: {
      const auto& a = attention;
      return fmt::format("attention {} b={} h={} kv={} sq={} skv={} d={} {}", a.backward ? "bwd" : "fwd", a.batch,
                         a.heads, a.kv_heads, a.seq_q, a.seq_kv, a.head_dim, a.causal ? "causal" : "full");
    }
    case KernelClass::memory: return fmt::format("memory {} bytes={}", name, bytes);
    case KernelClass::optimizer: return fmt::format("optimizer params={}", params);
  }
  return "?";
}

}  // namespace dtsim::calib
