#include "models/verify/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "models/errors.hpp"

namespace dtsim::verify {

namespace {

[[noreturn]] void shape_error(const char* what, const Mat& a, const Mat& b) {
  throw InputError(std::string("verify: ") + what + ": shapes (" + std::to_string(a.rows) + " x " +
                   std::to_string(a.cols) + ") and (" + std::to_string(b.rows) + " x " + std::to_string(b.cols) +
                   ") do not fit");
}

}  // namespace

namespace {

constexpr size_t kPoolGrain = 16;
constexpr size_t kSmallClasses = kPoolMaxBytes / kPoolGrain + 1;
// Larger blocks (the reference step's whole-batch matrices) in power-of-two classes
// above kPoolMaxBytes, up to 2^kMaxLog2 bytes; beyond that, operator new.
constexpr int kMaxLog2 = 30;
constexpr size_t kPoolClasses = kSmallClasses + kMaxLog2 + 1;

/// Set when this thread's pool is gone (thread exit): blocks freed later, e.g. by static
/// objects destroyed after thread-local ones, go straight to operator delete.
thread_local bool t_pool_gone = false;

/// Free blocks of each size class, linked through their first bytes.
struct Pool {
  void* head[kPoolClasses] = {};
  ~Pool() {
    release();
    t_pool_gone = true;
  }
  void release() noexcept {
    for (size_t c = 0; c < kPoolClasses; ++c)
      while (head[c] != nullptr) {
        void* p = head[c];
        head[c] = *static_cast<void**>(p);
        ::operator delete(p);
      }
  }
};
thread_local Pool t_pool;

/// The class of a block of `bytes` and the bytes it really holds; {kPoolClasses, bytes}
/// when too large for the pool.
std::pair<size_t, size_t> pool_class(size_t bytes) {
  if (bytes <= kPoolMaxBytes) {
    const size_t c = (bytes + kPoolGrain - 1) / kPoolGrain;
    return {c, c * kPoolGrain};
  }
  int lg = 0;
  while ((size_t{1} << lg) < bytes) ++lg;
  if (lg > kMaxLog2) return {kPoolClasses, bytes};
  return {kSmallClasses + static_cast<size_t>(lg), size_t{1} << lg};
}

}  // namespace

void* pool_allocate(size_t bytes) {
  if (bytes == 0) return ::operator new(1);
  const auto [c, held] = pool_class(bytes);
  if (c >= kPoolClasses || t_pool_gone) return ::operator new(held);
  void*& head = t_pool.head[c];
  if (head == nullptr) return ::operator new(held);
  void* p = head;
  head = *static_cast<void**>(p);
  return p;
}

void pool_deallocate(void* p, size_t bytes) noexcept {
  if (p == nullptr) return;
  if (bytes == 0) {
    ::operator delete(p);
    return;
  }
  const size_t c = pool_class(bytes).first;
  if (c >= kPoolClasses || t_pool_gone) {
    ::operator delete(p);
    return;
  }
  void*& head = t_pool.head[c];
  *static_cast<void**>(p) = head;
  head = p;
}

void pool_release() noexcept { t_pool.release(); }

Mat::Mat(int64_t r, int64_t c, double fill) : rows(r), cols(c), v(static_cast<size_t>(r * c), fill) {}

Mat Mat::uninitialized(int64_t r, int64_t c) {
  Mat m;
  m.rows = r;
  m.cols = c;
  m.v.resize(static_cast<size_t>(r * c));  // PoolAllocator::construct: default-initialized
  return m;
}

void reduce_buffers(const double* const* in, size_t n, size_t len, Reduce op, double* out) {
  if (op == Reduce::max) {
    std::copy(in[0], in[0] + len, out);
    for (size_t r = 0; r < n; ++r)
      for (size_t i = 0; i < len; ++i) out[i] = std::max(out[i], in[r][i]);
    return;
  }
  std::fill(out, out + len, 0.0);
  for (size_t r = 0; r < n; ++r)
    for (size_t i = 0; i < len; ++i) out[i] += in[r][i];
  if (op == Reduce::avg)
    for (size_t i = 0; i < len; ++i) out[i] /= static_cast<double>(n);
}

// The kernels keep four output elements in registers at a time (four independent chains
// of additions); each element still adds its k terms in order p = 0, 1, ..., starting
// from 0 (or from c when accumulating), so results do not depend on the blocking.
void gemm(const double* a, const double* b, double* c, int64_t m, int64_t k, int64_t n, bool accumulate) {
  for (int64_t i = 0; i < m; ++i) {
    const double* ai = a + i * k;
    double* ci = c + i * n;
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
      double s0 = accumulate ? ci[j] : 0.0, s1 = accumulate ? ci[j + 1] : 0.0;
      double s2 = accumulate ? ci[j + 2] : 0.0, s3 = accumulate ? ci[j + 3] : 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double x = ai[p];
        const double* bp = b + p * n + j;
        s0 += x * bp[0];
        s1 += x * bp[1];
        s2 += x * bp[2];
        s3 += x * bp[3];
      }
      ci[j] = s0;
      ci[j + 1] = s1;
      ci[j + 2] = s2;
      ci[j + 3] = s3;
    }
    for (; j < n; ++j) {
      double s = accumulate ? ci[j] : 0.0;
      for (int64_t p = 0; p < k; ++p) s += ai[p] * b[p * n + j];
      ci[j] = s;
    }
  }
}

void gemm_tn(const double* a, const double* b, double* c, int64_t k, int64_t m, int64_t n, bool accumulate) {
  if (k > 64) {  // long sums: stream the rows of a and b (same order of additions)
    if (!accumulate) std::fill(c, c + m * n, 0.0);
    for (int64_t p = 0; p < k; ++p) {
      const double* ap = a + p * m;
      const double* bp = b + p * n;
      for (int64_t i = 0; i < m; ++i) {
        const double api = ap[i];
        double* ci = c + i * n;
        for (int64_t j = 0; j < n; ++j) ci[j] += api * bp[j];
      }
    }
    return;
  }
  for (int64_t i = 0; i < m; ++i) {
    double* ci = c + i * n;
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
      double s0 = accumulate ? ci[j] : 0.0, s1 = accumulate ? ci[j + 1] : 0.0;
      double s2 = accumulate ? ci[j + 2] : 0.0, s3 = accumulate ? ci[j + 3] : 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double x = a[p * m + i];
        const double* bp = b + p * n + j;
        s0 += x * bp[0];
        s1 += x * bp[1];
        s2 += x * bp[2];
        s3 += x * bp[3];
      }
      ci[j] = s0;
      ci[j + 1] = s1;
      ci[j + 2] = s2;
      ci[j + 3] = s3;
    }
    for (; j < n; ++j) {
      double s = accumulate ? ci[j] : 0.0;
      for (int64_t p = 0; p < k; ++p) s += a[p * m + i] * b[p * n + j];
      ci[j] = s;
    }
  }
}

void gemm_nt(const double* a, const double* b, double* c, int64_t m, int64_t k, int64_t n, bool accumulate) {
  for (int64_t i = 0; i < m; ++i) {
    const double* ai = a + i * k;
    double* ci = c + i * n;
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
      const double* b0 = b + j * k;
      const double* b1 = b0 + k;
      const double* b2 = b1 + k;
      const double* b3 = b2 + k;
      double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double x = ai[p];
        s0 += x * b0[p];
        s1 += x * b1[p];
        s2 += x * b2[p];
        s3 += x * b3[p];
      }
      ci[j] = accumulate ? ci[j] + s0 : s0;
      ci[j + 1] = accumulate ? ci[j + 1] + s1 : s1;
      ci[j + 2] = accumulate ? ci[j + 2] + s2 : s2;
      ci[j + 3] = accumulate ? ci[j + 3] + s3 : s3;
    }
    for (; j < n; ++j) {
      const double* bj = b + j * k;
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += ai[p] * bj[p];
      ci[j] = accumulate ? ci[j] + s : s;
    }
  }
}

Mat matmul(const Mat& a, const Mat& b) {
  if (a.cols != b.rows) shape_error("matmul", a, b);
  Mat c(a.rows, b.cols);
  gemm(a.v.data(), b.v.data(), c.v.data(), a.rows, a.cols, b.cols, true);
  return c;
}

Mat matmul_tn(const Mat& a, const Mat& b) {
  if (a.rows != b.rows) shape_error("matmul_tn", a, b);
  Mat c(a.cols, b.cols);
  gemm_tn(a.v.data(), b.v.data(), c.v.data(), a.rows, a.cols, b.cols, true);
  return c;
}

Mat matmul_nt(const Mat& a, const Mat& b) {
  if (a.cols != b.cols) shape_error("matmul_nt", a, b);
  Mat c(a.rows, b.rows);
  gemm_nt(a.v.data(), b.v.data(), c.v.data(), a.rows, a.cols, b.rows, false);
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

void norm_forward_rows(const double* x, int64_t rows, int64_t n, const double* weight, const double* bias,
                       bool layernorm, double* y, double* xhat, double* rstd) {
  for (int64_t i = 0; i < rows; ++i) {
    const double* xi = x + i * n;
    double mean = 0;
    if (layernorm) {
      for (int64_t j = 0; j < n; ++j) mean += xi[j];
      mean /= static_cast<double>(n);
    }
    double var = 0;
    for (int64_t j = 0; j < n; ++j) var += (xi[j] - mean) * (xi[j] - mean);
    var /= static_cast<double>(n);
    const double r = 1.0 / std::sqrt(var + kNormEps);
    rstd[i] = r;
    for (int64_t j = 0; j < n; ++j) {
      const double xh = (xi[j] - mean) * r;
      xhat[i * n + j] = xh;
      y[i * n + j] = xh * weight[j] + (layernorm && bias ? bias[j] : 0.0);
    }
  }
}

void norm_backward_rows(const double* dy, int64_t rows, int64_t n, const double* weight, bool layernorm,
                        const double* xhat, const double* rstd, double* dweight, double* dbias, double* dx) {
  const double inv_n = 1.0 / static_cast<double>(n);
  for (int64_t i = 0; i < rows; ++i) {
    const double* dyi = dy + i * n;
    const double* xhi = xhat + i * n;
    double sum_g = 0, sum_gx = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double g = dyi[j] * weight[j];
      sum_g += g;
      sum_gx += g * xhi[j];
      dweight[j] += dyi[j] * xhi[j];
      if (dbias) dbias[j] += dyi[j];
    }
    const double r = rstd[i];
    for (int64_t j = 0; j < n; ++j) {
      const double g = dyi[j] * weight[j];
      // LayerNorm: r (g - mean(g) - xhat mean(g xhat)); RMSNorm: r (g - xhat mean(g xhat)).
      dx[i * n + j] = r * (g - (layernorm ? sum_g * inv_n : 0.0) - xhi[j] * sum_gx * inv_n);
    }
  }
}

Mat norm_forward(const Mat& x, const double* weight, const double* bias, bool layernorm, NormCache& cache) {
  Mat y(x.rows, x.cols);
  cache.xhat = Mat(x.rows, x.cols);
  cache.rstd.assign(static_cast<size_t>(x.rows), 0.0);
  norm_forward_rows(x.v.data(), x.rows, x.cols, weight, bias, layernorm, y.v.data(), cache.xhat.v.data(),
                    cache.rstd.data());
  return y;
}

Mat norm_backward(const Mat& dy, const double* weight, bool layernorm, const NormCache& cache, double* dweight,
                  double* dbias) {
  if (dy.rows != cache.xhat.rows || dy.cols != cache.xhat.cols) shape_error("norm_backward", dy, cache.xhat);
  Mat dx(dy.rows, dy.cols);
  norm_backward_rows(dy.v.data(), dy.rows, dy.cols, weight, layernorm, cache.xhat.v.data(), cache.rstd.data(), dweight,
                     dbias, dx.v.data());
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
