// The handcrafted zero-bubble orders ZB-H1 and ZB-H2 (schedules.hpp zero_bubble_order).
// Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR 2024, Sec 2 (handcrafted
// schedules, Fig 3): ZB-H1 "follows the 1F1B pattern but delays the start of W passes based
// on the number of warm-up micro-batches, ensuring all pipeline stages have the same number
// of in-flight micro-batches" (rank r defers its W by r, so every rank holds p micro-batches,
// the first rank's 1F1B peak); ZB-H2 adds warm-up forwards until the first B arrives
// (2(p - r) - 1 on rank r, (2p - 1) M_B on the first) and likewise defers W to keep 2p - 1
// alive everywhere. The order of a steady-state round follows the figure: F then B (ZB-H1),
// B then F (ZB-H2, the warm-up already ran ahead), then the W that is due; a W runs earlier
// when the next F would exceed the in-flight limit; the W still deferred close the step.
#include <algorithm>

#include "models/schedules/schedules.hpp"

namespace dtsim::sched {

std::vector<std::vector<Step>> zero_bubble_order(const Dims& d, const ZeroBubbleShape& shape) {
  const int64_t P = d.pp, M = d.micro_batches;
  std::vector<std::vector<Step>> out(static_cast<size_t>(P));
  for (int64_t r = 0; r < P; ++r) {
    auto& o = out[static_cast<size_t>(r)];
    const int64_t warmup = std::min(shape.warmup(P, r), M), delay = shape.w_delay(P, r), limit = shape.live_limit(P);
    int64_t f = 0, w = 0, live = 0;
    auto F = [&] {
      while (live >= limit && w < f) {
        o.push_back({Pass::W, 0, static_cast<int32_t>(w++)});
        --live;
      }
      o.push_back({Pass::F, 0, static_cast<int32_t>(f++)});
      ++live;
    };
    while (f < warmup) F();
    for (int64_t k = 0; k < M; ++k) {
      if (shape.forward_first && f < M) F();
      o.push_back({Pass::B, 0, static_cast<int32_t>(k)});
      while (w <= k - delay && w <= k) {
        o.push_back({Pass::W, 0, static_cast<int32_t>(w++)});
        --live;
      }
      if (!shape.forward_first && f < M) F();
    }
    while (w < M) o.push_back({Pass::W, 0, static_cast<int32_t>(w++)});
  }
  return out;
}

}  // namespace dtsim::sched
