// The graph interpreter: runs a Graph node by node through the eager kernels (kiln::call_op).
// It is the oracle that compiled graphs are tested against and a way to run IR text directly;
// it is not fast.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"

namespace kiln {

using SymbolBindings = std::vector<std::pair<std::string, int64_t>>;

// Checks `inputs` against the graph inputs (count, dtype, rank, device, every dimension) and
// binds the symbols of symbolic dims from the actual sizes: a dim that is a bare symbol binds
// it (the same symbol must get the same value everywhere); a dim that is an expression
// ("2*n + 1") is then evaluated and compared. Errors name the input:
// "input 0 ('x'): dim 2 expected 224, got 225". Input strides are not constrained.
SymbolBindings bind_input_symbols(const Graph& g, const TensorList& inputs);

// `attrs` with every int attribute (single or list) evaluated under `bindings`: int attributes
// may be symbolic (reshape {shape=[n, -1]}), kernels need them concrete.
Attrs specialize_attrs(const Attrs& attrs, const SymbolBindings& bindings);

// `g` with every symbolic dim and int attribute evaluated under `bindings` (from
// bind_input_symbols): the concrete graph a compiler takes for one set of input sizes. Throws
// naming the symbol when one is unbound.
Graph specialize_graph(const Graph& g, const SymbolBindings& bindings);

// Runs the graph. Params and consts must carry data (IR text declares params by type only;
// set Graph::value(id).data first). Intermediates are released after their last use. Kernel
// errors are re-thrown naming the node; an output whose shape disagrees with the graph's type
// is an Internal error (inference and kernel disagree).
TensorList run(const Graph& g, const TensorList& inputs);

}  // namespace kiln
