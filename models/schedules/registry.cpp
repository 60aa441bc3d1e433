// The pipeline-schedule registry and the order analysis every consumer shares
// (models/schedules/schedule.hpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "models/schedules/schedule.hpp"
#include "models/schedules/schedules.hpp"

namespace dtsim::sched {

const char* to_string(Pass p) {
  switch (p) {
    case Pass::F: return "F";
    case Pass::B: return "B";
    case Pass::W: return "W";
    case Pass::BW: return "BW";
  }
  return "?";
}

const std::vector<const PipelineSchedule*>& all_schedules() {
  // One line per schedule. Order: the layout.schedule values in --help and errors.
  static const std::vector<std::unique_ptr<PipelineSchedule>> owned = [] {
    std::vector<std::unique_ptr<PipelineSchedule>> v;
    v.push_back(make_one_f_one_b());
    v.push_back(make_gpipe());
    v.push_back(make_interleaved());
    v.push_back(make_zb_h1());
    v.push_back(make_zb_h2());
    v.push_back(make_dualpipev());
    v.push_back(make_dualpipe());
    return v;
  }();
  static const std::vector<const PipelineSchedule*> view = [] {
    std::vector<const PipelineSchedule*> v;
    for (const auto& s : owned) v.push_back(s.get());
    return v;
  }();
  return view;
}

const PipelineSchedule& schedule_of(Schedule s) {
  // Indexed by the enum value (a sweep asks for every layout's schedule several times).
  static const std::vector<const PipelineSchedule*> by_id = [] {
    std::vector<const PipelineSchedule*> v;
    for (const PipelineSchedule* p : all_schedules()) {
      const auto i = static_cast<size_t>(p->id());
      if (v.size() <= i) v.resize(i + 1, nullptr);
      v[i] = p;
    }
    return v;
  }();
  const auto i = static_cast<size_t>(s);
  if (i < by_id.size() && by_id[i]) return *by_id[i];
  throw std::logic_error("schedule_of: unregistered schedule");
}

const PipelineSchedule* find_schedule(const std::string& name) {
  for (const PipelineSchedule* p : all_schedules())
    if (name == p->name()) return p;
  return nullptr;
}

std::string schedule_names() {
  std::string out;
  for (const PipelineSchedule* p : all_schedules()) out += (out.empty() ? "" : ", ") + std::string(p->name());
  return out;
}

Dims dims_of(const Layout& l, const Training& t, int64_t micro_batches) {
  return {l.pp, l.vp, micro_batches, t.overlap_moe_expert_parallel_comm};
}

Place PipelineSchedule::next(const Dims& d, int64_t r, int64_t c, int64_t mb) const {
  const int64_t vs = virtual_stage(d, r, c);
  return vs + 1 < virtual_stages(d) ? place(d, vs + 1, mb) : Place{};
}

Place PipelineSchedule::prev(const Dims& d, int64_t r, int64_t c, int64_t mb) const {
  const int64_t vs = virtual_stage(d, r, c);
  return vs > 0 ? place(d, vs - 1, mb) : Place{};
}

OrderStats order_stats(const std::vector<Step>& order) {
  OrderStats st;
  int64_t live = 0, live0 = 0;
  bool backward_seen = false;
  for (const Step& s : order) {
    if (s.pass == Pass::F) {
      ++live;
      if (s.chunk == 0) ++live0;
      if (!backward_seen && !s.paired) ++st.warmup;  // a paired F runs with its backward
      if (live > st.peak_live) {
        st.peak_live = live;
        st.peak_live_chunk0 = live0;
      }
    } else {
      if (s.pass == Pass::BW || s.pass == Pass::B) backward_seen = true;
      if (s.pass == Pass::BW || s.pass == Pass::W) {
        --live;
        if (s.chunk == 0) --live0;
      }
    }
  }
  return st;
}

OrderTiming time_order(const PipelineSchedule& s, const Dims& d, const std::vector<std::vector<Step>>& order,
                       const std::vector<std::vector<ChunkCosts>>& costs, double p2p_s, bool keep_starts) {
  const int64_t P = d.pp, C = s.chunks(d), M = d.micro_batches;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto idx = [&](int64_t r, int64_t c, int64_t mb) { return static_cast<size_t>((r * C + c) * M + mb); };
  std::vector<double> f_done(static_cast<size_t>(P * C * M), nan), b_done(f_done.size(), nan);
  OrderTiming out;
  out.finish.assign(static_cast<size_t>(P), 0.0);
  out.busy.assign(static_cast<size_t>(P), 0.0);
  std::vector<size_t> pos(static_cast<size_t>(P), 0);
  if (keep_starts)
    for (const auto& o : order) out.starts.emplace_back(o.size(), 0.0);
  size_t remaining = 0;
  for (const auto& o : order) remaining += o.size();
  while (remaining > 0) {
    bool progress = false;
    for (int64_t r = 0; r < P; ++r) {
      const auto& o = order[static_cast<size_t>(r)];
      size_t& k = pos[static_cast<size_t>(r)];
      double& t = out.finish[static_cast<size_t>(r)];
      // When step x of rank r may start on account of its inputs (NaN: not yet): an F after the
      // previous virtual stage's F, a B / BW after the next one's B (or its own F on the last),
      // plus p2p_s across ranks; a W after its own B.
      auto inputs = [&](const Step& x) {
        if (x.pass == Pass::F) {
          const Place pr = s.prev(d, r, x.chunk, x.mb);
          if (!pr.valid()) return 0.0;
          return f_done[idx(pr.rank, pr.chunk, x.mb)] + (pr.rank == r ? 0.0 : p2p_s);
        }
        if (x.pass == Pass::W) return b_done[idx(r, x.chunk, x.mb)];
        const Place nx = s.next(d, r, x.chunk, x.mb);
        return nx.valid() ? b_done[idx(nx.rank, nx.chunk, x.mb)] + (nx.rank == r ? 0.0 : p2p_s)
                          : f_done[idx(r, x.chunk, x.mb)];
      };
      auto cost_of = [&](const Step& x) {
        const ChunkCosts& cc = costs[static_cast<size_t>(r)][static_cast<size_t>(x.chunk)];
        return x.pass == Pass::F ? cc.f : x.pass == Pass::B ? cc.b : x.pass == Pass::W ? cc.w : cc.b + cc.w;
      };
      while (k < o.size()) {
        const Step& st = o[k];
        // A paired F runs with the BW after it as one combined pass: both inputs first, both
        // outputs at its end, its cost less the smaller chunk saving.
        const size_t n = st.paired ? 2 : 1;
        if (st.paired && (k + 1 >= o.size() || o[k + 1].pass != Pass::BW))
          throw std::logic_error(std::string("pipeline schedule ") + s.name() + " pairs an F with no BW after it");
        double ready = t, cost = 0;
        bool waiting = false;
        for (size_t j = 0; j < n; ++j) {
          const double in = inputs(o[k + j]);
          if (std::isnan(in)) waiting = true;
          ready = std::max(ready, in);
          cost += cost_of(o[k + j]);
        }
        if (waiting) break;
        if (st.paired)
          cost -= std::min(costs[static_cast<size_t>(r)][static_cast<size_t>(st.chunk)].fb_save,
                           costs[static_cast<size_t>(r)][static_cast<size_t>(o[k + 1].chunk)].fb_save);
        t = ready + cost;
        out.busy[static_cast<size_t>(r)] += cost;
        for (size_t j = 0; j < n; ++j) {
          const Step& x = o[k + j];
          if (keep_starts) out.starts[static_cast<size_t>(r)][k + j] = ready;
          if (x.pass == Pass::F) f_done[idx(r, x.chunk, x.mb)] = t;
          else if (x.pass != Pass::W) b_done[idx(r, x.chunk, x.mb)] = t;
        }
        k += n;
        remaining -= n;
        progress = true;
      }
    }
    if (!progress) throw std::logic_error(std::string("pipeline schedule ") + s.name() + " deadlocks");
  }
  for (double f : out.finish) out.makespan = std::max(out.makespan, f);
  return out;
}

}  // namespace dtsim::sched
