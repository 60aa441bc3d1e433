// Bounded work, checked arithmetic (models/checked.hpp): every count the inputs multiply
// is checked for overflow and against a stated limit before any work starts, with an
// error naming the key and the limit; the plan's op bound holds for every shipped plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "cli_fixture.hpp"
#include "models/checked.hpp"
#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/flops.hpp"
#include "models/plan.hpp"
#include "models/sweep_spec.hpp"
#include "models/verify/verify.hpp"
#include "sim/sweep/sweep.hpp"
#include "tests/unit/shipped_files.hpp"

namespace dtsim {
namespace {

namespace fs = std::filesystem;

const std::string kExample = std::string(DTSIM_SOURCE_DIR) + "/experiments/examples/llama3-8b-h100.yaml";

/// The problems of loading the example with `sets`, joined; empty when it loads.
std::string problems_with(const std::vector<std::string>& sets) {
  try {
    load_experiment(kExample, sets);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Checked, MulAddProductDetectOverflow) {
  EXPECT_EQ(checked::mul(3, 4), 12);
  EXPECT_FALSE(checked::mul(int64_t{1} << 62, 4));
  EXPECT_FALSE(checked::mul(-(int64_t{1} << 62), 4));
  EXPECT_EQ(checked::add(1, 2), 3);
  EXPECT_FALSE(checked::add(std::numeric_limits<int64_t>::max(), 1));
  EXPECT_EQ(checked::product({2, 3, 5}), 30);
  // 2305843009213693954 x 8 wraps to 16 in two's complement: the issue's example.
  EXPECT_FALSE(checked::product({2305843009213693954, 8}));
  EXPECT_EQ(checked::with_commas(1048576), "1,048,576");
  EXPECT_EQ(checked::with_commas(999), "999");
  EXPECT_EQ(checked::with_commas(-1000), "-1,000");
  EXPECT_EQ(checked::with_commas(std::numeric_limits<int64_t>::min()), "-9,223,372,036,854,775,808");
}

TEST(Bounds, NodesThatWrapToAFewGpusAreRefused) {
  // 2305843009213693954 x 8 GPUs per node = 16 (mod 2^64): it used to pass validation.
  const std::string p = problems_with({"cluster.nodes=2305843009213693954"});
  EXPECT_NE(p.find("cluster.nodes=2305843009213693954 exceeds the 1,048,576-GPU limit"), std::string::npos) << p;
}

TEST(Bounds, ClusterProductAboveTheGpuLimitNamesBothKeys) {
  const std::string p = problems_with({"cluster.nodes=262144", "layout.dp=auto"});  // x 8 = 2^21 GPUs
  EXPECT_NE(p.find("cluster.nodes x cluster.gpus_per_node = 262144 x 8 = 2,097,152 exceeds the 1,048,576-GPU limit"),
            std::string::npos)
      << p;
}

TEST(Bounds, LayoutProductOverflowIsRefused) {
  const std::string p =
      problems_with({"layout.dp=1048576", "layout.tp=1048576", "layout.pp=1048576", "layout.cp=1048576"});
  EXPECT_NE(p.find("layout.dp x tp x cp x pp = 1048576 x 1048576 x 1048576 x 1048576 = more than 2^63 exceeds"),
            std::string::npos)
      << p;
}

TEST(Bounds, HugeGlobalBatchIsRefusedBeforeAnyWork) {
  // Used to end in std::bad_alloc after 48 s of plan building.
  const std::string p = problems_with({"training.global_batch=1000000000"});
  EXPECT_NE(p.find("training.global_batch=1000000000 exceeds the 16,777,216-sequence limit"), std::string::npos) << p;
}

TEST(Bounds, PlanAboveTheOpLimitIsRefusedNamingTheBatch) {
  // Within the batch limit, but 2^24 micro-batches x 32 layers is far above the op limit.
  const std::string p = problems_with({"training.global_batch=16777216", "training.micro_batch=1"});
  EXPECT_NE(p.find("the step plan would hold up to"), std::string::npos) << p;
  EXPECT_NE(p.find("33,554,432-operation limit"), std::string::npos) << p;
  EXPECT_NE(p.find("training.global_batch=16777216"), std::string::npos) << p;
}

TEST(Bounds, EveryCountLimitNamesItsKey) {
  for (const char* key : {"model.layers", "model.hidden", "model.heads", "model.kv_heads", "model.ffn_hidden",
                          "model.vocab", "training.seq_len", "training.micro_batch", "layout.tp", "layout.pp",
                          "layout.cp", "layout.vp", "cluster.gpus_per_node", "cluster.nics_per_node"}) {
    const std::string p = problems_with({std::string(key) + "=9223372036854775807"});
    EXPECT_NE(p.find(std::string(key) + "=9223372036854775807 exceeds the "), std::string::npos) << key << ": " << p;
  }
}

/// Variants of an experiment that add ops per layer: recompute, CP, ZeRO-3, SP with
/// TP overlap, DP reduce every micro-batch.
std::vector<std::vector<std::string>> variants() {
  return {{},
          {"layout.recompute=full", "training.reduce_every_micro_batch=true"},
          {"layout.zero_stage=3"},
          {"layout.zero_stage=2", "training.overlap_param_gather=true"},
          {"model.mtp_layers=3"}};
}

TEST(Bounds, PlanOpBoundHoldsForEveryShippedExperiment) {
  const std::vector<fs::path> files = test_files::shipped_yaml();
  ASSERT_FALSE(files.empty());
  double tightest = 1e300;
  int checked_plans = 0;
  for (const auto& f : files) {
    for (const auto& v : variants()) {
      Experiment e;
      try {
        e = load_experiment(f.string(), v);
      } catch (const InputError&) {
        continue;  // the variant does not apply to this layout
      }
      const int64_t bound = plan_op_bound(e);
      if (bound > 1'000'000) continue;  // the largest plans (up to 4 million ops) take seconds to build
      const StepPlan plan = build_step_plan(e);
      int64_t ops = 0;
      for (const auto& st : plan.stages) ops += static_cast<int64_t>(st.ops.size());
      EXPECT_LE(ops, bound) << f << " " << ::testing::PrintToString(v);
      tightest = std::min(tightest, static_cast<double>(bound) / static_cast<double>(ops));

      ++checked_plans;
    }
  }
  EXPECT_GT(checked_plans, static_cast<int>(files.size()));  // about 4 variants of 3 files in 4
  // The bound is an upper bound, not a wild one: within a factor of 8 of some plan.
  EXPECT_LT(tightest, 8.0);
}

TEST(Bounds, PlanOpBoundSaturatesInsteadOfWrapping) {
  Experiment e = load_experiment(kExample);
  e.model.layers = std::numeric_limits<int64_t>::max() / 2;
  EXPECT_EQ(plan_op_bound(e), std::numeric_limits<int64_t>::max());
}

TEST(Bounds, StageFirstLayerMatchesTheSumOfStageLayerCounts) {
  // stage_first_layer is closed-form (O(1) per stage, so a plan is linear in pp): the sum
  // of the counts of the stages before it, for every split of up to 40 layers.
  ModelSpec m = load_experiment(kExample).model;
  for (int64_t layers = 1; layers <= 40; ++layers)
    for (int64_t pp = 1; pp <= layers; ++pp) {
      m.layers = layers;
      Layout l;
      l.pp = pp;
      int64_t first = 0;
      for (int64_t s = 0; s < pp; ++s) {
        ASSERT_EQ(stage_first_layer(m, l, s), first) << "layers=" << layers << " pp=" << pp << " stage=" << s;
        first += stage_layer_count(m, l, s);
      }
      ASSERT_EQ(first, layers);
    }
}

class BoundsCli : public cli_test::CliTest {
 protected:
  BoundsCli() : CliTest("dtsim-bounds") {}
};

TEST_F(BoundsCli, CollectiveFactorNearOneIsRefusedNamingTheFactor) {
  // Used to run for ever: about 2 x 10^8 sizes from 8 B to 8 GiB.
  const auto r = dtsim("collective --op allreduce --cluster dgx-h100 --gpus 8 --factor 1.0000001");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--factor 1.0000001 gives"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("1,000-size limit"), std::string::npos) << r.err;
}

TEST_F(BoundsCli, CollectiveAtTheSizeLimitRuns) {
  // 8 B .. 1 KiB by 2: 8 sizes, far inside the limit; the table has one row per size.
  const auto r = dtsim("collective --op allreduce --cluster dgx-h100 --gpus 8 -b 8 -e 1K -f 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("        1024 "), std::string::npos) << r.out;
}

TEST_F(BoundsCli, CollectiveNodesAboveTheGpuLimitAreRefused) {
  const auto r = dtsim("collective --op allreduce --cluster dgx-h100 --nodes 2305843009213693954");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("exceeds the 1,048,576-GPU limit"), std::string::npos) << r.err;
}

TEST_F(BoundsCli, VerifyAboveItsRankLimitIsRefusedBeforeAllocating) {
  // 131,072 GPUs: the kernel used to kill verify at 24 GB.
  const auto v = dtsim("verify " + cli_test::shell_quote(kExample) +
                       " --set cluster.nodes=16384 --set training.global_batch=131072");
  EXPECT_EQ(v.code, 2) << v.err;
  EXPECT_NE(v.err.find("= 131,072 ranks: dtsim verify runs at most 16,384"), std::string::npos) << v.err;
}

TEST(Bounds, SweepSpaceAboveTheLayoutLimitIsRefusedBeforeEnumerating) {
  const std::string yaml = R"(
model: {name: m, layers: 96, hidden: 4096, heads: 32, ffn_hidden: 16384, vocab: 51200, activation: gelu,
        tied_embeddings: true, norm: layernorm, position: learned}
training: {seq_len: 2048, global_batch: 1536, micro_batch: 1}
clusters:
  - {node: dgx-a100, nodes: 128}
space:
  tp: {from: 1, to: 100000}
  pp: {from: 1, to: 100000}
  dp: auto
)";
  try {
    sweep::enumerate_layouts(parse_sweep_spec(yaml, "big.yaml", SpecKind::sweep));
    FAIL() << "a space of 10^10 layouts was enumerated";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("1,000,000-layout limit"), std::string::npos) << e.what();
  }
}

TEST(Bounds, SweepRangeNearInt64MaxEndsInsteadOfWrapping) {
  const std::string yaml = R"(
model: {name: m, layers: 96, hidden: 4096, heads: 32, ffn_hidden: 16384, vocab: 51200, activation: gelu,
        tied_embeddings: true, norm: layernorm, position: learned}
training: {seq_len: 2048, global_batch: 1536, micro_batch: 1}
clusters:
  - {node: dgx-a100, nodes: 128}
space:
  tp: {from: 4611686018427387904, to: 9223372036854775807, factor: 2}
  pp: 1
  dp: auto
)";
  const SweepSpec spec = parse_sweep_spec(yaml, "range.yaml", SpecKind::sweep);
  EXPECT_EQ(spec.space.tp.values, (std::vector<int64_t>{4611686018427387904}));
}

}  // namespace
}  // namespace dtsim
