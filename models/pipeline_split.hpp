#pragma once
// How the model's transformer layers, its embedding and its loss (LM head) are split over
// the pp x vp virtual pipeline stages: the one rule that the plan, FLOPs, memory, the
// analytic engine and the reports read (issue 15 item 3).
//
// Rules, by the Layout options set (Megatron-Core names; read from the Megatron-LM
// sources, not copied):
// - none (dtsim's default):
//     vp == 1: every stage holds ceil(L / pp) layers and the missing ones are taken one each
//       from the first and last stages, then the second and second-to-last, ... (Dubey et
//       al. 2024, "The Llama 3 Herd of Models", Sec 3.3.2: "reduce one Transformer layer
//       each from the first and the last stages"; for pp | L this is L / pp each). Needs
//       pp <= L.
//     vp > 1: L / (pp vp) each; pp vp must divide L (Narayanan 2021 Sec 2.2.2).
// - account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split: the
//     embedding (loss) takes the slot of one transformer layer; the L + e + l slots split
//     evenly: pp | (L + e + l) and, with vp > 1, vp | (L + e + l) / pp; virtual stage 0
//     builds one layer fewer (embedding), the last one fewer (loss), and must keep >= 0.
//     megatron/core/transformer/transformer_block.py get_num_layers_to_build,
//     megatron/core/transformer/transformer_config.py __post_init__ (the divisibility
//     checks), megatron/training/arguments.py validate_args.
// - decoder_first_pipeline_num_layers / decoder_last_pipeline_num_layers (Megatron's
//     --decoder-first/last-pipeline-num-layers, TransformerConfig
//     num_layers_in_first/last_pipeline_stage): pipeline rank 0 (rank pp-1) holds that many
//     layers over all its chunks; the other "middle" ranks share the rest evenly. Each set
//     value > 0 and, with vp > 1, a multiple of vp; middle layers and middle ranks both
//     zero or both non-zero; the middle ranks divide the middle layers and, with vp > 1, vp
//     divides each middle rank's share. Not combinable with account_for_*.
//     Sources: transformer_block.py get_num_layers_to_build, transformer_config.py
//     __post_init__ ("Uneven PP"), megatron/core/transformer/transformer_layer.py
//     get_transformer_layer_offset (layers stay contiguous in virtual-stage order).
// - pipeline_layout (Megatron's --pipeline-model-parallel-layout): one string naming what
//     each virtual stage holds, in model order: E embedding, t transformer layer, L loss,
//     m MTP layer (refused: not modelled), `|` between virtual stages, `X*n` repeats one
//     item n times, `(...)*n` repeats a group, commas are cosmetic. Example
//     "Et*3|(tt|)*29,m|L". megatron/core/transformer/pipeline_parallel_layer_layout.py
//     (parse_str_to_list, validate_layer_layout); arguments.py takes vp = stages / pp, here
//     layout.vp must equal it. Not combinable with the four options above
//     (transformer_config.py: "pipeline_model_parallel_layout cannot be set with other
//     pipeline layout arguments"). Exactly one E, at the start of virtual stage 0, exactly
//     one L, at the end of the last one, model.layers t's. dtsim refuses, beyond Megatron,
//     a virtual stage holding nothing (no t, E or L): nested parentheses, and `(...)` without
//     `*n`, are refused as Megatron's parser leaves them unexpanded.
// In every case the embedding sits on virtual stage 0 and the loss on the last one, and
// layers are contiguous in virtual-stage order (virtual stage k holds layers
// [first_layer, first_layer + layers)).
#include <cstdint>
#include <vector>

#include "models/experiment.hpp"

namespace dtsim {

struct VirtualStage {
  int64_t first_layer = 0;  // index of its first transformer layer (= the layers before it)
  int64_t layers = 0;       // transformer layers it holds; may be 0 when it holds E or L
  bool embedding = false;   // holds the word (and position) embedding: virtual stage 0
  bool loss = false;        // holds the final norm, LM head and loss: the last virtual stage
};

/// True when one of the Megatron-Core split options of Layout is set (else the default rule).
bool has_pipeline_split_options(const Layout& l);

/// Virtual stage of model chunk `chunk` on pipeline rank `rank`: chunk * pp + rank under
/// Megatron's interleaving (Narayanan 2021 Sec 2.2.2; megatron/core/transformer/
/// pipeline_parallel_layer_layout.py: "layout[vpp_rank * pp + pp_rank]"). Every consumer
/// places chunks through this function, never by its own formula. Throws InputError for a
/// rank outside [0, pp) or a chunk outside [0, vp).
/// The placement is the pipeline schedule's (models/schedules/: V-shape schedules put chunk 1
/// of rank r at virtual stage 2 pp - 1 - r; DualPipe's chunk 1 is stage pp - 1 - r again).
int64_t virtual_stage_of(const Layout& l, int64_t rank, int64_t chunk);
/// Model chunks each pipeline rank holds under layout.schedule (vp with interleaving, 2 for
/// the V and DualPipe schedules, else 1).
int64_t chunks_of(const Layout& l);

/// The model's layers split over pp * vp virtual stages, in model order (virtual stage k = chunk k / pp
/// on pipeline rank k % pp under Megatron's interleaving). Throws InputError naming the key and constraint.
std::vector<VirtualStage> pipeline_split(const ModelSpec& m, const Layout& l);
/// The same for a model of `layers` transformer layers (the split reads nothing else of it).
std::vector<VirtualStage> pipeline_split(int64_t layers, const Layout& l);

/// Virtual stage k of pipeline_split(layers, l), in O(1) without pipeline_layout (O(its
/// length) with it), so that a per-rank loop stays linear in pp. Throws as pipeline_split,
/// and for k outside [0, pp vp).
VirtualStage virtual_stage(int64_t layers, const Layout& l, int64_t k);

/// What pipeline rank `rank` holds over all its chunks (virtual_stage_of(l, rank, c), c < vp).
struct RankSplit {
  int64_t layers = 0;      // transformer layers
  bool embedding = false;  // one of its chunks holds the embedding
  bool loss = false;       // one of its chunks holds the loss (final norm, LM head)
};
/// O(vp) without pipeline_layout. Throws as pipeline_split, and for a rank outside [0, pp).
RankSplit rank_split(int64_t layers, const Layout& l, int64_t rank);

}  // namespace dtsim
