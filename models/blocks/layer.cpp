#include "models/blocks/layer.hpp"

#include <utility>

#include "models/blocks/attention.hpp"
#include "models/blocks/embedding.hpp"
#include "models/blocks/lm_head.hpp"
#include "models/blocks/mlp.hpp"
#include "models/blocks/norm.hpp"

namespace dtsim::blocks {

namespace {

std::unique_ptr<Block> make_block(const BlockSpec& b) {
  switch (b.kind) {
    case BlockKind::norm: return std::make_unique<NormBlock>(b.name, b.bwd_name);
    case BlockKind::attention: return std::make_unique<AttentionBlock>();
    case BlockKind::residual: return std::make_unique<ResidualBlock>();
    case BlockKind::mlp: return std::make_unique<MlpBlock>();
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
  BlockParams sum;
  for (const auto& b : blocks_) {
    const BlockParams p = b->parameters(m);
    sum.sharded_weights += p.sharded_weights;
    sum.replicated_weights += p.replicated_weights;
    sum.sharded_biases += p.sharded_biases;
    sum.replicated_biases += p.replicated_biases;
  }
  const double t = static_cast<double>(tp);
  // In the order flops.cpp sums them, so that the two agree to the last bit.
  double n = sum.sharded_weights / t + sum.replicated_weights;
  n += sum.sharded_biases / t;
  n += sum.replicated_biases;
  return n;
}

std::vector<BlockSpec> dense_layer_spec(const ModelSpec&) {
  return {{BlockKind::norm, "input_norm", "input_norm_bwd"},
          {BlockKind::attention},
          {BlockKind::residual},
          {BlockKind::norm, "post_attention_norm", "post_attention_norm_bwd"},
          {BlockKind::mlp},
          {BlockKind::residual}};
}

ModelBlocks::ModelBlocks(const ModelSpec& m)
    : embedding_(std::make_unique<EmbeddingBlock>()),
      head_(std::make_unique<LmHeadBlock>()),
      dense_(dense_layer_spec(m)) {}

const Layer& ModelBlocks::layer(int64_t) const { return dense_; }

}  // namespace dtsim::blocks
