#pragma once
// The tiny model the step-plan verifier runs (models/verify/verify.hpp): an experiment's
// layout with its model shrunk to a few layers, a small hidden size and vocabulary, its
// parameters and data drawn from a fixed seed, and the single-device reference step
// (forward, backward, Adam) every parallel execution is compared with.
//
// The block is the one dtsim's plans describe (models/flops.hpp): pre-norm GPT / Llama
// block, QKV -> causal attention (GQA, optional RoPE) -> output projection -> residual,
// norm -> MLP (GeLU, or SwiGLU with a gate) -> residual; linear biases exactly when the
// activation is GeLU (the flops.hpp rule); a word embedding (plus learned positions), a
// final norm and an LM head (tied to the word embedding or not); next-token cross
// entropy, the MEAN OVER VALID TOKENS with the GLOBAL count as denominator
// (design/MATH.md section 1). Dropout is the identity (p = 0).
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/experiment.hpp"
#include "models/reference_math.hpp"
#include "models/verify/tensor.hpp"

namespace dtsim::verify {

/// The experiment with its model and batch shrunk so that every divisibility rule of the
/// layout still holds; layout (dp, tp, cp, pp, vp, zero_stage, sequence_parallel,
/// recompute), cluster and training flags are kept. Rules:
///  - heads: 1 per TP rank when tp >= 4, else 2 (or 1 when the model has fewer);
///    kv_heads: one per TP rank when the model uses GQA (kv_heads < heads), else = heads;
///  - head_dim 2 when tp >= 4, else 4 (even, for RoPE); hidden = heads * head_dim (a model's
///    explicit head_dim is dropped: the shrunk head_dim is hidden / heads);
///    ffn_hidden = 2 * hidden; vocab = max(16, 4 tp) rounded up to a multiple of tp;
///  - layers: 2 per pipeline stage when pp <= 2, else 1 (times vp); with the layout's
///    Megatron-Core split options (models/pipeline_split.hpp): account_for_*: one slot per
///    virtual stage (pp vp - 1 or - 2 layers); decoder_first/last_pipeline_num_layers: vp each
///    and pp vp layers; pipeline_layout: model.layers unchanged (the layout names every layer);
///  - seq_len: the smallest multiple of cp * (tp when sequence parallel) that is >= 4 and
///    >= 2 cp; learned positions get max_position_embeddings = seq_len;
///  - micro_batch = min(micro_batch, 2); accumulation = min(accumulation, 4) (pp with the
///    interleaved schedule, which needs a multiple of pp);
///    global_batch = micro_batch * dp * accumulation.
///  - multi-head latent attention (model.mla; models/verify/ops_mla.cpp): head size 4 at every
///    tp (hidden = 4 heads), kv_heads = heads; the query / key head d_n + d_r and the value head
///    d_v are both 4, so that the attention core is the one standard attention runs: d_r = 2
///    when the original has a rotary part (else 0), d_n = 4 - d_r, d_v = 4; the latent ranks
///    shrink with the hidden size, d_c = max(3, ceil(d_c h' / h)) and d_q likewise (0 stays 0:
///    the query is then projected directly).
///  - mixture of experts (model.moe): E = the original E when it is at most max(2 ep, 4), else
///    max(2 ep, 4) rounded up to a multiple of ep; top-k = min(k, max(1, E / 2));
///    moe_ffn_hidden = 2 etp (etp = layout.expert_tp()); a shared expert keeps existing with
///    shared_expert_ffn_hidden = hidden; first_k_dense = 1 when the original has dense first
///    layers (and the shrunk model at least 2 layers); layer_freq = min(freq, 2); a
///    layer_pattern is resampled to the shrunk layers, both kinds kept when the original has
///    both. Not executed, so switched off (and listed as such by verify): the expert bias
///    (aux-loss-free balancing updates it from load statistics, not gradients; zero bias does
///    not change routing) and group-limited routing.
/// Throws InputError when the layout itself is invalid.
Experiment shrink_experiment(const Experiment& e);

/// Which global parameter tensor (unsharded, as on one device).
enum class PKind {
  embed_word,  // V x h
  embed_pos,   // seq x h (learned positions only)
  ln1_w, ln1_b,
  wq, wk, wv,  // h x heads*hd, h x kv*hd, h x kv*hd
  bq, bk, bv,  // biases (GeLU models only)
  wo, bo,      // heads*hd x h, h
  ln2_w, ln2_b,
  wu, bu,      // h x ffn, ffn
  wg,          // h x ffn (SwiGLU only)
  wd, bd,      // ffn x h, h
  final_w, final_b,
  head_w,      // V x h (untied only); logits = x head_w^T
  // Mixture-of-experts layers (TinyModel::moe_layer): the router and the E routed SwiGLU
  // experts, expert e's block of rows [e h, (e+1) h) of eu / eg and [e fe, (e+1) fe) of ed.
  // The shared expert of a MoE layer is its wu / wg / wd (h x fs, fs x h): a MoE layer has no
  // dense MLP.
  router_w,    // h x E: logits = x router_w
  eu, eg,      // E*h x fe
  ed,          // E*fe x h
  // Multi-head latent attention layers (TinyModel::mla; models/verify/ops_mla.cpp), in place of
  // wq / wk / wv (wo: heads*dv x h). Head j's columns of mla_uq are [j hd, (j+1) hd): its
  // non-rotary then rotary query part; of mla_ukv [j (dn+dv), (j+1)(dn+dv)): its non-rotary
  // key part, then its value.
  mla_dq,      // h x dq: q_down (absent when dq = 0)
  mla_qnorm,   // 1 x dq: q_norm (RMSNorm) weight
  mla_uq,      // q_in x heads*hd: q_up (q_in = dq), or the direct query projection (q_in = h)
  mla_dkv,     // h x (dc + dr): kv_down; the last dr columns are the shared rotary key k^R
  mla_kvnorm,  // 1 x dc: kv_norm (RMSNorm) weight
  mla_ukv,     // dc x heads*(dn+dv): kv_up
};
const char* to_string(PKind);

struct PSeg {
  PKind kind = PKind::embed_word;
  int layer = -1;  // -1 for embedding / final norm / head
  int64_t rows = 0, cols = 0;
  int64_t offset = 0;  // into the flat parameter vector
};

/// Dimensions of the tiny model and its batch.
struct TinyModel {
  Experiment exp;  // the shrunk experiment (its plan is what the verifier interprets)
  int64_t V = 0, h = 0, heads = 0, kv_heads = 0, hd = 0, ffn = 0, layers = 0;
  int64_t seq = 0, micro_batch = 0, accumulation = 0, samples = 0;  // samples = global batch
  bool bias = false, layernorm = true, learned_pos = true, tied = false, swiglu = false, rope = false;
  std::vector<PSeg> segs;
  int64_t total_params = 0;
  // Mixture of experts (all zero for a dense model).
  int64_t experts = 0, topk = 0, fe = 0, fs = 0;
  bool sigmoid_router = false;
  // Multi-head latent attention (every layer; all zero without): latent ranks dq (0: no
  // q_down) and dc, head parts dn + dr = hd (query / key) and dv = hd (value); q_in is the
  // width of q_up's input (dq, or h when dq = 0).
  bool mla = false;
  int64_t dq = 0, dc = 0, dn = 0, dr = 0, dv = 0, q_in = 0;
  std::vector<uint8_t> moe_layers;  // [layer] 1: a MoE layer
  bool moe_layer(int layer) const {
    return layer >= 0 && layer < static_cast<int>(moe_layers.size()) && moe_layers[static_cast<size_t>(layer)] != 0;
  }

  explicit TinyModel(const Experiment& shrunk);
  const PSeg& seg(PKind k, int layer = -1) const;
  bool has(PKind k, int layer = -1) const;

 private:
  std::vector<int> seg_index_;  // [(layer + 1) * kinds + kind] -> index into segs, -1: none
  int find(PKind k, int layer) const;
};

/// Router of a MoE layer (Megatron-Core router.py TopKRouter / moe_utils.py
/// topk_softmax_with_capacity, no pre-softmax, no scaling factor): the top k of one token's
/// E logits (the largest first; ties broken by the lower expert index), and their weights:
/// softmax: a softmax over the k selected logits (equal to a softmax over all E renormalised
/// over the k, as Mixtral does); sigmoid: s = sigmoid(logit), weights s_i / (sum_k s + 1e-20)
/// when k > 1, else s. `sel` and `prob` hold k values.
void moe_route(const TinyModel& m, const double* logits, int64_t* sel, double* prob);
/// The gradient of the E logits of one token (zero off the selected experts) given the
/// gradient of its k weights.
void moe_route_bwd(const TinyModel& m, const double* logits, const int64_t* sel, const double* prob,
                   const double* dprob, double* dlogits);

/// Multi-head latent attention's per-head keys and values (models/verify/ops_mla.cpp): kv_up's
/// output `kv` (rows x heads (dn + dv), head j: [k_nope | v]) and the shared rotary key `kr`
/// (rows x dr) give K (rows x heads (dn + dr), head j: [k_nope_j | kr]) and V (rows x heads dv).
void mla_split_kv(const Mat& kv, const Mat& kr, int64_t heads, int64_t dn, int64_t dr, int64_t dv, Mat& k, Mat& v);
/// Backward of mla_split_kv: dkv (head j: [dK_j's first dn | dV_j]) and dkr = the sum over the
/// heads of dK_j's last dr columns (in head order).
void mla_split_kv_bwd(const Mat& dk, const Mat& dv, int64_t heads, int64_t dn, int64_t dr, int64_t dv_dim, Mat& dkv,
                      Mat& dkr);
/// RoPE (rope_apply) on the last dr of every head's hd columns: MLA's rotary parts.
void mla_rope(Mat& x, int64_t heads, int64_t hd, int64_t dr, const std::vector<int64_t>& position, bool inverse);

/// Parameters drawn from `seed`: weights uniform in [-1,1) / sqrt(fan_in), biases
/// 0.1 x uniform, norm weights 1 + 0.1 x uniform, norm biases 0.1 x uniform, embeddings
/// 0.5 x uniform.
std::vector<double> init_params(const TinyModel& m, uint64_t seed);

/// One optimizer step's data: `samples` sequences of `seq` tokens. Labels are masked
/// (valid = 0) on a random number >= 1 of trailing positions of every sequence but the
/// first, so ranks and micro-batches hold unequal numbers of valid tokens.
struct Batch {
  int64_t samples = 0, seq = 0;
  std::vector<int64_t> tokens, labels;  // samples x seq
  std::vector<uint8_t> valid;
  int64_t n_valid = 0;  // global count: the loss denominator
};
Batch make_batch(const TinyModel& m, uint64_t seed);

/// Tensors of the reference forward / backward that the verifier compares with, each a
/// token matrix over the whole batch (samples x seq rows) in the global column order.
/// dq / dk: the gradients at the attention (before RoPE's backward); dq, dk and dv are
/// recorded only when the layout has cp > 1 (the CP rule is their only reader).
enum class Probe {
  x_in, ln1_out, ctx, attn_out, ln2_out, mlp_out,              // per layer (mlp_out: a MoE layer's output)
  d_x_out, d_ln2_out, d_x_mid, dq, dk, dv, d_ln1_out, d_x_in,  // per layer
  embed_out, final_ln_out, d_final_ln_out,                     // layer -1
};
const char* to_string(Probe);

inline constexpr int kProbes = static_cast<int>(Probe::d_final_ln_out) + 1;
struct RefProgress;  // publication state of a streamed step (tiny_model.cpp)

struct RefStep {
  double loss = 0;                 // sum over valid tokens of token losses / n_valid
  std::vector<double> grad;        // dL/dparams, flat as the parameters
  std::vector<Mat> probes;         // [(layer + 1) * kProbes + probe] token matrix (empty: not recorded)
  /// Throws InputError when the step records no such tensor. On a streamed step (below),
  /// waits until the tensor is published; rethrows what stopped the computation.
  const Mat& probe(Probe p, int layer) const;
  /// Streamed step: waits until loss and grad are final. No-op otherwise.
  void wait_done() const;
  /// Streamed step: what stopped its computation (null: nothing, or not streamed).
  std::exception_ptr failure() const;
  /// Non-null while the step is streamed (prepare_reference_step).
  std::shared_ptr<RefProgress> progress;
};

/// The single-device step: forward, loss, backward (no parallelism, no recompute).
RefStep reference_step(const TinyModel& m, const std::vector<double>& params, const Batch& batch);

/// The same step computed on one thread while others read it: prepare_reference_step sizes
/// `out` and marks every tensor pending (RefStep::probe and wait_done then wait), then
/// reference_step_into computes into `out`, publishing each probe once final and loss and
/// grad at the end, or the exception that stopped it (readers rethrow it). The arithmetic
/// is reference_step's: results are bitwise the same.
void prepare_reference_step(const TinyModel& m, RefStep& out);
void reference_step_into(const TinyModel& m, const std::vector<double>& params, const Batch& batch, RefStep& out);

/// Adam hyper-parameters of the verifier (Kingma & Ba 2015 defaults for the betas and eps;
/// lr 1e-2 so that a step moves parameters far beyond rounding).
refmath::AdamHyper verify_adam();

}  // namespace dtsim::verify
