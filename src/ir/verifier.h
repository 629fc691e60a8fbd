// The graph verifier: checks the invariants of Note [Graph IR]. Passes run it after every pass
// (see passes/pass.h); tests run it on hand-built and corrupted graphs.
//
// Checks:
//   - values: names non-empty and unique; a NodeOutput's producer/output_index point back at
//     it; Inputs are listed in `inputs` exactly once; Param/Const data, when present, has
//     exactly the declared type (dtype, shape, strides, device);
//   - nodes (in order): a registered op; input ids in range, absent (kNoValue) only where the
//     schema marks the input optional, and defined before use (graph inputs, params, consts,
//     or outputs of an earlier node) — i.e. SSA in topological order; arity; canonical
//     attributes; output ids in range, produced by this node only; output types equal to the
//     registry's inference on the input types and attributes;
//   - graph outputs: in range and defined.
#pragma once
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln {

// Every problem found, in graph order (empty when the graph is valid). Each names the node
// (index, provenance name, op) and the value.
std::vector<std::string> verify_problems(const Graph& g);

// Throws kiln::Error (InvalidArgument) listing the problems when there are any.
void verify(const Graph& g);

}  // namespace kiln
