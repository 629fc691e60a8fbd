// CUDA eager kernels attached to the op registry (OpDef::eager_cuda) through a registry
// extension (register_op_extension, ops/op.h): it runs after every family has defined its ops,
// so the schema, inference and CPU kernels are already in place; this file only adds the CUDA
// entry points.
//
// Each entry point turns a KernelContext into the plain shapes of kernels.h (dropping size-1
// dims and merging dims that are contiguous in every operand), rejects dtypes the kernels lack
// with a NotSupported error naming the op, launches, and turns CUDA errors into kiln::Errors
// naming the op. Launches go to the legacy default stream, so a temporary freed back to the
// caching allocator right after its launch can only be reused by work ordered after it.
// KILN_CUDA_LAUNCH_BLOCKING=1 synchronizes after every launch so that a failing kernel is
// reported by the op that launched it rather than by a later copy.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "core/cuda_runtime.h"
#include "ops/api.h"
#include "eager/cuda/kernels.h"
#include "ops/kernel_util.h"

namespace kiln {
namespace {

namespace ce = cuda_eager;

ce::ScalarKind scalar_kind(DType d) {
  switch (d) {
    case DType::Float32: return ce::ScalarKind::F32;
    case DType::Float16: return ce::ScalarKind::F16;
    case DType::BFloat16: return ce::ScalarKind::BF16;
    case DType::Float64: return ce::ScalarKind::F64;
    case DType::Int64: return ce::ScalarKind::I64;
    case DType::Int32: return ce::ScalarKind::I32;
    case DType::Int8: return ce::ScalarKind::I8;
    case DType::UInt8: return ce::ScalarKind::U8;
    case DType::Bool: return ce::ScalarKind::Bool;
  }
  KILN_ASSERT(false);
}

bool is_kernel_float(DType d) {
  return d == DType::Float32 || d == DType::Float16 || d == DType::BFloat16 ||
         d == DType::Float64;
}
bool is_kernel_int(DType d) { return d == DType::Int32 || d == DType::Int64; }

[[noreturn]] void unsupported_dtype(const KernelContext& ctx, DType d, const char* supported) {
  fail_kind(ErrorKind::NotSupported,
            "op '{}' on CUDA: dtype {} is not supported (the CUDA kernel takes {}); cast the "
            "input or run the op on the CPU",
            ctx.op.name, dtype_name(d), supported);
}

bool launch_blocking() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_CUDA_LAUNCH_BLOCKING");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

void check_launch(const KernelContext& ctx, int code) {
  if (code == ce::kUnsupportedKind)
    fail_kind(ErrorKind::Internal, "internal error: op '{}': the CUDA kernel was asked for an "
              "element type it was not built for", ctx.op.name);
  std::string what = fmt::format("op '{}' (CUDA kernel launch)", ctx.op.name);
  check_cuda(code, what.c_str());
  if (launch_blocking()) {
    what = fmt::format("op '{}' (CUDA kernel, KILN_CUDA_LAUNCH_BLOCKING)", ctx.op.name);
    check_cuda(ce::synchronize(), what.c_str());
  }
}

// Checks that every tensor of the call is on one CUDA device and makes it current.
Device prepare(const KernelContext& ctx) {
  Device dev = ctx.outputs[0].device();
  auto check = [&](const Tensor& t, const char* role, size_t i) {
    if (!t.defined()) return;
    if (t.device() != dev)
      fail_kind(ErrorKind::Internal, "internal error: op '{}' on CUDA: {} {} is on {} but output "
                "0 is on {}", ctx.op.name, role, i, t.device().str(), dev.str());
  };
  for (size_t i = 0; i < ctx.inputs.size(); ++i) check(ctx.inputs[i], "input", i);
  for (size_t i = 0; i < ctx.outputs.size(); ++i) check(ctx.outputs[i], "output", i);
  KILN_ASSERT(dev.is_cuda());
  std::string what = fmt::format("op '{}' (cudaSetDevice {})", ctx.op.name, int(dev.index));
  check_cuda(ce::set_device(dev.index), what.c_str());
  return dev;
}

// The elementwise iteration space for a contiguous output of `sizes` read from inputs with the
// given (already broadcast) strides: size-1 dims dropped, dims contiguous in every input merged.
ce::ElementwiseShape elementwise_shape(const Dims& sizes, std::initializer_list<Dims> in_strides) {
  KILN_ASSERT(in_strides.size() <= 2);
  ce::ElementwiseShape s;
  s.numel = numel(sizes);
  const Dims* st[2] = {nullptr, nullptr};
  int n_in = 0;
  for (const Dims& d : in_strides) {
    KILN_ASSERT(d.size() == sizes.size());
    st[n_in++] = &d;
  }
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;
    if (s.rank > 0) {
      // Merge into the previous (outer) dim when, for every input, stepping the outer dim once
      // equals stepping this one through its whole size.
      bool mergeable = true;
      for (int k = 0; k < n_in; ++k)
        mergeable &= s.strides[k][s.rank - 1] == (*st[k])[d] * sizes[d];
      if (mergeable) {
        s.sizes[s.rank - 1] *= sizes[d];
        for (int k = 0; k < n_in; ++k) s.strides[k][s.rank - 1] = (*st[k])[d];
        continue;
      }
    }
    s.sizes[s.rank] = sizes[d];
    for (int k = 0; k < n_in; ++k) s.strides[k][s.rank] = (*st[k])[d];
    ++s.rank;
  }
  return s;
}

// ---- copy and cast ----------------------------------------------------------------------------
void cuda_convert(const KernelContext& ctx) {
  prepare(ctx);
  const Tensor& x = ctx.inputs[0];
  Tensor& out = ctx.outputs[0];
  KILN_ASSERT(out.is_contiguous() && out.sizes() == x.sizes());
  check_launch(ctx, ce::launch_convert(elementwise_shape(out.sizes(), {x.strides()}),
                                       x.raw_data(), scalar_kind(x.dtype()), out.raw_data(),
                                       scalar_kind(out.dtype())));
}

// A contiguous copy of `x` converted to `dtype` on x's device (for mixed-dtype binary inputs).
Tensor convert_on_device(const KernelContext& ctx, const Tensor& x, DType dtype) {
  Tensor out = Tensor::empty(x.sizes(), dtype, x.device());
  check_launch(ctx, ce::launch_convert(elementwise_shape(x.sizes(), {x.strides()}), x.raw_data(),
                                       scalar_kind(x.dtype()), out.raw_data(),
                                       scalar_kind(dtype)));
  return out;
}

// ---- unary -------------------------------------------------------------------------------------
bool unary_op_for(const KernelContext& ctx, ce::UnaryOp* op) {
  switch (ctx.op.id) {
    case OpId::Neg: *op = ce::UnaryOp::Neg; return true;
    case OpId::Abs: *op = ce::UnaryOp::Abs; return true;
    case OpId::Exp: *op = ce::UnaryOp::Exp; return true;
    case OpId::Log: *op = ce::UnaryOp::Log; return true;
    case OpId::Sqrt: *op = ce::UnaryOp::Sqrt; return true;
    case OpId::Rsqrt: *op = ce::UnaryOp::Rsqrt; return true;
    case OpId::Reciprocal: *op = ce::UnaryOp::Reciprocal; return true;
    case OpId::Sigmoid: *op = ce::UnaryOp::Sigmoid; return true;
    case OpId::Tanh: *op = ce::UnaryOp::Tanh; return true;
    case OpId::Relu: *op = ce::UnaryOp::Relu; return true;
    case OpId::Silu: *op = ce::UnaryOp::Silu; return true;
    case OpId::Erf: *op = ce::UnaryOp::Erf; return true;
    case OpId::Sin: *op = ce::UnaryOp::Sin; return true;
    case OpId::Cos: *op = ce::UnaryOp::Cos; return true;
    case OpId::Floor: *op = ce::UnaryOp::Floor; return true;
    case OpId::Ceil: *op = ce::UnaryOp::Ceil; return true;
    case OpId::Round: *op = ce::UnaryOp::Round; return true;
    case OpId::Sign: *op = ce::UnaryOp::Sign; return true;
    case OpId::Gelu:
      *op = ctx.attrs.get_string("approximate") == "tanh" ? ce::UnaryOp::GeluTanh
                                                          : ce::UnaryOp::GeluErf;
      return true;
    default: return false;
  }
}

void cuda_unary(const KernelContext& ctx) {
  prepare(ctx);
  const Tensor& x = ctx.inputs[0];
  Tensor& out = ctx.outputs[0];
  ce::UnaryOp op{};
  KILN_ASSERT(unary_op_for(ctx, &op));
  bool int_ok = op == ce::UnaryOp::Neg || op == ce::UnaryOp::Abs || op == ce::UnaryOp::Relu ||
                op == ce::UnaryOp::Sign;
  if (!is_kernel_float(x.dtype()) && !(int_ok && is_kernel_int(x.dtype())))
    unsupported_dtype(ctx, x.dtype(), int_ok ? "float32/float16/bfloat16/float64/int32/int64"
                                             : "float32/float16/bfloat16/float64");
  KILN_ASSERT(out.dtype() == x.dtype() && out.sizes() == x.sizes());
  check_launch(ctx, ce::launch_unary(op, elementwise_shape(out.sizes(), {x.strides()}),
                                     x.raw_data(), out.raw_data(), scalar_kind(x.dtype())));
}

// ---- binary ------------------------------------------------------------------------------------
void cuda_binary(const KernelContext& ctx) {
  prepare(ctx);
  Tensor& out = ctx.outputs[0];
  ce::BinaryOp op{};
  switch (ctx.op.id) {
    case OpId::Add: op = ce::BinaryOp::Add; break;
    case OpId::Sub: op = ce::BinaryOp::Sub; break;
    case OpId::Mul: op = ce::BinaryOp::Mul; break;
    case OpId::Div: op = ce::BinaryOp::Div; break;
    case OpId::Maximum: op = ce::BinaryOp::Maximum; break;
    case OpId::Minimum: op = ce::BinaryOp::Minimum; break;
    default: KILN_ASSERT(false);
  }
  DType d = out.dtype();
  bool int_ok = op != ce::BinaryOp::Div;
  if (!is_kernel_float(d) && !(int_ok && is_kernel_int(d)))
    unsupported_dtype(ctx, d, int_ok ? "float32/float16/bfloat16/float64/int32/int64"
                                     : "float32/float16/bfloat16/float64");
  // Mixed dtypes: bring each input to the promoted (output) dtype first.
  Tensor a = ctx.inputs[0], b = ctx.inputs[1];
  if (a.dtype() != d) a = convert_on_device(ctx, a, d);
  if (b.dtype() != d) b = convert_on_device(ctx, b, d);
  ce::ElementwiseShape s = elementwise_shape(
      out.sizes(), {broadcast_strides(a, out.sizes()), broadcast_strides(b, out.sizes())});
  check_launch(ctx, ce::launch_binary(op, s, a.raw_data(), b.raw_data(), out.raw_data(),
                                      scalar_kind(d)));
}

// ---- reductions: sum mean max min (kernels), var (composed) ------------------------------------
// Splits x's dims into kept (output order) and reduced (ordered by decreasing stride, since the
// order of a sum is free and the innermost reduced dim should be the most contiguous), drops
// size-1 dims and merges contiguous neighbours.
ce::ReduceShape reduce_shape(const Tensor& x, const std::vector<int>& axes) {
  ce::ReduceShape s;
  std::vector<bool> reduced(size_t(x.dim()), false);
  for (int a : axes)
    if (a < x.dim()) reduced[size_t(a)] = true;  // a 0-d input accepts axis 0 and reduces nothing
  struct SizeStride {
    int64_t size, stride;
  };
  std::vector<SizeStride> kept, red;
  for (int d = 0; d < x.dim(); ++d) {
    SizeStride ss{x.size(d), x.stride(d)};
    (reduced[size_t(d)] ? red : kept).push_back(ss);
  }
  s.M = 1;
  s.K = 1;
  for (auto& k : kept) s.M *= k.size;
  for (auto& r : red) s.K *= r.size;
  std::stable_sort(red.begin(), red.end(), [](const SizeStride& a, const SizeStride& b) {
    return std::abs(a.stride) > std::abs(b.stride);
  });
  auto pack = [](const std::vector<SizeStride>& dims, int& rank, int64_t* sizes,
                 int64_t* strides) {
    rank = 0;
    for (const SizeStride& d : dims) {
      if (d.size == 1) continue;
      if (rank > 0 && strides[rank - 1] == d.stride * d.size) {
        sizes[rank - 1] *= d.size;
        strides[rank - 1] = d.stride;
        continue;
      }
      sizes[rank] = d.size;
      strides[rank] = d.stride;
      ++rank;
    }
  };
  pack(kept, s.out_rank, s.out_sizes, s.out_strides);
  pack(red, s.red_rank, s.red_sizes, s.red_strides);
  return s;
}

void cuda_reduce(const KernelContext& ctx) {
  Device dev = prepare(ctx);
  const Tensor& x = ctx.inputs[0];
  Tensor& out = ctx.outputs[0];
  if (!is_kernel_float(x.dtype()))
    unsupported_dtype(ctx, x.dtype(), "float32/float16/bfloat16/float64");
  if (out.dtype() != x.dtype())
    fail_kind(ErrorKind::NotSupported, "op '{}' on CUDA: a {} output from a {} input is not "
              "supported (the CUDA kernel writes the input's dtype)", ctx.op.name,
              dtype_name(out.dtype()), dtype_name(x.dtype()));
  ce::ReduceShape s = reduce_shape(x, reduction_axes(ctx.attrs, x.dim()));
  KILN_ASSERT(s.M == out.numel());
  ce::ScalarKind kind = scalar_kind(x.dtype());
  ce::ReducePlan plan = ce::plan_reduce(s, kind, dev.index);
  Tensor partial;  // scratch from the caching allocator; see the stream note at the top
  if (plan.splits > 1)
    partial = Tensor::empty(Dims{plan.partial_elems},
                            plan.double_acc ? DType::Float64 : DType::Float32, dev);
  double scale = ctx.op.id == OpId::Mean ? 1.0 / double(s.K) : 1.0;
  ce::ReduceOp op = ctx.op.id == OpId::Max   ? ce::ReduceOp::Max
                    : ctx.op.id == OpId::Min ? ce::ReduceOp::Min
                                             : ce::ReduceOp::Sum;
  check_launch(ctx, ce::launch_reduce(op, s, plan, x.raw_data(), out.raw_data(), kind,
                                      partial.defined() ? partial.raw_data() : nullptr, scale));
}

// var = sum((x - mean)^2) / max(N - correction, 0), two passes of CUDA ops through dispatch
// (each one a kernel above). 16-bit inputs are widened to float32 first so that the mean and
// the squared deviations are not rounded to 16 bits on the way.
void cuda_var(const KernelContext& ctx) {
  Device dev = prepare(ctx);
  const Tensor& x0 = ctx.inputs[0];
  Tensor& out = ctx.outputs[0];
  if (!is_kernel_float(x0.dtype()))
    unsupported_dtype(ctx, x0.dtype(), "float32/float16/bfloat16/float64");
  std::vector<int> axes = reduction_axes(ctx.attrs, x0.dim());
  std::vector<int64_t> dims;
  int64_t n = 1;
  for (int a : axes) {  // explicit axes: an empty "dims" was already expanded to all of them
    if (a >= x0.dim()) continue;  // 0-d input: nothing reduced
    dims.push_back(a);
    n *= x0.size(a);
  }
  bool keepdim = ctx.attrs.get_bool("keepdim");
  double divisor = std::max<double>(double(n - ctx.attrs.get_int("correction")), 0.0);
  DType cd = x0.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
  Tensor x = x0.dtype() == cd ? x0 : cast(x0, cd);
  Tensor d = sub(x, mean(x, dims, true));
  Tensor v = div(sum(mul(d, d), dims, keepdim), Tensor::scalar(divisor, cd).to(dev));
  if (v.dtype() != out.dtype()) v = cast(v, out.dtype());
  KILN_ASSERT(v.sizes() == out.sizes() && v.is_contiguous());
  cuda_memcpy(out.raw_data(), v.raw_data(), out.nbytes(), CopyKind::DeviceToDevice);
}

void attach_cuda_eager_kernels() {
  const std::vector<DType> floats = {DType::Float32, DType::Float16, DType::BFloat16, DType::Float64};
  const std::vector<DType> signed_numeric = {DType::Float32, DType::Float16, DType::BFloat16,
                                             DType::Float64, DType::Int32,   DType::Int64};
  auto attach = [](OpId id, KernelFn fn, const std::vector<DType>& dtypes) {
    OpDef& d = define_op(id);
    d.eager_cuda = fn;
    d.eager_cuda_dtypes.clear();
    for (DType t : dtypes)  // the intersection with what the op itself takes
      if (d.supports_dtype(t)) d.eager_cuda_dtypes.push_back(t);
  };
  attach(OpId::Copy, cuda_convert, all_dtypes());
  attach(OpId::Cast, cuda_convert, all_dtypes());
  for (OpId id : {OpId::Neg, OpId::Abs, OpId::Relu, OpId::Sign}) attach(id, cuda_unary, signed_numeric);
  for (OpId id : {OpId::Exp, OpId::Log, OpId::Sqrt, OpId::Rsqrt, OpId::Reciprocal, OpId::Sigmoid,
                  OpId::Tanh, OpId::Silu, OpId::Gelu, OpId::Erf, OpId::Sin, OpId::Cos,
                  OpId::Floor, OpId::Ceil, OpId::Round})
    attach(id, cuda_unary, floats);
  for (OpId id : {OpId::Add, OpId::Sub, OpId::Mul, OpId::Maximum, OpId::Minimum})
    attach(id, cuda_binary, signed_numeric);
  attach(OpId::Div, cuda_binary, floats);
  for (OpId id : {OpId::Sum, OpId::Mean, OpId::Max, OpId::Min}) attach(id, cuda_reduce, floats);
  attach(OpId::Var, cuda_var, floats);
}

const bool g_registered = register_op_extension("cuda-eager-kernels", &attach_cuda_eager_kernels);

}  // namespace

}  // namespace kiln
