#pragma once
// The input files shipped under experiments/, for the tests that walk every one of them.
// experiments/sweeps/ holds sweep, compare and plan files (their own readers); every other
// .yaml is an experiment. Sorted, so that parameterised tests have stable names.
#include <algorithm>
#include <filesystem>
#include <vector>

namespace dtsim::test_files {

inline const std::filesystem::path kExperiments = std::filesystem::path(DTSIM_SOURCE_DIR) / "experiments";

/// `sweeps == false`: the experiment files; `true`: the sweep, compare and plan files.
inline std::vector<std::filesystem::path> shipped_yaml(bool sweeps = false) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(kExperiments))
    if (entry.is_regular_file() && entry.path().extension() == ".yaml" &&
        (entry.path().parent_path().filename() == "sweeps") == sweeps)
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace dtsim::test_files
