#include "models/blocks/block_context.hpp"

#include "models/compute_cost.hpp"
#include "models/precision.hpp"

namespace dtsim::blocks {

BlockContext::BlockContext(const Experiment& ex, StagePlan& stage, const PlanShape& sh)
    : e(ex),
      m(ex.model),
      l(ex.layout),
      sp(stage),
      shape(sh),
      b(static_cast<double>(ex.training.micro_batch)),
      s(static_cast<double>(sh.tokens_local)),
      t(static_cast<double>(ex.layout.tp)),
      h(static_cast<double>(ex.model.hidden)),
      f(static_cast<double>(ex.model.ffn_hidden)),
      kvd(static_cast<double>(ex.model.kv_heads * ex.model.head_dim())),
      V(static_cast<double>(ex.model.vocab)),
      sp_on(ex.layout.sequence_parallel && ex.layout.tp > 1),
      norm_tokens(b * s / (sp_on ? t : 1.0)),
      fwd(layer_forward_flops(ex.model, ex.training.micro_batch, sh.tokens_local, ex.training.seq_len)),
      attn_fwd_work(ex.training.flash_attention ? kFlashCausalWork : 1.0),
      attn_bwd_work(ex.training.flash_attention ? kFlashCausalWork * kFlashBackwardWork / 2.0 : 1.0) {}

void BlockContext::compute(const char* name, Phase ph, int layer, int mb, KernelKind k, double flops, double bytes,
                           int kernels, double attention_work) {
  Op op;
  op.type = OpType::compute;
  op.name = name;
  op.phase = ph;
  op.pass = pass_of(ph);
  op.layer = layer;
  op.micro_batch = mb;
  op.kernel = k;
  op.flops = flops;
  op.bytes = bytes;
  op.kernels = kernels;
  append_compute(op, attention_work);
}

void BlockContext::append_compute(Op op, double attention_work) {
  // Calibrated profile (cluster.gpu.profile) when it has the kernel, else the roofline.
  const ComputeTime ct = compute_time(op, e, attention_work);
  op.time_s = ct.seconds;
  op.time_source = ct.source;
  op.chunk = cur_chunk;
  sp.ops.push_back(op);
}

void BlockContext::gemm(const char* name, Phase ph, int layer, int mb, double flops, double rows, double cols,
                        double inner, Transpose transpose, bool linear, int kernels, double weight_copies,
                        bool weight_is_output) {
  const bool low = linear && layer >= 0 && layer_low_precision(e.training, m.layers, layer);
  const PrecisionRecipe& rec = precision_recipe(e.training.precision);
  if (low && transpose == Transpose::b) {
    const std::tuple<int, int, int, int, double, double> key{layer, mb, static_cast<int>(ph), cur_chunk, rows, inner};
    if (key != last_cast_) quantize("quantize", ph, layer, mb, rows, inner);
    last_cast_ = key;
  } else if (low && transpose == Transpose::none) {
    quantize("quantize_grad", ph, layer, mb, rows, inner);
  }
  Op op;
  op.type = OpType::compute;
  op.name = name;
  op.phase = ph;
  op.pass = pass_of(ph);
  op.layer = layer;
  op.micro_batch = mb;
  op.kernel = KernelKind::gemm;
  op.flops = flops;
  // (m x k) @ (k x n): read both operands, write the result (bf16); a grouped GEMM's weight
  // (B, or the result for a weight gradient) once per expert. Quantized operands of a
  // low-precision GEMM at the recipe's bytes per element (scales included).
  // A is an activation or gradient (X, dY, X^T); B the weight, or dY for a weight gradient.
  if (low) {
    const double a_bytes = rec.activation_copy_bytes();
    const double b_bytes = transpose == Transpose::a ? rec.activation_copy_bytes() : rec.weight_copy_bytes();
    op.bytes = a_bytes * rows * inner + b_bytes * inner * cols * (weight_is_output ? 1.0 : weight_copies) +
               kAct * rows * cols * (weight_is_output ? weight_copies : 1.0);
  } else {
    op.bytes = kAct * (rows * inner + inner * cols * (weight_is_output ? 1.0 : weight_copies) +
                       rows * cols * (weight_is_output ? weight_copies : 1.0));
  }
  op.gemm.m = static_cast<int64_t>(rows);
  op.gemm.n = static_cast<int64_t>(cols);
  op.gemm.k = static_cast<int64_t>(inner);
  op.gemm_linear = linear;
  op.kernels = kernels;
  op.gemm.trans_a = transpose == Transpose::a;
  op.gemm.trans_b = transpose == Transpose::b;
  if (weight_copies > 1) {
    op.gemm_groups = static_cast<int32_t>(weight_copies);
    op.gemm_group_split_k = weight_is_output;
  }
  append_compute(op, 1.0);
}

void BlockContext::quantize(const char* name, Phase ph, int layer, int mb, double rows, double cols) {
  const PrecisionRecipe& r = precision_recipe(e.training.precision);
  const double n = rows * cols;
  // Read BF16, write the rowwise and columnwise copies; an amax pass reads it once more.
  compute(name, ph, layer, mb, KernelKind::memory, 0, n * (kAct * (r.amax_pass ? 2.0 : 1.0) + 2.0 * r.activation_copy_bytes()),
          r.amax_pass ? 2 : 1);
}

Op BlockContext::collective_op(OpType type, const char* name, Phase ph, int layer, int mb, CommKind kind,
                               Collective c, GroupKind g, double size) const {
  Op op;
  op.type = type;
  op.name = name;
  op.phase = ph;
  op.pass = pass_of(ph);
  op.layer = layer;
  op.micro_batch = mb;
  op.kind = kind;
  op.collective = c;
  op.reduce = reduce_op_for(kind, c);
  op.group = g;
  op.size_bytes = size;
  op.chunk = cur_chunk;
  // DeepEP / HybridEP dispatch and combine kernels hold their own SM count (Op::comm_sms).
  if (g == GroupKind::EP && c == Collective::AllToAll) {
    if (e.training.moe_token_dispatcher == "deepep") op.comm_sms = static_cast<int32_t>(e.training.moe_deepep_num_sms);
    if (e.training.moe_token_dispatcher == "hybridep") op.comm_sms = static_cast<int32_t>(e.training.moe_hybridep_num_sms);
  }
  return op;
}

void BlockContext::collective(const char* name, Phase ph, int layer, int mb, CommKind kind, Collective c,
                              GroupKind g, double size) {
  if (group_size(g) <= 1) return;
  sp.ops.push_back(collective_op(OpType::collective, name, ph, layer, mb, kind, c, g, size));
}

int BlockContext::issue(const char* name, Phase ph, int layer, int mb, CommKind kind, Collective c, GroupKind g,
                        double size) {
  if (group_size(g) <= 1) return -1;
  Op op = collective_op(OpType::issue, name, ph, layer, mb, kind, c, g, size);
  op.handle = sp.handles++;
  sp.ops.push_back(op);
  return op.handle;
}

void BlockContext::wait(int handle, CommKind kind, int layer, int mb, Phase ph) {
  if (handle < 0) return;
  Op op;
  op.type = OpType::wait;
  op.name = "wait";
  op.kind = kind;
  op.handle = handle;
  op.layer = layer;
  op.micro_batch = mb;
  op.phase = ph;
  op.pass = pass_of(ph);
  op.chunk = cur_chunk;
  sp.ops.push_back(op);
}

void BlockContext::p2p(OpType type, Direction dir, int mb, int chunk, int peer_stage) {
  Op op;
  op.chunk = chunk;
  op.peer_stage = peer_stage;
  op.type = type;
  op.name = type == OpType::send ? (dir == Direction::forward ? "send_activation" : "send_grad")
                                 : (dir == Direction::forward ? "recv_activation" : "recv_grad");
  op.kind = CommKind::PP;
  op.group = GroupKind::PP;
  op.dir = dir;
  op.micro_batch = mb;
  op.phase = dir == Direction::forward ? Phase::forward : Phase::backward;
  op.pass = pass_of(op.phase);
  // Megatron scatter/gather optimisation (Narayanan 2021 Sec 4.1): each TP rank sends
  // 1/t of the activation; with sequence parallel the tensor is already 1/t.
  op.size_bytes = kAct * b * s * h / t;
  op.chunk = cur_chunk;
  sp.ops.push_back(op);
  if (type == OpType::recv && !sp_on && l.tp > 1)
    collective("pp_tp_allgather", op.phase, -1, mb, CommKind::TP, Collective::AllGather, GroupKind::TP, kAct * b * s * h);
}

void BlockContext::mark_dynamic(size_t from) {
  if (m.moe.capacity_factor > 0 && m.moe.pad_to_capacity) return;
  for (size_t i = from; i < sp.ops.size(); ++i) sp.ops[i].dynamic_shape = true;
}

void BlockContext::overlap_with_gemm(int32_t splits) {
  if (!e.training.tp_comm_overlap || sp.ops.empty()) return;
  Op& op = sp.ops.back();
  op.overlap_splits = splits;
  op.handle = sp.handles++;
}

void BlockContext::ring_blocks() {
  if (l.cp > 2 && !sp.ops.empty() && sp.ops.back().type == OpType::wait)
    sp.ops.back().overlap_splits = static_cast<int32_t>(l.cp);
}

int64_t BlockContext::group_size(GroupKind g) const {
  switch (g) {
    case GroupKind::TP: return l.tp;
    case GroupKind::CP: return l.cp;
    case GroupKind::DP: return l.dp;
    case GroupKind::PP: return l.pp;
    case GroupKind::DPxCP: return l.dp * l.cp;
    case GroupKind::MIRROR: return l.pp > 1 && 2 * sp.stage + 1 != l.pp ? 2 : 1;
    case GroupKind::EMB: return l.pp > 1 && (sp.stage == 0 || sp.stage == l.pp - 1) ? 2 : 1;
    case GroupKind::EP: return l.ep;
    case GroupKind::ETP: return l.expert_tp();
    case GroupKind::EDP: return l.edp();
  }
  return 1;
}

void BlockContext::tp_enter(Phase ph, int layer, int mb, const char* name, bool te_overlap) {
  // Forward: SP AllGathers the sequence-sharded norm output (g). No SP: identity.
  if (sp_on) {
    collective(name, ph, layer, mb, CommKind::TP, Collective::AllGather, GroupKind::TP, kAct * b * s * h);
    if (te_overlap) overlap_with_gemm(static_cast<int32_t>(l.tp));  // TE "qkv_fprop"/"fc1_fprop"
  }
}

void BlockContext::tp_exit(Phase ph, int layer, int mb, const char* name) {
  // Forward: SUM of the row-parallel partial outputs (AllReduce, or ReduceScatter with SP).
  collective(name, ph, layer, mb, CommKind::TP, sp_on ? Collective::ReduceScatter : Collective::AllReduce,
             GroupKind::TP, kAct * b * s * h);
  if (sp_on) overlap_with_gemm(kTeReduceScatterSplits);  // TE "proj_fprop"/"fc2_fprop": pipeline
}

void BlockContext::tp_gather_output_grad(int layer, int mb) {
  if (!sp_on) return;
  collective("tp_allgather", Phase::backward, layer, mb, CommKind::TP, Collective::AllGather, GroupKind::TP,
             kAct * (b * s) * h);
  overlap_with_gemm(static_cast<int32_t>(l.tp));  // TE "fc2_dgrad" / "proj_dgrad": ring_exchange
}

}  // namespace dtsim::blocks
