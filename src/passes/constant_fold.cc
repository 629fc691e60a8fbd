#include "passes/constant_fold.h"

#include "ops/dispatch.h"
#include "passes/graph_rewrite.h"

namespace kiln {

namespace {

// The data of new-graph value v when it counts as a constant, else undefined.
Tensor constant_data(const GraphBuilder& b, ValueId v, const ConstantFoldOptions& opt) {
  const Value& val = b.dst().value(v);
  if (val.kind == ValueKind::Const || (opt.fold_params && val.kind == ValueKind::Param))
    return b.data_of(v);
  return Tensor();
}

}  // namespace

ConstantFoldResult fold_constants(Graph& g, const ConstantFoldOptions& options) {
  ConstantFoldResult result;
  std::vector<int> uses = live_use_counts(g);
  GraphBuilder b(g);
  NoDispatchHook no_hook;  // a backend may run while capture's hook is installed
  for (const Node& n : g.nodes) {
    std::vector<ValueId> in = b.map(n.inputs);
    bool foldable = attrs_concrete(n.attrs);
    bool used = false;
    for (ValueId o : n.outputs) {
      used = used || uses[size_t(o)] > 0;
      foldable = foldable && is_concrete(g.type(o).shape);
    }
    foldable = foldable && used;
    TensorList args;
    int64_t input_elements = 0;
    bool from_params = false;  // Note [Folded weights stay params] in constant_fold.h
    for (size_t i = 0; foldable && i < in.size(); ++i) {
      if (in[i] == kNoValue) {
        args.emplace_back();
        continue;
      }
      Tensor t = constant_data(b, in[i], options);
      foldable = t.defined();
      from_params = from_params || b.dst().value(in[i]).kind == ValueKind::Param;
      input_elements += foldable ? t.numel() : 0;
      args.push_back(t);
    }
    int64_t output_elements = 0;
    if (foldable)
      for (ValueId o : n.outputs) output_elements += numel(to_dims(g.type(o).shape));
    // A gather of constant rows (Swin V2's relative position bias: a [225, heads] table read
    // through a constant [4096] index) folds up to gather_elements even where it grows the
    // data: read per call, it was an indirect, scalar gather, and it kept the chain after it
    // (16 * sigmoid(bias)) from folding, so every call recomputed both.
    const bool gather = n.op == OpId::IndexSelect || n.op == OpId::Gather || n.op == OpId::Embedding;
    foldable = foldable &&
               (output_elements <= std::max(options.small_elements, input_elements) ||
                (gather && output_elements <= options.gather_elements));
    if (!foldable) {
      b.copy_node(n);
      continue;
    }
    TensorList outs;
    try {
      outs = call_op(n.op, args, n.attrs);
    } catch (const Error&) {
      // Not ours to report: the node stays, and running the graph reports it with its name.
      b.copy_node(n);
      continue;
    }
    KILN_ASSERT(outs.size() == n.outputs.size());
    for (size_t k = 0; k < outs.size(); ++k) {
      // A view shares its input's storage (a param the caller owns): keep a private copy.
      Tensor data = op_def(n.op).is_view || !outs[k].is_contiguous() ? outs[k].clone() : outs[k];
      const Value& old = g.value(n.outputs[k]);
      KILN_ASSERT(data.dtype() == old.type.dtype && to_shape(data.sizes()) == old.type.shape);
      b.set_map(n.outputs[k], from_params ? b.add_param(data, old.name) : b.add_const(data, old.name));
      result.folded_elements += data.numel();
    }
    ++result.nodes_folded;
  }
  if (result.nodes_folded > 0) g = b.finish();
  return result;
}

namespace {

class ConstantFoldPass : public Pass {
 public:
  explicit ConstantFoldPass(ConstantFoldOptions o) : options_(o) {}
  std::string_view name() const override { return "constant-fold"; }
  std::string_view description() const override {
    return "evaluate nodes whose inputs are all consts (or frozen params) into consts";
  }
  bool run(Graph& g) override { return fold_constants(g, options_).nodes_folded > 0; }

 private:
  ConstantFoldOptions options_;
};

}  // namespace

std::unique_ptr<Pass> make_constant_fold_pass(ConstantFoldOptions options) {
  return std::make_unique<ConstantFoldPass>(options);
}

}  // namespace kiln
