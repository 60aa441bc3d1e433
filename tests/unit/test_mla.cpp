// Multi-head latent attention (models/blocks/mla.hpp): DeepSeek-V3's parameters and FLOPs,
// the plan's MLA ops under tensor and sequence parallelism (the duplicated down projections,
// the one latent AllGather, the latent gradients' TP reduction), the attention kernel MLA
// times, its input errors, and the analytic engine against the DES on MLA layouts (issue 16).
#include <gtest/gtest.h>

#include <string>

#include "models/blocks/layer.hpp"
#include "models/blocks/mla.hpp"
#include "models/calibration/plan_kernels.hpp"
#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/flops.hpp"
#include "models/plan.hpp"
#include "sim/analytic_engine.hpp"
#include "sim/engine.hpp"
#include "tests/unit/input_problem.hpp"

namespace dtsim {
namespace {

// DeepSeek-V3 (arXiv 2412.19437 Sec 4.2 and the Hugging Face deepseek-ai/DeepSeek-V3
// config.json): 61 layers (first 3 dense), hidden 7168, 128 heads, MLA d_q 1536, d_c 512,
// d_n 128, d_r 64, d_v 128, 256 routed experts of 2048 + 1 shared, top-8 sigmoid router
// with expert bias and 8 groups / top-4 groups, dense FFN 18432, vocabulary 129280.
// `layers` shrinks it for plan tests.
std::string dsv3_yaml(const std::string& layout, int nodes = 2, int layers = 61, const std::string& mla_extra = "",
                      const std::string& model_extra = "", bool moe = true) {
  return "title: t\n"
         "model:\n  name: DeepSeek-V3\n  layers: " + std::to_string(layers) +
         "\n  hidden: 7168\n  heads: 128\n  ffn_hidden: 18432\n"
         "  activation: swiglu\n  vocab: 129280\n  tied_embeddings: false\n  norm: rmsnorm\n  position: rope\n" +
         model_extra +
         "  mla:\n    q_lora_rank: 1536\n    kv_lora_rank: 512\n    qk_nope_head_dim: 128\n    qk_rope_head_dim: 64\n"
         "    v_head_dim: 128\n" + mla_extra + (moe ? std::string(
         "  moe:\n    num_experts: 256\n    router_topk: 8\n    moe_ffn_hidden: 2048\n"
         "    shared_expert_ffn_hidden: 2048\n    first_k_dense: 3\n    router_score_function: sigmoid\n"
         "    router_enable_expert_bias: true\n    router_num_groups: 8\n    router_group_topk: 4\n") : std::string()) +
         "cluster:\n  node: dgx-h100\n  nodes: " + std::to_string(nodes) + "\nlayout:\n" + layout +
         "training:\n  seq_len: 4096\n  global_batch: 64\n  micro_batch: 1\n  dtype: bf16\n";
}

TEST(MlaModel, DeepSeekV3ParametersAndFlops) {
  const Experiment e = parse_experiment(dsv3_yaml("  dp: 16\n  tp: 1\n  ep: 16\n"), "d.yaml");
  const ModelSpec& m = e.model;
  const blocks::MlaBlock mla;
  const blocks::BlockParams p = mla.parameters(m);
  // Hand sum of the DeepSeek-V3 attention weights (mla.hpp): sharded q_up 1536 x 128 x 192,
  // kv_up 512 x 128 x 256, out_proj 128 x 128 x 7168; replicated q_down 7168 x 1536, kv_down
  // 7168 x 576, norms 1536 + 512.
  EXPECT_EQ(p.sharded_weights, 171966464.0);
  EXPECT_EQ(p.replicated_weights, 15140864.0);
  EXPECT_EQ(p.sharded_weights + p.replicated_weights, 187107328.0);
  // DeepSeek-V3 technical report (arXiv 2412.19437) abstract / Sec 4.2: 671B total
  // parameters, 37B activated per token (the MTP module, 14B, not included).
  EXPECT_NEAR(static_cast<double>(total_parameters(m, 4096)) / 671e9, 1.0, 0.005);
  EXPECT_NEAR(static_cast<double>(active_parameters(m, 4096)) / 37e9, 1.0, 0.03);
  // Forward FLOPs of one MLA layer for one token against s_kv keys.
  ForwardFlops f;
  mla.forward_flops(m, 1.0, 4096.0, f);
  EXPECT_EQ(f.qkv, 2.0 * (7168.0 * 1536 + 1536.0 * 128 * 192 + 7168.0 * 576 + 512.0 * 128 * 256));
  EXPECT_EQ(f.attention_scores, 2.0 * 4096 * 128 * 192);
  EXPECT_EQ(f.attention_values, 2.0 * 4096 * 128 * 128);
  EXPECT_EQ(f.out_proj, 2.0 * 128 * 128 * 7168);
  // Every layer is an MLA layer (kind bit 2), dense or MoE.
  EXPECT_EQ(blocks::layer_kind(m, 0), 4);
  EXPECT_EQ(blocks::layer_kind(m, 3), 5);
  const auto kinds = model_layer_kinds(m);
  EXPECT_EQ(kinds[4], 3);
  EXPECT_EQ(kinds[5], 58);
}

const Op* find_op(const StagePlan& st, const std::string& name, Phase ph, int layer) {
  for (const auto& op : st.ops)
    if (op.name == name && op.phase == ph && op.layer == layer && op.micro_batch == 0) return &op;
  return nullptr;
}

TEST(MlaPlan, DuplicatedDownProjectionsAndTheLatentGather) {
  const double tok = 4096;  // b s, micro-batch 1
  const double gathered = 1536 + 512 + 64;
  {
    // TP 2 with SP: the down projections run on the sequence shard, the latents are gathered.
    const Experiment e = parse_experiment(
        dsv3_yaml("  dp: 8\n  tp: 2\n  ep: 16\n  etp: 1\n  sequence_parallel: true\n", 2, 4), "sp.yaml");
    const StepPlan plan = build_step_plan(e);
    const StagePlan& st = plan.stages.front();
    const Op* q_down = find_op(st, "q_down", Phase::forward, 0);
    ASSERT_NE(q_down, nullptr);
    EXPECT_EQ(q_down->gemm.m, 2048);
    EXPECT_EQ(q_down->gemm.n, 1536);
    EXPECT_EQ(q_down->gemm.k, 7168);
    const Op* ag = find_op(st, "tp_allgather_latent", Phase::forward, 0);
    ASSERT_NE(ag, nullptr);
    EXPECT_EQ(ag->collective, Collective::AllGather);
    EXPECT_EQ(ag->size_bytes, 2.0 * tok * gathered);
    // No AllGather of the hidden state before the attention (only the MLP's).
    int hidden_gathers = 0;
    for (const auto& op : st.ops)
      if (op.layer == 0 && op.micro_batch == 0 && op.phase == Phase::forward && op.name == std::string("tp_allgather"))
        ++hidden_gathers;
    EXPECT_EQ(hidden_gathers, 1);
    const Op* q_up = find_op(st, "q_up", Phase::forward, 0);
    ASSERT_NE(q_up, nullptr);
    EXPECT_EQ(q_up->gemm.m, 4096);
    EXPECT_EQ(q_up->gemm.n, 64 * 192);
    // The latent gradients are reduce-scattered back to the sequence shards (width 2112).
    bool latent_rs = false;
    for (const auto& op : st.ops)
      if (op.layer == 0 && op.micro_batch == 0 && op.phase == Phase::backward &&
          op.collective == Collective::ReduceScatter && op.size_bytes == 2.0 * tok * gathered)
        latent_rs = true;
    EXPECT_TRUE(latent_rs);
  }
  {
    // TP 2 without SP (a dense MLA model: Megatron-Core requires SP for MoE with TP): every
    // TP rank runs the down projections on all tokens; nothing gathered.
    const Experiment e = parse_experiment(dsv3_yaml("  dp: 8\n  tp: 2\n", 2, 4, "", "", false), "nosp.yaml");
    const StepPlan plan = build_step_plan(e);
    const StagePlan& st = plan.stages.front();
    const Op* q_down = find_op(st, "q_down", Phase::forward, 0);
    ASSERT_NE(q_down, nullptr);
    EXPECT_EQ(q_down->gemm.m, 4096);
    EXPECT_EQ(find_op(st, "tp_allgather_latent", Phase::forward, 0), nullptr);
    bool latent_ar = false;
    for (const auto& op : st.ops)
      if (op.layer == 0 && op.micro_batch == 0 && op.phase == Phase::backward &&
          op.collective == Collective::AllReduce && op.size_bytes == 2.0 * tok * gathered)
        latent_ar = true;
    EXPECT_TRUE(latent_ar);
  }
}

TEST(MlaPlan, AttentionKernelHasTheQueryKeyHeadAndAllHeads) {
  const Experiment e = parse_experiment(
      dsv3_yaml("  dp: 8\n  tp: 2\n  ep: 16\n  etp: 1\n  sequence_parallel: true\n", 2, 4), "k.yaml");
  const StepPlan plan = build_step_plan(e);
  const Op* att = find_op(plan.stages.front(), "attention", Phase::forward, 0);
  ASSERT_NE(att, nullptr);
  const auto k = calib::kernel_for_op(*att, e);
  ASSERT_TRUE(k);
  EXPECT_EQ(k->spec.attention.head_dim, 192);
  EXPECT_EQ(k->spec.attention.heads, 64);
  EXPECT_EQ(k->spec.attention.kv_heads, 64);
  // Its FLOPs: Q K^T with the 192-wide head and softmax V with the 128-wide value head.
  EXPECT_EQ(att->flops, (2.0 * 4096 * 4096 * 64 * 192 + 2.0 * 4096 * 4096 * 64 * 128));
}

TEST(MlaInputs, ErrorsNameTheKeys) {
  auto error_of = [](const std::string& y) { return test_files::input_problem(y); };
  const std::string l = "  dp: 16\n  tp: 1\n  ep: 16\n";
  EXPECT_NE(error_of(dsv3_yaml(l, 2, 61, "    bogus: 1\n")).find("bogus"), std::string::npos);
  EXPECT_NE(error_of(dsv3_yaml(l, 2, 61, "", "  kv_heads: 8\n")).find("model.kv_heads=8 with model.mla"),
            std::string::npos);
  EXPECT_NE(error_of(dsv3_yaml(l, 2, 61, "", "  head_dim: 64\n")).find("model.head_dim with model.mla"),
            std::string::npos);
  std::string no_v = dsv3_yaml(l);
  no_v.replace(no_v.find("    v_head_dim: 128\n"), 20, "");
  EXPECT_NE(error_of(no_v).find("model.mla.v_head_dim=0 must be positive"), std::string::npos);
  std::string gelu = dsv3_yaml(l);
  gelu.replace(gelu.find("activation: swiglu"), 18, "activation: gelu");
  EXPECT_NE(error_of(gelu).find("model.mla with activation gelu"), std::string::npos);
}

TEST(MlaEngines, AnalyticWithinTenPercentOfTheDes) {
  const char* layouts[] = {
      "  dp: 16\n  tp: 1\n  ep: 16\n  zero_stage: 1\n",
      "  dp: 4\n  tp: 2\n  pp: 2\n  ep: 8\n  etp: 1\n  sequence_parallel: true\n",
      "  dp: 4\n  tp: 2\n  pp: 2\n  ep: 4\n  etp: 2\n  sequence_parallel: true\n",
      "  dp: 8\n  tp: 1\n  pp: 2\n  ep: 8\n  recompute: full\n",
  };
  for (const char* l : layouts) {
    const Experiment e = parse_experiment(dsv3_yaml(l, 2, 8), "a.yaml");
    const StepResult des = simulate_step_isolated(e);
    const StepResult ana = simulate_step_analytic(e);
    EXPECT_NEAR(ana.step_time_s / des.step_time_s, 1.0, 0.10) << l;
    EXPECT_GT(des.comm.at("EP").total_s, 0.0) << l;
  }
}

}  // namespace
}  // namespace dtsim
