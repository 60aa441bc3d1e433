// dtsim verify on multi-head latent attention (models/verify/ops_mla.cpp): the shrunk MLA
// model, its reference gradient against finite differences, every rule on DeepSeek-like
// layouts (tp 1, tp 2 with and without sequence parallelism, q_lora_rank 0, no rotary part,
// CP, PP with full recompute, MoE with EP), and the mla-down-grad-unreduced injection.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/verify/tiny_model.hpp"
#include "models/verify/verify.hpp"
#include "tests/unit/verify_describe.hpp"

namespace dtsim::verify {
namespace {

// A DeepSeek-like model (MLA with a q latent and a rotary part, routed experts with a shared
// one, a dense first layer); each test sets its layout. dense_mla() drops the experts.
const char* kMla = R"(title: verify mla test
model: {name: mla, layers: 8, hidden: 1024, heads: 8, kv_heads: 8, ffn_hidden: 2048, vocab: 4096,
        activation: swiglu, norm: rmsnorm, position: rope, tied_embeddings: false,
        mla: {q_lora_rank: 384, kv_lora_rank: 128, qk_nope_head_dim: 64, qk_rope_head_dim: 32, v_head_dim: 64},
        moe: {num_experts: 4, router_topk: 2, moe_ffn_hidden: 512, shared_expert_ffn_hidden: 512, first_k_dense: 1}}
cluster: {node: dgx-h100, nodes: 1}
layout: {dp: 8, tp: 1}
training: {seq_len: 1024, global_batch: 16, micro_batch: 1}
)";

struct MlaCase {
  const char* name;
  int64_t dp = 1, tp = 1, cp = 1, pp = 1, ep = 1;
  bool sp = false;
  int64_t q_lora = 384;  // 0: the query projected directly
  int64_t rope = 32;     // qk_rope_head_dim
  Recompute recompute = Recompute::none;
  int zero = 0;
  bool dense = false;  // no MoE
};

Experiment make(const MlaCase& c) {
  Experiment e = parse_experiment(kMla, "verify-mla-test.yaml");
  e.title = c.name;
  Layout& l = e.layout;
  l.dp = c.dp;
  l.tp = c.tp;
  l.cp = c.cp;
  l.pp = c.pp;
  l.ep = c.ep;
  l.sequence_parallel = c.sp;
  l.recompute = c.recompute;
  l.zero_stage = c.zero;
  e.model.mla.q_lora_rank = c.q_lora;
  e.model.mla.qk_rope_head_dim = c.rope;
  if (c.dense) e.model.moe = MoeSpec{};
  e.training.micro_batch = 1;
  e.training.global_batch = 2 * c.dp;
  e.cluster.nodes = 1;
  e.cluster.gpus_per_node = c.dp * c.tp * c.cp * c.pp;
  e.cluster.nics_per_node = 0;
  validate_experiment(e);
  return e;
}

using test_text::describe;

VerifyOptions opts(Injection inj = Injection::none, int steps = 2) {
  VerifyOptions o;
  o.steps = steps;
  o.inject = inj;
  o.threads = 1;
  return o;
}

TEST(VerifyMlaShrink, KeepsTheLatentsAndTheRotaryPart) {
  const Experiment s = shrink_experiment(make({.name = "shrink", .dp = 2, .tp = 2, .sp = true}));
  const MlaSpec& a = s.model.mla;
  EXPECT_TRUE(a.enabled());
  EXPECT_GT(a.q_lora_rank, 0);
  EXPECT_EQ(a.qk_rope_head_dim, 2);
  EXPECT_EQ(a.qk_nope_head_dim + a.qk_rope_head_dim, a.v_head_dim);
  EXPECT_EQ(s.model.kv_heads, s.model.heads);
  const TinyModel m(s);
  EXPECT_TRUE(m.mla);
  EXPECT_TRUE(m.has(PKind::mla_dq, 0));
  EXPECT_FALSE(m.has(PKind::wq, 0));
  const Experiment direct = shrink_experiment(make({.name = "direct", .dp = 2, .q_lora = 0, .rope = 0}));
  EXPECT_EQ(direct.model.mla.q_lora_rank, 0);
  EXPECT_EQ(direct.model.mla.qk_rope_head_dim, 0);
  EXPECT_FALSE(TinyModel(direct).has(PKind::mla_dq, 0));
}

/// The MLA reference against central differences (eps 1e-5, bound 1e-7) on every MLA
/// parameter of every layer.
void check_mla_reference(const MlaCase& c) {
  const TinyModel m(shrink_experiment(make(c)));
  const std::vector<double> p = init_params(m, 3);
  const Batch b = make_batch(m, 4);
  const RefStep r = reference_step(m, p, b);
  std::vector<size_t> idx;
  Rng pick(5);
  for (const PSeg& s : m.segs) {
    const bool mla = s.kind == PKind::mla_dq || s.kind == PKind::mla_qnorm || s.kind == PKind::mla_uq ||
                     s.kind == PKind::mla_dkv || s.kind == PKind::mla_kvnorm || s.kind == PKind::mla_ukv ||
                     s.kind == PKind::wo;
    if (!mla) continue;
    for (int k = 0; k < 4; ++k) idx.push_back(static_cast<size_t>(s.offset + pick.below(s.rows * s.cols)));
  }
  ASSERT_GE(idx.size(), 16u);
  for (size_t i : idx) {
    std::vector<double> q = p;
    const double eps = 1e-5;
    q[i] = p[i] + eps;
    const double up = reference_step(m, q, b).loss;
    q[i] = p[i] - eps;
    const double down = reference_step(m, q, b).loss;
    EXPECT_NEAR(r.grad[i], (up - down) / (2 * eps), 1e-7) << c.name << " parameter " << i;
  }
}

TEST(VerifyMlaReference, WithQLatentAndRotaryPartMatchesFiniteDifferences) {
  check_mla_reference({.name = "latent_rope", .dp = 2});
}

TEST(VerifyMlaReference, DirectQueryWithoutRotaryPartMatchesFiniteDifferences) {
  check_mla_reference({.name = "direct_norope", .dp = 2, .q_lora = 0, .rope = 0});
}

class VerifyMlaLayouts : public ::testing::TestWithParam<MlaCase> {};

TEST_P(VerifyMlaLayouts, EveryRulePasses) {
  const VerifyReport r = verify_experiment(make(GetParam()), opts());
  EXPECT_TRUE(r.passed()) << GetParam().name << describe(r);
  EXPECT_GT(r.rule("DP").values, 0);
  if (GetParam().tp > 1) {
    EXPECT_GT(r.rule("TP").values, 0);
  }
}

void PrintTo(const MlaCase& c, std::ostream* os) { *os << c.name; }

INSTANTIATE_TEST_SUITE_P(
    Mla, VerifyMlaLayouts,
    ::testing::Values(MlaCase{.name = "tp1_dp2", .dp = 2},
                      MlaCase{.name = "tp2_sp", .dp = 2, .tp = 2, .sp = true},
                      MlaCase{.name = "tp2_sp_direct_query", .dp = 2, .tp = 2, .sp = true, .q_lora = 0},
                      MlaCase{.name = "tp2_sp_no_rope", .dp = 1, .tp = 2, .sp = true, .rope = 0},
                      MlaCase{.name = "tp2_cp2", .tp = 2, .cp = 2, .sp = true},
                      MlaCase{.name = "pp2_full_recompute_zero1", .dp = 2, .pp = 2, .recompute = Recompute::full,
                              .zero = 1},
                      MlaCase{.name = "tp2_sp_selective_zero3", .dp = 2, .tp = 2, .sp = true,
                              .recompute = Recompute::selective, .zero = 3},
                      MlaCase{.name = "ep2_tp2_sp", .dp = 2, .tp = 2, .ep = 2, .sp = true}),
    [](const auto& info) { return std::string(info.param.name); });

/// Without MoE (which needs SP with tp > 1): MLA at tp 2 without sequence parallelism; the
/// plan's DP buckets count MLA's parameters (models/flops.cpp stage_layer_kinds: layer 0's kind
/// for every layer of a model without experts or windows), so every rule passes.
Experiment dense_mla(MlaCase c) {
  c.dense = true;
  return make(c);
}

TEST(VerifyMlaDense, TpWithoutSequenceParallelComputesLikeOneDevice) {
  const VerifyReport r = verify_experiment(dense_mla({.name = "dense_tp2_no_sp", .dp = 2, .tp = 2}), opts());
  for (const char* rule : {"loss", "DP", "TP", "ZeRO"}) EXPECT_TRUE(r.rule(rule).passed) << rule << describe(r);
  EXPECT_TRUE(r.passed()) << describe(r);
  EXPECT_GT(r.rule("TP").values, 0);
}

TEST(VerifyMlaInjections, UnreducedDownGradientsFailWithTpAndSp) {
  for (const MlaCase& c : {MlaCase{.name = "tp2_sp", .dp = 2, .tp = 2, .sp = true},
                           MlaCase{.name = "tp2_sp_direct_query", .dp = 1, .tp = 2, .sp = true, .q_lora = 0}}) {
    const VerifyReport r = verify_experiment(make(c), opts(Injection::mla_down_grad_unreduced, 1));
    EXPECT_FALSE(r.passed()) << c.name << describe(r);
    EXPECT_FALSE(r.rule("DP").passed) << c.name;
  }
  EXPECT_EQ(parse_injection("mla-down-grad-unreduced"), Injection::mla_down_grad_unreduced);
}

TEST(VerifyMlaInjections, UnreducedDownGradientsInapplicableWithoutTpSpOrMla) {
  const Injection inj = Injection::mla_down_grad_unreduced;
  EXPECT_THROW(verify_experiment(make({.name = "tp1", .dp = 2}), opts(inj, 1)), InputError);
  // Without SP every TP rank computes those gradients on every token: nothing to sum.
  EXPECT_THROW(verify_experiment(dense_mla({.name = "tp2_no_sp", .dp = 2, .tp = 2}), opts(inj, 1)), InputError);
  Experiment no_mla = make({.name = "no_mla", .dp = 2, .tp = 2, .sp = true});
  no_mla.model.mla = MlaSpec{};
  EXPECT_THROW(verify_experiment(no_mla, opts(inj, 1)), InputError);
}

TEST(VerifyMlaInjections, GenericBugsStillShowOnMla) {
  const VerifyReport r =
      verify_experiment(make({.name = "tp2_sp", .dp = 2, .tp = 2, .sp = true}), opts(Injection::tp_grad_avg, 1));
  EXPECT_FALSE(r.passed()) << describe(r);
}

}  // namespace
}  // namespace dtsim::verify
