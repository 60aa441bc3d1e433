// Op dispatch, the serial order of the ops (Impl::Schedule), rendezvous of two-stage
// collectives, and the stage threads.
// Part of the StepPlan interpreter (models/verify/interpreter.cpp, interpreter_impl.hpp).
#include "models/verify/interpreter_impl.hpp"

namespace dtsim::verify {

void Interpreter::Impl::exec(int st, size_t idx) {
  const Op& op = plan.stages[sz(st)].ops[idx];
  const Fn fn = fns[sz(st)][idx];
  t_exec.stage = st;
  t_exec.idx = idx;
  if (has_embedding_bwd[sz(st)] && op.phase == Phase::backward) {
    keep_embedding_grads(st, op);
    if (run_on_kept_embedding_grad(st, op, fn, [&] { run_op(st, idx, op, fn); })) return;
  }
  run_op(st, idx, op, fn);
}

void Interpreter::Impl::run_op(int st, size_t idx, const Op& op, Fn fn) {
  switch (fn) {
    case Fn::send: send(st, op); return;
    case Fn::recv: recv(st, op); return;
    case Fn::wait: {
      auto& pend = pending[sz(st)];
      auto it = pend.find(op.handle);
      if (it == pend.end()) die(op, fmt::format("waits for handle {}, which is not in flight", op.handle));
      auto deliver = std::move(it->second);
      pend.erase(it);
      deliver();
      return;
    }
    case Fn::chain: chain_collective(st, op); return;
    case Fn::ce_reduce: ce_collective(st, op); return;
    case Fn::regather: regather(st, op); return;
    case Fn::cp_kv: cp_kv(st, op); return;
    case Fn::cp_dkv: cp_dkv(st, op); return;
    case Fn::dp_grad: dp_grad(st, op); return;
    case Fn::dp_param_gather: dp_param_gather(st, op); return;
    case Fn::sp_grad_allreduce: sp_grad_allreduce(st, op); return;
    case Fn::moe_comm: moe_comm(st, op); return;
    case Fn::embed_grad: die(op, "an embedding-group collective outside the scheduler's rendezvous");
    case Fn::mirror_grad: die(op, "a DualPipe mirror collective outside the scheduler's rendezvous");
    case Fn::optimizer_adam: optimizer(st, op); return;
    case Fn::cast: return;  // the identity in exact arithmetic (interpreter_impl.hpp fn_table)
    default:
      if (op.type != OpType::compute) die(op, "is a compute name on a non-compute op");
      for (int li : stage_lanes[sz(st)]) compute(lanes[sz(li)], fn, op);
      // The last deferred W of a (layer, micro-batch) frees what its B kept for it.
      if (w_release[sz(st)][idx])
        for (int li : stage_lanes[sz(st)]) drop_layer(lanes[sz(li)], op.layer, op.micro_batch, false);
      if (fn == Fn::embedding_bwd && op.micro_batch >= 0 && op.micro_batch < m_count)
        for (int li : stage_lanes[sz(st)]) lanes[sz(li)].emb_done[sz(op.micro_batch)] = 1;
  }
}

void Interpreter::Impl::keep_embedding_grads(int st, const Op& op) {
  for (int li : stage_lanes[sz(st)]) {
    Lane& L = lanes[sz(li)];
    const Reg& c = L.cur[2];
    if (c.m.empty() || c.tag != Tag::stream || c.layer != 0 || c.mb < 0 || c.mb >= m_count ||
        L.emb_done[sz(c.mb)])
      continue;
    if (op.micro_batch == c.mb && (op.layer == -1 || op.layer == 0)) continue;  // still its backward / its W
    L.emb_stash[sz(c.mb)] = c;
  }
}

bool Interpreter::Impl::run_on_kept_embedding_grad(int st, const Op& op, Fn fn, const std::function<void()>& f) {
  const int mb = op.micro_batch;
  if (op.layer != -1 || mb < 0 || mb >= m_count) return false;
  const bool emb_w = fn == Fn::embedding_bwd || (fn == Fn::chain && op.pass == Pass::W && op.type == OpType::collective);
  if (!emb_w) return false;
  bool kept = false;
  for (int li : stage_lanes[sz(st)]) {
    const Lane& L = lanes[sz(li)];
    const Reg& c = L.cur[2];
    if (!c.m.empty() && c.tag == Tag::stream && c.layer == 0 && c.mb == mb) return false;  // the chain holds it
    kept = kept || !L.emb_stash[sz(mb)].m.empty();
  }
  if (!kept) return false;
  auto swap_all = [&] {
    for (int li : stage_lanes[sz(st)]) std::swap(lanes[sz(li)].cur[2], lanes[sz(li)].emb_stash[sz(mb)]);
  };
  swap_all();
  try {
    f();
  } catch (...) {
    swap_all();
    throw;
  }
  swap_all();
  if (fn == Fn::embedding_bwd)
    for (int li : stage_lanes[sz(st)]) lanes[sz(li)].emb_stash[sz(mb)] = Reg{};
  return true;
}

int64_t Interpreter::Impl::partner_stage(int64_t st, Fn fn, std::string* why) const {
  auto none = [&](const char* w) {
    if (why != nullptr) *why = w;
    return int64_t{-1};
  };
  if (fn == Fn::embed_grad) {
    if (st != 0 && st != pp - 1) return none("an embedding-group collective on a middle stage");
    if (pp == 1) return none("an embedding-group collective with one pipeline stage");
    return st == 0 ? pp - 1 : 0;
  }
  if (pp - 1 - st == st) return none("a DualPipe mirror collective on the middle stage (odd pp): it has no partner");
  return pp - 1 - st;
}

void Interpreter::Impl::rendezvous_op(int st, const Op& op, Fn fn) {
  if (fn == Fn::embed_grad)
    embed_grad(op);
  else
    mirror_grad(st, op);
}

void Interpreter::Impl::build_schedule() {
  Schedule& S = sched;
  S.seq.assign(sz(pp), {});
  S.runs.assign(sz(pp), {});
  S.rendezvous.assign(sz(pp), {});
  for (int64_t st = 0; st < pp; ++st) {
    const size_t n = plan.stages[sz(st)].ops.size();
    S.seq[sz(st)].assign(n, -1);
    S.runs[sz(st)].assign(n, 0);
    S.rendezvous[sz(st)].assign(n, -1);
  }
  std::map<std::tuple<int64_t, int64_t, int>, int64_t> queued;  // (from, to, backward) -> messages
  std::vector<size_t> pc(sz(pp), 0);
  int64_t next = 0;
  while (true) {
    bool done = true, progress = false;
    for (int64_t st = 0; st < pp; ++st) {
      const auto& ops = plan.stages[sz(st)].ops;
      size_t& i = pc[sz(st)];
      while (i < ops.size()) {
        const Op& op = ops[i];
        const Fn fn = fns[sz(st)][i];
        const int dir = op.dir == Direction::forward ? 0 : 1;
        if (op.type == OpType::recv) {
          const int64_t from = op.peer_stage >= 0 ? op.peer_stage : st + (dir == 0 ? -1 : 1);
          auto it = queued.find({from, st, dir});
          if (it == queued.end() || it->second == 0) break;
          --it->second;
        } else if (two_stage(fn)) {
          const int64_t other = partner_stage(st, fn);
          if (other < 0) return;
          const size_t j = pc[sz(other)];
          if (j >= plan.stages[sz(other)].ops.size() || fns[sz(other)][j] != fn) break;
          S.runs[sz(st)][i] = 1;
          S.rendezvous[sz(st)][i] = S.rendezvous[sz(other)][j] = S.pairs++;
          S.seq[sz(st)][i] = next++;
          ++i;
          ++pc[sz(other)];
          progress = true;
          continue;
        } else if (fn == Fn::send) {
          const int64_t to = op.peer_stage >= 0 ? op.peer_stage : st + (dir == 0 ? 1 : -1);
          if (to < 0 || to >= pp) return;
          ++queued[{st, to, dir}];
        }
        S.seq[sz(st)][i] = next++;
        ++i;
        progress = true;
      }
      if (i < ops.size()) done = false;
    }
    if (done) break;
    if (!progress) return;
  }
  S.ok = true;
  sched_ops = next;
}

void Interpreter::Impl::run_serial() {
  std::vector<size_t> pc(sz(pp), 0);
  int64_t next = 0;
  auto enter = [&](int st) {
    t_exec.stage = st;
    t_exec.idx = pc[sz(st)];
    t_exec.key = next;
    t_exec.out = &outs[sz(st)];
  };
  while (true) {
    bool done = true, progress = false;
    for (int st = 0; st < static_cast<int>(pp); ++st) {
      const auto& ops = plan.stages[sz(st)].ops;
      while (pc[sz(st)] < ops.size()) {
        const Op& op = ops[pc[sz(st)]];
        if (op.type == OpType::recv && !recv_ready(st, op)) break;
        const Fn fn = fns[sz(st)][pc[sz(st)]];
        if (two_stage(fn)) {  // a collective across two stages
          enter(st);
          std::string why;
          const int other = static_cast<int>(partner_stage(st, fn, &why));
          if (other < 0) die(op, why);
          const auto& oops = plan.stages[sz(other)].ops;
          if (pc[sz(other)] >= oops.size() || fns[sz(other)][pc[sz(other)]] != fn) break;
          rendezvous_op(st, op, fn);
          ++next;
          ++pc[sz(st)];
          ++pc[sz(other)];
          progress = true;
          continue;
        }
        enter(st);
        exec(st, pc[sz(st)]);
        ++next;
        ++pc[sz(st)];
        progress = true;
      }
      if (pc[sz(st)] < ops.size()) done = false;
    }
    if (done) break;
    if (!progress) {
      t_exec = ExecCtx{};
      merge_outs();
      std::string waiting;
      for (int st = 0; st < static_cast<int>(pp); ++st)
        if (pc[sz(st)] < plan.stages[sz(st)].ops.size()) {
          t_exec.stage = st;
          t_exec.idx = pc[sz(st)];
          waiting += (waiting.empty() ? "" : "; ") + where(plan.stages[sz(st)].ops[pc[sz(st)]]);
        }
      problem("deadlock: every stage waits for a message: " + waiting);
      throw PlanFatal("deadlock");
    }
  }
}

void Interpreter::Impl::start_workers() {
  int n = opt.threads > 0 ? opt.threads : static_cast<int>(std::thread::hardware_concurrency());
  n = static_cast<int>(std::min<int64_t>(std::max(n, 1), pp));
  if (!sched.ok || opt.inject == Injection::pp_microbatch_swap) n = 1;  // swap: the newest message depends on timing
  threads = n;
  if (threads <= 1) return;
  stage_busy = std::make_unique<std::atomic<uint8_t>[]>(sz(pp));
  inbox = std::make_unique<std::atomic<uint32_t>[]>(sz(pp));
  blocked_at = std::make_unique<std::atomic<uint32_t>[]>(sz(pp));
  stage_done = std::make_unique<std::atomic<uint8_t>[]>(sz(pp));
  arrived = std::make_unique<std::atomic<uint8_t>[]>(sz(std::max(sched.pairs, 1)));
  delivered = std::make_unique<std::atomic<uint8_t>[]>(sz(std::max(sched.pairs, 1)));
  try {
    for (int w = 1; w < threads; ++w)
      workers.emplace_back([this, w] {
        uint32_t seen = 0;
        while (true) {
          job_gen.wait(seen);
          seen = job_gen.load();
          if (quitting) return;
          job(w);
          if (job_left.fetch_sub(1) == 1) job_left.notify_all();
        }
      });
  } catch (const std::system_error&) {  // no more threads: run on those started
    threads = static_cast<int>(workers.size()) + 1;
  }
}

void Interpreter::Impl::run_on_all(std::function<void(int)> f) {
  job = std::move(f);
  job_left.store(threads - 1);
  job_gen.fetch_add(1);
  job_gen.notify_all();
  job(0);
  for (int n = job_left.load(); n != 0; n = job_left.load()) job_left.wait(n);
}

void Interpreter::Impl::free_stages(int w) {
  for (int64_t st = static_cast<int64_t>(w) * pp / threads; st < (static_cast<int64_t>(w) + 1) * pp / threads; ++st) {
    pending[sz(st)].clear();
    free_stage(st);
  }
  if (w > 0) pool_release();
}

void Interpreter::Impl::stop_workers() {
  if (workers.empty()) return;
  run_on_all([this](int w) { free_stages(w); });
  quitting = true;
  job_gen.fetch_add(1);
  job_gen.notify_all();
  for (auto& w : workers) w.join();
  workers.clear();
}

bool Interpreter::Impl::run_parallel() {
  run_pc.assign(sz(pp), 0);
  stage_finished.assign(sz(pp), 0);
  for (int64_t st = 0; st < pp; ++st) {
    inbox[sz(st)].store(0);
    blocked_at[sz(st)].store(std::numeric_limits<uint32_t>::max());
    stage_busy[sz(st)].store(0);
    stage_done[sz(st)].store(plan.stages[sz(st)].ops.empty() ? 1 : 0);
  }
  int64_t left = 0;
  for (int64_t st = 0; st < pp; ++st) left += stage_done[sz(st)].load() ? 0 : 1;
  for (int k = 0; k < sched.pairs; ++k) {
    arrived[sz(k)].store(0);
    delivered[sz(k)].store(0);
  }
  stages_left.store(left);
  aborted.store(false);
  run_on_all([this](int w) { work(w); });
  t_exec = ExecCtx{};
  if (aborted.load()) {
    parallel_failed = true;
    return false;
  }
  try {
    for (int64_t st = 0; st < pp; ++st)
      if (!stage_finished[sz(st)]) finish_stage(static_cast<int>(st));  // stages without ops
  } catch (...) {
    parallel_failed = true;
    return false;
  }
  return true;
}

void Interpreter::Impl::work(int w) {
  const int64_t first = static_cast<int64_t>(w) * pp / threads;
  try {
    while (stages_left.load() > 0 && !aborted.load()) {
      const uint32_t ev = events.load(std::memory_order_acquire);
      bool moved = false;
      for (int64_t k = 0; k < pp && !aborted.load(std::memory_order_relaxed); ++k) {
        const int64_t st = (first + k) % pp;
        if (stage_done[sz(st)].load(std::memory_order_acquire)) continue;
        if (blocked_at[sz(st)].load(std::memory_order_relaxed) == inbox[sz(st)].load(std::memory_order_acquire))
          continue;  // still waiting: nothing arrived since it stopped
        uint8_t idle = 0;
        if (!stage_busy[sz(st)].compare_exchange_strong(idle, 1, std::memory_order_acquire)) continue;
        const size_t before = run_pc[sz(st)];
        bool signalled = false;
        run_stage(static_cast<int>(st), signalled);
        const bool finished = run_pc[sz(st)] == plan.stages[sz(st)].ops.size();
        const bool progressed = run_pc[sz(st)] != before;
        if (finished) finish_stage(static_cast<int>(st));
        if (finished) stage_done[sz(st)].store(1, std::memory_order_release);
        stage_busy[sz(st)].store(0, std::memory_order_release);
        if (finished) stages_left.fetch_sub(1);
        if (progressed || signalled) {
          moved = true;
          wake();
        }
      }
      if (!moved && stages_left.load() > 0) events.wait(ev, std::memory_order_acquire);
    }
  } catch (...) {
    aborted.store(true);
    wake();
  }
  t_exec = ExecCtx{};
  if (last_step && w > 0) pool_release();  // this thread's recycled storage: no further use
}

void Interpreter::Impl::run_stage(int st, bool& signalled) {
  const auto& ops = plan.stages[sz(st)].ops;
  size_t i = run_pc[sz(st)];  // a local copy: run_pc is shared with the other threads' stages
  struct Save {
    size_t& to;
    const size_t& from;
    ~Save() { to = from; }
  } save{run_pc[sz(st)], i};
  // Waiting: the stage's inbox count read before the check that failed (work() skips the
  // stage until something arrives for it).
  auto blocked = [&](uint32_t seen) { blocked_at[sz(st)].store(seen, std::memory_order_relaxed); };
  while (i < ops.size()) {
    const Op& op = ops[i];
    if (op.type == OpType::recv) {
      const uint32_t seen = inbox[sz(st)].load(std::memory_order_acquire);
      if (!recv_ready(st, op)) return blocked(seen);
    }
    if (two_stage(fns[sz(st)][i])) {
      const size_t k = sz(sched.rendezvous[sz(st)][i]);
      const int64_t other = partner_stage(st, fns[sz(st)][i]);
      const uint32_t seen = inbox[sz(st)].load(std::memory_order_acquire);
      if (sched.runs[sz(st)][i]) {
        if (!arrived[k].load(std::memory_order_acquire)) return blocked(seen);
        t_exec = ExecCtx{st, i, sched.seq[sz(st)][i], &outs[sz(st)]};
        rendezvous_op(st, op, fns[sz(st)][i]);
        delivered[k].store(1, std::memory_order_release);
        post(other);
      } else {
        if (!arrived[k].load(std::memory_order_relaxed)) {
          arrived[k].store(1, std::memory_order_release);
          post(other);
          signalled = true;
        }
        if (!delivered[k].load(std::memory_order_acquire)) return blocked(seen);
      }
      ++i;
      continue;
    }
    t_exec = ExecCtx{st, i, sched.seq[sz(st)][i], &outs[sz(st)]};
    exec(st, i);
    ++i;
    if (op.type == OpType::send) {  // the receiving stage may go on now
      post(op.peer_stage >= 0 ? op.peer_stage : st + (op.dir == Direction::forward ? 1 : -1));
      wake();
    }
  }
}

void Interpreter::Impl::run_step(int s, const Batch& bt, const RefStep* rf, const RefState& after, bool last) {
  step = s;
  batch = &bt;
  ref = rf;
  after_src = &after;
  last_step = last;
  reduced_mb.assign(sz(pp), {});
  reduced_step.assign(sz(pp), {});
  for (int64_t st = 0; st < pp; ++st) {
    const size_t np = ranks[sz(stage_ranks[sz(st)].front())].params.size();
    reduced_mb[sz(st)].assign(np, std::vector<uint8_t>(sz(m_count), 0));
    reduced_step[sz(st)].assign(np, 0);
    pending[sz(st)].clear();
  }
  mail.clear();
  for (auto& L : lanes) {
    for (Frame*& f : L.frames)
      if (f != nullptr) {
        f->reset();
        frame_free[sz(L.stage)].push_back(f);
        f = nullptr;
      }
    std::fill(L.ce_stage.begin(), L.ce_stage.end(), 0);
    std::fill(L.emb_stash.begin(), L.emb_stash.end(), Reg{});
    std::fill(L.emb_done.begin(), L.emb_done.end(), 0);
    for (auto& c : L.cur) c = Reg{};
  }
  for (auto& R : ranks) {
    R.loss_scaled = 0;
    for (auto& p : R.params) {
      std::fill(p.grad.v.begin(), p.grad.v.end(), 0.0);
      p.total.assign(sz(p.size()), 0.0);
      p.synced.assign(sz(p.size()), 0.0);
      p.has_synced.assign(sz(p.size()), 0);
      if (dpcp == 1) p.owned.assign(sz(p.size()), 1);  // else: kept from the last ReduceScatter
    }
  }
  if (parallel()) {
    if (!run_parallel()) return;  // a stage failed: Interpreter::run_step falls back to one thread
  } else {
    try {
      run_serial();
    } catch (...) {
      t_exec = ExecCtx{};
      merge_outs();
      throw;
    }
  }
  t_exec = ExecCtx{};
  merge_outs();
  for (int64_t st = 0; st < pp; ++st)
    if (!pending[sz(st)].empty())
      problem(fmt::format("stage {}: {} issued collective(s) never waited for", st, pending[sz(st)].size()));
  for (const auto& [k, q] : mail)
    if (!q.empty())
      problem(fmt::format("stage {} -> {}: {} P2P message(s) never received", lanes[sz(std::get<0>(k))].stage,
                          lanes[sz(std::get<1>(k))].stage, q.size()));
  // Loss: each rank of TP rank 0 that holds the loss (the last stage's; with DualPipe also
  // the first's) holds sum(l) x |DPxCP| / N of its tokens; the others hold 0.
  double loss = 0;
  for (const RankState& R : ranks)
    if (R.c.tp == 0) loss += R.loss_scaled;
  loss /= static_cast<double>(dpcp);
  ref->wait_done();
  const double e = abs_err(loss, ref->loss);
  record(kLoss, e, [&] { return fmt::format("global loss at step {}: {} vs {}", step, loss, ref->loss); });
  if (!parallel()) {  // run_parallel compared each stage when it finished
    const auto state = after();
    compare_state(s, *state.first, *state.second);
  }
}

void Interpreter::Impl::finish_stage(int st) {
  const auto state = (*after_src)();
  for (int64_t r : stage_ranks[sz(st)]) {
    t_exec = ExecCtx{st, 0, sched_ops + r, &outs[sz(st)]};
    compare_rank(ranks[sz(r)], step, *state.first, *state.second);
  }
  t_exec = ExecCtx{};
  if (last_step) free_stage(st);
  stage_finished[sz(st)] = 1;
}

void Interpreter::Impl::free_stage(int64_t st) {
  for (int li : stage_lanes[sz(st)]) {
    Lane& L = lanes[sz(li)];
    for (Frame*& f : L.frames) f = nullptr;
    for (auto& c : L.cur) c = Reg{};
    std::vector<double>().swap(L.grads);
  }
  std::deque<Frame>().swap(frame_store[sz(st)]);
  std::vector<Frame*>().swap(frame_free[sz(st)]);
  for (int64_t r : stage_ranks[sz(st)]) {
    std::vector<LocalParam>().swap(ranks[sz(r)].params);
    ranks[sz(r)].materialized_layers.clear();
  }
}

}  // namespace dtsim::verify
