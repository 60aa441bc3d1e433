// Op semantics of the block family: LM head (vocab-parallel) and the cross-entropy loss.
// Part of the StepPlan interpreter (models/verify/interpreter.cpp, interpreter_impl.hpp).
#include "models/verify/interpreter_impl.hpp"

namespace dtsim::verify {

void Interpreter::Impl::ce_collective(int st, const Op& op) {
  for (const auto& g : lane_groups_of(st, op, GroupKind::TP, "a loss AllReduce")) {
    std::vector<Mat*> stats;
    std::vector<const double*> in;
    for (int li : g) {
      Lane& L = lanes[sz(li)];
      Mat& a = need(L, -1, op.micro_batch, Slot::ce_a, op, "the cross-entropy statistic (cross_entropy)");
      if (L.ce_stage[sz(op.micro_batch)] >= 3)
        die(op, "a fourth loss AllReduce: the vocab-parallel cross entropy needs three");
      check_size(op, static_cast<double>(a.size() / nd) * kLossStatBytes, "the per-token fp32 statistic");
      if (!stats.empty() && a.size() != stats.front()->size()) die(op, "the TP ranks' statistics differ in size");
      stats.push_back(&a);
      in.push_back(a.v.data());
    }
    if (lanes[sz(g.front())].ce_stage[sz(op.micro_batch)] == 0 && op.reduce != ReduceOp::max)
      note(fmt::format("the first loss AllReduce reduces the logits maximum with {} (Megatron uses MAX): any shift "
                       "common to all TP ranks leaves the loss and gradients unchanged",
                       to_string(op.reduce)));
    Doubles acc(stats.front()->v.size());
    reduce_buffers(in.data(), in.size(), acc.size(), red(op), acc.data());
    for (size_t i = 0; i < g.size(); ++i) {
      std::copy(acc.begin(), acc.end(), stats[i]->v.begin());
      ce_after_reduce(lanes[sz(g[i])], op.micro_batch, op);
    }
  }
}

void Interpreter::Impl::ce_after_reduce(Lane& L, int mb, const Op& op) {
  int& k = L.ce_stage[sz(mb)];
  Mat& a = need(L, -1, mb, Slot::ce_a, op, "the cross-entropy statistic");
  const Mat& logits = need(L, -1, mb, Slot::logits, op, "the logits (lm_head)");
  const int64_t rows = logits.rows;
  if (k == 0) {  // shift reduced: local target logit next
    put(L, -1, mb, Slot::ce_shift, a);
    Mat s(rows, 1);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t y = batch->labels[data_index(L, mb, i, rows)] - L.tp * Vt;
      if (y >= 0 && y < Vt) s.v[sz(i)] = logits.at(i, y);
    }
    a = std::move(s);
  } else if (k == 1) {  // target logit reduced: local sum of exponentials next
    put(L, -1, mb, Slot::ce_tgt, a);
    const Mat& shift = *find(L, -1, mb, Slot::ce_shift);
    Mat s(rows, 1);
    for (int64_t i = 0; i < rows; ++i) {
      const double* li = logits.row(i);
      for (int64_t j = 0; j < logits.cols; ++j) s.v[sz(i)] += std::exp(li[j] - shift.v[sz(i)]);
    }
    a = std::move(s);
  } else if (k == 2) {  // sum of exponentials reduced: the loss
    put(L, -1, mb, Slot::ce_z, a);
    const Mat& shift = *find(L, -1, mb, Slot::ce_shift);
    const Mat& tgt = *find(L, -1, mb, Slot::ce_tgt);
    const int64_t rr = rows / nd;
    for (int64_t dd = 0; dd < nd; ++dd) {
      RankState& R = rep(L, dd);
      const double scale = loss_scale(R, mb);
      for (int64_t i = dd * rr; i < (dd + 1) * rr; ++i)
        if (batch->valid[data_index(L, mb, i, rows)])
          R.loss_scaled += scale * (std::log(a.v[sz(i)]) + shift.v[sz(i)] - tgt.v[sz(i)]);
    }
  }
  ++k;
}

/// LM head (vocab-parallel) and the cross-entropy loss.
void Interpreter::Impl::head_op(Lane& L, Fn fn, const Op& op) {
  [[maybe_unused]] const int Ly = op.layer, mb = op.micro_batch;
  switch (fn) {
    case Fn::lm_head: {
      const Reg& c = expect(L, op, {Tag::normf}, "the final_norm output", true);
      put(L, -1, mb, Slot::logits, linear_nt(L, c.m, head_kind(L.stage), -1, op));
      set_chain(L, op, Mat(1, 1), Tag::logits, false, false);
      break;
    }
    case Fn::cross_entropy: {
      expect(L, op, {Tag::logits}, "the logits", true);
      const Mat& lg = need(L, -1, mb, Slot::logits, op, "the logits");
      Mat mx(lg.rows, 1, -INFINITY);
      for (int64_t i = 0; i < lg.rows; ++i) {
        const double* li = lg.row(i);
        for (int64_t j = 0; j < lg.cols; ++j) mx.v[sz(i)] = std::max(mx.v[sz(i)], li[j]);
      }
      put(L, -1, mb, Slot::ce_a, std::move(mx));
      L.ce_stage[sz(mb)] = 0;
      if (t == 1)
        for (int k = 0; k < 3; ++k) ce_after_reduce(L, mb, op);  // a TP group of one: local = global
      set_chain(L, op, Mat(1, 1), Tag::ce, false, false);
      break;
    }
    case Fn::cross_entropy_bwd: {
      if (L.ce_stage[sz(mb)] != 3)
        die(op, fmt::format("needs the loss after 3 TP AllReduces (vocab-parallel cross entropy), found {}",
                            L.ce_stage[sz(mb)]));
      const Mat& lg = need(L, -1, mb, Slot::logits, op, "the logits");
      const Mat& shift = *find(L, -1, mb, Slot::ce_shift);
      const Mat& z = *find(L, -1, mb, Slot::ce_z);
      const int64_t rr = lg.rows / nd;
      Mat dl(lg.rows, lg.cols);
      for (int64_t dd = 0; dd < nd; ++dd) {
        const double scale = loss_scale(rep(L, dd), mb);
        for (int64_t i = dd * rr; i < (dd + 1) * rr; ++i) {
          const size_t di = data_index(L, mb, i, lg.rows);
          if (!batch->valid[di]) continue;
          const double* li = lg.row(i);
          double* dli = dl.row(i);
          for (int64_t j = 0; j < lg.cols; ++j) dli[j] = scale * std::exp(li[j] - shift.v[sz(i)]) / z.v[sz(i)];
          const int64_t y = batch->labels[di] - L.tp * Vt;
          if (y >= 0 && y < Vt) dli[y] -= scale;
        }
      }
      put(L, -1, mb, Slot::dlogits, dl);
      set_chain(L, op, std::move(dl), Tag::dlogits, false, false);
      break;
    }
    case Fn::lm_head_dgrad: {
      const Reg& c = expect(L, op, {Tag::dlogits}, "the logits gradient", true);
      set_chain(L, op, linear(L, c.m, head_kind(L.stage), -1, op), Tag::dnormf, true, false);
      break;
    }
    case Fn::lm_head_wgrad:
      wgrad(L, head_kind(L.stage), -1, need(L, -1, mb, Slot::dlogits, op, "the logits gradient"),
            col_input(L, op, Slot::nf, Slot::ref, -1), op);
      break;
    default:
      break;
  }
}

}  // namespace dtsim::verify
