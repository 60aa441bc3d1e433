// The collective models against measured NCCL (issue 18, item 2).
//
// Data: tests/data/nccl/<system>_nccl.csv, nccl-tests AllReduce, AllGather, ReduceScatter and
// AllToAll inside one NVLink domain, 2/4/8 GPUs (GB200/GB300: 2/4), 512 B - 512 MiB, half and
// int8, NCCL 2.29.2 (A100: 2.27.3). Measured by NVIDIA for aiconfigurator (Apache-2.0; source,
// commit, units and changes: tests/data/nccl/README.md).
//
// Check: for every point the model covers, dtsim's bus bandwidth (the tuner's choice and its
// closed form, which `dtsim collective` reproduces on one node: no inter-node flows) is within
// 10% of the measured one. Every other point is matched by a rule of kOutside below, which
// names why it is outside the model; the test prints those ratios and fails if a rule is never
// used (a stale exclusion) or a point is neither checked nor excluded.
//
// Data types: dtsim's collectives carry bf16/fp32 (training), which NCCL runs with NVLS. The
// int8 rows of the reducing collectives are checked against the ring model: NCCL runs NVLS
// only for the types of ncclNvlsSupported() (NVIDIA/nccl src/include/device.h @v2.29.2-1:
// int32/uint32/int64/uint64/half/bf16, float/double; not int8), and for AllGather whatever
// the type (src/enqueue.cc, "ncclNvlsSupported(...) || aggBeg->func == ncclFuncAllGather").
// That is where the 8-GPU int8 AllReduce reaches only ~351 GB/s against ~445 GB/s in half.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "sim/collectives/collective.hpp"
#include "sim/collectives/tuner.hpp"
#include "topologies/node_presets.hpp"

namespace dtsim::collectives {
namespace {

constexpr double MiB = 1024.0 * 1024.0;
constexpr double kTolerance = 0.10;

struct System {
  const char* file;    // tests/data/nccl/<file>_nccl.csv
  const char* preset;  // dtsim node preset
  bool blackwell;
};
const System kSystems[] = {
    {"a100_sxm", "dgx-a100", false}, {"h100_sxm", "dgx-h100", false}, {"h200_sxm", "dgx-h200", false},
    {"b200_sxm", "dgx-b200", true},  {"b300_sxm", "dgx-b300", true},  {"gb200", "gb200-nvl72", true},
    {"gb300", "gb300-nvl72", true},
};

struct Row {
  std::string op;  // all_reduce, all_gather, reduce_scatter, alltoall
  std::string dtype;
  int64_t n = 0;
  double bytes = 0;
  double seconds = 0;
};

std::vector<Row> read_table(const std::string& file) {
  const auto path = std::filesystem::path(DTSIM_SOURCE_DIR) / "tests/data/nccl" / (file + "_nccl.csv");
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::vector<Row> rows;
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "op_name,nccl_dtype,num_gpus,message_size,latency_ms") << path;
  while (std::getline(in, line)) {
    std::stringstream ss(line);
    std::string f[5];
    for (auto& x : f) std::getline(ss, x, ',');
    Row r;
    r.op = f[0];
    r.dtype = f[1];
    r.n = std::stoll(f[2]);
    // message_size is an element count (README.md): 2 bytes for half, 1 for int8.
    r.bytes = std::stod(f[3]) * (r.dtype == "half" ? 2.0 : 1.0);
    r.seconds = std::stod(f[4]) * 1e-3;
    rows.push_back(r);
  }
  return rows;
}

CollOp op_of(const std::string& op) {
  if (op == "all_reduce") return CollOp::AllReduce;
  if (op == "all_gather") return CollOp::AllGather;
  if (op == "reduce_scatter") return CollOp::ReduceScatter;
  return CollOp::AllToAll;
}

// Where the model does not hold, and why. A point is outside when it matches a rule: every
// field that is set matches (op/dtype/system "" = any; max_gpus 0 = any; sizes in
// [from_bytes, below_bytes), below_bytes 0 = no upper end).
struct Outside {
  const char* op;
  const char* dtype;
  const char* system;  // file stem, e.g. "a100_sxm"
  bool blackwell_only;
  int64_t max_gpus;
  double from_bytes, below_bytes;
  const char* why;
};

// What the model claims and this test checks: the bandwidth-bound end on Ampere and Hopper
// nodes: 512 MiB AllReduce (4 and 8 GPUs, ring or NVLS as the tuner picks), AllGather and
// ReduceScatter (8 GPUs, ring), and 256 MiB AllReduce on 8 GPUs.
const Outside kOutside[] = {
    // 1. Below 256 MiB. dtsim's collectives are alpha-beta: NCCL's per-step latency (hwLat,
    //    3.4 us per ring step, NVLS one step; src/graph/tuning.cc) plus size / bandwidth. The
    //    measured busbw ramps up far more slowly (8-GPU H100 AllGather: 82 GB/s at 2 MiB, 234 at
    //    32 MiB, 299 at 128 MiB): a fixed cost of 40-100 us that shows even at 256-512 MiB
    //    (marginal rate between 256 and 512 MiB against the average) and a chunked pipeline over
    //    NCCL's channels (src/enqueue.cc: channels and chunks per size) that neither dtsim nor
    //    NCCL's own tuner model (tuning.cc ncclTopoGetAlgoTime: latency + bytes / busBw, the same
    //    alpha-beta form) describes. Small sizes (512 B - 64 KiB, LL protocol) come within 10% on
    //    H100/H200 8 GPUs but 1.3-1.8x off on A100 and Blackwell (~15 us modelled against
    //    22-25 us measured): launch overheads outside NCCL's latency table; not claimed.
    {"", "", "", false, 0, 0, 256 * MiB, "below 256 MiB: NCCL's pipeline ramp and fixed costs are not alpha-beta"},
    // 2. At 256 MiB the same fixed cost still weighs 7-16% for AllGather, ReduceScatter and
    //    4-GPU AllReduce (their per-GPU volume is 2-4x smaller than an 8-GPU AllReduce's).
    {"all_gather", "", "", false, 0, 256 * MiB, 512 * MiB, "256 MiB AllGather: fixed cost (rule 1) still 7-16%"},
    {"reduce_scatter", "", "", false, 0, 256 * MiB, 512 * MiB, "256 MiB ReduceScatter: fixed cost (rule 1) still 7-16%"},
    {"all_reduce", "", "", false, 4, 256 * MiB, 512 * MiB, "256 MiB AllReduce on 2-4 GPUs: fixed cost (rule 1)"},
    // 3. AllToAll. nccl-tests' alltoall is one group of ncclSend/ncclRecv to every peer (P2P
    //    channels: src/enqueue.cc scheduleP2pTasksToPlan, src/graph/paths.cc
    //    ncclTopoComputeP2pChannels). Measured busbw stays at 0.78-0.88 of the ring's on 8 GPUs
    //    (H100 315 GB/s at 512 MiB against 335-445) and lower on fewer; dtsim's direct algorithm
    //    runs the P2P traffic at the ring rate (nvlink.efficiency). NCCL has no tuner model of
    //    P2P bandwidth to take a lower rate from.
    {"alltoall", "", "", false, 0, 0, 0, "AllToAll (grouped send/recv) runs below the ring rate; NCCL has no P2P bandwidth model"},
    // 4. Two GPUs (ring AllGather, ReduceScatter, AllReduce) and four GPUs (AllGather,
    //    ReduceScatter). Measured asymptotic busbw grows with the GPU count (H100 AllGather,
    //    marginal rate from 256 to 512 MiB: 274, 332, 349 GB/s on 2, 4, 8 GPUs; B200 459, 586,
    //    638). NCCL's tuner gives one rate whatever the local GPU count (busBw = nChannels x
    //    bwIntra, tuning.cc ncclTopoTuneModel; neither the ring search, search.cc
    //    ncclTopoCompute, nor the channel duplication, connect.cc ncclTopoPostset, depends on
    //    the number of local ranks), and so does dtsim. H100 2-GPU AllGather: 258 GB/s
    //    measured against 368 modelled at 512 MiB.
    {"", "", "", false, 2, 0, 0, "2 GPUs: ring below NCCL's (and dtsim's) per-GPU ring rate; not in NCCL's model"},
    {"all_gather", "", "", false, 4, 0, 0, "4-GPU AllGather below NCCL's per-GPU ring rate (rule 4)"},
    {"reduce_scatter", "", "", false, 4, 0, 0, "4-GPU ReduceScatter below NCCL's per-GPU ring rate (rule 4)"},
    // 5. int8 ReduceScatter (ring: no NVLS for int8, header). Measured 8-13% slower than the
    //    ring the same table's int8 AllReduce runs at (H100 8 GPUs, 512 MiB: busbw 328 against
    //    355 GB/s), while NCCL's tuner gives ring ReduceScatter and AllReduce one bus bandwidth
    //    (tuning.cc: busBw = nChannels x bwIntra for both) and so does dtsim.
    {"reduce_scatter", "int8", "", false, 0, 0, 0, "int8 ReduceScatter: 8-13% under the same ring's AllReduce; one busBw in NCCL's model"},
    // 6. A100 (NCCL 2.27.3) 8-GPU AllGather: 205 GB/s at 512 MiB against the 227 of the ring
    //    rate dgx-a100 takes from measured AllReduce busbw (230/300, topologies/nodes/
    //    dgx-a100.yaml), x1.107; same GPU-count/op effect as rules 4-5, not in NCCL's model.
    {"all_gather", "", "a100_sxm", false, 0, 0, 0, "A100 AllGather ~10% under the AllReduce ring rate; not in NCCL's model"},
    // 7. Blackwell (B200, B300, GB200, GB300), NCCL 2.29.2. The ring and NVLS rates are NCCL's
    //    own figures (nvlink.efficiency 721.8/900 = 18 x SM100_NVLINK_BW, src/graph/topo.h;
    //    nvls_efficiency with tuning.cc nvlsEfficiency 0.74/0.85; topologies/nodes/README.md),
    //    but the measured NCCL 2.29.2 stays 10-20% below them even at 512 MiB on 8 GPUs (B200
    //    AllGather 617 against ~697 GB/s, AllReduce 704 against ~820): NCCL does not reach its
    //    own tuner bandwidth there, and no NCCL constant says by how much.
    {"", "", "", true, 0, 0, 0, "Blackwell: NCCL 2.29.2 measures 10-20% under its own tuner bandwidth (nChannels x bwIntra)"},
};

const Outside* outside(const Row& r, const System& s) {
  for (const auto& o : kOutside) {
    if (*o.op && r.op != o.op) continue;
    if (*o.dtype && r.dtype != o.dtype) continue;
    if (*o.system && std::string(s.file) != o.system) continue;
    if (o.blackwell_only && !s.blackwell) continue;
    if (o.max_gpus && r.n > o.max_gpus) continue;
    if (r.bytes < o.from_bytes) continue;
    if (o.below_bytes > 0 && r.bytes >= o.below_bytes) continue;
    return &o;
  }
  return nullptr;
}

struct Modelled {
  double seconds = 0;
  std::string algorithm;
};

Modelled model(const ClusterSpec& c, const Row& r) {
  const int64_t gpn = c.gpus_per_node;
  const int64_t per_nic = std::max<int64_t>(1, gpn / std::max<int64_t>(1, c.nics_per_node));
  const GroupLayout g = GroupLayout::first(r.n, gpn, per_nic);
  const CommModel m = CommModel::of(c);
  const CollOp op = op_of(r.op);
  CollectiveChoice want;
  // int8 AllReduce / ReduceScatter: no NVLS in NCCL (header); the tuner's best without it is
  // the ring (one node, no tree at these sizes).
  if (r.dtype == "int8" && (op == CollOp::AllReduce || op == CollOp::ReduceScatter)) want.algorithm = "ring";
  const Choice ch = choose(op, g, m, r.bytes, want, /*strict=*/true, "test");
  return {ch.time_s, std::string(ch.algorithm->name()) + "/" + to_string(ch.protocol)};
}

TEST(NcclMeasured, BusBandwidthWithinTenPercentWhereTheModelHolds) {
  std::map<const Outside*, int> used;
  int checked = 0, excluded = 0;
  for (const auto& s : kSystems) {
    const ClusterSpec c = cluster_of(node_preset(s.preset), 1);
    for (const Row& r : read_table(s.file)) {
      const Modelled mo = model(c, r);
      // busbw ratio model / measured = time ratio measured / model (same size and factor).
      const double ratio = r.seconds / mo.seconds;
      const double busbw = r.bytes / r.seconds * busbw_factor(op_of(r.op), r.n) / 1e9;
      char desc[200];
      std::snprintf(desc, sizeof desc, "%s %s %s n=%lld %.0f B: measured %.1f GB/s busbw, model x%.3f (%s)",
                    s.file, r.op.c_str(), r.dtype.c_str(), static_cast<long long>(r.n), r.bytes, busbw, ratio,
                    mo.algorithm.c_str());
      if (const Outside* o = outside(r, s)) {
        ++used[o];
        ++excluded;
        continue;
      }
      ++checked;
      EXPECT_NEAR(ratio, 1.0, kTolerance) << desc;
      std::printf("checked  %s\n", desc);
    }
  }
  for (const auto& o : kOutside) EXPECT_GT(used[&o], 0) << "exclusion never used: " << o.why;
  for (const auto& [o, k] : used) std::printf("outside: %3d points: %s\n", k, o->why);
  std::printf("checked %d points within %.0f%%, %d outside the model\n", checked, kTolerance * 100, excluded);
  // The claimed range (above kOutside), half and int8 rows: per H100 / H200, 512 MiB AllReduce
  // on 4 and 8 GPUs (4), AllGather (2), ReduceScatter half (1), 256 MiB AllReduce on 8 GPUs
  // (2) = 9; A100 the same less AllGather = 7. 25 points.
  EXPECT_EQ(checked, 25);
}

}  // namespace
}  // namespace dtsim::collectives
