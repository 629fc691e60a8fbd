#include "compiler/package.h"

#include "compiler/replace_weights.h"
#include "core/error.h"
#include "runtime/executable.h"

namespace kiln::compiler {

void write_package(const Graph& source, CompiledExecutable& compiled, const Options& options,
                   PackageInfo info, const std::string& path, const NamedTensors& model_state,
                   const NamedTensors& fixed_params) {
  info.mode = options.mode;
  info.knobs = options.knobs.str();
  // Note [Packages record the choice, not the timings]
  // A max-autotune package records the configuration chosen, not the timings that chose it (the
  // compile's report and `kiln compile`'s output show those): the timings differ from run to
  // run, and a compile that reads the choice from the tuning store times nothing, so with them
  // the first compile on a machine and every later one wrote different bytes, though they hold
  // the same kernels (found on the H100 with resnet50's max-autotune packages, fortieth session).
  info.autotune = compiled.report().autotune_choice.empty()
                      ? ""
                      : "chose " + compiled.report().autotune_choice;
  info.precision = dtype_name(options.precision);
  // Note [prepacked weights] (kernels/onednn_node.cc): on by default for CPU packages.
  const std::string prepack = options.knobs.get("prepack", "on");
  if (prepack != "on" && prepack != "off")
    fail_kind(ErrorKind::InvalidArgument, "package: knob prepack expected on | off, found '{}'",
              prepack);
  if (compiled.executable().device().is_cuda() && options.knobs.find("prepack"))
    fail_kind(ErrorKind::InvalidArgument, "package: knob prepack is for CPU packages (oneDNN's "
              "weights); a CUDA package's library calls read their weights as stored: drop it");
  info.prepack = prepack == "on";
  info.source = source_section_bytes(source, target_for(compiled.executable().device()), options,
                                     model_state, fixed_params);
  kiln::write_package(compiled.executable(), info, path);
}

}  // namespace kiln::compiler
