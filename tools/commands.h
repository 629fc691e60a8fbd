// kiln CLI subcommands: each tools/cmd_<name>.cc defines add_<name>_command, which registers
// its CLI11 subcommand and callback. main.cc lists them; errors surface as kiln::Error and are
// printed by main with a non-zero exit.
#pragma once
#include <CLI/CLI.hpp>

namespace kiln::cli {

void add_models_command(CLI::App& app);
void add_ops_command(CLI::App& app);
void add_run_command(CLI::App& app);
void add_opt_command(CLI::App& app);
void add_device_command(CLI::App& app);
void add_explain_command(CLI::App& app);

// Exit code set by a subcommand callback (0 = success).
int& exit_code();

}  // namespace kiln::cli
