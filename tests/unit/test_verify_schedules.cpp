// dtsim verify under the orders the pipeline schedules of issue 15 produce, on plans the
// test rewrites from build_step_plan's 1F1B plans (so it needs no schedule code):
//  - zero-bubble (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR 2024, Sec 2):
//    each (layer, micro-batch)'s weight-gradient ops (W: *_wgrad, embedding_bwd) moved
//    after the stage's next forward, away from their input-gradient ops (B), with the DP
//    gradient collectives that follow them; every rule must still pass. A W moved before
//    its own B, and a dropped W, must fail (the injections w-before-b and drop-w).
//  - DualPipe (DeepSeek-V3 technical report, arXiv 2412.19437, Sec 3.2.1): a layer held by
//    two pipeline ranks, whose two gradient copies dualpipe_grad_allreduce sums.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "models/experiment_io.hpp"
#include "models/plan.hpp"
#include "models/verify/tiny_model.hpp"
#include "models/verify/verify.hpp"
#include "tests/unit/verify_describe.hpp"

namespace dtsim::verify {
namespace {

// A GPT-style model (the verifier shrinks it): 2 layers per stage.
const char* kBase = R"(title: verify schedules
model: {name: tiny, layers: 8, hidden: 512, heads: 16, kv_heads: 16, ffn_hidden: 2048, vocab: 4096,
        activation: gelu, norm: layernorm, position: learned, tied_embeddings: false,
        max_position_embeddings: 2048}
cluster: {node: dgx-a100, nodes: 1}
layout: {dp: 2, tp: 2, cp: 1, pp: 2}
training: {seq_len: 1024, global_batch: 16, micro_batch: 2}
)";

struct Layout2 {
  int64_t dp = 1, tp = 1, pp = 2;
  int zero = 0;
  bool sp = false;
  bool llama = false;
};

Experiment make(const Layout2& c) {
  Experiment e = parse_experiment(kBase, "verify-schedules.yaml");
  e.layout.dp = c.dp;
  e.layout.tp = c.tp;
  e.layout.pp = c.pp;
  e.layout.zero_stage = c.zero;
  e.layout.sequence_parallel = c.sp;
  e.training.micro_batch = 2;
  e.training.global_batch = 2 * c.dp * 4;  // 4 micro-batches
  e.training.overlap_grad_reduce = true;
  if (c.llama) {
    e.model.activation = Activation::swiglu;
    e.model.norm = Norm::rmsnorm;
    e.model.position = Position::rope;
    e.model.kv_heads = 8;
    e.model.max_position_embeddings = 0;
  }
  e.cluster.nodes = 1;
  e.cluster.gpus_per_node = c.dp * c.tp * c.pp;
  e.cluster.nics_per_node = 0;
  validate_experiment(e);
  return shrink_experiment(e);
}

using test_text::describe;

bool is_w(const Op& op) {
  const std::string_view n = op.name;
  return op.type == OpType::compute &&
         ((n.size() > 6 && n.substr(n.size() - 6) == "_wgrad") || n == "embedding_bwd");
}
bool is_dp_grad(const Op& op) { return std::string_view(op.name).rfind("dp_grad_", 0) == 0; }

/// The stage's ops with each micro-batch's W ops (and the DP gradient collectives among or
/// after them in that micro-batch's backward, with their waits if inside it) moved to just
/// before the first later op of another micro-batch's backward (`past` = 0; 1: of the
/// backward after that), or before the optimizer / end-of-step ops: on 1F1B that is after
/// the next forward, as zero-bubble schedules defer W.
std::vector<Op> defer_w(const std::vector<Op>& ops, int past, int64_t* moved) {
  const size_t n = ops.size();
  std::vector<uint8_t> taken(n, 0);
  std::vector<std::vector<size_t>> groups;  // [group] op indices, in order
  std::vector<size_t> end_of;               // [group] index of the last op of its backward
  for (size_t i = 0; i < n; ++i) {
    if (!is_w(ops[i]) || taken[i]) continue;
    const int mb = ops[i].micro_batch;
    // The micro-batch's backward runs until an op of another micro-batch's backward (or an
    // op without a micro-batch in the optimizer phase).
    size_t e = i;
    while (e + 1 < n) {
      const Op& o = ops[e + 1];
      if (o.phase == Phase::optimizer) break;
      if (o.phase == Phase::backward && o.micro_batch >= 0 && o.micro_batch != mb) break;
      if (o.micro_batch < 0 && o.type == OpType::wait) break;
      ++e;
    }
    // The backward starts at its first backward op (the re-gathers of W's inputs with
    // sequence parallelism are issued before the dgrad GEMMs).
    size_t s0 = i;
    while (s0 > 0 && ops[s0 - 1].micro_batch == mb && ops[s0 - 1].phase == Phase::backward) --s0;
    std::vector<size_t> g;
    std::vector<int> handles;
    for (size_t j = s0; j <= e; ++j) {
      const Op& o = ops[j];
      const std::string_view name = o.name;
      const bool mine = o.micro_batch == mb || o.micro_batch < 0;
      // W: the weight-gradient ops, the re-gathers of their inputs (tp_allgather_input) and
      // the embedding's TP AllGather of its output gradient (SP), as BackwardPart::weight.
      const bool w = o.micro_batch == mb &&
                     (is_w(o) || (name == "tp_allgather_input" && o.type != OpType::wait) ||
                      (name == "tp_allgather" && o.layer < 0 && j + 1 < n &&
                       std::string_view(ops[j + 1].name) == "embedding_bwd"));
      if (w || (j >= i && is_dp_grad(o) && mine)) {
        g.push_back(j);
        if (o.type == OpType::issue) handles.push_back(o.handle);
      } else if (o.type == OpType::wait && std::find(handles.begin(), handles.end(), o.handle) != handles.end()) {
        g.push_back(j);
      }
    }
    for (size_t j : g) taken[j] = 1;
    groups.push_back(std::move(g));
    end_of.push_back(e);
  }
  // Insertion point of each group: after the next forward following its backward, i.e.
  // before the first op after end_of that belongs to another micro-batch's backward or to
  // the end of the step.
  std::vector<std::vector<size_t>> before(n + 1);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const int mb = ops[groups[gi].back()].micro_batch >= 0 ? ops[groups[gi].back()].micro_batch
                                                           : ops[groups[gi].front()].micro_batch;
    size_t at = end_of[gi] + 1;
    int other = mb, passed = 0;  // the other micro-batch's backward being passed
    while (at < n) {
      const Op& o = ops[at];
      if (o.phase == Phase::optimizer || (o.micro_batch < 0 && o.type == OpType::wait)) break;
      if (o.phase == Phase::backward && o.micro_batch >= 0 && o.micro_batch != mb && o.micro_batch != other) {
        if (passed++ == past) break;
        other = o.micro_batch;
      }
      ++at;
    }
    before[at].push_back(gi);
  }
  std::vector<Op> out;
  for (size_t i = 0; i <= n; ++i) {
    for (size_t gi : before[i])
      for (size_t j : groups[gi]) {
        out.push_back(ops[j]);
        if (!is_dp_grad(ops[j])) out.back().pass = Pass::W;
        ++*moved;
      }
    if (i < n && !taken[i]) out.push_back(ops[i]);
  }
  return out;
}

StepPlan deferred(StepPlan plan, int64_t* moved, int past = 0) {
  for (auto& st : plan.stages) st.ops = defer_w(st.ops, past, moved);
  return plan;
}

/// Position of the first op of `stage` named `name` (micro-batch mb), or -1.
int64_t find_op(const StepPlan& p, size_t stage, const char* name, int mb) {
  const auto& ops = p.stages[stage].ops;
  for (size_t i = 0; i < ops.size(); ++i)
    if (std::string_view(ops[i].name) == name && ops[i].micro_batch == mb) return static_cast<int64_t>(i);
  return -1;
}

TEST(VerifySchedules, DeferredWeightGradientsPass) {
  for (const Layout2& c : {Layout2{}, Layout2{.dp = 2, .tp = 2, .zero = 1}, Layout2{.tp = 2, .llama = true},
                           Layout2{.dp = 2, .pp = 4}, Layout2{.dp = 2, .tp = 2, .zero = 1, .sp = true, .llama = true},
                           Layout2{.tp = 2, .pp = 4, .sp = true}}) {
    const StepPlan base = build_step_plan(make(c));
    int64_t moved = 0;
    const StepPlan plan = deferred(base, &moved);
    // W after the next micro-batch's backward as well (ZB-H2 defers that far): the
    // embedding's output gradient must outlive the backward chain.
    const StepPlan later = deferred(base, &moved, 1);
    EXPECT_TRUE(verify_plan(later, {.steps = 2}).passed()) << describe(verify_plan(later, {.steps = 1}));
    ASSERT_GT(moved, 0);
    // The W of micro-batch 0 on the last stage now follows the next micro-batch's forward.
    const size_t last = plan.stages.size() - 1;
    const int64_t w0 = find_op(plan, last, "qkv_wgrad", 0), b0 = find_op(plan, last, "qkv_dgrad", 0);
    ASSERT_GE(w0, 0);
    ASSERT_GE(b0, 0);
    bool forward_between = false;
    for (int64_t i = b0; i < w0; ++i)
      forward_between = forward_between || plan.stages[last].ops[static_cast<size_t>(i)].phase == Phase::forward;
    EXPECT_TRUE(forward_between) << "the test's reorder did not defer W past a forward";
    const VerifyReport r = verify_plan(plan, {.steps = 2});
    EXPECT_TRUE(r.passed()) << describe(r);
    const VerifyReport one = verify_plan(plan, {.steps = 2, .threads = 1});
    EXPECT_TRUE(one.passed()) << describe(one);
  }
}

TEST(VerifySchedules, AWeightGradientBeforeItsBackwardFails) {
  for (const Layout2& c : {Layout2{}, Layout2{.dp = 2, .tp = 2, .zero = 1}}) {
    int64_t moved = 0;
    const StepPlan plan = deferred(build_step_plan(make(c)), &moved);
    const VerifyReport r = verify_plan(plan, {.steps = 1, .inject = Injection::w_before_b});
    EXPECT_FALSE(r.passed());
    const RuleResult& p = r.rule("plan");
    EXPECT_FALSE(p.passed) << describe(r);
    ASSERT_FALSE(p.problems.empty());
    EXPECT_NE(p.problems.front().find("_wgrad"), std::string::npos) << p.problems.front();
    EXPECT_NE(p.problems.front().find("which no earlier op produced"), std::string::npos) << p.problems.front();
  }
}

TEST(VerifySchedules, ADroppedWeightGradientFails) {
  for (const Layout2& c : {Layout2{}, Layout2{.dp = 2, .tp = 2, .zero = 1}}) {
    int64_t moved = 0;
    const StepPlan plan = deferred(build_step_plan(make(c)), &moved);
    const VerifyReport r = verify_plan(plan, {.steps = 1, .inject = Injection::drop_w});
    EXPECT_FALSE(r.passed()) << describe(r);
    // The gradient misses one micro-batch's contribution: parameters and Adam moments differ.
    bool failed_values = false;
    for (const auto& x : r.rules) failed_values = failed_values || (x.applicable && !x.passed && x.name != "plan");
    EXPECT_TRUE(failed_values) << describe(r);
  }
}

// ---- DualPipe: every layer on two pipeline ranks ----
/// DualPipe on pp = 2, by hand from a 1F1B plan with 4 micro-batches (DeepSeek-V3 Sec
/// 3.2.1: rank r holds stage r's layers as chunk 0 and stage pp - 1 - r's as chunk 1, the
/// second half of the micro-batches enters at rank pp - 1): micro-batches 0 and 1 run as
/// planned; the ops of micro-batches 2 and 3 of stage s move to stage 1 - s as chunk 1
/// (P2P peers swapped, issue handles renumbered), so rank 1 runs their embedding and first
/// layers and rank 0 their last layers and loss. Each rank then holds every parameter; with
/// `sum` a dualpipe_grad_allreduce before optimizer_adam sums the two copies' gradients.
StepPlan dualpipe2(const StepPlan& p, bool sum) {
  StepPlan out = p;
  const double params = p.stages[0].params_per_rank + p.stages[1].params_per_rank;
  for (size_t s = 0; s < 2; ++s) {
    std::vector<Op> ops, tail;
    for (const Op& op : p.stages[s].ops) {
      if (op.micro_batch < 0 || op.phase == Phase::optimizer)
        tail.push_back(op);
      else if (op.micro_batch < 2)
        ops.push_back(op);
    }
    for (const Op& op : p.stages[1 - s].ops) {
      if (op.micro_batch < 2 || op.phase == Phase::optimizer) continue;
      Op o = op;
      o.chunk = 1;
      if (o.type == OpType::send || o.type == OpType::recv) o.peer_stage = static_cast<int32_t>(1 - s);
      if (o.handle >= 0) o.handle += 100000;
      ops.push_back(o);
    }
    auto adam = std::find_if(tail.begin(), tail.end(),
                             [](const Op& o) { return std::string_view(o.name) == "optimizer_adam"; });
    if (sum) {
      Op m;
      m.type = OpType::collective;
      m.name = "dualpipe_grad_allreduce";
      m.phase = Phase::optimizer;
      m.kind = CommKind::PP;
      m.collective = Collective::AllReduce;
      m.reduce = ReduceOp::sum;
      m.group = GroupKind::MIRROR;  // pipeline ranks r and pp - 1 - r
      m.size_bytes = params * static_cast<double>(p.shape.grad_bytes_per_param);
      adam = tail.insert(adam, m);
    }
    ops.insert(ops.end(), tail.begin(), tail.end());
    out.stages[s].ops = std::move(ops);
    out.stages[s].params_per_rank = params;
    out.stages[s].optimizer_params = params;
  }
  return out;
}

TEST(VerifySchedules, DualPipeLayersOnTwoRanksSumTheirGradients) {
  const StepPlan base = build_step_plan(make({}));
  ASSERT_EQ(base.shape.micro_batches, 4);
  const VerifyReport r = verify_plan(dualpipe2(base, true), {.steps = 2});
  EXPECT_TRUE(r.passed()) << describe(r);
  EXPECT_GT(r.rule("PP").values, 0);
  // Without the sum each copy of a layer is updated with its own half of the gradient.
  const VerifyReport bad = verify_plan(dualpipe2(base, false), {.steps = 1});
  EXPECT_FALSE(bad.passed()) << describe(bad);
}

}  // namespace
}  // namespace dtsim::verify
