// Semantics of the binary and reduce op families that the generic op harness cannot express:
// integer division, error cases, NaN rules, output dtypes, promotion, tie-breaking, symbolic
// inference, and the float32 eager fast paths (incl. OpenMP sizes) against the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "harness_util.h"
#include "ops/api.h"
#include "ops/dispatch.h"
#include "ops/op.h"

namespace kiln {
namespace {

using harness::error_of;
using harness::contains;

const double kNaN = std::numeric_limits<double>::quiet_NaN();

// The op's reference kernel on `inputs` (the oracle).
Tensor reference(OpId id, const TensorList& inputs, const Attrs& attrs = {}) {
  const OpDef& d = op_def(id);
  Attrs c = d.canonicalize(attrs, "test");
  std::vector<TensorType> types = infer_types(d, inputs, c, "test");
  return run_kernel(d, d.reference, inputs, c, types)[0];
}

// Eager dispatch (eager_cpu fast paths where they apply).
Tensor eager(OpId id, const TensorList& inputs, const Attrs& attrs = {}) {
  return call_op1(id, std::span<const Tensor>(inputs.data(), inputs.size()), attrs);
}

// Element-by-element match within rtol * (1 + |expected|) (tests/support/compare.h: NaN
// where NaN, the same infinities), of the same dtype.
void expect_close(const Tensor& expected, const Tensor& actual, double rtol,
                  const std::string& what) {
  ASSERT_EQ(expected.dtype(), actual.dtype()) << what;
  EXPECT_TRUE(test::close(actual, expected, test::Tolerance::rel(rtol, rtol))) << what;
}

Tensor randn(Generator& g, const Dims& s) { return Tensor::randn(s, g, DType::Float32); }

// ---- binary: integer semantics ----------------------------------------------------------------
TEST(Binary, IntegerDivisionTruncatesTowardZero) {
  Generator g(1);
  Tensor a = Tensor::randint({64}, g, -50, 51, DType::Int32);
  Tensor b = Tensor::randint({64}, g, 1, 8, DType::Int32);
  // Random signs on the divisors so every sign combination occurs.
  Tensor sign = Tensor::randint({64}, g, 0, 2, DType::Int32);
  for (int64_t i = 0; i < 64; ++i)
    if (sign.data<int32_t>()[i]) b.data<int32_t>()[i] = -b.data<int32_t>()[i];
  Tensor q = div(a, b);
  ASSERT_EQ(q.dtype(), DType::Int32);
  auto av = a.to_vector<int32_t>(), bv = b.to_vector<int32_t>(), qv = q.to_vector<int32_t>();
  int negative_inexact = 0;
  for (size_t i = 0; i < av.size(); ++i) {
    int64_t t = int64_t(std::trunc(double(av[i]) / double(bv[i])));
    EXPECT_EQ(qv[i], t) << av[i] << " / " << bv[i];
    if (double(av[i]) / bv[i] < 0 && av[i] % bv[i] != 0) ++negative_inexact;
  }
  EXPECT_GT(negative_inexact, 5);  // truncation differs from floor on these
  EXPECT_EQ(div(Tensor::scalar(-7, DType::Int64), Tensor::scalar(2, DType::Int64)).item(), -3);
  EXPECT_EQ(div(Tensor::scalar(7, DType::Int8), Tensor::scalar(-2, DType::Int8)).item(), -3);
}

TEST(Binary, IntegerDivisionByZeroIsAnError) {
  Generator g(2);
  Tensor a = Tensor::randint({3, 4}, g, 1, 9, DType::Int64);
  Tensor b = Tensor::randint({4}, g, 1, 9, DType::Int64);
  b.data<int64_t>()[2] = 0;
  std::string msg = error_of([&] { div(a, b); });
  EXPECT_TRUE(contains(msg, "div")) << msg;
  EXPECT_TRUE(contains(msg, "zero")) << msg;
  // Floating division by zero is IEEE: inf and NaN, no error.
  Tensor f = div(Tensor::from_vector<float>({1, -1, 0}, {3}), Tensor::zeros({3}));
  auto fv = f.to_vector<double>();
  EXPECT_EQ(fv[0], INFINITY);
  EXPECT_EQ(fv[1], -INFINITY);
  EXPECT_TRUE(std::isnan(fv[2]));
}

TEST(Binary, IntegerPowNegativeExponentIsAnError) {
  Tensor base = Tensor::from_vector<int32_t>({2, 3, -2}, {3});
  Tensor e = Tensor::from_vector<int32_t>({3, 0, 5}, {3});
  EXPECT_EQ(pow(base, e).to_vector<int32_t>(), (std::vector<int32_t>{8, 1, -32}));
  Tensor neg = Tensor::from_vector<int32_t>({1, -1, 2}, {3});
  std::string msg = error_of([&] { pow(base, neg); });
  EXPECT_TRUE(contains(msg, "pow")) << msg;
  EXPECT_TRUE(contains(msg, "negative")) << msg;
}

TEST(Binary, IntegerOverflowWraps) {
  Tensor a = Tensor::from_vector<int32_t>({std::numeric_limits<int32_t>::max(), -5}, {2});
  Tensor b = Tensor::from_vector<int32_t>({1, 3}, {2});
  EXPECT_EQ(add(a, b).to_vector<int32_t>(),
            (std::vector<int32_t>{std::numeric_limits<int32_t>::min(), -2}));
  Tensor big = Tensor::from_vector<int64_t>({std::numeric_limits<int64_t>::max()}, {1});
  EXPECT_EQ(mul(big, Tensor::scalar(2, DType::Int64)).to_vector<int64_t>()[0], -2);
}

// ---- binary: NaN, dtypes, promotion -----------------------------------------------------------
TEST(Binary, MaximumMinimumPropagateNaN) {
  Generator g(3);
  for (DType d : {DType::Float32, DType::Float64, DType::Float16}) {
    // Float32 same-shape inputs take the eager fast path; the others the reference.
    Tensor a = Tensor::randn({40}, g, DType::Float64);
    Tensor b = Tensor::randn({40}, g, DType::Float64);
    a.data<double>()[3] = kNaN;
    b.data<double>()[7] = kNaN;
    a.data<double>()[11] = kNaN;
    b.data<double>()[11] = kNaN;
    Tensor ad = a.to(d), bd = b.to(d);
    for (OpId id : {OpId::Maximum, OpId::Minimum}) {
      Tensor out = eager(id, {ad, bd});
      auto av = a.to_vector<double>(), bv = b.to_vector<double>(), ov = out.to_vector<double>();
      for (size_t i = 0; i < av.size(); ++i) {
        if (std::isnan(av[i]) || std::isnan(bv[i])) {
          EXPECT_TRUE(std::isnan(ov[i])) << dtype_name(d) << " element " << i;
        } else {
          double want = id == OpId::Maximum ? std::max(ad.to_vector<double>()[i], bd.to_vector<double>()[i])
                                            : std::min(ad.to_vector<double>()[i], bd.to_vector<double>()[i]);
          EXPECT_EQ(ov[i], want) << dtype_name(d) << " element " << i;
        }
      }
      // A scalar NaN on either side (fast path ScalarA / ScalarB) poisons everything.
      Tensor nan_scalar = Tensor::scalar(kNaN, d);
      for (double v : eager(id, {nan_scalar, bd}).to_vector<double>()) EXPECT_TRUE(std::isnan(v));
      for (double v : eager(id, {ad, nan_scalar}).to_vector<double>()) EXPECT_TRUE(std::isnan(v));
    }
  }
}

TEST(Binary, OutputDtypes) {
  Generator g(4);
  Tensor f = randn(g, {2, 3});
  Tensor i = Tensor::randint({2, 3}, g, -3, 4, DType::Int32);
  for (OpId id : {OpId::Eq, OpId::Ne, OpId::Lt, OpId::Le, OpId::Gt, OpId::Ge, OpId::And, OpId::Or})
    EXPECT_EQ(eager(id, {f, i}).dtype(), DType::Bool) << op_def(id).name;
  EXPECT_EQ(add(f, i).dtype(), DType::Float32);
  EXPECT_EQ(add(i, Tensor::randint({3}, g, 0, 2, DType::Bool)).dtype(), DType::Int32);
  // and/or on floats: nonzero (NaN included) is true.
  Tensor x = Tensor::from_vector<float>({0.0f, 2.5f, std::nanf(""), 0.0f}, {4});
  Tensor y = Tensor::from_vector<float>({1.0f, -1.0f, 1.0f, 0.0f}, {4});
  EXPECT_EQ(logical_and(x, y).to_vector<bool>(), (std::vector<bool>{false, true, true, false}));
  EXPECT_EQ(logical_or(x, y).to_vector<bool>(), (std::vector<bool>{true, true, true, false}));
  // Arithmetic on two bools has no numeric dtype to compute in.
  Tensor bb = Tensor::randint({3}, g, 0, 2, DType::Bool);
  std::string msg = error_of([&] { add(bb, bb); });
  EXPECT_TRUE(contains(msg, "'add'") && contains(msg, "bool")) << msg;
}

TEST(Binary, PromoteTypes) {
  EXPECT_EQ(promote_types(DType::Int32, DType::Float16), DType::Float16);
  EXPECT_EQ(promote_types(DType::UInt8, DType::Int8), DType::Int32);
  EXPECT_EQ(promote_types(DType::Bool, DType::Int64), DType::Int64);
  EXPECT_EQ(promote_types(DType::Bool, DType::UInt8), DType::UInt8);
  EXPECT_EQ(promote_types(DType::Float16, DType::BFloat16), DType::Float32);
  EXPECT_EQ(promote_types(DType::Int64, DType::Float32), DType::Float32);
  EXPECT_EQ(promote_types(DType::Int8, DType::Int32), DType::Int32);
  // The ops follow it, and round the narrower operand to the compute dtype first: int32 2049
  // becomes 2048 in float16 and so equals it (as in PyTorch).
  Tensor i = Tensor::from_vector<int32_t>({2049, 3}, {2});
  Tensor h = Tensor::from_vector<double>({2048, 3}, {2}).to(DType::Float16);
  Tensor e = eq(i, h);
  EXPECT_EQ(e.to_vector<bool>(), (std::vector<bool>{true, true}));
  EXPECT_EQ(add(i, h).dtype(), DType::Float16);
  Tensor u = Tensor::from_vector<uint8_t>({200, 1}, {2});
  Tensor s = Tensor::from_vector<int8_t>({100, -2}, {2});
  Tensor sum_us = add(u, s);
  EXPECT_EQ(sum_us.dtype(), DType::Int32);
  EXPECT_EQ(sum_us.to_vector<int32_t>(), (std::vector<int32_t>{300, -1}));
}

TEST(Binary, BroadcastErrorNamesBothShapes) {
  Generator g(5);
  std::string msg = error_of([&] { add(randn(g, {3, 2}), randn(g, {4})); });
  EXPECT_TRUE(contains(msg, "'add'")) << msg;
  EXPECT_TRUE(contains(msg, "[3, 2]")) << msg;
  EXPECT_TRUE(contains(msg, "[4]")) << msg;
  msg = error_of([&] { where(Tensor::randint({5}, g, 0, 2, DType::Bool), randn(g, {2, 3}),
                             randn(g, {3})); });
  EXPECT_TRUE(contains(msg, "'where'") && contains(msg, "[5]") && contains(msg, "[2, 3]")) << msg;
}

TEST(Binary, WhereSemantics) {
  Generator g(6);
  Tensor c = Tensor::randint({3, 1}, g, 0, 2, DType::Bool);
  Tensor a = randn(g, {3, 4});
  Tensor b = Tensor::randint({4}, g, -5, 5, DType::Int64);
  Tensor w = where(c, a, b);
  EXPECT_EQ(w.dtype(), DType::Float32);
  ASSERT_EQ(w.sizes(), (Dims{3, 4}));
  auto cv = c.to_vector<bool>();
  auto av = a.to_vector<float>();
  auto bv = b.to_vector<int64_t>();
  auto wv = w.to_vector<float>();
  for (int r = 0; r < 3; ++r)
    for (int k = 0; k < 4; ++k)
      EXPECT_EQ(wv[r * 4 + k], cv[r] ? av[r * 4 + k] : float(bv[k]));
  std::string msg = error_of([&] { where(randn(g, {3, 4}), a, a); });
  EXPECT_TRUE(contains(msg, "'where'") && contains(msg, "'cond'") && contains(msg, "bool")) << msg;
}

// ---- binary: eager fast paths against the reference ---------------------------------------------
struct Layout {
  Dims a, b;
  const char* name;
};

TEST(Binary, Float32FastPathsMatchReference) {
  Generator g(7);
  // Includes sizes above the OpenMP threshold (65536 elements).
  const Layout layouts[] = {
      {{260, 256}, {260, 256}, "same shape, threaded"},
      {{5, 7}, {5, 7}, "same shape"},
      {{}, {260, 256}, "scalar a, threaded"},
      {{1, 1}, {4, 9}, "numel-1 a"},
      {{260, 256}, {}, "scalar b, threaded"},
      {{260, 256}, {256}, "row b, threaded"},
      {{1, 9}, {6, 9}, "row a"},
      {{6, 1}, {6, 9}, "column broadcast (reference)"},
  };
  for (OpId id : {OpId::Add, OpId::Sub, OpId::Mul, OpId::Div, OpId::Pow, OpId::Maximum,
                  OpId::Minimum, OpId::Eq, OpId::Ne, OpId::Lt, OpId::Le, OpId::Gt, OpId::Ge}) {
    for (const Layout& l : layouts) {
      // The threaded loops are the same template for every op: run them for a few only.
      bool threaded = numel(l.a) > 65536 || numel(l.b) > 65536;
      if (threaded && id != OpId::Sub && id != OpId::Maximum && id != OpId::Lt) continue;
      Tensor a = Tensor::randn(l.a, g, DType::Float32);
      Tensor b = Tensor::randn(l.b, g, DType::Float32);
      if (id == OpId::Pow) {
        a = Tensor::rand(l.a, g, 0.5, 2.0, DType::Float32);
        b = Tensor::rand(l.b, g, -2.0, 3.0, DType::Float32);
      }
      if (id >= OpId::Eq && id <= OpId::Ge) {
        // Small value sets so that ties occur.
        a = floor(mul(a, 2.0));
        b = floor(mul(b, 2.0));
      }
      expect_close(reference(id, {a, b}), eager(id, {a, b}), 1e-6,
                   std::string(op_def(id).name) + " " + l.name);
    }
  }
}

// ---- reduce: dtypes, empty sets, errors -------------------------------------------------------
TEST(Reduce, OutputDtypes) {
  Generator g(8);
  Tensor i = Tensor::randint({3, 4}, g, -5, 6, DType::Int32);
  Tensor b = Tensor::randint({3, 4}, g, 0, 2, DType::Bool);
  Tensor h = Tensor::randn({3, 4}, g, DType::Float16);
  EXPECT_EQ(sum(i).dtype(), DType::Int64);
  EXPECT_EQ(prod(b, {1}).dtype(), DType::Int64);
  EXPECT_EQ(sum(h, {0}).dtype(), DType::Float16);
  EXPECT_EQ(amax(i, {1}).dtype(), DType::Int32);
  EXPECT_EQ(amin(b).dtype(), DType::Bool);
  EXPECT_EQ(argmax(h, 1).dtype(), DType::Int64);
  // Integer sums are exact int64 (no wrap in the input dtype).
  Tensor big = Tensor::full({4}, 100, DType::Int8);
  EXPECT_EQ(sum(big).item(), 400);
  auto bv = b.to_vector<bool>();
  int64_t trues = 0;
  for (bool v : bv) trues += v;
  EXPECT_EQ(sum(b).item(), double(trues));
  std::string msg = error_of([&] { mean(i); });
  EXPECT_TRUE(contains(msg, "'mean'") && contains(msg, "int32")) << msg;
  msg = error_of([&] { var(i); });
  EXPECT_TRUE(contains(msg, "'var'")) << msg;
}

TEST(Reduce, EmptySets) {
  Tensor e = Tensor::empty({0, 3}, DType::Float32);
  EXPECT_EQ(sum(e, {0}).to_vector<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(prod(e, {0}).to_vector<float>(), (std::vector<float>{1, 1, 1}));
  for (float v : mean(e, {0}).to_vector<float>()) EXPECT_TRUE(std::isnan(v));
  for (float v : var(e, {0}).to_vector<float>()) EXPECT_TRUE(std::isnan(v));
  EXPECT_EQ(sum(e).item(), 0.0);
  // Reducing the non-empty dim of an empty tensor is fine: an empty result.
  EXPECT_EQ(amax(e, {1}).sizes(), (Dims{0}));
  EXPECT_EQ(argmax(e, 1).sizes(), (Dims{0}));
  for (OpId id : {OpId::Max, OpId::Min}) {
    std::string msg = error_of([&] { eager(id, {e}, {{"dims", Ints{0}}}); });
    EXPECT_TRUE(contains(msg, std::string("'") + op_def(id).name + "'")) << msg;
    EXPECT_TRUE(contains(msg, "empty")) << msg;
    msg = error_of([&] { eager(id, {e}); });
    EXPECT_TRUE(contains(msg, "empty")) << msg;
  }
  for (OpId id : {OpId::Argmax, OpId::Argmin}) {
    std::string msg = error_of([&] { eager(id, {e}); });
    EXPECT_TRUE(contains(msg, std::string("'") + op_def(id).name + "'") && contains(msg, "empty"))
        << msg;
    msg = error_of([&] { eager(id, {e}, {{"dim", int64_t(0)}}); });
    EXPECT_TRUE(contains(msg, "empty")) << msg;
  }
  // The kernels check too (a graph may have been inferred with a symbolic size).
  const OpDef& d = op_def(OpId::Max);
  Attrs attrs = d.canonicalize({}, "test");
  std::vector<TensorType> types = {TensorType(DType::Float32, Shape{})};
  for (KernelFn k : {d.reference, d.eager_cpu}) {
    std::string msg = error_of([&] { run_kernel(d, k, TensorList{e}, attrs, types); });
    EXPECT_TRUE(contains(msg, "'max'") && contains(msg, "empty")) << msg;
  }
}

TEST(Reduce, DimErrors) {
  Generator g(9);
  Tensor x = randn(g, {2, 3, 4});
  std::string msg = error_of([&] { sum(x, {1, -2}); });
  EXPECT_TRUE(contains(msg, "'sum'") && contains(msg, "more than once")) << msg;
  msg = error_of([&] { sum(x, {3}); });
  EXPECT_TRUE(contains(msg, "'sum'") && contains(msg, "out of range")) << msg;
  msg = error_of([&] { argmax(x, -4); });
  EXPECT_TRUE(contains(msg, "'argmax'") && contains(msg, "out of range")) << msg;
  msg = error_of([&] { var(x, {0}, -1); });
  EXPECT_TRUE(contains(msg, "'var'") && contains(msg, "correction")) << msg;
}

TEST(Reduce, VarCorrection) {
  Generator g(10);
  Tensor x = Tensor::randn({4, 5}, g, DType::Float64);
  auto xv = x.to_vector<double>();
  for (int64_t c : {0, 1, 3}) {
    auto v = var(x, {1}, c).to_vector<double>();
    for (int r = 0; r < 4; ++r) {
      double m = 0, ss = 0;
      for (int k = 0; k < 5; ++k) m += xv[r * 5 + k] / 5;
      for (int k = 0; k < 5; ++k) ss += (xv[r * 5 + k] - m) * (xv[r * 5 + k] - m);
      EXPECT_NEAR(v[r], ss / double(5 - c), 1e-12) << "correction " << c;
    }
  }
  // N - correction <= 0: the divisor is 0, giving inf (NaN when all values are equal).
  for (double v : var(x, {1}, 5).to_vector<double>()) EXPECT_EQ(v, INFINITY);
  for (double v : var(x, {1}, 7).to_vector<double>()) EXPECT_EQ(v, INFINITY);
  for (double v : var(x, {1, 0}, 1, true).to_vector<double>()) EXPECT_TRUE(std::isfinite(v));
  for (double v : var(randn(g, {3, 1}), {1}).to_vector<double>()) EXPECT_TRUE(std::isnan(v));
}

TEST(Reduce, MaxMinPropagateNaN) {
  Generator g(11);
  for (DType d : {DType::Float32, DType::Float64}) {
    Tensor x = Tensor::randn({4, 6}, g, DType::Float64);
    x.data<double>()[1 * 6 + 2] = kNaN;
    x.data<double>()[3 * 6 + 5] = kNaN;
    Tensor xd = x.to(d);
    for (OpId id : {OpId::Max, OpId::Min}) {
      auto rows = eager(id, {xd}, {{"dims", Ints{1}}}).to_vector<double>();
      EXPECT_FALSE(std::isnan(rows[0]));
      EXPECT_TRUE(std::isnan(rows[1]));
      EXPECT_FALSE(std::isnan(rows[2]));
      EXPECT_TRUE(std::isnan(rows[3]));
      auto cols = eager(id, {xd}, {{"dims", Ints{0}}}).to_vector<double>();
      for (int k = 0; k < 6; ++k) EXPECT_EQ(std::isnan(cols[k]), k == 2 || k == 5) << k;
      EXPECT_TRUE(std::isnan(eager(id, {xd}).item()));
    }
  }
}

TEST(Reduce, ArgmaxFirstIndexOnTies) {
  Tensor x = Tensor::from_vector<float>({1, 3, 3, 2, 0, 0, -1, 0}, {2, 4});
  EXPECT_EQ(argmax(x, 1).to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(argmin(x, 1).to_vector<int64_t>(), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(argmax(x).item(), 1);
  EXPECT_EQ(argmin(x).item(), 6);
  Tensor flat_keep = argmax(x, std::nullopt, true);
  EXPECT_EQ(flat_keep.sizes(), (Dims{1, 1}));
  // Random ties against a naive first-index scan, in the fast (f32 contiguous) and reference
  // (f64, non-contiguous) paths, along dim 1 (rows) and dim 0 (columns).
  Generator g(12);
  Tensor base = Tensor::randint({40, 9}, g, -2, 3, DType::Float32);
  Tensor t64 = base.to(DType::Float64);
  Tensor strided = Tensor::randint({9, 40}, g, -2, 3, DType::Float32);
  strided = strided.as_strided({40, 9}, {1, 40}, 0);
  for (const Tensor& t : {base, t64, strided}) {
    auto v = t.to_vector<double>();
    for (bool is_max : {true, false}) {
      auto rows = (is_max ? argmax(t, 1) : argmin(t, 1)).to_vector<int64_t>();
      for (int r = 0; r < 40; ++r) {
        int best = 0;
        for (int k = 1; k < 9; ++k)
          if (is_max ? v[r * 9 + k] > v[r * 9 + best] : v[r * 9 + k] < v[r * 9 + best]) best = k;
        EXPECT_EQ(rows[r], best) << "row " << r;
      }
      auto cols = (is_max ? argmax(t, 0, true) : argmin(t, 0, true)).to_vector<int64_t>();
      for (int k = 0; k < 9; ++k) {
        int best = 0;
        for (int r = 1; r < 40; ++r)
          if (is_max ? v[r * 9 + k] > v[best * 9 + k] : v[r * 9 + k] < v[best * 9 + k]) best = r;
        EXPECT_EQ(cols[k], best) << "column " << k;
      }
    }
  }
}

TEST(Reduce, ArgmaxNaNCountsAsExtreme) {
  for (DType d : {DType::Float32, DType::Float64}) {
    Tensor x = Tensor::from_vector<double>({1, kNaN, 5, kNaN, -9, 2}, {6}).to(d);
    EXPECT_EQ(argmax(x).item(), 1) << dtype_name(d);
    EXPECT_EQ(argmin(x).item(), 1) << dtype_name(d);
    Tensor cols = Tensor::from_vector<double>({1, 2, kNaN, 7, kNaN, kNaN}, {3, 2}).to(d);
    EXPECT_EQ(argmax(cols, 0).to_vector<int64_t>(), (std::vector<int64_t>{1, 2})) << dtype_name(d);
    EXPECT_EQ(argmin(cols, 0).to_vector<int64_t>(), (std::vector<int64_t>{1, 2})) << dtype_name(d);
  }
}

// ---- reduce: eager fast paths against the reference ---------------------------------------------
struct ReduceCase {
  Dims sizes;
  Ints dims;
  bool keepdim;
  const char* name;
};

TEST(Reduce, Float32FastPathsMatchReference) {
  Generator g(13);
  const ReduceCase cases[] = {
      {{260, 256}, {1}, false, "last dim, threaded rows"},
      {{260, 256}, {}, false, "all dims (one row)"},
      {{260, 256}, {0}, true, "first dim: columns, threaded"},
      {{7, 33, 300}, {1}, false, "middle dim: columns in blocks"},
      {{4, 1, 6, 5}, {0, 2}, false, "run {0, 2} around a size-1 dim"},
      {{4, 6, 5}, {0, 2}, true, "non-adjacent dims (reference)"},
      {{6, 5}, {-1}, true, "negative dim"},
      {{}, {}, false, "0-d"},
  };
  for (OpId id : {OpId::Sum, OpId::Mean, OpId::Max, OpId::Min, OpId::Prod, OpId::Var}) {
    for (const ReduceCase& c : cases) {
      Tensor x = id == OpId::Prod ? Tensor::rand(c.sizes, g, 0.9, 1.1, DType::Float32)
                                  : Tensor::randn(c.sizes, g, DType::Float32);
      Attrs attrs{{"dims", c.dims}, {"keepdim", c.keepdim}};
      Tensor want = reference(id, {x}, attrs), got = eager(id, {x}, attrs);
      // var of a 0-d input divides 0 by 0; the rest are finite.
      expect_close(want, got, 2e-6, std::string(op_def(id).name) + " " + c.name);
    }
  }
  for (OpId id : {OpId::Argmax, OpId::Argmin}) {
    for (const ReduceCase& c : cases) {
      if (c.dims.size() > 1) continue;
      Tensor x = floor(mul(Tensor::randn(c.sizes, g, DType::Float32), 2.0));  // ties
      Attrs attrs{{"keepdim", c.keepdim}};
      if (!c.dims.empty()) attrs.set("dim", c.dims[0]);
      Tensor want = reference(id, {x}, attrs), got = eager(id, {x}, attrs);
      EXPECT_EQ(want.sizes(), got.sizes()) << c.name;
      EXPECT_EQ(want.to_vector<int64_t>(), got.to_vector<int64_t>())
          << op_def(id).name << " " << c.name;
    }
  }
}

TEST(Reduce, KeepdimShapes) {
  Generator g(14);
  Tensor x = randn(g, {2, 3, 4, 5});
  EXPECT_EQ(sum(x, {1, 3}).sizes(), (Dims{2, 4}));
  EXPECT_EQ(sum(x, {1, 3}, true).sizes(), (Dims{2, 1, 4, 1}));
  EXPECT_EQ(mean(x, {-1, 0}).sizes(), (Dims{3, 4}));
  EXPECT_EQ(amax(x).sizes(), (Dims{}));
  EXPECT_EQ(amin(x, {}, true).sizes(), (Dims{1, 1, 1, 1}));
  EXPECT_EQ(argmax(x, 2).sizes(), (Dims{2, 3, 5}));
  EXPECT_EQ(argmin(x, -3, true).sizes(), (Dims{2, 1, 4, 5}));
  // A 0-d input reduces nothing over dim 0 / -1.
  Tensor s = Tensor::scalar(2.5);
  EXPECT_EQ(sum(s, {0}).item(), 2.5);
  EXPECT_EQ(argmax(s, -1).item(), 0);
}

// ---- symbolic inference -----------------------------------------------------------------------
std::vector<TensorType> infer(OpId id, std::vector<TensorType> in, const Attrs& attrs = {}) {
  const OpDef& d = op_def(id);
  Attrs c = d.canonicalize(attrs, "test");
  std::vector<const TensorType*> ptrs;
  for (const TensorType& t : in) ptrs.push_back(&t);
  InferContext ctx{d, "n1", std::span<const TensorType* const>(ptrs.data(), ptrs.size()), c};
  return d.infer(ctx);
}

TEST(SymbolicInference, BinaryBroadcast) {
  SymInt batch = SymInt::symbol("batch"), seq = SymInt::symbol("seq");
  auto out = infer(OpId::Add, {TensorType(DType::Float32, Shape{batch, 1}),
                               TensorType(DType::Float32, Shape{4})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dtype, DType::Float32);
  EXPECT_EQ(out[0].shape, (Shape{batch, 4}));
  out = infer(OpId::Lt, {TensorType(DType::Int32, Shape{batch, seq}),
                         TensorType(DType::Float16, Shape{seq})});
  EXPECT_EQ(out[0].dtype, DType::Bool);
  EXPECT_EQ(out[0].shape, (Shape{batch, seq}));
  out = infer(OpId::Where, {TensorType(DType::Bool, Shape{1, seq}),
                            TensorType(DType::Int32, Shape{batch, 1}),
                            TensorType(DType::Float16, Shape{})});
  EXPECT_EQ(out[0].dtype, DType::Float16);
  EXPECT_EQ(out[0].shape, (Shape{batch, seq}));
  // Mismatched symbols cannot be proven equal: an error naming the node and both shapes.
  std::string msg = error_of([&] {
    infer(OpId::Mul, {TensorType(DType::Float32, Shape{batch, 3}),
                      TensorType(DType::Float32, Shape{seq, 3})});
  });
  EXPECT_TRUE(contains(msg, "'mul'") && contains(msg, "'n1'") && contains(msg, "[batch, 3]") &&
              contains(msg, "[seq, 3]")) << msg;
}

TEST(SymbolicInference, Reductions) {
  SymInt batch = SymInt::symbol("batch");
  TensorType x(DType::Float32, Shape{batch, 3});
  auto out = infer(OpId::Sum, {x}, {{"dims", Ints{0}}, {"keepdim", true}});
  EXPECT_EQ(out[0].shape, (Shape{1, 3}));
  out = infer(OpId::Sum, {x}, {{"dims", Ints{-1}}});
  EXPECT_EQ(out[0].shape, (Shape{batch}));
  out = infer(OpId::Argmax, {x}, {{"dim", int64_t(1)}, {"keepdim", true}});
  EXPECT_EQ(out[0].shape, (Shape{batch, 1}));
  EXPECT_EQ(out[0].dtype, DType::Int64);
  out = infer(OpId::Prod, {TensorType(DType::UInt8, Shape{batch, 3})}, {{"dims", Ints{1}}});
  EXPECT_EQ(out[0].dtype, DType::Int64);
  EXPECT_EQ(out[0].shape, (Shape{batch}));
  // A concrete size-0 reduced dim is caught at inference, naming op and node.
  std::string msg = error_of([&] {
    infer(OpId::Max, {TensorType(DType::Float32, Shape{batch, 0})}, {{"dims", Ints{1}}});
  });
  EXPECT_TRUE(contains(msg, "'max'") && contains(msg, "'n1'") && contains(msg, "empty")) << msg;
  msg = error_of([&] { infer(OpId::Mean, {x}, {{"dims", Ints{0, 0}}}); });
  EXPECT_TRUE(contains(msg, "'mean'") && contains(msg, "more than once")) << msg;
}

}  // namespace
}  // namespace kiln
