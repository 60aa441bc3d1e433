// Outputs never destroy anything (reports/atomic_file.hpp): --json / --trace / -o write only
// regular files or new paths, "-" is standard output, missing parents are created, a sweep
// directory is locked against a second run, and the README's Slurm recipe runs as written.
// Also the smaller report fixes of the same review: plan's closest option under a GPU
// budget, repeated sweep values, layout labels, and the HTML charts.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/errors.hpp"
#include "models/input_files.hpp"
#include "models/plan_spec.hpp"
#include "models/sweep_spec.hpp"
#include "reports/atomic_file.hpp"
#include "reports/html.hpp"
#include "sim/analytic_engine.hpp"
#include "sim/sweep/journal.hpp"
#include "sim/sweep/report_data.hpp"
#include "sim/sweep/studies.hpp"
#include "sim/sweep/sweep.hpp"
#include "tests/unit/cli_fixture.hpp"

namespace dtsim {
namespace {

namespace fs = std::filesystem;
using cli_test::Outcome;

const fs::path kExample = fs::path(DTSIM_SOURCE_DIR) / "experiments" / "gpt3-175b-selective.yaml";
const fs::path kSmallSweep = fs::path(DTSIM_SOURCE_DIR) / "experiments" / "sweeps" / "gpt-2.7b-32-a100.yaml";
std::string quote(const std::string& s) { return cli_test::shell_quote(s); }
std::string read(const fs::path& p) { return cli_test::read_file(p); }
void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

class OutputSafety : public cli_test::CliTest {
 protected:
  OutputSafety() : CliTest("dtsim-out") {}
  std::string exp() const { return quote(kExample.string()); }
};

// ---- the output path rule ----

TEST_F(OutputSafety, DeviceIsRefusedAndLeftAlone) {
  struct stat before {};
  ASSERT_EQ(::stat("/dev/null", &before), 0);
  for (const char* flag : {"--json", "--trace"}) {
    const Outcome o = dtsim("run " + exp() + " -q " + flag + " /dev/null");
    EXPECT_EQ(o.code, 2) << flag << o.err;
    EXPECT_NE(o.err.find(std::string(flag) + " /dev/null: refusing to write: a character device"), std::string::npos)
        << o.err;
  }
  struct stat after {};
  ASSERT_EQ(::stat("/dev/null", &after), 0);
  EXPECT_TRUE(S_ISCHR(after.st_mode));
  EXPECT_EQ(after.st_rdev, before.st_rdev);
  EXPECT_EQ(after.st_ino, before.st_ino);
}

TEST_F(OutputSafety, FifoDirectoryAndFileAsOutputDirAreRefused) {
  const fs::path fifo = dir_ / "pipe", sub = dir_ / "sub";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_directory(sub);
  const Outcome f = dtsim("run " + exp() + " -q --json " + quote(fifo.string()));
  EXPECT_EQ(f.code, 2) << f.err;
  EXPECT_NE(f.err.find("a FIFO"), std::string::npos) << f.err;
  EXPECT_TRUE(fs::is_fifo(fifo));  // not replaced by a regular file
  const Outcome d = dtsim("run " + exp() + " -q --trace " + quote(sub.string()));
  EXPECT_EQ(d.code, 2) << d.err;
  EXPECT_NE(d.err.find("--trace " + sub.string() + ": refusing to write: a directory"), std::string::npos) << d.err;
  EXPECT_TRUE(fs::is_directory(sub));
  // -o DIR that is a file: refused, the file kept.
  write(dir_ / "plain.txt", "keep");
  const Outcome o = dtsim("sweep " + quote(kSmallSweep.string()) + " -q -o " + quote((dir_ / "plain.txt").string()));
  EXPECT_EQ(o.code, 2) << o.err;
  EXPECT_NE(o.err.find("not a directory"), std::string::npos) << o.err;
  EXPECT_EQ(read(dir_ / "plain.txt"), "keep");
}

TEST_F(OutputSafety, TheInputFileIsRefused) {
  const fs::path in = dir_ / "exp.yaml", hard = dir_ / "hard.yaml";
  fs::copy_file(kExample, in);
  fs::create_hard_link(in, hard);
  const std::string text = read(in);
  for (const fs::path& out : {in, hard}) {
    const Outcome o = dtsim("run " + quote(in.string()) + " -q --json " + quote(out.string()));
    EXPECT_EQ(o.code, 2) << o.err;
    EXPECT_NE(o.err.find("it is the input file " + in.string()), std::string::npos) << o.err;
  }
  EXPECT_EQ(read(in), text);
  // In the library: every recorded input (experiment, sweep file, config.json, profile).
  const fs::path other = dir_ / "profile.yaml";
  write(other, "x: 1\n");
  EXPECT_NO_THROW(check_output_file(other.string(), "--out"));
  note_input_file(other.string());
  EXPECT_THROW(check_output_file(other.string(), "--out"), InputError);
  // A recorded input that was removed no longer counts, though a new file may get its inode.
  fs::remove(other);
  const fs::path fresh = dir_ / "fresh.yaml";
  write(fresh, "y: 2\n");
  EXPECT_NO_THROW(write_file_atomic(fresh.string(), "z: 3\n"));
  EXPECT_EQ(read(fresh), "z: 3\n");
}

TEST_F(OutputSafety, SymlinksAreWrittenThroughToRegularFilesOnly) {
  const fs::path target = dir_ / "target.json", link = dir_ / "link.json";
  write(target, "old");
  ASSERT_EQ(::chmod(target.c_str(), 0640), 0);
  fs::create_symlink(target, link);
  const Outcome o = dtsim("run " + exp() + " -q --json " + quote(link.string()));
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_TRUE(fs::is_symlink(link));  // the link stays a link
  EXPECT_TRUE(nlohmann::json::accept(read(target)));
  EXPECT_EQ(fs::status(target).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);  // mode kept
  const fs::path dangling = dir_ / "dangling.json", to_dev = dir_ / "null.json";
  fs::create_symlink(dir_ / "missing.json", dangling);
  fs::create_symlink("/dev/null", to_dev);
  const Outcome d = dtsim("run " + exp() + " -q --json " + quote(dangling.string()));
  EXPECT_EQ(d.code, 2);
  EXPECT_NE(d.err.find("a symbolic link to a missing file"), std::string::npos) << d.err;
  EXPECT_FALSE(fs::exists(dir_ / "missing.json"));
  const Outcome n = dtsim("run " + exp() + " -q --json " + quote(to_dev.string()));
  EXPECT_EQ(n.code, 2);
  EXPECT_NE(n.err.find("a symbolic link to a character device"), std::string::npos) << n.err;
}

TEST_F(OutputSafety, DashIsStandardOutput) {
  const Outcome o = dtsim("run " + exp() + " --json -");
  ASSERT_EQ(o.code, 0) << o.err;
  const nlohmann::json j = nlohmann::json::parse(o.out);  // stdout holds only the JSON
  EXPECT_GT(j.at("step_time_s").get<double>(), 0);
  EXPECT_NE(o.err.find("step time"), std::string::npos) << o.err;  // the summary went to stderr
  EXPECT_FALSE(fs::exists(dir_ / "-"));
  const Outcome both = dtsim("run " + exp() + " -q --json - --trace -");
  EXPECT_EQ(both.code, 2);
  const Outcome dir = dtsim("sweep " + quote(kSmallSweep.string()) + " -q -o -");
  EXPECT_EQ(dir.code, 2);
  EXPECT_NE(dir.err.find("not standard output"), std::string::npos) << dir.err;
}

TEST_F(OutputSafety, MissingParentsAreCreated) {
  const fs::path out = dir_ / "a" / "b" / "result.json";
  const Outcome o = dtsim("run " + exp() + " -q --json " + quote(out.string()));
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_TRUE(fs::is_regular_file(out));
  write(dir_ / "file", "x");
  const Outcome bad = dtsim("run " + exp() + " -q --json " + quote((dir_ / "file" / "r.json").string()));
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find((dir_ / "file").string() + " is a regular file, not a directory"), std::string::npos)
      << bad.err;
}

// ---- the sweep directory lock ----

TEST_F(OutputSafety, ASecondSweepIntoOneDirectoryIsRefused) {
  const fs::path out = dir_ / "shard";
  fs::create_directories(out);
  // Another sweep holds the lock (as a running `dtsim sweep --resume` does).
  const int fd = ::open(sweep::DirLock::path_in(out.string()).c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  ASSERT_EQ(::write(fd, "4242\n", 5), 5);
  const Outcome o = dtsim("sweep " + quote(kSmallSweep.string()) + " -q --resume -o " + quote(out.string()));
  EXPECT_EQ(o.code, 1) << o.err;
  EXPECT_NE(o.err.find("--out " + out.string() + ": another dtsim sweep (pid 4242) is writing into this directory"),
            std::string::npos)
      << o.err;
  EXPECT_FALSE(fs::exists(out / "journal.jsonl"));
  // In the same process, too.
  EXPECT_THROW(sweep::DirLock{out.string()}, std::runtime_error);
  // The holder ends (the kernel drops its flock): the lock file left behind blocks nothing.
  ::close(fd);
  { sweep::DirLock lock(out.string()); }
  const Outcome again = dtsim("sweep " + quote(kSmallSweep.string()) + " -q --resume -o " + quote(out.string()));
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_TRUE(fs::exists(out / "journal.jsonl"));
}

// ---- README: the Slurm job array, as written ----

/// The README's Slurm script (the ```sh block with #SBATCH) and the merge command of its
/// last comment.
std::pair<std::vector<std::string>, std::string> readme_slurm_recipe() {
  const std::string readme = read(fs::path(DTSIM_SOURCE_DIR) / "README.md");
  const size_t at = readme.find("#SBATCH");
  EXPECT_NE(at, std::string::npos) << "README.md has no Slurm recipe";
  const size_t begin = readme.rfind("```sh\n", at), end = readme.find("```", at);
  std::vector<std::string> commands;
  std::string merge;
  std::istringstream in(readme.substr(begin + 6, end - begin - 6));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("dtsim ", 0) == 0) commands.push_back(line);
    const size_t m = line.find("once the array is done:");
    if (m != std::string::npos) merge = line.substr(line.find("dtsim", m));
  }
  return {commands, merge};
}

TEST_F(OutputSafety, ReadmeSlurmRecipeRunsAsWritten) {
  const auto [commands, merge] = readme_slurm_recipe();
  ASSERT_EQ(commands.size(), 1u);
  ASSERT_NE(merge.find("dtsim merge"), std::string::npos);
  // sweep.yaml: the small example sweep, made smaller (48 layouts, 1 re-simulated per shard).
  std::string spec = read(kSmallSweep);
  spec = spec.substr(0, spec.find("space:")) +
         "space:\n  tp: [1, 2, 4, 8]\n  pp: [1, 2, 4]\n  micro_batch: [1, 2]\nrank_by: cost\nrefine_top: 1\n";
  write(dir_ / "sweep.yaml", spec);
  // Each array task as sbatch would run it: in the submit directory, its task id set.
  const std::string bin_dir = fs::path(DTSIM_BINARY).parent_path().string();
  auto sh = [&](const std::string& env, const std::string& line) {
    const std::string cmd = "cd " + quote(dir_.string()) + " && PATH=" + quote(bin_dir) + ":\"$PATH\" " + env +
                            " bash -c " + quote(line) + " >/dev/null 2>" + quote((dir_ / "err.txt").string());
    return std::system(cmd.c_str());
  };
  for (int task = 0; task < 16; ++task)
    ASSERT_EQ(sh("SLURM_ARRAY_TASK_ID=" + std::to_string(task), commands[0] + " -q"), 0)
        << task << ": " << read(dir_ / "err.txt");
  // A requeued task continues its own shard.
  ASSERT_EQ(sh("SLURM_ARRAY_TASK_ID=3", commands[0] + " -q"), 0) << read(dir_ / "err.txt");
  ASSERT_EQ(sh("", merge + " -q"), 0) << read(dir_ / "err.txt");
  // The merge is what one unsharded run writes, byte for byte (sweep.json and the reports
  // name the sweep file as the shards' command line did: sweep.yaml).
  ASSERT_EQ(sh("", "dtsim sweep sweep.yaml -q -o full"), 0) << read(dir_ / "err.txt");
  for (const char* f : {"results.csv", "ranked.csv", "sweep.json", "report.md", "report.html"})
    EXPECT_EQ(read(dir_ / "merged" / f), read(dir_ / "full" / f)) << f;
  EXPECT_FALSE(read(dir_ / "merged" / "results.csv").empty());
  // Merging into one of the shards would replace that shard's results: refused.
  EXPECT_NE(sh("", "dtsim merge shards/* -q -o shards/0"), 0);
}

// ---- item 6: smaller wrong outputs ----

TEST(ReportFixes, LayoutLabelsShowSpOnlyWithTpAndNeverDp0) {
  Layout l;
  l.dp = 4;
  l.tp = 1;
  l.cp = 1;
  l.pp = 2;
  l.sequence_parallel = true;
  EXPECT_EQ(sweep::layout_label(l, 1).find("SP"), std::string::npos) << sweep::layout_label(l, 1);
  l.tp = 2;
  EXPECT_NE(sweep::layout_label(l, 1).find(" SP"), std::string::npos);
  l.dp = 0;  // tp*cp*pp does not divide the GPUs
  const std::string s = sweep::layout_label(l, 1);
  EXPECT_EQ(s.find("DP0"), std::string::npos) << s;
  EXPECT_EQ(s.rfind("DP? TP2", 0), 0u) << s;
}

TEST_F(OutputSafety, RepeatedValuesInADimensionCountOnce) {
  std::string spec = read(kSmallSweep);
  spec.replace(spec.find("[100 Gb/s, 200 Gb/s]"), 20, "[100 Gb/s, 200 Gb/s, 100 Gb/s]");
  spec.replace(spec.find("pp: [1, 2, 4]"), 13, "pp: [2, 1, 2, 4, 4]");
  write(dir_ / "sweep.yaml", spec);
  const SweepSpec s = load_sweep_spec((dir_ / "sweep.yaml").string(), SpecKind::sweep);
  EXPECT_EQ(s.clusters.size(), 2u);
  EXPECT_EQ(s.space.pp.values, (std::vector<int64_t>{1, 2, 4}));
  const SweepSpec ref = load_sweep_spec(kSmallSweep.string(), SpecKind::sweep);
  EXPECT_EQ(sweep::enumerate_layouts(s).size(), sweep::enumerate_layouts(ref).size());

  std::string plan = read(fs::path(DTSIM_SOURCE_DIR) / "experiments" / "sweeps" / "plan-llama3-70b.yaml");
  plan.replace(plan.find("nodes: [32, 64, 128, 256]"), 25, "nodes: [32, 64, 32, 128, 256, 64]");
  write(dir_ / "plan.yaml", plan);
  const PlanSpec p = load_plan_spec((dir_ / "plan.yaml").string());
  EXPECT_EQ(p.candidates.at(0).sizes.size(), 4u);
}

TEST_F(OutputSafety, PlanWithAGpuBudgetShowsTheClosestByBudget) {
  // GPT 2.7B on 2 or 4 DGX A100 (16, 32 GPUs) with a budget of 8 GPUs: nothing fits.
  const std::string spec = R"(title: budget
tokens: 1e11
gpu_budget: 8
model:
  name: GPT 2.7B
  layers: 32
  hidden: 2560
  heads: 32
  kv_heads: 32
  ffn_hidden: 10240
  activation: gelu
  vocab: 51200
  tied_embeddings: true
  norm: layernorm
  position: learned
  max_position_embeddings: 2048
training:
  seq_len: 2048
  global_batch: 256
  dtype: bf16
candidates:
  - name: A100
    node: dgx-a100
    nodes: [2, 4]
    price_per_gpu_hour: 1.8
space:
  tp: [1, 2]
  pp: [1, 2]
  micro_batch: [1]
refine_top: 1
)";
  write(dir_ / "plan.yaml", spec);
  const sweep::PlanOutcome o = sweep::run_plan(load_plan_spec((dir_ / "plan.yaml").string()), 2, false);
  ASSERT_EQ(o.options.size(), 2u);
  ASSERT_TRUE(o.options[0].entry.ok && o.options[1].entry.ok);
  EXPECT_FALSE(o.chosen_feasible);
  // The old choice, the fastest, is the larger cluster; the closest by budget is the smaller.
  ASSERT_LT(o.options[1].days, o.options[0].days);
  ASSERT_EQ(o.chosen, 0);
  EXPECT_EQ(o.options[0].entry.chosen.gpus, 16);
}

/// The text of every <text ...>...</text> of `svg` with its attributes.
struct SvgText {
  std::string attrs, body;
};
std::vector<SvgText> svg_texts(const std::string& svg) {
  std::vector<SvgText> out;
  const std::regex re("<text([^>]*)>(.*?)</text>");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back({(*it)[1].str(), (*it)[2].str()});
  return out;
}
double attr(const std::string& attrs, const std::string& name) {
  const size_t p = attrs.find(" " + name + "=\"");
  return p == std::string::npos ? NAN : std::stod(attrs.substr(p + name.size() + 3));
}
/// 0.6 em per character: the estimate of reports/html.cpp (wide for sans-serif faces).
double width(const std::string& text, double px) { return static_cast<double>(text.size()) * 0.6 * px; }

TEST(ReportFixes, ChartTitlesAreNotClipped) {
  StackedBarChart c;
  c.title = "Pipeline schedule excerpt: first 12 of 64 micro-batches, interleaved 1F1B (2 chunks per rank) order as "
            "simulated (analytic durations): 8 x DGX H100, nic.bandwidth=400 Gb/s";
  c.series = {"a"};
  c.bars = {"x"};
  c.values = {{1}};
  const std::string svg = svg_stacked_bars(c);
  const double svg_w = attr(svg.substr(0, svg.find('>')), "width");
  std::string title = svg_texts(svg).at(0).body, all;
  const std::regex span("<tspan x=\"([0-9.]+)\"[^>]*>([^<]*)</tspan>");
  int lines = 0;
  for (auto it = std::sregex_iterator(title.begin(), title.end(), span); it != std::sregex_iterator(); ++it, ++lines) {
    EXPECT_LE(std::stod((*it)[1].str()) + width((*it)[2].str(), 14), svg_w) << (*it)[2].str();
    all += (all.empty() ? "" : " ") + (*it)[2].str();
  }
  EXPECT_GE(lines, 2);
  EXPECT_EQ(all, c.title);  // nothing dropped
}

TEST(ReportFixes, BarLabelsDoNotOverlap) {
  StackedBarChart c;
  c.title = "memory";
  c.series = {"a"};
  for (int i = 0; i < 10; ++i) {
    c.bars.push_back("8 x DGX H100, nic.bandwidth=" + std::to_string(100 * (i + 1)) + " Gb/s");
    c.values.push_back({1.0 + i});
  }
  const std::string svg = svg_stacked_bars(c);
  const double svg_h = attr(svg.substr(0, svg.find('>')), "height");
  std::vector<std::pair<double, SvgText>> labels;  // bar labels: class tk, not tick numbers
  for (const auto& t : svg_texts(svg))
    if (t.body.find("Gb/s") != std::string::npos) labels.push_back({attr(t.attrs, "x"), t});
  ASSERT_GE(labels.size(), 5u);
  for (size_t i = 1; i < labels.size(); ++i) {
    const double gap = labels[i].first - labels[i - 1].first;
    const bool rotated = labels[i].second.attrs.find("rotate(-90") != std::string::npos;
    if (rotated) {
      EXPECT_GE(gap, 11.0);  // one line of 11 px text per label
      EXPECT_LE(attr(labels[i].second.attrs, "y") + width(labels[i].second.body, 11), svg_h + 1e-9);
    } else {
      EXPECT_GE(gap, (width(labels[i].second.body, 11) + width(labels[i - 1].second.body, 11)) / 2);
    }
  }
  // Each label keeps its distinguishing end.
  for (const auto& l : labels) EXPECT_NE(l.second.body.find(" Gb/s"), std::string::npos) << l.second.body;
}

TEST(ReportFixes, PerBarLimitsAreDrawn) {
  StackedBarChart c;
  c.title = "memory";
  c.series = {"a"};
  c.bars = {"H100", "H200"};
  c.values = {{60}, {90}};
  c.bar_limits = {76, 135};
  c.limit_label = "HBM capacity";
  const std::string svg = svg_stacked_bars(c);
  size_t n = 0;
  for (size_t p = svg.find("class=\"lim\""); p != std::string::npos; p = svg.find("class=\"lim\"", p + 1)) ++n;
  EXPECT_EQ(n, 2u);
  EXPECT_NE(svg.find("H200: HBM capacity 135"), std::string::npos);
}

TEST(ReportFixes, CompareMemoryChartShowsEachClustersOwnLimit) {
  const SweepSpec spec =
      load_sweep_spec((fs::path(DTSIM_SOURCE_DIR) / "experiments" / "sweeps" / "compare-llama3-8b-nodes.yaml").string(),
                      SpecKind::compare);
  ASSERT_GE(spec.clusters.size(), 2u);
  ASSERT_TRUE(spec.fixed_layout);
  sweep::Evaluator ev(spec);
  std::vector<sweep::StudyEntry> entries;
  for (size_t c = 0; c < 2; ++c) {
    sweep::LayoutPoint p;
    p.cluster = static_cast<int64_t>(c);
    p.layout = spec.clusters[c].base.layout;
    p.micro_batch = spec.clusters[c].base.training.micro_batch;
    {
      const SweepRow r = ev.analytic(p);
      ASSERT_TRUE(r.valid()) << r.reason;
      sweep::StudyEntry e;
      e.cluster = p.cluster;
      e.label = spec.clusters[c].label;
      e.ok = true;
      e.analytic = e.chosen = r;
      AnalyticEngine eng(spec.clusters[c].base);
      e.result = eng.step_result(p.layout, p.micro_batch);
      for (auto& st : e.result.stages) st.memory.capacity_bytes = (c == 0 ? 70.0 : 130.0) * 1024 * 1024 * 1024;
      entries.push_back(std::move(e));
    }
  }
  ASSERT_EQ(entries.size(), 2u);
  const ReportData rep = sweep::compare_report(spec, entries);
  const StackedBarChart* mem = nullptr;
  for (const auto& b : rep.bars)
    if (b.title.find("per cluster") != std::string::npos && b.y_label == "GiB per GPU") mem = &b;
  ASSERT_NE(mem, nullptr);
  EXPECT_EQ(mem->bar_limits, (std::vector<double>{70.0, 130.0}));
  EXPECT_EQ(mem->limit, 0.0);  // no single line at the largest cluster's capacity
}

TEST(ReportFixes, ScheduleExcerptDrawsTheInterleavedOrderSimulated) {
  const SweepSpec spec = load_sweep_spec(kSmallSweep.string(), SpecKind::sweep);
  AnalyticEngine eng(spec.clusters[0].base);
  Layout l;
  l.tp = 2;
  l.cp = 1;
  l.pp = 2;
  l.vp = 2;
  l.dp = 8;
  l.schedule = Schedule::interleaved;
  const TimelineChart t = sweep::schedule_excerpt(eng, l, 1, 8);  // 256 / 8 = 32 micro-batches
  EXPECT_NE(t.title.find("interleaved 1F1B (2 chunks per rank) order as simulated"), std::string::npos) << t.title;
  // Stage 0 in start order: Megatron's warm-up of (p - 1) * 2 + (v - 1) * p = 4 forwards,
  // micro-batches 0, 1 of chunk 0 then 0, 1 of chunk 1 (models/plan.cpp schedule()).
  std::vector<TimelineChart::Event> s0;
  for (const auto& e : t.events)
    if (e.lane == 0) s0.push_back(e);
  std::sort(s0.begin(), s0.end(), [](const auto& a, const auto& b) { return a.start < b.start; });
  ASSERT_GE(s0.size(), 5u);
  EXPECT_EQ(s0[0].label.rfind("stage 0 forward chunk 0 micro-batch 0", 0), 0u) << s0[0].label;
  EXPECT_EQ(s0[1].label.rfind("stage 0 forward chunk 0 micro-batch 1", 0), 0u) << s0[1].label;
  EXPECT_EQ(s0[2].label.rfind("stage 0 forward chunk 1 micro-batch 0", 0), 0u) << s0[2].label;
  EXPECT_EQ(s0[3].label.rfind("stage 0 forward chunk 1 micro-batch 1", 0), 0u) << s0[3].label;
  EXPECT_EQ(s0.size(), 8u * 2 * 2);  // every chunk's forward and backward of 8 micro-batches
  for (size_t i = 1; i < s0.size(); ++i) EXPECT_GE(s0[i].start, s0[i - 1].start + s0[i - 1].duration - 1e-12);
}

}  // namespace
}  // namespace dtsim

namespace dtsim {
namespace {

// A sweep killed while writing its final outputs leaves write_file_atomic's hidden
// temporaries; --resume removes those (and only those) of the files it writes.
TEST(OutputSafetyTemporaries, StaleTemporariesOfTheNamedOutputsAreRemoved) {
  const fs::path d = fs::temp_directory_path() / ("dtsim-stale-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  for (const char* name : {".results.csv.tmp.Ab12Cd", ".results.csv.tmp.toolong1", "results.csv", ".other.tmp.Ab12Cd",
                           ".sweep.json.tmp.zzzzzz"})
    std::ofstream(d / name) << "x";
  EXPECT_EQ(remove_stale_temporaries(d.string(), {"results.csv", "sweep.json"}), 2);
  EXPECT_FALSE(fs::exists(d / ".results.csv.tmp.Ab12Cd"));
  EXPECT_FALSE(fs::exists(d / ".sweep.json.tmp.zzzzzz"));
  for (const char* kept : {".results.csv.tmp.toolong1", "results.csv", ".other.tmp.Ab12Cd"})
    EXPECT_TRUE(fs::exists(d / kept)) << kept;
  fs::remove_all(d);
}

}  // namespace
}  // namespace dtsim
