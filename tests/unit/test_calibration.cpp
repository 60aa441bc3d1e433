// Calibration profile: loading (strict), lookup (exact, interpolated, fitted, roofline),
// least-squares fitting, the plan's kernel shapes and the `dtsim calibrate` CLI on a CPU build.
// tests/data/synthetic_h100_profile.yaml is SYNTHETIC test data generated from known models
// (its header lists them), so the fits must recover those models.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "models/calibration/plan_kernels.hpp"
#include "models/calibration/profile.hpp"
#include "models/compute_cost.hpp"
#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/plan.hpp"

namespace dtsim::calib {
namespace {

const std::string kProfile = std::string(DTSIM_SOURCE_DIR) + "/tests/data/synthetic_h100_profile.yaml";
const std::string kLlama = std::string(DTSIM_SOURCE_DIR) + "/experiments/examples/llama3-8b-h100.yaml";
const std::string kGpt3 = std::string(DTSIM_SOURCE_DIR) + "/experiments/gpt3-175b-selective.yaml";

// The models the synthetic file was generated from (its header comment).
constexpr double kGemmRate = 7.0e14, kGemmOverhead = 5e-6;
constexpr double kMemBw = 2.9e12, kMemOverhead = 3e-6;

KernelSpec gemm(int64_t m, int64_t n, int64_t k, bool ta = false, bool tb = true, Dtype dt = Dtype::bf16) {
  KernelSpec s;
  s.kind = KernelClass::gemm;
  s.gemm = {m, n, k, dt, ta, tb};
  return s;
}
KernelSpec memory(const std::string& name, double bytes) {
  KernelSpec s;
  s.kind = KernelClass::memory;
  s.name = name;
  s.bytes = bytes;
  return s;
}
/// Generating formula of the synthetic file's GEMMs (tile 128 x 256, 132 SMs).
double synthetic_gemm(int64_t m, int64_t n, int64_t k) {
  const double tiles = std::ceil(m / 128.0) * std::ceil(n / 256.0);
  const double waves = std::ceil(tiles / 132.0);
  return 2.0 * waves * 132 * 128 * 256 * static_cast<double>(k) / kGemmRate + kGemmOverhead;
}

std::vector<std::string> problems_of(const std::string& text) {
  try {
    ComputeProfile::parse(text, "p.yaml");
  } catch (const InputError& e) {
    return e.problems();
  }
  return {};
}

const char* kMinimal =
    "format: dtsim-compute-profile-1\n"
    "date: \"2026-11-30T00:00:00Z\"\n"
    "units: {time: s, bytes: B, flops: FLOP, flop_rate: FLOP/s, bandwidth: B/s, clock: MHz}\n"
    "device: {name: X, sm_count: 100}\n"
    "kernels:\n"
    "  memory:\n"
    "    - {name: gelu, bytes: 1.0e6, time_s: 2.0e-6}\n";

TEST(CalibrationProfile, LoadsTheSyntheticProfile) {
  const ComputeProfile p = ComputeProfile::load(kProfile);
  EXPECT_TRUE(p.synthetic);
  EXPECT_EQ(p.device.sm_count, 132);
  EXPECT_EQ(p.device.compute_capability, "9.0");
  EXPECT_DOUBLE_EQ(p.device.sm_clock_mhz, 1980);
  int counts[4] = {0, 0, 0, 0};
  for (const auto& m : p.measurements) ++counts[static_cast<int>(m.spec.kind)];
  EXPECT_EQ(counts[0], 11);  // gemm
  EXPECT_EQ(counts[1], 5);  // attention
  EXPECT_EQ(counts[2], 5);  // memory
  EXPECT_EQ(counts[3], 2);  // optimizer
}

TEST(CalibrationProfile, FitRecoversTheGeneratingModels) {
  const ComputeProfile p = ComputeProfile::load(kProfile);  // no `models:`: fitted at load
  ASSERT_EQ(p.gemm_models.size(), 1u);
  const GemmModel& g = p.gemm_models[0];
  EXPECT_EQ(g.tile_m, 128);
  EXPECT_EQ(g.tile_n, 256);
  EXPECT_EQ(g.sm_count, 132);
  // The data are exact (17 significant digits), so only rounding separates fit and truth.
  EXPECT_NEAR(g.flop_rate / kGemmRate, 1.0, 1e-9);
  EXPECT_NEAR(g.overhead_s, kGemmOverhead, 1e-12);
  ASSERT_EQ(p.attention_models.size(), 2u);
  for (const auto& a : p.attention_models) {
    EXPECT_NEAR(a.flop_rate / (a.backward ? 3.6e14 : 4.5e14), 1.0, 1e-9);
    EXPECT_NEAR(a.overhead_s, 1.5e-5, 1e-12);
  }
  bool star = false, norm = false;
  for (const auto& b : p.memory_models) {
    if (b.name == "*") star = true;
    if (b.name == "input_norm") norm = true;
    EXPECT_NEAR(b.bandwidth / kMemBw, 1.0, 1e-6) << b.name;  // swiglu bytes were rounded to 9 digits
    EXPECT_NEAR(b.overhead_s, kMemOverhead, 1e-9) << b.name;
  }
  EXPECT_TRUE(star);
  EXPECT_TRUE(norm);
  EXPECT_NEAR(p.optimizer_model.params_per_s / 2e11, 1.0, 1e-9);
  EXPECT_NEAR(p.optimizer_model.overhead_s, 2e-5, 1e-12);
}

TEST(CalibrationProfile, FitLineIsLeastSquares) {
  // y = 2x + 1 with symmetric noise +-0.1 on the two middle points: the fit is unchanged.
  const LineFit f = fit_line({0, 1, 2, 3}, {1, 3.1, 4.9, 7});
  EXPECT_NEAR(f.slope, 1.98, 1e-12);  // closed form: Sxy/Sxx = 9.9/5
  EXPECT_NEAR(f.intercept, 1.03, 1e-12);
  // A negative intercept is clamped: refit through the origin.
  const LineFit g = fit_line({1, 2}, {1, 3});
  EXPECT_EQ(g.intercept, 0);
  EXPECT_NEAR(g.slope, 7.0 / 5.0, 1e-12);
  EXPECT_THROW(fit_line({}, {}), std::invalid_argument);
}

TEST(CalibrationProfile, WaveQuantisation) {
  // 132 tiles of 128 x 256 fill one wave on 132 SMs; one more row of tiles needs a second.
  const GemmShape one{128 * 132, 256, 1024, Dtype::bf16, false, true};
  GemmShape two = one;
  two.m += 1;
  EXPECT_DOUBLE_EQ(quantised_gemm_flops(two, 128, 256, 132), 2 * quantised_gemm_flops(one, 128, 256, 132));
  const ComputeProfile p = ComputeProfile::load(kProfile);
  const auto t1 = p.lookup(gemm(one.m, one.n, one.k));
  const auto t2 = p.lookup(gemm(two.m, two.n, two.k));
  ASSERT_TRUE(t1 && t2);
  EXPECT_EQ(t1->source, TimeSource::profile_fitted);
  EXPECT_NEAR(t1->seconds, synthetic_gemm(one.m, one.n, one.k), 1e-12);
  EXPECT_NEAR(t2->seconds, synthetic_gemm(two.m, two.n, two.k), 1e-12);
  // A 0.01% larger GEMM: twice the wave time (2 x 12.6 us) plus the same 5 us overhead.
  EXPECT_GT(t2->seconds, 1.7 * t1->seconds);
  // (two.m, two.n, two.k) is also stored: exact, and equal to the model.
  KernelSpec stored = gemm(16897, 256, 1024);
  EXPECT_EQ(p.lookup(stored)->source, TimeSource::profile_exact);
  EXPECT_NEAR(p.lookup(stored)->seconds, t2->seconds, 1e-12);
}

TEST(CalibrationProfile, LookupOrder) {
  const ComputeProfile p = ComputeProfile::load(kProfile);
  // Exact: the stored time, to the bit.
  auto t = p.lookup(gemm(8192, 3072, 4096));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->source, TimeSource::profile_exact);
  EXPECT_DOUBLE_EQ(t->seconds, 0.0003087155445028572);
  // Same size, other transposes: not measured -> fitted model.
  t = p.lookup(gemm(8192, 3072, 4096, false, false));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->source, TimeSource::profile_fitted);
  // Memory inside the measured range of the same kernel: linear interpolation between
  // 64 MiB (2.614e-5 s) and 256 MiB (9.556e-5 s) at 128 MiB.
  t = p.lookup(memory("input_norm", 134217728.0));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->source, TimeSource::profile_interpolated);
  EXPECT_NEAR(t->seconds, 2.6140987586206895e-05 + (9.556395034482759e-05 - 2.6140987586206895e-05) / 3.0, 1e-15);
  // Outside the range: the kernel's own bandwidth model; unknown name: the "*" model.
  t = p.lookup(memory("input_norm", 1e10));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->source, TimeSource::profile_fitted);
  EXPECT_NEAR(t->seconds, 1e10 / kMemBw + kMemOverhead, 1e-9);
  t = p.lookup(memory("layernorm_never_measured", 5e8));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->source, TimeSource::profile_fitted);
  // fp8 GEMMs were not measured: the profile cannot say (the caller uses the roofline).
  EXPECT_FALSE(p.lookup(gemm(4096, 4096, 4096, false, true, Dtype::fp8)));
  // Attention between measured sequence lengths (same heads/dim/mask/pass): interpolated.
  KernelSpec a;
  a.kind = KernelClass::attention;
  a.attention = {1, 16, 4, 3072, 3072, 128, true, false};
  t = p.lookup(a);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->source, TimeSource::profile_interpolated);
}

TEST(CalibrationProfile, StrictLoading) {
  EXPECT_TRUE(problems_of(kMinimal).empty());
  auto ps = problems_of(std::string(kMinimal) + "    - {name: gelu, bytes: 2.0e6, time_s: 3.0e-6, tdp: 700}\n");
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0], "p.yaml: unknown key kernels.memory[1].tdp (valid keys under kernels.memory[1]: name, bytes, time_s)");
  std::string bad_units = kMinimal;
  bad_units.replace(bad_units.find("time: s"), 7, "time: ms");
  ps = problems_of(bad_units);
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0], "p.yaml: units.time=\"ms\" must be \"s\" (dtsim profiles are in SI units)");
  ps = problems_of(std::string(kMinimal) + "  gemm:\n    - {m: 1, n: 2, k: 3, dtype: fp16, trans_a: false, time_s: -1}\n");
  ASSERT_EQ(ps.size(), 1u);  // the missing key stops that entry
  EXPECT_EQ(ps[0], "p.yaml: missing key kernels.gemm[0].trans_b");
  ps = problems_of(std::string(kMinimal) +
                   "  gemm:\n    - {m: 1, n: 2, k: 3, dtype: fp16, trans_a: false, trans_b: true, time_s: -1}\n");
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0], "p.yaml: kernels.gemm[0].dtype=\"fp16\" must be bf16 or fp8");
  EXPECT_EQ(ps[1], "p.yaml: kernels.gemm[0].time_s=-1 must be > 0");
  ps = problems_of(std::string(kMinimal) + "speed: fast\n");
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_NE(ps[0].find("unknown key speed"), std::string::npos);
  EXPECT_THROW(ComputeProfile::load("/nonexistent/profile.yaml"), InputError);
}

TEST(CalibrationProfile, DateIsIso8601) {
  auto with_date = [](const std::string& date) {
    std::string t = kMinimal;
    t.replace(t.find("\"2026-11-30T00:00:00Z\""), 22, date);
    return problems_of(t);
  };
  for (const char* ok : {"2026-11-30", "\"2026-11-30T14:05:59Z\"", "2026-11-30T14:05:59.123Z",
                         "\"2026-11-30T14:05:59+05:30\"", "2026-11-30T14:05:59"})
    EXPECT_TRUE(with_date(ok).empty()) << ok;
  for (const char* bad : {"yesterday", "2026-13-01", "2026-11-32", "2026-1-30", "30/11/2026", "2026-11-30T25:00:00Z",
                          "2026-11-30T14:05Z", "2026-11-30T14:05:59.Z", "2026-11-30T14:05:59+5", "2026-11-30 "}) {
    const auto ps = with_date(std::string("\"") + bad + "\"");
    ASSERT_EQ(ps.size(), 1u) << bad;
    EXPECT_NE(ps[0].find("is not an ISO 8601 date"), std::string::npos) << ps[0];
  }
}

TEST(CalibrationProfile, YamlRoundTrip) {
  const ComputeProfile p = ComputeProfile::load(kProfile);
  const ComputeProfile q = ComputeProfile::parse(p.to_yaml(), "roundtrip.yaml");
  EXPECT_EQ(q.to_yaml(), p.to_yaml());
  ASSERT_EQ(q.measurements.size(), p.measurements.size());
  for (size_t i = 0; i < p.measurements.size(); ++i) {
    EXPECT_EQ(q.measurements[i].spec.key(), p.measurements[i].spec.key());
    EXPECT_EQ(q.measurements[i].time_s, p.measurements[i].time_s);  // shortest round-trip format
  }
  ASSERT_EQ(q.gemm_models.size(), 1u);
  EXPECT_EQ(q.gemm_models[0].flop_rate, p.gemm_models[0].flop_rate);
  EXPECT_TRUE(q.synthetic);
}

// ---- the plan's kernels and the cost model ----

TEST(CalibrationKernels, LlamaShapesAtTp2) {
  const Experiment e = load_experiment(kLlama);  // TP 2, seq 8192, micro-batch 1, GQA 32/8
  const auto ks = derive_kernels(e);
  std::set<std::string> keys;
  for (const auto& k : ks) EXPECT_TRUE(keys.insert(k.key()).second) << "duplicate " << k.key();
  // h 4096, kv dim 8 x 128 = 1024, ffn 14336: QKV (4096 + 2048) / 2 = 3072 wide.
  EXPECT_TRUE(keys.count("gemm m=8192 n=3072 k=4096 bf16 NT")) << "qkv";
  EXPECT_TRUE(keys.count("gemm m=8192 n=4096 k=3072 bf16 NN")) << "qkv_dgrad";
  EXPECT_TRUE(keys.count("gemm m=4096 n=3072 k=8192 bf16 TN")) << "qkv_wgrad";
  EXPECT_TRUE(keys.count("gemm m=8192 n=4096 k=2048 bf16 NT")) << "out_proj";
  EXPECT_TRUE(keys.count("gemm m=8192 n=7168 k=4096 bf16 NT")) << "mlp_up / mlp_gate";
  EXPECT_TRUE(keys.count("gemm m=8192 n=4096 k=7168 bf16 NT")) << "mlp_down";
  EXPECT_TRUE(keys.count("gemm m=8192 n=4096 k=14336 bf16 NN")) << "mlp_up_dgrad (up + gate)";
  EXPECT_TRUE(keys.count("attention fwd b=1 h=16 kv=4 sq=8192 skv=8192 d=128 causal"));
  EXPECT_TRUE(keys.count("attention bwd b=1 h=16 kv=4 sq=8192 skv=8192 d=128 causal"));
  int optim = 0;
  for (const auto& k : ks) optim += k.kind == KernelClass::optimizer;
  EXPECT_EQ(optim, 1);  // PP 1: one stage, one optimizer step
  // Every compute op of the plan has a kernel, and GEMM FLOPs agree with the plan's.
  const StepPlan plan = build_step_plan(e);
  for (const auto& op : plan.stages[0].ops) {
    if (op.type != OpType::compute) continue;
    const auto k = kernel_for_op(op, e);
    ASSERT_TRUE(k) << op.name;
    if (op.kernel == KernelKind::gemm) {
      EXPECT_NEAR(k->spec.flops() / op.flops, 1.0, 1e-12) << op.name;
    }
    if (op.kernel == KernelKind::attention) {  // plan FLOPs x the Flash work factors = executed
      EXPECT_NEAR(k->spec.flops() / op.flops, op.phase == Phase::backward ? 0.625 : 0.5, 1e-12) << op.name;
    }
  }
}

TEST(CalibrationKernels, GridAddsNewShapes) {
  const auto ks = derive_kernels(load_experiment(kGpt3));
  const auto grid = grid_kernels(ks);
  EXPECT_FALSE(grid.empty());
  std::set<std::string> keys;
  for (const auto& k : ks) keys.insert(k.key());
  for (const auto& k : grid) EXPECT_TRUE(keys.insert(k.key()).second) << k.key();
}

TEST(CalibrationCost, ProfileSourcesInThePlan) {
  Experiment e = load_experiment(kLlama, {"cluster.gpu.preset=H100-SXM5-80GB", "cluster.gpu.profile=" + kProfile});
  ASSERT_EQ(e.cluster.gpu.profile, kProfile);
  const StepPlan plan = build_step_plan(e);
  std::map<std::string, TimeSource> src;
  for (const auto& op : plan.stages[0].ops)
    if (op.type == OpType::compute) {
      const ComputeTime t = compute_time(op, e);
      EXPECT_GT(t.seconds, 0) << op.name;
      src[op.name] = t.source;
      if (op.name == std::string("qkv")) {
        EXPECT_DOUBLE_EQ(t.seconds, 0.0003087155445028572);
      }
    }
  EXPECT_EQ(src["qkv"], TimeSource::profile_exact);
  EXPECT_EQ(src["mlp_up"], TimeSource::profile_exact);
  EXPECT_EQ(src["attention"], TimeSource::profile_exact);
  EXPECT_EQ(src["qkv_dgrad"], TimeSource::profile_fitted);
  EXPECT_EQ(src["swiglu"], TimeSource::profile_exact);  // 2 B x 3 x 8192 x 14336 / 2 = 352 MB, stored
  EXPECT_EQ(src["input_norm"], TimeSource::profile_exact);  // 2 B x 2 x (8192 / 2 with SP) x 4096 = 67 MB
  EXPECT_EQ(src["post_attention_norm"], TimeSource::profile_fitted);  // never measured: the "*" model
  EXPECT_EQ(src["optimizer_adam"], TimeSource::profile_interpolated);  // 5.0e8 params, between 1e8 and 1e9
  // fp8 GEMMs: no fp8 model in the profile -> roofline, equal to the plain cost model.
  e.training.precision = Precision::fp8_delayed;
  for (const auto& op : plan.stages[0].ops)
    if (op.type == OpType::compute && op.name == std::string("qkv")) {
      const ComputeTime t = compute_time(op, e);
      EXPECT_EQ(t.source, TimeSource::roofline);
      const double fill = gemm_wave_fill(calib::kernel_for_op(op, e)->spec.gemm, e.cluster.gpu.sm_count);
      EXPECT_EQ(t.seconds, compute_time(op, e.cluster.gpu, Dtype::fp8, 1.0, fill));
    }
}

TEST(CalibrationCost, NoProfileIsTheRoofline) {
  const Experiment e = load_experiment(kLlama, {"cluster.gpu.kernel_tables=none"});
  EXPECT_EQ(experiment_profile(e), nullptr);
  const StepPlan plan = build_step_plan(e);
  for (const auto& op : plan.stages[0].ops)
    if (op.type == OpType::compute) {
      // The plan's FlashAttention work factors (models/plan.cpp Builder).
      const double work = op.kernel != KernelKind::attention ? 1.0
                          : op.phase == Phase::backward      ? kFlashCausalWork * kFlashBackwardWork / 2.0
                                                             : kFlashCausalWork;
      const ComputeTime t = compute_time(op, e, work);
      EXPECT_EQ(t.source, TimeSource::roofline);
      EXPECT_EQ(t.seconds, op.time_s) << op.name;  // the plan's own (roofline) time
    }
}

TEST(CalibrationCost, BadProfileNamesTheKey) {
  const Experiment e = load_experiment(kLlama, {"cluster.gpu.preset=H100-SXM5-80GB", "cluster.gpu.profile=no_such_profile.yaml"});
  try {
    experiment_profile(e);
    FAIL() << "no error";
  } catch (const InputError& err) {
    ASSERT_GE(err.problems().size(), 2u);
    EXPECT_NE(err.problems()[0].find("cluster.gpu.profile=no_such_profile.yaml"), std::string::npos);
    // relative to the experiment file's directory
    EXPECT_NE(err.problems()[1].find("experiments/examples/no_such_profile.yaml"), std::string::npos);
  }
}

// ---- the CLI ----

struct CliRun {
  int rc = -1;
  std::string out;
};
CliRun run_shell(const std::string& command) {
  CliRun r;
  FILE* f = popen(command.c_str(), "r");
  if (!f) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
  const int st = pclose(f);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}
CliRun run(const std::string& args) {
  return run_shell(std::string("CUDA_VISIBLE_DEVICES= '") + DTSIM_BINARY + "' " + args + " 2>&1");
}

TEST(CalibrationCli, ListAndNoCudaOrNoDevice) {
  CliRun r = run("calibrate '" + kLlama + "' --list");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("gemm m=8192 n=3072 k=4096 bf16 NT"), std::string::npos) << r.out;
  // No GPU visible (CUDA_VISIBLE_DEVICES empty): a CPU build says it has no CUDA calibrator
  // (4), a CUDA build (its plugin beside dtsim) that no device was found (5); both after
  // listing the kernels.
  const std::string out = testing::TempDir() + "/calib_never_written.yaml";
  r = run("calibrate '" + kLlama + "' --out '" + out + "'");
  ASSERT_TRUE(r.rc == 4 || r.rc == 5) << r.rc << "\n" << r.out;
  EXPECT_NE(r.out.find(r.rc == 4 ? "no CUDA calibrator" : "no CUDA device"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("distinct compute kernels"), std::string::npos);
  EXPECT_FALSE(std::ifstream(out).good());
  r = run("calibrate '" + kLlama + "'");
  EXPECT_EQ(r.rc, 2) << r.out;  // --out missing
}

TEST(CalibrationCli, OnlyCalibrateLoadsTheCudaLibraries) {
  // dtsim itself needs neither the CUDA runtime nor cuBLASLt (models/calibration/measure.hpp)
  // nor SimGrid (sim/plugin/simgrid_plugin.hpp): its dynamic section names none of them,
  // whatever the build; the plugins sit beside it.
  CliRun r = run_shell("readelf -d " + std::string(DTSIM_BINARY) + " 2>&1 | grep NEEDED");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("libstdc++"), std::string::npos) << r.out;  // readelf read it
  EXPECT_EQ(r.out.find("libsimgrid"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("libcudart"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("libcublas"), std::string::npos) << r.out;
  // The SimGrid engine's plugin names SimGrid, and no CUDA library either.
  const std::string plugin = (std::filesystem::path(DTSIM_BINARY).parent_path() / "libdtsim_simgrid.so").string();
  r = run_shell("readelf -d '" + plugin + "' 2>&1 | grep NEEDED");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("libsimgrid"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("libcudart"), std::string::npos) << r.out;
}

TEST(SimgridPluginCli, LoadedOnlyWhenASimulationNeedsIt) {
  // An analytic-only sweep never loads the SimGrid engine (nor libsimgrid); a sweep that
  // re-simulates its best layout does, once (the dynamic linker's LD_DEBUG=files lists every
  // library it opens, to stderr).
  const std::string sweep = std::string(DTSIM_SOURCE_DIR) + "/experiments/sweeps/gpt-2.7b-32-a100.yaml";
  const std::string dir = testing::TempDir() + "/simgrid_plugin_sweep";
  std::filesystem::remove_all(dir);
  CliRun r = run_shell("LD_DEBUG=files '" + std::string(DTSIM_BINARY) + "' sweep '" + sweep + "' --refine-top 0 -q -o '" +
                       dir + "/analytic' 2>&1");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("libstdc++"), std::string::npos) << r.out;  // LD_DEBUG reported
  EXPECT_EQ(r.out.find("libdtsim_simgrid"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("libsimgrid"), std::string::npos) << r.out;
  r = run_shell("LD_DEBUG=files '" + std::string(DTSIM_BINARY) + "' sweep '" + sweep + "' --refine-top 1 -q -o '" + dir +
                "/refined' 2>&1");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("libdtsim_simgrid"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("libsimgrid"), std::string::npos) << r.out;
  std::ifstream results(dir + "/refined/results.csv");
  std::string text((std::istreambuf_iterator<char>(results)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find(",simgrid,"), std::string::npos);  // the SimGrid row is there
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dtsim::calib
