// The mixture-of-experts, MLA, local-attention and expert-layout checks of an experiment
// (models/moe_checks.hpp), called by models/experiment_check.cpp check_experiment.
#include "models/moe_checks.hpp"

#include <string>
#include <utility>

#include <fmt/format.h>

#include "models/rank_grid.hpp"
#include "models/schedules/schedule.hpp"

namespace dtsim {

void check_moe(const Experiment& e, ProblemList& p) {
  const ModelSpec& m = e.model;
  const MoeSpec& x = m.moe;
  const Layout& l = e.layout;
  auto s = [](auto v) { return std::to_string(v); };
  if (m.head_dim_override < 0) p.add("model.head_dim=" + s(m.head_dim_override) + " must be positive");
  if (m.mtp_layers < 0) p.add("model.mtp_layers=" + s(m.mtp_layers) + " must be >= 0");
  if (m.mtp_layers > 0) {
    // Megatron-Core docs/user-guide/features/multi_token_prediction.md, "Unsupported
    // Combinations": context parallelism and learned absolute position embeddings.
    if (l.cp > 1)
      p.add("model.mtp_layers=" + s(m.mtp_layers) + " with layout.cp=" + s(l.cp) +
            ": Megatron-Core does not support multi-token prediction with context parallelism");
    if (m.position == Position::learned)
      p.add("model.mtp_layers=" + s(m.mtp_layers) +
            " with model.position=learned: Megatron-Core does not support multi-token prediction with learned "
            "absolute position embeddings");
    if (e.training.overlap_moe_expert_parallel_comm && m.mtp_layers > 1)
      p.add("model.mtp_layers=" + s(m.mtp_layers) +
            " with training.overlap_moe_expert_parallel_comm: Megatron-Core supports at most one MTP layer with it");
  }
  const MlaSpec& a = m.mla;
  if (a.enabled() || a.q_lora_rank != 0 || a.v_head_dim != 0 || a.qk_nope_head_dim != 0 || a.qk_rope_head_dim != 0) {
    if (a.kv_lora_rank <= 0) p.add("model.mla.kv_lora_rank=" + s(a.kv_lora_rank) + " must be positive");
    if (a.q_lora_rank < 0)
      p.add("model.mla.q_lora_rank=" + s(a.q_lora_rank) + " must be >= 0 (0: the query has no low-rank projection)");
    if (a.qk_nope_head_dim <= 0)
      p.add("model.mla.qk_nope_head_dim=" + s(a.qk_nope_head_dim) + " must be positive");
    if (a.qk_rope_head_dim < 0) p.add("model.mla.qk_rope_head_dim=" + s(a.qk_rope_head_dim) + " must be >= 0");
    if (a.v_head_dim <= 0) p.add("model.mla.v_head_dim=" + s(a.v_head_dim) + " must be positive");
    if (m.activation != Activation::swiglu)
      p.add(std::string("model.mla with activation ") + to_string(m.activation) +
            ": dtsim gives a GeLU model's GEMMs biases (models/flops.cpp has_linear_biases), which MLA's projections "
            "do not have (DeepSeek-V2/V3 are SwiGLU models); use activation swiglu");
    if (m.kv_heads != m.heads)
      p.add("model.kv_heads=" + s(m.kv_heads) + " with model.mla: MLA gives every one of the " + s(m.heads) +
            " heads its own key and value (set kv_heads to heads or leave it out)");
    if (m.head_dim_override > 0)
      p.add("model.head_dim with model.mla: MLA's head sizes are model.mla.qk_nope_head_dim, qk_rope_head_dim and "
            "v_head_dim (remove model.head_dim)");
  }
  if (m.attention.window < 0) p.add("model.attention.window=" + s(m.attention.window) + " must be positive");
  if (m.attention.chunked && m.attention.window <= 0)
    p.add("model.attention.chunked needs model.attention.window (the chunk length in tokens)");
  if (m.attention.window > 0) {
    if (!e.training.flash_attention)
      p.add("model.attention.window needs training.flash_attention: the unfused path computes every score of the "
            "sequence and masks afterwards, which dtsim does not model for a window");
    if (l.cp > 1)
      p.add("model.attention.window with layout.cp=" + s(l.cp) +
            ": context parallelism over sliding-window layers is not simulated (each CP rank would skip the key "
            "blocks outside the window); use cp 1");
    if (m.mla.enabled()) p.add("model.attention.window with model.mla: MLA layers have no sliding window");
  }
  const bool moe_opts = e.training.overlap_moe_expert_parallel_comm || e.training.delay_wgrad_compute ||
                        e.training.moe_shared_expert_overlap || e.training.moe_token_dispatcher != "alltoall";
  if (moe_opts && !x.enabled())
    p.add("training.overlap_moe_expert_parallel_comm / delay_wgrad_compute / moe_shared_expert_overlap / "
          "moe_token_dispatcher need a mixture-of-experts model (model.moe)");
  for (const auto& [key, n] : {std::pair<const char*, int64_t>{"moe_deepep_num_sms", e.training.moe_deepep_num_sms},
                                {"moe_hybridep_num_sms", e.training.moe_hybridep_num_sms}}) {
    const int64_t sms = e.cluster.gpu.sm_count;
    if (n < 1 || n > 4096 || (sms > 0 && n >= sms))
      p.add(std::string("training.") + key + "=" + s(n) + " must be at least 1 and fewer than the GPU's " +
            (sms > 0 ? s(sms) : std::string("SMs")) + " SMs (cluster.gpu.sm_count)");
  }
  if (e.training.overlap_moe_expert_parallel_comm && x.enabled()) {
    // Megatron-Core's own constraints (transformer_config.py __post_init__, @d98e8a64), and
    // the ones of dtsim's combined pass (models/combined_1f1b.hpp, models/plan.cpp).
    const std::string key = "training.overlap_moe_expert_parallel_comm";
    if (l.ep < 2)
      p.add(key + " needs layout.ep > 1 (got " + s(l.ep) +
            "): it overlaps the EP AllToAll of one micro-batch with another's compute (Megatron-Core: "
            "'only supported with expert model parallelism')");
    if (l.recompute == Recompute::full)
      p.add(key + " with layout.recompute=full: Megatron-Core requires full recomputation off ('disable full "
            "recomputation when enabling overlap_moe_expert_parallel_comm'); use selective or none");
    if (e.training.moe_shared_expert_overlap)
      p.add(key + " with training.moe_shared_expert_overlap: Megatron-Core refuses both ('disable "
            "moe_shared_expert_overlap when enabling overlap_moe_expert_parallel_comm')");
    if (e.training.cuda_graphs != CudaGraphs::none)
      p.add(key + std::string(" with training.cuda_graphs=") + to_string(e.training.cuda_graphs) +
            ": the combined pass splits every layer between two micro-batches, so dtsim's whole-layer graphs cannot "
            "capture it (Megatron-Core refuses graphs of the moe and mlp scopes with it); set cuda_graphs false");
    if (l.zero_stage == 3)
      p.add(key + " with layout.zero_stage=3: the combined pass with per-layer parameter gathers in both halves is "
            "not simulated; use zero_stage 0-2");
    const sched::PipelineSchedule& sch = sched::schedule_of(l.schedule);
    if (!sch.pairs_forward_backward())
      p.add(key + " with layout.schedule=" + sch.name() +
            ": only 1f1b (pp=1), interleaved, dualpipe and dualpipev run combined forward-backward passes "
            "(Megatron-Core's combined 1F1B; DualPipe's overlapped forward-backward chunks)");
  }
  if (const std::string why = expert_layout_problem(l, x.num_experts); !why.empty()) p.add(why);
  if (!x.enabled()) {
    if (x.num_experts < 0) p.add("model.moe.num_experts=" + s(x.num_experts) + " must be positive");
    return;
  }
  if (x.router_topk < 1 || x.router_topk > x.num_experts)
    p.add("model.moe.router_topk=" + s(x.router_topk) + " must be in [1, num_experts=" + s(x.num_experts) + "]");
  if (x.moe_ffn_hidden <= 0) p.add("model.moe.moe_ffn_hidden=" + s(x.moe_ffn_hidden) + " must be positive");
  if (x.shared_expert_ffn_hidden < 0)
    p.add("model.moe.shared_expert_ffn_hidden=" + s(x.shared_expert_ffn_hidden) + " must be >= 0");
  if (x.first_k_dense < 0 || x.first_k_dense >= m.layers)
    p.add("model.moe.first_k_dense=" + s(x.first_k_dense) + " must be in [0, model.layers=" + s(m.layers) + ")");
  if (x.layer_freq < 1) p.add("model.moe.layer_freq=" + s(x.layer_freq) + " must be >= 1");
  if (!x.layer_pattern.empty() && static_cast<int64_t>(x.layer_pattern.size()) != m.layers)
    p.add("model.moe.layer_freq lists " + s(x.layer_pattern.size()) + " layers; model.layers=" + s(m.layers));
  if (x.router_num_groups < 0 || (x.router_num_groups > 0 && x.num_experts % x.router_num_groups != 0))
    p.add("model.moe.router_num_groups=" + s(x.router_num_groups) + " must divide num_experts=" + s(x.num_experts));
  if (x.router_num_groups > 0 && (x.router_group_topk < 1 || x.router_group_topk > x.router_num_groups))
    p.add("model.moe.router_group_topk=" + s(x.router_group_topk) + " must be in [1, router_num_groups=" +
          s(x.router_num_groups) + "]");
  if (x.capacity_factor < 0) p.add("model.moe.capacity_factor=" + std::to_string(x.capacity_factor) + " must be >= 0 (0: dropless)");
  if (x.pad_to_capacity && x.capacity_factor <= 0)
    p.add("model.moe.pad_to_capacity needs model.moe.capacity_factor > 0");
  if (x.balance == RouterBalance::measured && !(x.load_imbalance >= 1.0))
    p.add("model.moe.load_imbalance=" + std::to_string(x.load_imbalance) + " must be >= 1 (max / mean tokens)");
  // At most every token sends one of its k copies to each expert of the busiest place: max /
  // mean <= E / k for an expert, and no more for an EP rank's experts together.
  if (x.balance == RouterBalance::measured && x.load_imbalance >= 1.0 && x.num_experts > 0 && x.router_topk > 0 &&
      x.router_topk <= x.num_experts) {
    const double most = static_cast<double>(x.num_experts) / static_cast<double>(x.router_topk);
    if (x.load_imbalance > most)
      p.add(fmt::format("model.moe.load_imbalance={:g} must be <= model.moe.num_experts / router_topk = {} / {} = {:g} "
                        "(max / mean tokens: the busiest expert receives at most every token)",
                        x.load_imbalance, x.num_experts, x.router_topk, most));
  }
  if (m.activation != Activation::swiglu)
    p.add("model.moe: routed experts are SwiGLU MLPs; model.activation must be swiglu");
  // Megatron-Core transformer_config.py: "When using MoE and tensor parallelism, sequence
  // parallelism must be used" (tensor_model_parallel_size > 1 with num_moe_experts).
  if (l.tp > 1 && !l.sequence_parallel)
    p.add("layout.sequence_parallel must be true for a mixture-of-experts model with layout.tp > 1 (Megatron-Core "
          "requires it)");
}

}  // namespace dtsim
