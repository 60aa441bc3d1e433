#pragma once
// Inputs of `dtsim sweep` and `dtsim compare`: one model and training, one or more clusters
// (optionally varied), and a layout space (sweep) or a fixed layout (compare).
//
// File format (YAML; every key not listed is an error naming its dotted path):
//   title: string (optional)
//   model:    as in an experiment file (models/experiment_io.hpp), or hf_config
//   training: as in an experiment file; micro_batch may be left out when the space gives it
//   clusters: a list of one or more experiment `cluster:` sections, each with optional
//             name (label in reports) and price_per_gpu_hour (USD per GPU-hour; needed to
//             rank or report by cost)
//   vary:     optional map of cluster keys (dotted, as under cluster:, e.g. nodes,
//             nic.bandwidth, gpu, node) to lists of values; every combination is applied to
//             every cluster (a cluster parameter sweep); a value repeated in a list (the
//             same text) counts once, as repeated values in space: lists do
//   space:    (sweep; compare when layout is absent) the layout space, each key a value, a
//             list, `auto` or a range {from, to, step} (arithmetic) / {from, to, factor}
//             (geometric):
//               tp, cp:  auto = powers of two up to GPUs per node (keep TP and CP inside the
//                        NVLink domain, ../shared/design/MATH.md Sec 5)
//               ep:      expert parallel size (MoE models); auto = every divisor of
//                        model.moe.num_experts up to the GPUs (1 for a dense model)
//               etp:     expert tensor parallel size; auto = powers of two up to GPUs per
//                        node; missing: etp = tp (Megatron-Core's default)
//               pp:      auto = every divisor of model.layers
//               vp:      auto = 1, 2, 3, 4 where pp > 1 and pp*vp divides model.layers
//                        (Korthikanti 2022 Sec 6 runs 175B/530B with 3 virtual stages)
//               dp:      auto = GPUs / (tp cp pp) (default); a list keeps only those values
//               zero_stage: auto = 0..3;  micro_batch: auto = 1, 2, 4, 8
//               recompute: auto = none, selective, full; sequence_parallel: auto = false, true
//               schedule: a pipeline schedule name or a list of them (models/schedules/);
//                        auto = every registered one; missing: interleaved where vp > 1,
//                        else 1f1b. A schedule whose constraints a point breaks (e.g.
//                        dualpipe with an odd pp) makes that point invalid with the reason.
//             Missing keys: dp auto, cp 1, vp 1, ep 1, etp = tp, zero_stage 0, sequence_parallel false,
//             recompute none; tp, pp and micro_batch (unless in training) are required.
//   layout:   (compare only) a fixed experiment `layout:` section applied to every cluster
//   rank_by:  step_time (default) | tokens_per_s_per_gpu | cost (USD per million tokens)
//   refine_top: how many of the best valid layouts the SimGrid engine re-simulates (default
//             20 for sweep, 3 per cluster for compare)
// Model, cluster and training sections are validated by parse_experiment on a composed
// experiment, so they follow the experiment rules exactly; messages name this file and the
// key as written here (clusters[i].KEY; vary.KEY=VALUE for a varied value).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "models/experiment.hpp"

namespace dtsim {

enum class RankBy { step_time, tokens_per_s_per_gpu, cost };
const char* to_string(RankBy);

/// One integer dimension of the layout space: `auto`, or explicit values (ascending, unique).
struct IntChoice {
  bool is_auto = false;
  std::vector<int64_t> values;
};

struct LayoutSpace {
  IntChoice tp, cp, pp, vp, dp, micro_batch;
  /// Expert parallelism (Layout::ep, Layout::etp). etp.values = {0}: etp follows tp.
  IntChoice ep, etp;
  std::vector<int> zero_stages;          // ascending
  std::vector<Recompute> recompute;      // in file order, unique
  std::vector<bool> sequence_parallel;   // in file order, unique
  /// layout.schedule values (models/schedules/), in file order, unique; empty: by vp
  /// (interleaved where vp > 1, else 1f1b), as before the key existed.
  std::vector<Schedule> schedules;
};

/// One cluster of the sweep after `vary` was applied, parsed and validated.
struct ClusterCase {
  std::string label;              // clusters[i].name (or the parsed cluster's name) + varied values
  /// Model, cluster, training. Sweep: layout unset, micro_batch = training.micro_batch or 0.
  /// Compare with a fixed layout: the complete, validated experiment.
  Experiment base;
  double price_per_gpu_hour = 0;  // USD; 0 when not given
};

struct SweepSpec {
  std::string source;   // file path
  std::string title;
  std::string fingerprint;  // 16 hex digits: FNV-1a of the file bytes (resume/merge check)
  std::vector<ClusterCase> clusters;
  LayoutSpace space;
  bool has_space = false;
  /// compare: a fixed layout was given; every ClusterCase::base carries it (validated).
  bool fixed_layout = false;
  std::optional<int64_t> training_micro_batch;  // training.micro_batch when given
  RankBy rank_by = RankBy::step_time;
  int64_t refine_top = 20;
};

enum class SpecKind { sweep, compare };

/// Reads a sweep (or compare) file. Throws InputError listing every problem, each naming the
/// file, the key and the violated constraint.
SweepSpec load_sweep_spec(const std::string& path, SpecKind kind);
/// Same from text; `base_dir` resolves model.hf_config.
SweepSpec parse_sweep_spec(const std::string& yaml_text, const std::string& source, SpecKind kind,
                           const std::string& base_dir = ".");

/// Values of an integer dimension for one cluster (auto resolved as documented above).
/// `pp` is only used for vp.
std::vector<int64_t> resolve_tp(const LayoutSpace& s, const Experiment& base);
std::vector<int64_t> resolve_cp(const LayoutSpace& s, const Experiment& base);
std::vector<int64_t> resolve_pp(const LayoutSpace& s, const Experiment& base);
std::vector<int64_t> resolve_ep(const LayoutSpace& s, const Experiment& base);
/// The etp values of a point with tensor parallel size `tp` (etp missing: {tp}).
std::vector<int64_t> resolve_etp(const LayoutSpace& s, const Experiment& base, int64_t tp);
std::vector<int64_t> resolve_vp(const LayoutSpace& s, const Experiment& base, int64_t pp);
std::vector<int64_t> resolve_micro_batch(const LayoutSpace& s, const std::optional<int64_t>& training_mb);

// ---- results ----

/// One evaluated layout of a sweep (a row of its CSV and JSON). Seconds, bytes, USD.
struct SweepRow {
  int64_t id = 0;               // position in the enumeration (all clusters), stable
  std::string engine;           // "analytic" or "simgrid"
  int64_t cluster = 0;          // index into SweepSpec::clusters
  std::string cluster_label;
  std::string gpu;
  int64_t nodes = 0, gpus = 0;
  Layout layout;
  int64_t micro_batch = 0;
  int64_t micro_batches = 0;    // gradient accumulation steps
  std::string status;           // "ok", "invalid" (reason says why), "oom" (does not fit)
  std::string reason;
  double step_time_s = 0, tokens_per_s = 0, tokens_per_s_per_gpu = 0, mfu = 0, tflops_per_gpu = 0;
  double compute_s = 0, bubble_s = 0, optimizer_s = 0;
  double host_bound_s = 0;  // GPU waiting for the host's launches (models/host_dispatch.hpp)
  double exposed_tp_s = 0, exposed_cp_s = 0, exposed_pp_s = 0, exposed_dp_s = 0, exposed_ep_s = 0;
  double peak_memory_bytes = 0, capacity_bytes = 0;
  double usd_per_step = 0, usd_per_mtoken = 0;  // 0 without a price
  bool valid() const { return status == "ok"; }
};

/// The value a row is ranked by (smaller is better): step time, -tokens/s per GPU, or USD per
/// million tokens.
double rank_value(const SweepRow& r, RankBy by);

/// FNV-1a 64-bit of `bytes`, 16 lowercase hex digits.
std::string fingerprint_of(const std::string& bytes);

// ---- helpers shared with models/plan_spec.cpp (same file rules) ----
namespace spec_io {

/// Problems of one spec file, each "FILE: message", each line once (a model section shared by
/// the clusters of a compare is checked once per cluster); throw_if_any() throws InputError.
class Problems {
 public:
  explicit Problems(std::string file) : file_(std::move(file)) {}
  void add(const std::string& message) { add_raw(file_ + ": " + message); }
  void add_raw(const std::string& line) {
    if (std::find(list_.begin(), list_.end(), line) == list_.end()) list_.push_back(line);
  }
  bool empty() const { return list_.empty(); }
  void throw_if_any() const;
  const std::string& file() const { return file_; }

 private:
  std::string file_;
  std::vector<std::string> list_;
};

/// Loads YAML text; on a syntax error adds the problem and returns an undefined node.
YAML::Node load_yaml(const std::string& text, Problems& p);
/// Reports keys of map `node` (at dotted `path`) that are not in `valid`; false when `node`
/// is not a map.
bool check_keys(const YAML::Node& node, const std::string& path, const std::vector<std::string>& valid,
                Problems& p);
std::optional<int64_t> integer(const YAML::Node& node, const std::string& path, Problems& p);
std::optional<double> number(const YAML::Node& node, const std::string& path, Problems& p);

/// Parses the layout space map at `path` (documented in this header).
LayoutSpace parse_space(const YAML::Node& node, const std::string& path, Problems& p);

/// The experiment of `cluster` (a YAML map as under an experiment's `cluster:`) with the
/// spec's model and training and a placeholder layout, validated by parse_experiment.
/// `where` names the cluster in messages (e.g. "clusters[1]"); `extra_keys` are removed from
/// the cluster map first (e.g. price_per_gpu_hour). Problems go to `p`; nullopt on error.
/// With `layout` defined, that layout and the training as given are used instead (compare:
/// every problem is reported).
std::optional<Experiment> compose(const YAML::Node& model, const YAML::Node& training, const YAML::Node& cluster,
                                  const std::string& title, const std::string& where,
                                  const std::string& base_dir, Problems& p,
                                  const YAML::Node& layout = YAML::Node(YAML::NodeType::Undefined));

/// A copy of map `node` with dotted `key` set to `value` (maps created on the way; a scalar
/// `gpu` becomes {preset: NAME} when a field below it is set).
YAML::Node with_value(const YAML::Node& node, const std::string& key, const YAML::Node& value);

}  // namespace spec_io

}  // namespace dtsim
