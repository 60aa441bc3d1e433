// models/hf_config_read.hpp: a Hugging Face config.json into a ModelDraft, one reader per
// transformers family.
#include "models/hf_config_read.hpp"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/checked.hpp"
#include "models/hf_config_keys.hpp"
#include "models/input_files.hpp"
#include "models/path_problem.hpp"
#include "models/scalar_text.hpp"

namespace dtsim {

namespace {

namespace fs = std::filesystem;
using text::quote;


using HfFamily = HfKeyFamily;

class HfReader {
 public:
  HfReader(const HfFail& fail, const nlohmann::json& j, std::string where)
      : fail_(fail), j_(j), where_(std::move(where)) {}

  std::optional<int64_t> integer(const std::string& key) {
    if (!j_.contains(key) || j_[key].is_null()) return std::nullopt;
    const auto& v = j_[key];
    if (fits_int64(v)) return v.get<int64_t>();
    add(quote(key) + "=" + v.dump() +
        (v.is_number_integer() ? " does not fit in a 64-bit integer (at most 9223372036854775807)" : " is not an integer"));
    return std::nullopt;
  }
  /// An integer JSON number that a 64-bit signed integer holds (nlohmann keeps 2^63 ..
  /// 2^64 - 1 as unsigned, which get<int64_t> would wrap to negative values).
  static bool fits_int64(const nlohmann::json& v) {
    if (v.is_number_unsigned()) return v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX);
    return v.is_number_integer();
  }
  std::optional<bool> boolean(const std::string& key) {
    if (!j_.contains(key) || j_[key].is_null()) return std::nullopt;
    const auto& v = j_[key];
    if (v.is_boolean()) return v.get<bool>();
    add(quote(key) + "=" + v.dump() + " is not a boolean");
    return std::nullopt;
  }
  std::optional<std::string> text(const std::string& key) {
    if (!j_.contains(key) || j_[key].is_null()) return std::nullopt;
    const auto& v = j_[key];
    if (v.is_string()) return v.get<std::string>();
    add(quote(key) + "=" + v.dump() + " is not a string");
    return std::nullopt;
  }
  /// A list of integers; null or absent: nullopt.
  std::optional<std::vector<int64_t>> integer_list(const std::string& key) {
    if (!j_.contains(key) || j_[key].is_null()) return std::nullopt;
    const auto& v = j_[key];
    bool ok = v.is_array();
    std::vector<int64_t> out;
    if (ok)
      for (const auto& x : v) {
        ok = ok && fits_int64(x);
        if (ok) out.push_back(x.get<int64_t>());
      }
    if (ok) return out;
    add(quote(key) + "=" + v.dump() + " is not a list of integers");
    return std::nullopt;
  }
  bool contains(const std::string& key) const { return j_.contains(key); }
  const nlohmann::json& json() const { return j_; }
  /// The key is present with the value null.
  bool is_null(const std::string& key) const { return j_.contains(key) && j_[key].is_null(); }
  std::optional<Activation> activation(const std::string& key, bool gated_family) {
    auto act = text(key);
    if (!act) return std::nullopt;
    // silu/swish in Llama-style configs is the gated SwiGLU MLP; every gelu variant
    // (gelu, gelu_new, gelu_fast, gelu_pytorch_tanh) is a plain GeLU MLP. GPT-2 and GPT-NeoX
    // MLPs are never gated (GPT2MLP, GPTNeoXMLP: act(fc_in(x))), so silu there would be a
    // plain SiLU MLP, which dtsim does not model.
    if ((*act == "silu" || *act == "swish") && !gated_family) {
      add(quote(key) + "=" + quote(*act) + " is a plain (non-gated) SiLU MLP in this family, which is not modelled "
          "(dtsim models plain GeLU MLPs and gated SwiGLU MLPs)");
      return std::nullopt;
    }
    if (*act == "silu" || *act == "swish") return Activation::swiglu;
    if (act->rfind("gelu", 0) == 0) return Activation::gelu;
    add(quote(key) + "=" + quote(*act) + " is not supported (supported: silu, swish -> swiglu; gelu* -> gelu)");
    return std::nullopt;
  }
  // Any problem in the JSON marks the whole model section.
  void add(const std::string& msg) { fail_(where_ + ": " + msg); }

 private:
  const HfFail& fail_;
  const nlohmann::json& j_;
  std::string where_;
};

const char* const kSupportedModelTypes =
    "llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3, kimi_k2, gpt_oss, llama4, "
    "llama4_text, gpt2, gpt_neox";

std::optional<HfFamily> detect_family(HfReader& r, const nlohmann::json& j) {
  if (j.contains("model_type") && j["model_type"].is_string()) {
    const std::string t = j["model_type"].get<std::string>();
    if (t == "llama" || t == "mistral" || t == "qwen2" || t == "qwen3") return HfFamily::llama;
    if (t == "mixtral") return HfFamily::mixtral;
    if (t == "qwen2_moe") return HfFamily::qwen2_moe;
    if (t == "qwen3_moe") return HfFamily::qwen3_moe;
    if (t == "deepseek_v2" || t == "deepseek_v3" || t == "kimi_k2") return HfFamily::deepseek;
    if (t == "gpt2") return HfFamily::gpt2;
    if (t == "gpt_neox") return HfFamily::neox;
    if (t == "gpt_oss") return HfFamily::gpt_oss;
    if (t == "llama4" || t == "llama4_text") return HfFamily::llama4;
    r.add("model_type=" + quote(t) + " is not supported (supported: " + kSupportedModelTypes + ")");
    return std::nullopt;
  }
  // transformers picks the config class from model_type (AutoConfig.from_pretrained,
  // CONFIG_MAPPING[config_dict["model_type"]]): without it the family, hence the meaning of
  // every other key, is unknown, and guessing it would be a silent default.
  if (j.contains("model_type"))
    r.add("model_type must be a string naming the architecture (got " + std::string(j["model_type"].type_name()) +
          "; supported: " + kSupportedModelTypes + ")");
  else
    r.add(std::string("no \"model_type\": the architecture is unknown (supported: ") + kSupportedModelTypes + ")");
  return std::nullopt;
}

// The keys every Llama-like family (Llama, Mistral, Qwen2/3, Mixtral, Qwen-MoE, DeepSeek)
// shares: transformers LlamaConfig names, RMSNorm, RoPE, SwiGLU for silu.
void read_llama_like(HfReader& r, ModelDraft& d) {
  d.json_key = {{"layers", "num_hidden_layers"},   {"hidden", "hidden_size"},
                {"heads", "num_attention_heads"},  {"ffn_hidden", "intermediate_size"},
                {"vocab", "vocab_size"},           {"activation", "hidden_act"}};
  d.layers = r.integer("num_hidden_layers");
  d.hidden = r.integer("hidden_size");
  d.heads = r.integer("num_attention_heads");
  d.kv_heads = r.integer("num_key_value_heads");  // absent -> = heads (MHA)
  d.ffn_hidden = r.integer("intermediate_size");
  d.vocab = r.integer("vocab_size");
  d.activation = r.activation("hidden_act", true);
  d.tied = r.boolean("tie_word_embeddings");  // transformers default: false
  if (!d.tied) d.tied = false;
  d.norm = Norm::rmsnorm;
  d.position = Position::rope;
  d.max_pos = r.integer("max_position_embeddings");
  // LlamaConfig / MistralConfig / Qwen3Config / DeepseekV2Config defaults: attention_bias=False,
  // mlp_bias=False.
  d.hf_attention_bias = r.boolean("attention_bias");
  if (!d.hf_attention_bias) d.hf_attention_bias = false;
  d.hf_mlp_bias = r.boolean("mlp_bias");
  if (!d.hf_mlp_bias) d.hf_mlp_bias = false;
}

// An explicit head_dim (Llama-3.2, Mistral-Nemo, Qwen3): the attention head size when it is not
// hidden_size / num_attention_heads of the same file (equal, it is the default and YAML
// overrides of hidden or heads keep deriving the head size). Qwen3Config's default is 128;
// the others derive it (MixtralConfig and Qwen3MoeConfig: head_dim None / absent).
void read_head_dim(HfReader& r, ModelDraft& d, const std::string& type) {
  auto hd = r.integer("head_dim");
  if (hd && *hd <= 0) {
    r.add("\"head_dim\"=" + std::to_string(*hd) + " must be positive (null or absent: hidden_size / num_attention_heads)");
    hd.reset();
  }
  // Qwen3Config 128, GptOssConfig 64, Llama4TextConfig 128 when the key is absent.
  if (!hd && !r.contains("head_dim")) {
    if (type == "qwen3" || type == "llama4_text" || type == "llama4") hd = 128;
    if (type == "gpt_oss") hd = 64;
  }
  if (hd && !(d.hidden && d.heads && *d.heads > 0 && *hd * *d.heads == *d.hidden)) d.head_dim = hd;
}

// layer_types (transformers configuration_utils.py layer_type_validation): one entry per layer,
// "full_attention" or the family's local kind (`local`: "sliding_attention", Llama 4
// "chunked_attention"). Returns 1 per local layer; nullopt when absent or null. Any other kind
// (linear attention, ...) is not modelled.
std::optional<std::vector<uint8_t>> read_layer_types(HfReader& r, const std::string& local) {
  if (!r.contains("layer_types") || r.is_null("layer_types")) return std::nullopt;
  const nlohmann::json& v = r.json()["layer_types"];
  std::vector<uint8_t> out;
  bool ok = v.is_array();
  if (ok)
    for (const auto& t : v) {
      const std::string kind = t.is_string() ? t.get<std::string>() : t.dump();
      if (kind != "full_attention" && kind != local) {
        r.add("\"layer_types\" has " + quote(kind) + ": only \"full_attention\" and " + quote(local) +
              " layers are modelled in this family");
        return std::nullopt;
      }
      out.push_back(kind == local ? 1 : 0);
    }
  if (!ok) {
    r.add("\"layer_types\"=" + v.dump() + " is not a list of layer kinds");
    return std::nullopt;
  }
  if (auto n = r.integer("num_hidden_layers"); n && *n != static_cast<int64_t>(out.size())) {
    r.add("\"layer_types\" has " + std::to_string(out.size()) + " entries; \"num_hidden_layers\"=" + std::to_string(*n) +
          " needs one per layer");
    return std::nullopt;
  }
  return out;
}

// Sliding-window attention: MistralConfig's default window is 4096 when the key is absent
// (MixtralConfig's is None); Qwen2Config, Qwen3Config and the Qwen MoE configs apply
// sliding_window only with use_sliding_window (default False); null means full attention.
int64_t positive_or(HfReader& r, const std::string& key, int64_t fallback);

void read_sliding_window(HfReader& r, ModelDraft& d, const std::string& type) {
  const bool is_qwen = type.rfind("qwen", 0) == 0;
  const auto use = r.boolean("use_sliding_window");
  d.hf_sliding_window = r.integer("sliding_window");
  if (!d.hf_sliding_window && type == "mistral" && !r.contains("sliding_window")) d.hf_sliding_window = 4096;
  if (use ? !*use : is_qwen) d.hf_sliding_window.reset();
  // Qwen2/Qwen3 (transformers Qwen2Config layer_types): layer i slides when i >=
  // max_window_layers (default 28); Mistral and Mixtral slide in every layer.
  // 0: every layer slides (transformers Qwen2Config takes it).
  if (is_qwen && d.hf_sliding_window) {
    const auto from = r.integer("max_window_layers");
    if (from && *from < 0) r.add("\"max_window_layers\"=" + std::to_string(*from) + " must be >= 0");
    d.hf_window_from_layer = from && *from >= 0 ? *from : 28;
  }
  // transformers 4.53+ writes the per-layer list (Qwen2Config / Qwen3Config layer_types); it
  // replaces the max_window_layers rule.
  if (auto types = read_layer_types(r, "sliding_attention")) {
    d.hf_window_layers = *types;
    if (!d.hf_sliding_window && std::find(types->begin(), types->end(), 1) != types->end())
      r.add("\"layer_types\" has \"sliding_attention\" layers but no sliding window is in effect (\"sliding_window\" " +
            std::string(is_qwen ? "null or \"use_sliding_window\" false" : "null or absent") + ")");
  }
}

// A positive integer key, or its transformers default when absent or null.
int64_t positive_or(HfReader& r, const std::string& key, int64_t fallback) {
  auto v = r.integer(key);
  if (v && *v <= 0) {
    r.add(quote(key) + "=" + std::to_string(*v) + " must be a positive integer");
    return fallback;
  }
  return v ? *v : fallback;
}

// transformers configuration_mixtral.py (MixtralConfig): every layer's MLP is a sparse block
// of num_local_experts SwiGLU experts of intermediate_size (MixtralSparseMoeBlock), top
// num_experts_per_tok of a softmax router. Defaults: 8 experts, top-2, 8 key/value heads.
void read_mixtral(HfReader& r, ModelDraft& d) {
  MoeSpec e;
  e.num_experts = positive_or(r, "num_local_experts", 8);
  e.router_topk = positive_or(r, "num_experts_per_tok", 2);
  e.router_score = RouterScore::softmax;
  d.moe = e;
  d.moe_ffn_is_ffn_hidden = true;  // moe_ffn_hidden = the final ffn_hidden (intermediate_size)
  if (!d.kv_heads && !r.contains("num_key_value_heads")) d.kv_heads = 8;  // MixtralConfig default
}

// transformers configuration_qwen2_moe.py / configuration_qwen3_moe.py (Qwen2MoeConfig,
// Qwen3MoeConfig; their DecoderLayer picks the MLP): layer i is a sparse block when i is not in
// mlp_only_layers and num_experts > 0 and (i + 1) % decoder_sparse_step == 0, else a dense MLP of
// intermediate_size. The sparse block has num_experts experts of moe_intermediate_size, the top
// num_experts_per_tok of a softmax router; Qwen2-MoE adds a shared expert of
// shared_expert_intermediate_size, scaled by a sigmoid gate (one h -> 1 linear: negligible, not
// modelled). Defaults: Qwen2MoeConfig 60 experts, top-4, 1408, shared 5632; Qwen3MoeConfig 128,
// top-8, 768; both decoder_sparse_step 1, mlp_only_layers [].
void read_qwen_moe(HfReader& r, ModelDraft& d, bool qwen2) {
  const auto experts = r.integer("num_experts");
  if (experts && *experts < 0) {
    r.add("\"num_experts\"=" + std::to_string(*experts) + " must be >= 0 (0: a dense model)");
    return;
  }
  MoeSpec e;
  e.num_experts = experts ? *experts : (qwen2 ? 60 : 128);
  if (e.num_experts == 0) return;  // no sparse block: every layer is a dense MLP
  e.router_topk = positive_or(r, "num_experts_per_tok", qwen2 ? 4 : 8);
  e.moe_ffn_hidden = positive_or(r, "moe_intermediate_size", qwen2 ? 1408 : 768);
  if (qwen2) {
    const auto shared = r.integer("shared_expert_intermediate_size");
    if (shared && *shared < 0)
      r.add("\"shared_expert_intermediate_size\"=" + std::to_string(*shared) + " must be >= 0");
    e.shared_expert_ffn_hidden = !shared ? 5632 : std::max<int64_t>(*shared, 0);
  }
  e.router_score = RouterScore::softmax;
  const int64_t step = positive_or(r, "decoder_sparse_step", 1);
  const auto only = r.integer_list("mlp_only_layers");
  std::set<int64_t> dense;
  if (only) dense.insert(only->begin(), only->end());
  d.moe = e;
  d.moe_layer = [step, dense](int64_t i) { return !dense.count(i) && (i + 1) % step == 0; };
}

// DeepSeek-V2 / V3 and Kimi-K2 (which ships DeepSeek-V3's code). Key names and defaults:
// transformers configuration_deepseek_v2.py / configuration_deepseek_v3.py (DeepseekV2Config,
// DeepseekV3Config) and, for the keys only DeepSeek's own configuration_deepseek.py has
// (scoring_func, topk_method, moe_layer_freq, num_nextn_predict_layers), the routing that
// transformers hard-codes: DeepseekV2Moe a softmax router, greedy top-k; DeepseekV3MoE a sigmoid
// router with the aux-loss-free score bias (e_score_correction_bias) and group-limited top-k.
//  - Layer i is MoE when i >= first_k_dense_replace and i % moe_layer_freq == 0 (DeepSeek's
//    DecoderLayer); intermediate_size is the dense layers' MLP.
//  - n_routed_experts experts of moe_intermediate_size, top num_experts_per_tok; n_shared_experts
//    shared experts of moe_intermediate_size run as one MLP of n_shared x moe_intermediate_size.
//  - scoring_func softmax | sigmoid; topk_method greedy (no groups), group_limited_greedy
//    (n_group groups, the top topk_group of them), noaux_tc (as group_limited_greedy, with the
//    aux-loss-free expert bias of DeepSeek-V3 Sec 2.1.2).
//  - MLA (DeepSeek-V2 Sec 2.1): q_lora_rank (null: queries projected directly, V2-Lite),
//    kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim.
//  - num_nextn_predict_layers: DeepSeek-V3's multi-token prediction modules (Sec 2.2);
//    transformers' DeepseekV3ForCausalLM has none, so absent means 0.
// Defaults: DeepseekV3Config 256 experts, top-8, 2048, 1 shared, first 3 dense, 8 groups top-4,
// q/kv ranks 1536 / 512, head sizes 128 / 64 / 128; DeepseekV2Config 64 experts, 1407, 2 shared,
// first 0 dense, no groups, the same MLA sizes, and no default for num_experts_per_tok.
void read_deepseek(HfReader& r, ModelDraft& d, const std::string& type) {
  const bool v2 = type == "deepseek_v2";
  // MLA.
  MlaSpec a;
  if (r.is_null("q_lora_rank")) a.q_lora_rank = 0;
  else a.q_lora_rank = positive_or(r, "q_lora_rank", 1536);
  a.kv_lora_rank = positive_or(r, "kv_lora_rank", 512);
  a.qk_nope_head_dim = positive_or(r, "qk_nope_head_dim", 128);
  const auto rope = r.integer("qk_rope_head_dim");
  if (rope && *rope < 0) r.add("\"qk_rope_head_dim\"=" + std::to_string(*rope) + " must be >= 0");
  a.qk_rope_head_dim = rope && *rope >= 0 ? *rope : 64;
  a.v_head_dim = positive_or(r, "v_head_dim", 128);
  d.mla = a;
  // Values transformers derives from these (DeepseekV3Config: head_dim = qk_rope_head_dim for
  // the rotary embedding, qk_head_dim = qk_nope_head_dim + qk_rope_head_dim): accepted when equal.
  if (auto hd = r.integer("head_dim"); hd && *hd != a.qk_rope_head_dim)
    r.add("\"head_dim\"=" + std::to_string(*hd) + " is not qk_rope_head_dim=" + std::to_string(a.qk_rope_head_dim) +
          " (the value transformers derives); MLA's head sizes are qk_nope_head_dim, qk_rope_head_dim and v_head_dim");
  if (auto qk = r.integer("qk_head_dim"); qk && *qk != a.qk_nope_head_dim + a.qk_rope_head_dim)
    r.add("\"qk_head_dim\"=" + std::to_string(*qk) + " is not qk_nope_head_dim + qk_rope_head_dim = " +
          std::to_string(a.qk_nope_head_dim + a.qk_rope_head_dim));
  // Multi-token prediction.
  const auto mtp = r.integer("num_nextn_predict_layers");
  if (mtp && *mtp < 0) r.add("\"num_nextn_predict_layers\"=" + std::to_string(*mtp) + " must be >= 0");
  d.mtp_layers = mtp && *mtp >= 0 ? *mtp : 0;
  // Experts (n_routed_experts null: a dense model, as DeepSeek's DecoderLayer reads it).
  if (r.is_null("n_routed_experts")) return;
  const auto experts = r.integer("n_routed_experts");
  if (experts && *experts < 0) {
    r.add("\"n_routed_experts\"=" + std::to_string(*experts) + " must be >= 0 (0: a dense model)");
    return;
  }
  MoeSpec e;
  e.num_experts = experts ? *experts : (v2 ? 64 : 256);
  if (e.num_experts == 0) return;
  if (v2 && !r.contains("num_experts_per_tok"))
    r.add("\"num_experts_per_tok\" is missing (DeepseekV2Config has no default): give the experts per token");
  e.router_topk = positive_or(r, "num_experts_per_tok", 8);
  e.moe_ffn_hidden = positive_or(r, "moe_intermediate_size", v2 ? 1407 : 2048);
  int64_t shared = v2 ? 2 : 1;
  if (r.is_null("n_shared_experts")) shared = 0;
  else if (auto v = r.integer("n_shared_experts")) {
    if (*v < 0) r.add("\"n_shared_experts\"=" + std::to_string(*v) + " must be >= 0");
    shared = std::max<int64_t>(*v, 0);
  }
  // Checked: both factors come from the file (the experiment checks bound the product).
  if (const auto width = checked::mul(shared, e.moe_ffn_hidden)) e.shared_expert_ffn_hidden = *width;
  else
    r.add("\"n_shared_experts\"=" + std::to_string(shared) + " x \"moe_intermediate_size\"=" +
          std::to_string(e.moe_ffn_hidden) + " does not fit in a 64-bit integer");
  const auto first = r.integer("first_k_dense_replace");
  if (first && *first < 0) r.add("\"first_k_dense_replace\"=" + std::to_string(*first) + " must be >= 0");
  e.first_k_dense = first && *first >= 0 ? *first : (v2 ? 0 : 3);
  const int64_t freq = positive_or(r, "moe_layer_freq", 1);
  e.layer_freq = freq;
  // Router score.
  const std::string score = r.text("scoring_func").value_or(v2 ? "softmax" : "sigmoid");
  if (score == "softmax") e.router_score = RouterScore::softmax;
  else if (score == "sigmoid") e.router_score = RouterScore::sigmoid;
  else r.add("\"scoring_func\"=" + quote(score) + " is not supported (supported: softmax, sigmoid)");
  // Top-k method and expert groups.
  const std::string method = r.text("topk_method").value_or(v2 ? "greedy" : "noaux_tc");
  bool grouped = false;
  if (method == "greedy") {
  } else if (method == "group_limited_greedy") {
    grouped = true;
  } else if (method == "noaux_tc") {
    grouped = true;
    e.router_expert_bias = true;
  } else {
    r.add("\"topk_method\"=" + quote(method) + " is not supported (supported: greedy, group_limited_greedy, noaux_tc)");
  }
  const auto groups = r.integer("n_group");
  const auto group_topk = r.integer("topk_group");
  const int64_t g = groups ? *groups : (v2 || r.is_null("n_group") ? 0 : 8);
  if (grouped && g > 1) {  // one group (Kimi-K2: n_group 1) limits nothing
    e.router_num_groups = g;
    e.router_group_topk = group_topk ? *group_topk : (v2 || r.is_null("topk_group") ? 0 : 4);
  }
  d.moe = e;
  // DeepSeek's rule counts layer_freq from layer 0, MoeSpec's from first_k_dense: a per-layer
  // list when they differ (read_model).
  d.moe_layer = [first = e.first_k_dense, freq](int64_t i) { return i >= first && i % freq == 0; };
}

// transformers configuration_gpt_oss.py (GptOssConfig) and modeling_gpt_oss.py: every layer's
// MLP is a sparse block (GptOssMLP) of num_local_experts experts of intermediate_size, the top
// num_experts_per_tok of a router whose softmax runs over the selected logits
// (GptOssTopKRouter); the experts' SwiGLU is clamped (swiglu_limit, swiglu_alpha: values, not
// cost). Every attention layer has learned sinks (GptOssAttention.sinks, one logit per head)
// and the layers that layer_types marks "sliding_attention" (GptOssConfig default: the even
// layers) attend to the last sliding_window tokens. The linear biases (attention_bias, default
// True; the experts' gate_up / down biases and the router's) are vectors, 0.01% of
// GPT-OSS-120B's parameters and element-wise FLOPs, left out as Qwen2's qkv_bias is.
// OpenAI's config.json also spells the top-k experts_per_token, and the expert count may be
// num_experts (GptOssConfig.attribute_map). Defaults: 128 experts, top-4, 8 key/value heads,
// head_dim 64, window 128, tie_word_embeddings False.
void read_gpt_oss(HfReader& r, ModelDraft& d) {
  MoeSpec e;
  const auto local = r.integer("num_local_experts"), alias = r.integer("num_experts");
  if (local && alias && *local != *alias)
    r.add("\"num_local_experts\"=" + std::to_string(*local) + " and \"num_experts\"=" + std::to_string(*alias) +
          " name the same count (GptOssConfig.attribute_map) and differ");
  e.num_experts = positive_or(r, local || !alias ? "num_local_experts" : "num_experts", 128);
  const auto topk = r.integer("num_experts_per_tok"), topk2 = r.integer("experts_per_token");
  if (topk && topk2 && *topk != *topk2)
    r.add("\"num_experts_per_tok\"=" + std::to_string(*topk) + " and \"experts_per_token\"=" + std::to_string(*topk2) +
          " name the same top-k and differ");
  e.router_topk = positive_or(r, topk || !topk2 ? "num_experts_per_tok" : "experts_per_token", 4);
  e.router_score = RouterScore::softmax;
  d.moe = e;
  d.moe_ffn_is_ffn_hidden = true;  // the experts are intermediate_size wide
  if (!d.kv_heads && !r.contains("num_key_value_heads")) d.kv_heads = 8;
  d.hf_attention_bias.reset();  // the biases are left out (above), not a modelling error
  d.hf_mlp_bias.reset();
  d.sinks = true;
  d.hf_sliding_window = r.contains("sliding_window") ? r.integer("sliding_window") : std::optional<int64_t>(128);
  if (auto types = read_layer_types(r, "sliding_attention")) {
    d.hf_window_layers = *types;
  } else {
    d.hf_window_layers = {1, 0};  // (i + 1) % 2: even layers slide
    d.hf_window_periodic = true;
  }
}

// Llama 4 (transformers configuration_llama4.py Llama4TextConfig, modeling_llama4.py). A
// layer is MoE when its index is in moe_layers (default: every interleave_moe_layer_step-th
// layer, the first at step - 1; Scout 1, Maverick 2): num_local_experts SwiGLU experts of
// intermediate_size, the top num_experts_per_tok by a sigmoid of the router logits
// (Llama4Router), and a shared expert of intermediate_size beside them (Llama4TextMoe);
// the other layers have a dense MLP of intermediate_size_mlp. The layers that layer_types
// marks "chunked_attention" (default: the RoPE layers of no_rope_layers, else all but every
// no_rope_layer_interval-th: three of four) attend within chunks of attention_chunk_size
// tokens. use_qk_norm (an L2 norm of q and k), attn_temperature_tuning / floor_scale /
// attn_scale (a per-position scale of the NoPE layers' queries): element-wise, values.
// Defaults: 16 experts, top-1, 8192 / 16384, 8 key/value heads, head_dim 128, chunk 8192.
void read_llama4(HfReader& r, ModelDraft& d) {
  d.ffn_hidden = r.contains("intermediate_size_mlp") ? r.integer("intermediate_size_mlp") : std::optional<int64_t>(16384);
  d.json_key["ffn_hidden"] = "intermediate_size_mlp";
  if (!d.kv_heads && !r.contains("num_key_value_heads")) d.kv_heads = 8;
  MoeSpec e;
  e.num_experts = positive_or(r, "num_local_experts", 16);
  e.router_topk = positive_or(r, "num_experts_per_tok", 1);
  e.moe_ffn_hidden = positive_or(r, "intermediate_size", 8192);
  e.shared_expert_ffn_hidden = e.moe_ffn_hidden;
  e.router_score = RouterScore::sigmoid;
  d.moe = e;
  const int64_t layers = d.layers.value_or(0);
  if (auto list = r.integer_list("moe_layers")) {
    std::set<int64_t> moe(list->begin(), list->end());
    for (int64_t i : moe)
      if (i < 0 || (layers > 0 && i >= layers))
        r.add("\"moe_layers\" has " + std::to_string(i) + ", not a layer index of \"num_hidden_layers\"=" +
              std::to_string(layers));
    d.moe_layer = [moe](int64_t i) { return moe.count(i) > 0; };
  } else {
    const int64_t step = positive_or(r, "interleave_moe_layer_step", 1);
    d.moe_layer = [step](int64_t i) { return (i + 1) % step == 0; };
  }
  d.hf_sliding_window = r.contains("attention_chunk_size") ? r.integer("attention_chunk_size") : std::optional<int64_t>(8192);
  d.hf_window_chunked = true;
  if (auto types = read_layer_types(r, "chunked_attention")) {
    d.hf_window_layers = *types;
    return;
  }
  if (auto rope = r.integer_list("no_rope_layers"); rope && !rope->empty()) {
    if (layers > 0 && static_cast<int64_t>(rope->size()) < layers) {
      r.add("\"no_rope_layers\" has " + std::to_string(rope->size()) + " entries; \"num_hidden_layers\"=" +
            std::to_string(layers) + " needs at least one per layer");
      return;
    }
    for (size_t i = 0; i < rope->size() && (layers <= 0 || static_cast<int64_t>(i) < layers); ++i)
      d.hf_window_layers.push_back((*rope)[i] != 0 ? 1 : 0);
    return;
  }
  const int64_t interval = positive_or(r, "no_rope_layer_interval", 4);
  if (interval > limits::kMaxLayers) {  // one flag per layer of the period is kept
    r.add("\"no_rope_layer_interval\"=" + std::to_string(interval) + " exceeds the " +
          checked::with_commas(limits::kMaxLayers) + "-layer limit (" + limits::kMaxLayersWhy + ")");
    return;
  }
  for (int64_t i = 0; i < interval; ++i) d.hf_window_layers.push_back((i + 1) % interval != 0 ? 1 : 0);
  d.hf_window_periodic = true;
}

}  // namespace

bool read_hf_config(const std::string& key_path, const std::string& value, const std::string& base_dir,
                    ModelDraft& d, const HfFail& fail) {
  const fs::path file = fs::path(value).is_absolute() ? fs::path(value) : fs::path(base_dir) / value;
  const std::string where = key_path + "=" + quote(value);
  if (auto why = input_path_problem(file.string())) {
    fail(where + ": cannot read " + file.string() + ": " + *why);
    return false;
  }
  std::ifstream in(file);
  if (!in) {
    fail(where + ": cannot read " + file.string() + " (not readable)");
    return false;
  }
  note_input_file(file.string());
  nlohmann::json j;
  // A key twice in one object: JSON (RFC 8259 Sec. 4) says names SHOULD be unique and leaves
  // the meaning open; nlohmann keeps the last and Python's json the last too, silently. An
  // error here, as a duplicate YAML key is.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  // Nesting beyond kMaxJsonDepth levels is refused while parsing: a config.json nests three or
  // four levels (rope_scaling, text_config, quantization_config), and the recursive walks of a
  // document (comparison, dump, destruction) would overflow the stack at about 100,000 levels.
  // The same bound as YAML inputs (models/yaml_text.hpp).
  constexpr int kMaxJsonDepth = 500;
  struct TooDeep {};
  const auto on_event = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (depth > kMaxJsonDepth) throw TooDeep{};
    if (event == nlohmann::json::parse_event_t::object_start) open_objects.emplace_back();
    else if (event == nlohmann::json::parse_event_t::object_end && !open_objects.empty()) open_objects.pop_back();
    else if (event == nlohmann::json::parse_event_t::key && !open_objects.empty() &&
             !open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  try {
    j = nlohmann::json::parse(in, on_event);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for a number like 1e400
    fail(where + ": " + file.string() + " is not valid JSON (" + e.what() + ")");
    return false;
  } catch (const TooDeep&) {
    fail(where + ": " + file.string() + " nests objects or arrays more than " + std::to_string(kMaxJsonDepth) +
         " levels deep (a config.json nests a few)");
    return false;
  }
  if (!duplicate.empty()) {
    fail(where + ": " + file.string() + " has the key " + quote(duplicate) + " twice in one object (keep one)");
    return false;
  }
  if (!j.is_object()) {
    fail(where + ": " + file.string() + " is not a JSON object");
    return false;
  }
  HfReader outer(fail, j, where);
  const auto family = detect_family(outer, j);
  if (!family) return false;
  const std::string type =
      j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : "";
  // Llama 4's published files are Llama4Config: the text decoder's keys in text_config, the
  // image encoder in vision_config, which dtsim does not simulate (a text-only step never runs
  // it); the model's name says that only the text decoder is modelled.
  const bool vlm = *family == HfFamily::llama4 && type == "llama4";
  if (vlm && !(j.contains("text_config") && j["text_config"].is_object())) {
    outer.add("model_type \"llama4\" needs \"text_config\", an object with the text decoder's keys");
    return false;
  }
  const nlohmann::json& body = vlm ? j["text_config"] : j;
  // Keys dtsim neither reads nor knows to be harmless, and unmodelled features that are on.
  for (const auto& msg : hf_key_problems(j, vlm ? HfKeyFamily::llama4_vlm : *family)) outer.add(msg);
  if (vlm)
    for (const auto& msg : hf_key_problems(body, *family)) outer.add("text_config: " + msg);
  HfReader r(fail, body, vlm ? where + " text_config" : where);
  d.hf_where = where;

  d.name = outer.text("_name_or_path");
  if (!d.name || d.name->empty()) d.name = file.stem().string();
  if (vlm) *d.name += " (text_config)";

  switch (*family) {
    case HfFamily::llama:  // Llama, Mistral, Qwen2, Qwen3 (transformers LlamaConfig key names)
      read_llama_like(r, d);
      read_head_dim(r, d, type);
      read_sliding_window(r, d, type);
      break;
    case HfFamily::mixtral:
      read_llama_like(r, d);
      read_head_dim(r, d, type);
      read_sliding_window(r, d, type);
      read_mixtral(r, d);
      break;
    case HfFamily::qwen2_moe:
    case HfFamily::qwen3_moe:
      read_llama_like(r, d);
      read_head_dim(r, d, type);
      read_sliding_window(r, d, type);
      read_qwen_moe(r, d, *family == HfFamily::qwen2_moe);
      break;
    case HfFamily::deepseek:
      read_llama_like(r, d);
      read_deepseek(r, d, type);
      break;
    case HfFamily::gpt_oss:
      read_llama_like(r, d);
      read_head_dim(r, d, type);
      read_gpt_oss(r, d);
      break;
    case HfFamily::llama4:
      read_llama_like(r, d);
      read_head_dim(r, d, type);
      read_llama4(r, d);
      break;
    case HfFamily::llama4_vlm:  // never detected: a llama4 file reads as llama4 (text_config)
      break;
    case HfFamily::gpt2:  // transformers GPT2Config
      d.json_key = {{"layers", "n_layer"}, {"hidden", "n_embd"}, {"heads", "n_head"}, {"vocab", "vocab_size"}};
      d.layers = r.integer("n_layer");
      d.hidden = r.integer("n_embd");
      d.heads = r.integer("n_head");
      d.kv_heads = d.heads;
      d.ffn_hidden = r.integer("n_inner");  // null -> 4 * n_embd (GPT2Config docs)
      if (!d.ffn_hidden && d.hidden) d.ffn_hidden = 4 * *d.hidden;
      d.json_key["ffn_hidden"] = "n_inner (or n_embd)";
      d.vocab = r.integer("vocab_size");
      d.activation = r.activation("activation_function", false);
      if (!d.activation && !r.contains("activation_function")) d.activation = Activation::gelu;
      d.tied = r.boolean("tie_word_embeddings");  // GPT-2 ties input and output embeddings
      if (!d.tied) d.tied = true;
      d.norm = Norm::layernorm;
      d.position = Position::learned;
      d.max_pos = r.integer("n_positions");
      if (!d.max_pos) d.max_pos = r.integer("n_ctx");
      break;
    case HfFamily::neox:  // transformers GPTNeoXConfig
      d.json_key = {{"layers", "num_hidden_layers"},  {"hidden", "hidden_size"},
                    {"heads", "num_attention_heads"}, {"ffn_hidden", "intermediate_size"},
                    {"vocab", "vocab_size"}};
      d.layers = r.integer("num_hidden_layers");
      d.hidden = r.integer("hidden_size");
      d.heads = r.integer("num_attention_heads");
      d.kv_heads = d.heads;
      d.ffn_hidden = r.integer("intermediate_size");
      d.vocab = r.integer("vocab_size");
      d.activation = r.activation("hidden_act", false);
      if (!d.activation && !r.contains("hidden_act")) d.activation = Activation::gelu;
      d.hf_attention_bias = r.boolean("attention_bias");  // GPTNeoXConfig default: True
      if (!d.hf_attention_bias) d.hf_attention_bias = true;
      d.tied = r.boolean("tie_word_embeddings");  // GPTNeoXConfig default: false
      if (!d.tied) d.tied = false;
      d.norm = Norm::layernorm;
      d.position = Position::rope;  // rotary embeddings (rotary_pct of each head)
      d.max_pos = r.integer("max_position_embeddings");
      break;
  }
  return true;
}

}  // namespace dtsim
