// Experiment files: YAML schema, `--set` overrides, Hugging Face config.json import; the
// cross-section checks run after parsing are in models/experiment_check.cpp. See
// models/experiment_io.hpp for the contract.
//
// Schema (every key not listed here is an error naming its dotted path):
//   title: string (optional)
//   published: {step_time_s, tflops_per_gpu, tflops_basis (model|hardware; model), mfu,
//          memory {source, model_states|activations|peak: {stage (0), value (bytes)}},
//          source} (optional)
//   model: name, layers, hidden, heads, kv_heads (= heads), ffn_hidden, activation
//          (gelu|swiglu), vocab, tied_embeddings, norm (layernorm|rmsnorm), position
//          (learned|rope), max_position_embeddings (optional; positive), hf_config (optional
//          PATH, relative to the YAML file; YAML keys beside it override the JSON, model.moe
//          and model.mla key by key over the JSON's experts and MLA; every key of the JSON is
//          read, harmless or an error: models/hf_config_keys.hpp, read by
//          models/hf_config_read.cpp; model_type llama, mistral, qwen2, qwen3, mixtral,
//          qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3, kimi_k2, gpt_oss, llama4,
//          llama4_text, gpt2, gpt_neox), head_dim, mtp_layers (0; multi-token prediction
//          depths run with the loss, models/blocks/mtp.hpp), moe {...} / mla {...} /
//          attention {...} (models/moe_checks.hpp checks them; Megatron-Core's names)
//   cluster: name (optional), gpu (PRESET, a GPU FILE - *.yaml / *.yml or a path with "/",
//          relative to the YAML file, topologies/preset_files.hpp - or {preset (PRESET or FILE),
//          name, peak_bf16, peak_fp8, hbm,
//          hbm_bandwidth, gemm_efficiency, memory_efficiency, kernel_overhead, sm_count,
//          attention_efficiency, profile, kernel_tables (none|a100_sxm|h100_sxm|h200_sxm|
//          b200_sxm; the preset's, dropped by peak_bf16/peak_fp8/gemm_efficiency/sm_count),
//          sustained_ratio ((0, 1]; the preset's, else 1)}),
//          node (PRESET or a node FILE, optional), nodes, gpus_per_node, intra_node
//          (nvswitch|xgmi-mesh; the node preset's, else nvswitch: models/experiment.hpp
//          IntraNode), nvlink {bandwidth, latency, efficiency, nvls_efficiency (node preset,
//          else 0 = no NVLS; must be 0 on xgmi-mesh)} (nvswitch: per GPU into the switch;
//          xgmi-mesh: per direction of ONE peer link, e.g. MI300X 64 GB/s x 7 links), nics_per_node, nic
//          {bandwidth, latency, efficiency}, fabric (TYPE or {type, nodes_per_leaf,
//          oversubscription (1), leaves_per_pod, pod_oversubscription (1)}; TYPE one of
//          topologies/fabrics/fabric.hpp, non-blocking by default; the keys a type reads
//          and requires are listed there), collectives {algorithm (auto), protocol (auto)},
//          hbm_reserve, host_dispatch (time per eager kernel launch on the host CPU; the node
//          preset's, else 13.48 us: topologies/nodes/README.md)
//   layout: dp (integer or auto), tp, cp (1), pp (1), vp (1), schedule (1f1b|gpipe|
//          interleaved|zb-h1|zb-h2|dualpipev|dualpipe, models/schedules/; interleaved when
//          vp > 1, else 1f1b), zero_stage (0),
//          sequence_parallel (false), recompute (none|selective|full; none),
//          account_for_embedding_in_pipeline_split (false), account_for_loss_in_pipeline_split
//          (false), decoder_first_pipeline_num_layers, decoder_last_pipeline_num_layers,
//          pipeline_layout (Megatron-Core's split options: models/pipeline_split.hpp)
//   training: seq_len, global_batch, micro_batch, precision (bf16|fp8-delayed|fp8-current|
//          fp8-block|mxfp8|nvfp4; bf16; models/precision.hpp) or its alias dtype (bf16|fp8 =
//          fp8-delayed), fp8_param_gather (false), first_last_layers_bf16 (false),
//          num_layers_at_start_in_bf16 (1), num_layers_at_end_in_bf16 (1), flash_attention
//          (true), overlap_grad_reduce (true), framework (megatron|deepspeed|zero-paper|fsdp;
//          megatron), main_grad (fp32|bf16; fp32), grad_bucket (bytes; framework default),
//          stage3_max_reuse_distance, stage3_max_live_parameters (elements; 1e9: DeepSpeed
//          ZeRO-3, models/zero3.hpp),
//          overlap_param_gather (false), tp_comm_overlap (false),
//          reduce_every_micro_batch (false), comm_interference (true), overlap_p2p (false),
//          moe_token_dispatcher (alltoall|deepep|hybridep; alltoall), moe_deepep_num_sms (20),
//          moe_hybridep_num_sms (24), delay_wgrad_compute (false), moe_shared_expert_overlap
//          (false), overlap_moe_expert_parallel_comm (false; combined forward-backward passes,
//          models/combined_1f1b.hpp),
//          cuda_graphs (false|true|layers|full_iteration; false: true = layers;
//          models/host_dispatch.hpp)
#include "models/calibration/gemm_table.hpp"
#include "models/experiment_io.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>
#include <utility>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "models/checked.hpp"
#include "models/errors.hpp"
#include "models/experiment_check.hpp"
#include "models/hf_config_read.hpp"
#include "models/input_files.hpp"
#include "models/schedules/schedule.hpp"
#include "models/path_problem.hpp"
#include "models/pipeline_split.hpp"
#include "models/plan.hpp"
#include "models/precision.hpp"
#include "models/scalar_text.hpp"
#include "models/units.hpp"
#include "models/yaml_text.hpp"
#include "topologies/collective_names.hpp"
#include "topologies/fabrics/fabric.hpp"
#include "topologies/gpu_presets.hpp"
#include "topologies/node_presets.hpp"
#include "topologies/preset_files.hpp"

namespace dtsim {

namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------
// Schema: the valid keys of every map in the file, by dotted path.

const std::vector<std::string>* keys_of(const std::string& map_path) {
  static const std::map<std::string, std::vector<std::string>> schema = {
      {"", {"title", "model", "cluster", "layout", "training", "published"}},
      {"model",
       {"name", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "activation", "vocab",
        "tied_embeddings", "norm", "position", "max_position_embeddings", "hf_config", "head_dim", "moe", "mla",
        "attention", "mtp_layers"}},
      {"model.moe",
       {"num_experts", "router_topk", "moe_ffn_hidden", "shared_expert_ffn_hidden", "first_k_dense", "layer_freq",
        "router_score_function", "router_enable_expert_bias", "router_num_groups", "router_group_topk",
        "capacity_factor", "pad_to_capacity", "load_balancing", "load_imbalance"}},
      {"model.mla", {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"}},
      {"model.attention", {"window", "window_pattern", "chunked", "sinks"}},
      {"cluster",
       {"name", "gpu", "node", "nodes", "gpus_per_node", "intra_node", "nvlink", "nics_per_node", "nic", "fabric",
        "collectives", "hbm_reserve", "host_dispatch"}},
      {"cluster.gpu",
       {"preset", "name", "peak_bf16", "peak_fp8", "peak_fp4", "microscaling", "hbm", "hbm_bandwidth", "gemm_efficiency",
        "memory_efficiency", "kernel_overhead", "sm_count", "attention_efficiency", "profile", "kernel_tables",
        "sustained_ratio"}},
      {"cluster.nvlink", {"bandwidth", "latency", "efficiency", "nvls_efficiency"}},
      {"cluster.nic", {"bandwidth", "latency", "efficiency"}},
      {"cluster.fabric", {"type", "nodes_per_leaf", "oversubscription", "leaves_per_pod", "pod_oversubscription"}},
      {"cluster.collectives", {"algorithm", "protocol"}},
      {"layout",
       {"dp", "tp", "cp", "pp", "vp", "schedule", "zero_stage", "sequence_parallel", "recompute",
        "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
        "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers", "pipeline_layout", "ep", "etp"}},
      {"training",
       {"seq_len", "global_batch", "micro_batch", "precision", "dtype", "fp8_param_gather", "first_last_layers_bf16",
        "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16", "flash_attention", "overlap_grad_reduce",
        "framework", "main_grad", "grad_bucket", "stage3_max_reuse_distance", "stage3_max_live_parameters",
        "overlap_param_gather", "tp_comm_overlap",
        "reduce_every_micro_batch", "comm_interference", "overlap_p2p", "moe_token_dispatcher", "moe_deepep_num_sms",
        "moe_hybridep_num_sms",
        "overlap_moe_expert_parallel_comm", "delay_wgrad_compute", "moe_shared_expert_overlap", "cuda_graphs"}},
      {"published", {"step_time_s", "tflops_per_gpu", "tflops_basis", "mfu", "source", "memory"}},
      {"published.memory", {"source", "model_states", "activations", "peak"}},
      {"published.memory.model_states", {"stage", "value"}},
      {"published.memory.activations", {"stage", "value"}},
      {"published.memory.peak", {"stage", "value"}},
  };
  auto it = schema.find(map_path);
  return it == schema.end() ? nullptr : &it->second;
}

std::string join_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

std::string join_list(const std::vector<std::string>& items) { return text::join(items); }


std::string describe_node(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Scalar: return "a scalar";
    case YAML::NodeType::Null: return "empty";
    case YAML::NodeType::Undefined: return "undefined";
  }
  return "?";
}

using text::quote;
using text::to_bool;
using text::to_double;
using text::to_int;

template <class E>
using Choices = std::vector<std::pair<std::string, E>>;

template <class E>
std::string choice_names(const Choices<E>& choices) {
  std::vector<std::string> names;
  for (const auto& c : choices) names.push_back(c.first);
  return join_list(names);
}

const Choices<Activation> kActivations = {{"gelu", Activation::gelu}, {"swiglu", Activation::swiglu}};
const Choices<Norm> kNorms = {{"layernorm", Norm::layernorm}, {"rmsnorm", Norm::rmsnorm}};
const Choices<Position> kPositions = {{"learned", Position::learned}, {"rope", Position::rope}};
const Choices<Recompute> kRecomputes = {
    {"none", Recompute::none}, {"selective", Recompute::selective}, {"full", Recompute::full}};
// training.dtype, the alias of training.precision (models/precision.hpp).
const Choices<Precision> kDtypeAliases = {{"bf16", Precision::bf16}, {"fp8", Precision::fp8_delayed}};
const Choices<IntraNode> kIntraNodes = {{"nvswitch", IntraNode::nvswitch}, {"xgmi-mesh", IntraNode::xgmi_mesh}};
const Choices<RouterScore> kRouterScores = {{"softmax", RouterScore::softmax}, {"sigmoid", RouterScore::sigmoid}};
const Choices<RouterBalance> kBalances = {{"forced", RouterBalance::forced},
                                          {"measured", RouterBalance::measured},
                                          {"aux_loss", RouterBalance::aux_loss},
                                          {"aux_free", RouterBalance::aux_free}};
const Choices<CudaGraphs> kCudaGraphs = {{"false", CudaGraphs::none},
                                         {"true", CudaGraphs::layers},
                                         {"layers", CudaGraphs::layers},
                                         {"full_iteration", CudaGraphs::full_iteration}};
const Choices<std::string> kDispatchers = {{"alltoall", "alltoall"}, {"deepep", "deepep"}, {"hybridep", "hybridep"}};
// Every registered pipeline schedule by its name (models/schedules/registry.cpp).
const Choices<Schedule> kSchedules = [] {
  Choices<Schedule> c;
  for (const sched::PipelineSchedule* s : sched::all_schedules()) c.push_back({s->name(), s->id()});
  return c;
}();
const Choices<GradDtype> kGradDtypes = {{"fp32", GradDtype::fp32}, {"bf16", GradDtype::bf16}};
const Choices<Framework> kFrameworks = {
    {"megatron", Framework::megatron}, {"deepspeed", Framework::deepspeed}, {"zero-paper", Framework::zero_paper},
    {"fsdp", Framework::fsdp}};

// ---------------------------------------------------------------------------------------
// Parse context: the problem list plus the keys that failed to parse ("bad" keys). The
// cross-section checks skip any check that involves a bad key, so each mistake is reported
// once, while problems in unrelated keys are still all reported together.

class Context {
 public:
  explicit Context(ProblemList& problems) : problems_(problems) {}
  /// Reports `message` and marks `key` (a dotted path; a map marks everything below it).
  void fail(const std::string& key, const std::string& message) {
    bad_.insert(key);
    problems_.add(message);
  }
  /// Marks `key` without a message (it depends on a key that has its own problem).
  void mark(const std::string& key) { bad_.insert(key); }
  /// Reports `message` without marking a key (e.g. an unknown key: its value is ignored).
  void note(const std::string& message) { problems_.add(message); }
  const std::set<std::string>& bad() const { return bad_; }

 private:
  ProblemList& problems_;
  std::set<std::string> bad_;
};

// ---------------------------------------------------------------------------------------
// Reader: typed access to one YAML map with the dotted path for messages. Problems go to
// the shared ProblemList; a getter returns nullopt when the key is absent or invalid.

class Reader {
 public:
  Reader(Context& ctx, YAML::Node node, std::string path)
      : ctx_(ctx), node_(std::move(node)), path_(std::move(path)) {}
  /// A map whose valid keys are `keys` rather than the experiment schema's (preset files).
  Reader(Context& ctx, YAML::Node node, std::string path, const std::vector<std::string>* keys)
      : ctx_(ctx), node_(std::move(node)), path_(std::move(path)), keys_(keys) {}

  /// True when the node is a map; reports unknown and duplicate keys. An absent node
  /// (undefined) is fine and reads as an empty map.
  bool check_map() {
    if (!node_.IsDefined() || node_.IsNull()) return true;
    if (!node_.IsMap()) {
      ctx_.fail(path_, (path_.empty() ? std::string("the file") : path_) + " must be a map (got " +
                           describe_node(node_) + ")");
      valid_ = false;
      return false;
    }
    const std::vector<std::string>* valid = keys_ ? keys_ : keys_of(path_);
    std::set<std::string> seen;
    for (const auto& kv : node_) {
      if (!kv.first.IsScalar()) {
        ctx_.note("a key under " + (path_.empty() ? std::string("the top level") : path_) + " is not a scalar");
        continue;
      }
      const std::string key = kv.first.Scalar();
      if (!seen.insert(key).second) ctx_.fail(join_path(path_, key), "duplicate key " + join_path(path_, key));
      if (valid && std::find(valid->begin(), valid->end(), key) == valid->end())
        ctx_.note("unknown key " + join_path(path_, key) + " (valid keys" +
                      (path_.empty() ? std::string("") : " under " + path_) + ": " + join_list(*valid) + ")");
    }
    return true;
  }

  bool has(const std::string& key) const {
    return valid_ && node_.IsDefined() && node_.IsMap() && get(key).IsDefined();
  }
  YAML::Node child(const std::string& key) const {
    if (!has(key)) return YAML::Node(YAML::NodeType::Undefined);
    return get(key);
  }
  std::string path(const std::string& key) const { return join_path(path_, key); }
  const std::string& path() const { return path_; }
  Context& ctx() { return ctx_; }

  std::optional<std::string> scalar(const std::string& key) {
    if (!has(key)) return std::nullopt;
    const YAML::Node n = get(key);
    if (n.IsNull()) {
      ctx_.fail(path(key), path(key) + " has no value (give one or remove the key)");
      return std::nullopt;
    }
    if (!n.IsScalar()) {
      ctx_.fail(path(key), path(key) + " must be a single value (got " + describe_node(n) + ")");
      return std::nullopt;
    }
    return n.Scalar();
  }

  std::optional<std::string> text(const std::string& key) { return scalar(key); }

  std::optional<int64_t> integer(const std::string& key) {
    auto s = scalar(key);
    if (!s) return std::nullopt;
    auto v = to_int(*s);
    if (!v) {
      // Digits that overflow 64 bits are an integer out of range, not "not an integer".
      const size_t digits_from = !s->empty() && ((*s)[0] == '-' || (*s)[0] == '+') ? 1 : 0;
      const bool digits = s->size() > digits_from &&
                          s->find_first_not_of("0123456789", digits_from) == std::string::npos;
      ctx_.fail(path(key), path(key) + "=" + quote(*s) +
                               (digits ? " does not fit in a 64-bit integer (far above every limit of dtsim)"
                                       : " is not an integer"));
    }
    return v;
  }

  std::optional<double> number(const std::string& key) {
    auto s = scalar(key);
    if (!s) return std::nullopt;
    auto v = to_double(*s);
    if (!v) ctx_.fail(path(key), path(key) + "=" + quote(*s) + " is not a number");
    return v;
  }

  /// A dimensionless fraction: a number, or a ratio "A / B" of two numbers (B not 0), which
  /// keeps a measured pair visible (preset files: topologies/preset_files.hpp).
  std::optional<double> ratio(const std::string& key) {
    auto s = scalar(key);
    if (!s) return std::nullopt;
    const auto slash = s->find('/');
    if (slash == std::string::npos) {
      auto v = to_double(*s);
      if (!v) ctx_.fail(path(key), path(key) + "=" + quote(*s) + " is not a number");
      return v;
    }
    auto part = [&](size_t from, size_t to) {
      std::string t = s->substr(from, to - from);
      while (!t.empty() && t.front() == ' ') t.erase(t.begin());
      while (!t.empty() && t.back() == ' ') t.pop_back();
      return to_double(t);
    };
    const auto a = part(0, slash), b = part(slash + 1, s->size());
    if (!a || !b || *b == 0) {
      ctx_.fail(path(key), path(key) + "=" + quote(*s) + " is not a number or a ratio A / B of two numbers (B not 0)");
      return std::nullopt;
    }
    if (*a < 0 || *b < 0) {  // a measured pair (a rate and its peak) has no negative part
      ctx_.fail(path(key), path(key) + "=" + quote(*s) + ": the parts of a measured ratio A / B cannot be negative");
      return std::nullopt;
    }
    return *a / *b;
  }

  std::optional<bool> boolean(const std::string& key) {
    auto s = scalar(key);
    if (!s) return std::nullopt;
    auto v = to_bool(*s);
    if (!v) ctx_.fail(path(key), path(key) + "=" + quote(*s) + " is not a boolean (expected true or false)");
    return v;
  }

  std::optional<double> quantity(const std::string& key, Quantity q) {
    auto s = scalar(key);
    if (!s) return std::nullopt;
    try {
      return parse_quantity(*s, q);
    } catch (const InputError& e) {
      ctx_.fail(path(key), path(key) + "=" + e.problems().front());
      return std::nullopt;
    }
  }

  template <class E>
  std::optional<E> choice(const std::string& key, const Choices<E>& choices) {
    auto s = scalar(key);
    if (!s) return std::nullopt;
    for (const auto& c : choices)
      if (c.first == *s) return c.second;
    ctx_.fail(path(key), path(key) + "=" + quote(*s) + " is not one of " + choice_names(choices));
    return std::nullopt;
  }

  void require(const std::string& key, const std::string& what = "") {
    ctx_.fail(path(key), path(key) + " is required" + (what.empty() ? std::string() : " (" + what + ")"));
  }

 private:
  // Const lookup: never inserts the key into the map.
  YAML::Node get(const std::string& key) const {
    const YAML::Node& n = node_;
    return n[key];
  }

  Context& ctx_;
  YAML::Node node_;
  std::string path_;
  const std::vector<std::string>* keys_ = nullptr;  // nullptr: keys_of(path_)
  bool valid_ = true;
};

template <class T>
void set_if(T& target, const std::optional<T>& v) {
  if (v) target = *v;
}

// ---------------------------------------------------------------------------------------
// Sections.

// A config.json sliding window, checked against training.seq_len once that is read.
struct SlidingWindow {
  std::string where;  // hf_config="..."
  std::optional<int64_t> window;
  int64_t from_layer = 0;  // layers before it attend in full
  // Per-layer flags (layer_types, a family default): one per layer, or repeating (`periodic`).
  std::vector<uint8_t> layers;
  bool periodic = false;
  bool chunked = false;  // Llama 4: chunks of `window` tokens
};

// A list of 0 / 1 flags (model.moe.layer_freq, model.attention.window_pattern); `count` > 0:
// exactly that many entries.
std::vector<uint8_t> read_flags(Reader& r, const std::string& key, int64_t count) {
  std::vector<uint8_t> out;
  const YAML::Node n = r.child(key);
  if (!n.IsSequence() || n.size() == 0) {
    r.ctx().fail(r.path(key), r.path(key) + " must be a non-empty list of 0 and 1");
    return out;
  }
  for (const auto& x : n) {
    if (!x.IsScalar() || (x.Scalar() != "0" && x.Scalar() != "1")) {
      r.ctx().fail(r.path(key), r.path(key) + " must be a list of 0 and 1 (found " + quote(x.IsScalar() ? x.Scalar() : "a non-scalar") + ")");
      return {};
    }
    out.push_back(x.Scalar() == "1" ? 1 : 0);
  }
  if (count > 0 && static_cast<int64_t>(out.size()) != count)
    r.ctx().fail(r.path(key), r.path(key) + " has " + std::to_string(out.size()) + " entries; model.layers=" +
                                  std::to_string(count) + " needs one per layer");
  return out;
}

// model.moe (models/experiment.hpp MoeSpec; Megatron-Core's names). `base`: the MoeSpec of the
// hf_config file, whose fields the keys given here override (then nothing is required).
MoeSpec read_moe(Reader r, int64_t layers, const std::optional<MoeSpec>& base) {
  MoeSpec e = base ? *base : MoeSpec{};
  if (!r.check_map()) return e;
  if (!base)
    for (const char* k : {"num_experts", "router_topk", "moe_ffn_hidden"})
      if (!r.has(k)) r.require(k);
  set_if(e.num_experts, r.integer("num_experts"));
  set_if(e.router_topk, r.integer("router_topk"));
  set_if(e.moe_ffn_hidden, r.integer("moe_ffn_hidden"));
  set_if(e.shared_expert_ffn_hidden, r.integer("shared_expert_ffn_hidden"));
  // A rule given here replaces the config.json's per-layer list.
  if (r.has("first_k_dense") || r.has("layer_freq")) e.layer_pattern.clear();
  set_if(e.first_k_dense, r.integer("first_k_dense"));
  if (r.has("layer_freq")) {
    const YAML::Node n = r.child("layer_freq");
    if (n.IsSequence()) e.layer_pattern = read_flags(r, "layer_freq", layers);
    else set_if(e.layer_freq, r.integer("layer_freq"));
  }
  set_if(e.router_score, r.choice("router_score_function", kRouterScores));
  set_if(e.router_expert_bias, r.boolean("router_enable_expert_bias"));
  set_if(e.router_num_groups, r.integer("router_num_groups"));
  set_if(e.router_group_topk, r.integer("router_group_topk"));
  set_if(e.capacity_factor, r.number("capacity_factor"));
  set_if(e.pad_to_capacity, r.boolean("pad_to_capacity"));
  set_if(e.balance, r.choice("load_balancing", kBalances));
  if (auto v = r.number("load_imbalance")) {
    if (e.balance != RouterBalance::measured)
      r.ctx().fail(r.path("load_imbalance"), r.path("load_imbalance") + " is read only with " + r.path("load_balancing") + ": measured");
    e.load_imbalance = *v;
  } else if (e.balance == RouterBalance::measured) {
    r.require("load_imbalance", "a number >= 1 (max / mean tokens of the busiest EP rank)");
  }
  return e;
}

ModelSpec read_model(Reader r, const std::string& base_dir, SlidingWindow& sliding) {
  ModelSpec m;
  if (!r.check_map()) return m;
  ModelDraft d;
  std::string hf_value;
  bool from_hf = false;
  if (auto hf = r.text("hf_config")) {
    hf_value = *hf;
    from_hf = read_hf_config(r.path("hf_config"), *hf, base_dir, d,
                             [&r](const std::string& message) { r.ctx().fail("model", message); });
    if (!from_hf) return m;
  }
  // YAML keys override the JSON.
  if (auto v = r.text("name")) d.name = v;
  if (auto v = r.integer("layers")) d.layers = v;
  if (auto v = r.integer("hidden")) d.hidden = v;
  if (auto v = r.integer("heads")) d.heads = v;
  if (auto v = r.integer("kv_heads")) d.kv_heads = v;
  if (auto v = r.integer("ffn_hidden")) d.ffn_hidden = v;
  if (auto v = r.integer("vocab")) d.vocab = v;
  if (auto v = r.integer("max_position_embeddings")) d.max_pos = v;
  // Given (in the YAML or the config.json), the limit must be a real one: 0 is not "none".
  if (d.max_pos && *d.max_pos <= 0)
    r.ctx().fail(r.path("max_position_embeddings"),
                 (r.has("max_position_embeddings") ? r.path("max_position_embeddings")
                                                    : d.hf_where + ": its maximum position (max_position_embeddings, "
                                                                   "n_positions or n_ctx)") +
                     "=" + std::to_string(*d.max_pos) +
                     " must be a positive integer (omit the key when the model has no position limit)");
  if (auto v = r.choice("activation", kActivations)) d.activation = v;
  if (auto v = r.boolean("tied_embeddings")) d.tied = v;
  if (auto v = r.choice("norm", kNorms)) d.norm = v;
  if (auto v = r.choice("position", kPositions)) d.position = v;

  auto missing = [&](const std::string& field, bool present) {
    // Present but invalid (in the YAML or the config.json) was reported already.
    if (present || r.has(field) || r.ctx().bad().count("model")) return;
    if (from_hf) {
      auto it = d.json_key.find(field);
      const std::string jk = it == d.json_key.end() ? std::string() : it->second;
      r.ctx().fail(r.path(field), r.path(field) + " is required: not set in the YAML and hf_config " +
                                      quote(hf_value) +
                                      (jk.empty() ? std::string(" does not provide it") : " has no " + quote(jk)));
    } else {
      r.require(field);
    }
  };
  missing("name", d.name.has_value());
  missing("layers", d.layers.has_value());
  missing("hidden", d.hidden.has_value());
  missing("heads", d.heads.has_value());
  missing("ffn_hidden", d.ffn_hidden.has_value());
  missing("vocab", d.vocab.has_value());
  missing("activation", d.activation.has_value());
  missing("tied_embeddings", d.tied.has_value());
  missing("norm", d.norm.has_value());
  missing("position", d.position.has_value());

  set_if(m.name, d.name);
  set_if(m.layers, d.layers);
  set_if(m.hidden, d.hidden);
  set_if(m.heads, d.heads);
  m.kv_heads = d.kv_heads ? *d.kv_heads : m.heads;  // default: MHA
  set_if(m.ffn_hidden, d.ffn_hidden);
  set_if(m.vocab, d.vocab);
  set_if(m.max_position_embeddings, d.max_pos);
  set_if(m.activation, d.activation);
  set_if(m.tied_embeddings, d.tied);
  set_if(m.norm, d.norm);
  set_if(m.position, d.position);
  // The config.json's head size, experts, MLA and MTP modules; the YAML keys override them.
  set_if(m.head_dim_override, d.head_dim);
  if (auto v = r.integer("head_dim")) {
    m.head_dim_override = *v;
    // 0 would read as "not given" (hidden / heads): a head of no size is no input.
    if (*v == 0) r.ctx().fail(r.path("head_dim"), r.path("head_dim") + "=0 must be positive (leave it out for hidden / heads)");
  }
  set_if(m.mtp_layers, d.mtp_layers);
  if (auto v = r.integer("mtp_layers")) m.mtp_layers = *v;
  std::optional<MoeSpec> json_moe = d.moe;
  if (json_moe) {
    if (d.moe_ffn_is_ffn_hidden) json_moe->moe_ffn_hidden = m.ffn_hidden;
    // The family's per-layer rule over the final layer count: a list only when MoeSpec's
    // first_k_dense / layer_freq rule does not say the same.
    if (d.moe_layer && m.layers > 0 && m.layers <= limits::kMaxLayers) {
      std::vector<uint8_t> pattern;
      bool same = true;
      for (int64_t i = 0; i < m.layers; ++i) {
        pattern.push_back(d.moe_layer(i) ? 1 : 0);
        same = same && (pattern.back() != 0) == json_moe->is_moe_layer(i);
      }
      if (!same) json_moe->layer_pattern = std::move(pattern);
    }
  }
  if (r.has("moe")) m.moe = read_moe(Reader(r.ctx(), r.child("moe"), r.path("moe")), m.layers, json_moe);
  else if (json_moe) m.moe = *json_moe;
  if (d.mla) m.mla = *d.mla;
  if (r.has("mla")) {
    Reader q(r.ctx(), r.child("mla"), r.path("mla"));
    if (q.check_map()) {
      set_if(m.mla.q_lora_rank, q.integer("q_lora_rank"));
      set_if(m.mla.kv_lora_rank, q.integer("kv_lora_rank"));
      set_if(m.mla.qk_nope_head_dim, q.integer("qk_nope_head_dim"));
      set_if(m.mla.qk_rope_head_dim, q.integer("qk_rope_head_dim"));
      set_if(m.mla.v_head_dim, q.integer("v_head_dim"));
      if (!q.has("kv_lora_rank") && !d.mla) q.require("kv_lora_rank");
    }
  }
  m.attention.sinks = d.sinks;  // the config.json's; model.attention.sinks overrides it
  if (r.has("attention")) {
    Reader q(r.ctx(), r.child("attention"), r.path("attention"));
    if (q.check_map()) {
      set_if(m.attention.window, q.integer("window"));
      set_if(m.attention.sinks, q.boolean("sinks"));
      set_if(m.attention.chunked, q.boolean("chunked"));
      if (q.has("window_pattern")) m.attention.window_pattern = read_flags(q, "window_pattern", 0);
    }
  }

  // config.json features checked against the final model (YAML keys may have changed it).
  const auto& bad = r.ctx().bad();
  const bool model_ok = !bad.count("model") && !bad.count("model.hidden") && !bad.count("model.heads") &&
                        !bad.count("model.activation");
  // dtsim gives every GEMM of a GeLU model a bias and none to a SwiGLU model (models/flops.cpp
  // has_linear_biases), as GPT-2 / Megatron GPT and Llama do.
  const bool biased = m.activation == Activation::gelu;
  std::vector<std::string> bias_keys;
  if (d.hf_attention_bias && *d.hf_attention_bias != biased)
    bias_keys.push_back("\"attention_bias\"=" + std::string(*d.hf_attention_bias ? "true" : "false"));
  if (d.hf_mlp_bias && *d.hf_mlp_bias != biased)
    bias_keys.push_back("\"mlp_bias\"=" + std::string(*d.hf_mlp_bias ? "true" : "false"));
  if (from_hf && model_ok && d.activation && !bias_keys.empty())
    r.ctx().fail("model", d.hf_where + ": " + join_list(bias_keys) + " (or its transformers default) with activation " +
                              to_string(m.activation) + " is not modelled (dtsim gives " +
                              (biased ? "every GEMM of a GeLU model a bias" : "the GEMMs of a SwiGLU model no bias") +
                              ", models/flops.cpp has_linear_biases)");
  if (from_hf) {
    sliding = {d.hf_where, d.hf_sliding_window, d.hf_window_from_layer, d.hf_window_layers, d.hf_window_periodic,
               d.hf_window_chunked};
  }
  return m;
}

void read_link(Reader& cluster, const std::string& key, LinkSpec& link, bool preset, bool needed) {
  Reader r(cluster.ctx(), cluster.child(key), cluster.path(key));
  if (!r.check_map()) return;
  if (!cluster.has(key) && !preset) {
    if (needed) cluster.require(key, "{bandwidth, latency, efficiency}, or give cluster.node");
    return;
  }
  auto bw = r.quantity("bandwidth", Quantity::bandwidth);
  auto lat = r.quantity("latency", Quantity::time);
  auto eff = r.ratio("efficiency");
  set_if(link.bandwidth, bw);
  set_if(link.latency, lat);
  set_if(link.efficiency, eff);
  if (!preset) {
    if (!r.has("bandwidth")) r.require("bandwidth");
    if (!r.has("latency")) r.require("latency");
    if (!r.has("efficiency")) r.require("efficiency", "NCCL bus bandwidth / line rate");
  }
}

// The GPU keys shared by cluster.gpu and a GPU preset file (topologies/preset_files.hpp).
void read_gpu_fields(Reader& r, GpuSpec& g) {
  if (auto v = r.text("name")) {
    if (v->find_first_not_of(' ') == std::string::npos)
      r.ctx().fail(r.path("name"), r.path("name") + " is empty (the GPU's name, shown in every result)");
    else g.name = *v;
  }
  set_if(g.peak_bf16_flops, r.quantity("peak_bf16", Quantity::flop_rate));
  set_if(g.peak_fp8_flops, r.quantity("peak_fp8", Quantity::flop_rate));
  set_if(g.peak_fp4_flops, r.quantity("peak_fp4", Quantity::flop_rate));  // optional: 0 = no FP4 tensor cores
  set_if(g.microscaling, r.boolean("microscaling"));                   // optional: false
  set_if(g.hbm_bytes, r.quantity("hbm", Quantity::bytes));
  set_if(g.hbm_bandwidth, r.quantity("hbm_bandwidth", Quantity::bandwidth));
  set_if(g.gemm_efficiency, r.ratio("gemm_efficiency"));
  set_if(g.memory_efficiency, r.ratio("memory_efficiency"));
  set_if(g.kernel_overhead, r.quantity("kernel_overhead", Quantity::time));
  set_if(g.sm_count, r.integer("sm_count"));  // optional: 0 disables comm_interference
  set_if(g.attention_efficiency, r.ratio("attention_efficiency"));  // optional: 0 = gemm_efficiency
}

// The GPU keys after profile: the preset's kernel tables dropped by a field that sets the
// GEMM rate, sustained_ratio and kernel_tables.
void read_gpu_tables(Reader& r, GpuSpec& g, const std::string& path) {
  // The preset's shipped kernel tables time its GEMMs; a field that sets the GEMM rate
  // (peak_bf16, peak_fp8, gemm_efficiency, sm_count) asks for the roofline at that rate, so it
  // drops them unless kernel_tables is given too (README "Kernel time").
  for (const char* k : {"peak_bf16", "peak_fp8", "peak_fp4", "gemm_efficiency", "sm_count"})
    if (r.has(k)) g.kernel_tables.clear();
  set_if(g.sustained_ratio, r.ratio("sustained_ratio"));  // optional: the preset's, else 1
  if (auto t = r.text("kernel_tables")) {
    const auto systems = calib::shipped_table_systems();
    if (*t == "none") {
      g.kernel_tables.clear();
    } else if (std::find(systems.begin(), systems.end(), *t) != systems.end()) {
      g.kernel_tables = *t;
    } else {
      r.ctx().fail(path, r.path("kernel_tables") + "=" + quote(*t) + " is not a shipped kernel table (valid: none, " +
                             text::join(systems) + ")");
    }
  }
}

// A user's preset file named by `key` (=`value`, relative to `base_dir`): its parsed content,
// or nullopt with each of its problems reported as "KEY: FILE: problem".
template <class T, class Load>
std::optional<T> preset_from_file(Context& ctx, const std::string& key, const std::string& value,
                                  const std::string& base_dir, Load load) {
  const std::string file = (fs::path(base_dir) / value).lexically_normal().string();
  try {
    T loaded = load(file);
    if constexpr (std::is_same_v<T, GpuSpec>) loaded.source_file = value;
    return loaded;
  } catch (const InputError& e) {
    for (const auto& p : e.problems()) ctx.fail(key, key + "=" + quote(value) + ": " + p);
    return std::nullopt;
  }
}

GpuSpec read_gpu(Reader& cluster, const NodePreset* node, const std::string& base_dir) {
  GpuSpec g;
  const std::string path = cluster.path("gpu");
  if (!cluster.has("gpu")) {
    if (node) return node->gpu_spec;
    cluster.require("gpu", "a preset name (" + gpu_preset_list() + "), a GPU file or a map");
    return g;
  }
  const YAML::Node n = cluster.child("gpu");
  if (n.IsNull()) {
    cluster.ctx().fail(path, path + " has no value (give a preset name, a GPU file or a map)");
    return g;
  }
  if (n.IsScalar()) {
    const std::string name = n.Scalar();
    if (is_preset_file_ref(name)) {
      if (auto f = preset_from_file<GpuSpec>(cluster.ctx(), path, name, base_dir, load_gpu_file)) return *f;
      return g;
    }
    if (const GpuSpec* p = find_gpu_preset(name)) return *p;
    cluster.ctx().fail(path, path + "=" + quote(name) + " is not a GPU preset (valid: " + gpu_preset_list() +
                                 "; or a GPU file, *.yaml)");
    return g;
  }
  Reader r(cluster.ctx(), n, path);
  if (!r.check_map()) return g;
  bool preset = false;
  if (auto p = r.text("preset")) {
    if (is_preset_file_ref(*p)) {
      auto f = preset_from_file<GpuSpec>(r.ctx(), r.path("preset"), *p, base_dir, load_gpu_file);
      if (!f) {
        r.ctx().mark(path);
        return g;
      }
      g = *f;
      preset = true;
    } else if (const GpuSpec* ps = find_gpu_preset(*p)) {
      g = *ps;
      preset = true;
    } else {
      r.ctx().fail(path, r.path("preset") + "=" + quote(*p) + " is not a GPU preset (valid: " +
                             gpu_preset_list() + "; or a GPU file, *.yaml)");
      return g;
    }
  }
  read_gpu_fields(r, g);
  // optional: a `dtsim calibrate` profile, relative to the experiment file (read lazily by
  // models/compute_cost.hpp experiment_profile, which names this key in its errors).
  if (auto v = r.text("profile")) {
    if (v->find_first_not_of(' ') == std::string::npos)
      r.ctx().fail(r.path("profile"), r.path("profile") + " is empty (a profile FILE, or leave the key out)");
    else g.profile = *v;
  }
  read_gpu_tables(r, g, path);
  if (!preset) {
    for (const char* k : {"name", "peak_bf16", "hbm", "hbm_bandwidth", "gemm_efficiency", "memory_efficiency",
                          "kernel_overhead"})
      if (!r.has(k)) r.require(k, "or give gpu.preset");
  }
  return g;
}

// cluster.fabric: a type name, or a map {type, shape keys}; each type reads and requires the
// keys its FabricType lists (topologies/fabrics/fabric.hpp).
void read_fabric(Reader& cluster, ClusterSpec& c) {
  if (!cluster.has("fabric")) return;
  const std::string path = cluster.path("fabric");
  const YAML::Node n = cluster.child("fabric");
  std::optional<std::string> type;
  Reader r(cluster.ctx(), n, path);
  if (n.IsMap()) {
    if (!r.check_map()) return;
    type = r.text("type");
    if (!type && !r.has("type")) {
      r.require("type", "one of " + fabric_type_list());
      return;
    }
  } else {
    type = cluster.text("fabric");
  }
  if (!type) return;
  const FabricType* ft = find_fabric_type(*type);
  const std::string type_key = n.IsMap() ? r.path("type") : path;
  if (!ft) {
    cluster.ctx().fail(path, type_key + "=" + quote(*type) + " is not a fabric type (valid: " + fabric_type_list() + ")");
    return;
  }
  c.fabric = *type;
  if (!n.IsMap()) {
    if (!ft->required.empty())
      cluster.ctx().fail(path, path + "=" + *type + " needs a map {type: " + *type + ", " + join_list(ft->required) +
                                   ": ...}");
    return;
  }
  for (const char* key : {"nodes_per_leaf", "oversubscription", "leaves_per_pod", "pod_oversubscription"}) {
    const bool reads = std::find(ft->keys.begin(), ft->keys.end(), key) != ft->keys.end();
    if (r.has(key) && !reads)
      r.ctx().fail(r.path(key), r.path(key) + " does not apply to fabric type " + *type +
                                    (ft->keys.empty() ? std::string(" (it has no shape keys)")
                                                      : " (it reads: " + join_list(ft->keys) + ")"));
  }
  for (const auto& key : ft->required)
    if (!r.has(key)) r.require(key, "fabric type " + *type);
  set_if(c.fabric_shape.nodes_per_leaf, r.integer("nodes_per_leaf"));
  set_if(c.fabric_shape.oversubscription, r.number("oversubscription"));
  set_if(c.fabric_shape.leaves_per_pod, r.integer("leaves_per_pod"));
  set_if(c.fabric_shape.pod_oversubscription, r.number("pod_oversubscription"));
}

// cluster.collectives: {algorithm, protocol}, each "auto" or a name.
void read_collectives(Reader& cluster, ClusterSpec& c) {
  Reader r(cluster.ctx(), cluster.child("collectives"), cluster.path("collectives"));
  if (!r.check_map()) return;
  auto pick = [&](const std::string& key, const std::vector<std::string>& valid, std::string& target) {
    auto v = r.text(key);
    if (!v) return;
    if (std::find(valid.begin(), valid.end(), *v) == valid.end())
      r.ctx().fail(r.path(key), r.path(key) + "=" + quote(*v) + " is not one of " + join_list(valid));
    else target = *v;
  };
  pick("algorithm", collective_algorithm_names(), c.collectives.algorithm);
  pick("protocol", collective_protocol_names(), c.collectives.protocol);
}

ClusterSpec read_cluster(Reader r, const std::string& base_dir) {
  ClusterSpec c;
  if (!r.check_map()) return c;
  const NodePreset* node = nullptr;
  std::optional<NodePreset> node_file;  // a user's node file (cluster.node: FILE)
  if (auto name = r.text("node"); name && is_preset_file_ref(*name)) {
    node_file = preset_from_file<NodePreset>(r.ctx(), r.path("node"), *name, base_dir, load_node_file);
    if (!node_file) {
      r.ctx().mark("cluster");
      return c;
    }
    node = &*node_file;
    c.node_file = *name;
  } else if (name) {
    node = find_node_preset(*name);
    if (!node) {
      // Everything the node would have filled is unknown: mark the whole cluster, and say
      // nothing about the keys it would have provided (one problem, one line).
      r.ctx().fail("cluster", r.path("node") + "=" + quote(*name) + " is not a node preset (valid: " +
                                  node_preset_list() + "; or a node file, *.yaml)");
      return c;
    }
  } else if (r.has("node")) {  // not a single value: reported by text()
    r.ctx().mark("cluster");
    return c;
  }
  if (node) {
    c.gpus_per_node = node->gpus_per_node;
    c.nvlink = node->nvlink;
    c.nics_per_node = node->nics_per_node;
    c.nic = node->nic;
    c.hbm_reserve_bytes = node->hbm_reserve_bytes;
    c.nvls_efficiency = node->nvls_efficiency;
    c.host_dispatch = node->host_dispatch;
    c.intra_node = node->intra_node;
  } else {
    c.host_dispatch = default_host_dispatch();
  }
  c.gpu = read_gpu(r, node, base_dir);
  if (auto v = r.integer("nodes")) c.nodes = *v;
  else if (!r.has("nodes")) r.require("nodes");
  if (auto v = r.integer("gpus_per_node")) c.gpus_per_node = *v;
  else if (!r.has("gpus_per_node") && !node) r.require("gpus_per_node", "or give cluster.node");
  set_if(c.intra_node, r.choice("intra_node", kIntraNodes));
  set_if(c.nics_per_node, r.integer("nics_per_node"));
  if (!node && !r.has("nics_per_node") && c.nodes > 1) r.require("nics_per_node", "or give cluster.node");
  read_link(r, "nvlink", c.nvlink, node != nullptr, c.gpus_per_node > 1);
  set_if(c.nvls_efficiency, Reader(r.ctx(), r.child("nvlink"), r.path("nvlink")).ratio("nvls_efficiency"));
  read_link(r, "nic", c.nic, node != nullptr, c.nodes > 1);
  read_fabric(r, c);
  read_collectives(r, c);
  set_if(c.hbm_reserve_bytes, r.quantity("hbm_reserve", Quantity::bytes));
  set_if(c.host_dispatch, r.quantity("host_dispatch", Quantity::time));
  if (auto n = r.text("name")) c.name = *n;
  else c.name = std::to_string(c.nodes) + " x " + (node ? node->name : c.gpu.name);
  return c;
}

struct LayoutDraft {
  Layout layout;
  bool dp_auto = false;
};

LayoutDraft read_layout(Reader r) {
  LayoutDraft d;
  Layout& l = d.layout;
  if (!r.check_map()) return d;
  if (r.has("dp")) {
    const YAML::Node n = r.child("dp");
    if (n.IsScalar() && n.Scalar() == "auto") d.dp_auto = true;
    else set_if(l.dp, r.integer("dp"));
  } else {
    r.require("dp", "an integer or auto");
  }
  if (auto v = r.integer("tp")) l.tp = *v;
  else if (!r.has("tp")) r.require("tp");
  set_if(l.cp, r.integer("cp"));
  set_if(l.pp, r.integer("pp"));
  if (auto z = r.integer("zero_stage")) {
    if (*z < 0 || *z > 3)
      r.ctx().fail(r.path("zero_stage"), r.path("zero_stage") + "=" + std::to_string(*z) + " must be 0, 1, 2 or 3");
    else l.zero_stage = static_cast<int>(*z);
  }
  set_if(l.sequence_parallel, r.boolean("sequence_parallel"));
  set_if(l.recompute, r.choice("recompute", kRecomputes));
  set_if(l.vp, r.integer("vp"));
  // Megatron-Core's pipeline split options (models/pipeline_split.hpp); a layer count given
  // must be positive, as Megatron's ("must be larger than 0").
  set_if(l.account_for_embedding_in_pipeline_split, r.boolean("account_for_embedding_in_pipeline_split"));
  set_if(l.account_for_loss_in_pipeline_split, r.boolean("account_for_loss_in_pipeline_split"));
  const std::pair<const char*, int64_t*> stage_layers[] = {
      {"decoder_first_pipeline_num_layers", &l.decoder_first_pipeline_num_layers},
      {"decoder_last_pipeline_num_layers", &l.decoder_last_pipeline_num_layers}};
  for (const auto& [k, field] : stage_layers)
    if (auto v = r.integer(k)) {
      if (*v > 0) *field = *v;
      else r.ctx().fail(r.path(k), r.path(k) + "=" + std::to_string(*v) + " must be larger than 0 (leave it out for the "
                                                                        "default split)");
    }
  if (auto v = r.text("pipeline_layout")) {
    if (v->empty()) r.ctx().fail(r.path("pipeline_layout"), r.path("pipeline_layout") + " is empty");
    else l.pipeline_layout = *v;
  }
  if (auto sch = r.choice("schedule", kSchedules)) l.schedule = *sch;
  else if (l.vp > 1) l.schedule = Schedule::interleaved;
  set_if(l.ep, r.integer("ep"));
  // Layout::etp 0 stands for "left out" (= tp); a written 0 is an error, as for ep.
  if (auto v = r.integer("etp")) {
    if (*v >= 1) l.etp = *v;
    else r.ctx().fail(r.path("etp"), r.path("etp") + "=" + std::to_string(*v) + " must be >= 1 (or left out: = tp)");
  }
  return d;
}

Training read_training(Reader r) {
  Training t;
  if (!r.check_map()) return t;
  for (const char* k : {"seq_len", "global_batch", "micro_batch"})
    if (!r.has(k)) r.require(k);
  set_if(t.seq_len, r.integer("seq_len"));
  set_if(t.global_batch, r.integer("global_batch"));
  set_if(t.micro_batch, r.integer("micro_batch"));
  if (auto p = r.text("precision")) {
    if (const PrecisionRecipe* rec = find_precision(*p)) t.precision = rec->id;
    else r.ctx().fail(r.path("precision"), r.path("precision") + "=" + quote(*p) + " is not a precision recipe (valid: " +
                                              text::join(precision_names()) + ")");
    if (r.has("dtype"))
      r.ctx().fail(r.path("dtype"), r.path("dtype") + " is the alias of training.precision: give one of them");
  } else if (auto d = r.choice("dtype", kDtypeAliases)) {
    t.precision = *d;
    t.precision_from_dtype = true;
  }
  set_if(t.fp8_param_gather, r.boolean("fp8_param_gather"));
  set_if(t.first_last_layers_bf16, r.boolean("first_last_layers_bf16"));
  set_if(t.num_layers_at_start_in_bf16, r.integer("num_layers_at_start_in_bf16"));
  set_if(t.num_layers_at_end_in_bf16, r.integer("num_layers_at_end_in_bf16"));
  set_if(t.flash_attention, r.boolean("flash_attention"));
  set_if(t.overlap_grad_reduce, r.boolean("overlap_grad_reduce"));
  set_if(t.framework, r.choice("framework", kFrameworks));
  // main_grad follows the framework unless given: Megatron accumulates and reduces fp32
  // main grads; DeepSpeed and the ZeRO paper keep 16-bit gradients (ZeRO Sec 3.1).
  if (auto g = r.choice("main_grad", kGradDtypes)) t.main_grad = *g;
  else t.main_grad = t.framework == Framework::megatron ? GradDtype::fp32 : GradDtype::bf16;
  set_if(t.grad_bucket_bytes, r.quantity("grad_bucket", Quantity::bytes));
  set_if(t.stage3_max_reuse_distance, r.number("stage3_max_reuse_distance"));
  set_if(t.stage3_max_live_parameters, r.number("stage3_max_live_parameters"));
  set_if(t.overlap_param_gather, r.boolean("overlap_param_gather"));
  set_if(t.tp_comm_overlap, r.boolean("tp_comm_overlap"));
  set_if(t.reduce_every_micro_batch, r.boolean("reduce_every_micro_batch"));
  set_if(t.comm_interference, r.boolean("comm_interference"));
  set_if(t.overlap_p2p, r.boolean("overlap_p2p"));
  if (auto v = r.choice("moe_token_dispatcher", kDispatchers)) t.moe_token_dispatcher = *v;
  set_if(t.overlap_moe_expert_parallel_comm, r.boolean("overlap_moe_expert_parallel_comm"));
  set_if(t.delay_wgrad_compute, r.boolean("delay_wgrad_compute"));
  set_if(t.moe_shared_expert_overlap, r.boolean("moe_shared_expert_overlap"));
  set_if(t.moe_deepep_num_sms, r.integer("moe_deepep_num_sms"));
  set_if(t.moe_hybridep_num_sms, r.integer("moe_hybridep_num_sms"));
  set_if(t.cuda_graphs, r.choice("cuda_graphs", kCudaGraphs));
  return t;
}

Published read_published(Reader r) {
  Published p;
  if (!r.check_map()) return p;
  // A figure written as 0 would read as "not published" (the default) and drop silently to
  // the next figure; the relative error divides by it. Each must be a measurement, in range.
  auto figure = [&](const char* key, double& to, double most, const char* unit) {
    const auto v = r.number(key);
    if (!v) return;
    to = *v;
    if (!(*v > 0 && *v <= most))
      r.ctx().fail(r.path(key), fmt::format("{}={} {} must be a measurement in (0, {:g}] {}", r.path(key), *v, unit,
                                            most, unit));
  };
  figure("step_time_s", p.step_time_s, limits::kMaxPublishedStepS, "s");
  figure("tflops_per_gpu", p.tflops_per_gpu, limits::kMaxPublishedTflops, "TFLOP/s");
  set_if(p.mfu, r.number("mfu"));
  static const Choices<bool> kBases = {{"model", false}, {"hardware", true}};
  set_if(p.tflops_includes_recompute, r.choice("tflops_basis", kBases));
  set_if(p.source, r.text("source"));
  if (r.has("memory")) {
    Reader m(r.ctx(), r.child("memory"), r.path("memory"));
    if (m.check_map()) {
      set_if(p.memory_source, m.text("source"));
      for (MemoryQuantity mq : kMemoryQuantities) {
        const char* key = to_string(mq);
        Published::MemoryPoint* point = &p.memory[static_cast<size_t>(mq)];
        if (!m.has(key)) continue;
        Reader q(m.ctx(), m.child(key), m.path(key));
        if (!q.check_map()) continue;
        set_if(point->stage, q.integer("stage"));  // optional: 0, the first stage
        set_if(point->bytes, q.quantity("value", Quantity::bytes));
        if (!q.has("value")) q.require("value", "the published bytes per GPU, e.g. 45.5 GiB");
      }
    }
  }
  return p;
}

// ---------------------------------------------------------------------------------------
// --set overrides.

std::vector<std::string> split_dots(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == '.') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

// Returns a copy of `node` with `segs[i..]` set to `value`. Intermediate maps are created;
// a scalar `cluster.gpu` (a preset name) becomes {preset: NAME} when a field below it is set,
// and an absent one under a node preset {preset: the node's GPU}.
YAML::Node with_value(const YAML::Node& node, const std::vector<std::string>& segs, size_t i,
                      const YAML::Node& value, const std::string& map_path) {
  YAML::Node out;
  if (node.IsDefined() && node.IsMap()) {
    out = YAML::Clone(node);
  } else {
    out = YAML::Node(YAML::NodeType::Map);
    if (map_path == "cluster.gpu" && node.IsDefined() && node.IsScalar()) out["preset"] = node.Scalar();
    if (map_path == "cluster.fabric" && node.IsDefined() && node.IsScalar()) out["type"] = node.Scalar();
  }
  const std::string& key = segs[i];
  if (i + 1 == segs.size()) {
    out[key] = value;
    return out;
  }
  const YAML::Node& const_out = out;
  YAML::Node child = const_out[key].IsDefined() ? YAML::Clone(const_out[key]) : YAML::Node(YAML::NodeType::Undefined);
  // A field of a GPU the cluster takes from its node preset: that preset's GPU, changed.
  if (map_path == "cluster" && key == "gpu" && !child.IsDefined() && const_out["node"].IsDefined() &&
      const_out["node"].IsScalar())
    if (const NodePreset* np = find_node_preset(const_out["node"].Scalar())) child = YAML::Node(np->gpu);
  out[key] = with_value(child, segs, i + 1, value, join_path(map_path, key));
  return out;
}

YAML::Node apply_overrides(YAML::Node root, const std::vector<std::string>& overrides, ProblemList& problems) {
  for (const auto& o : overrides) {
    const auto eq = o.find('=');
    if (eq == std::string::npos) {
      problems.add("--set " + quote(o) + ": missing '=' (expected --set key.path=value, e.g. --set layout.tp=4)");
      continue;
    }
    const std::string key = o.substr(0, eq);
    const std::string text = o.substr(eq + 1);
    if (key.empty()) {
      problems.add("--set " + quote(o) + ": missing key before '=' (expected --set key.path=value, e.g. --set "
                   "layout.tp=4)");
      continue;
    }
    const auto segs = split_dots(key);
    // Check the path against the schema.
    std::string parent;
    bool ok = true;
    for (size_t i = 0; i < segs.size(); ++i) {
      const std::vector<std::string>* valid = keys_of(parent);
      if (!valid || segs[i].empty() ||
          std::find(valid->begin(), valid->end(), segs[i]) == valid->end()) {
        problems.add("--set " + o + ": unknown key " + join_path(parent, segs[i]) +
                     (valid ? " (valid keys" + (parent.empty() ? std::string("") : " under " + parent) + ": " +
                                  join_list(*valid) + ")"
                            : std::string(" (") + parent + " is a single value, not a map)"));
        ok = false;
        break;
      }
      parent = join_path(parent, segs[i]);
    }
    if (!ok) continue;
    YAML::Node value;
    try {
      value = YAML::Load(text);
    } catch (const YAML::Exception&) {
      value = YAML::Node(YAML::NodeType::Undefined);
    }
    if (!value.IsDefined() || !value.IsScalar()) {
      problems.add("--set " + o + ": " + quote(text) + " is not a single YAML value");
      continue;
    }
    root = with_value(root, segs, 0, value, "");
  }
  return root;
}

}  // namespace

Experiment parse_experiment(const std::string& yaml_text, const std::string& source,
                            const std::vector<std::string>& overrides, const std::string& base_dir,
                            const std::string& ignore_containing) {
  ProblemList problems(source);
  // One document; unterminated strings, deep nesting and a second document are errors.
  YAML::Node root = load_yaml_document(yaml_text, source);
  if (!root.IsDefined() || root.IsNull()) {
    problems.add("the file is empty (expected sections model, cluster, layout, training)");
    problems.throw_if_any();
  }
  if (!root.IsMap()) {
    problems.add("the file must be a map with sections model, cluster, layout, training (got " +
                 describe_node(root) + ")");
    problems.throw_if_any();
  }
  // A --set that names no key cannot be applied: report those before reading the file.
  root = apply_overrides(root, overrides, problems);
  problems.throw_if_any();

  Context ctx(problems);
  Experiment e;
  e.source = source;
  Reader top(ctx, root, "");
  top.check_map();
  set_if(e.title, top.text("title"));
  LayoutDraft ld;
  SlidingWindow sliding;
  if (top.has("model")) e.model = read_model(Reader(ctx, top.child("model"), "model"), base_dir, sliding);
  else top.require("model");
  if (top.has("cluster")) e.cluster = read_cluster(Reader(ctx, top.child("cluster"), "cluster"), base_dir);
  else top.require("cluster");
  if (top.has("layout")) ld = read_layout(Reader(ctx, top.child("layout"), "layout"));
  else top.require("layout");
  if (top.has("training")) e.training = read_training(Reader(ctx, top.child("training"), "training"));
  else top.require("training");
  e.published = read_published(Reader(ctx, top.child("published"), "published"));
  // A sliding window at least as long as the sequence changes nothing (every query already
  // sees every earlier token); a shorter one becomes model.attention.window (and its pattern).
  if (sliding.window && !ctx.bad().count("model") && !ctx.bad().count("training") &&
      !ctx.bad().count("training.seq_len") && e.training.seq_len > *sliding.window) {
    const char* key = sliding.chunked ? "\"attention_chunk_size\"" : "\"sliding_window\"";
    const bool any_local = std::find(sliding.layers.begin(), sliding.layers.end(), 1) != sliding.layers.end();
    if (e.model.attention.window > 0) {
      ctx.fail("model", sliding.where + ": " + key + "=" + std::to_string(*sliding.window) +
                            " and model.attention.window both set the window: keep one");
    } else if (!sliding.layers.empty()) {
      if (!sliding.periodic && static_cast<int64_t>(sliding.layers.size()) != e.model.layers)
        ctx.fail("model", sliding.where + ": its per-layer attention kinds (layer_types) list " +
                              std::to_string(sliding.layers.size()) + " layers; model.layers=" +
                              std::to_string(e.model.layers) + " needs one per layer (give model.attention instead)");
      else if (any_local) {
        e.model.attention.window = *sliding.window;
        e.model.attention.chunked = sliding.chunked;
        if (std::find(sliding.layers.begin(), sliding.layers.end(), 0) != sliding.layers.end())
          e.model.attention.window_pattern = sliding.layers;
      }
    } else if (sliding.from_layer < e.model.layers) {  // else no layer slides (Qwen: max_window_layers)
      e.model.attention.window = *sliding.window;
      if (sliding.from_layer > 0) {
        e.model.attention.window_pattern.assign(static_cast<size_t>(std::max<int64_t>(0, e.model.layers)), 0);
        for (int64_t i = sliding.from_layer; i < e.model.layers; ++i)
          e.model.attention.window_pattern[static_cast<size_t>(i)] = 1;
      }
    }
  }
  e.layout = ld.layout;
  auto known = [&](std::initializer_list<const char*> keys) {
    for (const char* k : keys) {
      const std::string key(k);
      for (const auto& b : ctx.bad())
        if (key == b || (key.size() > b.size() && key.compare(0, b.size(), b) == 0 && key[b.size()] == '.'))
          return false;
    }
    return true;
  };
  if (ld.dp_auto && !known({"cluster.nodes", "cluster.gpus_per_node", "layout.tp", "layout.cp", "layout.pp"})) {
    // Those keys have their own problem already: dp cannot be resolved, and says nothing more.
    ctx.mark("layout.dp");
  } else if (ld.dp_auto) {
    const Layout& l = e.layout;
    // Checked products: a count past its limit has its own error (check_count_limits), and
    // says nothing more here.
    const auto gpus_or = checked::mul(e.cluster.nodes, e.cluster.gpus_per_node);
    const auto denom_or = checked::product({l.tp, l.cp, l.pp});
    const bool in_range = gpus_or && denom_or && *gpus_or <= limits::kMaxGpus && *denom_or <= limits::kMaxGpus;
    const int64_t gpus = in_range ? *gpus_or : 0, denom = in_range ? *denom_or : 0;
    if (!in_range) {
      ctx.mark("layout.dp");
    } else if (gpus > 0 && denom > 0 && gpus % denom == 0) {
      e.layout.dp = gpus / denom;
    } else if (gpus > 0 && denom > 0) {
      ctx.fail("layout.dp", "layout.dp=auto: the cluster's " + std::to_string(gpus) +
                                " GPUs are not a multiple of layout.tp*cp*pp=" + std::to_string(denom));
    } else {
      ctx.fail("layout.dp", "layout.dp=auto cannot be resolved (cluster GPUs or layout.tp*cp*pp unknown)");
    }
  }
  if (e.title.empty()) e.title = e.model.name;
  // Parse problems and cross-section problems are reported together.
  check_experiment(e, problems, ctx.bad());
  if (!ignore_containing.empty()) problems.drop_containing(ignore_containing);
  problems.throw_if_any();
  return e;
}

Experiment load_experiment(const std::string& path, const std::vector<std::string>& overrides) {
  if (auto why = input_path_problem(path)) throw InputError(path + ": cannot read experiment file: " + *why);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot read experiment file: permission denied or unreadable");
  note_input_file(path);  // outputs never overwrite it (reports/atomic_file.hpp)
  std::ostringstream ss;
  ss << in.rdbuf();
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  return parse_experiment(ss.str(), path, overrides, dir.string());
}

void validate_experiment(const Experiment& e) {
  ProblemList p(e.source);
  check_experiment(e, p, {});
  p.throw_if_any();
}

std::vector<std::string> experiment_problems(const Experiment& e) {
  ProblemList p(e.source);
  check_experiment(e, p, {});
  return p.problems();
}

// ---------------------------------------------------------------------------------------
// GPU and node preset files (topologies/preset_files.hpp), read with the same Reader.

namespace {

const std::vector<std::string> kGpuFileKeys = {
    "name", "peak_bf16", "peak_fp8", "peak_fp4", "microscaling", "hbm", "hbm_bandwidth", "gemm_efficiency",
    "memory_efficiency", "kernel_overhead", "sm_count", "attention_efficiency", "kernel_tables", "sustained_ratio"};
const std::vector<std::string> kNodeFileKeys = {"name", "gpu", "gpus_per_node", "intra_node", "nvlink",
                                                "nics_per_node", "nic", "hbm_reserve", "host_dispatch"};
const std::vector<std::string> kNvlinkFileKeys = {"bandwidth", "latency", "efficiency", "nvls_efficiency"};
const std::vector<std::string> kNicFileKeys = {"bandwidth", "latency", "efficiency"};

// The file's top-level map, or a problem naming the file.
YAML::Node preset_root(const std::string& yaml_text, ProblemList& problems, const char* what) {
  YAML::Node root = load_yaml_document(yaml_text, problems.file());
  if (!root.IsDefined() || root.IsNull() || !root.IsMap()) {
    problems.add(std::string("a ") + what + " file must be a map of its keys (got " + describe_node(root) + ")");
    problems.throw_if_any();
  }
  return root;
}

std::string read_text_file(const std::string& path, const char* what) {
  if (auto why = input_path_problem(path)) throw InputError(path + ": cannot read " + what + " file: " + *why);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot read " + what + " file: permission denied or unreadable");
  note_input_file(path);  // outputs never overwrite it (reports/atomic_file.hpp)
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

bool is_preset_file_ref(const std::string& value) {
  auto ends_with = [&](const std::string& suffix) {
    return value.size() >= suffix.size() && value.compare(value.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends_with(".yaml") || ends_with(".yml") || value.find('/') != std::string::npos;
}

GpuSpec parse_gpu_file(const std::string& yaml_text, const std::string& source) {
  ProblemList problems(source);
  const YAML::Node root = preset_root(yaml_text, problems, "GPU");
  Context ctx(problems);
  Reader r(ctx, root, "", &kGpuFileKeys);
  GpuSpec g;
  r.check_map();
  read_gpu_fields(r, g);
  read_gpu_tables(r, g, "kernel_tables");
  for (const char* k : {"name", "peak_bf16", "hbm", "hbm_bandwidth", "gemm_efficiency", "memory_efficiency",
                        "kernel_overhead"})
    if (!r.has(k)) r.require(k);
  problems.throw_if_any();
  return g;
}

NodePreset parse_node_file(const std::string& yaml_text, const std::string& source, const std::string& base_dir) {
  ProblemList problems(source);
  const YAML::Node root = preset_root(yaml_text, problems, "node");
  Context ctx(problems);
  Reader r(ctx, root, "", &kNodeFileKeys);
  NodePreset n;
  r.check_map();
  for (const char* k : {"name", "gpu", "gpus_per_node", "nvlink", "nics_per_node", "nic", "hbm_reserve",
                        "host_dispatch"})
    if (!r.has(k)) r.require(k);
  if (auto v = r.text("name")) {
    if (v->find_first_not_of(' ') == std::string::npos)
      ctx.fail("name", "name is empty (the node's name, shown in every result)");
    else n.name = *v;
  }
  if (auto gpu = r.text("gpu")) {
    n.gpu = *gpu;
    if (!base_dir.empty() && is_preset_file_ref(*gpu)) {
      if (auto f = preset_from_file<GpuSpec>(ctx, "gpu", *gpu, base_dir, load_gpu_file)) n.gpu_spec = *f;
    } else if (const GpuSpec* p = find_gpu_preset(*gpu)) {
      n.gpu_spec = *p;
    } else {
      ctx.fail("gpu", "gpu=" + quote(*gpu) + " is not a GPU preset (valid: " + gpu_preset_list() +
                          (base_dir.empty() ? std::string(")") : std::string("; or a GPU file, *.yaml)")));
    }
  }
  if (auto v = r.integer("gpus_per_node")) {
    if (*v < 1) ctx.fail("gpus_per_node", "gpus_per_node=" + std::to_string(*v) + " must be at least 1");
    n.gpus_per_node = *v;
  }
  if (auto t = r.text("intra_node")) {
    const auto& valid = intra_node_topologies();
    if (std::find(valid.begin(), valid.end(), *t) == valid.end())
      ctx.fail("intra_node", "intra_node=" + quote(*t) + " is not one of " + join_list(valid));
    else
      for (const auto& [name, value] : kIntraNodes)
        if (name == *t) n.intra_node = value;
  }
  auto link = [&](const char* key, const std::vector<std::string>* keys, LinkSpec& l, double* nvls) {
    Reader q(ctx, r.child(key), key, keys);
    if (!r.has(key) || !q.check_map()) return;
    set_if(l.bandwidth, q.quantity("bandwidth", Quantity::bandwidth));
    set_if(l.latency, q.quantity("latency", Quantity::time));
    set_if(l.efficiency, q.ratio("efficiency"));
    for (const char* k : {"bandwidth", "latency", "efficiency"})
      if (!q.has(k)) q.require(k);
    if (nvls) set_if(*nvls, q.ratio("nvls_efficiency"));  // optional: 0 = no NVLS
  };
  link("nvlink", &kNvlinkFileKeys, n.nvlink, &n.nvls_efficiency);
  if (auto v = r.integer("nics_per_node")) {
    if (*v < 0) ctx.fail("nics_per_node", "nics_per_node=" + std::to_string(*v) + " must be >= 0");
    n.nics_per_node = *v;
  }
  link("nic", &kNicFileKeys, n.nic, nullptr);
  set_if(n.hbm_reserve_bytes, r.quantity("hbm_reserve", Quantity::bytes));
  set_if(n.host_dispatch, r.quantity("host_dispatch", Quantity::time));
  problems.throw_if_any();
  return n;
}

GpuSpec load_gpu_file(const std::string& path) { return parse_gpu_file(read_text_file(path, "GPU"), path); }

NodePreset load_node_file(const std::string& path) {
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  return parse_node_file(read_text_file(path, "node"), path, dir.string());
}

}  // namespace dtsim
