#pragma once
// Reading back a StepResult written by reports/json.hpp (used to return results from
// simulation child processes, one SimGrid engine per process).
#include <string>

#include "models/result.hpp"

namespace dtsim {

/// Parses the text of result_json_text(). Throws std::runtime_error on malformed input.
StepResult result_from_json_text(const std::string& text);

}  // namespace dtsim
