// Finding the CUDA toolkit's libraries at run time (NVRTC, cuBLASLt, cuDNN). Kiln never links
// them: a binary must start on a machine that lacks them (or lacks a GPU) and report a clear
// error only when a CUDA library path is used.
#pragma once
#include <string>

namespace kiln::cuda {

// dlopen(RTLD_NOW | RTLD_LOCAL) of the first that loads of: $env_var (a path; when set, the only
// candidate), `soname` on the loader's path (LD_LIBRARY_PATH, ld.so.cache), then
// $CUDA_HOME/lib64, $CUDA_PATH/lib64 and /usr/local/cuda/lib64. Returns the handle (never
// closed: these libraries keep process-wide state), or nullptr with *tried listing each
// candidate and the loader's reason, one per line.
void* open_cuda_library(const char* soname, const char* env_var, std::string* tried);

// dlsym(lib, symbol) into a typed function pointer; false (and *missing = symbol) when absent.
void* find_symbol(void* lib, const char* symbol);
template <typename Fn>
bool bind_symbol(void* lib, const char* symbol, Fn* out, std::string* missing) {
  *out = reinterpret_cast<Fn>(find_symbol(lib, symbol));
  if (!*out) *missing = symbol;
  return *out != nullptr;
}

// The resolved path of the library that defines `symbol_address` (dladdr), or "".
std::string library_path_of(const void* symbol_address);

}  // namespace kiln::cuda
