// Simulated nccl-tests bus bandwidth against the published points of
// ../shared/validation/nccl_busbw.csv (carried here with their sources; the file is not
// read at test time). Tolerance: 10% (the bar; the sources themselves are
// approximate: "~370", "~480", "46-48").
//
// Not covered, with the reason:
//   nccl-tests#149 user ~200 GB/s at 1G on A100: too small a max size per the maintainer.
//   nccl-tests#178 (A100 NV12 pair, no NVSwitch), nccl#1161 (H100 PCIe NVLink bridge),
//   nccl#1374 (H800), DeepSeek-V3#28 (H800 P2P), nccl#1264 (CUDA copy engine, not NCCL):
//     no node preset for those systems.
//   nccl-tests#196: a note (tree on 2 nodes may exceed the NIC limit), no figure.
//   nccl#1455 NVLS on 3 GPUs (~370 GB/s): the NVLS model gives 309 GB/s (-17%); checked
//     below as a known deviation so that a better model shows up.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "models/errors.hpp"
#include "sim/collectives/collective.hpp"
#include "sim/collectives/simulate.hpp"
#include "topologies/gpu_presets.hpp"
#include "topologies/node_presets.hpp"

namespace dtsim::collectives {
namespace {

constexpr double GiB = 1024.0 * 1024 * 1024;

ClusterSpec preset(const std::string& node, int64_t nodes, int64_t gpus_per_node = 0, int64_t nics_per_node = 0) {
  ClusterSpec c = cluster_of(node_preset(node), nodes);
  if (gpus_per_node > 0) c.gpus_per_node = gpus_per_node;
  if (nics_per_node > 0) c.nics_per_node = nics_per_node;
  return c;
}

struct Point {
  const char* source;
  ClusterSpec cluster;
  int64_t gpus;
  int64_t stride;  // members 0, stride, 2 stride, ...
  const char* algorithm;
  double bytes;
  double busbw;  // GB/s, published
};

struct Measured {
  double busbw = 0;
  std::string algorithm;
};

std::vector<Measured> measure(const std::vector<Point>& pts) {
  std::vector<Measured> out;
  for (const auto& p : pts) {
    CollectiveRun r;
    for (int64_t i = 0; i < p.gpus; ++i) r.members.push_back(i * p.stride);
    r.op = CollOp::AllReduce;
    r.bytes = p.bytes;
    r.choice.algorithm = p.algorithm;
    const auto t = simulate_collectives_isolated(p.cluster, {r});
    out.push_back({p.bytes / t[0].time_s / 1e9 * busbw_factor(CollOp::AllReduce, p.gpus), t[0].algorithm});
  }
  return out;
}

void expect_within(const std::vector<Point>& pts, double tol) {
  const auto m = measure(pts);
  for (size_t i = 0; i < pts.size(); ++i)
    EXPECT_NEAR(m[i].busbw, pts[i].busbw, tol * pts[i].busbw)
        << pts[i].source << ": " << pts[i].gpus << " GPUs, " << pts[i].algorithm << " -> " << m[i].algorithm;
}

TEST(CollectivesValidation, SingleNodeNvlinkRing) {
  const auto h100 = preset("dgx-h100", 1);
  std::vector<Point> pts = {
      {"nccl-tests#212 (sjeaugey): H100 ring ~370 GB/s", h100, 8, 1, "ring", 8 * GiB, 370},
      {"nccl-tests#309 (user): H100, NVLS disabled, 368.76 GB/s", h100, 8, 1, "ring", 8 * GiB, 368.76},
      {"nccl-tests#149 (sjeaugey): A100 SXM4 80GB at 8G ~230 GB/s", preset("dgx-a100", 1), 8, 1, "ring", 8 * GiB, 230},
  };
  // nccl#1455 (user): NCCL_ALGO=RING 365-370 GB/s for 2..8 GPUs of one H100 node, 2G-4G.
  for (int64_t n = 2; n <= 8; ++n) pts.push_back({"nccl#1455 ring", h100, n, 1, "ring", 4 * GiB, 367.5});
  expect_within(pts, 0.10);
}

TEST(CollectivesValidation, SingleNodeNvls) {
  const auto h100 = preset("dgx-h100", 1);
  std::vector<Point> pts = {
      {"nccl-tests#212 (sjeaugey): 8 x H100 NVLS ~480 GB/s", h100, 8, 1, "nvls", 8 * GiB, 480},
      {"nccl-tests#290 (AddyLaddy confirms): 8 x H100 NVLS 476 GB/s", h100, 8, 1, "nvls", 8 * GiB, 476},
      {"nccl-tests#272 (user): 8 x H200 NVLS peak 475 GB/s (sweep to 4G)", preset("dgx-h200", 1), 8, 1, "nvls", 4 * GiB,
       475},
      // nccl#1455 (user), NCCL_ALGO=NVLS, 2G-4G.
      {"nccl#1455 NVLS 4 GPUs", h100, 4, 1, "nvls", 4 * GiB, 370},
      {"nccl#1455 NVLS 5 GPUs", h100, 5, 1, "nvls", 4 * GiB, 420},
      {"nccl#1455 NVLS 6 GPUs", h100, 6, 1, "nvls", 4 * GiB, 440},
      {"nccl#1455 NVLS 7 GPUs", h100, 7, 1, "nvls", 4 * GiB, 460},
      {"nccl#1455 NVLS 8 GPUs", h100, 8, 1, "nvls", 4 * GiB, 480},
      // The tuner's own choice on 8 H100 is NVLS.
      {"nccl-tests#212, default algorithm", h100, 8, 1, "auto", 8 * GiB, 480},
  };
  expect_within(pts, 0.10);
  EXPECT_EQ(measure({pts.back()})[0].algorithm, "nvls");
}

TEST(CollectivesValidation, NvlsEdgeCasesOfNccl1455) {
  const auto h100 = preset("dgx-h100", 1);
  // 2 GPUs: NCCL disables NVLS ("gpuCount <= 2") and runs the ring: ~370 GB/s as measured.
  CollectiveRun r;
  r.members = {0, 1};
  r.bytes = 4 * GiB;
  r.choice.algorithm = "nvls";
  EXPECT_THROW(simulate_collectives_isolated(h100, {r}), InputError);
  expect_within({{"nccl#1455 NVLS 2 GPUs (runs ring)", h100, 2, 1, "auto", 4 * GiB, 370}}, 0.10);
  // 3 GPUs: known deviation (header): the model is 10-20% below the measured ~370 GB/s.
  const auto m = measure({{"nccl#1455 NVLS 3 GPUs", h100, 3, 1, "nvls", 4 * GiB, 370}});
  EXPECT_LT(m[0].busbw, 370 * 0.90);
  EXPECT_GT(m[0].busbw, 370 * 0.80);
}

TEST(CollectivesValidation, InterNodePerNicLimits) {
  std::vector<Point> pts = {
      // One GPU and one NIC per node, ring (AddyLaddy: use NCCL_ALGO=RING for 2-node tests).
      {"nccl-tests#290 (AddyLaddy): NDR 400G 46-48 GB/s per NIC", preset("dgx-h100", 2, 1, 1), 2, 1, "ring", 8 * GiB, 47},
      {"nccl-tests#119 (sjeaugey): HDR 200G 24 GB/s per NIC", preset("dgx-a100", 2, 1, 1), 2, 1, "ring", 8 * GiB, 24},
      // nccl#812 (AddyLaddy): DGX A100, 8 x 200G HDR per node, "192GB/s AllReduce BusBW".
      {"nccl#812: multi-node DGX A100 192 GB/s", preset("dgx-a100", 4), 32, 1, "auto", 8 * GiB, 192},
      // nccl-tests#119 (user): 3 nodes x 8 A100 40GB with 4 HDR NICs each, 131072008 B,
      // default algorithm: 96.45 GB/s (maintainer: 4 x 24 = 96 is the target).
      {"nccl-tests#119: 24 A100, 4 HDR per node, 128 MB", preset("dgx-a100", 3, 8, 4), 24, 1, "auto", 131072008, 96.45},
  };
  expect_within(pts, 0.10);
}

}  // namespace
}  // namespace dtsim::collectives
