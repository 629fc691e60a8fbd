// Backends turn a captured Graph into something runnable. "eager" interprets the graph through
// the eager kernels (capture without optimization); the CPU compiler registers "inductor".
#pragma once
#include <cstdint>
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
  // Runs into `outputs`, reusing its tensors when they have the output shapes and dtypes (else
  // they are replaced). Backends that can run without allocating override it.
  virtual void run_into(const TensorList& inputs, TensorList& outputs) { outputs = run(inputs); }
  // Bytes of the planned arena (-1: the backend does not plan memory).
  virtual int64_t arena_bytes() const { return -1; }
  // Whether the backend's compiled code came from a cache instead of being compiled now.
  virtual bool cache_hit() const { return false; }
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
