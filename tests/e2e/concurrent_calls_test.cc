// One compiled model called from several threads at once (Note [Concurrent calls] in
// capture/compile.cc, Note [Execution contexts] in runtime/executable.cc): every result equals
// the eager forward of its own inputs, on both backends; the runs really overlap (two calls
// are inside the compiled graph at the same moment); a recompile for a new shape happens while
// other threads replay, and every shape is traced once; a function that calls itself while it
// is being traced gets an error instead of a deadlock.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "capture/compile.h"
#include "compiler/compile.h"
#include "ir/graph.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "nn/compile.h"
#include "nn/models/zoo.h"
#include "ops/api.h"
#include "runtime/executable.h"
#include "../support/compare.h"

using namespace kiln;

namespace {

// Empty when got matches want: same shape and dtype, and |got - want| <= rtol * max(1, max
// |want|) per element, a NaN or infinity on one side only failing (tests/support/compare.h).
std::string mismatch(const Tensor& got, const Tensor& want, double rtol) {
  double scale = 1.0;
  if (got.sizes() == want.sizes())
    for (double v : want.to_vector<double>()) scale = std::max(scale, std::fabs(v));
  ::testing::AssertionResult r = test::close(got, want, test::Tolerance::of_scale(scale, rtol, 0.0));
  return r ? std::string() : std::string(r.message());
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector<double>()) m = std::max(m, std::fabs(v));
  return m;
}

// The eager backend interprets the same eager kernels; the compiler fuses and reorders sums.
double rtol_for(const std::string& backend) { return backend == "eager" ? 1e-5 : 2e-4; }

TensorList random_like(const TensorList& like, uint64_t seed, int64_t batch = -1) {
  Generator g(seed);
  TensorList out;
  for (const Tensor& t : like) {
    Dims sizes = t.sizes();
    if (batch > 0) sizes[0] = batch;
    out.push_back(is_floating(t.dtype()) ? Tensor::randn(sizes, g, t.dtype()) : t);
  }
  return out;
}

struct Case {
  TensorList inputs;
  TensorList expected;  // the module's eager forward, computed before any thread starts
};

// `threads` threads, released together, each calling f on its own cases `rounds` times;
// returns one line per wrong result (empty: all correct).
std::vector<std::string> call_from_threads(const CompiledFunction& f,
                                           const std::vector<std::vector<Case>>& cases,
                                           int rounds, double rtol, bool use_run_into) {
  const int threads = int(cases.size());
  std::atomic<int> ready{0};
  auto errors = std::vector<std::vector<std::string>>(size_t(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < threads) std::this_thread::yield();
      TensorList out;
      for (int r = 0; r < rounds; ++r)
        for (size_t c = 0; c < cases[size_t(t)].size(); ++c) {
          const Case& k = cases[size_t(t)][c];
          TensorList got;
          try {
            if (use_run_into && (r + int(c)) % 2 == 1) {
              f.run_into(k.inputs, out);
              got = out;
            } else {
              got = f(k.inputs);
            }
          } catch (const std::exception& e) {
            errors[size_t(t)].push_back("thread " + std::to_string(t) + ": " + e.what());
            return;
          }
          if (got.size() != k.expected.size()) {
            errors[size_t(t)].push_back("thread " + std::to_string(t) + ": wrong output count");
            continue;
          }
          for (size_t i = 0; i < got.size(); ++i) {
            std::string m = mismatch(got[i], k.expected[i], rtol);
            if (!m.empty())
              errors[size_t(t)].push_back("thread " + std::to_string(t) + " round " +
                                          std::to_string(r) + " case " + std::to_string(c) +
                                          " output " + std::to_string(i) + ": " + m);
          }
          // run_into's outputs are overwritten by the next call: compare before reusing them.
          if (use_run_into) out.clear();
        }
    });
  for (std::thread& th : pool) th.join();
  std::vector<std::string> all;
  for (auto& e : errors) all.insert(all.end(), e.begin(), e.end());
  return all;
}

std::vector<std::vector<Case>> make_cases(const nn::ZooModel& m, int threads, int per_thread,
                                          uint64_t seed0, double rtol) {
  auto cases = std::vector<std::vector<Case>>(size_t(threads));
  for (int t = 0; t < threads; ++t)
    for (int c = 0; c < per_thread; ++c) {
      Case k;
      k.inputs = random_like(m.inputs, seed0 + uint64_t(t * 100 + c));
      k.expected = m.module->call(k.inputs);
      cases[size_t(t)].push_back(std::move(k));
    }
  // The test can fail: a result computed from another thread's inputs is far outside the bound.
  const Case& a = cases[0][0];
  const Case& b = cases.size() > 1 ? cases[1][0] : cases[0][per_thread > 1 ? 1 : 0];
  for (size_t i = 0; i < a.expected.size(); ++i) {
    EXPECT_GT(max_abs(a.expected[i]), 0.0) << "reference output " << i << " is all zeros";
    EXPECT_FALSE(mismatch(a.expected[i], b.expected[i], 2 * rtol).empty())
        << "two different inputs give the same output " << i << ": a mix-up would pass";
  }
  return cases;
}

class ConcurrentCalls : public testing::TestWithParam<std::string> {
 protected:
  CompileOptions options() const {
    CompileOptions o;
    o.backend = GetParam();
    o.strict = true;  // no silent fallback to eager
    return o;
  }
};

}  // namespace

TEST_P(ConcurrentCalls, MlpFrom4And8Threads) {
  nn::ZooModel m = nn::make_zoo_model("mlp", 1, 3);
  CompiledFunction f = compile(m.module, options());
  const double rtol = rtol_for(GetParam());
  ASSERT_TRUE(mismatch(f(m.inputs)[0], m.module->call(m.inputs)[0], rtol).empty());
  for (int threads : {4, 8}) {
    auto cases = make_cases(m, threads, 4, 1000 * uint64_t(threads), rtol);
    std::vector<std::string> errors = call_from_threads(f, cases, 50, rtol, /*run_into=*/true);
    EXPECT_TRUE(errors.empty()) << threads << " threads: " << errors.size() << " wrong results; first: "
                                << (errors.empty() ? "" : errors[0]);
  }
  CompileStats s = f.stats();
  EXPECT_EQ(s.traces, 1) << "concurrent replays must not re-trace";
  EXPECT_EQ(s.entries, 1);
  EXPECT_EQ(s.calls, 1 + 4 * 4 * 50 + 8 * 4 * 50);
  EXPECT_EQ(s.compiled_calls, s.calls - 1);
}

TEST_P(ConcurrentCalls, Resnet18From4Threads) {
  nn::ZooModel m = nn::make_zoo_model("resnet18", 1, 5);
  CompiledFunction f = compile(m.module, options());
  const double rtol = rtol_for(GetParam());
  ASSERT_TRUE(mismatch(f(m.inputs)[0], m.module->call(m.inputs)[0], rtol).empty());
  auto cases = make_cases(m, 4, 2, 77, rtol);
  std::vector<std::string> errors = call_from_threads(f, cases, 2, rtol, /*run_into=*/true);
  EXPECT_TRUE(errors.empty()) << errors.size() << " wrong results; first: "
                              << (errors.empty() ? "" : errors[0]);
  EXPECT_EQ(f.stats().traces, 1);
}

// Threads call with batch 1 (compiled) while others bring batches 2..4 (two threads each, at
// the same moment): every result is right, and each new shape is traced exactly once.
TEST_P(ConcurrentCalls, RecompileWhileOthersReplay) {
  nn::ZooModel m = nn::make_zoo_model("mlp", 1, 9);
  CompiledFunction f = compile(m.module, options());
  const double rtol = rtol_for(GetParam());
  f(m.inputs);  // batch 1 compiled before the threads start
  const std::vector<int64_t> batches = {1, 1, 2, 2, 3, 3, 4, 4};
  auto cases = std::vector<std::vector<Case>>(batches.size());
  for (size_t t = 0; t < batches.size(); ++t)
    for (int c = 0; c < 3; ++c) {
      Case k;
      k.inputs = random_like(m.inputs, 500 + t * 10 + uint64_t(c), batches[t]);
      k.expected = m.module->call(k.inputs);
      ASSERT_GT(max_abs(k.expected[0]), 0.0);
      cases[t].push_back(std::move(k));
    }
  std::vector<std::string> errors = call_from_threads(f, cases, 20, rtol, /*run_into=*/false);
  EXPECT_TRUE(errors.empty()) << errors.size() << " wrong results; first: "
                              << (errors.empty() ? "" : errors[0]);
  CompileStats s = f.stats();
  EXPECT_EQ(s.traces, 4) << "batches 1..4: one trace each, however many threads missed at once";
  EXPECT_EQ(s.entries, 4);
  EXPECT_EQ(s.recompiles, 3);
  EXPECT_EQ(s.calls, 1 + int64_t(batches.size()) * 3 * 20);
  EXPECT_EQ(s.compiled_calls, s.calls - 4);
}

namespace {
// Makes two threads meet inside their first launch of a compiled graph: it returns only when
// both are there (or after 20 s). If calls were serialized, the second could not enter until
// the first left, and they would never meet.
struct Rendezvous final : Executable::LaunchTimer {
  std::atomic<int>* arrived = nullptr;
  std::atomic<bool>* met = nullptr;
  bool done = false;
  void launch_begin(const Executable::Launch&, const Executable::RunContext&) override {
    if (done) return;
    done = true;
    arrived->fetch_add(1);
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (arrived->load() < 2 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (arrived->load() >= 2) met->store(true);
  }
  void launch_end(const Executable::Launch&, const Executable::RunContext&) override {}
};

bool two_calls_overlap(const std::function<void()>& call) {
  std::atomic<int> arrived{0};
  std::atomic<bool> met{false};
  auto body = [&] {
    Rendezvous r;
    r.arrived = &arrived;
    r.met = &met;
    Executable::LaunchTimer* prev = Executable::set_launch_timer(&r);
    call();
    Executable::set_launch_timer(prev);
  };
  std::thread a(body), b(body);
  a.join();
  b.join();
  return met.load();
}
}  // namespace

// Through kiln::compile with the compiler: two calls are inside the graph at once.
TEST(ConcurrentCallsOverlap, CompiledFunctionRunsCallsInParallel) {
  nn::ZooModel m = nn::make_zoo_model("mlp", 1, 4);
  CompileOptions o;
  o.backend = "inductor";
  o.strict = true;
  CompiledFunction f = compile(m.module, o);
  f(m.inputs);
  TensorList a = random_like(m.inputs, 1), b = random_like(m.inputs, 2);
  std::atomic<int> which{0};
  std::vector<TensorList> got(2);
  EXPECT_TRUE(two_calls_overlap([&] {
    int i = which.fetch_add(1);
    got[size_t(i)] = f(i == 0 ? a : b);
  })) << "the second call could not enter the compiled graph while the first was inside it";
  TensorList wa = m.module->call(a), wb = m.module->call(b);
  bool a_first = mismatch(got[0][0], wa[0], 2e-4).empty();
  EXPECT_TRUE(mismatch(got[a_first ? 0 : 1][0], wa[0], 2e-4).empty());
  EXPECT_TRUE(mismatch(got[a_first ? 1 : 0][0], wb[0], 2e-4).empty());
}

// The Executable itself, on a graph with each kind of launch: an eager kernel (a convolution
// whose weight is an input, which oneDNN does not take), a oneDNN matmul of two activations
// (memory objects and scratch per context) and generated loop kernels. Runs overlap, results are
// right from 4 threads, and the context bound holds (callers past it wait).
TEST(ConcurrentCallsOverlap, ExecutableRunsOnContextsOfTheirOwn) {
  Graph g = parse_graph(R"(graph @contexts(%x: f32[2, 4, 8, 8], %w: f32[6, 4, 3, 3], %a: f32[2, 16, 32], %b: f32[2, 32, 8]) {
  %c = conv2d(%x, %w)
  %r = relu(%c)
  %m = matmul(%a, %b)
  %n = add(%m, %m)
  return %r, %n
})");
  auto compiled = compiler::compile(g, Device::cpu());
  const compiler::CompileReport& rep = compiled->report();
  ASSERT_GE(rep.eager_launches, 1) << compiled->summary();
  ASSERT_GE(rep.library_launches, 1) << compiled->summary();
  ASSERT_GE(rep.loop_kernels, 1) << compiled->summary();
  Executable& exe = compiled->executable();
  EXPECT_EQ(exe.num_contexts(), 1) << "the first context is made at compile time";

  auto inputs_for = [&](uint64_t seed) {
    Generator gen(seed);
    TensorList in;
    for (ValueId v : g.inputs) in.push_back(Tensor::randn(to_dims(g.type(v).shape, "input"), gen));
    return in;
  };
  std::vector<TensorList> in, want;
  for (uint64_t k = 0; k < 16; ++k) {
    in.push_back(inputs_for(k + 1));
    want.push_back(run(g, in.back()));  // the interpreter
  }
  ASSERT_FALSE(mismatch(want[0][0], want[1][0], 1e-2).empty());
  ASSERT_FALSE(mismatch(want[0][1], want[1][1], 1e-2).empty());

  std::atomic<int> wrong{0};
  auto hammer = [&](int threads) {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        for (int r = 0; r < 30; ++r) {
          size_t k = size_t((t * 7 + r) % 16);
          TensorList got = exe.run(in[k]);
          for (size_t i = 0; i < got.size(); ++i)
            if (!mismatch(got[i], want[k][i], 2e-4).empty()) wrong.fetch_add(1);
        }
      });
    for (std::thread& th : pool) th.join();
  };

  EXPECT_TRUE(two_calls_overlap([&] { exe.run(in[0]); }))
      << "the second run could not start while the first was inside the launch list";
  EXPECT_GE(exe.num_contexts(), 2);
  hammer(4);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_LE(exe.num_contexts(), Executable::kDefaultMaxContexts);

  // A bound of 1: four threads take turns on the one context, and are still right.
  auto one = compiler::compile(g, Device::cpu());
  one->executable().set_max_contexts(1);
  Executable& single = one->executable();
  std::vector<std::thread> pool;
  for (int t = 0; t < 4; ++t)
    pool.emplace_back([&, t] {
      for (int r = 0; r < 20; ++r) {
        size_t k = size_t((t * 5 + r) % 16);
        TensorList got = single.run(in[k]);
        for (size_t i = 0; i < got.size(); ++i)
          if (!mismatch(got[i], want[k][i], 2e-4).empty()) wrong.fetch_add(1);
      }
    });
  for (std::thread& th : pool) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(single.num_contexts(), 1);
}

// A compiled function whose traced code calls the compiled function again: an error naming the
// problem, on both call paths, for a first trace and for the replay of an entry with a graph
// break (which re-runs the host code under capture). Run on a watchdog thread: a deadlock fails
// the test with a message instead of hanging it.
TEST_P(ConcurrentCalls, CallingItselfWhileTracingIsAnError) {
  auto within_10s = [](const std::function<void()>& body) {
    auto done = std::make_shared<std::promise<void>>();
    std::future<void> fut = done->get_future();
    std::thread([body, done] {
      body();
      done->set_value();
    }).detach();
    if (fut.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      std::fprintf(stderr, "deadlock: a compiled function calling itself while tracing hung\n");
      std::fflush(stderr);
      std::_Exit(1);
    }
  };
  Generator gen(8);
  Tensor x = Tensor::randn({3, 5}, gen);
  CompileOptions o = options();

  CompiledFunction f;
  f = compile([&f](const TensorList& in) { return f({relu(in[0])}); }, o);
  within_10s([&] {
    try {
      f({x});
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("called from inside its own trace"), std::string::npos)
          << e.what();
    }
    TensorList out;
    EXPECT_THROW(f.run_into({x}, out), Error);
  });

  // Recursion only on the second call, which replays an entry with a graph break.
  int calls = 0;
  CompiledFunction h;
  h = compile(
      [&h, &calls](const TensorList& in) -> TensorList {
        ++calls;
        double s = sum(in[0]).item();  // a graph break: replays re-run this code
        if (calls >= 2) return h(in);
        return {relu(in[0]) * (s > 0 ? 2.0 : 3.0)};
      },
      o);
  within_10s([&] {
    TensorList first = h({x});
    EXPECT_TRUE(mismatch(first[0], relu(x) * (sum(x).item() > 0 ? 2.0 : 3.0), 1e-5).empty());
    EXPECT_THROW(h({x}), Error);
  });

  // A function that does not call itself still works after the errors.
  CompiledFunction ok = compile([](const TensorList& in) { return TensorList{relu(in[0])}; }, o);
  EXPECT_TRUE(mismatch(ok({x})[0], relu(x), 1e-6).empty());
}

INSTANTIATE_TEST_SUITE_P(Backends, ConcurrentCalls, testing::Values("eager", "inductor"),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });
