#pragma once
// Accounting and trace invariants (models/result.hpp CommStats, models/trace.hpp), shared by
// tests/unit/test_accounting_invariants.cpp (small experiments, the analytic engine on every
// shipped one) and tests/slow/test_accounting_invariants_slow.cpp (every shipped experiment):
//  - per stage and kind, 0 <= exposed_s <= total_s; operations > 0 wherever bytes > 0;
//  - per stage, compute + slowdown + exposed (all kinds) + host-bound + bubble = step time,
//    bubble >= 0, host-bound >= 0 (models/host_dispatch.hpp);
//  - the step-level figures are the means of the stages' (operations included);
//  - PP: the plan's sends, receives and PP collectives are the operations counted, and the
//    tied-embedding gradient AllReduce is PP in the plan, the run and explain alike;
//  - the trace (the JSON dtsim writes): complete ("X") slices on every (pid, tid) nest
//    properly, async ("b"/"e") slices pair up, and each kind's slices add up to its total.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/experiment_io.hpp"
#include "models/flops.hpp"
#include "models/pipeline_split.hpp"
#include "models/plan.hpp"
#include "reports/explain.hpp"
#include "reports/json.hpp"
#include "reports/json_read.hpp"
#include "reports/trace.hpp"
#include "sim/analytic_engine.hpp"
#include "sim/child_process.hpp"
#include "sim/engine.hpp"
#include "tests/unit/shipped_files.hpp"

namespace dtsim::accounting_checks {

namespace fs = std::filesystem;

using test_files::kExperiments;
inline constexpr const char* kKinds[] = {"TP", "CP", "PP", "DP", "EP"};

/// The experiment files (as tests/unit/test_experiments_load.cpp: experiments/sweeps/ holds
/// sweep, compare and plan files).
inline std::vector<fs::path> experiment_files() { return test_files::shipped_yaml(); }

/// What the trace says, checked in the child (the trace of a large experiment is big).
struct TraceFacts {
  int64_t complete = 0, async = 0;
  int64_t bad_nesting = 0;     // X slices partly overlapping an enclosing one on their row
  std::string first_bad;       // the first such pair
  int64_t unmatched_async = 0;  // "b" without its "e" (or the other way), or ending before it began
  /// Per pid, per communication category: summed slice durations (seconds).
  std::map<int64_t, std::map<std::string, double>> comm_s;
};

/// Chrome trace-event rules: on one (pid, tid), complete events must nest (each inside the
/// one it starts in, or after it). `tol_us` absorbs the seconds -> microseconds rounding.
inline TraceFacts check_trace(const nlohmann::json& j) {
  TraceFacts f;
  constexpr double tol_us = 1e-6;
  std::map<std::pair<int64_t, int64_t>, std::vector<std::tuple<double, double, std::string>>> rows;
  std::map<std::string, std::pair<double, double>> open;  // id -> (begin, end)
  std::map<std::string, std::pair<int64_t, std::string>> async_of;
  for (const auto& ev : j.at("traceEvents")) {
    const std::string ph = ev.at("ph");
    if (ph == "M") continue;
    const int64_t pid = ev.at("pid").get<int64_t>();
    if (ph == "X") {
      ++f.complete;
      const double ts = ev.at("ts").get<double>(), dur = ev.at("dur").get<double>();
      rows[{pid, ev.at("tid").get<int64_t>()}].emplace_back(ts, ts + dur, ev.at("name").get<std::string>());
      const std::string cat = ev.at("cat");
      if (cat == "TP" || cat == "CP" || cat == "PP" || cat == "DP" || cat == "EP") f.comm_s[pid][cat] += dur * 1e-6;
    } else if (ph == "b" || ph == "e") {
      const std::string id = ev.at("id");
      auto& be = open.try_emplace(id, -1.0, -1.0).first->second;
      (ph == "b" ? be.first : be.second) = ev.at("ts").get<double>();
      if (ph == "b") {
        ++f.async;
        async_of[id] = {pid, ev.at("cat").get<std::string>()};
      }
    } else {
      ++f.unmatched_async;  // no other phase is written
    }
  }
  for (const auto& [id, be] : open) {
    if (be.first < 0 || be.second < be.first - tol_us) {
      ++f.unmatched_async;
      continue;
    }
    const auto& [pid, cat] = async_of[id];
    f.comm_s[pid][cat] += (be.second - be.first) * 1e-6;
  }
  for (auto& [row, spans] : rows) {
    // Parents first: by start, the longer first.
    std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) {
      if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) < std::get<0>(b);
      return std::get<1>(a) > std::get<1>(b);
    });
    std::vector<const std::tuple<double, double, std::string>*> stack;
    for (const auto& s : spans) {
      while (!stack.empty() && std::get<1>(*stack.back()) <= std::get<0>(s) + tol_us) stack.pop_back();
      if (!stack.empty() && std::get<1>(s) > std::get<1>(*stack.back()) + tol_us) {
        if (f.bad_nesting++ == 0)
          f.first_bad = "pid " + std::to_string(row.first) + " tid " + std::to_string(row.second) + ": " +
                        std::get<2>(*stack.back()) + " [" + std::to_string(std::get<0>(*stack.back())) + ", " +
                        std::to_string(std::get<1>(*stack.back())) + "] and " + std::get<2>(s) + " [" +
                        std::to_string(std::get<0>(s)) + ", " + std::to_string(std::get<1>(s)) + "] us";
        continue;
      }
      stack.push_back(&s);
    }
  }
  return f;
}

struct DesRun {
  StepResult result;
  TraceFacts trace;
};

/// Folded DES with a trace, in a child process (SimGrid runs once per process).
/// `reparse`: check the written text parsed back (costs memory on large experiments), else
/// the JSON document the writer builds.
inline DesRun run_des(const Experiment& e, bool fold = true, bool reparse = true) {
  const std::string text = run_in_child(
      [&] {
        Trace trace;
        EngineOptions opts;
        opts.fold = fold;
        opts.trace = &trace;
        const StepResult r = simulate_step(e, opts);
        // The JSON dtsim run --trace writes (reports/trace.hpp).
        const TraceFacts f =
            reparse ? check_trace(nlohmann::json::parse(trace_to_json(trace).dump())) : check_trace(trace_to_json(trace));
        nlohmann::json out;
        out["result"] = result_json_text(r);
        out["complete"] = f.complete;
        out["async"] = f.async;
        out["bad_nesting"] = f.bad_nesting;
        out["first_bad"] = f.first_bad;
        out["unmatched_async"] = f.unmatched_async;
        nlohmann::json comm = nlohmann::json::object();
        for (const auto& [pid, m] : f.comm_s)
          for (const auto& [k, v] : m) comm[std::to_string(pid)][k] = v;
        out["comm_s"] = comm;
        return out.dump();
      },
      "accounting invariants: " + e.source);
  const auto j = nlohmann::json::parse(text);
  DesRun run;
  run.result = result_from_json_text(j.at("result").get<std::string>());
  run.trace.complete = j.at("complete");
  run.trace.async = j.at("async");
  run.trace.bad_nesting = j.at("bad_nesting");
  run.trace.first_bad = j.at("first_bad");
  run.trace.unmatched_async = j.at("unmatched_async");
  for (const auto& [pid, m] : j.at("comm_s").items())
    for (const auto& [k, v] : m.items()) run.trace.comm_s[std::stoll(pid)][k] = v.get<double>();
  return run;
}

/// The invariants of models/result.hpp CommStats on one result.
inline void expect_accounting(const StepResult& r, const std::string& what, bool counts) {
  SCOPED_TRACE(what + " (" + r.engine + ")");
  const double step = r.step_time_s;
  ASSERT_GT(step, 0);
  const double tol = 1e-9 * step;
  std::map<std::string, double> mean_ops, mean_total, mean_exposed;
  double mean_host = 0;
  for (const auto& s : r.stages) {
    double path = s.compute_s + s.slowdown_s + s.bubble_s + s.host_bound_s;
    mean_host += s.host_bound_s / static_cast<double>(r.stages.size());
    EXPECT_GE(s.host_bound_s, 0.0) << "stage " << s.stage;
    for (const char* k : kKinds) {
      ASSERT_TRUE(s.comm.count(k)) << "stage " << s.stage << " " << k;
      const CommStats& c = s.comm.at(k);
      EXPECT_GE(c.exposed_s, 0.0) << "stage " << s.stage << " " << k;
      EXPECT_LE(c.exposed_s, c.total_s * (1 + 1e-12) + 1e-15)
          << "stage " << s.stage << " " << k << ": exposed " << c.exposed_s << " s > total " << c.total_s << " s";
      if (counts && c.bytes > 0) {
        EXPECT_GT(c.operations, 0) << "stage " << s.stage << " " << k << ": bytes without ops";
      }
      EXPECT_EQ(c.operations, std::floor(c.operations)) << "stage " << s.stage << " " << k;
      path += c.exposed_s;
      mean_ops[k] += c.operations / static_cast<double>(r.stages.size());
      mean_total[k] += c.total_s / static_cast<double>(r.stages.size());
      mean_exposed[k] += c.exposed_s / static_cast<double>(r.stages.size());
    }
    EXPECT_NEAR(path, step, tol) << "stage " << s.stage
                                 << ": compute + slowdown + exposed + host-bound + bubble is not the step time";
    EXPECT_GE(s.bubble_s, -tol) << "stage " << s.stage;
    EXPECT_GE(s.slowdown_s, -tol) << "stage " << s.stage;
  }
  EXPECT_NEAR(r.host_bound_s, mean_host, tol) << "step host-bound is not the mean of the stages'";
  for (const char* k : kKinds) {
    const CommStats& c = r.comm.at(k);
    EXPECT_LE(c.exposed_s, c.total_s * (1 + 1e-12) + 1e-15) << k << ": exposed > total (step level)";
    EXPECT_NEAR(c.total_s, mean_total[k], 1e-9 * step) << k;
    EXPECT_NEAR(c.exposed_s, mean_exposed[k], 1e-9 * step) << k;
    if (counts) {
      EXPECT_NEAR(c.operations, mean_ops[k], 1e-9) << k;
      if (c.bytes > 0) {
        EXPECT_GT(c.operations, 0) << k << ": " << c.bytes << " bytes in 0 ops (step level)";
      }
    }
  }
}

/// PP operations of stage s in the plan: sends, receives and PP collectives.
inline int64_t plan_pp_ops(const StagePlan& sp) {
  int64_t n = 0;
  for (const Op& op : sp.ops)
    if (op.kind == CommKind::PP && op.type != OpType::wait) ++n;
  return n;
}

/// Every invariant on one experiment: plan and explain, the DES (with its trace), the
/// analytic engine.
inline void check_experiment(const Experiment& e, const std::string& what, bool fold = true, bool reparse = true) {
  SCOPED_TRACE(what);
  const StepPlan plan = build_step_plan(e);
  const int64_t p = e.layout.pp;

  // The tied-embedding AllReduce: one kind (PP) in the plan, explain and the run.
  bool tied_ar = false;
  for (const auto& sp : plan.stages)
    for (const Op& op : sp.ops)
      if (op.group == GroupKind::EMB) {
        tied_ar = true;
        EXPECT_EQ(op.kind, CommKind::PP) << op.name;
        EXPECT_TRUE(sp.stage == 0 || sp.stage == p - 1) << op.name;
      }
  // A copy of the word embedding (tied, or for MTP: loss_stage_embeds) exists where a stage
  // holds the head without the embedding (not where one rank holds both: DualPipe's first and
  // last, DualPipeV's first).
  bool head_copy = false;
  for (int64_t s = 0; s < p; ++s) {
    const RankSplit rs = rank_split(e.model.layers, e.layout, s);
    head_copy = head_copy || (rs.loss && !rs.embedding);
  }
  EXPECT_EQ(tied_ar, loss_stage_embeds(e.model) && head_copy);
  for (const auto& row : explain_comm_rows(plan))
    if (row.group == GroupKind::EMB) {
      EXPECT_EQ(row.dimension, "PP") << row.op;
      EXPECT_EQ(row.calls_per_stage.front(), 1) << row.op;
      EXPECT_EQ(row.calls_per_stage.back(), 1) << row.op;
    }

  const DesRun des = run_des(e, fold, reparse);
  const StepResult& r = des.result;
  expect_accounting(r, what, /*counts=*/true);
  ASSERT_EQ(static_cast<int64_t>(r.stages.size()), p);
  for (int64_t s = 0; s < p; ++s)
    EXPECT_EQ(r.stages[static_cast<size_t>(s)].comm.at("PP").operations,
              static_cast<double>(plan_pp_ops(plan.stages[static_cast<size_t>(s)])))
        << "stage " << s;

  // The trace: nesting, async pairs, and each kind's slices sum to its total (one
  // simulated rank per stage: pid = the stage's first rank).
  EXPECT_GT(des.trace.complete, 0);
  EXPECT_EQ(des.trace.bad_nesting, 0) << "first: " << des.trace.first_bad;
  EXPECT_EQ(des.trace.unmatched_async, 0);
  EXPECT_EQ(des.trace.async > 0, p > 1);
  const int64_t stage_size = e.layout.tp * e.layout.cp * e.layout.dp;
  for (int64_t s = 0; s < p; ++s) {
    const auto it = des.trace.comm_s.find(s * stage_size);  // folded or not: the stage's first rank
    for (const char* k : kKinds) {
      const double traced = it == des.trace.comm_s.end() || !it->second.count(k) ? 0.0 : it->second.at(k);
      EXPECT_NEAR(traced, r.stages[static_cast<size_t>(s)].comm.at(k).total_s, 1e-9 * r.step_time_s + 1e-12)
          << "stage " << s << " " << k << ": trace slices vs total";
    }
  }

  // The analytic engine keeps the same books.
  const StepResult an = simulate_step_analytic(e);
  expect_accounting(an, what, /*counts=*/false);
  if (e.layout.dp * e.layout.cp == 1) {  // no DP traffic at all: the embedding AllReduce is not DP
    for (const auto* res : {&r, &an}) {
      for (const auto& st : res->stages) {
        EXPECT_EQ(st.comm.at("DP").total_s, 0.0) << res->engine << " stage " << st.stage;
        EXPECT_EQ(st.comm.at("DP").operations, 0.0) << res->engine << " stage " << st.stage;
      }
    }
  }
}

inline std::vector<std::string> experiment_names() {
  std::vector<std::string> names;
  for (const auto& f : experiment_files()) names.push_back(fs::relative(f, kExperiments).string());
  return names;
}

inline std::string test_name(const std::string& path) {
  std::string n = path;
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

}  // namespace dtsim::accounting_checks
