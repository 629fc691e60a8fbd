#include "passes/decompose.h"

#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "ops/dispatch.h"
#include "passes/graph_rewrite.h"

namespace kiln {

std::vector<OpId> default_kept_whole() { return {OpId::FusedConv2d, OpId::FusedLinear}; }

DecomposeOptions default_decompose_options() {
  DecomposeOptions o;
  o.keep = default_kept_whole();
  return o;
}

namespace {

// Nested decompositions deeper than this are a cycle in the registry (an op whose
// decomposition reaches itself).
constexpr int kMaxDepth = 16;

std::string node_label(const Node& n) {
  return n.name.empty() ? fmt::format("op '{}'", op_def(n.op).name)
                        : fmt::format("op '{}' (node '{}')", op_def(n.op).name, n.name);
}

// Records the ops a decomposition calls into the new graph. See the header.
class DecompositionRecorder final : public DispatchHook {
 public:
  DecompositionRecorder(GraphBuilder& b, const std::vector<bool>& selected, const Node& node,
                        std::string name_base)
      : b_(b), selected_(selected), node_(node), name_base_(std::move(name_base)) {}

  // A fake tensor standing for new-graph value v.
  Tensor fake_for(ValueId v) {
    const TensorType& t = b_.dst().type(v);
    Tensor f = Tensor::fake(to_dims(t.shape, "decomposed value shape"), t.dtype, t.device);
    values_.emplace(f.impl(), v);
    fakes_.push_back(f);
    return f;
  }

  ValueId value_for(const Tensor& t) {
    if (!t.defined()) return kNoValue;
    auto it = values_.find(t.impl());
    if (it != values_.end()) return it->second;
    if (!t.has_storage())
      fail_kind(ErrorKind::Internal, "decompose: {} used a tensor without data that it did not "
                "get from its inputs or from an op", node_label(node_));
    // Made on the host by the decomposition (a scalar operand, a mask): a const by value.
    Tensor data = t.is_contiguous() && t.offset() == 0 ? t.clone() : t.contiguous().clone();
    ValueId v = b_.add_const(data, "", name_base_ + ".const");
    values_.emplace(t.impl(), v);
    keep_alive_.push_back(t);  // the impl pointer must stay unique while we map by it
    return v;
  }

  bool created(ValueId v) const { return created_.count(v) > 0; }
  int nodes_added() const { return nodes_added_; }

  bool intercept(OpId op, std::span<const Tensor> inputs, const Attrs& attrs, TensorList& outputs,
                 const std::source_location&) override {
    const OpDef& def = op_def(op);
    if (selected_[size_t(op)] && def.decompose) {
      if (depth_ >= kMaxDepth)
        fail_kind(ErrorKind::Internal, "decompose: {} nests decompositions more than {} deep at "
                  "op '{}' (a decomposition that reaches itself?)", node_label(node_), kMaxDepth,
                  def.name);
      Attrs canonical = def.canonicalize(attrs, node_.name);
      infer_types(def, inputs, canonical, node_.name);  // the decomposition expects valid input
      ++depth_;
      outputs = def.decompose(inputs, canonical);
      --depth_;
      return true;
    }
    std::vector<ValueId> ids;
    ids.reserve(inputs.size());
    for (const Tensor& t : inputs) ids.push_back(value_for(t));
    std::vector<ValueId> outs =
        b_.add_node(op, ids, attrs, node_.name, {}, name_base_ + "." + def.name);
    ++nodes_added_;
    outputs.clear();
    for (ValueId v : outs) {
      created_.insert(v);
      outputs.push_back(fake_for(v));
    }
    return true;
  }

 private:
  GraphBuilder& b_;
  const std::vector<bool>& selected_;
  const Node& node_;
  std::string name_base_;
  std::unordered_map<const TensorImpl*, ValueId> values_;
  std::unordered_set<ValueId> created_;
  TensorList fakes_, keep_alive_;
  int depth_ = 0;
  int nodes_added_ = 0;
};

bool concrete_types(const Graph& g, const Node& n) {
  for (ValueId v : n.inputs)
    if (v != kNoValue && !is_concrete(g.type(v).shape)) return false;
  for (ValueId v : n.outputs)
    if (!is_concrete(g.type(v).shape)) return false;
  return attrs_concrete(n.attrs);
}

// Scoped: our recorder as the dispatch hook, and no materialization hook (a decomposition that
// reads data must fail, not trigger a capture graph break).
struct RecorderScope {
  explicit RecorderScope(DispatchHook* h)
      : prev_hook(set_dispatch_hook(h)), prev_mat(set_materialize_hook(nullptr)) {}
  ~RecorderScope() {
    set_materialize_hook(prev_mat);
    set_dispatch_hook(prev_hook);
  }
  DispatchHook* prev_hook;
  MaterializeHook prev_mat;
};

}  // namespace

DecomposeResult decompose_ops(Graph& g, const DecomposeOptions& options) {
  std::vector<bool> selected(size_t(kNumOps), false);
  if (!options.ops.empty()) {
    for (OpId op : options.ops) selected[size_t(op)] = op_def(op).decompose != nullptr;
  } else {
    for (const OpDef& d : all_ops()) selected[size_t(d.id)] = d.decompose != nullptr;
    for (OpId op : options.keep) selected[size_t(op)] = false;
  }

  DecomposeResult result;
  bool any = false;
  auto chosen = [&](const Node& n) {
    return selected[size_t(n.op)] && concrete_types(g, n) &&
           !(options.keep_node && options.keep_node(g, n));
  };
  for (const Node& n : g.nodes) any = any || chosen(n);
  if (!any) return result;

  GraphBuilder b(g);
  for (const Node& n : g.nodes) {
    if (!chosen(n)) {
      b.copy_node(n);
      continue;
    }
    const OpDef& def = op_def(n.op);
    const std::string& out_name = g.value(n.outputs[0]).name;
    DecompositionRecorder rec(b, selected, n, out_name);
    TensorList fake_inputs;
    for (ValueId v : b.map(n.inputs))
      fake_inputs.push_back(v == kNoValue ? Tensor() : rec.fake_for(v));
    TensorList outs;
    try {
      RecorderScope scope(&rec);
      outs = def.decompose(fake_inputs, n.attrs);
    } catch (const Error& e) {
      throw_error(e.kind(), fmt::format("decomposing {}: {}", node_label(n), e.message()));
    }
    if (outs.size() != n.outputs.size())
      fail_kind(ErrorKind::Internal, "decomposing {}: the decomposition returned {} outputs, "
                "the op has {}", node_label(n), outs.size(), n.outputs.size());
    for (size_t k = 0; k < outs.size(); ++k) {
      ValueId v = rec.value_for(outs[k]);
      const TensorType &want = g.type(n.outputs[k]), &got = b.dst().type(v);
      if (got.dtype != want.dtype || got.shape != want.shape)
        fail_kind(ErrorKind::Internal, "decomposing {}: output {} is {}, the op's type is {}",
                  node_label(n), k, got.str(), want.str());
      // The value standing for an original output takes its name (once: a decomposition may
      // return one value twice).
      const std::string& old_name = g.value(n.outputs[k]).name;
      if (rec.created(v) && b.dst().find_value(old_name) == kNoValue &&
          b.dst().value(v).name.rfind(out_name + ".", 0) == 0)
        b.dst().rename_value(v, old_name);
      b.set_map(n.outputs[k], v);
    }
    ++result.nodes_decomposed;
    result.nodes_added += rec.nodes_added();
  }
  g = b.finish();
  return result;
}

namespace {

class DecomposePass : public Pass {
 public:
  explicit DecomposePass(DecomposeOptions o) : options_(std::move(o)) {}
  std::string_view name() const override { return "decompose"; }
  std::string_view description() const override {
    return "replace composite ops (softmax, layer_norm, batch_norm, attention, ...) by the core "
           "ops of their decomposition";
  }
  bool run(Graph& g) override { return decompose_ops(g, options_).nodes_decomposed > 0; }

 private:
  DecomposeOptions options_;
};

}  // namespace

std::unique_ptr<Pass> make_decompose_pass(DecomposeOptions options) {
  return std::make_unique<DecomposePass>(std::move(options));
}

}  // namespace kiln
