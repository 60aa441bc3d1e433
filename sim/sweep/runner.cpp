#include "sim/sweep/runner.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <iostream>
#include <ostream>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "models/errors.hpp"
#include "reports/atomic_file.hpp"
#include "reports/csv.hpp"
#include "reports/html.hpp"
#include "reports/markdown.hpp"
#include "sim/engine.hpp"
#include "sim/sweep/journal.hpp"
#include "sim/sweep/report_data.hpp"

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
  try {
    size_t a = 0, b = 0;
    const long long i = std::stoll(text.substr(0, slash), &a);
    const long long n = std::stoll(text.substr(slash + 1), &b);
    if (a != slash || b != text.size() - slash - 1 || n < 1 || i < 0 || i >= n) throw bad();
    return {i, n};
  } catch (const std::logic_error&) {
    throw bad();
  }
}

// ------------------------------------------------------------------------------ run --

Outcome run_sweep(const SweepSpec& spec, const RunOptions& opts) {
  const double t0 = now_s();
  if (opts.shard_count < 1 || opts.shard_index < 0 || opts.shard_index >= opts.shard_count)
    throw InputError(fmt::format("--shard {}/{}: expected 0 <= i < N", opts.shard_index, opts.shard_count));
  std::error_code ec;
  const fs::path dir(opts.out_dir);
  prepare_output_dir(opts.out_dir, "--out");  // created with its parents (the README's Slurm recipe)
  // Before the journal is looked at: a second sweep into this directory stops here.
  auto lock = std::make_shared<DirLock>(opts.out_dir);

  const std::vector<LayoutPoint> all = enumerate_layouts(spec);
  std::vector<const LayoutPoint*> points;
  for (const auto& p : all)
    if (in_shard(p.id, opts.shard_index, opts.shard_count)) points.push_back(&p);
  const int64_t refine = opts.refine_top >= 0 ? opts.refine_top : spec.refine_top;

  JournalHeader h;
  h.spec_path = absolute(spec.source);
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
  if (have_journal && opts.resume) {
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
    resume = true;
  }

  Outcome out;
  out.lock = lock;
  out.points = static_cast<int64_t>(points.size());
  out.resumed_rows = static_cast<int64_t>(existing.size());
  std::map<int64_t, SweepRow> analytic, simgrid;
  for (const auto& r : existing) (r.engine == "analytic" ? analytic : simgrid)[r.id] = r;

  JournalWriter journal(dir.string(), h, resume, existing);
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  Progress bar(std::cerr, opts.progress, tty);
  int64_t written = static_cast<int64_t>(existing.size());
  auto flush = [&] {
    journal.flush();
    if (opts.on_flush) opts.on_flush(written);
  };

  // 1. Analytic pass.
  Evaluator ev(spec);
  bar.start("layouts (analytic)", static_cast<int64_t>(points.size()));
  int64_t done = 0;
  double last_flush = now_s();
  for (const LayoutPoint* p : points) {
    if (!analytic.count(p->id)) {
      SweepRow r = ev.analytic(*p);
      journal.add(r);
      ++written;
      analytic.emplace(p->id, std::move(r));
      if (written % 512 == 0 || now_s() - last_flush > 0.25) {
        flush();
        last_flush = now_s();
      }
    }
    bar.update(++done);
  }
  flush();
  bar.finish();

  // 2. SimGrid refinement of the best valid points of this shard.
  std::vector<SweepRow> rows;
  rows.reserve(analytic.size());
  for (auto& [id, r] : analytic) rows.push_back(r);
  const std::vector<size_t> order = ranking(rows, spec.rank_by);
  std::vector<const LayoutPoint*> todo;
  std::map<int64_t, const LayoutPoint*> by_id;
  for (const LayoutPoint* p : points) by_id[p->id] = p;
  for (size_t i = 0; i < order.size() && static_cast<int64_t>(i) < refine; ++i) {
    const int64_t id = rows[order[i]].id;
    if (!simgrid.count(id)) todo.push_back(by_id.at(id));
  }
  const int64_t refine_total = std::min<int64_t>(refine, static_cast<int64_t>(order.size()));
  bar.start("layouts (simgrid)", refine_total);
  int64_t des_done = refine_total - static_cast<int64_t>(todo.size());
  bar.update(des_done);
  // `jobs` SimGrid children at a time, all forked by this thread (no worker threads:
  // sim/child_process.hpp says why a process that forks must have only one).
  simulate_steps_isolated(
      todo.size(), opts.jobs, [&](size_t i) { return ev.experiment(*todo[i]); },
      [&](size_t i, StepResult&& r, std::exception_ptr error) {
        const LayoutPoint& p = *todo[i];
        SweepRow row;
        try {
          if (error) std::rethrow_exception(error);
          row = ev.from_result(p, r, analytic.at(p.id));
        } catch (const std::exception& e) {
          row = analytic.at(p.id);
          row.engine = "simgrid";
          row.status = "error";
          row.reason = std::string("SimGrid engine failed: ") + e.what();
        }
        journal.add(row);
        ++written;
        flush();
        simgrid[p.id] = std::move(row);
        bar.update(++des_done);
      });
  bar.finish();

  for (auto& [id, r] : analytic) out.analytic.push_back(std::move(r));
  for (auto& [id, r] : simgrid) out.simgrid.push_back(std::move(r));
  out.wall_s = now_s() - t0;
  return out;
}

// --------------------------------------------------------------------------- output --

std::vector<SweepRow> final_ranking(const Outcome& o, RankBy by, std::vector<double>* analytic_step) {
  std::map<int64_t, const SweepRow*> des;
  for (const auto& r : o.simgrid) des[r.id] = &r;
  std::map<int64_t, double> an_step;
  for (const auto& r : o.analytic) an_step[r.id] = r.step_time_s;
  std::vector<SweepRow> refined, rest;
  for (const auto& r : o.analytic) {
    if (!r.valid()) continue;
    auto it = des.find(r.id);
    if (it != des.end()) {
      if (it->second->valid()) refined.push_back(*it->second);
    } else {
      rest.push_back(r);
    }
  }
  auto cmp = [&](const SweepRow& a, const SweepRow& b) {
    const double va = rank_value(a, by), vb = rank_value(b, by);
    if (va != vb) return va < vb;
    return a.id < b.id;
  };
  std::sort(refined.begin(), refined.end(), cmp);
  std::sort(rest.begin(), rest.end(), cmp);
  refined.insert(refined.end(), rest.begin(), rest.end());
  if (analytic_step) {
    analytic_step->clear();
    for (const auto& r : refined) analytic_step->push_back(an_step[r.id]);
  }
  return refined;
}

void write_outputs(const SweepSpec& spec, const Outcome& o, const std::string& dir) {
  // results.csv: every row, by id, analytic before simgrid.
  std::vector<const SweepRow*> all;
  for (const auto& r : o.analytic) all.push_back(&r);
  for (const auto& r : o.simgrid) all.push_back(&r);
  std::stable_sort(all.begin(), all.end(), [](const SweepRow* a, const SweepRow* b) {
    if (a->id != b->id) return a->id < b->id;
    return a->engine == "analytic" && b->engine != "analytic";
  });
  std::string csv = sweep_csv_header();
  for (const SweepRow* r : all) csv += sweep_csv_line(*r);
  write_file_atomic(dir + "/results.csv", csv);

  std::vector<double> an_step;
  const std::vector<SweepRow> ranked = final_ranking(o, spec.rank_by, &an_step);
  std::string rcsv = "rank,analytic_step_time_s," + sweep_csv_header();
  for (size_t i = 0; i < ranked.size(); ++i)
    rcsv += std::to_string(i + 1) + "," + csv_number(an_step[i]) + "," + sweep_csv_line(ranked[i]);
  write_file_atomic(dir + "/ranked.csv", rcsv);

  int64_t ok = 0, invalid = 0, oom = 0;
  for (const auto& r : o.analytic) {
    if (r.status == "ok") ++ok;
    else if (r.status == "oom") ++oom;
    else ++invalid;
  }
  nlohmann::json j;
  j["title"] = spec.title;
  j["spec"] = spec.source;
  j["fingerprint"] = spec.fingerprint;
  j["rank_by"] = to_string(spec.rank_by);
  j["points"] = static_cast<int64_t>(o.analytic.size());
  j["counts"] = {{"ok", ok}, {"invalid", invalid}, {"oom", oom}, {"refined", static_cast<int64_t>(o.simgrid.size())}};
  nlohmann::json clusters = nlohmann::json::array();
  for (const auto& c : spec.clusters)
    clusters.push_back({{"label", c.label},
                        {"gpu", c.base.cluster.gpu.name},
                        {"nodes", c.base.cluster.nodes},
                        {"gpus", c.base.cluster.gpus()},
                        {"price_per_gpu_hour", c.price_per_gpu_hour}});
  j["clusters"] = clusters;
  if (!ranked.empty()) j["best"] = to_json(ranked.front());
  nlohmann::json top = nlohmann::json::array();
  for (size_t i = 0; i < ranked.size() && i < 100; ++i) top.push_back(to_json(ranked[i]));
  j["ranked"] = top;
  nlohmann::json rows = nlohmann::json::array();
  for (const SweepRow* r : all) rows.push_back(to_json(*r));
  j["rows"] = rows;
  write_file_atomic(dir + "/sweep.json", j.dump(1) + "\n");

  const ReportData rep = sweep_report(spec, o);
  write_file_atomic(dir + "/report.html", render_html(rep));
  write_file_atomic(dir + "/report.md", render_markdown(rep));
}

// ---------------------------------------------------------------------------- merge --

Merged merge_shards(const std::vector<std::string>& dirs) {
  if (dirs.empty()) throw InputError("dtsim merge: give the shard directories to join");
  std::vector<JournalContents> js;
  for (const auto& d : dirs) js.push_back(read_journal(d + "/journal.jsonl", false));
  const JournalHeader& h0 = js.front().header;
  std::set<int64_t> seen;
  std::vector<std::string> problems;
  for (size_t i = 0; i < js.size(); ++i) {
    const JournalHeader& h = js[i].header;
    const std::string where = dirs[i] + "/journal.jsonl";
    if (h.fingerprint != h0.fingerprint || h.spec_path != h0.spec_path)
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
    if (n_an != h.points)
      problems.push_back(fmt::format("{}: shard {}/{} is incomplete ({} of {} layouts): finish it with dtsim sweep "
                                     "--resume",
                                     where, h.shard_index, h.shard_count, n_an, h.points));
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
  RankBy by = RankBy::step_time;
  if (h0.rank_by == "tokens_per_s_per_gpu") by = RankBy::tokens_per_s_per_gpu;
  else if (h0.rank_by == "cost") by = RankBy::cost;
  const std::vector<size_t> order = ranking(o.analytic, by);
  std::set<int64_t> top;
  for (size_t i = 0; i < order.size() && static_cast<int64_t>(i) < h0.refine_top; ++i) top.insert(o.analytic[order[i]].id);
  for (auto& [id, r] : simgrid)
    if (top.count(id)) o.simgrid.push_back(r);
  return {h0.spec_path, h0.fingerprint, o};
}

}  // namespace dtsim::sweep
