#pragma once
// The sweep journal: OUT/journal.jsonl, one JSON value per line, appended as results arrive
// (and mirrored to OUT/results.csv). The first line is a header object naming the sweep
// file, its fingerprint and the shard; every other line is one SweepRow. Lines are written
// whole, a batch (up to 512 rows or 0.25 s of them) with one write(2), so a killed sweep
// leaves complete lines plus at most one partial last line, which --resume cuts off before
// it continues: no row is lost (what is not in the journal is computed again) and none is
// duplicated (what is in it is skipped).
//
// Formats ("dtsim_sweep_journal" in the header):
//   2 (written now): each row is a compact record, a JSON array of the header's "columns"
//     (sim/sweep/row_format.hpp: shortest round-trip doubles, so resumed rows are the
//     computed ones bit for bit);
//   1 (dtsim before it): each row is the object to_json(row). Still read by --resume (which
//     rewrites the journal as format 2 before appending) and by dtsim merge.
// Any other format is refused with the file and the format named.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/sweep_spec.hpp"

namespace dtsim::sweep {

struct JournalHeader {
  std::string spec_path;     // absolute path of the sweep file
  std::string spec_name;     // the sweep file as the command line named it (SweepSpec::source), which
                             // the outputs print; a journal without it: spec_path
  std::string fingerprint;   // SweepSpec::fingerprint
  int64_t shard_index = 0, shard_count = 1;
  int64_t points = 0;        // points of this shard
  int64_t refine_top = 0;
  std::string rank_by;
  int format = 2;            // of a journal read (kJournalFormat for one written)
};

/// The journal format written (see above).
inline constexpr int kJournalFormat = 2;

nlohmann::json to_json(const SweepRow& r);
/// Throws std::runtime_error on a malformed row.
SweepRow row_from_json(const nlohmann::json& j);

/// Reads OUT/journal.jsonl: the header and every complete row. `truncate_partial` cuts a
/// partial last line off the file. Throws InputError when the file is not a sweep journal.
struct JournalContents {
  JournalHeader header;
  std::vector<SweepRow> rows;  // in file order
};
JournalContents read_journal(const std::string& path, bool truncate_partial);

/// Appends rows to OUT/journal.jsonl and OUT/results.csv.
class JournalWriter {
 public:
  /// Creates both files (header lines) or, with `resume`, opens existing ones for appending
  /// after rewriting results.csv from `existing` (so both agree after a kill). A resumed
  /// journal of an older format is first rewritten (atomically) as `h` and `existing` in
  /// the current one.
  JournalWriter(const std::string& dir, const JournalHeader& h, bool resume, const std::vector<SweepRow>& existing,
                int existing_format = kJournalFormat);
  ~JournalWriter();
  JournalWriter(const JournalWriter&) = delete;
  JournalWriter& operator=(const JournalWriter&) = delete;
  /// Buffers a row; flush() writes the buffer (also every 512 rows).
  void add(const SweepRow& r);
  /// The same with the row's results.csv line (sweep_csv_line(r)) already formatted.
  void add(const SweepRow& r, const std::string& csv_line);
  void flush();

 private:
  int json_fd_ = -1, csv_fd_ = -1;
  std::string json_buf_, csv_buf_;
  int64_t buffered_ = 0;
  std::string dir_;
};

/// The header line of a journal written now (format kJournalFormat, with its columns).
std::string header_line(const JournalHeader& h);

/// An exclusive lock on a sweep's output directory: flock(2) on DIR/sweep.lock, held from
/// before the journal is looked at until the last output is written, so that a second
/// `dtsim sweep` into the same directory (with or without --resume) is refused instead of
/// appending every row twice. The kernel releases a flock when its holder dies, so a killed
/// sweep leaves no stale lock (the file itself stays; it holds the last holder's pid).
class DirLock {
 public:
  /// Throws std::runtime_error naming `dir` (and the holder's pid when the file has it) when
  /// another process holds the lock, or when the lock file cannot be opened.
  explicit DirLock(const std::string& dir);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  /// DIR/sweep.lock.
  static std::string path_in(const std::string& dir);

 private:
  int fd_ = -1;
};

}  // namespace dtsim::sweep
