// ONNX elementwise ops: unary math and activations (direct or composed), binary arithmetic with
// NumPy broadcasting (and the pre-opset-7 `broadcast`/`axis` form), comparisons and logic,
// variadic Sum/Mean/Max/Min, Cast, Clip, Where, Mod, Dropout (inference), Identity.
#include <cmath>
#include <limits>

#include "frontends/onnx/convert.h"

namespace kiln::onnx {
namespace {

// Compositions of transcendental functions run in float64, then round once to the input's
// dtype, so they carry no more error than a direct kernel would.
V widen(NodeCtx& c, V x) {
  return is_floating(c.dtype(x)) && c.dtype(x) != DType::Float64 ? c.cast(x, DType::Float64) : x;
}

V sc(NodeCtx& c, double v, V like) { return c.scalar(v, c.dtype(like)); }

template <OpId K>
void direct_unary(NodeCtx& c) {
  c.out(0, c.op1(K, {c.in(0)}));
}

void conv_identity(NodeCtx& c) { c.out(0, c.in(0)); }

// Pre-opset-7 binary ops broadcast only when `broadcast` = 1, aligning b with a at `axis`
// (default: trailing alignment, like NumPy).
V legacy_rhs(NodeCtx& c, V a, V b) {
  if (c.opset() >= 7) return b;
  int64_t broadcast = c.attr_int("broadcast", 0);
  std::optional<int64_t> axis = c.attr_int_opt("axis");
  if (!broadcast) {
    if (c.shape(a) != c.shape(b))
      c.fail("shapes {} and {} differ and broadcast = 0 (opset {})", to_string(c.shape(a)),
             to_string(c.shape(b)), c.opset());
    return b;
  }
  if (!axis) return b;
  int ra = c.rank(a), rb = c.rank(b);
  int64_t ax = c.axis(*axis, ra, "axis");
  if (ax + rb > ra) c.fail("axis {} with a rank-{} operand exceeds rank {}", *axis, rb, ra);
  Shape s = c.shape(b);
  while (int64_t(s.size()) < ra - ax) s.push_back(1);
  return c.reshape(b, s);
}

template <OpId K>
void direct_binary(NodeCtx& c) {
  V a = c.in(0);
  V b = legacy_rhs(c, a, c.in(1));
  c.out(0, c.op1(K, {a, b}));
}

void conv_pow(NodeCtx& c) {
  V a = c.in(0);
  V b = legacy_rhs(c, a, c.in(1));
  // The result has the base's type (the exponent may be of another type).
  V y = c.op1(OpId::Pow, {a, b});
  c.out(0, c.cast(y, c.dtype(a)));
}

void conv_xor(NodeCtx& c) {
  V a = c.in(0);
  V b = legacy_rhs(c, a, c.in(1));
  c.out(0, c.op1(OpId::Ne, {c.cast(a, DType::Bool), c.cast(b, DType::Bool)}));
}

template <OpId K>
void variadic(NodeCtx& c) {
  if (c.num_inputs() == 0) c.fail("needs at least one input");
  V acc = c.in(0);
  for (size_t i = 1; i < c.num_inputs(); ++i) acc = c.op1(K, {acc, c.in(i)});
  c.out(0, acc);
}

void conv_mean(NodeCtx& c) {
  if (c.num_inputs() == 0) c.fail("needs at least one input");
  V acc = c.in(0);
  for (size_t i = 1; i < c.num_inputs(); ++i) acc = c.add(acc, c.in(i));
  if (c.num_inputs() > 1) acc = c.div(acc, sc(c, double(c.num_inputs()), acc));
  c.out(0, acc);
}

// Cast-19's `saturate` and Cast-24's `round_mode` only affect conversions to float8 types,
// which Kiln does not have (such casts are refused as unsupported types); they are validated
// and otherwise have no effect.
void check_float8_cast_attrs(NodeCtx& c) {
  if (c.opset() >= 19) {
    int64_t saturate = c.attr_int("saturate", 1);
    if (saturate != 0 && saturate != 1) c.fail("saturate must be 0 or 1, got {}", saturate);
  }
  if (c.opset() >= 24) {
    std::string mode = c.attr_string("round_mode", "up");
    if (mode != "up" && mode != "down" && mode != "nearest")
      c.fail("round_mode must be up, down or nearest, got \"{}\"", mode);
  }
}

void conv_cast(NodeCtx& c) {
  check_float8_cast_attrs(c);
  int64_t to = c.attr_int("to", 0);
  DType d = DType::Float32;
  if (!dtype_from_onnx(int32_t(to), &d))
    c.not_supported("cast to {} is not supported by Kiln", onnx_type_name(int32_t(to)));
  c.out(0, c.cast(c.in(0), d));
}

void conv_cast_like(NodeCtx& c) {
  check_float8_cast_attrs(c);
  c.out(0, c.cast(c.in(0), c.dtype(c.in(1))));
}

void conv_clip(NodeCtx& c) {
  V x = c.in(0);
  if (c.opset() < 11) {
    Attrs a;
    if (c.has_attr("min")) a.set("min", c.attr_float("min", 0));
    if (c.has_attr("max")) a.set("max", c.attr_float("max", 0));
    c.out(0, c.op1(OpId::Clamp, {x}, a));
    return;
  }
  V lo = c.in_opt(1), hi = c.in_opt(2);
  for (V b : {lo, hi})
    if (b != kNone && c.rank(b) != 0 && numel(c.shape(b)) != SymInt(1))
      c.fail("min and max must be scalars, got shape {}", to_string(c.shape(b)));
  // Bounds known at import become clamp attributes; run-time bounds use maximum/minimum.
  if ((lo == kNone || c.known(lo)) && (hi == kNone || c.known(hi))) {
    Attrs a;
    if (lo != kNone) a.set("min", c.known(lo)->item());
    if (hi != kNone) a.set("max", c.known(hi)->item());
    c.out(0, c.op1(OpId::Clamp, {x}, a));
    return;
  }
  V y = x;
  if (lo != kNone) y = c.op1(OpId::Maximum, {y, c.reshape(lo, {})});
  if (hi != kNone) y = c.op1(OpId::Minimum, {y, c.reshape(hi, {})});
  c.out(0, y);
}

void conv_where(NodeCtx& c) {
  V y = c.op1(OpId::Where, {c.in(0), c.in(1), c.in(2)});
  c.out(0, y);
}

// ---- activations composed from Kiln ops --------------------------------------------------------

V where_neg(NodeCtx& c, V x, V neg_branch, V pos_branch, bool include_zero = false) {
  V cond = c.op1(include_zero ? OpId::Le : OpId::Lt, {x, sc(c, 0, x)});
  return c.op1(OpId::Where, {cond, neg_branch, pos_branch});
}

void conv_leaky_relu(NodeCtx& c) {
  V x = c.in(0);
  double alpha = c.attr_float("alpha", 0.01);
  c.out(0, where_neg(c, x, c.mul(x, sc(c, alpha, x)), x));
}

void conv_prelu(NodeCtx& c) {
  V x = c.in(0), slope = c.in(1);
  // Before opset 7 a 1-D slope runs along the channel dim (dim 1) of an N-D input.
  if (c.opset() < 7 && c.rank(slope) == 1 && c.rank(x) > 2 &&
      c.shape(slope)[0] != SymInt(1)) {
    Shape s = c.shape(slope);
    while (int(s.size()) < c.rank(x) - 1) s.push_back(1);
    slope = c.reshape(slope, s);
  }
  c.out(0, where_neg(c, x, c.mul(x, slope), x));
}

void conv_elu(NodeCtx& c) {
  V x = c.in(0);
  double alpha = c.attr_float("alpha", 1.0);
  V em1 = c.sub(c.op1(OpId::Exp, {x}), sc(c, 1, x));
  c.out(0, where_neg(c, x, c.mul(em1, sc(c, alpha, x)), x));
}

void conv_selu(NodeCtx& c) {
  V x = c.in(0);
  double alpha = c.attr_float("alpha", 1.67326319217681884765625);
  double gamma = c.attr_float("gamma", 1.05070102214813232421875);
  V neg = c.sub(c.mul(c.op1(OpId::Exp, {x}), sc(c, alpha, x)), sc(c, alpha, x));
  c.out(0, c.mul(where_neg(c, x, neg, x, true), sc(c, gamma, x)));
}

void conv_celu(NodeCtx& c) {
  V x0 = c.in(0);
  double alpha = c.attr_float("alpha", 1.0);
  if (alpha == 0) c.fail("alpha must be nonzero");
  // 16-bit inputs (opset 28) compute in float32 and round once, as the reference does.
  DType dt = c.dtype(x0);
  V x = dt == DType::Float16 || dt == DType::BFloat16 ? c.cast(x0, DType::Float32) : x0;
  V e = c.sub(c.op1(OpId::Exp, {c.div(x, sc(c, alpha, x))}), sc(c, 1, x));
  V neg = c.op1(OpId::Minimum, {sc(c, 0, x), c.mul(e, sc(c, alpha, x))});
  c.out(0, c.cast(c.add(c.op1(OpId::Relu, {x}), neg), dt));
}

void conv_hard_sigmoid(NodeCtx& c) {
  V x = c.in(0);
  double alpha = c.attr_float("alpha", 0.2), beta = c.attr_float("beta", 0.5);
  V y = c.add(c.mul(x, sc(c, alpha, x)), sc(c, beta, x));
  c.out(0, c.op1(OpId::Clamp, {y}, {{"min", 0.0}, {"max", 1.0}}));
}

void conv_hard_swish(NodeCtx& c) {
  V x = c.in(0);
  V y = c.add(c.mul(x, sc(c, 1.0 / 6.0, x)), sc(c, 0.5, x));
  c.out(0, c.mul(x, c.op1(OpId::Clamp, {y}, {{"min", 0.0}, {"max", 1.0}})));
}

// softplus(x) = relu(x) + log(1 + exp(-|x|)): no overflow for large |x|.
V softplus(NodeCtx& c, V x) {
  V t = c.op1(OpId::Exp, {c.op1(OpId::Neg, {c.op1(OpId::Abs, {x})})});
  return c.add(c.op1(OpId::Relu, {x}), c.op1(OpId::Log, {c.add(t, sc(c, 1, t))}));
}

void conv_softplus(NodeCtx& c) { c.out(0, softplus(c, c.in(0))); }

void conv_mish(NodeCtx& c) {
  V x = c.in(0);
  c.out(0, c.mul(x, c.op1(OpId::Tanh, {softplus(c, x)})));
}

void conv_softsign(NodeCtx& c) {
  V x = c.in(0);
  c.out(0, c.div(x, c.add(c.op1(OpId::Abs, {x}), sc(c, 1, x))));
}

void conv_thresholded_relu(NodeCtx& c) {
  V x = c.in(0);
  double alpha = c.attr_float("alpha", 1.0);
  V cond = c.op1(OpId::Gt, {x, sc(c, alpha, x)});
  c.out(0, c.op1(OpId::Where, {cond, x, sc(c, 0, x)}));
}

void conv_shrink(NodeCtx& c) {
  V x = c.in(0);
  double bias = c.attr_float("bias", 0.0), lambd = c.attr_float("lambd", 0.5);
  V lo = c.op1(OpId::Lt, {x, sc(c, -lambd, x)});
  V hi = c.op1(OpId::Gt, {x, sc(c, lambd, x)});
  V inner = c.op1(OpId::Where, {hi, c.sub(x, sc(c, bias, x)), sc(c, 0, x)});
  c.out(0, c.op1(OpId::Where, {lo, c.add(x, sc(c, bias, x)), inner}));
}

// Swish (opset 24): x * sigmoid(alpha * x); SwiGLU (opset 28): swish(a) * b, a and b of one
// shape.
V swish(NodeCtx& c, V x, double alpha) {
  if (alpha == 1.0) return c.op1(OpId::Silu, {x});
  return c.mul(x, c.op1(OpId::Sigmoid, {c.mul(x, sc(c, alpha, x))}));
}
void conv_swish(NodeCtx& c) { c.out(0, swish(c, c.in(0), c.attr_float("alpha", 1.0))); }
void conv_swiglu(NodeCtx& c) {
  V a = c.in(0), b = c.in(1);
  if (c.shape(a) != c.shape(b))
    c.fail("A {} and B {} must have the same shape (no broadcasting)", to_string(c.shape(a)),
           to_string(c.shape(b)));
  c.out(0, c.mul(swish(c, a, c.attr_float("alpha", 1.0)), b));
}

void conv_gelu(NodeCtx& c) {
  std::string approx = c.attr_string("approximate", "none");
  if (approx != "none" && approx != "tanh")
    c.fail("approximate must be \"none\" or \"tanh\", got \"{}\"", approx);
  c.out(0, c.op1(OpId::Gelu, {c.in(0)}, {{"approximate", approx}}));
}

// ---- trigonometric and hyperbolic functions ----------------------------------------------------

void conv_tan(NodeCtx& c) {
  V x = c.in(0), w = widen(c, x);
  c.out(0, c.cast(c.div(c.op1(OpId::Sin, {w}), c.op1(OpId::Cos, {w})), c.dtype(x)));
}

void conv_sinh_cosh(NodeCtx& c, bool is_sinh) {
  V x = c.in(0), w = widen(c, x);
  V ep = c.op1(OpId::Exp, {w}), en = c.op1(OpId::Exp, {c.op1(OpId::Neg, {w})});
  V s = is_sinh ? c.sub(ep, en) : c.add(ep, en);
  c.out(0, c.cast(c.mul(s, sc(c, 0.5, s)), c.dtype(x)));
}
void conv_sinh(NodeCtx& c) { conv_sinh_cosh(c, true); }
void conv_cosh(NodeCtx& c) { conv_sinh_cosh(c, false); }

void conv_asinh(NodeCtx& c) {
  // sign(x) * log(|x| + sqrt(x^2 + 1)): no cancellation for negative x.
  V x = c.in(0), w = widen(c, x);
  V a = c.op1(OpId::Abs, {w});
  V r = c.op1(OpId::Sqrt, {c.add(c.mul(w, w), sc(c, 1, w))});
  V y = c.mul(c.op1(OpId::Sign, {w}), c.op1(OpId::Log, {c.add(a, r)}));
  c.out(0, c.cast(y, c.dtype(x)));
}

void conv_acosh(NodeCtx& c) {
  V x = c.in(0), w = widen(c, x);
  V r = c.op1(OpId::Sqrt, {c.sub(c.mul(w, w), sc(c, 1, w))});
  c.out(0, c.cast(c.op1(OpId::Log, {c.add(w, r)}), c.dtype(x)));
}

void conv_atanh(NodeCtx& c) {
  V x = c.in(0), w = widen(c, x);
  V q = c.div(c.add(sc(c, 1, w), w), c.sub(sc(c, 1, w), w));
  c.out(0, c.cast(c.mul(c.op1(OpId::Log, {q}), sc(c, 0.5, w)), c.dtype(x)));
}

// atan in float64 by Newton's method on f(y) = sin(y) - x cos(y), whose root in (-pi/2, pi/2)
// is atan(x). The start is a rational approximation within 0.01 rad; each step squares the
// error (f'' / f' is bounded there), so four steps reach float64 precision.
V atan64(NodeCtx& c, V x) {
  V ax = c.op1(OpId::Abs, {x});
  V small = c.op1(OpId::Le, {ax, sc(c, 1, x)});
  V g_small = c.div(x, c.add(c.mul(c.mul(x, x), sc(c, 0.28125, x)), sc(c, 1, x)));
  V g_large = c.sub(c.mul(c.op1(OpId::Sign, {x}), sc(c, M_PI / 2, x)),
                    c.div(x, c.add(c.mul(x, x), sc(c, 0.28125, x))));
  V y = c.op1(OpId::Where, {small, g_small, g_large});
  for (int i = 0; i < 4; ++i) {
    V s = c.op1(OpId::Sin, {y}), co = c.op1(OpId::Cos, {y});
    V f = c.sub(s, c.mul(x, co));
    V df = c.add(co, c.mul(x, s));
    y = c.sub(y, c.div(f, df));
  }
  return y;
}

void conv_atan(NodeCtx& c) {
  V x = c.in(0);
  c.out(0, c.cast(atan64(c, widen(c, x)), c.dtype(x)));
}

// asin(x) = atan(x / sqrt(1 - x^2)); out of [-1, 1] the sqrt gives NaN, as asin should.
V asin64(NodeCtx& c, V x) {
  V r = c.op1(OpId::Sqrt, {c.sub(sc(c, 1, x), c.mul(x, x))});
  V t = atan64(c, c.div(x, r));
  // atan64 of +-inf is NaN (inf * cos); the exact answer there is +-pi/2.
  V one = c.op1(OpId::Eq, {c.op1(OpId::Abs, {x}), sc(c, 1, x)});
  return c.op1(OpId::Where, {one, c.mul(x, sc(c, M_PI / 2, x)), t});
}

void conv_asin(NodeCtx& c) {
  V x = c.in(0);
  c.out(0, c.cast(asin64(c, widen(c, x)), c.dtype(x)));
}

void conv_acos(NodeCtx& c) {
  V x = c.in(0), w = widen(c, x);
  c.out(0, c.cast(c.sub(sc(c, M_PI / 2, w), asin64(c, w)), c.dtype(x)));
}

// ---- predicates --------------------------------------------------------------------------------

void conv_isnan(NodeCtx& c) {
  V x = c.in(0);
  c.out(0, c.op1(OpId::Ne, {x, x}));
}

void conv_isinf(NodeCtx& c) {
  V x = c.in(0);
  bool pos = c.attr_int("detect_positive", 1) != 0, neg = c.attr_int("detect_negative", 1) != 0;
  double inf = std::numeric_limits<double>::infinity();
  V p = c.op1(OpId::Eq, {x, sc(c, inf, x)});
  V n = c.op1(OpId::Eq, {x, sc(c, -inf, x)});
  if (pos && neg) c.out(0, c.op1(OpId::Or, {p, n}));
  else if (pos) c.out(0, p);
  else if (neg) c.out(0, n);
  else c.out(0, c.op1(OpId::And, {p, n}));  // both off: all false
}

// ---- Mod ---------------------------------------------------------------------------------------

void conv_mod(NodeCtx& c) {
  V a = c.in(0), b = c.in(1);
  int64_t fmod = c.attr_int("fmod", 0);
  DType dt = c.dtype(a);
  if (is_floating(dt)) {
    // Floating-point fmod = 0 (Python's %, floor division) is defined from opset 28.
    if (!fmod && c.opset() < 28)
      c.fail("fmod = 0 is only defined for integer inputs before opset 28, got {}", dtype_name(dt));
    // C fmod: a - trunc(a / b) * b, in float64 (exact for float32/16 operands); a finite a
    // over an infinite b is a itself.
    V wa = widen(c, a), wb = widen(c, b);
    V q = c.div(wa, wb);
    V neg = c.op1(OpId::Lt, {q, sc(c, 0, q)});
    V tq = c.op1(OpId::Where, {neg, c.op1(OpId::Ceil, {q}), c.op1(OpId::Floor, {q})});
    V r = c.sub(wa, c.mul(tq, wb));
    V inf = sc(c, INFINITY, wb);
    V b_inf = c.op1(OpId::Eq, {c.op1(OpId::Abs, {wb}), inf});
    V a_finite = c.op1(OpId::Lt, {c.op1(OpId::Abs, {wa}), inf});
    r = c.op1(OpId::Where, {c.op1(OpId::And, {b_inf, a_finite}), wa, r});
    if (!fmod) {
      // Python's modulo from the remainder: a nonzero remainder whose sign differs from b's
      // moves by b (so x mod +-inf is x or +-inf); a zero takes b's sign.
      V zero = sc(c, 0, r);
      V rn = c.op1(OpId::Lt, {r, zero}), bn = c.op1(OpId::Lt, {wb, zero});
      V fix = c.op1(OpId::And, {c.op1(OpId::Ne, {r, zero}), c.op1(OpId::Ne, {rn, bn})});
      r = c.op1(OpId::Where, {fix, c.add(r, wb), r});
      V signed_zero = c.mul(zero, c.op1(OpId::Sign, {wb}));
      r = c.op1(OpId::Where, {c.op1(OpId::Eq, {r, zero}), signed_zero, r});
    }
    c.out(0, c.cast(r, dt));
    return;
  }
  // Integers: Kiln's integer division truncates, so a - (a / b) * b is C's remainder.
  V r = c.sub(a, c.mul(c.div(a, b), b));
  if (!fmod) {  // Python's modulo takes the divisor's sign
    V rn = c.op1(OpId::Lt, {r, sc(c, 0, r)});
    V bn = c.op1(OpId::Lt, {b, sc(c, 0, b)});
    V fix = c.op1(OpId::And, {c.op1(OpId::Ne, {r, sc(c, 0, r)}), c.op1(OpId::Ne, {rn, bn})});
    r = c.op1(OpId::Where, {fix, c.add(r, b), r});
  }
  c.out(0, c.cast(r, dt));
}

// ---- Dropout (inference) -----------------------------------------------------------------------

void conv_dropout(NodeCtx& c) {
  V x = c.in(0);
  c.ignore_attr("seed");
  bool training = false;
  if (c.opset() < 7) {
    training = c.attr_int("is_test", 0) == 0;
    c.ignore_attr("consumed_inputs");
  }
  double ratio = 0.5;
  if (c.opset() < 12) {
    ratio = c.attr_float("ratio", 0.5);
  } else {
    if (c.has_input(1)) ratio = c.known_input(1, "ratio").item();
    if (c.has_input(2)) training = c.known_input(2, "training_mode").item() != 0;
  }
  if (training && ratio != 0)
    c.not_supported("training-mode dropout (ratio {}) is random; Kiln imports models for "
                    "inference", ratio);
  c.out(0, x);
  if (c.wants_output(1)) {
    // The mask is all ones: bool since opset 10, x's type before.
    DType mt = c.opset() >= 10 ? DType::Bool : c.dtype(x);
    Ints shape;
    for (SymInt d : c.shape(x)) shape.push_back(d.raw());
    c.out(1, c.op1(OpId::Expand, {c.scalar(1, mt)}, {{"shape", shape}}));
  }
}

}  // namespace

void add_elementwise_converters(std::vector<OnnxOpEntry>& t) {
  using enum OpId;
  auto unary = [&](std::string_view onnx, ConvertFn f, OpId k) { t.push_back({onnx, f, {k}, ""}); };
  unary("Abs", direct_unary<Abs>, Abs);
  unary("Neg", direct_unary<Neg>, Neg);
  unary("Exp", direct_unary<Exp>, Exp);
  unary("Log", direct_unary<Log>, Log);
  unary("Sqrt", direct_unary<Sqrt>, Sqrt);
  unary("Reciprocal", direct_unary<Reciprocal>, Reciprocal);
  unary("Sigmoid", direct_unary<Sigmoid>, Sigmoid);
  unary("Tanh", direct_unary<Tanh>, Tanh);
  unary("Relu", direct_unary<Relu>, Relu);
  unary("Erf", direct_unary<Erf>, Erf);
  unary("Sin", direct_unary<Sin>, Sin);
  unary("Cos", direct_unary<Cos>, Cos);
  unary("Floor", direct_unary<Floor>, Floor);
  unary("Ceil", direct_unary<Ceil>, Ceil);
  unary("Round", direct_unary<Round>, Round);
  unary("Sign", direct_unary<Sign>, Sign);
  unary("Not", direct_unary<Not>, Not);
  t.push_back({"Gelu", conv_gelu, {Gelu}, ""});
  t.push_back({"Swish", conv_swish, {Silu, Mul, Sigmoid}, "silu for alpha 1"});
  t.push_back({"SwiGLU", conv_swiglu, {Silu, Mul, Sigmoid}, "swish(A) * B"});
  t.push_back({"Identity", conv_identity, {}, "no node: the output is the input"});

  t.push_back({"Add", direct_binary<Add>, {Add, Reshape}, ""});
  t.push_back({"Sub", direct_binary<Sub>, {Sub, Reshape}, ""});
  t.push_back({"Mul", direct_binary<Mul>, {Mul, Reshape}, ""});
  t.push_back({"Div", direct_binary<Div>, {Div, Reshape}, "integers truncate toward zero"});
  t.push_back({"Pow", conv_pow, {Pow, Cast, Reshape}, ""});
  t.push_back({"Equal", direct_binary<Eq>, {Eq, Reshape}, ""});
  t.push_back({"Greater", direct_binary<Gt>, {Gt, Reshape}, ""});
  t.push_back({"Less", direct_binary<Lt>, {Lt, Reshape}, ""});
  t.push_back({"GreaterOrEqual", direct_binary<Ge>, {Ge, Reshape}, ""});
  t.push_back({"LessOrEqual", direct_binary<Le>, {Le, Reshape}, ""});
  t.push_back({"And", direct_binary<And>, {And, Reshape}, ""});
  t.push_back({"Or", direct_binary<Or>, {Or, Reshape}, ""});
  t.push_back({"Xor", conv_xor, {Ne, Cast, Reshape}, "ne over bools"});
  t.push_back({"Sum", variadic<Add>, {Add}, "chain of add"});
  t.push_back({"Max", variadic<Maximum>, {Maximum}, "chain of maximum"});
  t.push_back({"Min", variadic<Minimum>, {Minimum}, "chain of minimum"});
  t.push_back({"Mean", conv_mean, {Add, Div}, "sum / n"});
  t.push_back({"Cast", conv_cast, {Cast}, ""});
  t.push_back({"CastLike", conv_cast_like, {Cast}, ""});
  t.push_back({"Clip", conv_clip, {Clamp, Maximum, Minimum, Reshape},
               "clamp; run-time bounds use maximum/minimum"});
  t.push_back({"Where", conv_where, {Where}, ""});
  t.push_back({"Mod", conv_mod, {Sub, Mul, Div, Lt, Ne, And, Where, Add, Ceil, Floor, Cast, Abs,
                                  Eq, Sign},
               "a - trunc(a/b)*b (fmod) with the sign fix for Python modulo (floats: opset 28)"});

  t.push_back({"LeakyRelu", conv_leaky_relu, {Lt, Mul, Where}, "where(x < 0, alpha*x, x)"});
  t.push_back({"PRelu", conv_prelu, {Lt, Mul, Where, Reshape}, "where(x < 0, slope*x, x)"});
  t.push_back({"Elu", conv_elu, {Lt, Exp, Sub, Mul, Where}, ""});
  t.push_back({"Selu", conv_selu, {Le, Exp, Sub, Mul, Where}, ""});
  t.push_back({"Celu", conv_celu, {Exp, Div, Sub, Mul, Minimum, Relu, Add, Cast}, ""});
  t.push_back({"HardSigmoid", conv_hard_sigmoid, {Mul, Add, Clamp}, "clamp(alpha*x + beta, 0, 1)"});
  t.push_back({"HardSwish", conv_hard_swish, {Mul, Add, Clamp}, ""});
  t.push_back({"Softplus", conv_softplus, {Exp, Neg, Abs, Add, Relu, Log},
               "relu(x) + log(1 + exp(-|x|))"});
  t.push_back({"Mish", conv_mish, {Exp, Neg, Abs, Add, Relu, Log, Tanh, Mul}, ""});
  t.push_back({"Softsign", conv_softsign, {Abs, Add, Div}, ""});
  t.push_back({"ThresholdedRelu", conv_thresholded_relu, {Gt, Where}, ""});
  t.push_back({"Shrink", conv_shrink, {Lt, Gt, Where, Sub, Add}, ""});

  t.push_back({"Tan", conv_tan, {Sin, Cos, Div, Cast}, "sin/cos in float64"});
  t.push_back({"Sinh", conv_sinh, {Exp, Neg, Sub, Mul, Cast}, "float64"});
  t.push_back({"Cosh", conv_cosh, {Exp, Neg, Add, Mul, Cast}, "float64"});
  t.push_back({"Asinh", conv_asinh, {Abs, Mul, Add, Sqrt, Sign, Log, Cast}, "float64"});
  t.push_back({"Acosh", conv_acosh, {Mul, Sub, Sqrt, Add, Log, Cast}, "float64"});
  t.push_back({"Atanh", conv_atanh, {Add, Sub, Div, Log, Mul, Cast}, "float64"});
  std::vector<OpId> atan_ops = {Abs, Le, Div, Add, Mul, Sub, Sign, Where, Sin, Cos, Cast};
  t.push_back({"Atan", conv_atan, atan_ops, "Newton's method on sin/cos in float64"});
  std::vector<OpId> asin_ops = atan_ops;
  asin_ops.insert(asin_ops.end(), {Sqrt, Eq});
  t.push_back({"Asin", conv_asin, asin_ops, "atan(x / sqrt(1 - x^2)) in float64"});
  t.push_back({"Acos", conv_acos, asin_ops, "pi/2 - asin(x) in float64"});

  t.push_back({"IsNaN", conv_isnan, {Ne}, "x != x"});
  t.push_back({"IsInf", conv_isinf, {Eq, Or, And, Ne}, ""});
  t.push_back({"Dropout", conv_dropout, {Expand},
               "inference only: the output is the input, the mask all ones"});
}

}  // namespace kiln::onnx
