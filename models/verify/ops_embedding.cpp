// Op semantics of the block family: The vocab-parallel word embedding (plus learned positions) and its gradient.
// Part of the StepPlan interpreter (models/verify/interpreter.cpp, interpreter_impl.hpp).
#include "models/verify/interpreter_impl.hpp"

namespace dtsim::verify {

/// The vocab-parallel word embedding (plus learned positions) and its gradient.
void Interpreter::Impl::embedding_op(Lane& L, Fn fn, const Op& op) {
  [[maybe_unused]] const int Ly = op.layer, mb = op.micro_batch;
  switch (fn) {
    case Fn::embedding: {
      const int64_t rows = B * sl, rr = rows / nd;
      Mat y(rows, h);
      for (int64_t dd = 0; dd < nd; ++dd) {
        RankState& R = rep(L, dd);
        const Mat& word = P(R, LK::word, -1, op).value;
        const Mat* pos = M.learned_pos ? &P(R, LK::pos, -1, op).value : nullptr;
        for (int64_t row = dd * rr; row < (dd + 1) * rr; ++row) {
          const int64_t tok = batch->tokens[data_index(L, mb, row, rows)] - L.tp * Vt;
          double* yr = y.row(row);
          if (tok >= 0 && tok < Vt)
            for (int64_t j = 0; j < h; ++j) yr[j] = word.at(tok, j);
          if (pos && L.tp == 0) {  // replicated positions: added once before the TP SUM
            const double* pr = pos->row(pos_of(L, row, rows, false));
            for (int64_t j = 0; j < h; ++j) yr[j] += pr[j];
          }
        }
      }
      set_chain(L, op, std::move(y), Tag::embed_out, true, false);
      break;
    }
    case Fn::embedding_bwd: {
      const Reg& c = expect(L, op, {Tag::stream}, "the embedding output gradient", true);
      const int64_t rows = c.m.rows, rr = rows / nd;
      const int pw = lane_param(L, LK::word, -1, op), pps = M.learned_pos ? lane_param(L, LK::pos, -1, op) : -1;
      for (int64_t dd = 0; dd < nd; ++dd) {
        double* gw = lane_grad(L, pw, dd);
        for (int64_t row = dd * rr; row < (dd + 1) * rr; ++row) {
          const int64_t tok = batch->tokens[data_index(L, mb, row, rows)] - L.tp * Vt;
          if (tok >= 0 && tok < Vt) {
            const double* cr = c.m.row(row);
            for (int64_t j = 0; j < h; ++j) gw[tok * h + j] += cr[j];
          }
        }
        if (pps >= 0) {
          double* gp = lane_grad(L, pps, dd);
          for (int64_t row = dd * rr; row < (dd + 1) * rr; ++row) {
            const int64_t ps = pos_of(L, row, rows, false);
            const double* cr = c.m.row(row);
            for (int64_t j = 0; j < h; ++j) gp[ps * h + j] += cr[j];
          }
        }
      }
      note_write(L, pw, LK::word, -1);
      if (pps >= 0) note_write(L, pps, LK::pos, -1);
      break;
    }
    default:
      break;
  }
}

}  // namespace dtsim::verify
