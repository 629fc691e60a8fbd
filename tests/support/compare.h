// The one comparison of numeric results that every test uses. See Note [Honest comparisons].
//
// Note [Honest comparisons]
// close(got, ref, tol) passes when every element of `got` matches the element of `ref` at the
// same index:
//   - NaN matches NaN only: NaN on one side (NaN vs a number, or vs an infinity) fails;
//   - an infinity matches the same infinity only (+inf vs -inf fails, inf vs a number fails),
//     except that a finite reference value that rounds to that infinity in got's (narrower)
//     dtype matches it under a non-exact tolerance (a float64 oracle of 1e5 is inf in float16);
//   - integer and bool results (both sides of an integer or bool dtype) compare exactly, as
//     int64, whatever the tolerance;
//   - finite values match when |got_i - ref_i| <= bound_i, where
//         bound_i = atol + rtol * |ref_i| + scale_rtol * S_i
//     and S_i is the error scale the caller chose: none (0), max_j |ref_j| (of_max_ref: for
//     results such as sums with cancellation, whose error follows the inputs' scale rather
//     than the result's), a number the caller computed (of_scale), or one scale per element
//     (of_scales: e.g. sum_k |a_k * b_k| for a dot product);
//   - -0 and +0 are equal unless tol.signed_zeros (for ops whose zero sign is defined).
// A failure reports how many elements differ, the worst one (largest |diff| / bound, non-finite
// mismatches first) with its multi-dimensional and flat index and both values, the first
// one, and the counts of NaN / infinity mismatches; compare() returns the same facts for tests
// that print their error (passes_zoo_test prints the worst error of every model).
//
// Per-dtype defaults (Tolerance::for_dtype, the op harness's base tolerances): rtol = atol =
// 1e-10 (float64), 1e-5 (float32), 1e-2 (float16), 2e-2 (bfloat16), ~10x one rounding of the
// dtype with room for a few accumulated roundings; integers and bool exact.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln::test {

struct Tolerance {
  enum class Scale : uint8_t { None, MaxRef, Given, PerElement };

  double rtol = 0;        // times |ref_i|
  double atol = 0;
  double scale_rtol = 0;  // times the error scale S_i
  Scale scale = Scale::None;
  double given_scale = 0;               // Scale::Given
  std::vector<double> element_scales;   // Scale::PerElement: one per element, row-major
  bool signed_zeros = false;            // -0 != +0

  // Exact equality (NaN still matches NaN).
  static Tolerance exact() { return {}; }
  // atol + rtol * |ref_i|.
  static Tolerance rel(double rtol, double atol) {
    Tolerance t;
    t.rtol = rtol;
    t.atol = atol;
    return t;
  }
  // atol + rtol * max_j |ref_j|.
  static Tolerance of_max_ref(double rtol, double atol = 0) {
    Tolerance t;
    t.atol = atol;
    t.scale_rtol = rtol;
    t.scale = Scale::MaxRef;
    return t;
  }
  // atol + rtol * scale (a scale the caller computed).
  static Tolerance of_scale(double scale, double rtol, double atol = 0) {
    Tolerance t = of_max_ref(rtol, atol);
    t.scale = Scale::Given;
    t.given_scale = scale;
    return t;
  }
  // atol + rtol * scales[i].
  static Tolerance of_scales(std::vector<double> scales, double rtol, double atol = 0) {
    Tolerance t = of_max_ref(rtol, atol);
    t.scale = Scale::PerElement;
    t.element_scales = std::move(scales);
    return t;
  }
  // The documented defaults of dtype d (see the Note).
  static Tolerance for_dtype(DType d);

  // Adds an elementwise part to a scale-relative tolerance (or replaces it).
  Tolerance& plus_rel(double r) {
    rtol = r;
    return *this;
  }
  Tolerance& with_signed_zeros(bool on = true) {
    signed_zeros = on;
    return *this;
  }
  // Every bound multiplied by f (an op's tolerance_scale).
  Tolerance scaled(double f) const;

  bool is_exact() const { return rtol == 0 && atol == 0 && scale_rtol == 0; }
  std::string str() const;  // "atol 1e-05 + rtol 1e-05 * |ref|"
};

// What compare() found. Indices are row-major over the logical shape.
struct Comparison {
  std::string problem;  // shape / size mismatch; then nothing else is filled
  int64_t numel = 0;
  int64_t mismatches = 0;
  int64_t nan_got_only = 0;   // got NaN, ref not
  int64_t nan_ref_only = 0;   // ref NaN, got not
  int64_t inf_mismatches = 0; // an infinity on either side that does not match
  double max_abs_ref = 0;     // over finite ref values
  // The worst element (largest |diff| / bound; a non-finite mismatch is worst). Among
  // matching elements when nothing mismatches (how close the test came to its bound).
  int64_t worst_flat = -1;
  std::vector<int64_t> worst_index;
  double worst_got = 0, worst_ref = 0, worst_diff = 0, worst_bound = 0;
  // |diff| / bound of the worst element (inf for a non-finite mismatch or a nonzero diff
  // under a zero bound; 0 for an exact match).
  double worst_ratio = 0;
  int64_t first_flat = -1;  // first mismatch
  std::vector<int64_t> first_index;
  double first_got = 0, first_ref = 0;
  std::string tolerance;  // Tolerance::str()

  bool ok() const { return problem.empty() && mismatches == 0; }
  std::string str() const;  // one line: what differs and where (or how close it came)
};

// got and ref of one shape, any dtypes and strides. A floating `got` compared with an
// integer `ref` (or the reverse) compares as values under `tol`.
Comparison compare(const Tensor& got, const Tensor& ref, const Tolerance& tol);
// Flat values; `shape` (optional, its numel must match) names multi-dimensional indices.
Comparison compare(std::span<const double> got, std::span<const double> ref,
                   const Tolerance& tol, const Dims& shape = {});
Comparison compare(std::span<const float> got, std::span<const float> ref, const Tolerance& tol,
                   const Dims& shape = {});

// max |v| over the finite values (the scale of of_scale for "relative to the output's size").
double max_abs(const Tensor& t);
// A model output worth comparing against: every element finite and not all of them zero. A
// comparison lets NaN match NaN (special-value semantics), so a reference that is all NaN or
// all zero would let a broken kernel pass; model tests check their reference with this first.
::testing::AssertionResult usable_reference(const Tensor& t);
// "" when a and b (any devices) hold the same bytes, else where they first differ: for results
// that must be bitwise equal (a replay against a plain run, host against device inputs).
std::string first_byte_difference(const Tensor& a, const Tensor& b);
double max_abs(std::span<const double> v);

// gtest forms: EXPECT_TRUE(kiln::test::close(got, ref, tol)) prints compare()'s report.
::testing::AssertionResult close(const Tensor& got, const Tensor& ref, const Tolerance& tol);
::testing::AssertionResult close(std::span<const double> got, std::span<const double> ref,
                                 const Tolerance& tol, const Dims& shape = {});
::testing::AssertionResult close(std::span<const float> got, std::span<const float> ref,
                                 const Tolerance& tol, const Dims& shape = {});
inline ::testing::AssertionResult close(const std::vector<double>& got,
                                        const std::vector<double>& ref, const Tolerance& tol,
                                        const Dims& shape = {}) {
  return close(std::span<const double>(got), std::span<const double>(ref), tol, shape);
}
inline ::testing::AssertionResult close(const std::vector<float>& got,
                                        const std::vector<float>& ref, const Tolerance& tol,
                                        const Dims& shape = {}) {
  return close(std::span<const float>(got), std::span<const float>(ref), tol, shape);
}

// The value of a scalar kernel against a reference value under the same rules (one element).
::testing::AssertionResult close(double got, double ref, const Tolerance& tol);

}  // namespace kiln::test
