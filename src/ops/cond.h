// kiln::cond: data-dependent control flow that capture keeps inside one graph (torch.cond's
// counterpart). See Note [cond] in cond.cc.
//
//   TensorList y = cond(gt(mean(h), scalar_like(0.25, h)),
//                       [&](const TensorList& v) { return TensorList{fc2->forward(v[0])}; },
//                       [](const TensorList& v) { return TensorList{v[0] * -0.5 + 1.0}; }, {h});
#pragma once
#include <functional>
#include <source_location>

#include "core/tensor.h"

namespace kiln {

using CondBranch = std::function<TensorList(const TensorList& operands)>;

// if_true(operands) when `pred` (one element: bool, or a number, nonzero meaning true) holds,
// else if_false(operands). Eagerly, only the chosen branch runs. Under capture both branches
// are recorded into the graph and each output is selected by `pred` (a `where`), so the graph
// has no break and a package can hold it; both branches must then return as many tensors, of
// the same dtypes, shapes and devices, and be valid for either value of `pred` (the compiled
// graph computes both).
TensorList cond(const Tensor& pred, const CondBranch& if_true, const CondBranch& if_false,
                const TensorList& operands,
                const std::source_location& loc = std::source_location::current());

}  // namespace kiln
