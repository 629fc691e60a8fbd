// constant-fold: evaluate nodes whose inputs are all known now, and replace them by consts.
//
// A node folds when every input it has is a const with data, or (with fold_params, the default:
// inference graphs freeze their weights) a param with data, so param-only subgraphs such as a
// weight transpose or an embedding of constant positions become data. The node runs through the
// eager kernels (kiln::call_op, with any dispatch hook disabled); each output takes the output's
// name and becomes a const, or a param when an input was a param (Note [Folded weights stay
// params]). Folding follows chains in one sweep (a folded value is a constant for the nodes
// after it).
//
// Note [Folded weights stay params]
// A value computed from a param is a weight too: it changes when the weights change. Keeping it
// a param (as fold-conv-bn and autocast do with what they derive from params) keeps value-driven
// decisions off it: cse merges equal consts but never params, algebraic-simplify drops x*1 and
// x+0 only for consts, and the scheduler inlines one-element consts into generated code as
// literals but reads params from memory. So the graph the passes make from a graph's params has
// the same structure whatever their values, which is what lets `kiln package --replace-weights`
// (compiler/replace_weights.h) re-run the passes on new weights and put the results into a
// compiled package without generating code again.
//
// What does not fold:
//   - outputs larger than max(small_elements, the elements of the node's const/param inputs):
//     folding must not make the graph's data grow (expand of a scalar to a big shape stays an
//     expand), apart from small results and gathers (index_select, gather, embedding) of up to
//     gather_elements, whose per-call form is an indirect read (constant_fold.cc says why);
//   - nodes with symbolic output shapes or symbolic int attributes;
//   - nodes whose outputs are all unused (dce removes them; evaluating them is wasted work);
//   - nodes whose kernel fails on these inputs (e.g. an out-of-range gather index): the node is
//     left as it is, so the error surfaces when the graph runs, naming the node.
//
// Expects: a valid graph. Guarantees: no live node whose inputs are all (foldable) consts and
// that satisfies the limits above remains. The inputs of folded nodes stay in the graph; run
// dce to drop the ones that became unused.
#pragma once
#include <cstdint>
#include <memory>

#include "passes/pass.h"

namespace kiln {

struct ConstantFoldOptions {
  bool fold_params = true;         // treat params with data as constants (frozen weights)
  int64_t small_elements = 1 << 16;  // results this small always fold
  int64_t gather_elements = 1 << 20;  // gathers of constant rows fold up to this, growing or not
};

std::unique_ptr<Pass> make_constant_fold_pass(ConstantFoldOptions options = {});

struct ConstantFoldResult {
  int nodes_folded = 0;
  int64_t folded_elements = 0;  // elements of the consts made
};
ConstantFoldResult fold_constants(Graph& g, const ConstantFoldOptions& options = {});

}  // namespace kiln
