// Precision recipes (training.precision, models/precision.hpp): which GEMMs run at which rate,
// the quantize kernels each recipe adds (their bytes), the memory it changes, the parameter
// gathers fp8_param_gather shrinks, and the input errors for a recipe the GPU lacks.
#include <gtest/gtest.h>

#include <string>

#include "input_problem.hpp"
#include "models/compute_cost.hpp"
#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/memory.hpp"
#include "models/plan.hpp"
#include "models/precision.hpp"
#include "sim/analytic_engine.hpp"
#include "sim/engine.hpp"

namespace dtsim {
namespace {

using test_files::input_problem;

// A small Llama-shaped model (SwiGLU: up and gate share their input) on one node.
std::string yaml(const std::string& node, const std::string& training, const std::string& layout = "") {
  return "title: t\n"
         "model:\n  name: m\n  layers: 8\n  hidden: 4096\n  heads: 32\n  kv_heads: 8\n  ffn_hidden: 14336\n"
         "  activation: swiglu\n  vocab: 128256\n  tied_embeddings: false\n  norm: rmsnorm\n  position: rope\n"
         "cluster:\n  node: " +
         node + "\n  nodes: 1\nlayout:\n" + (layout.empty() ? "  dp: 2\n  tp: 4\n  sequence_parallel: true\n" : layout) +
         "training:\n  seq_len: 4096\n  global_batch: 16\n  micro_batch: 1\n" + training;
}

const Op* find_op(const StagePlan& st, const std::string& name, int layer, Phase ph) {
  for (const Op& op : st.ops)
    if (name == op.name && op.layer == layer && op.phase == ph && op.micro_batch <= 0) return &op;
  return nullptr;
}

int count_ops(const StagePlan& st, const std::string& name) {
  int n = 0;
  for (const Op& op : st.ops) n += name == op.name ? 1 : 0;
  return n;
}

TEST(Precision, RegistryNamesAndBytes) {
  EXPECT_EQ(precision_names(), (std::vector<std::string>{"bf16", "fp8-delayed", "fp8-current", "fp8-block", "mxfp8", "nvfp4"}));
  // One scale per tensor: no per-element scale bytes.
  EXPECT_DOUBLE_EQ(precision_recipe(Precision::fp8_delayed).activation_copy_bytes(), 1.0);
  // DeepSeek-V3: FP32 scale per 1x128 tile, per 128x128 weight block.
  EXPECT_DOUBLE_EQ(precision_recipe(Precision::fp8_block).activation_copy_bytes(), 1.0 + 4.0 / 128);
  EXPECT_DOUBLE_EQ(precision_recipe(Precision::fp8_block).weight_copy_bytes(), 1.0 + 4.0 / (128 * 128));
  // OCP MX: one E8M0 byte per 32 elements.
  EXPECT_DOUBLE_EQ(precision_recipe(Precision::mxfp8).activation_copy_bytes(), 1.0 + 1.0 / 32);
  // NVFP4: half a byte per element and one E4M3 byte per 16 (16 x 16 for weights).
  EXPECT_DOUBLE_EQ(precision_recipe(Precision::nvfp4).activation_copy_bytes(), 0.5 + 1.0 / 16);
  EXPECT_DOUBLE_EQ(precision_recipe(Precision::nvfp4).weight_copy_bytes(), 0.5 + 1.0 / 256);
}

TEST(Precision, DtypeIsTheAliasAndBothAreAnError) {
  EXPECT_EQ(parse_experiment(yaml("dgx-h100", "  dtype: fp8\n"), "e.yaml").training.precision, Precision::fp8_delayed);
  EXPECT_EQ(parse_experiment(yaml("dgx-h100", "  dtype: bf16\n"), "e.yaml").training.precision, Precision::bf16);
  EXPECT_EQ(parse_experiment(yaml("dgx-h100", "  precision: fp8-block\n"), "e.yaml").training.precision,
            Precision::fp8_block);
  EXPECT_EQ(input_problem(yaml("dgx-h100", "  precision: fp8-block\n  dtype: fp8\n")),
            "exp.yaml: training.dtype is the alias of training.precision: give one of them");
  EXPECT_EQ(input_problem(yaml("dgx-h100", "  precision: fp6\n")),
            "exp.yaml: training.precision=\"fp6\" is not a precision recipe (valid: bf16, fp8-delayed, fp8-current, "
            "fp8-block, mxfp8, nvfp4)");
}

TEST(Precision, ARecipeTheGpuLacksNamesBoth) {
  EXPECT_EQ(input_problem(yaml("dgx-h100", "  precision: nvfp4\n")),
            "exp.yaml: training.precision=nvfp4 needs FP4 tensor cores, but cluster.gpu H100-SXM5-80GB has peak_fp4=0\n"
            "exp.yaml: training.precision=nvfp4 needs tensor cores that apply block scales (microscaling), but "
            "cluster.gpu H100-SXM5-80GB has microscaling=false");
  EXPECT_EQ(input_problem(yaml("dgx-h100", "  precision: mxfp8\n")),
            "exp.yaml: training.precision=mxfp8 needs tensor cores that apply block scales (microscaling), but "
            "cluster.gpu H100-SXM5-80GB has microscaling=false");
  EXPECT_EQ(input_problem(yaml("dgx-a100", "  precision: fp8-current\n")),
            "exp.yaml: training.precision=fp8-current needs FP8 tensor cores, but cluster.gpu A100-SXM4-80GB has "
            "peak_fp8=0");
  EXPECT_EQ(input_problem(yaml("dgx-a100", "  dtype: fp8\n")),
            "exp.yaml: training.dtype=fp8 needs FP8 tensor cores, but cluster.gpu A100-SXM4-80GB has peak_fp8=0");
  EXPECT_EQ(input_problem(yaml("dgx-h100", "  fp8_param_gather: true\n")),
            "exp.yaml: training.fp8_param_gather needs a low-precision training.precision (not bf16)");
  EXPECT_EQ(input_problem(yaml("dgx-h100",
                               "  precision: fp8-delayed\n  first_last_layers_bf16: true\n  num_layers_at_start_in_bf16: 5\n"
                               "  num_layers_at_end_in_bf16: 4\n")),
            "exp.yaml: training.num_layers_at_start_in_bf16 + num_layers_at_end_in_bf16 = 9 exceeds model.layers=8");
  EXPECT_EQ(input_problem(yaml("dgx-b200", "  precision: nvfp4\n")), "no error");
  EXPECT_EQ(input_problem(yaml("dgx-b200", "  precision: mxfp8\n")), "no error");
}

TEST(Precision, LinearGemmsRunAtTheRecipeRateAttentionAndHeadInBf16) {
  const Experiment e = parse_experiment(yaml("dgx-b200", "  precision: nvfp4\n"), "e.yaml");
  const StepPlan plan = build_step_plan(e);
  const StagePlan& st = plan.stages.front();
  const Op* qkv = find_op(st, "qkv", 3, Phase::forward);
  const Op* head = find_op(st, "lm_head", -1, Phase::forward);
  ASSERT_TRUE(qkv && head);
  EXPECT_EQ(op_gemm_dtype(*qkv, e), Dtype::fp4);
  EXPECT_EQ(op_gemm_dtype(*head, e), Dtype::bf16);  // Megatron's output_layer is not a TE module
  for (const Op& op : st.ops)
    if (op.kernel == KernelKind::attention) EXPECT_EQ(op_gemm_dtype(op, e), Dtype::bf16) << op.name;
  EXPECT_DOUBLE_EQ(gemm_peak_flops(e.cluster.gpu, Dtype::fp4), 9000e12);
  EXPECT_DOUBLE_EQ(mfu_peak_flops(e.cluster.gpu, e.training), 9000e12);
}

TEST(Precision, QuantizeKernelsBeforeEachLowPrecisionGemm) {
  const double tok = 4096, h = 4096;  // micro-batch 1 x seq 4096, SP gathers the sequence before QKV
  struct Case {
    const char* recipe;
    double bytes_per_element;  // read BF16 (+ amax read) + rowwise + columnwise copies
    int kernels;
  };
  for (const Case& c : {Case{"fp8-delayed", 2 + 2 * 1.0, 1}, Case{"fp8-current", 4 + 2 * 1.0, 2},
                        Case{"mxfp8", 2 + 2 * (1 + 1.0 / 32), 1}, Case{"nvfp4", 4 + 2 * (0.5 + 1.0 / 16), 2}}) {
    SCOPED_TRACE(c.recipe);
    const Experiment e = parse_experiment(yaml("dgx-b200", std::string("  precision: ") + c.recipe + "\n"), "e.yaml");
    const StepPlan plan = build_step_plan(e);
    const StagePlan& st = plan.stages.front();
    // The QKV input cast: the whole gathered sequence x hidden.
    bool found = false;
    for (size_t i = 1; i < st.ops.size(); ++i) {
      if (std::string(st.ops[i].name) != "qkv" || st.ops[i].layer != 2 || st.ops[i].phase != Phase::forward) continue;
      const Op& q = st.ops[i - 1];
      EXPECT_STREQ(q.name, "quantize");
      EXPECT_DOUBLE_EQ(q.bytes, tok * h * c.bytes_per_element);
      EXPECT_EQ(q.kernels, c.kernels);
      found = true;
      break;
    }
    EXPECT_TRUE(found);
    // Per layer and micro-batch: forward casts of the QKV, out-proj, up (shared with gate)
    // and down inputs; backward casts of the four input-gradient GEMMs' output gradients
    // (QKV, out-proj, the fused up + gate, down).
    const int mbs = 16 / 2;  // global 16 / (micro 1 x dp 2): micro-batches per rank
    EXPECT_EQ(count_ops(st, "quantize"), 8 * mbs * 4);
    EXPECT_EQ(count_ops(st, "quantize_grad"), 8 * mbs * 4);
    EXPECT_EQ(count_ops(st, "weight_quantize"), 1);
  }
  const StepPlan bf16 = build_step_plan(parse_experiment(yaml("dgx-b200", "  precision: bf16\n"), "e.yaml"));
  EXPECT_EQ(count_ops(bf16.stages.front(), "quantize") + count_ops(bf16.stages.front(), "quantize_grad") +
                count_ops(bf16.stages.front(), "weight_quantize"),
            0);
}

TEST(Precision, FirstAndLastLayersStayInBf16) {
  const Experiment e = parse_experiment(
      yaml("dgx-h100", "  precision: fp8-delayed\n  first_last_layers_bf16: true\n  num_layers_at_end_in_bf16: 2\n"),
      "e.yaml");
  EXPECT_DOUBLE_EQ(low_precision_layer_fraction(e.training, 8), 5.0 / 8);
  const StepPlan plan = build_step_plan(e);
  const StagePlan& st = plan.stages.front();
  for (int layer : {0, 6, 7}) EXPECT_EQ(op_gemm_dtype(*find_op(st, "qkv", layer, Phase::forward), e), Dtype::bf16);
  for (int layer : {1, 5}) EXPECT_EQ(op_gemm_dtype(*find_op(st, "qkv", layer, Phase::forward), e), Dtype::fp8);
  for (const Op& op : st.ops)
    if (std::string(op.name) == "quantize") EXPECT_TRUE(op.layer >= 1 && op.layer <= 5) << op.layer;
}

TEST(Precision, MemoryKeepsQuantizedGemmInputsAndWeightCopies) {
  const Experiment bf16 = parse_experiment(yaml("dgx-h100", "  precision: bf16\n"), "e.yaml");
  const Experiment fp8 = parse_experiment(yaml("dgx-h100", "  precision: fp8-delayed\n"), "e.yaml");
  // Kept GEMM inputs at 1 of 2 bytes: QKV and MLP inputs (2sbh / t with SP each) and the SwiGLU
  // output (2sbf / t): half of them saved per layer.
  const double s = 4096, h = 4096, f = 14336, t = 4;
  EXPECT_NEAR(stage_layer_activation_bytes(bf16, 0, Recompute::none, true) -
                  stage_layer_activation_bytes(fp8, 0, Recompute::none, true),
              (s * h + s * h + s * f) / t, 1.0);
  // Quantized weight copies: the layers' TP-sharded GEMM weights, rowwise + columnwise, 1 B each.
  const double layer_weights = (h * (4096 + 2 * 1024) + 4096 * h + 3 * h * f) / t;
  EXPECT_DOUBLE_EQ(stage_quantized_weights(fp8, 0).dense, 8 * layer_weights);
  EXPECT_DOUBLE_EQ(stage_buffers(fp8, 0).quantized_weight_bytes, 8 * layer_weights * 2.0);
  EXPECT_EQ(stage_buffers(bf16, 0).quantized_weight_bytes, 0.0);
  // fp8_param_gather: the weights themselves in FP8 (1 B instead of 2), only the columnwise copy.
  const Experiment pg = parse_experiment(
      yaml("dgx-h100", "  precision: fp8-delayed\n  fp8_param_gather: true\n",
           "  dp: 2\n  tp: 4\n  sequence_parallel: true\n  zero_stage: 1\n"),
      "e.yaml");
  Experiment no_pg = pg;
  no_pg.training.fp8_param_gather = false;
  EXPECT_DOUBLE_EQ(stage_memory(no_pg, 0).params_bytes - stage_memory(pg, 0).params_bytes, 8 * layer_weights);
  EXPECT_DOUBLE_EQ(stage_buffers(pg, 0).quantized_weight_bytes, 8 * layer_weights);
  // ... and the distributed optimizer's parameter AllGather carries them at 1 B.
  auto gather_bytes = [](const Experiment& e) {
    double bytes = 0;
    const StepPlan plan = build_step_plan(e);
    for (const Op& op : plan.stages.front().ops)
      if (std::string(op.name) == "dp_param_allgather") bytes += op.size_bytes;
    return bytes;
  };
  EXPECT_NEAR(gather_bytes(no_pg) - gather_bytes(pg), 8 * layer_weights, 1.0);
}

TEST(Precision, StepTimesOrderByRecipeAndEnginesAgree) {
  // Llama-shaped layers at micro-batch 4 on B200: GEMM-bound, so NVFP4 < MXFP8 < BF16; the
  // current-scaling amax pass makes fp8-current slower than fp8-delayed.
  auto run = [](const std::string& recipe, const std::string& engine) {
    Experiment e = parse_experiment(yaml("dgx-b200", "  precision: " + recipe + "\n"), "e.yaml");
    e.training.micro_batch = 4;
    e.training.global_batch = 32;
    return (engine == "analytic" ? simulate_step_analytic(e) : simulate_step_isolated(e)).step_time_s;
  };
  const double bf16 = run("bf16", "simgrid"), mx = run("mxfp8", "simgrid"), fp4 = run("nvfp4", "simgrid");
  const double delayed = run("fp8-delayed", "simgrid"), current = run("fp8-current", "simgrid");
  EXPECT_LT(fp4, mx);
  EXPECT_LT(mx, bf16);
  EXPECT_LT(delayed, current);
  // The analytic engine replays the same plan ops (within the 10% the engine tests allow).
  for (const char* r : {"fp8-current", "nvfp4"}) EXPECT_NEAR(run(r, "analytic") / run(r, "simgrid"), 1.0, 0.10) << r;
}

}  // namespace
}  // namespace dtsim

namespace dtsim {
namespace {

// Issue 19's done-when: the shipped 256-GPU GB300 NVL72 example runs with mxfp8 and nvfp4 (the
// recipes Blackwell Ultra takes), each faster than BF16; MI300X (CDNA3) has no microscaling.
TEST(PrecisionShipped, Gb300Nvl72RunsMxfp8AndNvfp4) {
  const std::string file = std::string(DTSIM_SOURCE_DIR) + "/experiments/examples/gb300-nvl72-256.yaml";
  auto step = [&](const std::string& recipe) {
    return simulate_step_isolated(load_experiment(file, {"training.precision=" + recipe})).step_time_s;
  };
  const double bf16 = step("bf16"), mx = step("mxfp8"), fp4 = step("nvfp4");
  EXPECT_GT(bf16, 0);
  EXPECT_LT(mx, bf16);
  EXPECT_LT(fp4, mx);
  const std::string amd = std::string(DTSIM_SOURCE_DIR) + "/experiments/examples/mi300x-llama3-70b.yaml";
  try {
    load_experiment(amd, {"training.precision=mxfp8"});
    ADD_FAILURE() << "mxfp8 on MI300X accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("training.precision=mxfp8 needs tensor cores that apply block scales "
                                         "(microscaling), but cluster.gpu MI300X has microscaling=false"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(load_experiment(amd, {"training.precision=fp8-current"}));
}

}  // namespace
}  // namespace dtsim
