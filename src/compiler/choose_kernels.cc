#include "compiler/choose_kernels.h"

#include "lower/scheduler.h"

namespace kiln::compiler {

namespace {
bool concrete(const TensorType& t) {
  for (size_t i = 0; i < t.shape.size(); ++i)
    if (!t.shape[i].is_concrete()) return false;
  return true;
}
}  // namespace

KernelChoice choose_kernels(const Graph& g, const Target& target, const SchedulePolicy& policy) {
  KernelChoice c;
  size_t n = g.nodes.size();
  c.library.assign(n, false);
  c.gemv.assign(n, false);
  c.generated.assign(n, false);
  const OpSupportTable& support = target.support();
  for (size_t i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    // A linear small enough is cheaper as generated code than as a library call (a oneDNN call
    // costs about a microsecond of overhead).
    c.gemv[i] = lower::small_linear(g, node, policy.small_linear_macs, policy.small_half_gemv_macs,
                                    policy.row_linear_macs);
    bool lib = support[size_t(node.op)].library && !c.gemv[i] && target.library_takes(g, node);
    for (ValueId o : node.outputs) lib = lib && concrete(g.type(o));
    c.library[i] = lib;
    c.generated[i] = target.generates(g, node);
  }
  return c;
}

}  // namespace kiln::compiler
