// Backends turn a Graph into something runnable: "eager" interprets it through the eager
// kernels; the compiler ("inductor", compiler/compile.h) registers itself from its own layer.
// Capture (kiln::compile), the CLI and the Python frontend look backends up here by name, so
// none of them names a backend it does not own.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"

namespace kiln {

class Graph;

// What every backend is told; backends ignore what does not apply to them.
struct BackendOptions {
  std::string mode = "default";  // default | reduce-overhead | max-autotune
  // The device to compile for; unset: the device of the graph's inputs (the CPU when it has
  // none), so that capture compiles for CUDA what was called with CUDA tensors.
  std::optional<Device> device;
  // Float32: the graph's own dtypes. BFloat16 / Float16: a float32 graph runs in that dtype as
  // torch's autocast runs it (passes/autocast.h); the eager backend interprets the rewritten
  // graph, the compiler compiles it (compiler::Options::precision).
  DType precision = DType::Float32;
};

class CompiledGraph {
 public:
  virtual ~CompiledGraph() = default;
  // Inputs in graph-input order; returns the graph outputs. run and run_into may be called from
  // several threads at once (capture does for concurrent calls: Note [Concurrent calls] in
  // capture/compile.cc), so a backend keeps per-call state per call.
  virtual TensorList run(const TensorList& inputs) = 0;
  // Runs into `outputs`, reusing its tensors when they have the output shapes and dtypes (else
  // they are replaced). Backends that can run without allocating override it.
  virtual void run_into(const TensorList& inputs, TensorList& outputs) { outputs = run(inputs); }
  // Bytes of the planned arena (-1: the backend does not plan memory).
  virtual int64_t arena_bytes() const { return -1; }
  // Launches per call (kernels and library calls; -1: the backend has no launch list).
  virtual int64_t launches() const { return -1; }
  // Whether the backend's compiled code came from a cache instead of being compiled now.
  virtual bool cache_hit() const { return false; }
  // One line for explain: what the backend made of the graph.
  virtual std::string summary() const { return ""; }
};

using BackendFactory =
    std::function<std::unique_ptr<CompiledGraph>(const Graph& graph, const BackendOptions& opts)>;

// Registers (or replaces) a backend under `name`. Among registered backends the one with the
// highest `priority` is the default (the compiler outranks the interpreter); ties keep the
// earlier registration.
void register_backend(const std::string& name, BackendFactory factory, int priority = 0);
// Throws kiln::Error listing the registered names when `name` is unknown.
const BackendFactory& find_backend(const std::string& name);
std::vector<std::string> backend_names();
// The name of the highest-priority backend ("inductor" when the compiler is linked in).
std::string default_backend();

}  // namespace kiln
