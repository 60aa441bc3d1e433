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

void add_sp_grad_sync(StepPlan& plan) {
  const Layout& l = plan.exp.layout;
  if (!(l.sequence_parallel && l.tp > 1) || has_op(plan, "tp_sp_grad_allreduce")) return;
  const ModelSpec& m = plan.exp.model;
  const double per_layer =
      2.0 * static_cast<double>(norm_parameters(m)) + (has_linear_biases(m) ? 2.0 * static_cast<double>(m.hidden) : 0.0);
  for (auto& st : plan.stages) {
    double n = per_layer * static_cast<double>(layers_of(st).size());
    if (st.stage == l.pp - 1) n += static_cast<double>(norm_parameters(m));
    Op op;
    op.type = OpType::collective;
    op.name = "tp_sp_grad_allreduce";
    op.phase = Phase::optimizer;
    op.kind = CommKind::TP;
    op.collective = Collective::AllReduce;
    op.reduce = ReduceOp::sum;
    op.group = GroupKind::TP;
    op.size_bytes = n * static_cast<double>(plan.shape.grad_bytes_per_param);
    st.ops.insert(optimizer_op(st), op);
  }
}

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

void embedding_grad_before_dp_sync(StepPlan& plan) {
  const Layout& l = plan.exp.layout;
  if (!(plan.exp.model.tied_embeddings && l.pp > 1 && (l.zero_stage == 1 || l.zero_stage == 2) && l.dp * l.cp > 1))
    return;
  const int last_mb = static_cast<int>(plan.shape.micro_batches - 1);
  for (auto& st : plan.stages) {
    auto ar = std::find_if(st.ops.begin(), st.ops.end(),
                           [](const Op& op) { return std::string_view(op.name) == "embedding_grad_allreduce"; });
    if (ar == st.ops.end()) continue;
    const Op moved = *ar;
    st.ops.erase(ar);
    // The last write of the word-embedding gradient on this stage, then the first DP
    // gradient collective after it (the one that takes the gradient).
    const char* writer = st.stage == 0 ? "embedding_bwd" : "lm_head_wgrad";
    size_t last = 0;
    for (size_t i = 0; i < st.ops.size(); ++i)
      if (std::string_view(st.ops[i].name) == writer && st.ops[i].micro_batch == last_mb) last = i;
    size_t at = last + 1;
    while (at < st.ops.size() && std::string_view(st.ops[at].name).rfind("dp_grad_", 0) != 0) ++at;
    st.ops.insert(st.ops.begin() + static_cast<std::ptrdiff_t>(at), moved);
  }
}

void close_known_gaps(StepPlan& plan) {
  add_sp_grad_sync(plan);
  add_rest_param_gather(plan);
  embedding_grad_before_dp_sync(plan);
}

}  // namespace dtsim::verify
