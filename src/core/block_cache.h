// BlockCache: the CUDA caching allocator's bookkeeping (Note [Device memory from segments] in
// block_cache.cc), apart from CUDA so that it is tested on any machine. Memory comes from large
// segments that the caller's functions obtain and release (cudaMalloc / cudaFree); blocks are
// carved from them at 512-byte granularity and reused by size. Not thread-safe: the caller locks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace kiln {

class BlockCache {
 public:
  // Returns null when the memory is not there (the cache then releases its free segments and
  // asks once more); `release` gives back what `obtain` returned, with its size.
  using ObtainFn = void* (*)(void* ctx, size_t bytes);
  using ReleaseFn = void (*)(void* ctx, void* ptr, size_t bytes);

  static constexpr size_t kGranule = 512;
  static constexpr size_t kSegmentBytes = size_t(32) << 20;
  static constexpr size_t kLargeRound = size_t(2) << 20;  // a request's own segment: 2 MiB multiples

  BlockCache(ObtainFn obtain, ReleaseFn release, void* ctx, size_t segment_bytes = kSegmentBytes);
  ~BlockCache();  // releases every segment (blocks still handed out become invalid)
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  static size_t round(size_t bytes) {
    return bytes == 0 ? kGranule : (bytes + kGranule - 1) / kGranule * kGranule;
  }
  // A block of at least `bytes`, aligned to kGranule from its segment's start; null when the
  // memory is not there even after the free segments were released.
  void* allocate(size_t bytes);
  // `bytes`: what was asked of allocate for `ptr`.
  void deallocate(void* ptr, size_t bytes);
  // Gives back every segment with no block handed out.
  void release_free_segments();

  struct Stats {
    size_t allocated_bytes = 0;       // handed out now (each block's rounded size)
    size_t reserved_bytes = 0;        // in segments
    size_t peak_allocated_bytes = 0;  // since creation or reset_peak()
    int64_t segments_obtained = 0;    // calls of obtain that returned memory
    int64_t cache_hits = 0;           // blocks handed out again from the free lists
  };
  const Stats& stats() const { return stats_; }
  void reset_peak() { stats_.peak_allocated_bytes = stats_.allocated_bytes; }
  size_t segment_count() const { return segments_.size(); }

 private:
  struct Segment {
    uintptr_t base = 0;
    size_t size = 0;
    size_t used = 0;  // carved so far, from the start
    size_t live = 0;  // bytes of its blocks handed out now
  };
  Segment* segment_of(uintptr_t p);
  void* carve(Segment& s, size_t n);
  void forget_free_blocks(const Segment& s);
  void note_alloc(size_t n);

  ObtainFn obtain_;
  ReleaseFn release_;
  void* ctx_;
  size_t segment_bytes_;
  std::vector<Segment> segments_;                 // sorted by base
  std::map<size_t, std::vector<void*>> free_;     // rounded size -> blocks handed back
  Stats stats_;
};

}  // namespace kiln
