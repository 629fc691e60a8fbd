// Data-dependent ONNX models (Note [Data-dependent tails] in frontends/onnx/importer.h): the
// split into a graph and a tail, the tail's run with each call's values (eagerly and under
// capture, where the counts change from call to call), and the host paths that known values
// take (TopK, GatherND, NonMaxSuppression's buckets) against the composed ops and against
// references written here. ONNX's own cases for NonZero, NonMaxSuppression and If run in the
// conformance tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <tuple>

#include "capture/compile.h"
#include "frontends/onnx/importer.h"
#include "ir/interpreter.h"
#include "onnx_builder.h"

namespace kiln {
namespace {

using namespace onnx_test;

// x [n] -> relu -> the elements above 0.5, gathered through NonZero + GatherND, and 2 * relu
// (an output the graph part computes).
ModelBuilder select_model(int64_t n) {
  ModelBuilder m(17);
  m.input("x", DType::Float32, {n})
      .initializer("half", Tensor::full(Dims{}, 0.5, DType::Float32))
      .initializer("two", Tensor::full(Dims{}, 2.0, DType::Float32))
      .node("Relu", {"x"}, {"r"})
      .node("Mul", {"r", "two"}, {"doubled"})
      .node("Greater", {"r", "half"}, {"mask"})
      .node("NonZero", {"mask"}, {"nz"})
      .node("Transpose", {"nz"}, {"idx"}, {{"perm", std::vector<int64_t>{1, 0}}})
      .node("GatherND", {"r", "idx"}, {"picked"})
      .output("picked", DType::Float32)
      .output("doubled", DType::Float32, {n});
  return m;
}

std::vector<double> picked_ref(const Tensor& x) {
  std::vector<double> out;
  for (double v : values(x))
    if (std::max(v, 0.0) > 0.5) out.push_back(std::max(v, 0.0));
  return out;
}

TEST(OnnxDynamic, NonZeroSplitsTheModelAndTheTailRunsWithEachCallsValues) {
  const int64_t n = 40;
  ModelBuilder m = select_model(n);
  // The whole-graph import refuses, naming the node and why.
  expect_error([&] { m.import(); }, ErrorKind::NotSupported,
               {"NonZero", "computed at run time"});
  OnnxSplitImport split = import_onnx_split_bytes(m.bytes(), "", "select.onnx");
  ASSERT_TRUE(split.tail);
  EXPECT_NE(describe_onnx_tail(*split.tail).find("NonZero"), std::string::npos);
  // The graph computes what the tail reads (mask for NonZero, r for GatherND) and the output it
  // makes itself (doubled); the tail holds NonZero, Transpose and GatherND.
  const Graph& g = split.graph;
  std::vector<std::string> names;
  for (ValueId v : g.outputs) names.push_back(g.value(v).name);
  EXPECT_EQ(names, (std::vector<std::string>{"mask", "r", "doubled"}));
  auto eager = [&](const TensorList& in) { return run_onnx_tail(*split.tail, run(g, in)); };
  CompileOptions opts;
  opts.strict = true;
  CompiledFunction compiled = compile(
      [&](const TensorList& in) { return run_onnx_tail(*split.tail, run(g, in)); }, opts);
  Generator gen(fresh_seed());
  std::vector<int64_t> counts;
  for (int call = 0; call < 4; ++call) {
    Tensor x = Tensor::randn({n}, gen);
    std::vector<double> want = picked_ref(x);
    counts.push_back(int64_t(want.size()));
    std::vector<double> doubled;
    for (double v : values(x)) doubled.push_back(2 * std::max(v, 0.0));
    for (const TensorList& out : {eager({x}), compiled({x})}) {
      ASSERT_EQ(out.size(), 2u);
      expect_close(out[0], want, {int64_t(want.size())});
      expect_close(out[1], doubled, {n});
    }
  }
  // One compiled graph served every call: other counts (and values read by the tail) neither
  // recompile nor fall back.
  CompileStats st = compiled.stats();
  EXPECT_EQ(st.graphs_compiled, 1);
  EXPECT_EQ(st.recompiles, 0);
  EXPECT_EQ(st.fallbacks_cache_limit + st.fallbacks_compile_error + st.fallbacks_runtime_error, 0);
  // Fresh normal inputs give different counts: the tail's shapes did change between calls.
  std::sort(counts.begin(), counts.end());
  EXPECT_LT(counts.front(), counts.back()) << "four calls with the same count; rerun";
  // Under capture the graph part is a compiled segment and the tail a graph break.
  ExplainReport rep = explain(compiled, {Tensor::randn({n}, gen)});
  EXPECT_FALSE(rep.breaks.empty());
}

TEST(OnnxDynamic, IfOnAComputedConditionTakesTheBranchOfEachCall) {
  // y = sum(x) > 0 ? x * 3 : -x, with the condition computed from the input.
  ModelBuilder m(17);
  ModelBuilder then_b(17), else_b(17);
  then_b.initializer("three", Tensor::full(Dims{}, 3.0, DType::Float32))
      .node("Mul", {"x", "three"}, {"t_out"})
      .output("t_out", DType::Float32);
  else_b.node("Neg", {"x"}, {"e_out"}).output("e_out", DType::Float32);
  m.input("x", DType::Float32, {6})
      .initializer("zero", Tensor::full(Dims{}, 0.0, DType::Float32))
      .node("ReduceSum", {"x"}, {"s"}, {{"keepdims", int64_t(0)}})
      .node("Greater", {"s", "zero"}, {"cond"})
      .node("If", {"cond"}, {"y"})
      .output("y", DType::Float32);
  auto* node = m.graph().mutable_node(2);
  auto* a = node->add_attribute();
  a->set_name("then_branch");
  a->set_type(pb::AttributeProto::GRAPH);
  *a->mutable_g() = then_b.graph();
  a = node->add_attribute();
  a->set_name("else_branch");
  a->set_type(pb::AttributeProto::GRAPH);
  *a->mutable_g() = else_b.graph();
  OnnxSplitImport split = import_onnx_split_bytes(m.bytes(), "", "if.onnx");
  ASSERT_TRUE(split.tail);
  Generator gen(fresh_seed());
  bool saw[2] = {false, false};
  for (int call = 0; call < 12; ++call) {
    Tensor x = Tensor::randn({6}, gen);
    std::vector<double> xv = values(x), want;
    const double s = std::accumulate(xv.begin(), xv.end(), 0.0);
    saw[s > 0] = true;
    for (double v : xv) want.push_back(s > 0 ? 3 * v : -v);
    TensorList out = run_onnx_tail(*split.tail, run(split.graph, {x}));
    expect_close(out[0], want, {6});
  }
  EXPECT_TRUE(saw[0] && saw[1]) << "twelve sums of one sign; rerun";
}

// TopK and GatherND of known values take host paths; of run-time values, composed ops. The same
// model with its input as an initializer (folded) and as a graph input (run) must agree.
TEST(OnnxDynamic, KnownValueHostPathsMatchTheComposedOps) {
  Generator gen(fresh_seed());
  // Ties: values from a few levels, so that the lowest-index-first order is exercised.
  Tensor x = Tensor::randint({3, 17}, gen, 0, 5, DType::Int64).to(DType::Float32);
  Tensor data = Tensor::randn({2, 5, 3}, gen);
  Tensor idx = Tensor::randint({2, 4, 1}, gen, -5, 5, DType::Int64);
  for (int64_t largest : {int64_t(1), int64_t(0)}) {
    auto build = [&](bool known) {
      ModelBuilder m(17);
      if (known) m.initializer("x", x).initializer("data", data);
      else m.input("x", DType::Float32, {3, 17}).input("data", DType::Float32, {2, 5, 3});
      m.initializer("k", Tensor::full(Dims{1}, 6, DType::Int64))
          .initializer("idx", idx)
          .node("TopK", {"x", "k"}, {"v", "i"}, {{"axis", int64_t(1)}, {"largest", largest}})
          .node("GatherND", {"data", "idx"}, {"g"}, {{"batch_dims", int64_t(1)}})
          .output("v", DType::Float32)
          .output("i", DType::Int64)
          .output("g", DType::Float32);
      return m.import();
    };
    TensorList folded = run(build(true), {});
    TensorList composed = run(build(false), {x, data});
    ASSERT_EQ(folded.size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(to_string(folded[k].sizes()), to_string(composed[k].sizes()));
      EXPECT_EQ(values(folded[k]), values(composed[k])) << "output " << k << " largest " << largest;
    }
  }
}

// GatherND of known values copies rows on the host: an output beyond the tensor limit is refused
// before anything is allocated, as the composed form's nodes are.
TEST(OnnxDynamic, KnownGatherNdRefusesOutputsBeyondTheTensorLimit) {
  ModelBuilder m(17);
  m.initializer("data", Tensor::full(Dims{2, 50000}, 1.5, DType::Float32))
      .initializer("idx", Tensor::full(Dims{100, 1}, 1, DType::Int64))
      .node("GatherND", {"data", "idx"}, {"g"}, {}, "big_gather")
      .output("g", DType::Float32);
  ImportOptions o;
  o.max_tensor_bytes = int64_t(1) << 20;  // data 400 KB fits; 100 rows of 200 KB do not
  expect_error([&] { m.import(o); }, ErrorKind::InvalidArgument,
               {"big_gather", "tensor limit"});
  o.max_tensor_bytes = int64_t(64) << 20;
  TensorList out = run(m.import(o), {});
  ASSERT_EQ(to_string(out[0].sizes()), to_string(Dims{100, 50000}));
  EXPECT_EQ(values(out[0])[12345], 1.5);
}

// A brute-force greedy NMS (every kept box checked), center_point_box 0, one batch.
std::vector<int64_t> nms_ref(const std::vector<float>& b, const std::vector<float>& s,
                             int64_t classes, int64_t n, int64_t max_out, float iou, float thr) {
  std::vector<int64_t> out;
  for (int64_t c = 0; c < classes; ++c) {
    std::vector<int64_t> order;
    for (int64_t i = 0; i < n; ++i)
      if (s[size_t(c * n + i)] > thr) order.push_back(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t p, int64_t q) { return s[size_t(c * n + p)] > s[size_t(c * n + q)]; });
    std::vector<int64_t> kept;
    for (int64_t i : order) {
      if (int64_t(kept.size()) >= max_out) break;
      auto box = [&](int64_t j) {
        const float* p = &b[size_t(4 * j)];
        return std::array<float, 4>{std::min(p[1], p[3]), std::min(p[0], p[2]),
                                    std::max(p[1], p[3]), std::max(p[0], p[2])};
      };
      auto a = box(i);
      bool drop = false;
      for (int64_t j : kept) {
        auto q = box(j);
        float ix0 = std::max(a[0], q[0]), iy0 = std::max(a[1], q[1]);
        float ix1 = std::min(a[2], q[2]), iy1 = std::min(a[3], q[3]);
        if (ix1 <= ix0 || iy1 <= iy0) continue;
        float inter = (ix1 - ix0) * (iy1 - iy0);
        float aa = (a[2] - a[0]) * (a[3] - a[1]), qa = (q[2] - q[0]) * (q[3] - q[1]);
        float u = aa + qa - inter;
        if (aa <= 0 || qa <= 0 || u <= 0) continue;
        if (inter / u > iou) {
          drop = true;
          break;
        }
      }
      if (drop) continue;
      kept.push_back(i);
      out.insert(out.end(), {0, c, i});
    }
  }
  return out;
}

TEST(OnnxDynamic, NonMaxSuppressionOfManyBoxesMatchesBruteForce) {
  // 600 boxes in three well-separated groups (as a batched NMS offsets its classes), 2 classes:
  // enough candidates for the x-range buckets, many overlaps, some corners given flipped.
  Generator gen(fresh_seed());
  const int64_t n = 600, classes = 2;
  std::vector<double> u = values(Tensor::rand({n, 6}, gen));
  std::vector<float> b(size_t(4 * n));
  for (int64_t i = 0; i < n; ++i) {
    const double* r = &u[size_t(6 * i)];
    float y0 = float(r[0] * 100), x0 = float(r[1] * 100 + 1000 * (i % 3));
    float h = float(2 + r[2] * 40), w = float(2 + r[3] * 40);
    bool flip = r[4] < 0.3;
    float* p = &b[size_t(4 * i)];
    p[0] = flip ? y0 + h : y0, p[1] = flip ? x0 + w : x0, p[2] = flip ? y0 : y0 + h,
    p[3] = flip ? x0 : x0 + w;
  }
  std::vector<float> s(size_t(classes * n));
  std::vector<double> sv = values(Tensor::rand({classes, n}, gen));
  for (size_t i = 0; i < s.size(); ++i) s[i] = float(sv[i]);
  Tensor boxes = Tensor::from_vector(b, Dims{1, n, 4}), scores = Tensor::from_vector(s, Dims{1, classes, n});
  for (auto [max_out, iou, thr] : std::vector<std::tuple<int64_t, float, float>>{
           {1000, 0.5f, 0.05f}, {40, 0.3f, 0.0f}, {1000, 0.0f, 0.5f}}) {
    ModelBuilder m(17);
    m.input("boxes", DType::Float32, {1, n, 4})
        .input("scores", DType::Float32, {1, classes, n})
        .initializer("max", Tensor::full(Dims{1}, double(max_out), DType::Int64))
        .initializer("iou", Tensor::full(Dims{1}, iou, DType::Float32))
        .initializer("thr", Tensor::full(Dims{1}, thr, DType::Float32))
        .node("NonMaxSuppression", {"boxes", "scores", "max", "iou", "thr"}, {"sel"})
        .output("sel", DType::Int64);
    OnnxSplitImport split = import_onnx_split_bytes(m.bytes(), "", "nms.onnx");
    ASSERT_TRUE(split.tail);
    TensorList out = run_onnx_tail(*split.tail, run(split.graph, {boxes, scores}));
    std::vector<int64_t> want = nms_ref(b, s, classes, n, max_out, iou, thr);
    ASSERT_GT(want.size(), 3u * 5);
    EXPECT_EQ(to_string(out[0].sizes()), to_string(Dims{int64_t(want.size() / 3), 3}));
    EXPECT_EQ(out[0].to_vector<int64_t>(), want) << "max " << max_out << " iou " << iou;
  }
}

}  // namespace
}  // namespace kiln
