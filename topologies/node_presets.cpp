#include "topologies/node_presets.hpp"

#include <memory>
#include <string_view>

#include "models/errors.hpp"
#include "models/scalar_text.hpp"
#include "models/units.hpp"
#include "topologies/embedded_presets.hpp"
#include "topologies/preset_files.hpp"
#include "topologies/preset_lookup.hpp"

namespace dtsim {

namespace {

// Every figure and its source live in the shipped files, topologies/nodes/*.yaml
// (topologies/nodes/README.md for the figures several nodes share).
struct Entry {
  NodePreset preset;
  std::string file;
};

const std::vector<Entry>& registry() {
  // Parsed once, on first use (thread-safe static); a problem in any file throws InputError
  // naming it, as every later call does.
  static const std::vector<Entry> entries = [] {
    std::vector<Entry> v;
    std::vector<std::string> problems;
    for (const presets::EmbeddedPreset& f : presets::embedded_node_files()) {
      try {
        NodePreset n = parse_node_file(f.text, f.path, "");
        for (const Entry& e : v)
          if (presets::iequals(e.preset.name, n.name))
            problems.push_back(std::string(f.path) + ": name " + text::quote(n.name) + " is already the name of " + e.file);
        v.push_back({std::move(n), f.path});
      } catch (const InputError& e) {
        problems.insert(problems.end(), e.problems().begin(), e.problems().end());
      }
    }
    if (!problems.empty()) throw InputError(problems);
    return v;
  }();
  return entries;
}

const std::string& name_of(const Entry& x) { return x.preset.name; }

/// The entry named `name` (presets::find_parsed: its file parsed alone when it can be).
const Entry* find_entry(std::string_view name) {
  return presets::find_parsed<Entry>(presets::embedded_node_files(), name, [](const auto& f) { return Entry{parse_node_file(f.text, f.path, ""), f.path}; }, registry, name_of);
}

}  // namespace

const std::vector<std::string>& intra_node_topologies() {
  // The one list of valid intra_node values (node files, topologies/nodes/README.md).
  static const std::vector<std::string> kTopologies = {to_string(IntraNode::nvswitch), to_string(IntraNode::xgmi_mesh)};
  return kTopologies;
}

// The x86 DGX figure, 13.48 us: NVIDIA/TransformerEngine#2053, H100 DGX torch CPU runtime
// (topologies/nodes/README.md host_dispatch; the value dgx-h100.yaml carries).
double default_host_dispatch() { return parse_time("13.48 us"); }

std::string node_preset_file(std::string_view name) {
  const Entry* e = find_entry(name);
  return e ? e->file : std::string();
}

const NodePreset* find_node_preset(std::string_view name) {
  const Entry* e = find_entry(name);
  return e ? &e->preset : nullptr;
}

ClusterSpec cluster_of(const NodePreset& n, int64_t nodes) {
  ClusterSpec c;
  c.gpu = n.gpu_spec;
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

std::vector<std::string> node_preset_names() { return presets::names(registry(), name_of); }

std::string node_preset_list() { return text::join(node_preset_names()); }

}  // namespace dtsim
