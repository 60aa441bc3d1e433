// Interleaved 1F1B with v model chunks per rank (Narayanan et al. 2021 Sec 2.2.2), with
// Megatron-LM's counts (megatron/core/pipeline_parallel/schedules.py
// forward_backward_pipelining_with_interleaving): warm-up = (p - r - 1) * 2 + (v - 1) * p
// virtual micro-batches, capped at m v; virtual micro-batch k runs chunk (k / p) % v
// (reversed in backward) of micro-batch (k / (p v)) p + k % p. Chunk c of rank r is
// virtual stage c p + r.
#include <algorithm>

#include "models/schedules/schedules.hpp"

namespace dtsim::sched {
namespace {

class Interleaved final : public PipelineSchedule {
 public:
  const char* name() const override { return "interleaved"; }
  const char* source() const override { return "Narayanan et al. 2021 Sec 2.2.2; Megatron-LM schedules.py"; }
  const char* summary() const override { return "1F1B over vp chunks per rank; bubble / vp"; }
  Schedule id() const override { return Schedule::interleaved; }
  bool pairs_forward_backward() const override { return true; }
  std::vector<std::string> check(const Dims& d) const override {
    std::vector<std::string> p;
    if (d.vp < 2) p.push_back("layout.schedule=interleaved needs layout.vp >= 2 (got vp=" + std::to_string(d.vp) + ")");
    if (d.pp < 2) p.push_back("layout.schedule=interleaved needs layout.pp >= 2 (got pp=" + std::to_string(d.pp) + ")");
    if (d.pp > 1 && d.micro_batches % d.pp != 0)
      p.push_back("layout.schedule=interleaved needs the micro-batches per step (training.global_batch / "
                  "(micro_batch*dp) = " + std::to_string(d.micro_batches) + ") to be a multiple of layout.pp=" +
                  std::to_string(d.pp) + " (Megatron-LM interleaved schedule requirement)");
    return p;
  }
  std::vector<std::vector<Step>> order(const Dims& d) const override {
    std::vector<std::vector<Step>> out(static_cast<size_t>(d.pp));
    const int64_t p = d.pp, v = d.vp, total = d.micro_batches * v;
    for (int64_t r = 0; r < p; ++r) {
      auto& o = out[static_cast<size_t>(r)];
      // Combined 1F1B: one more warm-up forward, then every steady-state forward merged with
      // the backward after it (schedules.py get_pp_rank_microbatches,
      // combined_1f1b_schedule_for_interleaved_pipelining).
      const int64_t extra = d.combined_1f1b ? 1 : 0;
      const int64_t warmup = std::min<int64_t>((p - r - 1) * 2 + (v - 1) * p + extra, total);
      auto mb = [&](int64_t k) { return static_cast<int32_t>((k / (p * v)) * p + k % p); };
      auto fwd = [&](int64_t k) {
        o.push_back({Pass::F, static_cast<int32_t>((k / p) % v), mb(k), d.combined_1f1b && k >= warmup});
      };
      auto bwd = [&](int64_t k) { o.push_back({Pass::BW, static_cast<int32_t>(v - 1 - (k / p) % v), mb(k)}); };
      int64_t f = 0, b = 0;
      for (; f < warmup; ++f) fwd(f);
      for (; f < total; ++f) {
        fwd(f);
        bwd(b++);
      }
      for (; b < total; ++b) bwd(b);
    }
    return out;
  }
  // Narayanan 2021 Sec 2.2.2: bubble (p - 1)(t_f + t_b) / v with t_f, t_b of a whole
  // stage, i.e. (p - 1)(f + b) in per-chunk costs.
  double closed_form_bubble(const Dims& d, double f, double b, double w) const override {
    return static_cast<double>(d.pp - 1) * (f + b + w);
  }
};

}  // namespace
std::unique_ptr<PipelineSchedule> make_interleaved() { return std::make_unique<Interleaved>(); }
}  // namespace dtsim::sched
