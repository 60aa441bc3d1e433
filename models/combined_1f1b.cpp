#include "models/combined_1f1b.hpp"

#include <array>
#include <cstring>
#include <stdexcept>
#include <string>

namespace dtsim {

namespace {

bool is_ep_alltoall(const Op& op) {
  return op.kind == CommKind::EP && op.collective == Collective::AllToAll &&
         (op.type == OpType::collective || op.type == OpType::issue);
}

/// `ops` with every EP AllToAll issue ... wait pair turned into a blocking collective at the
/// place of its wait (after the ops it overlapped).
std::vector<Op> blocking_alltoalls(const std::vector<Op>& ops) {
  std::vector<Op> out;
  std::vector<Op> pending;  // issued AllToAlls waiting for their wait
  out.reserve(ops.size());
  for (const Op& op : ops) {
    if (op.type == OpType::issue && is_ep_alltoall(op)) {
      Op c = op;
      c.type = OpType::collective;
      pending.push_back(c);
      continue;
    }
    if (op.type == OpType::wait) {
      bool matched = false;
      for (auto it = pending.begin(); it != pending.end(); ++it)
        if (it->handle == op.handle) {
          Op c = *it;
          c.handle = -1;
          out.push_back(c);
          pending.erase(it);
          matched = true;
          break;
        }
      if (matched) continue;
    }
    out.push_back(op);
  }
  if (!pending.empty()) throw std::logic_error("merge_forward_backward: an EP AllToAll issued without its wait");
  return out;
}

/// Three segments and the two AllToAlls between them (nullptr when the pass has none).
struct Cut {
  std::array<std::vector<Op>, 3> seg;
  const Op* first = nullptr;
  const Op* second = nullptr;
};

Cut cut(const std::vector<Op>& ops, const char* first_name, const char* second_name) {
  Cut c;
  int a = -1, b = -1;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!is_ep_alltoall(ops[i])) continue;
    if (std::strcmp(ops[i].name, first_name) == 0 && a < 0) a = static_cast<int>(i);
    else if (std::strcmp(ops[i].name, second_name) == 0 && b < 0) b = static_cast<int>(i);
    else throw std::logic_error(std::string("merge_forward_backward: unexpected EP AllToAll ") + ops[i].name);
  }
  if ((a < 0) != (b < 0) || (a >= 0 && b < a))
    throw std::logic_error(std::string("merge_forward_backward: ") + first_name + " and " + second_name +
                           " do not come as a pair");
  if (a < 0) {  // no AllToAll: everything in the middle
    c.seg[1] = ops;
    return c;
  }
  c.first = &ops[static_cast<size_t>(a)];
  c.second = &ops[static_cast<size_t>(b)];
  for (size_t i = 0; i < ops.size(); ++i) {
    if (static_cast<int>(i) == a || static_cast<int>(i) == b) continue;
    const size_t at = static_cast<int>(i) < a ? 0 : static_cast<int>(i) < b ? 1 : 2;
    c.seg[at].push_back(ops[i]);
  }
  return c;
}

}  // namespace

void merge_forward_backward(std::vector<Op>& out, const std::vector<Op>& fwd_in, const std::vector<Op>& recompute,
                            const std::vector<Op>& bwd_in, int32_t& handles) {
  const std::vector<Op> fwd = blocking_alltoalls(fwd_in), bwd = blocking_alltoalls(bwd_in);
  const Cut f = cut(fwd, "moe_dispatch", "moe_combine");
  Cut b = cut(bwd, "moe_combine_bwd", "moe_dispatch_bwd");
  std::vector<Op> rec = recompute;
  if (!b.first) {  // a dense backward, all in the middle: its recomputation goes first
    rec.insert(rec.end(), b.seg[1].begin(), b.seg[1].end());
    b.seg[1].swap(rec);
    rec.clear();
  }
  auto append = [&](const std::vector<Op>& seg) { out.insert(out.end(), seg.begin(), seg.end()); };
  auto issue = [&](const Op* a2a) {
    if (!a2a) return -1;
    Op op = *a2a;
    op.type = OpType::issue;
    op.handle = handles++;
    out.push_back(op);
    return op.handle;
  };
  auto wait = [&](const Op* a2a, int handle) {
    if (handle < 0) return;
    Op op;
    op.type = OpType::wait;
    op.name = "wait";
    op.kind = CommKind::EP;
    op.handle = handle;
    op.layer = a2a->layer;
    op.micro_batch = a2a->micro_batch;
    op.phase = a2a->phase;
    op.pass = a2a->pass;
    op.chunk = a2a->chunk;
    op.dynamic_shape = a2a->dynamic_shape;
    out.push_back(op);
  };
  append(b.seg[0]);
  const int combine_bwd = issue(b.first);
  append(f.seg[0]);
  const int dispatch = issue(f.first);
  wait(b.first, combine_bwd);
  append(b.seg[1]);
  const int dispatch_bwd = issue(b.second);
  wait(f.first, dispatch);
  append(f.seg[1]);
  const int combine = issue(f.second);
  wait(b.second, dispatch_bwd);
  append(rec);
  append(b.seg[2]);
  wait(f.second, combine);
  append(f.seg[2]);
}

}  // namespace dtsim
