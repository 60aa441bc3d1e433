#pragma once
// The GPU side of `dtsim calibrate`: times kernels on a local CUDA device. Declared here in
// plain C++; implemented in models/calibration/cuda/ and linked into dtsim only when the
// build has CUDA (compile definition DTSIM_HAVE_CUDA; CMake option DTSIM_CUDA).
//
// Timing: CUDA events around each kernel after `warmup` untimed runs; the median of
// `repetitions` timed runs is kept (robust to clock ramp and the odd preemption).
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/calibration/plan_kernels.hpp"
#include "models/calibration/profile.hpp"

namespace dtsim::calib {

/// Thrown when the build has CUDA but no usable device is found (the CLI exits 5).
class NoCudaDevice : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct MeasureOptions {
  int device = 0;        // CUDA device ordinal
  int warmup = 5;        // untimed runs before timing
  int repetitions = 20;  // timed runs; the median is kept
};

/// Times every kernel of `kernels` on the device; returns a profile with the device
/// identity, date (UTC) and one measurement per kernel (models not fitted). GEMMs whose
/// dtype the device cannot run (fp8 before compute capability 8.9) are skipped and named
/// on `log`. Throws NoCudaDevice, or std::runtime_error on a CUDA/cuBLASLt failure.
ComputeProfile measure_kernels(const std::vector<KernelSpec>& kernels, const MeasureOptions& opt, std::ostream& log);

/// Runs `ops` (each `count` times its kernel; fractional counts rounded up) back to back
/// on the device as one timed region; returns the median seconds of the whole sequence.
double measure_sequence(const std::vector<OpKernel>& ops, const MeasureOptions& opt, std::ostream& log);

}  // namespace dtsim::calib
