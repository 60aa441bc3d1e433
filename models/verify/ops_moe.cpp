// Op semantics of the mixture-of-experts block (models/blocks/moe.hpp, models/moe.hpp's eight
// steps): router, top-k, permute, the EP dispatch / combine AllToAlls as real permutations of
// token rows between the ranks of the EP group, the ETP AllGather / ReduceScatter, the local
// experts' SwiGLU GEMMs, the weighted unpermute, and their backward.
// Part of the StepPlan interpreter (models/verify/interpreter.cpp, interpreter_impl.hpp).
//
// Tensors of a MoE layer are kept per rank (Impl::moe_frames), not stacked by lane: the number
// of copies a rank's experts receive differs between ranks. Orders (documented, they only
// change summation orders): a rank's permuted copies are sorted by expert, then by token and
// k-slot (Megatron-Core moe_utils.py permute: a stable sort by expert); an EP rank receives,
// for each of its local experts in order, the copies of every rank of its EP group in group
// order; the ETP AllGather concatenates the ETP group's received lists in group order, and the
// ReduceScatter hands each member back its own block. The plan's sizes of these collectives
// are balanced-load estimates (models/moe.hpp moe_tokens), so they are not checked here.
// The shared expert runs as the mlp_* ops on a MoE layer's up_w / gate_w / down_w; its output
// (Tag::shared_out) and input gradient (Tag::d_shared) meet the routed ones where both exist:
// moe_unpermute / router_dgrad add theirs when the shared expert ran first (overlap), else they
// wait in Slot::moe_out / moe_dx for dropout_residual / post_attention_norm_bwd.
#include "models/verify/interpreter_impl.hpp"

namespace dtsim::verify {

namespace {

/// Row block [lo, lo + n) of `m` as a new Mat.
Mat rows_of(const Mat& m, int64_t lo, int64_t n) {
  Mat out = Mat::uninitialized(n, m.cols);
  std::copy(m.v.begin() + lo * m.cols, m.v.begin() + (lo + n) * m.cols, out.v.begin());
  return out;
}

}  // namespace

namespace {
/// ETP group of one rank: the gathered list is the received one.
void etp_identity(MoeFrame& F) {
  F.gath = F.recv;
  F.gath_owner.assign(F.recv.size(), 0);
  F.gx = F.rx;
}
}  // namespace

void Interpreter::Impl::moe_op(Lane& L, Fn fn, const Op& op) {
  const int Ly = op.layer, mb = op.micro_batch;
  if (!M.moe_layer(Ly)) die(op, "is a MoE op on a layer that is not a MoE layer");
  const Layout& lay = plan.exp.layout;
  const int64_t E = M.experts, k = M.topk, le = E / lay.ep, fl = M.fe / lay.expert_tp();
  const bool unweighted = opt.inject == Injection::moe_combine_unweighted;
  // The plan has no collective over a group of one rank (BlockContext::collective): then the
  // data stays where it is.
  const bool ep1 = lay.ep == 1, etp1 = lay.expert_tp() == 1;
  // The lane's stacked matrix of the replicas' T x cols results.
  auto stacked = [&](auto&& get, int64_t cols) {
    std::vector<const Mat*> parts;
    int64_t rows = 0;
    for (int64_t dd = 0; dd < nd; ++dd) {
      parts.push_back(&get(moe_frame(L.reps[sz(dd)], Ly, mb)));
      rows += parts.back()->rows;
    }
    Mat out = Mat::uninitialized(rows, cols);
    int64_t at = 0;
    for (const Mat* p : parts) {
      std::copy(p->v.begin(), p->v.end(), out.v.begin() + at);
      at += p->size();
    }
    return out;
  };
  // The local expert of a copy on EP position j.
  auto local = [&](int64_t rank, int64_t expert) {
    const int64_t j = group_pos(rank, GroupKind::EP);
    const int64_t l = expert - j * le;
    if (l < 0 || l >= le) die(op, fmt::format("a copy for expert {} reached rank {}, which does not hold it", expert, rank));
    return l;
  };
  for (int64_t dd = 0; dd < nd; ++dd) {
    const int64_t rank = L.reps[sz(dd)];
    MoeFrame& F = moe_frame(rank, Ly, mb);
    switch (fn) {
      case Fn::router: {
        const Reg& c = expect(L, op, {Tag::norm2}, "the post_attention_norm output", false);
        if (c.seq_shard != sp) die(op, "routes a full-sequence input with sequence parallelism (or a shard without)");
        const int64_t rr = c.m.rows / nd;
        F = MoeFrame{};
        F.x = rows_of(c.m, dd * rr, rr);
        F.logits = Mat::uninitialized(rr, E);
        gemm(F.x.v.data(), lane_value(L, dd, LK::router_w, Ly, op).v.data(), F.logits.v.data(), rr, h, E, false);
        break;
      }
      case Fn::router_topk: {
        if (F.logits.empty()) die(op, "needs the router's logits, which no earlier op produced");
        const int64_t T = F.logits.rows;
        F.sel.assign(sz(T * k), 0);
        F.prob.assign(sz(T * k), 0.0);
        for (int64_t tk = 0; tk < T; ++tk) moe_route(M, F.logits.row(tk), F.sel.data() + tk * k, F.prob.data() + tk * k);
        break;
      }
      case Fn::moe_permute: {
        if (F.sel.empty()) die(op, "needs the router's top-k, which no earlier op produced");
        const int64_t n = static_cast<int64_t>(F.sel.size());
        F.perm.resize(sz(n));
        for (int64_t i = 0; i < n; ++i) F.perm[sz(i)] = i;
        std::stable_sort(F.perm.begin(), F.perm.end(), [&](int64_t a, int64_t b) { return F.sel[sz(a)] < F.sel[sz(b)]; });
        F.px = Mat::uninitialized(n, h);
        for (int64_t j = 0; j < n; ++j) std::copy_n(F.x.row(F.perm[sz(j)] / k), h, F.px.row(j));
        if (ep1) {  // no EP group: the rank's experts take its own copies, in permuted order
          F.recv.clear();
          for (int64_t j = 0; j < n; ++j) F.recv.push_back(MoeCopy{rank, j, F.sel[sz(F.perm[sz(j)])]});
          F.rx = F.px;
          if (etp1) etp_identity(F);
        }
        break;
      }
      case Fn::expert_up:
      case Fn::expert_gate: {
        if (F.gx.rows != static_cast<int64_t>(F.gath.size()) || F.gath_owner.size() != F.gath.size())
          die(op, "needs the dispatched tokens (moe_dispatch, moe_etp_allgather), which did not arrive");
        const bool up = fn == Fn::expert_up;
        const double* w = lane_value(L, dd, up ? LK::eup_w : LK::egate_w, Ly, op).v.data();
        Mat out = Mat::uninitialized(F.gx.rows, fl);
        for (int64_t r = 0; r < F.gx.rows; ++r)
          gemm(F.gx.row(r), w + local(rank, F.gath[sz(r)].expert) * h * fl, out.row(r), 1, h, fl, false);
        (up ? F.u : F.g) = std::move(out);
        break;
      }
      case Fn::expert_swiglu: {
        if (F.u.empty() && F.gx.rows > 0) die(op, "needs expert_up's output");
        if (F.g.rows != F.u.rows) die(op, "needs expert_gate's output");
        F.act = Mat::uninitialized(F.u.rows, F.u.cols);
        for (int64_t i = 0; i < F.u.size(); ++i) F.act.v[sz(i)] = silu(F.g.v[sz(i)]) * F.u.v[sz(i)];
        break;
      }
      case Fn::expert_down: {
        if (F.act.rows != F.gx.rows) die(op, "needs the experts' SwiGLU output");
        const double* w = lane_value(L, dd, LK::edown_w, Ly, op).v.data();
        F.y = Mat::uninitialized(F.act.rows, h);
        for (int64_t r = 0; r < F.act.rows; ++r)
          gemm(F.act.row(r), w + local(rank, F.gath[sz(r)].expert) * fl * h, F.y.row(r), 1, fl, h, false);
        if (etp1) F.ry = F.y;
        if (etp1 && ep1) F.py = F.ry;
        break;
      }
      case Fn::moe_unpermute: {
        const int64_t n = static_cast<int64_t>(F.perm.size());
        if (F.py.rows != n || n == 0) die(op, "needs the experts' outputs back (moe_combine), which did not arrive");
        const int64_t T = F.x.rows;
        Mat out(T, h);
        for (int64_t j = 0; j < n; ++j) {
          const int64_t c = F.perm[sz(j)], tk = c / k;
          const double w = unweighted ? 1.0 : F.prob[sz(c)];
          for (int64_t q = 0; q < h; ++q) out.at(tk, q) += w * F.py.at(j, q);
        }
        F.dx = std::move(out);  // the routed output, until the lane's matrix is built below
        break;
      }
      case Fn::moe_unpermute_bwd: {
        const Reg& c = expect(L, op, {Tag::d_mlp_out}, "the MoE output gradient", false);
        if (c.seq_shard != sp) die(op, "the MoE output gradient is not sharded as the MoE input");
        const int64_t rr = c.m.rows / nd, n = static_cast<int64_t>(F.perm.size());
        if (F.py.rows != n || F.x.rows != rr) die(op, "needs the MoE forward of this layer and micro-batch (or its recompute)");
        const double* dout = c.m.row(dd * rr);
        F.pdy = Mat::uninitialized(n, h);
        F.dprob.assign(sz(rr * k), 0.0);
        for (int64_t j = 0; j < n; ++j) {
          const int64_t cc = F.perm[sz(j)], tk = cc / k;
          const double w = unweighted ? 1.0 : F.prob[sz(cc)];
          double dot = 0;
          for (int64_t q = 0; q < h; ++q) {
            F.pdy.at(j, q) = w * dout[tk * h + q];
            dot += dout[tk * h + q] * F.py.at(j, q);
          }
          if (!unweighted) F.dprob[sz(cc)] = dot;
        }
        if (ep1) F.rdy = F.pdy;
        if (ep1 && etp1) F.gdy = F.rdy;
        break;
      }
      case Fn::expert_down_dgrad: {
        if (F.gdy.rows != static_cast<int64_t>(F.gath.size()))
          die(op, "needs the experts' output gradients (moe_combine_bwd, moe_etp_allgather_bwd), which did not arrive");
        const double* w = lane_value(L, dd, LK::edown_w, Ly, op).v.data();
        F.da = Mat::uninitialized(F.gdy.rows, fl);
        for (int64_t r = 0; r < F.gdy.rows; ++r)
          gemm_nt(F.gdy.row(r), w + local(rank, F.gath[sz(r)].expert) * fl * h, F.da.row(r), 1, h, fl, false);
        break;
      }
      case Fn::expert_down_wgrad: {
        if (F.gdy.rows != F.act.rows) die(op, "needs the experts' output gradients and SwiGLU outputs");
        const int pi = lane_param(L, LK::edown_w, Ly, op);
        double* gw = lane_grad(L, pi, dd);
        for (int64_t r = 0; r < F.gdy.rows; ++r) {
          double* g = gw + local(rank, F.gath[sz(r)].expert) * fl * h;
          for (int64_t a = 0; a < fl; ++a)
            for (int64_t q = 0; q < h; ++q) g[a * h + q] += F.act.at(r, a) * F.gdy.at(r, q);
        }
        note_write(L, pi, LK::edown_w, Ly);
        break;
      }
      case Fn::expert_swiglu_bwd: {
        if (F.da.rows != F.u.rows) die(op, "needs expert_down_dgrad's output");
        F.du = Mat::uninitialized(F.u.rows, F.u.cols);
        F.dg = Mat::uninitialized(F.u.rows, F.u.cols);
        for (int64_t i = 0; i < F.u.size(); ++i) {
          F.du.v[sz(i)] = F.da.v[sz(i)] * silu(F.g.v[sz(i)]);
          F.dg.v[sz(i)] = F.da.v[sz(i)] * F.u.v[sz(i)] * silu_grad(F.g.v[sz(i)]);
        }
        break;
      }
      case Fn::expert_up_dgrad: {
        if (F.du.rows != F.gx.rows) die(op, "needs the experts' SwiGLU gradient");
        const double* wu = lane_value(L, dd, LK::eup_w, Ly, op).v.data();
        const double* wg = lane_value(L, dd, LK::egate_w, Ly, op).v.data();
        F.gdx = Mat::uninitialized(F.du.rows, h);
        for (int64_t r = 0; r < F.du.rows; ++r) {
          const int64_t off = local(rank, F.gath[sz(r)].expert) * h * fl;
          gemm_nt(F.du.row(r), wu + off, F.gdx.row(r), 1, fl, h, false);
          gemm_nt(F.dg.row(r), wg + off, F.gdx.row(r), 1, fl, h, true);
        }
        if (etp1) F.rdx = F.gdx;
        if (etp1 && ep1) F.pdx = F.rdx;
        break;
      }
      case Fn::expert_up_wgrad: {
        if (F.du.rows != F.gx.rows) die(op, "needs the experts' SwiGLU gradient");
        const int pu = lane_param(L, LK::eup_w, Ly, op), pg = lane_param(L, LK::egate_w, Ly, op);
        double *gu = lane_grad(L, pu, dd), *gg = lane_grad(L, pg, dd);
        for (int64_t r = 0; r < F.gx.rows; ++r) {
          const int64_t off = local(rank, F.gath[sz(r)].expert) * h * fl;
          for (int64_t q = 0; q < h; ++q)
            for (int64_t a = 0; a < fl; ++a) {
              gu[off + q * fl + a] += F.gx.at(r, q) * F.du.at(r, a);
              gg[off + q * fl + a] += F.gx.at(r, q) * F.dg.at(r, a);
            }
        }
        note_write(L, pu, LK::eup_w, Ly);
        note_write(L, pg, LK::egate_w, Ly);
        break;
      }
      case Fn::moe_permute_bwd: {
        const int64_t n = static_cast<int64_t>(F.perm.size());
        if (F.pdx.rows != n || n == 0) die(op, "needs the tokens' gradients back (moe_dispatch_bwd), which did not arrive");
        F.dx = Mat(F.x.rows, h);
        for (int64_t j = 0; j < n; ++j) {
          const int64_t tk = F.perm[sz(j)] / k;
          for (int64_t q = 0; q < h; ++q) F.dx.at(tk, q) += F.pdx.at(j, q);
        }
        break;
      }
      case Fn::router_topk_bwd: {
        if (F.dprob.size() != F.prob.size()) die(op, "needs the router weights' gradient (moe_unpermute_bwd)");
        const int64_t T = F.logits.rows;
        F.dz = Mat::uninitialized(T, E);
        for (int64_t tk = 0; tk < T; ++tk)
          moe_route_bwd(M, F.logits.row(tk), F.sel.data() + tk * k, F.prob.data() + tk * k, F.dprob.data() + tk * k,
                        F.dz.row(tk));
        break;
      }
      case Fn::router_dgrad: {
        if (F.dz.rows != F.x.rows || F.dx.rows != F.x.rows)
          die(op, "needs the logits' gradient (router_topk_bwd) and the tokens' gradient (moe_permute_bwd)");
        gemm_nt(F.dz.v.data(), lane_value(L, dd, LK::router_w, Ly, op).v.data(), F.dx.v.data(), F.dz.rows, E, h, true);
        break;
      }
      case Fn::router_wgrad: {
        if (F.dz.rows != F.x.rows) die(op, "needs the logits' gradient (router_topk_bwd)");
        const int pi = lane_param(L, LK::router_w, Ly, op);
        gemm_tn(F.x.v.data(), F.dz.v.data(), lane_grad(L, pi, dd), F.x.rows, h, E, true);
        note_write(L, pi, LK::router_w, Ly);
        break;
      }
      default:
        die(op, "is not a MoE op");
    }
  }
  // The ops that hand a result to the stage's chain: the routed output and input gradient,
  // as the lane's stacked matrix, meeting the shared expert's (see the top of the file).
  if (fn == Fn::moe_unpermute || fn == Fn::router_dgrad) {
    const bool fwd = fn == Fn::moe_unpermute;
    Mat m = stacked([](MoeFrame& F) -> const Mat& { return F.dx; }, h);
    for (int64_t dd = 0; dd < nd; ++dd) {
      MoeFrame& F = moe_frame(L.reps[sz(dd)], Ly, mb);
      if (fwd) F.dx = Mat();
    }
    Reg& c = chain(L, op);
    const Tag shared = fwd ? Tag::shared_out : Tag::d_shared;
    if (c.tag == shared && c.layer == Ly && c.mb == mb) {  // the shared expert ran first (overlap)
      if (c.partial) die(op, "adds the routed result to the shared expert's before its TP reduction");
      if (c.m.rows != m.rows || c.m.cols != m.cols) die(op, "the shared expert's result does not fit the routed one");
      add_into(c.m, m);
      c.tag = fwd ? Tag::mlp_out : Tag::dnorm2;
    } else if (M.fs > 0) {
      put(L, Ly, mb, fwd ? Slot::moe_out : Slot::moe_dx, std::move(m));
    } else {
      set_chain(L, op, std::move(m), fwd ? Tag::mlp_out : Tag::dnorm2, false, sp);
    }
  }
}

void Interpreter::Impl::moe_comm(int st, const Op& op) {
  const std::string_view name = op.name;
  const int Ly = op.layer, mb = op.micro_batch;
  if (!M.moe_layer(Ly)) die(op, "is a MoE collective on a layer that is not a MoE layer");
  const bool a2a = name == "moe_dispatch" || name == "moe_combine" || name == "moe_combine_bwd" || name == "moe_dispatch_bwd";
  const GroupKind want = a2a ? GroupKind::EP : GroupKind::ETP;
  if (op.group != want) die(op, fmt::format("over {} (expected {})", to_string(op.group), to_string(want)));
  const Collective wc = a2a ? Collective::AllToAll
                            : (name == "moe_etp_allgather" || name == "moe_etp_allgather_bwd") ? Collective::AllGather
                                                                                               : Collective::ReduceScatter;
  if (op.collective != wc) die(op, fmt::format("is a {} (expected {})", to_string(op.collective), to_string(wc)));
  if (wc == Collective::ReduceScatter && op.reduce != ReduceOp::sum)
    die(op, "sums the experts' row-parallel partial results: it needs ReduceOp SUM");
  const auto it = stage_groups[sz(st)].find(want);
  if (it == stage_groups[sz(st)].end()) die(op, "no such group on this stage");
  const int64_t le = M.experts / plan.exp.layout.ep;
  // Results are computed at the issue (what each rank holds then) and stored at the wait.
  struct Out {
    int64_t rank;
    Mat m;
    std::vector<MoeCopy> list;
    std::vector<int64_t> owner;
  };
  auto outs = std::make_shared<std::vector<Out>>();
  auto F = [&](int64_t r) -> MoeFrame& { return moe_frame(r, Ly, mb); };
  for (const auto& g : it->second) {
    const int64_t n = static_cast<int64_t>(g.size());
    if (name == "moe_dispatch") {
      // Rank j of the group receives its local experts' copies from every rank, expert by expert.
      for (int64_t j = 0; j < n; ++j) {
        Out o{g[sz(j)], {}, {}, {}};
        for (int64_t e = j * le; e < (j + 1) * le; ++e)
          for (int64_t s : g) {
            const MoeFrame& S = F(s);
            if (S.px.rows != static_cast<int64_t>(S.perm.size()) || S.perm.empty())
              die(op, "dispatches tokens that were not permuted (moe_permute)");
            for (size_t p = 0; p < S.perm.size(); ++p)
              if (S.sel[sz(S.perm[p])] == e) o.list.push_back(MoeCopy{s, static_cast<int64_t>(p), e});
          }
        o.m = Mat::uninitialized(static_cast<int64_t>(o.list.size()), h);
        for (size_t r = 0; r < o.list.size(); ++r) std::copy_n(F(o.list[r].src).px.row(o.list[r].index), h, o.m.row(sz(r)));
        outs->push_back(std::move(o));
      }
    } else if (name == "moe_etp_allgather" || name == "moe_etp_allgather_bwd") {
      const bool bwd = name == "moe_etp_allgather_bwd";
      Out all{-1, {}, {}, {}};
      int64_t rows = 0;
      for (int64_t r : g) rows += bwd ? F(r).rdy.rows : F(r).rx.rows;
      all.m = Mat::uninitialized(rows, h);
      int64_t at = 0;
      for (int64_t q = 0; q < n; ++q) {
        const MoeFrame& S = F(g[sz(q)]);
        const Mat& src = bwd ? S.rdy : S.rx;
        if (src.rows != static_cast<int64_t>(S.recv.size()))
          die(op, bwd ? "gathers output gradients that did not arrive (moe_combine_bwd)"
                      : "gathers tokens that did not arrive (moe_dispatch)");
        for (const MoeCopy& c : S.recv) {
          all.list.push_back(c);
          all.owner.push_back(q);
        }
        std::copy(src.v.begin(), src.v.end(), all.m.v.begin() + at);
        at += src.size();
      }
      for (int64_t r : g) {
        Out o = all;
        o.rank = r;
        outs->push_back(std::move(o));
      }
    } else if (name == "moe_etp_reducescatter" || name == "moe_etp_reducescatter_bwd") {
      const bool bwd = name == "moe_etp_reducescatter_bwd";
      for (int64_t q = 0; q < n; ++q) {
        Out o{g[sz(q)], {}, {}, {}};
        const MoeFrame& D = F(g[sz(q)]);
        o.m = Mat(static_cast<int64_t>(D.recv.size()), h);
        for (int64_t mbr : g) {  // SUM in group order
          const MoeFrame& S = F(mbr);
          const Mat& src = bwd ? S.gdx : S.y;
          if (src.rows != static_cast<int64_t>(S.gath.size()))
            die(op, bwd ? "reduces input gradients the experts did not produce (expert_up_dgrad)"
                        : "reduces outputs the experts did not produce (expert_down)");
          int64_t row = 0;
          for (size_t r = 0; r < S.gath.size(); ++r)
            if (S.gath_owner[r] == q) {
              for (int64_t c = 0; c < h; ++c) o.m.at(row, c) += src.at(sz(r), c);
              ++row;
            }
          if (row != o.m.rows) die(op, "the ETP group's gathered lists differ");
        }
        outs->push_back(std::move(o));
      }
    } else {  // moe_combine, moe_combine_bwd, moe_dispatch_bwd: copies between token and expert ranks
      const bool to_src = name != "moe_combine_bwd";
      if (to_src) {
        for (int64_t s : g) {
          Out o{s, {}, {}, {}};
          o.m = Mat(static_cast<int64_t>(F(s).perm.size()), h);
          outs->push_back(std::move(o));
        }
        for (int64_t j : g) {
          const MoeFrame& D = F(j);
          const Mat& src = name == "moe_combine" ? D.ry : D.rdx;
          if (src.rows != static_cast<int64_t>(D.recv.size()))
            die(op, name == "moe_combine" ? "returns expert outputs that were not reduced (moe_etp_reducescatter)"
                                          : "returns token gradients that were not reduced (moe_etp_reducescatter_bwd)");
          for (size_t r = 0; r < D.recv.size(); ++r) {
            const MoeCopy& c = D.recv[r];
            const auto pos = std::find(g.begin(), g.end(), c.src) - g.begin();
            std::copy_n(src.row(sz(r)), h, (*outs)[outs->size() - sz(n) + sz(pos)].m.row(c.index));
          }
        }
      } else {
        for (int64_t j : g) {
          const MoeFrame& D = F(j);
          Out o{j, Mat::uninitialized(static_cast<int64_t>(D.recv.size()), h), {}, {}};
          for (size_t r = 0; r < D.recv.size(); ++r) {
            const MoeFrame& S = F(D.recv[r].src);
            if (S.pdy.rows != static_cast<int64_t>(S.perm.size()))
              die(op, "sends output gradients that were not produced (moe_unpermute_bwd)");
            std::copy_n(S.pdy.row(D.recv[r].index), h, o.m.row(sz(r)));
          }
          outs->push_back(std::move(o));
        }
      }
    }
  }
  const std::string nm(name);
  const bool ep1 = plan.exp.layout.ep == 1, etp1 = plan.exp.layout.expert_tp() == 1;
  launch(st, op, [this, outs, nm, Ly, mb, ep1, etp1] {
    for (Out& o : *outs) {
      MoeFrame& D = moe_frame(o.rank, Ly, mb);
      if (nm == "moe_dispatch") {
        D.recv = std::move(o.list);
        D.rx = std::move(o.m);
        if (etp1) etp_identity(D);
      } else if (nm == "moe_etp_allgather") {
        D.gath = std::move(o.list);
        D.gath_owner = std::move(o.owner);
        D.gx = std::move(o.m);
      } else if (nm == "moe_etp_allgather_bwd") {
        D.gdy = std::move(o.m);
      } else if (nm == "moe_etp_reducescatter") {
        D.ry = std::move(o.m);
        if (ep1) D.py = D.ry;
      } else if (nm == "moe_etp_reducescatter_bwd") {
        D.rdx = std::move(o.m);
        if (ep1) D.pdx = D.rdx;
      } else if (nm == "moe_combine") {
        D.py = std::move(o.m);
      } else if (nm == "moe_combine_bwd") {
        D.rdy = std::move(o.m);
        if (etp1) D.gdy = D.rdy;
      } else {
        D.pdx = std::move(o.m);
      }
    }
  });
}

}  // namespace dtsim::verify
