#pragma once
// Dense double-precision matrices and the kernels of a tiny GPT-style block, for the
// step-plan verifier (models/verify/verify.hpp). Nothing here knows about ranks or plans.
//
// Shapes: a Mat is row-major, element (i, j) at v[i * cols + j]. A "token matrix" holds one
// token per row, samples one after another (row = sample * tokens_per_sample + position),
// and one feature per column. Functions throw dtsim::InputError on mismatched shapes.
//
// Sources of the math (carried here):
//  - Linear layers and their gradients, dA = dC B^T, dB = A^T dC: design/MATH.md section 1.
//  - LayerNorm (Ba et al. 2016, arXiv 1607.06450) and RMSNorm (Zhang & Sennrich 2019,
//    arXiv 1910.07467), epsilon 1e-5 (Megatron-LM's layernorm_epsilon default).
//  - GeLU, exact erf form (Hendrycks & Gimpel 2016, arXiv 1606.08415 Eq. 1); SwiGLU
//    silu(x W_gate) * (x W_up) (Shazeer 2020, arXiv 2002.05202 Eq. 6).
//  - Rotary position embedding on consecutive pairs (2i, 2i+1), theta_i = 10000^(-2i/d)
//    (Su et al. 2021, arXiv 2104.09864 Eq. 34).
#include <cstddef>
#include <cstdint>
#include <new>
#include <random>
#include <utility>
#include <vector>

namespace dtsim::verify {

/// Storage of the verifier's matrices: per-thread free lists by size (16-byte classes up
/// to kPoolMaxBytes, power-of-two classes above it up to 1 GiB, operator new beyond). An
/// interpreter run allocates and frees tens of millions of small matrices of a handful of
/// sizes, and the reference step large ones every step, on which glibc malloc (and the
/// kernel's page faults for its mmap/trim churn) spent half of the run time. Recycled
/// blocks stay in this thread's lists until pool_release() (or the thread's exit); a block
/// freed on another thread than the one that allocated it joins the freeing thread's lists.
inline constexpr size_t kPoolMaxBytes = 16384;
void* pool_allocate(size_t bytes);
void pool_deallocate(void* p, size_t bytes) noexcept;
/// Returns this thread's recycled blocks to operator delete (blocks in use are kept).
void pool_release() noexcept;

template <class T>
struct PoolAllocator {
  using value_type = T;
  PoolAllocator() noexcept = default;
  template <class U>
  PoolAllocator(const PoolAllocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor)
  T* allocate(size_t n) { return static_cast<T*>(pool_allocate(n * sizeof(T))); }
  void deallocate(T* p, size_t n) noexcept { pool_deallocate(p, n * sizeof(T)); }
  /// Default-initializes (no value given: e.g. resize(n)), so that Mat::uninitialized
  /// leaves doubles unwritten; with a value, constructs from it.
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  template <class U>
  bool operator==(const PoolAllocator<U>&) const noexcept {
    return true;
  }
};
using Doubles = std::vector<double, PoolAllocator<double>>;

struct Mat {
  int64_t rows = 0, cols = 0;
  Doubles v;

  Mat() = default;
  Mat(int64_t r, int64_t c, double fill = 0.0);
  /// r x c with unspecified values, for results a kernel overwrites entirely.
  static Mat uninitialized(int64_t r, int64_t c);
  double& at(int64_t i, int64_t j) { return v[static_cast<size_t>(i * cols + j)]; }
  double at(int64_t i, int64_t j) const { return v[static_cast<size_t>(i * cols + j)]; }
  double* row(int64_t i) { return v.data() + i * cols; }
  const double* row(int64_t i) const { return v.data() + i * cols; }
  int64_t size() const { return rows * cols; }
  bool empty() const { return v.empty(); }
};

/// Row-major kernels on raw blocks (the Mat functions below are these on whole matrices;
/// the interpreter calls them on row blocks of stacked matrices). `accumulate`: c += ...,
/// else c = ... . Summation orders are fixed: gemm and gemm_tn add the k terms one by one,
/// in order, to c (or to 0); gemm_nt forms each dot product from 0 and then stores (or
/// adds) it. The kernels are register-blocked and vectorized (an AVX2 build is chosen at
/// load time where the CPU has it) without changing any element's operations or their
/// order, so results are bitwise those of the naive loops on every CPU (no fused
/// multiply-add). Only the sign of a NaN that two NaN operands produce may differ between
/// builds: IEEE 754 leaves it to the instruction's operand order.
/// c (m x n) = a (m x k) b (k x n).
void gemm(const double* a, const double* b, double* c, int64_t m, int64_t k, int64_t n, bool accumulate);
/// c (m x n) = a b + bias: the sum formed as gemm's, then bias[j] added to column j.
void gemm_bias(const double* a, const double* b, const double* bias, double* c, int64_t m, int64_t k, int64_t n);
/// c (m x n) = a^T b, a (k x m), b (k x n).
void gemm_tn(const double* a, const double* b, double* c, int64_t k, int64_t m, int64_t n, bool accumulate);
/// gemm and gemm_tn on blocks of larger row-major matrices: lda, ldb, ldc are the
/// distances between rows (gemm_tn: a is k x m with rows lda apart).
void gemm_ld(const double* a, int64_t lda, const double* b, int64_t ldb, double* c, int64_t ldc, int64_t m, int64_t k,
             int64_t n, bool accumulate);
void gemm_tn_ld(const double* a, int64_t lda, const double* b, int64_t ldb, double* c, int64_t ldc, int64_t k,
                int64_t m, int64_t n, bool accumulate);
/// gemm_tn(a + q a_stride, b + q b_stride, c + q c_stride, k, m, n, accumulate = true) for
/// q = 0 .. batches - 1 (one call for the DP replicas' weight gradients of a lane).
void gemm_tn_batched(const double* a, const double* b, double* c, int64_t k, int64_t m, int64_t n, int64_t batches,
                     int64_t a_stride, int64_t b_stride, int64_t c_stride);
/// c (m x n) = a b^T, a (m x k), b (n x k).
void gemm_nt(const double* a, const double* b, double* c, int64_t m, int64_t k, int64_t n, bool accumulate);
/// Norms over `rows` rows of `n` columns (see norm_forward / norm_backward).
void norm_forward_rows(const double* x, int64_t rows, int64_t n, const double* weight, const double* bias,
                       bool layernorm, double* y, double* xhat, double* rstd);
void norm_backward_rows(const double* dy, int64_t rows, int64_t n, const double* weight, bool layernorm,
                        const double* xhat, const double* rstd, double* dweight, double* dbias, double* dx);

/// Element-wise reduction of the n buffers in[0..n) of `len` values each into `out`, with
/// the arithmetic of refmath::all_reduce (models/reference_math.hpp): sum adds the buffers
/// in order starting from 0, avg then divides by n, max starts from the first buffer.
enum class Reduce { sum, avg, max };
void reduce_buffers(const double* const* in, size_t n, size_t len, Reduce op, double* out);

/// a b: (m x k) @ (k x n).
Mat matmul(const Mat& a, const Mat& b);
/// a^T b: (k x m)^T @ (k x n) -> m x n.
Mat matmul_tn(const Mat& a, const Mat& b);
/// a b^T: (m x k) @ (n x k)^T -> m x n.
Mat matmul_nt(const Mat& a, const Mat& b);
/// dst += src (same shape).
void add_into(Mat& dst, const Mat& src);
/// Columns [c0, c1) of a.
Mat col_range(const Mat& a, int64_t c0, int64_t c1);
/// dst[:, c0 : c0 + src.cols] = src.
void set_col_range(Mat& dst, int64_t c0, const Mat& src);
/// Column sums (length cols).
std::vector<double> col_sums(const Mat& a);
/// Adds bias (length cols) to every row.
void add_row_vector(Mat& a, const double* bias);

/// Token matrices of `samples` samples with `tokens` rows each: the rows of positions
/// [t0, t1) of every sample, samples kept in order.
Mat token_range(const Mat& a, int64_t samples, int64_t t0, int64_t t1);
/// Inverse of token_range: writes src (samples x (t1 - t0) rows) into those rows of dst.
void set_token_range(Mat& dst, int64_t samples, int64_t t0, const Mat& src);

/// LayerNorm (layernorm == true: weight and bias, mean and variance) or RMSNorm (weight
/// only, root mean square) over each row, epsilon kNormEps. `bias` may be null for RMSNorm.
inline constexpr double kNormEps = 1e-5;
struct NormCache {
  Mat xhat;      // normalized input, before the weight
  Doubles rstd;  // 1 / sqrt(var + eps) (or 1 / rms) per row
};
Mat norm_forward(const Mat& x, const double* weight, const double* bias, bool layernorm, NormCache& cache);
/// Returns dx; adds the weight and bias gradients (length cols) into dweight / dbias
/// (dbias may be null for RMSNorm).
Mat norm_backward(const Mat& dy, const double* weight, bool layernorm, const NormCache& cache, double* dweight,
                  double* dbias);

double gelu(double x);
double gelu_grad(double x);
double silu(double x);
double silu_grad(double x);

/// Rotates each head's consecutive pairs of the token matrix x (heads * head_dim columns)
/// by position * theta_i; `position[r]` is the sequence position of row r. `inverse`
/// rotates by the opposite angle (the backward of the forward rotation).
void rope_apply(Mat& x, int64_t heads, int64_t head_dim, const std::vector<int64_t>& position, bool inverse);

/// Deterministic random numbers: std::mt19937_64 (its output sequence is fixed by the C++
/// standard) with explicit distribution code, since std::uniform_*_distribution differs
/// between standard libraries.
class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  /// Uniform in [-1, 1): the top 53 bits as a fraction.
  double uniform() { return static_cast<double>(g_() >> 11) * 0x1.0p-53 * 2.0 - 1.0; }
  /// Uniform integer in [0, n), n > 0 (modulo bias below 2^-50 for the small n used here).
  int64_t below(int64_t n) { return static_cast<int64_t>(g_() % static_cast<uint64_t>(n)); }

 private:
  std::mt19937_64 g_;
};

}  // namespace dtsim::verify
