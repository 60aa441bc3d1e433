#include "models/path_problem.hpp"

#include <filesystem>
#include <fstream>
#include <system_error>

namespace dtsim {

std::optional<std::string> input_path_problem(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    if (ec == std::errc::too_many_symbolic_link_levels) return "a symlink loop (too many levels of symbolic links)";
    std::error_code lec;
    if (fs::is_symlink(fs::symlink_status(path, lec))) return "a dangling symlink (its target does not exist)";
    if (!ec || ec == std::errc::no_such_file_or_directory) return "no such file";
    if (ec == std::errc::permission_denied) return "permission denied";
    if (ec == std::errc::not_a_directory) return "no such file (a component of the path is not a directory)";
    return ec.message();
  }
  if (fs::is_directory(st)) return "a directory, not a file";
  if (!fs::is_regular_file(st)) return "not a regular file";
  std::ifstream in(path, std::ios::binary);
  if (!in) return "permission denied or unreadable";
  return std::nullopt;
}

}  // namespace dtsim
