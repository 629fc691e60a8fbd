// Helpers shared by op kernels: broadcasting strides, strided element loops, common inference.
#pragma once
#include <cmath>
#include <optional>

#include "ops/op.h"

namespace kiln {

// Strides that view a tensor of `sizes`/`strides` as `new_sizes` without moving data, or nullopt
// when the layout does not allow it (reshape/flatten then copy). Defined in shape.cc.
std::optional<Dims> view_strides(const Dims& sizes, const Dims& strides, const Dims& new_sizes);

// Strides of `t` broadcast to `out_sizes` (0 on broadcast dims, leading dims added).
Dims broadcast_strides(const Tensor& t, const Dims& out_sizes);

// Calls f(out_index_ptr, in_offsets...) for every element of `out_sizes`: offsets are element
// offsets into each input computed from `strides` (one Dims per input). Row-major order.
template <size_t N, typename F>
void for_each_broadcast(const Dims& out_sizes, const Dims (&strides)[N], F&& f) {
  int r = int(out_sizes.size());
  int64_t n = numel(out_sizes);
  if (n == 0) return;
  int64_t idx[kMaxRank] = {0};
  int64_t off[N] = {0};
  for (int64_t i = 0; i < n; ++i) {
    f(i, static_cast<const int64_t*>(off));
    for (int d = r - 1; d >= 0; --d) {
      if (++idx[d] < out_sizes[d]) {
        for (size_t k = 0; k < N; ++k) off[k] += strides[k][d];
        break;
      }
      for (size_t k = 0; k < N; ++k) off[k] -= strides[k][d] * (out_sizes[d] - 1);
      idx[d] = 0;
    }
  }
}

// Byte pointer to element `offset` of tensor t (t's own element offset already included).
inline char* elem_ptr(const Tensor& t, int64_t offset) {
  return static_cast<char*>(t.raw_data()) + offset * t.element_size();
}

// Any-strided tensor (any device) -> row-major float64 values.
std::vector<double> read_f64(const Tensor& t);
// Writes row-major float64 values into a contiguous CPU tensor of any dtype.
void write_f64(Tensor& out, const std::vector<double>& v);

// Inference helpers.
std::vector<TensorType> same_as_input(const InferContext& ctx);  // one output like input 0

// Reads the "dims" attribute as normalized, sorted, unique axes (empty = all axes).
std::vector<int> reduction_axes(const InferContext& ctx, int rank);
std::vector<int> reduction_axes(const Attrs& attrs, int rank);

// Test-sample helpers.
Tensor sample_randn(Generator& g, const Dims& sizes, double scale = 1.0);          // float64
Tensor sample_uniform(Generator& g, const Dims& sizes, double lo, double hi);      // float64
Tensor sample_noncontiguous(Generator& g, const Dims& sizes);  // float64, transposed view
// randn values (times `scale`) with special values at random positions: NaN, +-inf, -0, +0,
// denormals of float64 (1e-310), float32 (-1e-40) and float16 (3e-6), and, when `large`,
// values beyond float16's range (1e5, -7e4). Needs numel >= 10 (12 with `large`). See docs/ops.md
// "Special values".
Tensor sample_special(Generator& g, const Dims& sizes, bool large = true, double scale = 1.0);

}  // namespace kiln
