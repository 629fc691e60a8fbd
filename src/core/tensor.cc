#include "core/tensor.h"

#include <atomic>
#include <cmath>
#include <cstring>

#include "core/cuda_runtime.h"

namespace kiln {

namespace {
std::atomic<uint64_t> g_mutation_epoch{0};
std::atomic<uint64_t> g_storage_serial{1};
}  // namespace

// ---- Storage ----------------------------------------------------------------------------------
Storage::Storage(size_t nbytes, Allocator* alloc)
    : nbytes_(nbytes), alloc_(alloc), device_(alloc->device()),
      serial_(g_storage_serial.fetch_add(1, std::memory_order_relaxed)) {
  data_ = alloc->allocate(nbytes);
}
Storage::Storage(void* data, size_t nbytes, Device device)
    : data_(data), nbytes_(nbytes), device_(device),
      serial_(g_storage_serial.fetch_add(1, std::memory_order_relaxed)) {}
uint64_t next_storage_serial() { return g_storage_serial.load(std::memory_order_relaxed); }
uint64_t global_mutation_epoch() { return g_mutation_epoch.load(std::memory_order_acquire); }
void Storage::bump_version() {
  ++version_;
  g_mutation_epoch.fetch_add(1, std::memory_order_acq_rel);
}

Storage::~Storage() {
  if (alloc_ && data_) alloc_->deallocate(data_, nbytes_);
}

std::string TensorType::str() const {
  std::string s = info(dtype).short_name;
  s += to_string(shape);
  if (!strides.empty()) s += " strides " + to_string(strides);
  if (!device.is_cpu()) s += " @" + device.str();
  return s;
}

// ---- factories --------------------------------------------------------------------------------
static Tensor make(const Dims& sizes, DType dtype, Device dev, bool with_storage) {
  // Every size is >= 0, and the sizes' product (a size-0 dimension counted as 1) in bytes fits
  // int64: strides, numel and byte counts are then computed without overflow. A size-0 tensor
  // whose other sizes overflowed (an ONNX initializer of dims [63, 2^63 - 2^41, 0]) made
  // contiguous_strides and is_contiguous overflow, which is undefined (UBSan,
  // tests/fuzz/onnx_import_fuzz.cc).
  int64_t span = dtype_size(dtype);
  for (int64_t s : sizes) {
    KILN_CHECK(s >= 0, "negative dimension in shape {}", to_string(sizes));
    KILN_CHECK(!__builtin_mul_overflow(span, s > 0 ? s : 1, &span),
               "shape {} of {} is too large: its byte size overflows int64", to_string(sizes),
               dtype_name(dtype));
  }
  auto impl = Ref<TensorImpl>::make();
  impl->sizes = sizes;
  impl->strides = contiguous_strides(sizes);
  impl->dtype = dtype;
  impl->device = dev;
  if (with_storage) {
    size_t bytes = size_t(kiln::numel(sizes)) * size_t(dtype_size(dtype));
    impl->storage = Ref<Storage>::make(bytes, allocator_for(dev));
  }
  return Tensor(std::move(impl));
}

Tensor Tensor::empty(const Dims& sizes, DType dtype, Device dev) {
  return make(sizes, dtype, dev, true);
}
Tensor Tensor::fake(const Dims& sizes, DType dtype, Device dev) {
  return make(sizes, dtype, dev, false);
}
Tensor Tensor::from_blob(void* data, const Dims& sizes, DType dtype, Device dev) {
  Tensor t = make(sizes, dtype, dev, false);
  size_t bytes = size_t(kiln::numel(sizes)) * size_t(dtype_size(dtype));
  t.impl_->storage = Ref<Storage>::make(data, bytes, dev);
  return t;
}

Tensor Tensor::zeros(const Dims& sizes, DType dtype, Device dev) {
  if (!dev.is_cpu()) return zeros(sizes, dtype).to(dev);
  Tensor t = empty(sizes, dtype, dev);
  std::memset(t.raw_data(), 0, t.nbytes());  // all-zero bytes is 0 for every dtype
  return t;
}
Tensor Tensor::ones(const Dims& sizes, DType dtype, Device dev) {
  if (!dev.is_cpu()) return full(sizes, 1.0, dtype).to(dev);
  return full(sizes, 1.0, dtype);
}
Tensor Tensor::full(const Dims& sizes, double value, DType dtype) {
  Tensor t = empty(sizes, dtype);
  char* p = static_cast<char*>(t.raw_data());
  int64_t es = t.element_size(), n = t.numel();
  for (int64_t i = 0; i < n; ++i) store_f64(p + i * es, dtype, value);
  return t;
}
Tensor Tensor::scalar(double value, DType dtype) { return full(Dims{}, value, dtype); }
Tensor Tensor::arange(int64_t n, DType dtype) {
  Tensor t = empty(Dims{n}, dtype);
  char* p = static_cast<char*>(t.raw_data());
  for (int64_t i = 0; i < n; ++i) store_i64(p + i * t.element_size(), dtype, i);
  return t;
}
Tensor Tensor::randn(const Dims& sizes, Generator& gen, DType dtype) {
  Tensor t = empty(sizes, dtype);
  char* p = static_cast<char*>(t.raw_data());
  for (int64_t i = 0, n = t.numel(); i < n; ++i)
    store_f64(p + i * t.element_size(), dtype, gen.normal());
  return t;
}
Tensor Tensor::rand(const Dims& sizes, Generator& gen, double lo, double hi, DType dtype) {
  Tensor t = empty(sizes, dtype);
  char* p = static_cast<char*>(t.raw_data());
  for (int64_t i = 0, n = t.numel(); i < n; ++i)
    store_f64(p + i * t.element_size(), dtype, lo + (hi - lo) * gen.uniform());
  return t;
}
Tensor Tensor::randint(const Dims& sizes, Generator& gen, int64_t lo, int64_t hi, DType dtype) {
  KILN_CHECK(hi > lo, "randint: empty range [{}, {})", lo, hi);
  Tensor t = empty(sizes, dtype);
  char* p = static_cast<char*>(t.raw_data());
  uint64_t span = uint64_t(hi - lo);
  for (int64_t i = 0, n = t.numel(); i < n; ++i)
    store_i64(p + i * t.element_size(), dtype, lo + int64_t(gen.next_u64() % span));
  return t;
}

// ---- accessors --------------------------------------------------------------------------------
int64_t Tensor::size(int64_t d) const {
  return impl_->sizes[size_t(normalize_axis(d, dim(), "dimension"))];
}
int64_t Tensor::stride(int64_t d) const {
  return impl_->strides[size_t(normalize_axis(d, dim(), "dimension"))];
}

bool Tensor::is_contiguous() const {
  // A tensor without elements is contiguous whatever its strides: they address nothing (and
  // contiguous_strides gives a size-0 dim the stride of a size-1 one, which the loop below
  // would otherwise call non-contiguous — a [3, 0] constant then printed strides the IR
  // parser refuses; the ONNX fuzzer's finding).
  for (int i = 0; i < dim(); ++i)
    if (impl_->sizes[i] == 0) return true;
  int64_t expected = 1;
  for (int i = dim() - 1; i >= 0; --i) {
    if (impl_->sizes[i] == 1) continue;
    if (impl_->strides[i] != expected) return false;
    expected *= impl_->sizes[i];
  }
  return true;
}

TensorType Tensor::type() const {
  TensorType t(dtype(), to_shape(sizes()), device());
  if (!is_contiguous()) t.strides = to_shape(strides());
  return t;
}

namespace {
thread_local MaterializeHook t_materialize = nullptr;
}
MaterializeHook set_materialize_hook(MaterializeHook hook) {
  MaterializeHook prev = t_materialize;
  t_materialize = hook;
  return prev;
}

namespace {
// Whether a read of impl's data must go to the materialization hook (Note [Materialization hook]).
inline bool read_is_hooked(const TensorImpl& impl) {
  return impl.storage ? impl.storage->capture_watch.load(std::memory_order_relaxed) != 0
                      : impl.capture_value >= 0;
}
}  // namespace

void Tensor::materialize(const char* what, const std::source_location& loc) const {
  if (!impl_ || !read_is_hooked(*impl_) || !t_materialize) return;
  std::string_view file = loc.file_name();
  size_t slash = file.rfind('/');
  if (slash != std::string_view::npos) file = file.substr(slash + 1);
  std::string where = fmt::format("{}:{}", file, loc.line());
  t_materialize(impl_.get(), what, where.c_str());
}

void* Tensor::raw_data() const {
  KILN_CHECK(defined(), "access to the data of an undefined tensor");
  if (read_is_hooked(*impl_) && t_materialize) [[unlikely]]
    t_materialize(impl_.get(), "data access", "");
  KILN_CHECK(impl_->storage, "tensor of type {} has no data (it is a fake tensor used for "
             "tracing)", type().str());
  return static_cast<char*>(impl_->storage->data()) + impl_->offset * element_size();
}

Tensor Tensor::as_strided(const Dims& sizes, const Dims& strides, int64_t offset) const {
  KILN_ASSERT(sizes.size() == strides.size());
  auto impl = Ref<TensorImpl>::make();
  impl->storage = impl_->storage;
  impl->offset = offset;
  impl->sizes = sizes;
  impl->strides = strides;
  impl->dtype = impl_->dtype;
  impl->device = impl_->device;
  if (impl->storage && kiln::numel(sizes) > 0) {
    int64_t lo = offset, hi = offset;
    for (size_t i = 0; i < sizes.size(); ++i) {
      int64_t ext = (sizes[i] - 1) * strides[i];
      if (ext < 0) lo += ext; else hi += ext;
    }
    int64_t cap = int64_t(impl->storage->nbytes()) / element_size();
    KILN_CHECK(lo >= 0 && hi < cap, "view {} with strides {} at offset {} exceeds its storage "
               "of {} elements", to_string(sizes), to_string(strides), offset, cap);
  }
  return Tensor(std::move(impl));
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = empty(sizes(), dtype(), device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(DType d) const {
  if (d == dtype()) return *this;
  KILN_CHECK(device().is_cpu(), "Tensor::to(dtype) on {}: convert on the CPU or use the cast op",
             device().str());
  Tensor out = empty(sizes(), d, device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(Device dev) const {
  if (dev == device()) return *this;
  Tensor src = contiguous();
  Tensor out = empty(sizes(), dtype(), dev);
  CopyKind k = dev.is_cuda() && src.device().is_cpu()   ? CopyKind::HostToDevice
               : dev.is_cpu() && src.device().is_cuda() ? CopyKind::DeviceToHost
                                                        : CopyKind::DeviceToDevice;
  cuda_memcpy(out.raw_data(), src.raw_data(), src.nbytes(), k);
  return out;
}

// Copies the storage extent that a strided device tensor spans to the host and returns the
// contiguous host copy of the view.
static Tensor gather_to_host(const Tensor& t) {
  if (t.numel() == 0) return Tensor::empty(t.sizes(), t.dtype());
  int64_t lo = t.offset(), hi = t.offset();
  for (int d = 0; d < t.dim(); ++d) {
    int64_t ext = (t.size(d) - 1) * t.stride(d);
    if (ext < 0) lo += ext; else hi += ext;
  }
  Tensor host = Tensor::empty(Dims{hi - lo + 1}, t.dtype());
  const char* base = static_cast<const char*>(t.impl()->storage->data());
  cuda_memcpy(host.raw_data(), base + lo * t.element_size(), host.nbytes(),
              CopyKind::DeviceToHost);
  return host.as_strided(t.sizes(), t.strides(), t.offset() - lo).contiguous();
}

void Tensor::copy_(const Tensor& src) {
  KILN_CHECK(src.sizes() == sizes(), "copy_: source shape {} does not match destination {}",
             to_string(src.sizes()), to_string(sizes()));
  if (numel() == 0) return;  // nothing to move (and no layout to check: any strides are valid)
  if (device().is_cpu() && src.device().is_cpu()) {
    const char* s = static_cast<const char*>(src.raw_data());
    char* d = static_cast<char*>(raw_data());
    int64_t ses = src.element_size(), des = element_size();
    if (src.dtype() == dtype() && src.is_contiguous() && is_contiguous()) {
      std::memmove(d, s, nbytes());
    } else if (is_floating(dtype()) || is_floating(src.dtype())) {
      DType sd = src.dtype(), dd = dtype();
      const Dims &ss = src.strides(), &ds = strides();
      for_each_index(sizes(), [&](const int64_t* idx) {
        store_f64(d + offset_of(idx, ds) * des, dd, load_f64(s + offset_of(idx, ss) * ses, sd));
      });
    } else {
      DType sd = src.dtype(), dd = dtype();
      const Dims &ss = src.strides(), &ds = strides();
      for_each_index(sizes(), [&](const int64_t* idx) {
        store_i64(d + offset_of(idx, ds) * des, dd, load_i64(s + offset_of(idx, ss) * ses, sd));
      });
    }
  } else {
    // Cross-device or device-local copies move bytes; conversions happen on the host.
    Tensor s = src;
    // A strided device source is gathered on the host (core cannot reach the CUDA copy kernel);
    // otherwise contiguous() -> clone() -> copy_ would recurse without end.
    if (!s.is_contiguous() && !s.device().is_cpu()) s = gather_to_host(s);
    if (s.dtype() != dtype()) s = s.to(Device::cpu()).to(dtype());
    s = s.contiguous();
    KILN_CHECK(is_contiguous(), "copy_ into a non-contiguous {} tensor is not supported",
               device().str());
    if (s.device() == device()) {
      cuda_memcpy(raw_data(), s.raw_data(), nbytes(), CopyKind::DeviceToDevice);
    } else {
      cuda_memcpy(raw_data(), s.raw_data(), nbytes(),
                  device().is_cuda() ? CopyKind::HostToDevice : CopyKind::DeviceToHost);
    }
  }
  bump_version();
}

void Tensor::bump_version() const {
  if (impl_ && impl_->storage) impl_->storage->bump_version();
}
uint64_t Tensor::version() const { return impl_ && impl_->storage ? impl_->storage->version() : 0; }

double Tensor::item(const std::source_location& loc) const {
  materialize("item()", loc);
  KILN_CHECK(numel() == 1, "item() needs a tensor with one element, got shape {}",
             to_string(sizes()));
  Tensor c = device().is_cpu() ? *this : to(Device::cpu());
  return load_f64(c.raw_data(), dtype());
}

template <typename T>
std::vector<T> Tensor::to_vector(const std::source_location& loc) const {
  materialize("to_vector()", loc);
  Tensor c = device().is_cpu() ? *this : to(Device::cpu());
  c = c.to(DTypeOf<T>::value).contiguous();
  const T* p = static_cast<const T*>(c.raw_data());
  return std::vector<T>(p, p + c.numel());
}
template std::vector<float> Tensor::to_vector<float>(const std::source_location&) const;
template std::vector<double> Tensor::to_vector<double>(const std::source_location&) const;
template std::vector<int64_t> Tensor::to_vector<int64_t>(const std::source_location&) const;
template std::vector<int32_t> Tensor::to_vector<int32_t>(const std::source_location&) const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>(const std::source_location&) const;
template std::vector<int8_t> Tensor::to_vector<int8_t>(const std::source_location&) const;
template std::vector<bool> Tensor::to_vector<bool>(const std::source_location&) const;

std::string Tensor::str(int max_elements) const {
  if (!defined()) return "Tensor(undefined)";
  std::string s = "Tensor(" + type().str();
  if (!has_storage()) return s + ", fake)";
  Tensor c = device().is_cpu() ? *this : to(Device::cpu());
  s += ", [";
  int64_t n = std::min<int64_t>(numel(), max_elements);
  int64_t i = 0;
  const char* base = static_cast<const char*>(c.raw_data());
  for_each_index(c.sizes(), [&](const int64_t* idx) {
    if (i < n) {
      if (i) s += ", ";
      s += fmt::format("{:.6g}", load_f64(base + offset_of(idx, c.strides()) * c.element_size(),
                                         c.dtype()));
    }
    ++i;
  });
  if (numel() > n) s += ", ...";
  return s + "])";
}

// ---- Generator --------------------------------------------------------------------------------
static uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
Generator::Generator(uint64_t seed) { this->seed(seed); }
void Generator::seed(uint64_t s) {
  for (auto& v : s_) v = splitmix64(s);
  has_spare_ = false;
}
static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
uint64_t Generator::next_u64() {
  uint64_t result = rotl(s_[1] * 5, 7) * 9;
  uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}
double Generator::uniform() { return double(next_u64() >> 11) * (1.0 / 9007199254740992.0); }
double Generator::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1 = uniform(), u2 = uniform();
  if (u1 < 1e-300) u1 = 1e-300;
  double r = std::sqrt(-2.0 * std::log(u1));
  spare_ = r * std::sin(2 * M_PI * u2);
  has_spare_ = true;
  return r * std::cos(2 * M_PI * u2);
}

}  // namespace kiln
