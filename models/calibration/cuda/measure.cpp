// Host side of the CUDA calibrator (models/calibration/measure.hpp): device identity,
// buffers, cuBLASLt GEMMs, dtsim's own kernels (kernels.cu), CUDA-event timing.
#include "models/calibration/measure.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <tuple>
#include <memory>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "models/calibration/cuda/kernels.cuh"

namespace dtsim::calib {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(fmt::format("CUDA error in {}: {}", what, cudaGetErrorString(e)));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(fmt::format("cuBLASLt error {} in {}", int(s), what));
}

/// Device buffer freed on scope exit.
struct Buf {
  void* p = nullptr;
  explicit Buf(size_t bytes) { check(cudaMalloc(&p, std::max<size_t>(bytes, 256)), "cudaMalloc"); }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  template <class T = void>
  T* as() const { return static_cast<T*>(p); }
};

// Memory-bound kernels and the optimizer are capped so that calibrating a 175B model does
// not need tens of GB: larger sizes are measured at the cap and at cap/4, and the profile's
// bandwidth model carries them (models/calibration/profile.hpp).
constexpr double kMaxMemoryBytes = 2.0 * (1ull << 30);  // 2 GiB of traffic
constexpr double kMaxOptimizerParams = 1ull << 27;      // 134M parameters (2.4 GB of state)
constexpr int64_t kRowCols = 4096;                      // row length of the row kernels

class Timer {
 public:
  Timer(const MeasureOptions& o, cudaStream_t s) : o_(o), s_(s) {
    check(cudaEventCreate(&a_), "cudaEventCreate");
    check(cudaEventCreate(&b_), "cudaEventCreate");
  }
  ~Timer() {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  /// Median seconds of `f` over the repetitions, after the warm-up runs.
  template <class F>
  double median(F&& f) {
    for (int i = 0; i < o_.warmup; ++i) f();
    check(cudaStreamSynchronize(s_), "warm-up");
    std::vector<double> ts;
    for (int i = 0; i < o_.repetitions; ++i) {
      check(cudaEventRecord(a_, s_), "cudaEventRecord");
      f();
      check(cudaEventRecord(b_, s_), "cudaEventRecord");
      check(cudaEventSynchronize(b_), "cudaEventSynchronize");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, a_, b_), "cudaEventElapsedTime");
      ts.push_back(ms * 1e-3);
    }
    check(cudaGetLastError(), "kernel launch");
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
  }

 private:
  MeasureOptions o_;
  cudaStream_t s_;
  cudaEvent_t a_{}, b_{};
};

/// A prepared kernel: buffers allocated, launch ready to repeat.
struct Prepared {
  std::vector<std::unique_ptr<Buf>> bufs;
  std::function<void()> launch;
};

/// cuBLASLt descriptors of one GEMM, destroyed with the last launch closure holding them.
struct GemmDescs {
  cublasLtMatmulDesc_t op{};
  cublasLtMatrixLayout_t a{}, b{}, c{};
  cublasLtMatmulAlgo_t algo{};
  ~GemmDescs() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

class Runner {
 public:
  Runner(const MeasureOptions& o, std::ostream& log) : o_(o), log_(log) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
      throw NoCudaDevice(e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount returned 0 devices");
    if (o.device >= n) throw NoCudaDevice(fmt::format("--device {} but only {} device(s)", o.device, n));
    check(cudaSetDevice(o.device), "cudaSetDevice");
    check(cudaStreamCreate(&s_), "cudaStreamCreate");
    check(cublasLtCreate(&lt_), "cublasLtCreate");
    check(cudaGetDeviceProperties(&prop_, o.device), "cudaGetDeviceProperties");
    workspace_ = std::make_unique<Buf>(kWorkspace);
  }
  ~Runner() {
    cublasLtDestroy(lt_);
    cudaStreamDestroy(s_);
  }
  cudaStream_t stream() const { return s_; }
  bool fp8_ok() const { return prop_.major * 10 + prop_.minor >= 89; }  // Ada / Hopper and newer

  DeviceIdentity identity() const {
    DeviceIdentity d;
    d.name = prop_.name;
    d.compute_capability = fmt::format("{}.{}", prop_.major, prop_.minor);
    d.sm_count = prop_.multiProcessorCount;
    int khz = 0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, o_.device) == cudaSuccess) d.sm_clock_mhz = khz / 1000.0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, o_.device) == cudaSuccess)
      d.memory_clock_mhz = khz / 1000.0;
    int drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    d.driver = fmt::format("CUDA driver API {}.{}", drv / 1000, (drv % 1000) / 10);
    d.cuda_runtime = fmt::format("{}.{}", rt / 1000, (rt % 1000) / 10);
    d.cublaslt = std::to_string(cublasLtGetVersion());
    d.attention_impl =
        "dtsim flash-style kernel (models/calibration/cuda/kernels.cu: online softmax, CUDA cores, no tensor "
        "cores; backward = forward sweep x 2.5); not cuDNN/FlashAttention, so attention times are upper bounds";
    return d;
  }

  Prepared prepare(const KernelSpec& k) {
    Prepared p;
    auto buf = [&](size_t bytes) {
      p.bufs.push_back(std::make_unique<Buf>(bytes));
      return p.bufs.back()->p;
    };
    const cudaStream_t s = s_;
    switch (k.kind) {
      case KernelClass::gemm: return prepare_gemm(k.gemm);
      case KernelClass::attention: {
        const auto& a = k.attention;
        void* q = buf(a.batch * a.heads * a.seq_q * a.head_dim * 2);
        void* kk = buf(a.batch * a.kv_heads * a.seq_kv * a.head_dim * 2);
        void* v = buf(a.batch * a.kv_heads * a.seq_kv * a.head_dim * 2);
        void* o = buf(a.batch * a.heads * a.seq_q * a.head_dim * 2);
        cuda::fill_bf16(q, a.batch * a.heads * a.seq_q * a.head_dim, 1, s);
        cuda::fill_bf16(kk, a.batch * a.kv_heads * a.seq_kv * a.head_dim, 2, s);
        cuda::fill_bf16(v, a.batch * a.kv_heads * a.seq_kv * a.head_dim, 3, s);
        if (a.head_dim > 256) throw std::runtime_error("attention head_dim > 256 is not supported by the calibrator");
        // Backward stand-in: FlashAttention-2 backward does 2.5x the forward's matmul work
        // (Dao 2023 Sec 3.1.2); modelled as two forward sweeps plus half of one.
        const int passes = a.backward ? 2 : 1;
        p.launch = [=] {
          cuda::attention(q, kk, v, o, a.batch, a.heads, a.kv_heads, a.seq_q, a.seq_kv, a.head_dim, a.causal, passes,
                          s);
          if (a.backward)
            cuda::attention(q, kk, v, o, a.batch, a.heads, a.kv_heads, a.seq_q / 2 > 0 ? a.seq_q / 2 : 1, a.seq_kv,
                            a.head_dim, a.causal, 1, s);
        };
        return p;
      }
      case KernelClass::memory: {
        const std::string& n = k.name;
        const bool norm = n.find("norm") != std::string::npos;
        const bool softmax = n.find("softmax") != std::string::npos || n.find("cross_entropy") != std::string::npos;
        if (norm || softmax) {  // read + write bf16: 4 bytes per element
          const int64_t elems = std::max<int64_t>(kRowCols, static_cast<int64_t>(k.bytes / 4));
          const int64_t rows = std::max<int64_t>(1, elems / kRowCols);
          void* in = buf(rows * kRowCols * 2);
          void* out = buf(rows * kRowCols * 2);
          cuda::fill_bf16(in, rows * kRowCols, 4, s);
          p.launch = [=] {
            if (norm) cuda::row_norm(in, out, rows, kRowCols, s);
            else cuda::row_softmax(in, out, rows, kRowCols, s);
          };
        } else {  // two bf16 inputs, one output: 6 bytes per element
          const int64_t elems = std::max<int64_t>(1, static_cast<int64_t>(k.bytes / 6));
          void* a = buf(elems * 2);
          void* b = buf(elems * 2);
          void* o = buf(elems * 2);
          cuda::fill_bf16(a, elems, 5, s);
          cuda::fill_bf16(b, elems, 6, s);
          p.launch = [=] { cuda::elementwise(a, b, o, elems, s); };
        }
        return p;
      }
      case KernelClass::optimizer: {
        const int64_t n = static_cast<int64_t>(k.params);
        float* g = static_cast<float*>(buf(n * 4));
        float* w = static_cast<float*>(buf(n * 4));
        float* m = static_cast<float*>(buf(n * 4));
        float* v = static_cast<float*>(buf(n * 4));
        void* out = buf(n * 2);
        for (float* f : {g, w, m, v}) cuda::fill_f32(f, n, 7, s);
        check(cudaMemsetAsync(v, 0, n * 4, s), "cudaMemsetAsync");
        p.launch = [=] { cuda::adam(g, w, m, v, out, n, s); };
        return p;
      }
    }
    return p;
  }

  double time(const std::function<void()>& f) {
    Timer t(o_, s_);
    return t.median(f);
  }

 private:
  static constexpr size_t kWorkspace = 32ull << 20;

  Prepared prepare_gemm(const GemmShape& g) {
    Prepared p;
    const bool fp8 = g.dtype == Dtype::fp8;
    const size_t in_bytes = fp8 ? 1 : 2;
    p.bufs.push_back(std::make_unique<Buf>(g.m * g.k * in_bytes));
    p.bufs.push_back(std::make_unique<Buf>(g.k * g.n * in_bytes));
    p.bufs.push_back(std::make_unique<Buf>(g.m * g.n * 2));
    void* A = p.bufs[0]->p;
    void* B = p.bufs[1]->p;
    void* C = p.bufs[2]->p;
    if (!fp8) {
      cuda::fill_bf16(A, g.m * g.k, 8, s_);
      cuda::fill_bf16(B, g.k * g.n, 9, s_);
    } else {
      check(cudaMemsetAsync(A, 0x38, g.m * g.k, s_), "cudaMemsetAsync");  // 0x38 = 1.0 in e4m3
      check(cudaMemsetAsync(B, 0x30, g.k * g.n, s_), "cudaMemsetAsync");
    }
    // Row-major C[m x n] = op(A)[m x k] op(B)[k x n] is column-major C^T = op(B)^T op(A)^T:
    // cuBLASLt gets (n, m, k) with the operands swapped. FP8 needs the "TN" form on
    // Hopper (cuBLASLt docs, "FP8 ... A must be transposed"), so fp8 GEMMs are timed in it.
    const bool ta = fp8 ? true : g.trans_b, tb = fp8 ? false : g.trans_a;  // column-major ops of (B, A)
    const int64_t M = g.n, N = g.m, K = g.k;
    const cudaDataType_t in_t = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    auto d = std::make_shared<GemmDescs>();
    check(cublasLtMatmulDescCreate(&d->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa), "TRANSA");
    check(cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob), "TRANSB");
    check(cublasLtMatrixLayoutCreate(&d->a, in_t, ta ? K : M, ta ? M : K, ta ? K : M), "layout A");
    check(cublasLtMatrixLayoutCreate(&d->b, in_t, tb ? N : K, tb ? K : N, tb ? N : K), "layout B");
    check(cublasLtMatrixLayoutCreate(&d->c, CUDA_R_16BF, M, N, M), "layout C");
    cublasLtMatmulPreference_t pref;
    check(cublasLtMatmulPreferenceCreate(&pref), "preference");
    const size_t ws = kWorkspace;
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
          "workspace");
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt_, d->op, d->a, d->b, d->c, d->c, pref, 1, &heur, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (hs != CUBLAS_STATUS_SUCCESS || found == 0)
      throw std::runtime_error(fmt::format("cuBLASLt has no algorithm for gemm m={} n={} k={} {}", g.m, g.n, g.k,
                                           to_string(g.dtype)));
    d->algo = heur.algo;
    cublasLtHandle_t lt = lt_;
    void* wsp = workspace_->p;
    cudaStream_t s = s_;
    p.launch = [=] {
      const float alpha = 1.0f, beta = 0.0f;
      // Column-major: C^T = op(B^T) op(A^T), so B's buffer is the first operand.
      check(cublasLtMatmul(lt, d->op, &alpha, B, d->a, A, d->b, &beta, C, d->c, C, d->c, &d->algo, wsp, ws, s),
            "cublasLtMatmul");
    };
    return p;
  }

  MeasureOptions o_;
  std::ostream& log_;
  cudaStream_t s_{};
  cublasLtHandle_t lt_{};
  cudaDeviceProp prop_{};
  std::unique_ptr<Buf> workspace_;
};

}  // namespace

ComputeProfile measure_kernels_on_device(const std::vector<KernelSpec>& kernels, const MeasureOptions& opt, std::ostream& log) {
  Runner r(opt, log);
  ComputeProfile prof;
  prof.device = r.identity();
  // Expand capped sizes: measure at the cap and a quarter of it instead (see kMax*).
  std::vector<KernelSpec> todo;
  std::vector<std::string> seen;
  auto add = [&](const KernelSpec& k) {
    const std::string key = k.key();
    if (std::find(seen.begin(), seen.end(), key) == seen.end()) seen.push_back(key), todo.push_back(k);
  };
  for (const auto& k : kernels) {
    if (k.kind == KernelClass::memory && k.bytes > kMaxMemoryBytes) {
      for (double f : {1.0, 0.25}) {
        KernelSpec c = k;
        c.bytes = kMaxMemoryBytes * f;
        add(c);
      }
    } else if (k.kind == KernelClass::optimizer && k.params > kMaxOptimizerParams) {
      for (double f : {1.0, 0.25}) {
        KernelSpec c = k;
        c.params = kMaxOptimizerParams * f;
        add(c);
      }
    } else if (k.kind == KernelClass::gemm && k.gemm.dtype == Dtype::fp8 && !r.fp8_ok()) {
      log << "skipping (no FP8 tensor cores on this device): " << k.key() << '\n';
    } else {
      add(k);
    }
  }
  for (size_t i = 0; i < todo.size(); ++i) {
    const KernelSpec& k = todo[i];
    Prepared p = r.prepare(k);
    const double t = r.time(p.launch);
    log << fmt::format("[{}/{}] {:>10.3f} us  {}\n", i + 1, todo.size(), t * 1e6, k.key());
    prof.measurements.push_back({k, t});
  }
  return prof;
}

double measure_sequence_on_device(const std::vector<OpKernel>& ops, const MeasureOptions& opt, std::ostream& log) {
  Runner r(opt, log);
  std::vector<Prepared> ps;
  std::vector<int> counts;
  for (const auto& op : ops) {
    ps.push_back(r.prepare(op.spec));
    counts.push_back(std::max(1, static_cast<int>(std::ceil(op.count))));
  }
  log << fmt::format("running {} kernels back to back\n", ps.size());
  return r.time([&] {
    for (size_t i = 0; i < ps.size(); ++i)
      for (int c = 0; c < counts[i]; ++c) ps[i].launch();
  });
}

namespace {

// The plugin's side of models/calibration/measure.hpp CalibratorPlugin: no exception leaves
// the shared object.
template <class F>
int guarded(std::string& error, F&& f) {
  try {
    f();
    return 0;
  } catch (const NoCudaDevice& e) {
    error = e.what();
    return 1;
  } catch (const std::exception& e) {
    error = e.what();
    return 2;
  }
}

const CalibratorPlugin kPlugin{
    .abi = kCalibratorAbi,
    .profile_size = sizeof(ComputeProfile),
    .spec_size = sizeof(KernelSpec),
    .options_size = sizeof(MeasureOptions),
    .measure_kernels = [](const std::vector<KernelSpec>& kernels, const MeasureOptions& opt, std::ostream& log,
                          ComputeProfile& out, std::string& error) {
      return guarded(error, [&] { out = measure_kernels_on_device(kernels, opt, log); });
    },
    .measure_sequence = [](const std::vector<OpKernel>& ops, const MeasureOptions& opt, std::ostream& log,
                           double& out, std::string& error) {
      return guarded(error, [&] { out = measure_sequence_on_device(ops, opt, log); });
    },
};

}  // namespace

}  // namespace dtsim::calib

extern "C" __attribute__((visibility("default"))) const dtsim::calib::CalibratorPlugin* dtsim_calibrator_plugin() {
  return &dtsim::calib::kPlugin;
}
