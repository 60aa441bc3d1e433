// hf_config for the GPT-OSS and Llama 4 families (models/hf_config_read.cpp read_gpt_oss,
// read_llama4; models/hf_config_keys.cpp): the published gpt-oss-20b config.json, a
// gpt-oss-120b file against the shipped YAML experiment, Llama 4 Scout / Maverick files laid
// out as Llama4Config (text_config inside), chunked attention's work, and the input errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "models/blocks/attention.hpp"
#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/flops.hpp"
#include "sim/analytic_engine.hpp"
#include "tests/unit/temp_dir.hpp"
#include "tests/unit/input_problem.hpp"

namespace dtsim {
namespace {

namespace fs = std::filesystem;
using test_files::TempDir;

const fs::path kSource = fs::path(DTSIM_SOURCE_DIR);

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One DGX H100, EP8 DP8, sequence `seq`.
std::string yaml(const std::string& model_lines, int seq = 4096) {
  return "model:\n" + model_lines +
         "cluster: {node: dgx-h100, nodes: 1}\n"
         "layout: {dp: 8, tp: 1, ep: 8, etp: 1, zero_stage: 1}\n"
         "training: {seq_len: " + std::to_string(seq) + ", global_batch: 8, micro_batch: 1, flash_attention: true}\n";
}

std::string problem(const std::string& text, const std::string& dir) { return test_files::input_problem(text, dir); }

TEST(HfGptOss, PublishedTwentyBillionConfigReads) {
  const Experiment e = parse_experiment(yaml("  hf_config: gpt-oss-20b.json\n"), "exp.yaml", {},
                                        (kSource / "tests/data/hf_configs").string());
  const ModelSpec& m = e.model;
  EXPECT_EQ(m.layers, 24);
  EXPECT_EQ(m.hidden, 2880);
  EXPECT_EQ(m.heads, 64);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_EQ(m.head_dim(), 64);  // head_dim 64, not 2880 / 64
  EXPECT_EQ(m.vocab, 201088);
  EXPECT_FALSE(m.tied_embeddings);
  EXPECT_EQ(m.activation, Activation::swiglu);
  EXPECT_EQ(m.moe.num_experts, 32);
  EXPECT_EQ(m.moe.router_topk, 4);
  EXPECT_EQ(m.moe.moe_ffn_hidden, 2880);
  EXPECT_EQ(m.moe.shared_expert_ffn_hidden, 0);
  EXPECT_EQ(m.moe.router_score, RouterScore::softmax);
  for (int64_t i = 0; i < m.layers; ++i) EXPECT_TRUE(m.moe.is_moe_layer(i)) << i;
  // layer_types: even layers slide over 128 tokens, odd layers attend in full; sinks everywhere.
  EXPECT_EQ(m.attention.window, 128);
  EXPECT_FALSE(m.attention.chunked);
  EXPECT_TRUE(m.attention.sinks);
  for (int64_t i = 0; i < m.layers; ++i) EXPECT_EQ(m.attention.windowed(i), i % 2 == 0) << i;
}

TEST(HfGptOss, OneHundredTwentyBillionFileGivesTheShippedExperimentsStep) {
  // gpt-oss-120b's config.json differs from gpt-oss-20b's in the layer count (36), the expert
  // count (128) and layer_types' length (OpenAI model card Table 1; transformers GptOssConfig
  // defaults are the 120B model's).
  nlohmann::json j = nlohmann::json::parse(read_text(kSource / "tests/data/hf_configs/gpt-oss-20b.json"));
  j["num_hidden_layers"] = 36;
  j["num_local_experts"] = 128;
  j["layer_types"] = nlohmann::json::array();
  for (int i = 0; i < 36; ++i) j["layer_types"].push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
  TempDir d;
  d.write("gpt-oss-120b.json", j.dump());
  const fs::path shipped_path = kSource / "experiments/moe/gpt-oss-120b-h100.yaml";
  const std::string shipped_text = read_text(shipped_path);
  const Experiment shipped = parse_experiment(shipped_text, shipped_path.string());
  // The same file with its model section replaced by the config.json.
  const size_t from = shipped_text.find("\nmodel:\n"), to = shipped_text.find("\ncluster:\n");
  ASSERT_NE(from, std::string::npos);
  ASSERT_NE(to, std::string::npos);
  const std::string text = shipped_text.substr(0, from) +
                           "\nmodel:\n  name: GPT-OSS-120B\n  hf_config: gpt-oss-120b.json\n"
                           "  moe: {load_balancing: aux_loss}" +
                           shipped_text.substr(to);
  const Experiment hf = parse_experiment(text, "exp.yaml", {}, d.path().string());
  EXPECT_EQ(hf.model.layers, shipped.model.layers);
  EXPECT_EQ(hf.model.moe.num_experts, shipped.model.moe.num_experts);
  EXPECT_EQ(hf.model.head_dim(), shipped.model.head_dim());
  EXPECT_EQ(hf.model.attention.sinks, shipped.model.attention.sinks);
  for (int64_t i = 0; i < hf.model.layers; ++i)
    EXPECT_EQ(hf.model.attention.windowed(i), shipped.model.attention.windowed(i)) << i;
  EXPECT_DOUBLE_EQ(model_flops_per_step(hf.model, 256, 4096), model_flops_per_step(shipped.model, 256, 4096));
  EXPECT_NEAR(simulate_step_analytic(hf).step_time_s / simulate_step_analytic(shipped).step_time_s, 1.0, 1e-12);
}

// Llama-4-Scout-17B-16E laid out as its published file is (Llama4Config: the text decoder in
// text_config, vision_config beside it); the values are transformers' Llama4TextConfig
// defaults, which document that checkpoint (configuration_llama4.py), with no_rope_layers
// spelled out as the published file does.
nlohmann::json scout() {
  nlohmann::json rope = nlohmann::json::array();
  for (int i = 0; i < 48; ++i) rope.push_back((i + 1) % 4 != 0 ? 1 : 0);
  return {{"architectures", {"Llama4ForConditionalGeneration"}},
          {"model_type", "llama4"},
          {"boi_token_index", 200080},
          {"eoi_token_index", 200081},
          {"image_token_index", 200092},
          {"tie_word_embeddings", false},
          {"torch_dtype", "bfloat16"},
          {"transformers_version", "4.51.0"},
          {"text_config",
           {{"model_type", "llama4_text"}, {"attention_bias", false}, {"attention_chunk_size", 8192},
            {"attention_dropout", 0.0}, {"attn_scale", 0.1}, {"attn_temperature_tuning", true},
            {"floor_scale", 8192}, {"head_dim", 128}, {"hidden_act", "silu"}, {"hidden_size", 5120},
            {"interleave_moe_layer_step", 1}, {"intermediate_size", 8192}, {"intermediate_size_mlp", 16384},
            {"max_position_embeddings", 10485760}, {"no_rope_layers", rope}, {"num_attention_heads", 40},
            {"num_experts_per_tok", 1}, {"num_hidden_layers", 48}, {"num_key_value_heads", 8},
            {"num_local_experts", 16}, {"output_router_logits", false}, {"rms_norm_eps", 1e-5},
            {"rope_scaling", {{"factor", 16.0}, {"rope_type", "llama3"}}}, {"rope_theta", 500000.0},
            {"router_aux_loss_coef", 0.001}, {"router_jitter_noise", 0.0}, {"tie_word_embeddings", false},
            {"use_qk_norm", true}, {"vocab_size", 202048}}},
          {"vision_config", {{"model_type", "llama4_vision_model"}, {"hidden_size", 1408}, {"num_hidden_layers", 34}}}};
}

TEST(HfLlama4, ScoutTextDecoderReads) {
  TempDir d;
  d.write("scout.json", scout().dump());
  const Experiment e = parse_experiment(yaml("  hf_config: scout.json\n", 8192), "exp.yaml", {}, d.path().string());
  const ModelSpec& m = e.model;
  EXPECT_EQ(m.name, "scout (text_config)");  // only the text decoder is modelled
  EXPECT_EQ(m.layers, 48);
  EXPECT_EQ(m.hidden, 5120);
  EXPECT_EQ(m.heads, 40);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_EQ(m.head_dim(), 128);
  EXPECT_EQ(m.ffn_hidden, 16384);  // intermediate_size_mlp: the dense layers' MLP
  EXPECT_EQ(m.vocab, 202048);
  EXPECT_EQ(m.moe.num_experts, 16);
  EXPECT_EQ(m.moe.router_topk, 1);
  EXPECT_EQ(m.moe.moe_ffn_hidden, 8192);
  EXPECT_EQ(m.moe.shared_expert_ffn_hidden, 8192);
  EXPECT_EQ(m.moe.router_score, RouterScore::sigmoid);
  for (int64_t i = 0; i < m.layers; ++i) EXPECT_TRUE(m.moe.is_moe_layer(i)) << i;
  // seq_len 8192 = the chunk: every layer attends to its whole causal context.
  EXPECT_EQ(m.attention.window, 0);
  // Longer sequences: three layers of four (the RoPE layers) attend within 8192-token chunks.
  const Experiment l = parse_experiment(yaml("  hf_config: scout.json\n", 16384), "exp.yaml", {}, d.path().string());
  EXPECT_EQ(l.model.attention.window, 8192);
  EXPECT_TRUE(l.model.attention.chunked);
  for (int64_t i = 0; i < 48; ++i) EXPECT_EQ(l.model.attention.windowed(i), (i + 1) % 4 != 0) << i;
  // Chunked layers count 8192 keys per query: fewer FLOPs than full attention over 16384
  // (attention_chunk_size null: no chunks).
  nlohmann::json full = scout();
  full["text_config"]["attention_chunk_size"] = nullptr;
  d.write("full.json", full.dump());
  const Experiment f = parse_experiment(yaml("  hf_config: full.json\n", 16384), "exp.yaml", {}, d.path().string());
  EXPECT_EQ(f.model.attention.window, 0);
  EXPECT_LT(model_flops_per_step(l.model, 8, 16384), model_flops_per_step(f.model, 8, 16384));
}

TEST(HfLlama4, MaverickInterleavesDenseAndMoeLayers) {
  nlohmann::json j = scout();
  j["text_config"]["num_local_experts"] = 128;
  j["text_config"]["interleave_moe_layer_step"] = 2;
  TempDir d;
  d.write("maverick.json", j.dump());
  const Experiment e = parse_experiment(yaml("  hf_config: maverick.json\n", 8192), "exp.yaml", {}, d.path().string());
  EXPECT_EQ(e.model.moe.num_experts, 128);
  // moe_layers default: range(step - 1, layers, step) = the odd layers.
  for (int64_t i = 0; i < 48; ++i) EXPECT_EQ(e.model.moe.is_moe_layer(i), i % 2 == 1) << i;
  // An explicit moe_layers list wins over the step.
  j["text_config"]["moe_layers"] = {0, 47};
  d.write("explicit.json", j.dump());
  const Experiment x = parse_experiment(yaml("  hf_config: explicit.json\n", 8192), "exp.yaml", {}, d.path().string());
  for (int64_t i = 0; i < 48; ++i) EXPECT_EQ(x.model.moe.is_moe_layer(i), i == 0 || i == 47) << i;
}

TEST(HfLlama4, ChunkedWorkIsCausalWithinEachChunk) {
  // Two full chunks of 8192 over 16384: 2 x 8192 x 8193 / 2 pairs of the counted 16384 x 8192.
  EXPECT_DOUBLE_EQ(blocks::window_work(8192, 16384, true), (8193.0 / 16384.0) / 0.5);
  // Chunks of 3 over 7 tokens: 3 + 3 + 1 tokens, 6 + 6 + 1 = 13 pairs of the counted 21.
  EXPECT_DOUBLE_EQ(blocks::window_work(3, 7, true), (13.0 / 21.0) / 0.5);
  EXPECT_DOUBLE_EQ(blocks::window_work(8192, 8192, true), 1.0);
  // A chunk does less work than a window of the same length (no keys from the chunk before).
  EXPECT_LT(blocks::window_work(128, 4096, true), blocks::window_work(128, 4096, false));
}

TEST(HfGptOssLlama4, InputErrors) {
  TempDir d;
  nlohmann::json j = nlohmann::json::parse(read_text(kSource / "tests/data/hf_configs/gpt-oss-20b.json"));
  j["layer_types"][3] = "linear_attention";
  d.write("linear.json", j.dump());
  EXPECT_NE(problem(yaml("  hf_config: linear.json\n"), d.path().string()).find("\"linear_attention\""),
            std::string::npos);
  j["layer_types"].erase(3);
  d.write("short.json", j.dump());
  EXPECT_NE(problem(yaml("  hf_config: short.json\n"), d.path().string()).find("has 23 entries"), std::string::npos);
  j = nlohmann::json::parse(read_text(kSource / "tests/data/hf_configs/gpt-oss-20b.json"));
  j["experts_per_token"] = 2;
  d.write("topk.json", j.dump());
  EXPECT_NE(problem(yaml("  hf_config: topk.json\n"), d.path().string()).find("name the same top-k"),
            std::string::npos);
  // A YAML layer count that layer_types does not cover.
  EXPECT_NE(problem(yaml("  hf_config: " + (kSource / "tests/data/hf_configs/gpt-oss-20b.json").string() +
                         "\n  layers: 12\n"),
                    d.path().string())
                .find("needs one per layer"),
            std::string::npos);
  // Llama 4 without its text decoder, and an unknown key inside text_config.
  nlohmann::json s = scout();
  s.erase("text_config");
  d.write("notext.json", s.dump());
  EXPECT_NE(problem(yaml("  hf_config: notext.json\n"), d.path().string()).find("needs \"text_config\""),
            std::string::npos);
  s = scout();
  s["text_config"]["mystery"] = 1;
  d.write("mystery.json", s.dump());
  EXPECT_NE(problem(yaml("  hf_config: mystery.json\n"), d.path().string()).find("text_config: \"mystery\""),
            std::string::npos);
  s = scout();
  s["text_config"]["moe_layers"] = {48};
  d.write("range.json", s.dump());
  EXPECT_NE(problem(yaml("  hf_config: range.json\n"), d.path().string()).find("not a layer index"),
            std::string::npos);
  // chunked without a window.
  EXPECT_NE(problem(yaml("  hf_config: " + (kSource / "tests/data/hf_configs/gpt-oss-20b.json").string() +
                         "\n  attention: {chunked: true}\n", 128),
                    d.path().string())
                .find("needs model.attention.window"),
            std::string::npos);
}

}  // namespace
}  // namespace dtsim
