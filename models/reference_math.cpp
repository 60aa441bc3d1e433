#include "models/reference_math.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "models/errors.hpp"

namespace dtsim::refmath {

namespace {

void check_rect(const Matrix& a, const char* what) {
  for (const auto& r : a)
    if (r.size() != a.front().size())
      throw InputError(std::string("reference_math: ") + what + " has rows of different lengths");
}

void check_same_shape(const Matrix& a, const Matrix& b, const char* what) {
  check_rect(a, what);
  check_rect(b, what);
  if (rows(a) != rows(b) || cols(a) != cols(b))
    throw InputError(std::string("reference_math: ") + what + ": shapes differ");
}

Matrix zeros(int64_t r, int64_t c) {
  return Matrix(static_cast<size_t>(r), Vector(static_cast<size_t>(c), 0.0));
}

void check_ranks(const std::vector<Vector>& per_rank, const char* what) {
  if (per_rank.empty()) throw InputError(std::string("reference_math: ") + what + ": no ranks");
  for (const auto& v : per_rank)
    if (v.size() != per_rank.front().size())
      throw InputError(std::string("reference_math: ") + what + ": ranks hold different lengths");
}

}  // namespace

int64_t rows(const Matrix& a) { return static_cast<int64_t>(a.size()); }
int64_t cols(const Matrix& a) { return a.empty() ? 0 : static_cast<int64_t>(a.front().size()); }

Matrix matmul(const Matrix& a, const Matrix& b) {
  check_rect(a, "matmul lhs");
  check_rect(b, "matmul rhs");
  if (cols(a) != rows(b))
    throw InputError("reference_math: matmul (" + std::to_string(rows(a)) + " x " +
                     std::to_string(cols(a)) + ") @ (" + std::to_string(rows(b)) + " x " +
                     std::to_string(cols(b)) + ")");
  Matrix c = zeros(rows(a), cols(b));
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t k = 0; k < b.size(); ++k)
      for (size_t j = 0; j < c[i].size(); ++j) c[i][j] += a[i][k] * b[k][j];
  return c;
}

Matrix transpose(const Matrix& a) {
  check_rect(a, "transpose");
  Matrix t = zeros(cols(a), rows(a));
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j) t[j][i] = a[i][j];
  return t;
}

Matrix add(const Matrix& a, const Matrix& b) {
  check_same_shape(a, b, "add");
  Matrix c = a;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j) c[i][j] += b[i][j];
  return c;
}

Matrix scale(const Matrix& a, double k) {
  Matrix c = a;
  for (auto& r : c)
    for (auto& x : r) x *= k;
  return c;
}

Matrix row_slice(const Matrix& a, int64_t begin, int64_t end) {
  if (begin < 0 || end > rows(a) || begin > end) throw InputError("reference_math: bad row slice");
  return Matrix(a.begin() + begin, a.begin() + end);
}

Matrix col_slice(const Matrix& a, int64_t begin, int64_t end) {
  check_rect(a, "col_slice");
  if (begin < 0 || end > cols(a) || begin > end) throw InputError("reference_math: bad column slice");
  Matrix c;
  for (const auto& r : a) c.emplace_back(r.begin() + begin, r.begin() + end);
  return c;
}

Matrix hconcat(const Matrix& a, const Matrix& b) {
  if (rows(a) != rows(b)) throw InputError("reference_math: hconcat of different row counts");
  Matrix c = a;
  for (size_t i = 0; i < a.size(); ++i) c[i].insert(c[i].end(), b[i].begin(), b[i].end());
  return c;
}

double mse_loss(const Matrix& yhat, const Matrix& y) {
  check_same_shape(yhat, y, "mse_loss");
  if (yhat.empty()) throw InputError("reference_math: mse_loss of an empty batch");
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i)
    for (size_t j = 0; j < y[i].size(); ++j) s += (yhat[i][j] - y[i][j]) * (yhat[i][j] - y[i][j]);
  return s / (2.0 * static_cast<double>(rows(y)));
}

Matrix mse_loss_grad(const Matrix& yhat, const Matrix& y) {
  check_same_shape(yhat, y, "mse_loss_grad");
  if (yhat.empty()) throw InputError("reference_math: mse_loss_grad of an empty batch");
  return scale(add(yhat, scale(y, -1.0)), 1.0 / static_cast<double>(rows(y)));
}

LinearGrads linear_backward(const Matrix& x, const Matrix& w, const Matrix& dy) {
  return {matmul(transpose(x), dy), matmul(dy, transpose(w))};
}

LinearMseStep linear_mse_step(const Matrix& x, const Matrix& w, const Matrix& y) {
  LinearMseStep s;
  s.yhat = matmul(x, w);
  s.loss = mse_loss(s.yhat, y);
  s.dyhat = mse_loss_grad(s.yhat, y);
  s.dW = linear_backward(x, w, s.dyhat).dW;
  return s;
}

Matrix sgd_step(const Matrix& w, const Matrix& g, double lr) { return add(w, scale(g, -lr)); }

Vector sgd_step(const Vector& w, const Vector& g, double lr) {
  if (w.size() != g.size()) throw InputError("reference_math: sgd_step sizes differ");
  Vector out = w;
  for (size_t i = 0; i < w.size(); ++i) out[i] -= lr * g[i];
  return out;
}

AdamStepResult adam_step(const Vector& params, const Vector& grad, AdamState& st, const AdamHyper& hp) {
  if (params.size() != grad.size()) throw InputError("reference_math: adam_step sizes differ");
  if (st.m.empty()) st.m.assign(params.size(), 0.0);
  if (st.v.empty()) st.v.assign(params.size(), 0.0);
  if (st.m.size() != params.size() || st.v.size() != params.size())
    throw InputError("reference_math: adam state size differs from params");
  st.t += 1;
  const double c1 = 1.0 - std::pow(hp.beta1, static_cast<double>(st.t));
  const double c2 = 1.0 - std::pow(hp.beta2, static_cast<double>(st.t));
  AdamStepResult r;
  r.params = params;
  r.m_hat.resize(params.size());
  r.v_hat.resize(params.size());
  r.direction.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    st.m[i] = hp.beta1 * st.m[i] + (1.0 - hp.beta1) * grad[i];
    st.v[i] = hp.beta2 * st.v[i] + (1.0 - hp.beta2) * grad[i] * grad[i];
    r.m_hat[i] = st.m[i] / c1;
    r.v_hat[i] = st.v[i] / c2;
    r.direction[i] = r.m_hat[i] / (std::sqrt(r.v_hat[i]) + hp.eps);
    r.params[i] -= hp.lr * r.direction[i];
  }
  return r;
}

std::vector<Vector> all_reduce(const std::vector<Vector>& per_rank, ReduceOp op) {
  check_ranks(per_rank, "all_reduce");
  if (op == ReduceOp::max) {
    Vector acc = per_rank.front();
    for (const auto& v : per_rank)
      for (size_t i = 0; i < v.size(); ++i) acc[i] = std::max(acc[i], v[i]);
    return std::vector<Vector>(per_rank.size(), acc);
  }
  Vector acc(per_rank.front().size(), 0.0);
  for (const auto& v : per_rank)
    for (size_t i = 0; i < v.size(); ++i) acc[i] += v[i];
  if (op == ReduceOp::avg)
    for (auto& x : acc) x /= static_cast<double>(per_rank.size());
  return std::vector<Vector>(per_rank.size(), acc);
}

std::vector<Vector> reduce_scatter(const std::vector<Vector>& per_rank, ReduceOp op) {
  check_ranks(per_rank, "reduce_scatter");
  const size_t n = per_rank.size(), len = per_rank.front().size();
  if (len % n != 0)
    throw InputError("reference_math: reduce_scatter length " + std::to_string(len) +
                     " is not divisible by " + std::to_string(n) + " ranks");
  const Vector full = all_reduce(per_rank, op).front();
  const size_t chunk = len / n;
  std::vector<Vector> out;
  for (size_t r = 0; r < n; ++r)
    out.emplace_back(full.begin() + static_cast<std::ptrdiff_t>(r * chunk),
                     full.begin() + static_cast<std::ptrdiff_t>((r + 1) * chunk));
  return out;
}

std::vector<Vector> all_gather(const std::vector<Vector>& chunks) {
  check_ranks(chunks, "all_gather");
  Vector full;
  for (const auto& c : chunks) full.insert(full.end(), c.begin(), c.end());
  return std::vector<Vector>(chunks.size(), full);
}

ColumnParallelResult column_parallel_linear(const Matrix& x, const Matrix& w, const Matrix& dy, int64_t tp) {
  if (tp < 1 || cols(w) % tp != 0)
    throw InputError("reference_math: tp=" + std::to_string(tp) + " does not divide " +
                     std::to_string(cols(w)) + " output columns");
  const int64_t shard = cols(w) / tp;
  ColumnParallelResult r;
  r.dx = zeros(rows(x), cols(x));
  for (int64_t i = 0; i < tp; ++i) {
    const Matrix wi = col_slice(w, i * shard, (i + 1) * shard);
    const Matrix dyi = col_slice(dy, i * shard, (i + 1) * shard);
    r.y_shards.push_back(matmul(x, wi));
    r.y = i == 0 ? r.y_shards.back() : hconcat(r.y, r.y_shards.back());
    const LinearGrads g = linear_backward(x, wi, dyi);
    r.dW_shards.push_back(g.dW);
    r.dx_partial.push_back(g.dX);
    r.dx = add(r.dx, g.dX);  // AllReduce SUM over TP, never divided by tp
  }
  return r;
}

}  // namespace dtsim::refmath
