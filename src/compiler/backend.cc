#include "compiler/backend.h"

#include <mutex>

#include <fmt/format.h>

#include "core/error.h"
#include "ir/graph.h"
#include "ir/interpreter.h"
#include "passes/pipeline.h"

namespace kiln {

namespace {

// "eager": the graph interpreted node by node through the eager kernels (capture without
// optimization, and the fallback when a compile fails).
class InterpretedGraph final : public CompiledGraph {
 public:
  // precision other than float32: the graph autocast to it (passes/pipeline.h).
  InterpretedGraph(const Graph& g, DType precision) : graph_(g), precision_(precision) {
    std::vector<std::unique_ptr<Pass>> passes = autocast_pipeline(precision);
    std::vector<Pass*> ptrs;
    for (auto& p : passes) ptrs.push_back(p.get());
    if (!ptrs.empty()) run_passes(graph_, std::span<Pass* const>(ptrs));
  }
  TensorList run(const TensorList& inputs) override { return ::kiln::run(graph_, inputs); }
  std::string summary() const override {
    return fmt::format("eager: {} nodes interpreted through the eager kernels{}",
                       graph_.nodes.size(),
                       precision_ == DType::Float32 ? "" : fmt::format(" (autocast to {})", dtype_name(precision_)));
  }

 private:
  Graph graph_;
  DType precision_;
};

struct Registered {
  std::string name;
  BackendFactory factory;
  int priority = 0;
};

struct BackendRegistry {
  std::mutex mu;
  std::vector<Registered> backends;
};

BackendRegistry& backend_registry() {
  static BackendRegistry* r = [] {
    auto* reg = new BackendRegistry();
    reg->backends.push_back({"eager",
                             [](const Graph& g, const BackendOptions& o) {
                               return std::unique_ptr<CompiledGraph>(
                                   new InterpretedGraph(g, o.precision));
                             },
                             0});
    return reg;
  }();
  return *r;
}

}  // namespace

void register_backend(const std::string& name, BackendFactory factory, int priority) {
  BackendRegistry& r = backend_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (Registered& b : r.backends)
    if (b.name == name) {
      b.factory = std::move(factory);
      b.priority = priority;
      return;
    }
  r.backends.push_back({name, std::move(factory), priority});
}

const BackendFactory& find_backend(const std::string& name) {
  BackendRegistry& r = backend_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const Registered& b : r.backends)
    if (b.name == name) return b.factory;
  std::string names;
  for (const Registered& b : r.backends) names += (names.empty() ? "" : ", ") + b.name;
  fail("unknown compile backend '{}' (available: {})", name, names);
}

std::vector<std::string> backend_names() {
  BackendRegistry& r = backend_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> out;
  for (const Registered& b : r.backends) out.push_back(b.name);
  return out;
}

std::string default_backend() {
  BackendRegistry& r = backend_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const Registered* best = &r.backends.front();
  for (const Registered& b : r.backends)
    if (b.priority > best->priority) best = &b;
  return best->name;
}

}  // namespace kiln
