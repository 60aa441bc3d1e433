// Reports: JSON layout and determinism, terminal summary contents, atomic file writes.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "models/experiment.hpp"
#include "models/result.hpp"
#include "reports/atomic_file.hpp"
#include "reports/json.hpp"
#include "reports/summary.hpp"

namespace dtsim {
namespace {

namespace fs = std::filesystem;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

/// The GPT-3 175B selective-recompute setup of Korthikanti et al. 2022, Table 3
/// (64 A100s, TP 8, PP 8, 13.75 s per step, MFU 51.4 %), with made-up engine details.
Experiment sample_experiment() {
  Experiment e;
  e.source = "experiments/gpt3-175b-selective.yaml";
  e.title = "GPT-3 175B, selective recompute";
  e.model.name = "GPT-3 175B";
  e.model.layers = 96;
  e.model.hidden = 12288;
  e.model.heads = 96;
  e.model.kv_heads = 96;
  e.model.ffn_hidden = 4 * 12288;
  e.model.vocab = 51200;
  e.model.tied_embeddings = true;
  e.cluster.name = "selene";
  e.cluster.gpu.name = "A100-SXM4-80GB";
  e.cluster.nodes = 8;
  e.cluster.gpus_per_node = 8;
  e.layout.tp = 8;
  e.layout.pp = 8;
  e.layout.sequence_parallel = true;
  e.layout.recompute = Recompute::selective;
  e.training.seq_len = 2048;
  e.training.global_batch = 64;
  e.training.micro_batch = 1;
  return e;
}

StepResult sample_result() {
  StepResult r;
  r.experiment = "GPT-3 175B, selective recompute";
  r.engine = "simgrid";
  r.folded = true;
  r.gpus = 64;
  r.simulated_ranks = 8;
  r.step_time_s = 13.75;
  r.tokens_per_step = 64.0 * 2048;
  r.tokens_per_s = r.tokens_per_step / r.step_time_s;
  r.model_flops = 2.84e17;
  r.hardware_flops = 2.92e17;
  r.tflops_per_gpu = 160.4;
  r.mfu = 0.514;
  r.hfu = 0.528;
  r.compute_s = 11.2;
  r.bubble_s = 1.52;
  r.optimizer_s = 0.0453;
  r.comm["TP"] = {0.8, 0.35, 12.5 * kGiB, 36864};
  r.comm["PP"] = {0.1, 0.0182e-3, 384.0 * 1024 * 1024, 256};
  r.comm["DP"] = {0, 0, 0, 0};
  r.comm["CP"] = {0, 0, 0, 0};
  for (int s = 0; s < 8; ++s) {
    StageResult st;
    st.stage = s;
    st.layers = 12;
    st.compute_s = 11.2 + 0.01 * s;
    st.bubble_s = 1.52;
    st.finish_s = 13.75 - 0.001 * (7 - s);
    st.comm = r.comm;
    st.memory.params_bytes = 5.1 * kGiB;
    st.memory.grads_bytes = 5.1 * kGiB;
    st.memory.optimizer_bytes = 30.6 * kGiB;
    st.memory.activations_bytes = 20.0 * kGiB;
    st.memory.other_bytes = 1.0 * kGiB;
    st.memory.peak_bytes = 61.8 * kGiB;
    st.memory.capacity_bytes = 76.0 * kGiB;
    st.memory.fits = s != 7;  // pretend the last stage (logits) overflows
    r.stages.push_back(st);
  }
  r.engine_config["network/model"] = "CM02";
  r.engine_config["precision/timing"] = "1e-9";
  r.wall_clock_s = 0.84;
  return r;
}

TEST(ReportsJson, HasTheRequiredKeys) {
  const nlohmann::json j = to_json(sample_result());
  for (const char* k : {"experiment", "engine", "folded", "gpus", "simulated_ranks", "step_time_s", "tokens_per_s",
                        "tokens_per_step", "model_flops", "hardware_flops", "tflops_per_gpu", "mfu", "hfu",
                        "compute_s", "bubble_s", "optimizer_s", "comm", "stages", "engine_config"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_FALSE(j.contains("wall_clock_s")) << "host time is not deterministic";
  for (const char* kind : {"TP", "CP", "PP", "DP"}) {
    ASSERT_TRUE(j["comm"].contains(kind)) << kind;
    for (const char* k : {"total_s", "exposed_s", "bytes", "operations"}) EXPECT_TRUE(j["comm"][kind].contains(k));
  }
  ASSERT_EQ(j["stages"].size(), 8u);
  const auto& st = j["stages"][7];
  for (const char* k : {"stage", "layers", "compute_s", "bubble_s", "finish_s", "comm", "memory"})
    EXPECT_TRUE(st.contains(k)) << k;
  for (const char* k : {"params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "other_bytes",
                        "peak_bytes", "capacity_bytes", "fits"})
    EXPECT_TRUE(st["memory"].contains(k)) << k;
  EXPECT_EQ(st["stage"], 7);
  EXPECT_EQ(st["memory"]["fits"], false);
  EXPECT_EQ(j["step_time_s"].get<double>(), 13.75);
  EXPECT_EQ(j["comm"]["TP"]["operations"].get<int64_t>(), 36864);
  EXPECT_EQ(j["engine_config"]["network/model"], "CM02");
}

TEST(ReportsJson, MissingCommKindsAppearAsZero) {
  StepResult r = sample_result();
  r.comm.clear();
  const nlohmann::json j = to_json(r);
  for (const char* kind : {"TP", "CP", "PP", "DP"}) EXPECT_EQ(j["comm"][kind]["total_s"].get<double>(), 0.0);
}

TEST(ReportsJson, IdenticalResultsGiveIdenticalBytes) {
  StepResult a = sample_result();
  StepResult b = sample_result();
  b.wall_clock_s = 123.0;  // host time differs between runs; the JSON must not
  const std::string ta = result_json_text(a);
  EXPECT_EQ(ta, result_json_text(b));
  EXPECT_EQ(ta, result_json_text(a));
  EXPECT_EQ(ta.back(), '\n');
  EXPECT_NE(ta.find("\n  \"step_time_s\": 13.75,\n"), std::string::npos) << "2-space indent, shortest numbers";
  // Round trip: the text reads back to the same numbers.
  EXPECT_EQ(nlohmann::json::parse(ta), to_json(a));
}

TEST(ReportsSummary, ContainsTheKeyFigures) {
  const std::string s = format_summary(sample_experiment(), sample_result());
  for (const char* needle :
       {"GPT-3 175B, selective recompute", "A100-SXM4-80GB", "64 GPUs", "8 nodes", "DP 1 x TP 8 x CP 1 x PP 8",
        "ZeRO-0", "sequence parallel on", "recompute selective", "global batch 64", "64 accumulation steps",
        "174.6 B parameters", "13.75 s", "160.4", "51.4 %", "52.8 %", "11.20 s", "1.52 s", "45.3 ms", "TP", "CP",
        "PP", "DP", "12.50 GiB", "384.0 MiB", "18.2 us", "36,864", "fits", "OOM", "76.00", "61.80"})
    EXPECT_NE(s.find(needle), std::string::npos) << "missing \"" << needle << "\" in:\n" << s;
  EXPECT_EQ(s, format_summary(sample_experiment(), sample_result())) << "deterministic";
}

TEST(ReportsSummary, SequenceParallelAtTp1IsReportedOff) {
  // Megatron-LM disables --sequence-parallel at TP 1; the summary says so, as verify does.
  Experiment e = sample_experiment();
  e.layout.tp = 1;
  e.layout.dp = 8;
  e.layout.sequence_parallel = true;
  const std::string s = format_summary(e, sample_result());
  EXPECT_NE(s.find("sequence parallel off (tp=1"), std::string::npos) << s;
}

TEST(ReportsSummary, DurationUnitsFollowMagnitude) {
  EXPECT_EQ(format_duration(13.75), "13.75 s");
  EXPECT_EQ(format_duration(0.4123), "412.3 ms");
  EXPECT_EQ(format_duration(18.2e-6), "18.2 us");
  EXPECT_EQ(format_duration(0.9999999), "1.00 s");  // rounds up into the next unit
  EXPECT_EQ(format_duration(0), "0 s");
  EXPECT_EQ(format_bytes(80.0 * kGiB), "80.00 GiB");
  EXPECT_EQ(format_bytes(512.0 * 1024 * 1024), "512.0 MiB");
  EXPECT_EQ(format_bytes(12), "12 B");
}

/// A fresh directory under the system temp dir, removed at the end of the test.
class ReportsAtomicFile : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "dtsim-reports-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  static std::string read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  size_t entries() const { return static_cast<size_t>(std::distance(fs::directory_iterator(dir_), {})); }
  fs::path dir_;
};

TEST_F(ReportsAtomicFile, WritesOverwritesAndLeavesNoTemporaryFile) {
  const fs::path p = dir_ / "result.json";
  write_file_atomic(p.string(), "first\n");
  EXPECT_EQ(read(p), "first\n");
  write_file_atomic(p.string(), "second, longer\n");
  EXPECT_EQ(read(p), "second, longer\n");
  write_file_atomic(p.string(), "");
  EXPECT_EQ(read(p), "");
  EXPECT_EQ(entries(), 1u) << "only result.json remains";
}

TEST_F(ReportsAtomicFile, FailureNamesThePathAndLeavesNothing) {
  // A parent that is a file (missing parents are created: reports/atomic_file.hpp).
  std::ofstream(dir_ / "file") << "keep";
  const fs::path p = dir_ / "file" / "result.json";
  try {
    write_file_atomic(p.string(), "x");
    FAIL() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
  }
  // A directory where the file should be: the rename fails, the temp file is cleaned up.
  const fs::path d = dir_ / "taken";
  fs::create_directory(d);
  fs::create_directory(d / "child");
  EXPECT_THROW(write_file_atomic(d.string(), "x"), std::runtime_error);
  EXPECT_EQ(entries(), 2u) << "only 'file' and the directory 'taken' remain";
  EXPECT_EQ(read(dir_ / "file"), "keep");
}

}  // namespace
}  // namespace dtsim
