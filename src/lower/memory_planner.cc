// Note [Memory planning]
// Every NodeOutput of a graph with concrete types gets memory in one arena; inputs, params and
// consts live outside it. Nodes run in graph order, so node indices are the clock:
//   - A value is live from its producing node to its last reader; a graph output to num_nodes
//     (one past the last node: the caller reads it after the run). With a compiler schedule
//     (PlanOptions::node_step) the clock is the kernel step instead of the node index: nodes
//     fused into one kernel share a step, so everything a kernel reads or writes is live
//     together; values that a fused kernel keeps in registers (PlanOptions::unstored) get no
//     memory (Fused).
//   - A buffer is the memory of a group of values: one root that allocates it, plus every value
//     sharing it. A view op (OpDef::is_view) allocates nothing: its outputs join the buffer of
//     its input 0, so that buffer stays live until the last read of any alias. A view of an
//     input/param/const is External (its memory is the caller's).
//   - In place: a pointwise op other than copy (one output) joins the buffer of
//     its input 0 = x when (a) x owns its whole buffer contiguously (Alloc, InPlace or Copy, not
//     a view: a strided or offset view would be overwritten in a different element order),
//     (b) the output has x's dtype and shape and both are contiguous, so out[k] is written only
//     after x[k] is read and nothing else, (c) the buffer dies at this node: no alias of it is
//     read later and it holds no graph output, and (d) no other input of the node is an alias of
//     the same buffer except x itself (add(x, transpose(x)) would read overwritten elements).
//     Since a later alias needs a later read of some member, (c) is decided exactly in one
//     forward pass. This is deliberately conservative: broadcasting first inputs, dtype changes
//     and multi-output ops never run in place.
//   - reshape and flatten are views only when the input's strides allow it (Note [View ops]).
//     IR types are logical, so the planner knows the layout of a buffer's contiguous owner
//     (Alloc, InPlace, Copy) and of views of it, whose geometry it resolves through the views
//     planned so far (lower::resolve_view): a reshape/flatten of a view whose strides allow it
//     (splitting the features of a slice: [197, 768] at row stride 2304 -> [197, 12, 64]) is a
//     view; so is one of a graph input, param or const itself (contiguous as kernels read them:
//     the runtime makes a strided input contiguous first). Of any other value (a view the
//     strides do not allow, a view of a graph input) it is planned as Copy, a fresh buffer, like
//     the contiguous copy eager makes.
//   - Graph outputs never share memory with each other or with memory outside the arena: a view
//     returned as an output whose buffer already holds an output (or is External) is planned as
//     Copy, a fresh buffer the compiler fills with the view's elements. (In-place never merges an
//     output's buffer, whose life reaches num_nodes, by (c).)
//   - Offsets: buffers sorted by size (largest first; ties by first use, then root id) each take
//     the lowest aligned offset that does not overlap a placed buffer whose interval intersects
//     theirs (the "greedy by size" offset calculation). Intervals are inclusive: a node's inputs
//     and outputs are live together, so a non-in-place output never reuses a dying input.
//
// Note [Scratch per step]
// A library kernel may need scratch memory while it runs: a cuDNN engine's or cuBLASLt
// algorithm's workspace, the layout copies a CUDA convolution makes around it, oneDNN's
// scratchpad. That memory used to be one region past the planned values, the size of the
// largest node's need, so the arena was (most values live at once) + (largest scratch) even
// when the two maxima fall at different steps. Each node's scratch is now a buffer of its own
// (PlanOptions::node_scratch), live at that node's step only, placed by the same greedy pass:
// it cannot overlap the node's inputs or outputs (live at that step too) and takes memory that
// is dead there. Greedy placement is a heuristic, so where the old layout (one region past the
// values, the largest scratch's size) comes out smaller, the plan takes that one: the arena
// never grows. resnet50 bf16 at batch 32 on the H100: the stem convolution's heuristic cuDNN
// engine wanted 73.5 MiB of workspace, which sat past 110 MiB of values (an arena of 183.8 MiB);
// planned per step, 131.7 MiB (and 110.3 since default mode keeps engines within 32 MiB: Note
// [Default engines within the cross-build workspace] in targets/cuda/target.cc). resnet50 on the
// CPU: oneDNN's scratchpads, 4.1 MB past a 7.2 MB plan, now 8.0 MB in all.
//
// Note [Input staging in the arena]
// A CUDA executable copies its inputs before the launches run wherever it cannot read them in
// place: every input in graph mode (a CUDA graph reads fixed addresses), host inputs always.
// Those copies used to go to a staging block of their own per execution context, beside the
// arena, for the whole call. An input is usually read by the first kernels only (resnet50:
// the cast of the float32 image to bfloat16), so with PlanOptions::stage_inputs each input's
// staging is a buffer of the plan instead, live from the first step to the input's last read
// (through views of it; to end_step when the input or a view of it is a graph output), and
// the values made after that reuse its memory. As with scratch, the plan never comes out
// larger than the values' layout with the staging after it (what the separate block cost).
// resnet50 bf16 at batch 32 (a 18.4 MiB float32 input) on the H100: see docs/cuda.md. The CPU
// reads its inputs in place and stages nothing.
#include "lower/memory_planner.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "core/error.h"
#include "lower/scheduler.h"
#include "ops/kernel_util.h"

namespace kiln {
namespace {

int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

// Pointwise ops may run in place; copy is excluded: it exists to give a value a fresh buffer.
bool is_elementwise_family(const OpDef& d) {
  return d.has(trait::Pointwise) && d.id != OpId::Copy;
}

// Bytes of a non-view value, checking the shape is concrete.
int64_t value_bytes(const Graph& g, ValueId v, int64_t alignment) {
  const Value& val = g.value(v);
  for (size_t d = 0; d < val.type.shape.size(); ++d) {
    if (!val.type.shape[d].is_concrete())
      throw_error(ErrorKind::NotSupported,
                  fmt::format("memory planner: value '%{}' has symbolic shape {}: dynamic shapes "
                              "are not supported yet",
                              val.name, val.type.str()));
  }
  int64_t n = 1;
  for (size_t d = 0; d < val.type.shape.size(); ++d) n *= val.type.shape[d].value();
  return align_up(n * dtype_size(val.type.dtype), alignment);
}

// The step of every node: options.node_step, checked, or the node index.
std::vector<int32_t> schedule_steps(const Graph& g, const PlanOptions& options) {
  const size_t n = g.nodes.size();
  std::vector<int32_t> step(n);
  if (options.node_step.empty()) {
    for (size_t i = 0; i < n; ++i) step[i] = int32_t(i);
    return step;
  }
  if (options.node_step.size() != n)
    throw_error(ErrorKind::Internal,
                fmt::format("memory planner: schedule has {} steps for {} nodes",
                            options.node_step.size(), n));
  step = options.node_step;
  // Steps must not run a reader before its producer; the last node must have the last step.
  std::vector<int32_t> producer_step(g.values.size(), -1);
  for (size_t i = 0; i < n; ++i) {
    for (ValueId in : g.nodes[i].inputs)
      if (in != kNoValue && producer_step[size_t(in)] > step[i])
        throw_error(ErrorKind::Internal,
                    fmt::format("memory planner: node {} at step {} reads '%{}' made at step {}",
                                i, step[i], g.value(in).name, producer_step[size_t(in)]));
    for (ValueId o : g.nodes[i].outputs) producer_step[size_t(o)] = step[i];
  }
  return step;
}

}  // namespace

const char* plan_kind_name(PlanKind k) {
  switch (k) {
    case PlanKind::NotPlanned: return "not planned";
    case PlanKind::Alloc: return "alloc";
    case PlanKind::InPlace: return "in-place";
    case PlanKind::View: return "view";
    case PlanKind::External: return "external";
    case PlanKind::Copy: return "copy";
    case PlanKind::Fused: return "fused";
  }
  return "?";
}

MemoryPlan plan_memory(const Graph& g, const PlanOptions& options) {
  if (options.alignment <= 0 || (options.alignment & (options.alignment - 1)) != 0)
    fail("memory planner: alignment must be a power of 2, got {}", options.alignment);
  MemoryPlan plan;
  const int32_t n_nodes = int32_t(g.nodes.size());
  plan.num_nodes = n_nodes;
  plan.values.resize(g.values.size());
  const std::vector<int32_t> step = schedule_steps(g, options);
  const int32_t end_step =
      n_nodes == 0 ? 0 : *std::max_element(step.begin(), step.end()) + 1;
  plan.end_step = end_step;
  auto unstored = [&](ValueId v) {
    return size_t(v) < options.unstored.size() && options.unstored[size_t(v)];
  };

  // Own liveness of every value.
  for (int32_t i = 0; i < n_nodes; ++i) {
    for (ValueId o : g.nodes[size_t(i)].outputs) {
      plan.values[size_t(o)].def = step[size_t(i)];
      plan.values[size_t(o)].last_use = step[size_t(i)];
    }
    for (ValueId in : g.nodes[size_t(i)].inputs)
      if (in != kNoValue)
        plan.values[size_t(in)].last_use =
            std::max(plan.values[size_t(in)].last_use, step[size_t(i)]);
  }
  for (ValueId o : g.outputs) {
    if (unstored(o))
      throw_error(ErrorKind::Internal,
                  fmt::format("memory planner: graph output '%{}' is marked unstored",
                              g.value(o).name));
    plan.values[size_t(o)].last_use = end_step;
  }
  std::vector<bool> is_output(g.values.size(), false);
  for (ValueId o : g.outputs) is_output[size_t(o)] = true;

  // Bytes up front: symbolic shapes fail before anything else is decided.
  for (size_t v = 0; v < g.values.size(); ++v)
    if (g.values[v].kind == ValueKind::NodeOutput) {
      plan.values[v].bytes = value_bytes(g, ValueId(v), options.alignment);
      if (v < options.bytes_override.size() && options.bytes_override[v] >= 0)
        plan.values[v].bytes = align_up(options.bytes_override[v], options.alignment);
    }

  std::vector<bool> buffer_has_output;
  std::vector<bool> copied(g.values.size(), false);  // views planned as Copy so far
  auto new_buffer = [&](ValueId root, PlanKind kind) {
    if (kind == PlanKind::Copy) copied[size_t(root)] = true;
    ValuePlan& p = plan.values[size_t(root)];
    p.kind = kind;
    p.buffer = int32_t(plan.buffers.size());
    PlanBuffer b;
    b.root = root;
    b.bytes = p.bytes;
    b.begin = p.def;
    b.end = p.last_use;
    b.members.push_back(root);
    plan.buffers.push_back(std::move(b));
    buffer_has_output.push_back(is_output[size_t(root)]);
  };
  auto join = [&](ValueId v, int32_t buf, PlanKind kind) {
    ValuePlan& p = plan.values[size_t(v)];
    p.kind = kind;
    p.buffer = buf;
    PlanBuffer& b = plan.buffers[size_t(buf)];
    b.end = std::max(b.end, p.last_use);
    b.members.push_back(v);
    if (is_output[size_t(v)]) buffer_has_output[size_t(buf)] = true;
  };

  // Views in row-major order over the start of their owner's buffer: reshape-likes of an owner
  // or of such a view (a reshape of one is a view too, not a copy: PointPillars' view(-1, C)
  // and view back around a batch norm folded away).
  std::vector<bool> row_major(g.values.size(), false);
  auto reshape_like = [](OpId op) {
    return op == OpId::Reshape || op == OpId::Flatten || op == OpId::Squeeze ||
           op == OpId::Unsqueeze;
  };
  for (int32_t i = 0; i < n_nodes; ++i) {
    const Node& node = g.nodes[size_t(i)];
    const OpDef& d = op_def(node.op);
    ValueId x = node.inputs.empty() ? kNoValue : node.inputs[0];
    if (!node.outputs.empty() && unstored(node.outputs[0])) {
      for (ValueId o : node.outputs) {
        plan.values[size_t(o)].kind = PlanKind::Fused;
        plan.values[size_t(o)].bytes = 0;
      }
      continue;
    }
    if (d.is_view && x != kNoValue) {
      const ValuePlan& xp = plan.values[size_t(x)];
      bool external = g.value(x).kind != ValueKind::NodeOutput || xp.kind == PlanKind::External;
      bool owner = !external && (xp.kind == PlanKind::Alloc || xp.kind == PlanKind::InPlace ||
                                 xp.kind == PlanKind::Copy);
      // reshape/flatten are views only when the input's strides allow it (the Note above): known
      // for a buffer's contiguous owner, a row-major view of it, and graph inputs, params and
      // consts, contiguous as the kernels read them (the runtime makes a strided input
      // contiguous first; constants are placed contiguous); resolved for other views.
      const ValueKind xk = g.value(x).kind;
      bool whole_external = xk == ValueKind::Input || xk == ValueKind::Param || xk == ValueKind::Const;
      bool contiguous = owner || whole_external ||
                        (!external && xp.kind == PlanKind::View && row_major[size_t(x)]);
      bool may_copy = (node.op == OpId::Reshape || node.op == OpId::Flatten) && !contiguous;
      if (may_copy && !external && xp.kind == PlanKind::View && node.outputs.size() == 1) {
        // A view of the arena: its geometry through the views planned so far, and whether the
        // reshape splits or merges only dims its strides allow.
        lower::ViewGeometry geo;
        const TensorType& ot = g.type(node.outputs[0]);
        if (is_concrete(ot.shape) && lower::resolve_view(g, x, copied, &geo))
          may_copy = !view_strides(geo.sizes, geo.strides, to_dims(ot.shape)).has_value();
      }
      for (ValueId o : node.outputs) {
        plan.values[size_t(o)].alias_of = x;
        bool shares_output = !external && buffer_has_output[size_t(xp.buffer)];
        if (may_copy || (is_output[size_t(o)] && (external || shares_output))) {
          new_buffer(o, PlanKind::Copy);
        } else if (external) {
          plan.values[size_t(o)].kind = PlanKind::External;
        } else {
          join(o, xp.buffer, PlanKind::View);
          row_major[size_t(o)] = contiguous && reshape_like(node.op);
        }
        if (plan.values[size_t(o)].kind == PlanKind::View ||
            plan.values[size_t(o)].kind == PlanKind::External)
          plan.values[size_t(o)].bytes = 0;
      }
      continue;
    }
    bool in_place = false;
    bool node_ok = options.in_place_nodes.empty() || options.in_place_nodes[size_t(i)];
    if (options.in_place && node_ok && is_elementwise_family(d) && node.outputs.size() == 1 &&
        x != kNoValue && g.value(x).kind == ValueKind::NodeOutput) {
      const ValuePlan& xp = plan.values[size_t(x)];
      const TensorType& xt = g.type(x);
      const TensorType& ot = g.type(node.outputs[0]);
      bool owner = xp.kind == PlanKind::Alloc || xp.kind == PlanKind::InPlace ||
                   xp.kind == PlanKind::Copy;
      in_place = owner && xt.dtype == ot.dtype && xt.shape == ot.shape && xt.is_contiguous() &&
                 ot.is_contiguous() && xt.device == ot.device &&
                 plan.buffers[size_t(xp.buffer)].end == step[size_t(i)] &&
                 !buffer_has_output[size_t(xp.buffer)];
      for (size_t k = 1; in_place && k < node.inputs.size(); ++k) {
        ValueId y = node.inputs[k];
        if (y == kNoValue || y == x || g.value(y).kind != ValueKind::NodeOutput) continue;
        if (plan.values[size_t(y)].buffer == xp.buffer) in_place = false;
      }
      if (in_place) {
        plan.values[size_t(node.outputs[0])].in_place_of = x;
        join(node.outputs[0], xp.buffer, PlanKind::InPlace);
      }
    }
    if (!in_place)
      for (ValueId o : node.outputs) new_buffer(o, PlanKind::Alloc);
  }

  // Scratch buffers (Note [Scratch per step]).
  const int64_t scratch_align = std::max(options.alignment, options.scratch_alignment);
  if ((scratch_align & (scratch_align - 1)) != 0)
    fail("memory planner: scratch alignment must be a power of 2, got {}", scratch_align);
  if (!options.node_scratch.empty() && options.node_scratch.size() != size_t(n_nodes))
    throw_error(ErrorKind::Internal,
                fmt::format("memory planner: scratch given for {} nodes of {}",
                            options.node_scratch.size(), n_nodes));
  plan.scratch_offset.assign(size_t(n_nodes), -1);
  for (int32_t i = 0; i < int32_t(options.node_scratch.size()); ++i) {
    const int64_t need = options.node_scratch[size_t(i)];
    if (need < 0)
      throw_error(ErrorKind::Internal,
                  fmt::format("memory planner: node {} asks for {} bytes of scratch", i, need));
    if (need == 0) continue;
    PlanBuffer b;
    b.scratch_of = i;
    b.bytes = align_up(need, options.alignment);
    b.begin = b.end = step[size_t(i)];
    plan.buffers.push_back(std::move(b));
    buffer_has_output.push_back(false);
  }
  // Staging buffers of the graph inputs (Note [Input staging in the arena]): live from the
  // first step to the last read of the input or of a view of it (views of views included), to
  // end_step where one of them is a graph output.
  if (options.stage_inputs) {
    std::vector<int32_t> input_of(g.values.size(), -1);
    for (size_t k = 0; k < g.inputs.size(); ++k) input_of[size_t(g.inputs[k])] = int32_t(k);
    std::vector<int32_t> last(g.inputs.size(), 0);
    for (size_t v = 0; v < g.values.size(); ++v) {
      const ValuePlan& p = plan.values[v];
      if (p.kind == PlanKind::External && p.alias_of != kNoValue)
        input_of[v] = input_of[size_t(p.alias_of)];  // producers come first: set by then
      if (input_of[v] >= 0)
        last[size_t(input_of[v])] = std::max(last[size_t(input_of[v])], p.last_use);
    }
    for (size_t k = 0; k < g.inputs.size(); ++k) {
      PlanBuffer b;
      b.staging_of = int32_t(k);
      // (At least one alignment unit: an empty input still gets a buffer of its own.)
      b.bytes = std::max(value_bytes(g, g.inputs[k], options.alignment), options.alignment);
      b.begin = 0;
      b.end = last[k];
      plan.buffers.push_back(std::move(b));
      buffer_has_output.push_back(false);
    }
  }
  auto buffer_align = [&](const PlanBuffer& b) {
    return b.scratch_of >= 0 || b.staging_of >= 0 ? scratch_align : options.alignment;
  };

  // Greedy by size.
  std::vector<size_t> order(plan.buffers.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const PlanBuffer &A = plan.buffers[a], &B = plan.buffers[b];
    if (A.bytes != B.bytes) return A.bytes > B.bytes;
    if (A.begin != B.begin) return A.begin < B.begin;
    if (A.root != B.root) return A.root < B.root;
    if (A.staging_of != B.staging_of) return A.staging_of < B.staging_of;
    return A.scratch_of < B.scratch_of;
  });
  // Places the buffers in `order` (scratch and staging too, or not), returning the arena's end.
  auto place = [&](bool with_scratch, bool with_staging) {
    int64_t arena = 0;
    std::vector<size_t> placed;  // kept sorted by offset
    for (size_t bi : order) {
      PlanBuffer& b = plan.buffers[bi];
      if ((b.scratch_of >= 0 && !with_scratch) || (b.staging_of >= 0 && !with_staging)) continue;
      const int64_t align = buffer_align(b);
      int64_t offset = 0;
      if (options.reuse) {
        for (size_t pi : placed) {
          const PlanBuffer& p = plan.buffers[pi];
          if (p.bytes == 0 || p.begin > b.end || b.begin > p.end) continue;  // not live together
          if (offset + b.bytes <= p.offset) break;  // the gap before p fits
          offset = std::max(offset, align_up(p.offset + p.bytes, align));
        }
      } else {
        offset = align_up(arena, align);
      }
      b.offset = offset;
      arena = std::max(arena, offset + b.bytes);
      auto pos = std::upper_bound(placed.begin(), placed.end(), bi, [&](size_t a, size_t c) {
        return plan.buffers[a].offset < plan.buffers[c].offset;
      });
      placed.insert(pos, bi);
    }
    return arena;
  };
  auto offsets = [&] {
    std::vector<int64_t> at(plan.buffers.size());
    for (size_t bi = 0; bi < plan.buffers.size(); ++bi) at[bi] = plan.buffers[bi].offset;
    return at;
  };
  auto restore = [&](const std::vector<int64_t>& at) {
    for (size_t bi = 0; bi < plan.buffers.size(); ++bi) plan.buffers[bi].offset = at[bi];
  };
  // Greedy placement is a heuristic: where one region past the values, sized for the largest
  // scratch, comes out smaller (it can, by a few buffers' worth), that layout is taken.
  // (One region holds every scratch only if no two are live at one step.)
  int64_t largest_scratch = 0;
  std::vector<int32_t> scratch_steps;
  for (const PlanBuffer& b : plan.buffers)
    if (b.scratch_of >= 0) {
      largest_scratch = std::max(largest_scratch, b.bytes);
      scratch_steps.push_back(b.begin);
    }
  std::sort(scratch_steps.begin(), scratch_steps.end());
  const bool one_per_step =
      std::adjacent_find(scratch_steps.begin(), scratch_steps.end()) == scratch_steps.end();
  auto layout = [&](bool with_staging) {
    int64_t arena = place(true, with_staging);
    if (largest_scratch > 0 && options.reuse && one_per_step) {
      const std::vector<int64_t> interleaved = offsets();
      const int64_t region = align_up(place(false, with_staging), scratch_align);
      if (region + largest_scratch < arena) {
        for (PlanBuffer& b : plan.buffers)
          if (b.scratch_of >= 0) b.offset = region;
        arena = region + largest_scratch;
      } else {
        restore(interleaved);
      }
    }
    return arena;
  };
  plan.arena_bytes = layout(true);
  // Likewise, staging placed among the values must not come out larger than the values'
  // layout with every staging buffer after it (what a separate staging block costs).
  int64_t staging_total = 0;
  for (const PlanBuffer& b : plan.buffers)
    if (b.staging_of >= 0) staging_total += align_up(b.bytes, scratch_align);
  if (staging_total > 0 && options.reuse) {
    const std::vector<int64_t> interleaved = offsets();
    int64_t at = align_up(layout(false), scratch_align);
    if (at + staging_total < plan.arena_bytes) {
      for (PlanBuffer& b : plan.buffers)
        if (b.staging_of >= 0) {
          b.offset = at;
          at += align_up(b.bytes, scratch_align);
        }
      plan.arena_bytes = at;
    } else {
      restore(interleaved);
    }
  }
  if (options.stage_inputs) plan.staging_offset.assign(g.inputs.size(), -1);
  for (const PlanBuffer& b : plan.buffers) {
    if (b.scratch_of >= 0) plan.scratch_offset[size_t(b.scratch_of)] = b.offset;
    if (b.staging_of >= 0) plan.staging_offset[size_t(b.staging_of)] = b.offset;
  }
  for (ValuePlan& p : plan.values) {
    if (p.buffer >= 0) p.offset = plan.buffers[size_t(p.buffer)].offset;
    if (p.kind == PlanKind::Alloc || p.kind == PlanKind::InPlace || p.kind == PlanKind::Copy)
      plan.naive_bytes += p.bytes;
  }
  return plan;
}

void verify_memory_plan(const Graph& g, const MemoryPlan& plan, const PlanOptions& options) {
  auto bad = [](std::string msg) {
    throw_error(ErrorKind::Internal, "memory plan: " + std::move(msg));
  };
  auto name = [&](ValueId v) { return "'%" + g.value(v).name + "'"; };
  if (plan.values.size() != g.values.size() || plan.num_nodes != int32_t(g.nodes.size()))
    bad(fmt::format("planned for {} values / {} nodes, graph has {} / {}", plan.values.size(),
                    plan.num_nodes, g.values.size(), g.nodes.size()));
  const std::vector<int32_t> step = schedule_steps(g, options);
  const int32_t end =
      plan.num_nodes == 0 ? 0 : *std::max_element(step.begin(), step.end()) + 1;
  // Liveness recomputed from the graph, independent of the planner's own bookkeeping.
  std::vector<int32_t> def(g.values.size(), -1), last(g.values.size(), -1);
  for (int32_t i = 0; i < plan.num_nodes; ++i) {
    for (ValueId o : g.nodes[size_t(i)].outputs) def[size_t(o)] = last[size_t(o)] = step[size_t(i)];
    for (ValueId in : g.nodes[size_t(i)].inputs)
      if (in != kNoValue) last[size_t(in)] = std::max(last[size_t(in)], step[size_t(i)]);
  }
  for (ValueId o : g.outputs) last[size_t(o)] = end;

  for (size_t v = 0; v < g.values.size(); ++v) {
    const ValuePlan& p = plan.values[v];
    ValueId id = ValueId(v);
    bool node_out = g.values[v].kind == ValueKind::NodeOutput;
    if (!node_out) {
      if (p.kind != PlanKind::NotPlanned) bad(fmt::format("{} is not a node output but is planned", name(id)));
      continue;
    }
    if (p.kind == PlanKind::NotPlanned) bad(fmt::format("{} has no plan", name(id)));
    if (p.kind == PlanKind::Fused) {
      if (v >= options.unstored.size() || !options.unstored[v])
        bad(fmt::format("{} is planned as fused but not marked unstored", name(id)));
      if (p.buffer >= 0) bad(fmt::format("fused {} has an arena buffer", name(id)));
      if (last[v] == end) bad(fmt::format("fused {} is a graph output", name(id)));
      continue;
    }
    const OpDef& d = op_def(g.nodes[size_t(g.values[v].producer)].op);
    bool view_kind = p.kind == PlanKind::View || p.kind == PlanKind::External;
    if ((view_kind || p.kind == PlanKind::Copy) != d.is_view)
      bad(fmt::format("{} is planned as {} but its op '{}' {} a view", name(id),
                      plan_kind_name(p.kind), d.name, d.is_view ? "is" : "is not"));
    if (p.kind == PlanKind::External) {
      if (p.buffer >= 0) bad(fmt::format("external {} has an arena buffer", name(id)));
      continue;
    }
    if (p.buffer < 0 || size_t(p.buffer) >= plan.buffers.size())
      bad(fmt::format("{} has no buffer", name(id)));
    const PlanBuffer& b = plan.buffers[size_t(p.buffer)];
    if (def[v] < b.begin || last[v] > b.end)
      bad(fmt::format("{} is live over [{}, {}] outside its buffer's [{}, {}]", name(id), def[v],
                      last[v], b.begin, b.end));
    if (p.offset != b.offset) bad(fmt::format("{} offset differs from its buffer's", name(id)));
    if (!view_kind) {
      int64_t need = value_bytes(g, id, options.alignment);
      if (v < options.bytes_override.size() && options.bytes_override[v] >= 0)
        need = align_up(options.bytes_override[v], options.alignment);
      if (b.bytes < need)
        bad(fmt::format("{} needs {} bytes, its buffer has {}", name(id), need, b.bytes));
    } else {
      // A view reads through its input's buffer.
      ValueId x = p.alias_of;
      if (x != g.nodes[size_t(g.values[v].producer)].inputs[0] || plan.values[size_t(x)].buffer != p.buffer)
        bad(fmt::format("view {} is not in the buffer of its input", name(id)));
    }
    if (p.kind == PlanKind::InPlace) {
      ValueId x = p.in_place_of;
      if (x != g.nodes[size_t(g.values[v].producer)].inputs[0] || plan.values[size_t(x)].buffer != p.buffer)
        bad(fmt::format("in-place {} does not share the buffer of its first input", name(id)));
      // Every other member of the buffer must be dead by this node.
      for (ValueId m : b.members)
        if (def[size_t(m)] < def[v] && last[size_t(m)] > def[v])
          bad(fmt::format("in-place {} overwrites {}, read later at node {}", name(id), name(m),
                          last[size_t(m)]));
    }
  }
  // Members of one buffer other than in-place chains and views must not overlap in time: the
  // buffer's begin is its root's definition. A node's scratch is live at its step only.
  const int64_t scratch_align = std::max(options.alignment, options.scratch_alignment);
  auto owner = [&](const PlanBuffer& b) {
    if (b.staging_of >= 0 && size_t(b.staging_of) < g.inputs.size())
      return "staging of input " + name(g.inputs[size_t(b.staging_of)]);
    return b.scratch_of >= 0 ? fmt::format("scratch of node {}", b.scratch_of)
                             : "buffer of " + name(b.root);
  };
  // Each input's last read, through views of it (views of views) that live outside the arena.
  std::vector<int32_t> input_of(g.values.size(), -1);
  for (size_t k = 0; k < g.inputs.size(); ++k) input_of[size_t(g.inputs[k])] = int32_t(k);
  std::vector<int32_t> input_last(g.inputs.size(), 0);
  for (size_t v = 0; v < g.values.size(); ++v) {
    const ValuePlan& p = plan.values[v];
    if (g.values[v].kind == ValueKind::NodeOutput && p.kind == PlanKind::External)
      input_of[v] = input_of[size_t(g.nodes[size_t(g.values[v].producer)].inputs[0])];
    if (input_of[v] >= 0)
      input_last[size_t(input_of[v])] = std::max(input_last[size_t(input_of[v])], last[v]);
  }
  if (options.stage_inputs ? plan.staging_offset.size() != g.inputs.size()
                           : !plan.staging_offset.empty())
    bad(fmt::format("{} staging offsets for {} inputs{}", plan.staging_offset.size(),
                    g.inputs.size(), options.stage_inputs ? "" : " not staged"));
  std::vector<int> staging_buffers(g.inputs.size(), 0);
  std::vector<int> scratch_buffers(size_t(plan.num_nodes), 0);
  for (size_t bi = 0; bi < plan.buffers.size(); ++bi) {
    const PlanBuffer& b = plan.buffers[bi];
    const int64_t align =
        b.scratch_of >= 0 || b.staging_of >= 0 ? scratch_align : options.alignment;
    if (b.offset % align != 0 || b.bytes % options.alignment != 0)
      bad(fmt::format("{} is not {}-byte aligned", owner(b), align));
    if (b.offset < 0 || b.offset + b.bytes > plan.arena_bytes)
      bad(fmt::format("{} ends past the arena", owner(b)));
    if (b.staging_of >= 0) {
      const size_t k = size_t(b.staging_of);
      if (!options.stage_inputs || k >= g.inputs.size() || b.root != kNoValue ||
          !b.members.empty() || b.scratch_of >= 0)
        bad(fmt::format("staging buffer {} names no staged input or holds values", bi));
      ++staging_buffers[k];
      const int64_t need = value_bytes(g, g.inputs[k], 1);
      if (b.begin != 0 || b.end < input_last[k])
        bad(fmt::format("{} is live over [{}, {}], the input over [0, {}]", owner(b), b.begin,
                        b.end, input_last[k]));
      if (b.bytes < need)
        bad(fmt::format("{} has {} bytes, the input needs {}", owner(b), b.bytes, need));
      if (plan.staging_offset[k] != b.offset)
        bad(fmt::format("{} is not at the input's recorded staging offset", owner(b)));
      continue;
    }
    if (b.scratch_of >= 0) {
      const size_t i = size_t(b.scratch_of);
      if (i >= size_t(plan.num_nodes) || b.root != kNoValue || !b.members.empty())
        bad(fmt::format("{} names no node or holds values", owner(b)));
      ++scratch_buffers[i];
      const int64_t need = i < options.node_scratch.size() ? options.node_scratch[i] : 0;
      if (b.begin != step[i] || b.end != step[i])
        bad(fmt::format("{} is live over [{}, {}], not only at its step {}", owner(b), b.begin,
                        b.end, step[i]));
      if (b.bytes < need)
        bad(fmt::format("{} has {} bytes, the node needs {}", owner(b), b.bytes, need));
      if (i >= plan.scratch_offset.size() || plan.scratch_offset[i] != b.offset)
        bad(fmt::format("{} is not at the node's recorded scratch offset", owner(b)));
      continue;
    }
    if (b.begin != def[size_t(b.root)])
      bad(fmt::format("buffer of {} starts at {}, not at its definition", name(b.root), b.begin));
  }
  for (size_t k = 0; k < staging_buffers.size(); ++k)
    if (options.stage_inputs && staging_buffers[k] != 1)
      bad(fmt::format("input {} has {} staging buffers", name(g.inputs[k]), staging_buffers[k]));
  for (int32_t i = 0; i < plan.num_nodes; ++i) {
    const int64_t need = size_t(i) < options.node_scratch.size() ? options.node_scratch[size_t(i)] : 0;
    if (scratch_buffers[size_t(i)] != (need > 0 ? 1 : 0))
      bad(fmt::format("node {} needs {} bytes of scratch and has {} scratch buffers", i, need,
                      scratch_buffers[size_t(i)]));
    if (need == 0 && size_t(i) < plan.scratch_offset.size() && plan.scratch_offset[size_t(i)] != -1)
      bad(fmt::format("node {} needs no scratch but has a scratch offset", i));
  }
  // No two buffers live at one node overlap in the arena.
  std::vector<size_t> by_offset(plan.buffers.size());
  std::iota(by_offset.begin(), by_offset.end(), size_t(0));
  std::sort(by_offset.begin(), by_offset.end(),
            [&](size_t a, size_t c) { return plan.buffers[a].offset < plan.buffers[c].offset; });
  for (size_t i = 0; i < by_offset.size(); ++i) {
    const PlanBuffer& a = plan.buffers[by_offset[i]];
    if (a.bytes == 0) continue;
    for (size_t j = i + 1; j < by_offset.size(); ++j) {
      const PlanBuffer& c = plan.buffers[by_offset[j]];
      if (c.offset >= a.offset + a.bytes) break;
      if (c.bytes == 0 || c.begin > a.end || a.begin > c.end) continue;
      bad(fmt::format("{} [{}, {}) live [{}, {}] and {} [{}, {}) live [{}, {}] overlap",
                      owner(a), a.offset, a.offset + a.bytes, a.begin, a.end, owner(c),
                      c.offset, c.offset + c.bytes, c.begin, c.end));
    }
  }
  // Graph outputs: in the arena (if node outputs) and each in its own buffer.
  // A value returned twice is one buffer by nature (the compiler copies the duplicate).
  std::vector<int> outputs_in_buffer(plan.buffers.size(), 0);
  std::vector<bool> seen(g.values.size(), false);
  for (ValueId o : g.outputs) {
    if (g.value(o).kind != ValueKind::NodeOutput || seen[size_t(o)]) continue;
    seen[size_t(o)] = true;
    const ValuePlan& p = plan.values[size_t(o)];
    if (p.kind == PlanKind::External)
      bad(fmt::format("graph output {} aliases memory outside the arena", name(o)));
    if (++outputs_in_buffer[size_t(p.buffer)] > 1)
      bad(fmt::format("graph output {} shares its buffer with another output", name(o)));
  }
}

std::string memory_plan_str(const Graph& g, const MemoryPlan& plan) {
  std::string text = fmt::format("{:<28} {:>12} {:>12}  {:<14} {}\n", "value", "bytes", "offset",
                                 "live", "note");
  for (size_t v = 0; v < g.values.size(); ++v) {
    const ValuePlan& p = plan.values[v];
    if (p.kind == PlanKind::NotPlanned) continue;
    std::string note = plan_kind_name(p.kind);
    if (p.kind == PlanKind::InPlace) note += " of %" + g.value(p.in_place_of).name;
    if (p.alias_of != kNoValue) note += " of %" + g.value(p.alias_of).name;
    if (p.last_use == plan.end_step) note += ", output";
    std::string offset = p.buffer >= 0 ? std::to_string(p.offset) : "-";
    text += fmt::format("{:<28} {:>12} {:>12}  {:<14} {}\n", "%" + g.values[v].name, p.bytes,
                        offset, fmt::format("[{}, {}]", p.def, p.last_use), note);
  }
  for (const PlanBuffer& b : plan.buffers) {
    if (b.scratch_of >= 0)
      text += fmt::format("{:<28} {:>12} {:>12}  {:<14} {}\n", fmt::format("(node {})", b.scratch_of),
                          b.bytes, b.offset, fmt::format("[{}, {}]", b.begin, b.end), "scratch");
    if (b.staging_of >= 0 && size_t(b.staging_of) < g.inputs.size())
      text += fmt::format("{:<28} {:>12} {:>12}  {:<14} {}\n",
                          "%" + g.value(g.inputs[size_t(b.staging_of)]).name, b.bytes, b.offset,
                          fmt::format("[{}, {}]", b.begin, b.end), "input staging");
  }
  double saved = plan.naive_bytes > 0
                     ? 100.0 * double(plan.naive_bytes - plan.arena_bytes) / double(plan.naive_bytes)
                     : 0.0;
  text += fmt::format("arena {} bytes, naive {} bytes ({:.1f}% saved)\n", plan.arena_bytes,
                      plan.naive_bytes, saved);
  return text;
}

}  // namespace kiln
