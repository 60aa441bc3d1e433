#pragma once
// A VerifyReport as text for test failure messages: every rule with its verdict, error and
// problems, then the report's notes (shared by the verify test files).
#include <string>

#include "models/verify/verify.hpp"

namespace dtsim::verify::test_text {

inline std::string describe(const VerifyReport& r) {
  std::string s;
  for (const auto& x : r.rules) {
    s += "\n  " + x.name + (x.applicable ? (x.passed ? " PASS " : " FAIL ") : " n/a ") +
         std::to_string(x.max_abs_error) + " over " + std::to_string(x.values) + " values; worst: " + x.worst;
    for (const auto& p : x.problems) s += "\n    - " + p;
  }
  for (const auto& n : r.notes) s += "\n  note: " + n;
  return s;
}

}  // namespace dtsim::verify::test_text
