// The step plan of small layouts: which collectives, on which groups, with which bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "models/calibration/plan_kernels.hpp"
#include "models/compute_cost.hpp"
#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/flops.hpp"
#include "models/plan.hpp"
#include "models/rank_grid.hpp"
#include "topologies/gpu_presets.hpp"

namespace dtsim {
namespace {

// A small GPT: 4 layers, h=256, 8 heads, ffn 4h, vocab 1024, seq 128 on one DGX A100.
std::string small_gpt(const std::string& layout, const std::string& training_extra = "") {
  return "title: small\n"
         "model: {name: tiny, layers: 4, hidden: 256, heads: 8, kv_heads: 8, ffn_hidden: 1024, activation: gelu,\n"
         "        vocab: 1024, tied_embeddings: false, norm: layernorm, position: learned}\n"
         "cluster: {node: dgx-a100, nodes: 1}\n"
         "layout: " + layout + "\n"
         "training: {seq_len: 128, global_batch: 8, micro_batch: 2, dtype: bf16, flash_attention: true,\n"
         "           overlap_grad_reduce: true, framework: megatron" + training_extra + "}\n";
}

Experiment exp_of(const std::string& layout, const std::string& extra = "") {
  return parse_experiment(small_gpt(layout, extra), "small.yaml");
}

int count(const StagePlan& st, OpType type, const std::string& name) {
  return static_cast<int>(std::count_if(st.ops.begin(), st.ops.end(),
                                        [&](const Op& op) { return op.type == type && name == op.name; }));
}

double sum_size(const StagePlan& st, OpType type, const std::string& name) {
  double s = 0;
  for (const auto& op : st.ops)
    if (op.type == type && name == op.name) s += op.size_bytes;
  return s;
}

constexpr double kActBytes = 2.0 * 2 * 128 * 256;  // bf16 x b=2 x s=128 x h=256

TEST(Plan, TensorParallelAllReducesTwicePerLayerEachWay) {
  // TP2 DP2 PP2 on 8 GPUs, no SP: Megatron's f/g operators give 2 AllReduces in the
  // forward and 2 in the backward of every layer, each the full activation.
  const auto plan = build_step_plan(exp_of("{dp: 2, tp: 2, pp: 2, zero_stage: 0, sequence_parallel: false, recompute: none}"));
  ASSERT_EQ(plan.stages.size(), 2u);
  EXPECT_EQ(plan.shape.micro_batches, 2);  // 8 / (2 x 2)
  const auto& s0 = plan.stages[0];
  EXPECT_EQ(s0.layers, 2);
  // Layers: 2 layers x 2 micro-batches x 2 blocking in the forward; the 2 backward ones
  // run asynchronously under the weight-gradient GEMM (Megatron's async input-grad
  // AllReduce); embedding: 1 forward AllReduce per micro-batch.
  EXPECT_EQ(count(s0, OpType::collective, "tp_allreduce"), 2 * 2 * 2 + 2);
  EXPECT_EQ(count(s0, OpType::issue, "tp_allreduce"), 2 * 2 * 2);
  for (const auto& op : s0.ops) {
    if ((op.type != OpType::collective && op.type != OpType::issue) || std::string(op.name) != "tp_allreduce") continue;
    EXPECT_EQ(op.group, GroupKind::TP);
    EXPECT_EQ(op.collective, Collective::AllReduce);
    EXPECT_DOUBLE_EQ(op.size_bytes, kActBytes);
  }
  // No ReduceScatter/AllGather on TP without SP (except the PP scatter/gather's gather).
  EXPECT_EQ(count(s0, OpType::collective, "tp_reducescatter"), 0);
  // Last stage: vocab-parallel cross entropy adds 3 small AllReduces per micro-batch, the
  // first a MAX (the logits' maximum), then two SUMs.
  EXPECT_EQ(count(plan.stages[1], OpType::collective, "tp_allreduce_loss_max"), 2);
  EXPECT_EQ(count(plan.stages[1], OpType::collective, "tp_allreduce_loss"), 2 * 2);
  for (const auto& op : plan.stages[1].ops)
    if (std::string(op.name) == "tp_allreduce_loss_max") {
      EXPECT_EQ(op.reduce, ReduceOp::max);
    }
}

TEST(Plan, SequenceParallelReplacesAllReduceByReduceScatterAndAllGather) {
  const auto plan = build_step_plan(exp_of("{dp: 2, tp: 2, pp: 2, zero_stage: 0, sequence_parallel: true, recompute: none}"));
  const auto& s0 = plan.stages[0];
  EXPECT_EQ(count(s0, OpType::collective, "tp_allreduce"), 0);
  // Per layer per micro-batch: fwd 2 AG + 2 RS; bwd 2 AG + 2 RS (+2 async re-gathers).
  EXPECT_EQ(count(s0, OpType::collective, "tp_reducescatter"), 2 * 2 * 2 + 2 /*embedding*/);
  // Backward ReduceScatters of the input gradients overlap the weight-gradient GEMMs.
  EXPECT_EQ(count(s0, OpType::issue, "tp_reducescatter"), 2 * 2 * 2);
  EXPECT_EQ(count(s0, OpType::collective, "tp_allgather"), 2 * 2 * 2 + 2 * 2 * 2 + 2 /*embedding bwd*/);
  EXPECT_EQ(count(s0, OpType::issue, "tp_allgather_input"), 2 * 2 * 2);
  for (const auto& op : s0.ops) {
    if (std::string(op.name) == "tp_sp_grad_allreduce") continue;
    if (op.kind == CommKind::TP && (op.type == OpType::collective || op.type == OpType::issue)) {
      EXPECT_DOUBLE_EQ(op.size_bytes, kActBytes) << op.name;
    }
  }
  // With SP, norm weights/biases and row-parallel biases see only a sequence shard: their
  // TP partial gradients are SUMmed once per step (Megatron _allreduce_layernorm_grads):
  // 2 layers x (2 layernorms x 2h + 2 row-parallel biases x h) fp32 gradients.
  ASSERT_EQ(count(s0, OpType::collective, "tp_sp_grad_allreduce"), 1);
  for (const auto& op : s0.ops)
    if (std::string(op.name) == "tp_sp_grad_allreduce") {
      EXPECT_EQ(op.reduce, ReduceOp::sum);
      EXPECT_EQ(op.phase, Phase::optimizer);
      EXPECT_DOUBLE_EQ(op.size_bytes, 2.0 * (2 * 2 * 256 + 2 * 256) * 4.0);
    }
}

TEST(Plan, PipelineSendsEveryMicroBatchBothWays) {
  const auto plan = build_step_plan(exp_of("{dp: 2, tp: 2, pp: 2, zero_stage: 0, sequence_parallel: true, recompute: none}"));
  const auto& s0 = plan.stages[0];
  const auto& s1 = plan.stages[1];
  EXPECT_EQ(count(s0, OpType::send, "send_activation"), 2);
  EXPECT_EQ(count(s0, OpType::recv, "recv_grad"), 2);
  EXPECT_EQ(count(s0, OpType::recv, "recv_activation"), 0);
  EXPECT_EQ(count(s1, OpType::recv, "recv_activation"), 2);
  EXPECT_EQ(count(s1, OpType::send, "send_grad"), 2);
  // Each TP rank sends its 1/t share (Narayanan 2021 Sec 4.1 scatter/gather).
  EXPECT_DOUBLE_EQ(sum_size(s0, OpType::send, "send_activation"), 2 * kActBytes / 2);
  // 1F1B on the first of 2 stages: one warm-up forward, then F B, then B.
  std::string order;
  for (const auto& op : s0.ops)
    if (op.type == OpType::send || (op.type == OpType::recv)) order += op.type == OpType::send ? "S" : "R";
  EXPECT_EQ(order, "SSRR");
  std::string order1;
  for (const auto& op : s1.ops)
    if (op.type == OpType::send || (op.type == OpType::recv)) order1 += op.type == OpType::send ? "S" : "R";
  EXPECT_EQ(order1, "RSRS");
}

TEST(Plan, DataParallelGradientsReducedOnceOverDpTimesCp) {
  const auto plan = build_step_plan(exp_of("{dp: 2, tp: 2, pp: 2, zero_stage: 0, sequence_parallel: true, recompute: none}"));
  for (const auto& st : plan.stages) {
    double issued = 0;
    for (const auto& op : st.ops) {
      if (op.type != OpType::issue || op.kind != CommKind::DP) continue;
      EXPECT_EQ(op.group, GroupKind::DPxCP);
      EXPECT_EQ(op.collective, Collective::AllReduce);
      EXPECT_EQ(op.micro_batch, 1) << "DDP syncs on the last micro-batch only";
      issued += op.size_bytes;
    }
    // Every parameter's fp32 main gradient exactly once (Megatron: 4 bytes).
    EXPECT_DOUBLE_EQ(issued, st.params_per_rank * 4.0) << "stage " << st.stage;
    EXPECT_EQ(count(st, OpType::compute, "optimizer_adam"), 1);
  }
}

TEST(Plan, ZeroStagesChangeTheDataParallelCollectives) {
  const auto z1 = build_step_plan(exp_of("{dp: 2, tp: 2, pp: 2, zero_stage: 1, sequence_parallel: true, recompute: none}"));
  const auto& s = z1.stages[0];
  EXPECT_EQ(count(s, OpType::issue, "dp_grad_allreduce"), 0);
  EXPECT_DOUBLE_EQ(sum_size(s, OpType::issue, "dp_grad_reducescatter"), s.params_per_rank * 4.0);
  // Parameters (bf16) all-gathered after the sharded optimizer step.
  EXPECT_DOUBLE_EQ(sum_size(s, OpType::collective, "dp_param_allgather"), s.params_per_rank * 2.0);
  EXPECT_DOUBLE_EQ(s.optimizer_params, s.params_per_rank / 2.0);

  const auto z3 = build_step_plan(exp_of("{dp: 2, tp: 2, pp: 2, zero_stage: 3, sequence_parallel: true, recompute: none}"));
  const auto& s3 = z3.stages[0];
  // ZeRO-3: each layer gathered before forward and again before backward, every micro-batch.
  EXPECT_EQ(count(s3, OpType::issue, "dp_param_allgather"), 2 /*layers*/ * 2 /*mb*/ * 2 /*fwd+bwd*/);
  EXPECT_EQ(count(s3, OpType::issue, "dp_grad_reducescatter"), 2 * 2 + 2 /*embedding per mb*/);
  // The stage's non-layer parameters (embedding here) gathered once, after the optimizer.
  EXPECT_EQ(count(s3, OpType::collective, "dp_param_allgather"), 1);
  const double layer = layer_parameters_per_tp_rank(z3.exp.model, 2);
  EXPECT_DOUBLE_EQ(sum_size(s3, OpType::collective, "dp_param_allgather"), (s3.params_per_rank - 2 * layer) * 2.0);
  EXPECT_GT(s3.params_per_rank - 2 * layer, 0.0);
}

TEST(Plan, ContextParallelExchangesKeysAndValues) {
  const auto plan = build_step_plan(exp_of("{dp: 1, tp: 2, cp: 2, pp: 2, zero_stage: 0, sequence_parallel: true, recompute: none}"));
  const auto& s0 = plan.stages[0];
  EXPECT_EQ(plan.shape.tokens_local, 64);
  // Forward: 1 K/V AllGather per layer and micro-batch; backward: K/V again + dK/dV ReduceScatter.
  const int mb = static_cast<int>(plan.shape.micro_batches);
  EXPECT_EQ(count(s0, OpType::issue, "cp_kv_allgather"), 2 * mb * 2);
  EXPECT_EQ(count(s0, OpType::issue, "cp_dkv_reducescatter"), 2 * mb);
  // K and V of 64 local tokens, 8 heads x 32 dims / TP 2, bf16, gathered from 2 CP ranks.
  const double kv = 2.0 * 2 /*K,V*/ * 2 /*b*/ * 64 * (8 * 32) / 2.0;
  EXPECT_DOUBLE_EQ(sum_size(s0, OpType::issue, "cp_dkv_reducescatter") / (2 * mb), kv * 2);
}

TEST(Plan, ExecutedFlopsEqualTheHardwareFlopsConvention) {
  for (const char* rc : {"none", "selective", "full"}) {
    const auto e = exp_of(std::string("{dp: 2, tp: 2, pp: 2, zero_stage: 0, sequence_parallel: true, recompute: ") + rc + "}");
    const auto plan = build_step_plan(e);
    const double expect = hardware_flops_per_step(e.model, e.training.global_batch, e.training.seq_len, e.layout.recompute);
    EXPECT_NEAR(plan_executed_flops(plan) / expect, 1.0, 1e-12) << rc;
  }
}

TEST(Plan, RingCostsFollowNcclTestsConvention) {
  EXPECT_DOUBLE_EQ(ring_cost(Collective::AllReduce, 8, 800).edge_bytes, 1400);
  EXPECT_EQ(ring_cost(Collective::AllReduce, 8, 800).steps, 14);
  EXPECT_DOUBLE_EQ(ring_cost(Collective::ReduceScatter, 4, 400).edge_bytes, 300);
  EXPECT_EQ(ring_cost(Collective::AllGather, 4, 400).steps, 3);
  EXPECT_DOUBLE_EQ(ring_cost(Collective::AllReduce, 1, 400).edge_bytes, 0);
}

TEST(Plan, ComputeOpsAreTimedByTheRoofline) {
  auto e = exp_of("{dp: 4, tp: 2, pp: 1, zero_stage: 0, sequence_parallel: false, recompute: none}");
  e.cluster.gpu.kernel_tables.clear();  // the roofline alone (cluster.gpu.kernel_tables: none)
  const auto plan = build_step_plan(e);
  const auto& gpu = e.cluster.gpu;
  int partial_waves = 0;
  for (const auto& op : plan.stages[0].ops) {
    if (op.type != OpType::compute || op.kernel != KernelKind::gemm) continue;
    // The GEMM's own wave fill (models/compute_cost.hpp) lowers the full-wave rate.
    const auto k = calib::kernel_for_op(op, e);
    ASSERT_TRUE(k.has_value()) << op.name;
    const double fill = gemm_wave_fill(k->spec.gemm, gpu.sm_count);
    ASSERT_GT(fill, 0.0);
    ASSERT_LE(fill, 1.0);
    if (fill < 0.999) ++partial_waves;
    const double flop_t = op.flops / (gpu.peak_bf16_flops * gpu.gemm_efficiency * fill);
    const double mem_t = op.bytes / (gpu.hbm_bandwidth * gpu.memory_efficiency);
    EXPECT_NEAR(op.time_s, std::max(flop_t, mem_t) + gpu.kernel_overhead, 1e-12 * op.time_s) << op.name;
  }
  EXPECT_GT(partial_waves, 0);  // the test model has shapes that leave SMs idle
}

TEST(Plan, GemmWaveFillFollowsTheMatrixMultiplicationGuide) {
  // 8192 x 3072 x 6144 on 108 SMs: 32 x 24 = 768 tiles of 256 x 128 = 7.1 waves run as 8.
  EXPECT_NEAR(gemm_wave_fill({8192, 3072, 6144}, 108), 768.0 / (8 * 108), 1e-12);
  // A shape that fills its waves exactly: 108 tiles of 256 x 128.
  EXPECT_DOUBLE_EQ(gemm_wave_fill({256 * 12, 128 * 9, 4096}, 108), 1.0);
  // Partial tiles: N = 160 (head_dim 160) needs two 128-wide tiles or one 256-wide tile.
  EXPECT_NEAR(gemm_wave_fill({256 * 108, 160, 2048}, 108), 160.0 / 256.0, 1e-12);
  // Unknown SM count or an empty dimension: no quantisation.
  EXPECT_DOUBLE_EQ(gemm_wave_fill({1000, 1000, 1000}, 0), 1.0);
  EXPECT_DOUBLE_EQ(gemm_wave_fill({0, 1000, 1000}, 108), 1.0);
  // Presets store the full-wave rate: the maximum of a sweep of shapes (which includes
  // full-wave ones), sustained (MSMF) where published, else burst (MAMF): A100 MAMF
  // 271.2 / 312; H100 and H200 the H200's MSMF 755 / 989; B200 MSMF 1429 / 2250. The
  // sustained rate is below the burst one (H100 MAMF 794.5 / 989).
  EXPECT_NEAR(gpu_preset("A100-SXM4-80GB").gemm_efficiency, 271.2 / 312, 1e-12);
  EXPECT_NEAR(gpu_preset("H100-SXM5-80GB").gemm_efficiency, 755.0 / 989, 1e-12);
  EXPECT_NEAR(gpu_preset("H200-SXM-141GB").gemm_efficiency, 755.0 / 989, 1e-12);
  EXPECT_NEAR(gpu_preset("B200").gemm_efficiency, 1429.0 / 2250, 1e-12);
  EXPECT_LT(gpu_preset("H100-SXM5-80GB").gemm_efficiency, 794.5 / 989);
}

TEST(Plan, InvalidExperimentIsRejectedBeforePlanning) {
  auto e = exp_of("{dp: 2, tp: 2, pp: 2, zero_stage: 0, sequence_parallel: false, recompute: none}");
  e.layout.tp = 3;
  EXPECT_THROW(build_step_plan(e), InputError);
}

}  // namespace
}  // namespace dtsim

namespace dtsim {
namespace {

std::string pipeline_order(const StagePlan& st) {
  // "F<chunk>.<mb>" at each micro-batch's first op of a forward, "B<chunk>.<mb>" at a
  // backward's, read from the P2P and first-layer ops of the plan.
  std::string out;
  int last_mb = -2, last_chunk = -2;
  Phase last_phase = Phase::optimizer;
  for (const auto& op : st.ops) {
    if (op.micro_batch < 0 || op.phase == Phase::optimizer) continue;
    const Phase ph = op.phase == Phase::recompute ? Phase::backward : op.phase;
    if (op.micro_batch == last_mb && op.chunk == last_chunk && ph == last_phase) continue;
    if (op.type != OpType::recv && op.type != OpType::compute && op.type != OpType::collective) continue;
    last_mb = op.micro_batch;
    last_chunk = op.chunk;
    last_phase = ph;
    out += (ph == Phase::forward ? "F" : "B") + std::to_string(op.chunk) + "." + std::to_string(op.micro_batch) + " ";
  }
  return out;
}

TEST(PlanSchedule, InterleavedFollowsMegatronWarmupAndChunkOrder) {
  // p = 2, v = 2, m = 4 on 8 layers: rank 0 warms up (p - r - 1) * 2 + (v - 1) * p = 4
  // virtual micro-batches (Megatron-LM schedules.py).
  const auto e = parse_experiment(
      "model: {name: t, layers: 8, hidden: 256, heads: 8, kv_heads: 8, ffn_hidden: 1024, activation: gelu,\n"
      "        vocab: 1024, tied_embeddings: false, norm: layernorm, position: learned}\n"
      "cluster: {node: dgx-a100, nodes: 1, gpus_per_node: 2, nics_per_node: 2}\n"
      "layout: {dp: 1, tp: 1, pp: 2, vp: 2, zero_stage: 0, sequence_parallel: false, recompute: none}\n"
      "training: {seq_len: 128, global_batch: 4, micro_batch: 1, dtype: bf16}\n",
      "il.yaml");
  const auto plan = build_step_plan(e);
  EXPECT_EQ(pipeline_order(plan.stages[0]),
            "F0.0 F0.1 F1.0 F1.1 F0.2 B1.0 F0.3 B1.1 F1.2 B0.0 F1.3 B0.1 B1.2 B1.3 B0.2 B0.3 ");
  // Rank 1 warms up (v - 1) * p = 2.
  EXPECT_EQ(pipeline_order(plan.stages[1]),
            "F0.0 F0.1 F1.0 B1.0 F1.1 B1.1 F0.2 B0.0 F0.3 B0.1 F1.2 B1.2 F1.3 B1.3 B0.2 B0.3 ");
  // Chunk c of rank r is virtual stage c*p + r: rank 0 holds layers 0-1 and 4-5.
  for (const auto& op : plan.stages[0].ops)
    if (op.layer >= 0) {
      EXPECT_TRUE((op.chunk == 0 && op.layer < 2) || (op.chunk == 1 && op.layer >= 4 && op.layer < 6)) << op.layer;
    }
  // Crossing chunks wraps around the ring: rank 1 chunk 0 sends its activations to rank 0.
  for (const auto& op : plan.stages[1].ops)
    if (op.type == OpType::send && op.dir == Direction::forward) {
      EXPECT_EQ(op.chunk, 0);
      EXPECT_EQ(op.peer_stage, 0);
    }
}

TEST(PlanSchedule, GpipeRunsAllForwardsFirst) {
  const auto e = parse_experiment(
      "model: {name: t, layers: 4, hidden: 256, heads: 8, kv_heads: 8, ffn_hidden: 1024, activation: gelu,\n"
      "        vocab: 1024, tied_embeddings: false, norm: layernorm, position: learned}\n"
      "cluster: {node: dgx-a100, nodes: 1, gpus_per_node: 2, nics_per_node: 2}\n"
      "layout: {dp: 1, tp: 1, pp: 2, schedule: gpipe, zero_stage: 0, sequence_parallel: false, recompute: none}\n"
      "training: {seq_len: 128, global_batch: 3, micro_batch: 1, dtype: bf16}\n",
      "gp.yaml");
  EXPECT_EQ(pipeline_order(build_step_plan(e).stages[1]), "F0.0 F0.1 F0.2 B0.0 B0.1 B0.2 ");
}

TEST(PlanSchedule, InterleavedNeedsMicroBatchesMultipleOfPp) {
  EXPECT_THROW(parse_experiment(
                   "model: {name: t, layers: 8, hidden: 256, heads: 8, kv_heads: 8, ffn_hidden: 1024, activation: gelu,\n"
                   "        vocab: 1024, tied_embeddings: false, norm: layernorm, position: learned}\n"
                   "cluster: {node: dgx-a100, nodes: 1, gpus_per_node: 2, nics_per_node: 2}\n"
                   "layout: {dp: 1, tp: 1, pp: 2, vp: 2, zero_stage: 0}\n"
                   "training: {seq_len: 128, global_batch: 3, micro_batch: 1, dtype: bf16}\n",
                   "il.yaml"),
               InputError);
}

}  // namespace
}  // namespace dtsim
