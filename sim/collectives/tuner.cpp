#include "sim/collectives/tuner.hpp"

#include <limits>

#include "models/errors.hpp"
#include "sim/collectives/registry.hpp"

namespace dtsim::collectives {

namespace {

bool has(const std::vector<Protocol>& ps, Protocol p) {
  for (Protocol q : ps)
    if (q == p) return true;
  return false;
}

/// Best (algorithm, protocol) among `algos` that can run; `proto` restricts the protocol.
Choice best(const std::vector<const Algorithm*>& algos, CollOp op, const GroupLayout& g, const CommModel& m,
            double bytes, const Protocol* proto) {
  Choice c;
  double best_t = std::numeric_limits<double>::infinity();
  for (const Algorithm* a : algos) {
    if (!a->unsupported(op, g, m).empty()) continue;
    for (Protocol p : {Protocol::LL, Protocol::LL128, Protocol::Simple}) {
      if (!has(a->protocols(), p) || (proto && *proto != p)) continue;
      if (p == Protocol::LL128 && !m.ll128) continue;  // RCCL on MI300X nodes (CommModel::ll128)
      const double t = a->tuner_time(op, g, m, bytes, p);
      if (t < best_t) c = Choice{a, p, a->closed_form(op, g, m, bytes, p)};
      if (t < best_t) best_t = t;
    }
  }
  return c;
}

}  // namespace

Choice choose(CollOp op, const GroupLayout& g, const CommModel& m, double bytes, const CollectiveChoice& want,
              bool strict, const std::string& what) {
  const Algorithm* forced = nullptr;
  if (want.algorithm != "auto") {
    forced = find_algorithm(want.algorithm);
    if (!forced)
      throw InputError(what + ": \"" + want.algorithm + "\" is not a collective algorithm (valid: auto, " +
                       algorithm_list() + ")");
  }
  std::optional<Protocol> proto;
  if (want.protocol != "auto") {
    proto = parse_protocol(want.protocol);
    if (!proto)
      throw InputError(what + ": \"" + want.protocol + "\" is not a protocol (valid: auto, simple, ll, ll128)");
  }
  if (proto && *proto == Protocol::LL128 && !m.ll128) {
    // RCCL on MI300X nodes (CommModel::ll128): NCCL_PROTO=LL128 is not honoured there either.
    if (strict)
      throw InputError(what + ": protocol LL128 does not run on an xgmi mesh (RCCL's MI300X tuning model, "
                              "src/graph/tuning.cc tuning_model_5, gives it no bandwidth); use simple, ll or auto");
    proto.reset();
  }
  std::vector<const Algorithm*> candidates;
  for (const Algorithm* a : algorithms())
    if (a->tuner_candidate()) candidates.push_back(a);

  if (forced) {
    const std::string why = forced->unsupported(op, g, m);
    if (why.empty()) {
      if (proto && !has(forced->protocols(), *proto)) {
        if (strict)
          throw InputError(what + ": algorithm " + std::string(forced->name()) + " has no protocol " +
                           to_string(*proto));
        proto.reset();
      }
      Choice c = best({forced}, op, g, m, bytes, proto ? &*proto : nullptr);
      if (c.algorithm) return c;
    } else if (strict) {
      throw InputError(what + ": algorithm " + std::string(forced->name()) + " cannot run " + to_string(op) + " on " +
                       std::to_string(g.n()) + " GPUs over " + std::to_string(g.node_count()) + " node(s): " + why);
    }
  }
  if (proto) {
    Choice c = best(candidates, op, g, m, bytes, &*proto);
    if (c.algorithm) return c;
    if (strict)
      throw InputError(what + ": no algorithm runs " + std::string(to_string(op)) + " with protocol " +
                       to_string(*proto));
  }
  Choice c = best(candidates, op, g, m, bytes, nullptr);
  if (!c.algorithm)
    throw InputError(what + ": no collective algorithm runs " + std::string(to_string(op)) + " on " +
                     std::to_string(g.n()) + " GPUs");
  return c;
}

}  // namespace dtsim::collectives
