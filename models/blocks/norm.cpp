#include "models/blocks/norm.hpp"

namespace dtsim::blocks {

void norm(BlockContext& c, const char* name, Phase ph, int layer, int mb) {
  const double bytes = kAct * 2.0 * c.norm_tokens * c.h;
  if (ph == Phase::backward)
    c.compute(name, ph, layer, mb, KernelKind::memory, 0, bytes * kNormBwd);
  else
    c.compute(name, ph, layer, mb, KernelKind::memory, 0, bytes);
}

void dropout_residual(BlockContext& c, const char* name, Phase ph, int layer, int mb) {
  // read input and residual, write output (2 B each) and the 1-byte dropout mask.
  const double bytes = c.norm_tokens * c.h * (3 * kAct + 1);
  c.compute(name, ph, layer, mb, KernelKind::memory, 0, ph == Phase::backward ? bytes * kElementwiseBwd : bytes);
}

void NormBlock::forward(BlockContext& c, int layer, int mb, Phase ph) const { norm(c, name_, ph, layer, mb); }

void NormBlock::backward(BlockContext& c, int layer, int mb, BackwardPart part) const {
  if (part != BackwardPart::weight) norm(c, bwd_name_, Phase::backward, layer, mb);
}

BlockParams NormBlock::parameters(const ModelSpec& m) const {
  BlockParams p;
  p.replicated_weights = static_cast<double>(norm_parameters(m));
  return p;
}

void NormBlock::activation_terms(const ActivationShape& a, std::vector<ActivationTerm>& out) const {
  const double sb = a.s * a.b;
  out.push_back({"norm_input", 2.0 * sb * static_cast<double>(a.m.hidden), ActivationTerm::Split::sequence, false,
                 true});
}

void ResidualBlock::activation_terms(const ActivationShape& a, std::vector<ActivationTerm>& out) const {
  const double sb = a.s * a.b;
  out.push_back({"dropout_mask", sb * static_cast<double>(a.m.hidden), ActivationTerm::Split::sequence});
}

void ResidualBlock::forward(BlockContext& c, int layer, int mb, Phase ph) const {
  dropout_residual(c, "dropout_residual", ph, layer, mb);
}

void ResidualBlock::backward(BlockContext& c, int layer, int mb, BackwardPart part) const {
  if (part != BackwardPart::weight) dropout_residual(c, "dropout_residual_bwd", Phase::backward, layer, mb);
}

}  // namespace dtsim::blocks
