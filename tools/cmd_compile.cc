// kiln compile MODEL|MODEL.onnx -o model.kiln [--device cpu|cuda]: compile and write a
// deployment package (runtime/package.h, docs/package.md).
#include <omp.h>

#include <chrono>
#include <cstdio>

#include "bench/bench.h"
#include "compiler/package.h"
#include "core/error.h"
#include "ir/graph.h"
#include "nn/models/zoo.h"
#include "nn/package.h"
#include "passes/autocast.h"
#include "runtime/package.h"
#include "tools/commands.h"

namespace kiln::cli {

namespace {

struct CompileArgs {
  std::string model, output, mode = "default", knobs, device = "cpu", dtype = "float32", arch;
  std::string input_dtype;  // empty: the model's
  int64_t batch = 1;
  uint64_t seed = 0;
  int threads = 0;
};

void compile_command(const CompileArgs& a) {
  if (a.output.empty()) fail("compile: -o model.kiln is required");
  if (a.device != "cpu" && a.device != "cuda")
    fail("compile: --device expected cpu or cuda, found '{}'", a.device);
  if (!a.arch.empty() && a.device != "cuda")
    fail("compile: --arch {} is a CUDA architecture: add --device cuda", a.arch);
  // A cross-build captures the model on the host and compiles it for the architecture, with no
  // GPU (Note [CUDA cross-builds]); otherwise the model runs where it is compiled for.
  const Device device = a.device == "cuda" && a.arch.empty() ? Device::cuda(0) : Device::cpu();
  if (a.mode != "default" && a.mode != "reduce-overhead" && a.mode != "max-autotune")
    fail("compile: --mode expected default, reduce-overhead or max-autotune, found '{}'", a.mode);
  if (a.batch < 1) fail("compile: --batch expected >= 1, found {}", a.batch);
  if (a.threads < 0) fail("compile: --threads expected >= 0, found {}", a.threads);
  if (a.threads > 0) omp_set_num_threads(a.threads);
  compiler::Options options;
  options.mode = a.mode;
  options.precision = parse_precision(a.dtype, "compile: --dtype");
  if (!a.input_dtype.empty()) {
    const DType d = parse_precision(a.input_dtype, "compile: --input-dtype");
    if (d != DType::Float32) options.input_dtype = d;
  }
  options.arch = a.arch;
  if (!a.knobs.empty()) options.knobs = compiler::parse_knobs(a.knobs, "compile --knobs");
  auto t0 = std::chrono::steady_clock::now();
  // Zoo models and ONNX files alike: captured as one graph (ONNX through the graph interpreter,
  // concrete shapes for --batch) and compiled with the caller's options.
  BenchTarget m = load_bench_target(a.model, a.batch, a.seed, device);
  if (!m.data_dependent_tail.empty())
    fail_kind(ErrorKind::NotSupported,
              "compile: {}: {}. A package holds one graph, so this model cannot be packaged yet; "
              "`kiln run` and `kiln bench` run it (the graph compiled, then the rest), or export "
              "the model without the part whose sizes depend on values (a detector without its "
              "post-processing)", a.model, m.data_dependent_tail);
  Graph source;
  auto compiled = nn::compile_captured_graph(m.compile, m.inputs, options, &source);
  PackageInfo info = bench_package_info(a.model, m, a.batch);
  compiler::write_package(source, *compiled, options, info, a.output, m.state, m.fixed);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("wrote %s: %s (%.2f s)\n", a.output.c_str(), compiled->summary().c_str(), s);
}

}  // namespace

void add_compile_command(CLI::App& app) {
  static CompileArgs a;
  auto* cmd = app.add_subcommand("compile", "Compile a model into a deployment package (.kiln)");
  cmd->add_option("model", a.model, "Zoo model name (see `kiln models`) or MODEL.onnx")->required();
  cmd->add_option("-o,--output", a.output, "The package to write (model.kiln)")->required();
  cmd->add_option("--device", a.device, "cpu (default) | cuda (compiled on this machine's GPU)");
  cmd->add_option("--mode", a.mode, "default | reduce-overhead | max-autotune");
  cmd->add_option("--arch", a.arch,
                  "With --device cuda: cross-build for this GPU architecture (sm_90) on a machine "
                  "without one; cuBLASLt/cuDNN choices are made when the package is loaded");
  cmd->add_option("--knobs", a.knobs, "Target configuration, e.g. conv=nChw16c,vec=256");
  cmd->add_option("--dtype", a.dtype,
                  "float32 (default) | bfloat16 | float16 (f32 bf16 f16): run a float32 model in "
                  "this precision, as torch's autocast does (docs/compiler.md)");
  cmd->add_option("--input-dtype", a.input_dtype,
                  "bfloat16 | float16: the package takes its float32 inputs in this dtype (half "
                  "the bytes to pass and copy; with --dtype of the same, no conversion kernel)");
  cmd->add_option("--batch", a.batch, "Batch size (default 1)");
  cmd->add_option("--seed", a.seed, "Seed for zoo weights and example inputs (default 0)");
  cmd->add_option("--threads", a.threads, "OpenMP threads the package is built for (default all)");
  cmd->callback([] { compile_command(a); });
}

}  // namespace kiln::cli
