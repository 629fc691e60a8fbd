#include "compiler/package.h"

#include "compiler/replace_weights.h"
#include "runtime/executable.h"

namespace kiln::compiler {

void write_package(const Graph& source, CompiledExecutable& compiled, const Options& options,
                   PackageInfo info, const std::string& path, const NamedTensors& model_state,
                   const NamedTensors& fixed_params) {
  info.mode = options.mode;
  info.knobs = options.knobs.str();
  info.autotune = compiled.report().autotune;
  info.precision = dtype_name(options.precision);
  info.source = source_section_bytes(source, target_for(compiled.executable().device()), options,
                                     model_state, fixed_params);
  kiln::write_package(compiled.executable(), info, path);
}

}  // namespace kiln::compiler
