// Overlap switches never make a step slower (issue: "overlap that never hurts"): on every
// shipped experiment, each overlap option that applies to its layout is simulated off and on
// (the folded SimGrid engine, everything else as the file has it), and "on" may be at most 1%
// slower than "off". Two exceptions, both explained in the README ("Overlap that costs"),
// where the framework behaves so:
//  - overlap_param_gather with pipeline parallelism and no interleaving (Megatron turns
//    align_param_gather off; each stage's first forwards wait for their gathers in turn
//    through the warm-up);
//  - an overlap whose only cost is the SMs its NCCL kernels take from the compute beside
//    them (training.comm_interference), proven here by simulating the pair again without
//    it: then "on" must not be slower. With PP, every stage's bucket reductions run beside its
//    last backward, which the cooldown chain to the first stage waits on, where the blocking
//    reduction of a later stage would have run in its idle tail.
// An option that the experiment's other settings exclude (an input error when switched on, e.g.
// cuda_graphs with overlap_moe_expert_parallel_comm) does not apply. Slow (label "slow"): two
// simulations per option and experiment (four for the second case).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "sim/engine.hpp"
#include "tests/unit/accounting_checks.hpp"

namespace dtsim {
namespace {

using namespace accounting_checks;

struct Switch {
  const char* name;
  std::function<bool(const Experiment&)> applies;
  std::function<void(Experiment&, bool)> set;
  /// The README's documented exception for this experiment, or nullptr.
  std::function<const char*(const Experiment&)> excused = [](const Experiment&) -> const char* { return nullptr; };
};

std::vector<Switch> switches() {
  auto dpcp = [](const Experiment& e) { return e.layout.dp * e.layout.cp > 1; };
  return {
      {"overlap_grad_reduce", dpcp, [](Experiment& e, bool on) { e.training.overlap_grad_reduce = on; }},
      {"overlap_param_gather",
       [dpcp](const Experiment& e) { return dpcp(e) && (e.layout.zero_stage == 1 || e.layout.zero_stage == 2); },
       [](Experiment& e, bool on) { e.training.overlap_param_gather = on; },
       [](const Experiment& e) -> const char* {
         return e.layout.pp > 1 && e.layout.schedule != Schedule::interleaved
                    ? "README: without interleaving each stage's first forwards wait for their gathers in turn"
                    : nullptr;
       }},
      {"overlap_p2p", [](const Experiment& e) { return e.layout.pp > 1; },
       [](Experiment& e, bool on) { e.training.overlap_p2p = on; }},
      {"tp_comm_overlap", [](const Experiment& e) { return e.layout.tp > 1 && e.layout.sequence_parallel; },
       [](Experiment& e, bool on) { e.training.tp_comm_overlap = on; }},
      {"moe_shared_expert_overlap",
       [](const Experiment& e) { return e.model.moe.enabled() && e.model.moe.shared_expert_ffn_hidden > 0; },
       [](Experiment& e, bool on) { e.training.moe_shared_expert_overlap = on; }},
      {"delay_wgrad_compute", [](const Experiment& e) { return e.model.moe.enabled(); },
       [](Experiment& e, bool on) { e.training.delay_wgrad_compute = on; }},
      // The combined forward-backward passes, wherever the layout allows them (Megatron-Core's
      // constraints, models/moe_checks.cpp: the check below).
      {"overlap_moe_expert_parallel_comm",
       [](const Experiment& e) { return e.model.moe.enabled(); },
       [](Experiment& e, bool on) { e.training.overlap_moe_expert_parallel_comm = on; }},
      {"cuda_graphs", [](const Experiment&) { return true; },
       [](Experiment& e, bool on) {
         if (!on) e.training.cuda_graphs = CudaGraphs::none;
         else if (e.training.cuda_graphs == CudaGraphs::none) e.training.cuda_graphs = CudaGraphs::layers;
       }},
  };
}

class OverlapPropertySlow : public ::testing::TestWithParam<std::string> {};

TEST_P(OverlapPropertySlow, SwitchingAnOverlapOnNeverSlowsTheStep) {
  const Experiment base = load_experiment((kExperiments / GetParam()).string());
  const std::vector<Switch> all = switches();
  std::vector<const Switch*> used;
  std::vector<Experiment> runs;  // off, on per switch
  for (const Switch& s : all) {
    if (!s.applies(base)) continue;
    {  // an option the layout's other settings exclude (input error) does not apply either
      Experiment on = base;
      s.set(on, true);
      try {
        validate_experiment(on);
      } catch (const InputError& x) {
        RecordProperty(s.name, std::string("not applicable: ") + x.what());
        continue;
      }
    }
    used.push_back(&s);
    for (bool on : {false, true}) {
      Experiment e = base;
      s.set(e, on);
      runs.push_back(e);
    }
  }
  if (used.empty()) GTEST_SKIP() << "no overlap option applies";
  std::vector<double> step(runs.size(), 0.0);
  simulate_steps_isolated(
      runs.size(), 2, [&](size_t i) { return runs[i]; },
      [&](size_t i, StepResult&& r, std::exception_ptr err) {
        if (err) {
          try {
            std::rethrow_exception(err);
          } catch (const std::exception& x) {
            ADD_FAILURE() << used[i / 2]->name << (i % 2 ? " on" : " off") << ": " << x.what();
          }
          return;
        }
        step[i] = r.step_time_s;
      });
  for (size_t k = 0; k < used.size(); ++k) {
    const double off = step[2 * k], on = step[2 * k + 1];
    if (off <= 0 || on <= 0) continue;  // reported above
    if (on <= off * 1.01) continue;
    if (const char* why = used[k]->excused(base)) {
      RecordProperty(used[k]->name, why);
      continue;
    }
    if (base.training.comm_interference) {
      // The SM share of the overlapped NCCL kernels alone? The same pair without it.
      Experiment a = runs[2 * k], b = runs[2 * k + 1];
      a.training.comm_interference = b.training.comm_interference = false;
      const double off_free = simulate_step_isolated(a).step_time_s, on_free = simulate_step_isolated(b).step_time_s;
      EXPECT_LE(on_free, off_free * 1.01) << used[k]->name << " without comm_interference: on " << on_free
                                          << " s, off " << off_free << " s";
      RecordProperty(used[k]->name, "slower only by the SMs its kernels take (README: Overlap that costs)");
      continue;
    }
    EXPECT_LE(on, off * 1.01) << used[k]->name << ": on " << on << " s, off " << off << " s ("
                              << 100.0 * (on - off) / off << "% slower)";
  }
}

INSTANTIATE_TEST_SUITE_P(Shipped, OverlapPropertySlow, ::testing::ValuesIn(experiment_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return test_name(info.param); });

}  // namespace
}  // namespace dtsim
