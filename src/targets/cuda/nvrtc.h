// NVRTC: one generated CUDA C program (many kernels) to a cubin for one architecture, cached on
// disk by content (Note [CUDA kernel cache] in nvrtc.cc), the way targets/cpu/toolchain caches
// shared objects. NVRTC is loaded with dlopen, so binaries start without it; it needs no GPU,
// so a cross-build for sm_90 works on any machine that has the library.
//
//   auto cubin = cuda::compile_cuda({.source = src, .program_name = "main", .arch = "sm_90"});
//   auto module = cuda::CudaModule::load(cubin->cubin, 0, "main");   // cuda_driver.h
//
// Generated sources precede every kernel with a marker line `// kiln-kernel: NAME` (the CPU
// convention); a compile error is reported against the kernel whose marker precedes the first
// error line, with NVRTC's log.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kiln::cuda {

struct CudaCompileRequest {
  std::string source;                    // the whole program
  std::string program_name = "program";  // for messages, file names and NVRTC's log
  std::string arch = "sm_90";            // a real architecture: the result is a cubin
  std::vector<std::string> extra_flags;  // after the default flags; part of the cache key
};

// A compiled program. The bytes stay valid as long as the object lives.
struct CompiledCubin {
  std::string cubin;         // the cubin image (cuda::CudaModule::load takes it)
  std::string ptx;           // the PTX of the same compile (NUL-terminated text, for the JIT of
                             // GPUs of newer architectures: Note [PTX in CUDA packages])
  std::string key;           // content hash: 64 hex digits
  std::string path;          // the .cubin in the cache
  std::string program_name;  // as requested
  std::string log;           // NVRTC's warnings; empty on a cache hit
  bool cache_hit = false;    // read from the disk cache, NVRTC not run
  double compile_seconds = 0;  // NVRTC wall time; 0 on a hit
};

// Compiles (or finds in the cache) one program. Thread-safe; processes may share the cache.
// Throws kiln::Error: NVRTC missing (NotSupported, says how to get it), an unknown
// architecture (InvalidArgument), a compile error (Internal: generated code is Kiln's).
std::shared_ptr<const CompiledCubin> compile_cuda(const CudaCompileRequest& req);

// Several programs compiled concurrently (NVRTC is thread-safe; at most hardware_concurrency
// at once); results in the order of `reqs`. All run to the end; the failure of the lowest
// index is rethrown.
std::vector<std::shared_ptr<const CompiledCubin>> compile_cuda_all(
    const std::vector<CudaCompileRequest>& reqs);

struct NvrtcInfo {
  std::string library;             // the loaded libnvrtc, resolved path
  int major = 0, minor = 0;        // nvrtcVersion
  std::string version;             // "13.0 (libnvrtc.so.13, 109338064 bytes)": in the key
  std::string include_dir;         // the toolkit headers (cuda_fp16.h); "" when not found
  std::vector<std::string> flags;  // default flags (-I include_dir among them), before the arch
  std::vector<std::string> archs;  // supported architectures, e.g. "sm_75" ... "sm_121"
};
// Loads NVRTC once per process (thread-safe). Throws NotSupported when it cannot be found:
// "NVRTC (libnvrtc.so.13) is needed to compile CUDA kernels: ...".
const NvrtcInfo& nvrtc();
// True when NVRTC can be loaded; `why` gets the reason when not.
bool nvrtc_available(std::string* why = nullptr);

// Counters since the process started (or reset): hits, NVRTC runs, and the runs that replaced
// an invalid cache entry.
struct CudaCacheStats {
  int64_t hits = 0, misses = 0, rebuilt_corrupt = 0;
};
CudaCacheStats cuda_cache_stats();
void reset_cuda_cache_stats();

// The cache folder for cubins: <cache_dir()>/cuda (cache_dir() from support/files.h).
std::string cuda_cache_dir();

}  // namespace kiln::cuda
