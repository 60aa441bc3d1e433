#pragma once
// Kernel-time band: how far a step time can move with the spread of the kernel data it was
// timed from. Every compute op's time is scaled, in a "fast" and a "slow" scenario, by the
// 90% range of what its source's data says about kernels of that kind; the band of a step is
// the step time under the two scenarios (sim/analytic_engine.hpp kernel_band_ratios: the
// closed-form engine's ratio fast/nominal and slow/nominal times the engine's own step).
// The errors of one GPU's table are taken as fully correlated (one table, one software
// stack, one clock behaviour), so every op of a source moves together: the band is that of
// a systematic error, not a sum of independent ones. A step need not move monotonically with
// its kernels (host-bound steps, overlap that shifts), so the reported band is the lowest
// and highest of the nominal, fast and slow steps (add_kernel_band).
//
// Factors on an op's time (lo = fast, hi = slow), with their sources:
//  - shipped kernel tables (table-exact / -interpolated / -extrapolated): the table used
//    (NVIDIA aiconfigurator, one collection per GPU, models/calibration/tables/README.md)
//    against the median of every bf16 collection of the same GPU: on shapes of at least
//    1e11 FLOP, 90% of its shapes lie within -18% to +6% of that median (A100, H100, H200,
//    B200; computed over the aiconfigurator collections at commit 095f58a5, "GEMM notes"
//    of the calibration data's README). The median-based time is the table's / (1 + e):
//    x [1 / 1.06, 1 / 0.82] = x [0.943, 1.220]. Extrapolated points take the same range
//    (no data says more).
//  - roofline GEMMs and fused attention (one efficiency per GPU): the 10th-90th percentile
//    of the achieved bf16 rate over training-like shapes of the same tables (m >= 2048,
//    1024 <= n, k <= 16384) against its median: A100 0.73-0.82 of 0.775, H100 0.73-0.85 of
//    0.793, H200 0.72-0.84 of 0.788, B200 0.63-0.74 of 0.685; the widest of the four on each
//    side, time x [0.685 / 0.74, 0.788 / 0.72] = x [0.926, 1.094].
//  - memory-bound kernels and the optimizer on the roofline, and every op timed from a
//    `dtsim calibrate` profile (measured on the user's GPU, no spread recorded): x 1.
// Not in the band: communication constants (NCCL efficiencies, latencies), host dispatch,
// and the model's structural assumptions; the README states their sources.
#include "models/calibration/profile.hpp"
#include "models/plan.hpp"

namespace dtsim {

/// The factor on an op's time from `source` for an op of `kernel`, in `scenario` (see above).
double time_band_factor(calib::TimeSource source, KernelKind kernel, TimeScenario scenario);

}  // namespace dtsim
