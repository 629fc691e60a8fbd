// Internal to the ONNX frontend: the import state and the per-node context that converters
// (op_table.h) use. Includes the protobuf classes; keep it out of other layers.
#pragma once
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "frontends/onnx/importer.h"
#include "frontends/onnx/op_table.h"
#include "ir/graph.h"

namespace kiln::onnx {

namespace pb = ::onnx;

// ---- protobuf data -----------------------------------------------------------------------------
// ONNX TensorProto.DataType -> Kiln dtype; false for types Kiln cannot represent.
bool dtype_from_onnx(int32_t onnx_type, DType* out);
// "float", "uint16", "string", ... (for messages).
std::string onnx_type_name(int32_t onnx_type);
int32_t onnx_type_from_dtype(DType d);

// A TensorProto's data as a Tensor. Validates dims, the data size against the dims, and
// `max_bytes`; reads external data from `model_dir` (never outside it). `what` names the tensor
// in errors ("initializer 'w' in model.onnx").
Tensor tensor_from_proto(const pb::TensorProto& t, const std::string& model_dir,
                         int64_t max_bytes, const std::string& what);

// ---- import state ------------------------------------------------------------------------------
// An operand: an ONNX value (or an intermediate of a composed mapping) during import. It is
// materialized into a Kiln value only when a node reads it as a tensor or it is a graph output,
// so initializers read only as attributes and folded intermediates never reach the graph.
using V = int32_t;
inline constexpr V kNone = -1;

struct Operand {
  TensorType type;
  ValueId id = kNoValue;  // the Kiln value, once materialized
  Tensor data;            // known at import time: initializer, constant or folded result
  std::string name;       // ONNX name (initializers keep it as the param name)
  bool is_initializer = false;
  // Graph inputs (operand ids) this value is computed from, for "needed at import time"
  // reports (ImportOptions::needed_constant_inputs); capped, see kMaxRoots.
  std::vector<V> roots;
  // A small integer tensor (rank 0 or 1) whose values are symbolic dims: the result of Shape
  // or Size on a tensor with symbolic dims, and of shape arithmetic on such values. It has no
  // data and never becomes a Kiln value; ops that read it as a shape (Reshape, Expand,
  // ConstantOfShape) take its SymInts as attributes. See NodeCtx::sym_eval.
  bool is_sym = false;
  std::vector<SymInt> sym;
};
inline constexpr size_t kMaxRoots = 16;

struct ImportState {
  Graph graph;
  std::vector<Operand> operands;
  std::unordered_map<std::string, V> by_name;  // ONNX value name -> operand
  ImportOptions options;
  std::string source;     // the model file, for messages
  std::string model_dir;  // external data root ("" = none allowed)
  int64_t opset = 0;      // default domain
  // Note [Data-dependent tails] (importer.h): evaluating a tail at run time, every operand is
  // known and every op folds (whatever its size, over initializers too); nothing is emitted.
  bool evaluate = false;
  // Set when a converter needed the value of a tensor computed at run time (not a symbolic
  // dim): the node, and every node that reads what it makes, can run in a tail.
  bool hit_data_dependent = false;

  V add_operand(Operand o);
  ValueId materialize(V v);
};

// ---- the per-node context ----------------------------------------------------------------------
class NodeCtx {
 public:
  NodeCtx(ImportState& st, const pb::NodeProto& node, const OnnxOpEntry& entry,
          std::string node_name);

  // ---- the node
  const std::string& name() const { return name_; }
  const std::string& op_type() const { return node_.op_type(); }
  int64_t opset() const { return st_.opset; }
  const ImportOptions& options() const { return st_.options; }
  // "model.onnx: node 'conv1' (Conv)" (unnamed nodes are named OpType_<index>)
  std::string where() const;
  template <typename... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) const {
    throw_error(ErrorKind::InvalidArgument,
                where() + ": " + fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  [[noreturn]] void not_supported(fmt::format_string<Args...> f, Args&&... args) const {
    throw_error(ErrorKind::NotSupported,
                where() + ": " + fmt::format(f, std::forward<Args>(args)...));
  }

  // ---- inputs
  size_t num_inputs() const { return size_t(node_.input_size()); }
  bool has_input(size_t i) const;  // present with a non-empty name
  V in(size_t i);                  // required input
  V in_opt(size_t i);              // kNone when absent

  // By value: emitting appends operands, which would invalidate references.
  TensorType type(V v) const { return st_.operands[size_t(v)].type; }
  DType dtype(V v) const { return st_.operands[size_t(v)].type.dtype; }
  int rank(V v) const { return st_.operands[size_t(v)].type.rank(); }
  Shape shape(V v) const { return st_.operands[size_t(v)].type.shape; }
  // The concrete sizes of v; NotSupported naming `what` when a dim is symbolic.
  Dims dims(V v, std::string_view what) const;
  // Data known at import time, else nullptr; use it before emitting anything (emission moves
  // operands).
  const Tensor* known(V v) const;

  // Shape-like inputs read at import time (an initializer, a Constant or a folded value). When
  // the value is computed at run time the node is data-dependent: NotSupported naming it.
  Tensor known_input(size_t i, std::string_view what);
  // `saturate`: values beyond Kiln's integer range (below -2^62, e.g. INT64_MIN as Slice's
  // "from the end" sentinel) become -2^62 instead of an error (for bounds that are clamped).
  std::vector<int64_t> ints_input(size_t i, std::string_view what, bool saturate = false);
  // A shape-like integer input whose values may be symbolic dims (see Operand::is_sym).
  std::vector<SymInt> shape_input(size_t i, std::string_view what);
  // Values of a known or symbolic integer tensor of rank <= 1; nullopt otherwise.
  std::optional<std::vector<SymInt>> sym_values(V v) const;
  // A rank-0 (scalar) or rank-1 int64 value from SymInts: a constant when all are concrete.
  V sym_value(std::vector<SymInt> values, bool scalar);
  std::vector<double> floats_input(size_t i, std::string_view what);

  // ---- attributes (every attribute of the node must be read or explicitly ignored; see
  // check_attrs_used)
  bool has_attr(std::string_view name) const;
  int64_t attr_int(std::string_view name, int64_t def);
  std::optional<int64_t> attr_int_opt(std::string_view name);
  double attr_float(std::string_view name, double def);
  std::string attr_string(std::string_view name, std::string def);
  std::vector<int64_t> attr_ints(std::string_view name, std::vector<int64_t> def = {});
  std::optional<std::vector<int64_t>> attr_ints_opt(std::string_view name);
  std::vector<double> attr_floats(std::string_view name, std::vector<double> def = {});
  std::vector<std::string> attr_strings(std::string_view name);
  std::optional<Tensor> attr_tensor_opt(std::string_view name);
  // A GRAPH attribute (If's branches); nullptr when absent.
  const pb::GraphProto* attr_graph(std::string_view name);
  ImportState& state() { return st_; }
  // Marks an attribute as deliberately ignored (no effect on inference results).
  void ignore_attr(std::string_view name);
  // Throws NotSupported for an attribute the converter did not read.
  void check_attrs_used() const;

  // ---- emitting Kiln nodes. Absent optional inputs are kNone. When every input is known and
  // the result is small, the op runs now and its result is a constant (folding).
  std::vector<V> op(OpId op, const std::vector<V>& inputs, const Attrs& attrs = {});
  V op1(OpId op, const std::vector<V>& inputs, const Attrs& attrs = {});
  V constant(Tensor t);
  V scalar(double value, DType dtype);  // 0-d constant
  V cast(V x, DType to);                // no node when x already has that dtype

  // Common compositions.
  V add(V a, V b) { return op1(OpId::Add, {a, b}); }
  V sub(V a, V b) { return op1(OpId::Sub, {a, b}); }
  V mul(V a, V b) { return op1(OpId::Mul, {a, b}); }
  V div(V a, V b) { return op1(OpId::Div, {a, b}); }
  V reshape(V x, const Shape& shape);
  V unsqueeze(V x, std::vector<int64_t> dims);
  V squeeze(V x, std::vector<int64_t> dims);
  V permute(V x, std::vector<int64_t> dims);
  V slice(V x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
  // A tensor of `shape` filled with `value`: expand of a scalar (folded when small).
  V full(const Shape& shape, double value, DType dtype);
  // The permutation that moves dim `axis` of a rank-r tensor last (its own inverse is
  // inverse_perm).
  static std::vector<int64_t> perm_to_last(int r, int64_t axis);
  static std::vector<int64_t> inverse_perm(const std::vector<int64_t>& p);

  // ---- outputs
  size_t num_outputs() const { return size_t(node_.output_size()); }
  bool wants_output(size_t i) const;  // present with a non-empty name
  void out(size_t i, V v);

  // Axis of a rank-r tensor, negative counted from the end; fails naming `what`.
  int64_t axis(int64_t a, int r, std::string_view what) const;

 private:
  const pb::AttributeProto* find_attr(std::string_view name, int type) const;
  // Evaluates op on inputs of which at least one is symbolic (shape arithmetic).
  std::vector<V> sym_eval(OpId op, const std::vector<V>& inputs, const Attrs& attrs);
  [[noreturn]] void data_dependent(size_t i, std::string_view what);
  ImportState& st_;
  const pb::NodeProto& node_;
  const OnnxOpEntry& entry_;
  std::string name_;
  size_t first_value_;  // graph values created by this node start here (for naming)
  mutable std::vector<bool> attr_used_;
};

// Imports a subgraph (an If branch without inputs) in place: its initializers and nodes in the
// enclosing state, reading the enclosing scope's values. Returns its outputs. `which` names it.
std::vector<V> import_branch(NodeCtx& c, const pb::GraphProto& g, std::string_view which);

// Conv over x and w (and bias b, or kNone) with the node's Conv attributes (auto_pad, pads,
// strides, dilations, group, kernel_shape); 1-D to 3-D. Shared by Conv, ConvInteger, QLinearConv.
V emit_conv(NodeCtx& c, V x, V w, V b);
// Kiln ops emit_conv may use (for op-table entries).
std::vector<OpId> conv_kiln_ops();

}  // namespace kiln::onnx
