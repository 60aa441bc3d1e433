#pragma once
// Registry of GPU presets by name (case-insensitive), one shipped file each:
// topologies/gpus/*.yaml (compiled in, parsed once on first use; topologies/preset_files.hpp
// has the file schema). Every number in a preset cites its source beside it in its file
// (datasheet figure for peaks, capacity and bandwidth; a public measurement for
// gemm_efficiency, memory_efficiency and kernel_overhead; topologies/gpus/README.md).
// Units are those of dtsim::GpuSpec: FLOP/s, bytes, B/s, seconds. Every accessor throws
// InputError naming the file when a shipped preset file is invalid (tests parse them all).
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

/// The shipped file a GPU preset was read from (e.g. "topologies/gpus/b200.yaml"), "" for a
/// name that is not a preset.
std::string gpu_preset_file(std::string_view name);

/// Canonical names of every preset, in registry order (file-name order).
std::vector<std::string> gpu_preset_names();

/// The names joined by ", " (for error messages).
std::string gpu_preset_list();

}  // namespace dtsim
