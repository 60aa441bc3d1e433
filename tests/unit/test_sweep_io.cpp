// The sweep's fast output path (sim/sweep/row_format.hpp): the compact journal record (every
// field round trips bit for bit), the sweep.json and CSV writers (byte for byte what the
// nlohmann / csv.hpp code writes), a torn last record on --resume, journals of format 1
// (one JSON object per row) still resumed and merged, and an unknown format refused.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_fixture.hpp"
#include "models/errors.hpp"
#include "models/sweep_spec.hpp"
#include "reports/csv.hpp"
#include "sim/sweep/journal.hpp"
#include "sim/sweep/report_data.hpp"
#include "sim/sweep/row_format.hpp"
#include "sim/sweep/runner.hpp"
#include "sim/sweep/sweep.hpp"

namespace dtsim {
namespace {

namespace fs = std::filesystem;

const fs::path kSweeps = fs::path(DTSIM_SOURCE_DIR) / "experiments" / "sweeps";
const std::string kSmall = (kSweeps / "gpt-2.7b-32-a100.yaml").string();

std::string read(const fs::path& p) { return cli_test::read_file(p); }

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

/// A row with every field set to something other than its default.
SweepRow sample_row() {
  SweepRow r;
  r.id = 123456789012;
  r.engine = "simgrid";
  r.cluster = 3;
  r.cluster_label = "4 x DGX \"A100\", 400 Gb/s\n\t\x01 \xc3\xa9t\xc3\xa9 \xf0\x9f\x9a\x80 back\\slash";
  r.gpu = "=H100,SXM";
  r.nodes = 128;
  r.gpus = 1024;
  r.layout.dp = 16;
  r.layout.tp = 8;
  r.layout.cp = 2;
  r.layout.pp = 4;
  r.layout.vp = 3;
  r.layout.ep = 32;
  r.layout.etp = 2;
  r.layout.schedule = Schedule::interleaved;
  r.layout.zero_stage = 3;
  r.micro_batch = 2;
  r.micro_batches = 77;
  r.layout.recompute = Recompute::selective;
  r.layout.sequence_parallel = true;
  r.status = "oom";
  r.reason = "out of memory: stage 1 needs 91.25 GiB, 79.10 GiB available; -1 \"quoted\"";
  r.step_time_s = 0.1;
  r.tokens_per_s = 1.0 / 3.0;
  r.tokens_per_s_per_gpu = 5e-324;  // the smallest denormal
  r.mfu = -0.0;
  r.tflops_per_gpu = std::numeric_limits<double>::max();
  r.compute_s = 1e-300;
  r.bubble_s = 123456789.123456789;
  r.host_bound_s = 2.5e-7;
  r.optimizer_s = 0.30000000000000004;
  r.exposed_tp_s = std::numeric_limits<double>::infinity();
  r.exposed_cp_s = -std::numeric_limits<double>::infinity();
  r.exposed_pp_s = std::numeric_limits<double>::quiet_NaN();
  r.exposed_dp_s = 1e22;
  r.exposed_ep_s = 7.0;
  r.peak_memory_bytes = 97986560000.0;
  r.capacity_bytes = 85899345920.0;
  r.usd_per_step = 12.345678901234567;
  r.usd_per_mtoken = 0.000123;
  return r;
}

void expect_same_bits(double a, double b, const char* what) {
  if (std::isnan(a)) {
    EXPECT_TRUE(std::isnan(b)) << what;
  } else {
    EXPECT_EQ(std::bit_cast<uint64_t>(a), std::bit_cast<uint64_t>(b)) << what << ": " << a << " vs " << b;
  }
}

void expect_same_row(const SweepRow& a, const SweepRow& b) {
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.engine, b.engine);
  EXPECT_EQ(a.cluster, b.cluster);
  EXPECT_EQ(a.cluster_label, b.cluster_label);
  EXPECT_EQ(a.gpu, b.gpu);
  EXPECT_EQ(a.nodes, b.nodes);
  EXPECT_EQ(a.gpus, b.gpus);
  EXPECT_EQ(a.layout.dp, b.layout.dp);
  EXPECT_EQ(a.layout.tp, b.layout.tp);
  EXPECT_EQ(a.layout.cp, b.layout.cp);
  EXPECT_EQ(a.layout.pp, b.layout.pp);
  EXPECT_EQ(a.layout.vp, b.layout.vp);
  EXPECT_EQ(a.layout.ep, b.layout.ep);
  EXPECT_EQ(a.layout.etp, b.layout.etp);
  EXPECT_EQ(a.layout.schedule, b.layout.schedule);
  EXPECT_EQ(a.layout.zero_stage, b.layout.zero_stage);
  EXPECT_EQ(a.micro_batch, b.micro_batch);
  EXPECT_EQ(a.micro_batches, b.micro_batches);
  EXPECT_EQ(a.layout.recompute, b.layout.recompute);
  EXPECT_EQ(a.layout.sequence_parallel, b.layout.sequence_parallel);
  EXPECT_EQ(a.status, b.status);
  EXPECT_EQ(a.reason, b.reason);
  expect_same_bits(a.step_time_s, b.step_time_s, "step_time_s");
  expect_same_bits(a.tokens_per_s, b.tokens_per_s, "tokens_per_s");
  expect_same_bits(a.tokens_per_s_per_gpu, b.tokens_per_s_per_gpu, "tokens_per_s_per_gpu");
  expect_same_bits(a.mfu, b.mfu, "mfu");
  expect_same_bits(a.tflops_per_gpu, b.tflops_per_gpu, "tflops_per_gpu");
  expect_same_bits(a.compute_s, b.compute_s, "compute_s");
  expect_same_bits(a.bubble_s, b.bubble_s, "bubble_s");
  expect_same_bits(a.host_bound_s, b.host_bound_s, "host_bound_s");
  expect_same_bits(a.optimizer_s, b.optimizer_s, "optimizer_s");
  expect_same_bits(a.exposed_tp_s, b.exposed_tp_s, "exposed_tp_s");
  expect_same_bits(a.exposed_cp_s, b.exposed_cp_s, "exposed_cp_s");
  expect_same_bits(a.exposed_pp_s, b.exposed_pp_s, "exposed_pp_s");
  expect_same_bits(a.exposed_dp_s, b.exposed_dp_s, "exposed_dp_s");
  expect_same_bits(a.exposed_ep_s, b.exposed_ep_s, "exposed_ep_s");
  expect_same_bits(a.peak_memory_bytes, b.peak_memory_bytes, "peak_memory_bytes");
  expect_same_bits(a.capacity_bytes, b.capacity_bytes, "capacity_bytes");
  expect_same_bits(a.usd_per_step, b.usd_per_step, "usd_per_step");
  expect_same_bits(a.usd_per_mtoken, b.usd_per_mtoken, "usd_per_mtoken");
}

/// Finite copy of sample_row (JSON has no inf / NaN; nlohmann writes null for them).
SweepRow finite_row() {
  SweepRow r = sample_row();
  r.exposed_tp_s = 0.5;
  r.exposed_cp_s = -0.25;
  r.exposed_pp_s = 3e-5;
  return r;
}

TEST(SweepRecord, EveryFieldRoundTripsBitForBit) {
  const SweepRow r = sample_row();
  std::string line;
  sweep::append_journal_record(line, r);
  ASSERT_FALSE(line.empty());
  EXPECT_EQ(line.back(), '\n');
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1) << "one line per record";
  line.pop_back();
  // Still one JSON value per line (a JSON array of the columns).
  const nlohmann::json j = nlohmann::json::parse(line);
  ASSERT_TRUE(j.is_array());
  EXPECT_EQ(j.size(), sweep::journal_columns().size());
  SweepRow back;
  std::string error;
  ASSERT_TRUE(sweep::parse_journal_record(line, back, error)) << error;
  expect_same_row(r, back);

  // Every schedule and recompute mode, both booleans, other numbers.
  for (Schedule s : {Schedule::one_f_one_b, Schedule::interleaved, Schedule::gpipe})
    for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full})
      for (bool sp : {false, true}) {
        SweepRow x = finite_row();
        x.layout.schedule = s;
        x.layout.recompute = rc;
        x.layout.sequence_parallel = sp;
        x.id = -7;
        x.step_time_s = 1.0 / 7.0;
        std::string l;
        sweep::append_journal_record(l, x);
        l.pop_back();
        SweepRow y;
        ASSERT_TRUE(sweep::parse_journal_record(l, y, error)) << error;
        expect_same_row(x, y);
      }
}

TEST(SweepRecord, ColumnsAreTheRowJsonKeysInOrder) {
  const nlohmann::json j = sweep::to_json(finite_row());
  std::set<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.insert(k);
  const auto& cols = sweep::journal_columns();
  EXPECT_EQ(std::set<std::string>(cols.begin(), cols.end()), keys);
  EXPECT_EQ(cols.size(), keys.size());
  EXPECT_EQ(cols.front(), "id");
  EXPECT_EQ(cols.back(), "usd_per_mtoken");
}

TEST(SweepRecord, DamagedRecordsAreRefusedNamingTheField) {
  std::string line;
  sweep::append_journal_record(line, finite_row());
  line.pop_back();
  SweepRow r;
  std::string error;
  EXPECT_FALSE(sweep::parse_journal_record(line.substr(0, line.size() / 2), r, error));
  EXPECT_FALSE(error.empty());
  EXPECT_FALSE(sweep::parse_journal_record(line.substr(0, line.size() - 1) + ",1]", r, error));
  EXPECT_NE(error.find("more than"), std::string::npos) << error;
  EXPECT_FALSE(sweep::parse_journal_record("[\"x\"" + line.substr(line.find(',')), r, error));
  EXPECT_NE(error.find("\"id\""), std::string::npos) << error;
  EXPECT_FALSE(sweep::parse_journal_record("{\"id\": 1}", r, error));
}

TEST(SweepRecord, RowJsonIsWhatNlohmannWrites) {
  for (const SweepRow& r : {finite_row(), sample_row(), SweepRow{}}) {
    std::string s;
    sweep::append_row_json(s, r, 0);
    EXPECT_EQ(s, sweep::to_json(r).dump(1));
    // Nested, as in sweep.json: {"rows": [row]}.
    nlohmann::json doc;
    doc["rows"] = nlohmann::json::array({sweep::to_json(r)});
    std::string nested = "{\n \"rows\": [\n  ";
    sweep::append_row_json(nested, r, 2);
    nested += "\n ]\n}";
    EXPECT_EQ(nested, doc.dump(1));
  }
  // Text as nlohmann escapes it; numbers as its Grisu2 writes them.
  for (const std::string t : {"", "plain", "q\"b\\s", "\x7f", "\x1f\b\f\n\r\t", "\xc3\xa9"}) {
    std::string s;
    sweep::append_json_string(s, t);
    EXPECT_EQ(s, nlohmann::json(t).dump()) << t;
  }
  std::string bad;
  EXPECT_THROW(sweep::append_json_string(bad, "\xff"), nlohmann::json::exception);  // as nlohmann's dump
  for (double v : {0.0, -0.0, 1.0, 0.1, 1e21, 1e-7, 123456789.0, 5e-324, 1.7976931348623157e308, 2.0 / 3.0}) {
    std::string s;
    sweep::append_json_double(s, v);
    EXPECT_EQ(s, nlohmann::json(v).dump()) << v;
  }
}

TEST(SweepRecord, CsvLineIsSweepCsvLine) {
  for (SweepRow r : {finite_row(), sample_row(), SweepRow{}}) {
    for (const char* text : {"=1+2", "-1.5", "+0.0%", "@x", "-x", "a,b", "say \"hi\"", "line\nbreak", "", "\tx"}) {
      r.reason = text;
      r.cluster_label = text;
      std::string s;
      sweep::append_csv_line(s, r);
      EXPECT_EQ(s, sweep_csv_line(r)) << text;
    }
  }
}

// ---- journals on disk ----

class SweepIo : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "dtsim-sweepio-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  sweep::RunOptions opts(const fs::path& out, int64_t refine = 2) const {
    sweep::RunOptions o;
    o.out_dir = out.string();
    o.progress = false;
    o.jobs = 2;
    o.refine_top = refine;
    return o;
  }
  fs::path dir_;
};

const char* const kOutputs[] = {"results.csv", "ranked.csv", "sweep.json", "report.md", "report.html"};

/// sweep.json as write_outputs wrote it before it streamed (an nlohmann document).
std::string reference_sweep_json(const SweepSpec& spec, const sweep::Outcome& o) {
  std::vector<const SweepRow*> all;
  for (const auto& r : o.analytic) all.push_back(&r);
  for (const auto& r : o.simgrid) all.push_back(&r);
  std::stable_sort(all.begin(), all.end(), [](const SweepRow* a, const SweepRow* b) {
    if (a->id != b->id) return a->id < b->id;
    return a->engine == "analytic" && b->engine != "analytic";
  });
  const std::vector<SweepRow> ranked = sweep::final_ranking(o, spec.rank_by);
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
  if (!ranked.empty()) j["best"] = sweep::to_json(ranked.front());
  if (!ranked.empty()) j["best_megatron_args"] = sweep::megatron_layout_args(spec, ranked.front());
  nlohmann::json top = nlohmann::json::array();
  for (size_t i = 0; i < ranked.size() && i < 100; ++i) top.push_back(sweep::to_json(ranked[i]));
  j["ranked"] = top;
  nlohmann::json rows = nlohmann::json::array();
  for (const SweepRow* r : all) rows.push_back(sweep::to_json(*r));
  j["rows"] = rows;
  return j.dump(1) + "\n";
}

TEST_F(SweepIo, SweepJsonIsTheNlohmannDocument) {
  const SweepSpec spec = load_sweep_spec(kSmall, SpecKind::sweep);
  const fs::path a = dir_ / "a";
  const sweep::Outcome o = sweep::run_sweep(spec, opts(a));
  ASSERT_EQ(o.simgrid.size(), 2u);
  sweep::write_outputs(spec, o, a.string());
  EXPECT_EQ(read(a / "sweep.json"), reference_sweep_json(spec, o));
  // An empty outcome too (no rows, no best).
  sweep::Outcome none;
  const fs::path e = dir_ / "empty";
  fs::create_directories(e);
  sweep::write_outputs(spec, none, e.string());
  EXPECT_EQ(read(e / "sweep.json"), reference_sweep_json(spec, none));
}

TEST_F(SweepIo, AnalyticRowsAreOneEvaluatorsInIdOrder) {
  // The analytic pass splits its 1,728 points between this thread and a helper with its own
  // Evaluator (sim/sweep/runner.hpp): every row, its results.csv line and the journal are
  // still what one Evaluator gives point by point, in id order, bit for bit.
  const SweepSpec spec = load_sweep_spec(kSmall, SpecKind::sweep);
  const fs::path a = dir_ / "a";
  const sweep::Outcome o = sweep::run_sweep(spec, opts(a, 0));
  const std::vector<sweep::LayoutPoint> points = sweep::enumerate_layouts(spec);
  ASSERT_GT(points.size(), 512u);
  ASSERT_EQ(o.analytic.size(), points.size());
  ASSERT_EQ(o.analytic_csv.size(), points.size());
  sweep::Evaluator ev(spec);
  std::string want_journal, got_records;
  for (size_t i = 0; i < points.size(); ++i) {
    const SweepRow want = ev.analytic(points[i]);
    std::string w, g;
    sweep::append_journal_record(w, want);
    sweep::append_journal_record(g, o.analytic[i]);
    ASSERT_EQ(g, w) << "point " << i;
    EXPECT_EQ(o.analytic_csv[i], sweep_csv_line(want)) << "point " << i;
    want_journal += w;
  }
  const std::string journal = read(a / "journal.jsonl");
  const size_t header_end = journal.find('\n');
  ASSERT_NE(header_end, std::string::npos);
  EXPECT_EQ(journal.substr(header_end + 1), want_journal);
}

TEST_F(SweepIo, JournalIsCompactAndTornLastRecordIsCutOnResume) {
  const SweepSpec spec = load_sweep_spec(kSmall, SpecKind::sweep);
  const fs::path full = dir_ / "full", torn = dir_ / "torn";
  // One re-simulated row: two would be journaled in the order their children finish.
  const sweep::Outcome ref = sweep::run_sweep(spec, opts(full, 1));
  sweep::write_outputs(spec, ref, full.string());
  const std::string journal = read(full / "journal.jsonl");
  const auto header = nlohmann::json::parse(journal.substr(0, journal.find('\n')));
  EXPECT_EQ(header.at("dtsim_sweep_journal"), 2);
  EXPECT_EQ(header.at("columns").get<std::vector<std::string>>(), sweep::journal_columns());
  EXPECT_EQ(journal[journal.find('\n') + 1], '[');
  const auto jc = sweep::read_journal((full / "journal.jsonl").string(), false);
  ASSERT_EQ(jc.rows.size(), ref.analytic.size() + ref.simgrid.size());
  for (size_t i = 0; i < ref.analytic.size(); ++i) expect_same_row(jc.rows[i], ref.analytic[i]);

  // Killed in the middle of a record: everything before it stays, the rest is recomputed.
  fs::create_directories(torn);
  const size_t cut = journal.size() * 3 / 5;
  ASSERT_NE(journal[cut - 1], '\n');
  write(torn / "journal.jsonl", journal.substr(0, cut));
  const size_t complete = journal.rfind('\n', cut - 1) + 1;
  const auto before = sweep::read_journal((torn / "journal.jsonl").string(), true);
  EXPECT_EQ(fs::file_size(torn / "journal.jsonl"), complete);  // the partial record is cut off
  sweep::RunOptions o = opts(torn, 1);
  o.resume = true;
  const sweep::Outcome got = sweep::run_sweep(spec, o);
  EXPECT_EQ(got.resumed_rows, static_cast<int64_t>(before.rows.size()));
  sweep::write_outputs(spec, got, torn.string());
  EXPECT_EQ(read(torn / "journal.jsonl"), journal);  // the same records, in the same order
  for (const char* f : kOutputs) EXPECT_EQ(read(torn / f), read(full / f)) << f;
}

/// The journal of `dir` rewritten in format 1 (one JSON object per row), as dtsim wrote it
/// before format 2.
void to_format_1(const fs::path& dir, size_t keep_rows, const std::string& torn_tail) {
  const auto jc = sweep::read_journal((dir / "journal.jsonl").string(), false);
  const std::string text = read(dir / "journal.jsonl");
  nlohmann::json h = nlohmann::json::parse(text.substr(0, text.find('\n')));
  h["dtsim_sweep_journal"] = 1;
  h.erase("columns");
  std::string out = h.dump() + "\n";
  for (size_t i = 0; i < jc.rows.size() && i < keep_rows; ++i) out += sweep::to_json(jc.rows[i]).dump() + "\n";
  write(dir / "journal.jsonl", out + torn_tail);
}

TEST_F(SweepIo, Format1JournalsAreResumedAndMerged) {
  const SweepSpec spec = load_sweep_spec(kSmall, SpecKind::sweep);
  const fs::path full = dir_ / "full";
  const sweep::Outcome ref = sweep::run_sweep(spec, opts(full));
  sweep::write_outputs(spec, ref, full.string());

  // Resume: a format-1 journal with a torn last line continues; the journal becomes format 2.
  const fs::path old = dir_ / "old";
  ASSERT_EQ(std::system(("cp -r " + full.string() + " " + old.string()).c_str()), 0);
  to_format_1(old, ref.analytic.size() / 2, "{\"id\": 17, \"engi");
  sweep::RunOptions o = opts(old);
  o.resume = true;
  const sweep::Outcome got = sweep::run_sweep(spec, o);
  EXPECT_EQ(got.resumed_rows, static_cast<int64_t>(ref.analytic.size() / 2));
  sweep::write_outputs(spec, got, old.string());
  for (const char* f : kOutputs) EXPECT_EQ(read(old / f), read(full / f)) << f;
  // The same records (the two SimGrid rows in the order their children finished).
  auto sorted_lines = [](const std::string& text) {
    std::multiset<std::string> lines;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) lines.insert(l);
    return lines;
  };
  EXPECT_EQ(sorted_lines(read(old / "journal.jsonl")), sorted_lines(read(full / "journal.jsonl")));

  // Merge: one shard in format 1, one in format 2.
  std::vector<std::string> shards;
  for (int i = 0; i < 2; ++i) {
    sweep::RunOptions so = opts(dir_ / ("shard" + std::to_string(i)));
    so.shard_index = i;
    so.shard_count = 2;
    sweep::run_sweep(spec, so);
    shards.push_back(so.out_dir);
  }
  to_format_1(shards[0], SIZE_MAX, "");
  const sweep::Merged m = sweep::merge_shards(shards);
  const fs::path merged = dir_ / "merged";
  fs::create_directories(merged);
  sweep::write_outputs(spec, m.outcome, merged.string());
  for (const char* f : {"results.csv", "ranked.csv", "sweep.json", "report.md"})
    EXPECT_EQ(read(merged / f), read(full / f)) << f;
}

TEST_F(SweepIo, UnknownFormatsAreRefusedNamingFileAndFormat) {
  const fs::path j = dir_ / "journal.jsonl";
  write(j, "{\"dtsim_sweep_journal\":9,\"fingerprint\":\"x\"}\n[1]\n");
  try {
    sweep::read_journal(j.string(), false);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(j.string()), std::string::npos) << what;
    EXPECT_NE(what.find("format 9"), std::string::npos) << what;
  }
  // Format 2 with other columns (a journal of another dtsim version).
  write(j, "{\"dtsim_sweep_journal\":2,\"columns\":[\"id\"]}\n[1]\n");
  EXPECT_THROW(sweep::read_journal(j.string(), false), InputError);
  // A damaged record names its line.
  std::string rec;
  sweep::append_journal_record(rec, finite_row());
  write(j, sweep::header_line(sweep::JournalHeader{}) + rec + rec.substr(0, 30) + "\n");
  try {
    sweep::read_journal(j.string(), false);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dtsim
