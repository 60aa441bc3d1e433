// The key classes of models/hf_config_keys.hpp. Sources of the key names:
//   transformers src/transformers/configuration_utils.py (PretrainedConfig.__init__: common keys)
//   transformers src/transformers/models/llama/configuration_llama.py (LlamaConfig)
//   transformers src/transformers/models/mistral/configuration_mistral.py (MistralConfig)
//   transformers src/transformers/models/qwen2/configuration_qwen2.py (Qwen2Config)
//   transformers src/transformers/models/qwen3/configuration_qwen3.py (Qwen3Config)
//   transformers src/transformers/models/mixtral/configuration_mixtral.py (MixtralConfig)
//   transformers src/transformers/models/qwen2_moe/configuration_qwen2_moe.py (Qwen2MoeConfig)
//   transformers src/transformers/models/qwen3_moe/configuration_qwen3_moe.py (Qwen3MoeConfig)
//   transformers src/transformers/models/deepseek_v2/configuration_deepseek_v2.py (DeepseekV2Config)
//   transformers src/transformers/models/deepseek_v3/configuration_deepseek_v3.py (DeepseekV3Config)
//   DeepSeek's own configuration_deepseek.py (the remote code named by the auto_map of the
//   deepseek-ai/DeepSeek-V2 / DeepSeek-V3 and moonshotai/Kimi-K2 config.json files: scoring_func,
//   topk_method, moe_layer_freq, ep_size, aux_loss_alpha, seq_aux, num_nextn_predict_layers)
//   transformers src/transformers/models/gpt_oss/configuration_gpt_oss.py (GptOssConfig) and
//   OpenAI's openai/gpt-oss-20b / gpt-oss-120b config.json (experts_per_token,
//   initial_context_length)
//   transformers src/transformers/models/llama4/configuration_llama4.py (Llama4Config,
//   Llama4TextConfig)
//   transformers src/transformers/models/gpt2/configuration_gpt2.py (GPT2Config)
//   transformers src/transformers/models/gpt_neox/configuration_gpt_neox.py (GPTNeoXConfig)
#include "models/hf_config_keys.hpp"

#include <algorithm>
#include <set>

namespace dtsim {

namespace {

using Keys = std::set<std::string>;

Keys operator+(Keys a, const Keys& b) {
  a.insert(b.begin(), b.end());
  return a;
}

// PretrainedConfig keys that change nothing dtsim models: bookkeeping (auto_map names the
// remote-code Python classes that load the file), token ids, generation defaults, task heads
// and output switches.
const Keys kCommonHarmless = {
    "_name_or_path", "_commit_hash", "_attn_implementation", "_attn_implementation_autoset", "architectures",
    "auto_map", "model_type", "transformers_version", "torch_dtype", "dtype", "use_bfloat16", "bos_token_id",
    "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "forced_bos_token_id",
    "forced_eos_token_id", "use_cache", "initializer_range", "return_dict", "output_hidden_states",
    "output_attentions", "torchscript", "tf_legacy_loss", "is_decoder", "chunk_size_feed_forward",
    "cross_attention_hidden_size", "max_length", "min_length", "do_sample", "early_stopping", "num_beams",
    "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens", "finetuning_task", "id2label",
    "label2id", "num_labels", "problem_type", "tokenizer_class", "prefix", "task_specific_params",
    // Mixture-of-experts settings other than the expert count: inert in a family whose
    // transformers model does not read them (a Llama config, a shared-expert size in Mixtral;
    // an expert count there is reported below). The families that read them list them again.
    "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size", "router_aux_loss_coef",
    "output_router_logits", "router_jitter_noise", "decoder_sparse_step", "norm_topk_prob", "mlp_only_layers",
    "first_k_dense_replace", "moe_layer_freq", "n_shared_experts", "topk_method", "routed_scaling_factor",
    "n_group", "topk_group", "scoring_func", "aux_loss_alpha", "seq_aux"};

// Per family: keys the reader reads (models/hf_config_read.cpp read_hf_config), keys it checks
// against the final model, and keys that change nothing dtsim models.
const Keys kLlamaKeys = {
    // read
    "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
    "vocab_size", "hidden_act", "tie_word_embeddings", "max_position_embeddings", "head_dim",
    // read into model.attention when the window is shorter than the sequence (Qwen: from layer
    // max_window_layers on, with use_sliding_window)
    "sliding_window", "use_sliding_window", "max_window_layers",
    // checked against the final model by the reader
    "attention_bias", "mlp_bias",
    // harmless: numerics (RMSNorm epsilon, RoPE base and scaling change values, not cost; RoPE
    // settings are rope_parameters from transformers 5 on), dropout probabilities, Llama's
    // pretraining_tp (slices of the same GEMMs for reproducibility), quantization_config (how a
    // published checkpoint stores its weights, e.g. FP8 Llama checkpoints' {"quant_method":
    // "fp8"}: not the training precision, which is training.dtype)
    "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters", "pretraining_tp", "attention_dropout",
    "quantization_config"};
// MixtralConfig: Mistral's keys plus the experts. Read: num_local_experts, num_experts_per_tok.
// Harmless: router_aux_loss_coef (the weight of the load-balancing loss, a scalar added to
// the loss), output_router_logits (an output switch), router_jitter_noise (multiplicative
// noise on the router input during training: values, not cost).
const Keys kMixtralKeys = kLlamaKeys + Keys{"num_local_experts", "num_experts_per_tok", "router_aux_loss_coef",
                                            "output_router_logits", "router_jitter_noise"};
// Qwen3MoeConfig: read num_experts, num_experts_per_tok, moe_intermediate_size,
// decoder_sparse_step, mlp_only_layers. Harmless: norm_topk_prob (renormalizes the top-k
// router weights: values, not cost), router_aux_loss_coef, output_router_logits.
const Keys kQwen3MoeKeys = kLlamaKeys + Keys{"num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                             "decoder_sparse_step", "mlp_only_layers", "norm_topk_prob",
                                             "router_aux_loss_coef", "output_router_logits"};
// Qwen2MoeConfig: Qwen3-MoE's keys plus the shared expert (read) and qkv_bias. qkv_bias is
// harmless as it is for Qwen2 (whose Qwen2Attention always has the q/k/v biases): 3 bias
// vectors per layer, negligible parameters and element-wise FLOPs, which dtsim leaves out.
const Keys kQwen2MoeKeys = kQwen3MoeKeys + Keys{"shared_expert_intermediate_size", "qkv_bias"};
// DeepseekV2Config / DeepseekV3Config and DeepSeek's configuration_deepseek.py (Kimi-K2 ships
// the same file).
const Keys kDeepseekKeys = {
    // read
    "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
    "vocab_size", "hidden_act", "tie_word_embeddings", "max_position_embeddings", "n_routed_experts",
    "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace",
    "moe_layer_freq", "scoring_func", "topk_method", "n_group", "topk_group", "q_lora_rank", "kv_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_nextn_predict_layers",
    // checked by the reader: the biases against the final model; head_dim and qk_head_dim are
    // values transformers derives (= qk_rope_head_dim, = qk_nope_head_dim + qk_rope_head_dim)
    "attention_bias", "mlp_bias", "head_dim", "qk_head_dim",
    // harmless:
    //  - routed_scaling_factor, norm_topk_prob: scale / renormalize the routed experts' weights
    //    (values, not cost);
    //  - aux_loss_alpha, seq_aux: weight and form (per sequence) of the balance loss, a scalar
    //    added to the loss;
    //  - ep_size: the expert-parallel size of DeepSeek's inference code, not the model (dtsim's
    //    layout.ep sets the training layout);
    //  - rope_scaling (YaRN for the long context), rope_theta, rope_parameters, rope_interleave,
    //    rms_norm_eps: numerics of the same GEMMs and norms;
    //  - quantization_config: how the published checkpoint stores its weights (DeepSeek-V3:
    //    FP8 e4m3 with 128 x 128 block scales), not the training precision, which is
    //    training.dtype;
    //  - pretraining_tp (as Llama's), attention_dropout.
    "routed_scaling_factor", "norm_topk_prob", "aux_loss_alpha", "seq_aux", "ep_size", "rope_scaling",
    "rope_theta", "rope_parameters", "rope_interleave", "rms_norm_eps", "quantization_config", "pretraining_tp",
    "attention_dropout"};
// GptOssConfig and OpenAI's config.json (models/hf_config_read.cpp read_gpt_oss).
const Keys kGptOssKeys = {
    // read
    "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
    "vocab_size", "hidden_act", "tie_word_embeddings", "max_position_embeddings", "head_dim", "num_local_experts",
    "num_experts", "num_experts_per_tok", "experts_per_token", "sliding_window", "layer_types",
    // harmless:
    //  - attention_bias: the q/k/v/o bias vectors (with the experts' and the router's), left
    //    out as Qwen2's qkv_bias (read_gpt_oss);
    //  - swiglu_limit, swiglu_alpha: the clamp and gain of the experts' SwiGLU (values);
    //  - initial_context_length, rope_scaling, rope_parameters, rope_theta: YaRN RoPE numerics;
    //  - quantization_config: the published checkpoint's MXFP4 expert weights, not the training
    //    precision (training.dtype);
    //  - rms_norm_eps, attention_dropout, router_aux_loss_coef, output_router_logits.
    "attention_bias", "swiglu_limit", "swiglu_alpha", "initial_context_length", "rope_scaling", "rope_parameters",
    "rope_theta", "quantization_config", "rms_norm_eps", "attention_dropout", "router_aux_loss_coef",
    "output_router_logits"};
// Llama4TextConfig (the text decoder; models/hf_config_read.cpp read_llama4).
const Keys kLlama4Keys = {
    // read
    "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
    "intermediate_size_mlp", "vocab_size", "hidden_act", "tie_word_embeddings", "max_position_embeddings",
    "head_dim", "num_local_experts", "num_experts_per_tok", "moe_layers", "interleave_moe_layer_step",
    "attention_chunk_size", "layer_types", "no_rope_layers", "no_rope_layer_interval",
    // checked against the final model by the reader
    "attention_bias",
    // harmless: use_qk_norm (an L2 norm of q and k), attn_temperature_tuning / floor_scale /
    // attn_scale (a per-position query scale of the NoPE layers): element-wise values; RoPE
    // numerics, RMSNorm epsilon, dropout, the router's balance loss weight, jitter and output
    // switch
    "use_qk_norm", "attn_temperature_tuning", "floor_scale", "attn_scale", "rope_scaling", "rope_parameters",
    "rope_theta", "rms_norm_eps", "attention_dropout", "router_aux_loss_coef", "router_jitter_noise",
    "output_router_logits"};
// Llama4Config, the multimodal wrapper: the text decoder in text_config (read); the image
// encoder in vision_config and the image token ids, which a text-only step never uses.
const Keys kLlama4VlmKeys = {"text_config", "vision_config", "boi_token_index", "eoi_token_index",
                             "image_token_index", "tie_word_embeddings"};
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
    "rotary_pct", "partial_rotary_factor", "rotary_emb_base", "rope_theta", "rope_scaling", "rope_parameters",
    "attention_dropout", "hidden_dropout", "classifier_dropout", "layer_norm_eps", "use_parallel_residual"};

const Keys& family_keys(HfKeyFamily family) {
  switch (family) {
    case HfKeyFamily::llama: return kLlamaKeys;
    case HfKeyFamily::mixtral: return kMixtralKeys;
    case HfKeyFamily::qwen2_moe: return kQwen2MoeKeys;
    case HfKeyFamily::qwen3_moe: return kQwen3MoeKeys;
    case HfKeyFamily::deepseek: return kDeepseekKeys;
    case HfKeyFamily::gpt2: return kGpt2Keys;
    case HfKeyFamily::neox: return kNeoxKeys;
    case HfKeyFamily::gpt_oss: return kGptOssKeys;
    case HfKeyFamily::llama4: return kLlama4Keys;
    case HfKeyFamily::llama4_vlm: return kLlama4VlmKeys;
  }
  return kLlamaKeys;
}

// The expert-count key a family reads ("" for the dense families).
const char* own_expert_count(HfKeyFamily family) {
  switch (family) {
    case HfKeyFamily::mixtral: return "num_local_experts";
    case HfKeyFamily::qwen2_moe:
    case HfKeyFamily::qwen3_moe: return "num_experts";
    case HfKeyFamily::deepseek: return "n_routed_experts";
    case HfKeyFamily::gpt_oss:
    case HfKeyFamily::llama4: return "num_local_experts";
    default: return "";
  }
}

bool active_count(const nlohmann::json& v) {
  return !v.is_null() && !(v.is_number() && v.get<double>() <= 1) && !(v.is_boolean() && !v.get<bool>());
}
bool active_flag(const nlohmann::json& v) { return !v.is_null() && !(v.is_boolean() && !v.get<bool>()); }
bool non_empty(const nlohmann::json& v) { return !v.is_null() && !((v.is_object() || v.is_array()) && v.empty()); }

}  // namespace

const char* hf_family_model_types(HfKeyFamily family) {
  switch (family) {
    case HfKeyFamily::llama: return "llama, mistral, qwen2, qwen3";
    case HfKeyFamily::mixtral: return "mixtral";
    case HfKeyFamily::qwen2_moe: return "qwen2_moe";
    case HfKeyFamily::qwen3_moe: return "qwen3_moe";
    case HfKeyFamily::deepseek: return "deepseek_v2, deepseek_v3, kimi_k2";
    case HfKeyFamily::gpt2: return "gpt2";
    case HfKeyFamily::neox: return "gpt_neox";
    case HfKeyFamily::gpt_oss: return "gpt_oss";
    case HfKeyFamily::llama4: return "llama4_text";
    case HfKeyFamily::llama4_vlm: return "llama4";
  }
  return "";
}

std::vector<std::string> hf_key_problems(const nlohmann::json& config, HfKeyFamily family) {
  std::vector<std::string> out;
  if (!config.is_object()) return out;
  const Keys& own = family_keys(family);
  const std::string family_name = hf_family_model_types(family);
  const std::string own_count = own_expert_count(family);
  for (const auto& [key, v] : config.items()) {
    const std::string shown = "\"" + key + "\"=" + v.dump();
    if (key == "num_local_experts" || key == "num_experts" || key == "n_routed_experts") {
      if (key == own_count) continue;  // read
      if (family == HfKeyFamily::gpt_oss && key == "num_experts") continue;  // GptOssConfig.attribute_map
      if (active_count(v))
        out.push_back(shown + ": model_type " + family_name +
                      (own_count.empty() ? std::string(" has dense MLPs") : " reads its experts from \"" + own_count + "\"") +
                      " and its transformers model ignores this key (mixture-of-experts config.json files are read "
                      "for model_type mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3, kimi_k2, gpt_oss and "
                      "llama4): fix "
                      "model_type or remove the key");
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
    if (key == "layer_types" && family != HfKeyFamily::deepseek && family != HfKeyFamily::gpt2 &&
        family != HfKeyFamily::neox && family != HfKeyFamily::llama4_vlm)
      continue;  // the reader reads it (models/hf_config_read.cpp read_layer_types)
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
