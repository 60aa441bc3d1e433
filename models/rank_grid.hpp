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
enum class GroupKind { TP, CP, DP, PP, DPxCP, EMB };
const char* to_string(GroupKind);

struct RankCoord {
  int64_t tp = 0, cp = 0, dp = 0, pp = 0;
};

class RankGrid {
 public:
  explicit RankGrid(const Layout& layout);
  int64_t world() const { return l_.dp * l_.tp * l_.cp * l_.pp; }
  int64_t rank_of(const RankCoord& c) const;
  RankCoord coord_of(int64_t rank) const;
  /// Ranks sharing every coordinate with `rank` except `kind`'s, in ascending order.
  /// DPxCP is the gradient-reduction group (ranks holding the same weights).
  std::vector<int64_t> group_of(int64_t rank, GroupKind kind) const;
  /// Every distinct group of a kind, each in ascending rank order, sorted by first rank.
  std::vector<std::vector<int64_t>> groups(GroupKind kind) const;
  const Layout& layout() const { return l_; }

 private:
  Layout l_;
};

/// Human-readable listing of every TP, CP, DP and PP group (for `dtsim run --show-groups`).
std::string describe_groups(const RankGrid& grid, int64_t gpus_per_node);

}  // namespace dtsim
