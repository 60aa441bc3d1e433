#include "models/calibration/profile.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "models/calibration/gemm_table.hpp"
#include "models/checked.hpp"
#include "models/errors.hpp"
#include "models/input_files.hpp"
#include "models/yaml_text.hpp"

namespace dtsim::calib {

const char* to_string(TimeSource s) {
  switch (s) {
    case TimeSource::roofline: return "roofline";
    case TimeSource::profile_exact: return "profile-exact";
    case TimeSource::profile_interpolated: return "profile-interpolated";
    case TimeSource::profile_fitted: return "profile-fitted";
    case TimeSource::table_exact: return "table-exact";
    case TimeSource::table_interpolated: return "table-interpolated";
    case TimeSource::table_extrapolated: return "table-extrapolated";
  }
  return "?";
}

// ---------------------------------------------------------------- fitting -----------
LineFit fit_line(const std::vector<double>& xs, const std::vector<double>& ys) {
  if (xs.empty() || xs.size() != ys.size()) throw std::invalid_argument("fit_line: need equal, non-empty x and y");
  const double n = static_cast<double>(xs.size());
  double sx = 0, sy = 0;
  for (size_t i = 0; i < xs.size(); ++i) sx += xs[i], sy += ys[i];
  const double mx = sx / n, my = sy / n;
  double sxx = 0, sxy = 0;
  for (size_t i = 0; i < xs.size(); ++i) sxx += (xs[i] - mx) * (xs[i] - mx), sxy += (xs[i] - mx) * (ys[i] - my);
  LineFit f;
  auto through_origin = [&] {
    double xx = 0, xy = 0;
    for (size_t i = 0; i < xs.size(); ++i) xx += xs[i] * xs[i], xy += xs[i] * ys[i];
    f.slope = xx > 0 ? xy / xx : 0;
    f.intercept = 0;
  };
  if (sxx <= std::numeric_limits<double>::min() * n || xs.size() == 1) {
    through_origin();
  } else {
    f.slope = sxy / sxx;
    f.intercept = my - f.slope * mx;
    if (f.intercept < 0) through_origin();
  }
  double ss = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double r = ys[i] - (f.slope * xs[i] + f.intercept);
    ss += r * r;
  }
  f.rms_residual = std::sqrt(ss / n);
  return f;
}

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

double quantised_gemm_flops(const GemmShape& g, int64_t tile_m, int64_t tile_n, int64_t sm_count) {
  const int64_t tiles = ceil_div(g.m, tile_m) * ceil_div(g.n, tile_n);
  const int64_t waves = ceil_div(tiles, sm_count);
  return 2.0 * static_cast<double>(waves) * static_cast<double>(sm_count) * static_cast<double>(tile_m) *
         static_cast<double>(tile_n) * static_cast<double>(g.k);
}

double GemmModel::predict(const GemmShape& g) const {
  return quantised_gemm_flops(g, tile_m, tile_n, sm_count) / flop_rate + overhead_s;
}

namespace {
// Thread-block tile shapes cuBLAS picks for large bf16/fp8 GEMMs on A100/H100 (the
// Matrix Multiplication Background guide lists 256x128, 128x256, 128x128, 256x64,
// 64x256, 128x64, 64x128, 64x64 as the tile sizes available).
constexpr int64_t kTileCandidates[][2] = {{256, 128}, {128, 256}, {128, 128}, {256, 64}, {64, 256},
                                          {128, 64},  {64, 128},  {64, 64}};
}  // namespace

void ComputeProfile::fit_models() {
  gemm_models.clear();
  attention_models.clear();
  memory_models.clear();
  optimizer_model = {};
  // GEMM, per dtype: pick the tile shape with the smallest RMS residual.
  for (Dtype dt : {Dtype::bf16, Dtype::fp8}) {
    std::vector<const Measurement*> ms;
    for (const auto& m : measurements)
      if (m.spec.kind == KernelClass::gemm && m.spec.gemm.dtype == dt) ms.push_back(&m);
    if (ms.empty() || device.sm_count <= 0) continue;
    std::optional<GemmModel> best;
    double best_rms = 0;
    for (const auto& tile : kTileCandidates) {
      std::vector<double> xs, ys;
      for (const auto* m : ms) {
        xs.push_back(quantised_gemm_flops(m->spec.gemm, tile[0], tile[1], device.sm_count));
        ys.push_back(m->time_s);
      }
      const LineFit f = fit_line(xs, ys);
      if (f.slope <= 0) continue;
      if (!best || f.rms_residual < best_rms * (1 - 1e-12)) {
        best = GemmModel{dt, tile[0], tile[1], device.sm_count, 1.0 / f.slope, f.intercept};
        best_rms = f.rms_residual;
      }
    }
    if (best) gemm_models.push_back(*best);
  }
  for (bool bwd : {false, true}) {
    std::vector<double> xs, ys;
    for (const auto& m : measurements)
      if (m.spec.kind == KernelClass::attention && m.spec.attention.backward == bwd)
        xs.push_back(m.spec.flops()), ys.push_back(m.time_s);
    if (xs.empty()) continue;
    const LineFit f = fit_line(xs, ys);
    if (f.slope > 0) attention_models.push_back({bwd, 1.0 / f.slope, f.intercept});
  }
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> by_name;
  std::vector<double> all_x, all_y;
  for (const auto& m : measurements)
    if (m.spec.kind == KernelClass::memory) {
      by_name[m.spec.name].first.push_back(m.spec.bytes);
      by_name[m.spec.name].second.push_back(m.time_s);
      all_x.push_back(m.spec.bytes), all_y.push_back(m.time_s);
    }
  if (!all_x.empty()) {
    const LineFit f = fit_line(all_x, all_y);
    if (f.slope > 0) memory_models.push_back({"*", 1.0 / f.slope, f.intercept});
  }
  for (const auto& [name, xy] : by_name) {
    if (std::set<double>(xy.first.begin(), xy.first.end()).size() < 2) continue;
    const LineFit f = fit_line(xy.first, xy.second);
    if (f.slope > 0) memory_models.push_back({name, 1.0 / f.slope, f.intercept});
  }
  std::vector<double> px, py;
  for (const auto& m : measurements)
    if (m.spec.kind == KernelClass::optimizer) px.push_back(m.spec.params), py.push_back(m.time_s);
  if (!px.empty()) {
    const LineFit f = fit_line(px, py);
    if (f.slope > 0) optimizer_model = {1.0 / f.slope, f.intercept};
  }
}

// ---------------------------------------------------------------- lookup ------------
namespace {
bool same_size(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b)); }

/// Linear interpolation of (x, t) points at x; nullopt unless x lies strictly between two.
std::optional<double> interpolate(std::vector<std::pair<double, double>> pts, double x) {
  std::sort(pts.begin(), pts.end());
  for (size_t i = 1; i < pts.size(); ++i) {
    const auto& [x0, t0] = pts[i - 1];
    const auto& [x1, t1] = pts[i];
    if (x0 < x && x < x1) return t0 + (t1 - t0) * (x - x0) / (x1 - x0);
  }
  return std::nullopt;
}
}  // namespace

bool ComputeProfile::has_data_for(KernelClass c) const {
  for (const auto& m : measurements)
    if (m.spec.kind == c) return true;
  switch (c) {
    case KernelClass::gemm: return !gemm_tables.empty() || !gemm_models.empty();
    case KernelClass::attention: return !attention_models.empty();
    case KernelClass::memory: return !memory_models.empty();
    case KernelClass::optimizer: return optimizer_model.valid();
  }
  return false;
}

std::optional<ProfileTime> ComputeProfile::lookup(const KernelSpec& k) const {
  auto same_gemm = [](const GemmShape& a, const GemmShape& b) {
    return a.m == b.m && a.n == b.n && a.k == b.k && a.dtype == b.dtype && a.trans_a == b.trans_a &&
           a.trans_b == b.trans_b;
  };
  auto same_attention = [](const AttentionShape& a, const AttentionShape& b) {
    return a.batch == b.batch && a.heads == b.heads && a.kv_heads == b.kv_heads && a.seq_q == b.seq_q &&
           a.seq_kv == b.seq_kv && a.head_dim == b.head_dim && a.causal == b.causal && a.backward == b.backward;
  };
  for (const auto& m : measurements) {
    if (m.spec.kind != k.kind) continue;
    bool exact = false;
    switch (k.kind) {
      case KernelClass::memory: exact = m.spec.name == k.name && same_size(m.spec.bytes, k.bytes); break;
      case KernelClass::optimizer: exact = same_size(m.spec.params, k.params); break;
      case KernelClass::gemm: exact = same_gemm(m.spec.gemm, k.gemm); break;
      case KernelClass::attention: exact = same_attention(m.spec.attention, k.attention); break;
    }
    if (exact) return ProfileTime{m.time_s, TimeSource::profile_exact};
  }
  if (k.kind == KernelClass::gemm)
    for (const GemmTable* t : gemm_tables)
      if (t->dtype == k.gemm.dtype)
        if (auto r = t->lookup(k.gemm)) return r;
  // Interpolation between measured neighbours.
  std::vector<std::pair<double, double>> pts;
  double x = 0;
  for (const auto& m : measurements) {
    if (m.spec.kind != k.kind) continue;
    switch (k.kind) {
      case KernelClass::memory:
        if (m.spec.name == k.name) pts.emplace_back(m.spec.bytes, m.time_s);
        x = k.bytes;
        break;
      case KernelClass::optimizer:
        pts.emplace_back(m.spec.params, m.time_s);
        x = k.params;
        break;
      case KernelClass::attention: {
        const auto &a = m.spec.attention, &b = k.attention;
        if (a.heads == b.heads && a.kv_heads == b.kv_heads && a.head_dim == b.head_dim && a.causal == b.causal &&
            a.backward == b.backward)
          pts.emplace_back(m.spec.flops(), m.time_s);
        x = k.flops();
        break;
      }
      case KernelClass::gemm: break;  // wave quantisation makes GEMM time a step function: use the model
    }
  }
  if (auto t = interpolate(pts, x)) return ProfileTime{*t, TimeSource::profile_interpolated};
  // Fitted models.
  switch (k.kind) {
    case KernelClass::gemm:
      for (const auto& g : gemm_models)
        if (g.dtype == k.gemm.dtype) return ProfileTime{g.predict(k.gemm), TimeSource::profile_fitted};
      break;
    case KernelClass::attention:
      for (const auto& a : attention_models)
        if (a.backward == k.attention.backward)
          return ProfileTime{k.flops() / a.flop_rate + a.overhead_s, TimeSource::profile_fitted};
      break;
    case KernelClass::memory: {
      const BandwidthModel* use = nullptr;
      for (const auto& b : memory_models) {
        if (b.name == k.name) use = &b;
        if (b.name == "*" && !use) use = &b;
      }
      if (use) return ProfileTime{k.bytes / use->bandwidth + use->overhead_s, TimeSource::profile_fitted};
      break;
    }
    case KernelClass::optimizer:
      if (optimizer_model.valid())
        return ProfileTime{k.params / optimizer_model.params_per_s + optimizer_model.overhead_s,
                           TimeSource::profile_fitted};
      break;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------- parsing -----------
namespace {

const char* kUnits[][2] = {{"time", "s"},          {"bytes", "B"},        {"flops", "FLOP"},
                           {"flop_rate", "FLOP/s"}, {"bandwidth", "B/s"}, {"clock", "MHz"}};

class Parser {
 public:
  explicit Parser(const std::string& file) : p_(file) {}
  ProblemList& problems() { return p_; }

  /// Checks that `n` is a map whose keys are all in `valid` and that every key in
  /// `required` is present.
  bool map(const YAML::Node& n, const std::string& path, const std::vector<std::string>& valid,
           const std::vector<std::string>& required) {
    if (!n.IsMap()) {
      p_.add((path.empty() ? std::string("the file") : path) + " must be a map");
      return false;
    }
    for (const auto& kv : n) {
      const std::string key = kv.first.Scalar();
      if (std::find(valid.begin(), valid.end(), key) == valid.end()) {
        std::string list;
        for (const auto& v : valid) list += (list.empty() ? "" : ", ") + v;
        p_.add("unknown key " + join(path, key) + " (valid keys" + (path.empty() ? "" : " under " + path) + ": " +
               list + ")");
      }
    }
    bool ok = true;
    for (const auto& r : required)
      if (!n[r]) {
        p_.add("missing key " + join(path, r));
        ok = false;
      }
    return ok;
  }
  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }
  std::string text(const YAML::Node& n, const std::string& path, const std::string& key) {
    const YAML::Node v = n[key];
    if (!v) return "";
    if (!v.IsScalar()) {
      p_.add(join(path, key) + " must be a scalar");
      return "";
    }
    return v.Scalar();
  }
  /// The largest value a key may hold: a measurement beyond it is not one of a training
  /// kernel, and would carry a non-finite or absurd time into the step (limits:: in
  /// models/checked.hpp; a kernel of a training step lasts well under a second: a
  /// 65,536^3 GEMM at 1 PFLOP/s takes 0.6 s).
  static double max_of(const std::string& key) {
    if (key == "time_s") return 100.0;
    if (key == "overhead_s") return limits::kMaxLatency;
    if (key == "flop_rate_FLOP_per_s" || key == "params_per_s") return limits::kMaxFlopRate;
    if (key == "bandwidth_B_per_s") return limits::kMaxBandwidth;
    if (key == "bytes") return limits::kMaxMemoryBytes;
    if (key == "params") return 1e15;
    return std::numeric_limits<double>::max();
  }
  double number(const YAML::Node& n, const std::string& path, const std::string& key, bool positive) {
    const YAML::Node v = n[key];
    if (!v) return 0;
    try {
      const double d = v.as<double>();
      if (!std::isfinite(d) || (positive ? d <= 0 : d < 0)) {
        p_.add(join(path, key) + "=" + v.Scalar() + (positive ? " must be > 0" : " must be >= 0"));
        return 0;
      }
      if (d > max_of(key)) {
        p_.add(join(path, key) + "=" + v.Scalar() + " is above " + fmt::format("{:g}", max_of(key)) +
               ": not a measurement of a training kernel (models/calibration/profile.cpp max_of)");
        return 0;
      }
      return d;
    } catch (const YAML::Exception&) {
      p_.add(join(path, key) + " must be a number");
      return 0;
    }
  }
  int64_t integer(const YAML::Node& n, const std::string& path, const std::string& key) {
    const YAML::Node v = n[key];
    if (!v) return 0;
    try {
      const int64_t i = v.as<int64_t>();
      // Shapes: tokens x batch and widths stay far below 2^40 (models/checked.hpp limits).
      if (i <= 0 || i > (int64_t{1} << 40))
        p_.add(join(path, key) + "=" + v.Scalar() + " must be a positive integer up to 2^40");
      return i;
    } catch (const YAML::Exception&) {
      p_.add(join(path, key) + " must be a positive integer");
      return 0;
    }
  }
  bool boolean(const YAML::Node& n, const std::string& path, const std::string& key) {
    const YAML::Node v = n[key];
    if (!v) return false;
    try {
      return v.as<bool>();
    } catch (const YAML::Exception&) {
      p_.add(join(path, key) + " must be true or false");
      return false;
    }
  }
  Dtype dtype(const YAML::Node& n, const std::string& path) {
    const std::string s = text(n, path, "dtype");
    if (s == "bf16") return Dtype::bf16;
    if (s == "fp8") return Dtype::fp8;
    p_.add(join(path, "dtype") + "=\"" + s + "\" must be bf16 or fp8");
    return Dtype::bf16;
  }
  bool pass(const YAML::Node& n, const std::string& path) {
    const std::string s = text(n, path, "pass");
    if (s == "bwd") return true;
    if (s != "fwd") p_.add(join(path, "pass") + "=\"" + s + "\" must be fwd or bwd");
    return false;
  }
  /// Calls f(item, path) for each element of the sequence n[key] (when present).
  template <class F>
  void each(const YAML::Node& n, const std::string& path, const std::string& key, F f) {
    const YAML::Node v = n[key];
    if (!v) return;
    if (!v.IsSequence()) {
      p_.add(join(path, key) + " must be a list");
      return;
    }
    for (size_t i = 0; i < v.size(); ++i) f(v[i], fmt::format("{}[{}]", join(path, key), i));
  }

 private:
  ProblemList p_;
};

}  // namespace

ComputeProfile ComputeProfile::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot read compute profile (no such file or not readable)");
  note_input_file(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path);
}

namespace {

/// YYYY-MM-DD, optionally followed by THH:MM:SS[.fraction] and Z or +HH:MM / -HH:MM (ISO 8601
/// extended format, the form RFC 3339 Sec 5.6 profiles), with fields in range (day <= 31).
bool iso8601_date(const std::string& s) {
  auto digits = [&](size_t at, size_t n, int lo, int hi) {
    if (at + n > s.size()) return false;
    int v = 0;
    for (size_t i = at; i < at + n; ++i) {
      if (s[i] < '0' || s[i] > '9') return false;
      v = v * 10 + (s[i] - '0');
    }
    return v >= lo && v <= hi;
  };
  auto at = [&](size_t i, char c) { return i < s.size() && s[i] == c; };
  if (!digits(0, 4, 0, 9999) || !at(4, '-') || !digits(5, 2, 1, 12) || !at(7, '-') || !digits(8, 2, 1, 31))
    return false;
  if (s.size() == 10) return true;
  if (!at(10, 'T') || !digits(11, 2, 0, 23) || !at(13, ':') || !digits(14, 2, 0, 59) || !at(16, ':') ||
      !digits(17, 2, 0, 60))
    return false;
  size_t i = 19;
  if (at(i, '.')) {
    const size_t from = ++i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    if (i == from) return false;
  }
  if (at(i, 'Z')) return i + 1 == s.size();
  if (at(i, '+') || at(i, '-'))
    return digits(i + 1, 2, 0, 23) && at(i + 3, ':') && digits(i + 4, 2, 0, 59) && i + 6 == s.size();
  return i == s.size();  // a local time without offset
}

}  // namespace

ComputeProfile ComputeProfile::parse(const std::string& text, const std::string& file) {
  YAML::Node root;
  try {
    root = load_yaml_document(text, file);  // one document; clear messages (models/yaml_text.hpp)
  } catch (const YAML::Exception& e) {
    throw InputError(file + ": not valid YAML: " + e.what());
  }
  Parser P(file);
  ComputeProfile pr;
  pr.file = file;
  if (!P.map(root, "", {"format", "synthetic", "note", "date", "units", "device", "kernels", "models"},
             {"format", "date", "units", "device"})) {
    P.problems().throw_if_any();
  }
  pr.format = P.text(root, "", "format");
  if (!pr.format.empty() && pr.format != "dtsim-compute-profile-1")
    P.problems().add("format=\"" + pr.format + "\" is not supported (expected dtsim-compute-profile-1)");
  pr.synthetic = P.boolean(root, "", "synthetic");
  pr.note = P.text(root, "", "note");
  pr.date = P.text(root, "", "date");
  if (!pr.date.empty() && !iso8601_date(pr.date))
    P.problems().add("date=\"" + pr.date +
                     "\" is not an ISO 8601 date or UTC time (YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ, as dtsim calibrate "
                     "writes)");
  if (const YAML::Node u = root["units"]) {
    std::vector<std::string> keys;
    for (const auto& kv : kUnits) keys.emplace_back(kv[0]);
    if (P.map(u, "units", keys, keys))
      for (const auto& kv : kUnits) {
        const std::string got = P.text(u, "units", kv[0]);
        if (got != kv[1])
          P.problems().add(fmt::format("units.{}=\"{}\" must be \"{}\" (dtsim profiles are in SI units)", kv[0], got,
                                       kv[1]));
      }
  }
  if (const YAML::Node d = root["device"]) {
    const std::string p = "device";
    if (P.map(d, p,
              {"name", "compute_capability", "sm_count", "sm_clock_MHz", "memory_clock_MHz", "driver", "cuda_runtime",
               "cublaslt", "attention_impl"},
              {"name", "sm_count"})) {
      pr.device.name = P.text(d, p, "name");
      pr.device.compute_capability = P.text(d, p, "compute_capability");
      pr.device.sm_count = P.integer(d, p, "sm_count");
      pr.device.sm_clock_mhz = P.number(d, p, "sm_clock_MHz", false);
      pr.device.memory_clock_mhz = P.number(d, p, "memory_clock_MHz", false);
      pr.device.driver = P.text(d, p, "driver");
      pr.device.cuda_runtime = P.text(d, p, "cuda_runtime");
      pr.device.cublaslt = P.text(d, p, "cublaslt");
      pr.device.attention_impl = P.text(d, p, "attention_impl");
    }
  }
  if (const YAML::Node k = root["kernels"]) {
    if (P.map(k, "kernels", {"gemm", "attention", "memory", "optimizer"}, {})) {
      P.each(k, "kernels", "gemm", [&](const YAML::Node& n, const std::string& p) {
        if (!P.map(n, p, {"m", "n", "k", "dtype", "trans_a", "trans_b", "time_s"},
                   {"m", "n", "k", "dtype", "trans_a", "trans_b", "time_s"}))
          return;
        Measurement m;
        m.spec.kind = KernelClass::gemm;
        m.spec.gemm = {P.integer(n, p, "m"),       P.integer(n, p, "n"),       P.integer(n, p, "k"),
                       P.dtype(n, p),              P.boolean(n, p, "trans_a"), P.boolean(n, p, "trans_b")};
        m.time_s = P.number(n, p, "time_s", true);
        pr.measurements.push_back(m);
      });
      P.each(k, "kernels", "attention", [&](const YAML::Node& n, const std::string& p) {
        const std::vector<std::string> keys{"pass",   "batch",    "heads",  "kv_heads", "seq_q",
                                            "seq_kv", "head_dim", "causal", "time_s"};
        if (!P.map(n, p, keys, keys)) return;
        Measurement m;
        m.spec.kind = KernelClass::attention;
        auto& a = m.spec.attention;
        a.backward = P.pass(n, p);
        a.batch = P.integer(n, p, "batch");
        a.heads = P.integer(n, p, "heads");
        a.kv_heads = P.integer(n, p, "kv_heads");
        a.seq_q = P.integer(n, p, "seq_q");
        a.seq_kv = P.integer(n, p, "seq_kv");
        a.head_dim = P.integer(n, p, "head_dim");
        a.causal = P.boolean(n, p, "causal");
        if (a.kv_heads > 0 && a.heads > 0 && a.heads % a.kv_heads != 0)
          P.problems().add(fmt::format("{}.kv_heads={} must divide heads={}", p, a.kv_heads, a.heads));
        m.time_s = P.number(n, p, "time_s", true);
        pr.measurements.push_back(m);
      });
      P.each(k, "kernels", "memory", [&](const YAML::Node& n, const std::string& p) {
        if (!P.map(n, p, {"name", "bytes", "time_s"}, {"name", "bytes", "time_s"})) return;
        Measurement m;
        m.spec.kind = KernelClass::memory;
        m.spec.name = P.text(n, p, "name");
        m.spec.bytes = P.number(n, p, "bytes", true);
        m.time_s = P.number(n, p, "time_s", true);
        pr.measurements.push_back(m);
      });
      P.each(k, "kernels", "optimizer", [&](const YAML::Node& n, const std::string& p) {
        if (!P.map(n, p, {"params", "time_s"}, {"params", "time_s"})) return;
        Measurement m;
        m.spec.kind = KernelClass::optimizer;
        m.spec.params = P.number(n, p, "params", true);
        m.time_s = P.number(n, p, "time_s", true);
        pr.measurements.push_back(m);
      });
    }
  }
  const YAML::Node models = root["models"];
  if (models) {
    if (P.map(models, "models", {"gemm", "attention", "memory", "optimizer"}, {})) {
      P.each(models, "models", "gemm", [&](const YAML::Node& n, const std::string& p) {
        const std::vector<std::string> keys{"dtype", "tile_m", "tile_n", "sm_count", "flop_rate_FLOP_per_s",
                                            "overhead_s"};
        if (!P.map(n, p, keys, keys)) return;
        pr.gemm_models.push_back({P.dtype(n, p), P.integer(n, p, "tile_m"), P.integer(n, p, "tile_n"),
                                  P.integer(n, p, "sm_count"), P.number(n, p, "flop_rate_FLOP_per_s", true),
                                  P.number(n, p, "overhead_s", false)});
      });
      P.each(models, "models", "attention", [&](const YAML::Node& n, const std::string& p) {
        const std::vector<std::string> keys{"pass", "flop_rate_FLOP_per_s", "overhead_s"};
        if (!P.map(n, p, keys, keys)) return;
        pr.attention_models.push_back(
            {P.pass(n, p), P.number(n, p, "flop_rate_FLOP_per_s", true), P.number(n, p, "overhead_s", false)});
      });
      P.each(models, "models", "memory", [&](const YAML::Node& n, const std::string& p) {
        const std::vector<std::string> keys{"name", "bandwidth_B_per_s", "overhead_s"};
        if (!P.map(n, p, keys, keys)) return;
        pr.memory_models.push_back({P.text(n, p, "name"), P.number(n, p, "bandwidth_B_per_s", true),
                                    P.number(n, p, "overhead_s", false)});
      });
      if (const YAML::Node o = models["optimizer"]) {
        const std::vector<std::string> keys{"params_per_s", "overhead_s"};
        if (P.map(o, "models.optimizer", keys, keys))
          pr.optimizer_model = {P.number(o, "models.optimizer", "params_per_s", true),
                                P.number(o, "models.optimizer", "overhead_s", false)};
      }
    }
  }
  // One time per kernel shape: a second entry of the same shape would leave which one times
  // the kernel to the lookup's order.
  std::set<std::string> shapes;
  for (const Measurement& m : pr.measurements) {
    const auto& g = m.spec.gemm;
    const auto& a = m.spec.attention;
    std::string key;
    switch (m.spec.kind) {
      case KernelClass::gemm:
        key = fmt::format("gemm m={} n={} k={} dtype={} trans_a={} trans_b={}", g.m, g.n, g.k, to_string(g.dtype),
                          g.trans_a, g.trans_b);
        break;
      case KernelClass::attention:
        key = fmt::format("attention pass={} batch={} heads={} kv_heads={} seq_q={} seq_kv={} head_dim={} causal={}",
                          a.backward ? "bwd" : "fwd", a.batch, a.heads, a.kv_heads, a.seq_q, a.seq_kv, a.head_dim,
                          a.causal);
        break;
      case KernelClass::memory: key = fmt::format("memory name={} bytes={}", m.spec.name, m.spec.bytes); break;
      case KernelClass::optimizer: key = fmt::format("optimizer params={}", m.spec.params); break;
    }
    if (!shapes.insert(key).second)
      P.problems().add("kernels: a second entry for " + key + " (keep one time per shape)");
  }
  if (pr.measurements.empty() && !models)
    P.problems().add("no kernels and no models: the profile would time every kernel on the roofline instead of the "
                     "shipped tables (give measurements, or leave cluster.gpu.profile out)");
  P.problems().throw_if_any();
  if (!models) pr.fit_models();
  return pr;
}

// ---------------------------------------------------------------- writing -----------
std::string ComputeProfile::to_yaml() const {
  std::string o;
  auto q = [](const std::string& s) {  // double-quoted YAML scalar
    std::string r = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') r += '\\';
      r += c;
    }
    return r + "\"";
  };
  o += "# dtsim compute profile (written by `dtsim calibrate`; format in models/calibration/profile.hpp)\n";
  o += "format: " + format + "\n";
  if (synthetic) o += "synthetic: true\n";
  if (!note.empty()) o += "note: " + q(note) + "\n";
  o += "date: " + q(date) + "\n";
  o += "units: {";
  for (size_t i = 0; i < std::size(kUnits); ++i) o += fmt::format("{}{}: {}", i ? ", " : "", kUnits[i][0], q(kUnits[i][1]));
  o += "}\n";
  o += "device:\n";
  o += "  name: " + q(device.name) + "\n";
  o += "  compute_capability: " + q(device.compute_capability) + "\n";
  o += fmt::format("  sm_count: {}\n  sm_clock_MHz: {}\n  memory_clock_MHz: {}\n", device.sm_count,
                   device.sm_clock_mhz, device.memory_clock_mhz);
  o += "  driver: " + q(device.driver) + "\n";
  o += "  cuda_runtime: " + q(device.cuda_runtime) + "\n";
  o += "  cublaslt: " + q(device.cublaslt) + "\n";
  o += "  attention_impl: " + q(device.attention_impl) + "\n";
  o += "kernels:\n";
  const char* lists[] = {"gemm", "attention", "memory", "optimizer"};
  for (int kind = 0; kind < 4; ++kind) {
    bool any = false;
    for (const auto& m : measurements) {
      if (static_cast<int>(m.spec.kind) != kind) continue;
      if (!any) o += fmt::format("  {}:\n", lists[kind]);
      any = true;
      const auto& s = m.spec;
      switch (s.kind) {
        case KernelClass::gemm:
          o += fmt::format("    - {{m: {}, n: {}, k: {}, dtype: {}, trans_a: {}, trans_b: {}, time_s: {}}}\n", s.gemm.m,
                           s.gemm.n, s.gemm.k, to_string(s.gemm.dtype), s.gemm.trans_a, s.gemm.trans_b, m.time_s);
          break;
        case KernelClass::attention: {
          const auto& a = s.attention;
          o += fmt::format(
              "    - {{pass: {}, batch: {}, heads: {}, kv_heads: {}, seq_q: {}, seq_kv: {}, head_dim: {}, causal: {}, "
              "time_s: {}}}\n",
              a.backward ? "bwd" : "fwd", a.batch, a.heads, a.kv_heads, a.seq_q, a.seq_kv, a.head_dim, a.causal,
              m.time_s);
          break;
        }
        case KernelClass::memory:
          o += fmt::format("    - {{name: {}, bytes: {}, time_s: {}}}\n", q(s.name), s.bytes, m.time_s);
          break;
        case KernelClass::optimizer: o += fmt::format("    - {{params: {}, time_s: {}}}\n", s.params, m.time_s); break;
      }
    }
  }
  if (measurements.empty()) o += "  {}\n";
  o += "models:\n";
  if (!gemm_models.empty()) {
    o += "  gemm:\n";
    for (const auto& g : gemm_models)
      o += fmt::format(
          "    - {{dtype: {}, tile_m: {}, tile_n: {}, sm_count: {}, flop_rate_FLOP_per_s: {}, overhead_s: {}}}\n",
          to_string(g.dtype), g.tile_m, g.tile_n, g.sm_count, g.flop_rate, g.overhead_s);
  }
  if (!attention_models.empty()) {
    o += "  attention:\n";
    for (const auto& a : attention_models)
      o += fmt::format("    - {{pass: {}, flop_rate_FLOP_per_s: {}, overhead_s: {}}}\n", a.backward ? "bwd" : "fwd",
                       a.flop_rate, a.overhead_s);
  }
  if (!memory_models.empty()) {
    o += "  memory:\n";
    for (const auto& b : memory_models)
      o += fmt::format("    - {{name: {}, bandwidth_B_per_s: {}, overhead_s: {}}}\n", q(b.name), b.bandwidth,
                       b.overhead_s);
  }
  if (optimizer_model.valid())
    o += fmt::format("  optimizer: {{params_per_s: {}, overhead_s: {}}}\n", optimizer_model.params_per_s,
                     optimizer_model.overhead_s);
  if (gemm_models.empty() && attention_models.empty() && memory_models.empty() && !optimizer_model.valid())
    o += "  {}\n";
  return o;
}

}  // namespace dtsim::calib
