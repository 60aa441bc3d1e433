#include "topologies/gpu_presets.hpp"

#include <algorithm>
#include <cctype>

#include "models/errors.hpp"
#include "models/scalar_text.hpp"
#include "topologies/preset_lookup.hpp"

namespace dtsim {

namespace {

constexpr double TFLOPS = 1e12;  // FLOP/s
constexpr double GBps = 1e9;     // B/s (decimal, as datasheets state bandwidth)
constexpr double MiB = 1024.0 * 1024.0;
constexpr double us = 1e-6;
constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

// ---------------------------------------------------------------------------------------
// Shared measured constants (one source each; the per-GPU entries below say which apply).
//
// gemm_efficiency: the rate a GEMM sustains in training, on full tiles and full waves
// (models/compute_cost.hpp applies each GEMM's own wave fill on top).
//
// S. Bekman, "Machine Learning Engineering" (github.com/stas00/ml-engineering), measures
// it with compute/accelerator/benchmarks/mamf-finder.py, which reports two figures over a
// sweep of GEMM shapes: MAMF, "Maximum ACHIEVABLE Matmul FLOPS - the boost burst a short
// kernel can catch", and MSMF, "Maximum SUSTAINABLE Matmul FLOPS - what the chip holds once
// saturated at ~TDP" (mamf-finder.py headline comments); training is one long saturated
// run, so the sustained figure is the one that applies. Both are maxima over shapes that
// include full-wave ones, so they are full-wave rates and are not divided by a fill.
//   MSMF (ml-engineering compute/accelerator/README.md MAMF/MSMF tables, as quoted by the
//   repository's "Counting FLOPs" video material: "H200 bf16: 989 / 834 / 755" for peak /
//   MAMF / MSMF, and "the measured MSMF of 1429" for B200 against its 2250 TFLOP/s spec):
//     NVIDIA H200 SXM  755 of 989 TFLOP/s  = 0.763
//     NVIDIA B200     1429 of 2250 TFLOP/s = 0.635
//   MAMF only (BF16, benchmark v2, compute/accelerator/README.md @b9e29720; no MSMF
//   published for these parts):
//     NVIDIA A100 SXM  271.2 of 312 TFLOP/s = 0.869 (torch 2.6.0+cu126, 1024x10240x5120)
//     NVIDIA H100 SXM  794.5 of 989 TFLOP/s = 0.803 (torch 2.7.0+cu126, 2048x2048x13312)
// H100 SXM takes the H200's sustained figure: same GH100 die, same 132 SMs, same 700 W
// limit that sets the sustained clock (a stated assumption; the H100's own burst figure,
// 0.803, is an upper bound it respects). A100 keeps its burst figure, an upper bound:
// no sustained A100 measurement was found.
constexpr double kA100GemmEfficiency = 271.2 / 312.0;  // 0.869, MAMF (burst)
constexpr double kH200GemmEfficiency = 755.0 / 989.0;  // 0.763, MSMF (sustained)
constexpr double kB200GemmEfficiency = 1429.0 / 2250.0;  // 0.635, MSMF (sustained)
//
// sustained_ratio: what the shipped kernel tables (burst measurements) are divided by. The
// same source's H200 pair gives sustained / burst = MSMF / MAMF = 755 / 834 = 0.905; H100
// (and H800) take it by the same-die assumption as above. A100 and B200: no published pair
// (A100 has MAMF only, B200 MSMF only), so 1: their tables are used as measured (stated
// assumption; their times are then upper bounds on the rate).
constexpr double kHopperSustainedRatio = 755.0 / 834.0;  // 0.905, H200 MSMF / MAMF
//
// kernel_overhead: raw cuLaunchKernel cost measured in meta-pytorch/tritonbench PR #1017
// (2026-04-14, GB200): 3.0 us with 0 arguments, 3.3 us with 19 arguments; we take the
// 19-argument figure because real kernels carry arguments. Corroborated by
// JuliaGPU/CUDAdrv.jl PR #15 (statically compiled C launch overhead 4.90 us, 2017 GPU).
// Launch cost is a host/driver path, so the Blackwell figure is used for every preset;
// no A100/H100/H200-specific measurement was found (stated assumption).
constexpr double kLaunchOverhead = 3.3 * us;
// ---------------------------------------------------------------------------------------

struct Entry {
  GpuSpec spec;
};

const std::vector<Entry>& registry() {
  static const std::vector<Entry> entries = [] {
    std::vector<Entry> v;

    {  // NVIDIA A100 SXM4 80GB (Ampere)
      GpuSpec g;
      g.name = "A100-SXM4-80GB";
      // 312 TFLOP/s dense BF16. hardware.csv row "A100 SXM4 80GB": torchtitan
      // get_peak_flops @02581674 (NVIDIA product page); Narayanan 2021 (312 TF peak).
      g.peak_bf16_flops = 312 * TFLOPS;
      // No FP8 tensor cores on Ampere (hardware.csv fp8 column blank).
      g.peak_fp8_flops = 0;
      // 80 GB datasheet (hardware.csv). nvidia-smi reports a total of 81920 MiB (= 80 GiB)
      // for "NVIDIA A100-SXM4-80GB" in many public logs (found with the code search index;
      // no single canonical page), which is the figure used.
      g.hbm_bytes = 81920 * MiB;
      // 2039 GB/s HBM2e. hardware.csv row "A100 SXM4 80GB" (glennklockwood.com, datasheet).
      g.hbm_bandwidth = 2039 * GBps;
      // 0.869 = 271.2 / 312, MAMF (see top of file).
      g.gemm_efficiency = kA100GemmEfficiency;
      // 0.846 = 1724.8 / 2039: BabelStream 5.0 CUDA Triad 1724827 MB/s (Copy 1709 GB/s) on
      // "NVIDIA A100-SXM4-80GB" (Tursa, driver 12030), section "Example performance data"
      // of a UK benchmark-suite BabelStream README maintained by @aturner-epcc (a revision
      // found by code search; the current ukri-bench/benchmark-BabelStream and
      // aturner-epcc/uknss-benchmark-babelstream READMEs show other systems). Triad
      // (2 reads, 1 write) resembles the element-wise/optimizer kernels this factor models.
      g.memory_efficiency = 0.846;
      g.kernel_overhead = kLaunchOverhead;
      g.sm_count = 108;  // NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020), Table 1: 108 SMs on A100 SXM4
      g.attention_efficiency = 0.50;  // A100: Dao 2023, FlashAttention-2 (arXiv 2307.08691), abstract: "50-73% of the theoretical maximum FLOPs/s on A100"; the 73% is forward-only (Sec 4.1), so forward+backward training takes the lower end, 0.50
      // GEMM times: shipped kernel table a100_sxm, measured on "NVIDIA A100-SXM4-80GB"
      // (SGLang 0.5.10 collection of NVIDIA aiconfigurator, commit 095f58a5, Apache-2.0;
      // models/calibration/tables/README.md).
      g.kernel_tables = "a100_sxm";
      v.push_back({g});
    }

    {  // NVIDIA H100 SXM5 80GB (Hopper)
      GpuSpec g;
      g.name = "H100-SXM5-80GB";
      // 989 TFLOP/s dense BF16 (datasheet 1,979 with sparsity). hardware.csv row
      // "H100 SXM5 80GB": torchtitan get_peak_flops; glennklockwood matrix BF16 989.4.
      g.peak_bf16_flops = 989 * TFLOPS;
      // 1979 TFLOP/s dense FP8 (datasheet 3,958 with sparsity). hardware.csv same row.
      g.peak_fp8_flops = 1979 * TFLOPS;
      // 81559 MiB HBM3: MLPerf v4.0 NVIDIA SYSJSON (hardware.csv same row); datasheet 80 GB.
      g.hbm_bytes = 81559 * MiB;
      // 3350 GB/s HBM3. hardware.csv same row (hpctech datasheet table, glennklockwood).
      g.hbm_bandwidth = 3350 * GBps;
      // 0.763 = 755 / 989, the H200's sustained MSMF (same die and power limit; see top
      // of file); below the H100's own burst MAMF, 0.803.
      g.gemm_efficiency = kH200GemmEfficiency;
      // 0.867 = 2903 / 3350: "GPU D2D (HBM3) 2,903 GB/s, 86.7% of HBM3 peak" on 8x H100
      // 80GB HBM3 SXM5, CUDA 12.6 (github.com/aigatech/vpbenchmarking README, Memory
      // Bandwidth table). Cross-check: BabelStream Triad 3315 GB/s on GH200 120GB whose
      // 96 GB HBM3 is rated 4.0 TB/s, i.e. 0.83 (UoB-HPC/BabelStream#194).
      g.memory_efficiency = 0.867;
      g.kernel_overhead = kLaunchOverhead;
      g.sm_count = 132;  // NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), Table 2: 132 SMs on H100 SXM5
      g.attention_efficiency = 0.35;  // H100: Shah et al. 2024, FlashAttention-3 (arXiv 2407.08608), abstract: "FlashAttention-2 achieving only 35% utilization on H100"; FA2-class kernels are what 2024 training stacks ran (FA3: 75% forward, not yet the default)
      // GEMM times: shipped kernel table h100_sxm, measured on "NVIDIA H100 80GB HBM3"
      // (vLLM 0.24.0 collection of NVIDIA aiconfigurator, commit 095f58a5, Apache-2.0;
      // models/calibration/tables/README.md).
      g.kernel_tables = "h100_sxm";
      g.sustained_ratio = kHopperSustainedRatio;  // see top of file
      v.push_back({g});
    }

    {  // NVIDIA H200 SXM 141GB (Hopper, HBM3e)
      GpuSpec g;
      g.name = "H200-SXM-141GB";
      // 989 TFLOP/s dense BF16, same GH100 compute as H100. hardware.csv row
      // "H200 SXM 141GB": torchtitan get_peak_flops (989e12 BF16).
      g.peak_bf16_flops = 989 * TFLOPS;
      // 1979 TFLOP/s dense FP8 (3,958 sparse). hardware.csv same row (lzwjava, aiminingco).
      g.peak_fp8_flops = 1979 * TFLOPS;
      // 141 GB datasheet (hardware.csv); nvidia-smi reports 143771 MiB for
      // "NVIDIA H200" (NVIDIA/cuda-samples#311, driver 550.54.15).
      g.hbm_bytes = 143771 * MiB;
      // 4800 GB/s HBM3e. hardware.csv same row.
      g.hbm_bandwidth = 4800 * GBps;
      // 0.763 = 755 / 989, MSMF, sustained at the 700 W limit (see top of file).
      g.gemm_efficiency = kH200GemmEfficiency;
      // No published H200 streaming-bandwidth measurement found. Derived from the
      // same-generation measured H100 SXM (0.867).
      g.memory_efficiency = 0.867;
      g.kernel_overhead = kLaunchOverhead;
      g.sm_count = 132;  // same GH100 die as H100 SXM5 (NVIDIA H200 product brief: H200 is built on Hopper): 132 SMs
      g.attention_efficiency = 0.35;  // H200: same GH100 compute as H100; the H100 FlashAttention-2 figure (Shah et al. 2024) applies
      // GEMM times: shipped kernel table h200_sxm, measured on "NVIDIA H200"
      // (vLLM 0.24.0 collection of NVIDIA aiconfigurator, commit 095f58a5, Apache-2.0;
      // models/calibration/tables/README.md).
      g.kernel_tables = "h200_sxm";
      g.sustained_ratio = kHopperSustainedRatio;  // see top of file
      v.push_back({g});
    }

    {  // NVIDIA B200 (HGX/DGX B200, 1000 W) (Blackwell)
      GpuSpec g;
      g.name = "B200";
      // 2250 TFLOP/s dense BF16. hardware.csv row "B200 (HGX/DGX B200, 1000W)": torchtitan
      // get_peak_flops (2.25e15, Blackwell datasheet); glennklockwood HGX B200 BF16 2250.
      g.peak_bf16_flops = 2250 * TFLOPS;
      // 4500 TFLOP/s dense FP8. hardware.csv same row (glennklockwood).
      g.peak_fp8_flops = 4500 * TFLOPS;
      // 9000 TFLOP/s dense FP4 (datasheet 18 PFLOPS with sparsity; NVIDIA DGX B200 datasheet:
      // 144 PFLOPS FP4 inference (sparse) over 8 GPUs = 18 sparse, 9 dense per GPU).
      g.peak_fp4_flops = 9000 * TFLOPS;
      // Blackwell (sm_100) tensor cores take MXFP8 / MXFP4 / NVFP4 block-scaled operands
      // natively (NVIDIA Blackwell architecture technical brief, "second-generation
      // Transformer Engine ... micro-tensor scaling"; PTX ISA 8.7 tcgen05.mma .block_scale).
      g.microscaling = true;
      // 180 GB = DGX B200 1,440 GB / 8 GPUs (hardware.csv same row, DGX-B200 wiki). Other
      // sources say 192 GB physical; the DGX usable figure is taken (capacity conflict noted
      // in hardware.csv).
      g.hbm_bytes = 180e9;
      // 8000 GB/s HBM3e (DGX B200 64 TB/s / 8). hardware.csv same row.
      g.hbm_bandwidth = 8000 * GBps;
      // 0.635 = 1429 / 2250, MSMF, sustained at the 1000 W limit (see top of file).
      g.gemm_efficiency = kB200GemmEfficiency;
      // 0.840 = 6.721 / 8.0: CUB DeviceTransform "add" (2 reads + 1 write, like STREAM
      // Triad), F16, 2^28 elements: 6.721 TB/s on "NVIDIA B200" (NVIDIA/cccl PR #7391,
      // benchmark table).
      g.memory_efficiency = 0.840;
      g.kernel_overhead = kLaunchOverhead;  // measured on GB200 (same generation)
      g.sm_count = 148;  // 148 SMs as reported for B200 (two reticle dies; NVIDIA Blackwell architecture technical brief does not tabulate SMs; secondary sources, partially verified)
      g.attention_efficiency = 0.35;  // B200: no published fused-attention utilization found; assumed equal to the Hopper FlashAttention-2 figure (Shah et al. 2024) - an assumption, not a measurement
      // GEMM times: shipped kernel table b200_sxm, measured on "NVIDIA B200"
      // (vLLM 0.24.0 collection of NVIDIA aiconfigurator, commit 095f58a5, Apache-2.0;
      // models/calibration/tables/README.md).
      g.kernel_tables = "b200_sxm";
      v.push_back({g});
    }
    {  // NVIDIA H800 SXM5 80GB: the export H100 (same GH100 die, clocks, HBM3 and SMs; NVLink cut
       // to 400 GB/s bidirectional, dgx-h800 in topologies/node_presets.cpp). Every compute
       // figure is the H100-SXM5-80GB preset's (hardware.csv "H800 SXM" lists only its
       // NVLink; DeepSeek-V3 report arXiv 2412.19437 Sec 3.1 trains on "H800 GPUs").
      GpuSpec g = v[1].spec;  // H100-SXM5-80GB: every figure and its source as cited there,
                              // and its GEMM table (same die and clocks: the H100's times apply)
      g.name = "H800-SXM5-80GB";  // NVIDIA's SKU name (hardware.csv "H800 SXM")
      v.push_back({g});
    }
    // ---------------------------------------------------------------------------------
    // AMD Instinct (CDNA3 / CDNA4). Self-contained block: every figure and its source here.
    // Sources used by all three:
    //   [MLE] S. Bekman, ml-engineering compute/accelerator/README.md @744d01e6: "TFLOPS
    //         comparison table" (dense peaks, AMD's product pages as its notes 17, 18, 22),
    //         the memory table, and the BF16 MAMF table (mamf-finder.py, burst rate; no MSMF
    //         is published for AMD parts, so, as for A100 above, the burst rate is used: an
    //         upper bound on the sustained one).
    //   [ROCm] ROCm documentation, "AMD GPU specifications" (rocm.docs.amd.com
    //         reference/gpu-specs): VRAM (GiB) and Compute Units per part.
    // sm_count is the Compute Unit count (a CU is the unit a kernel's workgroups are spread
    // over, as an SM's thread blocks: models/compute_cost.hpp's wave fill reads it).
    // kernel_overhead: no HIP launch-overhead measurement was found; the CUDA figure above
    // (3.3 us, tritonbench PR #1017) is used (stated assumption).
    // attention_efficiency: no published fused-attention training utilisation on these parts
    // was found; the Hopper FlashAttention-2 figure 0.35 (Shah et al. 2024) is assumed, as for
    // B200 (stated assumption, not a measurement).
    // No kernel tables ship for AMD parts (models/calibration/tables/README.md): kernel_tables
    // stays empty and sustained_ratio 1.
    {  // AMD Instinct MI300X (CDNA3, gfx942, 750 W OAM)
      GpuSpec g;
      g.name = "MI300X";
      // 1307.4 TFLOP/s dense BF16 matrix (AMD MI300X product page / datasheet; [MLE] lists it
      // as 1300, its formula table as 1307 = 2100 MHz x 1216 Matrix Cores x 256 FMA x 2).
      g.peak_bf16_flops = 1307.4 * TFLOPS;
      // 2614.9 TFLOP/s dense FP8 = 2 x BF16 (AMD MI300X datasheet; [MLE] 2610, "w/o sparsity").
      g.peak_fp8_flops = 2614.9 * TFLOPS;
      // No FP4 matrix math on CDNA3 ([MLE] fp4 column "X"); no microscaling.
      g.hbm_bytes = 192 * GiB;  // [ROCm] VRAM 192 GiB (8 HBM3 stacks); [MLE] 192 GB
      g.hbm_bandwidth = 5300 * GBps;  // 5.3 TB/s HBM3, AMD datasheet; [MLE] memory table 5.30
      // 0.511 = 668.4 / 1307.4: MAMF 668.4 TFLOP/s BF16 on MI300X ([MLE] BF16 MAMF table,
      // torch 2.5.1+rocm6.3, PYTORCH_TUNABLEOP_ENABLED=1, best shape 10240x15360x8192).
      g.gemm_efficiency = 668.4 / 1307.4;
      // 0.745 = 3948.1 / 5300: BabelStream 5.0 HIP Triad 3,948,061 MB/s (double, 2^28
      // elements) on "AMD Instinct MI300X", the expected output in AMD's MI300X BabelStream
      // validation guide (pass threshold 3,885,301 MB/s; ROCm system-validation documentation,
      // found by code search). Triad as for A100 above.
      g.memory_efficiency = 3948.061 / 5300.0;
      g.kernel_overhead = kLaunchOverhead;  // stated assumption (above)
      g.sm_count = 304;                     // [ROCm] 304 CUs (38 per XCD, 8 XCDs)
      g.attention_efficiency = 0.35;        // stated assumption (above)
      v.push_back({g});
    }
    {  // AMD Instinct MI325X (CDNA3, gfx942, 1000 W OAM): MI300X compute, HBM3E
      GpuSpec g = v.back().spec;  // MI300X: compute peaks, CU count, efficiencies as cited there
      g.name = "MI325X";
      // Same 1307.4 / 2614.9 TFLOP/s dense BF16 / FP8 as MI300X ([MLE] note 18: "MI325X is the
      // same compute as MI300X, but has more memory and more power").
      g.hbm_bytes = 256 * GiB;        // [ROCm] VRAM 256 GiB (HBM3E); [MLE] 256 GB
      g.hbm_bandwidth = 6000 * GBps;  // 6 TB/s HBM3E (AMD MI325X product page; [MLE] 6.00)
      // 0.600 = 784.9 / 1307.4: MAMF 784.9 TFLOP/s BF16 on MI325X at 1000 W ([MLE] BF16 MAMF
      // table, torch 2.6.0+rocm6.2.4, PYTORCH_TUNABLEOP_ENABLED=1, 13312x10240x8192).
      g.gemm_efficiency = 784.9 / 1307.4;
      // memory_efficiency: no MI325X streaming measurement found; the MI300X Triad ratio is
      // used (same CDNA3 memory controllers, HBM3E stacks; stated assumption).
      v.push_back({g});
    }
    {  // AMD Instinct MI355X (CDNA4, gfx950, 1400 W liquid-cooled OAM)
      GpuSpec g;
      g.name = "MI355X";
      // 2500 TFLOP/s dense BF16 matrix (AMD MI355X product page, "2.5 PFLOPS" rounded by AMD;
      // the clock formula gives 2516.6: 2400 MHz x 1024 Matrix Cores x 512 FMA x 2; [MLE]).
      g.peak_bf16_flops = 2500 * TFLOPS;
      // 5000 TFLOP/s dense FP8 (AMD MI355X product page; [MLE] 5000; 10.1 PFLOPS is the
      // structured-sparsity figure, [MLE] note 22).
      g.peak_fp8_flops = 5000 * TFLOPS;
      // 10100 TFLOP/s dense MXFP4 (AMD MI355X product page "10.1 PFLOPS" FP4, no sparsity
      // qualifier; [MLE] fp4 column and note 22: dense).
      g.peak_fp4_flops = 10100 * TFLOPS;
      // CDNA4 matrix cores take the OCP Microscaling formats (MXFP8 / MXFP6 / MXFP4) with
      // their E8M0 block scales natively: "scaled MFMA" instructions of CDNA4 (meta TLX gfx950
      // kernel catalogue, facebookexperimental.github.io/triton tlx-gfx950: "E4M3 + E8M0
      // microscales ... CDNA4 scaled MFMA"); AMD CDNA 4 architecture white paper ("industry-
      // standard micro-scaled MXFP6 and MXFP4 data types", as reported from Hot Chips 2025).
      g.microscaling = true;
      g.hbm_bytes = 288 * GiB;        // [ROCm] VRAM 288 GiB (HBM3E); [MLE] 288 GB
      g.hbm_bandwidth = 8000 * GBps;  // 8 TB/s HBM3E (AMD MI355X product page; [MLE] 8.00)
      // 0.626 = 1565.0 / 2500: MAMF 1565.0 TFLOP/s BF16 on MI355X ([MLE] BF16 MAMF table,
      // torch 2.8.0+rocm7.0.2, PYTORCH_TUNABLEOP_ENABLED=0, 12288x8192x8192).
      g.gemm_efficiency = 1565.0 / 2500.0;
      // No MI355X streaming measurement found: the MI300X BabelStream Triad ratio (0.745,
      // above) is used (stated assumption).
      g.memory_efficiency = 3948.061 / 5300.0;
      g.kernel_overhead = kLaunchOverhead;  // stated assumption (above)
      g.sm_count = 256;                     // [ROCm] 256 CUs (32 per XCD, 8 XCDs)
      g.attention_efficiency = 0.35;        // stated assumption (above)
      v.push_back({g});
    }
    // ---------------------------------------------------------------------------------
    return v;
  }();
  return entries;
}

}  // namespace

const GpuSpec* find_gpu_preset(std::string_view name) {
  const Entry* e = presets::find(registry(), name, [](const Entry& x) -> const std::string& { return x.spec.name; });
  return e ? &e->spec : nullptr;
}

const GpuSpec& gpu_preset(std::string_view name) {
  if (const GpuSpec* g = find_gpu_preset(name)) return *g;
  throw InputError("unknown GPU preset \"" + std::string(name) + "\" (valid: " + gpu_preset_list() + ")");
}

std::vector<std::string> gpu_preset_names() {
  return presets::names(registry(), [](const Entry& x) -> const std::string& { return x.spec.name; });
}

std::string gpu_preset_list() { return text::join(gpu_preset_names()); }

}  // namespace dtsim
