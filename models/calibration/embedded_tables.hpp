#pragma once
// The kernel tables shipped with dtsim (models/calibration/tables/*.txt), compiled into the
// binary by models/calibration/tables/embed.cmake so that nothing outside the executable is
// read at run time. Their source, licence and format: models/calibration/tables/README.md.
#include <span>
#include <string_view>

namespace dtsim::calib {

struct EmbeddedTable {
  std::string_view name;  // file name without ".txt", e.g. "h100_sxm_gemm_bf16"
  std::string_view text;  // the whole file
};

/// Every shipped table, sorted by name.
std::span<const EmbeddedTable> embedded_tables();

}  // namespace dtsim::calib
