// models/pipeline_split.hpp: the default split is today's rule, Megatron-Core's options split
// as Megatron does (sources in the header), errors name the key, and the plan, memory and the
// analytic engine all place the same layers on each pipeline rank.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/flops.hpp"
#include "models/memory.hpp"
#include "models/pipeline_split.hpp"
#include "models/plan.hpp"
#include "sim/analytic_engine.hpp"

using namespace dtsim;

namespace {

const std::string kExample = std::string(DTSIM_SOURCE_DIR) + "/experiments/examples/llama3-8b-h100.yaml";

Layout layout(int64_t pp, int64_t vp = 1) {
  Layout l;
  l.pp = pp;
  l.vp = vp;
  if (vp > 1) l.schedule = Schedule::interleaved;
  return l;
}

// The rule models/flops.cpp used before pipeline_split, written out as a loop: every stage
// ceil(L/p), one less for each stage in the order 0, p-1, 1, p-2, ... while the deficit lasts.
std::vector<int64_t> llama3_rule(int64_t layers, int64_t p) {
  const int64_t base = (layers + p - 1) / p;
  int64_t deficit = base * p - layers;
  std::vector<int64_t> out(static_cast<size_t>(p), base);
  for (int64_t i = 0; deficit > 0; ++i, --deficit) {
    const int64_t stage = i % 2 == 0 ? i / 2 : p - 1 - i / 2;
    --out[static_cast<size_t>(stage)];
  }
  return out;
}

std::string error_of(int64_t layers, const Layout& l) {
  try {
    pipeline_split(layers, l);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// Every virtual stage contiguous after the previous one, E only on the first, L only on the last.
void expect_well_formed(const std::vector<VirtualStage>& split, int64_t layers) {
  int64_t next = 0;
  for (size_t k = 0; k < split.size(); ++k) {
    EXPECT_EQ(split[k].first_layer, next) << k;
    EXPECT_GE(split[k].layers, 0) << k;
    EXPECT_EQ(split[k].embedding, k == 0) << k;
    EXPECT_EQ(split[k].loss, k + 1 == split.size()) << k;
    next += split[k].layers;
  }
  EXPECT_EQ(next, layers);
}

}  // namespace

TEST(PipelineSplit, DefaultIsTheLlama3RuleWithoutInterleaving) {
  for (int64_t layers = 1; layers <= 48; ++layers)
    for (int64_t pp = 1; pp <= layers; ++pp) {
      const Layout l = layout(pp);
      const std::vector<VirtualStage> split = pipeline_split(layers, l);
      const std::vector<int64_t> want = llama3_rule(layers, pp);
      ASSERT_EQ(split.size(), static_cast<size_t>(pp));
      for (int64_t s = 0; s < pp; ++s) {
        ASSERT_EQ(split[static_cast<size_t>(s)].layers, want[static_cast<size_t>(s)])
            << "layers=" << layers << " pp=" << pp << " stage=" << s;
        ModelSpec m;
        m.layers = layers;
        m.hidden = m.heads = m.kv_heads = m.ffn_hidden = m.vocab = 1;
        ASSERT_EQ(stage_layer_count(m, l, s), want[static_cast<size_t>(s)]);
        ASSERT_EQ(stage_first_layer(m, l, s), split[static_cast<size_t>(s)].first_layer);
        ASSERT_EQ(virtual_stage(layers, l, s).first_layer, split[static_cast<size_t>(s)].first_layer);
      }
      expect_well_formed(split, layers);
    }
  // Llama 3 405B on PP16: 7 on the first and the last stage, 8 elsewhere (Dubey 2024 Sec 3.3.2).
  const std::vector<VirtualStage> s405 = pipeline_split(126, layout(16));
  EXPECT_EQ(s405.front().layers, 7);
  EXPECT_EQ(s405.back().layers, 7);
  EXPECT_EQ(s405[1].layers, 8);
  EXPECT_NE(error_of(4, layout(5)).find("layout.pp=5 exceeds model.layers=4"), std::string::npos);
}

TEST(PipelineSplit, DefaultWithInterleavingIsEven) {
  for (int64_t layers : {8, 12, 24, 96, 128})
    for (int64_t pp = 2; pp <= 8; ++pp)
      for (int64_t vp = 2; vp <= 4; ++vp) {
        const Layout l = layout(pp, vp);
        if (layers % (pp * vp) != 0) {
          EXPECT_NE(error_of(layers, l).find("does not divide model.layers"), std::string::npos);
          continue;
        }
        const std::vector<VirtualStage> split = pipeline_split(layers, l);
        ASSERT_EQ(split.size(), static_cast<size_t>(pp * vp));
        for (size_t k = 0; k < split.size(); ++k) {
          EXPECT_EQ(split[k].layers, layers / (pp * vp));
          EXPECT_EQ(split[k].first_layer, static_cast<int64_t>(k) * (layers / (pp * vp)));
        }
        for (int64_t r = 0; r < pp; ++r) EXPECT_EQ(rank_split(layers, l, r).layers, layers / pp);
        expect_well_formed(split, layers);
      }
}

TEST(PipelineSplit, VirtualStageOfIsMegatronInterleaving) {
  const Layout l = layout(4, 3);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(virtual_stage_of(l, r, c), c * 4 + r);
  EXPECT_THROW(virtual_stage_of(l, 4, 0), InputError);
  EXPECT_THROW(virtual_stage_of(l, 0, 3), InputError);
}

TEST(PipelineSplit, Llama31_405bWithEmbeddingAndLossInTheSplit) {
  // Megatron-Bridge's 405B recipes: 126 + E + L = 128 slots, 2 per virtual stage over 64.
  for (const auto& [pp, vp] : {std::pair<int64_t, int64_t>{16, 4}, {8, 8}}) {
    Layout l = layout(pp, vp);
    l.account_for_embedding_in_pipeline_split = true;
    l.account_for_loss_in_pipeline_split = true;
    const std::vector<VirtualStage> split = pipeline_split(126, l);
    ASSERT_EQ(split.size(), 64u);
    for (size_t k = 0; k < split.size(); ++k)
      EXPECT_EQ(split[k].layers + (split[k].embedding ? 1 : 0) + (split[k].loss ? 1 : 0), 2) << k;
    EXPECT_TRUE(split.front().embedding);
    EXPECT_EQ(split.front().layers, 1);
    EXPECT_TRUE(split.back().loss);
    EXPECT_EQ(split.back().layers, 1);
    EXPECT_EQ(split.back().first_layer, 125);
    expect_well_formed(split, 126);
    // Ranks 0 and pp-1 hold one layer fewer (2 vp - 1), the others 2 vp.
    for (int64_t r = 0; r < pp; ++r) {
      const RankSplit rs = rank_split(126, l, r);
      EXPECT_EQ(rs.layers, r == 0 || r == pp - 1 ? 2 * vp - 1 : 2 * vp) << r;
      EXPECT_EQ(rs.embedding, r == 0);
      EXPECT_EQ(rs.loss, r == pp - 1);
    }
    // The same model without the options cannot interleave over 64 virtual stages.
    EXPECT_NE(error_of(126, layout(pp, vp)).find("does not divide model.layers=126"), std::string::npos);
  }
}

TEST(PipelineSplit, AccountForOneSideAndItsErrors) {
  // Only the embedding: 31 + 1 = 32 slots over pp 4: stage 0 holds E + 7 layers.
  Layout l = layout(4);
  l.account_for_embedding_in_pipeline_split = true;
  const std::vector<VirtualStage> split = pipeline_split(31, l);
  EXPECT_EQ(split[0].layers, 7);
  EXPECT_EQ(split[3].layers, 8);
  expect_well_formed(split, 31);
  // 32 + 1 = 33 slots are not a multiple of pp 4.
  const std::string e = error_of(32, l);
  EXPECT_NE(e.find("layout.account_for_embedding_in_pipeline_split=true"), std::string::npos) << e;
  EXPECT_NE(e.find("not a multiple of layout.pp=4"), std::string::npos) << e;
  // 32 slots per pipeline rank 8, vp 3 does not divide it.
  Layout v = layout(4, 3);
  v.account_for_embedding_in_pipeline_split = true;
  EXPECT_NE(error_of(31, v).find("not a multiple of layout.vp=3"), std::string::npos);
}

TEST(PipelineSplit, DecoderFirstAndLastPipelineNumLayers) {
  // 28 layers on pp 4 x vp 2, first 4 and last 4: middle ranks 10 each, 5 per chunk.
  Layout l = layout(4, 2);
  l.decoder_first_pipeline_num_layers = 4;
  l.decoder_last_pipeline_num_layers = 4;
  const std::vector<VirtualStage> split = pipeline_split(28, l);
  const std::vector<int64_t> want = {2, 5, 5, 2, 2, 5, 5, 2};
  for (size_t k = 0; k < want.size(); ++k) EXPECT_EQ(split[k].layers, want[k]) << k;
  expect_well_formed(split, 28);
  // Megatron-Core get_transformer_layer_offset: vp_stage * 14 + first chunk (2) + middle rank
  // * (10 / 2); rank 1, chunk 1 starts at 16, rank 2, chunk 0 at 7.
  EXPECT_EQ(split[static_cast<size_t>(virtual_stage_of(l, 1, 1))].first_layer, 16);
  EXPECT_EQ(split[static_cast<size_t>(virtual_stage_of(l, 2, 0))].first_layer, 7);
  EXPECT_EQ(rank_split(28, l, 0).layers, 4);
  EXPECT_EQ(rank_split(28, l, 1).layers, 10);
  // Only the first set, no interleaving: 30 layers, first 6, the other 3 ranks 8 each.
  Layout f = layout(4);
  f.decoder_first_pipeline_num_layers = 6;
  const std::vector<VirtualStage> fs = pipeline_split(30, f);
  EXPECT_EQ(fs[0].layers, 6);
  for (size_t k = 1; k < 4; ++k) EXPECT_EQ(fs[k].layers, 8);
  expect_well_formed(fs, 30);

  auto err = [](Layout x, int64_t layers) { return error_of(layers, x); };
  Layout bad = l;
  bad.decoder_first_pipeline_num_layers = 3;  // not a multiple of vp 2
  EXPECT_NE(err(bad, 28).find("layout.decoder_first_pipeline_num_layers=3: must be a multiple of layout.vp=2"),
            std::string::npos)
      << err(bad, 28);
  bad = f;
  bad.decoder_first_pipeline_num_layers = 5;  // 25 left over 3 ranks
  EXPECT_NE(err(bad, 30).find("do not split evenly over the 3 middle pipeline ranks"), std::string::npos);
  bad.decoder_first_pipeline_num_layers = 31;
  EXPECT_NE(err(bad, 30).find("more than model.layers=30"), std::string::npos);
  bad = f;
  bad.account_for_loss_in_pipeline_split = true;
  EXPECT_NE(err(bad, 30).find("cannot be combined with layout.account_for_embedding_in_pipeline_split"),
            std::string::npos);
  bad = layout(2);
  bad.decoder_first_pipeline_num_layers = 10;
  bad.decoder_last_pipeline_num_layers = 10;  // 0 middle layers, 0 middle ranks: fine
  EXPECT_EQ(err(bad, 20), "");
  bad.decoder_last_pipeline_num_layers = 8;  // 2 layers, no middle rank
  EXPECT_NE(err(bad, 20).find("both must be zero or both non-zero"), std::string::npos);
}

TEST(PipelineSplit, PipelineLayoutParsesRepetitionAndParentheses) {
  // Megatron-Core's docstring example without its MTP layer: pp 4 x vp 2,
  // 'E|(tt|)*2,(t|)*4,L' -> [E] [tt] [tt] [t] [t] [t] [t] [L].
  Layout l = layout(4, 2);
  l.pipeline_layout = "E|(tt|)*2,(t|)*4,L";
  const std::vector<VirtualStage> split = pipeline_split(8, l);
  const std::vector<int64_t> want = {0, 2, 2, 1, 1, 1, 1, 0};
  ASSERT_EQ(split.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) EXPECT_EQ(split[k].layers, want[k]) << k;
  expect_well_formed(split, 8);
  EXPECT_EQ(rank_split(8, l, 0).layers, 1);  // virtual stages 0 (E) and 4 (t)
  EXPECT_EQ(rank_split(8, l, 3).layers, 1);  // 3 (t) and 7 (L)
  EXPECT_TRUE(rank_split(8, l, 3).loss);
  // Repetition inside a group, commas, a vp = 1 layout.
  Layout g = layout(4);
  g.pipeline_layout = "Et*3|(t*4|)*2,tt,tL";  // the last stage: "tt" + "tL" (commas join nothing)
  const std::vector<VirtualStage> gs = pipeline_split(14, g);
  EXPECT_EQ(gs[0].layers, 3);
  EXPECT_EQ(gs[1].layers, 4);
  EXPECT_EQ(gs[2].layers, 4);
  EXPECT_EQ(gs[3].layers, 3);
  expect_well_formed(gs, 14);
}

TEST(PipelineSplit, PipelineLayoutErrorsNameTheKeyAndTheConstraint) {
  auto err = [](const std::string& text, int64_t layers, int64_t pp, int64_t vp) {
    Layout l = layout(pp, vp);
    l.pipeline_layout = text;
    return error_of(layers, l);
  };
  auto has = [](const std::string& e, const std::string& what) {
    EXPECT_NE(e.find(what), std::string::npos) << e;
    EXPECT_NE(e.find("layout.pipeline_layout="), std::string::npos) << e;
  };
  has(err("Et|tx|tL", 4, 3, 1), "character 'x' at position 5");
  has(err("Et|tt|tL", 4, 2, 1), "3 virtual stages, but layout.pp*vp=2*1 = 2 are needed");
  has(err("Et|tt|tt|tL", 6, 2, 1), "set layout.vp=2");
  has(err("Et|tt|tL", 6, 3, 1), "holds 4 transformer layers (t), model.layers=6");
  has(err("Et*3|(tt|)*29,m|L", 61, 4, 8), "'m' (a multi-token-prediction layer): dtsim places the model.mtp_layers depths with the loss");
  has(err("E((t)*2|)*2|L", 4, 2, 2), "nested parentheses");
  has(err("E|(tt|)tt|L", 4, 4, 1), "must be followed by *n");
  has(err("E|(tt|*2|L", 4, 2, 1), "is not closed");
  has(err("E|tt)|L", 2, 3, 1), "has no matching '('");
  has(err("E|t**2|L", 2, 3, 1), "must be followed by a repeat count");
  has(err("tE|t|L", 2, 3, 1), "the embedding E must be the first item of virtual stage 0");
  has(err("E|t|Lt", 2, 3, 1), "the loss L must be the last item");
  has(err("EE|t|tL", 2, 3, 1), "holds 2 embeddings");
  has(err("E|t||tL", 2, 4, 1), "virtual stage 2 (chunk 0 of pipeline rank 2) holds nothing");
  has(err("E|t*100000000000|L", 2, 3, 1), "expands to more than");
  Layout mixed = layout(3);
  mixed.pipeline_layout = "Et|t|tL";
  mixed.account_for_embedding_in_pipeline_split = true;
  EXPECT_NE(error_of(3, mixed).find("cannot be combined"), std::string::npos);
}

TEST(PipelineSplit, ExperimentKeysLoadAndAreSettable) {
  // The YAML keys (through --set, the same reader) and their validation.
  const Experiment e = load_experiment(
      kExample, {"model.layers=30", "layout.pp=4", "layout.vp=2", "layout.account_for_embedding_in_pipeline_split=true",
                 "layout.account_for_loss_in_pipeline_split=true", "training.global_batch=16"});
  EXPECT_TRUE(e.layout.account_for_embedding_in_pipeline_split);
  EXPECT_TRUE(e.layout.account_for_loss_in_pipeline_split);
  EXPECT_EQ(e.layout.schedule, Schedule::interleaved);
  const Experiment p = load_experiment(kExample, {"layout.pp=2", "layout.pipeline_layout=Et*15|t*17L",
                                                  "training.global_batch=16"});
  EXPECT_EQ(p.layout.pipeline_layout, "Et*15|t*17L");
  auto problem = [](const std::vector<std::string>& sets) {
    try {
      load_experiment(kExample, sets);
    } catch (const InputError& err) {
      return std::string(err.what());
    }
    return std::string();
  };
  EXPECT_NE(problem({"layout.pp=4", "layout.account_for_loss_in_pipeline_split=true"})
                .find("layout.account_for_loss_in_pipeline_split=true: model.layers=32 + 1 = 33 slots are not a "
                      "multiple of layout.pp=4"),
            std::string::npos);
  EXPECT_NE(problem({"layout.pp=2", "layout.decoder_first_pipeline_num_layers=0"})
                .find("layout.decoder_first_pipeline_num_layers=0 must be larger than 0"),
            std::string::npos);
  EXPECT_NE(problem({"layout.pp=2", "layout.pipeline_layout=Et*15|t*16L"}).find("holds 31 transformer layers"),
            std::string::npos);
  EXPECT_NE(problem({"layout.pipeline_layouts=E|L"}).find("unknown key layout.pipeline_layouts"), std::string::npos);
}

namespace {

// The plan's forward layers of each (stage, chunk), its embedding and head ops, against
// pipeline_split; the memory model's and the analytic engine's per-rank layer counts.
void expect_consumers_agree(const Experiment& e) {
  const Layout& l = e.layout;
  const std::vector<VirtualStage> split = pipeline_split(e.model, l);
  const StepPlan plan = build_step_plan(e);
  const StepResult analytic = simulate_step_analytic(e);
  ASSERT_EQ(plan.stages.size(), static_cast<size_t>(l.pp));
  for (int64_t s = 0; s < l.pp; ++s) {
    const StagePlan& sp = plan.stages[static_cast<size_t>(s)];
    std::vector<std::set<int32_t>> layers(static_cast<size_t>(l.vp));
    std::vector<bool> embedding(static_cast<size_t>(l.vp), false), head(static_cast<size_t>(l.vp), false);
    for (const Op& op : sp.ops) {
      if (op.type != OpType::compute || op.phase != Phase::forward) continue;
      const size_t c = static_cast<size_t>(op.chunk);
      if (op.layer >= 0) layers[c].insert(op.layer);
      if (std::string(op.name) == "embedding") embedding[c] = true;
      if (std::string(op.name) == "lm_head") head[c] = true;
    }
    int64_t total = 0;
    for (int64_t c = 0; c < l.vp; ++c) {
      const VirtualStage& vs = split[static_cast<size_t>(virtual_stage_of(l, s, c))];
      std::set<int32_t> want;
      for (int64_t i = 0; i < vs.layers; ++i) want.insert(static_cast<int32_t>(vs.first_layer + i));
      EXPECT_EQ(layers[static_cast<size_t>(c)], want) << "stage " << s << " chunk " << c;
      EXPECT_EQ(embedding[static_cast<size_t>(c)], vs.embedding) << "stage " << s << " chunk " << c;
      EXPECT_EQ(head[static_cast<size_t>(c)], vs.loss) << "stage " << s << " chunk " << c;
      total += vs.layers;
    }
    EXPECT_EQ(sp.layers, total) << s;
    EXPECT_EQ(stage_layer_count(e.model, l, s), total) << s;
    EXPECT_EQ(stage_activations(e, s).stage_layers, total) << s;
    EXPECT_EQ(analytic.stages[static_cast<size_t>(s)].layers, total) << s;
  }
}

Experiment small(const std::vector<std::string>& sets) {
  std::vector<std::string> all = {"training.global_batch=16"};
  all.insert(all.end(), sets.begin(), sets.end());
  return load_experiment(kExample, all);
}

}  // namespace

TEST(PipelineSplitConsumers, PlanMemoryAndAnalyticAgreeOnEachRank) {
  // Llama-3-8B (32 layers) on 16 GPUs, TP2.
  expect_consumers_agree(small({"layout.pp=4"}));
  expect_consumers_agree(small({"model.layers=30", "layout.pp=4"}));  // Llama 3 uneven default
  expect_consumers_agree(small({"layout.pp=4", "layout.vp=2"}));
  expect_consumers_agree(small({"layout.pp=2", "layout.account_for_embedding_in_pipeline_split=true",
                                "layout.account_for_loss_in_pipeline_split=true"}));
  expect_consumers_agree(small({"layout.pp=4", "layout.vp=2", "model.layers=30",
                                "layout.account_for_embedding_in_pipeline_split=true",
                                "layout.account_for_loss_in_pipeline_split=true"}));
  expect_consumers_agree(small({"layout.pp=4", "layout.vp=2", "layout.decoder_first_pipeline_num_layers=6",
                                "layout.decoder_last_pipeline_num_layers=6"}));
  // Chunks without layers: virtual stage 0 holds only E, the last only L.
  expect_consumers_agree(small({"layout.pp=4", "layout.vp=2", "layout.pipeline_layout=E|t*5|(t*6|)*4,t*3|L"}));
  expect_consumers_agree(small({"layout.pp=4", "layout.pipeline_layout=E|t*16|t*16|L", "layout.zero_stage=3"}));
}

TEST(PipelineSplitConsumers, ActivationsFollowTheRanksOwnChunks) {
  // 30 layers + E + L = 32 slots on pp 4 x vp 2: 4 per chunk, so rank 0 holds chunks of 3
  // layers (+ E) and 4, rank 3 of 4 and 3 (+ L). Each rank's held layer activations are the
  // sum over the chunks in flight of each one's own layers.
  const Experiment e = small({"model.layers=30", "layout.pp=4", "layout.vp=2",
                              "layout.account_for_embedding_in_pipeline_split=true",
                              "layout.account_for_loss_in_pipeline_split=true"});
  const Layout& l = e.layout;
  for (int64_t s = 0; s < l.pp; ++s) {
    const PipelineInflight pin = pipeline_inflight(l, e.model.layers, s, e.training.accumulation(l),
                                                     e.training.overlap_moe_expert_parallel_comm);
    // Forward k runs chunk (k mod p v) / p (Megatron's interleaved order).
    int64_t held = 0;
    for (int64_t k = 0; k < pin.chunks; ++k) {
      const int64_t c = (k % (l.pp * l.vp)) / l.pp;
      held += virtual_stage(e.model.layers, l, virtual_stage_of(l, s, c)).layers;
    }
    EXPECT_EQ(pin.held_layers, held) << s;
    const ActivationBreakdown a = stage_activations(e, s);
    EXPECT_DOUBLE_EQ(a.layers_bytes, static_cast<double>(held) * a.per_layer_bytes) << s;
  }
  // Rank 0: virtual stages 0 (E + 3 layers: 32 slots / 8 = 4) and 4 (4 layers).
  EXPECT_EQ(virtual_stage(30, l, 0).layers, 3);
  EXPECT_EQ(virtual_stage(30, l, 4).layers, 4);
}
