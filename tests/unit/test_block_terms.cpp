// The blocks of models/blocks/ as the one description every consumer reads: for every
// shipped experiment (and variants of one: unfused attention, recompute, CP), the plan's
// compute ops of a layer cost the FLOPs the blocks declare (forward; backward = 2 x forward,
// split into B and W; recompute), its GEMMs' declared shapes hold the parameters the blocks
// declare, memory's per-layer and head / embedding activation bytes are the sum of the
// blocks' terms, and every compute op the blocks emit has a calibration kernel in
// `dtsim calibrate --list` (derive_kernels).
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "models/blocks/layer.hpp"
#include "models/blocks/mla.hpp"
#include "models/calibration/plan_kernels.hpp"
#include "models/compute_cost.hpp"
#include "models/experiment_io.hpp"
#include "models/flops.hpp"
#include "models/moe.hpp"
#include "models/memory.hpp"
#include "models/pipeline_split.hpp"
#include "models/plan.hpp"
#include "tests/unit/shipped_files.hpp"

namespace dtsim {
namespace {

using blocks::ActivationTerm;

// Relative agreement of two sums of the same terms added in different orders.
void expect_close(double a, double b, const std::string& what) {
  EXPECT_NEAR(a, b, 1e-12 * std::max(std::abs(a), std::abs(b))) << what;
}

struct LayerOps {
  double forward = 0, backward = 0, recompute = 0;
  std::vector<Op> forward_gemms;
};

// Compute ops of global layer `layer`, micro-batch 0, on `st`.
LayerOps layer_ops(const StagePlan& st, int64_t layer) {
  LayerOps out;
  for (const auto& op : st.ops) {
    if (op.type != OpType::compute || op.layer != layer || op.micro_batch != 0) continue;
    if (op.phase == Phase::forward) {
      out.forward += op.flops;
      if (op.kernel == KernelKind::gemm) out.forward_gemms.push_back(op);
    } else if (op.phase == Phase::backward) {
      out.backward += op.flops;
    } else {
      out.recompute += op.flops;
    }
  }
  return out;
}

double compute_flops(const std::vector<Op>& ops) {
  double f = 0;
  for (const auto& op : ops)
    if (op.type == OpType::compute) f += op.flops;
  return f;
}

// The per-layer rule of memory.hpp layer_activation_bytes, applied to the blocks' terms
// independently of blocks::Layer::activation_bytes.
double kept_bytes(const std::vector<ActivationTerm>& terms, const std::vector<ActivationTerm>& first_block,
                  double t, bool sp, Recompute r) {
  double seq = 0, tensor = 0;
  for (const auto& term : r == Recompute::full ? first_block : terms) {
    if (r == Recompute::full && !term.input) continue;
    if (r == Recompute::selective && term.selective_recomputed) continue;
    (term.split == ActivationTerm::Split::sequence ? seq : tensor) += term.bytes;
  }
  return sp ? (seq + tensor) / t : seq + tensor / t;
}

// ---- FLOPs, parameters, activation terms and kernels of one experiment ----

void check_experiment(const Experiment& e) {
  const ModelSpec& m = e.model;
  const Layout& l = e.layout;
  const double t = static_cast<double>(l.tp);
  const int64_t s_local = e.training.seq_len / l.cp;
  const blocks::ModelBlocks model(m);
  const StepPlan plan = build_step_plan(e);

  for (const auto& st : plan.stages) {
    if (st.layers == 0) continue;
    SCOPED_TRACE("stage " + std::to_string(st.stage));
    const int64_t layer = st.first_layer;
    const blocks::Layer& blk = model.layer(layer);
    const ForwardFlops declared =
        blk.forward_flops(m, static_cast<double>(e.training.micro_batch) * static_cast<double>(s_local),
                          static_cast<double>(e.training.seq_len));
    const double core = declared.attention_scores + declared.attention_values;
    // flops.hpp's figure is the blocks' sum (of layer 0: compared where this layer is of its kind;
    // DeepSeek-V3's first layers are dense, the others MoE).
    const bool like_layer0 = blocks::layer_kind(m, layer) == blocks::layer_kind(m, 0);
    const ForwardFlops f = layer_forward_flops(m, e.training.micro_batch, s_local, e.training.seq_len);
    if (like_layer0) EXPECT_EQ(f.total(), declared.total());

    // The plan's compute FLOPs of the layer: forward = declared / t, backward = 2 x forward,
    // recompute = the forward (full) or the attention core (selective).
    const LayerOps ops = layer_ops(st, layer);
    // A MoE layer's experts run on the busiest EP rank's rows (models/moe.hpp): the declared
    // expert FLOPs (model FLOPs at balance) times its whole-row load factor.
    const MoeTokens tk = moe_tokens(e, static_cast<double>(e.training.micro_batch));
    const double expert_terms = declared.expert_up + declared.expert_gate + declared.expert_down;
    const double load = tk.routed > 0 ? tk.received / tk.routed : 1.0;
    const double executed = declared.total() + (load - 1.0) * expert_terms;
    expect_close(ops.forward, executed / t, "forward");
    expect_close(ops.backward, 2.0 * executed / t, "backward");
    // Full recompute re-runs the forward as executed (the busiest EP rank's experts included).
    const double recompute =
        l.recompute == Recompute::full ? executed : l.recompute == Recompute::selective ? core : 0.0;
    expect_close(ops.recompute, recompute / t, "recompute");

    // Every forward GEMM's declared shape costs its FLOPs (2 m n k); the linear layers'
    // weights (k x n per rank) are the blocks' sharded weights / t.
    double weights = 0, replicated_gemm_weights = 0;
    for (const auto& op : ops.forward_gemms) {
      expect_close(op.flops, 2.0 * static_cast<double>(op.gemm.m) * static_cast<double>(op.gemm.n) *
                                 static_cast<double>(op.gemm.k),
                   op.name);
      // Routed experts' grouped GEMMs hold expert weights (E / ep experts), checked by test_moe_plan.
      // MLA's down projections are duplicated over TP (models/blocks/mla.hpp): replicated weights.
      const std::string name = op.name;
      if (name == "q_down" || name == "kv_down")
        replicated_gemm_weights += static_cast<double>(op.gemm.n) * static_cast<double>(op.gemm.k);
      else if (op.gemm_linear && name.rfind("expert_", 0) != 0)
        weights += static_cast<double>(op.gemm.n) * static_cast<double>(op.gemm.k);
    }
    const blocks::BlockParams p = blk.parameters(m);
    expect_close(weights, p.sharded_weights / t, "GEMM weights");
    if (m.mla.enabled())
      EXPECT_EQ(replicated_gemm_weights, blocks::MlaBlock().parameters(m).replicated_weights -
                                             static_cast<double>(m.mla.q_lora_rank + m.mla.kv_lora_rank));
    EXPECT_EQ(static_cast<double>(layer_parameters_at(m, layer)),
              p.sharded_weights + p.replicated_weights + p.sharded_biases + p.replicated_biases + p.expert_weights);
    if (like_layer0) {
      EXPECT_EQ(static_cast<double>(layer_parameters(m)),
                p.sharded_weights + p.replicated_weights + p.sharded_biases + p.replicated_biases);
      EXPECT_EQ(layer_parameters_per_tp_rank(m, l.tp), blk.parameters_per_tp_rank(m, l.tp));
    }
  }

  // B + W = the fused backward = 2 x forward; W = the linear layers' weight gradients, one
  // forward's worth of the non-attention GEMMs (layer 0 of stage 0).
  if (plan.stages[0].layers > 0 && plan.stages[0].first_layer == 0) {
    const ForwardFlops declared = model.layer(0).forward_flops(
        m, static_cast<double>(e.training.micro_batch) * static_cast<double>(s_local),
        static_cast<double>(e.training.seq_len));
    const double core = declared.attention_scores + declared.attention_values;
    // MoE: the experts' rows at the busiest rank's load (as above).
    const MoeTokens tk = moe_tokens(e, static_cast<double>(e.training.micro_batch));
    const double load = tk.routed > 0 ? tk.received / tk.routed : 1.0;
    const double total = declared.total() + (load - 1.0) * (declared.expert_up + declared.expert_gate + declared.expert_down);
    const auto in = backward_part_ops(e, BackwardPart::input);
    const auto wt = backward_part_ops(e, BackwardPart::weight);
    expect_close(compute_flops(in.layer) + compute_flops(wt.layer), 2.0 * total / t, "B + W");
    expect_close(compute_flops(wt.layer), (total - core) / t, "W");
    expect_close(compute_flops(in.layer), (total + core) / t, "B");
  }

  // Activation terms: memory's per-layer figure, and the embedding / head figures, are
  // the sums of the blocks' terms.
  const double s = static_cast<double>(e.training.seq_len) / static_cast<double>(l.cp);
  const blocks::ActivationShape shape{m, s, static_cast<double>(e.training.micro_batch),
                                      static_cast<double>(e.training.seq_len), e.training.flash_attention};
  const auto terms = model.layer(0).activation_terms(shape);
  std::vector<ActivationTerm> first;
  model.layer(0).block(0).activation_terms(shape, first);
  for (const auto& term : terms) {
    EXPECT_GT(term.bytes, 0) << term.name;
    if (e.training.flash_attention) {
      EXPECT_FALSE(term.selective_recomputed) << term.name;  // no score term with FlashAttention
    }
  }
  const double seq = static_cast<double>(e.training.seq_len);
  for (bool sp : {false, true})
    for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full})
      EXPECT_EQ(layer_activation_bytes(m, s, e.training.micro_batch, seq, l.tp, sp, r, e.training.flash_attention),
                kept_bytes(terms, first, t, sp, r))
          << "sp " << sp << " " << to_string(r);
  const bool sp = l.sequence_parallel;
  // Memory's per-layer figure is the stage's layers' (the layer-0 figure when all are alike).
  EXPECT_EQ(stage_activations(e, 0).per_layer_bytes,
            stage_layer_activation_bytes(e, 0, l.recompute, e.training.flash_attention));
  // (layer_activation_bytes is the BF16 figure: a low-precision recipe keeps GEMM inputs
  // quantized, models/precision.hpp, tests/unit/test_precision.cpp.)
  if (!m.moe.enabled() && m.attention.window <= 0 && e.training.precision == Precision::bf16) {
    EXPECT_EQ(stage_activations(e, 0).per_layer_bytes,
              layer_activation_bytes(m, s, e.training.micro_batch, seq, l.tp, sp, l.recompute,
                                     e.training.flash_attention));
  }
  std::vector<ActivationTerm> emb, head;
  model.embedding().activation_terms(shape, emb);
  model.head().activation_terms(shape, head);
  ASSERT_FALSE(emb.empty());
  ASSERT_FALSE(head.empty());
  double head_seq = 0, head_tensor = 0;
  for (const auto& term : head) (term.split == ActivationTerm::Split::sequence ? head_seq : head_tensor) += term.bytes;
  for (int64_t stage = 0; stage < l.pp; ++stage) {
    const RankSplit holds = rank_split(m.layers, l, stage);
    const ActivationBreakdown act = stage_activations(e, stage);
    const PipelineInflight pin = pipeline_inflight(l, m.layers, stage, e.training.accumulation(l), e.training.overlap_moe_expert_parallel_comm);
    expect_close(act.embedding_bytes,
                 holds.embedding ? static_cast<double>(pin.first_chunk_microbatches) *
                                       kept_bytes(emb, emb, t, sp, Recompute::none)
                                 : 0.0,
                 "embedding, stage " + std::to_string(stage));
    expect_close(act.output_bytes, holds.loss ? (sp ? head_seq / t : head_seq) + head_tensor / t : 0.0,
                 "output, stage " + std::to_string(stage));
  }

  // Every compute op the blocks emit has a kernel in `dtsim calibrate --list`, GEMMs with
  // the shape their block declared; the W part of a split backward too.
  std::set<std::string> listed;
  for (const auto& k : calib::derive_kernels(e)) listed.insert(k.key());
  auto check_kernels = [&](const std::vector<Op>& ops) {
    for (const auto& op : ops) {
      if (op.type != OpType::compute) continue;
      const auto k = calib::kernel_for_op(op, e);
      ASSERT_TRUE(k) << op.name;
      EXPECT_TRUE(listed.count(k->spec.key())) << op.name << ": " << k->spec.key();
      if (op.kernel == KernelKind::gemm) {
        EXPECT_EQ(k->spec.kind, calib::KernelClass::gemm) << op.name;
        EXPECT_GT(op.gemm.m * op.gemm.n * op.gemm.k, 0) << op.name;
        EXPECT_EQ(k->spec.gemm.dtype, op_gemm_dtype(op, e)) << op.name;
      }
    }
  };
  for (const auto& st : plan.stages) check_kernels(st.ops);
  for (BackwardPart part : {BackwardPart::input, BackwardPart::weight}) {
    const auto ops = backward_part_ops(e, part);
    check_kernels(ops.layer);
    check_kernels(ops.head);
    check_kernels(ops.embedding);
  }
}

class BlockTerms : public ::testing::TestWithParam<std::filesystem::path> {};

TEST_P(BlockTerms, PlanFlopsMemoryAndKernelsReadTheBlocks) {
  check_experiment(load_experiment(GetParam().string()));
}

INSTANTIATE_TEST_SUITE_P(Shipped, BlockTerms, ::testing::ValuesIn(test_files::shipped_yaml()), [](const auto& info) {
  std::string n = info.param.stem().string();
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n + "_" + std::to_string(info.index);
});

// The variants the shipped files may not all cover: unfused attention (the score term and
// the attention GEMMs), each recompute mode, CP with and without FlashAttention, GeLU.
TEST(BlockTerms, Variants) {
  const std::string llama = (test_files::kExperiments / "examples" / "llama3-8b-h100.yaml").string();
  const std::string gpt = (test_files::kExperiments / "gpt3-175b-selective.yaml").string();
  for (const auto& [path, overrides] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {llama, {"training.flash_attention=false"}},
           {llama, {"training.flash_attention=false", "layout.recompute=selective"}},
           {llama, {"layout.recompute=full"}},
           {llama, {"layout.cp=2", "training.flash_attention=false"}},
           {llama, {"layout.cp=2"}},
           {gpt, {"training.flash_attention=false", "layout.recompute=none"}},
       }) {
    std::string what = path;
    for (const auto& o : overrides) what += " " + o;
    SCOPED_TRACE(what);
    check_experiment(load_experiment(path, overrides));
  }
}

// Korthikanti 2022 Sec 4.1 per block for a GPT layer (ffn = 4h, MHA, no FlashAttention):
// attention 11sbh + 5as^2b (with its dropout mask, here the residual block's), MLP 19sbh
// (with its dropout mask), the two layer norms 4sbh; 34sbh + 5as^2b in all (Eq. 1).
TEST(BlockTerms, KorthikantiSection41PerBlock) {
  const Experiment e = load_experiment((test_files::kExperiments / "gpt3-175b-selective.yaml").string());
  const ModelSpec& m = e.model;
  ASSERT_EQ(m.ffn_hidden, 4 * m.hidden);
  ASSERT_EQ(m.kv_heads, m.heads);
  const double s = 2048, b = 1, h = static_cast<double>(m.hidden), a = static_cast<double>(m.heads);
  const double sbh = s * b * h;
  const blocks::ActivationShape shape{m, s, b, s, false};
  const blocks::ModelBlocks model(m);
  const blocks::Layer& layer = model.layer(0);
  std::vector<double> per_block;
  for (size_t i = 0; i < layer.spec().size(); ++i) {
    std::vector<ActivationTerm> terms;
    layer.block(i).activation_terms(shape, terms);
    double sum = 0;
    for (const auto& term : terms) sum += term.bytes;
    per_block.push_back(sum);
  }
  // input_norm, attention, residual, post_attention_norm, mlp, residual
  ASSERT_EQ(per_block.size(), 6u);
  EXPECT_EQ(per_block[1] + per_block[2], 11 * sbh + 5 * a * s * s * b);
  EXPECT_EQ(per_block[4] + per_block[5], 19 * sbh);
  EXPECT_EQ(per_block[0] + per_block[3], 4 * sbh);
  EXPECT_EQ(layer_activation_bytes(m, s, 1, s, 1, false, Recompute::none, false),
            korthikanti_table2_layer_bytes(2048, 1, m.hidden, m.heads, 1, false, Recompute::none));
}

}  // namespace
}  // namespace dtsim
