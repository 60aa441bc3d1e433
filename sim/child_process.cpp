#include "sim/child_process.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <stdexcept>

namespace dtsim {

std::string run_in_child(const std::function<std::string()>& work, const std::string& what) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error(what + ": pipe() failed");
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    throw std::runtime_error(what + ": fork() failed");
  }
  if (pid == 0) {
    close(fds[0]);
    int code = 0;
    std::string text;
    try {
      text = work();
    } catch (const std::exception& ex) {
      text = std::string("!") + ex.what();
      code = 1;
    }
    size_t off = 0;
    while (off < text.size()) {
      const ssize_t w = write(fds[1], text.data() + off, text.size() - off);
      if (w <= 0) break;
      off += static_cast<size_t>(w);
    }
    close(fds[1]);
    _exit(code);
  }
  close(fds[1]);
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t r = read(fds[0], buf, sizeof buf);
    if (r <= 0) break;
    text.append(buf, static_cast<size_t>(r));
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  const bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0 || (!text.empty() && text[0] == '!');
  if (failed)
    throw std::runtime_error(what + " child failed: " +
                             (text.empty() || text[0] != '!' ? std::string("no result") : text.substr(1)));
  return text;
}

}  // namespace dtsim
