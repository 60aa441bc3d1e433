#include "models/verify/tiny_model.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <string>

#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/pipeline_split.hpp"

namespace dtsim::verify {

const char* to_string(PKind k) {
  switch (k) {
    case PKind::embed_word: return "embedding.word";
    case PKind::embed_pos: return "embedding.position";
    case PKind::ln1_w: return "input_norm.weight";
    case PKind::ln1_b: return "input_norm.bias";
    case PKind::wq: return "attention.wq";
    case PKind::wk: return "attention.wk";
    case PKind::wv: return "attention.wv";
    case PKind::bq: return "attention.bq";
    case PKind::bk: return "attention.bk";
    case PKind::bv: return "attention.bv";
    case PKind::wo: return "attention.out_proj.weight";
    case PKind::bo: return "attention.out_proj.bias";
    case PKind::ln2_w: return "post_attention_norm.weight";
    case PKind::ln2_b: return "post_attention_norm.bias";
    case PKind::wu: return "mlp.up.weight";
    case PKind::bu: return "mlp.up.bias";
    case PKind::wg: return "mlp.gate.weight";
    case PKind::wd: return "mlp.down.weight";
    case PKind::bd: return "mlp.down.bias";
    case PKind::final_w: return "final_norm.weight";
    case PKind::final_b: return "final_norm.bias";
    case PKind::head_w: return "lm_head.weight";
    case PKind::router_w: return "moe.router.weight";
    case PKind::eu: return "moe.experts.up.weight";
    case PKind::eg: return "moe.experts.gate.weight";
    case PKind::ed: return "moe.experts.down.weight";
    case PKind::mla_dq: return "mla.q_down.weight";
    case PKind::mla_qnorm: return "mla.q_norm.weight";
    case PKind::mla_uq: return "mla.q_up.weight";
    case PKind::mla_dkv: return "mla.kv_down.weight";
    case PKind::mla_kvnorm: return "mla.kv_norm.weight";
    case PKind::mla_ukv: return "mla.kv_up.weight";
  }
  return "?";
}

const char* to_string(Probe p) {
  switch (p) {
    case Probe::x_in: return "layer input";
    case Probe::ln1_out: return "input_norm output";
    case Probe::ctx: return "attention output";
    case Probe::attn_out: return "out_proj output";
    case Probe::ln2_out: return "post_attention_norm output";
    case Probe::mlp_out: return "mlp_down output";
    case Probe::d_x_out: return "grad of layer output";
    case Probe::d_ln2_out: return "grad of post_attention_norm output";
    case Probe::d_x_mid: return "grad of residual after attention";
    case Probe::dq: return "dQ";
    case Probe::dk: return "dK";
    case Probe::dv: return "dV";
    case Probe::d_ln1_out: return "grad of input_norm output";
    case Probe::d_x_in: return "grad of layer input";
    case Probe::embed_out: return "embedding output";
    case Probe::final_ln_out: return "final_norm output";
    case Probe::d_final_ln_out: return "grad of final_norm output";
  }
  return "?";
}

namespace {

int64_t round_up(int64_t x, int64_t unit) { return (x + unit - 1) / unit * unit; }
constexpr int kPKinds = static_cast<int>(PKind::mla_ukv) + 1;

}  // namespace

Experiment shrink_experiment(const Experiment& e) {
  validate_experiment(e);
  Experiment s = e;
  const Layout& l = e.layout;
  const int64_t t = l.tp;
  ModelSpec& m = s.model;
  m.name = e.model.name + " (shrunk for dtsim verify)";
  const int64_t per_rank = t >= 4 ? 1 : std::min<int64_t>(2, e.model.heads / t);
  m.heads = t * per_rank;
  m.kv_heads = e.model.kv_heads < e.model.heads ? t : m.heads;
  const bool mla = e.model.mla.enabled();
  if (mla) m.kv_heads = m.heads;  // MLA: every head has its own key and value
  const int64_t hd = t >= 4 && !mla ? 2 : 4;
  m.hidden = m.heads * hd;
  m.head_dim_override = 0;  // an explicit head_dim (Qwen3: 128 with hidden / heads 64) shrinks to hd too
  if (mla) {
    // Head parts of 4 (query / key d_n + d_r, value d_v: one core for MLA and standard
    // attention), the rotary part kept when the original has one; latent ranks shrunk with
    // the hidden size (at least 3), q_lora_rank 0 kept.
    const MlaSpec& o = e.model.mla;
    auto shrink_rank = [&](int64_t r) {
      return std::max<int64_t>(3, (r * m.hidden + e.model.hidden - 1) / e.model.hidden);
    };
    m.mla.qk_rope_head_dim = o.qk_rope_head_dim > 0 ? 2 : 0;
    m.mla.qk_nope_head_dim = hd - m.mla.qk_rope_head_dim;
    m.mla.v_head_dim = hd;
    m.mla.kv_lora_rank = shrink_rank(o.kv_lora_rank);
    m.mla.q_lora_rank = o.q_lora_rank > 0 ? shrink_rank(o.q_lora_rank) : 0;
  }
  m.ffn_hidden = 2 * m.hidden;
  m.vocab = round_up(std::max<int64_t>(16, 4 * t), t);
  m.layers = l.pp * l.vp * (l.pp <= 2 ? 2 : 1);
  // Megatron-Core's split options (models/pipeline_split.hpp), shrunk to the same kind of
  // split: the fewest layers the option allows (one slot per virtual stage; one layer per chunk
  // of the first / last rank); a pipeline_layout names every layer, so it keeps them all.
  if (!l.pipeline_layout.empty()) {
    m.layers = e.model.layers;
  } else if (l.decoder_first_pipeline_num_layers > 0 || l.decoder_last_pipeline_num_layers > 0) {
    m.layers = l.pp * l.vp;
    if (l.decoder_first_pipeline_num_layers > 0) s.layout.decoder_first_pipeline_num_layers = l.vp;
    if (l.decoder_last_pipeline_num_layers > 0) s.layout.decoder_last_pipeline_num_layers = l.vp;
  } else if (l.account_for_embedding_in_pipeline_split || l.account_for_loss_in_pipeline_split) {
    const int64_t taken = (l.account_for_embedding_in_pipeline_split ? 1 : 0) + (l.account_for_loss_in_pipeline_split ? 1 : 0);
    int64_t slots = l.pp * l.vp;
    while (slots - taken < 1) slots += l.pp * l.vp;
    m.layers = slots - taken;
  }
  const int64_t unit = l.cp * (l.sequence_parallel && t > 1 ? t : 1);
  s.training.seq_len = round_up(std::max<int64_t>(4, 2 * l.cp), unit);
  m.max_position_embeddings = m.position == Position::learned ? s.training.seq_len : 0;
  s.training.micro_batch = std::min<int64_t>(e.training.micro_batch, 2);
  // Interleaving needs the micro-batches to be a multiple of pp (Megatron-LM): use pp.
  // DualPipe / DualPipeV need at least 2 pp (an even number for DualPipe): use 2 pp.
  const bool dual = l.schedule == Schedule::dualpipe || l.schedule == Schedule::dualpipev;
  const int64_t accum = l.schedule == Schedule::interleaved ? l.pp
                        : dual                              ? 2 * l.pp
                                                            : std::min<int64_t>(e.training.accumulation(l), 4);
  s.training.global_batch = s.training.micro_batch * l.dp * accum;
  if (e.model.moe.enabled()) {
    MoeSpec& moe = m.moe;
    const MoeSpec& o = e.model.moe;
    const int64_t ep = l.ep, etp = l.expert_tp();
    const int64_t small = round_up(std::max<int64_t>(2 * ep, 4), ep);
    moe.num_experts = o.num_experts <= small && o.num_experts % ep == 0 ? o.num_experts : small;
    moe.router_topk = std::min(o.router_topk, std::max<int64_t>(1, moe.num_experts / 2));
    moe.moe_ffn_hidden = 2 * etp;
    moe.shared_expert_ffn_hidden = o.shared_expert_ffn_hidden > 0 ? m.hidden : 0;
    moe.first_k_dense = o.first_k_dense > 0 && m.layers >= 2 ? 1 : 0;
    moe.layer_freq = std::min<int64_t>(o.layer_freq, 2);
    if (!o.layer_pattern.empty()) {
      const size_t n = static_cast<size_t>(m.layers), k = o.layer_pattern.size();
      bool dense = false, sparse = false;
      for (uint8_t v : o.layer_pattern) (v ? sparse : dense) = true;
      moe.layer_pattern.assign(n, 0);
      for (size_t i = 0; i < n; ++i) moe.layer_pattern[i] = o.layer_pattern[std::min(k - 1, i * k / n)] ? 1 : 0;
      bool nd = false, ns = false;
      for (uint8_t v : moe.layer_pattern) (v ? ns : nd) = true;
      if (dense && sparse && n >= 2 && !(nd && ns)) moe.layer_pattern[n - 1] = nd ? 1 : 0;
    }
    moe.router_expert_bias = false;
    moe.router_num_groups = 0;
    moe.router_group_topk = 0;
  }
  validate_experiment(s);
  return s;
}

TinyModel::TinyModel(const Experiment& shrunk) : exp(shrunk) {
  const ModelSpec& m = exp.model;
  V = m.vocab;
  h = m.hidden;
  heads = m.heads;
  kv_heads = m.kv_heads;
  hd = m.head_dim();
  ffn = m.ffn_hidden;
  layers = m.layers;
  seq = exp.training.seq_len;
  micro_batch = exp.training.micro_batch;
  accumulation = exp.training.accumulation(exp.layout);
  samples = exp.training.global_batch;
  bias = m.activation == Activation::gelu;  // models/flops.hpp: has_linear_biases
  layernorm = m.norm == Norm::layernorm;
  learned_pos = m.position == Position::learned;
  rope = m.position == Position::rope;
  tied = m.tied_embeddings;
  swiglu = m.activation == Activation::swiglu;
  if (h != heads * hd) throw InputError("verify: the tiny model needs hidden = heads * head_dim");
  if (m.moe.enabled()) {
    experts = m.moe.num_experts;
    topk = m.moe.router_topk;
    fe = m.moe.moe_ffn_hidden;
    fs = m.moe.shared_expert_ffn_hidden;
    sigmoid_router = m.moe.router_score == RouterScore::sigmoid;
    moe_layers.assign(static_cast<size_t>(layers), 0);
    for (int64_t l = 0; l < layers; ++l) moe_layers[static_cast<size_t>(l)] = m.moe.is_moe_layer(l) ? 1 : 0;
  }
  if (rope && hd % 2 != 0) throw InputError("verify: RoPE needs an even head_dim");
  if (m.mla.enabled()) {
    mla = true;
    dq = m.mla.q_lora_rank;
    dc = m.mla.kv_lora_rank;
    dn = m.mla.qk_nope_head_dim;
    dr = m.mla.qk_rope_head_dim;
    dv = m.mla.v_head_dim;
    q_in = dq > 0 ? dq : h;
    if (dn + dr != hd || dv != hd || kv_heads != heads || (rope && dr % 2 != 0))
      throw InputError("verify: the tiny MLA model needs qk_nope + qk_rope = v_head = head_dim, kv_heads = heads and "
                       "an even qk_rope_head_dim (shrink_experiment)");
  }
  auto add = [&](PKind k, int layer, int64_t r, int64_t c) {
    segs.push_back(PSeg{k, layer, r, c, total_params});
    total_params += r * c;
  };
  add(PKind::embed_word, -1, V, h);
  if (learned_pos) add(PKind::embed_pos, -1, seq, h);
  for (int l = 0; l < static_cast<int>(layers); ++l) {
    add(PKind::ln1_w, l, 1, h);
    if (layernorm) add(PKind::ln1_b, l, 1, h);
    if (mla) {
      if (dq > 0) {
        add(PKind::mla_dq, l, h, dq);
        add(PKind::mla_qnorm, l, 1, dq);
      }
      add(PKind::mla_uq, l, q_in, heads * hd);
      add(PKind::mla_dkv, l, h, dc + dr);
      add(PKind::mla_kvnorm, l, 1, dc);
      add(PKind::mla_ukv, l, dc, heads * (dn + dv));
    } else {
      add(PKind::wq, l, h, heads * hd);
      add(PKind::wk, l, h, kv_heads * hd);
      add(PKind::wv, l, h, kv_heads * hd);
    }
    if (bias) {
      add(PKind::bq, l, 1, heads * hd);
      add(PKind::bk, l, 1, kv_heads * hd);
      add(PKind::bv, l, 1, kv_heads * hd);
    }
    add(PKind::wo, l, heads * hd, h);
    if (bias) add(PKind::bo, l, 1, h);
    add(PKind::ln2_w, l, 1, h);
    if (layernorm) add(PKind::ln2_b, l, 1, h);
    if (moe_layer(l)) {
      add(PKind::router_w, l, h, experts);
      add(PKind::eu, l, experts * h, fe);
      add(PKind::eg, l, experts * h, fe);
      add(PKind::ed, l, experts * fe, h);
      if (fs > 0) {  // the shared expert: a SwiGLU MLP of fs (validated: MoE models are SwiGLU)
        add(PKind::wu, l, h, fs);
        add(PKind::wg, l, h, fs);
        add(PKind::wd, l, fs, h);
      }
      continue;
    }
    add(PKind::wu, l, h, ffn);
    if (bias) add(PKind::bu, l, 1, ffn);
    if (swiglu) add(PKind::wg, l, h, ffn);
    add(PKind::wd, l, ffn, h);
    if (bias) add(PKind::bd, l, 1, h);
  }
  add(PKind::final_w, -1, 1, h);
  if (layernorm) add(PKind::final_b, -1, 1, h);
  if (!tied) add(PKind::head_w, -1, V, h);
  seg_index_.assign(static_cast<size_t>((layers + 1) * kPKinds), -1);
  for (size_t i = 0; i < segs.size(); ++i)
    seg_index_[static_cast<size_t>((segs[i].layer + 1) * kPKinds + static_cast<int>(segs[i].kind))] =
        static_cast<int>(i);
}

int TinyModel::find(PKind k, int layer) const {
  const int64_t ix = static_cast<int64_t>(layer + 1) * kPKinds + static_cast<int>(k);
  if (layer < -1 || ix < 0 || ix >= static_cast<int64_t>(seg_index_.size())) return -1;
  return seg_index_[static_cast<size_t>(ix)];
}

const PSeg& TinyModel::seg(PKind k, int layer) const {
  const int i = find(k, layer);
  if (i < 0)
    throw InputError(std::string("verify: the tiny model has no parameter ") + to_string(k) + " in layer " +
                     std::to_string(layer));
  return segs[static_cast<size_t>(i)];
}

bool TinyModel::has(PKind k, int layer) const { return find(k, layer) >= 0; }

/// Which tensors of a streamed step are final. The computing thread stores a tensor, then
/// sets its flag (release) and bumps `ticks`; readers check the flag (acquire) and sleep on
/// `ticks` (C++20 atomic wait) until it is set, the step is done or it failed.
struct RefProgress {
  explicit RefProgress(size_t n) : ready(std::make_unique<std::atomic<uint8_t>[]>(n)), count(n) {}
  std::unique_ptr<std::atomic<uint8_t>[]> ready;
  size_t count;
  std::atomic<uint8_t> done{0};
  std::atomic<uint8_t> failed{0};
  std::exception_ptr error;  // written before `failed` is set
  std::atomic<uint32_t> ticks{0};

  void bump() {
    ticks.fetch_add(1, std::memory_order_release);
    ticks.notify_all();
  }
  /// Waits until pred() (checked after each bump) or the end of the step.
  template <class Pred>
  void wait(Pred pred) const {
    while (true) {
      const uint32_t t = ticks.load(std::memory_order_acquire);
      if (pred()) return;
      if (failed.load(std::memory_order_acquire)) std::rethrow_exception(error);
      if (done.load(std::memory_order_acquire)) return;
      ticks.wait(t, std::memory_order_acquire);
    }
  }
};

namespace {
size_t probe_index(Probe p, int layer) {
  return static_cast<size_t>(layer + 1) * kProbes + static_cast<size_t>(p);
}
}  // namespace

const Mat& RefStep::probe(Probe p, int layer) const {
  const size_t i = probe_index(p, layer);
  if (layer < -1 || i >= probes.size())
    throw InputError(std::string("verify: the reference recorded no ") + to_string(p) + " for layer " +
                     std::to_string(layer));
  if (progress) {
    const RefProgress& g = *progress;
    g.wait([&] { return g.ready[i].load(std::memory_order_acquire) != 0; });
  }
  if (probes[i].empty())
    throw InputError(std::string("verify: the reference recorded no ") + to_string(p) + " for layer " +
                     std::to_string(layer));
  return probes[i];
}

void RefStep::wait_done() const {
  if (progress) {
    const RefProgress& g = *progress;
    g.wait([&] { return g.done.load(std::memory_order_acquire) != 0; });
  }
}

std::exception_ptr RefStep::failure() const {
  return progress && progress->failed.load(std::memory_order_acquire) ? progress->error : nullptr;
}

void prepare_reference_step(const TinyModel& m, RefStep& out) {
  out = RefStep();
  out.probes.resize(static_cast<size_t>(m.layers + 1) * kProbes);
  out.progress = std::make_shared<RefProgress>(out.probes.size());
}

std::vector<double> init_params(const TinyModel& m, uint64_t seed) {
  Rng rng(seed);
  std::vector<double> p(static_cast<size_t>(m.total_params), 0.0);
  for (const auto& s : m.segs) {
    double scale = 1.0, shift = 0.0;
    switch (s.kind) {
      case PKind::embed_word:
      case PKind::embed_pos: scale = 0.5; break;
      case PKind::ln1_w:
      case PKind::ln2_w:
      case PKind::final_w:
      case PKind::mla_qnorm:
      case PKind::mla_kvnorm: scale = 0.1; shift = 1.0; break;
      case PKind::ln1_b:
      case PKind::ln2_b:
      case PKind::final_b:
      case PKind::bq:
      case PKind::bk:
      case PKind::bv:
      case PKind::bo:
      case PKind::bu:
      case PKind::bd: scale = 0.1; break;
      case PKind::head_w: scale = 1.0 / std::sqrt(static_cast<double>(s.cols)); break;
      case PKind::eu:
      case PKind::eg: scale = 1.0 / std::sqrt(static_cast<double>(m.h)); break;    // fan-in h per expert
      case PKind::ed: scale = 1.0 / std::sqrt(static_cast<double>(m.fe)); break;   // fan-in fe per expert
      default: scale = 1.0 / std::sqrt(static_cast<double>(s.rows)); break;  // fan-in = rows
    }
    for (int64_t i = 0; i < s.rows * s.cols; ++i) p[static_cast<size_t>(s.offset + i)] = shift + scale * rng.uniform();
  }
  return p;
}

Batch make_batch(const TinyModel& m, uint64_t seed) {
  Rng rng(seed);
  Batch b;
  b.samples = m.samples;
  b.seq = m.seq;
  const size_t n = static_cast<size_t>(m.samples * m.seq);
  b.tokens.resize(n);
  b.labels.resize(n);
  b.valid.assign(n, 1);
  for (size_t i = 0; i < n; ++i) {
    b.tokens[i] = rng.below(m.V);
    b.labels[i] = rng.below(m.V);
  }
  // Trailing padding: 1 .. seq/2 masked labels on every sequence but the first.
  for (int64_t s = 1; s < m.samples; ++s) {
    const int64_t pad = 1 + rng.below(std::max<int64_t>(1, m.seq / 2));
    for (int64_t t = m.seq - pad; t < m.seq; ++t) b.valid[static_cast<size_t>(s * m.seq + t)] = 0;
  }
  if (m.samples == 1) b.valid[static_cast<size_t>(m.seq - 1)] = 0;  // one sequence: still pad one
  for (uint8_t v : b.valid) b.n_valid += v;
  return b;
}

void moe_route(const TinyModel& m, const double* logits, int64_t* sel, double* prob) {
  const int64_t E = m.experts, k = m.topk;
  std::vector<uint8_t> taken(static_cast<size_t>(E), 0);
  for (int64_t i = 0; i < k; ++i) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e)  // strictly larger: the lower index wins a tie
      if (!taken[static_cast<size_t>(e)] && (best < 0 || logits[e] > logits[best])) best = e;
    taken[static_cast<size_t>(best)] = 1;
    sel[i] = best;
  }
  if (m.sigmoid_router) {
    double sum = 0;
    for (int64_t i = 0; i < k; ++i) sum += (prob[i] = 1.0 / (1.0 + std::exp(-logits[sel[i]])));
    if (k > 1)
      for (int64_t i = 0; i < k; ++i) prob[i] /= sum + 1e-20;
    return;
  }
  const double mx = logits[sel[0]];
  double z = 0;
  for (int64_t i = 0; i < k; ++i) z += (prob[i] = std::exp(logits[sel[i]] - mx));
  for (int64_t i = 0; i < k; ++i) prob[i] /= z;
}

void moe_route_bwd(const TinyModel& m, const double* logits, const int64_t* sel, const double* prob,
                   const double* dprob, double* dlogits) {
  const int64_t E = m.experts, k = m.topk;
  for (int64_t e = 0; e < E; ++e) dlogits[e] = 0;
  double dot = 0;
  for (int64_t i = 0; i < k; ++i) dot += dprob[i] * prob[i];
  if (m.sigmoid_router) {
    // p_i = s_i / D, D = sum s + 1e-20: ds_j = (dp_j - sum_i dp_i p_i) / D; ds/dz = s (1 - s).
    double sum = 0;
    std::vector<double> s(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i) sum += (s[static_cast<size_t>(i)] = 1.0 / (1.0 + std::exp(-logits[sel[i]])));
    for (int64_t i = 0; i < k; ++i) {
      const double si = s[static_cast<size_t>(i)];
      const double ds = k > 1 ? (dprob[i] - dot) / (sum + 1e-20) : dprob[i];
      dlogits[sel[i]] = ds * si * (1.0 - si);
    }
    return;
  }
  for (int64_t i = 0; i < k; ++i) dlogits[sel[i]] = prob[i] * (dprob[i] - dot);  // softmax over the k
}

void mla_split_kv(const Mat& kv, const Mat& kr, int64_t heads, int64_t dn, int64_t dr, int64_t dv, Mat& k, Mat& v) {
  const int64_t rows = kv.rows, w = dn + dv;
  k = Mat::uninitialized(rows, heads * (dn + dr));
  v = Mat::uninitialized(rows, heads * dv);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < heads; ++j) {
      const double* src = kv.row(i) + j * w;
      double* kd = k.row(i) + j * (dn + dr);
      for (int64_t x = 0; x < dn; ++x) kd[x] = src[x];
      for (int64_t x = 0; x < dr; ++x) kd[dn + x] = kr.at(i, x);
      for (int64_t x = 0; x < dv; ++x) v.at(i, j * dv + x) = src[dn + x];
    }
}

void mla_split_kv_bwd(const Mat& dk, const Mat& dv, int64_t heads, int64_t dn, int64_t dr, int64_t dv_dim, Mat& dkv,
                      Mat& dkr) {
  const int64_t rows = dk.rows, w = dn + dv_dim;
  dkv = Mat::uninitialized(rows, heads * w);
  dkr = Mat(rows, dr);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < heads; ++j) {
      const double* kd = dk.row(i) + j * (dn + dr);
      double* dst = dkv.row(i) + j * w;
      for (int64_t x = 0; x < dn; ++x) dst[x] = kd[x];
      for (int64_t x = 0; x < dv_dim; ++x) dst[dn + x] = dv.at(i, j * dv_dim + x);
      for (int64_t x = 0; x < dr; ++x) dkr.at(i, x) += kd[dn + x];
    }
}

void mla_rope(Mat& x, int64_t heads, int64_t hd, int64_t dr, const std::vector<int64_t>& position, bool inverse) {
  if (dr == 0) return;
  Mat r = Mat::uninitialized(x.rows, heads * dr);
  for (int64_t i = 0; i < x.rows; ++i)
    for (int64_t j = 0; j < heads; ++j)
      for (int64_t c = 0; c < dr; ++c) r.at(i, j * dr + c) = x.at(i, j * hd + hd - dr + c);
  rope_apply(r, heads, dr, position, inverse);
  for (int64_t i = 0; i < x.rows; ++i)
    for (int64_t j = 0; j < heads; ++j)
      for (int64_t c = 0; c < dr; ++c) x.at(i, j * hd + hd - dr + c) = r.at(i, j * dr + c);
}

refmath::AdamHyper verify_adam() {
  refmath::AdamHyper hp;
  hp.lr = 1e-2;
  hp.beta1 = 0.9;
  hp.beta2 = 0.999;
  hp.eps = 1e-8;
  return hp;
}

namespace {

/// A parameter's (or its gradient's) first element in a flat vector.
const double* param_ptr(const TinyModel& m, const std::vector<double>& p, PKind k, int layer = -1) {
  return p.data() + m.seg(k, layer).offset;
}
double* grad_ptr(const TinyModel& m, std::vector<double>& g, PKind k, int layer) {
  return g.data() + m.seg(k, layer).offset;
}
void add_grad(const TinyModel& m, std::vector<double>& g, PKind k, int layer, const Mat& d) {
  double* dst = grad_ptr(m, g, k, layer);
  for (int64_t i = 0; i < d.size(); ++i) dst[i] += d.v[static_cast<size_t>(i)];
}
void add_grad(const TinyModel& m, std::vector<double>& g, PKind k, int layer, const std::vector<double>& d) {
  double* dst = grad_ptr(m, g, k, layer);
  for (size_t i = 0; i < d.size(); ++i) dst[i] += d[i];
}

/// Full causal attention of one batch (no sharding), per sample and head (GQA: query head
/// j reads key/value head j / (heads / kv_heads)); scale 1/sqrt(hd).
struct AttnCache {
  Mat probs;  // row (sample * heads + head) * seq + query, column key: the causal softmax
};
Mat attention_forward(const TinyModel& m, const Mat& q, const Mat& k, const Mat& v, AttnCache& c) {
  const int64_t S = m.seq, group = m.heads / m.kv_heads, hd = m.hd;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  Mat ctx = Mat::uninitialized(q.rows, q.cols);
  c.probs = Mat(m.samples * m.heads * S, S);
  for (int64_t s = 0; s < m.samples; ++s)
    for (int64_t hh = 0; hh < m.heads; ++hh) {
      const int64_t kh = hh / group;
      for (int64_t t = 0; t < S; ++t) {
        double* pt = c.probs.row((s * m.heads + hh) * S + t);
        const double* qt = q.row(s * S + t) + hh * hd;
        double mx = -INFINITY;
        for (int64_t u = 0; u <= t; ++u) {
          const double* ku = k.row(s * S + u) + kh * hd;
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += qt[d] * ku[d];
          pt[u] = dot * scale;
          mx = std::max(mx, pt[u]);
        }
        double z = 0;
        for (int64_t u = 0; u <= t; ++u) z += (pt[u] = std::exp(pt[u] - mx));
        for (int64_t u = 0; u <= t; ++u) pt[u] /= z;
        // ct[d] = sum over u of pt[u] v[u][d], u in order (the head's columns side by side).
        double* ct = ctx.row(s * S + t) + hh * hd;
        for (int64_t d = 0; d < hd; ++d) ct[d] = 0;
        for (int64_t u = 0; u <= t; ++u) {
          const double* vu = v.row(s * S + u) + kh * hd;
          for (int64_t d = 0; d < hd; ++d) ct[d] += pt[u] * vu[d];
        }
      }
    }
  return ctx;
}
void attention_backward(const TinyModel& m, const Mat& q, const Mat& k, const Mat& v, const AttnCache& c,
                        const Mat& dctx, Mat& dq, Mat& dk, Mat& dv) {
  const int64_t S = m.seq, group = m.heads / m.kv_heads, hd = m.hd;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  dq = Mat(q.rows, q.cols);
  dk = Mat(k.rows, k.cols);
  dv = Mat(v.rows, v.cols);
  std::vector<double> dp(static_cast<size_t>(S));
  for (int64_t s = 0; s < m.samples; ++s)
    for (int64_t hh = 0; hh < m.heads; ++hh) {
      const int64_t kh = hh / group;
      for (int64_t t = 0; t < S; ++t) {
        const double* pt = c.probs.row((s * m.heads + hh) * S + t);
        const double* dct = dctx.row(s * S + t) + hh * hd;
        double sum = 0;
        for (int64_t u = 0; u <= t; ++u) {
          const double* vu = v.row(s * S + u) + kh * hd;
          double* dvu = dv.row(s * S + u) + kh * hd;
          double x = 0;
          for (int64_t d = 0; d < hd; ++d) {
            x += dct[d] * vu[d];
            dvu[d] += pt[u] * dct[d];
          }
          dp[static_cast<size_t>(u)] = x;
          sum += pt[u] * x;
        }
        const double* qt = q.row(s * S + t) + hh * hd;
        double* dqt = dq.row(s * S + t) + hh * hd;
        for (int64_t u = 0; u <= t; ++u) {
          const double ds = pt[u] * (dp[static_cast<size_t>(u)] - sum) * scale;
          const double* ku = k.row(s * S + u) + kh * hd;
          double* dku = dk.row(s * S + u) + kh * hd;
          for (int64_t d = 0; d < hd; ++d) {
            dqt[d] += ds * ku[d];
            dku[d] += ds * qt[d];
          }
        }
      }
    }
}

}  // namespace

namespace {

/// One MoE layer of the reference (models/moe.hpp's eight steps without the parallelism):
/// each token's top-k experts (moe_route), each routed copy through its expert's SwiGLU, the
/// outputs weighted by the router weights and summed per token.
struct MoeRefCache {
  Mat logits;                  // T x E
  std::vector<int64_t> sel;    // T x k
  std::vector<double> prob;    // T x k
  Mat u, g, act, y;            // (T k) x fe, ..., (T k) x h: copy t k + i
};

Mat moe_ref_forward(const TinyModel& m, const std::vector<double>& p, int l, const Mat& x, MoeRefCache& c) {
  const int64_t T = x.rows, h = m.h, E = m.experts, k = m.topk, fe = m.fe;
  const double* wr = p.data() + m.seg(PKind::router_w, l).offset;
  const double* wu = p.data() + m.seg(PKind::eu, l).offset;
  const double* wg = p.data() + m.seg(PKind::eg, l).offset;
  const double* wd = p.data() + m.seg(PKind::ed, l).offset;
  c.logits = Mat(T, E);
  gemm(x.v.data(), wr, c.logits.v.data(), T, h, E, false);
  c.sel.assign(static_cast<size_t>(T * k), 0);
  c.prob.assign(static_cast<size_t>(T * k), 0.0);
  c.u = Mat(T * k, fe);
  c.g = Mat(T * k, fe);
  c.act = Mat(T * k, fe);
  c.y = Mat(T * k, h);
  Mat out(T, h);
  for (int64_t t = 0; t < T; ++t) {
    moe_route(m, c.logits.row(t), c.sel.data() + t * k, c.prob.data() + t * k);
    for (int64_t i = 0; i < k; ++i) {
      const int64_t e = c.sel[static_cast<size_t>(t * k + i)], r = t * k + i;
      gemm(x.row(t), wu + e * h * fe, c.u.row(r), 1, h, fe, false);
      gemm(x.row(t), wg + e * h * fe, c.g.row(r), 1, h, fe, false);
      for (int64_t j = 0; j < fe; ++j) c.act.at(r, j) = silu(c.g.at(r, j)) * c.u.at(r, j);
      gemm(c.act.row(r), wd + e * fe * h, c.y.row(r), 1, fe, h, false);
      const double w = c.prob[static_cast<size_t>(r)];
      for (int64_t j = 0; j < h; ++j) out.at(t, j) += w * c.y.at(r, j);
    }
  }
  return out;
}

/// Backward of moe_ref_forward: parameter gradients into g, returns d x.
Mat moe_ref_backward(const TinyModel& m, const std::vector<double>& p, int l, const Mat& x, const MoeRefCache& c,
                     const Mat& dout, std::vector<double>& grad) {
  const int64_t T = x.rows, h = m.h, E = m.experts, k = m.topk, fe = m.fe;
  const PSeg &sr = m.seg(PKind::router_w, l), &su = m.seg(PKind::eu, l), &sg = m.seg(PKind::eg, l),
             &sd = m.seg(PKind::ed, l);
  const double *wr = p.data() + sr.offset, *wu = p.data() + su.offset, *wg = p.data() + sg.offset,
               *wd = p.data() + sd.offset;
  double *gr = grad.data() + sr.offset, *gu = grad.data() + su.offset, *gg = grad.data() + sg.offset,
         *gd = grad.data() + sd.offset;
  Mat dx(T, h);
  std::vector<double> dy(static_cast<size_t>(h)), da(static_cast<size_t>(fe)), du(static_cast<size_t>(fe)),
      dg(static_cast<size_t>(fe)), dprob(static_cast<size_t>(k)), dz(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < k; ++i) {
      const int64_t r = t * k + i, e = c.sel[static_cast<size_t>(r)];
      const double w = c.prob[static_cast<size_t>(r)];
      double dp = 0;
      for (int64_t j = 0; j < h; ++j) {
        dy[static_cast<size_t>(j)] = w * dout.at(t, j);
        dp += dout.at(t, j) * c.y.at(r, j);
      }
      dprob[static_cast<size_t>(i)] = dp;
      for (int64_t a = 0; a < fe; ++a) {
        double s = 0;
        for (int64_t j = 0; j < h; ++j) s += dy[static_cast<size_t>(j)] * wd[(e * fe + a) * h + j];
        da[static_cast<size_t>(a)] = s;
        for (int64_t j = 0; j < h; ++j) gd[(e * fe + a) * h + j] += c.act.at(r, a) * dy[static_cast<size_t>(j)];
        du[static_cast<size_t>(a)] = s * silu(c.g.at(r, a));
        dg[static_cast<size_t>(a)] = s * c.u.at(r, a) * silu_grad(c.g.at(r, a));
      }
      for (int64_t q = 0; q < h; ++q) {
        double s = 0;
        for (int64_t a = 0; a < fe; ++a) {
          gu[(e * h + q) * fe + a] += x.at(t, q) * du[static_cast<size_t>(a)];
          gg[(e * h + q) * fe + a] += x.at(t, q) * dg[static_cast<size_t>(a)];
          s += du[static_cast<size_t>(a)] * wu[(e * h + q) * fe + a] + dg[static_cast<size_t>(a)] * wg[(e * h + q) * fe + a];
        }
        dx.at(t, q) += s;
      }
    }
    moe_route_bwd(m, c.logits.row(t), c.sel.data() + t * k, c.prob.data() + t * k, dprob.data(), dz.data());
    for (int64_t q = 0; q < h; ++q) {
      double s = 0;
      for (int64_t e = 0; e < E; ++e) {
        gr[q * E + e] += x.at(t, q) * dz[static_cast<size_t>(e)];
        s += dz[static_cast<size_t>(e)] * wr[q * E + e];
      }
      dx.at(t, q) += s;
    }
  }
  return dx;
}

}  // namespace

namespace {
void compute_reference_step(const TinyModel& m, const std::vector<double>& p, const Batch& batch, RefStep& r);
}  // namespace

RefStep reference_step(const TinyModel& m, const std::vector<double>& p, const Batch& batch) {
  RefStep r;
  r.probes.resize(static_cast<size_t>(m.layers + 1) * kProbes);
  compute_reference_step(m, p, batch, r);
  return r;
}

void reference_step_into(const TinyModel& m, const std::vector<double>& p, const Batch& batch, RefStep& r) {
  RefProgress* g = r.progress.get();
  try {
    if (g == nullptr || r.probes.size() != g->count) throw InputError("verify: reference step not prepared");
    compute_reference_step(m, p, batch, r);
  } catch (...) {
    if (g == nullptr) throw;
    g->error = std::current_exception();
    g->failed.store(1, std::memory_order_release);
    g->bump();
    return;
  }
  g->done.store(1, std::memory_order_release);
  g->bump();
}

namespace {

/// reference_step's computation into r (probes sized); publishes each probe when r is streamed.
void compute_reference_step(const TinyModel& m, const std::vector<double>& p, const Batch& batch, RefStep& r) {
  r.grad.assign(p.size(), 0.0);
  r.loss = 0;
  RefProgress* g = r.progress.get();
  const int64_t T = m.samples * m.seq;
  std::vector<int64_t> pos(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) pos[static_cast<size_t>(i)] = i % m.seq;
  auto put = [&](Probe pr, int layer, Mat x) -> const Mat& {
    const size_t i = probe_index(pr, layer);
    Mat& slot = r.probes[i];
    slot = std::move(x);
    if (g != nullptr) {
      g->ready[i].store(1, std::memory_order_release);
      g->bump();
    }
    return slot;
  };
  // a W and a W^T with W a parameter (no copy of W; the arithmetic of matmul / matmul_nt).
  auto product = [&](const Mat& a, PKind k, int layer, bool nt) {
    const PSeg& s = m.seg(k, layer);
    const int64_t inner = nt ? s.cols : s.rows, out = nt ? s.rows : s.cols;
    if (a.cols != inner) throw InputError("verify: reference matmul shapes do not fit");
    Mat c = Mat::uninitialized(a.rows, out);
    if (nt) gemm_nt(a.v.data(), p.data() + s.offset, c.v.data(), a.rows, a.cols, out, false);
    else gemm(a.v.data(), p.data() + s.offset, c.v.data(), a.rows, a.cols, out, false);
    return c;
  };
  auto mm = [&](const Mat& a, PKind k, int layer) { return product(a, k, layer, false); };
  auto mm_nt = [&](const Mat& a, PKind k, int layer) { return product(a, k, layer, true); };

  // ---- forward ----
  Mat x(T, m.h);
  const PSeg& word = m.seg(PKind::embed_word);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < m.h; ++j) {
      x.at(i, j) = p[static_cast<size_t>(word.offset + batch.tokens[static_cast<size_t>(i)] * m.h + j)];
      if (m.learned_pos) x.at(i, j) += p[static_cast<size_t>(m.seg(PKind::embed_pos).offset + (i % m.seq) * m.h + j)];
    }
  put(Probe::embed_out, -1, x);
  struct LayerCache {
    const Mat* n1 = nullptr;   // the probes ln1_out, ctx, ln2_out
    const Mat* ctx = nullptr;
    const Mat* n2 = nullptr;
    Mat q, k, v, u, g, act;
    Mat qin, kvn;            // MLA: q_up's input (q_norm output, or the norm output) and kv_norm's output
    NormCache c1, c2, cq, ckv;  // cq / ckv: MLA's latent norms
    AttnCache att;
    MoeRefCache moe;
  };
  std::vector<LayerCache> lc(static_cast<size_t>(m.layers));
  for (int l = 0; l < static_cast<int>(m.layers); ++l) {
    LayerCache& c = lc[static_cast<size_t>(l)];
    const Mat& x_in = put(Probe::x_in, l, std::move(x));
    c.n1 = &put(Probe::ln1_out, l,
                norm_forward(x_in, param_ptr(m, p, PKind::ln1_w, l),
                             m.layernorm ? param_ptr(m, p, PKind::ln1_b, l) : nullptr, m.layernorm, c.c1));
    if (m.mla) {
      // Multi-head latent attention (models/verify/ops_mla.cpp): latents, their norms, the up
      // projections, the shared rotary key.
      c.qin = m.dq > 0 ? norm_forward(mm(*c.n1, PKind::mla_dq, l), param_ptr(m, p, PKind::mla_qnorm, l), nullptr,
                                      false, c.cq)
                       : *c.n1;
      const Mat kvd = mm(*c.n1, PKind::mla_dkv, l);
      c.kvn = norm_forward(col_range(kvd, 0, m.dc), param_ptr(m, p, PKind::mla_kvnorm, l), nullptr, false, c.ckv);
      c.q = mm(c.qin, PKind::mla_uq, l);
      mla_split_kv(mm(c.kvn, PKind::mla_ukv, l), col_range(kvd, m.dc, m.dc + m.dr), m.heads, m.dn, m.dr, m.dv, c.k,
                   c.v);
      if (m.rope) {
        mla_rope(c.q, m.heads, m.hd, m.dr, pos, false);
        mla_rope(c.k, m.heads, m.hd, m.dr, pos, false);
      }
    } else {
      c.q = mm(*c.n1, PKind::wq, l);
      c.k = mm(*c.n1, PKind::wk, l);
      c.v = mm(*c.n1, PKind::wv, l);
    }
    if (m.bias) {
      add_row_vector(c.q, param_ptr(m, p, PKind::bq, l));
      add_row_vector(c.k, param_ptr(m, p, PKind::bk, l));
      add_row_vector(c.v, param_ptr(m, p, PKind::bv, l));
    }
    if (m.rope && !m.mla) {
      rope_apply(c.q, m.heads, m.hd, pos, false);
      rope_apply(c.k, m.kv_heads, m.hd, pos, false);
    }
    c.ctx = &put(Probe::ctx, l, attention_forward(m, c.q, c.k, c.v, c.att));
    Mat x_mid = x_in;
    {
      Mat ao = mm(*c.ctx, PKind::wo, l);
      add_into(x_mid, ao);
      put(Probe::attn_out, l, std::move(ao));
    }
    if (m.bias) add_row_vector(x_mid, param_ptr(m, p, PKind::bo, l));
    c.n2 = &put(Probe::ln2_out, l,
                norm_forward(x_mid, param_ptr(m, p, PKind::ln2_w, l),
                             m.layernorm ? param_ptr(m, p, PKind::ln2_b, l) : nullptr, m.layernorm, c.c2));
    if (m.moe_layer(l)) {
      // Routed experts (models/verify/tiny_model.hpp moe_route), then the shared expert.
      Mat mo = moe_ref_forward(m, p, l, *c.n2, c.moe);
      if (m.fs > 0) {
        c.u = mm(*c.n2, PKind::wu, l);
        c.g = mm(*c.n2, PKind::wg, l);
        c.act = Mat::uninitialized(c.u.rows, c.u.cols);
        for (int64_t i = 0; i < c.u.size(); ++i)
          c.act.v[static_cast<size_t>(i)] = silu(c.g.v[static_cast<size_t>(i)]) * c.u.v[static_cast<size_t>(i)];
        add_into(mo, mm(c.act, PKind::wd, l));
      }
      x = std::move(x_mid);
      add_into(x, mo);
      put(Probe::mlp_out, l, std::move(mo));
      continue;
    }
    c.u = mm(*c.n2, PKind::wu, l);
    if (m.bias) add_row_vector(c.u, param_ptr(m, p, PKind::bu, l));
    c.act = Mat::uninitialized(c.u.rows, c.u.cols);
    if (m.swiglu) {
      c.g = mm(*c.n2, PKind::wg, l);
      for (int64_t i = 0; i < c.u.size(); ++i)
        c.act.v[static_cast<size_t>(i)] = silu(c.g.v[static_cast<size_t>(i)]) * c.u.v[static_cast<size_t>(i)];
    } else {
      for (int64_t i = 0; i < c.u.size(); ++i) c.act.v[static_cast<size_t>(i)] = gelu(c.u.v[static_cast<size_t>(i)]);
    }
    x = std::move(x_mid);
    {
      Mat mo = mm(c.act, PKind::wd, l);
      add_into(x, mo);
      put(Probe::mlp_out, l, std::move(mo));
    }
    if (m.bias) add_row_vector(x, param_ptr(m, p, PKind::bd, l));
  }
  NormCache cf;
  const Mat& nf = put(Probe::final_ln_out, -1,
                      norm_forward(x, param_ptr(m, p, PKind::final_w),
                                   m.layernorm ? param_ptr(m, p, PKind::final_b) : nullptr, m.layernorm, cf));
  const PKind head = m.tied ? PKind::embed_word : PKind::head_w;
  const Mat logits = mm_nt(nf, head, -1);  // T x V
  Mat dlogits(T, m.V);
  const double inv_n = 1.0 / static_cast<double>(batch.n_valid);
  for (int64_t i = 0; i < T; ++i) {
    if (!batch.valid[static_cast<size_t>(i)]) continue;
    double mx = -INFINITY;
    for (int64_t j = 0; j < m.V; ++j) mx = std::max(mx, logits.at(i, j));
    double z = 0;
    double* dli = dlogits.row(i);
    for (int64_t j = 0; j < m.V; ++j) z += (dli[j] = std::exp(logits.at(i, j) - mx));
    const int64_t y = batch.labels[static_cast<size_t>(i)];
    r.loss += (std::log(z) + mx - logits.at(i, y)) * inv_n;
    for (int64_t j = 0; j < m.V; ++j) dli[j] = dli[j] / z * inv_n;
    dlogits.at(i, y) -= inv_n;
  }

  // ---- backward ----
  add_grad(m, r.grad, head, -1, matmul_tn(dlogits, nf));
  Mat dx = norm_backward(put(Probe::d_final_ln_out, -1, mm(dlogits, head, -1)), param_ptr(m, p, PKind::final_w),
                         m.layernorm, cf, grad_ptr(m, r.grad, PKind::final_w, -1),
                         m.layernorm ? grad_ptr(m, r.grad, PKind::final_b, -1) : nullptr);
  for (int l = static_cast<int>(m.layers) - 1; l >= 0; --l) {
    LayerCache& c = lc[static_cast<size_t>(l)];
    const Mat& dout = put(Probe::d_x_out, l, std::move(dx));
    Mat dn2;
    if (m.moe_layer(l)) {
      dn2 = moe_ref_backward(m, p, l, *c.n2, c.moe, dout, r.grad);
      if (m.fs > 0) {
        add_grad(m, r.grad, PKind::wd, l, matmul_tn(c.act, dout));
        const Mat dact = mm_nt(dout, PKind::wd, l);
        Mat du = Mat::uninitialized(dact.rows, dact.cols), dg = Mat::uninitialized(dact.rows, dact.cols);
        for (int64_t i = 0; i < dact.size(); ++i) {
          const size_t ii = static_cast<size_t>(i);
          du.v[ii] = dact.v[ii] * silu(c.g.v[ii]);
          dg.v[ii] = dact.v[ii] * c.u.v[ii] * silu_grad(c.g.v[ii]);
        }
        add_grad(m, r.grad, PKind::wu, l, matmul_tn(*c.n2, du));
        add_grad(m, r.grad, PKind::wg, l, matmul_tn(*c.n2, dg));
        add_into(dn2, mm_nt(du, PKind::wu, l));
        add_into(dn2, mm_nt(dg, PKind::wg, l));
      }
    } else {
    if (m.bias) add_grad(m, r.grad, PKind::bd, l, col_sums(dout));
    add_grad(m, r.grad, PKind::wd, l, matmul_tn(c.act, dout));
    const Mat dact = mm_nt(dout, PKind::wd, l);
    Mat du = Mat::uninitialized(dact.rows, dact.cols), dg;
    if (m.swiglu) {
      dg = Mat::uninitialized(dact.rows, dact.cols);
      for (int64_t i = 0; i < dact.size(); ++i) {
        const size_t ii = static_cast<size_t>(i);
        du.v[ii] = dact.v[ii] * silu(c.g.v[ii]);
        dg.v[ii] = dact.v[ii] * c.u.v[ii] * silu_grad(c.g.v[ii]);
      }
    } else {
      for (int64_t i = 0; i < dact.size(); ++i)
        du.v[static_cast<size_t>(i)] = dact.v[static_cast<size_t>(i)] * gelu_grad(c.u.v[static_cast<size_t>(i)]);
    }
    add_grad(m, r.grad, PKind::wu, l, matmul_tn(*c.n2, du));
    if (m.bias) add_grad(m, r.grad, PKind::bu, l, col_sums(du));
    dn2 = mm_nt(du, PKind::wu, l);
    if (m.swiglu) {
      add_grad(m, r.grad, PKind::wg, l, matmul_tn(*c.n2, dg));
      add_into(dn2, mm_nt(dg, PKind::wg, l));
    }
    }
    Mat dmid = norm_backward(put(Probe::d_ln2_out, l, std::move(dn2)), param_ptr(m, p, PKind::ln2_w, l), m.layernorm,
                             c.c2, grad_ptr(m, r.grad, PKind::ln2_w, l),
                             m.layernorm ? grad_ptr(m, r.grad, PKind::ln2_b, l) : nullptr);
    add_into(dmid, dout);
    const Mat& dm = put(Probe::d_x_mid, l, std::move(dmid));
    if (m.bias) add_grad(m, r.grad, PKind::bo, l, col_sums(dm));
    add_grad(m, r.grad, PKind::wo, l, matmul_tn(*c.ctx, dm));
    const Mat dctx = mm_nt(dm, PKind::wo, l);
    Mat dq, dk, dv;
    attention_backward(m, c.q, c.k, c.v, c.att, dctx, dq, dk, dv);
    c.att = AttnCache();
    if (m.exp.layout.cp > 1) {  // the gradients at the attention, before RoPE's backward (CP's rule only)
      put(Probe::dq, l, dq);
      put(Probe::dk, l, dk);
      put(Probe::dv, l, dv);
    }
    Mat dn1;
    if (m.mla) {
      if (m.rope) {
        mla_rope(dq, m.heads, m.hd, m.dr, pos, true);
        mla_rope(dk, m.heads, m.hd, m.dr, pos, true);
      }
      Mat dkv, dkr;
      mla_split_kv_bwd(dk, dv, m.heads, m.dn, m.dr, m.dv, dkv, dkr);
      add_grad(m, r.grad, PKind::mla_uq, l, matmul_tn(c.qin, dq));
      add_grad(m, r.grad, PKind::mla_ukv, l, matmul_tn(c.kvn, dkv));
      const Mat dqin = mm_nt(dq, PKind::mla_uq, l);
      const Mat dkvn = mm_nt(dkv, PKind::mla_ukv, l);
      Mat dkvd = Mat::uninitialized(dkvn.rows, m.dc + m.dr);
      set_col_range(dkvd, 0, norm_backward(dkvn, param_ptr(m, p, PKind::mla_kvnorm, l), false, c.ckv,
                                           grad_ptr(m, r.grad, PKind::mla_kvnorm, l), nullptr));
      set_col_range(dkvd, m.dc, dkr);
      add_grad(m, r.grad, PKind::mla_dkv, l, matmul_tn(*c.n1, dkvd));
      dn1 = mm_nt(dkvd, PKind::mla_dkv, l);
      if (m.dq > 0) {
        const Mat dql = norm_backward(dqin, param_ptr(m, p, PKind::mla_qnorm, l), false, c.cq,
                                      grad_ptr(m, r.grad, PKind::mla_qnorm, l), nullptr);
        add_grad(m, r.grad, PKind::mla_dq, l, matmul_tn(*c.n1, dql));
        add_into(dn1, mm_nt(dql, PKind::mla_dq, l));
      } else {
        add_into(dn1, dqin);
      }
    } else {
    if (m.rope) {
      rope_apply(dq, m.heads, m.hd, pos, true);
      rope_apply(dk, m.kv_heads, m.hd, pos, true);
    }
    add_grad(m, r.grad, PKind::wq, l, matmul_tn(*c.n1, dq));
    add_grad(m, r.grad, PKind::wk, l, matmul_tn(*c.n1, dk));
    add_grad(m, r.grad, PKind::wv, l, matmul_tn(*c.n1, dv));
    if (m.bias) {
      add_grad(m, r.grad, PKind::bq, l, col_sums(dq));
      add_grad(m, r.grad, PKind::bk, l, col_sums(dk));
      add_grad(m, r.grad, PKind::bv, l, col_sums(dv));
    }
    dn1 = mm_nt(dq, PKind::wq, l);
    add_into(dn1, mm_nt(dk, PKind::wk, l));
    add_into(dn1, mm_nt(dv, PKind::wv, l));
    }
    dx = norm_backward(put(Probe::d_ln1_out, l, std::move(dn1)), param_ptr(m, p, PKind::ln1_w, l), m.layernorm, c.c1,
                       grad_ptr(m, r.grad, PKind::ln1_w, l),
                       m.layernorm ? grad_ptr(m, r.grad, PKind::ln1_b, l) : nullptr);
    add_into(dx, dm);
    put(Probe::d_x_in, l, dx);
    c = LayerCache();  // this layer's activations are no longer needed
  }
  double* gw = grad_ptr(m, r.grad, PKind::embed_word, -1);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < m.h; ++j) {
      gw[batch.tokens[static_cast<size_t>(i)] * m.h + j] += dx.at(i, j);
      if (m.learned_pos) grad_ptr(m, r.grad, PKind::embed_pos, -1)[(i % m.seq) * m.h + j] += dx.at(i, j);
    }
}

}  // namespace

}  // namespace dtsim::verify
