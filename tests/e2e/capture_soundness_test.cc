// Capture never returns a stale answer (#16): module parameters reassigned after compile, host
// scalars and tensors reached through host pointers (check_host_values / KILN_CHECK_CAPTURE),
// what explain says is baked in, and a randomized test that mutates inputs, aliasing,
// parameters, modes and host values between calls and compares every result with eager. Every
// case runs on both backends: "eager" (the interpreter) and "inductor" (the compiler).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>

#include "capture/compile.h"
#include "nn/compile.h"
#include "nn/layers.h"
#include "ops/api.h"
#include "../support/compare.h"

using namespace kiln;

namespace {

// |got - want| <= 1e-5 * (1 + |want|) per element; a NaN or infinity on one side only, or a
// shape or dtype difference, fails (tests/support/compare.h).
const test::Tolerance kTol = test::Tolerance::rel(1e-5, 1e-5);
#define EXPECT_SAME(a, b) EXPECT_TRUE(test::close(a, b, kTol))

std::string last_reason(const CompiledFunction& f) {
  auto r = f.report();
  return r.recompiles.empty() ? "" : r.recompiles.back();
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

class Soundness : public testing::TestWithParam<std::string> {
 protected:
  CompileOptions opts(bool check_host_values = false) const {
    CompileOptions o;
    o.backend = GetParam();
    o.strict = true;  // a compile or run failure must fail the test, not fall back quietly
    o.check_host_values = check_host_values;
    o.cache_size_limit = 64;
    return o;
  }
};

// A two-layer module whose parameters are ParamRefs (nn::Linear's weight and bias).
std::shared_ptr<nn::Sequential> small_mlp(Generator& g) {
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(6, 8, true, g));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::Linear>(8, 3, true, g));
  m->eval();
  return m;
}

nn::Linear& layer(const std::shared_ptr<nn::Sequential>& m, const char* name) {
  return dynamic_cast<nn::Linear&>(*m->submodule(name));
}

}  // namespace

// module.fc->weight = other after compile: the registered tensor is replaced, the compiled
// entry that froze the old one no longer applies, and the call recompiles with the reason.
TEST_P(Soundness, ReassignedModuleParameterRecompiles) {
  Generator g(11);
  auto m = small_mlp(g);
  CompiledFunction f = compile(m, opts());
  Tensor x = Tensor::randn({4, 6}, g);
  EXPECT_SAME(f({x})[0], m->call({x})[0]);
  Tensor w = Tensor::randn({8, 6}, g);
  layer(m, "0").weight = w;
  EXPECT_EQ(m->parameter("0.weight").impl(), w.impl()) << "the registry follows the member";
  Tensor fresh = m->call({x})[0];
  EXPECT_SAME(f({x})[0], fresh);
  EXPECT_EQ(f.stats().recompiles, 1);
  EXPECT_EQ(last_reason(f), "parameter or buffer '0.weight' was reassigned (a different tensor)");
  // The new entry names the new tensor after the module path, and replays without a trace.
  EXPECT_SAME(f({x})[0], fresh);
  EXPECT_EQ(f.stats().traces, 2);
  bool named = false;
  for (const ExplainGraph& gr : f.report().graphs) named |= contains(gr.ir, "0.weight");
  EXPECT_TRUE(named) << f.report().text();
  // Reassigning a bias to a tensor of another value, then back to the traced tensor.
  Tensor b_old = layer(m, "2").bias;
  layer(m, "2").bias = Tensor::randn({3}, g);
  EXPECT_SAME(f({x})[0], m->call({x})[0]);
  layer(m, "2").bias = b_old;
  EXPECT_SAME(f({x})[0], m->call({x})[0]);
}

// A copy of a ParamRef is unbound: assigning to it leaves the module alone.
TEST(ParamRef, CopiesAreUnbound) {
  Generator g(12);
  nn::Linear fc(3, 2, true, g);
  Tensor registered = fc.parameter("weight");
  nn::ParamRef copy = fc.weight;
  copy = Tensor::randn({2, 3}, g);
  EXPECT_EQ(fc.weight.impl(), registered.impl());
  EXPECT_EQ(fc.parameter("weight").impl(), registered.impl());
  fc.bias = Tensor();  // removing the bias
  EXPECT_EQ(fc.named_parameters().size(), 1u);
}

// A host scalar captured by reference becomes a graph constant. Without check_host_values the
// rule is that it is frozen (and explain says so, with the call site); with it, a changed value
// recompiles.
TEST_P(Soundness, HostScalarByReference) {
  Generator g(13);
  Tensor x = Tensor::randn({3, 5}, g);
  double scale = 2.0;
  auto fn = [&](const TensorList& in) { return TensorList{mul(in[0], scale)}; };
  CompiledFunction frozen = compile(fn, opts());
  EXPECT_SAME(frozen({x})[0], x * 2.0);
  ExplainReport r = frozen.report();
  ASSERT_EQ(r.graphs.size(), 1u);
  ASSERT_FALSE(r.graphs[0].baked.empty());
  EXPECT_TRUE(contains(r.graphs[0].baked[0], "mul at capture_soundness_test.cc:"))
      << r.graphs[0].baked[0];
  EXPECT_TRUE(contains(r.graphs[0].baked[0], "scalar 2 is part of the graph")) << r.graphs[0].baked[0];
  EXPECT_TRUE(contains(r.text(), "baked: mul at capture_soundness_test.cc:")) << r.text();
  scale = 3.0;
  EXPECT_SAME(frozen({x})[0], x * 2.0) << "documented rule: without check_host_values the scalar is frozen";

  scale = 2.0;
  CompiledFunction checked = compile(fn, opts(true));
  EXPECT_SAME(checked({x})[0], x * 2.0);
  EXPECT_SAME(checked({x})[0], x * 2.0);
  EXPECT_EQ(checked.stats().traces, 1);
  EXPECT_EQ(checked.stats().host_value_checks, 1);
  scale = 3.0;
  EXPECT_SAME(checked({x})[0], x * 3.0);
  EXPECT_EQ(checked.stats().recompiles, 1);
  EXPECT_EQ(last_reason(checked),
            "check_host_values: a constant the host code passes to an op changed value");
  scale = 2.0;  // the first entry again: checked and replayed, no trace
  EXPECT_SAME(checked({x})[0], x * 2.0);
  EXPECT_EQ(checked.stats().traces, 2);
}

// A tensor reached through a host pointer is frozen by identity: pointing at another tensor is
// invisible to the guards unless check_host_values is on.
TEST_P(Soundness, TensorReachedThroughHostPointer) {
  Generator g(14);
  Tensor x = Tensor::randn({4, 16}, g), a = Tensor::randn({4, 16}, g), b = Tensor::randn({4, 16}, g);
  const Tensor* p = &a;
  auto fn = [&](const TensorList& in) { return TensorList{in[0] + *p}; };
  CompiledFunction frozen = compile(fn, opts());
  EXPECT_SAME(frozen({x})[0], x + a);
  ExplainReport r = frozen.report();
  ASSERT_EQ(r.graphs.size(), 1u);
  ASSERT_EQ(r.graphs[0].baked.size(), 1u) << r.text();
  EXPECT_TRUE(contains(r.graphs[0].baked[0], "reached from host code is frozen")) << r.graphs[0].baked[0];

  CompiledFunction checked = compile(fn, opts(true));
  EXPECT_SAME(checked({x})[0], x + a);
  p = &b;
  EXPECT_SAME(checked({x})[0], x + b);
  EXPECT_TRUE(contains(last_reason(checked), "check_host_values: a tensor the host code reads is a different tensor now"))
      << last_reason(checked);
  // In-place writes to the tensor reached are seen by the version guard (no check needed).
  b.copy_(Tensor::randn({4, 16}, g));
  EXPECT_SAME(checked({x})[0], x + b);
}

// Host control flow on a host value (not on a tensor): with check_host_values, the other branch
// records other ops and recompiles.
TEST_P(Soundness, HostBranchOnHostFlag) {
  Generator g(15);
  Tensor x = Tensor::randn({2, 7}, g);
  bool use_relu = true;
  auto fn = [&](const TensorList& in) { return TensorList{use_relu ? relu(in[0]) : sigmoid(in[0])}; };
  CompiledFunction f = compile(fn, opts(true));
  EXPECT_SAME(f({x})[0], relu(x));
  use_relu = false;
  EXPECT_SAME(f({x})[0], sigmoid(x));
  EXPECT_TRUE(contains(last_reason(f), "the host code now records different ops")) << last_reason(f);
}

// A whole-graph entry whose host code starts reading tensor data (a graph break) under the
// check: the dry trace stops at the read and the call retraces into a segmented entry.
TEST_P(Soundness, HostCodeThatStartsReadingDataRetraces) {
  Generator g(16);
  Tensor x = Tensor::randn({5}, g);
  bool inspect = false;
  auto fn = [&](const TensorList& in) {
    Tensor y = in[0] * 2.0;
    if (inspect && sum(y).item() > 1e9) return TensorList{y};
    return TensorList{y + 1.0};
  };
  CompiledFunction f = compile(fn, opts(true));
  EXPECT_SAME(f({x})[0], x * 2.0 + 1.0);
  inspect = true;
  EXPECT_SAME(f({x})[0], x * 2.0 + 1.0);
  EXPECT_TRUE(contains(last_reason(f), "the host code now reads tensor data")) << last_reason(f);
  EXPECT_SAME(f({x})[0], x * 2.0 + 1.0);
}

// KILN_CHECK_CAPTURE=1 turns the check on for functions compiled while it is set.
TEST_P(Soundness, EnvironmentTurnsTheCheckOn) {
  Generator g(17);
  Tensor x = Tensor::randn({6}, g);
  double bias = 0.5;
  ::setenv("KILN_CHECK_CAPTURE", "1", 1);
  CompiledFunction f = compile([&](const TensorList& in) { return TensorList{in[0] + bias}; }, opts());
  ::unsetenv("KILN_CHECK_CAPTURE");
  EXPECT_SAME(f({x})[0], x + 0.5);
  bias = -1.5;
  EXPECT_SAME(f({x})[0], x - 1.5);
  EXPECT_EQ(f.stats().recompiles, 1);
}

// Randomized: between calls, mutate the input shape, aliasing, a parameter in place, a
// parameter by reassignment, the train/eval mode, a host scalar and a host-pointer tensor, and
// compare every result with eager.
namespace {
class Mutable : public nn::UnaryModule {
 public:
  explicit Mutable(Generator& g) : nn::UnaryModule("Mutable") {
    fc = register_module("fc", std::make_shared<nn::Linear>(6, 6, true, g));
    gain = register_parameter("gain", Tensor::randn({6}, g));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = fc->forward(x) * gain;
    return is_training() ? h * 0.5 : relu(h);
  }
  std::shared_ptr<nn::Linear> fc;
  nn::ParamRef gain;
};
}  // namespace

TEST_P(Soundness, RandomMutationsAlwaysMatchEager) {
  Generator g(18);
  auto m = std::make_shared<Mutable>(g);
  double scale = 1.0;
  Tensor offsets[2] = {Tensor::randn({6}, g), Tensor::randn({6}, g)};
  const Tensor* offset = &offsets[0];
  auto host = [&](const TensorList& in) {
    Tensor y = m->forward(in[0]) * scale + *offset;
    return TensorList{y - m->forward(in[1])};
  };
  CompiledFunction f = compile(host, opts(true));
  std::mt19937 rng(18);
  Tensor xs[2] = {Tensor::randn({3, 6}, g), Tensor::randn({5, 6}, g)};
  Tensor ys[2] = {Tensor::randn({3, 6}, g), Tensor::randn({5, 6}, g)};
  // The compiler backend builds C++ per new graph: fewer rounds keep the test short.
  const int rounds = GetParam() == "eager" ? 60 : 10;
  for (int i = 0; i < rounds; ++i) {
    int shape = int(rng() % 2);
    switch (rng() % 7) {
      case 0: break;                                                     // nothing changes
      case 1: m->fc->weight.copy_(Tensor::randn({6, 6}, g)); break;      // in place
      case 2: m->fc->bias = Tensor::randn({6}, g); break;                // reassigned
      case 3: m->gain = Tensor::randn({6}, g); break;                    // reassigned
      case 4: m->train(rng() % 2 == 0); break;                           // mode
      case 5: scale = double(int(rng() % 3)) - 0.5; break;               // host scalar
      case 6: offset = &offsets[rng() % 2]; break;                       // host pointer
    }
    bool aliased = rng() % 3 == 0;
    Tensor a = xs[shape], b = aliased ? xs[shape] : ys[shape];
    Tensor expected = host({a, b})[0];
    Tensor got = f({a, b})[0];
    ASSERT_TRUE(test::close(got, expected, kTol)) << "round " << i << ": " << f.report().text();
  }
  EXPECT_EQ(f.stats().fallbacks_cache_limit, 0);
  EXPECT_EQ(f.stats().fallbacks_compile_error + f.stats().fallbacks_runtime_error, 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, Soundness, testing::Values("eager", "inductor"),
                         [](const auto& info) { return info.param; });
