#include "models/moe.hpp"

#include <algorithm>
#include <cmath>

#include "models/precision.hpp"

namespace dtsim {

double moe_router_load(const MoeSpec& moe, const Layout& l) {
  if (!moe.enabled()) return 1.0;
  const double g = static_cast<double>(moe.num_experts) / static_cast<double>(std::max<int64_t>(1, l.ep));
  switch (moe.balance) {
    case RouterBalance::forced: return 1.0;
    case RouterBalance::measured: return std::max(1.0, moe.load_imbalance);
    case RouterBalance::aux_loss: return 1.0 + kMaxVioAuxLoss / g;
    case RouterBalance::aux_free: return 1.0 + kMaxVioAuxFree / g;
  }
  return 1.0;
}

double moe_load_factor(const MoeSpec& moe, const Layout& l) {
  const double load = moe_router_load(moe, l);
  if (moe.capacity_factor <= 0) return load;
  if (moe.pad_to_capacity) return moe.capacity_factor;
  return std::min(load, moe.capacity_factor);
}

MoeTokens moe_tokens(const Experiment& e, double micro_batch) {
  MoeTokens t;
  const MoeSpec& moe = e.model.moe;
  if (!moe.enabled()) return t;
  const Layout& l = e.layout;
  const bool sp = l.sequence_parallel && l.tp > 1;
  const double s = static_cast<double>(e.training.seq_len / std::max<int64_t>(1, l.cp));
  t.tokens = micro_batch * s / (sp ? static_cast<double>(l.tp) : 1.0);
  t.routed = t.tokens * static_cast<double>(moe.router_topk);
  t.load = moe_load_factor(moe, l);
  // Whole token rows: the busiest rank computes ceil(T k load) of them.
  t.received = std::ceil(t.routed * t.load);
  t.computed = t.received * static_cast<double>(l.expert_tp());
  t.local_experts = static_cast<double>(moe.num_experts) / static_cast<double>(std::max<int64_t>(1, l.ep));
  return t;
}

double moe_dispatch_bytes_per_element(const Training& t) {
  const bool fp8 = precision_recipe(t.precision).low_precision() && (t.moe_token_dispatcher == "deepep" || t.moe_token_dispatcher == "hybridep");
  // FP8 e4m3 payload plus one fp32 scale per 1x128 tile (DeepSeek-V3 report Sec 3.3.2).
  return fp8 ? 1.0 + 4.0 / 128.0 : 2.0;
}

}  // namespace dtsim
