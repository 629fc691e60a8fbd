// The CUDA driver API as the CUDA target needs it: load a cubin, find its kernels by name,
// launch them. Reached through cudaGetDriverEntryPointByVersion of the static cudart, never by
// linking -lcuda (only a stub libcuda exists on machines without a GPU), so every binary starts
// everywhere and says "no CUDA device: ..." where there is none.
//
//   auto module = cuda::CudaModule::load(cubin_bytes, /*device=*/0, "main");
//   cuda::CudaKernel k = module->kernel("pointwise_3");
//   void* args[] = {&out, &in, &n};
//   k.launch({.grid = {blocks}, .block = {256}, .stream = stream}, args);
//
// Errors are kiln::Errors that name the kernel and the module (and for launches the geometry);
// KILN_CUDA_LAUNCH_BLOCKING=1 synchronizes the stream after every launch so that a failing kernel
// is reported by its own launch. No CUDA headers here: streams are `void*` (cudaStream_t).
#pragma once
#include <memory>
#include <string>
#include <string_view>

namespace kiln::cuda {

// Whether the driver API can be used: a CUDA device exists and its driver exports the entry
// points below. `why` (optional) gets "no CUDA device: <reason>" or what is missing.
bool driver_available(std::string* why = nullptr);

// The compute capability of `device` as an NVRTC architecture, e.g. "sm_90". Throws the
// "no CUDA device" kiln::Error where there is none.
std::string device_arch(int device);

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// The most pointer parameters a generated kernel takes (loop kernels: one per buffer they
// touch; direct kernels: one per input and output). 256 pointers are 2 KiB of parameters, half
// of the 4 KiB every CUDA architecture accepts; launchers keep their argument arrays on the
// stack at this size.
inline constexpr int kMaxKernelPointerArgs = 256;

struct LaunchConfig {
  Dim3 grid;
  Dim3 block;
  unsigned shared_bytes = 0;  // dynamic shared memory per block
  void* stream = nullptr;     // cudaStream_t; nullptr is the legacy default stream
  // Note [CUDA programmatic launch] (targets/cuda/target.cc): the kernel may start before the
  // previous kernel in the stream has ended. Only for kernels whose first statement is
  // KN_GRID_WAIT() (every generated kernel's); ignored below sm_90 or without cuLaunchKernelEx.
  bool programmatic = false;
};

// What the compiler decided for one kernel (cuFuncGetAttribute).
struct KernelAttributes {
  int registers_per_thread = 0;
  int max_threads_per_block = 0;
  int static_shared_bytes = 0;
  int local_bytes_per_thread = 0;  // > 0: spills or arrays in local memory
  int max_dynamic_shared_bytes = 0;
};

class CudaModule;

// One kernel of a loaded module. Cheap to copy; keeps its module loaded.
class CudaKernel {
 public:
  CudaKernel() = default;
  const std::string& name() const { return name_; }
  bool valid() const { return function_ != nullptr; }

  // cuLaunchKernel (cuLaunchKernelEx for a programmatic launch) with `args` = one pointer per
  // kernel parameter, in order. Makes the module's
  // device current on this thread when it is not. Throws kiln::Error naming the kernel, its
  // module and the launch geometry.
  void launch(const LaunchConfig& config, void** args) const;
  // Raises the dynamic shared memory limit (needed above 48 KiB).
  void set_max_dynamic_shared_bytes(int bytes) const;
  KernelAttributes attributes() const;

 private:
  friend class CudaModule;
  void* function_ = nullptr;  // CUfunction
  std::shared_ptr<const CudaModule> module_;
  std::string name_;
};

// A cubin loaded on one device (cuModuleLoadData); unloaded when the last reference goes.
class CudaModule : public std::enable_shared_from_this<CudaModule> {
 public:
  // `image`: the bytes of a cubin (or fatbin/PTX: whatever cuModuleLoadData accepts); `name`
  // is for messages. Throws "no CUDA device" where there is none, and a kiln::Error naming the
  // module when the driver rejects the image (e.g. a cubin for another architecture).
  static std::shared_ptr<CudaModule> load(std::string_view image, int device, std::string name);
  ~CudaModule();
  CudaModule(const CudaModule&) = delete;
  CudaModule& operator=(const CudaModule&) = delete;

  // The kernel `name` (an extern "C" __global__ function); throws kiln::Error naming the kernel
  // and the module when the module has none of that name.
  CudaKernel kernel(const std::string& name) const;
  bool has_kernel(const std::string& name) const;
  const std::string& name() const { return name_; }
  int device() const { return device_; }

 private:
  CudaModule() = default;
  friend class CudaKernel;
  void* module_ = nullptr;   // CUmodule
  void* context_ = nullptr;  // CUcontext (the device's primary context)
  int device_ = 0;
  bool programmatic_ = false;  // its kernels can be launched programmatically (sm_90+, cuLaunchKernelEx)
  std::string name_;
};

}  // namespace kiln::cuda
