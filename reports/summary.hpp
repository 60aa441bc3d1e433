#pragma once
// The terminal summary of one simulated step (`dtsim run`).
#include <string>

#include "models/experiment.hpp"
#include "models/result.hpp"

namespace dtsim {

/// A readable multi-line summary: the experiment (model, cluster, layout, batch), the
/// step figures (step time, tokens/s, TFLOP/s per GPU, MFU, HFU, compute, bubble,
/// optimizer), communication per kind (total, exposed, hidden, bytes per rank, ops) and
/// one line per pipeline stage (layers, compute, bubble, memory split vs capacity).
/// Deterministic: host wall-clock time is not part of it. Ends with a newline.
std::string format_summary(const Experiment& exp, const StepResult& r);

/// "13.75 s", "412.3 ms", "18.2 us", "950.0 ns", "0 s": unit chosen by magnitude.
std::string format_duration(double seconds);

/// "75.31 GiB", "512.0 MiB", "3.0 KiB", "12 B" (binary units).
std::string format_bytes(double bytes);

}  // namespace dtsim
