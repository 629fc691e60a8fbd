// ops/scalar_math.h (Note [Scalar math]) against the float64 reference kernels of the op
// records: every unary and binary function, in float and double, on fresh random values plus
// NaN, +-infinity, +-0, denormals and large magnitudes; NaN must agree exactly (NaN on one side
// only fails), infinities must agree in sign; finite values within per-dtype ulps-based bounds.
// Integer functions against the int64 reference, including wrap-around at the int64 limits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <math.h>
#include <vector>

#include <fmt/format.h>

#include "../support/compare.h"
#include "ops/dispatch.h"
#include "ops/op.h"
#include "ops/scalar_math.h"

using namespace kiln;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<double> probe_values(uint64_t seed) {
  std::vector<double> v = {0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.5, -2.5, 3.0, 1e-30, -1e-30,
                           1e-42 /* a float denormal */, -1e-42, 1e-310 /* a double denormal */,
                           88.0, -88.0, 100.0, -100.0, 1e10, -1e10, 3e38, -3e38, kInf, -kInf,
                           kNaN};
  Generator gen(seed);
  Tensor r = Tensor::randn({64}, gen, DType::Float64);
  for (double x : r.to_vector<double>()) {
    v.push_back(x);
    v.push_back(x * 8);
  }
  return v;
}

// The registry's reference kernel of `op` on float64 inputs (one or two of the same length).
std::vector<double> reference(OpId op, const std::vector<double>& a, const std::vector<double>* b,
                              const Attrs& attrs = {}) {
  const OpDef& d = op_def(op);
  TensorList in = {Tensor::from_vector(a, {int64_t(a.size())})};
  if (b) in.push_back(Tensor::from_vector(*b, {int64_t(b->size())}));
  Attrs canon = d.canonicalize(attrs, "scalar_math_test");
  std::vector<TensorType> types = infer_types(d, in, canon, "scalar_math_test");
  TensorList out = run_kernel(d, d.reference, in, canon, types);
  return out[0].to(DType::Float64).to_vector<double>();
}

// Whether `got` (computed in float when `is_float`) matches the float64 reference `want`.
// `x_ulps`: extra absolute error in units of eps * |x|, for formulations that cancel (gelu's
// 1 + erf(x / sqrt 2) loses its relative precision where erf nears -1; the same formula is what
// every path computes, so the bound documents it rather than hiding it).
bool close(double got, double want, bool is_float, double ulps, std::string* why,
           double x = 0, double x_ulps = 0) {
  if (is_float && !std::isnan(want)) want = double(float(want));  // rounded to the stored dtype
  double eps = is_float ? double(std::numeric_limits<float>::epsilon())
                        : std::numeric_limits<double>::epsilon();
  // Results in the denormal range may flush (sigmoid(-100) is 3.7e-44 in float, computed as
  // 1 / (1 + inf) = 0): an absolute floor of 4 x the smallest normal number.
  double tiny = is_float ? double(std::numeric_limits<float>::min())
                         : std::numeric_limits<double>::min();
  // ulps * eps * |want| + 4 tiny (+ x_ulps * eps * |x| only where asked: 0 * inf would make
  // the bound NaN, and no value passes it). NaN and infinities: tests/support/compare.h.
  test::Tolerance tol = x_ulps > 0 ? test::Tolerance::of_scale(std::fabs(x), x_ulps * eps, 4 * tiny)
                                   : test::Tolerance::rel(0, 4 * tiny);
  tol.plus_rel(ulps * eps);
  test::Comparison c = test::compare(std::span<const double>(&got, 1),
                                     std::span<const double>(&want, 1), tol);
  if (c.ok()) return true;
  *why = c.str();
  return false;
}

struct UnaryCase {
  OpId op;
  float (*f)(float);
  double (*d)(double);
  double ulps;  // the float bound; double results are held to the same count of double ulps
  Attrs attrs;
  double x_ulps = 0;  // see close()
};

TEST(ScalarMath, UnaryMatchesTheReference) {
  const std::vector<UnaryCase> cases = {
      {OpId::Neg, kn_neg, kn_neg, 0, {}},
      {OpId::Abs, kn_abs, kn_abs, 0, {}},
      {OpId::Exp, kn_exp, kn_exp, 4, {}},
      {OpId::Log, kn_log, kn_log, 4, {}},
      {OpId::Sqrt, kn_sqrt, kn_sqrt, 1, {}},
      {OpId::Rsqrt, kn_rsqrt, kn_rsqrt, 2, {}},
      {OpId::Reciprocal, kn_recip, kn_recip, 1, {}},
      {OpId::Sigmoid, kn_sigmoid, kn_sigmoid, 8, {}},
      {OpId::Tanh, kn_tanh, kn_tanh, 4, {}},
      {OpId::Relu, kn_relu, kn_relu, 0, {}},
      {OpId::Silu, kn_silu, kn_silu, 8, {}},
      {OpId::Erf, kn_erf, kn_erf, 4, {}},
      {OpId::Sin, kn_sin, kn_sin, 4, {}},
      {OpId::Cos, kn_cos, kn_cos, 4, {}},
      {OpId::Floor, kn_floor, kn_floor, 0, {}},
      {OpId::Ceil, kn_ceil, kn_ceil, 0, {}},
      {OpId::Round, kn_round, kn_round, 0, {}},
      {OpId::Sign, kn_sign, kn_sign, 0, {}},
      {OpId::Gelu, kn_gelu, kn_gelu, 8, {{"approximate", std::string("none")}}, 2},
      {OpId::Gelu, kn_gelu_tanh, kn_gelu_tanh, 16, {{"approximate", std::string("tanh")}}, 2},
  };
  std::vector<double> xs = probe_values(7);
  for (const UnaryCase& c : cases) {
    const char* name = op_def(c.op).name;
    // float: inputs rounded to float first, as a float tensor holds them.
    std::vector<double> xf;
    for (double x : xs) xf.push_back(double(float(x)));
    std::vector<double> want_f = reference(c.op, xf, nullptr, c.attrs);
    std::vector<double> want_d = reference(c.op, xs, nullptr, c.attrs);
    // Large arguments of sin/cos lose everything in float: compare them where |x| < 1e4.
    bool trig = c.op == OpId::Sin || c.op == OpId::Cos;
    for (size_t i = 0; i < xs.size(); ++i) {
      std::string why;
      if (trig && std::fabs(xs[i]) > 1e4 && !std::isinf(xs[i])) continue;
      double got = double(c.f(float(xf[i])));
      EXPECT_TRUE(close(got, want_f[i], true, c.ulps, &why, xf[i], c.x_ulps))
          << name << "(float " << xf[i] << ") = " << got << ", reference " << want_f[i] << ": " << why;
      double gotd = c.d(xs[i]);
      EXPECT_TRUE(close(gotd, want_d[i], false, c.ulps, &why, xs[i], c.x_ulps))
          << name << "(double " << xs[i] << ") = " << gotd << ", reference " << want_d[i] << ": " << why;
    }
  }
}

TEST(ScalarMath, NanPropagatesThroughMaxMinReluSign) {
  EXPECT_TRUE(std::isnan(kn_relu(float(kNaN))));
  EXPECT_TRUE(std::isnan(kn_sign(kNaN)));
  for (double other : {0.0, -1.0, 5.0, kInf, -kInf}) {
    EXPECT_TRUE(std::isnan(kn_max(kNaN, other))) << other;
    EXPECT_TRUE(std::isnan(kn_max(other, kNaN))) << other;
    EXPECT_TRUE(std::isnan(kn_min(float(kNaN), float(other)))) << other;
    EXPECT_TRUE(std::isnan(kn_min(float(other), float(kNaN)))) << other;
  }
  // -0 stays -0 through neg(+0) and abs gives +0.
  EXPECT_TRUE(std::signbit(kn_neg(0.0f)));
  EXPECT_FALSE(std::signbit(kn_abs(-0.0)));
}

struct BinaryCase {
  OpId op;
  float (*f)(float, float);
  double (*d)(double, double);
  double ulps;
};

TEST(ScalarMath, BinaryMatchesTheReference) {
  const std::vector<BinaryCase> cases = {
      // One ulp where the reference's double result rounds twice on its way to float.
      {OpId::Add, kn_add<float>, kn_add<double>, 1},
      {OpId::Sub, kn_sub<float>, kn_sub<double>, 1},
      {OpId::Mul, kn_mul<float>, kn_mul<double>, 0},
      {OpId::Div, kn_div<float>, kn_div<double>, 1},
      {OpId::Pow, kn_pow, kn_pow, 4},
      {OpId::Maximum, kn_max<float>, kn_max<double>, 0},
      {OpId::Minimum, kn_min<float>, kn_min<double>, 0},
  };
  std::vector<double> xs = probe_values(11), a, b;
  for (size_t i = 0; i < xs.size(); ++i)
    for (size_t j = 0; j < xs.size(); j += 7) {
      a.push_back(xs[i]);
      b.push_back(xs[j]);
    }
  std::vector<double> af, bf;
  for (size_t i = 0; i < a.size(); ++i) {
    af.push_back(double(float(a[i])));
    bf.push_back(double(float(b[i])));
  }
  for (const BinaryCase& c : cases) {
    const char* name = op_def(c.op).name;
    std::vector<double> want_f = reference(c.op, af, &bf);
    std::vector<double> want_d = reference(c.op, a, &b);
    for (size_t i = 0; i < a.size(); ++i) {
      std::string why;
      double got = double(c.f(float(af[i]), float(bf[i])));
      EXPECT_TRUE(close(got, want_f[i], true, c.ulps, &why))
          << name << "(float " << af[i] << ", " << bf[i] << ") = " << got << ", reference "
          << want_f[i] << ": " << why;
      double gotd = c.d(a[i], b[i]);
      EXPECT_TRUE(close(gotd, want_d[i], false, c.ulps, &why))
          << name << "(double " << a[i] << ", " << b[i] << ") = " << gotd << ", reference "
          << want_d[i] << ": " << why;
    }
  }
}

TEST(ScalarMath, IntegersWrapLikeTheReference) {
  const int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> v = {0, 1, -1, 7, -7, 1000000007, -1000000007, hi, lo, hi - 1, lo + 1};
  std::vector<int64_t> a, b;
  for (int64_t x : v)
    for (int64_t y : v) {
      a.push_back(x);
      b.push_back(y);
    }
  auto ref = [&](OpId op, bool binary) {
    TensorList in = {Tensor::from_vector(a, {int64_t(a.size())})};
    if (binary) in.push_back(Tensor::from_vector(b, {int64_t(b.size())}));
    const OpDef& d = op_def(op);
    Attrs canon = d.canonicalize({}, "scalar_math_test");
    std::vector<TensorType> types = infer_types(d, in, canon, "scalar_math_test");
    return run_kernel(d, d.reference, in, canon, types)[0].to_vector<int64_t>();
  };
  std::vector<int64_t> add = ref(OpId::Add, true), sub = ref(OpId::Sub, true),
                       mul = ref(OpId::Mul, true), mx = ref(OpId::Maximum, true),
                       mn = ref(OpId::Minimum, true), neg = ref(OpId::Neg, false),
                       ab = ref(OpId::Abs, false), relu = ref(OpId::Relu, false),
                       sign = ref(OpId::Sign, false);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(kn_add(i64(a[i]), i64(b[i])), add[i]) << a[i] << " + " << b[i];
    EXPECT_EQ(kn_sub(i64(a[i]), i64(b[i])), sub[i]) << a[i] << " - " << b[i];
    EXPECT_EQ(kn_mul(i64(a[i]), i64(b[i])), mul[i]) << a[i] << " * " << b[i];
    EXPECT_EQ(kn_max(i64(a[i]), i64(b[i])), mx[i]) << a[i] << ", " << b[i];
    EXPECT_EQ(kn_min(i64(a[i]), i64(b[i])), mn[i]) << a[i] << ", " << b[i];
    EXPECT_EQ(kn_neg(i64(a[i])), neg[i]) << a[i];
    EXPECT_EQ(kn_abs(i64(a[i])), ab[i]) << a[i];
    EXPECT_EQ(kn_relu(i64(a[i])), relu[i]) << a[i];
    EXPECT_EQ(kn_sign(i64(a[i])), sign[i]) << a[i];
  }
}

// bf16/f16 storage conversions against the Tensor casts (core/dtype.cc), which are the eager
// semantics: every 16-bit pattern round-trips, and floats round to nearest even.
TEST(ScalarMath, HalfConversionsMatchTensorCasts) {
  std::vector<float> xs;
  for (double x : probe_values(3)) xs.push_back(float(x));
  for (uint32_t bits = 0; bits < 0x10000; bits += 37) {
    uint32_t u = 0x3f800000u + bits * 131;  // floats near 1 with low mantissa bits set
    float f;
    std::memcpy(&f, &u, 4);
    xs.push_back(f);
    xs.push_back(-f * 1e-5f);
  }
  Tensor t = Tensor::from_vector(xs, {int64_t(xs.size())});
  std::vector<float> bf = t.to(DType::BFloat16).to(DType::Float32).to_vector<float>();
  std::vector<float> hf = t.to(DType::Float16).to(DType::Float32).to_vector<float>();
  for (size_t i = 0; i < xs.size(); ++i) {
    float b = kn_rbf16(xs[i]), h = kn_rf16(xs[i]);
    if (std::isnan(xs[i])) {
      EXPECT_TRUE(std::isnan(b) && std::isnan(h)) << i;
      continue;
    }
    EXPECT_EQ(b, bf[i]) << "bf16 of " << xs[i];
    EXPECT_EQ(h, hf[i]) << "f16 of " << xs[i];
    EXPECT_EQ(std::signbit(b), std::signbit(bf[i])) << xs[i];
  }
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = kn_f16_f32(u16(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(kn_f32_f16(f), u16(h)) << "f16 pattern " << h;
    float g = kn_bf16_f32(u16(h));
    if (!std::isnan(g)) {
      EXPECT_EQ(kn_f32_bf16(g), u16(h)) << "bf16 pattern " << h;
    }
  }
}

TEST(ScalarMath, FloatToIntegerCastsSaturate) {
  EXPECT_EQ(kn_sat<int8_t>(1e9), 127);
  EXPECT_EQ(kn_sat<int8_t>(-1e9), -128);
  EXPECT_EQ(kn_sat<uint8_t>(-3.0), 0);
  EXPECT_EQ(kn_sat<uint8_t>(300.0), 255);
  EXPECT_EQ(kn_sat<int32_t>(kNaN), 0);
  EXPECT_EQ(kn_sat<int64_t>(kInf), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(kn_sat<int64_t>(-kInf), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(kn_sat<int32_t>(-2.9), -2);  // truncation toward zero
  // The same rules as the Tensor cast (Tensor::copy_).
  std::vector<double> xs = probe_values(5);
  Tensor t = Tensor::from_vector(xs, {int64_t(xs.size())});
  std::vector<int64_t> i8 = t.to(DType::Int8).to(DType::Int64).to_vector<int64_t>();
  std::vector<int64_t> i32 = t.to(DType::Int32).to(DType::Int64).to_vector<int64_t>();
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_EQ(int64_t(kn_sat<int8_t>(xs[i])), i8[i]) << xs[i];
    EXPECT_EQ(int64_t(kn_sat<int32_t>(xs[i])), i32[i]) << xs[i];
  }
}

}  // namespace
