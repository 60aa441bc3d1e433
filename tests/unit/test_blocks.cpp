// The blocks of models/blocks/ and the backward split of the zero-bubble schedules
// (models/plan.hpp BackwardPart): for every shipped experiment, B (input) and W (weight) of
// a layer, of the head and of the embedding emit exactly the compute ops of the fused
// backward, W only the weight-gradient GEMMs and the embedding's scatter-add, the fused
// backward is the plan's, and the layer's blocks count flops.hpp's parameters.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "models/blocks/layer.hpp"
#include "models/experiment_io.hpp"
#include "models/flops.hpp"
#include "models/plan.hpp"
#include "models/schedules/schedule.hpp"
#include "tests/unit/shipped_files.hpp"

namespace dtsim {
namespace {

// What a compute op computes and costs; the multiset of these is what a split must keep.
using ComputeKey = std::tuple<std::string, int, double, double, double, int>;

std::vector<ComputeKey> compute_ops(const std::vector<Op>& ops) {
  std::vector<ComputeKey> out;
  for (const auto& op : ops)
    if (op.type == OpType::compute)
      out.emplace_back(op.name, static_cast<int>(op.kernel), op.flops, op.bytes, op.time_s, op.kernels);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<Op> concat(const std::vector<Op>& a, const std::vector<Op>& b) {
  std::vector<Op> out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

bool is_weight_compute(const std::string& name) {
  return name == "embedding_bwd" || (name.size() > 6 && name.compare(name.size() - 6, 6, "_wgrad") == 0);
}

double wgrad_flops(const std::vector<Op>& ops) {
  double f = 0;
  for (const auto& op : ops)
    if (op.type == OpType::compute && is_weight_compute(op.name)) f += op.flops;
  return f;
}

double flops(const std::vector<Op>& ops) {
  double f = 0;
  for (const auto& op : ops)
    if (op.type == OpType::compute) f += op.flops;
  return f;
}

void check_split(const std::string& what, const std::vector<Op>& full, const std::vector<Op>& in,
                 const std::vector<Op>& wt) {
  SCOPED_TRACE(what);
  EXPECT_EQ(compute_ops(concat(in, wt)), compute_ops(full));
  for (const auto& op : full) EXPECT_EQ(op.pass, Pass::B) << op.name;
  for (const auto& op : in) {
    EXPECT_EQ(op.pass, Pass::B) << op.name;
    if (op.type == OpType::compute) {
      EXPECT_FALSE(is_weight_compute(op.name)) << op.name;
    }
  }
  for (const auto& op : wt) {
    EXPECT_EQ(op.pass, Pass::W) << op.name;
    EXPECT_EQ(op.phase, Phase::backward) << op.name;
    if (op.type == OpType::compute) {
      EXPECT_TRUE(is_weight_compute(op.name)) << op.name;
    } else {
      // Only what the W GEMMs need: the SP re-gather of a column-parallel input, or of
      // the embedding's output gradient; blocking, so W leaves nothing in flight.
      EXPECT_EQ(op.type, OpType::collective) << op.name;
      EXPECT_EQ(op.collective, Collective::AllGather) << op.name;
      EXPECT_EQ(op.kind, CommKind::TP) << op.name;
    }
  }
  // A split part leaves no asynchronous collective open: each one it issues it waits for.
  for (const auto* part : {&in, &wt})
    for (const auto& op : *part)
      if (op.type == OpType::issue) {
        EXPECT_TRUE(std::any_of(part->begin(), part->end(),
                                [&](const Op& w) { return w.type == OpType::wait && w.handle == op.handle; }))
            << op.name;
      }
  EXPECT_DOUBLE_EQ(flops(wt), wgrad_flops(full));
  EXPECT_DOUBLE_EQ(flops(in) + flops(wt), flops(full));
}

// The ops of a plan's op list that describe the same work regardless of handle numbering.
using OpKey = std::tuple<int, std::string, double, double, double, int, int>;
OpKey key_of(const Op& op) {
  return {static_cast<int>(op.type), op.name, op.flops, op.bytes, op.size_bytes, static_cast<int>(op.collective),
          op.overlap_splits};
}

class PlanBackwardSplit : public ::testing::TestWithParam<std::filesystem::path> {};

TEST_P(PlanBackwardSplit, InputPlusWeightIsTheFusedBackward) {
  const Experiment e = load_experiment(GetParam().string());
  const auto full = backward_part_ops(e, BackwardPart::full);
  const auto in = backward_part_ops(e, BackwardPart::input);
  const auto wt = backward_part_ops(e, BackwardPart::weight);
  check_split("layer", full.layer, in.layer, wt.layer);
  check_split("head", full.head, in.head, wt.head);
  check_split("embedding", full.embedding, in.embedding, wt.embedding);
  EXPECT_TRUE(in.embedding.empty());  // the embedding has no input gradient
  EXPECT_GT(wgrad_flops(wt.layer), 0);

  // A schedule that splits backwards into B and W (zero-bubble, DualPipe) runs the parts,
  // checked above, not the fused backward.
  if (sched::schedule_of(e.layout.schedule).splits_backward()) return;
  // The fused backward is what the plan runs: layer 0's backward of micro-batch 0 on stage
  // 0, less the DP (ZeRO) ops the stage loop puts around it, FSDP2's copies among them
  // (models/zero3.hpp).
  const StepPlan plan = build_step_plan(e);
  std::vector<OpKey> in_plan, fused;
  auto zero3_copy = [](const Op& op) {
    return std::string(op.name) == "fsdp_param_copy_out" || std::string(op.name) == "fsdp_grad_copy_in";
  };
  for (const auto& op : plan.stages[0].ops)
    if (op.phase == Phase::backward && op.layer == 0 && op.micro_batch == 0 && op.kind != CommKind::DP && !zero3_copy(op))
      in_plan.push_back(key_of(op));
  for (const auto& op : full.layer)
    if (op.kind != CommKind::DP) fused.push_back(key_of(op));
  EXPECT_EQ(in_plan, fused);

  // Without a split schedule every op is F or B, by its phase.
  for (const auto& st : plan.stages)
    for (const auto& op : st.ops) ASSERT_EQ(op.pass, op.phase == Phase::backward ? Pass::B : Pass::F) << op.name;
}

// Every shipped model's layer, as the block list declares it, has flops.hpp's parameter
// count, to the last bit, on every TP degree (what-if degrees that do not divide included).
TEST_P(PlanBackwardSplit, LayerBlocksCountTheLayersParameters) {
  const Experiment e = load_experiment(GetParam().string());
  const blocks::ModelBlocks model(e.model);
  EXPECT_EQ(model.layer(0).parameters_per_tp_rank(e.model, 1), static_cast<double>(layer_parameters(e.model)));
  for (int64_t tp : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{8}, e.layout.tp})
    EXPECT_EQ(model.layer(0).parameters_per_tp_rank(e.model, tp), layer_parameters_per_tp_rank(e.model, tp)) << tp;
}

INSTANTIATE_TEST_SUITE_P(Shipped, PlanBackwardSplit, ::testing::ValuesIn(test_files::shipped_yaml()),
                         [](const auto& info) {
                           std::string n = info.param.stem().string();
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n + "_" + std::to_string(info.index);
                         });

}  // namespace
}  // namespace dtsim
