#include "models/plugin_loader.hpp"

#include <dlfcn.h>

#include <filesystem>

namespace dtsim {

std::string path_beside_executable(const std::string& file) {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  const auto dir = ec ? std::filesystem::current_path(ec) : exe.parent_path();
  return (dir / file).string();
}

void* open_plugin_symbol(const std::string& path, const char* symbol, const std::string& what, const std::string& hint,
                         std::string& error) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    error = "cannot load " + what + " " + path + ": " + (e ? e : "dlopen failed") + " (" + hint + ")";
    return nullptr;
  }
  void* entry = dlsym(h, symbol);
  if (!entry) error = path + " has no " + symbol;
  return entry;
}

}  // namespace dtsim
