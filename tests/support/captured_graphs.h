// The graphs capture records for one call of a module, for tests that compile or inspect them
// directly: a test backend keeps every graph it is given and runs it eagerly (a model with a
// graph break, zoo `branchy`, gives two).
#pragma once
#include <memory>
#include <vector>

#include "capture/compile.h"
#include "compiler/backend.h"
#include "ir/graph.h"
#include "nn/compile.h"
#include "nn/module.h"

namespace kiln::test {

inline std::vector<Graph>*& captured_graphs_sink() {
  static std::vector<Graph>* sink = nullptr;
  return sink;
}

inline std::vector<Graph> capture_graphs(const std::shared_ptr<nn::Module>& module,
                                         const TensorList& inputs) {
  static const bool registered = [] {
    register_backend("test-graph-grabber", [](const Graph& g, const BackendOptions&) {
      if (captured_graphs_sink()) captured_graphs_sink()->push_back(g);
      return find_backend("eager")(g, BackendOptions{});
    });
    return true;
  }();
  (void)registered;
  std::vector<Graph> out;
  captured_graphs_sink() = &out;
  CompileOptions co;
  co.backend = "test-graph-grabber";
  compile(module, co)(inputs);
  captured_graphs_sink() = nullptr;
  return out;
}

}  // namespace kiln::test
