// The default pass pipeline on every zoo model: capture each model (kiln::compile with a test
// backend), run the pipeline pass by pass on every captured graph (verified after each pass),
// interpret the result, and compare with the module's eager forward on fresh inputs, within
// float32 tolerance. The test prints what each pass did per model, and pins the structural
// outcome: every batch norm folded, and the expected convs / linears fused with their epilogues.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <stdexcept>

#include <fmt/format.h>

#include "compiler/backend.h"
#include "capture/compile.h"
#include "nn/compile.h"
#include "ir/interpreter.h"
#include "ir/printer.h"
#include "nn/models/zoo.h"
#include "passes/pass.h"
#include "../support/compare.h"

using namespace kiln;

namespace {

struct PassLine {
  std::string pass;
  int nodes_before = 0, nodes_after = 0;
  int params_before = 0, params_after = 0;
};

struct GraphReport {
  std::vector<PassLine> passes;
  std::map<std::string, int> ops_before, ops_after;  // op name -> count
  int fused_with_residual = 0, fused_with_activation = 0;
};

std::mutex g_mu;
std::vector<GraphReport> g_reports;  // filled by the backend, read by the test

std::map<std::string, int> op_histogram(const Graph& g) {
  std::map<std::string, int> h;
  for (const Node& n : g.nodes) ++h[op_def(n.op).name];
  return h;
}

class PipelineGraph final : public CompiledGraph {
 public:
  explicit PipelineGraph(Graph g) : graph_(std::move(g)) {}
  TensorList run(const TensorList& inputs) override { return ::kiln::run(graph_, inputs); }

 private:
  Graph graph_;
};

// A backend: the default pipeline, one pass at a time (so that the report can say what each
// did), then the interpreter.
std::unique_ptr<CompiledGraph> compile_with_pipeline(const Graph& captured, const BackendOptions&) {
  Graph g = captured;
  GraphReport report;
  report.ops_before = op_histogram(g);
  for (const std::string& name : default_pipeline()) {
    PassLine line{name, int(g.nodes.size()), int(g.nodes.size()), int(g.params().size()), 0};
    std::vector<std::string> one = {name};
    run_passes(g, one);
    line.nodes_after = int(g.nodes.size());
    line.params_after = int(g.params().size());
    report.passes.push_back(line);
  }
  report.ops_after = op_histogram(g);
  for (const Node& n : g.nodes) {
    if (n.op != OpId::FusedConv2d && n.op != OpId::FusedLinear) continue;
    report.fused_with_residual += n.inputs.size() > 3 && n.inputs[3] != kNoValue;
    report.fused_with_activation += n.attrs.get_string("activation") != "none";
  }
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_reports.push_back(std::move(report));
  }
  return std::make_unique<PipelineGraph>(std::move(g));
}

int count(const std::map<std::string, int>& h, const char* op) {
  auto it = h.find(op);
  return it == h.end() ? 0 : it->second;
}

void print_report(const std::string& model, const GraphReport& r) {
  std::string text = fmt::format("[passes] {}: {} nodes -> {} nodes\n", model,
                                 r.passes.front().nodes_before, r.passes.back().nodes_after);
  for (const PassLine& p : r.passes)
    text += fmt::format("[passes]   {:<20} nodes {:>5} -> {:<5} params/consts {:>4} -> {}\n",
                        p.pass, p.nodes_before, p.nodes_after, p.params_before, p.params_after);
  text += fmt::format(
      "[passes]   batch_norm {} -> {}; fused_conv2d {} (of {} conv2d), fused_linear {} (of {} "
      "linear); {} with a residual add, {} with an activation\n",
      count(r.ops_before, "batch_norm"), count(r.ops_after, "batch_norm"),
      count(r.ops_after, "fused_conv2d"), count(r.ops_before, "conv2d"),
      count(r.ops_after, "fused_linear"), count(r.ops_before, "linear"), r.fused_with_residual,
      r.fused_with_activation);
  std::fputs(text.c_str(), stdout);
}

struct Expected {
  const char* model;
  int graphs, fused_conv, fused_linear, with_residual, with_activation;  // summed over graphs
};
// Derived from the model definitions:
//   mlp:      Linear-ReLU-Linear: the first linear takes the relu.
//   vfe:      conv-BN-ReLU: BN folds, the relu fuses.
//   resnet18: 20 convs (17 + 3 downsample); each non-downsample conv takes its relu, or the
//             block's residual add and relu (8 blocks); downsample convs are the residuals.
//   resnet50: 53 convs (49 + 4 downsample), 16 bottleneck blocks, likewise.
//   vit_b_16: per layer the attention out-projection and fc2 take the residual add, fc1 the
//             gelu; the patch-embedding conv (followed by a reshape) and the head stay.
//   bert:     per layer 2 dense + residual (attention output, FFN output), 1 dense + gelu;
//             the pooler dense + tanh. Q, K, V stay plain linears.
//   branchy:  two graphs around the host branch: fc1 takes the relu in the first.
//   branchy_cond: one graph (kiln::cond): fc1 takes the relu; fc2 feeds the select, plain.
const Expected kExpected[] = {
    {"mlp", 1, 0, 1, 0, 1},
    {"vfe", 1, 1, 0, 0, 1},
    {"resnet18", 1, 17, 0, 8, 17},
    {"resnet50", 1, 49, 0, 16, 49},
    {"vit_b_16", 1, 0, 36, 24, 12},
    {"bert_base", 1, 0, 37, 24, 13},
    {"branchy", 2, 0, 1, 0, 1},
    {"branchy_cond", 1, 0, 1, 0, 1},
};

const Expected& expected_for(const std::string& model) {
  for (const Expected& e : kExpected)
    if (model == e.model) return e;
  throw std::runtime_error("no expectation for zoo model '" + model +
                           "': add it to kExpected in passes_zoo_test.cc");
}

std::vector<std::string> zoo_names() {
  std::vector<std::string> names;
  for (const nn::ZooEntry& e : nn::zoo_models()) names.push_back(e.name);
  return names;
}

class PassesZoo : public testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { register_backend("test-pipeline", compile_with_pipeline); }
};

TEST_P(PassesZoo, DefaultPipelineKeepsEagerResults) {
  const Expected& want = expected_for(GetParam());
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_reports.clear();
  }
  nn::ZooModel m = nn::make_zoo_model(want.model, 1, 11);
  CompileOptions opts;
  opts.backend = "test-pipeline";
  opts.strict = true;  // a pass failure must fail the test, not fall back to eager
  CompiledFunction f = compile(m.module, opts);

  // Fresh inputs for the comparison (token ids and masks are kept: they must stay valid).
  Generator gen(1234);
  TensorList inputs;
  for (const Tensor& t : m.inputs)
    inputs.push_back(is_floating(t.dtype()) ? Tensor::randn(t.sizes(), gen, t.dtype()) : t);
  TensorList got = f(inputs);
  TensorList eager = m.module->call(inputs);
  ASSERT_EQ(got.size(), eager.size());
  for (size_t i = 0; i < eager.size(); ++i) {
    ASSERT_EQ(got[i].sizes(), eager[i].sizes());
    ASSERT_EQ(got[i].dtype(), eager[i].dtype());
    // float32 tolerance: folding BN into weights and fusing epilogues reorders float32
    // arithmetic; errors stay at a few ulps of the output's scale: 1e-4 * max(1, max|eager|).
    double max_abs = test::max_abs(eager[i]);
    test::Comparison c = test::compare(got[i], eager[i], test::Tolerance::of_scale(std::max(1.0, max_abs), 1e-4));
    std::printf("[passes] %s output %zu: worst abs diff %.3g, max abs %.3g\n", want.model, i,
                c.worst_diff, max_abs);
    EXPECT_TRUE(c.ok()) << want.model << " output " << i << ": " << c.str();
  }

  std::vector<GraphReport> reports;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    reports = g_reports;
  }
  ASSERT_EQ(int(reports.size()), want.graphs) << "captured graphs";
  int fused_conv = 0, fused_linear = 0, with_residual = 0, with_activation = 0;
  for (const GraphReport& r : reports) {
    print_report(want.model, r);
    EXPECT_EQ(count(r.ops_after, "batch_norm"), 0);
    fused_conv += count(r.ops_after, "fused_conv2d");
    fused_linear += count(r.ops_after, "fused_linear");
    with_residual += r.fused_with_residual;
    with_activation += r.fused_with_activation;
  }
  EXPECT_EQ(fused_conv, want.fused_conv);
  EXPECT_EQ(fused_linear, want.fused_linear);
  EXPECT_EQ(with_residual, want.with_residual);
  EXPECT_EQ(with_activation, want.with_activation);
  EXPECT_LT(reports[0].passes.back().nodes_after, reports[0].passes.front().nodes_before);

  // A second call replays the optimized graph.
  TensorList again = f(inputs);
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(again[i].to_vector<double>(), got[i].to_vector<double>());
}

INSTANTIATE_TEST_SUITE_P(Zoo, PassesZoo, testing::ValuesIn(zoo_names()),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
