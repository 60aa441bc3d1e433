#pragma once
// Roofline compute cost model (the default when no calibration profile is given).
//
//   gemm:      t = max(F / (peak * gemm_efficiency * fill), B / (hbm_bw * memory_efficiency)) + launch
//              fill = the GEMM's wave fill (gemm_wave_fill below; 1 when the shape or the
//              GPU's SM count is unknown)
//   attention: as gemm at the GPU's attention_efficiency (fused attention kernels reach
//              less of the peak than GEMMs), on the FLOPs the kernel really executes
//   memory:    t = B / (hbm_bw * memory_efficiency) + launch
//   optimizer: as memory
// peak is the dense tensor-core rate of the GEMM dtype (bf16, or fp8 for fp8 GEMMs);
// efficiencies and the launch overhead belong to the GPU preset and cite their sources
// in topologies/gpus/*.yaml (Williams, Waterman & Patterson 2009, "Roofline").
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

/// SMs a collective's kernel holds (Op::comm_sms; 0 = NCCL's kNcclBlocks).
inline double comm_kernel_sms(const Op& op) { return op.comm_sms > 0 ? op.comm_sms : kNcclBlocks; }

/// Compute speed factor while communication kernels holding `sms` SMs overlap it (1 when
/// off or no SM count): 1 - sms / sm_count. When several run at once the engines take the
/// largest holder's (each kernel's channels share the same SMs' spare capacity; NCCL's
/// default channel count is what one collective takes).
inline double comm_overlap_speed(const GpuSpec& gpu, bool interference, double sms = kNcclBlocks) {
  if (!interference || gpu.sm_count <= 0 || sms <= 0) return 1.0;
  return std::max(0.0, 1.0 - sms / static_cast<double>(gpu.sm_count));
}

/// Work factor of FlashAttention's causal skipping (see above).
inline constexpr double kFlashCausalWork = 0.5;
/// FlashAttention backward work relative to forward (see above).
inline constexpr double kFlashBackwardWork = 2.5;

/// Thread-block tiles (M x N outputs) of the cuBLAS kernels that reach the full GEMM rate:
/// the two largest tile shapes, 256 x 128 and 128 x 256, one resident block per SM (NVIDIA
/// Deep Learning Performance Guide, "Matrix Multiplication Background User's Guide",
/// sections "Tile Quantization" and "Wave Quantization": "the 256x128 tile ... the most
/// efficient"; an A100 with 108 SMs runs 108 such tiles per wave). Smaller tiles exist but
/// reuse less data per load, so they are not assumed to run at the same rate.
inline constexpr int64_t kFullRateTiles[2][2] = {{256, 128}, {128, 256}};

/// Wave fill of an M x N x K GEMM on a GPU with `sm_count` SMs: the useful fraction of the
/// work the GPU really does, 2MNK / (2 * waves * sm_count * tile_m * tile_n * K) with
/// tiles = ceil(M/tile_m) * ceil(N/tile_n) and waves = ceil(tiles / sm_count)
/// (calib::quantised_gemm_flops), for the better of the kFullRateTiles; dimensionless, in
/// (0, 1]. A partial tile or a partial last wave costs a full one (same guide, same
/// sections). Example: 8192 x 3072 x 6144 on 108 SMs: 768 tiles = 7.1 waves run as 8,
/// fill 0.889. 1 when sm_count <= 0 or a dimension is not positive.
double gemm_wave_fill(const calib::GemmShape& g, int64_t sm_count);

/// Input dtype of a GEMM op of `exp`'s plan: the precision recipe's (models/precision.hpp)
/// for a linear layer's GEMM (Op::gemm_linear) in a low-precision layer, else bf16 (the
/// attention core, the LM head, the router; the layers first_last_layers_bf16 keeps).
Dtype op_gemm_dtype(const Op& op, const Experiment& exp);

/// Seconds for one compute op on `gpu`, GEMMs in `dtype` (its tensor-core rate:
/// gemm_peak_flops of models/precision.hpp; attention ops at the bf16 rate). Uses op.kernel, op.flops
/// (convention FLOPs; attention work factors applied here), op.bytes, op.kernels.
/// `attention_work` multiplies attention FLOPs (kFlashCausalWork etc.; 1 for GEMMs).
/// `gemm_fill` (gemm_wave_fill of the op's shape, (0, 1]) divides the GEMM rate of
/// KernelKind::gemm ops; 1 = full waves (the shape-free roofline).
double compute_time(const Op& op, const GpuSpec& gpu, Dtype dtype, double attention_work = 1.0,
                    double gemm_fill = 1.0);

/// An op's time and where it came from (roofline, or the calibration profile: exact shape,
/// interpolated, fitted model; models/calibration/profile.hpp).
struct ComputeTime {
  double seconds = 0;
  calib::TimeSource source = calib::TimeSource::roofline;
};

/// Seconds for one compute op of `exp`'s plan. The experiment's profile
/// (experiment_profile: the `cluster.gpu.profile` file, else the GPU's shipped kernel
/// tables, cluster.gpu.kernel_tables) is asked first: the op's kernel shape
/// (models/calibration/plan_kernels.hpp; a grouped expert GEMM as one GEMM per expert) is
/// looked up (measured exact, kernel table, interpolated, fitted: ComputeProfile::lookup),
/// times the op's kernel count; extra launches of a multi-kernel op timed as one kernel add
/// gpu.kernel_overhead each. A kernel table's time is the kernel's own, measured in a short
/// burst in a CUDA graph without launches: it is divided by gpu.sustained_ratio and the op
/// adds gpu.kernel_overhead per launch (Op::kernels), as the roofline does. When the profile cannot say (memory-bound,
/// attention and optimizer ops against GEMM-only tables), or there is none, the roofline
/// above: compute_time(op, gpu, dtype, attention_work, fill), fill = gemm_wave_fill of the
/// op's whole GEMM (Op::gemm) on the GPU's SMs for GEMM ops, else 1; source roofline.
/// `attention_work` only applies to the roofline (profile attention shapes carry
/// causal/backward themselves). The result is scaled by the kernel-time band's factor of
/// its source in exp.time_scenario (models/time_band.hpp; 1 when nominal). Throws InputError
/// when the profile file cannot be read or is invalid.
ComputeTime compute_time(const Op& op, const Experiment& exp, double attention_work = 1.0);

/// The profile named by exp.cluster.gpu.profile (relative to the directory of
/// exp.source), loaded once per process and path (thread-safe); without one, the shipped
/// profile of exp.cluster.gpu.kernel_tables (ComputeProfile::shipped); nullptr when the
/// experiment has neither. Throws InputError as ComputeProfile::load.
const calib::ComputeProfile* experiment_profile(const Experiment& exp);

}  // namespace dtsim
