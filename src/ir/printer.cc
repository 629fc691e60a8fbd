#include "ir/printer.h"

#include <fmt/format.h>

namespace kiln {

bool is_plain_ir_name(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

std::string quote_ir_string(std::string_view s) {
  std::string o = "\"";
  for (char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      case '\r': o += "\\r"; break;
      default:
        if ((unsigned char)c < 0x20 || c == 0x7f) o += fmt::format("\\x{:02x}", (unsigned char)c);
        else o += c;
    }
  }
  return o + "\"";
}

std::string value_ref_name(std::string_view name) {
  return is_plain_ir_name(name) ? "%" + std::string(name) : "%" + quote_ir_string(name);
}

std::string value_ref(const Graph& g, ValueId v) {
  if (v == kNoValue) return "_";
  if (!g.valid(v)) return fmt::format("%<invalid value {}>", v);  // only in broken graphs
  return value_ref_name(g.value(v).name);
}

namespace {

// Shortest text that parses back to the same bits, always with a '.', an exponent or inf/nan,
// so that it reads as a float.
template <typename T>
std::string float_text(T x) {
  std::string s = fmt::format("{}", x);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string element_text(const void* p, DType d) {
  switch (d) {
    case DType::Float32: return float_text(*static_cast<const float*>(p));
    case DType::Float64: return float_text(*static_cast<const double*>(p));
    // 16-bit floats print as the float they widen to: exact, and it converts back exactly.
    case DType::Float16:
    case DType::BFloat16: return float_text(float(load_f64(p, d)));
    case DType::Bool: return *static_cast<const uint8_t*>(p) ? "true" : "false";
    default: return std::to_string(load_i64(p, d));
  }
}

void print_const_values(std::string& out, const Tensor& data) {
  Tensor t = data;
  if (!t.device().is_cpu()) t = t.to(Device::cpu());
  t = t.contiguous();
  const char* base = static_cast<const char*>(t.raw_data());
  int64_t n = t.numel(), esize = t.element_size();
  out += " = [";
  for (int64_t i = 0; i < n; ++i) {
    if (i) out += ", ";
    out += element_text(base + i * esize, t.dtype());
  }
  out += "]";
}

// Whether attribute `name` of `def` holds its default (then the printer leaves it out).
bool is_default_attr(const OpDef& def, const std::string& name, const AttrValue& v) {
  int idx = def.attr_index(name);
  if (idx < 0) return false;
  return same_attr_value(def.attrs[size_t(idx)].default_value, v);  // -0.0 is not 0.0
}

void print_node_into(std::string& out, const Graph& g, const Node& n) {
  bool op_ok = size_t(n.op) < size_t(kNumOps);
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    if (i) out += ", ";
    out += value_ref(g, n.outputs[i]);
  }
  out += " = ";
  out += op_ok ? op_def(n.op).name : "<invalid op>";
  out += "(";
  // Trailing absent inputs mean the same as no inputs there: drop them, so that equal nodes
  // print equally.
  size_t num_inputs = n.inputs.size();
  while (num_inputs > 0 && n.inputs[num_inputs - 1] == kNoValue) --num_inputs;
  for (size_t i = 0; i < num_inputs; ++i) {
    if (i) out += ", ";
    out += value_ref(g, n.inputs[i]);
  }
  out += ")";
  bool first = true;
  for (auto& [name, v] : n.attrs.items()) {
    if (op_ok && is_default_attr(op_def(n.op), name, v)) continue;
    out += first ? " {" : ", ";
    first = false;
    out += name;
    out += "=";
    out += attr_value_str(v);
  }
  if (!first) out += "}";
  if (!n.outputs.empty()) {
    out += " : ";
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      if (i) out += ", ";
      out += g.valid(n.outputs[i]) ? g.type(n.outputs[i]).str() : "<invalid>";
    }
  }
  if (!n.name.empty()) {
    out += " loc(";
    out += quote_ir_string(n.name);
    out += ")";
  }
}

}  // namespace

std::string print_node(const Graph& g, const Node& node) {
  std::string out;
  print_node_into(out, g, node);
  return out;
}

std::string print_graph(const Graph& g, const PrintOptions& options) {
  std::string out = "graph @";
  out += is_plain_ir_name(g.name) ? g.name : quote_ir_string(g.name);
  out += "(";
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    if (i) out += ", ";
    ValueId v = g.inputs[i];
    out += value_ref(g, v);
    out += ": ";
    out += g.valid(v) ? g.type(v).str() : "<invalid>";
  }
  out += ") {\n";
  // Params and consts first, in value order; they are not produced by nodes, so declaring
  // them up front keeps the node list readable and is always a valid order.
  for (size_t i = 0; i < g.values.size(); ++i) {
    const Value& v = g.values[i];
    if (v.kind != ValueKind::Param && v.kind != ValueKind::Const) continue;
    out += v.kind == ValueKind::Param ? "  param " : "  const ";
    out += value_ref_name(v.name);
    out += ": ";
    out += v.type.str();
    if (v.kind == ValueKind::Const && v.data.defined() && v.data.has_storage() &&
        (options.max_inline_const_elements < 0 ||
         v.data.numel() <= options.max_inline_const_elements))
      print_const_values(out, v.data);
    out += "\n";
  }
  for (const Node& n : g.nodes) {
    out += "  ";
    print_node_into(out, g, n);
    out += "\n";
  }
  out += "  return";
  for (size_t i = 0; i < g.outputs.size(); ++i) {
    out += i ? ", " : " ";
    out += value_ref(g, g.outputs[i]);
  }
  out += "\n}\n";
  return out;
}

}  // namespace kiln
