// dtsim calibrate EXP.yaml --out FILE.yaml [--device N] [--grid] [--list] [--set key=value]...
//                  [--check-layer PROFILE.yaml]
//
// Derives every distinct compute kernel of the experiment's step plan
// (models/calibration/plan_kernels.hpp), times each on the local GPU
// (models/calibration/measure.hpp), fits the models and writes the profile
// (models/calibration/profile.hpp) atomically. --list prints the kernels and stops (works
// on any build). --check-layer predicts one transformer layer's forward + backward from
// PROFILE and times the same kernels back to back on the GPU, printing both and the error.
//
// Exit codes (besides main.cpp's): 4 = the CUDA calibrator plugin cannot be loaded: the build
// has none, or the CUDA libraries it needs are missing (after listing the kernels it would
// measure); 5 = the plugin loaded but no device was found.
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "models/precision.hpp"
#include "models/calibration/measure.hpp"
#include "models/calibration/plan_kernels.hpp"
#include "models/calibration/profile.hpp"
#include "models/compute_cost.hpp"
#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/plan.hpp"
#include "reports/atomic_file.hpp"
#include "sim/cli/commands.hpp"

namespace dtsim::cli {
namespace {

constexpr int kExitNoCuda = 4;
constexpr int kExitNoDevice = 5;

struct CalibrateOptions {
  std::string experiment;
  std::vector<std::string> sets;
  std::string out;
  int device = 0;
  bool grid = false;
  bool list = false;
  std::string check_profile;
  int repetitions = 20;
};

std::string describe(const calib::KernelSpec& k) {
  if (k.kind == calib::KernelClass::memory || k.kind == calib::KernelClass::optimizer) return k.key();
  return fmt::format("{}  ({:.3g} GFLOP, op {})", k.key(), k.flops() / 1e9, k.name);
}

/// The compute ops of one transformer layer (first layer of stage 0, micro-batch 0):
/// forward, recompute and backward, in plan order.
std::vector<const Op*> one_layer(const StepPlan& plan) {
  std::vector<const Op*> ops;
  const StagePlan& st = plan.stages.front();
  int layer = -1, mb = -1;
  for (const auto& op : st.ops)
    if (op.type == OpType::compute && op.layer >= 0) {
      layer = op.layer, mb = op.micro_batch;
      break;
    }
  for (const auto& op : st.ops)
    if (op.type == OpType::compute && op.layer == layer && op.micro_batch == mb) ops.push_back(&op);
  return ops;
}

int no_calibrator(const calib::NoCalibrator& e) {
  std::cout.flush();
  std::cerr << "error: " << e.what() << '\n';
  return kExitNoCuda;
}

int check_layer(const CalibrateOptions& o, Experiment exp) {
  require_input_file(o.check_profile);
  // The profile path is given on the command line: make it absolute so that it is not
  // resolved against the experiment's directory.
  exp.cluster.gpu.profile = std::filesystem::absolute(o.check_profile).string();
  const StepPlan plan = build_step_plan(exp);
  const auto ops = one_layer(plan);
  double predicted = 0, roofline = 0;
  std::vector<calib::OpKernel> kernels;
  int by_source[4] = {0, 0, 0, 0};
  for (const Op* op : ops) {
    const ComputeTime t = compute_time(*op, exp);
    predicted += t.seconds;
    roofline += compute_time(*op, exp.cluster.gpu, op_gemm_dtype(*op, exp));
    ++by_source[static_cast<int>(t.source)];
    if (auto k = calib::kernel_for_op(*op, exp)) kernels.push_back(*k);
  }
  std::cout << fmt::format("layer check: {} compute ops of one layer (fwd + recompute + bwd) of {}\n", ops.size(),
                           o.experiment);
  std::cout << fmt::format("  op time sources: exact {}, interpolated {}, fitted {}, roofline {}\n", by_source[1],
                           by_source[2], by_source[3], by_source[0]);
  std::cout << fmt::format("  predicted from profile: {:.4f} ms   (roofline: {:.4f} ms)\n", predicted * 1e3,
                           roofline * 1e3);
  const double measured =
      calib::measure_sequence(kernels, calib::MeasureOptions{.device = o.device, .repetitions = o.repetitions}, std::cerr);
  std::cout << fmt::format("  measured back to back:  {:.4f} ms\n", measured * 1e3);
  std::cout << fmt::format("  error (predicted / measured - 1): {:+.2f}%   roofline error: {:+.2f}%\n",
                           (predicted / measured - 1) * 100, (roofline / measured - 1) * 100);
  return kExitOk;
}

std::string utc_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

int calibrate_command(const CalibrateOptions& o) {
  require_input_file(o.experiment);
  const Experiment exp = load_experiment(o.experiment, o.sets);
  if (!o.out.empty()) require_output_file(o.out, "--out", false);
  if (!o.check_profile.empty()) return check_layer(o, exp);
  if (o.out.empty() && !o.list) throw InputError("dtsim calibrate: --out FILE.yaml is required (or give --list)");
  std::vector<calib::KernelSpec> kernels = calib::derive_kernels(exp);
  if (o.grid) {
    const auto extra = calib::grid_kernels(kernels);
    kernels.insert(kernels.end(), extra.begin(), extra.end());
  }
  std::cout << fmt::format("{} distinct compute kernels{} of {}:\n", kernels.size(), o.grid ? " (with --grid)" : "",
                           o.experiment);
  for (const auto& k : kernels) std::cout << "  " << describe(k) << '\n';
  std::cout.flush();
  if (o.list) return kExitOk;
  calib::ComputeProfile prof = calib::measure_kernels(
      kernels, calib::MeasureOptions{.device = o.device, .repetitions = o.repetitions}, std::cerr);
  prof.date = utc_now();
  prof.note = "measured by dtsim calibrate for " + o.experiment;
  prof.fit_models();
  write_output_file(o.out, prof.to_yaml(), "--out", false);
  std::cout << fmt::format("profile of {} ({} kernels) written to {}\n", prof.device.name, prof.measurements.size(),
                           o.out);
  return kExitOk;
}

}  // namespace

Command add_calibrate_command(CLI::App& app) {
  auto opts = std::make_shared<CalibrateOptions>();
  CalibrateOptions& o = *opts;
  CLI::App* c = app.add_subcommand(
      "calibrate", "Time the experiment's compute kernels on the local GPU and write a compute profile");
  c->add_option("experiment", o.experiment, "Experiment YAML file")->required()->type_name("EXP.yaml");
  c->add_option("--out", o.out, "Profile YAML to write (atomically); use it with cluster.gpu.profile")
      ->type_name("FILE.yaml")->check(output_path_check());
  c->add_option("--device", o.device, "CUDA device ordinal (default 0)")->type_name("N")->check(CLI::NonNegativeNumber);
  c->add_flag("--grid", o.grid, "Also measure a grid of nearby shapes, to fit the models for unmeasured shapes");
  c->add_flag("--list", o.list, "Print the kernels that would be measured and stop (needs no GPU)");
  c->add_option("--repetitions", o.repetitions, "Timed runs per kernel; the median is kept (default 20)")
      ->type_name("N")
      ->check(CLI::Range(1, 100000));
  c->add_option("--check-layer", o.check_profile,
                "Predict one layer's fwd+bwd from PROFILE, time its kernels back to back, print the error")
      ->type_name("PROFILE.yaml");
  add_set_option(c, o.sets);
  return {c, [opts]() -> int {
            try {
              return calibrate_command(*opts);
            } catch (const calib::NoCalibrator& e) {
              return no_calibrator(e);
            } catch (const calib::NoCudaDevice& e) {
              std::cout.flush();
              std::cerr << "error: no CUDA device found: " << e.what() << '\n';
              return kExitNoDevice;
            }
          }};
}

}  // namespace dtsim::cli
