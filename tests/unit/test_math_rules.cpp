// The worked numbers of design/MATH.md section 6 (items 1-5), carried here verbatim,
// plus the two collective/optimizer rules of sections 2-3:
//  1. X=[[1,2],[3,4]], W=[[2],[-1]], Y=[[1],[3]], L = sum((Yh-Y)^2)/(2B):
//     Yh=[[0],[2]], dYh=[[-0.5],[-0.5]], dW=[[-2],[-3]]; SGD lr 0.1 -> W=[[2.2],[-0.7]].
//  2. DP over 2 ranks: local dW [[-1],[-2]] and [[-3],[-4]], mean [[-2],[-3]].
//  3. L=(100x^2+y^2)/2 at [1,1]: grad [100,1]; SGD lr 0.1 -> [-9,0.9]; Adam step 1:
//     m^=[100,1], v^=[10000,1], m^/sqrt(v^)=[1,1].
//  4. TP column split of W=[[1,3],[2,4]], x=[1,2]: y=[5,11]; dy=[1,2]: dW0=[[1],[2]],
//     dW1=[[2],[4]], partial dx [1,2] and [6,8], summed [7,10] = dy W^T.
//  5. 1M/128K = 7.8, attention cost ratio 7.8^2 ~ 61.
//  AllReduce = ReduceScatter + AllGather (SUM and AVG); Adam after sync != average of
//  local Adam steps (((g0+g1)/2)^2 != (g0^2+g1^2)/2).
#include <gtest/gtest.h>

#include <cmath>

#include "models/flops.hpp"
#include "models/reference_math.hpp"

namespace dtsim {
namespace {

using namespace refmath;

// Values here are small dyadic rationals or results of a few operations: 1e-12 is exact
// to the printed digits.
constexpr double kTol = 1e-12;

void expect_matrix(const Matrix& got, const Matrix& want) {
  ASSERT_EQ(rows(got), rows(want));
  ASSERT_EQ(cols(got), cols(want));
  for (size_t i = 0; i < want.size(); ++i)
    for (size_t j = 0; j < want[i].size(); ++j)
      EXPECT_NEAR(got[i][j], want[i][j], kTol) << "[" << i << "][" << j << "]";
}

void expect_vector(const Vector& got, const Vector& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], kTol) << "[" << i << "]";
}

const Matrix kX = {{1, 2}, {3, 4}};
const Matrix kW = {{2}, {-1}};
const Matrix kY = {{1}, {3}};

TEST(MathRules, Item1LinearMseAndSgd) {
  const LinearMseStep st = linear_mse_step(kX, kW, kY);
  expect_matrix(st.yhat, {{0}, {2}});
  expect_matrix(st.dyhat, {{-0.5}, {-0.5}});
  expect_matrix(st.dW, {{-2}, {-3}});
  EXPECT_NEAR(st.loss, 0.5, kTol);  // ((0-1)^2 + (2-3)^2) / (2*2)
  expect_matrix(sgd_step(kW, st.dW, 0.1), {{2.2}, {-0.7}});
  // The chain rule pieces: dW = X^T dYh already sums the batch; dX = dYh W^T.
  const LinearGrads g = linear_backward(kX, kW, st.dyhat);
  expect_matrix(g.dW, matmul(transpose(kX), st.dyhat));
  expect_matrix(g.dX, {{-1, 0.5}, {-1, 0.5}});
}

TEST(MathRules, Item2DataParallelMeanOfLocalGradients) {
  // Each rank gets one sample and takes its local mean (B = 1).
  const LinearMseStep r0 = linear_mse_step(row_slice(kX, 0, 1), kW, row_slice(kY, 0, 1));
  const LinearMseStep r1 = linear_mse_step(row_slice(kX, 1, 2), kW, row_slice(kY, 1, 2));
  expect_matrix(r0.dW, {{-1}, {-2}});
  expect_matrix(r1.dW, {{-3}, {-4}});
  // AllReduce AVG of equal-size local means = the global-batch gradient.
  const auto avg = all_reduce({{r0.dW[0][0], r0.dW[1][0]}, {r1.dW[0][0], r1.dW[1][0]}}, ReduceOp::avg);
  expect_vector(avg[0], {-2, -3});
  expect_vector(avg[1], {-2, -3});
  const LinearMseStep full = linear_mse_step(kX, kW, kY);
  expect_vector(avg[0], {full.dW[0][0], full.dW[1][0]});
  // SUM without dividing by DP would double the step: the reduce op matters.
  const auto sum = all_reduce({{-1, -2}, {-3, -4}}, ReduceOp::sum);
  expect_vector(sum[0], {-4, -6});
}

TEST(MathRules, Item3SgdAndAdamOnIllConditionedQuadratic) {
  const Vector p = {1, 1};
  const Vector grad = {100 * p[0], p[1]};  // dL/dx = 100x, dL/dy = y
  expect_vector(grad, {100, 1});
  expect_vector(sgd_step(p, grad, 0.1), {-9, 0.9});
  AdamState st;
  AdamHyper hp;
  hp.lr = 0.1;
  hp.eps = 0;  // the article's m^/sqrt(v^)
  const AdamStepResult r = adam_step(p, grad, st, hp);
  EXPECT_EQ(st.t, 1);
  expect_vector(r.m_hat, {100, 1});
  EXPECT_NEAR(r.v_hat[0], 10000, 1e-9);  // 0.001*1e4/0.001: rounding of 1 - 0.999 at 1e-13
  EXPECT_NEAR(r.v_hat[1], 1, kTol);
  expect_vector(r.direction, {1, 1});
  expect_vector(r.params, {0.9, 0.9});  // both coordinates move by lr: scale-free
  // With the default eps = 1e-8 the direction is 1 - O(1e-8).
  AdamState st2;
  hp.eps = 1e-8;
  EXPECT_NEAR(adam_step(p, grad, st2, hp).direction[1], 1.0, 1e-7);
}

TEST(MathRules, Item4TensorParallelColumnSplit) {
  const Matrix W = {{1, 3}, {2, 4}};
  const Matrix x = {{1, 2}};
  const Matrix dy = {{1, 2}};
  const ColumnParallelResult r = column_parallel_linear(x, W, dy, 2);
  expect_matrix(r.y, {{5, 11}});
  expect_matrix(r.y, matmul(x, W));
  ASSERT_EQ(r.dW_shards.size(), 2u);
  expect_matrix(r.dW_shards[0], {{1}, {2}});
  expect_matrix(r.dW_shards[1], {{2}, {4}});
  expect_matrix(r.dx_partial[0], {{1, 2}});
  expect_matrix(r.dx_partial[1], {{6, 8}});
  expect_matrix(r.dx, {{7, 10}});                   // SUM over TP, never divided
  expect_matrix(r.dx, matmul(dy, transpose(W)));  // = dy W^T
  // The shards together are the unsplit weight gradient x^T dy.
  expect_matrix(hconcat(r.dW_shards[0], r.dW_shards[1]), matmul(transpose(x), dy));
}

TEST(MathRules, Item5ContextLengthRatio) {
  // The article divides decimally: 1,000,000 / 128,000 = 7.8125 ("7.8"), squared 61.04 ("~61").
  const double ratio = 1'000'000.0 / 128'000.0;
  EXPECT_DOUBLE_EQ(ratio, 7.8125);
  EXPECT_NEAR(ratio, 7.8, 0.05);
  EXPECT_NEAR(ratio * ratio, 61.0, 0.05);
  // Binary K/M (2^20 / 2^17) would give exactly 8 and 64: the article's 7.8 is the decimal reading.
  const double binary = double(1 << 20) / double(1 << 17);
  EXPECT_DOUBLE_EQ(binary, 8.0);
  EXPECT_DOUBLE_EQ(binary * binary, 64.0);
  // Our attention FLOPs scale as T^2 while weight GEMMs scale as T (weights depend on D, not T).
  ModelSpec m;
  m.layers = 1;
  m.hidden = 4096;
  m.heads = 32;
  m.kv_heads = 8;
  m.ffn_hidden = 14336;
  m.vocab = 128256;
  m.activation = Activation::swiglu;
  m.norm = Norm::rmsnorm;
  m.position = Position::rope;
  const ForwardFlops a = layer_forward_flops(m, 1, 128'000, 128'000);
  const ForwardFlops b = layer_forward_flops(m, 1, 1'000'000, 1'000'000);
  EXPECT_NEAR(b.attention_scores / a.attention_scores, ratio * ratio, 1e-9);
  EXPECT_NEAR(b.mlp_up / a.mlp_up, ratio, 1e-12);
  EXPECT_EQ(layer_parameters(m), layer_parameters(m));  // no T in the parameter count
}

TEST(MathRules, AllReduceEqualsReduceScatterPlusAllGather) {
  const std::vector<Vector> per_rank = {{1, 2, 3, 4, 5, 6}, {10, 20, 30, 40, 50, 60}, {-1, 0, 1, 2, 3, 4}};
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    const auto ar = all_reduce(per_rank, op);
    const auto rs = reduce_scatter(per_rank, op);
    ASSERT_EQ(rs.size(), 3u);
    EXPECT_EQ(rs[0].size(), 2u);  // each rank owns 1/n of the result
    const auto ag = all_gather(rs);
    for (size_t r = 0; r < per_rank.size(); ++r) expect_vector(ag[r], ar[r]);
  }
  expect_vector(all_reduce(per_rank, ReduceOp::sum)[1], {10, 22, 34, 46, 58, 70});
  expect_vector(all_reduce(per_rank, ReduceOp::avg)[2], {10.0 / 3, 22.0 / 3, 34.0 / 3, 46.0 / 3, 58.0 / 3, 70.0 / 3});
}

TEST(MathRules, AdamMustRunAfterGradientSync) {
  // Two DP ranks with local gradients of opposite sign on one parameter.
  const double g0 = 1.0, g1 = -3.0;
  EXPECT_NE(((g0 + g1) / 2) * ((g0 + g1) / 2), (g0 * g0 + g1 * g1) / 2);  // 1 vs 5
  AdamHyper hp;
  hp.lr = 0.1;
  hp.eps = 0;
  // Correct: AllReduce AVG the gradient, then one Adam step with the mean gradient.
  AdamState synced;
  const AdamStepResult good = adam_step({0.0}, {(g0 + g1) / 2}, synced, hp);
  EXPECT_NEAR(synced.v[0] / (1 - hp.beta2), 1.0, 1e-9);  // v^ = ((g0+g1)/2)^2
  expect_vector(good.params, {0.1});
  // Wrong: each rank steps Adam on its own gradient, then parameters are averaged.
  AdamState s0, s1;
  const AdamStepResult l0 = adam_step({0.0}, {g0}, s0, hp);
  const AdamStepResult l1 = adam_step({0.0}, {g1}, s1, hp);
  const double averaged = (l0.params[0] + l1.params[0]) / 2;
  EXPECT_NEAR(averaged, 0.0, kTol);  // -0.1 and +0.1 cancel
  EXPECT_GT(std::fabs(averaged - good.params[0]), 0.09);
  // Averaged second moments (g0^2+g1^2)/2 = 5 differ from the synced 1.
  EXPECT_NEAR((s0.v[0] + s1.v[0]) / 2 / (1 - hp.beta2), 5.0, 1e-9);
}

}  // namespace
}  // namespace dtsim
