// Unary pointwise ops: neg abs exp log sqrt rsqrt reciprocal sigmoid tanh relu gelu silu erf sin
// cos floor ceil round sign not clamp cast.
//
// Reference kernels compute in float64 (float dtypes) or int64 (integer dtypes). The eager
// kernels add a float32 contiguous fast path; everything else falls back to the reference.
#include <cmath>

#include <cstdint>
#include <cstring>
#include <math.h>

#include "ops/kernel_path.h"
#include "ops/scalar_math.h"
#include "ops/kernel_util.h"

namespace kiln {
namespace {

using F64Fn = double (*)(double);
using I64Fn = int64_t (*)(int64_t);

struct UnaryFns {
  F64Fn f64;
  I64Fn i64;  // nullptr: integer inputs not supported
};

double gelu_erf(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh(double x) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}
double sigmoid_f(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double sign_f(double x) { return std::isnan(x) ? x : double((x > 0) - (x < 0)); }
int64_t sign_i(int64_t x) { return (x > 0) - (x < 0); }

UnaryFns unary_fns(OpId id) {
  switch (id) {
    // Integers wrap (Note [Scalar math]): -INT64_MIN is INT64_MIN, negated as unsigned, since
    // signed overflow is undefined (UBSan found `-x` here).
    case OpId::Neg: return {[](double x) { return -x; }, [](int64_t x) { return int64_t(0 - uint64_t(x)); }};
    case OpId::Abs: return {[](double x) { return std::fabs(x); },
                            [](int64_t x) { return x < 0 ? int64_t(0 - uint64_t(x)) : x; }};
    case OpId::Exp: return {[](double x) { return std::exp(x); }, nullptr};
    case OpId::Log: return {[](double x) { return std::log(x); }, nullptr};
    case OpId::Sqrt: return {[](double x) { return std::sqrt(x); }, nullptr};
    case OpId::Rsqrt: return {[](double x) { return 1.0 / std::sqrt(x); }, nullptr};
    case OpId::Reciprocal: return {[](double x) { return 1.0 / x; }, nullptr};
    case OpId::Sigmoid: return {sigmoid_f, nullptr};
    case OpId::Tanh: return {[](double x) { return std::tanh(x); }, nullptr};
    case OpId::Relu: return {[](double x) { return x > 0 ? x : (std::isnan(x) ? x : 0.0); },
                             [](int64_t x) { return x > 0 ? x : int64_t(0); }};
    case OpId::Silu: return {[](double x) { return x * sigmoid_f(x); }, nullptr};
    case OpId::Erf: return {[](double x) { return std::erf(x); }, nullptr};
    case OpId::Sin: return {[](double x) { return std::sin(x); }, nullptr};
    case OpId::Cos: return {[](double x) { return std::cos(x); }, nullptr};
    case OpId::Floor: return {[](double x) { return std::floor(x); }, [](int64_t x) { return x; }};
    case OpId::Ceil: return {[](double x) { return std::ceil(x); }, [](int64_t x) { return x; }};
    case OpId::Round: return {[](double x) { return std::nearbyint(x); }, [](int64_t x) { return x; }};
    case OpId::Sign: return {sign_f, sign_i};
    default: return {nullptr, nullptr};
  }
}

// Applies a double->double or int64->int64 function elementwise, any strides.
template <typename FD, typename FI>
void map_unary(const Tensor& x, Tensor& out, FD fd, FI fi, bool use_int) {
  Dims strides[2] = {x.strides(), out.strides()};
  DType xd = x.dtype(), od = out.dtype();
  int64_t xs = x.element_size(), os = out.element_size();
  char* xp = static_cast<char*>(x.raw_data());
  char* op = static_cast<char*>(out.raw_data());
  for_each_broadcast(out.sizes(), strides, [&](int64_t, const int64_t* off) {
    if (use_int)
      store_i64(op + off[1] * os, od, fi(load_i64(xp + off[0] * xs, xd)));
    else
      store_f64(op + off[1] * os, od, fd(load_f64(xp + off[0] * xs, xd)));
  });
}

void ref_unary(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& out = ctx.outputs[0];
  if (ctx.op.id == OpId::Gelu) {
    F64Fn f = ctx.attrs.get_string("approximate") == "tanh" ? gelu_tanh : gelu_erf;
    map_unary(x, out, f, [](int64_t v) { return v; }, false);
    return;
  }
  UnaryFns fns = unary_fns(ctx.op.id);
  bool use_int = !is_floating(x.dtype()) && fns.i64 != nullptr;
  map_unary(x, out, fns.f64, fns.i64 ? fns.i64 : [](int64_t v) { return v; }, use_int);
}

// float32 contiguous fast path for eager; other cases take the reference.
template <typename F>
void map_f32(const Tensor& x, Tensor& out, F f) {
  const float* xp = x.data<float>();
  float* op = out.data<float>();
  int64_t n = x.numel();
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) op[i] = f(xp[i]);
}

void eager_unary(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& out = ctx.outputs[0];
  if (x.dtype() != DType::Float32 || !x.is_contiguous())
    return note_kernel_path("reference"), ref_unary(ctx);
  note_kernel_path("f32");
  switch (ctx.op.id) {
    // The scalar math every float path shares (ops/scalar_math.h, Note [Scalar math]).
    case OpId::Neg: return map_f32(x, out, [](float v) { return kn_neg(v); });
    case OpId::Abs: return map_f32(x, out, [](float v) { return kn_abs(v); });
    case OpId::Exp: return map_f32(x, out, [](float v) { return kn_exp(v); });
    case OpId::Log: return map_f32(x, out, [](float v) { return kn_log(v); });
    case OpId::Sqrt: return map_f32(x, out, [](float v) { return kn_sqrt(v); });
    case OpId::Rsqrt: return map_f32(x, out, [](float v) { return kn_rsqrt(v); });
    case OpId::Reciprocal: return map_f32(x, out, [](float v) { return kn_recip(v); });
    case OpId::Sigmoid: return map_f32(x, out, [](float v) { return kn_sigmoid(v); });
    case OpId::Tanh: return map_f32(x, out, [](float v) { return kn_tanh(v); });
    case OpId::Relu: return map_f32(x, out, [](float v) { return kn_relu(v); });
    case OpId::Silu: return map_f32(x, out, [](float v) { return kn_silu(v); });
    case OpId::Erf: return map_f32(x, out, [](float v) { return kn_erf(v); });
    case OpId::Gelu:
      if (ctx.attrs.get_string("approximate") == "tanh")
        return map_f32(x, out, [](float v) { return kn_gelu_tanh(v); });
      return map_f32(x, out, [](float v) { return kn_gelu(v); });
    default: return note_kernel_path("reference"), ref_unary(ctx);
  }
}

// ---- not, clamp, cast ---------------------------------------------------------------------------
void ref_not(const KernelContext& ctx) {
  map_unary(ctx.inputs[0], ctx.outputs[0], [](double v) { return v == 0.0 ? 1.0 : 0.0; },
            [](int64_t v) { return int64_t(v == 0); }, !is_floating(ctx.inputs[0].dtype()));
}

void ref_clamp(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  bool has_lo = ctx.attrs.has("min"), has_hi = ctx.attrs.has("max");
  double lo = has_lo ? ctx.attrs.get_float("min") : 0, hi = has_hi ? ctx.attrs.get_float("max") : 0;
  auto fd = [=](double v) {
    if (std::isnan(v)) return v;
    if (has_lo && v < lo) v = lo;
    if (has_hi && v > hi) v = hi;
    return v;
  };
  if (is_floating(x.dtype())) {
    map_unary(x, ctx.outputs[0], fd, [](int64_t v) { return v; }, false);
  } else {
    // Integer clamp: bounds rounded toward the interior (ceil of min, floor of max).
    // Saturating: a bound beyond int64 (1e300) clamps nothing rather than overflowing.
    auto saturate = [](double v) {
      int64_t i = 0;
      store_f64(&i, DType::Int64, v);
      return i;
    };
    int64_t ilo = has_lo ? saturate(std::ceil(lo)) : 0;
    int64_t ihi = has_hi ? saturate(std::floor(hi)) : 0;
    map_unary(x, ctx.outputs[0], fd, [=](int64_t v) {
      if (has_lo && v < ilo) v = ilo;
      if (has_hi && v > ihi) v = ihi;
      return v;
    }, true);
  }
}

void ref_cast(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& out = ctx.outputs[0];
  out.copy_(x);  // copy_ converts with saturation; NaN -> 0 for integer targets
}

std::vector<TensorType> infer_unary(const InferContext& ctx) {
  const TensorType& x = ctx.in(0);
  const OpDef& d = ctx.op;
  if (!d.supports_dtype(x.dtype))
    ctx.fail("input 'x' has dtype {}; this op supports floating dtypes only"
             "{}", dtype_name(x.dtype), is_floating(x.dtype) ? "" : " (cast it first)");
  return same_as_input(ctx);
}

std::vector<TensorType> infer_not(const InferContext& ctx) {
  TensorType t = same_as_input(ctx)[0];
  t.dtype = DType::Bool;
  return {t};
}

std::vector<TensorType> infer_clamp(const InferContext& ctx) {
  for (const char* bound : {"min", "max"})
    if (ctx.attrs.has(bound) && std::isnan(ctx.attrs.get_float(bound)))
      ctx.fail("{} is NaN; a clamp bound must be a number", bound);
  if (ctx.attrs.has("min") && ctx.attrs.has("max") &&
      ctx.attrs.get_float("min") > ctx.attrs.get_float("max"))
    ctx.fail("min {} is greater than max {}", ctx.attrs.get_float("min"),
             ctx.attrs.get_float("max"));
  return infer_unary(ctx);
}

std::vector<TensorType> infer_cast(const InferContext& ctx) {
  TensorType t = same_as_input(ctx)[0];
  t.dtype = ctx.attrs.get_dtype("dtype");
  return {t};
}

std::vector<TensorType> infer_gelu(const InferContext& ctx) {
  const std::string& a = ctx.attrs.get_string("approximate");
  if (a != "none" && a != "tanh")
    ctx.fail("attribute 'approximate' is \"{}\"; expected \"none\" or \"tanh\"", a);
  return infer_unary(ctx);
}

// ---- samples ------------------------------------------------------------------------------------
std::vector<OpSample> samples_general(Generator& g) {
  return {
      {{sample_randn(g, {2, 3, 4})}, {}, "[2,3,4]"},
      {{sample_randn(g, {7})}, {}, "[7]"},
      {{sample_randn(g, {})}, {}, "scalar"},
      {{sample_randn(g, {0, 3})}, {}, "empty [0,3]"},
      {{sample_noncontiguous(g, {3, 5})}, {}, "non-contiguous [3,5]"},
      {{sample_randn(g, {1, 1, 33})}, {}, "size-1 dims"},
      {{sample_special(g, {4, 6})}, {}, "special values (NaN, +-inf, -0, denormals, large)"},
  };
}
// Inputs kept in the op's domain (positive for log/sqrt/rsqrt; away from 0 for reciprocal).
std::vector<OpSample> samples_positive(Generator& g) {
  return {
      {{sample_uniform(g, {2, 3, 4}, 0.1, 4.0)}, {}, "[2,3,4] in (0.1, 4)"},
      {{sample_uniform(g, {17}, 0.5, 2.0)}, {}, "[17]"},
      {{sample_uniform(g, {}, 0.5, 2.0)}, {}, "scalar"},
      {{sample_uniform(g, {0, 2}, 0.5, 2.0)}, {}, "empty"},
      // Outside the domain too: log(-1) is NaN, log(0) = log(-0) = -inf, 1/-0 = -inf.
      {{sample_special(g, {4, 6})}, {}, "special values (NaN, +-inf, -0, denormals, large)"},
  };
}
// Away from half-integers, where rounding of low-precision dtypes could flip the result.
std::vector<OpSample> samples_rounding(Generator& g) {
  Tensor t = sample_randn(g, {4, 9}, 3.0);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = std::floor(p[i]) + 0.25 + 0.5 * (i % 2);
  Tensor nc = sample_noncontiguous(g, {5, 3});
  double* q = static_cast<double*>(nc.raw_data());  // fill the underlying storage
  for (int64_t i = 0; i < 15; ++i) q[i] = std::floor(q[i] * 3.0) + 0.25 + 0.5 * (i % 2);
  // Special values: the randn part away from half-integers as above.
  Tensor sp = sample_special(g, {4, 6}, true, 3.0);
  double* r = sp.data<double>();
  for (int64_t i = 0; i < sp.numel(); ++i)
    if (std::isfinite(r[i]) && std::fabs(r[i]) > 1e-3 && std::fabs(r[i]) < 1e4)
      r[i] = std::floor(r[i]) + 0.25 + 0.5 * (i % 2);
  return {{{t}, {}, "[4,9] quarter values"},
          {{nc}, {}, "non-contiguous [5,3] quarter values"},
          {{sample_randn(g, {0})}, {}, "empty"},
          {{sp}, {}, "special values (NaN, +-inf, -0, denormals, large)"}};
}
std::vector<OpSample> samples_gelu(Generator& g) {
  return {
      {{sample_randn(g, {3, 8})}, {{"approximate", std::string("none")}}, "erf form"},
      {{sample_randn(g, {3, 8})}, {{"approximate", std::string("tanh")}}, "tanh form"},
      {{sample_noncontiguous(g, {4, 6})}, {}, "non-contiguous"},
      {{sample_special(g, {4, 6})}, {{"approximate", std::string("none")}},
       "erf form, special values"},
      {{sample_special(g, {4, 6})}, {{"approximate", std::string("tanh")}},
       "tanh form, special values"},
  };
}
std::vector<OpSample> samples_clamp(Generator& g) {
  return {
      {{sample_randn(g, {4, 5}, 2.0)}, {{"min", -0.5}, {"max", 0.75}}, "both bounds"},
      {{sample_randn(g, {9}, 2.0)}, {{"min", 0.25}}, "min only"},
      {{sample_randn(g, {2, 3}, 2.0)}, {{"max", -0.25}}, "max only"},
      {{sample_special(g, {4, 6})}, {{"min", -0.5}, {"max", 0.75}}, "special values, both bounds"},
      {{sample_special(g, {4, 6})}, {{"min", 0.0}}, "special values, min 0 (relu-like)"},
  };
}
std::vector<OpSample> samples_cast(Generator& g) {
  std::vector<OpSample> v;
  for (DType d : all_dtypes())
    v.push_back({{sample_randn(g, {3, 4}, 3.0)}, {{"dtype", d}},
                 std::string("to ") + dtype_name(d)});
  for (DType d : all_dtypes())
    v.push_back({{sample_special(g, {3, 4})}, {{"dtype", d}},
                 std::string("special values to ") + dtype_name(d)});
  return v;
}

void define_unary(OpId id, SampleFn samples, std::vector<DType> dtypes, const char* doc) {
  OpDef& d = define_op(id);
  d.doc = doc;
  d.inputs = {{"x"}};
  d.infer = infer_unary;
  d.reference = ref_unary;
  d.eager_cpu = eager_unary;
  d.dtypes = std::move(dtypes);
  d.samples = samples;
}

std::vector<DType> signed_numeric() {
  return {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
          DType::Int64,   DType::Int32,   DType::Int8};
}

}  // namespace

void register_unary_ops() {
  define_unary(OpId::Neg, samples_general, signed_numeric(), "-x");
  define_unary(OpId::Abs, samples_general, signed_numeric(), "|x|");
  define_unary(OpId::Exp, samples_general, float_dtypes(), "e^x");
  define_unary(OpId::Log, samples_positive, float_dtypes(), "natural log");
  define_unary(OpId::Sqrt, samples_positive, float_dtypes(), "square root");
  define_unary(OpId::Rsqrt, samples_positive, float_dtypes(), "1/sqrt(x)");
  define_unary(OpId::Reciprocal, samples_positive, float_dtypes(), "1/x");
  define_unary(OpId::Sigmoid, samples_general, float_dtypes(), "1/(1+e^-x)");
  define_unary(OpId::Tanh, samples_general, float_dtypes(), "hyperbolic tangent");
  define_unary(OpId::Relu, samples_general, signed_numeric(), "max(x, 0)");
  define_unary(OpId::Silu, samples_general, float_dtypes(), "x*sigmoid(x)");
  define_unary(OpId::Erf, samples_general, float_dtypes(), "error function");
  define_unary(OpId::Sin, samples_general, float_dtypes(), "sine");
  define_unary(OpId::Cos, samples_general, float_dtypes(), "cosine");
  define_unary(OpId::Floor, samples_rounding, numeric_dtypes(), "round toward -inf");
  define_unary(OpId::Ceil, samples_rounding, numeric_dtypes(), "round toward +inf");
  define_unary(OpId::Round, samples_rounding, numeric_dtypes(), "round half to even");
  define_unary(OpId::Sign, samples_general, signed_numeric(), "-1, 0 or 1");

  OpDef& gelu = define_op(OpId::Gelu);
  gelu.doc = "Gaussian error linear unit; approximate = \"none\" (erf) or \"tanh\"";
  gelu.inputs = {{"x"}};
  gelu.attrs = {{"approximate", AttrType::String, std::string("none")}};
  gelu.infer = infer_gelu;
  gelu.reference = ref_unary;
  gelu.eager_cpu = eager_unary;
  gelu.dtypes = float_dtypes();
  gelu.samples = samples_gelu;

  OpDef& n = define_op(OpId::Not);
  n.doc = "logical not: true where x == 0; output bool";
  n.inputs = {{"x"}};
  n.infer = infer_not;
  n.reference = ref_not;
  n.dtypes = all_dtypes();
  n.samples = samples_general;

  OpDef& c = define_op(OpId::Clamp);
  c.doc = "clamp to [min, max]; either bound may be absent";
  c.inputs = {{"x"}};
  c.attrs = {{"min", AttrType::Float, {}, true}, {"max", AttrType::Float, {}, true}};
  c.infer = infer_clamp;
  c.reference = ref_clamp;
  c.dtypes = numeric_dtypes();
  c.samples = samples_clamp;

  OpDef& cast = define_op(OpId::Cast);
  cast.doc = "convert to dtype (float->int truncates toward zero, saturating; NaN -> 0)";
  cast.inputs = {{"x"}};
  cast.attrs = {{"dtype", AttrType::DType, {}}};
  cast.infer = infer_cast;
  cast.reference = ref_cast;
  cast.dtypes = all_dtypes();
  cast.samples = samples_cast;
}

}  // namespace kiln
