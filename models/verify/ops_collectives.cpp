// Collectives (TP chain, sequence-parallel re-gather, DP gradients and parameter gathers, the
// SP and embedding-group AllReduces) and pipeline P2P messages.
// Part of the StepPlan interpreter (models/verify/interpreter.cpp, interpreter_impl.hpp).
#include "models/verify/interpreter_impl.hpp"

namespace dtsim::verify {

refmath::ReduceOp Interpreter::Impl::rop(const Op& op) {
  ReduceOp r = op.reduce;
  if (opt.inject == Injection::tp_grad_avg && op.kind == CommKind::TP && op.phase == Phase::backward &&
      r == ReduceOp::sum)
    r = ReduceOp::avg;
  if (opt.inject == Injection::dp_grad_sum && op.kind == CommKind::DP && r == ReduceOp::avg) r = ReduceOp::sum;
  switch (r) {
    case ReduceOp::sum: return refmath::ReduceOp::sum;
    case ReduceOp::avg: return refmath::ReduceOp::avg;
    case ReduceOp::max: return refmath::ReduceOp::max;
    case ReduceOp::none: break;
  }
  die(op, fmt::format("a {} needs a reduce op, the plan says none", to_string(op.collective)));
}

Reduce Interpreter::Impl::red(const Op& op) {
  switch (rop(op)) {
    case refmath::ReduceOp::sum: return Reduce::sum;
    case refmath::ReduceOp::avg: return Reduce::avg;
    case refmath::ReduceOp::max: return Reduce::max;
  }
  return Reduce::sum;
}

Doubles Interpreter::Impl::concat(const std::vector<const Doubles*>& parts) {
  size_t n = 0;
  for (const Doubles* p : parts) n += p->size();
  Doubles out;
  out.reserve(n);
  for (const Doubles* p : parts) out.insert(out.end(), p->begin(), p->end());
  return out;
}

void Interpreter::Impl::chain_collective(int st, const Op& op) {
  if (op.kind != CommKind::TP || op.group != GroupKind::TP)
    die(op, fmt::format("a chain collective over {} (expected TP)", to_string(op.group)));
  const int ph = phase_ix(op.phase);
  const bool backward = op.phase == Phase::backward;
  // AllReduce and AllGather hand every lane of the group the same values (copies of one
  // buffer), compared with the same reference rows: the first lane's comparison stands
  // for the others with the same chain state (chain_deliver).
  const bool identical = op.collective != Collective::ReduceScatter;
  std::vector<ChainPart> parts;
  for (const auto& g : lane_groups[sz(st)].at(GroupKind::TP)) {
    const int64_t n = static_cast<int64_t>(g.size());
    // The tensors go into the collective (the chain keeps what they are, not their data,
    // until the wait delivers the result).
    parts.push_back(ChainPart{&g, {}});
    std::vector<Reg>& vals = parts.back().vals;
    vals.reserve(g.size());
    for (int li : g) {
      Reg& cur = lanes[sz(li)].cur[ph];
      vals.push_back(std::move(cur));
      cur.tag = vals.back().tag;
      cur.layer = vals.back().layer;
      cur.mb = vals.back().mb;
      cur.m = Mat();
    }
    std::vector<Reg*> regs;
    for (Reg& r : vals) regs.push_back(&r);
    Reg& r0 = *regs.front();
    if (r0.m.empty()) die(op, "acts on the tensor produced last, but the stage's chain holds none");
    const double per_rank = static_cast<double>(r0.m.size() / nd);
    switch (op.collective) {
      case Collective::AllReduce: {
        if (r0.seq_shard || r0.chunk) die(op, "AllReduce of a sharded tensor");
        check_size(op, per_rank * kActBytes, "the tensor");
        std::vector<const double*> in;
        for (Reg* r : regs) {
          if (r->m.size() != r0.m.size()) die(op, "the TP ranks' tensors differ in size");
          in.push_back(r->m.v.data());
        }
        Doubles acc(r0.m.v.size());
        reduce_buffers(in.data(), in.size(), acc.size(), red(op), acc.data());
        for (Reg* r : regs) {
          std::copy(acc.begin(), acc.end(), r->m.v.begin());
          r->partial = false;
        }
        break;
      }
      case Collective::ReduceScatter: {
        if (r0.seq_shard || r0.chunk) die(op, "ReduceScatter of a sharded tensor");
        if (sl % n != 0) die(op, fmt::format("{} tokens per rank do not split over {} ranks", sl, n));
        check_size(op, per_rank * kActBytes, "the tensor (ReduceScatter input)");
        // Element-wise reduction of the full tensors (the rank order of every element as
        // in a packed ReduceScatter), then rank i keeps sequence shard i.
        std::vector<const double*> in;
        for (Reg* r : regs) {
          if (r->m.size() != r0.m.size()) die(op, "the TP ranks' tensors differ in size");
          in.push_back(r->m.v.data());
        }
        Mat acc = Mat::uninitialized(r0.m.rows, r0.m.cols);
        reduce_buffers(in.data(), in.size(), sz(acc.size()), red(op), acc.v.data());
        for (int64_t i = 0; i < n; ++i) {
          regs[sz(i)]->m = token_range(acc, B, i * sl / n, (i + 1) * sl / n);
          regs[sz(i)]->seq_shard = true;
          regs[sz(i)]->partial = false;
        }
        break;
      }
      case Collective::AllGather: {
        std::vector<const Doubles*> bufs;
        for (Reg* r : regs) bufs.push_back(&r->m.v);
        if (r0.chunk) {
          // Every lane holds its 1/t piece of each replica's flattened tensor.
          check_size(op, static_cast<double>(r0.full_rows * r0.full_cols) * kActBytes, "the gathered message");
          const Doubles out = concat(bufs);
          const int64_t full = r0.full_rows * r0.full_cols, piece = full / n;
          if (static_cast<int64_t>(out.size()) != nd * full || piece * n != full)
            die(op, "P2P chunks do not fill the tensor");
          for (int64_t i = 0; i < n; ++i) {
            Reg& r = *regs[sz(i)];
            Mat stacked = Mat::uninitialized(nd * r.full_rows, r.full_cols);
            for (int64_t dd = 0; dd < nd; ++dd)
              for (int64_t q = 0; q < n; ++q)
                std::copy(out.begin() + (q * nd + dd) * piece, out.begin() + (q * nd + dd + 1) * piece,
                          stacked.v.begin() + dd * full + q * piece);
            r.m = std::move(stacked);
            r.chunk = false;
          }
        } else if (r0.seq_shard) {
          check_size(op, per_rank * static_cast<double>(n) * kActBytes, "the gathered tensor");
          const int64_t cols = r0.m.cols, srows = r0.m.rows;
          for (Reg* r : regs)
            if (r->m.rows != srows || r->m.cols != cols) die(op, "the TP ranks' shards differ in size");
          Mat full = Mat::uninitialized(B * sl, cols);
          for (int64_t q = 0; q < n; ++q) set_token_range(full, B, q * sl / n, regs[sz(q)]->m);
          for (int64_t i = 0; i < n; ++i) {
            Reg& r = *regs[sz(i)];
            r.m = i + 1 < n ? full : std::move(full);
            r.seq_shard = false;
          }
        } else {
          die(op, "AllGather of a tensor that is neither sequence-sharded nor a P2P chunk");
        }
        break;
      }
      case Collective::AllToAll:  // only the MoE dispatch / combine, by name (ops_moe.cpp)
        die(op, "AllToAll on the stage's chain: only the MoE dispatch and combine exchange tokens");
    }
  }
  if (op.type == OpType::issue) {
    auto held = std::make_shared<std::vector<ChainPart>>(std::move(parts));
    launch(st, op, [this, held, ph, backward, &op, identical] {
      for (ChainPart& p : *held) chain_deliver(p, ph, backward, op, identical);
    });
  } else {
    for (ChainPart& p : parts) chain_deliver(p, ph, backward, op, identical);
  }
}

void Interpreter::Impl::chain_deliver(ChainPart& part, int ph, bool backward, const Op& op, bool identical) {
  const std::vector<int>& g = *part.g;
  CompareKey first;
  for (size_t i = 0; i < g.size(); ++i) {
    Lane& L = lanes[sz(g[i])];
    Reg& cur = L.cur[ph];
    Reg& r = part.vals[i];
    if (cur.tag != r.tag || cur.layer != r.layer || cur.mb != r.mb)
      problem(op, "an op between the issue and the wait moved the chain on: the collective's result arrives "
                  "after its tensor was consumed");
    cur = std::move(r);
    const CompareKey key = compare_key(cur, L);
    if (i == 0) first = key;
    if (identical && i > 0 && key == first) {
      if (cur.from_pp && !cur.chunk) {  // pp_probe's comparison, counted
        cur.from_pp = false;
        if (ref != nullptr && has_chunk_layers(L, cur)) cur_acc(kPP).n += cur.m.size();
      } else if (ref != nullptr && probe_of(cur, backward)) {
        cur_acc(kTP).n += cur.m.size();
      }
      continue;
    }
    if (cur.from_pp && !cur.chunk) {
      pp_probe(L, cur, backward);
      continue;
    }
    Probe p;
    int layer;
    if (probe_of(cur, backward, p, layer))
      compare_tokens(kTP, cur.m, p, layer, L, cur.mb, cur.seq_shard, 0,
                     op.phase == Phase::recompute ? "recompute, after TP collective" : "after TP collective",
                     backward);
  }
}

void Interpreter::Impl::launch(int st, const Op& op, std::function<void()> deliver) {
  if (op.type == OpType::issue) {
    if (pending[sz(st)].count(op.handle)) die(op, fmt::format("handle {} issued twice", op.handle));
    pending[sz(st)][op.handle] = std::move(deliver);
  } else {
    deliver();
  }
}

Tag Interpreter::Impl::regather_target(const Reg& cur, Slot& src, Slot& dst, int& layer, const Op& op) {
  const bool chain_at_op = cur.mb == op.micro_batch && cur.layer == op.layer &&
                           (cur.tag == Tag::dlogits || cur.tag == Tag::d_col_mlp || cur.tag == Tag::d_qkv);
  if (!chain_at_op) {
    // A deferred W (zero-bubble): the chain has moved on; the re-gather feeds the next
    // weight-gradient GEMM of its (layer, micro-batch).
    const auto& ops = plan.stages[sz(t_exec.stage)].ops;
    const auto& fs = fns[sz(t_exec.stage)];
    for (size_t i = t_exec.idx + 1; i < ops.size(); ++i) {
      if (ops[i].layer != op.layer || ops[i].micro_batch != op.micro_batch) continue;
      layer = op.layer;
      if (fs[i] == Fn::lm_head_wgrad) { src = Slot::nf; dst = Slot::ref; return Tag::normf; }
      if (fs[i] == Fn::mlp_up_wgrad) { src = Slot::n2; dst = Slot::re2; return Tag::norm2; }
      if (fs[i] == Fn::qkv_wgrad) { src = Slot::n1; dst = Slot::re1; return Tag::norm1; }
      if (fs[i] == Fn::q_up_wgrad || fs[i] == Fn::kv_up_wgrad) { src = Slot::mla_lat; dst = Slot::mla_re_lat; return Tag::latent; }
      if (fs[i] == Fn::lm_head_dgrad || fs[i] == Fn::mlp_up_dgrad || fs[i] == Fn::qkv_dgrad || fs[i] == Fn::q_up_dgrad)
        break;
    }
  }
  layer = cur.layer;
  switch (cur.tag) {
    case Tag::dlogits: src = Slot::nf; dst = Slot::ref; layer = -1; return Tag::normf;
    case Tag::d_col_mlp: src = Slot::n2; dst = Slot::re2; return Tag::norm2;
    case Tag::d_qkv:
      if (M.mla) { src = Slot::mla_lat; dst = Slot::mla_re_lat; return Tag::latent; }  // the latents (ops_mla.cpp)
      src = Slot::n1; dst = Slot::re1; return Tag::norm1;
    default: break;
  }
  die(op, "re-gathers the input of a column-parallel layer, but the backward chain is not at one");
}

void Interpreter::Impl::regather(int st, const Op& op) {
  std::vector<std::function<void()>> parts;
  for (const auto& g : lane_groups_of(st, op, GroupKind::TP, "tp_allgather_input")) {
    Slot src = Slot::n1, dst = Slot::re1;
    int layer = -1;
    int64_t rows = -1, cols = 0;
    const int64_t n = static_cast<int64_t>(g.size());
    std::vector<const Mat*> shards;
    for (int li : g) {
      Lane& L = lanes[sz(li)];
      regather_target(L.cur[2], src, dst, layer, op);
      const Mat& shard = need(L, layer, op.micro_batch, src, op, "the sequence shard of the norm output");
      if (rows >= 0 && (shard.rows != rows || shard.cols != cols)) die(op, "the TP ranks' shards differ in size");
      rows = shard.rows;
      cols = shard.cols;
      shards.push_back(&shard);
    }
    check_size(op, static_cast<double>(rows / nd * cols * n) * kActBytes, "the gathered norm output");
    // Gathered now (the shards are what they are at the issue), delivered at the wait.
    Mat full = Mat::uninitialized(B * sl, cols);
    for (int64_t q = 0; q < n; ++q) set_token_range(full, B, q * sl / n, *shards[sz(q)]);
    parts.push_back([this, g, full = std::move(full), layer, dst, mb = op.micro_batch] {
      for (size_t i = 0; i < g.size(); ++i) put(lanes[sz(g[i])], layer, mb, dst, full);
    });
  }
  launch(st, op, [parts] {
    for (const auto& p : parts) p();
  });
}

Bucket Interpreter::Impl::ready_bucket(int st, const Op& op) {
  Bucket bk;
  const RankState& R0 = ranks[sz(stage_ranks[sz(st)].front())];
  const auto& lw = last_write[sz(st)];
  const int idx = static_cast<int>(t_exec.idx);
  const bool own = op.grad_bucket == GradBucket::tied_embedding;
  const int word = own_bucket_param[sz(st)];
  if (own && word < 0) die(op, "a tied word-embedding bucket on a stage without a tied word embedding");
  // Routed experts live in their own buffers, reduced over EDP; the rest over DPxCP.
  const bool experts = op.group == GroupKind::EDP;
  for (size_t p = 0; p < R0.params.size(); ++p) {
    if (own != (static_cast<int>(p) == word)) continue;
    if (expert_param(R0.params[p].kind) != experts) continue;
    bool ready = false;
    if (per_mb_reduce) {
      const int mb = op.micro_batch;
      if (mb < 0 || mb >= m_count) die(op, "a per-micro-batch gradient reduction without a micro-batch");
      const int64_t w = lw[p][sz(mb)];
      ready = w >= 0 && w < idx && !reduced_mb[sz(st)][p][sz(mb)];
      if (ready) reduced_mb[sz(st)][p][sz(mb)] = 1;
    } else {
      int64_t w = -1;
      for (int64_t x : lw[p]) w = std::max(w, x);
      ready = w >= 0 && w < idx && !reduced_step[sz(st)][p];
      if (ready) reduced_step[sz(st)][p] = 1;
    }
    if (ready) {
      bk.params.push_back(static_cast<int>(p));
      bk.elems += R0.params[p].size();
    }
  }
  if (own && bk.params.empty())
    die(op, "the tied word embedding's own bucket, but its gradient is not complete or already reduced");
  return bk;
}

Vector Interpreter::Impl::pack_grads(const RankState& R, const Bucket& bk) const {
  Vector v;
  v.reserve(sz(bk.elems));
  for (int p : bk.params) {
    const auto& g = R.params[sz(p)].grad.v;
    v.insert(v.end(), g.begin(), g.end());
  }
  return v;
}

void Interpreter::Impl::dp_grad(int st, const Op& op) {
  const bool experts = op.group == GroupKind::EDP;
  if (op.group != GroupKind::DPxCP && !experts)
    problem(op, fmt::format("gradients reduced over {}; ranks holding the same weights form DPxCP (routed experts: EDP)",
                            to_string(op.group)));
  const Bucket bk = ready_bucket(st, op);
  if (bk.params.empty()) die(op, "reduces gradients, but no gradient is complete and unreduced here");
  check_size(op, static_cast<double>(bk.elems) * grad_bytes,
             fmt::format("the {} completed gradient elements", bk.elems).c_str());
  if (opt.inject == Injection::adam_before_sync) {
    if (op.type == OpType::issue) launch(st, op, [] {});
    return;
  }
  const bool rs = op.collective == Collective::ReduceScatter;
  if (!rs && op.collective != Collective::AllReduce) die(op, "gradients need an AllReduce or a ReduceScatter");
  // Routed experts (verify.hpp): an AVG over EDP is Megatron-Core's expert gradient scaling,
  // a SUM over EDP times 1 / |DPxCP| (distributed_data_parallel.py,
  // expert_gradient_scaling_factor), so each token's contribution counts once. The
  // ep-grad-avg-over-ep injection averages over the EP group instead.
  refmath::ReduceOp ro = rop(op);
  double scale = 1.0;
  const bool ep_bug = experts && opt.inject == Injection::ep_grad_avg_over_ep;
  if (experts && !ep_bug && ro == refmath::ReduceOp::avg) {
    ro = refmath::ReduceOp::sum;
    scale = 1.0 / static_cast<double>(dpcp);
  }
  Op gop = op;
  if (ep_bug) gop.group = GroupKind::EP;
  std::vector<std::function<void()>> parts;
  for (const auto& g : groups(st, gop)) {
    const int64_t n = static_cast<int64_t>(g.size());
    const int64_t chunk = (bk.elems + n - 1) / n;
    std::vector<Vector> in;
    for (int64_t r : g) {
      RankState& R = ranks[sz(r)];
      Vector v = pack_grads(R, bk);
      if (rs) v.resize(sz(chunk * n), 0.0);  // pad to equal chunks
      in.push_back(std::move(v));
      for (int p : bk.params) {  // hand the gradient to the collective
        LocalParam& lp = R.params[sz(p)];
        for (int64_t e = 0; e < lp.size(); ++e) lp.total[sz(e)] += lp.grad.v[sz(e)];
        std::fill(lp.grad.v.begin(), lp.grad.v.end(), 0.0);
      }
    }
    auto out = rs ? refmath::reduce_scatter(in, ro) : refmath::all_reduce(in, ro);
    if (scale != 1.0)
      for (auto& o : out)
        for (double& x : o) x *= scale;
    parts.push_back([this, g, out = std::move(out), bk, rs, chunk, op] {
      for (size_t i = 0; i < g.size(); ++i) {
        RankState& R = ranks[sz(g[i])];
        const int64_t lo = rs ? static_cast<int64_t>(i) * chunk : 0;
        const int64_t hi = rs ? std::min(bk.elems, lo + chunk) : bk.elems;
        int64_t f = 0;
        for (int p : bk.params) {
          LocalParam& lp = R.params[sz(p)];
          for (int64_t e = 0; e < lp.size(); ++e, ++f) {
            const bool mine = f >= lo && f < hi;
            if (lp.z3 && mine != static_cast<bool>(lp.owned[sz(e)])) {
              problem(op, fmt::format("the gradient ReduceScatter hands {} of layer {} to other owners than the "
                                      "ZeRO-3 parameter AllGather gathers from",
                                      lk_name(lp.kind), lp.layer));
              continue;
            }
            lp.owned[sz(e)] = mine;
            if (!mine) continue;
            lp.synced[sz(e)] += out[i][sz(f - lo)];
            lp.has_synced[sz(e)] = 1;
            lp.owned[sz(e)] = 1;
          }
        }
      }
    });
  }
  launch(st, op, [parts] {
    for (const auto& p : parts) p();
  });
}

void Interpreter::Impl::dp_param_gather(int st, const Op& op) {
  const bool skip = opt.inject == Injection::zero_skip_param_gather;
  const int layer = op.layer;
  std::vector<std::function<void()>> parts;
  for (const auto& g : groups(st, op)) {
    const RankState& R0 = ranks[sz(g.front())];
    std::vector<int> sel;
    int64_t total = 0;
    for (size_t p = 0; p < R0.params.size(); ++p) {
      const int pl = R0.params[p].layer;
      // edp_param_allgather: routed experts over EDP; dp_param_allgather: the rest over DPxCP.
      if (expert_param(R0.params[p].kind) != (op.group == GroupKind::EDP)) continue;
      const int count = std::max(1, op.gather_layers);  // a whole chunk's layers (Op::gather_layers)
      if (layer < 0 ? (pl < 0 || !gathered_layers[sz(st)].count(pl)) : (pl >= layer && pl < layer + count)) {
        sel.push_back(static_cast<int>(p));
        total += R0.params[p].size();
      }
    }
    if (sel.empty()) die(op, fmt::format("gathers the parameters of layer {}, which stage {} does not hold", layer, st));
    check_size(op, static_cast<double>(total) * kActBytes,
               layer < 0 ? "the stage's parameters"
               : op.gather_layers > 1 ? fmt::format("layers {}-{}'s parameters", layer, layer + op.gather_layers - 1).c_str()
                                      : fmt::format("layer {}'s parameters", layer).c_str());
    // Snapshot at issue: the owner's value of every element (none yet: keep the rank's).
    std::vector<std::vector<double>> val(sel.size());
    std::vector<std::vector<uint8_t>> have(sel.size());
    for (size_t k = 0; k < sel.size(); ++k) {
      const int64_t n = R0.params[sz(sel[k])].size();
      val[k].assign(sz(n), 0.0);
      have[k].assign(sz(n), 0);
      for (int64_t r : g) {
        const LocalParam& lp = ranks[sz(r)].params[sz(sel[k])];
        for (int64_t e = 0; e < n; ++e)
          if (lp.owned[sz(e)] && !have[k][sz(e)]) {
            val[k][sz(e)] = lp.value.v[sz(e)];
            have[k][sz(e)] = 1;
          }
      }
      const LocalParam& lp0 = R0.params[sz(sel[k])];
      if (lp0.z3 && std::find(have[k].begin(), have[k].end(), 0) != have[k].end())
        problem(op, fmt::format("no rank of the DPxCP group owns some elements of {} (layer {})", lk_name(lp0.kind),
                                lp0.layer));
    }
    parts.push_back([this, g, sel, val = std::move(val), have = std::move(have), layer, skip, st] {
      if (skip) return;
      for (int64_t r : g) {
        RankState& R = ranks[sz(r)];
        for (size_t k = 0; k < sel.size(); ++k) {
          LocalParam& lp = R.params[sz(sel[k])];
          for (int64_t e = 0; e < lp.size(); ++e)
            if (have[k][sz(e)]) {
              lp.value.v[sz(e)] = val[k][sz(e)];
              lp.fresh[sz(e)] = 1;
            }
          ++epoch[sz(st)];
          if (lp.z3) lp.materialized = true;
        }
        if (layer >= 0 && zero == 3) R.materialized_layers.insert(layer);
      }
    });
  }
  launch(st, op, [parts] {
    for (const auto& p : parts) p();
  });
}

void Interpreter::Impl::sp_grad_allreduce(int st, const Op& op) {
  for (const auto& g : groups(st, op)) {
    std::vector<Vector> in;
    for (int64_t r : g) {
      Vector v;
      for (auto& p : ranks[sz(r)].params)
        if (sp_partial_grad(p.kind))
          for (int64_t e = 0; e < p.size(); ++e) v.push_back(p.has_synced[sz(e)] ? p.synced[sz(e)] : p.grad.v[sz(e)]);
      in.push_back(std::move(v));
    }
    check_size(op, static_cast<double>(in.front().size()) * grad_bytes, "the sequence-parallel replicated gradients");
    const auto out = refmath::all_reduce(in, rop(op));
    // mla-down-grad-unreduced: MLA's replicated parameters keep their TP partial gradients.
    const bool skip_mla = opt.inject == Injection::mla_down_grad_unreduced;
    for (size_t i = 0; i < g.size(); ++i) {
      size_t f = 0;
      for (auto& p : ranks[sz(g[i])].params) {
        if (!sp_partial_grad(p.kind)) continue;
        if (skip_mla && mla_replicated(p.kind)) {
          f += sz(p.size());
          continue;
        }
        for (int64_t e = 0; e < p.size(); ++e, ++f) (p.has_synced[sz(e)] ? p.synced[sz(e)] : p.grad.v[sz(e)]) = out[i][f];
      }
    }
  }
}

void Interpreter::Impl::embed_grad(const Op& op) {
  int64_t mixed_pairs = 0, first_a = -1, first_b = -1;
  for (int64_t r : stage_ranks[0]) {
    const auto g = grid.group_of(r, op.group);
    if (g.size() != 2) die(op, fmt::format("expects a group of the first and the last stage, {} has {} rank(s)",
                                          to_string(op.group), g.size()));
    RankState& A = ranks[sz(g[0])];
    RankState& B = ranks[sz(g[1])];
    const int ia = pindex(A, LK::word, -1), ib = pindex(B, LK::head_w, -1);
    if (ia < 0 || ib < 0) die(op, "an embedding-group AllReduce without a tied word embedding on both ends");
    LocalParam& a = A.params[sz(ia)];
    LocalParam& bb = B.params[sz(ib)];
    check_size(op, static_cast<double>(a.size()) * grad_bytes, "the word-embedding gradient");
    Vector va(sz(a.size())), vb(sz(a.size()));
    bool mixed = false;
    for (int64_t e = 0; e < a.size(); ++e) {
      va[sz(e)] = grad_as_is(a, sz(e));
      vb[sz(e)] = grad_as_is(bb, sz(e));
      mixed = mixed || (a.has_synced[sz(e)] != bb.has_synced[sz(e)]);
    }
    if (mixed && mixed_pairs++ == 0) {
      first_a = A.rank;
      first_b = B.rank;
    }
    const auto out = refmath::all_reduce({va, vb}, rop(op));
    for (int64_t e = 0; e < a.size(); ++e) {
      grad_as_is(a, sz(e)) = out[0][sz(e)];
      grad_as_is(bb, sz(e)) = out[1][sz(e)];
    }
  }
  if (mixed_pairs > 0)
    problem(op, fmt::format("in {} of {} embedding groups (e.g. ranks {} and {}) the two stages' DP "
                            "ReduceScatters gave the word-embedding gradient different owners, so the SUM adds "
                            "reduced values to unreduced ones (Megatron-Core gives a shared embedding its own "
                            "gradient bucket with the distributed optimizer: param_and_grad_buffer.py "
                            "_does_param_require_new_bucket)",
                            mixed_pairs, stage_ranks[0].size(), first_a, first_b));
}

void Interpreter::Impl::mirror_grad(int st, const Op& op) {
  const int64_t lo = std::min<int64_t>(st, pp - 1 - st), hi = pp - 1 - lo;
  if (lo == hi) die(op, "a DualPipe mirror collective on the middle stage (odd pp): it has no partner");
  if (op.kind != CommKind::PP || op.collective != Collective::AllReduce || op.group != GroupKind::MIRROR)
    die(op, fmt::format("dualpipe_grad_allreduce must be a PP AllReduce over MIRROR, the plan says {} {} over {}",
                        to_string(op.kind), to_string(op.collective), to_string(op.group)));
  int64_t mixed_pairs = 0, first_a = -1, first_b = -1;
  bool sized = false;
  for (int64_t r : stage_ranks[sz(lo)]) {
    RankState& A = ranks[sz(r)];
    const auto g = grid.group_of(r, op.group);
    if (g.size() != 2)
      die(op, fmt::format("expects a pair of mirror ranks, {} has {} rank(s)", to_string(op.group), g.size()));
    RankState& Bm = ranks[sz(g[0] == r ? g[1] : g[0])];
    // What the AllReduce carries: every shared gradient element before the DP sync; after a
    // DP ReduceScatter only the shard the rank owns (both copies sharded alike), the rest
    // being stale there (summed here all the same; they are not compared).
    bool after_dp = false;
    for (const LocalParam& a : A.params)
      after_dp = after_dp || std::find(a.has_synced.begin(), a.has_synced.end(), 1) != a.has_synced.end();
    int64_t n = 0, n_expert = 0, carried = 0;
    bool mixed = false;
    for (LocalParam& a : A.params) {
      const int ib = pindex(Bm, a.kind, a.layer);
      if (ib < 0) continue;
      LocalParam& bb = Bm.params[sz(ib)];
      if (bb.size() != a.size() || bb.gidx != a.gidx)
        die(op, fmt::format("stages {} and {} hold different shards of {} (layer {})", lo, hi, lk_name(a.kind),
                            a.layer));
      Vector va(sz(a.size())), vb(sz(a.size()));
      for (int64_t e = 0; e < a.size(); ++e) {
        va[sz(e)] = grad_as_is(a, sz(e));
        vb[sz(e)] = grad_as_is(bb, sz(e));
        mixed = mixed || (a.has_synced[sz(e)] != bb.has_synced[sz(e)]);
      }
      const auto out = refmath::all_reduce({va, vb}, rop(op));
      for (int64_t e = 0; e < a.size(); ++e) {
        grad_as_is(a, sz(e)) = out[0][sz(e)];
        grad_as_is(bb, sz(e)) = out[1][sz(e)];
      }
      n += a.size();
      if (expert_param(a.kind)) n_expert += a.size();
      carried += after_dp ? std::count(a.has_synced.begin(), a.has_synced.end(), 1) : a.size();
    }
    if (n == 0) die(op, fmt::format("stages {} and {} hold no parameter in common", lo, hi));
    // After a DP ReduceScatter a rank adds only the shard it owns; the plan sizes that shard
    // as the mean over the DP x CP group (its elements / N, the distributed optimizer's
    // padded even shard) and, for routed experts, over the expert-data-parallel group that
    // shards them; this rank's own (`carried`) may differ by the rounding.
    (void)carried;
    const bool sharded = after_dp && grad_sync_policy(plan.exp).sharded_optimizer;
    const double group = static_cast<double>(plan.exp.layout.dp * plan.exp.layout.cp);
    const double edp = static_cast<double>(std::max<int64_t>(1, plan.exp.layout.edp()));
    const double owned = static_cast<double>(n - n_expert) / group + static_cast<double>(n_expert) / edp;
    if (!sized)
      check_size(op, (sharded ? owned : static_cast<double>(n)) * grad_bytes,
                 sharded ? "the mean owned shard of the gradients both stages hold" : "the gradients both stages hold");
    sized = true;
    if (mixed && mixed_pairs++ == 0) {
      first_a = A.rank;
      first_b = Bm.rank;
    }
  }
  if (mixed_pairs > 0)
    problem(op, fmt::format("in {} of {} mirror pairs (e.g. ranks {} and {}) the two stages' DP ReduceScatters gave "
                            "a shared parameter's gradient different owners, so the SUM adds reduced values to "
                            "unreduced ones: sum the copies before the DP ReduceScatter, or shard both alike",
                            mixed_pairs, stage_ranks[sz(lo)].size(), first_a, first_b));
}

void Interpreter::Impl::send(int st, const Op& op) {
  const bool fwd = op.dir == Direction::forward;
  const int ph = fwd ? 0 : 2;
  for (int li : stage_lanes[sz(st)]) {
    Lane& L = lanes[sz(li)];
    Reg& c = L.cur[ph];
    if (c.m.empty() || c.partial || c.chunk || (c.tag != Tag::stream && c.tag != Tag::embed_out))
      die(op, "sends the stage's output, but the chain does not hold a complete activation / gradient");
    const int to = peer(L, op, fwd ? 1 : -1);
    if (to < 0) die(op, "sends to a stage outside the pipeline");
    Reg msg;
    msg.tag = c.tag;
    msg.layer = c.layer;
    msg.seq_shard = c.seq_shard;
    msg.mb = op.micro_batch;
    if (!sp && t > 1) {  // Megatron scatter/gather: each TP rank sends 1/t of each replica's tensor
      const int64_t full = c.m.size() / nd, n = full / t;
      msg.full_rows = c.m.rows / nd;
      msg.full_cols = c.m.cols;
      msg.m = Mat(1, nd * n);
      for (int64_t dd = 0; dd < nd; ++dd)
        std::copy(c.m.v.begin() + dd * full + L.tp * n, c.m.v.begin() + dd * full + (L.tp + 1) * n,
                  msg.m.v.begin() + dd * n);
      msg.chunk = true;
    } else {
      msg.m = c.m;
    }
    check_size(op, static_cast<double>(msg.m.size() / nd) * kActBytes, "the message");
    const std::lock_guard<std::mutex> lock(mail_mu);
    mail[{li, to, fwd ? 0 : 1}].push_back({op.micro_batch, virtual_stage(st, op.chunk), std::move(msg)});
  }
}

bool Interpreter::Impl::recv_ready(int st, const Op& op) {
  const bool fwd = op.dir == Direction::forward;
  const std::lock_guard<std::mutex> lock(mail_mu);
  for (int li : stage_lanes[sz(st)]) {
    auto it = mail.find({peer(lanes[sz(li)], op, fwd ? -1 : 1), li, fwd ? 0 : 1});
    if (it == mail.end() || it->second.empty()) return false;
  }
  return true;
}

void Interpreter::Impl::recv(int st, const Op& op) {
  const bool fwd = op.dir == Direction::forward;
  const int64_t want_vs = virtual_stage(st, op.chunk) + (fwd ? -1 : 1);
  for (int li : stage_lanes[sz(st)]) {
    Lane& L = lanes[sz(li)];
    const bool swap = opt.inject == Injection::pp_microbatch_swap;
    Msg msg;
    {
      const std::lock_guard<std::mutex> lock(mail_mu);
      auto& q = mail[{peer(L, op, fwd ? -1 : 1), li, fwd ? 0 : 1}];
      msg = std::move(swap ? q.back() : q.front());
      if (swap) q.pop_back(); else q.pop_front();
    }
    if (!swap && (msg.mb != op.micro_batch || msg.vs != want_vs))
      problem(op, fmt::format("receives the message of micro-batch {} from virtual stage {} (wanted micro-batch {} "
                              "from virtual stage {}): sender and receiver orders differ",
                              msg.mb, msg.vs, op.micro_batch, want_vs));
    check_size(op, static_cast<double>(msg.reg.m.size() / nd) * kActBytes, "the message");
    Reg& c = L.cur[fwd ? 0 : 2];
    c = std::move(msg.reg);
    c.mb = op.micro_batch;
    c.tag = Tag::stream;
    c.model_chunk = op.chunk;
    auto cl = chunk_layers[sz(st)].find(op.chunk);
    c.layer = cl == chunk_layers[sz(st)].end() ? -1 : (fwd ? cl->second.first - 1 : cl->second.second + 1);
    c.from_pp = true;
    if (!c.chunk) pp_probe(L, c, !fwd);
  }
}

}  // namespace dtsim::verify
