#pragma once
// Roofline compute cost model (the default when no calibration profile is given).
//
//   gemm:      t = max(F / (peak * gemm_efficiency), B / (hbm_bw * memory_efficiency)) + launch
//   attention: as gemm at the GPU's attention_efficiency (fused attention kernels reach
//              less of the peak than GEMMs), on the FLOPs the kernel really executes
//   memory:    t = B / (hbm_bw * memory_efficiency) + launch
//   optimizer: as memory
// peak is the dense tensor-core rate of the GEMM dtype (bf16, or fp8 for fp8 GEMMs);
// efficiencies and the launch overhead belong to the GPU preset and cite their sources
// in topologies/gpu_presets.cpp (Williams, Waterman & Patterson 2009, "Roofline").
//
// Attention work actually executed differs from the FLOP-counting convention:
//  - FlashAttention skips fully masked blocks of causal attention: 0.5 x the dense FLOPs
//    (Dao 2023, FlashAttention-2, Sec 3.1, "causal masking ... skip ... about 1.7-1.8x
//    speedup"; half the blocks are masked).
//  - FlashAttention backward recomputes S = QK^T and runs 5 matmuls against the
//    forward's 2: 2.5 x forward work, not the 2 x of the counting convention
//    (Dao 2023, FlashAttention-2, Sec 3.1.2).
//  - Without FlashAttention (Megatron fused softmax), QK^T and AV are dense batched GEMMs
//    over the full s x s scores, masked afterwards: 1.0 x.
#include "models/calibration/profile.hpp"
#include "models/experiment.hpp"
#include "models/plan.hpp"

namespace dtsim {

/// Thread blocks an NCCL collective kernel occupies (one per channel): 24 observed for an
/// AllGather on H100 in Nsight Systems (NVIDIA developer forum, "Compute-Communication
/// Overlap Causes Severe GEMM Performance Degradation because of Tail Effect", 2025).
/// While a collective overlaps compute, compute runs at (1 - kNcclBlocks / sm_count) of
/// its speed (the SMs NCCL holds are lost to it; wave-quantisation tails, which that
/// thread shows can be worse, are not modelled).
inline constexpr double kNcclBlocks = 24;

/// Compute speed factor while communication overlaps (1 when off or no SM count).
inline double comm_overlap_speed(const GpuSpec& gpu, bool interference) {
  if (!interference || gpu.sm_count <= 0) return 1.0;
  return 1.0 - kNcclBlocks / static_cast<double>(gpu.sm_count);
}

/// Work factor of FlashAttention's causal skipping (see above).
inline constexpr double kFlashCausalWork = 0.5;
/// FlashAttention backward work relative to forward (see above).
inline constexpr double kFlashBackwardWork = 2.5;

/// Seconds for one compute op on `gpu`, GEMMs in `dtype`. Uses op.kernel, op.flops
/// (convention FLOPs; attention work factors applied here), op.bytes, op.kernels.
/// `attention_work` multiplies attention FLOPs (kFlashCausalWork etc.; 1 for GEMMs).
double compute_time(const Op& op, const GpuSpec& gpu, Dtype dtype, double attention_work = 1.0);

/// An op's time and where it came from (roofline, or the calibration profile: exact shape,
/// interpolated, fitted model; models/calibration/profile.hpp).
struct ComputeTime {
  double seconds = 0;
  calib::TimeSource source = calib::TimeSource::roofline;
};

/// Seconds for one compute op of `exp`'s plan. Without `cluster.gpu.profile` this is the
/// roofline above (compute_time(op, gpu, dtype, attention_work)), source roofline. With a
/// profile: the op's kernel shape (models/calibration/plan_kernels.hpp) is looked up in the
/// profile (exact, else interpolated, else fitted), times the op's kernel count; extra
/// launches of a multi-kernel op add gpu.kernel_overhead each; when the profile cannot
/// say, the roofline. `attention_work` only applies to the roofline (profile attention
/// shapes carry causal/backward themselves). Throws InputError when the profile file
/// cannot be read or is invalid.
ComputeTime compute_time(const Op& op, const Experiment& exp, double attention_work = 1.0);

/// The profile named by exp.cluster.gpu.profile (relative to the directory of
/// exp.source), loaded once per process and path (thread-safe); nullptr when the
/// experiment names none. Throws InputError as ComputeProfile::load.
const calib::ComputeProfile* experiment_profile(const Experiment& exp);

}  // namespace dtsim
