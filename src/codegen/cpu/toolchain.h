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
#include <unordered_map>
#include <vector>

namespace kiln::codegen {

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

// $KILN_CACHE_DIR, else ~/.cache/kiln; re-read on every call. The codegen cache lives in
// <cache_dir>/cpu/, tuning records in <cache_dir>/tuning/.
std::string cache_dir();

// Counters since the process started (or reset_cache_stats). hits includes memory_hits; misses
// counts compiler runs, rebuilt_corrupt those of them that replaced an invalid disk entry.
struct CacheStats {
  int64_t hits = 0, misses = 0, rebuilt_corrupt = 0;
  int64_t memory_hits = 0;
};
CacheStats cache_stats();
void reset_cache_stats();

// A small key-value store next to the cache for autotuning decisions (max-autotune persists its
// choices). tuning_get returns false when the key is absent or its record unreadable/corrupt;
// tuning_put replaces the record atomically. Keys and values are arbitrary bytes.
bool tuning_get(const std::string& key, std::string* value);
void tuning_put(const std::string& key, const std::string& value);

// SHA-256 of `data` as 64 lowercase hex digits (the cache's content hash).
std::string sha256_hex(std::string_view data);

// The file primitives of the cache above, shared with the CUDA kernel cache
// (src/targets/cuda/nvrtc.cc) so that both caches behave alike: same atomic-write discipline,
// same corruption checks, same error-to-kernel mapping. Errors are kiln::Errors naming the path.
namespace cache_files {
// The whole file; false when it cannot be opened or read.
bool read_file(const std::string& path, std::string* out);
// Creates/truncates `path` and writes `data`; fsyncs it when `sync`.
void write_file(const std::string& path, std::string_view data, bool sync);
// Writes a temp file next to `path`, fsyncs it and renames it over `path`.
void write_file_atomic(const std::string& path, std::string_view data);
void fsync_path(const std::string& path);  // best effort (a file or a directory)
void make_dirs(const std::string& dir);    // the error names KILN_CACHE_DIR
void remove_quietly(const std::string& path);
// Removes `*.tmp.*` files older than a day in `dir` (left by killed compiles).
void remove_stale_temps(const std::string& dir);
// pid.tid.counter: unique among all threads of all processes on this host.
std::string unique_suffix();
// [A-Za-z0-9._-] only, at most 64 characters (names become parts of file names).
std::string file_safe(const std::string& name);
// Reads the `name value` lines of a .meta file whose first line is `<format_name> <version>`;
// false when the text is truncated or of another format or version.
bool parse_meta(const std::string& text, std::string_view format_name, int version,
                std::unordered_map<std::string, std::string>* fields);
// The NAME of the last `// kiln-kernel: NAME` marker at or before 1-based `line_number`, or "".
std::string kernel_at_line(const std::string& source, int line_number);
}  // namespace cache_files

}  // namespace kiln::codegen
