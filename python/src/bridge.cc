// The only file of the Python extension that calls Kiln's C++ internals. See Note [The bridge]
// in bridge.h. The Kiln names it uses: kiln::Graph, kiln::find_backend + kiln::BackendOptions
// (compiler/backend.h), kiln::CompiledGraph, kiln::Tensor, the op registry, the IR text, the ONNX
// importer and safetensors.
#include "bridge.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "compiler/backend.h"
#include "compiler/compile.h"
#include "compiler/package.h"
#include "kiln/version.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/tensor.h"
#include "frontends/onnx/importer.h"
#include "ir/graph.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "nn/safetensors.h"
#include "ops/op.h"
#include "runtime/executable.h"
#include "runtime/package.h"

namespace kiln_py {
namespace {

const char* kind_name(kiln::ErrorKind k) {
  switch (k) {
    case kiln::ErrorKind::InvalidArgument: return "InvalidArgument";
    case kiln::ErrorKind::NotSupported: return "NotSupported";
    case kiln::ErrorKind::ParseError: return "ParseError";
    case kiln::ErrorKind::Runtime: return "Runtime";
    case kiln::ErrorKind::Internal: return "Internal";
  }
  return "Internal";
}

// Every entry point runs its body through here, so that a kiln::Error leaves as kiln_py::Error.
template <typename F>
decltype(auto) guarded(F&& f) {
  try {
    return f();
  } catch (const kiln::Error& e) {
    throw Error(kind_name(e.kind()), e.message());
  }
}

[[noreturn]] void fail(const std::string& kind, const std::string& message) {
  throw Error(kind, message);
}

kiln::DType to_kiln_dtype(DLType t, const char* what) {
  switch (t.code) {
    case 0:  // int
      if (t.bits == 64) return kiln::DType::Int64;
      if (t.bits == 32) return kiln::DType::Int32;
      if (t.bits == 8) return kiln::DType::Int8;
      break;
    case 1:  // uint
      if (t.bits == 8) return kiln::DType::UInt8;
      break;
    case 2:  // float
      if (t.bits == 32) return kiln::DType::Float32;
      if (t.bits == 64) return kiln::DType::Float64;
      if (t.bits == 16) return kiln::DType::Float16;
      break;
    case 4:  // bfloat
      if (t.bits == 16) return kiln::DType::BFloat16;
      break;
    case 6:  // bool
      if (t.bits == 8) return kiln::DType::Bool;
      break;
  }
  fail("NotSupported", std::string(what) + ": DLPack dtype (code " + std::to_string(t.code) +
                           ", " + std::to_string(t.bits) + " bits) has no Kiln equivalent");
}

DLType to_dl(kiln::DType d) {
  switch (d) {
    case kiln::DType::Float32: return {2, 32};
    case kiln::DType::Float16: return {2, 16};
    case kiln::DType::BFloat16: return {4, 16};
    case kiln::DType::Float64: return {2, 64};
    case kiln::DType::Int64: return {0, 64};
    case kiln::DType::Int32: return {0, 32};
    case kiln::DType::Int8: return {0, 8};
    case kiln::DType::UInt8: return {1, 8};
    case kiln::DType::Bool: return {6, 8};
  }
  return {2, 32};
}

kiln::DType parse_dtype_name(const std::string& s) {
  kiln::DType d;
  if (!kiln::parse_dtype(s, &d)) fail("InvalidArgument", "unknown Kiln dtype '" + s + "'");
  return d;
}

kiln::Device to_kiln_device(int type, int id) {
  if (type == kDeviceCPU) return kiln::Device::cpu();
  if (type == kDeviceCUDA) return kiln::Device(kiln::DeviceType::CUDA, id);
  fail("NotSupported", "DLPack device type " + std::to_string(type) +
                           " is not supported (Kiln runs on cpu and cuda)");
}

// A kiln::Tensor viewing the caller's memory (no copy).
kiln::Tensor view_of(const TensorRef& r, const char* what) {
  kiln::DType dt = to_kiln_dtype(r.dtype, what);
  kiln::Dims sizes(r.shape, r.shape + r.ndim);
  kiln::Tensor t = kiln::Tensor::from_blob(r.data, sizes, dt, to_kiln_device(r.device_type, r.device_id));
  if (r.strides) {
    kiln::Dims strides(r.strides, r.strides + r.ndim);
    if (strides != t.strides()) {
      // from_blob's storage spans the contiguous size; a strided view may reach further.
      int64_t lo = 0, hi = 0;
      for (int i = 0; i < r.ndim; ++i) {
        if (r.shape[i] == 0) return t;  // empty: no element is ever read
        int64_t reach = (r.shape[i] - 1) * r.strides[i];
        (reach < 0 ? lo : hi) += reach;
      }
      if (lo < 0)
        fail("InvalidArgument", std::string(what) + ": negative strides are not supported; pass a "
                                "contiguous copy");
      kiln::Dims span{hi + 1};
      kiln::Tensor base = kiln::Tensor::from_blob(r.data, span, dt, t.device());
      t = base.as_strided(sizes, strides, 0);
    }
  }
  return t;
}

OwnedTensor owned(const kiln::Tensor& t) {
  OwnedTensor o;
  o.data = t.raw_data();
  o.dtype = to_dl(t.dtype());
  o.shape.assign(t.sizes().begin(), t.sizes().end());
  o.strides.assign(t.strides().begin(), t.strides().end());
  o.device_type = t.device().is_cuda() ? kDeviceCUDA : kDeviceCPU;
  o.device_id = t.device().index;
  o.owner = std::make_shared<kiln::Tensor>(t);
  return o;
}

TensorSpec spec_of(const kiln::Graph& g, kiln::ValueId v) {
  const kiln::TensorType& t = g.type(v);
  TensorSpec s;
  s.name = g.value(v).name;
  s.dtype = kiln::info(t.dtype).short_name;
  s.dl = to_dl(t.dtype);
  for (const kiln::SymInt& d : t.shape) {
    s.symbolic = s.symbolic || d.is_symbolic();
    s.shape.push_back(d.is_symbolic() ? -1 : d.value());
  }
  s.device_type = t.device.is_cuda() ? kDeviceCUDA : kDeviceCPU;
  s.device_id = t.device.index;
  s.text = t.str();
  return s;
}

kiln::AttrValue to_kiln_attr(const AttrValue& a) {
  switch (a.kind) {
    case AttrValue::None: return std::monostate{};
    case AttrValue::Int: return a.i;
    case AttrValue::Float: return a.f;
    case AttrValue::Bool: return a.b;
    case AttrValue::String: return a.s;
    case AttrValue::Ints: return a.ints;
    case AttrValue::Floats: return a.floats;
    case AttrValue::DType: return parse_dtype_name(a.s);
  }
  return std::monostate{};
}

}  // namespace

// ---- GraphBuilder --------------------------------------------------------------------------
struct GraphBuilder::Impl {
  kiln::Graph graph;
  std::vector<std::shared_ptr<void>> keep_alive;  // memory that params view
  bool has_outputs = false;

  void check_value(int v, const char* what) const {
    if (!graph.valid(v)) fail("InvalidArgument", std::string(what) + ": no value " + std::to_string(v));
  }
};

GraphBuilder::GraphBuilder(const std::string& name) : impl_(std::make_unique<Impl>()) {
  impl_->graph.name = name;
}
GraphBuilder::~GraphBuilder() = default;
GraphBuilder::GraphBuilder(GraphBuilder&&) noexcept = default;
GraphBuilder& GraphBuilder::operator=(GraphBuilder&&) noexcept = default;

int GraphBuilder::add_input(const std::string& name, const std::string& dtype,
                            const std::vector<int64_t>& shape, const std::string& device) {
  return guarded([&] {
    kiln::Shape s;
    for (int64_t d : shape) s.push_back(kiln::SymInt::from_raw(d));
    return impl_->graph.add_input(name, kiln::TensorType(parse_dtype_name(dtype), s,
                                                         kiln::parse_device(device)));
  });
}

int GraphBuilder::add_param(const std::string& name, const TensorRef& t,
                            std::shared_ptr<void> keep_alive) {
  return guarded([&] {
    std::string what = "parameter '" + name + "'";
    kiln::Tensor data = view_of(t, what.c_str());
    impl_->keep_alive.push_back(std::move(keep_alive));
    return impl_->graph.add_param(name, data);
  });
}

int GraphBuilder::add_const(const TensorRef& t, const std::string& name, const std::string& device) {
  return guarded([&] {
    std::string what = "constant '" + name + "'";
    kiln::Tensor c = view_of(t, what.c_str()).clone();
    kiln::Device d = kiln::parse_device(device);
    if (c.device() != d) c = c.to(d);
    return impl_->graph.add_const(std::move(c), name);
  });
}

std::vector<int> GraphBuilder::add_node(const std::string& op, const std::vector<int>& inputs,
                                        const AttrList& attrs, const std::string& node_name) {
  return guarded([&] {
    const kiln::OpDef* def = kiln::find_op(op);
    if (!def)
      fail("NotSupported", "node '" + node_name + "': Kiln has no op '" + op + "'");
    for (int v : inputs)
      if (v != kiln::kNoValue) impl_->check_value(v, ("node '" + node_name + "'").c_str());
    kiln::Attrs a;
    for (const auto& [k, v] : attrs) a.set(k, to_kiln_attr(v));
    std::vector<kiln::ValueId> ins(inputs.begin(), inputs.end());
    std::vector<kiln::ValueId> outs = impl_->graph.add_node(def->id, std::move(ins), a, node_name);
    return std::vector<int>(outs.begin(), outs.end());
  });
}

void GraphBuilder::set_outputs(const std::vector<int>& outputs) {
  guarded([&] {
    for (int v : outputs) impl_->check_value(v, "graph output");
    impl_->graph.outputs.assign(outputs.begin(), outputs.end());
    impl_->has_outputs = true;
  });
}

std::string GraphBuilder::dtype(int v) const {
  impl_->check_value(v, "dtype");
  return kiln::info(impl_->graph.type(v).dtype).short_name;
}

std::vector<int64_t> GraphBuilder::shape(int v) const {
  impl_->check_value(v, "shape");
  std::vector<int64_t> out;
  for (const kiln::SymInt& d : impl_->graph.type(v).shape)
    out.push_back(d.is_symbolic() ? -1 : d.value());
  return out;
}

std::vector<std::string> GraphBuilder::dims(int v) const {
  impl_->check_value(v, "dims");
  std::vector<std::string> out;
  for (const kiln::SymInt& d : impl_->graph.type(v).shape) out.push_back(d.str());
  return out;
}

int64_t symbolic_dim(const std::string& expr) {
  return guarded([&] { return kiln::parse_symint(expr).raw(); });
}

int64_t evaluate_dim(const std::string& expr,
                     const std::vector<std::pair<std::string, int64_t>>& bindings) {
  return guarded([&] { return kiln::parse_symint(expr).evaluate(bindings); });
}

std::string GraphBuilder::type_str(int v) const {
  impl_->check_value(v, "type");
  return impl_->graph.type(v).str();
}

std::string GraphBuilder::value_name(int v) const {
  impl_->check_value(v, "name");
  return impl_->graph.value(v).name;
}

int GraphBuilder::num_nodes() const { return int(impl_->graph.nodes.size()); }

std::vector<std::string> GraphBuilder::node_ops() const {
  std::vector<std::string> out;
  for (const kiln::Node& n : impl_->graph.nodes) out.emplace_back(kiln::op_def(n.op).name);
  return out;
}

std::vector<TensorSpec> GraphBuilder::input_specs() const {
  std::vector<TensorSpec> out;
  for (kiln::ValueId v : impl_->graph.inputs) out.push_back(spec_of(impl_->graph, v));
  return out;
}

std::vector<TensorSpec> GraphBuilder::output_specs() const {
  std::vector<TensorSpec> out;
  for (kiln::ValueId v : impl_->graph.outputs) out.push_back(spec_of(impl_->graph, v));
  return out;
}

std::vector<std::string> GraphBuilder::param_names() const {
  std::vector<std::string> out;
  for (kiln::ValueId v : impl_->graph.params())
    if (impl_->graph.value(v).kind == kiln::ValueKind::Param) out.push_back(impl_->graph.value(v).name);
  return out;
}

bool GraphBuilder::has_symbolic_shapes() const {
  for (kiln::ValueId v : impl_->graph.inputs)
    for (const kiln::SymInt& d : impl_->graph.type(v).shape)
      if (d.is_symbolic()) return true;
  return false;
}

std::string GraphBuilder::ir() const {
  return guarded([&] { return kiln::print_graph(impl_->graph); });
}

void GraphBuilder::verify() const {
  guarded([&] { kiln::verify(impl_->graph); });
}

void GraphBuilder::save_params(const std::string& path) const {
  guarded([&] {
    kiln::nn::NamedTensors tensors;
    for (kiln::ValueId v : impl_->graph.params()) {
      const kiln::Value& val = impl_->graph.value(v);
      if (val.kind != kiln::ValueKind::Param) continue;
      if (!val.data.defined()) fail("InvalidArgument", "parameter '" + val.name + "' has no data");
      tensors.emplace_back(val.name, val.data);
    }
    kiln::nn::save_safetensors(path, tensors);
  });
}

GraphBuilder GraphBuilder::load(const std::string& ir_text, const std::string& source_name,
                                const std::string& weights_path) {
  return guarded([&] {
    GraphBuilder b("main");
    b.impl_->graph = kiln::parse_graph(ir_text, source_name);
    b.impl_->has_outputs = true;
    kiln::nn::SafetensorsContents st = kiln::nn::load_safetensors(weights_path);
    std::set<std::string> used;
    kiln::Graph& g = b.impl_->graph;
    for (kiln::ValueId v : g.params()) {
      kiln::Value& val = g.value(v);
      if (val.kind != kiln::ValueKind::Param) continue;
      auto it = std::find_if(st.tensors.begin(), st.tensors.end(),
                             [&](const auto& p) { return p.first == val.name; });
      if (it == st.tensors.end())
        fail("ParseError", weights_path + ": no tensor for parameter '" + val.name + "' of " +
                               source_name);
      // The file holds host tensors; a parameter declared on a device is moved there.
      kiln::Tensor t = it->second;
      if (!val.type.device.is_cpu()) t = t.to(val.type.device);
      if (t.type() != val.type)
        fail("ParseError", weights_path + ": tensor '" + val.name + "' is " + t.type().str() +
                               ", the graph declares " + val.type.str());
      val.data = t;
      used.insert(val.name);
    }
    for (const auto& [name, t] : st.tensors)
      if (!used.count(name))
        fail("ParseError", weights_path + ": tensor '" + name + "' is not a parameter of " + source_name);
    kiln::verify(g);
    return b;
  });
}

GraphBuilder GraphBuilder::import_onnx(
    const std::string& path,
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& input_shapes) {
  return guarded([&] {
    kiln::ImportOptions opts;
    opts.input_shapes = input_shapes;
    GraphBuilder b("main");
    b.impl_->graph = kiln::import_onnx(path, opts);
    b.impl_->has_outputs = true;
    return b;
  });
}

// ---- CompiledGraph -------------------------------------------------------------------------
namespace {
// The device a graph runs on: its inputs' (the lowering puts every input and parameter of one
// graph on one device), else its parameters' (a graph of frozen parameters only), else the CPU.
kiln::Device graph_device(const kiln::Graph& g) {
  if (!g.inputs.empty()) return g.type(g.inputs[0]).device;
  for (kiln::ValueId v : g.params())
    if (g.value(v).kind == kiln::ValueKind::Param) return g.type(v).device;
  return kiln::Device::cpu();
}
}  // namespace

struct CompiledGraph::Impl {
  std::unique_ptr<kiln::CompiledGraph> compiled;
  std::string backend;
  std::vector<TensorSpec> inputs, outputs;
  std::vector<std::shared_ptr<void>> keep_alive;
  double compile_s = 0;
  std::string manifest;  // a loaded package's
  kiln::TensorList in_scratch, out_scratch;  // reused across calls (keep their capacity)

  // A CompiledGraph over `compiled`, compiled from `graph` since `t0`: its signature and the
  // memory its parameters view come from the builder.
  static std::unique_ptr<CompiledGraph> of_graph(const GraphBuilder& graph,
                                                 std::unique_ptr<kiln::CompiledGraph> compiled,
                                                 std::string backend,
                                                 std::chrono::steady_clock::time_point t0) {
    auto c = std::unique_ptr<CompiledGraph>(new CompiledGraph());
    c->impl_ = std::make_unique<Impl>();
    c->impl_->compiled = std::move(compiled);
    c->impl_->compile_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    c->impl_->backend = std::move(backend);
    c->impl_->inputs = graph.input_specs();
    c->impl_->outputs = graph.output_specs();
    c->impl_->keep_alive = graph.impl_->keep_alive;
    return c;
  }
};

namespace {
// Note [Symbolic graphs from Python]
// A graph with symbolic input sizes (kiln.export with dynamic_shapes) compiles once per set of
// sizes: each call binds the symbols from its inputs (bind_input_symbols, which also checks every
// concrete dim and every expression), and the first call of a new binding specializes the graph
// (specialize_graph) and compiles it with the backend, kept for later calls. At most kMax
// bindings stay compiled; beyond that the oldest is dropped (Kiln's kernel cache makes compiling
// it again cheap). A call costs the binding plus a scan of at most kMax keys under a mutex.
class SpecializingGraph final : public kiln::CompiledGraph {
 public:
  static constexpr size_t kMax = 8;
  SpecializingGraph(kiln::Graph g, kiln::BackendFactory factory, kiln::BackendOptions opts)
      : graph_(std::move(g)), factory_(std::move(factory)), opts_(std::move(opts)) {}

  kiln::TensorList run(const kiln::TensorList& inputs) override { return of(inputs)->run(inputs); }
  void run_into(const kiln::TensorList& inputs, kiln::TensorList& outputs) override {
    of(inputs)->run_into(inputs, outputs);
  }
  std::string summary() const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::string s = "symbolic graph '" + graph_.name + "', " + std::to_string(entries_.size()) +
                    " size binding(s) compiled";
    for (const Entry& e : entries_) {
      s += "\n  ";
      for (size_t i = 0; i < e.key.size(); ++i)
        s += (i ? ", " : "") + e.key[i].first + "=" + std::to_string(e.key[i].second);
      s += ": " + e.compiled->summary();
    }
    return s;
  }

 private:
  struct Entry {
    kiln::SymbolBindings key;
    std::shared_ptr<kiln::CompiledGraph> compiled;
  };
  std::shared_ptr<kiln::CompiledGraph> of(const kiln::TensorList& inputs) {
    kiln::SymbolBindings key = kiln::bind_input_symbols(graph_, inputs);
    std::lock_guard<std::mutex> lock(mu_);
    for (const Entry& e : entries_)
      if (e.key == key) return e.compiled;
    std::shared_ptr<kiln::CompiledGraph> c = factory_(kiln::specialize_graph(graph_, key), opts_);
    if (entries_.size() == kMax) entries_.erase(entries_.begin());
    entries_.push_back({std::move(key), c});
    return c;
  }

  kiln::Graph graph_;
  kiln::BackendFactory factory_;
  kiln::BackendOptions opts_;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;  // shared_ptr: a call in flight keeps its graph when dropped
};

kiln::DType precision_of(const CompileSpec& spec) {
  if (spec.precision == "float32") return kiln::DType::Float32;
  if (spec.precision == "bfloat16") return kiln::DType::BFloat16;
  if (spec.precision == "float16") return kiln::DType::Float16;
  fail("InvalidArgument",
       "precision must be float32, bfloat16 or float16, got '" + spec.precision + "'");
}

// A loaded .kiln package as a compiled graph: the runtime's Executable, run exactly as the
// compiler's own CompiledExecutable runs one (the output reuse of run_into included).
class PackageGraph : public kiln::compiler::CompiledExecutable {
 public:
  explicit PackageGraph(kiln::LoadedPackage p)
      : CompiledExecutable(p.exe, kiln::compiler::CompileReport{}), pkg_(std::move(p)) {}
  std::string summary() const override {
    const kiln::Executable& e = *pkg_.exe;
    return "package '" + pkg_.model + "' (mode " + pkg_.mode + ", Kiln " + pkg_.kiln_version +
           ", " + std::to_string(pkg_.file_bytes) + " bytes): " +
           std::to_string(e.launches.size()) + " launches, arena " +
           std::to_string(e.arena_bytes()) + " bytes; loaded by the runtime, nothing compiled";
  }
  int64_t launches() const override { return int64_t(pkg_.exe->launches.size()); }
  int64_t arena_bytes() const override { return pkg_.exe->arena_bytes(); }
  const std::string& manifest() const { return pkg_.manifest; }

 private:
  kiln::LoadedPackage pkg_;
};

TensorSpec spec_of(const std::string& name, kiln::DType dtype, const kiln::Dims& sizes) {
  TensorSpec s;
  s.name = name;
  s.dtype = kiln::info(dtype).short_name;
  s.dl = to_dl(dtype);
  s.shape.assign(sizes.begin(), sizes.end());
  s.device_type = kDeviceCPU;
  s.text = std::string(s.dtype) + "[";
  for (size_t i = 0; i < sizes.size(); ++i) s.text += (i ? ", " : "") + std::to_string(sizes[i]);
  s.text += "]";
  return s;
}
}  // namespace

std::unique_ptr<CompiledGraph> CompiledGraph::compile_package(const GraphBuilder& graph,
                                                              const CompileSpec& spec,
                                                              const std::string& model,
                                                              const std::string& path) {
  return guarded([&] {
    const kiln::Graph& g = graph.impl_->graph;
    if (!graph.impl_->has_outputs) fail("InvalidArgument", "graph '" + g.name + "' has no outputs set");
    if (spec.backend != "inductor")
      fail("InvalidArgument", "a package holds what Kiln's compiler made ('inductor'), not backend '" +
                                  spec.backend + "'");
    kiln::Device device = graph_device(g);
    if (!device.is_cpu())
      fail("NotSupported", "graph '" + g.name + "' runs on " + device.str() +
                               ": .kiln packages hold CPU executables so far (docs/package.md)");
    kiln::compiler::Options options;
    options.mode = spec.mode;
    options.precision = precision_of(spec);
    options.progress = false;
    auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<kiln::compiler::CompiledExecutable> exe =
        kiln::compiler::compile(g, kiln::Device::cpu(), options);
    kiln::PackageInfo info;
    info.model = model;
    if (!g.inputs.empty() && !g.type(g.inputs[0]).shape.empty() &&
        !g.type(g.inputs[0]).shape[0].is_symbolic())
      info.batch = g.type(g.inputs[0]).shape[0].value();
    kiln::compiler::write_package(g, *exe, options, info, path);
    return Impl::of_graph(graph, std::move(exe), "inductor", t0);
  });
}

std::unique_ptr<CompiledGraph> CompiledGraph::load_package(const std::string& path) {
  return guarded([&] {
    auto t0 = std::chrono::steady_clock::now();
    auto pkg = std::make_unique<PackageGraph>(kiln::load_package(path));
    auto c = std::unique_ptr<CompiledGraph>(new CompiledGraph());
    c->impl_ = std::make_unique<Impl>();
    const kiln::Executable& e = pkg->executable();
    for (const kiln::Executable::InputSpec& s : e.inputs)
      c->impl_->inputs.push_back(spec_of(s.name, s.dtype, s.sizes));
    for (const kiln::Executable::OutputSpec& s : e.outputs)
      c->impl_->outputs.push_back(spec_of(s.name, s.dtype, s.sizes));
    c->impl_->manifest = pkg->manifest();
    c->impl_->compiled = std::move(pkg);
    c->impl_->compile_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    c->impl_->backend = "package";
    return c;
  });
}

std::unique_ptr<CompiledGraph> CompiledGraph::compile(const GraphBuilder& graph,
                                                      const CompileSpec& spec) {
  return guarded([&] {
    const kiln::Graph& g = graph.impl_->graph;
    if (!graph.impl_->has_outputs) fail("InvalidArgument", "graph '" + g.name + "' has no outputs set");
    kiln::BackendOptions opts;
    opts.mode = spec.mode;
    opts.device = graph_device(g);
    opts.precision = precision_of(spec);
    const kiln::BackendFactory& factory = kiln::find_backend(spec.backend);
    auto t0 = std::chrono::steady_clock::now();
    if (graph.has_symbolic_shapes())  // Note [Symbolic graphs from Python]
      return Impl::of_graph(graph, std::make_unique<SpecializingGraph>(g, factory, opts),
                            spec.backend, t0);
    return Impl::of_graph(graph, factory(g, opts), spec.backend, t0);
  });
}

CompiledGraph::~CompiledGraph() = default;
const std::vector<TensorSpec>& CompiledGraph::inputs() const { return impl_->inputs; }
const std::vector<TensorSpec>& CompiledGraph::outputs() const { return impl_->outputs; }

void CompiledGraph::run_into(const TensorRef* in, size_t num_in, const TensorRef* out,
                             size_t num_out) {
  guarded([&] {
    Impl& m = *impl_;
    if (num_in != m.inputs.size() || num_out != m.outputs.size())
      fail("InvalidArgument", "compiled graph takes " + std::to_string(m.inputs.size()) +
                                  " inputs and " + std::to_string(m.outputs.size()) +
                                  " outputs, got " + std::to_string(num_in) + " and " +
                                  std::to_string(num_out));
    m.in_scratch.resize(num_in);
    for (size_t i = 0; i < num_in; ++i) m.in_scratch[i] = view_of(in[i], "input");
    m.out_scratch.resize(num_out);
    for (size_t i = 0; i < num_out; ++i) m.out_scratch[i] = view_of(out[i], "output");
    kiln::TensorList given = m.out_scratch;  // handles: tells whether the backend replaced them
    m.compiled->run_into(m.in_scratch, m.out_scratch);
    for (size_t i = 0; i < num_out; ++i)
      if (!same_tensor(m.out_scratch[i], given[i])) given[i].copy_(m.out_scratch[i]);
    // Drop the views so that no Kiln object refers to the caller's memory after the call.
    for (auto& t : m.in_scratch) t = kiln::Tensor();
    for (auto& t : m.out_scratch) t = kiln::Tensor();
  });
}

std::vector<OwnedTensor> CompiledGraph::run(const TensorRef* in, size_t num_in) {
  return guarded([&] {
    Impl& m = *impl_;
    if (num_in != m.inputs.size())
      fail("InvalidArgument", "compiled graph takes " + std::to_string(m.inputs.size()) +
                                  " inputs, got " + std::to_string(num_in));
    kiln::TensorList ins(num_in);
    for (size_t i = 0; i < num_in; ++i) ins[i] = view_of(in[i], "input");
    kiln::TensorList outs = m.compiled->run(ins);
    std::vector<OwnedTensor> result;
    result.reserve(outs.size());
    for (const kiln::Tensor& t : outs) result.push_back(owned(t.is_contiguous() ? t : t.contiguous()));
    return result;
  });
}

double CompiledGraph::time_run_into_ns(const TensorRef* in, size_t num_in, const TensorRef* out,
                                       size_t num_out, int iters) {
  return guarded([&] {
    kiln::TensorList ins(num_in), outs(num_out);
    for (size_t i = 0; i < num_in; ++i) ins[i] = view_of(in[i], "input");
    for (size_t i = 0; i < num_out; ++i) outs[i] = view_of(out[i], "output");
    std::vector<double> ns;
    ns.reserve(size_t(std::max(iters, 1)));
    for (int k = 0; k < std::max(iters, 1); ++k) {
      auto t0 = std::chrono::steady_clock::now();
      impl_->compiled->run_into(ins, outs);
      ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
    }
    std::nth_element(ns.begin(), ns.begin() + ns.size() / 2, ns.end());
    return ns[ns.size() / 2];
  });
}

std::string CompiledGraph::backend() const { return impl_->backend; }
std::string CompiledGraph::summary() const { return impl_->compiled->summary(); }
int64_t CompiledGraph::arena_bytes() const { return impl_->compiled->arena_bytes(); }
bool CompiledGraph::cache_hit() const { return impl_->compiled->cache_hit(); }
double CompiledGraph::compile_seconds() const { return impl_->compile_s; }
std::string CompiledGraph::manifest() const { return impl_->manifest; }

// ---- the registry and settings -------------------------------------------------------------
std::vector<OpInfo> ops() {
  std::vector<OpInfo> out;
  for (const kiln::OpDef& d : kiln::all_ops()) {
    OpInfo o;
    o.name = d.name;
    o.family = d.family;
    for (kiln::DType t : d.dtypes) o.dtypes.emplace_back(kiln::info(t).short_name);
    for (const kiln::InputSpec& in : d.inputs)
      o.inputs.push_back(in.name + (in.optional ? "?" : "") + (in.variadic ? "..." : ""));
    for (const kiln::AttrSpec& a : d.attrs) o.attrs.push_back(a.name + ": " + kiln::attr_type_name(a.type));
    o.num_outputs = d.num_outputs;
    o.is_view = d.is_view;
    o.cuda_kernel = d.eager_cuda != nullptr || d.eager_cuda_compiled != nullptr;
    out.push_back(std::move(o));
  }
  return out;
}

std::vector<std::string> backends() { return kiln::backend_names(); }
std::string version() { return KILN_VERSION; }

std::string cuda_status() {
  return guarded([] { return kiln::cuda_device_count() > 0 ? std::string() : kiln::cuda_status(); });
}

void set_num_threads(int n) {
  if (n > 0) omp_set_num_threads(n);
}
int num_threads() { return omp_get_max_threads(); }

std::vector<std::pair<std::string, OwnedTensor>> load_safetensors(const std::string& path) {
  return guarded([&] {
    std::vector<std::pair<std::string, OwnedTensor>> out;
    for (auto& [name, t] : kiln::nn::load_safetensors(path).tensors) out.emplace_back(name, owned(t));
    return out;
  });
}

}  // namespace kiln_py
