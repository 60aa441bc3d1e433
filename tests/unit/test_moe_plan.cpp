// Mixture-of-experts: parallel folding groups, parameters, the plan's MoE ops and EDP
// gradient reduction, memory sharded over EDP, input errors, and the analytic engine against
// the DES on MoE layouts (issue 16).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>

#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/flops.hpp"
#include "models/memory.hpp"
#include "models/moe.hpp"
#include "models/plan.hpp"
#include "models/rank_grid.hpp"
#include "sim/analytic_engine.hpp"
#include "sim/engine.hpp"

namespace dtsim {
namespace {

namespace fs = std::filesystem;

std::string mixtral_yaml(const std::string& layout, const std::string& moe_extra = "", int nodes = 8) {
  return "title: t\n"
         "model:\n  name: m\n  layers: 32\n  hidden: 4096\n  heads: 32\n  kv_heads: 8\n  ffn_hidden: 14336\n"
         "  activation: swiglu\n  vocab: 32000\n  tied_embeddings: false\n  norm: rmsnorm\n  position: rope\n"
         "  moe:\n    num_experts: 8\n    router_topk: 2\n    moe_ffn_hidden: 14336\n" +
         moe_extra + "cluster:\n  node: dgx-h100\n  nodes: " + std::to_string(nodes) + "\nlayout:\n" + layout +
         "training:\n  seq_len: 4096\n  global_batch: 256\n  micro_batch: 1\n  dtype: bf16\n";
}

TEST(MoeGroups, ParallelFoldingNumbersExpertsInsideTheStage) {
  Layout l;
  l.tp = 2;
  l.dp = 8;
  l.pp = 2;
  l.ep = 4;
  l.etp = 1;
  const RankGrid g(l);
  // Stage 1 starts at rank 16; index i = etp + 1 * (ep + 4 * edp): EP members consecutive.
  EXPECT_EQ(g.group_of(17, GroupKind::EP), (std::vector<int64_t>{16, 17, 18, 19}));
  EXPECT_EQ(g.group_of(17, GroupKind::EDP), (std::vector<int64_t>{17, 21, 25, 29}));
  EXPECT_EQ(g.group_of(17, GroupKind::ETP), (std::vector<int64_t>{17}));
  EXPECT_EQ(l.edp(), 4);
  l.etp = 2;  // ETP innermost, then EP: EP members 2 apart
  const RankGrid g2(l);
  EXPECT_EQ(g2.group_of(0, GroupKind::EP), (std::vector<int64_t>{0, 2, 4, 6}));
  EXPECT_EQ(g2.group_of(0, GroupKind::ETP), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(g2.group_of(0, GroupKind::EDP), (std::vector<int64_t>{0, 8}));
}

TEST(MoeGroups, ConstraintsNameTheKeys) {
  Layout l;
  l.dp = 8;
  l.ep = 3;
  EXPECT_NE(expert_layout_problem(l, 8).find("layout.ep=3 must divide model.moe.num_experts=8"), std::string::npos);
  l.ep = 16;
  EXPECT_NE(expert_layout_problem(l, 16).find("must divide the ranks of a pipeline stage"), std::string::npos);
  l.ep = 2;
  EXPECT_NE(expert_layout_problem(l, 0).find("needs a mixture-of-experts model"), std::string::npos);
  l.ep = 4;
  EXPECT_EQ(expert_layout_problem(l, 8), "");
  // Through the YAML: the error names the file and the key.
  try {
    parse_experiment(mixtral_yaml("  dp: 64\n  tp: 1\n  ep: 3\n"), "bad.yaml");
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.yaml"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("layout.ep=3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_experiment(mixtral_yaml("  dp: 64\n  tp: 1\n", "    bogus: 1\n"), "k.yaml"), InputError);
  EXPECT_THROW(parse_experiment(mixtral_yaml("  dp: 32\n  tp: 2\n  ep: 8\n"), "sp.yaml"), InputError);  // needs SP
}

TEST(MoeModel, MixtralParametersAndFlops) {
  const Experiment e = parse_experiment(mixtral_yaml("  dp: 64\n  tp: 1\n"), "m.yaml");
  // Jiang et al. 2024 (arXiv 2401.04088) Sec 2: 47B total, 13B active parameters per token.
  const double total = static_cast<double>(total_parameters(e.model, 4096));
  const double active = static_cast<double>(active_parameters(e.model, 4096));
  EXPECT_NEAR(total / 1e9, 46.7, 0.05);
  EXPECT_NEAR(active / 1e9, 12.9, 0.05);
  // Model FLOPs follow the active experts: the 2 routed experts' GEMMs per token.
  const ForwardFlops f = layers_forward_flops(e.model, 1, 4096, 4096);
  EXPECT_DOUBLE_EQ(f.expert_up, 32.0 * 2.0 * 4096 * 2 * 4096 * 14336);
  EXPECT_DOUBLE_EQ(f.mlp_up, 0.0);
}

const Op* find_op(const StagePlan& sp, const std::string& name) {
  for (const Op& op : sp.ops)
    if (name == op.name) return &op;
  return nullptr;
}

TEST(MoePlan, DispatchCombineAndExpertGradients) {
  const Experiment e = parse_experiment(mixtral_yaml("  dp: 64\n  tp: 1\n  ep: 8\n  zero_stage: 1\n"), "p.yaml");
  const StepPlan plan = build_step_plan(e);
  const StagePlan& st = plan.stages.front();
  const Op* d = find_op(st, "moe_dispatch");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->collective, Collective::AllToAll);
  EXPECT_EQ(d->reduce, ReduceOp::none);  // a permutation, not a reduction
  EXPECT_EQ(d->group, GroupKind::EP);
  EXPECT_EQ(d->kind, CommKind::EP);
  // tokens x top-k x hidden x bf16 (forced balance: load 1).
  EXPECT_DOUBLE_EQ(d->size_bytes, 4096.0 * 2 * 4096 * 2);
  ASSERT_NE(find_op(st, "moe_combine"), nullptr);
  ASSERT_NE(find_op(st, "moe_dispatch_bwd"), nullptr);
  // Expert gradients: over EDP (64 / 8 = 8 ranks), AVG; dense over DP x CP.
  const Op* eg = find_op(st, "edp_grad_reducescatter");
  ASSERT_NE(eg, nullptr);
  EXPECT_EQ(eg->group, GroupKind::EDP);
  EXPECT_EQ(eg->reduce, ReduceOp::avg);
  double expert_bytes = 0, dense_bytes = 0;
  for (const Op& op : st.ops) {
    if (std::string(op.name) == "edp_grad_reducescatter") expert_bytes += op.size_bytes;
    if (std::string(op.name) == "dp_grad_reducescatter") dense_bytes += op.size_bytes;
  }
  // One expert of 3 h f per layer on each rank, 32 layers, fp32 gradients.
  EXPECT_DOUBLE_EQ(expert_bytes, 32.0 * 3 * 4096 * 14336 * 4);
  EXPECT_NEAR(dense_bytes + expert_bytes, st.params_per_rank * 4, 1.0);
  // The optimizer owns dense / 64 + experts / 8.
  const double expert = 32.0 * 3 * 4096 * 14336;
  EXPECT_NEAR(st.optimizer_params, (st.params_per_rank - expert) / 64 + expert / 8, 1.0);
}

TEST(MoePlan, GroupedGemmsMoveEachExpertsWeight) {
  // EP2 over 8 experts: 4 local experts, each with its own h x f weight; the token rows are
  // the sum over them (forced balance: 4096 tokens x top-2).
  const Experiment e = parse_experiment(mixtral_yaml("  dp: 8\n  tp: 1\n  ep: 2\n  zero_stage: 1\n", "", 1), "p.yaml");
  const StepPlan plan = build_step_plan(e);
  const StagePlan& st = plan.stages.front();
  const double rows = 4096.0 * 2, h = 4096, f = 14336, experts = 4;
  const Op* up = find_op(st, "expert_up");
  ASSERT_NE(up, nullptr);
  EXPECT_DOUBLE_EQ(up->bytes, 2.0 * (rows * h + experts * h * f + rows * f));  // B once per expert
  const Op* dgrad = find_op(st, "expert_down_dgrad");
  ASSERT_NE(dgrad, nullptr);
  EXPECT_DOUBLE_EQ(dgrad->bytes, 2.0 * (rows * h + experts * h * f + rows * f));
  const Op* wgrad = find_op(st, "expert_down_wgrad");
  ASSERT_NE(wgrad, nullptr);
  EXPECT_DOUBLE_EQ(wgrad->bytes, 2.0 * (f * rows + rows * h + experts * f * h));  // each expert's own gradient
  // A dense GEMM reads its one weight.
  const Op* qkv = find_op(st, "qkv");
  ASSERT_NE(qkv, nullptr);
  EXPECT_DOUBLE_EQ(qkv->bytes, 2.0 * (qkv->gemm.m * qkv->gemm.k + qkv->gemm.k * qkv->gemm.n + qkv->gemm.m * qkv->gemm.n));
}

TEST(MoePlan, LoadFactorScalesTheBusiestRank) {
  const Experiment forced = parse_experiment(mixtral_yaml("  dp: 64\n  tp: 1\n  ep: 8\n"), "f.yaml");
  const Experiment skew = parse_experiment(
      mixtral_yaml("  dp: 64\n  tp: 1\n  ep: 8\n", "    load_balancing: measured\n    load_imbalance: 1.5\n"), "s.yaml");
  const Experiment capped = parse_experiment(
      mixtral_yaml("  dp: 64\n  tp: 1\n  ep: 8\n",
                   "    load_balancing: measured\n    load_imbalance: 1.5\n    capacity_factor: 1.25\n"),
      "c.yaml");
  EXPECT_DOUBLE_EQ(moe_tokens(skew, 1).load, 1.5);
  EXPECT_DOUBLE_EQ(moe_tokens(capped, 1).load, 1.25);
  const double a = find_op(build_step_plan(forced).stages[0], "expert_up")->time_s;
  const double b = find_op(build_step_plan(skew).stages[0], "expert_up")->time_s;
  EXPECT_GT(b, a * 1.3);
  // aux-loss default: 1 + MaxVio / (E / ep) (models/moe.hpp).
  MoeSpec m = forced.model.moe;
  m.balance = RouterBalance::aux_loss;
  EXPECT_DOUBLE_EQ(moe_router_load(m, forced.layout), 1.0 + kMaxVioAuxLoss / 1.0);
}

TEST(MoeMemory, ExpertStatesShardOverEdp) {
  const Experiment e = parse_experiment(mixtral_yaml("  dp: 64\n  tp: 1\n  ep: 8\n  zero_stage: 1\n"), "mem.yaml");
  const double params = stage_parameters_per_rank(e.model, e.layout, 4096, 0);
  const double expert = stage_expert_parameters_per_rank(e.model, e.layout, 0);
  EXPECT_DOUBLE_EQ(expert, 32.0 * 3 * 4096 * 14336);
  const MemoryBreakdown mb = stage_memory(e, 0);
  // Megatron-Core distributed optimizer: 12 bytes per parameter sharded, dense over 64, experts over 8.
  EXPECT_NEAR(mb.optimizer_bytes, 12.0 * ((params - expert) / 64 + expert / 8), 1.0);
}

TEST(MoeEngines, AnalyticWithinTenPercentOfTheDes) {
  struct Case {
    const char* layout;
    int nodes;
  };
  const Case cases[] = {
      {"  dp: 64\n  tp: 1\n  ep: 8\n  zero_stage: 1\n", 8},
      {"  dp: 16\n  tp: 1\n  pp: 4\n  ep: 8\n  zero_stage: 1\n", 8},
      {"  dp: 8\n  tp: 2\n  pp: 4\n  ep: 4\n  sequence_parallel: true\n", 8},
      {"  dp: 32\n  tp: 1\n  pp: 2\n  ep: 8\n", 8},
      {"  dp: 16\n  tp: 1\n  ep: 8\n", 2},  // EP inside a node, DP across
      {"  dp: 16\n  tp: 1\n  ep: 16\n", 2},  // ... and EP across two nodes
  };
  for (const Case& c : cases) {
    std::string y = mixtral_yaml(c.layout, "", c.nodes);
    if (c.nodes == 2) {
      // 16 experts so that ep 16 divides them.
      const auto at = y.find("num_experts: 8");
      y.replace(at, 14, "num_experts: 16");
    }
    const Experiment e = parse_experiment(y, "a.yaml");
    const StepResult des = simulate_step_isolated(e);
    const StepResult ana = simulate_step_analytic(e);
    EXPECT_NEAR(ana.step_time_s / des.step_time_s, 1.0, 0.10) << c.layout;
    ASSERT_TRUE(des.comm.count("EP"));
    EXPECT_GT(des.comm.at("EP").total_s, 0.0) << c.layout;
    EXPECT_NEAR(ana.comm.at("EP").total_s / des.comm.at("EP").total_s, 1.0, 0.10) << c.layout;
  }
}

TEST(MoeExperiments, ShippedMixtralRuns) {
  const Experiment e = load_experiment((fs::path(DTSIM_SOURCE_DIR) / "experiments/moe/mixtral-8x7b-h100.yaml").string());
  const StepResult r = simulate_step_isolated(e);
  EXPECT_GT(r.step_time_s, 0.0);
  EXPECT_GT(r.comm.at("EP").total_s, 0.0);
  EXPECT_GT(r.comm.at("EP").bytes, 0.0);
  for (const auto& s : r.stages) EXPECT_TRUE(s.memory.fits);
}

}  // namespace
}  // namespace dtsim
