#pragma once
// ReportData (reports/html.hpp) for sweep, compare and plan: tables and charts built from
// their results (the reports themselves only render).
//
// Charts: throughput vs GPU count, the Pareto front of cost vs step time (USD per step when
// prices are given, GPU-seconds per step otherwise), per-stage memory of the best layout
// against HBM capacity, the step-time breakdown (compute, bubble, exposed TP/CP/PP/DP) of the
// best layouts, and a 1F1B schedule excerpt of the best layout (analytic per-stage forward and
// backward times, Narayanan 2021 Sec 2.2.1 order).
#include <string>
#include <vector>

#include "models/sweep_spec.hpp"
#include "reports/html.hpp"
#include "sim/analytic_engine.hpp"
#include "sim/sweep/runner.hpp"

namespace dtsim::sweep {

/// The Megatron-LM flags that launch row `r` (layout scope: parallelism, ZeRO, recompute, batch;
/// models/megatron_args.hpp), from its cluster's experiment with the row's layout, one line.
std::string megatron_layout_args(const SweepSpec& spec, const SweepRow& r);

/// "DP4 TP8 CP1 PP4 VP2 ZeRO-1 SP selective mb1" (SP only with TP > 1; "DP?" while dp is unresolved).
std::string layout_label(const Layout& l, int64_t micro_batch);

/// The pipeline schedule of the first micro-batches of a layout, in the order the engines
/// simulate it (each rank's compute order in the step plan: GPipe, 1F1B or interleaved
/// 1F1B), forward after the previous virtual stage's forward + one message, backward after
/// the next one's backward + one message, analytic durations. The whole step is scheduled;
/// the events of the first `max_micro_batches` micro-batches are drawn.
TimelineChart schedule_excerpt(AnalyticEngine& engine, const Layout& l, int64_t micro_batch, int64_t max_micro_batches);

/// Memory per pipeline stage (params, grads, optimizer, activations, other; GiB) of a result.
StackedBarChart memory_chart(const StepResult& r, const std::string& title);

/// Pareto front (min y for increasing x) of points, ascending x.
std::vector<ChartPoint> pareto_front(std::vector<ChartPoint> pts);

ReportData sweep_report(const SweepSpec& spec, const Outcome& o);
/// The same with final_ranking(o, spec.rank_by, &analytic_step) already computed (pointers
/// into `o`).
ReportData sweep_report(const SweepSpec& spec, const Outcome& o, const std::vector<const SweepRow*>& ranked,
                        const std::vector<double>& analytic_step);

}  // namespace dtsim::sweep
