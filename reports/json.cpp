#include "reports/json.hpp"

#include <cmath>

namespace dtsim {

namespace {

// The five kinds always appear, in this order of meaning, even when a kind is unused
// (size 1, or EP in a dense model): consumers can index comm.TP or comm.EP without checking.
constexpr const char* kCommKinds[] = {"TP", "CP", "PP", "DP", "EP"};

nlohmann::json comm_json(const CommStats& c) {
  // A whole count prints as an integer; the step-level mean over stages may be fractional
  // (models/result.hpp CommStats::operations).
  nlohmann::json ops = c.operations;
  if (c.operations == std::floor(c.operations) && std::fabs(c.operations) < 9e15)
    ops = static_cast<int64_t>(c.operations);
  return {{"total_s", c.total_s},
          {"exposed_s", c.exposed_s},
          {"bytes", c.bytes},
          {"operations", ops}};
}

nlohmann::json comm_map_json(const std::map<std::string, CommStats>& m) {
  nlohmann::json j = nlohmann::json::object();
  for (const char* k : kCommKinds) {
    auto it = m.find(k);
    j[k] = comm_json(it == m.end() ? CommStats{} : it->second);
  }
  for (const auto& [k, v] : m) j[k] = comm_json(v);  // any further kinds the engine reports
  return j;
}

nlohmann::json memory_json(const MemoryBreakdown& m) {
  return {{"params_bytes", m.params_bytes},
          {"grads_bytes", m.grads_bytes},
          {"optimizer_bytes", m.optimizer_bytes},
          {"activations_bytes", m.activations_bytes},
          {"other_bytes", m.other_bytes},
          {"peak_bytes", m.peak_bytes},
          {"capacity_bytes", m.capacity_bytes},
          {"fits", m.fits}};
}

nlohmann::json stage_json(const StageResult& s) {
  return {{"stage", s.stage},
          {"layers", s.layers},
          {"compute_s", s.compute_s},
          {"bubble_s", s.bubble_s},
          {"finish_s", s.finish_s},
          {"slowdown_s", s.slowdown_s},
          {"host_bound_s", s.host_bound_s},
          {"comm", comm_map_json(s.comm)},
          {"memory", memory_json(s.memory)}};
}

}  // namespace

nlohmann::json to_json(const StepResult& r) {
  nlohmann::json j = nlohmann::json::object();
  j["experiment"] = r.experiment;
  j["engine"] = r.engine;
  j["folded"] = r.folded;
  j["gpus"] = r.gpus;
  j["simulated_ranks"] = r.simulated_ranks;
  j["step_time_s"] = r.step_time_s;
  j["step_time_band_s"] = nlohmann::json::array({r.step_time_lo_s, r.step_time_hi_s});
  j["tokens_per_step"] = r.tokens_per_step;
  j["tokens_per_s"] = r.tokens_per_s;
  j["model_flops"] = r.model_flops;
  j["hardware_flops"] = r.hardware_flops;
  j["tflops_per_gpu"] = r.tflops_per_gpu;
  j["hardware_tflops_per_gpu"] = r.hardware_tflops_per_gpu;
  j["mfu"] = r.mfu;
  j["hfu"] = r.hfu;
  j["compute_s"] = r.compute_s;
  j["bubble_s"] = r.bubble_s;
  j["host_bound_s"] = r.host_bound_s;
  j["optimizer_s"] = r.optimizer_s;
  j["comm"] = comm_map_json(r.comm);
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& s : r.stages) stages.push_back(stage_json(s));
  j["stages"] = std::move(stages);
  nlohmann::json cfg = nlohmann::json::object();
  for (const auto& [k, v] : r.engine_config) cfg[k] = v;
  j["engine_config"] = std::move(cfg);
  nlohmann::json src = nlohmann::json::object();
  for (const auto& [k, v] : r.time_sources) src[k] = v;
  j["time_sources"] = std::move(src);
  // wall_clock_s deliberately omitted: it differs from run to run.
  return j;
}

std::string result_json_text(const StepResult& r) {
  // nlohmann::json keeps object keys sorted and prints doubles as the shortest text that
  // reads back to the same value, so equal results print equal bytes. NaN/inf print null.
  // Invalid UTF-8 in free-text fields (the title) is replaced rather than thrown on.
  return to_json(r).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace dtsim
