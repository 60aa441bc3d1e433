// 1F1B (PipeDream-Flush; Narayanan et al. 2021, "Efficient Large-Scale Language Model
// Training on GPU Clusters Using Megatron-LM", SC21, Sec 2.2.1; Megatron-LM
// megatron/core/pipeline_parallel/schedules.py forward_backward_pipelining_without_interleaving):
// rank r runs min(p - r - 1, m) warm-up forwards, then alternates one forward and one
// backward, then drains the remaining backwards.
#include <algorithm>

#include "models/schedules/schedules.hpp"

namespace dtsim::sched {
namespace {

class OneFOneB final : public PipelineSchedule {
 public:
  const char* name() const override { return "1f1b"; }
  const char* source() const override { return "Narayanan et al. 2021 Sec 2.2.1; Megatron-LM schedules.py"; }
  const char* summary() const override { return "warm-up forwards, then one forward / one backward; p - r alive"; }
  Schedule id() const override { return Schedule::one_f_one_b; }
  int64_t chunks(const Dims&) const override { return 1; }
  bool pairs_forward_backward() const override { return true; }
  std::vector<std::string> check(const Dims& d) const override {
    std::vector<std::string> p;
    if (d.vp > 1) p.push_back("layout.vp=" + std::to_string(d.vp) + " needs layout.schedule=interleaved (got 1f1b)");
    // Megatron-Core transformer_config.py: "If enabling EP A2A overlap,
    // virtual_pipeline_model_parallel_size must be specified when pipeline_model_parallel_size > 1".
    if (d.combined_1f1b && d.pp > 1)
      p.push_back("training.overlap_moe_expert_parallel_comm with layout.schedule=1f1b needs layout.pp=1 (got pp=" +
                  std::to_string(d.pp) +
                  "): Megatron-Core runs the combined 1F1B only without pipelining or with the interleaved schedule "
                  "(use layout.schedule=interleaved with layout.vp >= 2)");
    return p;
  }
  std::vector<std::vector<Step>> order(const Dims& d) const override {
    std::vector<std::vector<Step>> out(static_cast<size_t>(d.pp));
    const int64_t m = d.micro_batches;
    for (int64_t r = 0; r < d.pp; ++r) {
      auto& o = out[static_cast<size_t>(r)];
      // Combined 1F1B (pp = 1): one forward first, then each forward merged with the
      // previous micro-batch's backward (schedules.py combined_1f1b_schedule_for_no_pipelining).
      const int64_t warmup = std::min<int64_t>(d.pp - r - 1 + (d.combined_1f1b ? 1 : 0), m);
      int64_t f = 0, b = 0;
      for (; f < warmup; ++f) o.push_back({Pass::F, 0, static_cast<int32_t>(f)});
      for (; f < m; ++f) {
        o.push_back({Pass::F, 0, static_cast<int32_t>(f), d.combined_1f1b});
        o.push_back({Pass::BW, 0, static_cast<int32_t>(b++)});
      }
      for (; b < m; ++b) o.push_back({Pass::BW, 0, static_cast<int32_t>(b)});
    }
    return out;
  }
  // Narayanan 2021 Sec 2.2.1: bubble (p - 1)(t_f + t_b).
  double closed_form_bubble(const Dims& d, double f, double b, double w) const override {
    return static_cast<double>(d.pp - 1) * (f + b + w);
  }
};

}  // namespace
std::unique_ptr<PipelineSchedule> make_one_f_one_b() { return std::make_unique<OneFOneB>(); }
}  // namespace dtsim::sched
