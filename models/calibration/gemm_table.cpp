#include "models/calibration/gemm_table.hpp"

#include <algorithm>
#include <charconv>
#include <map>
#include <memory>
#include <mutex>

#include "models/calibration/embedded_tables.hpp"
#include "models/errors.hpp"

namespace dtsim::calib {

namespace {

constexpr double kMicrosecond = 1e-6;  // s; the tables' unit

std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r') ++j;
    if (j > i) out.push_back(line.substr(i, j - i));
    i = j;
  }
  return out;
}

std::string rest_of(std::string_view line, std::string_view key) {
  std::string_view r = line.substr(key.size());
  while (!r.empty() && (r.front() == ' ' || r.front() == '\t')) r.remove_prefix(1);
  while (!r.empty() && (r.back() == ' ' || r.back() == '\t' || r.back() == '\r')) r.remove_suffix(1);
  return std::string(r);
}

/// Where x falls on an axis: the bracketing indices, the weight of `hi`, and the factor the
/// time is scaled by for a value above the axis.
struct AxisPos {
  size_t lo = 0, hi = 0;
  double w = 0;      // weight of hi, [0, 1)
  double scale = 1;  // x / largest when x is above the axis
  bool exact = false, outside = false;
};

AxisPos locate(const std::vector<int64_t>& a, int64_t x) {
  AxisPos p;
  if (x <= a.front()) {
    p.exact = x == a.front();
    p.outside = x < a.front();
    return p;
  }
  if (x >= a.back()) {
    p.lo = p.hi = a.size() - 1;
    p.exact = x == a.back();
    p.outside = x > a.back();
    p.scale = static_cast<double>(x) / static_cast<double>(a.back());
    return p;
  }
  const size_t hi = static_cast<size_t>(std::upper_bound(a.begin(), a.end(), x) - a.begin());
  p.lo = hi - 1;
  if (a[p.lo] == x) {
    p.hi = p.lo;
    p.exact = true;
    return p;
  }
  p.hi = hi;
  p.w = static_cast<double>(x - a[p.lo]) / static_cast<double>(a[hi] - a[p.lo]);
  return p;
}

}  // namespace

GemmTable GemmTable::parse(std::string_view text, const std::string& file) {
  GemmTable t;
  t.name = file;
  std::vector<std::string> problems;
  auto problem = [&](size_t line, const std::string& what) {
    problems.push_back(file + ":" + std::to_string(line) + ": " + what);
  };
  bool in_data = false, have_format = false;
  std::map<std::string, bool> seen;
  size_t row = 0, line_no = 0, rows_expected = 0;
  auto axis = [&](std::string_view name, const std::vector<std::string_view>& w, size_t ln) {
    std::vector<int64_t> v;
    for (size_t i = 1; i < w.size(); ++i) {
      int64_t x = 0;
      const auto r = std::from_chars(w[i].data(), w[i].data() + w[i].size(), x);
      if (r.ec != std::errc() || r.ptr != w[i].data() + w[i].size() || x <= 0) {
        problem(ln, "axis " + std::string(name) + ": \"" + std::string(w[i]) + "\" is not a positive integer");
        return v;
      }
      if (!v.empty() && x <= v.back()) {
        problem(ln, "axis " + std::string(name) + " must be strictly ascending (" + std::to_string(x) +
                        " after " + std::to_string(v.back()) + ")");
        return v;
      }
      v.push_back(x);
    }
    if (v.empty()) problem(ln, "axis " + std::string(name) + " has no values");
    return v;
  };
  size_t pos = 0;
  while (pos <= text.size() && problems.size() < 20) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    const std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (end == text.size() && line.empty()) break;
    const auto w = words(line);
    if (w.empty() || w[0].front() == '#') continue;
    if (in_data) {
      if (row >= rows_expected) {
        problem(line_no, "more data rows than m x n = " + std::to_string(rows_expected));
        break;
      }
      if (w.size() != t.ks.size()) {
        problem(line_no, "data row has " + std::to_string(w.size()) + " values, k has " + std::to_string(t.ks.size()));
        ++row;
        continue;
      }
      for (const auto& v : w) {
        if (v == "-") {
          t.seconds.push_back(-1);
          continue;
        }
        double us = 0;
        const auto r = std::from_chars(v.data(), v.data() + v.size(), us);
        if (r.ec != std::errc() || r.ptr != v.data() + v.size() || !(us > 0) || us > 1e12) {
          problem(line_no, "time \"" + std::string(v) + "\" is not a positive number of microseconds or \"-\"");
          us = 1;
        }
        t.seconds.push_back(us * kMicrosecond);
      }
      ++row;
      continue;
    }
    const std::string key(w[0]);
    if (seen[key]) {
      problem(line_no, "key \"" + key + "\" given twice");
      continue;
    }
    seen[key] = true;
    if (key == "format") {
      have_format = true;
      if (w.size() != 2 || w[1] != "dtsim-gemm-table-1")
        problem(line_no, "format must be dtsim-gemm-table-1, not \"" + rest_of(line, "format") + "\"");
    } else if (key == "system") {
      t.system = rest_of(line, key);
    } else if (key == "device") {
      t.device = rest_of(line, key);
    } else if (key == "collection") {
      t.collection = rest_of(line, key);
    } else if (key == "dtype") {
      if (w.size() == 2 && w[1] == "bf16") t.dtype = Dtype::bf16;
      else if (w.size() == 2 && w[1] == "fp8") t.dtype = Dtype::fp8;
      else problem(line_no, "dtype must be bf16 or fp8");
    } else if (key == "layout") {
      if (w.size() != 2 || w[1] != "NT") problem(line_no, "layout must be NT (Y = X W^T)");
    } else if (key == "unit") {
      if (w.size() != 2 || w[1] != "us") problem(line_no, "unit must be us");
    } else if (key == "m") {
      t.ms = axis("m", w, line_no);
    } else if (key == "n") {
      t.ns = axis("n", w, line_no);
    } else if (key == "k") {
      t.ks = axis("k", w, line_no);
    } else if (key == "data") {
      for (const char* need : {"format", "system", "dtype", "layout", "unit", "m", "n", "k"})
        if (!seen[need]) problem(line_no, std::string("key \"") + need + "\" must come before data");
      if (!problems.empty()) break;
      in_data = true;
      rows_expected = t.ms.size() * t.ns.size();
      t.seconds.reserve(rows_expected * t.ks.size());
    } else {
      problem(line_no, "unknown key \"" + key +
                           "\" (valid: format, system, device, collection, dtype, layout, unit, m, n, k, data)");
    }
  }
  if (!have_format && problems.empty()) problem(line_no, "no format line: not a dtsim-gemm-table-1 file");
  if (problems.empty() && !in_data) problem(line_no, "no data section");
  if (problems.empty() && row != rows_expected)
    problem(line_no, "data has " + std::to_string(row) + " rows, m x n = " + std::to_string(rows_expected));
  if (!problems.empty()) throw InputError(problems);
  return t;
}

std::optional<ProfileTime> GemmTable::lookup(const GemmShape& g) const {
  if (g.m <= 0 || g.n <= 0 || g.k <= 0 || seconds.empty()) return std::nullopt;
  const AxisPos pm = locate(ms, g.m), pn = locate(ns, g.n), pk = locate(ks, g.k);
  double t = 0;
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < 2; ++c) {
        const double w = (a ? pm.w : 1 - pm.w) * (b ? pn.w : 1 - pn.w) * (c ? pk.w : 1 - pk.w);
        if (w <= 0) continue;
        const double v = at(a ? pm.hi : pm.lo, b ? pn.hi : pn.lo, c ? pk.hi : pk.lo);
        if (v < 0) return std::nullopt;  // a corner that was not measured
        t += w * v;
      }
  t *= pm.scale * pn.scale * pk.scale;
  TimeSource src = TimeSource::table_interpolated;
  if (pm.outside || pn.outside || pk.outside) src = TimeSource::table_extrapolated;
  else if (pm.exact && pn.exact && pk.exact) src = TimeSource::table_exact;
  return ProfileTime{t, src};
}

const GemmTable* shipped_gemm_table(std::string_view system, Dtype dtype) {
  // Each table is parsed on its first use (a run needs its GPU's tables, not every shipped
  // one), once, under a lock; the parsed tables stay for the process.
  const std::string name = std::string(system) + "_gemm_" + to_string(dtype);
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<const GemmTable>, std::less<>> parsed;
  const std::lock_guard<std::mutex> lock(mu);
  if (const auto it = parsed.find(name); it != parsed.end()) return it->second.get();
  for (const auto& e : embedded_tables()) {
    if (e.name != name) continue;
    auto t = std::make_unique<GemmTable>(GemmTable::parse(e.text, "shipped kernel table " + std::string(e.name)));
    t->name = std::string(e.name);
    return parsed.emplace(name, std::move(t)).first->second.get();
  }
  return nullptr;
}

std::vector<std::string> shipped_table_systems() {
  std::vector<std::string> out;
  for (const auto& e : embedded_tables()) {
    const auto at = e.name.find("_gemm_");
    if (at == std::string_view::npos) continue;
    std::string s(e.name.substr(0, at));
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  std::sort(out.begin(), out.end());
  return out;
}

const ComputeProfile* ComputeProfile::shipped(std::string_view system) {
  // Made on first use per system (its tables parsed then: shipped_gemm_table), under a lock.
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<const ComputeProfile>, std::less<>> profiles;
  const std::lock_guard<std::mutex> lock(mu);
  if (const auto it = profiles.find(system); it != profiles.end()) return it->second.get();
  const std::vector<std::string> systems = shipped_table_systems();
  if (std::find(systems.begin(), systems.end(), system) == systems.end()) return nullptr;
  auto p = std::make_unique<ComputeProfile>();
  const std::string sys(system);
  p->file = "shipped kernel tables " + sys;
  p->note = "GEMM times measured by NVIDIA aiconfigurator (commit 095f58a5, Apache-2.0); "
            "models/calibration/tables/README.md";
  for (Dtype d : {Dtype::bf16, Dtype::fp8})
    if (const GemmTable* t = shipped_gemm_table(sys, d)) {
      p->gemm_tables.push_back(t);
      if (p->device.name.empty()) p->device.name = t->device;
    }
  return profiles.emplace(sys, std::move(p)).first->second.get();
}

}  // namespace dtsim::calib
