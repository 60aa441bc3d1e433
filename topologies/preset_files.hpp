#pragma once
// GPU and node preset files: the shipped ones (topologies/gpus/*.yaml, topologies/nodes/*.yaml,
// compiled in: topologies/embedded_presets.hpp) and a user's own, named by cluster.gpu /
// cluster.node / cluster.gpu.preset with a value that ends in .yaml or .yml or contains "/"
// (a path relative to the experiment file). Both are read with the experiment reader
// (models/experiment_io.cpp), so units are required and unknown keys are errors.
//
// GPU file keys (exactly those of an experiment's cluster.gpu map, less preset and profile):
//   name, peak_bf16, peak_fp8, peak_fp4, microscaling, hbm, hbm_bandwidth, gemm_efficiency,
//   memory_efficiency, kernel_overhead, sm_count, attention_efficiency, kernel_tables,
//   sustained_ratio. Required: name, peak_bf16, hbm, hbm_bandwidth, gemm_efficiency,
//   memory_efficiency, kernel_overhead. Units as in dtsim::GpuSpec.
// Node file keys: name, gpu (a GPU preset name; in a user's file also a GPU file path,
//   relative to the node file), gpus_per_node, intra_node (one of intra_node_topologies(),
//   topologies/node_presets.hpp; nvswitch when absent), nvlink {bandwidth, latency,
//   efficiency, nvls_efficiency (0 when absent)}, nics_per_node, nic {bandwidth, latency,
//   efficiency}, hbm_reserve, host_dispatch; all others required.
// A dimensionless fraction (the efficiencies, sustained_ratio) may be written as a ratio
// "A / B" of two numbers, which keeps a measured pair visible (e.g. 755 / 989).
//
// Errors: InputError, one line per problem, each "SOURCE: KEY ... constraint", SOURCE being
// the preset file's path (e.g. "topologies/gpus/b200.yaml: unknown key foo (valid keys: ...)").
#include <string>

#include "models/experiment.hpp"
#include "topologies/node_presets.hpp"

namespace dtsim {

/// True when a cluster.gpu / cluster.node value names a file rather than a preset: it ends
/// in ".yaml" or ".yml" or contains "/".
bool is_preset_file_ref(const std::string& value);

/// Parses a GPU preset file's text; `source` names it in problems.
GpuSpec parse_gpu_file(const std::string& yaml_text, const std::string& source);

/// Parses a node preset file's text; `source` names it in problems. `base_dir`: the
/// directory a GPU file named by its `gpu` key is relative to; empty: `gpu` must name a GPU
/// preset (the shipped files).
NodePreset parse_node_file(const std::string& yaml_text, const std::string& source, const std::string& base_dir);

/// Reads and parses a user's GPU / node file at `path` (as the user's path, relative to the
/// working directory). Throws InputError naming `path` when it cannot be read or is invalid.
GpuSpec load_gpu_file(const std::string& path);
NodePreset load_node_file(const std::string& path);

}  // namespace dtsim
