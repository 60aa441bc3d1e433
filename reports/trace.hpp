#pragma once
// Chrome / Perfetto trace-event JSON ("JSON Object Format" of the Trace Event Format,
// https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU):
// {"traceEvents": [...], "displayTimeUnit": "ms"}; complete events ("ph": "X") with
// microsecond "ts"/"dur", one process ("pid") per simulated rank and one thread ("tid")
// per stream, named by metadata events ("ph": "M", process_name / thread_name). Complete
// events on one thread nest properly (each inside another or after it); P2P transfers,
// which overlap, are async events ("ph": "b" / "e" with an "id", one pair per message).
#include <string>

#include <nlohmann/json.hpp>

#include "models/trace.hpp"

namespace dtsim {

nlohmann::json trace_to_json(const Trace& trace);

/// Writes trace_to_json(trace) to `path` atomically. Throws std::runtime_error on I/O
/// failure naming the path.
void write_trace(const std::string& path, const Trace& trace);

}  // namespace dtsim
