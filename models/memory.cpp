#include "models/memory.hpp"

#include <algorithm>
#include <string>

#include "models/errors.hpp"
#include "models/flops.hpp"

namespace dtsim {

namespace {

double d(int64_t v) { return static_cast<double>(v); }

void check_layout(const Layout& l) {
  if (l.dp < 1 || l.tp < 1 || l.cp < 1 || l.pp < 1)
    throw InputError("layout: dp=" + std::to_string(l.dp) + " tp=" + std::to_string(l.tp) +
                     " cp=" + std::to_string(l.cp) + " pp=" + std::to_string(l.pp) +
                     " must all be >= 1");
  if (l.zero_stage < 0 || l.zero_stage > 3)
    throw InputError("layout.zero_stage=" + std::to_string(l.zero_stage) + " must be 0, 1, 2 or 3");
}

// Parts of one layer's stored activations (Korthikanti 2022 Sec 4.1), bytes, one micro-batch,
// before any TP division. `whole` is kept on every TP rank without SP; `sharded` is split
// over TP; `scores` is the 5 a s s_kv b attention-score term (split over TP).
struct LayerParts {
  double whole = 0;
  double sharded = 0;
  double scores = 0;
};

LayerParts layer_parts(const ModelSpec& m, double s, int64_t b, double s_kv) {
  const double sb = s * d(b);
  const double h = d(m.hidden), f = d(m.ffn_hidden);
  const double qw = d(m.heads * m.head_dim()), kvw = d(m.kv_heads * m.head_dim());
  LayerParts p;
  // 2 norm inputs (2sbh each), attention input 2sbh, attention dropout mask sbh,
  // MLP input 2sbh, MLP dropout mask sbh: 10sbh.
  p.whole = 10.0 * sb * h;
  // Q 2sb*qw, K and V 2sb*kvw each, out-proj input 2sb*qw.
  const double attention = 2.0 * sb * qw + 4.0 * sb * kvw + 2.0 * sb * qw;
  // gelu: fc1 output (GeLU input) 2sbf + GeLU output 2sbf = 4sbf (= 16sbh for f = 4h).
  // swiglu: fc1 output [up, gate] 4sbf saved by the fused SwiGLU + its output 2sbf = 6sbf.
  const double mlp = (m.activation == Activation::swiglu ? 6.0 : 4.0) * sb * f;
  p.sharded = attention + mlp;
  // softmax output (2 B) + dropout mask (1 B) + dropout output (2 B) per score.
  p.scores = 5.0 * d(m.heads) * s * s_kv * d(b);
  return p;
}

}  // namespace

BytesPerParameter bytes_per_parameter(Framework f) {
  switch (f) {
    case Framework::megatron:
      return {2.0, 4.0, 12.0};  // Megatron Core docs, distributed optimizer: 18 B/param
    case Framework::zero_paper:
    case Framework::deepspeed:
      return {2.0, 2.0, 12.0};  // ZeRO Sec 3.1: 2 + 2 + K, K = 12
  }
  return {2.0, 4.0, 12.0};
}

ModelStateBytes model_state_bytes(double params, const Layout& l, Framework f) {
  check_layout(l);
  if (params < 0) throw InputError("model_state_bytes: negative parameter count");
  const BytesPerParameter bpp = bytes_per_parameter(f);
  const double n = d(l.dp) * d(l.cp);  // ZeRO group: ranks holding the same weights
  ModelStateBytes out;
  out.params_bytes = params * bpp.params / (l.zero_stage >= 3 ? n : 1.0);
  out.grads_bytes = params * bpp.grads / (l.zero_stage >= 2 ? n : 1.0);
  out.optimizer_bytes = params * bpp.optimizer / (l.zero_stage >= 1 ? n : 1.0);
  if (f == Framework::deepspeed)
    out.step_transient_bytes = params * 4.0 / (l.zero_stage >= 1 ? n : 1.0);
  return out;
}

double korthikanti_table2_layer_bytes(int64_t s_, int64_t b_, int64_t h_, int64_t a_, int64_t t_,
                                      bool sequence_parallel, Recompute r) {
  if (t_ < 1) throw InputError("korthikanti_table2_layer_bytes: t must be >= 1");
  const double s = d(s_), b = d(b_), h = d(h_), a = d(a_), t = d(t_);
  const double sbh = s * b * h;
  switch (r) {
    case Recompute::none:
      return sequence_parallel ? sbh * (34.0 / t + 5.0 * a * s / (h * t))
                               : sbh * (10.0 + 24.0 / t + 5.0 * a * s / (h * t));
    case Recompute::selective:
      return sequence_parallel ? 34.0 * sbh / t : sbh * (10.0 + 24.0 / t);
    case Recompute::full:
      return 2.0 * sbh;
  }
  return 0.0;
}

double layer_activation_bytes(const ModelSpec& m, double s, int64_t b, double s_kv, int64_t t,
                              bool sequence_parallel, Recompute r, bool flash_attention) {
  if (t < 1) throw InputError("layout.tp=" + std::to_string(t) + " must be >= 1");
  if (s < 0 || s_kv < 0 || b < 0) throw InputError("layer_activation_bytes: negative s, s_kv or b");
  if (m.hidden <= 0 || m.heads <= 0 || m.kv_heads <= 0 || m.ffn_hidden <= 0)
    throw InputError("model '" + m.name + "': hidden, heads, kv_heads and ffn_hidden must be positive");
  const double tt = d(t);
  if (r == Recompute::full) {
    const double input = 2.0 * s * d(b) * d(m.hidden);
    return sequence_parallel ? input / tt : input;
  }
  const LayerParts p = layer_parts(m, s, b, s_kv);
  const double scores = (flash_attention || r == Recompute::selective) ? 0.0 : p.scores;
  return sequence_parallel ? (p.whole + p.sharded + scores) / tt : p.whole + (p.sharded + scores) / tt;
}

int64_t inflight_microbatches(int64_t pp, int64_t stage, int64_t accumulation) {
  if (pp < 1 || stage < 0 || stage >= pp)
    throw InputError("pipeline stage " + std::to_string(stage) + " is outside [0, pp=" +
                     std::to_string(pp) + ")");
  if (accumulation < 1)
    throw InputError("gradient accumulation steps = " + std::to_string(accumulation) + " must be >= 1");
  return std::min(pp - stage, accumulation);
}

double interleaved_activation_factor(int64_t pp, int64_t virtual_stages) {
  if (pp < 1 || virtual_stages < 1)
    throw InputError("interleaved_activation_factor: pp and virtual_stages must be >= 1");
  if (pp == 1 || virtual_stages == 1) return 1.0;  // plain 1F1B: L layers (Eq. 5)
  return 1.0 + d(pp - 1) / (d(pp) * d(virtual_stages));
}

ActivationBreakdown stage_activations(const Experiment& e, int64_t stage) {
  const ModelSpec& m = e.model;
  const Layout& l = e.layout;
  const Training& tr = e.training;
  check_layout(l);
  if (tr.seq_len <= 0 || tr.micro_batch <= 0 || tr.global_batch <= 0)
    throw InputError("training: seq_len=" + std::to_string(tr.seq_len) + ", micro_batch=" +
                     std::to_string(tr.micro_batch) + " and global_batch=" +
                     std::to_string(tr.global_batch) + " must be positive");
  const int64_t accumulation = tr.accumulation(l);
  if (accumulation < 1)
    throw InputError("training.global_batch=" + std::to_string(tr.global_batch) +
                     " is smaller than micro_batch * dp = " + std::to_string(tr.micro_batch * l.dp));
  const int64_t layers = stage_layer_count(m, l, stage);

  const double s = d(tr.seq_len) / d(l.cp);  // local tokens of a sequence (CP splits it)
  const double s_kv = d(tr.seq_len);         // a rank's queries see every key
  const int64_t b = tr.micro_batch;
  const double t = d(l.tp);
  const bool sp = l.sequence_parallel;
  const double sbh = s * d(b) * d(m.hidden);

  ActivationBreakdown out;
  out.inflight = inflight_microbatches(l.pp, stage, accumulation);
  const double per_layer =
      layer_activation_bytes(m, s, b, s_kv, l.tp, sp, l.recompute, tr.flash_attention);
  out.layers_bytes = d(out.inflight) * d(layers) * per_layer;

  if (layers > 0 && l.recompute == Recompute::full) {
    out.recompute_working_bytes =
        layer_activation_bytes(m, s, b, s_kv, l.tp, sp, Recompute::none, tr.flash_attention) - per_layer;
  } else if (layers > 0 && l.recompute == Recompute::selective && !tr.flash_attention) {
    out.recompute_working_bytes =
        layer_activation_bytes(m, s, b, s_kv, l.tp, sp, Recompute::none, false) - per_layer;
  }

  if (stage == 0) out.embedding_bytes = d(out.inflight) * (sp ? sbh / t : sbh);
  if (stage == l.pp - 1) {
    const double norm_and_head_inputs = 4.0 * sbh;
    const double logits_fp32 = 4.0 * s * d(b) * d(m.vocab) / t;
    out.output_bytes = (sp ? norm_and_head_inputs / t : norm_and_head_inputs) + logits_fp32;
  }
  return out;
}

MemoryBreakdown stage_memory(const Experiment& e, int64_t stage) {
  const Layout& l = e.layout;
  check_layout(l);
  const double params = stage_parameters_per_rank(e.model, l, e.training.seq_len, stage);
  const ModelStateBytes ms = model_state_bytes(params, l, e.training.framework);
  const ActivationBreakdown act = stage_activations(e, stage);

  MemoryBreakdown mb;
  mb.params_bytes = ms.params_bytes;
  mb.grads_bytes = ms.grads_bytes;
  mb.optimizer_bytes = ms.optimizer_bytes;
  mb.activations_bytes = act.total();
  mb.other_bytes = ms.step_transient_bytes;
  if (l.zero_stage >= 3) {
    // Current + prefetched layer, gathered whole over DP x CP (still TP-sharded), 16-bit.
    const int64_t layers = stage_layer_count(e.model, l, stage);
    const double gathered_layers = static_cast<double>(std::min<int64_t>(2, layers));
    mb.other_bytes += gathered_layers * layer_parameters_per_tp_rank(e.model, l.tp) *
                      bytes_per_parameter(e.training.framework).params;
  }
  mb.peak_bytes = mb.params_bytes + mb.grads_bytes + mb.optimizer_bytes + mb.activations_bytes +
                  mb.other_bytes;
  mb.capacity_bytes = e.cluster.gpu.hbm_bytes - e.cluster.hbm_reserve_bytes;
  mb.fits = mb.peak_bytes <= mb.capacity_bytes;
  return mb;
}

}  // namespace dtsim
