#pragma once
// StepResult as JSON (`dtsim run --json FILE`).
//
// Layout (all times in seconds, sizes in bytes, FLOPs per step for the whole cluster):
//   { experiment, engine, folded, gpus, simulated_ranks, step_time_s, step_time_band_s: [lo, hi]
//     (models/time_band.hpp), tokens_per_step,
//     tokens_per_s, model_flops, hardware_flops, tflops_per_gpu, mfu, hfu, compute_s,
//     bubble_s, host_bound_s, optimizer_s, time_sources: { source: compute ops },
//     comm: { TP|CP|PP|DP|EP: { total_s, exposed_s, bytes, operations } },
//     stages: [ { stage, layers, compute_s, bubble_s, host_bound_s, finish_s, slowdown_s, comm: {...},
//                 memory: { params_bytes, grads_bytes, optimizer_bytes, activations_bytes,
//                           other_bytes, peak_bytes, capacity_bytes, fits } } ],
//     engine_config: { flag: value } }
// Keys are sorted; wall_clock_s is left out so identical results give identical bytes.
#include <string>

#include <nlohmann/json.hpp>

#include "models/result.hpp"

namespace dtsim {

nlohmann::json to_json(const StepResult& r);

/// to_json(r) pretty-printed with a 2-space indent and a trailing newline.
std::string result_json_text(const StepResult& r);

}  // namespace dtsim
