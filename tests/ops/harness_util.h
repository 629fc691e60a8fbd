// Helpers for the generated op harness (op_harness_test.cc): dtype conversion of sample inputs,
// layout changes, tolerances and value comparison with readable mismatch reports.
// See Note [Op harness] in op_harness_test.cc.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "../support/compare.h"
#include "core/tensor.h"
#include "ops/op.h"

namespace kiln::harness {

using test::Tolerance;

// Tolerance for an output of dtype `out` computed by a case run in `test_dtype`: exact for
// integer/bool outputs, else the looser of the two floating dtypes' defaults
// (Tolerance::for_dtype), scaled by `scale`.
Tolerance compare_tolerance(DType test_dtype, DType out, double scale);

// A sample input converted to the tested dtype `d`, keeping its layout (a view stays a view
// with the same sizes, strides and offset). Integer and bool inputs are returned unchanged.
// Floating -> floating rounds to nearest; floating -> integer/bool follows Note [Integer cases].
Tensor to_test_dtype(const Tensor& sample_input, DType d);
// A plain value-preserving conversion that keeps the layout (used for the float64 oracle).
Tensor convert_keep_layout(const Tensor& x, DType d);

// The same values in a non-contiguous layout: a transposed-storage copy (all dims reversed in
// memory), or, when that is still contiguous (a single non-unit dim), every element two slots
// apart with NaN / 0x5A bytes in the gaps. Tensors with <= 1 element are returned unchanged.
Tensor make_noncontiguous(const Tensor& x);

// A contiguous deep copy (undefined stays undefined).
Tensor snapshot(const Tensor& x);
TensorList snapshot(const TensorList& xs);

// "" when `actual` matches `expected` under test::compare (Note [Honest comparisons]);
// otherwise its report (the worst element and where, the first, NaN / infinity mismatches)
// with both types.
std::string compare_values(const Tensor& expected, const Tensor& actual, const Tolerance& tol);
// "" when both have the same shape, dtype and bytes element by element (any strides).
std::string compare_bitwise(const Tensor& a, const Tensor& b);

// The message of the kiln::Error that f throws; "<no error>" when it throws nothing and
// "<not a kiln::Error: ...>" for any other exception (so message checks fail loudly).
std::string error_of(const std::function<void()>& f);
bool contains(const std::string& s, const std::string& part);

std::string index_str(const int64_t* idx, int rank);  // "[1, 0, 3]"
std::string types_str(const TensorList& ts);          // "(f32[2, 3], i64[4])"

}  // namespace kiln::harness
