// The SimGrid (S4U) engine: executes a StepPlan with a compute stream and communication
// streams per rank; collectives and P2P as flows on the platform's NVLink and NIC links
// (sim/platform.hpp, sim/collective_exec.hpp).
//
// Network model: CM02 without cross-traffic, TCP-gamma out of the way, bandwidth and
// latency factors 1, so a flow of S bytes alone on a link of bandwidth B takes S/B
// (../shared/design/SIMGRID.md, "Model flags"). The flags are recorded in every result.
//
// Each rank runs a compute actor (its plan's ops in order; consecutive kernels are one
// sleep) and one communication-stream actor per kind it issues asynchronously (DP
// buckets, ZeRO gathers, CP K/V, TP re-gathers), in NCCL's in-order stream semantics.
// With folding, one representative rank per pipeline stage is simulated.
#include <simgrid/kernel/Timer.hpp>
#include <simgrid/s4u.hpp>
#include <xbt/log.h>


#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <unistd.h>

#include "models/precision.hpp"
#include "models/checked.hpp"
#include "models/compute_cost.hpp"
#include "models/errors.hpp"
#include "models/memory.hpp"
#include "models/flops.hpp"
#include "models/plan.hpp"
#include "models/rank_grid.hpp"
#include "models/schedules/schedule.hpp"
#include "reports/json.hpp"
#include "reports/json_read.hpp"
#include "sim/analytic_engine.hpp"
#include "sim/child_process.hpp"
#include "sim/collective_exec.hpp"
#include "sim/engine.hpp"
#include "sim/platform.hpp"

namespace sg4 = simgrid::s4u;
namespace sgk = simgrid::kernel;

namespace dtsim {
namespace {

using simgrid_engine::build_platform;
using simgrid_engine::closed_form_steps;
using simgrid_engine::execute_collective;
using simgrid_engine::flow_bytes;
using simgrid_engine::launch_fold_siblings;
using simgrid_engine::FoldPolicy;
using simgrid_engine::Platform;

std::string fmt_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

struct Stats {
  double compute_s = 0, bubble_s = 0, finish_s = 0, optimizer_s = 0, slowdown_s = 0, host_bound_s = 0;
  std::array<CommStats, kCommKinds> comm{};
};

struct RankState;
struct GroupState;

inline constexpr size_t kGroupKinds = static_cast<size_t>(GroupKind::EDP) + 1;

struct QueuedOp {
  const Op* op;
  int64_t seq;
  bool interferes = true;  // slows compute while it runs (SM-based kernels; not copy engines)
};

// Blocking uses semaphores, never Actor::suspend(): suspending an actor also suspends
// its in-flight activities, including detached P2P sends it posted.
struct Stream {
  std::deque<QueuedOp> queue;
  sg4::ActorPtr actor;
  sg4::SemaphorePtr queued;     // one token per queued op
  sg4::SemaphorePtr collective;  // released when a collective it waits in completes
  /// Intervals in which the stream's current collective waited for other members to
  /// arrive: not communication in flight (wait_handle counts a compute wait overlapping
  /// them as bubble).
  std::vector<std::pair<double, double>> peer_waits;
};

struct RankState {
  int64_t rank = 0;
  int64_t stage = 0;
  const StagePlan* plan = nullptr;
  sg4::Host* host = nullptr;
  std::vector<char> done;             // per handle
  std::vector<double> issued_at;      // per handle
  int waiting_handle = -1;
  sg4::ActorPtr compute_actor;
  sg4::SemaphorePtr handle_done;  // released when the awaited handle completes
  sg4::SemaphorePtr rate_change;  // released when a comm stream starts/stops while computing
  bool computing = false;         // the compute actor is inside a kernel run
  // SMs held by the collective each comm stream runs now (0: idle or on copy engines).
  std::array<double, kCommKinds> active_sms{};
  sg4::SemaphorePtr collective;   // released when a collective it waits in completes
  std::array<Stream, kCommKinds> streams;
  // Per group kind (a rank is in one group of each kind): the group, looked up once
  // (Simulation::group_of), and the next instance number of its collectives.
  std::array<GroupState*, kGroupKinds> groups{};
  std::array<int64_t, kGroupKinds> group_seq{};
  // P2P sends: every send's times (counted at the end, in posting order, so that sums and
  // the trace do not depend on when a transfer is retired), and the transfers not yet
  // retired, oldest first (`unretired` of them, the last ones of send_info). A finished
  // transfer is released at the next send (retire_sends), so that memory holds the sends in
  // flight, not every send of the step.
  struct SendInfo {
    const Op* op;
    double posted_at;  // when the compute stream posted it
    double alpha;      // P2P latency to the receiver (Platform::alpha)
    double ready = 0;  // flow end + alpha: the bytes usable at the receiver
  };
  std::vector<SendInfo> send_info;
  std::deque<sg4::CommPtr> sends;  // parallel to the last sends.size() entries of send_info
  std::deque<Op> split_ops;         // parts of pipelined TP collectives (stable addresses)
  bool finished = false;            // the compute actor reached the end of its plan
  Stats stats;
};

struct Message {
  double posted_at = 0;
  int32_t micro_batch = -1;
  int32_t chunk = 0;
  sg4::CommPtr comm;  // the sender's transfer (its flow end times the receive); dropped on receipt
};

struct Instance {
  int arrived = 0;
  double latest = -1.0;  // the latest arrival date posted (Simulation::run_collective)
  std::vector<sg4::SemaphorePtr> waiters;
  std::shared_ptr<double> started = std::make_shared<double>(-1.0);  // when the last member arrived
};

struct GroupState {
  std::vector<int64_t> members;        // ascending global ranks (ring order)
  std::vector<int64_t> present;        // members simulated by an actor
  std::unordered_map<int64_t, Instance> instances;  // seq -> in-progress instance
  /// (collective, bytes, parts) -> its sleeps when it moves no bytes between nodes
  /// (collective_exec.hpp closed_form_steps; an op of Op::gather_parts parts is that many
  /// collectives of bytes / parts back to back), nullopt when it has flows.
  std::map<std::tuple<int, double, int>, std::optional<std::vector<double>>> closed_forms;
};

TraceStream stream_of(CommKind k) {
  switch (k) {
    case CommKind::TP: return TraceStream::tp;
    case CommKind::CP: return TraceStream::cp;
    case CommKind::PP: return TraceStream::pp;
    case CommKind::DP: return TraceStream::dp;
    case CommKind::EP: return TraceStream::ep;
  }
  return TraceStream::compute;
}

class Simulation {
 public:
  Simulation(const StepPlan& plan, const EngineOptions& opts)
      : plan_(plan),
        grid_(plan.exp.layout),
        opts_(opts),
        ep_routing_(collectives::ep_token_routing(plan.exp)),
        ep_choice_(collectives::ep_alltoall_choice(plan.exp)) {
    const auto& c = plan.exp.cluster;
    (void)c;
    const auto& l = plan.exp.layout;
    stage_size_ = l.tp * l.cp * l.dp;
  }

  StepResult run();

 private:
  bool simulated(int64_t rank) const { return !opts_.fold || rank % stage_size_ == 0; }
  /// The rank's group of `kind`, built on its first use and cached in the rank's state.
  GroupState& group_of(RankState& rs, GroupKind kind);
  /// Joins collective instance `seq` of `op`'s group, arriving at `arrival` (now, or later
  /// for a member whose kernels up to it were not slept through: can_defer), and returns when
  /// it completed; the result is when it started (its last member arrived).
  double run_collective(RankState& rs, const Op& op, int64_t seq, const sg4::SemaphorePtr& wake, double arrival);
  /// The sleeps of `op` on group `g` when it moves no bytes between nodes, cached per group.
  const std::optional<std::vector<double>>& closed_form_of(GroupState& g, const Op& op);
  /// Whether the compute actor may post its arrival at the blocking collective `op` at the
  /// end of the kernels it has pending, without sleeping through them first: exact when the
  /// kernels run at full rate (no stream of the rank running or queued, or no SM
  /// interference), nothing is traced per kernel, and the collective is closed-form over
  /// several simulated members (it then starts from a timer at its last arrival; with flows
  /// the last arriver must be at its start to launch them). One blocking wait per member
  /// instead of two.
  bool can_defer(RankState& rs, const Op& op);
  /// Sleeps of a closed-form collective run as kernel timers, one after the other; the last
  /// releases every waiter (run_collective).
  struct TimerChain {
    std::vector<double> steps;
    size_t next = 0;
    std::vector<sg4::SemaphorePtr> waiters;
  };
  void wake_at_end(const std::shared_ptr<TimerChain>& chain);
  int64_t next_seq(RankState& rs, GroupKind kind) { return rs.group_seq[static_cast<size_t>(kind)]++; }
  void compute_actor(RankState& rs);
  void stream_actor(RankState& rs, int kind);
  void issue(RankState& rs, const Op& op, bool interferes = true);
  /// A collective on the compute stream; `deferred`: seconds of kernels the compute actor
  /// has not slept through, so that it arrives that much after now (can_defer).
  void blocking_collective(RankState& rs, const Op& op, double deferred = 0);
  void set_active(RankState& rs, int kind, double sms);
  void record(const RankState& rs, TraceStream stream, const Op& op, const char* category, double start,
              const char* name = nullptr, double end = -1, bool async = false);
  /// Traces [t0, start) as a "bubble" slice on the rank's compute row (nothing if empty).
  void record_bubble(const RankState& rs, const Op& op, double t0, double start);
  std::string group_label(const RankState& rs, GroupKind kind);
  void run_kernels(RankState& rs, double seconds);
  /// No communication stream of the rank holds SMs or has an op queued.
  static bool streams_idle(const RankState& rs);
  void wait_handle(RankState& rs, const Op& op);
  void send(RankState& rs, const Op& op);
  void recv(RankState& rs, const Op& op);
  /// Releases the rank's finished P2P transfers, oldest first, noting when each ended.
  void retire_sends(RankState& rs);
  int64_t pp_peer(const RankState& rs, const Op& op) const {
    return rs.rank + (static_cast<int64_t>(op.peer_stage) - rs.stage) * stage_size_;
  }
  sg4::Mailbox* mailbox(int64_t rank, Direction dir, int32_t chunk) const;

  const StepPlan& plan_;
  RankGrid grid_;
  EngineOptions opts_;
  collectives::TokenRouting ep_routing_;                // the EP AllToAlls' token routing
  std::optional<CollectiveChoice> ep_choice_;            // their algorithm (training.moe_token_dispatcher)
  int64_t stage_size_ = 1;
  Platform platform_;
  FoldPolicy fold_;
  double overlap_speed_ = 1.0;  // compute speed while a collective overlaps
  std::vector<std::unique_ptr<RankState>> ranks_;  // simulated ranks
  std::map<std::pair<int, int64_t>, GroupState> groups_;
  std::vector<std::unique_ptr<Message>> messages_;
  int64_t next_async_id_ = 1;  // trace: async slice ids (P2P transfers)
  simgrid_engine::ActorErrors errors_;  // the first exception raised inside an actor
};

GroupState& Simulation::group_of(RankState& rs, GroupKind kind) {
  GroupState*& cached = rs.groups[static_cast<size_t>(kind)];
  if (cached) return *cached;
  auto members = grid_.group_of(rs.rank, kind);
  auto key = std::make_pair(static_cast<int>(kind), members.front());
  auto it = groups_.find(key);
  if (it == groups_.end()) {
    GroupState g;
    g.members = std::move(members);
    for (int64_t m : g.members) {
      if (simulated(m)) g.present.push_back(m);
    }
    it = groups_.emplace(key, std::move(g)).first;
  }
  cached = &it->second;  // std::map nodes keep their address
  return *cached;
}

const std::optional<std::vector<double>>& Simulation::closed_form_of(GroupState& g, const Op& op) {
  const bool ep_a2a = op.group == GroupKind::EP && op.collective == Collective::AllToAll;
  const collectives::CollOp cop = ep_a2a ? collectives::CollOp::AllToAll : collectives::to_op(op.collective);
  const int parts = std::max(1, static_cast<int>(op.gather_parts));
  const auto key = std::make_tuple(static_cast<int>(cop), op.size_bytes, parts);
  auto it = g.closed_forms.find(key);
  if (it != g.closed_forms.end()) return it->second;
  std::optional<std::vector<double>> steps;
  std::vector<double> out;
  if (closed_form_steps(platform_, g.members, cop, op.size_bytes / parts, ep_a2a && ep_choice_ ? &*ep_choice_ : nullptr,
                        ep_a2a ? &ep_routing_ : nullptr, out)) {
    std::vector<double> all;
    for (int i = 0; i < parts; ++i) all.insert(all.end(), out.begin(), out.end());
    steps = std::move(all);
  }
  return g.closed_forms.emplace(key, std::move(steps)).first->second;
}

bool Simulation::can_defer(RankState& rs, const Op& op) {
  if (opts_.trace || !(overlap_speed_ >= 1.0 || streams_idle(rs))) return false;
  GroupState& g = group_of(rs, op.group);
  return g.present.size() > 1 && closed_form_of(g, op).has_value();
}

double Simulation::run_collective(RankState& rs, const Op& op, int64_t seq, const sg4::SemaphorePtr& wake,
                                  double arrival) {
  GroupState& g = group_of(rs, op.group);
  Instance& inst = g.instances[seq];
  inst.arrived++;
  inst.latest = std::max(inst.latest, arrival);
  if (inst.arrived < static_cast<int>(g.present.size())) {
    inst.waiters.push_back(wake);
    const std::shared_ptr<double> started = inst.started;
    wake->acquire();
    return *started;
  }
  std::vector<sg4::SemaphorePtr> waiters = std::move(inst.waiters);
  const std::shared_ptr<double> started = inst.started;
  // Every member posted; the collective starts when the last of them arrives: now, or later
  // when a member posted an arrival after kernels it did not sleep through (can_defer).
  const double now = sg4::Engine::get_clock();
  const double start = std::max(inst.latest, now);
  g.instances.erase(seq);
  *started = start;
  const bool ep_a2a = op.group == GroupKind::EP && op.collective == Collective::AllToAll;
  if (!waiters.empty()) {
    if (const auto& steps = closed_form_of(g, op)) {
      // Inside one node with several members simulated (unfolded): the members wake together
      // from kernel timers at the dates the last arriver's sleeps would end (each timer set
      // at the clock plus one sleep, as sleep_for's end date is), instead of the last
      // arriver sleeping and then releasing each waiter with a simcall of its own.
      waiters.push_back(wake);
      auto chain = std::make_shared<TimerChain>(TimerChain{*steps, 0, std::move(waiters)});
      if (start > now)
        sgk::timer::Timer::set(start, [this, chain] { wake_at_end(chain); });
      else
        wake_at_end(chain);
      wake->acquire();
      return start;
    }
  }
  // Flows: no member defers such a collective (can_defer), so it starts now.
  if (ep_a2a)
    execute_collective(platform_, fold_, g.members, collectives::CollOp::AllToAll, op.size_bytes,
                       ep_choice_ ? &*ep_choice_ : nullptr, &ep_routing_);
  else  // Op::gather_parts collectives back to back
    for (int i = 0, parts = std::max(1, static_cast<int>(op.gather_parts)); i < parts; ++i)
      execute_collective(platform_, fold_, g.members, op.collective, op.size_bytes / parts);
  for (auto& w : waiters) w->release();
  return *started;
}

void Simulation::wake_at_end(const std::shared_ptr<TimerChain>& chain) {
  if (chain->next == chain->steps.size()) {
    for (auto& w : chain->waiters) w->release();
    return;
  }
  const double step = chain->steps[chain->next++];
  sgk::timer::Timer::set(sg4::Engine::get_clock() + step, [this, chain] { wake_at_end(chain); });
}

void Simulation::issue(RankState& rs, const Op& op, bool interferes) {
  const int k = static_cast<int>(op.kind);
  Stream& st = rs.streams[k];
  st.queue.push_back({&op, next_seq(rs, op.group), interferes});
  rs.issued_at[op.handle] = sg4::Engine::get_clock();
  if (!st.actor) {
    st.queued = sg4::Semaphore::create(0);
    st.collective = sg4::Semaphore::create(0);
    st.actor = sg4::Actor::create("stream" + std::to_string(k) + "_" + std::to_string(rs.rank), rs.host,
                                  errors_.guard([this, &rs, k] { stream_actor(rs, k); }));
    st.actor->daemonize();
  }
  st.queued->release();
}

void Simulation::stream_actor(RankState& rs, int kind) {
  Stream& st = rs.streams[kind];
  for (;;) {
    st.queued->acquire();
    QueuedOp q = st.queue.front();
    st.queue.pop_front();
    const double t0 = sg4::Engine::get_clock();
    if (q.interferes) set_active(rs, kind, comm_kernel_sms(*q.op));
    const double start = run_collective(rs, *q.op, q.seq, st.collective, t0);
    if (q.interferes) set_active(rs, kind, 0.0);
    // In flight from its start (every member there) to its end; before that it waited
    // for the group's other members (models/result.hpp CommStats).
    if (start > t0) st.peer_waits.push_back({t0, start});
    record(rs, stream_of(q.op->kind), *q.op, to_string(q.op->kind), start);
    auto& cs = rs.stats.comm[kind];
    cs.total_s += sg4::Engine::get_clock() - start;
    cs.bytes += ring_cost(q.op->collective, static_cast<int64_t>(group_of(rs, q.op->group).members.size()),
                          q.op->size_bytes).edge_bytes;
    cs.operations++;
    rs.done[q.op->handle] = 1;
    if (rs.waiting_handle == q.op->handle) {
      rs.waiting_handle = -1;
      rs.handle_done->release();
    }
  }
}

std::string Simulation::group_label(const RankState& rs, GroupKind kind) {
  const auto members = grid_.group_of(rs.rank, kind);
  std::string out = "[";
  for (size_t i = 0; i < members.size() && i < 8; ++i) out += (i ? ", " : "") + std::to_string(members[i]);
  if (members.size() > 8) out += ", ... (" + std::to_string(members.size()) + " ranks)";
  return out + "]";
}

void Simulation::record_bubble(const RankState& rs, const Op& op, double t0, double start) {
  if (start <= t0) return;
  TraceEvent bubble;
  bubble.rank = rs.rank;
  bubble.name = "bubble";
  bubble.category = "bubble";
  bubble.start_s = t0;
  bubble.duration_s = start - t0;
  bubble.micro_batch = op.micro_batch;
  bubble.chunk = op.chunk;
  opts_.trace->events.push_back(bubble);
}

void Simulation::record(const RankState& rs, TraceStream stream, const Op& op, const char* category, double start,
                        const char* name, double end, bool async) {
  if (!opts_.trace) return;
  TraceEvent e;
  e.rank = rs.rank;
  e.stream = stream;
  e.name = name ? name : op.name;
  e.category = category;
  e.start_s = start;
  e.duration_s = (end >= 0 ? end : sg4::Engine::get_clock()) - start;
  if (async) e.async_id = next_async_id_++;
  if (op.type == OpType::compute) {
    e.flops = op.flops;
    e.bytes = op.bytes;
  } else {
    e.bytes = op.size_bytes;
    if (op.type != OpType::send && op.type != OpType::recv) e.group = group_label(rs, op.group);
  }
  e.layer = op.layer;
  e.micro_batch = op.micro_batch;
  e.chunk = op.chunk;
  opts_.trace->events.push_back(std::move(e));
}

void Simulation::set_active(RankState& rs, int kind, double sms) {
  rs.active_sms[static_cast<size_t>(kind)] = sms;
  if (rs.computing) rs.rate_change->release();
}

bool Simulation::streams_idle(const RankState& rs) {
  for (size_t k = 0; k < rs.streams.size(); ++k)
    if (rs.active_sms[k] > 0 || !rs.streams[k].queue.empty()) return false;
  return true;
}

void Simulation::run_kernels(RankState& rs, double seconds) {
  // Kernels slow down while a collective of this rank overlaps them (SMs taken by NCCL,
  // models/compute_cost.hpp): the remaining work is re-timed whenever a stream starts or
  // stops.
  double work = seconds;
  const double begin = sg4::Engine::get_clock();
  // No stream running or queued: only this actor, now busy in the kernels, could start one,
  // so the rate stays 1 throughout and a plain sleep ends exactly when the timed wait would
  // (both are one CPU sleep action of the same duration), without a semaphore acquisition.
  if (streams_idle(rs)) {
    sg4::this_actor::sleep_for(work);  // at rate 1: no slowdown (clock - begin - seconds is rounding)
    return;
  }
  while (work > 1e-15) {
    // The largest SM holder among the running collectives (models/compute_cost.hpp).
    const double sms = *std::max_element(rs.active_sms.begin(), rs.active_sms.end());
    const double speed = sms > 0 ? comm_overlap_speed(plan_.exp.cluster.gpu, plan_.exp.training.comm_interference, sms)
                                 : 1.0;
    const double start = sg4::Engine::get_clock();
    rs.computing = true;
    const bool finished = rs.rate_change->acquire_timeout(work / speed);
    rs.computing = false;
    if (finished) break;
    work -= (sg4::Engine::get_clock() - start) * speed;
  }
  // Never below 0: kernels never run faster than alone (a negative is the clock's rounding).
  rs.stats.slowdown_s += std::max(0.0, (sg4::Engine::get_clock() - begin) - seconds);
}

void Simulation::wait_handle(RankState& rs, const Op& op) {
  if (rs.done[op.handle]) return;
  const double t0 = sg4::Engine::get_clock();
  rs.waiting_handle = op.handle;
  rs.handle_done->acquire();
  const double t1 = sg4::Engine::get_clock();
  // The part of the wait in which the stream's collectives waited for other members of
  // their group (skew between ranks, e.g. pipeline stages) is bubble, the rest exposed
  // communication.
  double skew = 0;
  const auto& pw = rs.streams[static_cast<int>(op.kind)].peer_waits;
  for (auto it = pw.rbegin(); it != pw.rend() && it->second > t0; ++it)
    skew += std::max(0.0, std::min(it->second, t1) - std::max(it->first, t0));
  rs.stats.comm[static_cast<int>(op.kind)].exposed_s += (t1 - t0) - skew;
  rs.stats.bubble_s += skew;
  record(rs, TraceStream::compute, op, "wait", t0, "wait");
}

/// One mailbox per (receiving rank, direction, receiving model chunk): each has a single
/// sender, which sends in the order the receiver receives (both walk that chunk's
/// micro-batches in order, under every registered schedule).
sg4::Mailbox* Simulation::mailbox(int64_t rank, Direction dir, int32_t chunk) const {
  std::string name(1, dir == Direction::forward ? 'f' : 'b');  // (char + string: no GCC 12 -Wrestrict false positive)
  name += std::to_string(rank);
  name += '.';
  name += std::to_string(chunk);
  return sg4::Mailbox::by_name(name);
}

void Simulation::send(RankState& rs, const Op& op) {
  const int64_t dst = pp_peer(rs, op);
  messages_.push_back(std::make_unique<Message>());
  Message* msg = messages_.back().get();
  msg->posted_at = sg4::Engine::get_clock();
  msg->micro_batch = op.micro_batch;
  msg->chunk = op.chunk;
  auto* mb = mailbox(dst, op.dir, op.peer_chunk);
  auto& cs = rs.stats.comm[static_cast<int>(CommKind::PP)];
  cs.bytes += op.size_bytes;
  cs.operations++;
  retire_sends(rs);
  rs.sends.push_back(mb->put_async(msg, static_cast<uint64_t>(flow_bytes(platform_, fold_, rs.rank, dst, op.size_bytes))));
  msg->comm = rs.sends.back();
  rs.send_info.push_back({&op, msg->posted_at, platform_.alpha(platform_.same_node(dst, rs.rank))});
  // Folded on a fabric with switch uplinks: the folded ranks' identical sends load the
  // uplinks as separate flows (sim/collective_exec.hpp).
  launch_fold_siblings(platform_, fold_, rs.rank, dst, op.size_bytes, stage_size_);
  if (!plan_.exp.training.overlap_p2p) {
    // Megatron waits on its isend (batch_isend_irecv + wait): the compute stream blocks
    // until the bytes arrived. Exposed: that wait, inside the transfer's time (posting to
    // flow end), which the PP total counts at the end of the plan.
    const double t0 = sg4::Engine::get_clock();
    rs.sends.back()->wait();
    cs.exposed_s += sg4::Engine::get_clock() - t0;
    record(rs, TraceStream::compute, op, "wait", t0, "wait");
  }

}

void Simulation::retire_sends(RankState& rs) {
  // Oldest first; a transfer still in flight stops the walk (later ones wait for the next
  // send or the end of the plan). Comm::test() on a finished transfer releases it.
  while (!rs.sends.empty() && rs.sends.front()->test()) {
    auto& info = rs.send_info[rs.send_info.size() - rs.sends.size()];
    info.ready = rs.sends.front()->get_finish_time() + info.alpha;
    rs.sends.pop_front();
  }
}

void Simulation::recv(RankState& rs, const Op& op) {
  const double t0 = sg4::Engine::get_clock();
  auto* mb = mailbox(rs.rank, op.dir, op.chunk);
  auto* msg = mb->get<Message>();
  // P2P latency (alpha) on top of the bandwidth term carried by the flow: when the rank
  // waited for the bytes it also waits alpha; when they were already there, it waits
  // only for what is left of alpha since the send was posted.
  // A mailbox per (receiver, direction, chunk) has one sender walking the same
  // micro-batch order, so it delivers in order; anything else is an engine bug.
  if (msg->micro_batch != op.micro_batch || msg->chunk != op.peer_chunk)
    throw std::logic_error("pipeline message out of order at rank " + std::to_string(rs.rank));
  const int64_t src = pp_peer(rs, op);
  const double alpha = platform_.alpha(platform_.same_node(src, rs.rank));
  const double arrived = sg4::Engine::get_clock();
  const double extra = arrived > t0 ? alpha : std::max(0.0, msg->posted_at + alpha - t0);
  if (extra > 0) sg4::this_actor::sleep_for(extra);
  const double t1 = sg4::Engine::get_clock();
  // The transfer started when the sender posted it (eager: the receiver's mailbox has a
  // permanent receiver, as Megatron pre-posts its irecv). Waiting before that is bubble;
  // waiting while the bytes were in flight is exposed PP communication.
  const double start = std::max(t0, msg->posted_at);
  // The transfer's time on this rank, as for a send (compute_actor's end): from posting to
  // the bytes being usable here, the flow's end plus alpha. The wait above lies inside it
  // (it starts no earlier than the posting and ends at flow end + alpha, or at most alpha
  // after the posting when the bytes were already here), so exposed <= total.
  const double flow_end = arrived > t0 ? arrived : msg->comm->get_finish_time();
  if (!(flow_end >= msg->posted_at && flow_end <= arrived))
    throw std::logic_error("pipeline message at rank " + std::to_string(rs.rank) + " without a finished transfer");
  msg->comm = nullptr;
  const double ready = flow_end + alpha;
  auto& cs = rs.stats.comm[static_cast<int>(CommKind::PP)];
  cs.total_s += ready - msg->posted_at;
  cs.operations++;
  cs.exposed_s += t1 - start;
  rs.stats.bubble_s += start - t0;
  if (opts_.trace) {
    record_bubble(rs, op, t0, start);
    if (t1 > start) record(rs, TraceStream::compute, op, "wait", start, "wait", t1);
    record(rs, TraceStream::pp_recv, op, "PP", msg->posted_at, nullptr, ready, /*async=*/true);
  }
}

void Simulation::blocking_collective(RankState& rs, const Op& op, double deferred) {
  const int64_t seq = next_seq(rs, op.group);
  const double t0 = sg4::Engine::get_clock() + deferred;  // arrival
  const double start = run_collective(rs, op, seq, rs.collective, t0);
  // Waiting for the group's other members to arrive (e.g. the last pipeline stage for the
  // first at the tied-embedding AllReduce) is bubble; from the start on, exposed
  // communication (models/result.hpp CommStats).
  rs.stats.bubble_s += start - t0;
  if (opts_.trace) record_bubble(rs, op, t0, start);
  record(rs, stream_of(op.kind), op, to_string(op.kind), start);
  const double dt = sg4::Engine::get_clock() - start;
  auto& cs = rs.stats.comm[static_cast<int>(op.kind)];
  cs.total_s += dt;
  cs.exposed_s += dt;
  cs.bytes += ring_cost(op.collective, static_cast<int64_t>(group_of(rs, op.group).members.size()),
                        op.size_bytes).edge_bytes;
  cs.operations++;
}

void Simulation::compute_actor(RankState& rs) {
  const auto& ops = rs.plan->ops;
  double pending = 0;  // consecutive compute time folded into one sleep
  auto flush = [&] {
    if (pending > 0) {
      if (overlap_speed_ < 1.0) run_kernels(rs, pending);
      else sg4::this_actor::sleep_for(pending);
    }
    pending = 0;
  };
  auto run_now = [&](double seconds) {
    pending = seconds;
    flush();
  };
  // Host dispatch (models/host_dispatch.hpp): the host clock advances by each op's host_s in
  // program order and never waits for the GPU; an op whose dispatch ends after the GPU got
  // through the work before it starts then, the GPU idle in between (host-bound).
  double host = 0;
  auto dispatched = [&](const Op& x) {
    if (x.host_s <= 0) return;
    host += x.host_s;
    if (host <= sg4::Engine::get_clock() + pending) return;  // the GPU is busy past it
    flush();
    const double t0 = sg4::Engine::get_clock();
    if (host <= t0) return;
    sg4::this_actor::sleep_for(host - t0);
    const double t1 = sg4::Engine::get_clock();
    rs.stats.host_bound_s += t1 - t0;
    if (opts_.trace) record(rs, TraceStream::compute, x, "host", t0, "host-bound", t1);
  };
  // TP communication overlap (Op::overlap_splits, models/plan.hpp).
  auto is_gemm = [&](size_t j) { return j < ops.size() && ops[j].type == OpType::compute; };
  auto ring_exchange = [&](const Op& ag, const Op& gemm) {  // AllGather, then its GEMM
    flush();
    const double t0 = sg4::Engine::get_clock();
    const double n = ag.overlap_splits;
    issue(rs, ag, /*interferes=*/false);  // peer-to-peer copies on copy engines
    run_now(gemm.time_s * (n - 1) / n);
    wait_handle(rs, ag);
    run_now(gemm.time_s / n);
    record(rs, TraceStream::compute, gemm, "compute", t0);
    rs.stats.compute_s += gemm.time_s;
  };
  auto pipelined_reduce_scatter = [&](const Op& gemm, const Op& rs_op) {  // GEMM, then its ReduceScatter
    flush();
    const double t0 = sg4::Engine::get_clock();
    const double m = rs_op.overlap_splits;
    run_now(gemm.time_s / m);
    Op& overlapped = rs.split_ops.emplace_back(rs_op);
    overlapped.size_bytes = rs_op.size_bytes * (m - 1) / m;
    issue(rs, overlapped);
    run_now(gemm.time_s * (m - 1) / m);
    wait_handle(rs, overlapped);
    record(rs, TraceStream::compute, gemm, "compute", t0);
    rs.stats.compute_s += gemm.time_s;
    Op& last = rs.split_ops.emplace_back(rs_op);
    last.size_bytes = rs_op.size_bytes / m;
    blocking_collective(rs, last);
  };
  // CP ring attention (a wait with Op::overlap_splits, models/plan.hpp): the remote blocks
  // but the last run before the K/V exchange completes; returns the index of the op done.
  auto ring_blocks = [&](size_t i) -> size_t {
    size_t j = i + 1;
    if (j < ops.size() && ops[j].type == OpType::issue) {  // backward: dK/dV ReduceScatter
      dispatched(ops[j]);
      flush();
      issue(rs, ops[j]);
      ++j;
    }
    const Op& remote = ops[j];
    dispatched(remote);
    flush();
    const double t0 = sg4::Engine::get_clock();
    const double blocks = ops[i].overlap_splits - 1;
    run_now(remote.time_s * (blocks - 1) / blocks);
    wait_handle(rs, ops[i]);
    run_now(remote.time_s / blocks);
    record(rs, TraceStream::compute, remote, "compute", t0);
    rs.stats.compute_s += remote.time_s;
    return j;
  };
  auto is_ring_wait = [&](size_t i) {
    if (ops[i].type != OpType::wait || ops[i].overlap_splits <= 2) return false;
    const size_t j = i + 1 < ops.size() && ops[i + 1].type == OpType::issue ? i + 2 : i + 1;
    return is_gemm(j);
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (op.host_sync) {  // the host reads a result of the GPU work so far (Op::host_sync)
      flush();
      host = std::max(host, sg4::Engine::get_clock());
    }
    dispatched(op);
    if (is_ring_wait(i)) {
      i = ring_blocks(i);
      continue;
    }
    if (op.type == OpType::collective && op.overlap_splits > 1 && op.collective == Collective::AllGather &&
        is_gemm(i + 1)) {
      dispatched(ops[i + 1]);
      ring_exchange(op, ops[i + 1]);
      ++i;
      continue;
    }
    if (op.type == OpType::compute && i + 1 < ops.size() && ops[i + 1].type == OpType::collective &&
        ops[i + 1].overlap_splits > 1 && ops[i + 1].collective == Collective::ReduceScatter) {
      dispatched(ops[i + 1]);
      pipelined_reduce_scatter(op, ops[i + 1]);
      ++i;
      continue;
    }
    switch (op.type) {
      case OpType::compute:
        if (opts_.trace) {
          flush();
          const double t0 = sg4::Engine::get_clock();
          pending = op.time_s;
          flush();
          record(rs, TraceStream::compute, op, "compute", t0);
        } else {
          pending += op.time_s;
        }
        rs.stats.compute_s += op.time_s;
        if (op.phase == Phase::optimizer) rs.stats.optimizer_s += op.time_s;
        break;
      case OpType::collective:
        if (pending > 0 && can_defer(rs, op)) {
          const double deferred = pending;
          pending = 0;
          blocking_collective(rs, op, deferred);
        } else {
          flush();
          blocking_collective(rs, op);
        }
        break;
      case OpType::issue:
        flush();
        issue(rs, op);
        break;
      case OpType::wait:
        flush();
        wait_handle(rs, op);
        if (op.host_sync) host = std::max(host, sg4::Engine::get_clock());  // a stream synchronize (Op::host_sync)
        break;
      case OpType::send:
        flush();
        send(rs, op);
        break;
      case OpType::recv:
        flush();
        recv(rs, op);
        break;
    }
  }
  flush();
  rs.stats.finish_s = sg4::Engine::get_clock();
  rs.finished = true;
  // PP total, sends' part (recv() adds the receives'): each transfer from its posting to
  // the bytes being usable at the receiver (flow end + alpha), the same window the
  // receiver counts: a message counts once at each end, as a collective counts on every
  // member. Exposed send time (a blocking send's wait) lies inside it.
  const size_t first = rs.send_info.size() - rs.sends.size();
  for (size_t i = 0; i < rs.sends.size(); ++i) {
    rs.sends[i]->wait();
    rs.send_info[first + i].ready = rs.sends[i]->get_finish_time() + rs.send_info[first + i].alpha;
  }
  rs.sends.clear();
  for (const auto& info : rs.send_info) {
    rs.stats.comm[static_cast<int>(CommKind::PP)].total_s += info.ready - info.posted_at;
    record(rs, TraceStream::pp, *info.op, "PP", info.posted_at, nullptr, info.ready, /*async=*/true);
  }
  rs.send_info.clear();
}

StepResult Simulation::run() {
  const auto wall0 = std::chrono::steady_clock::now();
  xbt_log_control_set("root.thres:critical");
  int argc = 1;
  char arg0[] = "dtsim";
  char* argv[] = {arg0, nullptr};
  sg4::Engine engine(&argc, argv);
  StepResult res;
  for (const auto* flags : {&simgrid_engine::model_flags(), &simgrid_engine::context_flags()})
    for (const auto& [k, v] : *flags) {
      sg4::Engine::set_config(k + ":" + v);
      res.engine_config[k] = v;
    }
  res.engine_config["link_latency_s"] = "1e-09";
  simgrid_engine::prepare_actor_stacks();
  platform_ = build_platform(plan_.exp.cluster);
  simgrid_engine::start_flow_proxy(platform_);
  fold_.fold = opts_.fold;
  overlap_speed_ = comm_overlap_speed(plan_.exp.cluster.gpu, plan_.exp.training.comm_interference);
  res.engine_config["comm_overlap_compute_speed"] = fmt_number(overlap_speed_);

  const auto& l = plan_.exp.layout;
  const int64_t world = grid_.world();
  for (int64_t r = 0; r < world; ++r) {
    if (!simulated(r)) continue;
    auto rs = std::make_unique<RankState>();
    rs->rank = r;
    rs->stage = grid_.coord_of(r).pp;
    rs->plan = &plan_.stages[static_cast<size_t>(rs->stage)];
    rs->host = platform_.hosts[static_cast<size_t>(r)];
    rs->done.assign(static_cast<size_t>(rs->plan->handles), 0);
    rs->issued_at.assign(static_cast<size_t>(rs->plan->handles), 0.0);
    if (opts_.trace)
      opts_.trace->processes.push_back({r, rs->stage, opts_.fold ? stage_size_ : 1});
    ranks_.push_back(std::move(rs));
  }
  const auto chunks = static_cast<int32_t>(
      sched::schedule_of(plan_.exp.layout.schedule).chunks(sched::dims_of(plan_.exp.layout, plan_.exp.training, plan_.shape.micro_batches)));
  for (auto& rsp : ranks_) {
    RankState& rs = *rsp;
    rs.handle_done = sg4::Semaphore::create(0);
    rs.rate_change = sg4::Semaphore::create(0);
    rs.collective = sg4::Semaphore::create(0);
    // Eager P2P: the receiver's mailboxes accept data as soon as it is sent.
    rs.compute_actor =
        sg4::Actor::create("rank" + std::to_string(rs.rank), rs.host, errors_.guard([this, &rs] { compute_actor(rs); }));
    for (int32_t c = 0; c < chunks; ++c) {
      mailbox(rs.rank, Direction::forward, c)->set_receiver(rs.compute_actor);
      mailbox(rs.rank, Direction::backward, c)->set_receiver(rs.compute_actor);
    }
  }
  engine.run();
  messages_.clear();  // their CommPtrs must not outlive the engine
  errors_.rethrow();  // an exception inside an actor ended the run (ActorErrors)
  // SimGrid returns when no activity can progress; a rank still inside its plan then
  // waits forever (a plan whose sends, receives or collectives do not match): an engine
  // or plan bug, never a result.
  for (const auto& rs : ranks_)
    if (!rs->finished)
      throw std::logic_error("simulation deadlocked: rank " + std::to_string(rs->rank) + " (stage " +
                             std::to_string(rs->stage) + ") never finished its step plan");

  // ---- collect ----
  const auto& e = plan_.exp;
  res.experiment = e.title;
  res.engine = "simgrid";
  res.folded = opts_.fold;
  res.gpus = e.cluster.gpus();
  res.simulated_ranks = static_cast<int64_t>(ranks_.size());
  res.time_sources = time_source_counts(plan_);
  for (auto& rs : ranks_) res.step_time_s = std::max(res.step_time_s, rs->stats.finish_s);
  const double tokens = static_cast<double>(e.training.global_batch * e.training.seq_len);
  res.tokens_per_step = tokens;
  res.tokens_per_s = res.step_time_s > 0 ? tokens / res.step_time_s : 0;
  res.model_flops = model_flops_per_step(e.model, e.training.global_batch, e.training.seq_len);
  res.hardware_flops = hardware_flops_per_step(e.model, e.training.global_batch, e.training.seq_len, l.recompute);
  const double gpus = static_cast<double>(res.gpus);
  const double peak = mfu_peak_flops(e.cluster.gpu, e.training);
  if (res.step_time_s > 0) {
    res.tflops_per_gpu = res.model_flops / res.step_time_s / gpus / 1e12;
    res.hardware_tflops_per_gpu = res.hardware_flops / res.step_time_s / gpus / 1e12;
    res.mfu = res.model_flops / (res.step_time_s * gpus * peak);
    res.hfu = res.hardware_flops / (res.step_time_s * gpus * peak);
  }
  const char* names[kCommKinds] = {"TP", "CP", "PP", "DP", "EP"};
  for (int64_t s = 0; s < l.pp; ++s) {
    StageResult sr;
    sr.stage = static_cast<int>(s);
    sr.layers = plan_.stages[static_cast<size_t>(s)].layers;
    int count = 0;
    Stats sum;
    for (auto& rs : ranks_) {
      if (rs->stage != s) continue;
      ++count;
      sum.compute_s += rs->stats.compute_s;
      sum.bubble_s += rs->stats.bubble_s;
      sum.finish_s = std::max(sum.finish_s, rs->stats.finish_s);
      sum.optimizer_s += rs->stats.optimizer_s;
      sum.slowdown_s += rs->stats.slowdown_s;
      sum.host_bound_s += rs->stats.host_bound_s;
      for (int k = 0; k < kCommKinds; ++k) {
        sum.comm[k].total_s += rs->stats.comm[k].total_s;
        sum.comm[k].exposed_s += rs->stats.comm[k].exposed_s;
        sum.comm[k].bytes += rs->stats.comm[k].bytes;
        sum.comm[k].operations += rs->stats.comm[k].operations;
      }
    }
    const double inv = count > 0 ? 1.0 / count : 0.0;
    sr.compute_s = sum.compute_s * inv;
    // Pipeline bubble: waiting on the schedule (a recv before its data was sent, a
    // collective before its other members arrived) plus the idle tail after the stage's
    // own last operation until the step ends (a last stage finishes while gradients drain
    // towards the first): (p-1)(t_f+t_b) per stage in 1F1B. With compute, slowdown and
    // exposed communication it makes up the step (models/result.hpp CommStats).
    sr.bubble_s = sum.bubble_s * inv + (res.step_time_s - sum.finish_s);
    sr.finish_s = sum.finish_s;
    sr.slowdown_s = sum.slowdown_s * inv;
    sr.host_bound_s = sum.host_bound_s * inv;
    for (int k = 0; k < kCommKinds; ++k) {
      CommStats cs;
      cs.total_s = sum.comm[k].total_s * inv;
      cs.exposed_s = sum.comm[k].exposed_s * inv;
      cs.bytes = sum.comm[k].bytes * inv;
      cs.operations = count > 0 ? sum.comm[k].operations / count : 0.0;
      sr.comm[names[k]] = cs;
    }
    sr.memory = stage_memory(e, s);
    res.compute_s += sr.compute_s / static_cast<double>(l.pp);
    res.bubble_s += sr.bubble_s / static_cast<double>(l.pp);
    res.host_bound_s += sr.host_bound_s / static_cast<double>(l.pp);
    res.optimizer_s = std::max(res.optimizer_s, sum.optimizer_s * inv);
    for (int k = 0; k < kCommKinds; ++k) {
      auto& tot = res.comm[names[k]];
      tot.total_s += sr.comm[names[k]].total_s / static_cast<double>(l.pp);
      tot.exposed_s += sr.comm[names[k]].exposed_s / static_cast<double>(l.pp);
      tot.bytes += sr.comm[names[k]].bytes / static_cast<double>(l.pp);
      tot.operations += sr.comm[names[k]].operations / static_cast<double>(l.pp);
    }
    res.stages.push_back(std::move(sr));
  }
  res.wall_clock_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return res;
}

}  // namespace

EngineBudget engine_budget(const Experiment& exp, const EngineOptions& opts) {
  const Layout& l = exp.layout;
  const int64_t per_stage = opts.fold ? 1 : checked::product({l.dp, l.tp, l.cp}).value_or(INT64_MAX);
  const int64_t ops = plan_op_bound(exp);
  EngineBudget b;
  b.simulated_ranks = checked::mul(per_stage, l.pp).value_or(INT64_MAX);
  b.simulated_ops = checked::mul(per_stage, ops).value_or(INT64_MAX);
  const auto plan_bytes = checked::mul(ops, int64_t{150}).value_or(INT64_MAX);
  const auto rank_bytes = checked::mul(b.simulated_ranks, limits::kEngineBytesPerRank).value_or(INT64_MAX);
  b.memory_bytes = plan_bytes > INT64_MAX - rank_bytes ? INT64_MAX : plan_bytes + rank_bytes;
  return b;
}

void check_engine_limits(const Experiment& exp, const EngineOptions& opts, const std::string& where,
                         int64_t physical_bytes) {
  const EngineBudget b = engine_budget(exp, opts);
  const std::string how = opts.fold ? "the folded engine simulates one rank per stage"
                                    : "--no-fold simulates every rank: layout.dp x tp x cp = " +
                                          checked::with_commas(b.simulated_ranks / exp.layout.pp) + " ranks per stage";
  const std::string hint = opts.fold ? "" : "; run without --no-fold (one rank per stage)";
  if (b.simulated_ranks > limits::kMaxSimulatedRanks)
    throw InputError(where + ": " + how + " x layout.pp " + std::to_string(exp.layout.pp) + " = " +
                     checked::with_commas(b.simulated_ranks) + " simulated ranks, above the " +
                     checked::with_commas(limits::kMaxSimulatedRanks) + "-rank limit (" +
                     limits::kMaxSimulatedRanksWhy + ")" + hint);
  if (b.simulated_ops > limits::kMaxSimulatedOps)
    throw InputError(where + ": " + how + " x up to " + checked::with_commas(plan_op_bound(exp)) +
                     " plan operations = " + checked::with_commas(b.simulated_ops) + " rank-operations, above the " +
                     checked::with_commas(limits::kMaxSimulatedOps) + "-operation limit (" +
                     limits::kMaxSimulatedOpsWhy + ")" + hint);
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (physical_bytes > 0 || (pages > 0 && page > 0)) {
    const int64_t phys = physical_bytes > 0 ? physical_bytes : checked::mul(pages, page).value_or(INT64_MAX);
    if (b.memory_bytes > phys)
      throw InputError(where + ": " + how + ", " + checked::with_commas(b.simulated_ranks) +
                       " simulated ranks need about " + checked::with_commas(b.memory_bytes >> 20) +
                       " MiB (" + checked::with_commas(limits::kEngineBytesPerRank >> 10) +
                       " KiB per rank plus 150 B per plan operation), above this machine's " +
                       checked::with_commas(phys >> 20) + " MiB of physical memory" + hint);
  }
}

StepResult simulate_step(const Experiment& exp, const EngineOptions& opts) {
  check_engine_limits(exp, opts, exp.title.empty() ? "experiment" : "experiment \"" + exp.title + "\"");
  const StepPlan plan = build_step_plan(exp);
  Simulation sim(plan, opts);
  StepResult r = sim.run();
  // The kernel-time band (models/time_band.hpp): the closed form's ratios, not two more
  // simulations; counted in the host time reported.
  const auto wall0 = std::chrono::steady_clock::now();
  add_kernel_band(exp, r);
  r.wall_clock_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return r;
}

StepResult simulate_step_isolated(const Experiment& exp, const EngineOptions& opts) {
  // Validate and plan in the parent so input errors surface as InputError here.
  (void)build_step_plan(exp);
  const std::string text =
      run_in_child([&] { return result_json_text(simulate_step(exp, opts)); }, "simulate_step_isolated");
  return result_from_json_text(text);
}

void simulate_steps_isolated(size_t count, int jobs, const std::function<Experiment(size_t)>& experiment,
                             const std::function<void(size_t, StepResult&&, std::exception_ptr)>& done,
                             const EngineOptions& opts) {
  run_in_children(
      count, jobs,
      [&](size_t i) -> std::function<std::string()> {
        Experiment e = experiment(i);
        (void)build_step_plan(e);  // input errors surface here, as in simulate_step_isolated
        return [e = std::move(e), &opts] { return result_json_text(simulate_step(e, opts)); };
      },
      [&](size_t i, ChildResult&& r) {
        StepResult res;
        std::exception_ptr err = r.error;
        if (!err) {
          try {
            res = result_from_json_text(r.text);
          } catch (...) {
            err = std::current_exception();
          }
        }
        done(i, std::move(res), err);
      },
      "simulate_step_isolated");
}

}  // namespace dtsim
