#pragma once
// The GPU side of `dtsim calibrate`: times kernels on a local CUDA device. Declared here in
// plain C++; the CUDA code is a plugin (models/calibration/cuda/, the shared object
// libdtsim_calibrator_cuda.so beside the dtsim executable) that only these functions load,
// with dlopen, on their first call: the other commands neither load nor need the CUDA
// runtime and cuBLASLt (tens of milliseconds and ~200 MiB of mappings per process). The
// plugin is built when the build has CUDA (CMake option DTSIM_CUDA).
//
// Timing: CUDA events around each kernel after `warmup` untimed runs; the median of
// `repetitions` timed runs is kept (robust to clock ramp and the odd preemption).
#include <cstddef>
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

/// Thrown when the CUDA calibrator cannot be loaded: the build has none, or the plugin or
/// the CUDA libraries it needs cannot be opened (the message says which; the CLI exits 4).
class NoCalibrator : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Where the calibrator plugin is looked for: libdtsim_calibrator_cuda.so in the directory
/// of the running executable (/proc/self/exe).
std::string calibrator_plugin_path();

struct MeasureOptions {
  int device = 0;        // CUDA device ordinal
  int warmup = 5;        // untimed runs before timing
  int repetitions = 20;  // timed runs; the median is kept
};

/// Times every kernel of `kernels` on the device; returns a profile with the device
/// identity, date (UTC) and one measurement per kernel (models not fitted). GEMMs whose
/// dtype the device cannot run (fp8 before compute capability 8.9) are skipped and named
/// on `log`. Throws NoCalibrator, NoCudaDevice, or std::runtime_error on a CUDA/cuBLASLt
/// failure.
ComputeProfile measure_kernels(const std::vector<KernelSpec>& kernels, const MeasureOptions& opt, std::ostream& log);

/// Runs `ops` (each `count` times its kernel; fractional counts rounded up) back to back
/// on the device as one timed region; returns the median seconds of the whole sequence.
/// Throws as measure_kernels.
double measure_sequence(const std::vector<OpKernel>& ops, const MeasureOptions& opt, std::ostream& log);

/// The plugin's entry point, `extern "C" const CalibratorPlugin* dtsim_calibrator_plugin()`:
/// built with the same compiler and headers as dtsim (one build tree), checked by `abi` and
/// the sizes of the types it exchanges. Exceptions do not cross the boundary: each function returns 0 on
/// success, 1 when no usable device is found, 2 on another error, with the message in `error`.
struct CalibratorPlugin {
  int abi = 0;                // kCalibratorAbi
  size_t profile_size = 0;    // sizeof(ComputeProfile) where the plugin was built
  size_t spec_size = 0;       // sizeof(KernelSpec)
  size_t options_size = 0;    // sizeof(MeasureOptions)
  int (*measure_kernels)(const std::vector<KernelSpec>& kernels, const MeasureOptions& opt, std::ostream& log,
                         ComputeProfile& out, std::string& error) = nullptr;
  int (*measure_sequence)(const std::vector<OpKernel>& ops, const MeasureOptions& opt, std::ostream& log,
                          double& out, std::string& error) = nullptr;
};
inline constexpr int kCalibratorAbi = 1;
inline constexpr const char* kCalibratorSymbol = "dtsim_calibrator_plugin";

}  // namespace dtsim::calib
