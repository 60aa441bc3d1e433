// Cross-section checks of an experiment (models/experiment_check.hpp): the stated count limits
// first (models/checked.hpp), then each constraint between sections, every problem naming its
// keys, the values and the constraint, with the source of each rule beside it.
#include "models/experiment_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "models/checked.hpp"
#include "models/errors.hpp"
#include "models/flops.hpp"
#include "models/moe_checks.hpp"
#include "models/pipeline_split.hpp"
#include "models/plan.hpp"
#include "models/precision.hpp"
#include "models/schedules/schedule.hpp"
#include "models/units.hpp"
#include "topologies/fabrics/fabric.hpp"

namespace dtsim {

namespace {

bool divides(int64_t d, int64_t n) { return d > 0 && n % d == 0; }

std::string fmt_double(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

// Stated limits on the counts an experiment multiplies (models/checked.hpp): each count
// against its own limit, then their products (GPUs, plan operations) with checked
// arithmetic, before any work starts. A key above its limit goes into `too_big`, so that
// no later check multiplies it.
template <class Ok>
void check_count_limits(const Experiment& e, ProblemList& p, const Ok& ok, std::set<std::string, std::less<>>& too_big) {
  using checked::with_commas;
  const ModelSpec& m = e.model;
  const ClusterSpec& c = e.cluster;
  const Layout& l = e.layout;
  const Training& t = e.training;
  struct Limit {
    const char* key;
    int64_t value, limit;
    const char* unit;
    const char* why;
  };
  const Limit counts[] = {
      {"model.layers", m.layers, limits::kMaxLayers, "layer", limits::kMaxLayersWhy},
      {"model.hidden", m.hidden, limits::kMaxWidth, "", limits::kMaxWidthWhy},
      {"model.heads", m.heads, limits::kMaxWidth, "", limits::kMaxWidthWhy},
      {"model.kv_heads", m.kv_heads, limits::kMaxWidth, "", limits::kMaxWidthWhy},
      {"model.ffn_hidden", m.ffn_hidden, limits::kMaxWidth, "", limits::kMaxWidthWhy},
      {"model.head_dim", m.head_dim_override, limits::kMaxWidth, "", limits::kMaxWidthWhy},
      {"model.moe.num_experts", m.moe.num_experts, limits::kMaxExperts, "expert", limits::kMaxExpertsWhy},
      {"model.moe.moe_ffn_hidden", m.moe.moe_ffn_hidden, limits::kMaxWidth, "", limits::kMaxWidthWhy},
      {"model.moe.shared_expert_ffn_hidden", m.moe.shared_expert_ffn_hidden, limits::kMaxWidth, "",
       limits::kMaxWidthWhy},
      {"model.mla.q_lora_rank", m.mla.q_lora_rank, limits::kMaxWidth, "", limits::kMaxWidthWhy},
      {"model.mla.kv_lora_rank", m.mla.kv_lora_rank, limits::kMaxWidth, "", limits::kMaxWidthWhy},
      {"model.mla.qk_nope_head_dim", m.mla.qk_nope_head_dim, limits::kMaxWidth, "", limits::kMaxWidthWhy},
      {"model.mla.qk_rope_head_dim", m.mla.qk_rope_head_dim, limits::kMaxWidth, "", limits::kMaxWidthWhy},
      {"model.mla.v_head_dim", m.mla.v_head_dim, limits::kMaxWidth, "", limits::kMaxWidthWhy},
      {"model.attention.window", m.attention.window, limits::kMaxTokens, "token", limits::kMaxSeqWhy},
      {"model.mtp_layers", m.mtp_layers, limits::kMaxLayers, "layer", limits::kMaxLayersWhy},
      {"model.vocab", m.vocab, limits::kMaxTokens, "token", limits::kMaxVocabWhy},
      {"model.max_position_embeddings", m.max_position_embeddings, limits::kMaxTokens, "token",
       limits::kMaxSeqWhy},
      {"training.seq_len", t.seq_len, limits::kMaxTokens, "token", limits::kMaxSeqWhy},
      {"training.global_batch", t.global_batch, limits::kMaxBatch, "sequence", limits::kMaxBatchWhy},
      {"training.micro_batch", t.micro_batch, limits::kMaxBatch, "sequence", limits::kMaxBatchWhy},
      {"cluster.nodes", c.nodes, limits::kMaxGpus, "GPU", limits::kMaxGpusWhy},
      {"cluster.gpus_per_node", c.gpus_per_node, limits::kMaxGpus, "GPU", limits::kMaxGpusWhy},
      {"cluster.nics_per_node", c.nics_per_node, limits::kMaxGpus, "GPU", limits::kMaxGpusWhy},
      {"cluster.fabric.nodes_per_leaf", c.fabric_shape.nodes_per_leaf, limits::kMaxGpus, "GPU",
       limits::kMaxGpusWhy},
      {"cluster.fabric.leaves_per_pod", c.fabric_shape.leaves_per_pod, limits::kMaxGpus, "GPU",
       limits::kMaxGpusWhy},
      {"cluster.gpu.sm_count", c.gpu.sm_count, limits::kMaxWidth, "SM",
       "a GPU has a few hundred streaming multiprocessors (H100 SXM: 132)"},
      {"layout.dp", l.dp, limits::kMaxGpus, "GPU", limits::kMaxGpusWhy},
      {"layout.tp", l.tp, limits::kMaxGpus, "GPU", limits::kMaxGpusWhy},
      {"layout.cp", l.cp, limits::kMaxGpus, "GPU", limits::kMaxGpusWhy},
      {"layout.pp", l.pp, limits::kMaxGpus, "GPU", limits::kMaxGpusWhy},
      {"layout.vp", l.vp, limits::kMaxLayers, "layer", limits::kMaxLayersWhy},
      {"layout.ep", l.ep, limits::kMaxGpus, "GPU", limits::kMaxGpusWhy},
      {"layout.etp", l.etp, limits::kMaxGpus, "GPU", limits::kMaxGpusWhy},
  };
  for (const auto& x : counts) {
    if (!ok({x.key}) || x.value <= x.limit) continue;
    too_big.insert(x.key);
    p.add(std::string(x.key) + "=" + std::to_string(x.value) + " exceeds the " + with_commas(x.limit) +
          (*x.unit ? std::string("-") + x.unit : std::string()) + " limit (" + x.why + ")");
  }
  // Products of counts that are each within their limits (and positive: the positivity
  // checks report the others).
  auto product_limit = [&](std::initializer_list<const char*> keys, std::initializer_list<int64_t> values,
                           const std::string& label, int64_t limit, const char* unit, const char* why) {
    for (const char* k : keys)
      if (!ok({k})) return false;
    for (int64_t v : values)
      if (v <= 0) return false;
    const auto prod = checked::product(values);
    if (prod && *prod <= limit) return false;
    std::string factors;
    for (int64_t v : values) factors += (factors.empty() ? "" : " x ") + std::to_string(v);
    p.add(label + " = " + factors + " = " + (prod ? with_commas(*prod) : std::string("more than 2^63")) +
          " exceeds the " + with_commas(limit) + "-" + unit + " limit (" + why + ")");
    for (const char* k : keys) too_big.insert(k);
    return true;
  };
  product_limit({"cluster.nodes", "cluster.gpus_per_node"}, {c.nodes, c.gpus_per_node},
                "cluster.nodes x cluster.gpus_per_node", limits::kMaxGpus, "GPU", limits::kMaxGpusWhy);
  product_limit({"layout.dp", "layout.tp", "layout.cp", "layout.pp"}, {l.dp, l.tp, l.cp, l.pp},
                "layout.dp x tp x cp x pp", limits::kMaxGpus, "GPU", limits::kMaxGpusWhy);
  // The step plan: its size grows with micro-batches per step x layers (models/plan.hpp
  // plan_op_bound); refused here, before it is built.
  if (ok({"training.global_batch", "training.micro_batch", "layout.dp", "layout.pp", "layout.vp", "model.layers"}) &&
      t.global_batch > 0 && t.micro_batch > 0 && l.dp > 0 && l.pp > 0 && l.vp > 0 && m.layers > 0 &&
      t.global_batch % (t.micro_batch * l.dp) == 0) {
    const int64_t ops = plan_op_bound(e);
    if (ops > limits::kMaxPlanOps) {
      p.add("training.global_batch=" + std::to_string(t.global_batch) + " gives " +
            with_commas(t.accumulation(l)) + " micro-batches per step (/ (training.micro_batch=" +
            std::to_string(t.micro_batch) + " x layout.dp=" + std::to_string(l.dp) + ")), and with model.layers=" +
            std::to_string(m.layers) + (m.mtp_layers > 0 ? " and model.mtp_layers=" + std::to_string(m.mtp_layers) : "") +
            " the step plan would hold up to " + with_commas(ops) +
            " operations: above the " + with_commas(limits::kMaxPlanOps) + "-operation limit (" +
            limits::kMaxPlanOpsWhy + "); lower training.global_batch or raise training.micro_batch");
      too_big.insert("training.global_batch");
    }
  }
}

// The cross-section checks. A check is skipped when one of the keys it involves is in
// `bad` (or below a bad map), because that key already has its own problem.

void check_sections(const Experiment& e, ProblemList& p, const std::set<std::string>& bad);

}  // namespace

void check_experiment(const Experiment& e, ProblemList& p, const std::set<std::string>& bad) {
  const size_t first_problem = p.problems().size();
  check_sections(e, p, bad);
  // The model's size, once every key is valid (each count within its own limit): widths
  // and counts that are each in range can still multiply to more parameters than any count
  // of dtsim holds exactly (limits::kMaxParameters).
  if (p.problems().size() == first_problem && bad.empty()) {
    double n = 0;
    try {
      n = total_parameters_f(e.model, e.training.seq_len);
    } catch (const InputError&) {
      n = 0;  // a model total_parameters refuses: its own checks say why where it is used
    }
    if (!(n <= limits::kMaxParameters))
      p.add(fmt::format("model: {:.4g} parameters (model.layers={}, hidden={}, ffn_hidden={}{}) exceed the 2^50 "
                        "({:.4g}) parameter limit ({})",
                        n, e.model.layers, e.model.hidden, e.model.ffn_hidden,
                        e.model.moe.enabled() ? fmt::format(", moe.num_experts={}, moe.moe_ffn_hidden={}",
                                                            e.model.moe.num_experts, e.model.moe.moe_ffn_hidden)
                                              : std::string(),
                        limits::kMaxParameters, limits::kMaxParametersWhy));
  }
  // A value from a GPU or node file is fixed in that file, not in the experiment: say so.
  if (!e.cluster.gpu.source_file.empty())
    p.annotate_from(first_problem, {"cluster.gpu."}, " (cluster.gpu is read from " + e.cluster.gpu.source_file + ")");
  if (!e.cluster.node_file.empty())
    p.annotate_from(first_problem,
                    {"cluster.gpus_per_node", "cluster.intra_node", "cluster.nvlink", "cluster.nics_per_node",
                     "cluster.nic.", "cluster.nic=", "cluster.hbm_reserve", "cluster.host_dispatch"},
                    " (cluster.node is read from " + e.cluster.node_file + ")");
}

namespace {

void check_sections(const Experiment& e, ProblemList& p, const std::set<std::string>& bad) {
  const ModelSpec& m = e.model;
  const ClusterSpec& c = e.cluster;
  const Layout& l = e.layout;
  const Training& t = e.training;
  auto s = [](auto v) { return std::to_string(v); };
  // Keys above their stated limit: the checks that multiply them are skipped.
  std::set<std::string, std::less<>> too_big;
  auto ok = [&](std::initializer_list<std::string_view> keys) {
    if (bad.empty() && too_big.empty()) return true;  // the usual case (validate_experiment, a sweep's layouts)
    for (std::string_view k : keys) {
      for (const auto& b : bad)
        if (k == b || (k.size() > b.size() && k.substr(0, b.size()) == b && k[b.size()] == '.')) return false;
      if (too_big.count(k)) return false;
    }
    return true;
  };

  // Positive integers.
  const std::pair<const char*, int64_t> positives[] = {
      {"model.layers", m.layers},          {"model.hidden", m.hidden},
      {"model.heads", m.heads},            {"model.kv_heads", m.kv_heads},
      {"model.ffn_hidden", m.ffn_hidden},  {"model.vocab", m.vocab},
      {"cluster.nodes", c.nodes},          {"cluster.gpus_per_node", c.gpus_per_node},
      {"layout.dp", l.dp},                 {"layout.tp", l.tp},
      {"layout.cp", l.cp},                 {"layout.pp", l.pp},
      {"training.seq_len", t.seq_len},     {"training.global_batch", t.global_batch},
      {"training.micro_batch", t.micro_batch},
  };
  for (const auto& [key, v] : positives)
    if (ok({key}) && v <= 0) p.add(std::string(key) + "=" + s(v) + " must be a positive integer");
  check_moe(e, p);
  if (ok({"model.max_position_embeddings"}) && m.max_position_embeddings < 0)
    p.add("model.max_position_embeddings=" + s(m.max_position_embeddings) + " must be >= 0");
  if (ok({"layout.zero_stage"}) && (l.zero_stage < 0 || l.zero_stage > 3))
    p.add("layout.zero_stage=" + s(l.zero_stage) + " must be 0, 1, 2 or 3");
  // ZeRO-2 keeps only a gradient shard, so it must reduce-scatter every micro-batch's
  // gradients (models/plan.hpp GradSyncPolicy). Megatron-Core's distributed optimizer is
  // ZeRO-1: gradients accumulate whole in the contiguous grad buffer and are
  // reduce-scattered once, on the last micro-batch (megatron/core/distributed/
  // param_and_grad_buffer.py, distributed_data_parallel.py); its optim_grads sharding
  // belongs to Megatron-FSDP, which dtsim does not model.
  if (ok({"layout.zero_stage", "training.framework"}) && l.zero_stage == 2 && t.framework == Framework::megatron)
    p.add("layout.zero_stage=2 is not available with training.framework=megatron: Megatron-Core's distributed "
          "optimizer is ZeRO-1 (gradients stay whole in its grad buffer and are reduce-scattered once per step), "
          "while ZeRO-2 shards gradients and so reduce-scatters them every micro-batch; use layout.zero_stage=1 "
          "for Megatron, or training.framework=deepspeed for ZeRO-2");
  // PyTorch FSDP2 as modelled here is fully_shard with reshard_after_forward (ZeRO-3,
  // models/zero3.hpp); DeepSpeed's pipeline engine refuses ZeRO-2/3 (deepspeed/runtime/pipe/
  // engine.py PipelineEngine.__init__: "ZeRO-2 and ZeRO-3 are incompatible with pipeline
  // parallelism", @edaa7221).
  if (ok({"layout.zero_stage", "training.framework"}) && t.framework == Framework::fsdp && l.zero_stage != 3)
    p.add("training.framework=fsdp needs layout.zero_stage=3 (PyTorch FSDP2 fully_shard shards parameters, "
          "gradients and optimizer states), got layout.zero_stage=" + s(l.zero_stage));
  if (ok({"layout.zero_stage", "training.framework", "layout.pp"}) && t.framework == Framework::deepspeed &&
      l.zero_stage >= 2 && l.pp > 1)
    p.add("layout.pp=" + s(l.pp) + " with layout.zero_stage=" + s(l.zero_stage) +
          " and training.framework=deepspeed: DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3 (\"ZeRO-2 and "
          "ZeRO-3 are incompatible with pipeline parallelism\", deepspeed/runtime/pipe/engine.py)");
  for (const auto& [key, v] : {std::pair<const char*, double>{"training.stage3_max_reuse_distance", t.stage3_max_reuse_distance},
                               {"training.stage3_max_live_parameters", t.stage3_max_live_parameters}})
    if (ok({key}) && !(v >= 0 && v <= 1e15))
      p.add(std::string(key) + "=" + fmt_double(v) + " must be a parameter count between 0 and 1e15");
  if (ok({"cluster.nics_per_node"}) && c.nics_per_node < 0)
    p.add("cluster.nics_per_node=" + s(c.nics_per_node) + " must be >= 0");
  check_count_limits(e, p, ok, too_big);

  // Model shape.
  if (ok({"model.hidden", "model.heads"}) && m.heads > 0 && m.hidden > 0 && m.hidden % m.heads != 0)
    p.add("model.hidden=" + s(m.hidden) + " is not a multiple of model.heads=" + s(m.heads));
  if (ok({"model.heads", "model.kv_heads"}) && m.heads > 0 && m.kv_heads > 0 && m.heads % m.kv_heads != 0)
    p.add("model.heads=" + s(m.heads) + " is not a multiple of model.kv_heads=" + s(m.kv_heads) +
          " (each key/value head serves a whole group of query heads)");
  if (ok({"model.position", "model.max_position_embeddings", "training.seq_len"}) &&
      m.position == Position::learned && m.max_position_embeddings > 0 && t.seq_len > m.max_position_embeddings)
    p.add("training.seq_len=" + s(t.seq_len) + " exceeds model.max_position_embeddings=" +
          s(m.max_position_embeddings) + " (learned position embeddings)");

  // Layout against cluster and model.
  if (ok({"layout.dp", "layout.tp", "layout.cp", "layout.pp", "cluster.nodes", "cluster.gpus_per_node"}) &&
      l.dp > 0 && l.tp > 0 && l.cp > 0 && l.pp > 0 && c.nodes > 0 && c.gpus_per_node > 0 &&
      checked::product({l.dp, l.tp, l.cp, l.pp}) != checked::mul(c.nodes, c.gpus_per_node)) {
    const auto shown = [&](std::optional<int64_t> v) { return v ? s(*v) : std::string("more than 2^63"); };
    p.add("layout.dp*tp*cp*pp=" + s(l.dp) + "*" + s(l.tp) + "*" + s(l.cp) + "*" + s(l.pp) + "=" +
          shown(checked::product({l.dp, l.tp, l.cp, l.pp})) +
          " does not equal the cluster's GPUs cluster.nodes*gpus_per_node=" + s(c.nodes) + "*" +
          s(c.gpus_per_node) + "=" + shown(checked::mul(c.nodes, c.gpus_per_node)));
  }
  if (l.tp > 0 && ok({"layout.tp"})) {
    if (ok({"model.heads"}) && m.heads > 0 && !divides(l.tp, m.heads))
      p.add("layout.tp=" + s(l.tp) + " does not divide model.heads=" + s(m.heads));
    if (ok({"model.kv_heads"}) && m.kv_heads > 0 && !divides(l.tp, m.kv_heads))
      p.add("layout.tp=" + s(l.tp) + " does not divide model.kv_heads=" + s(m.kv_heads));
    if (ok({"model.ffn_hidden"}) && m.ffn_hidden > 0 && !divides(l.tp, m.ffn_hidden))
      p.add("layout.tp=" + s(l.tp) + " does not divide model.ffn_hidden=" + s(m.ffn_hidden) +
            " (the MLP is split across tensor-parallel ranks)");
    if (ok({"model.vocab"}) && m.vocab > 0 && !divides(l.tp, m.vocab))
      p.add("layout.tp=" + s(l.tp) + " does not divide model.vocab=" + s(m.vocab) +
            " (the embedding and output layer are split across tensor-parallel ranks; pad the vocabulary)");
  }
  const bool split_options = has_pipeline_split_options(l);
  if (ok({"layout.pp", "model.layers"}) && !split_options && l.pp > 0 && m.layers > 0 && m.layers < l.pp)
    p.add("layout.pp=" + s(l.pp) + " exceeds model.layers=" + s(m.layers) +
          " (every pipeline stage needs at least one layer)");
  if (ok({"layout.vp"}) && l.vp < 1) p.add("layout.vp=" + s(l.vp) + " must be a positive integer");
  if (ok({"layout.vp", "layout.pp", "model.layers"}) && !split_options && l.vp > 1 && l.pp > 0 && m.layers > 0 &&
      !divides(l.pp * l.vp, m.layers))
    p.add("layout.pp*vp=" + s(l.pp) + "*" + s(l.vp) + " does not divide model.layers=" + s(m.layers) +
          " (each virtual stage holds a whole number of layers)");
  // Megatron-Core's split options: every constraint of models/pipeline_split.hpp.
  if (split_options && ok({"layout.pp", "layout.vp", "model.layers", "layout.account_for_embedding_in_pipeline_split",
                           "layout.account_for_loss_in_pipeline_split", "layout.decoder_first_pipeline_num_layers",
                           "layout.decoder_last_pipeline_num_layers", "layout.pipeline_layout"}) &&
      l.pp > 0 && l.vp > 0 && m.layers > 0) {
    try {
      (void)pipeline_split(m, l);
    } catch (const InputError& err) {
      for (const std::string& problem : err.problems()) p.add(problem);
    }
  }
  // The schedule's own constraints (models/schedules/, one file per schedule).
  if (ok({"layout.schedule", "layout.vp", "layout.pp", "layout.dp", "training.global_batch", "training.micro_batch"}) &&
      l.pp > 0 && l.vp > 0 && t.micro_batch > 0 && l.dp > 0 && t.global_batch % (t.micro_batch * l.dp) == 0)
    for (const std::string& problem :
         sched::schedule_of(l.schedule).check(sched::dims_of(l, t, t.global_batch / (t.micro_batch * l.dp))))
      p.add(problem);
  // A split backward with ZeRO-3: the layer's parameters are gathered for B and freed, and a
  // deferred W would need them gathered again and its gradient reduce-scattered on its own;
  // no framework we model runs it (sail-sg's zero-bubble code supports ZeRO-1; FSDP has no
  // B/W split), so it is refused rather than guessed.
  if (ok({"layout.schedule", "layout.zero_stage"}) && sched::schedule_of(l.schedule).splits_backward() &&
      l.zero_stage == 3)
    p.add(std::string("layout.schedule=") + to_string(l.schedule) +
          " splits each backward into B and W, which is not modelled with layout.zero_stage=3 (use 0, 1 or 2)");
  if (ok({"training.tp_comm_overlap", "layout.sequence_parallel", "layout.tp"}) && t.tp_comm_overlap &&
      l.tp > 1 && !l.sequence_parallel)
    p.add("training.tp_comm_overlap=true needs layout.sequence_parallel=true with layout.tp=" + s(l.tp) +
          " (Transformer Engine overlaps the sequence-parallel AllGather/ReduceScatter; Megatron-LM asserts "
          "--sequence-parallel with --tp-comm-overlap)");
  if (ok({"training.grad_bucket"}) && t.grad_bucket_bytes < 0)
    p.add("training.grad_bucket must not be negative");
  if (ok({"layout.cp", "training.seq_len"}) && l.cp > 0 && t.seq_len > 0 && !divides(l.cp, t.seq_len))
    p.add("layout.cp=" + s(l.cp) + " does not divide training.seq_len=" + s(t.seq_len));
  else if (ok({"layout.cp", "training.seq_len"}) && l.cp > 1 && t.seq_len > 0 && t.seq_len % (2 * l.cp) != 0)
    p.add("training.seq_len=" + s(t.seq_len) + " is not a multiple of 2*layout.cp=" + s(2 * l.cp) +
          " (causal context parallelism splits the sequence into 2*cp chunks for load balance: Megatron-Core "
          "get_batch_on_this_cp_rank)");
  if (ok({"layout.sequence_parallel", "layout.tp", "layout.cp", "training.seq_len"}) && l.sequence_parallel &&
      l.tp > 1 && l.cp > 0 && t.seq_len > 0 && divides(l.cp, t.seq_len) && (t.seq_len / l.cp) % l.tp != 0)
    p.add("layout.tp=" + s(l.tp) + " does not divide the " + s(t.seq_len / l.cp) +
          " tokens of a CP rank (training.seq_len=" + s(t.seq_len) + " / layout.cp=" + s(l.cp) +
          "): sequence parallelism splits them over TP (Megatron-LM scatter_to_sequence_parallel_region)");

  // Batch: whole gradient-accumulation steps.
  if (ok({"training.global_batch", "training.micro_batch", "layout.dp"}) && t.micro_batch > 0 && l.dp > 0 &&
      t.global_batch > 0 && t.global_batch % (t.micro_batch * l.dp) != 0)
    p.add("training.global_batch=" + s(t.global_batch) + " is not a multiple of training.micro_batch*layout.dp=" +
          s(t.micro_batch * l.dp));

  // Cluster.
  if (ok({"cluster.nics_per_node", "cluster.gpus_per_node"}) && c.nics_per_node > 0 && c.gpus_per_node > 0 &&
      c.gpus_per_node % c.nics_per_node != 0)
    p.add("cluster.nics_per_node=" + s(c.nics_per_node) + " does not divide cluster.gpus_per_node=" +
          s(c.gpus_per_node));
  if (ok({"cluster.nics_per_node", "cluster.nodes"}) && c.nodes > 1 && c.nics_per_node == 0)
    p.add("cluster.nics_per_node=0 but cluster.nodes=" + s(c.nodes) + " needs network interfaces");
  if (ok({"cluster.fabric"}) && !find_fabric_type(c.fabric))
    p.add("cluster.fabric=\"" + c.fabric + "\" is not a fabric type (valid: " + fabric_type_list() + ")");
  if (const FabricType* ft = find_fabric_type(c.fabric); ft && ok({"cluster.fabric"})) {
    const auto& f = c.fabric_shape;
    auto reads = [&](const char* key) { return std::find(ft->keys.begin(), ft->keys.end(), key) != ft->keys.end(); };
    // rail-optimized: 0 = every node in one rail group; the other types need a leaf size.
    const int64_t min_leaf = c.fabric == "rail-optimized" ? 0 : 1;
    if (reads("nodes_per_leaf") && ok({"cluster.fabric.nodes_per_leaf"}) && f.nodes_per_leaf < min_leaf)
      p.add("cluster.fabric.nodes_per_leaf=" + s(f.nodes_per_leaf) + " must be >= " + s(min_leaf) + " (fabric " +
            c.fabric + ")");
    if (reads("leaves_per_pod") && ok({"cluster.fabric.leaves_per_pod"}) && f.leaves_per_pod < 1)
      p.add("cluster.fabric.leaves_per_pod=" + s(f.leaves_per_pod) + " must be >= 1 (fabric " + c.fabric + ")");
    if (reads("oversubscription") && ok({"cluster.fabric.oversubscription"}) && !(f.oversubscription >= 1))
      p.add("cluster.fabric.oversubscription=" + fmt_double(f.oversubscription) +
            " must be >= 1 (leaf downlink : uplink capacity)");
    if (reads("pod_oversubscription") && ok({"cluster.fabric.pod_oversubscription"}) && !(f.pod_oversubscription >= 1))
      p.add("cluster.fabric.pod_oversubscription=" + fmt_double(f.pod_oversubscription) +
            " must be >= 1 (pod downlink : uplink capacity)");
  }
  if (ok({"cluster.nvlink.nvls_efficiency"}) && !(c.nvls_efficiency >= 0 && c.nvls_efficiency <= 1))
    p.add("cluster.nvlink.nvls_efficiency=" + fmt_double(c.nvls_efficiency) +
          " must be in [0, 1] (0: no NVLink SHARP)");
  if (ok({"cluster.nvlink.nvls_efficiency", "cluster.intra_node", "cluster.node"}) &&
      c.intra_node == IntraNode::xgmi_mesh && c.nvls_efficiency > 0)
    p.add("cluster.nvlink.nvls_efficiency=" + fmt_double(c.nvls_efficiency) +
          " must be 0 with cluster.intra_node=xgmi-mesh (in-switch reduction needs an NVSwitch; a mesh has none)");
  // NVLS runs on NVSwitch gen3 multicast (H100/H200/B200 nodes); forcing it elsewhere is not
  // something the simulator can fall back from silently (NCCL_ALGO=NVLS fails there too).
  if (ok({"cluster.collectives.algorithm", "cluster.nvlink.nvls_efficiency", "cluster.node"}) &&
      c.collectives.algorithm == "nvls" && !(c.nvls_efficiency > 0))
    p.add("cluster.collectives.algorithm=nvls needs NVLink SHARP, but this cluster has none (cluster.nvlink."
          "nvls_efficiency=0: " + (c.gpu.name.empty() ? std::string("the GPU") : c.gpu.name) +
          " nodes without NVSwitch multicast); choose another algorithm or auto");
  else if (ok({"cluster.collectives.algorithm", "cluster.gpus_per_node"}) && c.collectives.algorithm == "nvls" &&
           c.gpus_per_node < 2)
    p.add("cluster.collectives.algorithm=nvls needs an NVLink domain of at least 2 GPUs (cluster.gpus_per_node=" +
          s(c.gpus_per_node) + ")");

  // Keys as string_view: no string is made unless there is a problem to report.
  auto fraction = [&](std::string_view key, double v) {
    if (!(v > 0 && v <= 1) && ok({key})) p.add(std::string(key) + "=" + fmt_double(v) + " must be in (0, 1]");
  };
  if (ok({"cluster.gpu.sustained_ratio"}) && !(c.gpu.sustained_ratio > 0 && c.gpu.sustained_ratio <= 1))
    p.add("cluster.gpu.sustained_ratio=" + fmt_double(c.gpu.sustained_ratio) +
          " must be in (0, 1] (sustained / burst matmul rate)");
  if (ok({"cluster.gpu.attention_efficiency"}) && !(c.gpu.attention_efficiency >= 0 && c.gpu.attention_efficiency <= 1))
    p.add("cluster.gpu.attention_efficiency=" + fmt_double(c.gpu.attention_efficiency) +
          " must be in [0, 1] (0: use gemm_efficiency)");
  if (ok({"cluster.gpu.sm_count"}) && c.gpu.sm_count < 0)
    p.add("cluster.gpu.sm_count=" + std::to_string(c.gpu.sm_count) + " must be >= 0 (0: no SM accounting)");
  auto positive = [&](std::string_view key, double v, const char* unit) {
    if (!(v > 0) && ok({key})) p.add(std::string(key) + "=" + fmt_double(v) + " " + unit + " must be > 0");
  };
  auto non_negative = [&](std::string_view key, double v, const char* unit) {
    if (!(v >= 0) && ok({key})) p.add(std::string(key) + "=" + fmt_double(v) + " " + unit + " must be >= 0");
  };
  // Physical ranges (limits:: in models/checked.hpp): a value may be zero only where zero
  // means "none" (peak_fp8/fp4: no such tensor cores; latencies, overheads, reserve: none).
  auto within = [&](std::string_view key, double v, double lo, double hi, const char* unit, bool zero_ok) {
    if (!(v > 0) || !ok({key})) return;  // zero is allowed or has its "must be > 0" message
    if (v >= lo && v <= hi) return;
    const std::string u = *unit ? std::string(" ") + unit : "";
    // The value as printed must not look inside the range (1.0000001e18 prints as 1e+18).
    std::string text = fmt_double(v);
    if (const double shown = std::strtod(text.c_str(), nullptr); shown >= lo && shown <= hi)
      text = fmt::format("{:.17g}", v);
    p.add(std::string(key) + "=" + text + u + " is outside [" + fmt_double(lo) + ", " + fmt_double(hi) +
            "]" + u + (zero_ok && lo > 0 ? " (or 0)" : "") + ": " + limits::kPhysicalWhy);
  };
  auto rate = [&](std::string_view key, double v, double lo, double hi, const char* unit, bool zero_ok) {
    if (zero_ok) non_negative(key, v, unit);
    else positive(key, v, unit);
    within(key, v, lo, hi, unit, zero_ok);
  };
  auto efficiency = [&](std::string_view key, double v) {
    fraction(key, v);
    if (v > 0 && v <= 1) within(key, v, limits::kMinEfficiency, 1.0, "", false);
  };
  auto latency = [&](std::string_view key, double v) {
    non_negative(key, v, "s");
    within(key, v, 0, limits::kMaxLatency, "s", true);
  };
  rate("cluster.gpu.peak_bf16", c.gpu.peak_bf16_flops, limits::kMinFlopRate, limits::kMaxFlopRate, "FLOP/s", false);
  rate("cluster.gpu.peak_fp8", c.gpu.peak_fp8_flops, limits::kMinFlopRate, limits::kMaxFlopRate, "FLOP/s", true);
  rate("cluster.gpu.peak_fp4", c.gpu.peak_fp4_flops, limits::kMinFlopRate, limits::kMaxFlopRate, "FLOP/s", true);
  rate("cluster.gpu.hbm", c.gpu.hbm_bytes, 1, limits::kMaxMemoryBytes, "B", false);
  rate("cluster.gpu.hbm_bandwidth", c.gpu.hbm_bandwidth, limits::kMinBandwidth, limits::kMaxBandwidth, "B/s", false);
  efficiency("cluster.gpu.gemm_efficiency", c.gpu.gemm_efficiency);
  efficiency("cluster.gpu.memory_efficiency", c.gpu.memory_efficiency);
  if (c.gpu.attention_efficiency > 0 && c.gpu.attention_efficiency <= 1)
    within("cluster.gpu.attention_efficiency", c.gpu.attention_efficiency, limits::kMinEfficiency, 1.0, "", true);
  if (c.gpu.sustained_ratio > 0 && c.gpu.sustained_ratio <= 1)
    within("cluster.gpu.sustained_ratio", c.gpu.sustained_ratio, limits::kMinEfficiency, 1.0, "", false);
  latency("cluster.gpu.kernel_overhead", c.gpu.kernel_overhead);
  if (c.gpus_per_node > 1) {
    rate("cluster.nvlink.bandwidth", c.nvlink.bandwidth, limits::kMinBandwidth, limits::kMaxBandwidth, "B/s", false);
    latency("cluster.nvlink.latency", c.nvlink.latency);
    efficiency("cluster.nvlink.efficiency", c.nvlink.efficiency);
    if (c.nvls_efficiency > 0 && c.nvls_efficiency <= 1)
      within("cluster.nvlink.nvls_efficiency", c.nvls_efficiency, limits::kMinEfficiency, 1.0, "", true);
  }
  if (c.nodes > 1) {
    rate("cluster.nic.bandwidth", c.nic.bandwidth, limits::kMinBandwidth, limits::kMaxBandwidth, "B/s", false);
    latency("cluster.nic.latency", c.nic.latency);
    efficiency("cluster.nic.efficiency", c.nic.efficiency);
  }
  non_negative("cluster.hbm_reserve", c.hbm_reserve_bytes, "B");
  within("cluster.hbm_reserve", c.hbm_reserve_bytes, 0, limits::kMaxMemoryBytes, "B", true);
  latency("cluster.host_dispatch", c.host_dispatch);
  if (ok({"cluster.hbm_reserve", "cluster.gpu.hbm"}) && c.gpu.hbm_bytes > 0 && c.hbm_reserve_bytes >= c.gpu.hbm_bytes)
    p.add("cluster.hbm_reserve=" + fmt_double(c.hbm_reserve_bytes) +
          " B leaves no memory: it is not below cluster.gpu.hbm=" + fmt_double(c.gpu.hbm_bytes) + " B");

  // Training.
  // A whole-iteration graph replays fixed shapes: a dropless MoE layer's token counts change
  // every micro-batch (Megatron-Core captures MoE layers only as drop-and-pad,
  // CudaGraphModule.moe in megatron/core/transformer/enums.py).
  if (ok({"training.cuda_graphs", "model.moe"}) && t.cuda_graphs == CudaGraphs::full_iteration && e.model.moe.enabled() &&
      !(e.model.moe.capacity_factor > 0 && e.model.moe.pad_to_capacity))
    p.add("training.cuda_graphs=full_iteration needs static shapes, but model.moe routes dropless (capacity_factor " +
          fmt_double(e.model.moe.capacity_factor) + ", pad_to_capacity " +
          std::string(e.model.moe.pad_to_capacity ? "true" : "false") +
          "): set model.moe.capacity_factor and pad_to_capacity, or cuda_graphs: layers");
  if (ok({"training.dtype", "training.precision", "training.fp8_param_gather", "training.first_last_layers_bf16",
          "training.num_layers_at_start_in_bf16", "training.num_layers_at_end_in_bf16", "cluster.gpu", "model.layers"}))
    for (std::string q : precision_problems(t, c.gpu, e.model.layers)) {
      if (t.precision_from_dtype)  // name the key the file has
        if (auto at = q.find("training.precision=" + std::string(precision_recipe(t.precision).name)); at == 0)
          q.replace(0, q.find(' '), "training.dtype=" + std::string(t.precision == Precision::bf16 ? "bf16" : "fp8"));
      p.add(q);
    }

  // Published figures.
  non_negative("published.step_time_s", e.published.step_time_s, "s");
  non_negative("published.tflops_per_gpu", e.published.tflops_per_gpu, "TFLOP/s");
  if (ok({"published.mfu"}) && !(e.published.mfu >= 0 && e.published.mfu <= 1))
    p.add("published.mfu=" + fmt_double(e.published.mfu) + " must be a fraction in [0, 1]");
  for (MemoryQuantity mq : kMemoryQuantities) {
    const char* key = to_string(mq);
    const Published::MemoryPoint* point = &e.published.memory[static_cast<size_t>(mq)];
    if (point->stage >= 0 && point->bytes >= 0) continue;  // neither check below can fail
    // The stage is checked against layout.pp by `dtsim validate` (sim/validate.cpp), which
    // compares the experiment as written; sweeps and overrides may change its layout.
    const std::string k = std::string("published.memory.") + key;
    if (ok({k + ".stage"}) && point->stage < 0)
      p.add(k + ".stage=" + std::to_string(point->stage) + " must be >= 0 (a pipeline stage)");
    non_negative(k + ".value", point->bytes, "B");
  }
}

}  // namespace

}  // namespace dtsim
