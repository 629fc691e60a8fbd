#include "core/allocator.h"

#include <cstdlib>
#include <new>

#include "core/error.h"

namespace kiln {
namespace {

class AlignedCpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    size_t n = (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    if (n == 0) n = kCpuAlignment;
    void* p = std::aligned_alloc(kCpuAlignment, n);
    if (!p)
      fail_kind(ErrorKind::Runtime, "out of host memory allocating {} bytes", bytes);
    return p;
  }
  void deallocate(void* ptr, size_t) override { std::free(ptr); }
  Device device() const override { return Device::cpu(); }
};

}  // namespace

Allocator* cpu_allocator() {
  static AlignedCpuAllocator a;
  return &a;
}

Allocator* allocator_for(Device d) {
  return d.is_cpu() ? cpu_allocator() : cuda_allocator(d.index);
}

}  // namespace kiln
