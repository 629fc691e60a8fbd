// Normalization ops: softmax, log_softmax, layer_norm, batch_norm (inference), group_norm.
//
// Reference kernels read inputs into float64 and compute the textbook formulas (two-pass mean
// and variance). Decompositions are written with the eager API so the compiler can trace them
// into core ops; float16/bfloat16 inputs are computed in float32 there and cast back, as
// PyTorch's decompositions do. The eager float32 kernels are fused row loops; see
// Note [Row statistics].
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/kernel_path.h"
#include "ops/api.h"
#include "ops/kernel_util.h"

namespace kiln {
namespace {

// ---- helpers ----------------------------------------------------------------------------------

int64_t prod(const Dims& d, int from, int to) {
  int64_t n = 1;
  for (int i = from; i < to; ++i) n *= d[size_t(i)];
  return n;
}

// Low-precision floats are normalized in float32 by the decompositions.
DType compute_dtype(DType d) {
  return (d == DType::Float16 || d == DType::BFloat16) ? DType::Float32 : d;
}
Tensor to_compute(const Tensor& t, DType cd) {
  return t.defined() && t.dtype() != cd ? cast(t, cd) : t;
}

void check_float_input(const InferContext& ctx, size_t i, const char* name) {
  const TensorType& t = ctx.in(i);
  if (!is_floating(t.dtype))
    ctx.fail("input '{}' has dtype {}; expected a floating dtype", name, dtype_name(t.dtype));
  if (t.device != ctx.in(0).device)
    ctx.fail("input '{}' is on {} but 'x' is on {}", name, t.device.str(), ctx.in(0).device.str());
}

// Checks a per-channel parameter (1-D of `expected` elements) when present.
void check_param(const InferContext& ctx, size_t i, const char* name, const Shape& expected,
                 const char* what) {
  if (!ctx.has_input(i)) return;
  check_float_input(ctx, i, name);
  const Shape& s = ctx.in(i).shape;
  bool mismatch = s.size() != expected.size();
  for (size_t d = 0; !mismatch && d < s.size(); ++d)
    mismatch = s[d] != expected[d];  // symbolic sizes must be provably equal
  if (mismatch)
    ctx.fail("input '{}' has shape {}; expected {} ({})", name, to_string(s), to_string(expected),
             what);
}

void check_eps(const InferContext& ctx) {
  double eps = ctx.attrs.get_float("eps");
  if (!(eps >= 0.0)) ctx.fail("attribute 'eps' is {}; expected a non-negative value", eps);
}

// ---- softmax / log_softmax --------------------------------------------------------------------
// Rank 0 behaves like rank 1 of one element (dim 0 or -1), as in PyTorch.
int softmax_axis(int64_t dim, int rank) { return normalize_axis(dim, std::max(rank, 1), "dim"); }

std::vector<TensorType> infer_softmax(const InferContext& ctx) {
  const TensorType& x = ctx.in(0);
  if (!is_floating(x.dtype))
    ctx.fail("input 'x' has dtype {}; expected a floating dtype (cast it first)",
             dtype_name(x.dtype));
  try {
    softmax_axis(ctx.attrs.get_int("dim"), x.rank());
  } catch (const Error& e) {
    ctx.fail("input 'x' {}: {}", to_string(x.shape), e.message());
  }
  return same_as_input(ctx);
}

// outer x D x inner view of x around `axis`.
struct RowGeometry {
  int64_t outer, d, inner;
};
RowGeometry row_geometry(const Dims& sizes, int axis) {
  if (sizes.empty()) return {1, 1, 1};
  return {prod(sizes, 0, axis), sizes[size_t(axis)], prod(sizes, axis + 1, int(sizes.size()))};
}

void ref_softmax(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  bool log_form = ctx.op.id == OpId::LogSoftmax;
  RowGeometry g = row_geometry(x.sizes(), softmax_axis(ctx.attrs.get_int("dim"), x.dim()));
  std::vector<double> v = read_f64(x), out(v.size());
  for (int64_t o = 0; o < g.outer; ++o)
    for (int64_t i = 0; i < g.inner; ++i) {
      auto at = [&](int64_t k) { return size_t((o * g.d + k) * g.inner + i); };
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t k = 0; k < g.d; ++k) m = std::max(m, v[at(k)]);
      double s = 0;
      for (int64_t k = 0; k < g.d; ++k) s += std::exp(v[at(k)] - m);
      for (int64_t k = 0; k < g.d; ++k)
        out[at(k)] = log_form ? v[at(k)] - m - std::log(s) : std::exp(v[at(k)] - m) / s;
    }
  write_f64(ctx.outputs[0], out);
}

// Note [Row statistics]
// The float32 eager kernels walk each normalized row once or twice in float, accumulating in
// double. Softmax subtracts the row max before exp (stable for any magnitude). Mean and
// variance use one pass over values shifted by the row's first element x0: sum(x - x0) and
// sum((x - x0)^2) in double; shifting keeps E[x^2] - E[x]^2 from cancelling catastrophically
// when |mean| >> std (activations of 1e4 with unit spread). The output is formed as
// ((x - x0) - (mean - x0)) * rstd: x - x0 is exact in float for nearby values, and mean - x0 is
// small, so no float ever holds the large mean (its rounding alone would be 5e-4 at 1e4).
void softmax_row_f32(const float* x, float* y, int64_t n, int64_t stride, bool log_form) {
  float m = -std::numeric_limits<float>::infinity();
  bool nan = false;
  for (int64_t k = 0; k < n; ++k) {
    float v = x[k * stride];
    nan |= v != v;
    m = v > m ? v : m;
  }
  if (nan) m = std::numeric_limits<float>::quiet_NaN();  // propagate, as the reference does
  double s = 0;
  if (log_form) {
    for (int64_t k = 0; k < n; ++k) s += std::exp(double(x[k * stride] - m));
    float lse = float(double(m) + std::log(s));
    for (int64_t k = 0; k < n; ++k) y[k * stride] = x[k * stride] - lse;
  } else {
    for (int64_t k = 0; k < n; ++k) {
      float e = std::exp(x[k * stride] - m);
      y[k * stride] = e;
      s += e;
    }
    float inv = float(1.0 / s);
    for (int64_t k = 0; k < n; ++k) y[k * stride] *= inv;
  }
}

void eager_softmax(const KernelContext& ctx) {
  const Tensor& x0 = ctx.inputs[0];
  if (x0.dtype() != DType::Float32) return note_kernel_path("reference"), ref_softmax(ctx);
  note_kernel_path("f32");
  Tensor x = x0.contiguous();
  bool log_form = ctx.op.id == OpId::LogSoftmax;
  RowGeometry g = row_geometry(x.sizes(), softmax_axis(ctx.attrs.get_int("dim"), x.dim()));
  const float* xp = x.data<float>();
  float* yp = ctx.outputs[0].data<float>();
  int64_t rows = g.outer * g.inner;
#pragma omp parallel for if (rows * g.d > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t o = r / g.inner, i = r % g.inner;
    int64_t base = o * g.d * g.inner + i;
    softmax_row_f32(xp + base, yp + base, g.d, g.inner, log_form);
  }
}

TensorList decompose_softmax_like(std::span<const Tensor> in, const Attrs& attrs, bool log_form) {
  const Tensor& x0 = in[0];
  int64_t dim = attrs.get_int("dim");
  Tensor x = to_compute(x0, compute_dtype(x0.dtype()));
  Tensor shifted = sub(x, amax(x, {dim}, true));
  Tensor e = exp(shifted);
  Tensor y = log_form ? sub(shifted, log(sum(e, {dim}, true))) : div(e, sum(e, {dim}, true));
  return {to_compute(y, x0.dtype())};
}
TensorList decompose_softmax(std::span<const Tensor> in, const Attrs& attrs) {
  return decompose_softmax_like(in, attrs, false);
}
TensorList decompose_log_softmax(std::span<const Tensor> in, const Attrs& attrs) {
  return decompose_softmax_like(in, attrs, true);
}

// ---- layer_norm -------------------------------------------------------------------------------
std::vector<TensorType> infer_layer_norm(const InferContext& ctx) {
  const TensorType& x = ctx.in(0);
  check_float_input(ctx, 0, "x");
  check_eps(ctx);
  Shape ns = ctx.attrs.get_shape("normalized_shape");
  if (ns.empty()) ctx.fail("attribute 'normalized_shape' is empty; expected at least one dim");
  if (ns.size() > x.shape.size())
    ctx.fail("normalized_shape {} has {} dims but input 'x' {} has only {}", to_string(ns),
             ns.size(), to_string(x.shape), x.shape.size());
  size_t off = x.shape.size() - ns.size();
  for (size_t i = 0; i < ns.size(); ++i)
    if (x.shape[off + i] != ns[i])  // symbolic sizes must be provably equal
      ctx.fail("normalized_shape {} must match the trailing dims of input 'x' {}; dim {} is {}, "
               "expected {}", to_string(ns), to_string(x.shape), off + i, x.shape[off + i].str(),
               ns[i].str());
  check_param(ctx, 1, "weight", ns, "normalized_shape");
  check_param(ctx, 2, "bias", ns, "normalized_shape");
  return same_as_input(ctx);
}

void ref_layer_norm(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  int k = int(ctx.attrs.get_ints("normalized_shape").size());
  int64_t n = prod(x.sizes(), x.dim() - k, x.dim());
  double eps = ctx.attrs.get_float("eps");
  std::vector<double> v = read_f64(x), out(v.size());
  std::vector<double> w = ctx.inputs[1].defined() ? read_f64(ctx.inputs[1]) : std::vector<double>();
  std::vector<double> b = ctx.inputs[2].defined() ? read_f64(ctx.inputs[2]) : std::vector<double>();
  int64_t rows = n == 0 ? 0 : x.numel() / n;
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = v.data() + r * n;
    double mean = 0, var = 0;
    for (int64_t k = 0; k < n; ++k) mean += row[k];
    mean /= double(n);
    for (int64_t k = 0; k < n; ++k) var += (row[k] - mean) * (row[k] - mean);
    var /= double(n);
    double rstd = 1.0 / std::sqrt(var + eps);
    for (int64_t k = 0; k < n; ++k) {
      double y = (row[k] - mean) * rstd;
      if (!w.empty()) y *= w[size_t(k)];
      if (!b.empty()) y += b[size_t(k)];
      out[size_t(r * n + k)] = y;
    }
  }
  write_f64(ctx.outputs[0], out);
}

// Statistics of n floats; see Note [Row statistics]. The mean is returned relative to
// `shift` (a float of the row): y = ((x - shift) - mean_rel) * rstd keeps full precision even when
// |mean| >> std, where rounding the mean itself to float would not.
struct RowStats {
  float shift, mean_rel, rstd;
};
RowStats row_stats_f32(const float* x, int64_t n, double eps) {
  float shift = n > 0 ? x[0] : 0.0f;
  double s1 = 0, s2 = 0;
  for (int64_t k = 0; k < n; ++k) {
    double d = double(x[k]) - double(shift);
    s1 += d;
    s2 += d * d;
  }
  double m = s1 / double(n);
  double var = std::max(s2 / double(n) - m * m, 0.0);
  return {shift, float(m), float(1.0 / std::sqrt(var + eps))};
}

// Per-element params as float32 (small tensors; any dtype and strides).
std::vector<float> read_f32_param(const Tensor& t) {
  std::vector<float> out;
  if (!t.defined()) return out;
  for (double d : read_f64(t)) out.push_back(float(d));
  return out;
}

void eager_layer_norm(const KernelContext& ctx) {
  const Tensor& x0 = ctx.inputs[0];
  if (x0.dtype() != DType::Float32) return note_kernel_path("reference"), ref_layer_norm(ctx);
  note_kernel_path("f32");
  Tensor x = x0.contiguous();
  int k = int(ctx.attrs.get_ints("normalized_shape").size());
  int64_t n = prod(x.sizes(), x.dim() - k, x.dim());
  double eps = ctx.attrs.get_float("eps");
  std::vector<float> w = read_f32_param(ctx.inputs[1]), b = read_f32_param(ctx.inputs[2]);
  const float* xp = x.data<float>();
  float* yp = ctx.outputs[0].data<float>();
  int64_t rows = n == 0 ? 0 : x.numel() / n;
  const float* wp = w.empty() ? nullptr : w.data();
  const float* bp = b.empty() ? nullptr : b.data();
#pragma omp parallel for if (rows * n > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = xp + r * n;
    float* out = yp + r * n;
    RowStats st = row_stats_f32(row, n, eps);
    for (int64_t k = 0; k < n; ++k) {
      float y = ((row[k] - st.shift) - st.mean_rel) * st.rstd;
      if (wp) y *= wp[k];
      if (bp) y += bp[k];
      out[k] = y;
    }
  }
}

TensorList decompose_layer_norm(std::span<const Tensor> in, const Attrs& attrs) {
  const Tensor& x0 = in[0];
  DType cd = compute_dtype(x0.dtype());
  Tensor x = to_compute(x0, cd);
  int64_t k = int64_t(attrs.get_ints("normalized_shape").size());
  std::vector<int64_t> dims;
  for (int64_t i = x.dim() - k; i < x.dim(); ++i) dims.push_back(i);
  Tensor mu = mean(x, dims, true);
  Tensor var_ = var(x, dims, /*correction=*/0, true);
  Tensor y = mul(sub(x, mu), rsqrt(add(var_, attrs.get_float("eps"))));
  if (in.size() > 1 && in[1].defined()) y = mul(y, to_compute(in[1], cd));
  if (in.size() > 2 && in[2].defined()) y = add(y, to_compute(in[2], cd));
  return {to_compute(y, x0.dtype())};
}

// The common checks of batch_norm and group_norm: a floating x shaped [N, C, ...], valid eps.
const TensorType& check_channels_input(const InferContext& ctx) {
  const TensorType& x = ctx.in(0);
  check_float_input(ctx, 0, "x");
  check_eps(ctx);
  if (x.rank() < 2)
    ctx.fail("input 'x' {} has rank {}; expected [N, C, ...] (rank >= 2)", to_string(x.shape),
             x.rank());
  return x;
}

// ---- batch_norm (inference) -------------------------------------------------------------------
std::vector<TensorType> infer_batch_norm(const InferContext& ctx) {
  const TensorType& x = check_channels_input(ctx);
  Shape c{x.shape[1]};
  for (size_t i = 1; i < 3; ++i)
    if (!ctx.has_input(i))
      ctx.fail("input '{}' is missing", i == 1 ? "running_mean" : "running_var");
  const char* what = "the channel dim (1) of 'x'";
  check_param(ctx, 1, "running_mean", c, what);
  check_param(ctx, 2, "running_var", c, what);
  check_param(ctx, 3, "weight", c, what);
  check_param(ctx, 4, "bias", c, what);
  return same_as_input(ctx);
}

// Per-channel y = (x - mean) * scale + bias, scale = weight / sqrt(var + eps). Subtracting the
// mean first (rather than folding it into one multiply-add) keeps precision when |mean| >> std.
struct ChannelAffine {
  std::vector<float> mean, scale, bias;
};
ChannelAffine batch_norm_affine(const KernelContext& ctx, int64_t c) {
  double eps = ctx.attrs.get_float("eps");
  std::vector<double> m = read_f64(ctx.inputs[1]), v = read_f64(ctx.inputs[2]);
  std::vector<double> w = ctx.inputs[3].defined() ? read_f64(ctx.inputs[3]) : std::vector<double>();
  std::vector<double> b = ctx.inputs[4].defined() ? read_f64(ctx.inputs[4]) : std::vector<double>();
  ChannelAffine a;
  for (size_t i = 0; i < size_t(c); ++i) {
    a.mean.push_back(float(m[i]));
    a.scale.push_back(float(1.0 / std::sqrt(v[i] + eps) * (w.empty() ? 1.0 : w[i])));
    a.bias.push_back(b.empty() ? 0.0f : float(b[i]));
  }
  return a;
}

void ref_batch_norm(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  int64_t n = x.size(0), c = x.size(1), inner = prod(x.sizes(), 2, x.dim());
  double eps = ctx.attrs.get_float("eps");
  std::vector<double> v = read_f64(x), out(v.size());
  std::vector<double> m = read_f64(ctx.inputs[1]), var = read_f64(ctx.inputs[2]);
  std::vector<double> w = ctx.inputs[3].defined() ? read_f64(ctx.inputs[3]) : std::vector<double>();
  std::vector<double> b = ctx.inputs[4].defined() ? read_f64(ctx.inputs[4]) : std::vector<double>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t k = 0; k < inner; ++k) {
        size_t at = size_t((i * c + ch) * inner + k);
        double y = (v[at] - m[size_t(ch)]) / std::sqrt(var[size_t(ch)] + eps);
        if (!w.empty()) y *= w[size_t(ch)];
        if (!b.empty()) y += b[size_t(ch)];
        out[at] = y;
      }
  write_f64(ctx.outputs[0], out);
}

void eager_batch_norm(const KernelContext& ctx) {
  const Tensor& x0 = ctx.inputs[0];
  if (x0.dtype() != DType::Float32) return note_kernel_path("reference"), ref_batch_norm(ctx);
  note_kernel_path("f32");
  Tensor x = x0.contiguous();
  int64_t n = x.size(0), c = x.size(1), inner = prod(x.sizes(), 2, x.dim());
  ChannelAffine a = batch_norm_affine(ctx, c);
  const float* xp = x.data<float>();
  float* yp = ctx.outputs[0].data<float>();
  int64_t planes = n * c;
#pragma omp parallel for if (planes * inner > 32768)
  for (int64_t p = 0; p < planes; ++p) {
    size_t ch = size_t(p % c);
    float m = a.mean[ch], s = a.scale[ch], t = a.bias[ch];
    const float* in = xp + p * inner;
    float* out = yp + p * inner;
    for (int64_t k = 0; k < inner; ++k) out[k] = (in[k] - m) * s + t;
  }
}

// [C] -> [C, 1, ..., 1] so it broadcasts against [N, C, ...].
Tensor channel_view(const Tensor& p, int rank, DType cd) {
  std::vector<int64_t> shape(size_t(rank - 1), 1);
  shape[0] = p.size(0);
  return reshape(to_compute(p, cd), shape);
}

TensorList decompose_batch_norm(std::span<const Tensor> in, const Attrs& attrs) {
  const Tensor& x0 = in[0];
  DType cd = compute_dtype(x0.dtype());
  Tensor x = to_compute(x0, cd);
  int r = x.dim();
  Tensor inv = rsqrt(add(channel_view(in[2], r, cd), attrs.get_float("eps")));
  Tensor y = mul(sub(x, channel_view(in[1], r, cd)), inv);
  if (in.size() > 3 && in[3].defined()) y = mul(y, channel_view(in[3], r, cd));
  if (in.size() > 4 && in[4].defined()) y = add(y, channel_view(in[4], r, cd));
  return {to_compute(y, x0.dtype())};
}

// ---- group_norm -------------------------------------------------------------------------------
std::vector<TensorType> infer_group_norm(const InferContext& ctx) {
  const TensorType& x = check_channels_input(ctx);
  int64_t g = ctx.attrs.get_int("num_groups");
  if (g <= 0) ctx.fail("attribute 'num_groups' is {}; expected a positive count", g);
  SymInt c = x.shape[1];
  if (mod(c, SymInt(g)) != SymInt(0))
    ctx.fail("input 'x' has {} channels, which is not {}divisible by num_groups {}", c.str(),
             c.is_symbolic() ? "provably " : "", g);
  const char* what = "the channel dim (1) of 'x'";
  check_param(ctx, 1, "weight", Shape{c}, what);
  check_param(ctx, 2, "bias", Shape{c}, what);
  return same_as_input(ctx);
}

void ref_group_norm(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  int64_t n = x.size(0), c = x.size(1), inner = prod(x.sizes(), 2, x.dim());
  int64_t g = ctx.attrs.get_int("num_groups"), cg = c / g, block = cg * inner;
  double eps = ctx.attrs.get_float("eps");
  std::vector<double> v = read_f64(x), out(v.size());
  std::vector<double> w = ctx.inputs[1].defined() ? read_f64(ctx.inputs[1]) : std::vector<double>();
  std::vector<double> b = ctx.inputs[2].defined() ? read_f64(ctx.inputs[2]) : std::vector<double>();
  for (int64_t blk = 0; blk < n * g; ++blk) {
    const double* in = v.data() + blk * block;
    double mean = 0, var = 0;
    for (int64_t k = 0; k < block; ++k) mean += in[k];
    mean /= double(block);
    for (int64_t k = 0; k < block; ++k) var += (in[k] - mean) * (in[k] - mean);
    var /= double(block);
    double rstd = 1.0 / std::sqrt(var + eps);
    for (int64_t k = 0; k < block; ++k) {
      size_t ch = size_t((blk % g) * cg + k / inner);
      double y = (in[k] - mean) * rstd;
      if (!w.empty()) y *= w[ch];
      if (!b.empty()) y += b[ch];
      out[size_t(blk * block + k)] = y;
    }
  }
  write_f64(ctx.outputs[0], out);
}

void eager_group_norm(const KernelContext& ctx) {
  const Tensor& x0 = ctx.inputs[0];
  if (x0.dtype() != DType::Float32) return note_kernel_path("reference"), ref_group_norm(ctx);
  note_kernel_path("f32");
  Tensor x = x0.contiguous();
  int64_t n = x.size(0), c = x.size(1), inner = prod(x.sizes(), 2, x.dim());
  int64_t g = ctx.attrs.get_int("num_groups"), cg = c / g, block = cg * inner;
  double eps = ctx.attrs.get_float("eps");
  std::vector<float> w = read_f32_param(ctx.inputs[1]), b = read_f32_param(ctx.inputs[2]);
  const float* xp = x.data<float>();
  float* yp = ctx.outputs[0].data<float>();
#pragma omp parallel for if (n * c * inner > 32768)
  for (int64_t blk = 0; blk < n * g; ++blk) {
    const float* in = xp + blk * block;
    float* out = yp + blk * block;
    RowStats st = row_stats_f32(in, block, eps);
    for (int64_t j = 0; j < cg; ++j) {
      size_t ch = size_t((blk % g) * cg + j);
      float s = st.rstd * (w.empty() ? 1.0f : w[ch]);
      float t = b.empty() ? 0.0f : b[ch];
      for (int64_t k = j * inner; k < (j + 1) * inner; ++k)
        out[k] = ((in[k] - st.shift) - st.mean_rel) * s + t;
    }
  }
}

TensorList decompose_group_norm(std::span<const Tensor> in, const Attrs& attrs) {
  const Tensor& x0 = in[0];
  DType cd = compute_dtype(x0.dtype());
  Tensor x = to_compute(x0, cd);
  int64_t n = x.size(0), c = x.size(1), g = attrs.get_int("num_groups");
  int64_t block = (c / g) * prod(x.sizes(), 2, x.dim());
  Tensor xr = reshape(x, {n, g, block});
  Tensor mu = mean(xr, {2}, true);
  Tensor var_ = var(xr, {2}, /*correction=*/0, true);
  Tensor yr = mul(sub(xr, mu), rsqrt(add(var_, attrs.get_float("eps"))));
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  Tensor y = reshape(yr, shape);
  if (in.size() > 1 && in[1].defined()) y = mul(y, channel_view(in[1], x.dim(), cd));
  if (in.size() > 2 && in[2].defined()) y = add(y, channel_view(in[2], x.dim(), cd));
  return {to_compute(y, x0.dtype())};
}

// ---- samples ----------------------------------------------------------------------------------
// [4, 20] with -inf entries as attention masks make them: leading ones (a vector lane that starts
// at -inf and sees finite values later), a pair one vector width apart, a trailing one; no row is
// all -inf (that row is NaN, see the doc).
Tensor masked_rows(Generator& g) {
  Tensor t = sample_randn(g, {4, 20}, 2.0);
  double* p = t.data<double>();
  const double ninf = -std::numeric_limits<double>::infinity();
  for (int j : {0, 1, 2, 3, 4, 5, 6, 7}) p[j] = ninf;
  for (int j : {3, 11}) p[20 + j] = ninf;
  p[40 + 19] = ninf;
  for (int j : {0, 8, 16}) p[60 + j] = ninf;
  return t;
}

std::vector<OpSample> samples_softmax(Generator& g) {
  return {
      {{sample_randn(g, {3, 7}, 2.0)}, {{"dim", int64_t(-1)}}, "[3,7] last dim"},
      {{sample_randn(g, {2, 5, 3}, 2.0)}, {{"dim", int64_t(1)}}, "[2,5,3] middle dim"},
      {{sample_randn(g, {4, 3}, 2.0)}, {{"dim", int64_t(0)}}, "[4,3] dim 0"},
      {{sample_noncontiguous(g, {5, 6})}, {{"dim", int64_t(1)}}, "non-contiguous [5,6]"},
      {{sample_randn(g, {1, 9})}, {{"dim", int64_t(-1)}}, "single row"},
      {{sample_randn(g, {0, 4})}, {{"dim", int64_t(1)}}, "empty [0,4]"},
      {{masked_rows(g)}, {{"dim", int64_t(-1)}}, "-inf entries (a masked attention row)"},
  };
}

Attrs ln_attrs(Ints ns, double eps = 1e-5) {
  return {{"normalized_shape", std::move(ns)}, {"eps", eps}};
}
std::vector<OpSample> samples_layer_norm(Generator& g) {
  return {
      {{sample_randn(g, {3, 8}), sample_randn(g, {8}), sample_randn(g, {8})}, ln_attrs({8}),
       "[3,8] affine"},
      {{sample_randn(g, {2, 3, 4}, 3.0), Tensor(), Tensor()}, ln_attrs({3, 4}),
       "[2,3,4] over 2 dims, no affine"},
      {{sample_randn(g, {4, 6}), sample_randn(g, {6}), Tensor()}, ln_attrs({6}, 1e-3),
       "weight only, eps 1e-3"},
      {{sample_noncontiguous(g, {5, 6}), Tensor(), sample_randn(g, {6})}, ln_attrs({6}),
       "non-contiguous, bias only"},
      {{sample_uniform(g, {2, 16}, 3.0, 5.0), sample_randn(g, {16}), sample_randn(g, {16})},
       ln_attrs({16}), "offset mean"},
  };
}

std::vector<OpSample> samples_batch_norm(Generator& g) {
  auto var = [&](int64_t c) { return sample_uniform(g, {c}, 0.5, 2.0); };
  return {
      {{sample_randn(g, {2, 3, 4, 5}), sample_randn(g, {3}), var(3), sample_randn(g, {3}),
        sample_randn(g, {3})},
       {{"eps", 1e-5}}, "[2,3,4,5] affine"},
      {{sample_randn(g, {4, 6}), sample_randn(g, {6}), var(6), Tensor(), Tensor()}, {},
       "[4,6] no affine"},
      {{sample_randn(g, {1, 4, 3}), sample_randn(g, {4}), var(4), sample_randn(g, {4}),
        Tensor()},
       {{"eps", 1e-3}}, "[1,4,3] weight only"},
      {{sample_noncontiguous(g, {3, 2, 5}), sample_randn(g, {2}), var(2), Tensor(),
        sample_randn(g, {2})},
       {}, "non-contiguous, bias only"},
  };
}

std::vector<OpSample> samples_group_norm(Generator& g) {
  return {
      {{sample_randn(g, {2, 6, 3, 3}), sample_randn(g, {6}), sample_randn(g, {6})},
       {{"num_groups", int64_t(3)}}, "[2,6,3,3] 3 groups affine"},
      {{sample_randn(g, {1, 4, 5}), Tensor(), Tensor()}, {{"num_groups", int64_t(1)}},
       "1 group (layer-norm like)"},
      {{sample_randn(g, {2, 4, 2, 2}), sample_randn(g, {4}), Tensor()},
       {{"num_groups", int64_t(4)}, {"eps", 1e-3}}, "instance-norm like, weight only"},
      {{sample_noncontiguous(g, {2, 4, 3}), Tensor(), sample_randn(g, {4})},
       {{"num_groups", int64_t(2)}}, "non-contiguous, bias only"},
  };
}

}  // namespace

void register_norm_ops() {
  for (OpId id : {OpId::Softmax, OpId::LogSoftmax}) {
    OpDef& d = define_op(id);
    d.doc = id == OpId::Softmax ? "exp(x - max) / sum(exp(x - max)) along dim"
                                : "x - max - log(sum(exp(x - max))) along dim";
    d.inputs = {{"x"}};
    d.attrs = {{"dim", AttrType::Int, {}}};
    d.infer = infer_softmax;
    d.reference = ref_softmax;
    d.decompose = id == OpId::Softmax ? decompose_softmax : decompose_log_softmax;
    d.eager_cpu = eager_softmax;
    d.dtypes = float_dtypes();
    d.samples = samples_softmax;
    d.onnx_ops = {id == OpId::Softmax ? "Softmax" : "LogSoftmax"};
  }

  OpDef& ln = define_op(OpId::LayerNorm);
  ln.doc = "normalize over the trailing normalized_shape dims: (x - mean) / sqrt(var + eps) * "
           "weight + bias (biased variance)";
  ln.inputs = {{"x"}, {"weight", true}, {"bias", true}};
  ln.attrs = {{"normalized_shape", AttrType::Ints, {}}, {"eps", AttrType::Float, 1e-5}};
  ln.infer = infer_layer_norm;
  ln.reference = ref_layer_norm;
  ln.decompose = decompose_layer_norm;
  ln.eager_cpu = eager_layer_norm;
  ln.dtypes = float_dtypes();
  ln.samples = samples_layer_norm;
  ln.onnx_ops = {"LayerNormalization"};

  OpDef& bn = define_op(OpId::BatchNorm);
  bn.doc = "inference batch norm over dim 1 with running statistics: (x - mean) / sqrt(var + "
           "eps) * weight + bias";
  bn.inputs = {{"x"}, {"running_mean"}, {"running_var"}, {"weight", true}, {"bias", true}};
  bn.attrs = {{"eps", AttrType::Float, 1e-5}};
  bn.infer = infer_batch_norm;
  bn.reference = ref_batch_norm;
  bn.decompose = decompose_batch_norm;
  bn.eager_cpu = eager_batch_norm;
  bn.dtypes = float_dtypes();
  bn.samples = samples_batch_norm;
  bn.onnx_ops = {"BatchNormalization"};

  OpDef& gn = define_op(OpId::GroupNorm);
  gn.doc = "normalize [N, C, ...] over groups of C/num_groups channels, then per-channel "
           "weight and bias";
  gn.inputs = {{"x"}, {"weight", true}, {"bias", true}};
  gn.attrs = {{"num_groups", AttrType::Int, {}}, {"eps", AttrType::Float, 1e-5}};
  gn.infer = infer_group_norm;
  gn.reference = ref_group_norm;
  gn.decompose = decompose_group_norm;
  gn.eager_cpu = eager_group_norm;
  gn.dtypes = float_dtypes();
  gn.samples = samples_group_norm;
  gn.onnx_ops = {"GroupNormalization"};
}

}  // namespace kiln
