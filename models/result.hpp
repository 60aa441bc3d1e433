#pragma once
// StepResult: what one simulated training step produced. Plain data; every report
// (terminal summary, JSON, later CSV/HTML/trace) is a function of it.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dtsim {

/// Time one kind of communication (TP, CP, PP, DP) took, per rank, averaged over ranks.
///
/// Accounting (both engines; tests/unit/test_accounting_invariants.cpp checks it on every
/// shipped experiment):
///  - total_s: the sum, over the kind's operations the rank takes part in, of each one's
///    time in flight. A collective: from the moment the rank's stream starts it (waiting for
///    the other members included) to its end. A P2P transfer counts at both ends, sender
///    and receiver, as a collective counts on every member: from the sender posting it to
///    the bytes being usable at the receiver (flow end + P2P latency alpha).
///  - exposed_s: the time the rank's compute stream is blocked on the kind's operations
///    while they are in flight: a blocking collective, the wait on an issued one, a
///    blocking send's wait, a receive's wait after the sender posted. Waiting on a receive
///    before its sender posted is pipeline bubble (StageResult::bubble_s), not
///    communication. Every exposed interval lies inside one operation's window, so
///    exposed_s <= total_s.
///  - Per stage: compute_s + slowdown_s + sum of exposed_s over kinds + bubble_s +
///    host_bound_s = step time (the compute stream's whole step, the critical path table of
///    the summary).
/// The tied word embedding's gradient AllReduce between the first and the last pipeline
/// stage (Megatron-Core finalize_model_grads.py _allreduce_word_embedding_grads, over the
/// embedding group of the first and last pipeline rank) is PP: it exists because pipeline
/// parallelism splits the tied weight (models/plan.cpp finish_step).
struct CommStats {
  double total_s = 0;    // see above
  double exposed_s = 0;  // see above
  double bytes = 0;      // bytes the rank sent for this kind in one step
  /// Collectives and P2P transfers (sends and receives) of this kind per rank per step.
  /// Integral per stage; the step-level figure is the mean over stages like the others,
  /// so it can be fractional (the embedding AllReduce on 2 of 8 stages: 0.25).
  double operations = 0;
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
  /// GPU idle waiting for the host to launch the next kernels (models/host_dispatch.hpp).
  double host_bound_s = 0;
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
  /// Kernel-time band (models/time_band.hpp): the lowest and highest step with every compute
  /// op at the fast end, nominal, or at the slow end of its kernel data, seconds
  /// (sim/analytic_engine.hpp kernel_band_ratios times step_time_s; lo <= step_time_s <= hi);
  /// 0 when not computed.
  double step_time_lo_s = 0, step_time_hi_s = 0;
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
  double host_bound_s = 0;    // mean over stages of StageResult::host_bound_s
  double optimizer_s = 0;     // optimizer step time (HBM-bound)
  std::map<std::string, CommStats> comm;  // mean over stages, keyed "TP","CP","PP","DP"
  std::vector<StageResult> stages;
  std::map<std::string, std::string> engine_config;  // SimGrid flags actually set
  /// Where the compute times came from: compute ops of the step plan (every stage and
  /// micro-batch; one stage's ops stand for all its ranks) per calib::TimeSource name
  /// ("roofline", "table-interpolated", ...); sources with no op are left out
  /// (time_source_counts, models/plan.hpp).
  std::map<std::string, int64_t> time_sources;
  double wall_clock_s = 0;    // host seconds the simulation took (not in JSON golden compare)
};

}  // namespace dtsim
