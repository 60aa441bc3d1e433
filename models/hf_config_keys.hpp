#pragma once
// Which keys of a Hugging Face config.json dtsim accepts (models/hf_config_read.cpp reads the
// file). Every key falls in one of three classes:
//   read       the reader turns it into a ModelSpec field (num_hidden_layers, hidden_size, the
//              expert counts and sizes of the mixture-of-experts families, DeepSeek's MLA ranks);
//   harmless   it changes nothing dtsim models: token ids, generation defaults, numerics (norm
//              epsilon, RoPE base and scaling, initializer range, router score scaling and
//              renormalization), loss weights (router auxiliary losses), dropout probabilities
//              (the activation memory keeps dropout masks as Korthikanti et al. 2022 Sec 4 does),
//              bookkeeping (architectures, auto_map, torch_dtype, transformers_version), and keys
//              the family's transformers model does not read (a shared-expert size in Mixtral);
//   unmodelled it changes the architecture in a way dtsim does not model (an expert count in a
//              dense family, linear attention layers, cross-attention, pruned heads, linear
//              biases that the model's family does not have): an error naming the key unless its
//              value leaves the architecture unchanged (null, false, 0 or 1 experts, an empty list).
// Any other key is an error too: an unknown key may change the model, and the project rule is
// that nothing is silently ignored. The lists follow transformers' configuration_utils.py
// (PretrainedConfig) and configuration_{llama,mistral,qwen2,qwen3,mixtral,qwen2_moe,qwen3_moe,
// deepseek_v2,deepseek_v3,gpt_oss,llama4,gpt2,gpt_neox}.py.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dtsim {

/// Family of a supported config.json (the reader's mapping of model_type):
///   llama      llama, mistral, qwen2, qwen3 (dense, LlamaConfig key names)
///   mixtral    mixtral (every layer MoE, num_local_experts)
///   qwen2_moe  qwen2_moe (num_experts, shared expert, decoder_sparse_step / mlp_only_layers)
///   qwen3_moe  qwen3_moe (as qwen2_moe without the shared expert)
///   deepseek   deepseek_v2, deepseek_v3, kimi_k2 (n_routed_experts, MLA, multi-token prediction)
///   gpt_oss    gpt_oss (every layer MoE, alternating sliding / full attention with sinks)
///   llama4     llama4_text, and the text_config of llama4 (MoE and dense layers, chunked
///              attention)
///   llama4_vlm the outer keys of a llama4 file (text_config, vision_config, image token ids)
///   gpt2, neox gpt2, gpt_neox
enum class HfKeyFamily { llama, mixtral, qwen2_moe, qwen3_moe, deepseek, gpt2, neox, gpt_oss, llama4, llama4_vlm };

/// The model_type values of `family`, comma separated (for messages).
const char* hf_family_model_types(HfKeyFamily family);

/// One message per key of `config` that dtsim neither reads nor knows to be harmless, or that
/// is an unmodelled feature set to an active value. Messages name the key and say why,
/// without a file prefix. The keys checked against the final model or against other keys
/// (head_dim, qk_head_dim, attention_bias, mlp_bias, sliding_window / use_sliding_window) are
/// accepted here; the reader checks them.
std::vector<std::string> hf_key_problems(const nlohmann::json& config, HfKeyFamily family);

}  // namespace dtsim
