#include "models/blocks/embedding.hpp"

namespace dtsim::blocks {

void EmbeddingBlock::forward(BlockContext& c, int layer, int mb, Phase ph) const {
  const double tok = c.b * c.s;
  // Vocab-parallel lookup: gather rows (read + write), add positions when learned.
  const double extra = c.m.position == Position::learned ? 2.0 : 0.0;
  c.compute("embedding", ph, layer, mb, KernelKind::memory, 0, kAct * (2.0 + extra) * tok * c.h);
  c.collective(c.sp_on ? "tp_reducescatter" : "tp_allreduce", ph, layer, mb, CommKind::TP,
               c.sp_on ? Collective::ReduceScatter : Collective::AllReduce, GroupKind::TP, kAct * tok * c.h);
}

void EmbeddingBlock::activation_terms(const ActivationShape& a, std::vector<ActivationTerm>& out) const {
  out.push_back({"dropout_mask", a.s * a.b * static_cast<double>(a.m.hidden), ActivationTerm::Split::sequence});
}

void EmbeddingBlock::backward(BlockContext& c, int layer, int mb, BackwardPart part) const {
  if (part == BackwardPart::input) return;
  const BlockContext::WeightPart w(c, part == BackwardPart::weight);
  const double tok = c.b * c.s;
  if (c.sp_on)
    c.collective("tp_allgather", Phase::backward, layer, mb, CommKind::TP, Collective::AllGather, GroupKind::TP,
                 kAct * tok * c.h);
  // Scatter-add of the output gradient into the fp32 embedding gradient.
  c.compute("embedding_bwd", Phase::backward, layer, mb, KernelKind::memory, 0, (kAct + 8.0) * tok * c.h);
}

}  // namespace dtsim::blocks
