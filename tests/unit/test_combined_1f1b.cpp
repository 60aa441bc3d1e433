// training.overlap_moe_expert_parallel_comm: Megatron-Core's combined 1F1B and DualPipe's
// overlapped forward-backward chunks (models/combined_1f1b.hpp, models/schedules/): the
// orders pair forwards with backwards, the plan merges each pair's layers so that one
// micro-batch's EP AllToAll travels beside the other's compute, both engines agree, memory
// holds the extra warm-up micro-batch, and Megatron's constraints are input errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "input_problem.hpp"
#include "models/combined_1f1b.hpp"
#include "models/experiment_io.hpp"
#include "models/memory.hpp"
#include "models/plan.hpp"
#include "models/schedules/schedule.hpp"
#include "sim/analytic_engine.hpp"
#include "reports/explain.hpp"
#include "sim/engine.hpp"

namespace dtsim {
namespace {

using sched::Dims;
using sched::Pass;
using sched::Step;

std::string moe_yaml(const std::string& layout, const std::string& training = "", int nodes = 8,
                     int experts = 8) {
  return "title: t\n"
         "model:\n  name: m\n  layers: 16\n  hidden: 4096\n  heads: 32\n  kv_heads: 8\n  ffn_hidden: 14336\n"
         "  activation: swiglu\n  vocab: 32000\n  tied_embeddings: false\n  norm: rmsnorm\n  position: rope\n"
         "  moe:\n    num_experts: " +
         std::to_string(experts) +
         "\n    router_topk: 2\n    moe_ffn_hidden: 14336\n"
         "cluster:\n  node: dgx-h100\n  nodes: " +
         std::to_string(nodes) + "\nlayout:\n" + layout +
         "training:\n  seq_len: 4096\n  global_batch: 128\n  micro_batch: 1\n  dtype: bf16\n" + training;
}
const std::string kOn = "  overlap_moe_expert_parallel_comm: true\n";

// Every F and BW of each (chunk, micro-batch) the schedule runs exactly once, every paired F
// directly followed by a BW.
void expect_well_formed(const sched::PipelineSchedule& s, const Dims& d) {
  const auto order = s.order(d);
  for (size_t r = 0; r < order.size(); ++r) {
    std::map<std::pair<int, int>, int> f, bw;
    const auto& o = order[r];
    for (size_t k = 0; k < o.size(); ++k) {
      if (o[k].pass == Pass::F) ++f[{o[k].chunk, o[k].mb}];
      if (o[k].pass == Pass::BW || o[k].pass == Pass::B) ++bw[{o[k].chunk, o[k].mb}];
      if (o[k].paired) {
        ASSERT_EQ(o[k].pass, Pass::F) << s.name();
        ASSERT_LT(k + 1, o.size()) << s.name();
        EXPECT_EQ(o[k + 1].pass, Pass::BW) << s.name();
      }
    }
    for (const auto& [key, n] : f) EXPECT_EQ(n, 1) << s.name() << " rank " << r;
    for (const auto& [key, n] : bw) EXPECT_EQ(n, 1) << s.name() << " rank " << r;
    EXPECT_EQ(f.size(), bw.size()) << s.name();
  }
}

int paired_count(const std::vector<Step>& o) {
  return static_cast<int>(std::count_if(o.begin(), o.end(), [](const Step& s) { return s.paired; }));
}

TEST(Combined1F1B, InterleavedRunsOneMoreWarmupForwardAndPairsTheSteadyState) {
  const auto& s = sched::schedule_of(Schedule::interleaved);
  for (int64_t p : {2, 4})
    for (int64_t v : {2, 3})
      for (int64_t m : {p, 2 * p, 4 * p}) {
        const Dims off{p, v, m, false}, on{p, v, m, true};
        expect_well_formed(s, on);
        const auto a = s.order(off), b = s.order(on);
        for (int64_t r = 0; r < p; ++r) {
          const auto sa = sched::order_stats(a[static_cast<size_t>(r)]);
          const auto sb = sched::order_stats(b[static_cast<size_t>(r)]);
          // Megatron: one more warm-up forward, then every forward merged with a backward
          // (order_stats counts 1F1B's first steady forward as warm-up, not a paired one).
          const int64_t warmup = std::min((p - r - 1) * 2 + (v - 1) * p + 1, m * v);
          EXPECT_EQ(sb.warmup, warmup) << p << " " << v << " " << m << " rank " << r;
          EXPECT_EQ(sa.warmup, warmup) << p << " " << v << " " << m << " rank " << r;
          EXPECT_EQ(paired_count(b[static_cast<size_t>(r)]), m * v - warmup);
          EXPECT_EQ(paired_count(a[static_cast<size_t>(r)]), 0);
        }
        // Both deps before a pair starts: no deadlock.
        std::vector<std::vector<sched::ChunkCosts>> costs(static_cast<size_t>(p),
                                                          std::vector<sched::ChunkCosts>(static_cast<size_t>(v), {1, 1, 1, 0.5}));
        EXPECT_NO_THROW(sched::time_order(s, on, b, costs, 0.1));
      }
}

TEST(Combined1F1B, OneFOneBWithoutPipeliningMergesEveryForwardButTheFirst) {
  const auto& s = sched::schedule_of(Schedule::one_f_one_b);
  const Dims on{1, 1, 6, true};
  expect_well_formed(s, on);
  const auto o = s.order(on)[0];
  ASSERT_EQ(o.size(), 12u);
  EXPECT_EQ(o[0], (Step{Pass::F, 0, 0, false}));
  EXPECT_EQ(o[1], (Step{Pass::F, 0, 1, true}));
  EXPECT_EQ(o[2], (Step{Pass::BW, 0, 0, false}));
  EXPECT_EQ(o.back(), (Step{Pass::BW, 0, 5, false}));
  EXPECT_EQ(paired_count(o), 5);
  // Five pairs each saving 0.5 s of 3 s.
  const auto t = sched::time_order(s, on, s.order(on), {{{1, 1, 1, 0.5}}}, 0.0);
  EXPECT_DOUBLE_EQ(t.makespan, 6 * 3.0 - 5 * 0.5);
  // Megatron-Core asserts interleaving with pp > 1.
  const auto problems = s.check({2, 1, 8, true});
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("needs layout.pp=1"), std::string::npos) << problems[0];
}

TEST(Combined1F1B, DualPipePairsItsOverlappedChunksButTheTurnRanksFirst) {
  // dualpipe.py / dualpipev.py step 4 (nF0B1F1B0) and step 5 (nB1F1B0) call
  // _forward_backward_chunk, except step 4's first pair on the middle (DualPipe) or last
  // (DualPipeV) rank.
  for (Schedule id : {Schedule::dualpipe, Schedule::dualpipev}) {
    const auto& s = sched::schedule_of(id);
    const int64_t p = 4, m = 16;
    const Dims on{p, id == Schedule::dualpipev ? 2 : 1, m, true};
    expect_well_formed(s, on);
    const int64_t R = id == Schedule::dualpipev ? p : p / 2;
    const int64_t mbs = id == Schedule::dualpipev ? m : m / 2;
    const auto order = s.order(on);
    for (int64_t r = 0; r < p; ++r) {
      const int64_t q = id == Schedule::dualpipev ? r : std::min(r, p - 1 - r);
      const int64_t step4 = mbs - 2 * R + q + 1, step5 = R - q - 1;
      EXPECT_EQ(paired_count(order[static_cast<size_t>(r)]), 2 * step4 + step5 - (q == R - 1 ? 1 : 0))
          << s.name() << " rank " << r;
    }
    const Dims off{p, on.vp, m, false};
    for (const auto& o : s.order(off)) EXPECT_EQ(paired_count(o), 0);
  }
}

// The plan: a merged layer pair in Megatron's order, the same compute ops as without.
TEST(Combined1F1B, PlanMergesEachLayerPairInMegatronsOrder) {
  const std::string layout = "  dp: 64\n  tp: 1\n  ep: 8\n";
  const StepPlan off = build_step_plan(parse_experiment(moe_yaml(layout), "off.yaml"));
  const StepPlan on = build_step_plan(parse_experiment(moe_yaml(layout, kOn), "on.yaml"));
  const auto& a = off.stages[0].ops;
  const auto& b = on.stages[0].ops;
  // Same compute (names, FLOPs, times) and the same collectives, in another order.
  std::map<std::string, double> fa, fb;
  std::map<std::string, int> ca, cb;
  for (const Op& op : a) {
    if (op.type == OpType::compute) fa[op.name] += op.flops + op.time_s;
    if (op.type == OpType::collective || op.type == OpType::issue) ++ca[op.name];
  }
  for (const Op& op : b) {
    if (op.type == OpType::compute) fb[op.name] += op.flops + op.time_s;
    if (op.type == OpType::collective || op.type == OpType::issue) ++cb[op.name];
  }
  EXPECT_EQ(ca, cb);
  ASSERT_EQ(fa.size(), fb.size());
  for (const auto& [name, x] : fa) EXPECT_NEAR(fb[name] / x, 1.0, 1e-12) << name;
  // Every EP AllToAll of the merged passes is issued and waited for once.
  std::map<int, int> issued, waited;
  for (const Op& op : b) {
    if (op.type == OpType::issue && op.kind == CommKind::EP) ++issued[op.handle];
    if (op.type == OpType::wait && op.kind == CommKind::EP) ++waited[op.handle];
  }
  EXPECT_FALSE(issued.empty());
  EXPECT_EQ(issued.size(), waited.size());
  for (const auto& [h, n] : issued) EXPECT_EQ(waited[h], 1) << h;
  // The first merged pair: micro-batch 1's forward of layer 0 beside micro-batch 0's
  // backward of layer 15. The EP stream's order: combine_bwd (mb 0), dispatch (mb 1),
  // dispatch_bwd (mb 0), combine (mb 1); the compute stream's: the forward's attention before
  // the backward's experts, before the forward's experts, before the backward's attention.
  std::vector<std::string> ep;
  int first_fwd_attention = -1, first_bwd_expert = -1, first_fwd_expert = -1, first_bwd_attention = -1;
  for (size_t i = 0; i < b.size(); ++i) {
    const Op& op = b[i];
    const bool f = op.micro_batch == 1 && op.layer == 0 && op.phase == Phase::forward;
    const bool k = op.micro_batch == 0 && op.layer == 15 && op.phase == Phase::backward;
    if (!f && !k) continue;
    if (op.type == OpType::issue && op.kind == CommKind::EP) ep.push_back(std::string(op.name) + (f ? "/1" : "/0"));
    const std::string n = op.name;
    if (f && first_fwd_attention < 0 && n == "qkv") first_fwd_attention = static_cast<int>(i);
    if (k && first_bwd_expert < 0 && n.rfind("expert_", 0) == 0) first_bwd_expert = static_cast<int>(i);
    if (f && first_fwd_expert < 0 && n.rfind("expert_", 0) == 0) first_fwd_expert = static_cast<int>(i);
    if (k && first_bwd_attention < 0 && n.rfind("qkv", 0) == 0) first_bwd_attention = static_cast<int>(i);
  }
  EXPECT_EQ(ep, (std::vector<std::string>{"moe_combine_bwd/0", "moe_dispatch/1", "moe_dispatch_bwd/0", "moe_combine/1"}));
  EXPECT_LT(first_fwd_attention, first_bwd_expert);
  EXPECT_LT(first_bwd_expert, first_fwd_expert);
  EXPECT_LT(first_fwd_expert, first_bwd_attention);
}

TEST(Combined1F1B, MergeMakesAnOverlappedAllToAllBlockingAfterWhatItRanBeside) {
  // delay_wgrad_compute's expert wgrads beside the dispatch's backward: in the combined pass
  // they run first, then the dispatch's backward (Megatron: mlp.backward_dw() before
  // moe_dispatch.backward()).
  auto op = [](OpType t, const char* name, CommKind k = CommKind::TP, int handle = -1) {
    Op o;
    o.type = t;
    o.name = name;
    o.kind = k;
    o.collective = k == CommKind::EP ? Collective::AllToAll : Collective::AllReduce;
    o.handle = handle;
    return o;
  };
  const std::vector<Op> fwd = {op(OpType::compute, "attn"), op(OpType::collective, "moe_dispatch", CommKind::EP),
                               op(OpType::compute, "experts"), op(OpType::collective, "moe_combine", CommKind::EP),
                               op(OpType::compute, "unpermute")};
  const std::vector<Op> bwd = {op(OpType::compute, "unpermute_bwd"),
                               op(OpType::collective, "moe_combine_bwd", CommKind::EP),
                               op(OpType::compute, "experts_dgrad"),
                               op(OpType::issue, "moe_dispatch_bwd", CommKind::EP, 7),
                               op(OpType::compute, "experts_wgrad"),
                               op(OpType::wait, "wait", CommKind::EP, 7),
                               op(OpType::compute, "attn_bwd")};
  std::vector<Op> out;
  int32_t handles = 8;
  merge_forward_backward(out, fwd, {op(OpType::compute, "recompute")}, bwd, handles);
  std::vector<std::string> names;
  for (const Op& o : out)
    names.push_back(std::string(o.type == OpType::issue ? "issue " : o.type == OpType::wait ? "wait " : "") + o.name +
                    (o.handle >= 0 ? "#" + std::to_string(o.handle) : ""));
  EXPECT_EQ(names, (std::vector<std::string>{"unpermute_bwd", "issue moe_combine_bwd#8", "attn", "issue moe_dispatch#9",
                                              "wait wait#8", "experts_dgrad", "experts_wgrad", "issue moe_dispatch_bwd#10",
                                              "wait wait#9", "experts", "issue moe_combine#11", "wait wait#10",
                                              "recompute", "attn_bwd", "wait wait#11", "unpermute"}));
  EXPECT_EQ(handles, 12);
}

// Both engines: the EP AllToAlls hide, the step is faster, and the closed form follows the DES.
TEST(Combined1F1B, HidesExpertParallelCommunicationInBothEngines) {
  struct Case {
    const char* layout;
    int nodes, experts;
    double exposed;  // at most this share of the EP time exposed without the overlap
  };
  const Case cases[] = {
      {"  dp: 64\n  tp: 1\n  ep: 8\n", 8, 8, 0.6},    // no pipelining
      {"  dp: 16\n  tp: 1\n  ep: 16\n", 2, 16, 0.6},  // EP across two nodes
      {"  dp: 16\n  tp: 1\n  pp: 4\n  vp: 2\n  schedule: interleaved\n  ep: 8\n", 8, 8, 0.6},
      // Expert TP 2: its blocking AllGather / ReduceScatter around the experts stay exposed.
      {"  dp: 8\n  tp: 2\n  pp: 4\n  vp: 2\n  schedule: interleaved\n  ep: 4\n  sequence_parallel: true\n", 8, 8, 0.75},
  };
  for (const Case& c : cases) {
    const Experiment off = parse_experiment(moe_yaml(c.layout, "", c.nodes, c.experts), "off.yaml");
    const Experiment on = parse_experiment(moe_yaml(c.layout, kOn, c.nodes, c.experts), "on.yaml");
    const StepResult d_off = simulate_step_isolated(off), d_on = simulate_step_isolated(on);
    const StepResult a_on = simulate_step_analytic(on);
    EXPECT_LT(d_on.comm.at("EP").exposed_s, c.exposed * d_off.comm.at("EP").exposed_s) << c.layout;
    EXPECT_NEAR(d_on.comm.at("EP").total_s / d_off.comm.at("EP").total_s, 1.0, 1e-9) << c.layout;
    EXPECT_LT(d_on.step_time_s, d_off.step_time_s) << c.layout;
    EXPECT_NEAR(a_on.step_time_s / d_on.step_time_s, 1.0, 0.10) << c.layout;
    EXPECT_NEAR(a_on.comm.at("EP").exposed_s / d_on.comm.at("EP").exposed_s, 1.0, 0.35) << c.layout;
  }
}

TEST(Combined1F1B, MemoryHoldsTheExtraWarmupMicroBatch) {
  const std::string layout = "  dp: 16\n  tp: 1\n  pp: 4\n  vp: 2\n  schedule: interleaved\n  ep: 8\n";
  const Experiment off = parse_experiment(moe_yaml(layout), "off.yaml");
  const Experiment on = parse_experiment(moe_yaml(layout, kOn), "on.yaml");
  for (int64_t s = 0; s < 4; ++s) {
    const ActivationBreakdown a = stage_activations(off, s), b = stage_activations(on, s);
    EXPECT_EQ(b.warmup, a.warmup + 1) << s;
    EXPECT_EQ(b.inflight, a.inflight + 1) << s;
    EXPECT_GT(stage_memory(on, s).peak_bytes, stage_memory(off, s).peak_bytes) << s;
  }
}

TEST(Combined1F1B, ExplainShowsThePairs) {
  const Experiment e =
      parse_experiment(moe_yaml("  dp: 16\n  tp: 1\n  pp: 4\n  vp: 2\n  schedule: interleaved\n  ep: 8\n", kOn), "on.yaml");
  const std::string text = format_explain(e, build_step_plan(e));
  // Stage 0: warm-up (4 - 0 - 1) * 2 + (2 - 1) * 4 + 1 = 11 forwards (F0-F3, F0'-F3', F4-F6),
  // then F7 merged with BW0 of chunk 1; 8 micro-batches x 2 chunks - 11 = 5 pairs.
  EXPECT_NE(text.find("F6 F7+BW0' F4'"), std::string::npos) << text;
  EXPECT_NE(text.find("training.overlap_moe_expert_parallel_comm: 5 of stage 0's 16 forwards"), std::string::npos);
}

TEST(Combined1F1B, MegatronsConstraintsAreInputErrors) {
  using test_files::input_problem;
  const std::string key = "training.overlap_moe_expert_parallel_comm";
  struct Case {
    std::string layout, training, expect;
  };
  const Case cases[] = {
      {"  dp: 64\n  tp: 1\n  ep: 1\n", kOn, "needs layout.ep > 1"},
      {"  dp: 64\n  tp: 1\n  ep: 8\n  recompute: full\n", kOn, "layout.recompute=full"},
      {"  dp: 64\n  tp: 1\n  ep: 8\n", kOn + "  moe_shared_expert_overlap: true\n", "moe_shared_expert_overlap"},
      {"  dp: 64\n  tp: 1\n  ep: 8\n  zero_stage: 3\n", kOn, "layout.zero_stage=3"},
      {"  dp: 64\n  tp: 1\n  ep: 8\n", kOn + "  cuda_graphs: true\n", "training.cuda_graphs"},
      {"  dp: 16\n  tp: 1\n  pp: 4\n  ep: 8\n  schedule: gpipe\n", kOn, "layout.schedule=gpipe"},
      {"  dp: 16\n  tp: 1\n  pp: 4\n  ep: 8\n", kOn, "needs layout.pp=1"},
  };
  for (const Case& c : cases) {
    const std::string why = input_problem(moe_yaml(c.layout, c.training), ".", "ep.yaml");
    EXPECT_NE(why.find(c.expect), std::string::npos) << why;
    EXPECT_NE(why.find("ep.yaml"), std::string::npos) << why;
  }
}

}  // namespace
}  // namespace dtsim
