// kiln: the command-line driver. See docs/cli.md.
#include <cstdio>

#include "core/error.h"
#include "kiln/version.h"
#include "tools/commands.h"

namespace kiln::cli {
int& exit_code() {
  static int code = 0;
  return code;
}
}  // namespace kiln::cli

int main(int argc, char** argv) {
  CLI::App app{"kiln: a deep-learning compiler and real-time inference runtime"};
  app.set_version_flag("--version", std::string("kiln ") + KILN_VERSION);
  app.require_subcommand(1);
  kiln::cli::add_models_command(app);
  kiln::cli::add_ops_command(app);
  kiln::cli::add_run_command(app);
  kiln::cli::add_opt_command(app);
  kiln::cli::add_device_command(app);
  kiln::cli::add_explain_command(app);
  kiln::cli::add_conformance_command(app);
  kiln::cli::add_bench_command(app);
  kiln::cli::add_profile_command(app);
  kiln::cli::add_compile_command(app);
  kiln::cli::add_package_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln: internal error: %s\n", e.what());
    return 2;
  }
  return kiln::cli::exit_code();
}
