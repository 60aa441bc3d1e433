// FLOP and parameter counts against the published closed forms.
// Sources (figures carried here, the product never reads ../shared):
//  - Narayanan et al. 2021 (arXiv 2104.04473) Eq. 3: 96 B s l h^2 (1 + s/(6h) + V/(16lh)),
//    full recompute; Sec 5.1 parameter count 12 l h^2 (1 + 13/(12h) + (V+s)/(12lh)).
//  - Korthikanti et al. 2022 (arXiv 2205.05198) Appendix A Eq. 7 (model FLOPs)
//    72 B L s h^2 (1 + s/(6h) + V/(12hL)) and Eq. 8 (selective, as printed)
//    72 B L s h^2 (1 + s/(3h) + V/(12hL)).
//  - GPT-3 175B: L=96, h=12288, a=96, V=51200 (padded), s=2048, B=64 (Korthikanti Table 3).
//  - Llama-2 7B: 32 layers, h=4096, 32 heads, ffn 11008, V=32000, untied, SwiGLU, RMSNorm,
//    RoPE; published count 6,738,415,616 parameters (Hugging Face meta-llama/Llama-2-7b-hf).
#include <gtest/gtest.h>

#include <cmath>

#include "models/errors.hpp"
#include "models/flops.hpp"

namespace dtsim {
namespace {

ModelSpec gpt(int64_t L, int64_t h, int64_t a, int64_t V = 51200) {
  ModelSpec m;
  m.name = "gpt";
  m.layers = L;
  m.hidden = h;
  m.heads = a;
  m.kv_heads = a;
  m.ffn_hidden = 4 * h;
  m.vocab = V;
  m.activation = Activation::gelu;
  m.norm = Norm::layernorm;
  m.position = Position::learned;
  m.tied_embeddings = true;
  return m;
}

ModelSpec gpt3_175b() { return gpt(96, 12288, 96); }

ModelSpec llama2_7b() {
  ModelSpec m;
  m.name = "llama-2-7b";
  m.layers = 32;
  m.hidden = 4096;
  m.heads = 32;
  m.kv_heads = 32;
  m.ffn_hidden = 11008;
  m.vocab = 32000;
  m.activation = Activation::swiglu;
  m.norm = Norm::rmsnorm;
  m.position = Position::rope;
  m.tied_embeddings = false;
  return m;
}

double rel(double a, double b) { return std::fabs(a - b) / std::fabs(b); }

struct GptCase {
  int64_t L, h, a, B, s, V;
};
const GptCase kGptCases[] = {
    {96, 12288, 96, 64, 2048, 51200},   // GPT-3 175B, Korthikanti Table 3
    {48, 6144, 64, 4, 2048, 51200},     // 22B, Korthikanti Table 3
    {105, 20480, 128, 280, 2048, 51200},// 530B
    {128, 25600, 160, 512, 2048, 51200},// 1T
    {24, 1024, 16, 8, 1024, 50257},     // small, odd vocab
};

TEST(FlopsLayer, GptForwardIs24bsh2Plus4bs2h) {
  const ModelSpec m = gpt(1, 1024, 16);
  const ForwardFlops f = layer_forward_flops(m, 2, 512, 512);
  const double b = 2, s = 512, h = 1024;
  EXPECT_DOUBLE_EQ(f.qkv, 6 * b * s * h * h);
  EXPECT_DOUBLE_EQ(f.attention_scores, 2 * b * s * s * h);
  EXPECT_DOUBLE_EQ(f.attention_values, 2 * b * s * s * h);
  EXPECT_DOUBLE_EQ(f.out_proj, 2 * b * s * h * h);
  EXPECT_DOUBLE_EQ(f.mlp_up, 8 * b * s * h * h);
  EXPECT_DOUBLE_EQ(f.mlp_gate, 0.0);
  EXPECT_DOUBLE_EQ(f.mlp_down, 8 * b * s * h * h);
  EXPECT_DOUBLE_EQ(f.total(), 24 * b * s * h * h + 4 * b * s * s * h);
}

TEST(FlopsLayer, GqaAndSwiGluWidths) {
  ModelSpec m = llama2_7b();
  m.kv_heads = 8;  // GQA: K, V are 8 * 128 = 1024 wide
  const ForwardFlops f = layer_forward_flops(m, 1, 100, 100);
  EXPECT_DOUBLE_EQ(f.qkv, 2.0 * 100 * 4096 * (4096 + 2 * 1024));
  EXPECT_DOUBLE_EQ(f.mlp_gate, 2.0 * 100 * 4096 * 11008);
  EXPECT_DOUBLE_EQ(f.mlp_gate, f.mlp_up);
  // CP: 100 local queries against 400 keys.
  const ForwardFlops c = layer_forward_flops(m, 1, 100, 400);
  EXPECT_DOUBLE_EQ(c.attention_scores, 4.0 * f.attention_scores);
  EXPECT_DOUBLE_EQ(c.qkv, f.qkv);
}

TEST(FlopsStep, ModelFlopsEqualKorthikantiEq7) {
  for (const auto& c : kGptCases) {
    const ModelSpec m = gpt(c.L, c.h, c.a, c.V);
    const double ours = 3.0 * (double(c.L) * layer_forward_flops(m, c.B, c.s, c.s).total() +
                               lm_head_forward_flops(m, c.B, c.s));
    EXPECT_LT(rel(ours, korthikanti_eq7_model_flops(c.B, c.s, c.L, c.h, c.V)), 1e-12) << c.L;
    EXPECT_LT(rel(model_flops_per_step(m, c.B, c.s), korthikanti_eq7_model_flops(c.B, c.s, c.L, c.h, c.V)),
              1e-12);
    EXPECT_DOUBLE_EQ(hardware_flops_per_step(m, c.B, c.s, Recompute::none), model_flops_per_step(m, c.B, c.s));
  }
}

TEST(FlopsStep, FullRecomputeEqualsNarayananEq3) {
  for (const auto& c : kGptCases) {
    const ModelSpec m = gpt(c.L, c.h, c.a, c.V);
    const double ours = 4.0 * double(c.L) * layer_forward_flops(m, c.B, c.s, c.s).total() +
                        3.0 * lm_head_forward_flops(m, c.B, c.s);
    const double eq3 = narayanan_eq3_flops(c.B, c.s, c.L, c.h, c.V);
    EXPECT_LT(rel(ours, eq3), 1e-12);
    EXPECT_LT(rel(hardware_flops_per_step(m, c.B, c.s, Recompute::full), eq3), 1e-12);
  }
}

TEST(FlopsStep, SelectiveRecomputeVersusKorthikantiEq8) {
  // We add one forward of the attention GEMMs (4 B s^2 h per layer). Eq. 8 as printed adds
  // 12 B L s^2 h (s/(3h) instead of s/(6h)), i.e. 8 B L s^2 h more than one forward: the
  // difference is pinned exactly so that any change to either side is noticed.
  for (const auto& c : kGptCases) {
    const ModelSpec m = gpt(c.L, c.h, c.a, c.V);
    const double B = double(c.B), s = double(c.s), L = double(c.L), h = double(c.h);
    const double ours = hardware_flops_per_step(m, c.B, c.s, Recompute::selective);
    const double expect = model_flops_per_step(m, c.B, c.s) + L * 4.0 * B * s * s * h;
    EXPECT_LT(rel(ours, expect), 1e-12);
    const double eq8 = korthikanti_eq8_hardware_flops_selective(c.B, c.s, c.L, c.h, c.V);
    EXPECT_LT(rel(eq8 - ours, 8.0 * B * L * s * s * h), 1e-9);
    // Eq. 8 itself: model FLOPs + 12 B L s^2 h (so Eq.8/Eq.7 ~ 1 + s/(6h), Korthikanti Eq. 9).
    EXPECT_LT(rel(eq8, korthikanti_eq7_model_flops(c.B, c.s, c.L, c.h, c.V) + 12.0 * B * L * s * s * h), 1e-12);
  }
}

TEST(FlopsStep, Gpt3WorkedValue) {
  // GPT-3 175B, B=64, s=2048: 3 (L (24 B s h^2 + 4 B s^2 h) + 2 B s h V) computed in exact
  // integer arithmetic = 141,091,531,099,471,872 FLOPs (~141.09 PFLOP) per step.
  const ModelSpec m = gpt3_175b();
  const double expected = 141091531099471872.0;
  EXPECT_LT(rel(model_flops_per_step(m, 64, 2048), expected), 1e-12);
  EXPECT_LT(rel(korthikanti_eq7_model_flops(64, 2048, 96, 12288, 51200), expected), 1e-12);
  // ~ 6 N tokens with N = 174.6e9: 6 * 174.6e9 * 131072 = 1.373e17, attention and LM head
  // account for the remaining ~2.7 %.
  const double six_n_d = 6.0 * double(total_parameters(m, 2048)) * 64.0 * 2048.0;
  EXPECT_GT(model_flops_per_step(m, 64, 2048), six_n_d);
  EXPECT_LT(model_flops_per_step(m, 64, 2048), 1.04 * six_n_d);
}

TEST(FlopsParams, Gpt3MatchesNarayananSec51) {
  const ModelSpec m = gpt3_175b();
  const int64_t L = 96, h = 12288, V = 51200, s = 2048;
  EXPECT_EQ(layer_parameters(m), 12 * h * h + 13 * h);
  // 12 l h^2 (1 + 13/(12h) + (V+s)/(12lh)) = 12 l h^2 + 13 l h + (V + s) h, exactly
  // 174,615,822,336; our count adds the final layernorm (2h) the formula leaves out.
  const int64_t narayanan = 12 * L * h * h + 13 * L * h + (V + s) * h;
  EXPECT_EQ(narayanan, 174615822336);
  EXPECT_EQ(total_parameters(m, s), narayanan + 2 * h);
  EXPECT_NEAR(double(total_parameters(m, s)) / 1e9, 174.6, 0.05);
  EXPECT_EQ(embedding_parameters(m, s), (V + s) * h);
  EXPECT_EQ(lm_head_parameters(m), 0);
}

TEST(FlopsParams, Llama2_7bExactPublishedCount) {
  const ModelSpec m = llama2_7b();
  EXPECT_EQ(layer_parameters(m), 4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096);
  EXPECT_EQ(layer_parameters(m), 202383360);
  EXPECT_EQ(embedding_parameters(m, 4096), 32000 * 4096);
  EXPECT_EQ(lm_head_parameters(m), 32000 * 4096);
  EXPECT_EQ(total_parameters(m, 4096), 6738415616);
}

TEST(FlopsParams, BiasAndNormRule) {
  ModelSpec m = gpt(1, 64, 4);
  EXPECT_TRUE(has_linear_biases(m));
  EXPECT_EQ(norm_parameters(m), 128);
  m.norm = Norm::rmsnorm;
  EXPECT_EQ(norm_parameters(m), 64);
  m.activation = Activation::swiglu;
  EXPECT_FALSE(has_linear_biases(m));
  m.max_position_embeddings = 100;
  EXPECT_EQ(embedding_parameters(m, 2048), m.vocab * 64 + 100 * 64);
}

TEST(FlopsParams, StageParametersSumToModel) {
  // PP x TP shards of Llama-2 7B: summing every stage over TP gives the model, because
  // Llama has no replicated biases and the norms are tiny but replicated (counted tp times).
  const ModelSpec m = llama2_7b();
  Layout l;
  l.tp = 4;
  l.pp = 4;
  double sum = 0;
  for (int64_t st = 0; st < l.pp; ++st) sum += stage_parameters_per_rank(m, l, 4096, st) * double(l.tp);
  const double replicated_norm_copies = double(l.tp - 1) * double(2 * 32 * 4096 + 4096);
  EXPECT_DOUBLE_EQ(sum, double(total_parameters(m, 4096)) + replicated_norm_copies);
  // Middle stage: 8 layers only.
  EXPECT_DOUBLE_EQ(stage_parameters_per_rank(m, l, 4096, 1), 8.0 * layer_parameters_per_tp_rank(m, 4));
  // First stage: + V h / t; last stage: + final norm + V h / t.
  EXPECT_DOUBLE_EQ(stage_parameters_per_rank(m, l, 4096, 0) - stage_parameters_per_rank(m, l, 4096, 1),
                   32000.0 * 4096 / 4);
  EXPECT_DOUBLE_EQ(stage_parameters_per_rank(m, l, 4096, 3) - stage_parameters_per_rank(m, l, 4096, 1),
                   32000.0 * 4096 / 4 + 4096);
}

TEST(FlopsParams, TiedEmbeddingCopyOnLastStage) {
  const ModelSpec m = gpt3_175b();
  Layout l;
  l.tp = 8;
  l.pp = 8;
  const double mid = stage_parameters_per_rank(m, l, 2048, 3);
  // Megatron: with pp > 1 the last stage keeps its own copy of the tied word embedding.
  EXPECT_DOUBLE_EQ(stage_parameters_per_rank(m, l, 2048, 7) - mid, 51200.0 * 12288 / 8 + 2 * 12288);
  // First stage: vocab-parallel word embedding + replicated learned positions.
  EXPECT_DOUBLE_EQ(stage_parameters_per_rank(m, l, 2048, 0) - mid, 51200.0 * 12288 / 8 + 2048.0 * 12288);
  // pp == 1, tp == 1: exactly the model (tied embedding counted once).
  Layout one;
  EXPECT_DOUBLE_EQ(stage_parameters_per_rank(m, one, 2048, 0), double(total_parameters(m, 2048)));
  // Per TP rank of a GPT layer: 12h^2/t + column biases 7h/t (QKV 3h, MLP up 4h) + replicated 2h biases + 4h norms.
  const double h = 12288;
  EXPECT_DOUBLE_EQ(layer_parameters_per_tp_rank(m, 8), 12 * h * h / 8 + 7 * h / 8 + 6 * h);
}

TEST(FlopsStages, UnevenStagesFollowLlama3) {
  // Llama 3 405B: 126 layers on PP16 -> the first and last stages hold 7, the others 8
  // (Dubey et al. 2024, Sec 3.3.2).
  ModelSpec m = gpt3_175b();
  m.layers = 126;
  Layout l;
  l.pp = 16;
  int64_t total = 0;
  for (int64_t s = 0; s < 16; ++s) {
    const int64_t n = stage_layer_count(m, l, s);
    EXPECT_EQ(n, (s == 0 || s == 15) ? 7 : 8) << s;
    EXPECT_EQ(stage_first_layer(m, l, s), total);
    total += n;
  }
  EXPECT_EQ(total, 126);
  // Three missing layers: stages 0, 15 and 1 lose one each.
  m.layers = 125;
  EXPECT_EQ(stage_layer_count(m, l, 1), 7);
  EXPECT_EQ(stage_layer_count(m, l, 14), 8);
  l.pp = 8;
  m.layers = 96;
  for (int64_t s = 0; s < 8; ++s) EXPECT_EQ(stage_layer_count(m, l, s), 12);
}

TEST(FlopsErrors, ImpossibleInputsThrow) {
  const ModelSpec m = gpt3_175b();
  Layout l;
  l.pp = 97;  // more stages than layers
  EXPECT_THROW(stage_parameters_per_rank(m, l, 2048, 0), InputError);
  l.pp = 8;
  EXPECT_THROW(stage_parameters_per_rank(m, l, 2048, 8), InputError);
  EXPECT_THROW(layer_forward_flops(m, -1, 10, 10), InputError);
  ModelSpec bad = m;
  bad.heads = 0;
  EXPECT_THROW(layer_parameters(bad), InputError);
}

}  // namespace
}  // namespace dtsim
