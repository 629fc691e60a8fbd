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
  // train()/eval() is read by the traced code (dropout, batch norm) and seen by no tensor
  // guard: entries are guarded on every module's mode (one comparison while no module anywhere
  // changed mode; see nn::module_mode_epoch()).
  HostStateGuard mode;
  mode.epoch = &nn::module_mode_epoch();
  std::weak_ptr<nn::Module> weak = module;
  mode.fingerprint = [weak] {
    auto m = weak.lock();
    return m ? nn::mode_fingerprint(*m) : std::string();
  };
  mode.describe = [](const std::string& traced, const std::string& now) {
    return fmt::format("module mode changed: traced with {}, called with {}",
                       nn::describe_mode_fingerprint(traced), nn::describe_mode_fingerprint(now));
  };
  return compile([module](const TensorList& in) { return module->call(in); }, state, options,
                 std::move(mode));
}

}  // namespace kiln
