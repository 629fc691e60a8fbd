// Phase 2 of the compiler (Note [The compiler]): how each node of the optimized graph runs.
//
// Expects: a graph after the compiler pipeline (passes/pipeline.h), concrete shapes.
// Guarantees: per node, at most one of library / gemv; `generated` is the target's answer for
// loop code (Target::generates). A library candidate may still be refused by the library
// lowering (LibraryKernels::lowered): the scheduler then runs it as generated code or, failing
// that, as its eager kernel. Everything else runs its eager kernel inside the executable.
#pragma once
#include <vector>

#include "compiler/target.h"
#include "ir/graph.h"

namespace kiln::compiler {

struct KernelChoice {
  std::vector<bool> library;    // per node: a candidate for the target's library kernels
  std::vector<bool> gemv;       // per node: a small linear generated as a reduction
  std::vector<bool> generated;  // per node: loop code
};

KernelChoice choose_kernels(const Graph& g, const Target& target, const SchedulePolicy& policy);

}  // namespace kiln::compiler
