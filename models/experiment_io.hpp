#pragma once
// Reading, overriding and validating experiments.
#include <string>
#include <vector>

#include "models/experiment.hpp"

namespace dtsim {

/// Reads an experiment YAML file with sections `model`, `cluster`, `layout`, `training`
/// (and an optional `title`). `overrides` are "dotted.key=value" strings applied before
/// validation, as if written in the file (`--set layout.tp=4`).
/// Quantities carry units in the file (`450 GB/s`, `1.5 us`, `80 GiB`, `312 TFLOP/s`).
/// `model.hf_config: PATH` reads a Hugging Face config.json (relative to the YAML file).
/// Throws InputError listing every problem, one line each, naming the file, the key and
/// the violated constraint. Unknown keys are errors.
Experiment load_experiment(const std::string& path, const std::vector<std::string>& overrides = {});

/// Same, from YAML text; `source` names it in messages. `ignore_containing` (when not empty):
/// problems whose line contains it are not raised (dtsim sweep composes its clusters on a
/// placeholder layout and leaves the "layout." problems to each layout of the space, whose
/// rows report them).
Experiment parse_experiment(const std::string& yaml_text, const std::string& source,
                            const std::vector<std::string>& overrides = {},
                            const std::string& base_dir = ".", const std::string& ignore_containing = "");

/// Checks the cross-section constraints (dp*tp*cp*pp == GPUs, tp | heads, ...). Throws
/// InputError with every violation.
void validate_experiment(const Experiment& e);

/// The problems validate_experiment would throw (the same lines, "FILE: message", in the same
/// order); empty when the experiment is valid. For callers that expect many invalid
/// experiments (dtsim sweep, one per layout of a space) without an exception for each.
std::vector<std::string> experiment_problems(const Experiment& e);

}  // namespace dtsim
