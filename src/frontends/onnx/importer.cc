// ONNX model -> Kiln Graph. See Note [ONNX import].
#include "frontends/onnx/importer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <source_location>

#include <google/protobuf/io/coded_stream.h>

#include "frontends/onnx/convert.h"
#include "ir/interpreter.h"
#include "ops/dispatch.h"

namespace kiln {

namespace fs = std::filesystem;
using namespace kiln::onnx;

namespace {

// The newest default-domain opset this importer knows: opset 28, the newest of the PyPI onnx
// package (1.23) whose backend tests Kiln runs; every mapped op handles its versions up to it
// (see docs/onnx.md, "Opsets"). A newer model may use op versions whose semantics changed; it is
// rejected rather than imported with old semantics.
constexpr int64_t kMaxOpset = 28;
constexpr int64_t kMinOpset = 1;

std::string read_file(const std::string& path, int64_t max_bytes) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    fail_kind(ErrorKind::InvalidArgument, "{}: no such model file", path);
  auto size = int64_t(fs::file_size(path, ec));
  if (ec) fail_kind(ErrorKind::Runtime, "{}: cannot stat: {}", path, ec.message());
  if (size > max_bytes)
    fail_kind(ErrorKind::NotSupported, "{}: {} bytes exceeds the {}-byte model limit", path, size,
              max_bytes);
  std::string bytes(size_t(size), '\0');
  std::ifstream in(path, std::ios::binary);
  in.read(bytes.data(), std::streamsize(size));
  if (!in) fail_kind(ErrorKind::Runtime, "{}: cannot read the file", path);
  return bytes;
}

template <typename Msg>
void parse_proto(Msg& msg, std::string_view bytes, const std::string& source, const char* what) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            int(bytes.size()));
  in.SetRecursionLimit(64);
  if (!msg.ParseFromCodedStream(&in) || !in.ConsumedEntireMessage())
    fail_kind(ErrorKind::ParseError,
              "{}: not a valid {} (protobuf parse failed: the file is truncated, corrupt or not "
              "ONNX)", source, what);
}

int64_t default_opset(const pb::ModelProto& m, const std::string& source) {
  int64_t opset = -1;
  for (const pb::OperatorSetIdProto& o : m.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") opset = o.version();
  if (opset < 0) {
    if (m.opset_import_size() == 0 && m.ir_version() <= 2) return 1;  // IR v1/v2 predate opsets
    fail_kind(ErrorKind::ParseError, "{}: the model imports no default-domain (ai.onnx) opset",
              source);
  }
  if (opset < kMinOpset)
    fail_kind(ErrorKind::ParseError, "{}: invalid ai.onnx opset {}", source, opset);
  if (opset > kMaxOpset)
    fail_kind(ErrorKind::NotSupported,
              "{}: ai.onnx opset {} is newer than this importer knows ({}); re-export with "
              "opset_version <= {}", source, opset, kMaxOpset, kMaxOpset);
  return opset;
}

bool default_domain(const std::string& d) { return d.empty() || d == "ai.onnx"; }

std::string node_display_name(const pb::NodeProto& n, size_t index) {
  return n.name().empty() ? fmt::format("{}_{}", n.op_type(), index) : n.name();
}

std::string op_key(const pb::NodeProto& n) {
  return default_domain(n.domain()) ? n.op_type() : n.domain() + ":" + n.op_type();
}

// Op types not in the table, with their nodes (in graph order).
// Subgraphs (If's branches) count: a branch runs through the same table.
void collect_unmapped(const pb::GraphProto& g,
                      std::vector<std::pair<std::string, std::vector<std::string>>>& out) {
  for (int i = 0; i < g.node_size(); ++i) {
    const pb::NodeProto& n = g.node(i);
    for (const pb::AttributeProto& a : n.attribute())
      if (a.has_g()) collect_unmapped(a.g(), out);
    if (default_domain(n.domain()) && find_onnx_op(n.op_type())) continue;
    std::string key = op_key(n);
    auto it = std::find_if(out.begin(), out.end(), [&](auto& p) { return p.first == key; });
    if (it == out.end()) it = out.insert(out.end(), {key, {}});
    it->second.push_back(node_display_name(n, size_t(i)));
  }
}

std::vector<std::pair<std::string, std::vector<std::string>>> unmapped_ops(
    const pb::GraphProto& g) {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  collect_unmapped(g, out);
  return out;
}

// The outer-scope values a subgraph reads (recursively): names it uses that none of its own
// inputs, initializers or nodes define. They are inputs of the node that owns the subgraph.
void subgraph_reads(const pb::GraphProto& g, std::set<std::string> defined,
                    std::vector<std::string>& out) {
  for (const pb::ValueInfoProto& vi : g.input()) defined.insert(vi.name());
  for (const pb::TensorProto& t : g.initializer()) defined.insert(t.name());
  for (const pb::NodeProto& n : g.node())
    for (const std::string& o : n.output()) defined.insert(o);
  auto use = [&](const std::string& name) {
    if (!name.empty() && !defined.count(name) &&
        std::find(out.begin(), out.end(), name) == out.end())
      out.push_back(name);
  };
  for (const pb::NodeProto& n : g.node()) {
    for (const std::string& in : n.input()) use(in);
    for (const pb::AttributeProto& a : n.attribute())
      if (a.has_g()) subgraph_reads(a.g(), defined, out);
  }
  for (const pb::ValueInfoProto& vi : g.output()) use(vi.name());
}

// What each node reads: its inputs, then what its subgraphs read from the enclosing scopes.
std::vector<std::vector<std::string>> node_reads(const pb::GraphProto& g) {
  std::vector<std::vector<std::string>> reads(size_t(g.node_size()));
  for (int i = 0; i < g.node_size(); ++i) {
    const pb::NodeProto& n = g.node(i);
    for (const std::string& in : n.input())
      if (!in.empty()) reads[size_t(i)].push_back(in);
    for (const pb::AttributeProto& a : n.attribute())
      if (a.has_g()) {
        std::vector<std::string> sub;
        subgraph_reads(a.g(), {}, sub);
        for (std::string& name : sub)
          if (std::find(reads[size_t(i)].begin(), reads[size_t(i)].end(), name) ==
              reads[size_t(i)].end())
            reads[size_t(i)].push_back(std::move(name));
      }
  }
  return reads;
}

std::string describe_type(const pb::TypeProto& t) {
  switch (t.value_case()) {
    case pb::TypeProto::kTensorType: return onnx_type_name(t.tensor_type().elem_type());
    case pb::TypeProto::kSequenceType: return "sequence";
    case pb::TypeProto::kMapType: return "map";
    case pb::TypeProto::kOptionalType: return "optional";
    case pb::TypeProto::kSparseTensorType: return "sparse tensor";
    default: return "an unknown type";
  }
}

bool representable(const pb::TypeProto& t) {
  DType d = DType::Float32;
  return t.value_case() == pb::TypeProto::kTensorType &&
         dtype_from_onnx(t.tensor_type().elem_type(), &d);
}

TensorType input_type(const pb::ValueInfoProto& vi, const std::string& source) {
  std::string what = fmt::format("{}: graph input '{}'", source, vi.name());
  if (!vi.has_type() || vi.type().value_case() != pb::TypeProto::kTensorType)
    fail_kind(ErrorKind::NotSupported, "{}: type {} is not supported (Kiln takes tensors)", what,
              vi.has_type() ? describe_type(vi.type()) : "(missing)");
  const pb::TypeProto::Tensor& tt = vi.type().tensor_type();
  TensorType type;
  if (!dtype_from_onnx(tt.elem_type(), &type.dtype))
    fail_kind(ErrorKind::NotSupported, "{}: element type {} is not supported by Kiln", what,
              onnx_type_name(tt.elem_type()));
  if (!tt.has_shape())
    fail_kind(ErrorKind::NotSupported,
              "{}: the model does not declare its shape (rank); Kiln needs at least the rank", what);
  if (tt.shape().dim_size() > kMaxRank)
    fail_kind(ErrorKind::NotSupported, "{}: rank {} exceeds Kiln's maximum rank {}", what,
              tt.shape().dim_size(), kMaxRank);
  for (int j = 0; j < tt.shape().dim_size(); ++j) {
    const pb::TensorShapeProto::Dimension& d = tt.shape().dim(j);
    if (d.has_dim_value()) {
      if (d.dim_value() < 0)
        fail_kind(ErrorKind::InvalidArgument, "{}: dim {} is negative ({})", what, j,
                  d.dim_value());
      type.shape.push_back(SymInt(d.dim_value()));
    } else {
      // A named dim becomes a symbol; an anonymous one gets a name of its own.
      std::string sym = d.has_dim_param() && !d.dim_param().empty()
                            ? d.dim_param()
                            : fmt::format("{}_dim{}", vi.name(), j);
      std::string clean;
      for (char c : sym) clean += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      if (clean.empty() || std::isdigit(static_cast<unsigned char>(clean[0]))) clean = "d_" + clean;
      type.shape.push_back(SymInt::symbol(clean));
    }
  }
  return type;
}

// Nodes in an order where every input is defined before use (ONNX requires topological order,
// but some exporters do not keep it). Checks that every input is defined and that no value is
// defined twice; a cycle is an error naming its nodes.
// `reads`: node_reads(g).
std::vector<int> topological_order(const pb::GraphProto& g, const std::set<std::string>& defined,
                                   const std::vector<std::vector<std::string>>& reads,
                                   const std::string& source) {
  std::map<std::string, int> producer;
  for (int i = 0; i < g.node_size(); ++i)
    for (const std::string& o : g.node(i).output()) {
      if (o.empty()) continue;
      if (defined.count(o))
        fail_kind(ErrorKind::InvalidArgument,
                  "{}: node '{}' ({}) redefines '{}', which is a graph input or initializer",
                  source, node_display_name(g.node(i), size_t(i)), g.node(i).op_type(), o);
      auto [it, fresh] = producer.emplace(o, i);
      if (!fresh)
        fail_kind(ErrorKind::InvalidArgument,
                  "{}: value '{}' is produced by both node '{}' and node '{}' (ONNX graphs are SSA)",
                  source, o, node_display_name(g.node(it->second), size_t(it->second)),
                  node_display_name(g.node(i), size_t(i)));
    }
  std::vector<int> pending(size_t(g.node_size()), 0);
  std::vector<std::vector<int>> users(size_t(g.node_size()));
  for (int i = 0; i < g.node_size(); ++i)
    for (const std::string& in : reads[size_t(i)]) {
      if (in.empty() || defined.count(in)) continue;
      auto it = producer.find(in);
      if (it == producer.end())
        fail_kind(ErrorKind::InvalidArgument,
                  "{}: node '{}' ({}) reads '{}', which no node, graph input or initializer "
                  "defines", source, node_display_name(g.node(i), size_t(i)), g.node(i).op_type(),
                  in);
      users[size_t(it->second)].push_back(i);
      ++pending[size_t(i)];
    }
  std::vector<int> order, ready;
  for (int i = g.node_size() - 1; i >= 0; --i)
    if (pending[size_t(i)] == 0) ready.push_back(i);
  while (!ready.empty()) {
    int i = ready.back();
    ready.pop_back();
    order.push_back(i);
    // Users in reverse so that, for an already sorted graph, the order stays the file's.
    for (auto u = users[size_t(i)].rbegin(); u != users[size_t(i)].rend(); ++u)
      if (--pending[size_t(*u)] == 0) ready.push_back(*u);
  }
  if (order.size() != size_t(g.node_size())) {
    std::string cyc;
    int count = 0;
    for (int i = 0; i < g.node_size(); ++i)
      if (pending[size_t(i)] > 0 && count++ < 8)
        cyc += (cyc.empty() ? "'" : ", '") + node_display_name(g.node(i), size_t(i)) + "'";
    fail_kind(ErrorKind::InvalidArgument,
              "{}: the graph has a cycle: {} node{} never become ready ({}{})", source, count,
              count == 1 ? "" : "s", cyc, count > 8 ? ", ..." : "");
  }
  return order;
}

// Makes `id` carry exactly `name`, renaming whatever value holds it now.
void claim_name(Graph& g, ValueId id, const std::string& name) {
  if (g.value(id).name == name) return;
  ValueId other = g.find_value(name);
  if (other != kNoValue) g.rename_value(other, g.unique_name(name + "_"));
  g.rename_value(id, name);
}

}  // namespace

// Declared in importer.h: see Note [Data-dependent tails].
struct OnnxTail {
  std::shared_ptr<const pb::ModelProto> model;
  std::vector<int> nodes;           // indices into model->graph().node(), in a topological order
  std::vector<std::string> inputs;  // the names the graph's outputs carry, in order
  std::vector<std::pair<std::string, Tensor>> constants;  // known values the tail reads
  std::vector<std::string> outputs;  // the model's outputs
  std::string source, model_dir;
  int64_t opset = 0;
  int64_t max_tensor_bytes = 0;
  std::string first_node, reason;  // the node that needed a run-time value, and its words
};

namespace {

// An initializer of the graph being imported (or of an If branch) as a known operand under its
// name; `defined` collects the names: an unnamed or repeated one is an error naming `where`.
void add_initializer(ImportState& st, const pb::TensorProto& t, std::set<std::string>& defined,
                     const std::string& where) {
  if (t.name().empty())
    fail_kind(ErrorKind::InvalidArgument, "{}: an initializer has no name", where);
  if (!defined.insert(t.name()).second)
    fail_kind(ErrorKind::InvalidArgument, "{}: initializer '{}' is defined twice", where,
              t.name());
  Operand o;
  o.data = tensor_from_proto(t, st.model_dir, st.options.max_tensor_bytes,
                             fmt::format("{}: initializer '{}'", where, t.name()));
  o.type = o.data.type();
  o.name = t.name();
  o.is_initializer = true;
  st.by_name[t.name()] = st.add_operand(std::move(o));
}

// Operand v as the next graph output, a distinct Kiln value carrying `name` (a copy where v's
// value is already an output, or a param or input named otherwise). `used`: the outputs so far.
ValueId add_graph_output(ImportState& st, V v, const std::string& name, std::set<ValueId>& used) {
  ValueId id = st.materialize(v);
  const Value& val = st.graph.value(id);
  const bool reuse = !used.count(id) && (val.kind == ValueKind::NodeOutput ||
                                         val.kind == ValueKind::Const || val.name == name);
  if (!reuse) id = st.graph.add_node1(OpId::Copy, {id}, {}, name);
  used.insert(id);
  claim_name(st.graph, id, name);
  st.graph.outputs.push_back(id);
  return id;
}

// Params keep their initializer names.
void claim_param_names(ImportState& st) {
  for (Operand& o : st.operands)
    if (o.is_initializer && o.id != kNoValue && st.graph.value(o.id).kind == ValueKind::Param)
      claim_name(st.graph, o.id, o.name);
}

// One ONNX node through its converter; errors get the file and node.
void convert_node(ImportState& st, const pb::NodeProto& node, const std::string& display_name) {
  const OnnxOpEntry* entry = find_onnx_op(node.op_type());
  if (!entry || !default_domain(node.domain()))
    fail_kind(ErrorKind::NotSupported, "{}: node '{}': op type {} is not supported by Kiln's "
              "ONNX importer", st.source, display_name, op_key(node));
  NodeCtx ctx(st, node, *entry, display_name);
  try {
    entry->convert(ctx);
  } catch (const Error& e) {
    // Errors from shared helpers (broadcasting, inference) get the file and node.
    std::string msg = e.message();
    if (msg.find("node '" + ctx.name() + "'") == std::string::npos)
      throw_error(e.kind(), ctx.where() + ": " + msg);
    throw;
  }
  ctx.check_attrs_used();
  for (size_t k = 0; k < ctx.num_outputs(); ++k)
    if (ctx.wants_output(k) && !st.by_name.count(node.output(int(k))))
      ctx.not_supported("output {} ('{}') is not produced by Kiln's mapping of {}", k,
                        node.output(int(k)), node.op_type());
}

// `tail` null: a node that needs a run-time value fails the import (the error says which).
Graph import_model(const pb::ModelProto& m, ImportState& st, OnnxTail* tail) {
  if (!m.has_graph())
    fail_kind(ErrorKind::ParseError, "{}: the model has no graph", st.source);
  const pb::GraphProto& g = m.graph();
  st.opset = default_opset(m, st.source);

  // Every op type must be mapped before anything runs: one error lists all of them.
  auto unmapped = unmapped_ops(g);
  if (!unmapped.empty()) {
    std::string list;
    for (auto& [op, nodes] : unmapped) {
      std::string names;
      for (size_t k = 0; k < nodes.size() && k < 5; ++k) names += (k ? ", '" : "'") + nodes[k] + "'";
      if (nodes.size() > 5) names += fmt::format(", ... ({} nodes)", nodes.size());
      list += fmt::format("\n  {} (node{} {})", op, nodes.size() == 1 ? "" : "s", names);
    }
    fail_kind(ErrorKind::NotSupported, "{}: {} op type{} not supported by Kiln's ONNX importer:{}",
              st.source, unmapped.size(), unmapped.size() == 1 ? " is" : "s are", list);
  }
  if (g.sparse_initializer_size() > 0)
    fail_kind(ErrorKind::NotSupported, "{}: sparse initializers are not supported", st.source);

  st.graph.name = g.name().empty() ? "main" : g.name();
  std::set<std::string> defined;
  for (const pb::TensorProto& t : g.initializer()) add_initializer(st, t, defined, st.source);
  std::set<std::string> seen_inputs;
  for (const pb::ValueInfoProto& vi : g.input()) {
    if (vi.name().empty())
      fail_kind(ErrorKind::InvalidArgument, "{}: a graph input has no name", st.source);
    if (!seen_inputs.insert(vi.name()).second)
      fail_kind(ErrorKind::InvalidArgument, "{}: graph input '{}' is declared twice", st.source,
                vi.name());
    if (defined.count(vi.name())) continue;  // an initializer with a default (IR < 4 style)
    defined.insert(vi.name());
    Operand o;
    o.type = input_type(vi, st.source);
    o.name = vi.name();
    for (const auto& [name, dims] : st.options.input_shapes)
      if (name == vi.name()) {
        if (dims.size() > size_t(kMaxRank))
          fail_kind(ErrorKind::NotSupported, "{}: input_shapes gives '{}' rank {} (max {})",
                    st.source, name, dims.size(), kMaxRank);
        o.type.shape.clear();
        for (int64_t d : dims) {
          if (d < 0) fail_kind(ErrorKind::InvalidArgument, "{}: input_shapes gives '{}' a negative dim", st.source, name);
          o.type.shape.push_back(SymInt(d));
        }
      }
    auto bound = std::find_if(st.options.constant_inputs.begin(), st.options.constant_inputs.end(),
                              [&](const auto& p) { return p.first == vi.name(); });
    if (bound != st.options.constant_inputs.end()) {
      // Specialized: the input is a constant with the given value.
      const Tensor& t = bound->second;
      bool match = t.defined() && t.dtype() == o.type.dtype && t.dim() == o.type.rank();
      for (int j = 0; match && j < t.dim(); ++j)
        match = o.type.shape[size_t(j)].is_symbolic() || o.type.shape[size_t(j)].value() == t.size(j);
      if (!match)
        fail_kind(ErrorKind::InvalidArgument,
                  "{}: the value bound to graph input '{}' is {}{}, the input is declared {}",
                  st.source, vi.name(), t.defined() ? dtype_name(t.dtype()) : "undefined",
                  t.defined() ? to_string(t.sizes()) : "", o.type.str());
      o.data = t.is_contiguous() ? t : t.contiguous();
      o.type = o.data.type();
      st.by_name[vi.name()] = st.add_operand(std::move(o));
      continue;
    }
    o.id = st.graph.add_input(vi.name(), o.type);
    V v = st.add_operand(std::move(o));
    st.operands[size_t(v)].roots = {v};
    st.by_name[vi.name()] = v;
  }
  for (const auto& [name, dims] : st.options.input_shapes)
    if (!seen_inputs.count(name))
      fail_kind(ErrorKind::InvalidArgument,
                "{}: input_shapes names '{}', which is not a graph input of the model", st.source,
                name);
  for (const auto& [name, t] : st.options.constant_inputs)
    if (!seen_inputs.count(name) || st.by_name.count(name) == 0 ||
        st.operands[size_t(st.by_name[name])].is_initializer)
      fail_kind(ErrorKind::InvalidArgument,
                "{}: a value is bound to '{}', which is not a graph input of the model", st.source,
                name);

  const std::vector<std::vector<std::string>> reads = node_reads(g);
  std::vector<int> order = topological_order(g, defined, reads, st.source);
  std::set<std::string> tail_values;  // Note [Data-dependent tails]: made by tail nodes
  for (int i : order) {
    const pb::NodeProto& node = g.node(i);
    const std::string name = node_display_name(node, size_t(i));
    auto to_tail = [&] {
      tail->nodes.push_back(i);
      for (const std::string& o : node.output())
        if (!o.empty()) {
          tail_values.insert(o);
          st.by_name.erase(o);  // a converter that failed midway may have named some
        }
    };
    if (tail && std::any_of(reads[size_t(i)].begin(), reads[size_t(i)].end(),
                            [&](const std::string& r) { return tail_values.count(r) > 0; })) {
      to_tail();
      continue;
    }
    st.hit_data_dependent = false;
    try {
      convert_node(st, node, name);
    } catch (const Error& e) {
      if (!tail || !st.hit_data_dependent) throw;
      if (tail->first_node.empty()) {
        tail->first_node = name + " (" + node.op_type() + ")";
        tail->reason = e.message();
      }
      to_tail();
    }
  }
  if (tail && !tail->nodes.empty()) {
    // The graph computes what the tail reads; the tail computes the model's outputs.
    std::vector<std::string> needed;
    auto need = [&](const std::string& n) {
      if (!tail_values.count(n) && std::find(needed.begin(), needed.end(), n) == needed.end())
        needed.push_back(n);
    };
    for (int i : tail->nodes)
      for (const std::string& r : reads[size_t(i)]) need(r);
    for (const pb::ValueInfoProto& vi : g.output()) {
      need(vi.name());
      tail->outputs.push_back(vi.name());
    }
    std::set<ValueId> used;
    for (const std::string& n : needed) {
      auto it = st.by_name.find(n);
      if (it == st.by_name.end())
        fail_kind(ErrorKind::InvalidArgument, "{}: '{}' is not produced by any node, input or "
                  "initializer", st.source, n);
      const Operand& o = st.operands[size_t(it->second)];
      if (o.is_sym)
        fail_kind(ErrorKind::NotSupported,
                  "{}: the data-dependent part of the model (from node {}) reads '{}', which "
                  "holds symbolic dims; import it with fixed input shapes", st.source,
                  tail->first_node, n);
      if (o.data.defined() && o.id == kNoValue) {
        tail->constants.emplace_back(n, o.data);
        continue;
      }
      add_graph_output(st, it->second, n, used);
      tail->inputs.push_back(n);
    }
    claim_param_names(st);
    return std::move(st.graph);
  }

  // Graph outputs: distinct Kiln values carrying the ONNX names.
  std::set<ValueId> used;
  for (const pb::ValueInfoProto& vi : g.output()) {
    auto it = st.by_name.find(vi.name());
    if (it == st.by_name.end())
      fail_kind(ErrorKind::InvalidArgument,
                "{}: graph output '{}' is not produced by any node, input or initializer",
                st.source, vi.name());
    V v = it->second;
    if (st.operands[size_t(v)].is_sym)
      fail_kind(ErrorKind::NotSupported,
                "{}: graph output '{}' holds symbolic dims (a Shape of a symbolic input); Kiln "
                "cannot output shapes computed at run time", st.source, vi.name());
    const ValueId id = add_graph_output(st, v, vi.name(), used);

    // The declared type, where the model gives one, must agree with what Kiln computes.
    const TensorType& got = st.graph.type(id);
    if (vi.has_type() && vi.type().value_case() == pb::TypeProto::kTensorType) {
      const pb::TypeProto::Tensor& tt = vi.type().tensor_type();
      DType want = DType::Float32;
      if (tt.elem_type() != 0 && dtype_from_onnx(tt.elem_type(), &want) && want != got.dtype)
        fail_kind(ErrorKind::InvalidArgument,
                  "{}: graph output '{}' is declared {}, but Kiln computes {} (a mismatch "
                  "between the model and the importer's mapping)", st.source, vi.name(),
                  onnx_type_name(tt.elem_type()), dtype_name(got.dtype));
      if (tt.has_shape() && tt.shape().dim_size() > 0) {
        bool match = tt.shape().dim_size() == got.rank();
        for (int j = 0; match && j < got.rank(); ++j) {
          const auto& d = tt.shape().dim(j);
          if (d.has_dim_value() && got.shape[size_t(j)].is_concrete() &&
              d.dim_value() != got.shape[size_t(j)].value())
            match = false;
        }
        if (!match) {
          std::string decl = "[";
          for (int j = 0; j < tt.shape().dim_size(); ++j) {
            const auto& d = tt.shape().dim(j);
            decl += (j ? ", " : "") +
                    (d.has_dim_value() ? std::to_string(d.dim_value())
                                       : (d.dim_param().empty() ? "?" : d.dim_param()));
          }
          fail_kind(ErrorKind::InvalidArgument,
                    "{}: graph output '{}' is declared with shape {}, but Kiln computes {}",
                    st.source, vi.name(), decl + "]", to_string(got.shape));
        }
      }
    }
  }
  claim_param_names(st);
  return std::move(st.graph);
}

}  // namespace

namespace onnx {
std::vector<V> import_branch(NodeCtx& c, const pb::GraphProto& g, std::string_view which) {
  ImportState& st = c.state();
  const std::string where = fmt::format("{}: {}", c.where(), which);
  if (g.input_size() != 0)
    fail_kind(ErrorKind::NotSupported, "{}: a branch with inputs ({})", where, g.input_size());
  if (g.sparse_initializer_size() > 0)
    fail_kind(ErrorKind::NotSupported, "{}: sparse initializers are not supported", where);
  std::set<std::string> own;  // the branch's initializers (unique among themselves)
  for (const pb::TensorProto& t : g.initializer()) add_initializer(st, t, own, where);
  std::set<std::string> defined;
  for (const auto& [name, v] : st.by_name) defined.insert(name);
  for (int i : topological_order(g, defined, node_reads(g), where))
    convert_node(st, g.node(i), node_display_name(g.node(i), size_t(i)));
  std::vector<V> out;
  for (const pb::ValueInfoProto& vi : g.output()) {
    auto it = st.by_name.find(vi.name());
    if (it == st.by_name.end())
      fail_kind(ErrorKind::InvalidArgument, "{}: output '{}' is not produced by any node of the "
                "branch or the enclosing graph", where, vi.name());
    out.push_back(it->second);
  }
  return out;
}
}  // namespace onnx

Graph import_onnx_bytes(std::string_view bytes, const std::string& model_dir,
                        const std::string& source, const ImportOptions& options) {
  register_onnx_mappings();
  pb::ModelProto m;
  parse_proto(m, bytes, source, "ONNX model");
  ImportState st;
  st.options = options;
  st.source = source;
  st.model_dir = model_dir;
  return import_model(m, st, nullptr);
}

OnnxSplitImport import_onnx_split_bytes(std::string_view bytes, const std::string& model_dir,
                                        const std::string& source, const ImportOptions& options) {
  register_onnx_mappings();
  auto m = std::make_shared<pb::ModelProto>();
  parse_proto(*m, bytes, source, "ONNX model");
  ImportState st;
  st.options = options;
  st.source = source;
  st.model_dir = model_dir;
  auto tail = std::make_shared<OnnxTail>();
  OnnxSplitImport out;
  out.graph = import_model(*m, st, tail.get());
  if (!tail->nodes.empty()) {
    tail->model = std::move(m);
    tail->source = source;
    tail->model_dir = model_dir;
    tail->opset = st.opset;
    tail->max_tensor_bytes = options.max_tensor_bytes;
    out.tail = std::move(tail);
  }
  return out;
}

OnnxSplitImport import_onnx_split(const std::string& path, const ImportOptions& options) {
  std::string bytes = read_file(path, options.max_model_bytes);
  std::string dir = fs::path(path).parent_path().string();
  return import_onnx_split_bytes(bytes, dir.empty() ? "." : dir, path, options);
}

// Note [Data-dependent tails]: a fresh import state whose operands are all known; each tail
// node goes through its converter as at import, and every op it emits folds (runs now).
TensorList run_onnx_tail(const OnnxTail& tail, const TensorList& graph_outputs) {
  if (graph_outputs.size() != tail.inputs.size())
    fail_kind(ErrorKind::InvalidArgument, "{}: the data-dependent part takes {} values, {} given",
              tail.source, tail.inputs.size(), graph_outputs.size());
  // Under capture, these reads end the traced segment: the statically shaped part runs
  // compiled, and what follows runs here with real values (a graph break).
  for (const Tensor& t : graph_outputs)
    t.materialize("the data-dependent part of an ONNX model", std::source_location::current());
  NoDispatchHook eager;
  ImportState st;
  st.options.max_tensor_bytes = tail.max_tensor_bytes;
  st.source = tail.source;
  st.model_dir = tail.model_dir;
  st.opset = tail.opset;
  st.evaluate = true;
  auto bind = [&](const std::string& name, const Tensor& t) {
    Operand o;
    o.data = t.is_contiguous() ? t : t.contiguous();
    o.type = o.data.type();
    o.name = name;
    st.by_name[name] = st.add_operand(std::move(o));
  };
  for (const auto& [name, t] : tail.constants) bind(name, t);
  for (size_t i = 0; i < graph_outputs.size(); ++i) {
    const Tensor& t = graph_outputs[i];
    bind(tail.inputs[i], t.device().is_cpu() ? t : t.to(Device::cpu()));
  }
  const pb::GraphProto& g = tail.model->graph();
  for (int i : tail.nodes) convert_node(st, g.node(i), node_display_name(g.node(i), size_t(i)));
  TensorList out;
  for (const std::string& name : tail.outputs) {
    auto it = st.by_name.find(name);
    KILN_ASSERT(it != st.by_name.end());  // every output is made by the graph or the tail
    const Operand& o = st.operands[size_t(it->second)];
    if (!o.data.defined())
      fail_kind(ErrorKind::Internal, "{}: output '{}' of the data-dependent part has no value",
                tail.source, name);
    out.push_back(o.data);
  }
  return out;
}

TensorList run_onnx_split(const Graph& graph, const OnnxTail* tail, const TensorList& inputs) {
  TensorList out = run(graph, inputs);
  return tail ? run_onnx_tail(*tail, out) : out;
}

const std::vector<std::string>& onnx_tail_outputs(const OnnxTail& tail) { return tail.outputs; }

std::string describe_onnx_tail(const OnnxTail& tail) {
  return fmt::format("{} of {} ONNX nodes run op by op after the compiled part, from node {}, "
                     "which needs a value computed at run time", tail.nodes.size(),
                     tail.model->graph().node_size(), tail.first_node);
}

Graph import_onnx(const std::string& path, const ImportOptions& options) {
  std::string bytes = read_file(path, options.max_model_bytes);
  std::string dir = fs::path(path).parent_path().string();
  return import_onnx_bytes(bytes, dir.empty() ? "." : dir, path, options);
}

Tensor read_onnx_tensor_file(const std::string& path, std::string* name,
                             const ImportOptions& options, bool uint16_as_bfloat16) {
  std::string bytes = read_file(path, options.max_model_bytes);
  pb::TensorProto t;
  parse_proto(t, bytes, path, "TensorProto file");
  if (name) *name = t.name();
  if (uint16_as_bfloat16 && t.data_type() == pb::TensorProto::UINT16)
    t.set_data_type(pb::TensorProto::BFLOAT16);  // same 16-bit patterns
  std::string dir = fs::path(path).parent_path().string();
  return tensor_from_proto(t, dir.empty() ? "." : dir, options.max_tensor_bytes, path);
}

namespace {
// The declared dims' symbolic names of a graph input or output: its dim_param where a dim is
// not fixed, "" where it is fixed or unnamed (empty: no shape declared).
std::vector<std::string> dim_params(const pb::ValueInfoProto& vi) {
  std::vector<std::string> names;
  if (vi.type().has_tensor_type() && vi.type().tensor_type().has_shape())
    for (const pb::TensorShapeProto::Dimension& d : vi.type().tensor_type().shape().dim())
      names.push_back(!(d.has_dim_value() && d.dim_value() >= 0) && d.has_dim_param()
                          ? d.dim_param() : std::string());
  return names;
}
}  // namespace

OnnxModelScan scan_onnx_model(const std::string& path, const ImportOptions& options) {
  std::string bytes = read_file(path, options.max_model_bytes);
  pb::ModelProto m;
  parse_proto(m, bytes, path, "ONNX model");
  OnnxModelScan scan;
  const pb::GraphProto& g = m.graph();
  for (const pb::OperatorSetIdProto& o : m.opset_import())
    if (default_domain(o.domain())) scan.opset = o.version();
  scan.unmapped_ops = unmapped_ops(g);
  std::set<std::string> types;
  for (const pb::NodeProto& n : g.node()) types.insert(op_key(n));
  scan.op_types.assign(types.begin(), types.end());

  std::set<std::string> initializers;
  DType d = DType::Float32;
  for (const pb::TensorProto& t : g.initializer()) {
    initializers.insert(t.name());
    if (!dtype_from_onnx(t.data_type(), &d))
      scan.unsupported_types.push_back(
          fmt::format("initializer '{}': {}", t.name(), onnx_type_name(t.data_type())));
  }
  for (const pb::ValueInfoProto& vi : g.input()) {
    if (initializers.count(vi.name())) continue;
    scan.input_names.push_back(vi.name());
    std::vector<int64_t> dims;
    if (vi.type().has_tensor_type() && vi.type().tensor_type().has_shape())
      for (const pb::TensorShapeProto::Dimension& d : vi.type().tensor_type().shape().dim())
        dims.push_back(d.has_dim_value() && d.dim_value() >= 0 ? d.dim_value() : -1);
    scan.input_dims.push_back(std::move(dims));
    scan.input_dim_names.push_back(dim_params(vi));
    if (!representable(vi.type()))
      scan.unsupported_types.push_back(
          fmt::format("input '{}': {}", vi.name(), describe_type(vi.type())));
  }
  for (const pb::ValueInfoProto& vi : g.output()) {
    scan.output_names.push_back(vi.name());
    scan.output_dim_names.push_back(dim_params(vi));
    if (!representable(vi.type()))
      scan.unsupported_types.push_back(
          fmt::format("output '{}': {}", vi.name(), describe_type(vi.type())));
  }
  // Types named inside nodes: Constant values, Cast targets, ConstantOfShape values.
  for (int i = 0; i < g.node_size(); ++i) {
    const pb::NodeProto& n = g.node(i);
    for (const pb::AttributeProto& a : n.attribute()) {
      std::string where = fmt::format("node '{}' ({}) attribute '{}'",
                                      node_display_name(n, size_t(i)), n.op_type(), a.name());
      if (a.has_t() && !dtype_from_onnx(a.t().data_type(), &d))
        scan.unsupported_types.push_back(where + ": " + onnx_type_name(a.t().data_type()));
      if (a.type() == pb::AttributeProto::STRING || a.type() == pb::AttributeProto::STRINGS) {
        if (n.op_type() == "Constant")
          scan.unsupported_types.push_back(where + ": string");
      }
      if ((a.name() == "to" && n.op_type() == "Cast") ||
          (a.name() == "dtype" && a.type() == pb::AttributeProto::INT)) {
        if (!dtype_from_onnx(int32_t(a.i()), &d))
          scan.unsupported_types.push_back(where + ": " + onnx_type_name(int32_t(a.i())));
      }
    }
  }
  (void)options;
  return scan;
}

}  // namespace kiln
