// kiln explain MODEL [--json]: what capture made of a zoo model — graphs, breaks with their
// reasons and call sites, ops per graph, guards, recompiles, fallbacks.
#include <cstdio>

#include "runtime/package.h"
#include "capture/compile.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "bench/bench.h"
#include "passes/autocast.h"
#include "tools/commands.h"

namespace kiln::cli {

void add_explain_command(CLI::App& app) {
  static std::string model;
  static bool json = false, fullgraph = false;
  static int64_t batch = 1;
  static uint64_t seed = 0;
  static std::string backend = "eager";
  static std::string mode = "default";
  static std::string device = "cpu";
  static std::string dtype = "float32";
  auto* cmd = app.add_subcommand("explain", "Show graphs, graph breaks, guards and fallbacks");
  cmd->add_option("model", model, "Zoo model name (see `kiln models`), MODEL.onnx or MODEL.kiln")->required();
  cmd->add_option("--batch", batch, "Batch size (default 1)");
  cmd->add_option("--seed", seed, "Seed for weights and inputs (default 0)");
  cmd->add_option("--backend", backend, "Compile backend (default eager)");
  cmd->add_option("--device", device, "cpu | cuda (default cpu)");
  cmd->add_option("--mode", mode, "default | reduce-overhead | max-autotune (compile mode)");
  cmd->add_option("--dtype", dtype,
                  "float32 | bfloat16 | float16 (or f32, bf16, f16): the precision the backend "
                  "runs a float32 model in (docs/compiler.md); default float32");
  cmd->add_flag("--fullgraph", fullgraph, "Treat a graph break as an error");
  cmd->add_flag("--json", json, "Print JSON: graphs, breaks, guards, recompiles, fallbacks");
  cmd->callback([] {
    if (model.size() > 5 && model.substr(model.size() - 5) == ".kiln") {
      std::printf("%s", explain_package(model).c_str());
      return;
    }
    if (device != "cpu" && device != "cuda") fail("explain: --device expected cpu or cuda, found '{}'", device);
    if (device == "cuda") require_cuda_device(0, "explain: --device cuda");
    BenchTarget m = load_bench_target(model, batch, seed, device == "cuda" ? Device::cuda(0) : Device::cpu());
    CompileOptions opts;
    opts.backend = backend;
    opts.mode = mode;
    opts.precision = parse_precision(dtype, "explain: --dtype");
    opts.fullgraph = fullgraph;
    CompiledFunction f = m.compile(opts);
    ExplainReport r = explain(f, m.inputs);
    if (json) {
      std::printf("%s\n", r.json().c_str());
    } else {
      std::printf("model %s (batch %lld, %s)\n%s", m.name.c_str(), (long long)batch, device.c_str(),
                  r.text().c_str());
    }
  });
}

}  // namespace kiln::cli
