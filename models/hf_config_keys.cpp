// The key classes of models/hf_config_keys.hpp. Sources of the key names:
//   transformers src/transformers/configuration_utils.py (PretrainedConfig.__init__: common keys)
//   transformers src/transformers/models/llama/configuration_llama.py (LlamaConfig)
//   transformers src/transformers/models/mistral/configuration_mistral.py (MistralConfig)
//   transformers src/transformers/models/qwen2/configuration_qwen2.py (Qwen2Config)
//   transformers src/transformers/models/gpt2/configuration_gpt2.py (GPT2Config)
//   transformers src/transformers/models/gpt_neox/configuration_gpt_neox.py (GPTNeoXConfig)
//   MoE key names: configuration_mixtral.py (num_local_experts), configuration_qwen2_moe.py
//   (num_experts), DeepSeek-V2/V3 config.json (n_routed_experts).
#include "models/hf_config_keys.hpp"

#include <algorithm>
#include <set>

namespace dtsim {

namespace {

using Keys = std::set<std::string>;

// PretrainedConfig keys that change nothing dtsim models: bookkeeping, token ids, generation
// defaults, task heads and output switches.
const Keys kCommonHarmless = {
    "_name_or_path", "_commit_hash", "_attn_implementation", "_attn_implementation_autoset", "architectures",
    "model_type", "transformers_version", "torch_dtype", "dtype", "use_bfloat16", "bos_token_id", "eos_token_id",
    "pad_token_id", "sep_token_id", "decoder_start_token_id", "forced_bos_token_id", "forced_eos_token_id",
    "use_cache", "initializer_range", "return_dict", "output_hidden_states", "output_attentions", "torchscript",
    "tf_legacy_loss", "is_decoder", "chunk_size_feed_forward", "cross_attention_hidden_size", "max_length",
    "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
    "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "finetuning_task", "id2label", "label2id", "num_labels", "problem_type",
    "tokenizer_class", "prefix", "task_specific_params",
    // Mixture-of-experts settings other than the expert count: inert without experts (an
    // expert count > 1 is reported below).
    "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size", "router_aux_loss_coef",
    "output_router_logits", "router_jitter_noise", "decoder_sparse_step", "norm_topk_prob", "mlp_only_layers",
    "first_k_dense_replace", "moe_layer_freq", "n_shared_experts", "topk_method", "routed_scaling_factor",
    "n_group", "topk_group", "scoring_func", "aux_loss_alpha", "seq_aux"};

// Per family: keys the reader reads (models/experiment_io.cpp read_hf_config), keys it checks
// against the final model, and keys that change nothing dtsim models.
const Keys kLlamaKeys = {
    // read
    "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
    "vocab_size", "hidden_act", "tie_word_embeddings", "max_position_embeddings",
    // checked against the final model by the reader
    "head_dim", "attention_bias", "mlp_bias", "sliding_window", "use_sliding_window",
    // harmless: numerics (RMSNorm epsilon, RoPE base and scaling change values, not cost),
    // dropout probabilities, Llama's pretraining_tp (slices of the same GEMMs for
    // reproducibility), Qwen2's max_window_layers (only with a sliding window, checked above)
    "rms_norm_eps", "rope_theta", "rope_scaling", "pretraining_tp", "attention_dropout", "max_window_layers"};
const Keys kGpt2Keys = {
    // read
    "n_layer", "n_embd", "n_head", "n_inner", "vocab_size", "activation_function", "tie_word_embeddings",
    "n_positions", "n_ctx",
    // harmless: dropout, LayerNorm epsilon, sequence-summary head (not the LM), attention
    // scaling and upcasting (numerics only)
    "resid_pdrop", "embd_pdrop", "attn_pdrop", "layer_norm_epsilon", "summary_type", "summary_use_proj",
    "summary_activation", "summary_proj_to_labels", "summary_first_dropout", "scale_attn_weights",
    "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"};
const Keys kNeoxKeys = {
    // read
    "num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size", "hidden_act",
    "tie_word_embeddings", "max_position_embeddings",
    // checked against the final model by the reader
    "attention_bias",
    // harmless: rotary fraction and base, RoPE scaling, dropout, LayerNorm epsilon; the
    // parallel residual runs the same GEMMs and norms with another residual wiring
    "rotary_pct", "partial_rotary_factor", "rotary_emb_base", "rope_theta", "rope_scaling", "attention_dropout",
    "hidden_dropout", "classifier_dropout", "layer_norm_eps", "use_parallel_residual"};

bool active_count(const nlohmann::json& v) {
  return !v.is_null() && !(v.is_number() && v.get<double>() <= 1) && !(v.is_boolean() && !v.get<bool>());
}
bool active_flag(const nlohmann::json& v) { return !v.is_null() && !(v.is_boolean() && !v.get<bool>()); }
bool non_empty(const nlohmann::json& v) { return !v.is_null() && !((v.is_object() || v.is_array()) && v.empty()); }

}  // namespace

std::vector<std::string> hf_key_problems(const nlohmann::json& config, HfKeyFamily family) {
  std::vector<std::string> out;
  if (!config.is_object()) return out;
  const Keys& own = family == HfKeyFamily::llama ? kLlamaKeys : family == HfKeyFamily::gpt2 ? kGpt2Keys : kNeoxKeys;
  const char* family_name = family == HfKeyFamily::llama  ? "llama, mistral, qwen2"
                            : family == HfKeyFamily::gpt2 ? "gpt2"
                                                          : "gpt_neox";
  for (const auto& [key, v] : config.items()) {
    const std::string shown = "\"" + key + "\"=" + v.dump();
    if (key == "num_local_experts" || key == "num_experts" || key == "n_routed_experts") {
      if (active_count(v))
        out.push_back(shown + ": mixture of experts is not modelled (dtsim simulates dense MLPs only)");
      continue;
    }
    if (key == "is_encoder_decoder" || key == "add_cross_attention" || key == "tie_encoder_decoder") {
      if (active_flag(v)) out.push_back(shown + ": encoder-decoder models and cross-attention are not modelled");
      continue;
    }
    if (key == "pruned_heads") {
      if (non_empty(v)) out.push_back(shown + ": pruned attention heads are not modelled (every layer has all heads)");
      continue;
    }
    if (key == "layer_types") {
      bool all_full = v.is_array();
      if (v.is_array())
        for (const auto& t : v) all_full = all_full && t.is_string() && t.get<std::string>() == "full_attention";
      if (!v.is_null() && !all_full)
        out.push_back("\"layer_types\": layers other than \"full_attention\" (sliding-window or linear attention) "
                      "are not modelled");
      continue;
    }
    if (kCommonHarmless.count(key) || own.count(key)) continue;
    out.push_back("\"" + key + "\" is not a key dtsim reads or knows to leave the model unchanged (model family " +
                  family_name + "; the accepted keys are listed in models/hf_config_keys.cpp): remove it if it does "
                  "not change the architecture, or describe the model in YAML without hf_config");
  }
  return out;
}

}  // namespace dtsim
