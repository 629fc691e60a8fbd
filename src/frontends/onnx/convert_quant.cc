// ONNX quantization ops, composed from Kiln ops: QuantizeLinear, DequantizeLinear,
// DynamicQuantizeLinear, MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv. Integer
// accumulations run exactly (int32 matmul, float64 convolution of integer values);
// requantization rounds half to even and saturates, as the spec says.
#include "frontends/onnx/convert.h"

namespace kiln::onnx {
namespace {

struct QRange {
  double lo, hi;
};
QRange qrange(NodeCtx& c, DType d) {
  if (d == DType::UInt8) return {0, 255};
  if (d == DType::Int8) return {-128, 127};
  if (d == DType::Int32) return {-2147483648.0, 2147483647.0};
  c.not_supported("quantized type {} (uint8, int8 are supported)", dtype_name(d));
}

// A per-tensor (scalar or one-element) or per-axis (1-D) quantization parameter, shaped to
// broadcast against a rank-r tensor along `axis` (possibly negative; only per-axis
// parameters use it).
V qparam(NodeCtx& c, V p, int r, int64_t axis) {
  int pr = c.rank(p);
  if (pr == 0 || (pr == 1 && c.shape(p)[0] == SymInt(1))) return c.reshape(p, {});
  if (pr != 1) c.fail("scale and zero point must be scalars or 1-D, got rank {}", pr);
  axis = c.axis(axis, r, "axis");
  Shape s(size_t(r), SymInt(1));
  s[size_t(axis)] = c.shape(p)[0];
  return c.reshape(p, s);
}

// A quantization parameter for x (shape xs) with blocked quantization (opset 21 block_size > 0):
// p has x's rank, with ceil(D / block) entries along axis; each is repeated block times.
// Without a block size, qparam's per-tensor / per-axis forms.
V qparam_for(NodeCtx& c, V p, const Shape& xs, int64_t axis, int64_t block) {
  int r = int(xs.size());
  if (block <= 0) return qparam(c, p, r, axis);
  axis = c.axis(axis, r, "axis");
  if (c.rank(p) != r)
    c.fail("blocked quantization (block_size {}) needs scale/zero point of the input's rank {}, "
           "got rank {}", block, r, c.rank(p));
  Dims pd = c.dims(p, "scale / zero point");
  SymInt d = xs[size_t(axis)];
  if (d.is_symbolic()) c.not_supported("blocked quantization along symbolic dim {}", d.str());
  int64_t blocks = pd[size_t(axis)];
  if (blocks * block < d.value() || (blocks - 1) * block >= d.value())
    c.fail("block_size {} does not fit {} blocks along axis {} of size {}", block, blocks, axis,
           d.value());
  Shape up;  // [..., blocks, 1, ...] -> [..., blocks, block, ...] -> [..., blocks * block, ...]
  Ints ex;
  for (int i = 0; i < r; ++i) {
    up.push_back(pd[size_t(i)]);
    ex.push_back(pd[size_t(i)]);
    if (i == axis) up.push_back(1), ex.push_back(block);
  }
  V rep = c.op1(OpId::Expand, {c.reshape(p, up)}, {{"shape", ex}});
  Shape flat;
  for (int i = 0; i < r; ++i) flat.push_back(i == axis ? SymInt(blocks * block) : SymInt(pd[size_t(i)]));
  return c.slice(c.reshape(rep, flat), axis, 0, d.value());
}

// saturate(round(v) + zp) as `to`. v and zp are float.
V requantize(NodeCtx& c, V v, V zp_f, DType to) {
  QRange q = qrange(c, to);
  V y = c.op1(OpId::Round, {v});
  if (zp_f != kNone) y = c.add(y, zp_f);
  y = c.op1(OpId::Clamp, {y}, {{"min", q.lo}, {"max", q.hi}});
  return c.cast(y, to);
}

// An ONNX dtype attribute (0 = not given) as a Kiln dtype.
std::optional<DType> dtype_attr(NodeCtx& c, std::string_view name) {
  int64_t t = c.attr_int(name, 0);
  if (t == 0) return std::nullopt;
  DType d = DType::Float32;
  if (!dtype_from_onnx(int32_t(t), &d)) c.not_supported("{} {} is not supported by Kiln", name, onnx_type_name(int32_t(t)));
  return d;
}

// Opset 19 adds saturate (float8 outputs only, which Kiln does not have: validated, no effect),
// 21 block_size and output_dtype, 23 precision (the division's type).
void conv_quantize_linear(NodeCtx& c) {
  V x = c.in(0), scale = c.in(1), zp = c.in_opt(2);
  int64_t axis = c.opset() >= 13 ? c.attr_int("axis", 1) : 1;
  if (c.opset() >= 19) {
    int64_t sat = c.attr_int("saturate", 1);
    if (sat != 0 && sat != 1) c.fail("saturate must be 0 or 1, got {}", sat);
  }
  int64_t block = c.opset() >= 21 ? c.attr_int("block_size", 0) : 0;
  if (block < 0) c.fail("block_size must be >= 0, got {}", block);
  std::optional<DType> out_dtype = c.opset() >= 21 ? dtype_attr(c, "output_dtype") : std::nullopt;
  std::optional<DType> precision = c.opset() >= 23 ? dtype_attr(c, "precision") : std::nullopt;
  if (out_dtype && zp != kNone && *out_dtype != c.dtype(zp))
    c.fail("output_dtype {} differs from the zero point's type {}", dtype_name(*out_dtype),
           dtype_name(c.dtype(zp)));
  DType to = zp != kNone ? c.dtype(zp) : out_dtype.value_or(DType::UInt8);
  DType work = precision ? *precision
                         : (c.dtype(x) == DType::Float64 ? DType::Float64 : DType::Float32);
  Shape xs = c.shape(x);
  V v = c.div(c.cast(x, work), c.cast(qparam_for(c, scale, xs, axis, block), work));
  V z = zp == kNone ? kNone : c.cast(qparam_for(c, zp, xs, axis, block), work);
  c.out(0, requantize(c, v, z, to));
}

void conv_dequantize_linear(NodeCtx& c) {
  V x = c.in(0), scale = c.in(1), zp = c.in_opt(2);
  int64_t axis = c.opset() >= 13 ? c.attr_int("axis", 1) : 1;
  int64_t block = c.opset() >= 21 ? c.attr_int("block_size", 0) : 0;
  if (block < 0) c.fail("block_size must be >= 0, got {}", block);
  std::optional<DType> out_dtype = c.opset() >= 23 ? dtype_attr(c, "output_dtype") : std::nullopt;
  DType out = out_dtype.value_or(c.dtype(scale));
  Shape xs = c.shape(x);
  V v = c.cast(x, out);
  if (zp != kNone) v = c.sub(v, c.cast(qparam_for(c, zp, xs, axis, block), out));
  c.out(0, c.mul(v, c.cast(qparam_for(c, scale, xs, axis, block), out)));
}

void conv_dynamic_quantize_linear(NodeCtx& c) {
  V x = c.in(0);
  if (c.dtype(x) != DType::Float32) c.fail("input must be float32, got {}", dtype_name(c.dtype(x)));
  Attrs all{{"dims", Ints{}}, {"keepdim", false}};
  V zero = c.scalar(0, DType::Float32);
  V lo = c.op1(OpId::Minimum, {c.op1(OpId::Min, {x}, all), zero});
  V hi = c.op1(OpId::Maximum, {c.op1(OpId::Max, {x}, all), zero});
  V scale = c.div(c.sub(hi, lo), c.scalar(255, DType::Float32));
  V zp = c.op1(OpId::Clamp, {c.op1(OpId::Round, {c.sub(zero, c.div(lo, scale))})},
               {{"min", 0.0}, {"max", 255.0}});
  c.out(0, requantize(c, c.div(x, scale), zp, DType::UInt8));
  c.out(1, scale);
  c.out(2, c.cast(zp, DType::UInt8));
}

// (a - a_zp) as int32 (or float64 for convolution).
V centered(NodeCtx& c, V a, V zp, DType work, int r, int64_t axis) {
  V v = c.cast(a, work);
  if (zp != kNone) v = c.sub(v, c.cast(qparam(c, zp, r, axis), work));
  return v;
}

void conv_matmul_integer(NodeCtx& c) {
  V a = c.in(0), b = c.in(1), azp = c.in_opt(2), bzp = c.in_opt(3);
  int ra = c.rank(a), rb = c.rank(b);
  // a_zero_point may be per row (axis -2 of A), b_zero_point per column (last axis of B).
  V ac = centered(c, a, azp, DType::Int32, ra, std::max(ra - 2, 0));
  V bc = centered(c, b, bzp, DType::Int32, rb, rb - 1);
  c.out(0, c.op1(OpId::Matmul, {ac, bc}));
}

void conv_conv_integer(NodeCtx& c) {
  V x = c.in(0), w = c.in(1), xzp = c.in_opt(2), wzp = c.in_opt(3);
  V xc = centered(c, x, xzp, DType::Float64, c.rank(x), 1);
  V wc = centered(c, w, wzp, DType::Float64, c.rank(w), 0);  // per output channel
  V y = emit_conv(c, xc, wc, kNone);
  c.out(0, c.cast(c.op1(OpId::Round, {y}), DType::Int32));
}

// y = saturate(round(acc * (sa * sb / sy)) + zy) with the multiplier in float32, as ONNX
// Runtime requantizes.
V requantize_acc(NodeCtx& c, V acc, V sa, V sb, V sy, V zy, int r, int64_t b_axis) {
  V mult = c.div(c.mul(c.reshape(sa, {}), qparam(c, sb, r, b_axis)), c.reshape(sy, {}));
  V v = c.mul(c.cast(acc, DType::Float32), c.cast(mult, DType::Float32));
  V z = zy == kNone ? kNone : c.cast(c.reshape(zy, {}), DType::Float32);
  return requantize(c, v, z, zy == kNone ? DType::UInt8 : c.dtype(zy));
}

void conv_qlinear_matmul(NodeCtx& c) {
  V a = c.in(0), sa = c.in(1), za = c.in(2), b = c.in(3), sb = c.in(4), zb = c.in(5),
    sy = c.in(6), zy = c.in(7);
  int ra = c.rank(a), rb = c.rank(b);
  V acc = c.op1(OpId::Matmul, {centered(c, a, za, DType::Int32, ra, std::max(ra - 2, 0)),
                               centered(c, b, zb, DType::Int32, rb, rb - 1)});
  c.out(0, requantize_acc(c, acc, sa, sb, sy, zy, c.rank(acc), c.rank(acc) - 1));
}

void conv_qlinear_conv(NodeCtx& c) {
  V x = c.in(0), sx = c.in(1), zx = c.in(2), w = c.in(3), sw = c.in(4), zw = c.in(5),
    sy = c.in(6), zy = c.in(7), bias = c.in_opt(8);
  V acc = emit_conv(c, centered(c, x, zx, DType::Float64, c.rank(x), 1),
                    centered(c, w, zw, DType::Float64, c.rank(w), 0), kNone);
  if (bias != kNone) {  // int32 bias in the accumulator's scale, per output channel
    Shape bs{c.shape(bias)[0]};
    for (int i = 2; i < c.rank(acc); ++i) bs.push_back(1);
    acc = c.add(acc, c.reshape(c.cast(bias, DType::Float64), bs));
  }
  c.out(0, requantize_acc(c, acc, sx, sw, sy, zy, c.rank(acc), 1));
}

}  // namespace

void add_quant_converters(std::vector<OnnxOpEntry>& t) {
  using enum OpId;
  std::vector<OpId> q = {Reshape, Div, Cast, Round, Add, Clamp, Expand, Slice};
  t.push_back({"QuantizeLinear", conv_quantize_linear, q,
               "round half to even, saturate; blocked (opset 21) by repeating the scales"});
  t.push_back({"DequantizeLinear", conv_dequantize_linear, {Reshape, Cast, Sub, Mul, Expand, Slice},
               "blocked (opset 21) by repeating the scales"});
  t.push_back({"DynamicQuantizeLinear", conv_dynamic_quantize_linear,
               {Min, Max, Minimum, Maximum, Sub, Div, Round, Clamp, Add, Cast}, ""});
  t.push_back({"MatMulInteger", conv_matmul_integer, {Cast, Reshape, Sub, Matmul}, "int32 matmul"});
  std::vector<OpId> ci = conv_kiln_ops();
  ci.insert(ci.end(), {Cast, Sub, Round});
  t.push_back({"ConvInteger", conv_conv_integer, ci, "float64 convolution of integers (exact)"});
  t.push_back({"QLinearMatMul", conv_qlinear_matmul, {Cast, Reshape, Sub, Matmul, Mul, Div, Round, Add, Clamp},
               "int32 accumulation, float32 requantization"});
  std::vector<OpId> qc = ci;
  qc.insert(qc.end(), {Mul, Div, Clamp});
  t.push_back({"QLinearConv", conv_qlinear_conv, qc, "exact accumulation, float32 requantization"});
}

}  // namespace kiln::onnx
