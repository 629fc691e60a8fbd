#include "core/resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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

void bilinear_plane_f32(const float* plane, int64_t W, float* dst, std::span<const LinearTap> hs,
                        std::span<const LinearTap> ws, const float* wf, float* cache) {
  const int64_t Ho = int64_t(hs.size()), Wo = int64_t(ws.size());
  int64_t held[2] = {-1, -1};
  // Source row r interpolated along the width, in the cache slot that does not hold `keep`.
  auto row = [&](int64_t r, int64_t keep) -> const float* {
    for (int k = 0; k < 2; ++k)
      if (held[k] == r) return cache + k * Wo;
    const int k = held[0] == keep && keep >= 0 ? 1 : 0;
    const float* src = plane + r * W;
    float* t = cache + k * Wo;
    for (int64_t ow = 0; ow < Wo; ++ow) {
      const LinearTap& tw = ws[size_t(ow)];
      const float w1 = wf[ow], w0 = 1.0f - w1;
      t[ow] = w0 * src[tw.i0] + w1 * src[tw.i1];
    }
    held[k] = r;
    return t;
  };
  for (int64_t oh = 0; oh < Ho; ++oh, dst += Wo) {
    const LinearTap& th = hs[size_t(oh)];
    const float* top = row(th.i0, th.i1);
    const float* bottom = row(th.i1, th.i0);  // never evicts the top row
    const float h1 = float(th.w1), h0 = 1.0f - h1;
#pragma GCC ivdep
    for (int64_t ow = 0; ow < Wo; ++ow) dst[ow] = h0 * top[ow] + h1 * bottom[ow];
  }
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
