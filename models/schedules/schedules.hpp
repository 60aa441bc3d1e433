#pragma once
// Factories of the registered pipeline schedules, one per file in models/schedules/
// (internal to the registry; everything else reads models/schedules/schedule.hpp).
#include <memory>

#include "models/schedules/schedule.hpp"

namespace dtsim::sched {

std::unique_ptr<PipelineSchedule> make_gpipe();        // gpipe.cpp
std::unique_ptr<PipelineSchedule> make_one_f_one_b();  // one_f_one_b.cpp
std::unique_ptr<PipelineSchedule> make_interleaved();  // interleaved.cpp
std::unique_ptr<PipelineSchedule> make_zb_h1();        // zb_h1.cpp
std::unique_ptr<PipelineSchedule> make_zb_h2();        // zb_h2.cpp
std::unique_ptr<PipelineSchedule> make_dualpipev();    // dualpipev.cpp
std::unique_ptr<PipelineSchedule> make_dualpipe();     // dualpipe.cpp

// Shared generators.

/// The shape of a handcrafted zero-bubble order (zero_bubble.cpp), one chunk per rank:
/// rank r runs warmup(p, r) forwards, then rounds of F and B (forward_first) or B and F, each
/// followed by the W of micro-batch k - w_delay(p, r) once due; a W also runs before an F
/// that would hold more than live_limit(p) micro-batches (alive from F to W).
struct ZeroBubbleShape {
  bool forward_first = true;
  int64_t (*warmup)(int64_t p, int64_t r) = nullptr;
  int64_t (*w_delay)(int64_t p, int64_t r) = nullptr;
  int64_t (*live_limit)(int64_t p) = nullptr;
};
std::vector<std::vector<Step>> zero_bubble_order(const Dims& d, const ZeroBubbleShape& shape);

/// DualPipe's eight-step program (deepseek-ai/DualPipe, dualpipe/dualpipe.py and
/// dualpipev.py, DualPipe*.step), for one rank: `ranks` = the pipeline length the program is
/// written for (pp for DualPipeV, pp / 2 for DualPipe), `rank` = the rank's position in it
/// (DualPipe: min(r, pp - 1 - r)), `mbs` = micro-batches per direction; local phase k maps
/// to model chunk phase_chunk[k], whose micro-batches start at first_mb[k]; `paired` marks the
/// F of each overlapped forward-backward chunk (steps 4 and 5) Step::paired.
std::vector<Step> dualpipe_program(int64_t ranks, int64_t rank, int64_t mbs, const int32_t phase_chunk[2],
                                   const int32_t first_mb[2], bool paired);

}  // namespace dtsim::sched
