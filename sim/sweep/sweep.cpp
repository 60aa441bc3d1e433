#include "sim/sweep/sweep.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "models/checked.hpp"
#include "models/errors.hpp"
#include "models/experiment_io.hpp"

namespace dtsim::sweep {

namespace {

std::string strip_file(const std::string& line, const std::string& file) {
  const std::string prefix = file + ": ";
  return line.rfind(prefix, 0) == 0 ? line.substr(prefix.size()) : line;
}

}  // namespace

std::vector<LayoutPoint> enumerate_layouts(const SweepSpec& spec) {
  std::vector<LayoutPoint> out;
  const LayoutSpace& s = spec.space;
  const auto mbs = resolve_micro_batch(s, spec.training_micro_batch);
  const bool sp_both = std::find(s.sequence_parallel.begin(), s.sequence_parallel.end(), false) !=
                           s.sequence_parallel.end() &&
                       std::find(s.sequence_parallel.begin(), s.sequence_parallel.end(), true) !=
                           s.sequence_parallel.end();
  const bool has_zero0 = std::find(s.zero_stages.begin(), s.zero_stages.end(), 0) != s.zero_stages.end();
  // Count the layouts first (checked), and refuse a space above the stated limit before
  // making any.
  {
    const auto n = [](size_t v) { return static_cast<int64_t>(v); };
    std::optional<int64_t> total = 0;
    for (const auto& cc : spec.clusters) {
      std::optional<int64_t> pp_vp = 0;
      for (int64_t pp : resolve_pp(s, cc.base))
        pp_vp = pp_vp ? checked::add(*pp_vp, n(resolve_vp(s, cc.base, pp).size())) : pp_vp;
      // etp: as many values for every tp (missing: one, = tp).
      const int64_t etps = s.etp.is_auto ? n(resolve_etp(s, cc.base, 1).size()) : n(s.etp.values.size());
      const auto per = pp_vp ? checked::product({n(resolve_tp(s, cc.base).size()), n(resolve_cp(s, cc.base).size()),
                                                 n(resolve_ep(s, cc.base).size()), etps,
                                                 *pp_vp, s.dp.is_auto ? 1 : n(s.dp.values.size()),
                                                 n(s.zero_stages.size()), n(mbs.size()), n(s.recompute.size()),
                                                 n(s.sequence_parallel.size()),
                                                 std::max<int64_t>(1, n(s.schedules.size()))})
                             : std::nullopt;
      total = total && per ? checked::add(*total, *per) : std::nullopt;
    }
    if (!total || *total > limits::kMaxSweepLayouts)
      throw InputError(spec.source + ": space gives " +
                       (total ? checked::with_commas(*total) : std::string("more than 2^63")) +
                       " layouts (clusters x tp x cp x ep x etp x pp x vp x dp x zero_stage x micro_batch x recompute x "
                       "sequence_parallel x schedule): more than the " + checked::with_commas(limits::kMaxSweepLayouts) +
                       "-layout limit (each layout is kept with its result and evaluated); narrow the space");
  }
  int64_t id = 0;
  for (size_t ci = 0; ci < spec.clusters.size(); ++ci) {
    const Experiment& base = spec.clusters[ci].base;
    const int64_t gpus = base.cluster.gpus();
    const std::vector<int64_t> eps = resolve_ep(s, base);
    for (int64_t tp : resolve_tp(s, base))
      for (int64_t cp : resolve_cp(s, base))
        for (int64_t ep : eps)
        for (int64_t etp : resolve_etp(s, base, tp))
        for (int64_t pp : resolve_pp(s, base))
          for (int64_t vp : resolve_vp(s, base, pp)) {
            std::vector<int64_t> dps;
            std::string dp_reason;
            const int64_t denom = checked::product({tp, cp, pp}).value_or(0);  // 0: overflow, divides nothing
            if (s.dp.is_auto) {
              if (denom > 0 && gpus % denom == 0) dps.push_back(gpus / denom);
              else {
                dps.push_back(0);
                dp_reason = fmt::format("layout.tp*cp*pp={}*{}*{}={} does not divide the cluster's {} GPUs", tp, cp,
                                        pp, denom > 0 ? std::to_string(denom) : std::string("more than 2^63"), gpus);
              }
            } else {
              dps = s.dp.values;
            }
            for (int64_t dp : dps)
              for (int zero : s.zero_stages)
                for (int64_t mb : mbs)
                  for (Recompute rc : s.recompute)
                    for (bool sp : s.sequence_parallel)
                      for (size_t si = 0; si < std::max<size_t>(1, s.schedules.size()); ++si) {
                      LayoutPoint p;
                      p.id = id++;
                      p.cluster = static_cast<int64_t>(ci);
                      p.layout.dp = dp;
                      p.layout.tp = tp;
                      p.layout.cp = cp;
                      p.layout.pp = pp;
                      p.layout.vp = vp;
                      p.layout.ep = ep;
                      p.layout.etp = etp;
                      p.layout.schedule = !s.schedules.empty() ? s.schedules[si]
                                          : vp > 1           ? Schedule::interleaved
                                                             : Schedule::one_f_one_b;
                      p.layout.zero_stage = zero;
                      p.layout.recompute = rc;
                      p.layout.sequence_parallel = sp;
                      p.micro_batch = mb;
                      p.reason = dp_reason;
                      if (p.reason.empty() && sp && tp == 1 && sp_both)
                        p.reason = "same as sequence_parallel=false (sequence parallelism needs tp > 1)";
                      if (p.reason.empty() && zero > 0 && dp * cp == 1 && has_zero0)
                        p.reason = fmt::format("same as zero_stage=0 (ZeRO-{} has nothing to shard with dp*cp=1)", zero);
                      out.push_back(std::move(p));
                    }
          }
  }
  return out;
}

Evaluator::Evaluator(const SweepSpec& spec) : spec_(spec) {
  for (const auto& c : spec.clusters) {
    engines_.push_back(std::make_unique<AnalyticEngine>(c.base));
    scratch_.push_back(c.base);
  }
}

Experiment Evaluator::experiment(const LayoutPoint& p) const {
  Experiment e = spec_.clusters[static_cast<size_t>(p.cluster)].base;
  e.layout = p.layout;
  e.training.micro_batch = p.micro_batch;
  return e;
}

void Evaluator::fill_identity(SweepRow& row, const LayoutPoint& p) const {
  const ClusterCase& cc = spec_.clusters[static_cast<size_t>(p.cluster)];
  row.id = p.id;
  row.cluster = p.cluster;
  row.cluster_label = cc.label;
  row.gpu = cc.base.cluster.gpu.name;
  row.nodes = cc.base.cluster.nodes;
  row.gpus = cc.base.cluster.gpus();
  row.layout = p.layout;
  row.micro_batch = p.micro_batch;
  if (p.layout.dp > 0 && p.micro_batch > 0) row.micro_batches = cc.base.training.global_batch / (p.micro_batch * p.layout.dp);
}

void Evaluator::fill_cost(SweepRow& row) const {
  const ClusterCase& cc = spec_.clusters[static_cast<size_t>(row.cluster)];
  row.tokens_per_s_per_gpu = row.gpus > 0 ? row.tokens_per_s / static_cast<double>(row.gpus) : 0.0;
  if (cc.price_per_gpu_hour > 0 && row.step_time_s > 0) {
    row.usd_per_step = row.step_time_s / 3600.0 * static_cast<double>(row.gpus) * cc.price_per_gpu_hour;
    const double tokens = static_cast<double>(cc.base.training.global_batch * cc.base.training.seq_len);
    row.usd_per_mtoken = row.usd_per_step / tokens * 1e6;
  }
}

SweepRow Evaluator::analytic(const LayoutPoint& p) {
  SweepRow row;
  fill_identity(row, p);
  row.engine = "analytic";
  if (!p.reason.empty()) {
    row.status = "invalid";
    row.reason = p.reason;
    return row;
  }
  Experiment& e = scratch_[static_cast<size_t>(p.cluster)];
  e.layout = p.layout;
  e.training.micro_batch = p.micro_batch;
  // The checks of validate_experiment, without an exception per invalid layout.
  if (const std::vector<std::string> problems = experiment_problems(e); !problems.empty()) {
    row.status = "invalid";
    for (const auto& line : problems) row.reason += (row.reason.empty() ? "" : "; ") + strip_file(line, e.source);
    return row;
  }
  AnalyticEstimate est;
  try {
    est = engine(p.cluster).estimate(p.layout, p.micro_batch);
  } catch (const InputError& err) {
    row.status = "invalid";
    for (const auto& line : err.problems()) row.reason += (row.reason.empty() ? "" : "; ") + line;
    return row;
  }
  row.step_time_s = est.step_time_s;
  row.tokens_per_s = est.tokens_per_s;
  row.mfu = est.mfu;
  row.tflops_per_gpu = est.tflops_per_gpu;
  row.compute_s = est.compute_s;
  row.bubble_s = est.bubble_s;
  row.host_bound_s = est.host_bound_s;
  row.optimizer_s = est.optimizer_s;
  row.exposed_tp_s = est.comm_exposed_s[static_cast<size_t>(CommKind::TP)];
  row.exposed_cp_s = est.comm_exposed_s[static_cast<size_t>(CommKind::CP)];
  row.exposed_pp_s = est.comm_exposed_s[static_cast<size_t>(CommKind::PP)];
  row.exposed_dp_s = est.comm_exposed_s[static_cast<size_t>(CommKind::DP)];
  row.exposed_ep_s = est.comm_exposed_s[static_cast<size_t>(CommKind::EP)];
  row.peak_memory_bytes = est.peak_memory_bytes;
  row.capacity_bytes = est.capacity_bytes;
  if (est.fits) {
    row.status = "ok";
  } else {
    const double gib = 1024.0 * 1024.0 * 1024.0;
    row.status = "oom";
    row.reason = fmt::format("out of memory: stage {} needs {:.2f} GiB, {:.2f} GiB available", est.peak_stage,
                             est.peak_memory_bytes / gib, est.capacity_bytes / gib);
  }
  fill_cost(row);
  return row;
}

SweepRow Evaluator::from_result(const LayoutPoint& p, const StepResult& r, const SweepRow& analytic_row) const {
  SweepRow row = analytic_row;
  fill_identity(row, p);
  row.engine = r.engine.empty() ? "simgrid" : r.engine;
  row.step_time_s = r.step_time_s;
  row.tokens_per_s = r.tokens_per_s;
  row.mfu = r.mfu;
  row.tflops_per_gpu = r.tflops_per_gpu;
  row.compute_s = r.compute_s;
  row.bubble_s = r.bubble_s;
  row.host_bound_s = r.host_bound_s;
  row.optimizer_s = r.optimizer_s;
  auto exposed = [&](const char* k) {
    auto it = r.comm.find(k);
    return it == r.comm.end() ? 0.0 : it->second.exposed_s;
  };
  row.exposed_tp_s = exposed("TP");
  row.exposed_cp_s = exposed("CP");
  row.exposed_pp_s = exposed("PP");
  row.exposed_dp_s = exposed("DP");
  row.exposed_ep_s = exposed("EP");
  double peak = 0, cap = 0;
  for (const auto& st : r.stages) {
    peak = std::max(peak, st.memory.peak_bytes);
    cap = st.memory.capacity_bytes;
  }
  if (!r.stages.empty()) {
    row.peak_memory_bytes = peak;
    row.capacity_bytes = cap;
  }
  row.usd_per_step = row.usd_per_mtoken = 0;
  fill_cost(row);
  return row;
}

std::vector<size_t> ranking(const std::vector<SweepRow>& rows, RankBy by) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i].valid()) idx.push_back(i);
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    const double va = rank_value(rows[a], by), vb = rank_value(rows[b], by);
    if (va != vb) return va < vb;
    return rows[a].id < rows[b].id;
  });
  return idx;
}

bool RankingBand::holds() const {
  for (size_t i = 0; i < order_fast.size(); ++i)
    if (order_fast[i] != i || order_slow[i] != i) return false;
  return true;
}

RankingBand ranking_band(Evaluator& ev, const std::vector<SweepRow>& ranked, RankBy by, size_t top) {
  RankingBand b;
  b.rows = std::min(top, ranked.size());
  for (size_t i = 0; i < b.rows; ++i) {
    const SweepRow& r = ranked[i];
    LayoutPoint p;
    p.id = r.id;
    p.cluster = r.cluster;
    p.layout = r.layout;
    p.micro_batch = r.micro_batch;
    const auto [lo, hi] = kernel_band_ratios(ev.experiment(p));
    b.fast.push_back(lo);
    b.slow.push_back(hi);
  }
  // Every ranking metric follows the step time of its row: a time or a cost scales with it,
  // a rate (rank_value -tokens/s/GPU) with its inverse.
  auto order = [&](const std::vector<double>& ratio) {
    std::vector<size_t> idx(b.rows);
    for (size_t i = 0; i < b.rows; ++i) idx[i] = i;
    auto value = [&](size_t i) {
      const double v = rank_value(ranked[i], by);
      return by == RankBy::tokens_per_s_per_gpu ? v / ratio[i] : v * ratio[i];
    };
    std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return value(x) < value(y); });
    return idx;
  };
  b.order_fast = order(b.fast);
  b.order_slow = order(b.slow);
  return b;
}

std::string ranking_band_text(const RankingBand& b) {
  if (b.rows < 2) return "";
  if (b.holds())
    return fmt::format("the top {} keep their order at both ends of the kernel-time band", b.rows);
  auto list = [](const std::vector<size_t>& o) {
    std::string t;
    for (size_t i = 0; i < o.size(); ++i) t += fmt::format("{}#{}", i ? ", " : "", o[i] + 1);
    return t;
  };
  std::string t = fmt::format("the top {} change order within the kernel-time band:", b.rows);
  bool any = false;
  for (const auto& [name, o] : {std::pair<const char*, const std::vector<size_t>*>{"fast", &b.order_fast},
                                {"slow", &b.order_slow}}) {
    bool same = true;
    for (size_t i = 0; i < o->size(); ++i) same &= (*o)[i] == i;
    if (same) continue;
    t += fmt::format("{} at the {} end {}", any ? ";" : "", name, list(*o));
    any = true;
  }
  return t;
}

}  // namespace dtsim::sweep
