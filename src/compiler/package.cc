#include "compiler/package.h"

#include "runtime/executable.h"

namespace kiln::compiler {

void write_package(CompiledExecutable& compiled, const Options& options, PackageInfo info,
                   const std::string& path) {
  info.mode = options.mode;
  info.knobs = options.knobs.str();
  info.autotune = compiled.report().autotune;
  kiln::write_package(compiled.executable(), info, path);
}

}  // namespace kiln::compiler
