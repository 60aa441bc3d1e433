#pragma once
// Writing output files so that a reader never sees a half-written one.
#include <string>

namespace dtsim {

/// Writes `content` to `path` atomically: the bytes go to a temporary file in the same
/// directory, which is flushed to disk (fsync) and then renamed over `path`. Either the
/// old file (or none) or the complete new file exists at every moment; the temporary
/// file is removed on failure. Throws std::runtime_error naming `path` and the reason.
void write_file_atomic(const std::string& path, const std::string& content);

}  // namespace dtsim
