// Backends turn a captured Graph into something runnable. "eager" interprets the graph through
// the eager kernels (capture without optimization); the CPU compiler registers "inductor".
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln {

class Graph;
struct CompileOptions;

class CompiledGraph {
 public:
  virtual ~CompiledGraph() = default;
  // Inputs in graph-input order; returns the graph outputs.
  virtual TensorList run(const TensorList& inputs) = 0;
  // One line for explain: what the backend made of the graph.
  virtual std::string summary() const { return ""; }
};

using BackendFactory =
    std::function<std::unique_ptr<CompiledGraph>(const Graph& graph, const CompileOptions& opts)>;

// Registers (or replaces) a backend under `name`.
void register_backend(const std::string& name, BackendFactory factory);
// Throws kiln::Error listing the registered names when `name` is unknown.
const BackendFactory& find_backend(const std::string& name);
std::vector<std::string> backend_names();

}  // namespace kiln
