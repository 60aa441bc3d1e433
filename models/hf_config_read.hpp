#pragma once
// Reading a Hugging Face config.json into a model draft (model.hf_config; models/experiment_io.cpp
// applies the YAML keys over it and checks the result). Which keys are read, harmless or
// refused: models/hf_config_keys.hpp. Key names and defaults are transformers' configuration
// classes (each family's reader in models/hf_config_read.cpp cites its file).
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "models/experiment.hpp"

namespace dtsim {

/// The model fields a config.json gives, each optional (absent: the YAML must give it).
struct ModelDraft {
  std::optional<std::string> name;
  std::optional<int64_t> layers, hidden, heads, kv_heads, ffn_hidden, vocab, max_pos;
  std::optional<Activation> activation;
  std::optional<bool> tied;
  std::optional<Norm> norm;
  std::optional<Position> position;
  // Which config.json key feeds each ModelSpec field (for "missing" messages).
  std::map<std::string, std::string> json_key;
  // An explicit attention head size (ModelSpec::head_dim_override; YAML model.head_dim wins).
  std::optional<int64_t> head_dim;
  // Mixture of experts of the MoE families (YAML model.moe keys override its fields).
  // `moe_ffn_is_ffn_hidden`: the experts' size is the final ffn_hidden (Mixtral's
  // intermediate_size serves both). `moe_layer`: which global layers are MoE, when the
  // family's rule is not MoeSpec's first_k_dense / layer_freq one; read_model turns it into
  // MoeSpec::layer_pattern once the final layer count is known.
  std::optional<MoeSpec> moe;
  bool moe_ffn_is_ffn_hidden = false;
  std::function<bool(int64_t)> moe_layer;
  // DeepSeek multi-head latent attention and multi-token prediction modules.
  std::optional<MlaSpec> mla;
  std::optional<int64_t> mtp_layers;
  // config.json keys checked against the final model (models/hf_config_keys.hpp): the linear
  // biases (with the family's transformers default) and a sliding window.
  std::string hf_where;
  std::optional<int64_t> hf_sliding_window;
  int64_t hf_window_from_layer = 0;  // Qwen: the first windowed layer (max_window_layers)
  // layer_types (or the family's default list): 1 for a local layer, one entry per layer of
  // the file; empty: the family's from-layer rule. `hf_window_chunked`: Llama 4 chunks.
  std::vector<uint8_t> hf_window_layers;
  bool hf_window_periodic = false;  // hf_window_layers repeats (a family default), else one per layer
  bool hf_window_chunked = false;
  bool sinks = false;  // GPT-OSS: learned attention sinks in every layer
  std::optional<bool> hf_attention_bias, hf_mlp_bias;
};

/// Reports one problem of the model section (the message names the file and the key).
using HfFail = std::function<void(const std::string& message)>;

/// Fills `d` from the config.json `value` (relative to `base_dir`), named `key_path` in
/// messages (model.hf_config). Every problem goes to `fail`; returns false when the file
/// cannot be used at all (unreadable, not JSON, no supported model_type). Records the file
/// as an input (models/input_files.hpp).
bool read_hf_config(const std::string& key_path, const std::string& value, const std::string& base_dir,
                    ModelDraft& d, const HfFail& fail);

}  // namespace dtsim
