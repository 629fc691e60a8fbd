// kiln::compile: capture equals eager, guards recompile, graph breaks, fallback, explain, reset.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "../support/compare.h"
#include "compiler/backend.h"
#include "capture/compile.h"
#include "nn/compile.h"
#include "capture/guards.h"
#include "ops/api.h"
#include "ir/graph.h"
#include "nn/layers.h"

using namespace kiln;

namespace {

// |a - b| <= tol * (1 + |b|) element by element (tests/support/compare.h).
void expect_close(const Tensor& a, const Tensor& b, double tol = 1e-5) {
  ASSERT_EQ(a.dtype(), b.dtype());
  ASSERT_TRUE(kiln::test::close(a, b, kiln::test::Tolerance::rel(tol, tol)));
}

// A small function using several op families and a parameter.
struct Net {
  Tensor w, b;
  explicit Net(Generator& g) : w(Tensor::randn({8, 6}, g)), b(Tensor::randn({8}, g)) {}
  TensorList operator()(const TensorList& in) const {
    Tensor h = relu(linear(in[0], w, b));
    Tensor s = softmax(h * 0.5, -1);
    return {s + sigmoid(h)};
  }
};

std::string reason_of_last_recompile(const CompiledFunction& f) {
  auto r = f.report();
  return r.recompiles.empty() ? "" : r.recompiles.back();
}

}  // namespace

TEST(Capture, MatchesEagerAndReplaysWithoutRetracing) {
  Generator g(1);
  Net net(g);
  CompiledFunction f = compile([&](const TensorList& in) { return net(in); });
  for (int i = 0; i < 3; ++i) {
    Tensor x = Tensor::randn({4, 6}, g);
    expect_close(f({x})[0], net({x})[0]);
  }
  CompileStats s = f.stats();
  EXPECT_EQ(s.calls, 3);
  EXPECT_EQ(s.traces, 1);
  EXPECT_EQ(s.compiled_calls, 2);
  EXPECT_EQ(s.graphs_compiled, 1);
  EXPECT_EQ(s.recompiles, 0);
  auto r = f.report();
  ASSERT_EQ(r.graphs.size(), 1u);
  EXPECT_EQ(r.graphs[0].num_inputs, 1);
  EXPECT_GE(r.graphs[0].num_params, 2);  // w and b frozen
  EXPECT_NE(std::find(r.graphs[0].ops.begin(), r.graphs[0].ops.end(), "linear"),
            r.graphs[0].ops.end());
}

TEST(Capture, ShapeChangeRecompilesWithReason) {
  Generator g(2);
  Net net(g);
  CompiledFunction f = compile([&](const TensorList& in) { return net(in); });
  Tensor a = Tensor::randn({1, 6}, g), b = Tensor::randn({4, 6}, g);
  f({a});
  expect_close(f({b})[0], net({b})[0]);
  EXPECT_EQ(f.stats().recompiles, 1);
  EXPECT_EQ(reason_of_last_recompile(f), "input 0: dim 0 expected 1, got 4");
  // Both entries are cached now: no further traces.
  f({a});
  f({b});
  EXPECT_EQ(f.stats().traces, 2);
}

// One tensor passed twice is one graph input; the entry must not serve distinct tensors (and
// the reverse): f(x, x) then f(a, b) recompiles and returns a - b (#16).
TEST(Capture, AliasedInputsAreGuarded) {
  CompiledFunction f = compile([](const TensorList& in) { return TensorList{in[0] - in[1]}; });
  Generator g(5);
  Tensor x = Tensor::randn({3, 4}, g), a = Tensor::randn({3, 4}, g), b = Tensor::randn({3, 4}, g);
  expect_close(f({x, x})[0], x - x);
  expect_close(f({a, b})[0], a - b);
  EXPECT_EQ(f.stats().recompiles, 1);
  EXPECT_EQ(reason_of_last_recompile(f), "input 1: traced as the same tensor as input 0, got a distinct one");
  expect_close(f({b, b})[0], b - b);  // the aliased entry again: cached, no trace
  expect_close(f({b, a})[0], b - a);
  EXPECT_EQ(f.stats().traces, 2);
  // Traced with distinct tensors first, then called with one tensor twice.
  CompiledFunction h = compile([](const TensorList& in) { return TensorList{in[0] * 2.0 - in[1]}; });
  expect_close(h({a, b})[0], a * 2.0 - b);
  expect_close(h({x, x})[0], x * 2.0 - x);
  EXPECT_EQ(reason_of_last_recompile(h), "input 1: the same tensor as input 0, traced with distinct tensors");
}

// train()/eval() after compile: the mode is read by the traced code and guarded (#16).
class ModeScaled : public nn::UnaryModule {
 public:
  ModeScaled() { inner = register_module("inner", std::make_shared<nn::Identity>()); }
  Tensor forward(const Tensor& x) override { return x * (is_training() ? 2.0 : 3.0); }
  std::shared_ptr<nn::Identity> inner;
};

TEST(Capture, ModuleModeIsGuarded) {
  auto m = std::make_shared<ModeScaled>();
  m->eval();
  CompiledFunction f = compile(m);
  Generator g(6);
  Tensor x = Tensor::randn({2, 5}, g);
  expect_close(f({x})[0], x * 3.0);
  expect_close(f({x})[0], x * 3.0);
  m->train();
  expect_close(f({x})[0], x * 2.0);
  EXPECT_EQ(f.stats().recompiles, 1);
  EXPECT_EQ(reason_of_last_recompile(f), "module mode changed: traced with eval mode, called with training mode");
  m->eval();
  expect_close(f({x})[0], x * 3.0);  // the eval entry again, without a trace
  m->inner->train();                  // a submodule alone: mixed modes
  expect_close(f({x})[0], x * 3.0);
  EXPECT_EQ(reason_of_last_recompile(f),
            "module mode changed: traced with training mode, called with mixed modes (1 of 2 modules training)");
  EXPECT_EQ(f.stats().traces, 3);
}

TEST(Capture, DtypeChangeRecompiles) {
  Generator g(3);
  CompiledFunction f = compile([](const TensorList& in) { return TensorList{exp(in[0]) + 1.0}; });
  Tensor x = Tensor::randn({3}, g);
  f({x});
  Tensor xd = x.to(DType::Float64);
  Tensor y = f({xd})[0];
  EXPECT_EQ(y.dtype(), DType::Float64);
  expect_close(y, exp(xd) + 1.0, 1e-12);
  EXPECT_EQ(reason_of_last_recompile(f), "input 0: dtype expected float32, got float64");
}

TEST(Capture, StrideChangeRecompiles) {
  Generator g(4);
  CompiledFunction f = compile([](const TensorList& in) { return TensorList{tanh(in[0])}; });
  Tensor x = Tensor::randn({3, 5}, g);
  f({x});
  Tensor base = Tensor::randn({5, 3}, g);
  Tensor xt = base.as_strided({3, 5}, {1, 3}, 0);  // non-contiguous view
  expect_close(f({xt})[0], tanh(xt));
  EXPECT_NE(reason_of_last_recompile(f).find("input 0: strides expected [5, 1], got [1, 3]"),
            std::string::npos)
      << reason_of_last_recompile(f);
}

TEST(Capture, DeviceGuardNamesTheDevice) {
  // Guards compare metadata only, so a fake CUDA tensor exercises the device guard here.
  InputGuards guards(TensorList{Tensor::fake({2, 2}, DType::Float32)});
  TensorList cuda_in{Tensor::fake({2, 2}, DType::Float32, Device::cuda(0))};
  EXPECT_FALSE(guards.check(cuda_in));
  EXPECT_EQ(guards.failure_reason(cuda_in), "input 0: device expected cpu, got cuda:0");
}

TEST(Capture, ParameterMutationRecompiles) {
  Generator g(5);
  Net net(g);
  CompiledFunction f = compile([&](const TensorList& in) { return net(in); });
  Tensor x = Tensor::randn({2, 6}, g);
  Tensor before = f({x})[0];
  net.w.copy_(Tensor::randn({8, 6}, g));  // in-place write bumps the version
  Tensor after = f({x})[0];
  expect_close(after, net({x})[0]);
  auto bv = before.to_vector<float>(), av = after.to_vector<float>();
  EXPECT_NE(bv, av);
  EXPECT_EQ(f.stats().recompiles, 1);
  EXPECT_NE(reason_of_last_recompile(f).find("was modified"), std::string::npos)
      << reason_of_last_recompile(f);
  EXPECT_EQ(f.stats().entries, 1);  // the stale entry was dropped
}

TEST(Capture, CacheLimitFallsBackToEagerLoudlyAndCorrectly) {
  Generator g(6);
  CompileOptions opts;
  opts.cache_size_limit = 2;
  CompiledFunction f = compile([](const TensorList& in) { return TensorList{sigmoid(in[0])}; }, opts);
  testing::internal::CaptureStderr();
  for (int n = 1; n <= 5; ++n) {
    Tensor x = Tensor::randn({n}, g);
    expect_close(f({x})[0], sigmoid(x));
  }
  std::string err = testing::internal::GetCapturedStderr();
  CompileStats s = f.stats();
  EXPECT_EQ(s.entries, 2);
  EXPECT_EQ(s.fallbacks_cache_limit, 3);
  // Warned exactly once, naming the cause.
  size_t first = err.find("cache_size_limit (2) reached");
  ASSERT_NE(first, std::string::npos) << err;
  EXPECT_EQ(err.find("cache_size_limit (2) reached", first + 1), std::string::npos) << err;
  EXPECT_NE(err.find("dim 0 expected"), std::string::npos) << err;
  EXPECT_EQ(f.report().fallbacks.size(), 1u);
}

namespace {
// Reads a tensor value on the host and branches on it: one graph break.
TensorList branchy(const TensorList& in) {
  Tensor s = sum(in[0]);
  if (s.item() > 0) return {relu(in[0]) * 2.0};
  return {neg(in[0]) + 1.0};
}
}  // namespace

TEST(Capture, GraphBreakSplitsGraphsAndFollowsBothBranches) {
  CompiledFunction f = compile(branchy);
  Tensor pos = Tensor::from_vector<float>({1.0f, 2.0f, -0.5f}, {3});
  Tensor neg_in = Tensor::from_vector<float>({-1.0f, -2.0f, 0.5f}, {3});
  expect_close(f({pos})[0], relu(pos) * 2.0);
  auto r = f.report();
  ASSERT_EQ(r.graphs.size(), 2u);
  ASSERT_EQ(r.breaks.size(), 1u);
  EXPECT_NE(r.breaks[0].reason.find("item()"), std::string::npos);
  EXPECT_NE(r.breaks[0].location.find("capture_test.cc:"), std::string::npos) << r.breaks[0].location;
  // Same guards, other branch: the host read steers control flow on every call, and the new
  // second graph is compiled instead of replaying the wrong one.
  expect_close(f({neg_in})[0], neg(neg_in) + 1.0);
  EXPECT_EQ(f.stats().recompiles, 1);
  expect_close(f({pos})[0], relu(pos) * 2.0);
  expect_close(f({neg_in})[0], neg(neg_in) + 1.0);
  EXPECT_EQ(f.stats().graphs_compiled, 3);  // sum, branch A, branch B
  bool has_value_guard = false;
  for (const std::string& gd : f.report().guards)
    has_value_guard |= gd.find("value read by item()") != std::string::npos;
  EXPECT_TRUE(has_value_guard);
}

TEST(Capture, FullgraphBreakIsAnErrorNamingOpAndLocation) {
  CompileOptions opts;
  opts.fullgraph = true;
  CompiledFunction f = compile(branchy, opts);
  Generator g(7);
  try {
    f({Tensor::randn({3}, g)});
    FAIL() << "expected a fullgraph error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("fullgraph"), std::string::npos) << m;
    EXPECT_NE(m.find("item()"), std::string::npos) << m;
    EXPECT_NE(m.find("op 'sum'"), std::string::npos) << m;
    EXPECT_NE(m.find("capture_test.cc:"), std::string::npos) << m;
  }
}

namespace {
struct FailingGraph final : CompiledGraph {
  TensorList run(const TensorList&) override {
    throw Error(ErrorKind::Runtime, "injected runtime failure");
  }
};
}  // namespace

TEST(Capture, CompileFailureFallsBackToEager) {
  register_backend("test_compile_fails", [](const Graph&, const BackendOptions&)
                                             -> std::unique_ptr<CompiledGraph> {
    throw Error(ErrorKind::NotSupported, "injected compile failure");
  });
  CompileOptions opts;
  opts.backend = "test_compile_fails";
  CompiledFunction f = compile([](const TensorList& in) { return TensorList{exp(in[0])}; }, opts);
  Generator g(8);
  Tensor x = Tensor::randn({5}, g);
  testing::internal::CaptureStderr();
  expect_close(f({x})[0], exp(x));
  expect_close(f({x})[0], exp(x));
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(f.stats().fallbacks_compile_error, 1);
  ASSERT_EQ(f.report().fallbacks.size(), 1u);
  EXPECT_NE(f.report().fallbacks[0].find("injected compile failure"), std::string::npos);
  EXPECT_NE(err.find("injected compile failure"), std::string::npos);

  opts.strict = true;
  CompiledFunction strict = compile([](const TensorList& in) { return TensorList{exp(in[0])}; }, opts);
  EXPECT_THROW(strict({x}), Error);
}

TEST(Capture, RuntimeFailureFallsBackToEager) {
  register_backend("test_run_fails", [](const Graph&, const BackendOptions&) {
    return std::unique_ptr<CompiledGraph>(new FailingGraph());
  });
  CompileOptions opts;
  opts.backend = "test_run_fails";
  CompiledFunction f = compile([](const TensorList& in) { return TensorList{cos(in[0])}; }, opts);
  Generator g(9);
  Tensor x = Tensor::randn({4}, g);
  testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) expect_close(f({x})[0], cos(x));
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(f.stats().fallbacks_runtime_error, 3);
  EXPECT_EQ(f.report().fallbacks.size(), 1u);  // reported once
  opts.strict = true;
  CompiledFunction strict = compile([](const TensorList& in) { return TensorList{cos(in[0])}; }, opts);
  EXPECT_THROW(strict({x}), Error);
}

TEST(Capture, ResetClearsCaches) {
  Generator g(10);
  CompiledFunction f = compile([](const TensorList& in) { return TensorList{abs(in[0])}; });
  Tensor x = Tensor::randn({3}, g);
  f({x});
  EXPECT_EQ(f.stats().entries, 1);
  reset();
  EXPECT_EQ(f.stats().entries, 0);
  expect_close(f({x})[0], abs(x));
  EXPECT_EQ(f.stats().traces, 2);
}

TEST(Capture, ModulesFreezeNamedParameters) {
  Generator g(11);
  auto lin = std::make_shared<nn::Linear>(6, 3, true, g);
  CompiledFunction f = compile(std::static_pointer_cast<nn::Module>(lin));
  Tensor x = Tensor::randn({2, 6}, g);
  expect_close(f({x})[0], lin->call({x})[0]);
  std::string ir = f.report().graphs.at(0).ir;
  EXPECT_NE(ir.find("weight"), std::string::npos) << ir;
  bool guard_named = false;
  for (const std::string& gd : f.report().guards) guard_named |= gd.find("weight") != std::string::npos;
  EXPECT_TRUE(guard_named);
}

TEST(Capture, ExplainJsonHasTheDocumentedKeys) {
  CompiledFunction f = compile(branchy);
  Generator g(12);
  ExplainReport r = explain(f, {Tensor::randn({4}, g)});
  auto j = nlohmann::json::parse(r.json());
  for (const char* k : {"graphs", "breaks", "guards", "recompiles", "fallbacks"})
    EXPECT_TRUE(j.contains(k)) << k;
  ASSERT_EQ(j["graphs"].size(), 2u);
  EXPECT_TRUE(j["graphs"][0].contains("ops"));
  EXPECT_TRUE(j["graphs"][0].contains("inputs"));
  EXPECT_TRUE(j["graphs"][0].contains("outputs"));
  EXPECT_EQ(j["breaks"][0]["reason"].get<std::string>().find("item()"), 0u);
  EXPECT_FALSE(r.text().empty());
}

TEST(Capture, BadOptionsAreErrors) {
  CompileOptions o;
  o.backend = "nope";
  try {
    compile([](const TensorList& in) { return in; }, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("available: eager"), std::string::npos) << e.what();
  }
  o = CompileOptions();
  o.mode = "fast";
  EXPECT_THROW(compile([](const TensorList& in) { return in; }, o), Error);
  o = CompileOptions();
  o.cache_size_limit = 0;
  EXPECT_THROW(compile([](const TensorList& in) { return in; }, o), Error);
}

TEST(Capture, DistinctScalarTemporariesStayDistinct) {
  // Each `* k` makes a temporary scalar tensor that dies right after the op; the allocator
  // often hands the next one the same address. Capture must not confuse them.
  auto fn = [](const TensorList& in) {
    Tensor a = in[0] * 0.5;
    Tensor b = a * 2.0;
    Tensor c = b * 3.0;
    Tensor d = c + 7.0;
    double v = sum(d).item();  // a break: the same must hold across segments
    Tensor e = d * 0.25;
    Tensor f = e - 1.5;
    return TensorList{f + v};
  };
  Generator g(13);
  Tensor x = Tensor::randn({5}, g);
  CompiledFunction f = compile(fn);
  for (int i = 0; i < 3; ++i) expect_close(f({x})[0], fn({x})[0]);
  auto xv = x.to_vector<float>();
  auto out = f({x})[0].to_vector<float>();
  double v = 0;
  for (float xi : xv) v += double(xi) * 3.0 + 7.0;
  std::vector<double> got(out.begin(), out.end()), want;
  for (float xi : xv) want.push_back((xi * 3.0 + 7.0) * 0.25 - 1.5 + v);
  EXPECT_TRUE(kiln::test::close(got, want, kiln::test::Tolerance::rel(0, 1e-4)));
}

// Note [Host reads of call inputs]: host code that reads an input's data directly (no op in
// between) branches on it just as on a computed value. It used to be baked into the graph: a
// second call with the other value replayed the first call's branch.
TEST(Capture, HostReadOfAnInputsDataIsAGraphBreakWithAValueGuard) {
  auto fn = [](const TensorList& in) {
    if (in[1].item() > 0) return TensorList{relu(in[0]) * 2.0};
    return TensorList{neg(in[0]) + 1.0};
  };
  Generator g(21);
  Tensor x = Tensor::randn({5}, g);
  for (bool fullgraph : {false, true}) {
    CompileOptions opts;
    opts.fullgraph = fullgraph;
    opts.strict = true;
    CompiledFunction f = compile(fn, opts);
    if (fullgraph) {
      try {
        f({x, Tensor::full({1}, 1.0)});
        FAIL() << "fullgraph: reading an input's data must be an error";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("the call's input 1"), std::string::npos) << e.what();
      }
      continue;
    }
    for (int round = 0; round < 2; ++round) {
      expect_close(f({x, Tensor::full({1}, 1.0)})[0], relu(x) * 2.0);
      expect_close(f({x, Tensor::full({1}, -1.0)})[0], neg(x) + 1.0);
    }
    auto r = f.report();
    ASSERT_FALSE(r.breaks.empty());
    EXPECT_NE(r.breaks[0].reason.find("the call's input 1"), std::string::npos) << r.breaks[0].reason;
    EXPECT_NE(r.breaks[0].location.find("capture_test.cc:"), std::string::npos);
    bool has_value_guard = false;
    for (const std::string& gd : r.guards) has_value_guard |= gd.find("value read by item()") != std::string::npos;
    EXPECT_TRUE(has_value_guard);
  }
  // The watch ends with the trace: the inputs read normally afterwards, on any thread.
  EXPECT_EQ(x.impl()->storage->capture_watch.load(), 0);
  EXPECT_NO_THROW(x.to_vector<float>());
}

// A view of an input made outside the op API (Tensor::as_strided) cannot be recorded as a
// function of the input; it used to be frozen as a parameter, so a second call with another
// input replayed the first call's data. Tracing it is an error now (like the other tracing
// errors, in strict mode or not), naming the input and the op API to use; the same view made
// with the op API (slice) compiles and follows each call's input.
TEST(Capture, ViewOfAnInputMadeOutsideTheOpApiIsNotFrozen) {
  auto fn = [](const TensorList& in) { return TensorList{in[0].as_strided({2}, {1}, 1) * 2.0}; };
  Generator g(23);
  Tensor a = Tensor::randn({3}, g), b = Tensor::randn({3}, g) + 5.0;
  for (bool strict : {true, false}) {
    CompileOptions opts;
    opts.strict = strict;
    try {
      compile(fn, opts)({a});
      FAIL() << "a view of an input made outside the op API must not be captured";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("view of the call's input 0"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("op API"), std::string::npos) << e.what();
    }
  }
  auto with_api = [](const TensorList& in) { return TensorList{slice(in[0], 0, 1, 3) * 2.0}; };
  CompiledFunction f = compile(with_api);
  for (const Tensor& x : {a, b, a}) expect_close(f({x})[0], x.as_strided({2}, {1}, 1) * 2.0);
}
