#pragma once
// Input of `dtsim plan`: capacity planning for a training run.
//
// File format (YAML; unknown keys are errors; messages name the file and key):
//   title: string (optional)
//   model:    as in an experiment file
//   training: as in an experiment file (micro_batch may come from the space)
//   tokens:   total training tokens (a positive number, e.g. 15e12)
//   deadline: "90 days" (units: days, d, weeks, hours, h)  |  gpu_budget: 8192 (GPUs)
//             exactly one of the two. With a deadline the plan is the cheapest option that
//             finishes in time (ties: fewer GPUs); with a GPU budget, the fastest option within
//             it (ties: cheaper).
//   candidates: list of GPU types; each is an experiment `cluster:` section whose `nodes` is
//             a list of node counts to consider (or one count), plus price_per_gpu_hour (USD,
//             required) and optional name.
//   space:    the layout space (models/sweep_spec.hpp); default: tp auto, pp auto, vp 1,
//             zero_stage 1, micro_batch 1, recompute [selective, full], sequence_parallel true
//   sensitivity: optional {nic_bandwidth: [factors], nodes: [factors]} applied to the chosen
//             option (default nic_bandwidth [0.5, 2], nodes [0.5, 2])
//   refine_top: SimGrid re-simulations of the best layout per candidate size (default 1)
#include <cstdint>
#include <string>
#include <vector>

#include "models/sweep_spec.hpp"

namespace dtsim {

struct PlanCandidate {
  std::string name;
  double price_per_gpu_hour = 0;   // USD
  std::vector<ClusterCase> sizes;  // one per node count, ascending
};

struct PlanSpec {
  std::string source, title, fingerprint;
  double tokens = 0;               // total training tokens
  double deadline_s = 0;           // 0 when a GPU budget is given
  int64_t gpu_budget = 0;          // 0 when a deadline is given
  std::vector<PlanCandidate> candidates;
  SweepSpec sweep;                 // space, training_micro_batch, rank_by = step_time, clusters = all sizes
  std::vector<double> nic_factors = {0.5, 2.0};
  std::vector<double> node_factors = {0.5, 2.0};
  int64_t refine_top = 1;
};

/// Throws InputError listing every problem (file, key, constraint).
PlanSpec load_plan_spec(const std::string& path);
PlanSpec parse_plan_spec(const std::string& yaml_text, const std::string& source, const std::string& base_dir = ".");

/// "90 days" -> seconds. Units: days/day/d, weeks/week/w, hours/hour/h. Throws InputError.
double parse_duration_days(const std::string& text, const std::string& where);

}  // namespace dtsim
