// Upsampling's tap tables and per-plane loops (Note [Resample coordinates] in ops/resample.cc),
// shared by the eager kernels (ops/) and the runtime's upsample launch (runtime/launch_library.h),
// so that a compiled or packaged upsample computes bitwise what the eager kernel computes.
// Contiguous planes only in the loops; no threads here (the callers split planes).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/dtype.h"

namespace kiln::resample {

// PyTorch's "nearest": source index of every output index along one axis (axis i of `scales`,
// empty: in/out).
std::vector<int64_t> nearest_table(int64_t in, int64_t out, std::span<const double> scales,
                                   int i);

struct LinearTap {
  int64_t i0, i1;
  double w1;  // weight of i1; i0 gets 1 - w1
};
// Bilinear's two taps and weight of every output index along one axis.
std::vector<LinearTap> linear_table(int64_t in, int64_t out, bool align_corners,
                                    std::span<const double> scales, int i);

// One plane, nearest: dst (Ho x Wo row-major, elements of elem_bytes: 1, 2, 4 or 8) at [oh, ow]
// = plane[hs[oh] * sh + ws[ow] * sw] (strides in elements).
void nearest_plane(const char* plane, int64_t sh, int64_t sw, char* dst, int64_t elem_bytes,
                   std::span<const int64_t> hs, std::span<const int64_t> ws);

// The width taps of a float32 plane (from linear_table): source columns as int32 (a SIMD
// gather's index) and both weights in float.
struct WidthTaps {
  std::vector<int32_t> i0, i1;
  std::vector<float> w0, w1;
};
WidthTaps width_taps(std::span<const LinearTap> ws);

// One float32 plane, bilinear, contiguous [H, W] -> [Ho, Wo], separably (each source row
// interpolated along the width once, each output row a blend of two of them; the operations
// per element are the direct formula's, in its order, each product and sum rounded to float:
// the same bits whether the CPU runs it with AVX-512 gathers, AVX2's, or scalar code). `cache`
// holds 2 * Wo floats.
void bilinear_plane_f32(const float* plane, int64_t W, float* dst, std::span<const LinearTap> hs,
                        const WidthTaps& ws, float* cache);
// The same in one named form ("avx512", "avx2", "scalar"; tests compare them): false when this
// CPU cannot run it.
bool bilinear_plane_f32_form(const char* form, const float* plane, int64_t W, float* dst,
                             std::span<const LinearTap> hs, const WidthTaps& ws, float* cache);

// One plane, bilinear in float64 (the reference's arithmetic; what the eager kernel runs for
// dtypes other than contiguous float32): dst (Ho x Wo row-major, dtype dt) from `plane`
// (strides sh, sw in elements, dtype dt), each element rounded once to dt.
void bilinear_plane_f64(const char* plane, int64_t sh, int64_t sw, char* dst, DType dt,
                        std::span<const LinearTap> hs, std::span<const LinearTap> ws);

}  // namespace kiln::resample
