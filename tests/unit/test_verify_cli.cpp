// `dtsim verify` run as a user would: exit codes, report text, JSON, injections.
// DTSIM_BINARY and DTSIM_SOURCE_DIR are absolute paths set by tests/CMakeLists.txt.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/unit/cli_fixture.hpp"

namespace dtsim {
namespace {

namespace fs = std::filesystem;

// DP 32, TP 1, PP 1, tied embeddings: a layout without any open plan gap.
const fs::path kExp = fs::path(DTSIM_SOURCE_DIR) / "experiments" / "validation" / "narayanan-gpt-1.7b.yaml";

using cli_test::Outcome;
std::string read(const fs::path& p) { return cli_test::read_file(p); }

class VerifyCli : public cli_test::CliTest {
 protected:
  VerifyCli() : CliTest("dtsim-verify") {}
};

TEST_F(VerifyCli, PassingLayoutExitsZeroWithEveryRule) {
  const Outcome o = dtsim("verify '" + kExp.string() + "'");
  EXPECT_EQ(o.code, 0) << o.out << o.err;
  for (const char* s : {"loss", "DP", "TP", "CP", "PP", "ZeRO", "plan", "verdict: PASS", "(32 ranks)"})
    EXPECT_NE(o.out.find(s), std::string::npos) << s << " missing in:\n" << o.out;
}

TEST_F(VerifyCli, ThreadCountDoesNotChangeTheReport) {
  // PP 8, TP 8: the stages run on several threads; the JSON report is byte for byte the
  // one of a single thread.
  const fs::path exp = fs::path(DTSIM_SOURCE_DIR) / "experiments" / "gpt3-175b-selective.yaml";
  const fs::path one = dir_ / "one.json", two = dir_ / "two.json";
  const Outcome a = dtsim("verify '" + exp.string() + "' --steps 2 --threads 1 -q --json '" + one.string() + "'");
  const Outcome b = dtsim("verify '" + exp.string() + "' --steps 2 --threads 2 -q --json '" + two.string() + "'");
  EXPECT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(b.code, 0) << b.err;
  EXPECT_FALSE(read(one).empty());
  EXPECT_EQ(read(one), read(two));
}

TEST_F(VerifyCli, InjectedBugIsDetectedWithExitThree) {
  const Outcome o = dtsim("verify '" + kExp.string() + "' --inject dp-local-mean");
  EXPECT_EQ(o.code, 3) << o.out << o.err;
  EXPECT_NE(o.out.find("injected bug dp-local-mean was detected"), std::string::npos) << o.out;
}

TEST_F(VerifyCli, BugThatCannotShowAndUnknownBugAreInputErrors) {
  const Outcome cp = dtsim("verify '" + kExp.string() + "' --inject cp-loss-scale");
  EXPECT_EQ(cp.code, 2);
  EXPECT_NE(cp.err.find("error: "), std::string::npos);
  EXPECT_NE(cp.err.find("layout.cp > 1"), std::string::npos) << cp.err;
  const Outcome bad = dtsim("verify '" + kExp.string() + "' --inject frobnicate");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("tp-grad-avg"), std::string::npos) << "lists the valid bugs: " << bad.err;
}

TEST_F(VerifyCli, JsonHoldsEveryRule) {
  const fs::path j = dir_ / "v.json";
  const Outcome o = dtsim("verify '" + kExp.string() + "' --quiet --steps 2 --json '" + j.string() + "'");
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_TRUE(o.out.empty()) << o.out;
  const auto doc = nlohmann::json::parse(read(j));
  EXPECT_TRUE(doc.at("passed").get<bool>());
  EXPECT_EQ(doc.at("steps").get<int>(), 2);
  EXPECT_EQ(doc.at("world").get<int>(), 32);
  EXPECT_EQ(doc.at("rules").size(), 7u);
  for (const auto& r : doc.at("rules")) {
    EXPECT_TRUE(r.at("passed").get<bool>() || !r.at("applicable").get<bool>()) << r.dump();
    EXPECT_LE(r.at("max_abs_error").get<double>(), r.at("tolerance").get<double>() + 0.0) << r.dump();
  }
}

TEST_F(VerifyCli, SetOverridesTheLayout) {
  const Outcome o = dtsim("verify '" + kExp.string() + "' --set layout.dp=16 --set cluster.nodes=2 --steps 1");
  EXPECT_EQ(o.code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("(16 ranks)"), std::string::npos) << o.out;
}

}  // namespace
}  // namespace dtsim
