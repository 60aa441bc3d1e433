// GPipe (Huang et al. 2019, "GPipe: Efficient Training of Giant Neural Networks using
// Pipeline Parallelism", NeurIPS 2019, Sec 2.2): every forward, then every backward.
#include "models/schedules/schedules.hpp"

namespace dtsim::sched {
namespace {

class GPipe final : public PipelineSchedule {
 public:
  const char* name() const override { return "gpipe"; }
  const char* source() const override { return "Huang et al. 2019 (GPipe), Sec 2.2"; }
  const char* summary() const override { return "all forwards, then all backwards; holds every micro-batch"; }
  Schedule id() const override { return Schedule::gpipe; }
  int64_t chunks(const Dims&) const override { return 1; }
  std::vector<std::string> check(const Dims& d) const override {
    if (d.vp > 1) return {"layout.vp=" + std::to_string(d.vp) + " needs layout.schedule=interleaved (got gpipe)"};
    return {};
  }
  std::vector<std::vector<Step>> order(const Dims& d) const override {
    std::vector<std::vector<Step>> out(static_cast<size_t>(d.pp));
    for (auto& o : out) {
      for (int64_t i = 0; i < d.micro_batches; ++i) o.push_back({Pass::F, 0, static_cast<int32_t>(i)});
      for (int64_t i = 0; i < d.micro_batches; ++i) o.push_back({Pass::BW, 0, static_cast<int32_t>(i)});
    }
    return out;
  }
  // Huang 2019 Sec 2.2: O((K - 1) / (M + K - 1)) of the step idle, i.e. (p - 1)(F + B).
  double closed_form_bubble(const Dims& d, double f, double b, double w) const override {
    return static_cast<double>(d.pp - 1) * (f + b + w);
  }
};

}  // namespace
std::unique_ptr<PipelineSchedule> make_gpipe() { return std::make_unique<GPipe>(); }
}  // namespace dtsim::sched
