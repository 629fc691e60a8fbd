// Counts heap allocations in the kiln binary (for `kiln bench`'s steady_state_allocs_per_call).
// The executable defines the malloc family, which takes precedence over glibc's for the whole
// process (operator new, OpenMP, tensor buffers from aligned_alloc all land here); each wrapper
// bumps one relaxed atomic and forwards to glibc's implementation (__libc_*), so pointers stay
// compatible with every other glibc entry point. Only this binary pays for the counting.
#include <errno.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

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

int64_t read_allocs() { return g_allocs.load(std::memory_order_relaxed); }
void count() { g_allocs.fetch_add(1, std::memory_order_relaxed); }

const bool g_registered = [] {
  kiln::set_alloc_counter(&read_allocs);
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
