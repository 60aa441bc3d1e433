#include "reports/json_read.hpp"

#include <nlohmann/json.hpp>
#include <stdexcept>

namespace dtsim {
namespace {

CommStats comm_from(const nlohmann::json& j) {
  CommStats c;
  c.total_s = j.at("total_s").get<double>();
  c.exposed_s = j.at("exposed_s").get<double>();
  c.bytes = j.at("bytes").get<double>();
  c.operations = j.at("operations").get<double>();
  return c;
}

std::map<std::string, CommStats> comm_map(const nlohmann::json& j) {
  std::map<std::string, CommStats> out;
  for (auto it = j.begin(); it != j.end(); ++it) out[it.key()] = comm_from(it.value());
  return out;
}

}  // namespace

StepResult result_from_json_text(const std::string& text) {
  try {
    const auto j = nlohmann::json::parse(text);
    StepResult r;
    r.experiment = j.at("experiment").get<std::string>();
    r.engine = j.at("engine").get<std::string>();
    r.folded = j.at("folded").get<bool>();
    r.gpus = j.at("gpus").get<int64_t>();
    r.simulated_ranks = j.at("simulated_ranks").get<int64_t>();
    r.step_time_s = j.at("step_time_s").get<double>();
    if (j.contains("step_time_band_s")) {  // absent in results written before it existed
      r.step_time_lo_s = j.at("step_time_band_s").at(0).get<double>();
      r.step_time_hi_s = j.at("step_time_band_s").at(1).get<double>();
    }
    r.tokens_per_step = j.at("tokens_per_step").get<double>();
    r.tokens_per_s = j.at("tokens_per_s").get<double>();
    r.model_flops = j.at("model_flops").get<double>();
    r.hardware_flops = j.at("hardware_flops").get<double>();
    r.tflops_per_gpu = j.at("tflops_per_gpu").get<double>();
    r.hardware_tflops_per_gpu = j.at("hardware_tflops_per_gpu").get<double>();
    r.mfu = j.at("mfu").get<double>();
    r.hfu = j.at("hfu").get<double>();
    r.compute_s = j.at("compute_s").get<double>();
    r.bubble_s = j.at("bubble_s").get<double>();
    r.optimizer_s = j.at("optimizer_s").get<double>();
    r.host_bound_s = j.value("host_bound_s", 0.0);  // absent in results written before it existed
    r.comm = comm_map(j.at("comm"));
    for (const auto& s : j.at("stages")) {
      StageResult sr;
      sr.stage = s.at("stage").get<int>();
      sr.layers = s.at("layers").get<int64_t>();
      sr.compute_s = s.at("compute_s").get<double>();
      sr.bubble_s = s.at("bubble_s").get<double>();
      sr.finish_s = s.at("finish_s").get<double>();
      sr.slowdown_s = s.at("slowdown_s").get<double>();
      sr.host_bound_s = s.value("host_bound_s", 0.0);
      sr.comm = comm_map(s.at("comm"));
      const auto& m = s.at("memory");
      sr.memory.params_bytes = m.at("params_bytes").get<double>();
      sr.memory.grads_bytes = m.at("grads_bytes").get<double>();
      sr.memory.optimizer_bytes = m.at("optimizer_bytes").get<double>();
      sr.memory.activations_bytes = m.at("activations_bytes").get<double>();
      sr.memory.other_bytes = m.at("other_bytes").get<double>();
      sr.memory.peak_bytes = m.at("peak_bytes").get<double>();
      sr.memory.capacity_bytes = m.at("capacity_bytes").get<double>();
      sr.memory.fits = m.at("fits").get<bool>();
      r.stages.push_back(std::move(sr));
    }
    for (auto it = j.at("engine_config").begin(); it != j.at("engine_config").end(); ++it)
      r.engine_config[it.key()] = it.value().get<std::string>();
    if (j.contains("time_sources"))  // absent in results written before it existed
      for (auto it = j.at("time_sources").begin(); it != j.at("time_sources").end(); ++it)
        r.time_sources[it.key()] = it.value().get<int64_t>();
    return r;
  } catch (const nlohmann::json::exception& ex) {
    throw std::runtime_error(std::string("malformed result JSON: ") + ex.what());
  }
}

}  // namespace dtsim
