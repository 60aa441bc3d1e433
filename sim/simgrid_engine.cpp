// The SimGrid (S4U) engine: executes a StepPlan with a compute stream and communication
// streams per rank, collectives as flows over NVLink and NIC links.
//
// Platform (non-blocking fabric): every GPU is a host with an NVLink up and down link
// into its node's NVSwitch; every NIC has an up and down link into the fabric. A route
// inside a node is [nvlink_up(src), nvlink_down(dst)]; between nodes
// [nic_up(nic(src)), nic_down(nic(dst))]. Routes are computed from host indices by a
// flat custom zone (../shared/design/SIMGRID.md: per-GPU NICs cannot be expressed with
// zone gateways; nested zones are slow at 16K GPUs).
//
// Network model: CM02 without cross-traffic, TCP-gamma out of the way, bandwidth and
// latency factors 1, so a flow of S bytes alone on a link of bandwidth B takes S/B.
// Links carry a tiny uniform latency (1 ns) so that CM02's RTT-weighted sharing is fair
// between flows; collective latency terms (steps x alpha) are added as sleeps
// (SIMGRID.md, "Model flags").
//
// Collectives: NCCL's ring algorithm as one bulk flow per ring edge carrying the edge
// volume (2(n-1)/n S for AllReduce, (n-1)/n S for ReduceScatter/AllGather), then
// steps x alpha of latency. Exact against the alpha-beta ring formula without contention
// and within 0.25% of per-message simulation under contention (SIMGRID.md, "Speed").
#include <simgrid/kernel/routing/NetPoint.hpp>
#include <simgrid/kernel/routing/NetZoneImpl.hpp>
#include <simgrid/s4u.hpp>
#include <xbt/log.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "models/errors.hpp"
#include "models/memory.hpp"
#include "models/flops.hpp"
#include "models/plan.hpp"
#include "models/rank_grid.hpp"
#include "reports/json.hpp"
#include "reports/json_read.hpp"
#include "sim/engine.hpp"

namespace sg4 = simgrid::s4u;
namespace sgk = simgrid::kernel;

namespace dtsim {
namespace {

constexpr double kLinkLatency = 1e-9;  // uniform, for fair CM02 sharing (see header)

/// Flat zone: routes from host indices (GPU g is host g, NetPoint id g).
class GpuZone : public sgk::routing::NetZoneImpl {
 public:
  GpuZone(const std::string& name, int64_t gpus_per_node, int64_t gpus_per_nic)
      : NetZoneImpl(name), gpn_(gpus_per_node), gpus_per_nic_(gpus_per_nic) {}
  std::vector<sgk::resource::StandardLinkImpl*> nv_up, nv_down, nic_up, nic_down;

  void get_local_route(const sgk::routing::NetPoint* src, const sgk::routing::NetPoint* dst,
                       sgk::routing::Route* into, double* latency) override {
    const auto s = static_cast<int64_t>(src->id()), d = static_cast<int64_t>(dst->id());
    if (s == d) return;
    if (s / gpn_ == d / gpn_) {
      into->link_list_.push_back(nv_up[s]);
      into->link_list_.push_back(nv_down[d]);
    } else {
      into->link_list_.push_back(nic_up[s / gpus_per_nic_]);
      into->link_list_.push_back(nic_down[d / gpus_per_nic_]);
    }
    if (latency) *latency += 2 * kLinkLatency;
  }

 private:
  int64_t gpn_, gpus_per_nic_;
};

struct Stats {
  double compute_s = 0, bubble_s = 0, finish_s = 0, optimizer_s = 0;
  std::array<CommStats, kCommKinds> comm{};
};

struct RankState;

struct QueuedOp {
  const Op* op;
  int64_t seq;
};

// Blocking uses semaphores, never Actor::suspend(): suspending an actor also suspends
// its in-flight activities, including detached P2P sends it posted.
struct Stream {
  std::deque<QueuedOp> queue;
  sg4::ActorPtr actor;
  sg4::SemaphorePtr queued;     // one token per queued op
  sg4::SemaphorePtr collective;  // released when a collective it waits in completes
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
  sg4::SemaphorePtr collective;   // released when a collective it waits in completes
  std::array<Stream, kCommKinds> streams;
  std::map<std::pair<int, int64_t>, int64_t> group_seq;  // (GroupKind, group id) -> next seq
  Stats stats;
};

struct Message {
  double posted_at = 0;
  double transfer_s = 0;
};

struct Instance {
  int arrived = 0;
  std::vector<sg4::SemaphorePtr> waiters;
};

struct GroupState {
  std::vector<int64_t> members;        // ascending global ranks (ring order)
  std::vector<int64_t> present;        // members simulated by an actor
  bool intra_node = true;
  std::unordered_map<int64_t, Instance> instances;  // seq -> in-progress instance
};

class Simulation {
 public:
  Simulation(const StepPlan& plan, const EngineOptions& opts) : plan_(plan), grid_(plan.exp.layout), opts_(opts) {
    const auto& c = plan.exp.cluster;
    gpn_ = c.gpus_per_node;
    gpus_per_nic_ = std::max<int64_t>(1, c.gpus_per_node / std::max<int64_t>(1, c.nics_per_node));
    const auto& l = plan.exp.layout;
    stage_size_ = l.tp * l.cp * l.dp;
  }

  StepResult run();

 private:
  void build_platform(sg4::Engine& e);
  bool simulated(int64_t rank) const { return !opts_.fold || rank % stage_size_ == 0; }
  GroupState& group(GroupKind kind, int64_t rank, int64_t* gid);
  void run_collective(RankState& rs, const Op& op, int64_t seq, const sg4::SemaphorePtr& wake);
  void execute_flows(const GroupState& g, const Op& op);
  int64_t next_seq(RankState& rs, GroupKind kind, int64_t rank);
  void compute_actor(RankState& rs);
  void stream_actor(RankState& rs, int kind);
  void issue(RankState& rs, const Op& op);
  void wait_handle(RankState& rs, const Op& op);
  void send(RankState& rs, const Op& op);
  void recv(RankState& rs, const Op& op);
  int64_t pp_peer(int64_t rank, Direction dir, bool sending) const;
  sg4::Mailbox* mailbox(int64_t rank, Direction dir) const;
  double flow_bytes(int64_t src, int64_t dst, double bytes) const {
    const bool inter = src / gpn_ != dst / gpn_;
    return inter && opts_.fold ? bytes * static_cast<double>(gpus_per_nic_) : bytes;
  }

  const StepPlan& plan_;
  RankGrid grid_;
  EngineOptions opts_;
  int64_t gpn_ = 8, gpus_per_nic_ = 1, stage_size_ = 1;
  std::vector<sg4::Host*> hosts_;
  std::vector<std::unique_ptr<RankState>> ranks_;  // simulated ranks
  std::map<std::pair<int, int64_t>, GroupState> groups_;
  std::vector<std::unique_ptr<Message>> messages_;
};

void Simulation::build_platform(sg4::Engine& e) {
  (void)e;
  const auto& c = plan_.exp.cluster;
  const int64_t gpus = c.gpus();
  auto* zone = new GpuZone("cluster", gpn_, gpus_per_nic_);
  zone->set_parent(nullptr);
  const double nv_bw = c.nvlink.bandwidth * c.nvlink.efficiency;
  const double nic_bw = c.nic.bandwidth * c.nic.efficiency;
  // Host speed is unused (GPU kernels are timed by the cost model and run as sleeps).
  for (int64_t g = 0; g < gpus; ++g) {
    hosts_.push_back(zone->create_host("gpu" + std::to_string(g), {1e9}));
    auto* up = zone->create_link("nvup" + std::to_string(g), {nv_bw});
    up->set_latency(kLinkLatency);
    up->seal();
    auto* down = zone->create_link("nvdown" + std::to_string(g), {nv_bw});
    down->set_latency(kLinkLatency);
    down->seal();
    zone->nv_up.push_back(up->get_impl());
    zone->nv_down.push_back(down->get_impl());
  }
  const int64_t nics = (gpus + gpus_per_nic_ - 1) / gpus_per_nic_;
  for (int64_t n = 0; n < nics; ++n) {
    auto* up = zone->create_link("nicup" + std::to_string(n), {nic_bw});
    up->set_latency(kLinkLatency);
    up->seal();
    auto* down = zone->create_link("nicdown" + std::to_string(n), {nic_bw});
    down->set_latency(kLinkLatency);
    down->seal();
    zone->nic_up.push_back(up->get_impl());
    zone->nic_down.push_back(down->get_impl());
  }
  zone->seal();
}

GroupState& Simulation::group(GroupKind kind, int64_t rank, int64_t* gid) {
  auto members = grid_.group_of(rank, kind);
  const int64_t id = members.front();
  if (gid) *gid = id;
  auto key = std::make_pair(static_cast<int>(kind), id);
  auto it = groups_.find(key);
  if (it != groups_.end()) return it->second;
  GroupState g;
  g.members = std::move(members);
  for (int64_t m : g.members) {
    if (simulated(m)) g.present.push_back(m);
    if (m / gpn_ != g.members.front() / gpn_) g.intra_node = false;
  }
  return groups_.emplace(key, std::move(g)).first->second;
}

int64_t Simulation::next_seq(RankState& rs, GroupKind kind, int64_t rank) {
  int64_t gid = 0;
  group(kind, rank, &gid);
  return rs.group_seq[{static_cast<int>(kind), gid}]++;
}

void Simulation::execute_flows(const GroupState& g, const Op& op) {
  const int64_t n = static_cast<int64_t>(g.members.size());
  const RingCost rc = ring_cost(op.collective, n, op.size_bytes);
  if (rc.edge_bytes > 0) {
    std::vector<sg4::CommPtr> comms;
    auto launch = [&](size_t i) {
      const int64_t src = g.members[i], dst = g.members[(i + 1) % g.members.size()];
      comms.push_back(sg4::Comm::sendto_async(hosts_[src], hosts_[dst],
                                              static_cast<uint64_t>(flow_bytes(src, dst, rc.edge_bytes))));
    };
    if (!opts_.fold) {
      // Unfolded: every member drives its own edge.
      for (size_t i = 0; i < g.members.size(); ++i) launch(i);
    } else if (g.intra_node) {
      // Symmetric NVSwitch ring: every edge is alike; one stands for all.
      launch(0);
    } else {
      // Mixed or inter-node ring: every edge of the representative's group.
      for (size_t i = 0; i < g.members.size(); ++i) launch(i);
    }
    sg4::Comm::wait_all(comms);
  }
  const auto& c = plan_.exp.cluster;
  const double alpha = g.intra_node ? c.nvlink.latency : std::max(c.nvlink.latency, c.nic.latency);
  if (rc.steps > 0) sg4::this_actor::sleep_for(static_cast<double>(rc.steps) * alpha);
}

void Simulation::run_collective(RankState& rs, const Op& op, int64_t seq, const sg4::SemaphorePtr& wake) {
  int64_t gid = 0;
  GroupState& g = group(op.group, rs.rank, &gid);
  Instance& inst = g.instances[seq];
  inst.arrived++;
  if (inst.arrived < static_cast<int>(g.present.size())) {
    inst.waiters.push_back(wake);
    wake->acquire();
    return;
  }
  std::vector<sg4::SemaphorePtr> waiters = std::move(inst.waiters);
  g.instances.erase(seq);
  execute_flows(g, op);
  for (auto& w : waiters) w->release();
}

void Simulation::issue(RankState& rs, const Op& op) {
  const int k = static_cast<int>(op.kind);
  Stream& st = rs.streams[k];
  st.queue.push_back({&op, next_seq(rs, op.group, rs.rank)});
  rs.issued_at[op.handle] = sg4::Engine::get_clock();
  if (!st.actor) {
    st.queued = sg4::Semaphore::create(0);
    st.collective = sg4::Semaphore::create(0);
    st.actor = sg4::Actor::create("stream" + std::to_string(k) + "_" + std::to_string(rs.rank), rs.host,
                                  [this, &rs, k] { stream_actor(rs, k); });
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
    run_collective(rs, *q.op, q.seq, st.collective);
    auto& cs = rs.stats.comm[kind];
    cs.total_s += sg4::Engine::get_clock() - t0;
    cs.bytes += ring_cost(q.op->collective, static_cast<int64_t>(grid_.group_of(rs.rank, q.op->group).size()),
                          q.op->size_bytes).edge_bytes;
    cs.operations++;
    rs.done[q.op->handle] = 1;
    if (rs.waiting_handle == q.op->handle) {
      rs.waiting_handle = -1;
      rs.handle_done->release();
    }
  }
}

void Simulation::wait_handle(RankState& rs, const Op& op) {
  if (rs.done[op.handle]) return;
  const double t0 = sg4::Engine::get_clock();
  rs.waiting_handle = op.handle;
  rs.handle_done->acquire();
  rs.stats.comm[static_cast<int>(op.kind)].exposed_s += sg4::Engine::get_clock() - t0;
}

int64_t Simulation::pp_peer(int64_t rank, Direction dir, bool sending) const {
  // Forward activations go to the next stage; gradients to the previous one.
  const bool to_next = (dir == Direction::forward) == sending;
  return to_next ? rank + stage_size_ : rank - stage_size_;
}

sg4::Mailbox* Simulation::mailbox(int64_t rank, Direction dir) const {
  return sg4::Mailbox::by_name((dir == Direction::forward ? "f" : "b") + std::to_string(rank));
}

void Simulation::send(RankState& rs, const Op& op) {
  const int64_t dst = pp_peer(rs.rank, op.dir, true);
  messages_.push_back(std::make_unique<Message>());
  Message* msg = messages_.back().get();
  msg->posted_at = sg4::Engine::get_clock();
  auto* mb = mailbox(dst, op.dir);
  mb->put_init(msg, static_cast<uint64_t>(flow_bytes(rs.rank, dst, op.size_bytes)))->detach();
  auto& cs = rs.stats.comm[static_cast<int>(CommKind::PP)];
  cs.bytes += op.size_bytes;
  cs.operations++;
}

void Simulation::recv(RankState& rs, const Op& op) {
  const double t0 = sg4::Engine::get_clock();
  auto* mb = mailbox(rs.rank, op.dir);
  auto* msg = mb->get<Message>();
  // P2P latency (alpha) on top of the bandwidth term carried by the flow: when the rank
  // waited for the bytes it also waits alpha; when they were already there, it waits
  // only for what is left of alpha since the send was posted.
  const int64_t src = pp_peer(rs.rank, op.dir, false);
  const auto& cl = plan_.exp.cluster;
  const double alpha = src / gpn_ == rs.rank / gpn_ ? cl.nvlink.latency : std::max(cl.nvlink.latency, cl.nic.latency);
  const double arrived = sg4::Engine::get_clock();
  const double extra = arrived > t0 ? alpha : std::max(0.0, msg->posted_at + alpha - t0);
  if (extra > 0) sg4::this_actor::sleep_for(extra);
  const double t1 = sg4::Engine::get_clock();
  // The transfer started when the sender posted it (eager: the receiver's mailbox has a
  // permanent receiver, as Megatron pre-posts its irecv). Waiting before that is bubble;
  // waiting while the bytes were in flight is exposed PP communication.
  const double start = std::max(t0, msg->posted_at);
  auto& cs = rs.stats.comm[static_cast<int>(CommKind::PP)];
  cs.exposed_s += t1 - start;
  cs.total_s += t1 - msg->posted_at;
  rs.stats.bubble_s += start - t0;
}

void Simulation::compute_actor(RankState& rs) {
  const auto& ops = rs.plan->ops;
  double pending = 0;  // consecutive compute time folded into one sleep
  auto flush = [&] {
    if (pending > 0) sg4::this_actor::sleep_for(pending);
    pending = 0;
  };
  for (const Op& op : ops) {
    switch (op.type) {
      case OpType::compute:
        pending += op.time_s;
        rs.stats.compute_s += op.time_s;
        if (op.phase == Phase::optimizer) rs.stats.optimizer_s += op.time_s;
        break;
      case OpType::collective: {
        flush();
        const int64_t seq = next_seq(rs, op.group, rs.rank);
        const double t0 = sg4::Engine::get_clock();
        run_collective(rs, op, seq, rs.collective);
        const double dt = sg4::Engine::get_clock() - t0;
        auto& cs = rs.stats.comm[static_cast<int>(op.kind)];
        cs.total_s += dt;
        cs.exposed_s += dt;
        cs.bytes += ring_cost(op.collective, static_cast<int64_t>(grid_.group_of(rs.rank, op.group).size()),
                              op.size_bytes).edge_bytes;
        cs.operations++;
        break;
      }
      case OpType::issue:
        flush();
        issue(rs, op);
        break;
      case OpType::wait:
        flush();
        wait_handle(rs, op);
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
}

StepResult Simulation::run() {
  const auto wall0 = std::chrono::steady_clock::now();
  xbt_log_control_set("root.thres:critical");
  int argc = 1;
  char arg0[] = "dtsim";
  char* argv[] = {arg0, nullptr};
  sg4::Engine engine(&argc, argv);
  const std::vector<std::pair<std::string, std::string>> flags = {
      {"network/model", "CM02"},
      {"network/crosstraffic", "0"},
      {"network/TCP-gamma", "1e15"},
      {"network/bandwidth-factor", "1.0"},
      {"network/latency-factor", "1.0"},
      {"network/weight-S", "0"},
      {"maxmin/precision", "1e-9"},
  };
  StepResult res;
  for (const auto& [k, v] : flags) {
    sg4::Engine::set_config(k + ":" + v);
    res.engine_config[k] = v;
  }
  res.engine_config["link_latency_s"] = "1e-09";
  build_platform(engine);

  const auto& l = plan_.exp.layout;
  const int64_t world = grid_.world();
  for (int64_t r = 0; r < world; ++r) {
    if (!simulated(r)) continue;
    auto rs = std::make_unique<RankState>();
    rs->rank = r;
    rs->stage = grid_.coord_of(r).pp;
    rs->plan = &plan_.stages[static_cast<size_t>(rs->stage)];
    rs->host = hosts_[static_cast<size_t>(r)];
    rs->done.assign(static_cast<size_t>(rs->plan->handles), 0);
    rs->issued_at.assign(static_cast<size_t>(rs->plan->handles), 0.0);
    ranks_.push_back(std::move(rs));
  }
  for (auto& rsp : ranks_) {
    RankState& rs = *rsp;
    rs.handle_done = sg4::Semaphore::create(0);
    rs.collective = sg4::Semaphore::create(0);
    // Eager P2P: the receiver's mailboxes accept data as soon as it is sent.
    rs.compute_actor = sg4::Actor::create("rank" + std::to_string(rs.rank), rs.host, [this, &rs] { compute_actor(rs); });
    mailbox(rs.rank, Direction::forward)->set_receiver(rs.compute_actor);
    mailbox(rs.rank, Direction::backward)->set_receiver(rs.compute_actor);
  }
  engine.run();

  // ---- collect ----
  const auto& e = plan_.exp;
  res.experiment = e.title;
  res.engine = "simgrid";
  res.folded = opts_.fold;
  res.gpus = e.cluster.gpus();
  res.simulated_ranks = static_cast<int64_t>(ranks_.size());
  for (auto& rs : ranks_) res.step_time_s = std::max(res.step_time_s, rs->stats.finish_s);
  const double tokens = static_cast<double>(e.training.global_batch * e.training.seq_len);
  res.tokens_per_step = tokens;
  res.tokens_per_s = res.step_time_s > 0 ? tokens / res.step_time_s : 0;
  res.model_flops = model_flops_per_step(e.model, e.training.global_batch, e.training.seq_len);
  res.hardware_flops = hardware_flops_per_step(e.model, e.training.global_batch, e.training.seq_len, l.recompute);
  const double gpus = static_cast<double>(res.gpus);
  const double peak = e.training.dtype == Dtype::fp8 && e.cluster.gpu.peak_fp8_flops > 0 ? e.cluster.gpu.peak_fp8_flops
                                                                                        : e.cluster.gpu.peak_bf16_flops;
  if (res.step_time_s > 0) {
    res.tflops_per_gpu = res.model_flops / res.step_time_s / gpus / 1e12;
    res.hardware_tflops_per_gpu = res.hardware_flops / res.step_time_s / gpus / 1e12;
    res.mfu = res.model_flops / (res.step_time_s * gpus * peak);
    res.hfu = res.hardware_flops / (res.step_time_s * gpus * peak);
  }
  const char* names[kCommKinds] = {"TP", "CP", "PP", "DP"};
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
      for (int k = 0; k < kCommKinds; ++k) {
        sum.comm[k].total_s += rs->stats.comm[k].total_s;
        sum.comm[k].exposed_s += rs->stats.comm[k].exposed_s;
        sum.comm[k].bytes += rs->stats.comm[k].bytes;
        sum.comm[k].operations += rs->stats.comm[k].operations;
      }
    }
    const double inv = count > 0 ? 1.0 / count : 0.0;
    sr.compute_s = sum.compute_s * inv;
    // Pipeline bubble: waiting on the schedule (a recv before its data was sent) plus the
    // idle tail after the stage's own last operation until the step ends (a last stage
    // finishes while gradients drain towards the first): (p-1)(t_f+t_b) per stage in 1F1B.
    sr.bubble_s = sum.bubble_s * inv + (res.step_time_s - sum.finish_s);
    sr.finish_s = sum.finish_s;
    for (int k = 0; k < kCommKinds; ++k) {
      CommStats cs;
      cs.total_s = sum.comm[k].total_s * inv;
      cs.exposed_s = sum.comm[k].exposed_s * inv;
      cs.bytes = sum.comm[k].bytes * inv;
      cs.operations = count > 0 ? sum.comm[k].operations / count : 0;
      sr.comm[names[k]] = cs;
    }
    sr.memory = stage_memory(e, s);
    res.compute_s += sr.compute_s / static_cast<double>(l.pp);
    res.bubble_s += sr.bubble_s / static_cast<double>(l.pp);
    res.optimizer_s = std::max(res.optimizer_s, sum.optimizer_s * inv);
    for (int k = 0; k < kCommKinds; ++k) {
      auto& tot = res.comm[names[k]];
      tot.total_s += sr.comm[names[k]].total_s / static_cast<double>(l.pp);
      tot.exposed_s += sr.comm[names[k]].exposed_s / static_cast<double>(l.pp);
      tot.bytes += sr.comm[names[k]].bytes / static_cast<double>(l.pp);
      tot.operations += sr.comm[names[k]].operations / l.pp;
    }
    res.stages.push_back(std::move(sr));
  }
  res.wall_clock_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return res;
}

}  // namespace

StepResult simulate_step(const Experiment& exp, const EngineOptions& opts) {
  const StepPlan plan = build_step_plan(exp);
  Simulation sim(plan, opts);
  return sim.run();
}

StepResult simulate_step_isolated(const Experiment& exp, const EngineOptions& opts) {
  // Validate and plan in the parent so input errors surface as InputError here.
  (void)build_step_plan(exp);
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("simulate_step_isolated: pipe() failed");
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("simulate_step_isolated: fork() failed");
  if (pid == 0) {
    close(fds[0]);
    int code = 0;
    std::string text;
    try {
      text = result_json_text(simulate_step(exp, opts));
    } catch (const std::exception& ex) {
      text = std::string("!") + ex.what();
      code = 1;
    }
    size_t off = 0;
    while (off < text.size()) {
      const ssize_t w = write(fds[1], text.data() + off, text.size() - off);
      if (w <= 0) break;
      off += static_cast<size_t>(w);
    }
    close(fds[1]);
    _exit(code);
  }
  close(fds[1]);
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t r = read(fds[0], buf, sizeof buf);
    if (r <= 0) break;
    text.append(buf, static_cast<size_t>(r));
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || text.empty() || text[0] == '!')
    throw std::runtime_error("simulation child failed: " + (text.empty() ? std::string("no output") : text.substr(1)));
  return result_from_json_text(text);
}

}  // namespace dtsim
