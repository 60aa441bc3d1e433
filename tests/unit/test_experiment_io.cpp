// Experiment files: schema, units, presets, --set, Hugging Face config.json, validation
// (models/experiment_io.hpp). Every constraint has its own test checking the exact text.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "tests/unit/temp_dir.hpp"
#include "topologies/gpu_presets.hpp"
#include "topologies/node_presets.hpp"

namespace dtsim {
namespace {

namespace fs = std::filesystem;

// A valid experiment: 32-layer, h=4096 model on 2 dgx-a100 nodes (16 GPUs), DP2 TP4 PP2,
// 16 micro-batches of 2 per DP rank.
const char* kBase = R"(title: base
model:
  name: test-7b
  layers: 32
  hidden: 4096
  heads: 32
  ffn_hidden: 11008
  activation: swiglu
  vocab: 32000
  tied_embeddings: false
  norm: rmsnorm
  position: rope
cluster:
  node: dgx-a100
  gpu: A100-SXM4-80GB
  nodes: 2
layout:
  dp: 2
  tp: 4
  pp: 2
training:
  seq_len: 2048
  global_batch: 64
  micro_batch: 2
)";

// Problems reported for `yaml` with `sets` applied; empty when it parses and validates.
std::vector<std::string> problems(const std::string& yaml, const std::vector<std::string>& sets = {},
                                  const std::string& base_dir = ".") {
  try {
    parse_experiment(yaml, "exp.yaml", sets, base_dir);
  } catch (const InputError& e) {
    return e.problems();
  }
  return {};
}

std::string dump(const std::vector<std::string>& ps) {
  std::string out;
  for (const auto& p : ps) out += "\n  " + p;
  return out.empty() ? std::string(" (none)") : out;
}

// Asserts that `expected` is one of the problems reported for kBase with `sets`.
void expect_problem(const std::vector<std::string>& sets, const std::string& expected) {
  const auto ps = problems(kBase, sets);
  EXPECT_NE(std::find(ps.begin(), ps.end(), expected), ps.end())
      << "expected: " << expected << "\nreported:" << dump(ps);
}

// Inserts `line` (already indented) right after the line `after` in kBase.
std::string with_line(const std::string& after, const std::string& line) {
  std::string y = kBase;
  const auto pos = y.find(after + "\n");
  EXPECT_NE(pos, std::string::npos) << after;
  y.insert(pos + after.size() + 1, line + "\n");
  return y;
}

std::string without_line(const std::string& line) {
  std::string y = kBase;
  const auto pos = y.find(line + "\n");
  EXPECT_NE(pos, std::string::npos) << line;
  y.erase(pos, line.size() + 1);
  return y;
}

// ---------------------------------------------------------------------------------------
// A valid file.

TEST(ExperimentIo, BaseParsesWithPresetsAndDefaults) {
  ASSERT_TRUE(problems(kBase).empty()) << dump(problems(kBase));
  const Experiment e = parse_experiment(kBase, "exp.yaml");
  EXPECT_EQ(e.source, "exp.yaml");
  EXPECT_EQ(e.title, "base");
  EXPECT_EQ(e.model.kv_heads, 32);  // default = heads
  EXPECT_EQ(e.model.activation, Activation::swiglu);
  EXPECT_EQ(e.cluster.gpu.name, "A100-SXM4-80GB");
  EXPECT_DOUBLE_EQ(e.cluster.gpu.peak_bf16_flops, 312e12);
  EXPECT_EQ(e.cluster.gpus_per_node, 8);
  EXPECT_EQ(e.cluster.gpus(), 16);
  EXPECT_DOUBLE_EQ(e.cluster.nvlink.bandwidth, 300e9);
  EXPECT_NEAR(e.cluster.nvlink.efficiency, 230.0 / 300.0, 1e-12);
  EXPECT_EQ(e.cluster.nics_per_node, 8);
  EXPECT_DOUBLE_EQ(e.cluster.nic.bandwidth, 25e9);
  EXPECT_EQ(e.cluster.fabric, "non-blocking");
  EXPECT_GT(e.cluster.hbm_reserve_bytes, 0.0);
  EXPECT_EQ(e.layout.cp, 1);
  EXPECT_EQ(e.layout.zero_stage, 0);
  EXPECT_FALSE(e.layout.sequence_parallel);
  EXPECT_EQ(e.layout.recompute, Recompute::none);
  EXPECT_EQ(e.training.precision, Precision::bf16);
  EXPECT_TRUE(e.training.flash_attention);
  EXPECT_TRUE(e.training.overlap_grad_reduce);
  EXPECT_EQ(e.training.framework, Framework::megatron);
  EXPECT_EQ(e.training.accumulation(e.layout), 16);
  EXPECT_DOUBLE_EQ(e.published.step_time_s, 0.0);
}

TEST(ExperimentIo, ExplicitClusterWithUnits) {
  const std::string y = R"(model: {name: m, layers: 2, hidden: 64, heads: 4, ffn_hidden: 256, activation: gelu,
        vocab: 1024, tied_embeddings: true, norm: layernorm, position: learned, max_position_embeddings: 128}
cluster:
  gpu: {name: MyGPU, peak_bf16: "100 TFLOP/s", peak_fp8: "200 TFLOP/s", hbm: "48 GiB",
        hbm_bandwidth: "1.5 TB/s", gemm_efficiency: 0.8, memory_efficiency: 0.85, kernel_overhead: "4 us"}
  nodes: 2
  gpus_per_node: 4
  nvlink: {bandwidth: "100 GB/s", latency: "2 us", efficiency: 0.8}
  nics_per_node: 2
  nic: {bandwidth: "200 Gb/s", latency: "5 us", efficiency: 0.9}
  fabric: non-blocking
  hbm_reserve: "1 GiB"
layout: {dp: auto, tp: 2, pp: 2, zero_stage: 3, sequence_parallel: true, recompute: full}
training: {seq_len: 128, global_batch: 8, micro_batch: 1, dtype: fp8, flash_attention: false,
           overlap_grad_reduce: false, framework: zero-paper}
published: {step_time_s: 1.5, tflops_per_gpu: 100, tflops_basis: hardware, mfu: 0.4, source: "paper"}
)";
  ASSERT_TRUE(problems(y).empty()) << dump(problems(y));
  const Experiment e = parse_experiment(y, "exp.yaml");
  EXPECT_EQ(e.title, "m");  // defaults to the model name
  EXPECT_DOUBLE_EQ(e.cluster.gpu.peak_fp8_flops, 200e12);
  EXPECT_DOUBLE_EQ(e.cluster.gpu.hbm_bytes, 48.0 * 1024 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(e.cluster.gpu.hbm_bandwidth, 1.5e12);
  EXPECT_DOUBLE_EQ(e.cluster.gpu.kernel_overhead, 4e-6);
  EXPECT_DOUBLE_EQ(e.cluster.nvlink.latency, 2e-6);
  EXPECT_DOUBLE_EQ(e.cluster.nic.bandwidth, 25e9);
  EXPECT_DOUBLE_EQ(e.cluster.hbm_reserve_bytes, 1024.0 * 1024 * 1024);
  EXPECT_EQ(e.layout.dp, 2);  // auto = 8 / (2*1*2)
  EXPECT_EQ(e.layout.zero_stage, 3);
  EXPECT_EQ(e.layout.recompute, Recompute::full);
  EXPECT_EQ(e.training.precision, Precision::fp8_delayed);
  EXPECT_EQ(e.training.framework, Framework::zero_paper);
  EXPECT_DOUBLE_EQ(e.published.step_time_s, 1.5);
  EXPECT_DOUBLE_EQ(e.published.mfu, 0.4);
  EXPECT_TRUE(e.published.tflops_includes_recompute);
  EXPECT_EQ(e.published.source, "paper");
}

TEST(ExperimentIo, GpuMapOverridesPresetFields) {
  const auto y = std::string(kBase);
  const Experiment e = parse_experiment(
      y, "exp.yaml", {"cluster.gpu.preset=H100-SXM5-80GB", "cluster.gpu.hbm=94 GiB", "cluster.node=dgx-h100"});
  EXPECT_EQ(e.cluster.gpu.name, "H100-SXM5-80GB");
  EXPECT_DOUBLE_EQ(e.cluster.gpu.hbm_bytes, 94.0 * 1024 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(e.cluster.gpu.peak_bf16_flops, 989e12);  // kept from the preset
  EXPECT_DOUBLE_EQ(e.cluster.nic.bandwidth, 50e9);           // dgx-h100: NDR
}

TEST(ExperimentIo, NodePresetSuppliesGpuWhenAbsent) {
  const Experiment e = parse_experiment(without_line("  gpu: A100-SXM4-80GB"), "exp.yaml");
  EXPECT_EQ(e.cluster.gpu.name, "A100-SXM4-80GB");
}

TEST(ExperimentIo, ExplicitClusterKeysOverrideNodePreset) {
  const Experiment e = parse_experiment(kBase, "exp.yaml",
                                        {"cluster.nvlink.efficiency=0.5", "cluster.nic.latency=20 us"});
  EXPECT_DOUBLE_EQ(e.cluster.nvlink.efficiency, 0.5);
  EXPECT_DOUBLE_EQ(e.cluster.nvlink.bandwidth, 300e9);
  EXPECT_DOUBLE_EQ(e.cluster.nic.latency, 20e-6);
}

// ---------------------------------------------------------------------------------------
// One test per cross-section constraint.

TEST(ExperimentIoConstraint, ProductOfDegreesEqualsGpus) {
  expect_problem({"layout.dp=4"},
                 "exp.yaml: layout.dp*tp*cp*pp=4*4*1*2=32 does not equal the cluster's GPUs "
                 "cluster.nodes*gpus_per_node=2*8=16");
}

TEST(ExperimentIoConstraint, TpDividesHeads) {
  expect_problem({"layout.tp=3"}, "exp.yaml: layout.tp=3 does not divide model.heads=32");
}

TEST(ExperimentIoConstraint, TpDividesKvHeads) {
  expect_problem({"model.kv_heads=2"}, "exp.yaml: layout.tp=4 does not divide model.kv_heads=2");
}

TEST(ExperimentIoConstraint, TpDividesFfnHidden) {
  expect_problem({"model.ffn_hidden=11010"},
                 "exp.yaml: layout.tp=4 does not divide model.ffn_hidden=11010 (the MLP is split across "
                 "tensor-parallel ranks)");
}

TEST(ExperimentIoConstraint, TpDividesVocab) {
  expect_problem({"model.vocab=32001"},
                 "exp.yaml: layout.tp=4 does not divide model.vocab=32001 (the embedding and output layer are "
                 "split across tensor-parallel ranks; pad the vocabulary)");
}

TEST(ExperimentIoConstraint, PpAtMostLayers) {
  expect_problem({"model.layers=1"},
                 "exp.yaml: layout.pp=2 exceeds model.layers=1 (every pipeline stage needs at least one layer)");
}

TEST(ExperimentIoConstraint, CpDividesSeqLen) {
  expect_problem({"layout.cp=2", "layout.dp=1", "training.seq_len=2047"},
                 "exp.yaml: layout.cp=2 does not divide training.seq_len=2047");
}

TEST(ExperimentIoConstraint, CpLoadBalanceNeedsTwoChunksPerRank) {
  expect_problem({"layout.cp=2", "layout.dp=1", "training.seq_len=2050"},
                 "exp.yaml: training.seq_len=2050 is not a multiple of 2*layout.cp=4 (causal context parallelism "
                 "splits the sequence into 2*cp chunks for load balance: Megatron-Core get_batch_on_this_cp_rank)");
  EXPECT_TRUE(problems(kBase, {"layout.cp=2", "layout.dp=1", "training.seq_len=2048"}).empty());
}

TEST(ExperimentIoConstraint, SequenceParallelNeedsTpThatDividesTheTokens) {
  expect_problem({"layout.sequence_parallel=true", "training.seq_len=2050"},
                 "exp.yaml: layout.tp=4 does not divide the 2050 tokens of a CP rank (training.seq_len=2050 / "
                 "layout.cp=1): sequence parallelism splits them over TP (Megatron-LM "
                 "scatter_to_sequence_parallel_region)");
  EXPECT_TRUE(problems(kBase, {"training.seq_len=2050"}).empty());  // no SP: any length
}

TEST(ExperimentIoConstraint, SetNeedsAKey) {
  expect_problem({"=3"}, "exp.yaml: --set \"=3\": missing key before '=' (expected --set key.path=value, e.g. "
                         "--set layout.tp=4)");
}

TEST(ExperimentIoConstraint, GlobalBatchIsWholeAccumulation) {
  expect_problem({"training.global_batch=100", "training.micro_batch=32"},
                 "exp.yaml: training.global_batch=100 is not a multiple of training.micro_batch*layout.dp=64");
}

TEST(ExperimentIoConstraint, PositiveIntegers) {
  expect_problem({"model.layers=0"}, "exp.yaml: model.layers=0 must be a positive integer");
  expect_problem({"training.micro_batch=-1"}, "exp.yaml: training.micro_batch=-1 must be a positive integer");
  expect_problem({"cluster.nodes=0"}, "exp.yaml: cluster.nodes=0 must be a positive integer");
}

TEST(ExperimentIoConstraint, ZeroStageRange) {
  expect_problem({"layout.zero_stage=4"}, "exp.yaml: layout.zero_stage=4 must be 0, 1, 2 or 3");
}

TEST(ExperimentIoConstraint, SequenceParallelWithTp1IsAllowed) {
  // Megatron accepts --sequence-parallel with TP=1 as a no-op (arguments.py disables it);
  // the run summary says it is off (reports/summary.cpp), as verify and sweep do.
  EXPECT_TRUE(problems(kBase, {"layout.tp=1", "layout.dp=8", "layout.sequence_parallel=true"}).empty())
      << dump(problems(kBase, {"layout.tp=1", "layout.dp=8", "layout.sequence_parallel=true"}));
}

TEST(ExperimentIoConstraint, HiddenDivisibleByHeads) {
  expect_problem({"model.hidden=4100"}, "exp.yaml: model.hidden=4100 is not a multiple of model.heads=32");
}

TEST(ExperimentIoConstraint, HeadsDivisibleByKvHeads) {
  expect_problem({"model.kv_heads=12"},
                 "exp.yaml: model.heads=32 is not a multiple of model.kv_heads=12 (each key/value head serves a "
                 "whole group of query heads)");
}

TEST(ExperimentIoConstraint, NicsPerNodeDivideGpusPerNode) {
  expect_problem({"cluster.nics_per_node=3"}, "exp.yaml: cluster.nics_per_node=3 does not divide cluster.gpus_per_node=8");
}

TEST(ExperimentIoConstraint, EfficienciesInUnitInterval) {
  expect_problem({"cluster.nvlink.efficiency=1.2"}, "exp.yaml: cluster.nvlink.efficiency=1.2 must be in (0, 1]");
  expect_problem({"cluster.nic.efficiency=0"}, "exp.yaml: cluster.nic.efficiency=0 must be in (0, 1]");
  expect_problem({"cluster.gpu.gemm_efficiency=1.5"}, "exp.yaml: cluster.gpu.gemm_efficiency=1.5 must be in (0, 1]");
  expect_problem({"cluster.gpu.memory_efficiency=-0.1"},
                 "exp.yaml: cluster.gpu.memory_efficiency=-0.1 must be in (0, 1]");
}

TEST(ExperimentIoConstraint, BandwidthsPositive) {
  expect_problem({"cluster.nic.bandwidth=0 GB/s"}, "exp.yaml: cluster.nic.bandwidth=0 B/s must be > 0");
  expect_problem({"cluster.nvlink.bandwidth=-5 GB/s"}, "exp.yaml: cluster.nvlink.bandwidth=-5e+09 B/s must be > 0");
  expect_problem({"cluster.gpu.hbm_bandwidth=0 TB/s"}, "exp.yaml: cluster.gpu.hbm_bandwidth=0 B/s must be > 0");
}

TEST(ExperimentIoConstraint, Fp8NeedsFp8TensorCores) {
  expect_problem({"training.dtype=fp8"},
                 "exp.yaml: training.dtype=fp8 needs FP8 tensor cores, but cluster.gpu A100-SXM4-80GB has peak_fp8=0");
  EXPECT_TRUE(problems(kBase, {"training.dtype=fp8", "cluster.gpu=H100-SXM5-80GB"}).empty());
}

TEST(ExperimentIoConstraint, FabricTypeIsARegisteredOne) {
  expect_problem({"cluster.fabric=fat-tree"},
                 "exp.yaml: cluster.fabric=\"fat-tree\" is not a fabric type (valid: non-blocking, leaf-spine, "
                 "rail-optimized, clos)");
}

TEST(ExperimentIoConstraint, LearnedPositionsCoverSeqLen) {
  expect_problem({"model.position=learned", "model.max_position_embeddings=1024"},
                 "exp.yaml: training.seq_len=2048 exceeds model.max_position_embeddings=1024 (learned position "
                 "embeddings)");
}

TEST(ExperimentIoConstraint, DpAutoNeedsWholeDivision) {
  const Experiment e = parse_experiment(kBase, "exp.yaml", {"layout.dp=auto"});
  EXPECT_EQ(e.layout.dp, 2);  // 16 GPUs / (tp 4 * pp 2)
  expect_problem({"layout.dp=auto", "layout.tp=3", "layout.pp=1"},
                 "exp.yaml: layout.dp=auto: the cluster's 16 GPUs are not a multiple of layout.tp*cp*pp=3");
}

TEST(ExperimentIoConstraint, HbmReserveBelowCapacity) {
  expect_problem({"cluster.hbm_reserve=80 GiB"},
                 "exp.yaml: cluster.hbm_reserve=8.58993e+10 B leaves no memory: it is not below "
                 "cluster.gpu.hbm=8.58993e+10 B");
}

TEST(ExperimentIoConstraint, PublishedMfuIsAFraction) {
  expect_problem({"published.mfu=52"}, "exp.yaml: published.mfu=52 must be a fraction in [0, 1]");
}

TEST(ExperimentIoValue, PublishedTflopsBasis) {
  EXPECT_FALSE(parse_experiment(kBase, "exp.yaml").published.tflops_includes_recompute);
  expect_problem({"published.tflops_basis=peak"},
                 "exp.yaml: published.tflops_basis=\"peak\" is not one of model, hardware");
}

TEST(ExperimentIo, SeveralProblemsReportedTogether) {
  const auto ps = problems(kBase, {"layout.tp=3", "training.global_batch=66", "cluster.nvlink.efficiency=2"});
  auto has = [&](const std::string& s) { return std::find(ps.begin(), ps.end(), s) != ps.end(); };
  EXPECT_TRUE(has("exp.yaml: layout.tp=3 does not divide model.heads=32")) << dump(ps);
  EXPECT_TRUE(has("exp.yaml: layout.tp=3 does not divide model.vocab=32000 (the embedding and output layer are "
                  "split across tensor-parallel ranks; pad the vocabulary)"))
      << dump(ps);
  EXPECT_TRUE(has("exp.yaml: layout.dp*tp*cp*pp=2*3*1*2=12 does not equal the cluster's GPUs "
                  "cluster.nodes*gpus_per_node=2*8=16"))
      << dump(ps);
  EXPECT_TRUE(has("exp.yaml: training.global_batch=66 is not a multiple of training.micro_batch*layout.dp=4"))
      << dump(ps);
  EXPECT_TRUE(has("exp.yaml: cluster.nvlink.efficiency=2 must be in (0, 1]")) << dump(ps);
  EXPECT_GE(ps.size(), 5u);
  // The exception's what() carries every line.
  try {
    parse_experiment(kBase, "exp.yaml", {"layout.tp=3", "training.global_batch=66"});
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find('\n'), std::string::npos);
  }
}

TEST(ExperimentIo, SeveralParseProblemsReportedTogether) {
  const auto ps = problems(with_line("  layers: 32", "  activation_fn: relu"), {"training.dtype=fp16", "layout.tp=x"});
  auto has = [&](const std::string& s) { return std::find(ps.begin(), ps.end(), s) != ps.end(); };
  EXPECT_TRUE(has("exp.yaml: training.dtype=\"fp16\" is not one of bf16, fp8")) << dump(ps);
  EXPECT_TRUE(has("exp.yaml: layout.tp=\"x\" is not an integer")) << dump(ps);
  EXPECT_TRUE(has("exp.yaml: unknown key model.activation_fn (valid keys under model: name, layers, hidden, heads, "
                  "kv_heads, ffn_hidden, activation, vocab, tied_embeddings, norm, position, "
                  "max_position_embeddings, hf_config, head_dim, moe, mla, attention, mtp_layers)"))
      << dump(ps);
  EXPECT_EQ(ps.size(), 3u) << dump(ps);
}

TEST(ExperimentIo, UnknownKeysAndCrossChecksReportedTogether) {
  const auto ps = problems(with_line("  tp: 4", "  bogus_knob: 1"), {"layout.tp=3", "cluster.gpu=X100"});
  auto has = [&](const std::string& s) { return std::find(ps.begin(), ps.end(), s) != ps.end(); };
  EXPECT_TRUE(has("exp.yaml: unknown key layout.bogus_knob (valid keys under layout: dp, tp, cp, pp, vp, schedule, zero_stage, "
                  "sequence_parallel, recompute, account_for_embedding_in_pipeline_split, "
                  "account_for_loss_in_pipeline_split, decoder_first_pipeline_num_layers, "
                  "decoder_last_pipeline_num_layers, pipeline_layout, ep, etp)"))
      << dump(ps);
  EXPECT_TRUE(has("exp.yaml: layout.tp=3 does not divide model.heads=32")) << dump(ps);
  EXPECT_TRUE(has("exp.yaml: cluster.gpu=\"X100\" is not a GPU preset (valid: " + gpu_preset_list() +
                  "; or a GPU file, *.yaml)"))
      << dump(ps);
  // The unknown GPU is reported once: checks on its fields are skipped, not repeated.
  for (const auto& p : ps) EXPECT_EQ(p.find("cluster.gpu.peak_bf16"), std::string::npos) << p;
}

// ---------------------------------------------------------------------------------------
// Types, enums, units, presets and required keys.

TEST(ExperimentIoValue, NotAnInteger) {
  expect_problem({"model.layers=3.5"}, "exp.yaml: model.layers=\"3.5\" is not an integer");
}

TEST(ExperimentIoValue, NotABoolean) {
  expect_problem({"layout.sequence_parallel=maybe"},
                 "exp.yaml: layout.sequence_parallel=\"maybe\" is not a boolean (expected true or false)");
}

TEST(ExperimentIoValue, NotANumber) {
  expect_problem({"cluster.nvlink.efficiency=high"}, "exp.yaml: cluster.nvlink.efficiency=\"high\" is not a number");
}

TEST(ExperimentIoValue, EnumsListChoices) {
  expect_problem({"model.activation=relu"}, "exp.yaml: model.activation=\"relu\" is not one of gelu, swiglu");
  expect_problem({"model.norm=batchnorm"}, "exp.yaml: model.norm=\"batchnorm\" is not one of layernorm, rmsnorm");
  expect_problem({"model.position=alibi"}, "exp.yaml: model.position=\"alibi\" is not one of learned, rope");
  expect_problem({"layout.recompute=some"},
                 "exp.yaml: layout.recompute=\"some\" is not one of none, selective, full");
  expect_problem({"training.framework=jax"},
                 "exp.yaml: training.framework=\"jax\" is not one of megatron, deepspeed, zero-paper, fsdp");
}

TEST(ExperimentIoValue, QuantityWithoutRateIsNotABandwidth) {
  const std::string y = with_line("  nodes: 2", "  nvlink:\n    bandwidth: 450 GB");
  const auto ps = problems(y);
  ASSERT_EQ(ps.size(), 1u) << dump(ps);
  EXPECT_EQ(ps[0], "exp.yaml: cluster.nvlink.bandwidth=\"450 GB\" is not a bandwidth (expected e.g. \"450 GB/s\")");
}

TEST(ExperimentIoValue, PlainNumberQuantityIsRejected) {
  expect_problem({"cluster.nic.latency=5"}, "exp.yaml: cluster.nic.latency=\"5\" is not a time (expected e.g. \"1.5 us\")");
  expect_problem({"cluster.hbm_reserve=2"},
                 "exp.yaml: cluster.hbm_reserve=\"2\" is not a size in bytes (expected e.g. \"80 GiB\")");
  expect_problem({"cluster.gpu.peak_bf16=312"},
                 "exp.yaml: cluster.gpu.peak_bf16=\"312\" is not a FLOP rate (expected e.g. \"312 TFLOP/s\")");
}

TEST(ExperimentIoValue, UnknownGpuPresetListsValidNames) {
  expect_problem({"cluster.gpu=X100"},
                 "exp.yaml: cluster.gpu=\"X100\" is not a GPU preset (valid: " + gpu_preset_list() +
                 "; or a GPU file, *.yaml)");
  expect_problem({"cluster.gpu.preset=X100"},
                 "exp.yaml: cluster.gpu.preset=\"X100\" is not a GPU preset (valid: " + gpu_preset_list() +
                 "; or a GPU file, *.yaml)");
}

TEST(ExperimentIoValue, UnknownNodePresetListsValidNames) {
  expect_problem({"cluster.node=dgx-x"},
                 "exp.yaml: cluster.node=\"dgx-x\" is not a node preset (valid: " + node_preset_list() +
                 "; or a node file, *.yaml)");
}

TEST(ExperimentIoValue, PresetNamesAreCaseInsensitive) {
  const Experiment e = parse_experiment(kBase, "exp.yaml", {"cluster.gpu=h100-sxm5-80gb", "cluster.node=DGX-H100"});
  EXPECT_EQ(e.cluster.gpu.name, "H100-SXM5-80GB");
  EXPECT_DOUBLE_EQ(e.cluster.nvlink.bandwidth, 450e9);
}

TEST(ExperimentIoValue, RequiredKeys) {
  {
    const auto ps = problems(without_line("  seq_len: 2048"));
    ASSERT_EQ(ps.size(), 1u) << dump(ps);
    EXPECT_EQ(ps[0], "exp.yaml: training.seq_len is required");
  }
  {
    const auto ps = problems(without_line("  hidden: 4096"));
    ASSERT_EQ(ps.size(), 1u) << dump(ps);
    EXPECT_EQ(ps[0], "exp.yaml: model.hidden is required");
  }
  {
    std::string y = kBase;
    y = y.substr(0, y.find("training:"));
    const auto ps = problems(y);
    ASSERT_EQ(ps.size(), 1u) << dump(ps);
    EXPECT_EQ(ps[0], "exp.yaml: training is required");
  }
}

TEST(ExperimentIoValue, ExplicitGpuWithoutPresetNeedsEveryField) {
  const auto ps = problems(kBase, {"cluster.gpu.name=Mine", "cluster.gpu.peak_bf16=100 TFLOP/s"});
  // `cluster.gpu=A100...` became {preset: A100..., ...}, so nothing is missing here.
  EXPECT_TRUE(ps.empty()) << dump(ps);
  std::string y = kBase;
  y.replace(y.find("  gpu: A100-SXM4-80GB"), std::string("  gpu: A100-SXM4-80GB").size(),
            "  gpu: {name: Mine, peak_bf16: 100 TFLOP/s}");
  const auto ps2 = problems(y);
  EXPECT_NE(std::find(ps2.begin(), ps2.end(), "exp.yaml: cluster.gpu.hbm is required (or give gpu.preset)"), ps2.end())
      << dump(ps2);
}

// ---------------------------------------------------------------------------------------
// Unknown keys at every level.

TEST(ExperimentIoUnknownKey, TopLevel) {
  const auto ps = problems(std::string(kBase) + "extra: 1\n");
  ASSERT_EQ(ps.size(), 1u) << dump(ps);
  EXPECT_EQ(ps[0], "exp.yaml: unknown key extra (valid keys: title, model, cluster, layout, training, published)");
}

TEST(ExperimentIoUnknownKey, Model) {
  const auto ps = problems(with_line("  layers: 32", "  layer: 32"));
  ASSERT_EQ(ps.size(), 1u) << dump(ps);
  EXPECT_EQ(ps[0],
            "exp.yaml: unknown key model.layer (valid keys under model: name, layers, hidden, heads, kv_heads, "
            "ffn_hidden, activation, vocab, tied_embeddings, norm, position, max_position_embeddings, hf_config, "
            "head_dim, moe, mla, attention, mtp_layers)");
}

TEST(ExperimentIoUnknownKey, ClusterAndNestedMaps) {
  {
    const auto ps = problems(with_line("  nodes: 2", "  switches: 4"));
    ASSERT_EQ(ps.size(), 1u) << dump(ps);
    EXPECT_EQ(ps[0],
              "exp.yaml: unknown key cluster.switches (valid keys under cluster: name, gpu, node, nodes, "
              "gpus_per_node, intra_node, nvlink, nics_per_node, nic, fabric, collectives, hbm_reserve, host_dispatch)");
  }
  {
    const auto ps = problems(with_line("  nodes: 2", "  nic:\n    speed: 400 Gb/s"));
    ASSERT_EQ(ps.size(), 1u) << dump(ps);
    EXPECT_EQ(ps[0], "exp.yaml: unknown key cluster.nic.speed (valid keys under cluster.nic: bandwidth, latency, "
                     "efficiency)");
  }
  {
    std::string y = kBase;
    y.replace(y.find("  gpu: A100-SXM4-80GB"), std::string("  gpu: A100-SXM4-80GB").size(),
              "  gpu: {preset: A100-SXM4-80GB, tdp: 400}");
    const auto ps = problems(y);
    ASSERT_EQ(ps.size(), 1u) << dump(ps);
    EXPECT_EQ(ps[0],
              "exp.yaml: unknown key cluster.gpu.tdp (valid keys under cluster.gpu: preset, name, peak_bf16, "
              "peak_fp8, peak_fp4, microscaling, hbm, hbm_bandwidth, gemm_efficiency, memory_efficiency, kernel_overhead, sm_count, attention_efficiency, "
              "profile, kernel_tables, sustained_ratio)");
  }
}

TEST(ExperimentIoUnknownKey, LayoutTrainingPublished) {
  {
    const auto ps = problems(with_line("  tp: 4", "  epp: 2"));
    ASSERT_EQ(ps.size(), 1u) << dump(ps);
    EXPECT_EQ(ps[0], "exp.yaml: unknown key layout.epp (valid keys under layout: dp, tp, cp, pp, vp, schedule, zero_stage, "
                     "sequence_parallel, recompute, account_for_embedding_in_pipeline_split, "
                     "account_for_loss_in_pipeline_split, decoder_first_pipeline_num_layers, "
                     "decoder_last_pipeline_num_layers, pipeline_layout, ep, etp)");
  }
  {
    const auto ps = problems(with_line("  micro_batch: 2", "  lr: 0.1"));
    ASSERT_EQ(ps.size(), 1u) << dump(ps);
    EXPECT_EQ(ps[0], "exp.yaml: unknown key training.lr (valid keys under training: seq_len, global_batch, "
                     "micro_batch, precision, dtype, fp8_param_gather, first_last_layers_bf16, "
                     "num_layers_at_start_in_bf16, num_layers_at_end_in_bf16, flash_attention, overlap_grad_reduce, "
                     "framework, main_grad, "
                     "grad_bucket, stage3_max_reuse_distance, stage3_max_live_parameters, overlap_param_gather, tp_comm_overlap, reduce_every_micro_batch, comm_interference, "
                     "overlap_p2p, moe_token_dispatcher, moe_deepep_num_sms, moe_hybridep_num_sms, "
                     "overlap_moe_expert_parallel_comm, delay_wgrad_compute, moe_shared_expert_overlap, cuda_graphs)");
  }
  {
    const auto ps = problems(std::string(kBase) + "published:\n  hfu: 0.5\n");
    ASSERT_EQ(ps.size(), 1u) << dump(ps);
    EXPECT_EQ(ps[0], "exp.yaml: unknown key published.hfu (valid keys under published: step_time_s, "
                     "tflops_per_gpu, tflops_basis, mfu, source, memory)");
  }
}

TEST(ExperimentIoUnknownKey, DuplicateKey) {
  const auto ps = problems(with_line("  tp: 4", "  tp: 2"));
  EXPECT_NE(std::find(ps.begin(), ps.end(), "exp.yaml: duplicate key layout.tp"), ps.end()) << dump(ps);
}

TEST(ExperimentIoUnknownKey, SectionMustBeAMap) {
  const auto ps = problems("model: 3\ncluster: {node: dgx-a100, nodes: 1}\nlayout: {dp: 8, tp: 1}\n"
                           "training: {seq_len: 8, global_batch: 8, micro_batch: 1}\n");
  EXPECT_NE(std::find(ps.begin(), ps.end(), "exp.yaml: model must be a map (got a scalar)"), ps.end()) << dump(ps);
}

// ---------------------------------------------------------------------------------------
// Syntax errors and files.

TEST(ExperimentIoFile, BadYamlNamesFileAndLine) {
  const std::string y = "title: x\nmodel:\n  layers: [1, 2\ncluster: {}\n";
  const auto ps = problems(y);
  ASSERT_EQ(ps.size(), 1u) << dump(ps);
  EXPECT_EQ(ps[0].rfind("exp.yaml: invalid YAML at line ", 0), 0u) << ps[0];
  const auto ps2 = problems("a: b: c\n");
  ASSERT_EQ(ps2.size(), 1u) << dump(ps2);
  EXPECT_EQ(ps2[0].rfind("exp.yaml: invalid YAML at line 1, column ", 0), 0u) << ps2[0];
}

TEST(ExperimentIoFile, EmptyAndNonMapFiles) {
  EXPECT_EQ(problems(""), std::vector<std::string>{
                              "exp.yaml: the file is empty (expected sections model, cluster, layout, training)"});
  EXPECT_EQ(problems("- 1\n- 2\n"),
            std::vector<std::string>{
                "exp.yaml: the file must be a map with sections model, cluster, layout, training (got a list)"});
}

TEST(ExperimentIoFile, MissingFileIsNamed) {
  try {
    load_experiment("/nonexistent/dir/exp.yaml");
    FAIL() << "no error";
  } catch (const InputError& e) {
    ASSERT_EQ(e.problems().size(), 1u);
    EXPECT_EQ(e.problems()[0], "/nonexistent/dir/exp.yaml: cannot read experiment file: no such file");
  }
}

// A fresh directory under the system temp dir, removed at the end of the test.
using test_files::TempDir;

TEST(ExperimentIoFile, LoadsFromDiskWithOverrides) {
  TempDir d;
  const auto file = d.write("exp.yaml", kBase);
  const Experiment e = load_experiment(file.string(), {"layout.tp=8", "layout.dp=1"});
  EXPECT_EQ(e.source, file.string());
  EXPECT_EQ(e.layout.tp, 8);
  EXPECT_EQ(e.layout.dp, 1);
}

// ---------------------------------------------------------------------------------------
// --set.

TEST(ExperimentIoSet, OverridesBeforeValidation) {
  // tp=3 alone is invalid; the second override makes the file valid again.
  const Experiment e = parse_experiment(kBase, "exp.yaml", {"layout.tp=3", "layout.tp=8", "layout.dp=1"});
  EXPECT_EQ(e.layout.tp, 8);
  EXPECT_EQ(e.layout.dp, 1);
}

TEST(ExperimentIoSet, ValuesAreYamlScalarsWithUnits) {
  const Experiment e = parse_experiment(kBase, "exp.yaml",
                                        {"cluster.nvlink.bandwidth=100 GB/s", "layout.sequence_parallel=true",
                                         "title=my run", "published.step_time_s=2.5"});
  EXPECT_DOUBLE_EQ(e.cluster.nvlink.bandwidth, 100e9);
  EXPECT_TRUE(e.layout.sequence_parallel);
  EXPECT_EQ(e.title, "my run");
  EXPECT_DOUBLE_EQ(e.published.step_time_s, 2.5);
}

TEST(ExperimentIoSet, UnknownPathIsNamed) {
  const auto ps = problems(kBase, {"layout.foo=1"});
  ASSERT_EQ(ps.size(), 1u) << dump(ps);
  EXPECT_EQ(ps[0], "exp.yaml: --set layout.foo=1: unknown key layout.foo (valid keys under layout: dp, tp, cp, pp, "
                   "vp, schedule, zero_stage, sequence_parallel, recompute, account_for_embedding_in_pipeline_split, "
                   "account_for_loss_in_pipeline_split, decoder_first_pipeline_num_layers, "
                   "decoder_last_pipeline_num_layers, pipeline_layout, ep, etp)");
  const auto ps2 = problems(kBase, {"layout.tp.x=1"});
  ASSERT_EQ(ps2.size(), 1u) << dump(ps2);
  EXPECT_EQ(ps2[0], "exp.yaml: --set layout.tp.x=1: unknown key layout.tp.x (layout.tp is a single value, not a map)");
  const auto ps3 = problems(kBase, {"modle.layers=3"});
  ASSERT_EQ(ps3.size(), 1u) << dump(ps3);
  EXPECT_EQ(ps3[0], "exp.yaml: --set modle.layers=3: unknown key modle (valid keys: title, model, cluster, layout, "
                    "training, published)");
}

TEST(ExperimentIoSet, MissingEqualsSign) {
  const auto ps = problems(kBase, {"layout.tp"});
  ASSERT_EQ(ps.size(), 1u) << dump(ps);
  EXPECT_EQ(ps[0], "exp.yaml: --set \"layout.tp\": missing '=' (expected --set key.path=value, e.g. --set layout.tp=4)");
}

TEST(ExperimentIoSet, ValueMustBeScalar) {
  const auto ps = problems(kBase, {"layout.tp=[1, 2]"});
  ASSERT_EQ(ps.size(), 1u) << dump(ps);
  EXPECT_EQ(ps[0], "exp.yaml: --set layout.tp=[1, 2]: \"[1, 2]\" is not a single YAML value");
}

TEST(ExperimentIoSet, CreatesMissingMaps) {
  const Experiment e = parse_experiment(kBase, "exp.yaml", {"published.mfu=0.5", "published.source=x"});
  EXPECT_DOUBLE_EQ(e.published.mfu, 0.5);
  EXPECT_EQ(e.published.source, "x");
}

// ---------------------------------------------------------------------------------------
// Hugging Face config.json.

// An experiment around `model_lines` on one dgx-a100 (8 GPUs, DP8 TP1), sequence 512.
std::string hf_yaml(const std::string& model_lines) {
  return "model:\n" + model_lines +
         "cluster: {node: dgx-a100, nodes: 1}\n"
         "layout: {dp: auto, tp: 1}\n"
         "training: {seq_len: 512, global_batch: 8, micro_batch: 1}\n";
}

TEST(ExperimentIoHf, Llama) {
  TempDir d;
  d.write("llama.json", R"({"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
    "hidden_act": "silu", "rms_norm_eps": 1e-5, "max_position_embeddings": 8192, "tie_word_embeddings": false,
    "rope_theta": 500000.0, "_name_or_path": "meta-llama/Meta-Llama-3-8B"})");
  const Experiment e = parse_experiment(hf_yaml("  hf_config: llama.json\n"), "exp.yaml", {}, d.path().string());
  const ModelSpec& m = e.model;
  EXPECT_EQ(m.name, "meta-llama/Meta-Llama-3-8B");
  EXPECT_EQ(m.layers, 32);
  EXPECT_EQ(m.hidden, 4096);
  EXPECT_EQ(m.heads, 32);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_EQ(m.ffn_hidden, 14336);
  EXPECT_EQ(m.vocab, 128256);
  EXPECT_EQ(m.activation, Activation::swiglu);
  EXPECT_FALSE(m.tied_embeddings);
  EXPECT_EQ(m.norm, Norm::rmsnorm);
  EXPECT_EQ(m.position, Position::rope);
  EXPECT_EQ(m.max_position_embeddings, 8192);
}

TEST(ExperimentIoHf, MistralWithoutKvHeadsDefaultsToMha) {
  TempDir d;
  d.write("mistral.json", R"({"model_type": "mistral", "num_hidden_layers": 4, "hidden_size": 256,
    "num_attention_heads": 8, "intermediate_size": 512, "vocab_size": 32000, "hidden_act": "silu",
    "sliding_window": 4096})");
  const Experiment e = parse_experiment(hf_yaml("  hf_config: mistral.json\n"), "exp.yaml", {}, d.path().string());
  EXPECT_EQ(e.model.kv_heads, 8);
  EXPECT_EQ(e.model.activation, Activation::swiglu);
  EXPECT_FALSE(e.model.tied_embeddings);  // transformers default
  EXPECT_EQ(e.model.name, "mistral");     // file stem when no _name_or_path
}

TEST(ExperimentIoHf, Qwen2TiedEmbeddings) {
  TempDir d;
  d.write("qwen.json", R"({"model_type": "qwen2", "num_hidden_layers": 24, "hidden_size": 896,
    "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
    "hidden_act": "silu", "tie_word_embeddings": true, "max_position_embeddings": 32768})");
  const Experiment e = parse_experiment(hf_yaml("  hf_config: qwen.json\n"), "exp.yaml", {}, d.path().string());
  EXPECT_EQ(e.model.layers, 24);
  EXPECT_EQ(e.model.kv_heads, 2);
  EXPECT_TRUE(e.model.tied_embeddings);
  EXPECT_EQ(e.model.norm, Norm::rmsnorm);
}

TEST(ExperimentIoHf, Gpt2) {
  TempDir d;
  d.write("gpt2.json", R"({"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_inner": null,
    "vocab_size": 50257, "n_positions": 1024, "activation_function": "gelu_new"})");
  const Experiment e = parse_experiment(hf_yaml("  hf_config: gpt2.json\n"), "exp.yaml", {}, d.path().string());
  const ModelSpec& m = e.model;
  EXPECT_EQ(m.layers, 12);
  EXPECT_EQ(m.hidden, 768);
  EXPECT_EQ(m.heads, 12);
  EXPECT_EQ(m.kv_heads, 12);
  EXPECT_EQ(m.ffn_hidden, 4 * 768);  // n_inner null -> 4 * n_embd
  EXPECT_EQ(m.vocab, 50257);
  EXPECT_EQ(m.activation, Activation::gelu);
  EXPECT_TRUE(m.tied_embeddings);
  EXPECT_EQ(m.norm, Norm::layernorm);
  EXPECT_EQ(m.position, Position::learned);
  EXPECT_EQ(m.max_position_embeddings, 1024);
}

TEST(ExperimentIoHf, GptNeoX) {
  TempDir d;
  d.write("neox.json", R"({"model_type": "gpt_neox", "num_hidden_layers": 44, "hidden_size": 6144,
    "num_attention_heads": 64, "intermediate_size": 24576, "vocab_size": 50432, "hidden_act": "gelu_fast",
    "rotary_pct": 0.25, "use_parallel_residual": true, "max_position_embeddings": 2048})");
  const Experiment e = parse_experiment(hf_yaml("  hf_config: neox.json\n"), "exp.yaml", {}, d.path().string());
  const ModelSpec& m = e.model;
  EXPECT_EQ(m.layers, 44);
  EXPECT_EQ(m.hidden, 6144);
  EXPECT_EQ(m.heads, 64);
  EXPECT_EQ(m.ffn_hidden, 24576);
  EXPECT_EQ(m.vocab, 50432);
  EXPECT_EQ(m.activation, Activation::gelu);
  EXPECT_FALSE(m.tied_embeddings);  // GPTNeoXConfig default
  EXPECT_EQ(m.norm, Norm::layernorm);
  EXPECT_EQ(m.position, Position::rope);
}

TEST(ExperimentIoHf, YamlKeysOverrideJson) {
  TempDir d;
  d.write("gpt2.json", R"({"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257,
    "n_positions": 1024})");
  const Experiment e = parse_experiment(hf_yaml("  hf_config: gpt2.json\n  layers: 4\n  name: tiny\n"
                                                "  tied_embeddings: false\n"),
                                        "exp.yaml", {"model.vocab=50304"}, d.path().string());
  EXPECT_EQ(e.model.layers, 4);
  EXPECT_EQ(e.model.name, "tiny");
  EXPECT_FALSE(e.model.tied_embeddings);
  EXPECT_EQ(e.model.vocab, 50304);
  EXPECT_EQ(e.model.hidden, 768);
}

TEST(ExperimentIoHf, MissingJsonKeyIsNamed) {
  TempDir d;
  d.write("bad.json", R"({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4,
    "intermediate_size": 64, "vocab_size": 128, "hidden_act": "silu"})");
  const auto ps = problems(hf_yaml("  hf_config: bad.json\n"), {}, d.path().string());
  ASSERT_EQ(ps.size(), 1u) << dump(ps);
  EXPECT_EQ(ps[0], "exp.yaml: model.hidden is required: not set in the YAML and hf_config \"bad.json\" has no "
                   "\"hidden_size\"");
  // Given in the YAML instead, the same file is fine.
  EXPECT_TRUE(problems(hf_yaml("  hf_config: bad.json\n  hidden: 32\n"), {}, d.path().string()).empty());
}

TEST(ExperimentIoHf, BadFiles) {
  TempDir d;
  {
    const auto ps = problems(hf_yaml("  hf_config: none.json\n"), {}, d.path().string());
    ASSERT_EQ(ps.size(), 1u) << dump(ps);
    EXPECT_EQ(ps[0], "exp.yaml: model.hf_config=\"none.json\": cannot read " + (d.path() / "none.json").string() +
                         ": no such file");
  }
  {
    d.write("broken.json", "{\"model_type\": ");
    const auto ps = problems(hf_yaml("  hf_config: broken.json\n"), {}, d.path().string());
    ASSERT_EQ(ps.size(), 1u) << dump(ps);
    EXPECT_EQ(ps[0].rfind("exp.yaml: model.hf_config=\"broken.json\": " + (d.path() / "broken.json").string() +
                              " is not valid JSON",
                          0),
              0u)
        << ps[0];
  }
  {
    d.write("t5.json", R"({"model_type": "t5", "num_layers": 6})");
    const auto ps = problems(hf_yaml("  hf_config: t5.json\n"), {}, d.path().string());
    ASSERT_EQ(ps.size(), 1u) << dump(ps);
    EXPECT_EQ(ps[0], "exp.yaml: model.hf_config=\"t5.json\": model_type=\"t5\" is not supported (supported: llama, "
                     "mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3, kimi_k2, gpt_oss, "
                     "llama4, llama4_text, gpt2, gpt_neox)");
  }
  {
    d.write("relu.json", R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32,
      "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 128, "hidden_act": "relu"})");
    const auto ps = problems(hf_yaml("  hf_config: relu.json\n"), {}, d.path().string());
    EXPECT_NE(std::find(ps.begin(), ps.end(),
                        "exp.yaml: model.hf_config=\"relu.json\": \"hidden_act\"=\"relu\" is not supported "
                        "(supported: silu, swish -> swiglu; gelu* -> gelu)"),
              ps.end())
        << dump(ps);
  }
}

// ---------------------------------------------------------------------------------------
// Hugging Face config.json: mixture of experts (the published config.json values, inline).

const fs::path kMoeConfigs = fs::path(DTSIM_SOURCE_DIR) / "experiments/moe/configs";

// mistralai/Mixtral-8x7B-v0.1 config.json.
const char* kMixtral8x7b = R"({
  "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.36.0.dev0",
  "use_cache": true, "vocab_size": 32000})";

TEST(ExperimentIoHfMoe, Mixtral8x7B) {
  TempDir d;
  d.write("mixtral.json", kMixtral8x7b);
  const Experiment e = parse_experiment(hf_yaml("  hf_config: mixtral.json\n"), "exp.yaml", {}, d.path().string());
  const ModelSpec& m = e.model;
  EXPECT_EQ(m.name, "mixtral");
  EXPECT_EQ(m.layers, 32);
  EXPECT_EQ(m.hidden, 4096);
  EXPECT_EQ(m.heads, 32);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_EQ(m.ffn_hidden, 14336);
  EXPECT_EQ(m.vocab, 32000);
  EXPECT_EQ(m.activation, Activation::swiglu);
  EXPECT_FALSE(m.tied_embeddings);
  EXPECT_EQ(m.norm, Norm::rmsnorm);
  EXPECT_EQ(m.position, Position::rope);
  EXPECT_EQ(m.max_position_embeddings, 32768);
  EXPECT_EQ(m.head_dim_override, 0);
  EXPECT_EQ(m.head_dim(), 128);
  EXPECT_EQ(m.mtp_layers, 0);
  EXPECT_FALSE(m.mla.enabled());
  const MoeSpec& x = m.moe;
  EXPECT_EQ(x.num_experts, 8);
  EXPECT_EQ(x.router_topk, 2);
  EXPECT_EQ(x.moe_ffn_hidden, 14336);
  EXPECT_EQ(x.shared_expert_ffn_hidden, 0);
  EXPECT_EQ(x.first_k_dense, 0);
  EXPECT_EQ(x.layer_freq, 1);
  EXPECT_TRUE(x.layer_pattern.empty());
  for (int64_t i = 0; i < m.layers; ++i) EXPECT_TRUE(x.is_moe_layer(i)) << i;
  EXPECT_EQ(x.router_score, RouterScore::softmax);
  EXPECT_FALSE(x.router_expert_bias);
  EXPECT_EQ(x.router_num_groups, 0);
  EXPECT_EQ(x.router_group_topk, 0);
  // The shipped copy of the published file reads the same.
  const Experiment shipped = parse_experiment(hf_yaml("  hf_config: mixtral-8x7b.json\n"), "exp.yaml", {},
                                              kMoeConfigs.string());
  EXPECT_EQ(shipped.model.moe.num_experts, 8);
  EXPECT_EQ(shipped.model.moe.moe_ffn_hidden, 14336);
  EXPECT_EQ(shipped.model.kv_heads, 8);
}

TEST(ExperimentIoHfMoe, YamlMoeKeysOverrideTheJson) {
  TempDir d;
  d.write("mixtral.json", kMixtral8x7b);
  // A model.moe section merges into the config.json's experts: nothing is required again.
  const Experiment e = parse_experiment(
      hf_yaml("  hf_config: mixtral.json\n  moe: {router_topk: 1, load_balancing: aux_loss}\n"), "exp.yaml", {},
      d.path().string());
  EXPECT_EQ(e.model.moe.num_experts, 8);
  EXPECT_EQ(e.model.moe.router_topk, 1);
  EXPECT_EQ(e.model.moe.moe_ffn_hidden, 14336);
  EXPECT_EQ(e.model.moe.balance, RouterBalance::aux_loss);
  // Mixtral's experts are intermediate_size wide: a YAML ffn_hidden resizes them too, unless
  // model.moe.moe_ffn_hidden says otherwise.
  EXPECT_EQ(parse_experiment(hf_yaml("  hf_config: mixtral.json\n  ffn_hidden: 1024\n"), "exp.yaml", {},
                             d.path().string())
                .model.moe.moe_ffn_hidden,
            1024);
  EXPECT_EQ(parse_experiment(hf_yaml("  hf_config: mixtral.json\n  ffn_hidden: 1024\n  moe: {moe_ffn_hidden: 2048}\n"),
                             "exp.yaml", {}, d.path().string())
                .model.moe.moe_ffn_hidden,
            2048);
  // A YAML layer rule.
  const Experiment half = parse_experiment(hf_yaml("  hf_config: mixtral.json\n  moe: {layer_freq: 2}\n"),
                                           "exp.yaml", {}, d.path().string());
  EXPECT_TRUE(half.model.moe.is_moe_layer(0));
  EXPECT_FALSE(half.model.moe.is_moe_layer(1));
  // Without hf_config the three sizes are still required.
  const auto ps = problems(hf_yaml("  name: m\n  layers: 2\n  hidden: 256\n  heads: 8\n  ffn_hidden: 512\n"
                                   "  vocab: 32000\n  activation: swiglu\n  tied_embeddings: false\n"
                                   "  norm: rmsnorm\n  position: rope\n  moe: {num_experts: 8}\n"));
  EXPECT_NE(std::find(ps.begin(), ps.end(), "exp.yaml: model.moe.router_topk is required"), ps.end()) << dump(ps);
}

TEST(ExperimentIoHfMoe, MixtralDefaultsAndErrors) {
  TempDir d;
  // MixtralConfig defaults: 8 experts, top-2, 8 key/value heads.
  d.write("min.json", R"({"model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 256,
    "num_attention_heads": 16, "intermediate_size": 512, "vocab_size": 32000, "hidden_act": "silu"})");
  const Experiment e = parse_experiment(hf_yaml("  hf_config: min.json\n"), "exp.yaml", {}, d.path().string());
  EXPECT_EQ(e.model.moe.num_experts, 8);
  EXPECT_EQ(e.model.moe.router_topk, 2);
  EXPECT_EQ(e.model.kv_heads, 8);
  // An unknown key is named.
  d.write("unk.json", R"({"model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 256,
    "num_attention_heads": 16, "intermediate_size": 512, "vocab_size": 32000, "hidden_act": "silu",
    "expert_capacity": 4})");
  const auto ps = problems(hf_yaml("  hf_config: unk.json\n"), {}, d.path().string());
  ASSERT_EQ(ps.size(), 1u) << dump(ps);
  EXPECT_EQ(ps[0].rfind("exp.yaml: model.hf_config=\"unk.json\": \"expert_capacity\" is not a key dtsim reads or knows "
                        "to leave the model unchanged (model family mixtral;",
                        0),
            0u)
      << ps[0];
}

// Qwen/Qwen3-30B-A3B config.json.
const char* kQwen3_30bA3b = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
  "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
  "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
  "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

TEST(ExperimentIoHfMoe, Qwen3_30bA3b) {
  TempDir d;
  d.write("qwen3.json", kQwen3_30bA3b);
  const Experiment e = parse_experiment(hf_yaml("  hf_config: qwen3.json\n"), "exp.yaml", {}, d.path().string());
  const ModelSpec& m = e.model;
  EXPECT_EQ(m.layers, 48);
  EXPECT_EQ(m.hidden, 2048);
  EXPECT_EQ(m.heads, 32);
  EXPECT_EQ(m.kv_heads, 4);
  EXPECT_EQ(m.ffn_hidden, 6144);
  EXPECT_EQ(m.vocab, 151936);
  EXPECT_EQ(m.activation, Activation::swiglu);
  EXPECT_FALSE(m.tied_embeddings);
  EXPECT_EQ(m.norm, Norm::rmsnorm);
  EXPECT_EQ(m.position, Position::rope);
  EXPECT_EQ(m.max_position_embeddings, 40960);
  // head_dim 128 x 32 heads = 4096 attention width on a 2048 hidden size.
  EXPECT_EQ(m.head_dim_override, 128);
  EXPECT_EQ(m.head_dim(), 128);
  EXPECT_EQ(m.mtp_layers, 0);
  EXPECT_FALSE(m.mla.enabled());
  const MoeSpec& x = m.moe;
  EXPECT_EQ(x.num_experts, 128);
  EXPECT_EQ(x.router_topk, 8);
  EXPECT_EQ(x.moe_ffn_hidden, 768);
  EXPECT_EQ(x.shared_expert_ffn_hidden, 0);
  EXPECT_EQ(x.first_k_dense, 0);
  EXPECT_EQ(x.layer_freq, 1);
  EXPECT_TRUE(x.layer_pattern.empty());  // every layer MoE
  EXPECT_EQ(x.router_score, RouterScore::softmax);
  EXPECT_FALSE(x.router_expert_bias);
  EXPECT_EQ(x.router_num_groups, 0);
  // A YAML model.head_dim wins over the JSON's.
  EXPECT_EQ(parse_experiment(hf_yaml("  hf_config: qwen3.json\n  head_dim: 64\n"), "exp.yaml", {}, d.path().string())
                .model.head_dim_override,
            64);
  // The shipped copy of the published file reads the same.
  const Experiment shipped = parse_experiment(hf_yaml("  hf_config: qwen3-30b-a3b.json\n"), "exp.yaml", {},
                                              kMoeConfigs.string());
  EXPECT_EQ(shipped.model.moe.num_experts, 128);
  EXPECT_EQ(shipped.model.head_dim_override, 128);
}

// Qwen/Qwen2-57B-A14B config.json.
const char* kQwen2_57bA14b = R"({
  "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "decoder_sparse_step": 1, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584,
  "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
  "model_type": "qwen2_moe", "moe_intermediate_size": 2560, "norm_topk_prob": false, "num_attention_heads": 28,
  "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 28, "num_key_value_heads": 4,
  "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
  "shared_expert_intermediate_size": 20480, "sliding_window": 131072, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

TEST(ExperimentIoHfMoe, Qwen2_57bA14b) {
  TempDir d;
  d.write("qwen2.json", kQwen2_57bA14b);
  const Experiment e = parse_experiment(hf_yaml("  hf_config: qwen2.json\n"), "exp.yaml", {}, d.path().string());
  const ModelSpec& m = e.model;
  EXPECT_EQ(m.layers, 28);
  EXPECT_EQ(m.hidden, 3584);
  EXPECT_EQ(m.heads, 28);
  EXPECT_EQ(m.kv_heads, 4);
  EXPECT_EQ(m.ffn_hidden, 18944);
  EXPECT_EQ(m.vocab, 151936);
  EXPECT_EQ(m.activation, Activation::swiglu);
  EXPECT_FALSE(m.tied_embeddings);
  EXPECT_EQ(m.max_position_embeddings, 131072);
  EXPECT_EQ(m.head_dim_override, 0);  // no head_dim: 3584 / 28 = 128
  const MoeSpec& x = m.moe;
  EXPECT_EQ(x.num_experts, 64);
  EXPECT_EQ(x.router_topk, 8);
  EXPECT_EQ(x.moe_ffn_hidden, 2560);
  EXPECT_EQ(x.shared_expert_ffn_hidden, 20480);
  EXPECT_TRUE(x.layer_pattern.empty());
  EXPECT_EQ(x.router_score, RouterScore::softmax);
  EXPECT_FALSE(x.router_expert_bias);
}

TEST(ExperimentIoHfMoe, QwenSparseStepAndMlpOnlyLayers) {
  TempDir d;
  // decoder_sparse_step 2: layers 1, 3, 5 are MoE; mlp_only_layers [3] makes layer 3 dense.
  d.write("q.json", R"({"model_type": "qwen3_moe", "num_hidden_layers": 6, "hidden_size": 256,
    "num_attention_heads": 8, "num_key_value_heads": 4, "intermediate_size": 1024, "vocab_size": 32000,
    "hidden_act": "silu", "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
    "decoder_sparse_step": 2, "mlp_only_layers": [3]})");
  const Experiment e = parse_experiment(hf_yaml("  hf_config: q.json\n"), "exp.yaml", {}, d.path().string());
  EXPECT_EQ(e.model.moe.layer_pattern, (std::vector<uint8_t>{0, 1, 0, 0, 0, 1}));
  EXPECT_EQ(e.model.ffn_hidden, 1024);  // the dense layers' MLP
  // The rule is applied to the final layer count.
  const Experiment more = parse_experiment(hf_yaml("  hf_config: q.json\n  layers: 8\n"), "exp.yaml", {},
                                           d.path().string());
  EXPECT_EQ(more.model.moe.layer_pattern, (std::vector<uint8_t>{0, 1, 0, 0, 0, 1, 0, 1}));
  // A YAML layer rule replaces the JSON's list.
  const Experiment yaml_rule = parse_experiment(hf_yaml("  hf_config: q.json\n  moe: {first_k_dense: 2}\n"),
                                                "exp.yaml", {}, d.path().string());
  EXPECT_TRUE(yaml_rule.model.moe.layer_pattern.empty());
  EXPECT_FALSE(yaml_rule.model.moe.is_moe_layer(1));
  EXPECT_TRUE(yaml_rule.model.moe.is_moe_layer(3));
  // num_experts 0: a dense model.
  d.write("dense.json", R"({"model_type": "qwen2_moe", "num_hidden_layers": 2, "hidden_size": 256,
    "num_attention_heads": 8, "intermediate_size": 1024, "vocab_size": 32000, "hidden_act": "silu",
    "num_experts": 0})");
  EXPECT_FALSE(
      parse_experiment(hf_yaml("  hf_config: dense.json\n"), "exp.yaml", {}, d.path().string()).model.moe.enabled());
  // Bad values name their key.
  d.write("bad.json", R"({"model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 256,
    "num_attention_heads": 8, "intermediate_size": 1024, "vocab_size": 32000, "hidden_act": "silu",
    "decoder_sparse_step": 0, "mlp_only_layers": "all"})");
  const auto ps = problems(hf_yaml("  hf_config: bad.json\n"), {}, d.path().string());
  EXPECT_NE(std::find(ps.begin(), ps.end(),
                      "exp.yaml: model.hf_config=\"bad.json\": \"decoder_sparse_step\"=0 must be a positive integer"),
            ps.end())
      << dump(ps);
  EXPECT_NE(std::find(ps.begin(), ps.end(),
                      "exp.yaml: model.hf_config=\"bad.json\": \"mlp_only_layers\"=\"all\" is not a list of integers"),
            ps.end())
      << dump(ps);
}

TEST(ExperimentIoHfMoe, Qwen3DenseHeadDim) {
  TempDir d;
  // Qwen3Config's head_dim defaults to 128, not hidden / heads.
  d.write("q3.json", R"({"model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 1024,
    "num_attention_heads": 16, "num_key_value_heads": 8, "intermediate_size": 3072, "vocab_size": 151936,
    "hidden_act": "silu", "tie_word_embeddings": true})");
  const Experiment e = parse_experiment(hf_yaml("  hf_config: q3.json\n"), "exp.yaml", {}, d.path().string());
  EXPECT_EQ(e.model.head_dim_override, 128);
  EXPECT_FALSE(e.model.moe.enabled());
  EXPECT_TRUE(e.model.tied_embeddings);
  d.write("q3b.json", R"({"model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 1024,
    "num_attention_heads": 16, "intermediate_size": 3072, "vocab_size": 151936, "hidden_act": "silu",
    "head_dim": 64})");
  EXPECT_EQ(parse_experiment(hf_yaml("  hf_config: q3b.json\n"), "exp.yaml", {}, d.path().string())
                .model.head_dim_override,
            0);  // 64 = 1024 / 16
}

// deepseek-ai/DeepSeek-V3 config.json.
const char* kDeepseekV3 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
               "AutoModel": "modeling_deepseek.DeepseekV3Model",
               "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
  "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
  "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
  "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
  "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
  "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1, "pretraining_tp": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "original_max_position_embeddings": 4096, "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true,
  "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
  "transformers_version": "4.33.1", "use_cache": true, "v_head_dim": 128, "vocab_size": 129280})";

TEST(ExperimentIoHfMoe, DeepseekV3) {
  TempDir d;
  d.write("v3.json", kDeepseekV3);
  // dtsim does not simulate the multi-token prediction module yet: the YAML turns it off.
  const Experiment e =
      parse_experiment(hf_yaml("  hf_config: v3.json\n  mtp_layers: 0\n"), "exp.yaml", {}, d.path().string());
  const ModelSpec& m = e.model;
  EXPECT_EQ(m.layers, 61);
  EXPECT_EQ(m.hidden, 7168);
  EXPECT_EQ(m.heads, 128);
  EXPECT_EQ(m.kv_heads, 128);
  EXPECT_EQ(m.ffn_hidden, 18432);  // the first three (dense) layers
  EXPECT_EQ(m.vocab, 129280);
  EXPECT_EQ(m.activation, Activation::swiglu);
  EXPECT_FALSE(m.tied_embeddings);
  EXPECT_EQ(m.norm, Norm::rmsnorm);
  EXPECT_EQ(m.position, Position::rope);
  EXPECT_EQ(m.max_position_embeddings, 163840);
  EXPECT_EQ(m.head_dim_override, 0);
  EXPECT_EQ(m.mtp_layers, 0);
  EXPECT_TRUE(m.mla.enabled());
  EXPECT_EQ(m.mla.q_lora_rank, 1536);
  EXPECT_EQ(m.mla.kv_lora_rank, 512);
  EXPECT_EQ(m.mla.qk_nope_head_dim, 128);
  EXPECT_EQ(m.mla.qk_rope_head_dim, 64);
  EXPECT_EQ(m.mla.v_head_dim, 128);
  const MoeSpec& x = m.moe;
  EXPECT_EQ(x.num_experts, 256);
  EXPECT_EQ(x.router_topk, 8);
  EXPECT_EQ(x.moe_ffn_hidden, 2048);
  EXPECT_EQ(x.shared_expert_ffn_hidden, 2048);  // 1 shared expert x 2048
  EXPECT_EQ(x.first_k_dense, 3);
  EXPECT_EQ(x.layer_freq, 1);
  EXPECT_TRUE(x.layer_pattern.empty());
  EXPECT_FALSE(x.is_moe_layer(2));
  EXPECT_TRUE(x.is_moe_layer(3));
  EXPECT_TRUE(x.is_moe_layer(60));
  EXPECT_EQ(x.router_score, RouterScore::sigmoid);
  EXPECT_TRUE(x.router_expert_bias);  // noaux_tc
  EXPECT_EQ(x.router_num_groups, 8);
  EXPECT_EQ(x.router_group_topk, 4);
  // Without the YAML override the config.json's MTP module is read (num_nextn_predict_layers).
  {
    const auto ps = problems(hf_yaml("  hf_config: v3.json\n"), {}, d.path().string());
    EXPECT_TRUE(ps.empty()) << dump(ps);
    const Experiment with_mtp = parse_experiment(hf_yaml("  hf_config: v3.json\n"), "exp.yaml", {}, d.path().string());
    EXPECT_EQ(with_mtp.model.mtp_layers, 1);
  }
  // The shipped copy of the published file reads the same.
  const Experiment shipped = parse_experiment(hf_yaml("  hf_config: deepseek-v3.json\n  mtp_layers: 0\n"),
                                              "exp.yaml", {}, kMoeConfigs.string());
  EXPECT_EQ(shipped.model.moe.num_experts, 256);
  EXPECT_EQ(shipped.model.mla.kv_lora_rank, 512);
  EXPECT_TRUE(shipped.model.moe.router_expert_bias);
  // YAML model.moe / model.mla keys override the JSON's.
  const Experiment o = parse_experiment(
      hf_yaml("  hf_config: v3.json\n  mtp_layers: 0\n  moe: {router_topk: 4}\n  mla: {q_lora_rank: 0}\n"),
      "exp.yaml", {}, d.path().string());
  EXPECT_EQ(o.model.moe.router_topk, 4);
  EXPECT_EQ(o.model.moe.num_experts, 256);
  EXPECT_EQ(o.model.mla.q_lora_rank, 0);
  EXPECT_EQ(o.model.mla.kv_lora_rank, 512);
}

// A DeepSeek-V2/V3 style config.json of 6 layers with `extra` members added or replaced (one
// member of each name: a config.json with a key twice is an input error).
std::string small_deepseek(const std::string& type, const std::string& extra) {
  nlohmann::json j = nlohmann::json::parse(R"({"model_type": ")" + type + R"(", "num_hidden_layers": 6, "hidden_size": 256,
    "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 1024, "vocab_size": 32000,
    "hidden_act": "silu", "n_routed_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
    "kv_lora_rank": 64, "q_lora_rank": 96, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32})");
  if (!extra.empty()) j.update(nlohmann::json::parse("{" + extra + "}"));
  return j.dump();
}

TEST(ExperimentIoHfMoe, DeepseekRoutingAndLayers) {
  TempDir d;
  auto read = [&](const std::string& json, const std::string& yaml_extra = "") {
    d.write("ds.json", json);
    return parse_experiment(hf_yaml("  hf_config: ds.json\n" + yaml_extra), "exp.yaml", {}, d.path().string()).model;
  };
  // DeepSeek-V2 (236B) routing: softmax, group-limited greedy (8 groups, top 3), no expert bias;
  // 2 shared experts.
  {
    const ModelSpec m = read(small_deepseek("deepseek_v2", R"("scoring_func": "softmax",
      "topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 3, "n_shared_experts": 2,
      "first_k_dense_replace": 1)"));
    EXPECT_EQ(m.moe.router_score, RouterScore::softmax);
    EXPECT_FALSE(m.moe.router_expert_bias);
    EXPECT_EQ(m.moe.router_num_groups, 8);
    EXPECT_EQ(m.moe.router_group_topk, 3);
    EXPECT_EQ(m.moe.shared_expert_ffn_hidden, 256);
    EXPECT_EQ(m.moe.first_k_dense, 1);
  }
  // DeepSeek-V2-Lite: q_lora_rank null (queries projected directly), greedy top-k ignores groups.
  {
    const ModelSpec m = read(small_deepseek("deepseek_v2", R"("q_lora_rank": null, "topk_method": "greedy",
      "n_group": 1, "topk_group": 1)"));
    EXPECT_EQ(m.mla.q_lora_rank, 0);
    EXPECT_EQ(m.moe.router_num_groups, 0);
    EXPECT_EQ(m.moe.router_score, RouterScore::softmax);  // DeepseekV2 default
    EXPECT_EQ(m.moe.first_k_dense, 0);                    // DeepseekV2Config default
    EXPECT_EQ(m.mtp_layers, 0);
  }
  // Kimi-K2: DeepSeek-V3's code; one expert group limits nothing.
  {
    const ModelSpec m = read(small_deepseek("kimi_k2", R"("n_group": 1, "topk_group": 1, "scoring_func": "sigmoid",
      "topk_method": "noaux_tc", "first_k_dense_replace": 1, "num_nextn_predict_layers": 0)"));
    EXPECT_EQ(m.moe.router_score, RouterScore::sigmoid);
    EXPECT_TRUE(m.moe.router_expert_bias);
    EXPECT_EQ(m.moe.router_num_groups, 0);
    EXPECT_EQ(m.moe.shared_expert_ffn_hidden, 128);  // DeepseekV3Config default: 1 shared expert
  }
  // moe_layer_freq counts from layer 0 (i % freq == 0 after the dense ones): a per-layer list
  // when MoeSpec's rule (counted from first_k_dense) differs.
  {
    const ModelSpec m = read(small_deepseek("deepseek_v3", R"("first_k_dense_replace": 1, "moe_layer_freq": 2)"),
                             "  mtp_layers: 0\n");
    EXPECT_EQ(m.moe.layer_pattern, (std::vector<uint8_t>{0, 0, 1, 0, 1, 0}));
    const ModelSpec even = read(small_deepseek("deepseek_v3", R"("first_k_dense_replace": 2, "moe_layer_freq": 2)"));
    EXPECT_TRUE(even.moe.layer_pattern.empty());
    EXPECT_EQ(even.moe.first_k_dense, 2);
    EXPECT_EQ(even.moe.layer_freq, 2);
  }
}

TEST(ExperimentIoHfMoe, DeepseekErrorsNameTheKey) {
  TempDir d;
  auto first_problem = [&](const std::string& json) {
    d.write("ds.json", json);
    const auto ps = problems(hf_yaml("  hf_config: ds.json\n"), {}, d.path().string());
    EXPECT_EQ(ps.size(), 1u) << dump(ps);
    return ps.empty() ? std::string() : ps[0];
  };
  EXPECT_EQ(first_problem(small_deepseek("deepseek_v3", R"("scoring_func": "sqrtsoftplus")")),
            "exp.yaml: model.hf_config=\"ds.json\": \"scoring_func\"=\"sqrtsoftplus\" is not supported (supported: "
            "softmax, sigmoid)");
  EXPECT_EQ(first_problem(small_deepseek("deepseek_v3", R"("topk_method": "random")")),
            "exp.yaml: model.hf_config=\"ds.json\": \"topk_method\"=\"random\" is not supported (supported: greedy, "
            "group_limited_greedy, noaux_tc)");
  const std::string unknown = first_problem(small_deepseek("deepseek_v3", R"("index_topk": 2048)"));
  EXPECT_EQ(unknown.rfind("exp.yaml: model.hf_config=\"ds.json\": \"index_topk\" is not a key dtsim reads or knows to "
                          "leave the model unchanged (model family deepseek_v2, deepseek_v3, kimi_k2;",
                          0),
            0u)
      << unknown;
  EXPECT_EQ(first_problem(small_deepseek("deepseek_v3", R"("head_dim": 32)")),
            "exp.yaml: model.hf_config=\"ds.json\": \"head_dim\"=32 is not qk_rope_head_dim=16 (the value transformers "
            "derives); MLA's head sizes are qk_nope_head_dim, qk_rope_head_dim and v_head_dim");
  // The derived values themselves are fine.
  d.write("ok.json", small_deepseek("deepseek_v3", R"("head_dim": 16, "qk_head_dim": 48)"));
  EXPECT_TRUE(problems(hf_yaml("  hf_config: ok.json\n"), {}, d.path().string()).empty())
      << dump(problems(hf_yaml("  hf_config: ok.json\n"), {}, d.path().string()));
}

// ---------------------------------------------------------------------------------------
// Presets.

TEST(ExperimentIoPresets, GpuRegistry) {
  // Registry order: the shipped files' names (topologies/gpus/*.yaml).
  EXPECT_EQ(gpu_preset_names(),
            (std::vector<std::string>{"A100-SXM4-40GB", "A100-SXM4-80GB", "B200", "B300", "GB200", "GB300",
                                      "H100-SXM5-80GB", "H20", "H200-SXM-141GB", "H800-SXM5-80GB", "MI300X", "MI325X", "MI355X"}));
  EXPECT_EQ(&gpu_preset("b200"), find_gpu_preset("B200"));
  EXPECT_EQ(find_gpu_preset("nope"), nullptr);
  try {
    gpu_preset("nope");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "unknown GPU preset \"nope\" (valid: A100-SXM4-40GB, A100-SXM4-80GB, B200, B300, GB200, GB300, "
              "H100-SXM5-80GB, H20, H200-SXM-141GB, H800-SXM5-80GB, MI300X, MI325X, MI355X)");
  }
  for (const auto& name : gpu_preset_names()) {
    SCOPED_TRACE(name);
    const GpuSpec& g = gpu_preset(name);
    EXPECT_EQ(g.name, name);
    EXPECT_GT(g.peak_bf16_flops, 0);
    EXPECT_GT(g.hbm_bytes, 0);
    EXPECT_GT(g.hbm_bandwidth, 0);
    EXPECT_GT(g.gemm_efficiency, 0);
    EXPECT_LE(g.gemm_efficiency, 1);
    EXPECT_GT(g.memory_efficiency, 0);
    EXPECT_LE(g.memory_efficiency, 1);
    EXPECT_GT(g.kernel_overhead, 0);
    EXPECT_LT(g.kernel_overhead, 20e-6);  // a few microseconds
  }
  EXPECT_EQ(gpu_preset("A100-SXM4-80GB").peak_fp8_flops, 0.0);
  EXPECT_DOUBLE_EQ(gpu_preset("H100-SXM5-80GB").peak_fp8_flops, 1979e12);
  EXPECT_DOUBLE_EQ(gpu_preset("H200-SXM-141GB").hbm_bandwidth, 4800e9);
  EXPECT_DOUBLE_EQ(gpu_preset("B200").peak_bf16_flops, 2250e12);
}

TEST(ExperimentIoPresets, NodeRegistry) {
  EXPECT_EQ(node_preset_names(),
            (std::vector<std::string>{"dgx-a100-40gb", "dgx-a100", "dgx-b200", "dgx-b300", "dgx-h100", "dgx-h20",
                                      "dgx-h200", "dgx-h800", "gb200-nvl72", "gb300-nvl72", "mi300x", "mi325x", "mi355x"}));
  for (const auto& name : node_preset_names()) {
    SCOPED_TRACE(name);
    const NodePreset& n = node_preset(name);
    EXPECT_NE(find_gpu_preset(n.gpu), nullptr);
    // A DGX node is 8 GPUs with 8 compute NICs; a GB200 NVL72 NVLink domain is 72 GPUs with
    // one NIC each (topologies/nodes/*.yaml).
    EXPECT_EQ(n.gpus_per_node, name == "gb200-nvl72" || name == "gb300-nvl72" ? 72 : 8);
    EXPECT_EQ(n.nics_per_node, n.gpus_per_node);
    EXPECT_GT(n.nvlink.efficiency, 0);
    EXPECT_LE(n.nvlink.efficiency, 1);
    EXPECT_GT(n.nic.efficiency, 0);
    EXPECT_LE(n.nic.efficiency, 1);
    EXPECT_GT(n.nic.latency, n.nvlink.latency);
    EXPECT_GT(n.hbm_reserve_bytes, 0);
    EXPECT_LT(n.hbm_reserve_bytes, 8.0 * 1024 * 1024 * 1024);
  }
  EXPECT_DOUBLE_EQ(node_preset("dgx-a100").nvlink.bandwidth, 300e9);
  EXPECT_DOUBLE_EQ(node_preset("dgx-h100").nvlink.bandwidth, 450e9);
  EXPECT_DOUBLE_EQ(node_preset("dgx-b200").nvlink.bandwidth, 900e9);
  EXPECT_DOUBLE_EQ(node_preset("dgx-h800").nvlink.bandwidth, 200e9);  // H800: 400 GB/s bidirectional
  EXPECT_DOUBLE_EQ(node_preset("dgx-a100").nic.bandwidth, 25e9);
  EXPECT_DOUBLE_EQ(node_preset("dgx-h200").nic.bandwidth, 50e9);
  EXPECT_THROW(node_preset("dgx-z"), InputError);
}

}  // namespace
}  // namespace dtsim
