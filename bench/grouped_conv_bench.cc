// Kiln's own convolution kernel (src/kernels/grouped_conv.cc) called alone on one thread:
// image stems (Note [Image stems on output-channel vectors]) and ResNeXt's grouped 3x3
// convolutions (Note [Grouped convolution on channel lanes]), with the path each takes.
// Run: build/bench/kiln_grouped_conv_bench --benchmark_repetitions=3 --benchmark_min_time=0.3
// Counters: GFLOP/s of the multiply-adds. Results in docs/benchmarks.md.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "kernels/grouped_conv.h"
#include "kernels/onednn_node.h"

using namespace kiln;
using kernels::GroupedConv;
using kernels::GroupedConvEpilogue;
using kernels::GroupedConvShape;
using Act = GroupedConvEpilogue::Act;

namespace {

void run_conv(benchmark::State& state, GroupedConvShape s, Act act) {
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(size_t(s.n * s.c * s.h * s.w)), w(size_t(s.o * (s.c / s.groups) * s.kh * s.kw)),
      b(size_t(s.o)), y(size_t(s.n * s.o * s.oh * s.ow));
  for (float& v : x) v = u(gen);
  for (float& v : w) v = u(gen);
  for (float& v : b) v = u(gen);
  GroupedConvEpilogue e;
  e.act = act, e.lo = 0.0f, e.hi = 6.0f;
  GroupedConv conv(s, e, w.data(), b.data());
  kernels::ScopedCpuThreads one(1);
  const size_t scratch = size_t(conv.scratch_bytes(1) + 64);
  std::unique_ptr<void, decltype(&std::free)> buf(std::aligned_alloc(64, (scratch + 63) / 64 * 64),
                                                  &std::free);
  for (auto _ : state) {
    conv.run(x.data(), nullptr, y.data(), buf.get());
    benchmark::DoNotOptimize(y.data());
  }
  const double flop = 2.0 * double(s.n * s.o * s.oh * s.ow * (s.c / s.groups) * s.kh * s.kw);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flop * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(conv.on_stem_path() ? "stem" : conv.on_channel_lanes() ? "lanes" : "bands");
}

// n, c, h, w, o, oh, ow, groups, kh, kw, pad_top, pad_left, stride_h, stride_w, x_nhwc, y_nhwc
GroupedConvShape stem(int64_t o, int64_t k, int64_t stride) {
  const int64_t pad = k / 2, out = (224 + 2 * pad - k) / stride + 1;
  return {1, 3, 224, 224, o, out, out, 1, k, k, pad, pad, stride, stride, false, true};
}

void BM_StemEfficientNetV2(benchmark::State& st) { run_conv(st, stem(24, 3, 2), Act::Silu); }
void BM_StemEfficientNetB0(benchmark::State& st) { run_conv(st, stem(32, 3, 2), Act::Silu); }
void BM_StemMobileNetV2(benchmark::State& st) { run_conv(st, stem(32, 3, 2), Act::Clamp); }
void BM_StemMobileNetV3(benchmark::State& st) { run_conv(st, stem(16, 3, 2), Act::None); }
void BM_StemResNet7x7(benchmark::State& st) { run_conv(st, stem(64, 7, 2), Act::Relu); }
void BM_ResNeXtLayer1(benchmark::State& st) {
  run_conv(st, {1, 128, 56, 56, 128, 56, 56, 32, 3, 3, 1, 1, 1, 1, true, true}, Act::Relu);
}
BENCHMARK(BM_StemEfficientNetV2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StemEfficientNetB0)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StemMobileNetV2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StemMobileNetV3)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StemResNet7x7)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ResNeXtLayer1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
