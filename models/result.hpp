#pragma once
// StepResult: what one simulated training step produced. Plain data; every report
// (terminal summary, JSON, later CSV/HTML/trace) is a function of it.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dtsim {

/// Time one kind of communication (TP, CP, PP, DP) took, per rank, averaged over ranks.
struct CommStats {
  double total_s = 0;    // wall time the kind's operations were in flight on a rank
  double exposed_s = 0;  // part of it during which the rank's compute stream waited
  double bytes = 0;      // bytes the rank sent for this kind in one step
  int64_t operations = 0;  // collectives / transfers of this kind per rank per step
};

/// Per-rank memory in bytes, broken down as Korthikanti 2022 / ZeRO do.
struct MemoryBreakdown {
  double params_bytes = 0;
  double grads_bytes = 0;
  double optimizer_bytes = 0;
  double activations_bytes = 0;  // peak in-flight activations (incl. logits on last stage)
  double other_bytes = 0;        // communication buffers, ZeRO-3 gathered layers
  double peak_bytes = 0;         // sum of the above
  double capacity_bytes = 0;     // HBM minus reserve
  bool fits = true;
};

/// One pipeline stage (all its ranks behave alike).
struct StageResult {
  int stage = 0;
  int64_t layers = 0;
  double compute_s = 0;      // busy time of the compute stream
  double bubble_s = 0;       // idle waiting on the pipeline schedule (not on transfers)
  double finish_s = 0;       // time its last operation (optimizer) completed
  /// Extra kernel time because communication overlapped compute and took SMs from it
  /// (Training::comm_interference): actual minus nominal kernel time.
  double slowdown_s = 0;
  std::map<std::string, CommStats> comm;  // keyed "TP", "CP", "PP", "DP"
  MemoryBreakdown memory;
};

struct StepResult {
  std::string experiment;     // title
  std::string engine;         // "simgrid"
  bool folded = true;         // symmetric ranks simulated once
  int64_t gpus = 0;
  int64_t simulated_ranks = 0;
  double step_time_s = 0;
  double tokens_per_step = 0;
  double tokens_per_s = 0;
  double model_flops = 0;     // per step, whole cluster (no recompute)
  double hardware_flops = 0;  // per step, whole cluster (incl. recompute)
  double tflops_per_gpu = 0;  // model FLOPs / step time / GPUs / 1e12
  double hardware_tflops_per_gpu = 0;  // hardware FLOPs (incl. recompute) / step time / GPUs / 1e12
  double mfu = 0;             // model FLOPs / (step time * GPUs * peak)
  double hfu = 0;             // hardware FLOPs / (step time * GPUs * peak)
  double compute_s = 0;       // mean over stages of compute busy time
  double bubble_s = 0;        // mean over stages
  double optimizer_s = 0;     // optimizer step time (HBM-bound)
  std::map<std::string, CommStats> comm;  // mean over stages, keyed "TP","CP","PP","DP"
  std::vector<StageResult> stages;
  std::map<std::string, std::string> engine_config;  // SimGrid flags actually set
  double wall_clock_s = 0;    // host seconds the simulation took (not in JSON golden compare)
};

}  // namespace dtsim
