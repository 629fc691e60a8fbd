#include "kernels/cuda/dynamic_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

namespace kiln::cuda {

namespace fs = std::filesystem;

void* open_cuda_library(const char* soname, const char* env_var, std::string* tried) {
  std::vector<std::string> candidates;
  if (const char* p = std::getenv(env_var); p && *p) {
    candidates.emplace_back(p);
  } else {
    candidates.emplace_back(soname);
    for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
      if (const char* home = std::getenv(var); home && *home)
        candidates.push_back((fs::path(home) / "lib64" / soname).string());
    candidates.push_back((fs::path("/usr/local/cuda/lib64") / soname).string());
  }
  tried->clear();
  for (const std::string& name : candidates) {
    if (void* lib = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return lib;
    const char* why = ::dlerror();
    *tried += fmt::format("\n  {}: {}", name, why ? why : "not found");
  }
  return nullptr;
}

void* find_symbol(void* lib, const char* symbol) { return ::dlsym(lib, symbol); }

std::string library_path_of(const void* symbol_address) {
  Dl_info where{};
  if (!::dladdr(symbol_address, &where) || !where.dli_fname) return "";
  std::error_code ec;
  const fs::path p = fs::canonical(where.dli_fname, ec);
  return ec ? std::string(where.dli_fname) : p.string();
}

}  // namespace kiln::cuda
