// An exception raised inside a SimGrid actor (sim/platform.hpp ActorErrors): SimGrid 3.32
// aborts the process when one leaves an actor's body; dtsim's guarded bodies keep it, end the
// run and rethrow it from the caller, so an input problem found inside a simulation is an
// InputError (exit code 2), not an abort.
#include <gtest/gtest.h>

#include <simgrid/s4u.hpp>
#include <xbt/log.h>

#include <string>

#include "models/errors.hpp"
#include "sim/child_process.hpp"
#include "sim/platform.hpp"
#include "topologies/node_presets.hpp"

namespace dtsim {
namespace {

namespace sg4 = simgrid::s4u;

TEST(ActorErrors, AnExceptionInsideAnActorIsRethrownAfterTheRun) {
  // One engine per process: in a child, which reports what the parent checks.
  const std::string text = run_in_child(
      [] {
        xbt_log_control_set("root.thres:critical");
        int argc = 1;
        char arg0[] = "dtsim";
        char* argv[] = {arg0, nullptr};
        sg4::Engine engine(&argc, argv);
        simgrid_engine::Platform p = simgrid_engine::build_platform(cluster_of(node_preset("dgx-h100"), 1));
        simgrid_engine::ActorErrors errors;
        bool other_finished = false;
        sg4::Actor::create("fails", p.hosts[0], errors.guard([] {
                             sg4::this_actor::sleep_for(1.0);
                             throw InputError("cluster.x=1 is not a value (raised inside an actor)");
                           }));
        sg4::Actor::create("waits", p.hosts[1], errors.guard([&] {
                             sg4::this_actor::sleep_for(10.0);
                             other_finished = true;
                           }));
        engine.run();
        std::string out = "clock " + std::to_string(sg4::Engine::get_clock()) +
                          (other_finished ? " other finished" : " other killed");
        try {
          errors.rethrow();
          out += "; nothing rethrown";
        } catch (const InputError& e) {
          out += "; InputError: " + e.problems().front();
        }
        return out;
      },
      "ActorErrors test");
  EXPECT_EQ(text, "clock 1.000000 other killed; InputError: cluster.x=1 is not a value (raised inside an actor)");
}

}  // namespace
}  // namespace dtsim
