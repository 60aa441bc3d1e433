// Kernels the blocks share: the chain of ops, linear layers per replica, weight and bias gradients.
// Part of the StepPlan interpreter (models/verify/interpreter.cpp, interpreter_impl.hpp).
#include "models/verify/interpreter_impl.hpp"

namespace dtsim::verify {

Reg& Interpreter::Impl::expect(Lane& L, const Op& op, std::initializer_list<Tag> tags, const char* what, bool full_tokens) {
  Reg& c = chain(L, op);
  bool ok = false;
  for (Tag tg : tags) ok = ok || c.tag == tg;
  if (!ok || c.m.empty()) die(op, fmt::format("consumes {}, which the chain does not hold here", what));
  if (c.partial) die(op, fmt::format("consumes {} while it is still a TP partial sum (no TP reduction)", what));
  if (c.chunk) die(op, fmt::format("consumes {} while it is a P2P chunk (no pp_tp_allgather)", what));
  if (full_tokens && c.seq_shard)
    die(op, fmt::format("consumes {} while it is sequence-sharded (no TP AllGather)", what));
  return c;
}

void Interpreter::Impl::set_chain(Lane& L, const Op& op, Mat m, Tag tag, bool partial, bool seq_shard) {
  Reg& c = chain(L, op);
  c = Reg{};
  c.m = std::move(m);
  c.tag = tag;
  c.layer = op.layer;
  c.mb = op.micro_batch;
  c.partial = partial && t > 1;
  c.seq_shard = seq_shard;
}

bool Interpreter::Impl::uniform(Lane& L, LK k, int layer) {
  if (nd == 1) return true;
  const int pi = lane_pindex(L, k, layer);
  if (pi < 0) return false;  // P() reports it
  const uint64_t now = epoch[sz(L.stage)];
  if (L.seen[sz(pi)] == now) return L.same[sz(pi)] != 0;
  L.seen[sz(pi)] = now;
  const Doubles& v0 = L.val[sz(pi) * sz(nd)]->v;
  uint8_t same = 1;
  for (int64_t dd = 1; dd < nd && same == 1; ++dd) {
    const Doubles& vd = L.val[sz(pi) * sz(nd) + sz(dd)]->v;
    if (vd.size() != v0.size() || std::memcmp(vd.data(), v0.data(), v0.size() * sizeof(double)) != 0) same = 0;
  }
  L.same[sz(pi)] = same;
  return same != 0;
}

Mat Interpreter::Impl::product(Lane& L, const Mat& x, LK k, int layer, const Op& op, bool nt, const LK* bias) {
  const bool one = uniform(L, k, layer);
  const int64_t blocks = one ? 1 : nd, rr = x.rows / blocks;
  Mat y;
  for (int64_t dd = 0; dd < blocks; ++dd) {
    const Mat& w = lane_value(L, dd, k, layer, op);
    const int64_t inner = nt ? w.cols : w.rows, out = nt ? w.rows : w.cols;
    if (inner != x.cols) die(op, fmt::format("{} does not fit its input ({} x {})", lk_name(k), x.rows, x.cols));
    if (dd == 0) y = Mat::uninitialized(x.rows, out);
    if (nt) {
      gemm_nt(x.row(dd * rr), w.v.data(), y.row(dd * rr), rr, x.cols, out, false);
    } else if (one && bias != nullptr && uniform(L, *bias, layer)) {
      gemm_bias(x.v.data(), w.v.data(), wptr(L, 0, *bias, layer, op), y.v.data(), x.rows, x.cols, out);
      return y;
    } else {
      gemm(x.row(dd * rr), w.v.data(), y.row(dd * rr), rr, x.cols, out, false);
    }
  }
  if (bias != nullptr) add_bias(L, y, *bias, layer, op);
  return y;
}

void Interpreter::Impl::wgrad(Lane& L, LK k, int layer, const Mat& a, const Mat& g, const Op& op) {
  const int pi = lane_param(L, k, layer, op);
  const Mat& g0 = *L.val[sz(pi) * sz(nd)];  // the gradient's shape
  if (g0.rows != a.cols || g0.cols != g.cols || a.rows != g.rows)
    die(op, fmt::format("the gradient of {} does not fit ({} x {})", lk_name(k), a.cols, g.cols));
  const int64_t rr = a.rows / nd;
  gemm_tn_batched(a.v.data(), g.v.data(), lane_grad(L, pi, 0), rr, a.cols, g.cols, nd, rr * a.cols, rr * g.cols,
                  L.psize[sz(pi)]);
  note_write(L, pi, k, layer);
}

void Interpreter::Impl::add_residual_bias(Lane& L, Mat& y, const Mat& r, LK k, int layer, const Op& op) {
  if (y.rows != r.rows || y.cols != r.cols) add_into(y, r);  // throws its shape error
  const int64_t rr = uniform(L, k, layer) ? y.rows : y.rows / nd;
  for (int64_t dd = 0; dd < y.rows / rr; ++dd) {
    const double* bias = wptr(L, dd, k, layer, op);
    for (int64_t i = dd * rr; i < (dd + 1) * rr; ++i) {
      double* yi = y.row(i);
      const double* ri = r.row(i);
      for (int64_t j = 0; j < y.cols; ++j) yi[j] = (yi[j] + ri[j]) + bias[j];
    }
  }
}

void Interpreter::Impl::add_bias(Lane& L, Mat& y, LK k, int layer, const Op& op) {
  const int64_t rr = uniform(L, k, layer) ? y.rows : y.rows / nd;
  for (int64_t dd = 0; dd < y.rows / rr; ++dd) {
    const double* bias = wptr(L, dd, k, layer, op);
    for (int64_t i = dd * rr; i < (dd + 1) * rr; ++i) {
      double* yi = y.row(i);
      for (int64_t j = 0; j < y.cols; ++j) yi[j] += bias[j];
    }
  }
}

void Interpreter::Impl::bias_grad(Lane& L, LK k, int layer, const Mat& g, const Op& op) {
  const int pi = lane_param(L, k, layer, op);
  if (rep(L, 0).params[sz(pi)].grad.size() != g.cols)
    die(op, fmt::format("the gradient of {} does not fit", lk_name(k)));
  const int64_t rr = g.rows / nd;
  for (int64_t dd = 0; dd < nd; ++dd) {
    double* s = lane_grad(L, pi, dd);
    for (int64_t i = dd * rr; i < (dd + 1) * rr; ++i) {
      const double* gi = g.row(i);
      for (int64_t j = 0; j < g.cols; ++j) s[j] += gi[j];
    }
  }
  note_write(L, pi, k, layer);
}

}  // namespace dtsim::verify
