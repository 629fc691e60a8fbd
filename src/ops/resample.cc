// Resampling: upsample (nearest, bilinear) and grid_sample (bilinear, zeros padding), NCHW.
//
// Note [Resample coordinates]
// Both ops follow PyTorch exactly, so that models exported from PyTorch match it:
//   - upsample nearest (PyTorch "nearest", not "nearest-exact"): src = min(floor(dst * s), in-1)
//     with s = 1/scale when a scale is given and in/out otherwise, computed in float32 as
//     PyTorch does (out == in and out == 2*in are exact shortcuts);
//   - upsample bilinear: align_corners: src = dst * (in-1)/(out-1) (0 when out == 1); otherwise
//     src = max((dst + 0.5) * s - 0.5, 0) with s as above. i0 = min(floor(src), in-1),
//     i1 = i0 + (i0 < in-1), weight of i1 = clamp(src - i0, 0, 1);
//   - grid_sample: x = ((gx + 1) / 2) * (W - 1) (align_corners) or ((gx + 1) * W - 1) / 2, the
//     same for y; bilinear over the 4 neighbours, out-of-range neighbours contribute 0.
// When size and scales are both given, size fixes the output and scales drive the coordinate
// map (ATen's upsample_*2d(size, scales) contract); with scales only, out = floor(in * scale).
//
// The reference kernels compute in float64. Eager: nearest is pure data movement and its one
// byte-copying kernel serves every dtype; bilinear has a float32 contiguous fast path (upsampling
// sits in every FPN/U-Net decoder); grid_sample's float32 eager reuses the reference (not a hot
// path yet; deformable attention in wave 3 will want a fast one).
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>

#include "core/resample.h"
#include "ops/kernel_path.h"
#include "ops/kernel_util.h"

namespace kiln {
namespace {

// ---- upsample --------------------------------------------------------------------------------
enum class UpMode { Nearest, Bilinear };

std::optional<UpMode> parse_up_mode(const std::string& s) {
  if (s == "nearest") return UpMode::Nearest;
  if (s == "bilinear") return UpMode::Bilinear;
  return std::nullopt;
}

std::vector<TensorType> infer_upsample(const InferContext& ctx) {
  const TensorType& x = ctx.in(0);
  const std::string& mode_name = ctx.attrs.get_string("mode");
  std::optional<UpMode> mode = parse_up_mode(mode_name);
  if (!mode) ctx.fail("mode \"{}\" is not one of \"nearest\", \"bilinear\"", mode_name);
  if (x.rank() != 4) ctx.fail("x must be 4-D NCHW, got shape {}", to_string(x.shape));
  if (*mode == UpMode::Bilinear && !is_floating(x.dtype))
    ctx.fail("bilinear mode needs a floating dtype, got {}", dtype_name(x.dtype));
  if (*mode == UpMode::Nearest && is_bool(x.dtype))
    ctx.fail("x is bool; upsample needs a numeric dtype");
  if (*mode == UpMode::Nearest && ctx.attrs.get_bool("align_corners"))
    ctx.fail("align_corners applies to bilinear mode only");
  Shape size = ctx.attrs.get_shape("size");
  Floats scales = ctx.attrs.get_floats("scales");
  if (!size.empty() && size.size() != 2)
    ctx.fail("size {} must have 2 entries (H, W) or none", to_string(size));
  if (!scales.empty() && scales.size() != 2)
    ctx.fail("scales {} must have 2 entries (H, W) or none", attr_value_str(scales));
  if (size.empty() && scales.empty()) ctx.fail("needs size or scales");
  // Finite and below 2^31 per axis, so that in * scale stays an exact, representable size
  // (an infinite or huge scale must be an error, not an overflowing float->int conversion).
  for (double s : scales)
    if (!(s > 0) || !(s < 2147483648.0))
      ctx.fail("scales {} must be positive and finite (below 2^31)", attr_value_str(scales));
  Shape out = x.shape;
  for (int i = 0; i < 2; ++i) {
    SymInt in = x.shape[2 + i];
    if (in.is_concrete() && in.value() <= 0)
      ctx.fail("input spatial size {} must be positive (input {})", to_string(x.shape), in.value());
    SymInt o;
    if (!size.empty()) {
      o = size[i];
    } else if (in.is_concrete()) {
      double scaled = std::floor(double(in.value()) * scales[i]);
      if (!(scaled < 9.0e15))  // beyond exact doubles: no tensor has such a dimension
        ctx.fail("output spatial size {} x {} is too large", in.value(), scales[i]);
      o = int64_t(scaled);
    } else if (scales[i] == std::floor(scales[i])) {
      o = in * SymInt(int64_t(scales[i]));
    } else {
      fail_kind(ErrorKind::NotSupported, "{}: symbolic input size {} with the non-integer scale "
                "{} gives a size Kiln cannot express; pass size instead", ctx.where(), in.str(),
                scales[i]);
    }
    if (o.is_concrete() && o.value() <= 0)
      ctx.fail("output spatial size {} must be positive (input {}, size {}, scales {})",
               o.value(), to_string(x.shape), to_string(size), attr_value_str(scales));
    out[2 + i] = o;
  }
  return {TensorType(x.dtype, out, x.device)};
}

using resample::LinearTap;
using resample::linear_table;
using resample::nearest_table;

void upsample_nearest(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& out = ctx.outputs[0];
  if (out.numel() == 0) return;
  const Floats scales = ctx.attrs.get_floats("scales");
  const int64_t H = x.sizes()[2], W = x.sizes()[3], Ho = out.sizes()[2], Wo = out.sizes()[3];
  std::vector<int64_t> hs = nearest_table(H, Ho, scales, 0), ws = nearest_table(W, Wo, scales, 1);
  const int64_t es = x.element_size();
  const Dims& xs = x.strides();
  const char* xp = static_cast<const char*>(x.raw_data());
  char* op = static_cast<char*>(out.raw_data());
  const int64_t planes = out.sizes()[0] * out.sizes()[1], C = out.sizes()[1];
#pragma omp parallel for if (out.numel() > 65536)
  for (int64_t p = 0; p < planes; ++p)
    resample::nearest_plane(xp + ((p / C) * xs[0] + (p % C) * xs[1]) * es, xs[2], xs[3],
                            op + p * Ho * Wo * es, es, hs, ws);
}

// Bilinear in float64 (the reference).
void upsample_bilinear_ref(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& out = ctx.outputs[0];
  if (out.numel() == 0) return;
  const Floats scales = ctx.attrs.get_floats("scales");
  const bool ac = ctx.attrs.get_bool("align_corners");
  const int64_t H = x.sizes()[2], W = x.sizes()[3], Ho = out.sizes()[2], Wo = out.sizes()[3];
  std::vector<LinearTap> hs = linear_table(H, Ho, ac, scales, 0);
  std::vector<LinearTap> ws = linear_table(W, Wo, ac, scales, 1);
  const int64_t es = x.element_size();
  const Dims& xs = x.strides();
  const DType dt = x.dtype();
  const char* xp = static_cast<const char*>(x.raw_data());
  char* op = static_cast<char*>(out.raw_data());
  const int64_t planes = out.sizes()[0] * out.sizes()[1], C = out.sizes()[1];
  for (int64_t p = 0; p < planes; ++p)
    resample::bilinear_plane_f64(xp + ((p / C) * xs[0] + (p % C) * xs[1]) * es, xs[2], xs[3],
                                 op + p * Ho * Wo * es, dt, hs, ws);
}

void ref_upsample(const KernelContext& ctx) {
  if (*parse_up_mode(ctx.attrs.get_string("mode")) == UpMode::Nearest) return upsample_nearest(ctx);
  upsample_bilinear_ref(ctx);
}

// Bilinear float32 fast path (contiguous input): same taps, float arithmetic, planes in parallel.
void upsample_bilinear_f32(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& out = ctx.outputs[0];
  if (out.numel() == 0) return;
  const Floats scales = ctx.attrs.get_floats("scales");
  const bool ac = ctx.attrs.get_bool("align_corners");
  const int64_t H = x.sizes()[2], W = x.sizes()[3], Ho = out.sizes()[2], Wo = out.sizes()[3];
  std::vector<LinearTap> hs = linear_table(H, Ho, ac, scales, 0);
  std::vector<LinearTap> ws = linear_table(W, Wo, ac, scales, 1);
  const resample::WidthTaps wt = resample::width_taps(ws);
  const float* xp = x.data<float>();
  float* op = out.data<float>();
  const int64_t planes = out.sizes()[0] * out.sizes()[1];
  // Separably (resample::bilinear_plane_f32): the direct formula gathered four taps per output
  // element (deeplabv3's 8x upsample: 25x its roofline, `kiln profile`).
#pragma omp parallel if (out.numel() > 65536)
  {
    std::vector<float> cache(size_t(2 * Wo));
#pragma omp for
    for (int64_t p = 0; p < planes; ++p)
      resample::bilinear_plane_f32(xp + p * H * W, W, op + p * Ho * Wo, hs, wt, cache.data());
  }
}

void eager_upsample(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  if (*parse_up_mode(ctx.attrs.get_string("mode")) == UpMode::Bilinear &&
      x.dtype() == DType::Float32 && x.is_contiguous())
    return note_kernel_path("f32"), upsample_bilinear_f32(ctx);
  note_kernel_path("reference");
  ref_upsample(ctx);
}

// ---- grid_sample -----------------------------------------------------------------------------
std::vector<TensorType> infer_grid_sample(const InferContext& ctx) {
  const TensorType& x = ctx.in(0);
  const TensorType& grid = ctx.in(1);
  if (!is_floating(x.dtype)) ctx.fail("x must be a floating dtype, got {}", dtype_name(x.dtype));
  if (grid.dtype != x.dtype)
    ctx.fail("grid has dtype {} but x has {}; they must match", dtype_name(grid.dtype),
             dtype_name(x.dtype));
  if (x.rank() != 4) ctx.fail("x must be 4-D NCHW, got shape {}", to_string(x.shape));
  if (grid.rank() != 4 || grid.shape[3] != SymInt(2))
    ctx.fail("grid must be [N, H_out, W_out, 2], got shape {}", to_string(grid.shape));
  if (grid.shape[0] != x.shape[0])  // must hold for every value of a symbolic batch
    ctx.fail("grid has batch {} (shape {}) but x has {} (shape {})", grid.shape[0].str(),
             to_string(grid.shape), x.shape[0].str(), to_string(x.shape));
  return {TensorType(x.dtype, Shape{x.shape[0], x.shape[1], grid.shape[1], grid.shape[2]},
                     x.device)};
}

double unnormalize(double g, int64_t size, bool align_corners) {
  return align_corners ? (g + 1) / 2 * double(size - 1) : ((g + 1) * double(size) - 1) / 2;
}

void ref_grid_sample(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const Tensor& grid = ctx.inputs[1];
  Tensor& out = ctx.outputs[0];
  const bool ac = ctx.attrs.get_bool("align_corners");
  const int64_t N = x.sizes()[0], C = x.sizes()[1], H = x.sizes()[2], W = x.sizes()[3];
  const int64_t Ho = grid.sizes()[1], Wo = grid.sizes()[2];
  const DType dt = x.dtype();
  const int64_t es = x.element_size();
  const Dims &xs = x.strides(), &gs = grid.strides(), &os = out.strides();
  const char* xp = elem_ptr(x, 0);
  const char* gp = elem_ptr(grid, 0);
  char* op = elem_ptr(out, 0);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < Ho; ++h)
      for (int64_t w = 0; w < Wo; ++w) {
        const char* g = gp + (n * gs[0] + h * gs[1] + w * gs[2]) * es;
        double ix = unnormalize(load_f64(g, dt), W, ac);
        double iy = unnormalize(load_f64(g + gs[3] * es, dt), H, ac);
        bool is_nan = std::isnan(ix) || std::isnan(iy);
        // Far outside, every neighbour is out of range; clamping keeps floor() in int64 range
        // (inf included) without changing the result.
        ix = std::min(std::max(ix, -2.0), double(W) + 1);
        iy = std::min(std::max(iy, -2.0), double(H) + 1);
        int64_t x0 = is_nan ? 0 : int64_t(std::floor(ix)), y0 = is_nan ? 0 : int64_t(std::floor(iy));
        double wx1 = ix - double(x0), wy1 = iy - double(y0);
        struct Tap {
          int64_t y, x;
          double weight;
        } taps[4] = {{y0, x0, (1 - wy1) * (1 - wx1)}, {y0, x0 + 1, (1 - wy1) * wx1},
                     {y0 + 1, x0, wy1 * (1 - wx1)}, {y0 + 1, x0 + 1, wy1 * wx1}};
        for (int64_t c = 0; c < C; ++c) {
          double acc = 0;
          for (const Tap& t : taps)
            if (t.y >= 0 && t.y < H && t.x >= 0 && t.x < W)
              acc += t.weight * load_f64(xp + (n * xs[0] + c * xs[1] + t.y * xs[2] + t.x * xs[3]) * es, dt);
          store_f64(op + (n * os[0] + c * os[1] + h * os[2] + w * os[3]) * es, dt,
                    is_nan ? nan : acc);
        }
      }
}

// ---- samples ---------------------------------------------------------------------------------
Attrs up_attrs(Ints size, Floats scales, const char* mode, bool align_corners = false) {
  return {{"size", size}, {"scales", scales}, {"mode", std::string(mode)},
          {"align_corners", align_corners}};
}

std::vector<OpSample> samples_upsample(Generator& g) {
  return {
      {{sample_randn(g, {1, 2, 3, 4})}, up_attrs({6, 8}, {}, "nearest"), "nearest 2x by size"},
      {{sample_randn(g, {2, 3, 3, 4})}, up_attrs({5, 7}, {}, "nearest"), "nearest 3x4 -> 5x7"},
      {{sample_randn(g, {1, 2, 5, 7})}, up_attrs({2, 3}, {}, "nearest"), "nearest downsample"},
      {{sample_randn(g, {1, 2, 3, 4})}, up_attrs({}, {2.0, 3.0}, "nearest"), "nearest scales"},
      {{sample_randn(g, {1, 1, 4, 6})}, up_attrs({}, {1.5, 0.5}, "nearest"),
       "nearest fractional scales"},
      {{sample_randn(g, {1, 2, 4, 5})}, up_attrs({7, 9}, {}, "bilinear"),
       "bilinear, align_corners false"},
      {{sample_randn(g, {1, 2, 4, 5})}, up_attrs({7, 9}, {}, "bilinear", true),
       "bilinear, align_corners true"},
      {{sample_randn(g, {2, 1, 3, 3})}, up_attrs({}, {2.0, 2.0}, "bilinear"), "bilinear scales"},
      {{sample_randn(g, {1, 2, 6, 8})}, up_attrs({4, 3}, {}, "bilinear"), "bilinear downsample"},
      {{sample_randn(g, {1, 2, 3, 4})}, up_attrs({1, 5}, {}, "bilinear", true),
       "bilinear align_corners, output size 1"},
      {{sample_noncontiguous(g, {2, 3, 4, 3})}, up_attrs({8, 5}, {}, "bilinear"),
       "bilinear non-contiguous"},
      {{sample_noncontiguous(g, {2, 3, 4, 3})}, up_attrs({6, 6}, {}, "nearest"),
       "nearest non-contiguous"},
      {{sample_randn(g, {1, 1, 1, 1})}, up_attrs({3, 2}, {}, "bilinear"), "1x1 input"},
      {{sample_randn(g, {0, 2, 3, 3})}, up_attrs({6, 6}, {}, "nearest"), "empty batch"},
      // Over 65536 outputs: the planes in parallel, each thread with its cached rows.
      {{sample_randn(g, {1, 9, 20, 24})}, up_attrs({}, {4.0, 4.0}, "bilinear"),
       "bilinear 4x, planes in parallel"},
      {{sample_randn(g, {1, 9, 40, 48})}, up_attrs({80, 96}, {}, "nearest"),
       "nearest 2x, planes in parallel"},
  };
}

Tensor sample_grid(Generator& g, int64_t n, int64_t h, int64_t w) {
  // A little beyond [-1, 1] so that zeros padding is exercised.
  return sample_uniform(g, {n, h, w, 2}, -1.2, 1.2);
}

// Coordinates far outside [-1, 1] (every tap out of range), on the border, and infinite or NaN
// (NaN gives NaN; an infinity reads nothing and gives 0).
Tensor sample_grid_extreme(Generator& g, int64_t n, int64_t h, int64_t w) {
  Tensor t = sample_uniform(g, {n, h, w, 2}, -3.0, 3.0);
  double* p = t.data<double>();
  const int64_t count = t.numel();
  const double special[] = {1.0, -1.0, 1e9, -1e9, std::numeric_limits<double>::infinity(),
                            -std::numeric_limits<double>::infinity(),
                            std::numeric_limits<double>::quiet_NaN()};
  for (size_t i = 0; i < std::size(special) && int64_t(3 * i + 1) < count; ++i)
    p[3 * i + 1] = special[i];
  return t;
}

std::vector<OpSample> samples_grid_sample(Generator& g) {
  return {
      {{sample_randn(g, {2, 3, 4, 5}), sample_grid_extreme(g, 2, 3, 6)},
       {{"align_corners", false}}, "coordinates far out of range, on the border, inf and NaN"},
      {{sample_randn(g, {1, 2, 3, 4}), sample_grid_extreme(g, 1, 4, 5)},
       {{"align_corners", true}}, "align_corners true, extreme coordinates"},
      {{sample_randn(g, {2, 3, 5, 6}), sample_grid(g, 2, 4, 7)}, {{"align_corners", false}},
       "align_corners false"},
      {{sample_randn(g, {2, 3, 5, 6}), sample_grid(g, 2, 4, 7)}, {{"align_corners", true}},
       "align_corners true"},
      {{sample_noncontiguous(g, {1, 2, 4, 4}), sample_grid(g, 1, 3, 3)},
       {{"align_corners", false}}, "non-contiguous x"},
      {{sample_randn(g, {1, 2, 1, 1}), sample_grid(g, 1, 2, 3)}, {{"align_corners", false}},
       "1x1 input"},
      {{sample_randn(g, {1, 2, 3, 3}), sample_grid(g, 1, 0, 3)}, {{"align_corners", true}},
       "empty output"},
  };
}

}  // namespace

void register_resample_ops() {
  OpDef& up = define_op(OpId::Upsample);
  up.doc = "NCHW resize to size (or in*scales): nearest (PyTorch 'nearest') or bilinear "
           "(align_corners); see Note [Resample coordinates]";
  up.inputs = {{"x"}};
  up.attrs = {{"size", AttrType::Ints, Ints{}},
              {"scales", AttrType::Floats, Floats{}},
              {"mode", AttrType::String, std::string("nearest")},
              {"align_corners", AttrType::Bool, false}};
  up.infer = infer_upsample;
  up.reference = ref_upsample;
  up.eager_cpu = eager_upsample;
  up.dtypes = float_dtypes();
  up.samples = samples_upsample;
  up.onnx_ops = {"Resize", "Upsample"};

  OpDef& gs = define_op(OpId::GridSample);
  gs.doc = "sample x [N,C,H,W] at grid [N,Ho,Wo,2] (x, y in [-1, 1]); bilinear, zeros padding";
  gs.inputs = {{"x"}, {"grid"}};
  gs.attrs = {{"align_corners", AttrType::Bool, false}};
  gs.infer = infer_grid_sample;
  gs.reference = ref_grid_sample;
  gs.dtypes = float_dtypes();
  gs.samples = samples_grid_sample;
  gs.onnx_ops = {"GridSample"};
}

}  // namespace kiln
