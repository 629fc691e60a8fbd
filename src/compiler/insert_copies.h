// Phase 3 of the compiler (Note [The compiler]): copies where a kernel cannot read a view.
//
// Library kernels want plain buffers, and eager kernels are bound to tensors at compile time
// while a graph input's memory is only known per call. So inputs of library candidates that are
// non-contiguous views (except the ones the library reads in place with their strides:
// Target::library_reads_strided, e.g. a permuted matmul operand), and inputs of eager-kernel
// nodes that are views of graph inputs, get a copy node. Views are resolved as the schedule
// will resolve them: views the memory planner materializes are their own base. That decision
// depends on a view's producers, not its consumers, so the copy nodes added here (which are not
// views) leave it unchanged for every other value.
//
// Expects: choose_kernels' decisions for `g`. Guarantees: the graph gets copy nodes (and the
// per-node decision vectors grow with it: a copy is generated code); every library candidate
// reads plain buffers or its declared strided operands.
#pragma once
#include <vector>

#include "compiler/choose_kernels.h"
#include "compiler/target.h"
#include "lower/scheduler.h"

namespace kiln::compiler {

struct CopiedGraph {
  std::vector<int32_t> library_nodes;  // the library candidates, as node indices of the new graph
  std::vector<bool> view_is_copy;      // per value: the memory planner materializes this view
  std::vector<StridedOperand> strided_operands;  // views library kernels read in place
};

CopiedGraph insert_copies(Graph& g, KernelChoice& choice, const Target& target);

// Strides of size-1 dims never address anything: rewritten to the extent of the dims inside
// them (the contiguous value when those are contiguous), so that a transpose involving a size-1
// dim counts as contiguous, and a library sees batches that do not overlap (oneDNN's brgemm
// matmul takes such strides; with a smaller one it falls back to its gemm kernel).
Dims normalized_strides(const lower::ViewGeometry& geo);
bool contiguous_geometry(const lower::ViewGeometry& geo);

}  // namespace kiln::compiler
