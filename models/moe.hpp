#pragma once
// Token counts of a mixture-of-experts layer on one rank: the one place that the MoE block's
// ops (models/blocks/moe.cpp), the activation memory (models/memory.cpp), explain and the
// engines read them from.
//
// Megatron-Core's MoE layer (megatron/core/transformer/moe/moe_layer.py MoELayer.forward;
// token_dispatcher.py MoEAlltoAllTokenDispatcher) on a rank of a layout with expert
// parallelism ep and expert tensor parallelism etp (parallel folding, models/rank_grid.hpp):
//   1. the router scores the rank's T tokens (T = b s / t with sequence parallelism, else b s;
//      s = seq / cp) against the E experts and keeps the top k per token;
//   2. permute: the T k (token, expert) copies are sorted by expert;
//   3. dispatch: an AllToAll over the EP group sends each copy to the rank holding its expert
//      (a permutation of rows: nothing is summed);
//   4. with etp > 1 an AllGather over the ETP group gives every ETP rank all of its ETP
//      group's tokens (each holds 1/etp of every local expert's columns);
//   5. the E / ep local experts run as grouped GEMMs on the tokens they received;
//   6. with etp > 1 a ReduceScatter over ETP sums the row-parallel partial outputs;
//   7. combine: the inverse AllToAll returns each copy to its token's rank;
//   8. unpermute: each token's k expert outputs are weighted by its router probabilities and
//      summed there, on the token's own rank.
//
// Load: with balanced routing each EP rank receives T k copies. The busiest rank receives
// `load` x that (moe_load_factor); it sets the time of the grouped GEMMs and of the AllToAll
// (every rank of the EP group waits for the slowest), so the same factor grows the pipeline
// bubble. A capacity factor caps it (tokens beyond capacity are dropped; with padding every
// expert computes exactly its capacity).
#include <cstdint>

#include "models/experiment.hpp"

namespace dtsim {

/// Documented defaults of the busiest EP rank's load (max / mean tokens) for trained routers,
/// from the largest expert load violation MaxVio = max_i load_i / mean load - 1 that Wang et
/// al. 2024 ("Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts", arXiv
/// 2408.15664, Table 1, MaxVio_global of the 1B models) measured: 0.72 with an auxiliary
/// balance loss (Loss-Controlled), 0.04 with the auxiliary-loss-free bias (Loss-Free).
inline constexpr double kMaxVioAuxLoss = 0.72;
inline constexpr double kMaxVioAuxFree = 0.04;

/// Max / mean tokens of the busiest EP rank (>= 1) before any capacity cap:
///  - forced: 1 (Megatron-Core --moe-router-force-load-balancing assigns tokens round robin);
///  - measured: model.moe.load_imbalance;
///  - aux_loss / aux_free: 1 + MaxVio / g, g = E / ep experts per rank: the rank holding the
///    most loaded expert (at 1 + MaxVio) with its other g - 1 experts at the mean. An
///    assumption, stated: experts' loads on one rank are not correlated.
double moe_router_load(const MoeSpec& moe, const Layout& l);

/// The factor the busiest rank's expert work is timed at: moe_router_load capped by the
/// capacity factor (token drop), or exactly the capacity factor with pad_to_capacity
/// (Megatron-Core --moe-pad-expert-input-to-capacity). Dropless (capacity_factor 0): uncapped.
double moe_load_factor(const MoeSpec& moe, const Layout& l);

/// Per-rank token counts of one MoE layer for one micro-batch of b sequences.
struct MoeTokens {
  double tokens = 0;      // T: tokens entering the router on this rank
  double routed = 0;      // T k: (token, expert) copies this rank dispatches
  double received = 0;    // copies the busiest EP rank receives: T k load
  double computed = 0;    // rows its local experts compute: received x etp (after the ETP gather)
  double local_experts = 0;  // E / ep
  double load = 1;        // moe_load_factor
};
/// Throws nothing; for a dense model (num_experts 0) all zero.
MoeTokens moe_tokens(const Experiment& e, double micro_batch);

/// Bytes per element of the dispatched tokens: 1 (FP8, plus one fp32 scale per 128
/// elements: 1 + 4/128) when the GEMMs run in FP8 and the dispatcher quantises before
/// sending (DeepEP: "FP8 dispatch, BF16 combine", deepseek-ai/DeepEP README; DeepSeek-V3
/// report Sec 3.3.2), else 2 (bf16). The combine and every backward AllToAll carry bf16.
double moe_dispatch_bytes_per_element(const Training& t);

}  // namespace dtsim
