#pragma once
// The shipped GPU and node preset files (topologies/gpus/*.yaml, topologies/nodes/*.yaml),
// compiled in as text by topologies/embed_presets.cmake at build time: dtsim reads no preset
// file at run time. Parsed by topologies/gpu_presets.cpp and topologies/node_presets.cpp.
#include <span>

namespace dtsim::presets {

struct EmbeddedPreset {
  const char* path;  // relative to the source tree, e.g. "topologies/gpus/b200.yaml" (names it in errors)
  const char* text;  // the file's YAML text
};

/// topologies/gpus/*.yaml, in file-name order.
std::span<const EmbeddedPreset> embedded_gpu_files();
/// topologies/nodes/*.yaml, in file-name order.
std::span<const EmbeddedPreset> embedded_node_files();

}  // namespace dtsim::presets
