#include "sim/child_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

namespace dtsim {

namespace {

/// Threads of this process (Linux: field 20 of /proc/self/stat, proc(5)); -1 when unknown.
int threads_in_process() {
  std::ifstream in("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return -1;
  std::istringstream fields(stat.substr(close + 1));
  std::string f;
  for (int i = 3; i <= 20 && fields >> f; ++i)
    if (i == 20) return std::atoi(f.c_str());
  return -1;
}

/// Throws std::logic_error unless this process has one thread. A thread that was just
/// joined can still be counted for a moment (the kernel wakes the joiner before it
/// releases the task), so a count above 1 is looked at again for about 0.1 s.
void require_single_thread(const std::string& what) {
  int n = threads_in_process();
  for (int tries = 0; n > 1 && tries < 100; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    n = threads_in_process();
  }
  if (n > 1)
    throw std::logic_error(what + ": refusing to fork() a simulation child from a process with " + std::to_string(n) +
                           " threads (its child could deadlock on a lock another thread held; "
                           "sim/child_process.hpp)");
}

struct Child {
  size_t index;
  pid_t pid;
  int fd;  // read end of the child's pipe
  std::string text;
};

/// Forks a child that runs `work` and writes its text (or "!" and the message of what it
/// threw, exit code 1) to a pipe.
Child fork_child(size_t index, const std::function<std::string()>& work, const std::string& what) {
  require_single_thread(what);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error(what + ": pipe() failed");
  std::fflush(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    throw std::runtime_error(what + ": fork() failed");
  }
  if (pid == 0) {
    // Die with the thread that forked us (and if it is already gone, now).
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    // Keep 0-2 and the pipe (as descriptor 3); close the rest: the other children's pipes,
    // and a sweep's flock on its output directory, which must end with the sweep.
    int out = fds[1];
    if (out != 3) {
      out = dup2(fds[1], 3);
      if (out < 0) _exit(1);
    }
    if (fds[0] != 3) close(fds[0]);
    close_range(4, ~0U, 0);  // Linux 5.9; where it fails the descriptors stay open, as before
    int code = 0;
    std::string text;
    try {
      text = work();
    } catch (const std::exception& ex) {
      text = std::string("!") + ex.what();
      code = 1;
    } catch (...) {  // never unwind into the parent's code in the child
      text = "!an exception that is not a std::exception";
      code = 1;
    }
    size_t off = 0;
    while (off < text.size()) {
      const ssize_t w = write(out, text.data() + off, text.size() - off);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;
      off += static_cast<size_t>(w);
    }
    close(out);
    _exit(code);
  }
  close(fds[1]);
  return Child{index, pid, fds[0], {}};
}

/// Reaps a child whose pipe reached end of file and turns its exit into a result.
ChildResult finish(Child& c, const std::string& what) {
  close(c.fd);
  int status = 0;
  while (waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
  }
  const std::string& text = c.text;
  const bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0 || (!text.empty() && text[0] == '!');
  ChildResult r;
  if (failed)
    r.error = std::make_exception_ptr(std::runtime_error(
        what + " child failed: " + (text.empty() || text[0] != '!' ? std::string("no result") : text.substr(1))));
  else
    r.text = std::move(c.text);
  return r;
}

void kill_all(std::vector<Child>& live) {
  for (auto& c : live) kill(c.pid, SIGKILL);
  for (auto& c : live) {
    close(c.fd);
    while (waitpid(c.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  live.clear();
}

}  // namespace

void run_in_children(size_t count, int jobs, const std::function<std::function<std::string()>(size_t)>& prepare,
                     const std::function<void(size_t, ChildResult&&)>& done, const std::string& what) {
  const size_t most = static_cast<size_t>(std::max(1, jobs));
  std::vector<Child> live;
  size_t next = 0;
  try {
    while (next < count || !live.empty()) {
      while (next < count && live.size() < most) {
        const size_t i = next++;
        std::function<std::string()> work;
        try {
          work = prepare(i);
        } catch (...) {
          done(i, ChildResult{{}, std::current_exception()});
          continue;
        }
        live.push_back(fork_child(i, work, what));
      }
      if (live.empty()) continue;
      std::vector<pollfd> fds;
      for (const auto& c : live) fds.push_back({c.fd, POLLIN, 0});
      if (poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        throw std::runtime_error(what + ": poll() failed");
      }
      char buf[65536];
      std::vector<size_t> ended;  // positions in `live`, ascending
      for (size_t k = 0; k < fds.size(); ++k) {
        if (fds[k].revents == 0) continue;
        const ssize_t r = read(live[k].fd, buf, sizeof buf);
        if (r > 0) live[k].text.append(buf, static_cast<size_t>(r));
        else if (r == 0 || errno != EINTR) ended.push_back(k);
      }
      for (size_t e = ended.size(); e-- > 0;) {
        Child c = std::move(live[ended[e]]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(ended[e]));
        ChildResult res = finish(c, what);
        done(c.index, std::move(res));
      }
    }
  } catch (...) {
    kill_all(live);
    throw;
  }
}

std::string run_in_child(const std::function<std::string()>& work, const std::string& what) {
  ChildResult out;
  run_in_children(
      1, 1, [&](size_t) { return work; }, [&](size_t, ChildResult&& r) { out = std::move(r); }, what);
  if (out.error) std::rethrow_exception(out.error);
  return out.text;
}

}  // namespace dtsim
