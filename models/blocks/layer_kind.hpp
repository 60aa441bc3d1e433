#pragma once
// Which kind of layer a global layer index is (models/blocks/layer.hpp builds one block list
// per kind): bit 0 = MoE (ModelSpec::moe.is_moe_layer), bit 1 = local (sliding-window)
// attention (AttentionWindow::windowed), bit 2 = multi-head latent attention (model-wide:
// ModelSpec::mla, models/blocks/mla.hpp). Kind 0 is the dense full-attention layer.
#include <cstdint>

#include "models/experiment.hpp"

namespace dtsim::blocks {

inline constexpr int kLayerKinds = 8;
inline int layer_kind(const MoeSpec& moe, const AttentionWindow& attention, bool mla, int64_t index) {
  return (moe.is_moe_layer(index) ? 1 : 0) + (attention.windowed(index) ? 2 : 0) + (mla ? 4 : 0);
}
/// The layer whose kind a global index takes: itself, or for a multi-token prediction layer
/// (index layers + d, model.mtp_layers) the last decoder layer: Megatron-Core builds the MTP
/// layer from the decoder's layer spec and counts it as MoE when the last layer is
/// (megatron/training/training.py num_floating_point_operations, "last_layer_is_moe").
inline int64_t kind_source_layer(int64_t layers, int64_t index) { return index >= layers ? layers - 1 : index; }
inline int layer_kind(const ModelSpec& m, int64_t index) {
  return layer_kind(m.moe, m.attention, m.mla.enabled(), kind_source_layer(m.layers, index));
}

}  // namespace dtsim::blocks
