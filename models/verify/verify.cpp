// verify_experiment: shrink, build the plan, run it next to the reference, collect rules.
#include "models/verify/verify.hpp"

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "models/checked.hpp"
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
  // A copy of the tied word embedding exists where a stage runs the LM head without the
  // embedding (not when one rank holds both, as under DualPipe / DualPipeV).
  bool head_copy = false;
  for (const auto& st : plan.stages) {
    bool head = false, emb = false;
    for (const auto& op : st.ops) {
      head = head || std::string(op.name) == "lm_head";
      emb = emb || std::string(op.name) == "embedding";
    }
    head_copy = head_copy || (head && !emb);
  }
  if (plan.exp.model.tied_embeddings && head_copy && !plan_has_op(plan, "embedding_grad_allreduce"))
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

/// The single-device reference steps, each with its batch and the parameters and Adam
/// moments after its update. Asynchronous: computed on a thread of their own, step s as
/// soon as the interpreter is done with step s - 1 (one step's tensors alive, freed on that
/// thread so that its storage pool recycles them), each streamed (RefStep::probe waits for
/// a tensor not published yet): the interpreter runs step s while its reference is still
/// being computed, and the plan is built while the first one is. Synchronous (threads ==
/// 1): computed on demand by the calling thread. The same arithmetic either way.
class RefPipeline {
 public:
  RefPipeline(const TinyModel& m, const VerifyOptions& o, bool async)
      : m_(m), steps_(o.steps), async_(async), hp_(verify_adam()) {
    params_ = init_params(m, o.seed);
    initial_ = params_;
    const size_t n = static_cast<size_t>(steps_) + 1;
    batches_.resize(n);
    refs_.resize(n);
    after_.resize(n);
    adam_after_.resize(n);
    for (int s = 1; s <= steps_; ++s) batches_[static_cast<size_t>(s)] = make_batch(m, o.seed + 1000 * static_cast<uint64_t>(s));
    if (async_) thread_ = std::thread([this] { run(); });
  }
  ~RefPipeline() {
    if (!thread_.joinable()) return;
    {
      const std::lock_guard<std::mutex> lock(mu_);
      cancel_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  RefPipeline(const RefPipeline&) = delete;
  RefPipeline& operator=(const RefPipeline&) = delete;

  const std::vector<double>& initial_params() const { return initial_; }
  const Batch& batch(int s) const { return batches_[static_cast<size_t>(s)]; }
  /// Reference step s (streamed: possibly still being computed).
  const RefStep& ref(int s) {
    const size_t i = static_cast<size_t>(s);
    if (!async_) {
      if (s >= 2) {  // done with the previous step: recycle its storage
        refs_[i - 1].reset();
        after_[i - 1] = {};
        adam_after_[i - 1] = {};
      }
      refs_[i] = std::make_unique<RefStep>(reference_step(m_, params_, batches_[i]));
      params_ = refmath::adam_step(params_, refs_[i]->grad, adam_, hp_).params;
      after_[i] = params_;
      adam_after_[i] = adam_;
      return *refs_[i];
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return started_ >= s || error_; });
    if (started_ < s) std::rethrow_exception(error_);
    return *refs_[i];
  }
  /// The parameters and Adam moments after step s's update (after ref(s)).
  std::pair<const std::vector<double>*, const refmath::AdamState*> after(int s) {
    const size_t i = static_cast<size_t>(s);
    if (async_) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return updated_ >= s || error_; });
      if (updated_ < s) std::rethrow_exception(error_);
    }
    return {&after_[i], &adam_after_[i]};
  }
  /// The interpreter is done with step s.
  void release(int s) {
    if (!async_) return;
    {
      const std::lock_guard<std::mutex> lock(mu_);
      released_ = s;
    }
    cv_.notify_all();
  }

 private:
  void run() {
    try {
      for (int s = 1; s <= steps_; ++s) {
        const size_t i = static_cast<size_t>(s);
        {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait(lock, [&] { return cancel_ || released_ >= s - 1; });
          if (cancel_) return;
        }
        if (s >= 2) {  // freed on this thread, whose storage pool then recycles it
          refs_[i - 1].reset();
          after_[i - 1] = {};
          adam_after_[i - 1] = {};
        }
        auto r = std::make_unique<RefStep>();
        prepare_reference_step(m_, *r);
        RefStep* rp = r.get();
        {
          const std::lock_guard<std::mutex> lock(mu_);
          refs_[i] = std::move(r);
          started_ = s;
        }
        cv_.notify_all();
        reference_step_into(m_, params_, batches_[i], *rp);
        if (std::exception_ptr failed = rp->failure()) {
          const std::lock_guard<std::mutex> lock(mu_);
          error_ = failed;
          cv_.notify_all();
          return;
        }
        params_ = refmath::adam_step(params_, rp->grad, adam_, hp_).params;
        {
          const std::lock_guard<std::mutex> lock(mu_);
          after_[i] = params_;
          adam_after_[i] = adam_;
          updated_ = s;
        }
        cv_.notify_all();
      }
    } catch (...) {
      const std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
    }
  }

  const TinyModel& m_;
  const int steps_;
  const bool async_;
  const refmath::AdamHyper hp_;
  std::vector<double> params_, initial_;  // params_: after the last update computed
  refmath::AdamState adam_;
  std::vector<Batch> batches_;                    // [step]
  std::vector<std::unique_ptr<RefStep>> refs_;    // [step]
  std::vector<std::vector<double>> after_;        // [step]
  std::vector<refmath::AdamState> adam_after_;    // [step]
  std::mutex mu_;
  std::condition_variable cv_;
  int started_ = 0, updated_ = 0, released_ = 0;
  bool cancel_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

/// verify_plan's work; `refs` (may be null) computes the reference steps of `model`.
VerifyReport run_verification(const StepPlan& plan, const TinyModel& model, const VerifyOptions& o,
                              std::unique_ptr<RefPipeline> refs) {
  VerifyReport rep;
  rep.original = plan.exp;
  rep.shrunk = plan.exp;
  rep.steps = o.steps;
  rep.inject = o.inject;
  const Layout& l = rep.shrunk.layout;
  rep.world = l.dp * l.tp * l.cp * l.pp;

  VerifyOptions opts = o;
  // Bugs that edit the plan run on an edited copy (apply_plan_injection).
  const bool edits = o.inject == Injection::w_before_b || o.inject == Injection::drop_w;
  const StepPlan edited = edits ? apply_plan_injection(plan, o.inject) : StepPlan{};
  const StepPlan& injected = edits ? edited : plan;
  while (true) {
    if (!refs) refs = std::make_unique<RefPipeline>(model, opts, opts.threads != 1);
    Interpreter it(model, injected, opts);
    it.load_params(refs->initial_params());
    for (int s = 1; s <= o.steps && it.runnable(); ++s) {
      const RefState after = [&refs, s] { return refs->after(s); };
      it.run_step(s, refs->batch(s), refs->ref(s), after, s == o.steps);
      refs->release(s);
    }
    if (it.rerun_serial()) {  // a plan problem on a stage thread: report it in the serial order
      opts.threads = 1;
      refs.reset();
      continue;
    }
    rep.rules = it.rules();
    rep.notes = it.notes();
    break;
  }
  refs.reset();
  pool_release();  // the run's matrices are gone: hand their recycled storage back
  for (auto& g : plan_gaps(plan)) rep.notes.push_back(std::move(g));
  return rep;
}

void check_steps(const VerifyOptions& o) {
  if (o.steps < 1) throw InputError("--steps " + std::to_string(o.steps) + " must be >= 1");
}

/// Every rank's tensors and records live in this process, so memory and time grow with the
/// ranks: refuse a world above kMaxVerifyRanks before allocating any.
void check_world(const Experiment& e) {
  const Layout& l = e.layout;
  const auto world = checked::product({l.dp, l.tp, l.cp, l.pp});
  if (!world || *world > kMaxVerifyRanks)
    throw InputError(e.source + ": layout.dp x tp x cp x pp = " + std::to_string(l.dp) + " x " + std::to_string(l.tp) +
                     " x " + std::to_string(l.cp) + " x " + std::to_string(l.pp) + " = " +
                     (world ? checked::with_commas(*world) : std::string("more than 2^63")) +
                     " ranks: dtsim verify runs at most " + checked::with_commas(kMaxVerifyRanks) +
                     " (it holds every rank's tensors in one process, about 200 KB per rank: " +
                     checked::with_commas(kMaxVerifyRanks) +
                     " ranks take about 3 GB and minutes); verify a smaller dp with the same tp, cp and pp");
}

/// Model features the interpreter does not execute on numbers (verify.hpp): refuse before
/// any work instead of failing on the first unknown op or giving a wrong reference.
void check_modelled(const Experiment& e) {
  const ModelSpec& m = e.model;
  if (m.attention.window > 0)
    throw InputError(e.source + ": model.attention.window: dtsim verify does not execute sliding-window attention "
                     "(window " + std::to_string(m.attention.window) + "); it verifies full causal attention");
  if (m.attention.sinks)
    throw InputError(e.source + ": model.attention.sinks: dtsim verify does not execute attention sinks; it "
                     "verifies plain softmax attention");
  if (m.moe.enabled() && m.moe.capacity_factor > 0)
    throw InputError(e.source + ": model.moe.capacity_factor: dtsim verify does not execute capacity factor (token "
                     "drop); verify the dropless layout (capacity_factor 0)");
  if (m.mtp_layers > 0)
    throw InputError(e.source + ": model.mtp_layers: dtsim verify does not execute multi-token prediction depths; "
                     "verify the layout with model.mtp_layers 0 (--set model.mtp_layers=0)");
  if (m.moe.enabled() && m.activation != Activation::swiglu)
    throw InputError(e.source + ": model.moe: dtsim verify executes mixture-of-experts models with activation swiglu "
                     "only (the routed and shared experts are SwiGLU)");
}

}  // namespace

VerifyReport verify_experiment(const Experiment& e, const VerifyOptions& o) {
  check_steps(o);
  check_modelled(e);
  check_world(e);
  const Experiment shrunk = shrink_experiment(e);
  const std::string why = injection_inapplicable(o.inject, shrunk);
  if (!why.empty())
    throw InputError(e.source + ": --inject " + to_string(o.inject) + " cannot show on this layout: it " + why);
  const TinyModel model(shrunk);
  // The first reference step runs while the plan is built.
  auto refs = std::make_unique<RefPipeline>(model, o, o.threads != 1);
  VerifyReport rep = run_verification(build_step_plan(shrunk), model, o, std::move(refs));
  rep.original = e;
  // Switched off by shrink_experiment (tiny_model.hpp): said, not hidden.
  if (e.model.moe.router_expert_bias)
    rep.notes.push_back("model.moe.router_enable_expert_bias: not executed (the bias is updated from load "
                        "statistics, not gradients); verified without it");
  if (e.model.moe.router_num_groups > 0)
    rep.notes.push_back("model.moe.router_num_groups: group-limited routing not executed; verified with plain top-k");
  return rep;
}

VerifyReport verify_plan(const StepPlan& plan, const VerifyOptions& o) {
  check_steps(o);
  check_modelled(plan.exp);
  check_world(plan.exp);
  const std::string why = injection_inapplicable(o.inject, plan.exp);
  if (!why.empty()) throw InputError("--inject " + std::string(to_string(o.inject)) + " cannot show on this layout: it " + why);
  const TinyModel model(plan.exp);
  return run_verification(plan, model, o, nullptr);
}

}  // namespace dtsim::verify
