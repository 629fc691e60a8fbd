// Compiling a module into a deployment package: kiln::compile's capture, then the compiler
// (one graph, no graph breaks: a package is one Executable), then the package writer.
//
//   nn::ZooModel m = nn::make_zoo_model("resnet18");
//   nn::export_package(m.module, m.inputs, {}, "resnet18", "resnet18.kiln");
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "capture/compile.h"
#include "compiler/compile.h"
#include "nn/module.h"

namespace kiln::nn {

// Captures module->call(example_inputs) as one graph (parameters named after the module's) and
// compiles it with `options` for the CPU. Throws kiln::Error when the call breaks into several
// graphs or falls back to eager.
// `source`, when given, receives the captured graph (what the compiler was given: a package
// records it for `kiln package --replace-weights`).
std::shared_ptr<compiler::CompiledExecutable> compile_module_graph(
    const std::shared_ptr<Module>& module, const TensorList& example_inputs,
    const compiler::Options& options = {}, Graph* source = nullptr);

// The same for any capture: `make` is kiln::compile of the caller's function with the given
// options (a module, an ONNX graph's interpreter), called once on example_inputs.
std::shared_ptr<compiler::CompiledExecutable> compile_captured_graph(
    const std::function<CompiledFunction(const CompileOptions&)>& make,
    const TensorList& example_inputs, const compiler::Options& options = {},
    Graph* source = nullptr);

// compile_module_graph, then compiler::write_package to `path` (atomic).
// The module's non-persistent buffers (PyTorch's persistent=False: in named_buffers(), not in
// state_dict()), on the host: a package records them as parameters a weights file need not hold
// (compiler::write_package's fixed_params).
NamedTensors non_persistent_buffers(const Module& module);

std::shared_ptr<compiler::CompiledExecutable> export_package(
    const std::shared_ptr<Module>& module, const TensorList& example_inputs,
    const compiler::Options& options, const std::string& model_name, const std::string& path,
    int64_t batch = 1);

}  // namespace kiln::nn
