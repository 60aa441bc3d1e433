#pragma once
// A timeline of one simulated step: one event per kernel (or run of kernels between two
// communication points), collective, P2P transfer and wait, per rank and stream. Plain
// data; reports/trace.hpp writes it in the Chrome trace-event format that Perfetto and
// chrome://tracing open.
#include <cstdint>
#include <string>
#include <vector>

namespace dtsim {

/// Streams of a rank, one timeline row each. On a row, complete slices never overlap
/// partly: each lies inside another or after it (Chrome trace-event "X" events must nest).
/// P2P transfers overlap one another (a receive's bytes arrive while the rank sends, or
/// while it computes), so they are async slices (TraceEvent::async_id), sends on `pp`,
/// receives on `pp_recv`; `pp`'s complete slices are PP collectives (the tied-embedding
/// gradient AllReduce).
enum class TraceStream { compute = 0, tp = 1, cp = 2, pp = 3, dp = 4, pp_recv = 5, ep = 6 };
const char* to_string(TraceStream);

struct TraceEvent {
  int64_t rank = 0;           // simulated rank (with folding: the stage's representative)
  TraceStream stream = TraceStream::compute;
  std::string name;           // op name from the plan ("qkv", "tp_allreduce", ...)
  std::string category;       // "compute", "TP", "CP", "PP", "DP", "wait"
  double start_s = 0;         // simulated seconds since the step began
  double duration_s = 0;
  double flops = 0;           // compute: FLOPs on this rank
  double bytes = 0;           // compute: HBM bytes; communication: buffer size (nccl-tests size)
  std::string group;          // communication: the group's ranks, e.g. "[0, 1, 2, 3]"
  int32_t layer = -1, micro_batch = -1, chunk = 0;
  /// 0: a complete slice ("X") on its (rank, stream) row. Otherwise an async slice (a
  /// "b"/"e" pair with this id, unique in the trace): a P2P transfer, from the moment the
  /// sender posts it to the bytes being usable at the receiver (flow end + P2P latency).
  int64_t async_id = 0;
};

struct Trace {
  /// Per simulated rank: its pipeline stage and the ranks it stands for (folding).
  struct Process {
    int64_t rank = 0;
    int64_t stage = 0;
    int64_t represents = 1;  // ranks of the stage this one stands for (1 when unfolded)
  };
  std::vector<Process> processes;
  std::vector<TraceEvent> events;
};

}  // namespace dtsim
