// ZB-H2 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR 2024, Sec 3.1, Fig 4 and
// Table 1): backward split into B and W; rank r keeps up to 2(p - r) - 1 micro-batches
// alive (peak (2p - 1) M_B on the first rank, against 1F1B's p M_B), enough warm-up
// forwards to fill the start of the step, so the bubble falls to (p - 1)(T_F + T_B - 2 T_W),
// zero when T_W >= (T_F + T_B) / 2.
#include <algorithm>

#include "models/schedules/schedules.hpp"

namespace dtsim::sched {
namespace {

class ZbH2 final : public PipelineSchedule {
 public:
  const char* name() const override { return "zb-h2"; }
  const char* source() const override { return "Qi et al. 2024 (Zero Bubble PP, ICLR 2024) Sec 3.1, ZB-H2"; }
  const char* summary() const override { return "B/W split with 2p - 1 micro-batches alive: near-zero bubble"; }
  Schedule id() const override { return Schedule::zb_h2; }
  int64_t chunks(const Dims&) const override { return 1; }
  bool splits_backward() const override { return true; }
  std::vector<std::string> check(const Dims& d) const override {
    if (d.vp > 1) return {"layout.vp=" + std::to_string(d.vp) + " needs layout.schedule=interleaved (got zb-h2)"};
    return {};
  }
  std::vector<std::vector<Step>> order(const Dims& d) const override {
    static const ZeroBubbleShape shape{
        false, [](int64_t p, int64_t r) { return 2 * (p - r) - 1; },  // forwards until the first B arrives
        [](int64_t, int64_t r) { return 2 * r - 1; },                  // 2p - 1 alive on every rank
        [](int64_t p) { return 2 * p - 1; }};
    return zero_bubble_order(d, shape);
  }
  // Table 1's (p - 1)(T_F + T_B - 2 T_W) is the idle inside each rank's own span; the step
  // also waits for the last rank, which cannot start before p - 1 forwards passed: on uniform
  // costs the step's bubble is max of the two.
  double closed_form_bubble(const Dims& d, double f, double b, double w) const override {
    return static_cast<double>(d.pp - 1) * std::max(f, f + b - 2.0 * w);
  }
};

}  // namespace
std::unique_ptr<PipelineSchedule> make_zb_h2() { return std::make_unique<ZbH2>(); }
}  // namespace dtsim::sched
