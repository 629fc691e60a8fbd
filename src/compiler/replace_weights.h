// New weights into a compiled package without compiling again: `kiln package --replace-weights
// model.kiln new.safetensors -o new.kiln`. See Note [Replacing weights] in replace_weights.cc
// and docs/package.md.
//
//   ReplaceWeightsReport r = compiler::replace_weights("model.kiln", "new.safetensors", "new.kiln");
#pragma once
#include <string>

#include "compiler/compile.h"
#include "ir/graph.h"
#include "runtime/safetensors.h"

namespace kiln::compiler {

// The `source` section of a package (format version 2) for `source`, the graph compile() was
// given, compiled for `target` with `options`: safetensors whose metadata holds the graph as IR
// text (parameters declared by type only), its parameters as JSON ([{name, dtype, shape}]), the
// precision, the target and the pass pipeline, and whose tensors are the graph's consts too large
// to print inline. `model_state` (optional) is every named tensor of the model (a module's state
// dict, an ONNX model's initializers); those the graph does not read (batch norm's
// num_batches_tracked) are recorded as unused: a weights file may hold them, and they are
// ignored. `fixed_params` (optional): parameters a weights file need not hold, with their
// values — the model's non-persistent buffers (BERT's position ids: PyTorch's persistent=False,
// not in a state dict); they travel in the section and a file may still replace them. Throws
// kiln::Error when the graph cannot be recorded (a symbolic shape).
std::string source_section_bytes(const Graph& source, const Target& target,
                                 const Options& options, const NamedTensors& model_state = {},
                                 const NamedTensors& fixed_params = {});

struct ReplaceWeightsReport {
  int parameters = 0;        // source parameters bound from the safetensors file
  int ignored = 0;           // tensors of the file the model has but its graph does not read
  int constants = 0;         // package constants written (the weights section's tensors)
  int64_t package_bytes = 0; // the new package
  double read_s = 0, passes_s = 0, write_s = 0, total_s = 0;
  std::string str() const;
};

// Reads the package at `package_path` and the safetensors file at `weights_path`, checks the
// file against the package's source parameters (every missing, unexpected, wrong-dtype and
// wrong-shape tensor in one InvalidArgument error; tensors the model has but does not read are
// ignored), runs the compiler's passes on the source
// graph with the new weights, checks that they make exactly the package's constants (names,
// dtypes, shapes: an Internal error naming the constant otherwise), and writes the package
// with its weights section replaced to `out_path`, atomically: on any error nothing is written.
// `out_path` may be `package_path`.
ReplaceWeightsReport replace_weights(const std::string& package_path,
                                     const std::string& weights_path, const std::string& out_path);

}  // namespace kiln::compiler
