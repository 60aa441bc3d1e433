// Rank placement, MATH.md section 5 and section 6 item 6 (design/MATH.md):
//  - TP=2, DP=2 on 4 GPUs: TP groups [0,1], [2,3]; DP groups [0,2], [1,3].
//  - 8 GPUs with TP=2, CP=2, DP=2: TP x CP = 4 GPUs form one model replica.
// Order (Megatron-LM default, innermost first): TP, CP, DP, PP.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "models/errors.hpp"
#include "models/rank_grid.hpp"

namespace dtsim {
namespace {

using Groups = std::vector<std::vector<int64_t>>;

Layout layout(int64_t dp, int64_t tp, int64_t cp, int64_t pp) {
  Layout l;
  l.dp = dp;
  l.tp = tp;
  l.cp = cp;
  l.pp = pp;
  return l;
}

TEST(RankGridMath, Tp2Dp2On4Gpus) {
  const RankGrid g(layout(2, 2, 1, 1));
  EXPECT_EQ(g.world(), 4);
  EXPECT_EQ(g.groups(GroupKind::TP), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(g.groups(GroupKind::DP), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(g.groups(GroupKind::PP), (Groups{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(g.groups(GroupKind::DPxCP), g.groups(GroupKind::DP));
  EXPECT_EQ(g.group_of(3, GroupKind::TP), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(g.group_of(3, GroupKind::DP), (std::vector<int64_t>{1, 3}));
}

TEST(RankGridMath, Tp2Cp2Dp2On8GpusReplicaIsTpTimesCp) {
  const RankGrid g(layout(2, 2, 2, 1));
  EXPECT_EQ(g.world(), 8);
  EXPECT_EQ(g.groups(GroupKind::TP), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.groups(GroupKind::CP), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(g.groups(GroupKind::DP), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  // Gradient-reduction group: ranks holding the same weight shard (same TP rank).
  EXPECT_EQ(g.groups(GroupKind::DPxCP), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  // One model replica = the ranks with the same DP coordinate: TP x CP = 4 GPUs.
  std::set<int64_t> replica0, replica1;
  for (int64_t r = 0; r < g.world(); ++r) (g.coord_of(r).dp == 0 ? replica0 : replica1).insert(r);
  EXPECT_EQ(replica0, (std::set<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(replica1, (std::set<int64_t>{4, 5, 6, 7}));
}

TEST(RankGridMath, PipelineGroupsAreOutermost) {
  const RankGrid g(layout(2, 2, 1, 2));  // 8 ranks
  EXPECT_EQ(g.groups(GroupKind::PP), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(g.groups(GroupKind::DP), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  const RankCoord c = g.coord_of(6);
  EXPECT_EQ(c.tp, 0);
  EXPECT_EQ(c.cp, 0);
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(c.pp, 1);
}

TEST(RankGridMath, CoordinatesRoundTrip) {
  const RankGrid g(layout(3, 2, 2, 2));
  for (int64_t r = 0; r < g.world(); ++r) EXPECT_EQ(g.rank_of(g.coord_of(r)), r);
  // rank = tp + TP*(cp + CP*(dp + DP*pp))
  EXPECT_EQ(g.rank_of(RankCoord{1, 1, 2, 1}), 1 + 2 * (1 + 2 * (2 + 3 * 1)));
  // Every kind partitions the world.
  for (GroupKind k : {GroupKind::TP, GroupKind::CP, GroupKind::DP, GroupKind::PP, GroupKind::DPxCP}) {
    std::set<int64_t> all;
    for (const auto& grp : g.groups(k)) all.insert(grp.begin(), grp.end());
    EXPECT_EQ(int64_t(all.size()), g.world()) << to_string(k);
  }
}

TEST(RankGridMath, DescribeGroups) {
  const RankGrid g(layout(2, 2, 1, 1));
  const std::string text = describe_groups(g, 2);  // 2 GPUs per node
  EXPECT_NE(text.find("TP group 0: ranks [0, 1] (node 0)\n"), std::string::npos) << text;
  EXPECT_NE(text.find("TP group 1: ranks [2, 3] (node 1)\n"), std::string::npos) << text;
  EXPECT_NE(text.find("DP group 0: ranks [0, 2] (nodes 0, 1)\n"), std::string::npos) << text;
  EXPECT_NE(text.find("PP groups: none (size 1)\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("DPxCP"), std::string::npos);  // same as DP when cp == 1
  const RankGrid g2(layout(2, 2, 2, 1));
  EXPECT_NE(describe_groups(g2, 8).find("DPxCP group 1: ranks [1, 3, 5, 7] (node 0)\n"), std::string::npos);
  EXPECT_EQ(std::string(to_string(GroupKind::DPxCP)), "DPxCP");
}

TEST(RankGridMath, InvalidInputThrows) {
  EXPECT_THROW(RankGrid(layout(0, 1, 1, 1)), InputError);
  const RankGrid g(layout(2, 2, 1, 1));
  EXPECT_THROW(g.coord_of(4), InputError);
  EXPECT_THROW(g.rank_of(RankCoord{2, 0, 0, 0}), InputError);
  EXPECT_THROW(describe_groups(g, 0), InputError);
}

}  // namespace
}  // namespace dtsim
