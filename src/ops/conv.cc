// Convolution and pooling (NCHW): conv2d, conv_transpose2d, max_pool2d, avg_pool2d,
// adaptive_avg_pool2d.
//
// Output sizes follow PyTorch exactly (see Note [Pooling output size]). Reference kernels are
// plain loops over float64 copies of the inputs. Eager float32 (and bfloat16 where the CPU has
// it) goes to oneDNN (src/eager/onednn.h); cases oneDNN cannot express exactly fall back to the
// reference, so eager results always match PyTorch semantics.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/kernel_path.h"
#include "ops/onednn.h"
#include "ops/kernel_util.h"

namespace kiln {
namespace {

// ---- helpers ----------------------------------------------------------------------------------

// Sizes that must agree are compared as SymInts: inference never returns a shape it cannot
// prove, so a symbolic size that is not provably equal (or divisible) is an error too.
bool differ(SymInt a, SymInt b) { return a != b; }
bool not_divisible(SymInt a, int64_t b) { return mod(a, SymInt(b)) != SymInt(0); }

// Attribute errors are found by inference (ctx != nullptr); kernels re-read validated attributes.
[[noreturn]] void attr_error(const InferContext* ctx, const std::string& msg) {
  if (ctx) ctx->fail("{}", msg);
  throw_error(ErrorKind::InvalidArgument, msg);
}

// Reads an int-list attribute of one of the allowed lengths; every value must be concrete and
// >= min_value.
Ints read_ints(const InferContext* ctx, const Attrs& attrs, const char* name,
               std::initializer_list<size_t> lengths, int64_t min_value) {
  const Ints& v = attrs.get_ints(name);
  bool ok_len = false;
  for (size_t n : lengths) ok_len |= v.size() == n;
  std::string value_str = attr_value_str(AttrValue(v));
  if (!ok_len) {
    std::string allowed;
    for (size_t n : lengths) allowed += (allowed.empty() ? "" : " or ") + std::to_string(n);
    attr_error(ctx, fmt::format("attribute '{}' is {}; expected {} values", name, value_str,
                                allowed));
  }
  for (int64_t raw : v) {
    if (SymInt::from_raw(raw).is_symbolic())
      attr_error(ctx, fmt::format("attribute '{}' is {}; expected concrete values", name,
                                  value_str));
    if (raw < min_value)
      attr_error(ctx, fmt::format("attribute '{}' is {}; expected values >= {}", name, value_str,
                                  min_value));
  }
  return v;
}

const TensorType& check_nchw_input(const InferContext& ctx) {
  const TensorType& x = ctx.in(0);
  if (x.rank() != 4)
    ctx.fail("input 'x' {} has rank {}; expected rank 4 (NCHW: [N, C, H, W])", to_string(x.shape),
             x.rank());
  if (!ctx.op.supports_dtype(x.dtype))
    ctx.fail("input 'x' has dtype {}; expected a floating dtype", dtype_name(x.dtype));
  return x;
}

void check_same_dtype(const InferContext& ctx, size_t i, const char* name) {
  if (!ctx.has_input(i)) return;
  const TensorType &t = ctx.in(i), &x = ctx.in(0);
  if (t.dtype != x.dtype)
    ctx.fail("input '{}' has dtype {} but 'x' has {}", name, dtype_name(t.dtype),
             dtype_name(x.dtype));
  if (t.device != x.device)
    ctx.fail("input '{}' is on {} but 'x' is on {}", name, t.device.str(), x.device.str());
}

// ---- convolution geometry ---------------------------------------------------------------------
struct ConvGeom {
  int64_t stride[2];
  int64_t pad_begin[2];  // top, left
  int64_t pad_end[2];    // bottom, right
  int64_t dilation[2];
  int64_t output_padding[2] = {0, 0};  // transposed only
  int64_t groups;
};

ConvGeom conv_geom(const InferContext* ctx, const Attrs& attrs, bool transposed) {
  ConvGeom g;
  Ints s = read_ints(ctx, attrs, "stride", {2}, 1);
  Ints p = transposed ? read_ints(ctx, attrs, "padding", {2}, 0)
                      : read_ints(ctx, attrs, "padding", {2, 4}, 0);
  Ints d = read_ints(ctx, attrs, "dilation", {2}, 1);
  g.groups = attrs.get_int("groups");
  if (g.groups < 1)
    attr_error(ctx, fmt::format("attribute 'groups' is {}; expected >= 1", g.groups));
  for (int i = 0; i < 2; ++i) {
    g.stride[i] = s[size_t(i)];
    g.dilation[i] = d[size_t(i)];
    g.pad_begin[i] = p[size_t(i)];
    g.pad_end[i] = p.size() == 4 ? p[size_t(i + 2)] : p[size_t(i)];
  }
  if (transposed) {
    Ints op = read_ints(ctx, attrs, "output_padding", {2}, 0);
    for (int i = 0; i < 2; ++i) {
      g.output_padding[i] = op[size_t(i)];
      // PyTorch's rule: the extra rows/cols must come from a partial stride or dilation step.
      if (op[size_t(i)] >= g.stride[i] && op[size_t(i)] >= g.dilation[i])
        attr_error(ctx, fmt::format("output_padding {} must be smaller than stride {} or "
                                    "dilation {}", attr_value_str(AttrValue(op)),
                                    attr_value_str(AttrValue(s)), attr_value_str(AttrValue(d))));
    }
  }
  return g;
}

void check_bias(const InferContext& ctx, SymInt out_channels, const TensorType& w) {
  if (!ctx.has_input(2)) return;
  check_same_dtype(ctx, 2, "bias");
  const TensorType& b = ctx.in(2);
  if (b.rank() != 1 || differ(b.shape[0], out_channels))
    ctx.fail("input 'bias' has shape {}; expected [{}] (the output channels of 'weight' {})",
             to_string(b.shape), out_channels.str(), to_string(w.shape));
}

std::vector<TensorType> infer_conv2d(const InferContext& ctx) {
  const TensorType& x = check_nchw_input(ctx);
  ConvGeom g = conv_geom(&ctx, ctx.attrs, false);
  const TensorType& w = ctx.in(1);
  check_same_dtype(ctx, 1, "weight");
  if (w.rank() != 4)
    ctx.fail("input 'weight' {} has rank {}; expected [out_channels, in_channels/groups, kh, kw]",
             to_string(w.shape), w.rank());
  SymInt c = x.shape[1], o = w.shape[0];
  if (not_divisible(o, g.groups))
    ctx.fail("'weight' {} has {} output channels, which is not divisible by groups {}",
             to_string(w.shape), o.str(), g.groups);
  SymInt expected_c = w.shape[1] * SymInt(g.groups);
  if (differ(c, expected_c))
    ctx.fail("input 'x' {} has {} channels, but 'weight' {} expects {} ({} per group x {} "
             "groups)", to_string(x.shape), c.str(), to_string(w.shape), expected_c.str(),
             w.shape[1].str(), g.groups);
  check_bias(ctx, o, w);
  Shape out{x.shape[0], o, 0, 0};
  for (int i = 0; i < 2; ++i) {
    SymInt padded = x.shape[2 + i] + SymInt(g.pad_begin[i] + g.pad_end[i]);
    SymInt extent = SymInt(g.dilation[i]) * (w.shape[2 + i] - SymInt(1)) + SymInt(1);
    if (padded.is_concrete() && extent.is_concrete() && padded.value() < extent.value())
      ctx.fail("input 'x' {} padded to {} in dim {} is smaller than the kernel extent {} "
               "(kernel {}, dilation {})", to_string(x.shape), padded.value(), 2 + i,
               extent.value(), w.shape[2 + i].str(), g.dilation[i]);
    out[size_t(2 + i)] = floordiv(padded - extent, SymInt(g.stride[i])) + SymInt(1);
  }
  return {TensorType(x.dtype, out, x.device)};
}

std::vector<TensorType> infer_conv_transpose2d(const InferContext& ctx) {
  const TensorType& x = check_nchw_input(ctx);
  ConvGeom g = conv_geom(&ctx, ctx.attrs, true);
  const TensorType& w = ctx.in(1);
  check_same_dtype(ctx, 1, "weight");
  if (w.rank() != 4)
    ctx.fail("input 'weight' {} has rank {}; expected [in_channels, out_channels/groups, kh, kw]",
             to_string(w.shape), w.rank());
  SymInt c = x.shape[1];
  if (differ(c, w.shape[0]))
    ctx.fail("input 'x' {} has {} channels, but 'weight' {} expects {}", to_string(x.shape),
             c.str(), to_string(w.shape), w.shape[0].str());
  if (not_divisible(c, g.groups))
    ctx.fail("input 'x' has {} channels, which is not divisible by groups {}", c.str(),
             g.groups);
  SymInt o = w.shape[1] * SymInt(g.groups);
  check_bias(ctx, o, w);
  Shape out{x.shape[0], o, 0, 0};
  for (int i = 0; i < 2; ++i) {
    SymInt size = (x.shape[2 + i] - SymInt(1)) * SymInt(g.stride[i]) -
                  SymInt(g.pad_begin[i] + g.pad_end[i]) +
                  SymInt(g.dilation[i]) * (w.shape[2 + i] - SymInt(1)) +
                  SymInt(g.output_padding[i] + 1);
    if (size.is_concrete() && size.value() < 1)
      ctx.fail("output size in dim {} would be {} for input 'x' {} and 'weight' {} with "
               "padding {}: reduce padding", 2 + i, size.value(), to_string(x.shape),
               to_string(w.shape), g.pad_begin[i]);
    out[size_t(2 + i)] = size;
  }
  return {TensorType(x.dtype, out, x.device)};
}

// ---- pooling geometry -------------------------------------------------------------------------
struct PoolGeom {
  int64_t kernel[2], stride[2], pad[2], dilation[2] = {1, 1};
  bool ceil_mode = false;
  bool count_include_pad = true;
};

PoolGeom pool_geom(const InferContext* ctx, const Attrs& attrs, OpId id) {
  PoolGeom g;
  Ints k = read_ints(ctx, attrs, "kernel_size", {2}, 1);
  const Ints& s_raw = attrs.get_ints("stride");
  Ints s = s_raw.empty() ? k : read_ints(ctx, attrs, "stride", {2}, 1);
  Ints p = read_ints(ctx, attrs, "padding", {2}, 0);
  Ints d = id == OpId::MaxPool2d ? read_ints(ctx, attrs, "dilation", {2}, 1) : Ints{1, 1};
  g.ceil_mode = attrs.get_bool("ceil_mode");
  if (id == OpId::AvgPool2d) g.count_include_pad = attrs.get_bool("count_include_pad");
  for (int i = 0; i < 2; ++i) {
    g.kernel[i] = k[size_t(i)];
    g.stride[i] = s[size_t(i)];
    g.pad[i] = p[size_t(i)];
    g.dilation[i] = d[size_t(i)];
    if (g.pad[i] > g.kernel[i] / 2)
      attr_error(ctx, fmt::format("padding {} must be at most half of kernel_size {}",
                                  attr_value_str(AttrValue(p)), attr_value_str(AttrValue(k))));
  }
  return g;
}

// Note [Pooling output size]
// PyTorch: out = floor_or_ceil((in + 2*pad - dilation*(k-1) - 1) / stride) + 1, and in ceil
// mode the last window must start inside the input or the left padding: if
// (out-1)*stride >= in + pad, out -= 1. For a symbolic `in` the same rule is
// min(ceil_out, (in + pad - 1)//stride + 1), equal to it whenever pad <= kernel/2 (checked).
SymInt pool_out_size(SymInt in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  int64_t extent = d * (k - 1) + 1;
  if (in.is_concrete()) {
    int64_t numer = in.value() + 2 * p - extent + (ceil_mode ? s - 1 : 0);
    int64_t out = (numer >= 0 ? numer / s : -((-numer + s - 1) / s)) + 1;  // floor division
    if (ceil_mode && (out - 1) * s >= in.value() + p) --out;
    return out;
  }
  SymInt floor_part = floordiv(in + SymInt(2 * p - extent + (ceil_mode ? s - 1 : 0)), SymInt(s));
  SymInt out = floor_part + SymInt(1);
  if (ceil_mode) out = sym_min(out, floordiv(in + SymInt(p - 1), SymInt(s)) + SymInt(1));
  return out;
}

std::vector<TensorType> infer_pool2d(const InferContext& ctx) {
  const TensorType& x = check_nchw_input(ctx);
  PoolGeom g = pool_geom(&ctx, ctx.attrs, ctx.op.id);
  Shape out{x.shape[0], x.shape[1], 0, 0};
  for (int i = 0; i < 2; ++i)
    out[size_t(2 + i)] = pool_out_size(x.shape[2 + i], g.kernel[i], g.stride[i], g.pad[i],
                                       g.dilation[i], g.ceil_mode);
  for (int i = 0; i < 2; ++i) {
    SymInt o = out[size_t(2 + i)];
    if (o.is_concrete() && o.value() < 1)
      ctx.fail("input 'x' {} is too small: kernel {}x{} (dilation {}x{}, padding {}x{}) gives "
               "output size {}x{}", to_string(x.shape), g.kernel[0], g.kernel[1],
               g.dilation[0], g.dilation[1], g.pad[0], g.pad[1], out[2].str(), out[3].str());
  }
  return {TensorType(x.dtype, out, x.device)};
}

std::vector<TensorType> infer_adaptive_avg_pool2d(const InferContext& ctx) {
  const TensorType& x = check_nchw_input(ctx);
  Ints o = read_ints(&ctx, ctx.attrs, "output_size", {2}, 1);
  for (int i = 0; i < 2; ++i) {
    SymInt in = x.shape[2 + i];
    if (in.is_concrete() && in.value() < 1)
      ctx.fail("input 'x' {} has an empty spatial dim {}; adaptive pooling needs H, W >= 1",
               to_string(x.shape), 2 + i);
  }
  return {TensorType(x.dtype, Shape{x.shape[0], x.shape[1], o[0], o[1]}, x.device)};
}

// ---- reference kernels ------------------------------------------------------------------------
void ref_conv2d(const KernelContext& ctx) {
  const Tensor &x = ctx.inputs[0], &w = ctx.inputs[1], &bias = ctx.inputs[2];
  Tensor& y = ctx.outputs[0];
  ConvGeom g = conv_geom(nullptr, ctx.attrs, false);
  int64_t n_size = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3);
  int64_t o_size = w.size(0), cg = w.size(1), kh = w.size(2), kw = w.size(3);
  int64_t oh_size = y.size(2), ow_size = y.size(3), og = o_size / g.groups;
  std::vector<double> xv = read_f64(x), wv = read_f64(w), out(size_t(y.numel()));
  std::vector<double> bv = bias.defined() ? read_f64(bias) : std::vector<double>();
  for (int64_t n = 0; n < n_size; ++n)
    for (int64_t o = 0; o < o_size; ++o) {
      int64_t grp = o / og;
      for (int64_t oh = 0; oh < oh_size; ++oh)
        for (int64_t ow = 0; ow < ow_size; ++ow) {
          double acc = bv.empty() ? 0.0 : bv[size_t(o)];
          for (int64_t ci = 0; ci < cg; ++ci) {
            int64_t ic = grp * cg + ci;
            for (int64_t i = 0; i < kh; ++i) {
              int64_t ih = oh * g.stride[0] - g.pad_begin[0] + i * g.dilation[0];
              if (ih < 0 || ih >= h) continue;
              for (int64_t j = 0; j < kw; ++j) {
                int64_t iw = ow * g.stride[1] - g.pad_begin[1] + j * g.dilation[1];
                if (iw < 0 || iw >= wd) continue;
                acc += xv[size_t(((n * c + ic) * h + ih) * wd + iw)] *
                       wv[size_t(((o * cg + ci) * kh + i) * kw + j)];
              }
            }
          }
          out[size_t(((n * o_size + o) * oh_size + oh) * ow_size + ow)] = acc;
        }
    }
  write_f64(y, out);
}

// Transposed convolution as a scatter: each input pixel adds weight * x into the output window
// it maps to (the adjoint of conv2d's gather).
void ref_conv_transpose2d(const KernelContext& ctx) {
  const Tensor &x = ctx.inputs[0], &w = ctx.inputs[1], &bias = ctx.inputs[2];
  Tensor& y = ctx.outputs[0];
  ConvGeom g = conv_geom(nullptr, ctx.attrs, true);
  int64_t n_size = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3);
  int64_t og = w.size(1), kh = w.size(2), kw = w.size(3), cg = c / g.groups;
  int64_t o_size = y.size(1), oh_size = y.size(2), ow_size = y.size(3);
  std::vector<double> xv = read_f64(x), wv = read_f64(w), out(size_t(y.numel()), 0.0);
  if (bias.defined()) {
    std::vector<double> bv = read_f64(bias);
    for (int64_t n = 0; n < n_size; ++n)
      for (int64_t o = 0; o < o_size; ++o)
        for (int64_t k = 0; k < oh_size * ow_size; ++k)
          out[size_t((n * o_size + o) * oh_size * ow_size + k)] = bv[size_t(o)];
  }
  for (int64_t n = 0; n < n_size; ++n)
    for (int64_t ic = 0; ic < c; ++ic) {
      int64_t grp = ic / cg;
      for (int64_t ih = 0; ih < h; ++ih)
        for (int64_t iw = 0; iw < wd; ++iw) {
          double xval = xv[size_t(((n * c + ic) * h + ih) * wd + iw)];
          for (int64_t oc = 0; oc < og; ++oc) {
            int64_t o = grp * og + oc;
            for (int64_t i = 0; i < kh; ++i) {
              int64_t oh = ih * g.stride[0] - g.pad_begin[0] + i * g.dilation[0];
              if (oh < 0 || oh >= oh_size) continue;
              for (int64_t j = 0; j < kw; ++j) {
                int64_t ow = iw * g.stride[1] - g.pad_begin[1] + j * g.dilation[1];
                if (ow < 0 || ow >= ow_size) continue;
                out[size_t(((n * o_size + o) * oh_size + oh) * ow_size + ow)] +=
                    xval * wv[size_t(((ic * og + oc) * kh + i) * kw + j)];
              }
            }
          }
        }
    }
  write_f64(y, out);
}

void ref_max_pool2d(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& y = ctx.outputs[0];
  PoolGeom g = pool_geom(nullptr, ctx.attrs, OpId::MaxPool2d);
  int64_t planes = x.size(0) * x.size(1), h = x.size(2), wd = x.size(3);
  int64_t oh_size = y.size(2), ow_size = y.size(3);
  std::vector<double> xv = read_f64(x), out(size_t(y.numel()));
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t oh = 0; oh < oh_size; ++oh)
      for (int64_t ow = 0; ow < ow_size; ++ow) {
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t i = 0; i < g.kernel[0]; ++i) {
          int64_t ih = oh * g.stride[0] - g.pad[0] + i * g.dilation[0];
          if (ih < 0 || ih >= h) continue;
          for (int64_t j = 0; j < g.kernel[1]; ++j) {
            int64_t iw = ow * g.stride[1] - g.pad[1] + j * g.dilation[1];
            if (iw < 0 || iw >= wd) continue;
            double v = xv[size_t((p * h + ih) * wd + iw)];
            if (v > m || std::isnan(v)) m = v;  // NaN propagates, as in PyTorch
            if (std::isnan(m)) break;
          }
        }
        out[size_t((p * oh_size + oh) * ow_size + ow)] = m;
      }
  write_f64(y, out);
}

// PyTorch's divisor: with count_include_pad the window is clipped to the padded input (so a
// ceil_mode window hanging past the right padding counts less), otherwise to the input.
void ref_avg_pool2d(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& y = ctx.outputs[0];
  PoolGeom g = pool_geom(nullptr, ctx.attrs, OpId::AvgPool2d);
  int64_t planes = x.size(0) * x.size(1), h = x.size(2), wd = x.size(3);
  int64_t oh_size = y.size(2), ow_size = y.size(3);
  std::vector<double> xv = read_f64(x), out(size_t(y.numel()));
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t oh = 0; oh < oh_size; ++oh)
      for (int64_t ow = 0; ow < ow_size; ++ow) {
        int64_t h0 = oh * g.stride[0] - g.pad[0], w0 = ow * g.stride[1] - g.pad[1];
        int64_t h1 = std::min(h0 + g.kernel[0], h + g.pad[0]);
        int64_t w1 = std::min(w0 + g.kernel[1], wd + g.pad[1]);
        int64_t padded_count = (h1 - h0) * (w1 - w0);
        h0 = std::max<int64_t>(h0, 0);
        w0 = std::max<int64_t>(w0, 0);
        h1 = std::min(h1, h);
        w1 = std::min(w1, wd);
        double s = 0;
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) s += xv[size_t((p * h + ih) * wd + iw)];
        int64_t divisor = g.count_include_pad ? padded_count : (h1 - h0) * (w1 - w0);
        out[size_t((p * oh_size + oh) * ow_size + ow)] = s / double(divisor);
      }
  write_f64(y, out);
}

// PyTorch's adaptive windows: [floor(i*in/out), ceil((i+1)*in/out)).
int64_t adaptive_start(int64_t i, int64_t in, int64_t out) { return (i * in) / out; }
int64_t adaptive_end(int64_t i, int64_t in, int64_t out) { return ((i + 1) * in + out - 1) / out; }

void ref_adaptive_avg_pool2d(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& y = ctx.outputs[0];
  int64_t planes = x.size(0) * x.size(1), h = x.size(2), wd = x.size(3);
  int64_t oh_size = y.size(2), ow_size = y.size(3);
  std::vector<double> xv = read_f64(x), out(size_t(y.numel()));
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t oh = 0; oh < oh_size; ++oh)
      for (int64_t ow = 0; ow < ow_size; ++ow) {
        int64_t h0 = adaptive_start(oh, h, oh_size), h1 = adaptive_end(oh, h, oh_size);
        int64_t w0 = adaptive_start(ow, wd, ow_size), w1 = adaptive_end(ow, wd, ow_size);
        double s = 0;
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) s += xv[size_t((p * h + ih) * wd + iw)];
        out[size_t((p * oh_size + oh) * ow_size + ow)] = s / double((h1 - h0) * (w1 - w0));
      }
  write_f64(y, out);
}

// ---- eager kernels ----------------------------------------------------------------------------
bool onednn_eligible(DType d) {
  return (d == DType::Float32 || d == DType::BFloat16) && onednn::supports_dtype(d);
}

void eager_conv2d(const KernelContext& ctx) {
  if (onednn_eligible(ctx.inputs[0].dtype())) {
    ConvGeom g = conv_geom(nullptr, ctx.attrs, false);
    onednn::Conv2dParams p;
    for (int i = 0; i < 2; ++i) {
      p.stride[i] = g.stride[i];
      p.pad_begin[i] = g.pad_begin[i];
      p.pad_end[i] = g.pad_end[i];
      p.dilation[i] = g.dilation[i];
    }
    p.groups = g.groups;
    if (onednn::conv2d(ctx.inputs[0], ctx.inputs[1], ctx.inputs[2], p, ctx.outputs[0]))
      return note_kernel_path("onednn");
  }
  note_kernel_path("reference");
  ref_conv2d(ctx);
}

void eager_conv_transpose2d(const KernelContext& ctx) {
  if (onednn_eligible(ctx.inputs[0].dtype())) {
    ConvGeom g = conv_geom(nullptr, ctx.attrs, true);
    onednn::Conv2dParams p;
    for (int i = 0; i < 2; ++i) {
      p.stride[i] = g.stride[i];
      p.pad_begin[i] = g.pad_begin[i];
      // output_padding extends the bottom/right edge: less cropping there (may go negative).
      p.pad_end[i] = g.pad_end[i] - g.output_padding[i];
      p.dilation[i] = g.dilation[i];
    }
    p.groups = g.groups;
    if (onednn::conv_transpose2d(ctx.inputs[0], ctx.inputs[1], ctx.inputs[2], p,
                                 ctx.outputs[0]))
      return note_kernel_path("onednn");
  }
  note_kernel_path("reference");
  ref_conv_transpose2d(ctx);
}

// oneDNN pooling takes explicit right padding; PyTorch's ceil_mode windows hang past the
// declared padding. Returns the right/bottom padding that makes oneDNN produce `out` windows.
int64_t pool_pad_end(int64_t in, int64_t out, int64_t k, int64_t s, int64_t p, int64_t d) {
  int64_t extent = d * (k - 1) + 1;
  if ((in + 2 * p - extent) / s + 1 == out) return p;
  return (out - 1) * s + extent - in - p;
}

void eager_pool2d(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& y = ctx.outputs[0];
  bool is_max = ctx.op.id == OpId::MaxPool2d;
  if (onednn_eligible(x.dtype())) {
    PoolGeom g = pool_geom(nullptr, ctx.attrs, ctx.op.id);
    onednn::Pool2dParams p;
    bool extra_end_pad = false;
    for (int i = 0; i < 2; ++i) {
      p.kernel[i] = g.kernel[i];
      p.stride[i] = g.stride[i];
      p.pad_begin[i] = g.pad[i];
      p.dilation[i] = g.dilation[i];
      p.pad_end[i] = pool_pad_end(x.size(2 + i), y.size(2 + i), g.kernel[i], g.stride[i],
                                  g.pad[i], g.dilation[i]);
      extra_end_pad |= p.pad_end[i] > g.pad[i];
    }
    bool exact = true;
    if (is_max) {
      p.kind = onednn::PoolKind::Max;
    } else if (!g.count_include_pad || (g.pad[0] == 0 && g.pad[1] == 0)) {
      // Without declared padding, PyTorch's include-pad divisor is the in-input count.
      p.kind = g.count_include_pad && !extra_end_pad ? onednn::PoolKind::AvgIncludePad
                                                      : onednn::PoolKind::AvgExcludePad;
    } else {
      // oneDNN divides by the whole kernel; PyTorch clips ceil_mode windows at the padding.
      p.kind = onednn::PoolKind::AvgIncludePad;
      exact = !extra_end_pad;
    }
    if (exact && onednn::pool2d(x, p, y)) return note_kernel_path("onednn");
  }
  note_kernel_path("reference");
  if (is_max)
    ref_max_pool2d(ctx);
  else
    ref_avg_pool2d(ctx);
}

void eager_adaptive_avg_pool2d(const KernelContext& ctx) {
  const Tensor& x0 = ctx.inputs[0];
  if (x0.dtype() != DType::Float32) return note_kernel_path("reference"), ref_adaptive_avg_pool2d(ctx);
  note_kernel_path("f32");
  Tensor x = x0.contiguous();
  Tensor& y = ctx.outputs[0];
  int64_t planes = x.size(0) * x.size(1), h = x.size(2), wd = x.size(3);
  int64_t oh_size = y.size(2), ow_size = y.size(3);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
#pragma omp parallel for if (planes * h * wd > 32768)
  for (int64_t p = 0; p < planes; ++p) {
    const float* in = xp + p * h * wd;
    float* out = yp + p * oh_size * ow_size;
    for (int64_t oh = 0; oh < oh_size; ++oh) {
      int64_t h0 = adaptive_start(oh, h, oh_size), h1 = adaptive_end(oh, h, oh_size);
      for (int64_t ow = 0; ow < ow_size; ++ow) {
        int64_t w0 = adaptive_start(ow, wd, ow_size), w1 = adaptive_end(ow, wd, ow_size);
        double s = 0;
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) s += in[ih * wd + iw];
        out[oh * ow_size + ow] = float(s / double((h1 - h0) * (w1 - w0)));
      }
    }
  }
}

// ---- samples ----------------------------------------------------------------------------------
Attrs conv_attrs(Ints stride, Ints padding, Ints dilation, int64_t groups) {
  return {{"stride", std::move(stride)}, {"padding", std::move(padding)},
          {"dilation", std::move(dilation)}, {"groups", groups}};
}

std::vector<OpSample> samples_conv2d(Generator& g) {
  auto r = [&](Dims d) { return sample_randn(g, d); };
  return {
      {{r({1, 3, 5, 5}), r({4, 3, 3, 3}), r({4})}, conv_attrs({1, 1}, {1, 1}, {1, 1}, 1),
       "3x3 pad 1 with bias"},
      {{r({2, 4, 6, 5}), r({6, 2, 3, 3}), Tensor()}, conv_attrs({2, 2}, {1, 1}, {1, 1}, 2),
       "batch 2, stride 2, groups 2, no bias"},
      {{r({1, 3, 7, 6}), r({2, 3, 3, 2}), r({2})}, conv_attrs({2, 1}, {1, 0, 2, 1}, {1, 1}, 1),
       "asymmetric padding [1,0,2,1], stride [2,1]"},
      {{r({1, 2, 7, 7}), r({3, 2, 3, 3}), r({3})}, conv_attrs({1, 1}, {2, 2}, {2, 2}, 1),
       "dilation 2"},
      {{r({1, 4, 5, 5}), r({4, 1, 3, 3}), r({4})}, conv_attrs({1, 1}, {1, 1}, {1, 1}, 4),
       "depthwise"},
      {{r({2, 5, 3, 4}), r({3, 5, 1, 1}), r({3})}, conv_attrs({1, 1}, {0, 0}, {1, 1}, 1),
       "1x1"},
      {{sample_noncontiguous(g, {1, 2, 4, 5}), sample_noncontiguous(g, {3, 2, 2, 2}), Tensor()},
       conv_attrs({1, 1}, {0, 1}, {1, 1}, 1), "non-contiguous input and weight"},
      {{r({1, 2, 6, 6}), r({2, 2, 2, 2}), r({2})}, conv_attrs({2, 2}, {0, 0}, {1, 1}, 1),
       "2x2 stride 2"},
      // Grouped with several channels per group (regnet, resnext), where oneDNN's layouts
      // and kernels differ by channels per group (Note [matched convolution layouts]).
      {{r({1, 32, 7, 9}), r({32, 8, 3, 3}), r({32})}, conv_attrs({2, 2}, {1, 1}, {1, 1}, 4),
       "grouped, 8 per group, stride 2, non-square"},
      {{r({2, 32, 8, 6}), r({32, 4, 3, 3}), Tensor()}, conv_attrs({1, 1}, {2, 2}, {2, 2}, 8),
       "grouped, 4 per group, dilation 2, no bias"},
      {{r({1, 32, 6, 6}), r({32, 16, 3, 3}), r({32})}, conv_attrs({1, 1}, {1, 0, 1, 2}, {1, 1}, 2),
       "grouped, 16 per group, asymmetric padding"},
  };
}

Attrs deconv_attrs(Ints stride, Ints padding, Ints output_padding, Ints dilation,
                   int64_t groups) {
  return {{"stride", std::move(stride)}, {"padding", std::move(padding)},
          {"output_padding", std::move(output_padding)}, {"dilation", std::move(dilation)},
          {"groups", groups}};
}

std::vector<OpSample> samples_conv_transpose2d(Generator& g) {
  auto r = [&](Dims d) { return sample_randn(g, d); };
  return {
      {{r({1, 3, 4, 4}), r({3, 2, 3, 3}), r({2})}, deconv_attrs({2, 2}, {1, 1}, {1, 1}, {1, 1}, 1),
       "stride 2 pad 1 output_padding 1 with bias"},
      {{r({2, 4, 3, 3}), r({4, 3, 2, 2}), Tensor()}, deconv_attrs({2, 2}, {0, 0}, {0, 0}, {1, 1}, 2),
       "batch 2, groups 2, no bias"},
      {{r({1, 2, 3, 4}), r({2, 2, 3, 3}), r({2})}, deconv_attrs({1, 1}, {1, 1}, {0, 0}, {2, 2}, 1),
       "dilation 2"},
      {{r({1, 2, 3, 3}), r({2, 3, 3, 3}), r({3})}, deconv_attrs({1, 1}, {0, 0}, {0, 0}, {1, 1}, 1),
       "stride 1"},
      {{r({1, 2, 3, 3}), r({2, 2, 2, 2}), r({2})}, deconv_attrs({3, 2}, {0, 1}, {2, 1}, {1, 1}, 1),
       "output_padding beyond padding"},
      {{sample_noncontiguous(g, {1, 2, 3, 4}), r({2, 2, 2, 3}), Tensor()},
       deconv_attrs({2, 1}, {0, 1}, {1, 0}, {1, 1}, 1), "non-contiguous input"},
  };
}

Attrs max_attrs(Ints k, Ints s, Ints p, Ints d, bool ceil) {
  return {{"kernel_size", std::move(k)}, {"stride", std::move(s)}, {"padding", std::move(p)},
          {"dilation", std::move(d)}, {"ceil_mode", ceil}};
}

std::vector<OpSample> samples_max_pool2d(Generator& g) {
  auto r = [&](Dims d) { return sample_randn(g, d); };
  return {
      {{r({1, 2, 6, 6})}, max_attrs({2, 2}, {}, {0, 0}, {1, 1}, false), "2x2, stride = kernel"},
      {{r({2, 3, 7, 7})}, max_attrs({3, 3}, {2, 2}, {1, 1}, {1, 1}, false),
       "3x3 stride 2 pad 1 (ResNet stem)"},
      {{r({1, 2, 6, 6})}, max_attrs({3, 3}, {2, 2}, {0, 0}, {1, 1}, true), "ceil_mode"},
      {{r({1, 1, 5, 5})}, max_attrs({2, 2}, {2, 2}, {1, 1}, {1, 1}, true),
       "ceil_mode drops a window starting in the right padding"},
      {{r({1, 2, 7, 7})}, max_attrs({2, 2}, {1, 1}, {0, 0}, {2, 2}, false), "dilation 2"},
      {{r({1, 2, 5, 7})}, max_attrs({3, 2}, {1, 2}, {1, 0}, {1, 1}, false), "non-square"},
      {{sample_noncontiguous(g, {1, 2, 4, 6})}, max_attrs({2, 2}, {}, {0, 0}, {1, 1}, false),
       "non-contiguous"},
  };
}

Attrs avg_attrs(Ints k, Ints s, Ints p, bool ceil, bool cip) {
  return {{"kernel_size", std::move(k)}, {"stride", std::move(s)}, {"padding", std::move(p)},
          {"ceil_mode", ceil}, {"count_include_pad", cip}};
}

std::vector<OpSample> samples_avg_pool2d(Generator& g) {
  auto r = [&](Dims d) { return sample_randn(g, d); };
  return {
      {{r({1, 2, 6, 6})}, avg_attrs({2, 2}, {}, {0, 0}, false, true), "2x2"},
      {{r({2, 3, 7, 7})}, avg_attrs({3, 3}, {2, 2}, {1, 1}, false, true), "pad 1 include pad"},
      {{r({2, 3, 7, 7})}, avg_attrs({3, 3}, {2, 2}, {1, 1}, false, false), "pad 1 exclude pad"},
      {{r({1, 2, 6, 6})}, avg_attrs({3, 3}, {2, 2}, {1, 1}, true, true),
       "ceil_mode + pad: last window clipped at the padding"},
      {{r({1, 2, 6, 6})}, avg_attrs({3, 3}, {2, 2}, {1, 1}, true, false),
       "ceil_mode + pad, exclude pad"},
      {{r({1, 1, 5, 5})}, avg_attrs({2, 2}, {2, 2}, {0, 0}, true, true), "ceil_mode, no pad"},
      {{sample_noncontiguous(g, {1, 2, 4, 6})}, avg_attrs({2, 3}, {1, 2}, {1, 1}, false, true),
       "non-contiguous, non-square"},
  };
}

std::vector<OpSample> samples_adaptive_avg_pool2d(Generator& g) {
  auto r = [&](Dims d) { return sample_randn(g, d); };
  auto a = [](int64_t h, int64_t w) { return Attrs{{"output_size", Ints{h, w}}}; };
  return {
      {{r({1, 2, 7, 7})}, a(3, 3), "7 -> 3 (overlapping windows)"},
      {{r({2, 3, 6, 4})}, a(2, 2), "divisible"},
      {{r({1, 2, 5, 5})}, a(1, 1), "global"},
      {{r({1, 1, 3, 3})}, a(5, 4), "output larger than input"},
      {{sample_noncontiguous(g, {1, 2, 5, 6})}, a(2, 3), "non-contiguous"},
  };
}

}  // namespace

void register_conv_ops() {
  OpDef& conv = define_op(OpId::Conv2d);
  conv.doc = "2-D convolution (cross-correlation), NCHW; weight [O, C/groups, kh, kw]; padding "
             "[2] symmetric or [4] (top, left, bottom, right)";
  conv.inputs = {{"x"}, {"weight"}, {"bias", true}};
  conv.attrs = {{"stride", AttrType::Ints, Ints{1, 1}},
                {"padding", AttrType::Ints, Ints{0, 0}},
                {"dilation", AttrType::Ints, Ints{1, 1}},
                {"groups", AttrType::Int, int64_t(1)}};
  conv.infer = infer_conv2d;
  conv.reference = ref_conv2d;
  conv.eager_cpu = eager_conv2d;
  conv.dtypes = float_dtypes();
  conv.samples = samples_conv2d;
  conv.onnx_ops = {"Conv"};

  OpDef& deconv = define_op(OpId::ConvTranspose2d);
  deconv.doc = "2-D transposed convolution, NCHW; weight [C, O/groups, kh, kw]; output size "
               "(in-1)*stride - 2*padding + dilation*(k-1) + output_padding + 1";
  deconv.inputs = {{"x"}, {"weight"}, {"bias", true}};
  deconv.attrs = {{"stride", AttrType::Ints, Ints{1, 1}},
                  {"padding", AttrType::Ints, Ints{0, 0}},
                  {"output_padding", AttrType::Ints, Ints{0, 0}},
                  {"dilation", AttrType::Ints, Ints{1, 1}},
                  {"groups", AttrType::Int, int64_t(1)}};
  deconv.infer = infer_conv_transpose2d;
  deconv.reference = ref_conv_transpose2d;
  deconv.eager_cpu = eager_conv_transpose2d;
  deconv.dtypes = float_dtypes();
  deconv.samples = samples_conv_transpose2d;
  deconv.onnx_ops = {"ConvTranspose"};

  OpDef& maxp = define_op(OpId::MaxPool2d);
  maxp.doc = "2-D max pooling, NCHW; stride [] = kernel_size; PyTorch ceil_mode rule";
  maxp.inputs = {{"x"}};
  maxp.attrs = {{"kernel_size", AttrType::Ints, {}},
                {"stride", AttrType::Ints, Ints{}},
                {"padding", AttrType::Ints, Ints{0, 0}},
                {"dilation", AttrType::Ints, Ints{1, 1}},
                {"ceil_mode", AttrType::Bool, false}};
  maxp.infer = infer_pool2d;
  maxp.reference = ref_max_pool2d;
  maxp.eager_cpu = eager_pool2d;
  maxp.dtypes = float_dtypes();
  maxp.samples = samples_max_pool2d;
  maxp.onnx_ops = {"MaxPool"};

  OpDef& avgp = define_op(OpId::AvgPool2d);
  avgp.doc = "2-D average pooling, NCHW; count_include_pad counts padding in the divisor "
             "(windows clipped at the padded input, as PyTorch)";
  avgp.inputs = {{"x"}};
  avgp.attrs = {{"kernel_size", AttrType::Ints, {}},
                {"stride", AttrType::Ints, Ints{}},
                {"padding", AttrType::Ints, Ints{0, 0}},
                {"ceil_mode", AttrType::Bool, false},
                {"count_include_pad", AttrType::Bool, true}};
  avgp.infer = infer_pool2d;
  avgp.reference = ref_avg_pool2d;
  avgp.eager_cpu = eager_pool2d;
  avgp.dtypes = float_dtypes();
  avgp.samples = samples_avg_pool2d;
  avgp.onnx_ops = {"AveragePool"};

  OpDef& adap = define_op(OpId::AdaptiveAvgPool2d);
  adap.doc = "2-D adaptive average pooling to output_size; windows [floor(i*in/out), "
             "ceil((i+1)*in/out))";
  adap.inputs = {{"x"}};
  adap.attrs = {{"output_size", AttrType::Ints, {}}};
  adap.infer = infer_adaptive_avg_pool2d;
  adap.reference = ref_adaptive_avg_pool2d;
  adap.eager_cpu = eager_adaptive_avg_pool2d;
  adap.dtypes = float_dtypes();
  adap.samples = samples_adaptive_avg_pool2d;
  adap.onnx_ops = {"GlobalAveragePool"};
}

}  // namespace kiln
