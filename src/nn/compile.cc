#include "nn/compile.h"

#include <fmt/format.h>

#include "core/error.h"
#include "nn/module.h"

namespace kiln {

CompiledFunction compile(std::shared_ptr<nn::Module> module, const CompileOptions& options) {
  KILN_CHECK(module, "kiln::compile: the module is null");
  NamedState state;
  for (auto& [name, t] : module->named_parameters()) state.emplace_back(name, t);
  for (auto& [name, t] : module->named_buffers()) state.emplace_back(name, t);
  // Host state the traced code reads that no tensor guard sees: every module's train/eval mode
  // (dropout, batch norm) and which tensor each registered parameter/buffer is (a ParamRef
  // reassigned after compile, `fc->weight = other`). Both move nn::module_state_epoch(), so the
  // guard is one comparison while no module anywhere changed; then the fingerprint decides.
  HostStateGuard guard;
  guard.epoch = &nn::module_state_epoch();
  std::weak_ptr<nn::Module> weak = module;
  guard.fingerprint = [weak] {
    auto m = weak.lock();
    return m ? nn::state_fingerprint(*m) : std::string();
  };
  guard.describe = [](const std::string& traced, const std::string& now) {
    return nn::describe_state_change(traced, now);
  };
  guard.named_state = [weak] {
    NamedState now;
    if (auto m = weak.lock()) {
      for (auto& [name, t] : m->named_parameters()) now.emplace_back(name, t);
      for (auto& [name, t] : m->named_buffers()) now.emplace_back(name, t);
    }
    return now;
  };
  return compile([module](const TensorList& in) { return module->call(in); }, state, options,
                 std::move(guard));
}

}  // namespace kiln
