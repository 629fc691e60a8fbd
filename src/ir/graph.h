// The graph IR. See Note [Graph IR].
//
// Note [Graph IR]
// A Graph is a flat SSA program: `values` (each with a TensorType) and `nodes` (op + attributes
// + input values -> output values) kept in topological order. Values are referred to by index
// (ValueId); an absent optional input is kNoValue. A value is one of:
//   - Input: a graph input (runtime argument), in `inputs` order;
//   - Param: a frozen parameter or buffer (name + Tensor data, possibly absent in IR text);
//   - Const: a constant (always has data; small ones print inline);
//   - NodeOutput: produced by exactly one node.
// Node names carry provenance (ONNX node name, module path, C++ call site) for error messages.
// Types are produced by the op registry's inference when a node is added, so a graph built
// through add_node is well-typed by construction; the verifier re-checks after every pass.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "ops/op.h"

namespace kiln {

using ValueId = int32_t;
inline constexpr ValueId kNoValue = -1;

enum class ValueKind : uint8_t { Input, Param, Const, NodeOutput };

struct Value {
  TensorType type;
  std::string name;  // unique within the graph; printed as %name
  ValueKind kind = ValueKind::NodeOutput;
  int32_t producer = -1;  // node index for NodeOutput
  int32_t output_index = 0;
  Tensor data;  // Param / Const data (Param may lack data when parsed from text)
};

struct Node {
  OpId op{};
  Attrs attrs;  // canonical (defaults filled) once added to a graph
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  std::string name;  // provenance, may be empty
};

class Graph {
 public:
  std::string name = "main";
  std::vector<Value> values;
  std::vector<Node> nodes;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;

  // Names must be unique in the graph (a taken name throws); an empty name gets a fresh one.
  ValueId add_input(std::string name, TensorType type);
  ValueId add_param(std::string name, Tensor data);
  // A parameter known only by type (IR text without weights).
  ValueId add_param_decl(std::string name, TensorType type);
  ValueId add_const(Tensor data, std::string name = "");
  // Canonicalizes attrs, checks arity and input ids, infers output types through the registry
  // (errors name the node: "op 'conv2d' (node 'stem.conv1'): ...") and appends the node. Its
  // outputs are named after the node (else the op), made unique. Returns its output values.
  std::vector<ValueId> add_node(OpId op, std::vector<ValueId> inputs, const Attrs& attrs = {},
                                std::string node_name = "");
  ValueId add_node1(OpId op, std::vector<ValueId> inputs, const Attrs& attrs = {},
                    std::string node_name = "");

  const Value& value(ValueId v) const { return values[size_t(v)]; }
  Value& value(ValueId v) { return values[size_t(v)]; }
  const TensorType& type(ValueId v) const { return values[size_t(v)].type; }

  // Params and consts in creation order.
  std::vector<ValueId> params() const;
  // A name not yet used by any value, derived from `base` ("relu", then "relu_1", ...).
  std::string unique_name(std::string_view base);
  // kNoValue if absent. Exact even after passes write Value::name directly (a miss then costs
  // a scan of the values).
  ValueId find_value(std::string_view name) const;
  // Renames a value, keeping names unique (throws if `name` is taken by another value).
  // Rename through here rather than writing Value::name: it keeps find_value O(1).
  void rename_value(ValueId v, std::string name);
  // True when v is a valid index into `values`.
  bool valid(ValueId v) const { return v >= 0 && size_t(v) < values.size(); }

  // Number of uses of every value (node inputs + graph outputs).
  std::vector<int> use_counts() const;

 private:
  ValueId new_value(std::string name, TensorType type, ValueKind kind);
  // name -> value. Values appended straight to `values` are indexed lazily; a hit whose value
  // no longer carries that name (a pass wrote Value::name) triggers a rebuild. Because const
  // lookups update this cache, a Graph must not be read from several threads at once.
  void sync_index() const;
  // find_value through the index only (a miss is trusted): the O(1) path for naming.
  ValueId lookup_indexed(std::string_view name) const;
  mutable std::unordered_map<std::string, ValueId> name_index_;
  mutable size_t indexed_values_ = 0;
  std::unordered_map<std::string, int> next_suffix_;  // unique_name's counter per base
};

// A copy of `g` whose every value lives on `device`: types retargeted, parameter and constant data
// copied there (the ONNX importer makes CPU graphs; `kiln run MODEL.onnx --device cuda` traces
// this copy with device inputs).
Graph graph_on_device(const Graph& g, Device device);

}  // namespace kiln
