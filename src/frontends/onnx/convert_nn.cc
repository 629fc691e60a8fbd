// ONNX neural-network ops: MatMul, Gemm, Conv/ConvTranspose (1-D and 3-D through the 2-D Kiln
// ops), pooling, normalizations, softmax family, losses. See Note [ONNX spatial ops].
//
// Note [ONNX spatial ops]
// Kiln's conv/pool ops are 2-D (NCHW) with PyTorch's conventions. ONNX's are N-D with explicit
// begin/end pads, auto_pad and ONNX's ceil_mode rule. The mapping:
//   - 1-D runs as 2-D with H = 1; 3-D runs as a sum (conv) / max (max pool) / sum of partial
//     averages (avg pool) over kernel depth of 2-D ops on depth slices, batch and depth folded;
//   - pads are resolved (auto_pad, ceil_mode) to explicit per-dim [begin, end] first; when they
//     fit the Kiln op's own padding they are passed to it, otherwise the input is padded
//     explicitly (-inf for max pooling, zeros otherwise) and the op runs unpadded;
//   - average pooling whose divisor the Kiln op cannot express divides the window sum by a
//     window count computed from a constant mask (folded at import).
#include <cmath>
#include <limits>

#include "frontends/onnx/convert.h"

namespace kiln::onnx {
namespace {

// ---- MatMul, Gemm ------------------------------------------------------------------------------

void conv_matmul(NodeCtx& c) { c.out(0, c.op1(OpId::Matmul, {c.in(0), c.in(1)})); }

void conv_gemm(NodeCtx& c) {
  V a = c.in(0), b = c.in(1), cc = c.in_opt(2);
  double alpha = c.attr_float("alpha", 1.0), beta = c.attr_float("beta", 1.0);
  bool ta = c.attr_int("transA", 0) != 0, tb = c.attr_int("transB", 0) != 0;
  if (c.opset() < 7) c.ignore_attr("broadcast");
  if (c.rank(a) != 2 || c.rank(b) != 2)
    c.fail("A and B must be 2-D, got {} and {}", to_string(c.shape(a)), to_string(c.shape(b)));
  // nn.Linear's export: y = x @ W^T + b.
  if (!ta && tb && alpha == 1.0 && (cc == kNone || (beta == 1.0 && c.rank(cc) == 1 &&
                                                    c.shape(cc)[0] == c.shape(b)[0]))) {
    c.out(0, c.op1(OpId::Linear, {a, b, cc}));
    return;
  }
  if (ta) a = c.permute(a, {1, 0});
  if (tb) b = c.permute(b, {1, 0});
  V y = c.op1(OpId::Matmul, {a, b});
  if (alpha != 1.0) y = c.mul(y, c.scalar(alpha, c.dtype(y)));
  if (cc != kNone && beta != 0.0) {
    if (beta != 1.0) cc = c.mul(cc, c.scalar(beta, c.dtype(cc)));
    y = c.add(y, cc);
  }
  c.out(0, y);
}

// ---- spatial attribute resolution --------------------------------------------------------------

struct Window {
  int n = 0;  // spatial dims
  std::vector<int64_t> in, k, s, d, pb, pe, out;
};

// Resolves kernel, strides, dilations, pads (auto_pad) and the output size for pooling or conv
// over the spatial dims of x (dims 2..). `ceil` applies ONNX's ceil_mode.
// The spatial sizes (dims 2..) of x, which must be concrete; N and C may be symbolic (a dynamic
// batch).
std::vector<int64_t> spatial_sizes(NodeCtx& c, V x) {
  Shape s = c.shape(x);
  if (s.size() < 3) c.fail("input must have rank >= 3 ([N, C, spatial...]), got {}", s.size());
  std::vector<int64_t> out;
  for (size_t i = 2; i < s.size(); ++i) {
    if (s[i].is_symbolic())
      c.not_supported("input 'X' has symbolic spatial size {} (shape {}); this mapping needs "
                      "concrete spatial sizes", s[i].str(), to_string(s));
    out.push_back(s[i].value());
  }
  return out;
}

Window resolve_window(NodeCtx& c, V x, const std::vector<int64_t>& kernel, bool ceil) {
  Window w;
  w.in = spatial_sizes(c, x);
  w.n = int(w.in.size());
  w.k = kernel;
  if (int(w.k.size()) != w.n) c.fail("kernel_shape has {} dims, input has {} spatial dims", w.k.size(), w.n);
  w.s = c.attr_ints("strides", std::vector<int64_t>(size_t(w.n), 1));
  w.d = c.attr_ints("dilations", std::vector<int64_t>(size_t(w.n), 1));
  std::vector<int64_t> pads = c.attr_ints("pads", std::vector<int64_t>(size_t(2 * w.n), 0));
  if (int(w.s.size()) != w.n || int(w.d.size()) != w.n || int(pads.size()) != 2 * w.n)
    c.fail("strides/dilations/pads do not match {} spatial dims", w.n);
  std::string auto_pad = c.attr_string("auto_pad", "NOTSET");
  for (int i = 0; i < w.n; ++i) {
    if (w.k[size_t(i)] < 1 || w.s[size_t(i)] < 1 || w.d[size_t(i)] < 1)
      c.fail("kernel, strides and dilations must be >= 1");
    int64_t in = w.in[size_t(i)], k = w.k[size_t(i)], s = w.s[size_t(i)], d = w.d[size_t(i)];
    int64_t ext = (k - 1) * d + 1;
    int64_t pb = pads[size_t(i)], pe = pads[size_t(i + w.n)], out;
    if (pb < 0 || pe < 0) c.fail("pads must be >= 0");
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      out = (in + s - 1) / s;
      int64_t total = std::max<int64_t>((out - 1) * s + ext - in, 0);
      pb = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      pe = total - pb;
    } else if (auto_pad == "VALID") {
      pb = pe = 0;
      out = (in - ext + s) / s;
    } else if (auto_pad == "NOTSET" || auto_pad.empty()) {
      int64_t span = in + pb + pe - ext;
      out = (ceil ? (span + s - 1) / s : span / s) + 1;
      // In ceil mode a last window that would start in the end padding is dropped (as
      // PyTorch does; the ONNX reference agrees since onnx 1.16).
      if (ceil && out > 1 && (out - 1) * s >= in + pb) --out;
      if (span < 0) out = 0;
    } else {
      c.fail("auto_pad must be NOTSET, SAME_UPPER, SAME_LOWER or VALID, got \"{}\"", auto_pad);
    }
    if (out < 1)
      c.fail("spatial dim {} of size {} is too small for kernel {} (dilation {}, pads {}+{})", i,
             in, k, d, pb, pe);
    w.pb.push_back(pb);
    w.pe.push_back(pe);
    w.out.push_back(out);
  }
  return w;
}

// The end padding that makes an unpadded op over the padded input produce exactly `out`
// windows (larger than pe in ceil mode, possibly smaller when the last rows are unused).
int64_t effective_end_pad(const Window& w, int i) {
  int64_t ext = (w.k[size_t(i)] - 1) * w.d[size_t(i)] + 1;
  return (w.out[size_t(i)] - 1) * w.s[size_t(i)] + ext - w.in[size_t(i)] - w.pb[size_t(i)];
}

// Pads the spatial dims of x explicitly to the effective extent.
V pad_spatial(NodeCtx& c, V x, const Window& w, double value) {
  std::vector<int64_t> pads(static_cast<size_t>(2 * w.n));
  bool any = false;
  for (int i = 0; i < w.n; ++i) {
    pads[size_t(i)] = w.pb[size_t(i)];
    pads[size_t(i + w.n)] = effective_end_pad(w, i);
    any |= pads[size_t(i)] != 0 || pads[size_t(i + w.n)] != 0;
  }
  if (!any) return x;
  return c.op1(OpId::Pad, {x}, {{"pads", Ints(pads)}, {"mode", std::string("constant")}, {"value", value}});
}

// x [N, C, L] <-> [N, C, 1, L].
V to_2d(NodeCtx& c, V x) { return c.unsqueeze(x, {2}); }
V from_2d(NodeCtx& c, V y) { return c.squeeze(y, {2}); }

// ---- Conv --------------------------------------------------------------------------------------

V conv2d(NodeCtx& c, V x, V w, V b, Ints stride, Ints padding, Ints dilation, int64_t groups) {
  return c.op1(OpId::Conv2d, {x, w, b},
               {{"stride", stride}, {"padding", padding}, {"dilation", dilation}, {"groups", groups}});
}

}  // namespace

V emit_conv(NodeCtx& c, V x, V w, V b) {
  int64_t groups = c.attr_int("group", 1);
  if (!is_floating(c.dtype(x))) c.not_supported("integer convolution (use ConvInteger)");
  Dims wd = c.dims(w, "weight");
  if (int(wd.size()) != c.rank(x)) c.fail("weight rank {} differs from input rank {}", wd.size(), c.rank(x));
  std::vector<int64_t> kernel(wd.begin() + 2, wd.end());
  if (auto ks = c.attr_ints_opt("kernel_shape"); ks && *ks != kernel)
    c.fail("kernel_shape {} disagrees with the weight's spatial dims {}", to_string(to_shape(Dims(ks->begin(), ks->end()))),
           to_string(to_shape(Dims(kernel.begin(), kernel.end()))));
  Window win = resolve_window(c, x, kernel, false);
  if (win.n == 1) {
    Ints pad = {0, win.pb[0], 0, win.pe[0]};
    V y = conv2d(c, to_2d(c, x), to_2d(c, w), b, {1, win.s[0]}, pad, {1, win.d[0]}, groups);
    return from_2d(c, y);
  }
  if (win.n == 2) {
    Ints pad = win.pb == win.pe ? Ints{win.pb[0], win.pb[1]}
                                : Ints{win.pb[0], win.pb[1], win.pe[0], win.pe[1]};
    return conv2d(c, x, w, b, Ints(win.s), pad, Ints(win.d), groups);
  }
  if (win.n != 3) c.not_supported("{}-D convolution (1-D, 2-D and 3-D are supported)", win.n);
  // 3-D: sum over kernel depth of 2-D convolutions of depth slices (batch and depth folded).
  Dims xd = c.dims(x, "input");
  int64_t n = xd[0], ch = xd[1];
  int64_t kd = kernel[0], sd = win.s[0], dd = win.d[0], od = win.out[0];
  int64_t m = wd[0];
  V xp = x;
  if (win.pb[0] || win.pe[0])
    xp = c.op1(OpId::Pad, {x}, {{"pads", Ints{win.pb[0], 0, 0, win.pe[0], 0, 0}},
                                {"mode", std::string("constant")}, {"value", 0.0}});
  Ints pad2 = {win.pb[1], win.pb[2], win.pe[1], win.pe[2]};
  V acc = kNone;
  for (int64_t i = 0; i < kd; ++i) {
    V xs = c.slice(xp, 2, i * dd, i * dd + (od - 1) * sd + 1, sd);        // [N, C, OD, H, W]
    xs = c.reshape(c.permute(xs, {0, 2, 1, 3, 4}), Shape{n * od, ch, xd[3], xd[4]});
    V wk = c.squeeze(c.slice(w, 2, i, i + 1), {2});                          // [M, C/g, KH, KW]
    V y = conv2d(c, xs, wk, i == 0 ? b : kNone, {win.s[1], win.s[2]}, pad2, {win.d[1], win.d[2]},
                 groups);
    acc = acc == kNone ? y : c.add(acc, y);
  }
  acc = c.reshape(acc, Shape{n, od, m, win.out[1], win.out[2]});
  return c.permute(acc, {0, 2, 1, 3, 4});
}

namespace {

void conv_conv(NodeCtx& c) { c.out(0, emit_conv(c, c.in(0), c.in(1), c.in_opt(2))); }

// ---- ConvTranspose -----------------------------------------------------------------------------

void conv_conv_transpose(NodeCtx& c) {
  V x = c.in(0), w = c.in(1), b = c.in_opt(2);
  int64_t groups = c.attr_int("group", 1);
  Dims xd = c.dims(x, "input"), wd = c.dims(w, "weight");
  int r = int(xd.size()), n = r - 2;
  if (n < 1 || n > 3) c.not_supported("{}-D transposed convolution (1-D to 3-D are supported)", n);
  if (int(wd.size()) != r) c.fail("weight rank {} differs from input rank {}", wd.size(), r);
  std::vector<int64_t> kernel(wd.begin() + 2, wd.end());
  if (auto ks = c.attr_ints_opt("kernel_shape"); ks && *ks != kernel)
    c.fail("kernel_shape disagrees with the weight's spatial dims");
  auto s = c.attr_ints("strides", std::vector<int64_t>(size_t(n), 1));
  auto d = c.attr_ints("dilations", std::vector<int64_t>(size_t(n), 1));
  auto op = c.attr_ints("output_padding", std::vector<int64_t>(size_t(n), 0));
  auto pads = c.attr_ints("pads", std::vector<int64_t>(size_t(2 * n), 0));
  auto out_shape = c.attr_ints("output_shape");
  std::string auto_pad = c.attr_string("auto_pad", "NOTSET");
  if (int(s.size()) != n || int(d.size()) != n || int(op.size()) != n || int(pads.size()) != 2 * n)
    c.fail("strides/dilations/output_padding/pads do not match {} spatial dims", n);
  if (!out_shape.empty() && int(out_shape.size()) > n)  // may include N and C
    out_shape.erase(out_shape.begin(), out_shape.end() - n);
  const size_t nn = size_t(n);
  std::vector<int64_t> pb(nn), pe(nn), full(nn);
  for (int i = 0; i < n; ++i) {
    int64_t in = xd[size_t(i + 2)], ext = (kernel[size_t(i)] - 1) * d[size_t(i)] + 1;
    full[size_t(i)] = s[size_t(i)] * (in - 1) + ext;  // output without padding
    bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
    if (!out_shape.empty() || same) {
      int64_t target = !out_shape.empty() ? out_shape[size_t(i)] : in * s[size_t(i)];
      int64_t total = full[size_t(i)] + op[size_t(i)] - target;
      if (total < 0) {
        // A larger output_shape extends the end with zeros (as output_padding does).
        pb[size_t(i)] = 0;
        pe[size_t(i)] = total;
      } else if (auto_pad == "SAME_UPPER") {
        pb[size_t(i)] = total / 2, pe[size_t(i)] = total - total / 2;
      } else {
        pb[size_t(i)] = total - total / 2, pe[size_t(i)] = total / 2;
      }
      continue;
    } else if (auto_pad == "VALID" || auto_pad == "NOTSET" || auto_pad.empty()) {
      pb[size_t(i)] = auto_pad == "VALID" ? 0 : pads[size_t(i)];
      pe[size_t(i)] = auto_pad == "VALID" ? 0 : pads[size_t(i + n)];
    } else {
      c.fail("auto_pad must be NOTSET, SAME_UPPER, SAME_LOWER or VALID, got \"{}\"", auto_pad);
    }
    if (pb[size_t(i)] < 0 || pe[size_t(i)] < 0) c.fail("pads must be >= 0");
  }
  for (int i = 0; i < n; ++i)
    if (full[size_t(i)] + op[size_t(i)] - pb[size_t(i)] - pe[size_t(i)] < 1)
      c.fail("pads leave spatial dim {} empty", i);
  int64_t m = wd[1] * groups;
  // The Kiln op directly: 2-D, symmetric pads, output_padding within its limits.
  bool direct = n == 2 && pb == pe;
  for (int i = 0; direct && i < n; ++i)
    direct = op[size_t(i)] < std::max(s[size_t(i)], d[size_t(i)]);
  if (direct) {
    c.out(0, c.op1(OpId::ConvTranspose2d, {x, w, b},
                   {{"stride", Ints(s)}, {"padding", Ints{pb[0], pb[1]}},
                    {"output_padding", Ints(op)}, {"dilation", Ints(d)}, {"groups", groups}}));
    return;
  }
  // Otherwise: the unpadded transposed convolution, then crop (pads) / extend (output_padding)
  // with one pad op, then the bias.
  auto deconv = [&](V xi, V wi, Ints st, Ints dl) {
    return c.op1(OpId::ConvTranspose2d, {xi, wi, kNone},
                 {{"stride", st}, {"padding", Ints{0, 0}}, {"output_padding", Ints{0, 0}},
                  {"dilation", dl}, {"groups", groups}});
  };
  V y;
  if (n == 1) {
    y = from_2d(c, deconv(to_2d(c, x), to_2d(c, w), {1, s[0]}, {1, d[0]}));
  } else if (n == 2) {
    y = deconv(x, w, Ints(s), Ints(d));
  } else {
    // 3-D: for each kernel depth, a 2-D transposed convolution of every input depth slice,
    // spread to depth positions id*stride + kd*dilation and summed.
    int64_t bn = xd[0], ch = xd[1], din = xd[2];
    int64_t sd = s[0], dd = d[0], kd = kernel[0];
    V xs = c.reshape(c.permute(x, {0, 2, 1, 3, 4}), Shape{bn * din, ch, xd[3], xd[4]});
    int64_t oh = full[1], ow = full[2];
    V acc = kNone;
    for (int64_t i = 0; i < kd; ++i) {
      V wk = c.squeeze(c.slice(w, 2, i, i + 1), {2});
      V yk = deconv(xs, wk, {s[1], s[2]}, {d[1], d[2]});               // [N*D, M, OH, OW]
      yk = c.reshape(yk, Shape{bn, din, 1, m, oh, ow});
      if (sd > 1)  // interleave stride-1 zero planes after each depth
        yk = c.op1(OpId::Pad, {yk}, {{"pads", Ints{0, 0, 0, 0, sd - 1, 0, 0, 0}},
                                     {"mode", std::string("constant")}, {"value", 0.0}});
      yk = c.reshape(yk, Shape{bn, din * sd, m, oh, ow});
      yk = c.slice(yk, 1, 0, (din - 1) * sd + 1);
      int64_t before = i * dd, after = (kd - 1 - i) * dd;
      if (before || after)
        yk = c.op1(OpId::Pad, {yk}, {{"pads", Ints{before, 0, 0, 0, after, 0, 0, 0}},
                                     {"mode", std::string("constant")}, {"value", 0.0}});
      acc = acc == kNone ? yk : c.add(acc, yk);
    }
    y = c.permute(acc, {0, 2, 1, 3, 4});  // [N, M, OD, OH, OW]
  }
  std::vector<int64_t> crop(static_cast<size_t>(2 * n));
  bool any = false;
  for (int i = 0; i < n; ++i) {
    crop[size_t(i)] = -pb[size_t(i)];
    crop[size_t(i + n)] = op[size_t(i)] - pe[size_t(i)];
    any |= crop[size_t(i)] != 0 || crop[size_t(i + n)] != 0;
  }
  if (any)
    y = c.op1(OpId::Pad, {y}, {{"pads", Ints(crop)}, {"mode", std::string("constant")}, {"value", 0.0}});
  if (b != kNone) {
    Shape bs{SymInt(m)};
    for (int i = 0; i < n; ++i) bs.push_back(1);
    y = c.add(y, c.reshape(b, bs));
  }
  c.out(0, y);
}

// ---- pooling -----------------------------------------------------------------------------------

enum class PoolKind { Max, Avg };

// A 2-D pool over explicitly padded input (no padding, no ceil mode).
V pool2d(NodeCtx& c, PoolKind kind, V x, Ints k, Ints s, Ints d) {
  if (kind == PoolKind::Max)
    return c.op1(OpId::MaxPool2d, {x}, {{"kernel_size", k}, {"stride", s}, {"padding", Ints{0, 0}},
                                         {"dilation", d}, {"ceil_mode", false}});
  return c.op1(OpId::AvgPool2d, {x}, {{"kernel_size", k}, {"stride", s}, {"padding", Ints{0, 0}},
                                       {"ceil_mode", false}, {"count_include_pad", true}});
}

// Dilated average pooling (AveragePool-19's dilations; Kiln's avg_pool2d has none): the mean of
// the kernel's taps, each a strided slice of the padded input.
V avg_pool_taps(NodeCtx& c, V xp, const Window& w) {
  int64_t taps = 1;
  for (int64_t k : w.k) taps *= k;
  V acc = kNone;
  for (int64_t t = 0; t < taps; ++t) {
    V s = xp;
    int64_t rem = t;
    for (int i = w.n - 1; i >= 0; --i) {
      int64_t ki = rem % w.k[size_t(i)], st = ki * w.d[size_t(i)];
      rem /= w.k[size_t(i)];
      s = c.slice(s, 2 + i, st, st + (w.out[size_t(i)] - 1) * w.s[size_t(i)] + 1, w.s[size_t(i)]);
    }
    acc = acc == kNone ? s : c.add(acc, s);
  }
  return c.div(acc, c.scalar(double(taps), c.dtype(acc)));
}

// Pool over explicitly padded x of rank 3..5 (windows fit exactly, `w.out` of them). Avg pools
// return window sums divided by the kernel size (the caller divides by counts).
V pool_padded(NodeCtx& c, PoolKind kind, V xp, const Window& w) {
  if (kind == PoolKind::Avg && w.d != std::vector<int64_t>(size_t(w.n), 1))
    return avg_pool_taps(c, xp, w);
  if (w.n == 1) {
    V y = pool2d(c, kind, to_2d(c, xp), {1, w.k[0]}, {1, w.s[0]}, {1, w.d[0]});
    return from_2d(c, y);
  }
  if (w.n == 2) return pool2d(c, kind, xp, Ints(w.k), Ints(w.s), Ints(w.d));
  if (w.n != 3) c.not_supported("{}-D pooling (1-D, 2-D and 3-D are supported)", w.n);
  Dims pd = c.dims(xp, "padded input");
  int64_t n = pd[0], ch = pd[1], od = w.out[0];
  V acc = kNone;
  for (int64_t i = 0; i < w.k[0]; ++i) {
    V xs = c.slice(xp, 2, i * w.d[0], i * w.d[0] + (od - 1) * w.s[0] + 1, w.s[0]);
    xs = c.reshape(c.permute(xs, {0, 2, 1, 3, 4}), Shape{n * od, ch, pd[3], pd[4]});
    V y = pool2d(c, kind, xs, {w.k[1], w.k[2]}, {w.s[1], w.s[2]}, {w.d[1], w.d[2]});
    acc = acc == kNone ? y : c.op1(kind == PoolKind::Max ? OpId::Maximum : OpId::Add, {acc, y});
  }
  // Avg: the mean of the per-depth 2-D means is the 3-D mean (count-based division by the
  // caller stays exact: it pools its mask the same way).
  if (kind == PoolKind::Avg && w.k[0] > 1) acc = c.div(acc, c.scalar(double(w.k[0]), c.dtype(acc)));
  acc = c.reshape(acc, Shape{n, od, ch, w.out[1], w.out[2]});
  return c.permute(acc, {0, 2, 1, 3, 4});
}

// MaxPool's Indices output: for each window, the flat index (in the unpadded input, over all of
// N, C and the spatial dims) of its maximum; the first maximum in window order wins.
V max_pool_indices(NodeCtx& c, V xp, const Window& w, const Dims& xd, bool column_major) {
  if (w.n != 2) c.not_supported("MaxPool indices output for {}-D pooling (2-D is supported)", w.n);
  int64_t kh = w.k[0], kw = w.k[1], oh = w.out[0], ow = w.out[1];
  std::vector<V> taps;
  for (int64_t i = 0; i < kh; ++i)
    for (int64_t j = 0; j < kw; ++j) {
      V t = c.slice(xp, 2, i * w.d[0], i * w.d[0] + (oh - 1) * w.s[0] + 1, w.s[0]);
      t = c.slice(t, 3, j * w.d[1], j * w.d[1] + (ow - 1) * w.s[1] + 1, w.s[1]);
      taps.push_back(c.unsqueeze(t, {0}));
    }
  V stack = taps.size() == 1 ? taps[0] : c.op1(OpId::Concat, taps, {{"dim", int64_t(0)}});
  V k = c.op1(OpId::Argmax, {stack}, {{"dim", int64_t(0)}, {"keepdim", false}});  // [N, C, OH, OW]
  // Tap -> (row, col) offsets inside the input, then the flat index.
  std::vector<int64_t> drow, dcol;
  for (int64_t i = 0; i < kh; ++i)
    for (int64_t j = 0; j < kw; ++j) drow.push_back(i * w.d[0]), dcol.push_back(j * w.d[1]);
  V kf = c.reshape(k, Shape{SymInt(-1)});
  Shape ks = c.shape(k);
  V r = c.reshape(c.op1(OpId::IndexSelect, {c.constant(Tensor::from_vector(drow, Dims{kh * kw})), kf},
                        {{"dim", int64_t(0)}}), ks);
  V col = c.reshape(c.op1(OpId::IndexSelect, {c.constant(Tensor::from_vector(dcol, Dims{kh * kw})), kf},
                          {{"dim", int64_t(0)}}), ks);
  int64_t n = xd[0], ch = xd[1], h = xd[2], wd = xd[3];
  // Window origins (in input coordinates) and the N*C plane offsets, as constants.
  std::vector<int64_t> row0(static_cast<size_t>(oh)), col0(static_cast<size_t>(ow)), plane(static_cast<size_t>(n * ch));
  for (int64_t i = 0; i < oh; ++i) row0[size_t(i)] = i * w.s[0] - w.pb[0];
  for (int64_t j = 0; j < ow; ++j) col0[size_t(j)] = j * w.s[1] - w.pb[1];
  for (int64_t p = 0; p < n * ch; ++p) plane[size_t(p)] = p * h * wd;
  V rr = c.add(r, c.constant(Tensor::from_vector(row0, Dims{oh, 1})));
  V cc = c.add(col, c.constant(Tensor::from_vector(col0, Dims{1, ow})));
  V within = column_major ? c.add(c.mul(cc, c.scalar(double(h), DType::Int64)), rr)
                          : c.add(c.mul(rr, c.scalar(double(wd), DType::Int64)), cc);
  return c.add(within, c.constant(Tensor::from_vector(plane, Dims{n, ch, 1, 1})));
}

template <PoolKind K>
void conv_pool(NodeCtx& c) {
  V x = c.in(0);
  std::vector<int64_t> kernel = c.attr_ints("kernel_shape");
  if (kernel.empty()) c.fail("attribute 'kernel_shape' is required");
  bool ceil = c.attr_int("ceil_mode", 0) != 0;
  Window w = resolve_window(c, x, kernel, ceil);
  DType dt = c.dtype(x);
  bool store_col = c.attr_int("storage_order", 0) != 0;
  if (K == PoolKind::Max && w.n == 2 && is_floating(dt) && !c.wants_output(1) &&
      w.pb[0] == w.pe[0] && w.pb[1] == w.pe[1] && 2 * w.pb[0] <= w.k[0] && 2 * w.pb[1] <= w.k[1]) {
    // Symmetric pads: Kiln's max_pool2d pads with -inf itself (one op, and the CPU compiler can
    // keep the oneDNN layout of a convolution feeding it). ceil_mode too: max_pool2d's ceil
    // mode is PyTorch's, which resolve_window follows (a last window starting in the end
    // padding dropped); GoogLeNet's ceil-mode pools were an explicit -inf pad (an eager kernel)
    // plus a pool. The output size is checked against the window's all the same.
    V y = c.op1(OpId::MaxPool2d, {x}, {{"kernel_size", Ints(w.k)}, {"stride", Ints(w.s)},
                                       {"padding", Ints{w.pb[0], w.pb[1]}},
                                       {"dilation", Ints(w.d)}, {"ceil_mode", ceil}});
    Shape ys = c.shape(y);
    if (!ceil || (ys[2] == SymInt(w.out[0]) && ys[3] == SymInt(w.out[1]))) {
      c.out(0, y);
      return;
    }
  }
  if (K == PoolKind::Avg && w.n == 2 && is_floating(dt) && !ceil && w.d[0] == 1 && w.d[1] == 1 &&
      w.pb[0] == w.pe[0] && w.pb[1] == w.pe[1] && 2 * w.pb[0] <= w.k[0] &&
      2 * w.pb[1] <= w.k[1]) {
    // Symmetric pads without ceil_mode: every window lies inside the padded input, so ONNX's
    // divisor (the window's size, or its elements inside the input without count_include_pad)
    // is avg_pool2d's. One op, where the general path below is a pad (an eager kernel), a pool
    // and a division, and a convolution's oneDNN layout can flow through it (Inception's
    // 3x3 stride-1 pools, issue #17).
    c.out(0, c.op1(OpId::AvgPool2d, {x}, {{"kernel_size", Ints(w.k)}, {"stride", Ints(w.s)},
                                          {"padding", Ints{w.pb[0], w.pb[1]}},
                                          {"ceil_mode", false},
                                          {"count_include_pad", c.attr_int("count_include_pad", 0) != 0}}));
    return;
  }
  if (K == PoolKind::Max) {
    // Integer inputs pool exactly in float32 (8-bit) or float64 (32/64-bit).
    DType work = is_floating(dt) ? dt : (dtype_size(dt) <= 2 ? DType::Float32 : DType::Float64);
    V xw = c.cast(x, work);
    V xp = pad_spatial(c, xw, w, -std::numeric_limits<double>::infinity());
    c.out(0, c.cast(pool_padded(c, K, xp, w), dt));
    if (c.wants_output(1)) c.out(1, max_pool_indices(c, xp, w, c.dims(x, "input"), store_col));
    return;
  }
  bool include_pad = c.attr_int("count_include_pad", 0) != 0;
  bool padded = false;
  for (int i = 0; i < w.n; ++i) padded |= w.pb[size_t(i)] || effective_end_pad(w, i);
  V xp = pad_spatial(c, x, w, 0.0);
  V sum = pool_padded(c, K, xp, w);
  if (!padded) {
    c.out(0, sum);
    return;
  }
  // Divide by the number of counted elements per window: a mask over the padded extent (ones
  // over the input, and over the declared pads when they count), pooled the same way. The
  // mask is a constant, so its pooled counts fold at import.
  Dims md{1, 1};
  for (int i = 0; i < w.n; ++i) md.push_back(w.in[size_t(i)]);
  Tensor ones = Tensor::full(md, 1.0, dt);
  V mask = c.constant(ones);
  if (include_pad) {  // declared pads count, the ceil-mode extension does not
    std::vector<int64_t> pads(static_cast<size_t>(2 * w.n));
    for (int i = 0; i < w.n; ++i) pads[size_t(i)] = w.pb[size_t(i)], pads[size_t(i + w.n)] = w.pe[size_t(i)];
    mask = c.op1(OpId::Pad, {mask}, {{"pads", Ints(pads)}, {"mode", std::string("constant")}, {"value", 1.0}});
    Window shifted = w;  // the mask now starts at the padded origin
    for (int i = 0; i < w.n; ++i) {
      shifted.in[size_t(i)] += w.pb[size_t(i)] + w.pe[size_t(i)];
      shifted.pb[size_t(i)] = 0;
    }
    mask = pad_spatial(c, mask, shifted, 0.0);
  } else {
    mask = pad_spatial(c, mask, w, 0.0);
  }
  V count = pool_padded(c, K, mask, w);
  c.out(0, c.div(sum, count));
}

// LpPool: (sum over the window of |x|^p)^(1/p), zero padding (which adds nothing). The window
// sums are average pools over the explicitly padded |x|^p times the kernel size. Opset 18 adds
// ceil_mode and dilations.
void conv_lp_pool(NodeCtx& c) {
  V x = c.in(0);
  std::vector<int64_t> kernel = c.attr_ints("kernel_shape");
  if (kernel.empty()) c.fail("attribute 'kernel_shape' is required");
  double p = double(c.attr_int("p", 2));
  if (p <= 0) c.fail("p must be positive, got {}", p);
  bool ceil = c.opset() >= 18 && c.attr_int("ceil_mode", 0) != 0;
  if (c.opset() < 18 && c.has_attr("dilations"))
    c.fail("attribute 'dilations' needs opset 18 (the model imports opset {})", c.opset());
  Window w = resolve_window(c, x, kernel, ceil);
  DType dt = c.dtype(x);
  V ax = c.op1(OpId::Abs, {x});
  V xp = p == 2 ? c.mul(x, x) : p == 1 ? ax : c.op1(OpId::Pow, {ax, c.scalar(p, dt)});
  V avg = pool_padded(c, PoolKind::Avg, pad_spatial(c, xp, w, 0.0), w);
  int64_t taps = 1;
  for (int64_t k : w.k) taps *= k;
  V sum = c.mul(avg, c.scalar(double(taps), dt));
  c.out(0, p == 1 ? sum : p == 2 ? c.op1(OpId::Sqrt, {sum}) : c.op1(OpId::Pow, {sum, c.scalar(1 / p, dt)}));
}

void conv_global_lp_pool(NodeCtx& c) {
  V x = c.in(0);
  if (c.rank(x) < 3) c.fail("input must have rank >= 3, got {}", c.rank(x));
  double p = double(c.attr_int("p", 2));
  if (p <= 0) c.fail("p must be positive, got {}", p);
  DType dt = c.dtype(x);
  Ints dims;
  for (int i = 2; i < c.rank(x); ++i) dims.push_back(i);
  V ax = c.op1(OpId::Abs, {x});
  V xp = p == 2 ? c.mul(x, x) : p == 1 ? ax : c.op1(OpId::Pow, {ax, c.scalar(p, dt)});
  V sum = c.op1(OpId::Sum, {xp}, {{"dims", dims}, {"keepdim", true}});
  c.out(0, p == 1 ? sum : p == 2 ? c.op1(OpId::Sqrt, {sum}) : c.op1(OpId::Pow, {sum, c.scalar(1 / p, dt)}));
}

void conv_global_pool(NodeCtx& c, OpId op) {
  V x = c.in(0);
  if (c.rank(x) < 3) c.fail("input must have rank >= 3, got {}", c.rank(x));
  Ints dims;
  for (int i = 2; i < c.rank(x); ++i) dims.push_back(i);
  c.out(0, c.op1(op, {x}, {{"dims", dims}, {"keepdim", true}}));
}
void conv_global_avg(NodeCtx& c) {
  V x = c.in(0);
  if (c.rank(x) == 4 && is_floating(c.dtype(x))) {  // NCHW: Kiln's adaptive pool to 1x1
    c.out(0, c.op1(OpId::AdaptiveAvgPool2d, {x}, {{"output_size", Ints{1, 1}}}));
    return;
  }
  conv_global_pool(c, OpId::Mean);
}
void conv_global_max(NodeCtx& c) { conv_global_pool(c, OpId::Max); }

// ---- normalization -----------------------------------------------------------------------------

// [C] -> [C, 1, ...] for broadcasting against [N, C, spatial...].
V per_channel(NodeCtx& c, V p, int rank) {
  Shape s = c.shape(p);
  for (int i = 2; i < rank; ++i) s.push_back(1);
  return c.reshape(p, s);
}

void conv_batch_norm(NodeCtx& c) {
  V x = c.in(0), scale = c.in(1), bias = c.in(2), mean = c.in(3), var = c.in(4);
  double eps = c.attr_float("epsilon", 1e-5);
  double momentum = c.attr_float("momentum", 0.9);
  bool training = c.attr_int("training_mode", 0) != 0;
  if (c.opset() < 7) training = c.attr_int("is_test", 0) == 0;
  if (c.opset() < 9 && c.attr_int("spatial", 1) == 0)
    c.not_supported("spatial = 0 (per-activation statistics)");
  c.ignore_attr("consumed_inputs");
  int r = c.rank(x);
  if (r < 2) c.fail("input must have rank >= 2, got {}", r);
  if (!training) {
    for (size_t i = 1; i < c.num_outputs(); ++i)
      if (c.wants_output(i)) c.not_supported("output {} exists only in training mode", i);
    c.out(0, c.op1(OpId::BatchNorm, {x, mean, var, scale, bias}, {{"eps", eps}}));
    return;
  }
  if (c.opset() < 14)
    c.not_supported("training-mode batch norm before opset 14 (its outputs differ)");
  // Batch statistics (biased variance) normalize; running statistics update with momentum.
  Ints axes = {0};
  for (int i = 2; i < r; ++i) axes.push_back(i);
  V bm = c.op1(OpId::Mean, {x}, {{"dims", axes}, {"keepdim", false}});
  V bv = c.op1(OpId::Var, {x}, {{"dims", axes}, {"keepdim", false}, {"correction", int64_t(0)}});
  V inv = c.op1(OpId::Rsqrt, {c.add(bv, c.scalar(eps, c.dtype(bv)))});
  V y = c.mul(c.sub(x, per_channel(c, bm, r)), per_channel(c, c.mul(inv, scale), r));
  c.out(0, c.add(y, per_channel(c, bias, r)));
  V mo = c.scalar(momentum, c.dtype(mean)), mo1 = c.scalar(1 - momentum, c.dtype(mean));
  c.out(1, c.add(c.mul(mean, mo), c.mul(bm, mo1)));
  c.out(2, c.add(c.mul(var, mo), c.mul(bv, mo1)));
}

void conv_instance_norm(NodeCtx& c) {
  V x = c.in(0), scale = c.in(1), bias = c.in(2);
  double eps = c.attr_float("epsilon", 1e-5);
  if (c.rank(x) < 3) c.fail("input must have rank >= 3, got {}", c.rank(x));
  SymInt ch = c.shape(x)[1];
  if (ch.is_symbolic()) c.not_supported("symbolic channel count {}", ch.str());
  c.out(0, c.op1(OpId::GroupNorm, {x, scale, bias}, {{"num_groups", ch.value()}, {"eps", eps}}));
}

void conv_layer_norm(NodeCtx& c) {
  V x = c.in(0), scale = c.in(1), bias = c.in_opt(2);
  int r = c.rank(x);
  int64_t a = c.axis(c.attr_int("axis", -1), r, "axis");
  double eps = c.attr_float("epsilon", 1e-5);
  int64_t stash = c.attr_int("stash_type", 1);
  if (stash != 1) c.not_supported("stash_type {} (only 1, float32 statistics)", stash);
  Shape ns;
  Ints dims;
  for (int i = int(a); i < r; ++i) ns.push_back(c.shape(x)[size_t(i)]), dims.push_back(i);
  bool stats = c.wants_output(1) || c.wants_output(2);
  bool exact_params = c.shape(scale) == ns && (bias == kNone || c.shape(bias) == ns);
  if (!stats && exact_params) {
    Ints nsr;
    for (SymInt d : ns) nsr.push_back(d.raw());
    c.out(0, c.op1(OpId::LayerNorm, {x, scale, bias}, {{"normalized_shape", nsr}, {"eps", eps}}));
    return;
  }
  // Composed (statistics requested, or parameters that only broadcast to the normalized dims).
  DType dt = c.dtype(x);
  V xf = c.cast(x, DType::Float32 == dt || dt == DType::Float64 ? dt : DType::Float32);
  V mean = c.op1(OpId::Mean, {xf}, {{"dims", dims}, {"keepdim", true}});
  V dev = c.sub(xf, mean);
  V var = c.op1(OpId::Mean, {c.mul(dev, dev)}, {{"dims", dims}, {"keepdim", true}});
  V inv = c.op1(OpId::Rsqrt, {c.add(var, c.scalar(eps, c.dtype(var)))});
  V y = c.cast(c.mul(dev, inv), dt);
  y = c.mul(y, scale);
  if (bias != kNone) y = c.add(y, bias);
  c.out(0, y);
  c.out(1, c.cast(mean, DType::Float32));
  c.out(2, c.cast(inv, DType::Float32));
}

// GroupNormalization: opset 18 gives scale and bias per group (repeated over the group's
// channels here), opset 21 per channel and adds stash_type (the statistics' precision; the
// affine stage runs in x's type).
void conv_group_norm(NodeCtx& c) {
  V x = c.in(0), scale = c.in(1), bias = c.in(2);
  int64_t groups = c.attr_int("num_groups", 0);
  double eps = c.attr_float("epsilon", 1e-5);
  if (groups < 1) c.fail("num_groups must be >= 1, got {}", groups);
  if (c.rank(x) < 3) c.fail("input must have rank >= 3 ([N, C, ...]), got {}", c.rank(x));
  SymInt ch = c.shape(x)[1];
  if (ch.is_symbolic()) c.not_supported("symbolic channel count {}", ch.str());
  if (ch.value() % groups != 0)
    c.fail("{} channels do not divide into {} groups", ch.value(), groups);
  DType dt = c.dtype(x), stash = DType::Float32;
  if (c.opset() >= 21) {
    int64_t st = c.attr_int("stash_type", 1);
    if (!dtype_from_onnx(int32_t(st), &stash) || !is_floating(stash))
      c.fail("stash_type {} is not a floating-point type", st);
  } else {
    // Opset 18: one value per group, repeated over its C / G channels.
    int64_t per = ch.value() / groups;
    auto repeat_per_group = [&](V p, const char* what) {
      if (c.shape(p) != Shape{SymInt(groups)})
        c.fail("{} must have shape [{}] (one per group, opset {}), got {}", what, groups,
               c.opset(), to_string(c.shape(p)));
      V e = c.op1(OpId::Expand, {c.reshape(p, Shape{SymInt(groups), SymInt(1)})},
                  {{"shape", Ints{groups, per}}});
      return c.reshape(e, Shape{ch});
    };
    scale = repeat_per_group(scale, "scale");
    bias = repeat_per_group(bias, "bias");
  }
  Attrs at{{"num_groups", groups}, {"eps", eps}};
  if (dt == stash || (dt == DType::Float64 && stash == DType::Float32)) {
    c.out(0, c.op1(OpId::GroupNorm, {x, scale, bias}, at));
    return;
  }
  // Statistics in stash_type, then the affine stage in x's type.
  V y = c.cast(c.op1(OpId::GroupNorm, {c.cast(x, stash), kNone, kNone}, at), dt);
  c.out(0, c.add(c.mul(y, per_channel(c, scale, c.rank(x))), per_channel(c, bias, c.rank(x))));
}

// RMSNormalization (opset 23): x / sqrt(mean(x^2 over axis..) + epsilon) in stash_type, cast
// back to x's type, times scale.
void conv_rms_norm(NodeCtx& c) {
  V x = c.in(0), scale = c.in(1);
  int r = c.rank(x);
  int64_t a = c.axis(c.attr_int("axis", -1), r, "axis");
  double eps = c.attr_float("epsilon", 1e-5);
  DType stash = DType::Float32, dt = c.dtype(x);
  int64_t st = c.attr_int("stash_type", 1);
  if (!dtype_from_onnx(int32_t(st), &stash) || !is_floating(stash))
    c.fail("stash_type {} is not a floating-point type", st);
  Ints dims;
  for (int i = int(a); i < r; ++i) dims.push_back(i);
  V xs = c.cast(x, stash);
  V ms = c.op1(OpId::Mean, {c.mul(xs, xs)}, {{"dims", dims}, {"keepdim", true}});
  V rms = c.op1(OpId::Sqrt, {c.add(ms, c.scalar(eps, stash))});
  c.out(0, c.mul(c.cast(c.div(xs, rms), dt), scale));
}

// LpNormalization: x / ||x||_p along axis (p = 1 or 2); a zero norm gives zeros.
void conv_lp_norm(NodeCtx& c) {
  V x = c.in(0);
  int64_t a = c.axis(c.attr_int("axis", -1), c.rank(x), "axis");
  int64_t p = c.attr_int("p", 2);
  if (p != 1 && p != 2) c.fail("p must be 1 or 2, got {}", p);
  DType dt = c.dtype(x);
  Attrs red{{"dims", Ints{a}}, {"keepdim", true}};
  V norm = p == 1 ? c.op1(OpId::Sum, {c.op1(OpId::Abs, {x})}, red)
                  : c.op1(OpId::Sqrt, {c.op1(OpId::Sum, {c.mul(x, x)}, red)});
  V zero = c.op1(OpId::Eq, {norm, c.scalar(0, dt)});
  V safe = c.op1(OpId::Where, {zero, c.scalar(1, dt), norm});
  c.out(0, c.op1(OpId::Where, {zero, c.scalar(0, dt), c.div(x, safe)}));
}

void conv_lrn(NodeCtx& c) {
  V x = c.in(0);
  int64_t size = c.attr_int("size", 0);
  double alpha = c.attr_float("alpha", 1e-4), beta = c.attr_float("beta", 0.75),
         bias = c.attr_float("bias", 1.0);
  if (size < 1) c.fail("size must be >= 1, got {}", size);
  Dims xd = c.dims(x, "input");
  if (xd.size() < 3) c.fail("input must have rank >= 3, got {}", xd.size());
  int64_t n = xd[0], ch = xd[1], rest = 1;
  for (size_t i = 2; i < xd.size(); ++i) rest *= xd[i];
  // The channel-window sum of squares as an average pool over [N, 1, C, rest].
  int64_t lo = (size - 1) / 2, hi = size - 1 - lo;
  V sq = c.reshape(c.mul(x, x), Shape{n, 1, ch, rest});
  sq = c.op1(OpId::Pad, {sq}, {{"pads", Ints{lo, 0, hi, 0}}, {"mode", std::string("constant")}, {"value", 0.0}});
  V avg = c.op1(OpId::AvgPool2d, {sq}, {{"kernel_size", Ints{size, 1}}, {"stride", Ints{1, 1}},
                                         {"padding", Ints{0, 0}}, {"ceil_mode", false},
                                         {"count_include_pad", true}});
  avg = c.reshape(avg, c.shape(x));
  DType dt = c.dtype(x);
  V base = c.add(c.mul(avg, c.scalar(alpha, dt)), c.scalar(bias, dt));
  c.out(0, c.div(x, c.op1(OpId::Pow, {base, c.scalar(beta, dt)})));
}

void conv_mvn(NodeCtx& c) {
  V x = c.in(0);
  std::vector<int64_t> axes = c.attr_ints("axes", {0, 2, 3});
  Ints dims;
  for (int64_t a : axes) dims.push_back(c.axis(a, c.rank(x), "axis"));
  // As ONNX's function body: (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9).
  V mean = c.op1(OpId::Mean, {x}, {{"dims", dims}, {"keepdim", true}});
  V msq = c.op1(OpId::Mean, {c.mul(x, x)}, {{"dims", dims}, {"keepdim", true}});
  V sd = c.op1(OpId::Sqrt, {c.sub(msq, c.mul(mean, mean))});
  V den = c.add(sd, c.scalar(1e-9, c.dtype(x)));
  c.out(0, c.div(c.sub(x, mean), den));
}

// ---- softmax family ----------------------------------------------------------------------------

// Opset < 13 coerces the input to 2-D at `axis` and normalizes over the trailing block.
template <OpId K>
void conv_softmax(NodeCtx& c) {
  V x = c.in(0);
  int r = c.rank(x);
  if (c.opset() >= 13) {
    int64_t a = c.axis(c.attr_int("axis", -1), r, "axis");
    c.out(0, c.op1(K, {x}, {{"dim", a}}));
    return;
  }
  int64_t a = c.axis(c.attr_int("axis", 1), r, "axis");
  if (a == r - 1 || r == 0) {
    c.out(0, c.op1(K, {x}, {{"dim", int64_t(-1)}}));
    return;
  }
  SymInt outer = 1, inner = 1;
  for (int i = 0; i < r; ++i) (i < a ? outer : inner) *= c.shape(x)[size_t(i)];
  V y = c.op1(K, {c.reshape(x, Shape{outer, inner})}, {{"dim", int64_t(1)}});
  c.out(0, c.reshape(y, c.shape(x)));
}

void conv_hardmax(NodeCtx& c) {
  V x = c.in(0);
  int r = c.rank(x);
  V xx = x;
  int64_t a;
  if (c.opset() >= 13) {
    a = c.axis(c.attr_int("axis", -1), r, "axis");
  } else {
    int64_t ca = c.axis(c.attr_int("axis", 1), r, "axis");
    SymInt outer = 1, inner = 1;
    for (int i = 0; i < r; ++i) (i < ca ? outer : inner) *= c.shape(x)[size_t(i)];
    xx = c.reshape(x, Shape{outer, inner});
    a = 1;
  }
  int rr = c.rank(xx);
  int64_t n = c.dims(xx, "input")[size_t(a)];
  V am = c.op1(OpId::Argmax, {xx}, {{"dim", a}, {"keepdim", true}});
  Dims rs(size_t(rr), 1);
  rs[size_t(a)] = n;
  V range = c.reshape(c.constant(Tensor::arange(n)), to_shape(rs));
  V y = c.cast(c.op1(OpId::Eq, {range, am}), c.dtype(x));
  c.out(0, c.reshape(y, c.shape(x)));
}

// ---- losses ------------------------------------------------------------------------------------

// NLL over log-probabilities lp [N, C, d...] and integer targets [N, d...].
V nll(NodeCtx& c, V lp, V target, V weight, std::optional<int64_t> ignore, const std::string& reduction) {
  int r = c.rank(lp);
  if (r < 2) c.fail("input must have rank >= 2 ([N, C, ...]), got {}", r);
  if (c.rank(target) != r - 1) c.fail("target must have rank {}, got {}", r - 1, c.rank(target));
  DType dt = c.dtype(lp);
  V t = c.cast(target, DType::Int64);
  V keep = kNone;
  if (ignore) {
    keep = c.op1(OpId::Ne, {t, c.scalar(double(*ignore), DType::Int64)});
    t = c.op1(OpId::Where, {keep, t, c.scalar(0, DType::Int64)});  // ignored rows read class 0
  }
  V picked = c.squeeze(c.op1(OpId::Gather, {lp, c.unsqueeze(t, {1})}, {{"dim", int64_t(1)}}), {1});
  V w = kNone;
  if (weight != kNone) {
    Shape ts = c.shape(t);
    w = c.reshape(c.op1(OpId::IndexSelect, {weight, c.reshape(t, Shape{SymInt(-1)})}, {{"dim", int64_t(0)}}), ts);
  }
  if (keep != kNone) {
    V kf = c.cast(keep, dt);
    w = w == kNone ? kf : c.mul(w, kf);
  }
  V loss = c.op1(OpId::Neg, {picked});
  if (w != kNone) loss = c.mul(loss, w);
  if (reduction == "none") return loss;
  V total = c.op1(OpId::Sum, {loss}, {{"dims", Ints{}}, {"keepdim", false}});
  if (reduction == "sum") return total;
  if (reduction != "mean") c.fail("reduction must be none, sum or mean, got \"{}\"", reduction);
  if (w == kNone) return c.op1(OpId::Mean, {loss}, {{"dims", Ints{}}, {"keepdim", false}});
  return c.div(total, c.op1(OpId::Sum, {w}, {{"dims", Ints{}}, {"keepdim", false}}));
}

void conv_nll_loss(NodeCtx& c) {
  V lp = c.in(0), target = c.in(1), weight = c.in_opt(2);
  std::string reduction = c.attr_string("reduction", "mean");
  c.out(0, nll(c, lp, target, weight, c.attr_int_opt("ignore_index"), reduction));
}

void conv_softmax_ce_loss(NodeCtx& c) {
  V scores = c.in(0), labels = c.in(1), weight = c.in_opt(2);
  std::string reduction = c.attr_string("reduction", "mean");
  if (c.rank(scores) < 2) c.fail("scores must have rank >= 2, got {}", c.rank(scores));
  V lp = c.op1(OpId::LogSoftmax, {scores}, {{"dim", int64_t(1)}});
  c.out(0, nll(c, lp, labels, weight, c.attr_int_opt("ignore_index"), reduction));
  c.out(1, lp);
}

}  // namespace

std::vector<OpId> conv_kiln_ops() {
  using enum OpId;
  return {Conv2d, Unsqueeze, Squeeze, Pad, Slice, Permute, Reshape, Add};
}

void add_nn_converters(std::vector<OnnxOpEntry>& t) {
  using enum OpId;
  t.push_back({"MatMul", conv_matmul, {Matmul}, ""});
  t.push_back({"Gemm", conv_gemm, {Linear, Permute, Matmul, Mul, Add},
               "linear for x @ W^T + b; otherwise permute/matmul/mul/add"});
  t.push_back({"Conv", conv_conv, conv_kiln_ops(),
               "1-D/3-D through conv2d (see Note [ONNX spatial ops])"});
  t.push_back({"ConvTranspose", conv_conv_transpose,
               {ConvTranspose2d, Unsqueeze, Squeeze, Pad, Slice, Permute, Reshape, Add},
               "1-D/3-D through conv_transpose2d; asymmetric pads by cropping"});
  t.push_back({"MaxPool", conv_pool<PoolKind::Max>,
               {MaxPool2d, Pad, Cast, Unsqueeze, Squeeze, Slice, Permute, Reshape, Maximum, Concat,
                Argmax, IndexSelect, Mul, Add},
               "-inf padding; Indices output for 2-D; integer inputs pooled in float"});
  t.push_back({"AveragePool", conv_pool<PoolKind::Avg>,
               {AvgPool2d, Pad, Unsqueeze, Squeeze, Slice, Permute, Reshape, Add, Div},
               "window sums / counted elements (count_include_pad, ceil_mode); dilations (opset "
               "19) as a sum of strided slices"});
  t.push_back({"GlobalAveragePool", conv_global_avg, {AdaptiveAvgPool2d, Mean},
               "adaptive_avg_pool2d to 1x1 (4-D); mean over spatial dims otherwise"});
  t.push_back({"GlobalMaxPool", conv_global_max, {Max}, "max over spatial dims"});
  t.push_back({"BatchNormalization", conv_batch_norm,
               {BatchNorm, Mean, Var, Rsqrt, Add, Mul, Sub, Reshape},
               "inference; training_mode composed from batch statistics"});
  t.push_back({"InstanceNormalization", conv_instance_norm, {GroupNorm}, "group_norm with C groups"});
  t.push_back({"LayerNormalization", conv_layer_norm, {LayerNorm, Cast, Mean, Sub, Mul, Add, Rsqrt},
               "layer_norm; composed when Mean/InvStdDev are requested"});
  t.push_back({"GroupNormalization", conv_group_norm,
               {GroupNorm, Expand, Reshape, Cast, Mul, Add},
               "group_norm; opset 18's per-group scale/bias repeated per channel"});
  t.push_back({"RMSNormalization", conv_rms_norm, {Cast, Mul, Mean, Add, Sqrt, Div},
               "x / sqrt(mean(x^2) + eps) in stash_type, times scale"});
  t.push_back({"LpNormalization", conv_lp_norm, {Abs, Sum, Mul, Sqrt, Eq, Where, Div},
               "x / ||x||_p; a zero norm gives zeros"});
  std::vector<OpId> lp = {AvgPool2d, Pad, Unsqueeze, Squeeze, Slice, Permute, Reshape, Add, Div,
                          Abs, Mul, Pow, Sqrt};
  t.push_back({"LpPool", conv_lp_pool, lp, "average pool of |x|^p times the kernel size, ^(1/p)"});
  t.push_back({"GlobalLpPool", conv_global_lp_pool, {Abs, Mul, Pow, Sum, Sqrt},
               "(sum over spatial dims of |x|^p)^(1/p)"});
  t.push_back({"LRN", conv_lrn, {Mul, Reshape, Pad, AvgPool2d, Add, Pow, Div},
               "channel-window average pool"});
  t.push_back({"MeanVarianceNormalization", conv_mvn, {Mean, Mul, Sqrt, Sub, Add, Div}, ""});
  t.push_back({"Softmax", conv_softmax<Softmax>, {Softmax, Reshape}, "opset < 13: 2-D coercion"});
  t.push_back({"LogSoftmax", conv_softmax<LogSoftmax>, {LogSoftmax, Reshape}, "opset < 13: 2-D coercion"});
  t.push_back({"Hardmax", conv_hardmax, {Argmax, Reshape, Eq, Cast}, "one-hot of argmax"});
  std::vector<OpId> loss = {Cast, Ne, Where, Gather, Unsqueeze, Squeeze, IndexSelect, Reshape, Mul,
                            Neg, Sum, Mean, Div};
  t.push_back({"NegativeLogLikelihoodLoss", conv_nll_loss, loss, "gather of target log-probs"});
  loss.push_back(LogSoftmax);
  t.push_back({"SoftmaxCrossEntropyLoss", conv_softmax_ce_loss, loss, "log_softmax + NLL"});
}

}  // namespace kiln::onnx
