#pragma once
// The numerical interpreter of a StepPlan (internal to models/verify/; the public entry
// point is verify_experiment in models/verify/verify.hpp, whose header documents the
// semantics). One Interpreter holds the tensors of every rank of the layout.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/plan.hpp"
#include "models/reference_math.hpp"
#include "models/verify/tiny_model.hpp"
#include "models/verify/verify.hpp"

namespace dtsim::verify {

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
  /// step at the same parameters).
  void run_step(int step, const Batch& batch, const RefStep& ref);
  /// After a step: every rank's parameters and Adam moments against the reference's.
  void compare_state(int step, const std::vector<double>& ref_params, const refmath::AdamState& ref_adam);
  /// False once a plan problem stopped execution; later steps are not run.
  bool runnable() const;
  /// The rules (loss, DP, TP, CP, PP, ZeRO, plan) and notes gathered so far.
  std::vector<RuleResult> rules() const;
  std::vector<std::string> notes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtsim::verify
