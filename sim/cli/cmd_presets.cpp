// dtsim presets [--json]: the shipped GPU and node presets (topologies/gpus/*.yaml,
// topologies/nodes/*.yaml, compiled in) with their key figures.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sim/cli/commands.hpp"
#include "topologies/gpu_presets.hpp"
#include "topologies/node_presets.hpp"

namespace dtsim::cli {

namespace {

struct PresetsOptions {
  bool json = false;
};

constexpr double kTera = 1e12;                          // FLOP/s -> TFLOP/s; B/s -> TB/s
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;       // bytes -> GiB
constexpr double kGiga = 1e9;                           // B/s -> GB/s
constexpr double kGigabit = 1e9 / 8;                    // B/s -> Gb/s

// A plain table: columns padded to their widest cell, left-aligned text, two spaces apart.
std::string table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], r[i].size());
    }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) line += i + 1 == r.size() ? r[i] : fmt::format("{:<{}}  ", r[i], width[i]);
    out += line + "\n";
  }
  return out;
}

std::string number(double v) { return fmt::format("{:g}", v); }

int run_presets(const PresetsOptions& o) {
  if (o.json) {
    nlohmann::ordered_json j;
    j["gpus"] = nlohmann::ordered_json::array();
    for (const auto& name : gpu_preset_names()) {
      const GpuSpec& g = gpu_preset(name);
      j["gpus"].push_back({{"name", g.name},
                           {"file", gpu_preset_file(name)},
                           {"peak_bf16_tflops", g.peak_bf16_flops / kTera},
                           {"peak_fp8_tflops", g.peak_fp8_flops / kTera},
                           {"peak_fp4_tflops", g.peak_fp4_flops / kTera},
                           {"hbm_gib", g.hbm_bytes / kGiB},
                           {"hbm_bandwidth_tbps", g.hbm_bandwidth / kTera},
                           {"microscaling", g.microscaling},
                           {"kernel_tables", g.kernel_tables}});
    }
    j["nodes"] = nlohmann::ordered_json::array();
    for (const auto& name : node_preset_names()) {
      const NodePreset& n = node_preset(name);
      j["nodes"].push_back({{"name", n.name},
                            {"file", node_preset_file(name)},
                            {"gpu", n.gpu},
                            {"gpus_per_nvlink_domain", n.gpus_per_node},
                            {"intra_node", to_string(n.intra_node)},
                            {"nvlink_gbps_per_direction", n.nvlink.bandwidth / kGiga},
                            {"nics_per_node", n.nics_per_node},
                            {"nic_gbit_per_s", n.nic.bandwidth / kGigabit}});
    }
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::vector<std::vector<std::string>> gpus = {
      {"GPU", "BF16 TFLOP/s", "FP8 TFLOP/s", "FP4 TFLOP/s", "HBM GiB", "HBM TB/s", "microscaling", "file"}};
  for (const auto& name : gpu_preset_names()) {
    const GpuSpec& g = gpu_preset(name);
    gpus.push_back({g.name, number(g.peak_bf16_flops / kTera), number(g.peak_fp8_flops / kTera),
                    number(g.peak_fp4_flops / kTera), fmt::format("{:.1f}", g.hbm_bytes / kGiB),
                    number(g.hbm_bandwidth / kTera), g.microscaling ? "yes" : "no", gpu_preset_file(name)});
  }
  std::vector<std::vector<std::string>> nodes = {
      {"node", "GPU", "GPUs/NVLink domain", "intra-node", "NVLink GB/s/dir", "NICs x Gb/s", "file"}};
  for (const auto& name : node_preset_names()) {
    const NodePreset& n = node_preset(name);
    nodes.push_back({n.name, n.gpu, std::to_string(n.gpus_per_node), to_string(n.intra_node), number(n.nvlink.bandwidth / kGiga),
                     fmt::format("{} x {:g}", n.nics_per_node, n.nic.bandwidth / kGigabit), node_preset_file(name)});
  }
  std::cout << "GPU presets (dense peaks; cluster.gpu: NAME)\n"
            << table(gpus) << "\nNode presets (cluster.node: NAME; one node = one NVLink domain)\n"
            << table(nodes);
  return kExitOk;
}

}  // namespace

Command add_presets_command(CLI::App& app) {
  auto o = std::make_shared<PresetsOptions>();
  CLI::App* cmd = app.add_subcommand("presets", "List the shipped GPU and node presets (topologies/gpus, topologies/nodes)");
  cmd->add_flag("--json", o->json, "Print JSON instead of tables");
  return {cmd, [o] { return run_presets(*o); }};
}

}  // namespace dtsim::cli
