#pragma once
// SimGrid keeps one engine per process (its clock and configuration are global,
// ../shared/design/SIMGRID.md "One engine per process"), so every simulation that must
// not disturb its caller runs in a forked child that returns its result as text.
#include <functional>
#include <string>

namespace dtsim {

/// Runs `work` in a forked child and returns the text it produced. stdio is flushed
/// before the fork. Throws std::runtime_error naming `what` when the child throws (with
/// its message), crashes or exits non-zero.
std::string run_in_child(const std::function<std::string()>& work, const std::string& what);

}  // namespace dtsim
