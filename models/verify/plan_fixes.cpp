#include "models/verify/plan_fixes.hpp"

#include <algorithm>
#include <set>
#include <string_view>

#include "models/errors.hpp"
#include "models/flops.hpp"

namespace dtsim::verify {

namespace {

constexpr double kParamBytes = 2.0;  // bf16 parameters, as the plan's other parameter gathers

bool has_op(const StepPlan& plan, std::string_view name, bool layer_minus_one = false) {
  for (const auto& st : plan.stages)
    for (const auto& op : st.ops)
      if (op.name == name && (!layer_minus_one || op.layer < 0)) return true;
  return false;
}

std::set<int> layers_of(const StagePlan& st) {
  std::set<int> out;
  for (const auto& op : st.ops)
    if (op.layer >= 0) out.insert(op.layer);
  return out;
}

std::vector<Op>::iterator optimizer_op(StagePlan& st) {
  auto it = std::find_if(st.ops.begin(), st.ops.end(),
                         [](const Op& op) { return std::string_view(op.name) == "optimizer_adam"; });
  if (it == st.ops.end()) throw InputError("plan stage " + std::to_string(st.stage) + " has no optimizer_adam");
  return it;
}

}  // namespace

void add_rest_param_gather(StepPlan& plan) {
  const Layout& l = plan.exp.layout;
  const bool layer_gathers_only =
      l.zero_stage == 3 || ((l.zero_stage == 1 || l.zero_stage == 2) && plan.exp.training.overlap_param_gather);
  if (!layer_gathers_only || l.dp * l.cp == 1 || has_op(plan, "dp_param_allgather", true)) return;
  const double layer = layer_parameters_per_tp_rank(plan.exp.model, l.tp);
  for (auto& st : plan.stages) {
    Op op;
    op.type = OpType::collective;
    op.name = "dp_param_allgather";
    op.phase = Phase::optimizer;
    op.kind = CommKind::DP;
    op.collective = Collective::AllGather;
    op.reduce = ReduceOp::none;
    op.group = GroupKind::DPxCP;
    const double rest = st.params_per_rank - layer * static_cast<double>(layers_of(st).size());
    if (rest < 0.5) continue;  // a middle stage: layers only
    op.size_bytes = rest * kParamBytes;
    st.ops.insert(optimizer_op(st) + 1, op);
  }
}

void close_known_gaps(StepPlan& plan) { add_rest_param_gather(plan); }

}  // namespace dtsim::verify
