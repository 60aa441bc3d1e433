#include "models/blocks/moe.hpp"

#include "models/blocks/norm.hpp"
#include "models/moe.hpp"

namespace dtsim::blocks {

namespace {

double d(int64_t v) { return static_cast<double>(v); }

/// Bytes of the router's fp32 scores per token and expert (Megatron-Core router.py computes
/// the gating logits, top-k and probabilities in fp32: moe_router_dtype fp32 in DeepSeek-V3
/// and Qwen3 recipes).
constexpr double kRouterScoreBytes = 4.0;

}  // namespace

BlockParams MoeBlock::parameters(const ModelSpec& m) const {
  const double h = d(m.hidden), E = d(m.moe.num_experts), fe = d(m.moe.moe_ffn_hidden),
               fs = d(m.moe.shared_expert_ffn_hidden);
  BlockParams p;
  p.replicated_weights = E * h + (m.moe.router_expert_bias ? E : 0.0);
  p.expert_weights = E * 3.0 * h * fe;  // SwiGLU experts: up, gate h x f_e, down f_e x h
  p.sharded_weights = 3.0 * h * fs;
  return p;
}

void MoeBlock::forward_flops(const ModelSpec& m, double tokens, double, ForwardFlops& out) const {
  const double h = d(m.hidden), E = d(m.moe.num_experts), k = d(m.moe.router_topk), fe = d(m.moe.moe_ffn_hidden),
               fs = d(m.moe.shared_expert_ffn_hidden);
  out.router += 2.0 * tokens * h * E;
  out.expert_up += 2.0 * tokens * k * h * fe;
  out.expert_gate += 2.0 * tokens * k * h * fe;
  out.expert_down += 2.0 * tokens * k * fe * h;
  out.shared_up += 2.0 * tokens * h * fs;
  out.shared_gate += 2.0 * tokens * h * fs;
  out.shared_down += 2.0 * tokens * fs * h;
}

void MoeBlock::activation_terms(const ActivationShape& a, std::vector<ActivationTerm>& out) const {
  using Split = ActivationTerm::Split;
  const double sb = a.s * a.b;
  const double h = d(a.m.hidden), E = d(a.m.moe.num_experts), k = d(a.m.moe.router_topk),
               fe = d(a.m.moe.moe_ffn_hidden), fs = d(a.m.moe.shared_expert_ffn_hidden);
  const double copies = sb * k * a.moe_load;
  out.push_back({"moe_input", kAct * sb * h, Split::sequence, false, true});
  out.push_back({"router_scores", kRouterScoreBytes * sb * (E + k), Split::sequence});
  out.push_back({"expert_input", kAct * copies * h, Split::sequence});
  out.push_back({"expert_fc1_output", 2.0 * kAct * copies * fe, Split::sequence});
  out.push_back({"expert_swiglu_output", kAct * copies * fe, Split::sequence});
  out.push_back({"expert_output", kAct * copies * h, Split::sequence});
  if (fs > 0) {
    out.push_back({"shared_fc1_output", 2.0 * kAct * sb * fs, Split::tensor});
    out.push_back({"shared_swiglu_output", kAct * sb * fs, Split::tensor});
  }
}

namespace {

// The shared expert: a TP MLP of f_s (Megatron-Core shared_experts.py SharedExpertMLP, a
// column-parallel fc1 [up, gate] and a row-parallel fc2).
void shared_forward(BlockContext& c, int layer, int mb, Phase ph) {
  const double fs = d(c.m.moe.shared_expert_ffn_hidden);
  if (fs <= 0) return;
  const double tok = c.b * c.s;
  c.tp_enter(ph, layer, mb, "tp_allgather");
  c.gemm("shared_up", ph, layer, mb, 2.0 * tok * c.h * fs / c.t, tok, fs / c.t, c.h, Transpose::b);
  c.gemm("shared_gate", ph, layer, mb, 2.0 * tok * c.h * fs / c.t, tok, fs / c.t, c.h, Transpose::b);
  c.compute("shared_swiglu", ph, layer, mb, KernelKind::memory, 0, kAct * 3.0 * tok * fs / c.t);
  c.gemm("shared_down", ph, layer, mb, 2.0 * tok * fs * c.h / c.t, tok, c.h, fs / c.t, Transpose::b);
  c.tp_exit(ph, layer, mb, c.sp_on ? "tp_reducescatter" : "tp_allreduce");
}

void shared_backward(BlockContext& c, int layer, int mb, BackwardPart part) {
  const double fs = d(c.m.moe.shared_expert_ffn_hidden);
  if (fs <= 0) return;
  const Phase ph = Phase::backward;
  const double tok = c.b * c.s;
  const bool in = part != BackwardPart::weight, wt = part != BackwardPart::input;
  const double down = 2.0 * tok * fs * c.h / c.t;
  if (in) {
    c.tp_gather_output_grad(layer, mb);
    c.gemm("shared_down_dgrad", ph, layer, mb, down, tok, fs / c.t, c.h, Transpose::none);
  }
  if (wt) c.gemm("shared_down_wgrad", ph, layer, mb, down, fs / c.t, c.h, tok, Transpose::a);
  if (in) c.compute("shared_swiglu_bwd", ph, layer, mb, KernelKind::memory, 0, kAct * 3.0 * tok * fs / c.t * kElementwiseBwd);
  const double up = 2.0 * down;  // up + gate
  c.column_parallel_backward(
      layer, mb, part, [&] { c.gemm("shared_up_dgrad", ph, layer, mb, up, tok, c.h, 2.0 * fs / c.t, Transpose::none); },
      [&] { c.gemm("shared_up_wgrad", ph, layer, mb, up, c.h, 2.0 * fs / c.t, tok, Transpose::a); });
}

}  // namespace

void MoeBlock::forward(BlockContext& c, int layer, int mb, Phase ph) const {
  const MoeTokens tk = moe_tokens(c.e, c.b);
  const double E = d(c.m.moe.num_experts), fe = d(c.m.moe.moe_ffn_hidden), etp = d(c.l.expert_tp());
  const int launches = static_cast<int>(tk.local_experts);
  c.gemm("router", ph, layer, mb, 2.0 * tk.tokens * c.h * E, tk.tokens, E, c.h, Transpose::b, false);
  c.compute("router_topk", ph, layer, mb, KernelKind::memory, 0, 2.0 * kRouterScoreBytes * tk.tokens * E, 2);
  c.compute("moe_permute", ph, layer, mb, KernelKind::memory, 0, 2.0 * kAct * tk.routed * c.h);
  const double dispatch = tk.received * c.h * moe_dispatch_bytes_per_element(c.e.training);
  int shared_wait = -1;
  if (c.e.training.moe_shared_expert_overlap && c.m.moe.shared_expert_ffn_hidden > 0) {
    shared_wait = c.issue("moe_dispatch", ph, layer, mb, CommKind::EP, Collective::AllToAll, GroupKind::EP, dispatch);
    shared_forward(c, layer, mb, ph);
    c.wait(shared_wait, CommKind::EP, layer, mb, ph);
  } else {
    c.collective("moe_dispatch", ph, layer, mb, CommKind::EP, Collective::AllToAll, GroupKind::EP, dispatch);
  }
  c.collective("moe_etp_allgather", ph, layer, mb, CommKind::EP, Collective::AllGather, GroupKind::ETP,
               kAct * tk.computed * c.h);
  const double rows = tk.computed, cols = fe / etp;
  c.gemm("expert_up", ph, layer, mb, 2.0 * rows * c.h * cols, rows, cols, c.h, Transpose::b, true, launches);
  c.gemm("expert_gate", ph, layer, mb, 2.0 * rows * c.h * cols, rows, cols, c.h, Transpose::b, true, launches);
  c.compute("expert_swiglu", ph, layer, mb, KernelKind::memory, 0, kAct * 3.0 * rows * cols);
  c.gemm("expert_down", ph, layer, mb, 2.0 * rows * cols * c.h, rows, c.h, cols, Transpose::b, true, launches);
  c.collective("moe_etp_reducescatter", ph, layer, mb, CommKind::EP, Collective::ReduceScatter, GroupKind::ETP,
               kAct * tk.computed * c.h);
  c.collective("moe_combine", ph, layer, mb, CommKind::EP, Collective::AllToAll, GroupKind::EP, kAct * tk.received * c.h);
  c.compute("moe_unpermute", ph, layer, mb, KernelKind::memory, 0, 2.0 * kAct * tk.routed * c.h);
  if (shared_wait < 0) shared_forward(c, layer, mb, ph);
}

void MoeBlock::backward(BlockContext& c, int layer, int mb, BackwardPart part) const {
  const Phase ph = Phase::backward;
  const MoeTokens tk = moe_tokens(c.e, c.b);
  const double E = d(c.m.moe.num_experts), fe = d(c.m.moe.moe_ffn_hidden), etp = d(c.l.expert_tp());
  const int launches = static_cast<int>(tk.local_experts);
  const bool in = part != BackwardPart::weight, wt = part != BackwardPart::input;
  const double rows = tk.computed, cols = fe / etp;
  const double down = 2.0 * rows * cols * c.h, up = 2.0 * down;
  const bool delay = c.e.training.delay_wgrad_compute && part == BackwardPart::full;
  const bool overlap_shared = c.e.training.moe_shared_expert_overlap && c.m.moe.shared_expert_ffn_hidden > 0;
  auto grouped = [&](const char* name, double flops, double m, double n, double k, Transpose tr) {
    c.gemm(name, ph, layer, mb, flops, m, n, k, tr, true, launches);
  };
  int combine = -1;
  if (in) {
    c.compute("moe_unpermute_bwd", ph, layer, mb, KernelKind::memory, 0, 3.0 * kAct * tk.routed * c.h);
    const double size = kAct * tk.received * c.h;
    if (overlap_shared) {
      combine = c.issue("moe_combine_bwd", ph, layer, mb, CommKind::EP, Collective::AllToAll, GroupKind::EP, size);
      shared_backward(c, layer, mb, part);
      c.wait(combine, CommKind::EP, layer, mb, ph);
    } else {
      c.collective("moe_combine_bwd", ph, layer, mb, CommKind::EP, Collective::AllToAll, GroupKind::EP, size);
    }
    c.collective("moe_etp_allgather_bwd", ph, layer, mb, CommKind::EP, Collective::AllGather, GroupKind::ETP,
                 kAct * tk.computed * c.h);
    grouped("expert_down_dgrad", down, rows, cols, c.h, Transpose::none);
  }
  if (wt && !delay) grouped("expert_down_wgrad", down, cols, c.h, rows, Transpose::a);
  if (in) {
    c.compute("expert_swiglu_bwd", ph, layer, mb, KernelKind::memory, 0, kAct * 3.0 * rows * cols * kElementwiseBwd);
    grouped("expert_up_dgrad", up, rows, c.h, 2.0 * cols, Transpose::none);
  }
  if (wt && !delay) grouped("expert_up_wgrad", up, c.h, 2.0 * cols, rows, Transpose::a);
  int dispatch = -1;
  if (in) {
    c.collective("moe_etp_reducescatter_bwd", ph, layer, mb, CommKind::EP, Collective::ReduceScatter, GroupKind::ETP,
                 kAct * tk.computed * c.h);
    const double size = kAct * tk.received * c.h;
    if (delay)
      dispatch = c.issue("moe_dispatch_bwd", ph, layer, mb, CommKind::EP, Collective::AllToAll, GroupKind::EP, size);
    else
      c.collective("moe_dispatch_bwd", ph, layer, mb, CommKind::EP, Collective::AllToAll, GroupKind::EP, size);
  }
  if (delay) {
    // Megatron-Core --delay-wgrad-compute: the expert wgrads run while the dispatch's
    // backward AllToAll travels (moe_layer.py, backward_dw after the dispatch backward).
    grouped("expert_down_wgrad", down, cols, c.h, rows, Transpose::a);
    grouped("expert_up_wgrad", up, c.h, 2.0 * cols, rows, Transpose::a);
    c.wait(dispatch, CommKind::EP, layer, mb, ph);
  }
  if (in) {
    c.compute("moe_permute_bwd", ph, layer, mb, KernelKind::memory, 0, 2.0 * kAct * tk.routed * c.h);
    c.compute("router_topk_bwd", ph, layer, mb, KernelKind::memory, 0, 2.0 * kRouterScoreBytes * tk.tokens * E, 2);
    c.gemm("router_dgrad", ph, layer, mb, 2.0 * tk.tokens * c.h * E, tk.tokens, c.h, E, Transpose::none, false);
  }
  if (wt) c.gemm("router_wgrad", ph, layer, mb, 2.0 * tk.tokens * c.h * E, E, c.h, tk.tokens, Transpose::a, false);
  if (!overlap_shared || !in) shared_backward(c, layer, mb, overlap_shared ? BackwardPart::weight : part);
}

}  // namespace dtsim::blocks
