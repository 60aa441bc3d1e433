// `dtsim explain`: the judgment tables printed from the step plan (reports/explain.hpp).
// Rules checked here are the design source's (MATH.md sections 1, 2, 5 and 6, carried into
// models/plan.hpp): TP=2, DP=2 on 4 GPUs gives TP groups [0,1], [2,3] and DP groups [0,2],
// [1,3]; TP reductions are SUMs and never touch weight gradients; DP gradients are AVG over
// DP x CP, and with unequal valid tokens the exact rule is SUM of token sums / global count.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "models/experiment_io.hpp"
#include "models/memory.hpp"
#include "models/plan.hpp"
#include "models/reference_math.hpp"
#include "reports/explain.hpp"

namespace dtsim {
namespace {

namespace fs = std::filesystem;

// A small GPT: 4 layers, h=256, 8 heads, ffn 4h, vocab 1024, seq 128, on `gpus` GPUs of one node.
Experiment small(const std::string& layout, int gpus, const std::string& training_extra = "") {
  const std::string yaml =
      "title: small\n"
      "model: {name: tiny, layers: 4, hidden: 256, heads: 8, kv_heads: 8, ffn_hidden: 1024, activation: gelu,\n"
      "        vocab: 1024, tied_embeddings: false, norm: layernorm, position: learned}\n"
      "cluster: {node: dgx-a100, nodes: 1, gpus_per_node: " + std::to_string(gpus) + ", nics_per_node: " +
      std::to_string(gpus) + "}\n"
      "layout: " + layout + "\n"
      "training: {seq_len: 128, global_batch: 8, micro_batch: 2, dtype: bf16, flash_attention: true,\n"
      "           overlap_grad_reduce: true, framework: megatron" + training_extra + "}\n";
  return parse_experiment(yaml, "small.yaml");
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

/// The first line of section 5 (rank grid) that starts with "  <kind> ".
std::string grid_line(const std::string& text, const std::string& kind) {
  bool in_grid = false;
  for (const auto& l : lines(text)) {
    if (l.rfind("5. Rank grid", 0) == 0) in_grid = true;
    else if (!l.empty() && l[0] != ' ') in_grid = false;
    if (in_grid && l.rfind("  " + kind + " ", 0) == 0) return l;
  }
  return "";
}

constexpr double kActBytes = 2.0 * 2 * 128 * 256;  // bf16 x b=2 x s=128 x h=256
constexpr double kLossBytes = 4.0 * 2 * 128;       // fp32 per token

TEST(ExplainGrid, Tp2Dp2On4GpusPrintsMathMdGroups) {
  const Experiment e = small("{dp: 2, tp: 2, pp: 1, zero_stage: 0, sequence_parallel: false, recompute: none}", 4);
  const std::string text = format_explain(e, build_step_plan(e));
  EXPECT_NE(grid_line(text, "TP").find("[0,1], [2,3]"), std::string::npos) << text;
  EXPECT_NE(grid_line(text, "DP").find("[0,2], [1,3]"), std::string::npos) << text;
  EXPECT_NE(grid_line(text, "CP").find("size 1"), std::string::npos);
  EXPECT_NE(grid_line(text, "PP").find("size 1"), std::string::npos);
  // The op table names the first group of each collective.
  for (const auto& r : explain_comm_rows(build_step_plan(e))) {
    if (r.dimension == "TP") {
      EXPECT_EQ(r.first_group, (std::vector<int64_t>{0, 1})) << r.op;
    }
    if (r.dimension == "DP") {
      EXPECT_EQ(r.first_group, (std::vector<int64_t>{0, 2})) << r.op;
    }
  }
}

TEST(ExplainRules, TpGradientsAreNeverAveraged) {
  for (const char* sp : {"false", "true"}) {
    const Experiment e = small(fmt::format("{{dp: 2, tp: 2, pp: 2, zero_stage: 1, sequence_parallel: {}, recompute: none}}", sp), 8);
    const StepPlan plan = build_step_plan(e);
    int64_t tp_reducing = 0;
    for (const auto& r : explain_comm_rows(plan)) {
      if (r.dimension != "TP") continue;
      EXPECT_NE(r.reduce, ReduceOp::avg) << r.op;
      if (r.reduce == ReduceOp::none) continue;
      ++tp_reducing;
      // What TP reduces is activations (partial outputs, input grads) or fp32 loss statistics,
      // never a weight-gradient buffer (a layer's grads on one TP rank are ~1.6 MB here); with
      // SP also the small sum of the norm / row-parallel-bias gradients each rank computed on
      // its sequence shard (Megatron _allreduce_layernorm_grads), far below a layer's grads.
      if (r.op == "tp_sp_grad_allreduce")
        EXPECT_LT(r.size_max, kActBytes) << r.op;
      else
        EXPECT_TRUE(r.size_max == kActBytes || r.size_max == kLossBytes) << r.op << " " << r.size_max;
      EXPECT_EQ(r.group, GroupKind::TP);
    }
    EXPECT_GT(tp_reducing, 0);
    const std::string text = format_explain(e, plan);
    EXPECT_NE(text.find("never reduced, never\n          averaged over TP"), std::string::npos);
    EXPECT_NE(text.find(" 0 with AVG."), std::string::npos) << text;
  }
  // MATH.md 6.4 on numbers: column split of W = [[1,3],[2,4]], x = [1,2], dy = [1,2]. The
  // weight-gradient shards are distinct columns of dW (averaging them over TP would mix two
  // different parameters); the input gradient is the SUM of the partials.
  const refmath::Matrix x = {{1, 2}}, w = {{1, 3}, {2, 4}}, dy = {{1, 2}};
  const auto cp = refmath::column_parallel_linear(x, w, dy, 2);
  EXPECT_EQ(cp.dW_shards[0], (refmath::Matrix{{1}, {2}}));
  EXPECT_EQ(cp.dW_shards[1], (refmath::Matrix{{2}, {4}}));
  EXPECT_EQ(refmath::hconcat(cp.dW_shards[0], cp.dW_shards[1]), refmath::matmul(refmath::transpose(x), dy));
  EXPECT_EQ(cp.dx, (refmath::Matrix{{7, 10}}));
  EXPECT_EQ(refmath::add(cp.dx_partial[0], cp.dx_partial[1]), cp.dx);
}

TEST(ExplainRules, DpGradientsAreAvgOverDpTimesCp) {
  const Experiment e = small("{dp: 2, tp: 2, cp: 2, pp: 1, zero_stage: 0, sequence_parallel: true, recompute: none}", 8);
  const StepPlan plan = build_step_plan(e);
  int64_t dp_reductions = 0;
  for (const auto& r : explain_comm_rows(plan)) {
    if (r.dimension != "DP" && r.dimension != "ZeRO") continue;
    if (r.reduce == ReduceOp::none) continue;
    ++dp_reductions;
    EXPECT_EQ(r.reduce, ReduceOp::avg) << r.op;
    EXPECT_EQ(r.group, GroupKind::DPxCP) << r.op;
    // rank = tp + 2 (cp + 2 dp): the ranks of rank 0's weights are 0, 2, 4, 6.
    EXPECT_EQ(r.first_group, (std::vector<int64_t>{0, 2, 4, 6})) << r.op;
  }
  EXPECT_GT(dp_reductions, 0);
  const std::string text = format_explain(e, plan);
  EXPECT_NE(text.find("SUM of per-rank token-gradient sums / global N_valid"), std::string::npos) << text;
  EXPECT_NE(text.find("DP x CP = 4, group [0,2,4,6]"), std::string::npos) << text;
  EXPECT_NE(grid_line(text, "DPxCP").find("[0,2,4,6]"), std::string::npos) << text;
}

TEST(ExplainRules, UnequalValidTokensNeedSumOfTokenSumsOverGlobalCount) {
  // Four valid tokens of a linear model y = x W, loss = mean over valid tokens of (yh - y)^2 / 2.
  // Rank 0 holds 3 valid tokens, rank 1 holds 1 (the rest of its micro-batch is padding).
  using refmath::Matrix;
  const Matrix X = {{1, 2}, {3, 4}, {0, 1}, {2, 0}}, W = {{2}, {-1}}, Y = {{1}, {3}, {0}, {5}};
  const Matrix full = refmath::linear_mse_step(X, W, Y).dW;  // the single-device gradient
  const refmath::LinearMseStep r0 = refmath::linear_mse_step(refmath::row_slice(X, 0, 3), W, refmath::row_slice(Y, 0, 3));
  const refmath::LinearMseStep r1 = refmath::linear_mse_step(refmath::row_slice(X, 3, 4), W, refmath::row_slice(Y, 3, 4));
  // Each rank's local mean gradient, and its token sum = local mean x local count.
  const std::vector<refmath::Vector> means = {{r0.dW[0][0], r0.dW[1][0]}, {r1.dW[0][0], r1.dW[1][0]}};
  const std::vector<refmath::Vector> sums_and_counts = {{3 * r0.dW[0][0], 3 * r0.dW[1][0], 3.0},
                                                        {1 * r1.dW[0][0], 1 * r1.dW[1][0], 1.0}};
  // Right: AllReduce SUM of [token-gradient sums, valid count], then divide by the global count.
  const refmath::Vector s = refmath::all_reduce(sums_and_counts, refmath::ReduceOp::sum)[0];
  EXPECT_DOUBLE_EQ(s[2], 4.0);
  EXPECT_NEAR(s[0] / s[2], full[0][0], 1e-12);  // exact up to rounding of a few additions
  EXPECT_NEAR(s[1] / s[2], full[1][0], 1e-12);
  // Wrong with unequal counts: AVG of the local means.
  const refmath::Vector avg = refmath::all_reduce(means, refmath::ReduceOp::avg)[0];
  EXPECT_GT(std::abs(avg[0] - full[0][0]), 0.1);
  // The loss itself, as the explain text states: {1,2,3} and {4} -> 10/4 = 2.5, not (2+4)/2 = 3.
  EXPECT_DOUBLE_EQ((1.0 + 2 + 3 + 4) / 4, 2.5);
  EXPECT_DOUBLE_EQ(((1.0 + 2 + 3) / 3 + 4.0 / 1) / 2, 3.0);
}

TEST(ExplainCommRows, CallsAndBytesAreThePlans) {
  const Experiment e = small("{dp: 2, tp: 2, pp: 2, zero_stage: 0, sequence_parallel: true, recompute: selective}", 8);
  const StepPlan plan = build_step_plan(e);
  const auto rows = explain_comm_rows(plan);
  for (const StagePlan& st : plan.stages) {
    int64_t comm_ops = 0, from_rows = 0;
    for (const Op& op : st.ops)
      if (op.type != OpType::compute && op.type != OpType::wait) ++comm_ops;
    for (const auto& r : rows) from_rows += r.calls_per_stage[static_cast<size_t>(st.stage)];
    EXPECT_EQ(from_rows, comm_ops) << "stage " << st.stage;
  }
  for (const auto& r : rows) {
    EXPECT_EQ(r.critical_path(), r.type == OpType::collective && r.overlap_splits == 0);
    if (r.dimension == "PP") {
      // P2P, or the tied word embedding's gradient AllReduce between the first and last stage.
      EXPECT_TRUE(r.type == OpType::send || r.type == OpType::recv || r.group == GroupKind::EMB) << r.op;
      // Stage 0 sends forward to stage 1's first rank: rank 0 -> rank tp*cp*dp = 4.
      if (r.op == "send_activation") {
        EXPECT_EQ(r.first_group, (std::vector<int64_t>{0, 4}));
      }
    }
  }
}

TEST(ExplainMemory, Gpt3SelectiveFormulasAndValues) {
  const fs::path file = fs::path(DTSIM_SOURCE_DIR) / "experiments" / "gpt3-175b-selective.yaml";
  const Experiment e = load_experiment(file.string());
  const std::string text = format_explain(e, build_step_plan(e));
  // Korthikanti Table 2, TP + SP + selective: 34sbh/t per layer.
  EXPECT_NE(text.find("34sbh/t with s = 2048, b = 1, h = 12288, a = 96, t = 8"), std::string::npos) << text;
  EXPECT_NE(text.find("Korthikanti 2022 Table 2, TP + SP, recompute selective"), std::string::npos);
  // Interleaved 1F1B, p = 8, v = 3: stage 0 holds p v + p - 1 = 31 chunks of 4 layers.
  EXPECT_NE(text.find("31x4L"), std::string::npos);
  // Every stage's peak is printed as models/memory.hpp computes it.
  const std::vector<MemoryBreakdown> mem = memory_per_stage(e);
  std::string peak_line;
  for (const auto& l : lines(text))
    if (l.rfind("  peak ", 0) == 0) peak_line = l;
  ASSERT_FALSE(peak_line.empty());
  for (const auto& mb : mem)
    EXPECT_NE(peak_line.find(fmt::format("{:.2f}", mb.peak_bytes / (1024.0 * 1024 * 1024))), std::string::npos) << peak_line;
  EXPECT_NE(text.find("megatron: 2 B params + 4 B fp32 main grads + 12 B optimizer"), std::string::npos);
}

TEST(ExplainMemory, GenericFormulaForGqaSwiGlu) {
  Experiment e = small("{dp: 1, tp: 2, pp: 1, zero_stage: 0, sequence_parallel: true, recompute: none}", 2);
  e.model.activation = Activation::swiglu;
  e.model.kv_heads = 2;
  const std::string text = format_explain(e, build_step_plan(e));
  EXPECT_NE(text.find("(10sbh + 4sbh + 4sb*kv + 6sbf)/t"), std::string::npos) << text;
  EXPECT_NE(text.find("kv = 64, f = 1024"), std::string::npos) << text;
}

TEST(ExplainCli, ExplainsTheShippedExperiment) {
  std::string tmpl = (fs::temp_directory_path() / "dtsim-explain-XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const fs::path dir = tmpl, out = dir / "out.txt";
  const fs::path file = fs::path(DTSIM_SOURCE_DIR) / "experiments" / "gpt3-175b-selective.yaml";
  const std::string cmd = std::string("'") + DTSIM_BINARY + "' explain '" + file.string() +
                          "' --set layout.dp=1 > '" + out.string() + "' 2>&1";
  const int status = std::system(cmd.c_str());
  std::ifstream in(out);
  std::stringstream ss;
  ss << in.rdbuf();
  fs::remove_all(dir);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << ss.str();
  for (const char* section : {"1. What each rank holds", "2. Every communication op", "3. One transformer layer",
                              "4. Gradient rules", "5. Rank grid", "6. Memory per rank"})
    EXPECT_NE(ss.str().find(section), std::string::npos) << section;
}

}  // namespace
}  // namespace dtsim
