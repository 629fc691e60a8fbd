// The ONNX importer on small models built with the protobuf API: graph structure (inputs,
// params, constants, folding, names), opset-dependent forms, and results on fresh random
// inputs against float64 references written here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "frontends/onnx/importer.h"
#include "frontends/onnx/op_table.h"
#include "ir/interpreter.h"
#include "ir/printer.h"
#include "onnx_builder.h"

namespace kiln {
namespace {

using namespace onnx_test;

std::multiset<std::string> node_ops(const Graph& g) {
  std::multiset<std::string> ops;
  for (const Node& n : g.nodes) ops.insert(op_def(n.op).name);
  return ops;
}

// ---- a float64 N-d convolution reference (NC + 1..3 spatial dims) ------------------------------
std::vector<double> conv_ref(const std::vector<double>& x, const Dims& xd, const std::vector<double>& w,
                             const Dims& wd, const std::vector<double>& b, std::vector<int64_t> s,
                             std::vector<int64_t> pb, std::vector<int64_t> dil, int64_t groups,
                             const Dims& yd) {
  int n = int(xd.size()) - 2;
  std::vector<double> y(size_t(numel(yd)), 0.0);
  int64_t cin_g = wd[1], cout_g = wd[0] / groups;
  auto strides = [](const Dims& d) {
    std::vector<int64_t> st(d.size(), 1);
    for (int i = int(d.size()) - 2; i >= 0; --i) st[size_t(i)] = st[size_t(i + 1)] * d[size_t(i + 1)];
    return st;
  };
  auto xs = strides(xd), ws = strides(wd), ys = strides(yd);
  Dims ysp(yd.begin() + 2, yd.end()), ksp(wd.begin() + 2, wd.end());
  for (int64_t bn = 0; bn < yd[0]; ++bn)
    for (int64_t co = 0; co < yd[1]; ++co) {
      int64_t g = co / cout_g;
      for_each_index(ysp, [&](const int64_t* o) {
        double acc = b.empty() ? 0.0 : b[size_t(co)];
        for (int64_t ci = 0; ci < cin_g; ++ci)
          for_each_index(ksp, [&](const int64_t* k) {
            int64_t xoff = bn * xs[0] + (g * cin_g + ci) * xs[1];
            for (int i = 0; i < n; ++i) {
              int64_t p = o[i] * s[size_t(i)] + k[i] * dil[size_t(i)] - pb[size_t(i)];
              if (p < 0 || p >= xd[size_t(i + 2)]) return;
              xoff += p * xs[size_t(i + 2)];
            }
            int64_t woff = co * ws[0] + ci * ws[1];
            for (int i = 0; i < n; ++i) woff += k[i] * ws[size_t(i + 2)];
            acc += x[size_t(xoff)] * w[size_t(woff)];
          });
        int64_t yoff = bn * ys[0] + co * ys[1];
        for (int i = 0; i < n; ++i) yoff += o[i] * ys[size_t(i + 2)];
        y[size_t(yoff)] = acc;
      });
    }
  return y;
}

// ---- structure ---------------------------------------------------------------------------------

TEST(OnnxImport, InputsParamsConstantsAndNames) {
  Generator gen(fresh_seed());
  Tensor w = Tensor::randn({3, 4}, gen), unused = Tensor::randn({7}, gen);
  ModelBuilder m;
  m.input("x", DType::Float32, {std::string("batch"), 3})
      .initializer("W", w)
      .initializer("unused", unused)
      .initializer("shape", Tensor::from_vector<int64_t>({0, 2, 2}, {3}))
      .node("MatMul", {"x", "W"}, {"xw"})
      .node("Constant", {}, {"half"}, {{"value", Tensor::scalar(0.5)}})
      .node("Mul", {"xw", "half"}, {"scaled"})
      .node("Reshape", {"scaled", "shape"}, {"y"})
      .output("y", DType::Float32);
  Graph g = m.import();
  // Graph input with a symbolic batch; W is the one param (unused and the shape never
  // materialize); the Constant is a const.
  ASSERT_EQ(g.inputs.size(), 1u);
  EXPECT_EQ(g.value(g.inputs[0]).name, "x");
  EXPECT_EQ(g.type(g.inputs[0]).str(), "f32[batch, 3]");
  std::vector<ValueId> params;
  int consts = 0;
  for (ValueId v : g.params()) {
    if (g.value(v).kind == ValueKind::Param) params.push_back(v);
    else ++consts;
  }
  ASSERT_EQ(params.size(), 1u);
  EXPECT_EQ(g.value(params[0]).name, "W");
  EXPECT_TRUE(same_tensor(g.value(params[0]).data, w) ||
              values(g.value(params[0]).data) == values(w));
  EXPECT_EQ(consts, 1);
  EXPECT_EQ(node_ops(g), (std::multiset<std::string>{"matmul", "mul", "reshape"}));
  ASSERT_EQ(g.outputs.size(), 1u);
  EXPECT_EQ(g.value(g.outputs[0]).name, "y");
  EXPECT_EQ(g.type(g.outputs[0]).str(), "f32[batch, 2, 2]");

  for (int64_t batch : {2, 5}) {
    Tensor x = Tensor::randn({batch, 3}, gen);
    TensorList out = run(g, {x});
    std::vector<double> xv = values(x), wv = values(w), want(size_t(batch * 4));
    for (int64_t i = 0; i < batch; ++i)
      for (int64_t j = 0; j < 4; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < 3; ++k) acc += xv[size_t(i * 3 + k)] * wv[size_t(k * 4 + j)];
        want[size_t(i * 4 + j)] = 0.5 * acc;
      }
    expect_close(out[0], want, {batch, 2, 2});
  }
}

TEST(OnnxImport, ShapeArithmeticFoldsAtImport) {
  // x.view(x.size(0), -1) as torch exports it: Shape -> Gather -> Unsqueeze -> Concat -> Reshape.
  Generator gen(fresh_seed());
  ModelBuilder m;
  m.input("x", DType::Float32, {2, 3, 4})
      .initializer("zero", Tensor::full(Dims{}, 0, DType::Int64))
      .initializer("minus1", Tensor::from_vector<int64_t>({-1}, {1}))
      .node("Shape", {"x"}, {"s"})
      .node("Gather", {"s", "zero"}, {"n"}, {{"axis", int64_t(0)}})
      .node("Unsqueeze", {"n"}, {"n1"}, {{"axes", std::vector<int64_t>{0}}})
      .node("Concat", {"n1", "minus1"}, {"target"}, {{"axis", int64_t(0)}})
      .node("Reshape", {"x", "target"}, {"y"})
      .node("Size", {"x"}, {"numel"})
      .output("y", DType::Float32, {2, 12})
      .output("numel", DType::Int64, {});
  m.model().mutable_opset_import(0)->set_version(11);  // Unsqueeze axes as an attribute
  Graph g = m.import();
  EXPECT_EQ(node_ops(g), (std::multiset<std::string>{"reshape"}));
  Tensor x = Tensor::randn({2, 3, 4}, gen);
  TensorList out = run(g, {x});
  expect_close(out[0], values(x), {2, 12}, 0);
  expect_close(out[1], {24}, {}, 0);
}

TEST(OnnxImport, ShapeArithmeticOnSymbolicDims) {
  // The same chain with a symbolic batch: the Reshape gets a symbolic target, and a mask made
  // with ConstantOfShape(Shape(x)) has the symbolic shape.
  Generator gen(fresh_seed());
  ModelBuilder m;
  m.input("x", DType::Float32, {std::string("batch"), 3, 4})
      .initializer("zero", Tensor::full(Dims{}, 0, DType::Int64))
      .initializer("minus1", Tensor::from_vector<int64_t>({-1}, {1}))
      .initializer("axes", Tensor::from_vector<int64_t>({0}, {1}))
      .node("Shape", {"x"}, {"s"})
      .node("Gather", {"s", "zero"}, {"n"}, {{"axis", int64_t(0)}})
      .node("Unsqueeze", {"n", "axes"}, {"n1"})
      .node("Concat", {"n1", "minus1"}, {"target"}, {{"axis", int64_t(0)}})
      .node("Reshape", {"x", "target"}, {"flat"})
      .node("ConstantOfShape", {"s"}, {"twos"}, {{"value", Tensor::full(Dims{1}, 2.0)}})
      .node("Mul", {"x", "twos"}, {"x2"})
      .output("flat", DType::Float32, {std::string("batch"), 12})
      .output("x2", DType::Float32, {std::string("batch"), 3, 4});
  Graph g = m.import();
  EXPECT_EQ(g.type(g.outputs[0]).str(), "f32[batch, 12]");
  EXPECT_EQ(g.type(g.outputs[1]).str(), "f32[batch, 3, 4]");
  for (int64_t batch : {1, 3}) {
    Tensor x = Tensor::randn({batch, 3, 4}, gen);
    TensorList out = run(g, {x});
    expect_close(out[0], values(x), {batch, 12}, 0);
    std::vector<double> twice;
    for (double v : values(x)) twice.push_back(2 * v);
    expect_close(out[1], twice, {batch, 3, 4}, 0);
  }
  // A symbolic shape value read as data is refused, naming the node.
  ModelBuilder bad;
  bad.input("x", DType::Float32, {std::string("batch"), 3})
      .node("Shape", {"x"}, {"s"})
      .node("Cast", {"s"}, {"f"}, {{"to", int64_t(pb::TensorProto::FLOAT)}}, "to_float")
      .node("Mul", {"f", "f"}, {"y"}, {}, "square")
      .output("y", DType::Float32);
  expect_error([&] { bad.import(); }, ErrorKind::NotSupported, {"to_float", "symbolic shape values"});
}

// Gather with one index known at import (torch's qkv[1], x[:, -2]: a scalar initializer, a [1]
// Constant) is a slice (a view the compiler folds into loads), not an index_select copy; an index
// outside [-n, n) is an error naming the node.
TEST(OnnxImport, GatherWithOneKnownIndexIsASlice) {
  Generator gen(fresh_seed());
  ModelBuilder m;
  m.input("x", DType::Float32, {2, 5, 3, 4})
      .initializer("minus2", Tensor::full(Dims{}, -2, DType::Int64))
      .node("Constant", {}, {"three"}, {{"value", Tensor::from_vector<int64_t>({3}, {1})}})
      .initializer("one11", Tensor::from_vector<int64_t>({1}, {1, 1}))
      .node("Gather", {"x", "minus2"}, {"a"}, {{"axis", int64_t(1)}})
      .node("Gather", {"x", "three"}, {"b"}, {{"axis", int64_t(3)}})
      .node("Gather", {"x", "one11"}, {"c"}, {{"axis", int64_t(2)}})
      .output("a", DType::Float32, {2, 3, 4})
      .output("b", DType::Float32, {2, 5, 3, 1})
      .output("c", DType::Float32, {2, 5, 1, 1, 4});
  Graph g = m.import();
  std::multiset<std::string> ops = node_ops(g);
  EXPECT_EQ(ops.count("index_select"), 0u) << print_graph(g);
  EXPECT_EQ(ops.count("slice"), 3u) << print_graph(g);
  for (ValueId v : g.params())  // the index initializers are not weights any more
    EXPECT_NE(g.value(v).kind, ValueKind::Param) << g.value(v).name;
  Tensor x = Tensor::randn({2, 5, 3, 4}, gen);
  std::vector<double> xv = values(x), a, b, c;
  auto at = [&](int64_t i, int64_t j, int64_t k, int64_t l) { return xv[size_t(((i * 5 + j) * 3 + k) * 4 + l)]; };
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t k = 0; k < 3; ++k)
      for (int64_t l = 0; l < 4; ++l) a.push_back(at(i, 3, k, l));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 5; ++j)
      for (int64_t k = 0; k < 3; ++k) b.push_back(at(i, j, k, 3));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 5; ++j)
      for (int64_t l = 0; l < 4; ++l) c.push_back(at(i, j, 1, l));
  TensorList out = run(g, {x});
  expect_close(out[0], a, {2, 3, 4}, 0);
  expect_close(out[1], b, {2, 5, 3, 1}, 0);
  expect_close(out[2], c, {2, 5, 1, 1, 4}, 0);

  for (int64_t bad : {5, -6}) {
    ModelBuilder e;
    e.input("x", DType::Float32, {2, 5, 3})
        .initializer("i", Tensor::full(Dims{}, double(bad), DType::Int64))
        .node("Gather", {"x", "i"}, {"y"}, {{"axis", int64_t(1)}}, "pick_row")
        .output("y", DType::Float32, {2, 3});
    expect_error([&] { e.import(); }, ErrorKind::InvalidArgument,
                 {"pick_row", fmt::format("index {} is out of range for axis 1 of size 5", bad)});
  }
}

TEST(OnnxImport, OutputsThatAreInputsOrSharedGetTheirOwnNames) {
  Generator gen(fresh_seed());
  ModelBuilder m;
  m.input("x", DType::Float32, {3})
      .node("Relu", {"x"}, {"r"})
      .node("Identity", {"r"}, {"r2"})
      .node("Identity", {"x"}, {"x2"})
      .output("r", DType::Float32)
      .output("r2", DType::Float32)
      .output("x2", DType::Float32);
  Graph g = m.import();
  ASSERT_EQ(g.outputs.size(), 3u);
  EXPECT_EQ(g.value(g.outputs[0]).name, "r");
  EXPECT_EQ(g.value(g.outputs[1]).name, "r2");
  EXPECT_EQ(g.value(g.outputs[2]).name, "x2");
  std::set<ValueId> distinct(g.outputs.begin(), g.outputs.end());
  EXPECT_EQ(distinct.size(), 3u);
  Tensor x = Tensor::randn({3}, gen);
  TensorList out = run(g, {x});
  std::vector<double> xv = values(x), rv;
  for (double v : xv) rv.push_back(std::max(v, 0.0));
  expect_close(out[0], rv, {3}, 0);
  expect_close(out[1], rv, {3}, 0);
  expect_close(out[2], xv, {3}, 0);
}

TEST(OnnxImport, OnnxMappingIsInTheRegistry) {
  onnx::register_onnx_mappings();
  auto has = [](OpId id, const char* onnx_op) {
    const auto& v = op_def(id).onnx_ops;
    return std::find(v.begin(), v.end(), onnx_op) != v.end();
  };
  EXPECT_TRUE(has(OpId::Matmul, "MatMul"));
  EXPECT_TRUE(has(OpId::Matmul, "Gemm"));
  EXPECT_TRUE(has(OpId::Linear, "Gemm"));
  EXPECT_TRUE(has(OpId::Conv2d, "Conv"));
  EXPECT_TRUE(has(OpId::Where, "LeakyRelu"));
  EXPECT_FALSE(has(OpId::Conv2d, "MatMul"));
  // The table: sorted, unique, every entry with a converter; at least 120 ONNX op types.
  auto table = onnx::onnx_op_table();
  EXPECT_GE(table.size(), 120u);
  for (size_t i = 0; i < table.size(); ++i) {
    EXPECT_NE(table[i].convert, nullptr) << table[i].op_type;
    if (i) {
      EXPECT_LT(table[i - 1].op_type, table[i].op_type);
    }
    EXPECT_EQ(onnx::find_onnx_op(table[i].op_type), &table[i]);
  }
  EXPECT_EQ(onnx::find_onnx_op("NoSuchOp"), nullptr);
}

// ---- numerics of composed mappings -------------------------------------------------------------

TEST(OnnxImport, GemmAttributes) {
  Generator gen(fresh_seed());
  Tensor a = Tensor::randn({3, 4}, gen), b = Tensor::randn({5, 3}, gen), c = Tensor::randn({5}, gen);
  ModelBuilder m;
  m.input("a", DType::Float32, {3, 4}).input("b", DType::Float32, {5, 3}).input("c", DType::Float32, {5})
      .node("Gemm", {"a", "b", "c"}, {"y"},
            {{"transA", int64_t(1)}, {"transB", int64_t(1)}, {"alpha", 0.75}, {"beta", 1.5}})
      .output("y", DType::Float32, {4, 5});
  Graph g = m.import();
  TensorList out = run(g, {a, b, c});
  std::vector<double> av = values(a), bv = values(b), cv = values(c), want;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 5; ++j) {
      double acc = 0;
      for (int k = 0; k < 3; ++k) acc += av[size_t(k * 4 + i)] * bv[size_t(j * 3 + k)];
      want.push_back(0.75 * acc + 1.5 * cv[size_t(j)]);
    }
  expect_close(out[0], want, {4, 5});

  // A Gemm over a weight initializer: the transpose stays a node over the param (weights are
  // not folded into anonymous constants).
  ModelBuilder wt;
  Tensor w = Tensor::randn({5, 3}, gen);
  wt.input("x", DType::Float32, {2, 3}).initializer("weight", w)
      .node("Gemm", {"x", "weight"}, {"y"}, {{"transB", int64_t(1)}, {"alpha", 0.5}})
      .output("y", DType::Float32, {2, 5});
  Graph gw = wt.import();
  EXPECT_EQ(node_ops(gw), (std::multiset<std::string>{"permute", "matmul", "mul"}));
  ValueId wp = gw.find_value("weight");
  ASSERT_NE(wp, kNoValue);
  EXPECT_EQ(gw.value(wp).kind, ValueKind::Param);

  // nn.Linear's export becomes Kiln's linear op.
  ModelBuilder lin;
  lin.input("x", DType::Float32, {2, 3}).initializer("w", Tensor::randn({5, 3}, gen))
      .initializer("bias", Tensor::randn({5}, gen))
      .node("Gemm", {"x", "w", "bias"}, {"y"}, {{"transB", int64_t(1)}})
      .output("y", DType::Float32, {2, 5});
  EXPECT_EQ(node_ops(lin.import()), (std::multiset<std::string>{"linear"}));
}

struct ConvCase {
  Dims x, w;
  std::vector<int64_t> strides, pads, dilations;
  int64_t groups;
  std::string auto_pad;
};

TEST(OnnxImport, ConvOneTwoThreeDimsAgainstReference) {
  Generator gen(fresh_seed());
  std::vector<ConvCase> cases = {
      {{2, 3, 9}, {4, 3, 3}, {2}, {1, 2}, {1}, 1, ""},                         // 1-D, asymmetric
      {{1, 4, 7, 6}, {6, 2, 3, 2}, {2, 1}, {1, 0, 2, 1}, {1, 2}, 2, ""},        // 2-D, groups
      {{1, 2, 7, 8}, {3, 2, 3, 3}, {2, 2}, {0, 0, 0, 0}, {1, 1}, 1, "SAME_UPPER"},
      {{1, 2, 5, 6, 4}, {3, 2, 3, 2, 2}, {2, 1, 1}, {1, 0, 1, 0, 1, 0}, {1, 2, 1}, 1, ""},  // 3-D
  };
  for (const ConvCase& cc : cases) {
    int n = int(cc.x.size()) - 2;
    Tensor x = Tensor::randn(cc.x, gen), w = Tensor::randn(cc.w, gen), b = Tensor::randn({cc.w[0]}, gen);
    std::vector<Attr> attrs = {{"strides", cc.strides}, {"dilations", cc.dilations},
                               {"group", cc.groups}};
    std::vector<int64_t> pb(static_cast<size_t>(n)), yd_sp;
    for (int i = 0; i < n; ++i) {
      int64_t in = cc.x[size_t(i + 2)], ext = (cc.w[size_t(i + 2)] - 1) * cc.dilations[size_t(i)] + 1;
      int64_t s = cc.strides[size_t(i)], p0, p1;
      if (cc.auto_pad == "SAME_UPPER") {
        int64_t out = (in + s - 1) / s, total = std::max<int64_t>((out - 1) * s + ext - in, 0);
        p0 = total / 2;
        p1 = total - p0;
      } else {
        p0 = cc.pads[size_t(i)];
        p1 = cc.pads[size_t(i + n)];
      }
      pb[size_t(i)] = p0;
      yd_sp.push_back((in + p0 + p1 - ext) / s + 1);
    }
    if (cc.auto_pad.empty()) attrs.push_back({"pads", cc.pads});
    else attrs.push_back({"auto_pad", cc.auto_pad});
    Dims yd{cc.x[0], cc.w[0]};
    for (int64_t d : yd_sp) yd.push_back(d);
    ModelBuilder m;
    std::vector<Dim> xdims(cc.x.begin(), cc.x.end()), wdims(cc.w.begin(), cc.w.end());
    m.input("x", DType::Float32, xdims).input("w", DType::Float32, wdims)
        .input("b", DType::Float32, {cc.w[0]})
        .node("Conv", {"x", "w", "b"}, {"y"}, attrs)
        .output("y", DType::Float32);
    Graph g = m.import();
    TensorList out = run(g, {x, w, b});
    std::vector<double> want = conv_ref(values(x), cc.x, values(w), cc.w, values(b), cc.strides,
                                        pb, cc.dilations, cc.groups, yd);
    SCOPED_TRACE(to_string(cc.x) + " * " + to_string(cc.w));
    expect_close(out[0], want, yd, 1e-4);
  }
}

TEST(OnnxImport, AveragePoolExcludingAsymmetricPadsAndCeil) {
  Generator gen(fresh_seed());
  // Sizes where the ceil-mode windows all overlap the input (ONNX 1.12 leaves empty windows
  // undefined).
  Tensor x = Tensor::randn({1, 2, 6, 7}, gen);
  std::vector<int64_t> k = {3, 2}, s = {2, 2}, pads = {1, 0, 2, 1};
  ModelBuilder m;
  m.input("x", DType::Float32, {1, 2, 6, 7})
      .node("AveragePool", {"x"}, {"y"},
            {{"kernel_shape", k}, {"strides", s}, {"pads", pads}, {"ceil_mode", int64_t(1)},
             {"count_include_pad", int64_t(0)}})
      .output("y", DType::Float32);
  Graph g = m.import();
  TensorList out = run(g, {x});
  // ONNX output size: ceil((in + pads - k) / s) + 1.
  int64_t oh = (6 + 3 - 3 + 1) / 2 + 1, ow = (7 + 1 - 2 + 1) / 2 + 1;
  std::vector<double> xv = values(x), want;
  for (int c = 0; c < 2; ++c)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        double sum = 0;
        int count = 0;
        for (int64_t a = 0; a < 3; ++a)
          for (int64_t b = 0; b < 2; ++b) {
            int64_t h = i * 2 + a - 1, w = j * 2 + b - 0;
            if (h < 0 || h >= 6 || w < 0 || w >= 7) continue;
            sum += xv[size_t((c * 6 + h) * 7 + w)];
            ++count;
          }
        want.push_back(sum / count);
      }
  expect_close(out[0], want, {1, 2, oh, ow});
}

// GoogLeNet's MaxPool(3, 2, ceil_mode=1): one max_pool2d (no -inf Pad before it, which ran an
// eager kernel), with ONNX's output size and values, the last window clipped at the border.
TEST(OnnxImport, MaxPoolCeilModeIsOneMaxPool) {
  Generator gen(fresh_seed());
  struct Case {
    int64_t h, w, k, s, p;
  };
  for (const Case& cs : {Case{13, 13, 3, 2, 0}, Case{14, 9, 3, 2, 1}, Case{8, 11, 2, 3, 0}}) {
    SCOPED_TRACE(fmt::format("{}x{} k{} s{} p{}", cs.h, cs.w, cs.k, cs.s, cs.p));
    Tensor x = Tensor::randn({1, 3, cs.h, cs.w}, gen);
    ModelBuilder m;
    m.input("x", DType::Float32, {1, 3, cs.h, cs.w})
        .node("MaxPool", {"x"}, {"y"},
              {{"kernel_shape", std::vector<int64_t>{cs.k, cs.k}},
               {"strides", std::vector<int64_t>{cs.s, cs.s}},
               {"pads", std::vector<int64_t>{cs.p, cs.p, cs.p, cs.p}},
               {"ceil_mode", int64_t(1)}})
        .output("y", DType::Float32);
    Graph g = m.import();
    std::multiset<std::string> ops = node_ops(g);
    EXPECT_EQ(ops.count("max_pool2d"), 1u);
    EXPECT_EQ(ops.count("pad"), 0u);
    // ONNX's ceil-mode size, minus a last window that would start in the end padding.
    auto out_size = [&](int64_t in) {
      int64_t o = (in + 2 * cs.p - cs.k + cs.s - 1) / cs.s + 1;
      if ((o - 1) * cs.s >= in + cs.p) --o;
      return o;
    };
    int64_t oh = out_size(cs.h), ow = out_size(cs.w);
    std::vector<double> xv = values(x), want;
    for (int c = 0; c < 3; ++c)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double mx = -std::numeric_limits<double>::infinity();
          for (int64_t a = 0; a < cs.k; ++a)
            for (int64_t b = 0; b < cs.k; ++b) {
              int64_t h = i * cs.s + a - cs.p, w = j * cs.s + b - cs.p;
              if (h < 0 || h >= cs.h || w < 0 || w >= cs.w) continue;
              mx = std::max(mx, xv[size_t((c * cs.h + h) * cs.w + w)]);
            }
          want.push_back(mx);
        }
    expect_close(run(g, {x})[0], want, {1, 3, oh, ow});
  }
}

// AveragePool with symmetric pads and no ceil_mode is one avg_pool2d (Inception's 3x3 stride-1
// pools; the general mapping is an explicit pad, a pool and a division by the counts), with
// ONNX's divisor: the whole window with count_include_pad, else the window's elements inside
// the input. Checked against a direct float64 computation.
TEST(OnnxImport, AveragePoolWithSymmetricPadsIsOneAvgPool) {
  Generator gen(fresh_seed());
  struct Case {
    int64_t h, w, k, s, p, include;
  };
  for (const Case& cs : {Case{9, 9, 3, 1, 1, 1}, Case{9, 7, 3, 1, 1, 0}, Case{10, 11, 3, 2, 1, 0},
                         Case{8, 8, 5, 2, 2, 1}, Case{7, 6, 2, 2, 0, 0}}) {
    SCOPED_TRACE(fmt::format("{}x{} k{} s{} p{} count_include_pad {}", cs.h, cs.w, cs.k, cs.s,
                             cs.p, cs.include));
    Tensor x = Tensor::randn({1, 3, cs.h, cs.w}, gen);
    ModelBuilder m;
    m.input("x", DType::Float32, {1, 3, cs.h, cs.w})
        .node("AveragePool", {"x"}, {"y"},
              {{"kernel_shape", std::vector<int64_t>{cs.k, cs.k}},
               {"strides", std::vector<int64_t>{cs.s, cs.s}},
               {"pads", std::vector<int64_t>{cs.p, cs.p, cs.p, cs.p}},
               {"count_include_pad", cs.include}})
        .output("y", DType::Float32);
    Graph g = m.import();
    std::multiset<std::string> ops = node_ops(g);
    EXPECT_EQ(ops.count("avg_pool2d"), 1u);
    EXPECT_EQ(ops.size(), 1u) << "no pad, no division";
    int64_t oh = (cs.h + 2 * cs.p - cs.k) / cs.s + 1, ow = (cs.w + 2 * cs.p - cs.k) / cs.s + 1;
    std::vector<double> xv = values(x), want;
    for (int c = 0; c < 3; ++c)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double sum = 0;
          int64_t inside = 0;
          for (int64_t a = 0; a < cs.k; ++a)
            for (int64_t b = 0; b < cs.k; ++b) {
              int64_t h = i * cs.s + a - cs.p, w = j * cs.s + b - cs.p;
              if (h < 0 || h >= cs.h || w < 0 || w >= cs.w) continue;
              sum += xv[size_t((c * cs.h + h) * cs.w + w)];
              ++inside;
            }
          want.push_back(sum / double(cs.include ? cs.k * cs.k : inside));
        }
    expect_close(run(g, {x})[0], want, {1, 3, oh, ow});
  }
}

TEST(OnnxImport, SoftmaxOpset11FlattensOpset13DoesNot) {
  Generator gen(fresh_seed());
  Tensor x = Tensor::randn({2, 3, 4}, gen);
  std::vector<double> xv = values(x);
  for (int64_t opset : {11, 13}) {
    ModelBuilder m(opset);
    m.input("x", DType::Float32, {2, 3, 4})
        .node("Softmax", {"x"}, {"y"}, {{"axis", int64_t(1)}})
        .output("y", DType::Float32, {2, 3, 4});
    TensorList out = run(m.import(), {x});
    std::vector<double> want(24);
    for (int b = 0; b < 2; ++b) {
      if (opset == 11) {  // over the 12 trailing elements together
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < 12; ++i) mx = std::max(mx, xv[size_t(b * 12 + i)]);
        for (int i = 0; i < 12; ++i) sum += std::exp(xv[size_t(b * 12 + i)] - mx);
        for (int i = 0; i < 12; ++i) want[size_t(b * 12 + i)] = std::exp(xv[size_t(b * 12 + i)] - mx) / sum;
      } else {  // over dim 1 only
        for (int k = 0; k < 4; ++k) {
          double sum = 0;
          for (int i = 0; i < 3; ++i) sum += std::exp(xv[size_t(b * 12 + i * 4 + k)]);
          for (int i = 0; i < 3; ++i)
            want[size_t(b * 12 + i * 4 + k)] = std::exp(xv[size_t(b * 12 + i * 4 + k)]) / sum;
        }
      }
    }
    SCOPED_TRACE(opset);
    expect_close(out[0], want, {2, 3, 4});
  }
}

TEST(OnnxImport, AttributeAndInputFormsAcrossOpsets) {
  Generator gen(fresh_seed());
  Tensor x = Tensor::randn({2, 1, 6}, gen);
  std::vector<double> xv = values(x);
  auto i64 = [](std::vector<int64_t> v) { return Tensor::from_vector(v, Dims{int64_t(v.size())}); };
  for (int64_t opset : {9, 13}) {
    SCOPED_TRACE(opset);
    bool inputs = opset >= 13;
    ModelBuilder m(opset);
    m.input("x", DType::Float32, {2, 1, 6});
    // Squeeze axis 1, then Slice [1:5:2] on the last axis (negative steps need opset >= 10).
    if (inputs) {
      m.initializer("sq_axes", i64({1})).node("Squeeze", {"x", "sq_axes"}, {"s"});
      m.initializer("st", i64({1})).initializer("en", i64({5})).initializer("ax", i64({-1}))
          .initializer("step", i64({2}))
          .node("Slice", {"s", "st", "en", "ax", "step"}, {"sl"});
      m.initializer("split", i64({1, 1})).node("Split", {"sl", "split"}, {"p0", "p1"}, {{"axis", int64_t(1)}});
      m.initializer("rs_axes", i64({1})).node("ReduceSum", {"x", "rs_axes"}, {"r"}, {{"keepdims", int64_t(0)}});
      m.initializer("pads", i64({0, 1, 0, 2})).node("Pad", {"p0", "pads"}, {"pd"});
      m.initializer("lo", Tensor::scalar(-0.5)).initializer("hi", Tensor::scalar(0.5))
          .node("Clip", {"pd", "lo", "hi"}, {"cl"});
    } else {
      m.node("Squeeze", {"x"}, {"s"}, {{"axes", std::vector<int64_t>{1}}});
      m.node("Slice", {"s"}, {"sl"}, {{"starts", std::vector<int64_t>{1}}, {"ends", std::vector<int64_t>{5}},
                                      {"axes", std::vector<int64_t>{-1}}});
      m.node("Split", {"sl"}, {"p0", "p1"}, {{"axis", int64_t(1)}, {"split", std::vector<int64_t>{2, 2}}});
      m.node("ReduceSum", {"x"}, {"r"}, {{"axes", std::vector<int64_t>{1}}, {"keepdims", int64_t(0)}});
      m.node("Pad", {"p0"}, {"pd"}, {{"pads", std::vector<int64_t>{0, 1, 0, 2}}});
      m.node("Clip", {"pd"}, {"cl"}, {{"min", -0.5}, {"max", 0.5}});
    }
    m.output("cl", DType::Float32).output("p1", DType::Float32).output("r", DType::Float32);
    TensorList out = run(m.import(), {x});
    // Slice: opset 13 takes [1:5:2] -> 2 columns split 1+1; opset 9 takes [1:5] split 2+2.
    std::vector<int64_t> cols = inputs ? std::vector<int64_t>{1, 3} : std::vector<int64_t>{1, 2, 3, 4};
    size_t half = cols.size() / 2;
    std::vector<double> want_cl, want_p1, want_r;
    for (int b = 0; b < 2; ++b) {
      want_cl.push_back(0);
      for (size_t k = 0; k < half; ++k)
        want_cl.push_back(std::clamp(xv[size_t(b * 6 + cols[k])], -0.5, 0.5));
      want_cl.push_back(0);
      want_cl.push_back(0);
      for (size_t k = half; k < cols.size(); ++k) want_p1.push_back(xv[size_t(b * 6 + cols[k])]);
      for (int j = 0; j < 6; ++j) want_r.push_back(xv[size_t(b * 6 + j)]);
    }
    expect_close(out[0], want_cl, {2, int64_t(half) + 3});
    expect_close(out[1], want_p1, {2, int64_t(cols.size() - half)});
    expect_close(out[2], want_r, {2, 6});
  }
}

TEST(OnnxImport, ComposedActivationsMatchTheirFormulas) {
  Generator gen(fresh_seed());
  Tensor x = Tensor::randn({64}, gen, DType::Float32);
  std::vector<double> xv = values(x);
  struct Case {
    std::string op;
    std::vector<Attr> attrs;
    double (*f)(double);
  };
  std::vector<Case> cases = {
      {"LeakyRelu", {{"alpha", 0.25}}, [](double v) { return v < 0 ? 0.25 * v : v; }},
      {"Elu", {{"alpha", 0.5}}, [](double v) { return v < 0 ? 0.5 * (std::exp(v) - 1) : v; }},
      {"HardSigmoid", {}, [](double v) { return std::clamp(0.2 * v + 0.5, 0.0, 1.0); }},
      {"Softplus", {}, [](double v) { return std::log1p(std::exp(v)); }},
      {"Softsign", {}, [](double v) { return v / (1 + std::fabs(v)); }},
      {"Tan", {}, [](double v) { return std::tan(v); }},
      {"Atan", {}, [](double v) { return std::atan(v); }},
      {"Asinh", {}, [](double v) { return std::asinh(v); }},
      {"Sinh", {}, [](double v) { return std::sinh(v); }},
      {"ThresholdedRelu", {{"alpha", 0.3}}, [](double v) { return v > 0.3 ? v : 0.0; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op);
    ModelBuilder m;
    m.input("x", DType::Float32, {64}).node(c.op, {"x"}, {"y"}, c.attrs).output("y", DType::Float32, {64});
    TensorList out = run(m.import(), {x});
    std::vector<double> want;
    for (double v : xv) want.push_back(double(float(c.f(v))));
    expect_close(out[0], want, {64}, 2e-6);
  }
}

TEST(OnnxImport, SymbolicDimsBindAtRunTime) {
  Generator gen(fresh_seed());
  ModelBuilder m;
  m.input("a", DType::Float32, {std::string("n"), std::string("k")})
      .input("b", DType::Float32, {std::string("k"), 2})
      .node("MatMul", {"a", "b"}, {"ab"})
      .node("Relu", {"ab"}, {"y"})
      .output("y", DType::Float32, {std::string("n"), 2});
  Graph g = m.import();
  EXPECT_EQ(g.type(g.outputs[0]).str(), "f32[n, 2]");
  for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{{1, 3}, {4, 5}}) {
    Tensor a = Tensor::randn({n, k}, gen), b = Tensor::randn({k, 2}, gen);
    TensorList out = run(g, {a, b});
    std::vector<double> av = values(a), bv = values(b), want;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        double acc = 0;
        for (int64_t q = 0; q < k; ++q) acc += av[size_t(i * k + q)] * bv[size_t(q * 2 + j)];
        want.push_back(std::max(acc, 0.0));
      }
    expect_close(out[0], want, {n, 2});
  }
  // The symbol binds consistently: k from a and b must agree.
  EXPECT_THROW(run(g, {Tensor::randn({2, 3}, gen), Tensor::randn({4, 2}, gen)}), Error);
}

TEST(OnnxImport, ConstantInputsSpecializeAndInputShapesOverride) {
  Generator gen(fresh_seed());
  ModelBuilder m;
  m.input("x", DType::Float32, {2, 6})
      .input("shape", DType::Int64, {2})
      .node("Reshape", {"x", "shape"}, {"y"}, {}, "reshape_node")
      .output("y", DType::Float32);
  // The shape is data: without a value at import the node is data-dependent.
  std::vector<std::string> needed;
  ImportOptions o;
  o.needed_constant_inputs = &needed;
  expect_error([&] { m.import(o); }, ErrorKind::NotSupported,
               {"reshape_node", "Reshape", "'shape'", "computed at run time"});
  EXPECT_EQ(needed, std::vector<std::string>{"shape"});
  // Bound at import: one graph input left, and the value decides the output shape.
  o.constant_inputs = {{"shape", Tensor::from_vector<int64_t>({3, -1}, {2})}};
  Graph g = m.import(o);
  ASSERT_EQ(g.inputs.size(), 1u);
  Tensor x = Tensor::randn({2, 6}, gen);
  TensorList out = run(g, {x});
  expect_close(out[0], values(x), {3, 4}, 0);
  // A bound value must match the declared type.
  o.constant_inputs = {{"shape", Tensor::from_vector<int64_t>({3, -1, 1}, {3})}};
  expect_error([&] { m.import(o); }, ErrorKind::InvalidArgument, {"'shape'", "declared"});
  o.constant_inputs = {{"nope", Tensor::from_vector<int64_t>({3, -1}, {2})}};
  expect_error([&] { m.import(o); }, ErrorKind::InvalidArgument, {"'nope'", "not a graph input"});
  // input_shapes replaces a declared shape.
  o.constant_inputs = {{"shape", Tensor::from_vector<int64_t>({-1}, {1})}};
  o.input_shapes = {{"x", {3, 5}}, {"shape", {1}}};
  Graph g2 = m.import(o);
  EXPECT_EQ(g2.type(g2.inputs[0]).str(), "f32[3, 5]");
  EXPECT_EQ(g2.type(g2.outputs[0]).str(), "f32[15]");
}

TEST(OnnxImport, ExternalDataAndTensorFiles) {
  Generator gen(fresh_seed());
  TempDir dir;
  Tensor w = Tensor::randn({4, 3}, gen);
  // The weight lives at offset 16 of weights.bin.
  std::string blob(16, 'x');
  blob.append(static_cast<const char*>(w.raw_data()), w.nbytes());
  dir.write("weights.bin", blob);
  ModelBuilder m;
  m.input("x", DType::Float32, {2, 4}).node("MatMul", {"x", "w"}, {"y"}).output("y", DType::Float32);
  pb::TensorProto* t = m.graph().add_initializer();
  t->set_name("w");
  t->set_data_type(pb::TensorProto::FLOAT);
  t->add_dims(4);
  t->add_dims(3);
  t->set_data_location(pb::TensorProto::EXTERNAL);
  auto kv = [&](const char* k, const std::string& v) {
    auto* e = t->add_external_data();
    e->set_key(k);
    e->set_value(v);
  };
  kv("location", "weights.bin");
  kv("offset", "16");
  kv("length", std::to_string(w.nbytes()));
  std::string path = dir.write("model.onnx", m.bytes());
  Graph g = import_onnx(path);
  Tensor x = Tensor::randn({2, 4}, gen);
  TensorList out = run(g, {x});
  std::vector<double> xv = values(x), wv = values(w), want;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      double acc = 0;
      for (int k = 0; k < 4; ++k) acc += xv[size_t(i * 4 + k)] * wv[size_t(k * 3 + j)];
      want.push_back(acc);
    }
  expect_close(out[0], want, {2, 3});

  // Typed data fields (instead of raw_data), as older exporters write them.
  {
    auto typed = [&](int32_t type, auto fill) {
      pb::TensorProto p;
      p.set_name("t");
      p.set_data_type(type);
      p.add_dims(3);
      fill(p);
      return read_onnx_tensor_file(dir.write("typed.pb", p.SerializeAsString()));
    };
    Tensor f = typed(pb::TensorProto::FLOAT, [](pb::TensorProto& p) { for (float v : {1.5f, -2.f, 3.25f}) p.add_float_data(v); });
    expect_close(f, {1.5, -2, 3.25}, {3}, 0);
    Tensor d = typed(pb::TensorProto::DOUBLE, [](pb::TensorProto& p) { for (double v : {0.1, 0.2, 0.3}) p.add_double_data(v); });
    expect_close(d, {0.1, 0.2, 0.3}, {3}, 0);
    Tensor i8 = typed(pb::TensorProto::INT8, [](pb::TensorProto& p) { for (int v : {-128, 0, 127}) p.add_int32_data(v); });
    EXPECT_EQ(i8.dtype(), DType::Int8);
    expect_close(i8, {-128, 0, 127}, {3}, 0);
    Tensor b = typed(pb::TensorProto::BOOL, [](pb::TensorProto& p) { for (int v : {0, 1, 5}) p.add_int32_data(v); });
    expect_close(b, {0, 1, 1}, {3}, 0);
    Tensor h = typed(pb::TensorProto::FLOAT16, [](pb::TensorProto& p) {
      for (float v : {0.5f, -1.f, 2.f}) p.add_int32_data(Half::from_float(v));
    });
    EXPECT_EQ(h.dtype(), DType::Float16);
    expect_close(h, {0.5, -1, 2}, {3}, 0);
    Tensor l = typed(pb::TensorProto::INT64, [](pb::TensorProto& p) { for (int64_t v : {int64_t(1) << 40, int64_t(-5), int64_t(7)}) p.add_int64_data(v); });
    expect_close(l, {double(int64_t(1) << 40), -5, 7}, {3}, 0);
  }

  // A TensorProto file (the backend tests' input_N.pb) reads back exactly, with its name.
  Tensor v = Tensor::randint({3, 2}, gen, -100, 100, DType::Int32);
  std::string tp = dir.write("input_0.pb", tensor_proto("in0", v).SerializeAsString());
  std::string name;
  Tensor back = read_onnx_tensor_file(tp, &name);
  EXPECT_EQ(name, "in0");
  EXPECT_EQ(back.dtype(), DType::Int32);
  expect_close(back, values(v), {3, 2}, 0);
}

}  // namespace
}  // namespace kiln
