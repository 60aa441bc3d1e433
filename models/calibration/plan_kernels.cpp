#include "models/calibration/plan_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <string_view>

#include "models/compute_cost.hpp"

namespace dtsim::calib {

namespace {
// Fused Adam bytes per parameter; the value models/plan.cpp uses (kAdamBytesPerParam).
constexpr double kAdamBytesPerParam = 30.0;

int64_t at_least_1(int64_t v) { return std::max<int64_t>(v, 1); }
}  // namespace

std::optional<OpKernel> kernel_for_op(const Op& op, const Experiment& exp) {
  const ModelSpec& m = exp.model;
  const Layout& l = exp.layout;
  const int64_t b = exp.training.micro_batch;
  const int64_t S = exp.training.seq_len;
  const int64_t s = S / std::max<int64_t>(l.cp, 1);  // PlanShape.tokens_local
  const int64_t t = std::max<int64_t>(l.tp, 1);
  const int64_t hd = m.head_dim();
  const std::string_view name = op.name;
  OpKernel r;
  KernelSpec& k = r.spec;
  k.name = op.name;
  k.bytes = op.bytes;
  switch (op.kernel) {
    case KernelKind::memory:
      k.kind = KernelClass::memory;
      return r;
    case KernelKind::optimizer:
      k.kind = KernelClass::optimizer;
      k.params = std::round(op.bytes / kAdamBytesPerParam);
      return r;
    case KernelKind::attention: {
      k.kind = KernelClass::attention;
      auto& a = k.attention;
      a.batch = b;
      a.heads = at_least_1(m.heads / t);
      a.kv_heads = at_least_1(m.kv_heads / t);
      a.head_dim = hd;
      if (m.mla.enabled()) {
        // MLA (models/blocks/mla.hpp): every head has its own key and value after the up
        // projections; the query / key head is qk_nope + qk_rope wide (the value head,
        // v_head_dim, is not part of the kernel key).
        a.kv_heads = a.heads;
        a.head_dim = m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim;
      }
      a.seq_q = s;
      a.backward = name.find("bwd") != std::string_view::npos;
      a.causal = exp.training.flash_attention;  // unfused attention is a dense masked GEMM
      if (name.find("remote") != std::string_view::npos) {
        a.seq_kv = s;
        a.causal = false;
        r.count = static_cast<double>(l.cp - 1) / 2.0;
      } else if (name.find("local") != std::string_view::npos) {
        a.seq_kv = s;
      } else {
        a.seq_kv = S;
      }
      return r;
    }
    case KernelKind::gemm: break;
  }
  // GEMMs: the shape, operand layout and dtype the block declared on the op
  // (models/blocks/block_context.hpp BlockContext::gemm); none: not a GEMM we can time.
  if (op.gemm.m <= 0 || op.gemm.n <= 0 || op.gemm.k <= 0) return std::nullopt;
  k.kind = KernelClass::gemm;
  k.gemm = op.gemm;
  k.gemm.dtype = op_gemm_dtype(op, exp);
  if (op.gemm_groups > 1) {
    // A grouped GEMM: one GEMM per local expert over its share of the token rows.
    int64_t& rows = op.gemm_group_split_k ? k.gemm.k : k.gemm.m;
    rows = (rows + op.gemm_groups - 1) / op.gemm_groups;
    r.count = op.gemm_groups;
  }
  return r;
}

std::vector<KernelSpec> derive_kernels(const Experiment& exp) {
  const StepPlan plan = build_step_plan(exp);
  std::vector<KernelSpec> out;
  std::set<std::string> seen;
  for (const auto& st : plan.stages)
    for (const auto& op : st.ops) {
      if (op.type != OpType::compute) continue;
      auto k = kernel_for_op(op, exp);
      if (!k) continue;
      if (seen.insert(k->spec.key()).second) out.push_back(k->spec);
    }
  return out;
}

std::vector<KernelSpec> grid_kernels(const std::vector<KernelSpec>& kernels) {
  std::set<std::string> seen;
  for (const auto& k : kernels) seen.insert(k.key());
  std::vector<KernelSpec> out;
  auto add = [&](const KernelSpec& k) {
    if (seen.insert(k.key()).second) out.push_back(k);
  };
  for (const auto& k : kernels) {
    if (k.kind == KernelClass::gemm) {
      for (double f : {0.25, 0.5, 2.0}) {
        KernelSpec g = k;
        g.gemm.m = std::max<int64_t>(1, static_cast<int64_t>(std::llround(static_cast<double>(k.gemm.m) * f)));
        add(g);
      }
    } else if (k.kind == KernelClass::memory) {
      for (double f : {0.25, 4.0}) {
        KernelSpec g = k;
        g.bytes = k.bytes * f;
        add(g);
      }
    }
  }
  return out;
}

}  // namespace dtsim::calib
