#pragma once
// A tiny double-precision reference for the training math that dtsim's plans encode
// (design/MATH.md sections 1-3 and the worked numbers of section 6). It runs nothing
// of the simulator; it exists so that the rules (which collective, which reduce op,
// where the optimizer runs) are checked on numbers small enough to do by hand.
//
// Shapes: a Matrix is row-major, m[i][j] = row i, column j; every row has the same length.
// A "batch" matrix has one sample per row (X: B x in, Y: B x out, W: in x out, Yh = X W).
// Functions throw dtsim::InputError on mismatched shapes.
#include <cstdint>
#include <vector>

namespace dtsim::refmath {

using Matrix = std::vector<std::vector<double>>;
using Vector = std::vector<double>;

int64_t rows(const Matrix& a);
int64_t cols(const Matrix& a);
/// (m x n) @ (n x p) -> m x p.
Matrix matmul(const Matrix& a, const Matrix& b);
Matrix transpose(const Matrix& a);
Matrix add(const Matrix& a, const Matrix& b);
Matrix scale(const Matrix& a, double k);
/// Rows [begin, end) of a.
Matrix row_slice(const Matrix& a, int64_t begin, int64_t end);
/// Columns [begin, end) of a.
Matrix col_slice(const Matrix& a, int64_t begin, int64_t end);
/// [a | b] side by side (same row count).
Matrix hconcat(const Matrix& a, const Matrix& b);

/// L = sum((Yh - Y)^2) / (2B), B = rows (the sample mean of half squared errors).
double mse_loss(const Matrix& yhat, const Matrix& y);
/// dL/dYh = (Yh - Y) / B.
Matrix mse_loss_grad(const Matrix& yhat, const Matrix& y);

/// Backward of Y = X W (MATH.md 1: dA = dC B^T, dB = A^T dC).
struct LinearGrads {
  Matrix dW;  // X^T dY, in x out: already sums the batch
  Matrix dX;  // dY W^T, B x in
};
LinearGrads linear_backward(const Matrix& x, const Matrix& w, const Matrix& dy);

/// One step of y = XW, MSE loss, backward: Yh, dYh, dW, loss.
struct LinearMseStep {
  Matrix yhat, dyhat, dW;
  double loss = 0;
};
LinearMseStep linear_mse_step(const Matrix& x, const Matrix& w, const Matrix& y);

/// w - lr * g.
Matrix sgd_step(const Matrix& w, const Matrix& g, double lr);
Vector sgd_step(const Vector& w, const Vector& g, double lr);

/// Adam (Kingma & Ba 2015, Algorithm 1; MATH.md 3): m = b1 m + (1-b1) g,
/// v = b2 v + (1-b2) g^2, m^ = m/(1-b1^t), v^ = v/(1-b2^t), w -= lr m^/(sqrt(v^)+eps).
struct AdamState {
  Vector m, v;    // zero-initialised on first use
  int64_t t = 0;  // steps taken
};
struct AdamHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};
struct AdamStepResult {
  Vector params;     // updated parameters
  Vector m_hat;      // bias-corrected first moment
  Vector v_hat;      // bias-corrected second moment
  Vector direction;  // m^ / (sqrt(v^) + eps); params = old - lr * direction
};
/// Advances `state` by one step (state.t += 1) and returns the new parameters.
AdamStepResult adam_step(const Vector& params, const Vector& grad, AdamState& state, const AdamHyper& hp);

/// Collectives over `n` ranks, each holding an equal-length vector (rank-major input).
/// max: element-wise maximum (the vocab-parallel cross entropy's logit maximum).
enum class ReduceOp { sum, avg, max };
/// Every rank receives the element-wise reduction.
std::vector<Vector> all_reduce(const std::vector<Vector>& per_rank, ReduceOp op);
/// Rank r receives the reduction of chunk r (length must divide by n).
std::vector<Vector> reduce_scatter(const std::vector<Vector>& per_rank, ReduceOp op);
/// Every rank receives the concatenation of all ranks' chunks, in rank order.
std::vector<Vector> all_gather(const std::vector<Vector>& chunks);

/// Column-parallel linear layer (Megatron, Shoeybi et al. 2019 Sec 3): W (in x out) split
/// by output columns into `tp` equal shards W_i; rank i computes y_i = x W_i. Backward with
/// upstream dy (split the same way): dW_i = x^T dy_i (a distinct shard: never averaged over
/// TP), partial dx_i = dy_i W_i^T, and dx = SUM_i dx_i (an AllReduce SUM over TP, not AVG).
struct ColumnParallelResult {
  std::vector<Matrix> y_shards;   // B x out/tp each
  Matrix y;                       // shards concatenated: equals x W
  std::vector<Matrix> dW_shards;  // in x out/tp each
  std::vector<Matrix> dx_partial; // B x in each
  Matrix dx;                      // sum of partials: equals dy W^T
};
ColumnParallelResult column_parallel_linear(const Matrix& x, const Matrix& w, const Matrix& dy, int64_t tp);

}  // namespace dtsim::refmath
