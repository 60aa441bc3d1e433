// Loads the CUDA calibrator plugin on first use (models/calibration/measure.hpp).
#include <unistd.h>

#include <climits>
#include <filesystem>
#include <mutex>
#include <string>

#include "models/calibration/measure.hpp"
#include "models/plugin_loader.hpp"

namespace dtsim::calib {

namespace {

const CalibratorPlugin& plugin() {
  static std::once_flag once;
  static const CalibratorPlugin* loaded = nullptr;
  static std::string why;
  std::call_once(once, [] {
    const std::string path = calibrator_plugin_path();
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      why = "this dtsim build has no CUDA calibrator (" + path +
            " does not exist; rebuild with a CUDA toolkit and -DDTSIM_CUDA=ON or AUTO, README \"Calibration\")";
      return;
    }
    void* sym = open_plugin_symbol(path, kCalibratorSymbol, "the CUDA calibrator",
                                   "is the CUDA runtime installed where the build found it?", why);
    if (!sym && why.rfind("cannot load", 0) == 0) return;
    using Entry = const CalibratorPlugin* (*)();
    auto entry = reinterpret_cast<Entry>(sym);
    const CalibratorPlugin* p = entry ? entry() : nullptr;
    if (!p || p->abi != kCalibratorAbi || p->profile_size != sizeof(ComputeProfile) ||
        p->spec_size != sizeof(KernelSpec) || p->options_size != sizeof(MeasureOptions) || !p->measure_kernels ||
        !p->measure_sequence) {
      why = path + " is not a calibrator of this dtsim build (entry point " + kCalibratorSymbol +
            " missing or its interface differs): rebuild dtsim and the plugin together";
      return;
    }
    loaded = p;
  });
  if (!loaded) throw NoCalibrator(why);
  return *loaded;
}

void rethrow(int code, const std::string& error) {
  if (code == 1) throw NoCudaDevice(error);
  throw std::runtime_error(error);
}

}  // namespace

std::string calibrator_plugin_path() { return path_beside_executable("libdtsim_calibrator_cuda.so"); }

ComputeProfile measure_kernels(const std::vector<KernelSpec>& kernels, const MeasureOptions& opt, std::ostream& log) {
  const CalibratorPlugin& p = plugin();
  ComputeProfile out;
  std::string error;
  if (const int rc = p.measure_kernels(kernels, opt, log, out, error)) rethrow(rc, error);
  return out;
}

double measure_sequence(const std::vector<OpKernel>& ops, const MeasureOptions& opt, std::ostream& log) {
  const CalibratorPlugin& p = plugin();
  double out = 0;
  std::string error;
  if (const int rc = p.measure_sequence(ops, opt, log, out, error)) rethrow(rc, error);
  return out;
}

}  // namespace dtsim::calib
