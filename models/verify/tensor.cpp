#include "models/verify/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "models/errors.hpp"

// Kernels compiled twice, for AVX2 and for the baseline ISA, the CPU choosing at load
// time (GCC target_clones). AVX2 without FMA: the same IEEE multiplications and additions
// in the same order, four lanes at a time, so results are bitwise those of the baseline.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define DTSIM_VERIFY_SIMD __attribute__((target_clones("avx2", "default")))
// The 4-wide vector helpers below are always inlined: no vector crosses a call, so
// -Wpsabi's note on the AVX calling convention does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
#else
#define DTSIM_VERIFY_SIMD
#endif

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

/// Free blocks of each size class, on a stack of pointers (most recently freed on top):
/// taking a block does not read the block itself, whose memory may be cold (or in another
/// core's cache when another thread used it last).
struct Pool {
  struct Stack {
    void** data = nullptr;
    size_t n = 0, cap = 0;
  };
  Stack stacks[kPoolClasses];
  ~Pool() {
    release();
    for (Stack& s : stacks) std::free(s.data);
    t_pool_gone = true;
  }
  void release() noexcept {
    for (Stack& s : stacks) {
      for (size_t i = 0; i < s.n; ++i) ::operator delete(s.data[i]);
      s.n = 0;
    }
  }
  /// False when the stack cannot grow (the caller frees the block instead).
  static bool push(Stack& s, void* p) noexcept {
    if (s.n == s.cap) {
      const size_t cap = s.cap < 64 ? 64 : 2 * s.cap;
      void** d = static_cast<void**>(std::realloc(s.data, cap * sizeof(void*)));
      if (d == nullptr) return false;
      s.data = d;
      s.cap = cap;
    }
    s.data[s.n++] = p;
    return true;
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
  Pool::Stack& s = t_pool.stacks[c];
  if (s.n == 0) return ::operator new(held);
  return s.data[--s.n];
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
  if (!Pool::push(t_pool.stacks[c], p)) ::operator delete(p);
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

// Summation orders are fixed (tensor.hpp): every output element adds its k terms one by one
// in order p = 0, 1, ..., from 0 or from c. One such chain is bound by the latency of the
// addition, so the kernels keep 4 x 4 output elements in four 4-wide vectors (GCC vector
// extensions: element-wise IEEE multiplications and additions, two SSE2 or one AVX2
// instruction each) and walk p once per block: 16 independent chains. Each element's
// operations and their order are those of the plain triple loop (no fused multiply-add:
// neither clone's target has FMA), so results are bitwise the same whatever the blocking.
namespace {

typedef double v4d __attribute__((vector_size(32)));
typedef double v2d __attribute__((vector_size(16)));

inline __attribute__((always_inline)) v4d load4(const double* p) {
  v4d v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline __attribute__((always_inline)) void store4(double* p, v4d v) { std::memcpy(p, &v, sizeof v); }
inline __attribute__((always_inline)) v2d load2(const double* p) {
  v2d v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline __attribute__((always_inline)) void store2(double* p, v2d v) { std::memcpy(p, &v, sizeof v); }

enum class Init {
  zero,      // c = sum
  chain,     // c = ((c + t_0) + t_1) + ...
  add_after  // c = c + sum (the sum formed from 0)
};

/// R rows (R = 4 or 1) x W columns (W = 4, 2 or 1) of c: c[r][q] (+)= sum_p
/// a[r * a_r + p * a_p] * b[p * b_p + q].
template <int R, int W>
inline __attribute__((always_inline)) void gemm_block(const double* a, int64_t a_r, int64_t a_p, const double* b,
                                                      int64_t b_p, double* c, int64_t ldc, int64_t k, Init init,
                                                      const double* bias) {
  if constexpr (W == 4) {
    v4d s[R];
    for (int r = 0; r < R; ++r) s[r] = init == Init::chain ? load4(c + r * ldc) : v4d{0, 0, 0, 0};
    for (int64_t p = 0; p < k; ++p) {
      const v4d bp = load4(b + p * b_p);
      for (int r = 0; r < R; ++r) {
        const double x = a[r * a_r + p * a_p];
        s[r] += v4d{x, x, x, x} * bp;
      }
    }
    for (int r = 0; r < R; ++r)
      store4(c + r * ldc, init == Init::add_after ? load4(c + r * ldc) + s[r] : bias ? s[r] + load4(bias) : s[r]);
  } else if constexpr (W == 2) {
    v2d s[R];
    for (int r = 0; r < R; ++r) s[r] = init == Init::chain ? load2(c + r * ldc) : v2d{0, 0};
    for (int64_t p = 0; p < k; ++p) {
      const v2d bp = load2(b + p * b_p);
      for (int r = 0; r < R; ++r) {
        const double x = a[r * a_r + p * a_p];
        s[r] += v2d{x, x} * bp;
      }
    }
    for (int r = 0; r < R; ++r)
      store2(c + r * ldc, init == Init::add_after ? load2(c + r * ldc) + s[r] : bias ? s[r] + load2(bias) : s[r]);
  } else {
    double s[R];
    for (int r = 0; r < R; ++r) s[r] = init == Init::chain ? c[r * ldc] : 0.0;
    for (int64_t p = 0; p < k; ++p) {
      const double y = b[p * b_p];
      for (int r = 0; r < R; ++r) s[r] += a[r * a_r + p * a_p] * y;
    }
    for (int r = 0; r < R; ++r) c[r * ldc] = init == Init::add_after ? c[r * ldc] + s[r] : bias ? s[r] + bias[0] : s[r];
  }
}

template <int R>
inline __attribute__((always_inline)) void gemm_rows(const double* a, int64_t a_r, int64_t a_p, const double* b,
                                                     int64_t b_p, double* c, int64_t ldc, int64_t n, int64_t k,
                                                     Init init, const double* bias) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4)
    gemm_block<R, 4>(a, a_r, a_p, b + j, b_p, c + j, ldc, k, init, bias ? bias + j : nullptr);
  if (j + 2 <= n) {
    gemm_block<R, 2>(a, a_r, a_p, b + j, b_p, c + j, ldc, k, init, bias ? bias + j : nullptr);
    j += 2;
  }
  if (j < n) gemm_block<R, 1>(a, a_r, a_p, b + j, b_p, c + j, ldc, k, init, bias ? bias + j : nullptr);
}

/// c (m x n, row-major) from a (row i at a + i * a_r, step a_p along p) and b (row p at
/// b + p * b_p, contiguous along j).
/// `bias` (Init::zero only): c = sum + bias[j], the sum stored first then the bias added.
/// Rows of c are ldc apart (n: contiguous).
inline __attribute__((always_inline)) void gemm_any(const double* a, int64_t a_r, int64_t a_p, const double* b,
                                                    int64_t b_p, double* c, int64_t m, int64_t n, int64_t k,
                                                    Init init, const double* bias = nullptr, int64_t ldc = -1) {
  if (ldc < 0) ldc = n;
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) gemm_rows<4>(a + i * a_r, a_r, a_p, b, b_p, c + i * ldc, ldc, n, k, init, bias);
  for (; i < m; ++i) gemm_rows<1>(a + i * a_r, a_r, a_p, b, b_p, c + i * ldc, ldc, n, k, init, bias);
}

}  // namespace

DTSIM_VERIFY_SIMD void gemm(const double* a, const double* b, double* c, int64_t m, int64_t k, int64_t n,
                            bool accumulate) {
  gemm_any(a, k, 1, b, n, c, m, n, k, accumulate ? Init::chain : Init::zero);
}

DTSIM_VERIFY_SIMD void gemm_bias(const double* a, const double* b, const double* bias, double* c, int64_t m,
                                 int64_t k, int64_t n) {
  gemm_any(a, k, 1, b, n, c, m, n, k, Init::zero, bias);
}

DTSIM_VERIFY_SIMD void gemm_tn(const double* a, const double* b, double* c, int64_t k, int64_t m, int64_t n,
                               bool accumulate) {
  gemm_any(a, 1, m, b, n, c, m, n, k, accumulate ? Init::chain : Init::zero);
}

DTSIM_VERIFY_SIMD void gemm_ld(const double* a, int64_t lda, const double* b, int64_t ldb, double* c, int64_t ldc,
                               int64_t m, int64_t k, int64_t n, bool accumulate) {
  gemm_any(a, lda, 1, b, ldb, c, m, n, k, accumulate ? Init::chain : Init::zero, nullptr, ldc);
}

DTSIM_VERIFY_SIMD void gemm_tn_ld(const double* a, int64_t lda, const double* b, int64_t ldb, double* c,
                                  int64_t ldc, int64_t k, int64_t m, int64_t n, bool accumulate) {
  gemm_any(a, 1, lda, b, ldb, c, m, n, k, accumulate ? Init::chain : Init::zero, nullptr, ldc);
}

DTSIM_VERIFY_SIMD void gemm_tn_batched(const double* a, const double* b, double* c, int64_t k, int64_t m, int64_t n,
                                       int64_t batches, int64_t a_stride, int64_t b_stride, int64_t c_stride) {
  for (int64_t q = 0; q < batches; ++q)
    gemm_any(a + q * a_stride, 1, m, b + q * b_stride, n, c + q * c_stride, m, n, k, Init::chain);
}

// b transposed into this thread's scratch first, so that the kernel reads rows of b^T.
DTSIM_VERIFY_SIMD void gemm_nt(const double* a, const double* b, double* c, int64_t m, int64_t k, int64_t n,
                               bool accumulate) {
  thread_local std::vector<double> bt;
  bt.resize(static_cast<size_t>(k * n));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t p = 0; p < k; ++p) bt[static_cast<size_t>(p * n + j)] = b[j * k + p];
  gemm_any(a, k, 1, bt.data(), n, c, m, n, k, accumulate ? Init::add_after : Init::zero);
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
  Mat out = Mat::uninitialized(a.rows, c1 - c0);
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
  Mat out = Mat::uninitialized(samples * (t1 - t0), a.cols);
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

// Row statistics are sums in column order, one latency-bound chain per row: rows go four
// to a 4-wide vector (lane r = row i + r; gathered column by column), two vectors at a
// time, each lane with exactly the operations of the one-row loop. sqrt and the divisions
// are the scalar IEEE operations either way.
namespace {

inline __attribute__((always_inline)) v4d column4(const double* x, int64_t n, int64_t j) {
  return v4d{x[j], x[n + j], x[2 * n + j], x[3 * n + j]};
}

/// Mean (LayerNorm) and 1 / sqrt(var + eps) of 4 rows starting at x (row stride n).
inline __attribute__((always_inline)) void row_stats4(const double* x, int64_t n, bool layernorm, v4d& mean,
                                                      v4d& rs) {
  mean = v4d{0, 0, 0, 0};
  if (layernorm) {
    for (int64_t j = 0; j < n; ++j) mean += column4(x, n, j);
    mean /= v4d{static_cast<double>(n), static_cast<double>(n), static_cast<double>(n), static_cast<double>(n)};
  }
  v4d var{0, 0, 0, 0};
  for (int64_t j = 0; j < n; ++j) {
    const v4d dlt = column4(x, n, j) - mean;
    var += dlt * dlt;
  }
  for (int r = 0; r < 4; ++r) rs[r] = 1.0 / std::sqrt(var[r] / static_cast<double>(n) + kNormEps);
}

inline __attribute__((always_inline)) void normalize_row(const double* xi, int64_t n, double mean, double r,
                                                         const double* weight, const double* bias, bool add_bias,
                                                         double* xh_i, double* y_i) {
  for (int64_t j = 0; j < n; ++j) {
    const double xh = (xi[j] - mean) * r;
    xh_i[j] = xh;
    y_i[j] = xh * weight[j] + (add_bias ? bias[j] : 0.0);
  }
}

}  // namespace

DTSIM_VERIFY_SIMD void norm_forward_rows(const double* x, int64_t rows, int64_t n, const double* weight,
                                         const double* bias, bool layernorm, double* y, double* xhat, double* rstd) {
  const bool add_bias = layernorm && bias;
  int64_t i = 0;
  for (; i + 8 <= rows; i += 8) {  // two independent groups of four rows
    v4d mean0, rs0, mean1, rs1;
    const double* x0 = x + i * n;
    const double* x1 = x0 + 4 * n;
    mean0 = mean1 = v4d{0, 0, 0, 0};
    if (layernorm) {
      for (int64_t j = 0; j < n; ++j) {
        mean0 += column4(x0, n, j);
        mean1 += column4(x1, n, j);
      }
      const v4d nn{static_cast<double>(n), static_cast<double>(n), static_cast<double>(n), static_cast<double>(n)};
      mean0 /= nn;
      mean1 /= nn;
    }
    v4d var0{0, 0, 0, 0}, var1{0, 0, 0, 0};
    for (int64_t j = 0; j < n; ++j) {
      const v4d d0 = column4(x0, n, j) - mean0, d1 = column4(x1, n, j) - mean1;
      var0 += d0 * d0;
      var1 += d1 * d1;
    }
    for (int r = 0; r < 4; ++r) {
      rs0[r] = 1.0 / std::sqrt(var0[r] / static_cast<double>(n) + kNormEps);
      rs1[r] = 1.0 / std::sqrt(var1[r] / static_cast<double>(n) + kNormEps);
    }
    for (int r = 0; r < 4; ++r) {
      rstd[i + r] = rs0[r];
      rstd[i + 4 + r] = rs1[r];
      normalize_row(x0 + r * n, n, mean0[r], rs0[r], weight, bias, add_bias, xhat + (i + r) * n, y + (i + r) * n);
      normalize_row(x1 + r * n, n, mean1[r], rs1[r], weight, bias, add_bias, xhat + (i + 4 + r) * n,
                    y + (i + 4 + r) * n);
    }
  }
  for (; i + 4 <= rows; i += 4) {
    v4d mean, rs;
    row_stats4(x + i * n, n, layernorm, mean, rs);
    for (int r = 0; r < 4; ++r) {
      rstd[i + r] = rs[r];
      normalize_row(x + (i + r) * n, n, mean[r], rs[r], weight, bias, add_bias, xhat + (i + r) * n, y + (i + r) * n);
    }
  }
  for (; i < rows; ++i) {
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
    normalize_row(xi, n, mean, r, weight, bias, add_bias, xhat + i * n, y + i * n);
  }
}

// dweight / dbias add the rows' terms in row order (as the one-row loop does); the per-row
// sums run four rows to a vector.
DTSIM_VERIFY_SIMD void norm_backward_rows(const double* dy, int64_t rows, int64_t n, const double* weight,
                                          bool layernorm, const double* xhat, const double* rstd, double* dweight,
                                          double* dbias, double* dx) {
  const double inv_n = 1.0 / static_cast<double>(n);
  int64_t i = 0;
  for (; i + 4 <= rows; i += 4) {
    const double* dy0 = dy + i * n;
    const double* xh0 = xhat + i * n;
    v4d sum_g{0, 0, 0, 0}, sum_gx{0, 0, 0, 0};
    for (int64_t j = 0; j < n; ++j) {
      const v4d dyc = column4(dy0, n, j), xhc = column4(xh0, n, j);
      const v4d g = dyc * v4d{weight[j], weight[j], weight[j], weight[j]};
      sum_g += g;
      sum_gx += g * xhc;
      double dw = dweight[j];
      for (int r = 0; r < 4; ++r) dw += dyc[r] * xhc[r];
      dweight[j] = dw;
      if (dbias) {
        double db = dbias[j];
        for (int r = 0; r < 4; ++r) db += dyc[r];
        dbias[j] = db;
      }
    }
    for (int r = 0; r < 4; ++r) {
      const double rr = rstd[i + r];
      const double* dy_r = dy0 + r * n;
      const double* xh_r = xh0 + r * n;
      double* dx_r = dx + (i + r) * n;
      const double sg = sum_g[r], sgx = sum_gx[r];
      for (int64_t j = 0; j < n; ++j) {
        const double g = dy_r[j] * weight[j];
        // LayerNorm: r (g - mean(g) - xhat mean(g xhat)); RMSNorm: r (g - xhat mean(g xhat)).
        dx_r[j] = rr * (g - (layernorm ? sg * inv_n : 0.0) - xh_r[j] * sgx * inv_n);
      }
    }
  }
  for (; i < rows; ++i) {
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
      dx[i * n + j] = r * (g - (layernorm ? sum_g * inv_n : 0.0) - xhi[j] * sum_gx * inv_n);
    }
  }
}

Mat norm_forward(const Mat& x, const double* weight, const double* bias, bool layernorm, NormCache& cache) {
  Mat y = Mat::uninitialized(x.rows, x.cols);
  cache.xhat = Mat::uninitialized(x.rows, x.cols);
  cache.rstd.assign(static_cast<size_t>(x.rows), 0.0);
  norm_forward_rows(x.v.data(), x.rows, x.cols, weight, bias, layernorm, y.v.data(), cache.xhat.v.data(),
                    cache.rstd.data());
  return y;
}

Mat norm_backward(const Mat& dy, const double* weight, bool layernorm, const NormCache& cache, double* dweight,
                  double* dbias) {
  if (dy.rows != cache.xhat.rows || dy.cols != cache.xhat.cols) shape_error("norm_backward", dy, cache.xhat);
  Mat dx = Mat::uninitialized(dy.rows, dy.cols);
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
