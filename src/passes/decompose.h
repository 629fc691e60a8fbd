// decompose: replace composite ops by the core ops of their registry decomposition.
//
// An op whose OpDef has a `decompose` function (softmax, log_softmax, layer_norm, batch_norm,
// group_norm, scaled_dot_product_attention, fused_conv2d, fused_linear, ...) is replaced by
// tracing that function: it runs on fake tensors (Tensor::fake: type, no data) with a
// DispatchHook installed that records every op it calls into the graph instead of running it
// (the idea of capture's Tracer, kept local so passes do not depend on capture). Tensors the
// function creates on the host (a scalar operand, a causal mask) become consts. When the traced
// function calls another selected op, that op is decomposed in turn (recursively), so the result
// holds no selected op. The recorded nodes keep the original node's provenance (loc), the final
// outputs keep the original output names, and the intermediate values are named
// `<output>.<op>` (`%sm.exp`).
//
// Selection: `ops` lists the ops to decompose; when it is empty, every op with a decomposition
// except `keep` (by default the ops the CPU backend runs whole: fused_conv2d and fused_linear,
// which map to oneDNN post-ops; see default_kept_whole()).
//
// `keep_node`, when set, keeps a selected node whole where it answers true (a target that runs
// some nodes of an op whole in its library and decomposes the others: CUDA's fused_conv2d with a
// relu epilogue goes to cuDNN whole, one with a gelu is decomposed).
//
// Expects: a valid graph. Nodes whose input shapes are symbolic are left whole (fake tensors
// need concrete sizes). A decomposition that reads tensor data on the host cannot be traced:
// that is a bug in the op record and fails with an error naming the op and the node.
// Guarantees: no node of a selected op with concrete input shapes remains; values outside the
// replaced nodes keep their ids' names.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "passes/pass.h"

namespace kiln {

struct DecomposeOptions {
  std::vector<OpId> ops;   // decompose exactly these (empty: all with a decomposition but keep)
  std::vector<OpId> keep;  // used when `ops` is empty
  std::function<bool(const Graph&, const Node&)> keep_node;  // per node; see above
};

// The ops the CPU backend keeps whole by default.
std::vector<OpId> default_kept_whole();
DecomposeOptions default_decompose_options();

std::unique_ptr<Pass> make_decompose_pass(DecomposeOptions options = default_decompose_options());

struct DecomposeResult {
  int nodes_decomposed = 0;  // original nodes replaced (nested decompositions not counted)
  int nodes_added = 0;       // core-op nodes recorded in their place
};
DecomposeResult decompose_ops(Graph& g, const DecomposeOptions& options = default_decompose_options());

}  // namespace kiln
