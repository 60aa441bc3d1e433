#include "models/memory.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "models/blocks/layer.hpp"
#include "models/errors.hpp"
#include "models/flops.hpp"
#include "models/moe.hpp"
#include "models/pipeline_split.hpp"
#include "models/precision.hpp"
#include "models/plan.hpp"
#include "models/schedules/schedule.hpp"
#include "models/zero3.hpp"

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

}  // namespace

constexpr double kBytes16 = 2.0;  // bf16 / fp16 element

BytesPerParameter bytes_per_parameter(Framework f) {
  switch (f) {
    case Framework::megatron:
      return {2.0, 4.0, 12.0};  // Megatron Core docs, distributed optimizer: 18 B/param
    case Framework::zero_paper:
    case Framework::deepspeed:
      return {2.0, 2.0, 12.0};  // ZeRO Sec 3.1: 2 + 2 + K, K = 12
    case Framework::fsdp:
      // PyTorch FSDP2 with MixedPrecisionPolicy(param_dtype=bf16): the sharded parameters
      // stay fp32 and are the optimizer's (4), their gradients fp32 (4: reduce-scattered in
      // reduce_dtype, then accumulated into the sharded fp32 grad, _fsdp_param_group.py
      // post_backward / foreach_reduce), Adam's m and v (8); the bf16 copy exists only
      // while a unit is gathered (StageBuffers::zero3_gathered_bytes).
      return {4.0, 4.0, 8.0};
  }
  return {2.0, 4.0, 12.0};
}

BytesPerParameter bytes_per_parameter(Framework f, GradDtype main_grad) {
  BytesPerParameter b = bytes_per_parameter(f);
  if (f != Framework::fsdp) b.grads = main_grad == GradDtype::fp32 ? 4.0 : 2.0;  // FSDP2 keeps its sharded grads fp32
  return b;
}

double dp_grad_bytes_per_param(const Training& t) { return bytes_per_parameter(t.framework, t.main_grad).grads; }

namespace {
// What is sharded is what the plan communicates: grad_sync_policy (models/plan.hpp) is the
// fact the plan builder emits its DP collectives from. Gradients count as sharded only
// when every micro-batch's gradients are reduce-scattered in their own backward and the
// other shards freed (ZeRO-2/3); otherwise the whole buffer accumulates until the step's
// reduction (ZeRO-0/1).
ModelStateBytes model_states(double params, const Layout& l, Framework f, const BytesPerParameter& bpp,
                             const GradSyncPolicy& g, double group = 0) {
  check_layout(l);
  if (params < 0) throw InputError("model_state_bytes: negative parameter count");
  // ZeRO group: ranks holding the same weights (DP x CP; for routed experts the
  // expert-data-parallel group, `group`).
  const double n = group > 0 ? group : d(l.dp) * d(l.cp);
  ModelStateBytes out;
  out.params_bytes = params * bpp.params / (g.sharded_params ? n : 1.0);
  out.grads_bytes = params * bpp.grads / (g.sharded_grads && g.every_micro_batch ? n : 1.0);
  out.optimizer_bytes = params * bpp.optimizer / (g.sharded_optimizer ? n : 1.0);
  if (f == Framework::deepspeed)
    out.step_transient_bytes = params * 4.0 / (g.sharded_optimizer ? n : 1.0);
  return out;
}
}  // namespace

ModelStateBytes model_state_bytes(double params, const Layout& l, Framework f) {
  Training t;
  t.framework = f;
  return model_states(params, l, f, bytes_per_parameter(f), grad_sync_policy(l, t));
}

ModelStateBytes model_state_bytes(double params, const Layout& l, const Training& t) {
  return model_states(params, l, t.framework, bytes_per_parameter(t.framework, t.main_grad), grad_sync_policy(l, t));
}

ModelStateBytes model_state_bytes(double dense_params, double expert_params, const Layout& l, const Training& t) {
  const BytesPerParameter bpp = bytes_per_parameter(t.framework, t.main_grad);
  const GradSyncPolicy g = grad_sync_policy(l, t);
  ModelStateBytes out = model_states(dense_params, l, t.framework, bpp, g);
  if (expert_params <= 0) return out;
  const ModelStateBytes ex = model_states(expert_params, l, t.framework, bpp, g, d(l.edp()));
  out.params_bytes += ex.params_bytes;
  out.grads_bytes += ex.grads_bytes;
  out.optimizer_bytes += ex.optimizer_bytes;
  out.step_transient_bytes += ex.step_transient_bytes;
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
  // The sum of the terms the layer's blocks declare (models/blocks/: norm.cpp, attention.cpp,
  // mlp.cpp; Korthikanti 2022 Sec 4.1 per block). Every layer is the same dense layer today.
  const blocks::ActivationShape a{m, s, d(b), s_kv, flash_attention};
  return blocks::ModelBlocks(m).layer(0).activation_bytes(a, t, sequence_parallel, r);
}

double stage_layer_activation_bytes(const Experiment& e, int64_t stage, Recompute r, bool flash_attention) {
  // Under a low-precision recipe the GEMM inputs a layer keeps for its weight gradient are
  // its quantized columnwise copies (models/precision.hpp; ActivationTerm::gemm_input): the
  // mean over the stage's layers of the low-precision and BF16 layers' bytes.
  const double low = stage_low_precision_fraction(e, stage);
  if (low <= 0) return stage_layer_activation_bytes(e, stage, r, flash_attention, 1.0);
  const double scale = precision_recipe(e.training.precision).activation_copy_bytes() / 2.0;
  const double quantized = stage_layer_activation_bytes(e, stage, r, flash_attention, scale);
  if (low >= 1) return quantized;
  return low * quantized + (1.0 - low) * stage_layer_activation_bytes(e, stage, r, flash_attention, 1.0);
}

double stage_layer_activation_bytes(const Experiment& e, int64_t stage, Recompute r, bool flash_attention,
                                    double gemm_input_scale) {
  const ModelSpec& m = e.model;
  const Layout& l = e.layout;
  const Training& tr = e.training;
  const auto kinds = stage_layer_kinds(m, l, stage);
  int64_t layers = 0;
  for (int64_t n : kinds) layers += n;
  const double s = d(tr.seq_len) / d(l.cp), s_kv = d(tr.seq_len);
  if ((kinds[0] == layers || layers == 0) && gemm_input_scale == 1.0)
    return layer_activation_bytes(m, s, tr.micro_batch, s_kv, l.tp, l.sequence_parallel, r, flash_attention);
  // Layers differ (MoE, local attention): the mean over the stage's layers, each kind's
  // routed-token tensors at the busiest rank's load (models/moe.hpp).
  blocks::ActivationShape a{m, s, d(tr.micro_batch), s_kv, flash_attention};
  a.moe_load = moe_load_factor(m.moe, l);
  a.gemm_input_scale = gemm_input_scale;
  if (layers == 0) return 0.0;
  const blocks::ModelBlocks mb(m);
  double sum = 0;
  for (int k = 0; k < blocks::kLayerKinds; ++k)
    if (kinds[static_cast<size_t>(k)] > 0)
      sum += d(kinds[static_cast<size_t>(k)]) * mb.kind(k).activation_bytes(a, l.tp, l.sequence_parallel, r);
  return sum / d(layers);
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

PipelineInflight pipeline_inflight(const Layout& l, int64_t layers, int64_t stage, int64_t accumulation,
                                   bool combined_1f1b) {
  const int64_t p = l.pp, m = accumulation;
  if (p < 1 || stage < 0 || stage >= p)
    throw InputError("pipeline stage " + std::to_string(stage) + " is outside [0, pp=" + std::to_string(p) + ")");
  if (m < 1)
    throw InputError("gradient accumulation steps = " + std::to_string(m) + " must be >= 1");
  const bool interleaved = l.schedule == Schedule::interleaved;
  const int64_t v = interleaved ? l.vp : 1;
  if (v < 1) throw InputError("layout.vp=" + std::to_string(l.vp) + " must be >= 1");
  if (!has_pipeline_split_options(l) && (layers < p || (v > 1 && layers % (p * v) != 0)))
    throw InputError("model.layers=" + std::to_string(layers) + " cannot be split over layout.pp*vp=" +
                     std::to_string(p * v) + " (interleaving needs pp*vp | layers; every stage needs a layer)");
  // The rank's chunks as models/pipeline_split.hpp splits them (possibly uneven).
  std::vector<int64_t> chunk_layers;
  if (v > 1) {
    for (int64_t c = 0; c < v; ++c)
      chunk_layers.push_back(virtual_stage(layers, l, virtual_stage_of(l, stage, c)).layers);
  } else {
    chunk_layers.push_back(rank_split(layers, l, stage).layers);  // the whole stage is one chunk
  }
  PipelineInflight out;
  out.chunk_layers = *std::max_element(chunk_layers.begin(), chunk_layers.end());
  // The combined 1F1B walks its order below (one more warm-up forward).
  if (!combined_1f1b) switch (l.schedule) {
    case Schedule::gpipe:
      out.warmup = m;
      out.chunks = m;
      out.first_chunk_microbatches = m;
      out.held_layers = m * chunk_layers.front();
      return out;
    case Schedule::one_f_one_b:
      out.warmup = std::min(p - stage - 1, m);
      out.chunks = std::min(p - stage, m);
      out.first_chunk_microbatches = out.chunks;
      out.held_layers = out.chunks * chunk_layers.front();
      return out;
    case Schedule::interleaved: {
      const int64_t total = m * v;
      out.warmup = std::min((p - stage - 1) * 2 + (v - 1) * p, total);
      out.chunks = std::min(out.warmup + 1, total);
      // Forward k runs model chunk (k mod p v) / p: count each chunk's forwards among the
      // first `chunks`, and hold each one's own layers.
      const int64_t group = p * v;
      for (int64_t c = 0; c < v; ++c) {
        const int64_t n = (out.chunks / group) * p + std::clamp<int64_t>(out.chunks % group - c * p, 0, p);
        if (c == 0) out.first_chunk_microbatches = n;
        out.held_layers += n * chunk_layers[static_cast<size_t>(c)];
      }
      return out;
    }
    default: break;
  }
  // Any other schedule: walk the rank's order (models/schedules/). A chunk's activations of
  // a micro-batch are held from its F to its BW, or to its W when the backward is split
  // (sched::OrderStats); the peak is the most layer activations held at once.
  const sched::PipelineSchedule& sch = sched::schedule_of(l.schedule);
  const sched::Dims dims{l.pp, l.vp, m, combined_1f1b};
  const auto order = sch.order(dims)[static_cast<size_t>(stage)];
  std::vector<int64_t> layers_of;
  for (int64_t c = 0; c < sch.chunks(dims); ++c)
    layers_of.push_back(virtual_stage(layers, l, sch.virtual_stage(dims, stage, c)).layers);
  out.chunk_layers = *std::max_element(layers_of.begin(), layers_of.end());
  out.warmup = sched::order_stats(order).warmup;
  int64_t live = 0, live0 = 0, held = 0;
  for (const sched::Step& st : order) {
    const int64_t n = layers_of[static_cast<size_t>(st.chunk)];
    if (st.pass == sched::Pass::F) {
      ++live;
      live0 += st.chunk == 0 ? 1 : 0;
      held += n;
      if (held > out.held_layers || (held == out.held_layers && live > out.chunks)) {
        out.held_layers = held;
        out.chunks = live;
        out.first_chunk_microbatches = live0;
      }
    } else if (st.pass == sched::Pass::BW || st.pass == sched::Pass::W) {
      --live;
      live0 -= st.chunk == 0 ? 1 : 0;
      held -= n;
    }
  }
  return out;
}

double ActivationBreakdown::inflight_microbatches() const {
  return stage_layers > 0 ? d(held_layers) / d(stage_layers) : 0.0;
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

  ActivationBreakdown out;
  const PipelineInflight pin =
      pipeline_inflight(l, m.layers, stage, accumulation, e.training.overlap_moe_expert_parallel_comm);
  out.inflight = pin.chunks;
  out.chunk_layers = pin.chunk_layers;
  out.held_layers = pin.held_layers;
  out.stage_layers = layers;
  out.warmup = pin.warmup;
  const double per_layer = stage_layer_activation_bytes(e, stage, l.recompute, tr.flash_attention);
  out.per_layer_bytes = per_layer;
  out.layers_bytes = d(pin.held_layers) * per_layer;

  if (layers > 0 && l.recompute == Recompute::full) {
    out.recompute_working_bytes = stage_layer_activation_bytes(e, stage, Recompute::none, tr.flash_attention) - per_layer;
  } else if (layers > 0 && l.recompute == Recompute::selective && !tr.flash_attention) {
    out.recompute_working_bytes = stage_layer_activation_bytes(e, stage, Recompute::none, false) - per_layer;
  }

  // The embedding's and the LM head's terms (models/blocks/embedding.cpp, lm_head.cpp;
  // Korthikanti 2022 Sec 4.3): sequence terms / t with SP, tensor terms / t.
  const RankSplit holds = rank_split(m.layers, l, stage);
  const blocks::ActivationShape shape{m, s, d(b), s_kv, tr.flash_attention};
  const blocks::ModelBlocks model(m);
  auto kept = [&](const blocks::Block& block) {
    std::vector<blocks::ActivationTerm> terms;
    block.activation_terms(shape, terms);
    return blocks::sum_activation_terms(terms);
  };
  if (holds.embedding) {
    const blocks::ActivationSums emb = kept(model.embedding());
    out.embedding_bytes = d(pin.first_chunk_microbatches) *
                          ((sp ? emb.sequence / t : emb.sequence) + (emb.tensor + emb.selective) / t);
  }
  if (holds.loss) {
    const blocks::ActivationSums head = kept(model.head());
    const double head_bytes = (sp ? head.sequence / t : head.sequence) + (head.tensor + head.selective) / t;
    out.output_bytes = head_bytes;
    // Each MTP depth (models/blocks/mtp.hpp) keeps its entry's inputs, its layer's
    // activations (under the layout's recomputation, as a decoder layer) and its own head's,
    // for the micro-batch whose loss runs, as the model's head above.
    if (m.mtp_layers > 0) {
      const blocks::ActivationSums entry = kept(model.mtp_entry());
      const double entry_bytes = (sp ? entry.sequence / t : entry.sequence) + (entry.tensor + entry.selective) / t;
      blocks::ActivationShape routed = shape;
      routed.moe_load = moe_load_factor(m.moe, l);
      const double layer_bytes = model.layer(m.layers).activation_bytes(routed, l.tp, sp, l.recompute);
      out.mtp_bytes = d(m.mtp_layers) * (entry_bytes + layer_bytes + head_bytes);
    }
  }
  return out;
}

StageBuffers stage_buffers(const Experiment& e, int64_t stage) {
  const Layout& l = e.layout;
  const Training& tr = e.training;
  check_layout(l);
  StageBuffers out;
  const double params = stage_parameters_per_rank(e.model, l, tr.seq_len, stage);
  const double expert = stage_expert_parameters_per_rank(e.model, l, stage);
  const ModelStateBytes ms = model_state_bytes(params - expert, expert, l, tr);
  out.step_transient_bytes = ms.step_transient_bytes;
  const int64_t layers = stage_layer_count(e.model, l, stage);
  // The largest layer of the stage on one rank (a MoE layer holds its E / ep experts too).
  double layer = e.model.moe.enabled() ? 0.0 : layer_parameters_per_tp_rank(e.model, l.tp);
  if (e.model.moe.enabled()) {
    const auto kinds = stage_layer_kinds(e.model, l, stage);
    const blocks::ModelBlocks mbk(e.model);
    for (int k = 0; k < blocks::kLayerKinds; ++k) {
      if (kinds[static_cast<size_t>(k)] == 0) continue;
      const blocks::Layer& ly = mbk.kind(k);
      layer = std::max(layer, ly.parameters_per_tp_rank(e.model, l.tp) +
                                  ly.parameters(e.model).expert_weights / d(l.ep * l.expert_tp()));
    }
  }
  const GradSyncPolicy g = grad_sync_policy(l, tr);
  if (g.sharded_params && g.reduced) {
    // Layers gathered one at a time, the next one prefetched: two layers. The stage's
    // non-layer parameters (embedding, final norm, LM head) stay gathered through the step
    // (models/plan.cpp finish_step, as FSDP's root unit).
    const double t = d(l.tp), h = d(e.model.hidden), vocab_rows = d(e.model.vocab) * h / t;
    // DeepSpeed keeps its trailing layers gathered from their forward into their backward
    // (models/zero3.hpp zero3_kept_layers) besides the two in flight.
    double units = d(std::min<int64_t>(layers, 2 + zero3_kept_layers(e, stage))) * layer;
    const RankSplit holds = rank_split(e.model.layers, l, stage);
    if (holds.embedding)
      units += vocab_rows + d(embedding_parameters(e.model, tr.seq_len) - e.model.vocab * e.model.hidden);
    if (holds.loss) {  // the LM head unless tied, the word embedding's copy, the MTP entries
      units += (e.model.tied_embeddings ? 0.0 : vocab_rows) +
               (loss_stage_embeds(e.model) && !holds.embedding ? vocab_rows : 0.0) + d(norm_parameters(e.model)) +
               mtp_entry_parameters_per_rank(e.model, l.tp);
    }
    out.zero3_gathered_bytes = units * kBytes16;  // 16-bit in every framework (FSDP2's param_dtype)
  }
  if (tr.cuda_graphs == CudaGraphs::layers && layers > 0) {
    const double sl = d(tr.seq_len / l.cp), b = d(tr.micro_batch);
    const double hidden = 2.0 * sl / (l.sequence_parallel && l.tp > 1 ? d(l.tp) : 1.0) * b * d(e.model.hidden);
    const double mask = b * sl * d(tr.seq_len);
    const ActivationBreakdown act = stage_activations(e, stage);
    out.cuda_graph_bytes = d(act.held_layers) * (hidden + mask);
  } else if (tr.cuda_graphs == CudaGraphs::full_iteration) {
    out.cuda_graph_bytes = 28.0 * d(tr.micro_batch) * d(tr.seq_len) * d(tr.accumulation(l));
  }
  if (const QuantizedWeights q = stage_quantized_weights(e, stage); q.total() > 0)
    out.quantized_weight_bytes =
        q.total() * precision_recipe(tr.precision).weight_copy_bytes() * (tr.fp8_param_gather ? 1.0 : 2.0);
  if (tr.framework == Framework::deepspeed && l.dp * l.cp > 1) {
    // reduce_bucket_size elements (models/plan.hpp grad_bucket_params), in the gradients' dtype.
    const double bucket = grad_bucket_params(l, tr);
    const double bytes = dp_grad_bytes_per_param(tr);
    if (l.zero_stage == 0) {
      out.grad_bucket_bytes = std::min(bucket, params) * bytes;
    } else {
      const double buffers = (tr.overlap_grad_reduce && l.pp == 1) ? 2.0 : 1.0;
      out.grad_bucket_bytes = buffers * bucket * bytes;
    }
  }
  return out;
}

MemoryBreakdown stage_memory(const Experiment& e, int64_t stage) {
  const Layout& l = e.layout;
  check_layout(l);
  const double params = stage_parameters_per_rank(e.model, l, e.training.seq_len, stage);
  const double expert = stage_expert_parameters_per_rank(e.model, l, stage);
  const ModelStateBytes ms = model_state_bytes(params - expert, expert, l, e.training);
  const ActivationBreakdown act = stage_activations(e, stage);

  MemoryBreakdown mb;
  mb.params_bytes = ms.params_bytes;
  if (e.training.fp8_param_gather) {
    // The low-precision GEMM weights are stored quantized (Megatron --fp8-param-gather /
    // --fp4-param-gather), not in BF16; sharded like every parameter under ZeRO-3.
    const QuantizedWeights q = stage_quantized_weights(e, stage);
    const GradSyncPolicy g = grad_sync_policy(l, e.training);
    const double dense = q.dense / (g.sharded_params ? d(l.dp) * d(l.cp) : 1.0);
    const double ex = q.expert / (g.sharded_params ? d(l.edp()) : 1.0);
    mb.params_bytes -= (dense + ex) * (kBytes16 - precision_recipe(e.training.precision).weight_copy_bytes());
  }
  mb.grads_bytes = ms.grads_bytes;
  mb.optimizer_bytes = ms.optimizer_bytes;
  mb.activations_bytes = act.total();
  mb.other_bytes = stage_buffers(e, stage).total();
  mb.peak_bytes = mb.params_bytes + mb.grads_bytes + mb.optimizer_bytes + mb.activations_bytes +
                  mb.other_bytes;
  mb.capacity_bytes = e.cluster.gpu.hbm_bytes - e.cluster.hbm_reserve_bytes;
  mb.fits = mb.peak_bytes <= mb.capacity_bytes;
  return mb;
}

std::vector<MemoryBreakdown> memory_per_stage(const Experiment& e) {
  check_layout(e.layout);
  std::vector<MemoryBreakdown> out;
  out.reserve(static_cast<size_t>(e.layout.pp));
  for (int64_t s = 0; s < e.layout.pp; ++s) out.push_back(stage_memory(e, s));
  return out;
}

PeakMemory peak_memory(const Experiment& e) {
  check_layout(e.layout);
  PeakMemory best;
  for (int64_t s = 0; s < e.layout.pp; ++s) {
    MemoryBreakdown mb = stage_memory(e, s);
    if (s == 0 || mb.peak_bytes > best.memory.peak_bytes) {
      best.stage = s;
      best.memory = mb;
    }
  }
  return best;
}

double memory_quantity(const MemoryBreakdown& mb, MemoryQuantity q) {
  switch (q) {
    case MemoryQuantity::model_states: return mb.params_bytes + mb.grads_bytes + mb.optimizer_bytes;
    case MemoryQuantity::activations: return mb.activations_bytes;
    case MemoryQuantity::peak: return mb.peak_bytes;
  }
  return 0;
}

}  // namespace dtsim
