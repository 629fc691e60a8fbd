// The scheduler of the CPU compiler: decides how each node of an optimized graph runs (a fused
// loop kernel, a oneDNN primitive, or the op's eager kernel) and groups pointwise nodes,
// reductions and norms into fused loop kernels. See Note [Fusion] in scheduler.cc.
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
  // Per node: run as a oneDNN primitive (decided by the caller from what oneDNN lowered).
  std::vector<bool> extern_nodes;
  // linear / fused_linear with at most this many multiply-adds become a generated reduction
  // kernel instead of a oneDNN call (a oneDNN call costs about a microsecond of overhead).
  int64_t small_linear_macs = 1 << 15;
};

struct Schedule {
  std::vector<Step> steps;            // execution order
  std::vector<LoopKernel> loops;
  std::vector<int32_t> node_step;     // per node; view nodes share their producer's step
  std::vector<bool> unstored;         // per value: lives in registers inside a fused kernel
  std::vector<bool> virtual_view;     // per value: a view read through its base (no memory)
  std::vector<ViewGeometry> views;    // per value (meaningful where virtual_view)
  std::deque<Attrs> synth_attrs;      // attributes of expressions the scheduler made up
  // Counts for explain and benchmarks.
  int fused_nodes = 0;  // nodes that share a loop kernel with another node
};

// Which nodes could be generated as loop code at all (op + dtypes); the rest run as extern or
// eager kernels. Exposed for the numerics harness and explain.
bool loop_supported(const Graph& g, const Node& n);
// Whether `n` is a linear/fused_linear small enough to generate (see small_linear_macs).
bool small_linear(const Graph& g, const Node& n, int64_t max_macs);

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

// For `kiln opt --schedule` and IR-text tests: schedules `g` as the CPU compiler would (conv,
// deconv, linear, matmul and pooling as extern steps, without asking oneDNN), plans memory over
// the schedule, and prints the steps, every loop kernel and the memory plan.
std::string describe_schedule(const Graph& g, bool fuse = true);

}  // namespace kiln::lower
