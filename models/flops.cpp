#include "models/flops.hpp"

#include <algorithm>
#include <array>
#include <string>

#include "models/blocks/layer.hpp"
#include "models/errors.hpp"
#include "models/pipeline_split.hpp"

namespace dtsim {

namespace {

void check_model(const ModelSpec& m) {
  if (m.hidden <= 0 || m.heads <= 0 || m.layers <= 0 || m.ffn_hidden <= 0 || m.vocab <= 0)
    throw InputError("model '" + m.name +
                     "': layers, hidden, heads, ffn_hidden and vocab must all be positive");
  if (m.kv_heads <= 0 || m.kv_heads > m.heads)
    throw InputError("model '" + m.name + "': kv_heads=" + std::to_string(m.kv_heads) +
                     " must be in [1, heads=" + std::to_string(m.heads) + "]");
}

void check_non_negative(int64_t v, const char* what) {
  if (v < 0) throw InputError(std::string("FLOP count: ") + what + "=" + std::to_string(v) + " is negative");
}

double d(int64_t v) { return static_cast<double>(v); }

}  // namespace

double ForwardFlops::total() const {
  return qkv + attention_scores + attention_values + out_proj + mlp_up + mlp_gate + mlp_down + router + expert_up +
         expert_gate + expert_down + shared_up + shared_gate + shared_down + mtp_eh_proj;
}

void ForwardFlops::add(const ForwardFlops& f, double n) {
  qkv += n * f.qkv;
  attention_scores += n * f.attention_scores;
  attention_values += n * f.attention_values;
  out_proj += n * f.out_proj;
  mlp_up += n * f.mlp_up;
  mlp_gate += n * f.mlp_gate;
  mlp_down += n * f.mlp_down;
  router += n * f.router;
  expert_up += n * f.expert_up;
  expert_gate += n * f.expert_gate;
  expert_down += n * f.expert_down;
  shared_up += n * f.shared_up;
  shared_gate += n * f.shared_gate;
  shared_down += n * f.shared_down;
  mtp_eh_proj += n * f.mtp_eh_proj;
}

ForwardFlops layer_forward_flops(const ModelSpec& m, int64_t b, int64_t s, int64_t s_kv) {
  check_model(m);
  check_non_negative(b, "b");
  check_non_negative(s, "s");
  check_non_negative(s_kv, "s_kv");
  // The sum of what the layer's blocks declare (models/blocks/: attention.cpp, mlp.cpp).
  // Every layer is the same dense layer today.
  return blocks::ModelBlocks(m).layer(0).forward_flops(m, d(b) * d(s), d(s_kv));
}

double lm_head_forward_flops(const ModelSpec& m, int64_t b, int64_t s) {
  check_model(m);
  check_non_negative(b, "b");
  check_non_negative(s, "s");
  return 2.0 * d(b) * d(s) * d(m.hidden) * d(m.vocab);
}

// Every layer of a model without experts or windows is of one kind: layer 0's (MLA or not).
static std::array<int64_t, blocks::kLayerKinds> all_of_one_kind(const ModelSpec& m, int64_t layers) {
  std::array<int64_t, blocks::kLayerKinds> n{};
  n[static_cast<size_t>(blocks::layer_kind(m, 0))] = layers;
  return n;
}

std::array<int64_t, blocks::kLayerKinds> model_layer_kinds(const ModelSpec& m) {
  if (!m.moe.enabled() && m.attention.window <= 0) return all_of_one_kind(m, m.layers);
  return blocks::layer_kind_counts(m, 0, m.layers);
}

ForwardFlops layers_forward_flops(const ModelSpec& m, int64_t b, int64_t s, int64_t s_kv) {
  check_model(m);
  check_non_negative(b, "b");
  check_non_negative(s, "s");
  check_non_negative(s_kv, "s_kv");
  const auto kinds = model_layer_kinds(m);
  const blocks::ModelBlocks mb(m);
  ForwardFlops sum;
  for (int k = 0; k < blocks::kLayerKinds; ++k) {
    const double n = d(kinds[static_cast<size_t>(k)]);
    if (n == 0) continue;
    sum.add(mb.kind(k).forward_flops(m, d(b) * d(s), d(s_kv)), n);
  }
  return sum;
}

ForwardFlops mtp_forward_flops(const ModelSpec& m, int64_t b, int64_t s, int64_t s_kv) {
  ForwardFlops out;
  if (m.mtp_layers <= 0) return out;
  const blocks::ModelBlocks mb(m);
  ForwardFlops one = mb.layer(m.layers).forward_flops(m, d(b) * d(s), d(s_kv));
  mb.mtp_entry().forward_flops(m, d(b) * d(s), d(s_kv), one);
  out.add(one, d(m.mtp_layers));
  return out;
}

double model_flops_per_step(const ModelSpec& m, int64_t global_batch, int64_t seq) {
  const double layers = layers_forward_flops(m, global_batch, seq, seq).total();
  const double mtp = mtp_forward_flops(m, global_batch, seq, seq).total();
  return 3.0 * (layers + mtp + d(1 + std::max<int64_t>(0, m.mtp_layers)) * lm_head_forward_flops(m, global_batch, seq));
}

double hardware_flops_per_step(const ModelSpec& m, int64_t global_batch, int64_t seq, Recompute r) {
  const double model = model_flops_per_step(m, global_batch, seq);
  const ForwardFlops f = layers_forward_flops(m, global_batch, seq, seq);
  // An MTP depth's layer recomputes as the decoder's (Megatron-Core checkpoints the whole
  // depth under full recomputation, multi_token_prediction.py _checkpointed_forward).
  ForwardFlops x = mtp_forward_flops(m, global_batch, seq, seq);
  switch (r) {
    case Recompute::none:
      return model;
    case Recompute::selective:
      return model + (f.attention_scores + f.attention_values) + (x.attention_scores + x.attention_values);
    case Recompute::full:
      return model + f.total() + x.total();
  }
  return model;
}

double narayanan_eq3_flops(int64_t B, int64_t s, int64_t l, int64_t h, int64_t V) {
  // Narayanan et al. 2021 (arXiv 2104.04473) Eq. 3.
  return 96.0 * d(B) * d(s) * d(l) * d(h) * d(h) *
         (1.0 + d(s) / (6.0 * d(h)) + d(V) / (16.0 * d(l) * d(h)));
}

double korthikanti_eq7_model_flops(int64_t B, int64_t s, int64_t L, int64_t h, int64_t V) {
  // Korthikanti et al. 2022 (arXiv 2205.05198) Appendix A, Eq. 7.
  return 72.0 * d(B) * d(L) * d(s) * d(h) * d(h) *
         (1.0 + d(s) / (6.0 * d(h)) + d(V) / (12.0 * d(h) * d(L)));
}

double korthikanti_eq8_hardware_flops_selective(int64_t B, int64_t s, int64_t L, int64_t h, int64_t V) {
  // Korthikanti et al. 2022 (arXiv 2205.05198) Appendix A, Eq. 8, as printed.
  return 72.0 * d(B) * d(L) * d(s) * d(h) * d(h) *
         (1.0 + d(s) / (3.0 * d(h)) + d(V) / (12.0 * d(h) * d(L)));
}

bool has_linear_biases(const ModelSpec& m) { return m.activation == Activation::gelu; }

int64_t norm_parameters(const ModelSpec& m) {
  return m.norm == Norm::layernorm ? 2 * m.hidden : m.hidden;
}

int64_t layer_parameters(const ModelSpec& m) {
  check_model(m);
  // The sum of the layer's blocks' parameters (models/blocks/: QKV + out proj, MLP, the two
  // norms, biases per the rule above). Whole counts below 2^53, so the double sum is exact.
  const blocks::BlockParams p = blocks::ModelBlocks(m).layer(0).parameters(m);
  return static_cast<int64_t>(p.sharded_weights + p.replicated_weights + p.sharded_biases + p.replicated_biases);
}

int64_t embedding_parameters(const ModelSpec& m, int64_t seq_len_for_learned_positions) {
  check_model(m);
  int64_t n = m.vocab * m.hidden;
  if (m.position == Position::learned) {
    const int64_t max_pos =
        m.max_position_embeddings > 0 ? m.max_position_embeddings : seq_len_for_learned_positions;
    if (max_pos <= 0)
      throw InputError("model '" + m.name +
                       "': learned positions need max_position_embeddings or a positive seq_len");
    n += max_pos * m.hidden;
  }
  return n;
}

int64_t lm_head_parameters(const ModelSpec& m) {
  check_model(m);
  return m.tied_embeddings ? 0 : m.vocab * m.hidden;
}

int64_t layer_parameters_at(const ModelSpec& m, int64_t index) {
  check_model(m);
  const blocks::BlockParams p = blocks::ModelBlocks(m).layer(index).parameters(m);
  return static_cast<int64_t>(p.sharded_weights + p.replicated_weights + p.sharded_biases + p.replicated_biases +
                              p.expert_weights);
}

double total_parameters_f(const ModelSpec& m, int64_t seq_len) {
  check_model(m);
  const auto kinds = model_layer_kinds(m);
  const blocks::ModelBlocks mb(m);
  double layers = 0;
  for (int k = 0; k < blocks::kLayerKinds; ++k) {
    if (kinds[static_cast<size_t>(k)] == 0) continue;
    const blocks::BlockParams p = mb.kind(k).parameters(m);
    layers += d(kinds[static_cast<size_t>(k)]) *
              (p.sharded_weights + p.replicated_weights + p.sharded_biases + p.replicated_biases + p.expert_weights);
  }
  double mtp = 0;
  if (m.mtp_layers > 0) {
    const blocks::BlockParams p = mb.layer(m.layers).parameters(m), e = mb.mtp_entry().parameters(m);
    mtp = d(m.mtp_layers) * (p.sharded_weights + p.replicated_weights + p.sharded_biases + p.replicated_biases +
                             p.expert_weights + e.sharded_weights + e.replicated_weights);
  }
  return layers + mtp + d(embedding_parameters(m, seq_len)) + d(norm_parameters(m)) + d(lm_head_parameters(m));
}

int64_t total_parameters(const ModelSpec& m, int64_t seq_len) {
  // Whole counts: exact in double below 2^53, which the input checks ensure (limits::kMaxParameters).
  return static_cast<int64_t>(total_parameters_f(m, seq_len));
}

double mtp_entry_parameters_per_rank(const ModelSpec& m, int64_t tp) {
  if (m.mtp_layers <= 0) return 0.0;
  const blocks::BlockParams e = blocks::ModelBlocks(m).mtp_entry().parameters(m);
  return d(m.mtp_layers) * (e.sharded_weights / d(tp) + e.replicated_weights);
}

int64_t active_parameters(const ModelSpec& m, int64_t seq_len) {
  if (!m.moe.enabled()) return total_parameters(m, seq_len);
  const double share = static_cast<double>(m.moe.router_topk) / static_cast<double>(m.moe.num_experts);
  const auto kinds = model_layer_kinds(m);
  const blocks::ModelBlocks mb(m);
  double inactive = 0;
  for (int k = 1; k < blocks::kLayerKinds; k += 2)
    inactive += d(kinds[static_cast<size_t>(k)]) * mb.kind(k).parameters(m).expert_weights * (1.0 - share);
  return total_parameters(m, seq_len) - static_cast<int64_t>(inactive);
}

double layer_parameters_per_tp_rank(const ModelSpec& m, int64_t tp) {
  check_model(m);
  if (tp <= 0) throw InputError("layout.tp=" + std::to_string(tp) + " must be positive");
  // The layer's blocks' parameters (models/blocks/layer.hpp Layer::parameters_per_tp_rank):
  // GEMM weights and column-parallel biases / t, norms and row-parallel biases replicated.
  return blocks::ModelBlocks(m).layer(0).parameters_per_tp_rank(m, tp);
}

namespace {
// The checks stage_layer_count has always made, then the rank's share of pipeline_split.
RankSplit checked_rank_split(const ModelSpec& m, const Layout& l, int64_t stage) {
  check_model(m);
  if (l.pp <= 0) throw InputError("layout.pp=" + std::to_string(l.pp) + " must be positive");
  if (stage < 0 || stage >= l.pp)
    throw InputError("pipeline stage " + std::to_string(stage) + " is outside [0, layout.pp=" +
                     std::to_string(l.pp) + ")");
  return rank_split(m.layers, l, stage);
}
}  // namespace

int64_t stage_layer_count(const ModelSpec& m, const Layout& l, int64_t stage) {
  return checked_rank_split(m, l, stage).layers;
}

int64_t stage_first_layer(const ModelSpec& m, const Layout& l, int64_t stage) {
  checked_rank_split(m, l, stage);
  // The rank's first chunk that holds layers; a rank without layers: its first chunk's place.
  VirtualStage first = virtual_stage(m.layers, l, virtual_stage_of(l, stage, 0));
  for (int64_t c = 0; c < chunks_of(l) && first.layers == 0; ++c) {
    const VirtualStage vs = virtual_stage(m.layers, l, virtual_stage_of(l, stage, c));
    if (vs.layers > 0) first = vs;
  }
  return first.first_layer;
}

namespace {
/// The MTP depths' layers on the rank that holds the loss (stage_layer_kinds).
int64_t mtp_layers_on(const ModelSpec& m, const RankSplit& rs) { return rs.loss ? std::max<int64_t>(0, m.mtp_layers) : 0; }
}  // namespace

std::array<int64_t, blocks::kLayerKinds> stage_layer_kinds(const ModelSpec& m, const Layout& l, int64_t stage) {
  const RankSplit rs = checked_rank_split(m, l, stage);
  if (!m.moe.enabled() && m.attention.window <= 0) return all_of_one_kind(m, rs.layers + mtp_layers_on(m, rs));
  std::array<int64_t, blocks::kLayerKinds> n{};
  for (int64_t c = 0; c < chunks_of(l); ++c) {
    const VirtualStage vs = virtual_stage(m.layers, l, virtual_stage_of(l, stage, c));
    const auto k = blocks::layer_kind_counts(m, vs.first_layer, vs.layers);
    for (size_t i = 0; i < n.size(); ++i) n[i] += k[i];
  }
  if (const int64_t mtp = mtp_layers_on(m, rs); mtp > 0) n[static_cast<size_t>(blocks::layer_kind(m, m.layers))] += mtp;
  return n;
}

blocks::RankParams stage_layer_parameters_per_rank(const ModelSpec& m, const Layout& l, int64_t stage) {
  if (!m.moe.enabled() && m.attention.window <= 0) {  // every layer alike: the old product, bit for bit
    const RankSplit rs = checked_rank_split(m, l, stage);
    return {d(rs.layers + mtp_layers_on(m, rs)) * layer_parameters_per_tp_rank(m, l.tp), 0.0};
  }
  const auto kinds = stage_layer_kinds(m, l, stage);
  const blocks::ModelBlocks mb(m);
  blocks::RankParams sum;
  for (int k = 0; k < blocks::kLayerKinds; ++k) {
    const double n = d(kinds[static_cast<size_t>(k)]);
    if (n == 0) continue;
    const blocks::Layer& ly = mb.kind(k);
    sum.dense += n * ly.parameters_per_tp_rank(m, l.tp);
    sum.expert += n * ly.parameters(m).expert_weights / d(l.ep * l.expert_tp());
  }
  return sum;
}

double stage_expert_parameters_per_rank(const ModelSpec& m, const Layout& l, int64_t stage) {
  if (!m.moe.enabled()) return 0.0;
  return stage_layer_parameters_per_rank(m, l, stage).expert;
}

double stage_parameters_per_rank(const ModelSpec& m, const Layout& l, int64_t seq_len, int64_t stage) {
  // The sum over the rank's chunks (models/pipeline_split.hpp): their layers, the embedding
  // where a chunk holds it, the final norm and LM head where a chunk holds the loss.
  const RankSplit rs = checked_rank_split(m, l, stage);
  const double t = d(l.tp);
  // stage_layer_parameters_per_rank(m, l, stage).total(); its every-layer-alike case from
  // the split above (the same product, without splitting the rank's layers again).
  double n = !m.moe.enabled() && m.attention.window <= 0
                 ? blocks::RankParams{d(rs.layers + mtp_layers_on(m, rs)) * layer_parameters_per_tp_rank(m, l.tp), 0.0}
                       .total()
                 : stage_layer_parameters_per_rank(m, l, stage).total();
  const double word_embedding = d(m.vocab) * d(m.hidden) / t;  // vocab-parallel
  if (rs.embedding) {
    // Word embedding sharded over the vocabulary; learned positions replicated over TP.
    n += word_embedding + d(embedding_parameters(m, seq_len) - m.vocab * m.hidden);
  }
  if (rs.loss) {
    n += d(norm_parameters(m));  // final norm, replicated
    if (!m.tied_embeddings) n += word_embedding;  // untied LM head, vocab-parallel
    // Megatron keeps a copy of the word embedding on the last stage for a tied LM head or MTP.
    if (loss_stage_embeds(m) && !rs.embedding) n += word_embedding;
    n += mtp_entry_parameters_per_rank(m, l.tp);
  }
  return n;
}

}  // namespace dtsim
