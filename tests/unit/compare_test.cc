// The comparison helper itself (tests/support/compare.h, Note [Honest comparisons]): every rule
// of the Note, and that the report names the worst element.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "../support/compare.h"

namespace kiln::test {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(Compare, NanMustBeOnBothSides) {
  const Tolerance loose = Tolerance::rel(1e3, 1e3);
  EXPECT_TRUE(close(std::vector<double>{1, kNaN}, {1, kNaN}, loose));
  Comparison c = compare(std::vector<double>{1, kNaN}, std::vector<double>{1, 2}, loose);
  EXPECT_FALSE(c.ok());
  EXPECT_EQ(c.nan_got_only, 1);
  EXPECT_EQ(c.worst_flat, 1);
  c = compare(std::vector<double>{1, 2}, std::vector<double>{kNaN, 2}, loose);
  EXPECT_FALSE(c.ok());
  EXPECT_EQ(c.nan_ref_only, 1);
  EXPECT_FALSE(close(kNaN, kInf, loose));
  EXPECT_FALSE(close(kInf, kNaN, loose));
  // The classic hand-rolled loop would have passed this: std::max(err, NaN) keeps err.
  double err = 0;
  err = std::max(err, std::fabs(kNaN - 1.0));
  EXPECT_EQ(err, 0);
  EXPECT_FALSE(close(kNaN, 1.0, loose));
}

TEST(Compare, InfinitiesMustMatchInSign) {
  const Tolerance loose = Tolerance::rel(1e3, 1e3);
  EXPECT_TRUE(close(kInf, kInf, loose));
  EXPECT_TRUE(close(-kInf, -kInf, Tolerance::exact()));
  EXPECT_FALSE(close(kInf, -kInf, loose));
  EXPECT_FALSE(close(kInf, 1e300, loose));
  EXPECT_FALSE(close(1e300, kInf, loose));
  Comparison c = compare(std::vector<double>{0, -kInf}, std::vector<double>{0, kInf}, loose);
  EXPECT_EQ(c.inf_mismatches, 1);
  EXPECT_TRUE(contains(c.str(), "unmatched infinities: 1")) << c.str();
}

TEST(Compare, FiniteOracleOverflowingGotsDtypeMayBeInfinity) {
  Tensor ref = Tensor::from_vector<double>({1e5, -1e6, 1.0}, {3});
  Tensor got = ref.to(DType::Float16);  // 1e5 and -1e6 are +-inf in float16
  EXPECT_TRUE(std::isinf(got.to_vector<double>()[0]));
  EXPECT_TRUE(close(got, ref, Tolerance::for_dtype(DType::Float16)));
  // Not under an exact tolerance, and not where the oracle does not overflow.
  EXPECT_FALSE(close(got, ref, Tolerance::exact()));
  Tensor small = Tensor::from_vector<double>({6e4}, {1});
  Tensor inf16 = Tensor::from_vector<double>({kInf}, {1}).to(DType::Float16);
  EXPECT_FALSE(close(inf16, small, Tolerance::for_dtype(DType::Float16)));
}

TEST(Compare, ElementwiseToleranceFollowsEachReferenceValue) {
  // 1e-3 error on a value of 1000 is fine at rtol 1e-5; on a value of 1 next to it it is not,
  // although max|ref| would have hidden it.
  Tolerance t = Tolerance::rel(1e-5, 1e-7);
  EXPECT_TRUE(close(std::vector<double>{1000.001, 1.0}, {1000.0, 1.0}, t));
  Comparison c = compare(std::vector<double>{1000.0, 1.001}, std::vector<double>{1000.0, 1.0}, t);
  EXPECT_FALSE(c.ok());
  EXPECT_EQ(c.worst_flat, 1);
  EXPECT_TRUE(close(std::vector<double>{1000.0, 1.001}, {1000.0, 1.0}, Tolerance::of_max_ref(1e-5)));
}

TEST(Compare, ScaleRelativeModes) {
  // A sum with cancellation: the result is ~0, its error follows the inputs' scale.
  std::vector<double> ref = {1e-9, 5.0}, got = {3e-6, 5.0};
  EXPECT_FALSE(close(got, ref, Tolerance::rel(1e-6, 0)));
  EXPECT_TRUE(close(got, ref, Tolerance::of_max_ref(1e-6)));
  EXPECT_FALSE(close(got, ref, Tolerance::of_max_ref(1e-7)));
  EXPECT_TRUE(close(got, ref, Tolerance::of_scale(100.0, 1e-7)));
  EXPECT_FALSE(close(got, ref, Tolerance::of_scale(1.0, 1e-7)));
  EXPECT_TRUE(close(got, ref, Tolerance::of_scales({40.0, 1.0}, 1e-7)));
  EXPECT_FALSE(close(got, ref, Tolerance::of_scales({20.0, 1.0}, 1e-7)));
  // A scale vector of the wrong length is an error, not a pass.
  EXPECT_FALSE(close(got, ref, Tolerance::of_scales({1e9}, 1.0)));
  // Both parts together.
  EXPECT_TRUE(close(std::vector<double>{3e-6, 5.00001}, {1e-9, 5.0},
                    Tolerance::of_max_ref(1e-6).plus_rel(1e-5)));
}

TEST(Compare, IntegersAndBoolAreExact) {
  Tensor a = Tensor::from_vector<int64_t>({(int64_t(1) << 60) + 1, 2, 3}, {3});
  Tensor b = Tensor::from_vector<int64_t>({int64_t(1) << 60, 2, 3}, {3});
  // Equal as doubles, not as integers; and a tolerance does not loosen integer compares.
  EXPECT_FALSE(close(a, b, Tolerance::rel(1, 1)));
  EXPECT_TRUE(close(b, b.clone(), Tolerance::rel(1, 1)));
  Tensor t = Tensor::from_vector<double>({1, 0, 1}, {3}).to(DType::Bool);
  Tensor f = Tensor::from_vector<double>({1, 1, 1}, {3}).to(DType::Bool);
  EXPECT_FALSE(close(t, f, Tolerance::rel(1, 1)));
  for (DType d : {DType::Int64, DType::Int32, DType::Int8, DType::UInt8, DType::Bool})
    EXPECT_TRUE(Tolerance::for_dtype(d).is_exact()) << dtype_name(d);
  for (DType d : {DType::Float64, DType::Float32, DType::Float16, DType::BFloat16})
    EXPECT_FALSE(Tolerance::for_dtype(d).is_exact()) << dtype_name(d);
  EXPECT_LT(Tolerance::for_dtype(DType::Float64).rtol, Tolerance::for_dtype(DType::Float32).rtol);
}

TEST(Compare, WorstUnderAZeroBoundIsTheLargestDifference) {
  Comparison c = compare(std::vector<double>{1.5, 3.0, 2.25}, std::vector<double>{1, 1, 2},
                         Tolerance::exact());
  EXPECT_EQ(c.mismatches, 3);
  EXPECT_EQ(c.worst_flat, 1);
  EXPECT_EQ(c.worst_diff, 2.0);
  EXPECT_EQ(c.first_flat, 0);
}

TEST(Compare, SignedZerosOnlyWhenAsked) {
  EXPECT_TRUE(close(-0.0, 0.0, Tolerance::exact()));
  EXPECT_FALSE(close(-0.0, 0.0, Tolerance::exact().with_signed_zeros()));
  EXPECT_TRUE(close(-0.0, -0.0, Tolerance::exact().with_signed_zeros()));
}

TEST(Compare, ReportsTheWorstElementWithItsIndex) {
  Generator g(5);
  Tensor ref = Tensor::randn({2, 3, 4}, g, DType::Float64);
  Tensor got = ref.to(DType::Float32);
  EXPECT_TRUE(close(got, ref, Tolerance::for_dtype(DType::Float32)));
  float* p = got.data<float>();
  p[1 * 12 + 2 * 4 + 3] += 0.5f;  // [1, 2, 3], flat 23: the worst
  p[0 * 12 + 1 * 4 + 0] += 1e-3f; // [0, 1, 0], flat 4: the first
  Comparison c = compare(got, ref, Tolerance::for_dtype(DType::Float32));
  EXPECT_EQ(c.mismatches, 2);
  EXPECT_EQ(c.worst_flat, 23);
  EXPECT_EQ(c.worst_index, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(c.first_flat, 4);
  EXPECT_NEAR(c.worst_diff, 0.5, 1e-6);
  std::string s = c.str();
  EXPECT_TRUE(contains(s, "2 of 24 elements differ")) << s;
  EXPECT_TRUE(contains(s, "worst at [1, 2, 3] (flat 23)")) << s;
  EXPECT_TRUE(contains(s, "first at [0, 1, 0] (flat 4)")) << s;
  // The gtest form carries the same report.
  ::testing::AssertionResult r = close(got, ref, Tolerance::for_dtype(DType::Float32));
  EXPECT_FALSE(r);
  EXPECT_TRUE(contains(r.message(), "worst at [1, 2, 3] (flat 23)")) << r.message();
}

TEST(Compare, ShapesAndLayouts) {
  Generator g(9);
  Tensor ref = Tensor::randn({3, 4}, g, DType::Float64);
  EXPECT_FALSE(close(ref.contiguous().as_strided({4, 3}, {3, 1}, 0), ref, Tolerance::rel(1, 1)));
  // A transposed view compares by logical index, not by memory order.
  Tensor base = Tensor::empty({4, 3}, DType::Float64);
  Tensor t = base.as_strided({3, 4}, {1, 3}, 0);
  t.copy_(ref);
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_TRUE(close(t, ref, Tolerance::exact()));
  EXPECT_FALSE(close(Tensor(), ref, Tolerance::rel(1, 1)));
  // Flat values with a shape name multi-dimensional indices; a wrong shape is an error.
  Comparison c = compare(std::vector<double>{0, 0, 0, 0, 0, 1}, std::vector<double>(6, 0.0),
                         Tolerance::exact(), Dims{2, 3});
  EXPECT_EQ(c.worst_index, (std::vector<int64_t>{1, 2}));
  EXPECT_FALSE(close(std::vector<double>{1, 2}, {1, 2, 3}, Tolerance::rel(1, 1)));
  EXPECT_FALSE(close(std::vector<double>{1, 2}, {1, 2}, Tolerance::rel(1, 1), Dims{3}));
  // Empty inputs match.
  EXPECT_TRUE(close(std::vector<double>{}, std::vector<double>{}, Tolerance::exact()));
}

TEST(Compare, ScaledToleranceAndDescription) {
  Tolerance t = Tolerance::for_dtype(DType::Float32).scaled(10);
  EXPECT_DOUBLE_EQ(t.rtol, 1e-4);
  EXPECT_DOUBLE_EQ(t.atol, 1e-4);
  EXPECT_EQ(Tolerance::exact().str(), "exact");
  EXPECT_TRUE(contains(Tolerance::of_max_ref(1e-4, 1e-6).str(), "max|ref|"));
  // A passing comparison says how close it came.
  Comparison c = compare(std::vector<double>{1.5}, std::vector<double>{1.0}, Tolerance::rel(0, 1));
  EXPECT_TRUE(c.ok());
  EXPECT_DOUBLE_EQ(c.worst_ratio, 0.5);
}

// A model reference of NaN (or zeros) would let any broken kernel pass a NaN-matching comparison.
TEST(Compare, UsableReferenceRefusesNaNInfinityAndAllZero) {
  Tensor ok = Tensor::from_vector(std::vector<float>{0.5f, 0.0f, -2.0f}, Dims{3});
  EXPECT_TRUE(usable_reference(ok));
  Tensor nan = Tensor::from_vector(std::vector<float>{0.5f, std::nanf(""), 1.0f}, Dims{3});
  ::testing::AssertionResult r = usable_reference(nan);
  EXPECT_FALSE(r);
  EXPECT_TRUE(contains(r.message(), "first at flat index 1")) << r.message();
  EXPECT_FALSE(usable_reference(Tensor::from_vector(std::vector<float>{INFINITY, 1.0f}, Dims{2})));
  EXPECT_FALSE(usable_reference(Tensor::from_vector(std::vector<float>{0.0f, -0.0f}, Dims{2})));
}

}  // namespace
}  // namespace kiln::test
