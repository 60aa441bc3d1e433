// The numerical interpreter of a StepPlan; semantics in models/verify/verify.hpp.
//
// Execution unit: a lane, the ranks of one pipeline stage with equal TP and CP coordinates,
// one per DP replica. Replicas run the same ops on their own data with their own
// parameters, so a lane keeps their activations stacked by rows, replica-major (replica
// d's rows follow replica d-1's, each block laid out as one rank's tensor), and executes
// each op once, block by block wherever parameters or data enter (one kernel over all
// rows while the replicas' parameters are bitwise equal, see Impl::uniform). TP and CP
// collectives combine the lanes of a group element-wise, which reduces every replica's own
// group at once since the blocks line up; P2P messages go from lane to lane. Parameters,
// ZeRO ownership, Adam and the DP collectives stay per rank; the replicas' working
// gradients of a parameter sit side by side in their lane's buffer. The arithmetic is
// that of rank-by-rank execution (the same kernels and summation orders on each block;
// collectives add ranks in group order, as models/reference_math does). Sizes the plan
// states are per rank (a lane's tensor holds |DP| of them).
// Why lanes: with tiny tensors the cost of an op is mostly its bookkeeping, which a lane
// pays once for |DP| ranks.
//
// Threads: pipeline stages share nothing but P2P messages (Impl::mail, under a mutex) and
// the tied-embedding collective between the first and the last stage, so with
// VerifyOptions::threads > 1 the stages of a step run on several threads (Impl::work: a
// thread claims any stage that is not waiting, runs it until its next op must wait, and
// moves on). Each op records its comparisons, problems and notes into its stage's StageOut
// with its position in the serial order (Impl::Schedule, derived from the ops alone), and
// Impl::merge_outs folds them into the totals as the serial run would have, so the report
// is the same for every thread count. A plan problem on a stage thread stops the step and
// the verification is redone on one thread (Interpreter::rerun_serial), which reports it in
// the serial order; so does a plan the schedule shows to deadlock, and the
// pp-microbatch-swap injection (which takes the newest queued message: timing-dependent).
#include "models/verify/interpreter_impl.hpp"
#include "models/zero3.hpp"

namespace dtsim::verify {

Interpreter::Impl::Impl(const TinyModel& model, const StepPlan& p, const VerifyOptions& o)
    : M(model), plan(p), opt(o), grid(p.exp.layout) {
  const Layout& l = plan.exp.layout;
  t = l.tp;
  cp = l.cp;
  dp = l.dp;
  pp = l.pp;
  dpcp = dp * cp;
  S = M.seq;
  sl = plan.shape.tokens_local;
  b = M.micro_batch;
  nd = dp;
  B = nd * b;
  m_count = plan.shape.micro_batches;
  al = M.heads / t;
  gl = M.kv_heads / t;
  d = M.hd;
  ft = M.ffn / t;
  Vt = M.V / t;
  h = M.h;
  sp = l.sequence_parallel && t > 1;
  zero = l.zero_stage;
  kept_from = static_cast<int>(plan.exp.model.layers + plan.exp.model.mtp_layers - zero3_kept_layers(plan.exp, 0));
  grad_bytes = static_cast<double>(plan.shape.grad_bytes_per_param);
  per_mb_reduce = grad_sync_policy(plan.exp).every_micro_batch;  // ZeRO-2/3, reduce_every_micro_batch
  if (sl * cp != S) throw InputError("verify: plan tokens_local * cp != seq_len");
  if (static_cast<int64_t>(plan.stages.size()) != pp) throw InputError("verify: plan has not pp stages");
  epoch.assign(sz(pp), 0);
  resolve_ops();
  build_w_table();
  build_chunk_stages();
  build_ranks();
  build_lanes();
  build_write_table();
  pending.resize(sz(pp));
  outs.resize(sz(pp));
  build_schedule();
  start_workers();
}

void Interpreter::Impl::problem(const std::string& p) {
  if (StageOut* o = t_exec.out) {  // kept with its stage until merge_outs
    if (problems.size() < kMaxProblems && !problem_set.count(p) && o->problems.size() < kMaxProblems &&
        o->problem_seen.insert(p).second)
      o->problems.emplace_back(t_exec.key, p);
    return;
  }
  if (problem_set.insert(p).second && problems.size() < kMaxProblems) problems.push_back(p);
}

void Interpreter::Impl::note(const std::string& n) {
  if (StageOut* o = t_exec.out) {
    if (!note_set.count(n) && o->note_seen.insert(n).second) o->notes.emplace_back(t_exec.key, n);
    return;
  }
  if (note_set.insert(n).second) notes.push_back(n);
}

void Interpreter::Impl::merge_outs() {
  for (int r = 0; r < kRules; ++r) {
    Acc& g = acc[r];
    double mx = g.max_err;
    int64_t n = 0;
    for (const StageOut& o : outs)
      if (o.acc[r].n > 0) {
        mx = std::max(mx, o.acc[r].max_err);
        n += o.acc[r].n;
      }
    if (g.worst.empty() || mx > g.max_err) {
      const StageOut* first = nullptr;
      for (const StageOut& o : outs)
        if (o.acc[r].n > 0 && o.acc[r].max_err == mx && (first == nullptr || o.key[r] < first->key[r])) first = &o;
      if (first != nullptr) {
        g.max_err = mx;
        g.worst = first->acc[r].worst;
      }
    }
    g.n += n;
  }
  auto merge_lines = [this](std::vector<std::pair<int64_t, std::string>> StageOut::*list, bool is_problem) {
    std::vector<std::pair<int64_t, std::string>*> all;
    for (StageOut& o : outs)
      for (auto& e : o.*list) all.push_back(&e);
    std::stable_sort(all.begin(), all.end(), [](const auto* a, const auto* b) { return a->first < b->first; });
    for (auto* e : all) {
      if (is_problem) {
        if (problem_set.insert(e->second).second && problems.size() < kMaxProblems) problems.push_back(e->second);
      } else if (note_set.insert(e->second).second) {
        notes.push_back(e->second);
      }
    }
  };
  merge_lines(&StageOut::problems, true);
  merge_lines(&StageOut::notes, false);
  for (StageOut& o : outs) o = StageOut();
}

void Interpreter::Impl::add_param(RankState& R, LK k, int layer, int64_t rows, int64_t cols, bool tp_sharded,
               const std::function<int64_t(int64_t, int64_t)>& gmap) {
  LocalParam p;
  p.kind = k;
  p.layer = layer;
  p.value = Mat(rows, cols);
  p.grad.rows = rows;  // storage: the lane's (build_lanes)
  p.grad.cols = cols;
  p.tp_sharded = tp_sharded && t > 1;
  p.gidx.resize(sz(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) p.gidx[sz(i * cols + j)] = gmap(i, j);
  const size_t ix = sz((layer + 1) * kLKs + static_cast<int>(k));
  if (R.index.size() <= ix) R.index.resize(ix + 1, -1);
  R.index[ix] = static_cast<int>(R.params.size());
  R.params.push_back(std::move(p));
}

void Interpreter::Impl::build_params(RankState& R) {
  const int64_t r = R.c.tp;
  const StagePlan& st = plan.stages[sz(R.stage)];
  auto full = [&](PKind k, int layer) {
    const PSeg s = M.seg(k, layer);
    return [s](int64_t i, int64_t j) { return s.offset + i * s.cols + j; };
  };
  // The embedding and the head with the loss live where the plan runs them: the first and the
  // last stage, and with DualPipe both (each holds a chunk of either end).
  const bool first = stage_has(R.stage, {Fn::embedding}), last = stage_has(R.stage, {Fn::lm_head});
  if (first) {
    const PSeg w = M.seg(PKind::embed_word);
    add_param(R, LK::word, -1, Vt, h, true, [=, this](int64_t i, int64_t j) { return w.offset + (r * Vt + i) * h + j; });
    if (M.learned_pos) add_param(R, LK::pos, -1, S, h, false, full(PKind::embed_pos, -1));
  }
  for (const int l : stage_layers[sz(R.stage)]) {
    add_param(R, LK::ln1_w, l, 1, h, false, full(PKind::ln1_w, l));
    if (M.layernorm) add_param(R, LK::ln1_b, l, 1, h, false, full(PKind::ln1_b, l));
    const int64_t qc = al * d, kc = gl * d;
    if (M.mla) {
      // MLA (models/verify/ops_mla.cpp): replicated down projections and latent norms; the up
      // projections column-parallel by head (rank r: heads [r al, (r+1) al)).
      if (M.dq > 0) {
        add_param(R, LK::q_down_w, l, h, M.dq, false, full(PKind::mla_dq, l));
        add_param(R, LK::q_norm_w, l, 1, M.dq, false, full(PKind::mla_qnorm, l));
      }
      const PSeg uq = M.seg(PKind::mla_uq, l), ukv = M.seg(PKind::mla_ukv, l);
      const int64_t kvc = al * (M.dn + M.dv);
      add_param(R, LK::q_up_w, l, M.q_in, qc, true,
                [=](int64_t i, int64_t j) { return uq.offset + i * uq.cols + r * qc + j; });
      add_param(R, LK::kv_down_w, l, h, M.dc + M.dr, false, full(PKind::mla_dkv, l));
      add_param(R, LK::kv_norm_w, l, 1, M.dc, false, full(PKind::mla_kvnorm, l));
      add_param(R, LK::kv_up_w, l, M.dc, kvc, true,
                [=](int64_t i, int64_t j) { return ukv.offset + i * ukv.cols + r * kvc + j; });
    } else {
    const PSeg wq = M.seg(PKind::wq, l), wk = M.seg(PKind::wk, l), wv = M.seg(PKind::wv, l);
    // Megatron's column-parallel QKV: this rank's query heads, then its key and value heads.
    auto qkv_col = [=, this](const PSeg& q, const PSeg& k, const PSeg& v, int64_t i, int64_t j) {
      if (j < qc) return q.offset + i * q.cols + r * qc + j;
      if (j < qc + kc) return k.offset + i * k.cols + r * kc + (j - qc);
      return v.offset + i * v.cols + r * kc + (j - qc - kc);
    };
    add_param(R, LK::qkv_w, l, h, qc + 2 * kc, true, [=](int64_t i, int64_t j) { return qkv_col(wq, wk, wv, i, j); });
    if (M.bias) {
      const PSeg bq = M.seg(PKind::bq, l), bk = M.seg(PKind::bk, l), bv = M.seg(PKind::bv, l);
      add_param(R, LK::qkv_b, l, 1, qc + 2 * kc, true, [=](int64_t i, int64_t j) { return qkv_col(bq, bk, bv, i, j); });
    }
    }
    const PSeg wo = M.seg(PKind::wo, l);
    add_param(R, LK::out_w, l, qc, h, true, [=, this](int64_t i, int64_t j) { return wo.offset + (r * qc + i) * h + j; });
    if (M.bias) add_param(R, LK::out_b, l, 1, h, false, full(PKind::bo, l));
    add_param(R, LK::ln2_w, l, 1, h, false, full(PKind::ln2_w, l));
    if (M.layernorm) add_param(R, LK::ln2_b, l, 1, h, false, full(PKind::ln2_b, l));
    if (M.moe_layer(l)) {
      // The router (replicated), this rank's local experts (EP position j: experts
      // [j E/ep, (j+1) E/ep), Megatron-Core's local expert numbering; ETP position q: columns
      // [q fe/etp, (q+1) fe/etp) of up / gate, rows of down), the shared expert as a TP MLP.
      const Layout& lay = plan.exp.layout;
      const int64_t E = M.experts, le = E / lay.ep, etp = lay.expert_tp(), fe = M.fe, fl = fe / etp;
      const int64_t j = group_pos(R.rank, GroupKind::EP), q = group_pos(R.rank, GroupKind::ETP);
      add_param(R, LK::router_w, l, h, E, false, full(PKind::router_w, l));
      const PSeg eu = M.seg(PKind::eu, l), eg = M.seg(PKind::eg, l), ed = M.seg(PKind::ed, l);
      auto col = [=, this](const PSeg& s) {
        return [=, this](int64_t i, int64_t c) { return s.offset + ((j * le + i / h) * h + i % h) * fe + q * fl + c; };
      };
      add_param(R, LK::eup_w, l, le * h, fl, etp > 1, col(eu));
      add_param(R, LK::egate_w, l, le * h, fl, etp > 1, col(eg));
      add_param(R, LK::edown_w, l, le * fl, h, etp > 1, [=, this](int64_t i, int64_t c) {
        return ed.offset + ((j * le + i / fl) * fe + q * fl + i % fl) * h + c;
      });
      if (M.fs > 0) {
        const int64_t fs = M.fs, fst = fs / t;
        const PSeg wu = M.seg(PKind::wu, l), wg = M.seg(PKind::wg, l), wd = M.seg(PKind::wd, l);
        add_param(R, LK::up_w, l, h, fst, true, [=, this](int64_t i, int64_t c) { return wu.offset + i * fs + r * fst + c; });
        add_param(R, LK::gate_w, l, h, fst, true, [=, this](int64_t i, int64_t c) { return wg.offset + i * fs + r * fst + c; });
        add_param(R, LK::down_w, l, fst, h, true, [=, this](int64_t i, int64_t c) { return wd.offset + (r * fst + i) * h + c; });
      }
      continue;
    }
    const PSeg wu = M.seg(PKind::wu, l);
    const int64_t f = M.ffn;
    add_param(R, LK::up_w, l, h, ft, true, [=, this](int64_t i, int64_t j) { return wu.offset + i * f + r * ft + j; });
    if (M.bias) {
      const PSeg bu = M.seg(PKind::bu, l);
      add_param(R, LK::up_b, l, 1, ft, true, [=, this](int64_t, int64_t j) { return bu.offset + r * ft + j; });
    }
    if (M.swiglu) {
      const PSeg wg = M.seg(PKind::wg, l);
      add_param(R, LK::gate_w, l, h, ft, true, [=, this](int64_t i, int64_t j) { return wg.offset + i * f + r * ft + j; });
    }
    const PSeg wd = M.seg(PKind::wd, l);
    add_param(R, LK::down_w, l, ft, h, true, [=, this](int64_t i, int64_t j) { return wd.offset + (r * ft + i) * h + j; });
    if (M.bias) add_param(R, LK::down_b, l, 1, h, false, full(PKind::bd, l));
  }
  if (last) {
    add_param(R, LK::final_w, -1, 1, h, false, full(PKind::final_w, -1));
    if (M.layernorm) add_param(R, LK::final_b, -1, 1, h, false, full(PKind::final_b, -1));
    // Untied: the LM head; tied with pp > 1: Megatron's copy of the word embedding on
    // the last stage (same global parameter); tied with pp == 1: the embedding itself.
    if (!M.tied || (pp > 1 && !first)) {
      const PSeg w = M.seg(M.tied ? PKind::embed_word : PKind::head_w);
      add_param(R, LK::head_w, -1, Vt, h, true, [=, this](int64_t i, int64_t j) { return w.offset + (r * Vt + i) * h + j; });
    }
  }
  int64_t n = 0;
  for (auto& p : R.params) {
    n += p.size();
    p.fresh.assign(sz(p.size()), 1);
  }
  if (std::fabs(static_cast<double>(n) - st.params_per_rank) > 0.5)
    throw InputError(fmt::format("verify: stage {} of the plan counts {} parameters per rank, the tiny model holds {}",
                                 R.stage, st.params_per_rank, n));
}

void Interpreter::Impl::build_ranks() {
  const int64_t world = grid.world();
  ranks.resize(sz(world));
  stage_ranks.assign(sz(pp), {});
  stage_groups.assign(sz(pp), {});
  // The DP replicas of a (stage, TP, CP) coordinate hold the same parameter shards: built
  // once, copied to the others.
  std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> built;
  moe_frames.assign(sz(world), {});
  for (int64_t r = 0; r < world; ++r) {
    RankState& R = ranks[sz(r)];
    R.rank = r;
    R.c = grid.coord_of(r);
    R.stage = static_cast<int>(R.c.pp);
    const auto g = grid.group_of(r, GroupKind::DPxCP);
    R.dpcp_index = std::find(g.begin(), g.end(), r) - g.begin();
    stage_ranks[sz(R.c.pp)].push_back(r);
    const auto [it, first] = built.try_emplace({R.c.pp, R.c.tp, R.c.cp}, r);
    if (first || M.experts > 0) {  // MoE: DP replicas hold other experts
      build_params(R);
    } else {
      R.params = ranks[sz(it->second)].params;
      R.index = ranks[sz(it->second)].index;
    }
  }
  for (int64_t st = 0; st < pp; ++st)
    for (GroupKind k : {GroupKind::TP, GroupKind::DP, GroupKind::DPxCP, GroupKind::EP, GroupKind::ETP, GroupKind::EDP}) {
      std::set<std::vector<int64_t>> seen;
      std::vector<std::vector<int64_t>> gs;
      for (int64_t r : stage_ranks[sz(st)]) {
        auto g = grid.group_of(r, k);
        if (seen.insert(g).second) gs.push_back(std::move(g));
      }
      stage_groups[sz(st)][k] = std::move(gs);
    }
  // ZeRO-3: layer parameters are sharded over DPxCP; each layer's parameters, flattened
  // in the stage's canonical order, split into equal chunks (the last padded).
  const int64_t edp = plan.exp.layout.edp();
  // (Routed experts with an EDP group of one rank are not sharded: their rank holds them all.)
  if (zero == 3 && dpcp > 1)
    for (auto& R : ranks)
      for (auto& p : R.params)
        if (p.layer >= 0 && !(expert_param(p.kind) && edp <= 1)) p.z3 = true;
  // A MoE layer's routed experts are sharded over EDP (their own buffer, Megatron-Core
  // expert_parallel_buffers), chunked the same way.
  for (auto& R : ranks) {
    std::map<std::pair<int, bool>, int64_t> offset, total;
    const int64_t edp_index = M.experts > 0 ? group_pos(R.rank, GroupKind::EDP) : 0;
    for (auto& p : R.params)
      if (p.z3) total[{p.layer, expert_param(p.kind)}] += p.size();
    for (auto& p : R.params) {
      // Without ZeRO-3 an element gets an owner from the gradient collective (every rank
      // after an AllReduce, one after a ReduceScatter); with dp*cp == 1 the rank owns all.
      p.owned.assign(sz(p.size()), (expert_param(p.kind) ? edp == 1 : dpcp == 1) ? 1 : 0);
      if (!p.z3) continue;
      const bool ex = expert_param(p.kind);
      const std::pair<int, bool> key{p.layer, ex};
      const int64_t n = ex ? edp : dpcp, idx = ex ? edp_index : R.dpcp_index;
      const int64_t P = total[key], c = (P + n - 1) / n;
      const int64_t lo = idx * c, hi = std::min(P, lo + c);
      for (int64_t e = 0; e < p.size(); ++e) {
        const int64_t f = offset[key] + e;
        p.owned[sz(e)] = f >= lo && f < hi;
      }
      offset[key] += p.size();
    }
  }
}

void Interpreter::Impl::build_lanes() {
  lane_at.assign(sz(pp), std::vector<int>(sz(cp * t), -1));
  stage_lanes.assign(sz(pp), {});
  for (int64_t st = 0; st < pp; ++st)
    for (int64_t r : stage_ranks[sz(st)]) {
      RankState& R = ranks[sz(r)];
      int& li = lane_at[sz(st)][sz(R.c.cp * t + R.c.tp)];
      if (li < 0) {
        li = static_cast<int>(lanes.size());
        Lane L;
        L.index = li;
        L.stage = static_cast<int>(st);
        L.tp = R.c.tp;
        L.cp = R.c.cp;
        L.reps.assign(sz(dp), -1);
        lanes.push_back(std::move(L));
        stage_lanes[sz(st)].push_back(li);
      }
      R.lane = li;
      lanes[sz(li)].reps[sz(R.c.dp)] = r;
    }
  lane_groups.assign(sz(pp), {});
  for (int64_t st = 0; st < pp; ++st)
    for (GroupKind k : {GroupKind::TP, GroupKind::CP}) {
      std::set<std::vector<int>> seen;
      std::vector<std::vector<int>> gs;
      for (int li : stage_lanes[sz(st)]) {
        std::vector<int> g;
        for (int64_t r : grid.group_of(lanes[sz(li)].reps.front(), k)) g.push_back(ranks[sz(r)].lane);
        if (seen.insert(g).second) gs.push_back(std::move(g));
      }
      lane_groups[sz(st)][k] = std::move(gs);
    }
  for (int64_t st = 0; st < pp; ++st)
    for (const auto& g : lane_groups[sz(st)].at(GroupKind::TP)) {
      int first = g.front();  // the group's lane that comes first in stage_lanes (exec's order)
      for (int li : stage_lanes[sz(st)])
        if (std::find(g.begin(), g.end(), li) != g.end()) {
          first = li;
          break;
        }
      for (int li : g) lanes[sz(li)].tp_first = first;
    }
  layer_slot.assign(sz(pp), std::vector<int>(sz(M.layers + 1), -1));
  stage_slots.assign(sz(pp), 0);
  frame_store.clear();
  frame_store.resize(sz(pp));
  frame_free.assign(sz(pp), {});
  for (int64_t st = 0; st < pp; ++st) {
    int n = 0;
    layer_slot[sz(st)][0] = n++;  // layer -1: embedding, head, loss
    for (int l : stage_layers[sz(st)])
      if (l >= 0 && l < M.layers) layer_slot[sz(st)][sz(l + 1)] = n++;
    stage_slots[sz(st)] = n;
    for (int li : stage_lanes[sz(st)]) {
      Lane& L = lanes[sz(li)];
      L.frames.assign(sz(n * m_count), nullptr);
      L.ce_stage.assign(sz(m_count), 0);
      L.emb_stash.assign(sz(m_count), Reg{});
      L.emb_done.assign(sz(m_count), 0);
      const size_t np = rep(L, 0).params.size();
      L.seen.assign(np, std::numeric_limits<uint64_t>::max());
      L.same.assign(np, 0);
      L.goff.assign(np, 0);
      int64_t total = 0;
      for (size_t pi = 0; pi < np; ++pi) {
        L.goff[pi] = total;
        total += rep(L, 0).params[pi].size() * nd;
      }
      L.grads.assign(sz(total), 0.0);
      L.pidx = rep(L, 0).index;
      L.val.assign(np * sz(nd), nullptr);
      L.psize.assign(np, 0);
      for (size_t pi = 0; pi < np; ++pi) L.psize[pi] = rep(L, 0).params[pi].size();
      for (int64_t dd = 0; dd < nd; ++dd) {
        RankState& R = rep(L, dd);
        if (R.params.size() != np || R.index != L.pidx)
          throw InputError("verify: replicas of a lane hold different parameters");
        for (size_t pi = 0; pi < np; ++pi) L.val[pi * sz(nd) + sz(dd)] = &R.params[pi].value;
        for (size_t pi = 0; pi < np; ++pi) {
          LocalParam& lp = R.params[pi];
          if (lp.size() != rep(L, 0).params[pi].size())
            throw InputError("verify: replicas of a lane hold different parameters");
          lp.grad.v.p = L.grads.data() + L.goff[pi] + dd * lp.size();
          lp.grad.v.n = sz(lp.size());
        }
      }
    }
  }
}

void Interpreter::Impl::resolve_ops() {
  const auto& table = fn_table();
  fns.assign(sz(pp), {});
  for (int64_t st = 0; st < pp; ++st)
    for (const Op& op : plan.stages[sz(st)].ops) {
      Fn f = Fn::wait;
      switch (op.type) {
        case OpType::send: f = Fn::send; break;
        case OpType::recv: f = Fn::recv; break;
        case OpType::wait: f = Fn::wait; break;
        default: {
          auto it = table.find(op.name);
          if (it == table.end())
            throw InputError(fmt::format("verify: stage {} op '{}' ({}) has no interpretation; the verifier knows "
                                         "every op name of models/plan.cpp: add this one to models/verify/",
                                         st, op.name, to_string(op.phase)));
          f = it->second;
        }
      }
      fns[sz(st)].push_back(f);
    }
  stage_layers.assign(sz(pp), {});
  chunk_layers.assign(sz(pp), {});
  gathered_layers.assign(sz(pp), {});
  for (int64_t st = 0; st < pp; ++st)
    for (const Op& op : plan.stages[sz(st)].ops) {
      if (op.layer < 0) continue;
      if (std::string_view(op.name) == "dp_param_allgather")
        for (int k = 0; k < std::max(1, op.gather_layers); ++k) gathered_layers[sz(st)].insert(op.layer + k);
      stage_layers[sz(st)].insert(op.layer);
      auto [it, fresh] = chunk_layers[sz(st)].try_emplace(op.chunk, op.layer, op.layer);
      if (!fresh) {
        it->second.first = std::min(it->second.first, op.layer);
        it->second.second = std::max(it->second.second, op.layer);
      }
    }
}

namespace {
/// Weight-gradient ops that read a (layer, micro-batch)'s kept tensors.
bool reads_frame_w(Fn f) {
  return f == Fn::lm_head_wgrad || f == Fn::mlp_down_wgrad || f == Fn::mlp_up_wgrad || f == Fn::out_proj_wgrad ||
         f == Fn::qkv_wgrad || f == Fn::q_up_wgrad || f == Fn::kv_up_wgrad || f == Fn::q_down_wgrad ||
         f == Fn::kv_down_wgrad;
}
}  // namespace

void Interpreter::Impl::build_chunk_stages() {
  chunk_vs.assign(sz(pp), {});
  // A chunk without layers (a stage holding only the embedding or the loss) has no place in
  // the layer order: then every chunk keeps chunk * pp + stage.
  for (int64_t st = 0; st < pp; ++st)
    for (const Op& op : plan.stages[sz(st)].ops)
      if (!chunk_layers[sz(st)].count(op.chunk)) return;
  std::set<int> firsts;
  for (const auto& m : chunk_layers)
    for (const auto& [c, range] : m) firsts.insert(range.first);
  for (int64_t st = 0; st < pp; ++st)
    for (const auto& [c, range] : chunk_layers[sz(st)])
      chunk_vs[sz(st)][c] = std::distance(firsts.begin(), firsts.find(range.first));
}

void Interpreter::Impl::build_w_table() {
  w_defer.assign(sz(pp), {});
  w_release.assign(sz(pp), {});
  has_embedding_bwd.assign(sz(pp), 0);
  for (int64_t st = 0; st < pp; ++st) {
    const auto& ops = plan.stages[sz(st)].ops;
    const auto& fs = fns[sz(st)];
    w_defer[sz(st)].assign(ops.size(), 0);
    w_release[sz(st)].assign(ops.size(), 0);
    std::map<std::pair<int, int>, size_t> freed, last_w;  // (layer, mb) -> the op ending its B / its last W after it
    for (size_t i = 0; i < ops.size(); ++i) {
      if (fs[i] == Fn::embedding_bwd) has_embedding_bwd[sz(st)] = 1;
      const std::pair<int, int> key{ops[i].layer, ops[i].micro_batch};
      if (fs[i] == Fn::input_norm_bwd || fs[i] == Fn::final_norm_bwd) {
        freed[key] = i;
      } else if (reads_frame_w(fs[i])) {
        auto it = freed.find(key);
        if (it == freed.end()) continue;
        w_defer[sz(st)][it->second] = 1;
        last_w[key] = i;
      }
    }
    for (const auto& [key, i] : last_w) w_release[sz(st)][i] = 1;
  }
}

void Interpreter::Impl::load_params(const std::vector<double>& global) {
  for (auto& R : ranks)
    for (auto& p : R.params) {
      for (int64_t e = 0; e < p.size(); ++e) p.value.v[sz(e)] = global[sz(p.gidx[sz(e)])];
      ++epoch[sz(R.stage)];
      if (p.z3) free_param(R, p);
    }
}

void Interpreter::Impl::free_param(const RankState& R, LocalParam& p) {
  ++epoch[sz(R.stage)];
  for (int64_t e = 0; e < p.size(); ++e)
    if (!p.owned[sz(e)]) {
      p.value.v[sz(e)] = kNaN;  // poison: a use before the gather shows
      p.fresh[sz(e)] = 0;
    }
  p.materialized = false;
}

Frame* Interpreter::Impl::frame(Lane& L, int layer, int mb, bool create) {
  const auto& slots = layer_slot[sz(L.stage)];
  const int slot = layer + 1 >= 0 && layer + 1 < static_cast<int>(slots.size()) ? slots[sz(layer + 1)] : -1;
  if (slot < 0 || mb < 0 || mb >= m_count) {
    if (!create) return nullptr;
    problem(fmt::format("verifier: stage {} keeps a tensor of layer {}, micro-batch {}, outside its frames", L.stage,
                        layer, mb));
    throw PlanFatal("frame");
  }
  Frame*& f = L.frames[sz(slot * m_count + mb)];
  if (f == nullptr && create) {
    auto& free_list = frame_free[sz(L.stage)];
    if (free_list.empty()) {
      frame_store[sz(L.stage)].emplace_back();
      f = &frame_store[sz(L.stage)].back();
    } else {
      f = free_list.back();
      free_list.pop_back();
    }
    f->live = true;
  }
  return f;
}

void Interpreter::Impl::release_frame(Lane& L, int layer, int mb) {
  const int slot = layer_slot[sz(L.stage)][sz(layer + 1)];
  Frame*& f = L.frames[sz(slot * m_count + mb)];
  f->reset();
  frame_free[sz(L.stage)].push_back(f);
  f = nullptr;
}

void Interpreter::Impl::drop(Lane& L, int layer, int mb, Slot s) {
  Frame* f = frame(L, layer, mb, false);
  Mat* m = f == nullptr ? nullptr : f->held(s);
  if (m == nullptr) return;
  f->has[static_cast<size_t>(s)] = false;
  *m = Mat();
}

void Interpreter::Impl::drop_layer(Lane& L, int layer, int mb, bool keep_input) {
  Frame* f = frame(L, layer, mb, false);
  if (f == nullptr) return;
  Mat* in = f->held(Slot::x_in);
  if (keep_input && in != nullptr) {
    Mat x = std::move(*in);
    f->reset();
    f->live = true;
    f->slot(Slot::x_in) = std::move(x);
    f->has[static_cast<size_t>(Slot::x_in)] = true;
    return;
  }
  release_frame(L, layer, mb);
}

void Interpreter::Impl::keep_for_w(Lane& L, int layer, int mb) {
  static constexpr Slot kKeep[] = {Slot::n1, Slot::re1, Slot::n2, Slot::re2, Slot::nf, Slot::ref, Slot::ctx,
                                   Slot::act, Slot::d_branch, Slot::d_mlp, Slot::du, Slot::dg, Slot::dqkv,
                                   Slot::dlogits, Slot::mla_lat, Slot::mla_lat_all, Slot::mla_re_lat,
                                   Slot::mla_dq, Slot::mla_dkv, Slot::mla_dql, Slot::mla_dkvd};
  for (int s = 0; s < kSlots; ++s)
    if (std::find(std::begin(kKeep), std::end(kKeep), static_cast<Slot>(s)) == std::end(kKeep))
      drop(L, layer, mb, static_cast<Slot>(s));
}

void Interpreter::Impl::end_backward(Lane& L, int layer, int mb) {
  if (w_defer[sz(L.stage)][t_exec.idx])
    keep_for_w(L, layer, mb);
  else
    drop_layer(L, layer, mb, false);
}

LocalParam& Interpreter::Impl::P(RankState& R, LK k, int layer, const Op& op) {
  const int i = pindex(R, k, layer);
  if (i < 0)
    die(op, fmt::format("needs parameter {} of layer {}, which stage {} does not hold", lk_name(k), layer, R.stage));
  LocalParam& p = R.params[sz(i)];
  if (p.z3 && !p.materialized)
    problem(op, fmt::format("uses ZeRO-3 parameters of layer {} that no dp_param_allgather gathered", layer));
  return p;
}

void Interpreter::Impl::note_write(Lane& L, int pi, LK k, int layer) {
  const RankState& R = ranks[sz(stage_ranks[sz(L.stage)].front())];
  if (R.lane != L.index) return;
  const auto& w = writes_at[sz(L.stage)][t_exec.idx];
  if (std::find(w.begin(), w.end(), pi) == w.end())
    problem(fmt::format("verifier: stage {} op #{} '{}' wrote the gradient of {} (layer {}), which its static "
                        "write-set lacks (models/verify/interpreter.cpp static_writes)",
                        L.stage, t_exec.idx, plan.stages[sz(L.stage)].ops[t_exec.idx].name, lk_name(k), layer));
}

std::vector<LK> Interpreter::Impl::static_writes(Fn fn, int ordinal, int stage) const {
  std::vector<LK> w;
  auto add = [&](LK k, bool present = true) {
    if (present) w.push_back(k);
  };
  switch (fn) {
    case Fn::lm_head_wgrad: add(head_kind(stage)); break;
    case Fn::final_norm_bwd: add(LK::final_w); add(LK::final_b, M.layernorm); break;
    case Fn::dropout_residual_bwd: add(ordinal == 0 ? LK::down_b : LK::out_b, M.bias); break;
    case Fn::mlp_down_wgrad: add(LK::down_w); break;
    case Fn::mlp_up_wgrad: add(LK::up_w); add(LK::up_b, M.bias); add(LK::gate_w, M.swiglu); break;
    case Fn::post_attention_norm_bwd: add(LK::ln2_w); add(LK::ln2_b, M.layernorm); break;
    case Fn::out_proj_wgrad: add(LK::out_w); break;
    case Fn::qkv_wgrad: add(LK::qkv_w); add(LK::qkv_b, M.bias); break;
    case Fn::input_norm_bwd: add(LK::ln1_w); add(LK::ln1_b, M.layernorm); break;
    case Fn::embedding_bwd: add(LK::word); add(LK::pos, M.learned_pos); break;
    case Fn::router_wgrad: add(LK::router_w); break;
    case Fn::expert_down_wgrad: add(LK::edown_w); break;
    case Fn::expert_up_wgrad: add(LK::eup_w); add(LK::egate_w); break;
    case Fn::q_up_wgrad: add(LK::q_up_w); break;
    case Fn::kv_up_wgrad: add(LK::kv_up_w); break;
    case Fn::kv_norm_bwd: add(LK::kv_norm_w); break;
    case Fn::q_norm_bwd: add(LK::q_norm_w); break;
    case Fn::kv_down_wgrad: add(LK::kv_down_w); break;
    case Fn::q_down_wgrad: add(LK::q_down_w); break;
    default: break;
  }
  return w;
}

void Interpreter::Impl::build_write_table() {
  writes_at.assign(sz(pp), {});
  last_write.assign(sz(pp), {});
  own_bucket_param.assign(sz(pp), -1);
  for (int64_t st = 0; st < pp; ++st) {
    const RankState& R = ranks[sz(stage_ranks[sz(st)].front())];
    const auto& ops = plan.stages[sz(st)].ops;
    for (const Op& op : ops)
      if (op.grad_bucket == GradBucket::tied_embedding)
        own_bucket_param[sz(st)] = pindex(R, st == 0 ? LK::word : LK::head_w, -1);
    writes_at[sz(st)].assign(ops.size(), {});
    last_write[sz(st)].assign(R.params.size(), std::vector<int64_t>(sz(m_count), -1));
    std::map<std::pair<int, int>, int> ordinal;
    for (size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      const Fn fn = fns[sz(st)][i];
      const int mb = op.micro_batch >= 0 ? op.micro_batch : static_cast<int>(m_count - 1);
      std::vector<int> ps;
      if (fn == Fn::sp_grad_allreduce) {
        for (size_t p = 0; p < R.params.size(); ++p)
          if (sp_partial_grad(R.params[p].kind)) ps.push_back(static_cast<int>(p));
      } else if (fn == Fn::embed_grad) {
        const int p = pindex(R, st == 0 ? LK::word : LK::head_w, -1);
        if (p >= 0) ps.push_back(p);
      } else {
        const int ord = fn == Fn::dropout_residual_bwd ? ordinal[{op.layer, op.micro_batch}]++ : 0;
        for (LK k : static_writes(fn, ord, static_cast<int>(st))) {
          const int p = pindex(R, k, op.layer);
          if (p >= 0) ps.push_back(p);
        }
      }
      // The SP and embedding-group AllReduces act on gradients as they stand (reduced
      // over DP or not), so they do not delay the DP collectives.
      if (fn != Fn::sp_grad_allreduce && fn != Fn::embed_grad && fn != Fn::mirror_grad)
        for (int p : ps)
          if (mb >= 0 && mb < m_count) last_write[sz(st)][sz(p)][sz(mb)] = static_cast<int64_t>(i);
      writes_at[sz(st)][i] = std::move(ps);
    }
  }
}

double Interpreter::Impl::loss_scale(const RankState& R, int mb) const {
  const double N = static_cast<double>(batch->n_valid);
  switch (opt.inject) {
    case Injection::dp_local_mean: {
      int64_t local = 0;
      for (int64_t row = 0; row < b * sl; ++row) local += batch->valid[rank_data_index(R, mb, row, b * sl)];
      return local > 0 ? 1.0 / (static_cast<double>(local) * static_cast<double>(m_count)) : 0.0;
    }
    case Injection::cp_loss_scale: return static_cast<double>(dp) / N;
    default: return static_cast<double>(dpcp) / N;
  }
}

void Interpreter::Impl::compute(Lane& L, Fn fn, const Op& op) {
  const int Ly = op.layer;
  if (op.type == OpType::compute && zero == 3)  // ZeRO-3 frees gathered layers after use
    for (int64_t dd = 0; dd < nd; ++dd) {
      RankState& R = rep(L, dd);
      for (auto it = R.materialized_layers.begin(); it != R.materialized_layers.end();) {
        if (*it != Ly && *it < kept_from) {
          for (auto& p : R.params)
            if (p.layer == *it && p.z3) free_param(R, p);
          it = R.materialized_layers.erase(it);
        } else {
          ++it;
        }
      }
    }
  if (M.mla && (fn == Fn::rope || fn == Fn::rope_bwd)) {  // MLA's rotary parts (ops_mla.cpp)
    mla_op(L, fn, op);
    return;
  }
  switch (fn) {
    case Fn::embedding:
    case Fn::embedding_bwd:
      embedding_op(L, fn, op);
      return;
    case Fn::q_down:
    case Fn::q_norm:
    case Fn::kv_down:
    case Fn::kv_norm:
    case Fn::q_up:
    case Fn::kv_up:
    case Fn::q_up_dgrad:
    case Fn::kv_up_dgrad:
    case Fn::q_up_wgrad:
    case Fn::kv_up_wgrad:
    case Fn::kv_norm_bwd:
    case Fn::kv_down_dgrad:
    case Fn::q_norm_bwd:
    case Fn::q_down_dgrad:
    case Fn::kv_down_wgrad:
    case Fn::q_down_wgrad:
      mla_op(L, fn, op);
      return;
    case Fn::input_norm:
    case Fn::post_attention_norm:
    case Fn::final_norm:
    case Fn::dropout_residual:
    case Fn::final_norm_bwd:
    case Fn::dropout_residual_bwd:
    case Fn::post_attention_norm_bwd:
    case Fn::input_norm_bwd:
      norm_op(L, fn, op);
      return;
    case Fn::qkv:
    case Fn::rope:
    case Fn::attention:
    case Fn::attention_local:
    case Fn::attention_remote:
    case Fn::attention_scores:
    case Fn::softmax_dropout:
    case Fn::attention_values:
    case Fn::out_proj:
    case Fn::out_proj_dgrad:
    case Fn::out_proj_wgrad:
    case Fn::attention_bwd:
    case Fn::attention_bwd_local:
    case Fn::attention_bwd_remote:
    case Fn::attention_values_bwd:
    case Fn::softmax_dropout_bwd:
    case Fn::attention_scores_bwd:
    case Fn::rope_bwd:
    case Fn::qkv_dgrad:
    case Fn::qkv_wgrad:
      attention_op(L, fn, op);
      return;
    case Fn::mlp_up:
    case Fn::mlp_gate:
    case Fn::gelu:
    case Fn::swiglu:
    case Fn::mlp_down:
    case Fn::mlp_down_dgrad:
    case Fn::mlp_down_wgrad:
    case Fn::gelu_bwd:
    case Fn::swiglu_bwd:
    case Fn::mlp_up_dgrad:
    case Fn::mlp_up_wgrad:
      mlp_op(L, fn, op);
      return;
    case Fn::lm_head:
    case Fn::cross_entropy:
    case Fn::cross_entropy_bwd:
    case Fn::lm_head_dgrad:
    case Fn::lm_head_wgrad:
      head_op(L, fn, op);
      return;
    case Fn::router:
    case Fn::router_topk:
    case Fn::moe_permute:
    case Fn::expert_up:
    case Fn::expert_gate:
    case Fn::expert_swiglu:
    case Fn::expert_down:
    case Fn::moe_unpermute:
    case Fn::moe_unpermute_bwd:
    case Fn::expert_down_dgrad:
    case Fn::expert_down_wgrad:
    case Fn::expert_swiglu_bwd:
    case Fn::expert_up_dgrad:
    case Fn::expert_up_wgrad:
    case Fn::moe_permute_bwd:
    case Fn::router_topk_bwd:
    case Fn::router_dgrad:
    case Fn::router_wgrad:
      moe_op(L, fn, op);
      return;
    default:
      die(op, "is not a compute op");
  }
}

// ======================================================================================
Interpreter::Interpreter(const TinyModel& model, const StepPlan& plan, const VerifyOptions& opts)
    : impl_(std::make_unique<Impl>(model, plan, opts)) {}
Interpreter::~Interpreter() = default;

void Interpreter::load_params(const std::vector<double>& global) { impl_->load_params(global); }

void Interpreter::run_step(int step, const Batch& batch, const RefStep& ref, const RefState& after, bool last) {
  if (!runnable()) return;
  try {
    impl_->run_step(step, batch, &ref, after, last);
  } catch (const PlanFatal&) {
    impl_->fatal = true;
  }
}

bool Interpreter::runnable() const { return !impl_->fatal && !impl_->parallel_failed; }

bool Interpreter::rerun_serial() const { return impl_->parallel_failed; }

std::vector<RuleResult> Interpreter::rules() const {
  const Impl& I = *impl_;
  struct Def {
    const char* name;
    const char* what;
    bool applicable;
    double tol;
  };
  const std::string zero_what =
      fmt::format("parameters and Adam moments after every step, on every rank = full Adam on one device "
                  "(ZeRO-{}: {})",
                  I.zero,
                  I.zero == 0 ? "replicated optimizer" : "owners update their shards; ReduceScatter + AllGather");
  const Def defs[kRules] = {
      {"loss", "global loss = sum of token losses / global valid-token count", true, kTolValues},
      {"DP", "gradient at the optimizer = full-batch gradient (DP x CP AVG of losses scaled by |DPxCP| / N_global)",
       true, kTolValues},
      {"TP", "after every TP collective: summed partial outputs / input grads = full-matrix results; TP-sharded "
             "parameter gradients = their slice (not averaged)",
       I.t > 1, kTolValues},
      {"CP", "ring attention (online softmax over K/V blocks) = full causal attention: output, dQ, dK/dV summed at "
             "their owners",
       I.cp > 1, kTolValues},
      {"PP", "activations and gradients received from neighbouring stages = the unsplit model's", I.pp > 1, kTolValues},
      {"ZeRO", zero_what.c_str(), true, kTolParams},
  };
  std::vector<RuleResult> out;
  for (int i = 0; i < kRules; ++i) {
    RuleResult r;
    r.name = defs[i].name;
    r.what = defs[i].what;
    r.applicable = defs[i].applicable;
    r.tolerance = defs[i].tol;
    r.values = I.acc[i].n;
    r.max_abs_error = I.acc[i].max_err;
    r.worst = I.acc[i].worst;
    r.passed = !I.fatal && r.max_abs_error <= r.tolerance && (r.values > 0 || !r.applicable);
    if (I.fatal) r.worst = "not evaluated to the end: the plan could not be executed (see rule plan)";
    else if (r.applicable && r.values == 0) r.worst = "nothing was compared";
    out.push_back(std::move(r));
  }
  RuleResult p;
  p.name = "plan";
  p.what = "every op interpreted; collective and message sizes match the tensors; every gradient reduced once; no "
           "tensor used before it exists";
  p.problems = I.problems;
  p.passed = I.problems.empty() && !I.fatal;
  out.push_back(std::move(p));
  return out;
}

std::vector<std::string> Interpreter::notes() const { return impl_->notes; }

}  // namespace dtsim::verify
