// Importer behaviour added for opsets 18-28 and for real exports: symbolic batch through
// convolution and pooling, Slice's INT64_MIN bound, Split's num_outputs, Pad's axes and wrap
// mode, and the size limits of the new compositions (hostile inputs still get errors, never
// unbounded allocations). The per-op semantics are covered by the PyPI conformance suite.
#include <gtest/gtest.h>

#include <limits>

#include "ir/interpreter.h"
#include "onnx_builder.h"

namespace kiln {
namespace {

using namespace onnx_test;

TEST(OnnxNewerOpsets, SymbolicBatchRunsThroughConvAndPooling) {
  Generator gen(11);
  Tensor w = Tensor::randn({4, 3, 3, 3}, gen);
  ModelBuilder m(18);
  m.input("x", DType::Float32, {std::string("batch"), 3, 8, 8})
      .initializer("w", w)
      .initializer("axes", Tensor::from_vector<int64_t>({2, 3}, {2}))
      .node("Conv", {"x", "w"}, {"c"}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}})
      .node("MaxPool", {"c"}, {"p"}, {{"kernel_shape", std::vector<int64_t>{2, 2}},
                                      {"strides", std::vector<int64_t>{2, 2}}})
      .node("ReduceMean", {"p", "axes"}, {"y"}, {{"keepdims", int64_t(0)}})
      .output("y", DType::Float32);
  Graph g = m.import();
  ASSERT_TRUE(g.type(g.inputs[0]).shape[0].is_symbolic());
  for (int64_t batch : {1, 3}) {
    Tensor x = Tensor::randn({batch, 3, 8, 8}, gen);
    Tensor y = run(g, {x})[0];
    ASSERT_EQ(to_string(y.sizes()), to_string(Dims{batch, 4}));
    // Batch rows are independent: each equals the batch-1 result of its own row.
    for (int64_t b = 0; b < batch; ++b) {
      Tensor xb = x.as_strided({1, 3, 8, 8}, x.strides(), b * 3 * 64).contiguous();
      std::vector<double> one = values(run(g, {xb})[0]), all = values(y);
      std::vector<double> row(all.begin() + b * 4, all.begin() + b * 4 + 4);
      EXPECT_TRUE(test::close(row, one, test::Tolerance::rel(0, 1e-5))) << "batch row " << b;
    }
  }
}

TEST(OnnxNewerOpsets, SliceFromTheEndWithInt64Min) {
  // torch.onnx writes "from the very start" (x[..., :-1] of a shape, say) as starts = INT64_MIN,
  // beyond Kiln's integer range; Slice's bounds saturate (they are clamped anyway).
  ModelBuilder m(18);
  m.input("x", DType::Float32, {2, 6})
      .initializer("starts", Tensor::from_vector<int64_t>({std::numeric_limits<int64_t>::min()}, {1}))
      .initializer("ends", Tensor::from_vector<int64_t>({-1}, {1}))
      .initializer("axes", Tensor::from_vector<int64_t>({1}, {1}))
      .node("Slice", {"x", "starts", "ends", "axes"}, {"y"})
      .output("y", DType::Float32);
  Graph g = m.import();
  Generator gen(3);
  Tensor x = Tensor::randn({2, 6}, gen);
  std::vector<double> xv = values(x), want;
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 5; ++c) want.push_back(xv[size_t(r * 6 + c)]);
  expect_close(run(g, {x})[0], want, {2, 5});
}

TEST(OnnxNewerOpsets, SplitNumOutputsAndPadAxesAndWrap) {
  Generator gen(5);
  Tensor x = Tensor::randn({3, 7}, gen);
  std::vector<double> xv = values(x);
  // Split-18: 7 into 3 parts of ceil(7/3) = 3, 3, 1.
  ModelBuilder s(18);
  s.input("x", DType::Float32, {3, 7})
      .node("Split", {"x"}, {"a", "b", "c"}, {{"axis", int64_t(1)}, {"num_outputs", int64_t(3)}})
      .output("a", DType::Float32).output("b", DType::Float32).output("c", DType::Float32);
  TensorList parts = run(s.import(), {x});
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(to_string(parts[0].sizes()), to_string(Dims{3, 3}));
  EXPECT_EQ(to_string(parts[2].sizes()), to_string(Dims{3, 1}));
  EXPECT_EQ(values(parts[2])[1], xv[13]);

  // Pad-19 wrap over axis 1 only (axes input): [1, 2] -> columns 6 | 0..6 | 0 1.
  ModelBuilder p(19);
  p.input("x", DType::Float32, {3, 7})
      .initializer("pads", Tensor::from_vector<int64_t>({1, 2}, {2}))
      .initializer("axes", Tensor::from_vector<int64_t>({-1}, {1}))
      .node("Pad", {"x", "pads", "", "axes"}, {"y"}, {{"mode", std::string("wrap")}})
      .output("y", DType::Float32);
  Tensor y = run(p.import(), {x})[0];
  ASSERT_EQ(to_string(y.sizes()), to_string(Dims{3, 10}));
  std::vector<double> yv = values(y);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 10; ++c)
      EXPECT_EQ(yv[size_t(r * 10 + c)], xv[size_t(r * 7 + ((c - 1 + 7) % 7))]) << r << "," << c;

  // num_outputs that disagrees with the node's outputs is an error naming the node.
  ModelBuilder bad(18);
  bad.input("x", DType::Float32, {3, 7})
      .node("Split", {"x"}, {"a", "b"}, {{"axis", int64_t(1)}, {"num_outputs", int64_t(3)}}, "split3")
      .output("a", DType::Float32).output("b", DType::Float32);
  expect_error([&] { bad.import(); }, ErrorKind::InvalidArgument, {"split3", "num_outputs is 3"});
}

TEST(OnnxNewerOpsets, NewCompositionsRefuseHostileSizes) {
  // Wrap padding of a billion per side: its index tensor is refused before allocation.
  ModelBuilder wrap(19);
  wrap.input("x", DType::Float32, {2, 2})
      .initializer("pads", Tensor::from_vector<int64_t>({0, 1000000000, 0, 1000000000}, {4}))
      .node("Pad", {"x", "pads"}, {"y"}, {{"mode", std::string("wrap")}}, "huge_wrap")
      .output("y", DType::Float32);
  expect_error([&] { wrap.import(); }, ErrorKind::InvalidArgument, {"huge_wrap", "tensor limit"});

  // ScatterElements max over 10^4 x 10^4 pairs: the pairwise composition refuses.
  ModelBuilder sc(18);
  sc.input("x", DType::Float32, {10000})
      .input("i", DType::Int64, {10000})
      .input("u", DType::Float32, {10000})
      .node("ScatterElements", {"x", "i", "u"}, {"y"}, {{"reduction", std::string("max")}}, "big_max")
      .output("y", DType::Float32);
  expect_error([&] { sc.import(); }, ErrorKind::NotSupported, {"big_max", "pairs"});

  // CumProd along 10^5 positions.
  ModelBuilder cp(26);
  cp.input("x", DType::Float32, {100000})
      .initializer("axis", Tensor::from_vector<int64_t>({0}, {}))
      .node("CumProd", {"x", "axis"}, {"y"}, {}, "long_cumprod")
      .output("y", DType::Float32);
  expect_error([&] { cp.import(); }, ErrorKind::NotSupported, {"long_cumprod", "4096"});

  // AffineGrid asked for a 10^6 x 10^6 grid.
  ModelBuilder ag(20);
  ag.input("theta", DType::Float32, {1, 2, 3})
      .initializer("size", Tensor::from_vector<int64_t>({1, 1, 1000000, 1000000}, {4}))
      .node("AffineGrid", {"theta", "size"}, {"grid"}, {}, "huge_grid")
      .output("grid", DType::Float32);
  expect_error([&] { ag.import(); }, ErrorKind::InvalidArgument, {"huge_grid", "too large"});

  // Beyond the newest opset the importer knows.
  ModelBuilder future(29);
  future.input("x", DType::Float32, {2}).node("Relu", {"x"}, {"y"}).output("y", DType::Float32);
  expect_error([&] { future.import(); }, ErrorKind::NotSupported, {"opset 29 is newer", "28"});
}

}  // namespace
}  // namespace kiln
