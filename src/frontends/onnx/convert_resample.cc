// ONNX Resize / Upsample and GridSample. See Note [ONNX resize].
//
// Note [ONNX resize]
// Resize along one axis is a fixed linear map from the input positions to the output positions
// that depends only on the sizes and attributes, so it is computed at import time:
//   - nearest: an index per output position (index_select along the axis, exact);
//   - linear / cubic: a [out, in] weight matrix (matmul along the axis, the axis moved last);
// with ONNX's coordinate transformations (half_pixel, pytorch_half_pixel, align_corners,
// asymmetric, tf_half_pixel_for_nn, tf_crop_and_resize with extrapolation_value), nearest
// rounding modes, cubic_coeff_a and exclude_outside, following the ONNX reference: neighbours
// of x are floor(x) (+1 for linear, -1..+2 for cubic) with ratio x - floor(x) (1 when x is an
// integer), out-of-range neighbours read the edge. N-D resizing is the product of the per-axis
// maps. When the map is what Kiln's upsample op computes (NCHW, H/W only, bilinear with
// align_corners or half-pixel, or nearest with power-of-two factors), the upsample op is used.
// Opset 18 adds `axes` (the others keep their size), keep_aspect_ratio_policy (one scale for
// all resized axes, sizes rounded half up) and antialias (the linear/cubic kernel stretched by
// 1/scale when downsampling, over 2 - 2 * (floor(-support / scale) + 1) taps, normalized);
// opset 19 adds half_pixel_symmetric coordinates. All of them only change the per-axis maps.
#include <algorithm>
#include <cmath>
#include <limits>

#include "frontends/onnx/convert.h"

namespace kiln::onnx {
namespace {

struct ResizeAttrs {
  std::string mode = "nearest";  // nearest | linear | cubic
  std::string coord = "half_pixel";
  std::string nearest_mode = "round_prefer_floor";
  double cubic_a = -0.75;
  bool exclude_outside = false;
  double extrapolation = 0.0;
  bool antialias = false;  // opset 18: linear/cubic filters widened by 1/scale when downsampling
};

// Source coordinate of output position x (ONNX reference semantics); out_int is the integer
// output size.
double source_coord(const ResizeAttrs& a, double x, int64_t in, int64_t out_int, double scale,
                    double roi_start, double roi_end) {
  // The reference maps coordinates with the unrounded output extent in * scale (equal to the
  // output size when sizes are given).
  double out = double(in) * scale;
  const std::string& m = a.coord;
  if (m == "half_pixel_symmetric") {  // opset 19: the ROI's center maps to the output's center
    double offset = double(in) / 2 * (1 - double(out_int) / out);
    return offset + (x + 0.5) / scale - 0.5;
  }
  if (m == "align_corners") return out == 1 ? 0.0 : x * double(in - 1) / double(out - 1);
  if (m == "asymmetric") return x / scale;
  if (m == "tf_crop_and_resize") {
    double span = (roi_end - roi_start) * double(in - 1);
    return (out == 1 ? span / 2 : x * span / double(out - 1)) + roi_start * double(in - 1);
  }
  if (m == "pytorch_half_pixel") return out == 1 ? -0.5 : (x + 0.5) / scale - 0.5;
  if (m == "half_pixel") return (x + 0.5) / scale - 0.5;
  if (m == "tf_half_pixel_for_nn") return (x + 0.5) / scale;
  return x / scale;
}

std::vector<double> cubic_coeffs(double r, double A) {
  double s = r + 1, t = 1 - r, u = 2 - r;
  return {((A * s - 5 * A) * s + 8 * A) * s - 4 * A, ((A + 2) * r - (A + 3)) * r * r + 1,
          ((A + 2) * t - (A + 3)) * t * t + 1, ((A * u - 5 * A) * u + 8 * A) * u - 4 * A};
}

struct AxisMap {
  std::vector<int64_t> nearest;  // nearest: source index per output position
  std::vector<double> weights;   // linear/cubic: [out, in] row-major
  std::vector<bool> outside;     // tf_crop_and_resize: output position extrapolated
  bool identity = true;
};

AxisMap axis_map(NodeCtx& c, const ResizeAttrs& a, int64_t in, int64_t out, double scale,
                 double roi_start, double roi_end) {
  AxisMap m;
  m.outside.assign(size_t(out), false);
  bool nearest = a.mode == "nearest";
  if (nearest) m.nearest.resize(size_t(out));
  else m.weights.assign(size_t(out * in), 0.0);
  for (int64_t x = 0; x < out; ++x) {
    double xo = source_coord(a, double(x), in, out, scale, roi_start, roi_end);
    if (a.coord == "tf_crop_and_resize" && (xo < 0 || xo > double(in - 1))) {
      m.outside[size_t(x)] = true;
      m.identity = false;
      if (nearest) m.nearest[size_t(x)] = 0;
      continue;
    }
    double fl = std::floor(xo);
    bool integral = xo == fl;
    double ratio = integral ? 1.0 : xo - fl;
    int64_t base = int64_t(integral ? xo - 1 : fl);  // the left neighbour
    auto clampi = [&](int64_t i) { return std::clamp<int64_t>(i, 0, in - 1); };
    if (nearest) {
      bool right;
      const std::string& nm = a.nearest_mode;
      if (integral) right = true;
      else if (nm == "round_prefer_floor") right = ratio > 0.5;
      else if (nm == "round_prefer_ceil") right = ratio >= 0.5;
      else if (nm == "floor") right = false;
      else if (nm == "ceil") right = true;
      else c.fail("nearest_mode must be round_prefer_floor, round_prefer_ceil, floor or ceil, got \"{}\"", nm);
      m.nearest[size_t(x)] = clampi(right ? base + 1 : base);
      m.identity &= m.nearest[size_t(x)] == x && in == out;
      continue;
    }
    std::vector<double> coeffs;
    int64_t first;
    if (a.antialias) {
      // The reference's antialias filters: the kernel stretched by 1/scale (scale capped at 1)
      // over taps base + start .. base - start + 1, normalized to sum 1.
      double sc = std::min(scale, 1.0);
      bool linear = a.mode == "linear";
      int64_t start = int64_t(std::floor((linear ? -1.0 : -2.0) / sc)) + 1;
      int64_t taps = 2 - 2 * start;
      double sum = 0;
      for (int64_t j = 0; j < taps; ++j) {
        double t = std::fabs(sc * (double(start + j) - ratio)), w;
        if (linear) w = std::clamp(1 - t, 0.0, 1.0);
        else if (t <= 1) w = ((a.cubic_a + 2) * t - (a.cubic_a + 3)) * t * t + 1;
        else if (t < 2) w = ((a.cubic_a * t - 5 * a.cubic_a) * t + 8 * a.cubic_a) * t - 4 * a.cubic_a;
        else w = 0;
        coeffs.push_back(w);
        sum += w;
      }
      if (sum != 0)
        for (double& w : coeffs) w /= sum;
      first = base + start;
    } else if (a.mode == "linear") {
      coeffs = {1 - ratio, ratio};
      first = base;
    } else {
      coeffs = cubic_coeffs(ratio, a.cubic_a);
      first = base - 1;
    }
    if (a.exclude_outside) {
      double sum = 0;
      for (size_t k = 0; k < coeffs.size(); ++k) {
        int64_t i = first + int64_t(k);
        if (i < 0 || i >= in) coeffs[k] = 0;
        sum += coeffs[k];
      }
      if (sum != 0)
        for (double& w : coeffs) w /= sum;
    }
    for (size_t k = 0; k < coeffs.size(); ++k)
      m.weights[size_t(x * in + clampi(first + int64_t(k)))] += coeffs[k];
  }
  if (!nearest) {
    m.identity = in == out;
    for (int64_t x = 0; m.identity && x < out; ++x)
      for (int64_t i = 0; i < in; ++i)
        m.identity &= m.weights[size_t(x * in + i)] == (i == x ? 1.0 : 0.0);
  }
  return m;
}

// Applies the per-axis maps to x ([..] of rank r, sizes `in`), axis by axis.
V apply_maps(NodeCtx& c, V x, const std::vector<AxisMap>& maps, const Dims& in, const Dims& out,
             const ResizeAttrs& a) {
  int r = int(in.size());
  V y = x;
  DType dt = c.dtype(x);
  bool any_outside = false;
  for (int ax = 0; ax < r; ++ax) {
    const AxisMap& m = maps[size_t(ax)];
    if (m.identity) continue;
    for (bool o : m.outside) any_outside |= o;
    if (a.mode == "nearest") {
      V idx = c.constant(Tensor::from_vector(m.nearest, Dims{out[size_t(ax)]}));
      y = c.op1(OpId::IndexSelect, {y, idx}, {{"dim", int64_t(ax)}});
      continue;
    }
    // Weights as [in, out] for x_last @ W.
    Tensor w = Tensor::empty(Dims{in[size_t(ax)], out[size_t(ax)]}, DType::Float64);
    double* p = w.data<double>();
    for (int64_t o = 0; o < out[size_t(ax)]; ++o)
      for (int64_t i = 0; i < in[size_t(ax)]; ++i)
        p[i * out[size_t(ax)] + o] = m.weights[size_t(o * in[size_t(ax)] + i)];
    std::vector<int64_t> perm = NodeCtx::perm_to_last(r, ax);
    V moved = c.permute(y, perm);
    V prod = c.op1(OpId::Matmul, {moved, c.constant(w.to(dt))});
    y = c.permute(prod, NodeCtx::inverse_perm(perm));
  }
  if (any_outside) {
    // Positions extrapolated along any axis take extrapolation_value.
    Tensor mask = Tensor::zeros(out, DType::Bool);
    bool* p = mask.data<bool>();
    int64_t n = numel(out);
    for (int64_t flat = 0; flat < n; ++flat) {
      int64_t rem = flat;
      bool o = false;
      for (int ax = r - 1; ax >= 0; --ax) {
        int64_t i = rem % out[size_t(ax)];
        rem /= out[size_t(ax)];
        o |= maps[size_t(ax)].outside.size() ? bool(maps[size_t(ax)].outside[size_t(i)]) : false;
      }
      p[flat] = o;
    }
    y = c.op1(OpId::Where, {c.constant(mask), c.scalar(a.extrapolation, dt), y});
  }
  return y;
}

bool power_of_two_factor(int64_t in, int64_t out) {
  if (out < in || out % in != 0) return false;
  int64_t f = out / in;
  return (f & (f - 1)) == 0;
}

// Resize-18 `axes`: scales/sizes/roi given for some axes only; the others keep their size.
void expand_to_axes(NodeCtx& c, const std::vector<int64_t>& axes, const Dims& in,
                    std::vector<double>& scales, std::vector<int64_t>& sizes,
                    std::vector<double>& roi) {
  int r = int(in.size());
  size_t n = axes.size();
  std::vector<int64_t> ax;
  for (int64_t a : axes) {
    int64_t d = c.axis(a, r, "axis");
    if (std::find(ax.begin(), ax.end(), d) != ax.end()) c.fail("axis {} appears twice in axes", a);
    ax.push_back(d);
  }
  if (!scales.empty()) {
    if (scales.size() != n) c.fail("scales has {} entries for {} axes", scales.size(), n);
    std::vector<double> full(size_t(r), 1.0);
    for (size_t k = 0; k < n; ++k) full[size_t(ax[k])] = scales[k];
    scales = full;
  }
  if (!sizes.empty()) {
    if (sizes.size() != n) c.fail("sizes has {} entries for {} axes", sizes.size(), n);
    std::vector<int64_t> full(in.begin(), in.end());
    for (size_t k = 0; k < n; ++k) full[size_t(ax[k])] = sizes[k];
    sizes = full;
  }
  if (!roi.empty()) {
    if (roi.size() != 2 * n) c.fail("roi has {} entries for {} axes", roi.size(), n);
    std::vector<double> full(size_t(r), 0.0);
    full.resize(size_t(2 * r), 1.0);
    for (size_t k = 0; k < n; ++k) {
      full[size_t(ax[k])] = roi[k];
      full[size_t(ax[k] + r)] = roi[k + n];
    }
    roi = full;
  }
}

void resize(NodeCtx& c, V x, const ResizeAttrs& a, std::vector<double> scales,
            std::vector<int64_t> sizes, std::vector<double> roi,
            const std::optional<std::vector<int64_t>>& axes = std::nullopt,
            const std::string& keep_aspect = "stretch") {
  if (a.mode != "nearest" && a.mode != "linear" && a.mode != "cubic")
    c.fail("mode must be nearest, linear or cubic, got \"{}\"", a.mode);
  if (a.antialias && a.mode == "nearest") c.fail("antialias applies to linear and cubic modes only");
  static const char* kCoords[] = {"half_pixel", "pytorch_half_pixel", "align_corners",
                                  "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize",
                                  "half_pixel_symmetric"};
  bool known_coord = false;
  for (const char* m : kCoords) known_coord |= a.coord == m;
  if (!known_coord || (a.coord == "half_pixel_symmetric" && c.opset() < 19))
    c.fail("coordinate_transformation_mode \"{}\" is not an ONNX mode (opset {})", a.coord,
           c.opset());
  Dims in = c.dims(x, "input 'X'");
  int r = int(in.size());
  // The axes being resized (all, or Resize-18's `axes`).
  std::vector<int64_t> resized;
  if (axes) {
    expand_to_axes(c, *axes, in, scales, sizes, roi);
    for (int64_t ax : *axes) resized.push_back(c.axis(ax, r, "axis"));
  } else {
    for (int i = 0; i < r; ++i) resized.push_back(i);
  }
  Dims out;
  if (!sizes.empty()) {
    if (int(sizes.size()) != r) c.fail("sizes has {} entries for a rank-{} input", sizes.size(), r);
    scales.clear();
    for (int i = 0; i < r; ++i) {
      if (sizes[size_t(i)] < 1) c.fail("sizes must be >= 1");
      out.push_back(sizes[size_t(i)]);
      scales.push_back(double(sizes[size_t(i)]) / double(in[size_t(i)]));
    }
    if (keep_aspect != "stretch") {
      // Resize-18: one scale for every resized axis, the smallest (not_larger) or the largest
      // (not_smaller); the sizes follow it, rounded half up.
      if (keep_aspect != "not_larger" && keep_aspect != "not_smaller")
        c.fail("keep_aspect_ratio_policy must be stretch, not_larger or not_smaller, got \"{}\"",
               keep_aspect);
      double sc = keep_aspect == "not_larger" ? INFINITY : 0.0;
      for (int64_t ax : resized)
        sc = keep_aspect == "not_larger" ? std::min(sc, scales[size_t(ax)])
                                         : std::max(sc, scales[size_t(ax)]);
      for (int64_t ax : resized) {
        scales[size_t(ax)] = sc;
        out[size_t(ax)] = int64_t(sc * double(in[size_t(ax)]) + 0.5);
        if (out[size_t(ax)] < 1) c.fail("keep_aspect_ratio_policy leaves dim {} empty", ax);
      }
    }
  } else {
    if (int(scales.size()) != r) c.fail("scales has {} entries for a rank-{} input", scales.size(), r);
    for (int i = 0; i < r; ++i) {
      if (!(scales[size_t(i)] > 0)) c.fail("scales must be > 0, got {}", scales[size_t(i)]);
      out.push_back(int64_t(std::floor(double(in[size_t(i)]) * scales[size_t(i)])));
      if (out.back() < 1) c.fail("scale {} leaves dim {} empty", scales[size_t(i)], i);
    }
  }
  {
    int64_t n = 1;
    for (int64_t d : out) {
      if (n > c.options().max_tensor_bytes / dtype_size(c.dtype(x)) / d)
        c.fail("output {} exceeds the tensor size limit", to_string(out));
      n *= d;
    }
  }
  if (a.coord == "tf_crop_and_resize" && int(roi.size()) != 2 * r)
    c.fail("tf_crop_and_resize needs roi with {} values, got {}", 2 * r, roi.size());
  std::vector<AxisMap> maps;
  for (int i = 0; i < r; ++i) {
    double rs = roi.size() == size_t(2 * r) ? roi[size_t(i)] : 0.0;
    double re = roi.size() == size_t(2 * r) ? roi[size_t(i + r)] : 1.0;
    maps.push_back(axis_map(c, a, in[size_t(i)], out[size_t(i)], scales[size_t(i)], rs, re));
  }

  // Kiln's upsample op where it computes exactly this map.
  // (Only when in * scale is exactly the output size: the op maps with the integer sizes.)
  bool hw_only = r == 4 && maps[0].identity && maps[1].identity && is_floating(c.dtype(x)) &&
                 double(in[2]) * scales[2] == double(out[2]) &&
                 double(in[3]) * scales[3] == double(out[3]);
  if (hw_only && a.mode == "linear" && !a.exclude_outside && !a.antialias &&
      (a.coord == "align_corners" || a.coord == "half_pixel" ||
       (a.coord == "pytorch_half_pixel" && out[2] > 1 && out[3] > 1))) {
    Attrs at{{"size", Ints{out[2], out[3]}}, {"mode", std::string("bilinear")},
             {"align_corners", a.coord == "align_corners"}};
    if (a.coord != "align_corners") at.set("scales", Floats{scales[2], scales[3]});
    c.out(0, c.op1(OpId::Upsample, {x}, at));
    return;
  }
  if (hw_only && a.mode == "nearest" && power_of_two_factor(in[2], out[2]) &&
      power_of_two_factor(in[3], out[3])) {
    bool floor_map = true;
    for (int ax = 2; ax < 4; ++ax)
      for (int64_t o = 0; o < out[size_t(ax)]; ++o)
        floor_map &= maps[size_t(ax)].nearest[size_t(o)] == o * in[size_t(ax)] / out[size_t(ax)];
    if (floor_map) {
      c.out(0, c.op1(OpId::Upsample, {x}, {{"size", Ints{out[2], out[3]}},
                                           {"mode", std::string("nearest")}}));
      return;
    }
  }
  c.out(0, apply_maps(c, x, maps, in, out, a));
}

std::vector<double> optional_floats(NodeCtx& c, size_t i, std::string_view what) {
  if (!c.has_input(i)) return {};
  return c.floats_input(i, what);
}

void conv_resize(NodeCtx& c) {
  V x = c.in(0);
  ResizeAttrs a;
  a.mode = c.attr_string("mode", "nearest");
  std::vector<double> scales, roi;
  std::vector<int64_t> sizes;
  if (c.opset() < 11) {  // Resize-10: (X, scales), asymmetric coordinates, nearest = floor
    a.coord = "asymmetric";
    a.nearest_mode = "floor";
    scales = c.floats_input(1, "scales");
  } else {
    a.coord = c.attr_string("coordinate_transformation_mode", "half_pixel");
    a.nearest_mode = c.attr_string("nearest_mode", "round_prefer_floor");
    a.cubic_a = c.attr_float("cubic_coeff_a", -0.75);
    a.exclude_outside = c.attr_int("exclude_outside", 0) != 0;
    a.extrapolation = c.attr_float("extrapolation_value", 0.0);
    if (a.coord == "tf_crop_and_resize") roi = optional_floats(c, 1, "roi");
    else if (c.has_input(1)) (void)c.in(1);  // roi is only read by tf_crop_and_resize
    scales = optional_floats(c, 2, "scales");
    if (c.has_input(3)) sizes = c.ints_input(3, "sizes");
    if (!scales.empty() && !sizes.empty()) c.fail("only one of scales and sizes may be given");
    if (scales.empty() && sizes.empty()) c.fail("one of scales and sizes is required");
  }
  std::optional<std::vector<int64_t>> axes;
  std::string keep_aspect = "stretch";
  if (c.opset() >= 18) {
    a.antialias = c.attr_int("antialias", 0) != 0;
    axes = c.attr_ints_opt("axes");
    keep_aspect = c.attr_string("keep_aspect_ratio_policy", "stretch");
  }
  resize(c, x, a, scales, sizes, roi, axes, keep_aspect);
}

void conv_upsample(NodeCtx& c) {
  V x = c.in(0);
  ResizeAttrs a;
  a.mode = c.attr_string("mode", "nearest");
  if (a.mode == "bilinear") a.mode = "linear";
  if (a.mode != "nearest" && a.mode != "linear")
    c.fail("mode must be nearest or linear, got \"{}\"", a.mode);
  a.coord = "asymmetric";
  a.nearest_mode = "floor";
  std::vector<double> scales = c.opset() >= 9 ? c.floats_input(1, "scales") : c.attr_floats("scales");
  if (c.opset() < 7) {  // Upsample-1: width_scale / height_scale on NCHW
    double hs = c.attr_float("height_scale", 1), ws = c.attr_float("width_scale", 1);
    scales = {1, 1, hs, ws};
  }
  resize(c, x, a, scales, {}, {});
}

// ---- GridSample --------------------------------------------------------------------------------

// Source coordinates from normalized grid values g in [-1, 1] (PyTorch's grid_sampler rules).
V unnormalize(NodeCtx& c, V g, int64_t size, bool align) {
  DType dt = c.dtype(g);
  if (align) return c.mul(c.add(g, c.scalar(1, dt)), c.scalar(double(size - 1) / 2, dt));
  return c.div(c.sub(c.mul(c.add(g, c.scalar(1, dt)), c.scalar(double(size), dt)), c.scalar(1, dt)),
               c.scalar(2, dt));
}

// Reflection of coordinates into [twice_low/2, twice_high/2], then clipping (PyTorch).
V reflect(NodeCtx& c, V v, double twice_low, double twice_high, int64_t size) {
  DType dt = c.dtype(v);
  if (twice_low == twice_high) return c.full(c.shape(v), 0, dt);
  double lo = twice_low / 2, span = (twice_high - twice_low) / 2;
  V in = c.op1(OpId::Abs, {c.sub(v, c.scalar(lo, dt))});
  V flips = c.op1(OpId::Floor, {c.div(in, c.scalar(span, dt))});
  V extra = c.sub(in, c.mul(flips, c.scalar(span, dt)));
  V half = c.op1(OpId::Floor, {c.mul(flips, c.scalar(0.5, dt))});
  V even = c.op1(OpId::Eq, {c.sub(flips, c.mul(half, c.scalar(2, dt))), c.scalar(0, dt)});
  V r = c.op1(OpId::Where, {even, c.add(extra, c.scalar(lo, dt)),
                            c.add(c.sub(c.scalar(span, dt), extra), c.scalar(lo, dt))});
  return c.op1(OpId::Clamp, {r}, {{"min", 0.0}, {"max", double(size - 1)}});
}

V pad_coord(NodeCtx& c, V v, int64_t size, const std::string& padding, bool align) {
  if (padding == "border")
    return c.op1(OpId::Clamp, {v}, {{"min", 0.0}, {"max", double(size - 1)}});
  if (padding == "reflection")
    return align ? reflect(c, v, 0, 2.0 * double(size - 1), size)
                 : reflect(c, v, -1, 2.0 * double(size) - 1, size);
  return v;
}

// Value of x (flattened to [N, C, prod(sizes)]) at integer-valued float coordinates (one
// [N, out...] tensor per spatial dim, in dim order); taps out of range read 0. Returns
// [N, C, out...].
V tap(NodeCtx& c, V xflat, const std::vector<V>& coords, const Dims& sizes, int64_t n, int64_t ch,
      const Dims& out) {
  DType dt = c.dtype(coords[0]);
  V inb = kNone, lin = kNone;
  for (size_t i = 0; i < coords.size(); ++i) {
    double hi = double(sizes[i] - 1);
    V ok = c.op1(OpId::And, {c.op1(OpId::Ge, {coords[i], c.scalar(0, dt)}),
                             c.op1(OpId::Le, {coords[i], c.scalar(hi, dt)})});
    inb = inb == kNone ? ok : c.op1(OpId::And, {inb, ok});
    V ci = c.cast(c.op1(OpId::Clamp, {coords[i]}, {{"min", 0.0}, {"max", hi}}), DType::Int64);
    lin = lin == kNone ? ci : c.add(c.mul(lin, c.scalar(double(sizes[i]), DType::Int64)), ci);
  }
  int64_t points = numel(out);
  Shape full{SymInt(n), SymInt(ch)};
  for (int64_t d : out) full.push_back(d);
  V idx = c.reshape(lin, Shape{SymInt(n), SymInt(1), SymInt(points)});
  idx = c.op1(OpId::Expand, {idx}, {{"shape", Ints{n, ch, points}}});
  V v = c.reshape(c.op1(OpId::Gather, {xflat, idx}, {{"dim", int64_t(2)}}), full);
  V m = c.unsqueeze(c.cast(inb, c.dtype(xflat)), {1});
  return c.mul(v, m);
}

// GridSample: X [N, C, spatial...] sampled at grid [N, out..., n] (x, y[, z] normalized to
// [-1, 1], innermost dim first). Opset 20 renames the modes (linear, cubic) and allows N-D
// inputs; Kiln composes 2-D and 3-D (cubic: 2-D only, as ONNX).
void conv_grid_sample(NodeCtx& c) {
  V x = c.in(0), grid = c.in(1);
  bool align = c.attr_int("align_corners", 0) != 0;
  std::string mode = c.attr_string("mode", c.opset() >= 20 ? "linear" : "bilinear");
  std::string padding = c.attr_string("padding_mode", "zeros");
  if (c.opset() >= 20) {
    if (mode != "linear" && mode != "nearest" && mode != "cubic")
      c.fail("mode must be linear, nearest or cubic (opset {}), got \"{}\"", c.opset(), mode);
    mode = mode == "linear" ? "bilinear" : mode == "cubic" ? "bicubic" : mode;
  } else if (mode != "bilinear" && mode != "nearest" && mode != "bicubic") {
    c.fail("mode must be bilinear, nearest or bicubic, got \"{}\"", mode);
  }
  if (padding != "zeros" && padding != "border" && padding != "reflection")
    c.fail("padding_mode must be zeros, border or reflection, got \"{}\"", padding);
  Dims xd = c.dims(x, "input 'X'"), gd = c.dims(grid, "grid");
  int sp = int(xd.size()) - 2;
  bool shapes_ok = (sp == 2 || sp == 3) && int(gd.size()) == sp + 2 &&
                   gd[size_t(sp + 1)] == sp && gd[0] == xd[0];
  if (!shapes_ok)
    c.fail("expects X [N, C, H, W] with grid [N, Ho, Wo, 2], or X [N, C, D, H, W] with grid "
           "[N, Do, Ho, Wo, 3]; got {} and {}", to_string(xd), to_string(gd));
  if (sp == 3 && mode == "bicubic") c.fail("cubic mode is defined for 4-D inputs only");
  if (sp == 2 && mode == "bilinear" && padding == "zeros") {
    c.out(0, c.op1(OpId::GridSample, {x, grid}, {{"align_corners", align}}));
    return;
  }
  int64_t n = xd[0], ch = xd[1];
  Dims sizes(xd.begin() + 2, xd.end()), out(gd.begin() + 1, gd.end() - 1);
  DType dt = c.dtype(x);
  V g = c.cast(grid, dt);
  // Per spatial dim (D, H, W order) its source coordinate; the grid lists W first.
  std::vector<V> coord;
  for (int i = 0; i < sp; ++i) {
    int64_t comp = sp - 1 - i;
    V gi = c.squeeze(c.slice(g, sp + 1, comp, comp + 1), {int64_t(sp + 1)});
    coord.push_back(unnormalize(c, gi, sizes[size_t(i)], align));
  }
  V xflat = c.reshape(x, Shape{SymInt(n), SymInt(ch), SymInt(numel(sizes))});
  auto at = [&](const std::vector<V>& cs) { return tap(c, xflat, cs, sizes, n, ch, out); };
  auto bc = [&](V v) { return c.unsqueeze(v, {1}); };  // [N, out...] -> [N, 1, out...]
  V result = kNone;
  if (mode == "nearest") {
    std::vector<V> cs;
    for (int i = 0; i < sp; ++i)  // half to even, as nearbyint
      cs.push_back(c.op1(OpId::Round, {pad_coord(c, coord[size_t(i)], sizes[size_t(i)], padding, align)}));
    result = at(cs);
  } else if (mode == "bilinear") {
    // (Tri)linear: the 2^sp corners, each weighted by the product of its per-dim weights.
    V one = c.scalar(1, dt);
    std::vector<V> lo, hi, wlo, whi;
    for (int i = 0; i < sp; ++i) {
      V v = pad_coord(c, coord[size_t(i)], sizes[size_t(i)], padding, align);
      V f = c.op1(OpId::Floor, {v});
      V t = c.sub(v, f);
      lo.push_back(f);
      hi.push_back(c.add(f, one));
      wlo.push_back(c.sub(one, t));
      whi.push_back(t);
    }
    for (int corner = 0; corner < (1 << sp); ++corner) {
      std::vector<V> cs;
      V w = kNone;
      for (int i = 0; i < sp; ++i) {
        bool up = (corner >> (sp - 1 - i)) & 1;
        cs.push_back(up ? hi[size_t(i)] : lo[size_t(i)]);
        V wi = up ? whi[size_t(i)] : wlo[size_t(i)];
        w = w == kNone ? wi : c.mul(w, wi);
      }
      V term = c.mul(at(cs), bc(w));
      result = result == kNone ? term : c.add(result, term);
    }
  } else {
    // Bicubic (A = -0.75) over the 4x4 neighbourhood; padding applies to each tap coordinate.
    V iy = coord[0], ix = coord[1];
    int64_t h = sizes[0], w = sizes[1];
    V x0 = c.op1(OpId::Floor, {ix}), y0 = c.op1(OpId::Floor, {iy});
    V tx = c.sub(ix, x0), ty = c.sub(iy, y0);
    auto coeffs = [&](V t) {
      const double A = -0.75;
      V one = c.scalar(1, dt);
      auto near = [&](V v) {  // ((A + 2) v - (A + 3)) v^2 + 1 for |v| <= 1
        return c.add(c.mul(c.sub(c.mul(v, c.scalar(A + 2, dt)), c.scalar(A + 3, dt)), c.mul(v, v)), one);
      };
      auto far = [&](V v) {  // ((A v - 5A) v + 8A) v - 4A for 1 < |v| < 2
        return c.sub(c.mul(c.add(c.mul(c.sub(c.mul(v, c.scalar(A, dt)), c.scalar(5 * A, dt)), v),
                                 c.scalar(8 * A, dt)), v), c.scalar(4 * A, dt));
      };
      return std::vector<V>{far(c.add(t, one)), near(t), near(c.sub(one, t)),
                            far(c.sub(c.scalar(2, dt), t))};
    };
    std::vector<V> cx = coeffs(tx), cy = coeffs(ty);
    for (int i = 0; i < 4; ++i) {
      V yy = pad_coord(c, c.add(y0, c.scalar(double(i - 1), dt)), h, padding, align);
      V row = kNone;
      for (int j = 0; j < 4; ++j) {
        V xx = pad_coord(c, c.add(x0, c.scalar(double(j - 1), dt)), w, padding, align);
        V term = c.mul(at({c.op1(OpId::Floor, {yy}), c.op1(OpId::Floor, {xx})}), bc(cx[size_t(j)]));
        row = row == kNone ? term : c.add(row, term);
      }
      V term = c.mul(row, bc(cy[size_t(i)]));
      result = result == kNone ? term : c.add(result, term);
    }
  }
  c.out(0, result);
}

// AffineGrid (opset 20): the base grid of normalized positions (x, y[, z], 1) over `size`
// (a constant) times theta^T: [N, H, W, 2] or [N, D, H, W, 3].
void conv_affine_grid(NodeCtx& c) {
  V theta = c.in(0);
  std::vector<int64_t> size = c.ints_input(1, "size");
  bool align = c.attr_int("align_corners", 0) != 0;
  int sp = int(size.size()) - 2;
  if (sp != 2 && sp != 3) c.fail("size must be [N, C, H, W] or [N, C, D, H, W], got {} values", size.size());
  Dims td = c.dims(theta, "theta");
  if (td.size() != 3 || td[1] != sp || td[2] != sp + 1 || td[0] != size[0])
    c.fail("theta must be [{}, {}, {}], got {}", size[0], sp, sp + 1, to_string(td));
  Dims spatial(size.begin() + 2, size.end());
  int64_t points = 1;
  for (int64_t d : spatial) {
    if (d < 1) c.fail("size has an empty spatial dim");
    if (points > (int64_t(1) << 26) / d) c.fail("size {} is too large", to_string(to_shape(spatial)));
    points *= d;
  }
  // Positions along a dim of n points: align_corners ? -1 + 2i/(n-1) : -1 + (2i+1)/n (the
  // reference's aranges; one point is -1 with align_corners, 0 without).
  auto pos = [&](int64_t i, int64_t n) {
    if (align) return n == 1 ? -1.0 : -1.0 + 2.0 * double(i) / double(n - 1);
    return -1.0 + (2.0 * double(i) + 1.0) / double(n);
  };
  std::vector<double> base(size_t(points * (sp + 1)));
  for (int64_t p = 0; p < points; ++p) {
    int64_t rem = p;
    std::vector<double> coord(static_cast<size_t>(sp));
    for (int i = sp - 1; i >= 0; --i) {  // dims in D, H, W order; coordinates x (W) first
      int64_t n = spatial[size_t(i)];
      coord[size_t(sp - 1 - i)] = pos(rem % n, n);
      rem /= n;
    }
    for (int k = 0; k < sp; ++k) base[size_t(p * (sp + 1) + k)] = coord[size_t(k)];
    base[size_t(p * (sp + 1) + sp)] = 1.0;
  }
  V b = c.constant(Tensor::from_vector(base, Dims{points, sp + 1}).to(c.dtype(theta)));
  V g = c.op1(OpId::Matmul, {b, c.permute(theta, {0, 2, 1})});  // [N, points, sp]
  Shape out{SymInt(size[0])};
  for (int64_t d : spatial) out.push_back(d);
  out.push_back(sp);
  c.out(0, c.reshape(g, out));
}

}  // namespace

void add_resample_converters(std::vector<OnnxOpEntry>& t) {
  using enum OpId;
  std::vector<OpId> rs = {Upsample, IndexSelect, Permute, Matmul, Where};
  t.push_back({"Resize", conv_resize, rs,
               "nearest/linear/cubic, every coordinate mode; see Note [ONNX resize]"});
  t.push_back({"Upsample", conv_upsample, rs, "asymmetric nearest (floor) / linear"});
  t.push_back({"AffineGrid", conv_affine_grid, {Matmul, Permute, Reshape},
               "constant base grid times theta^T"});
  t.push_back({"GridSample", conv_grid_sample,
               {GridSample, Cast, Squeeze, Slice, Mul, Add, Sub, Div, Reshape, Abs, Floor, Eq, Where,
                Clamp, And, Ge, Le, Expand, Gather, Unsqueeze, Round},
               "bilinear+zeros (4-D): grid_sample; other modes and 5-D (opset 20) composed from "
               "gathers"});
}

}  // namespace kiln::onnx
