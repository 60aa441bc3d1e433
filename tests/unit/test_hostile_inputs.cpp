// Inputs a hostile new user tried (stop 33's adversarial pass), each once a crash, a silent
// default or a wrong result: now an input error naming the key or option and the constraint,
// before any simulation.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_fixture.hpp"
#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/units.hpp"
#include "models/calibration/profile.hpp"

namespace dtsim {
namespace {

namespace fs = std::filesystem;
using cli_test::shell_quote;

const std::string kRoot = DTSIM_SOURCE_DIR;
const std::string kLlama = kRoot + "/experiments/examples/llama3-8b-h100.yaml";
const std::string kMixtral = kRoot + "/experiments/moe/mixtral-8x7b-h100.yaml";

std::string problems_with(const std::string& file, const std::vector<std::string>& sets) {
  try {
    load_experiment(file, sets);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(HostileInputs, AQuantityWhoseValueOverflowsIsRefused) {
  // 1e300 GiB is a well-formed number and unit; in bytes it is beyond a double.
  EXPECT_THROW(parse_bytes("1e300 GiB"), InputError);
  EXPECT_THROW(parse_bandwidth("1e300 Tb/s"), InputError);
  EXPECT_DOUBLE_EQ(parse_bytes("80 GiB"), 80.0 * (1 << 30));
  const std::string p = problems_with(kLlama, {"cluster.hbm_reserve=1e300 GiB"});
  EXPECT_NE(p.find("cluster.hbm_reserve=\"1e300 GiB\" is beyond the range of a size in bytes"), std::string::npos) << p;
}

TEST(HostileInputs, PhysicalValuesOutsideTheirStatedRangeAreRefused) {
  // Each once reached SimGrid (an abort on a non-finite duration, or a step that never ended
  // and was reported as a deadlock).
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"cluster.gpu.memory_efficiency=1e-320", "cluster.gpu.memory_efficiency="},
      {"cluster.host_dispatch=1e308 s", "cluster.host_dispatch=1e+308 s is outside [0, 1] s"},
      {"cluster.nic.bandwidth=1e-320 Gb/s", "cluster.nic.bandwidth="},
      {"cluster.nvlink.latency=1e308 s", "cluster.nvlink.latency=1e+308 s is outside [0, 1] s"},
      {"cluster.nic.latency=2 s", "cluster.nic.latency=2 s is outside [0, 1] s"},
      {"cluster.nvlink.bandwidth=2 PB/s", "cluster.nvlink.bandwidth=2e+15 B/s is outside [1000, 1e+15] B/s"},
      {"cluster.gpu.peak_fp8=1 FLOP/s", "cluster.gpu.peak_fp8=1 FLOP/s is outside [1e+09, 1e+18] FLOP/s (or 0)"},
  };
  for (const auto& [set, want] : cases) {
    const std::string p = problems_with(kLlama, {set});
    EXPECT_NE(p.find(want), std::string::npos) << set << ": " << p;
    EXPECT_NE(p.find("models/checked.hpp"), std::string::npos) << set << ": " << p;
  }
  // Zero keeps its meaning where it has one (no FP8 tensor cores, no latency).
  EXPECT_EQ(problems_with(kLlama, {"cluster.gpu.peak_fp8=0 FLOP/s", "cluster.nvlink.latency=0 s"}), "");
}

TEST(HostileInputs, AnAliasBombIsRefusedInsteadOfWalked) {
  // Ten anchors, each listing the previous nine times: 9^10 nodes to any walk of the document.
  std::string y = "a: &a [x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'j'; ++c) {  // appended piece by piece (GCC 12 -Wrestrict false positive)
    y += c;
    y += ": &";
    y += c;
    y += " [";
    for (int i = 0; i < 9; ++i) {
      y += i ? ", *" : "*";
      y += static_cast<char>(c - 1);
    }
    y += "]\n";
  }
  try {
    parse_experiment(y, "bomb.yaml");
    ADD_FAILURE() << "the alias bomb was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("bomb.yaml: its anchors and aliases (&name, *name) expand to more than "
                                         "1,000,000 YAML nodes"),
              std::string::npos)
        << e.what();
  }
}

TEST(HostileInputs, ProfilesHoldOnlyMeasurementsOfTrainingKernels) {
  std::ifstream in(kRoot + "/tests/data/synthetic_h100_profile.yaml");
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string first = "time_s: 0.0003087155445028572}";
  ASSERT_NE(good.find(first), std::string::npos);
  auto problems = [](const std::string& text) {
    try {
      calib::ComputeProfile::parse(text, "p.yaml");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(problems(good), "");
  // A time that overflowed the step (1e308 s aborted SimGrid; 1e30 s gave a 1e28 s step).
  std::string t = good;
  t.replace(t.find(first), first.size(), "time_s: 1e308}");
  EXPECT_NE(problems(t).find("time_s=1e308 is above 100: not a measurement of a training kernel"), std::string::npos)
      << problems(t);
  // The same shape twice: which time wins was the lookup's order.
  t = good;
  const std::string row = "    - {m: 8192, n: 3072, k: 4096, dtype: bf16, trans_a: false, trans_b: true, time_s: 0.9}\n";
  t.insert(t.find("    - {m: 8192, n: 3072, k: 4096"), row);
  EXPECT_NE(problems(t).find("a second entry for gemm m=8192 n=3072 k=4096"), std::string::npos) << problems(t);
  // No kernels and no models: the shipped tables silently replaced by the roofline.
  t = good.substr(0, good.find("kernels:"));
  EXPECT_NE(problems(t).find("no kernels and no models"), std::string::npos) << problems(t);
}

TEST(HostileInputs, EmptyNamesAndNegativeRatiosAreRefused) {
  std::ifstream in(kLlama);
  const std::string exp((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto with_gpu = [&](const std::string& gpu) {
    std::string t = exp;
    t.replace(t.find("  node: dgx-h100\n"), 17, "  node: dgx-h100\n  gpu: " + gpu + "\n");
    try {
      parse_experiment(t, "exp.yaml", {}, kRoot + "/experiments/examples");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(with_gpu("{preset: H100-SXM5-80GB}"), "");
  EXPECT_NE(with_gpu("{preset: H100-SXM5-80GB, profile: \"\"}").find("cluster.gpu.profile is empty"), std::string::npos);
  EXPECT_NE(with_gpu("{preset: H100-SXM5-80GB, name: \" \"}").find("cluster.gpu.name is empty"), std::string::npos);
  EXPECT_NE(with_gpu("{preset: H100-SXM5-80GB, gemm_efficiency: -1 / -2}")
                .find("the parts of a measured ratio A / B cannot be negative"),
            std::string::npos);
}

TEST(HostileInputs, EveryWidthAndTheModelSizeAreBounded) {
  // Adversarial pass 4: each of these once overflowed a 64-bit parameter count (a negative
  // count, a 4e13 s step, a negative slowdown) or allocated gigabytes.
  const std::string kDeepSeek = kRoot + "/experiments/moe/deepseek-v3-h100.yaml";
  const std::string big = "4611686018427387904";  // 2^62
  const std::vector<std::pair<std::string, std::string>> cases = {
      {kLlama, "model.head_dim"},           {kMixtral, "model.moe.moe_ffn_hidden"},
      {kMixtral, "model.moe.num_experts"},  {kMixtral, "model.moe.shared_expert_ffn_hidden"},
      {kDeepSeek, "model.mla.kv_lora_rank"}, {kDeepSeek, "model.mla.q_lora_rank"},
      {kDeepSeek, "model.mla.v_head_dim"},  {kDeepSeek, "model.mla.qk_rope_head_dim"},
      {kDeepSeek, "model.mla.qk_nope_head_dim"}, {kDeepSeek, "model.mtp_layers"},
      {kLlama, "model.attention.window"},
  };
  for (const auto& [file, key] : cases) {
    const std::string p = problems_with(file, {key + "=" + big});
    EXPECT_NE(p.find(key + "=" + big + " exceeds the "), std::string::npos) << key << ": " << p;
  }
  // Each width in range, the product beyond any count dtsim keeps exact: the model's size.
  std::string p = problems_with(kMixtral, {"model.moe.num_experts=65536", "model.moe.moe_ffn_hidden=1048576"});
  EXPECT_NE(p.find("parameters (model.layers=32"), std::string::npos) << p;
  EXPECT_NE(p.find("exceed the 2^50"), std::string::npos) << p;
  // MTP depths count in the plan's size (60,000 of them once took 24 GB before an OOM kill).
  p = problems_with(kDeepSeek, {"model.mtp_layers=60000"});
  EXPECT_NE(p.find("and model.mtp_layers=60000 the step plan would hold up to"), std::string::npos) << p;
  // A measured imbalance beyond every token on the busiest expert (E / k).
  p = problems_with(kMixtral, {"model.moe.load_balancing=measured", "model.moe.load_imbalance=1e300"});
  EXPECT_NE(p.find("model.moe.load_imbalance=1e+300 must be <= model.moe.num_experts / router_topk = 8 / 2 = 4"),
            std::string::npos)
      << p;
  EXPECT_EQ(problems_with(kMixtral, {"model.moe.load_balancing=measured", "model.moe.load_imbalance=4"}), "");
  // Published figures: a 0 is no measurement (it read as "not published"), 1e308 no step.
  for (const char* set : {"published.step_time_s=0", "published.step_time_s=1e308", "published.tflops_per_gpu=0",
                          "published.tflops_per_gpu=1e308"}) {
    p = problems_with(kRoot + "/experiments/gpt3-175b-selective.yaml", {set});
    EXPECT_NE(p.find("must be a measurement in (0, "), std::string::npos) << set << ": " << p;
  }
  // Digits beyond 64 bits are an integer out of range, not "not an integer".
  p = problems_with(kLlama, {"cluster.nodes=18446744073709551618"});
  EXPECT_NE(p.find("cluster.nodes=\"18446744073709551618\" does not fit in a 64-bit integer"), std::string::npos) << p;
  // A value out of range is printed so that it does not look in range.
  p = problems_with(kLlama, {"cluster.gpu.peak_bf16=1.0000001e18 FLOP/s"});
  EXPECT_NE(p.find("cluster.gpu.peak_bf16=1.0000001e+18 FLOP/s is outside"), std::string::npos) << p;
}

TEST(HostileInputs, ExpertTensorParallelZeroIsAnErrorNotTheDefault) {
  const std::string p = problems_with(kMixtral, {"layout.etp=0"});
  EXPECT_NE(p.find("layout.etp=0 must be >= 1 (or left out: = tp)"), std::string::npos) << p;
}

class HostileCli : public cli_test::CliTest {
 protected:
  HostileCli() : CliTest("dtsim-hostile") {}
  /// The Llama-3 8B example and its config.json copied into dir_, the JSON edited by `edit`.
  std::string llama_with_config(const std::function<void(std::string&)>& edit) const {
    fs::copy_file(kLlama, dir_ / "exp.yaml");
    std::ifstream in(kRoot + "/experiments/examples/llama3-8b.config.json");
    std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    edit(json);
    std::ofstream(dir_ / "llama3-8b.config.json") << json;
    return shell_quote((dir_ / "exp.yaml").string());
  }
};

TEST_F(HostileCli, AConfigJsonKeyTwiceIsRefused) {
  const std::string exp = llama_with_config([](std::string& j) {
    const auto at = j.find("\"num_hidden_layers\"");
    ASSERT_NE(at, std::string::npos);
    j.insert(at, "\"num_hidden_layers\": 16, ");
  });
  const auto r = dtsim("run " + exp + " -q");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("has the key \"num_hidden_layers\" twice in one object"), std::string::npos) << r.err;
}

TEST_F(HostileCli, AConfigJsonWithoutAStringModelTypeIsRefused) {
  for (const std::string& replacement : {std::string(""), std::string("\"model_type\": null, "),
                                         std::string("\"model_type\": 5, ")}) {
    fs::remove_all(dir_ / "exp.yaml");
    const std::string exp = llama_with_config([&](std::string& j) {
      nlohmann::json o = nlohmann::json::parse(j);
      o.erase("model_type");
      j = o.dump();
      j.insert(1, replacement);
    });
    const auto r = dtsim("run " + exp + " -q");
    EXPECT_EQ(r.code, 2) << replacement << r.err;
    EXPECT_NE(r.err.find("model_type"), std::string::npos) << r.err;
  }
}

TEST_F(HostileCli, TwoOutputsOnOnePathAndEmptyPathsAreRefused) {
  const std::string exp = shell_quote(kLlama);
  const std::string out = shell_quote((dir_ / "same.out").string());
  const auto same = dtsim("run " + exp + " -q --json " + out + " --trace " + out);
  EXPECT_EQ(same.code, 2) << same.err;
  EXPECT_NE(same.err.find("name the same file"), std::string::npos) << same.err;
  EXPECT_FALSE(fs::exists(dir_ / "same.out"));
  for (const std::string& opt : {"run " + exp + " -q --json ''", "run " + exp + " -q --trace ''",
                                 "verify " + exp + " --json ''"}) {
    const auto r = dtsim(opt);
    EXPECT_NE(r.code, 0) << opt;
    EXPECT_NE(r.err.find("an empty path names no file or directory"), std::string::npos) << opt << ": " << r.err;
  }
}

TEST_F(HostileCli, CollectiveSizesGpusAndFactorOutsideTheirRangeAreRefused) {
  const auto huge = dtsim("collective --cluster dgx-h100 -g 8 -b 9223372036854775807 -e 9223372036854775807");
  EXPECT_EQ(huge.code, 2) << huge.err;
  EXPECT_NE(huge.err.find("byte limit of one GPU's buffer"), std::string::npos) << huge.err;
  const auto inf = dtsim("collective --cluster dgx-h100 -g 8 -f inf");
  EXPECT_EQ(inf.code, 2) << inf.err;
  EXPECT_NE(inf.err.find("--factor inf must be a finite number > 1"), std::string::npos) << inf.err;
  for (const char* g : {"-g 0", "-g -1", "--nodes 0"}) {
    const auto r = dtsim(std::string("collective --cluster dgx-h100 ") + g);
    EXPECT_NE(r.code, 0) << g;
    EXPECT_NE(r.err.find("not in range 1 to"), std::string::npos) << g << ": " << r.err;
  }
}

TEST_F(HostileCli, ASweepWhoseOutputWouldReplaceItsInputStopsBeforeWorking) {
  fs::create_directories(dir_ / "out");
  fs::copy_file(kRoot + "/experiments/sweeps/llama3-70b-1024-h100.yaml", dir_ / "out" / "report.md");
  const auto r = dtsim("sweep " + shell_quote((dir_ / "out" / "report.md").string()) + " -o " +
                       shell_quote((dir_ / "out").string()));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("it is the input file"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "out" / "journal.jsonl"));  // nothing was started
  const auto file = dtsim("sweep " + shell_quote((dir_ / "out" / "report.md").string()) + " -o " +
                          shell_quote((dir_ / "out" / "report.md").string()));
  EXPECT_NE(file.err.find("a regular file, not a directory"), std::string::npos) << file.err;
}

TEST_F(HostileCli, ALaunchScriptDoublingAVariableIsRefused) {
  std::string sh = "#!/bin/bash\nX0=\"--num-layers 32\"\n";
  for (int i = 1; i < 40; ++i) {  // X1="$X0 $X0", ... (piece by piece: GCC 12 -Wrestrict false positive)
    const std::string prev = std::to_string(i - 1);
    sh += "X";
    sh += std::to_string(i);
    sh += "=\"$X";
    sh += prev;
    sh += " $X";
    sh += prev;
    sh += "\"\n";
  }
  sh += "torchrun pretrain_gpt.py $X39 --hidden-size 1024\n";
  std::ofstream(dir_ / "run.sh") << sh;
  const auto r = dtsim("import megatron " + shell_quote((dir_ / "run.sh").string()) + " --node dgx-h100 --nodes 1");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("run.sh:19: variable X17 expands to more than 1 MiB of text"), std::string::npos) << r.err;
}

TEST_F(HostileCli, SpecFilesOutOfRangeAreRefused) {
  const std::string sweep = cli_test::read_file(kRoot + "/experiments/sweeps/gpt-2.7b-32-a100.yaml");
  const std::string plan = cli_test::read_file(kRoot + "/experiments/sweeps/plan-llama3-70b.yaml");
  // Each: the spec text, its kind, a line replaced (key prefix -> new line), the expected message.
  struct Case {
    const std::string* text;
    const char* command;
    const char* prefix;
    const char* line;
    const char* want;
  };
  std::string compare = cli_test::read_file(kRoot + "/experiments/sweeps/compare-llama3-8b-nodes.yaml");
  const std::string rel = "../examples/";  // its hf_config, relative to the shipped file
  ASSERT_NE(compare.find(rel), std::string::npos);
  compare.replace(compare.find(rel), rel.size(), kRoot + "/experiments/examples/");
  const std::vector<Case> cases = {
      {&compare, "compare", "  - name: 8 x DGX H100", "  - name: 8 x DGX A100",
       "cluster cases 0 and 1 are both named \"8 x DGX A100\""},
      {&sweep, "sweep", "  tp:", "  tp: {from: 1, to: 8, factor: 0}", "space.tp.factor=0 must be >= 2"},
      {&sweep, "sweep", "title:", "title: [1]", "title must be a single line of text (got a list)"},
      {&plan, "plan", "tokens:", "tokens: 1e300", "tokens=1e300 must be in [1, 1e16]"},
      {&plan, "plan", "deadline:", "deadline: \"0x3c days\"", "deadline=\"0x3c days\" is not a positive duration"},
      {&plan, "plan", "deadline:", "deadline: \"1e9 days\"", "is more than a century"},
  };
  for (const auto& c : cases) {
    std::string text = *c.text;
    const auto at = text.find(std::string("\n") + c.prefix);
    ASSERT_NE(at, std::string::npos) << c.prefix;
    const auto end = text.find('\n', at + 1);
    text.replace(at + 1, end - at - 1, c.line);
    const fs::path f = dir_ / (std::string(c.command) + ".yaml");
    std::ofstream(f) << text;
    const auto r = dtsim(std::string(c.command) + " " + shell_quote(f.string()) + " -q -o " +
                         shell_quote((dir_ / "out").string()));
    EXPECT_EQ(r.code, 2) << c.line << ": " << r.err;
    EXPECT_NE(r.err.find(c.want), std::string::npos) << c.line << ": " << r.err;
  }
}

TEST_F(HostileCli, AValueFromAPresetFileIsBlamedOnThatFile) {
  std::string gpu = cli_test::read_file(kRoot + "/topologies/gpus/h100-sxm5-80gb.yaml");
  std::string node = cli_test::read_file(kRoot + "/topologies/nodes/dgx-h100.yaml");
  auto set_line = [](std::string& text, const std::string& key, const std::string& value) {
    const auto at = text.find("\n" + key + ":");
    ASSERT_NE(at, std::string::npos) << key;
    text.replace(at + 1, text.find('\n', at + 1) - at - 1, key + ": " + value);
  };
  set_line(gpu, "sm_count", "-5");
  set_line(node, "gpu", "./g.yaml");
  set_line(node, "nics_per_node", "3");
  std::ofstream(dir_ / "g.yaml") << gpu;
  std::ofstream(dir_ / "n.yaml") << node;
  std::string exp = cli_test::read_file(kLlama);
  exp.replace(exp.find("node: dgx-h100"), 14, "node: ./n.yaml");
  exp.replace(exp.find("hf_config: "), 11, "hf_config: " + kRoot + "/experiments/examples/");
  std::ofstream(dir_ / "e.yaml") << exp;
  const auto r = dtsim("run " + shell_quote((dir_ / "e.yaml").string()) + " -q");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("cluster.gpu.sm_count=-5 must be >= 0 (0: no SM accounting) (cluster.gpu is read from ./g.yaml)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("does not divide cluster.gpus_per_node=8 (cluster.node is read from ./n.yaml)"),
            std::string::npos)
      << r.err;
}

TEST_F(HostileCli, MergeNeverWritesIntoADirectoryHoldingASweep) {
  const std::string spec = shell_quote(kRoot + "/experiments/sweeps/gpt-2.7b-32-a100.yaml");
  for (int i = 0; i < 2; ++i)
    ASSERT_EQ(dtsim("sweep " + spec + " -q --refine-top 0 --shard " + std::to_string(i) + "/2 -o " +
                    shell_quote((dir_ / std::to_string(i)).string()))
                  .code,
              0);
  fs::create_directories(dir_ / "other");
  fs::copy_file(dir_ / "0" / "journal.jsonl", dir_ / "other" / "journal.jsonl");
  const auto r = dtsim("merge " + shell_quote((dir_ / "0").string()) + " " + shell_quote((dir_ / "1").string()) +
                       " -q -o " + shell_quote((dir_ / "other").string()));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("holds a sweep (journal.jsonl); merge into a new directory"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "other" / "results.csv"));
}

TEST_F(HostileCli, AConfigJsonOutOfRangeIsRefusedWithItsValue) {
  // Nested 100,000 levels deep: a stack overflow (SIGSEGV) before the depth limit.
  std::string exp = llama_with_config([](std::string& j) {
    j.insert(1, "\"rope_scaling\": " + std::string(100000, '[') + std::string(100000, ']') + ", ");
  });
  auto r = dtsim("run " + exp + " -q");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("nests objects or arrays more than 500 levels deep"), std::string::npos) << r.err;
  // Integers of 2^63 or more: once wrapped to a negative value the file does not hold.
  for (const char* key : {"vocab_size", "num_hidden_layers", "head_dim"}) {
    fs::remove_all(dir_ / "exp.yaml");
    exp = llama_with_config([&](std::string& j) {
      nlohmann::json o = nlohmann::json::parse(j);
      o[key] = uint64_t{18446744073709551615u};
      j = o.dump();
    });
    r = dtsim("run " + exp + " -q");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find(std::string("\"") + key + "\"=18446744073709551615 does not fit in a 64-bit integer"),
              std::string::npos)
        << r.err;
  }
}

TEST_F(HostileCli, ImportTakesEachFlagValueAsTyped) {
  const std::string flags =
      " -- --num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --micro-batch-size 1 "
      "--global-batch-size 16 --vocab-size 32000 --bf16";
  const std::string base = "import megatron --node dgx-h100 --nodes 1 -q" + flags;
  // A Python list after `--`: once split into four words by the command-line parser, and
  // every layer imported as MoE.
  auto r = dtsim(base + " --swiglu --num-experts 8 --moe-layer-freq '[1,0,1,0]'");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("layer_freq: [1, 0, 1, 0]"), std::string::npos) << r.out;
  // --ddp-bucket-size: elements, written as bytes with their unit (a bare number is no size).
  r = dtsim("import megatron --node dgx-h100 --nodes 1 -q -o " + shell_quote((dir_ / "b.yaml").string()) + flags +
            " --ddp-bucket-size 40000000");
  ASSERT_EQ(r.code, 0) << r.err;
  r = dtsim("export megatron " + shell_quote((dir_ / "b.yaml").string()));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("--ddp-bucket-size 40000000"), std::string::npos) << r.out;
}

TEST_F(HostileCli, LaunchScriptsThatBashWouldNotRunAsWrittenAreRefused) {
  const std::string flags =
      "torchrun pretrain_gpt.py --num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
      "--micro-batch-size 1 --global-batch-size 16 --vocab-size 32000 --bf16 \\";
  // CRLF line endings (once: the next line's flags dropped, tp 1, exit 0).
  std::ofstream(dir_ / "crlf.sh") << flags << "\r\n  --tensor-model-parallel-size 2\r\n";
  auto r = dtsim("import megatron " + shell_quote((dir_ / "crlf.sh").string()) + " --node dgx-h100 --nodes 1 -q");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.err.find("crlf.sh:1: CRLF (Windows) line endings"), std::string::npos) << r.err;
  // A space after the continuation's backslash: the next line is a statement of its own.
  std::ofstream(dir_ / "space.sh") << flags << "  \n  --tensor-model-parallel-size 2\n";
  r = dtsim("import megatron " + shell_quote((dir_ / "space.sh").string()) + " --node dgx-h100 --nodes 1 -q");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.err.find("space.sh:2: starts with the flag --tensor-model-parallel-size, not a command"),
            std::string::npos)
      << r.err;
}

TEST_F(HostileCli, ConfigJsonValuesTransformersTakesAreTakenAndZeroHeadsAreNot) {
  // A checkpoint's quantization_config (FP8 Llama checkpoints) changes nothing modelled.
  std::string exp = llama_with_config([](std::string& j) {
    j.insert(1, "\"quantization_config\": {\"quant_method\": \"fp8\", \"activation_scheme\": \"dynamic\"}, ");
  });
  auto r = dtsim("explain " + exp);
  EXPECT_EQ(r.code, 0) << r.err;
  // A head of no size is no input (it read as "not given": hidden / heads).
  fs::remove_all(dir_ / "exp.yaml");
  exp = llama_with_config([](std::string& j) { j.insert(1, "\"head_dim\": 0, "); });
  r = dtsim("explain " + exp);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.err.find("\"head_dim\"=0 must be positive"), std::string::npos) << r.err;
  r = dtsim("explain " + shell_quote(kLlama) + " --set model.head_dim=0");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.err.find("model.head_dim=0 must be positive"), std::string::npos) << r.err;
}

TEST_F(HostileCli, ImportClusterFilesRelativeToTheClusterFile) {
  // An experiment whose node file is named relative to it, imported from another directory.
  fs::create_directories(dir_ / "gx" / "hw");
  fs::copy_file(kRoot + "/topologies/nodes/dgx-h100.yaml", dir_ / "gx" / "hw" / "my-node.yaml");
  std::ofstream(dir_ / "gx" / "e.yaml") << "cluster: {node: hw/my-node.yaml, nodes: 1}\n";
  const std::string out = (dir_ / "imported.yaml").string();
  auto r = dtsim("import megatron --cluster " + shell_quote((dir_ / "gx" / "e.yaml").string()) + " -q -o " +
                 shell_quote(out) +
                 " -- --num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --micro-batch-size 1 "
                 "--global-batch-size 16 --vocab-size 32000 --bf16");
  ASSERT_EQ(r.code, 0) << r.err;
  r = dtsim("explain " + shell_quote(out));
  EXPECT_EQ(r.code, 0) << r.err;
}

}  // namespace
}  // namespace dtsim
