// Op semantics of the block family: MLP up / gate (column-parallel), GeLU / SwiGLU, MLP down (row-parallel).
// Part of the StepPlan interpreter (models/verify/interpreter.cpp, interpreter_impl.hpp).
#include "models/verify/interpreter_impl.hpp"

namespace dtsim::verify {

/// MLP up / gate (column-parallel), GeLU / SwiGLU, MLP down (row-parallel).
void Interpreter::Impl::mlp_op(Lane& L, Fn fn, const Op& op) {
  [[maybe_unused]] const int Ly = op.layer, mb = op.micro_batch;
  switch (fn) {
    case Fn::mlp_up: {
      const Reg& c = expect(L, op, {Tag::norm2}, "the post_attention_norm output", true);
      if (M.swiglu) put(L, Ly, mb, Slot::tmp_in, c.m);  // for mlp_gate
      const LK up_b = LK::up_b;
      Mat u = linear(L, c.m, LK::up_w, Ly, op, M.bias ? &up_b : nullptr);
      put(L, Ly, mb, Slot::u, u);
      set_chain(L, op, std::move(u), Tag::col_mlp, false, false);
      break;
    }
    case Fn::mlp_gate:
      put(L, Ly, mb, Slot::g, linear(L, need(L, Ly, mb, Slot::tmp_in, op, "the MLP input"), LK::gate_w, Ly, op));
      break;
    case Fn::gelu:
    case Fn::swiglu: {
      expect(L, op, {Tag::col_mlp}, "the mlp_up output", true);
      const Mat& u = need(L, Ly, mb, Slot::u, op, "the mlp_up output");
      Mat a = Mat::uninitialized(u.rows, u.cols);
      if (fn == Fn::swiglu) {
        const Mat& g = need(L, Ly, mb, Slot::g, op, "the mlp_gate output");
        for (int64_t i = 0; i < u.size(); ++i) a.v[sz(i)] = silu(g.v[sz(i)]) * u.v[sz(i)];
      } else {
        for (int64_t i = 0; i < u.size(); ++i) a.v[sz(i)] = gelu(u.v[sz(i)]);
      }
      put(L, Ly, mb, Slot::act, a);
      set_chain(L, op, std::move(a), Tag::act, false, false);
      break;
    }
    case Fn::mlp_down: {
      const Reg& c = expect(L, op, {Tag::act}, "the MLP activation", true);
      // A MoE layer's shared expert: its output is the MoE output once the routed one is added.
      set_chain(L, op, linear(L, c.m, LK::down_w, Ly, op), M.moe_layer(Ly) ? Tag::shared_out : Tag::mlp_out, true, false);
      break;
    }
    case Fn::mlp_down_dgrad: {
      Reg& c = expect(L, op, {Tag::d_mlp_out}, "the MLP output gradient", true);
      Mat da = linear_nt(L, c.m, LK::down_w, Ly, op);
      put(L, Ly, mb, Slot::d_mlp, std::move(c.m));
      set_chain(L, op, std::move(da), Tag::d_act, false, false);
      break;
    }
    case Fn::mlp_down_wgrad:
      wgrad(L, LK::down_w, Ly, need(L, Ly, mb, Slot::act, op, "the MLP activation"),
            need(L, Ly, mb, Slot::d_mlp, op, "the MLP output gradient"), op);
      break;
    case Fn::gelu_bwd:
    case Fn::swiglu_bwd: {
      const Reg& c = expect(L, op, {Tag::d_act}, "the activation gradient", true);
      const Mat& u = need(L, Ly, mb, Slot::u, op, "the mlp_up output");
      Mat du = Mat::uninitialized(u.rows, u.cols);
      if (fn == Fn::swiglu_bwd) {
        const Mat& g = need(L, Ly, mb, Slot::g, op, "the mlp_gate output");
        Mat dg = Mat::uninitialized(u.rows, u.cols);
        for (int64_t i = 0; i < u.size(); ++i) {
          du.v[sz(i)] = c.m.v[sz(i)] * silu(g.v[sz(i)]);
          dg.v[sz(i)] = c.m.v[sz(i)] * u.v[sz(i)] * silu_grad(g.v[sz(i)]);
        }
        put(L, Ly, mb, Slot::dg, std::move(dg));
      } else {
        for (int64_t i = 0; i < u.size(); ++i) du.v[sz(i)] = c.m.v[sz(i)] * gelu_grad(u.v[sz(i)]);
      }
      put(L, Ly, mb, Slot::du, du);
      set_chain(L, op, std::move(du), Tag::d_col_mlp, false, false);
      break;
    }
    case Fn::mlp_up_dgrad: {
      const Reg& c = expect(L, op, {Tag::d_col_mlp}, "the mlp_up output gradient", true);
      Mat dn = linear_nt(L, c.m, LK::up_w, Ly, op);
      if (M.swiglu)
        add_into(dn, linear_nt(L, need(L, Ly, mb, Slot::dg, op, "the gate gradient"), LK::gate_w, Ly, op));
      set_chain(L, op, std::move(dn), M.moe_layer(Ly) ? Tag::d_shared : Tag::dnorm2, true, false);
      break;
    }
    case Fn::mlp_up_wgrad: {
      const Mat& in = col_input(L, op, Slot::n2, Slot::re2, Ly);
      const Mat& du = need(L, Ly, mb, Slot::du, op, "the mlp_up output gradient");
      wgrad(L, LK::up_w, Ly, in, du, op);
      if (M.bias) bias_grad(L, LK::up_b, Ly, du, op);
      if (M.swiglu) wgrad(L, LK::gate_w, Ly, in, need(L, Ly, mb, Slot::dg, op, "the gate gradient"), op);
      break;
    }
    default:
      break;
  }
}

}  // namespace dtsim::verify
