// algebraic-simplify: local rewrites that remove work without changing results.
//
// The rules are one table (kRules in algebraic_simplify.cc), each `pattern -> replacement`:
//
//   mul(x, 1), mul(1, x), div(x, 1)            -> x
//   add(x, 0), add(0, x), sub(x, 0)            -> x
//   reshape | flatten | squeeze | unsqueeze | expand | slice (x), output type == x's  -> x
//   pad(x) with all pads 0                     -> x
//   concat(x) (one input)                      -> x
//   permute(x) {dims=identity}, transpose(x) {dim0 == dim1}                         -> x
//   reshape(reshape | flatten | squeeze | unsqueeze (x))                             -> reshape(x)
//   permute | transpose (permute | transpose (x))   -> permute(x, composed), or x if identity
//   cast(x) {dtype = x's dtype}                -> x
//   cast(cast(x, T1), T2), x -> T1 exact       -> cast(x, T2), or x if T2 is x's dtype
//   neg(neg(x))                                -> x
//   not(not(x)), x bool                        -> x
//
// "1" and "0" are consts (never params: those may change) whose every element has that value.
// An identity rule applies only when the node's output has exactly x's dtype, shape and device,
// so a constant that broadcasts x to a larger shape or promotes its dtype is kept (x*1 with x
// i32 and 1 f32 is a cast, not a no-op). x + 0 turns -0.0 into +0.0 in IEEE arithmetic; the rule
// drops that sign change, as XLA and PyTorch do. A cast is exact when every value of the source
// dtype is representable in the target (f16/bf16 -> f32 -> f64, int8/uint8 -> int32 -> int64,
// int8/uint8 -> any float, int32 -> f64, bool -> anything); conversion depends only on the value,
// so casting x directly to T2 gives what the exact detour gave.
//
// Expects: a valid graph. Nodes are visited in order and rules look at the rewritten producers
// of their inputs, so chains collapse in one sweep. Guarantees: no rule of the table matches any
// node afterwards. Replaced producers are left in place when they become unused: run dce after.
// Names: a replacement node takes the name of the value it replaces.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "passes/pass.h"

namespace kiln {

std::unique_ptr<Pass> make_algebraic_simplify_pass();

struct SimplifyResult {
  int rewrites = 0;
  std::vector<std::pair<std::string, int>> by_rule;  // rule pattern -> times applied
};
SimplifyResult simplify_algebra(Graph& g);

// Whether converting any value of dtype `from` to `to` and back loses nothing.
bool cast_is_exact(DType from, DType to);

}  // namespace kiln
