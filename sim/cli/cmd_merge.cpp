// dtsim merge SHARD_DIR... --out DIR: joins the shards of one sweep (dtsim sweep --shard i/N).
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "models/errors.hpp"
#include "models/sweep_spec.hpp"
#include "reports/atomic_file.hpp"
#include "sim/cli/commands.hpp"
#include "sim/sweep/runner.hpp"

namespace dtsim::cli {

namespace {

struct MergeOptions {
  std::vector<std::string> shards;
  std::string out;
  bool quiet = false;
};

int merge_command(const MergeOptions& o) {
  const sweep::Merged m = sweep::merge_shards(o.shards);
  const sweep::Outcome& outcome = m.outcome;
  require_input_file(m.spec_path);
  SweepSpec spec = load_sweep_spec(m.spec_path, SpecKind::sweep);
  // The outputs name the file as the sweep's command line did (the first shard's), so that
  // they are what one unsharded run would have written.
  spec.source = m.spec_name;
  // The journals carry the fingerprint of the file they ran; the file must not have changed.
  if (spec.fingerprint != m.fingerprint)
    throw InputError(m.spec_path + ": changed since the shards ran (fingerprint " + spec.fingerprint + ", shards " +
                     m.fingerprint + "): run the sweep again");
  prepare_output_dir(o.out, "--out", {"results.csv", "ranked.csv", "sweep.json", "report.html", "report.md"});
  // Writing into a shard, or any directory holding a sweep, would replace that sweep's own
  // results and leave its journal beside another sweep's outputs.
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(o.out) / "journal.jsonl", ec))
    throw InputError("--out " + o.out + ": holds a sweep (journal.jsonl); merge into a new directory");
  for (const auto& d : o.shards)
    if (std::filesystem::equivalent(d, o.out, ec))
      throw InputError("--out " + o.out + ": is the shard directory " + d + " (choose a new directory)");
  sweep::write_outputs(spec, outcome, o.out);
  if (!o.quiet)
    std::cout << fmt::format("dtsim merge: {} shards, {} layouts, {} re-simulated -> {}\n", o.shards.size(),
                             outcome.analytic.size(), outcome.simgrid.size(), o.out);
  return kExitOk;
}

}  // namespace

Command add_merge_command(CLI::App& app) {
  auto opts = std::make_shared<MergeOptions>();
  MergeOptions& o = *opts;
  CLI::App* c = app.add_subcommand("merge", "Join the shard directories of one sweep into one result");
  c->add_option("shards", o.shards, "Output directories of dtsim sweep --shard i/N (all N of them)")
      ->required()
      ->type_name("SHARD_DIR...");
  c->add_option("-o,--out", o.out, "Directory for the joined results")
      ->required()
      ->type_name("DIR")
      ->check(output_path_check());
  c->add_flag("-q,--quiet", o.quiet, "No summary");
  return {c, [opts] { return merge_command(*opts); }};
}

}  // namespace dtsim::cli
