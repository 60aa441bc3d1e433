#pragma once
// Writing output files so that a reader never sees a half-written one, and so that an
// output path never destroys anything. One rule for every file dtsim writes (--json,
// --trace, calibrate --out, every file under sweep / compare / plan / merge -o DIR):
//  - "-" is standard output, where the option allows it (otherwise refused);
//  - a new path is created; missing parent directories are created first;
//  - an existing regular file is replaced atomically (a temporary file in the same
//    directory, fsync, rename) and keeps its permission bits;
//  - a symbolic link is written THROUGH: the regular file it finally points to is replaced
//    (the link stays a link); a dangling link, or one to anything but a regular file, is
//    refused;
//  - a directory, character or block device (e.g. /dev/null), FIFO or socket is refused
//    and left untouched;
//  - a file this command read as input (models/input_files.hpp: same device and inode,
//    hard links included) is refused.
// Refusals throw InputError "FLAG PATH: ..." (exit code 2, like other bad paths on the
// command line); failures of the write itself (disk full, permissions) throw
// std::runtime_error naming the path (exit code 1).
#include <functional>
#include <string>
#include <vector>
#include <string_view>

namespace dtsim {

/// Where an output goes once the rule above accepted it.
struct OutputTarget {
  bool to_stdout = false;
  std::string path;  // the file that will be replaced or created (a symlink resolved)
  bool exists = false;
};

/// Applies the rule to `path` without writing anything (parents are not created yet), so
/// that a command can refuse a bad path before a long run. `flag` names the option in
/// messages ("--json"); empty for files inside an output directory.
OutputTarget check_output_file(const std::string& path, const std::string& flag = "", bool allow_stdout = false);

/// Checks `path` with check_output_file, creates missing parent directories and writes
/// `content` atomically (or to standard output for "-" where allowed).
void write_output_file(const std::string& path, const std::string& content, const std::string& flag = "",
                       bool allow_stdout = false);

/// write_output_file(path, content) without a flag and without "-": the bytes go to a
/// temporary file in the target's directory, flushed to disk (fsync) and renamed over it;
/// either the old file (or none) or the complete new file exists at every moment.
void write_file_atomic(const std::string& path, const std::string& content);

/// write_file_atomic for content made in pieces: `fill` is called once with `put`, which
/// writes each piece to the temporary file as it comes (so a large output need not be held
/// whole in memory); the file is then flushed and renamed over `path` as above. An exception
/// from `fill` leaves `path` as it was.
void write_file_atomic_streamed(const std::string& path,
                                const std::function<void(const std::function<void(std::string_view)>& put)>& fill);

/// The rule for an output directory (-o DIR): "-" is refused; an existing path must be a
/// directory (a symlink to one is followed); a missing one is created with its parents.
/// Throws InputError naming `flag` and `dir`. `files`: the names the command will write
/// there, each checked with check_output_file now (an input file, FIFO or device of that
/// name is refused before the work starts, not when its turn to be written comes).
void prepare_output_dir(const std::string& dir, const std::string& flag, const std::vector<std::string>& files = {});

/// Removes the temporary files a killed write of one of `files` left in `dir` (the hidden
/// ".NAME.tmp.XXXXXX" of write_file_atomic, never renamed over NAME); returns how many.
int remove_stale_temporaries(const std::string& dir, const std::vector<std::string>& files);

}  // namespace dtsim
