#include "topologies/node_presets.hpp"

#include <algorithm>
#include <cctype>

#include "models/errors.hpp"
#include "topologies/gpu_presets.hpp"
#include "models/scalar_text.hpp"
#include "topologies/preset_lookup.hpp"

namespace dtsim {

namespace {

constexpr double GBps = 1e9;      // B/s
constexpr double Gbps = 1e9 / 8;  // bit/s -> B/s
constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
constexpr double us = 1e-6;

// ---------------------------------------------------------------------------------------
// Per-step latency (alpha) of NCCL's Ring/Simple protocol, from NCCL's own tuning model:
// NVIDIA/nccl src/graph/tuning.cc @b6475625, table hwLat[hw][algo][proto] (microseconds):
//   NVLINK Ring Simple 3.4   (PCI 5.7)
//   NET    Ring Simple 14.0  (NCCL 2.7-era version of the same file, @01afd20a: 9.6)
// NCCL adds a per-collective baseLat (Ring Simple 8.4 us) on top of nsteps * hwLat; that
// fixed term has no place in LinkSpec (per-step latency) and is left to the collective model.
constexpr double kNvlinkStepLatency = 3.4 * us;
constexpr double kNetStepLatency = 14.0 * us;

// HBM kept back per GPU. Documented assumption, not a measurement of a training job:
//   CUDA context ~0.3 GB with lazy module loading, >1 GB before CUDA 11.7
//     (pytorch/pytorch#107667, ptrblck);
//   one NCCL communicator with AllReduce on 8 GPUs ~1.6 GB; more communicators use more
//     unless created with ncclCommSplit sharing resources (NVIDIA/nccl#864, #986, sjeaugey).
// 2 GiB covers the context plus one communicator's buffers. Allocator fragmentation is
// workload-dependent and is NOT reserved here (memory models may add it explicitly).
constexpr double kHbmReserve = 2 * GiB;

// NIC efficiency = NCCL achievable per-NIC bandwidth / line rate:
//   HDR 200 Gb/s = 25 GB/s line; "24GB/s is the peak performance per 200G NIC"
//     (sjeaugey, NVIDIA/nccl-tests#119)                              -> 24/25 = 0.96
//   NDR 400 Gb/s = 50 GB/s line; "For NDR @ 400Gbps you should see 46-48GB/s per NIC"
//     (AddyLaddy, NVIDIA/nccl-tests#290); midpoint 47                  -> 47/50 = 0.94
constexpr double kHdrEfficiency = 24.0 / 25.0;
constexpr double kNdrEfficiency = 47.0 / 50.0;

// NVLink SHARP (NVLS) efficiency = per-GPU NVLink rate an NVLS AllReduce sustains / line
// rate. NVLS moves (n+1)/n S per GPU and direction (S/n of reduced shard in and every shard
// out to the switch, then the reduced shard out and n shards in; NVIDIA/nccl NVLS kernels,
// sim/collectives/nvls.cpp). On 8 x H100 "you should reach a peak busBw of ~480GB/s
// (algbw ~275GB/s)" (sjeaugey, NVIDIA/nccl-tests#212; nccl_busbw.csv): 275 GB/s x 9/8 =
// 309 GB/s per direction of 450 GB/s line rate -> 0.6875. The same model then gives 411,
// 441, 463 GB/s busbw for 5, 6, 7 GPUs against 420, 440, 460 measured (NVIDIA/nccl#1455).
constexpr double kNvlsEfficiency = 275.0 * 9.0 / 8.0 / 450.0;

// Host dispatch (ClusterSpec::host_dispatch, models/host_dispatch.hpp): host CPU seconds
// eager PyTorch spends per kernel launch. Measured as the CPU time of one torch.nn.Linear
// forward (one cuBLAS GEMM launch, with autograd recording), BF16, hidden 2048, 8192 tokens
// (NVIDIA/TransformerEngine#2053, 2025-08-11, "CPU runtime" column):
//   H100 DGX (2 x Intel Xeon Platinum 8480C)   13.48 us
//   GB200 (Grace, Neoverse V2)                  37.08 us
// (GH200: 33.17 us.) Transformer Engine's own modules cost more CPU in that report (GB200
// 99.66 us per te.Linear); TE has since cut its BF16 linear's CPU overhead to "nearly the
// same with vanilla torch linear" (NVIDIA/TransformerEngine#2126, 2026-01-03), so the torch
// figure stands for a current Megatron-Core + TE step. x86 hosts without a measurement of
// their own (DGX A100: AMD EPYC 7742; DGX B200: Xeon Platinum 8570; DGX H200 / H800: Xeon
// 8480C class) take the DGX H100 figure (stated assumption).
constexpr double kX86HostDispatch = 13.48 * us;    // TE#2053, H100 DGX torch CPU runtime
constexpr double kGraceHostDispatch = 37.08 * us;  // TE#2053, GB200 torch CPU runtime
// ---------------------------------------------------------------------------------------

const std::vector<NodePreset>& registry() {
  static const std::vector<NodePreset> entries = [] {
    std::vector<NodePreset> v;
    {
      NodePreset n;
      n.name = "dgx-a100";
      n.gpu = "A100-SXM4-80GB";  // Selene nodes (Narayanan 2021 Sec 5; hardware.csv "Selene")
      n.gpus_per_node = 8;
      // NVLink3: 12 links x 25 GB/s per direction = 300 GB/s per direction per GPU through
      // NVSwitch gen2 (hardware.csv "A100 SXM4 80GB": 600 GB/s bidirectional; nccl-tests#149).
      n.nvlink.bandwidth = 300 * GBps;
      n.nvlink.latency = kNvlinkStepLatency;
      // 230 of 300 GB/s: "should reach 230 GB/s" AllReduce busbw on 8x A100 SXM4 80GB
      // (sjeaugey, NVIDIA/nccl-tests#149; nccl_busbw.csv) -> 0.767.
      n.nvlink.efficiency = 230.0 / 300.0;
      // 8 x 200 Gb/s HDR InfiniBand compute HCAs (hardware.csv "Selene DGX A100 node";
      // storage HCAs excluded).
      n.nics_per_node = 8;
      n.nic.bandwidth = 200 * Gbps;
      n.nic.latency = kNetStepLatency;
      n.nic.efficiency = kHdrEfficiency;
      n.hbm_reserve_bytes = kHbmReserve;
      n.host_dispatch = kX86HostDispatch;
      v.push_back(n);
    }
    {
      NodePreset n;
      n.name = "dgx-h100";
      n.gpu = "H100-SXM5-80GB";
      n.gpus_per_node = 8;
      // NVLink4: 18 links, 900 GB/s bidirectional = 450 GB/s per direction per GPU via
      // NVSwitch gen3 (hardware.csv "H100 SXM5 80GB" and "NVIDIA Eos DGX H100 node").
      n.nvlink.bandwidth = 450 * GBps;
      n.nvlink.latency = kNvlinkStepLatency;
      // ~370 of 450 GB/s with NCCL_ALGO=RING ("450 GB/s line rate minus ~20% protocol
      // overhead"; sjeaugey, NVIDIA/nccl-tests#212; user measurements 365-370 in
      // NVIDIA/nccl#1455 and 368.76 in nccl-tests#309) -> 0.822.
      n.nvlink.efficiency = 370.0 / 450.0;
      n.nvls_efficiency = kNvlsEfficiency;  // NVSwitch gen3 has SHARP; measured on H100 (above)
      // 8 x ConnectX-7 NDR 400 Gb/s compute NICs (MLPerf v4.0 Eos SYSJSON; hardware.csv).
      n.nics_per_node = 8;
      n.nic.bandwidth = 400 * Gbps;
      n.nic.latency = kNetStepLatency;
      n.nic.efficiency = kNdrEfficiency;
      n.hbm_reserve_bytes = kHbmReserve;
      n.host_dispatch = kX86HostDispatch;
      v.push_back(n);
    }
    {
      NodePreset n;
      n.name = "dgx-h200";
      n.gpu = "H200-SXM-141GB";
      n.gpus_per_node = 8;
      // Same NVLink4 / NVSwitch gen3 as H100: 900 GB/s bidirectional (hardware.csv
      // "H200 SXM 141GB"), 450 GB/s per direction.
      n.nvlink.bandwidth = 450 * GBps;
      n.nvlink.latency = kNvlinkStepLatency;
      // No Ring busbw published for H200 (NVIDIA/nccl-tests#272 reports NVLS AllReduce peak
      // 475 GB/s, matching H100's ~480 NVLS figure). Same NVLink4 fabric: H100 ring ratio
      // 370/450 is used (derived, stated).
      n.nvlink.efficiency = 370.0 / 450.0;
      // NVLS peak 475 GB/s busbw on 8 x H200 (NVIDIA/nccl-tests#272), i.e. the H100 figure
      // (480): same NVSwitch gen3, same efficiency.
      n.nvls_efficiency = kNvlsEfficiency;
      // DGX H200 keeps DGX H100's 8 x 400 Gb/s NDR compute NICs. Not verified against a
      // source here: validation/hardware.csv has no DGX H200 row.
      n.nics_per_node = 8;
      n.nic.bandwidth = 400 * Gbps;
      n.nic.latency = kNetStepLatency;
      n.nic.efficiency = kNdrEfficiency;
      n.hbm_reserve_bytes = kHbmReserve;
      n.host_dispatch = kX86HostDispatch;
      v.push_back(n);
    }
    {
      NodePreset n;
      n.name = "dgx-b200";
      n.gpu = "B200";
      n.gpus_per_node = 8;
      // NVLink5: 1.8 TB/s bidirectional = 900 GB/s per direction per GPU (hardware.csv
      // "B200": 14.4 TB/s NVLink per 8 GPUs, DGX-B200 wiki).
      n.nvlink.bandwidth = 900 * GBps;
      n.nvlink.latency = kNvlinkStepLatency;
      // No NVLink5 ring busbw found. Derived from the NVLink4 ring ratio 370/450
      // (nccl-tests#212): explicit assumption until a B200 measurement exists.
      n.nvlink.efficiency = 370.0 / 450.0;
      // NVLink 5 switches keep NVLink SHARP; no B200 NVLS busbw found: the H100 ratio is
      // used (explicit assumption, as for the ring efficiency above).
      n.nvls_efficiency = kNvlsEfficiency;
      // 8 x ConnectX-7 400 Gb/s compute NICs: "B200-class HGX systems ship eight ConnectX-7
      // adapters at 400 Gb/s for east-west traffic" (rillor.com, "ConnectX-7 vs ConnectX-8
      // and NVLink5", secondary source). Same NDR efficiency as dgx-h100.
      n.nics_per_node = 8;
      n.nic.bandwidth = 400 * Gbps;
      n.nic.latency = kNetStepLatency;
      n.nic.efficiency = kNdrEfficiency;
      n.hbm_reserve_bytes = kHbmReserve;
      n.host_dispatch = kX86HostDispatch;
      v.push_back(n);
    }
    {
      NodePreset n;
      n.name = "gb200-nvl72";
      // The 72 Blackwell GPUs of the rack's NVLink Switch domain (18 compute trays x 4
      // GPUs, 9 NVLink Switch trays; NVIDIA Multi-Node NVLink tuning guide, "Understanding
      // your Grace-Blackwell systems", 72x1 configuration). The GB200's B200 runs at 1200 W
      // (hardware.csv "B200 in GB200", 2500 TFLOP/s, single unverified source); the verified
      // HGX B200 preset (2250 TFLOP/s) is used until a GB200 GPU preset exists.
      n.gpu = "B200";
      n.gpus_per_node = 72;
      // NVLink 5: 1.8 TB/s bidirectional per GPU = 900 GB/s per direction (hardware.csv
      // "B200 in GB200": 1800; 72 x 1.8 TB/s = the 130 TB/s NVLink bandwidth NVIDIA states
      // for the rack).
      n.nvlink.bandwidth = 900 * GBps;
      n.nvlink.latency = kNvlinkStepLatency;
      // No NVL72 ring busbw found: the NVLink4 ring ratio 370/450 (nccl-tests#212) is used,
      // as for dgx-b200 (explicit assumption).
      n.nvlink.efficiency = 370.0 / 450.0;
      // NVLink Switch trays keep NVLink SHARP; H100 ratio used (explicit assumption). NCCL
      // 2.19-2.20 did not yet run NVLS across a multi-node NVLink domain ("MNNVL: NVLS not
      // yet supported", NVIDIA/nccl src/graph/tuning.cc @b6475625); later NCCL releases do.
      n.nvls_efficiency = kNvlsEfficiency;
      // One ConnectX-7 400 Gb/s compute NIC per GPU (4 per compute tray; the tuning guide
      // lists CX7 in the GB200 compute tray, NVIDIA's GB300 NVL72 reference architecture has
      // 4 HCAs per tray). 72 per NVLink domain; same NDR efficiency as dgx-h100.
      n.nics_per_node = 72;
      n.nic.bandwidth = 400 * Gbps;
      n.nic.latency = kNetStepLatency;
      n.nic.efficiency = kNdrEfficiency;
      n.hbm_reserve_bytes = kHbmReserve;
      n.host_dispatch = kGraceHostDispatch;  // Grace CPUs (above)
      v.push_back(n);
    }
    {
      // DGX / HGX H800 (DeepSeek-V3's cluster, arXiv 2412.19437 Sec 3.1: 8 GPUs per node on
      // NVLink and NVSwitch, InfiniBand across nodes; DeepEP's benchmark machine).
      NodePreset n = v[1];  // dgx-h100: NVLink latency, NICs and reserve with the sources cited there
      n.name = "dgx-h800";
      n.gpu = "H800-SXM5-80GB";
      // 400 GB/s bidirectional = 200 GB/s per direction; measured ~160 GB/s unidirectional
      // (hardware.csv "H800 SXM": deepseek-ai/DeepSeek-V3#28, deepseek-ai/DeepEP#16) -> 0.8.
      n.nvlink.bandwidth = 200 * GBps;
      n.nvlink.efficiency = 160.0 / 200.0;
      // 8 x ConnectX-7 400 Gb/s InfiniBand per node ("CX7 400 Gb/s InfiniBand", DeepEP
      // README / docs/legacy.md test setup), NDR efficiency as dgx-h100.
      v.push_back(n);
    }
    // ---------------------------------------------------------------------------------
    // AMD Instinct platforms (8 OAM GPUs on a fully connected Infinity Fabric / xGMI mesh, no
    // switch: every GPU pair has its own link; intra_node xgmi_mesh, so nvlink.bandwidth is
    // per peer link and direction). Self-contained block: every figure and its source here.
    //
    // xGMI link rate and RCCL's efficiency on it (MI300X, gfx942):
    //   64 GB/s per link and direction: "xGMI's raw bandwidth is rated up to 64 GB/s for each
    //   point-to-point link", 7 links = "448 GB/s (7x64 GB/s)" aggregated unidirectional per
    //   GPU (AMD ROCm blog "Understanding RCCL Bandwidth and xGMI Performance on AMD Instinct
    //   MI300X", 2025-03-02, ROCm/rocm-blogs blogs/software-tools-optimization/mi300x-rccl-xgmi;
    //   the MI300X platform datasheet's 896 GB/s is the same 7 x 64 x 2 bidirectional).
    //   Efficiency 0.712 = 318.98 / 448: rccl-tests all_reduce_perf busbw 318.98 GB/s at 16 GiB
    //   (314.72 at 1 GiB) on 8 x MI300X, RCCL 2.22.3, ROCm 6.3 (same blog); dtsim's ring on the
    //   mesh runs at 7 links x 64 GB/s x efficiency (sim/collectives/collective.hpp CommModel,
    //   from RCCL's ring permutations). Consistent with the blog's per-link figure ("usable
    //   bandwidth to approximately 48 GB/s per link", TransferBench 45-47 GB/s per link) and
    //   with RCCL's own link model (ncclTopoXGMISpeed, 48 GB/s for gfx94: ROCm/rccl#1210).
    constexpr double kXgmiMi300Efficiency = 318.98 / (7 * 64.0);
    //   Per-step latency: RCCL's tuning model for 8 fully connected MI300X (rome_model_79/81
    //   options "tuning=5": ROCm/rccl src/graph/tuning.cc @0cbce2a7 tuning_model_5, hwLat NVLINK
    //   Ring Simple 2.1 us).
    constexpr double kXgmiStepLatency = 2.1 * us;
    // NICs: one NIC per GPU: RCCL's rome_model_81 (the 8-GPU MI300X mesh with 8 NICs, each
    // beside one GPU: gdrLevel PATH_PXB on the diagonal) and TensorWave's MI300X/MI325X
    // clusters ("Each GPU has a dedicated RDMA NIC ... 8 independent rails (rdma0-rdma7)",
    // docs.tensorwave.com/slurm/performance). 400 Gb/s each: the 400G class (ConnectX-7 NDR,
    // AMD Pensando Pollara 400 AI NIC, RCCL's AINIC support ROCm/rccl#2078) that these
    // platforms are built with; the exact NIC varies by vendor (stated assumption, not a
    // single datasheet). The NDR efficiency (47 of 50 GB/s, above) is assumed for every
    // 400 Gb/s NIC (no RCCL per-NIC busbw found) and the NCCL network step latency likewise
    // (RCCL's tuning_model_5 Net Ring Simple entry, 320 us, is a tuner bias, not a latency).
    // HBM reserve and host dispatch: the DGX assumptions above (ROCm context and RCCL buffers
    // taken as CUDA's and NCCL's; x86 EPYC hosts as the x86 DGX figure): stated assumptions.
    // NVLS: none (no switch), nvls_efficiency 0.
    {
      NodePreset n;
      n.name = "mi300x";
      n.gpu = "MI300X";
      n.gpus_per_node = 8;
      n.intra_node = IntraNode::xgmi_mesh;
      n.nvlink.bandwidth = 64 * GBps;  // per xGMI link and direction (above)
      n.nvlink.latency = kXgmiStepLatency;
      n.nvlink.efficiency = kXgmiMi300Efficiency;
      n.nvls_efficiency = 0;
      n.nics_per_node = 8;
      n.nic.bandwidth = 400 * Gbps;
      n.nic.latency = kNetStepLatency;
      n.nic.efficiency = kNdrEfficiency;
      n.hbm_reserve_bytes = kHbmReserve;
      n.host_dispatch = kX86HostDispatch;
      v.push_back(n);
    }
    {
      // MI325X platform: same gfx942 xGMI mesh (7 links x 64 GB/s per direction, 896 GB/s
      // bidirectional per GPU: AMD MI325X product page) and the MI300X RCCL efficiency
      // (RCCL models every gfx94 link alike, ncclTopoXGMISpeed; stated).
      NodePreset n = v.back();  // mi300x, with the sources cited there
      n.name = "mi325x";
      n.gpu = "MI325X";
      v.push_back(n);
    }
    {
      // MI355X platform: 4th-gen Infinity Fabric, 7 links of 153.6 GB/s bidirectional =
      // 76.8 GB/s per direction (AMD MI355X specifications, peak Infinity Fabric link bandwidth
      // 153.6 GB/s, 1075.2 GB/s over 7 links; checked here only against a secondary source:
      // "Infinity Fabric/XGMI provides ~153 GB/s of bidirectional bandwidth", Hume Consulting
      // MI355X analysis). No RCCL busbw on MI355X found: the MI300X efficiency and step
      // latency are used (stated assumption). NICs: 8 x 400 Gb/s (above).
      NodePreset n = v.back();
      n.name = "mi355x";
      n.gpu = "MI355X";
      n.nvlink.bandwidth = 76.8 * GBps;
      v.push_back(n);
    }
    // ---------------------------------------------------------------------------------
    return v;
  }();
  return entries;
}

}  // namespace

double default_host_dispatch() { return kX86HostDispatch; }

const NodePreset* find_node_preset(std::string_view name) {
  return presets::find(registry(), name, [](const NodePreset& n) -> const std::string& { return n.name; });
}

ClusterSpec cluster_of(const NodePreset& n, int64_t nodes) {
  ClusterSpec c;
  c.gpu = gpu_preset(n.gpu);
  c.nodes = nodes;
  c.gpus_per_node = n.gpus_per_node;
  c.intra_node = n.intra_node;
  c.nvlink = n.nvlink;
  c.nvls_efficiency = n.nvls_efficiency;
  c.nics_per_node = n.nics_per_node;
  c.nic = n.nic;
  c.hbm_reserve_bytes = n.hbm_reserve_bytes;
  c.host_dispatch = n.host_dispatch;
  return c;
}

const NodePreset& node_preset(std::string_view name) {
  if (const NodePreset* n = find_node_preset(name)) return *n;
  throw InputError("unknown node preset \"" + std::string(name) + "\" (valid: " + node_preset_list() + ")");
}

std::vector<std::string> node_preset_names() {
  return presets::names(registry(), [](const NodePreset& n) -> const std::string& { return n.name; });
}

std::string node_preset_list() { return text::join(node_preset_names()); }

}  // namespace dtsim
