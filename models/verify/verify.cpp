// verify_experiment: shrink, build the plan, run it next to the reference, collect rules.
#include "models/verify/verify.hpp"

#include <string>

#include <fmt/format.h>

#include "models/errors.hpp"
#include "models/plan.hpp"
#include "models/verify/interpreter.hpp"
#include "models/verify/tensor.hpp"
#include "models/verify/tiny_model.hpp"

namespace dtsim::verify {

namespace {

bool plan_has_op(const StepPlan& plan, const char* name) {
  for (const auto& st : plan.stages)
    for (const auto& op : st.ops)
      if (std::string_view(op.name) == name) return true;
  return false;
}

/// Static facts about the plan that explain a failing rule (the gaps the verifier found
/// in models/plan.cpp); each names what the plan would need.
std::vector<std::string> plan_gaps(const StepPlan& plan) {
  std::vector<std::string> out;
  const Layout& l = plan.exp.layout;
  const bool sp = l.sequence_parallel && l.tp > 1;
  if (sp && !plan_has_op(plan, "tp_sp_grad_allreduce"))
    out.push_back(
        "plan gap (sequence parallel): the gradients of parameters replicated over TP but applied to sequence "
        "shards (input/post-attention/final norm weights and biases, out_proj and mlp_down biases) are TP partial "
        "sums, and no op sums them over TP (Megatron: finalize_model_grads.py _allreduce_layernorm_grads). Wanted: "
        "after the DP gradient sync (as Megatron) and before optimizer_adam, one op "
        "{type collective, name \"tp_sp_grad_allreduce\", kind TP, AllReduce, reduce SUM, group TP, phase optimizer, "
        "layer -1, size_bytes = those elements on the stage x grad_bytes_per_param}");
  if (plan.exp.model.tied_embeddings && l.pp > 1 && !plan_has_op(plan, "embedding_grad_allreduce"))
    out.push_back(
        "plan gap (tied embeddings, pp > 1): the first stage's word embedding and the last stage's copy used by the "
        "LM head each get only their own gradient, and no op sums them (Megatron: _allreduce_embedding_grads over "
        "the embedding group, Narayanan 2021 Sec 4). Wanted: a GroupKind for {first stage, last stage} ranks with "
        "equal tp/cp/dp coordinates and, on both stages after the backward, an AllReduce SUM of the V/t x h word "
        "embedding gradient over it");
  // Tied embeddings with sharded gradients: is the embedding AllReduce after a DP
  // ReduceScatter that shares the embedding's bucket with other parameters?
  bool emb_after_rs = false;
  {
    const auto& ops = plan.stages.front().ops;
    int64_t ar = -1, rs = -1;
    bool own_bucket = false;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (std::string_view(ops[i].name) == "embedding_grad_allreduce") ar = static_cast<int64_t>(i);
      if (std::string_view(ops[i].name) == "dp_grad_reducescatter") rs = static_cast<int64_t>(i);
      own_bucket = own_bucket || ops[i].grad_bucket == GradBucket::tied_embedding;
    }
    emb_after_rs = ar >= 0 && rs >= 0 && ar > rs && !own_bucket;
  }
  if (plan.exp.model.tied_embeddings && l.pp > 1 && l.zero_stage >= 1 && l.dp * l.cp > 1 && emb_after_rs)
    out.push_back(
        "plan gap (tied embeddings, pp > 1, ZeRO >= 1): the word embedding shares a DP gradient bucket with other "
        "parameters on both stages, so the two stages' ReduceScatters give its elements different owners and the "
        "embedding_grad_allreduce after them adds reduced to unreduced values. Wanted: on the first and the last "
        "stage, the tied word embedding's gradient in a dp_grad_reducescatter of its own (V/t x h elements), as "
        "Megatron-Core does (param_and_grad_buffer.py _does_param_require_new_bucket), marked "
        "Op::grad_bucket = GradBucket::tied_embedding");
  bool gathers_rest = false;  // a dp_param_allgather of the non-layer parameters
  for (const auto& st : plan.stages)
    for (const auto& op : st.ops)
      gathers_rest = gathers_rest || (std::string_view(op.name) == "dp_param_allgather" && op.layer < 0);
  const bool layer_gathers_only = l.zero_stage == 3 || ((l.zero_stage == 1 || l.zero_stage == 2) &&
                                                         plan.exp.training.overlap_param_gather);
  if (layer_gathers_only && l.dp * l.cp > 1 && !gathers_rest)
    out.push_back(fmt::format(
        "plan gap (ZeRO-{}{}): the embedding, final norm and LM head gradients are reduce-scattered and updated by "
        "their owners, but no dp_param_allgather gathers them back (the per-layer gathers cover layers only), so "
        "non-owners use stale values from the second step on. Wanted: a dp_param_allgather with layer -1 of those "
        "parameters (size = their elements x 2 bytes) after optimizer_adam or before their first use",
        l.zero_stage, l.zero_stage == 3 ? "" : " with overlap_param_gather"));
  return out;
}

}  // namespace

VerifyReport verify_experiment(const Experiment& e, const VerifyOptions& o) {
  const Experiment shrunk = shrink_experiment(e);
  const std::string why = injection_inapplicable(o.inject, shrunk);
  if (!why.empty())
    throw InputError(e.source + ": --inject " + to_string(o.inject) + " cannot show on this layout: it " + why);
  VerifyReport rep = verify_plan(build_step_plan(shrunk), o);
  rep.original = e;
  return rep;
}

VerifyReport verify_plan(const StepPlan& plan, const VerifyOptions& o) {
  if (o.steps < 1) throw InputError("--steps " + std::to_string(o.steps) + " must be >= 1");
  VerifyReport rep;
  rep.original = plan.exp;
  rep.shrunk = plan.exp;
  rep.steps = o.steps;
  rep.inject = o.inject;
  const std::string why = injection_inapplicable(o.inject, rep.shrunk);
  if (!why.empty()) throw InputError("--inject " + std::string(to_string(o.inject)) + " cannot show on this layout: it " + why);
  const TinyModel model(rep.shrunk);
  const Layout& l = rep.shrunk.layout;
  rep.world = l.dp * l.tp * l.cp * l.pp;

  {
    Interpreter it(model, plan, o);
    std::vector<double> params = init_params(model, o.seed);
    it.load_params(params);
    refmath::AdamState ref_adam;
    const refmath::AdamHyper hp = verify_adam();
    for (int s = 1; s <= o.steps && it.runnable(); ++s) {
      const Batch batch = make_batch(model, o.seed + 1000 * static_cast<uint64_t>(s));
      const RefStep ref = reference_step(model, params, batch);
      it.run_step(s, batch, ref);
      params = refmath::adam_step(params, ref.grad, ref_adam, hp).params;
      it.compare_state(s, params, ref_adam);
    }
    rep.rules = it.rules();
    rep.notes = it.notes();
  }
  pool_release();  // the run's matrices are gone: hand their recycled storage back
  for (auto& g : plan_gaps(plan)) rep.notes.push_back(std::move(g));
  return rep;
}

}  // namespace dtsim::verify
