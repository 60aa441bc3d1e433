#pragma once
// Layout sweeps: enumerate the layout space of a SweepSpec (models/sweep_spec.hpp), evaluate
// every point with the analytic engine, re-simulate the best with the SimGrid engine.
//
// Enumeration order (ids are positions in it, stable for a given file): cluster, tp, cp, pp,
// vp, dp (explicit lists only; auto derives dp = GPUs / (tp cp pp)), zero_stage, micro_batch,
// recompute, sequence_parallel. vp > 1 uses the interleaved schedule, vp = 1 1F1B. Every
// point is kept: one that cannot run is "invalid" with the reason (the experiment checks of
// models/experiment_io.hpp, e.g. "layout.tp=3 does not divide model.heads=64"), one that
// does not fit in HBM is "oom" with its peak; a point equivalent to another one of the space
// (sequence_parallel with tp = 1, ZeRO with dp cp = 1) is "invalid" naming its twin.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/result.hpp"
#include "models/sweep_spec.hpp"
#include "sim/analytic_engine.hpp"

namespace dtsim::sweep {

struct LayoutPoint {
  int64_t id = 0;
  int64_t cluster = 0;  // index into SweepSpec::clusters
  Layout layout;
  int64_t micro_batch = 0;
  std::string reason;   // non-empty: invalid before any check (dp not derivable, duplicate)
};

/// Every point of the space, in id order.
std::vector<LayoutPoint> enumerate_layouts(const SweepSpec& spec);

/// Whether point `id` belongs to shard `index` of `count` (round robin: id mod count).
inline bool in_shard(int64_t id, int64_t index, int64_t count) { return count <= 1 || id % count == index; }

/// Evaluates points with one analytic engine per cluster (not thread-safe: one per thread).
class Evaluator {
 public:
  explicit Evaluator(const SweepSpec& spec);
  /// Validity, memory and the analytic estimate of one point.
  SweepRow analytic(const LayoutPoint& p);
  /// A row from a SimGrid result of the same point (status and memory as the analytic row).
  SweepRow from_result(const LayoutPoint& p, const StepResult& r, const SweepRow& analytic_row) const;
  /// The experiment of a point (for the SimGrid engine and reports).
  Experiment experiment(const LayoutPoint& p) const;
  AnalyticEngine& engine(int64_t cluster) { return *engines_[static_cast<size_t>(cluster)]; }
  const SweepSpec& spec() const { return spec_; }

 private:
  void fill_identity(SweepRow& row, const LayoutPoint& p) const;
  void fill_cost(SweepRow& row) const;
  const SweepSpec& spec_;
  std::vector<std::unique_ptr<AnalyticEngine>> engines_;
  std::vector<Experiment> scratch_;  // per cluster, layout set per point (validation input)
};

/// Indices (into `rows`) of the valid rows, best first by `by`, ties by id.
std::vector<size_t> ranking(const std::vector<SweepRow>& rows, RankBy by);

/// Whether the order of the best `top` of `ranked` (best first, valid rows) holds within the
/// kernel-time band (models/time_band.hpp): each row's step is scaled by its own
/// kernel_band_ratios (a comm-bound layout moves less than a compute-bound one), at the fast
/// and at the slow end, and the rows re-ranked by `by`.
struct RankingBand {
  size_t rows = 0;                       // rows compared (min(top, ranked.size()))
  std::vector<double> fast, slow;        // per row: kernel_band_ratios
  std::vector<size_t> order_fast, order_slow;  // positions in `ranked`, best first
  bool holds() const;                    // both orders are 0, 1, 2, ...
};
RankingBand ranking_band(Evaluator& ev, const std::vector<SweepRow>& ranked, RankBy by, size_t top = 5);
/// One line for the sweep's summary, e.g. "the top 5 keep their order at both ends of the
/// kernel-time band" or "... at the slow end #2 and #3 change places (order 1, 3, 2, 4, 5)".
std::string ranking_band_text(const RankingBand& b);

}  // namespace dtsim::sweep
