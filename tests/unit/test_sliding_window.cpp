// Sliding-window attention and attention sinks (model.attention; models/blocks/attention.*):
// the counted FLOPs of a windowed layer, FlashAttention's work inside the band, the per-layer
// pattern, the sink parameters, the engines on a GPT-OSS-style model, the DeepEP dispatcher
// on the same model, and the input errors.
#include <gtest/gtest.h>

#include <string>

#include "models/blocks/attention.hpp"
#include "models/blocks/layer.hpp"
#include "models/blocks/layer_kind.hpp"
#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/flops.hpp"
#include "sim/analytic_engine.hpp"
#include "sim/engine.hpp"
#include "tests/unit/input_problem.hpp"

namespace dtsim {
namespace {

// A GPT-OSS-shaped model (openai/gpt-oss-120b config.json: head_dim 64, 8 KV heads, window 128
// on even layers, sinks), shrunk to 8 layers and 16 experts.
std::string yaml(const std::string& attention, const std::string& extra_training = "", const std::string& layout = "",
                 bool flash = true) {
  return "model:\n  name: oss\n  layers: 8\n  hidden: 2880\n  heads: 64\n  kv_heads: 8\n  head_dim: 64\n"
         "  ffn_hidden: 2880\n  vocab: 201088\n  activation: swiglu\n  norm: rmsnorm\n  position: rope\n"
         "  max_position_embeddings: 131072\n  tied_embeddings: false\n" +
         attention +
         "  moe: {num_experts: 16, router_topk: 4, moe_ffn_hidden: 2880}\n"
         "cluster: {node: dgx-h100, nodes: 2}\n"
         "layout:\n" +
         "  tp: 1\n" + (layout.empty() ? std::string("  dp: 16\n  ep: 8\n  etp: 1\n  zero_stage: 1\n") : layout) +
         "training:\n  seq_len: 4096\n  global_batch: 64\n  micro_batch: 1\n  flash_attention: " +
         (flash ? "true" : "false") + "\n" +
         extra_training;
}

const std::string kWindowed = "  attention: {window: 128, window_pattern: [1, 0], sinks: true}\n";

TEST(SlidingWindow, CountedFlopsUseTheWindowInWindowedLayersOnly) {
  const Experiment full = parse_experiment(yaml(""), "a.yaml");
  const Experiment win = parse_experiment(yaml(kWindowed), "a.yaml");
  const double q = 64.0 * 64.0, S = 4096, tokens = 4096;
  const ForwardFlops f = layers_forward_flops(full.model, 1, 4096, 4096);
  const ForwardFlops w = layers_forward_flops(win.model, 1, 4096, 4096);
  EXPECT_DOUBLE_EQ(f.attention_scores, 8 * 2.0 * tokens * S * q);
  // 4 windowed layers count 128 keys per query, 4 full layers the whole sequence.
  EXPECT_DOUBLE_EQ(w.attention_scores, 4 * 2.0 * tokens * 128 * q + 4 * 2.0 * tokens * S * q);
  EXPECT_DOUBLE_EQ(w.attention_values, w.attention_scores);
  EXPECT_DOUBLE_EQ(w.qkv, f.qkv);  // projections unchanged
  EXPECT_LT(model_flops_per_step(win.model, 64, 4096), model_flops_per_step(full.model, 64, 4096));
}

TEST(SlidingWindow, FlashWorkInsideTheBand) {
  // 1 - (w - 1) / (2 S) of the counted S w, against the causal half.
  EXPECT_DOUBLE_EQ(blocks::window_work(128, 4096), (1.0 - 127.0 / 8192.0) / 0.5);
  EXPECT_DOUBLE_EQ(blocks::window_work(4096, 4096), 1.0);  // a window of the sequence is causal attention
  EXPECT_DOUBLE_EQ(blocks::window_work(0, 4096), 1.0);
}

TEST(SlidingWindow, SinksAddOneLogitPerHeadPerLayer) {
  const Experiment plain = parse_experiment(yaml("  attention: {window: 128, window_pattern: [1, 0]}\n"), "a.yaml");
  const Experiment sinks = parse_experiment(yaml(kWindowed), "a.yaml");
  EXPECT_DOUBLE_EQ(layer_parameters_per_tp_rank(sinks.model, 1) - layer_parameters_per_tp_rank(plain.model, 1), 64.0);
}

TEST(SlidingWindow, EnginesAgreeAndTheWindowIsFaster) {
  const Experiment full = parse_experiment(yaml(""), "a.yaml");
  const Experiment win = parse_experiment(yaml(kWindowed), "a.yaml");
  const StepResult des_full = simulate_step_isolated(full);
  const StepResult des_win = simulate_step_isolated(win);
  const StepResult ana_win = simulate_step_analytic(win);
  EXPECT_LT(des_win.step_time_s, des_full.step_time_s);
  EXPECT_NEAR(ana_win.step_time_s / des_win.step_time_s, 1.0, 0.10);
  // The window changes attention only: the MoE traffic is the same.
  EXPECT_DOUBLE_EQ(des_win.comm.at("EP").bytes, des_full.comm.at("EP").bytes);
}

TEST(SlidingWindow, DeepEpDispatcherSendsFewerBytesAcrossNodesThanAllToAll) {
  // EP16 over two DGX H100: the DeepEP dispatcher sends each token once per node reached.
  const std::string layout = "  dp: 16\n  ep: 16\n  etp: 1\n  zero_stage: 1\n";
  const Experiment a2a = parse_experiment(yaml(kWindowed, "", layout), "a.yaml");
  const Experiment deepep = parse_experiment(yaml(kWindowed, "  moe_token_dispatcher: deepep\n", layout), "a.yaml");
  const StepResult des_a2a = simulate_step_isolated(a2a);
  const StepResult des_deepep = simulate_step_isolated(deepep);
  const StepResult ana_deepep = simulate_step_analytic(deepep);
  EXPECT_LT(des_deepep.comm.at("EP").total_s, des_a2a.comm.at("EP").total_s);
  EXPECT_NEAR(ana_deepep.step_time_s / des_deepep.step_time_s, 1.0, 0.10);
}

// The closed-form count of layer kinds (no window, MoE by first_k_dense / layer_freq) is the
// per-layer loop's.
TEST(SlidingWindow, LayerKindCountsMatchThePerLayerKinds) {
  for (int64_t fk : {0, 1, 3})
    for (int64_t freq : {1, 2, 3})
      for (bool mla : {false, true}) {
        ModelSpec m;
        m.layers = 61;
        m.moe.num_experts = 8;
        m.moe.router_topk = 2;
        m.moe.moe_ffn_hidden = 64;
        m.moe.first_k_dense = fk;
        m.moe.layer_freq = freq;
        if (mla) m.mla.kv_lora_rank = 16;
        for (int64_t first : {0, 1, 2, 5, 30})
          for (int64_t count : {0, 1, 4, 7, 31}) {
            std::array<int64_t, blocks::kLayerKinds> loop{};
            for (int64_t i = first; i < first + count; ++i) ++loop[static_cast<size_t>(blocks::layer_kind(m, i))];
            EXPECT_EQ(blocks::layer_kind_counts(m, first, count), loop) << fk << " " << freq << " " << first << " " << count;
          }
      }
}

TEST(SlidingWindow, InputErrors) {
  auto problem = [](const std::string& text) { return test_files::input_problem(text); };
  EXPECT_NE(problem(yaml(kWindowed, "", "", false)).find("needs training.flash_attention"), std::string::npos);
  EXPECT_NE(problem(yaml(kWindowed, "", "  dp: 8\n  cp: 2\n  ep: 8\n  etp: 1\n")).find("context parallelism"),
            std::string::npos);
  EXPECT_NE(problem(yaml("  attention: {window: -1}\n")).find("must be positive"), std::string::npos);
}

}  // namespace
}  // namespace dtsim
