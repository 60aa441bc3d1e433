#pragma once
// Why an input path cannot be read as a file, in words ("symlink loop", "no such file", ...),
// for the readers' error messages.
#include <optional>
#include <string>

namespace dtsim {

/// std::nullopt when `path` is a regular file that can be opened for reading; otherwise
/// what is wrong: "no such file", "a dangling symlink (its target does not exist)", "a
/// symlink loop (too many levels of symbolic links)", "a directory, not a file", "not a
/// regular file", "permission denied", or the system's message.
std::optional<std::string> input_path_problem(const std::string& path);

}  // namespace dtsim
