#include "sim/sweep/runner.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <iostream>
#include <ostream>
#include <set>
#include <string_view>
#include <thread>

#include <fmt/format.h>

#include "models/errors.hpp"
#include "reports/atomic_file.hpp"
#include "reports/csv.hpp"
#include "reports/html.hpp"
#include "reports/markdown.hpp"
#include "sim/engine.hpp"
#include "sim/sweep/journal.hpp"
#include "sim/sweep/report_data.hpp"
#include "sim/sweep/row_format.hpp"

namespace dtsim::sweep {

namespace fs = std::filesystem;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string fmt_eta(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}:{:02}:{:02}", t / 3600, (t / 60) % 60, t % 60);
  return fmt::format("{}:{:02}", t / 60, t % 60);
}

std::string absolute(const std::string& p) {
  std::error_code ec;
  const fs::path a = fs::absolute(p, ec);
  return ec ? p : a.lexically_normal().string();
}

}  // namespace

// ------------------------------------------------------------------------- progress --

Progress::Progress(std::ostream& out, bool enabled, bool tty) : out_(out), enabled_(enabled), tty_(tty) {}

void Progress::start(const std::string& label, int64_t total) {
  label_ = label;
  total_ = total;
  last_decile_ = -1;
  t0_ = now_s();
  last_draw_ = -1;
  update(0);
}

void Progress::update(int64_t done) {
  if (!enabled_ || total_ <= 0) return;
  const double t = now_s();
  const int64_t decile = done * 10 / total_;
  if (tty_) {
    if (done < total_ && last_draw_ >= 0 && t - last_draw_ < 0.1) return;
  } else if (decile == last_decile_ && done < total_) {
    return;
  }
  last_draw_ = t;
  last_decile_ = decile;
  const double frac = static_cast<double>(done) / static_cast<double>(total_);
  const int width = 30;
  const int fill = static_cast<int>(frac * width);
  const double elapsed = t - t0_;
  const double eta = done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(total_ - done) : NAN;
  const std::string line = fmt::format("[{}{}] {:3.0f}%  {}/{} {}  ETA {}", std::string(static_cast<size_t>(fill), '#'),
                                       std::string(static_cast<size_t>(width - fill), '-'), frac * 100, done, total_,
                                       label_, done >= total_ ? "0:00" : fmt_eta(eta));
  if (tty_) out_ << '\r' << line << "\x1b[K" << std::flush;
  else out_ << line << '\n' << std::flush;
}

void Progress::finish() {
  if (enabled_ && tty_ && total_ > 0) out_ << '\n' << std::flush;
  total_ = 0;
}

// ---------------------------------------------------------------------------- shard --

std::pair<int64_t, int64_t> parse_shard(const std::string& text, const std::string& option) {
  const auto slash = text.find('/');
  auto bad = [&] {
    return InputError(option + " " + text + ": expected i/N with 0 <= i < N (e.g. " + option + " 0/4)");
  };
  if (slash == std::string::npos) throw bad();
  // Digits only (std::stoll took white space and a sign), in range.
  auto number = [&](size_t from, size_t to) {
    long long v = -1;
    const char* first = text.data() + from;
    const char* last = text.data() + to;
    if (first == last || *first < '0' || *first > '9') throw bad();
    const auto [end, ec] = std::from_chars(first, last, v);
    if (ec != std::errc() || end != last) throw bad();
    return v;
  };
  const long long i = number(0, slash), n = number(slash + 1, text.size());
  if (n < 1 || i < 0 || i >= n) throw bad();
  return {i, n};
}

// ------------------------------------------------------------------------------ run --

Outcome run_sweep(const SweepSpec& spec, const RunOptions& opts) {
  const double t0 = now_s();
  if (opts.shard_count < 1 || opts.shard_index < 0 || opts.shard_index >= opts.shard_count)
    throw InputError(fmt::format("--shard {}/{}: expected 0 <= i < N", opts.shard_index, opts.shard_count));
  std::error_code ec;
  const fs::path dir(opts.out_dir);
  // Created with its parents (the README's Slurm recipe); the files it will hold checked now.
  prepare_output_dir(opts.out_dir, "--out",
                     {"journal.jsonl", "results.csv", "ranked.csv", "sweep.json", "report.html", "report.md", "sweep.lock"});
  // Before the journal is looked at: a second sweep into this directory stops here.
  auto lock = std::make_shared<DirLock>(opts.out_dir);

  const std::vector<LayoutPoint> all = enumerate_layouts(spec);
  std::vector<const LayoutPoint*> points;
  for (const auto& p : all)
    if (in_shard(p.id, opts.shard_index, opts.shard_count)) points.push_back(&p);
  const int64_t refine = opts.refine_top >= 0 ? opts.refine_top : spec.refine_top;

  JournalHeader h;
  h.spec_path = absolute(spec.source);
  h.spec_name = spec.source;
  h.fingerprint = spec.fingerprint;
  h.shard_index = opts.shard_index;
  h.shard_count = opts.shard_count;
  h.points = static_cast<int64_t>(points.size());
  h.refine_top = refine;
  h.rank_by = to_string(spec.rank_by);

  const std::string jpath = (dir / "journal.jsonl").string();
  std::vector<SweepRow> existing;
  const bool have_journal = fs::exists(jpath, ec);
  if (have_journal && !opts.resume)
    throw InputError("--out " + opts.out_dir + " already holds a sweep (journal.jsonl): add --resume to continue it, "
                     "or choose another directory");
  bool resume = false;
  int existing_format = kJournalFormat;
  if (have_journal && opts.resume) {
    // A sweep killed while writing its final outputs leaves their temporaries behind.
    remove_stale_temporaries(opts.out_dir, {"results.csv", "ranked.csv", "sweep.json", "report.html", "report.md"});
    JournalContents jc = read_journal(jpath, true);
    if (jc.header.fingerprint != h.fingerprint)
      throw InputError(jpath + ": was written for another version of " + jc.header.spec_path +
                       " (fingerprint " + jc.header.fingerprint + ", this file " + h.fingerprint +
                       "): start a new directory");
    if (jc.header.shard_index != h.shard_index || jc.header.shard_count != h.shard_count)
      throw InputError(fmt::format("{}: holds shard {}/{}, not {}/{}", jpath, jc.header.shard_index,
                                   jc.header.shard_count, h.shard_index, h.shard_count));
    if (jc.header.refine_top != h.refine_top)
      throw InputError(fmt::format("{}: was run with refine_top {}, not {}", jpath, jc.header.refine_top, refine));
    existing = std::move(jc.rows);
    existing_format = jc.header.format;
    resume = true;
  }

  Outcome out;
  out.lock = lock;
  out.points = static_cast<int64_t>(points.size());
  out.resumed_rows = static_cast<int64_t>(existing.size());
  // The analytic row of each point, by position in `points` (ids ascending), and its
  // results.csv line, formatted once for the journal's mirror and reused by write_outputs.
  std::vector<SweepRow> analytic(points.size());
  std::vector<std::string> analytic_csv(points.size());
  std::vector<char> have(points.size(), 0);
  std::vector<int64_t> pos_of_id(all.size(), -1);
  for (size_t i = 0; i < points.size(); ++i) pos_of_id[static_cast<size_t>(points[i]->id)] = static_cast<int64_t>(i);
  auto position = [&](int64_t id) -> int64_t {
    return id >= 0 && id < static_cast<int64_t>(pos_of_id.size()) ? pos_of_id[static_cast<size_t>(id)] : -1;
  };
  std::map<int64_t, SweepRow> simgrid;
  std::map<int64_t, std::string> simgrid_csv;
  for (const auto& r : existing) {
    if (r.engine != "analytic") {
      simgrid[r.id] = r;
      continue;
    }
    const int64_t i = position(r.id);
    if (i < 0)
      throw InputError(fmt::format("{}: row {} is not a layout of shard {}/{} of {}: start a new directory", jpath, r.id,
                                   h.shard_index, h.shard_count, spec.source));
    analytic[static_cast<size_t>(i)] = r;
    have[static_cast<size_t>(i)] = 1;
  }

  JournalWriter journal(dir.string(), h, resume, existing, existing_format);
  existing.clear();
  existing.shrink_to_fit();
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  Progress bar(std::cerr, opts.progress, tty);
  int64_t written = out.resumed_rows;
  auto flush = [&] {
    journal.flush();
    if (opts.on_flush) opts.on_flush(written);
  };

  // 1. Analytic pass. The points still to evaluate are split in two halves by id: this
  // thread evaluates the first and journals it as it goes; for more than one block of 256
  // points on a machine with several CPUs, a helper thread with its own Evaluator (an engine
  // caches: one per thread) evaluates the second meanwhile, journaled here in id order once
  // the first is done. A row depends on its point alone, so rows and journal are what one
  // thread writes. The helper is joined before anything forks (the SimGrid pass below forks
  // only while this process has one thread, sim/child_process.hpp), also when this thread
  // throws.
  Evaluator ev(spec);
  std::vector<size_t> pending;  // positions in `points` to evaluate, ascending
  for (size_t i = 0; i < points.size(); ++i)
    if (!have[i]) pending.push_back(i);
  constexpr size_t kBlock = 256;
  const size_t mine = pending.size() > kBlock && std::thread::hardware_concurrency() > 1 ? pending.size() / 2
                                                                                         : pending.size();
  auto evaluate = [&](Evaluator& e, size_t i) {
    analytic[i] = e.analytic(*points[i]);
    append_csv_line(analytic_csv[i], analytic[i]);
  };
  std::atomic<bool> stop{false};
  std::exception_ptr helper_error;
  size_t helper_failed_at = pending.size();  // position in `pending` of the helper's exception
  std::thread helper;
  struct Join {
    std::thread& t;
    std::atomic<bool>& stop;
    ~Join() {
      stop = true;
      if (t.joinable()) t.join();
    }
  } join{helper, stop};
  if (mine < pending.size()) {
    helper = std::thread([&] {
      try {
        Evaluator hev(spec);
        for (size_t k = mine; k < pending.size() && !stop.load(std::memory_order_relaxed); ++k) {
          helper_failed_at = k;
          evaluate(hev, pending[k]);
        }
        helper_failed_at = pending.size();
      } catch (...) {
        helper_error = std::current_exception();
      }
    });
  }
  bar.start("layouts (analytic)", static_cast<int64_t>(points.size()));
  int64_t done = 0;
  double last_flush = now_s();
  size_t k = 0;  // position in `pending`
  for (size_t i = 0; i < points.size(); ++i) {
    bar.update(++done);
    if (have[i]) continue;
    if (k == mine && helper.joinable()) helper.join();  // the helper's half: wait for it
    // Its rows before an exception are journaled, then the exception goes on (as when one
    // thread evaluates every point).
    if (k >= mine && helper_error && k == helper_failed_at) std::rethrow_exception(helper_error);
    if (k < mine) evaluate(ev, i);
    ++k;
    journal.add(analytic[i], analytic_csv[i]);
    have[i] = 1;
    ++written;
    if (written % 512 == 0 || now_s() - last_flush > 0.25) {
      flush();
      last_flush = now_s();
    }
  }
  flush();
  bar.finish();

  // 2. SimGrid refinement of the best valid points of this shard.
  const std::vector<size_t> order = ranking(analytic, spec.rank_by);
  std::vector<size_t> todo;  // positions in `points`
  for (size_t i = 0; i < order.size() && static_cast<int64_t>(i) < refine; ++i)
    if (!simgrid.count(analytic[order[i]].id)) todo.push_back(order[i]);
  const int64_t refine_total = std::min<int64_t>(refine, static_cast<int64_t>(order.size()));
  bar.start("layouts (simgrid)", refine_total);
  int64_t des_done = refine_total - static_cast<int64_t>(todo.size());
  bar.update(des_done);
  // `jobs` SimGrid children at a time, all forked by this thread (no worker threads:
  // sim/child_process.hpp says why a process that forks must have only one).
  simulate_steps_isolated(
      todo.size(), opts.jobs, [&](size_t i) { return ev.experiment(*points[todo[i]]); },
      [&](size_t i, StepResult&& r, std::exception_ptr error) {
        const LayoutPoint& p = *points[todo[i]];
        const SweepRow& an = analytic[todo[i]];
        SweepRow row;
        try {
          if (error) std::rethrow_exception(error);
          row = ev.from_result(p, r, an);
        } catch (const std::exception& e) {
          row = an;
          row.engine = "simgrid";
          row.status = "error";
          row.reason = std::string("SimGrid engine failed: ") + e.what();
        }
        std::string line;
        append_csv_line(line, row);
        journal.add(row, line);
        ++written;
        flush();
        simgrid_csv[p.id] = std::move(line);
        simgrid[p.id] = std::move(row);
        bar.update(++des_done);
      });
  bar.finish();

  out.analytic = std::move(analytic);
  out.analytic_csv = std::move(analytic_csv);
  for (auto& [id, r] : simgrid) {
    auto it = simgrid_csv.find(id);
    out.simgrid_csv.push_back(it != simgrid_csv.end() ? std::move(it->second) : std::string());
    out.simgrid.push_back(std::move(r));
  }
  out.wall_s = now_s() - t0;
  return out;
}

// --------------------------------------------------------------------------- output --

namespace {

/// Rows sorted by id with the position of each: lookups without a map.
template <class Value>
std::vector<std::pair<int64_t, Value>> by_id(std::vector<std::pair<int64_t, Value>> v) {
  std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return v;
}

template <class Value>
const Value* find_id(const std::vector<std::pair<int64_t, Value>>& v, int64_t id) {
  auto it = std::lower_bound(v.begin(), v.end(), id, [](const auto& e, int64_t x) { return e.first < x; });
  return it != v.end() && it->first == id ? &it->second : nullptr;
}

/// final_ranking as pointers into `o`.
std::vector<const SweepRow*> ranked_rows(const Outcome& o, RankBy by, std::vector<double>* analytic_step) {
  std::vector<std::pair<int64_t, const SweepRow*>> des_v;
  des_v.reserve(o.simgrid.size());
  // The last SimGrid row of an id counts (as a map assignment would keep it).
  for (const auto& r : o.simgrid) des_v.emplace_back(r.id, &r);
  std::stable_sort(des_v.begin(), des_v.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::pair<int64_t, const SweepRow*>> des;
  for (size_t i = 0; i < des_v.size(); ++i)
    if (i + 1 == des_v.size() || des_v[i + 1].first != des_v[i].first) des.push_back(des_v[i]);
  std::vector<const SweepRow*> refined, rest;
  for (const auto& r : o.analytic) {
    if (!r.valid()) continue;
    if (const SweepRow* const* d = find_id(des, r.id)) {
      if ((*d)->valid()) refined.push_back(*d);
    } else {
      rest.push_back(&r);
    }
  }
  auto cmp = [&](const SweepRow* a, const SweepRow* b) {
    const double va = rank_value(*a, by), vb = rank_value(*b, by);
    if (va != vb) return va < vb;
    return a->id < b->id;
  };
  std::sort(refined.begin(), refined.end(), cmp);
  std::sort(rest.begin(), rest.end(), cmp);
  refined.insert(refined.end(), rest.begin(), rest.end());
  if (analytic_step) {
    // The analytic step time of each id (the last analytic row of an id, 0 for none).
    std::vector<std::pair<int64_t, double>> an_v;
    an_v.reserve(o.analytic.size());
    for (const auto& r : o.analytic) an_v.emplace_back(r.id, r.step_time_s);
    an_v = by_id(std::move(an_v));
    std::vector<std::pair<int64_t, double>> an;
    an.reserve(an_v.size());
    for (size_t i = 0; i < an_v.size(); ++i)
      if (i + 1 == an_v.size() || an_v[i + 1].first != an_v[i].first) an.push_back(an_v[i]);
    analytic_step->clear();
    analytic_step->reserve(refined.size());
    for (const SweepRow* r : refined) {
      const double* v = find_id(an, r->id);
      analytic_step->push_back(v ? *v : 0.0);
    }
  }
  return refined;
}

}  // namespace

std::vector<SweepRow> final_ranking(const Outcome& o, RankBy by, std::vector<double>* analytic_step) {
  const std::vector<const SweepRow*> p = ranked_rows(o, by, analytic_step);
  std::vector<SweepRow> out;
  out.reserve(p.size());
  for (const SweepRow* r : p) out.push_back(*r);
  return out;
}

namespace {

/// Pieces of an output file are handed to the writer at about this size (a large output is
/// never held whole: fewer fresh pages to fault in and free).
constexpr size_t kOutputChunk = size_t{1} << 20;

/// sweep.json: what the nlohmann document {title, spec, fingerprint, rank_by, points,
/// counts, clusters, best, ranked, rows} dumped with indent 1 writes, streamed to `put` in
/// pieces (keys in nlohmann's order, sorted; row objects by append_row_json).
void sweep_json(const SweepSpec& spec, const Outcome& o, const std::vector<const SweepRow*>& all,
                const std::vector<const SweepRow*>& ranked, const std::function<void(std::string_view)>& put) {
  int64_t ok = 0, invalid = 0, oom = 0;
  for (const auto& r : o.analytic) {
    if (r.status == "ok") ++ok;
    else if (r.status == "oom") ++oom;
    else ++invalid;
  }
  std::string s;
  s.reserve(kOutputChunk + 64 * 1024);
  auto key = [&](int indent, const char* k) {
    s.append(static_cast<size_t>(indent), ' ');
    s += '"';
    s += k;
    s += "\": ";
  };
  auto integer = [&](int64_t v) { s += std::to_string(v); };
  // Arrays of rows at depth 1: elements at indent 2.
  auto rows_array = [&](size_t n, auto&& row_at) {
    if (n == 0) {
      s += "[]";
      return;
    }
    s += "[\n";
    for (size_t i = 0; i < n; ++i) {
      s += "  ";
      append_row_json(s, row_at(i), 2);
      s += i + 1 < n ? ",\n" : "\n";
      if (s.size() >= kOutputChunk) {
        put(s);
        s.clear();
      }
    }
    s += " ]";
  };
  s += "{\n";
  if (!ranked.empty()) {
    key(1, "best");
    append_row_json(s, *ranked.front(), 1);
    s += ",\n";
    key(1, "best_megatron_args");  // models/megatron_args.hpp, layout scope
    append_json_string(s, megatron_layout_args(spec, *ranked.front()));
    s += ",\n";
  }
  key(1, "clusters");
  if (spec.clusters.empty()) {
    s += "[]";
  } else {
    s += "[\n";
    for (size_t i = 0; i < spec.clusters.size(); ++i) {
      const ClusterCase& c = spec.clusters[i];
      s += "  {\n";
      key(3, "gpu");
      append_json_string(s, c.base.cluster.gpu.name);
      s += ",\n";
      key(3, "gpus");
      integer(c.base.cluster.gpus());
      s += ",\n";
      key(3, "label");
      append_json_string(s, c.label);
      s += ",\n";
      key(3, "nodes");
      integer(c.base.cluster.nodes);
      s += ",\n";
      key(3, "price_per_gpu_hour");
      append_json_double(s, c.price_per_gpu_hour);
      s += "\n  }";
      s += i + 1 < spec.clusters.size() ? ",\n" : "\n";
    }
    s += " ]";
  }
  s += ",\n";
  key(1, "counts");
  s += "{\n";
  key(2, "invalid");
  integer(invalid);
  s += ",\n";
  key(2, "ok");
  integer(ok);
  s += ",\n";
  key(2, "oom");
  integer(oom);
  s += ",\n";
  key(2, "refined");
  integer(static_cast<int64_t>(o.simgrid.size()));
  s += "\n },\n";
  key(1, "fingerprint");
  append_json_string(s, spec.fingerprint);
  s += ",\n";
  key(1, "points");
  integer(static_cast<int64_t>(o.analytic.size()));
  s += ",\n";
  key(1, "rank_by");
  append_json_string(s, to_string(spec.rank_by));
  s += ",\n";
  key(1, "ranked");
  rows_array(std::min<size_t>(ranked.size(), 100), [&](size_t i) -> const SweepRow& { return *ranked[i]; });
  s += ",\n";
  key(1, "rows");
  rows_array(all.size(), [&](size_t i) -> const SweepRow& { return *all[i]; });
  s += ",\n";
  key(1, "spec");
  append_json_string(s, spec.source);
  s += ",\n";
  key(1, "title");
  append_json_string(s, spec.title);
  s += "\n}\n";
  put(s);
}

}  // namespace

void write_outputs(const SweepSpec& spec, const Outcome& o, const std::string& dir) {
  // The results.csv line of a row of `o`: the one run_sweep formatted, or a new one.
  const bool an_cached = o.analytic_csv.size() == o.analytic.size();
  const bool sg_cached = o.simgrid_csv.size() == o.simgrid.size();
  auto append_line = [&](std::string& out, const SweepRow* r) {
    const std::string* line = nullptr;
    if (an_cached && !o.analytic.empty() && r >= o.analytic.data() && r < o.analytic.data() + o.analytic.size())
      line = &o.analytic_csv[static_cast<size_t>(r - o.analytic.data())];
    else if (sg_cached && !o.simgrid.empty() && r >= o.simgrid.data() && r < o.simgrid.data() + o.simgrid.size())
      line = &o.simgrid_csv[static_cast<size_t>(r - o.simgrid.data())];
    if (line && !line->empty()) out += *line;
    else append_csv_line(out, *r);
  };

  // results.csv: every row, by id, analytic before simgrid.
  std::vector<const SweepRow*> all;
  all.reserve(o.analytic.size() + o.simgrid.size());
  for (const auto& r : o.analytic) all.push_back(&r);
  for (const auto& r : o.simgrid) all.push_back(&r);
  std::stable_sort(all.begin(), all.end(), [](const SweepRow* a, const SweepRow* b) {
    if (a->id != b->id) return a->id < b->id;
    return a->engine == "analytic" && b->engine != "analytic";
  });
  std::vector<double> an_step;
  const std::vector<const SweepRow*> ranked = ranked_rows(o, spec.rank_by, &an_step);

  // sweep.json, the largest output, is formatted and written by a second thread meanwhile
  // (joined before this function returns or throws: run_sweep forks SimGrid children only
  // while this process has one thread, sim/child_process.hpp).
  std::exception_ptr json_error;
  std::thread json_writer([&] {
    try {
      write_file_atomic_streamed(dir + "/sweep.json", [&](const std::function<void(std::string_view)>& put) {
        sweep_json(spec, o, all, ranked, put);
      });
    } catch (...) {
      json_error = std::current_exception();
    }
  });
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();
    }
  } join{json_writer};

  write_file_atomic_streamed(dir + "/results.csv", [&](const std::function<void(std::string_view)>& put) {
    std::string csv = sweep_csv_header();
    csv.reserve(kOutputChunk + 64 * 1024);
    for (const SweepRow* r : all) {
      append_line(csv, r);
      if (csv.size() >= kOutputChunk) {
        put(csv);
        csv.clear();
      }
    }
    put(csv);
  });

  write_file_atomic_streamed(dir + "/ranked.csv", [&](const std::function<void(std::string_view)>& put) {
    std::string rcsv = "rank,analytic_step_time_s," + sweep_csv_header();
    rcsv.reserve(kOutputChunk + 64 * 1024);
    for (size_t i = 0; i < ranked.size(); ++i) {
      rcsv += std::to_string(i + 1);
      rcsv += ',';
      append_csv_number(rcsv, an_step[i]);
      rcsv += ',';
      append_line(rcsv, ranked[i]);
      if (rcsv.size() >= kOutputChunk) {
        put(rcsv);
        rcsv.clear();
      }
    }
    put(rcsv);
  });

  const ReportData rep = sweep_report(spec, o, ranked, an_step);
  write_file_atomic(dir + "/report.html", render_html(rep));
  write_file_atomic(dir + "/report.md", render_markdown(rep));
  json_writer.join();
  if (json_error) std::rethrow_exception(json_error);
}

// ---------------------------------------------------------------------------- merge --

Merged merge_shards(const std::vector<std::string>& dirs) {
  if (dirs.empty()) throw InputError("dtsim merge: give the shard directories to join");
  std::vector<JournalContents> js;
  for (const auto& d : dirs) js.push_back(read_journal(d + "/journal.jsonl", false));
  const JournalHeader& h0 = js.front().header;
  RankBy by = RankBy::step_time;
  if (h0.rank_by == "tokens_per_s_per_gpu") by = RankBy::tokens_per_s_per_gpu;
  else if (h0.rank_by == "cost") by = RankBy::cost;
  std::set<int64_t> seen;
  std::vector<std::string> problems;
  for (size_t i = 0; i < js.size(); ++i) {
    const JournalHeader& h = js[i].header;
    const std::string where = dirs[i] + "/journal.jsonl";
    // The same spec bytes (fingerprint) make the same sweep wherever the file lay on the machine
    // that ran the shard (the README's split over machines); the first shard's path is read.
    if (h.fingerprint != h0.fingerprint)
      problems.push_back(where + ": is from another sweep (" + h.spec_path + ", fingerprint " + h.fingerprint +
                         ") than " + dirs[0] + " (" + h0.spec_path + ", " + h0.fingerprint + ")");
    if (h.shard_count != h0.shard_count)
      problems.push_back(fmt::format("{}: has {} shards, {} has {}", where, h.shard_count, dirs[0], h0.shard_count));
    if (h.refine_top != h0.refine_top)
      problems.push_back(fmt::format("{}: refine_top {} differs from {} ({})", where, h.refine_top, dirs[0], h0.refine_top));
    if (!seen.insert(h.shard_index).second)
      problems.push_back(fmt::format("{}: shard {}/{} is given twice", where, h.shard_index, h.shard_count));
    int64_t n_an = 0;
    for (const auto& r : js[i].rows) n_an += r.engine == "analytic" ? 1 : 0;
    if (n_an > h.points) {
      problems.push_back(fmt::format("{}: shard {}/{} holds {} analytic rows for its {} layouts (a row twice, or rows of "
                                     "another shard): it was edited or joined by hand; run the shard again",
                                     where, h.shard_index, h.shard_count, n_an, h.points));
      continue;
    }
    if (n_an < h.points) {
      problems.push_back(fmt::format("{}: shard {}/{} is incomplete ({} of {} layouts): finish it with dtsim sweep "
                                     "--resume",
                                     where, h.shard_index, h.shard_count, n_an, h.points));
      continue;
    }
    // Its refinement too: run_sweep re-simulates the shard's best refine_top valid layouts
    // after the analytic pass, and a shard killed in between has rows for only some of them.
    std::vector<SweepRow> shard_analytic;
    std::set<int64_t> refined;
    for (const auto& r : js[i].rows) {
      if (r.engine == "analytic") shard_analytic.push_back(r);
      else refined.insert(r.id);
    }
    const std::vector<size_t> order = ranking(shard_analytic, by);
    int64_t want = 0, have = 0;
    for (size_t k = 0; k < order.size() && static_cast<int64_t>(k) < h.refine_top; ++k, ++want)
      have += refined.count(shard_analytic[order[k]].id) ? 1 : 0;
    if (have != want)
      problems.push_back(fmt::format("{}: shard {}/{} is incomplete ({} of {} SimGrid re-simulations): finish it with "
                                     "dtsim sweep --resume",
                                     where, h.shard_index, h.shard_count, have, want));
  }
  for (int64_t i = 0; i < h0.shard_count; ++i)
    if (!seen.count(i)) problems.push_back(fmt::format("shard {}/{} is missing", i, h0.shard_count));
  if (!problems.empty()) throw InputError(problems);

  Outcome o;
  std::map<int64_t, SweepRow> analytic, simgrid;
  for (auto& jc : js)
    for (auto& r : jc.rows) (r.engine == "analytic" ? analytic : simgrid)[r.id] = r;
  for (auto& [id, r] : analytic) o.analytic.push_back(r);
  o.points = static_cast<int64_t>(o.analytic.size());
  // Keep the SimGrid rows of the global top refine_top (what an unsharded run refines).
  const std::vector<size_t> order = ranking(o.analytic, by);
  std::set<int64_t> top;
  for (size_t i = 0; i < order.size() && static_cast<int64_t>(i) < h0.refine_top; ++i) top.insert(o.analytic[order[i]].id);
  for (auto& [id, r] : simgrid)
    if (top.count(id)) o.simgrid.push_back(r);
  return {h0.spec_path, h0.fingerprint, h0.spec_name, o};
}

}  // namespace dtsim::sweep
