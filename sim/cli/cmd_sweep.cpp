// dtsim sweep SWEEP.yaml --out DIR [--resume] [--shard i/N] [--jobs N] [--refine-top K] [--quiet]
#include <malloc.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "models/sweep_spec.hpp"
#include "sim/cli/commands.hpp"
#include "sim/sweep/report_data.hpp"
#include "sim/sweep/runner.hpp"
#include "sim/sweep/sweep.hpp"

namespace dtsim::cli {

namespace {

struct SweepOptions {
  std::string spec;
  std::string out;
  bool resume = false;
  std::string shard;
  int jobs = 2;
  int64_t refine_top = -1;
  bool quiet = false;
};

int sweep_command(const SweepOptions& o) {
  // Large short-lived buffers (the report's step plan of the best layout: vectors of several
  // MB grown by doubling, hundreds of MB over a DeepSeek-V3 plan) come from the heap and stay
  // there, instead of each being mapped and unmapped anew, its pages faulted in every time
  // (glibc's threshold otherwise follows the largest buffer freed so far). About 80 ms of CPU
  // on the DeepSeek-V3 sweep; the process is short-lived. Outputs are unchanged.
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 64 << 20);
  require_input_file(o.spec);
  const SweepSpec spec = load_sweep_spec(o.spec, SpecKind::sweep);
  sweep::RunOptions ro;
  ro.out_dir = o.out;
  ro.resume = o.resume;
  if (!o.shard.empty()) std::tie(ro.shard_index, ro.shard_count) = sweep::parse_shard(o.shard);
  ro.jobs = o.jobs;
  ro.refine_top = o.refine_top;
  ro.progress = !o.quiet;
  const sweep::Outcome out = sweep::run_sweep(spec, ro);
  sweep::write_outputs(spec, out, o.out);
  if (!o.quiet) {
    const auto ranked = sweep::final_ranking(out, spec.rank_by);
    int64_t ok = 0;
    for (const auto& r : out.analytic) ok += r.valid() ? 1 : 0;
    std::cout << fmt::format("dtsim sweep: {}\n  {} layouts ({} valid), {} re-simulated, {:.1f} s\n", spec.title,
                             out.analytic.size(), ok, out.simgrid.size(), out.wall_s);
    if (out.resumed_rows > 0) std::cout << fmt::format("  resumed: {} rows were already in the journal\n", out.resumed_rows);
    size_t width = 1;  // the longest cluster label shown, whole: labels differ at their end
    for (size_t i = 0; i < ranked.size() && i < 5; ++i) width = std::max(width, ranked[i].cluster_label.size());
    for (size_t i = 0; i < ranked.size() && i < 5; ++i) {
      const auto& r = ranked[i];
      std::cout << fmt::format("  #{} {:<{}} {:<44} {:>9.4f} s  {:>7.0f} tok/s/GPU  MFU {:4.1f}%  ({})\n", i + 1,
                               r.cluster_label, width, sweep::layout_label(r.layout, r.micro_batch), r.step_time_s,
                               r.tokens_per_s_per_gpu, r.mfu * 100, r.engine);
    }
    if (!ranked.empty())  // the best layout as the flags that launch it (models/megatron_args.hpp)
      std::cout << "  megatron_args: " << sweep::megatron_layout_args(spec, ranked.front()) << "\n";
    {  // the ranking's robustness within the kernel-time band (models/time_band.hpp)
      sweep::Evaluator ev(spec);
      const std::string band = sweep::ranking_band_text(sweep::ranking_band(ev, ranked, spec.rank_by));
      if (!band.empty()) std::cout << "  band: " << band << "\n";
    }
    std::cout << fmt::format("  written: {0}/results.csv {0}/ranked.csv {0}/sweep.json {0}/report.html {0}/report.md\n",
                             o.out);
  }
  // A SimGrid child that failed is an engine failure, not a property of the layout: the
  // outputs keep its row (status error) and the exit code says something went wrong.
  if (const int64_t failed = out.simgrid_errors(); failed > 0) {
    for (const auto& r : out.simgrid)
      if (r.status == "error") {
        std::cerr << fmt::format("error: {} of {} re-simulated layouts failed in the SimGrid engine, e.g. {} {}: {}\n",
                                 failed, out.simgrid.size(), r.cluster_label, sweep::layout_label(r.layout, r.micro_batch),
                                 r.reason);
        break;
      }
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace

Command add_sweep_command(CLI::App& app) {
  auto opts = std::make_shared<SweepOptions>();
  SweepOptions& o = *opts;
  CLI::App* c = app.add_subcommand("sweep", "Evaluate every layout of a space (analytic), re-simulate the best (SimGrid)");
  c->add_option("spec", o.spec, "Sweep YAML file (model, training, clusters, space)")->required()->type_name("SWEEP.yaml");
  c->add_option("-o,--out", o.out, "Output directory (journal, CSV, JSON, HTML, Markdown)")
      ->required()
      ->type_name("DIR")
      ->check(output_path_check());
  c->add_flag("--resume", o.resume, "Continue an interrupted sweep in --out (rows already there are kept)");
  c->add_option("--shard", o.shard, "Run only shard i of N (layouts with id mod N == i); join with dtsim merge")
      ->type_name("i/N");
  c->add_option("-j,--jobs", o.jobs, "SimGrid simulations run at once (child processes)")->check(CLI::Range(1, 256));
  c->add_option("--refine-top", o.refine_top, "Re-simulate this many best layouts (default: the file's refine_top)")
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}));
  c->add_flag("-q,--quiet", o.quiet, "No progress bar and no summary");
  return {c, [opts] { return sweep_command(*opts); }};
}

}  // namespace dtsim::cli
