#pragma once
// Case-insensitive lookup by name in a preset registry, shared by the GPU and node
// presets (topologies/gpu_presets.hpp, topologies/node_presets.hpp).
#include <algorithm>
#include <cctype>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "models/errors.hpp"

namespace dtsim::presets {

/// ASCII case-insensitive equality.
inline bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

/// The file name of `path` without its directory and extension ("topologies/gpus/b200.yaml":
/// "b200"): a shipped preset's name, ignoring case.
inline std::string_view file_stem(std::string_view path) {
  const size_t slash = path.find_last_of('/');
  if (slash != std::string_view::npos) path.remove_prefix(slash + 1);
  const size_t dot = path.find_last_of('.');
  return dot == std::string_view::npos ? path : path.substr(0, dot);
}

/// The entry of `registry` whose name (`name_of(entry)`) equals `name` ignoring case, or
/// nullptr.
template <class Entry, class NameOf>
const Entry* find(const std::vector<Entry>& registry, std::string_view name, NameOf name_of) {
  for (const auto& e : registry)
    if (iequals(name_of(e), name)) return &e;
  return nullptr;
}

/// The names of every entry, in registry order.
template <class Entry, class NameOf>
std::vector<std::string> names(const std::vector<Entry>& registry, NameOf name_of) {
  std::vector<std::string> out;
  for (const auto& e : registry) out.emplace_back(name_of(e));
  return out;
}

/// The entry named `name`, parsing as little as it can: every shipped file is named after
/// its preset (ignoring case; tests/unit/test_preset_files.cpp), so the file of that name
/// among `files` is parsed alone by `parse(file)`, once, on first use (a sweep of one cluster
/// reads one node file and its GPU's, not every preset). Any other name, or a file that does
/// not parse or names another preset: `registry()`, every file parsed and checked. One cache
/// per Entry type (the GPU and the node presets), under a recursive lock: a file's parse may
/// look up another preset.
template <class Entry, class Files, class Parse, class Registry, class NameOf>
const Entry* find_parsed(const Files& files, std::string_view name, Parse parse, Registry registry, NameOf name_of) {
  static std::recursive_mutex mu;
  static std::map<std::string, std::unique_ptr<const Entry>, std::less<>> parsed;  // by file path
  for (const auto& f : files) {
    if (!iequals(file_stem(f.path), name)) continue;
    const std::lock_guard<std::recursive_mutex> lock(mu);
    auto it = parsed.find(std::string_view(f.path));
    if (it == parsed.end()) {
      try {
        it = parsed.emplace(f.path, std::make_unique<const Entry>(parse(f))).first;
      } catch (const InputError&) {
        break;  // the registry reports it, with every other file's problems
      }
    }
    if (iequals(name_of(*it->second), name)) return it->second.get();
    break;
  }
  return find(registry(), name, name_of);
}

}  // namespace dtsim::presets
