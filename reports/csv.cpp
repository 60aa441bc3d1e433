#include "reports/csv.hpp"

#include <cmath>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

namespace dtsim {

namespace {

/// A text cell a spreadsheet would run as a formula: it begins with =, +, -, @, tab or CR
/// and is not a number or a percentage such as -59.9% (OWASP, "CSV Injection").
bool formula_like(const std::string& s) {
  if (s.empty() || std::string_view("=+-@\t\r").find(s.front()) == std::string_view::npos) return false;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  const std::string_view rest(end);
  return !(end != s.c_str() && (rest.empty() || rest == "%"));  // a number, or a percentage
}

}  // namespace

std::string csv_field(const std::string& raw) {
  const std::string s = formula_like(raw) ? "'" + raw : raw;
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string csv_number(double v) {
  if (!std::isfinite(v)) return "";
  if (v == 0) return "0";
  return fmt::format("{:.9g}", v);
}

std::string csv_line(const std::vector<std::string>& fields) {
  std::string out;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i) out += ',';
    out += csv_field(fields[i]);
  }
  return out + "\n";
}

const std::vector<std::string>& sweep_csv_columns() {
  static const std::vector<std::string> cols = {
      "id", "engine", "cluster", "cluster_label", "gpu", "nodes", "gpus", "dp", "tp", "cp", "pp", "vp", "ep", "etp", "schedule",
      "zero_stage", "micro_batch", "micro_batches", "recompute", "sequence_parallel", "status", "reason",
      "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "tflops_per_gpu", "compute_s", "bubble_s",
      "host_bound_s", "optimizer_s", "exposed_tp_s", "exposed_cp_s", "exposed_pp_s", "exposed_dp_s", "exposed_ep_s", "peak_memory_gib",
      "capacity_gib", "usd_per_step", "usd_per_mtoken"};
  return cols;
}

std::string sweep_csv_header() { return csv_line(sweep_csv_columns()); }

std::string sweep_csv_line(const SweepRow& r) {
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const Layout& l = r.layout;
  auto i = [](int64_t v) { return std::to_string(v); };
  return csv_line({i(r.id), r.engine, i(r.cluster), r.cluster_label, r.gpu, i(r.nodes), i(r.gpus), i(l.dp), i(l.tp),
                   i(l.cp), i(l.pp), i(l.vp), i(l.ep), i(l.expert_tp()), to_string(l.schedule), i(l.zero_stage), i(r.micro_batch),
                   i(r.micro_batches), to_string(l.recompute), l.sequence_parallel ? "true" : "false", r.status,
                   r.reason, csv_number(r.step_time_s), csv_number(r.tokens_per_s),
                   csv_number(r.tokens_per_s_per_gpu), csv_number(r.mfu), csv_number(r.tflops_per_gpu),
                   csv_number(r.compute_s), csv_number(r.bubble_s), csv_number(r.host_bound_s), csv_number(r.optimizer_s),
                   csv_number(r.exposed_tp_s), csv_number(r.exposed_cp_s), csv_number(r.exposed_pp_s),
                   csv_number(r.exposed_dp_s), csv_number(r.exposed_ep_s), csv_number(r.peak_memory_bytes / gib),
                   csv_number(r.capacity_bytes / gib), csv_number(r.usd_per_step), csv_number(r.usd_per_mtoken)});
}

std::string csv_table(const std::vector<std::string>& columns, const std::vector<std::vector<std::string>>& rows) {
  std::string out = csv_line(columns);
  for (const auto& r : rows) out += csv_line(r);
  return out;
}

}  // namespace dtsim
