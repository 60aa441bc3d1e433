// The shipped GEMM kernel tables (models/calibration/gemm_table.hpp): their content, the
// lookup rules (exact, trilinear interpolation, extrapolation outside the grid, nothing
// for an unmeasured corner), parse errors, the experiment keys that choose them, how the
// plan times GEMMs and grouped expert GEMMs with them, and the per-source op counts every
// result carries.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <string>

#include "models/calibration/embedded_tables.hpp"
#include "models/calibration/gemm_table.hpp"
#include "models/calibration/plan_kernels.hpp"
#include "models/compute_cost.hpp"
#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/plan.hpp"
#include "reports/json.hpp"
#include "reports/json_read.hpp"
#include "sim/analytic_engine.hpp"
#include "tests/unit/input_problem.hpp"

namespace dtsim {
namespace {

using calib::GemmShape;
using calib::GemmTable;
using calib::TimeSource;

const std::string kRoot = DTSIM_SOURCE_DIR;

const GemmTable& h100() {
  const GemmTable* t = calib::shipped_gemm_table("h100_sxm", Dtype::bf16);
  if (!t) throw std::runtime_error("no h100_sxm bf16 table");
  return *t;
}

TEST(KernelTables, ShippedTablesAreTheAiconfiguratorGrids) {
  EXPECT_EQ(calib::shipped_table_systems(), (std::vector<std::string>{"a100_sxm", "b200_sxm", "h100_sxm", "h200_sxm"}));
  for (const auto& sys : calib::shipped_table_systems()) {
    const GemmTable* t = calib::shipped_gemm_table(sys, Dtype::bf16);
    ASSERT_NE(t, nullptr) << sys;
    EXPECT_EQ(t->system, sys);
    EXPECT_EQ(t->ms.size(), 74u) << sys;
    EXPECT_EQ(t->ns.size(), 22u) << sys;
    EXPECT_EQ(t->ks.size(), 22u) << sys;
    EXPECT_EQ(t->ms.front(), 1);
    EXPECT_EQ(t->ms.back(), 32768);
    EXPECT_EQ(t->ns.back(), 65536);
    // 74 points are missing: every (m, 65536, 65536) (models/calibration/tables/README.md).
    const auto missing = std::count_if(t->seconds.begin(), t->seconds.end(), [](double s) { return s < 0; });
    EXPECT_EQ(missing, 74) << sys;
    // fp8 tables are not shipped (they time inference's quantise-then-GEMM path).
    EXPECT_EQ(calib::shipped_gemm_table(sys, Dtype::fp8), nullptr) << sys;
  }
  EXPECT_EQ(h100().device, "NVIDIA H100 80GB HBM3");
  // Every embedded file carries the attribution the Apache-2.0 licence asks for.
  for (const auto& f : calib::embedded_tables()) {
    EXPECT_NE(f.text.find("Contains performance data from NVIDIA aiconfigurator"), std::string_view::npos) << f.name;
    EXPECT_NE(f.text.find("Apache"), std::string_view::npos) << f.name;
  }
}

TEST(KernelTables, ExactPointIsTheMeasurement) {
  // ../shared/calibration/gemm/h100_sxm_gemm_bf16.csv: 8192,8192,8192,1.54172 ms (4 digits: 1542 us).
  const auto t = h100().lookup({8192, 8192, 8192});
  ASSERT_TRUE(t);
  EXPECT_EQ(t->source, TimeSource::table_exact);
  EXPECT_DOUBLE_EQ(t->seconds, 1542e-6);
  // The layout flags do not change the lookup (the backward rule: same m, n, k).
  GemmShape dgrad{8192, 8192, 8192};
  dgrad.trans_a = true;
  dgrad.trans_b = false;
  EXPECT_DOUBLE_EQ(h100().lookup(dgrad)->seconds, t->seconds);
}

TEST(KernelTables, InterpolatesTrilinearlyBetweenNeighbours) {
  const GemmTable& t = h100();
  // m = 6144 lies between the grid values 4353 and 8192, n and k on the grid.
  const auto im = static_cast<size_t>(std::find(t.ms.begin(), t.ms.end(), 4353) - t.ms.begin());
  const auto in = static_cast<size_t>(std::find(t.ns.begin(), t.ns.end(), 4096) - t.ns.begin());
  const auto ik = static_cast<size_t>(std::find(t.ks.begin(), t.ks.end(), 4096) - t.ks.begin());
  const double w = (6144.0 - 4353.0) / (8192.0 - 4353.0);
  const double want = (1 - w) * t.at(im, in, ik) + w * t.at(im + 1, in, ik);
  const auto got = t.lookup({6144, 4096, 4096});
  ASSERT_TRUE(got);
  EXPECT_EQ(got->source, TimeSource::table_interpolated);
  EXPECT_NEAR(got->seconds, want, 1e-15);
  // A time a + c m n k is reproduced exactly inside a cell (the reason for trilinear).
  std::string text = "format dtsim-gemm-table-1\nsystem test\ndtype bf16\nlayout NT\nunit us\nm 100 200\nn 100 300\n"
                     "k 100 500\ndata\n";
  auto f = [](double m, double n, double k) { return 5.0 + 1e-6 * m * n * k; };  // us
  for (double m : {100.0, 200.0}) {
    for (double n : {100.0, 300.0}) {
      for (double k : {100.0, 500.0}) text += std::to_string(f(m, n, k)) + " ";
      text += "\n";
    }
  }
  const GemmTable syn = GemmTable::parse(text, "synthetic");
  const auto mid = syn.lookup({150, 250, 130});
  ASSERT_TRUE(mid);
  EXPECT_NEAR(mid->seconds, f(150, 250, 130) * 1e-6, 1e-12);
}

TEST(KernelTables, OutsideTheGridIsExtrapolatedAndSaysSo) {
  const GemmTable& t = h100();
  // Above the largest m: linear in m from the last grid point.
  const auto big = t.lookup({65536, 4096, 4096});
  ASSERT_TRUE(big);
  EXPECT_EQ(big->source, TimeSource::table_extrapolated);
  EXPECT_NEAR(big->seconds, 2.0 * t.lookup({32768, 4096, 4096})->seconds, 1e-15);
  // Below the smallest n (a router over 8 experts): the smallest measured n.
  const auto small = t.lookup({4096, 8, 4096});
  ASSERT_TRUE(small);
  EXPECT_EQ(small->source, TimeSource::table_extrapolated);
  EXPECT_DOUBLE_EQ(small->seconds, t.lookup({4096, 32, 4096})->seconds);
  // A corner that was never measured: nothing (the caller falls back to the roofline).
  EXPECT_FALSE(t.lookup({1, 65536, 65536}));
  EXPECT_FALSE(t.lookup({100, 60000, 60000}));
  EXPECT_FALSE(t.lookup({0, 4096, 4096}));
}

TEST(KernelTables, ParseErrorsNameFileLineAndRule) {
  const std::string head = "format dtsim-gemm-table-1\nsystem x\ndtype bf16\nlayout NT\nunit us\nm 1 2\nn 32\nk 32 64\n";
  auto error = [](const std::string& text) {
    try {
      GemmTable::parse(text, "t.txt");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error(head + "data\n1 2\n3 4\n"), "no error");
  EXPECT_NE(error(head + "data\n1 2\n").find("t.txt:11: data has 1 rows, m x n = 2"), std::string::npos)
      << error(head + "data\n1 2\n");
  EXPECT_NE(error(head + "data\n1 2\n3\n").find("t.txt:11: data row has 1 values, k has 2"), std::string::npos);
  EXPECT_NE(error(head + "data\n1 -2\n3 4\n").find("t.txt:10: time \"-2\" is not a positive number"),
            std::string::npos);
  EXPECT_NE(error(head + "colour blue\ndata\n1 2\n3 4\n").find("t.txt:9: unknown key \"colour\""), std::string::npos);
  EXPECT_NE(error("format dtsim-gemm-table-1\nm 2 1\n").find("t.txt:2: axis m must be strictly ascending"),
            std::string::npos);
  EXPECT_NE(error("format other\n").find("format must be dtsim-gemm-table-1"), std::string::npos);
  EXPECT_NE(error(head + "data\n1 2\n3 4\n5 6\n").find("more data rows than m x n = 2"), std::string::npos);
}

TEST(KernelTables, PresetsChooseTheirTablesAndKeysOverride) {
  const std::string base = kRoot + "/experiments/examples/llama3-8b-h100.yaml";
  const Experiment e = load_experiment(base);
  EXPECT_EQ(e.cluster.gpu.kernel_tables, "h100_sxm");
  EXPECT_NEAR(e.cluster.gpu.sustained_ratio, 755.0 / 834.0, 1e-12);
  ASSERT_NE(experiment_profile(e), nullptr);
  EXPECT_EQ(experiment_profile(e)->gemm_tables.size(), 1u);
  EXPECT_EQ(load_experiment(base, {"cluster.gpu.kernel_tables=none"}).cluster.gpu.kernel_tables, "");
  EXPECT_EQ(experiment_profile(load_experiment(base, {"cluster.gpu.kernel_tables=none"})), nullptr);
  // A GEMM-rate field asks for the roofline at that rate, unless kernel_tables is given too.
  EXPECT_EQ(load_experiment(base, {"cluster.gpu.gemm_efficiency=0.7"}).cluster.gpu.kernel_tables, "");
  EXPECT_EQ(load_experiment(base, {"cluster.gpu.gemm_efficiency=0.7", "cluster.gpu.kernel_tables=h200_sxm"})
                .cluster.gpu.kernel_tables,
            "h200_sxm");
  try {
    load_experiment(base, {"cluster.gpu.kernel_tables=h100"});
    ADD_FAILURE() << "no error";
  } catch (const InputError& err) {
    EXPECT_NE(std::string(err.what()).find("cluster.gpu.kernel_tables=\"h100\" is not a shipped kernel table (valid: "
                                           "none, a100_sxm, b200_sxm, h100_sxm, h200_sxm)"),
              std::string::npos)
        << err.what();
  }
  try {
    load_experiment(base, {"cluster.gpu.sustained_ratio=1.5"});
    ADD_FAILURE() << "no error";
  } catch (const InputError& err) {
    EXPECT_NE(std::string(err.what()).find("cluster.gpu.sustained_ratio=1.5 must be in (0, 1]"), std::string::npos)
        << err.what();
  }
}

TEST(KernelTables, PlanGemmsUseTheTableLaunchAndSustainedClock) {
  const Experiment e = load_experiment(kRoot + "/experiments/examples/llama3-8b-h100.yaml");
  const StepPlan plan = build_step_plan(e);
  const GpuSpec& g = e.cluster.gpu;
  int tabled = 0;
  for (const auto& op : plan.stages[0].ops) {
    if (op.type != OpType::compute) continue;
    if (op.kernel != KernelKind::gemm) {
      EXPECT_EQ(op.time_source, TimeSource::roofline) << op.name;  // the tables hold GEMMs only
      continue;
    }
    const auto k = calib::kernel_for_op(op, e);
    ASSERT_TRUE(k) << op.name;
    const auto t = h100().lookup(k->spec.gemm);
    ASSERT_TRUE(t) << op.name;
    EXPECT_EQ(op.time_source, t->source) << op.name;
    EXPECT_NEAR(op.time_s, t->seconds / g.sustained_ratio + g.kernel_overhead * op.kernels, 1e-12 * op.time_s)
        << op.name;
    ++tabled;
  }
  EXPECT_GT(tabled, 0);
}

TEST(KernelTables, GroupedExpertGemmsAreOneGemmPerExpert) {
  const Experiment e = load_experiment(kRoot + "/experiments/moe/qwen3-30b-a3b-h100.yaml");
  const StepPlan plan = build_step_plan(e);
  const GpuSpec& g = e.cluster.gpu;
  bool fwd = false, wgrad = false;
  for (const auto& op : plan.stages[0].ops) {
    const std::string name = op.name;
    if (name != "expert_up" && name != "expert_up_wgrad") continue;
    ASSERT_GT(op.gemm_groups, 1) << name;  // 128 experts over EP 8: 16 per rank
    GemmShape per = op.gemm;
    int64_t& rows = name == "expert_up" ? per.m : per.k;  // the token rows: m forward, k for wgrad
    EXPECT_EQ(op.gemm_group_split_k, name != "expert_up");
    rows = (rows + op.gemm_groups - 1) / op.gemm_groups;
    const auto t = h100().lookup(per);
    ASSERT_TRUE(t);
    EXPECT_NEAR(op.time_s, op.gemm_groups * t->seconds / g.sustained_ratio + g.kernel_overhead * op.kernels,
                1e-12 * op.time_s)
        << name;
    (name == "expert_up" ? fwd : wgrad) = true;
  }
  EXPECT_TRUE(fwd);
  EXPECT_TRUE(wgrad);
}

TEST(KernelTables, ResultsCountOpsPerTimeSource) {
  const Experiment e = load_experiment(kRoot + "/experiments/examples/llama3-8b-h100.yaml");
  const StepPlan plan = build_step_plan(e);
  int64_t compute_ops = 0;
  for (const auto& st : plan.stages)
    for (const auto& op : st.ops) compute_ops += op.type == OpType::compute;
  const auto counts = time_source_counts(plan);
  int64_t sum = 0;
  for (const auto& [k, v] : counts) sum += v;
  EXPECT_EQ(sum, compute_ops);
  EXPECT_GT(counts.count("roofline"), 0u);
  EXPECT_GT(counts.count("table-exact") + counts.count("table-interpolated"), 0u);
  // Both engines report them, from the same plan, and the JSON carries them.
  const StepResult an = simulate_step_analytic(e);
  EXPECT_EQ(an.time_sources, counts);
  const StepResult back = result_from_json_text(result_json_text(an));
  EXPECT_EQ(back.time_sources, counts);
  const Experiment roof = load_experiment(kRoot + "/experiments/examples/llama3-8b-h100.yaml",
                                          {"cluster.gpu.kernel_tables=none"});
  EXPECT_EQ(time_source_counts(build_step_plan(roof)), (std::map<std::string, int64_t>{{"roofline", compute_ops}}));
}

}  // namespace
}  // namespace dtsim
