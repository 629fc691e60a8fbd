// The eager C++ op API: one function per op, each a thin call into dispatch (call_op) with the
// op's attributes. Under capture the same calls are recorded into a graph. The attribute names
// used here are the op schemas of src/ops/<family>.cc.
#pragma once
#include <optional>
#include <source_location>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln {

#define KILN_LOC const std::source_location& loc = std::source_location::current()

// ---- unary pointwise (schema: x) -------------------------------------------------------------
Tensor neg(const Tensor& x, KILN_LOC);
Tensor abs(const Tensor& x, KILN_LOC);
Tensor exp(const Tensor& x, KILN_LOC);
Tensor log(const Tensor& x, KILN_LOC);
Tensor sqrt(const Tensor& x, KILN_LOC);
Tensor rsqrt(const Tensor& x, KILN_LOC);
Tensor reciprocal(const Tensor& x, KILN_LOC);
Tensor sigmoid(const Tensor& x, KILN_LOC);
Tensor tanh(const Tensor& x, KILN_LOC);
Tensor relu(const Tensor& x, KILN_LOC);
// approximate: "none" (erf form) or "tanh".
Tensor gelu(const Tensor& x, const std::string& approximate = "none", KILN_LOC);
Tensor silu(const Tensor& x, KILN_LOC);
Tensor erf(const Tensor& x, KILN_LOC);
Tensor sin(const Tensor& x, KILN_LOC);
Tensor cos(const Tensor& x, KILN_LOC);
Tensor floor(const Tensor& x, KILN_LOC);
Tensor ceil(const Tensor& x, KILN_LOC);
Tensor round(const Tensor& x, KILN_LOC);  // half to even
Tensor sign(const Tensor& x, KILN_LOC);
Tensor logical_not(const Tensor& x, KILN_LOC);  // op "not"
// attrs: min (float, optional), max (float, optional)
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max, KILN_LOC);
// attrs: dtype
Tensor cast(const Tensor& x, DType dtype, KILN_LOC);

// ---- binary pointwise (schema: a, b; NumPy broadcasting; dtype promotion) ---------------------
Tensor add(const Tensor& a, const Tensor& b, KILN_LOC);
Tensor sub(const Tensor& a, const Tensor& b, KILN_LOC);
Tensor mul(const Tensor& a, const Tensor& b, KILN_LOC);
Tensor div(const Tensor& a, const Tensor& b, KILN_LOC);  // true division (ints: truncating)
Tensor pow(const Tensor& a, const Tensor& b, KILN_LOC);
Tensor maximum(const Tensor& a, const Tensor& b, KILN_LOC);
Tensor minimum(const Tensor& a, const Tensor& b, KILN_LOC);
Tensor eq(const Tensor& a, const Tensor& b, KILN_LOC);
Tensor ne(const Tensor& a, const Tensor& b, KILN_LOC);
Tensor lt(const Tensor& a, const Tensor& b, KILN_LOC);
Tensor le(const Tensor& a, const Tensor& b, KILN_LOC);
Tensor gt(const Tensor& a, const Tensor& b, KILN_LOC);
Tensor ge(const Tensor& a, const Tensor& b, KILN_LOC);
Tensor logical_and(const Tensor& a, const Tensor& b, KILN_LOC);  // op "and"
Tensor logical_or(const Tensor& a, const Tensor& b, KILN_LOC);   // op "or"
// schema: cond (bool), a, b
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, KILN_LOC);
// Scalar forms: the scalar becomes a 0-d tensor of x's dtype (no promotion), like PyTorch.
Tensor add(const Tensor& a, double b, KILN_LOC);
Tensor sub(const Tensor& a, double b, KILN_LOC);
Tensor mul(const Tensor& a, double b, KILN_LOC);
Tensor div(const Tensor& a, double b, KILN_LOC);
Tensor pow(const Tensor& a, double b, KILN_LOC);
Tensor scalar_like(double value, const Tensor& like);

// ---- reductions (attrs: dims (ints; empty = all), keepdim (bool)) ----------------------------
Tensor sum(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false, KILN_LOC);
Tensor mean(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false, KILN_LOC);
Tensor amax(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false, KILN_LOC);  // op "max"
Tensor amin(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false, KILN_LOC);  // op "min"
Tensor prod(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false, KILN_LOC);
// attrs: dims, keepdim, correction (int, default 1 = unbiased)
Tensor var(const Tensor& x, std::vector<int64_t> dims = {}, int64_t correction = 1,
           bool keepdim = false, KILN_LOC);
// attrs: dim (int, optional: none = over the flattened tensor), keepdim. Output int64.
Tensor argmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false, KILN_LOC);
Tensor argmin(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false, KILN_LOC);

// ---- normalization --------------------------------------------------------------------------
// attrs: dim
Tensor softmax(const Tensor& x, int64_t dim, KILN_LOC);
Tensor log_softmax(const Tensor& x, int64_t dim, KILN_LOC);
// schema: x, weight?, bias?; attrs: normalized_shape (ints), eps (float, 1e-5)
Tensor layer_norm(const Tensor& x, std::vector<int64_t> normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps = 1e-5, KILN_LOC);
// Inference batch norm over dim 1. schema: x, running_mean, running_var, weight?, bias?;
// attrs: eps (1e-5)
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, double eps = 1e-5, KILN_LOC);
// schema: x, weight?, bias?; attrs: num_groups (int), eps (1e-5)
Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight, const Tensor& bias,
                  double eps = 1e-5, KILN_LOC);

// ---- linear algebra -------------------------------------------------------------------------
// NumPy matmul semantics: 1-D operands promoted, batch dims broadcast.
Tensor matmul(const Tensor& a, const Tensor& b, KILN_LOC);
// y = x @ weight^T + bias. schema: x, weight [out, in], bias? [out]
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, KILN_LOC);

// ---- convolution and pooling (NCHW) ---------------------------------------------------------
// schema: x, weight, bias?; attrs: stride [2], padding [2] (top/left = bottom/right) or
// [4] (top, left, bottom, right), dilation [2], groups
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              std::vector<int64_t> stride = {1, 1}, std::vector<int64_t> padding = {0, 0},
              std::vector<int64_t> dilation = {1, 1}, int64_t groups = 1, KILN_LOC);
// weight [in, out/groups, kh, kw]; attrs: stride, padding [2], output_padding [2], dilation, groups
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        std::vector<int64_t> stride = {1, 1}, std::vector<int64_t> padding = {0, 0},
                        std::vector<int64_t> output_padding = {0, 0},
                        std::vector<int64_t> dilation = {1, 1}, int64_t groups = 1, KILN_LOC);
// attrs: kernel_size [2], stride [2] (empty = kernel_size), padding [2], dilation [2], ceil_mode
Tensor max_pool2d(const Tensor& x, std::vector<int64_t> kernel_size, std::vector<int64_t> stride = {},
                  std::vector<int64_t> padding = {0, 0}, std::vector<int64_t> dilation = {1, 1},
                  bool ceil_mode = false, KILN_LOC);
// attrs: kernel_size, stride, padding, ceil_mode, count_include_pad (default true)
Tensor avg_pool2d(const Tensor& x, std::vector<int64_t> kernel_size, std::vector<int64_t> stride = {},
                  std::vector<int64_t> padding = {0, 0}, bool ceil_mode = false,
                  bool count_include_pad = true, KILN_LOC);
// attrs: output_size [2]
Tensor adaptive_avg_pool2d(const Tensor& x, std::vector<int64_t> output_size, KILN_LOC);

// ---- shape and layout -----------------------------------------------------------------------
// attrs: shape (ints, one -1 allowed). View when strides allow, copy otherwise.
Tensor reshape(const Tensor& x, std::vector<int64_t> shape, KILN_LOC);
Tensor permute(const Tensor& x, std::vector<int64_t> dims, KILN_LOC);      // attrs: dims
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1, KILN_LOC);    // attrs: dim0, dim1
Tensor expand(const Tensor& x, std::vector<int64_t> shape, KILN_LOC);      // attrs: shape (-1 keeps)
Tensor squeeze(const Tensor& x, std::vector<int64_t> dims = {}, KILN_LOC);  // attrs: dims (empty = all 1s)
Tensor unsqueeze(const Tensor& x, int64_t dim, KILN_LOC);                   // attrs: dims (ints)
Tensor unsqueeze(const Tensor& x, std::vector<int64_t> dims, KILN_LOC);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1, KILN_LOC);  // attrs: start_dim, end_dim
// attrs: dim, start, end (clamped like Python; INT64_MAX = to the end), step (>0)
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1, KILN_LOC);
// schema: inputs... (variadic); attrs: dim
Tensor concat(const TensorList& xs, int64_t dim, KILN_LOC);
// attrs: dim, sizes (ints). Outputs one tensor per size.
TensorList split(const Tensor& x, std::vector<int64_t> sizes, int64_t dim, KILN_LOC);
// attrs: pads (ints: [before_0, ..., before_{n-1}, after_0, ..., after_{n-1}] over the last n
// dims, ONNX order; negative pads crop), mode ("constant" | "reflect" | "replicate"), value
Tensor pad(const Tensor& x, std::vector<int64_t> pads, const std::string& mode = "constant",
           double value = 0.0, KILN_LOC);
Tensor copy(const Tensor& x, KILN_LOC);  // a contiguous copy

// ---- indexing -------------------------------------------------------------------------------
// schema: x, index (int64/int32); attrs: dim. Negative indices wrap; out of range is an error.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index, KILN_LOC);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index, KILN_LOC);
// schema: weight [num, dim], indices (int) -> indices.shape + [dim]
Tensor embedding(const Tensor& weight, const Tensor& indices, KILN_LOC);
// schema: x, index, src; attrs: dim. out = x; out[index[i]][...] += src[i] (along dim)
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src, KILN_LOC);

// ---- attention ------------------------------------------------------------------------------
// schema: q [..., L, E], k [..., S, E], v [..., S, Ev], mask? (bool: true = attend; or float:
// added to scores), broadcastable to [..., L, S]; attrs: is_causal (bool), scale (float,
// optional: default 1/sqrt(E))
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& mask = Tensor(), bool is_causal = false,
                                    std::optional<double> scale = std::nullopt, KILN_LOC);

// ---- resampling -----------------------------------------------------------------------------
// NCHW. attrs: size [2] (output H, W; empty => from scales), scales (floats [2]), mode
// ("nearest" | "bilinear"), align_corners (bool; bilinear only). nearest uses floor(dst*in/out)
// like PyTorch's "nearest".
Tensor upsample(const Tensor& x, std::vector<int64_t> size, std::vector<double> scales = {},
                const std::string& mode = "nearest", bool align_corners = false, KILN_LOC);
// schema: x [N,C,H,W], grid [N,Ho,Wo,2] (x, y in [-1, 1]); bilinear, zeros padding.
// attrs: align_corners (bool)
Tensor grid_sample(const Tensor& x, const Tensor& grid, bool align_corners = false, KILN_LOC);

// Operators.
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, double b) { return div(a, b); }
inline Tensor operator-(const Tensor& a) { return neg(a); }

#undef KILN_LOC

}  // namespace kiln
