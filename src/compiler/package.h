// Writing a compiled graph as a deployment package (runtime/package.h, docs/package.md).
//
//   auto c = compiler::compile(graph, Device::cpu(), options);
//   compiler::write_package(*c, options, {.model = "model.onnx"}, "model.kiln");
#pragma once
#include <string>

#include "compiler/compile.h"
#include "runtime/package.h"

namespace kiln::compiler {

// Writes `compiled` to `path` atomically; `info` says where it came from (mode and knobs are
// filled from `options` and the report). Throws kiln::Error naming the node of a launch that
// cannot be packaged (an eager kernel); nothing is written then.
void write_package(CompiledExecutable& compiled, const Options& options, PackageInfo info,
                   const std::string& path);

}  // namespace kiln::compiler
