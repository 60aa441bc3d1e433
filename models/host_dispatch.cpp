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

namespace {
bool captured(const Op& op) { return op.graph >= 0 && !op.dynamic_shape; }
}  // namespace

void assign_host_dispatch(StagePlan& stage, const Experiment& exp) {
  const double d = exp.cluster.host_dispatch;
  int32_t open = -1;  // the graph whose replay the previous op belongs to; -1 after an eager op
  for (Op& op : stage.ops) {
    if (captured(op)) {
      op.host_s = op.graph == open ? 0.0 : d;  // a new piece: one replay
      open = op.graph;
    } else {
      op.host_s = d * static_cast<double>(eager_launches(op));
      // A wait launches nothing and does not end a graph piece (the graph's stream waits).
      if (eager_launches(op) > 0) open = -1;
    }
  }
}

double stage_host_seconds(const StagePlan& stage) {
  double s = 0;
  for (const Op& op : stage.ops) s += op.host_s;
  return s;
}

int64_t stage_graph_replays(const StagePlan& stage) {
  int64_t n = 0;
  int32_t open = -1;
  for (const Op& op : stage.ops) {
    if (captured(op)) {
      if (op.graph != open) ++n;
      open = op.graph;
    } else if (eager_launches(op) > 0) {
      open = -1;
    }
  }
  return n;
}

}  // namespace dtsim
