// dce: dead-code elimination.
//
// Removes nodes none of whose outputs (transitively) reach a graph output, and params and
// consts that no remaining node and no graph output uses. Graph inputs are kept even when
// unused: they are the graph's calling signature. Every op is pure (no op writes its inputs or
// has side effects), so an unused result is always safe to drop.
//
// Expects: a valid graph; nothing needs to run before it. Run it last, after passes that leave
// replaced nodes behind (algebraic-simplify, constant-fold, fold-conv-bn).
// Guarantees: every node is live; every param/const is used; inputs, outputs and the names of
// everything kept are unchanged. Returns false (and leaves the graph alone) when nothing is dead.
#pragma once
#include <memory>

#include "passes/pass.h"

namespace kiln {

std::unique_ptr<Pass> make_dce_pass();

// The pass itself, for callers that want the counts.
struct DceResult {
  int nodes_removed = 0;
  int params_removed = 0;  // params and consts
};
DceResult eliminate_dead_code(Graph& g);

}  // namespace kiln
