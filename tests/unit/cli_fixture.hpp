#pragma once
// Runs the dtsim binary as a user would, for the CLI tests: a fresh temporary directory per
// test, the command line through the shell, stdout and stderr captured. DTSIM_BINARY is
// the absolute path set by tests/CMakeLists.txt.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace dtsim::cli_test {

namespace fs = std::filesystem;

struct Outcome {
  int code = -1;  // exit status, -1 when the process did not exit normally
  std::string out, err;
};

/// `s` single-quoted for the shell.
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// The whole file (empty when it cannot be read).
inline std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Base fixture: dir_ is a fresh directory named after `prefix`, removed after the test.
class CliTest : public ::testing::Test {
 protected:
  explicit CliTest(std::string prefix = "dtsim-cli") : prefix_(std::move(prefix)) {}
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / (prefix_ + "-XXXXXX")).string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  /// `dtsim ARGS` (ARGS as a shell would split them).
  Outcome dtsim(const std::string& args) const {
    const fs::path out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    const std::string cmd = shell_quote(DTSIM_BINARY) + " " + args + " >" + shell_quote(out.string()) + " 2>" +
                            shell_quote(err.string());
    const int status = std::system(cmd.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_file(out), read_file(err)};
  }

  std::string prefix_;
  fs::path dir_;
};

}  // namespace dtsim::cli_test
