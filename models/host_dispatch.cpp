#include "models/host_dispatch.hpp"

#include <algorithm>

namespace dtsim {

int32_t eager_launches(const Op& op) {
  switch (op.type) {
    case OpType::compute: return std::max<int32_t>(op.kernels, 0);
    case OpType::collective:
    case OpType::issue:
    case OpType::send:
    case OpType::recv: return 1;
    case OpType::wait: return 0;
  }
  return 0;
}

bool captured_in_graph(const Op& op) { return op.graph >= 0 && !op.dynamic_shape; }

namespace {
/// Walks `ops` in program order, calling fn(op, replay) with replay true for the first op of
/// each graph piece (a maximal run of captured ops of one graph; an eager launch ends a
/// piece, a wait, which launches nothing, does not).
template <class Ops, class F>
void for_each_piece(Ops& ops, F fn) {
  int32_t open = -1;  // the graph whose replay the previous op belongs to; -1 after an eager launch
  for (auto& op : ops) {
    const bool captured = captured_in_graph(op);
    fn(op, captured && op.graph != open);
    if (captured) open = op.graph;
    else if (eager_launches(op) > 0) open = -1;
  }
}
}  // namespace

void assign_host_dispatch(StagePlan& stage, const Experiment& exp) {
  const double d = exp.cluster.host_dispatch;
  for_each_piece(stage.ops, [d](Op& op, bool replay) {
    op.host_s = captured_in_graph(op) ? (replay ? d : 0.0) : d * static_cast<double>(eager_launches(op));
  });
}

double stage_host_seconds(const StagePlan& stage) {
  double s = 0;
  for (const Op& op : stage.ops) s += op.host_s;
  return s;
}

int64_t stage_graph_replays(const StagePlan& stage) {
  int64_t n = 0;
  for_each_piece(stage.ops, [&n](const Op&, bool replay) { n += replay ? 1 : 0; });
  return n;
}

}  // namespace dtsim
