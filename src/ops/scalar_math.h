// Note [Scalar math]
// The scalar loop body of every pointwise op, written once and shared by everything that
// computes an op element by element below float64: the CPU target's generated code (this file
// is embedded, as text, at the top of every generated translation unit), the CPU eager kernels,
// and the CUDA eager kernels and generated CUDA code (compiled for the device). The float64
// reference kernels of the op records are written independently (they are the oracle), and
// tests/unit/scalar_math_test.cc checks every function here against them on fresh values
// including NaN, infinities, -0 and denormals.
//
// Semantics (Kiln's, the same on every path):
//   - max / min / relu / clamp / sign propagate NaN (a NaN operand gives NaN);
//   - integer arithmetic wraps (two's complement), as int64 with the stored type's truncation;
//   - float -> integer casts saturate, NaN -> 0 (kn_sat);
//   - bf16 / f16 values are rounded to nearest even after every op that produces one
//     (kn_rbf16 / kn_rf16); f16 overflow gives infinity, NaN stays NaN.
//
// Portability: plain C++17 over C math functions (expf, erff, ...), which the host's <math.h>,
// CUDA's device math library and NVRTC all provide. The includer supplies int64_t, int32_t,
// int8_t, uint8_t, uint16_t, uint32_t and uint64_t (host: <cstdint>), and on the host
// <math.h> and <cstring>. Functions are `KN_FN` (static inline on the host,
// static __device__ __forceinline__ when compiled as CUDA).
#ifndef KILN_SCALAR_MATH_H_
#define KILN_SCALAR_MATH_H_

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define KN_FN static __device__ __forceinline__
#define KN_DEVICE 1
#else
#define KN_FN static inline
#endif

typedef int64_t i64;
typedef uint16_t u16;

// ---- bit casts and storage conversions ----
KN_FN uint32_t kn_f32_bits(float f) {
#ifdef KN_DEVICE
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}
KN_FN float kn_bits_f32(uint32_t u) {
#ifdef KN_DEVICE
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}
KN_FN float kn_bf16_f32(u16 h) { return kn_bits_f32(uint32_t(h) << 16); }
KN_FN u16 kn_f32_bf16(float f) {
  uint32_t u = kn_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return u16((u >> 16) | 0x40u);  // NaN stays (quiet) NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                       // round to nearest even
  return u16(u >> 16);
}
KN_FN float kn_f16_f32(u16 h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, out;
  if (exp == 0) {
    if (mant == 0) return kn_bits_f32(sign);
    out = kn_f32_bits(float(mant) * (1.0f / 16777216.0f)) | sign;  // subnormal: mant * 2^-24
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  return kn_bits_f32(out);
}
KN_FN u16 kn_f32_f16(float f) {
  uint32_t x = kn_f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u, absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return u16(sign | 0x7e00u);  // NaN
  if (absx >= 0x477ff000u) return u16(sign | 0x7c00u);  // rounds past 65504: infinity
  if (absx < 0x38800000u)                               // subnormal (or zero) in f16
    return u16(sign | uint32_t(nearbyintf(kn_bits_f32(absx) * 16777216.0f)));
  uint32_t exp = (absx >> 23) - 127 + 15, mant = absx & 0x7fffffu, h = (exp << 10) | (mant >> 13),
           rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h += 1;
  return u16(sign | h);
}
KN_FN float kn_rbf16(float x) { return kn_bf16_f32(kn_f32_bf16(x)); }
KN_FN float kn_rf16(float x) { return kn_f16_f32(kn_f32_f16(x)); }

// Float -> integer with saturation, NaN -> 0 (Tensor::copy_'s rule).
template <typename T> struct kn_int_limits;
template <> struct kn_int_limits<int64_t> {
  static constexpr int64_t lo = -9223372036854775807LL - 1, hi = 9223372036854775807LL;
};
template <> struct kn_int_limits<int32_t> { static constexpr int32_t lo = -2147483647 - 1, hi = 2147483647; };
template <> struct kn_int_limits<int8_t> { static constexpr int8_t lo = -128, hi = 127; };
template <> struct kn_int_limits<uint8_t> { static constexpr uint8_t lo = 0, hi = 255; };
template <typename T> KN_FN T kn_sat(double v) {
  if (v != v) return T(0);
  if (v <= double(kn_int_limits<T>::lo)) return kn_int_limits<T>::lo;
  if (v >= double(kn_int_limits<T>::hi)) return kn_int_limits<T>::hi;
  return T(v);
}

// ---- unary ops (float, double) ----
#define KN_UNARY(name, fexpr, dexpr)        \
  KN_FN float name(float x) { return fexpr; } \
  KN_FN double name(double x) { return dexpr; }
KN_UNARY(kn_exp, expf(x), exp(x))
KN_UNARY(kn_log, logf(x), log(x))
KN_UNARY(kn_sqrt, sqrtf(x), sqrt(x))
KN_UNARY(kn_rsqrt, 1.0f / sqrtf(x), 1.0 / sqrt(x))
KN_UNARY(kn_recip, 1.0f / x, 1.0 / x)
KN_UNARY(kn_sigmoid, 1.0f / (1.0f + expf(-x)), 1.0 / (1.0 + exp(-x)))
KN_UNARY(kn_tanh, tanhf(x), tanh(x))
KN_UNARY(kn_erf, erff(x), erf(x))
KN_UNARY(kn_sin, sinf(x), sin(x))
KN_UNARY(kn_cos, cosf(x), cos(x))
KN_UNARY(kn_silu, x / (1.0f + expf(-x)), x / (1.0 + exp(-x)))
KN_UNARY(kn_gelu, 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)),
         0.5 * x * (1.0 + erf(x * 0.70710678118654752)))
KN_UNARY(kn_gelu_tanh, 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))),
         0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))))
KN_UNARY(kn_floor, floorf(x), floor(x))
KN_UNARY(kn_ceil, ceilf(x), ceil(x))
KN_UNARY(kn_round, nearbyintf(x), nearbyint(x))  // half to even
KN_UNARY(kn_neg, -x, -x)
KN_UNARY(kn_abs, fabsf(x), fabs(x))
KN_UNARY(kn_relu, x > 0.0f ? x : (x != x ? x : 0.0f), x > 0.0 ? x : (x != x ? x : 0.0))
KN_UNARY(kn_sign, x != x ? x : float((x > 0) - (x < 0)), x != x ? x : double((x > 0) - (x < 0)))
#undef KN_UNARY

// ---- integer ops (wrapping, as int64) ----
KN_FN i64 kn_wrap_add(i64 a, i64 b) { return i64(uint64_t(a) + uint64_t(b)); }
KN_FN i64 kn_wrap_sub(i64 a, i64 b) { return i64(uint64_t(a) - uint64_t(b)); }
KN_FN i64 kn_wrap_mul(i64 a, i64 b) { return i64(uint64_t(a) * uint64_t(b)); }
KN_FN i64 kn_neg(i64 x) { return kn_wrap_sub(0, x); }
KN_FN i64 kn_abs(i64 x) { return x < 0 ? kn_wrap_sub(0, x) : x; }
KN_FN i64 kn_relu(i64 x) { return x > 0 ? x : 0; }
KN_FN i64 kn_sign(i64 x) { return (x > 0) - (x < 0); }
KN_FN i64 kn_floor(i64 x) { return x; }
KN_FN i64 kn_ceil(i64 x) { return x; }
KN_FN i64 kn_round(i64 x) { return x; }

// ---- binary ops ----
template <typename T> KN_FN T kn_add(T a, T b) { return a + b; }
template <typename T> KN_FN T kn_sub(T a, T b) { return a - b; }
template <typename T> KN_FN T kn_mul(T a, T b) { return a * b; }
KN_FN i64 kn_add(i64 a, i64 b) { return kn_wrap_add(a, b); }
KN_FN i64 kn_sub(i64 a, i64 b) { return kn_wrap_sub(a, b); }
KN_FN i64 kn_mul(i64 a, i64 b) { return kn_wrap_mul(a, b); }
template <typename T> KN_FN T kn_div(T a, T b) { return a / b; }
KN_FN float kn_pow(float a, float b) { return powf(a, b); }
KN_FN double kn_pow(double a, double b) { return pow(a, b); }
template <typename T> KN_FN T kn_max(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T> KN_FN T kn_min(T a, T b) { return (a < b || a != a) ? a : b; }

#endif  // KILN_SCALAR_MATH_H_
