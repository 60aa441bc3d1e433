#include "reports/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <vector>

namespace dtsim {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what, int err) {
  throw std::runtime_error("cannot write " + path + ": " + what + ": " + std::strerror(err));
}

/// Closes the descriptor and removes the temporary file unless released.
class TempFile {
 public:
  TempFile(int fd, std::string name) : fd_(fd), name_(std::move(name)) {}
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!name_.empty()) ::unlink(name_.c_str());
  }
  int fd() const { return fd_; }
  /// Closes the descriptor; returns 0 or errno.
  int close() {
    int rc = ::close(fd_);
    fd_ = -1;
    return rc == 0 ? 0 : errno;
  }
  void release() { name_.clear(); }
  const std::string& name() const { return name_; }

 private:
  int fd_;
  std::string name_;
};

}  // namespace

void write_file_atomic(const std::string& path, const std::string& content) {
  if (path.empty()) throw std::runtime_error("cannot write file: empty path");
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (target.filename().empty()) throw std::runtime_error("cannot write " + path + ": not a file name");

  // mkstemp needs a writable, NUL-terminated template.
  std::string name = ".";  // hidden: ".result.json.tmp.Ab12Cd"
  name += target.filename().string();
  name += ".tmp.XXXXXX";
  const std::string tmpl = (dir / name).string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  int fd = ::mkstemp(buf.data());
  if (fd < 0) fail(path, "cannot create a temporary file in " + dir.string(), errno);
  TempFile tmp(fd, std::string(buf.data()));

  // mkstemp creates 0600; give the file the usual permissions (0666 minus umask).
  mode_t mask = ::umask(0);
  ::umask(mask);
  ::fchmod(tmp.fd(), 0666 & ~mask);

  const char* p = content.data();
  size_t left = content.size();
  while (left > 0) {
    ssize_t n = ::write(tmp.fd(), p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path, "write failed", errno);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(tmp.fd()) != 0) fail(path, "fsync failed", errno);
  if (int err = tmp.close(); err != 0) fail(path, "close failed", err);
  if (::rename(tmp.name().c_str(), path.c_str()) != 0) fail(path, "rename failed", errno);
  tmp.release();

  // Make the rename itself durable; failure here does not un-write the file.
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace dtsim
