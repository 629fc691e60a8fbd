// CUDA eager kernels: plain launch functions over raw device pointers, sizes and strides.
//
// This header is shared by kernels.cu (nvcc) and register.cc (g++), so it holds only plain
// structs and declarations: no Kiln tensors, no fmt, no CUDA headers. register.cc turns
// KernelContexts into these shapes, checks dtypes (NotSupported errors are raised there), and
// turns the returned status codes into kiln::Errors that name the op.
//
// Every launch function runs on the current device (set_device) and the legacy default stream,
// so it is ordered with the synchronous cudaMemcpy of Tensor::to. It returns 0 on success, a
// cudaError_t value from cudaGetLastError after the launch, or kUnsupportedKind when asked for
// an element type it was not built for (register.cc checks first, so that is a Kiln bug).
#pragma once
#include <cstdint>

namespace kiln::cuda_eager {

inline constexpr int kUnsupportedKind = -1;
inline constexpr int kMaxDims = 8;

// Element types as the kernels see them (register.cc maps kiln::DType onto these).
enum class ScalarKind : uint8_t { F32, F16, BF16, F64, I64, I32, I8, U8, Bool };

// The iteration space of an elementwise op: the output is contiguous over `sizes`; each input
// is read through its own strides (in elements; 0 on broadcast dims). register.cc drops size-1
// dims and merges dims that are contiguous in every operand, so most launches see rank <= 2.
struct ElementwiseShape {
  int rank = 0;
  int64_t numel = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[2][kMaxDims] = {};  // per input
};

enum class UnaryOp : uint8_t {
  Neg, Abs, Exp, Log, Sqrt, Rsqrt, Reciprocal, Sigmoid, Tanh, Relu, Silu, GeluErf, GeluTanh,
  Erf, Sin, Cos, Floor, Ceil, Round, Sign,
};
enum class BinaryOp : uint8_t { Add, Sub, Mul, Div, Maximum, Minimum };
enum class ReduceOp : uint8_t { Sum, Max, Min };  // max/min propagate NaN

// A reduction seen as M outputs x K reduced elements: input element (m, k) is at
// offset(m over out dims) + offset(k over reduced dims). Output m is written contiguously.
struct ReduceShape {
  int out_rank = 0;
  int red_rank = 0;
  int64_t out_sizes[kMaxDims] = {};
  int64_t out_strides[kMaxDims] = {};  // input strides of the kept dims, output order
  int64_t red_sizes[kMaxDims] = {};
  int64_t red_strides[kMaxDims] = {};
  int64_t M = 1;
  int64_t K = 1;
};

// How a reduction is launched; see Note [CUDA sum] in kernels.cu.
struct ReducePlan {
  bool inner = true;         // threads cooperate along k (reduced dims hold the small strides)
  int group = 256;           // inner: threads per output (32: a warp, 256: a block)
  int64_t splits = 1;        // K is cut into this many chunks; >1 needs a partial buffer
  int64_t chunk = 0;         // reduced elements per split
  int64_t partial_elems = 0; // accumulator-typed elements of scratch (M * splits) when splits > 1
  bool double_acc = false;   // the accumulator is double (float64 input) rather than float
};

// Device control.
int set_device(int index);
int synchronize();          // cudaDeviceSynchronize (KILN_CUDA_LAUNCH_BLOCKING=1 uses it)
int multiprocessor_count(int device);  // cached; 0 if the query fails

// dst (contiguous, dst_kind) = convert(src read through shape.strides[0]). Copy when the kinds
// are equal; otherwise Kiln's cast rules: float->int truncates toward zero and saturates, NaN
// -> 0; int->int wraps; anything -> bool is (v != 0).
int launch_convert(const ElementwiseShape& shape, const void* src, ScalarKind src_kind, void* dst,
                   ScalarKind dst_kind);
// out = op(x); float kinds compute in float (float16/bfloat16/float32) or double; integer kinds
// (I32, I64) support Neg, Abs, Relu and Sign.
int launch_unary(UnaryOp op, const ElementwiseShape& shape, const void* x, void* out,
                 ScalarKind kind);
// out = op(a, b), all three of `kind`; a is read through strides[0], b through strides[1].
// Integer kinds (I32, I64) support all but Div; they wrap like the CPU's int64 arithmetic.
int launch_binary(BinaryOp op, const ElementwiseShape& shape, const void* a, const void* b,
                  void* out, ScalarKind kind);

// Reduces F32, F16, BF16 (float accumulation) or F64 (double accumulation) input into out of
// the same kind; a sum is multiplied by `scale` (1 for sum, 1/K for mean). `partial` must hold
// plan.partial_elems accumulators when plan.splits > 1.
ReducePlan plan_reduce(const ReduceShape& shape, ScalarKind kind, int device);
int launch_reduce(ReduceOp op, const ReduceShape& shape, const ReducePlan& plan, const void* in,
                  void* out, ScalarKind kind, void* partial, double scale);

}  // namespace kiln::cuda_eager
