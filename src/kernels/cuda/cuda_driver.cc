// Driver API through the runtime's entry-point query (Note [Driver entry points]).
//
// Note [Driver entry points]
// Kiln links the static cudart and never libcuda: on a machine without a driver only a stub
// libcuda exists, and a binary linked against it would not start. cudart loads libcuda.so.1 at
// run time; cudaGetDriverEntryPointByVersion hands out the driver's functions with the ABI of
// the CUDA version we ask for (12.0 here: every function below has had one signature since),
// so the pointer types can be taken from cuda.h with decltype. The table is filled once per
// process; where no device or driver exists it stays empty and every call reports
// "no CUDA device: <reason>" (the reason is the runtime's, as in core/cuda_runtime.cc).
#include "kernels/cuda/cuda_driver.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "core/cuda_runtime.h"
#include "core/error.h"

namespace kiln::cuda {
namespace {

constexpr unsigned kDriverAbiVersion = 12000;

struct DriverApi {
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuGetErrorString) get_error_string = nullptr;
  decltype(&::cuCtxGetCurrent) ctx_get_current = nullptr;
  decltype(&::cuModuleLoadData) module_load_data = nullptr;
  decltype(&::cuModuleUnload) module_unload = nullptr;
  decltype(&::cuModuleGetFunction) module_get_function = nullptr;
  decltype(&::cuLaunchKernel) launch_kernel = nullptr;
  // Optional: programmatic launches (Note [CUDA programmatic launch]) need it; without it every
  // launch is a plain cuLaunchKernel.
  decltype(&::cuLaunchKernelEx) launch_kernel_ex = nullptr;
  decltype(&::cuFuncSetAttribute) func_set_attribute = nullptr;
  decltype(&::cuFuncGetAttribute) func_get_attribute = nullptr;
  decltype(&::cuStreamSynchronize) stream_synchronize = nullptr;
  std::string unavailable;  // empty when every entry point was found
};

template <typename Fn>
bool resolve(const char* symbol, Fn* out, std::string* missing) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(symbol, &p, kDriverAbiVersion, cudaEnableDefault, &status);
  if (e != cudaSuccess || status != cudaDriverEntryPointSuccess || p == nullptr) {
    cudaGetLastError();
    *missing = fmt::format("the CUDA driver does not export {} ({})", symbol,
                           e != cudaSuccess ? cudaGetErrorString(e)
                           : status == cudaDriverEntryPointVersionNotSufficent
                               ? "driver too old"
                               : "symbol not found");
    return false;
  }
  *out = reinterpret_cast<Fn>(p);
  return true;
}

const DriverApi& driver() {
  static const DriverApi api = [] {
    DriverApi d;
    if (cuda_device_count() == 0) {
      d.unavailable = cuda_status();  // "no CUDA device: <reason>"
      return d;
    }
    std::string missing;
    const bool ok = resolve("cuGetErrorName", &d.get_error_name, &missing) &&
                    resolve("cuGetErrorString", &d.get_error_string, &missing) &&
                    resolve("cuCtxGetCurrent", &d.ctx_get_current, &missing) &&
                    resolve("cuModuleLoadData", &d.module_load_data, &missing) &&
                    resolve("cuModuleUnload", &d.module_unload, &missing) &&
                    resolve("cuModuleGetFunction", &d.module_get_function, &missing) &&
                    resolve("cuLaunchKernel", &d.launch_kernel, &missing) &&
                    resolve("cuFuncSetAttribute", &d.func_set_attribute, &missing) &&
                    resolve("cuFuncGetAttribute", &d.func_get_attribute, &missing) &&
                    resolve("cuStreamSynchronize", &d.stream_synchronize, &missing);
    if (!ok) d.unavailable = missing + "; update the NVIDIA driver";
    std::string optional;  // a driver without cuLaunchKernelEx leaves it null: plain launches only
    if (ok) resolve("cuLaunchKernelEx", &d.launch_kernel_ex, &optional);
    return d;
  }();
  return api;
}

// The table, or a NotSupported error saying why there is none; `what` names the caller.
const DriverApi& require_driver(const std::string& what) {
  const DriverApi& d = driver();
  if (!d.unavailable.empty())
    fail_kind(ErrorKind::NotSupported, "{}: {}; run on a machine with an NVIDIA GPU and driver",
              what, d.unavailable);
  return d;
}

std::string result_text(const DriverApi& d, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.get_error_name) d.get_error_name(r, &name);
  if (d.get_error_string) d.get_error_string(r, &text);
  return fmt::format("{}: {}", name ? name : fmt::format("CUresult {}", int(r)),
                     text ? text : "unknown error");
}

bool launch_blocking() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_CUDA_LAUNCH_BLOCKING");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

// Makes the primary context of `device` current on this thread (cudaSetDevice does since CUDA
// 12) and returns it.
CUcontext make_current(const DriverApi& d, int device, const std::string& what) {
  check_cuda(cudaSetDevice(device), what.c_str());
  check_cuda(cudaFree(nullptr), what.c_str());  // initializes the context if it is not yet
  CUcontext ctx = nullptr;
  const CUresult r = d.ctx_get_current(&ctx);
  if (r != CUDA_SUCCESS || ctx == nullptr)
    fail_kind(ErrorKind::Runtime, "{}: no current CUDA context on device {} ({})", what, device,
              result_text(d, r));
  return ctx;
}

}  // namespace

bool driver_available(std::string* why) {
  const DriverApi& d = driver();
  if (why) *why = d.unavailable;
  return d.unavailable.empty();
}

std::string device_arch(int device) {
  require_cuda_device(device, "device_arch");
  int major = 0, minor = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
             "cudaDeviceGetAttribute(compute capability)");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
             "cudaDeviceGetAttribute(compute capability)");
  return fmt::format("sm_{}{}", major, minor);
}

std::shared_ptr<CudaModule> CudaModule::load(std::string_view image, int device,
                                             std::string name) {
  const std::string what = fmt::format("loading CUDA module '{}'", name);
  require_cuda_device(device, what.c_str());
  const DriverApi& d = require_driver(what);
  if (image.empty())
    fail_kind(ErrorKind::InvalidArgument, "{}: the image is empty (no cubin bytes)", what);
  CUcontext ctx = make_current(d, device, what);
  // cuModuleLoadData reads a cubin from memory; it needs no particular alignment, but the
  // std::string_view may point into a string that is not NUL-terminated: copy for PTX safety.
  std::string bytes(image);
  CUmodule module = nullptr;
  const CUresult r = d.module_load_data(&module, bytes.data());
  if (r != CUDA_SUCCESS)
    fail_kind(ErrorKind::Runtime,
              "{} on cuda:{} ({}): {} (was the cubin compiled for this device's architecture {}?)",
              what, device, device_arch(device), result_text(d, r), device_arch(device));
  std::shared_ptr<CudaModule> m(new CudaModule());
  m->module_ = module;
  m->context_ = ctx;
  m->device_ = device;
  m->name_ = std::move(name);
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    cudaGetLastError();
    major = 0;
  }
  m->programmatic_ = major >= 9 && d.launch_kernel_ex != nullptr;
  return m;
}

CudaModule::~CudaModule() {
  const DriverApi& d = driver();
  if (!module_ || !d.module_unload) return;
  // cuModuleUnload acts on the current context: make the module's device current first.
  if (cudaSetDevice(device_) != cudaSuccess) cudaGetLastError();
  d.module_unload(static_cast<CUmodule>(module_));
}

bool CudaModule::has_kernel(const std::string& kernel_name) const {
  const DriverApi& d = driver();
  CUfunction fn = nullptr;
  return d.module_get_function(&fn, static_cast<CUmodule>(module_), kernel_name.c_str()) ==
             CUDA_SUCCESS &&
         fn != nullptr;
}

CudaKernel CudaModule::kernel(const std::string& kernel_name) const {
  const DriverApi& d = driver();
  CUfunction fn = nullptr;
  const CUresult r =
      d.module_get_function(&fn, static_cast<CUmodule>(module_), kernel_name.c_str());
  if (r == CUDA_ERROR_NOT_FOUND)
    fail_kind(ErrorKind::Internal,
              "CUDA kernel '{}' not found in module '{}': the generated source defines no "
              "extern \"C\" __global__ function of that name",
              kernel_name, name_);
  if (r != CUDA_SUCCESS || fn == nullptr)
    fail_kind(ErrorKind::Runtime, "CUDA kernel '{}' of module '{}': cuModuleGetFunction: {}",
              kernel_name, name_, result_text(d, r));
  CudaKernel k;
  k.function_ = fn;
  k.module_ = shared_from_this();
  k.name_ = kernel_name;
  return k;
}

void CudaKernel::launch(const LaunchConfig& c, void** args) const {
  if (!function_)
    fail_kind(ErrorKind::Internal, "internal error: launch of an empty CudaKernel");
  const DriverApi& d = driver();
  CUcontext current = nullptr;
  if (d.ctx_get_current(&current) != CUDA_SUCCESS || current != module_->context_)
    make_current(d, module_->device_, fmt::format("launching CUDA kernel '{}'", name_));
  CUresult r;
  if (c.programmatic && module_->programmatic_) {
    // Note [CUDA programmatic launch]: the kernel may be scheduled once every block of the
    // kernel before it has passed its KN_GRID_WAIT(); its own KN_GRID_WAIT() then waits for
    // that kernel to end.
    CUlaunchAttribute attr;
    std::memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig lc;
    std::memset(&lc, 0, sizeof lc);
    lc.gridDimX = c.grid.x;
    lc.gridDimY = c.grid.y;
    lc.gridDimZ = c.grid.z;
    lc.blockDimX = c.block.x;
    lc.blockDimY = c.block.y;
    lc.blockDimZ = c.block.z;
    lc.sharedMemBytes = c.shared_bytes;
    lc.hStream = static_cast<CUstream>(c.stream);
    lc.attrs = &attr;
    lc.numAttrs = 1;
    r = d.launch_kernel_ex(&lc, static_cast<CUfunction>(function_), args, nullptr);
  } else {
    r = d.launch_kernel(static_cast<CUfunction>(function_), c.grid.x, c.grid.y, c.grid.z,
                        c.block.x, c.block.y, c.block.z, c.shared_bytes,
                        static_cast<CUstream>(c.stream), args, nullptr);
  }
  const char* phase = "launch";
  if (r == CUDA_SUCCESS && launch_blocking()) {
    r = d.stream_synchronize(static_cast<CUstream>(c.stream));
    phase = "execution (KILN_CUDA_LAUNCH_BLOCKING)";
  }
  if (r != CUDA_SUCCESS)
    fail_kind(ErrorKind::Runtime,
              "CUDA error in kernel '{}' of module '{}' ({}; grid {}x{}x{}, block {}x{}x{}, {} B "
              "dynamic shared memory): {}",
              name_, module_->name_, phase, c.grid.x, c.grid.y, c.grid.z, c.block.x, c.block.y,
              c.block.z, c.shared_bytes, result_text(d, r));
}

void CudaKernel::set_max_dynamic_shared_bytes(int bytes) const {
  if (!function_)
    fail_kind(ErrorKind::Internal, "internal error: attribute of an empty CudaKernel");
  const DriverApi& d = driver();
  const CUresult r = d.func_set_attribute(static_cast<CUfunction>(function_),
                                          CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes);
  if (r != CUDA_SUCCESS)
    fail_kind(ErrorKind::Runtime,
              "CUDA kernel '{}' of module '{}': cannot allow {} B of dynamic shared memory: {}",
              name_, module_->name_, bytes, result_text(d, r));
}

KernelAttributes CudaKernel::attributes() const {
  if (!function_)
    fail_kind(ErrorKind::Internal, "internal error: attribute of an empty CudaKernel");
  const DriverApi& d = driver();
  KernelAttributes a;
  auto get = [&](CUfunction_attribute attr, int* out, const char* attr_name) {
    const CUresult r = d.func_get_attribute(out, attr, static_cast<CUfunction>(function_));
    if (r != CUDA_SUCCESS)
      fail_kind(ErrorKind::Runtime, "CUDA kernel '{}' of module '{}': cuFuncGetAttribute({}): {}",
                name_, module_->name_, attr_name, result_text(d, r));
  };
  get(CU_FUNC_ATTRIBUTE_NUM_REGS, &a.registers_per_thread, "NUM_REGS");
  get(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, &a.max_threads_per_block, "MAX_THREADS_PER_BLOCK");
  get(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, &a.static_shared_bytes, "SHARED_SIZE_BYTES");
  get(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, &a.local_bytes_per_thread, "LOCAL_SIZE_BYTES");
  get(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, &a.max_dynamic_shared_bytes,
      "MAX_DYNAMIC_SHARED_SIZE_BYTES");
  return a;
}

}  // namespace kiln::cuda
