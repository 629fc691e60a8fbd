#include "compiler/assign_memory.h"

#include <fmt/format.h>

#include "core/error.h"

namespace kiln::compiler {

MemoryAssignment assign_memory(Graph& g, const lower::Schedule& s,
                               const std::vector<bool>& view_is_copy, const LibraryKernels& lib,
                               const Target& target, bool place_constants) {
  MemoryAssignment m;
  PlanOptions po;
  po.node_step = s.node_step;
  po.unstored = s.unstored;
  po.in_place_nodes = lower::in_place_safe_nodes(g, s);
  po.bytes_override.assign(g.values.size(), -1);
  for (size_t v = 0; v < g.values.size(); ++v) po.bytes_override[v] = lib.value_bytes(ValueId(v));
  // Each library launch's scratch, live at its step only (Note [Scratch per step]).
  po.node_scratch.assign(g.nodes.size(), 0);
  po.scratch_alignment = target.device().is_cpu() ? 64 : 256;  // cuDNN and cuBLASLt want 256
  for (const lower::Step& st : s.steps)
    if (st.kind == lower::StepKind::Extern) {
      const int64_t b = lib.scratch_bytes(st.node);
      if (b < 0)
        throw_error(ErrorKind::Internal,
                    fmt::format("compiler: the library asks {} bytes of scratch for node {}", b,
                                st.node));
      po.node_scratch[size_t(st.node)] = b;
    }
  // A device target copies inputs it cannot read in place (graph mode, host inputs) into
  // staging that the plan places in the arena (Note [Input staging in the arena]).
  po.stage_inputs = !target.device().is_cpu();
  m.plan = plan_memory(g, po);
  verify_memory_plan(g, m.plan, po);
  for (size_t v = 0; v < g.values.size(); ++v)
    if ((m.plan.values[v].kind == PlanKind::Copy) != view_is_copy[v])
      throw_error(ErrorKind::Internal,
                  fmt::format("compiler: the memory plan changed its view decision for '%{}'",
                              g.values[v].name));

  m.mem.assign(g.values.size(), MemRef{});
  int slot = 1;
  for (size_t i = 0; i < g.inputs.size(); ++i) m.mem[size_t(g.inputs[i])] = {slot++, 0};
  for (size_t v = 0; v < g.values.size(); ++v) {
    Value& val = g.values[v];
    if (val.kind != ValueKind::Param && val.kind != ValueKind::Const) continue;
    if (!val.data.defined())
      throw_error(ErrorKind::InvalidArgument,
                  fmt::format("compiler: parameter '%{}' has no data (IR text declares weights by "
                              "type only; load them before compiling)", val.name));
    // A cross-build keeps its constants on the host: they go into the package, not a device.
    MemoryAssignment::Constant c{slot, val.data, ""};
    if (place_constants) {
      val.data = target.place_constant(val.data);
      Tensor stored;
      c.layout = lib.store_constant(ValueId(v), val.data, &stored);
      c.data = c.layout.empty() ? val.data : std::move(stored);
      if (!c.layout.empty() && (!c.data.defined() || c.data.nbytes() != val.data.nbytes()))
        throw_error(ErrorKind::Internal,
                    fmt::format("compiler: '%{}' stored in layout {} changed its size", val.name,
                                c.layout));
    }
    m.constants.push_back(std::move(c));
    m.mem[v] = {slot++, 0};
  }
  for (size_t v = 0; v < g.values.size(); ++v) {
    const ValuePlan& p = m.plan.values[v];
    if (g.values[v].kind != ValueKind::NodeOutput) continue;
    if (p.buffer >= 0 && !s.virtual_view[v]) m.mem[v] = {0, p.offset};
  }
  for (size_t v = 0; v < g.values.size(); ++v)
    if (s.virtual_view[v]) m.mem[v] = m.mem[size_t(s.views[v].base)];
  if (!target.device().is_cpu()) m.status = {slot++, 0};
  m.num_slots = slot;
  return m;
}

}  // namespace kiln::compiler
