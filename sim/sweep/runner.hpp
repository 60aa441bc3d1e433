#pragma once
// Running a sweep: analytic pass over every point of the shard (this thread and, for more
// than one block of 256 points on a machine with several CPUs, one helper thread with its
// own Evaluator, joined before anything forks), then the SimGrid engine on the best
// `refine_top` valid points, `jobs` at a time, each in its own child process
// (simulate_step_isolated: one SimGrid engine per process). Rows go to the journal as they
// arrive, in id order (sim/sweep/journal.hpp); the final, sorted outputs are written at the
// end, each formatted directly (sim/sweep/row_format.hpp; no JSON document is built; the
// three largest streamed to their files in pieces, reports/atomic_file.hpp):
//   OUT/results.csv   every row (analytic, then simgrid for refined points), sorted by id
//   OUT/ranked.csv    valid points best first: refined ones by their SimGrid figures, then
//                     the rest by their analytic figures; column analytic_step_time_s added
//   OUT/sweep.json    title, spec, counts, best, ranked (top 100) and every row
//   OUT/report.html   self-contained report (reports/html.hpp); OUT/report.md
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "models/sweep_spec.hpp"
#include "sim/sweep/sweep.hpp"

namespace dtsim::sweep {

struct RunOptions {
  std::string out_dir;
  bool resume = false;
  int64_t shard_index = 0, shard_count = 1;
  int jobs = 2;                  // concurrent SimGrid children
  int64_t refine_top = -1;       // -1: the spec's refine_top
  bool progress = true;          // progress bar with ETA on stderr
  /// Called after each journal flush with the rows written so far (tests stop a run here).
  std::function<void(int64_t rows_done)> on_flush;
};

class DirLock;

struct Outcome {
  /// The output directory's lock (sim/sweep/journal.hpp), held by run_sweep's outcome until
  /// it is destroyed, so that write_outputs runs under it too; empty for merge_shards.
  std::shared_ptr<DirLock> lock;
  std::vector<SweepRow> analytic;  // one per point of the shard, by id
  std::vector<SweepRow> simgrid;   // refined points, by id
  /// The results.csv line of each row (sweep_csv_line), as run_sweep formatted it for the
  /// journal's mirror, so that write_outputs does not format it again: empty, or one per row
  /// of `analytic` / `simgrid` (an empty string: not formatted).
  std::vector<std::string> analytic_csv, simgrid_csv;
  int64_t points = 0;              // points of the shard
  int64_t resumed_rows = 0;        // rows found in the journal
  double wall_s = 0;
  /// Re-simulated rows whose SimGrid child failed (status "error"; reason says how).
  int64_t simgrid_errors() const {
    int64_t n = 0;
    for (const auto& r : simgrid) n += r.status == "error" ? 1 : 0;
    return n;
  }
};

/// Runs (or resumes) a sweep into opts.out_dir (created when missing; its parent must
/// exist). Throws InputError for a bad shard, an out_dir holding another sweep, or a resume
/// of a different sweep file.
Outcome run_sweep(const SweepSpec& spec, const RunOptions& opts);

/// Writes results.csv, ranked.csv, sweep.json, report.html and report.md into `dir`.
void write_outputs(const SweepSpec& spec, const Outcome& o, const std::string& dir);

/// Joins the journals of shard directories (every shard of one sweep, each complete), as one
/// unsharded run would have produced them. Returns the sweep file path and fingerprint (from
/// the journals) with the outcome; throws InputError when shards are missing, repeated,
/// incomplete or from different sweeps.
struct Merged {
  std::string spec_path, fingerprint;
  std::string spec_name;  // the first shard's JournalHeader::spec_name: what its outputs print
  Outcome outcome;
};
Merged merge_shards(const std::vector<std::string>& dirs);

/// Valid rows in final order (refined by SimGrid figures first, then analytic), each the
/// SimGrid row when there is one; `analytic_step` gets the analytic step time of each.
std::vector<SweepRow> final_ranking(const Outcome& o, RankBy by, std::vector<double>* analytic_step = nullptr);

/// Parses "i/N" (0 <= i < N). Throws InputError naming `option`.
std::pair<int64_t, int64_t> parse_shard(const std::string& text, const std::string& option = "--shard");

/// A progress bar on a stream: "[#####-----]  45%  1234/2700 analytic  ETA 0:12".
class Progress {
 public:
  Progress(std::ostream& out, bool enabled, bool tty);
  void start(const std::string& label, int64_t total);
  void update(int64_t done);
  void finish();

 private:
  std::ostream& out_;
  bool enabled_, tty_;
  std::string label_;
  int64_t total_ = 0, last_decile_ = -1;
  double t0_ = 0, last_draw_ = -1;
};

}  // namespace dtsim::sweep
