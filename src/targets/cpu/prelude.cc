// The text every generated CPU translation unit starts with: the includes, the shared scalar
// math of every op (src/ops/scalar_math.h, embedded as text: NaN-propagating max/min/relu/clamp,
// wrapping integer arithmetic, saturating casts, bf16/f16 rounding to nearest even), and a
// small vector type VF over AVX-512
// (16 lanes) or AVX2 (8 lanes) whose transcendental functions call SLEEF (exp and tanh over
// AVX-512 are inline: Note [vector exp]). Generated kernels are
// written against these names only, so the same kernel source compiles for either ISA (the ISA
// is part of the code cache key).
#include "targets/cpu/prelude.h"

#include <string>

#include "ops/scalar_math_text.h"

namespace kiln::cpu {

namespace {

const char* const kHead = R"KILN(// ---- Kiln generated code: prelude ----
#include <cstdint>
#include <cstring>
#include <cmath>
#include <limits>
#include <omp.h>
#include <dlfcn.h>
// Note [one-thread parallel regions]: libgomp allocates a team (memalign) for every parallel
// region it runs on one thread, `if` clause false or num_threads(1), and frees it at the end
// (it keeps teams of two threads and more for the next region). A kernel called with one
// thread would allocate on every call. So the unit defines GOMP_parallel, the entry point that
// GCC's `omp parallel` calls, hidden (this unit's calls bind to it, no one else's): one thread
// runs the region's body directly, as an inactive region runs it (omp_get_thread_num() 0,
// omp_get_num_threads() 1, barriers and static schedules of a team of one); more threads go to
// libgomp's, found when the unit is loaded (were it not found, every region would run on the
// calling thread: slower, the same results).
extern "C" {
typedef void (*kn_gomp_parallel_fn)(void (*)(void*), void*, unsigned, unsigned);
static kn_gomp_parallel_fn kn_gomp_parallel;
__attribute__((constructor)) static void kn_find_gomp_parallel() {
  kn_gomp_parallel = reinterpret_cast<kn_gomp_parallel_fn>(dlsym(RTLD_NEXT, "GOMP_parallel"));
}
__attribute__((visibility("hidden"))) void GOMP_parallel(void (*fn)(void*), void* data,
                                                         unsigned num_threads, unsigned flags) {
  if (num_threads == 1 || !kn_gomp_parallel) {
    fn(data);
    return;
  }
  kn_gomp_parallel(fn, data, num_threads, flags);
}
}
// KN_VEC256 (defined before the prelude by CpuCodegenOptions::vector_bits = 256) keeps the
// kernels at 8-lane AVX2 vectors on an AVX-512 machine; max-autotune times both widths.
#if defined(__AVX512F__) && !defined(KN_VEC256)
#define KN_AVX512 1
#endif
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
// The SLEEF functions used below, declared here rather than through <sleef.h> (which costs
// ~0.1 s of parsing in every generated unit); they link against libsleef (-lsleef).
extern "C" {
#if defined(KN_AVX512)
__m512 Sleef_logf16_u10(__m512);
__m512 Sleef_erff16_u10(__m512); __m512 Sleef_sinf16_u10(__m512); __m512 Sleef_cosf16_u10(__m512);
__m512 Sleef_powf16_u10(__m512, __m512);
#else
__m256 Sleef_expf8_u10(__m256); __m256 Sleef_logf8_u10(__m256); __m256 Sleef_tanhf8_u10(__m256);
__m256 Sleef_erff8_u10(__m256); __m256 Sleef_sinf8_u10(__m256); __m256 Sleef_cosf8_u10(__m256);
__m256 Sleef_powf8_u10(__m256, __m256);
#endif
}
#endif
)KILN";

const char* const kVectors = R"KILN(// ---- vectors ----
#if defined(KN_AVX512)
#define KN_W 16
struct VF { __m512 v; };
static inline VF vset(float x) { return {_mm512_set1_ps(x)}; }
static inline VF vld(const float* p) { return {_mm512_loadu_ps(p)}; }
static inline void vst(float* p, VF a) { _mm512_storeu_ps(p, a.v); }
static inline VF vld_bf16(const u16* p) {
  __m256i h = _mm256_loadu_si256((const __m256i*)p);
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
}
static inline __m512i kn_bf16_bits(VF a) {
  __m512i u = _mm512_castps_si512(a.v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  __mmask16 nan = _mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q);
  __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_mask_blend_epi32(nan, r, q);
}
static inline void vst_bf16(u16* p, VF a) { _mm256_storeu_si256((__m256i*)p, _mm512_cvtepi32_epi16(kn_bf16_bits(a))); }
static inline VF vrbf16(VF a) { return {_mm512_castsi512_ps(_mm512_slli_epi32(kn_bf16_bits(a), 16))}; }
static inline VF operator+(VF a, VF b) { return {_mm512_add_ps(a.v, b.v)}; }
static inline VF operator-(VF a, VF b) { return {_mm512_sub_ps(a.v, b.v)}; }
static inline VF operator*(VF a, VF b) { return {_mm512_mul_ps(a.v, b.v)}; }
static inline VF operator/(VF a, VF b) { return {_mm512_div_ps(a.v, b.v)}; }
#define KN_CMP(name, pred) static inline VF name(VF a, VF b) { return {_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a.v, b.v, pred), _mm512_set1_ps(1.0f))}; }
static inline VF vsel(VF c, VF a, VF b) { return {_mm512_mask_blend_ps(_mm512_cmp_ps_mask(c.v, _mm512_setzero_ps(), _CMP_NEQ_UQ), b.v, a.v)}; }
// Note [vector exp]: exp(a) = 2^n * exp(r), n = round(a / ln 2), r = a - n ln 2 in two parts
// (Cody and Waite), exp(r) = 1 + r + r^2 p(r) with Cephes' degree-5 coefficients for p, and
// 2^n applied by scalef, which also rounds subnormal results and overflows to inf. Within
// 1.23 ulp of exp over float's range (SLEEF's u10: 0.97), NaN stays NaN (max/min return their
// second operand for a NaN, so a is second), -inf gives 0 and +inf gives inf (the clamp keeps
// r finite). Inline, it costs ~0.33 ns per element where the call to Sleef_expf16_u10 cost
// ~0.59; softmax, sigmoid and SiLU pay it per element.
static inline VF vexp(VF a) {
  const __m512 x = _mm512_min_ps(_mm512_set1_ps(88.8f), _mm512_max_ps(_mm512_set1_ps(-104.0f), a.v));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return {_mm512_scalef_ps(p, n)};
}
static inline VF vlog(VF a) { return {Sleef_logf16_u10(a.v)}; }
static inline VF verf(VF a) { return {Sleef_erff16_u10(a.v)}; }
static inline VF vsin(VF a) { return {Sleef_sinf16_u10(a.v)}; }
static inline VF vcos(VF a) { return {Sleef_cosf16_u10(a.v)}; }
static inline VF vpow(VF a, VF b) { return {Sleef_powf16_u10(a.v, b.v)}; }
static inline VF vsqrt(VF a) { return {_mm512_sqrt_ps(a.v)}; }
static inline VF vfloor(VF a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)}; }
static inline VF vceil(VF a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC)}; }
static inline VF vround(VF a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
static inline float vsum(VF a) { return _mm512_reduce_add_ps(a.v); }
// Note [vector exp], for tanh: |a| >= 0.625 as 1 - 2 / (exp(2|a|) + 1) with a's sign; below, the
// odd polynomial a + a^3 p(a^2) with Cephes' coefficients (the subtraction would lose a small
// a's digits). Within 1.33 ulp of tanh over float's range (SLEEF's u10: 1.0); NaN stays NaN,
// +-inf give +-1, -0 stays -0. ~0.42 ns per element, where the call to Sleef_tanhf16_u10 cost
// ~1.57: GRU and LSTM gates pay it per element.
static inline VF vtanh(VF a) {
  const __m512 ax = _mm512_abs_ps(a.v), sign = _mm512_and_ps(a.v, _mm512_set1_ps(-0.0f));
  const __m512 e = vexp(VF{_mm512_add_ps(ax, ax)}).v;
  const __m512 big = _mm512_sub_ps(_mm512_set1_ps(1.0f), _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
  const __m512 z = _mm512_mul_ps(a.v, a.v);
  __m512 p = _mm512_set1_ps(-5.70498872745e-3f);
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036e-1f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422e-1f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), a.v, a.v);
  const __m512 r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_GE_OQ), small, big);
  return {_mm512_or_ps(r, sign)};
}
// max/min that return a when a > b (a < b) or a is NaN, as kn_max/kn_min: one mask, one blend.
static inline VF vmax(VF a, VF b) {
  return {_mm512_mask_blend_ps(_mm512_cmp_ps_mask(a.v, b.v, _CMP_GT_OQ) | _mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q), b.v, a.v)};
}
static inline VF vmin(VF a, VF b) {
  return {_mm512_mask_blend_ps(_mm512_cmp_ps_mask(a.v, b.v, _CMP_LT_OQ) | _mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q), b.v, a.v)};
}
// relu keeps NaN (NLE_UQ: greater than 0 or unordered); clamp's compares are false for NaN.
static inline VF vrelu(VF a) { return {_mm512_mask_blend_ps(_mm512_cmp_ps_mask(a.v, _mm512_setzero_ps(), _CMP_NLE_UQ), _mm512_setzero_ps(), a.v)}; }
static inline VF vclamp(VF a, bool has_lo, float lo, bool has_hi, float hi) {
  __m512 r = a.v;
  if (has_lo) r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(r, _mm512_set1_ps(lo), _CMP_LT_OQ), r, _mm512_set1_ps(lo));
  if (has_hi) r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(r, _mm512_set1_ps(hi), _CMP_GT_OQ), r, _mm512_set1_ps(hi));
  return {r};
}
// The lanes combined pairwise by f (vmax, vmin) in halving steps; the result is lane 0's.
template <typename F> static inline float kn_lanes(VF a, F f) {
  a = f(a, VF{_mm512_shuffle_f32x4(a.v, a.v, 0x4E)});
  a = f(a, VF{_mm512_shuffle_f32x4(a.v, a.v, 0xB1)});
  a = f(a, VF{_mm512_permute_ps(a.v, 0x4E)});
  return _mm512_cvtss_f32(f(a, VF{_mm512_permute_ps(a.v, 0xB1)}).v);
}
// Note [grid_sample tap tables] (emitter.cc): integral floats stored as int32; KN_W floats
// loaded when c is 1, zeros (nothing read) when 0; a tap of KN_W points, base[idx[l]] where
// ok[l] has `bit` (masked-off lanes read nothing); NaN where ok[l] has 16.
static inline void vst_i32(int* p, VF a) { _mm512_storeu_si512((void*)p, _mm512_cvttps_epi32(a.v)); }
static inline VF vld_if(int c, const float* p) { return {_mm512_maskz_loadu_ps((__mmask16)(-c), p)}; }
// Note [flattened lanes] (emitter.cc): lane l reads base[offs[l]]; lanes 0-7 from p, 8-15 from p + j.
static inline VF vgather(const float* base, const int* offs) {
  return {_mm512_i32gather_ps(_mm512_loadu_si512((const void*)offs), base, 4)};
}
static inline VF vld_runs8(const float* p, i64 j) {
  // (insertf64x4 on the bits: AVX-512F alone, where insertf32x8 needs AVX-512DQ)
  const __m512d lo = _mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(p)));
  return {_mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(_mm256_loadu_ps(p + j)), 1))};
}
static inline VF vgather_tap(const float* base, const int* idx, const int* ok, int bit) {
  const __mmask16 m = _mm512_test_epi32_mask(_mm512_loadu_si512((const void*)ok), _mm512_set1_epi32(bit));
  return {_mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, _mm512_loadu_si512((const void*)idx), base, 4)};
}
static inline VF vnan_where(VF a, const int* ok) {
  const __mmask16 m = _mm512_test_epi32_mask(_mm512_loadu_si512((const void*)ok), _mm512_set1_epi32(16));
  return {_mm512_mask_blend_ps(m, a.v, _mm512_set1_ps(NAN))};
}
// Note [tiled transposes] (emitter.cc): d[i * ds + j] = s[j * ss + i] for a 16 x 16 tile of
// floats, through registers (16 loads, 64 shuffles, 16 stores).
static inline void kn_transpose16(const float* s, i64 ss, float* d, i64 ds) {
  __m512 r[16], t[16];
  for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_ps(s + j * ss);
  for (int j = 0; j < 16; j += 2) {
    t[j] = _mm512_unpacklo_ps(r[j], r[j + 1]);
    t[j + 1] = _mm512_unpackhi_ps(r[j], r[j + 1]);
  }
  for (int j = 0; j < 16; j += 4) {
    r[j] = _mm512_shuffle_ps(t[j], t[j + 2], 0x44);
    r[j + 1] = _mm512_shuffle_ps(t[j], t[j + 2], 0xEE);
    r[j + 2] = _mm512_shuffle_ps(t[j + 1], t[j + 3], 0x44);
    r[j + 3] = _mm512_shuffle_ps(t[j + 1], t[j + 3], 0xEE);
  }
  // r[4k + m], 128-bit lane L: rows 4k..4k+3 of column 4L + m.
  for (int m = 0; m < 4; ++m) {
    t[m] = _mm512_shuffle_f32x4(r[m], r[4 + m], 0x88);
    t[4 + m] = _mm512_shuffle_f32x4(r[m], r[4 + m], 0xDD);
    t[8 + m] = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0x88);
    t[12 + m] = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0xDD);
  }
  for (int m = 0; m < 4; ++m) {
    r[m] = _mm512_shuffle_f32x4(t[m], t[8 + m], 0x88);
    r[8 + m] = _mm512_shuffle_f32x4(t[m], t[8 + m], 0xDD);
    r[4 + m] = _mm512_shuffle_f32x4(t[4 + m], t[12 + m], 0x88);
    r[12 + m] = _mm512_shuffle_f32x4(t[4 + m], t[12 + m], 0xDD);
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(d + i * ds, r[i]);
}
// A KN_W x KN_W tile: Note [grid_sample channels-last] (emitter.cc).
static inline void kn_transpose_w(const float* s, i64 ss, float* d, i64 ds) { kn_transpose16(s, ss, d, ds); }
#elif defined(__AVX2__)
#define KN_W 8
struct VF { __m256 v; };
static inline VF vset(float x) { return {_mm256_set1_ps(x)}; }
static inline VF vld(const float* p) { return {_mm256_loadu_ps(p)}; }
static inline void vst(float* p, VF a) { _mm256_storeu_ps(p, a.v); }
static inline VF vld_bf16(const u16* p) {
  __m128i h = _mm_loadu_si128((const __m128i*)p);
  return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))};
}
static inline __m256i kn_bf16_bits(VF a) {
  __m256i u = _mm256_castps_si256(a.v);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  __m256 nan = _mm256_cmp_ps(a.v, a.v, _CMP_UNORD_Q);
  __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(q), nan));
}
static inline void vst_bf16(u16* p, VF a) {
  __m256i b = kn_bf16_bits(a);
  __m128i lo = _mm256_castsi256_si128(b), hi = _mm256_extracti128_si256(b, 1);
  _mm_storeu_si128((__m128i*)p, _mm_packus_epi32(lo, hi));
}
static inline VF vrbf16(VF a) { return {_mm256_castsi256_ps(_mm256_slli_epi32(kn_bf16_bits(a), 16))}; }
static inline VF operator+(VF a, VF b) { return {_mm256_add_ps(a.v, b.v)}; }
static inline VF operator-(VF a, VF b) { return {_mm256_sub_ps(a.v, b.v)}; }
static inline VF operator*(VF a, VF b) { return {_mm256_mul_ps(a.v, b.v)}; }
static inline VF operator/(VF a, VF b) { return {_mm256_div_ps(a.v, b.v)}; }
#define KN_CMP(name, pred) static inline VF name(VF a, VF b) { return {_mm256_and_ps(_mm256_cmp_ps(a.v, b.v, pred), _mm256_set1_ps(1.0f))}; }
static inline VF vsel(VF c, VF a, VF b) { return {_mm256_blendv_ps(b.v, a.v, _mm256_cmp_ps(c.v, _mm256_setzero_ps(), _CMP_NEQ_UQ))}; }
static inline VF vexp(VF a) { return {Sleef_expf8_u10(a.v)}; }
static inline VF vlog(VF a) { return {Sleef_logf8_u10(a.v)}; }
static inline VF vtanh(VF a) { return {Sleef_tanhf8_u10(a.v)}; }
static inline VF verf(VF a) { return {Sleef_erff8_u10(a.v)}; }
static inline VF vsin(VF a) { return {Sleef_sinf8_u10(a.v)}; }
static inline VF vcos(VF a) { return {Sleef_cosf8_u10(a.v)}; }
static inline VF vpow(VF a, VF b) { return {Sleef_powf8_u10(a.v, b.v)}; }
static inline VF vsqrt(VF a) { return {_mm256_sqrt_ps(a.v)}; }
static inline VF vfloor(VF a) { return {_mm256_round_ps(a.v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)}; }
static inline VF vceil(VF a) { return {_mm256_round_ps(a.v, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC)}; }
static inline VF vround(VF a) { return {_mm256_round_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
static inline float vsum(VF a) { float t[8]; _mm256_storeu_ps(t, a.v); float s = 0; for (int i = 0; i < 8; ++i) s += t[i]; return s; }
static inline VF vmax(VF a, VF b) {
  return {_mm256_blendv_ps(b.v, a.v, _mm256_or_ps(_mm256_cmp_ps(a.v, b.v, _CMP_GT_OQ), _mm256_cmp_ps(a.v, a.v, _CMP_UNORD_Q)))};
}
static inline VF vmin(VF a, VF b) {
  return {_mm256_blendv_ps(b.v, a.v, _mm256_or_ps(_mm256_cmp_ps(a.v, b.v, _CMP_LT_OQ), _mm256_cmp_ps(a.v, a.v, _CMP_UNORD_Q)))};
}
static inline VF vrelu(VF a) { return {_mm256_blendv_ps(_mm256_setzero_ps(), a.v, _mm256_cmp_ps(a.v, _mm256_setzero_ps(), _CMP_NLE_UQ))}; }
static inline VF vclamp(VF a, bool has_lo, float lo, bool has_hi, float hi) {
  __m256 r = a.v;
  if (has_lo) r = _mm256_blendv_ps(r, _mm256_set1_ps(lo), _mm256_cmp_ps(r, _mm256_set1_ps(lo), _CMP_LT_OQ));
  if (has_hi) r = _mm256_blendv_ps(r, _mm256_set1_ps(hi), _mm256_cmp_ps(r, _mm256_set1_ps(hi), _CMP_GT_OQ));
  return {r};
}
template <typename F> static inline float kn_lanes(VF a, F f) {
  a = f(a, VF{_mm256_permute2f128_ps(a.v, a.v, 1)});
  a = f(a, VF{_mm256_permute_ps(a.v, 0x4E)});
  return _mm256_cvtss_f32(f(a, VF{_mm256_permute_ps(a.v, 0xB1)}).v);
}
// An 8 x 8 tile: d[i * ds + j] = s[j * ss + i]; kn_transpose16 is four of them.
static inline void kn_transpose8(const float* s, i64 ss, float* d, i64 ds) {
  __m256 r[8], t[8];
  for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(s + j * ss);
  for (int j = 0; j < 8; j += 2) {
    t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
    t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
  }
  for (int j = 0; j < 8; j += 4) {
    r[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44);
    r[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xEE);
    r[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44);
    r[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xEE);
  }
  for (int m = 0; m < 4; ++m) {
    t[m] = _mm256_permute2f128_ps(r[m], r[4 + m], 0x20);
    t[4 + m] = _mm256_permute2f128_ps(r[m], r[4 + m], 0x31);
  }
  for (int i = 0; i < 8; ++i) _mm256_storeu_ps(d + i * ds, t[i]);
}
static inline void kn_transpose16(const float* s, i64 ss, float* d, i64 ds) {
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b) kn_transpose8(s + a * 8 * ss + b * 8, ss, d + b * 8 * ds + a * 8, ds);
}
static inline void kn_transpose_w(const float* s, i64 ss, float* d, i64 ds) { kn_transpose8(s, ss, d, ds); }
static inline void vst_i32(int* p, VF a) { _mm256_storeu_si256((__m256i*)p, _mm256_cvttps_epi32(a.v)); }
static inline VF vld_if(int c, const float* p) { return {_mm256_maskload_ps(p, _mm256_set1_epi32(-c))}; }
static inline VF vgather(const float* base, const int* offs) {
  return {_mm256_i32gather_ps(base, _mm256_loadu_si256((const __m256i*)offs), 4)};
}
static inline VF vld_runs8(const float* p, i64) { return {_mm256_loadu_ps(p)}; }
static inline VF vgather_tap(const float* base, const int* idx, const int* ok, int bit) {
  const __m256i b = _mm256_set1_epi32(bit);
  const __m256i m = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_loadu_si256((const __m256i*)ok), b), b);
  return {_mm256_mask_i32gather_ps(_mm256_setzero_ps(), base, _mm256_loadu_si256((const __m256i*)idx), _mm256_castsi256_ps(m), 4)};
}
static inline VF vnan_where(VF a, const int* ok) {
  const __m256i b = _mm256_set1_epi32(16);
  const __m256i m = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_loadu_si256((const __m256i*)ok), b), b);
  return {_mm256_blendv_ps(a.v, _mm256_set1_ps(NAN), _mm256_castsi256_ps(m))};
}
#endif
// Note [subnormal probabilities] (emitter.cc): float's least normal number and its log.
static constexpr float kn_least_normal = 1.17549435e-38f, kn_ln_least_normal = -87.3365448f;
#ifdef KN_W
KN_CMP(veq, _CMP_EQ_OQ) KN_CMP(vne, _CMP_NEQ_UQ) KN_CMP(vlt, _CMP_LT_OQ) KN_CMP(vle, _CMP_LE_OQ)
KN_CMP(vgt, _CMP_GT_OQ) KN_CMP(vge, _CMP_GE_OQ) KN_CMP(vunord, _CMP_UNORD_Q)
#undef KN_CMP
static inline VF vor(VF a, VF b) { return vsel(a, vset(1.0f), vsel(b, vset(1.0f), vset(0.0f))); }
static inline VF vand(VF a, VF b) { return vsel(a, vsel(b, vset(1.0f), vset(0.0f)), vset(0.0f)); }
static inline VF vnot(VF a) { return vsel(a, vset(0.0f), vset(1.0f)); }
static inline VF vneg(VF a) { return vset(0.0f) - a; }
static inline VF vabs(VF a) { return vmax(a, vneg(a)); }
static inline VF vsigmoid(VF a) { return vset(1.0f) / (vset(1.0f) + vexp(vneg(a))); }
static inline VF vsilu(VF a) { return a / (vset(1.0f) + vexp(vneg(a))); }
static inline VF vgelu(VF a) { return vset(0.5f) * a * (vset(1.0f) + verf(a * vset(0.70710678118654752f))); }
static inline VF vgelu_tanh(VF a) { return vset(0.5f) * a * (vset(1.0f) + vtanh(vset(0.7978845608028654f) * (a + vset(0.044715f) * a * a * a))); }
static inline VF vrsqrt(VF a) { return vset(1.0f) / vsqrt(a); }
static inline VF vrecip(VF a) { return vset(1.0f) / a; }
static inline VF vsign(VF a) { return vsel(vunord(a, a), a, vgt(a, vset(0.0f)) - vlt(a, vset(0.0f))); }
// The max (min) of the lanes: a NaN lane gives NaN. Halving steps, not a scalar loop (whose
// compares and branches were a third of a 64-wide softmax row's time).
static inline float vmax_all(VF a) { return kn_lanes(a, [](VF x, VF y) { return vmax(x, y); }); }
static inline float vmin_all(VF a) { return kn_lanes(a, [](VF x, VF y) { return vmin(x, y); }); }
static inline float vprod_all(VF a) { float t[KN_W]; std::memcpy(t, &a, sizeof(t)); float m = t[0]; for (int i = 1; i < KN_W; ++i) m *= t[i]; return m; }
// |a| below float's least normal becomes 0; NaN stays.
static inline VF vflush_tiny(VF a) { return vsel(vlt(vabs(a), vset(kn_least_normal)), vset(0.0f), a); }
// exp without subnormal results: 0 below ln(least normal), where exp(a) would be subnormal (the
// argument is replaced first, so no lane computes one); NaN stays NaN.
static inline VF vexp_ftz(VF a) {
  const VF tiny = vlt(a, vset(kn_ln_least_normal));
  return vsel(tiny, vset(0.0f), vexp(vsel(tiny, vset(0.0f), a)));
}
#endif
static inline float kn_flush_tiny(float a) { return std::fabs(a) < kn_least_normal ? 0.0f : a; }
static inline float kn_exp_ftz(float a) { return a < kn_ln_least_normal ? 0.0f : std::exp(a); }
// Note [grid_sample tap tables] (emitter.cc): rows [0, n) of a grid_sample's tap tables from
// its coordinates (cx, cy), as ref_grid_sample computes them (bilinear, zeros padding): the
// source position clamped to [-2, size + 1], its top-left tap (tx, ty), the four taps' weights
// (wt + t * ws: top-left, top-right, bottom-left, bottom-right) and which taps lie inside (ok
// bits 0-3; 16 for a NaN coordinate, whose row is otherwise position 0). SIMD over the rows.
static inline void kn_grid_taps(const float* cx, const float* cy, i64 n, int ac, i64 W, i64 H,
                                float* wt, i64 ws, int* ok, int* tx, int* ty) {
  const float fw = (float)W, fh = (float)H;
  i64 i = 0;
#ifdef KN_W
  for (; i + KN_W <= n; i += KN_W) {
    const VF one = vset(1.0f), two = vset(2.0f), zero = vset(0.0f);
    const VF x = vld(cx + i), y = vld(cy + i);
    VF ix = ac ? (x + one) / two * vset(fw - 1) : ((x + one) * vset(fw) - one) / two;
    VF iy = ac ? (y + one) / two * vset(fh - 1) : ((y + one) * vset(fh) - one) / two;
    const VF nan = vor(vunord(ix, ix), vunord(iy, iy));
    ix = vmin(vmax(vsel(nan, zero, ix), vset(-2.0f)), vset(fw + 1));
    iy = vmin(vmax(vsel(nan, zero, iy), vset(-2.0f)), vset(fh + 1));
    const VF x0 = vfloor(ix), y0 = vfloor(iy);
    const VF wx1 = ix - x0, wy1 = iy - y0, wx0 = one - wx1, wy0 = one - wy1;
    const VF xa = vand(vge(x0, zero), vlt(x0, vset(fw))), xb = vand(vge(x0, vset(-1.0f)), vlt(x0, vset(fw - 1)));
    const VF ya = vand(vge(y0, zero), vlt(y0, vset(fh))), yb = vand(vge(y0, vset(-1.0f)), vlt(y0, vset(fh - 1)));
    const VF bits = ya * xa + ya * xb * two + yb * xa * vset(4.0f) + yb * xb * vset(8.0f);
    vst_i32(ok + i, vsel(nan, vset(16.0f), bits));
    vst_i32(tx + i, x0);
    vst_i32(ty + i, y0);
    vst(wt + i, wy0 * wx0);
    vst(wt + ws + i, wy0 * wx1);
    vst(wt + 2 * ws + i, wy1 * wx0);
    vst(wt + 3 * ws + i, wy1 * wx1);
  }
#endif
  for (; i < n; ++i) {
    float ix = ac ? (cx[i] + 1) / 2 * (fw - 1) : ((cx[i] + 1) * fw - 1) / 2;
    float iy = ac ? (cy[i] + 1) / 2 * (fh - 1) : ((cy[i] + 1) * fh - 1) / 2;
    const bool nan = ix != ix || iy != iy;
    if (nan) ix = iy = 0;
    ix = ix < -2 ? -2 : ix > fw + 1 ? fw + 1 : ix;
    iy = iy < -2 ? -2 : iy > fh + 1 ? fh + 1 : iy;
    const float x0 = std::floor(ix), y0 = std::floor(iy);
    const float wx1 = ix - x0, wy1 = iy - y0, wx0 = 1 - wx1, wy0 = 1 - wy1;
    const bool xa = x0 >= 0 && x0 < fw, xb = x0 >= -1 && x0 < fw - 1;
    const bool ya = y0 >= 0 && y0 < fh, yb = y0 >= -1 && y0 < fh - 1;
    ok[i] = nan ? 16 : (ya && xa) | (ya && xb) << 1 | (yb && xa) << 2 | (yb && xb) << 3;
    tx[i] = (int)x0;
    ty[i] = (int)y0;
    wt[i] = wy0 * wx0;
    wt[ws + i] = wy0 * wx1;
    wt[2 * ws + i] = wy1 * wx0;
    wt[3 * ws + i] = wy1 * wx1;
  }
}
// ---- index checks (Note [Indexed loads] in lower/loop_ir.h) ----
// The first bad index of a call wins: err[0] = the kernel's check number, err[1] = the value.
static inline void kn_index_error(i64* err, i64 check, i64 value) {
  i64 none = -1;
  if (__atomic_compare_exchange_n(&err[0], &none, check, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    err[1] = value;
}
// ---- end of prelude ----
)KILN";

}  // namespace

const std::string& cpu_prelude() {
  static const std::string text = std::string(kHead) + "// ---- scalar math (src/ops/scalar_math.h) ----\n" +
                                  scalar_math_text() + kVectors;
  return text;
}

}  // namespace kiln::cpu
