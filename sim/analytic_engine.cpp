// The analytic engine (see sim/analytic_engine.hpp for the model and its sources).
#include "sim/analytic_engine.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <map>
#include <numeric>
#include <optional>
#include <string_view>
#include <unordered_map>

#include "models/precision.hpp"
#include "models/blocks/layer.hpp"
#include "models/combined_1f1b.hpp"
#include "models/compute_cost.hpp"
#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/flops.hpp"
#include "models/memory.hpp"
#include "models/pipeline_split.hpp"
#include "models/schedules/schedule.hpp"
#include "models/zero3.hpp"
#include "sim/collectives/collective.hpp"
#include "sim/collectives/tuner.hpp"

namespace dtsim {

namespace {

double d(int64_t v) { return static_cast<double>(v); }

constexpr int kTP = static_cast<int>(CommKind::TP);
constexpr int kCP = static_cast<int>(CommKind::CP);
constexpr int kPP = static_cast<int>(CommKind::PP);
constexpr int kDP = static_cast<int>(CommKind::DP);
constexpr int kEP = static_cast<int>(CommKind::EP);

/// Advances the compute stream from `t` by `work` seconds of kernels, slowed to `speed`
/// while a communication stream is busy (until `busy_until`). Returns the new time.
double advance(double t, double work, double busy_until, double speed) {
  if (work <= 0) return t;
  if (speed >= 1.0 || busy_until <= t) return t + work;
  const double window = busy_until - t;
  if (window * speed >= work) return t + work / speed;
  return busy_until + (work - window * speed);
}

/// compute + overlapped communication of one layer: the slower of the two, with the compute
/// slowed while the communication runs.
double overlap(double compute, double comm, double speed) {
  if (comm <= 0) return compute;
  if (compute / speed <= comm) return comm;
  return compute + comm * (1.0 - speed);
}

}  // namespace

/// Collective and point-to-point costs on the cluster, as the SimGrid engine runs them alone:
/// the algorithm and protocol NCCL's tuner picks (sim/collectives/tuner.hpp, or the cluster's
/// forced cluster.collectives) and that choice's closed form; P2P is one flow plus the step
/// latency (sim/platform.hpp Platform::alpha). Collective times are cached by (op, group,
/// size): a sweep asks for the same few sizes again and again.
class AnalyticEngine::Comm {
 public:
  explicit Comm(const Experiment& e)
      : cluster_(e.cluster),
        model_(collectives::CommModel::of(e.cluster)),
        ep_routing_(collectives::ep_token_routing(e)),
        ep_choice_(collectives::ep_alltoall_choice(e)) {
    gpn_ = std::max<int64_t>(1, cluster_.gpus_per_node);
    gpus_per_nic_ = std::max<int64_t>(1, gpn_ / std::max<int64_t>(1, cluster_.nics_per_node));
  }
  /// Collective `c` on `size` bytes over n ranks `stride` apart from rank 0 (the folded
  /// engine's representative of stage 0).
  /// `ep`: the MoE token AllToAll of the EP group (its routing, training.moe_token_dispatcher's
  /// algorithm; as the SimGrid engine's run_collective).
  double collective(Collective c, int64_t n, int64_t stride, double size, bool ep = false) {
    if (n <= 1 || size <= 0) return 0.0;
    ep = ep && c == Collective::AllToAll;
    const Key key{static_cast<int>(c) + (ep ? 100 : 0), n, stride, size};
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    std::vector<int64_t> members(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) members[static_cast<size_t>(i)] = i * stride;
    auto g = collectives::GroupLayout::of(std::move(members), gpn_, gpus_per_nic_);
    if (ep) g.routing = ep_routing_;
    const bool forced = ep && ep_choice_;
    const double t = collectives::choose(collectives::to_op(c), g, model_, size,
                                         forced ? *ep_choice_ : cluster_.collectives, forced)
                         .time_s;
    cache_.emplace(key, t);
    return t;
  }
  /// One point-to-point message of `bytes` between ranks `a` and `b` (flow + alpha), with the
  /// fold rule for a NIC shared by several GPUs (sim/collective_exec.hpp flow_bytes).
  double p2p(int64_t a, int64_t b, double bytes) const {
    const bool in = a / gpn_ == b / gpn_;
    const double bw = in ? model_.intra_bw(2) : model_.net_bw / static_cast<double>(gpus_per_nic_);
    const double alpha = in ? cluster_.nvlink.latency : std::max(cluster_.nvlink.latency, cluster_.nic.latency);
    return (bw > 0 ? bytes / bw : 0.0) + alpha;
  }

 private:
  struct Key {
    int c;
    int64_t n, stride;
    double size;
    bool operator==(const Key& o) const { return c == o.c && n == o.n && stride == o.stride && size == o.size; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      // The size's bits (collective() keeps only size > 0: no -0.0 to equal 0.0), mixed.
      size_t h = std::bit_cast<uint64_t>(k.size) * 0x9e3779b97f4a7c15ULL;
      h ^= h >> 29;
      h ^= std::hash<int64_t>()(k.n * 1000003 + k.stride) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
      return h ^ static_cast<size_t>(k.c);
    }
  };
  ClusterSpec cluster_;
  collectives::CommModel model_;
  collectives::TokenRouting ep_routing_;
  std::optional<CollectiveChoice> ep_choice_;
  int64_t gpn_ = 1, gpus_per_nic_ = 1;
  std::unordered_map<Key, double, KeyHash> cache_;
};

// ---------------------------------------------------------------------------------------
// Per-shape segment costs.

struct AnalyticEngine::Shape {
  struct Seg {
    double time = 0;     // wall time on the compute stream
    double compute = 0;  // kernel time at full speed
    double host = 0;     // compute stream idle waiting for the host (models/host_dispatch.hpp)
    double dispatch = 0; // host seconds to dispatch the segment's ops (Op::host_s)
    double host_cold = 0;  // host-bound time of the segment started with no host lead (first copy)
    std::array<double, kCommKinds> total{}, exposed{};
  };
  Seg emb_f, head_f, head_b, emb_b;
  /// One multi-token prediction depth (model.mtp_layers), forward and backward: its entry,
  /// its layer (of the last layer's kind, mtp_kind) and its head, from the proxy of that
  /// kind built with one depth. The stage sums count its layer with the layers
  /// (stage_layer_kinds), so estimate_impl adds mtp_layers x (these - that kind's layer).
  Seg mtp_f, mtp_b;
  int mtp_kind = 0;
  /// One layer of each kind (models/blocks/layer_kind.hpp: dense / MoE x full / local
  /// attention), from its own one-layer proxy; `present` for the kinds the model has.
  struct Layer {
    bool present = false;
    Seg f, b;
    /// f and b merged as one layer of a combined forward-backward pass (models/combined_1f1b.hpp;
    /// training.overlap_moe_expert_parallel_comm), else unset.
    Seg fb;
    double w = 0;                 // W part of b (weight-gradient compute)
    blocks::RankParams params;    // on one rank: dense (DP x CP) and routed experts (EDP)
    /// Its GEMM weights a low-precision recipe quantizes, on one rank (plan.cpp
    /// layer_quantized; zero under bf16). The analytic engine takes every layer of a kind
    /// as low precision (first_last_layers_bf16's BF16 layers are timed as the others).
    blocks::RankParams quantized;
  };
  std::array<Layer, blocks::kLayerKinds> layer;
  /// Compute seconds of the weight-gradient ops (Op::pass W when split: the *_wgrad GEMMs and
  /// the embedding's scatter-add) inside head_b and emb_b: the W of a split backward.
  double head_w = 0, emb_w = 0;
  double adam_bytes_per_param = 0;  // HBM bytes the fused Adam moves per owned parameter
  int32_t adam_kernels = 1;
  double p2p_bytes = 0;             // one pipeline send
  /// The model has host synchronisations (Op::host_sync, dropless MoE layers): the host's
  /// lead does not carry from one segment to the next, and each segment keeps its own
  /// host-bound time from its replay. Without: segments carry no host-bound time of their
  /// own (time = GPU time) and the stage pools the host's lead (estimate_impl).
  bool host_syncs = false;
  double recv_tp_allgather_s = 0;   // TP AllGather after each receive without SP
};

namespace {
/// The ops a zero-bubble schedule defers as W (models/plan.cpp BackwardPart::weight).
bool is_weight_gradient(const Op& op) {
  const std::string_view n(op.name);
  return n == "embedding_bwd" || (n.size() > 6 && n.substr(n.size() - 6) == "_wgrad");
}
}  // namespace

struct AnalyticEngine::StageDetail {
  double compute_s = 0, bubble_s = 0, finish_s = 0, forward_s = 0, backward_s = 0, weight_s = 0, p2p_s = 0,
         slowdown_s = 0, host_bound_s = 0;
  std::array<double, kCommKinds> total{}, exposed{};
};

AnalyticEngine::AnalyticEngine(const Experiment& base)
    : base_(base), scratch_(base), comm_(std::make_unique<Comm>(base)) {}
AnalyticEngine::~AnalyticEngine() = default;

size_t AnalyticEngine::cached_shapes() const { return cache_.size(); }

Experiment AnalyticEngine::experiment(const Layout& layout, int64_t micro_batch) const {
  Experiment e = base_;
  e.layout = layout;
  e.training.micro_batch = micro_batch;
  return e;
}

const AnalyticEngine::Shape& AnalyticEngine::shape(const Layout& l, int64_t mb) {
  const bool sp = l.sequence_parallel && l.tp > 1;
  const auto key = std::make_tuple(l.tp, l.cp, mb, static_cast<int>(l.recompute), sp, l.ep, l.expert_tp());
  auto it = cache_.find(key);
  if (it != cache_.end()) return *it->second;

  Comm& comm = *comm_;
  auto overlap_speed = [&](double sms) {
    return comm_overlap_speed(base_.cluster.gpu, base_.training.comm_interference, sms);
  };
  // Collective times from the real cluster, for the groups of stage 0's first rank: TP (ranks
  // 1 apart), CP (tp apart), the expert groups of parallel folding (models/rank_grid.hpp):
  // ETP (1 apart), EP (etp apart). The proxy has no DP or PP groups.
  const int64_t etp = l.expert_tp();
  auto comm_time = [&](const Op& op) {
    switch (op.group) {
      case GroupKind::TP: return comm.collective(op.collective, l.tp, 1, op.size_bytes);
      case GroupKind::CP: return comm.collective(op.collective, l.cp, l.tp, op.size_bytes);
      case GroupKind::ETP: return comm.collective(op.collective, etp, 1, op.size_bytes);
      case GroupKind::EP: return comm.collective(op.collective, l.ep, etp, op.size_bytes, true);
      default: return 0.0;
    }
  };

  auto sh = std::make_unique<Shape>();
  const auto kinds = model_layer_kinds(base_.model);
  bool edges_done = false;
  for (int kind = 0; kind < blocks::kLayerKinds; ++kind) {
    if (kinds[static_cast<size_t>(kind)] == 0) continue;
    // One-layer proxy of this layer kind: same widths, GPU and training options; one
    // micro-batch; the ranks of one stage that its groups need (TP x CP, and for experts
    // enough DP ranks that etp x ep divides them) on one node (only its ops are read;
    // collective times come from the real cluster above).
    Experiment px = base_;
    px.model.layers = 1;
    // One MTP depth in the proxy of the MTP layers' kind (its ops carry layer index 1).
    px.model.mtp_layers = base_.model.mtp_layers > 0 && kind == blocks::layer_kind(base_.model, base_.model.layers) ? 1 : 0;
    if (px.model.moe.enabled()) {
      px.model.moe.first_k_dense = 0;
      px.model.moe.layer_freq = 1;
      px.model.moe.layer_pattern = {static_cast<uint8_t>(kind & 1)};
    }
    if (px.model.attention.window > 0) px.model.attention.window_pattern = {static_cast<uint8_t>((kind & 2) ? 1 : 0)};
    const int64_t tpcp = l.tp * l.cp;
    const int64_t experts = px.model.moe.enabled() ? etp * l.ep : 1;
    const int64_t dp = std::lcm(tpcp, experts) / tpcp;
    px.layout = Layout{};
    px.layout.tp = l.tp;
    px.layout.cp = l.cp;
    px.layout.dp = dp;
    px.layout.ep = px.model.moe.enabled() ? l.ep : 1;
    px.layout.etp = px.model.moe.enabled() ? l.etp : 0;
    px.layout.sequence_parallel = l.sequence_parallel;
    px.layout.recompute = l.recompute;
    px.training.micro_batch = mb;
    // The one-layer proxy is both the first and the last layer: its kind is timed in the
    // recipe's precision, as most of the model's layers (Shape::Layer::quantized).
    px.training.first_last_layers_bf16 = false;
    // Without ZeRO in the proxy FSDP2 is no valid framework (it is ZeRO-3 only); the DP
    // behaviour of every framework is timed below from models/zero3.hpp, not from the proxy.
    if (px.training.framework == Framework::fsdp) px.training.framework = Framework::megatron;
    px.training.global_batch = mb * dp;
    px.cluster.nodes = 1;
    px.cluster.gpus_per_node = tpcp * dp;
    px.cluster.nics_per_node = 1;
    px.cluster.fabric = "non-blocking";
    const StepPlan plan = build_step_plan(px);
    const StagePlan& st = plan.stages.front();

    Shape::Layer& ly = sh->layer[static_cast<size_t>(kind)];
    ly.present = true;
    // LFB: the layer's forward merged with its backward as one layer of a combined
    // forward-backward pass (models/combined_1f1b.hpp), appended after the proxy's own ops.
    enum Where { EF, LF, HF, HB, LB, EB, LFB, MF, MB, OPT };
    Shape::Seg edge_scratch[6];
    Shape::Seg* segs[] = {edges_done ? &edge_scratch[0] : &sh->emb_f, &ly.f, edges_done ? &edge_scratch[1] : &sh->head_f,
                          edges_done ? &edge_scratch[2] : &sh->head_b, &ly.b, edges_done ? &edge_scratch[3] : &sh->emb_b,
                          &ly.fb, px.model.mtp_layers > 0 ? &sh->mtp_f : &edge_scratch[4],
                          px.model.mtp_layers > 0 ? &sh->mtp_b : &edge_scratch[5], nullptr};
    if (px.model.mtp_layers > 0) sh->mtp_kind = kind;
    std::vector<Op> ops = st.ops;
    std::vector<Where> where(ops.size());
    size_t done_size = 1;  // issue handles of the ops
    {
      bool seen_fwd = false, seen_bwd = false;
      std::vector<Op> lf, rec, lb;
      for (size_t i = 0; i < ops.size(); ++i) {
        const Op& op = ops[i];
        Where w;
        if (op.phase == Phase::optimizer) w = OPT;
        else if (op.layer >= px.model.layers) w = op.phase == Phase::forward ? MF : MB;  // the MTP depth
        else if (op.layer >= 0 && op.phase == Phase::forward) w = LF, seen_fwd = true;
        else if (op.layer >= 0) w = LB, seen_bwd = true;
        else if (!seen_fwd) w = EF;
        else if (!seen_bwd) w = op.phase == Phase::forward ? HF : HB;
        else w = EB;
        where[i] = w;
        if (w == LF) lf.push_back(op);
        if (w == LB) (op.phase == Phase::recompute && l.recompute == Recompute::selective ? rec : lb).push_back(op);
      }
      int32_t handles = st.handles;
      if (base_.training.overlap_moe_expert_parallel_comm) merge_forward_backward(ops, lf, rec, lb, handles);
      where.resize(ops.size(), LFB);
      done_size = static_cast<size_t>(std::max(handles, 1));
    }
    double head_w = 0, emb_w = 0;
    // Replays one segment's ops on one rank: compute stream + one in-order stream per kind.
    struct Replay {
      double t = 0;
      double h = 0;   // host clock (models/host_dispatch.hpp)
      double t0 = 0;  // start of the timed (second) copy
      std::array<double, kCommKinds> free{};
      std::array<double, kCommKinds> sms{};  // SMs of each stream's latest collective (comm_kernel_sms)
      std::vector<double> done;
      Shape::Seg seg;
    };
    std::array<Replay, OPT + 1> rp;
    for (auto& r : rp) r.done.assign(done_size, 0.0);
    // Each segment is replayed twice back to back and timed on the second copy: the host
    // clock's periodic steady state, the lead the previous layer left the host (none after
    // a host_sync; models/host_dispatch.hpp). The first copy's streams are drained first,
    // so without host costs both copies take the same time.
    for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1)
      for (auto& r : rp) {
        for (double f : r.free) r.t = std::max(r.t, f);
        r.t0 = r.t;
        const double cold = r.seg.host;
        r.seg = Shape::Seg{};
        r.seg.host_cold = cold;
      }
    const bool timed = pass == 1;
    for (size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      const Where w = where[i];
      Replay& r = rp[w];
      const int k = static_cast<int>(op.kind);
      // The host dispatches op x; the compute stream starts it no earlier (as the DES).
      auto gate = [&](const Op& x) {
        if (x.host_s <= 0) return;
        r.h += x.host_s;
        r.seg.dispatch += x.host_s;
        if (r.h > r.t) r.seg.host += r.h - r.t, r.t = r.h;
      };
      if (op.host_sync) r.h = std::max(r.h, r.t), sh->host_syncs = true;
      gate(op);
      // The compute stream from r.t by `work` seconds of kernels, slowed while collectives run
      // to the speed of the largest SM holder among them (as the DES engine's run_kernels).
      auto adv = [&](double work) {
        double t = r.t;
        if (work <= 0) return t;
        double busy = 0, most = 0, least = 1e300;
        for (int x = 0; x < kCommKinds; ++x)
          if (r.free[static_cast<size_t>(x)] > t) {
            busy = std::max(busy, r.free[static_cast<size_t>(x)]);
            most = std::max(most, r.sms[static_cast<size_t>(x)]);
            least = std::min(least, r.sms[static_cast<size_t>(x)]);
          }
        if (busy <= t) return t + work;
        if (most == least) return advance(t, work, busy, overlap_speed(most));
        for (;;) {  // piecewise: the holders change as streams finish
          double next = 1e300, sms = 0;
          for (int x = 0; x < kCommKinds; ++x)
            if (r.free[static_cast<size_t>(x)] > t) {
              next = std::min(next, r.free[static_cast<size_t>(x)]);
              sms = std::max(sms, r.sms[static_cast<size_t>(x)]);
            }
          if (next >= 1e300) return t + work;
          const double sp = overlap_speed(sms);
          if ((next - t) * sp >= work) return t + work / sp;
          work -= (next - t) * sp;
          t = next;
        }
      };
      // TP communication overlap (Op::overlap_splits, models/plan.hpp), as the DES engine.
      const Op* next = i + 1 < ops.size() && where[i + 1] == w ? &ops[i + 1] : nullptr;
      if (op.type == OpType::collective && op.overlap_splits > 1 && op.collective == Collective::AllGather && next &&
          next->type == OpType::compute) {
        gate(*next);
        const double n = op.overlap_splits, g = next->time_s;
        const double c = comm_time(op);
        const double done = std::max(r.t, r.free[k]) + c;  // copy engines: no slowdown
        r.seg.total[k] += c;
        r.t += g * (n - 1) / n;
        if (done > r.t) r.seg.exposed[k] += done - r.t, r.t = done;
        r.t += g / n;
        r.seg.compute += g;
        ++i;
        continue;
      }
      if (op.type == OpType::compute && next && next->type == OpType::collective && next->overlap_splits > 1 &&
          next->collective == Collective::ReduceScatter) {
        gate(*next);
        const double m = next->overlap_splits, g = op.time_s;
        r.t = adv(g / m);
        Op part = *next;
        part.size_bytes = next->size_bytes * (m - 1) / m;
        const double c = comm_time(part);
        r.free[k] = std::max(r.t, r.free[k]) + c;
        r.sms[k] = comm_kernel_sms(*next);
        r.seg.total[k] += c;
        r.t = adv(g * (m - 1) / m);
        if (r.free[k] > r.t) r.seg.exposed[k] += r.free[k] - r.t, r.t = r.free[k];
        part.size_bytes = next->size_bytes / m;
        const double last = comm_time(part);
        r.t += last;
        r.seg.total[k] += last;
        r.seg.exposed[k] += last;
        r.seg.compute += g;
        ++i;
        continue;
      }
      auto issue_op = [&](const Op& x) {
        const double c = comm_time(x);
        const int kx = static_cast<int>(x.kind);
        const double start = std::max(r.t, r.free[kx]);
        r.free[kx] = start + c;
        r.sms[kx] = comm_kernel_sms(x);
        if (x.handle >= 0) r.done[static_cast<size_t>(x.handle)] = r.free[kx];
        r.seg.total[kx] += c;
      };
      // CP ring attention (a wait with Op::overlap_splits), as the DES engine.
      if (op.type == OpType::wait && op.overlap_splits > 2) {
        size_t j = i + 1;
        if (j < ops.size() && where[j] == w && ops[j].type == OpType::issue) gate(ops[j]), issue_op(ops[j++]);
        if (j < ops.size() && where[j] == w && ops[j].type == OpType::compute) {
          gate(ops[j]);
          const double blocks = op.overlap_splits - 1, g = ops[j].time_s;
          r.t = adv(g * (blocks - 1) / blocks);
          const double end = op.handle >= 0 ? r.done[static_cast<size_t>(op.handle)] : 0.0;
          if (end > r.t) r.seg.exposed[k] += end - r.t, r.t = end;
          r.t = adv(g / blocks);
          r.seg.compute += g;
          i = j;
          continue;
        }
      }
      switch (op.type) {
        case OpType::compute: {
          if (timed && (w == LB || w == HB || w == EB) && is_weight_gradient(op))
            (w == LB ? ly.w : w == HB ? head_w : emb_w) += op.time_s;
          if (w == OPT) {
            if (op.kernel != KernelKind::optimizer) break;  // the weight casts: per stage below
            if (st.optimizer_params > 0) sh->adam_bytes_per_param = op.bytes / st.optimizer_params;
            sh->adam_kernels = op.kernels;
            break;
          }
          r.t = adv(op.time_s);
          r.seg.compute += op.time_s;
          break;
        }
        case OpType::collective: {
          const double c = comm_time(op);
          r.t += c;
          r.seg.total[k] += c;
          r.seg.exposed[k] += c;
          break;
        }
        case OpType::issue:
          issue_op(op);
          break;
        case OpType::wait: {
          const double end = op.handle >= 0 ? r.done[static_cast<size_t>(op.handle)] : 0.0;
          if (end > r.t) {
            r.seg.exposed[k] += end - r.t;
            r.t = end;
          }
          if (op.host_sync) r.h = std::max(r.h, r.t);  // a stream synchronize (Op::host_sync)
          break;
        }
        case OpType::send:
        case OpType::recv: break;  // pp = 1 in the proxy
      }
    }
    }  // pass
    for (int w = 0; w < OPT; ++w) {
      rp[w].seg.time = rp[w].t - rp[w].t0;
      *segs[w] = rp[w].seg;
    }
    if (!edges_done) sh->head_w = head_w, sh->emb_w = emb_w;
    edges_done = true;
    const blocks::ModelBlocks mbk(base_.model);
    const blocks::Layer& lay = mbk.kind(kind);
    ly.params = {lay.parameters_per_tp_rank(base_.model, l.tp),
                 lay.parameters(base_.model).expert_weights / d(l.ep * etp)};
    if (precision_recipe(base_.training.precision).low_precision())
      ly.quantized = {lay.parameters(base_.model).sharded_weights / d(l.tp),
                      lay.parameters(base_.model).expert_weights / d(l.ep * etp)};
  }
  // The MTP depths (model.mtp_layers) on the rank holding the loss: their layers count with
  // the stage's layers (stage_layer_kinds), their entries and heads with the head segments.
  if (base_.model.mtp_layers > 0) {
    const double n = d(base_.model.mtp_layers);
    const Shape::Layer& L = sh->layer[static_cast<size_t>(sh->mtp_kind)];
    auto fold = [n](Shape::Seg& into, const Shape::Seg& depth, const Shape::Seg& layer) {
      into.time += n * (depth.time - layer.time);
      into.compute += n * (depth.compute - layer.compute);
      into.host += n * (depth.host - layer.host);
      into.dispatch += n * (depth.dispatch - layer.dispatch);
      into.host_cold += n * (depth.host_cold - layer.host_cold);
      for (int k = 0; k < kCommKinds; ++k) {
        into.total[static_cast<size_t>(k)] += n * (depth.total[static_cast<size_t>(k)] - layer.total[static_cast<size_t>(k)]);
        into.exposed[static_cast<size_t>(k)] +=
            n * (depth.exposed[static_cast<size_t>(k)] - layer.exposed[static_cast<size_t>(k)]);
      }
    };
    fold(sh->head_f, sh->mtp_f, L.f);
    fold(sh->head_b, sh->mtp_b, L.b);
  }
  // Without host synchronisations the host's lead carries across segments (a backward's
  // surplus pays for the next forward's deficit): the segments keep their GPU time and the
  // stage pools their host deficits (estimate_impl).
  if (!sh->host_syncs) {
    auto gpu_only = [](Shape::Seg& g) {
      g.time -= g.host;
      g.host = 0;
    };
    for (Shape::Seg* g : {&sh->emb_f, &sh->head_f, &sh->head_b, &sh->emb_b}) gpu_only(*g);
    for (auto& ly : sh->layer) gpu_only(ly.f), gpu_only(ly.b), gpu_only(ly.fb);
    gpu_only(sh->mtp_f), gpu_only(sh->mtp_b);
  }
  // Pipeline messages (Megatron scatter/gather: 1/t of the activation, plan.cpp p2p).
  const double act = 2.0 * d(mb) * d(base_.training.seq_len / l.cp) * d(base_.model.hidden);
  sh->p2p_bytes = act / d(l.tp);
  if (!sp && l.tp > 1) sh->recv_tp_allgather_s = comm.collective(Collective::AllGather, l.tp, 1, act);
  return *cache_.emplace(key, std::move(sh)).first->second;
}

// ---------------------------------------------------------------------------------------

AnalyticEstimate AnalyticEngine::estimate(const Layout& l, int64_t micro_batch) {
  return estimate_impl(l, micro_batch, nullptr);
}

AnalyticEstimate AnalyticEngine::estimate_impl(const Layout& l, int64_t mb, std::vector<StageDetail>* detail) {
  const Shape& sh = shape(l, mb);
  const ClusterSpec& c = base_.cluster;
  const Training& tr = base_.training;
  const ModelSpec& model = base_.model;
  Comm& comm = *comm_;
  const double speed = comm_overlap_speed(c.gpu, tr.comm_interference);

  const int64_t p = l.pp;
  const int64_t v = l.schedule == Schedule::interleaved ? std::max<int64_t>(1, l.vp) : 1;
  const int64_t m = tr.global_batch / (mb * l.dp);
  const sched::PipelineSchedule& sch = sched::schedule_of(l.schedule);
  // Pipeline receives of one micro-batch on rank s, forward and backward: one per chunk
  // whose previous / next virtual stage sits on another rank (the schedule's placement; a
  // V turn is local). Interleaving: v - 1 on the first rank, v elsewhere, as Megatron.
  auto remote_recvs_of = [&](int64_t s) {
    const sched::Dims dd = sched::dims_of(l, tr, m);
    double rf = 0, rb = 0;
    for (int64_t c = 0; c < sch.chunks(dd); ++c) {
      int64_t mb0 = 0;  // a micro-batch the chunk runs (DualPipe: its direction's first)
      while (mb0 + 1 < m && !sch.runs(dd, s, c, mb0)) ++mb0;
      const sched::Place pr = sch.prev(dd, s, c, mb0), nx = sch.next(dd, s, c, mb0);
      rf += pr.valid() && pr.rank != s ? 1.0 : 0.0;
      rb += nx.valid() && nx.rank != s ? 1.0 : 0.0;
    }
    return std::pair<double, double>{rf, rb};
  };
  // Each rank's, worked out once (the forward / backward pass and the stage accounting ask).
  std::vector<std::optional<std::pair<double, double>>> recvs_memo(static_cast<size_t>(std::max<int64_t>(p, 0)));
  auto remote_recvs = [&](int64_t s) {
    auto& r = recvs_memo[static_cast<size_t>(s)];
    if (!r) r = remote_recvs_of(s);
    return *r;
  };
  const int64_t stage_size = l.tp * l.cp * l.dp;
  const int64_t dpcp = l.dp * l.cp;
  // What each pipeline rank holds over its chunks (models/pipeline_split.hpp; uneven stages
  // included): its layers, and whether it holds the embedding (`first`) or the loss (`last`).
  std::vector<RankSplit> ranks;
  for (int64_t s = 0; s < p; ++s) ranks.push_back(rank_split(model.layers, l, s));
  auto layers_of = [&](int64_t s) { return d(ranks[static_cast<size_t>(s)].layers); };
  auto is_first = [&](int64_t s) { return ranks[static_cast<size_t>(s)].embedding; };
  auto is_last = [&](int64_t s) { return ranks[static_cast<size_t>(s)].loss; };
  const double grad_bytes = tr.main_grad == GradDtype::fp32 ? 4.0 : 2.0;  // plan.cpp grad_bytes_per_param
  const double bucket_params = grad_bucket_params(l, tr);  // models/plan.hpp
  // ZeRO-3 as the framework runs it (models/zero3.hpp): DeepSpeed's per-module gathers, kept
  // layers and synchronised backward ends; FSDP2's copy kernels.
  const Zero3Policy z3 = zero3_policy(l, tr);
  auto dp_ring = [&](Collective coll, double bytes) { return comm.collective(coll, dpcp, l.tp, bytes); };

  // Routed experts' gradients and parameters move over the expert-data-parallel group
  // (models/rank_grid.hpp; plan.cpp expert_grads_ready): ranks etp x ep apart in the stage.
  const int64_t edp = l.edp();
  auto edp_ring = [&](Collective coll, double bytes) {
    return edp > 1 ? comm.collective(coll, edp, l.expert_tp() * l.ep, bytes) : 0.0;
  };
  // Per layer kind (models/blocks/layer_kind.hpp): forward and backward wall time of one layer
  // and, with ZeRO-3, its parameter gather and gradient ReduceScatter on the DP stream
  // (every layer gathers its parameters in forward and backward, prefetched one layer ahead;
  // a MoE layer's experts over EDP besides).
  struct KindTime {
    double lf = 0, lb = 0, ag = 0, rs = 0;
    double lb_kept = 0;  // lb of a layer DeepSpeed keeps gathered into its backward (no gather)
  };
  std::array<KindTime, blocks::kLayerKinds> kt{};
  for (int k = 0; k < blocks::kLayerKinds; ++k) {
    const Shape::Layer& L = sh.layer[static_cast<size_t>(k)];
    if (!L.present) continue;
    KindTime& x = kt[static_cast<size_t>(k)];
    x.lf = L.f.time;
    x.lb = L.b.time;
    if (l.zero_stage == 3 && dpcp > 1) {
      // Op::gather_parts collectives of size / parts each (plan.cpp zero3_gather).
      const GatherParts parts = zero3_gather_parts(model, l, tr, k);
      x.ag = d(parts.dense) * dp_ring(Collective::AllGather,
                                      param_gather_bytes(tr, L.params.dense, L.quantized.dense) / d(parts.dense)) +
             d(parts.expert) * edp_ring(Collective::AllGather,
                                        param_gather_bytes(tr, L.params.expert, L.quantized.expert) / d(parts.expert));
      x.rs = dp_ring(Collective::ReduceScatter, L.params.dense * grad_bytes) +
             edp_ring(Collective::ReduceScatter, L.params.expert * grad_bytes);
      // FSDP2's copy-out after each gather and chunk_cat before each ReduceScatter, on the
      // compute stream (plan.cpp wait_gather, fsdp_before_reduce).
      double copy_f = 0, copy_b = 0;
      if (z3.copy_kernels) {
        auto mem = [&](const char* name, double bytes) {
          Op op;
          op.type = OpType::compute;
          op.name = name;
          op.kernel = KernelKind::memory;
          op.bytes = bytes;
          return compute_time(op, base_).seconds;
        };
        copy_f = mem("fsdp_param_copy_out", fsdp_copy_out_bytes(L.params.dense)) +
                 (L.params.expert > 0 && edp > 1 ? mem("fsdp_param_copy_out", fsdp_copy_out_bytes(L.params.expert)) : 0.0);
        copy_b = copy_f + mem("fsdp_grad_copy_in", fsdp_grad_copy_in_bytes(L.params.dense, grad_bytes)) +
                 (L.params.expert > 0 && edp > 1 ? mem("fsdp_grad_copy_in", fsdp_grad_copy_in_bytes(L.params.expert, grad_bytes))
                                                 : 0.0);
      }
      x.lf = overlap(L.f.time + copy_f, x.ag, speed);
      x.lb = overlap(L.b.time + copy_b, x.ag + x.rs, speed);
      x.lb_kept = overlap(L.b.time + copy_b, x.rs, speed);
    }
  }
  // Layers of each kind per pipeline rank.
  std::vector<std::array<int64_t, blocks::kLayerKinds>> rank_kinds;
  for (int64_t s = 0; s < p; ++s) rank_kinds.push_back(stage_layer_kinds(model, l, s));
  // Sum of fn(kind) over the layers counted in n.
  auto over = [&](const std::array<int64_t, blocks::kLayerKinds>& n, auto fn) {
    double x = 0;
    for (int k = 0; k < blocks::kLayerKinds; ++k)
      if (n[static_cast<size_t>(k)] > 0) x += d(n[static_cast<size_t>(k)]) * fn(k);
    return x;
  };
  auto L_ = [&](int k) -> const Shape::Layer& { return sh.layer[static_cast<size_t>(k)]; };
  auto K_ = [&](int k) -> const KindTime& { return kt[static_cast<size_t>(k)]; };
  auto stage_sum = [&](int64_t s, auto fn) { return over(rank_kinds[static_cast<size_t>(s)], fn); };
  // The mean layer of rank s (for the per-chunk terms of ZeRO-3 and overlap_param_gather).
  auto stage_mean = [&](int64_t s, auto fn) {
    const double n = layers_of(s);
    return n > 0 ? stage_sum(s, fn) / n : 0.0;
  };
  auto layer_params_of = [&](int64_t s) { return stage_sum(s, [&](int k) { return L_(k).params.total(); }); };
  // stage_parameters_per_rank of each rank, worked out once (edge_params and the stage loop ask).
  std::vector<std::optional<double>> params_memo(static_cast<size_t>(p));
  auto stage_params = [&](int64_t s) {
    auto& x = params_memo[static_cast<size_t>(s)];
    if (!x) x = stage_parameters_per_rank(model, l, tr.seq_len, s);
    return *x;
  };

  const double t_p2p = p > 1 ? comm.p2p(0, stage_size, sh.p2p_bytes) : 0.0;
  const double ptag = sh.recv_tp_allgather_s;

  // Non-layer parameters of stage s on one rank, as plan.cpp splits them: the first
  // stage's embedding and the last stage's head (final norm + LM head or its tied copy).
  auto edge_params = [&](int64_t s) {
    const bool first = is_first(s), last = is_last(s);
    const double rest = stage_params(s) - layer_params_of(s);
    double head = 0;
    if (first && last)
      head = d(norm_parameters(model)) + (model.tied_embeddings ? 0.0 : d(lm_head_parameters(model)) / d(l.tp)) +
             mtp_entry_parameters_per_rank(model, l.tp);
    else if (last)
      head = rest;
    return std::pair<double, double>{rest - head, head};  // {embedding, head}
  };
  // ZeRO-3, per micro-batch on the DP stream: the head's gradient ReduceScatter sits ahead
  // of the gather of the first layer of the backward, and the embedding's ahead of the
  // next forward's first gather; the first gather of each chunk is not prefetched.
  std::vector<double> z3_edge(static_cast<size_t>(p), 0.0);
  std::vector<double> kept_ag(static_cast<size_t>(p), 0.0);  // gathers DeepSpeed's kept layers skip in backward
  std::vector<double> kept_lb(static_cast<size_t>(p), 0.0);  // and the backward time that saves

  // Per-rank forward / backward of one micro-batch (all its chunks).
  std::vector<double> F(static_cast<size_t>(p)), B(static_cast<size_t>(p));
  // Host dispatch without host synchronisations (models/host_dispatch.hpp): the host's lead
  // carries through the rank's forward and backward, so per micro-batch the GPU waits for
  // the host by what the rank's host time exceeds its GPU time, D = H - W, in the steady
  // state (host_steady, added to the forward), and more in the step's first micro-batch, which
  // starts with no lead (host_startup, beyond the steady share; only the first stage's delays
  // the step, the others wait for it anyway).
  std::vector<double> host_steady(static_cast<size_t>(p), 0.0), host_startup(static_cast<size_t>(p), 0.0);
  double w_max = 0, w_sum = 0;
  for (int64_t s = 0; s < p; ++s) {
    const bool first = is_first(s), last = is_last(s);
    const auto [recv_f, recv_b] = remote_recvs(s);
    double f = stage_sum(s, [&](int k) { return K_(k).lf; }) + (first ? sh.emb_f.time : 0.0) +
               (last ? sh.head_f.time : 0.0) + recv_f * ptag;
    double b = stage_sum(s, [&](int k) { return K_(k).lb; }) + (last ? sh.head_b.time : 0.0) +
               (first ? sh.emb_b.time : 0.0) + recv_b * ptag;
    if (l.zero_stage == 3 && dpcp > 1) {
      // DeepSpeed's kept layers (models/zero3.hpp zero3_kept_layers): their backward gathers nothing.
      if (const int64_t kept = zero3_kept_layers(model, l, tr, s); kept > 0) {
        const int64_t all = model.layers + model.mtp_layers, from = std::max<int64_t>(0, std::min(model.layers, all - kept));
        const auto nk = blocks::layer_kind_counts(model, from, model.layers - from);
        kept_lb[static_cast<size_t>(s)] = over(nk, [&](int k) { return K_(k).lb - K_(k).lb_kept; });
        b -= kept_lb[static_cast<size_t>(s)];
        kept_ag[static_cast<size_t>(s)] = over(nk, [&](int k) { return K_(k).ag; });
      }
      const auto [emb, head] = edge_params(s);
      const double rs_emb = first ? dp_ring(Collective::ReduceScatter, emb * grad_bytes) : 0.0;
      const double rs_head = last ? dp_ring(Collective::ReduceScatter, head * grad_bytes) : 0.0;
      const double z3_ag = stage_mean(s, [&](int k) { return K_(k).ag; });
      z3_edge[static_cast<size_t>(s)] = 2.0 * d(v) * z3_ag + rs_emb + rs_head;
      f += d(v) * z3_ag + rs_emb;
      b += d(v) * z3_ag + rs_head;
    }
    if (!sh.host_syncs) {
      const double hf = stage_sum(s, [&](int k) { return L_(k).f.dispatch; }) + (first ? sh.emb_f.dispatch : 0.0) +
                        (last ? sh.head_f.dispatch : 0.0);
      const double hb = stage_sum(s, [&](int k) { return L_(k).b.dispatch; }) + (last ? sh.head_b.dispatch : 0.0) +
                        (first ? sh.emb_b.dispatch : 0.0);
      const double dd = hf - f + hb - b;
      host_steady[static_cast<size_t>(s)] = std::max(0.0, dd);
      // The first micro-batch from no lead, segment by segment: a segment entered with lead
      // x waits max(0, cold - x) (its waits from no lead are its largest prefix deficit) and
      // leaves the host x + waits + GPU time - host time ahead.
      double lead = 0, waits = 0;
      auto seg = [&](const Shape::Seg& g, double n) {
        for (double i = 0; i < n; ++i) {
          const double w = std::max(0.0, g.host_cold - lead);
          waits += w;
          lead += w + g.time - g.dispatch;
        }
      };
      const auto& nk = rank_kinds[static_cast<size_t>(s)];
      if (first) seg(sh.emb_f, 1);
      for (int k = 0; k < blocks::kLayerKinds; ++k) seg(L_(k).f, d(nk[static_cast<size_t>(k)]));
      if (last) seg(sh.head_f, 1), seg(sh.head_b, 1);
      for (int k = blocks::kLayerKinds - 1; k >= 0; --k) seg(L_(k).b, d(nk[static_cast<size_t>(k)]));
      if (first) seg(sh.emb_b, 1);
      host_startup[static_cast<size_t>(s)] = std::max(0.0, waits - host_steady[static_cast<size_t>(s)]);
      f += host_steady[static_cast<size_t>(s)];
    }
    F[static_cast<size_t>(s)] = f;
    B[static_cast<size_t>(s)] = b;
    w_max = std::max(w_max, f + b);
    w_sum += f + b;
  }
  const double w_mean = w_sum / d(p);
  // Combined forward-backward passes (training.overlap_moe_expert_parallel_comm,
  // sched::Step::paired): per layer kind, what one merged layer pair (Shape::Layer::fb)
  // saves against its forward and backward one after the other, and per rank the paired
  // passes of its order in whole-rank micro-batches (pairs / chunks).
  const bool combined = tr.overlap_moe_expert_parallel_comm;
  const sched::Dims dims = sched::dims_of(l, tr, m);
  std::vector<double> pair_share(static_cast<size_t>(p), 0.0);
  std::vector<std::vector<sched::Step>> orders;
  if (combined || (p > 1 && sch.splits_backward())) orders = sch.order(dims);
  if (combined)
    for (int64_t s = 0; s < p; ++s) {
      double pairs = 0;
      for (const sched::Step& st : orders[static_cast<size_t>(s)]) pairs += st.paired ? 1.0 : 0.0;
      pair_share[static_cast<size_t>(s)] = pairs / d(sch.chunks(dims));
    }
  auto merged = [&](int k, auto part) {  // part(f) + part(b) - part(fb) of one layer of kind k
    const Shape::Layer& L = L_(k);
    return part(L.f) + part(L.b) - part(L.fb);
  };
  auto fb_save = [&](int k) { return merged(k, [](const Shape::Seg& g) { return g.time; }); };
  double t_pipe;
  if (p == 1) t_pipe = d(m) * w_sum - (combined ? pair_share.front() * stage_sum(0, fb_save) : 0.0);
  else if (v > 1) t_pipe = d(m) * w_max + d(p - 1) / d(v) * w_mean + 2.0 * d(p - 1) * t_p2p;
  else t_pipe = w_sum + d(m - 1) * w_max + 2.0 * d(p - 1) * t_p2p;
  // Schedules without a closed form here (zero-bubble, DualPipe): time the schedule's own
  // order (models/schedules/ time_order) with each chunk's F, B and W on its rank.
  // Micro-batches each of a rank's per-micro-batch passes runs: all of them, except under
  // DualPipe, where each direction's chunk runs half (F and B above cover both chunks).
  const double m_rank = sch.params_twice() ? d(m) / 2.0 : d(m);
  if (p > 1 && (sch.splits_backward() || combined)) {
    std::vector<std::vector<sched::ChunkCosts>> costs(static_cast<size_t>(p));
    for (int64_t s = 0; s < p; ++s)
      for (int64_t c = 0; c < sch.chunks(dims); ++c) {
        const VirtualStage vs = virtual_stage(model.layers, l, sch.virtual_stage(dims, s, c));
        auto nk = blocks::layer_kind_counts(model, vs.first_layer, vs.layers);
        if (vs.loss && model.mtp_layers > 0) nk[static_cast<size_t>(sh.mtp_kind)] += model.mtp_layers;  // MTP depths
        const bool recv_fwd = !sch.first(dims, s, c), recv_bwd = !sch.last(dims, s, c);
        sched::ChunkCosts cc;
        cc.f = over(nk, [&](int k) { return K_(k).lf; }) + (vs.embedding ? sh.emb_f.time : 0.0) + (vs.loss ? sh.head_f.time : 0.0) + (recv_fwd ? ptag : 0.0) +
               host_steady[static_cast<size_t>(s)] / d(sch.chunks(dims));
        cc.w = over(nk, [&](int k) { return L_(k).w; }) + (vs.loss ? sh.head_w : 0.0) + (vs.embedding ? sh.emb_w : 0.0);
        cc.b = over(nk, [&](int k) { return K_(k).lb; }) + (vs.loss ? sh.head_b.time : 0.0) + (vs.embedding ? sh.emb_b.time : 0.0) + (recv_bwd ? ptag : 0.0) - cc.w;
        if (combined) cc.fb_save = over(nk, fb_save);
        costs[static_cast<size_t>(s)].push_back(cc);
      }
    t_pipe = sched::time_order(sch, dims, orders, costs, t_p2p).makespan;
  }
  t_pipe += host_startup.front();

  // Distributed optimizer with overlap_param_gather: each layer's gather before its first
  // forward; the first of a chunk waits whole, later ones only past the previous layer.
  // The model's mean layer (a MoE model's layers differ; its experts gather over EDP).
  const auto model_kinds = model_layer_kinds(model);
  auto model_mean = [&](auto fn) { return over(model_kinds, fn) / d(model.layers); };
  if ((l.zero_stage == 1 || l.zero_stage == 2) && dpcp > 1 && tr.overlap_param_gather) {
    const double ag = model_mean([&](int k) {
      return dp_ring(Collective::AllGather, param_gather_bytes(tr, L_(k).params.dense, L_(k).quantized.dense)) +
             edp_ring(Collective::AllGather, param_gather_bytes(tr, L_(k).params.expert, L_(k).quantized.expert));
    });
    const double layer_f = model_mean([&](int k) { return L_(k).f.time; });
    // Each chunk by its own layer count (models/pipeline_split.hpp), chunks of equal count
    // together; a chunk without layers gathers nothing.
    if (l.schedule == Schedule::interleaved && v > 1) {
      // Megatron's aligned chunk gathers (models/plan.cpp aligned_param_gather): every rank
      // launches chunk c's whole gather together; rank 0 waits for chunk 0 whole, chunk 1
      // (queued behind it) and each later chunk c (issued at chunk c - 1's first forward)
      // overlap the p forwards of chunk c - 1 that come first; a wait there delays the
      // whole pipeline once, the other ranks' gathers hide in their warm-up.
      auto rank0_chunk = [&](int64_t ck) { return virtual_stage(model.layers, l, sch.virtual_stage(dims, 0, ck)); };
      double exposed = 0;
      for (int64_t ck = 0; ck < v; ++ck) {
        const VirtualStage vs = rank0_chunk(ck);
        if (vs.layers == 0) continue;
        const auto nk = blocks::layer_kind_counts(model, vs.first_layer, vs.layers);
        const double chunk_ag =
            dp_ring(Collective::AllGather, param_gather_bytes(tr, over(nk, [&](int k) { return L_(k).params.dense; }),
                                                              over(nk, [&](int k) { return L_(k).quantized.dense; }))) +
            edp_ring(Collective::AllGather, param_gather_bytes(tr, over(nk, [&](int k) { return L_(k).params.expert; }),
                                                               over(nk, [&](int k) { return L_(k).quantized.expert; })));
        if (ck == 0) {
          exposed += chunk_ag;
          continue;
        }
        const VirtualStage prev = rank0_chunk(ck - 1);
        const double window =
            d(p) * (over(blocks::layer_kind_counts(model, prev.first_layer, prev.layers),
                          [&](int k) { return L_(k).f.time; }) +
                    (prev.embedding ? sh.emb_f.time : 0.0));
        exposed += overlap(window, chunk_ag, speed) - window;
      }
      t_pipe += exposed;
    } else {
      std::map<int64_t, int64_t> chunks_by_layers;
      if (v == 1)
        for (const RankSplit& r : ranks) ++chunks_by_layers[r.layers];
      else
        for (const VirtualStage& vs : pipeline_split(model, l)) ++chunks_by_layers[vs.layers];
      for (const auto& [chunk_layers, count] : chunks_by_layers) {
        if (chunk_layers == 0) continue;
        const double per_chunk =
            ag + std::max(0.0, d(chunk_layers) - 1.0) * (overlap(layer_f, ag, speed) - layer_f);
        t_pipe += d(count) * per_chunk;  // each stage's first forwards wait in turn (warm-up)
      }
    }
  }

  AnalyticEstimate est;
  est.pipeline_s = t_pipe;
  const double gpus = d(c.gpus());
  double chain = 0;  // backward chain from the first stage
  // Tied word embedding with pp > 1 (plan.cpp finish_step): the first and the last stage SUM
  // their copies' gradients, blocking, after the DP sync and before the optimizer (PP
  // communication, models/result.hpp CommStats); the earlier of the two waits for the other
  // (bubble). One AllReduce over the 2 ranks of the embedding group, (p - 1) stages apart.
  const double emb_ar = loss_stage_embeds(model) && p > 1 && !sch.params_twice() && is_first(0) != is_last(0)
                            ? comm.collective(Collective::AllReduce, 2, (p - 1) * stage_size,
                                              d(model.vocab) * d(model.hidden) / d(l.tp) * grad_bytes)
                            : 0.0;
  std::vector<double> pre_ar(static_cast<size_t>(p), 0.0), finish_of(static_cast<size_t>(p), 0.0);
  std::vector<StageDetail> stage_detail;
  for (int64_t s = 0; s < p; ++s) {
    const bool first = is_first(s), last = is_last(s);
    const double layers_rank = layers_of(s);
    const double params = stage_params(s);
    const double expert_params = stage_sum(s, [&](int k) { return L_(k).params.expert; });
    const double dense_params = params - expert_params;
    const double quantized_dense = stage_sum(s, [&](int k) { return L_(k).quantized.dense; });
    const double quantized_expert = stage_sum(s, [&](int k) { return L_(k).quantized.expert; });
    const double layer_params = layer_params_of(s);
    const double end_bwd = t_pipe - chain;
    chain += B[static_cast<size_t>(s)] / d(v) + t_p2p;

    // Data-parallel gradient reduction after (or during) the last micro-batch's backward.
    double dp_total = 0, dp_exposed = 0, stretch = 0, gather = 0;
    double dp_in_pipe = 0;  // part of dp_exposed already inside F and B (ZeRO-3), not added again
    if (dpcp > 1) {
      if (l.zero_stage == 3) {
        dp_total = m_rank * (stage_sum(s, [&](int k) { return 2.0 * K_(k).ag + K_(k).rs; }) - kept_ag[static_cast<size_t>(s)]);
        dp_exposed = m_rank * (stage_sum(s, [&](int k) { return K_(k).lf - L_(k).f.time + K_(k).lb - L_(k).b.time; }) -
                               kept_lb[static_cast<size_t>(s)] + z3_edge[static_cast<size_t>(s)]);
        dp_in_pipe = dp_exposed;
        // Embedding / head gradients are reduce-scattered after their backward; the last one
        // of the step is exposed (with DeepSpeed's synchronisation after every backward, every
        // micro-batch's: models/zero3.hpp).
        const double edge = params - layer_params;
        const double mean_layer = layers_rank > 0 ? dense_params / layers_rank : 0.0;
        const double tail = dp_ring(Collective::ReduceScatter, std::max(edge, mean_layer) * grad_bytes);
        dp_total += m_rank * dp_ring(Collective::ReduceScatter, edge * grad_bytes);
        dp_exposed += (z3.backward_end_sync ? m_rank : 1.0) * tail;
      } else {
        // The plan's rule (models/plan.hpp grad_sync_policy): ZeRO-2 reduce-scatters every
        // micro-batch's gradients, ZeRO-0/1 on the last one unless reduce_every_micro_batch.
        const GradSyncPolicy gs = grad_sync_policy(l, tr);
        const Collective coll = gs.collective;
        if (!tr.overlap_grad_reduce) {
          // Blocking, once per reducing micro-batch (plan.cpp flush_pending).
          dp_total = (gs.every_micro_batch ? m_rank : 1.0) *
                     (dp_ring(coll, dense_params * grad_bytes) + edp_ring(coll, expert_params * grad_bytes));
          dp_exposed = dp_total;
        } else {
          // The plan's buckets, in backward order: head (last stage), layers, embedding.
          const auto [emb_params, head_only] = edge_params(s);
          // Dense and expert gradients fill buckets of their own (plan.cpp expert_grads_ready),
          // reduced over DP x CP and EDP, on the one DP stream.
          double t = 0, f = 0, pending = 0, pending_ex = 0, work = 0;
          auto send = [&](double x) {
            f = std::max(t, f) + x;
            dp_total += x;
          };
          auto item = [&](double params_ready, double expert_ready, double seconds) {
            t = advance(t, seconds, f, speed);
            work += seconds;
            pending += params_ready;
            pending_ex += expert_ready;
            if (pending >= bucket_params) send(dp_ring(coll, pending * grad_bytes)), pending = 0;
            if (pending_ex >= bucket_params) send(edp_ring(coll, pending_ex * grad_bytes)), pending_ex = 0;
          };
          if (last) item(head_only, 0.0, sh.head_b.time);
          const auto& nk = rank_kinds[static_cast<size_t>(s)];
          for (int k = blocks::kLayerKinds - 1; k >= 0; --k)
            for (int64_t i = 0; i < nk[static_cast<size_t>(k)]; ++i) item(L_(k).params.dense, L_(k).params.expert, K_(k).lb);
          if (first) item(emb_params, 0.0, sh.emb_b.time);
          if (pending_ex > 0) send(edp_ring(coll, pending_ex * grad_bytes));
          if (pending > 0) send(dp_ring(coll, pending * grad_bytes));
          dp_exposed = std::max(0.0, f - t);
          stretch = t - work;
          if (gs.every_micro_batch && m > 1) {
            const double per_mb = dp_total;
            dp_total *= m_rank;
            stretch *= m_rank;
            dp_exposed += d(m - 1) * std::max(0.0, per_mb - (F[static_cast<size_t>(s)] + B[static_cast<size_t>(s)]));
          }
        }
        if ((l.zero_stage == 1 || l.zero_stage == 2) && !tr.overlap_param_gather) {
          gather = dp_ring(Collective::AllGather, param_gather_bytes(tr, dense_params, quantized_dense)) +
                   edp_ring(Collective::AllGather, param_gather_bytes(tr, expert_params, quantized_expert));
        } else if ((l.zero_stage == 1 || l.zero_stage == 2) && tr.overlap_param_gather) {
          const double ag = stage_mean(s, [&](int k) {
            return dp_ring(Collective::AllGather, param_gather_bytes(tr, L_(k).params.dense, L_(k).quantized.dense)) +
                   edp_ring(Collective::AllGather, param_gather_bytes(tr, L_(k).params.expert, L_(k).quantized.expert));
          });
          dp_total += layers_rank * ag;
          // The first gather of each of the rank's chunks that holds layers is exposed.
          int64_t chunks_with_layers = 0;
          for (int64_t c = 0; c < v; ++c)
            if (v == 1 ? layers_rank > 0 : virtual_stage(model.layers, l, virtual_stage_of(l, s, c)).layers > 0)
              ++chunks_with_layers;
          dp_exposed += d(chunks_with_layers) * ag;
        }
      }
      // Per-layer parameter gathers (ZeRO-3; ZeRO-1/2 with overlap_param_gather): the
      // stage's non-layer parameters are gathered after the optimizer (plan.cpp finish_step).
      const double non_layer = params - layer_params;
      if ((l.zero_stage == 3 || ((l.zero_stage == 1 || l.zero_stage == 2) && tr.overlap_param_gather)) &&
          non_layer > 0) {
        gather = dp_ring(Collective::AllGather, non_layer * 2.0);  // counted in total and exposed below
      }
    }
    // Optimizer: fused Adam over the parameters this rank owns (plan.cpp finish_step).
    Op adam;
    adam.kernel = KernelKind::optimizer;
    adam.kernels = sh.adam_kernels;
    // Owned: dense / (DP x CP) and experts / EDP with a sharded optimizer (plan.cpp owned_params).
    const double owned = l.zero_stage >= 1 ? dense_params / d(dpcp) + expert_params / d(edp) : params;
    adam.bytes = owned * sh.adam_bytes_per_param;
    double opt = compute_time(adam, c.gpu, Dtype::bf16);
    if (quantized_dense + quantized_expert > 0) {  // the recipe's weight casts (plan.cpp weight_quantize)
      Op cast;
      cast.kernel = KernelKind::memory;
      cast.bytes = weight_quantize_bytes(tr, quantized_dense + quantized_expert,
                                         l.zero_stage >= 1 ? quantized_dense / d(dpcp) + quantized_expert / d(edp)
                                                           : quantized_dense + quantized_expert);
      opt += compute_time(cast, c.gpu, Dtype::bf16);
    }
    // DualPipe (plan.cpp finish_step): ranks s and p - 1 - s SUM their copies' gradients
    // (the shards they own with a sharded optimizer), blocking, before the optimizer (PP).
    const double mirror_ar =
        sch.params_twice() && 2 * s + 1 != p
            ? comm.collective(Collective::AllReduce, 2, std::abs(p - 1 - 2 * s) * stage_size,
                              owned * grad_bytes)
            : 0.0;
    const double ar = (first != last ? emb_ar : 0.0) + mirror_ar;
    pre_ar[static_cast<size_t>(s)] = end_bwd + stretch + (dp_exposed - dp_in_pipe);
    const double finish = pre_ar[static_cast<size_t>(s)] + ar + opt + gather;  // the AllReduce's wait: below
    est.optimizer_s = std::max(est.optimizer_s, opt);

    // Per-stage accounting (means below).
    const auto [recv_f, recv_b] = remote_recvs(s);
    double comp = stage_sum(s, [&](int k) { return L_(k).f.compute + L_(k).b.compute; }) + (first ? sh.emb_f.compute + sh.emb_b.compute : 0.0) +
                  (last ? sh.head_f.compute + sh.head_b.compute : 0.0);
    comp = m_rank * comp + opt;
    StageDetail sd;
    sd.compute_s = comp;
    // Kernel time lost to overlapping communication (comm_overlap_speed): each segment's
    // wall time beyond its kernels and its exposed communication, plus the DP overlap's.
    {
      auto lost = [](const Shape::Seg& g) {
        double x = g.time - g.compute - g.host;
        for (double e : g.exposed) x -= e;
        return x;
      };
      double per_mb = stage_sum(s, [&](int k) { return lost(L_(k).f) + lost(L_(k).b); });
      if (first) per_mb += lost(sh.emb_f) + lost(sh.emb_b);
      if (last) per_mb += lost(sh.head_f) + lost(sh.head_b);
      const double pairs = pair_share[static_cast<size_t>(s)];  // merged layers: their own figures
      sd.slowdown_s = m_rank * per_mb - (pairs > 0 ? pairs * stage_sum(s, [&](int k) { return merged(k, lost); }) : 0.0) +
                      stretch;
      // Host-bound time (models/host_dispatch.hpp), the segments' own.
      double host = stage_sum(s, [&](int k) { return L_(k).f.host + L_(k).b.host; });
      if (first) host += sh.emb_f.host + sh.emb_b.host;
      if (last) host += sh.head_f.host + sh.head_b.host;
      sd.host_bound_s = m_rank * (host + host_steady[static_cast<size_t>(s)]) + (s == 0 ? host_startup.front() : 0.0);
      if (pairs > 0)
        sd.host_bound_s -= pairs * stage_sum(s, [&](int k) { return merged(k, [](const Shape::Seg& g) { return g.host; }); });
    }
    for (int k : {kTP, kCP, kEP}) {
      const auto kk = static_cast<size_t>(k);
      double tot = stage_sum(s, [&](int x) { return L_(x).f.total[kk] + L_(x).b.total[kk]; });
      double exp = stage_sum(s, [&](int x) { return L_(x).f.exposed[kk] + L_(x).b.exposed[kk]; });
      if (first) {
        tot += sh.emb_f.total[static_cast<size_t>(k)] + sh.emb_b.total[static_cast<size_t>(k)];
        exp += sh.emb_f.exposed[static_cast<size_t>(k)] + sh.emb_b.exposed[static_cast<size_t>(k)];
      }
      if (last) {
        tot += sh.head_f.total[static_cast<size_t>(k)] + sh.head_b.total[static_cast<size_t>(k)];
        exp += sh.head_f.exposed[static_cast<size_t>(k)] + sh.head_b.exposed[static_cast<size_t>(k)];
      }
      if (k == kTP) {
        tot += (recv_f + recv_b) * ptag;
        exp += (recv_f + recv_b) * ptag;
      }
      sd.total[static_cast<size_t>(k)] = m_rank * tot;
      sd.exposed[static_cast<size_t>(k)] = m_rank * exp;
      if (pair_share[static_cast<size_t>(s)] > 0)
        sd.exposed[static_cast<size_t>(k)] -=
            pair_share[static_cast<size_t>(s)] *
            stage_sum(s, [&](int x) { return merged(x, [&](const Shape::Seg& g) { return g.exposed[kk]; }); });
    }
    if (p > 1) {
      // Every message counts at both ends (sender and receiver): its receives and as many
      // sends (recv_f forward receives = as many backward sends, and vice versa).
      sd.total[kPP] = 2.0 * m_rank * (recv_f + recv_b) * t_p2p + ar;
      // The messages a stage waits on outside the steady state: one at each end of the
      // pipeline, two elsewhere; with the order-timed schedules, one per direction in which
      // the rank receives from another rank at all.
      const double waited = sch.splits_backward() ? (recv_f > 0 ? 1.0 : 0.0) + (recv_b > 0 ? 1.0 : 0.0)
                                                  : (first || last ? 1.0 : 2.0);
      sd.exposed[kPP] = waited * t_p2p + ar;
    }
    sd.total[kDP] = dp_total + gather;
    sd.exposed[kDP] = dp_exposed + gather;
    sd.forward_s = F[static_cast<size_t>(s)];
    sd.backward_s = B[static_cast<size_t>(s)];
    sd.weight_s = stage_sum(s, [&](int k) { return L_(k).w; }) + (last ? sh.head_w : 0.0) + (first ? sh.emb_w : 0.0);
    sd.p2p_s = t_p2p;
    for (int k = 0; k < kCommKinds; ++k) {
      est.comm_total_s[static_cast<size_t>(k)] += sd.total[static_cast<size_t>(k)] / d(p);
      est.comm_exposed_s[static_cast<size_t>(k)] += sd.exposed[static_cast<size_t>(k)] / d(p);
    }
    est.compute_s += sd.compute_s / d(p);
    est.host_bound_s += sd.host_bound_s / d(p);
    finish_of[static_cast<size_t>(s)] = finish;
    stage_detail.push_back(sd);
  }
  if (emb_ar > 0) {  // the embedding AllReduce starts when both its stages reached it
    const double start = std::max(pre_ar.front(), pre_ar.back());
    finish_of.front() += start - pre_ar.front();
    if (p > 1) finish_of.back() += start - pre_ar.back();
  }
  for (int64_t s = 0; s < p; ++s) {
    est.step_time_s = std::max(est.step_time_s, finish_of[static_cast<size_t>(s)]);
    stage_detail[static_cast<size_t>(s)].finish_s = finish_of[static_cast<size_t>(s)];
  }
  for (auto& sd : stage_detail) {
    // The stage's step is its compute, slowdown, exposed communication and bubble
    // (models/result.hpp CommStats, as the DES counts them): the bubble is what the
    // rest leaves, the waits on the schedule, on the other embedding stage, and the idle
    // time after the stage's own finish.
    double busy = sd.compute_s + sd.slowdown_s + sd.host_bound_s;
    for (double e : sd.exposed) busy += e;
    sd.bubble_s = est.step_time_s - busy;
  }
  if (detail) *detail = std::move(stage_detail);
  est.bubble_s = std::max(0.0, t_pipe - m_rank * w_mean);

  // Throughput and FLOPs (as sim/simgrid_engine.cpp reports them).
  const double tokens = d(tr.global_batch) * d(tr.seq_len);
  est.model_flops = model_flops_per_step(model, tr.global_batch, tr.seq_len);
  est.hardware_flops = hardware_flops_per_step(model, tr.global_batch, tr.seq_len, l.recompute);
  const double peak = mfu_peak_flops(c.gpu, tr);
  if (est.step_time_s > 0) {
    est.tokens_per_s = tokens / est.step_time_s;
    est.tflops_per_gpu = est.model_flops / est.step_time_s / gpus / 1e12;
    est.mfu = est.model_flops / (est.step_time_s * gpus * peak);
    est.hfu = est.hardware_flops / (est.step_time_s * gpus * peak);
  }

  // Memory: the first and the last stage hold the most (see the header).
  scratch_.layout = l;
  scratch_.training.micro_batch = mb;
  const MemoryBreakdown m0 = stage_memory(scratch_, 0);
  est.peak_memory_bytes = m0.peak_bytes;
  est.capacity_bytes = m0.capacity_bytes;
  est.peak_stage = 0;
  if (p > 1) {
    const MemoryBreakdown ml = stage_memory(scratch_, p - 1);
    if (ml.peak_bytes > est.peak_memory_bytes) {
      est.peak_memory_bytes = ml.peak_bytes;
      est.peak_stage = p - 1;
    }
  }
  est.fits = est.peak_memory_bytes <= est.capacity_bytes;
  return est;
}

StepResult AnalyticEngine::step_result(const Layout& l, int64_t micro_batch) {
  std::vector<StageDetail> detail;
  const AnalyticEstimate est = estimate_impl(l, micro_batch, &detail);
  const Experiment e = experiment(l, micro_batch);
  StepResult r;
  r.experiment = e.title;
  r.engine = "analytic";
  r.folded = true;
  r.gpus = e.cluster.gpus();
  r.simulated_ranks = 0;
  r.time_sources = time_source_counts(build_step_plan(e));  // the plan the SimGrid engine would run
  r.step_time_s = est.step_time_s;
  r.tokens_per_step = d(e.training.global_batch) * d(e.training.seq_len);
  r.tokens_per_s = est.tokens_per_s;
  r.model_flops = est.model_flops;
  r.hardware_flops = est.hardware_flops;
  r.tflops_per_gpu = est.tflops_per_gpu;
  r.hardware_tflops_per_gpu = est.step_time_s > 0 ? est.hardware_flops / est.step_time_s / d(r.gpus) / 1e12 : 0.0;
  r.mfu = est.mfu;
  r.hfu = est.hfu;
  r.compute_s = est.compute_s;
  r.bubble_s = 0;  // mean over stages of the stage bubbles below, as the DES reports it
  for (const auto& sd : detail) r.bubble_s += sd.bubble_s / d(l.pp), r.host_bound_s += sd.host_bound_s / d(l.pp);
  r.optimizer_s = est.optimizer_s;
  const char* names[kCommKinds] = {"TP", "CP", "PP", "DP", "EP"};
  for (int k = 0; k < kCommKinds; ++k) {
    CommStats cs;
    cs.total_s = est.comm_total_s[static_cast<size_t>(k)];
    cs.exposed_s = est.comm_exposed_s[static_cast<size_t>(k)];
    r.comm[names[k]] = cs;
  }
  for (int64_t s = 0; s < l.pp; ++s) {
    const StageDetail& sd = detail[static_cast<size_t>(s)];
    StageResult st;
    st.stage = static_cast<int>(s);
    st.layers = stage_layer_count(e.model, l, s);  // the rank's chunks (models/pipeline_split.hpp)
    st.compute_s = sd.compute_s;
    st.bubble_s = sd.bubble_s;
    st.slowdown_s = sd.slowdown_s;
    st.host_bound_s = sd.host_bound_s;
    st.finish_s = sd.finish_s;
    for (int k = 0; k < kCommKinds; ++k) {
      CommStats cs;
      cs.total_s = sd.total[static_cast<size_t>(k)];
      cs.exposed_s = sd.exposed[static_cast<size_t>(k)];
      st.comm[names[k]] = cs;
    }
    st.memory = stage_memory(e, s);
    r.stages.push_back(std::move(st));
  }
  r.engine_config["model"] = "closed form (sim/analytic_engine.hpp)";
  return r;
}

std::vector<AnalyticEngine::StagePass> AnalyticEngine::stage_passes(const Layout& l, int64_t micro_batch,
                                                                   double* p2p_s) {
  std::vector<StageDetail> detail;
  estimate_impl(l, micro_batch, &detail);
  std::vector<StagePass> out;
  for (const auto& sd : detail) out.push_back({sd.forward_s, sd.backward_s, sd.weight_s});
  if (p2p_s) *p2p_s = detail.empty() ? 0.0 : detail.front().p2p_s;
  return out;
}

StepResult simulate_step_analytic(const Experiment& exp) {
  validate_experiment(exp);
  AnalyticEngine eng(exp);
  StepResult r = eng.step_result(exp.layout, exp.training.micro_batch);
  add_kernel_band(exp, r, r.step_time_s);
  return r;
}

std::pair<double, double> kernel_band_ratios(const Experiment& exp, double nominal_s) {
  validate_experiment(exp);
  auto step = [&](TimeScenario sc) {
    Experiment e = exp;
    e.time_scenario = sc;
    return AnalyticEngine(e).estimate(e.layout, e.training.micro_batch).step_time_s;
  };
  const double nominal = nominal_s > 0 ? nominal_s : step(TimeScenario::nominal);
  if (!(nominal > 0)) return {1.0, 1.0};
  return {step(TimeScenario::fast) / nominal, step(TimeScenario::slow) / nominal};
}

void add_kernel_band(const Experiment& exp, StepResult& r, double nominal_s) {
  const auto [fast, slow] = kernel_band_ratios(exp, nominal_s);
  // The band spans the step under the three scenarios. A step need not move with its kernels
  // monotonically (a host-bound step whose faster kernels wait longer for the CPU, overlap
  // that changes with them), so the fast scenario is not always the low end: ordered, and the
  // nominal step always inside.
  r.step_time_lo_s = r.step_time_s * std::min({fast, slow, 1.0});
  r.step_time_hi_s = r.step_time_s * std::max({fast, slow, 1.0});
}

}  // namespace dtsim
