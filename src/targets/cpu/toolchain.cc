// Note [CPU toolchain and cache]
// The CPU compiler emits one C++ translation unit per graph; this file turns it into a loaded
// shared object, compiling it with the host C++ compiler only when no valid cached copy exists.
//
// Toolchain. The compiler is $KILN_CXX (a path, or a name looked up on PATH), else `c++`, else
// `g++` on PATH; its version is the first line of `<compiler> --version`. The default flags are
// fixed (-O3 -march=native ... -lsleef; never -ffast-math: generated code must keep IEEE NaN and
// infinity semantics). The host ISA string lists the CPU features __builtin_cpu_supports reports;
// it is part of the key because -march=native compiles for exactly those features. All of this
// is computed once per process (toolchain()).
//
// Key. SHA-256 over a length-prefixed record of: a format version, the source, the compiler path
// (as found and canonical), its version line, every flag (defaults, then extra_flags) and the ISA.
// Any change to one of them is a different key, hence a different file: entries are immutable.
//
// Entry. <cache_dir>/cpu/<key[0:2]>/<key>.so plus <key>.meta, a small text file with the key,
// the size and SHA-256 of the .so bytes, the unit name and the compile time. A lookup loads the
// .so only if the .meta parses, names this key, and the .so has exactly the recorded size and
// hash; anything else (a missing .meta, a truncated or bit-flipped .so) is recompiled and counted
// in rebuilt_corrupt. An invalid file is never handed to dlopen.
//
// Atomic writes. The compiler writes <key>.tmp.<pid>.<tid>.<n>.so in the entry's directory; the
// bytes are hashed and fsynced, the .meta is written to its own temp file and fsynced, then the
// .so and the .meta are renamed into place (in that order) and the directory is fsynced. A reader
// therefore sees either no entry, a complete old entry, or a .so whose .meta is not there yet
// (treated as missing). The source reaches the compiler on stdin (`-x c++ -`), so the .so does
// not embed a temp file name and two compiles of one key give identical bytes: two processes
// racing on one key both end with a valid entry and a valid loaded library, whichever rename
// lands last. (The .so is hashed and then dlopened by path; a rename between the two can only
// substitute another complete compile of the same key.)
//
// In-process map. Loaded handles are kept in a map .so path -> weak_ptr, so a second compile of
// the same unit in one process (while the first result is alive) neither reads the disk nor
// reloads; each call still gets its own LoadedLibrary with its own cache_hit()/compile_seconds().
// A per-path mutex makes threads that ask for the same unit at once wait for one compile.
// Keep a LoadedLibrary alive while its functions are in use: the last one dlcloses the handle.
// dlopen identifies libraries by path: a test that edits a cached .so must drop every reference
// first (and should replace the file rather than write into a mapped one).
//
// Errors. The compiler's stdout+stderr go to a temp file. On failure the source is kept under
// <cache_dir>/cpu/failed/ and the error names the unit, the kernel whose `// kiln-kernel: NAME`
// marker precedes the first error's line, the first lines of compiler output and the kept path.
// Processes are started with posix_spawn from an argv vector: no shell, no quoting.
#include "targets/cpu/toolchain.h"
#include "support/host_isa.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pwd.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "core/error.h"
#include "support/artifact_cache.h"
#include "support/files.h"
#include "support/hash.h"
#include "support/process.h"
#include "support/strings.h"

namespace kiln::cpu {

namespace fs = std::filesystem;

namespace detail {
struct LibraryHandle {
  void* handle = nullptr;
  std::string path, key, unit_name;
  ~LibraryHandle() {
    if (handle) dlclose(handle);
  }
};
}  // namespace detail

namespace {

using detail::LibraryHandle;

// Bumped whenever the entry layout, the key record or the meta format changes.
constexpr int kCacheFormatVersion = 1;
constexpr size_t kMaxErrorLines = 20;

// Default flags (compile) and link flags, in command-line order. Link flags follow the input.
const std::array<const char*, 8> kCompileFlags = {
    "-O3", "-march=native", "-fPIC", "-shared", "-fopenmp", "-std=c++17", "-fno-math-errno",
    "-fno-trapping-math"};
const std::array<const char*, 1> kLinkFlags = {"-lsleef"};

// ---- toolchain ------------------------------------------------------------------------------

std::string find_compiler() {
  if (const char* cxx = std::getenv("KILN_CXX"); cxx && *cxx) {
    const std::string found = find_program(cxx);
    if (found.empty())
      fail_kind(ErrorKind::Runtime,
                "KILN_CXX='{}' is not an executable file{}: set KILN_CXX to the path of a C++ "
                "compiler (g++ 12 or newer) or unset it to use c++/g++ from PATH",
                cxx, std::string_view(cxx).find('/') == std::string_view::npos ? " on PATH" : "");
    return found;
  }
  for (const char* name : {"c++", "g++"}) {
    const std::string found = find_program(name);
    if (!found.empty()) return found;
  }
  const char* path_env = std::getenv("PATH");
  fail_kind(ErrorKind::Runtime,
            "no C++ compiler found for the CPU code generator: looked for 'c++' and 'g++' on PATH "
            "({}); install g++ or set KILN_CXX to the compiler's path",
            path_env ? path_env : "<PATH unset>");
}

std::string canonical_or_same(const std::string& path) {
  std::error_code ec;
  const fs::path c = fs::canonical(path, ec);
  return ec ? path : c.string();
}

// ---- cache entries --------------------------------------------------------------------------

const ArtifactCache& cpu_cache() {
  static const ArtifactCache cache("cpu", "so", kCacheFormatVersion);
  return cache;
}

std::string cache_key(const CxxCompileRequest& req, const ToolchainInfo& tc) {
  KeyHasher h;
  h.field("format", fmt::format("kiln-cpu-cache {}", kCacheFormatVersion));
  h.field("source", req.source);
  h.field("compiler", tc.compiler);
  h.field("compiler_canonical", canonical_or_same(tc.compiler));
  h.field("compiler_version", tc.compiler_version);
  for (const std::string& f : tc.flags) h.field("flag", f);
  for (const std::string& f : req.extra_flags) h.field("extra_flag", f);
  h.field("isa", tc.isa);
  return h.hex_digest();
}

// Units are built with -fopenmp, so loading one may load the OpenMP runtime as its dependency
// (in a process that does not link it itself). Its worker threads outlive the parallel region;
// unloading the runtime with the last unit would pull the code from under them (a crash at an
// unmapped address). RTLD_NOLOAD|RTLD_NODELETE marks an already loaded runtime as never unloaded.
void pin_openmp_runtime() {
  for (const char* runtime : {"libgomp.so.1", "libomp.so", "libomp.so.5", "libiomp5.so"}) {
    if (void* h = ::dlopen(runtime, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE)) ::dlclose(h);
  }
}

std::shared_ptr<const LibraryHandle> load_library(const std::string& path, const std::string& key,
                                                  const std::string& unit_name) {
  auto lib = std::make_shared<LibraryHandle>();
  lib->path = path;
  lib->key = key;
  lib->unit_name = unit_name;
  lib->handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib->handle) {
    const char* why = ::dlerror();
    fail_kind(ErrorKind::Internal,
              "compiled unit '{}' cannot be loaded from '{}': {} (a generated kernel may call a "
              "function that is not defined; is libsleef installed?)",
              unit_name, path, why ? why : "unknown dlopen error");
  }
  pin_openmp_runtime();
  return lib;
}

// ---- compile errors -------------------------------------------------------------------------

// The source line of a `<stdin>:LINE[:COL]` location at the start of `line`, or 0.
int stdin_line_number(std::string_view line) {
  constexpr std::string_view prefix = "<stdin>:";
  const size_t at = line.find(prefix);
  if (at == std::string_view::npos) return 0;
  int n = 0;
  size_t i = at + prefix.size();
  for (; i < line.size() && std::isdigit(static_cast<unsigned char>(line[i])); ++i)
    n = n * 10 + (line[i] - '0');
  return i > at + prefix.size() ? n : 0;
}

bool is_error_line(std::string_view line) {
  return line.find(": error:") != std::string_view::npos ||
         line.find(": fatal error:") != std::string_view::npos;
}

[[noreturn]] void throw_compile_error(const CxxCompileRequest& req, const std::string& unit,
                                      const std::string& compiler, int status,
                                      const std::string& output, const std::string& kept_source,
                                      const std::string& kept_log) {
  const std::vector<std::string_view> lines = split_lines(output);
  // Locate the first error and the source line it refers to: the error's own location when it
  // is in the unit, else the nearest `<stdin>:N` before it (an error inside an included header
  // is listed after the include/instantiation chain that leads to it).
  size_t first_error = lines.size();
  int error_line = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (!is_error_line(lines[i])) continue;
    first_error = i;
    for (size_t j = i + 1; j-- > 0 && error_line == 0;) error_line = stdin_line_number(lines[j]);
    break;
  }
  const std::string where = error_location(req.source, error_line);
  const std::string excerpt = log_excerpt(lines, first_error, kMaxErrorLines, "<stdin>", kept_source,
                                          "  (the compiler printed nothing)\n");
  std::string hint;
  if (output.find("sleef.h: No such file") != std::string::npos ||
      output.find("cannot find -lsleef") != std::string::npos)
    hint = " SLEEF seems to be missing: install libsleef-dev.";
  fail_kind(ErrorKind::Internal,
            "C++ compile of unit '{}' failed{}: {} {}.\nFirst compiler output lines:\n{}"
            "The failing source is kept at {} (full compiler output: {}). Generated code that "
            "does not compile is a Kiln bug: please report it with that file.{}",
            unit, where, compiler, describe_status(status), excerpt, kept_source, kept_log, hint);
}

// Compiles `req` into the cache entry for `key` (atomically). Returns the compiler's wall time
// in seconds.
double compile_entry(const CxxCompileRequest& req, const ToolchainInfo& tc, const std::string& key,
                     const std::string& unit) {
  const ArtifactCache& cache = cpu_cache();
  const std::string tmp_so = cache.temp_path(key, ".so");
  const std::string tmp_source = tmp_so + ".cc", tmp_log = tmp_so + ".log";
  write_file(tmp_source, req.source, /*sync=*/false);

  std::vector<std::string> argv = {tc.compiler};
  for (const char* f : kCompileFlags) argv.emplace_back(f);
  argv.insert(argv.end(), {"-o", tmp_so, "-x", "c++", "-", "-x", "none"});
  argv.insert(argv.end(), req.extra_flags.begin(), req.extra_flags.end());
  for (const char* f : kLinkFlags) argv.emplace_back(f);

  const auto start = std::chrono::steady_clock::now();
  int status = -1;
  try {
    status = run_to_file(argv, tmp_source, tmp_log, "set KILN_CXX to a working C++ compiler");
  } catch (...) {
    remove_quietly(tmp_source);
    remove_quietly(tmp_log);
    throw;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::string output;
  read_whole_file(tmp_log, &output);
  remove_quietly(tmp_source);
  remove_quietly(tmp_log);
  std::error_code ec;
  if (status != 0 || !fs::exists(tmp_so, ec)) {
    remove_quietly(tmp_so);
    const std::string failed_dir = cache.failed_dir();
    const std::string stem = (fs::path(failed_dir) / fmt::format("{}_{}", unit, key.substr(0, 12))).string();
    const std::string kept_source = stem + ".cc", kept_log = stem + ".log";
    make_dirs(failed_dir);
    write_file_atomic(kept_source, req.source);
    write_file_atomic(kept_log, replace_all(output, "<stdin>", kept_source));
    throw_compile_error(req, unit, tc.compiler, status, output, kept_source, kept_log);
  }

  std::string so_bytes;
  if (!read_whole_file(tmp_so, &so_bytes)) {
    remove_quietly(tmp_so);
    fail_kind(ErrorKind::Runtime, "cannot read the compiled unit '{}' at '{}': {}", unit, tmp_so,
              errno_text(errno));
  }
  cache.publish(key, tmp_so, so_bytes,
                {{"unit", unit},
                 {"compile_seconds", fmt::format("{:.3f}", seconds)},
                 {"compiler", tc.compiler}});
  return seconds;
}

// ---- process-wide state ---------------------------------------------------------------------

struct ProcessCache {
  std::mutex mu;
  std::unordered_map<std::string, std::weak_ptr<const LibraryHandle>> loaded;  // by .so path
  std::unordered_map<std::string, std::shared_ptr<std::mutex>> in_flight;      // by .so path
};

ProcessCache& process_cache() {
  static ProcessCache* cache = new ProcessCache;  // never destroyed: handles may outlive statics
  return *cache;
}

std::atomic<int64_t> g_hits{0}, g_misses{0}, g_rebuilt_corrupt{0}, g_memory_hits{0};

// A live handle for `path` from the in-process map, or null. Caller holds ProcessCache::mu.
std::shared_ptr<const LibraryHandle> find_loaded(ProcessCache& pc, const std::string& path) {
  auto it = pc.loaded.find(path);
  if (it == pc.loaded.end()) return nullptr;
  return it->second.lock();
}

}  // namespace

// ---- public API -----------------------------------------------------------------------------

LoadedLibrary::LoadedLibrary(std::shared_ptr<const detail::LibraryHandle> handle, bool cache_hit,
                             bool memory_hit, double compile_seconds)
    : handle_(std::move(handle)),
      cache_hit_(cache_hit),
      memory_hit_(memory_hit),
      compile_seconds_(compile_seconds) {
  KILN_ASSERT(handle_ && handle_->handle);
}

LoadedLibrary::~LoadedLibrary() = default;

void* LoadedLibrary::symbol(const char* name) const {
  ::dlerror();  // clear a stale error
  void* sym = ::dlsym(handle_->handle, name);
  if (!sym)
    fail_kind(ErrorKind::Internal,
              "symbol '{}' not found in compiled unit '{}' ({}): the generated source defines no "
              "extern \"C\" function of that name",
              name, handle_->unit_name, handle_->path);
  return sym;
}

const std::string& LoadedLibrary::path() const { return handle_->path; }
const std::string& LoadedLibrary::key() const { return handle_->key; }
const std::string& LoadedLibrary::unit_name() const { return handle_->unit_name; }

std::string host_isa() { return kiln::host_isa(); }

ToolchainInfo detect_toolchain() {
  ToolchainInfo info;
  info.compiler = find_compiler();
  int status = -1;
  const std::string version = run_capture_stdout({info.compiler, "--version"}, &status,
                                                 "set KILN_CXX to a working C++ compiler");
  if (status != 0)
    fail_kind(ErrorKind::Runtime,
              "C++ compiler '{}' failed to run '--version' ({}): set KILN_CXX to a working C++ "
              "compiler",
              info.compiler, describe_status(status));
  info.compiler_version = version.substr(0, version.find('\n'));
  for (const char* f : kCompileFlags) info.flags.emplace_back(f);
  for (const char* f : kLinkFlags) info.flags.emplace_back(f);
  info.isa = host_isa();
  return info;
}

const ToolchainInfo& toolchain() {
  // A throwing initializer leaves the static uninitialized: the next call detects again.
  static const ToolchainInfo info = detect_toolchain();
  return info;
}

CacheStats cache_stats() {
  CacheStats s;
  s.hits = g_hits.load();
  s.misses = g_misses.load();
  s.rebuilt_corrupt = g_rebuilt_corrupt.load();
  s.memory_hits = g_memory_hits.load();
  return s;
}

void reset_cache_stats() {
  g_hits = 0;
  g_misses = 0;
  g_rebuilt_corrupt = 0;
  g_memory_hits = 0;
}

std::shared_ptr<LoadedLibrary> compile_cxx(const CxxCompileRequest& req) {
  const ToolchainInfo& tc = toolchain();
  const std::string key = cache_key(req, tc);
  const std::string unit = file_safe(req.unit_name);

  if (const char* dump_dir = std::getenv("KILN_DUMP_CODE"); dump_dir && *dump_dir) {
    make_dirs(dump_dir, "KILN_DUMP_CODE");
    write_file_atomic((fs::path(dump_dir) / fmt::format("{}_{}.cc", unit, key.substr(0, 12)))
                          .string(),
                      req.source);
  }

  const ArtifactCache::Paths paths = cpu_cache().paths(key);
  ProcessCache& pc = process_cache();
  auto memory_hit = [&](std::shared_ptr<const LibraryHandle> h) {
    ++g_hits;
    ++g_memory_hits;
    return std::make_shared<LoadedLibrary>(std::move(h), /*cache_hit=*/true,
                                           /*memory_hit=*/true, 0.0);
  };
  std::shared_ptr<std::mutex> path_mu;
  {
    std::lock_guard<std::mutex> lock(pc.mu);
    if (auto h = find_loaded(pc, paths.artifact)) return memory_hit(std::move(h));
    auto& m = pc.in_flight[paths.artifact];
    if (!m) m = std::make_shared<std::mutex>();
    path_mu = m;
  }
  // Drops this thread's claim on the per-path mutex; the last claimant erases it.
  auto release = [&] {
    std::lock_guard<std::mutex> lock(pc.mu);
    if (path_mu.use_count() == 2) pc.in_flight.erase(paths.artifact);
    path_mu.reset();
  };

  std::shared_ptr<LoadedLibrary> result;
  try {
    std::lock_guard<std::mutex> path_lock(*path_mu);
    std::shared_ptr<const LibraryHandle> handle;
    {
      std::lock_guard<std::mutex> lock(pc.mu);  // another thread may have loaded it meanwhile
      handle = find_loaded(pc, paths.artifact);
    }
    if (handle) {
      result = memory_hit(std::move(handle));
    } else {
      bool existed = false;
      double compile_seconds = 0;
      const bool hit = cpu_cache().validate(key, &existed);
      if (!hit) {
        if (existed) ++g_rebuilt_corrupt;
        ++g_misses;
        compile_seconds = compile_entry(req, tc, key, unit);
      }
      handle = load_library(paths.artifact, key, unit);
      if (hit) ++g_hits;
      result = std::make_shared<LoadedLibrary>(handle, hit, /*memory_hit=*/false, compile_seconds);
      std::lock_guard<std::mutex> lock(pc.mu);
      std::erase_if(pc.loaded, [](const auto& kv) { return kv.second.expired(); });
      pc.loaded[paths.artifact] = handle;
    }
  } catch (...) {
    release();
    throw;
  }
  release();
  return result;
}

std::vector<std::shared_ptr<LoadedLibrary>> compile_cxx_all(
    const std::vector<CxxCompileRequest>& reqs) {
  const size_t n = reqs.size();
  std::vector<std::shared_ptr<LoadedLibrary>> results(n);
  std::vector<std::exception_ptr> errors(n);
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        results[i] = compile_cxx(reqs[i]);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  const size_t workers =
      std::min<size_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (size_t w = 1; w < workers; ++w) threads.emplace_back(worker);
  worker();  // this thread is one of the workers
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return results;
}

}  // namespace kiln::cpu
