#pragma once
// Choosing the algorithm and protocol of one collective, as NCCL's tuner does
// (NVIDIA/nccl src/enqueue.cc topoGetAlgoInfo + src/graph/tuning.cc ncclTopoGetAlgoTime):
// among the algorithms it knows (here: those with tuner_candidate()) and the protocols each
// supports, the one with the least predicted time (Algorithm::tuner_time: NCCL's model) wins; ties go to registry
// order, then LL, LL128, Simple. A CollectiveChoice (cluster.collectives, dtsim collective
// --algo/--proto) forces an algorithm and/or a protocol.
#include <string>

#include "models/experiment.hpp"
#include "sim/collectives/collective.hpp"

namespace dtsim::collectives {

struct Choice {
  const Algorithm* algorithm = nullptr;
  Protocol protocol = Protocol::Simple;
  double time_s = 0;  // the chosen algorithm's closed form, alone
};

/// The choice for `op` on `g`. With `strict`, a forced algorithm or protocol that cannot run
/// the collective throws InputError naming the key `what` ("cluster.collectives" or
/// "--algo"/"--proto") and the reason; otherwise it falls back to the automatic choice, as
/// NCCL does when NCCL_ALGO names an algorithm that cannot run a collective. Also throws
/// InputError for unknown names, and when no algorithm can run `op` on `g`.
Choice choose(CollOp op, const GroupLayout& g, const CommModel& m, double bytes, const CollectiveChoice& want,
              bool strict, const std::string& what = "cluster.collectives");

}  // namespace dtsim::collectives
