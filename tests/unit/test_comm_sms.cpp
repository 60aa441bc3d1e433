// The SMs a communication kernel holds slow the compute beside it by its own count
// (Op::comm_sms, models/compute_cost.hpp comm_overlap_speed): NCCL collectives kNcclBlocks,
// the DeepEP / HybridEP dispatch and combine training.moe_deepep_num_sms /
// moe_hybridep_num_sms (Megatron-Core transformer_config.py). The plan carries the count;
// both engines read it; fewer SMs, less slowdown; bad counts are input errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "models/compute_cost.hpp"
#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/plan.hpp"
#include "models/rank_grid.hpp"
#include "reports/explain.hpp"
#include "sim/analytic_engine.hpp"
#include "sim/collectives/collective.hpp"
#include "sim/engine.hpp"
#include "tests/unit/input_problem.hpp"

namespace dtsim {
namespace {

// A Mixtral-shaped MoE (8 layers, 8 experts, top-2) with a shared expert computing while the
// tokens are dispatched (moe_shared_expert_overlap), EP8 on two DGX H100 (the dispatch crosses
// nodes with EP16).
std::string yaml(const std::string& training_extra) {
  return "model: {name: moe, layers: 8, hidden: 4096, heads: 32, kv_heads: 8, ffn_hidden: 14336, vocab: 32000,\n"
         "        activation: swiglu, norm: rmsnorm, position: rope, tied_embeddings: false,\n"
         "        moe: {num_experts: 16, router_topk: 2, moe_ffn_hidden: 14336, shared_expert_ffn_hidden: 14336}}\n"
         "cluster: {node: dgx-h100, nodes: 2}\n"
         "layout: {dp: 16, tp: 1, ep: 16, etp: 1, zero_stage: 1}\n"
         "training: {seq_len: 4096, global_batch: 32, micro_batch: 1, flash_attention: true,\n"
         "           moe_shared_expert_overlap: true, moe_token_dispatcher: deepep" +
         training_extra + "}\n";
}

TEST(CommSms, ThePlanCarriesTheDispatchersSmCount) {
  auto ep_sms = [](const Experiment& e) {
    const StepPlan plan = build_step_plan(e);
    int n = 0;
    for (const Op& op : plan.stages.front().ops)
      if ((op.type == OpType::issue || op.type == OpType::collective) && op.group == GroupKind::EP &&
          op.collective == Collective::AllToAll) {
        ++n;
        EXPECT_EQ(op.comm_sms, e.training.moe_token_dispatcher == "alltoall" ? 0
                               : e.training.moe_token_dispatcher == "deepep" ? e.training.moe_deepep_num_sms
                                                                             : e.training.moe_hybridep_num_sms)
            << op.name;
      }
    return n;
  };
  EXPECT_GT(ep_sms(parse_experiment(yaml(""), "a.yaml")), 0);
  EXPECT_GT(ep_sms(parse_experiment(yaml(", moe_deepep_num_sms: 8"), "a.yaml")), 0);
  std::string hybrid = yaml(", moe_hybridep_num_sms: 16");
  hybrid.replace(hybrid.find("deepep"), 6, "hybridep");
  EXPECT_GT(ep_sms(parse_experiment(hybrid, "a.yaml")), 0);
  std::string nccl = yaml("");
  nccl.replace(nccl.find("deepep"), 6, "alltoall");
  EXPECT_GT(ep_sms(parse_experiment(nccl, "a.yaml")), 0);
  // The speed a holder of n SMs leaves: 1 - n / 132 on an H100.
  const Experiment e = parse_experiment(yaml(""), "a.yaml");
  EXPECT_DOUBLE_EQ(comm_overlap_speed(e.cluster.gpu, true, 20), 1.0 - 20.0 / 132.0);
  EXPECT_DOUBLE_EQ(comm_overlap_speed(e.cluster.gpu, true), 1.0 - kNcclBlocks / 132.0);
  EXPECT_DOUBLE_EQ(comm_overlap_speed(e.cluster.gpu, false, 20), 1.0);
}

TEST(CommSms, FewerSmsLessSlowdownInBothEngines) {
  const Experiment few = parse_experiment(yaml(", moe_deepep_num_sms: 4"), "a.yaml");
  const Experiment dflt = parse_experiment(yaml(""), "a.yaml");  // 20
  const Experiment many = parse_experiment(yaml(", moe_deepep_num_sms: 64"), "a.yaml");
  const Experiment off = parse_experiment(yaml(", comm_interference: false"), "a.yaml");
  const StepResult d_few = simulate_step_isolated(few), d_dflt = simulate_step_isolated(dflt),
                   d_many = simulate_step_isolated(many), d_off = simulate_step_isolated(off);
  auto slow = [](const StepResult& r) { return r.stages.front().slowdown_s; };
  EXPECT_LT(slow(d_few), slow(d_dflt));
  EXPECT_LT(slow(d_dflt), slow(d_many));
  EXPECT_LE(d_off.step_time_s, d_few.step_time_s);
  EXPECT_LT(d_few.step_time_s, d_many.step_time_s);
  // The same bytes move whatever SMs the kernels hold.
  EXPECT_DOUBLE_EQ(d_few.comm.at("EP").bytes, d_many.comm.at("EP").bytes);
  // The analytic engine reads the same plan fact, in the same direction, within 10%.
  const StepResult a_few = simulate_step_analytic(few), a_many = simulate_step_analytic(many);
  EXPECT_LT(a_few.step_time_s, a_many.step_time_s);
  EXPECT_NEAR(a_few.step_time_s / d_few.step_time_s, 1.0, 0.10);
  EXPECT_NEAR(a_many.step_time_s / d_many.step_time_s, 1.0, 0.10);
}

TEST(CommSms, ExplainSaysHowTheTokensTravelAndWhatTheyHold) {
  const Experiment deepep = parse_experiment(yaml(""), "a.yaml");
  // EP16 over 2 nodes, 16 experts top-2 (no groups): a token reaches the other node with
  // 1 - C(8, 2) / C(16, 2) = 1 - 28 / 120 of probability, i.e. 2 x 0.767 nodes x 1/2 remote.
  const collectives::DeepEpFanout f = collectives::deepep_fanout(16, 2, collectives::ep_token_routing(deepep));
  EXPECT_NEAR(f.remote_nodes, 2.0 * (1.0 - 28.0 / 120.0) / 2.0, 1e-12);
  ExplainEpReach reach{16, 2, f.remote_nodes, f.other_members};
  const std::string text = format_explain(deepep, build_step_plan(deepep), &reach);
  EXPECT_NE(text.find("moves     training.moe_token_dispatcher=deepep"), std::string::npos) << text;
  EXPECT_NE(text.find("(0.77 of 1 other nodes on average)"), std::string::npos) << text;
  EXPECT_NE(text.find("its kernels hold 20 of 132 SMs"), std::string::npos) << text;
  std::string nccl_text = yaml("");
  nccl_text.replace(nccl_text.find("deepep"), 6, "alltoall");
  const Experiment nccl = parse_experiment(nccl_text, "a.yaml");
  const std::string t2 = format_explain(nccl, build_step_plan(nccl));
  EXPECT_NE(t2.find("NCCL's AllToAll, one copy of a token per"), std::string::npos) << t2;
  EXPECT_NE(t2.find("its kernels hold 24 of 132 SMs"), std::string::npos) << t2;
}

TEST(CommSms, InputErrors) {
  auto problem = [](const std::string& text) { return test_files::input_problem(text); };
  EXPECT_NE(problem(yaml(", moe_deepep_num_sms: 0")).find("training.moe_deepep_num_sms=0 must be at least 1"),
            std::string::npos);
  EXPECT_NE(problem(yaml(", moe_hybridep_num_sms: 132")).find("fewer than the GPU's 132 SMs"), std::string::npos);
}

}  // namespace
}  // namespace dtsim
