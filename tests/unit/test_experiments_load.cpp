// Every experiment file shipped under experiments/ loads and validates (STYLE: examples
// are tests), and the published runs carry the figures their headers cite.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "tests/unit/shipped_files.hpp"

namespace dtsim {
namespace {

namespace fs = std::filesystem;

using test_files::kExperiments;

// experiments/sweeps/ holds sweep, compare and plan files, checked by their own loader
// (tests/unit/test_sweep.cpp).
std::vector<fs::path> experiment_files() { return test_files::shipped_yaml(); }

std::string load_problems(const fs::path& file) {
  try {
    load_experiment(file.string());
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(ExperimentsLoad, EveryYamlUnderExperimentsLoadsAndValidates) {
  const auto files = experiment_files();
  ASSERT_GE(files.size(), 7u) << "expected the published-run and example experiments under " << kExperiments;
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    EXPECT_EQ(load_problems(f), "");
  }
}

TEST(ExperimentsLoad, Gpt3SelectiveMatchesKorthikantiTable) {
  const Experiment e = load_experiment((kExperiments / "gpt3-175b-selective.yaml").string());
  EXPECT_EQ(e.model.layers, 96);
  EXPECT_EQ(e.model.hidden, 12288);
  EXPECT_EQ(e.model.heads, 96);
  EXPECT_EQ(e.model.vocab, 51200);
  EXPECT_EQ(e.cluster.gpus(), 64);
  EXPECT_EQ(e.cluster.gpu.name, "A100-SXM4-80GB");
  EXPECT_EQ(e.layout.tp, 8);
  EXPECT_EQ(e.layout.pp, 8);
  EXPECT_EQ(e.layout.dp, 1);
  EXPECT_TRUE(e.layout.sequence_parallel);
  EXPECT_EQ(e.layout.recompute, Recompute::selective);
  EXPECT_EQ(e.training.global_batch, 64);
  EXPECT_EQ(e.training.micro_batch, 1);
  EXPECT_FALSE(e.training.flash_attention);
  EXPECT_FALSE(e.training.overlap_grad_reduce);
  EXPECT_DOUBLE_EQ(e.published.step_time_s, 13.75);
  EXPECT_DOUBLE_EQ(e.published.mfu, 0.514);
  EXPECT_FALSE(e.published.tflops_includes_recompute);
  EXPECT_FALSE(e.published.source.empty());
}

TEST(ExperimentsLoad, Gpt3FullRecomputeIsTheBaseline) {
  const Experiment e = load_experiment((kExperiments / "gpt3-175b-full-recompute.yaml").string());
  EXPECT_FALSE(e.layout.sequence_parallel);
  EXPECT_EQ(e.layout.recompute, Recompute::full);
  EXPECT_DOUBLE_EQ(e.published.step_time_s, 18.13);
}

TEST(ExperimentsLoad, NarayananRowsCarryPublishedThroughput) {
  int rows = 0;
  for (const auto& entry : fs::directory_iterator(kExperiments / "validation")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("narayanan-", 0) != 0) continue;
    SCOPED_TRACE(name);
    ++rows;
    const Experiment e = load_experiment(entry.path().string());
    EXPECT_GT(e.published.tflops_per_gpu, 100.0);
    EXPECT_TRUE(e.published.tflops_includes_recompute);  // Table 1 uses Eq. 3 (hardware FLOPs)
    EXPECT_EQ(e.training.seq_len, 2048);
    EXPECT_EQ(e.model.vocab, 51200);
    EXPECT_EQ(e.model.ffn_hidden, 4 * e.model.hidden);
    EXPECT_EQ(e.layout.recompute, Recompute::full);
    EXPECT_EQ(e.cluster.gpu.name, "A100-SXM4-80GB");
  }
  EXPECT_GE(rows, 3);
}

TEST(ExperimentsLoad, LlamaExampleReadsHfConfig) {
  const Experiment e = load_experiment((kExperiments / "examples" / "llama3-8b-h100.yaml").string());
  EXPECT_EQ(e.model.name, "Llama-3-8B");
  EXPECT_EQ(e.model.layers, 32);
  EXPECT_EQ(e.model.hidden, 4096);
  EXPECT_EQ(e.model.heads, 32);
  EXPECT_EQ(e.model.kv_heads, 8);
  EXPECT_EQ(e.model.ffn_hidden, 14336);
  EXPECT_EQ(e.model.vocab, 128256);
  EXPECT_EQ(e.model.activation, Activation::swiglu);
  EXPECT_EQ(e.model.norm, Norm::rmsnorm);
  EXPECT_EQ(e.model.position, Position::rope);
  EXPECT_FALSE(e.model.tied_embeddings);
  EXPECT_EQ(e.cluster.gpu.name, "H100-SXM5-80GB");
  EXPECT_EQ(e.cluster.gpus(), 16);
  EXPECT_EQ(e.layout.dp, 8);
}

}  // namespace
}  // namespace dtsim
