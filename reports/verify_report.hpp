#pragma once
// Reports of `dtsim verify` (models/verify/verify.hpp): a terminal text and a JSON.
//
// JSON layout: { experiment, passed, inject, injection_detected (only with an injection),
//   world, steps, layout: {dp, tp, cp, pp, zero_stage, sequence_parallel, recompute,
//   flash_attention}, model: {layers, hidden, heads, kv_heads, head_dim, ffn_hidden, vocab,
//   seq_len, micro_batch, accumulation, global_batch},
//   rules: [ {name, what, applicable, passed, max_abs_error (null when infinite), tolerance,
//             values, worst, problems: [..]} ], notes: [..] }. Keys sorted.
#include <string>

#include <nlohmann/json.hpp>

#include "models/verify/verify.hpp"

namespace dtsim {

/// Multi-line text: what ran (layout, shrunk model, batch, steps, injection), one line per
/// rule (PASS / FAIL / n/a, max |error|, tolerance, values compared, what is compared),
/// the worst location of each failing rule, plan problems, notes, and a verdict line.
/// Ends with a newline.
std::string format_verify_report(const verify::VerifyReport& r);

nlohmann::json verify_report_json(const verify::VerifyReport& r);
/// verify_report_json pretty-printed (2-space indent) with a trailing newline.
std::string verify_report_json_text(const verify::VerifyReport& r);

}  // namespace dtsim
