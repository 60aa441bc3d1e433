#include "models/units.hpp"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "models/errors.hpp"

namespace dtsim {

namespace {

struct Prefix {
  std::string_view symbol;
  double factor;
};

// SI brochure (9th ed.) Table 7 and IEC 80000-13 binary prefixes. "K" is accepted as
// kilo because "KB/s" is common usage. Longest symbols first so "Ki" wins over "K".
constexpr Prefix kBinaryPrefixes[] = {
    {"Ki", 1024.0},
    {"Mi", 1024.0 * 1024.0},
    {"Gi", 1024.0 * 1024.0 * 1024.0},
    {"Ti", 1024.0 * 1024.0 * 1024.0 * 1024.0},
    {"Pi", 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0},
};
constexpr Prefix kDecimalPrefixes[] = {
    {"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15},
};
constexpr Prefix kFlopPrefixes[] = {
    {"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15}, {"E", 1e18},
};

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Splits "<number><spaces><unit>" into the value and the unit. Strict decimal syntax:
// no "inf", "nan", hex or trailing garbage inside the number.
std::optional<std::pair<double, std::string_view>> split_number(std::string_view s) {
  s = trim(s);
  size_t i = 0;
  auto digit = [&](size_t k) { return k < s.size() && std::isdigit(static_cast<unsigned char>(s[k])); };
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  size_t int_digits = 0, frac_digits = 0;
  while (digit(i)) { ++i; ++int_digits; }
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (digit(i)) { ++i; ++frac_digits; }
  }
  if (int_digits + frac_digits == 0) return std::nullopt;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    if (digit(j)) {
      while (digit(j)) ++j;
      i = j;
    }
  }
  const std::string number(s.substr(0, i));
  char* end = nullptr;
  const double v = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(v)) return std::nullopt;
  return std::make_pair(v, trim(s.substr(i)));
}

// Matches "<prefix><base>" where prefix may be empty; returns the prefix factor.
template <size_t N>
std::optional<double> match_prefixed(std::string_view unit, std::string_view base,
                                     const Prefix (&prefixes)[N]) {
  if (unit.size() < base.size() || unit.substr(unit.size() - base.size()) != base) return std::nullopt;
  const std::string_view prefix = unit.substr(0, unit.size() - base.size());
  if (prefix.empty()) return 1.0;
  for (const auto& p : prefixes)
    if (p.symbol == prefix) return p.factor;
  return std::nullopt;
}

std::optional<double> byte_prefix(std::string_view unit, std::string_view base) {
  if (auto f = match_prefixed(unit, base, kBinaryPrefixes)) return f;
  return match_prefixed(unit, base, kDecimalPrefixes);
}

// Factor converting one `unit` into SI base units of `q`, or nullopt if `unit` is not a
// unit of `q`.
std::optional<double> unit_factor(std::string_view unit, Quantity q) {
  switch (q) {
    case Quantity::bandwidth: {
      if (auto f = byte_prefix(unit, "B/s")) return *f;
      if (auto f = byte_prefix(unit, "bit/s")) return *f / 8.0;
      if (auto f = byte_prefix(unit, "b/s")) return *f / 8.0;
      return std::nullopt;
    }
    case Quantity::time: {
      if (unit == "s") return 1.0;
      if (unit == "ms") return 1e-3;
      if (unit == "us" || unit == "\xC2\xB5s" /* U+00B5 micro sign */ ||
          unit == "\xCE\xBCs" /* U+03BC greek mu */)
        return 1e-6;
      if (unit == "ns") return 1e-9;
      return std::nullopt;
    }
    case Quantity::bytes:
      return byte_prefix(unit, "B");
    case Quantity::flop_rate: {
      if (auto f = match_prefixed(unit, "FLOP/s", kFlopPrefixes)) return f;
      return match_prefixed(unit, "FLOPS", kFlopPrefixes);
    }
  }
  return std::nullopt;
}

std::string problem(std::string_view text, Quantity q) {
  std::string out;
  out.reserve(text.size() + 64);
  out.append(1, '"').append(text).append("\" is not ").append(describe(q));
  out.append(" (expected e.g. \"").append(example(q)).append("\")");
  return out;
}

}  // namespace

const char* describe(Quantity q) {
  switch (q) {
    case Quantity::bandwidth: return "a bandwidth";
    case Quantity::time: return "a time";
    case Quantity::bytes: return "a size in bytes";
    case Quantity::flop_rate: return "a FLOP rate";
  }
  return "a quantity";
}

const char* example(Quantity q) {
  switch (q) {
    case Quantity::bandwidth: return "450 GB/s";
    case Quantity::time: return "1.5 us";
    case Quantity::bytes: return "80 GiB";
    case Quantity::flop_rate: return "312 TFLOP/s";
  }
  return "";
}

double parse_quantity(std::string_view text, Quantity q) {
  const auto parts = split_number(text);
  if (!parts || parts->second.empty()) throw InputError(problem(text, q));
  const auto factor = unit_factor(parts->second, q);
  if (!factor) throw InputError(problem(text, q));
  const double v = parts->first * *factor;
  // "1e300 GiB" is a well-formed number and unit whose value overflows a double.
  if (!std::isfinite(v))
    throw InputError("\"" + std::string(text) + "\" is beyond the range of " + describe(q) +
                     " (its value in SI units overflows a double)");
  return v;
}

double parse_quantity_at(std::string_view text, Quantity q, const std::string& where) {
  try {
    return parse_quantity(text, q);
  } catch (const InputError& e) {
    throw InputError(where + "=" + e.problems().front());
  }
}

double parse_bandwidth(std::string_view text) { return parse_quantity(text, Quantity::bandwidth); }
double parse_time(std::string_view text) { return parse_quantity(text, Quantity::time); }
double parse_bytes(std::string_view text) { return parse_quantity(text, Quantity::bytes); }
double parse_flop_rate(std::string_view text) { return parse_quantity(text, Quantity::flop_rate); }

}  // namespace dtsim
