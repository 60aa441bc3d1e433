#include "models/zero3.hpp"

#include <algorithm>

#include "models/blocks/layer.hpp"

namespace dtsim {

Zero3Policy zero3_policy(const Layout& l, const Training& t) {
  Zero3Policy z;
  if (l.zero_stage != 3) return z;
  z.on = true;
  z.per_module = t.framework == Framework::deepspeed;
  z.backward_end_sync = t.framework == Framework::deepspeed;
  z.copy_kernels = t.framework == Framework::fsdp;
  z.reduce_waits_previous = t.framework == Framework::fsdp;
  return z;
}

GatherParts zero3_gather_parts(const ModelSpec& m, const Layout& l, const Training& t, int kind) {
  GatherParts g;
  if (!zero3_policy(l, t).per_module) return g;
  const blocks::BlockParams p = blocks::ModelBlocks(m).kind(kind).parameters(m);
  g.dense = std::max(1, p.linear_modules);
  g.expert = std::max(1, p.expert_linear_modules);
  return g;
}

int64_t zero3_kept_layers(const ModelSpec& m, const Layout& l, const Training& t, int64_t stage) {
  if (!zero3_policy(l, t).per_module || l.pp != 1 || stage != 0) return 0;
  const blocks::ModelBlocks mbk(m);
  const double tp = static_cast<double>(l.tp), experts = static_cast<double>(l.ep * l.expert_tp());
  auto layer_params = [&](int64_t i) {
    const blocks::Layer& ly = mbk.layer(i);
    return ly.parameters_per_tp_rank(m, l.tp) + ly.parameters(m).expert_weights / experts;
  };
  // The LM head's weight (or the tied embedding's) is fetched between the last layer's
  // forward and its backward.
  const double head = static_cast<double>(m.vocab) * static_cast<double>(m.hidden) / tp;
  double after = 0, kept_params = 0;  // elements of the layers after i; of the layers kept
  int64_t kept = 0;
  for (int64_t i = m.layers + m.mtp_layers - 1; i >= 0; --i) {
    const double p = layer_params(i);
    if (2.0 * after + head > t.stage3_max_reuse_distance || kept_params + p > t.stage3_max_live_parameters) break;
    kept_params += p;
    after += p;
    ++kept;
  }
  return kept;
}

double fsdp_copy_out_bytes(double params) { return 2.0 * 2.0 * params; }

double fsdp_grad_copy_in_bytes(double params, double grad_bytes) { return 2.0 * grad_bytes * params; }

}  // namespace dtsim
