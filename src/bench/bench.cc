// kiln bench: run_bench and the targets it measures (also used by kiln profile and explain).
//
// Note [Benchmarking on CUDA]
// `kiln bench MODEL --device cuda`:
//   --backend compiled: capture runs the model with its inputs on the device (a zoo module keeps
//     its weights on the host; an .onnx file runs its host graph through the interpreter under
//     capture) and the compiler compiles each graph for the CUDA target, which places the
//     weights on the device once. Modes as on the CPU; reduce-overhead replays a CUDA graph.
//   --backend eager (.onnx only: modules have no to(device)): the graph is checked first
//     (cuda_eager_gap): every node needs a CUDA eager kernel or a decomposition whose ops all
//     have one (found by tracing it on type-only CUDA tensors under a DispatchHook, the way the
//     decompose pass traces); a node that has neither is a NotSupported error naming the node
//     and its op, before anything runs. The graph is then copied with every value on the device.
//   The random inputs are drawn on the CPU exactly as for --device cpu, then copied to the
//   device before anything is timed; outputs stay on the device. Each call is timed on the host
//   from before the call until cudaDeviceSynchronize returns (what a control loop sees). The
//   device time comes from two CUDA events around each of up to 1000 further calls, made after
//   the timed ones (Note [Device time in calls of its own]).
//
// Note [Device time in calls of its own]
// The events used to be recorded inside the host-timed window. Each record is a stream
// operation on the legacy stream, and reading the pair waits for the second: on an H200 that
// window measured mlp f32 reduce-overhead at 20.9 us a call, while the same call timed alone
// (`kiln profile`'s call_ms) was 11.2 us, and the bare graph of the same nodes (two copies, two
// kernels) launched and synchronized by a standalone program took 10.0 us
// (bench/cuda_gemm_probe.cu). The timer was measuring itself. So the host-observed samples come
// from calls with nothing but the call and the synchronization in the window, and the device
// time from separate calls that carry the events; it is still the device time of the same
// call (what the GPU spent between the stream operations around it).
//   Note [Device memory windows]: peak_device_bytes is the caching allocator's peak of bytes
//   handed out (tensors, the compiled arenas, weights and input staging), reset before the
//   model is loaded, so it covers loading, compiling (transient copies of folded weights
//   included) and every call. Three more figures split it: loaded_device_bytes (allocated once
//   the model's weights and inputs are on the device), resident_device_bytes (allocated after
//   the first call: the model plus what the compiled code keeps) and steady_peak_device_bytes
//   (the peak of the warm-up and timed calls, reset after the first call) — the window in which
//   bench/compare.py reads torch.cuda.max_memory_allocated for the PyTorch peers.
#include "bench/bench.h"
#include "runtime/package.h"

#include "passes/autocast.h"
#include "frontends/onnx/importer.h"
#include "ir/interpreter.h"

#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "compiler/backend.h"
#include "compiler/target.h"
#include "capture/compile.h"
#include "nn/compile.h"
#include "core/allocator.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "ops/dispatch.h"
#include "ir/parser.h"
#include "nn/models/zoo.h"
#include "nn/package.h"

namespace kiln {

namespace {
// How many calls after the timed ones carry the events that give the device time.
constexpr size_t kMaxDeviceTimedCalls = 1000;

// Points KILN_CACHE_DIR at a fresh temporary directory for its lifetime, then restores the old
// value and removes the directory.
class ScopedCacheDir {
 public:
  ScopedCacheDir() {
    const char* old = std::getenv("KILN_CACHE_DIR");
    had_ = old != nullptr;
    if (had_) old_ = old;
    char tmpl[] = "/tmp/kiln-bench-cache-XXXXXX";
    if (char* d = mkdtemp(tmpl)) dir_ = d;
    if (!dir_.empty()) setenv("KILN_CACHE_DIR", dir_.c_str(), 1);
  }
  ~ScopedCacheDir() {
    if (had_) setenv("KILN_CACHE_DIR", old_.c_str(), 1);
    else unsetenv("KILN_CACHE_DIR");
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }
 private:
  bool had_ = false;
  std::string old_, dir_;
};
}  // namespace

namespace {
std::atomic<AllocCounterFn> g_alloc_counter{nullptr};
std::atomic<void (*)()> g_alloc_sites_begin{nullptr};
std::atomic<std::map<std::string, int64_t> (*)()> g_alloc_sites_end{nullptr};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void set_alloc_counter(AllocCounterFn fn) { g_alloc_counter.store(fn); }
void set_alloc_site_recorder(AllocSiteRecorder recorder) {
  g_alloc_sites_end.store(nullptr);
  g_alloc_sites_begin.store(recorder.begin);
  g_alloc_sites_end.store(recorder.begin ? recorder.end : nullptr);
}

double percentile(std::vector<double> s, double p) {
  if (s.empty()) return NAN;
  std::sort(s.begin(), s.end());
  // Nearest rank: the smallest sample with at least p% of the samples <= it.
  double rank = std::ceil(p / 100.0 * double(s.size()));
  size_t i = rank < 1 ? 0 : std::min(s.size() - 1, size_t(rank) - 1);
  return s[i];
}

HostInfo host_info() {
  HostInfo h;
  h.cores = int(std::thread::hardware_concurrency());
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(in, line)) {
    auto value = [&] {
      size_t c = line.find(':');
      std::string v = c == std::string::npos ? "" : line.substr(c + 1);
      size_t b = v.find_first_not_of(" \t");
      return b == std::string::npos ? std::string() : v.substr(b);
    };
    if (h.cpu_model.empty() && line.rfind("model name", 0) == 0) h.cpu_model = value();
    if (flags.empty() && line.rfind("flags", 0) == 0) flags = " " + value() + " ";
    if (!h.cpu_model.empty() && !flags.empty()) break;
  }
  if (h.cpu_model.empty()) h.cpu_model = "unknown";
  for (const char* f : {"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile"})
    if (flags.find(std::string(" ") + f + " ") != std::string::npos) h.isa.push_back(f);
  return h;
}

namespace {

bool is_onnx_path(const std::string& target) {
  return target.size() > 5 && target.compare(target.size() - 5, 5, ".onnx") == 0;
}

// Fresh random inputs of g's input types, on the CPU (see load_bench_target).
TensorList random_inputs(const Graph& g, int64_t batch, uint64_t seed) {
  TensorList inputs;
  Generator gen(seed);
  for (ValueId v : g.inputs) {
    const TensorType& ty = g.type(v);
    Dims d;
    for (size_t i = 0; i < ty.shape.size(); ++i)
      d.push_back(ty.shape[i].is_symbolic() ? (i == 0 ? batch : 1) : ty.shape[i].value());
    if (is_floating(ty.dtype)) inputs.push_back(Tensor::randn(d, gen, ty.dtype));
    else if (ty.dtype == DType::Bool) inputs.push_back(Tensor::randint(d, gen, 0, 2, DType::Int64).to(DType::Bool));
    else inputs.push_back(Tensor::randint(d, gen, 0, 10, ty.dtype));
  }
  return inputs;
}

// A zoo model's input and output names; every input's first dim is the batch.
void zoo_signature(const nn::ZooModel& m, BenchTarget* t) {
  if (m.input_names.size() != m.inputs.size()) return;
  for (size_t i = 0; i < m.inputs.size(); ++i) {
    SignatureName s{m.input_names[i], {}};
    if (m.inputs[i].dim() > 0) {
      s.dims.assign(size_t(m.inputs[i].dim()), "");
      s.dims[0] = "batch";
    }
    t->input_names.push_back(std::move(s));
  }
  for (const std::string& o : m.output_names) t->output_names.push_back(SignatureName{o, {}});
}

// Note [bench specializes symbolic dims when the import needs them]
// An ONNX model whose import needs the value of a symbolic dim (torch's dynamic-batch exports:
// a Range up to the batch size, as convnext_tiny's and BERT's) does not import with its dims
// symbolic. A benchmark runs it at one shape anyway (random_inputs: the batch for a symbolic
// first dim, 1 for other symbolic dims), so such a model is imported again with its inputs
// declared at that shape (ImportOptions::input_shapes); a model that imports symbolically is
// left as it is. If the specialized import fails too, the first error is the one reported.
// Note [Data-dependent tails] (frontends/onnx/importer.h): a model that imports neither way
// because a node needs a value computed at run time (a detector's NonZero, NonMaxSuppression)
// is imported in two parts, the graph and a tail that runs op by op after it.
OnnxSplitImport import_for_bench(const std::string& path, int64_t batch) {
  try {
    return {import_onnx(path), nullptr};
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::NotSupported) throw;
    OnnxModelScan scan;
    try {
      scan = scan_onnx_model(path);
    } catch (const Error&) {
      throw e;
    }
    ImportOptions o;
    bool symbolic = false;
    for (size_t i = 0; i < scan.input_names.size(); ++i) {
      std::vector<int64_t> dims = scan.input_dims[i];
      for (size_t k = 0; k < dims.size(); ++k)
        if (dims[k] < 0) {
          dims[k] = k == 0 ? batch : 1;
          symbolic = true;
        }
      if (!dims.empty()) o.input_shapes.emplace_back(scan.input_names[i], std::move(dims));
    }
    if (symbolic) {
      try {
        return {import_onnx(path, o), nullptr};
      } catch (const Error&) {
      }
    }
    try {
      OnnxSplitImport split = import_onnx_split(path, o);
      if (split.tail) return split;
    } catch (const Error&) {
    }
    throw e;
  }
}

}  // namespace

// Declared in bench.h.
Graph graph_on_device(const Graph& g, Device device) {
  Graph out = g;
  for (Value& v : out.values) {
    v.type.device = device;
    if ((v.kind == ValueKind::Param || v.kind == ValueKind::Const) && v.data.defined() &&
        v.data.has_storage())
      v.data = v.data.to(device);
  }
  return out;
}

namespace {

[[noreturn]] void cuda_gap_error(const std::string& gap) {
  fail_kind(ErrorKind::NotSupported, "bench: --device cuda: {}; run it with --device cpu", gap);
}

BenchTarget load_cuda_target(const std::string& target, int64_t batch, uint64_t seed,
                             Device device) {
  KILN_CHECK(device.is_cuda(), "bench: device {} is neither cpu nor cuda", device.str());
  require_cuda_device(device.index, "bench: --device cuda");
  BenchTarget t;
  if (!is_onnx_path(target)) {
    // The module moves to the device (Module::to, in place), so eager calls and capture both
    // see CUDA weights and CUDA inputs.
    auto m = std::make_shared<nn::ZooModel>(nn::make_zoo_model(target, batch, seed));
    m->module->to(device);
    t.name = m->name;
    for (const Tensor& x : m->inputs) t.inputs.push_back(x.to(device));
    zoo_signature(*m, &t);
    std::string name = m->name;
    t.eager = [m, name, batch, seed](const TensorList& in) -> TensorList {
      try {
        return m->module->call(in);
      } catch (const Error&) {
        // Name what is missing: capture a CPU copy of the model (same seed) and walk its
        // graphs for ops without CUDA kernels.
        nn::ZooModel cpu = nn::make_zoo_model(name, batch, seed);
        CompileOptions copts;
        copts.backend = "eager";
        ExplainReport rep = explain(compile(cpu.module, copts), cpu.inputs);
        for (size_t i = 0; i < rep.graphs.size(); ++i) {
          Graph g = parse_graph(rep.graphs[i].ir,
                                name + " (captured graph " + std::to_string(i) + ")");
          std::string gap = cuda_eager_gap(g);
          if (!gap.empty()) cuda_gap_error(fmt::format("zoo model '{}': {}", name, gap));
        }
        throw;
      }
    };
    t.compile = [m](const CompileOptions& o) { return compile(m->module, o); };
    t.state = m->module->state_dict();
    t.fixed = nn::non_persistent_buffers(*m->module);
    return t;
  }
  OnnxSplitImport split = import_for_bench(target, batch);
  if (split.tail)
    cuda_gap_error(fmt::format("'{}' has a data-dependent part ({}), which runs on the CPU only",
                               target, describe_onnx_tail(*split.tail)));
  Graph cpu_graph = std::move(split.graph);
  t.name = std::filesystem::path(target).filename().string();
  TensorList cpu_inputs = random_inputs(cpu_graph, batch, seed);
  std::string gap = cuda_eager_gap(cpu_graph, bind_input_symbols(cpu_graph, cpu_inputs));
  auto g = std::make_shared<Graph>(graph_on_device(cpu_graph, device));
  for (const Tensor& x : cpu_inputs) t.inputs.push_back(x.to(device));
  t.eager = [g, gap](const TensorList& in) {
    if (!gap.empty()) cuda_gap_error(gap);
    return run(*g, in);
  };
  // Compiled: captured from the device graph (its weights already on the device).
  t.compile = [g](const CompileOptions& o) {
    return compile([g](const TensorList& in) { return run(*g, in); }, o);
  };
  return t;
}

// ---- cuda_eager_gap ---------------------------------------------------------------------------
// Traces ops on type-only (fake) CUDA tensors: an op with a CUDA kernel gets fake outputs of its
// inferred types; one without a kernel but with a decomposition runs the decomposition (whose
// ops come back here); one with neither is recorded and gets fake outputs too, so that the walk
// goes on. Ops fed a tensor on another device (a decomposition that makes a CPU tensor) are
// recorded as well: dispatch would refuse them.
class CudaKernelProbe final : public DispatchHook {
 public:
  explicit CudaKernelProbe(Device device) : device_(device) {}
  std::string problem;  // the first op that cannot run, described

  bool intercept(OpId op, std::span<const Tensor> inputs, const Attrs& attrs, TensorList& outputs,
                 const std::source_location&) override {
    const OpDef& def = op_def(op);
    TensorList padded;
    std::span<const Tensor> in = pad_optional_inputs(def, inputs, padded);
    Attrs canonical = def.canonicalize(attrs, "cuda check");
    for (size_t i = 0; i < in.size(); ++i)
      if (in[i].defined() && in[i].device() != device_ && problem.empty())
        problem = fmt::format("its decomposition gives op '{}' input {} on {} (dispatch needs "
                              "every input on {})", def.name, i, in[i].device().str(),
                              device_.str());
    const bool kernel = def.eager_cuda || def.eager_cuda_compiled;
    if (!kernel && def.decompose) {
      outputs = def.decompose(in, canonical);
      return true;
    }
    if (!kernel && problem.empty())
      problem = fmt::format("its decomposition uses op '{}', which has no CUDA kernel", def.name);
    outputs.clear();
    for (const TensorType& ty : infer_types(def, in, canonical, "cuda check"))
      outputs.push_back(Tensor::fake(to_dims(ty.shape, "cuda check"), ty.dtype, ty.device));
    return true;
  }

 private:
  Device device_;
};

// Why node `n` of g cannot run on CUDA through its op's decomposition, or "".
std::string decomposition_gap(const Graph& g, const Node& n, const SymbolBindings& bindings) {
  const Device cuda = Device::cuda(0);
  CudaKernelProbe probe(cuda);
  struct Installed {  // the probe is this thread's dispatch hook for this scope only
    DispatchHook* saved;
    ~Installed() { set_dispatch_hook(saved); }
  } installed{set_dispatch_hook(&probe)};
  try {
    TensorList fakes;
    for (ValueId v : n.inputs) {
      if (v == kNoValue) {
        fakes.emplace_back();
        continue;
      }
      const TensorType& ty = g.type(v);
      Dims d;
      for (SymInt s : ty.shape) d.push_back(s.evaluate(bindings));
      fakes.push_back(Tensor::fake(d, ty.dtype, cuda));
    }
    call_op(n.op, fakes, specialize_attrs(n.attrs, bindings));
  } catch (const Error& e) {
    if (probe.problem.empty())
      probe.problem = "its decomposition could not be checked on type-only tensors: " + e.message();
  }
  return probe.problem;
}

// Why the CUDA target refuses node `n` where the node runs through the compiled eager path
// (Note [Compiled eager kernels on CUDA]: no hand-written kernel for its dtype), or "".
std::string compiled_path_refusal(const Graph& g, const Node& n) {
  const OpDef& def = op_def(n.op);
  if (!def.eager_cuda_compiled || n.outputs.empty()) return "";
  DType d = n.inputs.empty() || n.inputs[0] == kNoValue ? g.type(n.outputs[0]).dtype
                                                         : g.type(n.inputs[0]).dtype;
  if (def.eager_cuda && std::find(def.eager_cuda_dtypes.begin(), def.eager_cuda_dtypes.end(), d) !=
                            def.eager_cuda_dtypes.end())
    return "";
  return compiler::target_for(Device::cuda(0)).unsupported_reason(g, n);
}

}  // namespace

std::string cuda_eager_gap(const Graph& g, const SymbolBindings& bindings) {
  std::string first;
  std::vector<std::string> ops;  // ops of the nodes that cannot run, first seen first
  int64_t bad = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const OpDef& def = op_def(n.op);
    std::string why;
    if (def.eager_cuda || def.eager_cuda_compiled) {
      why = compiled_path_refusal(g, n);
      if (why.empty()) continue;
    } else {
      why = def.decompose ? decomposition_gap(g, n, bindings) : "";
      if (def.decompose && why.empty()) continue;
    }
    ++bad;
    if (std::find(ops.begin(), ops.end(), def.name) == ops.end()) ops.push_back(def.name);
    if (!first.empty()) continue;
    std::string node = n.name.empty() ? fmt::format("node {}", i)
                                      : fmt::format("node '{}'", n.name);
    const std::string op = n.outputs.empty()
                               ? fmt::format("op '{}'", def.name)
                               : fmt::format("op '{}', {}", def.name,
                                             dtype_name(g.type(n.outputs[0]).dtype));
    first = why.empty() ? fmt::format("{} ({}) has no CUDA kernel; run it on the CPU", node, op)
                        : fmt::format("{} ({}) cannot run on CUDA: {}", node, op, why);
  }
  if (bad == 0) return "";
  std::string list;
  for (const std::string& op : ops) list += (list.empty() ? "" : ", ") + op;
  return fmt::format("{}; {} of {} nodes cannot run on CUDA ({})", first, bad, g.nodes.size(),
                     list);
}

BenchTarget load_bench_target(const std::string& target, int64_t batch, uint64_t seed,
                              Device device) {
  if (!device.is_cpu()) return load_cuda_target(target, batch, seed, device);
  BenchTarget t;
  if (!is_onnx_path(target)) {
    auto m = std::make_shared<nn::ZooModel>(nn::make_zoo_model(target, batch, seed));
    t.name = m->name;
    t.inputs = m->inputs;
    zoo_signature(*m, &t);
    t.eager = [m](const TensorList& in) { return m->module->call(in); };
    t.compile = [m](const CompileOptions& o) { return compile(m->module, o); };
    t.state = m->module->state_dict();
    t.fixed = nn::non_persistent_buffers(*m->module);
    return t;
  }
  OnnxSplitImport split = import_for_bench(target, batch);
  auto g = std::make_shared<Graph>(std::move(split.graph));
  std::shared_ptr<const OnnxTail> tail = split.tail;
  if (tail) t.data_dependent_tail = describe_onnx_tail(*tail);
  t.name = std::filesystem::path(target).filename().string();
  t.inputs = random_inputs(*g, batch, seed);
  t.eager = [g, tail](const TensorList& in) { return run_onnx_split(*g, tail.get(), in); };
  // Graph parameters keep their initializer names (a package's source graph lists them:
  // `kiln package --replace-weights` takes new weights by these names).
  NamedState params;
  for (ValueId v : g->params())
    if (g->value(v).kind == ValueKind::Param) params.emplace_back(g->value(v).name, g->value(v).data);
  t.state = params;
  t.compile = [g, tail, params](const CompileOptions& o) {
    return compile([g, tail](const TensorList& in) { return run_onnx_split(*g, tail.get(), in); },
                   params, o);
  };
  return t;
}

PackageInfo bench_package_info(const std::string& target, const BenchTarget& m, int64_t batch) {
  PackageInfo info;
  info.model = std::filesystem::path(target).filename().string();
  info.batch = batch;
  info.inputs = m.input_names;
  info.outputs = m.output_names;
  if (is_onnx_path(target)) {  // the names and dim_params as the file declares them
    OnnxModelScan scan = scan_onnx_model(target);
    info.inputs.clear();
    info.outputs.clear();
    for (size_t i = 0; i < scan.input_names.size(); ++i)
      info.inputs.push_back({scan.input_names[i], scan.input_dim_names[i]});
    for (size_t i = 0; i < scan.output_names.size(); ++i)
      info.outputs.push_back({scan.output_names[i], scan.output_dim_names[i]});
  }
  return info;
}

std::string best_compile_backend() {
  try {
    find_backend("inductor");
    return "inductor";
  } catch (const Error&) {
    return "eager";
  }
}

std::string BenchResult::json(int indent) const {
  using nlohmann::json;
  auto opt = [](const auto& o) { return o ? json(*o) : json(nullptr); };
  json j;
  j["model"] = model;
  j["backend"] = backend;
  j["device"] = device;
  j["mode"] = mode;
  j["dtype"] = dtype;
  j["batch"] = batch;
  j["threads"] = threads;
  j["warmup"] = warmup;
  j["iters"] = iters;
  j["kiln_version"] = kiln_version;
  j["compile_s"] = opt(compile_s);
  j["warm_compile_s"] = opt(warm_compile_s);
  j["warm_compile_cache_hit"] = opt(warm_compile_cache_hit);
  j["compile_cache"] = compile_cache.empty() ? json(nullptr) : json(compile_cache);
  j["first_call_s"] = first_call_s;
  j["load_s"] = load_s ? json(*load_s) : json(nullptr);
  j["cuda_context_s"] = cuda_context_s ? json(*cuda_context_s) : json(nullptr);
  json phases = json::object();
  for (const auto& [name, sec] : load_phases_s) phases[name] = sec;
  j["load_phases_s"] = load_s ? phases : json(nullptr);
  j["cuda_code"] = cuda_code.empty() ? json(nullptr) : json(cuda_code);
  j["p50_ms"] = p50_ms;
  j["p90_ms"] = p90_ms;
  j["p99_ms"] = p99_ms;
  j["max_ms"] = max_ms;
  j["min_ms"] = min_ms;
  j["mean_ms"] = mean_ms;
  j["stddev_ms"] = stddev_ms;
  j["samples_ms"] = samples_ms;
  j["device_p50_ms"] = opt(device_p50_ms);
  j["device_p99_ms"] = opt(device_p99_ms);
  j["throughput_per_s"] = throughput_per_s;
  j["peak_rss_bytes"] = peak_rss_bytes;
  j["peak_device_bytes"] = opt(peak_device_bytes);
  j["loaded_device_bytes"] = opt(loaded_device_bytes);
  j["resident_device_bytes"] = opt(resident_device_bytes);
  j["steady_peak_device_bytes"] = opt(steady_peak_device_bytes);
  j["arena_bytes"] = opt(arena_bytes);
  j["launches_per_call"] = opt(launches_per_call);
  j["steady_state_allocs_per_call"] = opt(steady_state_allocs_per_call);
  j["steady_state_allocs_by_module"] =
      steady_state_allocs_by_module.empty() ? json(nullptr) : json(steady_state_allocs_by_module);
  j["involuntary_switches_per_call"] = involuntary_switches_per_call;
  j["cpu_busy_cores"] = cpu_busy_cores;
  j["package_onednn_threads"] = package_onednn_threads ? json(*package_onednn_threads) : json(nullptr);
  j["package_nodes_at_written_threads"] =
      package_nodes_at_written_threads ? json(*package_nodes_at_written_threads) : json(nullptr);
  j["host"] = {{"cpu_model", host.cpu_model}, {"isa", host.isa}, {"cores", host.cores}};
  return j.dump(indent);
}

TensorList package_inputs(const Executable& exe, uint64_t seed) {
  Generator gen(seed);
  TensorList in;
  for (const Executable::InputSpec& s : exe.inputs) {
    if (is_floating(s.dtype)) {
      in.push_back(Tensor::randn(s.sizes, gen, s.dtype));
    } else {
      // Integers in [0, 10), as ONNX models' integer inputs get (indices, token ids).
      Tensor t = Tensor::randint(s.sizes, gen, 0, 10, s.dtype);
      in.push_back(t);
    }
  }
  return in;
}

BenchResult run_bench(const BenchOptions& given) {
  BenchOptions o = given;
  if (o.target.empty()) fail("bench: a target (zoo model name) is required");
  const bool is_package = o.target.size() > 5 && o.target.substr(o.target.size() - 5) == ".kiln";
  // No --device: a package runs on the device it was built for; a model on the CPU.
  if (o.device.empty()) o.device = is_package ? package_target_device(o.target) : "cpu";
  if (o.backend != "eager" && o.backend != "compiled")
    fail("bench: --backend expected eager or compiled, found '{}'", o.backend);
  if (o.mode != "default" && o.mode != "reduce-overhead" && o.mode != "max-autotune")
    fail("bench: --mode expected default, reduce-overhead or max-autotune, found '{}'", o.mode);
  if (o.device != "cpu" && o.device != "cuda")
    fail("bench: --device expected cpu or cuda, found '{}'", o.device);
  const DType precision = parse_precision(o.dtype, "bench: --dtype");
  if (precision != DType::Float32 && o.backend == "eager")
    fail("bench: --dtype {} applies to the compiled run (--backend compiled); --backend eager "
         "runs the model as written, in float32", dtype_name(precision));
  if (o.batch < 1) fail("bench: --batch expected >= 1, found {}", o.batch);
  if (o.threads < 0) fail("bench: --threads expected >= 0, found {}", o.threads);
  if (o.warmup < 0) fail("bench: --warmup expected >= 0, found {}", o.warmup);
  if (o.iters < 0) fail("bench: --iters expected >= 1, found {}", o.iters);
  if (!(o.seconds >= 0) || std::isinf(o.seconds))
    fail("bench: --seconds expected a finite number >= 0, found {}", o.seconds);
  if (o.iters > 0 && o.seconds > 0) fail("bench: give --iters or --seconds, not both");
  const bool cuda = o.device == "cuda";
  if (cuda) {
    if (cuda_device_count() == 0)
      fail_kind(ErrorKind::NotSupported, "bench: --device cuda: {}", cuda_status());
  }
  if (o.threads > 0) omp_set_num_threads(o.threads);

  const Device device = cuda ? Device::cuda(0) : Device::cpu();
  if (cuda) cuda_reset_peak_stats(device.index);  // the peak then covers weights, inputs, calls
  // A .kiln package: loaded by the runtime (timed: load_s), run on caller-owned buffers with
  // fresh random inputs of its declared shapes; no compile.
  std::optional<LoadedPackage> pkg;
  std::optional<double> load_s;
  TensorList pkg_outputs;
  std::vector<const void*> pkg_in;
  std::vector<void*> pkg_out;
  BenchTarget m;
  std::optional<double> context_s;
  if (is_package) {
    // The CUDA context is the process's, made once whatever it loads (~0.1 s on an H100): made
    // here, timed apart, so that load_s is the package's own cost.
    if (cuda) {
      auto c0 = std::chrono::steady_clock::now();
      cuda_synchronize(device.index);
      context_s = seconds_since(c0);
    }
    auto t0 = std::chrono::steady_clock::now();
    pkg = load_package(o.target);
    load_s = seconds_since(t0);
    if (pkg->device != (cuda ? "cuda" : "cpu"))
      fail("bench: {} is a {} package: run it with --device {}", o.target, pkg->device, pkg->device);
    m.name = o.target;
    m.inputs = package_inputs(*pkg->exe, o.seed);
    // CUDA: inputs and outputs on the device, as a caller that keeps its tensors there runs it.
    if (cuda)
      for (Tensor& t : m.inputs) t = t.to(device);
    for (const Tensor& t : m.inputs) pkg_in.push_back(t.raw_data());
    for (const Executable::OutputSpec& s : pkg->exe->outputs) {
      pkg_outputs.push_back(cuda ? Tensor::empty(s.sizes, s.dtype, device) : Tensor::empty(s.sizes, s.dtype));
      pkg_out.push_back(pkg_outputs.back().raw_data());
    }
  } else {
    m = load_bench_target(o.target, o.batch, o.seed, device);
  }
  BenchResult r;
  if (cuda) r.loaded_device_bytes = int64_t(cuda_allocator_stats(device.index).allocated_bytes);
  r.load_s = load_s;
  r.cuda_context_s = context_s;
  if (pkg) r.load_phases_s = pkg->load_phases;
  if (pkg && !cuda) {
    r.package_onednn_threads = pkg->onednn_threads;
    r.package_nodes_at_written_threads = pkg->onednn_nodes_at_written_threads;
  }
  if (pkg) r.cuda_code = pkg->cuda_code;
  r.model = m.name;
  r.device = o.device;
  r.mode = o.mode;
  r.dtype = dtype_name(precision);
  r.batch = o.batch;
  r.threads = omp_get_max_threads();
  r.warmup = o.warmup;
  r.kiln_version = KILN_VERSION;
  r.host = host_info();

  CompileOptions copts;
  copts.mode = o.mode;
  copts.precision = precision;
  std::function<void()> call;
  CompiledFunction compiled;
  TensorList outputs;  // reused by every compiled call (run_into)
  std::optional<ScopedCacheDir> cold_cache;
  double compile_call_s = 0;  // kiln::compile() itself (capture is lazy: it is cheap)
  if (is_package) {
    r.backend = "package";
    r.batch = pkg->exe->inputs.empty() || pkg->exe->inputs[0].sizes.empty()
                  ? 1 : pkg->exe->inputs[0].sizes[0];
    r.arena_bytes = pkg->exe->arena_bytes();
    if (cuda)
      call = [&] { pkg->exe->run(m.inputs.data(), m.inputs.size(), pkg_outputs.data(), pkg_outputs.size()); };
    else
      call = [&] { pkg->exe->run_buffers(pkg_in.data(), pkg_in.size(), pkg_out.data(), pkg_out.size()); };
  } else if (o.backend == "compiled") {
    copts.backend = best_compile_backend();
    r.backend = "compiled(" + copts.backend + ")";
    reset();  // cold: no cached graphs from earlier compiles in this process
    // Cold means an empty code cache: compile into a private, fresh cache directory (the warm
    // compile below then hits it); the user's cache is left alone. --compile-cache user
    // compiles with the user's cache instead, as a restarted process would.
    if (o.compile_cache != "fresh" && o.compile_cache != "user")
      fail("bench: --compile-cache expected fresh or user, found '{}'", o.compile_cache);
    r.compile_cache = o.compile_cache;
    if (o.compile_cache == "fresh") cold_cache.emplace();
    auto t0 = std::chrono::steady_clock::now();
    compiled = m.compile(copts);
    compile_call_s = seconds_since(t0);
    call = [&] { compiled.run_into(m.inputs, outputs); };
  } else {
    r.backend = "eager";
    call = [&] { m.eager(m.inputs); };  // CUDA: the outputs stay on the device
  }
  // CUDA work is asynchronous: a call ends when the device is done (what a control loop sees).
  auto sync = [&] {
    if (cuda) cuda_synchronize(device.index);
  };
  {
    auto t0 = std::chrono::steady_clock::now();
    try {
      call();  // compiled: traces, compiles the graphs and runs them once
      sync();
    } catch (const Error& e) {
      // bench's own errors (a model that cannot run on CUDA) already say where they come from.
      if (!cuda || e.message().rfind("bench: ", 0) == 0) throw;
      throw_error(e.kind(), "bench: --device cuda: the first call failed: " + e.message());
    }
    r.first_call_s = seconds_since(t0);
  }
  if (cuda) {
    const CudaAllocatorStats st = cuda_allocator_stats(device.index);
    r.resident_device_bytes = int64_t(st.allocated_bytes);
    r.peak_device_bytes = int64_t(st.peak_allocated_bytes);
    cuda_reset_peak_stats(device.index);  // the steady window: warm-up and timed calls
  }

  int64_t total = o.seconds > 0 ? -1 : int64_t(o.warmup) + (o.iters > 0 ? o.iters : 50);
  auto start = std::chrono::steady_clock::now();
  int64_t done = 0;
  for (int i = 0; i < o.warmup; ++i) {
    call();
    sync();
    if (o.progress) o.progress(++done, total, seconds_since(start));
  }
  std::vector<double>& ms = r.samples_ms;
  AllocCounterFn counter = g_alloc_counter.load();
  int64_t allocs = 0;  // counted around each call only (not the bookkeeping or progress bar)
  rusage ru0{};
  getrusage(RUSAGE_SELF, &ru0);  // involuntary context switches: around the whole timed loop
  auto timed_start = std::chrono::steady_clock::now();
  int want = o.iters > 0 ? o.iters : 50;
  for (int64_t i = 0;; ++i) {
    if (o.seconds > 0 ? (i > 0 && seconds_since(timed_start) >= o.seconds) : i >= want) break;
    int64_t a0 = counter ? counter() : 0;
    auto t0 = std::chrono::steady_clock::now();
    call();
    sync();
    auto t1 = std::chrono::steady_clock::now();
    if (counter) allocs += counter() - a0;
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    if (o.progress) o.progress(++done, total, seconds_since(start));
  }
  rusage ru1{};
  getrusage(RUSAGE_SELF, &ru1);
  const double timed_wall_s = seconds_since(timed_start);
  // Note [Device time in calls of its own]: the device time is measured in calls after the
  // timed ones, never inside them.
  std::vector<double> device_ms;
  if (cuda) {
    CudaEventTimer events(device.index);
    const size_t n = std::min<size_t>(ms.size(), kMaxDeviceTimedCalls);
    for (size_t i = 0; i < n; ++i) {
      events.start();
      call();
      events.stop();
      sync();
      device_ms.push_back(events.elapsed_ms());  // the stop event has completed
    }
  }
  if (counter) r.steady_state_allocs_per_call = double(allocs) / double(ms.size());
  // Note [allocation sites]: one more call, recorded, after the timed ones (recording costs a
  // stack walk per allocation).
  auto sites_begin = g_alloc_sites_begin.load();
  auto sites_end = g_alloc_sites_end.load();
  if (sites_begin && sites_end) {
    sites_begin();
    call();
    sync();
    r.steady_state_allocs_by_module = sites_end();
  }
  r.involuntary_switches_per_call = double(ru1.ru_nivcsw - ru0.ru_nivcsw) / double(ms.size());
  auto cpu_s = [](const rusage& u) {
    return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  };
  r.cpu_busy_cores = timed_wall_s > 0 ? (cpu_s(ru1) - cpu_s(ru0)) / timed_wall_s : 0;

  r.iters = int64_t(ms.size());
  r.p50_ms = percentile(ms, 50);
  r.p90_ms = percentile(ms, 90);
  r.p99_ms = percentile(ms, 99);
  r.max_ms = percentile(ms, 100);
  r.min_ms = percentile(ms, 0);
  double sum = 0;
  for (double x : ms) sum += x;
  r.mean_ms = sum / double(ms.size());
  double var = 0;
  for (double x : ms) var += (x - r.mean_ms) * (x - r.mean_ms);
  r.stddev_ms = ms.size() > 1 ? std::sqrt(var / double(ms.size() - 1)) : 0.0;
  r.throughput_per_s = r.mean_ms > 0 ? double(o.batch) * 1000.0 / r.mean_ms : 0.0;
  if (cuda) {
    r.device_p50_ms = percentile(device_ms, 50);
    r.device_p99_ms = percentile(device_ms, 99);
    r.steady_peak_device_bytes = int64_t(cuda_allocator_stats(device.index).peak_allocated_bytes);
    r.peak_device_bytes = std::max(*r.peak_device_bytes, *r.steady_peak_device_bytes);
  }

  if (o.backend == "compiled" && !is_package) {
    // The one-off cost: compile() plus the first call, minus what the fastest steady-state call
    // costs (the minimum, not the median: on a loaded machine the median is inflated).
    r.compile_s = std::max(0.0, compile_call_s + r.first_call_s - r.min_ms / 1000.0);
    // A second compile of the same module in a new CompiledFunction: it re-traces and re-runs
    // the compiler's passes, and finds the generated code in the on-disk cache.
    auto t0 = std::chrono::steady_clock::now();
    CompiledFunction again = m.compile(copts);
    again(m.inputs);
    r.warm_compile_s = std::max(0.0, seconds_since(t0) - r.min_ms / 1000.0);
    ExplainReport rep = again.report();
    bool hit = !rep.graphs.empty();
    int64_t arena = 0, launches = 0;
    bool planned = false, listed = false;
    for (const ExplainGraph& g : rep.graphs) {
      hit = hit && g.cache_hit;
      if (g.arena_bytes >= 0) arena += g.arena_bytes, planned = true;
      if (g.launches >= 0) launches += g.launches, listed = true;
    }
    r.warm_compile_cache_hit = hit;
    if (planned) r.arena_bytes = arena;
    if (listed) r.launches_per_call = launches;
    cold_cache.reset();
  }

  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  r.peak_rss_bytes = int64_t(ru.ru_maxrss) * 1024;  // Linux reports KiB
  return r;
}

}  // namespace kiln
