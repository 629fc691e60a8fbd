// Parallel loops for Kiln's own hot paths that enter no OpenMP region on one thread.
//
// Note [one-thread parallel regions] (targets/cpu/prelude.cc): libgomp allocates a team for
// every parallel region it runs on one thread (an `if` clause that is false, num_threads(1), or
// a caller that set one thread) and frees it at the region's end; it keeps teams of two threads
// and more for the next region. A steady-state call on one thread would allocate once per such
// region. These helpers run the work on the calling thread, outside any region, whenever one
// thread would run it.
#pragma once
#include <omp.h>

#include <cstdint>

namespace kiln::kernels {

// f(thread, threads) on each of the calling thread's OpenMP threads when `share` and it has
// more than one, else f(0, 1) on the calling thread alone.
template <class F>
void parallel_region(bool share, F&& f) {
  if (share && omp_get_max_threads() > 1) {
#pragma omp parallel
    f(omp_get_thread_num(), omp_get_num_threads());
  } else {
    f(0, 1);
  }
}

// f(thread, lo, hi) for [0, n) cut into one contiguous block per thread (a static schedule)
// when `share`, else f(0, 0, n): for work that sets up per-thread state before its block.
template <class F>
void parallel_blocks(int64_t n, bool share, F&& f) {
  parallel_region(share && n > 1, [&](int thread, int threads) {
    f(thread, n * thread / threads, n * (thread + 1) / threads);
  });
}

// f(i) for i in [0, n), in parallel_blocks' blocks.
template <class F>
void parallel_for(int64_t n, bool share, F&& f) {
  parallel_blocks(n, share, [&](int, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) f(i);
  });
}

}  // namespace kiln::kernels
