// ZeRO-3 as each framework runs it (models/zero3.hpp): DeepSpeed's module-by-module gathers,
// kept layers, bucketed gradients and end-of-backward synchronisation; PyTorch FSDP2's copy
// kernels and chained reduce-scatters; the plan, both engines and memory reading one policy.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/flops.hpp"
#include "models/memory.hpp"
#include "models/plan.hpp"
#include "models/zero3.hpp"
#include "sim/analytic_engine.hpp"
#include "sim/engine.hpp"
#include "tests/unit/shipped_files.hpp"

namespace dtsim {
namespace {

const std::string kDeepSpeed = (test_files::kExperiments / "examples" / "llama2-13b-deepspeed-zero3-a100.yaml").string();
const std::string kFsdp = (test_files::kExperiments / "examples" / "llama3-8b-fsdp2-h100.yaml").string();

int count(const StagePlan& st, const std::string& name, Phase ph, int mb) {
  return static_cast<int>(std::count_if(st.ops.begin(), st.ops.end(), [&](const Op& op) {
    return name == op.name && op.phase == ph && op.micro_batch == mb && op.type != OpType::wait;
  }));
}

TEST(Zero3Frameworks, DeepSpeedGathersModuleByModuleAndKeepsItsLastLayers) {
  const Experiment e = load_experiment(kDeepSpeed);
  const Zero3Policy z = zero3_policy(e);
  EXPECT_TRUE(z.per_module && z.backward_end_sync);
  EXPECT_FALSE(z.copy_kernels);
  // A dense layer: linear_qkv, linear_proj, linear_fc1, linear_fc2.
  EXPECT_EQ(zero3_gather_parts(e, 0).dense, 4);
  // Llama-2-13B on TP 1: 2 x 5120 x 13824 x 3 / 2 + 4 x 5120^2 = 317 M elements a layer, head
  // 32000 x 5120 = 164 M: layer 39 (164 M <= 1e9), 38 (798 M) kept, 37 (1.43 G) not.
  const int64_t kept = zero3_kept_layers(e, 0);
  EXPECT_EQ(kept, 2);
  const StepPlan plan = build_step_plan(e);
  const StagePlan& st = plan.stages.at(0);
  EXPECT_EQ(count(st, "dp_param_allgather", Phase::forward, 1), 40);
  EXPECT_EQ(count(st, "dp_param_allgather", Phase::backward, 1), 40 - kept);
  for (const Op& op : st.ops)
    if (std::string(op.name) == "dp_param_allgather" && op.layer >= 0) EXPECT_EQ(op.gather_parts, 4);
  // Gradients reduce-scattered per layer (models/zero3.hpp), and each backward ends waiting
  // for them with the host.
  EXPECT_EQ(count(st, "dp_grad_reducescatter", Phase::backward, 1), 42);  // layers, head, embedding
  const auto sync = std::find_if(st.ops.begin(), st.ops.end(), [](const Op& op) {
    return op.type == OpType::wait && op.host_sync && op.micro_batch == 0;
  });
  EXPECT_NE(sync, st.ops.end());
  // Memory holds the kept layers gathered besides the two in flight.
  const Experiment more = load_experiment(kDeepSpeed, {"training.stage3_max_reuse_distance=0"});
  EXPECT_EQ(zero3_kept_layers(more, 0), 0);
  EXPECT_NEAR(stage_buffers(e, 0).zero3_gathered_bytes - stage_buffers(more, 0).zero3_gathered_bytes,
              2.0 * 2.0 * layer_parameters_per_tp_rank(e.model, 1), 1.0);
}

TEST(Zero3Frameworks, DeepSpeedPerModuleGathersCostLatencyAtLargeDataParallelism) {
  // 512 A100s, small shards: DeepSpeed's four gathers a layer pay four latencies where an
  // FSDP unit pays one, so the DP stream is busier and the step no faster.
  const std::vector<std::string> big = {"cluster.nodes=64", "training.global_batch=1024"};
  auto with = [&](const char* framework) {
    std::vector<std::string> o = big;
    o.push_back(std::string("training.framework=") + framework);
    return load_experiment(kDeepSpeed, o);
  };
  const StepResult ds = simulate_step_isolated(with("deepspeed"));
  const StepResult mg = simulate_step_isolated(with("megatron"));
  EXPECT_GT(ds.comm.at("DP").total_s, mg.comm.at("DP").total_s);
  EXPECT_GE(ds.step_time_s, mg.step_time_s * 0.98);
}

TEST(Zero3Frameworks, FsdpCopiesAroundItsCollectivesAndChainsItsReduceScatters) {
  const Experiment e = load_experiment(kFsdp);
  const StepPlan plan = build_step_plan(e);
  const StagePlan& st = plan.stages.at(0);
  const int layers = static_cast<int>(e.model.layers);
  EXPECT_EQ(count(st, "fsdp_param_copy_out", Phase::forward, 0), layers);
  EXPECT_EQ(count(st, "fsdp_param_copy_out", Phase::backward, 0), layers);
  // The layers' units, the head's and the embedding's (the root unit, reduced in two parts).
  EXPECT_EQ(count(st, "fsdp_grad_copy_in", Phase::backward, 0), layers + 2);
  EXPECT_EQ(count(st, "dp_grad_reducescatter", Phase::backward, 0), layers + 2);
  // Each unit's ReduceScatter but the first waits for the one before it, in the backward: the
  // head's, the layers', the embedding's.
  int chained = 0;
  for (size_t i = 0; i + 1 < st.ops.size(); ++i)
    if (st.ops[i].type == OpType::wait && st.ops[i].phase == Phase::backward && st.ops[i].kind == CommKind::DP &&
        std::string(st.ops[i + 1].name) == "fsdp_grad_copy_in" && st.ops[i].micro_batch == 0)
      ++chained;
  EXPECT_EQ(chained, layers + 1);
  // The copy-out reads the gathered bf16 layer and writes it: 4 bytes an element.
  const auto out = std::find_if(st.ops.begin(), st.ops.end(), [](const Op& op) { return std::string(op.name) == "fsdp_param_copy_out"; });
  ASSERT_NE(out, st.ops.end());
  EXPECT_NEAR(out->bytes, 4.0 * layer_parameters_per_tp_rank(e.model, 1), 1.0);
  // Memory: 4 + 4 + 8 bytes a parameter, all sharded over the 64 ranks.
  const BytesPerParameter bpp = bytes_per_parameter(Framework::fsdp, GradDtype::bf16);
  EXPECT_DOUBLE_EQ(bpp.params + bpp.grads + bpp.optimizer, 16.0);
  const MemoryBreakdown m = memory_per_stage(e)[0];
  EXPECT_NEAR(m.params_bytes + m.grads_bytes + m.optimizer_bytes, 16.0 * st.params_per_rank / 64.0, 1.0);
  // Against Megatron-FSDP's unit (the same gathers, no copies) the step is slower by about the copies.
  const StepResult fsdp = simulate_step_isolated(e);
  const StepResult mg = simulate_step_isolated(load_experiment(kFsdp, {"training.framework=megatron"}));
  EXPECT_GT(fsdp.step_time_s, mg.step_time_s);
}

TEST(Zero3Frameworks, AnalyticEngineAgreesWithTheDes) {
  // Tolerance: the analytic engine's closed form of ZeRO-3 (per-kind gathers overlapped with
  // the layer, sim/analytic_engine.cpp) against the simulated streams, 5%.
  for (const auto& [f, o] : {std::pair<std::string, std::vector<std::string>>{kDeepSpeed, {}},
                             {kFsdp, {}},
                             {kFsdp, {"training.framework=megatron"}}}) {
    SCOPED_TRACE(f + (o.empty() ? "" : " " + o[0]));
    const Experiment e = load_experiment(f, o);
    const double des = simulate_step_isolated(e).step_time_s;
    const double closed = AnalyticEngine(e).step_result(e.layout, e.training.micro_batch).step_time_s;
    EXPECT_NEAR(closed / des, 1.0, 0.05) << closed << " vs " << des;
  }
}

TEST(Zero3Frameworks, InputErrorsNameTheConstraint) {
  try {
    load_experiment(kFsdp, {"layout.zero_stage=1"});
    ADD_FAILURE() << "fsdp with ZeRO-1 accepted";
  } catch (const InputError& err) {
    EXPECT_NE(std::string(err.what()).find("training.framework=fsdp needs layout.zero_stage=3"), std::string::npos)
        << err.what();
  }
  try {
    load_experiment(kDeepSpeed, {"layout.pp=2"});
    ADD_FAILURE() << "DeepSpeed ZeRO-3 with pipeline parallelism accepted";
  } catch (const InputError& err) {
    EXPECT_NE(std::string(err.what()).find("incompatible with pipeline parallelism"), std::string::npos) << err.what();
  }
  try {
    load_experiment(kDeepSpeed, {"training.stage3_max_live_parameters=-1"});
    ADD_FAILURE() << "a negative stage3_max_live_parameters accepted";
  } catch (const InputError& err) {
    EXPECT_NE(std::string(err.what()).find("training.stage3_max_live_parameters"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace dtsim
