#include "topologies/gpu_presets.hpp"

#include <memory>
#include <string_view>

#include "models/errors.hpp"
#include "models/scalar_text.hpp"
#include "topologies/embedded_presets.hpp"
#include "topologies/preset_files.hpp"
#include "topologies/preset_lookup.hpp"

namespace dtsim {

namespace {

// Every figure and its source live in the shipped files, topologies/gpus/*.yaml
// (topologies/gpus/README.md for the figures several GPUs share).
struct Entry {
  GpuSpec spec;
  std::string file;
};

const std::vector<Entry>& registry() {
  // Parsed once, on first use (thread-safe static); a problem in any file throws InputError
  // naming it, as every later call does.
  static const std::vector<Entry> entries = [] {
    std::vector<Entry> v;
    std::vector<std::string> problems;
    for (const presets::EmbeddedPreset& f : presets::embedded_gpu_files()) {
      try {
        GpuSpec g = parse_gpu_file(f.text, f.path);
        for (const Entry& e : v)
          if (presets::iequals(e.spec.name, g.name))
            problems.push_back(std::string(f.path) + ": name " + text::quote(g.name) + " is already the name of " + e.file);
        v.push_back({std::move(g), f.path});
      } catch (const InputError& e) {
        problems.insert(problems.end(), e.problems().begin(), e.problems().end());
      }
    }
    if (!problems.empty()) throw InputError(problems);
    return v;
  }();
  return entries;
}

const std::string& name_of(const Entry& x) { return x.spec.name; }

/// The entry named `name` (presets::find_parsed: its file parsed alone when it can be).
const Entry* find_entry(std::string_view name) {
  return presets::find_parsed<Entry>(presets::embedded_gpu_files(), name, [](const auto& f) { return Entry{parse_gpu_file(f.text, f.path), f.path}; }, registry, name_of);
}

}  // namespace

const GpuSpec* find_gpu_preset(std::string_view name) {
  const Entry* e = find_entry(name);
  return e ? &e->spec : nullptr;
}

const GpuSpec& gpu_preset(std::string_view name) {
  if (const GpuSpec* g = find_gpu_preset(name)) return *g;
  throw InputError("unknown GPU preset \"" + std::string(name) + "\" (valid: " + gpu_preset_list() + ")");
}

std::string gpu_preset_file(std::string_view name) {
  const Entry* e = find_entry(name);
  return e ? e->file : std::string();
}

std::vector<std::string> gpu_preset_names() { return presets::names(registry(), name_of); }

std::string gpu_preset_list() { return text::join(gpu_preset_names()); }

}  // namespace dtsim
