// The --trace output follows the Chrome trace-event format that Perfetto opens. SimGrid
// allows one engine per process, so these tests run the dtsim binary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;

const char* kExperiment =
    "model: {name: t, layers: 4, hidden: 1024, heads: 16, kv_heads: 16, ffn_hidden: 4096, activation: gelu,\n"
    "        vocab: 8192, tied_embeddings: false, norm: layernorm, position: learned}\n"
    "cluster: {node: dgx-a100, nodes: 2}\n"
    "layout: {dp: 2, tp: 4, pp: 2, zero_stage: 1, sequence_parallel: true, recompute: selective}\n"
    "training: {seq_len: 512, global_batch: 8, micro_batch: 1, dtype: bf16}\n";

class TraceRun : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dtsim_trace_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::ofstream(dir_ / "exp.yaml") << kExperiment;
  }
  void TearDown() override { fs::remove_all(dir_); }
  int run(const std::string& extra) {
    const std::string cmd = std::string(DTSIM_BINARY) + " run -q " + (dir_ / "exp.yaml").string() + " " + extra;
    return std::system(cmd.c_str());
  }
  nlohmann::json read(const std::string& name) {
    std::ifstream in(dir_ / name);
    return nlohmann::json::parse(in);
  }
  fs::path dir_;
};

TEST_F(TraceRun, FollowsTheTraceEventFormat) {
  ASSERT_EQ(run("--trace " + (dir_ / "t.json").string() + " --json " + (dir_ / "r.json").string()), 0);
  const auto j = read("t.json");
  const double step_us = read("r.json")["step_time_s"].get<double>() * 1e6;
  ASSERT_TRUE(j.contains("traceEvents"));
  ASSERT_TRUE(j["traceEvents"].is_array());
  std::map<int64_t, bool> named;
  std::map<std::pair<int64_t, int>, std::vector<std::pair<double, double>>> rows;
  double last_end = 0;
  int complete = 0;
  std::map<std::string, int> async_phases;  // id -> +1 per "b", -1 per "e"
  int async = 0;
  for (const auto& ev : j["traceEvents"]) {
    ASSERT_TRUE(ev.contains("ph") && ev.contains("pid") && ev.contains("tid") && ev.contains("name"));
    if (ev["ph"] == "M") {
      if (ev["name"] == "process_name") named[ev["pid"].get<int64_t>()] = true;
      continue;
    }
    if (ev["ph"] == "b" || ev["ph"] == "e") {
      // P2P transfers overlap: async slices, a "b" and an "e" per id.
      ASSERT_TRUE(ev.contains("id") && ev.contains("cat") && ev.contains("ts"));
      EXPECT_EQ(ev["cat"], "PP");
      async_phases[ev["id"].get<std::string>()] += ev["ph"] == "b" ? 1 : -1;
      async += ev["ph"] == "b";
      last_end = std::max(last_end, ev["ts"].get<double>());
      continue;
    }
    ASSERT_EQ(ev["ph"], "X");
    ++complete;
    const double ts = ev["ts"].get<double>(), dur = ev["dur"].get<double>();
    EXPECT_GE(ts, 0.0);
    EXPECT_GE(dur, 0.0);
    ASSERT_TRUE(ev.contains("args"));
    if (ev["cat"] == "compute") {
      EXPECT_TRUE(ev["args"].contains("bytes"));
    }
    if (ev["cat"] == "TP" || ev["cat"] == "DP") {
      EXPECT_TRUE(ev["args"].contains("group"));
    }
    rows[{ev["pid"].get<int64_t>(), ev["tid"].get<int>()}].push_back({ts, ts + dur});
    last_end = std::max(last_end, ts + dur);
  }
  EXPECT_GT(complete, 100);
  // One process per simulated rank (folded: one per pipeline stage), each named.
  EXPECT_EQ(named.size(), 2u);
  // Complete events on one row nest (a stream runs one thing at a time; a wait or a
  // pipelined GEMM's parts lie inside the GEMM): never a partial overlap.
  for (auto& [row, spans] : rows) {
    std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : a.second > b.second;
    });
    std::vector<std::pair<double, double>> open;
    for (const auto& s : spans) {
      while (!open.empty() && open.back().second <= s.first + 1e-6) open.pop_back();
      if (!open.empty()) {
        EXPECT_LE(s.second, open.back().second + 1e-6) << row.first << " tid " << row.second;
      }
      open.push_back(s);
    }
  }
  // pp = 2, 4 micro-batches (8 / dp 2): every message an async slice at each end, each
  // id one "b" and one "e". Stage 0 sends 4 activations and receives 4 gradients, stage 1
  // the other way round.
  EXPECT_EQ(async, 2 * 2 * 4);
  for (const auto& [id, n] : async_phases) EXPECT_EQ(n, 0) << id;
  // The timeline ends with the step.
  EXPECT_NEAR(last_end, step_us, 1e-3);
}

TEST_F(TraceRun, TracingDoesNotChangeTheResult) {
  ASSERT_EQ(run("--json " + (dir_ / "plain.json").string()), 0);
  ASSERT_EQ(run("--trace " + (dir_ / "t.json").string() + " --json " + (dir_ / "traced.json").string()), 0);
  const double a = read("plain.json")["step_time_s"].get<double>();
  const double b = read("traced.json")["step_time_s"].get<double>();
  EXPECT_NEAR(a, b, 1e-9 * a);
}

}  // namespace
