#pragma once
// Pipeline schedules as a registry: one file per schedule (models/schedules/*.cpp), one
// line per schedule in registry.cpp. A schedule only says, for each pipeline rank, in which
// order it runs the forward (F) and backward passes of its model chunks' micro-batches, and
// where its chunks sit in the model; the plan builder (models/plan.cpp) turns that order into
// ops, the memory model reads its in-flight activations from it (order_stats), and the
// analytic engine times it (time_order). Nothing else knows a schedule's shape.
//
// Terms (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR 2024, Sec 2):
//  - F: forward of one model chunk for one micro-batch;
//  - B: its backward with respect to the inputs (activation gradients), which the previous
//    stage waits for;
//  - W: its backward with respect to the weights, which nothing downstream waits for and so
//    may run later (its weight gradients must exist before the DP sync and the optimizer);
//  - BW: B and W together, the fused backward of GPipe / 1F1B / interleaved.
// A model chunk is a contiguous run of layers (a virtual stage); with interleaving or a V
// placement a pipeline rank holds several (Narayanan 2021 Sec 2.2.2).
//
// Adding a schedule: a new file defining a PipelineSchedule subclass and a `make_...()`
// factory, and one line in registry.cpp; tests/unit/test_schedules.cpp walks the registry
// and runs every schedule through the same checks (each micro-batch's F, B and W exactly
// once per chunk, dependencies, no deadlock, bubble against the closed form on uniform costs).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/experiment.hpp"

namespace dtsim::sched {

enum class Pass : uint8_t { F, B, W, BW };
const char* to_string(Pass);

/// One entry of a rank's order: `pass` of model chunk `chunk` (0-based, on this rank) for
/// micro-batch `mb` (0-based over the step's micro-batches).
struct Step {
  Pass pass = Pass::F;
  int32_t chunk = 0;
  int32_t mb = 0;
  /// An F that runs merged with the step after it (always a BW of another micro-batch) as one
  /// combined forward-backward pass: Megatron-Core's combined 1F1B
  /// (training.overlap_moe_expert_parallel_comm; pipeline_parallel/combined_1f1b.py,
  /// models/common/model_chunk_schedule_plan.py TransformerModelChunkSchedulePlan.run) and
  /// DualPipe's overlapped forward-backward chunk (dualpipe.py _forward_backward_chunk with the
  /// module's overlapped_forward_backward). Both receive their inputs before the pair starts
  /// and send their outputs after it ends; in between, each layer of the forward runs beside a
  /// layer of the backward so that one's EP AllToAll travels while the other computes
  /// (models/combined_1f1b.hpp).
  bool paired = false;
  bool operator==(const Step&) const = default;
};

/// What a schedule's order depends on: pipeline ranks, layout.vp and the micro-batches per
/// step (gradient accumulation steps).
struct Dims {
  int64_t pp = 1;
  int64_t vp = 1;
  int64_t micro_batches = 1;
  /// training.overlap_moe_expert_parallel_comm: the order pairs forwards with backwards
  /// (Step::paired). 1F1B (pp = 1 only, Megatron's forward_backward_no_pipelining path) and
  /// interleaved run one extra warm-up forward so that the forward and backward of each pair
  /// are independent (schedules.py get_pp_rank_microbatches: num_warmup_microbatches + 1);
  /// DualPipe / DualPipeV pair the F and B of their overlapped chunks (steps 4 and 5).
  bool combined_1f1b = false;
};

/// Where a model chunk sits: its virtual stage in model order and its neighbours. A
/// `Place{rank, chunk}` of -1 means none (first/last virtual stage of the model).
struct Place {
  int64_t rank = -1;
  int64_t chunk = -1;
  bool valid() const { return rank >= 0; }
};

class PipelineSchedule {
 public:
  virtual ~PipelineSchedule() = default;
  /// The layout.schedule value, e.g. "zb-h1".
  virtual const char* name() const = 0;
  /// The paper / code the order follows.
  virtual const char* source() const = 0;
  /// One line for --help / explain.
  virtual const char* summary() const = 0;
  virtual Schedule id() const = 0;

  /// Input errors for dims this schedule cannot run, each naming the key and the
  /// constraint (e.g. "layout.schedule=dualpipe needs an even layout.pp (got 3)").
  virtual std::vector<std::string> check(const Dims& d) const = 0;

  /// Model chunks each pipeline rank holds: 1, layout.vp (interleaved) or 2 (V / DualPipe).
  virtual int64_t chunks(const Dims& d) const { return d.vp; }
  /// Virtual stages of the model (each a distinct run of layers): pp x chunks, except
  /// DualPipe, whose two directions hold the same pp stages (each on two ranks).
  virtual int64_t virtual_stages(const Dims& d) const { return d.pp * chunks(d); }
  /// The virtual stage (model order) that chunk `c` of pipeline rank `r` runs. Megatron's
  /// interleaving by default: c * pp + r (Narayanan 2021 Sec 2.2.2).
  virtual int64_t virtual_stage(const Dims& d, int64_t r, int64_t c) const { return c * d.pp + r; }
  /// Who runs virtual stage `vs` for micro-batch `mb` (the inverse of virtual_stage; DualPipe
  /// answers by the micro-batch's direction). Megatron's interleaving by default.
  virtual Place place(const Dims& d, int64_t vs, int64_t /*mb*/) const { return {vs % d.pp, vs / d.pp}; }
  /// The chunk that receives the forward output of chunk `c` of rank `r` for micro-batch
  /// `mb` (and sends back its input gradient): the next virtual stage, or none after the
  /// loss. The same rank means a local hand-over without pipeline communication.
  Place next(const Dims& d, int64_t r, int64_t c, int64_t mb) const;
  /// The chunk its forward input comes from (and its input gradient goes to), or none on
  /// the embedding.
  Place prev(const Dims& d, int64_t r, int64_t c, int64_t mb) const;
  /// Whether chunk `c` of rank `r` holds the first (embedding) / last (loss) virtual stage.
  bool first(const Dims& d, int64_t r, int64_t c) const { return virtual_stage(d, r, c) == 0; }
  bool last(const Dims& d, int64_t r, int64_t c) const { return virtual_stage(d, r, c) == virtual_stages(d) - 1; }
  /// Whether chunk `c` of rank `r` runs micro-batch `mb` at all (DualPipe: each direction
  /// carries half of them).
  virtual bool runs(const Dims&, int64_t /*r*/, int64_t /*c*/, int64_t /*mb*/) const { return true; }
  /// Whether each layer's weights are held by two ranks (DualPipe), whose gradients are
  /// then summed before the optimizer.
  virtual bool params_twice() const { return false; }
  /// Whether the order splits backwards into B and W.
  virtual bool splits_backward() const { return false; }
  /// Whether the schedule can pair forwards with backwards (Dims::combined_1f1b); check()
  /// names the constraint when it cannot for these dims.
  virtual bool pairs_forward_backward() const { return false; }

  /// The order of every pipeline rank, [rank][k]. Requires check(d) to be empty.
  virtual std::vector<std::vector<Step>> order(const Dims& d) const = 0;

  /// The bubble of the paper's closed form on uniform costs, for the tests: every chunk's
  /// F, B and W take f, b and w seconds and messages are free; -1 when the paper gives none
  /// for these dims. Per rank, idle time between the start and the end of the step.
  virtual double closed_form_bubble(const Dims& d, double f, double b, double w) const = 0;
};

/// The registered schedules, in registry order.
const std::vector<const PipelineSchedule*>& all_schedules();
/// The schedule of a layout.
const PipelineSchedule& schedule_of(Schedule s);
/// By layout.schedule name; nullptr when unknown.
const PipelineSchedule* find_schedule(const std::string& name);
/// "gpipe, 1f1b, ..." for error messages.
std::string schedule_names();
/// Dims of an experiment's layout and training (micro-batches = Training::accumulation;
/// combined_1f1b = training.overlap_moe_expert_parallel_comm).
Dims dims_of(const Layout& l, const Training& t, int64_t micro_batches);

// ---- order analysis shared by the memory model, the analytic engine and the tests ----

/// What a rank's order keeps alive, in chunk-micro-batches: a micro-batch's activations of a
/// chunk are held from its F until its backward has consumed them (BW, or W when split: W
/// needs the layer inputs and output gradients, ZB paper Sec 2; counting them until W is the
/// paper's memory accounting, which keeps ZB-H1 at 1F1B's peak).
struct OrderStats {
  int64_t peak_live = 0;        // most chunk-micro-batches alive at once
  int64_t peak_live_chunk0 = 0; // of them, on chunk 0 (the first virtual stage's embedding)
  int64_t warmup = 0;           // forwards before the first backward (Megatron's warm-up + 1 in 1F1B;
                                // a paired F runs with its backward: Megatron's warm-up in the combined 1F1B)
};
OrderStats order_stats(const std::vector<Step>& rank_order);

/// Per-rank costs of one micro-batch's F, B and W of each chunk, seconds.
struct ChunkCosts {
  double f = 0, b = 0, w = 0;
  /// Seconds a combined forward-backward pass (Step::paired) saves against its F and BW run
  /// one after the other: the EP AllToAll each half hides behind the other's compute.
  double fb_save = 0;
};
/// Timing of an order: each rank runs its steps in order; an F waits for the previous
/// virtual stage's F of the micro-batch, a B (or BW) for the next one's B, plus `p2p_s` when
/// the two are on different ranks; a W follows its own B. A paired F and the BW after it
/// (Step::paired) start together once both are ready and both end after
/// f(F's chunk) + b + w(BW's chunk) - min(fb_save of the two chunks). costs[r][c]. Returns per-rank
/// finish times (the step's pipeline time is the max) and busy time; throws std::logic_error
/// on a deadlock (an order no rank can advance), which a registered schedule never has.
struct OrderTiming {
  std::vector<double> finish;  // per rank, seconds from the step start
  std::vector<double> busy;    // per rank, seconds of work
  double makespan = 0;
  /// With keep_starts: the start of each step, [rank][k] as in the order (end = start + cost).
  std::vector<std::vector<double>> starts;
};
OrderTiming time_order(const PipelineSchedule& s, const Dims& d, const std::vector<std::vector<Step>>& order,
                       const std::vector<std::vector<ChunkCosts>>& costs, double p2p_s, bool keep_starts = false);

}  // namespace dtsim::sched
