// The op registry: one record per op in ops.def. See Note [Op records].
//
// Note [Op records]
// An OpDef holds everything Kiln knows about an op:
//   - schema: named inputs (optional / variadic) and typed attributes with defaults;
//   - infer: dtype and shape inference over TensorTypes with SymInt shapes (so it works on
//     symbolic graphs); it is also the validator: bad inputs fail here, naming the op and node;
//   - reference: a plain, obviously correct CPU kernel (float64 / int64 arithmetic inside);
//     the oracle for every test;
//   - decompose: for composite ops, the op written with other ops through the eager API (it is
//     traced into core ops by the compiler's decomposition pass);
//   - traits: facts from ops.def (pointwise, reduction, view, ...; see there);
//   - eager_cpu / eager_cuda: optimized eager kernels (oneDNN conv/matmul, vectorized loops);
//     CUDA kernels attach themselves from src/eager/cuda through a registry extension;
//   - gradient: wave 3 (autodiff); empty today and reported as such by `kiln ops --json`.
//     How each compiler target runs the op is the target's own table (compiler/target.h:
//     OpSupport), not a field here;
//   - samples: test cases (inputs + attrs) from which the op harness checks every op in every
//     dtype it supports against the float64 reference.
// Kernels receive inputs in any strides; non-view ops get preallocated contiguous outputs of the
// inferred types; view ops (is_view) set their outputs themselves, sharing input storage.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "core/tensor_type.h"

namespace kiln {

enum class OpId : uint16_t {
#define KILN_OP(I, N, F, T) I,
#include "ops/ops.def"
#undef KILN_OP
};

inline constexpr int kNumOps = 0
#define KILN_OP(I, N, F, T) +1
#include "ops/ops.def"
#undef KILN_OP
    ;

// Facts about an op, the traits column of ops.def (see the comment there): trait::Pointwise, ...
namespace trait {
enum OpTrait : uint32_t {
  None = 0,
  Pointwise = 1u << 0,
  Commutative = 1u << 1,
  Reduction = 1u << 2,
  RowNorm = 1u << 3,
  View = 1u << 4,
  Contraction = 1u << 5,
  Pooling = 1u << 6,
  Spatial = 1u << 7,
  Indexing = 1u << 8,
};
constexpr OpTrait operator|(OpTrait a, OpTrait b) { return OpTrait(uint32_t(a) | uint32_t(b)); }

// The traits of every op, by OpId (a constant table, usable in constant expressions).
inline constexpr OpTrait kByOp[] = {
#define KILN_OP(I, N, F, T) T,
#include "ops/ops.def"
#undef KILN_OP
};
}  // namespace trait
using trait::OpTrait;
inline constexpr const OpTrait* kOpTraits = trait::kByOp;
static_assert(std::size(trait::kByOp) == size_t(kNumOps), "ops.def and the traits table disagree");
constexpr bool op_has(OpId op, OpTrait t) { return (uint32_t(kOpTraits[size_t(op)]) & uint32_t(t)) != 0; }
// "pointwise|commutative" (kiln ops).
std::string op_traits_str(OpTrait t);

// ---- attributes -------------------------------------------------------------------------------
enum class AttrType : uint8_t { Int, Float, Bool, String, Ints, Floats, DType };
const char* attr_type_name(AttrType t);

// Int lists hold SymInt raw values (see Note [SymInt encoding]), so shape-like attributes can
// be symbolic; for concrete values the encoding is the plain integer.
using AttrValue = std::variant<std::monostate, int64_t, double, bool, std::string,
                               std::vector<int64_t>, std::vector<double>, DType>;
using Ints = std::vector<int64_t>;
using Floats = std::vector<double>;

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items);

  void set(std::string_view name, AttrValue v);
  const AttrValue* find(std::string_view name) const;
  // Present and not "none".
  bool has(std::string_view name) const;

  int64_t get_int(std::string_view name) const;
  double get_float(std::string_view name) const;  // accepts an Int value too
  bool get_bool(std::string_view name) const;
  const std::string& get_string(std::string_view name) const;
  const Ints& get_ints(std::string_view name) const;
  Floats get_floats(std::string_view name) const;
  DType get_dtype(std::string_view name) const;
  Shape get_shape(std::string_view name) const;  // an Ints attribute as SymInts

  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }
  std::vector<std::pair<std::string, AttrValue>>& items() { return items_; }
  size_t size() const { return items_.size(); }
  // Same names in the same order and the same values, floats compared by their bits: a NaN
  // attribute (a pad value, a fill) equals itself — the verifier's canonical-form check, CSE and
  // capture's host-value check all compare attributes — and -0.0 differs from 0.0.
  friend bool operator==(const Attrs& a, const Attrs& b);

 private:
  std::vector<std::pair<std::string, AttrValue>> items_;
};

// Attribute values compared as Attrs' operator== does (floats by their bits).
bool same_attr_value(const AttrValue& a, const AttrValue& b);

// "[1, 2]", "1.5", "true", "\"tanh\"", "f32", "none" — the IR text form of a value.
std::string attr_value_str(const AttrValue& v);

struct AttrSpec {
  std::string name;
  AttrType type;
  // std::monostate: required unless `optional` (then "none" is a valid value).
  AttrValue default_value;
  bool optional = false;
};

struct InputSpec {
  std::string name;
  bool optional = false;
  bool variadic = false;  // only the last input; takes >= 1 tensors
};

struct OpDef;

// ---- inference --------------------------------------------------------------------------------
struct InferContext {
  const OpDef& op;
  std::string_view node_name;                   // graph node or call site; may be empty
  std::span<const TensorType* const> inputs;    // nullptr for an absent optional input
  const Attrs& attrs;                           // canonical: defaults filled in

  size_t num_inputs() const { return inputs.size(); }
  bool has_input(size_t i) const { return i < inputs.size() && inputs[i] != nullptr; }
  const TensorType& in(size_t i) const;
  // "op 'conv2d' (node 'stem.conv1')"
  std::string where() const;
  template <typename... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) const {
    throw_error(ErrorKind::InvalidArgument,
                where() + ": " + fmt::format(f, std::forward<Args>(args)...));
  }
};
using InferFn = std::vector<TensorType> (*)(const InferContext&);

// ---- kernels ----------------------------------------------------------------------------------
struct KernelContext {
  const OpDef& op;
  std::span<const Tensor> inputs;  // undefined Tensor for an absent optional input
  std::span<Tensor> outputs;       // preallocated (non-view ops) or to be set (view ops)
  const Attrs& attrs;
  std::span<const TensorType> out_types;  // inferred output types
};
using KernelFn = void (*)(const KernelContext&);
using DecomposeFn = TensorList (*)(std::span<const Tensor> inputs, const Attrs& attrs);

// ---- test samples -----------------------------------------------------------------------------
struct OpSample {
  // Floating inputs are float64 here; the harness casts them to each tested dtype. Integer
  // inputs (indices) are passed unchanged.
  TensorList inputs;
  Attrs attrs;
  std::string note;  // "broadcast [3,1] x [4]", shown when a case fails
};
using SampleFn = std::vector<OpSample> (*)(Generator& gen);

struct GradientRule;  // defined by autodiff (wave 3)

struct OpDef {
  OpId id{};
  const char* name = "";
  const char* family = "";
  std::string doc;

  std::vector<InputSpec> inputs;
  std::vector<AttrSpec> attrs;
  int num_outputs = 1;  // -1: decided by inference (e.g. split)
  OpTrait traits = trait::None;  // from ops.def
  bool is_view = false;   // traits has View (set by the registry)
  bool has(OpTrait t) const { return (uint32_t(traits) & uint32_t(t)) != 0; }

  InferFn infer = nullptr;
  KernelFn reference = nullptr;
  DecomposeFn decompose = nullptr;
  KernelFn eager_cpu = nullptr;
  KernelFn eager_cuda = nullptr;
  // dtypes (of the primary input) eager_cuda takes; others get NotSupported from it. The op
  // harness runs every op x dtype in this list on CUDA.
  std::vector<DType> eager_cuda_dtypes;
  // Eager CUDA for everything else: the op compiled alone by the CUDA target (attached by
  // src/targets/cuda/eager_compiled.cc, Note [Compiled eager kernels on CUDA]). Dispatch calls
  // it when eager_cuda is absent or does not list the call's dtype; a compiled graph never
  // binds it (a node the target cannot take fails at compile time).
  KernelFn eager_cuda_compiled = nullptr;
  const GradientRule* gradient = nullptr;
  std::vector<std::string> onnx_ops;
  // ATen overloads ("aten.add.Tensor") that the Python frontend maps to this op; filled from its
  // ATen table (python/kiln/aten_table.py) by the tools that report it (`kiln ops --json`).
  std::vector<std::string> aten_ops;

  // dtypes of the primary (first) input that the op supports; tests run each of them.
  std::vector<DType> dtypes;
  SampleFn samples = nullptr;
  double tolerance_scale = 1.0;  // >1 for ops with long accumulations or ill-conditioning

  bool supports_dtype(DType d) const;
  int attr_index(std::string_view name) const;
  // Fills defaults, rejects unknown attributes and type mismatches (naming `where`).
  Attrs canonicalize(const Attrs& given, std::string_view where) const;
  // Checks input count against the schema (naming `where`).
  void check_arity(size_t num_inputs, std::string_view where) const;
};

const OpDef& op_def(OpId id);
const OpDef* find_op(std::string_view name);
std::span<const OpDef> all_ops();

// Ops whose record is incomplete (empty when the registry is whole; checked by tests).
std::vector<std::string> registry_problems();

// Registration (used by the family files; see registry.cc).
OpDef& define_op(OpId id);

// Registry extensions: layers above ops/ attach what they own to op records (CUDA eager
// kernels, a frontend's op mapping) from their own code, so that ops/ calls nothing above it:
//   static const bool registered = register_op_extension("cuda-eager", &attach_cuda_kernels);
// Extensions run after the op families, in registration order, when the registry is first used
// — or at once when registered later (a library loaded afterwards; do not load one while other
// threads run ops). They modify records through define_op(). Returns true (for the idiom).
using OpExtensionFn = void (*)();
bool register_op_extension(const char* name, OpExtensionFn fn);
// Names of the registered extensions, in order (kiln ops --json, tests).
std::vector<std::string> op_extension_names();

// Common dtype sets.
std::vector<DType> float_dtypes();      // f32 f64 f16 bf16
std::vector<DType> numeric_dtypes();    // floats + i64 i32 i8 u8
std::vector<DType> all_dtypes();        // numeric + bool

}  // namespace kiln
