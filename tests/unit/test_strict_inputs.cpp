// No silent acceptance (issue 14 item 5): Hugging Face config.json keys that change the model
// and are not modelled, a second YAML document, max_position_embeddings 0, NVLS on a GPU
// without it, validate without published runs, a negative tolerance, layouts that do not fit
// (exit 3), one line per problem, deep nesting, symlink loops, unterminated strings, control
// characters in titles. Each case checks the exact problem or its essential words.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "tests/unit/temp_dir.hpp"
#include "reports/terminal_text.hpp"
#include "tests/unit/cli_fixture.hpp"

namespace dtsim {
namespace {

namespace fs = std::filesystem;

const fs::path kSource = DTSIM_SOURCE_DIR;
const fs::path kHfData = kSource / "tests/data/hf_configs";

using test_files::TempDir;

std::string dump(const std::vector<std::string>& ps) {
  std::string s;
  for (const auto& p : ps) s += "\n  " + p;
  return s;
}

std::vector<std::string> problems(const std::string& yaml, const std::string& base_dir = ".",
                                  const std::vector<std::string>& sets = {}) {
  try {
    parse_experiment(yaml, "exp.yaml", sets, base_dir);
  } catch (const InputError& e) {
    return e.problems();
  }
  return {};
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A model from `hf` (a path) on one dgx-h100 node, DP8, sequence `seq`.
std::string hf_yaml(const fs::path& hf, int seq = 2048) {
  return "model:\n  hf_config: " + hf.string() +
         "\ncluster: {node: dgx-h100, nodes: 1}\nlayout: {dp: auto, tp: 1}\ntraining: {seq_len: " +
         std::to_string(seq) + ", global_batch: 8, micro_batch: 1}\n";
}

// The shipped Llama-3-8B config.json with `extra` keys (JSON object members) added or replaced.
std::string llama_with(const std::string& extra) {
  std::ifstream in(kSource / "experiments/examples/llama3-8b.config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j.update(nlohmann::json::parse("{" + extra + "}"));
  return j.dump();
}

// ---------------------------------------------------------------------------------------
// Hugging Face config.json: keys that are read, harmless, unmodelled or unknown.

TEST(StrictHf, PublicConfigsLoad) {
  // Real config.json files (tests/data/hf_configs/SOURCES.md) and the shipped example.
  for (const char* f : {"llama-3.1-8b.json", "qwen2-7b.json", "gpt2.json", "pythia-160m.json"}) {
    const int seq = std::string(f) == "gpt2.json" ? 1024 : 2048;
    EXPECT_TRUE(problems(hf_yaml(kHfData / f, seq)).empty()) << f << dump(problems(hf_yaml(kHfData / f, seq)));
  }
  const fs::path shipped = kSource / "experiments/examples/llama3-8b.config.json";
  EXPECT_TRUE(problems(hf_yaml(shipped)).empty()) << dump(problems(hf_yaml(shipped)));
  // Mistral-7B's 4096-token window changes nothing up to 4096 tokens.
  EXPECT_TRUE(problems(hf_yaml(kHfData / "mistral-7b-v0.1.json", 4096)).empty());
}

TEST(StrictHf, ExplicitHeadDimIsRead) {
  // Mistral-Nemo: head_dim 128 x 32 heads is not the hidden size 5120; the head size is read.
  const fs::path nemo = kHfData / "mistral-nemo-base-2407.json";
  EXPECT_TRUE(problems(hf_yaml(nemo)).empty()) << dump(problems(hf_yaml(nemo)));
  const Experiment e = parse_experiment(hf_yaml(nemo), "exp.yaml", {}, ".");
  EXPECT_EQ(e.model.head_dim_override, 128);
  EXPECT_EQ(e.model.head_dim(), 128);
  // A YAML model.head_dim wins.
  EXPECT_EQ(parse_experiment(hf_yaml(nemo), "exp.yaml", {"model.head_dim=160"}, ".").model.head_dim_override, 160);
  // head_dim equal to hidden / heads (Llama-3.2 style) is the default head size: no override.
  TempDir d;
  d.write("hd.json", llama_with("\"head_dim\": 128"));
  EXPECT_TRUE(problems(hf_yaml(d.path() / "hd.json")).empty());
  EXPECT_EQ(parse_experiment(hf_yaml(d.path() / "hd.json"), "exp.yaml", {}, ".").model.head_dim_override, 0);
}

TEST(StrictHf, ExpertCountOutsideItsFamilyIsAnError) {
  TempDir d;
  // A dense family (LlamaModel ignores the key): most likely a wrong model_type.
  for (const char* key : {"num_local_experts", "num_experts", "n_routed_experts"}) {
    const std::string name = std::string("\"") + key + "\"";
    d.write("moe.json", llama_with(name + ": 8, \"num_experts_per_tok\": 2"));
    const auto ps = problems(hf_yaml(d.path() / "moe.json"));
    ASSERT_EQ(ps.size(), 1u) << key << dump(ps);
    EXPECT_TRUE(contains(ps[0], name + "=8: model_type llama, mistral, qwen2, qwen3 has dense MLPs")) << ps[0];
    EXPECT_TRUE(contains(ps[0], "fix model_type")) << ps[0];
  }
  d.write("one.json", llama_with("\"num_local_experts\": 1"));  // one expert: a dense MLP
  EXPECT_TRUE(problems(hf_yaml(d.path() / "one.json")).empty());
  // A MoE family with another family's expert count.
  d.write("mixtral.json", R"({"model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 256,
    "num_attention_heads": 8, "intermediate_size": 512, "vocab_size": 32000, "hidden_act": "silu",
    "n_routed_experts": 64})");
  const auto ps = problems(hf_yaml(d.path() / "mixtral.json"));
  ASSERT_EQ(ps.size(), 1u) << dump(ps);
  EXPECT_TRUE(contains(ps[0], "\"n_routed_experts\"=64: model_type mixtral reads its experts from "
                              "\"num_local_experts\"")) << ps[0];
}

TEST(StrictHf, SlidingWindowShorterThanTheSequenceSetsTheWindow) {
  {
    EXPECT_TRUE(problems(hf_yaml(kHfData / "mistral-7b-v0.1.json", 8192)).empty());
    const Experiment e = parse_experiment(hf_yaml(kHfData / "mistral-7b-v0.1.json", 8192), "exp.yaml", {}, ".");
    EXPECT_EQ(e.model.attention.window, 4096);  // every Mistral layer slides
    EXPECT_TRUE(e.model.attention.window_pattern.empty());
    // A window at least as long as the sequence changes nothing.
    EXPECT_EQ(parse_experiment(hf_yaml(kHfData / "mistral-7b-v0.1.json", 4096), "exp.yaml", {}, ".").model.attention.window, 0);
  }
  TempDir d;
  // Qwen2 applies the window only with use_sliding_window (the public Qwen2-7B has false),
  // from layer max_window_layers on (default 28: none of these 2 layers slides).
  d.write("qwen.json", R"({"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 256,
    "num_attention_heads": 8, "intermediate_size": 512, "vocab_size": 32000, "hidden_act": "silu",
    "use_sliding_window": true, "sliding_window": 1024})");
  EXPECT_TRUE(problems(hf_yaml(d.path() / "qwen.json", 2048)).empty());
  EXPECT_EQ(parse_experiment(hf_yaml(d.path() / "qwen.json", 2048), "exp.yaml", {}, d.path().string()).model.attention.window, 0);
  d.write("qwen1.json", R"({"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 256,
    "num_attention_heads": 8, "intermediate_size": 512, "vocab_size": 32000, "hidden_act": "silu",
    "use_sliding_window": true, "sliding_window": 1024, "max_window_layers": 1})");
  const Experiment q = parse_experiment(hf_yaml(d.path() / "qwen1.json", 2048), "exp.yaml", {}, d.path().string());
  EXPECT_EQ(q.model.attention.window, 1024);
  EXPECT_EQ(q.model.attention.window_pattern, (std::vector<uint8_t>{0, 1}));
  // MistralConfig's default window (4096) applies when the key is absent; null turns it off.
  d.write("mistral.json", R"({"model_type": "mistral", "num_hidden_layers": 2, "hidden_size": 256,
    "num_attention_heads": 8, "intermediate_size": 512, "vocab_size": 32000, "hidden_act": "silu"})");
  EXPECT_EQ(parse_experiment(hf_yaml(d.path() / "mistral.json", 8192), "exp.yaml", {}, d.path().string())
                .model.attention.window,
            4096);
  d.write("off.json", R"({"model_type": "mistral", "num_hidden_layers": 2, "hidden_size": 256,
    "num_attention_heads": 8, "intermediate_size": 512, "vocab_size": 32000, "hidden_act": "silu",
    "sliding_window": null})");
  EXPECT_TRUE(problems(hf_yaml(d.path() / "off.json", 8192)).empty());
  EXPECT_EQ(parse_experiment(hf_yaml(d.path() / "off.json", 8192), "exp.yaml", {}, d.path().string()).model.attention.window, 0);
}

TEST(StrictHf, UnknownKeyIsNamed) {
  TempDir d;
  d.write("unk.json", llama_with("\"foo_bar\": 1"));
  const auto ps = problems(hf_yaml(d.path() / "unk.json"));
  ASSERT_EQ(ps.size(), 1u) << dump(ps);
  EXPECT_TRUE(contains(ps[0], "\"foo_bar\" is not a key dtsim reads or knows to leave the model unchanged")) << ps[0];
}

TEST(StrictHf, OtherUnmodelledFeatures) {
  TempDir d;
  const std::pair<const char*, const char*> cases[] = {
      {"\"attention_bias\": true", "\"attention_bias\"=true"},
      {"\"mlp_bias\": true", "\"mlp_bias\"=true"},
      {"\"add_cross_attention\": true", "cross-attention are not modelled"},
      {"\"pruned_heads\": {\"0\": [1]}", "pruned attention heads"},
      {"\"layer_types\": [\"sliding_attention\", \"full_attention\"]", "\"layer_types\""},
  };
  for (const auto& [extra, words] : cases) {
    d.write("x.json", llama_with(extra));
    const auto ps = problems(hf_yaml(d.path() / "x.json"));
    ASSERT_EQ(ps.size(), 1u) << extra << dump(ps);
    EXPECT_TRUE(contains(ps[0], words)) << ps[0];
  }
  // Inactive values are fine.
  // (layer_types: one entry per layer, as transformers' layer_type_validation requires.)
  std::string all_full;
  for (int i = 0; i < 32; ++i) all_full += std::string(i ? ", " : "") + "\"full_attention\"";
  d.write("ok.json", llama_with("\"add_cross_attention\": false, \"pruned_heads\": {}, \"layer_types\": [" +
                                all_full + "]"));
  EXPECT_TRUE(problems(hf_yaml(d.path() / "ok.json")).empty()) << dump(problems(hf_yaml(d.path() / "ok.json")));
  // GPT-NeoX MLPs are not gated: silu there is not SwiGLU.
  d.write("neox.json", R"({"model_type": "gpt_neox", "num_hidden_layers": 2, "hidden_size": 256,
    "num_attention_heads": 8, "intermediate_size": 1024, "vocab_size": 32000, "hidden_act": "silu"})");
  const auto ps = problems(hf_yaml(d.path() / "neox.json"));
  ASSERT_EQ(ps.size(), 1u) << dump(ps);
  EXPECT_TRUE(contains(ps[0], "non-gated")) << ps[0];
}

TEST(StrictHf, MaxPositionZeroIsAnError) {
  TempDir d;
  d.write("zero.json", R"({"model_type": "gpt2", "n_layer": 2, "n_embd": 256, "n_head": 8, "vocab_size": 32000,
    "n_positions": 0})");
  const auto ps = problems(hf_yaml(d.path() / "zero.json", 1024));
  ASSERT_EQ(ps.size(), 1u) << dump(ps);
  EXPECT_TRUE(contains(ps[0], "=0 must be a positive integer")) << ps[0];
}

// ---------------------------------------------------------------------------------------
// YAML experiments.

const char* kSmall = R"(title: small
model: {name: m, layers: 4, hidden: 1024, heads: 16, ffn_hidden: 4096, vocab: 32000, activation: gelu,
        tied_embeddings: true, norm: layernorm, position: learned}
cluster: {node: dgx-a100, nodes: 1}
layout: {dp: 8, tp: 1}
training: {seq_len: 1024, global_batch: 8, micro_batch: 1}
)";

TEST(StrictYaml, SmallIsValid) { EXPECT_TRUE(problems(kSmall).empty()) << dump(problems(kSmall)); }

TEST(StrictYaml, SecondDocumentIsAnError) {
  for (const std::string tail : {"---\nlayout: {tp: 8}\n", "---\n"}) {
    const auto ps = problems(std::string(kSmall) + tail);
    ASSERT_EQ(ps.size(), 1u) << dump(ps);
    EXPECT_TRUE(contains(ps[0], "exp.yaml: holds 2 YAML documents separated by ---")) << ps[0];
  }
  // A leading --- and a final ... are one document.
  EXPECT_TRUE(problems(std::string("---\n") + kSmall + "...\n").empty());
}

TEST(StrictYaml, MaxPositionEmbeddingsZeroIsAnError) {
  const auto ps = problems(kSmall, ".", {"model.max_position_embeddings=0"});
  ASSERT_EQ(ps.size(), 1u) << dump(ps);
  EXPECT_EQ(ps[0], "exp.yaml: model.max_position_embeddings=0 must be a positive integer (omit the key when the "
                   "model has no position limit)");
  EXPECT_EQ(problems(kSmall, ".", {"model.max_position_embeddings=-3"}).size(), 1u);
  EXPECT_TRUE(problems(kSmall, ".", {"model.max_position_embeddings=2048"}).empty());
}

TEST(StrictYaml, NvlsWithoutNvlinkSharpIsAnError) {
  const auto ps = problems(kSmall, ".", {"cluster.collectives.algorithm=nvls"});
  ASSERT_EQ(ps.size(), 1u) << dump(ps);
  EXPECT_TRUE(contains(ps[0], "cluster.collectives.algorithm=nvls needs NVLink SHARP")) << ps[0];
  // DGX H100 has it.
  EXPECT_TRUE(problems(kSmall, ".", {"cluster.node=dgx-h100", "cluster.collectives.algorithm=nvls"}).empty());
}

TEST(StrictYaml, OneProblemOneLine) {
  const std::pair<std::string, std::string> cases[] = {
      {"model.hidden=abc", "exp.yaml: model.hidden=\"abc\" is not an integer"},
      {"cluster.node=dgx-z100", "exp.yaml: cluster.node=\"dgx-z100\" is not a node preset"},
      {"layout.tp=x", "exp.yaml: layout.tp=\"x\" is not an integer"},
      {"training.seq_len=1.5", "exp.yaml: training.seq_len=\"1.5\" is not an integer"},
  };
  for (const auto& [set, first] : cases) {
    // dp: auto depends on tp; the cluster's keys depend on the node.
    const auto ps = problems(std::string(kSmall), ".", {set, "layout.dp=auto"});
    ASSERT_EQ(ps.size(), 1u) << set << dump(ps);
    EXPECT_EQ(ps[0].rfind(first, 0), 0u) << ps[0];
  }
  // A type error inside a config.json: no second "is required" for the same key.
  TempDir d;
  d.write("str.json", R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": "256",
    "num_attention_heads": 8, "intermediate_size": 512, "vocab_size": 32000, "hidden_act": "silu"})");
  const auto ps = problems(hf_yaml(d.path() / "str.json"));
  ASSERT_EQ(ps.size(), 1u) << dump(ps);
  EXPECT_TRUE(contains(ps[0], "\"hidden_size\"=\"256\" is not an integer")) << ps[0];
}

TEST(StrictYaml, DeepNestingSaysSo) {
  const auto ps = problems("title: " + std::string(100000, '['));
  ASSERT_EQ(ps.size(), 1u) << dump(ps);
  EXPECT_TRUE(contains(ps[0], "exp.yaml: invalid YAML at line 1, column ")) << ps[0];
  EXPECT_TRUE(contains(ps[0], "nesting too deep")) << ps[0];
  std::string maps = "title: ";
  for (int i = 0; i < 3000; ++i) maps += "{a: ";
  EXPECT_TRUE(contains(problems(maps).at(0), "nesting too deep"));
}

TEST(StrictYaml, UnterminatedStringsSaySo) {
  {
    const auto ps = problems(std::string("title: \"abc\n") + kSmall);
    ASSERT_EQ(ps.size(), 1u) << dump(ps);
    EXPECT_EQ(ps[0], "exp.yaml: invalid YAML at line 1, column 8: unterminated double-quoted string: the \" opened "
                     "here is never closed (the string would run to the end of the file)");
  }
  {
    const auto ps = problems(std::string(kSmall) + "published: {source: 'Table 1}\n");
    ASSERT_EQ(ps.size(), 1u) << dump(ps);
    EXPECT_TRUE(contains(ps[0], "line 7, column 21: unterminated single-quoted string")) << ps[0];
  }
  // Quotes inside plain scalars, multi-line quoted strings, escapes and block scalars are fine.
  const std::string ok = std::string(kSmall) +
                         "published:\n  source: \"Table 1, \\\"row\\\"\n    two\"\n  tflops_per_gpu: 100\n";
  EXPECT_TRUE(problems(ok).empty()) << dump(problems(ok));
  EXPECT_TRUE(problems(std::string(kSmall), ".", {"title=it's"}).empty());
}

TEST(StrictYaml, SymlinkLoopSaysSo) {
  TempDir d;
  fs::create_symlink(d.path() / "a.yaml", d.path() / "b.yaml");
  fs::create_symlink(d.path() / "b.yaml", d.path() / "a.yaml");
  try {
    load_experiment((d.path() / "a.yaml").string());
    FAIL() << "no error";
  } catch (const InputError& e) {
    ASSERT_EQ(e.problems().size(), 1u);
    EXPECT_TRUE(contains(e.problems()[0], "symlink loop")) << e.problems()[0];
  }
  fs::create_symlink(d.path() / "c.json", d.path() / "c.json");
  const auto ps = problems(hf_yaml(d.path() / "c.json"));
  ASSERT_EQ(ps.size(), 1u) << dump(ps);
  EXPECT_TRUE(contains(ps[0], "symlink loop")) << ps[0];
}

// ---------------------------------------------------------------------------------------
// Terminal text.

TEST(StrictText, ControlCharactersAreEscaped) {
  EXPECT_EQ(printable("\x1b[31mred\x1b[0m"), "\\x1b[31mred\\x1b[0m");
  EXPECT_EQ(printable("a\tb\nc\x7f"), "a\tb\\nc\\x7f");
  EXPECT_EQ(printable("\xc2\x9b" "2J"), "\\u009b2J");  // C1 CSI in UTF-8
  EXPECT_EQ(printable("\x9b"), "\\x9b");                // a raw C1 byte (not UTF-8)
  EXPECT_EQ(printable("Llama \xc3\xa9 \xe2\x80\x94 \xf0\x9f\x9a\x80"), "Llama \xc3\xa9 \xe2\x80\x94 \xf0\x9f\x9a\x80");
}

// ---------------------------------------------------------------------------------------
// Through the CLI.

class StrictCli : public cli_test::CliTest {};

TEST_F(StrictCli, ValidateWithoutPublishedRunsIsAnError) {
  std::ofstream(dir_ / "exp.yaml") << kSmall;
  const auto r = dtsim("validate " + cli_test::shell_quote(dir_.string()));
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "no experiment with a published: section")) << r.err;
  fs::create_directory(dir_ / "empty");
  EXPECT_EQ(dtsim("validate " + cli_test::shell_quote((dir_ / "empty").string())).code, 2);
}

TEST_F(StrictCli, NegativeToleranceIsAnError) {
  for (const char* opt : {"--max-mape -5", "--max-row -1"}) {
    const auto r = dtsim(std::string("validate ") + opt + " " + cli_test::shell_quote(dir_.string()));
    EXPECT_NE(r.code, 0) << opt;
    EXPECT_NE(r.code, 2) << opt << ": a usage error, before any file is read";
    EXPECT_TRUE(contains(r.err, "non-negative")) << opt << r.err;
  }
}

TEST_F(StrictCli, LayoutThatDoesNotFitExits3) {
  // 2 layers of h=32768 (about 26 B parameters) with DP only: about 400 GB per A100.
  std::ofstream(dir_ / "big.yaml") << R"(title: too big
model: {name: big, layers: 2, hidden: 32768, heads: 256, ffn_hidden: 131072, vocab: 32768, activation: gelu,
        tied_embeddings: true, norm: layernorm, position: learned}
cluster: {node: dgx-a100, nodes: 1}
layout: {dp: 8, tp: 1}
training: {seq_len: 512, global_batch: 8, micro_batch: 1}
)";
  const auto r = dtsim("run " + cli_test::shell_quote((dir_ / "big.yaml").string()) + " --json " +
                       cli_test::shell_quote((dir_ / "r.json").string()));
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.out, "exceed GPU memory (OOM)")) << r.out;
  EXPECT_TRUE(fs::exists(dir_ / "r.json"));  // the result is still written
  const auto q = dtsim("run --quiet " + cli_test::shell_quote((dir_ / "big.yaml").string()));
  EXPECT_EQ(q.code, 3);
  EXPECT_TRUE(contains(q.err, "warning: 1 of 1 pipeline stage exceed GPU memory (OOM)")) << q.err;
  std::ofstream(dir_ / "small.yaml") << kSmall;
  EXPECT_EQ(dtsim("run --quiet " + cli_test::shell_quote((dir_ / "small.yaml").string())).code, 0);
}

TEST_F(StrictCli, EscapeSequencesInTitlesAreNotPrinted) {
  std::string y = kSmall;
  y.replace(0, y.find('\n'), "title: \"\\e[2J\\e]0;owned\\a red \\e[31mX\\e[0m\"");
  std::ofstream(dir_ / "ansi.yaml") << y;
  const auto r = dtsim("run " + cli_test::shell_quote((dir_ / "ansi.yaml").string()));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos);
  EXPECT_EQ(r.out.find('\a'), std::string::npos);
  EXPECT_TRUE(contains(r.out, "dtsim: \\x1b[2J\\x1b]0;owned\\x07 red \\x1b[31mX\\x1b[0m")) << r.out;
  // The same in an error message.
  const auto e = dtsim("run " + cli_test::shell_quote((dir_ / "ansi.yaml").string()) +
                       " --set 'model.activation=\x1b[31mgelu'");
  EXPECT_EQ(e.code, 2);
  EXPECT_EQ(e.err.find('\x1b'), std::string::npos) << e.err;
}

}  // namespace
}  // namespace dtsim
