// Capture overhead in steady state: guard checks and the cost of a compiled call around the
// work itself. Run: build/bench/kiln_capture_bench --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include "capture/compile.h"
#include "nn/compile.h"
#include "capture/guards.h"
#include "ops/api.h"
#include "nn/models/zoo.h"

using namespace kiln;

static TensorList eight_inputs() {
  Generator g(1);
  TensorList in;
  for (int i = 0; i < 8; ++i) in.push_back(Tensor::randn({1, 3, 8 + i, 8}, g));
  return in;
}

// Input guards for 8 inputs: count, dtype, device, sizes, strides.
static void BM_InputGuards8(benchmark::State& state) {
  TensorList in = eight_inputs();
  InputGuards guards(in);
  for (auto _ : state) benchmark::DoNotOptimize(guards.check(in));
}
BENCHMARK(BM_InputGuards8);

// Parameter guards of resnet50 (all parameters and buffers) with no mutation in between: the
// global mutation epoch makes this one comparison.
static void BM_ParamGuardsResnet50(benchmark::State& state) {
  nn::ZooModel m = nn::make_zoo_model("resnet50");
  ParamGuards guards;
  for (auto& [n, t] : m.module->named_parameters()) guards.add(t, n);
  for (auto& [n, t] : m.module->named_buffers()) guards.add(t, n);
  state.counters["params"] = double(guards.size());
  for (auto _ : state) benchmark::DoNotOptimize(guards.check());
}
BENCHMARK(BM_ParamGuardsResnet50);

// A whole-graph compiled call (guards + replay through the interpreter) vs calling the
// eager op directly, on a tiny input so that overhead dominates.
static void BM_EagerTinyCall(benchmark::State& state) {
  Generator g(2);
  TensorList in{Tensor::randn({4}, g)};
  for (auto _ : state) benchmark::DoNotOptimize(relu(in[0]));
}
BENCHMARK(BM_EagerTinyCall);

static void BM_CompiledTinyCall(benchmark::State& state) {
  Generator g(2);
  TensorList in{Tensor::randn({4}, g)};
  CompiledFunction f = compile([](const TensorList& x) { return TensorList{relu(x[0])}; });
  f(in);
  for (auto _ : state) benchmark::DoNotOptimize(f(in));
}
BENCHMARK(BM_CompiledTinyCall);

// A compiled zoo module in steady state (default backend: the compiler), with and without
// check_host_values (which re-runs the module's host code under a dry trace on every call):
// the per-call cost of the check is the difference. Arg 0: mlp, 1: resnet18, 2: bert_base.
static const char* kZoo[] = {"mlp", "resnet18", "bert_base"};
static void compiled_zoo_call(benchmark::State& state, bool check) {
  nn::ZooModel m = nn::make_zoo_model(kZoo[state.range(0)], 1, 3);
  CompileOptions o;
  o.check_host_values = check;
  CompiledFunction f = compile(m.module, o);
  TensorList out;
  f.run_into(m.inputs, out);
  f.run_into(m.inputs, out);
  for (auto _ : state) {
    f.run_into(m.inputs, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(kZoo[state.range(0)]);
  state.counters["host_value_checks"] = double(f.stats().host_value_checks);
}
static void BM_CompiledZooCall(benchmark::State& state) { compiled_zoo_call(state, false); }
static void BM_CompiledZooCallCheckHostValues(benchmark::State& state) { compiled_zoo_call(state, true); }
BENCHMARK(BM_CompiledZooCall)->DenseRange(0, 2)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CompiledZooCallCheckHostValues)->DenseRange(0, 2)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
