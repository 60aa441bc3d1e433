// The split of layers, embedding and loss over virtual pipeline stages. Rules and sources:
// models/pipeline_split.hpp.
#include "models/pipeline_split.hpp"

#include <algorithm>
#include <cctype>
#include <limits>
#include <string>

#include "models/errors.hpp"
#include "models/schedules/schedule.hpp"

namespace dtsim {

namespace {

std::string s(int64_t v) { return std::to_string(v); }

std::string quoted(const std::string& text) { return "\"" + text + "\""; }

void check_counts(int64_t layers, const Layout& l) {
  if (layers <= 0) throw InputError("model.layers=" + s(layers) + " must be a positive integer");
  if (l.pp <= 0) throw InputError("layout.pp=" + s(l.pp) + " must be positive");
  if (l.vp <= 0) throw InputError("layout.vp=" + s(l.vp) + " must be a positive integer");
  if (l.vp > std::numeric_limits<int64_t>::max() / l.pp)
    throw InputError("layout.pp*vp=" + s(l.pp) + "*" + s(l.vp) + " does not fit a 64-bit count");
}

// ---- the default rule ----------------------------------------------------------------

// vp == 1: Llama 3's uneven stages (Dubey et al. 2024 Sec 3.3.2), in closed form so that a
// per-stage loop stays linear in pp: every stage gets ceil(L/p), the deficit taken one each in
// the order 0, p-1, 1, p-2, ...
VirtualStage llama3_stage(int64_t layers, int64_t p, int64_t stage) {
  if (layers < p) throw InputError("layout.pp=" + s(p) + " exceeds model.layers=" + s(layers));
  const int64_t base = (layers + p - 1) / p;
  const int64_t deficit = base * p - layers;  // < p
  const int64_t order = stage < p - 1 - stage ? 2 * stage : 2 * (p - 1 - stage) + 1;
  VirtualStage vs;
  vs.layers = base - (order < deficit ? 1 : 0);
  // The stages before `stage` each hold `base` less one for each of them that comes in the
  // removal order before the deficit runs out: of the front stages j (j < p-1-j, order 2j)
  // the first min(p/2, (deficit+1)/2), of the back stages j = p-1-k (order 2k+1) those with
  // k < min(deficit/2, (p-1)/2 + 1).
  const int64_t front = std::min(p / 2, (deficit + 1) / 2);
  const int64_t back = std::min(deficit / 2, (p - 1) / 2 + 1);
  vs.first_layer = stage * base - std::min(stage, front) - std::max<int64_t>(0, stage - (p - back));
  return vs;
}

VirtualStage default_stage(int64_t layers, const Layout& l, int64_t k) {
  if (l.vp == 1) return llama3_stage(layers, l.pp, k);
  const int64_t n = l.pp * l.vp;
  if (layers % n != 0)
    throw InputError("layout.pp*vp=" + s(l.pp) + "*" + s(l.vp) + " does not divide model.layers=" + s(layers) +
                     " (each virtual stage holds a whole number of layers)");
  VirtualStage vs;
  vs.layers = layers / n;
  vs.first_layer = k * vs.layers;
  return vs;
}

// ---- account_for_embedding / account_for_loss ------------------------------------------
// transformer_block.py get_num_layers_to_build: (L + e + l) / pp slots per rank, / vp per
// chunk; virtual stage 0 builds e fewer layers, the last one l fewer.

VirtualStage accounted_stage(int64_t layers, const Layout& l, int64_t k) {
  const bool e = l.account_for_embedding_in_pipeline_split, lo = l.account_for_loss_in_pipeline_split;
  std::string keys;
  if (e) keys = "layout.account_for_embedding_in_pipeline_split=true";
  if (lo) keys += std::string(keys.empty() ? "layout." : ", ") + "account_for_loss_in_pipeline_split=true";
  const int64_t slots = layers + (e ? 1 : 0) + (lo ? 1 : 0);
  const std::string what = "model.layers=" + s(layers) + " + " + s(slots - layers) + " = " + s(slots) + " slots";
  if (slots % l.pp != 0)
    throw InputError(keys + ": " + what + " are not a multiple of layout.pp=" + s(l.pp) +
                     " (Megatron-Core transformer_config.py: num_layers after account_for_* must be divisible by "
                     "pipeline_model_parallel_size)");
  const int64_t per_rank = slots / l.pp;
  if (per_rank % l.vp != 0)
    throw InputError(keys + ": " + what + " give " + s(per_rank) + " per pipeline rank, not a multiple of layout.vp=" +
                     s(l.vp) + " (Megatron-Core transformer_config.py: layers per pipeline rank must be divisible by "
                     "the virtual pipeline size)");
  const int64_t per_chunk = per_rank / l.vp;
  const int64_t n = l.pp * l.vp;
  VirtualStage vs;
  vs.layers = per_chunk - (k == 0 && e ? 1 : 0) - (k == n - 1 && lo ? 1 : 0);
  vs.first_layer = k * per_chunk - (k > 0 && e ? 1 : 0);
  if (vs.layers < 0)  // cannot happen with the checks above; kept as Megatron asserts it
    throw InputError(keys + ": virtual stage " + s(k) + " has not enough slots for its layers");
  return vs;
}

// ---- decoder_first / decoder_last --------------------------------------------------------
// transformer_config.py __post_init__ ("Uneven PP") checks; transformer_block.py
// get_num_layers_to_build and transformer_layer.py get_transformer_layer_offset: rank 0 (pp-1)
// holds `first` (`last`) layers over its vp chunks, the middle ranks share the rest.

VirtualStage first_last_stage(int64_t layers, const Layout& l, int64_t k) {
  const int64_t f = l.decoder_first_pipeline_num_layers, g = l.decoder_last_pipeline_num_layers;
  const std::string fk = "layout.decoder_first_pipeline_num_layers=" + s(f);
  const std::string gk = "layout.decoder_last_pipeline_num_layers=" + s(g);
  if (l.account_for_embedding_in_pipeline_split || l.account_for_loss_in_pipeline_split)
    throw InputError((f > 0 ? fk : gk) +
                     ": cannot be combined with layout.account_for_embedding_in_pipeline_split or "
                     "account_for_loss_in_pipeline_split (Megatron-Core transformer_config.py refuses the pair)");
  const int64_t p = l.pp, v = l.vp;
  if (f > 0 && g > 0 && p < 2)
    throw InputError(fk + ", " + gk.substr(7) + ": setting both needs layout.pp >= 2 (got pp=" + s(p) +
                     "; the first and the last pipeline rank are then the same)");
  for (const auto& [val, key] : {std::pair{f, fk}, std::pair{g, gk}})
    if (val > 0 && val % v != 0)
      throw InputError(key + ": must be a multiple of layout.vp=" + s(v) +
                       " (each of the rank's model chunks holds the same number; Megatron-Core "
                       "transformer_config.py)");
  const int64_t middle_layers = layers - f - g;
  const int64_t middle_ranks = p - (f > 0 ? 1 : 0) - (g > 0 ? 1 : 0);
  const std::string both = f > 0 && g > 0 ? fk + " and " + gk.substr(7) : f > 0 ? fk : gk;
  if (middle_layers < 0)
    throw InputError(both + ": more than model.layers=" + s(layers));
  if ((middle_layers == 0) != (middle_ranks == 0))
    throw InputError(both + ": leave " + s(middle_layers) + " layers for " + s(middle_ranks) +
                     " middle pipeline ranks of layout.pp=" + s(p) +
                     " (both must be zero or both non-zero; Megatron-Core transformer_config.py)");
  int64_t mid_rank = 0;
  if (middle_ranks > 0) {
    if (middle_layers % middle_ranks != 0)
      throw InputError(both + ": the " + s(middle_layers) + " remaining layers do not split evenly over the " +
                       s(middle_ranks) + " middle pipeline ranks (Megatron-Core transformer_config.py)");
    mid_rank = middle_layers / middle_ranks;
    if (mid_rank % v != 0)
      throw InputError(both + ": each middle pipeline rank holds " + s(mid_rank) +
                       " layers, not a multiple of layout.vp=" + s(v) + " (Megatron-Core transformer_config.py)");
  }
  auto per_chunk = [&](int64_t rank) {
    if (rank == 0 && f > 0) return f / v;
    if (rank == p - 1 && g > 0) return g / v;
    return mid_rank / v;
  };
  const int64_t rank = k % p, chunk = k / p;
  const int64_t round = layers / v;  // layers of one chunk index over all ranks
  VirtualStage vs;
  vs.layers = per_chunk(rank);
  vs.first_layer = chunk * round + (rank > 0 ? per_chunk(0) + (rank - 1) * (mid_rank / v) : 0);
  return vs;
}

// ---- pipeline_layout -----------------------------------------------------------------------
// pipeline_parallel_layer_layout.py parse_str_to_list: commas removed, "(...)*n" and "x*n"
// unrolled, stages split at '|', characters E t L m. Parsed here by position so that an error
// can point at the character.

class LayoutParser {
 public:
  LayoutParser(const std::string& text, int64_t cap) : text_(text), cap_(cap) {}

  std::string expand() {
    std::string out;
    size_t pos = 0;
    sequence(pos, false, out);
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw InputError("layout.pipeline_layout=" + quoted(text_) + ": " + why);
  }
  std::string at(size_t pos) const { return " at position " + std::to_string(pos + 1); }

  void append(std::string& out, const std::string& piece, int64_t times) const {
    for (int64_t i = 0; i < times; ++i) {
      if (static_cast<int64_t>(out.size() + piece.size()) > cap_)
        fail("expands to more than " + s(cap_) +
             " items and separators (no valid layout is longer: model.layers t's, E, L and at most model.layers + 1 "
             "'|' between non-empty virtual stages)");
      out += piece;
    }
  }

  // "*n" at `pos` (pos at '*'): returns n.
  int64_t repeat(size_t& pos) const {
    const size_t star = pos++;
    if (pos >= text_.size() || !std::isdigit(static_cast<unsigned char>(text_[pos])))
      fail("'*'" + at(star) + " must be followed by a repeat count");
    int64_t n = 0;
    while (pos < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos]))) {
      n = std::min<int64_t>(n * 10 + (text_[pos] - '0'), cap_ + 1);  // beyond cap + 1 it fails anyway
      ++pos;
    }
    if (pos < text_.size() && text_[pos] == '*')
      fail("'*'" + at(pos) + " repeats a repetition; write one count");
    return n;
  }

  void sequence(size_t& pos, bool in_group, std::string& out) const {
    while (pos < text_.size()) {
      const char c = text_[pos];
      if (c == ',') {  // cosmetic (Megatron removes commas first)
        ++pos;
      } else if (c == '(') {
        if (in_group) fail("nested parentheses" + at(pos) + " are not supported (Megatron-Core's parser does not "
                           "expand them either)");
        const size_t open = pos++;
        std::string group;
        sequence(pos, true, group);
        if (pos >= text_.size() || text_[pos] != ')') fail("'('" + at(open) + " is not closed");
        if (group.empty()) fail("empty parentheses" + at(open));
        ++pos;
        if (pos >= text_.size() || text_[pos] != '*')
          fail("'(...)'" + at(open) + " must be followed by *n (a repeat count)");
        append(out, group, repeat(pos));
      } else if (c == ')') {
        if (in_group) return;
        fail("')'" + at(pos) + " has no matching '('");
      } else if (c == 'E' || c == 't' || c == 'L' || c == 'm' || c == '|') {
        ++pos;
        append(out, std::string(1, c), pos < text_.size() && text_[pos] == '*' ? repeat(pos) : 1);
      } else if (c == '*') {
        fail("'*'" + at(pos) + " must follow an item or a ')'");
      } else {
        fail(std::string("character '") + c + "'" + at(pos) +
             " is not one of E (embedding), t (transformer layer), L (loss), m (MTP), '|', '(', ')', '*n', ','");
      }
    }
  }

  const std::string& text_;
  int64_t cap_;
};

std::vector<VirtualStage> layout_split(int64_t layers, const Layout& l) {
  const std::string& text = l.pipeline_layout;
  auto fail = [&](const std::string& why) {
    throw InputError("layout.pipeline_layout=" + quoted(text) + ": " + why);
  };
  if (l.account_for_embedding_in_pipeline_split || l.account_for_loss_in_pipeline_split ||
      l.decoder_first_pipeline_num_layers > 0 || l.decoder_last_pipeline_num_layers > 0)
    fail("cannot be combined with layout.account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split, "
         "decoder_first_pipeline_num_layers or decoder_last_pipeline_num_layers (Megatron-Core transformer_config.py: "
         "\"pipeline_model_parallel_layout cannot be set with other pipeline layout arguments\")");
  const int64_t n = l.pp * l.vp;
  // A valid layout has `layers` t's, one E, one L and one separator fewer than its virtual
  // stages, of which (dtsim: none empty) there are at most layers + 2: 2 layers + 3 characters.
  const int64_t cap = layers > std::numeric_limits<int64_t>::max() / 4 ? std::numeric_limits<int64_t>::max() / 2
                                                                       : 2 * layers + 3;
  const std::string items = LayoutParser(text, cap).expand();
  std::vector<VirtualStage> out(1);
  std::vector<std::string> stages(1);
  for (const char c : items) {
    if (c == '|') {
      out.emplace_back();
      stages.emplace_back();
      continue;
    }
    stages.back() += c;
    if (c == 'm')
      fail("'m' (a multi-token-prediction layer): dtsim places the model.mtp_layers depths with the loss (L), "
           "Megatron-Core's default; remove it from the layout");
    if (c == 't') ++out.back().layers;
    if (c == 'E') out.back().embedding = true;
    if (c == 'L') out.back().loss = true;
  }
  const int64_t got = static_cast<int64_t>(out.size());
  if (got != n) {
    std::string hint;
    if (got % l.pp == 0) hint = "; Megatron-Core takes vp = stages / pp: set layout.vp=" + s(got / l.pp);
    fail(s(got) + " virtual stages, but layout.pp*vp=" + s(l.pp) + "*" + s(l.vp) + " = " + s(n) + " are needed" + hint);
  }
  const auto count = [&](char c) { return std::count(items.begin(), items.end(), c); };
  if (count('E') != 1) fail("holds " + s(count('E')) + " embeddings (E); exactly one is needed");
  if (count('L') != 1) fail("holds " + s(count('L')) + " losses (L); exactly one is needed");
  if (stages.front().empty() || stages.front().front() != 'E')
    fail("the embedding E must be the first item of virtual stage 0 (Megatron-Core builds it there; "
         "pipeline_parallel_layer_layout.py: \"The first layer must be embedding\")");
  if (stages.back().empty() || stages.back().back() != 'L')
    fail("the loss L must be the last item of the last virtual stage (pipeline_parallel_layer_layout.py: "
         "\"The last layer must be loss\")");
  const int64_t ts = count('t');
  if (ts != layers) fail("holds " + s(ts) + " transformer layers (t), model.layers=" + s(layers));
  int64_t first = 0;
  for (int64_t k = 0; k < n; ++k) {
    VirtualStage& vs = out[static_cast<size_t>(k)];
    if (vs.layers == 0 && !vs.embedding && !vs.loss)
      fail("virtual stage " + s(k) + " (chunk " + s(k / l.pp) + " of pipeline rank " + s(k % l.pp) +
           ") holds nothing; dtsim needs every virtual stage to hold a layer, the embedding or the loss");
    vs.first_layer = first;
    first += vs.layers;
  }
  return out;
}

VirtualStage option_stage(int64_t layers, const Layout& l, int64_t k) {
  if (l.decoder_first_pipeline_num_layers < 0)
    throw InputError("layout.decoder_first_pipeline_num_layers=" + s(l.decoder_first_pipeline_num_layers) +
                     " must be larger than 0 (Megatron-Core transformer_config.py)");
  if (l.decoder_last_pipeline_num_layers < 0)
    throw InputError("layout.decoder_last_pipeline_num_layers=" + s(l.decoder_last_pipeline_num_layers) +
                     " must be larger than 0 (Megatron-Core transformer_config.py)");
  VirtualStage vs;
  if (l.decoder_first_pipeline_num_layers > 0 || l.decoder_last_pipeline_num_layers > 0)
    vs = first_last_stage(layers, l, k);
  else if (l.account_for_embedding_in_pipeline_split || l.account_for_loss_in_pipeline_split)
    vs = accounted_stage(layers, l, k);
  else
    vs = default_stage(layers, l, k);
  vs.embedding = k == 0;
  vs.loss = k == l.pp * l.vp - 1;
  return vs;
}

}  // namespace

bool has_pipeline_split_options(const Layout& l) {
  return l.account_for_embedding_in_pipeline_split || l.account_for_loss_in_pipeline_split ||
         l.decoder_first_pipeline_num_layers != 0 || l.decoder_last_pipeline_num_layers != 0 ||
         !l.pipeline_layout.empty();
}

int64_t virtual_stage_of(const Layout& l, int64_t rank, int64_t chunk) {
  if (rank < 0 || rank >= l.pp)
    throw InputError("pipeline stage " + s(rank) + " is outside [0, layout.pp=" + s(l.pp) + ")");
  if (chunk < 0 || chunk >= chunks_of(l))
    throw InputError("model chunk " + s(chunk) + " is outside [0, " + s(chunks_of(l)) + ") of layout.schedule=" +
                     to_string(l.schedule));
  return sched::schedule_of(l.schedule).virtual_stage(sched::Dims{l.pp, l.vp, 1}, rank, chunk);
}

int64_t chunks_of(const Layout& l) { return sched::schedule_of(l.schedule).chunks(sched::Dims{l.pp, l.vp, 1}); }

VirtualStage virtual_stage(int64_t layers, const Layout& l, int64_t k) {
  check_counts(layers, l);
  const int64_t n = l.pp * l.vp;
  if (k < 0 || k >= n)
    throw InputError("virtual pipeline stage " + s(k) + " is outside [0, layout.pp*vp=" + s(n) + ")");
  if (!l.pipeline_layout.empty()) return layout_split(layers, l)[static_cast<size_t>(k)];
  return option_stage(layers, l, k);
}

std::vector<VirtualStage> pipeline_split(int64_t layers, const Layout& l) {
  check_counts(layers, l);
  if (!l.pipeline_layout.empty()) return layout_split(layers, l);
  const int64_t n = l.pp * l.vp;
  std::vector<VirtualStage> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) out.push_back(option_stage(layers, l, k));
  return out;
}

std::vector<VirtualStage> pipeline_split(const ModelSpec& m, const Layout& l) { return pipeline_split(m.layers, l); }

RankSplit rank_split(int64_t layers, const Layout& l, int64_t rank) {
  check_counts(layers, l);
  if (rank < 0 || rank >= l.pp)
    throw InputError("pipeline stage " + s(rank) + " is outside [0, layout.pp=" + s(l.pp) + ")");
  const std::vector<VirtualStage> split =
      l.pipeline_layout.empty() ? std::vector<VirtualStage>{} : layout_split(layers, l);
  RankSplit out;
  // virtual_stage_of's placement, its range checks met here (rank above, chunk by the loop).
  const sched::PipelineSchedule& sch = sched::schedule_of(l.schedule);
  const sched::Dims dims{l.pp, l.vp, 1};
  const int64_t chunks = sch.chunks(dims);
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t k = sch.virtual_stage(dims, rank, c);
    const VirtualStage vs = split.empty() ? option_stage(layers, l, k) : split[static_cast<size_t>(k)];
    out.layers += vs.layers;
    out.embedding = out.embedding || vs.embedding;
    out.loss = out.loss || vs.loss;
  }
  return out;
}

}  // namespace dtsim
