#include "ir/interpreter.h"
#include "ir/verifier.h"

#include <source_location>

#include <fmt/format.h>

#include "ops/dispatch.h"
#include "ir/printer.h"
#include "support/strings.h"

namespace kiln {
namespace {

// A dim that is exactly one free symbol (as opposed to an expression over symbols).
bool bare_symbol(SymInt d, std::string* name) {
  if (!d.is_symbolic()) return false;
  std::vector<std::string> syms = d.free_symbols();
  if (syms.size() != 1 || SymInt::symbol(syms[0]) != d) return false;
  *name = syms[0];
  return true;
}

const int64_t* find_binding(const SymbolBindings& b, const std::string& name) {
  for (auto& [n, v] : b)
    if (n == name) return &v;
  return nullptr;
}

std::string node_desc(const Graph& g, size_t i) {
  const Node& n = g.nodes[i];
  std::string outs;
  for (size_t k = 0; k < n.outputs.size(); ++k)
    outs += (k ? ", " : "") + value_ref(g, n.outputs[k]);
  return fmt::format("graph '{}', node {}{} ({} -> {})", g.name, i,
                     n.name.empty() ? "" : " '" + n.name + "'",
                     size_t(n.op) < size_t(kNumOps) ? op_def(n.op).name : "<invalid op>", outs);
}

// Int attributes may be symbolic (reshape {shape=[n, -1]}); kernels need them concrete.
bool has_symbolic_ints(const Attrs& attrs) {
  for (auto& [name, v] : attrs.items()) {
    if (auto* i = std::get_if<int64_t>(&v); i && SymInt::from_raw(*i).is_symbolic()) return true;
    if (auto* is = std::get_if<Ints>(&v))
      for (int64_t x : *is)
        if (SymInt::from_raw(x).is_symbolic()) return true;
  }
  return false;
}

}  // namespace

Attrs specialize_attrs(const Attrs& attrs, const SymbolBindings& bindings) {
  Attrs out = attrs;
  for (auto& [name, v] : out.items()) {
    if (auto* i = std::get_if<int64_t>(&v)) {
      *i = SymInt::from_raw(*i).evaluate(bindings);
    } else if (auto* is = std::get_if<Ints>(&v)) {
      for (int64_t& x : *is) x = SymInt::from_raw(x).evaluate(bindings);
    }
  }
  return out;
}

Graph specialize_graph(const Graph& g, const SymbolBindings& bindings) {
  Graph out = g;
  for (Value& v : out.values)
    for (size_t d = 0; d < v.type.shape.size(); ++d)
      if (v.type.shape[d].is_symbolic()) v.type.shape[d] = SymInt(v.type.shape[d].evaluate(bindings));
  for (Node& n : out.nodes) n.attrs = specialize_attrs(n.attrs, bindings);
  // The symbolic types may rest on assumptions (a symbolic slice bound within its dim): every
  // node's inference on the concrete types must give the substituted types.
  std::vector<std::string> problems = verify_problems(out);
  if (!problems.empty()) {
    std::string b;
    for (const auto& [name, value] : bindings) b += fmt::format("{}{}={}", b.empty() ? "" : ", ", name, value);
    fail("graph '{}': the input sizes ({}) do not fit the graph: {}", g.name, b,
         fmt::join(problems, "; "));
  }
  return out;
}

SymbolBindings bind_input_symbols(const Graph& g, const TensorList& inputs) {
  if (inputs.size() != g.inputs.size())
    fail("graph '{}' takes {} input{}, got {}", g.name, g.inputs.size(),
         g.inputs.size() == 1 ? "" : "s", inputs.size());
  for (ValueId v : g.inputs)
    KILN_CHECK(g.valid(v), "graph '{}': input refers to value {}, which does not exist", g.name, v);
  SymbolBindings bindings;
  std::vector<std::string> bound_by;  // parallel to bindings: "input 0 ('x') dim 0"
  auto where = [&](size_t k) {
    return fmt::format("input {} ('{}')", k, g.value(g.inputs[k]).name);
  };

  // Pass 1: everything but composite expressions; bare symbols bind.
  for (size_t k = 0; k < inputs.size(); ++k) {
    const TensorType& want = g.type(g.inputs[k]);
    const Tensor& t = inputs[k];
    KILN_CHECK(t.defined(), "{}: the tensor is undefined; expected {}", where(k), want.str());
    KILN_CHECK(t.has_storage(), "{}: the tensor has no data (a fake tensor); expected {}", where(k),
               want.str());
    KILN_CHECK(t.dtype() == want.dtype, "{}: expected dtype {}, got {}", where(k),
               info(want.dtype).short_name, info(t.dtype()).short_name);
    KILN_CHECK(t.dim() == want.rank(), "{}: expected rank {} ({}), got rank {} ({})", where(k),
               want.rank(), want.str(), t.dim(), to_string(t.sizes()));
    KILN_CHECK(t.device() == want.device, "{}: expected a tensor on {}, got one on {}", where(k),
               want.device.str(), t.device().str());
    for (int j = 0; j < t.dim(); ++j) {
      SymInt d = want.shape[size_t(j)];
      int64_t got = t.sizes()[size_t(j)];
      std::string sym;
      if (d.is_concrete()) {
        KILN_CHECK(d.raw() == got, "{}: dim {} expected {}, got {}", where(k), j, d.raw(), got);
      } else if (bare_symbol(d, &sym)) {
        if (const int64_t* v = find_binding(bindings, sym)) {
          if (*v != got) {
            std::string first;
            for (size_t q = 0; q < bindings.size(); ++q)
              if (bindings[q].first == sym) first = bound_by[q];
            fail("{}: dim {} is symbol '{}' = {}, but {} already bound '{}' = {}", where(k), j, sym,
                 got, first, sym, *v);
          }
        } else {
          bindings.emplace_back(sym, got);
          bound_by.push_back(fmt::format("{} dim {}", where(k), j));
        }
      }
    }
  }
  // Pass 2: composite expressions, evaluated under the bindings.
  for (size_t k = 0; k < inputs.size(); ++k) {
    const TensorType& want = g.type(g.inputs[k]);
    for (int j = 0; j < want.rank(); ++j) {
      SymInt d = want.shape[size_t(j)];
      std::string sym;
      if (d.is_concrete() || bare_symbol(d, &sym)) continue;
      for (const std::string& s : d.free_symbols())
        KILN_CHECK(find_binding(bindings, s),
                   "{}: dim {} is '{}', but no input dim is the bare "
                   "symbol '{}', so its value cannot be determined",
                   where(k), j, d.str(), s);
      int64_t expect = d.evaluate(bindings);
      int64_t got = inputs[k].sizes()[size_t(j)];
      if (expect != got) {
        std::string vals;
        for (const std::string& s : d.free_symbols())
          vals += fmt::format("{}{} = {}", vals.empty() ? "" : ", ", s, *find_binding(bindings, s));
        fail("{}: dim {} is '{}' = {} (with {}), got {}", where(k), j, d.str(), expect, vals, got);
      }
    }
  }
  return bindings;
}

TensorList run(const Graph& g, const TensorList& inputs) {
  SymbolBindings bindings = bind_input_symbols(g, inputs);

  std::vector<Tensor> env(g.values.size());
  for (size_t k = 0; k < g.inputs.size(); ++k) env[size_t(g.inputs[k])] = inputs[k];

  // Last node that reads each value; graph outputs are kept to the end.
  constexpr int kKeep = INT32_MAX;
  std::vector<int> last_use(g.values.size(), -1);
  // Ids are checked here, cheaply, so that an unverified graph gets an error, not a crash.
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    KILN_CHECK(size_t(g.nodes[i].op) < size_t(kNumOps), "{}: not a registered op", node_desc(g, i));
    for (ValueId v : g.nodes[i].inputs) {
      if (v == kNoValue) continue;
      KILN_CHECK(g.valid(v),
                 "{}: input refers to value {}, which does not exist (run the "
                 "verifier)",
                 node_desc(g, i), v);
      last_use[size_t(v)] = int(i);
    }
    for (ValueId v : g.nodes[i].outputs)
      KILN_CHECK(g.valid(v),
                 "{}: output refers to value {}, which does not exist (run the "
                 "verifier)",
                 node_desc(g, i), v);
  }
  for (ValueId v : g.outputs) {
    KILN_CHECK(g.valid(v), "graph '{}': output refers to value {}, which does not exist", g.name,
               v);
    last_use[size_t(v)] = kKeep;
  }

  for (size_t i = 0; i < g.values.size(); ++i) {
    const Value& v = g.values[i];
    if ((v.kind != ValueKind::Param && v.kind != ValueKind::Const) || last_use[i] < 0) continue;
    if (!v.data.defined() || !v.data.has_storage())
      fail("graph '{}': {} {} has no data{}; set its Value::data before running", g.name,
           v.kind == ValueKind::Param ? "param" : "const", value_ref_name(v.name),
           v.kind == ValueKind::Param ? " (IR text declares params by type only)"
                                      : " (its values were elided from the IR text)");
    env[i] = v.data;
  }

  const std::source_location here = std::source_location::current();
  const std::string here_prefix = location_str(here) + ": ";
  std::vector<Tensor> args;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    args.clear();
    for (ValueId v : n.inputs) {
      if (v == kNoValue) {
        args.emplace_back();
        continue;
      }
      KILN_CHECK(g.valid(v) && env[size_t(v)].defined(),
                 "{}: input {} has no value at this point (the graph is not in topological "
                 "order; run the verifier)",
                 node_desc(g, i), value_ref(g, v));
      args.push_back(env[size_t(v)]);
    }
    // Trailing optional inputs left out of the node are padded by dispatch
    // (pad_optional_inputs).
    TensorList outs;
    ScopedNodeName provenance(&n.name);
    try {
      if (has_symbolic_ints(n.attrs))
        outs = call_op(n.op, args, specialize_attrs(n.attrs, bindings), here);
      else outs = call_op(n.op, args, n.attrs, here);
    } catch (const Error& e) {
      throw_error(e.kind(), node_desc(g, i) + ": " + replace_all(e.message(), here_prefix, ""));
    }
    if (outs.size() != n.outputs.size())
      fail_kind(ErrorKind::Internal, "{}: the kernel returned {} outputs, the node has {}",
                node_desc(g, i), outs.size(), n.outputs.size());
    for (size_t k = 0; k < outs.size(); ++k) {
      const TensorType& want = g.type(n.outputs[k]);
      const Tensor& t = outs[k];
      bool ok = t.defined() && t.dtype() == want.dtype && t.dim() == want.rank();
      for (int j = 0; ok && j < want.rank(); ++j) {
        SymInt d = want.shape[size_t(j)];
        if (d.is_concrete()) {
          ok = d.raw() == t.sizes()[size_t(j)];
        } else {
          bool all_bound = true;
          for (const std::string& s : d.free_symbols())
            all_bound &= find_binding(bindings, s) != nullptr;
          if (all_bound) ok = d.evaluate(bindings) == t.sizes()[size_t(j)];
        }
      }
      if (!ok)
        fail_kind(ErrorKind::Internal,
                  "{}: the kernel produced {} for {}, but the graph's type is "
                  "{} (inference and kernel disagree)",
                  node_desc(g, i), t.defined() ? t.type().str() : "nothing",
                  value_ref(g, n.outputs[k]), want.str());
      env[size_t(n.outputs[k])] = std::move(outs[k]);
      if (last_use[size_t(n.outputs[k])] < 0) env[size_t(n.outputs[k])] = Tensor();  // dead value
    }
    for (ValueId v : n.inputs)
      if (v != kNoValue && last_use[size_t(v)] == int(i)) env[size_t(v)] = Tensor();
  }

  TensorList results;
  results.reserve(g.outputs.size());
  for (ValueId v : g.outputs) {
    KILN_CHECK(env[size_t(v)].defined(), "graph '{}': output {} was never computed", g.name,
               value_ref(g, v));
    results.push_back(env[size_t(v)]);
  }
  return results;
}

}  // namespace kiln
