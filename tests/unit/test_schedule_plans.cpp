// The registered pipeline schedules through the plan, the memory model and both engines
// (models/schedules/, models/plan.cpp): on a shipped 1F1B experiment, zero-bubble and
// DualPipe runs give the bubble ordering their papers state, ZB-H1 keeps 1F1B's peak memory,
// every pass's ops are in the plan exactly once, and the constraints are input errors.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/memory.hpp"
#include "models/plan.hpp"
#include "models/schedules/schedule.hpp"
#include "models/verify/verify.hpp"
#include "models/sweep_spec.hpp"
#include "sim/analytic_engine.hpp"
#include "sim/sweep/sweep.hpp"
#include "sim/engine.hpp"

namespace dtsim {
namespace {

// Narayanan 2021 Table 1's 76.1B row: pp 4, 56 micro-batches per step, 1F1B.
const std::string kExp = std::string(DTSIM_SOURCE_DIR) + "/experiments/validation/narayanan-gpt-76.1b.yaml";

Experiment with_schedule(const std::string& name, std::vector<std::string> extra = {}) {
  extra.push_back("layout.schedule=" + name);
  return load_experiment(kExp, extra);
}

double max_stage_peak(const Experiment& e) {
  double peak = 0;
  for (int64_t s = 0; s < e.layout.pp; ++s) peak = std::max(peak, stage_memory(e, s).peak_bytes);
  return peak;
}

double max_bubble(const StepResult& r) {
  double b = 0;
  for (const auto& st : r.stages) b = std::max(b, st.bubble_s);
  return b;
}

TEST(SchedulePlans, ZeroBubbleShrinksTheBubbleAndH1KeepsTheMemory) {
  const Experiment one = with_schedule("1f1b"), h1 = with_schedule("zb-h1"), h2 = with_schedule("zb-h2");
  const StepResult r1 = simulate_step_isolated(one), rh1 = simulate_step_isolated(h1), rh2 = simulate_step_isolated(h2);
  EXPECT_LT(max_bubble(rh1), 0.8 * max_bubble(r1));
  EXPECT_LT(max_bubble(rh2), max_bubble(rh1));
  // The step itself need not shrink: a split backward reduces its TP input gradient in B with
  // nothing left to hide it behind (the W runs later), as sail-sg's implementation does
  // (models/plan.cpp column_parallel_backward); here that costs about what the bubble saves.
  EXPECT_LE(rh2.step_time_s, rh1.step_time_s);
  // ZB paper Table 1: ZB-H1's peak is 1F1B's (p M_B, the first rank); ZB-H2's grows.
  EXPECT_DOUBLE_EQ(max_stage_peak(h1), max_stage_peak(one));
  EXPECT_GT(max_stage_peak(h2), max_stage_peak(one));
  // Same work: every pass split, none lost.
  EXPECT_NEAR(rh1.hardware_flops, r1.hardware_flops, 1e-9 * r1.hardware_flops);
  // The analytic engine orders them alike.
  const StepResult a1 = simulate_step_analytic(one), ah1 = simulate_step_analytic(h1), ah2 = simulate_step_analytic(h2);
  EXPECT_LT(max_bubble(ah1), max_bubble(a1));
  EXPECT_LE(max_bubble(ah2), max_bubble(ah1));
  EXPECT_NEAR(ah1.step_time_s, rh1.step_time_s, 0.05 * rh1.step_time_s);
  EXPECT_NEAR(ah2.step_time_s, rh2.step_time_s, 0.05 * rh2.step_time_s);
}

TEST(SchedulePlans, EveryWeightGradientOnceAndAfterItsInputGradient) {
  for (const char* name : {"zb-h1", "zb-h2", "dualpipe"}) {
    SCOPED_TRACE(name);
    const StepPlan plan = build_step_plan(with_schedule(name));
    const StepPlan fused = build_step_plan(with_schedule("1f1b"));
    for (size_t s = 0; s < plan.stages.size(); ++s) {
      std::map<std::string, int> split, full;
      std::map<std::pair<int, int>, bool> b_seen;  // (layer, mb) whose qkv_dgrad ran
      for (const Op& op : plan.stages[s].ops) {
        if (op.type != OpType::compute) continue;
        const std::pair<int, int> key{op.layer, op.micro_batch};
        if (std::string(op.name) == "qkv_dgrad") b_seen[key] = true;
        if (std::string(op.name) == "qkv_wgrad") {
          EXPECT_TRUE(b_seen[key]) << "W of layer " << op.layer << " before its B";
        }
        if (op.pass == Pass::W) {
          EXPECT_TRUE(std::string(op.name).find("wgrad") != std::string::npos || std::string(op.name) == "embedding_bwd")
              << op.name;
        }
      }
      if (std::string(name) == "dualpipe") continue;  // a stage holds other layers there
      for (const Op& op : plan.stages[s].ops)
        if (op.type == OpType::compute) ++split[op.name];
      for (const Op& op : fused.stages[s].ops)
        if (op.type == OpType::compute) ++full[op.name];
      EXPECT_EQ(split, full) << "stage " << s;
    }
  }
}

TEST(SchedulePlans, DualPipeRunsHoldsEveryStageTwiceAndSumsTheCopies) {
  const Experiment dp = with_schedule("dualpipe");
  const StepPlan plan = build_step_plan(dp);
  int mirror = 0;
  for (const auto& st : plan.stages)
    for (const Op& op : st.ops)
      if (std::string(op.name) == "dualpipe_grad_allreduce") {
        ++mirror;
        EXPECT_EQ(op.group, GroupKind::MIRROR);
        EXPECT_EQ(op.reduce, ReduceOp::sum);
      }
  EXPECT_EQ(mirror, static_cast<int>(dp.layout.pp));
  // Rank r holds stages r and pp - 1 - r; the first and last rank hold the embedding and the
  // head together, so a tied word embedding needs no second copy there (as with pp = 1).
  const StepPlan one = build_step_plan(with_schedule("1f1b"));
  const double tied_copy =
      dp.model.tied_embeddings ? static_cast<double>(dp.model.vocab * dp.model.hidden) / static_cast<double>(dp.layout.tp) : 0.0;
  for (size_t r = 0; r < plan.stages.size(); ++r) {
    const bool edge = r == 0 || r + 1 == plan.stages.size();
    EXPECT_DOUBLE_EQ(plan.stages[r].params_per_rank,
                     one.stages[r].params_per_rank + one.stages[plan.stages.size() - 1 - r].params_per_rank -
                         (edge ? tied_copy : 0.0));
  }
  // The mirror sum covers the tied embedding: no separate embedding-group AllReduce.
  for (const auto& st : plan.stages)
    for (const Op& op : st.ops) EXPECT_STRNE(op.name, "embedding_grad_allreduce");
  const StepResult r = simulate_step_isolated(dp);
  EXPECT_GT(r.step_time_s, 0);
  const StepResult dv = simulate_step_isolated(with_schedule("dualpipev", {"layout.vp=2", "model.layers=64"}));
  EXPECT_GT(dv.step_time_s, 0);
}

TEST(SchedulePlans, ConstraintsAreInputErrorsNamingTheKey) {
  try {
    (void)with_schedule("dualpipe", {"layout.pp=3", "layout.dp=1"});
    FAIL() << "dualpipe with an odd pp must be refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("layout.schedule=dualpipe needs an even layout.pp"), std::string::npos)
        << e.what();
  }
  try {
    (void)with_schedule("dualpipev");  // vp = 1
    FAIL() << "dualpipev without vp = 2 must be refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("layout.vp=2"), std::string::npos) << e.what();
  }
}

// Issue 15: splitting B from W and reordering by DualPipe leave every gradient and Adam
// state equal to the single-device reference; a W before its B, or a dropped W, fails.
TEST(SchedulePlans, VerifyPassesThroughEverySplitScheduleAndCatchesMisplacedW) {
  const std::string llama = std::string(DTSIM_SOURCE_DIR) + "/experiments/examples/llama3-8b-h100.yaml";
  for (const char* name : {"zb-h1", "zb-h2", "dualpipe", "dualpipev"}) {
    SCOPED_TRACE(name);
    std::vector<std::string> set = {"layout.pp=4", std::string("layout.schedule=") + name};
    if (std::string(name) == "dualpipev") set.push_back("layout.vp=2");
    const Experiment e = load_experiment(llama, set);
    verify::VerifyOptions o;
    o.steps = 2;
    EXPECT_TRUE(verify::verify_experiment(e, o).passed());
    for (const verify::Injection bug : {verify::Injection::w_before_b, verify::Injection::drop_w}) {
      o.inject = bug;
      EXPECT_FALSE(verify::verify_experiment(e, o).passed());
    }
  }
}

// The sweep space takes `schedule` as a dimension: every point of every listed schedule is
// enumerated and evaluated, and a point a schedule's constraints refuse is invalid with the
// reason.
TEST(SchedulePlans, SweepSpaceTakesTheScheduleAsADimension) {
  // The shipped small sweep's model, training and cluster (experiments/sweeps/), this space.
  std::ifstream in(std::string(DTSIM_SOURCE_DIR) + "/experiments/sweeps/gpt-2.7b-32-a100.yaml");
  std::string spec((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_NE(spec.find("\nvary:"), std::string::npos);
  spec = spec.substr(0, spec.find("\nvary:") + 1) + R"(space:
  tp: [8]
  pp: [2, 4]
  micro_batch: [1]
  schedule: [1f1b, zb-h1, zb-h2, dualpipe]
)";
  const SweepSpec sw = parse_sweep_spec(spec, "schedules.yaml", SpecKind::sweep);
  const auto points = sweep::enumerate_layouts(sw);
  ASSERT_EQ(points.size(), 8u);
  sweep::Evaluator ev(sw);
  std::map<std::string, double> step;
  for (const auto& p : points) {
    const SweepRow row = ev.analytic(p);
    EXPECT_EQ(row.status, "ok") << to_string(p.layout.schedule) << " pp " << p.layout.pp << ": " << row.reason;
    step[std::string(to_string(p.layout.schedule)) + "/" + std::to_string(p.layout.pp)] = row.step_time_s;
  }
  EXPECT_LE(step["zb-h2/4"], step["zb-h1/4"]);
  const SweepSpec bad = parse_sweep_spec(
      spec.substr(0, spec.find("  pp: [2, 4]")) + "  pp: [1]\n  micro_batch: [1]\n  schedule: [dualpipe]\n",
      "schedules.yaml", SpecKind::sweep);
  const auto refused = sweep::enumerate_layouts(bad);
  ASSERT_EQ(refused.size(), 1u);
  const SweepRow row = sweep::Evaluator(bad).analytic(refused.front());
  EXPECT_EQ(row.status, "invalid");
  EXPECT_NE(row.reason.find("dualpipe"), std::string::npos) << row.reason;
  EXPECT_THROW(parse_sweep_spec(spec + "  bogus: 1\n", "schedules.yaml", SpecKind::sweep), InputError);
  std::string unknown = spec;
  unknown.replace(unknown.find("dualpipe]"), 9, "zero-bubble]");
  EXPECT_THROW(parse_sweep_spec(unknown, "schedules.yaml", SpecKind::sweep), InputError);
}

// The analytic engine keeps the papers' closed forms for GPipe, 1F1B and interleaved 1F1B
// (sweeps evaluate ~10^5 layouts a second; timing every order would cost O(p m v) each) and
// times the other schedules' orders; the closed forms are the orders' timing on the same
// per-stage costs (measured: 1F1B and GPipe to rounding, interleaved to 0.01%).
TEST(SchedulePlans, AnalyticClosedFormsAreTheOrdersTiming) {
  for (const auto& [file, sets] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {kExp, {}},
           {std::string(DTSIM_SOURCE_DIR) + "/experiments/gpt3-175b-selective.yaml", {}},
           {kExp, {"layout.schedule=gpipe"}}}) {
    const Experiment e = load_experiment(file, sets);
    SCOPED_TRACE(file + " " + to_string(e.layout.schedule));
    AnalyticEngine eng(e);
    double p2p = 0;
    const auto passes = eng.stage_passes(e.layout, e.training.micro_batch, &p2p);
    const sched::PipelineSchedule& sch = sched::schedule_of(e.layout.schedule);
    const sched::Dims d = sched::dims_of(e.layout, e.training, e.training.accumulation(e.layout));
    std::vector<std::vector<sched::ChunkCosts>> costs;
    for (const auto& ps : passes)
      costs.emplace_back(static_cast<size_t>(sch.chunks(d)),
                         sched::ChunkCosts{ps.forward_s / static_cast<double>(sch.chunks(d)),
                                           ps.backward_s / static_cast<double>(sch.chunks(d)), 0.0});
    const double timed = sched::time_order(sch, d, sch.order(d), costs, p2p).makespan;
    EXPECT_NEAR(eng.estimate(e.layout, e.training.micro_batch).pipeline_s, timed, 1e-3 * timed);  // measured: 1F1B/GPipe exact, interleaved 0.01%
  }
}

}  // namespace
}  // namespace dtsim
