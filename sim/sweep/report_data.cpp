#include "sim/sweep/report_data.hpp"

#include "models/megatron_args.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "models/plan.hpp"
#include "models/schedules/schedule.hpp"

namespace dtsim::sweep {

std::string megatron_layout_args(const SweepSpec& spec, const SweepRow& r) {
  if (r.cluster < 0 || static_cast<size_t>(r.cluster) >= spec.clusters.size()) return "";
  Experiment e = spec.clusters[static_cast<size_t>(r.cluster)].base;
  e.layout = r.layout;
  e.training.micro_batch = r.micro_batch;
  return shell_join(megatron_args(e, MegatronScope::layout));
}

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string secs(double s) {
  if (s <= 0) return "0";
  if (s >= 1) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.2f} ms", s * 1e3);
  return fmt::format("{:.1f} us", s * 1e6);
}

}  // namespace

std::string layout_label(const Layout& l, int64_t mb) {
  // dp = 0: not resolved (tp*cp*pp does not divide the GPUs); "DP?" rather than "DP0".
  std::string s = (l.dp > 0 ? fmt::format("DP{}", l.dp) : std::string("DP?")) +
                  fmt::format(" TP{} CP{} PP{}", l.tp, l.cp, l.pp);
  if (l.vp > 1) s += fmt::format(" VP{}", l.vp);
  if (l.ep > 1) s += fmt::format(" EP{}", l.ep);
  if (l.ep > 1 && l.expert_tp() != l.tp) s += fmt::format(" ETP{}", l.expert_tp());
  if (l.schedule == Schedule::gpipe) s += " GPipe";
  else if (l.schedule != Schedule::one_f_one_b && l.schedule != Schedule::interleaved) s += std::string(" ") + to_string(l.schedule);
  s += fmt::format(" ZeRO-{}", l.zero_stage);
  if (l.sequence_parallel && l.tp > 1) s += " SP";  // tp = 1: no TP group to split (summary: "off")
  s += std::string(" ") + to_string(l.recompute) + fmt::format(" mb{}", mb);
  return s;
}

TimelineChart schedule_excerpt(AnalyticEngine& engine, const Layout& l, int64_t mb, int64_t max_mb) {
  TimelineChart t;
  double p2p = 0;
  const auto passes = engine.stage_passes(l, mb, &p2p);
  const int64_t p = static_cast<int64_t>(passes.size());
  // The order is the one the engines simulate: the registered schedule's order of each rank
  // (models/schedules/), timed by its own list scheduling (sched::time_order) with analytic
  // durations: a chunk's F is the rank's forward / chunks, its W the rank's weight-gradient
  // part / chunks, its B the rest of the backward.
  const sched::PipelineSchedule& sch = sched::schedule_of(l.schedule);
  const int64_t m_all = engine.experiment(l, mb).training.accumulation(l);
  const sched::Dims dims = sched::dims_of(l, engine.base().training, m_all);
  const int64_t m = std::max<int64_t>(1, std::min(m_all, max_mb));
  const int64_t chunks = sch.chunks(dims);
  const std::string order = l.schedule == Schedule::gpipe        ? std::string("GPipe")
                            : l.schedule == Schedule::interleaved ? fmt::format("interleaved 1F1B ({} chunks per rank)", chunks)
                            : l.schedule == Schedule::one_f_one_b ? std::string("1F1B")
                                                                  : std::string(sch.name());
  t.title = fmt::format("Pipeline schedule excerpt: first {} of {} micro-batches, {} order as simulated (analytic "
                        "durations)", m, m_all, order);
  t.x_label = "seconds from step start";
  for (int64_t s = 0; s < p; ++s) t.lanes.push_back(fmt::format("stage {}", s));
  // DualPipe runs each chunk for half the micro-batches: a chunk's share of the rank's pass
  // of one micro-batch is then the whole pass over both chunks, halved per chunk as well.
  const double share = static_cast<double>(chunks) / (sch.params_twice() ? 2.0 : 1.0);
  std::vector<std::vector<sched::ChunkCosts>> costs(static_cast<size_t>(p));
  for (int64_t s = 0; s < p; ++s) {
    const auto& ps = passes[static_cast<size_t>(s)];
    const sched::ChunkCosts c{ps.forward_s / share, (ps.backward_s - ps.weight_s) / share, ps.weight_s / share};
    costs[static_cast<size_t>(s)].assign(static_cast<size_t>(chunks), c);
  }
  const auto steps = sch.order(dims);
  const sched::OrderTiming timing = sched::time_order(sch, dims, steps, costs, p2p, /*keep_starts=*/true);
  for (int64_t s = 0; s < p; ++s)
    for (size_t k = 0; k < steps[static_cast<size_t>(s)].size(); ++k) {
      const sched::Step& st = steps[static_cast<size_t>(s)][k];
      if (st.mb >= m && !(sch.params_twice() && st.mb >= m_all / 2 && st.mb < m_all / 2 + m)) continue;
      const sched::ChunkCosts& c = costs[static_cast<size_t>(s)][static_cast<size_t>(st.chunk)];
      TimelineChart::Event e;
      e.lane = static_cast<int>(s);
      e.start = timing.starts[static_cast<size_t>(s)][k];
      e.duration = st.pass == sched::Pass::F ? c.f : st.pass == sched::Pass::B ? c.b : st.pass == sched::Pass::W ? c.w : c.b + c.w;
      e.kind = st.pass == sched::Pass::F ? "forward" : st.pass == sched::Pass::W ? "weight" : "backward";
      const std::string what = st.pass == sched::Pass::B   ? "backward (input)"
                               : st.pass == sched::Pass::W ? "backward (weights)"
                                                           : e.kind;
      e.label = chunks > 1 ? fmt::format("stage {} {} chunk {} micro-batch {}: {}", s, what, st.chunk, st.mb, secs(e.duration))
                           : fmt::format("stage {} {} micro-batch {}: {}", s, what, st.mb, secs(e.duration));
      t.events.push_back(std::move(e));
    }
  return t;
}

StackedBarChart memory_chart(const StepResult& r, const std::string& title) {
  StackedBarChart c;
  c.title = title;
  c.y_label = "GiB per GPU";
  c.series = {"parameters", "gradients", "optimizer", "activations", "other"};
  for (const auto& st : r.stages) {
    c.bars.push_back(fmt::format("stage {}", st.stage));
    const auto& m = st.memory;
    c.values.push_back({m.params_bytes / kGiB, m.grads_bytes / kGiB, m.optimizer_bytes / kGiB,
                        m.activations_bytes / kGiB, m.other_bytes / kGiB});
    c.limit = m.capacity_bytes / kGiB;
  }
  c.limit_label = "HBM capacity (minus reserve)";
  return c;
}

std::vector<ChartPoint> pareto_front(std::vector<ChartPoint> pts) {
  std::sort(pts.begin(), pts.end(), [](const ChartPoint& a, const ChartPoint& b) {
    if (a.x != b.x) return a.x < b.x;
    return a.y < b.y;
  });
  std::vector<ChartPoint> front;
  double best = INFINITY;
  for (const auto& p : pts)
    if (p.y < best) {
      best = p.y;
      front.push_back(p);
    }
  return front;
}

ReportData sweep_report(const SweepSpec& spec, const Outcome& o) {
  std::vector<double> an_step;
  const std::vector<SweepRow> rows = final_ranking(o, spec.rank_by, &an_step);
  std::vector<const SweepRow*> ranked;
  ranked.reserve(rows.size());
  for (const auto& x : rows) ranked.push_back(&x);
  return sweep_report(spec, o, ranked, an_step);
}

ReportData sweep_report(const SweepSpec& spec, const Outcome& o, const std::vector<const SweepRow*>& ranked,
                        const std::vector<double>& an_step) {
  ReportData r;
  r.kind = "sweep";
  r.title = spec.title;
  r.source = spec.source;
  int64_t ok = 0, invalid = 0, oom = 0;
  std::map<std::string, int64_t> reasons;
  for (const auto& row : o.analytic) {
    if (row.status == "ok") ++ok;
    else if (row.status == "oom") ++oom;
    else ++invalid;
  }
  const bool priced = std::any_of(spec.clusters.begin(), spec.clusters.end(),
                                  [](const ClusterCase& c) { return c.price_per_gpu_hour > 0; });
  r.summary.push_back({"sweep file", spec.source});
  r.summary.push_back({"clusters", std::to_string(spec.clusters.size())});
  r.summary.push_back({"layouts", fmt::format("{} ({} valid, {} out of memory, {} invalid)", o.analytic.size(), ok, oom,
                                              invalid)});
  r.summary.push_back({"ranked by", to_string(spec.rank_by)});
  const int64_t failed = o.simgrid_errors();
  r.summary.push_back({"re-simulated (SimGrid)",
                       failed == 0 ? std::to_string(o.simgrid.size())
                                   : fmt::format("{} ({} failed: status error, reason in sweep.json)", o.simgrid.size(),
                                                 failed)});
  if (!ranked.empty()) {
    const SweepRow& b = *ranked.front();
    r.summary.push_back({"best layout", b.cluster_label + ": " + layout_label(b.layout, b.micro_batch)});
    r.summary.push_back({"best layout as Megatron-LM flags", megatron_layout_args(spec, b)});
    r.summary.push_back({"best step time", fmt::format("{} ({} engine)", secs(b.step_time_s), b.engine)});
    r.summary.push_back({"best tokens/s per GPU", fmt::format("{:.0f}", b.tokens_per_s_per_gpu)});
    r.summary.push_back({"best MFU", fmt::format("{:.1f} %", b.mfu * 100)});
    if (b.usd_per_mtoken > 0) r.summary.push_back({"best cost", fmt::format("{:.3f} USD per million tokens", b.usd_per_mtoken)});
  }

  // Tables.
  ReportTable top;
  top.caption = fmt::format("Best layouts (top {} of {})", std::min<size_t>(ranked.size(), 25), ranked.size());
  top.columns = {"#", "cluster", "layout", "engine", "step time", "analytic", "tokens/s/GPU", "MFU", "TP exp", "CP exp",
                 "PP exp", "DP exp", "EP exp", "bubble", "host-bound", "peak GiB", "USD/Mtok"};
  for (size_t i = 0; i < ranked.size() && i < 25; ++i) {
    const SweepRow& x = *ranked[i];
    top.rows.push_back({std::to_string(i + 1), x.cluster_label, layout_label(x.layout, x.micro_batch), x.engine,
                        secs(x.step_time_s), secs(an_step[i]), fmt::format("{:.0f}", x.tokens_per_s_per_gpu),
                        fmt::format("{:.1f}%", x.mfu * 100), secs(x.exposed_tp_s), secs(x.exposed_cp_s),
                        secs(x.exposed_pp_s), secs(x.exposed_dp_s), secs(x.exposed_ep_s), secs(x.bubble_s),
                        secs(x.host_bound_s), fmt::format("{:.1f}", x.peak_memory_bytes / kGiB),
                        x.usd_per_mtoken > 0 ? fmt::format("{:.3f}", x.usd_per_mtoken) : "-"});
  }
  r.tables.push_back(top);
  ReportTable bad;
  bad.caption = "Layouts that cannot run (first 25)";
  bad.columns = {"id", "cluster", "layout", "status", "reason"};
  for (const auto& row : o.analytic) {
    if (row.valid()) continue;
    if (bad.rows.size() < 25)
      bad.rows.push_back({std::to_string(row.id), row.cluster_label, layout_label(row.layout, row.micro_batch), row.status,
                          row.reason});
  }
  if (!bad.rows.empty()) r.tables.push_back(bad);

  // Labels (tooltips) only for the points drawn: the first 1,500 of the ranking and the
  // points of the two lines, not for every valid layout.
  constexpr size_t kPlotted = 1500;
  std::vector<std::string> labels(std::min(ranked.size(), kPlotted));
  auto label = [&](size_t i) {
    if (i < labels.size()) {
      if (labels[i].empty())
        labels[i] = ranked[i]->cluster_label + ": " + layout_label(ranked[i]->layout, ranked[i]->micro_batch);
      return labels[i];
    }
    return ranked[i]->cluster_label + ": " + layout_label(ranked[i]->layout, ranked[i]->micro_batch);
  };

  // Throughput vs GPU count.
  ScatterChart thr;
  thr.title = "Throughput vs GPU count (valid layouts; line: best per count)";
  thr.x_label = "GPUs";
  thr.y_label = "tokens/s";
  thr.log_x = true;
  std::map<int64_t, size_t> best_per_gpus;  // GPUs -> index into ranked
  for (size_t i = 0; i < ranked.size(); ++i) {
    const SweepRow& x = *ranked[i];
    if (i < kPlotted) thr.points.push_back({label(i), static_cast<double>(x.gpus), x.tokens_per_s, false});
    auto it = best_per_gpus.find(x.gpus);
    if (it == best_per_gpus.end() || x.tokens_per_s > ranked[it->second]->tokens_per_s) best_per_gpus[x.gpus] = i;
  }
  for (auto& [g, i] : best_per_gpus)
    thr.line.push_back({label(i), static_cast<double>(ranked[i]->gpus), ranked[i]->tokens_per_s, false});
  r.scatters.push_back(thr);

  // Pareto: cost vs time.
  ScatterChart par;
  par.title = priced ? "Cost vs step time (line: Pareto front)" : "GPU-seconds vs step time (line: Pareto front)";
  par.x_label = "step time (s)";
  par.y_label = priced ? "USD per step" : "GPU-seconds per step";
  // pareto_front of every point, labelled afterwards: the points carry their index in
  // `ranked` as their label while the front is found (the same sort, so the same front).
  std::vector<ChartPoint> all;
  all.reserve(ranked.size());
  for (size_t i = 0; i < ranked.size(); ++i) {
    const SweepRow& x = *ranked[i];
    ChartPoint pt{std::string(), x.step_time_s, priced ? x.usd_per_step : x.step_time_s * static_cast<double>(x.gpus),
                  false};
    if (i < kPlotted) {
      par.points.push_back(pt);
      par.points.back().label = label(i);
    }
    pt.label = std::to_string(i);
    all.push_back(std::move(pt));
  }
  par.line = pareto_front(std::move(all));
  for (auto& pt : par.line) pt.label = label(static_cast<size_t>(std::stoull(pt.label)));
  r.scatters.push_back(par);

  // Breakdown of the best layouts.
  StackedBarChart br;
  br.title = "Step time breakdown of the best layouts";
  br.y_label = "seconds per step";
  br.series = {"compute", "bubble", "TP exposed", "CP exposed", "PP exposed", "DP exposed", "EP exposed"};
  for (size_t i = 0; i < ranked.size() && i < 10; ++i) {
    const SweepRow& x = *ranked[i];
    br.bars.push_back(fmt::format("#{}", i + 1));
    br.values.push_back({x.compute_s, x.bubble_s, x.exposed_tp_s, x.exposed_cp_s, x.exposed_pp_s, x.exposed_dp_s, x.exposed_ep_s});
  }
  r.bars.push_back(br);

  if (!ranked.empty()) {
    const SweepRow& b = *ranked.front();
    AnalyticEngine eng(spec.clusters[static_cast<size_t>(b.cluster)].base);
    const StepResult res = eng.step_result(b.layout, b.micro_batch);
    r.bars.push_back(memory_chart(res, "Memory per GPU by pipeline stage, best layout"));
    r.timeline = schedule_excerpt(eng, b.layout, b.micro_batch, 2 * b.layout.pp + 4);
  }
  r.notes.push_back("Every layout is estimated by the analytic engine (sim/analytic_engine.hpp); the best ones are "
                    "re-simulated by the SimGrid engine and ranked by those figures first.");
  r.notes.push_back("Exposed communication is the part of a kind's time during which compute waited (mean over "
                    "pipeline stages).");
  return r;
}

}  // namespace dtsim::sweep
