// Counts heap allocations in the kiln binary (for `kiln bench`'s steady_state_allocs_per_call).
// The executable defines the malloc family, which takes precedence over glibc's for the whole
// process (operator new, OpenMP, tensor buffers from aligned_alloc all land here); each wrapper
// bumps one relaxed atomic and forwards to glibc's implementation (__libc_*), so pointers stay
// compatible with every other glibc entry point. Only this binary pays for the counting.
//
// Note [allocation sites] (bench/bench.h): between begin() and end() of the site recorder, each
// allocation also records its callers (backtrace() into static storage: recording allocates
// nothing itself) and end() names the module whose code asked for it.
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>

#include "bench/bench.h"

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
void __libc_free(void*);
}

namespace {
constinit std::atomic<int64_t> g_allocs{0};

// The site recorder's state: at most kMaxSites allocations of kDepth frames each.
constexpr int kDepth = 24;
constexpr int64_t kMaxSites = 8192;
constinit std::atomic<bool> g_recording{false};
constinit std::atomic<int64_t> g_sites{0};
void* g_frames[kMaxSites][kDepth];
int g_depths[kMaxSites];
thread_local bool t_recording = false;  // an allocation inside backtrace() is not recorded again

void record_site() {
  if (t_recording) return;
  t_recording = true;
  const int64_t i = g_sites.fetch_add(1, std::memory_order_relaxed);
  if (i < kMaxSites) g_depths[i] = backtrace(g_frames[i], kDepth);
  t_recording = false;
}

int64_t read_allocs() { return g_allocs.load(std::memory_order_relaxed); }
void count() {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (g_recording.load(std::memory_order_relaxed)) record_site();
}

void begin_sites() {
  void* warm[2];
  backtrace(warm, 2);  // its first call loads the unwinder (which allocates)
  g_sites.store(0);
  g_recording.store(true);
}

// The basename of a loaded module's path.
std::string_view base_name(const char* path) {
  std::string_view p(path);
  size_t slash = p.rfind('/');
  return slash == std::string_view::npos ? p : p.substr(slash + 1);
}

bool starts_with_any(std::string_view name, std::initializer_list<std::string_view> prefixes) {
  for (std::string_view p : prefixes)
    if (name.starts_with(p)) return true;
  return false;
}

// Libraries whose code is passed over to find the module that asked: the C and C++ runtimes,
// the unwinder and OpenMP (an OpenMP team's allocation belongs to the code that forked it).
bool support_library(std::string_view name) {
  return starts_with_any(name, {"libc.so", "libstdc++.so", "libgcc_s.so", "libgomp.so", "libm.so",
                                "ld-linux"});
}

// Compute libraries that Kiln calls and whose allocations are their own.
bool external_library(std::string_view name) {
  return starts_with_any(name, {"libdnnl", "libcudnn", "libcublas", "libcuda.", "libcudart",
                                "libnvrtc", "libnvJitLink", "libOpenCL", "libsleef"});
}

// The module that asked for allocation `i`: past the allocator's own frames (this binary's,
// leading) and the support libraries, the first frame's module; an external library by its file
// name, anything else (this binary, libkiln_*, the generated kernels) "kiln".
std::string site_module(int64_t i, const void* self_base) {
  bool leading = true;
  for (int f = 0; f < g_depths[i]; ++f) {
    Dl_info di{};
    if (!dladdr(g_frames[i][f], &di) || !di.dli_fname) return "unattributed";
    if (leading && di.dli_fbase == self_base) continue;
    leading = false;
    std::string_view name = base_name(di.dli_fname);
    if (support_library(name)) continue;
    return external_library(name) ? std::string(name) : "kiln";
  }
  return "unattributed";
}

std::map<std::string, int64_t> end_sites() {
  g_recording.store(false);
  std::map<std::string, int64_t> out{{"kiln", 0}};
  Dl_info self{};
  dladdr(reinterpret_cast<void*>(&record_site), &self);
  const int64_t n = g_sites.load();
  for (int64_t i = 0; i < std::min(n, kMaxSites); ++i) ++out[site_module(i, self.dli_fbase)];
  if (n > kMaxSites) out["unattributed"] += n - kMaxSites;
  return out;
}

const bool g_registered = [] {
  kiln::set_alloc_counter(&read_allocs);
  kiln::set_alloc_site_recorder({&begin_sites, &end_sites});
  return true;
}();
}  // namespace

extern "C" {
void* malloc(size_t n) {
  count();
  return __libc_malloc(n);
}
void* calloc(size_t n, size_t size) {
  count();
  return __libc_calloc(n, size);
}
void* realloc(void* p, size_t n) {
  count();
  return __libc_realloc(p, n);
}
void* memalign(size_t align, size_t n) {
  count();
  return __libc_memalign(align, n);
}
void* aligned_alloc(size_t align, size_t n) {
  count();
  return __libc_memalign(align, n);
}
int posix_memalign(void** out, size_t align, size_t n) {
  // posix_memalign's contract: a power of two and a multiple of sizeof(void*).
  if (align < sizeof(void*) || (align & (align - 1)) != 0) return EINVAL;
  count();
  void* p = __libc_memalign(align, n);
  if (!p && n != 0) return ENOMEM;
  *out = p;
  return 0;
}
void free(void* p) { __libc_free(p); }
}
