// dtsim verify on mixture-of-experts layouts (models/verify/ops_moe.cpp): the shrunk MoE model,
// its reference gradient against finite differences, every rule on EP / ETP / EDP layouts with
// DP, TP + SP, PP (dense first layer), ZeRO-1/3, a shared expert and sigmoid routing, the two
// MoE injections detected, and the features verify refuses.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/plan.hpp"
#include "models/verify/tiny_model.hpp"
#include "models/verify/verify.hpp"
#include "tests/unit/verify_describe.hpp"

namespace dtsim::verify {
namespace {

// A Mixtral-like model (8 experts, top-2); each test sets its layout (verify shrinks it).
const char* kMoe = R"(title: verify moe test
model: {name: moe, layers: 8, hidden: 512, heads: 8, kv_heads: 8, ffn_hidden: 1024, vocab: 4096,
        activation: swiglu, norm: rmsnorm, position: rope, tied_embeddings: false,
        moe: {num_experts: 8, router_topk: 2, moe_ffn_hidden: 1024}}
cluster: {node: dgx-h100, nodes: 1}
layout: {dp: 8, tp: 1, ep: 4}
training: {seq_len: 1024, global_batch: 16, micro_batch: 1}
)";

struct MoeCase {
  const char* name;
  int64_t dp = 1, tp = 1, pp = 1, ep = 1, etp = 0;
  bool sp = false;
  int zero = 0;
  int64_t first_k_dense = 0;
  int64_t shared = 0;
  bool sigmoid = false;
  bool overlap = false;  // moe_shared_expert_overlap + delay_wgrad_compute
};

Experiment make(const MoeCase& c) {
  Experiment e = parse_experiment(kMoe, "verify-moe-test.yaml");
  e.title = c.name;
  Layout& l = e.layout;
  l.dp = c.dp;
  l.tp = c.tp;
  l.pp = c.pp;
  l.ep = c.ep;
  l.etp = c.etp;
  l.sequence_parallel = c.sp;
  l.zero_stage = c.zero;
  MoeSpec& moe = e.model.moe;
  moe.first_k_dense = c.first_k_dense;
  moe.shared_expert_ffn_hidden = c.shared;
  if (c.sigmoid) moe.router_score = RouterScore::sigmoid;
  e.training.moe_shared_expert_overlap = c.overlap;
  e.training.delay_wgrad_compute = c.overlap;
  e.training.micro_batch = 1;
  e.training.global_batch = 2 * c.dp;
  e.cluster.nodes = 1;
  e.cluster.gpus_per_node = c.dp * c.tp * c.pp;
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

TEST(VerifyMoeShrink, KeepsExpertParallelismAndBothLayerKinds) {
  const Experiment s =
      shrink_experiment(make({.name = "shrink", .dp = 4, .pp = 2, .ep = 2, .first_k_dense = 3, .shared = 64}));
  EXPECT_EQ(s.layout.ep, 2);
  EXPECT_EQ(s.model.moe.num_experts, 4);  // 8 > max(2 ep, 4) = 4
  EXPECT_EQ(s.model.moe.num_experts % s.layout.ep, 0);
  EXPECT_EQ(s.model.moe.router_topk, 2);  // min(2, E / 2)
  EXPECT_EQ(s.model.moe.first_k_dense, 1);
  EXPECT_GT(s.model.moe.shared_expert_ffn_hidden, 0);
  const TinyModel m(s);
  EXPECT_FALSE(m.moe_layer(0));
  EXPECT_TRUE(m.moe_layer(1));
  EXPECT_TRUE(m.moe_layer(static_cast<int>(m.layers) - 1));
  // Small E is kept.
  EXPECT_EQ(shrink_experiment(make({.name = "keep", .dp = 8, .ep = 4})).model.moe.num_experts, 8);
}

/// The MoE reference (router top-k, weighted experts, shared expert) against central
/// differences (as test_verify.cpp's dense check: eps 1e-5, bound 1e-7), on the router,
/// routed and shared experts' parameters and some others.
void check_moe_reference(const MoeCase& c) {
  const TinyModel m(shrink_experiment(make(c)));
  const std::vector<double> p = init_params(m, 3);
  const Batch b = make_batch(m, 4);
  const RefStep r = reference_step(m, p, b);
  std::vector<size_t> idx;
  Rng pick(5);
  for (const PSeg& s : m.segs) {
    const bool moe = s.kind == PKind::router_w || s.kind == PKind::eu || s.kind == PKind::eg || s.kind == PKind::ed ||
                     (m.moe_layer(s.layer) && (s.kind == PKind::wu || s.kind == PKind::wd));
    if (!moe) continue;
    for (int k = 0; k < 6; ++k) idx.push_back(static_cast<size_t>(s.offset + pick.below(s.rows * s.cols)));
  }
  ASSERT_GE(idx.size(), 24u);
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

TEST(VerifyMoeReference, SoftmaxRouterWithSharedExpertMatchesFiniteDifferences) {
  check_moe_reference({.name = "softmax", .dp = 8, .ep = 4, .shared = 64});
}

TEST(VerifyMoeReference, SigmoidRouterMatchesFiniteDifferences) {
  check_moe_reference({.name = "sigmoid", .dp = 8, .ep = 4, .sigmoid = true});
}

TEST(VerifyMoeRouting, TopKPicksTheLargestAndBreaksTiesByIndex) {
  const TinyModel m(shrink_experiment(make({.name = "route", .dp = 8, .ep = 4})));
  ASSERT_EQ(m.experts, 8);
  ASSERT_EQ(m.topk, 2);
  const std::vector<double> logits = {0.5, 2.0, -1.0, 2.0, 0.1, 0.0, 1.5, -3.0};
  int64_t sel[2];
  double prob[2];
  moe_route(m, logits.data(), sel, prob);
  EXPECT_EQ(sel[0], 1);  // tie 2.0 at experts 1 and 3: the lower index first
  EXPECT_EQ(sel[1], 3);
  EXPECT_DOUBLE_EQ(prob[0], 0.5);  // softmax over two equal logits
  EXPECT_DOUBLE_EQ(prob[0] + prob[1], 1.0);
}

class VerifyMoeLayouts : public ::testing::TestWithParam<MoeCase> {};

TEST_P(VerifyMoeLayouts, EveryRuleHolds) {
  const Experiment e = make(GetParam());
  // The plan really has the MoE ops the interpreter must execute.
  const StepPlan plan = build_step_plan(shrink_experiment(e));
  int64_t routers = 0, dispatches = 0, edp = 0;
  for (const auto& st : plan.stages)
    for (const Op& op : st.ops) {
      const std::string n = op.name;
      routers += n == "router";
      dispatches += n == "moe_dispatch";
      edp += n.rfind("edp_", 0) == 0;
    }
  EXPECT_GT(routers, 0);
  EXPECT_EQ(dispatches > 0, e.layout.ep > 1);
  EXPECT_EQ(edp > 0, e.layout.edp() > 1);
  const VerifyReport r = verify_experiment(e, opts());
  EXPECT_TRUE(r.passed()) << GetParam().name << describe(r);
  EXPECT_GT(r.rule("DP").values, 0);
}

void PrintTo(const MoeCase& c, std::ostream* os) { *os << c.name; }

INSTANTIATE_TEST_SUITE_P(
    Moe, VerifyMoeLayouts,
    ::testing::Values(MoeCase{.name = "dp4_ep4", .dp = 4, .ep = 4},  // EDP of one rank: the 1/|DPxCP| scale alone
                      MoeCase{.name = "dp8_ep4_edp2", .dp = 8, .ep = 4},
                      MoeCase{.name = "dp2_tp2_sp_ep2_etp1", .dp = 2, .tp = 2, .ep = 2, .etp = 1, .sp = true},
                      MoeCase{.name = "dp2_tp2_sp_ep2_etp2_shared", .dp = 2, .tp = 2, .ep = 2, .etp = 2, .sp = true,
                              .shared = 64},
                      MoeCase{.name = "pp2_dense_first_ep2", .dp = 2, .pp = 2, .ep = 2, .first_k_dense = 1},
                      MoeCase{.name = "zero1_ep2", .dp = 4, .ep = 2, .zero = 1},
                      MoeCase{.name = "zero3_ep2", .dp = 4, .ep = 2, .zero = 3},
                      MoeCase{.name = "shared_overlap_delay_wgrad", .dp = 2, .tp = 2, .ep = 2, .etp = 1, .sp = true,
                              .shared = 64, .overlap = true},
                      MoeCase{.name = "sigmoid_ep2", .dp = 4, .ep = 2, .sigmoid = true}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(VerifyMoeInjections, EachMoeBugIsDetected) {
  for (const MoeCase& c : {MoeCase{.name = "dp4_ep2", .dp = 4, .ep = 2, .shared = 64},
                           MoeCase{.name = "tp2_sp_ep2", .dp = 2, .tp = 2, .ep = 2, .etp = 1, .sp = true}}) {
    for (Injection inj : {Injection::ep_grad_avg_over_ep, Injection::moe_combine_unweighted}) {
      const VerifyReport r = verify_experiment(make(c), opts(inj, 1));
      EXPECT_FALSE(r.passed()) << c.name << " " << to_string(inj) << describe(r);
      EXPECT_FALSE(r.rule("DP").passed) << c.name << " " << to_string(inj);
    }
  }
  EXPECT_EQ(parse_injection("ep-grad-avg-over-ep"), Injection::ep_grad_avg_over_ep);
  EXPECT_EQ(parse_injection("moe-combine-unweighted"), Injection::moe_combine_unweighted);
}

TEST(VerifyMoeInjections, InapplicableWithoutAnEdpReduction) {
  // dp 4, ep 4: EDP has one rank, the plan reduces no expert gradient.
  EXPECT_THROW(verify_experiment(make({.name = "edp1", .dp = 4, .ep = 4}), opts(Injection::ep_grad_avg_over_ep, 1)),
               InputError);
}

TEST(VerifyMoeRefuses, FeaturesItDoesNotExecute) {
  auto message = [](const Experiment& e) {
    try {
      verify_experiment(e, opts());
    } catch (const InputError& x) {
      return std::string(x.what());
    }
    return std::string("no error");
  };
  Experiment cap = make({.name = "cap", .dp = 8, .ep = 4});
  cap.model.moe.capacity_factor = 1.25;
  EXPECT_NE(message(cap).find("capacity factor"), std::string::npos) << message(cap);
  Experiment window = make({.name = "window", .dp = 8, .ep = 4});
  window.model.attention.window = 128;
  EXPECT_NE(message(window).find("sliding-window"), std::string::npos) << message(window);
  // (Multi-head latent attention is executed: tests/unit/test_verify_mla.cpp.)
}

}  // namespace
}  // namespace dtsim::verify
