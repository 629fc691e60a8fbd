#include <cstring>
#include <array>
#include <mutex>

#include <fmt/format.h>

#include "ops/op.h"

namespace kiln {

// Each family file defines register_<family>_ops().
#define KILN_OP_FAMILY(f) void register_##f##_ops();
#include "ops/ops.def"

namespace {

struct Extension {
  const char* name;
  OpExtensionFn fn;
};
struct Extensions {
  std::mutex mu;
  std::vector<Extension> list;
  bool built = false;  // the registry exists: a new extension runs at once
};
Extensions& extensions() {
  static Extensions* e = new Extensions();  // never destroyed: static destruction order
  return *e;
}

struct OpName {
  const char* name;
  const char* family;
};
constexpr OpName kOpNames[] = {
#define KILN_OP(I, N, F, T) {N, #F},
#include "ops/ops.def"
#undef KILN_OP
};
static_assert(std::size(kOpNames) == size_t(kNumOps), "ops.def and kOpNames disagree");

std::array<OpDef, kNumOps>& table() {
  static std::array<OpDef, kNumOps> t;
  return t;
}

bool g_registering = false;

void build_registry() {
  auto& t = table();
  for (int i = 0; i < kNumOps; ++i) {
    t[i].id = OpId(i);
    t[i].name = kOpNames[i].name;
    t[i].family = kOpNames[i].family;
    t[i].traits = kOpTraits[i];
    t[i].is_view = t[i].has(trait::View);
  }
  g_registering = true;
#define KILN_OP_FAMILY(f) register_##f##_ops();
#include "ops/ops.def"
  for (int i = 0; i < kNumOps; ++i)
    KILN_ASSERT(t[i].is_view == t[i].has(trait::View));  // a family set is_view against ops.def
  Extensions& ext = extensions();
  std::lock_guard<std::mutex> lock(ext.mu);
  for (const Extension& e : ext.list) e.fn();
  ext.built = true;
  g_registering = false;
}

const std::array<OpDef, kNumOps>& registry() {
  static std::once_flag once;
  std::call_once(once, build_registry);
  return table();
}

}  // namespace

std::string op_traits_str(OpTrait t) {
  using namespace trait;
  static constexpr std::pair<OpTrait, const char*> kNames[] = {
      {Pointwise, "pointwise"}, {Commutative, "commutative"}, {Reduction, "reduction"},
      {RowNorm, "row_norm"},    {View, "view"},               {Contraction, "contraction"},
      {Pooling, "pooling"},     {Spatial, "spatial"},         {Indexing, "indexing"}};
  std::string s;
  for (auto [bit, name] : kNames)
    if (uint32_t(t) & uint32_t(bit)) s += (s.empty() ? "" : "|") + std::string(name);
  return s.empty() ? "none" : s;
}

bool register_op_extension(const char* name, OpExtensionFn fn) {
  Extensions& ext = extensions();
  std::lock_guard<std::mutex> lock(ext.mu);
  ext.list.push_back({name, fn});
  if (ext.built) {
    g_registering = true;
    fn();
    g_registering = false;
  }
  return true;
}

std::vector<std::string> op_extension_names() {
  Extensions& ext = extensions();
  std::lock_guard<std::mutex> lock(ext.mu);
  std::vector<std::string> out;
  for (const Extension& e : ext.list) out.push_back(e.name);
  return out;
}

std::vector<std::string> registry_problems() {
  // Every op listed in ops.def must have a full record: inference, a reference kernel or a
  // decomposition, dtypes and test samples. tests/unit checks that this list is empty.
  std::vector<std::string> problems;
  for (const OpDef& d : registry()) {
    if (!d.infer) problems.push_back(fmt::format("{}: no inference", d.name));
    if (!d.reference && !d.decompose) problems.push_back(fmt::format("{}: no kernel", d.name));
    if (d.dtypes.empty()) problems.push_back(fmt::format("{}: no dtypes", d.name));
    if (!d.samples) problems.push_back(fmt::format("{}: no test samples", d.name));
  }
  return problems;
}

OpDef& define_op(OpId id) {
  KILN_ASSERT(g_registering);
  return table()[size_t(id)];
}

const OpDef& op_def(OpId id) { return registry()[size_t(id)]; }

const OpDef* find_op(std::string_view name) {
  for (const OpDef& d : registry())
    if (name == d.name) return &d;
  return nullptr;
}

std::span<const OpDef> all_ops() { return {registry().data(), registry().size()}; }

std::vector<DType> float_dtypes() {
  return {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16};
}
std::vector<DType> numeric_dtypes() {
  return {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
          DType::Int64,   DType::Int32,   DType::Int8,    DType::UInt8};
}
std::vector<DType> all_dtypes() {
  auto v = numeric_dtypes();
  v.push_back(DType::Bool);
  return v;
}

bool OpDef::supports_dtype(DType d) const {
  for (DType x : dtypes)
    if (x == d) return true;
  return false;
}

int OpDef::attr_index(std::string_view n) const {
  for (size_t i = 0; i < attrs.size(); ++i)
    if (attrs[i].name == n) return int(i);
  return -1;
}

static bool value_matches(AttrType t, const AttrValue& v) {
  switch (t) {
    case AttrType::Int: return std::holds_alternative<int64_t>(v);
    case AttrType::Float:
      return std::holds_alternative<double>(v) || std::holds_alternative<int64_t>(v);
    case AttrType::Bool: return std::holds_alternative<bool>(v);
    case AttrType::String: return std::holds_alternative<std::string>(v);
    case AttrType::Ints: return std::holds_alternative<Ints>(v);
    case AttrType::Floats:
      return std::holds_alternative<Floats>(v) || std::holds_alternative<Ints>(v);
    case AttrType::DType: return std::holds_alternative<DType>(v);
  }
  return false;
}

Attrs OpDef::canonicalize(const Attrs& given, std::string_view where) const {
  for (auto& [n, v] : given.items()) {
    int idx = attr_index(n);
    if (idx < 0) {
      std::string known;
      for (auto& a : attrs) known += (known.empty() ? "" : ", ") + a.name;
      fail("{}: op '{}' has no attribute '{}' (its attributes: {})", where, name, n,
           known.empty() ? "none" : known);
    }
  }
  Attrs out;
  for (const AttrSpec& spec : attrs) {
    const AttrValue* v = given.find(spec.name);
    AttrValue value = v ? *v : spec.default_value;
    if (std::holds_alternative<std::monostate>(value)) {
      if (!spec.optional)
        fail("{}: op '{}' needs attribute '{}' ({})", where, name, spec.name,
             attr_type_name(spec.type));
    } else if (!value_matches(spec.type, value)) {
      fail("{}: op '{}' attribute '{}' must be {}, got {}", where, name, spec.name,
           attr_type_name(spec.type), attr_value_str(value));
    } else if (spec.type == AttrType::Float && std::holds_alternative<int64_t>(value)) {
      value = double(std::get<int64_t>(value));
    } else if (spec.type == AttrType::Floats && std::holds_alternative<Ints>(value)) {
      Floats f;
      for (int64_t x : std::get<Ints>(value)) f.push_back(double(x));
      value = f;
    }
    out.items().emplace_back(spec.name, std::move(value));
  }
  return out;
}

void OpDef::check_arity(size_t n, std::string_view where) const {
  size_t required = 0;
  bool variadic = !inputs.empty() && inputs.back().variadic;
  for (const InputSpec& s : inputs)
    if (!s.optional) ++required;
  if (variadic) {
    if (n < inputs.size())
      fail("{}: op '{}' takes at least {} inputs, got {}", where, name, inputs.size(), n);
    return;
  }
  if (n < required || n > inputs.size())
    fail("{}: op '{}' takes {} inputs{}, got {}", where, name,
         required == inputs.size() ? fmt::format("{}", required)
                                   : fmt::format("{} to {}", required, inputs.size()),
         "", n);
}

// ---- InferContext -----------------------------------------------------------------------------
const TensorType& InferContext::in(size_t i) const {
  if (!has_input(i))
    fail("input {} ('{}') is missing", i, i < op.inputs.size() ? op.inputs[i].name : "?");
  return *inputs[i];
}

std::string InferContext::where() const {
  if (node_name.empty()) return fmt::format("op '{}'", op.name);
  return fmt::format("op '{}' (node '{}')", op.name, node_name);
}

// ---- Attrs ------------------------------------------------------------------------------------
const char* attr_type_name(AttrType t) {
  switch (t) {
    case AttrType::Int: return "int";
    case AttrType::Float: return "float";
    case AttrType::Bool: return "bool";
    case AttrType::String: return "string";
    case AttrType::Ints: return "int list";
    case AttrType::Floats: return "float list";
    case AttrType::DType: return "dtype";
  }
  return "?";
}

namespace {
bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }
}  // namespace

bool same_attr_value(const AttrValue& a, const AttrValue& b) {
  if (a.index() != b.index()) return false;
  if (const double* x = std::get_if<double>(&a)) return same_bits(*x, std::get<double>(b));
  if (const Floats* x = std::get_if<Floats>(&a)) {
    const Floats& y = std::get<Floats>(b);
    if (x->size() != y.size()) return false;
    for (size_t i = 0; i < x->size(); ++i)
      if (!same_bits((*x)[i], y[i])) return false;
    return true;
  }
  return a == b;
}

bool operator==(const Attrs& a, const Attrs& b) {
  if (a.items_.size() != b.items_.size()) return false;
  for (size_t i = 0; i < a.items_.size(); ++i)
    if (a.items_[i].first != b.items_[i].first || !same_attr_value(a.items_[i].second, b.items_[i].second))
      return false;
  return true;
}

Attrs::Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items) {
  for (auto& it : items) set(it.first, it.second);
}

void Attrs::set(std::string_view name, AttrValue v) {
  for (auto& [n, val] : items_)
    if (n == name) {
      val = std::move(v);
      return;
    }
  items_.emplace_back(std::string(name), std::move(v));
}

const AttrValue* Attrs::find(std::string_view name) const {
  for (auto& [n, v] : items_)
    if (n == name) return &v;
  return nullptr;
}

bool Attrs::has(std::string_view name) const {
  const AttrValue* v = find(name);
  return v && !std::holds_alternative<std::monostate>(*v);
}

template <typename T>
static const T& get_as(const Attrs& a, std::string_view name, const char* type) {
  const AttrValue* v = a.find(name);
  if (!v) fail("attribute '{}' is missing", name);
  if (!std::holds_alternative<T>(*v))
    fail("attribute '{}' is {}, expected {}", name, attr_value_str(*v), type);
  return std::get<T>(*v);
}

int64_t Attrs::get_int(std::string_view n) const { return get_as<int64_t>(*this, n, "an int"); }
double Attrs::get_float(std::string_view n) const {
  const AttrValue* v = find(n);
  if (v && std::holds_alternative<int64_t>(*v)) return double(std::get<int64_t>(*v));
  return get_as<double>(*this, n, "a float");
}
bool Attrs::get_bool(std::string_view n) const { return get_as<bool>(*this, n, "a bool"); }
const std::string& Attrs::get_string(std::string_view n) const {
  return get_as<std::string>(*this, n, "a string");
}
const Ints& Attrs::get_ints(std::string_view n) const { return get_as<Ints>(*this, n, "an int list"); }
Floats Attrs::get_floats(std::string_view n) const {
  const AttrValue* v = find(n);
  if (v && std::holds_alternative<Ints>(*v)) {
    Floats f;
    for (int64_t x : std::get<Ints>(*v)) f.push_back(double(x));
    return f;
  }
  return get_as<Floats>(*this, n, "a float list");
}
DType Attrs::get_dtype(std::string_view n) const { return get_as<DType>(*this, n, "a dtype"); }
Shape Attrs::get_shape(std::string_view n) const {
  Shape s;
  for (int64_t raw : get_ints(n)) s.push_back(SymInt::from_raw(raw));
  return s;
}

static std::string float_str(double d) {
  // Shortest text that parses back to the same double.
  std::string s = fmt::format("{}", d);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // keep it a float literal
  return s;
}

std::string attr_value_str(const AttrValue& v) {
  struct V {
    std::string operator()(std::monostate) const { return "none"; }
    std::string operator()(int64_t x) const { return SymInt::from_raw(x).str(); }
    std::string operator()(double x) const { return float_str(x); }
    std::string operator()(bool x) const { return x ? "true" : "false"; }
    std::string operator()(const std::string& s) const {
      std::string o = "\"";
      for (char c : s) {
        if (c == '"' || c == '\\') o += '\\';
        o += c;
      }
      return o + "\"";
    }
    std::string operator()(const Ints& xs) const {
      std::string o = "[";
      for (size_t i = 0; i < xs.size(); ++i) o += (i ? ", " : "") + SymInt::from_raw(xs[i]).str();
      return o + "]";
    }
    std::string operator()(const Floats& xs) const {
      std::string o = "[";
      for (size_t i = 0; i < xs.size(); ++i) o += (i ? ", " : "") + float_str(xs[i]);
      return o + "]";
    }
    std::string operator()(DType d) const { return info(d).short_name; }
  };
  return std::visit(V{}, v);
}

}  // namespace kiln
