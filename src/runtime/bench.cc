#include "runtime/bench.h"

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

#include <nlohmann/json.hpp>

#include "capture/backend.h"
#include "capture/compile.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "nn/models/zoo.h"

namespace kiln {

namespace {
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

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void set_alloc_counter(AllocCounterFn fn) { g_alloc_counter.store(fn); }

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

BenchTarget load_bench_target(const std::string& target, int64_t batch, uint64_t seed) {
  BenchTarget t;
  bool onnx = target.size() > 5 && target.compare(target.size() - 5, 5, ".onnx") == 0;
  if (!onnx) {
    auto m = std::make_shared<nn::ZooModel>(nn::make_zoo_model(target, batch, seed));
    t.name = m->name;
    t.inputs = m->inputs;
    t.eager = [m](const TensorList& in) { return m->module->call(in); };
    t.compile = [m](const CompileOptions& o) { return compile(m->module, o); };
    return t;
  }
  auto g = std::make_shared<Graph>(import_onnx(target));
  t.name = std::filesystem::path(target).filename().string();
  Generator gen(seed);
  for (ValueId v : g->inputs) {
    const TensorType& ty = g->type(v);
    Dims d;
    for (size_t i = 0; i < ty.shape.size(); ++i)
      d.push_back(ty.shape[i].is_symbolic() ? (i == 0 ? batch : 1) : ty.shape[i].value());
    if (is_floating(ty.dtype)) t.inputs.push_back(Tensor::randn(d, gen, ty.dtype));
    else if (ty.dtype == DType::Bool) t.inputs.push_back(Tensor::randint(d, gen, 0, 2, DType::Int64).to(DType::Bool));
    else t.inputs.push_back(Tensor::randint(d, gen, 0, 10, ty.dtype));
  }
  t.eager = [g](const TensorList& in) { return run(*g, in); };
  t.compile = [g](const CompileOptions& o) {
    return compile([g](const TensorList& in) { return run(*g, in); }, o);
  };
  return t;
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
  j["batch"] = batch;
  j["threads"] = threads;
  j["warmup"] = warmup;
  j["iters"] = iters;
  j["kiln_version"] = kiln_version;
  j["compile_s"] = opt(compile_s);
  j["warm_compile_s"] = opt(warm_compile_s);
  j["warm_compile_cache_hit"] = opt(warm_compile_cache_hit);
  j["first_call_s"] = first_call_s;
  j["p50_ms"] = p50_ms;
  j["p90_ms"] = p90_ms;
  j["p99_ms"] = p99_ms;
  j["max_ms"] = max_ms;
  j["min_ms"] = min_ms;
  j["mean_ms"] = mean_ms;
  j["stddev_ms"] = stddev_ms;
  j["throughput_per_s"] = throughput_per_s;
  j["peak_rss_bytes"] = peak_rss_bytes;
  j["peak_device_bytes"] = opt(peak_device_bytes);
  j["arena_bytes"] = opt(arena_bytes);
  j["steady_state_allocs_per_call"] = opt(steady_state_allocs_per_call);
  j["host"] = {{"cpu_model", host.cpu_model}, {"isa", host.isa}, {"cores", host.cores}};
  return j.dump(indent);
}

BenchResult run_bench(const BenchOptions& o) {
  if (o.target.empty()) fail("bench: a target (zoo model name) is required");
  if (o.backend != "eager" && o.backend != "compiled")
    fail("bench: --backend expected eager or compiled, found '{}'", o.backend);
  if (o.mode != "default" && o.mode != "reduce-overhead" && o.mode != "max-autotune")
    fail("bench: --mode expected default, reduce-overhead or max-autotune, found '{}'", o.mode);
  if (o.device != "cpu" && o.device != "cuda")
    fail("bench: --device expected cpu or cuda, found '{}'", o.device);
  if (o.batch < 1) fail("bench: --batch expected >= 1, found {}", o.batch);
  if (o.threads < 0) fail("bench: --threads expected >= 0, found {}", o.threads);
  if (o.warmup < 0) fail("bench: --warmup expected >= 0, found {}", o.warmup);
  if (o.iters < 0) fail("bench: --iters expected >= 1, found {}", o.iters);
  if (!(o.seconds >= 0) || std::isinf(o.seconds))
    fail("bench: --seconds expected a finite number >= 0, found {}", o.seconds);
  if (o.iters > 0 && o.seconds > 0) fail("bench: give --iters or --seconds, not both");
  if (o.device == "cuda") {
    if (cuda_device_count() == 0)
      fail_kind(ErrorKind::NotSupported, "bench: --device cuda: {}",
                cuda_status());
    fail_kind(ErrorKind::NotSupported,
              "bench: --device cuda is not supported yet: zoo modules cannot be moved to a CUDA "
              "device; use --device cpu");
  }
  if (o.threads > 0) omp_set_num_threads(o.threads);

  BenchTarget m = load_bench_target(o.target, o.batch, o.seed);
  BenchResult r;
  r.model = m.name;
  r.device = o.device;
  r.mode = o.mode;
  r.batch = o.batch;
  r.threads = omp_get_max_threads();
  r.warmup = o.warmup;
  r.kiln_version = KILN_VERSION;
  r.host = host_info();

  CompileOptions copts;
  copts.mode = o.mode;
  std::function<void()> call;
  CompiledFunction compiled;
  TensorList outputs;  // reused by every compiled call (run_into)
  std::optional<ScopedCacheDir> cold_cache;
  double compile_call_s = 0;  // kiln::compile() itself (capture is lazy: it is cheap)
  if (o.backend == "compiled") {
    copts.backend = best_compile_backend();
    r.backend = "compiled(" + copts.backend + ")";
    reset();  // cold: no cached graphs from earlier compiles in this process
    // Cold means an empty code cache: compile into a private, fresh cache directory (the warm
    // compile below then hits it); the user's cache is left alone.
    cold_cache.emplace();
    auto t0 = std::chrono::steady_clock::now();
    compiled = m.compile(copts);
    compile_call_s = seconds_since(t0);
    call = [&] { compiled.run_into(m.inputs, outputs); };
  } else {
    r.backend = "eager";
    call = [&] { m.eager(m.inputs); };
  }
  {
    auto t0 = std::chrono::steady_clock::now();
    call();  // compiled: traces, compiles the graphs and runs them once
    r.first_call_s = seconds_since(t0);
  }

  int64_t total = o.seconds > 0 ? -1 : int64_t(o.warmup) + (o.iters > 0 ? o.iters : 50);
  auto start = std::chrono::steady_clock::now();
  int64_t done = 0;
  for (int i = 0; i < o.warmup; ++i) {
    call();
    if (o.progress) o.progress(++done, total, seconds_since(start));
  }
  std::vector<double> ms;
  AllocCounterFn counter = g_alloc_counter.load();
  int64_t allocs = 0;  // counted around each call only (not the bookkeeping or progress bar)
  auto timed_start = std::chrono::steady_clock::now();
  int want = o.iters > 0 ? o.iters : 50;
  for (int64_t i = 0;; ++i) {
    if (o.seconds > 0 ? (i > 0 && seconds_since(timed_start) >= o.seconds) : i >= want) break;
    int64_t a0 = counter ? counter() : 0;
    auto t0 = std::chrono::steady_clock::now();
    call();
    auto t1 = std::chrono::steady_clock::now();
    if (counter) allocs += counter() - a0;
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    if (o.progress) o.progress(++done, total, seconds_since(start));
  }
  if (counter) r.steady_state_allocs_per_call = double(allocs) / double(ms.size());

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

  if (o.backend == "compiled") {
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
    int64_t arena = 0;
    bool planned = false;
    for (const ExplainGraph& g : rep.graphs) {
      hit = hit && g.cache_hit;
      if (g.arena_bytes >= 0) arena += g.arena_bytes, planned = true;
    }
    r.warm_compile_cache_hit = hit;
    if (planned) r.arena_bytes = arena;
    cold_cache.reset();
  }

  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  r.peak_rss_bytes = int64_t(ru.ru_maxrss) * 1024;  // Linux reports KiB
  return r;
}

}  // namespace kiln
