// Sweep and compare files (see models/sweep_spec.hpp for the format).
#include "models/sweep_spec.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "models/checked.hpp"
#include "models/schedules/schedule.hpp"
#include "models/errors.hpp"
#include "models/input_files.hpp"
#include "models/scalar_text.hpp"
#include "models/yaml_text.hpp"
#include "models/experiment_io.hpp"
#include "topologies/node_presets.hpp"
#include "topologies/preset_files.hpp"

namespace dtsim {

const char* to_string(RankBy r) {
  switch (r) {
    case RankBy::step_time: return "step_time";
    case RankBy::tokens_per_s_per_gpu: return "tokens_per_s_per_gpu";
    case RankBy::cost: return "cost";
  }
  return "?";
}

double rank_value(const SweepRow& r, RankBy by) {
  switch (by) {
    case RankBy::step_time: return r.step_time_s;
    case RankBy::tokens_per_s_per_gpu: return -r.tokens_per_s_per_gpu;
    case RankBy::cost: return r.usd_per_mtoken;
  }
  return r.step_time_s;
}

std::string fingerprint_of(const std::string& bytes) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a 64 offset basis
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ULL;  // FNV prime
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

namespace spec_io {

namespace {

using text::join;
using text::quote;
using text::to_double;
using text::to_int;

/// Rewrites messages of a composed experiment so that they name the spec's keys:
/// "cluster.X" -> "<where>.X" (and a bare "cluster" -> where).
std::string rename_cluster(const std::string& msg, const std::string& where) {
  std::string out;
  size_t i = 0;
  auto is_word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  while (i < msg.size()) {
    if (msg.compare(i, 7, "cluster") == 0 && (i == 0 || !is_word(msg[i - 1])) &&
        (i + 7 >= msg.size() || !is_word(msg[i + 7]))) {
      out += where;
      i += 7;
    } else {
      out += msg[i++];
    }
  }
  return out;
}

}  // namespace

void Problems::throw_if_any() const {
  if (!list_.empty()) throw InputError(list_);
}

YAML::Node load_yaml(const std::string& text, Problems& p) {
  try {
    // One document; a second one, unterminated strings and deep nesting say so.
    return load_yaml_document(text, "");
  } catch (const InputError& e) {
    for (const auto& msg : e.problems()) p.add(msg);
  } catch (const YAML::ParserException& e) {
    p.add("invalid YAML at line " + std::to_string(e.mark.line + 1) + ", column " + std::to_string(e.mark.column + 1) +
          ": " + e.msg);
  } catch (const YAML::Exception& e) {
    p.add(std::string("invalid YAML: ") + e.what());
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

bool check_keys(const YAML::Node& node, const std::string& path, const std::vector<std::string>& valid,
                Problems& p) {
  if (!node.IsMap()) {
    p.add((path.empty() ? std::string("the file") : path) + " must be a map");
    return false;
  }
  std::set<std::string> seen;
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) {
      p.add("a key under " + (path.empty() ? std::string("the top level") : path) + " is not a scalar");
      continue;
    }
    const std::string key = kv.first.Scalar();
    const std::string full = path.empty() ? key : path + "." + key;
    if (!seen.insert(key).second) p.add("duplicate key " + full);
    if (std::find(valid.begin(), valid.end(), key) == valid.end())
      p.add("unknown key " + full + " (valid keys" + (path.empty() ? std::string("") : " under " + path) + ": " +
            join(valid) + ")");
  }
  return true;
}

std::optional<int64_t> integer(const YAML::Node& node, const std::string& path, Problems& p) {
  if (!node.IsScalar()) {
    p.add(path + " must be an integer");
    return std::nullopt;
  }
  auto v = to_int(node.Scalar());
  if (!v) p.add(path + "=" + quote(node.Scalar()) + " is not an integer");
  return v;
}

std::optional<double> number(const YAML::Node& node, const std::string& path, Problems& p) {
  if (!node.IsScalar()) {
    p.add(path + " must be a number");
    return std::nullopt;
  }
  auto v = to_double(node.Scalar());
  if (!v) p.add(path + "=" + quote(node.Scalar()) + " is not a number");
  return v;
}

namespace {

/// Values of a scalar / list / range; `positive` requires >= 1 (else >= 0).
IntChoice parse_int_choice(const YAML::Node& n, const std::string& path, Problems& p, bool allow_auto,
                           int64_t min_value) {
  IntChoice c;
  auto add = [&](const YAML::Node& item, const std::string& where) {
    if (auto v = integer(item, where, p)) {
      if (*v < min_value) p.add(where + "=" + std::to_string(*v) + " must be >= " + std::to_string(min_value));
      else c.values.push_back(*v);
    }
  };
  if (n.IsScalar() && n.Scalar() == "auto") {
    if (!allow_auto) p.add(path + "=auto is not allowed here");
    c.is_auto = true;
    return c;
  }
  if (n.IsScalar()) {
    add(n, path);
  } else if (n.IsSequence()) {
    if (n.size() == 0) p.add(path + " is an empty list (give at least one value)");
    for (size_t i = 0; i < n.size(); ++i) add(n[i], path + "[" + std::to_string(i) + "]");
  } else if (n.IsMap()) {
    if (!check_keys(n, path, {"from", "to", "step", "factor"}, p)) return c;
    const YAML::Node from = n["from"], to = n["to"], step = n["step"], factor = n["factor"];
    if (!from || !to) {
      p.add(path + " range needs from and to");
      return c;
    }
    if (step && factor) {
      p.add(path + " range takes step (arithmetic) or factor (geometric), not both");
      return c;
    }
    auto a = integer(from, path + ".from", p), b = integer(to, path + ".to", p);
    const std::optional<int64_t> s = step ? integer(step, path + ".step", p) : std::optional<int64_t>(1);
    const std::optional<int64_t> f = factor ? integer(factor, path + ".factor", p) : std::optional<int64_t>(2);
    if (!a || !b || !s || !f) return c;  // a non-integer has its message
    const int64_t fv = *f;
    if (*a < min_value) p.add(path + ".from=" + std::to_string(*a) + " must be >= " + std::to_string(min_value));
    if (*b < *a) p.add(path + ".to=" + std::to_string(*b) + " must be >= from=" + std::to_string(*a));
    if (!factor && *s < 1) p.add(path + ".step=" + std::to_string(*s) + " must be >= 1");
    if (factor && fv < 2) p.add(path + ".factor=" + std::to_string(fv) + " must be >= 2");
    if (*a < min_value || *b < *a || (!factor && *s < 1) || (factor && fv < 2)) return c;
    if (factor && *a < 1) {
      p.add(path + ".from must be >= 1 for a geometric range");
      return c;
    }
    for (int64_t v = *a; v <= *b;) {
      c.values.push_back(v);
      if (c.values.size() > 100000) {
        p.add(path + " range has more than 100000 values");
        break;
      }
      // Checked: a step past INT64_MAX ends the range instead of wrapping.
      const auto next = factor ? checked::mul(v, fv) : checked::add(v, *s);
      if (!next) break;
      v = *next;
    }
  } else {
    p.add(path + " must be a value, a list, auto or a range {from, to, step|factor}");
  }
  std::sort(c.values.begin(), c.values.end());
  c.values.erase(std::unique(c.values.begin(), c.values.end()), c.values.end());
  return c;
}

template <class T>
std::vector<T> parse_enum_list(const YAML::Node& n, const std::string& path, Problems& p,
                               const std::vector<std::pair<std::string, T>>& choices) {
  std::vector<T> out;
  std::vector<std::string> names;
  for (const auto& c : choices) names.push_back(c.first);
  auto one = [&](const YAML::Node& item, const std::string& where) {
    if (!item.IsScalar()) {
      p.add(where + " must be one of " + join(names));
      return;
    }
    for (const auto& c : choices)
      if (c.first == item.Scalar()) {
        if (std::find(out.begin(), out.end(), c.second) == out.end()) out.push_back(c.second);
        return;
      }
    p.add(where + "=" + quote(item.Scalar()) + " is not one of " + join(names));
  };
  if (n.IsScalar() && n.Scalar() == "auto") {
    for (const auto& c : choices) out.push_back(c.second);
  } else if (n.IsSequence()) {
    if (n.size() == 0) p.add(path + " is an empty list (give at least one value)");
    for (size_t i = 0; i < n.size(); ++i) one(n[i], path + "[" + std::to_string(i) + "]");
  } else {
    one(n, path);
  }
  return out;
}

}  // namespace

LayoutSpace parse_space(const YAML::Node& node, const std::string& path, Problems& p) {
  LayoutSpace s;
  s.dp.is_auto = true;
  s.cp.values = {1};
  s.vp.values = {1};
  s.ep.values = {1};
  s.etp.values = {0};
  s.zero_stages = {0};
  s.recompute = {Recompute::none};
  s.sequence_parallel = {false};
  if (!check_keys(node, path,
                  {"tp", "cp", "pp", "vp", "dp", "ep", "etp", "zero_stage", "micro_batch", "recompute",
                   "sequence_parallel", "schedule"},
                  p))
    return s;
  auto key = [&](const char* k) { return path + "." + k; };
  if (node["tp"]) s.tp = parse_int_choice(node["tp"], key("tp"), p, true, 1);
  else p.add(key("tp") + " is required (a value, a list, auto or a range)");
  if (node["pp"]) s.pp = parse_int_choice(node["pp"], key("pp"), p, true, 1);
  else p.add(key("pp") + " is required (a value, a list, auto or a range)");
  if (node["cp"]) s.cp = parse_int_choice(node["cp"], key("cp"), p, true, 1);
  if (node["vp"]) s.vp = parse_int_choice(node["vp"], key("vp"), p, true, 1);
  if (node["dp"]) s.dp = parse_int_choice(node["dp"], key("dp"), p, true, 1);
  if (node["ep"]) s.ep = parse_int_choice(node["ep"], key("ep"), p, true, 1);
  if (node["etp"]) s.etp = parse_int_choice(node["etp"], key("etp"), p, true, 1);
  if (node["micro_batch"]) s.micro_batch = parse_int_choice(node["micro_batch"], key("micro_batch"), p, true, 1);
  if (node["zero_stage"]) {
    const IntChoice z = parse_int_choice(node["zero_stage"], key("zero_stage"), p, true, 0);
    s.zero_stages.clear();
    if (z.is_auto) s.zero_stages = {0, 1, 2, 3};
    for (int64_t v : z.values) {
      if (v > 3) p.add(key("zero_stage") + "=" + std::to_string(v) + " must be 0, 1, 2 or 3");
      else s.zero_stages.push_back(static_cast<int>(v));
    }
  }
  if (node["recompute"])
    s.recompute = parse_enum_list<Recompute>(
        node["recompute"], key("recompute"), p,
        {{"none", Recompute::none}, {"selective", Recompute::selective}, {"full", Recompute::full}});
  if (node["schedule"]) {
    std::vector<std::pair<std::string, Schedule>> names;
    for (const sched::PipelineSchedule* sc : sched::all_schedules()) names.push_back({sc->name(), sc->id()});
    s.schedules = parse_enum_list<Schedule>(node["schedule"], key("schedule"), p, names);
  }
  if (node["sequence_parallel"])
    s.sequence_parallel =
        parse_enum_list<bool>(node["sequence_parallel"], key("sequence_parallel"), p, {{"false", false}, {"true", true}});
  return s;
}

YAML::Node with_value(const YAML::Node& node, const std::string& key, const YAML::Node& value) {
  YAML::Node out = node.IsMap() ? YAML::Clone(node) : YAML::Node(YAML::NodeType::Map);
  const auto dot = key.find('.');
  if (dot == std::string::npos) {
    out[key] = YAML::Clone(value);
    return out;
  }
  const std::string head = key.substr(0, dot), rest = key.substr(dot + 1);
  const YAML::Node& cout_ = out;
  YAML::Node child = cout_[head] ? YAML::Clone(cout_[head]) : YAML::Node(YAML::NodeType::Map);
  if (child.IsScalar() && head == "gpu") {
    YAML::Node m(YAML::NodeType::Map);
    m["preset"] = child.Scalar();
    child = m;
  }
  out[head] = with_value(child, rest, value);
  return out;
}

std::optional<Experiment> compose(const YAML::Node& model, const YAML::Node& training, const YAML::Node& cluster,
                                  const std::string& title, const std::string& where,
                                  const std::string& base_dir, Problems& p, const YAML::Node& layout) {
  // GPUs of the cluster, to make the placeholder layout (DP over every GPU) valid: the only
  // checks that involve the layout are then the spec's own problems.
  int64_t gpus = 1;
  if (cluster.IsMap()) {
    int64_t nodes = 0, gpn = 0;
    const YAML::Node& c = cluster;
    if (c["nodes"] && c["nodes"].IsScalar()) nodes = to_int(c["nodes"].Scalar()).value_or(0);
    if (c["gpus_per_node"] && c["gpus_per_node"].IsScalar()) gpn = to_int(c["gpus_per_node"].Scalar()).value_or(0);
    if (gpn == 0 && c["node"] && c["node"].IsScalar()) {
      const std::string node = c["node"].Scalar();
      if (is_preset_file_ref(node)) {  // a user's node file, relative to the spec file
        try {
          gpn = load_node_file((std::filesystem::path(base_dir) / node).lexically_normal().string()).gpus_per_node;
        } catch (const InputError&) {
          // Reported, naming the file, when the experiment is read.
        }
      } else if (const NodePreset* np = find_node_preset(node)) {
        gpn = np->gpus_per_node;
      }
    }
    if (nodes > 0 && gpn > 0) gpus = nodes * gpn;
  }
  YAML::Node root(YAML::NodeType::Map);
  root["title"] = title;
  root["model"] = YAML::Clone(model);
  root["cluster"] = YAML::Clone(cluster);
  const bool fixed = layout.IsDefined() && !layout.IsNull();
  if (fixed) {
    root["layout"] = YAML::Clone(layout);
    root["training"] = YAML::Clone(training);
  } else {
    YAML::Node placeholder(YAML::NodeType::Map);
    placeholder["dp"] = "auto";
    placeholder["tp"] = 1;
    placeholder["cp"] = 1;
    placeholder["pp"] = 1;
    root["layout"] = placeholder;
    YAML::Node tr = training.IsMap() ? YAML::Clone(training) : YAML::Node(YAML::NodeType::Map);
    tr["micro_batch"] = 1;
    tr["global_batch"] = gpus;
    root["training"] = tr;
  }
  YAML::Emitter em;
  em << root;
  try {
    // Placeholder-layout problems belong to the layouts (each row reports its own), not to
    // this file: the cluster is kept.
    return parse_experiment(em.c_str(), p.file(), {}, base_dir, fixed ? "" : "layout.");
  } catch (const InputError& e) {
    for (const auto& line : e.problems()) p.add_raw(rename_cluster(line, where));
    return std::nullopt;
  }
}

}  // namespace spec_io

// ---------------------------------------------------------------------------------------

namespace {

using namespace spec_io;

std::vector<int64_t> powers_of_two_up_to(int64_t n) {
  std::vector<int64_t> v;
  for (int64_t x = 1; x <= std::max<int64_t>(1, n); x *= 2) v.push_back(x);
  return v;
}

std::string value_text(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  YAML::Emitter em;
  em << YAML::Flow << n;
  return em.c_str();
}

}  // namespace

std::vector<int64_t> resolve_tp(const LayoutSpace& s, const Experiment& base) {
  return s.tp.is_auto ? powers_of_two_up_to(base.cluster.gpus_per_node) : s.tp.values;
}
std::vector<int64_t> resolve_cp(const LayoutSpace& s, const Experiment& base) {
  return s.cp.is_auto ? powers_of_two_up_to(base.cluster.gpus_per_node) : s.cp.values;
}
std::vector<int64_t> resolve_pp(const LayoutSpace& s, const Experiment& base) {
  if (!s.pp.is_auto) return s.pp.values;
  std::vector<int64_t> v;
  for (int64_t d = 1; d <= base.model.layers; ++d)
    if (base.model.layers % d == 0 && d <= base.cluster.gpus()) v.push_back(d);
  return v;
}
std::vector<int64_t> resolve_ep(const LayoutSpace& s, const Experiment& base) {
  if (!s.ep.is_auto) return s.ep.values;
  std::vector<int64_t> v;
  const int64_t experts = base.model.moe.enabled() ? base.model.moe.num_experts : 1;
  for (int64_t d = 1; d <= experts && d <= base.cluster.gpus(); ++d)
    if (experts % d == 0) v.push_back(d);
  return v;
}
std::vector<int64_t> resolve_etp(const LayoutSpace& s, const Experiment& base, int64_t tp) {
  if (s.etp.is_auto) return powers_of_two_up_to(base.cluster.gpus_per_node);
  if (s.etp.values == std::vector<int64_t>{0}) return {tp};
  return s.etp.values;
}
std::vector<int64_t> resolve_vp(const LayoutSpace& s, const Experiment& base, int64_t pp) {
  if (!s.vp.is_auto) return s.vp.values;
  std::vector<int64_t> v = {1};
  if (pp > 1)
    for (int64_t x = 2; x <= 4; ++x)
      if (base.model.layers % (pp * x) == 0) v.push_back(x);
  return v;
}
std::vector<int64_t> resolve_micro_batch(const LayoutSpace& s, const std::optional<int64_t>& training_mb) {
  if (s.micro_batch.is_auto) return {1, 2, 4, 8};
  if (!s.micro_batch.values.empty()) return s.micro_batch.values;
  if (training_mb) return {*training_mb};
  return {};
}

SweepSpec parse_sweep_spec(const std::string& yaml_text, const std::string& source, SpecKind kind,
                           const std::string& base_dir) {
  Problems p(source);
  SweepSpec spec;
  spec.source = source;
  spec.fingerprint = fingerprint_of(yaml_text);
  spec.refine_top = kind == SpecKind::sweep ? 20 : 3;
  const YAML::Node root = load_yaml(yaml_text, p);
  p.throw_if_any();
  if (!root.IsDefined() || root.IsNull()) {
    p.add("the file is empty (expected model, training, clusters and " +
          std::string(kind == SpecKind::sweep ? "space" : "layout or space") + ")");
    p.throw_if_any();
  }
  std::vector<std::string> keys = {"title", "model", "training", "clusters", "vary", "space", "rank_by", "refine_top"};
  if (kind == SpecKind::compare) keys.push_back("layout");
  if (!check_keys(root, "", keys, p)) p.throw_if_any();

  if (root["title"]) {
    if (root["title"].IsScalar()) spec.title = value_text(root["title"]);
    else
      p.add("title must be a single line of text (got a " + std::string(root["title"].IsMap() ? "map" : "list") + ")");
  }
  for (const char* k : {"model", "training", "clusters"})
    if (!root[k]) p.add(std::string(k) + " is required");
  const YAML::Node model = root["model"], training = root["training"];

  // training: micro_batch may come from the space; global_batch is checked here because the
  // composed experiment carries a placeholder.
  if (training && training.IsMap()) {
    if (training["micro_batch"]) {
      if (auto v = integer(training["micro_batch"], "training.micro_batch", p)) {
        if (*v < 1) p.add("training.micro_batch=" + std::to_string(*v) + " must be a positive integer");
        else spec.training_micro_batch = v;
      }
    }
    if (!training["global_batch"]) p.add("training.global_batch is required");
    else if (auto v = integer(training["global_batch"], "training.global_batch", p); v && *v < 1)
      p.add("training.global_batch=" + std::to_string(*v) + " must be a positive integer");
  } else if (training) {
    p.add("training must be a map");
  }

  // Layout space or fixed layout.
  if (root["space"]) {
    spec.space = parse_space(root["space"], "space", p);
    spec.has_space = true;
  }
  if (kind == SpecKind::sweep && !root["space"]) p.add("space is required (the layouts to sweep)");
  if (kind == SpecKind::compare) {
    if (root["space"] && root["layout"]) p.add("give layout (fixed) or space (best per cluster), not both");
    if (!root["space"] && !root["layout"]) p.add("layout (a fixed layout) or space (best layout per cluster) is required");
  }
  if (spec.has_space && resolve_micro_batch(spec.space, spec.training_micro_batch).empty())
    p.add("space.micro_batch or training.micro_batch is required");
  if (spec.has_space && root["space"]["micro_batch"] && spec.training_micro_batch)
    p.add("training.micro_batch and space.micro_batch are both given (keep one)");

  if (root["rank_by"]) {
    const std::string r = value_text(root["rank_by"]);
    if (r == "step_time") spec.rank_by = RankBy::step_time;
    else if (r == "tokens_per_s_per_gpu") spec.rank_by = RankBy::tokens_per_s_per_gpu;
    else if (r == "cost") spec.rank_by = RankBy::cost;
    else p.add("rank_by=\"" + r + "\" is not one of step_time, tokens_per_s_per_gpu, cost");
  }
  if (root["refine_top"]) {
    if (auto v = integer(root["refine_top"], "refine_top", p)) {
      if (*v < 0) p.add("refine_top=" + std::to_string(*v) + " must be >= 0");
      else spec.refine_top = *v;
    }
  }

  // vary: every combination of the listed values.
  std::vector<std::pair<std::string, std::vector<YAML::Node>>> vary;
  if (root["vary"]) {
    const YAML::Node v = root["vary"];
    if (!v.IsMap()) {
      p.add("vary must be a map of cluster keys to lists of values");
    } else {
      for (const auto& kv : v) {
        const std::string k = kv.first.Scalar();
        std::vector<YAML::Node> vals;
        if (kv.second.IsSequence()) {
          if (kv.second.size() == 0) p.add("vary." + k + " is an empty list");
          // A repeated value counts once (as in space: lists), else each cluster ran twice.
          std::set<std::string> seen;
          for (const auto& x : kv.second)
            if (!x.IsScalar() || seen.insert(value_text(x)).second) vals.push_back(x);
        } else {
          vals.push_back(kv.second);
        }
        if (k == "price_per_gpu_hour" || k == "name") p.add("vary." + k + " cannot be varied (give separate clusters)");
        vary.emplace_back(k, vals);
      }
    }
  }

  // clusters
  const YAML::Node clusters = root["clusters"];
  // Each cluster case (clusters x every combination of vary values) composes and validates
  // a whole experiment: count them, checked, before making any.
  if (clusters && clusters.IsSequence()) {
    std::optional<int64_t> cases = static_cast<int64_t>(clusters.size());
    std::string factors = std::to_string(clusters.size()) + " clusters";
    for (const auto& [key, vals] : vary) {
      cases = cases ? checked::mul(*cases, std::max<int64_t>(1, static_cast<int64_t>(vals.size()))) : cases;
      factors += " x " + std::to_string(vals.size()) + " vary." + key;
    }
    if (!cases || *cases > limits::kMaxSweepClusters) {
      p.add("clusters with vary give " + factors + " = " +
            (cases ? checked::with_commas(*cases) : std::string("more than 2^63")) + " cluster cases: more than the " +
            checked::with_commas(limits::kMaxSweepClusters) +
            "-case limit (each case composes and validates a whole experiment)");
      p.throw_if_any();
    }
  }
  if (clusters && (!clusters.IsSequence() || clusters.size() == 0))
    p.add("clusters must be a list of one or more cluster sections");
  if (clusters && clusters.IsSequence()) {
    for (size_t i = 0; i < clusters.size(); ++i) {
      const std::string where = "clusters[" + std::to_string(i) + "]";
      YAML::Node c = YAML::Clone(clusters[i]);
      if (!c.IsMap()) {
        p.add(where + " must be a map (an experiment cluster section)");
        continue;
      }
      double price = 0;
      if (c["price_per_gpu_hour"]) {
        if (auto v = number(c["price_per_gpu_hour"], where + ".price_per_gpu_hour", p)) {
          if (*v < 0 || *v > limits::kMaxPricePerGpuHour)
            p.add(where + ".price_per_gpu_hour=" + value_text(c["price_per_gpu_hour"]) +
                  " must be in [0, 10000] USD (models/checked.hpp)");
          else price = *v;
        }
        c.remove("price_per_gpu_hour");
      }
      // Cartesian product of vary values, first key slowest.
      std::vector<size_t> idx(vary.size(), 0);
      for (;;) {
        YAML::Node ci = YAML::Clone(c);
        std::string label_suffix, vwhere;
        for (size_t k = 0; k < vary.size(); ++k) {
          const auto& [key, vals] = vary[k];
          if (vals.empty()) continue;
          ci = with_value(ci, key, vals[idx[k]]);
          label_suffix += ", " + key + "=" + value_text(vals[idx[k]]);
          vwhere += (vwhere.empty() ? "" : ", ") + ("vary." + key + "=" + value_text(vals[idx[k]]));
        }
        const std::string w = vwhere.empty() ? where : where + " (with " + vwhere + ")";
        const YAML::Node fixed = kind == SpecKind::compare ? root["layout"] : YAML::Node(YAML::NodeType::Undefined);
        if (auto e = compose(model, training, ci, spec.title.empty() ? "sweep" : spec.title, w, base_dir, p, fixed)) {
          ClusterCase cc;
          cc.base = *e;
          if (!fixed) {
            cc.base.training.global_batch = 0;
            if (training && training["global_batch"] && training["global_batch"].IsScalar())
              if (auto gb = to_int(training["global_batch"].Scalar())) cc.base.training.global_batch = *gb;
            cc.base.training.micro_batch = spec.training_micro_batch.value_or(0);
          }
          std::string name = c["name"] ? value_text(c["name"]) : cc.base.cluster.name;
          cc.label = name + label_suffix;
          cc.price_per_gpu_hour = price;
          if (spec.title.empty()) cc.base.title = cc.base.model.name;
          spec.clusters.push_back(std::move(cc));
        }
        size_t k = vary.size();
        while (k > 0) {
          --k;
          if (++idx[k] < vary[k].second.size()) break;
          idx[k] = 0;
          if (k == 0) {
            k = vary.size() + 1;
            break;
          }
        }
        if (vary.empty() || k == vary.size() + 1) break;
      }
    }
  }
  if (spec.rank_by == RankBy::cost)
    for (size_t i = 0; clusters && clusters.IsSequence() && i < clusters.size(); ++i)
      if (!clusters[i].IsMap() || !clusters[i]["price_per_gpu_hour"])
        p.add("clusters[" + std::to_string(i) + "].price_per_gpu_hour is required with rank_by=cost");

  // Each case is a row of the outputs, named by its label: two alike, or a blank one, could
  // not be told apart in the tables and charts.
  {
    std::map<std::string, size_t> seen;
    for (size_t i = 0; i < spec.clusters.size(); ++i) {
      const std::string& label = spec.clusters[i].label;
      if (label.find_first_not_of(' ') == std::string::npos)
        p.add("cluster case " + std::to_string(i) + " has an empty name: give clusters[].name");
      else if (auto [it, fresh] = seen.emplace(label, i); !fresh)
        p.add("cluster cases " + std::to_string(it->second) + " and " + std::to_string(i) + " are both named \"" +
              label + "\": give each cluster a distinct name");
    }
  }
  spec.fixed_layout = kind == SpecKind::compare && root["layout"];
  if (kind == SpecKind::compare && spec.clusters.size() < 2 && p.empty())
    p.add("clusters (after vary) must give at least 2 clusters to compare (got " +
          std::to_string(spec.clusters.size()) + ")");
  if (spec.title.empty() && !spec.clusters.empty()) spec.title = spec.clusters.front().base.model.name;
  p.throw_if_any();
  return spec;
}

SweepSpec load_sweep_spec(const std::string& path, SpecKind kind) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw InputError(path + ": cannot read " + (kind == SpecKind::sweep ? "sweep" : "compare") + " file: " +
                     (std::filesystem::exists(path, ec) ? "not a regular file" : "no such file"));
  std::ifstream in(path, std::ios::binary);
  note_input_file(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  return parse_sweep_spec(ss.str(), path, kind, dir.string());
}

}  // namespace dtsim
