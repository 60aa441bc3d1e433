// Rank placement on the TP x CP x DP x PP grid (TP innermost), as Megatron-LM's default
// order; see models/rank_grid.hpp.
#include "models/rank_grid.hpp"

#include <algorithm>
#include <set>
#include <sstream>

#include "models/errors.hpp"

namespace dtsim {

const char* to_string(GroupKind k) {
  switch (k) {
    case GroupKind::TP: return "TP";
    case GroupKind::CP: return "CP";
    case GroupKind::DP: return "DP";
    case GroupKind::PP: return "PP";
    case GroupKind::DPxCP: return "DPxCP";
    case GroupKind::EMB: return "EMB";
    case GroupKind::MIRROR: return "MIRROR";
    case GroupKind::EP: return "EP";
    case GroupKind::ETP: return "ETP";
    case GroupKind::EDP: return "EDP";
  }
  return "?";
}

RankGrid::RankGrid(const Layout& layout) : l_(layout) {
  if (l_.dp < 1 || l_.tp < 1 || l_.cp < 1 || l_.pp < 1)
    throw InputError("layout: dp=" + std::to_string(l_.dp) + " tp=" + std::to_string(l_.tp) +
                     " cp=" + std::to_string(l_.cp) + " pp=" + std::to_string(l_.pp) +
                     " must all be >= 1");
}

int64_t RankGrid::rank_of(const RankCoord& c) const {
  if (c.tp < 0 || c.tp >= l_.tp || c.cp < 0 || c.cp >= l_.cp || c.dp < 0 || c.dp >= l_.dp ||
      c.pp < 0 || c.pp >= l_.pp)
    throw InputError("rank coordinate (tp=" + std::to_string(c.tp) + ", cp=" + std::to_string(c.cp) +
                     ", dp=" + std::to_string(c.dp) + ", pp=" + std::to_string(c.pp) +
                     ") is outside the grid");
  return c.tp + l_.tp * (c.cp + l_.cp * (c.dp + l_.dp * c.pp));
}

RankCoord RankGrid::coord_of(int64_t rank) const {
  if (rank < 0 || rank >= world())
    throw InputError("rank " + std::to_string(rank) + " is outside [0, " + std::to_string(world()) + ")");
  RankCoord c;
  c.tp = rank % l_.tp;
  rank /= l_.tp;
  c.cp = rank % l_.cp;
  rank /= l_.cp;
  c.dp = rank % l_.dp;
  c.pp = rank / l_.dp;
  return c;
}

ExpertCoord RankGrid::expert_coord_of(int64_t rank) const {
  const RankCoord c = coord_of(rank);
  const int64_t etp = l_.expert_tp(), ep = l_.ep;
  int64_t i = c.tp + l_.tp * (c.cp + l_.cp * c.dp);  // index inside the stage
  ExpertCoord e;
  e.pp = c.pp;
  e.etp = i % etp;
  i /= etp;
  e.ep = i % ep;
  e.edp = i / ep;
  return e;
}

std::string expert_layout_problem(const Layout& l, int64_t num_experts) {
  const std::string eps = "layout.ep=" + std::to_string(l.ep);
  if (l.ep < 1) return eps + " must be >= 1";
  if (l.etp < 0) return "layout.etp=" + std::to_string(l.etp) + " must be >= 1 (or left out: = tp)";
  if (num_experts <= 0) {
    if (l.ep != 1) return eps + " needs a mixture-of-experts model (model.moe.num_experts > 0)";
    if (l.etp > 0 && l.etp != l.tp)
      return "layout.etp=" + std::to_string(l.etp) + " needs a mixture-of-experts model (model.moe.num_experts > 0)";
    return "";
  }
  const int64_t etp = l.expert_tp();
  if (num_experts % l.ep != 0)
    return eps + " must divide model.moe.num_experts=" + std::to_string(num_experts) + " (each EP rank holds E / ep experts)";
  // 128-bit products: the layout's sizes are not bounded yet when this runs (fuzzed inputs).
  const __int128 stage128 = static_cast<__int128>(l.tp) * l.cp * l.dp, experts128 = static_cast<__int128>(etp) * l.ep;
  if (experts128 <= 0 || stage128 <= 0) return "";  // tp, cp, dp <= 0: reported by their own checks
  if (experts128 > stage128 || stage128 % experts128 != 0)
    return "layout.etp x layout.ep = " + std::to_string(etp) + " x " + std::to_string(l.ep) +
           " must divide the ranks of a pipeline stage, tp x cp x dp = " +
           std::to_string(l.tp) + " x " + std::to_string(l.cp) + " x " + std::to_string(l.dp) +
           " (Megatron-Core parallel folding)";
  return "";
}

std::vector<int64_t> RankGrid::group_of(int64_t rank, GroupKind kind) const {
  const RankCoord base = coord_of(rank);
  std::vector<int64_t> out;
  if (kind == GroupKind::EP || kind == GroupKind::ETP || kind == GroupKind::EDP) {
    const ExpertCoord e = expert_coord_of(rank);
    const int64_t etp = l_.expert_tp(), ep = l_.ep, edp = l_.edp();
    const int64_t stage0 = base.pp * l_.tp * l_.cp * l_.dp;
    auto at = [&](int64_t a, int64_t b, int64_t c) { return stage0 + a + etp * (b + ep * c); };
    if (kind == GroupKind::ETP)
      for (int64_t i = 0; i < etp; ++i) out.push_back(at(i, e.ep, e.edp));
    else if (kind == GroupKind::EP)
      for (int64_t i = 0; i < ep; ++i) out.push_back(at(e.etp, i, e.edp));
    else
      for (int64_t i = 0; i < edp; ++i) out.push_back(at(e.etp, e.ep, i));
    return out;
  }
  switch (kind) {
    case GroupKind::TP:
      for (int64_t i = 0; i < l_.tp; ++i) { RankCoord c = base; c.tp = i; out.push_back(rank_of(c)); }
      break;
    case GroupKind::CP:
      for (int64_t i = 0; i < l_.cp; ++i) { RankCoord c = base; c.cp = i; out.push_back(rank_of(c)); }
      break;
    case GroupKind::DP:
      for (int64_t i = 0; i < l_.dp; ++i) { RankCoord c = base; c.dp = i; out.push_back(rank_of(c)); }
      break;
    case GroupKind::PP:
      for (int64_t i = 0; i < l_.pp; ++i) { RankCoord c = base; c.pp = i; out.push_back(rank_of(c)); }
      break;
    case GroupKind::DPxCP:
      // CP is inside DP in the rank order, so iterating dp outer / cp inner is ascending.
      for (int64_t i = 0; i < l_.dp; ++i)
        for (int64_t j = 0; j < l_.cp; ++j) {
          RankCoord c = base;
          c.dp = i;
          c.cp = j;
          out.push_back(rank_of(c));
        }
      break;
    case GroupKind::MIRROR: {
      RankCoord other = base;
      other.pp = l_.pp - 1 - base.pp;
      if (other.pp == base.pp) out = {rank};
      else out = base.pp < other.pp ? std::vector<int64_t>{rank, rank_of(other)} : std::vector<int64_t>{rank_of(other), rank};
      break;
    }
    case GroupKind::EMB: {
      if (l_.pp > 1 && (base.pp == 0 || base.pp == l_.pp - 1)) {
        RankCoord first = base, last = base;
        first.pp = 0;
        last.pp = l_.pp - 1;
        out = {rank_of(first), rank_of(last)};
      } else {
        out = {rank};
      }
      break;
    }
    case GroupKind::EP:
    case GroupKind::ETP:
    case GroupKind::EDP: break;  // above
  }
  return out;
}

std::vector<std::vector<int64_t>> RankGrid::groups(GroupKind kind) const {
  std::vector<std::vector<int64_t>> out;
  std::vector<bool> seen(static_cast<size_t>(world()), false);
  for (int64_t r = 0; r < world(); ++r) {
    if (seen[static_cast<size_t>(r)]) continue;
    auto g = group_of(r, kind);
    for (int64_t x : g) seen[static_cast<size_t>(x)] = true;
    out.push_back(std::move(g));  // r is the smallest unseen rank, so sorted by first rank
  }
  return out;
}

std::vector<GroupPlacement> group_placement(const RankGrid& grid, int64_t gpus_per_node) {
  if (gpus_per_node < 1)
    throw InputError("cluster.gpus_per_node=" + std::to_string(gpus_per_node) + " must be >= 1");
  std::vector<GroupKind> kinds = {GroupKind::TP, GroupKind::CP, GroupKind::DP, GroupKind::PP};
  const bool experts = grid.layout().ep > 1 || grid.layout().expert_tp() != grid.layout().tp;
  if (experts) kinds.insert(kinds.end(), {GroupKind::EP, GroupKind::ETP});
  std::vector<GroupPlacement> out;
  for (GroupKind k : kinds) {
    const auto gs = grid.groups(k);
    if (gs.empty() || gs.front().size() <= 1) continue;
    GroupPlacement p{k, static_cast<int64_t>(gs.front().size()), 1};
    for (const auto& g : gs) {
      std::set<int64_t> nodes;
      for (int64_t r : g) nodes.insert(r / gpus_per_node);
      p.domains = std::max(p.domains, static_cast<int64_t>(nodes.size()));
    }
    out.push_back(p);
  }
  return out;
}

std::string describe_placement(const std::vector<GroupPlacement>& placement) {
  std::string out;
  for (const auto& p : placement) {
    out += (out.empty() ? "" : "; ") + std::string(to_string(p.kind)) + " " + std::to_string(p.size) +
           (p.domains == 1 ? std::string(" inside one NVLink domain")
                           : " across " + std::to_string(p.domains) + " NVLink domains (over the fabric)");
  }
  return out;
}

std::string describe_groups(const RankGrid& grid, int64_t gpus_per_node) {
  if (gpus_per_node < 1)
    throw InputError("cluster.gpus_per_node=" + std::to_string(gpus_per_node) + " must be >= 1");
  std::vector<GroupKind> kinds = {GroupKind::TP, GroupKind::CP, GroupKind::DP, GroupKind::PP};
  if (grid.layout().cp > 1) kinds.push_back(GroupKind::DPxCP);  // equals DP when cp == 1
  // Expert groups (parallel folding) where the layout has experts spread or sharded.
  const bool experts = grid.layout().ep > 1 || grid.layout().expert_tp() != grid.layout().tp;
  if (experts) kinds.insert(kinds.end(), {GroupKind::EP, GroupKind::ETP, GroupKind::EDP});
  std::ostringstream os;
  // At most this many groups per kind are listed; the rest are counted (a 16K-GPU layout
  // has thousands of groups, all alike).
  constexpr size_t kMaxListed = 16;
  for (GroupKind k : kinds) {
    const auto gs = grid.groups(k);
    if (!gs.empty() && gs.front().size() == 1) {
      os << to_string(k) << " groups: none (size 1)\n";
      continue;
    }
    for (size_t i = 0; i < gs.size(); ++i) {
      if (i == kMaxListed) {
        os << to_string(k) << " groups " << i << ".." << gs.size() - 1 << ": " << gs.size() - i
           << " more of " << gs.front().size() << " ranks each\n";
        break;
      }
      os << to_string(k) << " group " << i << ": ranks [";
      std::set<int64_t> nodes;
      for (size_t j = 0; j < gs[i].size(); ++j) {
        if (j) os << ", ";
        os << gs[i][j];
        nodes.insert(gs[i][j] / gpus_per_node);
      }
      os << "] (" << (nodes.size() == 1 ? "node " : "nodes ");
      bool first = true;
      for (int64_t n : nodes) {
        if (!first) os << ", ";
        os << n;
        first = false;
      }
      os << ")\n";
    }
  }
  return os.str();
}

}  // namespace dtsim
