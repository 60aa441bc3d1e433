// dtsim collective --op OP --cluster PRESET|EXP.yaml [--gpus N] [--nodes N] [-b MIN] [-e MAX]
//                  [-f FACTOR] [--algo NAME] [--proto NAME] [-d TYPE] [-o REDOP] [--set key=value]...
//
// An nccl-tests-style sweep of one collective, simulated on the cluster's SimGrid platform:
// for each size from MIN to MAX (times FACTOR), one row with size, count, type, redop, root,
// time (us), algbw and busbw (GB/s, 1e9), using nccl-tests' definitions (doc/PERFORMANCE.md):
// algbw = size / time; busbw = algbw x 2(n-1)/n (AllReduce), (n-1)/n (ReduceScatter,
// AllGather, AllToAll), 1 (Broadcast, Reduce, SendRecv). dtsim prints one set of columns
// (nccl-tests prints out-of-place and in-place; the simulation does not tell them apart)
// and adds the algorithm and protocol chosen. The group is GPUs 0..N-1. With an MoE experiment
// file as --cluster, the AllToAll carries its token routing (model.moe), which --algo deepep
// needs; sizes are then the per-rank buffer of one copy per expert, as the plan's.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "models/checked.hpp"
#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "sim/cli/commands.hpp"
#include "sim/collectives/collective.hpp"
#include "sim/collectives/registry.hpp"
#include "sim/collectives/simulate.hpp"
#include "topologies/gpu_presets.hpp"
#include "topologies/node_presets.hpp"

namespace dtsim::cli {
namespace {

using collectives::CollOp;

struct CollectiveOptions {
  std::string op = "allreduce";
  std::string cluster;
  int64_t gpus = 0;
  int64_t nodes = 0;
  std::string min_bytes = "8", max_bytes = "8G";
  double factor = 2;
  std::string algo = "auto", proto = "auto";
  std::string dtype = "float", redop = "sum";
  std::vector<std::string> sets;
};

// nccl-tests data types (-d) and their sizes in bytes.
const std::vector<std::pair<std::string, int>> kTypes = {
    {"int8", 1},  {"uint8", 1},   {"int32", 4},    {"uint32", 4}, {"int64", 8},   {"uint64", 8},
    {"half", 2},  {"float", 4},   {"double", 8},   {"bfloat16", 2}};
const std::vector<std::string> kRedops = {"sum", "prod", "min", "max", "avg"};

/// nccl-tests size syntax: an integer with an optional K, M or G suffix (powers of 1024).
double parse_size(const std::string& text, const std::string& option) {
  std::string t = text;
  double mult = 1;
  if (!t.empty()) {
    const char s = static_cast<char>(std::toupper(static_cast<unsigned char>(t.back())));
    if (s == 'K' || s == 'M' || s == 'G') {
      mult = s == 'K' ? 1024.0 : s == 'M' ? 1024.0 * 1024 : 1024.0 * 1024 * 1024;
      t.pop_back();
    }
  }
  size_t used = 0;
  long long v = -1;
  try {
    v = std::stoll(t, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (t.empty() || used != t.size() || v < 1)
    throw InputError(option + " " + text + ": not a size (expected a positive integer of bytes with an optional K, M or "
                     "G suffix, powers of 1024, as nccl-tests: 8, 128K, 8G)");
  const double bytes = static_cast<double>(v) * mult;
  if (bytes > limits::kMaxMemoryBytes)
    throw InputError(fmt::format("{} {}: {:.4g} bytes is above the {:.4g}-byte limit of one GPU's buffer (1 PiB: {})",
                                 option, text, bytes, limits::kMaxMemoryBytes, limits::kPhysicalWhy));
  return bytes;
}

ClusterSpec preset_cluster(const CollectiveOptions& o) {
  const NodePreset& n = node_preset(o.cluster);  // InputError listing the presets
  ClusterSpec c = cluster_of(n, 0);
  if (o.nodes > 0) {
    const auto gpus = checked::mul(o.nodes, n.gpus_per_node);
    if (!gpus || *gpus > limits::kMaxGpus)
      throw InputError(fmt::format("--nodes {} x {} GPUs per node ({}) = {} exceeds the {}-GPU limit ({})", o.nodes,
                                   n.gpus_per_node, n.name,
                                   gpus ? checked::with_commas(*gpus) : std::string("more than 2^63"),
                                   checked::with_commas(limits::kMaxGpus), limits::kMaxGpusWhy));
  }
  if (o.nodes > 0) c.nodes = o.nodes;
  else if (o.gpus > 0) c.nodes = (o.gpus + n.gpus_per_node - 1) / n.gpus_per_node;
  else throw InputError("--cluster " + o.cluster + ": give --gpus or --nodes (a preset names one node)");
  c.name = std::to_string(c.nodes) + " x " + n.name;
  return c;
}

int collective_command(const CollectiveOptions& o) {
  const auto op = collectives::parse_op(o.op);
  if (!op) throw InputError("--op " + o.op + ": not a collective (valid: " + collectives::op_list() + ")");
  int type_size = 0;
  for (const auto& [name, size] : kTypes)
    if (name == o.dtype) type_size = size;
  if (type_size == 0) {
    std::string valid;
    for (const auto& [name, size] : kTypes) valid += (valid.empty() ? "" : ", ") + name;
    throw InputError("--dtype " + o.dtype + ": not a data type (valid: " + valid + ")");
  }
  if (std::find(kRedops.begin(), kRedops.end(), o.redop) == kRedops.end())
    throw InputError("--redop " + o.redop + ": not a reduction (valid: sum, prod, min, max, avg)");
  const double min_b = parse_size(o.min_bytes, "--min-bytes"), max_b = parse_size(o.max_bytes, "--max-bytes");
  if (max_b < min_b) throw InputError("--max-bytes " + o.max_bytes + " is below --min-bytes " + o.min_bytes);
  if (!(o.factor > 1) || !std::isfinite(o.factor))
    throw InputError("--factor " + fmt::format("{}", o.factor) + " must be a finite number > 1");
  // Each size is one simulated collective: refuse a sweep longer than the stated limit
  // before simulating any (a factor near 1 used to run for ever).
  const double n_sizes = std::floor(std::log(max_b / min_b) / std::log(o.factor) + 1e-9) + 1;
  if (!(n_sizes <= static_cast<double>(limits::kMaxCollectiveSizes)))
    throw InputError(fmt::format("--factor {} gives {:.4g} sizes from --min-bytes {} to --max-bytes {}: more than the "
                                 "{}-size limit (each size is one simulated collective; nccl-tests' default sweep, "
                                 "-b 8 -e 8G -f 2, has 31); raise --factor or narrow the range",
                                 o.factor, n_sizes, o.min_bytes, o.max_bytes,
                                 checked::with_commas(limits::kMaxCollectiveSizes)));
  if (o.gpus > limits::kMaxGpus)
    throw InputError("--gpus " + std::to_string(o.gpus) + " exceeds the " + checked::with_commas(limits::kMaxGpus) +
                     "-GPU limit (" + limits::kMaxGpusWhy + ")");

  ClusterSpec cluster;
  collectives::TokenRouting routing;  // an MoE experiment's token routing (the deepep algorithm reads it)
  // A path (an existing file, or anything that looks like one) names an experiment file.
  const std::string ext = std::filesystem::path(o.cluster).extension().string();
  const bool from_file = std::filesystem::exists(o.cluster) || ext == ".yaml" || ext == ".yml" ||
                         o.cluster.find('/') != std::string::npos;
  if (from_file) {
    require_input_file(o.cluster);
    const Experiment e = load_experiment(o.cluster, o.sets);
    cluster = e.cluster;
    routing = collectives::ep_token_routing(e);
    if (o.nodes > 0) throw InputError("--nodes applies to a preset; set cluster.nodes in " + o.cluster + " (or --set)");
  } else {
    if (!o.sets.empty()) throw InputError("--set applies to an experiment file given as --cluster, not to a preset");
    cluster = preset_cluster(o);
  }
  const int64_t n = o.gpus > 0 ? o.gpus : cluster.gpus();
  if (n > cluster.gpus())
    throw InputError("--gpus " + std::to_string(n) + " exceeds the cluster's " + std::to_string(cluster.gpus()) +
                     " GPUs (" + std::to_string(cluster.nodes) + " nodes x " + std::to_string(cluster.gpus_per_node) + ")");
  if (n < 1) throw InputError("--gpus must be >= 1");

  // nccl-tests: the element count of each size, a multiple of n where the buffer is split.
  const bool split = *op == CollOp::ReduceScatter || *op == CollOp::AllGather || *op == CollOp::AllToAll;
  std::vector<double> sizes;
  std::vector<int64_t> counts;
  for (double s = min_b; s <= max_b * (1 + 1e-12) && sizes.size() <= static_cast<size_t>(n_sizes); s *= o.factor) {
    int64_t count = static_cast<int64_t>(std::floor(s / type_size));
    if (split) count -= count % n;
    if (count <= 0) continue;
    counts.push_back(count);
    sizes.push_back(static_cast<double>(count) * type_size);
  }
  if (sizes.empty()) throw InputError("no size from --min-bytes to --max-bytes holds a whole element per GPU");

  std::vector<collectives::CollectiveRun> runs;
  std::vector<int64_t> members(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) members[static_cast<size_t>(i)] = i;
  for (size_t i = 0; i < sizes.size(); ++i) {
    collectives::CollectiveRun r;
    r.members = members;
    r.op = *op;
    r.bytes = sizes[i];
    r.choice.algorithm = o.algo;
    r.choice.protocol = o.proto;
    r.routing = routing;
    r.batch = static_cast<int>(i);
    runs.push_back(std::move(r));
  }
  const auto timings = collectives::simulate_collectives(cluster, runs);

  const bool rooted = *op == CollOp::Broadcast || *op == CollOp::Reduce;
  const std::string redop = collectives::reduces(*op) ? o.redop : "none";
  const double factor = collectives::busbw_factor(*op, n);
  std::cout << fmt::format("# dtsim collective: {} on {} GPUs of {} ({} GPUs per node, fabric {}), algorithm {}, protocol {}\n",
                           collectives::to_string(*op), n, cluster.name.empty() ? std::to_string(cluster.nodes) + " nodes" : cluster.name,
                           cluster.gpus_per_node, cluster.fabric, o.algo, o.proto);
  std::cout << "# simulated on SimGrid; algbw = size/time, busbw = algbw x " << fmt::format("{:.4g}", factor)
            << " (nccl-tests doc/PERFORMANCE.md)\n#\n";
  std::cout << fmt::format("# {:>12} {:>12} {:>8} {:>6} {:>5} {:>11} {:>8} {:>8}  {:<12} {}\n", "size", "count", "type",
                           "redop", "root", "time", "algbw", "busbw", "algorithm", "protocol");
  std::cout << fmt::format("# {:>12} {:>12} {:>8} {:>6} {:>5} {:>11} {:>8} {:>8}\n", "(B)", "(elements)", "", "", "",
                           "(us)", "(GB/s)", "(GB/s)");
  double sum_bus = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const double t = timings[i].time_s;
    const double algbw = t > 0 ? sizes[i] / t / 1e9 : 0;
    const double busbw = algbw * factor;
    sum_bus += busbw;
    std::cout << fmt::format("  {:>12} {:>12} {:>8} {:>6} {:>5} {:>11.2f} {:>8.2f} {:>8.2f}  {:<12} {}\n",
                             static_cast<int64_t>(sizes[i]), counts[i], o.dtype, redop, rooted ? 0 : -1, t * 1e6, algbw,
                             busbw, timings[i].algorithm, collectives::to_string(timings[i].protocol));
  }
  std::cout << fmt::format("# Avg bus bandwidth    : {:.3f}\n", sum_bus / static_cast<double>(sizes.size()));
  return kExitOk;
}

}  // namespace

Command add_collective_command(CLI::App& app) {
  auto opts = std::make_shared<CollectiveOptions>();
  CollectiveOptions& o = *opts;
  CLI::App* c = app.add_subcommand(
      "collective", "Simulate a sweep of one collective on a cluster and print an nccl-tests table (size, count, type, "
                    "redop, root, time, algbw, busbw)");
  c->add_option("--op", o.op, "Collective: " + collectives::op_list())->capture_default_str();
  CLI::Option* cluster =
      c->add_option("--cluster", o.cluster, "Node preset or an experiment file")->required()->type_name("PRESET|EXP.yaml");
  // The preset names are read from the preset files, so only when this command is used (its
  // help included), not for every dtsim command.
  c->preparse_callback([cluster](size_t) {
    cluster->description("Node preset (" + node_preset_list() +
                         ") or an experiment file whose cluster section (and, for --algo deepep, MoE routing) is used");
  });
  c->add_option("-g,--gpus", o.gpus, "GPUs in the group (GPUs 0..N-1; default: every GPU of the cluster)")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  c->add_option("--nodes", o.nodes, "Nodes of a preset cluster (default: enough for --gpus)")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  c->add_option("-b,--min-bytes", o.min_bytes, "Smallest size (bytes; K, M, G suffixes, powers of 1024)")
      ->capture_default_str();
  c->add_option("-e,--max-bytes", o.max_bytes, "Largest size")->capture_default_str();
  c->add_option("-f,--factor", o.factor, "Size multiplier between rows")->capture_default_str();
  c->add_option("--algo", o.algo, "Algorithm: auto (NCCL-style tuner) or " + collectives::algorithm_list())
      ->capture_default_str();
  c->add_option("--proto", o.proto, "Protocol: auto, simple, ll, ll128")->capture_default_str();
  c->add_option("-d,--dtype", o.dtype, "Data type (sets count = size / type size)")->capture_default_str();
  c->add_option("-o,--redop", o.redop, "Reduction printed for reducing collectives: sum, prod, min, max, avg")
      ->capture_default_str();
  add_set_option(c, o.sets, "Override a key of the experiment file given as --cluster (repeatable)");
  return {c, [opts] { return collective_command(*opts); }};
}

}  // namespace dtsim::cli
