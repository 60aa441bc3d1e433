// Multi-token prediction (model.mtp_layers; DeepSeek-V3 report Sec 2.2, Megatron-Core
// multi_token_prediction.py): each depth's entry (models/blocks/mtp.hpp), a layer of the last
// layer's kind and the shared LM head on the rank holding the loss, with Megatron's copy of
// the word embedding there; parameters, FLOPs, plan, memory and both engines agree.
#include <gtest/gtest.h>

#include <string>

#include "input_problem.hpp"
#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/blocks/layer.hpp"
#include "models/flops.hpp"
#include "models/memory.hpp"
#include "models/plan.hpp"
#include "models/verify/verify.hpp"
#include "sim/analytic_engine.hpp"
#include "sim/engine.hpp"

namespace dtsim {
namespace {

// A small DeepSeek-shaped MoE model: 8 layers, the first dense, untied embeddings.
std::string mtp_yaml(const std::string& layout, int mtp, const std::string& extra_model = "") {
  return "title: t\n"
         "model:\n  name: m\n  layers: 8\n  hidden: 2048\n  heads: 16\n  kv_heads: 16\n  ffn_hidden: 8192\n"
         "  activation: swiglu\n  vocab: 64000\n  tied_embeddings: false\n  norm: rmsnorm\n  position: rope\n"
         "  mtp_layers: " +
         std::to_string(mtp) + "\n" + extra_model +
         "  moe:\n    num_experts: 16\n    router_topk: 2\n    moe_ffn_hidden: 1024\n    first_k_dense: 1\n"
         "cluster:\n  node: dgx-h100\n  nodes: 2\nlayout:\n" +
         layout + "training:\n  seq_len: 4096\n  global_batch: 64\n  micro_batch: 1\n  dtype: bf16\n";
}

TEST(Mtp, ParametersAreALayerOfTheLastKindAnEntryAndTheEmbeddingCopy) {
  const std::string layout = "  dp: 4\n  tp: 2\n  pp: 2\n  ep: 4\n  sequence_parallel: true\n";
  const Experiment off = parse_experiment(mtp_yaml(layout, 0), "off.yaml");
  const Experiment on = parse_experiment(mtp_yaml(layout, 1), "on.yaml");
  const double h = 2048, V = 64000;
  // Whole model: + the last (MoE) layer's parameters + eh_proj 2h x h + enorm, hnorm, final norm.
  EXPECT_EQ(total_parameters(on.model, 4096) - total_parameters(off.model, 4096),
            layer_parameters_at(on.model, 7) + static_cast<int64_t>(2 * h * h + 3 * h));
  // Per rank: the first stage holds nothing of it; the last stage the MTP layer (dense / tp,
  // experts / ep), the entry (eh_proj / tp + norms) and the word embedding's copy (V h / tp).
  EXPECT_DOUBLE_EQ(stage_parameters_per_rank(on.model, on.layout, 4096, 0),
                   stage_parameters_per_rank(off.model, off.layout, 4096, 0));
  const auto kinds = stage_layer_kinds(on.model, on.layout, 1);
  EXPECT_EQ(kinds[1], 5);  // layers 4-7 and the MTP layer, all MoE
  const blocks::Layer& moe = blocks::ModelBlocks(on.model).layer(7);
  const double experts = moe.parameters(on.model).expert_weights / 8;  // ep 4 x etp 2 (etp = tp by default)
  EXPECT_NEAR(stage_expert_parameters_per_rank(on.model, on.layout, 1) -
                  stage_expert_parameters_per_rank(off.model, off.layout, 1),
              experts, 1e-6);
  EXPECT_NEAR(stage_parameters_per_rank(on.model, on.layout, 4096, 1) - stage_parameters_per_rank(off.model, off.layout, 4096, 1),
              moe.parameters_per_tp_rank(on.model, 2) + experts + (2 * h * h / 2 + 3 * h) + V * h / 2, 1e-3);
}

TEST(Mtp, PlanRunsEachDepthOnTheLossStageAndSumsTheEmbeddingCopy) {
  for (const char* rc : {"none", "selective", "full"}) {
    const Experiment e = parse_experiment(
        mtp_yaml(std::string("  dp: 4\n  tp: 2\n  pp: 2\n  ep: 4\n  sequence_parallel: true\n  recompute: ") + rc + "\n", 2),
        "mtp.yaml");
    const StepPlan plan = build_step_plan(e);
    // Every FLOP the plan executes is in the hardware-FLOPs convention (MTP layers, eh_proj and
    // the extra LM heads included).
    EXPECT_NEAR(plan_executed_flops(plan) / hardware_flops_per_step(e.model, e.training.global_batch, e.training.seq_len,
                                                                    e.layout.recompute),
                1.0, 1e-12)
        << rc;
    int eh0 = 0, eh1 = 0, heads1 = 0, emb_ar = 0;
    for (const Op& op : plan.stages[0].ops) eh0 += std::string(op.name) == "mtp_eh_proj";
    for (const Op& op : plan.stages[1].ops) {
      eh1 += std::string(op.name) == "mtp_eh_proj" && op.phase == Phase::forward;
      heads1 += std::string(op.name) == "lm_head" && op.phase == Phase::forward;
      emb_ar += std::string(op.name) == "embedding_grad_allreduce";
    }
    const int mbs = static_cast<int>(plan.shape.micro_batches);
    EXPECT_EQ(eh0, 0);
    EXPECT_EQ(eh1, 2 * mbs);         // two depths per micro-batch
    EXPECT_EQ(heads1, 3 * mbs);      // the model's head and one per depth
    EXPECT_EQ(emb_ar, 1);            // the copy's gradient summed with the first stage's (untied)
  }
}

TEST(Mtp, SplitBackwardAndZero3PlansExecuteTheSameFlops) {
  for (const char* layout : {"  dp: 2\n  tp: 2\n  pp: 4\n  schedule: zb-h1\n  ep: 2\n  sequence_parallel: true\n",
                             "  dp: 16\n  tp: 1\n  ep: 8\n  zero_stage: 3\n  recompute: full\n"}) {
    const Experiment e = parse_experiment(mtp_yaml(layout, 1), "mtp.yaml");
    const StepPlan plan = build_step_plan(e);
    EXPECT_NEAR(plan_executed_flops(plan) / hardware_flops_per_step(e.model, e.training.global_batch, e.training.seq_len,
                                                                    e.layout.recompute),
                1.0, 1e-12)
        << layout;
  }
}

TEST(Mtp, ModelFlopsCountTheDepthsAsMegatronDoes) {
  const Experiment off = parse_experiment(mtp_yaml("  dp: 16\n  tp: 1\n  ep: 8\n", 0), "off.yaml");
  const Experiment on = parse_experiment(mtp_yaml("  dp: 16\n  tp: 1\n  ep: 8\n", 1), "on.yaml");
  const double B = 64, s = 4096, h = 2048, V = 64000;
  // training.py num_floating_point_operations: 3 x (the MTP layer + eh proj 2 (2h) h + logits 2 h V) per token.
  const double moe_layer = mtp_forward_flops(on.model, 64, 4096, 4096).total() - 2.0 * B * s * 2 * h * h;
  EXPECT_GT(moe_layer, 0.0);
  EXPECT_NEAR(model_flops_per_step(on.model, 64, 4096) - model_flops_per_step(off.model, 64, 4096),
              3.0 * (moe_layer + 2.0 * B * s * 2 * h * h + 2.0 * B * s * h * V), 1.0);
}

TEST(Mtp, MemoryKeepsEachDepthOnTheLossStage) {
  const std::string layout = "  dp: 4\n  tp: 2\n  pp: 2\n  ep: 4\n  sequence_parallel: true\n";
  const Experiment off = parse_experiment(mtp_yaml(layout, 0), "off.yaml");
  const Experiment on = parse_experiment(mtp_yaml(layout, 1), "on.yaml");
  EXPECT_EQ(stage_activations(on, 0).mtp_bytes, 0.0);
  const ActivationBreakdown last = stage_activations(on, 1);
  EXPECT_GT(last.mtp_bytes, last.output_bytes);  // a layer's activations and a head's
  EXPECT_GT(stage_memory(on, 1).peak_bytes, stage_memory(off, 1).peak_bytes);
  EXPECT_DOUBLE_EQ(stage_memory(on, 0).peak_bytes, stage_memory(off, 0).peak_bytes);
}

TEST(Mtp, AnalyticFollowsTheDes) {
  for (const char* layout : {"  dp: 16\n  tp: 1\n  ep: 8\n", "  dp: 4\n  tp: 2\n  pp: 2\n  ep: 4\n  sequence_parallel: true\n",
                             "  dp: 4\n  tp: 1\n  pp: 4\n  vp: 2\n  schedule: interleaved\n  ep: 4\n",
                             "  dp: 16\n  tp: 1\n  ep: 8\n  zero_stage: 3\n",
                             "  dp: 4\n  tp: 1\n  pp: 4\n  schedule: zb-h1\n  ep: 4\n"}) {
    const Experiment off = parse_experiment(mtp_yaml(layout, 0), "off.yaml");
    const Experiment on = parse_experiment(mtp_yaml(layout, 1), "on.yaml");
    const StepResult d_on = simulate_step_isolated(on), d_off = simulate_step_isolated(off);
    const StepResult a_on = simulate_step_analytic(on);
    EXPECT_GT(d_on.step_time_s, d_off.step_time_s) << layout;
    EXPECT_NEAR(a_on.step_time_s / d_on.step_time_s, 1.0, 0.10) << layout;
  }
}

TEST(Mtp, UnsupportedCombinationsAreInputErrors) {
  using test_files::input_problem;
  EXPECT_NE(input_problem(mtp_yaml("  dp: 8\n  tp: 1\n  cp: 2\n  ep: 8\n", 1)).find("with layout.cp=2"), std::string::npos);
  EXPECT_NE(input_problem(mtp_yaml("  dp: 16\n  tp: 1\n  ep: 8\n", -1)).find("model.mtp_layers=-1 must be >= 0"),
            std::string::npos);
  EXPECT_NE(input_problem(mtp_yaml("  dp: 16\n  tp: 1\n  ep: 8\n", 2) + "  overlap_moe_expert_parallel_comm: true\n")
                .find("at most one MTP layer"),
            std::string::npos);
  // dtsim verify does not execute MTP depths: refused by name.
  const Experiment e = parse_experiment(mtp_yaml("  dp: 16\n  tp: 1\n  ep: 8\n", 1), "mtp.yaml");
  try {
    verify::verify_experiment(e, {.steps = 1});
    ADD_FAILURE() << "verify ran an MTP model";
  } catch (const InputError& x) {
    EXPECT_NE(std::string(x.what()).find("model.mtp_layers"), std::string::npos) << x.what();
  }
}

}  // namespace
}  // namespace dtsim
