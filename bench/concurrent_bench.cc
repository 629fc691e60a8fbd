// Throughput of one compiled model called from 1, 2 and 4 threads at once (Note [Concurrent
// calls] in capture/compile.cc): calls/s over all threads (items_per_second), wall time. Each
// thread calls the same CompiledFunction with inputs of its own through run_into (no allocation
// per call). `Serialized` runs the same calls behind one mutex, as every call was before #16: the
// ratio between the two at 2 threads is what concurrent calls bought.
// Run with one intra-op thread, so that caller threads are the only parallelism:
//   OMP_NUM_THREADS=1 build/bench/kiln_concurrent_bench --benchmark_repetitions=5 \
//       --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "capture/compile.h"
#include "nn/compile.h"
#include "nn/models/zoo.h"

using namespace kiln;

namespace {

struct Compiled {
  nn::ZooModel model;
  CompiledFunction f;
};

Compiled& compiled(const std::string& name) {
  static std::mutex mu;
  static std::vector<std::pair<std::string, std::unique_ptr<Compiled>>> all;
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [n, c] : all)
    if (n == name) return *c;
  auto c = std::make_unique<Compiled>();
  c->model = nn::make_zoo_model(name, 1, 1);
  CompileOptions o;
  o.backend = "inductor";
  o.strict = true;
  c->f = compile(c->model.module, o);
  c->f(c->model.inputs);  // traced and compiled before any timing
  all.emplace_back(name, std::move(c));
  return *all.back().second;
}

void run_calls(benchmark::State& state, const std::string& model, bool serialized) {
  static std::mutex one_at_a_time;
  Compiled& c = compiled(model);
  Generator g(100 + uint64_t(state.thread_index()));
  TensorList in;
  for (const Tensor& t : c.model.inputs)
    in.push_back(is_floating(t.dtype()) ? Tensor::randn(t.sizes(), g, t.dtype()) : t);
  TensorList out;
  c.f.run_into(in, out);  // this thread's outputs, reused from here on
  for (auto _ : state) {
    if (serialized) {
      std::lock_guard<std::mutex> lock(one_at_a_time);
      c.f.run_into(in, out);
    } else {
      c.f.run_into(in, out);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations());  // summed over threads: calls/s of the process
  const char* omp = std::getenv("OMP_NUM_THREADS");
  state.counters["omp_threads"] =  // 0: not set (OpenMP's default)
      benchmark::Counter(omp ? std::atof(omp) : 0, benchmark::Counter::kAvgThreads);
}

void BM_Mlp(benchmark::State& s) { run_calls(s, "mlp", false); }
void BM_MlpSerialized(benchmark::State& s) { run_calls(s, "mlp", true); }
void BM_Resnet18(benchmark::State& s) { run_calls(s, "resnet18", false); }
void BM_Resnet18Serialized(benchmark::State& s) { run_calls(s, "resnet18", true); }

}  // namespace

BENCHMARK(BM_Mlp)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();
BENCHMARK(BM_MlpSerialized)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();
BENCHMARK(BM_Resnet18)->Threads(1)->Threads(2)->Threads(4)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_Resnet18Serialized)->Threads(1)->Threads(2)->Threads(4)->UseRealTime()->MinTime(2.0);

BENCHMARK_MAIN();
