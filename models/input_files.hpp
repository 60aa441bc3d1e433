#pragma once
// The files the running command has read as input (the experiment, a sweep / compare / plan
// file, a Hugging Face config.json, a compute profile), so that no output is ever written
// over one of them (reports/atomic_file.hpp refuses such a path). Process-wide and
// thread-safe; a recorded file that was since removed or replaced no longer counts.
#include <cstdint>
#include <optional>
#include <string>

namespace dtsim {

/// Records `path` (as given) with its device and inode; does nothing when it cannot be
/// stat()ed (the reader reports that itself).
void note_input_file(const std::string& path);

/// The recorded path of an input that is the same file (st_dev, st_ino) as `dev`/`ino`,
/// provided that path still names that file; std::nullopt otherwise.
std::optional<std::string> input_file_at(uint64_t dev, uint64_t ino);

}  // namespace dtsim
