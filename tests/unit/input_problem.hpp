#pragma once
// The input error an experiment text raises, for tests that check what the message names.
#include <string>

#include "models/errors.hpp"
#include "models/experiment_io.hpp"

namespace dtsim::test_files {

/// The InputError message of parse_experiment(text, source, {}, base_dir), or "no error"
/// when the text is valid.
inline std::string input_problem(const std::string& text, const std::string& base_dir = ".",
                                 const std::string& source = "exp.yaml") {
  try {
    parse_experiment(text, source, {}, base_dir);
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace dtsim::test_files
