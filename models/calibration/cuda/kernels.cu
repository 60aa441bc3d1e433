// dtsim's own calibration kernels: memory-bound kernels and a simple flash-style
// attention. Written for clarity and a short compile, not peak speed.
#include <cuda_bf16.h>

#include "models/calibration/cuda/kernels.cuh"

namespace dtsim::calib::cuda {
namespace {

constexpr int kThreads = 256;

__device__ float hash_unit(uint64_t i, uint32_t seed) {
  uint32_t x = static_cast<uint32_t>(i * 2654435761ull) ^ (seed * 0x9E3779B9u);
  x ^= x >> 16;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  return (static_cast<float>(x & 0xFFFF) / 65535.0f - 0.5f) * 0.1f;
}

__global__ void fill_bf16_k(__nv_bfloat16* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(hash_unit(i, seed));
}
__global__ void fill_f32_k(float* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = hash_unit(i, seed);
}

__device__ float block_sum(float v, float* shared) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  float t = 0;
  for (int w = 0; w < blockDim.x / 32; ++w) t += shared[w];
  __syncthreads();
  return t;
}
__device__ float block_max(float v, float* shared) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  float t = -1e30f;
  for (int w = 0; w < blockDim.x / 32; ++w) t = fmaxf(t, shared[w]);
  __syncthreads();
  return t;
}

__global__ void row_norm_k(const __nv_bfloat16* in, __nv_bfloat16* out, int64_t cols) {
  __shared__ float sh[32];
  const __nv_bfloat16* r = in + blockIdx.x * cols;
  float ss = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float x = __bfloat162float(r[c]);
    ss += x * x;
  }
  const float inv = rsqrtf(block_sum(ss, sh) / static_cast<float>(cols) + 1e-5f);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    out[blockIdx.x * cols + c] = __float2bfloat16(__bfloat162float(r[c]) * inv);
}

__global__ void row_softmax_k(const __nv_bfloat16* in, __nv_bfloat16* out, int64_t cols) {
  __shared__ float sh[32];
  const __nv_bfloat16* r = in + blockIdx.x * cols;
  float mx = -1e30f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) mx = fmaxf(mx, __bfloat162float(r[c]));
  mx = block_max(mx, sh);
  float s = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += __expf(__bfloat162float(r[c]) - mx);
  const float inv = 1.0f / block_sum(s, sh);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    out[blockIdx.x * cols + c] = __float2bfloat16(__expf(__bfloat162float(r[c]) - mx) * inv);
}

__global__ void elementwise_k(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = __bfloat162float(a[i]);
    const float g = 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
    out[i] = __float2bfloat16(g * __bfloat162float(b[i]));
  }
}

__global__ void adam_k(const float* grad, float* master, float* m, float* v, __nv_bfloat16* p, int64_t n) {
  const float lr = 1e-4f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = grad[i];
    const float mi = b1 * m[i] + (1 - b1) * g;
    const float vi = b2 * v[i] + (1 - b2) * g * g;
    const float w = master[i] - lr * mi / (sqrtf(vi) + eps);
    m[i] = mi, v[i] = vi, master[i] = w;
    p[i] = __float2bfloat16(w);
  }
}

// One block of kQ threads handles kQ queries of one (batch, head); each thread owns one
// query row (d <= 256 values in registers/local memory); K/V tiles of kKv rows are staged
// in shared memory. Online softmax (Milakov & Gimelshein 2018; Dao 2022 FlashAttention).
constexpr int kQ = 64;
constexpr int kKv = 32;
constexpr int kMaxD = 256;

__global__ void attention_k(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                            __nv_bfloat16* out, int64_t heads, int64_t kv_heads, int64_t sq, int64_t skv, int d,
                            bool causal, int passes) {
  extern __shared__ float smem[];  // [2][kKv][d]
  float* ks = smem;
  float* vs = smem + kKv * d;
  const int64_t bh = blockIdx.y;  // batch * heads + head
  const int64_t batch = bh / heads, head = bh % heads;
  const int64_t kvh = head / (heads / kv_heads);
  const int64_t qi = blockIdx.x * int64_t(kQ) + threadIdx.x;
  const bool active = qi < sq;
  const __nv_bfloat16* qrow = q + (bh * sq + (active ? qi : 0)) * d;
  const __nv_bfloat16* kb = k + (batch * kv_heads + kvh) * skv * d;
  const __nv_bfloat16* vb = v + (batch * kv_heads + kvh) * skv * d;
  float qr[kMaxD], acc[kMaxD];
  for (int i = 0; i < d; ++i) qr[i] = __bfloat162float(qrow[i]), acc[i] = 0;
  float mx = -1e30f, l = 0;
  const float scale = rsqrtf(static_cast<float>(d));
  // Causal: query i sees keys j <= i + (skv - sq) (queries are the last sq positions).
  const int64_t last_q = min(sq, (int64_t(blockIdx.x) + 1) * kQ) - 1;
  const int64_t kv_end = causal ? min(skv, last_q + (skv - sq) + 1) : skv;
  for (int pass = 0; pass < passes; ++pass) {
    for (int64_t t0 = 0; t0 < kv_end; t0 += kKv) {
      __syncthreads();
      for (int i = threadIdx.x; i < kKv * d; i += blockDim.x) {
        const int64_t row = t0 + i / d;
        ks[i] = row < skv ? __bfloat162float(kb[row * d + i % d]) : 0.f;
        vs[i] = row < skv ? __bfloat162float(vb[row * d + i % d]) : 0.f;
      }
      __syncthreads();
      if (!active) continue;
      for (int j = 0; j < kKv; ++j) {
        const int64_t kj = t0 + j;
        if (kj >= skv || (causal && kj > qi + (skv - sq))) break;
        float s = 0;
        for (int i = 0; i < d; ++i) s += qr[i] * ks[j * d + i];
        s *= scale;
        const float nm = fmaxf(mx, s);
        const float corr = __expf(mx - nm), p = __expf(s - nm);
        l = l * corr + p;
        for (int i = 0; i < d; ++i) acc[i] = acc[i] * corr + p * vs[j * d + i];
        mx = nm;
      }
    }
  }
  if (active)
    for (int i = 0; i < d; ++i) out[(bh * sq + qi) * d + i] = __float2bfloat16(acc[i] / l);
}

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 * 8 ? (b > 0 ? b : 1) : 65535 * 8);
}

}  // namespace

void fill_bf16(void* p, int64_t n, uint32_t seed, cudaStream_t s) {
  fill_bf16_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(p), n, seed);
}
void fill_f32(float* p, int64_t n, uint32_t seed, cudaStream_t s) { fill_f32_k<<<blocks_for(n), kThreads, 0, s>>>(p, n, seed); }
void row_norm(const void* in, void* out, int64_t rows, int64_t cols, cudaStream_t s) {
  row_norm_k<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(in),
                                                                static_cast<__nv_bfloat16*>(out), cols);
}
void row_softmax(const void* in, void* out, int64_t rows, int64_t cols, cudaStream_t s) {
  row_softmax_k<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(in),
                                                                   static_cast<__nv_bfloat16*>(out), cols);
}
void elementwise(const void* a, const void* b, void* out, int64_t n, cudaStream_t s) {
  elementwise_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(a),
                                                   static_cast<const __nv_bfloat16*>(b),
                                                   static_cast<__nv_bfloat16*>(out), n);
}
void adam(const float* grad, float* master, float* m, float* v, void* param_bf16, int64_t n, cudaStream_t s) {
  adam_k<<<blocks_for(n), kThreads, 0, s>>>(grad, master, m, v, static_cast<__nv_bfloat16*>(param_bf16), n);
}
void attention(const void* q, const void* k, const void* v, void* out, int64_t b, int64_t heads, int64_t kv_heads,
               int64_t sq, int64_t skv, int64_t d, bool causal, int kv_passes, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((sq + kQ - 1) / kQ), static_cast<unsigned>(b * heads));
  const size_t shmem = 2 * kKv * d * sizeof(float);
  if (shmem > 48 * 1024) cudaFuncSetAttribute(attention_k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shmem));
  attention_k<<<grid, kQ, shmem, s>>>(static_cast<const __nv_bfloat16*>(q), static_cast<const __nv_bfloat16*>(k),
                                      static_cast<const __nv_bfloat16*>(v), static_cast<__nv_bfloat16*>(out), heads,
                                      kv_heads, sq, skv, static_cast<int>(d), causal, kv_passes);
}

}  // namespace dtsim::calib::cuda
