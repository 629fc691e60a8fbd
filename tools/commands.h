// kiln CLI subcommands: each tools/cmd_<name>.cc defines add_<name>_command, which registers
// its CLI11 subcommand and callback. main.cc lists them; errors surface as kiln::Error and are
// printed by main with a non-zero exit.
#pragma once
#include <CLI/CLI.hpp>

#include "core/tensor.h"

namespace kiln::cli {

// Largest |a - b| over elements; infinity when the shapes differ or NaNs do not line up.
double max_abs_diff(const Tensor& a, const Tensor& b);
// max_abs_diff(a, b) / max |b| over b's finite values: the error relative to the output's size.
double max_rel_err(const Tensor& a, const Tensor& b);

void add_models_command(CLI::App& app);
void add_ops_command(CLI::App& app);
void add_run_command(CLI::App& app);
void add_opt_command(CLI::App& app);
void add_device_command(CLI::App& app);
void add_explain_command(CLI::App& app);
void add_conformance_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_profile_command(CLI::App& app);
void add_compile_command(CLI::App& app);
void add_package_command(CLI::App& app);

// `kiln run MODEL.onnx` (tools/onnx_run.cc): imports the model, runs it eagerly and/or compiled
// (kiln::compile with the best registered backend, strict) with the given NAME=FILE.npy inputs
// (fresh random inputs of the declared shapes otherwise, symbolic dims 1), writes each output as
// DIR/NAME.npy when output_dir is set (the eager outputs for "both"), prints shapes and checksums.
struct OnnxRunOptions {
  std::string model_path;
  std::vector<std::string> input_specs;
  std::string output_dir;
  std::string backend = "eager";  // eager | compiled | both
  // cuda: the compiled run takes the inputs on the device (the CUDA target); the eager run, the
  // reference, stays on the CPU.
  std::string device = "cpu";
  DType precision = DType::Float32;  // the compiled run's (--dtype)
  std::string mode = "default";      // the compiled run's (--mode)
  uint64_t seed = 0;
  bool json = false;
};
void run_onnx_model(const OnnxRunOptions& options);

// Exit code set by a subcommand callback (0 = success).
int& exit_code();

}  // namespace kiln::cli
