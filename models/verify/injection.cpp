// Names and applicability of the injected bugs (models/verify/verify.hpp).
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "models/errors.hpp"
#include "models/verify/verify.hpp"

namespace dtsim::verify {

const char* to_string(Injection i) {
  switch (i) {
    case Injection::none: return "none";
    case Injection::tp_grad_avg: return "tp-grad-avg";
    case Injection::dp_local_mean: return "dp-local-mean";
    case Injection::cp_loss_scale: return "cp-loss-scale";
    case Injection::adam_before_sync: return "adam-before-sync";
    case Injection::dp_grad_sum: return "dp-grad-sum";
    case Injection::cp_causal_local: return "cp-causal-local";
    case Injection::zero_skip_param_gather: return "zero-skip-param-gather";
    case Injection::pp_microbatch_swap: return "pp-microbatch-swap";
    case Injection::w_before_b: return "w-before-b";
    case Injection::drop_w: return "drop-w";
    case Injection::ep_grad_avg_over_ep: return "ep-grad-avg-over-ep";
    case Injection::moe_combine_unweighted: return "moe-combine-unweighted";
    case Injection::mla_down_grad_unreduced: return "mla-down-grad-unreduced";
  }
  return "?";
}

std::vector<Injection> all_injections() {
  return {Injection::tp_grad_avg,       Injection::dp_local_mean,   Injection::cp_loss_scale,
          Injection::adam_before_sync,  Injection::dp_grad_sum,     Injection::cp_causal_local,
          Injection::zero_skip_param_gather, Injection::pp_microbatch_swap, Injection::w_before_b,
          Injection::drop_w, Injection::ep_grad_avg_over_ep, Injection::moe_combine_unweighted,
          Injection::mla_down_grad_unreduced};
}

Injection parse_injection(const std::string& name) {
  if (name == "none") return Injection::none;
  std::string valid;
  for (Injection i : all_injections()) {
    if (name == to_string(i)) return i;
    valid += valid.empty() ? "" : ", ";
    valid += to_string(i);
  }
  throw InputError("--inject " + name + ": unknown bug; valid: " + valid);
}

std::string injection_inapplicable(Injection inj, const Experiment& e) {
  const Layout& l = e.layout;
  const int64_t dpcp = l.dp * l.cp;
  const int64_t m = e.training.accumulation(l);
  switch (inj) {
    case Injection::none: return "";
    case Injection::tp_grad_avg: return l.tp > 1 ? "" : "needs layout.tp > 1";
    case Injection::dp_local_mean:
      return dpcp * m > 1 ? "" : "needs more than one local token shard (dp * cp * accumulation > 1)";
    case Injection::cp_loss_scale: return l.cp > 1 ? "" : "needs layout.cp > 1";
    case Injection::adam_before_sync: return dpcp > 1 ? "" : "needs a gradient sync (dp * cp > 1)";
    case Injection::dp_grad_sum: return dpcp > 1 ? "" : "needs a gradient sync (dp * cp > 1)";
    case Injection::cp_causal_local: return l.cp > 1 ? "" : "needs layout.cp > 1";
    case Injection::zero_skip_param_gather:
      return l.zero_stage >= 1 && dpcp > 1 ? "" : "needs layout.zero_stage >= 1 and dp * cp > 1";
    case Injection::pp_microbatch_swap:
      return l.pp > 1 && m > 1 ? "" : "needs layout.pp > 1 and more than one micro-batch";
    case Injection::w_before_b:
    case Injection::drop_w: return "";  // every plan has weight-gradient ops on its first stage
    case Injection::ep_grad_avg_over_ep:
      // Averaging over EP mixes different experts' gradients (and drops the 1 / |DPxCP| scale).
      return e.model.moe.enabled() && l.ep > 1 && l.edp() > 1
                 ? ""
                 : "needs a mixture-of-experts model with layout.ep > 1 and an EDP reduction (edp = dp tp cp / (etp ep) > 1)";
    case Injection::moe_combine_unweighted: return e.model.moe.enabled() ? "" : "needs a mixture-of-experts model";
    case Injection::mla_down_grad_unreduced:
      // Only sequence parallelism makes those gradients TP partial sums (models/verify/ops_mla.cpp):
      // without it every TP rank computes them completely and nothing sums them.
      return e.model.mla.enabled() && l.tp > 1 && l.sequence_parallel
                 ? ""
                 : "needs multi-head latent attention (model.mla) with layout.tp > 1 and sequence_parallel (only then "
                   "are the down-projection and latent-norm gradients TP partial sums)";
  }
  return "";
}

namespace {
bool is_layer_wgrad(const Op& op) {
  const std::string_view n = op.name;
  return op.type == OpType::compute && op.layer >= 0 && n.size() > 6 && n.substr(n.size() - 6) == "_wgrad";
}
}  // namespace

StepPlan apply_plan_injection(const StepPlan& plan, Injection inj) {
  if (inj != Injection::w_before_b && inj != Injection::drop_w) return plan;
  StepPlan out = plan;
  if (out.stages.empty()) throw InputError(std::string("--inject ") + to_string(inj) + ": the plan has no stages");
  auto& ops = out.stages.front().ops;
  const auto w = std::find_if(ops.begin(), ops.end(), is_layer_wgrad);
  if (w == ops.end())
    throw InputError(std::string("--inject ") + to_string(inj) + ": stage 0 has no weight-gradient (*_wgrad) op");
  if (inj == Injection::drop_w) {
    ops.erase(w);
    return out;
  }
  const Op moved = *w;
  const auto b = std::find_if(ops.begin(), ops.end(), [&](const Op& o) {
    return o.phase == Phase::backward && o.layer == moved.layer && o.micro_batch == moved.micro_batch;
  });
  const auto at = b - ops.begin();
  ops.erase(w);
  ops.insert(ops.begin() + at, moved);
  return out;
}

bool VerifyReport::passed() const {
  for (const auto& r : rules)
    if (r.applicable && !r.passed) return false;
  return true;
}

const RuleResult& VerifyReport::rule(const std::string& name) const {
  for (const auto& r : rules)
    if (r.name == name) return r;
  throw InputError("verify report has no rule " + name);
}

}  // namespace dtsim::verify
