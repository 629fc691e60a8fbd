// Phase 7 of the compiler (Note [The compiler]): the Executable.
//
// One launch per schedule step, in order: the target's loop-kernel launches (build_loops), the
// library kernels' launches (LibraryKernels::bind, with the inputs' MemRefs and the scratch
// region, which sits after the planned values in every execution context's arena; a virtual
// view input contributes its offset), and for every other node its eager kernel, bound to
// tensors over the arena of each execution context when that context is made (inputs that are
// graph inputs are taken from the call; copies were inserted for views of them). Then the input
// and output specs: an output that is a strided view of a buffer is copied out element by
// element. Last, the first execution context is made (Executable::prepare).
//
// Expects: the memory assignment of the schedule. Guarantees: a steady-state run of the
// Executable allocates nothing but the eager launches' own temporaries, and runs on several
// threads at once (Note [Execution contexts] in runtime/executable.cc).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "compiler/assign_memory.h"
#include "compiler/target.h"
#include "lower/scheduler.h"
#include "runtime/executable.h"

namespace kiln::compiler {

struct BoundExecutable {
  std::shared_ptr<Executable> exe;
  std::vector<TunableLaunch> tunable;  // launch indices of exe
  int loop_kernels = 0, vectorized_kernels = 0, library_launches = 0, eager_launches = 0;
  std::vector<std::string> kernels;    // one line per launch for reports
};

BoundExecutable bind_executable(const Graph& g, const lower::Schedule& s,
                                const MemoryAssignment& m,
                                std::shared_ptr<LibraryKernels> lib, LoopBuild loops,
                                const Target& target, const std::string& cross_arch = "");

}  // namespace kiln::compiler
