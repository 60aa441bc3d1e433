// Op semantics of the block family: QKV, RoPE, core attention (flash / ring over CP, or unfused), the output projection.
// Part of the StepPlan interpreter (models/verify/interpreter.cpp, interpreter_impl.hpp).
#include "models/verify/interpreter_impl.hpp"

namespace dtsim::verify {

void Interpreter::Impl::cp_kv(int st, const Op& op) {
  std::vector<std::function<void()>> parts;
  for (const auto& g : lane_groups_of(st, op, GroupKind::CP, "cp_kv_allgather")) {
    std::vector<Mat> kvs;
    std::vector<const Doubles*> parts_in;
    int64_t cols = 0;
    for (int li : g) {
      Lane& L = lanes[sz(li)];
      kvs.push_back(pack_kv(need(L, op.layer, op.micro_batch, Slot::k, op, "K (qkv)"),
                            need(L, op.layer, op.micro_batch, Slot::v, op, "V (qkv)")));
      cols = kvs.back().cols;
      if (kvs.back().size() != kvs.front().size()) die(op, "the CP ranks' K/V differ in size");
    }
    for (const Mat& kv : kvs) parts_in.push_back(&kv.v);
    check_size(op, static_cast<double>(kvs.front().v.size() / sz(nd) * g.size()) * kActBytes,
               "K and V of every CP rank");
    Mat all;
    all.v = concat(parts_in);
    all.cols = cols;
    all.rows = static_cast<int64_t>(all.v.size()) / cols;
    parts.push_back([this, g, all = std::move(all), layer = op.layer, mb = op.micro_batch] {
      for (size_t i = 0; i < g.size(); ++i) put(lanes[sz(g[i])], layer, mb, Slot::kv_all, all);
    });
  }
  launch(st, op, [parts] {
    for (const auto& p : parts) p();
  });
}

void Interpreter::Impl::cp_dkv(int st, const Op& op) {
  if (op.type == OpType::issue)
    note("cp_dkv_reducescatter is issued before attention_bwd_remote produces the dK/dV it reduces; the "
         "verifier reads its input at the wait (ring attention streams dK/dV blocks). A plan field such as "
         "Op::input_ready_at_wait would state this instead of the op name");
  const auto gs = lane_groups_of(st, op, GroupKind::CP, "cp_dkv_reducescatter");
  launch(st, op, [this, gs, op, st] {
    t_exec.stage = st;
    for (const auto& g : gs) {
      std::vector<const double*> in;
      size_t len = 0;
      for (int li : g) {
        const Mat& dkv = need(lanes[sz(li)], op.layer, op.micro_batch, Slot::dkv_all, op, "dK/dV of every block");
        if (!in.empty() && dkv.v.size() != len) die(op, "the CP ranks' dK/dV differ in size");
        len = dkv.v.size();
        in.push_back(dkv.v.data());
      }
      check_size(op, static_cast<double>(len / sz(nd)) * kActBytes, "dK/dV of every CP block");
      if (len % g.size() != 0) die(op, "dK/dV do not split over the CP ranks");
      Doubles acc(len);
      reduce_buffers(in.data(), in.size(), len, red(op), acc.data());
      const size_t chunk = len / g.size();
      for (size_t i = 0; i < g.size(); ++i) {
        Lane& L = lanes[sz(g[i])];
        Mat own = Mat::uninitialized(B * sl, 2 * gl * d);
        if (sz(own.size()) != chunk) die(op, "dK/dV blocks do not match the CP ranks' tokens");
        std::copy(acc.begin() + static_cast<std::ptrdiff_t>(i * chunk),
                  acc.begin() + static_cast<std::ptrdiff_t>((i + 1) * chunk), own.v.begin());
        put(L, op.layer, op.micro_batch, Slot::dk, col_range(own, 0, gl * d));
        put(L, op.layer, op.micro_batch, Slot::dv, col_range(own, gl * d, 2 * gl * d));
        if (cp > 1) {
          compare_tokens(kCP, *find(L, op.layer, op.micro_batch, Slot::dk), Probe::dk, op.layer, L, op.micro_batch,
                         false, L.tp * gl * d, "dK at its owner after cp_dkv_reducescatter", true);
          compare_tokens(kCP, *find(L, op.layer, op.micro_batch, Slot::dv), Probe::dv, op.layer, L, op.micro_batch,
                         false, L.tp * gl * d, "dV at its owner after cp_dkv_reducescatter", true);
        }
      }
    }
  });
}

Interpreter::Impl::KV Interpreter::Impl::kv_block(Lane& L, int layer, int mb, int64_t j, const Op& op) {
  if (cp == 1 || j == L.cp) {
    if (j != L.cp) die(op, "K/V block outside the CP group");
    const Mat& k = need(L, layer, mb, Slot::k, op, "K (qkv)");
    const Mat& v = need(L, layer, mb, Slot::v, op, "V (qkv)");
    return {k.v.data(), v.v.data(), k.cols};
  }
  const Mat& all = need(L, layer, mb, Slot::kv_all, op, "K/V of the other CP ranks (cp_kv_allgather)");
  const double* base = all.row(j * B * sl);
  return {base, base + gl * d, all.cols};
}

void Interpreter::Impl::online_block(Lane& L, int layer, int mb, int64_t kb, const Op& op) {
  const Mat& q = need(L, layer, mb, Slot::q, op, "Q (qkv)");
  const KV kv = kv_block(L, layer, mb, kb, op);
  Mat& Mx = *find(L, layer, mb, Slot::att_m);
  Mat& Ls = *find(L, layer, mb, Slot::att_l);
  Mat& Acc = *find(L, layer, mb, Slot::att_acc);
  const int64_t group = al / gl;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> s(sz(sl));
  for (int64_t bi = 0; bi < B; ++bi)
    for (int64_t hh = 0; hh < al; ++hh) {
      const int64_t kh = hh / group;
      for (int64_t tq = 0; tq < sl; ++tq) {
        const int64_t row = bi * sl + tq, qpos = L.cp * sl + tq;
        const double* qr = q.row(row) + hh * d;
        double mx = -INFINITY;
        for (int64_t u = 0; u < sl; ++u) {
          s[sz(u)] = -INFINITY;
          if (!allowed(qpos, kb * sl + u)) continue;
          const double* kr = kv.k + (bi * sl + u) * kv.stride + kh * d;
          double dot = 0;
          for (int64_t x = 0; x < d; ++x) dot += qr[x] * kr[x];
          s[sz(u)] = dot * scale;
          mx = std::max(mx, s[sz(u)]);
        }
        if (mx == -INFINITY) continue;
        const double m_old = Mx.at(row, hh), m_new = std::max(m_old, mx);
        const double f = m_old == -INFINITY ? 0.0 : std::exp(m_old - m_new);
        Ls.at(row, hh) *= f;
        double* acc_r = Acc.row(row) + hh * d;
        for (int64_t x = 0; x < d; ++x) acc_r[x] *= f;
        for (int64_t u = 0; u < sl; ++u) {
          if (s[sz(u)] == -INFINITY) continue;
          const double p = std::exp(s[sz(u)] - m_new);
          Ls.at(row, hh) += p;
          const double* vr = kv.v + (bi * sl + u) * kv.stride + kh * d;
          for (int64_t x = 0; x < d; ++x) acc_r[x] += p * vr[x];
        }
        Mx.at(row, hh) = m_new;
      }
    }
}

void Interpreter::Impl::online_finish(Lane& L, int layer, int mb, const Op& op) {
  const Mat& Mx = need(L, layer, mb, Slot::att_m, op, "the online-softmax state (attention_local)");
  const Mat& Ls = *find(L, layer, mb, Slot::att_l);
  const Mat& Acc = *find(L, layer, mb, Slot::att_acc);
  Mat ctx = Mat::uninitialized(B * sl, al * d), lse = Mat::uninitialized(B * sl, al);
  for (int64_t row = 0; row < B * sl; ++row)
    for (int64_t hh = 0; hh < al; ++hh) {
      lse.at(row, hh) = Mx.at(row, hh) + std::log(Ls.at(row, hh));
      for (int64_t x = 0; x < d; ++x) ctx.at(row, hh * d + x) = Acc.at(row, hh * d + x) / Ls.at(row, hh);
    }
  for (Slot s : {Slot::att_m, Slot::att_l, Slot::att_acc, Slot::kv_all}) drop(L, layer, mb, s);
  put(L, layer, mb, Slot::lse, std::move(lse));
  finish_ctx(L, layer, mb, std::move(ctx), op);
}

void Interpreter::Impl::finish_ctx(Lane& L, int layer, int mb, Mat ctx, const Op& op) {
  if (cp > 1) compare_tokens(kCP, ctx, Probe::ctx, layer, L, mb, false, L.tp * al * d, "attention output");
  Reg& c = L.cur[phase_ix(op.phase)];
  c = Reg{};
  c.m = ctx;
  c.tag = Tag::ctx;
  c.layer = layer;
  c.mb = mb;
  put(L, layer, mb, Slot::ctx, std::move(ctx));
  drop(L, layer, mb, Slot::kv_all);
}

void Interpreter::Impl::flash_bwd_block(Lane& L, int layer, int mb, int64_t kb, const Op& op) {
  const Mat& q = need(L, layer, mb, Slot::q, op, "Q");
  const Mat& ctx = need(L, layer, mb, Slot::ctx, op, "the attention output (forward or recompute)");
  const Mat& lse = need(L, layer, mb, Slot::lse, op, "the softmax log-sum-exp (forward or recompute)");
  const Mat& dctx = need(L, layer, mb, Slot::dctx, op, "the attention output gradient (out_proj_dgrad)");
  const KV kv = kv_block(L, layer, mb, kb, op);
  Mat* dq = find(L, layer, mb, Slot::dq);
  if (!dq) dq = &put(L, layer, mb, Slot::dq, Mat(B * sl, al * d));
  Mat* dkv = find(L, layer, mb, Slot::dkv_all);
  if (!dkv) dkv = &put(L, layer, mb, Slot::dkv_all, Mat(cp * B * sl, 2 * gl * d));
  const int64_t group = al / gl, kvw = gl * d;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int64_t bi = 0; bi < B; ++bi)
    for (int64_t hh = 0; hh < al; ++hh) {
      const int64_t kh = hh / group;
      for (int64_t tq = 0; tq < sl; ++tq) {
        const int64_t row = bi * sl + tq, qpos = L.cp * sl + tq;
        const double* qr = q.row(row) + hh * d;
        const double* dor = dctx.row(row) + hh * d;
        const double* orow = ctx.row(row) + hh * d;
        double* dqr = dq->row(row) + hh * d;
        double D = 0;
        for (int64_t x = 0; x < d; ++x) D += dor[x] * orow[x];
        for (int64_t u = 0; u < sl; ++u) {
          if (!allowed(qpos, kb * sl + u)) continue;
          const int64_t krow = bi * sl + u, drow = kb * B * sl + krow;
          const double* kr = kv.k + krow * kv.stride + kh * d;
          const double* vr = kv.v + krow * kv.stride + kh * d;
          double dot = 0, dp = 0;
          for (int64_t x = 0; x < d; ++x) {
            dot += qr[x] * kr[x];
            dp += dor[x] * vr[x];
          }
          const double p = std::exp(dot * scale - lse.at(row, hh));
          const double ds = p * (dp - D) * scale;
          double* dk_r = dkv->row(drow) + kh * d;
          double* dv_r = dkv->row(drow) + kvw + kh * d;
          for (int64_t x = 0; x < d; ++x) {
            dv_r[x] += p * dor[x];
            dqr[x] += ds * kr[x];
            dk_r[x] += ds * qr[x];
          }
        }
      }
    }
}

std::vector<double>& Interpreter::Impl::block_t(const double* rows, int64_t stride, int64_t n, int64_t width) {
  thread_local std::vector<double> t;
  t.resize(sz(n * width));
  for (int64_t u = 0; u < n; ++u)
    for (int64_t x = 0; x < width; ++x) t[sz(x * n + u)] = rows[u * stride + x];
  return t;
}

void Interpreter::Impl::scores(Lane& L, int layer, int mb, const Op& op) {
  const Mat& q = need(L, layer, mb, Slot::q, op, "Q (qkv)");
  Mat sc = Mat::uninitialized(B * al * sl, cp * sl);  // every element written below
  const int64_t group = al / gl;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int64_t j = 0; j < cp; ++j) {
    const KV kv = kv_block(L, layer, mb, j, op);
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t hh = 0; hh < al; ++hh) {
        // S = Q K^T (each dot product from 0), then scaled where the mask allows.
        const std::vector<double>& kt = block_t(kv.k + bi * sl * kv.stride + (hh / group) * d, kv.stride, sl, d);
        double* sb = sc.row((bi * al + hh) * sl) + j * sl;
        gemm_ld(q.row(bi * sl) + hh * d, q.cols, kt.data(), sl, sb, sc.cols, sl, d, sl, false);
        for (int64_t tq = 0; tq < sl; ++tq)
          for (int64_t u = 0; u < sl; ++u) {
            double& x = sb[tq * sc.cols + u];
            x = allowed(L.cp * sl + tq, j * sl + u) ? x * scale : -INFINITY;
          }
      }
  }
  put(L, layer, mb, Slot::probs, std::move(sc));
}

void Interpreter::Impl::values(Lane& L, int layer, int mb, const Op& op) {
  const Mat& p = need(L, layer, mb, Slot::probs, op, "the attention probabilities (softmax_dropout)");
  Mat ctx(B * sl, al * d);
  const int64_t group = al / gl;
  for (int64_t j = 0; j < cp; ++j) {
    const KV kv = kv_block(L, layer, mb, j, op);
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t hh = 0; hh < al; ++hh)  // ctx += P V over the block's keys, in key order
        gemm_ld(p.row((bi * al + hh) * sl) + j * sl, p.cols, kv.v + bi * sl * kv.stride + (hh / group) * d,
                kv.stride, ctx.row(bi * sl) + hh * d, ctx.cols, sl, sl, d, true);
  }
  finish_ctx(L, layer, mb, std::move(ctx), op);
}

void Interpreter::Impl::attention_bwd_done(Lane& L, const Op& op) {
  const int Ly = op.layer, mb = op.micro_batch;
  if (cp > 1)
    compare_tokens(kCP, need(L, Ly, mb, Slot::dq, op, "dQ"), Probe::dq, Ly, L, mb, false, L.tp * al * d,
                   "dQ after attention backward", true);
  if (cp == 1) {
    const Mat& dkv = need(L, Ly, mb, Slot::dkv_all, op, "dK/dV");
    put(L, Ly, mb, Slot::dk, col_range(dkv, 0, gl * d));
    put(L, Ly, mb, Slot::dv, col_range(dkv, gl * d, 2 * gl * d));
  }
  set_chain(L, op, Mat(1, 1), Tag::d_qkv, false, false);
}

/// QKV, RoPE, core attention (flash / ring over CP, or unfused), the output projection.
void Interpreter::Impl::attention_op(Lane& L, Fn fn, const Op& op) {
  [[maybe_unused]] const int Ly = op.layer, mb = op.micro_batch;
  switch (fn) {
    case Fn::qkv: {
      const Reg& c = expect(L, op, {Tag::norm1}, "the input_norm output", true);
      const LK qkv_b = LK::qkv_b;
      Mat y = linear(L, c.m, LK::qkv_w, Ly, op, M.bias ? &qkv_b : nullptr);
      put(L, Ly, mb, Slot::q, col_range(y, 0, al * d));
      put(L, Ly, mb, Slot::k, col_range(y, al * d, (al + gl) * d));
      put(L, Ly, mb, Slot::v, col_range(y, (al + gl) * d, (al + 2 * gl) * d));
      set_chain(L, op, Mat(1, 1), Tag::qkv, false, false);  // marker: Q, K, V live in slots
      break;
    }
    case Fn::rope: {
      const auto pos = positions(L, B * sl, false);
      rope_apply(need(L, Ly, mb, Slot::q, op, "Q"), al, d, pos, false);
      rope_apply(need(L, Ly, mb, Slot::k, op, "K"), gl, d, pos, false);
      break;
    }
    case Fn::attention:
      if (cp > 1) die(op, "unsplit attention with CP > 1: the other ranks' K/V blocks are never used");
      online_init(L, Ly, mb);
      online_block(L, Ly, mb, L.cp, op);
      online_finish(L, Ly, mb, op);
      break;
    case Fn::attention_local:
      online_init(L, Ly, mb);
      online_block(L, Ly, mb, L.cp, op);
      break;
    case Fn::attention_remote:
      for (int64_t j = 0; j < cp; ++j)
        if (j != L.cp) online_block(L, Ly, mb, j, op);
      online_finish(L, Ly, mb, op);
      break;
    case Fn::attention_scores: scores(L, Ly, mb, op); break;
    case Fn::softmax_dropout: {
      Mat& p = need(L, Ly, mb, Slot::probs, op, "the attention scores");
      for (int64_t i = 0; i < p.rows; ++i) {
        double* pi = p.row(i);
        double mx = -INFINITY, z = 0;
        for (int64_t j = 0; j < p.cols; ++j) mx = std::max(mx, pi[j]);
        for (int64_t j = 0; j < p.cols; ++j) z += (pi[j] = pi[j] == -INFINITY ? 0.0 : std::exp(pi[j] - mx));
        for (int64_t j = 0; j < p.cols; ++j) pi[j] /= z;
      }
      break;
    }
    case Fn::attention_values: values(L, Ly, mb, op); break;
    case Fn::out_proj: {
      const Reg& c = expect(L, op, {Tag::ctx}, "the attention output", true);
      set_chain(L, op, linear(L, c.m, LK::out_w, Ly, op), Tag::attn_out, true, false);
      break;
    }
    case Fn::out_proj_dgrad: {
      Reg& c = expect(L, op, {Tag::d_attn_out}, "the out_proj output gradient", true);
      Mat dctx = linear_nt(L, c.m, LK::out_w, Ly, op);
      put(L, Ly, mb, Slot::d_branch, std::move(c.m));
      put(L, Ly, mb, Slot::dctx, dctx);
      set_chain(L, op, std::move(dctx), Tag::d_ctx, false, false);
      break;
    }
    case Fn::out_proj_wgrad:
      wgrad(L, LK::out_w, Ly, need(L, Ly, mb, Slot::ctx, op, "the attention output (forward or recompute)"),
            need(L, Ly, mb, Slot::d_branch, op, "the out_proj output gradient"), op);
      break;
    case Fn::attention_bwd:
      if (cp > 1) die(op, "unsplit attention backward with CP > 1");
      flash_bwd_block(L, Ly, mb, L.cp, op);
      attention_bwd_done(L, op);
      break;
    case Fn::attention_bwd_local:
      flash_bwd_block(L, Ly, mb, L.cp, op);
      break;
    case Fn::attention_bwd_remote:
      for (int64_t j = 0; j < cp; ++j)
        if (j != L.cp) flash_bwd_block(L, Ly, mb, j, op);
      attention_bwd_done(L, op);
      break;
    case Fn::attention_values_bwd: {
      const Mat& p = need(L, Ly, mb, Slot::probs, op, "the attention probabilities (forward or recompute)");
      const Mat& dctx = need(L, Ly, mb, Slot::dctx, op, "the attention output gradient");
      Mat dp = Mat::uninitialized(p.rows, p.cols);  // every element written below
      Mat dkv(cp * B * sl, 2 * gl * d);
      const int64_t group = al / gl, kvw = gl * d;
      for (int64_t j = 0; j < cp; ++j) {
        const KV kv = kv_block(L, Ly, mb, j, op);
        for (int64_t bi = 0; bi < B; ++bi)
          for (int64_t hh = 0; hh < al; ++hh) {
            const int64_t kh = hh / group;
            const double* dob = dctx.row(bi * sl) + hh * d;
            const double* pb = p.row((bi * al + hh) * sl) + j * sl;
            // dP = dO V^T (each from 0); dV += P^T dO, over the queries in order (heads of
            // a KV group one after another).
            const std::vector<double>& vt = block_t(kv.v + bi * sl * kv.stride + kh * d, kv.stride, sl, d);
            gemm_ld(dob, dctx.cols, vt.data(), sl, dp.row((bi * al + hh) * sl) + j * sl, dp.cols, sl, d, sl, false);
            gemm_tn_ld(pb, p.cols, dob, dctx.cols, dkv.row(j * B * sl + bi * sl) + kvw + kh * d, dkv.cols, sl, sl, d,
                       true);
          }
      }
      put(L, Ly, mb, Slot::dprobs, std::move(dp));
      put(L, Ly, mb, Slot::dkv_all, std::move(dkv));
      break;
    }
    case Fn::softmax_dropout_bwd: {
      const Mat& p = need(L, Ly, mb, Slot::probs, op, "the attention probabilities");
      Mat& dp = need(L, Ly, mb, Slot::dprobs, op, "the probabilities gradient (attention_values_bwd)");
      for (int64_t i = 0; i < p.rows; ++i) {
        const double* pi = p.row(i);
        double* di = dp.row(i);
        double s = 0;
        for (int64_t j = 0; j < p.cols; ++j) s += pi[j] * di[j];
        for (int64_t j = 0; j < p.cols; ++j) di[j] = pi[j] * (di[j] - s);
      }
      break;
    }
    case Fn::attention_scores_bwd: {
      const Mat& q = need(L, Ly, mb, Slot::q, op, "Q");
      const Mat& ds = need(L, Ly, mb, Slot::dprobs, op, "the scores gradient (softmax_dropout_bwd)");
      Mat& dkv = need(L, Ly, mb, Slot::dkv_all, op, "dV (attention_values_bwd)");
      Mat dq(B * sl, al * d);
      const int64_t group = al / gl;
      const double scale = 1.0 / std::sqrt(static_cast<double>(d));
      for (int64_t j = 0; j < cp; ++j) {
        const KV kv = kv_block(L, Ly, mb, j, op);
        for (int64_t bi = 0; bi < B; ++bi)
          for (int64_t hh = 0; hh < al; ++hh)
            for (int64_t tq = 0; tq < sl; ++tq) {
              const double* qr = q.row(bi * sl + tq) + hh * d;
              double* dqr = dq.row(bi * sl + tq) + hh * d;
              for (int64_t u = 0; u < sl; ++u) {
                const double g = ds.at((bi * al + hh) * sl + tq, j * sl + u) * scale;
                if (g == 0) continue;
                const int64_t kh = hh / group;
                const double* kr = kv.k + (bi * sl + u) * kv.stride + kh * d;
                double* dkr = dkv.row(j * B * sl + bi * sl + u) + kh * d;
                for (int64_t e = 0; e < d; ++e) {
                  dqr[e] += g * kr[e];
                  dkr[e] += g * qr[e];
                }
              }
            }
      }
      put(L, Ly, mb, Slot::dq, std::move(dq));
      drop(L, Ly, mb, Slot::dprobs);
      attention_bwd_done(L, op);
      break;
    }
    case Fn::rope_bwd: {
      const auto pos = positions(L, B * sl, false);
      rope_apply(need(L, Ly, mb, Slot::dq, op, "dQ"), al, d, pos, true);
      rope_apply(need(L, Ly, mb, Slot::dk, op, "dK (after cp_dkv_reducescatter)"), gl, d, pos, true);
      break;
    }
    case Fn::qkv_dgrad: {
      expect(L, op, {Tag::d_qkv}, "dQ, dK, dV", true);
      const Mat& dq = need(L, Ly, mb, Slot::dq, op, "dQ");
      const Mat& dk = need(L, Ly, mb, Slot::dk, op, "dK at its owner (cp_dkv_reducescatter)");
      const Mat& dv = need(L, Ly, mb, Slot::dv, op, "dV at its owner (cp_dkv_reducescatter)");
      Mat dqkv = Mat::uninitialized(B * sl, (al + 2 * gl) * d);
      set_col_range(dqkv, 0, dq);
      set_col_range(dqkv, al * d, dk);
      set_col_range(dqkv, (al + gl) * d, dv);
      Mat dn = linear_nt(L, dqkv, LK::qkv_w, Ly, op);
      put(L, Ly, mb, Slot::dqkv, std::move(dqkv));
      set_chain(L, op, std::move(dn), Tag::dnorm1, true, false);
      break;
    }
    case Fn::qkv_wgrad: {
      const Mat& dqkv = need(L, Ly, mb, Slot::dqkv, op, "dQ, dK, dV (qkv_dgrad)");
      wgrad(L, LK::qkv_w, Ly, col_input(L, op, Slot::n1, Slot::re1, Ly), dqkv, op);
      if (M.bias) bias_grad(L, LK::qkv_b, Ly, dqkv, op);
      break;
    }
    default:
      break;
  }
}

}  // namespace dtsim::verify
