// ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR 2024, Sec 3.1, Fig 3 and
// Table 1): backward split into B and W; each rank keeps at most 1F1B's p - r micro-batches
// alive, so its peak activation memory is 1F1B's, and the W passes it defers fill the
// bubble: (p - 1)(T_F + T_B - T_W) instead of 1F1B's (p - 1)(T_F + T_B + T_W).
#include "models/schedules/schedules.hpp"

namespace dtsim::sched {
namespace {

class ZbH1 final : public PipelineSchedule {
 public:
  const char* name() const override { return "zb-h1"; }
  const char* source() const override { return "Qi et al. 2024 (Zero Bubble PP, ICLR 2024) Sec 3.1, ZB-H1"; }
  const char* summary() const override { return "B/W split, W deferred into the bubble; 1F1B's memory"; }
  Schedule id() const override { return Schedule::zb_h1; }
  int64_t chunks(const Dims&) const override { return 1; }
  bool splits_backward() const override { return true; }
  std::vector<std::string> check(const Dims& d) const override {
    if (d.vp > 1) return {"layout.vp=" + std::to_string(d.vp) + " needs layout.schedule=interleaved (got zb-h1)"};
    return {};
  }
  std::vector<std::vector<Step>> order(const Dims& d) const override {
    static const ZeroBubbleShape shape{
        true, [](int64_t p, int64_t r) { return p - r - 1; },  // 1F1B's warm-up
        [](int64_t, int64_t r) { return r; },                   // W delayed by r: p alive on every rank
        [](int64_t p) { return p; }};
    return zero_bubble_order(d, shape);
  }
  double closed_form_bubble(const Dims& d, double f, double b, double w) const override {
    return static_cast<double>(d.pp - 1) * (f + b - w);
  }
};

}  // namespace
std::unique_ptr<PipelineSchedule> make_zb_h1() { return std::make_unique<ZbH1>(); }
}  // namespace dtsim::sched
