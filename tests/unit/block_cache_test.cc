// BlockCache (core/block_cache.h): the CUDA caching allocator's bookkeeping, here over host
// memory from aligned_alloc so that every rule is checked on any machine.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/block_cache.h"

namespace kiln {
namespace {

constexpr size_t kSeg = size_t(4) << 20;  // 4 MiB segments: a request above 2 MiB gets its own

struct Host {
  int obtained = 0, released = 0, refuse = 0;  // refuse: the next `refuse` obtains fail
  size_t live_bytes = 0;
  static void* obtain(void* ctx, size_t bytes) {
    auto* h = static_cast<Host*>(ctx);
    if (h->refuse > 0) {
      --h->refuse;
      return nullptr;
    }
    ++h->obtained;
    h->live_bytes += bytes;
    return std::aligned_alloc(4096, bytes);
  }
  static void release(void* ctx, void* p, size_t bytes) {
    auto* h = static_cast<Host*>(ctx);
    ++h->released;
    h->live_bytes -= bytes;
    std::free(p);
  }
};

uintptr_t addr(void* p) { return reinterpret_cast<uintptr_t>(p); }

TEST(BlockCache, BlocksAreCarvedAtGranuleSizesFromOneSegment) {
  Host h;
  {
    BlockCache c(&Host::obtain, &Host::release, &h, kSeg);
    void* a = c.allocate(1);
    void* b = c.allocate(1000);
    void* d = c.allocate(1 << 20);
    EXPECT_EQ(h.obtained, 1);
    EXPECT_EQ(addr(b) - addr(a), 512u);           // 1 byte takes one granule
    EXPECT_EQ(addr(d) - addr(b), 1024u);          // 1000 bytes take two
    EXPECT_EQ(c.stats().allocated_bytes, 512u + 1024u + (1u << 20));
    EXPECT_EQ(c.stats().reserved_bytes, kSeg);
    EXPECT_EQ(addr(a) % 512, 0u);
    // Writable, and the blocks do not overlap.
    std::memset(a, 1, 512);
    std::memset(b, 2, 1024);
    std::memset(d, 3, 1 << 20);
    EXPECT_EQ(static_cast<unsigned char*>(a)[511], 1);
    EXPECT_EQ(static_cast<unsigned char*>(b)[1023], 2);
    c.deallocate(a, 1);
    c.deallocate(b, 1000);
    c.deallocate(d, 1 << 20);
    EXPECT_EQ(c.stats().allocated_bytes, 0u);
    EXPECT_EQ(c.stats().peak_allocated_bytes, 512u + 1024u + (1u << 20));
  }
  EXPECT_EQ(h.released, h.obtained);  // the destructor gives every segment back
  EXPECT_EQ(h.live_bytes, 0u);
}

TEST(BlockCache, AFreedBlockServesTheNextRequestOfItsSize) {
  Host h;
  BlockCache c(&Host::obtain, &Host::release, &h, kSeg);
  void* keep = c.allocate(4096);  // keeps the segment in use
  void* x = c.allocate(3000);
  c.deallocate(x, 3000);
  void* y = c.allocate(2900);  // rounds to the same 3072
  EXPECT_EQ(y, x);
  EXPECT_EQ(c.stats().cache_hits, 1);
  void* z = c.allocate(3000);  // the list is empty again: carved
  EXPECT_NE(z, x);
  EXPECT_EQ(c.stats().cache_hits, 1);
  EXPECT_EQ(h.obtained, 1);
  c.deallocate(y, 2900);
  c.deallocate(z, 3000);
  c.deallocate(keep, 4096);
}

TEST(BlockCache, ASegmentWithNothingOutIsCarvedFromItsStartAgain) {
  Host h;
  BlockCache c(&Host::obtain, &Host::release, &h, kSeg);
  std::vector<void*> small;
  for (int i = 0; i < 8; ++i) small.push_back(c.allocate(256 << 10));  // 2 MiB of 256 KiB blocks
  void* first = small[0];
  for (void* p : small) c.deallocate(p, 256 << 10);
  // All free: the segment coalesces, so a 3 MiB request fits in it (no new segment) at its start.
  void* big = c.allocate(size_t(3) << 20);
  EXPECT_EQ(h.obtained, 1);
  EXPECT_EQ(big, first);
  EXPECT_EQ(c.stats().cache_hits, 0);  // the 256 KiB blocks left the free list
  c.deallocate(big, size_t(3) << 20);
}

TEST(BlockCache, ALargeRequestGetsItsOwnSegmentRoundedTo2MiB) {
  Host h;
  BlockCache c(&Host::obtain, &Host::release, &h, kSeg);
  void* s = c.allocate(1000);
  const size_t big = (size_t(5) << 20) + 1;  // above half a segment: its own, 6 MiB
  void* b = c.allocate(big);
  EXPECT_EQ(h.obtained, 2);
  EXPECT_EQ(c.stats().reserved_bytes, kSeg + (size_t(6) << 20));
  EXPECT_EQ(c.stats().allocated_bytes, 1024u + BlockCache::round(big));
  // A small request goes to the segment whose free end is the smallest that holds it (best
  // fit): the 4 MiB segment's 4 MiB - 1 KiB, not the large one's 1 MiB - 512 B end, when it does
  // not fit there; here 600 KiB fits both, and the large segment's end is smaller.
  void* m = c.allocate(600 << 10);
  EXPECT_GT(addr(m), addr(b));
  EXPECT_LT(addr(m), addr(b) + (size_t(6) << 20));
  c.deallocate(m, 600 << 10);
  c.deallocate(b, big);
  c.deallocate(s, 1000);
}

TEST(BlockCache, ReleaseGivesBackOnlySegmentsWithNothingOut) {
  Host h;
  BlockCache c(&Host::obtain, &Host::release, &h, kSeg);
  void* a = c.allocate(3 << 20);  // own segment (4 MiB), 1 MiB left at its end
  void* b = c.allocate(3 << 19);  // 1.5 MiB does not fit there: a shared segment
  EXPECT_EQ(c.segment_count(), 2u);
  c.deallocate(a, 3 << 20);
  c.release_free_segments();
  EXPECT_EQ(c.segment_count(), 1u);
  EXPECT_EQ(h.released, 1);
  EXPECT_EQ(c.stats().reserved_bytes, kSeg);
  EXPECT_EQ(c.stats().allocated_bytes, size_t(3) << 19);
  c.deallocate(b, 3 << 19);
  c.release_free_segments();
  EXPECT_EQ(c.segment_count(), 0u);
  EXPECT_EQ(c.stats().reserved_bytes, 0u);
  EXPECT_EQ(h.live_bytes, 0u);
}

TEST(BlockCache, AFailedObtainReleasesFreeSegmentsAndAsksOnce) {
  Host h;
  BlockCache c(&Host::obtain, &Host::release, &h, kSeg);
  void* a = c.allocate(3 << 20);
  c.deallocate(a, 3 << 20);  // a free segment, kept
  h.refuse = 1;
  void* b = c.allocate(5 << 20);  // does not fit: obtain fails, the free segment goes, retried
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(h.released, 1);
  EXPECT_EQ(c.segment_count(), 1u);
  h.refuse = 2;
  EXPECT_EQ(c.allocate(7 << 20), nullptr);  // fails twice: null, nothing else changed
  EXPECT_EQ(c.stats().allocated_bytes, BlockCache::round(5 << 20));
  c.deallocate(b, 5 << 20);
}

TEST(BlockCache, ASteadyLoopHitsTheListsAndObtainsNothing) {
  Host h;
  BlockCache c(&Host::obtain, &Host::release, &h, kSeg);
  void* weights = c.allocate(1 << 20);  // alive throughout, as a model's weights are
  for (int i = 0; i < 3; ++i) {  // warm-up
    void* t1 = c.allocate(70000);
    void* t2 = c.allocate(5000);
    c.deallocate(t1, 70000);
    c.deallocate(t2, 5000);
  }
  const BlockCache::Stats before = c.stats();
  const int obtained = h.obtained;
  for (int i = 0; i < 100; ++i) {
    void* t1 = c.allocate(70000);
    void* t2 = c.allocate(5000);
    c.deallocate(t1, 70000);
    c.deallocate(t2, 5000);
  }
  EXPECT_EQ(h.obtained, obtained);
  EXPECT_EQ(c.stats().cache_hits - before.cache_hits, 200);
  c.deallocate(weights, 1 << 20);
}

}  // namespace
}  // namespace kiln
