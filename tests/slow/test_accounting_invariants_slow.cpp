// The accounting and trace invariants (tests/unit/accounting_checks.hpp) on every shipped
// experiment: plan and explain, the folded SimGrid engine with its trace, the analytic
// engine. Slow (the large experiments trace hundreds of thousands of kernels): label "slow";
// tests/unit/test_accounting_invariants.cpp runs the same checks on small experiments.
#include "tests/unit/accounting_checks.hpp"

namespace dtsim {
namespace {

using namespace accounting_checks;

class AccountingInvariantsSlow : public ::testing::TestWithParam<std::string> {};

TEST_P(AccountingInvariantsSlow, HoldOnTheShippedExperiment) {
  const fs::path file = kExperiments / GetParam();
  // The trace is checked as the document the writer builds (no text round trip: the
  // 1T-parameter runs' traces take gigabytes as text); the unit test parses the text.
  check_experiment(load_experiment(file.string()), file.string(), /*fold=*/true, /*reparse=*/false);
}

INSTANTIATE_TEST_SUITE_P(Shipped, AccountingInvariantsSlow, ::testing::ValuesIn(experiment_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return test_name(info.param); });

}  // namespace
}  // namespace dtsim
