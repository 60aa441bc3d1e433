// Comparisons of the interpreter's tensors, parameters and Adam moments with the reference.
// Part of the StepPlan interpreter (models/verify/interpreter.cpp, interpreter_impl.hpp).
#include "models/verify/interpreter_impl.hpp"

namespace dtsim::verify {

void Interpreter::Impl::compare_tokens(int rule, const Mat& local, Probe p, int layer, const Lane& L, int mb, bool seq_shard,
                    int64_t col0, const char* when, bool grad) {
  if (!ref) return;
  const Mat& g = ref->probe(p, layer);
  const int64_t rr = local.rows / nd, n = rr / b, cols = local.cols;
  const int64_t off = L.cp * sl + (seq_shard ? L.tp * (sl / t) : 0);
  const double k = grad ? 1.0 / static_cast<double>(dpcp) : 1.0;
  Acc& a = cur_acc(rule);
  // Block by block: the n tokens of one sample of one replica are consecutive rows here
  // and in the reference (global sample, positions off .. off + n - 1).
  for (int64_t dd = 0; dd < nd; ++dd) {
    const RankState& R = rep(L, dd);
    for (int64_t bi = 0; bi < b; ++bi) {
      const int64_t row0 = dd * rr + bi * n, grow0 = sample_of(R, mb, bi) * S + off;
      // The block's largest error first (four running maxima; a NaN sets `nan`);
      // element by element only when it may set the worst.
      double m0 = 0, m1 = 0, m2 = 0, m3 = 0;
      bool nan = false;
      for (int64_t r = 0; r < n; ++r) {
        const double* x = local.row(row0 + r);
        const double* y = g.row(grow0 + r) + col0;
        int64_t j = 0;
        for (; j + 4 <= cols; j += 4) {
          const double e0 = std::fabs(k * x[j] - y[j]), e1 = std::fabs(k * x[j + 1] - y[j + 1]);
          const double e2 = std::fabs(k * x[j + 2] - y[j + 2]), e3 = std::fabs(k * x[j + 3] - y[j + 3]);
          m0 = e0 > m0 ? e0 : m0;
          m1 = e1 > m1 ? e1 : m1;
          m2 = e2 > m2 ? e2 : m2;
          m3 = e3 > m3 ? e3 : m3;
          nan = nan || (e0 != e0) || (e1 != e1) || (e2 != e2) || (e3 != e3);
        }
        for (; j < cols; ++j) {
          const double e = std::fabs(k * x[j] - y[j]);
          m0 = e > m0 ? e : m0;
          nan = nan || e != e;
        }
      }
      const double block_max = std::max(std::max(m0, m1), std::max(m2, m3));
      if (!nan && block_max <= a.max_err && !a.worst.empty()) {
        a.n += n * cols;
        continue;
      }
      for (int64_t r = 0; r < n; ++r) {
        const double* x = local.row(row0 + r);
        const double* y = g.row(grow0 + r) + col0;
        for (int64_t j = 0; j < cols; ++j) {
          const double e = abs_err(k * x[j], y[j]);
          if (e > a.max_err || a.worst.empty())
            record(rule, e, [&] {
              return fmt::format("{} of layer {} (step {}, micro-batch {}, {}, {}): {} vs {}", to_string(p), layer,
                                 step, mb, rank_str(R), when, k * x[j], y[j]);
            });
          else
            ++a.n;
        }
      }
    }
  }
}

bool Interpreter::Impl::probe_of(const Reg& r, bool backward, Probe& p, int& layer) const {
  layer = r.layer;
  switch (r.tag) {
    case Tag::embed_out: p = Probe::embed_out; layer = -1; return true;
    case Tag::attn_out: p = Probe::attn_out; return true;
    case Tag::mlp_out: p = Probe::mlp_out; return true;
    case Tag::norm1: p = Probe::ln1_out; return true;
    case Tag::norm2: p = Probe::ln2_out; return true;
    case Tag::normf: p = Probe::final_ln_out; layer = -1; return true;
    case Tag::dnorm1: p = Probe::d_ln1_out; return true;
    case Tag::dnorm2: p = Probe::d_ln2_out; return true;
    case Tag::dnormf: p = Probe::d_final_ln_out; layer = -1; return true;
    case Tag::d_attn_out: p = Probe::d_x_mid; return true;
    case Tag::d_mlp_out: p = Probe::d_x_out; return true;
    case Tag::stream:
      if (!backward) return false;
      p = Probe::d_x_in;
      return r.layer >= 0;
    default: return false;
  }
}

void Interpreter::Impl::pp_probe(Lane& L, Reg& reg, bool backward) {
  reg.from_pp = false;
  auto it = chunk_layers[sz(L.stage)].find(reg.model_chunk);
  if (it == chunk_layers[sz(L.stage)].end()) return;  // a chunk without layers
  if (backward)
    compare_tokens(kPP, reg.m, Probe::d_x_out, it->second.second, L, reg.mb, reg.seq_shard, 0, "received gradient",
                   true);
  else
    compare_tokens(kPP, reg.m, Probe::x_in, it->second.first, L, reg.mb, reg.seq_shard, 0, "received activation");
}

void Interpreter::Impl::compare_rank(const RankState& R, int s, const std::vector<double>& ref_params,
                  const refmath::AdamState& ref_adam) {
  for (const auto& p : R.params) {
    // The parameter's largest error first; element by element only when it may set the
    // worst value (record's rule), else the count alone.
    double mx = 0;
    int64_t fresh = 0;
    for (int64_t e = 0; e < p.size(); ++e)
      if (p.fresh[sz(e)]) {
        mx = std::max(mx, abs_err(p.value.v[sz(e)], ref_params[sz(p.gidx[sz(e)])]));
        ++fresh;
      }
    Acc& a = cur_acc(kZeRO);
    if (!a.worst.empty() && mx <= a.max_err) {
      a.n += fresh;
    } else {
      for (int64_t e = 0; e < p.size(); ++e) {
        if (!p.fresh[sz(e)]) continue;  // not this step's value yet (gathered before its next use)
        const double want = ref_params[sz(p.gidx[sz(e)])];
        record(kZeRO, abs_err(p.value.v[sz(e)], want), [&] {
          return fmt::format("parameter {} (layer {}) element {} after step {} on {}: {} vs {}", lk_name(p.kind),
                             p.layer, e, s, rank_str(R), p.value.v[sz(e)], want);
        });
      }
    }
    for (size_t k = 0; k < p.adam_idx.size() && k < p.adam.m.size(); ++k) {
      const size_t gi = sz(p.gidx[sz(p.adam_idx[k])]);
      record(kZeRO, std::max(abs_err(p.adam.m[k], ref_adam.m[gi]), abs_err(p.adam.v[k], ref_adam.v[gi])), [&] {
        return fmt::format("Adam moments of {} (layer {}) element {} after step {} on {}", lk_name(p.kind), p.layer,
                           p.adam_idx[k], s, rank_str(R));
      });
    }
  }
}

}  // namespace dtsim::verify
