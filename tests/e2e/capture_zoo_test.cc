// Capture on every zoo model: the captured graphs pass the verifier, survive a text round trip,
// and give the same outputs as the Module's eager forward on fresh random inputs.
#include <gtest/gtest.h>

#include <cmath>

#include "capture/compile.h"
#include "nn/compile.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "nn/models/zoo.h"

using namespace kiln;

class CaptureZoo : public testing::TestWithParam<std::string> {};

TEST_P(CaptureZoo, CapturedGraphEqualsEager) {
  nn::ZooModel m = nn::make_zoo_model(GetParam(), 1, 7);
  TensorList eager = m.module->call(m.inputs);
  CompileOptions opts;
  opts.backend = "eager";  // the interpreter (the default backend is the compiler since #11)
  CompiledFunction f = compile(m.module, opts);
  TensorList captured = f(m.inputs);
  ASSERT_EQ(captured.size(), eager.size());
  for (size_t i = 0; i < eager.size(); ++i) {
    ASSERT_EQ(captured[i].sizes(), eager[i].sizes());
    ASSERT_EQ(captured[i].dtype(), eager[i].dtype());
    // The interpreter runs the same eager kernels on the same values: identical results.
    auto c = captured[i].to_vector<double>(), e = eager[i].to_vector<double>();
    for (size_t k = 0; k < e.size(); ++k) ASSERT_EQ(c[k], e[k]) << GetParam() << " output " << i << " at " << k;
  }
  ExplainReport r = f.report();
  ASSERT_FALSE(r.graphs.empty());
  for (const ExplainGraph& g : r.graphs) {
    Graph parsed = parse_graph(g.ir, GetParam());
    EXPECT_EQ(print_graph(parsed), g.ir) << "IR text of the captured graph does not round-trip";
    verify(parsed);
  }
  // A second call with fresh inputs replays without re-tracing and still matches.
  Generator g(99);
  TensorList fresh;
  for (const Tensor& t : m.inputs) {
    if (is_floating(t.dtype())) {
      fresh.push_back(Tensor::randn(t.sizes(), g, t.dtype()));
    } else {
      fresh.push_back(t);  // ids / masks: keep the valid ones
    }
  }
  TensorList again = f(fresh);
  TensorList eager2 = m.module->call(fresh);
  for (size_t i = 0; i < eager2.size(); ++i) {
    auto c = again[i].to_vector<double>(), e = eager2[i].to_vector<double>();
    for (size_t k = 0; k < e.size(); ++k) ASSERT_EQ(c[k], e[k]);
  }
  bool broken = !r.breaks.empty();
  EXPECT_EQ(f.stats().traces, broken ? 2 : 1) << "a whole-graph entry must replay without tracing";
}

static std::vector<std::string> zoo_names() {
  std::vector<std::string> names;
  for (const nn::ZooEntry& e : nn::zoo_models()) names.push_back(e.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Zoo, CaptureZoo, testing::ValuesIn(zoo_names()),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });
