// `kiln run MODEL.onnx`: import an ONNX model and run it eagerly (the interpreter) and/or
// compiled (kiln::compile with the best registered backend). cmd_run.cc dispatches here for
// paths ending in .onnx.
//
// Import: symbolic dims (a dynamic batch) stay symbolic when the importer can carry them through
// the model; when a mapping needs a concrete value of one (a Range over the batch size, say),
// the model is imported again with every input's shape fixed to the given --input's (reported
// as "specialized"). Inputs the model needs at import time (shape arguments passed as graph
// inputs) are bound to their --input values.
//
// Compiled runs are strict and whole-graph (CompileOptions::strict, fullgraph): a compile or run
// failure is an error, never a silent fallback to eager, so that an output written by
// `--backend compiled` really came from the compiled graph.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "capture/compile.h"
#include "core/cuda_runtime.h"
#include "frontends/onnx/importer.h"
#include "ir/interpreter.h"
#include "bench/bench.h"
#include "runtime/npy.h"
#include "tools/commands.h"

namespace kiln::cli {
namespace {

// A fresh random tensor of the input's type; symbolic dims are 1.
Tensor random_input(const std::string& name, const TensorType& t, Generator& gen) {
  Dims d;
  for (SymInt s : t.shape) d.push_back(s.is_symbolic() ? 1 : s.value());
  int64_t n = 1;
  for (int64_t v : d) {
    if (v != 0 && n > (int64_t(1) << 32) / dtype_size(t.dtype) / v)
      fail("input '{}' is declared {}: too large for a random input (pass --input)", name, t.str());
    n *= v;
  }
  if (is_floating(t.dtype)) return Tensor::randn(d, gen, t.dtype);
  if (t.dtype == DType::Bool) return Tensor::randint(d, gen, 0, 2, DType::Int64).to(DType::Bool);
  return Tensor::randint(d, gen, 0, 10, t.dtype);
}

bool has_symbolic_input(const Graph& g) {
  for (ValueId v : g.inputs)
    for (SymInt d : g.type(v).shape)
      if (d.is_symbolic()) return true;
  return false;
}

// Imports, binding shape-argument inputs to their given values as the importer asks for them.
Graph import_binding(const std::string& path, ImportOptions& opts,
                     const std::vector<std::pair<std::string, Tensor>>& given) {
  std::vector<std::string> needed;
  opts.needed_constant_inputs = &needed;
  for (;;) {
    needed.clear();
    try {
      return import_onnx(path, opts);
    } catch (const Error&) {
      bool bound = false;
      for (const std::string& n : needed)
        for (auto& [name, t] : given)
          if (name == n && std::none_of(opts.constant_inputs.begin(), opts.constant_inputs.end(),
                                        [&](const auto& p) { return p.first == n; })) {
            opts.constant_inputs.emplace_back(name, t);
            bound = true;
          }
      if (!bound) throw;
    }
  }
}


double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void run_onnx_model(const OnnxRunOptions& o) {
  if (o.backend != "eager" && o.backend != "compiled" && o.backend != "both")
    fail("--backend for ONNX models must be eager, compiled or both, found '{}'", o.backend);
  if (o.device != "cpu" && o.device != "cuda")
    fail("--device expected cpu or cuda, found '{}'", o.device);
  const bool cuda = o.device == "cuda";
  if (cuda && o.backend == "eager")
    fail_kind(ErrorKind::NotSupported,
              "run: --device cuda runs an ONNX model compiled on the device (against the CPU "
              "eager run with --backend both); --backend eager runs on the CPU only");
  if (cuda) require_cuda_device(0, "run: --device cuda");
  std::vector<std::pair<std::string, Tensor>> given;
  for (const std::string& spec : o.input_specs) {
    size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0) fail("--input expects NAME=FILE.npy, got '{}'", spec);
    std::string name = spec.substr(0, eq);
    for (auto& [n, t] : given)
      if (n == name) fail("--input '{}' is given twice", name);
    given.emplace_back(name, read_npy(spec.substr(eq + 1)));
  }

  auto t_import = std::chrono::steady_clock::now();
  ImportOptions opts;
  Graph g;
  std::shared_ptr<const OnnxTail> tail;  // Note [Data-dependent tails]
  std::string specialized_because;
  try {
    try {
      g = import_binding(o.model_path, opts, given);
    } catch (const Error& e) {
      // A mapping that needs a concrete value of a symbolic dim: fix the inputs' shapes to the
      // given tensors' and import again (without given inputs there is nothing to fix them to).
      bool symbolic = e.kind() == ErrorKind::NotSupported &&
                      e.message().find("symbolic") != std::string::npos;
      if (!symbolic || given.empty()) throw;
      specialized_because = e.message();
      opts = ImportOptions{};
      for (auto& [name, t] : given)
        opts.input_shapes.emplace_back(name, std::vector<int64_t>(t.sizes().begin(), t.sizes().end()));
      g = import_binding(o.model_path, opts, given);
    }
  } catch (const Error& e) {
    // A node that needs a value computed at run time: the graph and a data-dependent tail.
    if (e.kind() != ErrorKind::NotSupported) throw;
    ImportOptions split_opts = opts;
    split_opts.needed_constant_inputs = nullptr;
    OnnxSplitImport split;
    try {
      split = import_onnx_split(o.model_path, split_opts);
    } catch (const Error&) {
      throw e;
    }
    if (!split.tail) throw;
    if (cuda)
      fail_kind(ErrorKind::NotSupported, "run: {}: {}; it runs on the CPU only", o.model_path,
                describe_onnx_tail(*split.tail));
    g = std::move(split.graph);
    tail = split.tail;
  }
  double import_s = seconds_since(t_import);
  // The model's output names: the tail's where there is one, else the graph's.
  std::vector<std::string> output_names;
  if (tail) output_names = onnx_tail_outputs(*tail);
  else
    for (ValueId v : g.outputs) output_names.push_back(g.value(v).name);

  Generator gen(o.seed);
  TensorList inputs(g.inputs.size());
  for (auto& [name, t] : given) {
    if (std::any_of(opts.constant_inputs.begin(), opts.constant_inputs.end(),
                    [&](const auto& p) { return p.first == name; }))
      continue;
    size_t k = 0;
    while (k < g.inputs.size() && g.value(g.inputs[k]).name != name) ++k;
    if (k == g.inputs.size()) {
      std::string names;
      for (ValueId v : g.inputs) names += (names.empty() ? "" : ", ") + g.value(v).name;
      fail("{} has no input '{}' (its inputs: {})", o.model_path, name,
           names.empty() ? "none" : names);
    }
    inputs[k] = t;
  }
  bool any_random = false;
  for (size_t k = 0; k < inputs.size(); ++k)
    if (!inputs[k].defined()) {
      inputs[k] = random_input(g.value(g.inputs[k]).name, g.type(g.inputs[k]), gen);
      any_random = true;
    }

  bool do_eager = o.backend != "compiled", do_compiled = o.backend != "eager";
  TensorList eager_out, compiled_out;
  double eager_s = 0, compiled_first_s = 0, compiled_s = 0;
  std::string compile_backend;
  if (do_eager) {
    auto t0 = std::chrono::steady_clock::now();
    eager_out = run_onnx_split(g, tail.get(), inputs);
    eager_s = seconds_since(t0);
  }
  if (do_compiled) {
    CompileOptions copts;
    copts.backend = compile_backend = best_compile_backend();
    copts.strict = true;     // a failure is an error, not a silent eager fallback
    // The imported graph has no host code: no breaks expected, but the one before a tail.
    copts.fullgraph = !tail;
    copts.precision = o.precision;
    copts.mode = o.mode;
    // On CUDA the graph is traced as a copy whose values live on the device.
    Graph on_device;
    if (cuda) on_device = graph_on_device(g, Device::cuda(0));
    const Graph* graph = cuda ? &on_device : &g;
    CompiledFunction fn = compile(
        [graph, tail](const TensorList& in) { return run_onnx_split(*graph, tail.get(), in); },
        copts);
    TensorList compiled_in = inputs;
    if (cuda)
      for (Tensor& t : compiled_in) t = t.to(Device::cuda(0));
    auto t0 = std::chrono::steady_clock::now();
    compiled_out = fn(compiled_in);  // traces, compiles, runs
    compiled_first_s = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    compiled_out = fn(compiled_in);  // the cached compiled graph
    compiled_s = seconds_since(t0);
    if (cuda)
      for (Tensor& t : compiled_out) t = t.to(Device::cpu());
    CompileStats st = fn.stats();
    if (st.graphs_compiled != 1 || st.compiled_calls != 1)
      fail("{}: the compiled run did not go through one compiled graph ({} graphs compiled, {} "
           "cached calls)", o.model_path, st.graphs_compiled, st.compiled_calls);
  }
  const TensorList& outs = do_eager ? eager_out : compiled_out;

  if (!o.output_dir.empty()) {
    std::filesystem::create_directories(o.output_dir);
    for (size_t i = 0; i < outs.size(); ++i) {
      std::string name = output_names[i];
      for (char& ch : name)  // ONNX names may hold '/' or ':'
        if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '-' && ch != '.') ch = '_';
      write_npy(o.output_dir + "/" + name + ".npy", outs[i]);
    }
  }
  nlohmann::json j;
  j["model"] = o.model_path;
  j["backend"] = do_eager && do_compiled ? "both"
                 : do_eager              ? "eager"
                                         : "compiled(" + compile_backend + ")";
  if (do_compiled) j["compile_backend"] = compile_backend;
  j["device"] = o.device;
  j["dtype"] = dtype_name(o.precision);
  j["mode"] = o.mode;
  j["random_inputs"] = any_random;
  j["seed"] = o.seed;
  j["nodes"] = g.nodes.size();
  j["symbolic_inputs"] = has_symbolic_input(g);
  j["specialized_shapes"] = !specialized_because.empty();
  if (!specialized_because.empty()) j["specialized_because"] = specialized_because;
  j["import_s"] = import_s;
  if (do_eager) j["eager_s"] = eager_s;
  if (do_compiled) {
    j["compiled_first_call_s"] = compiled_first_s;
    j["compiled_s"] = compiled_s;
  }
  j["inputs"] = nlohmann::json::array();
  for (size_t k = 0; k < inputs.size(); ++k)
    j["inputs"].push_back({{"name", g.value(g.inputs[k]).name},
                           {"dtype", dtype_name(inputs[k].dtype())},
                           {"shape", std::vector<int64_t>(inputs[k].sizes().begin(), inputs[k].sizes().end())}});
  j["outputs"] = nlohmann::json::array();
  for (size_t i = 0; i < outs.size(); ++i) {
    std::vector<double> v = outs[i].to_vector<double>();
    double sum = 0, asum = 0;
    for (double x : v) sum += x, asum += std::fabs(x);
    nlohmann::json out = {{"name", output_names[i]},
                          {"dtype", dtype_name(outs[i].dtype())},
                          {"shape", std::vector<int64_t>(outs[i].sizes().begin(), outs[i].sizes().end())},
                          {"sum", sum},
                          {"mean_abs", v.empty() ? 0.0 : asum / double(v.size())}};
    if (do_eager && do_compiled) {
      out["max_abs_diff_compiled_vs_eager"] = max_abs_diff(compiled_out[i], eager_out[i]);
      double ref_max = 0;  // the scale a compiled result is judged against (1e-4 x max|ref|)
      for (double x : v) ref_max = std::max(ref_max, std::fabs(x));
      out["max_abs_eager"] = ref_max;
      out["max_rel_err_compiled_vs_eager"] = max_rel_err(compiled_out[i], eager_out[i]);
    }
    j["outputs"].push_back(out);
  }
  if (o.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("model %s: %zu nodes, %zu inputs%s%s\n", o.model_path.c_str(), g.nodes.size(),
              inputs.size(), any_random ? fmt::format(" (random, seed {})", o.seed).c_str() : "",
              o.precision == DType::Float32 || !do_compiled
                  ? ""
                  : fmt::format("; compiled in {} (eager: float32)", dtype_name(o.precision)).c_str());
  if (!specialized_because.empty())
    std::printf("  imported with the input shapes fixed to the given inputs' (a mapping needs a "
                "concrete size: %s)\n", specialized_because.c_str());
  for (auto& out : j["outputs"]) {
    std::string shape = "[";
    for (size_t k = 0; k < out["shape"].size(); ++k)
      shape += (k ? ", " : "") + std::to_string(out["shape"][k].get<int64_t>());
    shape += "]";
    std::printf("  output %-24s %-8s %-18s sum %.6g  mean|x| %.6g",
                out["name"].get<std::string>().c_str(), out["dtype"].get<std::string>().c_str(),
                shape.c_str(), out["sum"].get<double>(), out["mean_abs"].get<double>());
    if (out.contains("max_abs_diff_compiled_vs_eager"))
      std::printf("  max|compiled-eager| %.3g (%.3g of max|eager|)",
                  out["max_abs_diff_compiled_vs_eager"].get<double>(),
                  out["max_rel_err_compiled_vs_eager"].get<double>());
    std::printf("\n");
  }
  std::printf("  import %.3f s", import_s);
  if (do_eager) std::printf("  eager run %.3f s", eager_s);
  if (do_compiled)
    std::printf("  compiled (%s): first call %.3f s, then %.3f s", compile_backend.c_str(),
                compiled_first_s, compiled_s);
  std::printf("\n");
}

// max |a - b| / max |b| (finite values; inf where NaN or shapes disagree, 0 when b is all 0 and
// a equals it): the relative error `kiln run --dtype` reports against the float32 eager run.
double max_rel_err(const Tensor& a, const Tensor& b) {
  double diff = max_abs_diff(a, b), scale = 0;
  for (double x : b.to_vector<double>())
    if (std::isfinite(x)) scale = std::max(scale, std::fabs(x));
  return diff == 0 ? 0.0 : scale == 0 ? INFINITY : diff / scale;
}

// Declared in tools/commands.h (shared by `kiln run` for zoo models and ONNX files).
double max_abs_diff(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes()) return INFINITY;
  auto av = a.to_vector<double>(), bv = b.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < av.size(); ++i) {
    if (std::isnan(av[i]) != std::isnan(bv[i])) return INFINITY;
    if (!std::isnan(av[i])) m = std::max(m, std::fabs(av[i] - bv[i]));
  }
  return m;
}

}  // namespace kiln::cli
