#include "models/input_files.hpp"

#include <sys/stat.h>

#include <mutex>
#include <vector>

namespace dtsim {

namespace {

struct Input {
  std::string path;
  uint64_t dev = 0, ino = 0;
};

std::mutex& inputs_mutex() {
  static std::mutex mu;
  return mu;
}

std::vector<Input>& inputs() {
  static std::vector<Input> v;
  return v;
}

}  // namespace

void note_input_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;
  const uint64_t dev = static_cast<uint64_t>(st.st_dev), ino = static_cast<uint64_t>(st.st_ino);
  std::lock_guard<std::mutex> lock(inputs_mutex());
  for (const auto& in : inputs())
    if (in.dev == dev && in.ino == ino && in.path == path) return;
  inputs().push_back({path, dev, ino});
}

std::optional<std::string> input_file_at(uint64_t dev, uint64_t ino) {
  std::lock_guard<std::mutex> lock(inputs_mutex());
  for (const auto& in : inputs()) {
    if (in.dev != dev || in.ino != ino) continue;
    // The recorded path must still be that file: an inode freed by a removed input and
    // reused by a new file is not the input.
    struct stat st {};
    if (::stat(in.path.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_dev) == dev &&
        static_cast<uint64_t>(st.st_ino) == ino)
      return in.path;
  }
  return std::nullopt;
}

}  // namespace dtsim
