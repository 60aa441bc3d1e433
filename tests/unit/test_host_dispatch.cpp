// Host dispatch and CUDA graphs (models/host_dispatch.hpp): the plan carries each op's host
// seconds (eager launches x cluster.host_dispatch, one launch per graph replay), the engines
// run a host clock that never waits for the GPU, host-bound time is its own accounting line,
// CUDA graphs remove it at the cost of their static buffers, and MoE layers that route
// dropless put a host synchronisation in every forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "models/experiment_io.hpp"
#include "models/host_dispatch.hpp"
#include "models/memory.hpp"
#include "models/plan.hpp"
#include "reports/explain.hpp"
#include "reports/json.hpp"
#include "reports/json_read.hpp"
#include "reports/summary.hpp"
#include "sim/analytic_engine.hpp"
#include "sim/engine.hpp"
#include "tests/unit/input_problem.hpp"

namespace dtsim {
namespace {

const std::string kRoot = DTSIM_SOURCE_DIR;

// A 1B-class Llama (hidden 2048, 16 layers) with short sequences: its kernels are a few
// microseconds to tens of microseconds, the same order as an eager launch.
std::string dense(const std::string& cluster_extra, const std::string& training_extra, int64_t seq = 1024) {
  return "model: {name: small, layers: 4, hidden: 2048, heads: 32, kv_heads: 8, ffn_hidden: 8192, vocab: 32000,\n"
         "        activation: swiglu, norm: rmsnorm, position: rope, tied_embeddings: true}\n"
         "cluster: {node: dgx-h100, nodes: 1" + cluster_extra + "}\n"
         "layout: {dp: 8, tp: 1, pp: 1, zero_stage: 1}\n"
         "training: {seq_len: " + std::to_string(seq) + ", global_batch: 32, micro_batch: 1" + training_extra + "}\n";
}

std::string moe(const std::string& moe_extra, const std::string& training_extra) {
  return "model: {name: moe, layers: 4, hidden: 2048, heads: 16, kv_heads: 4, ffn_hidden: 8192, vocab: 32000,\n"
         "        activation: swiglu, norm: rmsnorm, position: rope, tied_embeddings: false,\n"
         "        moe: {num_experts: 8, router_topk: 2, moe_ffn_hidden: 2048" + moe_extra + "}}\n"
         "cluster: {node: dgx-h100, nodes: 1}\n"
         "layout: {dp: 8, tp: 1, ep: 8, etp: 1, zero_stage: 1}\n"
         "training: {seq_len: 2048, global_batch: 16, micro_batch: 1" + training_extra + "}\n";
}

TEST(HostDispatch, EagerOpsCostTheirLaunches) {
  const Experiment e = parse_experiment(dense("", ""), "a.yaml");
  EXPECT_DOUBLE_EQ(e.cluster.host_dispatch, 13.48e-6);  // the dgx-h100 preset (TE#2053)
  const StepPlan plan = build_step_plan(e);
  double host = 0;
  int64_t launches = 0;
  for (const Op& op : plan.stages.front().ops) {
    EXPECT_EQ(op.graph, -1) << op.name;
    EXPECT_DOUBLE_EQ(op.host_s, e.cluster.host_dispatch * eager_launches(op)) << op.name;
    host += op.host_s;
    launches += eager_launches(op);
    if (op.type == OpType::wait) EXPECT_EQ(op.host_s, 0.0);
  }
  EXPECT_GT(launches, 0);
  EXPECT_NEAR(stage_host_seconds(plan.stages.front()), host, 1e-15);
  EXPECT_EQ(stage_graph_replays(plan.stages.front()), 0);
  // A cluster written without a node preset takes the x86 figure; the key overrides both.
  const Experiment own = parse_experiment(dense(", host_dispatch: 20 us", ""), "a.yaml");
  EXPECT_DOUBLE_EQ(own.cluster.host_dispatch, 20e-6);
  EXPECT_DOUBLE_EQ(parse_experiment(dense("", ""), "a.yaml", {"cluster.node=gb200-nvl72", "layout.dp=72", "training.global_batch=72"})
                       .cluster.host_dispatch,
                   37.08e-6);
}

TEST(HostDispatch, LayerGraphsReplayEachLayerPassWithOneLaunch) {
  const Experiment e = parse_experiment(dense("", ", cuda_graphs: true"), "a.yaml",
                                        {"layout.recompute=full"});
  ASSERT_EQ(e.training.cuda_graphs, CudaGraphs::layers);
  const StepPlan plan = build_step_plan(e);
  const StagePlan& st = plan.stages.front();
  const int64_t mbs = e.training.accumulation(e.layout);
  // Per micro-batch and layer: the forward, the recomputed forward and the backward.
  EXPECT_EQ(stage_graph_replays(st), 3 * mbs * e.model.layers);
  int64_t captured_with_cost = 0;
  for (const Op& op : st.ops) {
    if (op.layer >= 0 && op.phase != Phase::optimizer && op.type == OpType::compute) EXPECT_GE(op.graph, 0) << op.name;
    if (op.layer < 0 && op.type == OpType::compute) EXPECT_EQ(op.graph, -1) << op.name;  // embedding, head, Adam
    if (op.graph >= 0 && op.host_s > 0) ++captured_with_cost;
  }
  EXPECT_EQ(captured_with_cost, stage_graph_replays(st));
  // Less host time than eager, more than one launch per replay alone.
  const StepPlan eager = build_step_plan(parse_experiment(dense("", ""), "a.yaml", {"layout.recompute=full"}));
  EXPECT_LT(stage_host_seconds(st), 0.5 * stage_host_seconds(eager.stages.front()));
  EXPECT_GE(stage_host_seconds(st), e.cluster.host_dispatch * static_cast<double>(stage_graph_replays(st)));
}

TEST(HostDispatch, FullIterationGraphLeavesTheOptimizerEager) {
  const Experiment e = parse_experiment(dense("", ", cuda_graphs: full_iteration"), "a.yaml");
  const StepPlan plan = build_step_plan(e);
  const StagePlan& st = plan.stages.front();
  EXPECT_EQ(stage_graph_replays(st), 1);
  for (const Op& op : st.ops)
    if (op.phase == Phase::optimizer) EXPECT_EQ(op.graph, -1) << op.name;
}

TEST(HostDispatch, ShortKernelsWaitForTheHostAndGraphsRemoveIt) {
  // A launch far slower than any kernel: every op waits for its own dispatch, so the step is
  // the host's whole dispatch time plus the last op's kernels (a single GPU: no communication).
  const std::string one = ", gpus_per_node: 1, nics_per_node: 1";
  const Experiment slow = parse_experiment(dense(one + ", host_dispatch: 5 ms", ""), "a.yaml", {"layout.dp=1"});
  const StepPlan plan = build_step_plan(slow);
  const Op& last = plan.stages.front().ops.back();
  ASSERT_EQ(last.type, OpType::compute);
  double longest = 0;
  for (const Op& op : plan.stages.front().ops) longest = std::max(longest, op.time_s);
  ASSERT_LT(longest, 5e-3);
  const double host = stage_host_seconds(plan.stages.front());
  const StepResult des = simulate_step_isolated(slow);
  EXPECT_NEAR(des.step_time_s, host + last.time_s, 1e-9 * des.step_time_s);
  EXPECT_NEAR(des.compute_s + des.host_bound_s, des.step_time_s, 1e-9 * des.step_time_s);

  // The shipped host-bound example (Llama-3.2-1B on a GB200 rack, Grace CPUs): host-bound
  // time in both engines, removed by layer graphs (the step gets faster by about as much).
  const Experiment ex = load_experiment(kRoot + "/experiments/examples/llama3.2-1b-host-bound.yaml");
  Experiment graphs = ex;
  graphs.training.cuda_graphs = CudaGraphs::layers;
  const StepResult d0 = simulate_step_isolated(ex), d1 = simulate_step_isolated(graphs);
  const StepResult a0 = simulate_step_analytic(ex), a1 = simulate_step_analytic(graphs);
  EXPECT_GT(d0.host_bound_s, 0.02 * d0.step_time_s);
  EXPECT_GT(a0.host_bound_s, 0.02 * a0.step_time_s);
  EXPECT_LT(d1.host_bound_s, 0.1 * d0.host_bound_s);
  EXPECT_LT(a1.host_bound_s, 0.1 * a0.host_bound_s);
  EXPECT_LT(d1.step_time_s, d0.step_time_s - 0.8 * (d0.host_bound_s - d1.host_bound_s));
  // The closed form (steady state plus the first micro-batch from no lead) against the DES's
  // exact clock (measured: step 141.779 ms, host-bound 9.022 ms on the GB200 preset; 141.866 / 8.132 ms
  // on the HGX B200 preset gb200-nvl72 used before topologies/gpus/gb200.yaml).
  EXPECT_NEAR(a0.step_time_s, d0.step_time_s, 1e-3 * d0.step_time_s);
  EXPECT_NEAR(a0.host_bound_s, d0.host_bound_s, 1e-2 * d0.host_bound_s);
  EXPECT_NEAR(a1.step_time_s, d1.step_time_s, 1e-3 * d1.step_time_s);
  // Reported in the summary and the JSON (read back).
  EXPECT_NE(format_summary(ex, d0).find("host-bound"), std::string::npos);
  const StepResult back = result_from_json_text(result_json_text(d0));
  EXPECT_DOUBLE_EQ(back.host_bound_s, d0.host_bound_s);
  EXPECT_DOUBLE_EQ(back.stages.front().host_bound_s, d0.stages.front().host_bound_s);
}

TEST(HostDispatch, FreeLaunchesChangeNothingButTheHostLine) {
  // host_dispatch 0: no op waits, in either engine.
  const Experiment e = parse_experiment(dense(", host_dispatch: 0 s", ""), "a.yaml");
  const StepPlan plan = build_step_plan(e);
  for (const Op& op : plan.stages.front().ops) EXPECT_EQ(op.host_s, 0.0);
  EXPECT_EQ(simulate_step_isolated(e).host_bound_s, 0.0);
  EXPECT_EQ(simulate_step_analytic(e).host_bound_s, 0.0);
}

TEST(HostDispatch, CudaGraphStaticBuffersAreMemory) {
  const Experiment eager = parse_experiment(dense("", ""), "a.yaml");
  const Experiment layers = parse_experiment(dense("", ", cuda_graphs: layers"), "a.yaml");
  const Experiment full = parse_experiment(dense("", ", cuda_graphs: full_iteration"), "a.yaml");
  EXPECT_EQ(stage_buffers(eager, 0).cuda_graph_bytes, 0.0);
  // One sample set per held (layer, micro-batch): hidden 2 s b h + the bool mask b s^2.
  const double s = 1024, h = 2048;
  const double held = static_cast<double>(stage_activations(layers, 0).held_layers);
  EXPECT_DOUBLE_EQ(stage_buffers(layers, 0).cuda_graph_bytes, held * (2 * s * h + s * s));
  EXPECT_DOUBLE_EQ(stage_memory(layers, 0).peak_bytes - stage_memory(eager, 0).peak_bytes,
                   stage_buffers(layers, 0).cuda_graph_bytes);
  // Every micro-batch's input batch: 28 bytes per token.
  EXPECT_DOUBLE_EQ(stage_buffers(full, 0).cuda_graph_bytes, 28.0 * s * 4);
  EXPECT_NE(format_explain(layers, build_step_plan(layers)).find("CUDA graph buffers"), std::string::npos);
  EXPECT_NE(format_explain(layers, build_step_plan(layers)).find("7. Host dispatch"), std::string::npos);
}

TEST(HostDispatch, DroplessMoeSynchronisesTheHostEveryForward) {
  auto syncs = [](const Experiment& e) {
    int64_t n = 0, dynamic = 0;
    const StepPlan plan = build_step_plan(e);
    for (const Op& op : plan.stages.front().ops) {
      n += op.host_sync ? 1 : 0;
      dynamic += op.dynamic_shape ? 1 : 0;
      if (op.host_sync) {
        EXPECT_EQ(op.phase, Phase::forward);
        EXPECT_STREQ(op.name, "moe_dispatch");  // before_ep_alltoall
      }
    }
    return std::pair<int64_t, int64_t>{n, dynamic};
  };
  const Experiment dropless = parse_experiment(moe("", ""), "m.yaml");
  const int64_t mbs = dropless.training.accumulation(dropless.layout);
  EXPECT_EQ(syncs(dropless).first, dropless.model.layers * mbs);
  EXPECT_GT(syncs(dropless).second, 0);
  // Drop-and-pad: static shapes, no sync, capturable.
  const Experiment padded = parse_experiment(moe(", capacity_factor: 1.0, pad_to_capacity: true", ""), "m.yaml");
  EXPECT_EQ(syncs(padded).first, 0);
  EXPECT_EQ(syncs(padded).second, 0);
  // The sync takes the host's lead away: more host-bound time than the padded run with the
  // same launches (a capacity factor of 1 with forced balance computes the same tokens).
  const StepResult d = simulate_step_isolated(parse_experiment(moe(", load_balancing: forced", ""), "m.yaml"));
  const StepResult p = simulate_step_isolated(
      parse_experiment(moe(", load_balancing: forced, capacity_factor: 1.0, pad_to_capacity: true", ""), "m.yaml"));
  EXPECT_GT(d.host_bound_s, p.host_bound_s);
  // Layer graphs in a dropless MoE: the routed part stays eager and splits each layer's
  // graph in two pieces per forward and backward.
  const Experiment graphs = parse_experiment(moe("", ", cuda_graphs: layers"), "m.yaml");
  const StagePlan st = build_step_plan(graphs).stages.front();
  EXPECT_EQ(stage_graph_replays(st), 4 * graphs.model.layers * mbs);
  for (const Op& op : st.ops)
    if (op.dynamic_shape) EXPECT_DOUBLE_EQ(op.host_s, graphs.cluster.host_dispatch * eager_launches(op)) << op.name;
}

TEST(HostDispatch, BadInputsAreErrorsNamingTheKey) {
  using test_files::input_problem;
  EXPECT_NE(input_problem(dense(", host_dispatch: -1 us", "")).find("cluster.host_dispatch"), std::string::npos);
  EXPECT_NE(input_problem(dense(", host_dispatch: 3", "")).find("cluster.host_dispatch"), std::string::npos);
  const std::string bad = input_problem(dense("", ", cuda_graphs: sometimes"));
  EXPECT_NE(bad.find("training.cuda_graphs"), std::string::npos) << bad;
  EXPECT_NE(bad.find("full_iteration"), std::string::npos) << bad;
  const std::string dyn = input_problem(moe("", ", cuda_graphs: full_iteration"));
  EXPECT_NE(dyn.find("training.cuda_graphs=full_iteration needs static shapes"), std::string::npos) << dyn;
  EXPECT_EQ(input_problem(moe(", capacity_factor: 1.0, pad_to_capacity: true", ", cuda_graphs: full_iteration")),
            "no error");
}

}  // namespace
}  // namespace dtsim
