// Note [Fusion]
// The scheduler walks the graph once in topological order and gives every node a step:
//   - view nodes that the memory planner keeps as views are virtual: they have no step of their
//     own (they share their producer's) and every reader folds their geometry into its strides;
//   - extern nodes (oneDNN primitives, chosen by the backend) and nodes the loop code cannot
//     express (gather, concat, attention, integer division, ...) are steps of their own;
//   - every other node is loop code, and joins a fused group when it can, else starts one.
// Joining: a node may only join the most recently created group among the groups producing its
// inputs (its "anchor" group). Every other input then comes from an earlier group, so running
// each group at its creation position keeps the program in dependency order. Within the anchor
// group, an input produced inside the group must be read at the same index it was computed at
// (same shape, no view in between, no broadcast): then it is a register, not a load.
//   - pointwise node -> pointwise group of the same shape;
//                    -> reduce group as epilogue when its shape is the reduction's result shape;
//                    -> norm group as epilogue when its shape is the norm's shape;
//   - reduction / norm node -> a pointwise group of its input's shape (becomes the prologue);
//   - small linear -> a reduction over K with x*w as the prologue and bias / residual /
//     activation as the epilogue (a GEMV in registers for batch-1 MLPs).
// A pointwise node that joins no anchor group joins the latest step instead when that is a
// pointwise group of its shape (horizontal fusion: try_join_latest).
// A value is stored when a node outside its group or a view reads it, or it is a graph output.
// Kernels are then built from the groups (build_kernel): iteration order = kept dims then
// reduced dims, every read mapped to strides on that order, adjacent dims merged where every
// access allows it.
#include "lower/scheduler.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"
#include "ops/dispatch.h"
#include "lower/memory_planner.h"
#include "ops/kernel_util.h"

namespace kiln::lower {

const char* loop_kind_name(LoopKind k) {
  switch (k) {
    case LoopKind::Pointwise: return "pointwise";
    case LoopKind::Reduce: return "reduce";
    case LoopKind::Norm: return "norm";
    case LoopKind::Scatter: return "scatter";
  }
  return "?";
}

const char* step_kind_name(StepKind k) {
  switch (k) {
    case StepKind::Loop: return "loop";
    case StepKind::Extern: return "extern";
    case StepKind::Fallback: return "eager";
  }
  return "?";
}

int64_t LoopKernel::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

namespace {

bool concrete(const TensorType& t) {
  for (size_t i = 0; i < t.shape.size(); ++i)
    if (!t.shape[i].is_concrete()) return false;
  return true;
}
Dims dims_of(const TensorType& t) {
  Dims d;
  d.resize(t.shape.size());
  for (size_t i = 0; i < t.shape.size(); ++i) d[i] = t.shape[i].value();
  return d;
}

bool is_pointwise_op(OpId op) { return op_has(op, trait::Pointwise); }
// The loop IR's Reduce expression has no index result: argmax/argmin are not loop code.
bool is_reduce_op(OpId op) {
  return op_has(op, trait::Reduction) && op != OpId::Argmax && op != OpId::Argmin;
}
bool is_norm_op(OpId op) { return op_has(op, trait::RowNorm); }

// Ops read at computed positions (Note [Indexed loads] in loop_ir.h): one output element each,
// from the index (or grid) at the output's position and the source somewhere else.
bool is_indexed_read(OpId op) {
  return op == OpId::Gather || op == OpId::IndexSelect || op == OpId::Embedding ||
         op == OpId::GridSample;
}

// adaptive_avg_pool2d to 1x1 is a mean over H and W.
bool is_global_avg_pool(const Node& n) {
  if (n.op != OpId::AdaptiveAvgPool2d) return false;
  const Ints& os = n.attrs.get_ints("output_size");
  return os.size() == 2 && os[0] == 1 && os[1] == 1;
}

}  // namespace

bool small_linear(const Graph& g, const Node& n, int64_t max_macs, int64_t max_half_row_macs,
                  int64_t max_row_macs) {
  if (n.op != OpId::Linear && n.op != OpId::FusedLinear) return false;
  if (n.inputs.size() < 2) return false;
  const TensorType& x = g.type(n.inputs[0]);
  const TensorType& w = g.type(n.inputs[1]);
  if (!concrete(x) || !concrete(w) || w.dtype != x.dtype || x.rank() == 0) return false;
  const bool half = x.dtype == DType::Float16 || x.dtype == DType::BFloat16;
  if (half) {
    if (numel(dims_of(x)) != x.shape[x.rank() - 1].value()) return false;  // one row
    max_macs = max_half_row_macs;
  } else if (x.dtype != DType::Float32) {
    return false;
  } else if (const int64_t k = x.shape[x.rank() - 1].value();
             numel(dims_of(x)) == k && k >= kRowLinearMinK && w.shape[0].value() % 4 == 0 && max_row_macs > max_macs) {
    max_macs = max_row_macs;  // one row of float32
  }
  if (n.op == OpId::FusedLinear) {
    const std::string& act = n.attrs.get_string("activation");
    if (act != "none" && act != "relu" && act != "gelu" && act != "gelu_tanh" && act != "silu" &&
        act != "sigmoid" && act != "tanh")
      return false;
  }
  int64_t macs = 1;
  for (size_t i = 0; i < x.shape.size(); ++i) macs *= x.shape[i].value();
  macs *= w.shape[0].value();
  return macs <= max_macs;
}

bool loop_expressible(const Graph& g, const Node& n) {
  for (ValueId o : n.outputs)
    if (!concrete(g.type(o))) return false;
  for (ValueId in : n.inputs)
    if (in != kNoValue && !concrete(g.type(in))) return false;
  if (n.outputs.size() != 1) return false;
  return is_pointwise_op(n.op) || is_reduce_op(n.op) || is_norm_op(n.op) ||
         is_global_avg_pool(n) || is_indexed_read(n.op) || n.op == OpId::ScatterAdd;
}

namespace {

// Applies view node n (output `index`) to the geometry of its input.
bool apply_view(const Graph& g, const Node& n, int index, const ViewGeometry& in,
                ViewGeometry* out) {
  const OpDef& d = op_def(n.op);
  ValueId v = n.outputs[size_t(index)];
  if (!concrete(g.type(v))) return false;
  Dims new_sizes = dims_of(g.type(v));
  if ((n.op == OpId::Reshape || n.op == OpId::Flatten) &&
      !view_strides(in.sizes, in.strides, new_sizes))
    return false;
  // Run the op's own view kernel on a tensor with the input geometry over a placeholder storage:
  // view kernels only compute sizes, strides and offsets (reshape's copy path is excluded above).
  const TensorType& bt = g.type(in.base);
  int64_t base_numel = numel(dims_of(bt));
  Tensor blob = Tensor::from_blob(reinterpret_cast<void*>(uintptr_t(4096)),
                                  Dims{std::max<int64_t>(base_numel, 1)}, bt.dtype);
  Tensor t = blob.as_strided(in.sizes, in.strides, in.offset);
  std::vector<TensorType> out_types;
  for (ValueId o : n.outputs) out_types.push_back(g.type(o));
  KernelFn k = d.eager_cpu ? d.eager_cpu : d.reference;
  TensorList outs = run_kernel(d, k, std::span<const Tensor>(&t, 1), n.attrs, out_types);
  const Tensor& r = outs[size_t(index)];
  out->base = in.base;
  out->offset = r.offset();
  out->sizes = r.sizes();
  out->strides = r.strides();
  return true;
}

// `stored`: per value, the strides of a materialized value stored in another order
// (ScheduleOptions::value_strides; null or empty entries: row-major).
bool resolve_impl(const Graph& g, ValueId v, const std::vector<bool>* materialized,
                  ViewGeometry* out, const std::vector<std::vector<int64_t>>* stored = nullptr) {
  const Value& val = g.value(v);
  bool is_view_out = val.kind == ValueKind::NodeOutput &&
                     op_def(g.nodes[size_t(val.producer)].op).is_view &&
                     !(materialized && (*materialized)[size_t(v)]);
  if (!is_view_out) {
    if (!concrete(val.type)) return false;
    out->base = v;
    out->offset = 0;
    out->sizes = dims_of(val.type);
    out->strides = contiguous_strides(out->sizes);
    if (stored && size_t(v) < stored->size() && !(*stored)[size_t(v)].empty()) {
      const std::vector<int64_t>& st = (*stored)[size_t(v)];
      if (st.size() != out->sizes.size()) return false;
      out->strides = Dims(st.begin(), st.end());
    }
    return true;
  }
  const Node& n = g.nodes[size_t(val.producer)];
  ViewGeometry in;
  if (!resolve_impl(g, n.inputs[0], materialized, &in, stored)) return false;
  return apply_view(g, n, val.output_index, in, out);
}

}  // namespace

bool resolve_view(const Graph& g, ValueId v, ViewGeometry* out) {
  return resolve_impl(g, v, nullptr, out);
}

bool resolve_view(const Graph& g, ValueId v, const std::vector<bool>& view_is_copy,
                  ViewGeometry* out) {
  return resolve_impl(g, v, &view_is_copy, out);
}

// The message of an index check: "<op> '<node>': index <value> is out of range for <what>".
IndexCheck index_check(int32_t node, const Node& n, const std::string& what, int64_t size) {
  IndexCheck c;
  c.node = node;
  c.message_prefix = fmt::format("{} '{}': index ", op_def(n.op).name, n.name);
  c.message_suffix = size == 0 ? fmt::format(" is out of range: {} is empty", what)
                               : fmt::format(" is out of range for {} of size {} (valid range "
                                             "[{}, {}])", what, size, -size, size - 1);
  return c;
}

namespace {

enum class NodeClass : uint8_t { View, Pointwise, ViewCopy, Reduce, Norm, SmallLinear, Indexed,
                                 Scatter, Extern, Fallback };

struct Group {
  LoopKind kind = LoopKind::Pointwise;
  std::vector<int32_t> nodes;
  Dims full;     // shape of Full-level values (the reduction/norm input; the pointwise shape)
  Dims kept;     // Reduce: the result's shape
  int32_t anchor = -1;
  bool closed = false;  // a copy of a view: nothing joins it
  int step = -1;
};

class Scheduler {
 public:
  Scheduler(const Graph& g, const std::vector<bool>& view_is_copy, const ScheduleOptions& o)
      : g_(g), view_is_copy_(view_is_copy), opt_(o) {}

  Schedule run();

 private:
  NodeClass classify(int32_t i) const;
  // The step that produces the memory or register v is read from (-1: outside the program).
  int source_step(ValueId v) const;
  bool try_join(int32_t i, NodeClass c);
  bool try_join_latest(int32_t i, NodeClass c);
  // Whether every input k of node i (first <= k <= last) read from `step`, which runs group
  // gi, is a register of that group at level `want` and of `shape` (read at the index it was
  // computed at); inputs from other steps are loads, and inputs outside [first, last] must not
  // come from `step` at all.
  bool registers_of(int32_t i, int step, int gi, Level want, const Dims& shape, size_t first,
                    size_t last) const;
  int new_group(int32_t i, NodeClass c);
  void build_kernel(const Group& gr, LoopKernel* k);
  void build_scatter(const Group& gr, LoopKernel* k);
  // Where v's elements are: a stored value's own strides (ScheduleOptions::value_strides, else
  // row-major), a view's composed over its base.
  ViewGeometry geometry(ValueId v) const;
  // Note [grid sums stored channels innermost]: sets their strides; whether any changed.
  bool choose_grid_sum_layouts();

  const Graph& g_;
  const std::vector<bool>& view_is_copy_;
  const ScheduleOptions& opt_;
  Schedule s_;
  std::vector<NodeClass> cls_;
  std::vector<int> node_group_;   // per node: loop group index or -1
  std::vector<Level> level_;      // per value produced in a group
  std::vector<Group> groups_;
  std::vector<int> step_group_;   // per step: group index or -1
};

NodeClass Scheduler::classify(int32_t i) const {
  const Node& n = g_.nodes[size_t(i)];
  const OpDef& d = op_def(n.op);
  if (d.is_view) {
    bool copy = !n.outputs.empty() && view_is_copy_[size_t(n.outputs[0])];
    if (!copy) return NodeClass::View;
    return n.outputs.size() == 1 && concrete(g_.type(n.outputs[0])) ? NodeClass::ViewCopy
                                                                      : NodeClass::Fallback;
  }
  auto flag = [&](const std::vector<bool>& v) { return size_t(i) < v.size() && v[size_t(i)]; };
  if (flag(opt_.gemv_nodes)) return NodeClass::SmallLinear;
  if (flag(opt_.extern_nodes)) return NodeClass::Extern;
  if (!flag(opt_.generated_nodes) || !loop_expressible(g_, n)) return NodeClass::Fallback;
  if (is_pointwise_op(n.op)) return NodeClass::Pointwise;
  if (is_reduce_op(n.op) || is_global_avg_pool(n)) return NodeClass::Reduce;
  if (is_norm_op(n.op)) return NodeClass::Norm;
  if (is_indexed_read(n.op)) return NodeClass::Indexed;
  if (n.op == OpId::ScatterAdd) return NodeClass::Scatter;
  return NodeClass::Fallback;
}

int Scheduler::source_step(ValueId v) const {
  const Value& val = g_.value(v);
  if (val.kind != ValueKind::NodeOutput) return -1;
  if (s_.virtual_view[size_t(v)]) {
    ValueId b = s_.views[size_t(v)].base;
    return b == v ? -1 : source_step(b);
  }
  return s_.node_step[size_t(val.producer)];
}

int Scheduler::new_group(int32_t i, NodeClass c) {
  const Node& n = g_.nodes[size_t(i)];
  Group gr;
  gr.nodes.push_back(i);
  ValueId out = n.outputs[0];
  switch (c) {
    case NodeClass::Pointwise:
    case NodeClass::Indexed:
      gr.kind = LoopKind::Pointwise;
      gr.full = dims_of(g_.type(out));
      break;
    case NodeClass::Scatter:
      gr.kind = LoopKind::Scatter;
      gr.closed = true;
      gr.full = dims_of(g_.type(n.inputs[1]));
      gr.anchor = i;
      break;
    case NodeClass::ViewCopy: {
      gr.kind = LoopKind::Pointwise;
      gr.closed = true;
      bool rs = n.op == OpId::Reshape || n.op == OpId::Flatten;
      gr.full = dims_of(g_.type(rs ? n.inputs[0] : out));
      break;
    }
    case NodeClass::Reduce:
      gr.kind = LoopKind::Reduce;
      gr.full = dims_of(g_.type(n.inputs[0]));
      gr.kept = dims_of(g_.type(out));
      gr.anchor = i;
      break;
    case NodeClass::SmallLinear: {
      gr.kind = LoopKind::Reduce;
      gr.kept = dims_of(g_.type(out));
      gr.full = gr.kept;
      gr.full.push_back(g_.type(n.inputs[0]).shape[g_.type(n.inputs[0]).rank() - 1].value());
      gr.anchor = i;
      break;
    }
    case NodeClass::Norm:
      gr.kind = LoopKind::Norm;
      gr.full = dims_of(g_.type(out));
      gr.anchor = i;
      break;
    default: KILN_ASSERT(false);
  }
  int gi = int(groups_.size());
  gr.step = int(s_.steps.size());
  groups_.push_back(std::move(gr));
  s_.steps.push_back({StepKind::Loop, -1, -1});
  step_group_.push_back(gi);
  node_group_[size_t(i)] = gi;
  s_.node_step[size_t(i)] = groups_[size_t(gi)].step;
  level_[size_t(out)] = (c == NodeClass::Reduce || c == NodeClass::SmallLinear) ? Level::Kept
                                                                                 : Level::Full;
  return gi;
}

bool Scheduler::registers_of(int32_t i, int step, int gi, Level want, const Dims& shape,
                             size_t first, size_t last) const {
  const Node& n = g_.nodes[size_t(i)];
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    ValueId v = n.inputs[k];
    if (v == kNoValue || source_step(v) != step) continue;
    if (k < first || k > last) return false;
    const Value& val = g_.value(v);
    if (s_.virtual_view[size_t(v)] || val.kind != ValueKind::NodeOutput) return false;
    if (node_group_[size_t(val.producer)] != gi) return false;
    if (level_[size_t(v)] != want || dims_of(val.type) != shape) return false;
  }
  return true;
}

bool Scheduler::try_join(int32_t i, NodeClass c) {
  if (!opt_.fuse) return false;
  const Node& n = g_.nodes[size_t(i)];
  if (c == NodeClass::ViewCopy || c == NodeClass::SmallLinear || c == NodeClass::Scatter)
    return false;
  int anchor = -1;
  for (ValueId v : n.inputs)
    if (v != kNoValue) anchor = std::max(anchor, source_step(v));
  if (anchor < 0 || step_group_[size_t(anchor)] < 0) return false;
  int gi = step_group_[size_t(anchor)];
  Group& gr = groups_[size_t(gi)];
  if (gr.closed) return false;
  Dims out = dims_of(g_.type(n.outputs[0]));
  // Inputs sourced from the group must be registers read at the same index.
  auto inputs_ok = [&](Level want, const Dims& shape, size_t first, size_t last) {
    return registers_of(i, anchor, gi, want, shape, first, last);
  };
  bool ok = false;
  Level lv = Level::Full;
  if (c == NodeClass::Pointwise) {
    if (gr.kind == LoopKind::Pointwise || gr.kind == LoopKind::Norm) {
      ok = out == gr.full && inputs_ok(Level::Full, gr.full, 0, n.inputs.size());
    } else {  // Reduce: epilogue at the result's shape
      ok = out == gr.kept && inputs_ok(Level::Kept, gr.kept, 0, n.inputs.size());
      lv = Level::Kept;
    }
  } else if (c == NodeClass::Indexed && gr.kind == LoopKind::Pointwise) {
    // The source (input 0) is read at computed positions: never from this group, whose
    // stores are still being written. The index may be a register when it has the output's
    // shape (gather); index_select's, embedding's and grid_sample's are loads from memory in
    // the emitted kernel, so those must not come from this group either (an index_select of a
    // 1-d x has the index's shape, and read the index before this group stored it: the ONNX
    // NegativeLogLikelihoodLoss cases with ignore_index came out wrong).
    const size_t last = n.op == OpId::Gather ? 1 : 0;
    ok = out == gr.full && inputs_ok(Level::Full, gr.full, 1, last);
  } else if ((c == NodeClass::Reduce || c == NodeClass::Norm) && gr.kind == LoopKind::Pointwise) {
    Dims in = dims_of(g_.type(n.inputs[0]));
    ok = in == gr.full && inputs_ok(Level::Full, gr.full, 0, 0);
    if (ok) {
      gr.kind = c == NodeClass::Reduce ? LoopKind::Reduce : LoopKind::Norm;
      gr.anchor = i;
      if (c == NodeClass::Reduce) {
        gr.kept = out;
        lv = Level::Kept;
      }
    }
  }
  if (!ok) return false;
  gr.nodes.push_back(i);
  node_group_[size_t(i)] = gi;
  s_.node_step[size_t(i)] = gr.step;
  level_[size_t(n.outputs[0])] = lv;
  return true;
}

// Horizontal fusion: a pointwise node that joins no producer's group joins the program's latest
// step when that is a pointwise group of the node's shape. Every input of the node then comes
// from that step or an earlier one, so the group's position still keeps dependency order; an
// input from the group itself must be a register at the same index, as in try_join. Sibling
// chains over one linear's output (an LSTM step's four gates: each a slice of the gates, a bias
// and an activation, then the cell update reading all four) become one kernel instead of one
// per gate, each storing its result for the next to load.
bool Scheduler::try_join_latest(int32_t i, NodeClass c) {
  if (!opt_.fuse || c != NodeClass::Pointwise || s_.steps.empty()) return false;
  const int last = int(s_.steps.size()) - 1;
  const int gi = step_group_[size_t(last)];
  if (gi < 0) return false;
  Group& gr = groups_[size_t(gi)];
  if (gr.closed || gr.kind != LoopKind::Pointwise) return false;
  const Node& n = g_.nodes[size_t(i)];
  if (dims_of(g_.type(n.outputs[0])) != gr.full ||
      !registers_of(i, last, gi, Level::Full, gr.full, 0, n.inputs.size()))
    return false;
  gr.nodes.push_back(i);
  node_group_[size_t(i)] = gi;
  s_.node_step[size_t(i)] = gr.step;
  level_[size_t(n.outputs[0])] = Level::Full;
  return true;
}

Schedule Scheduler::run() {
  const size_t nn = g_.nodes.size(), nv = g_.values.size();
  s_.node_step.assign(nn, 0);
  s_.unstored.assign(nv, false);
  s_.virtual_view.assign(nv, false);
  s_.views.resize(nv);
  s_.value_strides = opt_.value_strides;
  s_.value_strides.resize(nv);
  cls_.resize(nn);
  node_group_.assign(nn, -1);
  level_.assign(nv, Level::Full);
  for (int32_t i = 0; i < int32_t(nn); ++i) {
    const Node& n = g_.nodes[size_t(i)];
    NodeClass c = classify(i);
    cls_[size_t(i)] = c;
    switch (c) {
      case NodeClass::View: {
        for (ValueId o : n.outputs) {
          ViewGeometry geo;
          if (!resolve_impl(g_, o, &view_is_copy_, &geo, &s_.value_strides))
            throw_error(ErrorKind::Internal,
                        fmt::format("scheduler: view '%{}' (node '{}') is planned as a view but "
                                    "has no strided geometry", g_.value(o).name, n.name));
          s_.virtual_view[size_t(o)] = true;
          s_.views[size_t(o)] = geo;
        }
        int st = n.inputs.empty() ? -1 : source_step(n.inputs[0]);
        s_.node_step[size_t(i)] = std::max(st, 0);
        break;
      }
      case NodeClass::Extern:
      case NodeClass::Fallback:
        s_.node_step[size_t(i)] = int(s_.steps.size());
        s_.steps.push_back({c == NodeClass::Extern ? StepKind::Extern : StepKind::Fallback, -1, i});
        step_group_.push_back(-1);
        break;
      default:
        if (!try_join(i, c) && !try_join_latest(i, c)) new_group(i, c);
        break;
    }
  }
  // Stored values: read outside their group (or by a view), or graph outputs.
  std::vector<bool> stored(nv, false);
  for (ValueId o : g_.outputs) stored[size_t(o)] = true;
  for (size_t i = 0; i < nn; ++i)
    for (ValueId v : g_.nodes[i].inputs) {
      if (v == kNoValue || g_.value(v).kind != ValueKind::NodeOutput) continue;
      int32_t p = g_.value(v).producer;
      if (node_group_[size_t(p)] < 0 || node_group_[size_t(p)] != node_group_[i]) stored[size_t(v)] = true;
    }
  for (size_t i = 0; i < nn; ++i)
    if (node_group_[i] >= 0)
      for (ValueId o : g_.nodes[i].outputs) s_.unstored[size_t(o)] = !stored[size_t(o)];
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    LoopKernel k;
    build_kernel(groups_[gi], &k);
    s_.steps[size_t(groups_[gi].step)].loop = int(s_.loops.size());
    if (groups_[gi].nodes.size() > 1) s_.fused_nodes += int(groups_[gi].nodes.size());
    s_.loops.push_back(std::move(k));
  }
  // Note [grid sums stored channels innermost]: the kernels again, with those values' strides.
  if (opt_.grid_sums_channels_inner && choose_grid_sum_layouts())
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      LoopKernel k;
      build_kernel(groups_[gi], &k);
      s_.loops[size_t(s_.steps[size_t(groups_[gi].step)].loop)] = std::move(k);
    }
  return std::move(s_);
}

// Note [grid sums stored channels innermost]
// msda's sampling kernels (a reduction over the points of grid_sample taps, weighted: the Reduce
// form of Note [grid_sample tap tables] in targets/cpu/emitter.cc) sum a tile of queries for
// every channel, the channels being the dim the sampled source is contiguous along. Their
// results are [head, channel, query] as the model writes them, so the tile's sums were stored
// one 16-query run per channel, 2,500 floats apart, and the next level's kernel read them back
// the same way as the running sum: perf put a quarter of the kernels' time in those stores and
// loads, and a copy of such a kernel whose sums were stored contiguously ran 1.02 -> 0.69 ms.
// So where such a kernel stores a sum that nothing but reductions' epilogues read (the next
// level's running sum: not a graph output, never read through a view, by a library or by an
// eager kernel), the value is stored with that channel dim innermost and its other dims in
// their order (the memory order, not the value's shape, changes: every kernel that reads or
// writes it goes through these strides, as with the CPU's channels-last values). The kernels
// are then built again. The last level's sum, which the model transposes for its output
// projection, is read through a view and keeps row-major order.
bool Scheduler::choose_grid_sum_layouts() {
  const size_t nv = g_.values.size();
  std::vector<bool> output(nv, false);
  for (ValueId o : g_.outputs) output[size_t(o)] = true;
  // Whether every reader of v is a node of a Reduce group reading it in the epilogue.
  auto epilogue_reads_only = [&](ValueId v) {
    bool any = false;
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      const Node& n = g_.nodes[i];
      if (std::find(n.inputs.begin(), n.inputs.end(), v) == n.inputs.end()) continue;
      const int gi = node_group_[i];
      if (gi < 0 || groups_[size_t(gi)].kind != LoopKind::Reduce || n.outputs.size() != 1 ||
          level_[size_t(n.outputs[0])] != Level::Kept || op_def(n.op).is_view)
        return false;
      any = true;
    }
    return any;
  };
  bool changed = false;
  for (const LoopKernel& k : s_.loops) {
    if (k.kind != LoopKind::Reduce) continue;
    const int kept = k.kept_dims();
    // The grid_sample of the Reduce form, and the kept dim its source is contiguous along with
    // coordinates that do not walk it.
    int d = -1;
    for (const LoopExpr& e : k.exprs) {
      if (e.kind != LoopExpr::Kind::Indexed || e.op != OpId::GridSample || e.level != Level::Full)
        continue;
      for (int t = 0; t < kept && d < 0; ++t) {
        bool fixed = k.loads[size_t(e.load)].strides[size_t(t)] == 1;
        for (int a : e.args)
          fixed = fixed && a >= 0 && k.exprs[size_t(a)].kind == LoopExpr::Kind::Load &&
                  k.loads[size_t(k.exprs[size_t(a)].load)].strides[size_t(t)] == 0;
        if (fixed) d = t;
      }
    }
    if (d < 0) continue;
    for (const LoopStore& st : k.stores) {
      const ValueId v = st.access.value;
      if (k.exprs[size_t(st.expr)].level != Level::Kept || st.access.offset != 0 ||
          output[size_t(v)] || !s_.value_strides[size_t(v)].empty() || !epilogue_reads_only(v))
        continue;
      const Value& val = g_.value(v);
      if (val.kind != ValueKind::NodeOutput || !concrete(val.type)) continue;
      // The value's dim that iteration dim d walks: the one with its stride and size.
      const Dims dims = dims_of(val.type), cs = contiguous_strides(dims);
      int jd = -1, matches = 0;
      for (size_t j = 0; j < dims.size(); ++j)
        if (dims[j] > 1 && cs[j] == st.access.strides[size_t(d)] && dims[j] == k.sizes[size_t(d)]) {
          jd = int(j);
          ++matches;
        }
      if (matches != 1 || jd == int(dims.size()) - 1) continue;
      // Strides for the order: every other dim as it was, then jd.
      std::vector<int64_t> strides(dims.size());
      int64_t step = dims[size_t(jd)];
      strides[size_t(jd)] = 1;
      for (size_t j = dims.size(); j-- > 0;)
        if (int(j) != jd) {
          strides[j] = step;
          step *= dims[j];
        }
      s_.value_strides[size_t(v)] = std::move(strides);
      changed = true;
    }
  }
  return changed;
}

// ---- kernel construction -----------------------------------------------------------------------

// Maps the dims of a value of shape `vs` with strides `vst` (right-aligned against `ref`, size-1
// dims broadcast) onto the iteration order: iter_dim_of_ref[p] is the iteration dim of ref dim p
// (-1 when it has none).
std::vector<int64_t> map_strides(const Dims& vs, const Dims& vst, const Dims& ref,
                                 const std::vector<int>& iter_of_ref, size_t n_iter) {
  std::vector<int64_t> st(n_iter, 0);
  int off = int(ref.size()) - int(vs.size());
  for (int j = 0; j < int(vs.size()); ++j) {
    int p = j + off;
    if (p < 0) continue;  // leading size-1 dims of a higher-rank operand (checked by inference)
    if (vs[size_t(j)] == 1 && ref[size_t(p)] != 1) continue;
    int t = iter_of_ref[size_t(p)];
    if (t >= 0) st[size_t(t)] = vst[size_t(j)];
  }
  return st;
}

ViewGeometry Scheduler::geometry(ValueId v) const {
  ViewGeometry geo;
  if (s_.virtual_view[size_t(v)]) {
    geo = s_.views[size_t(v)];
  } else {
    // A value stored in another order has its strides; a view of one has them composed.
    bool ok = resolve_impl(g_, v, &view_is_copy_, &geo, &s_.value_strides);
    KILN_ASSERT(ok);
  }
  return geo;
}

int normalized_dim(const Node& n, int rank) {
  int64_t d = n.attrs.get_int("dim");
  return int(d < 0 ? d + rank : d);
}

void Scheduler::build_kernel(const Group& gr, LoopKernel* k) {
  if (gr.kind == LoopKind::Scatter) return build_scatter(gr, k);
  k->kind = gr.kind;
  k->nodes = gr.nodes;
  const size_t rank = gr.full.size();
  // Iteration order: kept dims of `full`, then reduced dims.
  std::vector<int> rdims;
  bool keepdim = true;
  const Node* an = gr.anchor >= 0 ? &g_.nodes[size_t(gr.anchor)] : nullptr;
  bool linear = an && (an->op == OpId::Linear || an->op == OpId::FusedLinear);
  if (an && linear) {
    rdims = {int(rank) - 1};
    keepdim = false;
  } else if (an && is_reduce_op(an->op)) {
    const Ints& dims = an->attrs.get_ints("dims");
    if (dims.empty())
      for (int d = 0; d < int(rank); ++d) rdims.push_back(d);
    for (int64_t d : dims) rdims.push_back(int(d < 0 ? d + int64_t(rank) : d));
    keepdim = an->attrs.get_bool("keepdim");
  } else if (an && is_global_avg_pool(*an)) {
    rdims = {2, 3};
  } else if (an && (an->op == OpId::Softmax || an->op == OpId::LogSoftmax)) {
    int64_t d = an->attrs.get_int("dim");
    rdims = {int(d < 0 ? d + int64_t(rank) : d)};
  } else if (an && an->op == OpId::LayerNorm) {
    size_t m = an->attrs.get_ints("normalized_shape").size();
    for (size_t d = rank - m; d < rank; ++d) rdims.push_back(int(d));
  }
  std::sort(rdims.begin(), rdims.end());
  rdims.erase(std::unique(rdims.begin(), rdims.end()), rdims.end());
  std::vector<int> perm, iter_of_full(rank, -1);
  for (int d = 0; d < int(rank); ++d)
    if (!std::binary_search(rdims.begin(), rdims.end(), d)) perm.push_back(d);
  for (int d : rdims) perm.push_back(d);
  for (size_t t = 0; t < perm.size(); ++t) iter_of_full[size_t(perm[t])] = int(t);
  k->reduce_dims = int(rdims.size());
  for (int d : perm) k->sizes.push_back(gr.full[size_t(d)]);
  const size_t n_iter = perm.size();
  // Kept-level values have the result shape; its dims map onto full dims.
  std::vector<int> iter_of_kept(gr.kept.size(), -1);
  if (gr.kind == LoopKind::Reduce) {
    if (keepdim) {
      // The result's size-1 dims at reduced positions are never iterated.
      for (size_t j = 0; j < gr.kept.size(); ++j)
        iter_of_kept[j] = std::binary_search(rdims.begin(), rdims.end(), int(j)) ? -1 : iter_of_full[j];
    } else {
      size_t j = 0;
      for (int d = 0; d < int(rank) && j < gr.kept.size(); ++d)
        if (!std::binary_search(rdims.begin(), rdims.end(), d)) iter_of_kept[j++] = iter_of_full[size_t(d)];
    }
  }

  std::vector<int> expr_of(g_.values.size(), -1);
  auto add_expr = [&](LoopExpr e) {
    k->exprs.push_back(std::move(e));
    return int(k->exprs.size()) - 1;
  };
  auto add_load = [&](const Access& a, Level lv) {
    for (size_t li = 0; li < k->loads.size(); ++li) {
      const Access& b = k->loads[li];
      if (b.value == a.value && b.offset == a.offset && b.strides == a.strides && b.dtype == a.dtype)
        for (size_t e = 0; e < k->exprs.size(); ++e)
          if (k->exprs[e].kind == LoopExpr::Kind::Load && k->exprs[e].load == int(li) &&
              k->exprs[e].level == lv)
            return int(e);
    }
    k->loads.push_back(a);
    LoopExpr e;
    e.kind = LoopExpr::Kind::Load;
    e.level = lv;
    e.dtype = a.dtype;
    e.load = int(k->loads.size()) - 1;
    return add_expr(e);
  };
  // A read of v at level lv.
  auto read = [&](ValueId v, Level lv) -> int {
    if (expr_of[size_t(v)] >= 0) return expr_of[size_t(v)];
    const Value& val = g_.value(v);
    if (val.kind == ValueKind::Const && val.data.defined() && val.data.numel() == 1 &&
        val.type.rank() <= int(lv == Level::Full ? rank : gr.kept.size())) {
      LoopExpr e;
      e.kind = LoopExpr::Kind::Scalar;
      e.level = lv;
      e.dtype = val.type.dtype;
      // A CUDA graph's constants live on the device: read the one element on the host.
      Tensor host = val.data.device().is_cpu() ? val.data : val.data.to(Device::cpu());
      e.scalar = load_f64(host.raw_data(), host.dtype());
      return add_expr(e);
    }
    ViewGeometry geo = geometry(v);
    Access a;
    a.value = geo.base;
    a.offset = geo.offset;
    a.dtype = val.type.dtype;
    a.strides = lv == Level::Full ? map_strides(geo.sizes, geo.strides, gr.full, iter_of_full, n_iter)
                                  : map_strides(geo.sizes, geo.strides, gr.kept, iter_of_kept, n_iter);
    return add_load(a, lv);
  };
  auto synth = [&](Attrs a) -> const Attrs* {
    s_.synth_attrs.push_back(std::move(a));
    return &s_.synth_attrs.back();
  };
  auto op_expr = [&](OpId op, const Attrs* attrs, std::vector<int> args, DType dt, Level lv,
                     int32_t node) {
    LoopExpr e;
    e.kind = LoopExpr::Kind::Op;
    e.op = op;
    e.attrs = attrs;
    e.args = std::move(args);
    e.dtype = dt;
    e.level = lv;
    e.node = node;
    return add_expr(e);
  };

  for (int32_t ni : gr.nodes) {
    const Node& n = g_.nodes[size_t(ni)];
    ValueId out = n.outputs[0];
    DType od = g_.type(out).dtype;
    Level lv = level_[size_t(out)];
    int result = -1;
    if (cls_[size_t(ni)] == NodeClass::ViewCopy) {
      bool rs = n.op == OpId::Reshape || n.op == OpId::Flatten;
      ViewGeometry geo;
      bool ok = rs ? resolve_impl(g_, n.inputs[0], &view_is_copy_, &geo, &s_.value_strides)
                   : (resolve_impl(g_, n.inputs[0], &view_is_copy_, &geo, &s_.value_strides) &&
                      apply_view(g_, n, 0, ViewGeometry(geo), &geo));
      KILN_ASSERT(ok);
      Access a;
      a.value = geo.base;
      a.offset = geo.offset;
      a.dtype = od;
      a.strides = map_strides(geo.sizes, geo.strides, gr.full, iter_of_full, n_iter);
      result = add_load(a, Level::Full);
      // Stored contiguously over the iteration shape (for reshape: the input's shape, whose
      // row-major order is the output's).
      expr_of[size_t(out)] = result;
      LoopStore st;
      st.expr = result;
      st.access.value = out;
      st.access.dtype = od;
      Dims cs = contiguous_strides(gr.full);
      st.access.strides = map_strides(gr.full, cs, gr.full, iter_of_full, n_iter);
      k->stores.push_back(st);
      continue;
    }
    if (is_indexed_read(n.op)) {
      // Note [Indexed loads]: reads over the output's space; dim j of a read value walks the
      // iteration dim of output dim full_dim[j] (-1: not walked, or indexed).
      auto mapped = [&](ValueId v, const std::vector<int>& full_dim, int64_t extra) {
        ViewGeometry geo = geometry(v);
        Access a;
        a.value = geo.base;
        a.offset = geo.offset + extra;
        a.dtype = g_.type(v).dtype;
        a.strides.assign(n_iter, 0);
        for (size_t j = 0; j < full_dim.size() && j < geo.sizes.size(); ++j)
          if (full_dim[j] >= 0 && geo.sizes[j] != 1)
            a.strides[size_t(iter_of_full[size_t(full_dim[j])])] = geo.strides[j];
        return std::make_pair(a, geo);
      };
      auto identity_except = [](int r, int skip) {
        std::vector<int> m;
        for (int j = 0; j < r; ++j) m.push_back(j == skip ? -1 : j);
        return m;
      };
      LoopExpr e;
      e.kind = LoopExpr::Kind::Indexed;
      e.op = n.op;
      e.attrs = &n.attrs;
      e.dtype = od;
      e.level = Level::Full;
      e.node = ni;
      ValueId x = n.inputs[0], idx = n.inputs[1];
      const int xr = g_.type(x).rank();
      std::pair<Access, ViewGeometry> src;
      if (n.op == OpId::GridSample) {
        src = mapped(x, {0, 1, -1, -1}, 0);
        ViewGeometry gg = geometry(idx);
        e.args = {add_load(mapped(idx, {0, 2, 3, -1}, 0).first, Level::Full),
                  add_load(mapped(idx, {0, 2, 3, -1}, gg.strides[3]).first, Level::Full)};
        e.src_stride[0] = src.second.strides[2];
        e.src_stride[1] = src.second.strides[3];
        e.src_size[0] = src.second.sizes[2];
        e.src_size[1] = src.second.sizes[3];
      } else {
        int dim = 0;
        std::string what;
        if (n.op == OpId::Gather) {
          dim = normalized_dim(n, xr);
          src = mapped(x, identity_except(xr, dim), 0);
          e.args = {read(idx, Level::Full)};  // the output's shape: maybe a register
          what = fmt::format("dim {} of x", dim);
        } else if (n.op == OpId::IndexSelect) {
          dim = normalized_dim(n, xr);
          src = mapped(x, identity_except(xr, dim), 0);
          std::vector<int> im;
          if (g_.type(idx).rank() == 1) im = {dim};
          e.args = {add_load(mapped(idx, im, 0).first, Level::Full)};
          what = fmt::format("dim {} of x", dim);
        } else {  // embedding: weight [num, width], out = indices.shape + [width]
          const int ir = g_.type(idx).rank();
          src = mapped(x, {-1, ir}, 0);
          e.args = {add_load(mapped(idx, identity_except(ir, -1), 0).first, Level::Full)};
          what = "the embedding table (dim 0 of weight)";
        }
        e.src_stride[0] = src.second.strides[size_t(dim)];
        e.src_size[0] = src.second.sizes[size_t(dim)];
        e.check = int(k->checks.size());
        k->checks.push_back(index_check(ni, n, what, e.src_size[0]));
      }
      k->loads.push_back(src.first);  // read only through the Indexed expression
      e.load = int(k->loads.size()) - 1;
      result = add_expr(e);
    } else if (linear && ni == gr.anchor) {
      // x[..., k] * w[n, k], summed over k; then bias, residual, activation at the result.
      ValueId x = n.inputs[0], w = n.inputs[1];
      const TensorType& xt = g_.type(x);
      ViewGeometry gx, gw;
      bool ok = resolve_impl(g_, x, &view_is_copy_, &gx) && resolve_impl(g_, w, &view_is_copy_, &gw);
      KILN_ASSERT(ok);
      Access ax, aw;
      ax.value = gx.base; ax.offset = gx.offset; ax.dtype = xt.dtype;
      ax.strides.assign(n_iter, 0);
      for (int j = 0; j + 1 < xt.rank(); ++j) ax.strides[size_t(j)] = gx.sizes[size_t(j)] == 1 ? 0 : gx.strides[size_t(j)];
      ax.strides[n_iter - 1] = gx.strides[size_t(xt.rank() - 1)];
      aw.value = gw.base; aw.offset = gw.offset; aw.dtype = g_.type(w).dtype;
      aw.strides.assign(n_iter, 0);
      aw.strides[n_iter - 2] = gw.strides[0];
      aw.strides[n_iter - 1] = gw.strides[1];
      int lx = expr_of[size_t(x)] >= 0 ? expr_of[size_t(x)] : add_load(ax, Level::Full);
      int lw = add_load(aw, Level::Full);
      int prod = op_expr(OpId::Mul, synth({}), {lx, lw}, DType::Float32, Level::Full, ni);
      LoopExpr r;
      r.kind = LoopExpr::Kind::Reduce;
      r.op = OpId::Sum;
      r.attrs = synth({});
      r.args = {prod};
      r.dtype = od;
      r.level = Level::Kept;
      r.node = ni;
      r.count = k->sizes.back();
      int acc = add_expr(r);
      k->anchor = acc;
      if (n.inputs.size() > 2 && n.inputs[2] != kNoValue)
        acc = op_expr(OpId::Add, synth({}), {acc, read(n.inputs[2], Level::Kept)}, od, Level::Kept, ni);
      if (n.op == OpId::FusedLinear) {
        if (n.inputs.size() > 3 && n.inputs[3] != kNoValue) {
          int res = read(n.inputs[3], Level::Kept);
          double sc = n.attrs.get_float("sum_scale");
          if (sc != 1.0) {
            LoopExpr c;
            c.kind = LoopExpr::Kind::Scalar; c.level = Level::Kept; c.dtype = od; c.scalar = sc;
            res = op_expr(OpId::Mul, synth({}), {res, add_expr(c)}, od, Level::Kept, ni);
          }
          acc = op_expr(OpId::Add, synth({}), {acc, res}, od, Level::Kept, ni);
        }
        const std::string& act = n.attrs.get_string("activation");
        if (act == "relu") acc = op_expr(OpId::Relu, synth({}), {acc}, od, Level::Kept, ni);
        else if (act == "gelu") acc = op_expr(OpId::Gelu, synth({{"approximate", std::string("none")}}), {acc}, od, Level::Kept, ni);
        else if (act == "gelu_tanh") acc = op_expr(OpId::Gelu, synth({{"approximate", std::string("tanh")}}), {acc}, od, Level::Kept, ni);
        else if (act == "silu") acc = op_expr(OpId::Silu, synth({}), {acc}, od, Level::Kept, ni);
        else if (act == "sigmoid") acc = op_expr(OpId::Sigmoid, synth({}), {acc}, od, Level::Kept, ni);
        else if (act == "tanh") acc = op_expr(OpId::Tanh, synth({}), {acc}, od, Level::Kept, ni);
      }
      result = acc;
    } else if (ni == gr.anchor && gr.kind == LoopKind::Reduce) {
      LoopExpr r;
      r.kind = LoopExpr::Kind::Reduce;
      r.op = is_global_avg_pool(n) ? OpId::Mean : n.op;
      r.attrs = &n.attrs;
      r.args = {read(n.inputs[0], Level::Full)};
      r.dtype = od;
      r.level = Level::Kept;
      r.node = ni;
      r.count = 1;
      for (int d : rdims) r.count *= gr.full[size_t(d)];
      result = add_expr(r);
      k->anchor = result;
    } else if (ni == gr.anchor && gr.kind == LoopKind::Norm) {
      LoopExpr r;
      r.kind = LoopExpr::Kind::Norm;
      r.op = n.op;
      r.attrs = &n.attrs;
      r.args = {read(n.inputs[0], Level::Full)};
      if (n.op == OpId::LayerNorm) {
        r.args.push_back(n.inputs.size() > 1 && n.inputs[1] != kNoValue ? read(n.inputs[1], Level::Full) : -1);
        r.args.push_back(n.inputs.size() > 2 && n.inputs[2] != kNoValue ? read(n.inputs[2], Level::Full) : -1);
      }
      r.dtype = od;
      r.level = Level::Full;
      r.node = ni;
      r.count = 1;
      for (int d : rdims) r.count *= gr.full[size_t(d)];
      result = add_expr(r);
      k->anchor = result;
    } else {
      std::vector<int> args;
      for (ValueId v : n.inputs) args.push_back(v == kNoValue ? -1 : read(v, lv));
      result = op_expr(n.op, &n.attrs, std::move(args), od, lv, ni);
    }
    expr_of[size_t(out)] = result;
    if (!s_.unstored[size_t(out)]) {
      LoopStore st;
      st.expr = result;
      st.access.value = out;
      st.access.dtype = od;
      Dims vs = dims_of(g_.type(out));
      Dims cs = geometry(out).strides;
      st.access.strides = lv == Level::Full ? map_strides(vs, cs, gr.full, iter_of_full, n_iter)
                                            : map_strides(vs, cs, gr.kept, iter_of_kept, n_iter);
      k->stores.push_back(st);
    }
  }

  // Merge adjacent dims (within kept and within reduced) that every access walks as one, and
  // drop size-1 dims; a Reduce/Norm kernel keeps at least one reduce dim.
  auto all_access = [&](auto&& f) {
    for (Access& a : k->loads) f(a.strides);
    for (LoopStore& s : k->stores) f(s.access.strides);
  };
  auto merge_dims = [&] {
    for (int t = int(k->sizes.size()) - 1; t >= 0; --t) {
      int kept = k->kept_dims();
      bool in_reduce = t >= kept;
      bool last_reduce = in_reduce && k->reduce_dims == 1;
      if (k->sizes[size_t(t)] == 1 && !last_reduce && k->sizes.size() > 1) {
        k->sizes.erase(k->sizes.begin() + t);
        all_access([&](std::vector<int64_t>& st) { st.erase(st.begin() + t); });
        if (in_reduce) --k->reduce_dims;
        continue;
      }
      if (t + 1 < int(k->sizes.size()) && (t + 1 >= kept) == in_reduce) {
        bool mergeable = true;
        int64_t inner = k->sizes[size_t(t + 1)];
        all_access([&](std::vector<int64_t>& st) {
          if (st[size_t(t)] != st[size_t(t + 1)] * inner) mergeable = false;
        });
        if (mergeable) {
          k->sizes[size_t(t)] *= inner;
          k->sizes.erase(k->sizes.begin() + t + 1);
          all_access([&](std::vector<int64_t>& st) { st.erase(st.begin() + t); });
          if (in_reduce) --k->reduce_dims;
        }
      }
    }
  };
  merge_dims();
  // Note [loop order]: a pointwise kernel walks its space in its first store's memory order
  // (outermost = largest stride), so that a value stored in another order than row-major
  // (channels-last: ScheduleOptions::value_strides) is written and read contiguously along the
  // innermost loop, not with a stride of C. Any order computes the same elements; kernels with
  // indexed reads keep theirs (their tap tables are laid out along the output's dims).
  if (k->kind == LoopKind::Pointwise && !k->stores.empty() && k->sizes.size() > 1 &&
      std::none_of(k->exprs.begin(), k->exprs.end(),
                   [](const LoopExpr& e) { return e.kind == LoopExpr::Kind::Indexed; })) {
    const std::vector<int64_t> ref = k->stores[0].access.strides;
    std::vector<size_t> order(k->sizes.size());
    for (size_t d = 0; d < order.size(); ++d) order[d] = d;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return ref[a] > ref[b]; });
    bool identity = true;
    for (size_t d = 0; d < order.size(); ++d) identity = identity && order[d] == d;
    if (!identity) {
      auto permuted = [&](const std::vector<int64_t>& v) {
        std::vector<int64_t> out;
        for (size_t d : order) out.push_back(v[d]);
        return out;
      };
      k->sizes = permuted(k->sizes);
      all_access([&](std::vector<int64_t>& st) { st = permuted(st); });
      merge_dims();
    }
  }
  if (k->sizes.empty() || (k->kind != LoopKind::Pointwise && k->reduce_dims == 0)) {
    // A Reduce/Norm kernel always has an innermost reduce dim (size 1 when nothing is reduced).
    k->sizes.push_back(1);
    all_access([&](std::vector<int64_t>& st) { st.push_back(0); });
    if (k->kind != LoopKind::Pointwise) k->reduce_dims = 1;
  }
  // Name: k<step>_<ops>.
  std::string ops;
  for (size_t j = 0; j < gr.nodes.size() && j < 4; ++j)
    ops += std::string("_") + op_def(g_.nodes[size_t(gr.nodes[j])].op).name;
  if (gr.nodes.size() > 4) ops += "_etc";
  k->name = fmt::format("k{}{}", gr.step, ops);
}

// scatter_add alone (LoopKind::Scatter in Note [Loop-nest IR]): the index's dims, the scattered
// one last; index and src read at the index's coordinates; x copied into the output first.
void Scheduler::build_scatter(const Group& gr, LoopKernel* k) {
  const int32_t ni = gr.anchor;
  const Node& n = g_.nodes[size_t(ni)];
  k->kind = LoopKind::Scatter;
  k->nodes = gr.nodes;
  ValueId x = n.inputs[0], idx = n.inputs[1], src = n.inputs[2], out = n.outputs[0];
  const Dims od = dims_of(g_.type(out));
  const int r = int(od.size());
  const int dim = normalized_dim(n, r);
  std::vector<int> perm;
  for (int d = 0; d < r; ++d)
    if (d != dim) perm.push_back(d);
  perm.push_back(dim);
  for (int d : perm) k->sizes.push_back(gr.full[size_t(d)]);
  k->reduce_dims = 1;
  auto load = [&](ValueId v) {
    ViewGeometry geo = geometry(v);
    Access a;
    a.value = geo.base;
    a.offset = geo.offset;
    a.dtype = g_.type(v).dtype;
    for (int d : perm) a.strides.push_back(geo.sizes[size_t(d)] == 1 ? 0 : geo.strides[size_t(d)]);
    k->loads.push_back(a);
    LoopExpr e;
    e.kind = LoopExpr::Kind::Load;
    e.dtype = a.dtype;
    e.load = int(k->loads.size()) - 1;
    k->exprs.push_back(e);
    return int(k->exprs.size()) - 1;
  };
  LoopScatter& sc = k->scatter;
  sc.index = load(idx);
  sc.src = load(src);
  ViewGeometry gx = geometry(x);
  sc.init.value = gx.base;
  sc.init.offset = gx.offset;
  sc.init.dtype = g_.type(x).dtype;
  sc.init.strides.assign(gx.strides.begin(), gx.strides.end());
  sc.init_sizes.assign(od.begin(), od.end());
  Dims cs = contiguous_strides(od);
  sc.out.value = out;
  sc.out.dtype = g_.type(out).dtype;
  for (int d : perm) sc.out.strides.push_back(d == dim ? 0 : cs[size_t(d)]);
  sc.dim_stride = cs[size_t(dim)];
  sc.dim_size = od[size_t(dim)];
  sc.check = 0;
  k->checks.push_back(index_check(ni, n, fmt::format("dim {} of x", dim), sc.dim_size));
  LoopStore st;
  st.expr = sc.src;
  st.access = sc.out;
  k->stores.push_back(st);
  k->name = fmt::format("k{}_scatter_add", gr.step);
}

}  // namespace

Schedule schedule(const Graph& g, const std::vector<bool>& view_is_copy,
                  const ScheduleOptions& options) {
  if (view_is_copy.size() != g.values.size())
    throw_error(ErrorKind::Internal, "scheduler: view_is_copy must have one entry per value");
  Scheduler s(g, view_is_copy, options);
  return s.run();
}

std::string loop_kernel_str(const Graph& g, const LoopKernel& k) {
  std::string s = fmt::format("{} ({}), sizes [{}], {} reduce dims\n", k.name, loop_kind_name(k.kind),
                              fmt::join(k.sizes, ", "), k.reduce_dims);
  for (size_t i = 0; i < k.loads.size(); ++i)
    s += fmt::format("  load{} %{} +{} strides [{}]\n", i, g.value(k.loads[i].value).name,
                     k.loads[i].offset, fmt::join(k.loads[i].strides, ", "));
  for (size_t i = 0; i < k.exprs.size(); ++i) {
    const LoopExpr& e = k.exprs[i];
    std::string what;
    switch (e.kind) {
      case LoopExpr::Kind::Load: what = fmt::format("load{}", e.load); break;
      case LoopExpr::Kind::Scalar: what = fmt::format("{}", e.scalar); break;
      case LoopExpr::Kind::Indexed:
        what = fmt::format("{}(load{} at {})", op_def(e.op).name, e.load, fmt::join(e.args, ", "));
        break;
      default: what = fmt::format("{}({})", op_def(e.op).name, fmt::join(e.args, ", ")); break;
    }
    s += fmt::format("  e{} = {} : {}{}\n", i, what, dtype_name(e.dtype),
                     e.level == Level::Kept ? " (kept)" : "");
  }
  if (k.kind == LoopKind::Scatter)
    s += fmt::format("  init %{} +{} strides [{}] over [{}]\n  scatter-add e{} at index e{} "
                     "(dim stride {}, size {})\n", g.value(k.scatter.init.value).name,
                     k.scatter.init.offset, fmt::join(k.scatter.init.strides, ", "),
                     fmt::join(k.scatter.init_sizes, ", "), k.scatter.src, k.scatter.index,
                     k.scatter.dim_stride, k.scatter.dim_size);
  for (const LoopStore& st : k.stores)
    s += fmt::format("  store e{} -> %{} strides [{}]\n", st.expr, g.value(st.access.value).name,
                     fmt::join(st.access.strides, ", "));
  return s;
}

std::string schedule_str(const Graph& g, const Schedule& s) {
  std::string out;
  for (size_t i = 0; i < s.steps.size(); ++i) {
    const Step& st = s.steps[i];
    if (st.kind == StepKind::Loop) {
      const LoopKernel& k = s.loops[size_t(st.loop)];
      std::string names;
      for (int32_t n : k.nodes)
        names += (names.empty() ? "%" : ", %") + g.value(g.nodes[size_t(n)].outputs[0]).name;
      out += fmt::format("step {}: {} {} [{}]\n", i, loop_kind_name(k.kind), k.name, names);
    } else {
      const Node& n = g.nodes[size_t(st.node)];
      out += fmt::format("step {}: {} {} [%{}]\n", i, step_kind_name(st.kind), op_def(n.op).name,
                         g.value(n.outputs[0]).name);
    }
  }
  return out;
}

std::vector<bool> planned_view_copies(const Graph& g) {
  PlanOptions pre;
  pre.in_place = false;
  MemoryPlan plan = plan_memory(g, pre);
  std::vector<bool> copies(g.values.size(), false);
  for (size_t v = 0; v < g.values.size(); ++v) copies[v] = plan.values[v].kind == PlanKind::Copy;
  return copies;
}

std::vector<bool> in_place_safe_nodes(const Graph& g, const Schedule& s) {
  std::vector<bool> ok(g.nodes.size(), false);
  for (const LoopKernel& k : s.loops) {
    if (k.kind != LoopKind::Pointwise) continue;
    for (int32_t ni : k.nodes) {
      const Node& n = g.nodes[size_t(ni)];
      if (n.inputs.empty() || n.inputs[0] == kNoValue || n.outputs.size() != 1) continue;
      ValueId x = n.inputs[0], o = n.outputs[0];
      if (s.virtual_view[size_t(x)]) continue;  // must own its buffer
      const LoopStore* st = nullptr;
      for (const LoopStore& cand : k.stores)
        if (cand.access.value == o) st = &cand;
      if (!st || st->access.offset != 0) continue;
      bool same = dtype_size(g.type(x).dtype) == dtype_size(g.type(o).dtype);
      bool read = false;
      for (const Access& a : k.loads) {
        if (a.value != x) continue;
        read = true;
        same = same && a.offset == 0 && a.strides == st->access.strides;
      }
      ok[size_t(ni)] = same && read;
    }
  }
  return ok;
}

}  // namespace kiln::lower
