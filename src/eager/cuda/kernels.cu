// CUDA eager kernels (see kernels.h for the contract). Compiled by nvcc for sm_90.
//
// Everything here is plain CUDA over raw pointers: elementwise kernels walk a contiguous output
// with a grid-stride loop and read each input through its strides; the sum kernels follow
// Note [CUDA sum]. Element conversions reproduce the CPU's (src/core/dtype.cc) bit for bit, so
// that CUDA and CPU eager results can be compared exactly where the arithmetic allows it.
#include "eager/cuda/kernels.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <type_traits>

#include "ops/scalar_math.h"

namespace kiln::cuda_eager {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridBlocks = 65536;  // grid-stride loops cover the rest
constexpr int64_t kMaxSplits = 1024;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- element types ---------------------------------------------------------------------------
// 16-bit floats and bool are stored as raw bits so that this file needs no Kiln types.
struct f16_t { uint16_t bits; };
struct bf16_t { uint16_t bits; };
struct bool_t { uint8_t v; };

__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) {
  return __uint_as_float(uint32_t(b) << 16);
}
// Round to nearest even; NaN stays a quiet NaN with its sign (as BFloat16::from_float).
__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return uint16_t((u + rounding) >> 16);
}

// Float -> integer as the CPU's sat_cast: NaN -> 0, saturate at the bounds, else truncate.
template <typename I>
struct IntBounds {  // evaluated on the host at compile time; device code reads the constants
  static constexpr I kLo = std::numeric_limits<I>::min();
  static constexpr I kHi = std::numeric_limits<I>::max();
};
template <typename I>
__device__ __forceinline__ I saturate(double v) {
  if (v != v) return I(0);
  constexpr I lo = IntBounds<I>::kLo, hi = IntBounds<I>::kHi;
  if (v <= double(lo)) return lo;
  if (v >= double(hi)) return hi;
  return I(v);
}

// Elem<T>: how a stored element converts. `Compute` is the arithmetic type of pointwise ops:
// float for the 16-bit floats and float32, double for float64, int64 (wrapping) for integers.
template <typename T> struct Elem;

template <> struct Elem<float> {
  static constexpr bool kFloat = true;
  using Compute = float;
  __device__ static double to_f64(float v) { return v; }
  __device__ static float from_f64(double v) { return float(v); }
  __device__ static float to_compute(float v) { return v; }
  __device__ static float from_compute(float v) { return v; }
};
template <> struct Elem<f16_t> {
  static constexpr bool kFloat = true;
  using Compute = float;
  __device__ static float to_compute(f16_t v) { return __half2float(__ushort_as_half(v.bits)); }
  __device__ static f16_t from_compute(float v) { return {__half_as_ushort(__float2half_rn(v))}; }
  __device__ static double to_f64(f16_t v) { return to_compute(v); }
  // Through float like Half(float(v)) on the CPU.
  __device__ static f16_t from_f64(double v) { return from_compute(float(v)); }
};
template <> struct Elem<bf16_t> {
  static constexpr bool kFloat = true;
  using Compute = float;
  __device__ static float to_compute(bf16_t v) { return bf16_bits_to_float(v.bits); }
  __device__ static bf16_t from_compute(float v) { return {float_to_bf16_bits(v)}; }
  __device__ static double to_f64(bf16_t v) { return to_compute(v); }
  __device__ static bf16_t from_f64(double v) { return from_compute(float(v)); }
};
template <> struct Elem<double> {
  static constexpr bool kFloat = true;
  using Compute = double;
  __device__ static double to_f64(double v) { return v; }
  __device__ static double from_f64(double v) { return v; }
  __device__ static double to_compute(double v) { return v; }
  __device__ static double from_compute(double v) { return v; }
};

template <typename I>
struct IntElem {
  static constexpr bool kFloat = false;
  using Compute = int64_t;
  __device__ static double to_f64(I v) { return double(v); }
  __device__ static I from_f64(double v) { return saturate<I>(v); }
  __device__ static int64_t to_i64(I v) { return int64_t(v); }
  // Wraps (two's complement), as store_i64 does.
  __device__ static I from_i64(int64_t v) {
    using U = std::make_unsigned_t<I>;
    return I(U(uint64_t(v)));
  }
  __device__ static int64_t to_compute(I v) { return int64_t(v); }
  __device__ static I from_compute(int64_t v) { return from_i64(v); }
};
template <> struct Elem<int64_t> : IntElem<int64_t> {};
template <> struct Elem<int32_t> : IntElem<int32_t> {};
template <> struct Elem<int8_t> : IntElem<int8_t> {};
template <> struct Elem<uint8_t> : IntElem<uint8_t> {};
template <> struct Elem<bool_t> {
  static constexpr bool kFloat = false;
  using Compute = int64_t;
  __device__ static double to_f64(bool_t v) { return v.v ? 1.0 : 0.0; }
  __device__ static bool_t from_f64(double v) { return {uint8_t(v != 0.0)}; }
  __device__ static int64_t to_i64(bool_t v) { return v.v ? 1 : 0; }
  __device__ static bool_t from_i64(int64_t v) { return {uint8_t(v != 0)}; }
};

// Kiln's conversion rule (Tensor::copy_): through float64 when either side is floating, else
// through int64.
template <typename S, typename D>
__device__ __forceinline__ D convert_elem(S s) {
  if constexpr (std::is_same_v<S, D>) {
    return s;
  } else if constexpr (Elem<S>::kFloat || Elem<D>::kFloat) {
    return Elem<D>::from_f64(Elem<S>::to_f64(s));
  } else {
    return Elem<D>::from_i64(Elem<S>::to_i64(s));
  }
}

template <typename T> struct Tag { using type = T; };

template <typename F>
int visit_kind(ScalarKind k, F&& f) {
  switch (k) {
    case ScalarKind::F32: return f(Tag<float>{});
    case ScalarKind::F16: return f(Tag<f16_t>{});
    case ScalarKind::BF16: return f(Tag<bf16_t>{});
    case ScalarKind::F64: return f(Tag<double>{});
    case ScalarKind::I64: return f(Tag<int64_t>{});
    case ScalarKind::I32: return f(Tag<int32_t>{});
    case ScalarKind::I8: return f(Tag<int8_t>{});
    case ScalarKind::U8: return f(Tag<uint8_t>{});
    case ScalarKind::Bool: return f(Tag<bool_t>{});
  }
  return kUnsupportedKind;
}

// ---- elementwise -----------------------------------------------------------------------------
// Element offset of linear output index i in input `which`. The loop is unrolled over the fixed
// maximum rank so that the shape stays in kernel-parameter space instead of local memory.
__device__ __forceinline__ int64_t input_offset(const ElementwiseShape& s, int which, int64_t i) {
  int64_t off = 0;
#pragma unroll
  for (int d = kMaxDims - 1; d >= 1; --d) {
    if (d < s.rank) {
      int64_t q = i / s.sizes[d];
      off += (i - q * s.sizes[d]) * s.strides[which][d];
      i = q;
    }
  }
  return s.rank > 0 ? off + i * s.strides[which][0] : 0;
}

int grid_for(int64_t n) { return int(std::min(ceil_div(n, kThreads), kMaxGridBlocks)); }

#define KILN_GRID_STRIDE_LOOP(i, n)                                            \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);     \
       i += int64_t(gridDim.x) * blockDim.x)

template <typename S, typename D>
__global__ void __launch_bounds__(kThreads)
convert_kernel(ElementwiseShape s, const S* __restrict__ src, D* __restrict__ dst) {
  KILN_GRID_STRIDE_LOOP(i, s.numel) { dst[i] = convert_elem<S, D>(src[input_offset(s, 0, i)]); }
}

// Unary functions in the compute type (float, double or int64): the scalar math every path
// shares (ops/scalar_math.h, Note [Scalar math]).
template <UnaryOp OP, typename C>
__device__ __forceinline__ C unary_fn(C x) {
  if constexpr (OP == UnaryOp::Neg) return kn_neg(x);
  else if constexpr (OP == UnaryOp::Abs) return kn_abs(x);
  else if constexpr (OP == UnaryOp::Relu) return kn_relu(x);
  else if constexpr (OP == UnaryOp::Sign) return kn_sign(x);
  else if constexpr (OP == UnaryOp::Exp) return kn_exp(x);
  else if constexpr (OP == UnaryOp::Log) return kn_log(x);
  else if constexpr (OP == UnaryOp::Sqrt) return kn_sqrt(x);
  else if constexpr (OP == UnaryOp::Rsqrt) return kn_rsqrt(x);  // 1/sqrt: rsqrtf is 2 ulp
  else if constexpr (OP == UnaryOp::Reciprocal) return kn_recip(x);
  else if constexpr (OP == UnaryOp::Sigmoid) return kn_sigmoid(x);
  else if constexpr (OP == UnaryOp::Tanh) return kn_tanh(x);
  else if constexpr (OP == UnaryOp::Silu) return kn_silu(x);
  else if constexpr (OP == UnaryOp::GeluErf) return kn_gelu(x);
  else if constexpr (OP == UnaryOp::GeluTanh) return kn_gelu_tanh(x);
  else if constexpr (OP == UnaryOp::Erf) return kn_erf(x);
  else if constexpr (OP == UnaryOp::Sin) return kn_sin(x);
  else if constexpr (OP == UnaryOp::Cos) return kn_cos(x);
  else if constexpr (OP == UnaryOp::Floor) return kn_floor(x);
  else if constexpr (OP == UnaryOp::Ceil) return kn_ceil(x);
  else {
    static_assert(OP == UnaryOp::Round);
    return kn_round(x);  // half to even
  }
}

constexpr bool unary_supports_ints(UnaryOp op) {
  return op == UnaryOp::Neg || op == UnaryOp::Abs || op == UnaryOp::Relu || op == UnaryOp::Sign;
}

template <typename T, UnaryOp OP>
__global__ void __launch_bounds__(kThreads)
unary_kernel(ElementwiseShape s, const T* __restrict__ x, T* __restrict__ out) {
  KILN_GRID_STRIDE_LOOP(i, s.numel) {
    out[i] = Elem<T>::from_compute(unary_fn<OP>(Elem<T>::to_compute(x[input_offset(s, 0, i)])));
  }
}

template <BinaryOp OP, typename C>
__device__ __forceinline__ C binary_fn(C a, C b) {
  // ops/scalar_math.h: integers wrap, max/min propagate NaN. Integer Div is rejected before
  // launch (the kernel is never instantiated for it).
  if constexpr (OP == BinaryOp::Add) return kn_add(a, b);
  else if constexpr (OP == BinaryOp::Sub) return kn_sub(a, b);
  else if constexpr (OP == BinaryOp::Mul) return kn_mul(a, b);
  else if constexpr (OP == BinaryOp::Div) {
    if constexpr (std::is_integral_v<C>) return C(0);
    else return kn_div(a, b);
  } else if constexpr (OP == BinaryOp::Maximum) return kn_max(a, b);
  else return kn_min(a, b);
}

template <typename T, BinaryOp OP>
__global__ void __launch_bounds__(kThreads)
binary_kernel(ElementwiseShape s, const T* __restrict__ a, const T* __restrict__ b,
              T* __restrict__ out) {
  KILN_GRID_STRIDE_LOOP(i, s.numel) {
    auto va = Elem<T>::to_compute(a[input_offset(s, 0, i)]);
    auto vb = Elem<T>::to_compute(b[input_offset(s, 1, i)]);
    out[i] = Elem<T>::from_compute(binary_fn<OP>(va, vb));
  }
}

template <typename F>
int visit_unary_op(UnaryOp op, F&& f) {
  switch (op) {
#define KILN_CASE(X) \
  case UnaryOp::X: return f(std::integral_constant<UnaryOp, UnaryOp::X>{});
    KILN_CASE(Neg) KILN_CASE(Abs) KILN_CASE(Exp) KILN_CASE(Log) KILN_CASE(Sqrt) KILN_CASE(Rsqrt)
    KILN_CASE(Reciprocal) KILN_CASE(Sigmoid) KILN_CASE(Tanh) KILN_CASE(Relu) KILN_CASE(Silu)
    KILN_CASE(GeluErf) KILN_CASE(GeluTanh) KILN_CASE(Erf) KILN_CASE(Sin) KILN_CASE(Cos)
    KILN_CASE(Floor) KILN_CASE(Ceil) KILN_CASE(Round) KILN_CASE(Sign)
#undef KILN_CASE
  }
  return kUnsupportedKind;
}

template <typename F>
int visit_binary_op(BinaryOp op, F&& f) {
  switch (op) {
#define KILN_CASE(X) \
  case BinaryOp::X: return f(std::integral_constant<BinaryOp, BinaryOp::X>{});
    KILN_CASE(Add) KILN_CASE(Sub) KILN_CASE(Mul) KILN_CASE(Div) KILN_CASE(Maximum)
    KILN_CASE(Minimum)
#undef KILN_CASE
  }
  return kUnsupportedKind;
}

template <typename T>
constexpr bool is_arith_int = std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>;
template <typename T>
constexpr bool is_float_elem = std::is_same_v<T, float> || std::is_same_v<T, f16_t> ||
                               std::is_same_v<T, bf16_t> || std::is_same_v<T, double>;

// ---- sum -------------------------------------------------------------------------------------
// Note [CUDA sum]
// Sum (and mean), max and min share these kernels; only the combine step differs (max/min
// propagate NaN and round nothing, so they match the CPU exactly).
// A reduction is M outputs x K reduced elements (ReduceShape). Two kernels, chosen by layout:
//   inner: the reduced dims hold the smallest strides (e.g. summing the last dim). A group of
//     threads (a warp when K < 1024, else the whole 256-thread block) shares one output: each
//     thread walks k = lane, lane + group, ... so that neighbouring threads read neighbouring
//     elements; then warp shuffles, and for block groups a shared-memory pass over the 8 warp
//     sums, combine the group's values.
//   outer: the kept dims hold the smallest strides (e.g. summing dim 0 of [K, M]): one thread
//     per output walks k serially while neighbouring threads read neighbouring outputs.
// When there are too few outputs to fill the GPU (fewer than 8 blocks per multiprocessor), K is
// cut into `splits` chunks along grid.y; each block writes a partial sum to scratch memory and a
// second launch of the same kernels reduces the partials. No atomics: results are deterministic
// for a given shape and GPU.
//
// Accuracy: inputs are accumulated in float (float32/16/bf16) or double (float64). Each thread's
// serial run is compensated (Kahan), so its error stays near one rounding however long the run;
// the tree that follows (5 levels of shuffles, 3 across warps, log2(splits) <= 10 in the second
// pass) adds at most one rounding per level. The error bound is therefore about
// (log2(threads per output x splits) + 2) x eps x sum|x| (eps = 2^-24 for float), i.e. a
// relative error below ~1.2e-6 of sum|x| for float, independent of K. Output to float16 or
// bfloat16 then rounds once more.
template <ReduceOp R, typename A>
struct Reducer;

template <typename A>
struct Reducer<ReduceOp::Sum, A> {
  static constexpr A kIdentity = A(0);
  __device__ static A combine(A a, A b) { return a + b; }
};
// (a > b || a != a) ? a : b keeps a NaN from either side, as the CPU's max does.
template <typename A>
struct Reducer<ReduceOp::Max, A> {
  static constexpr A kIdentity = -std::numeric_limits<A>::infinity();
  __device__ static A combine(A a, A b) { return (a > b || a != a) ? a : b; }
};
template <typename A>
struct Reducer<ReduceOp::Min, A> {
  static constexpr A kIdentity = std::numeric_limits<A>::infinity();
  __device__ static A combine(A a, A b) { return (a < b || a != a) ? a : b; }
};

// A thread's serial run: compensated for sums, plain for max/min (which round nothing).
template <ReduceOp R, typename A>
struct SerialAcc {
  A v = Reducer<R, A>::kIdentity;
  __device__ __forceinline__ void add(A x) { v = Reducer<R, A>::combine(v, x); }
  __device__ __forceinline__ A value() const { return v; }
};
template <typename A>
struct SerialAcc<ReduceOp::Sum, A> {
  A sum = A(0);
  A c = A(0);
  __device__ __forceinline__ void add(A x) {
    A y = x - c;
    A t = sum + y;
    // Once the sum is inf or NaN the compensation is meaningless (inf - inf); keep it zero so
    // that the result is the plain sum (inf, or NaN) as the CPU gives.
    c = isfinite(t) ? (t - sum) - y : A(0);
    sum = t;
  }
  // c holds what the last additions lost (negated), so subtracting it recovers the low part.
  __device__ __forceinline__ A value() const { return sum - c; }
};

template <ReduceOp R, typename A>
__device__ __forceinline__ A warp_reduce(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = Reducer<R, A>::combine(v, __shfl_down_sync(0xffffffffu, v, o));
  return v;
}

// The value stored for output m: sums are scaled (mean), max/min are stored as they are.
template <ReduceOp R, typename Out, typename A>
__device__ __forceinline__ Out finish(A v, double scale) {
  if constexpr (R == ReduceOp::Sum) return Elem<Out>::from_f64(double(v) * scale);
  else return Elem<Out>::from_f64(double(v));
}

__device__ __forceinline__ int64_t kept_offset(const ReduceShape& s, int64_t m) {
  int64_t off = 0;
#pragma unroll
  for (int d = kMaxDims - 1; d >= 1; --d) {
    if (d < s.out_rank) {
      int64_t q = m / s.out_sizes[d];
      off += (m - q * s.out_sizes[d]) * s.out_strides[d];
      m = q;
    }
  }
  return s.out_rank > 0 ? off + m * s.out_strides[0] : 0;
}
__device__ __forceinline__ int64_t reduced_offset(const ReduceShape& s, int64_t k) {
  int64_t off = 0;
#pragma unroll
  for (int d = kMaxDims - 1; d >= 1; --d) {
    if (d < s.red_rank) {
      int64_t q = k / s.red_sizes[d];
      off += (k - q * s.red_sizes[d]) * s.red_strides[d];
      k = q;
    }
  }
  return s.red_rank > 0 ? off + k * s.red_strides[0] : 0;
}

template <typename In, typename A>
__device__ __forceinline__ A to_acc(In v) {
  return A(Elem<In>::to_compute(v));
}

template <ReduceOp R, typename In, typename Out, typename A, int GROUP>
__global__ void __launch_bounds__(kThreads)
reduce_inner_kernel(ReduceShape s, int64_t chunk, int64_t splits, const In* __restrict__ in,
                 Out* __restrict__ out, A* __restrict__ partial, double scale) {
  static_assert(GROUP == 32 || GROUP == kThreads, "a group is a warp or the whole block");
  constexpr int kGroupsPerBlock = kThreads / GROUP;
  const int lane = int(threadIdx.x) % GROUP;
  const int64_t m = int64_t(blockIdx.x) * kGroupsPerBlock + int(threadIdx.x) / GROUP;
  const int64_t split = blockIdx.y;
  SerialAcc<R, A> acc;
  if (m < s.M) {
    const In* base = in + kept_offset(s, m);
    const int64_t k_end = min(s.K, (split + 1) * chunk);
    for (int64_t k = split * chunk + lane; k < k_end; k += GROUP)
      acc.add(to_acc<In, A>(base[reduced_offset(s, k)]));
  }
  // Every lane takes part in the shuffles, also those of groups past the last output.
  A v = warp_reduce<R>(acc.value());
  if constexpr (GROUP == kThreads) {
    __shared__ A warp_vals[kThreads / 32];
    if (threadIdx.x % 32 == 0) warp_vals[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32)
      v = warp_reduce<R>(threadIdx.x < kThreads / 32 ? warp_vals[threadIdx.x]
                                                     : Reducer<R, A>::kIdentity);
  }
  if (lane == 0 && m < s.M) {
    if (splits == 1) out[m] = finish<R, Out>(v, scale);
    else partial[m * splits + split] = v;
  }
}

template <ReduceOp R, typename In, typename Out, typename A>
__global__ void __launch_bounds__(kThreads)
reduce_outer_kernel(ReduceShape s, int64_t chunk, int64_t splits, const In* __restrict__ in,
                 Out* __restrict__ out, A* __restrict__ partial, double scale) {
  const int64_t m = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (m >= s.M) return;
  const int64_t split = blockIdx.y;
  const In* base = in + kept_offset(s, m);
  SerialAcc<R, A> acc;
  const int64_t k_end = min(s.K, (split + 1) * chunk);
  for (int64_t k = split * chunk; k < k_end; ++k) acc.add(to_acc<In, A>(base[reduced_offset(s, k)]));
  if (splits == 1) out[m] = finish<R, Out>(acc.value(), scale);
  else partial[split * s.M + m] = acc.value();
}

}  // namespace

// ---- launch functions ------------------------------------------------------------------------
int set_device(int index) { return int(cudaSetDevice(index)); }
int synchronize() { return int(cudaDeviceSynchronize()); }

int multiprocessor_count(int device) {
  static std::atomic<int> cache[64] = {};
  if (device < 0 || device >= 64) return 0;
  int n = cache[device].load(std::memory_order_relaxed);
  if (n > 0) return n;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  cache[device].store(n, std::memory_order_relaxed);
  return n;
}

int launch_convert(const ElementwiseShape& shape, const void* src, ScalarKind src_kind, void* dst,
                   ScalarKind dst_kind) {
  if (shape.numel == 0) return 0;
  return visit_kind(src_kind, [&](auto stag) {
    using S = typename decltype(stag)::type;
    return visit_kind(dst_kind, [&](auto dtag) {
      using D = typename decltype(dtag)::type;
      convert_kernel<S, D><<<grid_for(shape.numel), kThreads>>>(
          shape, static_cast<const S*>(src), static_cast<D*>(dst));
      return int(cudaGetLastError());
    });
  });
}

int launch_unary(UnaryOp op, const ElementwiseShape& shape, const void* x, void* out,
                 ScalarKind kind) {
  if (shape.numel == 0) return 0;
  return visit_kind(kind, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return visit_unary_op(op, [&](auto opc) {
      constexpr UnaryOp OP = decltype(opc)::value;
      if constexpr (is_float_elem<T> || (is_arith_int<T> && unary_supports_ints(OP))) {
        unary_kernel<T, OP><<<grid_for(shape.numel), kThreads>>>(
            shape, static_cast<const T*>(x), static_cast<T*>(out));
        return int(cudaGetLastError());
      } else {
        return kUnsupportedKind;
      }
    });
  });
}

int launch_binary(BinaryOp op, const ElementwiseShape& shape, const void* a, const void* b,
                  void* out, ScalarKind kind) {
  if (shape.numel == 0) return 0;
  return visit_kind(kind, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return visit_binary_op(op, [&](auto opc) {
      constexpr BinaryOp OP = decltype(opc)::value;
      if constexpr (is_float_elem<T> || (is_arith_int<T> && OP != BinaryOp::Div)) {
        binary_kernel<T, OP><<<grid_for(shape.numel), kThreads>>>(
            shape, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out));
        return int(cudaGetLastError());
      } else {
        return kUnsupportedKind;
      }
    });
  });
}

ReducePlan plan_reduce(const ReduceShape& s, ScalarKind kind, int device) {
  ReducePlan p;
  p.double_acc = kind == ScalarKind::F64;
  int sms = multiprocessor_count(device);
  // 8 resident 256-thread blocks fill a multiprocessor's 2048 threads.
  const int64_t target_blocks = int64_t(sms > 0 ? sms : 32) * 8;
  int64_t min_red = INT64_MAX, min_kept = INT64_MAX;
  for (int d = 0; d < s.red_rank; ++d)
    if (s.red_sizes[d] > 1) min_red = std::min(min_red, std::abs(s.red_strides[d]));
  for (int d = 0; d < s.out_rank; ++d)
    if (s.out_sizes[d] > 1) min_kept = std::min(min_kept, std::abs(s.out_strides[d]));
  p.inner = s.M == 1 || min_red < min_kept;
  int64_t blocks, min_per_split;
  if (p.inner) {
    p.group = s.K >= 1024 ? kThreads : 32;
    blocks = ceil_div(s.M, kThreads / p.group);
    min_per_split = int64_t(p.group) * 16;  // keep >= 16 elements per thread in each chunk
  } else {
    blocks = ceil_div(s.M, kThreads);
    min_per_split = 64;
  }
  p.splits = 1;
  if (blocks < target_blocks && s.K > 2 * min_per_split)
    p.splits = std::min({ceil_div(target_blocks, blocks), ceil_div(s.K, min_per_split), kMaxSplits});
  p.chunk = p.splits > 1 ? ceil_div(s.K, p.splits) : s.K;
  if (p.splits > 1) p.splits = ceil_div(s.K, p.chunk);  // no empty trailing chunk
  p.partial_elems = p.splits > 1 ? s.M * p.splits : 0;
  return p;
}

template <ReduceOp R>
int launch_reduce_op(const ReduceShape& s, const ReducePlan& p, const void* in, void* out,
                     ScalarKind kind, void* partial, double scale) {
  return visit_kind(kind, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (!is_float_elem<T>) {
      return kUnsupportedKind;
    } else {
      using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
      const T* x = static_cast<const T*>(in);
      T* y = static_cast<T*>(out);
      A* part = static_cast<A*>(partial);
      const unsigned grid_y = unsigned(p.splits);
      if (p.inner) {
        dim3 grid(unsigned(ceil_div(s.M, kThreads / p.group)), grid_y);
        if (p.group == kThreads)
          reduce_inner_kernel<R, T, T, A, kThreads><<<grid, kThreads>>>(s, p.chunk, p.splits, x, y, part, scale);
        else
          reduce_inner_kernel<R, T, T, A, 32><<<grid, kThreads>>>(s, p.chunk, p.splits, x, y, part, scale);
        if (cudaError_t e = cudaGetLastError(); e != cudaSuccess || p.splits == 1) return int(e);
        // partial is [M, splits]: an inner reduction of rows of `splits` accumulators.
        ReduceShape s2;
        s2.out_rank = 1, s2.out_sizes[0] = s.M, s2.out_strides[0] = p.splits;
        s2.red_rank = 1, s2.red_sizes[0] = p.splits, s2.red_strides[0] = 1;
        s2.M = s.M, s2.K = p.splits;
        reduce_inner_kernel<R, A, T, A, 32><<<unsigned(ceil_div(s.M, kThreads / 32)), kThreads>>>(
            s2, p.splits, 1, part, y, nullptr, scale);
      } else {
        dim3 grid(unsigned(ceil_div(s.M, kThreads)), grid_y);
        reduce_outer_kernel<R, T, T, A><<<grid, kThreads>>>(s, p.chunk, p.splits, x, y, part, scale);
        if (cudaError_t e = cudaGetLastError(); e != cudaSuccess || p.splits == 1) return int(e);
        // partial is [splits, M]: an outer reduction down its columns.
        ReduceShape s2;
        s2.out_rank = 1, s2.out_sizes[0] = s.M, s2.out_strides[0] = 1;
        s2.red_rank = 1, s2.red_sizes[0] = p.splits, s2.red_strides[0] = s.M;
        s2.M = s.M, s2.K = p.splits;
        reduce_outer_kernel<R, A, T, A><<<unsigned(ceil_div(s.M, kThreads)), kThreads>>>(
            s2, p.splits, 1, part, y, nullptr, scale);
      }
      return int(cudaGetLastError());
    }
  });
}

int launch_reduce(ReduceOp op, const ReduceShape& s, const ReducePlan& p, const void* in,
                  void* out, ScalarKind kind, void* partial, double scale) {
  if (s.M == 0) return 0;
  if (p.splits > 1 && !partial) return kUnsupportedKind;
  switch (op) {
    case ReduceOp::Sum: return launch_reduce_op<ReduceOp::Sum>(s, p, in, out, kind, partial, scale);
    case ReduceOp::Max: return launch_reduce_op<ReduceOp::Max>(s, p, in, out, kind, partial, scale);
    case ReduceOp::Min: return launch_reduce_op<ReduceOp::Min>(s, p, in, out, kind, partial, scale);
  }
  return kUnsupportedKind;
}

}  // namespace kiln::cuda_eager
