// Megatron in, Megatron out (models/megatron_args.hpp, models/launch_script.hpp, dtsim import /
// export megatron): the shell reader, the flag table, the round trip of shipped experiments
// (export, import on the same cluster, same step) and Megatron-LM's own launch scripts
// (tests/data/megatron/, sources in its README.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_fixture.hpp"
#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/launch_script.hpp"
#include "models/megatron_args.hpp"
#include "models/precision.hpp"
#include "shipped_files.hpp"
#include "sim/analytic_engine.hpp"

namespace dtsim {
namespace {

namespace fs = std::filesystem;
const fs::path kRoot = fs::path(DTSIM_SOURCE_DIR);
const fs::path kScripts = kRoot / "tests" / "data" / "megatron";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool contains(const std::vector<std::string>& v, const std::string& part) {
  return std::any_of(v.begin(), v.end(), [&](const std::string& s) { return s.find(part) != std::string::npos; });
}

std::vector<std::string> flag_names(const std::vector<std::string>& shown) {
  std::vector<std::string> n;
  for (const auto& s : shown) n.push_back(s.substr(0, s.find(' ')));
  return n;
}

std::string text_lines(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

double analytic_step(const Experiment& e) {
  AnalyticEngine eng(e);
  return eng.estimate(e.layout, e.training.micro_batch).step_time_s;
}

// ---------------------------------------------------------------------------------------
// The shell reader.

TEST(LaunchScript, ArraysContinuationsCommentsAndExpansions) {
  const std::string sh = R"(#!/bin/bash
GPUS_PER_NODE=8
NUM_NODES=${SLURM_NNODES:-"2"}
WORLD=$(($GPUS_PER_NODE*$NUM_NODES))
TP=4
MODEL=(
    --num-layers 32   # a comment (with parens)
    --hidden-size 4096
)
MODEL+=(--seq-length 4096)
EXTRA=("--fp8-format hybrid" "--fp8-amax-history-len 1024")
if [[ "$TP" == "4" ]] || [[ -z "$NOPE" ]]; then
    MODEL+=( --swiglu )
else
    MODEL+=( --never )
fi
torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NUM_NODES pretrain_gpt.py \
    ${MODEL[@]} \
    --tensor-model-parallel-size ${TP} --save $1 \
    ${EXTRA[@]} --world "$WORLD" 2>&1 | tee log.txt
)";
  const LaunchCommand c = read_launch_script(sh, "t.sh");
  EXPECT_EQ(c.script, "pretrain_gpt.py");
  EXPECT_EQ(c.launcher, (std::vector<std::string>{"torchrun", "--nproc_per_node", "8", "--nnodes", "2"}));
  EXPECT_EQ(c.args, (std::vector<std::string>{"--num-layers", "32", "--hidden-size", "4096", "--seq-length", "4096",
                                              "--swiglu", "--tensor-model-parallel-size", "4", "--save", "$1",
                                              "--fp8-format", "hybrid", "--fp8-amax-history-len", "1024", "--world",
                                              "16"}));
  EXPECT_TRUE(contains(c.notes, "`$1` is not set by the script"));
}

TEST(LaunchScript, UndecidedConditionsAreFalseAndReported) {
  const std::string sh = "A=()\nif [ -f /etc/x ]; then\n A+=(--yes)\nfi\nif [ -n \"${WANDB_KEY}\" ]; then A+=(--w); fi\n"
                         "python pretrain_gpt.py ${A[@]} --num-layers 2\n";
  const LaunchCommand c = read_launch_script(sh, "t.sh");
  EXPECT_EQ(c.args, (std::vector<std::string>{"--num-layers", "2"}));
  EXPECT_TRUE(contains(c.notes, "t.sh:2: condition `[ -f /etc/x ]` not decided (taken as false)"));
}

TEST(LaunchScript, ErrorsNameTheScript) {
  try {
    read_launch_script("echo hello\nX=1\n", "s.sh");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(e.problems().front().find("s.sh: no launch command found"), std::string::npos);
  }
  EXPECT_THROW(read_launch_script("X=\"open\npython a.py\n", "s.sh"), InputError);
  EXPECT_THROW(read_launch_script("X=( --a\npython a.py\n", "s.sh"), InputError);
}

TEST(LaunchScript, BareWords) {
  const LaunchCommand a = launch_from_words({"--num-layers", "2"});
  EXPECT_TRUE(a.script.empty());
  EXPECT_EQ(a.args.size(), 2u);
  const LaunchCommand b = launch_from_words({"torchrun", "--nnodes", "4", "pretrain_gpt.py", "--bf16"});
  EXPECT_EQ(b.script, "pretrain_gpt.py");
  EXPECT_EQ(b.args, std::vector<std::string>{"--bf16"});
}

TEST(MegatronArgs, LayerListExpressions) {
  EXPECT_EQ(eval_layer_list("([0]*3+[1]*2)", "--moe-layer-freq"), (std::vector<int64_t>{0, 0, 0, 1, 1}));
  EXPECT_EQ(eval_layer_list("[1,0]*2", "f"), (std::vector<int64_t>{1, 0, 1, 0}));
  EXPECT_EQ(eval_layer_list("2*([1]+[0])", "f"), (std::vector<int64_t>{1, 0, 1, 0}));
  EXPECT_THROW(eval_layer_list("[2]", "f"), InputError);
  EXPECT_THROW(eval_layer_list("import os", "f"), InputError);
  EXPECT_THROW(eval_layer_list("[1]*", "f"), InputError);
}

// ---------------------------------------------------------------------------------------
// Import rules.

MegatronImportOptions h100(int64_t nodes) {
  MegatronImportOptions o;
  o.source = "test";
  o.node = "dgx-h100";
  o.nodes = nodes;
  return o;
}

const std::vector<std::string> kSmall = {"--num-layers", "4", "--hidden-size", "1024", "--num-attention-heads", "16",
                                         "--seq-length", "2048", "--vocab-size", "50257", "--micro-batch-size", "1",
                                         "--global-batch-size", "64", "--bf16", "--tensor-model-parallel-size", "2"};

TEST(MegatronImport, ClassifiesEveryFlag) {
  std::vector<std::string> args = kSmall;
  for (const char* w : {"--lr", "3e-4", "--disable-bias-linear", "--frobnicate", "7", "--save", "/x", "--no-such-switch"})
    args.push_back(w);
  const MegatronImport r = import_megatron(launch_from_words(args), h100(1));
  EXPECT_EQ(r.not_understood, (std::vector<std::string>{"--frobnicate 7", "--no-such-switch"}));
  EXPECT_EQ(r.not_modeled, std::vector<std::string>{"--disable-bias-linear"});
  EXPECT_EQ(r.ignored, (std::vector<std::string>{"--lr", "--save"}));
  EXPECT_NE(r.yaml.find("#   --frobnicate 7\n"), std::string::npos);
  // Megatron's defaults where a flag is absent; the vocabulary padded as Megatron pads it.
  EXPECT_EQ(r.experiment.model.ffn_hidden, 4096);
  EXPECT_EQ(r.experiment.model.vocab, 50432);  // 50257 up to a multiple of 128 x tp 2
  EXPECT_FALSE(r.experiment.training.overlap_grad_reduce);
  EXPECT_EQ(r.experiment.layout.dp, 4);
  EXPECT_EQ(r.experiment.layout.zero_stage, 0);
  // The output is an experiment dtsim reads back to the same experiment.
  const Experiment again = parse_experiment(r.yaml, "again");
  EXPECT_EQ(again.model.vocab, r.experiment.model.vocab);
  EXPECT_EQ(again.layout.dp, 4);
}

TEST(MegatronImport, BadValuesAndMissingInputsAreErrors) {
  auto problems = [](std::vector<std::string> args, MegatronImportOptions o = h100(1)) {
    try {
      import_megatron(launch_from_words(args), o);
    } catch (const InputError& e) {
      std::string all;
      for (const auto& p : e.problems()) all += p + "\n";
      return all;
    }
    return std::string("no error");
  };
  std::vector<std::string> a = kSmall;
  a.insert(a.end(), {"--normalization", "BatchNorm"});
  EXPECT_NE(problems(a).find("--normalization \"BatchNorm\": expected one of LayerNorm, RMSNorm"), std::string::npos);
  a = kSmall;
  a.insert(a.end(), {"--num-layers", "many"});
  EXPECT_NE(problems(a).find("--num-layers \"many\": expected an integer"), std::string::npos);
  // What Megatron-LM's validate_args asserts against (megatron/training/arguments.py).
  a = kSmall;
  a.insert(a.end(), {"--fp16"});
  EXPECT_NE(problems(a).find("--bf16 and --fp16: Megatron-LM's validate_args allows one of them"), std::string::npos);
  a = kSmall;
  a.insert(a.end(), {"--recompute-granularity", "selective", "--recompute-method", "block", "--recompute-num-layers", "2"});
  EXPECT_NE(problems(a).find("--recompute-method block with selective recomputation"), std::string::npos);
  a = {"--num-layers", "4", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "2048",
       "--tokenizer-type", "HuggingFaceTokenizer"};
  EXPECT_NE(problems(a).find("add --vocab-size N to the flags or --set model.vocab=N"), std::string::npos);
  MegatronImportOptions none;
  none.source = "test";
  EXPECT_NE(problems(kSmall, none).find("the cluster is not in Megatron-LM's flags"), std::string::npos);
  // dtsim's own checks: tp 3 does not divide 16 heads.
  a = kSmall;
  a.insert(a.end(), {"--tensor-model-parallel-size", "3"});
  EXPECT_NE(problems(a).find("layout.tp"), std::string::npos);
}

// ---------------------------------------------------------------------------------------
// Round trip: export the flags of a shipped experiment, import them on the same cluster.

struct RoundTrip {
  double original = 0, imported = 0;
  std::vector<std::string> not_expressible;
  MegatronImport imp;
};

RoundTrip round_trip(const fs::path& file) {
  RoundTrip t;
  const Experiment e = load_experiment(file.string());
  const std::vector<std::string> args = megatron_args(e, MegatronScope::all, &t.not_expressible);
  MegatronImportOptions o;
  o.source = file.filename().string();
  o.cluster_file = file.string();
  t.imp = import_megatron(launch_from_words(args), o);
  t.original = analytic_step(e);
  t.imported = analytic_step(t.imp.experiment);
  return t;
}

class MegatronRoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(MegatronRoundTrip, SameStepOnTheSameCluster) {
  const RoundTrip t = round_trip(kRoot / "experiments" / GetParam());
  EXPECT_TRUE(t.not_expressible.empty()) << text_lines(t.not_expressible);
  EXPECT_TRUE(t.imp.not_understood.empty());
  EXPECT_GT(t.original, 0);
  EXPECT_EQ(t.original, t.imported) << GetParam();
  // And the import's flags are the export's (one table, both ways).
  EXPECT_EQ(megatron_args(t.imp.experiment), megatron_args(load_experiment((kRoot / "experiments" / GetParam()).string())));
}

INSTANTIATE_TEST_SUITE_P(Shipped, MegatronRoundTrip,
                         ::testing::Values("gpt3-175b-selective.yaml", "gpt3-175b-full-recompute.yaml",
                                           "validation/megatron-core-h100-gpt-177b.yaml",
                                           "validation/megatron-core-h100-gpt-1.7b.yaml",
                                           "validation/nemo-llama2-7b-fp8-32k-cp2.yaml",
                                           "moe/mixtral-8x7b-h100.yaml", "moe/deepseek-v3-h100.yaml",
                                           "moe/qwen3-30b-a3b-h100.yaml",
                                           // --use-torch-fsdp2: framework fsdp (models/zero3.hpp)
                                           "examples/llama3-8b-fsdp2-h100.yaml"));

// Every precision recipe and its options survive export and import (models/precision.hpp
// PrecisionRecipe::megatron is what export prints). nvfp4 and mxfp8 need a Blackwell GPU.
TEST(MegatronRoundTrip, EveryPrecisionRecipe) {
  const fs::path file = kRoot / "experiments" / "examples" / "llama3-8b-h100.yaml";
  for (const std::string& recipe : precision_names()) {
    SCOPED_TRACE(recipe);
    std::vector<std::string> sets = {"cluster.node=dgx-b200", "training.precision=" + recipe};
    if (recipe != "bf16")
      sets.insert(sets.end(), {"training.fp8_param_gather=true", "training.first_last_layers_bf16=true",
                               "training.num_layers_at_end_in_bf16=2"});
    Experiment e;
    try {
      e = load_experiment(file.string(), sets);
    } catch (const InputError& x) {
      FAIL() << x.what();
    }
    std::vector<std::string> missing;
    const std::vector<std::string> args = megatron_args(e, MegatronScope::all, &missing);
    MegatronImportOptions o;
    o.source = "flags";
    o.node = "dgx-b200";
    o.nodes = e.cluster.nodes;
    const MegatronImport imp = import_megatron(launch_from_words(args), o);
    EXPECT_TRUE(imp.not_understood.empty()) << text_lines(imp.not_understood);
    EXPECT_EQ(imp.experiment.training.precision, e.training.precision);
    EXPECT_EQ(imp.experiment.training.fp8_param_gather, e.training.fp8_param_gather);
    EXPECT_EQ(imp.experiment.training.first_last_layers_bf16, e.training.first_last_layers_bf16);
    EXPECT_EQ(imp.experiment.training.num_layers_at_end_in_bf16, e.training.num_layers_at_end_in_bf16);
    EXPECT_EQ(analytic_step(imp.experiment), analytic_step(e));
  }
}

// ---------------------------------------------------------------------------------------
// Megatron-LM's own launch scripts.

MegatronImport import_script(const std::string& name, MegatronImportOptions o) {
  const fs::path p = kScripts / name;
  o.source = p.string();
  return import_megatron(read_launch_script(slurp(p), p.string()), o);
}

TEST(MegatronScripts, Gpt3_175b) {
  // --vocab-file gpt2-vocab.json without --tokenizer-type: the vocabulary is the file's; given
  // padded (50257 tokens padded to a multiple of 128 x tp 8).
  auto o = h100(16);
  o.sets = {"model.vocab=51200"};
  const MegatronImport r = import_script("train_gpt3_175b_distributed.sh", o);
  const Experiment& e = r.experiment;
  EXPECT_EQ(e.model.layers, 96);
  EXPECT_EQ(e.model.hidden, 12288);
  EXPECT_EQ(e.model.vocab, 51200);
  EXPECT_EQ(e.layout.tp, 8);
  EXPECT_EQ(e.layout.pp, 16);
  EXPECT_EQ(e.layout.dp, 1);
  EXPECT_EQ(e.training.global_batch, 1536);
  EXPECT_EQ(e.training.micro_batch, 1);
  EXPECT_TRUE(e.training.flash_attention);  // --attention-backend auto
  EXPECT_TRUE(r.not_understood.empty()) << text_lines(r.not_understood);
  EXPECT_EQ(flag_names(r.not_modeled), std::vector<std::string>{"--step-batch-size-schedule"});
  EXPECT_TRUE(contains(r.notes, "--fp16: timed as bf16"));
  EXPECT_TRUE(contains(r.notes, "torchrun --nnodes 1 differs from cluster.nodes 16"));
  EXPECT_GT(analytic_step(e), 0);
}

TEST(MegatronScripts, Llama3_8b_fp8) {
  const MegatronImport r = import_script("train_llama3_8b_h100_fp8.sh", h100(0));  // torchrun --nnodes 1
  const Experiment& e = r.experiment;
  EXPECT_EQ(e.cluster.nodes, 1);
  EXPECT_EQ(e.model.layers, 32);
  EXPECT_EQ(e.model.kv_heads, 8);
  EXPECT_EQ(e.model.ffn_hidden, 14336);
  EXPECT_EQ(e.model.vocab, 128256);
  EXPECT_EQ(e.model.activation, Activation::swiglu);
  EXPECT_EQ(e.model.norm, Norm::rmsnorm);
  EXPECT_FALSE(e.model.tied_embeddings);
  EXPECT_EQ(e.training.precision, Precision::fp8_delayed);  // --fp8-format hybrid, default recipe delayed
  EXPECT_TRUE(e.training.fp8_param_gather);                 // --fp8-param-gather
  EXPECT_EQ(e.training.main_grad, GradDtype::bf16);  // --grad-reduce-in-bf16
  EXPECT_EQ(e.layout.tp, 1);
  EXPECT_EQ(e.layout.dp, 8);
  EXPECT_EQ(e.layout.zero_stage, 1);
  EXPECT_TRUE(e.training.overlap_grad_reduce);
  EXPECT_TRUE(e.training.overlap_param_gather);
  EXPECT_TRUE(r.not_understood.empty()) << text_lines(r.not_understood);
  EXPECT_EQ(flag_names(r.not_modeled),
            (std::vector<std::string>{"--attention-dropout", "--hidden-dropout", "--apply-layernorm-1p",
                                      "--disable-bias-linear", "--cross-entropy-loss-fusion",
                                      "--calculate-per-token-loss", "--manual-gc", "--empty-unused-memory-level",
                                      "--fp8-amax-history-len", "--fp8-amax-compute-algo"}));
  EXPECT_TRUE(contains(r.notes, "condition `[ ! -f \"$PRETRAIN_SCRIPT_PATH\" ]` not decided"));
  EXPECT_GT(analytic_step(e), 0);
}

TEST(MegatronScripts, Mixtral_8x7b) {
  const MegatronImport r = import_script("train_mixtral_8x7b_distributed.sh", [] {
    auto o = h100(8);
    o.sets = {"model.vocab=32000"};  // --tokenizer-type Llama2Tokenizer: the vocabulary is the tokenizer's
    return o;
  }());
  const Experiment& e = r.experiment;
  EXPECT_EQ(e.model.moe.num_experts, 8);
  EXPECT_EQ(e.model.moe.router_topk, 2);
  EXPECT_EQ(e.model.moe.moe_ffn_hidden, 14336);
  EXPECT_EQ(e.model.moe.balance, RouterBalance::aux_loss);
  EXPECT_EQ(e.training.moe_token_dispatcher, "alltoall");
  EXPECT_EQ(e.model.vocab, 32000);
  EXPECT_EQ(e.layout.tp, 1);
  EXPECT_EQ(e.layout.pp, 4);
  EXPECT_EQ(e.layout.ep, 8);
  EXPECT_EQ(e.layout.dp, 16);
  EXPECT_EQ(e.layout.zero_stage, 1);
  EXPECT_TRUE(r.not_understood.empty()) << text_lines(r.not_understood);
  EXPECT_EQ(flag_names(r.not_modeled), (std::vector<std::string>{"--disable-bias-linear", "--attention-dropout",
                                                                  "--hidden-dropout", "--no-masked-softmax-fusion"}));
  EXPECT_TRUE(contains(r.notes, "condition `[ -n \"${WANDB_API_KEY}\" ]` not decided"));
  EXPECT_GT(analytic_step(e), 0);
  // Without the vocabulary the import says what to add.
  try {
    import_script("train_mixtral_8x7b_distributed.sh", h100(8));
    FAIL();
  } catch (const InputError& ex) {
    EXPECT_NE(ex.problems().front().find("--tokenizer-type Llama2Tokenizer"), std::string::npos);
  }
}

// ---------------------------------------------------------------------------------------
// The CLI: import a script, export an experiment, run both (identical step times).

class MegatronCli : public cli_test::CliTest {
 protected:
  MegatronCli() : CliTest("dtsim-megatron") {}
};

double run_step(const cli_test::Outcome& o, const fs::path& json) {
  EXPECT_EQ(o.code, 0) << o.err;
  return nlohmann::json::parse(cli_test::read_file(json)).at("step_time_s").get<double>();
}

TEST_F(MegatronCli, ExportImportRunGivesTheSameStep) {
  const fs::path exp = kRoot / "experiments" / "validation" / "nemo-llama2-7b-fp8-32k-cp2.yaml";
  cli_test::Outcome ex = dtsim("export megatron " + cli_test::shell_quote(exp.string()));
  ASSERT_EQ(ex.code, 0) << ex.err;
  ASSERT_EQ(ex.out.back(), '\n');
  ex.out.pop_back();  // one line
  EXPECT_NE(ex.out.find("--context-parallel-size 2 --sequence-parallel --use-distributed-optimizer"), std::string::npos);
  const fs::path out = dir_ / "imported.yaml";
  const cli_test::Outcome im = dtsim("import megatron --cluster " + cli_test::shell_quote(exp.string()) + " -o " +
                                     cli_test::shell_quote(out.string()) + " -- " + ex.out);
  ASSERT_EQ(im.code, 0) << im.err;
  EXPECT_NE(im.err.find("0 not understood"), std::string::npos) << im.err;
  const double a = run_step(dtsim("run -q " + cli_test::shell_quote(exp.string()) + " --json " +
                                  cli_test::shell_quote((dir_ / "a.json").string())),
                            dir_ / "a.json");
  const double b = run_step(dtsim("run -q " + cli_test::shell_quote(out.string()) + " --json " +
                                  cli_test::shell_quote((dir_ / "b.json").string())),
                            dir_ / "b.json");
  EXPECT_EQ(a, b);
}

TEST_F(MegatronCli, ImportsAScriptAndReportsItsFlags) {
  const fs::path out = dir_ / "gpt3.yaml";
  const cli_test::Outcome r = dtsim("import megatron --node dgx-h100 --nodes 16 --set model.vocab=51200 -o " +
                                    cli_test::shell_quote(out.string()) +
                                    " " + cli_test::shell_quote((kScripts / "train_gpt3_175b_distributed.sh").string()));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("not modeled"), std::string::npos);
  EXPECT_NE(r.err.find("--step-batch-size-schedule"), std::string::npos);
  EXPECT_NE(r.err.find("ignored (no effect on step time/memory): --train-iters"), std::string::npos) << r.err;
  const std::string yaml = cli_test::read_file(out);
  EXPECT_EQ(yaml.rfind("# Imported by `dtsim import megatron`", 0), 0u);
  EXPECT_NE(yaml.find("  tp: 8\n"), std::string::npos);
  // Refuses to write over its input; bad flags are exit code 2 naming the flag.
  fs::copy_file(kScripts / "train_gpt3_175b_distributed.sh", dir_ / "in.sh");
  const cli_test::Outcome over = dtsim("import megatron --node dgx-h100 --nodes 16 -o " +
                                       cli_test::shell_quote((dir_ / "in.sh").string()) + " " +
                                       "--set model.vocab=51200 " + cli_test::shell_quote((dir_ / "in.sh").string()));
  EXPECT_EQ(over.code, 2);
  EXPECT_NE(over.err.find("in.sh"), std::string::npos) << over.err;
  const cli_test::Outcome bad = dtsim("import megatron --node dgx-h100 --nodes 1 -- --num-layers x");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--num-layers \"x\""), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace dtsim

namespace dtsim {
namespace {

// sweep and plan print the chosen layout as Megatron-LM flags; the flags import back to it.
TEST_F(MegatronCli, SweepAndPlanPrintTheChosenLayoutsFlags) {
  // Runs `command FILE [extra] -o DIR`, returns the flags after "megatron_args: " on stdout.
  const auto printed_flags = [&](const std::string& command, const std::string& file, const std::string& extra,
                                 const fs::path& out) {
    const cli_test::Outcome r = dtsim(command + " " + cli_test::shell_quote((kRoot / "experiments" / "sweeps" / file).string()) +
                                      extra + " -o " + cli_test::shell_quote(out.string()));
    EXPECT_EQ(r.code, 0) << r.err;
    const size_t at = r.out.find("  megatron_args: --tensor-model-parallel-size ");
    EXPECT_NE(at, std::string::npos) << r.out;
    return at == std::string::npos ? std::string() : r.out.substr(at + 17, r.out.find('\n', at) - at - 17);
  };
  const std::string line = printed_flags("plan", "plan-llama3-70b.yaml", "", dir_ / "plan");
  const auto j = nlohmann::json::parse(cli_test::read_file(dir_ / "plan" / "plan.json"));
  const auto& chosen = j.at("options").at(j.at("chosen").get<size_t>());
  EXPECT_EQ(chosen.at("megatron_args").get<std::string>(), line);
  EXPECT_NE(cli_test::read_file(dir_ / "plan" / "report.md").find("Megatron"), std::string::npos);

  const std::string sline = printed_flags("sweep", "gpt-2.7b-32-a100.yaml", " --refine-top 0", dir_ / "sweep");
  const auto sj = nlohmann::json::parse(cli_test::read_file(dir_ / "sweep" / "sweep.json"));
  EXPECT_EQ(sj.at("best_megatron_args").get<std::string>(), sline);
}

}  // namespace
}  // namespace dtsim

namespace dtsim {
namespace {

// Every shipped experiment whose settings the flags express (megatron_args lists the others'
// reasons) round-trips to the identical analytic step.
TEST(MegatronRoundTripAll, EveryExpressibleShippedExperiment) {
  int tripped = 0;
  std::string skipped;
  for (const fs::path& f : test_files::shipped_yaml()) {
    const Experiment e = load_experiment(f.string());
    std::vector<std::string> nx;
    megatron_args(e, MegatronScope::all, &nx);
    if (!nx.empty()) {
      skipped += f.filename().string() + ": " + nx.front() + "\n";
      continue;
    }
    SCOPED_TRACE(f.string());
    const RoundTrip t = round_trip(f);
    EXPECT_EQ(t.original, t.imported);
    EXPECT_TRUE(t.imp.not_understood.empty());
    ++tripped;
  }
  std::cout << "round-tripped " << tripped << " shipped experiments; not expressed by the flags:\n" << skipped;
  EXPECT_GE(tripped, 20);
}

}  // namespace
}  // namespace dtsim

namespace dtsim {
namespace {

// GPT-OSS's attention as Megatron-LM's examples/gptoss/02_train.sh launches it.
TEST(MegatronImport, SlidingWindowAndSinks) {
  std::vector<std::string> args = kSmall;
  args.insert(args.end(), {"--window-size", "127,0", "--window-attn-skip-freq", "2", "--softmax-type", "learnable"});
  const MegatronImport r = import_megatron(launch_from_words(args), h100(1));
  const AttentionWindow& a = r.experiment.model.attention;
  EXPECT_EQ(a.window, 128);
  EXPECT_EQ(a.window_pattern, (std::vector<uint8_t>{1, 0}));
  EXPECT_TRUE(a.sinks);
  EXPECT_TRUE(a.windowed(0));
  EXPECT_FALSE(a.windowed(1));
  args.insert(args.end(), {"--window-size", "(127,5)"});
  EXPECT_THROW(import_megatron(launch_from_words(args), h100(1)), InputError);
}

}  // namespace
}  // namespace dtsim

namespace dtsim {
namespace {

// Garbage in: the reader and the importer answer with a result or an InputError, never
// anything else (no crash, no other exception), on random shell-ish text and deep nesting.
TEST(LaunchScript, RandomAndHostileTextIsAnInputErrorOrAResult) {
  const std::string alphabet = "ab=()[]{}$\"'\\#;|&<> \n\t-*+/%:!0123456789.py_@";
  uint64_t x = 88172645463325252ull;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  std::vector<std::string> inputs = {std::string(100000, '('), "X=$((" + std::string(50000, '(') + "1",
                                     "X=$((" + std::string(100000, '-') + "1))\npython a.py --n $X",
                                     "X=" + std::string(20000, '$') + "{", "python a.py --moe-layer-freq " +
                                     std::string(50000, '[')};
  std::string deep = "python a.py ${A:-";
  for (int i = 0; i < 5000; ++i) deep += "${A:-";
  inputs.push_back(deep);
  for (int k = 0; k < 2000; ++k) {
    std::string s = k % 2 ? "python pretrain_gpt.py " : "";
    const size_t n = next() % 200;
    for (size_t i = 0; i < n; ++i) s += alphabet[next() % alphabet.size()];
    inputs.push_back(s);
  }
  int parsed = 0;
  for (const auto& in : inputs) {
    try {
      const LaunchCommand c = read_launch_script(in, "fuzz.sh");
      ++parsed;
      try {
        import_megatron(c, h100(1));
      } catch (const InputError&) {
      }
    } catch (const InputError&) {
    }
  }
  EXPECT_GT(parsed, 0);
}

}  // namespace
}  // namespace dtsim

namespace dtsim {
namespace {

TEST_F(MegatronCli, RunPrintsTheSameFlagsAsExport) {
  const fs::path exp = kRoot / "experiments" / "moe" / "mixtral-8x7b-h100.yaml";
  const cli_test::Outcome ex = dtsim("export megatron " + cli_test::shell_quote(exp.string()));
  ASSERT_EQ(ex.code, 0) << ex.err;
  const cli_test::Outcome run = dtsim("run " + cli_test::shell_quote(exp.string()) + " --megatron-args");
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_NE(run.out.find("  megatron_args: " + ex.out), std::string::npos) << run.out;
}

}  // namespace
}  // namespace dtsim
