#pragma once
// The compute kernels dtsim calibrates: one shape description per kernel kind, keyed the
// same way in the profile file (models/calibration/profile.hpp) and by the calibrator.
//
// Shapes (all element counts, no bytes unless named *bytes):
//  - GEMM: C[m x n] = op(A)[m x k] @ op(B)[k x n], 2 m n k FLOPs (models/flops.hpp), in
//    `dtype` (bf16 or fp8 inputs, bf16 output), row-major; trans_a / trans_b say whether the
//    stored operand is transposed (forward Y = X W^T: trans_b; weight grad dW = dY^T X:
//    trans_a; activation grad dX = dY W: neither). Megatron's linear layers.
//  - attention: fused (Flash) attention over `batch` sequences, `heads` query heads and
//    `kv_heads` key/value heads (GQA) of `head_dim`, seq_q queries against seq_kv keys,
//    causal mask or not, forward or backward. Executed FLOPs: 4 b heads seq_q seq_kv d,
//    x kFlashCausalWork when causal, x kFlashBackwardWork for backward
//    (models/compute_cost.hpp, Dao 2023 FlashAttention-2 Sec 3.1).
//  - memory-bound: a streaming kernel named as the plan's op (input_norm, gelu, ...) that
//    moves `bytes` of HBM traffic (read + write).
//  - optimizer: fused Adam over `params` elements (30 B per parameter, models/plan.cpp).
#include <cstdint>
#include <string>

#include "models/experiment.hpp"

namespace dtsim::calib {

enum class KernelClass { gemm, attention, memory, optimizer };
const char* to_string(KernelClass);

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  Dtype dtype = Dtype::bf16;
  bool trans_a = false, trans_b = false;
};

struct AttentionShape {
  int64_t batch = 0, heads = 0, kv_heads = 0, seq_q = 0, seq_kv = 0, head_dim = 0;
  bool causal = true;
  bool backward = false;
};

/// One kernel to time (or timed): its kind, its shape and the plan op names it stands for.
struct KernelSpec {
  KernelClass kind = KernelClass::memory;
  GemmShape gemm;          // kind == gemm
  AttentionShape attention;  // kind == attention
  std::string name;        // memory: the plan op name ("input_norm"); others: informative
  double bytes = 0;        // memory: HBM bytes moved; others: informative
  double params = 0;       // optimizer: parameters updated (elements)

  /// FLOPs the kernel executes: GEMM 2mnk; attention as above; 0 for memory/optimizer.
  double flops() const;
  /// Canonical identity string, e.g. "gemm m=8192 n=4608 k=12288 bf16 NT",
  /// "attention fwd b=1 h=12 kv=12 sq=2048 skv=2048 d=128 causal", "memory input_norm bytes=1.2e+08",
  /// "optimizer params=1.1e+09". Two specs with the same key are the same kernel.
  std::string key() const;
};

/// Executed FLOPs of a fused attention kernel (see the header comment).
double attention_executed_flops(const AttentionShape& a);

}  // namespace dtsim::calib
