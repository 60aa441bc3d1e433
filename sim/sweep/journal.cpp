#include "sim/sweep/journal.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <stdexcept>

#include "models/errors.hpp"
#include "models/schedules/schedule.hpp"
#include "reports/atomic_file.hpp"
#include "reports/csv.hpp"
#include "sim/sweep/row_format.hpp"

namespace dtsim::sweep {

namespace {

Recompute recompute_of(const std::string& s) {
  if (s == "selective") return Recompute::selective;
  if (s == "full") return Recompute::full;
  if (s == "none") return Recompute::none;
  throw std::runtime_error("bad recompute \"" + s + "\"");
}

Schedule schedule_of(const std::string& s) {
  if (const sched::PipelineSchedule* p = sched::find_schedule(s)) return p->id();
  throw std::runtime_error("bad schedule \"" + s + "\"");
}

void write_all(int fd, const std::string& data, const std::string& what) {
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t w = ::write(fd, data.data() + off, data.size() - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(what + ": write failed: " + std::strerror(errno));
    }
    off += static_cast<size_t>(w);
  }
}

int open_append(const std::string& path) {
  check_output_file(path);  // a regular file or a new name, never a FIFO or device
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(path + ": cannot open for appending: " + std::strerror(errno));
  return fd;
}

}  // namespace

nlohmann::json to_json(const SweepRow& r) {
  nlohmann::json j;
  j["id"] = r.id;
  j["engine"] = r.engine;
  j["cluster"] = r.cluster;
  j["cluster_label"] = r.cluster_label;
  j["gpu"] = r.gpu;
  j["nodes"] = r.nodes;
  j["gpus"] = r.gpus;
  j["dp"] = r.layout.dp;
  j["tp"] = r.layout.tp;
  j["cp"] = r.layout.cp;
  j["pp"] = r.layout.pp;
  j["vp"] = r.layout.vp;
  j["ep"] = r.layout.ep;
  j["etp"] = r.layout.etp;
  j["schedule"] = to_string(r.layout.schedule);
  j["zero_stage"] = r.layout.zero_stage;
  j["micro_batch"] = r.micro_batch;
  j["micro_batches"] = r.micro_batches;
  j["recompute"] = to_string(r.layout.recompute);
  j["sequence_parallel"] = r.layout.sequence_parallel;
  j["status"] = r.status;
  j["reason"] = r.reason;
  j["step_time_s"] = r.step_time_s;
  j["tokens_per_s"] = r.tokens_per_s;
  j["tokens_per_s_per_gpu"] = r.tokens_per_s_per_gpu;
  j["mfu"] = r.mfu;
  j["tflops_per_gpu"] = r.tflops_per_gpu;
  j["compute_s"] = r.compute_s;
  j["bubble_s"] = r.bubble_s;
  j["host_bound_s"] = r.host_bound_s;
  j["optimizer_s"] = r.optimizer_s;
  j["exposed_tp_s"] = r.exposed_tp_s;
  j["exposed_cp_s"] = r.exposed_cp_s;
  j["exposed_pp_s"] = r.exposed_pp_s;
  j["exposed_dp_s"] = r.exposed_dp_s;
  j["exposed_ep_s"] = r.exposed_ep_s;
  j["peak_memory_bytes"] = r.peak_memory_bytes;
  j["capacity_bytes"] = r.capacity_bytes;
  j["usd_per_step"] = r.usd_per_step;
  j["usd_per_mtoken"] = r.usd_per_mtoken;
  return j;
}

SweepRow row_from_json(const nlohmann::json& j) {
  SweepRow r;
  try {
    r.id = j.at("id").get<int64_t>();
    r.engine = j.at("engine").get<std::string>();
    r.cluster = j.at("cluster").get<int64_t>();
    r.cluster_label = j.at("cluster_label").get<std::string>();
    r.gpu = j.at("gpu").get<std::string>();
    r.nodes = j.at("nodes").get<int64_t>();
    r.gpus = j.at("gpus").get<int64_t>();
    r.layout.dp = j.at("dp").get<int64_t>();
    r.layout.tp = j.at("tp").get<int64_t>();
    r.layout.cp = j.at("cp").get<int64_t>();
    r.layout.pp = j.at("pp").get<int64_t>();
    r.layout.vp = j.at("vp").get<int64_t>();
    r.layout.ep = j.at("ep").get<int64_t>();
    r.layout.etp = j.at("etp").get<int64_t>();
    r.layout.schedule = schedule_of(j.at("schedule").get<std::string>());
    r.layout.zero_stage = j.at("zero_stage").get<int>();
    r.micro_batch = j.at("micro_batch").get<int64_t>();
    r.micro_batches = j.at("micro_batches").get<int64_t>();
    r.layout.recompute = recompute_of(j.at("recompute").get<std::string>());
    r.layout.sequence_parallel = j.at("sequence_parallel").get<bool>();
    r.status = j.at("status").get<std::string>();
    r.reason = j.at("reason").get<std::string>();
    r.step_time_s = j.at("step_time_s").get<double>();
    r.tokens_per_s = j.at("tokens_per_s").get<double>();
    r.tokens_per_s_per_gpu = j.at("tokens_per_s_per_gpu").get<double>();
    r.mfu = j.at("mfu").get<double>();
    r.tflops_per_gpu = j.at("tflops_per_gpu").get<double>();
    r.compute_s = j.at("compute_s").get<double>();
    r.bubble_s = j.at("bubble_s").get<double>();
    r.host_bound_s = j.value("host_bound_s", 0.0);  // absent in journals written before it existed
    r.optimizer_s = j.at("optimizer_s").get<double>();
    r.exposed_tp_s = j.at("exposed_tp_s").get<double>();
    r.exposed_cp_s = j.at("exposed_cp_s").get<double>();
    r.exposed_pp_s = j.at("exposed_pp_s").get<double>();
    r.exposed_dp_s = j.at("exposed_dp_s").get<double>();
    r.exposed_ep_s = j.at("exposed_ep_s").get<double>();
    r.peak_memory_bytes = j.at("peak_memory_bytes").get<double>();
    r.capacity_bytes = j.at("capacity_bytes").get<double>();
    r.usd_per_step = j.at("usd_per_step").get<double>();
    r.usd_per_mtoken = j.at("usd_per_mtoken").get<double>();
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("malformed sweep row: ") + e.what());
  }
  return r;
}

std::string header_line(const JournalHeader& h) {
  nlohmann::json j;
  j["dtsim_sweep_journal"] = kJournalFormat;
  j["columns"] = journal_columns();
  j["spec"] = h.spec_path;
  j["spec_name"] = h.spec_name;
  j["fingerprint"] = h.fingerprint;
  j["shard_index"] = h.shard_index;
  j["shard_count"] = h.shard_count;
  j["points"] = h.points;
  j["refine_top"] = h.refine_top;
  j["rank_by"] = h.rank_by;
  return j.dump() + "\n";
}

/// What makes a parsed row impossible (empty: nothing): a field no run of dtsim writes.
static std::string row_value_problem(const SweepRow& r) {
  if (r.engine != "analytic" && r.engine != "simgrid") return "engine \"" + r.engine + "\"";
  if (r.status != "ok" && r.status != "invalid" && r.status != "oom" && r.status != "error")
    return "status \"" + r.status + "\"";
  const std::pair<const char*, double> figures[] = {
      {"step_time_s", r.step_time_s},     {"tokens_per_s", r.tokens_per_s}, {"tokens_per_s_per_gpu", r.tokens_per_s_per_gpu},
      {"mfu", r.mfu},                     {"tflops_per_gpu", r.tflops_per_gpu}, {"compute_s", r.compute_s},
      {"bubble_s", r.bubble_s},           {"peak_memory_bytes", r.peak_memory_bytes},
      {"usd_per_step", r.usd_per_step},   {"usd_per_mtoken", r.usd_per_mtoken}};
  for (const auto& [name, v] : figures)
    if (!(std::isfinite(v) && v >= 0)) return std::string(name) + " " + std::to_string(v) + " (must be finite and >= 0)";
  if (r.id < 0) return "id " + std::to_string(r.id);
  return "";
}

JournalContents read_journal(const std::string& path, bool truncate_partial) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    throw InputError(path + ": cannot read the sweep journal (not a regular file)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot read the sweep journal (no such file)");
  std::string text;
  {
    in.seekg(0, std::ios::end);
    const std::streamoff size = in.tellg();
    in.seekg(0, std::ios::beg);
    if (size > 0) {
      text.resize(static_cast<size_t>(size));
      in.read(text.data(), size);
      text.resize(static_cast<size_t>(in.gcount()));
    }
  }
  JournalContents out;
  size_t pos = 0, line_no = 0;
  size_t complete_end = 0;
  std::string error;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) break;  // partial last line: written while killed
    const std::string_view line(text.data() + pos, nl - pos);
    ++line_no;
    if (line_no == 1) {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception&) {
        throw InputError(path + ": line 1 is not JSON (not a dtsim sweep journal, or a damaged one)");
      }
      if (!j.is_object() || !j.contains("dtsim_sweep_journal"))
        throw InputError(path + ": not a dtsim sweep journal (no header line)");
      const nlohmann::json& f = j.at("dtsim_sweep_journal");
      out.header.format = f.is_number_integer() ? f.get<int>() : -1;
      if (out.header.format != 1 && out.header.format != 2)
        throw InputError(path + ": sweep journal format " + f.dump() + " is not one this dtsim reads (formats 1 and " +
                         "2; format " + std::to_string(kJournalFormat) + " is written): was it written by a newer dtsim?");
      if (out.header.format == 2 &&
          (!j.contains("columns") || !j.at("columns").is_array() || j.at("columns") != nlohmann::json(journal_columns())))
        throw InputError(path + ": sweep journal format 2 with other columns than this dtsim's (" +
                         (j.contains("columns") ? j.at("columns").dump() : std::string("none")) +
                         "): written by another dtsim version; run the sweep again in a new directory");
      out.header.spec_path = j.value("spec", "");
      out.header.spec_name =
          j.contains("spec_name") && j.at("spec_name").is_string() ? j.at("spec_name").get<std::string>() : out.header.spec_path;
      out.header.fingerprint = j.value("fingerprint", "");
      out.header.shard_index = j.value("shard_index", int64_t{0});
      out.header.shard_count = j.value("shard_count", int64_t{1});
      out.header.points = j.value("points", int64_t{0});
      out.header.refine_top = j.value("refine_top", int64_t{0});
      out.header.rank_by = j.value("rank_by", "");
    } else if (out.header.format == 2) {
      SweepRow& r = out.rows.emplace_back();
      if (!parse_journal_record(line, r, error))
        throw InputError(path + ": line " + std::to_string(line_no) + ": damaged sweep journal record (format 2): " +
                         error);
    } else {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception&) {
        throw InputError(path + ": line " + std::to_string(line_no) + " is not JSON (a damaged sweep journal)");
      }
      try {
        out.rows.push_back(row_from_json(j));
      } catch (const std::runtime_error& e) {
        throw InputError(path + ": line " + std::to_string(line_no) + ": " + e.what());
      }
    }
    if (line_no > 1)
      if (const std::string why = row_value_problem(out.rows.back()); !why.empty())
        throw InputError(path + ": line " + std::to_string(line_no) + ": damaged sweep journal record: " + why);
    pos = nl + 1;
    complete_end = pos;
  }
  if (line_no == 0) throw InputError(path + ": empty sweep journal (no header line)");
  const JournalHeader& h = out.header;
  if (h.points < 0 || h.shard_count < 1 || h.shard_index < 0 || h.shard_index >= h.shard_count || h.refine_top < 0 ||
      (h.rank_by != "step_time" && h.rank_by != "tokens_per_s_per_gpu" && h.rank_by != "cost"))
    throw InputError(path + ": line 1: damaged sweep journal header (points, shard, refine_top or rank_by out of range)");
  if (truncate_partial && complete_end < text.size()) {
    std::error_code ec;
    std::filesystem::resize_file(path, complete_end, ec);
    if (ec) throw std::runtime_error(path + ": cannot cut the partial last line: " + ec.message());
  }
  return out;
}

JournalWriter::JournalWriter(const std::string& dir, const JournalHeader& h, bool resume,
                             const std::vector<SweepRow>& existing, int existing_format)
    : dir_(dir) {
  const std::string jpath = dir + "/journal.jsonl", cpath = dir + "/results.csv";
  if (!resume) {
    write_file_atomic(jpath, header_line(h));
    write_file_atomic(cpath, sweep_csv_header());
  } else {
    if (existing_format != kJournalFormat) {
      // Appending records of this format to an older journal would mix two formats.
      std::string j = header_line(h);
      for (const auto& r : existing) append_journal_record(j, r);
      write_file_atomic(jpath, j);
    }
    std::string csv = sweep_csv_header();
    for (const auto& r : existing) append_csv_line(csv, r);
    write_file_atomic(cpath, csv);
  }
  json_fd_ = open_append(jpath);
  csv_fd_ = open_append(cpath);
}

JournalWriter::~JournalWriter() {
  try {
    flush();
  } catch (...) {
  }
  if (json_fd_ >= 0) ::close(json_fd_);
  if (csv_fd_ >= 0) ::close(csv_fd_);
}

void JournalWriter::add(const SweepRow& r) {
  append_journal_record(json_buf_, r);
  append_csv_line(csv_buf_, r);
  if (++buffered_ >= 512) flush();
}

void JournalWriter::add(const SweepRow& r, const std::string& csv_line) {
  append_journal_record(json_buf_, r);
  csv_buf_ += csv_line;
  if (++buffered_ >= 512) flush();
}

void JournalWriter::flush() {
  if (buffered_ == 0) return;
  // The journal first: it is the record; results.csv is rebuilt from it on --resume.
  write_all(json_fd_, json_buf_, dir_ + "/journal.jsonl");
  write_all(csv_fd_, csv_buf_, dir_ + "/results.csv");
  json_buf_.clear();
  csv_buf_.clear();
  buffered_ = 0;
}

// -------------------------------------------------------------------------- lock --

std::string DirLock::path_in(const std::string& dir) { return dir + "/sweep.lock"; }

DirLock::DirLock(const std::string& dir) {
  const std::string path = path_in(dir);
  // O_NOFOLLOW: the lock is this directory's own file, never a link to elsewhere.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0) throw std::runtime_error(path + ": cannot open the sweep lock file: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw std::runtime_error(path + ": the sweep lock file is not a regular file");
  }
  int rc;
  do rc = ::flock(fd_, LOCK_EX | LOCK_NB);
  while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    std::string holder;
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    if (n > 0) {
      std::string s(buf, static_cast<size_t>(n));
      while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
      if (!s.empty() && s.find_first_not_of("0123456789") == std::string::npos) holder = " (pid " + s + ")";
    }
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      throw std::runtime_error("--out " + dir + ": another dtsim sweep" + holder +
                               " is writing into this directory (it holds " + path +
                               "); wait for it to finish or choose another directory");
    throw std::runtime_error(path + ": cannot lock: " + std::strerror(err));
  }
  // The holder's pid, for the message of a refused second run.
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) == 0) {
    const ssize_t w = ::pwrite(fd_, pid.data(), pid.size(), 0);
    (void)w;  // the pid is only for messages
  }
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

}  // namespace dtsim::sweep
