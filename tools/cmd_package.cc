// kiln package --replace-weights MODEL.kiln NEW.safetensors -o NEW.kiln: new weights into a
// compiled package, without compiling again (compiler/replace_weights.h, docs/package.md).
#include <cstdio>

#include "compiler/replace_weights.h"
#include "core/error.h"
#include "tools/commands.h"

namespace kiln::cli {

namespace {

struct PackageArgs {
  std::vector<std::string> replace_weights;  // MODEL.kiln NEW.safetensors
  std::string output;
};

void package_command(const PackageArgs& a) {
  if (a.replace_weights.size() != 2)
    fail("package: expected --replace-weights MODEL.kiln NEW.safetensors -o NEW.kiln");
  if (a.output.empty()) fail("package: -o NEW.kiln is required");
  compiler::ReplaceWeightsReport r =
      compiler::replace_weights(a.replace_weights[0], a.replace_weights[1], a.output);
  std::printf("wrote %s: weights of %s replaced by %s: %s\n", a.output.c_str(),
              a.replace_weights[0].c_str(), a.replace_weights[1].c_str(), r.str().c_str());
}

}  // namespace

void add_package_command(CLI::App& app) {
  static PackageArgs a;
  auto* cmd = app.add_subcommand("package", "Change a deployment package (.kiln) without "
                                            "compiling it again");
  cmd->add_option("--replace-weights", a.replace_weights,
                  "MODEL.kiln NEW.safetensors: put new weights (named as the model's parameters; "
                  "`kiln explain MODEL.kiln` lists them) into the package")
      ->expected(2)
      ->required();
  cmd->add_option("-o,--output", a.output, "The package to write (may be MODEL.kiln itself)")
      ->required();
  cmd->callback([] { package_command(a); });
}

}  // namespace kiln::cli
