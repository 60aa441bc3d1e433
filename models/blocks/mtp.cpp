#include "models/blocks/mtp.hpp"

#include "models/blocks/embedding.hpp"
#include "models/blocks/norm.hpp"

namespace dtsim::blocks {

void MtpEntryBlock::forward(BlockContext& c, int layer, int mb, Phase ph) const {
  const double tok = c.b * c.s;
  // The shared word embedding of the shifted tokens: the model's embedding lookup and TP sum
  // (MTP refuses learned positions, so it is the word embedding alone).
  EmbeddingBlock().forward(c, layer, mb, ph);
  norm(c, "mtp_enorm", ph, layer, mb);
  norm(c, "mtp_hnorm", ph, layer, mb);
  // eh_proj: [tokens, 2h] x [2h, h / t], the concatenation all-gathered first with SP.
  if (c.sp_on)
    c.collective("tp_allgather", ph, layer, mb, CommKind::TP, Collective::AllGather, GroupKind::TP,
                 kAct * tok * 2.0 * c.h);
  c.gemm("mtp_eh_proj", ph, layer, mb, 2.0 * tok * 2.0 * c.h * c.h / c.t, tok, c.h / c.t, 2.0 * c.h, Transpose::b);
  // gather_from_tensor_model_parallel_region: the h / t output columns of every TP rank.
  c.collective("tp_allgather", ph, layer, mb, CommKind::TP, Collective::AllGather, GroupKind::TP, kAct * tok * c.h);
}

void MtpEntryBlock::backward(BlockContext& c, int layer, int mb, BackwardPart part) const {
  const Phase ph = Phase::backward;
  const double tok = c.b * c.s;
  const bool in = part != BackwardPart::weight;
  const BlockContext::WeightPart w(c, part == BackwardPart::weight);
  // The output gather's backward keeps the rank's own columns (no communication).
  const double fl = 2.0 * tok * 2.0 * c.h * c.h / c.t;
  c.column_parallel_backward(
      layer, mb, part,
      [&] { c.gemm("mtp_eh_proj_dgrad", ph, layer, mb, fl, tok, 2.0 * c.h, c.h / c.t, Transpose::none); },
      [&] { c.gemm("mtp_eh_proj_wgrad", ph, layer, mb, fl, c.h / c.t, 2.0 * c.h, tok, Transpose::a); }, 2.0 * c.h);
  if (in) {
    norm(c, "mtp_hnorm_bwd", ph, layer, mb);
    norm(c, "mtp_enorm_bwd", ph, layer, mb);
  }
  EmbeddingBlock().backward(c, layer, mb, part);  // its scatter-add: a weight gradient only
}

BlockParams MtpEntryBlock::parameters(const ModelSpec& m) const {
  const double h = static_cast<double>(m.hidden);
  BlockParams p;
  p.sharded_weights = 2.0 * h * h;
  p.replicated_weights = 3.0 * h;
  p.linear_modules = 1;  // eh_proj (MultiTokenPredictionLayer)
  return p;
}

void MtpEntryBlock::forward_flops(const ModelSpec& m, double tokens, double, ForwardFlops& out) const {
  const double h = static_cast<double>(m.hidden);
  out.mtp_eh_proj += 2.0 * tokens * 2.0 * h * h;
}

void MtpEntryBlock::activation_terms(const ActivationShape& a, std::vector<ActivationTerm>& out) const {
  using Split = ActivationTerm::Split;
  const double sbh = a.s * a.b * static_cast<double>(a.m.hidden);
  out.push_back({"mtp_enorm_input", 2.0 * sbh, Split::sequence});
  out.push_back({"mtp_hnorm_input", 2.0 * sbh, Split::sequence});
  out.push_back({"mtp_eh_proj_input", 4.0 * sbh, Split::sequence});
}

}  // namespace dtsim::blocks
