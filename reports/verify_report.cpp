#include "reports/verify_report.hpp"

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "reports/terminal_text.hpp"

namespace dtsim {

namespace {

std::string status(const verify::RuleResult& r) {
  if (!r.applicable) return "n/a";
  return r.passed ? "PASS" : "FAIL";
}

std::string err_text(double e) {
  if (std::isinf(e)) return "inf/NaN";
  return fmt::format("{:.1e}", e);
}

std::vector<std::string> failing(const verify::VerifyReport& r) {
  std::vector<std::string> out;
  for (const auto& x : r.rules)
    if (x.applicable && !x.passed) out.push_back(x.name);
  return out;
}

}  // namespace

std::string format_verify_report(const verify::VerifyReport& r) {
  const Experiment& s = r.shrunk;
  const Layout& l = s.layout;
  const ModelSpec& m = s.model;
  const Training& t = s.training;
  std::string out;
  out += fmt::format("dtsim verify: {}\n", printable(r.original.source.empty() ? r.original.title : r.original.source));
  out += fmt::format("  layout   TP {}  CP {}  PP {}  DP {}  ZeRO-{}  SP {}  recompute {}  {}  ({} ranks)\n", l.tp, l.cp,
                     l.pp, l.dp, l.zero_stage, l.sequence_parallel && l.tp > 1 ? "on" : "off", to_string(l.recompute),
                     t.flash_attention ? "flash attention" : "unfused attention", r.world);
  out += fmt::format("  model    {}: {} layers, hidden {}, {} heads ({} KV), head_dim {}, ffn {}, vocab {}, {}, {}, {}, {}\n",
                     m.name, m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim(), m.ffn_hidden, m.vocab,
                     to_string(m.activation), to_string(m.norm), to_string(m.position),
                     m.tied_embeddings ? "tied embeddings" : "untied embeddings");
  if (m.moe.enabled()) {
    std::string layers;
    for (int64_t i = 0; i < m.layers; ++i)
      if (m.moe.is_moe_layer(i)) layers += (layers.empty() ? "" : ",") + std::to_string(i);
    out += fmt::format("  moe      {} experts, top-{} ({} router), expert ffn {}, shared expert ffn {}, MoE layers {}; "
                       "EP {}  ETP {}  EDP {}\n",
                       m.moe.num_experts, m.moe.router_topk,
                       m.moe.router_score == RouterScore::sigmoid ? "sigmoid" : "softmax", m.moe.moe_ffn_hidden,
                       m.moe.shared_expert_ffn_hidden, layers, l.ep, l.expert_tp(), l.edp());
  }
  out += fmt::format("  batch    seq {}, micro-batch {} x {} micro-batches x DP {} = {} sequences; {} Adam step{} in "
                     "double precision\n",
                     t.seq_len, t.micro_batch, t.accumulation(l), l.dp, t.global_batch, r.steps, r.steps == 1 ? "" : "s");
  out += fmt::format("  injected bug: {}\n\n", verify::to_string(r.inject));
  out += fmt::format("  {:<5} {:<6} {:>9} {:>7} {:>9}  {}\n", "rule", "result", "max|err|", "tol", "values", "what");
  for (const auto& x : r.rules) {
    if (x.name == "plan") {
      out += fmt::format("  {:<5} {:<6} {:>9} {:>7} {:>9}  {}\n", x.name, status(x), "-", "-", "-", x.what);
      for (const auto& p : x.problems) out += fmt::format("        - {}\n", p);
      continue;
    }
    if (!x.applicable) {
      out += fmt::format("  {:<5} {:<6} {:>9} {:>7} {:>9}  {}\n", x.name, "n/a", "-", "-", "-", x.what);
      continue;
    }
    out += fmt::format("  {:<5} {:<6} {:>9} {:>7.0e} {:>9}  {}\n", x.name, status(x), err_text(x.max_abs_error),
                       x.tolerance, x.values, x.what);
    if (!x.passed && !x.worst.empty()) out += fmt::format("        worst: {}\n", x.worst);
  }
  if (!r.notes.empty()) {
    out += "\n  notes:\n";
    for (const auto& n : r.notes) out += fmt::format("    - {}\n", n);
  }
  const auto fails = failing(r);
  std::string list;
  for (const auto& f : fails) list += (list.empty() ? "" : ", ") + f;
  out += "\n";
  if (r.inject == verify::Injection::none)
    out += fails.empty() ? "verdict: PASS (every applicable rule holds)\n"
                         : fmt::format("verdict: FAIL (rules failing: {})\n", list);
  else
    out += fails.empty() ? fmt::format("verdict: PASS: the injected bug {} was NOT detected\n", verify::to_string(r.inject))
                         : fmt::format("verdict: FAIL: the injected bug {} was detected by {}\n",
                                       verify::to_string(r.inject), list);
  return out;
}

nlohmann::json verify_report_json(const verify::VerifyReport& r) {
  using nlohmann::json;
  const Experiment& s = r.shrunk;
  json j;
  j["experiment"] = r.original.source;
  j["passed"] = r.passed();
  j["inject"] = verify::to_string(r.inject);
  if (r.inject != verify::Injection::none) j["injection_detected"] = !r.passed();
  j["world"] = r.world;
  j["steps"] = r.steps;
  j["layout"] = {{"dp", s.layout.dp},
                 {"tp", s.layout.tp},
                 {"cp", s.layout.cp},
                 {"pp", s.layout.pp},
                 {"zero_stage", s.layout.zero_stage},
                 {"sequence_parallel", s.layout.sequence_parallel},
                 {"recompute", to_string(s.layout.recompute)},
                 {"flash_attention", s.training.flash_attention}};
  j["model"] = {{"layers", s.model.layers},
                {"hidden", s.model.hidden},
                {"heads", s.model.heads},
                {"kv_heads", s.model.kv_heads},
                {"head_dim", s.model.head_dim()},
                {"ffn_hidden", s.model.ffn_hidden},
                {"vocab", s.model.vocab},
                {"seq_len", s.training.seq_len},
                {"micro_batch", s.training.micro_batch},
                {"accumulation", s.training.accumulation(s.layout)},
                {"global_batch", s.training.global_batch}};
  json rules = json::array();
  for (const auto& x : r.rules) {
    json o;
    o["name"] = x.name;
    o["what"] = x.what;
    o["applicable"] = x.applicable;
    o["passed"] = x.passed;
    o["max_abs_error"] = std::isfinite(x.max_abs_error) ? json(x.max_abs_error) : json(nullptr);
    o["tolerance"] = x.tolerance;
    o["values"] = x.values;
    o["worst"] = x.worst;
    o["problems"] = x.problems;
    rules.push_back(std::move(o));
  }
  j["rules"] = std::move(rules);
  j["notes"] = r.notes;
  return j;
}

std::string verify_report_json_text(const verify::VerifyReport& r) { return verify_report_json(r).dump(2) + "\n"; }

}  // namespace dtsim
