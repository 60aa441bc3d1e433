#include "models/verify/tensor.hpp"

#include <cmath>
#include <string>

#include "models/errors.hpp"

namespace dtsim::verify {

namespace {

[[noreturn]] void shape_error(const char* what, const Mat& a, const Mat& b) {
  throw InputError(std::string("verify: ") + what + ": shapes (" + std::to_string(a.rows) + " x " +
                   std::to_string(a.cols) + ") and (" + std::to_string(b.rows) + " x " + std::to_string(b.cols) +
                   ") do not fit");
}

}  // namespace

Mat::Mat(int64_t r, int64_t c, double fill) : rows(r), cols(c), v(static_cast<size_t>(r * c), fill) {}

Mat matmul(const Mat& a, const Mat& b) {
  if (a.cols != b.rows) shape_error("matmul", a, b);
  Mat c(a.rows, b.cols);
  for (int64_t i = 0; i < a.rows; ++i) {
    double* ci = c.row(i);
    for (int64_t k = 0; k < a.cols; ++k) {
      const double aik = a.at(i, k);
      const double* bk = b.row(k);
      for (int64_t j = 0; j < b.cols; ++j) ci[j] += aik * bk[j];
    }
  }
  return c;
}

Mat matmul_tn(const Mat& a, const Mat& b) {
  if (a.rows != b.rows) shape_error("matmul_tn", a, b);
  Mat c(a.cols, b.cols);
  for (int64_t k = 0; k < a.rows; ++k) {
    const double* ak = a.row(k);
    const double* bk = b.row(k);
    for (int64_t i = 0; i < a.cols; ++i) {
      const double aki = ak[i];
      double* ci = c.row(i);
      for (int64_t j = 0; j < b.cols; ++j) ci[j] += aki * bk[j];
    }
  }
  return c;
}

Mat matmul_nt(const Mat& a, const Mat& b) {
  if (a.cols != b.cols) shape_error("matmul_nt", a, b);
  Mat c(a.rows, b.rows);
  for (int64_t i = 0; i < a.rows; ++i) {
    const double* ai = a.row(i);
    for (int64_t j = 0; j < b.rows; ++j) {
      const double* bj = b.row(j);
      double s = 0;
      for (int64_t k = 0; k < a.cols; ++k) s += ai[k] * bj[k];
      c.at(i, j) = s;
    }
  }
  return c;
}

void add_into(Mat& dst, const Mat& src) {
  if (dst.rows != src.rows || dst.cols != src.cols) shape_error("add", dst, src);
  for (size_t i = 0; i < dst.v.size(); ++i) dst.v[i] += src.v[i];
}

Mat col_range(const Mat& a, int64_t c0, int64_t c1) {
  if (c0 < 0 || c1 > a.cols || c0 > c1) throw InputError("verify: column range outside the matrix");
  Mat out(a.rows, c1 - c0);
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t j = c0; j < c1; ++j) out.at(i, j - c0) = a.at(i, j);
  return out;
}

void set_col_range(Mat& dst, int64_t c0, const Mat& src) {
  if (dst.rows != src.rows || c0 < 0 || c0 + src.cols > dst.cols) shape_error("set_col_range", dst, src);
  for (int64_t i = 0; i < src.rows; ++i)
    for (int64_t j = 0; j < src.cols; ++j) dst.at(i, c0 + j) = src.at(i, j);
}

std::vector<double> col_sums(const Mat& a) {
  std::vector<double> s(static_cast<size_t>(a.cols), 0.0);
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t j = 0; j < a.cols; ++j) s[static_cast<size_t>(j)] += a.at(i, j);
  return s;
}

void add_row_vector(Mat& a, const double* bias) {
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t j = 0; j < a.cols; ++j) a.at(i, j) += bias[j];
}

Mat token_range(const Mat& a, int64_t samples, int64_t t0, int64_t t1) {
  if (samples <= 0 || a.rows % samples != 0) throw InputError("verify: token matrix rows do not split into samples");
  const int64_t tokens = a.rows / samples;
  if (t0 < 0 || t1 > tokens || t0 > t1) throw InputError("verify: token range outside the sample");
  Mat out(samples * (t1 - t0), a.cols);
  for (int64_t s = 0; s < samples; ++s)
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t j = 0; j < a.cols; ++j) out.at(s * (t1 - t0) + t - t0, j) = a.at(s * tokens + t, j);
  return out;
}

void set_token_range(Mat& dst, int64_t samples, int64_t t0, const Mat& src) {
  if (samples <= 0 || dst.rows % samples != 0 || src.rows % samples != 0 || dst.cols != src.cols)
    shape_error("set_token_range", dst, src);
  const int64_t tokens = dst.rows / samples, n = src.rows / samples;
  if (t0 < 0 || t0 + n > tokens) shape_error("set_token_range", dst, src);
  for (int64_t s = 0; s < samples; ++s)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < src.cols; ++j) dst.at(s * tokens + t0 + t, j) = src.at(s * n + t, j);
}

Mat norm_forward(const Mat& x, const double* weight, const double* bias, bool layernorm, NormCache& cache) {
  const int64_t n = x.cols;
  Mat y(x.rows, n);
  cache.xhat = Mat(x.rows, n);
  cache.rstd.assign(static_cast<size_t>(x.rows), 0.0);
  for (int64_t i = 0; i < x.rows; ++i) {
    const double* xi = x.row(i);
    double mean = 0;
    if (layernorm) {
      for (int64_t j = 0; j < n; ++j) mean += xi[j];
      mean /= static_cast<double>(n);
    }
    double var = 0;
    for (int64_t j = 0; j < n; ++j) var += (xi[j] - mean) * (xi[j] - mean);
    var /= static_cast<double>(n);
    const double r = 1.0 / std::sqrt(var + kNormEps);
    cache.rstd[static_cast<size_t>(i)] = r;
    for (int64_t j = 0; j < n; ++j) {
      const double xh = (xi[j] - mean) * r;
      cache.xhat.at(i, j) = xh;
      y.at(i, j) = xh * weight[j] + (layernorm && bias ? bias[j] : 0.0);
    }
  }
  return y;
}

Mat norm_backward(const Mat& dy, const double* weight, bool layernorm, const NormCache& cache, double* dweight,
                  double* dbias) {
  if (dy.rows != cache.xhat.rows || dy.cols != cache.xhat.cols) shape_error("norm_backward", dy, cache.xhat);
  const int64_t n = dy.cols;
  const double inv_n = 1.0 / static_cast<double>(n);
  Mat dx(dy.rows, n);
  for (int64_t i = 0; i < dy.rows; ++i) {
    double sum_g = 0, sum_gx = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double g = dy.at(i, j) * weight[j];
      sum_g += g;
      sum_gx += g * cache.xhat.at(i, j);
      dweight[j] += dy.at(i, j) * cache.xhat.at(i, j);
      if (dbias) dbias[j] += dy.at(i, j);
    }
    const double r = cache.rstd[static_cast<size_t>(i)];
    for (int64_t j = 0; j < n; ++j) {
      const double g = dy.at(i, j) * weight[j];
      const double xh = cache.xhat.at(i, j);
      // LayerNorm: r (g - mean(g) - xhat mean(g xhat)); RMSNorm: r (g - xhat mean(g xhat)).
      dx.at(i, j) = r * (g - (layernorm ? sum_g * inv_n : 0.0) - xh * sum_gx * inv_n);
    }
  }
  return dx;
}

double gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

double gelu_grad(double x) {
  const double pdf = std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * pdf;
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

double silu_grad(double x) {
  const double s = 1.0 / (1.0 + std::exp(-x));
  return s * (1.0 + x * (1.0 - s));
}

void rope_apply(Mat& x, int64_t heads, int64_t head_dim, const std::vector<int64_t>& position, bool inverse) {
  if (x.cols != heads * head_dim || head_dim % 2 != 0 || static_cast<int64_t>(position.size()) != x.rows)
    throw InputError("verify: rope needs an even head_dim, heads*head_dim columns and one position per row");
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t hh = 0; hh < heads; ++hh)
      for (int64_t i = 0; i < head_dim / 2; ++i) {
        const double theta = std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
        const double ang = static_cast<double>(position[static_cast<size_t>(r)]) * theta * (inverse ? -1.0 : 1.0);
        const double c = std::cos(ang), s = std::sin(ang);
        double& a = x.at(r, hh * head_dim + 2 * i);
        double& b = x.at(r, hh * head_dim + 2 * i + 1);
        const double a0 = a, b0 = b;
        a = a0 * c - b0 * s;
        b = a0 * s + b0 * c;
      }
}

}  // namespace dtsim::verify
