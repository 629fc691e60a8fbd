// The CUDA target's direct kernels: one extern "C" __global__ function per graph node, generated
// as CUDA C source with every size a literal (grid-stride loops over the output), for the ops
// and cases neither cuBLASLt nor cuDNN nor the fused loop code covers. Device-free: this file
// only writes source (target.cc compiles and launches it; tests/unit/cuda_codegen_test.cc
// compiles it with NVRTC where there is no GPU). See Note [CUDA direct kernels].
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "targets/cuda/nvrtc.h"

namespace kiln::cuda {

// A direct kernel for one node, launched as `blocks` x `threads` over the device pointers of
// the node's inputs `arg_inputs`, then its outputs `arg_outputs`, in that order (then the status
// record where `reports`).
struct DirectKernel {
  std::string name;      // the kernel's function name
  std::string source;    // its definition (and any tables it reads), to go after cuda_prelude()
  std::string describe;  // one line for the compile report
  int64_t blocks = 0;    // 0: nothing to compute (an empty output); the launch is skipped
  int threads = 256;
  std::vector<int> arg_inputs, arg_outputs;
  // Kernels that check their indices take the status record (Note [Device status] in
  // runtime/executable.h) as a last pointer argument and report code `index + 1` with the bad
  // index: the call then fails with check_prefix + value + check_suffix.
  bool reports = false;
  std::string check_prefix, check_suffix;
};

// Plans node `n` (graph index `index`, which makes the kernel's name unique) as a direct kernel
// with at most `max_blocks` blocks. Every input is read as a contiguous row-major tensor (the
// compiler copies views first), except where `input_strides[i]` is non-empty: attention reads
// its q, k and v views in place with those element strides (the last one 1;
// Note [CUDA attention reads views]). Throws NotSupported (or InvalidArgument) naming the reason when
// the op, dtype or shape has none. Covers: max/avg pooling, adaptive_avg_pool2d, concat, split,
// embedding, index_select, gather, scatter_add, pad, upsample, grid_sample, argmax/argmin,
// scaled_dot_product_attention (a flash-style kernel: Note [CUDA flash attention]), the
// small-channel convolution (conv2d, fused_conv2d: small_channel_conv), and direct GEMM
// (matmul, linear) and convolution (conv2d, conv_transpose2d) kernels for the dtypes and shapes
// the libraries do not take.
// `compute_capability` (e.g. 90 for sm_90; 0: unknown) lets float16/bfloat16 attention use the
// tensor cores from 80 on (Note [CUDA tensor-core attention]).
DirectKernel plan_direct_kernel(const Graph& g, const Node& n, int32_t index, int64_t max_blocks,
                                const std::vector<Dims>& input_strides = {},
                                int compute_capability = 0);

// Whether conv2d / fused_conv2d node `n` runs as the small-channel direct kernel (Note [CUDA
// small-channel convolutions] in direct_kernels.cc) when the target routes it there (unless the
// knob stem_conv=cudnn): float32, float16 or bfloat16, concrete 4-D shapes, groups 1, at most 4 input channels, a fused
// epilogue of bias, residual and relu or none, and a staged window that fits shared memory.
// plan_direct_kernel plans such a node with that kernel.
bool small_channel_conv(const Graph& g, const Node& n);

// Why cuBLASLt cannot run this matmul / linear ("" when it can): the dtype (float64, integers),
// batch dims that broadcast only partially, K = 0 or an empty output. The target then runs the
// direct GEMM kernel instead.
std::string gemm_needs_direct_kernel(const Graph& g, const Node& n);

// The NVRTC request for a program of direct kernels (the prelude, then `kernels`): FMA
// contraction is off, so that float64 kernels round like the float64 reference kernels.
CudaCompileRequest direct_program(const std::string& kernels, const std::string& program_name,
                                  const std::string& arch);

// Storage type of a dtype in generated code, and float loads / stores of floating dtypes.
const char* cuda_storage(DType d);
std::string to_float(DType d, const std::string& v);
std::string from_float(DType d, const std::string& v);
// The dtypes cuBLASLt and cuDNN take here (float32, float16, bfloat16).
bool library_dtype(DType d);
// The concrete sizes of a type (every dim a value).
Dims dims_of(const TensorType& t);

}  // namespace kiln::cuda
