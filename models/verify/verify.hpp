#pragma once
// `dtsim verify`: executes the simulator's step plan (models/plan.hpp, build_step_plan)
// on small real tensors and checks that every rank ends with the loss, gradients and
// parameters one device would compute (design/MATH.md sections 1-3).
//
// What runs: the experiment's layout (dp, tp, cp, pp, zero_stage, sequence_parallel,
// recompute, flash_attention, ...) with the model shrunk (models/verify/tiny_model.hpp),
// in double precision, on a fixed-seed batch whose sequences hold unequal numbers of valid
// tokens. Every rank's tensors live in this process (pipeline stages on several threads,
// the single-device reference on one of its own; the report does not depend on the thread
// count: VerifyOptions::threads). The plan of each pipeline stage is
// walked op by op for every rank of the stage (executed lane by lane: the DP replicas of
// one stage, TP and CP coordinate stacked, with the arithmetic of rank-by-rank execution;
// models/verify/interpreter.cpp): compute ops by their name (a stable op
// identity: "qkv", "attention_remote", "mlp_down_wgrad", ...), collectives as the op says
// (Op::collective, Op::reduce SUM/AVG, Op::group resolved with RankGrid, issue/wait),
// P2P messages matched by micro-batch. Nothing of the plan's rules is re-derived here.
//
// Semantics the interpreter fixes (documented, checked where possible):
//  - A TP collective named tp_allreduce / tp_reducescatter / tp_allgather / pp_tp_allgather
//    acts on the tensor the stage's chain of ops produced last (forward: the activation;
//    backward: the gradient), blocking or issued and delivered at its wait (the ops in
//    between, weight gradients, must not move the chain on). AllReduce / ReduceScatter apply
//    Op::reduce; ReduceScatter and AllGather split the sequence (sequence parallelism,
//    Korthikanti 2022 Sec 4.2.2) or, after a P2P receive, the flattened tensor (Megatron's
//    scatter/gather of stage messages, Narayanan 2021 Sec 4.1).
//  - Other collectives act on the tensor their name identifies: tp_allgather_input the
//    sequence shard of the norm output feeding the column-parallel layer being
//    back-propagated; cp_kv_allgather K/V of the layer; cp_dkv_reducescatter dK/dV of every
//    CP block; tp_allreduce_loss_max / tp_allreduce_loss (x2) the vocab-parallel cross
//    entropy's logit maximum, target logit and sum of exponentials, in Megatron's order;
//    dp_grad_* the completed gradients (below); dp_param_allgather parameters from their
//    owners (a layer's, or with layer -1 those no per-layer gather covers);
//    embedding_grad_allreduce the tied word-embedding gradient of the first stage and the
//    last stage's copy over GroupKind::EMB (both stages must reach it).
//  - Asynchronous collectives read their input at `issue` and deliver at `wait`, except
//    cp_dkv_reducescatter, which reads at `wait`: ring attention streams dK/dV blocks into
//    the ring while attention_bwd_remote produces them (the plan issues it before that op).
//  - Row-parallel biases are added after the TP reduction (Megatron's bias-dropout-add);
//    the vocab-parallel embedding adds learned positions on TP rank 0 only.
//  - The loss of a rank's micro-batch is sum(token losses) x |DPxCP| / N_global, so that
//    the plan's DP AVG of gradients gives the global mean over valid tokens.
//  - What a rank keeps between forward and backward follows the layout: with sequence
//    parallelism only the sequence shard of a norm output (backward re-gathers it); with
//    recompute=full only the layer input; with selective, not the attention core; K/V of
//    other CP ranks are not kept; ZeRO-3 frees gathered layer parameters after use
//    (poisoned with NaN). A missing recompute or gather shows as a missing tensor.
//  - Orders of the pipeline schedules (models/verify/schedule.cpp and the block files): a
//    (layer, micro-batch)'s weight-gradient ops (W: *_wgrad, embedding_bwd, with the SP
//    tp_allgather_input re-gathers and, Op::pass W, the embedding's TP AllGather) may run any
//    time after its input-gradient ops (B), after other micro-batches' forward and backward
//    (zero-bubble): what W reads (norm outputs, attention output, MLP activation, GEMM output
//    gradients; the embedding's output gradient) is kept past the end of B until the last
//    W of that (layer, micro-batch) ran. A W before its B finds its gradient missing (plan
//    problem); ZeRO-3 frees a layer's gathered parameters when another layer's op runs, so
//    a deferred W needs its layer's dp_param_allgather again. A stage holds the layers its
//    ops name and the embedding / head when its ops run them, so a layer may live on two
//    pipeline ranks (DualPipe); the virtual stage of a chunk is the rank of its first layer
//    among all chunks' (chunk * pp + stage when interleaved). dualpipe_grad_allreduce
//    (PP AllReduce SUM over GroupKind::MIRROR, both stages of the pair reach it, a
//    rendezvous like embedding_grad_allreduce) sums the gradients of every parameter both
//    ranks hold, as they stand; size_bytes = those elements x grad_bytes_per_param (after
//    a DP ReduceScatter: the elements the rank owns).
//  - DP gradient collectives act on the parameters whose gradients are complete (no later
//    op of the step, or of the micro-batch under ZeRO-3 / reduce_every_micro_batch, writes
//    them; which op writes which gradient is a table by op name, checked against the
//    writes the execution makes) and not reduced yet, except that Op::grad_bucket =
//    GradBucket::tied_embedding carries only the tied word embedding (or the last stage's
//    copy) and the stage's other DP collectives then leave it out; their element count
//    must match Op::size_bytes. A ReduceScatter shards a bucket into equal chunks (the last padded),
//    chunk i owned by the i-th rank of the DPxCP group, which runs Adam on it; elements a
//    rank neither owns nor has gathered since are stale and not compared until gathered.
//  - Mixture of experts (models/verify/ops_moe.cpp, which documents the orders): every MoE op
//    by name, the router's top-k on real scores, moe_dispatch / moe_combine (and their
//    backward) as permutations of token rows between the ranks of the op's EP group (RankGrid
//    GroupKind::EP: EP position j holds experts [j E/ep, (j+1) E/ep)), moe_etp_allgather /
//    moe_etp_reducescatter over GroupKind::ETP (ETP position q holds columns
//    [q fe/etp, (q+1) fe/etp) of every local expert), the weighted sum on the token's rank.
//    Their size_bytes are the plan's balanced-load estimates and are not checked. The shared
//    expert runs as the mlp_* ops (shared_up = mlp_up, ...); its result and the routed one are
//    added where both exist. Routed-expert gradients (and ZeRO shards, ZeRO-3 chunks) live in
//    their own buffers over GroupKind::EDP (edp_grad_*, edp_param_allgather); dp_grad_* and
//    dp_param_allgather leave them out. ReduceOp::avg over EDP means Megatron-Core's expert
//    gradient scaling: SUM over EDP, then x 1 / |DPxCP| (distributed_data_parallel.py,
//    expert_gradient_scaling_factor = 1 / data_parallel_world_size), which with the loss
//    scale above gives the full-batch gradient (each token's contribution reaches one EDP
//    group member, scaled by |DPxCP| / N_global). With an EDP group of one rank the plan has
//    no expert collective (none over a group of one); Megatron-Core still scales the expert
//    buffer, so the optimizer applies the 1 / |DPxCP| to those gradients. The router weight is TP-replicated and
//    computed on sequence shards: a tp_sp_grad_allreduce gradient. Not executed (refused by
//    verify_experiment with an InputError): capacity factor / token drop, MoE without SwiGLU,
//    sliding-window attention; the expert bias and group-limited routing are switched off by
//    shrink_experiment.
//  - Multi-head latent attention (models/verify/ops_mla.cpp, which documents the shapes and
//    reductions): every MLA op by name; tp_allgather_latent is the chain's AllGather of the
//    latents [q_in | kv latent | k^R] (SP), their gradient is the chain the column-parallel
//    tp_reducescatter / tp_allreduce sums, tp_allgather_input re-gathers them for the up
//    projections' weight gradients. The down projections' and latent norms' weights are
//    replicated over TP: with SP tp_sp_grad_allreduce gradients (TP partial sums), without SP
//    complete on every TP rank. The tiny model gives query / key and value heads the same size
//    (tiny_model.hpp).
#include <cstdint>
#include <string>
#include <vector>

#include "models/experiment.hpp"
#include "models/plan.hpp"

namespace dtsim::verify {

/// Known-wrong variants of the training code, each the classic bug of one rule.
enum class Injection {
  none,
  tp_grad_avg,            // backward TP reductions AVeraGe instead of SUM (input grads / TP)
  dp_local_mean,          // loss = local mean per micro-batch, averaged (ignores unequal token counts)
  cp_loss_scale,          // loss scaled by |DP| instead of |DP x CP|: gradients off by the CP size
  adam_before_sync,       // Adam on the local gradient, then parameters averaged over DP x CP
  dp_grad_sum,            // DP gradient collectives SUM instead of AVG
  cp_causal_local,        // ring attention masks with local positions (ignores the block offset)
  zero_skip_param_gather, // ZeRO: parameter AllGathers skipped (non-owners keep stale shards)
  pp_microbatch_swap,     // a stage takes the newest queued message instead of the oldest
  // Plan edits (apply_plan_injection): the bugs a zero-bubble schedule's B/W split can have.
  w_before_b,             // the first stage's first weight-gradient op (W) runs before its layer's backward (B)
  drop_w,                 // the first stage's first weight-gradient op is dropped (a deferred W never runs)
  // Mixture of experts.
  ep_grad_avg_over_ep,    // routed-expert gradients averaged over the EP group instead of the plan's EDP reduction
  moe_combine_unweighted, // moe_unpermute sums the top-k expert outputs without the router weights
  // Multi-head latent attention.
  mla_down_grad_unreduced, // MLA's replicated down-projection / latent-norm gradients not summed over TP (SP)
};
const char* to_string(Injection);
/// Every injection but `none`, in declaration order.
std::vector<Injection> all_injections();
/// The plan the interpreter runs under `inj`: an unedited copy for the bugs the interpreter
/// injects, else a copy edited as the bug says. w-before-b: the first op on stage 0 named
/// *_wgrad (a layer's W, in plan order) moves to just before the first backward op of its
/// (layer, micro-batch), so the gradient it multiplies does not exist yet; drop-w: that op
/// is removed, so its weight gradient lacks one micro-batch. Throws InputError when stage 0
/// has no *_wgrad op.
StepPlan apply_plan_injection(const StepPlan& plan, Injection inj);
/// Parses "tp-grad-avg" etc. Throws InputError listing the valid names.
Injection parse_injection(const std::string& name);
/// Empty when the bug can change the result on this (shrunk) experiment; otherwise the
/// reason it cannot (e.g. "needs layout.cp > 1").
std::string injection_inapplicable(Injection inj, const Experiment& shrunk);

struct RuleResult {
  std::string name;             // "loss", "DP", "TP", "CP", "PP", "ZeRO", "plan"
  std::string what;             // one line: what is compared
  bool applicable = true;       // false: the layout has no such split (reported as n/a)
  bool passed = true;
  double max_abs_error = 0;     // over every compared value (infinity for NaN)
  double tolerance = 0;         // absolute
  int64_t values = 0;           // number of compared values
  std::string worst;            // where max_abs_error occurred
  std::vector<std::string> problems;  // structural failures (plan rule), one line each
};

struct VerifyOptions {
  int steps = 3;                       // optimizer steps (several: ZeRO shards must stay in step)
  Injection inject = Injection::none;
  uint64_t seed = 20240521;            // parameters and data
  /// Threads for the pipeline stages (and the reference step): 0 = the machine's hardware
  /// threads, capped at the number of stages. The report (verdicts, errors, worst values,
  /// problems, notes) is the same for every value: each op's records are merged in the
  /// serial order of the ops.
  int threads = 0;
};

struct VerifyReport {
  Experiment original;  // as loaded
  Experiment shrunk;    // what ran
  int64_t world = 0;
  int steps = 0;
  Injection inject = Injection::none;
  std::vector<RuleResult> rules;      // loss, DP, TP, CP, PP, ZeRO, plan (in this order)
  std::vector<std::string> notes;     // facts about the plan worth knowing (not failures)
  /// True when every applicable rule passed.
  bool passed() const;
  const RuleResult& rule(const std::string& name) const;
};

/// Tolerances (absolute). Activations, losses and gradients: the reference and the
/// sharded execution sum the same terms in different orders; with O(1) values and at most
/// a few hundred terms per sum the difference is ~1e-14, so 1e-10 leaves 10^4 margin while
/// every injected bug moves results by >= 1e-4. Parameters and Adam moments: Adam divides
/// by sqrt(v^) + eps (eps = 1e-8), which turns a rounding difference delta of a near-zero
/// gradient into lr * delta / eps = 1e-10 per step: 1e-8 covers several steps.
inline constexpr double kTolValues = 1e-10;
inline constexpr double kTolParams = 1e-8;

/// The most ranks (dp x tp x cp x pp) verify runs. Every rank's tensors and records are
/// held in this process: measured peak memory grows by about 200 KB per rank (shrunk
/// Llama 3 8B, tp 2: 512 ranks 300 MB, 2,048 ranks 580 MB; at 131,072 ranks the kernel
/// killed it at 24 GB) and time by about 5 ms per rank, so 16,384 ranks (the largest
/// shipped experiment, experiments/scale/llama3-405b-16k-h100.yaml) need about 3 GB.
inline constexpr int64_t kMaxVerifyRanks = 16'384;

/// Shrinks `e` (shrink_experiment), builds its step plan with build_step_plan, runs it for
/// `o.steps` steps next to the single-device reference and reports every rule. Throws
/// InputError when the experiment is invalid or the injection cannot show on this layout.
/// Plan problems are reported (rule "plan"), not thrown.
VerifyReport verify_experiment(const Experiment& e, const VerifyOptions& o = {});

/// The same on a plan the caller built and possibly edited (tests try plan changes this
/// way): `plan.exp` must be a shrunk experiment (shrink_experiment) whose plan it is.
VerifyReport verify_plan(const StepPlan& plan, const VerifyOptions& o = {});

}  // namespace dtsim::verify
