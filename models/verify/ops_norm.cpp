// Op semantics of the block family: LayerNorm / RMSNorm (input, post-attention, final) and the residual adds (bias-dropout-add).
// Part of the StepPlan interpreter (models/verify/interpreter.cpp, interpreter_impl.hpp).
#include "models/verify/interpreter_impl.hpp"

namespace dtsim::verify {

void Interpreter::Impl::norm_fwd(Lane& L, const Op& op, LK w, LK bb, Slot out, Tag tag) {
  const int layer = op.layer, mb = op.micro_batch;
  Mat x;
  if (op.phase == Phase::recompute && out == Slot::n1) {
    x = need(L, layer, mb, Slot::x_in, op, "the layer input (checkpoint)");
  } else {
    Reg& c = expect(L, op, {Tag::stream, Tag::embed_out}, "the residual stream", false);
    if (c.seq_shard != sp) die(op, sp ? "needs the sequence shard of the residual stream (sequence parallel)"
                                      : "needs the full residual stream");
    x = std::move(c.m);  // the chain moves on to the norm's output
    if (out == Slot::n1 && op.phase == Phase::forward) put(L, layer, mb, Slot::x_in, x);
  }
  const bool one = uniform(L, w, layer) && (!M.layernorm || uniform(L, bb, layer));
  const int64_t rr = one ? x.rows : x.rows / nd;
  NormCache cache;
  Mat y;
  const uint64_t stamp = (static_cast<uint64_t>(step) << 32) | static_cast<uint64_t>(t_exec.idx);
  if (!reuse_norm(L, op, x, w, bb, out, one, cache, y)) {
    cache.xhat = Mat::uninitialized(x.rows, x.cols);
    cache.rstd.assign(sz(x.rows), 0.0);
    y = Mat::uninitialized(x.rows, x.cols);
    for (int64_t dd = 0; dd < x.rows / rr; ++dd) {
      norm_forward_rows(x.row(dd * rr), rr, x.cols, wptr(L, dd, w, layer, op),
                        M.layernorm ? wptr(L, dd, bb, layer, op) : nullptr, M.layernorm, y.row(dd * rr),
                        cache.xhat.row(dd * rr), cache.rstd.data() + dd * rr);
    }
  }
  L.norm_stamp = stamp;
  put(L, layer, mb, Slot::res, std::move(x));
  put_norm(L, layer, mb, out, std::move(cache));
  put(L, layer, mb, out, y);
  set_chain(L, op, std::move(y), tag, false, sp);
}

bool Interpreter::Impl::reuse_norm(Lane& L, const Op& op, const Mat& x, LK w, LK bb, Slot out, bool one, NormCache& cache, Mat& y) {
  if (sp || L.tp_first < 0 || L.tp_first == L.index) return false;
  Lane& D = lanes[sz(L.tp_first)];
  if (D.norm_stamp != ((static_cast<uint64_t>(step) << 32) | static_cast<uint64_t>(t_exec.idx))) return false;
  const int layer = op.layer, mb = op.micro_batch;
  const Mat* dx = find(D, layer, mb, Slot::res);
  const NormCache* dc = find_norm(D, layer, mb, out);
  const Mat* dy = find(D, layer, mb, out);
  if (dx == nullptr || dc == nullptr || dy == nullptr || dx->rows != x.rows || dx->cols != x.cols ||
      std::memcmp(dx->v.data(), x.v.data(), sz(x.size()) * sizeof(double)) != 0)
    return false;
  const bool one_d = uniform(D, w, layer) && (!M.layernorm || uniform(D, bb, layer));
  auto same = [&](LK k, int64_t dd) {
    const Mat& a = lane_value(L, one ? 0 : dd, k, layer, op);
    const Mat& b = lane_value(D, one_d ? 0 : dd, k, layer, op);
    return a.v.size() == b.v.size() && std::memcmp(a.v.data(), b.v.data(), a.v.size() * sizeof(double)) == 0;
  };
  for (int64_t dd = 0; dd < (one && one_d ? 1 : nd); ++dd)
    if (!same(w, dd) || (M.layernorm && !same(bb, dd))) return false;
  cache.xhat = dc->xhat;
  cache.rstd = dc->rstd;
  y = *dy;
  return true;
}

Mat Interpreter::Impl::norm_bwd(Lane& L, const Op& op, LK w, LK bb, Slot cache_slot, Tag dtag) {
  const int layer = op.layer, mb = op.micro_batch;
  const Reg& c = expect(L, op, {dtag}, "the norm output gradient", false);
  const NormCache* cache = find_norm(L, layer, mb, cache_slot);
  if (!cache) die(op, "needs the norm's forward statistics, which were not kept or recomputed");
  if (cache->xhat.rows != c.m.rows || cache->xhat.cols != c.m.cols)
    die(op, "the norm's output gradient does not fit its forward statistics");
  const int64_t rr = c.m.rows / nd;
  const int pw = lane_param(L, w, layer, op), pb = M.layernorm ? lane_param(L, bb, layer, op) : -1;
  const bool one = uniform(L, w, layer);
  Mat dx = Mat::uninitialized(c.m.rows, c.m.cols);
  for (int64_t dd = 0; dd < nd; ++dd) {
    const double* wv = L.val[sz(pw) * sz(nd) + sz(one ? 0 : dd)]->v.data();
    norm_backward_rows(c.m.row(dd * rr), rr, c.m.cols, wv, M.layernorm, cache->xhat.row(dd * rr),
                       cache->rstd.data() + dd * rr, lane_grad(L, pw, dd), pb >= 0 ? lane_grad(L, pb, dd) : nullptr,
                       dx.row(dd * rr));
  }
  note_write(L, pw, w, layer);
  if (pb >= 0) note_write(L, pb, bb, layer);
  return dx;
}

void Interpreter::Impl::layer_forward_done(Lane& L, int layer, int mb) {
  const Recompute rc = plan.exp.layout.recompute;
  drop(L, layer, mb, Slot::tmp_in);
  if (rc == Recompute::full) {
    drop_layer(L, layer, mb, /*keep_input=*/true);
  } else if (rc == Recompute::selective) {
    for (Slot s : {Slot::ctx, Slot::lse, Slot::probs}) drop(L, layer, mb, s);
  }
}

/// LayerNorm / RMSNorm (input, post-attention, final) and the residual adds (bias-dropout-add).
void Interpreter::Impl::norm_op(Lane& L, Fn fn, const Op& op) {
  [[maybe_unused]] const int Ly = op.layer, mb = op.micro_batch;
  switch (fn) {
    case Fn::input_norm: norm_fwd(L, op, LK::ln1_w, LK::ln1_b, Slot::n1, Tag::norm1); break;
    case Fn::post_attention_norm: norm_fwd(L, op, LK::ln2_w, LK::ln2_b, Slot::n2, Tag::norm2); break;
    case Fn::final_norm: norm_fwd(L, op, LK::final_w, LK::final_b, Slot::nf, Tag::normf); break;
    case Fn::dropout_residual: {
      Reg& c = expect(L, op, {Tag::attn_out, Tag::mlp_out, Tag::shared_out}, "a row-parallel output", false);
      if (c.tag == Tag::shared_out) {  // a MoE layer: its routed output waits (models/verify/ops_moe.cpp)
        Mat* routed = find(L, Ly, mb, Slot::moe_out);
        if (routed == nullptr || routed->rows != c.m.rows || routed->cols != c.m.cols)
          die(op, "adds a MoE layer's output without its routed experts' part (moe_unpermute)");
        add_into(c.m, *routed);
        drop(L, Ly, mb, Slot::moe_out);
        c.tag = Tag::mlp_out;
      }
      if (c.seq_shard != sp) die(op, sp ? "adds a full-sequence output to a sequence-shard residual (no ReduceScatter)"
                                        : "adds a sequence-sharded output to the full residual");
      const bool attn = c.tag == Tag::attn_out;
      Mat x = std::move(need(L, Ly, mb, Slot::res, op, "the residual"));  // consumed here
      drop(L, Ly, mb, Slot::res);
      if (M.bias)
        add_residual_bias(L, x, c.m, attn ? LK::out_b : LK::down_b, Ly, op);
      else
        add_into(x, c.m);
      frame(L, Ly, mb, true)->tape.push_back(c.tag);
      set_chain(L, op, std::move(x), Tag::stream, false, sp);
      if (!attn && op.phase == Phase::forward) layer_forward_done(L, Ly, mb);
      break;
    }
    case Fn::final_norm_bwd: {
      Mat dx = norm_bwd(L, op, LK::final_w, LK::final_b, Slot::nf, Tag::dnormf);
      end_backward(L, -1, mb);
      set_chain(L, op, std::move(dx), Tag::stream, false, sp);
      break;
    }
    case Fn::dropout_residual_bwd: {
      const Reg& c = expect(L, op, {Tag::stream}, "the residual-stream gradient", false);
      Frame* f = frame(L, Ly, mb, false);
      if (f == nullptr || f->tape.empty())
        die(op, "a residual backward with no matching forward branch (forward or recompute missing)");
      const Tag branch = f->tape.back();
      f->tape.pop_back();
      put(L, Ly, mb, Slot::dx_stream, c.m);
      if (M.bias) bias_grad(L, branch == Tag::attn_out ? LK::out_b : LK::down_b, Ly, c.m, op);
      Mat dm = std::move(c.m);  // the chain moves on to the branch's gradient
      set_chain(L, op, std::move(dm), branch == Tag::attn_out ? Tag::d_attn_out : Tag::d_mlp_out, false, sp);
      break;
    }
    case Fn::post_attention_norm_bwd:
    case Fn::input_norm_bwd: {
      const bool ln2 = fn == Fn::post_attention_norm_bwd;
      if (ln2 && chain(L, op).tag == Tag::d_shared) {  // a MoE layer: add the routed input gradient
        Reg& c = chain(L, op);
        Mat* routed = find(L, Ly, mb, Slot::moe_dx);
        if (c.partial) die(op, "consumes the shared expert's input gradient before its TP reduction");
        if (routed == nullptr || routed->rows != c.m.rows || routed->cols != c.m.cols)
          die(op, "back-propagates a MoE layer without its routed experts' and router's input gradient (router_dgrad)");
        add_into(c.m, *routed);
        drop(L, Ly, mb, Slot::moe_dx);
        c.tag = Tag::dnorm2;
      }
      Mat dx = norm_bwd(L, op, ln2 ? LK::ln2_w : LK::ln1_w, ln2 ? LK::ln2_b : LK::ln1_b, ln2 ? Slot::n2 : Slot::n1,
                        ln2 ? Tag::dnorm2 : Tag::dnorm1);
      add_into(dx, need(L, Ly, mb, Slot::dx_stream, op, "the residual-stream gradient"));
      if (ln2) {
        put(L, Ly, mb, Slot::dx_stream, dx);
      } else {
        end_backward(L, Ly, mb);
      }
      set_chain(L, op, std::move(dx), Tag::stream, false, sp);
      break;
    }
    default:
      break;
  }
}

}  // namespace dtsim::verify
