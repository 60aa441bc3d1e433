#pragma once
// The four inputs of an experiment (model, cluster, layout, training), as plain data.
// All quantities are in SI base units: bytes, seconds, FLOPs, FLOP/s, B/s.
// Parsing and validation live in models/experiment_io.hpp.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace dtsim {

enum class Activation { gelu, swiglu };
enum class Norm { layernorm, rmsnorm };
enum class Position { learned, rope };
enum class Recompute { none, selective, full };
/// Input element type of a GEMM: bf16, fp8 (E4M3/E5M2) or fp4 (E2M1).
enum class Dtype { bf16, fp8, fp4 };
/// Precision recipe (training.precision), models/precision.hpp.
enum class Precision { bf16, fp8_delayed, fp8_current, fp8_block, mxfp8, nvfp4 };
/// How the GPUs of one node are joined (cluster.intra_node; topologies/topology.hpp builds it):
///   nvswitch   every GPU has one port of cluster.nvlink.bandwidth per direction into a
///              non-blocking switch (NVIDIA DGX/HGX NVSwitch, NVL72 NVLink Switch trays);
///   xgmi_mesh  every GPU pair has its own direct link of cluster.nvlink.bandwidth per
///              direction and there is no switch (AMD Instinct MI300X / MI325X / MI355X
///              platforms: 8 GPUs, 7 Infinity Fabric links each; topologies/nodes/mi300x.yaml).
enum class IntraNode { nvswitch, xgmi_mesh };
/// Whose training loop runs the layout (training.framework): the bytes each keeps per parameter
/// (models/memory.hpp) and, with layout.zero_stage 3, how parameters and gradients move
/// (models/zero3.hpp): megatron (Megatron-Core; ZeRO-3 as Megatron-FSDP optim_grads_params),
/// deepspeed (DeepSpeed ZeRO), zero_paper (Rajbhandari et al. 2020's accounting), fsdp
/// (PyTorch FSDP2 fully_shard per transformer layer, ZeRO-3 only).
enum class Framework { megatron, deepspeed, zero_paper, fsdp };
/// CUDA graph capture (training.cuda_graphs; models/host_dispatch.hpp): none (eager launches),
/// layers (each transformer layer's forward and backward captured and replayed, Megatron-Core
/// --cuda-graph-impl local / transformer_engine with --cuda-graph-modules empty: the whole
/// layer), full_iteration (--cuda-graph-impl full_iteration: the whole forward-backward,
/// the optimizer step outside).
enum class CudaGraphs { none, layers, full_iteration };
/// Pipeline schedule, layout.schedule: one registered PipelineSchedule each
/// (models/schedules/schedule.hpp, one file per schedule, which documents its order and source).
enum class Schedule { gpipe, one_f_one_b, interleaved, zb_h1, zb_h2, dualpipev, dualpipe };
enum class GradDtype { fp32, bf16 };

/// Router scoring of a mixture-of-experts layer (Megatron-Core --moe-router-score-function).
enum class RouterScore { softmax, sigmoid };
/// How the router's tokens spread over the experts (the load factor a step is timed at;
/// models/moe.hpp moe_load_factor documents each):
///  - forced: Megatron-Core --moe-router-force-load-balancing (a benchmark mode: every expert
///    gets the mean), factor 1;
///  - measured: the factor given in model.moe.load_imbalance (max / mean tokens of the busiest
///    EP rank, >= 1), e.g. from a run's router statistics;
///  - aux_loss / aux_free: a trained router with an auxiliary balance loss (Shazeer et al.
///    2017; GShard) or DeepSeek-V3's auxiliary-loss-free bias (Wang et al. 2024, arXiv
///    2408.15664): the documented default factor of models/moe.hpp.
enum class RouterBalance { forced, measured, aux_loss, aux_free };

/// Mixture-of-experts layers (model.moe; absent or num_experts == 0: a dense model). Names are
/// Megatron-Core's (megatron/core/transformer/transformer_config.py) where a user would type them.
struct MoeSpec {
  int64_t num_experts = 0;          // routed experts per MoE layer, E (--num-experts)
  int64_t router_topk = 0;          // experts per token, k (--moe-router-topk)
  int64_t moe_ffn_hidden = 0;       // inner size of one routed SwiGLU expert (--moe-ffn-hidden-size)
  /// Inner size of the shared expert(s), all together (--moe-shared-expert-intermediate-size;
  /// DeepSeek n_shared_experts x moe_intermediate_size); 0 = none.
  int64_t shared_expert_ffn_hidden = 0;
  /// Which layers are MoE: layer i is MoE when i >= first_k_dense and
  /// (i - first_k_dense) % layer_freq == 0, unless `layer_pattern` is given (one 0/1 per layer,
  /// Megatron's --moe-layer-freq list form), which then decides alone.
  int64_t first_k_dense = 0;        // DeepSeek first_k_dense_replace
  int64_t layer_freq = 1;           // --moe-layer-freq (integer form)
  std::vector<uint8_t> layer_pattern;
  RouterScore router_score = RouterScore::softmax;
  bool router_expert_bias = false;  // --moe-router-enable-expert-bias (aux-loss-free balancing)
  int64_t router_num_groups = 0;    // --moe-router-num-groups (group-limited routing); 0 = none
  int64_t router_group_topk = 0;    // --moe-router-group-topk: groups a token may reach
  /// --moe-expert-capacity-factor: an expert takes at most capacity_factor x mean tokens, the
  /// rest are dropped (and with pad_to_capacity every expert computes exactly its capacity);
  /// 0 = dropless.
  double capacity_factor = 0;
  bool pad_to_capacity = false;     // --moe-pad-expert-input-to-capacity
  RouterBalance balance = RouterBalance::forced;
  double load_imbalance = 1.0;      // balance == measured: max / mean tokens per EP rank, >= 1

  bool enabled() const { return num_experts > 0; }
  /// Whether global layer `i` is a MoE layer (rule above).
  bool is_moe_layer(int64_t i) const {
    if (!enabled()) return false;
    if (!layer_pattern.empty()) return i >= 0 && i < static_cast<int64_t>(layer_pattern.size()) && layer_pattern[static_cast<size_t>(i)] != 0;
    return i >= first_k_dense && (i - first_k_dense) % layer_freq == 0;
  }
};

/// Multi-head latent attention (DeepSeek-V2 Sec 2.1, arXiv 2405.04434; DeepSeek-V3): queries
/// and keys/values go through low-rank latents. model.mla; absent (kv_lora_rank == 0) = none.
struct MlaSpec {
  int64_t q_lora_rank = 0;          // 0 = queries projected directly (DeepSeek-V2-Lite)
  int64_t kv_lora_rank = 0;         // d_c
  int64_t qk_nope_head_dim = 0;     // d_h (non-rotary part of a query / key head)
  int64_t qk_rope_head_dim = 0;     // d_h^R (decoupled rotary part, one shared key head)
  int64_t v_head_dim = 0;           // value head size
  bool enabled() const { return kv_lora_rank > 0; }
};

/// Local attention: model.attention. window 0 = every layer attends to the whole causal
/// context. Layer i uses the window when window_pattern is empty or window_pattern[i % size]
/// != 0 (GPT-OSS alternates sliding and full: [1, 0]; Mistral 7B slides in every layer;
/// Llama 4 chunks three layers of four: [1, 1, 1, 0]).
///   sliding (chunked false): a query attends to the `window` latest tokens, itself included
///     (Mistral 7B, arXiv 2310.06825 Sec 2; GPT-OSS model card Sec 2.1);
///   chunked (chunked true): the sequence is cut into chunks of `window` tokens and a query
///     attends causally within its own chunk (Llama 4's attention_chunk_size: transformers
///     models/llama4/modeling_llama4.py, the chunked causal mask of its "chunked_attention"
///     layers).
struct AttentionWindow {
  int64_t window = 0;               // tokens: the sliding window or the chunk
  std::vector<uint8_t> window_pattern;
  bool chunked = false;
  /// Learned per-head attention sinks (GPT-OSS: one logit per head added to the softmax
  /// denominator): heads parameters per layer, negligible FLOPs.
  bool sinks = false;
  bool windowed(int64_t layer) const {
    if (window <= 0) return false;
    if (window_pattern.empty()) return true;
    return window_pattern[static_cast<size_t>(layer) % window_pattern.size()] != 0;
  }
};

/// Decoder-only Transformer.
struct ModelSpec {
  std::string name;            // free text, for reports
  int64_t layers = 0;          // transformer blocks, L
  int64_t hidden = 0;          // h
  int64_t heads = 0;           // attention heads, a
  int64_t kv_heads = 0;        // key/value heads (GQA); == heads for MHA
  int64_t ffn_hidden = 0;      // MLP inner size (4h for GPT)
  int64_t vocab = 0;           // V (padded vocabulary)
  Activation activation = Activation::gelu;
  bool tied_embeddings = false;
  Norm norm = Norm::layernorm;
  Position position = Position::learned;
  /// Max positions of a learned position embedding (only used when position == learned;
  /// 0 means "seq_len of the training section").
  int64_t max_position_embeddings = 0;
  /// Attention head size; 0 = hidden / heads (an explicit head_dim, as Qwen3 and GPT-OSS have).
  int64_t head_dim_override = 0;
  MoeSpec moe;
  MlaSpec mla;
  AttentionWindow attention;
  /// DeepSeek-V3 multi-token prediction (Sec 2.2): extra modules after the last layer, each
  /// an embedding-projection (2h -> h), one transformer layer (the last layer's kind) and the
  /// shared LM head; 0 = none. Megatron-Core --mtp-num-layers.
  int64_t mtp_layers = 0;

  int64_t head_dim() const { return head_dim_override > 0 ? head_dim_override : hidden / heads; }
};

/// One GPU model. Every preset value cites its datasheet in topologies/gpus/*.yaml.
struct GpuSpec {
  /// The GPU file its values were read from, as written (cluster.gpu: FILE, a node file's
  /// gpu, or cluster.gpu.preset: FILE); empty for a built-in preset or inline values. Input
  /// errors about cluster.gpu.* name it (models/experiment_check.cpp).
  std::string source_file;
  std::string name;
  double peak_bf16_flops = 0;  // dense tensor-core FLOP/s
  double peak_fp8_flops = 0;   // dense FLOP/s; 0 when the GPU has no FP8 tensor cores
  /// Dense FP4 tensor-core FLOP/s (NVFP4 / MXFP4 inputs); 0 when the GPU has none (every
  /// GPU before Blackwell). Read by training.precision nvfp4 (models/precision.hpp).
  double peak_fp4_flops = 0;
  /// The tensor cores take block-scaled (microscaling, OCP MX) operands natively: one scale
  /// per 32 (MXFP8/MXFP4) or 16 (NVFP4) elements applied inside the MMA, at the FP8 / FP4
  /// rate (Blackwell sm_100+, AMD CDNA4). false: block scales are applied outside the tensor
  /// core (Hopper fp8-block, DeepSeek-V3's promotion to CUDA cores). training.precision mxfp8
  /// and nvfp4 need it.
  bool microscaling = false;
  double hbm_bytes = 0;        // capacity, bytes
  double hbm_bandwidth = 0;    // B/s
  /// Fraction of peak that dense GEMMs reach (cuBLAS) on full tiles and full waves;
  /// dimensionless, (0,1]. Each GEMM's own wave fill (models/compute_cost.hpp
  /// gemm_wave_fill, needs sm_count) lowers it further for shapes that leave SMs idle.
  double gemm_efficiency = 0;
  /// Fraction of the bf16 peak that fused (Flash) attention kernels reach on the FLOPs
  /// they execute; 0 = use gemm_efficiency. Unfused attention runs as GEMMs.
  double attention_efficiency = 0;
  /// Fraction of HBM bandwidth that streaming (memory-bound) kernels reach; (0,1].
  double memory_efficiency = 0;
  /// Fixed cost per GPU kernel launch, seconds.
  double kernel_overhead = 0;
  /// Streaming multiprocessors (datasheet); NCCL kernels occupy some of them while
  /// communication overlaps compute (models/compute_cost.hpp kNcclBlocks).
  int64_t sm_count = 0;
  /// Calibration profile (cluster.gpu.profile): path of a `dtsim calibrate` YAML file,
  /// as written (relative paths are relative to the experiment file); "" = roofline only.
  /// Read by models/compute_cost.hpp experiment_profile().
  std::string profile;
  /// Shipped kernel tables (cluster.gpu.kernel_tables): the system whose measured GEMM times
  /// (models/calibration/gemm_table.hpp, ComputeProfile::shipped) time this GPU's GEMMs
  /// instead of the roofline, e.g. "h100_sxm"; "" = none. Presets name theirs
  /// (topologies/gpus/*.yaml); `profile`, when given, is used instead.
  std::string kernel_tables;
  /// Sustained / burst matmul rate (cluster.gpu.sustained_ratio), dimensionless, (0, 1]:
  /// kernel-table times, measured in short bursts at boost clocks, are divided by it to give
  /// the rate a GPU holds at its power limit through a training run (MSMF / MAMF of
  /// mamf-finder, topologies/gpus/README.md). 1 = use the table as measured.
  double sustained_ratio = 1.0;
};

/// A point-to-point link class: per-direction bandwidth per GPU (or NIC) and latency.
struct LinkSpec {
  double bandwidth = 0;   // B/s per direction (line rate)
  double latency = 0;     // seconds per message step (alpha)
  /// Fraction of line rate that NCCL's Simple protocol sustains on this link (bus
  /// bandwidth / line rate); dimensionless, (0,1].
  double efficiency = 1.0;
};

/// Sizes of the switch tiers above the NICs (cluster.fabric as a map; built into a graph by
/// topologies/topology.hpp). A tier's uplink capacity is the NIC capacity below it divided
/// by its oversubscription (downlink : uplink), so 1 is non-blocking.
struct FabricShape {
  int64_t nodes_per_leaf = 0;        // leaf-spine, clos, rail-optimized (per rail): nodes per leaf
  double oversubscription = 1;       // leaf (rail leaf) downlink / uplink capacity, >= 1
  int64_t leaves_per_pod = 0;        // clos: leaves under one pod spine layer
  double pod_oversubscription = 1;   // clos: pod downlink / uplink capacity into the core, >= 1
};

/// Collective algorithm and NCCL protocol (cluster.collectives): "auto" lets the tuner
/// choose per collective as NCCL's does (sim/collectives/tuner.hpp); a name forces it where
/// the algorithm supports the collective (as NCCL_ALGO / NCCL_PROTO do).
struct CollectiveChoice {
  std::string algorithm = "auto";  // auto | ring | tree | nvls | hierarchical | direct | deepep | p2p
  std::string protocol = "auto";   // auto | simple | ll | ll128
};

struct ClusterSpec {
  /// The node file (cluster.node: FILE) the cluster was built from, as written; empty for a
  /// built-in node preset or none. Input errors about the keys a node file sets name it.
  std::string node_file;
  std::string name;
  GpuSpec gpu;
  int64_t nodes = 0;           // NVLink domains (a DGX node; a GB200 NVL72 rack)
  int64_t gpus_per_node = 0;
  /// Intra-node interconnect (cluster.intra_node): nvswitch (default) or xgmi-mesh.
  IntraNode intra_node = IntraNode::nvswitch;
  /// nvswitch: per GPU into the NVSwitch domain (one node). xgmi_mesh: per peer link, i.e.
  /// between one GPU pair and per direction (a GPU of a node of k GPUs has k-1 of them).
  LinkSpec nvlink;
  /// NVLink SHARP (NVLS) AllReduce rate per GPU / NVLink line rate; 0 = no NVLS (always 0 on
  /// an xgmi mesh: no switch to reduce in).
  double nvls_efficiency = 0;
  int64_t nics_per_node = 0;   // GPUs share NICs evenly: gpus_per_node / nics_per_node each
  LinkSpec nic;                // per NIC
  /// Fabric type: non-blocking (full-bisection fat tree) | leaf-spine | rail-optimized | clos.
  std::string fabric = "non-blocking";
  FabricShape fabric_shape;    // its tiers (unused by non-blocking)
  CollectiveChoice collectives;
  /// HBM kept back for the CUDA context, NCCL buffers and allocator fragmentation, bytes.
  double hbm_reserve_bytes = 0;
  /// Host CPU seconds that eager PyTorch spends to launch one kernel (Python, autograd
  /// recording, the ATen dispatcher and cudaLaunchKernel) on this cluster's host CPU
  /// (cluster.host_dispatch; node presets cite their measurement, topologies/nodes/README.md;
  /// models/host_dispatch.hpp uses it). 0 = free launches (the GPU never waits for the host).
  double host_dispatch = 0;

  int64_t gpus() const { return nodes * gpus_per_node; }
};

struct Layout {
  int64_t dp = 1, tp = 1, cp = 1, pp = 1;
  int zero_stage = 0;            // 0..3
  bool sequence_parallel = false;
  Recompute recompute = Recompute::none;
  /// Virtual pipeline stages per rank (interleaved 1F1B); 1 otherwise.
  int64_t vp = 1;
  /// Megatron-Core's pipeline split options, same names (rules and sources:
  /// models/pipeline_split.hpp). Unset: dtsim's default split.
  bool account_for_embedding_in_pipeline_split = false;  // the embedding takes a layer's slot
  bool account_for_loss_in_pipeline_split = false;       // the loss (LM head) takes a layer's slot
  int64_t decoder_first_pipeline_num_layers = 0;         // layers of pipeline rank 0; 0 = not set
  int64_t decoder_last_pipeline_num_layers = 0;          // layers of rank pp-1; 0 = not set
  /// --pipeline-model-parallel-layout string, e.g. "Et*3|(tt|)*29,m|L"; empty = not set.
  std::string pipeline_layout;
  /// Default: interleaved when vp > 1, else 1F1B.
  Schedule schedule = Schedule::one_f_one_b;
  /// Expert parallelism (Megatron-Core parallel folding, models/rank_grid.hpp): the routed
  /// experts of a MoE layer are split over `ep` ranks, each expert's GEMMs over `etp` ranks;
  /// within a pipeline stage the tp x cp x dp attention ranks are regrouped as
  /// etp x ep x edp, edp = tp cp dp / (etp ep). etp 0 = tp (Megatron's default for
  /// --expert-tensor-parallel-size).
  int64_t ep = 1;
  int64_t etp = 0;
  int64_t expert_tp() const { return etp > 0 ? etp : tp; }
  /// Expert data parallel size: ranks of a stage holding the same experts.
  int64_t edp() const { return dp * tp * cp / (expert_tp() * ep); }
};

struct Training {
  int64_t seq_len = 0;
  int64_t global_batch = 0;      // sequences per optimizer step
  int64_t micro_batch = 0;       // sequences per micro-batch per DP rank
  /// Precision recipe of the linear layers' GEMMs, their quantize kernels and what they
  /// change in memory (models/precision.hpp); training.dtype is its alias.
  Precision precision = Precision::bf16;
  /// Model weights stored and all-gathered in the recipe's low precision (Megatron
  /// --fp8-param-gather / --fp4-param-gather; needs a low-precision recipe).
  bool fp8_param_gather = false;
  /// The experiment named the recipe by its alias training.dtype (errors name that key).
  bool precision_from_dtype = false;
  /// Keep the first num_layers_at_start_in_bf16 and last num_layers_at_end_in_bf16 decoder
  /// layers in BF16 (Megatron --first-last-layers-bf16, transformer_config.py).
  bool first_last_layers_bf16 = false;
  int64_t num_layers_at_start_in_bf16 = 1;
  int64_t num_layers_at_end_in_bf16 = 1;
  bool flash_attention = true;   // fused attention: no s^2 score memory or traffic
  bool overlap_grad_reduce = true;  // DP gradient reduction overlaps backward
  Framework framework = Framework::megatron;  // bytes-per-parameter accounting
  /// Gradient (main-grad) dtype accumulated and reduced over DP: fp32 as Megatron
  /// (bf16 training forces accumulate_allreduce_grads_in_fp32), bf16 as DeepSpeed/FSDP.
  GradDtype main_grad = GradDtype::fp32;
  /// DDP / distributed-optimizer gradient bucket, bytes; 0 = the framework default
  /// (Megatron-Core: max(40M, 1M x DP) parameters).
  double grad_bucket_bytes = 0;
  /// DeepSpeed ZeRO-3 (framework deepspeed, zero_stage 3): parameter elements of the module
  /// trace within which a gathered parameter used again is kept instead of released, and the
  /// most parameter elements gathered at once (DeepSpeed's stage3_max_reuse_distance and
  /// stage3_max_live_parameters, both 1e9 by default, deepspeed/runtime/zero/config.py);
  /// models/zero3.hpp zero3_kept_layers.
  double stage3_max_reuse_distance = 1e9;
  double stage3_max_live_parameters = 1e9;
  /// Distributed optimizer / ZeRO-1/2: parameter AllGather overlapped with the next
  /// step's forward (Megatron --overlap-param-gather) instead of exposed after the step.
  bool overlap_param_gather = false;
  /// TP communication overlapped with the GEMMs (Transformer Engine userbuffers,
  /// Megatron --tp-comm-overlap; needs sequence parallelism when tp > 1). The
  /// sequence-parallel AllGathers before QKV / MLP-up (forward) and before the out-proj /
  /// MLP-down input-gradient GEMMs (backward) are pipelined with those GEMMs, and the
  /// forward ReduceScatters after out-proj / MLP-down with theirs (Op::overlap_splits in
  /// models/plan.hpp). false: TP collectives sit on the critical path (the backward
  /// input-gradient reductions overlap the weight-gradient GEMMs either way, as Megatron
  /// does without userbuffers).
  bool tp_comm_overlap = false;
  /// ZeRO-0/1: reduce gradients on every micro-batch instead of on the last one only
  /// (Megatron DDP / distributed optimizer). ZeRO-2/3 always reduce every micro-batch,
  /// their gradients being sharded (models/plan.hpp grad_sync_policy).
  bool reduce_every_micro_batch = false;
  /// Communication kernels running beside compute take SMs from it: while a collective
  /// overlaps compute on a rank, its kernels run at (1 - kNcclBlocks / sm_count) speed
  /// (models/compute_cost.hpp). Off: overlap is free.
  bool comm_interference = true;
  /// Pipeline sends overlap compute (Megatron --overlap-p2p-communication, interleaved
  /// schedule). Off: a send blocks until its bytes arrived, as Megatron-LM's
  /// p2p_communication._communicate waits on batch_isend_irecv.
  bool overlap_p2p = false;
  /// MoE token dispatcher (Megatron-Core --moe-token-dispatcher-type; `deepep` / `hybridep` =
  /// flex with --moe-enable-deepep / HybridEP): how the EP AllToAll runs
  /// (deepep and hybridep run the EP AllToAll as sim/collectives/alltoall_deepep.cpp: once per
  /// node over RDMA, then NVLink; alltoall as NCCL's direct AllToAll).
  std::string moe_token_dispatcher = "alltoall";
  /// SMs the dispatch / combine kernels hold while they run (models/compute_cost.hpp
  /// comm_overlap_speed): Megatron-Core transformer_config.py moe_deepep_num_sms (default 20,
  /// DeepEP deep_ep/buffer.py Buffer.num_sms = 20) and moe_hybridep_num_sms (default 24). NCCL
  /// collectives hold kNcclBlocks.
  int64_t moe_deepep_num_sms = 20;
  int64_t moe_hybridep_num_sms = 24;
  /// Megatron-Core --overlap-moe-expert-parallel-comm: the dispatch / combine AllToAll of one
  /// micro-batch overlaps the compute of another (forward with backward, 1F1B A2A overlap).
  bool overlap_moe_expert_parallel_comm = false;
  /// Megatron-Core --delay-wgrad-compute: expert weight gradients run after the backward
  /// dispatch AllToAll is issued, so it hides behind them.
  bool delay_wgrad_compute = false;
  /// Megatron-Core --moe-shared-expert-overlap: the shared expert computes while the routed
  /// tokens are dispatched and combined.
  bool moe_shared_expert_overlap = false;
  /// CUDA graphs (training.cuda_graphs, CudaGraphs): captured kernels are replayed by one
  /// host launch per graph instead of host_dispatch each (models/host_dispatch.hpp), at the
  /// memory cost of the graphs' static buffers (models/memory.hpp).
  CudaGraphs cuda_graphs = CudaGraphs::none;
  /// Gradient accumulation steps: global_batch / (micro_batch * dp).
  int64_t accumulation(const Layout& l) const { return global_batch / (micro_batch * l.dp); }
};

/// A per-GPU memory figure of one pipeline stage: model states (params + grads + optimizer
/// state), activations, or the peak (models/memory.hpp MemoryBreakdown).
enum class MemoryQuantity { model_states, activations, peak };
inline constexpr MemoryQuantity kMemoryQuantities[] = {MemoryQuantity::model_states, MemoryQuantity::activations,
                                                       MemoryQuantity::peak};

/// A published measurement of this experiment (optional top-level `published:` map), kept
/// so validation can compare against it. Zero means "not published".
struct Published {
  double step_time_s = 0;     // iteration time, seconds
  double tflops_per_gpu = 0;  // as the source reports it (model or hardware FLOPs: see below)
  /// True when tflops_per_gpu counts recomputed FLOPs too (hardware FLOPs), e.g.
  /// Narayanan 2021 Table 1 (its Eq. 3 includes the recompute forward pass). YAML:
  /// `published.tflops_basis: hardware` (default `model`).
  bool tflops_includes_recompute = false;
  double mfu = 0;             // model FLOPs utilization, fraction in [0,1]
  std::string source;         // paper / table / row
  /// Published per-GPU memory (`published.memory.<to_string(MemoryQuantity)>`), indexed by
  /// MemoryQuantity, compared by `dtsim validate` with stage_memory (models/memory.hpp
  /// memory_quantity) of pipeline stage `stage`; bytes; 0 = not published.
  struct MemoryPoint {
    int64_t stage = 0;
    double bytes = 0;
  };
  std::array<MemoryPoint, 3> memory{};
  std::string memory_source;  // published.memory.source
};

/// Which end of the kernel-time band compute times are taken at (models/time_band.hpp).
enum class TimeScenario { nominal, fast, slow };

struct Experiment {
  std::string source;   // file the experiment was read from (for error messages)
  std::string title;    // free text
  ModelSpec model;
  ClusterSpec cluster;
  Layout layout;
  Training training;
  Published published;  // optional; all zero when the file has no `published:` map
  /// Not an input key: the kernel-time band's computation sets it on copies to time every
  /// compute op at the fast or slow end of its data (models/time_band.hpp); nominal otherwise.
  TimeScenario time_scenario = TimeScenario::nominal;
};

const char* to_string(Activation);
const char* to_string(Norm);
const char* to_string(Position);
const char* to_string(Recompute);
const char* to_string(Dtype);
const char* to_string(IntraNode);  // the YAML value: nvswitch, xgmi-mesh
const char* to_string(Framework);
const char* to_string(CudaGraphs);
const char* to_string(Schedule);
const char* to_string(GradDtype);
const char* to_string(MemoryQuantity);  // the YAML key: model_states, activations, peak
const char* to_string(RouterScore);
const char* to_string(RouterBalance);

}  // namespace dtsim
