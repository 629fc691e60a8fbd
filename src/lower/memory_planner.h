// The memory planner: places every intermediate buffer of a graph in one arena by liveness.
// See Note [Memory planning] in memory_planner.cc; docs/memory.md has the numbers on the zoo.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln {

struct PlanOptions {
  int64_t alignment = 64;  // every buffer size and offset is a multiple of this (a power of 2)
  bool in_place = true;    // let elementwise ops write over a dying first input
  bool reuse = true;       // false: every buffer gets its own slot (the naive layout)
  // The compiler's schedule (empty: one step per node, in graph order). Node i runs at step
  // node_step[i]; nodes fused into one kernel share a step, and a value is live from the step of
  // its producer to the step of its last reader. Steps must respect dependencies.
  std::vector<int32_t> node_step;
  // Per value (empty: none): computed inside a fused kernel and never stored (planned as Fused).
  std::vector<bool> unstored;
  // Per value (empty: none): bytes a value needs when not its plain size (a oneDNN blocked
  // layout with padded channels); -1 = plain.
  std::vector<int64_t> bytes_override;
  // Per node (empty: all): whether the node may write its output over its first input. The
  // compiler allows it only where the fused kernel reads that buffer at exactly the index it
  // writes (see lower::in_place_safe_nodes).
  std::vector<bool> in_place_nodes;
  // Per node (empty: none): bytes of scratch memory the node uses while it runs and not after
  // (a library kernel's workspace, oneDNN's scratchpad), 0 for none. Each is a buffer of its
  // own, live at the node's step only, so it takes memory that is dead at that step instead of
  // a region beside every value (Note [Scratch per step]).
  std::vector<int64_t> node_scratch;
  // Alignment of those scratch buffers (a power of 2, at least `alignment`): the CUDA
  // libraries want their workspaces on 256-byte boundaries. Staging buffers take it too.
  int64_t scratch_alignment = 256;
  // Give every graph input a staging buffer in the arena, live from the first step to the last
  // read of the input or of a view of it (to end_step when one is a graph output): where the
  // runtime copies an input before the launches run (a CUDA graph's fixed addresses, a host
  // input), so that the copy's memory is reused once the input is dead (Note [Input staging in
  // the arena]).
  bool stage_inputs = false;
};

enum class PlanKind : uint8_t {
  NotPlanned,  // a graph input, param or const: lives outside the arena
  Alloc,       // owns a fresh buffer
  InPlace,     // writes over the buffer of its first input (in_place_of), which dies here
  View,        // aliases the buffer of its input (alias_of) without allocating
  External,    // a view whose buffer is a graph input/param/const: outside the arena
  Copy,        // a view op materialized into its own buffer: a graph output that would
               // share memory with another output or with memory outside the arena, or a
               // reshape/flatten whose input's layout may not allow a view
  Fused,       // computed inside a fused kernel and never stored (PlanOptions::unstored)
};
const char* plan_kind_name(PlanKind k);

struct ValuePlan {
  PlanKind kind = PlanKind::NotPlanned;
  int32_t buffer = -1;          // index into MemoryPlan::buffers (-1 outside the arena)
  int64_t offset = -1;          // byte offset of the buffer in the arena (-1 outside it)
  int64_t bytes = 0;            // aligned bytes this value itself needs (0 for views)
  ValueId in_place_of = kNoValue;
  ValueId alias_of = kNoValue;  // View / External / Copy: the viewed value (the op's input 0)
  int32_t def = -1;             // step of the producing node (its index without a schedule)
  int32_t last_use = -1;        // step of the last reader; end_step for graph outputs
};

// One arena slot: a root value and every value sharing its memory (in-place results, views).
struct PlanBuffer {
  ValueId root = kNoValue;        // kNoValue for a node's scratch
  int32_t scratch_of = -1;        // the node whose scratch this is (PlanOptions::node_scratch)
  int32_t staging_of = -1;        // the graph input (index into Graph::inputs) staged here
  int64_t offset = 0;
  int64_t bytes = 0;
  int32_t begin = 0, end = 0;  // live over node indices [begin, end] (end = num_nodes: output)
  std::vector<ValueId> members;  // root first, in definition order
};

struct MemoryPlan {
  std::vector<ValuePlan> values;  // indexed by ValueId
  std::vector<PlanBuffer> buffers;
  int32_t num_nodes = 0;
  int32_t end_step = 0;  // one past the last step: graph outputs are live until here
  int64_t arena_bytes = 0;
  // Per node: the byte offset of its scratch in the arena; -1 without scratch.
  std::vector<int64_t> scratch_offset;
  // Per graph input (Graph::inputs order): the byte offset of its staging buffer in the arena
  // (PlanOptions::stage_inputs); empty without staging.
  std::vector<int64_t> staging_offset;
  // What allocating every non-view intermediate separately would cost (Alloc + InPlace + Copy).
  int64_t naive_bytes = 0;
};

// Throws NotSupported naming the value for symbolic shapes (until dynamic shapes land).
MemoryPlan plan_memory(const Graph& g, const PlanOptions& options = {});

// Checks the plan against the graph; throws Internal naming the values on the first problem:
// two buffers live at the same node that overlap in the arena, a value used outside its
// buffer's interval, a buffer too small or misaligned or past the arena end, graph outputs
// sharing memory with each other or living outside the arena, an in-place pair whose input
// outlives the node, a node's scratch missing, too small, misaligned or live past its step.
void verify_memory_plan(const Graph& g, const MemoryPlan& plan, const PlanOptions& options = {});

// The table `value  bytes  offset  live [a, b]  note` and the summary line
// `arena N bytes, naive M bytes (X% saved)`.
std::string memory_plan_str(const Graph& g, const MemoryPlan& plan);

}  // namespace kiln
