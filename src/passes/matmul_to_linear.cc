#include "passes/matmul_to_linear.h"

#include <map>

#include "passes/graph_rewrite.h"

namespace kiln {
namespace {

// Data of old-graph value v if it is a 2-D float param or const with concrete, non-empty dims.
Tensor weight_data(const Graph& g, ValueId v) {
  const Value& val = g.value(v);
  if (val.kind != ValueKind::Param && val.kind != ValueKind::Const) return {};
  if (!val.data.defined() || !val.data.has_storage()) return {};
  const TensorType& t = val.type;
  if (t.rank() != 2 || !is_floating(t.dtype)) return {};
  for (const SymInt& d : t.shape)
    if (!d.is_concrete() || d.value() == 0) return {};
  return val.data;
}

}  // namespace

int matmul_to_linear(Graph& g) {
  std::vector<bool> rewrite(g.nodes.size(), false);
  int count = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.op != OpId::Matmul || n.inputs.size() != 2 || n.outputs.size() != 1) continue;
    if (g.type(n.inputs[0]).rank() < 1 || !is_floating(g.type(n.inputs[0]).dtype)) continue;
    if (!weight_data(g, n.inputs[1]).defined()) continue;
    rewrite[i] = true;
    ++count;
  }
  if (count == 0) return 0;
  GraphBuilder b(g);
  std::map<ValueId, ValueId> transposed;  // old W -> new W^T
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (!rewrite[i]) {
      b.copy_node(n);
      continue;
    }
    ValueId w = n.inputs[1];
    auto it = transposed.find(w);
    if (it == transposed.end()) {
      const Value& wv = g.value(w);
      Tensor wt = weight_data(g, w);
      // [K, N] -> [N, K], contiguous, same dtype and device.
      Tensor t = wt.as_strided({wt.size(1), wt.size(0)}, {wt.strides()[1], wt.strides()[0]},
                               wt.offset())
                     .contiguous();
      it = transposed.emplace(w, b.add_derived(wv, t, ".t")).first;
    }
    ValueId y = b.add_node1(OpId::Linear, {b.map(n.inputs[0]), it->second}, {}, n.name,
                            g.value(n.outputs[0]).name);
    b.set_map(n.outputs[0], y);
  }
  g = b.finish();
  return count;
}

namespace {

class MatmulToLinearPass : public Pass {
 public:
  std::string_view name() const override { return "matmul-to-linear"; }
  std::string_view description() const override {
    return "matmul by a 2-D constant matrix W -> linear(x, W^T), so its bias and activation fuse";
  }
  bool run(Graph& g) override { return matmul_to_linear(g) > 0; }
};

}  // namespace

std::unique_ptr<Pass> make_matmul_to_linear_pass() {
  return std::make_unique<MatmulToLinearPass>();
}

}  // namespace kiln
