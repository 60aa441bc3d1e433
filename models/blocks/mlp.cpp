#include "models/blocks/mlp.hpp"

#include "models/blocks/norm.hpp"

namespace dtsim::blocks {

BlockParams MlpBlock::parameters(const ModelSpec& m) const {
  const double h = static_cast<double>(m.hidden), f = static_cast<double>(m.ffn_hidden);
  const double in_gemms = m.activation == Activation::swiglu ? 2.0 : 1.0;  // up (+ gate)
  BlockParams p;
  p.sharded_weights = in_gemms * h * f + f * h;
  p.linear_modules = 2;  // linear_fc1 (up and gate fused), linear_fc2
  if (has_linear_biases(m)) {
    p.sharded_biases = in_gemms * f;
    p.replicated_biases = h;
  }
  return p;
}

void MlpBlock::forward_flops(const ModelSpec& m, double tokens, double, ForwardFlops& out) const {
  const double h = static_cast<double>(m.hidden), f = static_cast<double>(m.ffn_hidden);
  out.mlp_up += 2.0 * tokens * h * f;
  out.mlp_gate += m.activation == Activation::swiglu ? 2.0 * tokens * h * f : 0.0;
  out.mlp_down += 2.0 * tokens * f * h;
}

void MlpBlock::activation_terms(const ActivationShape& a, std::vector<ActivationTerm>& out) const {
  using Split = ActivationTerm::Split;
  const double sb = a.s * a.b;
  const double h = static_cast<double>(a.m.hidden), f = static_cast<double>(a.m.ffn_hidden);
  out.push_back({"mlp_input", 2.0 * sb * h, Split::sequence, false, true, true});
  if (a.m.activation == Activation::swiglu) {
    out.push_back({"fc1_output", 4.0 * sb * f, Split::tensor});
    out.push_back({"swiglu_output", 2.0 * sb * f, Split::tensor, false, false, true});
  } else {
    out.push_back({"fc1_output", 2.0 * sb * f, Split::tensor});
    out.push_back({"gelu_output", 2.0 * sb * f, Split::tensor, false, false, true});
  }
}

MlpOps dense_mlp_ops(const ModelSpec& m) {
  MlpOps o{static_cast<double>(m.ffn_hidden), m.activation == Activation::swiglu, "mlp_up", "mlp_gate", "gelu", "mlp_down",
           "mlp_down_dgrad", "mlp_down_wgrad", "gelu_bwd", "mlp_up_dgrad", "mlp_up_wgrad"};
  if (o.gated) o.act = "swiglu", o.act_bwd = "swiglu_bwd";
  return o;
}

void mlp_forward(BlockContext& c, int layer, int mb, Phase ph, const MlpOps& o) {
  const double tok = c.b * c.s, f = o.ffn;
  const double gemm = 2.0 * tok * c.h * f;  // each of up, gate, down (flops.hpp ForwardFlops)
  c.tp_enter(ph, layer, mb, "tp_allgather");
  c.gemm(o.up, ph, layer, mb, gemm / c.t, tok, f / c.t, c.h, Transpose::b);
  if (o.gated) {
    c.gemm(o.gate, ph, layer, mb, gemm / c.t, tok, f / c.t, c.h, Transpose::b);
    c.compute(o.act, ph, layer, mb, KernelKind::memory, 0, kAct * 3.0 * tok * f / c.t);
  } else {
    c.compute(o.act, ph, layer, mb, KernelKind::memory, 0, kAct * 2.0 * tok * f / c.t);
  }
  c.gemm(o.down, ph, layer, mb, gemm / c.t, tok, c.h, f / c.t, Transpose::b);
  c.tp_exit(ph, layer, mb, c.sp_on ? "tp_reducescatter" : "tp_allreduce");
}

void mlp_backward(BlockContext& c, int layer, int mb, BackwardPart part, const MlpOps& o) {
  const Phase ph = Phase::backward;
  const double tok = c.b * c.s, f = o.ffn;
  const double gemm = 2.0 * tok * c.h * f;
  const bool in = part != BackwardPart::weight;  // emit the input-gradient (B) ops
  const bool wt = part != BackwardPart::input;   // emit the weight-gradient (W) ops
  if (in) {
    c.tp_gather_output_grad(layer, mb);  // TE "fc2_dgrad"
    c.gemm(o.down_dgrad, ph, layer, mb, gemm / c.t, tok, f / c.t, c.h, Transpose::none);
  }
  if (wt) c.gemm(o.down_wgrad, ph, layer, mb, gemm / c.t, f / c.t, c.h, tok, Transpose::a);
  if (in)
    c.compute(o.act_bwd, ph, layer, mb, KernelKind::memory, 0,
              kAct * (o.gated ? 3.0 : 2.0) * tok * f / c.t * kElementwiseBwd);
  const double up_flops = (o.gated ? gemm + gemm : gemm) / c.t;
  const double up_n = (o.gated ? 2.0 : 1.0) * f / c.t;
  c.column_parallel_backward(
      layer, mb, part, [&] { c.gemm(o.up_dgrad, ph, layer, mb, up_flops, tok, c.h, up_n, Transpose::none); },
      [&] { c.gemm(o.up_wgrad, ph, layer, mb, up_flops, c.h, up_n, tok, Transpose::a); });
}

void MlpBlock::forward(BlockContext& c, int layer, int mb, Phase ph) const {
  mlp_forward(c, layer, mb, ph, dense_mlp_ops(c.m));
}

void MlpBlock::backward(BlockContext& c, int layer, int mb, BackwardPart part) const {
  mlp_backward(c, layer, mb, part, dense_mlp_ops(c.m));
}

}  // namespace dtsim::blocks
