#include "models/blocks/attention.hpp"

#include <algorithm>
#include <cmath>

#include "models/blocks/norm.hpp"
#include "models/compute_cost.hpp"

namespace dtsim::blocks {

double window_keys(const ModelSpec& m, double s_kv) {
  return m.attention.window > 0 ? std::min(s_kv, static_cast<double>(m.attention.window)) : s_kv;
}

double window_work(double window, double S, bool chunked) {
  if (window <= 0 || window >= S) return 1.0;
  if (chunked) {
    const double n = std::floor(S / window), r = S - n * window;
    const double pairs = n * window * (window + 1.0) / 2.0 + r * (r + 1.0) / 2.0;
    return pairs / (S * window) / kFlashCausalWork;
  }
  return (1.0 - (window - 1.0) / (2.0 * S)) / kFlashCausalWork;
}

CoreShape dense_core_shape(const BlockContext& c, bool windowed) {
  CoreShape a;
  a.qk_head = a.v_head = static_cast<double>(c.m.head_dim());
  a.q = a.out = static_cast<double>(c.m.heads) * a.qk_head / c.t;
  a.k = a.v = c.kvd / c.t;
  const double S = static_cast<double>(c.e.training.seq_len);
  const double keys = windowed ? window_keys(c.m, S) : S;
  // 2 x tokens x keys x (heads head_dim) for Q K^T and again for A V (forward_flops below).
  a.scores_flops = a.values_flops = 2.0 * c.b * c.s * keys * a.q;
  if (windowed) a.work = window_work(static_cast<double>(c.m.attention.window), S, c.m.attention.chunked);
  return a;
}

void attention_core_forward(BlockContext& c, const CoreShape& a, Phase ph, int layer, int mb) {
  const double heads_local = static_cast<double>(c.m.heads) / c.t;
  const double S = static_cast<double>(c.e.training.seq_len);
  const double flops = a.scores_flops + a.values_flops;
  int cp_handle = -1;
  if (c.l.cp > 1) {
    const double kv_block = kAct * c.b * c.s * (a.k + a.v);
    cp_handle = c.issue("cp_kv_allgather", ph, layer, mb, CommKind::CP, Collective::AllGather, GroupKind::CP,
                        kv_block * static_cast<double>(c.l.cp));
  }
  const double cpf = static_cast<double>(c.l.cp);
  if (c.e.training.flash_attention) {
    // Reads Q and K, V of the whole context, writes the output.
    const double bytes = kAct * c.b * (c.s * (a.q + a.out) + S * (a.k + a.v));
    if (cp_handle >= 0) {
      c.compute("attention_local", ph, layer, mb, KernelKind::attention, flops / cpf, bytes / cpf, 1, c.attn_fwd_work * a.work);
      c.wait(cp_handle, CommKind::CP, layer, mb, ph);
      c.ring_blocks();
      c.compute("attention_remote", ph, layer, mb, KernelKind::attention, flops * (cpf - 1) / cpf,
                bytes * (cpf - 1) / cpf, static_cast<int>(c.l.cp - 1), c.attn_fwd_work * a.work);
    } else {
      c.compute("attention", ph, layer, mb, KernelKind::attention, flops, bytes, 1, c.attn_fwd_work * a.work);
    }
  } else {
    c.wait(cp_handle, CommKind::CP, layer, mb, ph);
    const double batch_heads = c.b * heads_local;
    c.gemm("attention_scores", ph, layer, mb, a.scores_flops, batch_heads * c.s, S, a.qk_head, Transpose::b, false);
    c.compute("softmax_dropout", ph, layer, mb, KernelKind::memory, 0, batch_heads * c.s * S * kUnfusedScoreBytes, 2);
    c.gemm("attention_values", ph, layer, mb, a.values_flops, batch_heads * c.s, a.v_head, S, Transpose::none, false);
  }
}

void attention_core_backward(BlockContext& c, const CoreShape& a, int layer, int mb) {
  const Phase ph = Phase::backward;
  const double heads_local = static_cast<double>(c.m.heads) / c.t;
  const double S = static_cast<double>(c.e.training.seq_len);
  const double flops = 2.0 * (a.scores_flops + a.values_flops);
  const double cpf = static_cast<double>(c.l.cp);
  int kv = -1;
  const double kv_size = kAct * c.b * c.s * (a.k + a.v) * cpf;
  if (c.l.cp > 1)
    kv = c.issue("cp_kv_allgather", ph, layer, mb, CommKind::CP, Collective::AllGather, GroupKind::CP, kv_size);
  if (c.e.training.flash_attention) {
    // Reads Q, K, V, the output and its gradient, writes dQ, dK, dV.
    const double bytes = kAct * c.b * (c.s * (2.0 * (a.q + a.out)) + S * (2.0 * (a.k + a.v)));
    if (kv >= 0) {
      c.compute("attention_bwd_local", ph, layer, mb, KernelKind::attention, flops / cpf, bytes / cpf, 1,
                c.attn_bwd_work * a.work);
      c.wait(kv, CommKind::CP, layer, mb, ph);
      c.ring_blocks();
      const int dkv = c.issue("cp_dkv_reducescatter", ph, layer, mb, CommKind::CP, Collective::ReduceScatter,
                              GroupKind::CP, kv_size);
      c.compute("attention_bwd_remote", ph, layer, mb, KernelKind::attention, flops * (cpf - 1) / cpf,
                bytes * (cpf - 1) / cpf, static_cast<int>(c.l.cp - 1), c.attn_bwd_work * a.work);
      c.wait(dkv, CommKind::CP, layer, mb, ph);
    } else {
      c.compute("attention_bwd", ph, layer, mb, KernelKind::attention, flops, bytes, 1, c.attn_bwd_work * a.work);
    }
  } else {
    c.wait(kv, CommKind::CP, layer, mb, ph);
    const double batch_heads = c.b * heads_local;
    c.gemm("attention_values_bwd", ph, layer, mb, 2.0 * a.values_flops, batch_heads * c.s, a.v_head, S,
           Transpose::a, false);
    c.compute("softmax_dropout_bwd", ph, layer, mb, KernelKind::memory, 0,
              batch_heads * c.s * S * kUnfusedScoreBytes * kElementwiseBwd, 2);
    c.gemm("attention_scores_bwd", ph, layer, mb, 2.0 * a.scores_flops, batch_heads * c.s, S, a.qk_head,
           Transpose::none, false);
    if (c.l.cp > 1)
      c.collective("cp_dkv_reducescatter", ph, layer, mb, CommKind::CP, Collective::ReduceScatter, GroupKind::CP,
                   kv_size);
  }
}

void AttentionBlock::forward(BlockContext& c, int layer, int mb, Phase ph) const {
  const double tok = c.b * c.s;
  const CoreShape a = dense_core_shape(c, windowed_);
  c.tp_enter(ph, layer, mb, "tp_allgather");
  c.gemm("qkv", ph, layer, mb, c.fwd.qkv / c.t, tok, a.q + a.k + a.v, c.h, Transpose::b);
  if (c.m.position == Position::rope)
    c.compute("rope", ph, layer, mb, KernelKind::memory, 0, kAct * 2.0 * tok * (a.q + a.k));
  attention_core_forward(c, a, ph, layer, mb);
  c.gemm("out_proj", ph, layer, mb, c.fwd.out_proj / c.t, tok, c.h, a.out, Transpose::b);
  c.tp_exit(ph, layer, mb, c.sp_on ? "tp_reducescatter" : "tp_allreduce");
}

void AttentionBlock::backward(BlockContext& c, int layer, int mb, BackwardPart part) const {
  const Phase ph = Phase::backward;
  const double tok = c.b * c.s;
  const CoreShape a = dense_core_shape(c, windowed_);
  const bool in = part != BackwardPart::weight;  // emit the input-gradient (B) ops
  const bool wt = part != BackwardPart::input;   // emit the weight-gradient (W) ops
  if (in) {
    c.tp_gather_output_grad(layer, mb);  // TE "proj_dgrad"
    c.gemm("out_proj_dgrad", ph, layer, mb, c.fwd.out_proj / c.t, tok, a.out, c.h, Transpose::none);
  }
  if (wt) c.gemm("out_proj_wgrad", ph, layer, mb, c.fwd.out_proj / c.t, a.out, c.h, tok, Transpose::a);
  if (in) {
    attention_core_backward(c, a, layer, mb);
    if (c.m.position == Position::rope)
      c.compute("rope_bwd", ph, layer, mb, KernelKind::memory, 0, kAct * 2.0 * tok * (a.q + a.k));
  }
  const double qkv_n = a.q + a.k + a.v;
  c.column_parallel_backward(
      layer, mb, part, [&] { c.gemm("qkv_dgrad", ph, layer, mb, c.fwd.qkv / c.t, tok, c.h, qkv_n, Transpose::none); },
      [&] { c.gemm("qkv_wgrad", ph, layer, mb, c.fwd.qkv / c.t, c.h, qkv_n, tok, Transpose::a); });
}

BlockParams AttentionBlock::parameters(const ModelSpec& m) const {
  const double h = static_cast<double>(m.hidden), qw = static_cast<double>(m.heads * m.head_dim()),
               kvw = static_cast<double>(m.kv_heads * m.head_dim());
  BlockParams p;
  p.sharded_weights = h * (qw + 2.0 * kvw) + qw * h;
  p.linear_modules = 2;  // linear_qkv, linear_proj (SelfAttention)
  if (has_linear_biases(m)) {
    p.sharded_biases = qw + 2.0 * kvw;
    p.replicated_biases = h;
  }
  // One learned sink logit per head (GPT-OSS), split with the heads over TP: a sharded
  // vector like a column-parallel bias, no GEMM weight.
  if (m.attention.sinks) p.sharded_biases += static_cast<double>(m.heads);
  return p;
}

void AttentionBlock::forward_flops(const ModelSpec& m, double tokens, double s_kv, ForwardFlops& out) const {
  const double h = static_cast<double>(m.hidden), qw = static_cast<double>(m.heads * m.head_dim()),
               kvw = static_cast<double>(m.kv_heads * m.head_dim());
  out.qkv += 2.0 * tokens * h * (qw + 2.0 * kvw);
  const double keys = windowed_ ? window_keys(m, s_kv) : s_kv;
  out.attention_scores += 2.0 * tokens * keys * qw;
  out.attention_values += 2.0 * tokens * keys * qw;
  out.out_proj += 2.0 * tokens * qw * h;
}

void AttentionBlock::activation_terms(const ActivationShape& a, std::vector<ActivationTerm>& out) const {
  using Split = ActivationTerm::Split;
  const double sb = a.s * a.b;
  const double h = static_cast<double>(a.m.hidden), qw = static_cast<double>(a.m.heads * a.m.head_dim()),
               kvw = static_cast<double>(a.m.kv_heads * a.m.head_dim());
  out.push_back({"qkv_input", 2.0 * sb * h, Split::sequence, false, true, true});
  out.push_back({"q", 2.0 * sb * qw, Split::tensor});
  out.push_back({"k", 2.0 * sb * kvw, Split::tensor});
  out.push_back({"v", 2.0 * sb * kvw, Split::tensor});
  out.push_back({"out_proj_input", 2.0 * sb * qw, Split::tensor});
  if (!a.flash_attention)
    out.push_back({"attention_scores", 5.0 * static_cast<double>(a.m.heads) * a.s * a.s_kv * a.b, Split::tensor, true});
}

void AttentionBlock::selective_recompute(BlockContext& c, int layer, int mb) const {
  attention_core_forward(c, dense_core_shape(c, windowed_), Phase::recompute, layer, mb);
}

}  // namespace dtsim::blocks
