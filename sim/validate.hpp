#pragma once
// `dtsim validate`: simulate every experiment that carries a `published:` section and
// compare with the published figure.
//
// One primary metric per experiment: the iteration time when the source gives one, else
// TFLOP/s per GPU on the source's basis (model FLOPs, or hardware FLOPs counting the
// recomputed forward, Narayanan 2021 Eq. 3), else the MFU (in percent; its error is
// relative, like the others). MFU is shown as well where published, but only the primary
// metric enters the mean absolute percentage error (MAPE). Published memory points are
// compared too, in their own table (ValidationReport::memory_rows).
#include <string>
#include <vector>

#include "models/experiment.hpp"

namespace dtsim {

struct ValidationRow {
  std::string file;
  std::string title;
  std::string metric;      // "step time (s)" | "TFLOP/s/GPU (model)" | "... (hardware)" | "MFU (%)"
  double published = 0;
  double simulated = 0;
  double error_pct = 0;    // 100 (simulated - published) / published
  double published_mfu = 0;   // 0 when not published
  double simulated_mfu = 0;
  std::string source;
  int64_t stage = 0;       // memory rows: the pipeline stage compared
  double wall_s = 0;       // host seconds the simulation took
};

struct ValidationReport {
  std::vector<ValidationRow> rows;
  std::vector<std::string> skipped;  // files without a published figure
  double mape_pct = 0;               // mean |error_pct| over rows
  double worst_pct = 0;              // max |error_pct|
  /// Published per-GPU memory (published.memory) against stage_memory of the stated stage
  /// (models/memory.hpp, the plan's memory facts; no simulation): metric "model states (GiB)"
  /// (params + grads + optimizer), "activations (GiB)" or "peak memory (GiB)", of
  /// ValidationRow::stage. Their own MAPE and worst row; not part of the step-time figures.
  std::vector<ValidationRow> memory_rows;
  double memory_mape_pct = 0;
  double memory_worst_pct = 0;
};

/// Every *.yaml under `paths` (files or directories, searched recursively, in sorted
/// order) that is an experiment (top-level model and layout) with a `published:` section
/// is simulated in a child process; other files are listed as skipped. Throws InputError
/// naming a file that does not parse.
ValidationReport validate_experiments(const std::vector<std::string>& paths);

/// The table `dtsim validate` prints.
std::string format_validation(const ValidationReport& report);

}  // namespace dtsim
