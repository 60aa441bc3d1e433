#pragma once
// Launch wrappers of dtsim's own calibration kernels (kernels.cu). Plain C++ declarations
// so that measure.cpp (host code, g++) can call them. All pointers are device pointers;
// every launch goes to `stream` and returns without synchronising.
#include <cstdint>

#include <cuda_runtime.h>

namespace dtsim::calib::cuda {

/// Fills n bf16 elements (as raw uint16) with small pseudo-random values.
void fill_bf16(void* p, int64_t n, uint32_t seed, cudaStream_t stream);
/// Fills n fp32 elements with small pseudo-random values.
void fill_f32(float* p, int64_t n, uint32_t seed, cudaStream_t stream);

/// Row-wise RMS/LayerNorm-style kernel: rows x cols bf16 in -> bf16 out (one block per row):
/// reads and writes 2 * rows * cols * 2 bytes.
void row_norm(const void* in, void* out, int64_t rows, int64_t cols, cudaStream_t stream);
/// Row-wise softmax (also the cross-entropy and fused softmax-dropout pattern), bf16.
void row_softmax(const void* in, void* out, int64_t rows, int64_t cols, cudaStream_t stream);
/// Element-wise out = gelu(a) * b (bias-GeLU / SwiGLU / residual-add pattern), bf16:
/// reads 2 n, writes n elements.
void elementwise(const void* a, const void* b, void* out, int64_t n, cudaStream_t stream);
/// Fused Adam step over n parameters: fp32 grad, master, m, v; bf16 param copy out.
void adam(const float* grad, float* master, float* m, float* v, void* param_bf16, int64_t n, cudaStream_t stream);
/// Flash-style attention forward (online softmax, K/V tiles through shared memory, CUDA
/// cores, fp32 accumulation; no tensor cores): q [b, heads, sq, d], k/v [b, kv_heads, skv, d]
/// bf16, out like q. head_dim <= 256. `kv_passes` >= 1 repeats the K/V sweep (the backward
/// stand-in runs 2.5x the forward work, see measure.cpp).
void attention(const void* q, const void* k, const void* v, void* out, int64_t b, int64_t heads, int64_t kv_heads,
               int64_t sq, int64_t skv, int64_t d, bool causal, int kv_passes, cudaStream_t stream);

}  // namespace dtsim::calib::cuda
