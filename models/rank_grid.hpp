#pragma once
// Placement of global ranks on the DP x TP x CP x PP grid.
// Order (Megatron-LM's default, innermost first): TP, CP, DP, PP, i.e.
//   rank = tp_rank + TP * (cp_rank + CP * (dp_rank + DP * pp_rank)).
// Global rank r runs on GPU r: node r / gpus_per_node, local index r % gpus_per_node.
#include <cstdint>
#include <string>
#include <vector>

#include "models/experiment.hpp"

namespace dtsim {

/// EMB: Megatron's embedding group, the ranks of the first and the last pipeline stage
/// with the same TP/CP/DP coordinates, which all-reduce the gradient of a tied word
/// embedding (each holds a copy); a rank of a middle stage forms a group of its own.
/// MIRROR: pipeline ranks r and pp - 1 - r with the same TP/CP/DP coordinates, which under
/// DualPipe hold the same stages' parameters (each a copy) and sum their gradients
/// (DeepSeek-V3 report Sec 3.2.1: "DualPipe requires keeping two copies of the model
/// parameters"); with pp == 1 (or the middle rank of an odd pp) a rank is its own group.
/// EP, ETP, EDP: the expert groups of Megatron-Core's parallel folding (Liu et al. 2025,
/// "MoE Parallel Folding", arXiv 2504.14960 Sec 3; megatron/core/parallel_state.py
/// initialize_model_parallel builds expert groups with a second RankGenerator of order
/// "tp-ep-dp-pp" over the same ranks): inside one pipeline stage the tp x cp x dp ranks,
/// numbered i = tp + TP (cp + CP dp), are numbered again as
///   i = etp + ETP (ep + EP edp),
/// so ETP is innermost, then EP, then the expert-data-parallel index. EP: the ranks that
/// exchange tokens (dispatch / combine AllToAll) and hold different experts; ETP: the ranks
/// splitting one expert's GEMMs; EDP: the ranks holding the same experts, which average
/// expert gradients (the expert counterpart of DPxCP).
enum class GroupKind { TP, CP, DP, PP, DPxCP, EMB, MIRROR, EP, ETP, EDP };
const char* to_string(GroupKind);

struct RankCoord {
  int64_t tp = 0, cp = 0, dp = 0, pp = 0;
};

/// A rank's place in the expert grid of its stage (GroupKind EP comment).
struct ExpertCoord {
  int64_t etp = 0, ep = 0, edp = 0, pp = 0;
};

class RankGrid {
 public:
  explicit RankGrid(const Layout& layout);
  int64_t world() const { return l_.dp * l_.tp * l_.cp * l_.pp; }
  int64_t rank_of(const RankCoord& c) const;
  RankCoord coord_of(int64_t rank) const;
  ExpertCoord expert_coord_of(int64_t rank) const;
  /// Ranks sharing every coordinate with `rank` except `kind`'s, in ascending order.
  /// DPxCP is the gradient-reduction group (ranks holding the same weights).
  std::vector<int64_t> group_of(int64_t rank, GroupKind kind) const;
  /// Every distinct group of a kind, each in ascending rank order, sorted by first rank.
  std::vector<std::vector<int64_t>> groups(GroupKind kind) const;
  const Layout& layout() const { return l_; }

 private:
  Layout l_;
};

/// Empty when the layout's expert grid folds onto its ranks: etp x ep divides tp x cp x dp
/// (Megatron-Core parallel_state.py: "decoder_world_size ... must be divisible by
/// expert_tensor_model_pipeline_parallel_size"), ep divides the routed experts; otherwise the
/// violated constraint, naming the layout keys. `num_experts` 0: a dense model, where ep and
/// etp must stay at their defaults.
std::string expert_layout_problem(const Layout& l, int64_t num_experts);

/// Where the groups of one kind sit: `domains` is the most NVLink domains (nodes of
/// gpus_per_node GPUs; an NVL72 rack is one) that any group of the kind spans; 1 = every group
/// stays inside one domain, on NVLink; more = the group crosses the NICs and cluster.fabric.
struct GroupPlacement {
  GroupKind kind = GroupKind::TP;
  int64_t size = 0;     // ranks per group
  int64_t domains = 1;  // most NVLink domains one group spans
};

/// The placement of every TP, CP, DP and PP group with more than one rank, and of the EP and
/// ETP groups where the layout has experts spread or sharded (parallel folding). Throws
/// InputError when gpus_per_node < 1.
std::vector<GroupPlacement> group_placement(const RankGrid& grid, int64_t gpus_per_node);

/// One line for the run summary, e.g. "TP 8 inside one NVLink domain; DP 32 across 4 NVLink
/// domains (over the fabric)"; "" when no group has more than one rank.
std::string describe_placement(const std::vector<GroupPlacement>& placement);

/// Human-readable listing of every TP, CP, DP and PP group (for `dtsim run --show-groups`).
std::string describe_groups(const RankGrid& grid, int64_t gpus_per_node);

}  // namespace dtsim
