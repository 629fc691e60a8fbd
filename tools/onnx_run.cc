// `kiln run MODEL.onnx`: import an ONNX model and run it on the eager backend (the
// interpreter). cmd_run.cc dispatches here for paths ending in .onnx. Inputs the model needs at
// import time (shape arguments passed as graph inputs) are bound to their --input values.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "frontends/onnx/importer.h"
#include "ir/interpreter.h"
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

}  // namespace

void run_onnx_model(const std::string& model_path, const std::vector<std::string>& input_specs,
                    const std::string& output_dir, uint64_t seed, bool json) {
  std::vector<std::pair<std::string, Tensor>> given;
  for (const std::string& spec : input_specs) {
    size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0) fail("--input expects NAME=FILE.npy, got '{}'", spec);
    std::string name = spec.substr(0, eq);
    for (auto& [n, t] : given)
      if (n == name) fail("--input '{}' is given twice", name);
    given.emplace_back(name, read_npy(spec.substr(eq + 1)));
  }
  // Inputs the model needs at import time (shape arguments) are bound to their given values.
  ImportOptions opts;
  std::vector<std::string> needed;
  opts.needed_constant_inputs = &needed;
  Graph g;
  for (;;) {
    needed.clear();
    try {
      g = import_onnx(model_path, opts);
      break;
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
  Generator gen(seed);
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
      fail("{} has no input '{}' (its inputs: {})", model_path, name, names.empty() ? "none" : names);
    }
    inputs[k] = t;
  }
  bool any_random = false;
  for (size_t k = 0; k < inputs.size(); ++k)
    if (!inputs[k].defined()) {
      inputs[k] = random_input(g.value(g.inputs[k]).name, g.type(g.inputs[k]), gen);
      any_random = true;
    }
  TensorList outs = run(g, inputs);

  if (!output_dir.empty()) {
    std::filesystem::create_directories(output_dir);
    for (size_t i = 0; i < outs.size(); ++i) {
      std::string name = g.value(g.outputs[i]).name;
      for (char& ch : name)  // ONNX names may hold '/' or ':'
        if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '-' && ch != '.') ch = '_';
      write_npy(output_dir + "/" + name + ".npy", outs[i]);
    }
  }
  nlohmann::json j;
  j["model"] = model_path;
  j["random_inputs"] = any_random;
  j["seed"] = seed;
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
    j["outputs"].push_back({{"name", g.value(g.outputs[i]).name},
                            {"dtype", dtype_name(outs[i].dtype())},
                            {"shape", std::vector<int64_t>(outs[i].sizes().begin(), outs[i].sizes().end())},
                            {"sum", sum},
                            {"mean_abs", v.empty() ? 0.0 : asum / double(v.size())}});
  }
  if (json) {
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("model %s: %zu nodes, %zu inputs%s\n", model_path.c_str(), g.nodes.size(),
              inputs.size(), any_random ? fmt::format(" (random, seed {})", seed).c_str() : "");
  for (auto& o : j["outputs"]) {
    std::string shape = "[";
    for (size_t k = 0; k < o["shape"].size(); ++k)
      shape += (k ? ", " : "") + std::to_string(o["shape"][k].get<int64_t>());
    shape += "]";
    std::printf("  output %-24s %-8s %-18s sum %.6g  mean|x| %.6g\n",
                o["name"].get<std::string>().c_str(), o["dtype"].get<std::string>().c_str(),
                shape.c_str(), o["sum"].get<double>(), o["mean_abs"].get<double>());
  }
}

}  // namespace kiln::cli
