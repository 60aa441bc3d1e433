#pragma once
// `dtsim compare` and `dtsim plan` on top of the sweep machinery.
//
// compare: one model on several clusters. With a fixed layout every cluster runs it; with a
//   space each cluster gets its best layout (analytic ranking, the best `refine_top`
//   re-simulated by SimGrid, the best of those by SimGrid step time). Figures are SimGrid's.
// plan: for every candidate GPU type and node count, the best layout (as compare with a
//   space); days = tokens / (tokens/s) / 86400, GPU-hours = GPUs x days x 24, cost = GPU-hours x
//   price. With a deadline the cheapest option that meets it wins (ties: fewer GPUs); with a
//   GPU budget the fastest within it (ties: cheaper). When no option meets the constraint, the
//   closest is shown: the fastest for a deadline, the fewest GPUs for a budget. Sensitivity: the chosen option with the
//   NIC rate and the node count scaled (analytic engine, best layout re-chosen for a new size).
#include <cstdint>
#include <string>
#include <vector>

#include "models/plan_spec.hpp"
#include "models/result.hpp"
#include "models/sweep_spec.hpp"
#include "reports/html.hpp"

namespace dtsim::sweep {

struct StudyEntry {
  int64_t cluster = 0;   // index into the spec's clusters
  std::string label;
  bool ok = false;
  std::string reason;    // why there is no result (no valid layout, SimGrid failure)
  SweepRow analytic;     // analytic figures of the chosen layout
  SweepRow chosen;       // SimGrid figures when re-simulated, else = analytic
  StepResult result;     // SimGrid result (or the analytic StepResult when refine_top = 0)
  int64_t layouts = 0, valid_layouts = 0;
};

/// One entry per cluster of `spec` (a compare spec: fixed layout or space).
std::vector<StudyEntry> run_compare(const SweepSpec& spec, int jobs, bool progress);
ReportData compare_report(const SweepSpec& spec, const std::vector<StudyEntry>& entries);
/// The comparison table (also compare.csv): one row per cluster, differences vs the first.
ReportTable compare_table(const std::vector<StudyEntry>& entries);

struct PlanOption {
  int64_t candidate = 0;
  StudyEntry entry;
  double days = 0, gpu_hours = 0, usd = 0;
  bool feasible = false;
};

struct SensitivityRow {
  std::string what;     // "NIC bandwidth x 0.5", "nodes x 2"
  int64_t gpus = 0;
  std::string layout;    // or why there is none ("no valid layout", the GPU limit)
  bool ok = false;       // a layout was found: the figures below hold
  double step_time_s = 0, days = 0, usd = 0, mfu = 0;
};

struct PlanOutcome {
  std::vector<PlanOption> options;  // candidate order, then size
  int64_t chosen = -1;              // index into options; -1 when there is no valid option
  bool chosen_feasible = false;
  std::vector<SensitivityRow> sensitivity;
};

PlanOutcome run_plan(const PlanSpec& spec, int jobs, bool progress);
ReportData plan_report(const PlanSpec& spec, const PlanOutcome& o);
ReportTable plan_table(const PlanSpec& spec, const PlanOutcome& o);

}  // namespace dtsim::sweep
