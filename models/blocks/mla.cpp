#include "models/blocks/mla.hpp"

#include "models/blocks/attention.hpp"
#include "models/blocks/norm.hpp"

namespace dtsim::blocks {

namespace {

/// MLA's sizes for one rank (mla.hpp names them).
struct MlaSizes {
  double h, n, nl, dq, dc, dn, dr, dv;
  double tok;       // b s: tokens of the up projections and the core
  double down_tok;  // tokens of the duplicated down projections: b s / t with SP, else b s
  /// Width (elements per token) of the column-parallel GEMMs' inputs, which SP all-gathers and
  /// whose gradients are reduced over TP: the q latent (or the hidden state when the query
  /// has no low-rank projection), the kv latent and the rotary key.
  double gathered;
  double q_in;      // input width of the query up projection: d_q, or h (linear_q_proj)
};

MlaSizes sizes(const BlockContext& c) {
  const MlaSpec& x = c.m.mla;
  MlaSizes z{};
  z.h = c.h;
  z.n = static_cast<double>(c.m.heads);
  z.nl = z.n / c.t;
  z.dq = static_cast<double>(x.q_lora_rank);
  z.dc = static_cast<double>(x.kv_lora_rank);
  z.dn = static_cast<double>(x.qk_nope_head_dim);
  z.dr = static_cast<double>(x.qk_rope_head_dim);
  z.dv = static_cast<double>(x.v_head_dim);
  z.tok = c.b * c.s;
  z.down_tok = c.sp_on ? z.tok / c.t : z.tok;
  z.q_in = z.dq > 0 ? z.dq : z.h;
  z.gathered = z.q_in + z.dc + z.dr;
  return z;
}

CoreShape core_shape(const BlockContext& c, const MlaSizes& z) {
  CoreShape a;
  a.qk_head = z.dn + z.dr;
  a.v_head = z.dv;
  a.q = a.k = z.nl * a.qk_head;
  a.v = a.out = z.nl * z.dv;
  const double s_kv = static_cast<double>(c.e.training.seq_len);
  a.scores_flops = 2.0 * z.tok * s_kv * a.q;
  a.values_flops = 2.0 * z.tok * s_kv * a.v;
  return a;
}

/// An RMSNorm over `width` elements of `tokens` tokens: read + write (norm.cpp's rule).
void latent_norm(BlockContext& c, const char* name, Phase ph, int layer, int mb, double tokens, double width) {
  const double bytes = kAct * 2.0 * tokens * width;
  c.compute(name, ph, layer, mb, KernelKind::memory, 0, ph == Phase::backward ? bytes * kNormBwd : bytes);
}

/// A linear layer's GEMM of (rows x inner) @ (inner x cols): 2 rows cols inner FLOPs.
void linear(BlockContext& c, const char* name, Phase ph, int layer, int mb, double rows, double cols, double inner,
            Transpose tr) {
  c.gemm(name, ph, layer, mb, 2.0 * rows * cols * inner, rows, cols, inner, tr);
}

}  // namespace

void MlaBlock::forward(BlockContext& c, int layer, int mb, Phase ph) const {
  const MlaSizes z = sizes(c);
  const CoreShape a = core_shape(c, z);
  if (z.dq > 0) {
    linear(c, "q_down", ph, layer, mb, z.down_tok, z.dq, z.h, Transpose::b);
    latent_norm(c, "q_norm", ph, layer, mb, z.down_tok, z.dq);
  }
  linear(c, "kv_down", ph, layer, mb, z.down_tok, z.dc + z.dr, z.h, Transpose::b);
  latent_norm(c, "kv_norm", ph, layer, mb, z.down_tok, z.dc);
  if (c.sp_on)
    c.collective("tp_allgather_latent", ph, layer, mb, CommKind::TP, Collective::AllGather, GroupKind::TP,
                 kAct * z.tok * z.gathered);
  linear(c, z.dq > 0 ? "q_up" : "q_proj", ph, layer, mb, z.tok, a.q, z.q_in, Transpose::b);
  linear(c, "kv_up", ph, layer, mb, z.tok, z.nl * (z.dn + z.dv), z.dc, Transpose::b);
  if (c.m.position == Position::rope)
    c.compute("rope", ph, layer, mb, KernelKind::memory, 0, kAct * 2.0 * z.tok * (z.nl * z.dr + z.dr));
  attention_core_forward(c, a, ph, layer, mb);
  linear(c, "out_proj", ph, layer, mb, z.tok, z.h, a.out, Transpose::b);
  c.tp_exit(ph, layer, mb, c.sp_on ? "tp_reducescatter" : "tp_allreduce");
}

void MlaBlock::backward(BlockContext& c, int layer, int mb, BackwardPart part) const {
  const Phase ph = Phase::backward;
  const MlaSizes z = sizes(c);
  const CoreShape a = core_shape(c, z);
  const bool in = part != BackwardPart::weight;
  const bool wt = part != BackwardPart::input;
  if (in) {
    c.tp_gather_output_grad(layer, mb);
    linear(c, "out_proj_dgrad", ph, layer, mb, z.tok, a.out, z.h, Transpose::none);
  }
  if (wt) linear(c, "out_proj_wgrad", ph, layer, mb, a.out, z.h, z.tok, Transpose::a);
  if (in) {
    attention_core_backward(c, a, layer, mb);
    if (c.m.position == Position::rope)
      c.compute("rope_bwd", ph, layer, mb, KernelKind::memory, 0, kAct * 2.0 * z.tok * (z.nl * z.dr + z.dr));
  }
  const char* q_dgrad = z.dq > 0 ? "q_up_dgrad" : "q_proj_dgrad";
  const char* q_wgrad = z.dq > 0 ? "q_up_wgrad" : "q_proj_wgrad";
  const double kv_up_n = z.nl * (z.dn + z.dv);
  c.column_parallel_backward(
      layer, mb, part,
      [&] {
        linear(c, q_dgrad, ph, layer, mb, z.tok, z.q_in, a.q, Transpose::none);
        linear(c, "kv_up_dgrad", ph, layer, mb, z.tok, z.dc, kv_up_n, Transpose::none);
      },
      [&] {
        linear(c, q_wgrad, ph, layer, mb, z.q_in, a.q, z.tok, Transpose::a);
        linear(c, "kv_up_wgrad", ph, layer, mb, z.dc, kv_up_n, z.tok, Transpose::a);
      },
      z.gathered);
  // The duplicated down projections, on the (reduced) latent gradients.
  if (in) {
    latent_norm(c, "kv_norm_bwd", ph, layer, mb, z.down_tok, z.dc);
    linear(c, "kv_down_dgrad", ph, layer, mb, z.down_tok, z.h, z.dc + z.dr, Transpose::none);
    if (z.dq > 0) {
      latent_norm(c, "q_norm_bwd", ph, layer, mb, z.down_tok, z.dq);
      linear(c, "q_down_dgrad", ph, layer, mb, z.down_tok, z.h, z.dq, Transpose::none);
    }
  }
  if (wt) {
    linear(c, "kv_down_wgrad", ph, layer, mb, z.h, z.dc + z.dr, z.down_tok, Transpose::a);
    if (z.dq > 0) linear(c, "q_down_wgrad", ph, layer, mb, z.h, z.dq, z.down_tok, Transpose::a);
  }
}

void MlaBlock::selective_recompute(BlockContext& c, int layer, int mb) const {
  attention_core_forward(c, core_shape(c, sizes(c)), Phase::recompute, layer, mb);
}

BlockParams MlaBlock::parameters(const ModelSpec& m) const {
  const MlaSpec& x = m.mla;
  const double h = static_cast<double>(m.hidden), n = static_cast<double>(m.heads);
  const double dq = static_cast<double>(x.q_lora_rank), dc = static_cast<double>(x.kv_lora_rank);
  const double dn = static_cast<double>(x.qk_nope_head_dim), dr = static_cast<double>(x.qk_rope_head_dim);
  const double dv = static_cast<double>(x.v_head_dim);
  BlockParams p;
  p.sharded_weights = (dq > 0 ? dq : h) * n * (dn + dr) + dc * n * (dn + dv) + n * dv * h;
  p.replicated_weights = (dq > 0 ? h * dq + dq : 0.0) + h * (dc + dr) + dc;
  // linear_q_down_proj + linear_q_up_proj (or linear_q_proj without q_lora_rank),
  // linear_kv_down_proj, linear_kv_up_proj, linear_proj (MLASelfAttention).
  p.linear_modules = dq > 0 ? 5 : 4;
  return p;
}

void MlaBlock::forward_flops(const ModelSpec& m, double tokens, double s_kv, ForwardFlops& out) const {
  const MlaSpec& x = m.mla;
  const double h = static_cast<double>(m.hidden), n = static_cast<double>(m.heads);
  const double dq = static_cast<double>(x.q_lora_rank), dc = static_cast<double>(x.kv_lora_rank);
  const double dn = static_cast<double>(x.qk_nope_head_dim), dr = static_cast<double>(x.qk_rope_head_dim);
  const double dv = static_cast<double>(x.v_head_dim);
  const double q_proj = dq > 0 ? h * dq + dq * n * (dn + dr) : h * n * (dn + dr);
  out.qkv += 2.0 * tokens * (q_proj + h * (dc + dr) + dc * n * (dn + dv));
  out.attention_scores += 2.0 * tokens * s_kv * n * (dn + dr);
  out.attention_values += 2.0 * tokens * s_kv * n * dv;
  out.out_proj += 2.0 * tokens * n * dv * h;
}

void MlaBlock::activation_terms(const ActivationShape& a, std::vector<ActivationTerm>& out) const {
  using Split = ActivationTerm::Split;
  const MlaSpec& x = a.m.mla;
  const double sb = a.s * a.b;
  const double h = static_cast<double>(a.m.hidden), n = static_cast<double>(a.m.heads);
  const double dq = static_cast<double>(x.q_lora_rank), dc = static_cast<double>(x.kv_lora_rank);
  const double qk = static_cast<double>(x.qk_nope_head_dim + x.qk_rope_head_dim);
  const double dv = static_cast<double>(x.v_head_dim);
  out.push_back({"mla_down_input", 2.0 * sb * h, Split::sequence, false, true, true});
  if (dq > 0) {
    out.push_back({"q_latent", 2.0 * sb * dq, Split::sequence});
    out.push_back({"q_latent_norm", 2.0 * sb * dq, Split::sequence, false, false, true});
  }
  out.push_back({"kv_latent", 2.0 * sb * dc, Split::sequence});
  out.push_back({"kv_latent_norm", 2.0 * sb * dc, Split::sequence, false, false, true});
  out.push_back({"q", 2.0 * sb * n * qk, Split::tensor});
  out.push_back({"k", 2.0 * sb * n * qk, Split::tensor});
  out.push_back({"v", 2.0 * sb * n * dv, Split::tensor});
  out.push_back({"out_proj_input", 2.0 * sb * n * dv, Split::tensor});
  if (!a.flash_attention) out.push_back({"attention_scores", 5.0 * n * a.s * a.s_kv * a.b, Split::tensor, true});
}

}  // namespace dtsim::blocks
