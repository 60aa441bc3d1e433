#include "reports/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <vector>

#include "models/errors.hpp"
#include "models/input_files.hpp"

namespace dtsim {

namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& path, const std::string& what, int err) {
  throw std::runtime_error("cannot write " + path + ": " + what + ": " + std::strerror(err));
}

/// "--json out.json" or "out.json".
std::string named(const std::string& flag, const std::string& path) {
  return flag.empty() ? path : flag + " " + path;
}

[[noreturn]] void refuse(const std::string& flag, const std::string& path, const std::string& why) {
  throw InputError(named(flag, path) + ": refusing to write: " + why);
}

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISLNK(m)) return "a symbolic link";
  if (S_ISREG(m)) return "a regular file";
  return "not a regular file";
}

/// The nearest existing ancestor of `p` must be a directory (so the parents can be made).
void check_parents(const std::string& flag, const std::string& path, const fs::path& p) {
  fs::path dir = p.parent_path();
  while (!dir.empty()) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) refuse(flag, path, dir.string() + " is " + kind_of(st.st_mode) + ", not a directory");
      return;
    }
    if (errno != ENOENT && errno != ENOTDIR) return;  // the write reports permission problems itself
    if (dir == dir.parent_path()) return;
    dir = dir.parent_path();
  }
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

/// Writes what `fill` puts over `path` (a regular file or a new name) by temporary file + rename.
void replace_atomically(const std::string& shown, const std::string& path,
                        const std::function<void(const std::function<void(std::string_view)>&)>& fill) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  // mkstemp needs a writable, NUL-terminated template.
  std::string name = ".";  // hidden: ".result.json.tmp.Ab12Cd"
  name += target.filename().string();
  name += ".tmp.XXXXXX";
  const std::string tmpl = (dir / name).string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  int fd = ::mkstemp(buf.data());
  if (fd < 0) fail(shown, "cannot create a temporary file in " + dir.string(), errno);
  TempFile tmp(fd, std::string(buf.data()));

  // mkstemp creates 0600: keep the replaced file's permission bits, else the usual
  // permissions of a new file (0666 minus umask).
  struct stat old {};
  mode_t mode = 0;
  if (::stat(path.c_str(), &old) == 0 && S_ISREG(old.st_mode)) {
    mode = old.st_mode & 07777;
  } else {
    const mode_t mask = ::umask(0);
    ::umask(mask);
    mode = 0666 & ~mask;
  }
  ::fchmod(tmp.fd(), mode);

  fill([&](std::string_view piece) {
    const char* p = piece.data();
    size_t left = piece.size();
    while (left > 0) {
      ssize_t n = ::write(tmp.fd(), p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        fail(shown, "write failed", errno);
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
  });
  if (::fsync(tmp.fd()) != 0) fail(shown, "fsync failed", errno);
  if (int err = tmp.close(); err != 0) fail(shown, "close failed", err);
  if (::rename(tmp.name().c_str(), path.c_str()) != 0) fail(shown, "rename failed", errno);
  tmp.release();

  // Make the rename itself durable; failure here does not un-write the file.
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

/// The missing parent directories of a new output file `t` (`shown` names it in errors).
void create_parents(const OutputTarget& t, const std::string& shown) {
  if (t.exists) return;
  const fs::path dir = fs::path(t.path).parent_path();
  if (dir.empty()) return;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec && !fs::is_directory(dir))
    throw std::runtime_error("cannot write " + shown + ": cannot create the directory " + dir.string() + ": " +
                             ec.message());
}

}  // namespace

OutputTarget check_output_file(const std::string& path, const std::string& flag, bool allow_stdout) {
  if (path.empty()) throw InputError((flag.empty() ? std::string("output") : flag) + ": empty file name");
  OutputTarget t;
  if (path == "-") {
    if (!allow_stdout) refuse(flag, path, "standard output is not allowed here (give a file name)");
    t.to_stdout = true;
    return t;
  }
  const fs::path given(path);
  if (given.filename().empty() || given.filename() == "." || given.filename() == "..")
    refuse(flag, path, "not a file name");
  struct stat lst {};
  if (::lstat(path.c_str(), &lst) != 0) {
    // A missing name (or a parent that is not a directory: reported here); other errors,
    // e.g. an unreadable parent, are reported by the write itself.
    if (errno == ENOENT || errno == ENOTDIR) check_parents(flag, path, given);
    t.path = path;
    return t;
  }
  struct stat st = lst;
  t.path = path;
  if (S_ISLNK(lst.st_mode)) {
    if (::stat(path.c_str(), &st) != 0)
      refuse(flag, path, "a symbolic link to a missing file (dtsim writes through links, to regular files only)");
    if (!S_ISREG(st.st_mode))
      refuse(flag, path, std::string("a symbolic link to ") + kind_of(st.st_mode) +
                             " (dtsim writes through links, to regular files only)");
    std::error_code ec;
    const fs::path real = fs::canonical(given, ec);
    if (ec) refuse(flag, path, "cannot resolve the symbolic link: " + ec.message());
    t.path = real.string();
  } else if (!S_ISREG(st.st_mode)) {
    refuse(flag, path, std::string(kind_of(st.st_mode)) + " (dtsim writes only regular files or new paths)");
  }
  t.exists = true;
  if (auto in = input_file_at(static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)))
    refuse(flag, path, "it is the input file " + *in + " of this command");
  return t;
}

void write_output_file(const std::string& path, const std::string& content, const std::string& flag,
                       bool allow_stdout) {
  const OutputTarget t = check_output_file(path, flag, allow_stdout);
  if (t.to_stdout) {
    std::cout << content << std::flush;
    if (!std::cout) throw std::runtime_error("cannot write " + named(flag, "-") + ": standard output failed");
    return;
  }
  create_parents(t, named(flag, path));
  replace_atomically(named(flag, path), t.path, [&](const std::function<void(std::string_view)>& put) { put(content); });
}

void write_file_atomic(const std::string& path, const std::string& content) { write_output_file(path, content); }

void write_file_atomic_streamed(const std::string& path,
                                const std::function<void(const std::function<void(std::string_view)>& put)>& fill) {
  const OutputTarget t = check_output_file(path);  // as write_file_atomic: no flag, no "-"
  create_parents(t, path);
  replace_atomically(path, t.path, fill);
}

int remove_stale_temporaries(const std::string& dir, const std::vector<std::string>& files) {
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    for (const auto& f : files) {
      const std::string prefix = "." + f + ".tmp.";
      // write_file_atomic's name: the prefix and mkstemp's six characters.
      if (name.size() == prefix.size() + 6 && name.compare(0, prefix.size(), prefix) == 0 &&
          entry.is_regular_file(ec) && fs::remove(entry.path(), ec))
        ++removed;
    }
  }
  return removed;
}

void prepare_output_dir(const std::string& dir, const std::string& flag, const std::vector<std::string>& files) {
  if (dir.empty()) throw InputError(flag + ": empty directory name");
  if (dir == "-") throw InputError(flag + " -: an output directory is needed here, not standard output");
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {  // follows a symlink to a directory
    if (!S_ISDIR(st.st_mode))
      throw InputError(flag + " " + dir + ": refusing to write: " + kind_of(st.st_mode) + ", not a directory");
    for (const auto& name : files) check_output_file((fs::path(dir) / name).string());
    return;
  }
  struct stat lst {};
  if (::lstat(dir.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode))
    throw InputError(flag + " " + dir + ": refusing to write: a symbolic link to a missing directory");
  check_parents(flag, dir, fs::path(dir) / "x");  // dir's own ancestors
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec))
    throw InputError(flag + " " + dir + ": cannot create the directory" + (ec ? ": " + ec.message() : std::string()));
}

}  // namespace dtsim
