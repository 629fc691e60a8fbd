// Note [Device memory from segments]
// cudaMalloc and cudaFree synchronize the device and cost tens of microseconds, and the driver
// gives memory in 2 MiB pages: a cache that obtained one allocation per tensor, rounded to
// 2 MiB above 1 MiB, held BERT-base's 768 x 768 bfloat16 weights (1.1 MiB) in 2 MiB each and
// its float32 ones (2.25 MiB) in 4 MiB — 190 MiB over the 627 MiB of weights a bfloat16
// compile of it keeps (H100, 2026-12-05). So memory now comes in segments of 32 MiB (a request
// above half of that gets a segment of its own, rounded to 2 MiB), and blocks are carved from
// a segment's unused end at 512-byte granularity (the best fit: the segment whose remaining end
// is the smallest that holds the request). A block handed back goes to the free list of its
// size, from which a request of that size takes it again (a steady-state workload hits the
// lists every call and carves nothing). When a segment has no block out any more, its blocks
// leave the free lists and it is carved from its start again — the whole segment coalesces, so
// memory freed in one pattern of sizes serves another. release_free_segments (empty_cache, and
// a failed obtain before it is retried) gives such segments back. The price: memory freed
// inside a segment that still has a block out stays with this cache (for requests of its sizes,
// or until the segment empties), where the one-allocation-per-block cache could give any freed
// block back under memory pressure. Bookkeeping allocates host memory only when a segment is
// obtained or a size is freed for the first time.
#include "core/block_cache.h"

#include <algorithm>

#include "core/error.h"

namespace kiln {

BlockCache::BlockCache(ObtainFn obtain, ReleaseFn release, void* ctx, size_t segment_bytes)
    : obtain_(obtain), release_(release), ctx_(ctx), segment_bytes_(segment_bytes) {
  KILN_ASSERT(obtain_ && release_ && segment_bytes_ % kLargeRound == 0);
}

BlockCache::~BlockCache() {
  for (const Segment& s : segments_) release_(ctx_, reinterpret_cast<void*>(s.base), s.size);
}

BlockCache::Segment* BlockCache::segment_of(uintptr_t p) {
  auto it = std::upper_bound(segments_.begin(), segments_.end(), p,
                             [](uintptr_t x, const Segment& s) { return x < s.base; });
  if (it == segments_.begin()) return nullptr;
  --it;
  return p < it->base + it->size ? &*it : nullptr;
}

void* BlockCache::carve(Segment& s, size_t n) {
  void* p = reinterpret_cast<void*>(s.base + s.used);
  s.used += n;
  s.live += n;
  note_alloc(n);
  return p;
}

void BlockCache::note_alloc(size_t n) {
  stats_.allocated_bytes += n;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
}

void* BlockCache::allocate(size_t bytes) {
  const size_t n = round(bytes);
  if (auto it = free_.find(n); it != free_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    Segment* s = segment_of(reinterpret_cast<uintptr_t>(p));
    KILN_ASSERT(s);
    s->live += n;
    ++stats_.cache_hits;
    note_alloc(n);
    return p;
  }
  Segment* best = nullptr;
  for (Segment& s : segments_)
    if (s.size - s.used >= n && (!best || s.size - s.used < best->size - best->used)) best = &s;
  if (best) return carve(*best, n);
  const size_t want = n > segment_bytes_ / 2 ? (n + kLargeRound - 1) / kLargeRound * kLargeRound
                                             : segment_bytes_;
  void* base = obtain_(ctx_, want);
  if (!base) {
    release_free_segments();
    base = obtain_(ctx_, want);
    if (!base) return nullptr;
  }
  ++stats_.segments_obtained;
  stats_.reserved_bytes += want;
  Segment seg;
  seg.base = reinterpret_cast<uintptr_t>(base);
  seg.size = want;
  auto at = std::upper_bound(segments_.begin(), segments_.end(), seg.base,
                             [](uintptr_t x, const Segment& s) { return x < s.base; });
  at = segments_.insert(at, seg);
  return carve(*at, n);
}

void BlockCache::forget_free_blocks(const Segment& s) {
  for (auto& [size, list] : free_)
    std::erase_if(list, [&](void* p) {
      const auto q = reinterpret_cast<uintptr_t>(p);
      return q >= s.base && q < s.base + s.size;
    });
}

void BlockCache::deallocate(void* ptr, size_t bytes) {
  const size_t n = round(bytes);
  Segment* s = segment_of(reinterpret_cast<uintptr_t>(ptr));
  KILN_ASSERT(s && s->live >= n);
  s->live -= n;
  stats_.allocated_bytes -= n;
  if (s->live == 0) {  // the whole segment is free again: carve it from its start
    forget_free_blocks(*s);
    s->used = 0;
    return;
  }
  free_[n].push_back(ptr);
}

void BlockCache::release_free_segments() {
  std::vector<Segment> kept;
  kept.reserve(segments_.size());
  for (const Segment& s : segments_) {
    if (s.live != 0) {
      kept.push_back(s);
      continue;
    }
    forget_free_blocks(s);  // none left by deallocate; kept for a segment never carved
    release_(ctx_, reinterpret_cast<void*>(s.base), s.size);
    stats_.reserved_bytes -= s.size;
  }
  segments_ = std::move(kept);
}

}  // namespace kiln
