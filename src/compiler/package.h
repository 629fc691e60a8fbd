// Writing a compiled graph as a deployment package (runtime/package.h, docs/package.md).
//
//   auto c = compiler::compile(graph, Device::cpu(), options);
//   compiler::write_package(graph, *c, options, {.model = "model.onnx"}, "model.kiln");
#pragma once
#include <string>

#include "compiler/compile.h"
#include "ir/graph.h"
#include "runtime/package.h"
#include "runtime/safetensors.h"

namespace kiln::compiler {

// Writes `compiled`, compiled from `source` with `options`, to `path` atomically; `info` says
// where it came from (mode, knobs and precision are filled from `options` and the report). The
// package carries `source` (before the passes, parameters by type only) in its `source` section,
// so that `kiln package --replace-weights` can put new weights into it (compiler/
// replace_weights.h). Throws kiln::Error naming the node of a launch that cannot be packaged
// (an eager kernel); nothing is written then. `model_state` (optional): every named tensor of
// the model, so that those its graph does not read are known as unused (source_section_bytes);
// `fixed_params` (optional): its non-persistent buffers, which a weights file need not hold.
void write_package(const Graph& source, CompiledExecutable& compiled, const Options& options,
                   PackageInfo info, const std::string& path,
                   const NamedTensors& model_state = {}, const NamedTensors& fixed_params = {});

}  // namespace kiln::compiler
