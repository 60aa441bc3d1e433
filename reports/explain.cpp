#include "reports/explain.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include <fmt/format.h>

#include "models/errors.hpp"
#include "models/compute_cost.hpp"
#include "models/flops.hpp"
#include "models/moe.hpp"
#include "models/host_dispatch.hpp"
#include "models/memory.hpp"
#include "models/pipeline_split.hpp"
#include "models/precision.hpp"
#include "models/schedules/schedule.hpp"
#include "models/rank_grid.hpp"
#include "reports/summary.hpp"
#include "reports/terminal_text.hpp"

namespace dtsim {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;


std::string with_thousands(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  const int n = static_cast<int>(digits.size());
  for (int i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % 3 == 0) out += ',';
    out += digits[static_cast<size_t>(i)];
  }
  return (v < 0 ? "-" : "") + out;
}

/// Parameter counts in millions ("2,823.4M"): "B" would read as bytes next to GiB columns.
std::string count_text(double n) {
  if (n >= 1e6) {
    const int64_t tenths = std::llround(n / 1e5);
    return fmt::format("{}.{}M", with_thousands(tenths / 10), tenths % 10);
  }
  return with_thousands(static_cast<int64_t>(std::llround(n)));
}

std::string gib(double bytes) { return fmt::format("{:.2f}", bytes / kGiB); }

const char* short_phase(Phase p) {
  switch (p) {
    case Phase::forward: return "fwd";
    case Phase::backward: return "bwd";
    case Phase::recompute: return "recompute";
    case Phase::optimizer: return "optimizer";
  }
  return "?";
}

/// "0-6" / "3" / "0, 2, 5-7" from sorted stage indices.
std::string ranges(const std::vector<int64_t>& xs) {
  std::string out;
  for (size_t i = 0; i < xs.size();) {
    size_t j = i;
    while (j + 1 < xs.size() && xs[j + 1] == xs[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += j == i ? std::to_string(xs[i]) : fmt::format("{}-{}", xs[i], xs[j]);
    i = j + 1;
  }
  return out;
}

/// "x96 (stages 0-7)" or "x96 (stages 0-6), x100 (stage 7)"; stages with 0 calls left out.
std::string calls_text(const std::vector<int64_t>& calls) {
  std::map<int64_t, std::vector<int64_t>> by_count;
  for (size_t s = 0; s < calls.size(); ++s)
    if (calls[s] > 0) by_count[calls[s]].push_back(static_cast<int64_t>(s));
  std::vector<std::pair<int64_t, std::vector<int64_t>>> groups(by_count.begin(), by_count.end());
  std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.second.front() < b.second.front(); });
  std::string out;
  for (const auto& [n, stages] : groups) {
    if (!out.empty()) out += ", ";
    out += fmt::format("{} (stage{} {})", with_thousands(n), stages.size() > 1 ? "s" : "", ranges(stages));
  }
  return out;
}

const char* dimension_of(const Op& op, const Layout& l) {
  // The tied word embedding's gradient AllReduce between the first and the last pipeline
  // stage exists because PP splits the tied embedding: it belongs to PP, not to DP.
  if (op.group == GroupKind::EMB || op.group == GroupKind::MIRROR) return "PP";
  // Routed experts' gradients and parameters move over the expert-data-parallel group.
  if (op.group == GroupKind::EDP) return "EDP";
  switch (op.kind) {
    case CommKind::EP: return "EP";
    case CommKind::TP: return "TP";
    case CommKind::CP: return "CP";
    case CommKind::PP: return "PP";
    case CommKind::DP: return l.zero_stage >= 1 && op.collective != Collective::AllReduce ? "ZeRO" : "DP";
  }
  return "?";
}

int64_t first_rank_of_stage(const RankGrid& g, int64_t stage) {
  RankCoord c;
  c.pp = stage;
  return g.rank_of(c);
}

int64_t p2p_peer(const Op& op, int64_t stage, int64_t pp) {
  // Forward goes to the next pipeline rank, backward to the previous one; with interleaving
  // the last rank's chunk feeds the first rank's next chunk (wrap-around).
  const bool toward_next = (op.type == OpType::send) == (op.dir == Direction::forward);
  return toward_next ? (stage + 1) % pp : (stage - 1 + pp) % pp;
}

/// What a rank holds or does in one plan op, by op name (the plan's static names).
std::string op_meaning(const std::string& name, const Experiment& e) {
  const ModelSpec& m = e.model;
  const Layout& l = e.layout;
  const int64_t t = l.tp;
  const bool sp = l.sequence_parallel && t > 1;
  const std::string tokens = sp ? fmt::format("its {}-token shard (SP)", e.training.seq_len / l.cp / t)
                                : fmt::format("all {} tokens", e.training.seq_len / l.cp);
  auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  auto ends = [&](const char* p) {
    const std::string s(p);
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (ends("_wgrad"))
    return t > 1 ? "weight grad of its own shard (X^T dY_i): never reduced over TP" : "weight gradient";
  if (ends("_dgrad")) {
    if (starts("qkv") || starts("mlp_up") || starts("lm_head"))
      return t > 1 ? "partial input grad dY_i W_i^T: SUMmed over TP next" : "input gradient";
    return "input grad of its slice";
  }
  if (starts("input_norm") || starts("post_attention_norm") || starts("final_norm"))
    return (m.norm == Norm::rmsnorm ? "RMSNorm on " : "LayerNorm on ") + tokens + ", full h";
  if (starts("dropout_residual")) return "dropout + residual on " + tokens + ", full h";
  if (name == "qkv")
    return t > 1 ? fmt::format("column-parallel: Q,K,V of {} of {} heads ({} of {} KV heads)", m.heads / t, m.heads,
                               std::max<int64_t>(1, m.kv_heads / t), m.kv_heads)
                 : "Q, K, V projections";
  if (starts("rope")) return "rotary embedding of its heads";
  if (starts("attention") || starts("softmax"))
    return l.cp > 1 ? fmt::format("its {} heads, {} local queries vs all {} keys", m.heads / t, e.training.seq_len / l.cp,
                                  e.training.seq_len)
                    : fmt::format("core attention of its {} heads (independent per head)", m.heads / t);
  if (name == "out_proj")
    return t > 1 ? "row-parallel: rows of its heads -> partial sum of the output" : "output projection";
  if (name == "mlp_up" || name == "mlp_gate")
    return t > 1 ? fmt::format("column-parallel: {} of {} MLP columns", m.ffn_hidden / t, m.ffn_hidden) : "MLP up projection";
  if (starts("gelu") || starts("swiglu")) return fmt::format("element-wise on its {} columns", m.ffn_hidden / t);
  if (name == "mlp_down")
    return t > 1 ? "row-parallel: its MLP rows -> partial sum of the output" : "MLP down projection";
  if (starts("embedding"))
    return t > 1 ? fmt::format("vocab-parallel: rows {} of {} of the word embedding", m.vocab / t, m.vocab)
                 : "embedding lookup";
  if (name == "lm_head") return t > 1 ? fmt::format("vocab-parallel: logits of {} of {} words", m.vocab / t, m.vocab) : "LM head";
  if (starts("cross_entropy")) return "vocab-parallel cross entropy (fp32)";
  if (name == "optimizer_adam") return "Adam on the parameters it owns";
  // communication
  if (name == "tp_allgather") return "gather the SP token shards into the full sequence";
  if (name == "tp_allgather_input") return "re-gather the SP input for the weight grad (async, under the dgrad GEMM)";
  if (name == "tp_reducescatter") return "SUM of partial results, scattered back to token shards (SP)";
  if (name == "tp_allreduce") return "SUM of partial results (row-parallel output / column-parallel input grad)";
  if (name == "tp_allreduce_loss") return "SUM of max / exp-sum / target logit over the vocab shards (fp32)";
  if (name == "pp_tp_allgather") return "rebuild the full activation from the 1/t pieces sent by P2P";
  if (name == "cp_kv_allgather") return "K/V blocks of the other CP ranks' tokens";
  if (name == "cp_dkv_reducescatter") return "dK/dV SUMmed back at the ranks owning those tokens";
  if (name == "send_activation" || name == "recv_activation") return "stage output activation (1/t of it per TP rank)";
  if (name == "send_grad" || name == "recv_grad") return "gradient of that activation";
  if (name == "dp_grad_allreduce") return "AVG of the replicas' gradients (bucketed)";
  if (name == "dp_grad_reducescatter") return "AVG of gradients, each rank keeping its 1/N shard";
  if (name == "dp_param_allgather") return "gather the updated / needed parameter shards (16-bit)";
  if (name == "fsdp_param_copy_out") return "FSDP2 copy-out: the gathered flat buffer into the parameters";
  if (name == "fsdp_grad_copy_in") return "FSDP2 chunk_cat: the unsharded gradients into the reduce-scatter buffer";
  return "";
}

std::string collective_text(const ExplainCommRow& r) {
  if (r.type == OpType::send) return "send (P2P)";
  if (r.type == OpType::recv) return "recv (P2P)";
  return to_string(r.collective);
}

std::string path_text(OpType type, int32_t overlap_splits) {
  switch (type) {
    case OpType::collective: return overlap_splits > 0 ? "pipelined GEMM" : "critical path";
    case OpType::issue: return "overlaps (async)";
    case OpType::send:
    case OpType::recv: return "overlaps (P2P)";
    default: return "";
  }
}

std::string group_text(const ExplainCommRow& r) {
  if ((r.type == OpType::send || r.type == OpType::recv) && r.first_group.size() == 2)
    return fmt::format("{} -> {}", r.first_group[0], r.first_group[1]);
  return format_rank_list(r.first_group);
}

// ------------------------------------------------------------------ memory formulas ----
// Text of models/memory.cpp's branches (keep in step with it; test_explain checks that the
// printed lines add up to stage_memory's peak).

bool gpt_block(const ModelSpec& m) {
  return m.kv_heads == m.heads && m.ffn_hidden == 4 * m.hidden && m.activation == Activation::gelu &&
         m.heads * m.head_dim() == m.hidden;
}

struct Formula {
  std::string text;
  std::string source;
};

Formula layer_formula(const Experiment& e) {
  const ModelSpec& m = e.model;
  const Layout& l = e.layout;
  const bool sp = l.sequence_parallel;
  const bool flash = e.training.flash_attention;
  const bool scores = !flash && l.recompute == Recompute::none;
  const std::string tp_case = l.tp > 1 ? (sp ? "TP + SP" : "TP, no SP") : "no TP";
  Formula f;
  if (l.recompute == Recompute::full) {
    f.text = sp ? "2sbh/t (only the layer input, sequence-sharded)" : "2sbh (only the layer input)";
    f.source = "Korthikanti 2022 Table 2, full recompute";
    return f;
  }
  const std::string rc = to_string(l.recompute);
  if (gpt_block(m)) {
    if (sp) f.text = scores ? "sbh(34/t + 5as/(ht))" : "34sbh/t";
    else f.text = scores ? "sbh(10 + 24/t + 5as/(ht))" : "sbh(10 + 24/t)";
    f.source = fmt::format("Korthikanti 2022 Table 2, {}, recompute {}", tp_case, rc);
  } else {
    const std::string mlp = m.activation == Activation::swiglu ? "6sbf" : "4sbf";
    const std::string sharded = "4sbh + 4sb*kv + " + mlp + (scores ? " + 5a*s*s_kv*b" : "");
    f.text = sp ? "(10sbh + " + sharded + ")/t" : "10sbh + (" + sharded + ")/t";
    f.source = fmt::format("Korthikanti 2022 Sec 4.1 by tensor size (GQA / SwiGLU), {}, recompute {}", tp_case, rc);
  }
  if (flash && l.recompute == Recompute::none) f.source += "; FlashAttention keeps no s^2 scores";
  if (!flash && l.recompute == Recompute::selective) f.source += "; selective drops the 5as/(ht) score term";
  return f;
}

std::string layer_symbols(const Experiment& e) {
  const ModelSpec& m = e.model;
  const Layout& l = e.layout;
  std::string s = fmt::format("s = {}{}, b = {}, h = {}, a = {}, t = {}", e.training.seq_len / l.cp,
                              l.cp > 1 ? fmt::format(" (seq / CP), s_kv = {}", e.training.seq_len) : std::string(),
                              e.training.micro_batch, m.hidden, m.heads, l.tp);
  if (!gpt_block(m)) s += fmt::format(", kv = {}, f = {}", m.kv_heads * m.head_dim(), m.ffn_hidden);
  return s;
}

std::string inflight_formula(const Layout& l, int64_t m, int64_t layers) {
  switch (l.schedule) {
    case Schedule::gpipe:
      return fmt::format("GPipe: all m = {} micro-batches' forwards are held before the first backward", m);
    case Schedule::one_f_one_b:
      return fmt::format("1F1B: stage r holds min(p - r, m) micro-batches of its {} layers (Narayanan 2021 Sec 2.2.1; "
                         "Korthikanti 2022 Sec 4.2.3)",
                         layers % l.pp == 0 ? fmt::format("L/p = {}", layers / l.pp) : std::string("stage's"));
    case Schedule::interleaved:
      if (has_pipeline_split_options(l))  // uneven chunks (models/pipeline_split.hpp)
        return fmt::format("interleaved 1F1B, v = {}: min(2(p - r - 1) + (v - 1)p + 1, m v) chunks (Megatron-LM warm-up + "
                           "1), each with its own layers as the layout.* split options place them",
                           l.vp);
      return fmt::format("interleaved 1F1B, v = {}: min(2(p - r - 1) + (v - 1)p + 1, m v) chunks of L/(pv) = {} layers "
                         "(Megatron-LM warm-up + 1); stage 0: L(1 + (p-1)/(pv)) layers (Korthikanti 2022 Sec 4.2.3)",
                         l.vp, layers / (l.pp * l.vp));
    default: break;
  }
  return fmt::format("{}: the most chunk activations its order holds at once, each from its F to its backward's end "
                     "(W when split; {})",
                     to_string(l.schedule), sched::schedule_of(l.schedule).source());
}

/// The first passes of each pipeline rank's order (models/schedules/): "F3" forward of
/// micro-batch 3, "B3"/"W3" its input- and weight-gradient parts, "BW3" a fused backward;
/// a trailing "'" marks chunk 1, "''" chunk 2 and so on; "F5+BW2" a combined forward-backward
/// pass (sched::Step::paired).
std::string schedule_order_excerpt(const Layout& l, const Training& t, int64_t m) {
  constexpr size_t kSteps = 14;
  constexpr int64_t kRanks = 4;
  const sched::PipelineSchedule& s = sched::schedule_of(l.schedule);
  const auto order = s.order(sched::dims_of(l, t, m));
  std::string out;
  for (int64_t r = 0; r < l.pp; ++r) {
    if (r == kRanks && l.pp > kRanks + 1) {
      out += "; ...";
      r = l.pp - 1;
    }
    const auto& o = order[static_cast<size_t>(r)];
    std::string line;
    for (size_t k = 0; k < std::min(kSteps, o.size()); ++k)
      line += fmt::format("{}{}{}{}", k ? (o[k - 1].paired ? "+" : " ") : "", sched::to_string(o[k].pass), o[k].mb,
                          std::string(o[k].chunk, '\''));
    if (o.size() > kSteps) line += " ...";
    out += fmt::format("{}stage {}: {}", r ? "; " : "", r, line);
  }
  return out;
}

std::string convention_text(const Training& t) {
  const std::string g = t.main_grad == GradDtype::fp32 ? "4 B fp32" : "2 B bf16";
  switch (t.framework) {
    case Framework::megatron:
      return "megatron: 2 B params + " + g + " main grads + 12 B optimizer (Megatron Core developer guide, Distributed Optimizer)";
    case Framework::deepspeed:
      return "deepspeed: 2 B params + " + g + " grads + 12 B optimizer + 4 B fp32 grad partition + ipg buckets; "
             "with 16-bit grads ZeRO-2 states = 2P + 18P/N (DeepSpeed estimate_zero2_model_states_mem_needs)";
    case Framework::zero_paper:
      return "zero-paper: 2 B params + " + g + " grads + K = 12 B optimizer, nothing else (Rajbhandari 2020 Sec 3.1, Table 1)";
    case Framework::fsdp:
      return "fsdp: 4 B fp32 sharded params + 4 B fp32 sharded grads + 8 B Adam m, v; bf16 copies only while a "
             "layer is gathered (PyTorch FSDP2 MixedPrecisionPolicy(param_dtype=bf16)); reduce-scatter in " + g;
  }
  return "";
}

// `sharded`: what grad_sync_policy (models/plan.hpp) says, the fact memory and plan share.
std::string shard_text(bool sharded, int zero_stage, int64_t n, const std::string& note = "") {
  if (n <= 1) return "one replica (DP x CP = 1)";
  return sharded ? fmt::format("/ N, N = DP x CP = {} (ZeRO-{}{})", n, zero_stage, note)
                 : fmt::format("replicated over DP x CP (ZeRO-{})", zero_stage);
}

}  // namespace

std::string format_rank_list(const std::vector<int64_t>& ranks) {
  std::string out = "[";
  if (ranks.size() <= 8) {
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (i) out += ',';
      out += std::to_string(ranks[i]);
    }
    return out + "]";
  }
  for (size_t i = 0; i < 3; ++i) out += std::to_string(ranks[i]) + ",";
  return out + fmt::format("...,{}] ({} ranks)", ranks.back(), ranks.size());
}

std::vector<ExplainCommRow> explain_comm_rows(const StepPlan& plan) {
  const Layout& l = plan.exp.layout;
  const RankGrid grid(l);
  const size_t stages = static_cast<size_t>(l.pp);
  using Key = std::tuple<std::string, std::string, int, int, int, int, int, int>;
  std::map<Key, size_t> index;
  std::vector<ExplainCommRow> rows;
  for (const StagePlan& sp : plan.stages) {
    if (sp.stage < 0 || sp.stage >= l.pp)
      throw InputError("explain: plan stage " + std::to_string(sp.stage) + " outside layout.pp=" + std::to_string(l.pp));
    const size_t st = static_cast<size_t>(sp.stage);
    for (const Op& op : sp.ops) {
      if (op.type == OpType::compute || op.type == OpType::wait) continue;
      const bool p2p = op.type == OpType::send || op.type == OpType::recv;
      const std::string dim = dimension_of(op, l);
      const Key key{dim, op.name, static_cast<int>(op.phase), static_cast<int>(op.type),
                    p2p ? -1 : static_cast<int>(op.collective), static_cast<int>(op.reduce), static_cast<int>(op.group),
                    op.overlap_splits};
      auto it = index.find(key);
      if (it == index.end()) {
        ExplainCommRow r;
        r.dimension = dim;
        r.op = op.name;
        r.phase = op.phase;
        r.type = op.type;
        r.collective = op.collective;
        r.reduce = op.reduce;
        r.group = op.group;
        r.overlap_splits = op.overlap_splits;
        const int64_t first = first_rank_of_stage(grid, sp.stage);
        if (p2p) {
          const int64_t peer = first_rank_of_stage(grid, p2p_peer(op, sp.stage, l.pp));
          r.first_group = op.type == OpType::send ? std::vector<int64_t>{first, peer} : std::vector<int64_t>{peer, first};
        } else {
          r.first_group = grid.group_of(first, op.group);
        }
        r.size_min = r.size_max = op.size_bytes;
        r.sent_min = r.sent_max = op.type == OpType::recv ? op.size_bytes : -1;
        r.calls_per_stage.assign(stages, 0);
        r.sent_per_stage.assign(stages, 0.0);
        it = index.emplace(key, rows.size()).first;
        rows.push_back(std::move(r));
      }
      ExplainCommRow& r = rows[it->second];
      double sent = 0;
      if (op.type == OpType::send) sent = op.size_bytes;
      else if (op.type == OpType::recv) sent = 0;  // the peer's send carries it
      else sent = ring_cost(op.collective, static_cast<int64_t>(r.first_group.size()), op.size_bytes).edge_bytes;
      const double per_call = op.type == OpType::recv ? op.size_bytes : sent;
      r.size_min = std::min(r.size_min, op.size_bytes);
      r.size_max = std::max(r.size_max, op.size_bytes);
      r.sent_min = r.sent_max < 0 ? per_call : std::min(r.sent_min, per_call);
      r.sent_max = std::max(r.sent_max, per_call);
      r.calls_per_stage[st] += 1;
      r.sent_per_stage[st] += sent;
    }
  }
  return rows;
}

std::string format_explain(const Experiment& exp, const StepPlan& plan, const ExplainEpReach* ep_reach) {
  const ModelSpec& m = exp.model;
  const Layout& l = exp.layout;
  const Training& tr = exp.training;
  const RankGrid grid(l);
  const int64_t gpn = std::max<int64_t>(1, exp.cluster.gpus_per_node);
  const int64_t n_dpcp = l.dp * l.cp;
  const int64_t accumulation = tr.accumulation(l);
  const std::vector<ExplainCommRow> rows = explain_comm_rows(plan);
  std::ostringstream os;

  os << fmt::format("dtsim explain: {}\n", printable(exp.title.empty() ? m.name : exp.title));
  if (!exp.source.empty()) os << fmt::format("  file      {}\n", printable(exp.source));
  os << fmt::format("  world     {} GPUs = DP {} x TP {} x CP {} x PP {}{}; rank = tp + TP*(cp + CP*(dp + DP*pp)), "
                    "GPU r on node r / {}\n",
                    grid.world(), l.dp, l.tp, l.cp, l.pp,
                    l.schedule == Schedule::interleaved ? fmt::format(" (VP {})", l.vp) : std::string(), gpn);
  os << fmt::format("  batch     {} sequences x {} tokens per step = micro-batch {} x DP {} x {} micro-batches "
                    "(only DP multiplies independent data)\n",
                    tr.global_batch, tr.seq_len, tr.micro_batch, l.dp, accumulation);
  {
    // The precision recipe (models/precision.hpp), read from the plan's ops: what runs at
    // which rate, and the casts it adds on stage 0.
    const PrecisionRecipe& rec = precision_recipe(tr.precision);
    const GpuSpec& gpu = exp.cluster.gpu;
    if (!rec.low_precision()) {
      os << fmt::format("  precision bf16: every GEMM at the BF16 rate {:.0f} TFLOP/s\n", gpu.peak_bf16_flops / 1e12);
    } else {
      double cast_bytes = 0, cast_time = 0, weight_cast = 0;
      int64_t casts = 0;
      for (const Op& op : plan.stages.front().ops) {
        const std::string_view n = op.name;
        if (n == "quantize" || n == "quantize_grad") cast_bytes += op.bytes, cast_time += op.time_s, ++casts;
        if (n == "weight_quantize") weight_cast += op.bytes;
      }
      const int64_t low =
          static_cast<int64_t>(std::llround(low_precision_layer_fraction(tr, m.layers) * static_cast<double>(m.layers)));
      os << fmt::format(
          "  precision {} ({}): the linear GEMMs of {} of {} layers at the {} rate {:.0f} TFLOP/s; attention core, LM "
          "head, router{} in BF16 ({:.0f} TFLOP/s). Casts on stage 0: {} per step, {} read + written, {:.3g} ms; "
          "weights once per step, {}. Source: {}\n",
          rec.name, rec.megatron, low, m.layers, to_string(rec.gemm_dtype),
          gemm_peak_flops(gpu, rec.gemm_dtype) / 1e12, tr.first_last_layers_bf16 ? ", first / last layers" : "",
          gpu.peak_bf16_flops / 1e12, casts, format_bytes(cast_bytes), cast_time * 1e3, format_bytes(weight_cast),
          rec.source);
    }
  }
  os << "  method    for each split: which dimension is cut, and does a rank hold independent data, a slice of one\n"
        "            result, or a shard of state? That decides the collective, its reduce op, its size and whether\n"
        "            it can hide behind compute. Every line below is read from the step plan `dtsim run` simulates.\n";

  // ---------------------------------------------------------------- 1. dimensions
  os << "\n1. What each rank holds, per parallel dimension\n";
  auto dim_rows = [&](const std::string& dim) {
    std::vector<const ExplainCommRow*> out;
    for (const auto& r : rows)
      if (r.dimension == dim) out.push_back(&r);
    return out;
  };
  auto dim_block = [&](const std::string& dim, int64_t size, const std::string& split, const std::string& holds,
                       GroupKind gk) {
    os << fmt::format("  {} = {}   split: {}\n", dim, size, split);
    os << fmt::format("    holds     {}\n", holds);
    const auto rs = dim_rows(dim);
    if (rs.empty() && dim == "DP" && l.zero_stage >= 1 && n_dpcp > 1) {
      os << fmt::format("    talks     gradient ReduceScatter AVG + parameter AllGather over DP x CP {}: see ZeRO\n",
                        format_rank_list(grid.group_of(0, GroupKind::DPxCP)));
      return;
    }
    if (rs.empty()) {
      os << fmt::format("    talks     nothing{}\n",
                        size <= 1 && dim != "ZeRO" ? fmt::format(" ({} = 1)", dim) : std::string());
      return;
    }
    std::set<std::string> kinds;
    bool any_avg = false, any_sum = false, blocking = false, async = false;
    for (const auto* r : rs) {
      std::string k = collective_text(*r);
      if (r->reduce != ReduceOp::none) k += std::string(" ") + to_string(r->reduce);
      kinds.insert(k);
      any_avg |= r->reduce == ReduceOp::avg;
      any_sum |= r->reduce == ReduceOp::sum;
      (r->critical_path() ? blocking : async) = true;
    }
    std::string talks;
    for (const auto& k : kinds) talks += (talks.empty() ? "" : ", ") + k;
    if (any_sum && !any_avg && dim == "TP") talks += "  (SUM, never divided by TP)";
    os << fmt::format("    talks     {}\n", talks);
    const std::vector<int64_t> g = grid.group_of(0, gk);
    std::set<int64_t> nodes;
    for (int64_t r : g) nodes.insert(r / gpn);
    os << fmt::format("    group     {} of rank 0{}\n", format_rank_list(g),
                      nodes.size() == 1 ? " (inside one node: NVLink)" : fmt::format(" (spans {} nodes)", nodes.size()));
    // The busiest stage: most bytes sent per rank per step.
    size_t busiest = 0;
    double best = -1;
    std::vector<int64_t> calls(static_cast<size_t>(l.pp), 0);
    std::vector<double> sent(static_cast<size_t>(l.pp), 0.0);
    for (const auto* r : rs)
      for (size_t s = 0; s < calls.size(); ++s) {
        calls[s] += r->calls_per_stage[s];
        sent[s] += r->sent_per_stage[s];
      }
    for (size_t s = 0; s < sent.size(); ++s)
      if (sent[s] > best) best = sent[s], busiest = s;
    os << fmt::format("    per step  {} calls, {} sent per rank{}\n", with_thousands(calls[busiest]),
                      format_bytes(sent[busiest]), l.pp > 1 ? fmt::format(" (stage {}, the busiest)", busiest) : std::string());
    os << fmt::format("    path      {}\n", blocking && async ? "both: blocking collectives on the critical path, async ones overlapped"
                                             : blocking     ? "on the critical path (blocking collectives)"
                                                            : "overlaps compute (asynchronous)");
  };
  dim_block("DP", l.dp, "batch",
            fmt::format("independent samples ({} sequence{} per micro-batch) and a full replica of its stage's weights",
                        tr.micro_batch, tr.micro_batch > 1 ? "s" : ""),
            GroupKind::DPxCP);
  {
    std::string holds = l.tp > 1 ? fmt::format("a slice of one matmul: {} of {} heads, {} of {} MLP columns, {} of {} vocab rows",
                                               m.heads / l.tp, m.heads, m.ffn_hidden / l.tp, m.ffn_hidden, m.vocab / l.tp, m.vocab)
                                 : "everything (no tensor parallelism)";
    if (l.tp > 1 && l.sequence_parallel)
      holds += fmt::format("; with SP a {}-token shard of norm / dropout activations", tr.seq_len / l.cp / l.tp);
    if (l.tp > 1 && m.mla.enabled())
      holds += fmt::format(
          "; MLA (models/blocks/mla.hpp): the whole down projections (h -> {} + {} + {}, duplicated on every TP "
          "rank{}), then {} of {} heads of the up projections; {}",
          m.mla.q_lora_rank, m.mla.kv_lora_rank, m.mla.qk_rope_head_dim,
          l.sequence_parallel ? ", run on its token shard" : ", run on all tokens", m.heads / l.tp, m.heads,
          l.sequence_parallel ? "the latents are all-gathered (not the hidden state) and their gradients "
                                "reduce-scattered (SUM); the down projections' weight gradients are SUMmed over TP "
                                "with the norms' at the end of the step"
                              : "the latents' input gradients are all-reduced (SUM)");
    dim_block("TP", l.tp, "hidden / heads", holds, GroupKind::TP);
  }
  dim_block("CP", l.cp, "sequence",
            l.cp > 1 ? fmt::format("a token shard of each sequence: {} of {} query tokens, all keys via the ring",
                                   tr.seq_len / l.cp, tr.seq_len)
                     : "whole sequences (no context parallelism)",
            GroupKind::CP);
  if (m.moe.enabled()) {
    // Experts (models/blocks/moe.hpp, models/moe.hpp): parallel folding regroups the stage's
    // ranks as ETP x EP x EDP (models/rank_grid.hpp).
    const int64_t etp = l.expert_tp(), edp = l.edp();
    const MoeTokens tk = moe_tokens(exp, static_cast<double>(tr.micro_batch));
    dim_block("EP", l.ep, "experts",
              fmt::format("{} of {} routed experts of each MoE layer ({} moe_ffn columns of {} each with ETP {}); its "
                          "{:.0f} tokens per micro-batch pick top-{} and travel to the experts' ranks",
                          m.moe.num_experts / l.ep, m.moe.num_experts, m.moe.moe_ffn_hidden / etp, m.moe.moe_ffn_hidden,
                          etp, tk.tokens, m.moe.router_topk),
              GroupKind::EP);
    os << "    why       dispatch and combine are AllToAll: a permutation of token rows between ranks, not a reduction\n"
          "              (no SUM or AVG); the weighted sum of a token's top-k expert outputs (router probabilities)\n"
          "              happens after the combine, on the token's own rank\n";
    {
      // How the dispatch travels (training.moe_token_dispatcher) and the SMs its kernels hold
      // (Op::comm_sms, the plan's); per call: the plan's buffer, one copy per (token, expert).
      double buffer = 0, sms = 0;
      for (const auto& sp : plan.stages)
        for (const Op& op : sp.ops)
          if (op.group == GroupKind::EP && op.collective == Collective::AllToAll &&
              (op.type == OpType::issue || op.type == OpType::collective)) {
            buffer = std::max(buffer, op.size_bytes);
            sms = comm_kernel_sms(op);
          }
      const int64_t sm_count = exp.cluster.gpu.sm_count;
      const std::string held =
          sm_count > 0 ? fmt::format(";\n              its kernels hold {:.0f} of {} SMs while they run (Op::comm_sms)", sms, sm_count)
                       : std::string();
      if (tr.moe_token_dispatcher == "alltoall") {
        os << fmt::format("    moves     training.moe_token_dispatcher=alltoall: NCCL's AllToAll, one copy of a token per\n"
                          "              expert it picks ({} per call per rank, (n-1)/n of it to other ranks){}\n",
                          format_bytes(buffer), held);
      } else if (ep_reach && ep_reach->members > 1) {
        const double token = buffer / static_cast<double>(std::max<int64_t>(1, m.moe.router_topk));
        os << fmt::format(
            "    moves     training.moe_token_dispatcher={} (sim/collectives/alltoall_deepep.cpp): a token crosses the\n"
            "              network once per remote node it reaches ({:.2f} of {} other nodes on average) and NVLink\n"
            "              once per other rank holding its experts ({:.2f} of {}); per call one rank sends {} over\n"
            "              RDMA and {} over NVLink, against a {} buffer of top-{} copies{}\n",
            tr.moe_token_dispatcher, ep_reach->remote_nodes, std::max<int64_t>(0, ep_reach->nodes - 1),
            ep_reach->other_members, ep_reach->members - 1, format_bytes(token * ep_reach->remote_nodes),
            format_bytes(token * ep_reach->other_members), format_bytes(buffer), m.moe.router_topk, held);
      } else {
        os << fmt::format("    moves     training.moe_token_dispatcher={}: once per node and rank a token reaches{}\n",
                          tr.moe_token_dispatcher, held);
      }
    }
    if (tr.overlap_moe_expert_parallel_comm) {
      // Combined forward-backward passes (models/combined_1f1b.hpp): the plan's paired steps.
      const sched::PipelineSchedule& sch = sched::schedule_of(l.schedule);
      const sched::Dims dims = sched::dims_of(l, tr, tr.accumulation(l));
      const auto order = sch.order(dims);
      int64_t pairs = 0, steps = 0;
      for (const sched::Step& st : order.front()) {
        pairs += st.paired ? 1 : 0;
        steps += st.pass == sched::Pass::F ? 1 : 0;
      }
      os << fmt::format(
          "    overlap   training.overlap_moe_expert_parallel_comm: {} of stage 0's {} forwards run merged with a\n"
          "              backward of another micro-batch (Megatron-Core's combined 1F1B / DualPipe's overlapped\n"
          "              chunks): per layer pair the combine's backward travels beside the forward's attention, the\n"
          "              dispatch beside the backward's experts, the dispatch's backward beside the forward's experts\n"
          "              and the combine beside the backward's attention{}\n",
          pairs, steps,
          l.schedule == Schedule::dualpipe || l.schedule == Schedule::dualpipev
              ? ""
              : ";\n              one more warm-up forward makes each pair's micro-batches independent (one more held)");
    }
    os << fmt::format("    load      busiest EP rank at {:.3f} x the mean tokens (model.moe.load_balancing={}{}): it sets the\n"
                      "              grouped GEMM and AllToAll time of every rank of its group\n",
                      tk.load, to_string(m.moe.balance),
                      m.moe.capacity_factor > 0 ? fmt::format(", capacity factor {}", m.moe.capacity_factor) : std::string());
    os << fmt::format("  EDP = {}   expert data parallel: ranks holding the same experts = tp x cp x dp / (etp x ep)\n", edp);
    const auto edp_rows = dim_rows("EDP");
    std::set<std::string> kinds;
    for (const auto* r : edp_rows)
      kinds.insert(collective_text(*r) + (r->reduce != ReduceOp::none ? std::string(" ") + to_string(r->reduce) : ""));
    std::string talks;
    for (const auto& k : kinds) talks += (talks.empty() ? "" : ", ") + k;
    os << fmt::format("    talks     {}\n", talks.empty() ? std::string("nothing (EDP = 1)") : talks);
    os << fmt::format("    group     {} of rank 0\n", format_rank_list(grid.group_of(0, GroupKind::EDP)));
    os << "    why       expert weight gradients are reduced over EDP, not over DP x CP: only these ranks hold the same\n"
          "              experts; each already sums its EP group's tokens, so the SUM over EDP scaled by 1/(DP x CP)\n"
          "              (Megatron-Core expert_gradient_scaling_factor) is the full-batch mean. Dense gradients: DP x CP.\n";
  }
  {
    const int64_t per = stage_layer_count(m, l, 0);
    int64_t lo = per, hi = per;
    for (int64_t s = 1; s < l.pp; ++s) {
      lo = std::min(lo, stage_layer_count(m, l, s));
      hi = std::max(hi, stage_layer_count(m, l, s));
    }
    // Megatron-Core's split options (models/pipeline_split.hpp): name the one that is set.
    const std::string option = !l.pipeline_layout.empty() ? "layout.pipeline_layout=" + l.pipeline_layout
                               : l.decoder_first_pipeline_num_layers > 0 || l.decoder_last_pipeline_num_layers > 0
                                   ? std::string("layout.decoder_first/last_pipeline_num_layers")
                               : has_pipeline_split_options(l)
                                   ? std::string("the embedding and loss take a layer's slot, layout.account_for_*")
                                   : std::string();
    std::string holds = lo == hi ? fmt::format("a stage of layers: {} of {} layers", per, m.layers)
                        : option.empty()
                            ? fmt::format("a stage of layers: {} to {} of {} layers (the first and last stages hold "
                                          "fewer, Llama 3 rule)", lo, hi, m.layers)
                            : fmt::format("a stage of layers: {} to {} of {} layers ({})", lo, hi, m.layers, option);
    if (l.schedule == Schedule::interleaved && !option.empty()) {
      // Each chunk of stage 0 as pipeline_split places it (virtual_stage_of).
      std::string stage0;
      for (int64_t c = 0; c < l.vp; ++c) {
        const VirtualStage vs = virtual_stage(m.layers, l, virtual_stage_of(l, 0, c));
        std::string what = vs.layers == 0 ? std::string("no layer")
                           : vs.layers == 1 ? fmt::format("{}", vs.first_layer)
                                            : fmt::format("{}-{}", vs.first_layer, vs.first_layer + vs.layers - 1);
        stage0 += fmt::format("{}{}{}", c ? ", " : "", vs.embedding ? "E+" : "", what);
      }
      holds += fmt::format(" as {} chunks (stage 0: layers {}{})", l.vp, stage0, lo == hi ? "; " + option : "");
    } else if (l.schedule == Schedule::interleaved) {
      // Megatron's interleaved placement: chunk c of pipeline rank r holds layers from (c p + r) L/(p v).
      const int64_t chunk = per / l.vp;
      std::string stage0;
      for (int64_t c = 0; c < l.vp; ++c) stage0 += fmt::format("{}{}-{}", c ? ", " : "", c * l.pp * chunk, c * l.pp * chunk + chunk - 1);
      holds += fmt::format(" as {} chunks of {} (stage 0: layers {})", l.vp, chunk, stage0);
    }
    if (l.pp > 1)
      holds += loss_stage_embeds(m) ? "; embedding on stage 0, LM head + loss on the last, the word embedding on both "
                                      "(tied or for MTP; its gradient summed between them)"
                                    : "; embedding on stage 0, LM head + loss on the last";
    if (m.mtp_layers > 0)
      holds += fmt::format("; with the loss {} multi-token prediction depth(s) (entry, one layer of the last layer's "
                           "kind, the shared LM head)",
                           m.mtp_layers);
    holds += fmt::format("; schedule {}", to_string(l.schedule));
    if (l.pp > 1) holds += " (order: " + schedule_order_excerpt(l, tr, tr.accumulation(l)) + ")";
    dim_block("PP", l.pp, "layers", holds, GroupKind::PP);
  }
  {
    std::string holds;
    if (l.zero_stage == 0) holds = "full model states on every DP rank (ZeRO-0)";
    else
      holds = fmt::format("a 1/{} shard of the optimizer state{}{} over DP x CP", n_dpcp, l.zero_stage >= 2 ? ", gradients" : "",
                          l.zero_stage >= 3 ? " and parameters" : "");
    dim_block("ZeRO", l.zero_stage, "ownership of W, dW, Adam m, v", holds, GroupKind::DPxCP);
  }

  // ---------------------------------------------------------------- 2. ops
  os << "\n2. Every communication op of one step (from the plan; size = nccl-tests buffer, sent = bytes one rank sends)\n";
  if (rows.empty()) {
    os << "  none: every dimension has size 1\n";
  } else {
    os << fmt::format("  {:<4} {:<21} {:<9} {:<13} {:<6} {:<26} {:>10} {:>10}  {:<16} {}\n", "dim", "op", "phase",
                      "collective", "reduce", "group (first)", "size/call", "sent/call", "path", "calls per step per rank");
    for (const auto& r : rows) {
      const std::string size = r.size_min == r.size_max ? format_bytes(r.size_max) : "<=" + format_bytes(r.size_max);
      const std::string sent = r.type == OpType::recv ? std::string("-")
                               : r.sent_min == r.sent_max ? format_bytes(r.sent_max)
                                                          : "<=" + format_bytes(r.sent_max);
      os << fmt::format("  {:<4} {:<21} {:<9} {:<13} {:<6} {:<26} {:>10} {:>10}  {:<16} {}\n", r.dimension, r.op,
                        short_phase(r.phase), collective_text(r), r.reduce == ReduceOp::none ? "-" : to_string(r.reduce),
                        group_text(r), size, sent, path_text(r.type, r.overlap_splits), calls_text(r.calls_per_stage));
    }
    os << "  critical path = a blocking collective the compute stream waits for; overlaps = issued asynchronously\n"
          "  and joined later (it costs time only if still running at the join), or a P2P transfer; pipelined GEMM =\n"
          "  split into chunks that run under the adjacent GEMM (training.tp_comm_overlap, Transformer Engine).\n"
          "  group (first) = the group of the first rank of the first stage running the op; P2P: sender rank -> receiver\n"
          "  rank (with interleaving the last stage feeds stage 0's next chunk). sent/call for a ring collective over n\n"
          "  ranks: AllReduce 2(n-1)/n x size, ReduceScatter and AllGather (n-1)/n x size (nccl-tests busbw factors).\n";
  }

  // ---------------------------------------------------------------- 3. one layer
  {
    const StagePlan& s0 = plan.stages.front();
    const int32_t layer = static_cast<int32_t>(s0.first_layer);
    os << fmt::format("\n3. One transformer layer on one rank (stage 0, layer {}, micro-batch 0), in plan order\n", layer);
    os << fmt::format("  {:<9} {:<22} {:>11}  {}\n", "phase", "op", "GFLOP/rank", "what the rank holds or does -> communication");
    std::map<int32_t, std::string> issued;
    for (const Op& op : s0.ops) {
      if (op.layer != layer || op.micro_batch != 0) continue;
      if (op.type == OpType::wait) {
        auto it = issued.find(op.handle);
        os << fmt::format("  {:<9} {:<22} {:>11}  wait for {} (joins the async op)\n", short_phase(op.phase), "wait", "",
                          it == issued.end() ? "?" : it->second);
        continue;
      }
      if (op.type == OpType::issue) issued[op.handle] = op.name;
      std::string what = op_meaning(op.name, exp);
      std::string fl = op.type == OpType::compute && op.flops > 0 ? fmt::format("{:.1f}", op.flops / 1e9) : "";
      if (op.type != OpType::compute) {
        const bool p2p = op.type == OpType::send || op.type == OpType::recv;
        const std::string coll = p2p ? (op.type == OpType::send ? "send" : "recv") : to_string(op.collective);
        what = fmt::format("[{} {}{} over {} {}, {}, {}] {}", to_string(op.kind), coll,
                           op.reduce == ReduceOp::none ? "" : std::string(" ") + to_string(op.reduce), to_string(op.group),
                           format_rank_list(grid.group_of(first_rank_of_stage(grid, 0), op.group)), format_bytes(op.size_bytes),
                           path_text(op.type, op.overlap_splits), what);
      }
      os << fmt::format("  {:<9} {:<22} {:>11}  {}\n", short_phase(op.phase), op.name, fl, what);
    }
  }

  // ---------------------------------------------------------------- 4. gradient rules
  {
    int64_t tp_avg = 0, tp_ops = 0, dp_avg = 0, dp_ops = 0, dp_not_dpxcp = 0;
    for (const auto& r : rows) {
      int64_t n = 0;
      for (int64_t c : r.calls_per_stage) n += c;
      if (r.dimension == "TP") {
        tp_ops += n;
        if (r.reduce == ReduceOp::avg) tp_avg += n;
      }
      if ((r.dimension == "DP" || r.dimension == "ZeRO") && r.reduce != ReduceOp::none) {
        dp_ops += n;
        if (r.reduce == ReduceOp::avg) dp_avg += n;
        if (r.group != GroupKind::DPxCP) dp_not_dpxcp += n;
      }
    }
    const std::string scope =
        l.pp > 1 ? fmt::format(" summed over the {} pipeline stages (one rank each)", l.pp) : std::string(" per rank");
    os << "\n4. Gradient rules, checked against the plan\n";
    os << "  loss    mean over valid tokens, L = (1/N_valid) sum_i l_i, with a GLOBAL denominator N_valid.\n";
    os << fmt::format("  TP      a rank's weight gradient dW_i = X^T dY_i belongs to its own shard: never reduced, never\n"
                      "          averaged over TP. TP reduces only partial outputs and input gradients, by SUM.\n"
                      "          plan: {} TP ops per step{}, {} with AVG.\n",
                      with_thousands(tp_ops), scope, tp_avg);
    if (n_dpcp > 1) {
      os << fmt::format("  DP      ranks holding the same weights (DP x CP = {}, group {}) AVG their gradients: the mean of\n"
                        "          equal-size local means equals the global mean. With unequal valid tokens per rank (padding),\n"
                        "          the exact rule is SUM of per-rank token-gradient sums / global N_valid, not the mean of\n"
                        "          per-rank means (e.g. token losses {{1,2,3}} and {{4}}: 10/4 = 2.5, not (2+4)/2 = 3).\n"
                        "          plan: {} gradient reductions per step{}, {} with AVG, {} outside the DP x CP group.\n",
                        n_dpcp, format_rank_list(grid.group_of(0, GroupKind::DPxCP)), with_thousands(dp_ops), scope, dp_avg,
                        dp_not_dpxcp);
    } else {
      os << "  DP      DP x CP = 1: one replica, no gradient reduction in this layout. (With DP > 1 gradients are AVG\n"
            "          over DP x CP; with unequal valid tokens: SUM of token-gradient sums / global N_valid.)\n";
    }
    if (l.cp > 1)
      os << "  CP      dK/dV of a rank's keys computed elsewhere are SUMmed back at the owner; weight gradients are\n"
            "          then reduced with DP over the DP x CP group.\n";
    os << "  Adam    runs after the gradient sync (the optimizer op follows the last DP wait); averaging parameters\n"
          "          after local Adam steps would not be equivalent.\n";
  }

  // ---------------------------------------------------------------- 5. rank grid
  {
    os << fmt::format("\n5. Rank grid ({} GPU{}, {} per node)\n", grid.world(), grid.world() == 1 ? "" : "s", gpn);
    std::vector<std::pair<GroupKind, std::string>> kinds = {
        {GroupKind::TP, "TP"}, {GroupKind::CP, "CP"}, {GroupKind::DP, "DP"}, {GroupKind::PP, "PP"}};
    if (l.cp > 1) kinds.push_back({GroupKind::DPxCP, "DPxCP"});
    if (m.moe.enabled())
      kinds.insert(kinds.end(), {{GroupKind::EP, "EP"}, {GroupKind::ETP, "ETP"}, {GroupKind::EDP, "EDP"}});
    constexpr size_t kListed = 4;
    for (const auto& [k, name] : kinds) {
      const auto gs = grid.groups(k);
      if (gs.front().size() == 1) {
        os << fmt::format("  {:<5} size 1: no groups\n", name);
        continue;
      }
      std::string list;
      for (size_t i = 0; i < gs.size() && i < kListed; ++i) list += (i ? ", " : "") + format_rank_list(gs[i]);
      if (gs.size() > kListed) list += fmt::format(", ... ({} groups)", gs.size());
      size_t max_nodes = 0;
      for (const auto& g : gs) {
        std::set<int64_t> nodes;
        for (int64_t r : g) nodes.insert(r / gpn);
        max_nodes = std::max(max_nodes, nodes.size());
      }
      os << fmt::format("  {:<5} groups {}   {}\n", name, list,
                        max_nodes == 1 ? "(each inside one node)" : fmt::format("(each spans {} nodes)", max_nodes));
    }
    if (l.cp > 1) os << "  DPxCP is the gradient-reduction group (ranks holding the same weights).\n";
  }

  // ---------------------------------------------------------------- 6. memory
  {
    const std::vector<MemoryBreakdown> mem = memory_per_stage(exp);
    std::vector<int64_t> cols;
    int64_t peak_stage = 0;
    for (int64_t s = 0; s < l.pp; ++s)
      if (mem[static_cast<size_t>(s)].peak_bytes > mem[static_cast<size_t>(peak_stage)].peak_bytes) peak_stage = s;
    if (l.pp <= 8) {
      for (int64_t s = 0; s < l.pp; ++s) cols.push_back(s);
    } else {
      std::set<int64_t> pick = {0, 1, l.pp / 2, l.pp - 2, l.pp - 1, peak_stage};
      cols.assign(pick.begin(), pick.end());
    }
    std::vector<ActivationBreakdown> act;
    std::vector<StageBuffers> buf;
    std::vector<double> params;
    for (int64_t s : cols) {
      act.push_back(stage_activations(exp, s));
      buf.push_back(stage_buffers(exp, s));
      params.push_back(stage_parameters_per_rank(m, l, tr.seq_len, s));
    }
    os << "\n6. Memory per rank by pipeline stage (GiB = 2^30 B)\n";
    os << fmt::format("  convention  {}\n", convention_text(tr));
    if ((tr.framework == Framework::megatron) != (tr.main_grad == GradDtype::fp32))
      os << fmt::format("              (training.main_grad = {} overrides the convention's {} gradients)\n",
                        to_string(tr.main_grad), tr.framework == Framework::megatron ? "fp32" : "16-bit");
    if (l.pp > 8) os << fmt::format("  showing stages {} of 0-{} (stage {} has the largest peak)\n", ranges(cols), l.pp - 1, peak_stage);
    std::string head = fmt::format("  {:<22}", "");
    for (int64_t s : cols) head += fmt::format(" {:>9}", fmt::format("stage {}", s));
    os << head << "\n";
    auto row = [&](const std::string& name, const std::vector<std::string>& vals, const std::string& formula) {
      std::string line = fmt::format("  {:<22}", name);
      for (const auto& v : vals) line += fmt::format(" {:>9}", v);
      os << line << "\n";
      if (!formula.empty()) os << "      " << formula << "\n";
    };
    auto bytes_row = [&](const std::string& name, auto get, const std::string& formula, bool always) {
      std::vector<std::string> vals;
      bool any = false;
      for (size_t i = 0; i < cols.size(); ++i) {
        const double v = get(i);
        any |= v != 0;
        vals.push_back(gib(v));
      }
      if (any || always) row(name, vals, formula);
    };
    const BytesPerParameter bpp = bytes_per_parameter(tr.framework, tr.main_grad);
    const GradSyncPolicy gs = grad_sync_policy(l, tr);
    {
      std::vector<std::string> vals;
      for (double p : params) vals.push_back(count_text(p));
      row("P (parameters / rank)", vals,
          fmt::format("L/p layers x per-layer params / t; + embedding V h / t on stage 0; + LM head on the last stage{}{}",
                      m.tied_embeddings && l.pp > 1 ? " (Megatron's copy of the tied embedding)" : "",
                      m.mtp_layers > 0 ? fmt::format("; + {} MTP depth(s) there: a layer each, eh_proj 2h h / t, 3 norms{}",
                                                     m.mtp_layers,
                                                     !m.tied_embeddings && l.pp > 1 ? ", Megatron's copy of the embedding"
                                                                                    : "")
                                       : std::string()));
    }
    auto mb_of = [&](size_t i) { return mem[static_cast<size_t>(cols[i])]; };
    bytes_row("params", [&](size_t i) { return mb_of(i).params_bytes; },
              fmt::format("{:g} B x P (16-bit weights), {}", bpp.params, shard_text(gs.sharded_params, l.zero_stage, n_dpcp)), true);
    {
      std::string g;
      if (tr.framework == Framework::megatron)
        g = fmt::format("{:g} B x P ({} main_grad: Megatron's contiguous grad buffer; its DDP buckets are views into it)",
                        bpp.grads, to_string(tr.main_grad));
      else
        g = fmt::format("{:g} B x P ({} gradients)", bpp.grads, to_string(tr.main_grad));
      const std::string note =
          gs.sharded_grads && !gs.per_layer ? ": each micro-batch's gradients reduce-scattered in its backward" : "";
      bytes_row("grads", [&](size_t i) { return mb_of(i).grads_bytes; },
                g + ", " + shard_text(gs.sharded_grads, l.zero_stage, n_dpcp, note), true);
    }
    bytes_row("optimizer", [&](size_t i) { return mb_of(i).optimizer_bytes; },
              fmt::format("{:g} B x P (fp32 master + Adam m + v), {}", bpp.optimizer, shard_text(gs.sharded_optimizer, l.zero_stage, n_dpcp)), true);
    {
      const Formula f = layer_formula(exp);
      std::vector<std::string> vals;
      for (const auto& a : act) vals.push_back(fmt::format("{:.1f} MiB", a.per_layer_bytes / kMiB));
      row("  per layer, per mb", vals, fmt::format("{} with {} ({})", f.text, layer_symbols(exp), f.source));
      vals.clear();
      for (const auto& a : act)
        vals.push_back(l.schedule != Schedule::interleaved ? fmt::format("{} mb", a.inflight)
                       : a.inflight * a.chunk_layers == a.held_layers
                           ? fmt::format("{}x{}L", a.inflight, a.chunk_layers)
                           : fmt::format("{} ch {}L", a.inflight, a.held_layers));  // uneven chunks: layers held
      row("  in flight", vals,
          inflight_formula(l, accumulation, m.layers) +
              (l.schedule == Schedule::interleaved ? "; shown as chunks x layers per chunk" : "; shown in micro-batches (mb)"));
    }
    bytes_row("activations (layers)", [&](size_t i) { return act[i].layers_bytes; },
              "per layer x layers per chunk x chunks in flight", true);
    bytes_row("recompute working set", [&](size_t i) { return act[i].recompute_working_bytes; },
              l.recompute == Recompute::full
                  ? "one layer's full activations live while it is recomputed for its backward"
                  : "one layer's recomputed attention scores 5as^2b/t (no FlashAttention)",
              false);
    bytes_row("embedding masks", [&](size_t i) { return act[i].embedding_bytes; },
              fmt::format("1-byte dropout mask sbh{} per first-chunk micro-batch in flight (Korthikanti 2022 Sec 4.3)",
                          l.sequence_parallel ? "/t" : ""),
              false);
    bytes_row("output layer", [&](size_t i) { return act[i].output_bytes; },
              fmt::format("final-norm + LM-head inputs 4sbh{} + fp32 logits 4sbV/t, one micro-batch (Korthikanti 2022 Sec 4.3)",
                          l.sequence_parallel ? "/t" : ""),
              false);
    bytes_row("ZeRO-3 gathered", [&](size_t i) { return buf[i].zero3_gathered_bytes; },
              "current + prefetched unit (layer / embedding / LM head), 16-bit, gathered over DP x CP", false);
    bytes_row("grad buckets", [&](size_t i) { return buf[i].grad_bucket_bytes; },
              "DeepSpeed ipg buckets: reduce_bucket_size (5e8 elements default) x 2 B, x2 when overlap_comm double-buffers",
              false);
    bytes_row("fp32 grad partition", [&](size_t i) { return buf[i].step_transient_bytes; },
              "4 B x P / N: DeepSpeed upcasts its gradient partition for the optimizer step", false);
    bytes_row("CUDA graph buffers", [&](size_t i) { return buf[i].cuda_graph_bytes; },
              tr.cuda_graphs == CudaGraphs::full_iteration
                  ? "every micro-batch's input batch, 28 b s B (Megatron-Core FullCudaGraphWrapper StaticBufferLoader)"
                  : "per held (layer, micro-batch): hidden 2 sbh (/t with SP) + bool mask b s^2 / cp (TE graphed callables)",
              false);
    bytes_row("quantized weights", [&](size_t i) { return buf[i].quantized_weight_bytes; },
              fmt::format("{} copies of the low-precision GEMM weights, {:.4g} B/element ({} recipe, Transformer Engine "
                          "weight workspaces)",
                          tr.fp8_param_gather ? "columnwise" : "rowwise + columnwise",
                          precision_recipe(tr.precision).weight_copy_bytes(), precision_recipe(tr.precision).name),
              false);
    bytes_row("peak", [&](size_t i) { return mb_of(i).peak_bytes; }, "sum of the lines above (held at the same time)", true);
    bytes_row("capacity", [&](size_t i) { return mb_of(i).capacity_bytes; },
              fmt::format("HBM {} - reserve {} (CUDA context + NCCL buffers, node preset)", format_bytes(exp.cluster.gpu.hbm_bytes),
                          format_bytes(exp.cluster.hbm_reserve_bytes)),
              true);
    std::vector<std::string> fits;
    for (size_t i = 0; i < cols.size(); ++i) fits.push_back(mb_of(i).fits ? "fits" : "OOM");
    row("fits", fits, "");
  }

  // ---------------------------------------------------------------- 7. host dispatch
  {
    os << "\n7. Host dispatch (models/host_dispatch.hpp): kernel launches by the host CPU, per rank and step\n";
    os << fmt::format("  host_dispatch {} per eager launch (cluster.host_dispatch); CUDA graphs: {}\n",
                      format_duration(exp.cluster.host_dispatch), to_string(tr.cuda_graphs));
    os << fmt::format("  {:>5} {:>14} {:>14} {:>12} {:>12} {:>12}\n", "stage", "eager launches", "graph replays",
                      "host syncs", "host time", "GPU compute");
    for (const StagePlan& st : plan.stages) {
      int64_t eager = 0, syncs = 0;
      double compute = 0;
      for (const Op& op : st.ops) {
        if (!captured_in_graph(op)) eager += eager_launches(op);
        syncs += op.host_sync ? 1 : 0;
        if (op.type == OpType::compute) compute += op.time_s;
      }
      os << fmt::format("  {:>5} {:>14} {:>14} {:>12} {:>12} {:>12}\n", st.stage, with_thousands(eager),
                        with_thousands(stage_graph_replays(st)), with_thousands(syncs),
                        format_duration(stage_host_seconds(st)), format_duration(compute));
    }
    os << "  The host launches in program order and runs ahead of the GPU; the GPU waits (host-bound time, `dtsim\n"
          "  run`) where its kernels are shorter than their launches, and after each host sync (a MoE layer's token\n"
          "  counts read by the dispatcher), which takes the host's lead away. CUDA graphs replay a captured layer\n"
          "  (or the whole iteration) with one launch.\n";
  }
  return os.str();
}

}  // namespace dtsim
