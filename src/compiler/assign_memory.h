// Phase 5 of the compiler (Note [The compiler]): memory for every value.
//
// Plans the arena over the schedule's steps (lower/memory_planner.h: liveness, in-place where
// the fused kernel reads exactly what it writes, fused intermediates never stored, library
// layouts at their own sizes), verifies the plan, and gives each value a MemRef: slot 0 is the
// arena, then one slot per graph input, then one per parameter/constant, placed where the
// target's kernels read them (Target::place_constant: contiguous, on its device; in a library
// kernel's own layout where LibraryKernels::store_constant says so). Virtual views
// share their base's memory (kernels add the view offset themselves).
//
// Expects: the schedule of `g` and the view decisions it was made with. Guarantees: every value
// a kernel reads or writes has a slot; parameter data in `g` is replaced by the placed tensors
// (eager launches bind them); throws Internal if the planner disagrees with the view decisions.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "compiler/target.h"
#include "lower/memory_planner.h"
#include "lower/scheduler.h"

namespace kiln::compiler {

struct MemoryAssignment {
  MemoryPlan plan;
  std::vector<MemRef> mem;  // per value (slot -1: never read or written by a kernel)
  int num_slots = 1;
  struct Constant {
    int slot = -1;
    Tensor data;         // placed (Target::place_constant), in `layout`
    std::string layout;  // "": as the graph has it; else LibraryKernels::store_constant's
  };
  std::vector<Constant> constants;
  // The slot of each execution context's status record (Note [Device status] in
  // runtime/executable.h): the last slot on devices, -1 on the CPU (whose kernels report through
  // their own records, Note [Indexed loads]).
  MemRef status;
};

MemoryAssignment assign_memory(Graph& g, const lower::Schedule& s,
                               const std::vector<bool>& view_is_copy, const LibraryKernels& lib,
                               const Target& target, bool place_constants = true);

}  // namespace kiln::compiler
