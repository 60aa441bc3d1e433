#pragma once
// dtsim's run-time plugins (the SimGrid engine, sim/cli/engine_loader.cpp; the CUDA
// calibrator, models/calibration/calibrator_loader.cpp): shared objects built with dtsim,
// placed beside the executable and opened with dlopen(3) on first use, so that a command that
// does not need them neither loads nor needs their libraries.
#include <string>

namespace dtsim {

/// `file` in the directory of the running executable (read from /proc/self/exe; the current
/// directory when that link cannot be read).
std::string path_beside_executable(const std::string& file);

/// Opens the shared object at `path` (RTLD_NOW | RTLD_LOCAL; never closed: a plugin stays
/// for the life of the process and of the children it forks) and returns the address of its
/// `symbol`. On failure returns nullptr and sets `error` to "cannot load <what> <path>:
/// <dlerror> (<hint>)" or, when the symbol is missing, to "<path> has no <symbol>".
void* open_plugin_symbol(const std::string& path, const char* symbol, const std::string& what, const std::string& hint,
                         std::string& error);

}  // namespace dtsim
