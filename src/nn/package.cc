#include "nn/package.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "compiler/backend.h"
#include "compiler/package.h"
#include "core/error.h"
#include "nn/compile.h"
#include "runtime/executable.h"

namespace kiln::nn {

namespace {

// The capture backend of compile_module_graph: compiles with the caller's options (on this
// thread) and hands the CompiledExecutable back through the same thread-local slot.
struct PackageCapture {
  const compiler::Options* options = nullptr;
  std::shared_ptr<compiler::CompiledExecutable> compiled;
  Graph* source = nullptr;  // receives the graph the compiler was given
  int graphs = 0;
};
thread_local PackageCapture* t_capture = nullptr;

class SharedCompiled final : public CompiledGraph {
 public:
  explicit SharedCompiled(std::shared_ptr<compiler::CompiledExecutable> c) : c_(std::move(c)) {}
  TensorList run(const TensorList& in) override { return c_->run(as_taken(in)); }
  void run_into(const TensorList& in, TensorList& out) override { c_->run_into(as_taken(in), out); }
  std::string summary() const override { return c_->summary(); }

 private:
  // compiler::Options::input_dtype: the capture runs the compiled graph on its float32 example
  // inputs once; the executable takes them in its own dtypes (graph order, before
  // compile_captured_graph puts the specs in call order).
  TensorList as_taken(const TensorList& in) const {
    const std::vector<Executable::InputSpec>& specs = c_->executable().inputs;
    TensorList out = in;
    for (size_t i = 0; i < out.size() && i < specs.size(); ++i)
      if (out[i].defined() && out[i].dtype() == DType::Float32 &&
          (specs[i].dtype == DType::BFloat16 || specs[i].dtype == DType::Float16)) {
        // Converted on the host (Tensor::to(dtype) converts host tensors only).
        const Device d = out[i].device();
        out[i] = out[i].to(Device::cpu()).to(specs[i].dtype).to(d);
      }
    return out;
  }
  std::shared_ptr<compiler::CompiledExecutable> c_;
};

const bool g_registered = [] {
  register_backend("package", [](const Graph& g, const BackendOptions& o) -> std::unique_ptr<CompiledGraph> {
    KILN_CHECK(t_capture, "the 'package' backend is used by nn::compile_module_graph only");
    compiler::Options opts = *t_capture->options;
    // The device of the graph's inputs, as the "inductor" backend decides it: a model called
    // with CUDA tensors (and holding CUDA weights) makes a CUDA package.
    // A cross-build (Options::arch) compiles the captured (host) graph for CUDA.
    Device d = o.device ? *o.device : g.inputs.empty() ? Device::cpu() : g.type(g.inputs[0]).device;
    if (!opts.arch.empty()) d = Device::cuda(0);
    std::shared_ptr<compiler::CompiledExecutable> c = compiler::compile(g, d, opts);
    t_capture->compiled = c;
    if (t_capture->source) *t_capture->source = g;
    t_capture->graphs++;
    // A cross-built executable cannot run here; capture's own call of the graph (it runs what
    // it captured once) runs the graph's eager kernels on the host instead.
    if (!opts.arch.empty()) return find_backend("eager")(g, BackendOptions{});
    return std::make_unique<SharedCompiled>(c);
  }, /*priority=*/-100);
  return true;
}();

}  // namespace

std::shared_ptr<compiler::CompiledExecutable> compile_captured_graph(
    const std::function<CompiledFunction(const CompileOptions&)>& make,
    const TensorList& example_inputs, const compiler::Options& options, Graph* source) {
  PackageCapture capture;
  capture.options = &options;
  capture.source = source;
  t_capture = &capture;
  struct Reset {
    ~Reset() { t_capture = nullptr; }
  } reset;
  CompileOptions co;
  co.backend = "package";
  co.mode = options.mode;
  co.fullgraph = true;  // a package is one graph
  co.strict = true;     // no silent fallback to eager
  CompiledFunction f = make(co);
  f(example_inputs);
  if (capture.graphs != 1 || !capture.compiled)
    fail_kind(ErrorKind::NotSupported, "package: the model compiled into {} graphs; a package "
              "holds exactly one", capture.graphs);
  // The captured graph takes its inputs in first-use order, named input<k> after their call
  // position k (capture/compile.cc): a package takes them in call order. Inputs are bound by
  // slot, so reordering the specs changes nothing else.
  std::vector<Executable::InputSpec>& specs = capture.compiled->executable().inputs;
  std::vector<std::pair<int64_t, Executable::InputSpec>> keyed;
  for (Executable::InputSpec& in : specs) {
    int64_t k = -1;
    if (in.name.rfind("input", 0) == 0 && in.name.size() > 5 &&
        in.name.find_first_not_of("0123456789", 5) == std::string::npos)
      k = std::stoll(in.name.substr(5));
    if (k < 0 || k >= int64_t(example_inputs.size()))
      fail_kind(ErrorKind::NotSupported, "package: graph input '{}' is not one of the call's "
                "inputs", in.name);
    keyed.emplace_back(k, std::move(in));
  }
  std::sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  specs.clear();
  for (auto& [k, in] : keyed) specs.push_back(std::move(in));
  if (specs.size() != example_inputs.size())
    fail_kind(ErrorKind::NotSupported, "package: the graph reads {} of the call's {} inputs; a "
              "package takes every input the caller passes", specs.size(), example_inputs.size());
  return capture.compiled;
}

std::shared_ptr<compiler::CompiledExecutable> compile_module_graph(
    const std::shared_ptr<Module>& module, const TensorList& example_inputs,
    const compiler::Options& options, Graph* source) {
  return compile_captured_graph(
      [&](const CompileOptions& co) { return compile(module, co); }, example_inputs, options,
      source);
}

NamedTensors non_persistent_buffers(const Module& module) {
  std::set<std::string> persistent;
  for (const auto& [name, t] : module.state_dict()) persistent.insert(name);
  NamedTensors out;
  for (const auto& [name, t] : module.named_buffers())
    if (t.defined() && !persistent.count(name)) out.emplace_back(name, t.to(Device::cpu()));
  return out;
}

std::shared_ptr<compiler::CompiledExecutable> export_package(
    const std::shared_ptr<Module>& module, const TensorList& example_inputs,
    const compiler::Options& options, const std::string& model_name, const std::string& path,
    int64_t batch) {
  Graph source;
  auto c = compile_module_graph(module, example_inputs, options, &source);
  PackageInfo info;
  info.model = model_name;
  info.batch = batch;
  compiler::write_package(source, *c, options, info, path, module->state_dict(),
                          non_persistent_buffers(*module));
  return c;
}

}  // namespace kiln::nn
