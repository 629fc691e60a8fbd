// Allocators. CPU: 64-byte aligned (AVX-512 loads, oneDNN). CUDA: a caching allocator on top of
// cudaMalloc that keeps freed blocks in size-rounded free lists per device.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/device.h"

namespace kiln {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
  virtual Device device() const = 0;
};

inline constexpr size_t kCpuAlignment = 64;

Allocator* cpu_allocator();
// Throws kiln::Error ("no CUDA device ...") when the device does not exist.
Allocator* cuda_allocator(int index);
Allocator* allocator_for(Device d);

struct CudaAllocatorStats {
  size_t allocated_bytes = 0;   // handed out to tensors now
  size_t reserved_bytes = 0;    // obtained from cudaMalloc (allocated + cached)
  size_t peak_allocated_bytes = 0;  // highest allocated_bytes since creation or the last reset
  int64_t cuda_malloc_calls = 0;
  int64_t cache_hits = 0;
};
CudaAllocatorStats cuda_allocator_stats(int index);
// Starts a new peak: peak_allocated_bytes becomes the bytes allocated now (what `kiln bench`
// does before it measures, so that its peak covers only its own run).
void cuda_reset_peak_stats(int index);
// Returns cached blocks of every device to the driver.
void cuda_empty_cache();

}  // namespace kiln
