// The dtsim binary, run as a user would: exit codes, error lines, JSON output.
// DTSIM_BINARY and DTSIM_SOURCE_DIR are absolute paths set by tests/CMakeLists.txt.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "tests/unit/cli_fixture.hpp"

namespace dtsim {
namespace {

namespace fs = std::filesystem;

const fs::path kExample = fs::path(DTSIM_SOURCE_DIR) / "experiments" / "gpt3-175b-selective.yaml";

using cli_test::Outcome;
std::string quote(const std::string& s) { return cli_test::shell_quote(s); }
std::string read(const fs::path& p) { return cli_test::read_file(p); }

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

/// A fresh temp directory per test; runs dtsim with stdout/stderr captured in it.
class Cli : public cli_test::CliTest {};

TEST_F(Cli, VersionPrintsTheVersion) {
  const Outcome o = dtsim("--version");
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("0."), std::string::npos) << o.out;
}

TEST_F(Cli, HelpListsTheRunCommand) {
  const Outcome o = dtsim("--help");
  EXPECT_EQ(o.code, 0);
  EXPECT_NE(o.out.find("run"), std::string::npos) << o.out;
  const Outcome r = dtsim("run --help");
  EXPECT_EQ(r.code, 0);
  for (const char* opt : {"--set", "--json", "--show-groups", "--no-fold", "--quiet"})
    EXPECT_NE(r.out.find(opt), std::string::npos) << opt << " missing in:\n" << r.out;
}

TEST_F(Cli, UsageErrorsUseCli11ExitCodes) {
  const Outcome none = dtsim("");
  EXPECT_NE(none.code, 0);
  EXPECT_NE(none.code, 2) << "2 is reserved for invalid experiments";
  const Outcome missing_arg = dtsim("run");
  EXPECT_NE(missing_arg.code, 0);
  EXPECT_NE(missing_arg.code, 2);
  const Outcome unknown = dtsim("run x.yaml --frobnicate");
  EXPECT_NE(unknown.code, 0);
  EXPECT_NE(unknown.code, 2);
}

TEST_F(Cli, MissingFileIsAClearInputError) {
  const std::string path = (dir_ / "does-not-exist.yaml").string();
  const Outcome o = dtsim("run " + quote(path));
  EXPECT_EQ(o.code, 2);
  const auto err = lines(o.err);
  ASSERT_EQ(err.size(), 1u) << o.err;
  EXPECT_EQ(err[0].rfind("error: ", 0), 0u) << err[0];
  EXPECT_NE(err[0].find(path), std::string::npos) << err[0];
  EXPECT_NE(err[0].find("no such file"), std::string::npos) << err[0];
  EXPECT_EQ(o.out, "");
}

// Every problem of a malformed experiment is reported, one "error: FILE: ..." line each,
// with exit code 2. The file is the example experiment with TP=3 against 32 heads and an
// unknown key (yaml-cpp edits it, so the test follows the example's schema).
TEST_F(Cli, MalformedExperimentListsEveryProblem) {
  ASSERT_TRUE(fs::exists(kExample)) << kExample;
  YAML::Node doc = YAML::LoadFile(kExample.string());
  doc["model"]["heads"] = 32;
  doc["model"]["kv_heads"] = 32;
  doc["layout"]["tp"] = 3;
  doc["layout"]["bogus_knob"] = 1;
  const fs::path bad = dir_ / "bad.yaml";
  {
    std::ofstream f(bad);
    f << doc << '\n';
  }
  const Outcome o = dtsim("run " + quote(bad.string()));
  EXPECT_EQ(o.code, 2) << o.err;
  const auto err = lines(o.err);
  EXPECT_GE(err.size(), 2u) << o.err;
  bool tp = false, unknown = false;
  for (const auto& l : err) {
    EXPECT_EQ(l.rfind("error: ", 0), 0u) << l;
    EXPECT_NE(l.find(bad.string()), std::string::npos) << "names the file: " << l;
    tp = tp || l.find("layout.tp") != std::string::npos;
    unknown = unknown || l.find("bogus_knob") != std::string::npos;
  }
  EXPECT_TRUE(tp) << "no line names layout.tp:\n" << o.err;
  EXPECT_TRUE(unknown) << "no line names the unknown key:\n" << o.err;
}

TEST_F(Cli, SetOverridesAreValidated) {
  ASSERT_TRUE(fs::exists(kExample)) << kExample;
  const Outcome o = dtsim("run " + quote(kExample.string()) + " --set layout.tp=7");
  EXPECT_EQ(o.code, 2) << o.err;
  EXPECT_NE(o.err.find("error: "), std::string::npos);
  EXPECT_NE(o.err.find("layout.tp"), std::string::npos) << o.err;
}

// End to end: YAML -> plan -> SimGrid engine -> summary + JSON, as README's run command.
// Needs the real engine (sim/simgrid_engine.cpp); never disable it.
TEST_F(Cli, EndToEndRunWritesJson) {
  ASSERT_TRUE(fs::exists(kExample)) << kExample;
  const fs::path out = dir_ / "result.json";
  const Outcome o = dtsim("run " + quote(kExample.string()) + " --json " + quote(out.string()));
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("step time"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("MFU"), std::string::npos) << o.out;
  ASSERT_TRUE(fs::exists(out));
  const nlohmann::json j = nlohmann::json::parse(read(out));
  EXPECT_GT(j.at("step_time_s").get<double>(), 0.0);
  for (const char* k : {"experiment", "engine", "folded", "gpus", "simulated_ranks", "tokens_per_s", "mfu", "hfu",
                        "compute_s", "bubble_s", "optimizer_s", "comm", "stages", "engine_config"})
    EXPECT_TRUE(j.contains(k)) << k;
  // One stage entry per pipeline stage; every stage has the same number of GPUs.
  const YAML::Node pp = YAML::LoadFile(kExample.string())["layout"]["pp"];
  const int64_t stages = static_cast<int64_t>(j.at("stages").size());
  if (pp) {
    EXPECT_EQ(stages, pp.as<int64_t>());
  }
  ASSERT_GT(stages, 0);
  EXPECT_GT(j.at("gpus").get<int64_t>(), 0);
  EXPECT_EQ(j.at("gpus").get<int64_t>() % stages, 0);
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << "leftover " << e.path();

  // --quiet prints nothing; identical runs write identical JSON.
  const fs::path again = dir_ / "again.json";
  const Outcome q = dtsim("run " + quote(kExample.string()) + " --quiet --json " + quote(again.string()));
  ASSERT_EQ(q.code, 0) << q.err;
  EXPECT_EQ(q.out, "");
  EXPECT_EQ(read(again), read(out));
}

}  // namespace
}  // namespace dtsim
