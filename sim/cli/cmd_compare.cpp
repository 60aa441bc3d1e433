// dtsim compare COMPARE.yaml [--out DIR] [--jobs N] [--quiet]
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "models/errors.hpp"
#include "models/sweep_spec.hpp"
#include "reports/atomic_file.hpp"
#include "reports/csv.hpp"
#include "reports/html.hpp"
#include "reports/json.hpp"
#include "reports/markdown.hpp"
#include "sim/cli/commands.hpp"
#include "sim/sweep/journal.hpp"
#include "sim/sweep/studies.hpp"

namespace dtsim::cli {

namespace {

struct CompareOptions {
  std::string spec, out;
  int jobs = 2;
  bool quiet = false;
};

/// Columns padded to their widest cell (terminal table).
std::string text_table(const ReportTable& t) {
  std::vector<size_t> w(t.columns.size(), 0);
  for (size_t i = 0; i < t.columns.size(); ++i) w[i] = t.columns[i].size();
  for (const auto& r : t.rows)
    for (size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s = " ";
    for (size_t i = 0; i < w.size(); ++i) s += " " + fmt::format("{:<{}}", i < cells.size() ? cells[i] : "", w[i]);
    return s + "\n";
  };
  std::string s = line(t.columns);
  for (const auto& r : t.rows) s += line(r);
  return s;
}

int compare_command(const CompareOptions& o) {
  require_input_file(o.spec);
  const SweepSpec spec = load_sweep_spec(o.spec, SpecKind::compare);
  if (!o.out.empty())  // created with its parents
    prepare_output_dir(o.out, "--out", {"compare.csv", "compare.json", "report.html", "report.md"});
  const auto entries = sweep::run_compare(spec, o.jobs, !o.quiet);
  const ReportTable table = sweep::compare_table(entries);
  if (!o.out.empty()) {
    const ReportData rep = sweep::compare_report(spec, entries);
    write_file_atomic(o.out + "/compare.csv", csv_table(table.columns, table.rows));
    nlohmann::json j;
    j["title"] = spec.title;
    j["spec"] = spec.source;
    j["clusters"] = nlohmann::json::array();
    for (const auto& e : entries) {
      nlohmann::json c;
      c["label"] = e.label;
      c["ok"] = e.ok;
      c["reason"] = e.reason;
      if (e.ok) {
        c["analytic"] = sweep::to_json(e.analytic);
        c["chosen"] = sweep::to_json(e.chosen);
        c["result"] = to_json(e.result);
      }
      j["clusters"].push_back(c);
    }
    write_file_atomic(o.out + "/compare.json", j.dump(1) + "\n");
    write_file_atomic(o.out + "/report.html", render_html(rep));
    write_file_atomic(o.out + "/report.md", render_markdown(rep));
  }
  if (!o.quiet) {
    std::cout << "dtsim compare: " << spec.title << "\n" << text_table(table);
    if (!o.out.empty())
      std::cout << fmt::format("  written: {0}/compare.csv {0}/compare.json {0}/report.html {0}/report.md\n", o.out);
  }
  return kExitOk;
}

}  // namespace

Command add_compare_command(CLI::App& app) {
  auto opts = std::make_shared<CompareOptions>();
  CompareOptions& o = *opts;
  CLI::App* c = app.add_subcommand("compare", "One model on several clusters side by side (fixed or best layout)");
  c->add_option("spec", o.spec, "Compare YAML file (model, training, clusters, layout or space)")
      ->required()
      ->type_name("COMPARE.yaml");
  c->add_option("-o,--out", o.out, "Also write compare.csv, compare.json, report.html, report.md here")
      ->type_name("DIR")
      ->check(output_path_check());
  c->add_option("-j,--jobs", o.jobs, "SimGrid simulations run at once (child processes)")->check(CLI::Range(1, 256));
  c->add_flag("-q,--quiet", o.quiet, "No progress and no table");
  return {c, [opts] { return compare_command(*opts); }};
}

}  // namespace dtsim::cli
