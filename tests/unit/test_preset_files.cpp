// GPU and node presets as data files (topologies/gpus/*.yaml, topologies/nodes/*.yaml,
// compiled in): every shipped file parses, the figures moved from C++ are unchanged, a user's
// own file works and its problems name the file and the key, and `dtsim presets` lists them.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/rank_grid.hpp"
#include "models/sweep_spec.hpp"
#include "tests/unit/cli_fixture.hpp"
#include "tests/unit/temp_dir.hpp"
#include "topologies/embedded_presets.hpp"
#include "topologies/gpu_presets.hpp"
#include "topologies/node_presets.hpp"
#include "topologies/preset_files.hpp"
#include "topologies/preset_lookup.hpp"

namespace dtsim {
namespace {

constexpr double MiB = 1024.0 * 1024.0;
constexpr double GiB = 1024.0 * MiB;

std::vector<std::string> problems_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.problems();
  }
  return {};
}

std::string dump(const std::vector<std::string>& ps) {
  std::string out;
  for (const auto& p : ps) out += "\n  " + p;
  return out.empty() ? std::string(" (none)") : out;
}

bool has(const std::vector<std::string>& ps, const std::string& s) {
  return std::find(ps.begin(), ps.end(), s) != ps.end();
}

TEST(PresetFiles, EveryShippedFileParses) {
  ASSERT_FALSE(presets::embedded_gpu_files().empty());
  ASSERT_FALSE(presets::embedded_node_files().empty());
  for (const auto& f : presets::embedded_gpu_files()) {
    SCOPED_TRACE(f.path);
    EXPECT_EQ(problems_of([&] { parse_gpu_file(f.text, f.path); }), std::vector<std::string>{});
    const GpuSpec g = parse_gpu_file(f.text, f.path);
    EXPECT_EQ(gpu_preset_file(g.name), f.path);
    // Named after its file (ignoring case): a lookup by name parses that file alone.
    EXPECT_TRUE(presets::iequals(presets::file_stem(f.path), g.name)) << g.name;
  }
  for (const auto& f : presets::embedded_node_files()) {
    SCOPED_TRACE(f.path);
    EXPECT_EQ(problems_of([&] { parse_node_file(f.text, f.path, ""); }), std::vector<std::string>{});
    const NodePreset n = parse_node_file(f.text, f.path, "");
    EXPECT_EQ(node_preset_file(n.name), f.path);
    EXPECT_TRUE(presets::iequals(presets::file_stem(f.path), n.name)) << n.name;
    // AMD Instinct platforms join their 8 GPUs by a direct xGMI link per pair; NVIDIA's by NVSwitch.
    EXPECT_EQ(n.intra_node, n.name.rfind("mi", 0) == 0 ? IntraNode::xgmi_mesh : IntraNode::nvswitch);
    EXPECT_EQ(n.gpu_spec.name, gpu_preset(n.gpu).name);
  }
}

// The figures as the C++ registry (topologies/gpu_presets.cpp before the files) computed them,
// bit for bit: results stay byte-identical.
TEST(PresetFiles, MovedGpuFiguresUnchanged) {
  const GpuSpec& a = gpu_preset("A100-SXM4-80GB");
  EXPECT_EQ(a.peak_bf16_flops, 312 * 1e12);
  EXPECT_EQ(a.peak_fp8_flops, 0.0);
  EXPECT_EQ(a.hbm_bytes, 81920 * MiB);
  EXPECT_EQ(a.hbm_bandwidth, 2039 * 1e9);
  EXPECT_EQ(a.gemm_efficiency, 271.2 / 312.0);
  EXPECT_EQ(a.memory_efficiency, 0.846);
  EXPECT_EQ(a.kernel_overhead, 3.3 * 1e-6);
  EXPECT_EQ(a.sm_count, 108);
  EXPECT_EQ(a.attention_efficiency, 0.50);
  EXPECT_EQ(a.kernel_tables, "a100_sxm");
  EXPECT_EQ(a.sustained_ratio, 1.0);
  for (const char* name : {"H100-SXM5-80GB", "H800-SXM5-80GB"}) {
    SCOPED_TRACE(name);
    const GpuSpec& h = gpu_preset(name);
    EXPECT_EQ(h.peak_bf16_flops, 989 * 1e12);
    EXPECT_EQ(h.peak_fp8_flops, 1979 * 1e12);
    EXPECT_EQ(h.hbm_bytes, 81559 * MiB);
    EXPECT_EQ(h.hbm_bandwidth, 3350 * 1e9);
    EXPECT_EQ(h.gemm_efficiency, 755.0 / 989.0);
    EXPECT_EQ(h.memory_efficiency, 0.867);
    EXPECT_EQ(h.sm_count, 132);
    EXPECT_EQ(h.attention_efficiency, 0.35);
    EXPECT_EQ(h.kernel_tables, "h100_sxm");
    EXPECT_EQ(h.sustained_ratio, 755.0 / 834.0);
    EXPECT_FALSE(h.microscaling);
  }
  const GpuSpec& h2 = gpu_preset("H200-SXM-141GB");
  EXPECT_EQ(h2.hbm_bytes, 143771 * MiB);
  EXPECT_EQ(h2.hbm_bandwidth, 4800 * 1e9);
  EXPECT_EQ(h2.kernel_tables, "h200_sxm");
  EXPECT_EQ(h2.sustained_ratio, 755.0 / 834.0);
  const GpuSpec& b = gpu_preset("B200");
  EXPECT_EQ(b.peak_bf16_flops, 2250 * 1e12);
  EXPECT_EQ(b.peak_fp8_flops, 4500 * 1e12);
  EXPECT_EQ(b.peak_fp4_flops, 9000 * 1e12);
  EXPECT_TRUE(b.microscaling);
  EXPECT_EQ(b.hbm_bytes, 180e9);
  EXPECT_EQ(b.hbm_bandwidth, 8000 * 1e9);
  EXPECT_EQ(b.gemm_efficiency, 1429.0 / 2250.0);
  EXPECT_EQ(b.memory_efficiency, 0.840);
  EXPECT_EQ(b.sm_count, 148);
  EXPECT_EQ(b.kernel_tables, "b200_sxm");
  EXPECT_EQ(b.sustained_ratio, 1.0);
}

TEST(PresetFiles, MovedNodeFiguresUnchanged) {
  const double nvls = 275.0 * 9.0 / 8.0 / 450.0;
  for (const char* name : {"dgx-h100", "dgx-h200", "dgx-b200", "dgx-h800", "gb200-nvl72"}) {
    SCOPED_TRACE(name);
    const NodePreset& n = node_preset(name);
    EXPECT_EQ(n.nvlink.latency, 3.4 * 1e-6);
    EXPECT_EQ(n.nic.latency, 14.0 * 1e-6);
    // Blackwell: the H100 NVLS ratio x NCCL's nvlsEfficiency 0.74 / 0.85 and NCCL's 18 x 40.1
    // GB/s ring rate (topologies/nodes/README.md; intended change, tests/unit/test_nccl_measured.cpp).
    const bool blackwell = std::string(name) == "dgx-b200" || std::string(name) == "gb200-nvl72";
    EXPECT_EQ(n.nvls_efficiency, blackwell ? 228.9375 / 382.5 : nvls);
    if (blackwell) EXPECT_EQ(n.nvlink.efficiency, 721.8 / 900.0);
    EXPECT_EQ(n.nic.bandwidth, 400 * (1e9 / 8));
    EXPECT_EQ(n.nic.efficiency, 47.0 / 50.0);
    EXPECT_EQ(n.hbm_reserve_bytes, 2 * GiB);
  }
  const NodePreset& a = node_preset("dgx-a100");
  EXPECT_EQ(a.nvlink.efficiency, 230.0 / 300.0);
  EXPECT_EQ(a.nvls_efficiency, 0.0);
  EXPECT_EQ(a.nic.bandwidth, 200 * (1e9 / 8));
  EXPECT_EQ(a.nic.efficiency, 24.0 / 25.0);
  EXPECT_EQ(a.host_dispatch, 13.48 * 1e-6);
  EXPECT_EQ(node_preset("dgx-h100").nvlink.efficiency, 370.0 / 450.0);
  EXPECT_EQ(node_preset("dgx-h800").nvlink.bandwidth, 200 * 1e9);
  EXPECT_EQ(node_preset("dgx-h800").nvlink.efficiency, 160.0 / 200.0);
  EXPECT_EQ(node_preset("gb200-nvl72").gpus_per_node, 72);
  EXPECT_EQ(node_preset("gb200-nvl72").nics_per_node, 72);
  EXPECT_EQ(node_preset("gb200-nvl72").host_dispatch, 37.08 * 1e-6);
  EXPECT_EQ(default_host_dispatch(), 13.48 * 1e-6);
}

// A user's own GPU file: read relative to the experiment, same schema, problems name the file.
const char* kExperiment = R"(model:
  name: test-7b
  layers: 32
  hidden: 4096
  heads: 32
  ffn_hidden: 11008
  activation: swiglu
  vocab: 32000
  tied_embeddings: false
  norm: rmsnorm
  position: rope
cluster:
  node: dgx-h100
  gpu: GPU_VALUE
  nodes: 2
layout:
  dp: 2
  tp: 4
  pp: 2
training:
  seq_len: 2048
  global_batch: 64
  micro_batch: 2
)";

std::string experiment_with(const std::string& key, const std::string& value) {
  std::string y = kExperiment;
  if (key == "gpu") {
    y.replace(y.find("GPU_VALUE"), 9, value);
  } else {  // node
    y.replace(y.find("  gpu: GPU_VALUE\n"), 17, "");
    y.replace(y.find("dgx-h100"), 8, value);
  }
  return y;
}

const char* kMyGpu = R"(name: MyGPU
peak_bf16: 500 TFLOP/s  # an assumed part
hbm: 64 GiB
hbm_bandwidth: 2 TB/s
gemm_efficiency: 3 / 4
memory_efficiency: 0.8
kernel_overhead: 4 us
)";

TEST(PresetFiles, UserGpuFile) {
  test_files::TempDir d("dtsim-user-gpu");
  std::filesystem::create_directories(d.path() / "hw");
  d.write("hw/my-gpu.yaml", kMyGpu);
  const Experiment e = parse_experiment(experiment_with("gpu", "hw/my-gpu.yaml"), "exp.yaml", {}, d.path().string());
  EXPECT_EQ(e.cluster.gpu.name, "MyGPU");
  EXPECT_EQ(e.cluster.gpu.peak_bf16_flops, 500e12);
  EXPECT_EQ(e.cluster.gpu.gemm_efficiency, 0.75);
  EXPECT_EQ(e.cluster.gpu.kernel_tables, "");
  EXPECT_EQ(e.cluster.nvlink.bandwidth, 450e9);  // the node preset's links
  // {preset: FILE, overrides}
  const Experiment o = parse_experiment(experiment_with("gpu", "{preset: hw/my-gpu.yaml, hbm: 32 GiB}"), "exp.yaml",
                                        {}, d.path().string());
  EXPECT_EQ(o.cluster.gpu.name, "MyGPU");
  EXPECT_EQ(o.cluster.gpu.hbm_bytes, 32 * GiB);
  // {preset: NAME, overrides} still works.
  const Experiment p = parse_experiment(experiment_with("gpu", "{preset: H100-SXM5-80GB, hbm: 40 GiB}"), "exp.yaml",
                                        {}, d.path().string());
  EXPECT_EQ(p.cluster.gpu.hbm_bytes, 40 * GiB);
  EXPECT_EQ(p.cluster.gpu.kernel_tables, "h100_sxm");
}

TEST(PresetFiles, UserGpuFileProblemsNameFileAndKey) {
  test_files::TempDir d("dtsim-user-gpu-bad");
  const std::string file = (d.path() / "bad.yaml").string();
  std::string bad = kMyGpu;
  bad.replace(bad.find("hbm: 64 GiB"), 11, "hbm: 64");
  bad += "tdp: 700 W\n";
  d.write("bad.yaml", bad);
  const auto ps = problems_of(
      [&] { parse_experiment(experiment_with("gpu", "bad.yaml"), "exp.yaml", {}, d.path().string()); });
  EXPECT_TRUE(has(ps, "exp.yaml: cluster.gpu=\"bad.yaml\": " + file +
                          ": unknown key tdp (valid keys: name, peak_bf16, peak_fp8, peak_fp4, microscaling, hbm, "
                          "hbm_bandwidth, gemm_efficiency, memory_efficiency, kernel_overhead, sm_count, "
                          "attention_efficiency, kernel_tables, sustained_ratio)"))
      << dump(ps);
  EXPECT_TRUE(has(ps, "exp.yaml: cluster.gpu=\"bad.yaml\": " + file +
                          ": hbm=\"64\" is not a size in bytes (expected e.g. \"80 GiB\")"))
      << dump(ps);
  // A missing file.
  const auto missing = problems_of(
      [&] { parse_experiment(experiment_with("gpu", "nope.yaml"), "exp.yaml", {}, d.path().string()); });
  ASSERT_EQ(missing.size(), 1u) << dump(missing);
  EXPECT_EQ(missing[0].rfind("exp.yaml: cluster.gpu=\"nope.yaml\": " + (d.path() / "nope.yaml").string() +
                                 ": cannot read GPU file",
                             0),
            0u)
      << missing[0];
  // The file's own problems, parsed directly: required keys and a bad ratio.
  const auto direct = problems_of([] { parse_gpu_file("name: X\ngemm_efficiency: 3 / 0\n", "x.yaml"); });
  EXPECT_TRUE(has(direct, "x.yaml: peak_bf16 is required")) << dump(direct);
  EXPECT_TRUE(has(direct, "x.yaml: gemm_efficiency=\"3 / 0\" is not a number or a ratio A / B of two numbers (B not 0)"))
      << dump(direct);
}

const char* kMyNode = R"(name: my-node
gpu: my-gpu.yaml
gpus_per_node: 4
intra_node: nvswitch
nvlink:
  bandwidth: 100 GB/s
  latency: 3 us
  efficiency: 0.8
nics_per_node: 4
nic:
  bandwidth: 200 Gb/s
  latency: 10 us
  efficiency: 0.9
hbm_reserve: 1 GiB
host_dispatch: 10 us
)";

TEST(PresetFiles, UserNodeFile) {
  test_files::TempDir d("dtsim-user-node");
  std::filesystem::create_directories(d.path() / "hw");
  d.write("hw/my-gpu.yaml", kMyGpu);
  d.write("hw/my-node.yaml", kMyNode);
  std::string y = experiment_with("node", "hw/my-node.yaml");
  y.replace(y.find("  tp: 4"), 7, "  tp: 2");
  // 2 nodes x 4 GPUs = dp 2 x tp 2 x pp 2.
  const Experiment e = parse_experiment(y, "exp.yaml", {}, d.path().string());
  EXPECT_EQ(e.cluster.gpu.name, "MyGPU");  // the node file's GPU file, relative to the node file
  EXPECT_EQ(e.cluster.gpus_per_node, 4);
  EXPECT_EQ(e.cluster.nvlink.bandwidth, 100e9);
  EXPECT_EQ(e.cluster.nic.bandwidth, 25e9);
  EXPECT_DOUBLE_EQ(e.cluster.host_dispatch, 10e-6);
  EXPECT_EQ(e.cluster.name, "2 x my-node");
  // Problems name the node file and the key.
  std::string bad = kMyNode;
  bad.replace(bad.find("intra_node: nvswitch"), 20, "intra_node: torus");
  bad.replace(bad.find("  latency: 3 us"), 15, "  latency: 3");
  d.write("hw/bad-node.yaml", bad);
  const std::string file = (d.path() / "hw" / "bad-node.yaml").string();
  const auto ps = problems_of(
      [&] { parse_experiment(experiment_with("node", "hw/bad-node.yaml"), "exp.yaml", {}, d.path().string()); });
  EXPECT_TRUE(has(ps, "exp.yaml: cluster.node=\"hw/bad-node.yaml\": " + file +
                          ": intra_node=\"torus\" is not one of nvswitch, xgmi-mesh"))
      << dump(ps);
  EXPECT_TRUE(has(ps, "exp.yaml: cluster.node=\"hw/bad-node.yaml\": " + file +
                          ": nvlink.latency=\"3\" is not a time (expected e.g. \"1.5 us\")"))
      << dump(ps);
}

// A sweep's cluster may name a user's node file too (relative to the sweep file).
TEST(PresetFiles, SweepClusterTakesAUserNodeFile) {
  test_files::TempDir d("dtsim-user-node-sweep");
  d.write("my-gpu.yaml", kMyGpu);
  d.write("my-node.yaml", kMyNode);
  const SweepSpec s = parse_sweep_spec(
      "model: {name: t, layers: 8, hidden: 1024, heads: 16, kv_heads: 16, ffn_hidden: 4096, activation: gelu,\n"
      "        vocab: 8192, tied_embeddings: false, norm: layernorm, position: learned}\n"
      "training: {seq_len: 512, global_batch: 64, dtype: bf16}\n"
      "clusters: [{name: mine, node: my-node.yaml, nodes: 2}]\n"
      "space: {tp: [1, 2], pp: 1, micro_batch: 1}\n",
      "s.yaml", SpecKind::sweep, d.path().string());
  ASSERT_EQ(s.clusters.size(), 1u);
  EXPECT_EQ(s.clusters[0].base.cluster.gpus(), 8);
  EXPECT_EQ(s.clusters[0].base.cluster.gpu.name, "MyGPU");
}

TEST(PresetFiles, ShippedFileProblemsNameTheFile) {
  const auto ps = problems_of([] {
    parse_node_file("name: n\ngpu: X100\ngpus_per_node: 8\nnvlink: {bandwidth: 1 GB/s, latency: 1 us, efficiency: 1, "
                    "speed: 2}\nnics_per_node: 0\nnic: {bandwidth: 1 GB/s, latency: 1 us, efficiency: 1}\n"
                    "hbm_reserve: 0 B\nhost_dispatch: 1 us\n",
                    "topologies/nodes/n.yaml", "");
  });
  EXPECT_TRUE(has(ps, "topologies/nodes/n.yaml: gpu=\"X100\" is not a GPU preset (valid: " + gpu_preset_list() + ")"))
      << dump(ps);
  EXPECT_TRUE(has(ps, "topologies/nodes/n.yaml: unknown key nvlink.speed (valid keys under nvlink: bandwidth, latency, "
                      "efficiency, nvls_efficiency)"))
      << dump(ps);
  EXPECT_EQ(intra_node_topologies(), (std::vector<std::string>{"nvswitch", "xgmi-mesh"}));
  EXPECT_TRUE(is_preset_file_ref("a.yaml"));
  EXPECT_TRUE(is_preset_file_ref("a.yml"));
  EXPECT_TRUE(is_preset_file_ref("hw/a"));
  EXPECT_FALSE(is_preset_file_ref("H100-SXM5-80GB"));
}

// The NVIDIA presets added with the files (each figure's source is in its file).
TEST(PresetFiles, NewNvidiaPresets) {
  const GpuSpec& gb200 = gpu_preset("GB200");
  EXPECT_EQ(gb200.peak_bf16_flops, 2500e12);
  EXPECT_EQ(gb200.peak_fp8_flops, 5000e12);
  EXPECT_EQ(gb200.peak_fp4_flops, 10000e12);
  EXPECT_EQ(gb200.hbm_bytes, 186e9);
  EXPECT_EQ(gb200.kernel_tables, "b200_sxm");
  EXPECT_TRUE(gb200.microscaling);
  const GpuSpec& b300 = gpu_preset("B300");
  EXPECT_EQ(b300.peak_bf16_flops, 2250e12);
  EXPECT_EQ(b300.peak_fp4_flops, 13125e12);
  EXPECT_EQ(b300.hbm_bytes, 288e9);
  EXPECT_EQ(b300.hbm_bandwidth, 8000e9);
  EXPECT_EQ(b300.kernel_tables, "");  // no shipped B300 table: roofline
  const GpuSpec& gb300 = gpu_preset("GB300");
  EXPECT_EQ(gb300.peak_bf16_flops, 2500e12);
  EXPECT_EQ(gb300.peak_fp8_flops, 5000e12);
  EXPECT_EQ(gb300.peak_fp4_flops, 15000e12);
  EXPECT_EQ(gb300.hbm_bytes, 279e9);
  EXPECT_TRUE(gb300.microscaling);
  const GpuSpec& a40 = gpu_preset("A100-SXM4-40GB");
  EXPECT_EQ(a40.hbm_bytes, 40960 * MiB);
  EXPECT_EQ(a40.hbm_bandwidth, 1555e9);
  const GpuSpec& h20 = gpu_preset("H20");
  EXPECT_EQ(h20.peak_bf16_flops, 148e12);
  EXPECT_EQ(h20.peak_fp8_flops, 296e12);
  EXPECT_EQ(h20.hbm_bytes, 96e9);
  EXPECT_EQ(h20.hbm_bandwidth, 4000e9);
  EXPECT_EQ(h20.kernel_tables, "");
  EXPECT_EQ(node_preset("gb200-nvl72").gpu, "GB200");  // the 1200 W part, no longer the HGX B200
  const NodePreset& rack = node_preset("gb300-nvl72");
  EXPECT_EQ(rack.gpu, "GB300");
  EXPECT_EQ(rack.gpus_per_node, 72);
  EXPECT_EQ(rack.nics_per_node, 72);
  EXPECT_EQ(rack.nic.bandwidth, 800 * (1e9 / 8));
  EXPECT_EQ(rack.host_dispatch, 37.08 * 1e-6);
  const NodePreset& b = node_preset("dgx-b300");
  EXPECT_EQ(b.gpus_per_node, 8);
  EXPECT_EQ(b.nic.bandwidth, 800 * (1e9 / 8));
  EXPECT_EQ(node_preset("dgx-h20").nvlink.bandwidth, 450e9);
  EXPECT_EQ(node_preset("dgx-h20").gpu, "H20");
  EXPECT_EQ(node_preset("dgx-h800").gpu, "H800-SXM5-80GB");
  EXPECT_EQ(node_preset("dgx-a100-40gb").gpu, "A100-SXM4-40GB");
}

// NVL72 racks: TP stays inside a rack, DP crosses racks over the fabric; the run summary says so.
TEST(PresetFiles, Nvl72Placement) {
  const Experiment e =
      load_experiment(std::string(DTSIM_SOURCE_DIR) + "/experiments/examples/gb300-nvl72-256.yaml");
  EXPECT_EQ(e.cluster.gpus(), 256);
  EXPECT_EQ(e.cluster.gpu.name, "GB300");
  const auto placement = group_placement(RankGrid(e.layout), e.cluster.gpus_per_node);
  ASSERT_EQ(placement.size(), 2u);
  EXPECT_EQ(placement[0].kind, GroupKind::TP);
  EXPECT_EQ(placement[0].domains, 1);
  EXPECT_EQ(placement[1].kind, GroupKind::DP);
  EXPECT_EQ(placement[1].size, 32);
  EXPECT_EQ(placement[1].domains, 4);
  EXPECT_EQ(describe_placement(placement),
            "TP 8 inside one NVLink domain; DP 32 across 4 NVLink domains (over the fabric)");
  // A TP group larger than the domain spans domains.
  Layout l = e.layout;
  l.tp = 128;
  l.dp = 2;
  EXPECT_EQ(describe_placement(group_placement(RankGrid(l), 64)),
            "TP 128 across 2 NVLink domains (over the fabric); DP 2 across 2 NVLink domains (over the fabric)");
}

class PresetsCli : public cli_test::CliTest {};

TEST_F(PresetsCli, ListsShippedPresets) {
  const cli_test::Outcome o = dtsim("presets");
  EXPECT_EQ(o.code, 0) << o.err;
  for (const auto& name : gpu_preset_names()) EXPECT_NE(o.out.find(name), std::string::npos) << name << o.out;
  for (const auto& name : node_preset_names()) EXPECT_NE(o.out.find(name), std::string::npos) << name << o.out;
  EXPECT_NE(o.out.find("topologies/gpus/b200.yaml"), std::string::npos) << o.out;
  for (const char* name : {"B300", "GB300", "H20", "A100-SXM4-40GB", "gb300-nvl72", "dgx-b300", "dgx-h20"})
    EXPECT_NE(o.out.find(std::string("\n") + name + " "), std::string::npos) << name << o.out;
  const std::string example =
      std::string(DTSIM_SOURCE_DIR) + "/experiments/examples/gb300-nvl72-256.yaml";
  const cli_test::Outcome run = dtsim("run " + cli_test::shell_quote(example));
  EXPECT_EQ(run.code, 0) << run.err;
  EXPECT_NE(run.out.find("  placement TP 8 inside one NVLink domain; DP 32 across 4 NVLink domains (over the fabric)\n"),
            std::string::npos)
      << run.out;
  const cli_test::Outcome j = dtsim("presets --json");
  EXPECT_EQ(j.code, 0) << j.err;
  EXPECT_NE(j.out.find("\"name\": \"H100-SXM5-80GB\""), std::string::npos) << j.out;
  EXPECT_NE(j.out.find("\"peak_bf16_tflops\": 989.0"), std::string::npos) << j.out;
}

}  // namespace
}  // namespace dtsim
