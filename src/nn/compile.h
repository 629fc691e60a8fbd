// kiln::compile for modules: captures module->call(...) with the module's parameters and
// buffers named in the graph (capture/compile.h does the work).
//
//   auto model = std::make_shared<MyNet>();
//   kiln::CompiledFunction f = kiln::compile(model);        // the compiler, default mode
//   TensorList y = f({x});
#pragma once
#include <memory>

#include "capture/compile.h"

namespace kiln {

namespace nn {
class Module;
}

CompiledFunction compile(std::shared_ptr<nn::Module> module, const CompileOptions& options = {});

}  // namespace kiln
