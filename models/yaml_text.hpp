#pragma once
// Loading the one YAML document of an input file (experiment, sweep / compare / plan file,
// calibration profile) with messages that say what is wrong, where yaml-cpp alone would be
// silent or cryptic:
//   - a second document (`---` then more YAML): yaml-cpp's Load keeps the first silently;
//   - a quoted string that is never closed: yaml-cpp 0.7 takes the rest of the file into it
//     (or reports "end of map flow not found" at the end of the file);
//   - nesting deeper than yaml-cpp's recursion guard (DeepRecursion, message "bad file");
//   - anchors and aliases that expand to more than 1,000,000 nodes (nested aliases multiply:
//     a few hundred bytes can stand for billions of nodes, and every walk over them hangs).
// Other parse errors keep yaml-cpp's message with line and column.
#include <string>

#include <yaml-cpp/yaml.h>

namespace dtsim {

/// The document in `text`. Throws InputError with one line "SOURCE: invalid YAML at line L,
/// column C: WHAT" ("SOURCE: " left out when `source` is empty); no document at all gives a
/// Null node, not an error.
YAML::Node load_yaml_document(const std::string& text, const std::string& source);

}  // namespace dtsim
