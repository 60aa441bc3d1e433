// dtsim plan PLAN.yaml [--out DIR] [--jobs N] [--quiet]
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "models/errors.hpp"
#include "models/plan_spec.hpp"
#include "reports/atomic_file.hpp"
#include "reports/csv.hpp"
#include "reports/html.hpp"
#include "reports/markdown.hpp"
#include "sim/cli/commands.hpp"
#include "sim/sweep/journal.hpp"
#include "sim/sweep/report_data.hpp"
#include "sim/sweep/studies.hpp"

namespace dtsim::cli {

namespace {

struct PlanOptions {
  std::string spec, out;
  int jobs = 2;
  bool quiet = false;
};

int plan_command(const PlanOptions& o) {
  require_input_file(o.spec);
  const PlanSpec spec = load_plan_spec(o.spec);
  if (!o.out.empty())  // created with its parents
    prepare_output_dir(o.out, "--out", {"plan.csv", "plan.json", "report.html", "report.md"});
  const sweep::PlanOutcome out = sweep::run_plan(spec, o.jobs, !o.quiet);
  const ReportTable table = sweep::plan_table(spec, out);
  if (!o.out.empty()) {
    const ReportData rep = sweep::plan_report(spec, out);
    write_file_atomic(o.out + "/plan.csv", csv_table(table.columns, table.rows));
    nlohmann::json j;
    j["title"] = spec.title;
    j["spec"] = spec.source;
    j["tokens"] = spec.tokens;
    j["deadline_days"] = spec.deadline_s / 86400.0;
    j["gpu_budget"] = spec.gpu_budget;
    j["chosen"] = out.chosen;
    j["chosen_meets_constraint"] = out.chosen_feasible;
    j["options"] = nlohmann::json::array();
    for (const auto& x : out.options) {
      nlohmann::json c;
      c["candidate"] = spec.candidates[static_cast<size_t>(x.candidate)].name;
      c["ok"] = x.entry.ok;
      c["reason"] = x.entry.reason;
      c["days"] = x.days;
      c["gpu_hours"] = x.gpu_hours;
      c["usd"] = x.usd;
      c["feasible"] = x.feasible;
      if (x.entry.ok) c["row"] = sweep::to_json(x.entry.chosen);
      if (x.entry.ok) c["megatron_args"] = sweep::megatron_layout_args(spec.sweep, x.entry.chosen);
      j["options"].push_back(c);
    }
    j["sensitivity"] = nlohmann::json::array();
    for (const auto& s : out.sensitivity) {  // without a layout the figures are null, not 0
      const auto fig = [&](double v) { return s.ok ? nlohmann::json(v) : nlohmann::json(nullptr); };
      j["sensitivity"].push_back({{"change", s.what}, {"gpus", s.gpus}, {"layout", s.layout},
                                  {"step_time_s", fig(s.step_time_s)}, {"days", fig(s.days)}, {"usd", fig(s.usd)},
                                  {"mfu", fig(s.mfu)}});
    }
    write_file_atomic(o.out + "/plan.json", j.dump(1) + "\n");
    write_file_atomic(o.out + "/report.html", render_html(rep));
    write_file_atomic(o.out + "/report.md", render_markdown(rep));
  }
  if (!o.quiet) {
    std::cout << "dtsim plan: " << spec.title << "\n";
    if (out.chosen >= 0) {
      const auto& x = out.options[static_cast<size_t>(out.chosen)];
      const auto& r = x.entry.chosen;
      std::cout << fmt::format("  {}: {} x {} GPUs, {}\n  {:.1f} days, {:.0f} GPU-hours, {:.0f} USD, MFU {:.1f} %\n",
                               out.chosen_feasible ? "answer" : "no option meets the constraint; closest",
                               spec.candidates[static_cast<size_t>(x.candidate)].name, r.gpus,
                               sweep::layout_label(r.layout, r.micro_batch), x.days, x.gpu_hours, x.usd, r.mfu * 100);
      std::cout << "  megatron_args: " << sweep::megatron_layout_args(spec.sweep, r) << "\n";
    } else {
      std::cout << "  no candidate has a valid layout\n";
    }
    for (const auto& s : out.sensitivity)
      if (s.ok)
        std::cout << fmt::format("  sensitivity  {:<32} {:>6} GPUs  {:>7.1f} days  {:>12.0f} USD\n", s.what, s.gpus, s.days,
                                 s.usd);
      else
        std::cout << fmt::format("  sensitivity  {:<32} {:>6} GPUs  {}\n", s.what, s.gpus, s.layout);
    if (!o.out.empty())
      std::cout << fmt::format("  written: {0}/plan.csv {0}/plan.json {0}/report.html {0}/report.md\n", o.out);
  }
  return kExitOk;
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  auto opts = std::make_shared<PlanOptions>();
  PlanOptions& o = *opts;
  CLI::App* c = app.add_subcommand("plan", "Capacity planning: GPUs, layout, days and cost for a token budget");
  c->add_option("spec", o.spec, "Plan YAML file (model, training, tokens, deadline or gpu_budget, candidates)")
      ->required()
      ->type_name("PLAN.yaml");
  c->add_option("-o,--out", o.out, "Also write plan.csv, plan.json, report.html, report.md here")
      ->type_name("DIR")
      ->check(output_path_check());
  c->add_option("-j,--jobs", o.jobs, "SimGrid simulations run at once (child processes)")->check(CLI::Range(1, 256));
  c->add_flag("-q,--quiet", o.quiet, "No progress and no summary");
  return {c, [opts] { return plan_command(*opts); }};
}

}  // namespace dtsim::cli
