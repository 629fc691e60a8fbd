#include "passes/default_pipeline.h"

namespace kiln {
namespace {

class DefaultPipelinePass : public Pass {
 public:
  std::string_view name() const override { return "default"; }
  std::string_view description() const override {
    return "the default pipeline (the passes marked default in pipeline.cc, in order)";
  }
  bool run(Graph& g) override {
    std::vector<std::string> names = default_pipeline();
    return run_passes(g, names);
  }
};

}  // namespace

std::unique_ptr<Pass> make_default_pipeline_pass() {
  return std::make_unique<DefaultPipelinePass>();
}

}  // namespace kiln
