#pragma once
// Registry of GPU presets by name. Every number in a preset cites its source next to it in
// topologies/gpu_presets.cpp (datasheet figure for peaks, capacity and bandwidth; a public
// measurement for gemm_efficiency, memory_efficiency and kernel_overhead).
//
// Names (case-insensitive): A100-SXM4-80GB, H100-SXM5-80GB, H200-SXM-141GB, B200,
// H800-SXM5-80GB, MI300X, MI325X, MI355X.
// Units are those of dtsim::GpuSpec: FLOP/s, bytes, B/s, seconds.
#include <string>
#include <string_view>
#include <vector>

#include "models/experiment.hpp"

namespace dtsim {

/// The preset named `name` (case-insensitive), or nullptr when there is none.
const GpuSpec* find_gpu_preset(std::string_view name);

/// The preset named `name` (case-insensitive).
/// Throws InputError(`unknown GPU preset "X" (valid: A100-SXM4-80GB, ...)`).
const GpuSpec& gpu_preset(std::string_view name);

/// Canonical names of every preset, in registry order.
std::vector<std::string> gpu_preset_names();

/// The names joined by ", " (for error messages).
std::string gpu_preset_list();

}  // namespace dtsim
