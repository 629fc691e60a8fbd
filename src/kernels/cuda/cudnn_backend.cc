// Note [cuDNN backend API]
// Convolutions and attention go through cuDNN 9's graph API in its C form (the "backend" API,
// cudnn_graph.h), not through cudnn-frontend:
//   - compile time: one translation unit including cudnn_frontend.h took 320 s and 2.3 GB at -O2
//     on the 2-core development machine (97 s just to parse); these files take seconds;
//   - version control: the GPU machine runs cuDNN 9.14 while the headers here are 9.19. The
//     backend API lets us set exactly the attributes that exist since 9.0 (tensors, convolution,
//     pointwise, reduction and matmul operations, heuristics, plans), so nothing needs 9.15+;
//     the frontend picks new descriptors (unified SDPA, diagonal-band masks) by header version
//     and checks the runtime only where its authors remembered to;
//   - loading: libcudnn.so.9 is opened with dlopen (dynamic_library.h), never linked, so binaries
//     start without it; the frontend calls cuDNN symbols directly (or, in its dynamic-loading
//     mode, loads a second, shared cudart next to Kiln's static one).
// The cost is verbosity, kept in this file: Descriptor wraps one cudnnBackendDescriptor_t, and
// GraphPlans turns a list of operations into finalized execution plans (heuristics mode A, then
// the fallback list; engines filtered by their numerical notes: no TF32 for float32 unless
// asked, no down-converted inputs, no reduced-precision accumulation, no nondeterminism).
//
// Versions: cuDNN 9.x keeps its ABI within the major version; version() requires 9 and the
// engines available are whatever the loaded library offers (GraphPlans asks, never assumes).
#include "kernels/cuda/cudnn_backend.h"

#include <cudnn_graph.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "kernels/cuda/dynamic_library.h"
#include "kernels/cuda/graph_replay.h"
#include "support/artifact_cache.h"
#include "support/hash.h"

namespace kiln::cuda::cudnn {
namespace {

struct CudnnApi {
  decltype(&::cudnnGetVersion) get_version = nullptr;
  decltype(&::cudnnGetErrorString) get_error_string = nullptr;
  decltype(&::cudnnGetLastErrorString) get_last_error_string = nullptr;
  decltype(&::cudnnCreate) create = nullptr;
  decltype(&::cudnnSetStream) set_stream = nullptr;
  decltype(&::cudnnBackendCreateDescriptor) create_descriptor = nullptr;
  decltype(&::cudnnBackendDestroyDescriptor) destroy_descriptor = nullptr;
  decltype(&::cudnnBackendFinalize) finalize = nullptr;
  decltype(&::cudnnBackendSetAttribute) set_attribute = nullptr;
  decltype(&::cudnnBackendGetAttribute) get_attribute = nullptr;
  decltype(&::cudnnBackendExecute) execute = nullptr;
  size_t version = 0;
  std::string unavailable;
};

CudnnApi load_cudnn() {
  CudnnApi api;
  std::string tried;
  void* lib = open_cuda_library("libcudnn.so.9", "KILN_CUDNN", &tried);
  if (!lib) {
    api.unavailable = fmt::format(
        "cuDNN 9 (libcudnn.so.9) is needed for convolution and attention on CUDA and was not "
        "found; install cuDNN 9 for CUDA 13, add its folder to LD_LIBRARY_PATH, or set "
        "KILN_CUDNN to the library's path. Tried:{}",
        tried);
    return api;
  }
  std::string missing;
  const bool ok =
      bind_symbol(lib, "cudnnGetVersion", &api.get_version, &missing) &&
      bind_symbol(lib, "cudnnGetErrorString", &api.get_error_string, &missing) &&
      bind_symbol(lib, "cudnnGetLastErrorString", &api.get_last_error_string, &missing) &&
      bind_symbol(lib, "cudnnCreate", &api.create, &missing) &&
      bind_symbol(lib, "cudnnSetStream", &api.set_stream, &missing) &&
      bind_symbol(lib, "cudnnBackendCreateDescriptor", &api.create_descriptor, &missing) &&
      bind_symbol(lib, "cudnnBackendDestroyDescriptor", &api.destroy_descriptor, &missing) &&
      bind_symbol(lib, "cudnnBackendFinalize", &api.finalize, &missing) &&
      bind_symbol(lib, "cudnnBackendSetAttribute", &api.set_attribute, &missing) &&
      bind_symbol(lib, "cudnnBackendGetAttribute", &api.get_attribute, &missing) &&
      bind_symbol(lib, "cudnnBackendExecute", &api.execute, &missing);
  if (!ok) {
    api.unavailable = fmt::format(
        "the cuDNN library found does not export {}: cuDNN 9 is needed (set KILN_CUDNN to its "
        "path)",
        missing);
    return api;
  }
  api.version = api.get_version();
  if (api.version < 90000 || api.version >= 100000)
    api.unavailable = fmt::format(
        "cuDNN {} was loaded ({}) but Kiln needs cuDNN 9.x; point KILN_CUDNN at a cuDNN 9 "
        "library",
        api.version, library_path_of(reinterpret_cast<const void*>(api.get_version)));
  return api;
}

const CudnnApi& api_or_null() {
  static const CudnnApi api = load_cudnn();
  return api;
}

const CudnnApi& api() {
  const CudnnApi& a = api_or_null();
  if (!a.unavailable.empty()) fail_kind(ErrorKind::NotSupported, "{}", a.unavailable);
  return a;
}

std::string last_error() {
  char buf[1024] = {};
  api_or_null().get_last_error_string(buf, sizeof buf);
  return buf;
}

}  // namespace

size_t version() { return api().version; }

bool available(std::string* why) {
  const CudnnApi& a = api_or_null();
  if (why) *why = a.unavailable;
  return a.unavailable.empty();
}

std::string status_text(int status) {
  const CudnnApi& a = api_or_null();
  if (!a.get_error_string) return fmt::format("cudnnStatus_t {}", status);
  std::string s = a.get_error_string(cudnnStatus_t(status));
  const std::string detail = last_error();
  if (!detail.empty()) s += " (" + detail + ")";
  return s;
}

// ---- Descriptor ------------------------------------------------------------------------------

Descriptor::Descriptor(int descriptor_type, std::string what) : what_(std::move(what)) {
  const CudnnApi& a = api();
  cudnnBackendDescriptor_t d = nullptr;
  const cudnnStatus_t s = a.create_descriptor(cudnnBackendDescriptorType_t(descriptor_type), &d);
  if (s != CUDNN_STATUS_SUCCESS)
    fail_kind(ErrorKind::Runtime, "{}: cudnnBackendCreateDescriptor({}) failed: {}", what_,
              descriptor_type, status_text(s));
  desc_ = d;
}

Descriptor::~Descriptor() {
  if (desc_) api_or_null().destroy_descriptor(static_cast<cudnnBackendDescriptor_t>(desc_));
}

Descriptor::Descriptor(Descriptor&& o) noexcept : desc_(o.desc_), what_(std::move(o.what_)) {
  o.desc_ = nullptr;
}

Descriptor& Descriptor::operator=(Descriptor&& o) noexcept {
  if (this != &o) {
    if (desc_) api_or_null().destroy_descriptor(static_cast<cudnnBackendDescriptor_t>(desc_));
    desc_ = o.desc_;
    what_ = std::move(o.what_);
    o.desc_ = nullptr;
  }
  return *this;
}

Descriptor& Descriptor::set(int attribute, int attribute_type, int64_t count, const void* values) {
  const cudnnStatus_t s = api().set_attribute(static_cast<cudnnBackendDescriptor_t>(desc_),
                                              cudnnBackendAttributeName_t(attribute),
                                              cudnnBackendAttributeType_t(attribute_type), count,
                                              values);
  if (s != CUDNN_STATUS_SUCCESS)
    fail_kind(ErrorKind::Runtime, "{}: cudnnBackendSetAttribute(attribute {}) failed: {}", what_,
              attribute, status_text(s));
  return *this;
}

Descriptor& Descriptor::set_int64(int attribute, int64_t v) {
  return set(attribute, CUDNN_TYPE_INT64, 1, &v);
}
Descriptor& Descriptor::set_int64s(int attribute, const std::vector<int64_t>& v) {
  return set(attribute, CUDNN_TYPE_INT64, int64_t(v.size()), v.data());
}
Descriptor& Descriptor::set_double(int attribute, double v) {
  return set(attribute, CUDNN_TYPE_DOUBLE, 1, &v);
}
Descriptor& Descriptor::set_float(int attribute, float v) {
  return set(attribute, CUDNN_TYPE_FLOAT, 1, &v);
}
Descriptor& Descriptor::set_bool(int attribute, bool v) {
  return set(attribute, CUDNN_TYPE_BOOLEAN, 1, &v);
}
Descriptor& Descriptor::set_enum(int attribute, int type, int value) {
  const int32_t v = value;  // cuDNN's enums are 4-byte
  return set(attribute, type, 1, &v);
}
Descriptor& Descriptor::set_desc(int attribute, const Descriptor& d) {
  void* p = d.get();
  return set(attribute, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p);
}
Descriptor& Descriptor::set_descs(int attribute, const std::vector<const Descriptor*>& ds) {
  std::vector<void*> ps;
  for (const Descriptor* d : ds) ps.push_back(d->get());
  return set(attribute, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ps.size()), ps.data());
}
Descriptor& Descriptor::set_handle(int attribute, void* handle) {
  return set(attribute, CUDNN_TYPE_HANDLE, 1, &handle);
}

int Descriptor::try_finalize() {
  return int(api().finalize(static_cast<cudnnBackendDescriptor_t>(desc_)));
}

Descriptor& Descriptor::finalize() {
  const int s = try_finalize();
  if (s != CUDNN_STATUS_SUCCESS)
    fail_kind(ErrorKind::Runtime, "{}: cudnnBackendFinalize failed: {}", what_, status_text(s));
  return *this;
}

int64_t Descriptor::get_int64(int attribute) const {
  int64_t v = 0, n = 0;
  const cudnnStatus_t s = api().get_attribute(static_cast<cudnnBackendDescriptor_t>(desc_),
                                              cudnnBackendAttributeName_t(attribute),
                                              CUDNN_TYPE_INT64, 1, &n, &v);
  if (s != CUDNN_STATUS_SUCCESS)
    fail_kind(ErrorKind::Runtime, "{}: cudnnBackendGetAttribute(attribute {}) failed: {}", what_,
              attribute, status_text(s));
  return v;
}

std::vector<Descriptor> Descriptor::get_descs(int attribute, int element_type,
                                              int64_t max_count) const {
  std::vector<Descriptor> out;
  std::vector<void*> raw;
  for (int64_t i = 0; i < max_count; ++i) {
    out.emplace_back(element_type, what_);
    raw.push_back(out.back().get());
  }
  int64_t n = 0;
  const cudnnStatus_t s = api().get_attribute(
      static_cast<cudnnBackendDescriptor_t>(desc_), cudnnBackendAttributeName_t(attribute),
      CUDNN_TYPE_BACKEND_DESCRIPTOR, max_count, &n, raw.data());
  if (s != CUDNN_STATUS_SUCCESS)
    fail_kind(ErrorKind::Runtime, "{}: cudnnBackendGetAttribute(attribute {}) failed: {}", what_,
              attribute, status_text(s));
  out.resize(size_t(std::min(n, max_count)));
  return out;
}

std::vector<int> Descriptor::get_enums(int attribute, int type, int64_t max_count) const {
  std::vector<int32_t> v(size_t(max_count), 0);
  int64_t n = 0;
  const cudnnStatus_t s = api().get_attribute(static_cast<cudnnBackendDescriptor_t>(desc_),
                                              cudnnBackendAttributeName_t(attribute),
                                              cudnnBackendAttributeType_t(type), max_count, &n,
                                              v.data());
  if (s != CUDNN_STATUS_SUCCESS)
    fail_kind(ErrorKind::Runtime, "{}: cudnnBackendGetAttribute(attribute {}) failed: {}", what_,
              attribute, status_text(s));
  return std::vector<int>(v.begin(), v.begin() + std::min(n, max_count));
}

// ---- common descriptors ----------------------------------------------------------------------

int data_type(DType d) {
  switch (d) {
    case DType::Float32: return CUDNN_DATA_FLOAT;
    case DType::Float16: return CUDNN_DATA_HALF;
    case DType::BFloat16: return CUDNN_DATA_BFLOAT16;
    default: break;
  }
  KILN_ASSERT(false);
}

Descriptor make_tensor(const std::string& what, int64_t uid, int data_type,
                       const std::vector<int64_t>& dims, const std::vector<int64_t>& strides,
                       int64_t alignment, bool is_virtual, bool by_value) {
  Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR, what);
  t.set_enum(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, data_type)
      .set_int64s(CUDNN_ATTR_TENSOR_DIMENSIONS, dims)
      .set_int64s(CUDNN_ATTR_TENSOR_STRIDES, strides)
      .set_int64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid)
      .set_int64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, alignment)
      .set_bool(CUDNN_ATTR_TENSOR_IS_VIRTUAL, is_virtual);
  if (by_value) t.set_bool(CUDNN_ATTR_TENSOR_IS_BY_VALUE, true);
  t.finalize();
  return t;
}

Descriptor make_pointwise(const std::string& what, int mode, int math_precision,
                          const Descriptor& x, const Descriptor* b, const Descriptor& y,
                          const Descriptor* t, int64_t axis) {
  Descriptor pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what);
  pw.set_enum(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, mode)
      .set_enum(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, math_precision);
  if (axis >= 0) pw.set_int64(CUDNN_ATTR_POINTWISE_AXIS, axis);
  pw.finalize();
  Descriptor op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what);
  op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw)
      .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
  if (b) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
  if (t) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
  op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y)
      .set_float(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, 1.0f)
      .set_float(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, 1.0f);
  op.finalize();
  return op;
}

// ---- handles ---------------------------------------------------------------------------------

Handle& handle_for(int device, const std::string& what) {
  require_cuda_device(device, what.c_str());
  const CudnnApi& a = api();
  static std::mutex mu;
  static std::vector<std::unique_ptr<Handle>>* handles =
      new std::vector<std::unique_ptr<Handle>>();  // process lifetime
  std::lock_guard<std::mutex> lock(mu);
  if (handles->size() <= size_t(device)) handles->resize(size_t(device) + 1);
  auto& h = (*handles)[size_t(device)];
  if (!h) {
    check_cuda(cudaSetDevice(device), what.c_str());
    cudnnHandle_t raw = nullptr;
    const cudnnStatus_t s = a.create(&raw);
    if (s != CUDNN_STATUS_SUCCESS)
      fail_kind(ErrorKind::Runtime, "{}: cudnnCreate on cuda:{} failed: {}", what, device,
                status_text(s));
    h = std::make_unique<Handle>();
    h->handle = raw;
  }
  return *h;
}

void warm_up(int device) {
  try {
    std::string why;
    if (available(&why)) (void)handle_for(device, "cuDNN warm-up");
  } catch (const std::exception&) {
  }
}

// ---- the plan cache --------------------------------------------------------------------------

// Note [cuDNN plan cache]
// A runtime-fusion plan takes 40-700 ms to finalize (cuDNN compiles its kernels) and 1 ms to
// restore from its serialized bytes (Note [Serialized cuDNN plans]). The bytes cannot go into a
// package: they hold a few bytes of uninitialized host memory in the kernel's parameter
// template (measured: 13 bytes of 68 KB differ between two builds of one plan, in one process
// or two), which would break the packages' byte-for-byte determinism. So they live in the
// artifact cache (<cache_dir>/cudnn-plans, Note [Artifact cache]: checked by size and SHA-256,
// written atomically), keyed by everything the plan depends on: the descriptor, cuDNN's
// version, the GPU model and the driver. Compiles and package loads on one machine then build
// each plan once; a cold cache (a fresh machine) builds as before. A refused restore (another
// cuDNN build under the same version) builds the plan and replaces the entry. An entry is
// "<tag>\n<tensor cores 0|1>\n" then cuDNN's bytes.
bool plan_cache_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_CUDNN_PLAN_CACHE");
    return !(v && (std::strcmp(v, "0") == 0 || std::strcmp(v, "off") == 0));
  }();
  return on;
}

namespace {
const ArtifactCache& plan_cache() {
  static const ArtifactCache cache("cudnn-plans", "plan", 1);
  return cache;
}

// cuDNN's version, the GPU and the driver, per device (asked once).
const std::string& plan_identity(int device) {
  static std::mutex mu;
  static std::vector<std::string>* ids = new std::vector<std::string>();  // process lifetime
  std::lock_guard<std::mutex> lock(mu);
  if (ids->size() <= size_t(device)) ids->resize(size_t(device) + 1);
  std::string& id = (*ids)[size_t(device)];
  if (id.empty()) {
    const CudaDeviceInfo info = cuda_device_info(device);
    int driver = 0;
    cudaDriverGetVersion(&driver);
    id = fmt::format("cudnn {} | {} sm_{}{} {} SMs | driver {}", version(), info.name,
                     info.sm_major, info.sm_minor, info.multiprocessors, driver);
  }
  return id;
}

std::string plan_cache_key(int device, const std::string& plan_key, const std::string& tag) {
  return sha256_hex(fmt::format("{}\n{}\n{}", plan_identity(device), plan_key, tag));
}
}  // namespace

bool plan_cache_get(int device, const std::string& plan_key, const std::string& tag,
                    CachedPlan* out) {
  if (!plan_cache_enabled()) return false;
  try {
    bool existed = false;
    std::string entry;
    if (!plan_cache().validate(plan_cache_key(device, plan_key, tag), &existed, &entry))
      return false;
    const size_t a = entry.find('\n');
    const size_t b = a == std::string::npos ? a : entry.find('\n', a + 1);
    if (b == std::string::npos || b != a + 2 || b + 1 >= entry.size()) return false;
    out->tag = entry.substr(0, a);
    out->tensor_cores = entry[a + 1] == '1';
    out->bytes = entry.substr(b + 1);
    return !out->tag.empty();
  } catch (const std::exception&) {
    return false;  // an unreadable cache is a miss
  }
}

void plan_cache_put(int device, const std::string& plan_key, const std::string& tag,
                    const CachedPlan& plan) {
  if (!plan_cache_enabled() || plan.bytes.empty() || plan.tag.empty()) return;
  try {
    plan_cache().put(plan_cache_key(device, plan_key, tag),
                     fmt::format("{}\n{}\n", plan.tag, plan.tensor_cores ? 1 : 0) + plan.bytes,
                     {{"plan", plan_key}, {"engine", plan.tag}});
  } catch (const std::exception&) {
    // A read-only or full cache directory: the next build makes the plan again.
  }
}

// ---- GraphPlans ------------------------------------------------------------------------------

namespace {

// The handle attributes of plans (400) and graphs (800), deprecated in the 9.19 headers (newer
// releases also take a device-properties descriptor) but what cuDNN 9.0-9.14 read: spelled as
// numbers so that the deprecation does not warn.
constexpr int kPlanHandleAttribute = 400;
constexpr int kGraphHandleAttribute = 800;

std::string plan_tag(const Descriptor& cfg, int64_t engine) {
  std::string tag = fmt::format("eng{}", engine);
  std::vector<Descriptor> knobs =
      cfg.get_descs(CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR,
                    CUDNN_KNOB_TYPE_COUNTS);
  std::vector<std::pair<int, int64_t>> choices;
  for (const Descriptor& k : knobs) {
    const std::vector<int> type =
        k.get_enums(CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1);
    choices.emplace_back(type.empty() ? -1 : type[0],
                         k.get_int64(CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE));
  }
  std::sort(choices.begin(), choices.end());
  for (auto [type, value] : choices) tag += fmt::format(" k{}={}", type, value);
  return tag;
}

}  // namespace

void GraphPlans::reset() {
  std::lock_guard<std::mutex> lock(pack_mu_);
  std::lock_guard<std::mutex> plans_lock(plans_mu_);
  packs_.clear();
  next_victim_ = 0;
  candidates_.clear();
  pending_.clear();
  graph_.reset();
}

bool GraphPlans::finalize_one(Pending& p, std::vector<std::string>* rejected) const {
  Descriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, what_);
  plan.set_handle(kPlanHandleAttribute, handle_);
  plan.set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, p.config);
  if (const int s = plan.try_finalize(); s != CUDNN_STATUS_SUCCESS) {
    if (rejected)
      rejected->push_back(fmt::format("{} does not build ({})", p.tag,
                                      api_or_null().get_error_string(cudnnStatus_t(s))));
    return false;
  }
  PlanCandidate c;
  c.workspace_bytes = size_t(plan.get_int64(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE));
  c.plan = std::move(plan);
  c.engine = p.engine;
  c.tag = p.tag;
  c.tensor_cores = p.tensor_cores;
  candidates_.push_back(std::move(c));
  return true;
}

void GraphPlans::finalize_pending(bool all, std::vector<std::string>* rejected) const {
  size_t i = 0;
  for (; i < pending_.size(); ++i)
    if (finalize_one(pending_[i], rejected) && !all) {
      ++i;
      break;
    }
  pending_.erase(pending_.begin(), pending_.begin() + std::ptrdiff_t(i));
}

// Note [Serialized cuDNN plans]
// Finalizing an execution plan of a runtime-fusion engine (ResNet-50's fused convolutions in
// half precision, attention) compiles its kernels: most of a CUDA package's load (0.27 s of
// resnet50's 0.36 s on the H100 with 23 plans on 8 threads). cuDNN serializes such a plan with
// its compiled kernels, for the same cuDNN version and GPU, and restores it without compiling
// (measured on the H100: 68-83 KB, 0.6-1.1 ms to restore against 270-670 ms to build). The bytes
// are kept in the plan cache (Note [cuDNN plan cache]), not in packages; a refused restore
// builds the plan as before.
std::string GraphPlans::serialize(size_t index) const {
  std::lock_guard<std::mutex> lock(plans_mu_);
  if (index >= candidates_.size()) return {};
  const auto plan = static_cast<cudnnBackendDescriptor_t>(candidates_[index].plan.get());
  int64_t n = 0;
  if (api().get_attribute(plan, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                          0, &n, nullptr) != CUDNN_STATUS_SUCCESS ||
      n <= 0)
    return {};
  std::string bytes(size_t(n), '\0');
  int64_t got = 0;
  if (api().get_attribute(plan, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                          n, &got, bytes.data()) != CUDNN_STATUS_SUCCESS ||
      got <= 0 || got > n)
    return {};
  bytes.resize(size_t(got));
  return bytes;
}

bool GraphPlans::restore(int device, const std::string& bytes, const std::string& tag,
                         const std::string& what, std::string* why_not) {
  reset();
  device_ = device;
  what_ = what;
  Handle& h = handle_for(device, what);
  handle_ = h.handle;
  Descriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, what);
  plan.set_handle(kPlanHandleAttribute, handle_);
  const cudnnStatus_t set = api().set_attribute(
      static_cast<cudnnBackendDescriptor_t>(plan.get()),
      CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, int64_t(bytes.size()),
      bytes.data());
  const int s = set != CUDNN_STATUS_SUCCESS ? int(set) : plan.try_finalize();
  if (s != CUDNN_STATUS_SUCCESS) {
    *why_not = fmt::format("cuDNN {} does not restore the serialized plan ({} bytes): {}",
                           version(), bytes.size(), status_text(s));
    return false;
  }
  PlanCandidate c;
  c.workspace_bytes = size_t(plan.get_int64(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE));
  c.plan = std::move(plan);
  c.tag = tag;
  std::lock_guard<std::mutex> lock(plans_mu_);
  candidates_.reserve(1);
  candidates_.push_back(std::move(c));
  return true;
}

const PlanCandidate& GraphPlans::first() const {
  std::lock_guard<std::mutex> lock(plans_mu_);
  KILN_ASSERT(!candidates_.empty());
  return candidates_[0];
}

// Note [One engine finalized by tag]
// A tuned package pins each convolution's engine by tag. Where the plan cache has no entry for
// it (a fresh machine, or a cache that was cleared), the load builds the graph and looks the tag
// up. Finalizing every candidate on the way, as candidates() does for the autotuner, cost the
// first load of resnet50's max-autotune package 8.1 s on an H100 (the runtime-fusion engines
// compile their kernels as they finalize); only the pinned configuration is finalized now, so
// such a load builds one plan per convolution, as a default package's does. Candidates
// finalized out of heuristic order are appended: indices already handed out stay valid.
const PlanCandidate* GraphPlans::find_tag(const std::string& tag, int* index) const {
  std::lock_guard<std::mutex> lock(plans_mu_);
  for (size_t i = 0; i < candidates_.size(); ++i)
    if (candidates_[i].tag == tag) {
      *index = int(i);
      return &candidates_[i];
    }
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (pending_[i].tag != tag) continue;
    const bool built = finalize_one(pending_[i], nullptr);
    pending_.erase(pending_.begin() + std::ptrdiff_t(i));
    if (!built) return nullptr;
    *index = int(candidates_.size() - 1);
    return &candidates_.back();
  }
  return nullptr;
}

size_t GraphPlans::finalized() const {
  std::lock_guard<std::mutex> lock(plans_mu_);
  return candidates_.size();
}

int GraphPlans::index_of_restored(const std::string& tag) const {
  int i = 0;
  if (!find_tag(tag, &i))
    fail_kind(ErrorKind::Runtime, "{}: the built graph has no engine {} (the cached plan's)",
              what_, tag);
  return i;
}

const std::vector<PlanCandidate>& GraphPlans::candidates() const {
  std::lock_guard<std::mutex> lock(plans_mu_);
  if (!pending_.empty()) finalize_pending(/*all=*/true, nullptr);
  return candidates_;
}

bool GraphPlans::build(int device, const std::vector<const Descriptor*>& ops,
                       const EngineFilter& filter, const std::string& what,
                       std::string* why_not) {
  reset();
  device_ = device;
  what_ = what;
  Handle& h = handle_for(device, what);
  handle_ = h.handle;
  graph_ = std::make_unique<Descriptor>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, what);
  graph_->set_handle(kGraphHandleAttribute, h.handle);
  graph_->set_descs(CUDNN_ATTR_OPERATIONGRAPH_OPS, ops);
  if (const int s = graph_->try_finalize(); s != CUDNN_STATUS_SUCCESS) {
    *why_not = fmt::format("cuDNN {} rejects the operation graph: {}", version(), status_text(s));
    return false;
  }
  std::vector<std::string> rejected;
  std::vector<std::string> seen;
  for (int mode : {int(CUDNN_HEUR_MODE_A), int(CUDNN_HEUR_MODE_FALLBACK)}) {
    Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, what);
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, *graph_);
    heur.set_enum(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, mode);
    if (heur.try_finalize() != CUDNN_STATUS_SUCCESS) continue;
    int64_t count = 0;
    if (api().get_attribute(static_cast<cudnnBackendDescriptor_t>(heur.get()),
                            CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                            &count, nullptr) != CUDNN_STATUS_SUCCESS ||
        count <= 0)
      continue;
    std::vector<Descriptor> cfgs =
        heur.get_descs(CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, count);
    for (Descriptor& cfg : cfgs) {
      std::vector<Descriptor> engines =
          cfg.get_descs(CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_BACKEND_ENGINE_DESCRIPTOR, 1);
      if (engines.empty()) continue;
      const int64_t engine = engines[0].get_int64(CUDNN_ATTR_ENGINE_GLOBAL_INDEX);
      const std::vector<int> notes = engines[0].get_enums(
          CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
          CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
      auto has = [&](int note) { return std::find(notes.begin(), notes.end(), note) != notes.end(); };
      const std::string tag = plan_tag(cfg, engine);
      if (std::find(seen.begin(), seen.end(), tag) != seen.end()) continue;  // in both lists
      seen.push_back(tag);
      const char* reject = nullptr;
      if (!filter.allow_tensor_cores && has(CUDNN_NUMERICAL_NOTE_TENSOR_CORE))
        reject = "uses tensor cores (TF32 for float32)";
      else if (!filter.allow_down_convert && has(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS))
        reject = "down-converts its inputs";
      else if (!filter.allow_reduced_precision_reduction &&
               has(CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION))
        reject = "accumulates in reduced precision";
      else if (!filter.allow_nondeterministic && has(CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC))
        reject = "is nondeterministic";
      else if (!filter.allow_fft_winograd &&
               (has(CUDNN_NUMERICAL_NOTE_FFT) || has(CUDNN_NUMERICAL_NOTE_WINOGRAD) ||
                has(CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4) ||
                has(CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6) ||
                has(CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13)))
        reject = "is an FFT or Winograd engine";
      if (reject) {
        rejected.push_back(fmt::format("{} {}", tag, reject));
        continue;
      }
      pending_.push_back({std::move(cfg), engine, tag, has(CUDNN_NUMERICAL_NOTE_TENSOR_CORE)});
    }
  }
  {
    std::lock_guard<std::mutex> lock(plans_mu_);
    // Room for every candidate up front: references into candidates_ stay valid while later
    // calls finalize the rest.
    candidates_.reserve(pending_.size());
    finalize_pending(/*all=*/false, &rejected);
  }
  if (candidates_.empty()) {
    std::string list;
    for (size_t i = 0; i < rejected.size() && i < 8; ++i) list += "; " + rejected[i];
    *why_not = fmt::format("cuDNN {} has no engine for this graph{}", version(),
                           rejected.empty() ? " (heuristics proposed none)" : list);
    return false;
  }
  return true;
}

namespace {
// The handle this thread holds locked until its library-call capture ends (see execute).
thread_local Handle* t_capture_holds = nullptr;

void release_after_capture(void* p) {
  auto* h = static_cast<Handle*>(p);
  api().set_stream(static_cast<cudnnHandle_t>(h->handle), nullptr);  // off the captured stream
  t_capture_holds = nullptr;
  h->mu.unlock();
}
}  // namespace

void GraphPlans::execute(size_t index, const int64_t* uids, void* const* pointers, size_t count,
                         void* workspace, size_t workspace_bytes, void* stream) const {
  const PlanCandidate* found = nullptr;
  {
    std::lock_guard<std::mutex> lock(plans_mu_);
    if (index >= candidates_.size() && !pending_.empty()) finalize_pending(/*all=*/true, nullptr);
    KILN_ASSERT(index < candidates_.size());
    found = &candidates_[index];  // stable: candidates_ never reallocates (see build)
  }
  const PlanCandidate& c = *found;
  if (workspace_bytes < c.workspace_bytes)
    fail("{}: the cuDNN plan ({}) needs {} bytes of workspace, {} given", what_, c.tag,
         c.workspace_bytes, workspace_bytes);
  if (c.workspace_bytes > 0 && !workspace)
    fail("{}: the workspace pointer is null ({} bytes needed)", what_, c.workspace_bytes);
  const CudnnApi& a = api();
  Handle& h = handle_for(device_, what_);
  // The handle is shared by every thread, and cudnnSetStream works on the stream the handle had
  // before. Left on a stream that is still being captured (a library call replayed as a graph,
  // Note [Library calls replayed as graphs], or reduce-overhead's whole executable), another
  // thread's next cudnnSetStream reaches into that capture from outside: a SIGSEGV in
  // cuEventRecord under cudnnSetStream, four threads on the H200. So during a capture scope
  // (GraphReplay::CaptureScope) the handle stays locked until the capture has ended, and is then
  // put back on the legacy stream (at_capture_end). The handle's lock is taken before the plan's
  // variant-pack lock, always, so that a thread holding the handle through a capture that runs
  // several plans never waits for a pack lock held by a thread waiting for the handle.
  const bool in_capture = stream && stream == GraphReplay::capturing_stream();
  std::unique_lock<std::mutex> handle_lock(h.mu, std::defer_lock);
  if (!(in_capture && t_capture_holds == &h)) handle_lock.lock();
  // Note [Variant packs of a shared plan]
  // A variant pack binds the plan's tensors to pointers; making one allocates inside cuDNN. One
  // plan serves every launch of its descriptor (a package's load builds each distinct
  // convolution or attention once: prebuild_launches) and every execution context, each with
  // its own pointers, so the plan keeps a pack per pointer set: a steady-state call finds its
  // pack by comparing a few pointers and allocates nothing. Past kMaxPacks sets (more launches
  // and contexts share a plan than any model has), packs are replaced in turn.
  std::lock_guard<std::mutex> pack_lock(pack_mu_);
  const Pack* pack = nullptr;
  for (const Pack& p : packs_)
    if (p.workspace == workspace && p.uids.size() == count &&
        std::equal(uids, uids + count, p.uids.begin()) &&
        std::equal(pointers, pointers + count, p.pointers.begin())) {
      pack = &p;
      break;
    }
  if (!pack) {
    Pack made;
    made.desc = Descriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, what_);
    made.desc.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(count), uids);
    made.desc.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(count),
                  pointers);
    made.desc.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    made.desc.finalize();
    made.uids.assign(uids, uids + count);
    made.pointers.assign(pointers, pointers + count);
    made.workspace = workspace;
    if (packs_.size() < kMaxPacks) {
      packs_.push_back(std::move(made));
      pack = &packs_.back();
    } else {
      Pack& slot = packs_[next_victim_];
      next_victim_ = (next_victim_ + 1) % kMaxPacks;
      slot = std::move(made);
      pack = &slot;
    }
  }
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device_)
    check_cuda(cudaSetDevice(device_), what_.c_str());
  cudnnStatus_t s = a.set_stream(static_cast<cudnnHandle_t>(h.handle),
                                 static_cast<cudaStream_t>(stream));
  if (s != CUDNN_STATUS_SUCCESS)
    fail_kind(ErrorKind::Runtime, "{}: cudnnSetStream failed: {}", what_, status_text(s));
  s = a.execute(static_cast<cudnnHandle_t>(h.handle),
                static_cast<cudnnBackendDescriptor_t>(c.plan.get()),
                static_cast<cudnnBackendDescriptor_t>(pack->desc.get()));
  if (in_capture && handle_lock.owns_lock()) {
    t_capture_holds = &h;
    handle_lock.release();
    GraphReplay::at_capture_end(release_after_capture, &h);
  }
  if (s != CUDNN_STATUS_SUCCESS)
    fail_kind(ErrorKind::Runtime, "{}: cudnnBackendExecute (plan {}) failed: {}", what_, c.tag,
              status_text(s));
}

}  // namespace kiln::cuda::cudnn
