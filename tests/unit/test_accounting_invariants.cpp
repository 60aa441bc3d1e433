// The accounting and trace invariants (tests/unit/accounting_checks.hpp): the analytic engine
// on every shipped experiment, and every check (plan, explain, the SimGrid engine folded and
// unfolded with its trace parsed back from text, the analytic engine) on small experiments
// that exercise what the shipped ones do: tied embeddings over pp > 1, interleaving, blocking
// and overlapped P2P, CP, ZeRO-1/3, overlapped gradient reduction, TP overlap. The shipped
// experiments themselves: tests/slow/test_accounting_invariants_slow.cpp.
#include "tests/unit/accounting_checks.hpp"

namespace dtsim {
namespace {

using namespace accounting_checks;

class AnalyticAccounting : public ::testing::TestWithParam<std::string> {};

TEST_P(AnalyticAccounting, AddsUpOnTheShippedExperiment) {
  const fs::path file = kExperiments / GetParam();
  const Experiment e = load_experiment(file.string());
  expect_accounting(simulate_step_analytic(e), file.string(), /*counts=*/false);
}

INSTANTIATE_TEST_SUITE_P(Shipped, AnalyticAccounting, ::testing::ValuesIn(experiment_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return test_name(info.param); });

TEST(AnalyticAccounting, EveryShippedExperimentIsListed) { EXPECT_GE(experiment_names().size(), 7u); }

struct SmallCase {
  const char* name;
  const char* cluster;
  const char* layout;
  const char* training;
  bool tied;
};

std::string small_yaml(const SmallCase& c) {
  return std::string("title: accounting ") + c.name +
         "\nmodel: {name: tiny, layers: 8, hidden: 1024, heads: 16, kv_heads: 16, ffn_hidden: 4096, activation: gelu,\n"
         "        vocab: 8192, tied_embeddings: " + (c.tied ? "true" : "false") +
         ", norm: layernorm, position: learned}\n"
         "cluster: " + c.cluster + "\nlayout: " + c.layout + "\ntraining: " + c.training + "\n";
}

class SmallAccounting : public ::testing::TestWithParam<SmallCase> {};

TEST_P(SmallAccounting, FoldedAndUnfolded) {
  const SmallCase& c = GetParam();
  const Experiment e = parse_experiment(small_yaml(c), std::string(c.name) + ".yaml");
  check_experiment(e, std::string(c.name) + " folded", /*fold=*/true);
  check_experiment(e, std::string(c.name) + " unfolded", /*fold=*/false);
}

INSTANTIATE_TEST_SUITE_P(
    Small, SmallAccounting,
    ::testing::Values(
        // gpt3-175b-selective's shape: tied embedding, interleaved, blocking P2P, SP.
        SmallCase{"tied_interleaved", "{node: dgx-a100, nodes: 2}",
                  "{dp: 1, tp: 4, pp: 4, vp: 2, schedule: interleaved, zero_stage: 0, sequence_parallel: true, "
                  "recompute: selective}",
                  "{seq_len: 512, global_batch: 16, micro_batch: 1, dtype: bf16, flash_attention: false, "
                  "framework: megatron}",
                  true},
        SmallCase{"tied_zero1_overlap", "{node: dgx-h100, nodes: 2}",
                  "{dp: 2, tp: 2, pp: 4, zero_stage: 1, sequence_parallel: true, recompute: none}",
                  "{seq_len: 512, global_batch: 16, micro_batch: 1, dtype: bf16, flash_attention: true, "
                  "framework: megatron, overlap_grad_reduce: true, overlap_param_gather: true, overlap_p2p: true}",
                  true},
        SmallCase{"cp_zero3", "{node: dgx-h100, nodes: 2}",
                  "{dp: 2, tp: 2, cp: 2, pp: 2, zero_stage: 3, sequence_parallel: true, recompute: full}",
                  "{seq_len: 512, global_batch: 16, micro_batch: 1, dtype: bf16, flash_attention: true, "
                  "framework: megatron, overlap_grad_reduce: true}",
                  false},
        SmallCase{"tp_overlap_cp_ring", "{node: dgx-h100, nodes: 2}",
                  "{dp: 1, tp: 2, cp: 4, pp: 2, zero_stage: 1, sequence_parallel: true, recompute: none}",
                  "{seq_len: 1024, global_batch: 8, micro_batch: 1, dtype: bf16, flash_attention: true, "
                  "framework: megatron, tp_comm_overlap: true}",
                  true},
        // The registered schedules beyond 1F1B (models/schedules/): split B/W, V turn, two
        // directions with the mirror gradient sum.
        SmallCase{"zb_h1_zero1_sp", "{node: dgx-h100, nodes: 2}",
                  "{dp: 2, tp: 2, pp: 4, schedule: zb-h1, zero_stage: 1, sequence_parallel: true, recompute: none}",
                  "{seq_len: 512, global_batch: 16, micro_batch: 1, dtype: bf16, flash_attention: true, "
                  "framework: megatron, overlap_grad_reduce: true, overlap_p2p: true}",
                  true},
        SmallCase{"zb_h2", "{node: dgx-h100, nodes: 2}",
                  "{dp: 2, tp: 2, pp: 4, schedule: zb-h2, zero_stage: 0, sequence_parallel: false, recompute: full}",
                  "{seq_len: 512, global_batch: 16, micro_batch: 1, dtype: bf16, flash_attention: true, "
                  "framework: megatron}",
                  false},
        SmallCase{"dualpipev_tied", "{node: dgx-h100, nodes: 2}",
                  "{dp: 2, tp: 2, pp: 4, vp: 2, schedule: dualpipev, zero_stage: 1, sequence_parallel: true, "
                  "recompute: none}",
                  "{seq_len: 512, global_batch: 16, micro_batch: 1, dtype: bf16, flash_attention: true, "
                  "framework: megatron, overlap_grad_reduce: true}",
                  true},
        SmallCase{"dualpipe_tied", "{node: dgx-h100, nodes: 2}",
                  "{dp: 2, tp: 2, pp: 4, schedule: dualpipe, zero_stage: 1, sequence_parallel: true, recompute: none}",
                  "{seq_len: 512, global_batch: 16, micro_batch: 1, dtype: bf16, flash_attention: true, "
                  "framework: megatron, overlap_grad_reduce: true}",
                  true}),
    [](const ::testing::TestParamInfo<SmallCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace dtsim
