#pragma once
// Compute profile: measured kernel times of one GPU and the models fitted to them, read
// from / written to a YAML file (written by `dtsim calibrate`, read through
// `cluster.gpu.profile: FILE` in an experiment).
//
// File format (every key required unless marked optional; unknown keys are errors naming
// the file and the key; units are part of the key names and repeated in `units:`):
//
//   format: dtsim-compute-profile-1
//   synthetic: false            # optional; true marks made-up test data, never a measurement
//   note: "..."                 # optional free text
//   date: 2026-11-30T14:00:00Z  # when it was measured (ISO 8601)
//   units: {time: s, bytes: B, flops: FLOP, flop_rate: FLOP/s, bandwidth: B/s, clock: MHz}
//   device: {name, compute_capability, sm_count, sm_clock_MHz, memory_clock_MHz,
//            driver, cuda_runtime, cublaslt, attention_impl}
//   kernels:                    # measurements; each list optional
//     gemm:      [{m, n, k, dtype: bf16|fp8, trans_a, trans_b, time_s}]
//     attention: [{pass: fwd|bwd, batch, heads, kv_heads, seq_q, seq_kv, head_dim, causal, time_s}]
//     memory:    [{name, bytes, time_s}]
//     optimizer: [{params, time_s}]
//   models:                     # optional; fitted from `kernels` at load time when absent
//     gemm:      [{dtype, tile_m, tile_n, sm_count, flop_rate_FLOP_per_s, overhead_s}]
//     attention: [{pass, flop_rate_FLOP_per_s, overhead_s}]
//     memory:    [{name ("*" = all memory kernels), bandwidth_B_per_s, overhead_s}]
//     optimizer: {params_per_s, overhead_s}
//
// Lookup order for a kernel (ComputeProfile::lookup): exact shape -> interpolation
// between measured neighbours (memory kernels of the same name by bytes, the optimizer by
// parameter count, attention of the same heads/head_dim/mask/pass by executed FLOPs; GEMMs:
// the profile's kernel tables of the GEMM's dtype, models/calibration/gemm_table.hpp) ->
// fitted model -> nothing (the caller falls back to the roofline, models/compute_cost.hpp).
// The profiles dtsim ships for its GPU presets (ComputeProfile::shipped) hold kernel tables
// only; a profile file written by `dtsim calibrate` holds measurements and models.
//
// GEMM model, with tile and wave quantisation (NVIDIA, "Matrix Multiplication Background
// User's Guide", Deep Learning Performance documentation, sections "Tile Quantization" and
// "Wave Quantization"): cuBLAS splits C into tile_m x tile_n tiles, one thread block each,
// and runs them in waves of sm_count blocks (one resident block per SM assumed); a partial
// tile or a partial last wave costs as much as a full one. So
//     tiles  = ceil(m / tile_m) * ceil(n / tile_n),   waves = ceil(tiles / sm_count)
//     t      = 2 * waves * sm_count * tile_m * tile_n * k / flop_rate + overhead_s
// where flop_rate is the rate achieved on full tiles and full waves. flop_rate and
// overhead_s are fitted by least squares; the tile shape is the candidate (of the tile
// shapes cuBLAS uses for large GEMMs on Ampere/Hopper: 64x64 ... 256x128) that fits best.
// Memory-bound kernels: t = bytes / bandwidth + overhead_s (achieved bandwidth, least
// squares). Attention: t = executed FLOPs / flop_rate + overhead_s. Optimizer:
// t = params / params_per_s + overhead_s.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "models/calibration/kernel_spec.hpp"

namespace dtsim::calib {

class GemmTable;  // models/calibration/gemm_table.hpp

/// Where an op's time came from (report it per op): the roofline; a measured profile's
/// exact point, interpolation or fitted model; a kernel table's exact point, interpolation
/// inside its grid, or extrapolation outside it (models/calibration/gemm_table.hpp).
enum class TimeSource {
  roofline,
  profile_exact,
  profile_interpolated,
  profile_fitted,
  table_exact,
  table_interpolated,
  table_extrapolated
};
inline constexpr int kTimeSources = 7;
const char* to_string(TimeSource);

struct DeviceIdentity {
  std::string name;                 // e.g. "NVIDIA H100 80GB HBM3"
  std::string compute_capability;   // "9.0"
  int64_t sm_count = 0;
  double sm_clock_mhz = 0;          // max SM clock, MHz
  double memory_clock_mhz = 0;      // max memory clock, MHz
  std::string driver;               // "550.54.15"
  std::string cuda_runtime;         // "12.4"
  std::string cublaslt;             // cuBLASLt version
  std::string attention_impl;       // which attention kernel was timed
};

struct Measurement {
  KernelSpec spec;
  double time_s = 0;  // median over repetitions, seconds
};

struct GemmModel {
  Dtype dtype = Dtype::bf16;
  int64_t tile_m = 128, tile_n = 128, sm_count = 0;
  double flop_rate = 0;   // FLOP/s on full tiles and waves
  double overhead_s = 0;  // s
  /// Predicted seconds for an m x n x k GEMM (formula in the header comment).
  double predict(const GemmShape& g) const;
};
struct AttentionModel {
  bool backward = false;
  double flop_rate = 0;   // FLOP/s on executed FLOPs
  double overhead_s = 0;
};
struct BandwidthModel {
  std::string name;       // memory kernel name, "*" for all
  double bandwidth = 0;   // B/s achieved
  double overhead_s = 0;
};
struct OptimizerModel {
  double params_per_s = 0;
  double overhead_s = 0;
  bool valid() const { return params_per_s > 0; }
};

/// y = slope * x + intercept, by ordinary least squares.
struct LineFit {
  double slope = 0, intercept = 0;
  double rms_residual = 0;  // root mean square of the residuals, units of y
};
/// Least-squares line through (x, y). One point (or all x equal): a line through the
/// origin and the mean point. A negative intercept is clamped to 0 and the slope refitted
/// through the origin (a kernel cannot take negative fixed time). Throws
/// std::invalid_argument when xs is empty or the sizes differ.
LineFit fit_line(const std::vector<double>& xs, const std::vector<double>& ys);

/// Wave-quantised FLOPs of a GEMM: 2 * waves * sm_count * tile_m * tile_n * k.
double quantised_gemm_flops(const GemmShape& g, int64_t tile_m, int64_t tile_n, int64_t sm_count);

struct ProfileTime {
  double seconds = 0;
  TimeSource source = TimeSource::roofline;
};

class ComputeProfile {
 public:
  std::string file;        // where it was read from ("" when built in memory)
  std::string format = "dtsim-compute-profile-1";
  bool synthetic = false;
  std::string note;
  std::string date;
  DeviceIdentity device;
  std::vector<Measurement> measurements;
  std::vector<GemmModel> gemm_models;
  std::vector<AttentionModel> attention_models;
  std::vector<BandwidthModel> memory_models;
  OptimizerModel optimizer_model;
  /// Measured GEMM grids consulted after exact measurements (one per dtype at most); they
  /// live for the whole process (shipped_gemm_table).
  std::vector<const GemmTable*> gemm_tables;

  /// The profile dtsim ships for `system` (a kernel-table name: a100_sxm, h100_sxm, h200_sxm,
  /// b200_sxm; the GPU presets name theirs, GpuSpec::kernel_tables): its GEMM tables, built
  /// once per process (thread-safe). nullptr when dtsim ships no table for `system`.
  static const ComputeProfile* shipped(std::string_view system);

  /// Reads and validates a profile file; fits the models when the file has none.
  /// Throws InputError naming the file and key of every problem.
  static ComputeProfile load(const std::string& path);
  /// Parses YAML text (`file` names it in errors).
  static ComputeProfile parse(const std::string& text, const std::string& file);

  /// Replaces the models with least-squares fits of the measurements. GEMM: per dtype,
  /// needs device.sm_count > 0 and >= 1 measurement; memory: per name with >= 2 distinct
  /// sizes, plus "*" over all; attention: per pass; optimizer: over all.
  void fit_models();

  /// Whether the profile holds anything (measurements, tables, models) for kernels of class
  /// `c`; lookup of such a kernel returns nullopt when not.
  bool has_data_for(KernelClass c) const;

  /// Exact, interpolated or fitted time for a kernel; nullopt when the profile cannot say.
  std::optional<ProfileTime> lookup(const KernelSpec& k) const;

  /// The profile as YAML text (the format above), deterministic.
  std::string to_yaml() const;
};

}  // namespace dtsim::calib
