// Note [CUDA kernel cache]
// The CUDA target emits one CUDA C program per graph; this file turns it into cubin bytes,
// running NVRTC only when no valid cached copy exists. It follows Note [CPU toolchain and cache]
// (targets/cpu/toolchain.cc) through the same artifact cache (Note [Artifact cache] in
// support/artifact_cache.cc), so the two caches behave alike.
//
// NVRTC. Loaded with dlopen on first use (open_cuda_library: $KILN_NVRTC if set, else
// libnvrtc.so.13 on the loader's path, else under $CUDA_HOME, $CUDA_PATH, /usr/local/cuda). Binaries do
// not link it, so they start where it is absent; compiling then fails with a NotSupported error
// that says NVRTC is needed and how to point Kiln at it. NVRTC needs no GPU: a cross-build for
// sm_90 works on any machine with the library (the unit tests do one).
//
// Key. SHA-256 over a length-prefixed record of: a format version, the source, NVRTC's version
// (major.minor from nvrtcVersion, plus the library's soname and byte size, which tell patch
// releases apart), the default flags, the architecture and every extra flag. Entries are
// immutable: any change is a different key.
//
// Entry. <cache_dir>/cuda/<key[0:2]>/<key>.cubin plus <key>.meta ("kiln-cuda-cache 1", the key,
// the size and SHA-256 of the cubin, program, architecture, compile time). A lookup accepts the
// entry only if the meta parses, names this key, and the cubin has exactly the recorded size and
// hash; the bytes checked are the bytes returned (they are read into memory, not mapped), so an
// invalid file never reaches the driver. Anything else is recompiled (rebuilt_corrupt counts it).
//
// PTX. NVRTC compiles through PTX even for a real architecture, and gives both: each entry has
// the PTX beside the cubin in a second cache (<cache_dir>/cuda-ptx/, same key, same checks). A
// cubin entry without its PTX entry is a miss (compiled again), so a result always has both.
//
// Atomic writes. The cubin and the meta go to temp files in the entry's folder, are fsynced, and
// are renamed into place cubin first, then the folder is fsynced: a reader sees no entry, a
// complete entry, or a cubin without meta (missing). Two processes racing on one key both write
// complete entries of identical content; the last rename wins.
//
// In-process. A map key -> weak_ptr<CompiledCubin> serves a second request for a live result
// without reading the disk; a per-key mutex makes concurrent requests for one key wait for one
// compile.
//
// Errors. NVRTC's log names the program "<program_name>.cu" and lines as NAME.cu(LINE). On a
// compile error the source and the log are kept under <cache_dir>/cuda/failed/ and the error
// names the program, the kernel whose `// kiln-kernel: NAME` marker precedes the first error
// line, the first log lines and the kept files. KILN_DUMP_CODE=dir writes every program's source
// to dir (on hits too), like the CPU path.
#include "targets/cuda/nvrtc.h"

#include <nvrtc.h>

#include <algorithm>
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
#include "support/strings.h"
#include "kernels/cuda/dynamic_library.h"

namespace kiln::cuda {

namespace fs = std::filesystem;

namespace {

constexpr int kCacheFormatVersion = 1;
constexpr const char* kMetaFormat = "kiln-cuda-cache";
constexpr size_t kMaxErrorLines = 20;
// Default flags, before the architecture flag. No --use_fast_math: generated code keeps IEEE
// NaN/infinity semantics, as on the CPU. FMA contraction stays NVRTC's default (on).
const char* const kDefaultFlags[] = {"--std=c++17"};

// ---- loading NVRTC ---------------------------------------------------------------------------

struct NvrtcApi {
  decltype(&::nvrtcGetErrorString) get_error_string = nullptr;
  decltype(&::nvrtcVersion) version = nullptr;
  decltype(&::nvrtcGetNumSupportedArchs) get_num_supported_archs = nullptr;
  decltype(&::nvrtcGetSupportedArchs) get_supported_archs = nullptr;
  decltype(&::nvrtcCreateProgram) create_program = nullptr;
  decltype(&::nvrtcDestroyProgram) destroy_program = nullptr;
  decltype(&::nvrtcCompileProgram) compile_program = nullptr;
  decltype(&::nvrtcGetCUBINSize) get_cubin_size = nullptr;
  decltype(&::nvrtcGetCUBIN) get_cubin = nullptr;
  decltype(&::nvrtcGetPTXSize) get_ptx_size = nullptr;
  decltype(&::nvrtcGetPTX) get_ptx = nullptr;
  decltype(&::nvrtcGetProgramLogSize) get_program_log_size = nullptr;
  decltype(&::nvrtcGetProgramLog) get_program_log = nullptr;
  NvrtcInfo info;
  std::string unavailable;  // why NVRTC could not be loaded; empty when it was
};

// NVRTC 13 has no built-in copy of the toolkit headers (cuda_fp16.h, cuda_bf16.h, ...): they
// come from the toolkit's include folder, found next to the library (lib64/../include), else
// under $CUDA_HOME, $CUDA_PATH or /usr/local/cuda. "" when none holds cuda_fp16.h.
std::string find_toolkit_include_dir(const std::string& library) {
  std::vector<fs::path> candidates = {fs::path(library).parent_path().parent_path() / "include"};
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* home = std::getenv(var); home && *home)
      candidates.push_back(fs::path(home) / "include");
  candidates.emplace_back("/usr/local/cuda/include");
  for (const fs::path& dir : candidates) {
    std::error_code ec;
    if (fs::exists(dir / "cuda_fp16.h", ec)) {
      const fs::path c = fs::canonical(dir, ec);
      return ec ? dir.string() : c.string();
    }
  }
  return "";
}


NvrtcApi load_nvrtc() {
  NvrtcApi api;
  std::string tried;
  void* lib = open_cuda_library("libnvrtc.so.13", "KILN_NVRTC", &tried);
  if (!lib) {
    api.unavailable = fmt::format(
        "NVRTC (libnvrtc.so.13, CUDA 13) is needed to compile CUDA kernels and was not found; "
        "install the CUDA toolkit's NVRTC, add its lib64 folder to LD_LIBRARY_PATH, or set "
        "KILN_NVRTC to the library's path. Tried:{}",
        tried);
    return api;
  }
  std::string missing;
  const bool ok = bind_symbol(lib, "nvrtcGetErrorString", &api.get_error_string, &missing) &&
                  bind_symbol(lib, "nvrtcVersion", &api.version, &missing) &&
                  bind_symbol(lib, "nvrtcGetNumSupportedArchs", &api.get_num_supported_archs, &missing) &&
                  bind_symbol(lib, "nvrtcGetSupportedArchs", &api.get_supported_archs, &missing) &&
                  bind_symbol(lib, "nvrtcCreateProgram", &api.create_program, &missing) &&
                  bind_symbol(lib, "nvrtcDestroyProgram", &api.destroy_program, &missing) &&
                  bind_symbol(lib, "nvrtcCompileProgram", &api.compile_program, &missing) &&
                  bind_symbol(lib, "nvrtcGetCUBINSize", &api.get_cubin_size, &missing) &&
                  bind_symbol(lib, "nvrtcGetCUBIN", &api.get_cubin, &missing) &&
                  bind_symbol(lib, "nvrtcGetPTXSize", &api.get_ptx_size, &missing) &&
                  bind_symbol(lib, "nvrtcGetPTX", &api.get_ptx, &missing) &&
                  bind_symbol(lib, "nvrtcGetProgramLogSize", &api.get_program_log_size, &missing) &&
                  bind_symbol(lib, "nvrtcGetProgramLog", &api.get_program_log, &missing);
  const std::string where = ok ? library_path_of(reinterpret_cast<const void*>(api.version)) : "";
  if (!ok || where.empty()) {
    api.unavailable = fmt::format(
        "the NVRTC library found does not export {}: NVRTC from CUDA 12 or 13 is needed to "
        "compile CUDA kernels (set KILN_NVRTC to its path)",
        ok ? "its own location" : missing);
    return api;
  }
  // The library stays loaded for the life of the process (NVRTC keeps global state).
  NvrtcInfo& info = api.info;
  info.library = where;
  api.version(&info.major, &info.minor);
  std::error_code ec;
  const auto bytes = fs::file_size(info.library, ec);
  info.version = fmt::format("{}.{} ({}, {} bytes)", info.major, info.minor,
                             fs::path(info.library).filename().string(),
                             ec ? 0 : static_cast<uint64_t>(bytes));
  for (const char* f : kDefaultFlags) info.flags.emplace_back(f);
  info.include_dir = find_toolkit_include_dir(info.library);
  if (!info.include_dir.empty()) info.flags.push_back("-I" + info.include_dir);
  int n = 0;
  if (api.get_num_supported_archs(&n) == NVRTC_SUCCESS && n > 0) {
    std::vector<int> archs(static_cast<size_t>(n));
    if (api.get_supported_archs(archs.data()) == NVRTC_SUCCESS)
      for (int a : archs) info.archs.push_back(fmt::format("sm_{}", a));
  }
  return api;
}

const NvrtcApi& api() {
  static const NvrtcApi a = load_nvrtc();
  return a;
}

const NvrtcApi& require_nvrtc() {
  const NvrtcApi& a = api();
  if (!a.unavailable.empty()) fail_kind(ErrorKind::NotSupported, "{}", a.unavailable);
  return a;
}

// ---- keys and entries ------------------------------------------------------------------------

const ArtifactCache& cubin_cache() {
  static const ArtifactCache cache("cuda", "cubin", kCacheFormatVersion);
  return cache;
}

const ArtifactCache& ptx_cache() {
  static const ArtifactCache cache("cuda-ptx", "ptx", kCacheFormatVersion);
  return cache;
}

std::string cache_key(const CudaCompileRequest& req, const NvrtcInfo& info) {
  KeyHasher h;
  h.field("format", fmt::format("{} {}", kMetaFormat, kCacheFormatVersion));
  h.field("source", req.source);
  h.field("nvrtc_version", info.version);
  for (const std::string& f : info.flags) h.field("flag", f);
  h.field("arch", req.arch);
  for (const std::string& f : req.extra_flags) h.field("extra_flag", f);
  return h.hex_digest();
}

// ---- compile errors --------------------------------------------------------------------------

// The LINE of a `FILE(LINE): ` location in an NVRTC log line that names `file`, or 0.
int log_line_number(std::string_view line, const std::string& file) {
  const size_t at = line.find(file + "(");
  if (at == std::string_view::npos) return 0;
  int n = 0;
  size_t i = at + file.size() + 1;
  const size_t digits_at = i;
  for (; i < line.size() && std::isdigit(static_cast<unsigned char>(line[i])); ++i)
    n = n * 10 + (line[i] - '0');
  return i > digits_at && i < line.size() && line[i] == ')' ? n : 0;
}

bool is_error_line(std::string_view line) {
  return line.find(": error") != std::string_view::npos ||
         line.find(": catastrophic error") != std::string_view::npos ||
         line.substr(0, 6) == "error:" || line.substr(0, 7) == "error :";
}

[[noreturn]] void throw_compile_error(const CudaCompileRequest& req, const std::string& unit,
                                      const std::string& key, const std::string& file,
                                      const std::string& result, const std::string& log) {
  const fs::path failed_dir = fs::path(cuda_cache_dir()) / "failed";
  const std::string stem = (failed_dir / fmt::format("{}_{}", unit, key.substr(0, 12))).string();
  const std::string kept_source = stem + ".cu", kept_log = stem + ".log";
  make_dirs(failed_dir.string());
  write_file_atomic(kept_source, req.source);
  write_file_atomic(kept_log, replace_all(log, file, kept_source));

  const std::vector<std::string_view> lines = split_lines(log);
  size_t first_error = lines.size();
  int error_line = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (!is_error_line(lines[i])) continue;
    first_error = i;
    error_line = log_line_number(lines[i], file);
    break;
  }
  const std::string where = error_location(req.source, error_line);
  const std::string excerpt =
      log_excerpt(lines, first_error, kMaxErrorLines, file, kept_source, "  (NVRTC printed nothing)\n");
  std::string hint;
  if (log.find("could not open source file \"cuda_") != std::string::npos)
    hint = " The CUDA toolkit headers were not found: set CUDA_HOME to the toolkit's folder "
           "(the one holding include/cuda_fp16.h).";
  fail_kind(ErrorKind::Internal,
            "NVRTC compile of CUDA program '{}' for {} failed{}: {}.\nFirst log lines:\n{}"
            "The failing source is kept at {} (full log: {}). Generated code that does not "
            "compile is a Kiln bug: please report it with that file.{}",
            req.program_name, req.arch, where, result, excerpt, kept_source, kept_log, hint);
}

std::string program_log(const NvrtcApi& a, nvrtcProgram prog) {
  size_t n = 0;
  if (a.get_program_log_size(prog, &n) != NVRTC_SUCCESS || n <= 1) return "";
  std::string log(n, '\0');
  if (a.get_program_log(prog, log.data()) != NVRTC_SUCCESS) return "";
  log.resize(n - 1);  // drop the terminating NUL
  return log;
}

// Runs NVRTC. Returns the cubin; *ptx gets the PTX (with its terminating NUL, as the driver
// takes it), *log NVRTC's log.
std::string run_nvrtc(const NvrtcApi& a, const CudaCompileRequest& req, const std::string& unit,
                      const std::string& key, std::string* ptx, std::string* log) {
  const std::string file = unit + ".cu";
  nvrtcProgram prog = nullptr;
  nvrtcResult r =
      a.create_program(&prog, req.source.c_str(), file.c_str(), 0, nullptr, nullptr);
  if (r != NVRTC_SUCCESS)
    fail_kind(ErrorKind::Runtime, "NVRTC cannot create CUDA program '{}': {}", req.program_name,
              a.get_error_string(r));
  struct Destroy {
    const NvrtcApi& a;
    nvrtcProgram* p;
    ~Destroy() { a.destroy_program(p); }
  } destroy{a, &prog};

  std::vector<std::string> flags = a.info.flags;
  flags.push_back("--gpu-architecture=" + req.arch);
  flags.insert(flags.end(), req.extra_flags.begin(), req.extra_flags.end());
  std::vector<const char*> argv;
  for (const std::string& f : flags) argv.push_back(f.c_str());
  r = a.compile_program(prog, static_cast<int>(argv.size()), argv.data());
  *log = program_log(a, prog);
  if (r != NVRTC_SUCCESS)
    throw_compile_error(req, unit, key, file, a.get_error_string(r), *log);
  size_t n = 0;
  r = a.get_cubin_size(prog, &n);
  if (r != NVRTC_SUCCESS || n == 0)
    fail_kind(ErrorKind::Internal,
              "NVRTC compiled CUDA program '{}' but produced no cubin for '{}' ({}): the "
              "architecture must be a real one (sm_XY), not a virtual one (compute_XY)",
              req.program_name, req.arch, r != NVRTC_SUCCESS ? a.get_error_string(r) : "0 bytes");
  std::string cubin(n, '\0');
  r = a.get_cubin(prog, cubin.data());
  if (r != NVRTC_SUCCESS)
    fail_kind(ErrorKind::Runtime, "NVRTC cannot return the cubin of CUDA program '{}': {}",
              req.program_name, a.get_error_string(r));
  n = 0;
  r = a.get_ptx_size(prog, &n);
  if (r != NVRTC_SUCCESS || n < 2)
    fail_kind(ErrorKind::Internal, "NVRTC compiled CUDA program '{}' but returned no PTX ({})",
              req.program_name, r != NVRTC_SUCCESS ? a.get_error_string(r) : "empty");
  ptx->assign(n, '\0');
  r = a.get_ptx(prog, ptx->data());
  if (r != NVRTC_SUCCESS || ptx->back() != '\0')
    fail_kind(ErrorKind::Runtime, "NVRTC cannot return the PTX of CUDA program '{}': {}",
              req.program_name, r != NVRTC_SUCCESS ? a.get_error_string(r) : "not terminated");
  return cubin;
}

void check_arch(const NvrtcInfo& info, const CudaCompileRequest& req) {
  const bool well_formed = req.arch.size() > 3 && req.arch.compare(0, 3, "sm_") == 0 &&
                           std::all_of(req.arch.begin() + 3, req.arch.end(), [](char c) {
                             return std::isalnum(static_cast<unsigned char>(c));
                           });
  std::string base = req.arch;  // sm_90a compiles with NVRTC's sm_90 support
  if (!base.empty() && std::isalpha(static_cast<unsigned char>(base.back()))) base.pop_back();
  const bool known = info.archs.empty() ||
                     std::find(info.archs.begin(), info.archs.end(), base) != info.archs.end();
  if (!well_formed || !known) {
    std::string list;
    for (const std::string& a : info.archs) list += (list.empty() ? "" : " ") + a;
    fail_kind(ErrorKind::InvalidArgument,
              "CUDA program '{}': architecture '{}' is not one NVRTC {}.{} compiles cubins for "
              "(expected sm_XY among: {}); use cuda::device_arch(device) for the GPU at hand",
              req.program_name, req.arch, info.major, info.minor, list);
  }
}

// ---- process-wide state ----------------------------------------------------------------------

struct ProcessCache {
  std::mutex mu;
  std::unordered_map<std::string, std::weak_ptr<const CompiledCubin>> live;   // by key
  std::unordered_map<std::string, std::shared_ptr<std::mutex>> in_flight;     // by key
};

ProcessCache& process_cache() {
  static ProcessCache* cache = new ProcessCache;  // never destroyed
  return *cache;
}

std::atomic<int64_t> g_hits{0}, g_misses{0}, g_rebuilt_corrupt{0};

}  // namespace

// ---- public API ------------------------------------------------------------------------------

const NvrtcInfo& nvrtc() { return require_nvrtc().info; }

bool nvrtc_available(std::string* why) {
  const NvrtcApi& a = api();
  if (why) *why = a.unavailable;
  return a.unavailable.empty();
}

std::string cuda_cache_dir() { return (fs::path(cache_dir()) / "cuda").string(); }

CudaCacheStats cuda_cache_stats() {
  return {g_hits.load(), g_misses.load(), g_rebuilt_corrupt.load()};
}

void reset_cuda_cache_stats() {
  g_hits = 0;
  g_misses = 0;
  g_rebuilt_corrupt = 0;
}

std::shared_ptr<const CompiledCubin> compile_cuda(const CudaCompileRequest& req) {
  const NvrtcApi& a = require_nvrtc();
  check_arch(a.info, req);
  const std::string key = cache_key(req, a.info);
  const std::string unit = file_safe(req.program_name);

  if (const char* dump_dir = std::getenv("KILN_DUMP_CODE"); dump_dir && *dump_dir) {
    make_dirs(dump_dir);
    write_file_atomic(
        (fs::path(dump_dir) / fmt::format("{}_{}.cu", unit, key.substr(0, 12))).string(),
        req.source);
  }

  ProcessCache& pc = process_cache();
  std::shared_ptr<std::mutex> key_mu;
  {
    std::lock_guard<std::mutex> lock(pc.mu);
    if (auto it = pc.live.find(key); it != pc.live.end())
      if (auto hit = it->second.lock()) {
        ++g_hits;
        return hit;
      }
    auto& m = pc.in_flight[key];
    if (!m) m = std::make_shared<std::mutex>();
    key_mu = m;
  }
  auto release = [&] {
    std::lock_guard<std::mutex> lock(pc.mu);
    if (key_mu.use_count() == 2) pc.in_flight.erase(key);
    key_mu.reset();
  };

  std::shared_ptr<const CompiledCubin> result;
  try {
    std::lock_guard<std::mutex> key_lock(*key_mu);
    {
      std::lock_guard<std::mutex> lock(pc.mu);  // another thread may have compiled it meanwhile
      if (auto it = pc.live.find(key); it != pc.live.end()) result = it->second.lock();
    }
    if (result) {
      ++g_hits;
    } else {
      const ArtifactCache& cache = cubin_cache();
      auto out = std::make_shared<CompiledCubin>();
      out->key = key;
      out->path = cache.paths(key).artifact;
      out->program_name = req.program_name;
      bool existed = false;
      bool ptx_existed = false;
      const bool cubin_ok = cache.validate(key, &existed, &out->cubin);
      const bool ptx_ok = cubin_ok && ptx_cache().validate(key, &ptx_existed, &out->ptx) &&
                          !out->ptx.empty() && out->ptx.back() == '\0';
      if (ptx_ok) {
        out->cache_hit = true;
        ++g_hits;
      } else {
        // A damaged cubin or PTX entry is corrupt; a cubin whose PTX was never written (a
        // cache of a Kiln before PTX) is a plain miss.
        if ((existed && !cubin_ok) || ptx_existed) ++g_rebuilt_corrupt;
        ++g_misses;
        const auto start = std::chrono::steady_clock::now();
        out->cubin = run_nvrtc(a, req, unit, key, &out->ptx, &out->log);
        out->compile_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const ArtifactCache::Fields fields = {
            {"program", file_safe(req.program_name)},
            {"arch", req.arch},
            {"compile_seconds", fmt::format("{:.3f}", out->compile_seconds)}};
        ptx_cache().put(key, out->ptx, fields);  // before the cubin: a cubin entry implies both
        cache.put(key, out->cubin, fields);
      }
      result = out;
      std::lock_guard<std::mutex> lock(pc.mu);
      std::erase_if(pc.live, [](const auto& kv) { return kv.second.expired(); });
      pc.live[key] = result;
    }
  } catch (...) {
    release();
    throw;
  }
  release();
  return result;
}

std::vector<std::shared_ptr<const CompiledCubin>> compile_cuda_all(
    const std::vector<CudaCompileRequest>& reqs) {
  const size_t n = reqs.size();
  std::vector<std::shared_ptr<const CompiledCubin>> results(n);
  std::vector<std::exception_ptr> errors(n);
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        results[i] = compile_cuda(reqs[i]);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  const size_t workers = std::min<size_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (size_t w = 1; w < workers; ++w) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return results;
}

}  // namespace kiln::cuda
