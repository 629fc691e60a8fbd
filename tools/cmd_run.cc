// kiln run MODEL: run a zoo model eagerly and through capture, compare outputs, report latency.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "capture/compile.h"
#include "nn/compile.h"
#include "nn/models/zoo.h"
#include "core/cuda_runtime.h"
#include "runtime/npy.h"
#include "runtime/package.h"
#include "bench/bench.h"
#include "passes/autocast.h"
#include "tools/commands.h"

namespace kiln::cli {
namespace {

struct RunArgs {
  std::string target;
  std::string backend = "both";
  bool backend_given = false;  // ONNX models default to eager
  int64_t batch = 1;
  uint64_t seed = 0;
  int iters = 10;
  int warmup = 2;
  int threads = 0;
  std::vector<std::string> inputs;
  std::string output_dir;
  std::string device = "cpu";  // cpu | cuda
  std::string dtype = "float32";  // the compiled run's precision (eager runs float32)
  std::string mode = "default";   // the compiled run's mode
  bool json = false;
};

struct Latency {
  std::vector<double> ms;
  double pct(double p) const {
    std::vector<double> s = ms;
    std::sort(s.begin(), s.end());
    if (s.empty()) return NAN;
    // Nearest-rank percentile: the smallest value with at least p% of samples <= it.
    double rank = std::ceil(p / 100.0 * double(s.size()));
    size_t i = rank < 1 ? 0 : std::min(s.size() - 1, size_t(rank) - 1);
    return s[i];
  }
};

template <typename F>
Latency time_it(F&& f, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) f();
  Latency l;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    auto t1 = std::chrono::steady_clock::now();
    l.ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return l;
}


void load_inputs(const RunArgs& a, nn::ZooModel& m) {
  for (const std::string& spec : a.inputs) {
    size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0)
      fail("--input expects NAME=FILE.npy, got '{}'", spec);
    std::string name = spec.substr(0, eq), path = spec.substr(eq + 1);
    auto it = std::find(m.input_names.begin(), m.input_names.end(), name);
    if (it == m.input_names.end()) {
      std::string names;
      for (auto& n : m.input_names) names += (names.empty() ? "" : ", ") + n;
      fail("model '{}' has no input '{}' (its inputs: {})", m.name, name, names);
    }
    size_t i = size_t(it - m.input_names.begin());
    Tensor t = read_npy(path);
    const Tensor& ex = m.inputs[i];
    if (t.dtype() != ex.dtype())
      fail("input '{}' from {}: dtype expected {}, found {}", name, path, dtype_name(ex.dtype()),
           dtype_name(t.dtype()));
    if (t.sizes() != ex.sizes())
      fail("input '{}' from {}: shape expected {}, found {} (use --batch to change the batch)",
           name, path, to_string(ex.sizes()), to_string(t.sizes()));
    m.inputs[i] = t;
  }
}

// `kiln run model.kiln`: load the package (timed), run it once on the given or random inputs,
// write/print the outputs. Only the runtime runs: no compiler, no capture.
void run_package(const RunArgs& a) {
  if (a.threads < 0) fail("--threads must be >= 0, got {}", a.threads);
  if (a.threads > 0) omp_set_num_threads(a.threads);
  auto t0 = std::chrono::steady_clock::now();
  LoadedPackage p = load_package(a.target);
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Executable& exe = *p.exe;
  TensorList in = package_inputs(exe, a.seed);
  for (const std::string& spec : a.inputs) {
    size_t eq = spec.find('=');
    if (eq == std::string::npos) fail("--input expected NAME=FILE.npy, found '{}'", spec);
    std::string name = spec.substr(0, eq), path = spec.substr(eq + 1);
    size_t i = 0;
    while (i < exe.inputs.size() && exe.inputs[i].name != name) ++i;
    if (i == exe.inputs.size()) {
      std::string names;
      for (const Executable::InputSpec& s : exe.inputs) names += (names.empty() ? "" : ", ") + s.name;
      fail("--input: the package has no input '{}' (its inputs: {}; `kiln explain {}` lists them)",
           name, names, a.target);
    }
    Tensor t = read_npy(path);
    // numpy has no bfloat16: a float32 file feeds a bfloat16 input (a package built with
    // --input-dtype bfloat16) rounded to it, as the caller of the C API would round it.
    if (exe.inputs[i].dtype == DType::BFloat16 && t.dtype() == DType::Float32 &&
        t.sizes() == exe.inputs[i].sizes) {
      t = t.to(DType::BFloat16);
      std::fprintf(stderr, "kiln run: input '%s': %s holds float32, rounded to bfloat16\n",
                   name.c_str(), path.c_str());
    }
    if (t.dtype() != exe.inputs[i].dtype || t.sizes() != exe.inputs[i].sizes)
      fail("input '{}' from {}: expected {} {}, found {} {}", name, path,
           dtype_name(exe.inputs[i].dtype), to_string(exe.inputs[i].sizes), dtype_name(t.dtype()),
           to_string(t.sizes()));
    in[i] = t.contiguous();
  }
  TensorList out;
  for (const Executable::OutputSpec& s : exe.outputs) out.push_back(Tensor::empty(s.sizes, s.dtype));
  auto t1 = std::chrono::steady_clock::now();
  exe.run(in.data(), in.size(), out.data(), out.size());
  double first_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  if (!a.output_dir.empty()) {
    std::filesystem::create_directories(a.output_dir);
    for (size_t i = 0; i < out.size(); ++i) {
      std::string name = exe.outputs[i].name.empty() ? "output" + std::to_string(i) : exe.outputs[i].name;
      write_npy(a.output_dir + "/" + name + ".npy", out[i]);
    }
  }
  nlohmann::json j;
  j["package"] = a.target;
  j["model"] = p.model;
  j["load_s"] = load_s;
  j["device"] = p.device;
  j["first_call_s"] = first_s;
  nlohmann::json outs = nlohmann::json::array();
  for (size_t i = 0; i < out.size(); ++i) {
    double sum = 0;
    Tensor f = out[i].to(DType::Float64).contiguous();
    const double* d = static_cast<const double*>(f.raw_data());
    for (int64_t k = 0; k < f.numel(); ++k) sum += d[k];
    outs.push_back({{"name", exe.outputs[i].name}, {"dtype", dtype_name(out[i].dtype())},
                    {"shape", std::vector<int64_t>(out[i].sizes().begin(), out[i].sizes().end())},
                    {"sum", sum}});
  }
  j["outputs"] = outs;
  if (a.json) {
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("package %s (model %s): loaded in %.1f ms, first call %.3f ms\n", a.target.c_str(),
              p.model.c_str(), load_s * 1e3, first_s * 1e3);
  for (const auto& o : outs)
    std::printf("  output %s %s %s sum %.9g\n", o["name"].get<std::string>().c_str(),
                o["dtype"].get<std::string>().c_str(), o["shape"].dump().c_str(),
                o["sum"].get<double>());
}

void run_command(const RunArgs& a) {
  if (a.target.size() > 5 && a.target.substr(a.target.size() - 5) == ".kiln") {
    run_package(a);
    return;
  }
  const DType precision = parse_precision(a.dtype, "run: --dtype");
  if (a.mode != "default" && a.mode != "reduce-overhead" && a.mode != "max-autotune")
    fail("run: --mode must be default, reduce-overhead or max-autotune, got '{}'", a.mode);
  if (a.mode != "default" && a.backend == "eager")
    fail("run: --mode {} applies to the compiled run; --backend eager compiles nothing", a.mode);
  if (precision != DType::Float32 && a.backend == "eager")
    fail("run: --dtype {} applies to the compiled run; --backend eager runs the model as written "
         "(float32): use --backend both to compare the two", dtype_name(precision));
  if (a.target.size() > 5 && a.target.substr(a.target.size() - 5) == ".onnx") {
    if (a.threads < 0) fail("--threads must be >= 0, got {}", a.threads);
    if (a.threads > 0) omp_set_num_threads(a.threads);
    OnnxRunOptions o;
    o.model_path = a.target;
    o.input_specs = a.inputs;
    o.output_dir = a.output_dir;
    o.backend = a.backend_given ? a.backend : "eager";
    o.seed = a.seed;
    o.json = a.json;
    o.precision = precision;
    o.mode = a.mode;
    o.device = a.device;
    // On CUDA the default compares the compiled run on the device with the CPU eager run.
    if (a.device == "cuda" && !a.backend_given) o.backend = "both";
    run_onnx_model(o);
    return;
  }
  if (a.backend != "eager" && a.backend != "compiled" && a.backend != "both")
    fail("--backend must be eager, compiled or both, got '{}'", a.backend);
  if (a.iters < 1) fail("--iters must be >= 1, got {}", a.iters);
  if (a.batch < 1) fail("--batch must be >= 1, got {}", a.batch);
  if (a.threads < 0) fail("--threads must be >= 0, got {}", a.threads);
  if (a.threads > 0) omp_set_num_threads(a.threads);
  if (a.device != "cpu" && a.device != "cuda")
    fail("--device expected cpu or cuda, found '{}'", a.device);
  const bool cuda = a.device == "cuda";
  if (cuda) require_cuda_device(0, "run: --device cuda");
  nn::ZooModel m = nn::make_zoo_model(a.target, a.batch, a.seed);
  load_inputs(a, m);
  // CUDA: the reference is the CPU eager run of the same weights and inputs; the module then
  // moves to the device (in place) with its inputs. Eager CUDA calls are timed up to a device
  // synchronization, as compiled calls are (they wait for the device before returning).
  TensorList cpu_reference;
  if (cuda) {
    cpu_reference = m.module->call(m.inputs);
    m.module->to(Device::cuda(0));
    for (Tensor& x : m.inputs) x = x.to(Device::cuda(0));
  }
  auto sync = [&] {
    if (cuda) cuda_synchronize(0);
  };

  // CUDA: "both" (the default) compares the compiled run on the device with the CPU eager run
  // (most ops have no CUDA eager kernel); --backend eager runs the CUDA eager kernels.
  bool do_eager = a.backend == "eager" || (a.backend == "both" && !cuda);
  bool do_capture = a.backend != "eager";
  TensorList eager_out, captured_out;
  Latency eager_lat, capture_lat;
  double capture_first_s = 0;
  CompiledFunction compiled;
  if (do_eager) {
    eager_out = m.module->call(m.inputs);
    eager_lat = time_it([&] { m.module->call(m.inputs); sync(); }, a.warmup, a.iters);
  }
  if (do_capture) {
    CompileOptions copts;
    copts.backend = best_compile_backend();
    copts.strict = true;  // a compile failure is an error here, not a silent eager run
    copts.precision = precision;
    copts.mode = a.mode;
    compiled = compile(m.module, copts);
    auto t0 = std::chrono::steady_clock::now();
    captured_out = compiled(m.inputs);
    capture_first_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    TensorList reused;
    capture_lat = time_it([&] { compiled.run_into(m.inputs, reused); sync(); }, a.warmup, a.iters);
  }
  if (cuda) {
    for (Tensor& t : eager_out) t = t.to(Device::cpu());
    for (Tensor& t : captured_out) t = t.to(Device::cpu());
  }
  const TensorList& outs = do_eager ? eager_out : captured_out;

  if (!a.output_dir.empty()) {
    std::filesystem::create_directories(a.output_dir);
    for (size_t i = 0; i < outs.size(); ++i) {
      std::string name = i < m.output_names.size() ? m.output_names[i] : fmt::format("output{}", i);
      write_npy(a.output_dir + "/" + name + ".npy", outs[i]);
    }
  }

  int threads = a.threads > 0 ? a.threads : omp_get_max_threads();
  nlohmann::json j;
  j["model"] = m.name;
  j["batch"] = a.batch;
  j["threads"] = threads;
  j["device"] = a.device;
  j["dtype"] = dtype_name(precision);  // of the compiled run
  j["mode"] = a.mode;
  j["outputs"] = nlohmann::json::array();
  for (size_t i = 0; i < outs.size(); ++i) {
    auto v = outs[i].to_vector<double>();
    double sum = 0, asum = 0;
    for (double x : v) sum += x, asum += std::fabs(x);
    nlohmann::json o = {{"name", i < m.output_names.size() ? m.output_names[i] : fmt::format("output{}", i)},
                        {"shape", std::vector<int64_t>(outs[i].sizes().begin(), outs[i].sizes().end())},
                        {"dtype", dtype_name(outs[i].dtype())},
                        {"sum", sum},
                        {"mean_abs", v.empty() ? 0.0 : asum / double(v.size())}};
    if (do_eager && do_capture) {
      o["max_abs_diff_compiled_vs_eager"] = max_abs_diff(captured_out[i], eager_out[i]);
      o["max_rel_err_compiled_vs_eager"] = max_rel_err(captured_out[i], eager_out[i]);
    }
    if (cuda) {
      o["max_abs_diff_vs_cpu_eager"] = max_abs_diff(outs[i], cpu_reference[i]);
      o["max_rel_err_vs_cpu_eager"] = max_rel_err(outs[i], cpu_reference[i]);
    }
    j["outputs"].push_back(o);
  }
  auto lat_json = [](const Latency& l) {
    return nlohmann::json{{"p50_ms", l.pct(50)}, {"p90_ms", l.pct(90)}, {"min_ms", l.pct(0)},
                          {"max_ms", l.pct(100)}, {"iters", l.ms.size()}};
  };
  if (do_eager) j["eager"] = lat_json(eager_lat);
  if (do_capture) {
    j["compiled"] = lat_json(capture_lat);
    j["compiled"]["first_call_s"] = capture_first_s;
    j["compiled"]["graphs"] = compiled.report().graphs.size();
    j["compiled"]["backend"] = best_compile_backend();
  }
  if (a.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("model %s  batch %lld  device %s  threads %d%s\n", m.name.c_str(),
              (long long)a.batch, a.device.c_str(), threads,
              precision == DType::Float32
                  ? ""
                  : fmt::format("  dtype {} (compiled; eager runs float32)", dtype_name(precision))
                        .c_str());
  for (auto& o : j["outputs"]) {
    std::string shape = "[";
    for (size_t k = 0; k < o["shape"].size(); ++k) shape += (k ? ", " : "") + std::to_string(o["shape"][k].get<int64_t>());
    shape += "]";
    std::printf("  output %-20s %-8s %-18s sum %.6g  mean|x| %.6g", o["name"].get<std::string>().c_str(),
                o["dtype"].get<std::string>().c_str(), shape.c_str(), o["sum"].get<double>(),
                o["mean_abs"].get<double>());
    if (o.contains("max_abs_diff_compiled_vs_eager"))
      std::printf("  max|compiled-eager| %.3g (%.3g of max|eager|)",
                  o["max_abs_diff_compiled_vs_eager"].get<double>(),
                  o["max_rel_err_compiled_vs_eager"].get<double>());
    if (o.contains("max_abs_diff_vs_cpu_eager"))
      std::printf("  max|cuda-cpu| %.3g (%.3g of max|cpu|)", o["max_abs_diff_vs_cpu_eager"].get<double>(),
                  o["max_rel_err_vs_cpu_eager"].get<double>());
    std::printf("\n");
  }
  std::string header = fmt::format("latency ({} iters)", a.iters);
  std::printf("  %-34s %10s %10s %10s\n", header.c_str(), "p50 ms", "p90 ms", "min ms");
  if (do_eager)
    std::printf("  %-34s %10.4f %10.4f %10.4f\n", "eager (op by op)", eager_lat.pct(50),
                eager_lat.pct(90), eager_lat.pct(0));
  if (do_capture) {
    std::string label = "compiled (" + best_compile_backend() + ")";
    std::printf("  %-34s %10.4f %10.4f %10.4f   (first call incl. capture + compile: %.3f s)\n",
                label.c_str(), capture_lat.pct(50), capture_lat.pct(90), capture_lat.pct(0),
                capture_first_s);
  }
  if (do_eager && do_capture)
    std::printf("  speedup of compiled over eager (p50): %.2fx   (more: kiln bench, kiln explain "
                "--backend inductor, docs/benchmarks.md)\n",
                eager_lat.pct(50) / capture_lat.pct(50));
}

}  // namespace

void add_run_command(CLI::App& app) {
  static RunArgs a;
  auto* cmd = app.add_subcommand("run", "Run a model eagerly and compiled, compare, time it");
  cmd->add_option("model", a.target, "Zoo model name (see `kiln models`), MODEL.onnx or MODEL.kiln (a package: loaded and run by the runtime)")->required();
  cmd->add_option("--backend", a.backend,
                  "Zoo models: eager | compiled | both (default both). MODEL.onnx: eager | "
                  "compiled (kiln::compile, best backend) | both (default eager)")
      ->each([](const std::string&) { a.backend_given = true; });
  cmd->add_option("--batch", a.batch, "Batch size (default 1)");
  cmd->add_option("--device", a.device, "cpu | cuda (default cpu); on cuda the compiled run is compared with the CPU eager run");
  cmd->add_option("--dtype", a.dtype,
                  "float32 | bfloat16 | float16 (or f32, bf16, f16): run the float32 model "
                  "compiled in this precision, as torch's autocast does (docs/compiler.md); the "
                  "eager run stays float32 and is the reference (default float32)");
  cmd->add_option("--mode", a.mode,
                  "default | reduce-overhead | max-autotune: the compiled run's mode (default "
                  "default); --output then writes the compiled outputs where only they run");
  cmd->add_option("--seed", a.seed, "Seed for weights and random inputs (default 0)");
  cmd->add_option("--iters", a.iters, "Timed iterations (default 10)");
  cmd->add_option("--warmup", a.warmup, "Warm-up iterations (default 2)");
  cmd->add_option("--threads", a.threads, "Intra-op threads (default: all cores)");
  cmd->add_option("--input", a.inputs, "NAME=FILE.npy: use this input instead of random data");
  cmd->add_option("--output", a.output_dir, "Write each output as DIR/NAME.npy");
  cmd->add_flag("--json", a.json, "Print one JSON object");
  cmd->callback([] { run_command(a); });
}

}  // namespace kiln::cli
