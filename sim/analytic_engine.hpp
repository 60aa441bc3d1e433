#pragma once
// The analytic engine: a closed-form estimate of one training step, microseconds per layout,
// for sweeps. No SimGrid. It reads the same plan as the SimGrid engine, once per shape:
//
// 1. Per-layer costs. For each (tp, cp, sequence parallel, micro-batch, recompute) the plan
//    of a one-layer proxy (same model widths, same GPU, pp = dp = 1, one micro-batch) is built
//    with build_step_plan (models/plan.hpp) and its ops are split into segments: embedding
//    forward/backward, one layer's forward, one layer's (recompute +) backward, head
//    forward/backward, optimizer. Each segment is replayed on one rank with the engine's
//    stream semantics (a compute stream, one in-order stream per communication kind, blocking
//    collectives, issue/wait pairs, compute slowed to comm_overlap_speed() while a
//    collective overlaps it; models/compute_cost.hpp). Collective times are the ring
//    alpha-beta cost (models/plan.hpp ring_cost; Patarasuk & Yuan 2009):
//        t = edge_bytes / B + steps * alpha
//    with B = line rate x NCCL efficiency of the slowest link class the ring crosses
//    (sim/platform.hpp), divided by the GPUs sharing a NIC when it crosses nodes (the fold
//    rule of sim/collective_exec.hpp), and alpha = the NVLink step latency inside a node,
//    max(NVLink, NIC) across nodes (Platform::alpha). Costs are cached per shape.
// 2. Pipeline. Per pipeline rank s, forward F_s and backward B_s of one micro-batch are the
//    layer costs times its layers plus embedding (first), head (last) and the TP AllGather
//    after each receive without SP. With W_s = F_s + B_s, m micro-batches, p stages and v
//    virtual stages:
//        1F1B, GPipe:   T = sum_s W_s + (m - 1) max_s W_s + 2 (p - 1) t_p2p
//        interleaved:   T = m max_s W_s + (p - 1)/v mean_s W_s + 2 (p - 1) t_p2p
//    i.e. the bubble (p - 1)/m (1F1B) and (p - 1)/(v m) (interleaved) of Narayanan 2021
//    Sec 2.2, generalised to unequal stages. Stage s ends its last backward
//    sum_{j<s} (B_j + t_p2p) before stage 0 (the backward chain runs from the last stage).
// 3. Data parallel. ZeRO-0/1/2 with overlap_grad_reduce: the plan's DDP buckets (same bucket
//    size rule) are issued as the last micro-batch's backward produces gradients, on one
//    serial stream; exposed = what runs past the end of the backward; the overlapped part
//    slows compute as above. Without overlap: the whole reduction is exposed. ZeRO-1/2 add the
//    parameter AllGather after the optimizer (or per layer before the first forward with
//    overlap_param_gather); ZeRO-3 gathers every layer in forward and backward and
//    reduce-scatters its gradients per micro-batch, hidden behind the layer's compute when
//    shorter. Optimizer: the plan's fused Adam op, HBM-bound, on the parameters a rank owns.
// Host dispatch (models/host_dispatch.hpp): each segment replay runs the host clock too and
// is replayed twice, timed on the second copy (the periodic steady state); its host-bound
// time is part of its wall time and reported as host_bound_s.
// 4. Memory: models/memory.hpp stage_memory of the first and last pipeline stages (every
//    other stage holds no more: fewer in-flight micro-batches, no embedding or head).
//
// Step time = max_s (end of backward_s + exposed DP_s + optimizer_s + ZeRO-1/2 gather_s), the
// first and last stage adding the tied-embedding gradient AllReduce (PP) once both reach it.
// Per stage, bubble = step time - compute - slowdown - exposed communication, the DES's
// accounting (models/result.hpp CommStats).
// Agreement with the SimGrid engine: within 10% on experiments/*.yaml, experiments/validation
// and the top layouts of experiments/sweeps (tests/unit/test_analytic_vs_des.cpp). What it
// leaves out: link contention between concurrent collectives of different kinds, and the
// exact interleaved warm-up order.
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "models/experiment.hpp"
#include "models/plan.hpp"
#include "models/result.hpp"

namespace dtsim {

/// One layout's estimate. Seconds, bytes, FLOPs; communication indexed by CommKind.
struct AnalyticEstimate {
  double step_time_s = 0;
  double pipeline_s = 0;      // end of the last backward on the first stage
  double compute_s = 0;       // mean over stages of compute busy time
  double bubble_s = 0;        // mean over stages of pipeline idle time
  double host_bound_s = 0;    // mean over stages of GPU idle waiting for the host (models/host_dispatch.hpp)
  double optimizer_s = 0;     // slowest stage's optimizer step
  std::array<double, kCommKinds> comm_total_s{};    // mean over stages, per rank
  std::array<double, kCommKinds> comm_exposed_s{};  // mean over stages, per rank
  double tokens_per_s = 0;
  double model_flops = 0;     // per step, whole cluster (no recompute)
  double hardware_flops = 0;  // per step, whole cluster (with recompute)
  double mfu = 0, hfu = 0;
  double tflops_per_gpu = 0;  // model FLOPs / step / GPU / 1e12
  double peak_memory_bytes = 0;   // largest stage peak (first or last stage)
  double capacity_bytes = 0;      // HBM minus reserve
  int64_t peak_stage = 0;
  bool fits = true;
};

/// Evaluates layouts of one (model, cluster, training). Not thread-safe (it caches); use one
/// per thread. Inputs are validated by the caller (validate_experiment): estimate() assumes a
/// valid layout and throws InputError only where the models do (e.g. pp not dividing layers).
class AnalyticEngine {
 public:
  /// `base` fixes model, cluster and training; its layout and micro_batch are ignored.
  explicit AnalyticEngine(const Experiment& base);
  ~AnalyticEngine();
  AnalyticEngine(const AnalyticEngine&) = delete;
  AnalyticEngine& operator=(const AnalyticEngine&) = delete;

  /// Estimate for `layout` with `micro_batch` sequences per micro-batch.
  AnalyticEstimate estimate(const Layout& layout, int64_t micro_batch);

  /// The estimate as a StepResult (engine "analytic"): per-stage compute, bubble,
  /// communication and the memory of every stage (stage_memory), for reports.
  StepResult step_result(const Layout& layout, int64_t micro_batch);

  /// Per pipeline rank, one micro-batch through all its layers (seconds), and the time of one
  /// pipeline message (for schedule timelines in reports).
  /// backward_s includes weight_s, its weight-gradient part (the W a zero-bubble schedule defers).
  struct StagePass {
    double forward_s = 0, backward_s = 0, weight_s = 0;
  };
  std::vector<StagePass> stage_passes(const Layout& layout, int64_t micro_batch, double* p2p_s = nullptr);

  /// The experiment with `layout` and `micro_batch` applied (for validation, DES, reports).
  Experiment experiment(const Layout& layout, int64_t micro_batch) const;

  const Experiment& base() const { return base_; }
  /// Shapes whose per-layer costs are cached (for tests and benchmarks).
  size_t cached_shapes() const;

  struct Shape;        // per-layer costs of one (tp, cp, sp, micro-batch, recompute)
  struct StageDetail;  // per-stage figures (step_result)
  class Comm;          // collective costs on the cluster (cached)

 private:
  const Shape& shape(const Layout& l, int64_t micro_batch);
  AnalyticEstimate estimate_impl(const Layout& l, int64_t micro_batch, std::vector<StageDetail>* detail);
  Experiment base_;
  Experiment scratch_;  // base_ with the layout being estimated (memory model input)
  std::unique_ptr<Comm> comm_;
  /// Keyed by (tp, cp, micro-batch, recompute, sequence parallel, ep, expert tp).
  std::map<std::tuple<int64_t, int64_t, int64_t, int, bool, int64_t, int64_t>, std::unique_ptr<Shape>> cache_;
};

/// AnalyticEngine(exp).step_result(exp.layout, exp.training.micro_batch) after
/// validate_experiment (throws InputError for an invalid experiment), with its kernel-time
/// band (step_time_lo_s / step_time_hi_s).
StepResult simulate_step_analytic(const Experiment& exp);

/// The kernel-time band of `exp` (models/time_band.hpp) as ratios to its nominal step: the
/// closed-form step with every compute op at the fast end of its data, and at the slow end,
/// each over the nominal closed-form step ({fast / nominal, slow / nominal}); an engine's
/// band is its own step time times these. Three AnalyticEngine estimates of exp.layout
/// (milliseconds); two when the caller already has the nominal closed-form step
/// (`nominal_s` > 0). Throws InputError as simulate_step_analytic.
std::pair<double, double> kernel_band_ratios(const Experiment& exp, double nominal_s = 0);

/// Fills r.step_time_lo_s / step_time_hi_s from kernel_band_ratios(exp, nominal_s) and
/// r.step_time_s (`nominal_s`: r's own step when r is the closed form's).
void add_kernel_band(const Experiment& exp, StepResult& r, double nominal_s = 0);

}  // namespace dtsim
