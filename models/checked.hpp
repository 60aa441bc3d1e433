#pragma once
// Checked arithmetic on the counts inputs multiply (nodes x GPUs, dp x tp x cp x pp,
// micro-batches x layers, layouts of a sweep, sizes of `collective --factor`) and the
// limits dtsim states for them. Every product of input counts goes through mul / product
// here (GCC/Clang __builtin_mul_overflow: exact, no undefined behaviour), and every limit is
// a named constant with its reason, repeated in the error message that refuses it.
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

namespace dtsim::checked {

/// a * b, or nullopt when it does not fit in int64.
inline std::optional<int64_t> mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

/// a + b, or nullopt when it does not fit in int64.
inline std::optional<int64_t> add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

/// The product of `factors`, or nullopt when a partial product leaves int64.
inline std::optional<int64_t> product(std::initializer_list<int64_t> factors) {
  int64_t r = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(r, f, &r)) return std::nullopt;
  return r;
}

/// `v` with thousands separators ("1,048,576"), for limit messages.
inline std::string with_commas(int64_t v) {
  const uint64_t mag = v < 0 ? uint64_t{0} - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  const std::string digits = std::to_string(mag);
  std::string out = v < 0 ? "-" : "";
  const size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    out += digits[i];
    if ((n - i - 1) % 3 == 0 && i + 1 < n) out += ',';
  }
  return out;
}

}  // namespace dtsim::checked

namespace dtsim::limits {

/// GPUs of one cluster (cluster.nodes x cluster.gpus_per_node, and so dp x tp x cp x pp).
/// The largest training clusters built hold about 100,000 GPUs (xAI Colossus, 2024:
/// 100,000 H100s); 2^20 leaves a factor of ten and keeps every rank index, group list and
/// per-rank table of the rank grid, the platform and the reports in memory.
inline constexpr int64_t kMaxGpus = int64_t{1} << 20;  // 1,048,576
inline constexpr const char* kMaxGpusWhy =
    "the largest cluster dtsim models: ten times the largest built, about 100,000 GPUs, and small enough to list "
    "every rank";

/// Transformer blocks (model.layers, and layout.vp, which divides them). The deepest
/// published dense models have about 100-130 (Llama 3 405B: 126, Megatron-LM 1T: 128);
/// 2^16 leaves a factor of 500 and keeps Op::layer (int32) and the parameter count
/// (layers x 12 h^2) within range.
inline constexpr int64_t kMaxLayers = int64_t{1} << 16;  // 65,536
inline constexpr const char* kMaxLayersWhy =
    "500 times the deepest published model, Llama 3 405B's 126 layers; keeps parameter counts in 64-bit integers";

/// Widths (model.hidden, heads, kv_heads, ffn_hidden; cluster.gpu.sm_count). The widest
/// published dense layers: hidden 25,600 (Megatron-LM 1T), ffn_hidden 53,248 (Llama 3
/// 405B); 2^20 leaves a factor of 20 and keeps layers x 12 h^2 below 2^63.
inline constexpr int64_t kMaxWidth = int64_t{1} << 20;  // 1,048,576
inline constexpr const char* kMaxWidthWhy =
    "20 times the widest published layer, Llama 3 405B's ffn_hidden 53,248; keeps parameter counts in 64-bit integers";

/// Routed experts per MoE layer (model.moe.num_experts). The most published: 384 (Kimi K2),
/// 256 (DeepSeek-V3); 2^16 leaves a factor of 170, and the parameter limit below bounds
/// experts x their widths.
inline constexpr int64_t kMaxExperts = int64_t{1} << 16;  // 65,536
inline constexpr const char* kMaxExpertsWhy = "170 times the most experts of a published model, Kimi K2's 384";

/// Parameters of the whole model (models/flops.hpp total_parameters_f): the largest published
/// models hold 1-2 trillion (Kimi K2: 1.04 T; Megatron-LM's 1T); 2^50 (1.1 quadrillion) leaves
/// a factor of 500 and keeps every parameter count, and those counts x 16 bytes of model
/// states, below 2^53, exact in double and in 64-bit integers.
inline constexpr double kMaxParameters = 1125899906842624.0;  // 2^50
inline constexpr const char* kMaxParametersWhy =
    "500 times the largest published models, 1-2 trillion parameters; keeps parameter counts and their bytes exact";

/// Tokens: model.vocab, model.max_position_embeddings, training.seq_len. The largest
/// vocabularies are about 256,000 (Gemma) and the longest trained contexts 1-10 million
/// tokens; 2^24 keeps token x width products (vocab x hidden) below 2^53, exact in double.
inline constexpr int64_t kMaxTokens = int64_t{1} << 24;  // 16,777,216
inline constexpr const char* kMaxVocabWhy =
    "64 times the largest published vocabulary, about 256,000; keeps vocab x hidden exact in double precision";
inline constexpr const char* kMaxSeqWhy =
    "above the longest trained contexts, 1-10 million tokens; keeps seq_len x hidden exact in double precision";

/// Sequences: training.global_batch and micro_batch. The largest published batches are a
/// few thousand sequences (GPT-3: 1,536 x 2,048 tokens; Llama 3: 16M tokens = 2,048 x
/// 8,192); 2^24 leaves a factor of 8,000.
inline constexpr int64_t kMaxBatch = int64_t{1} << 24;  // 16,777,216
inline constexpr const char* kMaxBatchWhy =
    "8,000 times the largest published batches, a few thousand sequences (Llama 3: 2,048 x 8,192 tokens)";

/// Operations of one step plan (models/plan.hpp StagePlan::ops over all stages), counted
/// before the plan is built (models/plan.hpp plan_op_bound). Each Op is about 150 bytes
/// and the engines visit each once or a few times: 2^25 ops hold about 5 GB and take
/// minutes to simulate. The shipped experiments need at most about 4 million (Narayanan
/// 2021 GPT 1008B: 512 micro-batches x 128 layers, 3.5 million ops).
inline constexpr int64_t kMaxPlanOps = int64_t{1} << 25;  // 33,554,432
inline constexpr const char* kMaxPlanOpsWhy =
    "each op takes about 150 bytes and is simulated one by one: 2^25 ops hold about 5 GB";

/// Operations the SimGrid engine simulates in one step: the plan's operations (all stages)
/// times the ranks simulated per stage (1 folded; dp x tp x cp with --no-fold, each rank
/// running its stage's plan). Measured with --no-fold on a 2-core machine (README "Every
/// rank"), a rank-operation costs 0.16 us at 1,024 simulated ranks, 0.55 us at 16,384 and
/// about 1.4 us at 32,768, so 2^31 of them take from 6 minutes to an hour.
inline constexpr int64_t kMaxSimulatedOps = int64_t{1} << 31;  // 2,147,483,648
inline constexpr const char* kMaxSimulatedOpsWhy =
    "each is simulated one by one at 0.16-1.4 us on a 2-core machine: 2^31 take 6 minutes to an hour";

/// Ranks the SimGrid engine simulates at once (--no-fold: every GPU). The cost of each
/// simulated operation grows with the rank count (SimGrid's actors and activities outgrow
/// the processor caches: 0.3 us per rank-operation at 1,024 ranks, 1.4 us at 32,768), so that
/// a 65,536-rank step of even two micro-batches takes several minutes on a 2-core machine
/// (measured before the mailbox flows of sim/platform.hpp start_flow_proxy: 0.3 us per
/// rank-operation at 1,024 ranks).
inline constexpr int64_t kMaxSimulatedRanks = int64_t{1} << 16;  // 65,536
inline constexpr const char* kMaxSimulatedRanksWhy =
    "the cost of every simulated operation grows with the number of ranks (0.3 us at 1,024, 1.4 us at 32,768 "
    "on a 2-core machine): 65,536 ranks take minutes for even two micro-batches";

/// Memory the SimGrid engine takes per simulated rank beyond the step plan: its actors
/// (stacks as touched, SimGrid's actor and activity objects), semaphores, groups and P2P
/// bookkeeping. Measured with --no-fold on experiments/scale/llama3-405b-16k-h100.yaml:
/// peak RSS 311 MiB at 4,096 ranks, 1,056 MiB at 16,384, 1,826 MiB at 32,768 (57-63 KiB per
/// rank; README "Every rank"); 96 KiB leaves room for larger plans.
inline constexpr int64_t kEngineBytesPerRank = int64_t{96} << 10;  // 96 KiB

/// Physical values of a cluster (cluster.gpu, nvlink, nic, host_dispatch, hbm_reserve):
/// ranges that hold every GPU, link and host dtsim could be asked about with orders of
/// magnitude to spare, so that no time, rate or size derived from them overflows or
/// underflows a double (a 1 GiB transfer at 1e-300 B/s lasts 1e309 s, beyond its range; a
/// latency of 1e308 s never ends) and SimGrid, which asserts finite durations, is never
/// handed one. Checked before any work (models/experiment_check.cpp).
///  - Bandwidths (B/s): 1 kB/s to 1 PB/s. The fastest per-GPU figures are HBM3e at 8 TB/s
///    (NVIDIA B200 datasheet) and NVLink 5 at 1.8 TB/s; the slowest link anyone trains over
///    is a 1 Gb/s Ethernet port (1.25e8 B/s).
inline constexpr double kMinBandwidth = 1e3, kMaxBandwidth = 1e15;
///  - FLOP rates (FLOP/s): 1 GFLOP/s to 1 EFLOP/s per GPU; the largest datasheet peak is
///    B300's dense FP4, 15 PFLOP/s (NVIDIA Blackwell Ultra datasheet).
inline constexpr double kMinFlopRate = 1e9, kMaxFlopRate = 1e18;
///  - Efficiencies and ratios of measured to peak rate: at least 0.1%. A kernel or link a
///    thousand times below its peak is a broken measurement, not a hardware property
///    (measured GEMM / peak is 0.6-0.9, models/compute_cost.hpp).
inline constexpr double kMinEfficiency = 1e-3;
///  - Latencies and per-kernel costs (s): at most 1 s. Link latencies are about a
///    microsecond (NVLink 0.6-1 us, InfiniBand 2-5 us, NCCL's tuning model) and a kernel
///    launch 5-15 us (topologies/nodes/README.md), 10^5 times below.
inline constexpr double kMaxLatency = 1.0;
///  - Memory sizes (B): at most 1 PiB per GPU; the largest HBM is B300's 288 GB.
inline constexpr double kMaxMemoryBytes = 1125899906842624.0;  // 2^50
inline constexpr const char* kPhysicalWhy =
    "orders of magnitude beyond any GPU, link or host (models/checked.hpp), so that every derived time stays finite";

/// Published figures (experiment `published:`): a step of at most 1e6 s (11.6 days; the
/// slowest published steps take minutes) and at most 1e6 TFLOP/s per GPU (kMaxFlopRate).
inline constexpr double kMaxPublishedStepS = 1e6, kMaxPublishedTflops = kMaxFlopRate / 1e12;

/// A plan's training tokens: at most 1e16, about 300 times the largest published
/// pre-training runs (Qwen3: 36 trillion tokens, Qwen3 Technical Report, arXiv 2505.09388).
inline constexpr double kMaxTrainingTokens = 1e16;
/// Price of one GPU-hour (USD): at most 10,000, a thousand times the on-demand price of the
/// dearest cloud GPU instances (about 10 USD per GPU-hour), so that costs stay readable numbers.
inline constexpr double kMaxPricePerGpuHour = 1e4;

/// Sizes of one `dtsim collective` sweep (--min-bytes .. --max-bytes by --factor): each
/// size is one simulated collective; nccl-tests' default sweep (-b 8 -e 8G -f 2) has 31.
inline constexpr int64_t kMaxCollectiveSizes = 1000;

/// Layouts of one sweep (clusters x tp x cp x pp x vp x dp x zero_stage x micro_batch x
/// recompute x sequence_parallel): each is kept in memory with its result and evaluated by
/// the analytic engine; a million takes tens of minutes on one core.
inline constexpr int64_t kMaxSweepLayouts = 1'000'000;

/// Cluster cases of one sweep or compare file (clusters x the values of every vary key):
/// each composes and validates a whole experiment.
inline constexpr int64_t kMaxSweepClusters = 10'000;

}  // namespace dtsim::limits
