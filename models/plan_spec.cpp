// Plan files (see models/plan_spec.hpp for the format).
#include "models/plan_spec.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "models/checked.hpp"
#include "models/errors.hpp"
#include "models/input_files.hpp"

namespace dtsim {

using namespace spec_io;

double parse_duration_days(const std::string& text, const std::string& where) {
  const char* b = text.c_str();
  char* end = nullptr;
  const double v = std::strtod(b, &end);
  std::string unit(end);
  unit.erase(0, unit.find_first_not_of(' '));
  unit.erase(unit.find_last_not_of(' ') + 1);
  double scale = 0;
  if (unit == "days" || unit == "day" || unit == "d") scale = 86400;
  else if (unit == "weeks" || unit == "week" || unit == "w") scale = 7 * 86400;
  else if (unit == "hours" || unit == "hour" || unit == "h") scale = 3600;
  // A decimal number (strtod also reads hex, "0x3c", and "inf"), then the unit.
  const std::string number(b, static_cast<size_t>(end - b));
  const bool decimal = end != b && number.find_first_not_of("0123456789.eE+- ") == std::string::npos;
  if (!decimal || scale == 0 || !std::isfinite(v) || v <= 0)
    throw InputError(where + "=\"" + text + "\" is not a positive duration (expected e.g. \"90 days\", \"12 weeks\", \"500 h\")");
  if (v * scale > 100 * 365.25 * 86400)
    throw InputError(where + "=\"" + text + "\" is more than a century: give a training deadline");
  return v * scale;
}

PlanSpec parse_plan_spec(const std::string& yaml_text, const std::string& source, const std::string& base_dir) {
  Problems p(source);
  PlanSpec ps;
  ps.source = source;
  ps.fingerprint = fingerprint_of(yaml_text);
  const YAML::Node root = load_yaml(yaml_text, p);
  p.throw_if_any();
  if (!root.IsDefined() || root.IsNull()) {
    p.add("the file is empty (expected model, training, tokens, deadline or gpu_budget, candidates)");
    p.throw_if_any();
  }
  if (!check_keys(root, "",
                  {"title", "model", "training", "tokens", "deadline", "gpu_budget", "candidates", "space",
                   "sensitivity", "refine_top"},
                  p))
    p.throw_if_any();
  for (const char* k : {"model", "training", "tokens", "candidates"})
    if (!root[k]) p.add(std::string(k) + " is required");
  if (root["title"]) {
    if (root["title"].IsScalar()) ps.title = root["title"].as<std::string>("");
    else
      p.add("title must be a single line of text (got a " + std::string(root["title"].IsMap() ? "map" : "list") + ")");
  }
  if (root["tokens"]) {
    if (auto v = number(root["tokens"], "tokens", p)) {
      if (!(*v >= 1 && *v <= limits::kMaxTrainingTokens))
        p.add("tokens=" + root["tokens"].Scalar() + " must be in [1, 1e16] (total training tokens; 1e16 is about 300 "
              "times the largest published pre-training run, models/checked.hpp)");
      else ps.tokens = *v;
    }
  }
  if (root["deadline"] && root["gpu_budget"]) p.add("give deadline or gpu_budget, not both");
  if (!root["deadline"] && !root["gpu_budget"]) p.add("deadline (e.g. \"90 days\") or gpu_budget (GPUs) is required");
  if (root["deadline"]) {
    try {
      ps.deadline_s = parse_duration_days(root["deadline"].IsScalar() ? root["deadline"].Scalar() : "", "deadline");
    } catch (const InputError& e) {
      p.add(e.problems().front());
    }
  }
  if (root["gpu_budget"]) {
    if (auto v = integer(root["gpu_budget"], "gpu_budget", p)) {
      if (*v < 1) p.add("gpu_budget=" + std::to_string(*v) + " must be >= 1");
      else ps.gpu_budget = *v;
    }
  }
  if (root["refine_top"]) {
    if (auto v = integer(root["refine_top"], "refine_top", p)) {
      if (*v < 0) p.add("refine_top must be >= 0");
      else ps.refine_top = *v;
    }
  }
  if (root["sensitivity"]) {
    const YAML::Node s = root["sensitivity"];
    if (check_keys(s, "sensitivity", {"nic_bandwidth", "nodes"}, p)) {
      auto factors = [&](const char* key, std::vector<double>& out) {
        if (!s[key]) return;
        out.clear();
        const YAML::Node n = s[key];
        const std::string path = std::string("sensitivity.") + key;
        if (!n.IsSequence()) {
          p.add(path + " must be a list of factors, e.g. [0.5, 2]");
          return;
        }
        for (size_t i = 0; i < n.size(); ++i)
          if (auto v = number(n[i], path + "[" + std::to_string(i) + "]", p)) {
            // A what-if within three orders of magnitude either way: beyond that the changed
            // link or cluster leaves the stated physical and GPU limits (models/checked.hpp).
            if (!(*v >= 1e-3 && *v <= 1e3))
              p.add(path + "[" + std::to_string(i) + "] must be in [0.001, 1000]");
            else out.push_back(*v);
          }
      };
      factors("nic_bandwidth", ps.nic_factors);
      factors("nodes", ps.node_factors);
    }
  }

  // The layout space: given, or the default documented in the header.
  SweepSpec& sw = ps.sweep;
  sw.source = source;
  sw.fingerprint = ps.fingerprint;
  sw.rank_by = RankBy::step_time;
  sw.refine_top = ps.refine_top;
  sw.has_space = true;
  const YAML::Node training = root["training"];
  if (training && training.IsMap() && training["micro_batch"])
    if (auto v = integer(training["micro_batch"], "training.micro_batch", p)) sw.training_micro_batch = v;
  if (training && training.IsMap() && !training["global_batch"]) p.add("training.global_batch is required");
  int64_t global_batch = 0;
  if (training && training.IsMap() && training["global_batch"])
    if (auto v = integer(training["global_batch"], "training.global_batch", p)) {
      if (*v < 1) p.add("training.global_batch must be a positive integer");
      else global_batch = *v;
    }
  if (root["space"]) {
    sw.space = parse_space(root["space"], "space", p);
  } else {
    sw.space.tp.is_auto = true;
    sw.space.pp.is_auto = true;
    sw.space.cp.values = {1};
    sw.space.vp.values = {1};
    sw.space.dp.is_auto = true;
    sw.space.zero_stages = {1};
    if (!sw.training_micro_batch) sw.space.micro_batch.values = {1};
    sw.space.recompute = {Recompute::selective, Recompute::full};
    sw.space.sequence_parallel = {true};
  }
  if (resolve_micro_batch(sw.space, sw.training_micro_batch).empty())
    p.add("space.micro_batch or training.micro_batch is required");

  const YAML::Node cands = root["candidates"];
  if (cands && (!cands.IsSequence() || cands.size() == 0)) p.add("candidates must be a list of one or more GPU types");
  if (cands && cands.IsSequence()) {
    for (size_t i = 0; i < cands.size(); ++i) {
      const std::string where = "candidates[" + std::to_string(i) + "]";
      YAML::Node c = YAML::Clone(cands[i]);
      if (!c.IsMap()) {
        p.add(where + " must be a map (an experiment cluster section with nodes as a list)");
        continue;
      }
      PlanCandidate pc;
      if (!c["price_per_gpu_hour"]) p.add(where + ".price_per_gpu_hour is required (USD per GPU-hour)");
      else if (auto v = number(c["price_per_gpu_hour"], where + ".price_per_gpu_hour", p)) {
        if (!(*v > 0 && *v <= limits::kMaxPricePerGpuHour))
          p.add(where + ".price_per_gpu_hour must be in (0, 10000] USD (models/checked.hpp)");
        else pc.price_per_gpu_hour = *v;
      }
      c.remove("price_per_gpu_hour");
      std::vector<YAML::Node> nodes;
      if (!c["nodes"]) p.add(where + ".nodes is required (a node count or a list of them)");
      else if (c["nodes"].IsSequence()) {
        if (c["nodes"].size() == 0) p.add(where + ".nodes is an empty list");
        for (const auto& n : c["nodes"]) nodes.push_back(n);
      } else {
        nodes.push_back(c["nodes"]);
      }
      for (size_t k = 0; k < nodes.size(); ++k) {
        YAML::Node ci = with_value(c, "nodes", nodes[k]);
        const std::string w = nodes.size() > 1 ? where + " (nodes[" + std::to_string(k) + "])" : where;
        if (auto e = compose(root["model"], training, ci, ps.title.empty() ? "plan" : ps.title, w, base_dir, p)) {
          ClusterCase cc;
          cc.base = *e;
          cc.base.training.global_batch = global_batch;
          cc.base.training.micro_batch = sw.training_micro_batch.value_or(0);
          pc.name = c["name"] ? c["name"].as<std::string>("") : cc.base.cluster.gpu.name;
          cc.label = pc.name + " x " + std::to_string(cc.base.cluster.gpus());
          cc.price_per_gpu_hour = pc.price_per_gpu_hour;
          pc.sizes.push_back(std::move(cc));
        }
      }
      std::sort(pc.sizes.begin(), pc.sizes.end(), [](const ClusterCase& a, const ClusterCase& b) {
        return a.base.cluster.gpus() < b.base.cluster.gpus();
      });
      // A repeated size counts once (as repeated values in a sweep dimension).
      pc.sizes.erase(std::unique(pc.sizes.begin(), pc.sizes.end(),
                                 [](const ClusterCase& a, const ClusterCase& b) {
                                   return a.base.cluster.gpus() == b.base.cluster.gpus();
                                 }),
                     pc.sizes.end());
      for (const auto& cc : pc.sizes) sw.clusters.push_back(cc);
      ps.candidates.push_back(std::move(pc));
    }
  }
  if (ps.title.empty() && !sw.clusters.empty()) ps.title = "Capacity plan: " + sw.clusters.front().base.model.name;
  sw.title = ps.title;
  p.throw_if_any();
  return ps;
}

PlanSpec load_plan_spec(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw InputError(path + ": cannot read plan file: " +
                     (std::filesystem::exists(path, ec) ? "not a regular file" : "no such file"));
  std::ifstream in(path, std::ios::binary);
  note_input_file(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  return parse_plan_spec(ss.str(), path, dir.string());
}

}  // namespace dtsim
