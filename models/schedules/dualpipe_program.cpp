// DualPipe's eight-step program (schedules.hpp dualpipe_program). The step counts follow
// deepseek-ai/DualPipe dualpipe/dualpipe.py and dualpipe/dualpipev.py (DualPipe.step /
// DualPipeV.step, "Step 1: nF0" ... "Step 8: nW"); a "zero bubble" backward there
// (enable_zb) runs B now and queues W (WeightGradStore), which a later _weight_chunk runs in
// queue order; any other backward is the fused BW. An overlapped forward-backward pair
// (_forward_backward_chunk) is its F followed by its BW; with `paired` (the module's
// overlapped_forward_backward, training.overlap_moe_expert_parallel_comm) the F is marked
// Step::paired and the two run as one combined pass.
#include <deque>
#include <stdexcept>

#include "models/schedules/schedules.hpp"

namespace dtsim::sched {

std::vector<Step> dualpipe_program(int64_t ranks, int64_t rank, int64_t mbs, const int32_t phase_chunk[2],
                                   const int32_t first_mb[2], bool paired) {
  std::vector<Step> o;
  int32_t fcount[2] = {0, 0}, bcount[2] = {0, 0};
  std::deque<Step> weights;
  auto F = [&](int k, bool with_next = false) {
    o.push_back({Pass::F, phase_chunk[k], first_mb[k] + fcount[k]++, paired && with_next});
  };
  auto Bk = [&](int k, bool zb) {
    const Step s{zb ? Pass::B : Pass::BW, phase_chunk[k], first_mb[k] + bcount[k]++};
    o.push_back(s);
    if (zb) weights.push_back({Pass::W, s.chunk, s.mb});
  };
  auto W = [&] {
    if (weights.empty()) throw std::logic_error("dualpipe_program: W with nothing queued");
    o.push_back(weights.front());
    weights.pop_front();
  };
  const int64_t R = ranks, q = rank;
  for (int64_t i = 0; i < (R - q - 1) * 2; ++i) F(0);  // step 1: nF0
  for (int64_t i = 0; i < q + 1; ++i) {                // step 2: nF0F1
    F(0);
    F(1);
  }
  for (int64_t i = 0; i < R - q - 1; ++i) {  // step 3: nB1W1F1 (zero bubble)
    Bk(1, true);
    W();
    F(1);
  }
  for (int64_t i = 0; i < mbs - 2 * R + q + 1; ++i) {  // step 4 (main): nF0B1F1B0
    // _forward_backward_chunk(0, 1), except the first on the rank at the turn (DualPipe's middle
    // ranks, DualPipeV's last): "We don't overlap these two chunks to further reduce bubble size".
    F(0, !(i == 0 && q == R - 1));
    Bk(1, false);
    F(1, true);  // _forward_backward_chunk(1, 0)
    Bk(0, false);
  }
  for (int64_t i = 0; i < R - q - 1; ++i) {  // step 5: nB1F1B0
    Bk(1, false);
    F(1, true);  // _forward_backward_chunk(1, 0)
    Bk(0, false);
  }
  bool zb = false;  // step 6: nB1B0, the second half with zero bubble
  const int64_t s6 = q + 1;
  for (int64_t i = 0; i < s6; ++i) {
    if (i == s6 / 2 && q % 2 == 1) zb = true;
    Bk(1, zb);
    if (i == s6 / 2 && q % 2 == 0) zb = true;
    Bk(0, zb);
  }
  for (int64_t i = 0; i < R - q - 1; ++i) {  // step 7: nWB0 (zero bubble)
    W();
    Bk(0, true);
  }
  for (int64_t i = 0; i < q + 1; ++i) W();  // step 8: nW
  if (!weights.empty()) throw std::logic_error("dualpipe_program: W left queued");
  return o;
}

}  // namespace dtsim::sched
