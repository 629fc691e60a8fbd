// The scheduler of the compiler (device-free): given how the target runs each node of an
// optimized graph (a library kernel, generated loop code, or the op's eager kernel; decided in
// compiler/choose_kernels.h), groups pointwise nodes, reductions and norms into fused loop
// kernels and orders the steps. See Note [Fusion] in scheduler.cc.
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "lower/loop_ir.h"

namespace kiln::lower {

enum class StepKind : uint8_t { Loop, Extern, Fallback };
const char* step_kind_name(StepKind k);

struct Step {
  StepKind kind = StepKind::Loop;
  int loop = -1;      // Loop: index into Schedule::loops
  int32_t node = -1;  // Extern / Fallback: the graph node
};

// Where a view value's elements are: a materialized base value, an element offset and strides
// over the view's own dims.
struct ViewGeometry {
  ValueId base = kNoValue;
  int64_t offset = 0;
  Dims sizes, strides;
};

struct ScheduleOptions {
  bool fuse = true;  // false: one loop kernel per node (for tests and autotuning)
  // Per node (empty: none), decided by the compiler from its target:
  std::vector<bool> extern_nodes;     // runs as a library kernel (what the library lowered)
  std::vector<bool> gemv_nodes;       // a small linear generated as a reduction (small_linear)
  std::vector<bool> generated_nodes;  // gets loop code (implies loop_expressible)
  // Per value (empty, or an empty entry: row-major): the element strides of a materialized
  // value stored in another order (LibraryKernels::value_strides). Kernels load and store it
  // through them; no view reads such a value.
  std::vector<std::vector<int64_t>> value_strides;
  // Note [grid sums stored channels innermost] (scheduler.cc): a reduction over grid_sample
  // taps whose sums only reductions' epilogues read stores them with the sampled channels
  // innermost (a target's choice: SchedulePolicy::grid_sums_channels_inner).
  bool grid_sums_channels_inner = false;
};

struct Schedule {
  std::vector<Step> steps;            // execution order
  std::vector<LoopKernel> loops;
  std::vector<int32_t> node_step;     // per node; view nodes share their producer's step
  std::vector<bool> unstored;         // per value: lives in registers inside a fused kernel
  std::vector<bool> virtual_view;     // per value: a view read through its base (no memory)
  std::vector<ViewGeometry> views;    // per value (meaningful where virtual_view)
  // Per value: ScheduleOptions::value_strides (empty: row-major), for the steps that are not
  // loop kernels (the runtime's concat copies such values through their strides).
  std::vector<std::vector<int64_t>> value_strides;
  std::deque<Attrs> synth_attrs;      // attributes of expressions the scheduler made up
  // Counts for explain and benchmarks.
  int fused_nodes = 0;  // nodes that share a loop kernel with another node
};

// Whether the loop-nest IR can express node n at all: concrete shapes, one output, and a
// pointwise op, a reduction other than argmax/argmin, a row norm (softmax, log_softmax,
// layer_norm) or a global average pool. A target narrows this down by dtype
// (compiler::Target::generates).
bool loop_expressible(const Graph& g, const Node& n);
// Whether `n` is a linear / fused_linear (with an activation the GEMV epilogue has) that the
// scheduler generates as a reduction over K (a GEMV in registers for batch-1 MLPs): float32 of
// at most `max_macs` multiply-adds, or float16 / bfloat16 of one input row (a GEMV: batch-1
// classifier heads) and at most `max_half_row_macs`; or float32 of one input row, at most
// `max_row_macs`, with an output a multiple of 4 long and K >= kRowLinearMinK (the CPU's GEMV of
// four rows at a time, Note [reduction rows] in targets/cpu/emitter.cc). A target decides the
// thresholds.
inline constexpr int64_t kRowLinearMinK = 64;
bool small_linear(const Graph& g, const Node& n, int64_t max_macs, int64_t max_half_row_macs = 0,
                  int64_t max_row_macs = 0);

// `view_is_copy[v]`: the memory planner materializes view value v (PlanKind::Copy); such view
// nodes become copy kernels. Values consumed by extern/fallback steps must not be virtual
// views unless those steps accept them (the backend inserts copy nodes beforehand).
Schedule schedule(const Graph& g, const std::vector<bool>& view_is_copy,
                  const ScheduleOptions& options);

// Per value: whether the memory planner materializes that view (PlanKind::Copy) — the
// `view_is_copy` argument of schedule(), from a plan without a schedule (the decision does not
// depend on one).
std::vector<bool> planned_view_copies(const Graph& g);

// Geometry of view value v (a node output of a view op) over its materialized base, or false
// when the view cannot be expressed with strides (a reshape of a non-viewable layout).
bool resolve_view(const Graph& g, ValueId v, ViewGeometry* out);
// The same, stopping at views the memory planner materializes (`view_is_copy`, as given to
// schedule()): the geometry the schedule uses for v (Schedule::views).
bool resolve_view(const Graph& g, ValueId v, const std::vector<bool>& view_is_copy,
                  ViewGeometry* out);

std::string schedule_str(const Graph& g, const Schedule& s);

// Per node: whether its output may take over the buffer of its first input — true only for a
// node in a pointwise loop kernel whose output is stored and where every load of that input's
// memory in the kernel has exactly the store's strides and offset (element i is read before
// element i is written, by the same iteration). For PlanOptions::in_place_nodes.
std::vector<bool> in_place_safe_nodes(const Graph& g, const Schedule& s);

}  // namespace kiln::lower
