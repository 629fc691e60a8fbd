// Tensor: a strided view over reference-counted storage.
//
// Note [Tensor model]
// A Tensor is a handle (Ref<TensorImpl>); copying a Tensor shares it, like libtorch. Views
// (reshape/permute/slice/expand/...) are new TensorImpls over the same Storage with their own
// sizes, strides and element offset. Storage carries a version counter bumped by every in-place
// write, which capture uses to guard parameters against mutation. A TensorImpl without storage
// is "fake": it has a type but no data (capture records ops on such tensors).
#pragma once
#include <atomic>
#include <cstdint>
#include <source_location>
#include <span>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/ref.h"
#include "core/shape.h"
#include "core/tensor_type.h"

namespace kiln {

class Storage : public RefCounted {
 public:
  // Owning storage from an allocator.
  Storage(size_t nbytes, Allocator* alloc);
  // Non-owning storage over external memory (arena slices, mmapped weights). The caller keeps
  // the memory alive for the Storage's lifetime.
  Storage(void* data, size_t nbytes, Device device);
  ~Storage();

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  uint64_t version() const { return version_; }
  void bump_version();
  // Creation order of storages in this process (capture tells tensors created while tracing
  // from pre-existing ones, e.g. parameters).
  uint64_t serial() const { return serial_; }
  // Capture (Note [Host reads of call inputs] in capture/compile.cc): nonzero while some trace
  // treats a read of this storage's data as a graph break (it holds a traced call's input).
  std::atomic<int32_t> capture_watch{0};

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Allocator* alloc_ = nullptr;
  Device device_;
  uint64_t version_ = 0;
  uint64_t serial_ = 0;
};

// The serial the next Storage will get.
uint64_t next_storage_serial();

// Incremented by every Storage::bump_version (every in-place write through copy_ or
// bump_version): a guard that saw the same epoch knows no tensor was mutated since.
uint64_t global_mutation_epoch();

class TensorImpl : public RefCounted {
 public:
  Ref<Storage> storage;
  int64_t offset = 0;  // in elements
  Dims sizes;
  Dims strides;
  DType dtype = DType::Float32;
  Device device;
  // Capture (see src/capture): the value this tensor stands for in the graph being traced.
  int64_t capture_value = -1;
  uint64_t capture_epoch = 0;
};

class Generator;

// Note [Materialization hook]
// Capture records ops on fake tensors. When host code reads one of them (item(), to_vector(),
// raw_data()), capture must run the graph recorded so far to produce real data: a graph break.
// Capture installs this thread-local hook; `what` names the read ("item()") and `where` the
// caller's location. After the hook returns, the tensor has storage. The hook is also called
// for a tensor with storage whose Storage::capture_watch is set (a traced call's input): that
// read steers the host code just as much, and is a graph break too.
using MaterializeHook = void (*)(TensorImpl* impl, const char* what, const char* where);
MaterializeHook set_materialize_hook(MaterializeHook hook);

class Tensor {
 public:
  Tensor() = default;  // undefined
  explicit Tensor(Ref<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Factories (contiguous).
  static Tensor empty(const Dims& sizes, DType dtype = DType::Float32, Device dev = Device::cpu());
  static Tensor zeros(const Dims& sizes, DType dtype = DType::Float32, Device dev = Device::cpu());
  static Tensor ones(const Dims& sizes, DType dtype = DType::Float32, Device dev = Device::cpu());
  static Tensor full(const Dims& sizes, double value, DType dtype = DType::Float32);
  static Tensor scalar(double value, DType dtype = DType::Float32);
  static Tensor arange(int64_t n, DType dtype = DType::Int64);
  // Standard normal (Box-Muller) / uniform [lo, hi) values from `gen`, computed in float64.
  static Tensor randn(const Dims& sizes, Generator& gen, DType dtype = DType::Float32);
  static Tensor rand(const Dims& sizes, Generator& gen, double lo = 0.0, double hi = 1.0,
                     DType dtype = DType::Float32);
  static Tensor randint(const Dims& sizes, Generator& gen, int64_t lo, int64_t hi,
                        DType dtype = DType::Int64);
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Dims& sizes) {
    Tensor t = empty(sizes, DTypeOf<T>::value);
    KILN_CHECK(int64_t(values.size()) == t.numel(), "from_vector: {} values for shape {}",
               values.size(), to_string(sizes));
    T* p = t.data<T>();
    for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
    return t;
  }
  // A fake tensor: type only, no storage (used by capture and shape-only tooling).
  static Tensor fake(const Dims& sizes, DType dtype, Device dev = Device::cpu());
  // A view over external memory (not owned).
  static Tensor from_blob(void* data, const Dims& sizes, DType dtype, Device dev = Device::cpu());

  bool defined() const { return bool(impl_); }
  bool has_storage() const { return impl_ && impl_->storage; }
  TensorImpl* impl() const { return impl_.get(); }
  const Ref<TensorImpl>& impl_ref() const { return impl_; }

  const Dims& sizes() const { return impl_->sizes; }
  const Dims& strides() const { return impl_->strides; }
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int dim() const { return int(impl_->sizes.size()); }
  int64_t numel() const { return kiln::numel(impl_->sizes); }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->device; }
  int64_t offset() const { return impl_->offset; }
  int64_t element_size() const { return dtype_size(impl_->dtype); }
  size_t nbytes() const { return size_t(numel()) * size_t(element_size()); }
  bool is_contiguous() const;
  TensorType type() const;

  // Pointer to the first element (storage base + offset). Throws for fake tensors.
  void* raw_data() const;
  template <typename T>
  T* data() const {
    KILN_CHECK(DTypeOf<T>::value == dtype(), "data<{}>() on a {} tensor",
               dtype_name(DTypeOf<T>::value), dtype_name(dtype()));
    return static_cast<T*>(raw_data());
  }

  // Shares storage; sizes/strides/offset are taken as given (checked against storage bounds).
  Tensor as_strided(const Dims& sizes, const Dims& strides, int64_t offset) const;
  // Contiguous copy if not contiguous, otherwise this tensor.
  Tensor contiguous() const;
  Tensor clone() const;  // always a contiguous copy on the same device
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  // Copies src into this tensor (same shape, any strides/dtype: converts), bumping the version.
  void copy_(const Tensor& src);
  void bump_version() const;
  uint64_t version() const;

  // Host reads of data. Under capture these are graph breaks (see src/capture); `loc` names
  // the caller in break reports.
  double item(const std::source_location& loc = std::source_location::current()) const;
  template <typename T>
  std::vector<T> to_vector(const std::source_location& loc = std::source_location::current()) const;
  // Makes a fake tensor under capture real (no-op otherwise); see Note [Materialization hook].
  void materialize(const char* what, const std::source_location& loc) const;

  std::string str(int max_elements = 16) const;  // readable summary with leading values

  friend bool same_tensor(const Tensor& a, const Tensor& b) { return a.impl_ == b.impl_; }

 private:
  Ref<TensorImpl> impl_;
};

using TensorList = std::vector<Tensor>;

// Deterministic random numbers (xoshiro256** seeded by splitmix64); same seed, same stream
// on every machine.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0);
  uint64_t next_u64();
  double uniform();  // [0, 1)
  double normal();   // standard normal
  void seed(uint64_t s);

 private:
  uint64_t s_[4];
  bool has_spare_ = false;
  double spare_ = 0;
};

// Iterates over all index tuples of `sizes` in row-major order, calling f(const int64_t* idx).
template <typename F>
void for_each_index(const Dims& sizes, F&& f) {
  int r = int(sizes.size());
  int64_t n = numel(sizes);
  if (n == 0) return;
  int64_t idx[kMaxRank] = {0};
  for (int64_t i = 0; i < n; ++i) {
    f(static_cast<const int64_t*>(idx));
    for (int d = r - 1; d >= 0; --d) {
      if (++idx[d] < sizes[d]) break;
      idx[d] = 0;
    }
  }
}

inline int64_t offset_of(const int64_t* idx, const Dims& strides) {
  int64_t o = 0;
  for (size_t d = 0; d < strides.size(); ++d) o += idx[d] * strides[d];
  return o;
}

}  // namespace kiln
