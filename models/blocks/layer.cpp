#include "models/blocks/layer.hpp"

#include <algorithm>

#include <utility>
#include <vector>

#include "models/blocks/attention.hpp"
#include "models/blocks/embedding.hpp"
#include "models/blocks/lm_head.hpp"
#include "models/blocks/mla.hpp"
#include "models/blocks/mlp.hpp"
#include "models/blocks/moe.hpp"
#include "models/blocks/mtp.hpp"
#include "models/blocks/norm.hpp"

namespace dtsim::blocks {

namespace {

std::unique_ptr<Block> make_block(const BlockSpec& b) {
  switch (b.kind) {
    case BlockKind::norm: return std::make_unique<NormBlock>(b.name, b.bwd_name);
    case BlockKind::attention: return std::make_unique<AttentionBlock>(b.windowed);
    case BlockKind::mla: return std::make_unique<MlaBlock>();
    case BlockKind::residual: return std::make_unique<ResidualBlock>();
    case BlockKind::mlp: return std::make_unique<MlpBlock>();
    case BlockKind::moe: return std::make_unique<MoeBlock>();
  }
  return nullptr;
}

}  // namespace

Layer::Layer(std::vector<BlockSpec> spec) : spec_(std::move(spec)) {
  for (const auto& b : spec_) blocks_.push_back(make_block(b));
}

void Layer::forward(BlockContext& c, int layer, int mb, Phase ph) const {
  for (const auto& b : blocks_) b->forward(c, layer, mb, ph);
}

void Layer::backward(BlockContext& c, int layer, int mb, BackwardPart part) const {
  const BlockContext::WeightPart w(c, part == BackwardPart::weight);
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) (*it)->backward(c, layer, mb, part);
}

void Layer::selective_recompute(BlockContext& c, int layer, int mb) const {
  for (const auto& b : blocks_) b->selective_recompute(c, layer, mb);
}

double Layer::parameters_per_tp_rank(const ModelSpec& m, int64_t tp) const {
  const BlockParams sum = parameters(m);  // the routed experts (expert_weights) are not TP-split: not here
  const double t = static_cast<double>(tp);
  // In the order flops.cpp sums them, so that the two agree to the last bit.
  double n = sum.sharded_weights / t + sum.replicated_weights;
  n += sum.sharded_biases / t;
  n += sum.replicated_biases;
  return n;
}

BlockParams Layer::parameters(const ModelSpec& m) const {
  BlockParams sum;
  for (const auto& b : blocks_) {
    const BlockParams p = b->parameters(m);
    sum.sharded_weights += p.sharded_weights;
    sum.replicated_weights += p.replicated_weights;
    sum.sharded_biases += p.sharded_biases;
    sum.replicated_biases += p.replicated_biases;
    sum.expert_weights += p.expert_weights;
    sum.linear_modules += p.linear_modules;
    sum.expert_linear_modules += p.expert_linear_modules;
  }
  return sum;
}

ForwardFlops Layer::forward_flops(const ModelSpec& m, double tokens, double s_kv) const {
  ForwardFlops out;
  for (const auto& b : blocks_) b->forward_flops(m, tokens, s_kv, out);
  return out;
}

std::vector<ActivationTerm> Layer::activation_terms(const ActivationShape& a) const {
  std::vector<ActivationTerm> out;
  for (const auto& b : blocks_) b->activation_terms(a, out);
  if (a.gemm_input_scale != 1.0)
    for (auto& term : out)
      if (term.gemm_input) term.bytes *= a.gemm_input_scale;
  return out;
}

ActivationSums sum_activation_terms(const std::vector<ActivationTerm>& terms) {
  ActivationSums sum;
  for (const auto& term : terms) {
    if (term.split == ActivationTerm::Split::sequence)
      sum.sequence += term.bytes;
    else if (term.selective_recomputed)
      sum.selective += term.bytes;
    else
      sum.tensor += term.bytes;
  }
  return sum;
}

double Layer::activation_bytes(const ActivationShape& a, int64_t tp, bool sequence_parallel, Recompute r) const {
  const double t = static_cast<double>(tp);
  if (r == Recompute::full) {
    // The layer's input: the input terms of its first block that has any.
    for (const auto& b : blocks_) {
      std::vector<ActivationTerm> terms;
      b->activation_terms(a, terms);
      std::erase_if(terms, [](const ActivationTerm& term) { return !term.input; });
      if (terms.empty()) continue;
      const ActivationSums in = sum_activation_terms(terms);
      return (sequence_parallel ? in.sequence / t : in.sequence) + (in.tensor + in.selective) / t;
    }
    return 0.0;
  }
  const ActivationSums sum = sum_activation_terms(activation_terms(a));
  const double selective = r == Recompute::selective ? 0.0 : sum.selective;
  // Whole, then the TP-split terms, in the order memory.cpp has always added them.
  return sequence_parallel ? (sum.sequence + sum.tensor + selective) / t
                           : sum.sequence + (sum.tensor + selective) / t;
}

std::vector<BlockSpec> dense_layer_spec(const ModelSpec&) {
  return {{BlockKind::norm, "input_norm", "input_norm_bwd"},
          {BlockKind::attention},
          {BlockKind::residual},
          {BlockKind::norm, "post_attention_norm", "post_attention_norm_bwd"},
          {BlockKind::mlp},
          {BlockKind::residual}};
}

std::vector<BlockSpec> layer_spec(const ModelSpec& m, int kind) {
  std::vector<BlockSpec> spec = dense_layer_spec(m);
  for (auto& b : spec) {
    if (b.kind == BlockKind::mlp && (kind & 1)) b.kind = BlockKind::moe;
    if (b.kind == BlockKind::attention) {
      b.windowed = (kind & 2) != 0;
      if (kind & 4) b.kind = BlockKind::mla;
    }
  }
  return spec;
}

std::array<int64_t, kLayerKinds> layer_kind_counts(const ModelSpec& m, int64_t first, int64_t count) {
  std::array<int64_t, kLayerKinds> n{};
  if (count <= 0) return n;
  const MoeSpec& moe = m.moe;
  if (m.attention.window <= 0 && moe.layer_pattern.empty() && first >= 0 && moe.layer_freq >= 1) {
    // No window and MoE by first_k_dense / layer_freq: count the MoE layers in closed form
    // (a sweep asks for every stage's counts), the same as the loop below.
    const size_t base = m.mla.enabled() ? 4 : 0;
    int64_t moe_layers = 0;
    if (moe.enabled()) {
      const int64_t lo = std::max(first, moe.first_k_dense) - moe.first_k_dense, hi = first + count - moe.first_k_dense;
      const int64_t f = moe.layer_freq;
      if (hi > lo) moe_layers = (hi + f - 1) / f - (lo + f - 1) / f;  // multiples of f in [lo, hi)
    }
    n[base + 1] = moe_layers;
    n[base] = count - moe_layers;
    return n;
  }
  for (int64_t i = first; i < first + count; ++i) ++n[static_cast<size_t>(layer_kind(m, i))];
  return n;
}

ModelBlocks::ModelBlocks(const ModelSpec& m)
    : moe_(m.moe), attention_(m.attention), mla_(m.mla.enabled()), layers_(m.layers) {}

namespace {
/// The process-wide blocks: built on first use (thread-safe static initialisation), read-only.
struct SharedBlocks {
  EmbeddingBlock embedding;
  LmHeadBlock head;
  MtpEntryBlock mtp_entry;
  std::array<std::unique_ptr<Layer>, kLayerKinds> kinds;
  SharedBlocks() {
    const ModelSpec m;  // layer_spec reads no width: a kind's block list is the same for every model
    for (int k = 0; k < kLayerKinds; ++k) kinds[static_cast<size_t>(k)] = std::make_unique<Layer>(layer_spec(m, k));
  }
};
const SharedBlocks& shared_blocks() {
  static const SharedBlocks b;
  return b;
}
}  // namespace

const Layer& ModelBlocks::kind(int k) const { return *shared_blocks().kinds.at(static_cast<size_t>(k)); }
const Block& ModelBlocks::embedding() const { return shared_blocks().embedding; }
const Block& ModelBlocks::head() const { return shared_blocks().head; }
const Block& ModelBlocks::mtp_entry() const { return shared_blocks().mtp_entry; }

}  // namespace dtsim::blocks
