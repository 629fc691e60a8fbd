// cse: common-subexpression elimination.
//
// Two nodes compute the same values when they have the same op, the same inputs (after earlier
// merges) and equal canonical attributes; the later one is dropped and its uses refer to the
// earlier one's outputs. Inputs of commutative ops (add, mul, maximum, minimum, eq, ne, and,
// or) are compared as a set, so add(%a, %b) and add(%b, %a) merge. Consts with the same dtype,
// shape and bytes merge too (capture makes one const per host scalar, so `x + 1.0` twice gives
// two equal consts). Params never merge: each stands for a distinct tensor that may change.
// Attributes compare exactly (floats bit for bit as printed: 0.0 and -0.0 differ).
//
// Expects: a valid graph. Guarantees: no two nodes (or consts) are duplicates; one sweep
// suffices, since nodes are visited in topological order with inputs already merged. The names
// of the kept values are unchanged. Returns whether anything merged.
#pragma once
#include <memory>

#include "passes/pass.h"

namespace kiln {

std::unique_ptr<Pass> make_cse_pass();

struct CseResult {
  int nodes_merged = 0;
  int consts_merged = 0;
};
CseResult eliminate_common_subexpressions(Graph& g);

}  // namespace kiln
