#include "models/blocks/mlp.hpp"

#include "models/blocks/norm.hpp"

namespace dtsim::blocks {

BlockParams MlpBlock::parameters(const ModelSpec& m) const {
  const double h = static_cast<double>(m.hidden), f = static_cast<double>(m.ffn_hidden);
  const double in_gemms = m.activation == Activation::swiglu ? 2.0 : 1.0;  // up (+ gate)
  BlockParams p;
  p.sharded_weights = in_gemms * h * f + f * h;
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
  out.push_back({"mlp_input", 2.0 * sb * h, Split::sequence, false, true});
  if (a.m.activation == Activation::swiglu) {
    out.push_back({"fc1_output", 4.0 * sb * f, Split::tensor});
    out.push_back({"swiglu_output", 2.0 * sb * f, Split::tensor});
  } else {
    out.push_back({"fc1_output", 2.0 * sb * f, Split::tensor});
    out.push_back({"gelu_output", 2.0 * sb * f, Split::tensor});
  }
}

void MlpBlock::forward(BlockContext& c, int layer, int mb, Phase ph) const {
  const double tok = c.b * c.s;
  c.tp_enter(ph, layer, mb, "tp_allgather");
  c.gemm("mlp_up", ph, layer, mb, c.fwd.mlp_up / c.t, tok, c.f / c.t, c.h, Transpose::b);
  if (c.m.activation == Activation::swiglu) {
    c.gemm("mlp_gate", ph, layer, mb, c.fwd.mlp_gate / c.t, tok, c.f / c.t, c.h, Transpose::b);
    c.compute("swiglu", ph, layer, mb, KernelKind::memory, 0, kAct * 3.0 * tok * c.f / c.t);
  } else {
    c.compute("gelu", ph, layer, mb, KernelKind::memory, 0, kAct * 2.0 * tok * c.f / c.t);
  }
  c.gemm("mlp_down", ph, layer, mb, c.fwd.mlp_down / c.t, tok, c.h, c.f / c.t, Transpose::b);
  c.tp_exit(ph, layer, mb, c.sp_on ? "tp_reducescatter" : "tp_allreduce");
}

void MlpBlock::backward(BlockContext& c, int layer, int mb, BackwardPart part) const {
  const Phase ph = Phase::backward;
  const double tok = c.b * c.s;
  const bool in = part != BackwardPart::weight;  // emit the input-gradient (B) ops
  const bool wt = part != BackwardPart::input;   // emit the weight-gradient (W) ops
  if (in) {
    c.tp_gather_output_grad(layer, mb);  // TE "fc2_dgrad"
    c.gemm("mlp_down_dgrad", ph, layer, mb, c.fwd.mlp_down / c.t, tok, c.f / c.t, c.h, Transpose::none);
  }
  if (wt) c.gemm("mlp_down_wgrad", ph, layer, mb, c.fwd.mlp_down / c.t, c.f / c.t, c.h, tok, Transpose::a);
  if (in) {
    if (c.m.activation == Activation::swiglu)
      c.compute("swiglu_bwd", ph, layer, mb, KernelKind::memory, 0, kAct * 3.0 * tok * c.f / c.t * kElementwiseBwd);
    else
      c.compute("gelu_bwd", ph, layer, mb, KernelKind::memory, 0, kAct * 2.0 * tok * c.f / c.t * kElementwiseBwd);
  }
  const double up_flops = (c.fwd.mlp_up + c.fwd.mlp_gate) / c.t;
  const double up_n = (c.m.activation == Activation::swiglu ? 2.0 : 1.0) * c.f / c.t;
  c.column_parallel_backward(
      layer, mb, part, [&] { c.gemm("mlp_up_dgrad", ph, layer, mb, up_flops, tok, c.h, up_n, Transpose::none); },
      [&] { c.gemm("mlp_up_wgrad", ph, layer, mb, up_flops, c.h, up_n, tok, Transpose::a); });
}

}  // namespace dtsim::blocks
