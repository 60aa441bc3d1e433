// DualPipeV (deepseek-ai/DualPipe dualpipe/dualpipev.py; Sea AI Lab's "cut-in-half" of
// DualPipe): two model chunks per rank in a V, rank r holding virtual stages r and
// 2p - 1 - r, so the forward runs down the ranks in chunk 0, turns on the last rank without
// pipeline communication, and comes back up in chunk 1 to the loss on rank 0. DualPipe's
// eight-step program with all micro-batches in both chunks. Bubble
// (S/2 - 1)(F&B + B - 3W) for S = 2p stages (the repository's README table), B a full
// backward; with F&B run back to back (F + B), (p - 1)(F + 2 B_in + W) in B/W terms.
#include "models/schedules/schedules.hpp"

namespace dtsim::sched {
namespace {

class DualPipeV final : public PipelineSchedule {
 public:
  const char* name() const override { return "dualpipev"; }
  const char* source() const override { return "deepseek-ai/DualPipe dualpipe/dualpipev.py (DualPipeV.step)"; }
  const char* summary() const override { return "V placement of 2 chunks per rank, DualPipe's steps, B/W split"; }
  Schedule id() const override { return Schedule::dualpipev; }
  int64_t chunks(const Dims&) const override { return 2; }
  bool splits_backward() const override { return true; }
  bool pairs_forward_backward() const override { return true; }
  int64_t virtual_stage(const Dims& d, int64_t r, int64_t c) const override { return c == 0 ? r : 2 * d.pp - 1 - r; }
  Place place(const Dims& d, int64_t vs, int64_t) const override {
    return vs < d.pp ? Place{vs, 0} : Place{2 * d.pp - 1 - vs, 1};
  }
  std::vector<std::string> check(const Dims& d) const override {
    std::vector<std::string> p;
    if (d.vp != 2)
      p.push_back("layout.schedule=dualpipev places two model chunks per rank: it needs layout.vp=2 (got vp=" +
                  std::to_string(d.vp) + ")");
    if (d.pp < 2) p.push_back("layout.schedule=dualpipev needs layout.pp >= 2 (got pp=" + std::to_string(d.pp) + ")");
    if (d.micro_batches < 2 * d.pp)
      p.push_back("layout.schedule=dualpipev needs at least 2 * layout.pp = " + std::to_string(2 * d.pp) +
                  " micro-batches per step (got " + std::to_string(d.micro_batches) +
                  "; DualPipeV.step asserts num_chunks >= num_ranks * 2)");
    return p;
  }
  std::vector<std::vector<Step>> order(const Dims& d) const override {
    std::vector<std::vector<Step>> out;
    const int32_t chunk[2] = {0, 1}, first[2] = {0, 0};
    for (int64_t r = 0; r < d.pp; ++r) out.push_back(dualpipe_program(d.pp, r, d.micro_batches, chunk, first, d.combined_1f1b));
    return out;
  }
  double closed_form_bubble(const Dims& d, double f, double b, double w) const override {
    const double full_b = b + w;
    return static_cast<double>(d.pp - 1) * ((f + full_b) + full_b - 3.0 * w);
  }
};

}  // namespace
std::unique_ptr<PipelineSchedule> make_dualpipev() { return std::make_unique<DualPipeV>(); }
}  // namespace dtsim::sched
