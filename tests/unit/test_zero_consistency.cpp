// ZeRO: what the memory model counts as sharded is what the step plan communicates
// (issue 14). For every shipped experiment (and layouts of every shipped sweep), every ZeRO
// stage and the shipped framework plus DeepSpeed, the plan is built and its DP ops are read
// back:
//  - gradients may count as 1/N only if every micro-batch's gradients, all of the stage's
//    parameters, are reduce-scattered in that micro-batch (sum of the DP gradient
//    ReduceScatter sizes per micro-batch = the stage's gradient bytes); otherwise the whole
//    buffer is live while the micro-batches accumulate. Conversely, with several
//    micro-batches and no reduce_every_micro_batch, a plan that does reduce-scatter every
//    micro-batch is one whose memory counts gradients sharded (ZeRO-2 is not granted
//    ZeRO-1's traffic, nor ZeRO-1 ZeRO-2's memory);
//  - the optimizer state counts as 1/N iff the plan reduce-scatters the gradients, gathers
//    the updated parameters and its Adam updates 1/N of the parameters;
//  - parameters count as 1/N iff the plan gathers every layer's parameters in every
//    micro-batch's forward and backward.
// Framework/stage pairs that validation refuses (Megatron with ZeRO-2) must throw InputError
// naming both keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/flops.hpp"
#include "models/pipeline_split.hpp"
#include "models/memory.hpp"
#include "models/plan.hpp"
#include "models/schedules/schedule.hpp"
#include "models/sweep_spec.hpp"
#include "models/zero3.hpp"
#include "sim/sweep/sweep.hpp"
#include "tests/unit/shipped_files.hpp"

namespace dtsim {
namespace {

namespace fs = std::filesystem;

using test_files::kExperiments;

// experiments/sweeps/ holds sweep, compare and plan files, read separately below.
std::vector<fs::path> experiment_files() { return test_files::shipped_yaml(); }

bool near(double a, double b) { return std::fabs(a - b) <= 1e-9 * std::max({1.0, std::fabs(a), std::fabs(b)}); }

bool is_grad_sync(const Op& op) {
  return (op.type == OpType::issue || op.type == OpType::collective) && op.kind == CommKind::DP &&
         (std::string(op.name) == "dp_grad_reducescatter" || std::string(op.name) == "dp_grad_allreduce" ||
          std::string(op.name) == "edp_grad_reducescatter" || std::string(op.name) == "edp_grad_allreduce");
}

/// What one stage's plan communicates over DP x CP.
struct StageComm {
  std::vector<double> rs_bytes;   // [mb] gradient ReduceScatter bytes attributed to micro-batch mb
  bool any_rs = false;
  bool param_gather = false;      // any dp_param_allgather
  std::vector<int> fwd_gathers, bwd_gathers;  // [mb] per-layer parameter gathers
};

StageComm read_stage(const StagePlan& st, int64_t micro_batches) {
  StageComm c;
  c.rs_bytes.assign(static_cast<size_t>(micro_batches), 0.0);
  c.fwd_gathers.assign(static_cast<size_t>(micro_batches), 0);
  c.bwd_gathers.assign(static_cast<size_t>(micro_batches), 0);
  for (const Op& op : st.ops) {
    if (op.type != OpType::issue && op.type != OpType::collective) continue;
    if (is_grad_sync(op) && op.collective == Collective::ReduceScatter) {
      c.any_rs = true;
      EXPECT_GE(op.micro_batch, 0) << op.name;
      if (op.micro_batch >= 0 && op.micro_batch < micro_batches) c.rs_bytes[static_cast<size_t>(op.micro_batch)] += op.size_bytes;
    }
    if (op.kind == CommKind::DP && std::string(op.name) == "dp_param_allgather") {
      c.param_gather = true;
      if (op.layer >= 0 && op.micro_batch >= 0 && op.micro_batch < micro_batches) {
        if (op.phase == Phase::forward) ++c.fwd_gathers[static_cast<size_t>(op.micro_batch)];
        if (op.phase == Phase::backward) ++c.bwd_gathers[static_cast<size_t>(op.micro_batch)];
      }
    }
  }
  return c;
}

struct Tally {
  int plans = 0;               // plans checked
  int sharded_grads = 0;       // of which memory counted gradients sharded, over several micro-batches
  int refused = 0;             // refused framework/stage pairs
};

/// Checks one experiment (already carrying the ZeRO stage under test).
void check(const Experiment& e, const std::string& what, Tally& tally) {
  SCOPED_TRACE(what);
  const Layout& l = e.layout;
  const double n = static_cast<double>(l.dp * l.cp);
  const std::vector<MemoryBreakdown> mem = memory_per_stage(e);
  const BytesPerParameter bpp = bytes_per_parameter(e.training.framework, e.training.main_grad);
  if (n == 1) {  // nothing to shard and no DP ops to read: memory keeps every state whole
    for (size_t s = 0; s < mem.size(); ++s) {
      const double params = stage_parameters_per_rank(e.model, l, e.training.seq_len, static_cast<int64_t>(s));
      EXPECT_DOUBLE_EQ(mem[s].grads_bytes, params * bpp.grads) << "stage " << s;
      EXPECT_DOUBLE_EQ(mem[s].optimizer_bytes, params * bpp.optimizer) << "stage " << s;
      EXPECT_DOUBLE_EQ(mem[s].params_bytes, params * bpp.params) << "stage " << s;
    }
    return;
  }
  const StepPlan plan = build_step_plan(e);
  const int64_t m = plan.shape.micro_batches;
  ASSERT_EQ(mem.size(), plan.stages.size());
  ASSERT_DOUBLE_EQ(bpp.grads, static_cast<double>(plan.shape.grad_bytes_per_param));
  ++tally.plans;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    SCOPED_TRACE("stage " + std::to_string(s));
    const StagePlan& st = plan.stages[s];
    const double params = st.params_per_rank;
    ASSERT_DOUBLE_EQ(params, stage_parameters_per_rank(e.model, l, e.training.seq_len, static_cast<int64_t>(s)));
    const MemoryBreakdown& mb = mem[s];
    const StageComm c = read_stage(st, m);
    const double full_grads = params * bpp.grads;
    // One rank's shard: dense parameters over DP x CP, routed experts over EDP (models/memory.hpp).
    const double expert = stage_expert_parameters_per_rank(e.model, l, static_cast<int64_t>(s));
    const double shard = (params - expert) / n + expert / static_cast<double>(l.edp());
    // Every micro-batch reduce-scatters every gradient that has a group to reduce over: the
    // routed experts' only when EDP > 1 (EDP = 1: one rank holds each expert, nothing to reduce).
    const double reduced_grads = (l.edp() > 1 ? params : params - expert) * bpp.grads;
    // DualPipe (params_twice): a rank holds two model chunks and each micro-batch runs one of
    // them, so it reduce-scatters that chunk's gradients; the two chunks' add up to all.
    const bool two_chunks = sched::schedule_of(l.schedule).params_twice();
    auto covers = [&](double b) {
      if (near(b, reduced_grads)) return true;
      if (!two_chunks) return false;
      return std::any_of(c.rs_bytes.begin(), c.rs_bytes.end(), [&](double o) { return near(b + o, reduced_grads); });
    };
    const bool rs_every_mb = std::all_of(c.rs_bytes.begin(), c.rs_bytes.end(), covers);
    const bool grads_sharded = near(mb.grads_bytes, shard * bpp.grads);
    const bool grads_full = near(mb.grads_bytes, full_grads);
    ASSERT_TRUE(grads_sharded || grads_full) << mb.grads_bytes << " vs " << full_grads << " / " << n;
    if (grads_sharded) {
      EXPECT_TRUE(rs_every_mb) << "memory counts gradients sharded 1/" << n
                               << ", but the plan does not reduce-scatter all of every micro-batch's gradients "
                                  "(per micro-batch ReduceScatter bytes: first "
                               << c.rs_bytes.front() << ", last " << c.rs_bytes.back() << ", gradients " << reduced_grads
                               << ")";
      if (m > 1) ++tally.sharded_grads;
    }
    if (m > 1 && !e.training.reduce_every_micro_batch && rs_every_mb) {
      EXPECT_TRUE(grads_sharded) << "the plan reduce-scatters every micro-batch's gradients, yet memory keeps them whole";
    }
    EXPECT_EQ(grads_sharded, l.zero_stage >= 2);

    const bool opt_sharded = near(mb.optimizer_bytes, shard * bpp.optimizer);
    EXPECT_TRUE(opt_sharded || near(mb.optimizer_bytes, params * bpp.optimizer));
    EXPECT_EQ(opt_sharded, c.any_rs && c.param_gather && near(st.optimizer_params, shard))
        << "optimizer sharding in memory vs the plan's ReduceScatter + parameter AllGather + Adam over 1/N";

    const bool params_sharded = near(mb.params_bytes, shard * bpp.params);
    EXPECT_TRUE(params_sharded || near(mb.params_bytes, params * bpp.params));
    // The stage's layers, and on the rank holding the loss its MTP depths' layers.
    const int64_t gathered = st.layers + (rank_split(e.model.layers, l, static_cast<int64_t>(s)).loss ? e.model.mtp_layers : 0);
    // DeepSpeed keeps its last layers gathered from their forward into their backward
    // (models/zero3.hpp zero3_kept_layers): the backward gathers the others.
    const int64_t kept = zero3_kept_layers(e, static_cast<int64_t>(s));
    const bool gathers_every_mb =
        gathered > 0 &&
        std::all_of(c.fwd_gathers.begin(), c.fwd_gathers.end(), [&](int k) { return k == gathered; }) &&
        std::all_of(c.bwd_gathers.begin(), c.bwd_gathers.end(), [&](int k) { return k == gathered - kept; });
    EXPECT_EQ(params_sharded, gathers_every_mb)
        << "parameter sharding in memory vs per-layer gathers in every micro-batch's forward and backward";
  }
}

/// ZeRO stages `stages` of `e` (layout as given), with the framework as given.
void check_stages(Experiment e, const std::string& what, Tally& tally, std::vector<int> stages = {0, 1, 2, 3}) {
  for (int z : stages) {
    e.layout.zero_stage = z;
    const std::string w = what + ", zero_stage=" + std::to_string(z) + ", framework=" + to_string(e.training.framework);
    if (z == 3 && sched::schedule_of(e.layout.schedule).splits_backward()) {
      // A schedule that splits backwards into B and W refuses ZeRO-3 (models/plan.hpp).
      try {
        validate_experiment(e);
        ADD_FAILURE() << w << ": a B/W-split schedule with ZeRO-3 should be refused";
      } catch (const InputError& err) {
        EXPECT_NE(std::string(err.what()).find("layout.zero_stage=3"), std::string::npos) << err.what();
      }
      continue;
    }
    if (z != 3 && e.training.framework == Framework::fsdp) {
      // FSDP2 (fully_shard, reshard_after_forward) is ZeRO-3 only (models/experiment_io.cpp).
      EXPECT_THROW(validate_experiment(e), InputError) << w;
      continue;
    }
    if (z >= 2 && e.training.framework == Framework::deepspeed && e.layout.pp > 1) {
      // DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3 (models/experiment_io.cpp).
      try {
        validate_experiment(e);
        ADD_FAILURE() << w << ": DeepSpeed ZeRO-2/3 with pipeline parallelism should be refused";
      } catch (const InputError& err) {
        const std::string msg = err.what();
        EXPECT_NE(msg.find("layout.pp"), std::string::npos) << msg;
        EXPECT_NE(msg.find("training.framework=deepspeed"), std::string::npos) << msg;
      }
      continue;
    }
    if (z == 2 && e.training.framework == Framework::megatron) {
      try {
        validate_experiment(e);
        ADD_FAILURE() << w << ": Megatron with ZeRO-2 should be refused";
      } catch (const InputError& err) {
        const std::string msg = err.what();
        EXPECT_NE(msg.find("layout.zero_stage"), std::string::npos) << msg;
        EXPECT_NE(msg.find("training.framework"), std::string::npos) << msg;
        ++tally.refused;
      }
      continue;
    }
    try {
      validate_experiment(e);
    } catch (const InputError& err) {
      ADD_FAILURE() << w << " does not validate: " << err.what();
      continue;
    }
    check(e, w, tally);
  }
}

/// The framework variant: DeepSpeed, with the main-grad dtype experiment_io gives it by default.
Experiment as_deepspeed(Experiment e) {
  e.training.framework = Framework::deepspeed;
  e.training.main_grad = GradDtype::bf16;
  return e;
}

TEST(ZeroConsistency, EveryShippedExperimentEveryStageMemoryIsWhatThePlanCommunicates) {
  Tally tally;
  const auto files = experiment_files();
  ASSERT_GE(files.size(), 20u);
  int megatron = 0;
  for (const auto& f : files) {
    const Experiment e = load_experiment(f.string());
    const std::string name = fs::relative(f, kExperiments).string();
    megatron += e.training.framework == Framework::megatron ? 1 : 0;
    check_stages(e, name, tally);
    // DeepSpeed's ZeRO-0/1/3 plans are Megatron's with 16-bit gradients; its ZeRO-2 is new.
    if (e.training.framework != Framework::deepspeed) check_stages(as_deepspeed(e), name, tally, {2});
  }
  // The check is not vacuous: ZeRO-2 and ZeRO-3 over several micro-batches were seen, and
  // Megatron's ZeRO-2 was refused for every Megatron file.
  EXPECT_GE(tally.sharded_grads, 4);
  EXPECT_EQ(tally.refused, megatron);
  EXPECT_GE(tally.plans, 40);
}

TEST(ZeroConsistency, ShippedSweepLayoutsEveryStage) {
  // The sweeps' layouts: for each sweep file and ZeRO stage of its space, the first few points
  // that validate with DP x CP > 1 and several micro-batches.
  Tally tally;
  int sweeps = 0;
  for (const auto& entry : fs::directory_iterator(kExperiments / "sweeps")) {
    const std::string stem = entry.path().stem().string();
    if (entry.path().extension() != ".yaml" || stem.rfind("compare-", 0) == 0 || stem.rfind("plan-", 0) == 0) continue;
    const SweepSpec spec = load_sweep_spec(entry.path().string(), SpecKind::sweep);
    ++sweeps;
    std::map<int, int> taken;  // zero stage -> points checked
    for (const auto& p : sweep::enumerate_layouts(spec)) {
      if (!p.reason.empty() || p.layout.dp * p.layout.cp < 2 || taken[p.layout.zero_stage] >= 2) continue;
      Experiment e = spec.clusters[static_cast<size_t>(p.cluster)].base;
      e.layout = p.layout;
      e.training.micro_batch = p.micro_batch;
      if (e.training.global_batch % (p.micro_batch * p.layout.dp) != 0 || e.training.accumulation(e.layout) < 2) continue;
      try {
        validate_experiment(e.layout.zero_stage == 2 ? as_deepspeed(e) : e);
      } catch (const InputError&) {
        continue;  // not a valid point of the space (checked by the sweep itself)
      }
      ++taken[p.layout.zero_stage];
      const std::string what = entry.path().filename().string() + " point " + std::to_string(p.id);
      check_stages(e, what, tally);
      if (e.training.framework != Framework::deepspeed) check_stages(as_deepspeed(e), what, tally);
    }
  }
  EXPECT_GE(sweeps, 2);
  EXPECT_GE(tally.sharded_grads, 4);
}

TEST(ZeroConsistency, Zero2ReduceScattersEveryMicroBatchZero1Once) {
  // The reproduction of issue 14 on the shipped Llama-3-8B example with DeepSpeed: ZeRO-1 and
  // ZeRO-2 no longer share a plan. ZeRO-2 reduce-scatters each micro-batch's gradients;
  // ZeRO-1 the accumulated ones once.
  const std::string file = (kExperiments / "examples" / "llama3-8b-h100.yaml").string();
  const Experiment z1 = load_experiment(file, {"training.framework=deepspeed", "layout.zero_stage=1"});
  const Experiment z2 = load_experiment(file, {"training.framework=deepspeed", "layout.zero_stage=2"});
  const StepPlan p1 = build_step_plan(z1), p2 = build_step_plan(z2);
  const int64_t m = p1.shape.micro_batches;
  ASSERT_GT(m, 1);
  ASSERT_GT(z1.layout.dp * z1.layout.cp, 1);
  auto rs_bytes = [](const StepPlan& p) {
    double b = 0;
    for (const auto& st : p.stages)
      for (const auto& op : st.ops)
        if (is_grad_sync(op)) b += op.size_bytes;
    return b;
  };
  EXPECT_NEAR(rs_bytes(p2) / rs_bytes(p1), static_cast<double>(m), 1e-9 * static_cast<double>(m));
  const MemoryBreakdown m1 = memory_per_stage(z1)[0], m2 = memory_per_stage(z2)[0];
  EXPECT_DOUBLE_EQ(m1.grads_bytes / m2.grads_bytes, static_cast<double>(z1.layout.dp * z1.layout.cp));
  // Megatron refuses ZeRO-2, naming both keys and the alternatives.
  try {
    load_experiment(file, {"layout.zero_stage=2"});
    ADD_FAILURE() << "megatron with zero_stage 2 loaded";
  } catch (const InputError& err) {
    const std::string msg = err.what();
    EXPECT_NE(msg.find("layout.zero_stage=2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("training.framework=megatron"), std::string::npos) << msg;
    EXPECT_NE(msg.find("training.framework=deepspeed"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace dtsim
