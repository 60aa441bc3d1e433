// Adam on each rank's owned gradient elements (models/verify/verify.hpp).
// Part of the StepPlan interpreter (models/verify/interpreter.cpp, interpreter_impl.hpp).
#include "models/verify/interpreter_impl.hpp"

namespace dtsim::verify {

void Interpreter::Impl::optimizer(int st, const Op& op) {
  ref->wait_done();  // the reference gradient is final (streamed reference steps)
  const refmath::AdamHyper hp = verify_adam();
  const bool local = opt.inject == Injection::adam_before_sync;
  // A gradient is reduced where its replicas are more than one: over DPxCP, or over EDP for
  // routed experts (the plan emits no collective over a group of one rank).
  const bool edp_many = plan.exp.layout.edp() > 1;
  auto reduced_scope = [&](const LocalParam& p) { return expert_param(p.kind) ? edp_many : dpcp > 1; };
  if (!local) {  // every gradient reduced exactly once in its scope
    const RankState& R0 = ranks[sz(stage_ranks[sz(st)].front())];
    for (size_t p = 0; p < R0.params.size(); ++p) {
      if (!reduced_scope(R0.params[p])) continue;
      const std::string name = fmt::format("{} (layer {})", lk_name(R0.params[p].kind), R0.params[p].layer);
      if (per_mb_reduce) {
        for (int64_t mbi = 0; mbi < m_count; ++mbi)
          if (last_write[sz(st)][p][sz(mbi)] >= 0 && !reduced_mb[sz(st)][p][sz(mbi)])
            problem(op, fmt::format("the gradient of {} from micro-batch {} was never reduced over DP x CP", name, mbi));
      } else if (!reduced_step[sz(st)][p]) {
        problem(op, fmt::format("the gradient of {} was never reduced over DP x CP", name));
      }
    }
  }
  for (int64_t r : stage_ranks[sz(st)]) {
    RankState& R = ranks[sz(r)];
    for (auto& p : R.params) {
      std::vector<int64_t>& elems = t_opt.elems;  // this thread's scratch, reused
      std::vector<double>& g = t_opt.g;
      elems.clear();
      g.assign(sz(p.size()), 0.0);
      for (int64_t e = 0; e < p.size(); ++e) {
        bool use = false;
        if (local) {
          use = !p.z3 || p.owned[sz(e)];
          g[sz(e)] = p.total[sz(e)] + p.grad.v[sz(e)];
        } else if (!reduced_scope(p)) {
          // Routed experts with an EDP group of one rank (the plan emits no collective over a
          // group of one): Megatron-Core still scales the expert buffer by 1 / |DPxCP|
          // (param_and_grad_buffer.py start_grad_sync, expert_gradient_scaling_factor).
          use = true;
          g[sz(e)] = expert_param(p.kind) && dpcp > 1 ? p.grad.v[sz(e)] / static_cast<double>(dpcp) : p.grad.v[sz(e)];
        } else {
          use = p.owned[sz(e)] && p.has_synced[sz(e)];
          g[sz(e)] = p.synced[sz(e)];
          if (p.grad.v[sz(e)] != 0)
            problem(op, fmt::format("{} (layer {}) has gradient written after its DP reduction", lk_name(p.kind), p.layer));
        }
        if (use) elems.push_back(e);
      }
      if (!p.adam_init) {
        p.adam_idx = elems;
        p.adam_init = true;
      } else if (p.adam_idx != elems) {
        problem(op, fmt::format("{} (layer {}): the elements this rank's optimizer owns changed between steps",
                                lk_name(p.kind), p.layer));
        continue;
      }
      if (elems.empty()) {
        std::fill(p.fresh.begin(), p.fresh.end(), 0);
        continue;
      }
      Vector& vals = t_opt.vals;
      Vector& grads = t_opt.grads;
      vals.clear();
      grads.clear();
      for (int64_t e : elems) {
        vals.push_back(p.value.v[sz(e)]);
        grads.push_back(g[sz(e)]);
        const double want = ref->grad[sz(p.gidx[sz(e)])];
        const double err = abs_err(g[sz(e)], want);
        auto at = [&] {
          return fmt::format("gradient of {} (layer {}) element {} at the optimizer (step {}, {}): {} vs {}",
                             lk_name(p.kind), p.layer, e, step, rank_str(R), g[sz(e)], want);
        };
        record(kDP, err, at);
        if (p.tp_sharded) record(kTP, err, at);
      }
      const auto res = refmath::adam_step(vals, grads, p.adam, hp);
      // Elements this rank did not update hold last step's values until a gather.
      std::fill(p.fresh.begin(), p.fresh.end(), 0);
      for (size_t k = 0; k < elems.size(); ++k) {
        p.value.v[sz(elems[k])] = res.params[k];
        p.fresh[sz(elems[k])] = 1;
      }
      ++epoch[sz(st)];
    }
  }
  if (local) {  // the bug's "sync": parameters averaged over DP x CP after local steps
    for (const auto& g : stage_groups[sz(st)].at(GroupKind::DPxCP)) {
      const size_t np = ranks[sz(g.front())].params.size();
      for (size_t p = 0; p < np; ++p) {
        if (ranks[sz(g.front())].params[p].z3) continue;
        std::vector<Vector> in;
        for (int64_t r : g) in.push_back(vec(ranks[sz(r)].params[p].value.v));
        const auto out = refmath::all_reduce(in, refmath::ReduceOp::avg);
        for (size_t i = 0; i < g.size(); ++i) {
          set(ranks[sz(g[i])].params[p].value.v, out[i]);
          ++epoch[sz(st)];
          std::fill(ranks[sz(g[i])].params[p].fresh.begin(), ranks[sz(g[i])].params[p].fresh.end(), 1);
        }
      }
    }
  }
}

}  // namespace dtsim::verify
