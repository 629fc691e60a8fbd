#include "ir/verifier.h"

#include <unordered_map>

#include <fmt/format.h>

#include "ir/printer.h"

namespace kiln {
namespace {

const char* kind_name(ValueKind k) {
  switch (k) {
    case ValueKind::Input: return "input";
    case ValueKind::Param: return "param";
    case ValueKind::Const: return "const";
    case ValueKind::NodeOutput: return "node output";
  }
  return "?";
}

class Verifier {
 public:
  explicit Verifier(const Graph& g) : g_(g) {}

  std::vector<std::string> run() {
    check_values();
    check_inputs();
    for (size_t i = 0; i < g_.nodes.size(); ++i) check_node(int32_t(i));
    check_outputs();
    return std::move(problems_);
  }

 private:
  const Graph& g_;
  std::vector<std::string> problems_;

  template <typename... Args>
  void problem(fmt::format_string<Args...> f, Args&&... args) {
    problems_.push_back(fmt::format(f, std::forward<Args>(args)...));
  }

  std::string vname(ValueId v) const {
    if (v == kNoValue) return "_";
    if (!g_.valid(v))
      return fmt::format("value id {} (out of range: the graph has {} values)", v,
                         g_.values.size());
    return value_ref_name(g_.value(v).name);
  }

  // "node 3 'stem.conv1' (conv2d -> %y)"
  std::string node_desc(int32_t i) const {
    const Node& n = g_.nodes[size_t(i)];
    std::string op = size_t(n.op) < size_t(kNumOps) ? op_def(n.op).name : "<invalid op>";
    std::string outs;
    for (size_t k = 0; k < n.outputs.size(); ++k)
      outs +=
          (k ? ", " : "") + (g_.valid(n.outputs[k]) ? value_ref_name(g_.value(n.outputs[k]).name)
                                                    : fmt::format("<id {}>", n.outputs[k]));
    return fmt::format("node {}{} ({}{}{})", i, n.name.empty() ? "" : " '" + n.name + "'", op,
                       outs.empty() ? "" : " -> ", outs);
  }

  void check_values() {
    std::unordered_map<std::string, ValueId> seen;
    for (size_t i = 0; i < g_.values.size(); ++i) {
      const Value& v = g_.values[i];
      ValueId id = ValueId(i);
      if (v.name.empty()) problem("value {} has an empty name", i);
      else if (auto [it, fresh] = seen.emplace(v.name, id); !fresh)
        problem("values {} and {} share the name {}", it->second, i, value_ref_name(v.name));
      for (SymInt d : v.type.shape)
        if (d.is_concrete() && d.raw() < 0)
          problem("value {} has a negative dimension in its type {}", vname(id), v.type.str());
      if (!v.type.strides.empty() && v.type.strides.size() != v.type.shape.size())
        problem("value {} has {} strides for rank {}", vname(id), v.type.strides.size(),
                v.type.shape.size());
      switch (v.kind) {
        case ValueKind::NodeOutput: {
          if (v.producer < 0 || size_t(v.producer) >= g_.nodes.size()) {
            problem(
                "node output {} names producer node {}, which does not exist (the graph has "
                "{} nodes): a dangling value",
                vname(id), v.producer, g_.nodes.size());
            break;
          }
          const Node& n = g_.nodes[size_t(v.producer)];
          if (v.output_index < 0 || size_t(v.output_index) >= n.outputs.size() ||
              n.outputs[size_t(v.output_index)] != id)
            problem(
                "node output {} claims to be output {} of {}, but that node does not list it "
                "there",
                vname(id), v.output_index, node_desc(v.producer));
          break;
        }
        case ValueKind::Param:
        case ValueKind::Const:
          if (v.producer != -1)
            problem("{} {} has producer {}; only node outputs have producers", kind_name(v.kind),
                    vname(id), v.producer);
          if (v.data.defined() && v.data.type() != v.type)
            problem("{} {} is declared {} but its data is {}", kind_name(v.kind), vname(id),
                    v.type.str(), v.data.type().str());
          break;
        case ValueKind::Input:
          if (v.producer != -1)
            problem("input {} has producer {}; only node outputs have producers", vname(id),
                    v.producer);
          break;
      }
    }
  }

  void check_inputs() {
    std::vector<int> listed(g_.values.size(), 0);
    for (size_t k = 0; k < g_.inputs.size(); ++k) {
      ValueId v = g_.inputs[k];
      if (!g_.valid(v)) {
        problem("graph input {} is {}", k, vname(v));
        continue;
      }
      if (g_.value(v).kind != ValueKind::Input)
        problem("graph input {} is {}, a {}, not an input value", k, vname(v),
                kind_name(g_.value(v).kind));
      if (++listed[size_t(v)] == 2) problem("{} is listed twice among the graph inputs", vname(v));
    }
    for (size_t i = 0; i < g_.values.size(); ++i)
      if (g_.values[i].kind == ValueKind::Input && listed[i] == 0)
        problem("input value {} is not listed among the graph inputs", vname(ValueId(i)));
  }

  // Whether v is available to node `at` (-1: after all nodes).
  bool defined_before(ValueId v, int32_t at) const {
    const Value& val = g_.value(v);
    if (val.kind != ValueKind::NodeOutput) return true;
    if (val.producer < 0 || size_t(val.producer) >= g_.nodes.size()) return false;
    return at < 0 || val.producer < at;
  }

  void check_node(int32_t i) {
    const Node& n = g_.nodes[size_t(i)];
    if (size_t(n.op) >= size_t(kNumOps)) {
      problem("{}: op id {} is not a registered op", node_desc(i), int(n.op));
      return;
    }
    const OpDef& def = op_def(n.op);
    std::string where = node_desc(i);
    bool inputs_ok = true;
    try {
      def.check_arity(n.inputs.size(), where);
    } catch (const Error& e) {
      problems_.push_back(e.message());
      inputs_ok = false;
    }
    std::vector<const TensorType*> in_types(n.inputs.size(), nullptr);
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      ValueId v = n.inputs[k];
      size_t spec = def.inputs.empty() ? 0 : std::min(k, def.inputs.size() - 1);
      std::string in_name = def.inputs.empty() ? "?" : def.inputs[spec].name;
      if (v == kNoValue) {
        if (def.inputs.empty() || !def.inputs[spec].optional) {
          problem("{}: input {} ('{}') is required but absent", where, k, in_name);
          inputs_ok = false;
        }
        continue;
      }
      if (!g_.valid(v)) {
        problem("{}: input {} ('{}') is {}", where, k, in_name, vname(v));
        inputs_ok = false;
        continue;
      }
      if (!defined_before(v, i)) {
        const Value& val = g_.value(v);
        if (val.producer >= 0 && size_t(val.producer) < g_.nodes.size())
          problem("{}: input {} ('{}') uses {} before it is defined (by {})", where, k, in_name,
                  vname(v), node_desc(val.producer));
        else
          problem("{}: input {} ('{}') uses {}, which no node defines", where, k, in_name,
                  vname(v));
        inputs_ok = false;
        continue;
      }
      in_types[k] = &g_.type(v);
    }

    bool outputs_ok = true;
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      ValueId v = n.outputs[k];
      if (!g_.valid(v)) {
        problem("{}: output {} is {}", where, k, vname(v));
        outputs_ok = false;
        continue;
      }
      const Value& val = g_.value(v);
      if (val.kind != ValueKind::NodeOutput || val.producer != i ||
          val.output_index != int32_t(k)) {
        problem(
            "{}: output {} is {}, but that value is a {} with producer {} and output index {} "
            "(a value is defined exactly once)",
            where, k, vname(v), kind_name(val.kind), val.producer, val.output_index);
        outputs_ok = false;
      }
    }

    Attrs canonical;
    try {
      canonical = def.canonicalize(n.attrs, where);
    } catch (const Error& e) {
      problems_.push_back(e.message());
      return;
    }
    if (!(canonical == n.attrs)) {
      problem(
          "{}: attributes are not canonical (defaults filled, schema order): has {} attributes, "
          "canonical form has {}",
          where, n.attrs.size(), canonical.size());
      return;
    }
    if (!inputs_ok || !outputs_ok) return;  // inference would only repeat those problems
    if (!def.infer) {
      problem("{}: op '{}' has no shape inference registered", where, def.name);
      return;
    }
    std::vector<TensorType> inferred;
    try {
      InferContext ctx{def, n.name, std::span<const TensorType* const>(in_types), canonical};
      inferred = def.infer(ctx);
    } catch (const Error& e) {
      problem("{}: inference rejects the node: {}", where, e.message());
      return;
    }
    if (inferred.size() != n.outputs.size()) {
      problem("{}: inference gives {} outputs, the node has {}", where, inferred.size(),
              n.outputs.size());
      return;
    }
    for (size_t k = 0; k < inferred.size(); ++k)
      if (inferred[k] != g_.type(n.outputs[k]))
        problem("{}: output {} has type {}, but inference gives {}", where, vname(n.outputs[k]),
                g_.type(n.outputs[k]).str(), inferred[k].str());
  }

  void check_outputs() {
    for (size_t k = 0; k < g_.outputs.size(); ++k) {
      ValueId v = g_.outputs[k];
      if (!g_.valid(v)) problem("graph output {} is {}", k, vname(v));
      else if (!defined_before(v, -1))
        problem("graph output {} is {}, which no node defines", k, vname(v));
    }
  }
};

}  // namespace

std::vector<std::string> verify_problems(const Graph& g) { return Verifier(g).run(); }

void verify(const Graph& g) {
  std::vector<std::string> problems = verify_problems(g);
  if (problems.empty()) return;
  std::string msg = fmt::format("graph '{}' fails verification ({} problem{}):", g.name,
                                problems.size(), problems.size() == 1 ? "" : "s");
  size_t shown = std::min<size_t>(problems.size(), 20);
  for (size_t i = 0; i < shown; ++i) msg += "\n  " + problems[i];
  if (shown < problems.size()) msg += fmt::format("\n  ... and {} more", problems.size() - shown);
  throw_error(ErrorKind::InvalidArgument, msg);
}

}  // namespace kiln
