// dtsim import megatron SCRIPT|-- ARGS... [-o OUT.yaml] [--node PRESET --nodes N | --cluster FILE.yaml] [--set K=V]...
// dtsim export megatron EXP.yaml [--set K=V]... [--layout-only]
//
// Megatron in, Megatron out (models/megatron_args.hpp): a Megatron-LM launch script or command
// line to an experiment file, and an experiment to the flags that launch it.
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/input_files.hpp"
#include "models/launch_script.hpp"
#include "models/megatron_args.hpp"
#include "models/scalar_text.hpp"
#include "reports/atomic_file.hpp"
#include "reports/terminal_text.hpp"
#include "sim/cli/commands.hpp"

namespace dtsim::cli {

namespace {

struct ImportOptions {
  std::vector<std::string> input;
  std::string out = "-";
  std::string node, cluster;
  int64_t nodes = 0;
  std::vector<std::string> sets;
  bool quiet = false;
};

void list(const std::string& title, const std::vector<std::string>& items) {
  if (items.empty()) return;
  std::cerr << "  " << title << " (" << items.size() << "):\n";
  for (const auto& i : items) std::cerr << "    " << printable(i) << "\n";
}

int import_command(const ImportOptions& opts) {
  ImportOptions o = opts;
  for (auto& w : o.input) w = unmark_word(std::move(w));
  if (o.input.empty()) throw InputError("dtsim import megatron: give a launch script, or the flags after `--`");
  if (!o.cluster.empty()) {
    require_input_file(o.cluster);
    note_input_file(o.cluster);
  }
  require_output_file(o.out, "-o", true);
  LaunchCommand cmd;
  MegatronImportOptions io;
  // One word that is not a flag nor a *.py script: a launch script file.
  const std::string& first = o.input.front();
  const bool script = o.input.size() == 1 && first.rfind("-", 0) != 0 &&
                      !(first.size() > 3 && first.compare(first.size() - 3, 3, ".py") == 0);
  if (script) {
    require_input_file(first);
    note_input_file(first);
    std::ifstream in(first, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in && !in.eof()) throw std::runtime_error(first + ": read failed");
    cmd = read_launch_script(ss.str(), first);
    io.source = first;
  } else {
    cmd = launch_from_words(o.input);
    io.source = "command line";
  }
  io.node = o.node;
  io.nodes = o.nodes;
  io.cluster_file = o.cluster;
  io.sets = o.sets;
  const MegatronImport r = import_megatron(cmd, io);
  write_output_file(o.out, r.yaml, "-o", true);
  if (!o.quiet) {
    const Experiment& e = r.experiment;
    std::cerr << fmt::format("dtsim import megatron: {} -> {}\n  {} x {} GPUs, tp {} pp {} vp {} cp {} ep {} dp {}\n",
                             io.source, o.out == "-" ? "standard output" : o.out, e.cluster.nodes,
                             e.cluster.gpus_per_node, e.layout.tp, e.layout.pp, e.layout.vp, e.layout.cp,
                             e.layout.ep, e.layout.dp);
    std::cerr << fmt::format("  flags: {} mapped, {} ignored, {} not modeled, {} not understood\n", r.mapped.size(),
                             r.ignored.size(), r.not_modeled.size(), r.not_understood.size());
    list("not understood", r.not_understood);
    list("not modeled (known Megatron-LM flags, effect not in dtsim's model)", r.not_modeled);
    if (!r.ignored.empty()) std::cerr << "  ignored (no effect on step time/memory): " << printable(text::join(r.ignored)) << "\n";
    list("notes", r.notes);
  }
  return kExitOk;
}

struct ExportOptions {
  std::string experiment;
  std::vector<std::string> sets;
  bool layout_only = false;
};

int export_command(const ExportOptions& o) {
  require_input_file(o.experiment);
  const Experiment e = load_experiment(o.experiment, o.sets);
  std::vector<std::string> nx;
  const auto args = megatron_args(e, o.layout_only ? MegatronScope::layout : MegatronScope::all, &nx);
  std::cout << shell_join(args) << "\n";
  for (const auto& n : nx) std::cerr << "note: not expressed by the flags: " << printable(n) << "\n";
  return kExitOk;
}

}  // namespace

Command add_import_command(CLI::App& app) {
  auto opts = std::make_shared<ImportOptions>();
  ImportOptions& o = *opts;
  CLI::App* c = app.add_subcommand("import", "Turn another tool's launch into an experiment file");
  c->require_subcommand(1);
  CLI::App* m = c->add_subcommand(
      "megatron", "A Megatron-LM launch script (or its flags after --) to an experiment YAML file");
  m->add_option("input", o.input, "Launch script (torchrun ... pretrain_gpt.py --num-layers ...), or -- FLAGS...")
      ->required()
      ->type_name("SCRIPT|-- ARGS");
  m->add_option("-o,--out", o.out, "Experiment file to write (default: standard output)")
      ->type_name("OUT.yaml")
      ->check(output_path_check());
  CLI::Option* node =
      m->add_option("--node", o.node, "Node preset of the cluster (cluster.node), e.g. dgx-h100")->type_name("PRESET");
  m->add_option("--nodes", o.nodes, "Node count (default: the cluster file's, else torchrun --nnodes)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  m->add_option("--cluster", o.cluster, "Copy the cluster: section of this YAML file (an experiment)")
      ->type_name("FILE.yaml")
      ->excludes(node);  // one source for the node type
  add_set_option(m, o.sets, "Set a key of the output, e.g. --set model.vocab=128256 (repeatable)");
  m->add_flag("-q,--quiet", o.quiet, "No report on standard error");
  return {c, [opts] { return import_command(*opts); }};
}

Command add_export_command(CLI::App& app) {
  auto opts = std::make_shared<ExportOptions>();
  ExportOptions& o = *opts;
  CLI::App* c = app.add_subcommand("export", "Write an experiment as another tool's launch flags");
  c->require_subcommand(1);
  CLI::App* m = c->add_subcommand("megatron", "The Megatron-LM flags that launch an experiment (one line)");
  m->add_option("experiment", o.experiment, "Experiment YAML file")->required()->type_name("EXP.yaml");
  add_set_option(m, o.sets);
  m->add_flag("--layout-only", o.layout_only, "Only the layout flags (parallelism, batch, recompute)");
  return {c, [opts] { return export_command(*opts); }};
}

}  // namespace dtsim::cli
