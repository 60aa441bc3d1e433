// Simulation children (sim/child_process.hpp): results, failures, no fork from a
// multithreaded process, no inherited descriptors, no child outliving its parent.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "models/errors.hpp"
#include "sim/child_process.hpp"
#include "temp_dir.hpp"

namespace dtsim {
namespace {

std::string message(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  }
}

/// State of process `pid` from /proc/PID/stat ('Z' zombie, ...), or 'X' when it is gone.
char process_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = s.rfind(')');
  return close == std::string::npos || close + 2 >= s.size() ? 'X' : s[close + 2];
}

TEST(ChildProcess, EveryPieceRunsOnceInAChildOfItsOwn) {
  std::map<size_t, std::string> got;
  const std::string self = std::to_string(::getpid());
  run_in_children(
      7, 3, [](size_t i) { return [i] { return std::to_string(i * i) + " " + std::to_string(::getpid()); }; },
      [&](size_t i, ChildResult&& r) {
        ASSERT_FALSE(r.error) << message(r.error);
        EXPECT_TRUE(got.emplace(i, r.text).second) << "piece " << i << " reported twice";
      },
      "test");
  ASSERT_EQ(got.size(), 7u);
  std::set<std::string> pids;
  for (const auto& [i, text] : got) {
    const auto space = text.find(' ');
    EXPECT_EQ(text.substr(0, space), std::to_string(i * i));
    EXPECT_NE(text.substr(space + 1), self);
    pids.insert(text.substr(space + 1));
  }
  EXPECT_EQ(pids.size(), 7u);
}

TEST(ChildProcess, FailuresComeBackAsTheErrorsRunInChildThrows) {
  std::map<size_t, std::exception_ptr> errors;
  std::map<size_t, std::string> texts;
  run_in_children(
      5, 2,
      [](size_t i) -> std::function<std::string()> {
        if (i == 4) throw InputError("layout.tp: bad");  // in this process: no child
        return [i]() -> std::string {
          if (i == 1) throw std::runtime_error("boom");
          if (i == 2) ::_exit(3);
          if (i == 3) ::raise(SIGKILL);
          return "fine";
        };
      },
      [&](size_t i, ChildResult&& r) {
        if (r.error) errors[i] = r.error;
        else texts[i] = r.text;
      },
      "piece");
  EXPECT_EQ(texts, (std::map<size_t, std::string>{{0, "fine"}}));
  ASSERT_EQ(errors.size(), 4u);
  EXPECT_EQ(message(errors[1]), "piece child failed: boom");
  EXPECT_EQ(message(errors[2]), "piece child failed: no result");
  EXPECT_EQ(message(errors[3]), "piece child failed: no result");
  EXPECT_THROW(std::rethrow_exception(errors[4]), InputError);
  EXPECT_THROW(run_in_child([]() -> std::string { throw std::runtime_error("x"); }, "one"), std::runtime_error);
  EXPECT_EQ(run_in_child([] { return std::string(200000, 'a'); }, "big").size(), 200000u);  // > one pipe buffer
}

TEST(ChildProcess, NoForkWhileAnotherThreadRuns) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::thread t([&] {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return release; });
  });
  EXPECT_THROW(run_in_child([] { return std::string("x"); }, "threaded"), std::logic_error);
  {
    const std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  t.join();
  // Right after the join: the exiting thread may still be counted for a moment.
  EXPECT_EQ(run_in_child([] { return std::string("x"); }, "joined"), "x");
}

TEST(ChildProcess, ChildrenCloseWhatTheyInherit) {
  // A descriptor without O_CLOEXEC, as a sweep's flock on its output directory could be.
  // Above 3, the descriptor the child's pipe takes.
  const int low = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(low, 0);
  const int fd = ::fcntl(low, F_DUPFD, 10);
  ::close(low);
  ASSERT_GE(fd, 10);
  const std::string open_in_child =
      run_in_child([fd] { return std::string(::fcntl(fd, F_GETFD) == -1 ? "closed" : "open"); }, "fds");
  ::close(fd);
  EXPECT_EQ(open_in_child, "closed");
}

TEST(ChildProcess, AnExceptionFromDoneKillsTheOthers) {
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(run_in_children(
                   3, 3,
                   [](size_t i) {
                     return [i] {
                       if (i > 0) ::sleep(60);
                       return std::string("first");
                     };
                   },
                   [](size_t, ChildResult&&) { throw std::runtime_error("journal full"); }, "sleepers"),
               std::runtime_error);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1) << "a child was left behind";
}

TEST(ChildProcess, AChildDiesWithItsParent) {
  test_files::TempDir dir;
  const std::string pid_file = (dir.path() / "pid").string();
  std::fflush(nullptr);
  const pid_t parent = ::fork();  // stands for a sweep killed with SIGKILL
  ASSERT_GE(parent, 0);
  if (parent == 0) {
    try {
      run_in_child(
          [&] {
            std::ofstream(pid_file + ".tmp") << ::getpid();
            std::rename((pid_file + ".tmp").c_str(), pid_file.c_str());
            ::sleep(60);
            return std::string();
          },
          "sleeper");
    } catch (...) {
    }
    ::_exit(0);
  }
  pid_t child = 0;
  for (int i = 0; i < 3000 && child == 0; ++i) {
    std::ifstream in(pid_file);
    if (!(in >> child)) {
      child = 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ::kill(parent, SIGKILL);
  ::waitpid(parent, nullptr, 0);
  ASSERT_GT(child, 0) << "the simulation child never started";
  char state = process_state(child);
  for (int i = 0; i < 500 && state != 'X' && state != 'Z'; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    state = process_state(child);
  }
  EXPECT_TRUE(state == 'X' || state == 'Z') << "child " << child << " outlived its parent (state " << state << ")";
}

}  // namespace
}  // namespace dtsim
