#include "models/compute_cost.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>

#include "models/calibration/plan_kernels.hpp"
#include "models/errors.hpp"
#include "models/precision.hpp"
#include "models/time_band.hpp"

namespace dtsim {

double gemm_wave_fill(const calib::GemmShape& g, int64_t sm_count) {
  if (sm_count <= 0 || g.m <= 0 || g.n <= 0 || g.k <= 0) return 1.0;
  const double useful = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  double best = 0;
  for (const auto& tile : kFullRateTiles)
    best = std::max(best, useful / calib::quantised_gemm_flops(g, tile[0], tile[1], sm_count));
  return best;
}

double compute_time(const Op& op, const GpuSpec& gpu, Dtype dtype, double attention_work, double gemm_fill) {
  const double launch = gpu.kernel_overhead * std::max<int32_t>(op.kernels, 0);
  const double mem_bw = gpu.hbm_bandwidth * gpu.memory_efficiency;
  const double mem_t = mem_bw > 0 ? op.bytes / mem_bw : 0.0;
  switch (op.kernel) {
    case KernelKind::gemm:
    case KernelKind::attention: {
      // Low precision applies to GEMM ops only (op_gemm_dtype); attention stays bf16
      // (Transformer Engine's FP8 recipe keeps dot-product attention in higher precision).
      const double eff = op.kernel == KernelKind::attention && gpu.attention_efficiency > 0 ? gpu.attention_efficiency
                                                                                           : gpu.gemm_efficiency;
      const double peak =
          (op.kernel == KernelKind::gemm ? gemm_peak_flops(gpu, dtype) : gpu.peak_bf16_flops) * eff;
      const double work = op.kernel == KernelKind::attention ? op.flops * attention_work
                                                             : op.flops / std::clamp(gemm_fill, 1e-6, 1.0);
      const double flop_t = peak > 0 ? work / peak : 0.0;
      return std::max(flop_t, mem_t) + launch;
    }
    case KernelKind::memory:
    case KernelKind::optimizer:
      return mem_t + launch;
  }
  return mem_t + launch;
}

const calib::ComputeProfile* experiment_profile(const Experiment& exp) {
  const std::string& name = exp.cluster.gpu.profile;
  if (name.empty())
    return exp.cluster.gpu.kernel_tables.empty() ? nullptr
                                                 : calib::ComputeProfile::shipped(exp.cluster.gpu.kernel_tables);
  namespace fs = std::filesystem;
  fs::path p(name);
  if (p.is_relative() && !exp.source.empty()) p = fs::path(exp.source).parent_path() / p;
  const std::string key = p.lexically_normal().string();
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<const calib::ComputeProfile>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second.get();
  try {
    auto prof = std::make_unique<const calib::ComputeProfile>(calib::ComputeProfile::load(key));
    return cache.emplace(key, std::move(prof)).first->second.get();
  } catch (const InputError& e) {
    std::vector<std::string> ps{(exp.source.empty() ? std::string("experiment") : exp.source) +
                                ": cluster.gpu.profile=" + name + " cannot be used:"};
    ps.insert(ps.end(), e.problems().begin(), e.problems().end());
    throw InputError(ps);
  }
}

Dtype op_gemm_dtype(const Op& op, const Experiment& exp) {
  if (op.kernel != KernelKind::gemm || !op.gemm_linear || op.layer < 0) return Dtype::bf16;
  return layer_low_precision(exp.training, exp.model.layers, op.layer) ? precision_recipe(exp.training.precision).gemm_dtype
                                                                       : Dtype::bf16;
}

namespace {
ComputeTime nominal_compute_time(const Op& op, const Experiment& exp, double attention_work);
}  // namespace

ComputeTime compute_time(const Op& op, const Experiment& exp, double attention_work) {
  ComputeTime t = nominal_compute_time(op, exp, attention_work);
  t.seconds *= time_band_factor(t.source, op.kernel, exp.time_scenario);
  return t;
}

namespace {
ComputeTime nominal_compute_time(const Op& op, const Experiment& exp, double attention_work) {
  const GpuSpec& gpu = exp.cluster.gpu;
  // The roofline's wave fill is that of the op's whole GEMM: a grouped GEMM schedules the
  // tiles of all its experts in one kernel's waves.
  const bool shaped = op.kernel == KernelKind::gemm && op.gemm.m > 0 && op.gemm.n > 0 && op.gemm.k > 0;
  const double fill = shaped ? gemm_wave_fill(op.gemm, gpu.sm_count) : 1.0;
  const ComputeTime roof{compute_time(op, gpu, op_gemm_dtype(op, exp), attention_work, fill),
                         calib::TimeSource::roofline};
  const calib::ComputeProfile* prof = experiment_profile(exp);
  if (!prof) return roof;
  const calib::KernelClass cls = op.kernel == KernelKind::gemm        ? calib::KernelClass::gemm
                                 : op.kernel == KernelKind::attention ? calib::KernelClass::attention
                                 : op.kernel == KernelKind::memory    ? calib::KernelClass::memory
                                                                      : calib::KernelClass::optimizer;
  if (!prof->has_data_for(cls)) return roof;  // e.g. memory ops against GEMM-only tables
  const auto k = calib::kernel_for_op(op, exp);
  if (!k) return roof;
  const auto t = prof->lookup(k->spec);
  if (!t) return roof;
  double seconds = t->seconds * k->count;
  const bool table = t->source == calib::TimeSource::table_exact ||
                     t->source == calib::TimeSource::table_interpolated ||
                     t->source == calib::TimeSource::table_extrapolated;
  if (table) {
    // Kernel tables were timed in short bursts at boost clocks (GpuSpec::sustained_ratio)
    // and inside a CUDA graph, without launches: the op pays each of its launches as every
    // roofline op does (gpu.kernel_overhead).
    seconds = seconds / std::clamp(gpu.sustained_ratio, 1e-6, 1.0) +
              gpu.kernel_overhead * std::max<int32_t>(op.kernels, 1);
  } else if (k->count == 1 && op.kernels > 1) {
    // A multi-launch op timed as one kernel (cross_entropy: 6) pays the other launches.
    seconds += gpu.kernel_overhead * (op.kernels - 1);
  }
  return {seconds, t->source};
}
}  // namespace

}  // namespace dtsim
