#include "passes/graph_rewrite.h"

#include <fmt/format.h>

namespace kiln {

GraphBuilder::GraphBuilder(const Graph& src, std::function<bool(ValueId)> keep_param)
    : src_(src), map_(src.values.size(), kNoValue) {
  dst_.name = src.name;
  for (ValueId in : src.inputs) {
    const Value& v = src.value(in);
    map_[size_t(in)] = dst_.add_input(v.name, v.type);
  }
  for (size_t i = 0; i < src.values.size(); ++i) {
    const Value& v = src.values[i];
    if (v.kind != ValueKind::Param && v.kind != ValueKind::Const) continue;
    if (keep_param && !keep_param(ValueId(i))) continue;
    ValueId id;
    if (v.kind == ValueKind::Const && v.data.defined() && v.data.has_storage()) {
      id = dst_.add_const(v.data, v.name);
    } else if (v.kind == ValueKind::Param && v.data.defined()) {
      id = dst_.add_param(v.name, v.data);
    } else {
      // Declared by type only (IR text): keep the declaration, and the kind.
      id = dst_.add_param_decl(v.name, v.type);
      dst_.value(id).kind = v.kind;
    }
    dst_.value(id).type = v.type;
    map_[i] = id;
  }
}

ValueId GraphBuilder::map(ValueId old) const {
  if (old == kNoValue) return kNoValue;
  KILN_ASSERT(src_.valid(old));
  ValueId v = map_[size_t(old)];
  if (v == kNoValue)
    fail_kind(ErrorKind::Internal, "graph rewrite: value %{} is used but was dropped",
              src_.value(old).name);
  return v;
}

std::vector<ValueId> GraphBuilder::map(const std::vector<ValueId>& olds) const {
  std::vector<ValueId> out;
  out.reserve(olds.size());
  for (ValueId v : olds) out.push_back(map(v));
  return out;
}

bool GraphBuilder::is_mapped(ValueId old) const {
  return old != kNoValue && src_.valid(old) && map_[size_t(old)] != kNoValue;
}

void GraphBuilder::set_map(ValueId old, ValueId now) {
  KILN_ASSERT(src_.valid(old) && dst_.valid(now));
  map_[size_t(old)] = now;
}

std::string GraphBuilder::fresh_name(std::string_view base) { return fresh_name_for(base, kNoValue); }

std::string GraphBuilder::fresh_name_for(std::string_view base, ValueId self) {
  std::string b(base.empty() ? "v" : base);
  auto taken = [&](const std::string& n) {
    if (src_.find_value(n) != kNoValue) return true;
    ValueId holder = dst_.find_value(n);
    return holder != kNoValue && holder != self;
  };
  if (!taken(b)) return b;
  for (int i = 1;; ++i) {
    std::string cand = fmt::format("{}_{}", b, i);
    if (!taken(cand)) return cand;
  }
}

void GraphBuilder::name_outputs(const std::vector<ValueId>& outs,
                                const std::vector<std::string>& names, std::string_view hint,
                                OpId op) {
  for (size_t i = 0; i < outs.size(); ++i) {
    std::string want;
    if (i < names.size() && !names[i].empty()) {
      want = names[i];
      ValueId holder = dst_.find_value(want);
      KILN_ASSERT(holder == kNoValue || holder == outs[i]);
    } else {
      // The name add_node gave this value counts as free (it is about to be replaced).
      std::string base(hint.empty() ? std::string_view(op_def(op).name) : hint);
      want = fresh_name_for(base, outs[i]);
    }
    dst_.rename_value(outs[i], std::move(want));
  }
}

void GraphBuilder::copy_node(const Node& old) {
  std::vector<ValueId> outs = dst_.add_node(old.op, map(old.inputs), old.attrs, old.name);
  KILN_ASSERT(outs.size() == old.outputs.size());
  std::vector<std::string> names;
  for (size_t i = 0; i < outs.size(); ++i) {
    names.push_back(src_.value(old.outputs[i]).name);
    map_[size_t(old.outputs[i])] = outs[i];
  }
  name_outputs(outs, names, "", old.op);
}

std::vector<ValueId> GraphBuilder::add_node(OpId op, std::vector<ValueId> inputs,
                                            const Attrs& attrs, std::string node_name,
                                            std::vector<std::string> output_names,
                                            std::string_view name_hint) {
  std::vector<ValueId> outs = dst_.add_node(op, std::move(inputs), attrs, std::move(node_name));
  name_outputs(outs, output_names, name_hint, op);
  return outs;
}

ValueId GraphBuilder::add_node1(OpId op, std::vector<ValueId> inputs, const Attrs& attrs,
                                std::string node_name, std::string output_name,
                                std::string_view name_hint) {
  std::vector<ValueId> outs =
      add_node(op, std::move(inputs), attrs, std::move(node_name), {std::move(output_name)},
               name_hint);
  KILN_ASSERT(outs.size() == 1);
  return outs[0];
}

ValueId GraphBuilder::add_const(Tensor data, std::string exact_name, std::string_view hint) {
  if (exact_name.empty()) exact_name = fresh_name(hint);
  KILN_ASSERT(dst_.find_value(exact_name) == kNoValue);
  return dst_.add_const(std::move(data), std::move(exact_name));
}

ValueId GraphBuilder::add_param(Tensor data, std::string exact_name, std::string_view hint) {
  if (exact_name.empty()) exact_name = fresh_name(hint);
  KILN_ASSERT(dst_.find_value(exact_name) == kNoValue);
  return dst_.add_param(std::move(exact_name), std::move(data));
}

ValueId GraphBuilder::add_derived(const Value& from, Tensor data, std::string_view suffix) {
  std::string name = fresh_name(from.name + std::string(suffix));
  return from.kind == ValueKind::Param ? add_param(std::move(data), std::move(name))
                                       : add_const(std::move(data), std::move(name));
}

bool all_equal(const Ints& v, int64_t x) {
  for (int64_t e : v)
    if (e != x) return false;
  return true;
}

bool plain_conv2d(const Graph& g, const Node& n) {
  if (n.op != OpId::Conv2d || n.inputs.size() < 2 || n.outputs.size() != 1) return false;
  const TensorType& xt = g.type(n.inputs[0]);
  const TensorType& wt = g.type(n.inputs[1]);
  return xt.rank() == 4 && wt.rank() == 4 && is_concrete(xt.shape) && is_concrete(wt.shape) &&
         is_floating(xt.dtype) && wt.dtype == xt.dtype && n.attrs.get_int("groups") == 1 &&
         all_equal(n.attrs.get_ints("padding"), 0) && all_equal(n.attrs.get_ints("dilation"), 1);
}

bool has_data(const Value& v) {
  return (v.kind == ValueKind::Param || v.kind == ValueKind::Const) && v.data.defined() &&
         v.data.has_storage();
}

const Node* producer_of(const Graph& g, ValueId v) {
  if (!g.valid(v)) return nullptr;
  const Value& val = g.value(v);
  if (val.kind != ValueKind::NodeOutput || val.producer < 0) return nullptr;
  return &g.nodes[size_t(val.producer)];
}

const Node* GraphBuilder::producer_of(ValueId v) const { return kiln::producer_of(dst_, v); }

Tensor const_data_f64(const Graph& g, ValueId v) {
  if (!g.valid(v)) return Tensor();
  const Value& val = g.value(v);
  if (val.kind != ValueKind::Const || !val.data.defined()) return Tensor();
  return val.data.to(Device::cpu()).to(DType::Float64).contiguous();
}

Tensor GraphBuilder::data_of(ValueId v) const {
  if (!dst_.valid(v)) return Tensor();
  const Value& val = dst_.value(v);
  if (val.kind != ValueKind::Param && val.kind != ValueKind::Const) return Tensor();
  if (!val.data.defined() || !val.data.has_storage()) return Tensor();
  return val.data;
}

Graph GraphBuilder::finish() {
  for (ValueId out : src_.outputs) dst_.outputs.push_back(map(out));
  return std::move(dst_);
}

std::vector<bool> live_nodes(const Graph& g) {
  std::vector<bool> live_value(g.values.size(), false), live(g.nodes.size(), false);
  for (ValueId v : g.outputs)
    if (g.valid(v)) live_value[size_t(v)] = true;
  for (size_t i = g.nodes.size(); i-- > 0;) {
    const Node& n = g.nodes[i];
    bool any = false;
    for (ValueId o : n.outputs) any = any || (g.valid(o) && live_value[size_t(o)]);
    if (!any) continue;
    live[i] = true;
    for (ValueId in : n.inputs)
      if (g.valid(in)) live_value[size_t(in)] = true;
  }
  return live;
}

std::vector<int> live_use_counts(const Graph& g) {
  std::vector<bool> live = live_nodes(g);
  std::vector<int> counts(g.values.size(), 0);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (!live[i]) continue;
    for (ValueId v : g.nodes[i].inputs)
      if (g.valid(v)) ++counts[size_t(v)];
  }
  for (ValueId v : g.outputs)
    if (g.valid(v)) ++counts[size_t(v)];
  return counts;
}

bool attrs_concrete(const Attrs& attrs) {
  for (auto& [name, v] : attrs.items()) {
    if (auto* i = std::get_if<int64_t>(&v); i && SymInt::from_raw(*i).is_symbolic()) return false;
    if (auto* is = std::get_if<Ints>(&v))
      for (int64_t x : *is)
        if (SymInt::from_raw(x).is_symbolic()) return false;
  }
  return true;
}

}  // namespace kiln
