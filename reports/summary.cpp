#include "reports/summary.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <iterator>

#include <fmt/format.h>

#include "models/precision.hpp"
#include "models/flops.hpp"
#include "models/rank_grid.hpp"
#include "reports/terminal_text.hpp"

namespace dtsim {

namespace {

constexpr const char* kCommKinds[] = {"TP", "CP", "PP", "DP", "EP"};
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

/// 1234567.8 -> "1,234,568".
std::string with_thousands(double v) {
  if (!std::isfinite(v)) return fmt::format("{}", v);
  std::string digits = fmt::format("{:.0f}", std::fabs(v));
  std::string out;
  int n = static_cast<int>(digits.size());
  for (int i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % 3 == 0) out += ',';
    out += digits[static_cast<size_t>(i)];
  }
  return (v < 0 && digits != "0" ? "-" : "") + out;
}

/// A count: "36,864"; a mean over stages that is not whole keeps two decimals, "0.25".
std::string count_text(double v) {
  if (!std::isfinite(v) || v == std::floor(v)) return with_thousands(v);
  const double whole = std::trunc(v);
  std::string frac = fmt::format("{:.2f}", std::fabs(v - whole));  // "0.25" (or "1.00" after rounding)
  if (frac[0] != '0') return with_thousands(v);
  return with_thousands(whole) + frac.substr(1);
}

std::string percent(double fraction) { return fmt::format("{:.1f} %", 100.0 * fraction); }

std::string gib(double bytes) { return fmt::format("{:.2f}", bytes / kGiB); }

std::string param_count_text(double n) {
  if (n >= 1e12) return fmt::format("{:.2f} T", n / 1e12);
  if (n >= 1e9) return fmt::format("{:.1f} B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.1f} M", n / 1e6);
  return with_thousands(n);
}

const CommStats& find_comm(const std::map<std::string, CommStats>& m, const std::string& k) {
  static const CommStats kNone{};
  auto it = m.find(k);
  return it == m.end() ? kNone : it->second;
}

}  // namespace

std::string format_duration(double s) {
  if (!std::isfinite(s)) return fmt::format("{} s", s);
  if (s == 0) return "0 s";
  // Largest unit whose rounded value is at least 1.
  const double a = std::fabs(s);
  if (std::round(a * 100.0) / 100.0 >= 1.0) return fmt::format("{:.2f} s", s);
  if (std::round(a * 1e4) / 1e4 >= 1e-3) return fmt::format("{:.1f} ms", s * 1e3);
  if (std::round(a * 1e7) / 1e7 >= 1e-6) return fmt::format("{:.1f} us", s * 1e6);
  return fmt::format("{:.1f} ns", s * 1e9);
}

std::string format_bytes(double b) {
  if (!std::isfinite(b)) return fmt::format("{} B", b);
  const double a = std::fabs(b);
  if (a >= kGiB * 0.9995) return fmt::format("{:.2f} GiB", b / kGiB);
  if (a >= 1024.0 * 1024.0 * 0.99995) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024.0));
  if (a >= 1024.0 * 0.99995) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{:.0f} B", b);
}

std::string format_summary(const Experiment& exp, const StepResult& r) {
  const ModelSpec& m = exp.model;
  const ClusterSpec& c = exp.cluster;
  const Layout& l = exp.layout;
  const Training& t = exp.training;
  const Published& pub = exp.published;
  std::string o;
  auto out = std::back_inserter(o);

  // --- header: the experiment -------------------------------------------------------
  const std::string& title = !exp.title.empty() ? exp.title : r.experiment;
  // User strings (title, names, file names) go through printable(): no raw control characters.
  fmt::format_to(out, "dtsim: {}\n", printable(title.empty() ? exp.source : title));
  if (!exp.source.empty() && !title.empty()) fmt::format_to(out, "  file      {}\n", printable(exp.source));
  fmt::format_to(out, "  model     {}: {} layers, hidden {}, {} heads", m.name.empty() ? "(unnamed)" : printable(m.name),
                 m.layers, m.hidden, m.heads);
  if (m.kv_heads > 0 && m.kv_heads != m.heads) fmt::format_to(out, " ({} KV)", m.kv_heads);
  if (m.layers > 0 && m.hidden > 0 && m.heads > 0) {
    try {
      fmt::format_to(out, ", {} parameters", param_count_text(static_cast<double>(total_parameters(m, t.seq_len))));
    } catch (const std::exception&) {
      // A model the FLOPs module cannot count: the header simply omits the size.
    }
  }
  o += '\n';
  fmt::format_to(out, "  cluster   {} GPUs ({}) on {} node{} x {}", c.gpus(), c.gpu.name.empty() ? "GPU" : printable(c.gpu.name),
                 c.nodes, c.nodes == 1 ? "" : "s", c.gpus_per_node);
  if (!c.name.empty()) fmt::format_to(out, ", {}", printable(c.name));
  o += '\n';
  fmt::format_to(out, "  layout    DP {} x TP {} x CP {} x PP {}, ZeRO-{}, sequence parallel {}, recompute {}\n",
                 l.dp, l.tp, l.cp, l.pp, l.zero_stage,
                 !l.sequence_parallel ? "off" : l.tp > 1 ? "on" : "off (tp=1: no TP group to split, as Megatron-LM)",
                 to_string(l.recompute));
  // Placement of the parallel groups on NVLink domains, reported where it matters: a group
  // that needs NVLink bandwidth (TP, CP, EP, ETP) spans domains, or the domain is rack-scale
  // (more GPUs than one 8-GPU NVSwitch board, e.g. an NVL72 rack), where which groups stay
  // inside a rack is the layout's question.
  if (c.gpus_per_node > 0 && l.tp > 0 && l.cp > 0 && l.dp > 0 && l.pp > 0) {
    const auto placement = group_placement(RankGrid(l), c.gpus_per_node);
    bool fast_group_spans = false;
    for (const auto& p : placement)
      if (p.domains > 1 && p.kind != GroupKind::DP && p.kind != GroupKind::PP) fast_group_spans = true;
    constexpr int64_t kBoardGpus = 8;  // GPUs on one HGX/DGX NVSwitch board (topologies/nodes/dgx-h100.yaml)
    if ((fast_group_spans || c.gpus_per_node > kBoardGpus) && !placement.empty())
      fmt::format_to(out, "  placement {}\n", describe_placement(placement));
  }
  const int64_t accumulation = (t.micro_batch > 0 && l.dp > 0) ? t.accumulation(l) : 0;
  fmt::format_to(out,
                 "  batch     micro-batch {}, global batch {} x {} tokens, {} accumulation step{}, {}\n",
                 t.micro_batch, t.global_batch, t.seq_len, accumulation, accumulation == 1 ? "" : "s",
                 precision_recipe(t.precision).name);
  fmt::format_to(out, "  engine    {}", r.engine.empty() ? "(unknown)" : r.engine);
  if (r.folded)
    fmt::format_to(out, ", folded ({} of {} ranks simulated)", r.simulated_ranks, r.gpus);
  else
    fmt::format_to(out, ", unfolded ({} ranks simulated)", r.simulated_ranks);
  o += '\n';
  if (!pub.source.empty()) fmt::format_to(out, "  published {}\n", printable(pub.source));
  o += '\n';

  // --- step figures -------------------------------------------------------------------
  auto line = [&](const char* name, const std::string& value) { fmt::format_to(out, "  {:<17}{}\n", name, value); };
  auto versus = [](double simulated, double published, const std::string& text) -> std::string {
    if (published <= 0) return "";
    return fmt::format("   (published {}, error {:+.1f} %)", text, 100.0 * (simulated - published) / published);
  };
  line("step time", format_duration(r.step_time_s) +
                        versus(r.step_time_s, pub.step_time_s, format_duration(pub.step_time_s)));
  // The kernel-time band (models/time_band.hpp).
  if (r.step_time_hi_s > 0)
    line("band", fmt::format("{} - {} ({:+.1f} % / {:+.1f} %: compute from the fast to the slow end of its kernel data)",
                             format_duration(r.step_time_lo_s), format_duration(r.step_time_hi_s),
                             100.0 * (r.step_time_lo_s / r.step_time_s - 1.0),
                             100.0 * (r.step_time_hi_s / r.step_time_s - 1.0)));
  line("tokens/s", fmt::format("{} ({} tokens per step)", with_thousands(r.tokens_per_s),
                               with_thousands(r.tokens_per_step)));
  // A published TFLOP/s figure is compared on its own basis: model FLOPs, or hardware
  // FLOPs that count the recomputed forward (Narayanan 2021 Eq. 3).
  line("TFLOP/s per GPU", fmt::format("{:.1f} model, {:.1f} hardware", r.tflops_per_gpu, r.hardware_tflops_per_gpu) +
                              versus(pub.tflops_includes_recompute ? r.hardware_tflops_per_gpu : r.tflops_per_gpu,
                                     pub.tflops_per_gpu,
                                     fmt::format("{:.1f} {}", pub.tflops_per_gpu,
                                                 pub.tflops_includes_recompute ? "hardware" : "model")));
  line("MFU", percent(r.mfu) + versus(r.mfu, pub.mfu, percent(pub.mfu)));
  line("HFU", percent(r.hfu));
  line("compute", format_duration(r.compute_s));
  line("bubble", format_duration(r.bubble_s));
  // GPU idle waiting for the host's launches (models/host_dispatch.hpp).
  line("host-bound", format_duration(r.host_bound_s) +
                         fmt::format("   ({} per eager launch, CUDA graphs {})",
                                     format_duration(exp.cluster.host_dispatch), to_string(exp.training.cuda_graphs)));
  line("optimizer", format_duration(r.optimizer_s));
  {  // where the compute times came from (StepResult::time_sources), most ops first
    std::vector<std::pair<int64_t, std::string>> src;
    for (const auto& [k, v] : r.time_sources) src.emplace_back(-v, k);
    std::sort(src.begin(), src.end());
    std::string text;
    for (const auto& [neg, k] : src)
      text += (text.empty() ? "" : ", ") + with_thousands(static_cast<double>(-neg)) + " " + k;
    const GpuSpec& g = exp.cluster.gpu;
    const std::string from = !g.profile.empty()        ? "profile " + printable(g.profile)
                             : !g.kernel_tables.empty() ? "GEMM tables " + g.kernel_tables
                                                        : "roofline only";
    if (!text.empty()) line("kernel times", text + " compute ops (" + from + ")");
  }
  o += '\n';

  // --- communication per kind ---------------------------------------------------------
  fmt::format_to(out, "  {:<15}{:>12}{:>12}{:>12}{:>14}{:>10}\n", "communication", "total", "exposed", "hidden",
                 "bytes/rank", "ops");
  auto comm_row = [&](const std::string& kind, const CommStats& s) {
    fmt::format_to(out, "  {:<15}{:>12}{:>12}{:>12}{:>14}{:>10}\n", kind, format_duration(s.total_s),
                   format_duration(s.exposed_s), format_duration(std::max(0.0, s.total_s - s.exposed_s)),
                   format_bytes(s.bytes), count_text(s.operations));
  };
  for (const char* k : kCommKinds) comm_row(k, find_comm(r.comm, k));
  for (const auto& [k, s] : r.comm)
    if (std::find(std::begin(kCommKinds), std::end(kCommKinds), k) == std::end(kCommKinds)) comm_row(k, s);
  o += '\n';

  // --- pipeline stages ----------------------------------------------------------------
  fmt::format_to(out, "  {:>5}{:>7}{:>11}{:>11}   memory GiB:{:>8}{:>8}{:>8}{:>8}{:>8}{:>8} /{:>7}\n", "stage",
                 "layers", "compute", "bubble", "params", "grads", "optim", "activ", "other", "peak", "cap");
  for (const auto& s : r.stages) {
    const MemoryBreakdown& mem = s.memory;
    fmt::format_to(out, "  {:>5}{:>7}{:>11}{:>11}{:>14}{:>8}{:>8}{:>8}{:>8}{:>8} /{:>7}  {}\n", s.stage, s.layers,
                   format_duration(s.compute_s), format_duration(s.bubble_s), gib(mem.params_bytes),
                   gib(mem.grads_bytes), gib(mem.optimizer_bytes), gib(mem.activations_bytes),
                   gib(mem.other_bytes), gib(mem.peak_bytes), gib(mem.capacity_bytes), mem.fits ? "fits" : "OOM");
  }
  // --- critical path per stage: where each stage's step time went --------------------
  o += '\n';
  fmt::format_to(out,
                 "  critical path per stage (compute + slowdown + exposed TP/CP/PP/DP/EP + host-bound + bubble = step "
                 "time)\n");
  fmt::format_to(out, "  {:>5}{:>11}{:>11}{:>11}{:>11}{:>11}{:>11}{:>11}{:>11}{:>11}\n", "stage", "compute", "slowdown",
                 "TP", "CP", "PP", "DP", "EP", "host", "bubble");
  for (const auto& s : r.stages) {
    auto exposed = [&](const char* k) {
      auto it = s.comm.find(k);
      return format_duration(it == s.comm.end() ? 0.0 : it->second.exposed_s);
    };
    fmt::format_to(out, "  {:>5}{:>11}{:>11}{:>11}{:>11}{:>11}{:>11}{:>11}{:>11}{:>11}\n", s.stage,
                   format_duration(s.compute_s), format_duration(s.slowdown_s), exposed("TP"), exposed("CP"),
                   exposed("PP"), exposed("DP"), exposed("EP"), format_duration(s.host_bound_s),
                   format_duration(s.bubble_s));
  }
  const auto oom = std::count_if(r.stages.begin(), r.stages.end(), [](const StageResult& s) { return !s.memory.fits; });
  if (oom > 0)
    fmt::format_to(out, "\n  warning: {} of {} pipeline stage{} exceed GPU memory (OOM)\n", oom, r.stages.size(),
                   r.stages.size() == 1 ? "" : "s");
  return o;
}

}  // namespace dtsim
