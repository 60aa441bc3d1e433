#include "reports/trace.hpp"

#include "reports/atomic_file.hpp"

namespace dtsim {

const char* to_string(TraceStream s) {
  switch (s) {
    case TraceStream::compute: return "compute";
    case TraceStream::tp: return "TP comm";
    case TraceStream::cp: return "CP comm";
    case TraceStream::pp: return "PP send / collective";
    case TraceStream::pp_recv: return "PP recv";
    case TraceStream::dp: return "DP comm";
    case TraceStream::ep: return "EP comm";
  }
  return "?";
}

nlohmann::json trace_to_json(const Trace& trace) {
  nlohmann::json events = nlohmann::json::array();
  for (const auto& p : trace.processes) {
    const std::string label = "rank " + std::to_string(p.rank) + " (stage " + std::to_string(p.stage) +
                              (p.represents > 1 ? ", stands for " + std::to_string(p.represents) + " ranks)" : ")");
    events.push_back({{"ph", "M"}, {"pid", p.rank}, {"tid", 0}, {"name", "process_name"}, {"args", {{"name", label}}}});
    events.push_back(
        {{"ph", "M"}, {"pid", p.rank}, {"tid", 0}, {"name", "process_sort_index"}, {"args", {{"sort_index", p.rank}}}});
    for (int s = 0; s <= static_cast<int>(TraceStream::ep); ++s)
      events.push_back({{"ph", "M"},
                        {"pid", p.rank},
                        {"tid", s},
                        {"name", "thread_name"},
                        {"args", {{"name", to_string(static_cast<TraceStream>(s))}}}});
  }
  for (const auto& e : trace.events) {
    nlohmann::json args = {{"layer", e.layer}, {"micro_batch", e.micro_batch}, {"chunk", e.chunk}};
    if (e.flops > 0) args["flops"] = e.flops;
    if (e.bytes > 0) args["bytes"] = e.bytes;
    if (!e.group.empty()) args["group"] = e.group;
    if (e.async_id != 0) {
      // Overlapping transfers: an async slice per message (Chrome trace-event format,
      // "Async events": "b" and "e" matched by category and id), which Perfetto lays out on
      // as many tracks as overlap, instead of partly overlapping "X" slices on one thread.
      const std::string id = std::to_string(e.async_id);
      events.push_back({{"ph", "b"},
                        {"pid", e.rank},
                        {"tid", static_cast<int>(e.stream)},
                        {"name", e.name},
                        {"cat", e.category},
                        {"id", id},
                        {"ts", e.start_s * 1e6},
                        {"args", args}});
      events.push_back({{"ph", "e"},
                        {"pid", e.rank},
                        {"tid", static_cast<int>(e.stream)},
                        {"name", e.name},
                        {"cat", e.category},
                        {"id", id},
                        {"ts", (e.start_s + e.duration_s) * 1e6}});
      continue;
    }
    events.push_back({{"ph", "X"},
                      {"pid", e.rank},
                      {"tid", static_cast<int>(e.stream)},
                      {"name", e.name},
                      {"cat", e.category},
                      {"ts", e.start_s * 1e6},
                      {"dur", e.duration_s * 1e6},
                      {"args", args}});
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

void write_trace(const std::string& path, const Trace& trace) { write_file_atomic(path, trace_to_json(trace).dump()); }

}  // namespace dtsim
