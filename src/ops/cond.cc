// Note [cond]
// Host code that branches on a tensor's value (`if (mean(h).item() > t)`) makes a graph break
// under capture: the host must see the value, so the graph ends there, and what follows depends
// on host code no compiled artefact holds (a package cannot carry it: Package.GraphBreakIsRefused).
// cond() states the branch as data instead. Eagerly it reads `pred` and runs one branch. Under
// capture (a dispatch hook records the ops) it records both branches and selects each
// output with where(pred, true_out, false_out): one graph, whose nodes the passes fuse like any
// others (the two branches' pointwise tails and the selects become one loop kernel). A
// predicate that has data under capture (a call input, a tensor the host made) is recorded the
// same way, as a graph input or a constant: `cond(in[1], ...)` does not break the graph.
//
// The price is that the compiled graph computes both branches. That is the right trade for the
// small branches of inference code (a threshold on a score, a clamp path); a branch worth
// skipping (a whole sub-network) would want conditional execution in the launch list, which
// Kiln does not have yet. The select itself is exact: where() picks one input's element, so a
// NaN or Inf in the branch not taken never reaches the output, and the result equals the eager
// branch up to the compiled graph's own rounding.
//
// `pred` with one element: a bool, or any number (nonzero is true, NaN included, as bool() of
// a tensor is in PyTorch). The branches' outputs must agree pairwise in dtype, shape and device,
// checked while tracing (eagerly only one branch runs, so there is nothing to compare).
#include "ops/cond.h"

#include <fmt/format.h>

#include "core/error.h"
#include "ops/api.h"
#include "ops/dispatch.h"

namespace kiln {

TensorList cond(const Tensor& pred, const CondBranch& if_true, const CondBranch& if_false,
                const TensorList& operands, const std::source_location& loc) {
  if (!pred.defined() || pred.numel() != 1)
    fail_kind(ErrorKind::InvalidArgument,
              "cond at {}: pred must be a tensor of one element (the branch's condition), got {}",
              location_str(loc), pred.defined() ? "shape " + to_string(pred.sizes()) : "no tensor");
  if (!if_true || !if_false)
    fail_kind(ErrorKind::InvalidArgument, "cond at {}: both branches must be given",
              location_str(loc));
  // Recording (a dispatch hook takes the ops: capture) or running: a predicate with data under
  // capture (a call input, a tensor the host made) is recorded too, as the graph's input or a
  // constant, rather than read on the host (which would break the graph).
  if (!dispatch_hook()) return pred.item(loc) != 0.0 ? if_true(operands) : if_false(operands);

  // Under capture: both branches into the graph, then one select per output.
  TensorList t = if_true(operands);
  TensorList f = if_false(operands);
  if (t.size() != f.size())
    fail_kind(ErrorKind::InvalidArgument,
              "cond at {}: the true branch returns {} tensors and the false branch {}; under "
              "capture both run, and each output is selected from the pair: return as many from "
              "each", location_str(loc), t.size(), f.size());
  Tensor p = pred.dtype() == DType::Bool ? pred : ne(pred, scalar_like(0.0, pred), loc);
  if (p.dim() != 0) p = reshape(p, {}, loc);
  TensorList out;
  out.reserve(t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    if (!t[i].defined() || !f[i].defined())
      fail_kind(ErrorKind::InvalidArgument, "cond at {}: output {} of the {} branch is no tensor",
                location_str(loc), i, t[i].defined() ? "false" : "true");
    if (t[i].dtype() != f[i].dtype() || t[i].sizes() != f[i].sizes() ||
        t[i].device() != f[i].device())
      fail_kind(ErrorKind::InvalidArgument,
                "cond at {}: output {} is {} {} {} from the true branch but {} {} {} from the false "
                "one; under capture it is selected from the two, so they must agree (cast or "
                "reshape one branch's result)",
                location_str(loc), i, dtype_name(t[i].dtype()), to_string(t[i].sizes()),
                t[i].device().str(), dtype_name(f[i].dtype()), to_string(f[i].sizes()),
                f[i].device().str());
    out.push_back(where(p, t[i], f[i], loc));
  }
  return out;
}

}  // namespace kiln
