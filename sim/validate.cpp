#include "sim/validate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/memory.hpp"
#include "models/path_problem.hpp"
#include "models/yaml_text.hpp"
#include "reports/terminal_text.hpp"
#include "sim/engine.hpp"

namespace dtsim {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> yaml_files(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const auto& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      // Directory symlinks are not followed (no cycles); a .yaml entry that cannot be read
      // (a symlink loop, a dangling link) is an error naming it, not a skipped file.
      fs::recursive_directory_iterator it(p, ec), end;
      for (; !ec && it != end; it.increment(ec)) {
        if (it->path().extension() != ".yaml") continue;
        std::error_code fec;
        if (it->is_directory(fec)) continue;
        if (auto why = input_path_problem(it->path().string()))
          throw InputError(it->path().string() + ": cannot read experiment file: " + *why);
        out.push_back(it->path().string());
      }
      if (ec) throw InputError(p + ": cannot list the directory: " + ec.message());
    } else if (auto why = input_path_problem(p); !why) {
      out.push_back(p);
    } else {
      throw InputError(p + ": " + (*why == "no such file" ? std::string("no such file or directory") : *why));
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
      std::ifstream in(file, std::ios::binary);
      std::ostringstream text;
      text << in.rdbuf();
      const YAML::Node top = load_yaml_document(text.str(), file);  // InputError: one document, clear messages
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
    bool memory = false;
    for (MemoryQuantity mq : kMemoryQuantities) {
      const Published::MemoryPoint& point = pub.memory[static_cast<size_t>(mq)];
      if (!(point.bytes > 0)) continue;
      if (point.stage >= e.layout.pp)
        throw InputError(file + ": published.memory." + to_string(mq) + ".stage=" + std::to_string(point.stage) +
                         " is not a pipeline stage (layout.pp=" + std::to_string(e.layout.pp) + ": 0.." +
                         std::to_string(e.layout.pp - 1) + ")");
      const double ours = memory_quantity(stage_memory(e, point.stage), mq);
      constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
      ValidationRow row;
      row.file = file;
      row.title = e.title;
      row.source = pub.memory_source;
      row.metric = mq == MemoryQuantity::model_states  ? "model states (GiB)"
                   : mq == MemoryQuantity::activations ? "activations (GiB)"
                                                       : "peak memory (GiB)";
      row.stage = point.stage;
      row.published = point.bytes / GiB;
      row.simulated = ours / GiB;
      row.error_pct = 100.0 * (ours - point.bytes) / point.bytes;
      rep.memory_rows.push_back(row);
      memory = true;
    }
    if (!(pub.step_time_s > 0) && !(pub.tflops_per_gpu > 0) && !(pub.mfu > 0)) {
      if (!memory) rep.skipped.push_back(file);
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
  double msum = 0;
  for (const auto& row : rep.memory_rows) {
    msum += std::fabs(row.error_pct);
    rep.memory_worst_pct = std::max(rep.memory_worst_pct, std::fabs(row.error_pct));
  }
  rep.memory_mape_pct = rep.memory_rows.empty() ? 0.0 : msum / static_cast<double>(rep.memory_rows.size());
  return rep;
}

std::string format_validation(const ValidationReport& rep) {
  std::string o;
  auto out = std::back_inserter(o);
  fmt::format_to(out, "{:<52} {:<24} {:>10} {:>10} {:>8} {:>8} {:>8}\n", "experiment", "metric", "published",
                 "simulated", "error", "MFU pub", "MFU sim");
  for (const auto& r : rep.rows) {
    const std::string name = printable(fs::path(r.file).stem().string());
    fmt::format_to(out, "{:<52} {:<24} {:>10.2f} {:>10.2f} {:>+7.1f}% {:>8} {:>7.1f}%\n", name, r.metric, r.published,
                   r.simulated, r.error_pct,
                   r.published_mfu > 0 ? fmt::format("{:.1f}%", 100 * r.published_mfu) : std::string("-"),
                   100 * r.simulated_mfu);
  }
  fmt::format_to(out, "\n{} experiments compared: MAPE {:.1f}%, worst {:.1f}%\n", rep.rows.size(), rep.mape_pct,
                 rep.worst_pct);
  if (!rep.memory_rows.empty()) {
    fmt::format_to(out, "\n{:<52} {:<24} {:>10} {:>10} {:>8}  {}\n", "memory per GPU", "metric", "published",
                   "simulated", "error", "stage");
    for (const auto& r : rep.memory_rows) {
      const std::string name = printable(fs::path(r.file).stem().string());
      fmt::format_to(out, "{:<52} {:<24} {:>10.2f} {:>10.2f} {:>+7.1f}%  {}\n", name, r.metric, r.published,
                     r.simulated, r.error_pct, r.stage);
    }
    fmt::format_to(out, "\n{} memory points compared: MAPE {:.1f}%, worst {:.1f}%\n", rep.memory_rows.size(),
                   rep.memory_mape_pct, rep.memory_worst_pct);
  }
  if (!rep.skipped.empty()) fmt::format_to(out, "{} files without a published section skipped\n", rep.skipped.size());
  return o;
}

}  // namespace dtsim
