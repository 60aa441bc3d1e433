#include "sim/collectives/registry.hpp"

#include "models/errors.hpp"

namespace dtsim::collectives {

const std::vector<const Algorithm*>& algorithms() {
  // One line per algorithm (each defined in its own file).
  static const std::vector<const Algorithm*> all = {&ring_algorithm(),         &tree_algorithm(),
                                                    &nvls_algorithm(),         &hierarchical_algorithm(),
                                                    &direct_algorithm(),       &deepep_algorithm(),
                                                    &p2p_algorithm()};
  return all;
}

const Algorithm* find_algorithm(std::string_view name) {
  for (const Algorithm* a : algorithms())
    if (a->name() == name) return a;
  return nullptr;
}

const Algorithm& algorithm(std::string_view name) {
  if (const Algorithm* a = find_algorithm(name)) return *a;
  throw InputError("unknown collective algorithm \"" + std::string(name) + "\" (valid: " + algorithm_list() + ")");
}

std::vector<std::string> algorithm_names() {
  std::vector<std::string> out;
  for (const Algorithm* a : algorithms()) out.emplace_back(a->name());
  return out;
}

std::string algorithm_list() {
  std::string out;
  for (const Algorithm* a : algorithms()) {
    if (!out.empty()) out += ", ";
    out += a->name();
  }
  return out;
}

}  // namespace dtsim::collectives
