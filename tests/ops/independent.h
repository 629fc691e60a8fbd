// A second evaluation of ops, written apart from their reference kernels, for the op harness:
// see Note [Independent oracle].
//
// Note [Independent oracle]
// The op harness's oracle is the op's float64 reference kernel. Where the path under test IS
// that kernel (an eager op with no fast path for the dtype, or any float64 case, whose oracle
// inputs are the tested inputs themselves), comparing with the oracle compares the reference
// with itself and can never fail. For those cases the harness compares with this evaluation
// instead: the op computed in long double from its documented semantics (NaN propagation of
// max/min/relu/clamp/maximum/minimum/argmax, Note [Scalar math]), by code that shares nothing
// with src/ops but the dtype conversions of core/ (load_f64 / store_f64). It also checks the
// float64 reference itself against it. It covers the pointwise ops (unary, binary, where,
// cast, clamp, not), the reductions, softmax / log_softmax, matmul and linear; for any other op
// it returns nothing, and the harness lists the op as "reference only" where the reference
// is its only eager path (OpHarnessSelf.ReferenceOnlyOps).
#pragma once
#include <optional>
#include <span>

#include "core/tensor.h"
#include "ops/op.h"

namespace kiln::harness {

// Whether independent() covers op.
bool has_independent(OpId op);
// The outputs of op on `inputs` (any dtypes; floating results as float64 tensors, integer and
// bool results in out_types' dtypes), or nothing when the op is not covered.
std::optional<TensorList> independent(const OpDef& op, const TensorList& inputs,
                                      const Attrs& canonical_attrs,
                                      std::span<const TensorType> out_types);

}  // namespace kiln::harness
