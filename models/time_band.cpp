#include "models/time_band.hpp"

namespace dtsim {

namespace {
// Sources and derivations: models/time_band.hpp.
constexpr double kTableFast = 1.0 / 1.06, kTableSlow = 1.0 / 0.82;
constexpr double kRooflineFast = 0.685 / 0.74, kRooflineSlow = 0.788 / 0.72;
}  // namespace

double time_band_factor(calib::TimeSource source, KernelKind kernel, TimeScenario scenario) {
  if (scenario == TimeScenario::nominal) return 1.0;
  const bool fast = scenario == TimeScenario::fast;
  switch (source) {
    case calib::TimeSource::table_exact:
    case calib::TimeSource::table_interpolated:
    case calib::TimeSource::table_extrapolated: return fast ? kTableFast : kTableSlow;
    case calib::TimeSource::roofline:
      if (kernel == KernelKind::gemm || kernel == KernelKind::attention) return fast ? kRooflineFast : kRooflineSlow;
      return 1.0;
    case calib::TimeSource::profile_exact:
    case calib::TimeSource::profile_interpolated:
    case calib::TimeSource::profile_fitted: return 1.0;
  }
  return 1.0;
}

}  // namespace dtsim
