// The per-node conversion context: inputs, attributes, emission with folding, outputs.
#include "frontends/onnx/convert.h"

#include <algorithm>

#include "ops/dispatch.h"

namespace kiln::onnx {

// Integers from the model go into Kiln attributes, whose int lists hold SymInt encodings
// (Note [SymInt encoding]): values below SymInt::kMinConcrete would read as symbol handles.
static int64_t checked_int(const NodeCtx& c, int64_t v, std::string_view what) {
  if (v < SymInt::kMinConcrete) c.fail("{} holds {}, beyond Kiln's integer range (+-2^62)", what, v);
  return v;
}

V ImportState::add_operand(Operand o) {
  operands.push_back(std::move(o));
  return V(operands.size() - 1);
}

ValueId ImportState::materialize(V v) {
  Operand& o = operands[size_t(v)];
  if (o.id != kNoValue) return o.id;
  KILN_ASSERT(o.data.defined());
  Tensor data = o.data.is_contiguous() ? o.data : o.data.contiguous();
  if (o.is_initializer)
    o.id = graph.add_param(graph.unique_name(o.name), data);
  else
    o.id = graph.add_const(data, graph.unique_name(o.name.empty() ? "const" : o.name));
  return o.id;
}

NodeCtx::NodeCtx(ImportState& st, const pb::NodeProto& node, const OnnxOpEntry& entry,
                 std::string node_name)
    : st_(st), node_(node), entry_(entry), name_(std::move(node_name)),
      first_value_(st.graph.values.size()), attr_used_(size_t(node.attribute_size()), false) {}

std::string NodeCtx::where() const {
  return fmt::format("{}: node '{}' ({})", st_.source, name_, node_.op_type());
}

// ---- inputs ----------------------------------------------------------------------------------

bool NodeCtx::has_input(size_t i) const {
  return i < num_inputs() && !node_.input(int(i)).empty();
}

V NodeCtx::in(size_t i) {
  if (!has_input(i))
    fail("input {} is required but {}", i, i < num_inputs() ? "empty" : "missing");
  auto it = st_.by_name.find(node_.input(int(i)));
  KILN_ASSERT(it != st_.by_name.end());  // topological_order checked every input
  return it->second;
}

V NodeCtx::in_opt(size_t i) { return has_input(i) ? in(i) : kNone; }

Dims NodeCtx::dims(V v, std::string_view what) const {
  Shape s = shape(v);
  Dims d;
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k].is_symbolic())
      not_supported("{} has symbolic shape {}; this mapping needs concrete sizes", what,
                    to_string(s));
    d.push_back(s[k].value());
  }
  return d;
}

const Tensor* NodeCtx::known(V v) const {
  const Operand& o = st_.operands[size_t(v)];
  return o.data.defined() ? &o.data : nullptr;
}

void NodeCtx::data_dependent(size_t i, std::string_view what) {
  V v = in(i);
  if (st_.operands[size_t(v)].is_sym)
    not_supported("input {} ('{}', {}) holds symbolic dims {}; Kiln needs its values at import "
                  "time here", i, node_.input(int(i)), what, to_string(Shape(st_.operands[size_t(v)].sym.begin(), st_.operands[size_t(v)].sym.end())));
  st_.hit_data_dependent = true;
  if (st_.options.needed_constant_inputs)
    for (V r : st_.operands[size_t(v)].roots)
      st_.options.needed_constant_inputs->push_back(st_.operands[size_t(r)].name);
  not_supported("input {} ('{}', {}) is computed at run time; Kiln needs it at import time (a "
                "data-dependent shape or parameter): make it an initializer or a Constant",
                i, node_.input(int(i)), what);
}

Tensor NodeCtx::known_input(size_t i, std::string_view what) {
  V v = in(i);
  if (const Tensor* t = known(v)) return *t;
  data_dependent(i, what);
}

std::optional<std::vector<SymInt>> NodeCtx::sym_values(V v) const {
  const Operand& o = st_.operands[size_t(v)];
  if (o.is_sym) return o.sym;
  if (o.data.defined() && is_integral(o.data.dtype()) && o.data.dim() <= 1) {
    std::vector<SymInt> out;
    for (int64_t x : o.data.to_vector<int64_t>())
      out.push_back(SymInt(checked_int(*this, x, "a shape value")));
    return out;
  }
  return std::nullopt;
}

std::vector<SymInt> NodeCtx::shape_input(size_t i, std::string_view what) {
  V v = in(i);
  if (auto s = sym_values(v)) return *s;
  if (known(v)) fail("input {} ('{}', {}) must be a 1-D integer tensor", i, node_.input(int(i)), what);
  data_dependent(i, what);
}

V NodeCtx::sym_value(std::vector<SymInt> values, bool scalar) {
  KILN_ASSERT(!scalar || values.size() == 1);
  bool concrete = true;
  for (SymInt x : values) concrete &= x.is_concrete();
  if (concrete) {
    std::vector<int64_t> v;
    for (SymInt x : values) v.push_back(x.value());
    return constant(scalar ? Tensor::full(Dims{}, double(v[0]), DType::Int64)
                           : Tensor::from_vector(v, Dims{int64_t(v.size())}));
  }
  Operand o;
  o.is_sym = true;
  o.sym = std::move(values);
  o.type = TensorType(DType::Int64, scalar ? Shape{} : Shape{SymInt(int64_t(o.sym.size()))});
  return st_.add_operand(std::move(o));
}

// Note [Symbolic shape values]
// Exporters compute shapes in the graph: x.view(x.size(0), -1) becomes Shape -> Gather ->
// Unsqueeze -> Concat -> Reshape. With concrete dims all of it folds to constants; with a
// symbolic batch the values are SymInts. sym_eval runs the few ops such chains use on those
// values (index_select/gather along 0, slice, concat, reshape/squeeze/unsqueeze between rank 0
// and 1, cast between integer types, + - * / (floor division), min, max), so that the reading
// op gets symbolic attributes. Anything else on a symbolic value is NotSupported, naming the
// node.
std::vector<V> NodeCtx::sym_eval(OpId id, const std::vector<V>& inputs, const Attrs& attrs_in) {
  const OpDef& def = op_def(id);
  Attrs attrs = def.canonicalize(attrs_in, where());
  auto vals = [&](size_t k) {
    if (k >= inputs.size() || inputs[k] == kNone) fail("{}: missing input {}", def.name, k);
    auto v = sym_values(inputs[k]);
    if (!v) not_supported("'{}' mixes symbolic shape values with run-time tensors", def.name);
    return *v;
  };
  auto rank_of = [&](size_t k) { return rank(inputs[k]); };
  auto unsupported = [&]() -> std::vector<V> {
    not_supported("'{}' on symbolic shape values (dims {}) is not supported; Kiln folds shape "
                  "arithmetic at import", def.name, to_string(shape(inputs[0])));
  };
  switch (id) {
    case OpId::Unsqueeze:
    case OpId::Squeeze:
    case OpId::Reshape:
    case OpId::Flatten: {
      std::vector<SymInt> v = vals(0);
      // Between rank 0 and rank 1 only; the values do not move.
      int out_rank;
      if (id == OpId::Unsqueeze) out_rank = rank_of(0) + int(attrs.get_ints("dims").size());
      else if (id == OpId::Squeeze) out_rank = v.size() == 1 ? 0 : 1;
      else if (id == OpId::Flatten) out_rank = 1;
      else out_rank = int(attrs.get_ints("shape").size());
      if (out_rank > 1) return unsupported();
      if (out_rank == 0 && v.size() != 1) return unsupported();
      return {sym_value(v, out_rank == 0)};
    }
    case OpId::Cast: {
      if (!is_integral(attrs.get_dtype("dtype"))) return unsupported();
      return {sym_value(vals(0), rank_of(0) == 0)};
    }
    case OpId::IndexSelect:
    case OpId::Gather: {
      std::vector<SymInt> v = vals(0), idx = vals(1);
      if (rank_of(0) != 1) return unsupported();
      std::vector<SymInt> out;
      for (SymInt i : idx) {
        int64_t k = i.value();
        if (k < 0) k += int64_t(v.size());
        if (k < 0 || k >= int64_t(v.size())) fail("index {} is out of range for {} values", i.value(), v.size());
        out.push_back(v[size_t(k)]);
      }
      return {sym_value(out, id == OpId::Gather && rank_of(1) == 0)};
    }
    case OpId::Slice: {
      std::vector<SymInt> v = vals(0);
      int64_t n = int64_t(v.size()), step = attrs.get_int("step");
      auto clampb = [&](int64_t b) { return std::clamp(b < 0 ? b + n : b, int64_t(0), n); };
      int64_t st = clampb(attrs.get_int("start")), en = clampb(attrs.get_int("end"));
      std::vector<SymInt> out;
      for (int64_t k = st; k < en; k += step) out.push_back(v[size_t(k)]);
      return {sym_value(out, false)};
    }
    case OpId::Concat: {
      std::vector<SymInt> out;
      for (size_t k = 0; k < inputs.size(); ++k) {
        if (rank_of(k) != 1) return unsupported();
        for (SymInt x : vals(k)) out.push_back(x);
      }
      return {sym_value(out, false)};
    }
    case OpId::Add:
    case OpId::Sub:
    case OpId::Mul:
    case OpId::Div:
    case OpId::Maximum:
    case OpId::Minimum: {
      std::vector<SymInt> a = vals(0), b = vals(1);
      if (a.size() != b.size() && a.size() != 1 && b.size() != 1) return unsupported();
      if (!is_integral(dtype(inputs[0])) || !is_integral(dtype(inputs[1]))) return unsupported();
      size_t n = std::max(a.size(), b.size());
      std::vector<SymInt> out;
      for (size_t k = 0; k < n; ++k) {
        SymInt x = a[a.size() == 1 ? 0 : k], y = b[b.size() == 1 ? 0 : k];
        switch (id) {
          case OpId::Add: out.push_back(x + y); break;
          case OpId::Sub: out.push_back(x - y); break;
          case OpId::Mul: out.push_back(x * y); break;
          case OpId::Maximum: out.push_back(sym_max(x, y)); break;
          case OpId::Minimum: out.push_back(sym_min(x, y)); break;
          default:
            if (y.is_concrete() && y.value() <= 0) return unsupported();
            out.push_back(floordiv(x, y));  // dims are >= 0: floor = truncation
        }
      }
      return {sym_value(out, rank_of(0) == 0 && rank_of(1) == 0)};
    }
    default: return unsupported();
  }
}

std::vector<int64_t> NodeCtx::ints_input(size_t i, std::string_view what, bool saturate) {
  Tensor t = known_input(i, what);
  if (!is_integral(t.dtype()))
    fail("input {} ('{}', {}) must be an integer tensor, got {}", i, node_.input(int(i)), what,
         dtype_name(t.dtype()));
  std::vector<int64_t> v = t.to_vector<int64_t>();
  for (int64_t& x : v) {
    if (saturate) x = std::max(x, SymInt::kMinConcrete);
    checked_int(*this, x, fmt::format("input '{}' ({})", node_.input(int(i)), what));
  }
  return v;
}

std::vector<double> NodeCtx::floats_input(size_t i, std::string_view what) {
  return known_input(i, what).to_vector<double>();
}

// ---- attributes ------------------------------------------------------------------------------

static const char* attr_type_str(int t) {
  if (pb::AttributeProto::AttributeType_IsValid(t))
    return pb::AttributeProto::AttributeType_Name(pb::AttributeProto::AttributeType(t)).c_str();
  return "?";
}

const pb::AttributeProto* NodeCtx::find_attr(std::string_view name, int type) const {
  for (int i = 0; i < node_.attribute_size(); ++i) {
    const pb::AttributeProto& a = node_.attribute(i);
    if (a.name() != name) continue;
    attr_used_[size_t(i)] = true;
    if (!a.ref_attr_name().empty())
      not_supported("attribute '{}' refers to a function attribute", a.name());
    int t = a.type();
    if (t == pb::AttributeProto::UNDEFINED) {  // very old exporters leave the type unset
      if (a.has_f()) t = pb::AttributeProto::FLOAT;
      else if (a.has_i()) t = pb::AttributeProto::INT;
      else if (a.has_s()) t = pb::AttributeProto::STRING;
      else if (a.has_t()) t = pb::AttributeProto::TENSOR;
      else if (a.ints_size()) t = pb::AttributeProto::INTS;
      else if (a.floats_size()) t = pb::AttributeProto::FLOATS;
      else if (a.strings_size()) t = pb::AttributeProto::STRINGS;
      else t = type;  // an empty list
    }
    // Integer attributes given where floats are expected (and empty lists) are accepted.
    bool ok = t == type || (type == pb::AttributeProto::FLOAT && t == pb::AttributeProto::INT) ||
              (type == pb::AttributeProto::FLOATS && t == pb::AttributeProto::INTS);
    if (!ok)
      fail("attribute '{}' must be {}, got {}", a.name(), attr_type_str(type), attr_type_str(t));
    return &a;
  }
  return nullptr;
}

bool NodeCtx::has_attr(std::string_view name) const {
  for (const pb::AttributeProto& a : node_.attribute())
    if (a.name() == name) return true;
  return false;
}

int64_t NodeCtx::attr_int(std::string_view name, int64_t def) {
  return attr_int_opt(name).value_or(def);
}

std::optional<int64_t> NodeCtx::attr_int_opt(std::string_view name) {
  const pb::AttributeProto* a = find_attr(name, pb::AttributeProto::INT);
  if (!a) return std::nullopt;
  return checked_int(*this, a->i(), fmt::format("attribute '{}'", name));
}

double NodeCtx::attr_float(std::string_view name, double def) {
  const pb::AttributeProto* a = find_attr(name, pb::AttributeProto::FLOAT);
  if (!a) return def;
  return a->type() == pb::AttributeProto::INT ? double(a->i()) : double(a->f());
}

std::string NodeCtx::attr_string(std::string_view name, std::string def) {
  const pb::AttributeProto* a = find_attr(name, pb::AttributeProto::STRING);
  return a ? a->s() : def;
}

std::vector<int64_t> NodeCtx::attr_ints(std::string_view name, std::vector<int64_t> def) {
  return attr_ints_opt(name).value_or(std::move(def));
}

std::optional<std::vector<int64_t>> NodeCtx::attr_ints_opt(std::string_view name) {
  const pb::AttributeProto* a = find_attr(name, pb::AttributeProto::INTS);
  if (!a) return std::nullopt;
  for (int64_t x : a->ints()) checked_int(*this, x, fmt::format("attribute '{}'", name));
  return std::vector<int64_t>(a->ints().begin(), a->ints().end());
}

std::vector<double> NodeCtx::attr_floats(std::string_view name, std::vector<double> def) {
  const pb::AttributeProto* a = find_attr(name, pb::AttributeProto::FLOATS);
  if (!a) return def;
  if (a->type() == pb::AttributeProto::INTS)
    return std::vector<double>(a->ints().begin(), a->ints().end());
  return std::vector<double>(a->floats().begin(), a->floats().end());
}

std::vector<std::string> NodeCtx::attr_strings(std::string_view name) {
  const pb::AttributeProto* a = find_attr(name, pb::AttributeProto::STRINGS);
  if (!a) return {};
  return std::vector<std::string>(a->strings().begin(), a->strings().end());
}

std::optional<Tensor> NodeCtx::attr_tensor_opt(std::string_view name) {
  const pb::AttributeProto* a = find_attr(name, pb::AttributeProto::TENSOR);
  if (!a) return std::nullopt;
  return tensor_from_proto(a->t(), st_.model_dir, st_.options.max_tensor_bytes,
                           fmt::format("{}: attribute '{}'", where(), name));
}

const pb::GraphProto* NodeCtx::attr_graph(std::string_view name) {
  const pb::AttributeProto* a = find_attr(name, pb::AttributeProto::GRAPH);
  return a && a->has_g() ? &a->g() : nullptr;
}

void NodeCtx::ignore_attr(std::string_view name) {
  for (int i = 0; i < node_.attribute_size(); ++i)
    if (node_.attribute(i).name() == name) attr_used_[size_t(i)] = true;
}

void NodeCtx::check_attrs_used() const {
  for (int i = 0; i < node_.attribute_size(); ++i)
    if (!attr_used_[size_t(i)] &&
        // Opsets before 7 tag in-place hints on many ops; they do not change results.
        !(st_.opset < 7 && node_.attribute(i).name() == "consumed_inputs"))
      not_supported("attribute '{}' is not handled by Kiln's mapping of {} (opset {})",
                    node_.attribute(i).name(), node_.op_type(), st_.opset);
}

// ---- emitting ----------------------------------------------------------------------------------

std::vector<V> NodeCtx::op(OpId id, const std::vector<V>& inputs, const Attrs& attrs) {
  if (std::find(entry_.kiln_ops.begin(), entry_.kiln_ops.end(), id) == entry_.kiln_ops.end())
    fail_kind(ErrorKind::Internal,
              "internal error: the {} converter emitted '{}', which its op-table entry does not "
              "declare", node_.op_type(), op_def(id).name);
  const OpDef& def = op_def(id);

  for (V v : inputs)
    if (v != kNone && st_.operands[size_t(v)].is_sym) return sym_eval(id, inputs, attrs);

  // Folding: every input known and the result small.
  bool all_known = !inputs.empty();
  TensorList args;
  for (V v : inputs) {
    if (v == kNone) {
      args.emplace_back();
      continue;
    }
    const Operand& o = st_.operands[size_t(v)];
    // Weights stay params: an op over a floating-point initializer (other than a scalar) is a
    // node, not a folded constant.
    if (o.is_initializer && is_floating(o.data.dtype()) && o.data.numel() > 1 && !st_.evaluate)
      all_known = false;
    if (const Tensor* t = known(v)) args.push_back(*t);
    else all_known = false;
  }
  if (all_known) {
    Attrs canon = def.canonicalize(attrs, where());
    std::vector<TensorType> types = infer_types(def, args, canon, where());
    int64_t total = 0;
    bool concrete = true;  // (expand of a constant to a symbolic shape stays a node)
    for (const TensorType& t : types) {
      concrete &= is_concrete(t.shape);
      if (concrete) total += numel(to_dims(t.shape));
    }
    if (concrete && (total <= st_.options.max_fold_elements || st_.evaluate)) {
      NoDispatchHook no_capture;
      TensorList outs;
      try {
        outs = call_op(id, args, canon);
      } catch (const Error& e) {
        throw_error(e.kind(), where() + ": folding " + def.name + ": " + e.message());
      }
      std::vector<V> result;
      for (Tensor& t : outs) {
        Operand o;
        o.data = t.is_contiguous() ? t : t.contiguous();
        o.type = o.data.type();
        result.push_back(st_.add_operand(std::move(o)));
      }
      return result;
    }
  }

  if (st_.evaluate)
    fail_kind(ErrorKind::Internal, "{}: evaluating '{}' of a data-dependent tail: an input is "
              "not known or the result's shape is not concrete", where(), def.name);
  std::vector<ValueId> ids;
  std::vector<V> roots;
  for (V v : inputs) {
    ids.push_back(v == kNone ? kNoValue : st_.materialize(v));
    if (v == kNone) continue;
    for (V r : st_.operands[size_t(v)].roots)
      if (roots.size() < kMaxRoots && std::find(roots.begin(), roots.end(), r) == roots.end())
        roots.push_back(r);
  }
  std::vector<ValueId> outs = st_.graph.add_node(id, std::move(ids), attrs, name_);
  std::vector<V> result;
  for (ValueId o : outs) {
    // A hostile model can ask for outputs no machine can hold; refuse before anything runs.
    const TensorType& t = st_.graph.type(o);
    if (is_concrete(t.shape)) {
      int64_t n = 1, limit = st_.options.max_tensor_bytes / dtype_size(t.dtype);
      for (SymInt d : t.shape) {
        if (d.value() != 0 && n > limit / d.value())
          fail("'{}' would produce {} (beyond the {}-byte tensor limit, "
               "ImportOptions::max_tensor_bytes)", def.name, t.str(), st_.options.max_tensor_bytes);
        n *= d.value();
      }
    }
    Operand op;
    op.id = o;
    op.type = st_.graph.type(o);
    op.roots = roots;
    result.push_back(st_.add_operand(std::move(op)));
  }
  return result;
}

V NodeCtx::op1(OpId id, const std::vector<V>& inputs, const Attrs& attrs) {
  std::vector<V> r = op(id, inputs, attrs);
  KILN_ASSERT(r.size() == 1);
  return r[0];
}

V NodeCtx::constant(Tensor t) {
  Operand o;
  o.data = t.is_contiguous() ? t : t.contiguous();
  o.type = o.data.type();
  return st_.add_operand(std::move(o));
}

V NodeCtx::scalar(double value, DType dtype) {
  return constant(Tensor::full(Dims{}, value, dtype));
}

V NodeCtx::cast(V x, DType to) {
  if (dtype(x) == to) return x;
  return op1(OpId::Cast, {x}, {{"dtype", to}});
}

V NodeCtx::reshape(V x, const Shape& s) {
  Ints raw;
  for (SymInt d : s) raw.push_back(d.raw());
  return op1(OpId::Reshape, {x}, {{"shape", raw}});
}

V NodeCtx::unsqueeze(V x, std::vector<int64_t> dims) {
  return op1(OpId::Unsqueeze, {x}, {{"dims", Ints(std::move(dims))}});
}

V NodeCtx::squeeze(V x, std::vector<int64_t> dims) {
  return op1(OpId::Squeeze, {x}, {{"dims", Ints(std::move(dims))}});
}

V NodeCtx::permute(V x, std::vector<int64_t> dims) {
  bool identity = true;
  for (size_t i = 0; i < dims.size(); ++i) identity &= dims[i] == int64_t(i);
  if (identity) return x;
  return op1(OpId::Permute, {x}, {{"dims", Ints(std::move(dims))}});
}

V NodeCtx::slice(V x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  return op1(OpId::Slice, {x}, {{"dim", dim}, {"start", start}, {"end", end}, {"step", step}});
}

V NodeCtx::full(const Shape& shape, double value, DType dtype) {
  Ints raw;
  for (SymInt d : shape) raw.push_back(d.raw());
  return op1(OpId::Expand, {scalar(value, dtype)}, {{"shape", raw}});
}

std::vector<int64_t> NodeCtx::perm_to_last(int r, int64_t axis) {
  std::vector<int64_t> p;
  for (int64_t i = 0; i < r; ++i)
    if (i != axis) p.push_back(i);
  p.push_back(axis);
  return p;
}

std::vector<int64_t> NodeCtx::inverse_perm(const std::vector<int64_t>& p) {
  std::vector<int64_t> inv(p.size());
  for (size_t i = 0; i < p.size(); ++i) inv[size_t(p[i])] = int64_t(i);
  return inv;
}

int64_t NodeCtx::axis(int64_t a, int r, std::string_view what) const {
  // Every caller indexes the input's dims with the result: a scalar has none to index.
  if (r == 0) fail("{} {} needs an input of rank >= 1, found a scalar (rank 0)", what, a);
  if (a < -r || a >= r) fail("{} {} is out of range for rank {}", what, a, r);
  return a < 0 ? a + r : a;
}

// ---- outputs -----------------------------------------------------------------------------------

bool NodeCtx::wants_output(size_t i) const {
  return i < num_outputs() && !node_.output(int(i)).empty();
}

void NodeCtx::out(size_t i, V v) {
  if (!wants_output(i)) return;
  const std::string& name = node_.output(int(i));
  st_.by_name[name] = v;
  // Values this node created take the ONNX name (readable IR); others keep theirs.
  Operand& o = st_.operands[size_t(v)];
  if (o.id != kNoValue && size_t(o.id) >= first_value_ &&
      st_.graph.value(o.id).kind == ValueKind::NodeOutput && o.name.empty()) {
    o.name = name;
    st_.graph.rename_value(o.id, st_.graph.unique_name(name));
  }
  if (o.name.empty() && !o.is_initializer) o.name = name;
}

}  // namespace kiln::onnx
