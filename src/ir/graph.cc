#include "ir/graph.h"

#include <fmt/format.h>

namespace kiln {

namespace {

// "graph 'main'" or "node 'stem.conv1'": the place named by errors from add_node.
std::string node_where(const Graph& g, std::string_view node_name) {
  if (node_name.empty()) return fmt::format("graph '{}'", g.name);
  return fmt::format("node '{}'", node_name);
}

}  // namespace

void Graph::sync_index() const {
  if (indexed_values_ > values.size()) {  // values were removed: start over
    name_index_.clear();
    indexed_values_ = 0;
  }
  for (; indexed_values_ < values.size(); ++indexed_values_)
    name_index_.emplace(values[indexed_values_].name, ValueId(indexed_values_));
}

ValueId Graph::find_value(std::string_view name) const {
  ValueId v = lookup_indexed(name);
  if (v != kNoValue) return v;
  for (size_t i = 0; i < values.size(); ++i)
    if (values[i].name == name) {  // renamed behind the index's back: rebuild it
      name_index_.clear();
      indexed_values_ = 0;
      sync_index();
      return ValueId(i);
    }
  return kNoValue;
}

ValueId Graph::lookup_indexed(std::string_view name) const {
  sync_index();
  std::string key(name);
  auto it = name_index_.find(key);
  if (it != name_index_.end() && valid(it->second) && values[size_t(it->second)].name == name)
    return it->second;
  if (it == name_index_.end()) return kNoValue;
  // Stale entry: a value was renamed or replaced behind the index's back. Rebuild once.
  name_index_.clear();
  indexed_values_ = 0;
  sync_index();
  it = name_index_.find(key);
  return it == name_index_.end() ? kNoValue : it->second;
}

std::string Graph::unique_name(std::string_view base) {
  std::string b(base.empty() ? "v" : base);
  if (lookup_indexed(b) == kNoValue) return b;
  int& n = next_suffix_[b];
  for (;;) {
    std::string cand = fmt::format("{}_{}", b, ++n);
    if (lookup_indexed(cand) == kNoValue) return cand;
  }
}

void Graph::rename_value(ValueId v, std::string name) {
  KILN_CHECK(valid(v), "graph '{}': rename of value {} out of range (graph has {} values)",
             this->name, v, values.size());
  KILN_CHECK(!name.empty(), "graph '{}': value names must not be empty", this->name);
  if (values[size_t(v)].name == name) return;
  ValueId other = lookup_indexed(name);
  KILN_CHECK(other == kNoValue, "graph '{}': cannot rename %{} to %{}: the name is taken",
             this->name, values[size_t(v)].name, name);
  sync_index();
  auto it = name_index_.find(values[size_t(v)].name);
  if (it != name_index_.end() && it->second == v) name_index_.erase(it);
  values[size_t(v)].name = std::move(name);
  name_index_[values[size_t(v)].name] = v;
}

ValueId Graph::new_value(std::string vname, TensorType type, ValueKind kind) {
  KILN_CHECK(lookup_indexed(vname) == kNoValue, "graph '{}' already has a value named '{}'", name,
             vname);
  sync_index();
  Value v;
  v.type = std::move(type);
  v.name = std::move(vname);
  v.kind = kind;
  values.push_back(std::move(v));
  ValueId id = ValueId(values.size() - 1);
  name_index_.emplace(values.back().name, id);
  indexed_values_ = values.size();
  return id;
}

ValueId Graph::add_input(std::string vname, TensorType type) {
  if (vname.empty()) vname = unique_name("input");
  ValueId id = new_value(std::move(vname), std::move(type), ValueKind::Input);
  inputs.push_back(id);
  return id;
}

ValueId Graph::add_param(std::string vname, Tensor data) {
  KILN_CHECK(data.defined(),
             "graph '{}': param '{}' needs data (use add_param_decl for a "
             "type-only declaration)",
             name, vname);
  if (vname.empty()) vname = unique_name("param");
  ValueId id = new_value(std::move(vname), data.type(), ValueKind::Param);
  values[size_t(id)].data = std::move(data);
  return id;
}

ValueId Graph::add_param_decl(std::string vname, TensorType type) {
  if (vname.empty()) vname = unique_name("param");
  return new_value(std::move(vname), std::move(type), ValueKind::Param);
}

ValueId Graph::add_const(Tensor data, std::string vname) {
  KILN_CHECK(data.defined() && data.has_storage(), "graph '{}': const '{}' needs data", name,
             vname);
  if (vname.empty()) vname = unique_name("const");
  ValueId id = new_value(std::move(vname), data.type(), ValueKind::Const);
  values[size_t(id)].data = std::move(data);
  return id;
}

std::vector<ValueId> Graph::add_node(OpId op, std::vector<ValueId> node_inputs, const Attrs& attrs,
                                     std::string node_name) {
  KILN_CHECK(size_t(op) < size_t(kNumOps), "graph '{}': op id {} is not a registered op", name,
             int(op));
  const OpDef& def = op_def(op);
  std::string where = node_where(*this, node_name);
  def.check_arity(node_inputs.size(), where);

  // Input ids must exist; kNoValue only where the schema allows an absent input.
  std::vector<const TensorType*> in_types(node_inputs.size(), nullptr);
  for (size_t i = 0; i < node_inputs.size(); ++i) {
    ValueId v = node_inputs[i];
    size_t spec = std::min(i, def.inputs.size() - 1);  // variadic tail shares the last spec
    const char* in_name = def.inputs.empty() ? "?" : def.inputs[spec].name.c_str();
    if (v == kNoValue) {
      bool optional = !def.inputs.empty() && def.inputs[spec].optional;
      KILN_CHECK(optional, "{}: op '{}' input {} ('{}') is required but absent", where, def.name, i,
                 in_name);
      continue;
    }
    KILN_CHECK(valid(v),
               "{}: op '{}' input {} ('{}') refers to value {}, which does not exist "
               "(graph has {} values)",
               where, def.name, i, in_name, v, values.size());
    in_types[i] = &values[size_t(v)].type;
  }

  Attrs canonical = def.canonicalize(attrs, where);
  if (!def.infer)
    fail_kind(ErrorKind::NotSupported, "{}: op '{}' has no shape inference registered", where,
              def.name);
  InferContext ctx{def, node_name, std::span<const TensorType* const>(in_types), canonical};
  std::vector<TensorType> out_types = def.infer(ctx);
  if (def.num_outputs >= 0 && out_types.size() != size_t(def.num_outputs))
    fail_kind(ErrorKind::Internal, "{}: op '{}' inference returned {} outputs; its schema says {}",
              where, def.name, out_types.size(), def.num_outputs);

  Node node;
  node.op = op;
  node.attrs = std::move(canonical);
  node.inputs = std::move(node_inputs);
  node.name = std::move(node_name);
  int32_t node_index = int32_t(nodes.size());
  std::string base = node.name.empty() ? std::string(def.name) : node.name;
  for (size_t i = 0; i < out_types.size(); ++i) {
    ValueId id = new_value(unique_name(base), std::move(out_types[i]), ValueKind::NodeOutput);
    values[size_t(id)].producer = node_index;
    values[size_t(id)].output_index = int32_t(i);
    node.outputs.push_back(id);
  }
  nodes.push_back(std::move(node));
  return nodes.back().outputs;
}

ValueId Graph::add_node1(OpId op, std::vector<ValueId> node_inputs, const Attrs& attrs,
                         std::string node_name) {
  size_t old_values = values.size();
  std::vector<ValueId> out = add_node(op, std::move(node_inputs), attrs, node_name);
  if (out.size() != 1) {
    // Undo, so that a failed call leaves the graph as it was.
    nodes.pop_back();
    values.resize(old_values);
    name_index_.clear();
    indexed_values_ = 0;
    fail("graph '{}': op '{}'{} has {} outputs; use add_node for multi-output ops", name,
         op_def(op).name, node_name.empty() ? "" : " (node '" + node_name + "')", out.size());
  }
  return out[0];
}

std::vector<ValueId> Graph::params() const {
  std::vector<ValueId> out;
  for (size_t i = 0; i < values.size(); ++i)
    if (values[i].kind == ValueKind::Param || values[i].kind == ValueKind::Const)
      out.push_back(ValueId(i));
  return out;
}

std::vector<int> Graph::use_counts() const {
  std::vector<int> counts(values.size(), 0);
  for (const Node& n : nodes)
    for (ValueId v : n.inputs)
      if (valid(v)) ++counts[size_t(v)];
  for (ValueId v : outputs)
    if (valid(v)) ++counts[size_t(v)];
  return counts;
}

Graph graph_on_device(const Graph& g, Device device) {
  Graph out = g;
  for (Value& v : out.values) {
    v.type.device = device;
    if (v.data.defined() && v.data.device() != device) v.data = v.data.to(device);
  }
  return out;
}

}  // namespace kiln
