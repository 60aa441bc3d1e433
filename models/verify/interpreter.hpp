#pragma once
// The numerical interpreter of a StepPlan (internal to models/verify/; the public entry
// point is verify_experiment in models/verify/verify.hpp, whose header documents the
// semantics). One Interpreter holds the tensors of every rank of the layout.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/plan.hpp"
#include "models/reference_math.hpp"
#include "models/verify/tiny_model.hpp"
#include "models/verify/verify.hpp"

namespace dtsim::verify {

/// The reference's parameters (flat) and Adam moments after a step's update.
using RefState = std::function<std::pair<const std::vector<double>*, const refmath::AdamState*>()>;

class Interpreter {
 public:
  /// `plan` must be build_step_plan(model.exp). Throws InputError when the plan's stages do
  /// not match the model (parameter counts, layers).
  Interpreter(const TinyModel& model, const StepPlan& plan, const VerifyOptions& opts);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  /// Loads the global parameters (flat, TinyModel layout) into every rank's shards.
  void load_params(const std::vector<double>& global);
  /// Runs one step of the plan on every rank and compares against `ref` (the reference
  /// step at the same parameters; it may still be streamed), then every rank's parameters
  /// and Adam moments against the reference's after the update, which `after` returns
  /// (it may wait for them; called from any of the interpreter's threads, concurrently).
  /// `last`: no step follows, so each stage's tensors may be freed once compared.
  void run_step(int step, const Batch& batch, const RefStep& ref, const RefState& after, bool last);
  /// False once a plan problem stopped execution (or rerun_serial()); later steps are not run.
  bool runnable() const;
  /// True when a step ran its stages on several threads and one of them stopped on a plan
  /// problem (or an exception): the state is then unusable and the caller must redo the
  /// verification with VerifyOptions::threads = 1, which reports the problem in the serial
  /// order of the ops. The report never depends on the thread count.
  bool rerun_serial() const;
  /// The rules (loss, DP, TP, CP, PP, ZeRO, plan) and notes gathered so far.
  std::vector<RuleResult> rules() const;
  std::vector<std::string> notes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtsim::verify
