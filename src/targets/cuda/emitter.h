// The CUDA target's kernel emitter: one readable CUDA C program per graph (compiled by NVRTC),
// one extern "C" __global__ function per fused loop kernel. See Note [CUDA code generation] in
// emitter.cc.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "compiler/target.h"
#include "lower/scheduler.h"

namespace kiln::cuda {

using compiler::MemRef;

struct CudaCodegenOptions {
  int threads_per_block = 256;  // pointwise kernels; the upper bound for row kernels
  // Pointwise kernels take V consecutive elements per thread through 16-byte accesses where
  // accesses are linear and aligned (Note [CUDA vector accesses]); compiler::Options::vectorize.
  bool vectorize = true;
  // Tests only: a kernel whose name contains this gets a compile error.
  std::string inject_error_into;
  // The slot of the execution context's status record (Note [Device status] in
  // runtime/executable.h): kernels with integer div / pow take it as their last pointer.
  int32_t status_slot = -1;
};

// How a kernel is launched: `blocks` x `threads`, arguments = the slot-table entries `slots`
// (device pointers), in order.
struct CudaKernelInfo {
  std::string name;
  std::vector<int32_t> slots;
  int64_t blocks = 0;   // 0: nothing to compute (empty space): the launch is skipped
  int threads = 0;
};

struct CudaProgram {
  std::string source;
  std::vector<CudaKernelInfo> kernels;  // per Schedule::loops entry
  std::vector<Executable::DeviceCheck> checks;  // what the kernels may report, one per node
};

// `max_blocks`: the grid-size cap (a few waves of the device's multiprocessors); kernels loop
// over whatever the grid does not cover.
CudaProgram generate_cuda(const Graph& g, const lower::Schedule& s, const std::vector<MemRef>& mem,
                          const std::string& program_name, int64_t max_blocks,
                          const CudaCodegenOptions& options = {});

// The first line of every generated kernel's body (loop, direct and convolution-epilogue kernels):
// the grid dependency wait of Note [CUDA programmatic launch] (target.cc), a no-op unless the
// kernel is launched programmatically on sm_90 or later.
inline constexpr const char* kGridWait = "  KN_GRID_WAIT();  // Note [CUDA programmatic launch]\n";

// The text every generated program starts with (types, the shared scalar math, block reductions).
const std::string& cuda_prelude();
// Its last part: KN_GRID_WAIT, kn_report and the integer div / pow that report bad values (Note [Device
// status]); after the scalar math (tests compile it as host C++ under a shim).
const char* cuda_status_prelude();

}  // namespace kiln::cuda
