// kiln::compile: capture C++ model code into graphs, guarded and cached (Kiln's TorchDynamo).
// See Note [Capture] in compile.cc.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace kiln {

struct CompileOptions {
  // A registered backend (compiler/backend.h): "inductor" is the compiler, "eager" interprets
  // the captured graphs. Empty: the default backend, the compiler when it is linked in (as
  // torch.compile defaults to Inductor).
  std::string backend;
  std::string mode = "default";   // default | reduce-overhead | max-autotune (for the backend)
  // Float32: as written. BFloat16 / Float16: float32 graphs run in that dtype as torch's
  // autocast runs them (compiler/backend.h, passes/autocast.h); inputs and outputs stay float32.
  DType precision = DType::Float32;
  bool fullgraph = false;         // a graph break is an error
  bool dynamic = false;           // accepted; shapes are specialized until dynamic shapes land
  int cache_size_limit = 8;       // guard sets per function before falling back to eager
  bool strict = false;            // no fallback to eager: compile/run failures throw
  // Values the tracer cannot guard (a C++ closure's scalars, tensors reached through host
  // pointers, small host tensors baked in as constants): with this set, every call of a
  // whole-graph entry first re-runs the host code under a light trace (ops recorded, nothing
  // computed) and compares what it records (ops, attributes, constants by value, which tensors
  // are frozen) with the cached graph; a difference recompiles, with the difference as the
  // reason. Costs one trace of the host code per call (docs/capture.md has the figures).
  // KILN_CHECK_CAPTURE=1 in the environment turns it on for every compiled function.
  bool check_host_values = false;
};

using Callable = std::function<TensorList(const TensorList&)>;

struct CompileStats {
  int64_t calls = 0;
  int64_t compiled_calls = 0;      // served by a cached entry without re-tracing
  int64_t traces = 0;              // times the host code ran under capture
  int64_t graphs_compiled = 0;     // backend compilations
  int64_t recompiles = 0;          // new guard sets after the first
  int64_t graph_breaks = 0;        // breaks seen while tracing
  int64_t fallbacks_cache_limit = 0;
  int64_t fallbacks_compile_error = 0;
  int64_t fallbacks_runtime_error = 0;
  int64_t entries = 0;
  int64_t host_value_checks = 0;   // check_host_values: light traces run before replays
};

struct ExplainGraph {
  std::vector<std::string> ops;  // op names in order
  int num_inputs = 0;
  int num_params = 0;
  int num_outputs = 0;
  std::string ir;       // the graph as IR text
  std::string backend_summary;
  int64_t arena_bytes = -1;  // the backend's planned arena (-1: none)
  int64_t launches = -1;     // launches per call of the backend's code (-1: no launch list)
  bool cache_hit = false;    // the backend's code came from its cache
  // What the graph froze from the host, one line each, with the call site of the op that read
  // it: "mul at model.cc:42: scalar 2.0 is part of the graph", "linear at model.cc:40: tensor
  // 'tensor0' float32[8, 6] is frozen (guarded by identity and version)".
  std::vector<std::string> baked;
};
struct ExplainBreak {
  std::string reason;    // "item() reads tensor data on the host"
  std::string location;  // "branchy.cc:42"
};
struct ExplainReport {
  std::vector<ExplainGraph> graphs;
  std::vector<ExplainBreak> breaks;
  std::vector<std::string> guards;
  std::vector<std::string> recompiles;
  std::vector<std::string> fallbacks;
  CompileStats stats;
  std::string json() const;
  std::string text() const;
};

using NamedState = std::vector<std::pair<std::string, Tensor>>;

// Host state the traced code reads that no tensor guard can see (a module's train/eval mode):
// every entry records `fingerprint()` when it is traced and serves only calls where it is the
// same. `epoch` must change whenever the state may have changed; while it does not, the check
// is one comparison (the fingerprint is recomputed only after the epoch moved).
struct HostStateGuard {
  const std::atomic<uint64_t>* epoch = nullptr;
  std::function<std::string()> fingerprint;  // compared exactly
  std::function<std::string(const std::string& traced, const std::string& now)> describe;
  // The named tensors now (optional): after the fingerprint changed, graph parameters are named
  // from this list rather than the one given to compile().
  std::function<NamedState()> named_state;
};
class CompiledFunction {
 public:
  CompiledFunction() = default;
  TensorList operator()(const TensorList& inputs) const;
  // The same call, writing into `outputs` (reused when its tensors have the right shapes and
  // dtypes: the steady state of a whole-graph entry then allocates nothing with a backend that
  // plans memory). The returned tensors are overwritten by the next run_into.
  void run_into(const TensorList& inputs, TensorList& outputs) const;
  CompileStats stats() const;
  // What was captured: graphs, breaks, guards, recompiles, fallbacks (so far).
  ExplainReport report() const;
  struct State;

 private:
  friend CompiledFunction compile(Callable fn, const CompileOptions& options);
  friend CompiledFunction compile(Callable fn, const std::vector<std::pair<std::string, Tensor>>& state,
                                  const CompileOptions& options, HostStateGuard host_state);
  std::shared_ptr<State> state_;
};

CompiledFunction compile(Callable fn, const CompileOptions& options = {});
// A callable together with the named tensors it holds (a module's parameters and buffers):
// graph parameters are named after them. nn/compile.h builds compile(module) on this.
CompiledFunction compile(Callable fn, const NamedState& state, const CompileOptions& options = {},
                         HostStateGuard host_state = {});

// Runs `fn` on `inputs` (compiling as needed) and reports what capture did.
ExplainReport explain(const CompiledFunction& fn, const TensorList& inputs);

// Clears every compile cache of every compiled function.
void reset();

}  // namespace kiln
