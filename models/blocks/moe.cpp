#include "models/blocks/moe.hpp"

#include "models/blocks/mlp.hpp"
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
  p.linear_modules = 1 + (fs > 0 ? 2 : 0);  // the router; the shared experts' linear_fc1, linear_fc2
  p.expert_linear_modules = 2;               // TEGroupedMLP linear_fc1, linear_fc2
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
  out.push_back({"expert_input", kAct * copies * h, Split::sequence, false, false, true});
  out.push_back({"expert_fc1_output", 2.0 * kAct * copies * fe, Split::sequence});
  out.push_back({"expert_swiglu_output", kAct * copies * fe, Split::sequence, false, false, true});
  out.push_back({"expert_output", kAct * copies * h, Split::sequence});
  if (fs > 0) {
    out.push_back({"shared_fc1_output", 2.0 * kAct * sb * fs, Split::tensor});
    out.push_back({"shared_swiglu_output", kAct * sb * fs, Split::tensor, false, false, true});
  }
}

namespace {

// The shared expert: a TP MLP of f_s (Megatron-Core shared_experts.py SharedExpertMLP, a
// column-parallel fc1 [up, gate] and a row-parallel fc2), the dense MLP's ops at its width.
MlpOps shared_ops(const ModelSpec& m) {
  return {d(m.moe.shared_expert_ffn_hidden), true, "shared_up", "shared_gate", "shared_swiglu", "shared_down",
          "shared_down_dgrad", "shared_down_wgrad", "shared_swiglu_bwd", "shared_up_dgrad", "shared_up_wgrad"};
}
void shared_forward(BlockContext& c, int layer, int mb, Phase ph) {
  if (c.m.moe.shared_expert_ffn_hidden > 0) mlp_forward(c, layer, mb, ph, shared_ops(c.m));
}
void shared_backward(BlockContext& c, int layer, int mb, BackwardPart part) {
  if (c.m.moe.shared_expert_ffn_hidden > 0) mlp_backward(c, layer, mb, part, shared_ops(c.m));
}

/// An AllToAll over EP of `size` bytes: blocking, or with `overlapped` issued, `beside()` run
/// on the compute stream while it travels, then waited for.
template <class F>
void ep_alltoall(BlockContext& c, const char* name, Phase ph, int layer, int mb, double size, bool overlapped,
                 F beside) {
  if (!overlapped) {
    c.collective(name, ph, layer, mb, CommKind::EP, Collective::AllToAll, GroupKind::EP, size);
    return;
  }
  const int h = c.issue(name, ph, layer, mb, CommKind::EP, Collective::AllToAll, GroupKind::EP, size);
  beside();
  c.wait(h, CommKind::EP, layer, mb, ph);
}

/// The sizes forward and backward share: models/moe.hpp's token counts, the grouped GEMMs'
/// rows (computed) and columns (f_e / etp) and one launch per local expert.
struct ExpertShape {
  MoeTokens tk;
  double E = 0, rows = 0, cols = 0;
  int launches = 1;
};
ExpertShape expert_shape(const BlockContext& c) {
  ExpertShape x;
  x.tk = moe_tokens(c.e, c.b);
  x.E = d(c.m.moe.num_experts);
  x.rows = x.tk.computed;
  x.cols = d(c.m.moe.moe_ffn_hidden) / d(c.l.expert_tp());
  x.launches = static_cast<int>(x.tk.local_experts);
  return x;
}

}  // namespace

void MoeBlock::forward(BlockContext& c, int layer, int mb, Phase ph) const {
  const ExpertShape x = expert_shape(c);
  const MoeTokens& tk = x.tk;
  const double rows = x.rows, cols = x.cols;
  c.gemm("router", ph, layer, mb, 2.0 * tk.tokens * c.h * x.E, tk.tokens, x.E, c.h, Transpose::b, false);
  c.compute("router_topk", ph, layer, mb, KernelKind::memory, 0, 2.0 * kRouterScoreBytes * tk.tokens * x.E, 2);
  const size_t routed_from = c.sp.ops.size();  // permute .. unpermute: shaped by the routing
  c.compute("moe_permute", ph, layer, mb, KernelKind::memory, 0, 2.0 * kAct * tk.routed * c.h);
  const bool overlap_shared = c.e.training.moe_shared_expert_overlap && c.m.moe.shared_expert_ffn_hidden > 0;
  ep_alltoall(c, "moe_dispatch", ph, layer, mb, tk.received * c.h * moe_dispatch_bytes_per_element(c.e.training),
              overlap_shared, [&] { shared_forward(c, layer, mb, ph); });
  c.collective("moe_etp_allgather", ph, layer, mb, CommKind::EP, Collective::AllGather, GroupKind::ETP,
               kAct * tk.computed * c.h);
  const double experts = x.tk.local_experts;  // each with its own weights (BlockContext::gemm)
  c.gemm("expert_up", ph, layer, mb, 2.0 * rows * c.h * cols, rows, cols, c.h, Transpose::b, true, x.launches,
         experts);
  c.gemm("expert_gate", ph, layer, mb, 2.0 * rows * c.h * cols, rows, cols, c.h, Transpose::b, true, x.launches,
         experts);
  c.compute("expert_swiglu", ph, layer, mb, KernelKind::memory, 0, kAct * 3.0 * rows * cols);
  c.gemm("expert_down", ph, layer, mb, 2.0 * rows * cols * c.h, rows, c.h, cols, Transpose::b, true, x.launches,
         experts);
  c.collective("moe_etp_reducescatter", ph, layer, mb, CommKind::EP, Collective::ReduceScatter, GroupKind::ETP,
               kAct * tk.computed * c.h);
  c.collective("moe_combine", ph, layer, mb, CommKind::EP, Collective::AllToAll, GroupKind::EP, kAct * tk.received * c.h);
  c.compute("moe_unpermute", ph, layer, mb, KernelKind::memory, 0, 2.0 * kAct * tk.routed * c.h);
  c.mark_dynamic(routed_from);
  // The dispatcher's host synchronisation on the token counts, before the op after the
  // permutation (the dispatch AllToAll; the experts' first GEMM without EP). Op::host_sync.
  if (c.sp.ops[routed_from].dynamic_shape) c.sp.ops[routed_from + 1].host_sync = true;
  if (!overlap_shared) shared_forward(c, layer, mb, ph);
}

void MoeBlock::backward(BlockContext& c, int layer, int mb, BackwardPart part) const {
  const Phase ph = Phase::backward;
  const ExpertShape x = expert_shape(c);
  const MoeTokens& tk = x.tk;
  const double rows = x.rows, cols = x.cols, E = x.E;
  const bool in = part != BackwardPart::weight, wt = part != BackwardPart::input;
  const double down = 2.0 * rows * cols * c.h, up = 2.0 * down;
  const bool delay = c.e.training.delay_wgrad_compute && part == BackwardPart::full;
  const bool overlap_shared = c.e.training.moe_shared_expert_overlap && c.m.moe.shared_expert_ffn_hidden > 0;
  // Input gradients read each expert's weight, weight gradients write each expert's own.
  auto grouped = [&](const char* name, double flops, double m, double n, double k, Transpose tr) {
    c.gemm(name, ph, layer, mb, flops, m, n, k, tr, true, x.launches, x.tk.local_experts, tr == Transpose::a);
  };
  auto expert_wgrads = [&] {
    grouped("expert_down_wgrad", down, cols, c.h, rows, Transpose::a);
    grouped("expert_up_wgrad", up, c.h, 2.0 * cols, rows, Transpose::a);
  };
  const size_t routed_from = c.sp.ops.size();  // unpermute_bwd .. permute_bwd and the expert wgrads
  if (in) {
    c.compute("moe_unpermute_bwd", ph, layer, mb, KernelKind::memory, 0, 3.0 * kAct * tk.routed * c.h);
    // With the shared expert overlapped, its backward runs while the combine's backward travels.
    ep_alltoall(c, "moe_combine_bwd", ph, layer, mb, kAct * tk.received * c.h, overlap_shared,
                [&] { shared_backward(c, layer, mb, part); });
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
  if (in) {
    c.collective("moe_etp_reducescatter_bwd", ph, layer, mb, CommKind::EP, Collective::ReduceScatter, GroupKind::ETP,
                 kAct * tk.computed * c.h);
    // Megatron-Core --delay-wgrad-compute: the expert wgrads run while the dispatch's backward
    // AllToAll travels (moe_layer.py, backward_dw after the dispatch backward).
    ep_alltoall(c, "moe_dispatch_bwd", ph, layer, mb, kAct * tk.received * c.h, delay, expert_wgrads);
    c.compute("moe_permute_bwd", ph, layer, mb, KernelKind::memory, 0, 2.0 * kAct * tk.routed * c.h);
    c.mark_dynamic(routed_from);
    c.compute("router_topk_bwd", ph, layer, mb, KernelKind::memory, 0, 2.0 * kRouterScoreBytes * tk.tokens * E, 2);
    c.gemm("router_dgrad", ph, layer, mb, 2.0 * tk.tokens * c.h * E, tk.tokens, c.h, E, Transpose::none, false);
  }
  if (!in) c.mark_dynamic(routed_from);  // the W part: the expert weight gradients
  if (wt) c.gemm("router_wgrad", ph, layer, mb, 2.0 * tk.tokens * c.h * E, E, c.h, tk.tokens, Transpose::a, false);
  // The shared expert: inside the combine's backward when overlapped (its W part alone here
  // for a split backward), else after the router.
  if (!overlap_shared || !in) shared_backward(c, layer, mb, overlap_shared ? BackwardPart::weight : part);
}

}  // namespace dtsim::blocks
