// Sweeps: spec files (errors name file, key and constraint), enumeration, the journal
// (kill + resume gives the uninterrupted result byte for byte), shards + merge, and the
// shipped examples through the dtsim binary.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "models/errors.hpp"
#include "models/plan_spec.hpp"
#include "models/sweep_spec.hpp"
#include "sim/sweep/journal.hpp"
#include "sim/sweep/runner.hpp"
#include "sim/sweep/sweep.hpp"

namespace dtsim {
namespace {

namespace fs = std::filesystem;

const fs::path kSweeps = fs::path(DTSIM_SOURCE_DIR) / "experiments" / "sweeps";
const std::string kSmall = (kSweeps / "gpt-2.7b-32-a100.yaml").string();

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string all_problems(const InputError& e) {
  std::string s;
  for (const auto& p : e.problems()) s += p + "\n";
  return s;
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "dtsim-sweep-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

const std::string kModel =
    "model: {name: t, layers: 8, hidden: 1024, heads: 16, kv_heads: 16, ffn_hidden: 4096, activation: gelu,\n"
    "        vocab: 8192, tied_embeddings: false, norm: layernorm, position: learned}\n";
const std::string kTraining = "training: {seq_len: 512, global_batch: 64, dtype: bf16}\n";

// ---- spec files ----

TEST(SweepSpec, ReadsClustersVaryAndSpace) {
  const SweepSpec s = parse_sweep_spec(kModel + kTraining +
                                           "clusters: [{name: A, node: dgx-a100, nodes: 2, price_per_gpu_hour: 2}]\n"
                                           "vary: {nodes: [1, 2], nic.bandwidth: [100 Gb/s, 200 Gb/s]}\n"
                                           "space: {tp: [1, 2, 4], pp: {from: 1, to: 4, factor: 2}, micro_batch: 1}\n",
                                       "s.yaml", SpecKind::sweep);
  ASSERT_EQ(s.clusters.size(), 4u);  // 2 node counts x 2 NIC rates
  EXPECT_EQ(s.clusters[0].label, "A, nodes=1, nic.bandwidth=100 Gb/s");
  EXPECT_EQ(s.clusters[3].base.cluster.nodes, 2);
  EXPECT_DOUBLE_EQ(s.clusters[3].base.cluster.nic.bandwidth, 200e9 / 8);
  EXPECT_DOUBLE_EQ(s.clusters[0].price_per_gpu_hour, 2.0);
  EXPECT_EQ(s.space.pp.values, (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(s.clusters[0].base.training.global_batch, 64);
  EXPECT_EQ(s.fingerprint.size(), 16u);
}

TEST(SweepSpec, ErrorsNameFileKeyAndConstraint) {
  try {
    parse_sweep_spec(kModel + kTraining +
                         "clusters: [{node: dgx-a100, nodes: 0, colour: red}]\n"
                         "space: {tp: [1, x], pp: 1, micro_batch: 1, bogus: 3}\nrank_by: speed\n",
                     "bad.yaml", SpecKind::sweep);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    const std::string all = all_problems(e);
    EXPECT_NE(all.find("bad.yaml: unknown key space.bogus"), std::string::npos) << all;
    EXPECT_NE(all.find("bad.yaml: space.tp[1]=\"x\" is not an integer"), std::string::npos) << all;
    EXPECT_NE(all.find("rank_by=\"speed\" is not one of step_time, tokens_per_s_per_gpu, cost"), std::string::npos) << all;
    // Cluster problems come from the experiment rules, renamed to this file's keys.
    EXPECT_NE(all.find("unknown key clusters[0].colour"), std::string::npos) << all;
    EXPECT_NE(all.find("clusters[0].nodes=0 must be a positive integer"), std::string::npos) << all;
    for (const auto& p : e.problems()) EXPECT_EQ(p.rfind("bad.yaml: ", 0), 0u) << p;
  }
}

TEST(SweepSpec, CostRankingNeedsPricesAndCompareNeedsTwoClusters) {
  EXPECT_THROW(parse_sweep_spec(kModel + kTraining + "clusters: [{node: dgx-a100, nodes: 1}]\n"
                                                     "space: {tp: 1, pp: 1, micro_batch: 1}\nrank_by: cost\n",
                                "c.yaml", SpecKind::sweep),
               InputError);
  try {
    parse_sweep_spec(kModel + "training: {seq_len: 512, global_batch: 64, micro_batch: 1}\n"
                              "clusters: [{node: dgx-a100, nodes: 1}]\nlayout: {dp: auto, tp: 8, pp: 1}\n",
                     "cmp.yaml", SpecKind::compare);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(all_problems(e).find("at least 2 clusters"), std::string::npos) << all_problems(e);
  }
  // A compare layout is checked on every cluster: tp 3 does not divide 16 heads.
  try {
    parse_sweep_spec(kModel + "training: {seq_len: 512, global_batch: 64, micro_batch: 1}\n"
                              "clusters: [{node: dgx-a100, nodes: 1}, {node: dgx-h100, nodes: 1}]\n"
                              "layout: {dp: 1, tp: 3, pp: 1}\n",
                     "cmp.yaml", SpecKind::compare);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(all_problems(e).find("layout.tp=3 does not divide model.heads=16"), std::string::npos) << all_problems(e);
    // Checked on each cluster, said once.
    EXPECT_EQ(std::count(e.problems().begin(), e.problems().end(), e.problems().front()), 1) << all_problems(e);
  }
  // A model problem is the same on every cluster: one line, not one per cluster.
  try {
    parse_sweep_spec("model: {hf_config: /nonexistent/config.json}\n"
                     "training: {seq_len: 512, global_batch: 64, micro_batch: 1}\n"
                     "clusters: [{node: dgx-a100, nodes: 1}, {node: dgx-h100, nodes: 1}, {node: dgx-h200, nodes: 1}]\n"
                     "layout: {dp: auto, tp: 1, pp: 1}\n",
                     "cmp.yaml", SpecKind::compare);
    FAIL();
  } catch (const InputError& e) {
    ASSERT_EQ(e.problems().size(), 1u) << all_problems(e);
    EXPECT_NE(e.problems()[0].find("/nonexistent/config.json"), std::string::npos) << e.problems()[0];
  }
}

TEST(SweepSpec, PlanFileRules) {
  const std::string base = kModel + kTraining +
                           "tokens: 1e9\ncandidates: [{node: dgx-h100, nodes: [1, 2], price_per_gpu_hour: 2.5}]\n";
  const PlanSpec p = parse_plan_spec(base + "deadline: 2 weeks\n", "p.yaml");
  EXPECT_DOUBLE_EQ(p.deadline_s, 14 * 86400.0);
  ASSERT_EQ(p.candidates.size(), 1u);
  EXPECT_EQ(p.candidates[0].sizes.size(), 2u);
  EXPECT_THROW(parse_plan_spec(base, "p.yaml"), InputError);                               // neither
  EXPECT_THROW(parse_plan_spec(base + "deadline: 3\n", "p.yaml"), InputError);             // no unit
  EXPECT_THROW(parse_plan_spec(base + "deadline: 3 d\ngpu_budget: 8\n", "p.yaml"), InputError);  // both
}

TEST(SweepSpec, ShippedFilesLoad) {
  // experiments/sweeps: compare-*.yaml are compare files, plan-*.yaml plan files, the rest sweeps.
  int n = 0;
  for (const auto& e : fs::directory_iterator(kSweeps)) {
    if (e.path().extension() != ".yaml") continue;
    const std::string name = e.path().filename().string();
    SCOPED_TRACE(name);
    if (name.rfind("plan-", 0) == 0) EXPECT_NO_THROW(load_plan_spec(e.path().string()));
    else if (name.rfind("compare-", 0) == 0) EXPECT_NO_THROW(load_sweep_spec(e.path().string(), SpecKind::compare));
    else EXPECT_NO_THROW(load_sweep_spec(e.path().string(), SpecKind::sweep));
    ++n;
  }
  EXPECT_GE(n, 4);
}

// ---- enumeration ----

TEST(SweepEnumerate, EveryPointKeptWithItsReason) {
  const SweepSpec s = load_sweep_spec(kSmall, SpecKind::sweep);
  const auto pts = sweep::enumerate_layouts(s);
  // 2 clusters x tp {1,2,4,8} x pp {1,2,4} x vp {1,2} x zero {0,1,3} x mb {1,2,4} x rc 2 x sp 2.
  ASSERT_EQ(pts.size(), 2u * 4 * 3 * 2 * 3 * 3 * 2 * 2);
  for (size_t i = 0; i < pts.size(); ++i) EXPECT_EQ(pts[i].id, static_cast<int64_t>(i));
  sweep::Evaluator ev(s);
  std::set<std::string> statuses;
  int duplicates = 0;
  for (const auto& p : pts) {
    const SweepRow r = ev.analytic(p);
    statuses.insert(r.status);
    if (!r.valid()) {
      EXPECT_FALSE(r.reason.empty()) << "id " << r.id;
    }
    if (r.reason.find("same as sequence_parallel=false") != std::string::npos) ++duplicates;
    if (p.layout.vp == 2 && p.layout.pp == 1) {
      EXPECT_EQ(r.status, "invalid");  // interleaving needs pp > 1
    }
  }
  EXPECT_TRUE(statuses.count("ok"));
  EXPECT_TRUE(statuses.count("invalid"));
  EXPECT_GT(duplicates, 0);
}

// ep and etp are space dimensions (issue 16): ep auto = the divisors of the expert count, etp
// missing = tp; a folding that does not divide is an invalid point naming the constraint;
// the journal keeps ep/etp and the exposed EP time.
TEST(SweepEnumerate, ExpertParallelDimensions) {
  const std::string moe_model =
      "model: {name: m, layers: 4, hidden: 1024, heads: 16, kv_heads: 16, ffn_hidden: 4096, activation: swiglu,\n"
      "        vocab: 8192, tied_embeddings: false, norm: rmsnorm, position: rope,\n"
      "        moe: {num_experts: 8, router_topk: 2, moe_ffn_hidden: 1024}}\n";
  const std::string text = moe_model + kTraining +
                           "clusters: [{node: dgx-h100, nodes: 2}]\n"
                           "space: {tp: [1, 2], pp: 1, ep: auto, micro_batch: 1, sequence_parallel: true}\n";
  const SweepSpec s = parse_sweep_spec(text, "moe.yaml", SpecKind::sweep);
  EXPECT_EQ(resolve_ep(s.space, s.clusters[0].base), (std::vector<int64_t>{1, 2, 4, 8}));
  const auto pts = sweep::enumerate_layouts(s);
  ASSERT_EQ(pts.size(), 2u * 4);  // tp x ep (etp = tp)
  sweep::Evaluator ev(s);
  int ok = 0;
  for (const auto& p : pts) {
    EXPECT_EQ(p.layout.etp, p.layout.tp);
    const SweepRow r = ev.analytic(p);
    if (!r.valid()) {
      ADD_FAILURE() << "ep " << p.layout.ep << " tp " << p.layout.tp << ": " << r.reason;
      continue;
    }
    ++ok;
    // EP time: the dispatch/combine AllToAlls (ep > 1) and the ETP collectives (etp > 1).
    EXPECT_EQ(p.layout.ep > 1 || p.layout.etp > 1, r.exposed_ep_s > 0) << "ep " << p.layout.ep;
    const SweepRow back = sweep::row_from_json(sweep::to_json(r));
    EXPECT_EQ(back.layout.ep, p.layout.ep);
    EXPECT_EQ(back.layout.etp, p.layout.etp);
    EXPECT_EQ(back.exposed_ep_s, r.exposed_ep_s);
    EXPECT_GT(r.host_bound_s, 0.0);  // the dispatcher's host sync in every MoE forward
    EXPECT_EQ(back.host_bound_s, r.host_bound_s);
  }
  EXPECT_EQ(ok, 8);
  // etp explicit; ep 3 does not divide the 8 experts: invalid with the constraint named.
  const SweepSpec s2 = parse_sweep_spec(
      moe_model + kTraining + "clusters: [{node: dgx-h100, nodes: 2}]\n"
      "space: {tp: 2, pp: 1, ep: [3, 4], etp: [1, 2], micro_batch: 1, sequence_parallel: true}\n",
      "moe.yaml", SpecKind::sweep);
  const auto pts2 = sweep::enumerate_layouts(s2);
  ASSERT_EQ(pts2.size(), 4u);
  sweep::Evaluator ev2(s2);
  for (const auto& p : pts2) {
    const SweepRow r = ev2.analytic(p);
    if (p.layout.ep == 3) {
      EXPECT_EQ(r.status, "invalid");
      EXPECT_NE(r.reason.find("ep"), std::string::npos) << r.reason;
    } else {
      EXPECT_TRUE(r.valid()) << r.reason;
    }
  }
}

// A training option whose constraints involve the layout (overlap_moe_expert_parallel_comm
// needs ep > 1) keeps the cluster: each layout reports its own problem. (The placeholder
// layout the cluster is composed on used to fail it, and the cluster was dropped without a
// word: zero layouts.)
TEST(SweepEnumerate, LayoutConstraintsOfTrainingOptionsStayWithTheLayouts) {
  const std::string text =
      "model: {name: m, layers: 4, hidden: 1024, heads: 16, kv_heads: 16, ffn_hidden: 4096, activation: swiglu,\n"
      "        vocab: 8192, tied_embeddings: false, norm: rmsnorm, position: rope,\n"
      "        moe: {num_experts: 8, router_topk: 2, moe_ffn_hidden: 1024}}\n"
      "training: {seq_len: 512, global_batch: 64, overlap_moe_expert_parallel_comm: true}\n"
      "clusters: [{node: dgx-h100, nodes: 2}]\n"
      "space: {tp: 1, pp: 1, ep: [1, 8], micro_batch: 1}\n";
  const SweepSpec s = parse_sweep_spec(text, "moe.yaml", SpecKind::sweep);
  ASSERT_EQ(s.clusters.size(), 1u);
  const auto pts = sweep::enumerate_layouts(s);
  ASSERT_EQ(pts.size(), 2u);
  sweep::Evaluator ev(s);
  for (const auto& p : pts) {
    const SweepRow r = ev.analytic(p);
    if (p.layout.ep == 1) {
      EXPECT_EQ(r.status, "invalid");
      EXPECT_NE(r.reason.find("overlap_moe_expert_parallel_comm needs layout.ep > 1"), std::string::npos) << r.reason;
    } else {
      EXPECT_TRUE(r.valid()) << r.reason;
    }
  }
  // A problem of the training section itself still fails the file.
  try {
    std::string bad = text;
    bad.replace(bad.find("global_batch: 64"), 16, "global_batch: -1");
    parse_sweep_spec(bad, "bad.yaml", SpecKind::sweep);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("global_batch"), std::string::npos) << e.what();
  }
}

// ---- journal: kill, resume, shards ----

sweep::RunOptions quiet(const fs::path& out) {
  sweep::RunOptions o;
  o.out_dir = out.string();
  o.progress = false;
  o.jobs = 2;
  return o;
}

/// Runs the sweep in a child process that SIGKILLs itself once `kill_after` rows are in the
/// journal (a sweep killed midway, as by a scheduler).
void run_and_kill(const SweepSpec& spec, const fs::path& out, int64_t kill_after) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    sweep::RunOptions o = quiet(out);
    o.on_flush = [kill_after](int64_t rows) {
      if (rows >= kill_after) ::raise(SIGKILL);
    };
    try {
      sweep::run_sweep(spec, o);
    } catch (...) {
    }
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the sweep finished before it was killed";
}

class SweepJournal : public TempDir {};

TEST_F(SweepJournal, KilledAndResumedEqualsUninterrupted) {
  const SweepSpec spec = load_sweep_spec(kSmall, SpecKind::sweep);
  const fs::path full = dir_ / "full", a = dir_ / "killed_analytic", b = dir_ / "killed_simgrid";
  const sweep::Outcome ref = sweep::run_sweep(spec, quiet(full));
  sweep::write_outputs(spec, ref, full.string());
  const int64_t points = ref.points;
  ASSERT_GT(points, 1000);

  // Killed in the analytic pass (after the first journal flush), then in the SimGrid pass.
  run_and_kill(spec, a, 512);
  run_and_kill(spec, b, points + 2);
  for (const fs::path& d : {a, b}) {
    const auto before = sweep::read_journal((d / "journal.jsonl").string(), false);
    EXPECT_LT(static_cast<int64_t>(before.rows.size()), points + 4) << d;
    // A partial last line, as a kill during write(2) can leave.
    { std::ofstream(d / "journal.jsonl", std::ios::app) << "{\"id\": 17, \"engi"; }
    EXPECT_THROW(sweep::run_sweep(spec, quiet(d)), InputError);  // no --resume: refuses to overwrite
    sweep::RunOptions o = quiet(d);
    o.resume = true;
    const sweep::Outcome got = sweep::run_sweep(spec, o);
    EXPECT_EQ(got.resumed_rows, static_cast<int64_t>(before.rows.size()));
    sweep::write_outputs(spec, got, d.string());
    // No row lost or duplicated: the journal has each (id, engine) once, and the sorted outputs
    // equal the uninterrupted run's byte for byte.
    const auto after = sweep::read_journal((d / "journal.jsonl").string(), false);
    std::set<std::pair<int64_t, std::string>> keys;
    for (const auto& r : after.rows) EXPECT_TRUE(keys.insert({r.id, r.engine}).second) << r.id << " " << r.engine;
    EXPECT_EQ(static_cast<int64_t>(keys.size()), points + 4);
    for (const char* f : {"results.csv", "ranked.csv", "sweep.json", "report.md"})
      EXPECT_EQ(read(d / f), read(full / f)) << d << "/" << f;
  }
}

TEST_F(SweepJournal, ShardsMergeToTheUnshardedResult) {
  const SweepSpec spec = load_sweep_spec(kSmall, SpecKind::sweep);
  const fs::path full = dir_ / "full", merged = dir_ / "merged";
  sweep::write_outputs(spec, sweep::run_sweep(spec, quiet(full)), full.string());
  std::vector<std::string> shards;
  for (int i = 0; i < 3; ++i) {
    sweep::RunOptions o = quiet(dir_ / ("shard" + std::to_string(i)));
    o.shard_index = i;
    o.shard_count = 3;
    sweep::run_sweep(spec, o);
    shards.push_back(o.out_dir);
  }
  EXPECT_THROW(sweep::merge_shards({shards[0], shards[1]}), InputError);  // shard 2/3 missing
  EXPECT_THROW(sweep::merge_shards({shards[0], shards[0], shards[1], shards[2]}), InputError);  // repeated
  {  // Shard 0 as a kill after its analytic pass leaves it: every layout, none re-simulated.
    const fs::path cut = dir_ / "shard0-cut";
    fs::create_directories(cut);
    std::ifstream in(fs::path{shards[0]} / "journal.jsonl");
    std::ofstream out(cut / "journal.jsonl");
    int dropped = 0;
    for (std::string line; std::getline(in, line);) {
      if (line.find("\"simgrid\"") != std::string::npos) ++dropped;
      else out << line << "\n";
    }
    out.close();
    ASSERT_GT(dropped, 0);
    try {
      sweep::merge_shards({cut.string(), shards[1], shards[2]});
      ADD_FAILURE() << "a shard without its SimGrid re-simulations was merged";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("is incomplete (0 of " + std::to_string(dropped) + " SimGrid re-simulations)"),
                std::string::npos)
          << e.what();
    }
  }
  {  // Shard 2 as run from another checkout: the same spec bytes at another path still merge.
    const fs::path moved = dir_ / "shard2-moved";
    fs::create_directories(moved);
    std::ifstream in(fs::path{shards[2]} / "journal.jsonl");
    std::ofstream out(moved / "journal.jsonl");
    std::string header;
    std::getline(in, header);
    const std::string key = "\"spec\":\"";
    const auto at = header.find(key);
    ASSERT_NE(at, std::string::npos) << header.substr(0, 200);
    header.insert(at + key.size(), "/elsewhere");
    out << header << "\n" << in.rdbuf();
    out.close();
    const sweep::Merged moved_m = sweep::merge_shards({shards[0], shards[1], moved.string()});
    EXPECT_EQ(moved_m.outcome.analytic.size(), static_cast<size_t>(sweep::merge_shards(shards).outcome.analytic.size()));
  }
  const sweep::Merged m = sweep::merge_shards(shards);
  EXPECT_EQ(m.fingerprint, spec.fingerprint);
  fs::create_directories(merged);
  sweep::write_outputs(spec, m.outcome, merged.string());
  for (const char* f : {"results.csv", "ranked.csv", "sweep.json", "report.md", "report.html"})
    EXPECT_EQ(read(merged / f), read(full / f)) << f;
}

TEST_F(SweepJournal, ImpossibleValuesInAJournalAreDamageNotResults) {
  const SweepSpec spec = load_sweep_spec(kSmall, SpecKind::sweep);
  const fs::path d = dir_ / "damaged";
  sweep::run_sweep(spec, quiet(d));
  const fs::path j = d / "journal.jsonl";
  std::ifstream in(j);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  in.close();
  ASSERT_GT(lines.size(), 2u);
  // Column 22 is step_time_s (journal_columns()); a negative step no run writes.
  nlohmann::json row = nlohmann::json::parse(lines[1]);
  ASSERT_EQ(nlohmann::json::parse(lines[0]).at("columns").at(22), "step_time_s");
  row[22] = -1e308;
  lines[1] = row.dump();
  {
    std::ofstream out(j);
    for (const auto& l : lines) out << l << "\n";
  }
  try {
    sweep::read_journal(j.string(), false);
    ADD_FAILURE() << "a negative step time was read as a result";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("line 2: damaged sweep journal record: step_time_s"), std::string::npos)
        << e.what();
  }
}

TEST(SweepShard, ParsesIOverN) {
  EXPECT_EQ(sweep::parse_shard("2/5"), (std::pair<int64_t, int64_t>{2, 5}));
  EXPECT_THROW(sweep::parse_shard("5/5"), InputError);
  EXPECT_THROW(sweep::parse_shard("1-4"), InputError);
  EXPECT_THROW(sweep::parse_shard("a/4"), InputError);
  // Digits only: no white space or sign around either number, no empty part.
  for (const char* bad : {" 1/2", "1/ 2", "1/2 ", "+1/2", "1/+2", "-0/2", "/2", "1/", "1/2/3", "0x1/2"})
    EXPECT_THROW(sweep::parse_shard(bad), InputError) << bad;
}

// ---- the shipped examples through the binary ----

class SweepCli : public TempDir {
 protected:
  int run(const std::string& args) {
    const std::string cmd = std::string(DTSIM_BINARY) + " " + args + " >" + (dir_ / "out.txt").string() + " 2>" +
                            (dir_ / "err.txt").string();
    const int st = std::system(cmd.c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
};

TEST_F(SweepCli, ExamplesRun) {
  ASSERT_EQ(run("sweep " + kSmall + " -o " + (dir_ / "s").string()), 0) << read(dir_ / "err.txt");
  for (const char* f : {"journal.jsonl", "results.csv", "ranked.csv", "sweep.json", "report.html", "report.md"})
    EXPECT_TRUE(fs::exists(dir_ / "s" / f)) << f;
  // Progress bar with ETA on stderr; the summary on stdout.
  EXPECT_NE(read(dir_ / "err.txt").find("ETA"), std::string::npos);
  EXPECT_NE(read(dir_ / "out.txt").find("#1 "), std::string::npos);
  // Running again into the same directory needs --resume.
  EXPECT_EQ(run("sweep " + kSmall + " -o " + (dir_ / "s").string()), 2);
  EXPECT_EQ(run("sweep " + kSmall + " -o " + (dir_ / "s").string() + " --resume -q"), 0) << read(dir_ / "err.txt");

  for (const char* f : {"compare-llama3-8b-nodes.yaml", "compare-llama3-70b-nic.yaml"}) {
    ASSERT_EQ(run("compare " + (kSweeps / f).string() + " -q -o " + (dir_ / "c").string()), 0) << f << read(dir_ / "err.txt");
    EXPECT_TRUE(fs::exists(dir_ / "c" / "report.html"));
    EXPECT_NE(read(dir_ / "c" / "compare.csv").find("step vs first"), std::string::npos);
  }
  ASSERT_EQ(run("plan " + (kSweeps / "plan-llama3-70b.yaml").string() + " -o " + (dir_ / "p").string()), 0)
      << read(dir_ / "err.txt");
  EXPECT_NE(read(dir_ / "out.txt").find("answer:"), std::string::npos) << read(dir_ / "out.txt");
  EXPECT_NE(read(dir_ / "p" / "plan.csv").find("chosen"), std::string::npos);

  // Input errors exit 2 with the file and key named.
  { std::ofstream(dir_ / "bad.yaml") << kModel << kTraining << "clusters: [{node: dgx-a100, nodes: 1}]\nspace: {tp: 1}\n"; }
  EXPECT_EQ(run("sweep " + (dir_ / "bad.yaml").string() + " -o " + (dir_ / "b").string()), 2);
  EXPECT_NE(read(dir_ / "err.txt").find("bad.yaml: space.pp is required"), std::string::npos) << read(dir_ / "err.txt");
}

TEST_F(SweepCli, ShardedRunsMergeFromTheCommandLine) {
  for (int i = 0; i < 2; ++i)
    ASSERT_EQ(run("sweep " + kSmall + " -q --shard " + std::to_string(i) + "/2 -o " + (dir_ / std::to_string(i)).string()), 0)
        << read(dir_ / "err.txt");
  ASSERT_EQ(run("merge " + (dir_ / "0").string() + " " + (dir_ / "1").string() + " -o " + (dir_ / "m").string()), 0)
      << read(dir_ / "err.txt");
  EXPECT_TRUE(fs::exists(dir_ / "m" / "ranked.csv"));
  EXPECT_EQ(run("merge " + (dir_ / "0").string() + " -o " + (dir_ / "m2").string()), 2);
  EXPECT_NE(read(dir_ / "err.txt").find("shard 1/2 is missing"), std::string::npos) << read(dir_ / "err.txt");
}

}  // namespace
}  // namespace dtsim
