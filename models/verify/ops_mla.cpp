// Op semantics of the block family: multi-head latent attention (MLA), the plan's ops of
// models/blocks/mla.hpp, as Megatron-Core runs them (megatron/core/transformer/
// multi_latent_attention.py MLASelfAttention; the TP rules of megatron/core/tensor_parallel/
// layers.py and megatron/core/distributed/finalize_model_grads.py).
// Part of the StepPlan interpreter (models/verify/interpreter.cpp, interpreter_impl.hpp).
//
// Shapes, per lane (the |DP| replicas' rows stacked, interpreter.cpp), with h = hidden,
// al = heads / tp (this TP rank's heads), hd = d_n + d_r = d_v (tiny_model.hpp: the tiny
// model keeps the query / key head and the value head equal, so the attention core of
// ops_attention.cpp runs unchanged), T = B sl tokens of the lane, Td = the down projections'
// tokens: T / tp with sequence parallelism (the sequence shard), T without:
//
//   q_down   Td x h  @ h x d_q            -> q latent            (replicated weight, Td tokens)
//   q_norm   RMSNorm over d_q             -> q_in = q latent'    (replicated weight)
//            (q_lora_rank 0: no q_down / q_norm, q_in = the input_norm output, d_q -> h)
//   kv_down  Td x h  @ h x (d_c + d_r)    -> [kv latent | k^R]   (replicated weight)
//   kv_norm  RMSNorm over d_c             -> kv latent'          (replicated weight); the chain
//            then holds the latents [q_in | kv latent' | k^R], Td x (q_in + d_c + d_r)
//   tp_allgather_latent (SP only)         -> T x (q_in + d_c + d_r): the chain's AllGather
//   q_up     T x q_in @ q_in x al hd      -> Q, head j: [q_nope (d_n) | q_rope (d_r)] (column-parallel)
//   kv_up    T x d_c  @ d_c x al (d_n+d_v) -> head j: [k_nope | v]                   (column-parallel)
//            K head j = [k_nope_j | k^R] (the rotary key is shared by every head), V head j = v_j
//   rope     on the last d_r columns of every Q and K head (tiny_model.hpp mla_rope)
//   attention, out_proj and its TP reduction: ops_attention.cpp (out_proj al d_v x h, row-parallel)
//
// Backward: attention gives dQ, dK, dV of this rank's heads; rope_bwd rotates their rotary
// parts back; q_up_dgrad dq_in = dQ W_uq^T, kv_up_dgrad dkv latent' = [dk_nope | dv] W_ukv^T
// and dk^R = the sum over this rank's heads of dK's rotary parts. These three are TP PARTIAL
// sums (each rank back-propagates its own heads), so the chain holds them as one partial
// tensor T x (q_in + d_c + d_r) and the plan's column-parallel reduction (tp_reducescatter
// with SP, back to the sequence shards; tp_allreduce without) SUMS them over TP: the backward
// of the latents' AllGather / of the duplicated use. Then kv_norm_bwd, kv_down_dgrad,
// q_norm_bwd and q_down_dgrad run on complete gradients of the Td tokens, giving the
// input_norm output's gradient (complete, no TP collective after them). The up projections'
// weight gradients use the gathered latents (with SP re-gathered by tp_allgather_input, as a
// column-parallel layer's input); the down projections' use the input_norm output of the Td
// tokens.
//
// Replicated parameters (q_down, q_norm, kv_down, kv_norm; interpreter_impl.hpp
// mla_replicated): with sequence parallelism each TP rank computes their gradients on its
// own sequence shard, so they are TP partial sums and the plan's tp_sp_grad_allreduce SUMS
// them over TP after the DP sync, with the norms' (Megatron-Core
// finalize_model_grads.py _allreduce_non_tensor_model_parallel_grads: the weights of
// linear_q_down_proj / linear_kv_down_proj and the latent layer norms carry the
// sequence_parallel attribute), then they are AVERAGED over DP x CP like every dense
// gradient (the DP collectives). Without sequence parallelism every TP rank runs the down
// projections on all tokens with the all-reduced latent gradients: their gradients are
// complete on every rank and nothing sums them (Megatron-Core neither). The injection
// mla-down-grad-unreduced leaves them out of tp_sp_grad_allreduce (so it needs SP).
#include "models/verify/interpreter_impl.hpp"
#include "models/verify/tiny_model.hpp"

namespace dtsim::verify {

Mat Interpreter::Impl::mla_norm_fwd(Lane& L, const Op& op, const Mat& x, LK w, Slot out) {
  const int layer = op.layer, mb = op.micro_batch;
  const bool one = uniform(L, w, layer);
  const int64_t rr = one ? x.rows : x.rows / nd;
  NormCache cache;
  cache.xhat = Mat::uninitialized(x.rows, x.cols);
  cache.rstd.assign(sz(x.rows), 0.0);
  Mat y = Mat::uninitialized(x.rows, x.cols);
  for (int64_t dd = 0; dd < x.rows / rr; ++dd)
    norm_forward_rows(x.row(dd * rr), rr, x.cols, wptr(L, dd, w, layer, op), nullptr, /*layernorm=*/false,
                      y.row(dd * rr), cache.xhat.row(dd * rr), cache.rstd.data() + dd * rr);
  put_norm(L, layer, mb, out, std::move(cache));
  return y;
}

Mat Interpreter::Impl::mla_norm_bwd(Lane& L, const Op& op, const Mat& dy, LK w, Slot cache_slot) {
  const int layer = op.layer, mb = op.micro_batch;
  const NormCache* cache = find_norm(L, layer, mb, cache_slot);
  if (!cache) die(op, "needs the latent norm's forward statistics, which were not kept or recomputed");
  if (cache->xhat.rows != dy.rows || cache->xhat.cols != dy.cols)
    die(op, "the latent norm's output gradient does not fit its forward statistics");
  const int64_t rr = dy.rows / nd;
  const int pw = lane_param(L, w, layer, op);
  const bool one = uniform(L, w, layer);
  Mat dx = Mat::uninitialized(dy.rows, dy.cols);
  for (int64_t dd = 0; dd < nd; ++dd) {
    const double* wv = L.val[sz(pw) * sz(nd) + sz(one ? 0 : dd)]->v.data();
    norm_backward_rows(dy.row(dd * rr), rr, dy.cols, wv, /*layernorm=*/false, cache->xhat.row(dd * rr),
                       cache->rstd.data() + dd * rr, lane_grad(L, pw, dd), nullptr, dx.row(dd * rr));
  }
  note_write(L, pw, w, layer);
  return dx;
}

/// MLA's ops (the header above), RoPE and its backward on the rotary parts.
void Interpreter::Impl::mla_op(Lane& L, Fn fn, const Op& op) {
  const int Ly = op.layer, mb = op.micro_batch;
  const int64_t qi = M.q_in, dc = M.dc, dr = M.dr;  // latent columns: [0, qi) q_in, then dc, then dr
  // The input_norm output the down projections read: the sequence shard with SP.
  auto down_input = [&]() -> const Reg& {
    const Reg& c = expect(L, op, {Tag::norm1}, "the input_norm output", false);
    if (c.seq_shard != sp)
      die(op, sp ? "needs the sequence shard of the input_norm output (sequence parallel)"
                 : "needs the full input_norm output");
    return c;
  };
  // The gathered latents of the up projections' weight gradients: re-gathered with SP.
  auto up_input = [&]() -> const Mat& {
    if (sp) return need(L, Ly, mb, Slot::mla_re_lat, op, "the re-gathered latents (tp_allgather_input)");
    return need(L, Ly, mb, Slot::mla_lat_all, op, "the latents");
  };
  // The input_norm output's gradient is complete once the down projections' dgrads ran.
  auto compare_dnorm1 = [&](const Mat& dx) {
    if (t > 1)
      compare_tokens(kTP, dx, Probe::d_ln1_out, Ly, L, mb, sp, 0, "after the MLA down projections' dgrad", true);
  };
  switch (fn) {
    // ---- forward ----
    case Fn::q_down: put(L, Ly, mb, Slot::mla_ql, linear(L, down_input().m, LK::q_down_w, Ly, op)); break;
    case Fn::q_norm: {
      const Mat& ql = need(L, Ly, mb, Slot::mla_ql, op, "the q latent (q_down)");
      put(L, Ly, mb, Slot::mla_qn, mla_norm_fwd(L, op, ql, LK::q_norm_w, Slot::mla_qn));
      drop(L, Ly, mb, Slot::mla_ql);
      break;
    }
    case Fn::kv_down: put(L, Ly, mb, Slot::mla_kvd, linear(L, down_input().m, LK::kv_down_w, Ly, op)); break;
    case Fn::kv_norm: {
      const Mat& kvd = need(L, Ly, mb, Slot::mla_kvd, op, "the kv latent (kv_down)");
      const Mat kvn = mla_norm_fwd(L, op, col_range(kvd, 0, dc), LK::kv_norm_w, Slot::mla_kvn);
      const Mat& q_in = M.dq > 0 ? need(L, Ly, mb, Slot::mla_qn, op, "the q latent (q_norm)") : down_input().m;
      Mat lat = Mat::uninitialized(kvd.rows, qi + dc + dr);
      set_col_range(lat, 0, q_in);
      set_col_range(lat, qi, kvn);
      set_col_range(lat, qi + dc, col_range(kvd, dc, dc + dr));
      put(L, Ly, mb, Slot::mla_lat, lat);
      drop(L, Ly, mb, Slot::mla_kvd);
      drop(L, Ly, mb, Slot::mla_qn);
      set_chain(L, op, std::move(lat), Tag::latent, false, sp);
      break;
    }
    case Fn::q_up: {
      const Reg& c = expect(L, op, {Tag::latent}, "the latents", true);
      put(L, Ly, mb, Slot::mla_lat_all, c.m);
      put(L, Ly, mb, Slot::q, linear(L, col_range(c.m, 0, qi), LK::q_up_w, Ly, op));
      break;
    }
    case Fn::kv_up: {
      expect(L, op, {Tag::latent}, "the latents", true);
      const Mat& all = need(L, Ly, mb, Slot::mla_lat_all, op, "the latents (q_up)");
      const Mat kv = linear(L, col_range(all, qi, qi + dc), LK::kv_up_w, Ly, op);
      Mat k, v;
      mla_split_kv(kv, col_range(all, qi + dc, qi + dc + dr), al, M.dn, dr, M.dv, k, v);
      put(L, Ly, mb, Slot::k, std::move(k));
      put(L, Ly, mb, Slot::v, std::move(v));
      if (sp) drop(L, Ly, mb, Slot::mla_lat_all);  // SP keeps the shard (mla_lat); backward re-gathers
      set_chain(L, op, Mat(1, 1), Tag::qkv, false, false);  // marker: Q, K, V live in slots
      break;
    }
    case Fn::rope: {
      const auto pos = positions(L, B * sl, false);
      mla_rope(need(L, Ly, mb, Slot::q, op, "Q"), al, d, dr, pos, false);
      mla_rope(need(L, Ly, mb, Slot::k, op, "K"), al, d, dr, pos, false);
      break;
    }
    // ---- backward ----
    case Fn::rope_bwd: {
      const auto pos = positions(L, B * sl, false);
      mla_rope(need(L, Ly, mb, Slot::dq, op, "dQ"), al, d, dr, pos, true);
      mla_rope(need(L, Ly, mb, Slot::dk, op, "dK (after cp_dkv_reducescatter)"), al, d, dr, pos, true);
      break;
    }
    case Fn::q_up_dgrad: {
      expect(L, op, {Tag::d_qkv}, "dQ, dK, dV", true);
      const Mat& dq = need(L, Ly, mb, Slot::dq, op, "dQ");
      put(L, Ly, mb, Slot::mla_dq, dq);
      // d q_in, this rank's heads' part: the latents' gradient's first columns (kv_up_dgrad).
      put(L, Ly, mb, Slot::mla_dlat, linear_nt(L, dq, LK::q_up_w, Ly, op));
      break;
    }
    case Fn::kv_up_dgrad: {
      expect(L, op, {Tag::d_qkv}, "dQ, dK, dV", true);
      Mat dkv, dkr;
      mla_split_kv_bwd(need(L, Ly, mb, Slot::dk, op, "dK at its owner (cp_dkv_reducescatter)"),
                       need(L, Ly, mb, Slot::dv, op, "dV at its owner (cp_dkv_reducescatter)"), al, M.dn, dr, M.dv, dkv,
                       dkr);
      const Mat dkvn = linear_nt(L, dkv, LK::kv_up_w, Ly, op);
      const Mat& dq_in = need(L, Ly, mb, Slot::mla_dlat, op, "the q_in gradient (q_up_dgrad)");
      Mat g = Mat::uninitialized(dkvn.rows, qi + dc + dr);
      set_col_range(g, 0, dq_in);
      set_col_range(g, qi, dkvn);
      set_col_range(g, qi + dc, dkr);
      put(L, Ly, mb, Slot::mla_dkv, std::move(dkv));
      drop(L, Ly, mb, Slot::mla_dlat);
      set_chain(L, op, std::move(g), Tag::d_latent, true, false);  // TP partial: this rank's heads
      break;
    }
    case Fn::q_up_wgrad:
      wgrad(L, LK::q_up_w, Ly, col_range(up_input(), 0, qi), need(L, Ly, mb, Slot::mla_dq, op, "dQ (q_up_dgrad)"), op);
      break;
    case Fn::kv_up_wgrad:
      wgrad(L, LK::kv_up_w, Ly, col_range(up_input(), qi, qi + dc),
            need(L, Ly, mb, Slot::mla_dkv, op, "the kv_up output gradient (kv_up_dgrad)"), op);
      break;
    case Fn::kv_norm_bwd: {
      const Reg& c = expect(L, op, {Tag::d_latent}, "the latents' gradient", false);
      if (c.seq_shard != sp)
        die(op, sp ? "needs the latents' gradient reduce-scattered to the sequence shards"
                   : "needs the latents' full gradient");
      put(L, Ly, mb, Slot::mla_dlat, c.m);
      const Mat dkvl = mla_norm_bwd(L, op, col_range(c.m, qi, qi + dc), LK::kv_norm_w, Slot::mla_kvn);
      Mat dkvd = Mat::uninitialized(c.m.rows, dc + dr);
      set_col_range(dkvd, 0, dkvl);
      set_col_range(dkvd, dc, col_range(c.m, qi + dc, qi + dc + dr));
      put(L, Ly, mb, Slot::mla_dkvd, std::move(dkvd));
      break;
    }
    case Fn::kv_down_dgrad: {
      Mat dx = linear_nt(L, need(L, Ly, mb, Slot::mla_dkvd, op, "the kv_down output gradient (kv_norm_bwd)"),
                         LK::kv_down_w, Ly, op);
      if (M.dq == 0) {  // the query was projected from the input_norm output itself
        add_into(dx, col_range(need(L, Ly, mb, Slot::mla_dlat, op, "the latents' gradient"), 0, qi));
        compare_dnorm1(dx);
      }
      set_chain(L, op, std::move(dx), Tag::dnorm1, false, sp);
      break;
    }
    case Fn::q_norm_bwd: {
      const Mat& dlat = need(L, Ly, mb, Slot::mla_dlat, op, "the latents' gradient (kv_norm_bwd)");
      put(L, Ly, mb, Slot::mla_dql, mla_norm_bwd(L, op, col_range(dlat, 0, qi), LK::q_norm_w, Slot::mla_qn));
      break;
    }
    case Fn::q_down_dgrad: {
      Reg& c = expect(L, op, {Tag::dnorm1}, "the kv_down input gradient (kv_down_dgrad)", false);
      add_into(c.m, linear_nt(L, need(L, Ly, mb, Slot::mla_dql, op, "the q_down output gradient (q_norm_bwd)"),
                              LK::q_down_w, Ly, op));
      compare_dnorm1(c.m);
      break;
    }
    case Fn::kv_down_wgrad:
      wgrad(L, LK::kv_down_w, Ly, need(L, Ly, mb, Slot::n1, op, "the input_norm output"),
            need(L, Ly, mb, Slot::mla_dkvd, op, "the kv_down output gradient (kv_norm_bwd)"), op);
      break;
    case Fn::q_down_wgrad:
      wgrad(L, LK::q_down_w, Ly, need(L, Ly, mb, Slot::n1, op, "the input_norm output"),
            need(L, Ly, mb, Slot::mla_dql, op, "the q_down output gradient (q_norm_bwd)"), op);
      break;
    default:
      break;
  }
}

}  // namespace dtsim::verify
