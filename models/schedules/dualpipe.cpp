// DualPipe (DeepSeek-V3 technical report, arXiv 2412.19437, Sec 3.2.1 and Fig 5;
// deepseek-ai/DualPipe dualpipe/dualpipe.py DualPipe.step): bidirectional. Rank r holds the
// layers of stage r for the micro-batches fed from rank 0 (chunk 0: the first half of the
// step's micro-batches) and those of stage p - 1 - r for the micro-batches fed from rank
// p - 1 (chunk 1: the second half), so every layer's parameters are held twice and the two
// copies' gradients are summed before the optimizer. Each half of the ranks runs DualPipe's
// eight steps written for p / 2 ranks, the second half with the local phases swapped
// ("phase ^= is_in_second_half"). Bubble (p/2 - 1)(F&B + B - 3W) (report Table 2), B a
// full backward.
#include <algorithm>

#include "models/schedules/schedules.hpp"

namespace dtsim::sched {
namespace {

class DualPipe final : public PipelineSchedule {
 public:
  const char* name() const override { return "dualpipe"; }
  const char* source() const override { return "DeepSeek-V3 report (arXiv 2412.19437) Sec 3.2.1; deepseek-ai/DualPipe"; }
  const char* summary() const override { return "bidirectional, parameters held twice, B/W split"; }
  Schedule id() const override { return Schedule::dualpipe; }
  int64_t chunks(const Dims&) const override { return 2; }
  int64_t virtual_stages(const Dims& d) const override { return d.pp; }
  bool splits_backward() const override { return true; }
  bool pairs_forward_backward() const override { return true; }
  bool params_twice() const override { return true; }
  int64_t virtual_stage(const Dims& d, int64_t r, int64_t c) const override { return c == 0 ? r : d.pp - 1 - r; }
  Place place(const Dims& d, int64_t vs, int64_t mb) const override {
    return mb < d.micro_batches / 2 ? Place{vs, 0} : Place{d.pp - 1 - vs, 1};
  }
  bool runs(const Dims& d, int64_t, int64_t c, int64_t mb) const override {
    return (c == 0) == (mb < d.micro_batches / 2);
  }
  std::vector<std::string> check(const Dims& d) const override {
    std::vector<std::string> p;
    if (d.vp != 1)
      p.push_back("layout.schedule=dualpipe holds one stage per direction on each rank: it needs layout.vp=1 (got vp=" +
                  std::to_string(d.vp) + ")");
    if (d.pp < 2 || d.pp % 2 != 0)
      p.push_back("layout.schedule=dualpipe needs an even layout.pp >= 2 (got pp=" + std::to_string(d.pp) + ")");
    if (d.micro_batches % 2 != 0 || d.micro_batches < 2 * d.pp)
      p.push_back("layout.schedule=dualpipe needs an even number of micro-batches per step, at least 2 * layout.pp = " +
                  std::to_string(2 * d.pp) + " (got " + std::to_string(d.micro_batches) +
                  "; DualPipe.step asserts num_chunks % 2 == 0 and num_chunks >= num_ranks * 2)");
    return p;
  }
  std::vector<std::vector<Step>> order(const Dims& d) const override {
    std::vector<std::vector<Step>> out;
    const int64_t half = d.pp / 2, mbs = d.micro_batches / 2;
    for (int64_t r = 0; r < d.pp; ++r) {
      const bool second = r >= half;
      const int32_t chunk[2] = {second ? 1 : 0, second ? 0 : 1};
      const int32_t first[2] = {static_cast<int32_t>(chunk[0] == 0 ? 0 : mbs), static_cast<int32_t>(chunk[1] == 0 ? 0 : mbs)};
      out.push_back(dualpipe_program(half, std::min(r, d.pp - 1 - r), mbs, chunk, first, d.combined_1f1b));
    }
    return out;
  }
  double closed_form_bubble(const Dims& d, double f, double b, double w) const override {
    const double full_b = b + w;
    return static_cast<double>(d.pp / 2 - 1) * ((f + full_b) + full_b - 3.0 * w);
  }
};

}  // namespace
std::unique_ptr<PipelineSchedule> make_dualpipe() { return std::make_unique<DualPipe>(); }
}  // namespace dtsim::sched
