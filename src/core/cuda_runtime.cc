// CUDA runtime glue and the caching allocator. Linked against the static cudart, which loads
// libcuda.so at run time: on a machine without a driver every call below returns an error code
// that we turn into "no CUDA device" instead of failing to start.
#include "core/cuda_runtime.h"
#include "core/block_cache.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"

namespace kiln {

namespace {
struct DeviceQuery {
  int count = 0;
  std::string reason;
};
const DeviceQuery& query() {
  static DeviceQuery q = [] {
    DeviceQuery r;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      r.reason = cudaGetErrorString(e);
      cudaGetLastError();  // clear the sticky error
      return r;
    }
    r.count = n;
    if (n == 0) r.reason = "the CUDA runtime reports zero devices";
    return r;
  }();
  return q;
}
}  // namespace

int cuda_device_count() { return query().count; }

std::string cuda_status() {
  const DeviceQuery& q = query();
  if (q.count == 0) return "no CUDA device: " + q.reason;
  std::string s = std::to_string(q.count) + " CUDA device(s):";
  for (int i = 0; i < q.count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) == cudaSuccess)
      s += " [" + std::to_string(i) + "] " + p.name + " (sm_" + std::to_string(p.major) +
           std::to_string(p.minor) + ", " + std::to_string(p.totalGlobalMem >> 20) + " MiB)";
  }
  return s;
}

void require_cuda_device(int index, const char* what) {
  const DeviceQuery& q = query();
  if (q.count == 0)
    fail_kind(ErrorKind::NotSupported, "{}: no CUDA device ({}); run on a machine with an NVIDIA "
              "GPU or use device 'cpu'", what, q.reason);
  if (index < 0 || index >= q.count)
    fail_kind(ErrorKind::InvalidArgument, "{}: CUDA device {} does not exist ({} present)", what,
              index, q.count);
}

void check_cuda(int code, const char* what) {
  if (code != cudaSuccess) {
    const char* msg = cudaGetErrorString(cudaError_t(code));
    cudaGetLastError();
    fail_kind(ErrorKind::Runtime, "CUDA error in {}: {}", what, msg);
  }
}

void cuda_synchronize(int index) {
  require_cuda_device(index, "cuda_synchronize");
  check_cuda(cudaSetDevice(index), "cudaSetDevice");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

void cuda_memcpy(void* dst, const void* src, size_t bytes, CopyKind kind) {
  if (bytes == 0) return;
  cudaMemcpyKind k = kind == CopyKind::HostToDevice   ? cudaMemcpyHostToDevice
                     : kind == CopyKind::DeviceToHost ? cudaMemcpyDeviceToHost
                                                      : cudaMemcpyDeviceToDevice;
  check_cuda(cudaMemcpy(dst, src, bytes, k), "cudaMemcpy");
}

CudaEventTimer::CudaEventTimer(int index) : index_(index) {
  require_cuda_device(index, "CudaEventTimer");
  check_cuda(cudaSetDevice(index), "cudaSetDevice");
  cudaEvent_t a = nullptr, b = nullptr;
  check_cuda(cudaEventCreate(&a), "cudaEventCreate");
  cudaError_t e = cudaEventCreate(&b);
  if (e != cudaSuccess) cudaEventDestroy(a);
  check_cuda(e, "cudaEventCreate");
  start_ = a;
  stop_ = b;
}

CudaEventTimer::~CudaEventTimer() {
  if (start_) cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  if (stop_) cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}

// Stream 0 is the legacy default stream (the kernels' stream; see src/eager/cuda/register.cc).
void CudaEventTimer::start() {
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(start_), 0), "cudaEventRecord");
}
void CudaEventTimer::stop() {
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(stop_), 0), "cudaEventRecord");
}
double CudaEventTimer::elapsed_ms() {
  check_cuda(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_)), "cudaEventSynchronize");
  float ms = 0;
  check_cuda(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_),
                                  static_cast<cudaEvent_t>(stop_)),
             "cudaEventElapsedTime");
  return double(ms);
}

CudaEventLog::CudaEventLog(int index) : index_(index) {
  require_cuda_device(index, "CudaEventLog");
}

CudaEventLog::~CudaEventLog() {
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

int CudaEventLog::record(void* stream) {
  if (used_ == int(events_.size())) {
    check_cuda(cudaSetDevice(index_), "cudaSetDevice");
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreate(&e), "cudaEventCreate");
    events_.push_back(e);
  }
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(events_[size_t(used_)]),
                             static_cast<cudaStream_t>(stream)),
             "cudaEventRecord");
  return used_++;
}

namespace {
void CUDART_CB sleep_on_stream(void* us) {
  std::this_thread::sleep_for(std::chrono::microseconds(reinterpret_cast<intptr_t>(us)));
}
}  // namespace

void CudaEventLog::hold(void* stream, int microseconds) {
  check_cuda(cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), sleep_on_stream,
                                reinterpret_cast<void*>(intptr_t(microseconds))),
             "cudaLaunchHostFunc");
}

void CudaEventLog::synchronize() {
  // Every event: those of other streams may finish after the last one recorded.
  for (int i = 0; i < used_; ++i)
    check_cuda(cudaEventSynchronize(static_cast<cudaEvent_t>(events_[size_t(i)])),
               "cudaEventSynchronize");
}

double CudaEventLog::elapsed_ms(int a, int b) const {
  KILN_CHECK(a >= 0 && b >= 0 && a < used_ && b < used_, "CudaEventLog: events {} and {} of {}",
             a, b, used_);
  float ms = 0;
  check_cuda(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(events_[size_t(a)]),
                                  static_cast<cudaEvent_t>(events_[size_t(b)])),
             "cudaEventElapsedTime");
  return double(ms);
}

void CudaEventLog::clear() { used_ = 0; }

// ---- caching allocator -----------------------------------------------------------------------
// Note [CUDA caching allocator]
// cudaMalloc/cudaFree synchronize the device and cost tens of microseconds, so memory is kept:
// segments from cudaMalloc, blocks carved from them and reused by size (BlockCache, Note
// [Device memory from segments] in block_cache.cc). cuda_empty_cache() returns every segment
// with no block in use to the driver; a cudaMalloc that fails does the same and is retried.
namespace {

class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int index) : index_(index), cache_(&obtain, &give_back, this) {}
  void* allocate(size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    void* p = cache_.allocate(bytes);
    if (!p)
      fail_kind(ErrorKind::Runtime, "CUDA out of memory on cuda:{} allocating {} bytes ({})",
                index_, bytes, cudaGetErrorString(last_error_));
    return p;
  }
  void deallocate(void* ptr, size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    cache_.deallocate(ptr, bytes);
  }
  Device device() const override { return Device::cuda(index_); }
  CudaAllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    const BlockCache::Stats& c = cache_.stats();
    CudaAllocatorStats s;
    s.allocated_bytes = c.allocated_bytes;
    s.reserved_bytes = c.reserved_bytes;
    s.peak_allocated_bytes = c.peak_allocated_bytes;
    s.cuda_malloc_calls = c.segments_obtained;
    s.cache_hits = c.cache_hits;
    return s;
  }
  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    cache_.release_free_segments();
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    cache_.reset_peak();
  }

 private:
  static void* obtain(void* ctx, size_t bytes) {
    auto* self = static_cast<CudaCachingAllocator*>(ctx);
    check_cuda(cudaSetDevice(self->index_), "cudaSetDevice");
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear it: the cache releases its free segments and asks again
      self->last_error_ = e;
      return nullptr;
    }
    return p;
  }
  static void give_back(void* ctx, void* p, size_t) {
    auto* self = static_cast<CudaCachingAllocator*>(ctx);
    cudaSetDevice(self->index_);
    cudaFree(p);
  }
  int index_;
  std::mutex mu_;
  cudaError_t last_error_ = cudaSuccess;
  BlockCache cache_;
};

std::mutex g_alloc_mu;
std::vector<CudaCachingAllocator*>& allocators() {
  static auto* v = new std::vector<CudaCachingAllocator*>();
  return *v;
}

}  // namespace

Allocator* cuda_allocator(int index) {
  require_cuda_device(index, "CUDA allocation");
  std::lock_guard<std::mutex> lock(g_alloc_mu);
  auto& v = allocators();
  if (v.size() <= size_t(index)) v.resize(size_t(index) + 1, nullptr);
  if (!v[size_t(index)]) v[size_t(index)] = new CudaCachingAllocator(index);  // process lifetime
  return v[size_t(index)];
}

CudaAllocatorStats cuda_allocator_stats(int index) {
  require_cuda_device(index, "cuda_allocator_stats");
  return static_cast<CudaCachingAllocator*>(cuda_allocator(index))->stats();
}

void cuda_reset_peak_stats(int index) {
  require_cuda_device(index, "cuda_reset_peak_stats");
  static_cast<CudaCachingAllocator*>(cuda_allocator(index))->reset_peak();
}

void cuda_empty_cache() {
  std::lock_guard<std::mutex> lock(g_alloc_mu);
  for (CudaCachingAllocator* a : allocators())
    if (a) a->empty_cache();
}

namespace {
std::string version_str(int v) {  // CUDA encodes 13.0 as 13000
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}
}  // namespace

std::string cuda_runtime_version() {
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return version_str(v);
}

std::string cuda_driver_version() {
  int v = 0;
  // 0 when no driver is installed.
  if (cudaDriverGetVersion(&v) != cudaSuccess || v <= 0) {
    cudaGetLastError();
    return "";
  }
  return version_str(v);
}

CudaDeviceInfo cuda_device_info(int index) {
  CudaDeviceInfo info;
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, index) != cudaSuccess) {
    cudaGetLastError();
    info.error = "cudaGetDeviceProperties failed";
    return info;
  }
  info.name = p.name;
  info.sm_major = p.major;
  info.sm_minor = p.minor;
  info.memory_bytes = p.totalGlobalMem;
  info.multiprocessors = p.multiProcessorCount;
  info.l2_cache_bytes = p.l2CacheSize;
  return info;
}

}  // namespace kiln
