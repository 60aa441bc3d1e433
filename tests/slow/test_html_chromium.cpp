// The HTML reports in a real browser: Debian's chromium (installed with apt-get when missing)
// renders the sweep, compare and plan reports headless and offline; the page's own check
// (reports/html.hpp) must find every chart drawn with a non-empty extent, the browser must log
// no console message (a script error or a blocked fetch would be one), and a screenshot is
// saved next to the test binary. Skipped, with the reason, only when chromium cannot be
// installed.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

namespace dtsim {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int sh(const std::string& cmd) {
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string find_chromium() {
  for (const char* name : {"chromium", "chromium-browser"})
    if (sh(std::string("command -v ") + name + " >/dev/null 2>&1") == 0) return name;
  return "";
}

/// chromium on PATH, installing Debian's package when it is missing. Empty + `why` on failure.
std::string ensure_chromium(std::string& why) {
  std::string c = find_chromium();
  if (!c.empty()) return c;
  if (::geteuid() != 0) {
    why = "chromium is not installed and installing it needs root (apt-get install -y chromium)";
    return "";
  }
  const std::string log = (fs::temp_directory_path() / "dtsim-chromium-apt.log").string();
  if (sh("DEBIAN_FRONTEND=noninteractive apt-get install -y chromium >" + log + " 2>&1") != 0)
    sh("(apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium) >>" + log + " 2>&1");
  c = find_chromium();
  if (c.empty()) why = "apt-get install -y chromium failed (see " + log + ")";
  return c;
}

class Chromium : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "dtsim-chromium-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  /// Renders `html` headless; returns the DOM after load and the browser's log.
  void render(const std::string& browser, const fs::path& html, const fs::path& png, std::string& dom,
              std::string& log) {
    const std::string flags =
        " --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update"
        " --disable-sync --no-first-run --enable-logging=stderr --v=0 --virtual-time-budget=3000";
    const fs::path profile1 = dir_ / "profile-dom", profile2 = dir_ / "profile-shot";
    const fs::path dom_file = dir_ / "dom.html", log_file = dir_ / "chromium.log";
    const std::string url = "file://" + fs::absolute(html).string();
    ASSERT_EQ(sh("timeout 120 " + browser + flags + " --user-data-dir=" + profile1.string() + " --dump-dom '" + url +
                 "' >" + dom_file.string() + " 2>" + log_file.string()),
              0)
        << read(log_file);
    dom = read(dom_file);
    log = read(log_file);
    ASSERT_EQ(sh("timeout 120 " + browser + flags + " --user-data-dir=" + profile2.string() +
                 " --window-size=1280,2400 --screenshot=" + png.string() + " '" + url + "' >/dev/null 2>&1"),
              0);
  }

  fs::path dir_;
};

TEST_F(Chromium, ReportsRenderWithEveryChartDrawn) {
  std::string why;
  const std::string browser = ensure_chromium(why);
  if (browser.empty()) GTEST_SKIP() << "cannot run the browser check: " << why;

  const fs::path src = fs::path(DTSIM_SOURCE_DIR) / "experiments" / "sweeps";
  const std::string bin = DTSIM_BINARY;
  ASSERT_EQ(sh(bin + " sweep " + (src / "gpt-2.7b-32-a100.yaml").string() + " -q -o " + (dir_ / "sweep").string()), 0);
  ASSERT_EQ(sh(bin + " compare " + (src / "compare-llama3-8b-nodes.yaml").string() + " -q -o " + (dir_ / "compare").string()), 0);
  ASSERT_EQ(sh(bin + " plan " + (src / "plan-llama3-70b.yaml").string() + " -q -o " + (dir_ / "plan").string()), 0);

  const fs::path shots = fs::path(bin).parent_path();
  for (const char* kind : {"sweep", "compare", "plan"}) {
    std::string dom, log;
    const fs::path png = shots / (std::string("report_screenshot_") + kind + ".png");
    render(browser, dir_ / kind / "report.html", png, dom, log);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(dom, m, std::regex("data-charts-drawn=\"([0-9]+)/([0-9]+)\"")))
        << kind << ": the page's check did not run";
    EXPECT_EQ(m[1].str(), m[2].str()) << kind << ": some charts drew nothing";
    EXPECT_GE(std::stoi(m[2].str()), 4) << kind;
    EXPECT_FALSE(std::regex_search(dom, std::regex("<body[^>]*data-js-errors="))) << kind << ": script errors";
    // Any console message (script error, CSP-blocked fetch) is a failure: the page logs none.
    EXPECT_EQ(log.find(":CONSOLE("), std::string::npos) << kind << ":\n" << log;
    ASSERT_TRUE(fs::exists(png)) << png;
    EXPECT_GT(fs::file_size(png), 10000u) << png;  // a blank 1280x2400 PNG compresses far below this
    std::cout << "screenshot: " << png.string() << "\n";
  }
}

}  // namespace
}  // namespace dtsim
