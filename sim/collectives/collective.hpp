#pragma once
// Collective algorithms as cost models and traffic plans (no SimGrid here).
//
// An algorithm (one file each in sim/collectives/, listed in registry.cpp) states for a group
// of GPUs, an operation and a size:
//   - whether it can run it (`unsupported` returns why not),
//   - its closed-form alpha-beta time alone on a non-blocking fabric (`closed_form`), which the
//     tuner compares across algorithms and protocols as NCCL's tuner does, and
//   - the traffic to simulate (`plan`): phases, each with the intra-node (NVLink) part in
//     closed form and the inter-node part as flows between GPUs, which sim/collective_exec.cpp
//     puts on the SimGrid links so that concurrent collectives share NICs and switch links.
// tests/unit/test_collectives.cpp checks, for every registered algorithm, that simulating its
// plan alone reproduces its closed form.
//
// Sizes follow nccl-tests (doc/PERFORMANCE.md): `bytes` is the full buffer for AllReduce,
// Broadcast and Reduce; the input (n x output) for ReduceScatter; the output (n x input) for
// AllGather; the per-rank send buffer (n chunks) for AllToAll; the message for SendRecv.
// Times are seconds, bandwidths B/s per direction.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "models/experiment.hpp"
#include "models/plan.hpp"

namespace dtsim::collectives {

enum class CollOp { AllReduce, ReduceScatter, AllGather, Broadcast, Reduce, AllToAll, SendRecv };
/// "AllReduce", "ReduceScatter", ...
const char* to_string(CollOp);
/// nccl-tests names: allreduce, reducescatter, allgather, broadcast, reduce, alltoall, sendrecv
/// (case-insensitive; "_" and "-" ignored, so all_reduce works too).
std::optional<CollOp> parse_op(std::string_view);
/// The names parse_op accepts, joined by ", ".
std::string op_list();
CollOp to_op(Collective c);
/// Whether the operation reduces (prints a redop in nccl-tests tables).
bool reduces(CollOp);

/// NCCL protocols (NVIDIA/nccl src/include/device.h): LL (8-byte lines, 4-byte flag), LL128
/// (128-byte lines, 120 bytes of payload), Simple (bulk copies with memory fences).
enum class Protocol { LL, LL128, Simple };
const char* to_string(Protocol);  // "LL", "LL128", "Simple"
std::optional<Protocol> parse_protocol(std::string_view);  // ll, ll128, simple (case-insensitive)

/// nccl-tests bus-bandwidth factor: busbw = algbw * factor (doc/PERFORMANCE.md;
/// nccl_busbw.csv): AllReduce 2(n-1)/n; ReduceScatter, AllGather, AllToAll (n-1)/n;
/// Broadcast, Reduce, SendRecv 1.
double busbw_factor(CollOp op, int64_t n);

/// Link figures of a cluster as the cost models use them.
///
/// xgmi mesh (cluster.intra_node = xgmi-mesh, AMD Instinct nodes): nvlink_bw is the rate of ONE
/// peer link and a GPU's intra-node traffic is bounded by the links it uses. RCCL runs its
/// rings on such a node over several GPU permutations that together use every directed link
/// equally: ROCm/rccl src/graph/rome_models.cc @0cbce2a7, rome_model_79 (8 fully connected
/// GPUs, nLinks 7, no NICs) lists 14 rings, 7 Hamiltonian cycles that cover each of the 56
/// directed links exactly once plus their 7 reverses, each twice (28 channels); rome_model_81
/// (the same mesh with 8 NICs) lists 8 node-crossing chains N_i i ... N_j whose 56 intra-node
/// hops again cover every directed link once (parseGraph turns each into a channel). A ring's
/// per-member edge volume E is thus split evenly over the k-1 links among the k members of a
/// node, every link carrying E/(k-1): the ring runs at (k-1) x nvlink_bw per GPU (intra_bw).
/// The same holds for groups of k < 8 members (every Hamiltonian cycle of the k members with
/// its reverse, in equal shares, loads each directed link equally); RCCL's README ("Improving
/// performance on MI300 when using less than 8 GPUs": "only a fraction of the potential
/// bandwidth") and its 32 / 24 channels for 2 / 4 GPUs agree that fewer members reach fewer
/// links. An AllToAll or any traffic a GPU spreads evenly over its peers uses its k-1 links at
/// once: the same (k-1) x nvlink_bw; a transfer between two GPUs uses their one link (k = 2).
/// Assumption: concurrent intra-node collectives on a mesh are not contended (as on NVSwitch:
/// the intra-node part stays closed form, sim/collective_exec.hpp).
struct CommModel {
  double nvlink_bw = 0;       // per GPU and direction (NVSwitch) or per peer link (xgmi mesh), NCCL Ring/Simple rate (line x efficiency)
  double nvls_bw = 0;         // per GPU and direction under NVLS (line x nvls_efficiency); 0 = none
  double net_bw = 0;          // per NIC and direction, NCCL rate (line x efficiency)
  double nvlink_latency = 0;  // per ring step on NVLink, Simple protocol (cluster.nvlink.latency)
  double net_latency = 0;     // per ring step across nodes, Simple (cluster.nic.latency)
  /// xgmi mesh: nvlink_bw is per peer link (above).
  bool mesh = false;
  /// Whether the LL128 protocol runs. Off on an xgmi mesh: RCCL's tuning model for MI300X
  /// nodes (ROCm/rccl src/graph/tuning.cc @0cbce2a7 tuning_model_5, which rome_model_79's
  /// options "tuning=5" select) has bwRatio 0 for LL128, so its tuner never picks it.
  bool ll128 = true;
  /// Per GPU and direction, the intra-node rate of traffic a GPU spreads evenly over the other
  /// members of its node when `k` members of the group sit on that node (rings, chains,
  /// AllToAll, forwarding): nvlink_bw on an NVSwitch (one port per GPU), (k-1) nvlink_bw on an
  /// xgmi mesh (k-1 links, above). k = 2 is one GPU pair. B/s.
  double intra_bw(int64_t k) const {
    return mesh ? static_cast<double>(k > 1 ? k - 1 : 1) * nvlink_bw : nvlink_bw;
  }
  static CommModel of(const ClusterSpec& c);
};

/// How the tokens of an MoE expert-parallel exchange are routed (GroupLayout::routing): each
/// token goes to `topk` of `experts` experts, spread evenly over the group's members in
/// member order; with `groups` > 0 the experts form that many equal groups (consecutive
/// members) and a token reaches experts of at most `group_topk` of them (group-limited /
/// node-limited routing, DeepSeek-V3 report arXiv 2412.19437 Sec 2.1.2; Megatron-Core
/// --moe-router-num-groups / --moe-router-group-topk). Read by the algorithms that send a
/// token once per node or rank it reaches (deepep); topk 0: not an expert exchange.
struct TokenRouting {
  int64_t topk = 0;
  int64_t experts = 0;
  int64_t groups = 0;
  int64_t group_topk = 0;
  bool operator==(const TokenRouting&) const = default;
};

/// Where a group's members sit. Members are GPUs (= global ranks), ascending; the ring order.
struct GroupLayout {
  std::vector<int64_t> members;
  int64_t gpus_per_node = 1;
  int64_t gpus_per_nic = 1;
  /// Members per node, nodes in ascending order.
  std::vector<std::vector<int64_t>> nodes;
  /// The routing of the tokens an EP AllToAll exchanges (topk 0 for every other group).
  TokenRouting routing;

  static GroupLayout of(std::vector<int64_t> members, int64_t gpus_per_node, int64_t gpus_per_nic);
  /// GPUs 0..n-1.
  static GroupLayout first(int64_t n, int64_t gpus_per_node, int64_t gpus_per_nic);
  int64_t n() const { return static_cast<int64_t>(members.size()); }
  int64_t node_count() const { return static_cast<int64_t>(nodes.size()); }
  /// Every node holds the same number of members.
  bool uniform() const;
  /// Members per node (uniform groups; otherwise the largest count).
  int64_t per_node() const;
  int64_t nic_of(int64_t gpu) const { return gpu / gpus_per_nic; }  // global NIC index
  /// Largest number of this group's members sharing one NIC.
  int64_t max_members_per_nic() const;
};

/// The token routing of `e`'s EP AllToAlls (model.moe router_topk, num_experts,
/// router_num_groups, router_group_topk); all zero without MoE.
TokenRouting ep_token_routing(const Experiment& e);
/// The algorithm of `e`'s EP AllToAlls as training.moe_token_dispatcher names it: deepep for
/// `deepep` and `hybridep` (forced: an InputError where it cannot run), nullopt for
/// `alltoall` (Megatron-Core's AllToAll dispatcher: NCCL, cluster.collectives' choice).
std::optional<CollectiveChoice> ep_alltoall_choice(const Experiment& e);

/// Expected reach of one token under the deepep algorithm (sim/collectives/alltoall_deepep.cpp,
/// its header gives the formulas): over an EP group of `members` ranks on `nodes` nodes,
/// remote nodes it crosses the network to, and members other than the sender it reaches
/// (one NVLink delivery each). Dimensionless expectations.
struct DeepEpFanout {
  double remote_nodes = 0;
  double other_members = 0;
};
DeepEpFanout deepep_fanout(int64_t members, int64_t nodes, const TokenRouting& routing);

/// A transfer between two GPUs on different nodes, simulated as one flow on the route
/// between their NICs.
struct Flow {
  int64_t src = 0, dst = 0;
  double bytes = 0;
};

/// One phase of an algorithm. Alone, it takes max(intra_s, floor_s, flow time) + latency_s:
/// the intra-node traffic (closed form, NVLink) runs alongside the flows.
struct Phase {
  double intra_s = 0;        // closed-form time of the NVLink traffic
  double floor_s = 0;        // protocol throughput limit (LL's cap), closed form
  std::vector<Flow> flows;   // inter-node traffic
  double latency_s = 0;      // alpha terms, after the bandwidth part
};

struct TrafficPlan {
  std::vector<Phase> phases;
};

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  /// Registry name (cluster.collectives.algorithm, dtsim collective --algo).
  virtual std::string_view name() const = 0;
  virtual std::string_view summary() const = 0;
  /// Whether NCCL's tuner would consider it (the auto choice); others run only when named.
  virtual bool tuner_candidate() const = 0;
  virtual std::vector<Protocol> protocols() const = 0;
  /// Empty when it can run `op` on `g` under `m`; otherwise the reason (one sentence).
  virtual std::string unsupported(CollOp op, const GroupLayout& g, const CommModel& m) const = 0;
  /// Closed-form (alpha-beta) time, alone on a non-blocking fabric. Needs unsupported()
  /// empty and `p` among protocols().
  virtual double closed_form(CollOp op, const GroupLayout& g, const CommModel& m, double bytes, Protocol p) const = 0;
  /// The time NCCL's tuner predicts, which decides the automatic choice (tuner.hpp). Equal
  /// to closed_form unless NCCL's model differs from the traffic dtsim simulates (tree).
  virtual double tuner_time(CollOp op, const GroupLayout& g, const CommModel& m, double bytes, Protocol p) const {
    return closed_form(op, g, m, bytes, p);
  }
  /// The traffic to simulate; same preconditions.
  virtual TrafficPlan plan(CollOp op, const GroupLayout& g, const CommModel& m, double bytes, Protocol p) const = 0;
};

}  // namespace dtsim::collectives
