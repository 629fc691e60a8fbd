#include "core/resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kiln::resample {

std::vector<int64_t> nearest_table(int64_t in, int64_t out, std::span<const double> scales,
                                   int i) {
  std::vector<int64_t> t(static_cast<size_t>(out));
  // Computed in float32, as PyTorch does.
  const float s = scales.empty() ? float(in) / float(out) : float(1.0 / scales[size_t(i)]);
  for (int64_t o = 0; o < out; ++o) {
    if (out == in) t[size_t(o)] = o;
    else if (out == 2 * in) t[size_t(o)] = o >> 1;
    else t[size_t(o)] = std::min(int64_t(std::floor(float(o) * s)), in - 1);
  }
  return t;
}

std::vector<LinearTap> linear_table(int64_t in, int64_t out, bool align_corners,
                                    std::span<const double> scales, int i) {
  std::vector<LinearTap> t(static_cast<size_t>(out));
  double s;
  if (align_corners) s = out > 1 ? double(in - 1) / double(out - 1) : 0.0;
  else s = scales.empty() ? double(in) / double(out) : 1.0 / scales[size_t(i)];
  for (int64_t o = 0; o < out; ++o) {
    double src = align_corners ? s * double(o) : std::max(s * (double(o) + 0.5) - 0.5, 0.0);
    int64_t i0 = std::min(int64_t(std::floor(src)), in - 1);
    double w1 = std::min(std::max(src - double(i0), 0.0), 1.0);
    t[size_t(o)] = {i0, i0 + (i0 < in - 1 ? 1 : 0), w1};
  }
  return t;
}

namespace {
// Each output row is its source row's elements at the width table's columns, copied element by
// element in the element's own type (a memcpy call per element was ~44x the copy's floor), or,
// when it has the previous output row's source row, a copy of that row.
template <typename E>
void nearest_rows(const char* plane, int64_t sh, int64_t sw, E* dst,
                  std::span<const int64_t> hs, std::span<const int64_t> ws) {
  const int64_t Ho = int64_t(hs.size()), Wo = int64_t(ws.size());
  for (int64_t oh = 0; oh < Ho; ++oh, dst += Wo) {
    if (oh > 0 && hs[size_t(oh)] == hs[size_t(oh - 1)]) {
      std::memcpy(dst, dst - Wo, size_t(Wo) * sizeof(E));
      continue;
    }
    const char* row = plane + hs[size_t(oh)] * sh * int64_t(sizeof(E));
    for (int64_t ow = 0; ow < Wo; ++ow)
      std::memcpy(&dst[ow], row + ws[size_t(ow)] * sw * int64_t(sizeof(E)), sizeof(E));
  }
}
}  // namespace

void nearest_plane(const char* plane, int64_t sh, int64_t sw, char* dst, int64_t elem_bytes,
                   std::span<const int64_t> hs, std::span<const int64_t> ws) {
  switch (elem_bytes) {
    case 1: return nearest_rows(plane, sh, sw, reinterpret_cast<uint8_t*>(dst), hs, ws);
    case 2: return nearest_rows(plane, sh, sw, reinterpret_cast<uint16_t*>(dst), hs, ws);
    case 4: return nearest_rows(plane, sh, sw, reinterpret_cast<uint32_t*>(dst), hs, ws);
    default: return nearest_rows(plane, sh, sw, reinterpret_cast<uint64_t*>(dst), hs, ws);
  }
}

WidthTaps width_taps(std::span<const LinearTap> ws) {
  WidthTaps t;
  for (const LinearTap& w : ws) {
    t.i0.push_back(int32_t(w.i0));
    t.i1.push_back(int32_t(w.i1));
    t.w1.push_back(float(w.w1));
    t.w0.push_back(1.0f - float(w.w1));
  }
  return t;
}

// Note [SIMD bilinear planes]
// bilinear_plane_f32 was scalar (the library is built for any x86-64): its width pass gathers
// two source columns per output element, 3-5x the upsample's floor in bev_fusion, fcn and the
// DeepLab / LR-ASPP heads (`kiln profile`). Its two passes now have AVX-512 and AVX2 forms,
// compiled for those ISAs alone (target attributes) and taken when the CPU has them: the width
// pass gathers 16 (8) outputs' taps at once, the blend is a vector loop. Every product and sum
// is rounded as the scalar code rounds it (no fused multiply-add: the masked _round_
// intrinsics, which the compiler does not contract), so the three forms give the same bits,
// and an eager upsample on one machine equals the compiled one on another.
namespace {

using WidthPass = void (*)(const float* src, const WidthTaps& ws, float* t);
using BlendPass = void (*)(const float* top, const float* bottom, float h0, float h1, float* dst,
                           int64_t n);

// The scalar passes from column `from` on: the scalar form, and the AVX2 form's tails.
void width_from(const float* src, const WidthTaps& ws, float* t, int64_t from) {
  const int64_t Wo = int64_t(ws.w1.size());
  for (int64_t ow = from; ow < Wo; ++ow)
    t[ow] = ws.w0[size_t(ow)] * src[ws.i0[size_t(ow)]] + ws.w1[size_t(ow)] * src[ws.i1[size_t(ow)]];
}

void blend_from(const float* top, const float* bottom, float h0, float h1, float* dst,
                int64_t n, int64_t from) {
  for (int64_t i = from; i < n; ++i) dst[i] = h0 * top[i] + h1 * bottom[i];
}

void width_scalar(const float* src, const WidthTaps& ws, float* t) { width_from(src, ws, t, 0); }

void blend_scalar(const float* top, const float* bottom, float h0, float h1, float* dst,
                  int64_t n) {
  blend_from(top, bottom, h0, h1, dst, n, 0);
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) void width_avx512(const float* src, const WidthTaps& ws,
                                                      float* t) {
  const int64_t Wo = int64_t(ws.w1.size());
  constexpr int R = _MM_FROUND_CUR_DIRECTION;
  for (int64_t ow = 0; ow < Wo; ow += 16) {
    const __mmask16 m = Wo - ow >= 16 ? __mmask16(0xffff) : __mmask16((1u << (Wo - ow)) - 1);
    const __m512i a = _mm512_maskz_loadu_epi32(m, ws.i0.data() + ow);
    const __m512i b = _mm512_maskz_loadu_epi32(m, ws.i1.data() + ow);
    const __m512 va = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, a, src, 4);
    const __m512 vb = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, b, src, 4);
    const __m512 pa = _mm512_maskz_mul_round_ps(m, _mm512_maskz_loadu_ps(m, ws.w0.data() + ow), va, R);
    const __m512 pb = _mm512_maskz_mul_round_ps(m, _mm512_maskz_loadu_ps(m, ws.w1.data() + ow), vb, R);
    _mm512_mask_storeu_ps(t + ow, m, _mm512_maskz_add_round_ps(m, pa, pb, R));
  }
}

__attribute__((target("avx512f"))) void blend_avx512(const float* top, const float* bottom,
                                                      float h0, float h1, float* dst, int64_t n) {
  constexpr int R = _MM_FROUND_CUR_DIRECTION;
  const __m512 v0 = _mm512_set1_ps(h0), v1 = _mm512_set1_ps(h1);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    const __m512 p0 = _mm512_maskz_mul_round_ps(m, v0, _mm512_maskz_loadu_ps(m, top + i), R);
    const __m512 p1 = _mm512_maskz_mul_round_ps(m, v1, _mm512_maskz_loadu_ps(m, bottom + i), R);
    _mm512_mask_storeu_ps(dst + i, m, _mm512_maskz_add_round_ps(m, p0, p1, R));
  }
}

// AVX2 has no rounding-control intrinsics; its mul and add builtins are not contracted into
// fused multiply-adds either (the function's target has no FMA).
__attribute__((target("avx2"))) void width_avx2(const float* src, const WidthTaps& ws, float* t) {
  const int64_t Wo = int64_t(ws.w1.size());
  int64_t ow = 0;
  for (; ow + 8 <= Wo; ow += 8) {
    const __m256 va = _mm256_i32gather_ps(src, _mm256_loadu_si256((const __m256i*)(ws.i0.data() + ow)), 4);
    const __m256 vb = _mm256_i32gather_ps(src, _mm256_loadu_si256((const __m256i*)(ws.i1.data() + ow)), 4);
    const __m256 pa = _mm256_mul_ps(_mm256_loadu_ps(ws.w0.data() + ow), va);
    const __m256 pb = _mm256_mul_ps(_mm256_loadu_ps(ws.w1.data() + ow), vb);
    _mm256_storeu_ps(t + ow, _mm256_add_ps(pa, pb));
  }
  width_from(src, ws, t, ow);
}

__attribute__((target("avx2"))) void blend_avx2(const float* top, const float* bottom, float h0,
                                                 float h1, float* dst, int64_t n) {
  const __m256 v0 = _mm256_set1_ps(h0), v1 = _mm256_set1_ps(h1);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_mul_ps(v0, _mm256_loadu_ps(top + i)),
                                            _mm256_mul_ps(v1, _mm256_loadu_ps(bottom + i))));
  blend_from(top, bottom, h0, h1, dst, n, i);
}
#endif

struct Passes {
  WidthPass width;
  BlendPass blend;
};

// The named form, when this CPU runs it.
bool form_passes(std::string_view f, Passes* p) {
#if defined(__x86_64__)
  if (f == "avx512" && __builtin_cpu_supports("avx512f")) return *p = {width_avx512, blend_avx512}, true;
  if (f == "avx2" && __builtin_cpu_supports("avx2")) return *p = {width_avx2, blend_avx2}, true;
#endif
  if (f == "scalar") return *p = {width_scalar, blend_scalar}, true;
  return false;
}

Passes best_passes() {
  static const Passes p = [] {
    Passes q{};
    for (const char* f : {"avx512", "avx2", "scalar"})
      if (form_passes(f, &q)) break;
    return q;
  }();
  return p;
}

void plane_with(const Passes& p, const float* plane, int64_t W, float* dst,
                std::span<const LinearTap> hs, const WidthTaps& ws, float* cache) {
  const int64_t Ho = int64_t(hs.size()), Wo = int64_t(ws.w1.size());
  int64_t held[2] = {-1, -1};
  // Source row r interpolated along the width, in the cache slot that does not hold `keep`.
  auto row = [&](int64_t r, int64_t keep) -> const float* {
    for (int k = 0; k < 2; ++k)
      if (held[k] == r) return cache + k * Wo;
    const int k = held[0] == keep && keep >= 0 ? 1 : 0;
    p.width(plane + r * W, ws, cache + k * Wo);
    held[k] = r;
    return cache + k * Wo;
  };
  for (int64_t oh = 0; oh < Ho; ++oh, dst += Wo) {
    const LinearTap& th = hs[size_t(oh)];
    const float* top = row(th.i0, th.i1);
    const float* bottom = row(th.i1, th.i0);  // never evicts the top row
    const float h1 = float(th.w1), h0 = 1.0f - h1;
    p.blend(top, bottom, h0, h1, dst, Wo);
  }
}

}  // namespace

void bilinear_plane_f32(const float* plane, int64_t W, float* dst, std::span<const LinearTap> hs,
                        const WidthTaps& ws, float* cache) {
  plane_with(best_passes(), plane, W, dst, hs, ws, cache);
}

bool bilinear_plane_f32_form(const char* form, const float* plane, int64_t W, float* dst,
                             std::span<const LinearTap> hs, const WidthTaps& ws, float* cache) {
  Passes p{};
  if (!form_passes(form, &p)) return false;
  plane_with(p, plane, W, dst, hs, ws, cache);
  return true;
}

void bilinear_plane_f64(const char* plane, int64_t sh, int64_t sw, char* dst, DType dt,
                        std::span<const LinearTap> hs, std::span<const LinearTap> ws) {
  const int64_t es = dtype_size(dt);
  auto at = [&](int64_t h, int64_t w) { return load_f64(plane + (h * sh + w * sw) * es, dt); };
  for (const LinearTap& th : hs)
    for (const LinearTap& tw : ws) {
      double top = (1 - tw.w1) * at(th.i0, tw.i0) + tw.w1 * at(th.i0, tw.i1);
      double bottom = (1 - tw.w1) * at(th.i1, tw.i0) + tw.w1 * at(th.i1, tw.i1);
      store_f64(dst, dt, (1 - th.w1) * top + th.w1 * bottom);
      dst += es;
    }
}

}  // namespace kiln::resample
