// The Python extension's one door into Kiln. See Note [The bridge].
//
// Note [The bridge]
// bridge.cc is the only file of the extension that includes Kiln's headers and calls its C++
// internals (kiln::Graph, the op registry, the IR printer/parser, the compile backends, the ONNX
// importer, safetensors). module.cc (the nanobind bindings and the per-call path) sees only this
// header, which speaks std types and DLPack-style tensor descriptions. Two reasons:
//   - Kiln's tree is being restructured (issue #11: one library per layer, public headers in
//     include/kiln/): adapting the extension means editing bridge.cc alone;
//   - bridge.cc and libkiln link into one shared library, libkiln_python.so, built where Kiln's
//     dependencies are (Debian's oneDNN, fmt, protobuf). module.cc compiles wherever Python and
//     nanobind are, against that prebuilt library: that is how the extension is built on a
//     machine without Debian's libraries (docs/python.md, "Building elsewhere").
// Nothing here is on a hot path except CompiledGraph::run_into / run, called once per call.
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#if defined(__GNUC__)
#define KILN_PY_API __attribute__((visibility("default")))
#else
#define KILN_PY_API
#endif

namespace kiln_py {

// A kiln::Error crossing the bridge. `kind` is the ErrorKind's name: "InvalidArgument",
// "NotSupported", "ParseError", "Runtime" or "Internal".
class KILN_PY_API Error : public std::runtime_error {
 public:
  Error(std::string kind, const std::string& message)
      : std::runtime_error(message), kind_(std::move(kind)) {}
  const std::string& kind() const { return kind_; }

 private:
  std::string kind_;
};

// Device types, numbered as DLPack numbers them.
inline constexpr int kDeviceCPU = 1;
inline constexpr int kDeviceCUDA = 2;

// A dtype as DLPack describes it (code: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool).
struct DLType {
  uint8_t code = 2;
  uint8_t bits = 32;
  friend bool operator==(DLType a, DLType b) { return a.code == b.code && a.bits == b.bits; }
};

// Memory owned by the caller (a torch tensor, a NumPy array), described like a DLTensor.
// Strides are in elements; nullptr means contiguous row-major.
struct TensorRef {
  void* data = nullptr;
  DLType dtype;
  int32_t ndim = 0;
  const int64_t* shape = nullptr;
  const int64_t* strides = nullptr;
  int32_t device_type = kDeviceCPU;
  int32_t device_id = 0;
};

// A tensor Kiln allocated; `owner` keeps its memory alive (hand it to whoever views `data`).
struct OwnedTensor {
  void* data = nullptr;
  DLType dtype;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // elements
  int32_t device_type = kDeviceCPU;
  int32_t device_id = 0;
  std::shared_ptr<void> owner;
};

// The type of a graph input or output. A symbolic dimension is -1 in `shape` (its expression is
// in `text`, the IR form: "f32[batch, 10]").
struct TensorSpec {
  std::string name;
  std::string dtype;  // Kiln's short name: f32 f16 bf16 f64 i64 i32 i8 u8 bool
  DLType dl;
  std::vector<int64_t> shape;
  bool symbolic = false;
  int32_t device_type = kDeviceCPU;
  int32_t device_id = 0;
  std::string text;
};

// An attribute value for add_node. Int lists may hold negative values; `s` holds a dtype's
// short name for kind DType.
struct AttrValue {
  enum Kind : uint8_t { None, Int, Float, Bool, String, Ints, Floats, DType } kind = None;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<double> floats;
};
using AttrList = std::vector<std::pair<std::string, AttrValue>>;

// What Python needs to know about an op of the registry.
struct OpInfo {
  std::string name;
  std::string family;
  std::vector<std::string> dtypes;  // of the first input
  std::vector<std::string> inputs;  // names; "x?" optional, "inputs..." variadic
  std::vector<std::string> attrs;   // "name: type"
  int num_outputs = 1;              // -1: decided by inference
  bool is_view = false;
  bool cuda_kernel = false;         // runs on CUDA tensors (an eager CUDA kernel)
};

class CompiledGraph;

// A kiln::Graph under construction (or loaded). Values are referred to by id; -1 is an absent
// optional input. add_node infers types through the registry, so an error names the node.
class KILN_PY_API GraphBuilder {
 public:
  explicit GraphBuilder(const std::string& name);
  ~GraphBuilder();
  GraphBuilder(GraphBuilder&&) noexcept;
  GraphBuilder& operator=(GraphBuilder&&) noexcept;

  // `device`: "cpu" or "cuda:N". `shape` holds SymInt encodings (Note [SymInt encoding]):
  // plain sizes, or symbolic_dim() of an expression such as "s0".
  int add_input(const std::string& name, const std::string& dtype,
                const std::vector<int64_t>& shape, const std::string& device);
  // A frozen parameter viewing the caller's memory (no copy); `keep_alive` is held by this
  // builder and by every graph compiled from it.
  int add_param(const std::string& name, const TensorRef& t, std::shared_ptr<void> keep_alive);
  // A constant; the data is copied (to `device`: "cpu" or "cuda:N", like the graph's values).
  int add_const(const TensorRef& t, const std::string& name, const std::string& device = "cpu");
  std::vector<int> add_node(const std::string& op, const std::vector<int>& inputs,
                            const AttrList& attrs, const std::string& node_name);
  void set_outputs(const std::vector<int>& outputs);

  std::string dtype(int value) const;
  std::vector<int64_t> shape(int value) const;  // -1 for a symbolic dim
  // Each dim as text: "3" for a size, the expression ("s0", "2*s0") for a symbolic dim.
  std::vector<std::string> dims(int value) const;
  std::string type_str(int value) const;
  std::string value_name(int value) const;
  int num_nodes() const;
  std::vector<std::string> node_ops() const;
  std::vector<TensorSpec> input_specs() const;
  std::vector<TensorSpec> output_specs() const;
  std::vector<std::string> param_names() const;
  // Graph inputs with a symbolic dimension.
  bool has_symbolic_shapes() const;
  // The graph as IR text (docs/ir.md); weights are declared by type, never printed.
  std::string ir() const;
  // Runs the IR verifier; throws Error listing the problems.
  void verify() const;
  // Writes every param's data to a safetensors file under the param's name.
  void save_params(const std::string& path) const;

  // IR text (parse_graph) with params' data from a safetensors file written by save_params:
  // every param must be in the file with exactly its declared type.
  static GraphBuilder load(const std::string& ir_text, const std::string& source_name,
                           const std::string& weights_path);
  // The ONNX importer. `input_shapes`: graph input name -> shape, replacing declared ones.
  static GraphBuilder import_onnx(
      const std::string& path,
      const std::vector<std::pair<std::string, std::vector<int64_t>>>& input_shapes);

  struct Impl;

 private:
  friend class CompiledGraph;
  std::unique_ptr<Impl> impl_;
};

// The SymInt encoding of a symbolic size expression ("s0", "2*s0 + 1"; SymInt::str's syntax)
// for add_input shapes and int attributes (Note [SymInt encoding]). Throws Error("ParseError").
KILN_PY_API int64_t symbolic_dim(const std::string& expr);
// The value of a size expression under `bindings` (symbol -> value). Throws naming an unbound
// symbol.
KILN_PY_API int64_t evaluate_dim(const std::string& expr,
                                 const std::vector<std::pair<std::string, int64_t>>& bindings);

struct CompileSpec {
  std::string backend = "inductor";  // a registered compile backend ("inductor", "eager", ...)
  std::string mode = "default";      // default | reduce-overhead | max-autotune
  // float32 | bfloat16 | float16: a float32 graph computes as torch's autocast would in that
  // dtype (kiln::BackendOptions::precision, passes/autocast.h); inputs and outputs stay float32.
  std::string precision = "float32";
};

// A graph compiled by a registered backend.
class KILN_PY_API CompiledGraph {
 public:
  static std::unique_ptr<CompiledGraph> compile(const GraphBuilder& graph, const CompileSpec& spec);
  // Compiles `graph` with Kiln's compiler for the CPU (`spec.backend` must be "inductor") and
  // writes it to `path` as a .kiln deployment package (atomically: runtime/package.h,
  // docs/package.md); `model` names it in the manifest. Returns the compiled graph, which runs
  // exactly what the package holds.
  static std::unique_ptr<CompiledGraph> compile_package(const GraphBuilder& graph,
                                                        const CompileSpec& spec,
                                                        const std::string& model,
                                                        const std::string& path);
  // Loads a .kiln package with the runtime alone (no compiler, no code generation).
  static std::unique_ptr<CompiledGraph> load_package(const std::string& path);
  ~CompiledGraph();

  const std::vector<TensorSpec>& inputs() const;
  const std::vector<TensorSpec>& outputs() const;
  // Runs with outputs written into the caller's memory (`out`: one per graph output, of its
  // dtype and shape, any strides). Inputs are checked by the caller (module.cc) first.
  void run_into(const TensorRef* in, size_t num_in, const TensorRef* out, size_t num_out);
  // Runs with outputs allocated by Kiln.
  std::vector<OwnedTensor> run(const TensorRef* in, size_t num_in);
  // For measuring the C++ side alone: `iters` calls of run_into on the same tensors, returning
  // the median nanoseconds per call.
  double time_run_into_ns(const TensorRef* in, size_t num_in, const TensorRef* out,
                          size_t num_out, int iters);

  std::string backend() const;
  std::string summary() const;
  int64_t arena_bytes() const;
  bool cache_hit() const;
  double compile_seconds() const;
  // A loaded package's manifest (JSON text); "" for a graph compiled in this process.
  std::string manifest() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// ---- the registry and process-wide settings ------------------------------------------------
KILN_PY_API std::vector<OpInfo> ops();
KILN_PY_API std::vector<std::string> backends();
KILN_PY_API std::string version();
// "" when a CUDA device is usable, else the reason ("no CUDA device: ...").
KILN_PY_API std::string cuda_status();
// OpenMP threads of Kiln's kernels on this thread (0 leaves the default).
KILN_PY_API void set_num_threads(int n);
KILN_PY_API int num_threads();
// Reads a safetensors file (CPU tensors).
KILN_PY_API std::vector<std::pair<std::string, OwnedTensor>> load_safetensors(const std::string& path);

}  // namespace kiln_py
