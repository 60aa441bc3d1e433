#include "sim/sweep/studies.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>

#include <fmt/format.h>

#include "models/checked.hpp"

#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "sim/analytic_engine.hpp"
#include "sim/engine.hpp"
#include "sim/sweep/report_data.hpp"
#include "sim/sweep/runner.hpp"
#include "sim/sweep/sweep.hpp"

namespace dtsim::sweep {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string secs(double s) {
  if (s >= 1) return fmt::format("{:.3f} s", s);
  return fmt::format("{:.2f} ms", s * 1e3);
}

std::string pct(double a, double b) {
  if (!(b > 0)) return "-";
  return fmt::format("{:+.1f}%", (a / b - 1) * 100);
}

struct DesJob {
  Experiment exp;
  StepResult result;
  std::string error;
};

/// Runs SimGrid on every job, `jobs` child processes at a time, all forked by this thread
/// (simulate_steps_isolated; no worker threads, sim/child_process.hpp).
void run_des(std::vector<DesJob>& work, int jobs, bool progress, const std::string& label) {
  Progress bar(std::cerr, progress, ::isatty(STDERR_FILENO) != 0);
  bar.start(label, static_cast<int64_t>(work.size()));
  int64_t done = 0;
  simulate_steps_isolated(
      work.size(), jobs, [&](size_t i) { return work[i].exp; },
      [&](size_t i, StepResult&& r, std::exception_ptr error) {
        try {
          if (error) std::rethrow_exception(error);
          work[i].result = std::move(r);
        } catch (const std::exception& e) {
          work[i].error = e.what();
        }
        bar.update(++done);
      });
  bar.finish();
}

/// Best layouts per cluster of a spec with a space: analytic pass, SimGrid on the best
/// `refine` of each cluster, the best by SimGrid chosen.
std::vector<StudyEntry> best_per_cluster(const SweepSpec& spec, int64_t refine, int jobs, bool progress) {
  const std::vector<LayoutPoint> pts = enumerate_layouts(spec);
  Evaluator ev(spec);
  std::vector<std::vector<SweepRow>> rows(spec.clusters.size());
  std::vector<std::vector<const LayoutPoint*>> point_of(spec.clusters.size());
  Progress bar(std::cerr, progress, ::isatty(STDERR_FILENO) != 0);
  bar.start("layouts (analytic)", static_cast<int64_t>(pts.size()));
  int64_t n = 0;
  for (const auto& p : pts) {
    rows[static_cast<size_t>(p.cluster)].push_back(ev.analytic(p));
    point_of[static_cast<size_t>(p.cluster)].push_back(&p);
    bar.update(++n);
  }
  bar.finish();
  std::vector<StudyEntry> out(spec.clusters.size());
  std::vector<DesJob> work;
  std::vector<std::pair<size_t, size_t>> owner;  // (cluster, row index)
  for (size_t c = 0; c < spec.clusters.size(); ++c) {
    StudyEntry& e = out[c];
    e.cluster = static_cast<int64_t>(c);
    e.label = spec.clusters[c].label;
    e.layouts = static_cast<int64_t>(rows[c].size());
    const auto order = ranking(rows[c], spec.rank_by);
    e.valid_layouts = static_cast<int64_t>(order.size());
    if (order.empty()) {
      e.reason = "no valid layout in the space fits this cluster";
      continue;
    }
    e.ok = true;
    e.analytic = e.chosen = rows[c][order.front()];
    for (size_t i = 0; i < order.size() && static_cast<int64_t>(i) < refine; ++i) {
      work.push_back({ev.experiment(*point_of[c][order[i]]), {}, {}});
      owner.push_back({c, order[i]});
    }
    if (refine <= 0) e.result = ev.engine(static_cast<int64_t>(c)).step_result(e.chosen.layout, e.chosen.micro_batch);
  }
  run_des(work, jobs, progress, "layouts (simgrid)");
  std::vector<bool> seen(spec.clusters.size(), false);
  for (size_t w = 0; w < work.size(); ++w) {
    const auto [c, ri] = owner[w];
    if (!work[w].error.empty()) continue;
    const SweepRow des = ev.from_result(*point_of[c][ri], work[w].result, rows[c][ri]);
    StudyEntry& e = out[c];
    if (!seen[c] || rank_value(des, spec.rank_by) < rank_value(e.chosen, spec.rank_by)) {
      e.chosen = des;
      e.analytic = rows[c][ri];
      e.result = work[w].result;
      seen[c] = true;
    }
  }
  for (size_t c = 0; c < out.size(); ++c)
    if (out[c].ok && refine > 0 && !seen[c]) {
      out[c].ok = false;
      out[c].reason = "the SimGrid engine failed on every re-simulated layout";
    }
  return out;
}

}  // namespace

// -------------------------------------------------------------------------- compare --

std::vector<StudyEntry> run_compare(const SweepSpec& spec, int jobs, bool progress) {
  if (!spec.fixed_layout) return best_per_cluster(spec, std::max<int64_t>(1, spec.refine_top), jobs, progress);
  std::vector<StudyEntry> out(spec.clusters.size());
  std::vector<DesJob> work;
  for (size_t c = 0; c < spec.clusters.size(); ++c) work.push_back({spec.clusters[c].base, {}, {}});
  run_des(work, jobs, progress, "clusters (simgrid)");
  for (size_t c = 0; c < spec.clusters.size(); ++c) {
    StudyEntry& e = out[c];
    const Experiment& exp = spec.clusters[c].base;
    e.cluster = static_cast<int64_t>(c);
    e.label = spec.clusters[c].label;
    e.layouts = 1;
    LayoutPoint p;
    p.cluster = e.cluster;
    p.layout = exp.layout;
    p.micro_batch = exp.training.micro_batch;
    Evaluator ev(spec);
    e.analytic = ev.analytic(p);
    e.valid_layouts = e.analytic.valid() ? 1 : 0;
    if (!work[c].error.empty()) {
      e.reason = "SimGrid engine failed: " + work[c].error;
      continue;
    }
    e.result = work[c].result;
    e.chosen = ev.from_result(p, e.result, e.analytic);
    e.ok = true;
    if (e.analytic.status == "oom") e.reason = e.analytic.reason;
  }
  return out;
}

ReportTable compare_table(const std::vector<StudyEntry>& entries) {
  ReportTable t;
  t.caption = "Clusters side by side (differences against the first)";
  t.columns = {"cluster", "GPUs", "layout", "step time", "analytic", "tokens/s/GPU", "MFU", "TP exposed", "CP exposed",
               "PP exposed", "DP exposed", "EP exposed", "bubble", "peak GiB", "fits", "USD/step", "step vs first",
               "cost vs first"};
  const StudyEntry* base = nullptr;
  for (const auto& e : entries)
    if (e.ok) {
      base = &e;
      break;
    }
  for (const auto& e : entries) {
    if (!e.ok) {
      t.rows.push_back({e.label, "", "", "", "", "", "", "", "", "", "", "", "", "", "", "", "", e.reason});
      continue;
    }
    const SweepRow& x = e.chosen;
    t.rows.push_back({e.label, std::to_string(x.gpus), layout_label(x.layout, x.micro_batch), secs(x.step_time_s),
                      secs(e.analytic.step_time_s), fmt::format("{:.0f}", x.tokens_per_s_per_gpu),
                      fmt::format("{:.1f}%", x.mfu * 100), secs(x.exposed_tp_s), secs(x.exposed_cp_s),
                      secs(x.exposed_pp_s), secs(x.exposed_dp_s), secs(x.exposed_ep_s), secs(x.bubble_s),
                      fmt::format("{:.1f}", x.peak_memory_bytes / kGiB), x.status == "oom" ? "no" : "yes",
                      x.usd_per_step > 0 ? fmt::format("{:.2f}", x.usd_per_step) : "-",
                      base ? pct(x.step_time_s, base->chosen.step_time_s) : "-",
                      base && x.usd_per_step > 0 ? pct(x.usd_per_step, base->chosen.usd_per_step) : "-"});
  }
  return t;
}

ReportData compare_report(const SweepSpec& spec, const std::vector<StudyEntry>& entries) {
  ReportData r;
  r.kind = "compare";
  r.title = spec.title;
  r.source = spec.source;
  r.summary.push_back({"compare file", spec.source});
  r.summary.push_back({"clusters", std::to_string(entries.size())});
  r.summary.push_back({"layout", spec.fixed_layout ? "fixed (the file's layout section)"
                                                   : fmt::format("best per cluster (space, {} re-simulated each)",
                                                                 std::max<int64_t>(1, spec.refine_top))});
  const StudyEntry* fastest = nullptr;
  for (const auto& e : entries)
    if (e.ok && (!fastest || e.chosen.step_time_s < fastest->chosen.step_time_s)) fastest = &e;
  if (fastest)
    r.summary.push_back({"fastest", fmt::format("{} ({}, {})", fastest->label, secs(fastest->chosen.step_time_s),
                                                layout_label(fastest->chosen.layout, fastest->chosen.micro_batch))});
  r.tables.push_back(compare_table(entries));

  ScatterChart thr;
  thr.title = "Throughput vs GPU count";
  thr.x_label = "GPUs";
  thr.y_label = "tokens/s";
  thr.log_x = true;
  ScatterChart par;
  par.title = "Cost vs step time (line: Pareto front)";
  par.x_label = "step time (s)";
  const bool priced = std::all_of(entries.begin(), entries.end(), [](const StudyEntry& e) { return !e.ok || e.chosen.usd_per_step > 0; });
  par.y_label = priced ? "USD per step" : "GPU-seconds per step";
  StackedBarChart br;
  br.title = "Step time breakdown per cluster";
  br.y_label = "seconds per step";
  br.series = {"compute", "bubble", "TP exposed", "CP exposed", "PP exposed", "DP exposed", "EP exposed"};
  StackedBarChart mem;
  mem.title = "Memory per GPU, largest stage, per cluster";
  mem.y_label = "GiB per GPU";
  mem.series = {"parameters", "gradients", "optimizer", "activations", "other"};
  std::vector<ChartPoint> all;
  for (const auto& e : entries) {
    if (!e.ok) continue;
    const SweepRow& x = e.chosen;
    thr.points.push_back({e.label, static_cast<double>(x.gpus), x.tokens_per_s, false});
    ChartPoint cp{e.label, x.step_time_s, priced ? x.usd_per_step : x.step_time_s * static_cast<double>(x.gpus), false};
    par.points.push_back(cp);
    all.push_back(cp);
    br.bars.push_back(e.label);
    br.values.push_back({x.compute_s, x.bubble_s, x.exposed_tp_s, x.exposed_cp_s, x.exposed_pp_s, x.exposed_dp_s, x.exposed_ep_s});
    const MemoryBreakdown* peak = nullptr;
    for (const auto& st : e.result.stages)
      if (!peak || st.memory.peak_bytes > peak->peak_bytes) peak = &st.memory;
    mem.bars.push_back(e.label);
    if (peak) {
      mem.values.push_back({peak->params_bytes / kGiB, peak->grads_bytes / kGiB, peak->optimizer_bytes / kGiB,
                            peak->activations_bytes / kGiB, peak->other_bytes / kGiB});
      mem.bar_limits.push_back(peak->capacity_bytes / kGiB);  // this cluster's own GPU
    } else {
      mem.values.push_back({0, 0, 0, 0, 0});
      mem.bar_limits.push_back(0);
    }
  }
  mem.limit_label = "HBM capacity (minus reserve)";
  par.line = pareto_front(all);
  r.scatters.push_back(thr);
  r.scatters.push_back(par);
  r.bars.push_back(br);
  r.bars.push_back(mem);
  for (const auto& e : entries)
    if (e.ok) {
      r.bars.push_back(memory_chart(e.result, "Memory per GPU by pipeline stage: " + e.label));
      AnalyticEngine eng(spec.clusters[static_cast<size_t>(e.cluster)].base);
      r.timeline = schedule_excerpt(eng, e.chosen.layout, e.chosen.micro_batch, 2 * e.chosen.layout.pp + 4);
      r.timeline->title += ": " + e.label;
      break;
    }
  r.notes.push_back("Figures are the SimGrid engine's; 'analytic' is the closed-form estimate of the same layout.");
  return r;
}

// ----------------------------------------------------------------------------- plan --

PlanOutcome run_plan(const PlanSpec& spec, int jobs, bool progress) {
  PlanOutcome o;
  const std::vector<StudyEntry> best = best_per_cluster(spec.sweep, spec.refine_top, jobs, progress);
  size_t k = 0;
  for (size_t c = 0; c < spec.candidates.size(); ++c)
    for (size_t s = 0; s < spec.candidates[c].sizes.size(); ++s, ++k) {
      PlanOption opt;
      opt.candidate = static_cast<int64_t>(c);
      opt.entry = best[k];
      if (opt.entry.ok && opt.entry.chosen.tokens_per_s > 0) {
        const double secs_total = spec.tokens / opt.entry.chosen.tokens_per_s;
        opt.days = secs_total / 86400.0;
        opt.gpu_hours = secs_total / 3600.0 * static_cast<double>(opt.entry.chosen.gpus);
        opt.usd = opt.gpu_hours * spec.candidates[c].price_per_gpu_hour;
        opt.feasible = spec.deadline_s > 0 ? secs_total <= spec.deadline_s : opt.entry.chosen.gpus <= spec.gpu_budget;
      }
      o.options.push_back(std::move(opt));
    }
  // Choice.
  auto better = [&](const PlanOption& a, const PlanOption& b) {
    if (spec.deadline_s > 0) {
      if (a.usd != b.usd) return a.usd < b.usd;
      return a.entry.chosen.gpus < b.entry.chosen.gpus;
    }
    if (a.days != b.days) return a.days < b.days;
    return a.usd < b.usd;
  };
  for (size_t i = 0; i < o.options.size(); ++i) {
    const auto& x = o.options[i];
    if (!x.entry.ok || !x.feasible) continue;
    if (o.chosen < 0 || better(x, o.options[static_cast<size_t>(o.chosen)])) o.chosen = static_cast<int64_t>(i);
  }
  o.chosen_feasible = o.chosen >= 0;
  if (o.chosen < 0) {
    // Nothing meets the constraint: show the closest one. Deadline: the fastest (nearest
    // the deadline). GPU budget: the fewest GPUs (nearest the budget), then the fastest.
    auto closer = [&](const PlanOption& a, const PlanOption& b) {
      if (spec.deadline_s <= 0 && a.entry.chosen.gpus != b.entry.chosen.gpus)
        return a.entry.chosen.gpus < b.entry.chosen.gpus;
      if (a.days != b.days) return a.days < b.days;
      return a.usd < b.usd;
    };
    for (size_t i = 0; i < o.options.size(); ++i) {
      const auto& x = o.options[i];
      if (!x.entry.ok) continue;
      if (o.chosen < 0 || closer(x, o.options[static_cast<size_t>(o.chosen)])) o.chosen = static_cast<int64_t>(i);
    }
  }
  if (o.chosen < 0) return o;

  // Sensitivity of the chosen option (analytic engine).
  const PlanOption& ch = o.options[static_cast<size_t>(o.chosen)];
  const ClusterCase& cc = spec.sweep.clusters[static_cast<size_t>(ch.entry.cluster)];
  const double price = spec.candidates[static_cast<size_t>(ch.candidate)].price_per_gpu_hour;
  auto add_row = [&](const std::string& what, const Experiment& base, const Layout& l, int64_t mb) {
    AnalyticEngine eng(base);
    const AnalyticEstimate est = eng.estimate(l, mb);
    SensitivityRow r;
    r.what = what;
    r.gpus = base.cluster.gpus();
    r.layout = layout_label(l, mb);
    r.ok = true;
    r.step_time_s = est.step_time_s;
    r.mfu = est.mfu;
    if (est.tokens_per_s > 0) {
      const double s = spec.tokens / est.tokens_per_s;
      r.days = s / 86400.0;
      r.usd = s / 3600.0 * static_cast<double>(r.gpus) * price;
    }
    o.sensitivity.push_back(r);
  };
  add_row("chosen option (analytic)", cc.base, ch.entry.chosen.layout, ch.entry.chosen.micro_batch);
  for (double f : spec.nic_factors) {
    Experiment e = cc.base;
    e.cluster.nic.bandwidth *= f;
    add_row(fmt::format("NIC bandwidth x {:g}", f), e, ch.entry.chosen.layout, ch.entry.chosen.micro_batch);
  }
  for (double f : spec.node_factors) {
    const int64_t nodes = std::max<int64_t>(1, static_cast<int64_t>(std::llround(static_cast<double>(cc.base.cluster.nodes) * f)));
    if (const auto gpus = checked::mul(nodes, cc.base.cluster.gpus_per_node); !gpus || *gpus > limits::kMaxGpus) {
      SensitivityRow r;
      r.what = fmt::format("nodes x {:g} ({} nodes)", f, nodes);
      r.gpus = gpus.value_or(0);
      r.layout = "beyond the " + checked::with_commas(limits::kMaxGpus) + "-GPU limit";
      o.sensitivity.push_back(r);
      continue;
    }
    SweepSpec one = spec.sweep;
    one.clusters = {cc};
    one.clusters[0].base.cluster.nodes = nodes;
    one.clusters[0].label = fmt::format("{} nodes", nodes);
    Evaluator ev(one);
    std::vector<SweepRow> rows;
    const auto pts = enumerate_layouts(one);
    for (const auto& p : pts) rows.push_back(ev.analytic(p));
    const auto order = ranking(rows, RankBy::step_time);
    const std::string what = fmt::format("nodes x {:g} ({} nodes)", f, nodes);
    if (order.empty()) {
      SensitivityRow r;
      r.what = what;
      r.gpus = one.clusters[0].base.cluster.gpus();
      r.layout = "no valid layout";
      o.sensitivity.push_back(r);
      continue;
    }
    add_row(what, one.clusters[0].base, rows[order.front()].layout, rows[order.front()].micro_batch);
  }
  return o;
}

ReportTable plan_table(const PlanSpec& spec, const PlanOutcome& o) {
  ReportTable t;
  t.caption = "Options: best layout per GPU type and cluster size";
  t.columns = {"", "GPU type", "GPUs", "layout", "step time", "tokens/s", "MFU", "days", "GPU-hours", "cost (USD)",
               spec.deadline_s > 0 ? "meets deadline" : "within budget"};
  for (size_t i = 0; i < o.options.size(); ++i) {
    const auto& x = o.options[i];
    const std::string mark = static_cast<int64_t>(i) == o.chosen ? (o.chosen_feasible ? "chosen" : "closest") : "";
    const std::string name = spec.candidates[static_cast<size_t>(x.candidate)].name;
    if (!x.entry.ok) {
      t.rows.push_back({mark, name, std::to_string(spec.sweep.clusters[static_cast<size_t>(x.entry.cluster)].base.cluster.gpus()),
                        x.entry.reason, "", "", "", "", "", "", "no"});
      continue;
    }
    const SweepRow& r = x.entry.chosen;
    t.rows.push_back({mark, name, std::to_string(r.gpus), layout_label(r.layout, r.micro_batch), secs(r.step_time_s),
                      fmt::format("{:.0f}", r.tokens_per_s), fmt::format("{:.1f}%", r.mfu * 100),
                      fmt::format("{:.1f}", x.days), fmt::format("{:.0f}", x.gpu_hours), fmt::format("{:.0f}", x.usd),
                      x.feasible ? "yes" : "no"});
  }
  return t;
}

ReportData plan_report(const PlanSpec& spec, const PlanOutcome& o) {
  ReportData r;
  r.kind = "plan";
  r.title = spec.title;
  r.source = spec.source;
  r.summary.push_back({"plan file", spec.source});
  r.summary.push_back({"training tokens", fmt::format("{:.4g}", spec.tokens)});
  if (spec.deadline_s > 0) r.summary.push_back({"deadline", fmt::format("{:.1f} days", spec.deadline_s / 86400.0)});
  else r.summary.push_back({"GPU budget", std::to_string(spec.gpu_budget)});
  if (o.chosen >= 0) {
    const auto& x = o.options[static_cast<size_t>(o.chosen)];
    const SweepRow& c = x.entry.chosen;
    r.summary.push_back({o.chosen_feasible ? "answer" : "no option meets the constraint; closest",
                         fmt::format("{} x {} GPUs", spec.candidates[static_cast<size_t>(x.candidate)].name, c.gpus)});
    r.summary.push_back({"layout", layout_label(c.layout, c.micro_batch)});
    r.summary.push_back({"Megatron-LM flags", megatron_layout_args(spec.sweep, c)});
    r.summary.push_back({"days to train", fmt::format("{:.1f}", x.days)});
    r.summary.push_back({"GPU-hours", fmt::format("{:.0f}", x.gpu_hours)});
    r.summary.push_back({"cost", fmt::format("{:.0f} USD", x.usd)});
    r.summary.push_back({"MFU", fmt::format("{:.1f} %", c.mfu * 100)});
  } else {
    r.summary.push_back({"answer", "no candidate has a valid layout"});
  }
  r.tables.push_back(plan_table(spec, o));
  ReportTable sens;
  sens.caption = "Sensitivity of the chosen option (analytic engine)";
  sens.columns = {"change", "GPUs", "layout", "step time", "MFU", "days", "cost (USD)"};
  for (const auto& s : o.sensitivity)
    sens.rows.push_back({s.what, std::to_string(s.gpus), s.layout, s.ok ? secs(s.step_time_s) : "-",
                         s.ok ? fmt::format("{:.1f}%", s.mfu * 100) : "-", s.ok ? fmt::format("{:.1f}", s.days) : "-",
                         s.ok ? fmt::format("{:.0f}", s.usd) : "-"});
  r.tables.push_back(sens);

  ScatterChart thr;
  thr.title = "Throughput vs GPU count (line: chosen GPU type)";
  thr.x_label = "GPUs";
  thr.y_label = "tokens/s";
  thr.log_x = true;
  ScatterChart par;
  par.title = "Cost vs days to train (line: Pareto front)";
  par.x_label = "days";
  par.y_label = "USD";
  StackedBarChart br;
  br.title = "Step time breakdown per option";
  br.y_label = "seconds per step";
  br.series = {"compute", "bubble", "TP exposed", "CP exposed", "PP exposed", "DP exposed", "EP exposed"};
  std::vector<ChartPoint> all;
  const int64_t chosen_cand = o.chosen >= 0 ? o.options[static_cast<size_t>(o.chosen)].candidate : -1;
  for (size_t i = 0; i < o.options.size(); ++i) {
    const auto& x = o.options[i];
    if (!x.entry.ok) continue;
    const SweepRow& c = x.entry.chosen;
    const std::string label = spec.candidates[static_cast<size_t>(x.candidate)].name + " x " + std::to_string(c.gpus);
    const bool hl = static_cast<int64_t>(i) == o.chosen;
    ChartPoint tp{label, static_cast<double>(c.gpus), c.tokens_per_s, hl};
    thr.points.push_back(tp);
    if (x.candidate == chosen_cand) thr.line.push_back(tp);
    ChartPoint cp{label, x.days, x.usd, hl};
    par.points.push_back(cp);
    all.push_back(cp);
    br.bars.push_back(label);
    br.values.push_back({c.compute_s, c.bubble_s, c.exposed_tp_s, c.exposed_cp_s, c.exposed_pp_s, c.exposed_dp_s, c.exposed_ep_s});
  }
  par.line = pareto_front(all);
  r.scatters.push_back(thr);
  r.scatters.push_back(par);
  r.bars.push_back(br);
  if (o.chosen >= 0) {
    const auto& x = o.options[static_cast<size_t>(o.chosen)];
    r.bars.push_back(memory_chart(x.entry.result, "Memory per GPU by pipeline stage, chosen option"));
    AnalyticEngine eng(spec.sweep.clusters[static_cast<size_t>(x.entry.cluster)].base);
    r.timeline = schedule_excerpt(eng, x.entry.chosen.layout, x.entry.chosen.micro_batch, 2 * x.entry.chosen.layout.pp + 4);
  }
  r.notes.push_back("days = tokens / (tokens/s) / 86400 at the simulated step rate; no restarts, checkpoints or "
                    "failures are counted.");
  r.notes.push_back("Sensitivity rows re-estimate the chosen layout with the analytic engine (a new cluster size "
                    "gets its own best layout).");
  return r;
}

}  // namespace dtsim::sweep
