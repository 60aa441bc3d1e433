#include "sim/collectives/simulate.hpp"

#include <simgrid/s4u.hpp>
#include <xbt/log.h>


#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "models/errors.hpp"
#include "sim/child_process.hpp"
#include "sim/collective_exec.hpp"
#include "sim/collectives/registry.hpp"
#include "sim/collectives/tuner.hpp"
#include "sim/platform.hpp"

namespace sg4 = simgrid::s4u;

namespace dtsim::collectives {

namespace {

/// Validates every run and fills the choice and closed form (no SimGrid).
std::vector<CollectiveTiming> prepare(const ClusterSpec& c, const std::vector<CollectiveRun>& runs) {
  const int64_t gpn = std::max<int64_t>(1, c.gpus_per_node);
  const int64_t gpus_per_nic = std::max<int64_t>(1, gpn / std::max<int64_t>(1, c.nics_per_node));
  const CommModel m = CommModel::of(c);
  std::vector<CollectiveTiming> out;
  for (const auto& r : runs) {
    if (r.members.empty()) throw InputError("collective run with no members");
    for (int64_t g : r.members)
      if (g < 0 || g >= c.gpus())
        throw InputError("GPU " + std::to_string(g) + " is outside the cluster's " + std::to_string(c.gpus()) + " GPUs");
    if (r.repeat < 1) throw InputError("repeat=" + std::to_string(r.repeat) + " must be >= 1");
    auto g = GroupLayout::of(r.members, gpn, gpus_per_nic);
    g.routing = r.routing;
    const Choice ch = choose(r.op, g, m, r.bytes, r.choice, true, "collective");
    CollectiveTiming t;
    t.algorithm = std::string(ch.algorithm->name());
    t.protocol = ch.protocol;
    t.closed_form_s = ch.time_s;
    out.push_back(t);
  }
  return out;
}

// A SimGrid engine with dtsim's model and context flags and actor stacks (as sim/simgrid_engine.cpp
// sets them up), quiet below critical log messages.
std::unique_ptr<sg4::Engine> new_engine() {
  xbt_log_control_set("root.thres:critical");
  int argc = 1;
  char arg0[] = "dtsim";
  char* argv[] = {arg0, nullptr};
  auto engine = std::make_unique<sg4::Engine>(&argc, argv);
  for (const auto* flags : {&simgrid_engine::model_flags(), &simgrid_engine::context_flags()})
    for (const auto& [k, v] : *flags) sg4::Engine::set_config(k + ":" + v);
  simgrid_engine::prepare_actor_stacks();
  return engine;
}

}  // namespace

std::vector<CollectiveTiming> simulate_collectives(const ClusterSpec& cluster, const std::vector<CollectiveRun>& runs,
                                                   bool fold, bool sample_planes) {
  std::vector<CollectiveTiming> timings = prepare(cluster, runs);
  const auto engine = new_engine();
  simgrid_engine::Platform p = simgrid_engine::build_platform(cluster);
  simgrid_engine::start_flow_proxy(p);
  simgrid_engine::FoldPolicy fp{fold, sample_planes};

  std::map<int, std::vector<size_t>> batches;
  for (size_t i = 0; i < runs.size(); ++i) batches[runs[i].batch].push_back(i);

  simgrid_engine::ActorErrors errors;
  sg4::Actor::create("controller", p.hosts.front(), errors.guard([&] {
    for (const auto& [id, idx] : batches) {
      std::vector<sg4::ActorPtr> actors;
      fp.alone = idx.size() == 1;  // nothing else on the fabric while this batch runs
      for (size_t i : idx) {
        const CollectiveRun& r = runs[i];
        actors.push_back(sg4::Actor::create(
            "run" + std::to_string(i), p.hosts[static_cast<size_t>(r.members.front())], errors.guard([&, i, fp] {
              const CollectiveRun& run = runs[i];
              const double t0 = sg4::Engine::get_clock();
              for (int64_t k = 0; k < run.repeat; ++k)
                simgrid_engine::execute_collective(p, fp, run.members, run.op, run.bytes, &run.choice, &run.routing);
              timings[i].time_s = (sg4::Engine::get_clock() - t0) / static_cast<double>(run.repeat);
            })));
      }
      for (auto& a : actors) a->join();
    }
  }));
  engine->run();
  errors.rethrow();
  return timings;
}

std::vector<CollectiveTiming> simulate_collectives_isolated(const ClusterSpec& cluster,
                                                            const std::vector<CollectiveRun>& runs, bool fold,
                                                            bool sample_planes) {
  (void)prepare(cluster, runs);  // input errors surface in this process
  const std::string text = run_in_child(
      [&] {
        std::ostringstream os;
        os.precision(17);
        for (const auto& t : simulate_collectives(cluster, runs, fold, sample_planes))
          os << t.time_s << ' ' << t.closed_form_s << ' ' << t.algorithm << ' ' << static_cast<int>(t.protocol) << '\n';
        return os.str();
      },
      "collective simulation");
  std::vector<CollectiveTiming> out;
  std::istringstream in(text);
  CollectiveTiming t;
  int proto = 0;
  while (in >> t.time_s >> t.closed_form_s >> t.algorithm >> proto) {
    t.protocol = static_cast<Protocol>(proto);
    out.push_back(t);
  }
  if (out.size() != runs.size()) throw std::runtime_error("collective simulation child returned a short result");
  return out;
}

std::vector<double> simulate_transfers_isolated(const ClusterSpec& cluster, const std::vector<Flow>& flows) {
  for (const Flow& f : flows)
    for (int64_t g : {f.src, f.dst})
      if (g < 0 || g >= cluster.gpus())
        throw InputError("GPU " + std::to_string(g) + " is outside the cluster's " + std::to_string(cluster.gpus()) + " GPUs");
  const std::string text = run_in_child(
      [&] {
        std::vector<double> end(flows.size(), 0.0);
        const auto engine = new_engine();
        simgrid_engine::Platform p = simgrid_engine::build_platform(cluster);
        for (size_t i = 0; i < flows.size(); ++i) {
          const Flow f = flows[i];
          sg4::Actor::create("transfer" + std::to_string(i), p.hosts[static_cast<size_t>(f.src)], [&p, &end, f, i] {
            sg4::Comm::sendto(p.hosts[static_cast<size_t>(f.src)], p.hosts[static_cast<size_t>(f.dst)],
                              static_cast<uint64_t>(std::max(1.0, f.bytes + 0.5)));
            end[i] = sg4::Engine::get_clock();
          });
        }
        engine->run();
        std::ostringstream os;
        os.precision(17);
        for (double t : end) os << t << '\n';
        return os.str();
      },
      "transfer simulation");
  std::vector<double> out;
  std::istringstream in(text);
  double t = 0;
  while (in >> t) out.push_back(t);
  if (out.size() != flows.size()) throw std::runtime_error("transfer simulation child returned a short result");
  return out;
}

}  // namespace dtsim::collectives
