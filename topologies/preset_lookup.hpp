#pragma once
// Case-insensitive lookup by name in a preset registry, shared by the GPU and node
// presets (topologies/gpu_presets.hpp, topologies/node_presets.hpp).
#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>
#include <vector>

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

}  // namespace dtsim::presets
