#pragma once
// Strict parsing of YAML scalar text and small message helpers, shared by the experiment
// reader (models/experiment_io.cpp) and the sweep / compare / plan reader
// (models/sweep_spec.cpp), so that both accept exactly the same spellings.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dtsim::text {

/// A whole decimal integer ("42", "+42", "-3"); nullopt for anything else ("4.0", "4k",
/// "", out of int64 range).
std::optional<int64_t> to_int(const std::string& text);

/// A whole finite decimal number in plain or exponent notation ("0.5", "1e-3", "-2");
/// nullopt for anything else (units, "inf", "nan", hex, trailing text).
std::optional<double> to_double(const std::string& text);

/// true / True / TRUE or false / False / FALSE; nullopt for anything else (YAML's yes/no
/// and 0/1 are not booleans here).
std::optional<bool> to_bool(const std::string& text);

/// `s` in double quotes, for error messages.
std::string quote(const std::string& s);

/// The items joined by ", ".
std::string join(const std::vector<std::string>& items);

}  // namespace dtsim::text
