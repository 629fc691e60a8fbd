#include "nn/compile.h"

#include "core/error.h"
#include "nn/module.h"

namespace kiln {

CompiledFunction compile(std::shared_ptr<nn::Module> module, const CompileOptions& options) {
  KILN_CHECK(module, "kiln::compile: the module is null");
  NamedState state;
  for (auto& [name, t] : module->named_parameters()) state.emplace_back(name, t);
  for (auto& [name, t] : module->named_buffers()) state.emplace_back(name, t);
  return compile([module](const TensorList& in) { return module->call(in); }, state, options);
}

}  // namespace kiln
