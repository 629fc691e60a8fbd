// The CPU code generator's toolchain: compile one generated C++ translation unit into a shared
// object, load it, and cache it on disk by content (Note [CPU toolchain and cache] in
// toolchain.cc).
//
//   auto lib = codegen::compile_cxx({.source = src, .unit_name = "main"});
//   auto* fn = reinterpret_cast<void (*)(float*, int64_t)>(lib->symbol("kernel_0"));
//
// Generated sources precede every kernel function with a marker line `// kiln-kernel: NAME`;
// compile errors are reported against the kernel whose marker precedes the first error.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "support/files.h"

namespace kiln::cpu {

struct CxxCompileRequest {
  std::string source;                    // the whole translation unit
  std::string unit_name;                 // for messages and file names, e.g. graph name "main"
  std::vector<std::string> extra_flags;  // added after the default flags, part of the cache key
};

namespace detail {
struct LibraryHandle;  // one dlopen handle, shared by every LoadedLibrary of the same .so
}

// A loaded shared object. The dlopen handle is closed when the last LoadedLibrary referring to
// it is destroyed: keep the LoadedLibrary alive as long as any symbol from it is in use.
class LoadedLibrary {
 public:
  LoadedLibrary(std::shared_ptr<const detail::LibraryHandle> handle, bool cache_hit,
                bool memory_hit, double compile_seconds);
  ~LoadedLibrary();
  LoadedLibrary(const LoadedLibrary&) = delete;
  LoadedLibrary& operator=(const LoadedLibrary&) = delete;

  // The address of an extern "C" symbol; throws kiln::Error naming the symbol and the library
  // when it is absent.
  void* symbol(const char* name) const;
  const std::string& path() const;       // the .so in the cache
  const std::string& key() const;        // the content hash (64 hex digits)
  const std::string& unit_name() const;  // the unit that first loaded this .so
  bool cache_hit() const { return cache_hit_; }    // loaded without compiling
  bool memory_hit() const { return memory_hit_; }  // served by the in-process map (no disk read)
  double compile_seconds() const { return compile_seconds_; }  // compiler wall time; 0 on a hit

 private:
  std::shared_ptr<const detail::LibraryHandle> handle_;
  bool cache_hit_;
  bool memory_hit_;
  double compile_seconds_;
};

// Compiles (or finds in the cache) and loads one unit. Thread-safe; several processes may share
// one cache directory.
std::shared_ptr<LoadedLibrary> compile_cxx(const CxxCompileRequest& req);

// Several units compiled concurrently (at most hardware_concurrency at once); results in the
// order of `reqs`. When some fail, all still run to the end and the failure of the lowest index
// is rethrown.
std::vector<std::shared_ptr<LoadedLibrary>> compile_cxx_all(
    const std::vector<CxxCompileRequest>& reqs);

struct ToolchainInfo {
  std::string compiler;               // absolute path of the compiler
  std::string compiler_version;       // first line of `compiler --version`
  std::vector<std::string> flags;     // the default flags, link flags (-lsleef) last
  std::string isa;                    // host ISA, e.g. "x86-64+avx2+fma+avx512f+avx512bw"
};
// Computed once per process (thread-safe). Throws kiln::Error when no compiler is found; the
// next call then tries again.
const ToolchainInfo& toolchain();
// The same detection without the once-per-process memo (re-reads KILN_CXX and PATH).
ToolchainInfo detect_toolchain();
// The host ISA string alone (part of every cache key: -march=native depends on it).
std::string host_isa();

// The codegen cache lives in <cache_dir()>/cpu/ (support/files.h; KILN_CACHE_DIR, else
// ~/.cache/kiln), entries managed by support/artifact_cache.h; tuning records are in
// support/tuning_store.h.

// Counters since the process started (or reset_cache_stats). hits includes memory_hits; misses
// counts compiler runs, rebuilt_corrupt those of them that replaced an invalid disk entry.
struct CacheStats {
  int64_t hits = 0, misses = 0, rebuilt_corrupt = 0;
  int64_t memory_hits = 0;
};
CacheStats cache_stats();
void reset_cache_stats();

}  // namespace kiln::cpu
