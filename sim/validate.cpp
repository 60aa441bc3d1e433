#include "sim/validate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "sim/engine.hpp"

namespace dtsim {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> yaml_files(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const auto& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      for (const auto& entry : fs::recursive_directory_iterator(p))
        if (entry.is_regular_file() && entry.path().extension() == ".yaml") out.push_back(entry.path().string());
    } else if (fs::is_regular_file(p, ec)) {
      out.push_back(p);
    } else {
      throw InputError(p + ": no such file or directory");
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

ValidationReport validate_experiments(const std::vector<std::string>& paths) {
  ValidationReport rep;
  for (const auto& file : yaml_files(paths)) {
    // Only experiment files that carry a published figure take part; sweep, compare and
    // plan files (and experiments without one) are skipped.
    bool published = false;
    try {
      const YAML::Node top = YAML::LoadFile(file);
      published = top.IsMap() && top["published"] && top["model"] && top["layout"];
    } catch (const YAML::Exception& ex) {
      throw InputError(file + ": not valid YAML: " + ex.what());
    }
    if (!published) {
      rep.skipped.push_back(file);
      continue;
    }
    const Experiment e = load_experiment(file);
    const Published& pub = e.published;
    if (!(pub.step_time_s > 0) && !(pub.tflops_per_gpu > 0) && !(pub.mfu > 0)) {
      rep.skipped.push_back(file);
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const StepResult r = simulate_step_isolated(e);
    ValidationRow row;
    row.file = file;
    row.title = e.title;
    row.source = pub.source;
    row.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (pub.step_time_s > 0) {
      row.metric = "step time (s)";
      row.published = pub.step_time_s;
      row.simulated = r.step_time_s;
    } else if (pub.tflops_per_gpu > 0) {
      row.metric = pub.tflops_includes_recompute ? "TFLOP/s/GPU (hardware)" : "TFLOP/s/GPU (model)";
      row.published = pub.tflops_per_gpu;
      row.simulated = pub.tflops_includes_recompute ? r.hardware_tflops_per_gpu : r.tflops_per_gpu;
    } else {  // only the MFU is published (model FLOPs / (step time x GPUs x peak))
      row.metric = "MFU (%)";
      row.published = 100 * pub.mfu;
      row.simulated = 100 * r.mfu;
    }
    row.error_pct = 100.0 * (row.simulated - row.published) / row.published;
    row.published_mfu = pub.mfu;
    row.simulated_mfu = r.mfu;
    rep.rows.push_back(row);
  }
  double sum = 0;
  for (const auto& row : rep.rows) {
    sum += std::fabs(row.error_pct);
    rep.worst_pct = std::max(rep.worst_pct, std::fabs(row.error_pct));
  }
  rep.mape_pct = rep.rows.empty() ? 0.0 : sum / static_cast<double>(rep.rows.size());
  return rep;
}

std::string format_validation(const ValidationReport& rep) {
  std::string o;
  auto out = std::back_inserter(o);
  fmt::format_to(out, "{:<52} {:<24} {:>10} {:>10} {:>8} {:>8} {:>8}\n", "experiment", "metric", "published",
                 "simulated", "error", "MFU pub", "MFU sim");
  for (const auto& r : rep.rows) {
    const std::string name = fs::path(r.file).stem().string();
    fmt::format_to(out, "{:<52} {:<24} {:>10.2f} {:>10.2f} {:>+7.1f}% {:>8} {:>7.1f}%\n", name, r.metric, r.published,
                   r.simulated, r.error_pct,
                   r.published_mfu > 0 ? fmt::format("{:.1f}%", 100 * r.published_mfu) : std::string("-"),
                   100 * r.simulated_mfu);
  }
  fmt::format_to(out, "\n{} experiments compared: MAPE {:.1f}%, worst {:.1f}%\n", rep.rows.size(), rep.mape_pct,
                 rep.worst_pct);
  if (!rep.skipped.empty()) fmt::format_to(out, "{} files without a published section skipped\n", rep.skipped.size());
  return o;
}

}  // namespace dtsim
