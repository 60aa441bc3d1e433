#pragma once
// Which keys of a Hugging Face config.json dtsim accepts (models/experiment_io.cpp reads the
// file). Every key falls in one of three classes:
//   read       the reader turns it into a ModelSpec field (num_hidden_layers, hidden_size, ...);
//   harmless   it changes nothing dtsim models: token ids, generation defaults, numerics (norm
//              epsilon, RoPE base and scaling, initializer range), dropout probabilities (the
//              activation memory keeps dropout masks as Korthikanti et al. 2022 Sec 4 does),
//              bookkeeping (architectures, torch_dtype, transformers_version);
//   unmodelled it changes the architecture in a way dtsim does not model (mixture of experts,
//              sliding-window attention, cross-attention, pruned heads, an explicit head_dim
//              that is not hidden_size / num_attention_heads, linear biases that the model's
//              family does not have): an error naming the key unless its value leaves the
//              architecture unchanged (null, false, 0 experts, an empty list).
// Any other key is an error too: an unknown key may change the model, and the project rule is
// that nothing is silently ignored. The lists follow transformers' configuration_utils.py
// (PretrainedConfig) and configuration_{llama,mistral,qwen2,gpt2,gpt_neox}.py.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dtsim {

/// Family of a supported config.json (the reader's mapping of model_type).
enum class HfKeyFamily { llama, gpt2, neox };

/// One message per key of `config` that dtsim neither reads nor knows to be harmless, or that
/// is an unmodelled feature set to an active value. Messages name the key and say why,
/// without a file prefix. The keys checked against the final model (head_dim, attention_bias,
/// mlp_bias, sliding_window / use_sliding_window) are accepted here; the reader checks them.
std::vector<std::string> hf_key_problems(const nlohmann::json& config, HfKeyFamily family);

}  // namespace dtsim
