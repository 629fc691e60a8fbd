// Reductions over an outer dim of their data compiled with SIMD lanes across the innermost kept
// dim (Note [lane reductions] in targets/cpu/emitter.cc): PointPillars' max over the points of
// each pillar ([P, N, C] -> [P, C]), a sum over H of NCHW, several reduce dims, a prologue and
// an epilogue that reads its own operand, kept sizes that are not a multiple of the vector width
// (the scalar tail), bfloat16, NaN, a prologue stored too (every reduce step writes its lanes). Each graph must compile to SIMD reduce kernels and match the
// float64 reference on fresh random inputs, and be bitwise what the scalar kernel (vectorize
// off) computes: the lanes walk the reduce dims in the scalar loop's order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "../support/compare.h"
#include "../support/graph_inputs.h"
#include "compiler/compile.h"
#include "ir/graph.h"
#include "ir/interpreter.h"

using namespace kiln;

namespace {

const DType f32 = DType::Float32, bf16 = DType::BFloat16;

struct Case {
  std::string name;
  Dims x;
  OpId op;
  Ints dims;
  bool keepdim = false;
  DType dtype = f32;
  bool prologue = false;  // relu(x * 1.5) before the reduction
  bool epilogue = false;  // + b (the kept shape's last dim) after it
  bool nan = false;       // a NaN in x
  bool store_prologue = false;  // the prologue is an output too (stored at every reduce step)
};

std::vector<Case> cases() {
  return {
      {"pillar max [P, N, C]", {1, 40, 12, 37}, OpId::Max, {2}, false, f32, true, true, false},
      {"pillar max with NaN", {30, 9, 21}, OpId::Max, {1}, false, f32, false, false, true},
      {"sum over H of NCHW", {2, 3, 19, 40}, OpId::Sum, {2}, false, f32, false, true, false},
      {"mean over C keepdim", {2, 24, 5, 17}, OpId::Mean, {1}, true, f32, true, false, false},
      {"min over two outer dims", {6, 7, 33}, OpId::Min, {0, 1}, false, f32, false, false, false},
      {"prod over dim 0", {4, 35}, OpId::Prod, {0}, false, f32, false, true, false},
      {"bf16 max", {3, 11, 48}, OpId::Max, {1}, false, bf16, true, true, false},
      {"bf16 sum, tail only", {5, 13, 7}, OpId::Sum, {1}, false, bf16, false, false, false},
      {"channels-last mean with the prologue stored", {1, 14, 14, 37}, OpId::Mean, {1, 2}, true,
       f32, true, false, false, true},
      {"bf16 max with the prologue stored", {2, 9, 40}, OpId::Max, {1}, false, bf16, true, true,
       false, true},
  };
}

Graph case_graph(const Case& c) {
  Graph g;
  g.name = "lane_reduce";
  ValueId x = g.add_input("x", TensorType(c.dtype, Shape(c.x.begin(), c.x.end())));
  ValueId v = x;
  if (c.prologue) {
    ValueId k = g.add_const(Tensor::scalar(1.5, c.dtype), "k");
    v = g.add_node1(OpId::Relu, {g.add_node1(OpId::Mul, {v, k}, {}, "scale")}, {}, "act");
  }
  Attrs a{{"dims", c.dims}, {"keepdim", c.keepdim}};
  ValueId y = g.add_node1(c.op, {v}, a, "reduce");
  ValueId stored = v;
  if (c.epilogue) {
    SymInt last = g.type(y).shape.back();
    ValueId b = g.add_input("b", TensorType(c.dtype, Shape{last}));
    y = g.add_node1(OpId::Add, {y, b}, {}, "bias");
  }
  g.outputs = {y};
  if (c.store_prologue) g.outputs.push_back(stored);
  return g;
}

TensorList case_inputs(const Case& c, const Graph& g, uint64_t seed) {
  Generator gen(seed);
  TensorList in;
  for (ValueId v : g.inputs) {
    Dims d;
    for (const SymInt& s : g.type(v).shape) d.push_back(s.value());
    // prod: factors near 1, so that the product neither vanishes nor overflows.
    Tensor t = c.op == OpId::Prod ? Tensor::rand(d, gen, 0.8, 1.25, f32) : Tensor::randn(d, gen, f32);
    if (c.nan && v == g.inputs[0]) t.data<float>()[t.numel() / 3] = std::numeric_limits<float>::quiet_NaN();
    in.push_back(t.to(c.dtype));
  }
  return in;
}

}  // namespace

TEST(InductorLaneReductions, OuterDimReductionsAreSimdAndMatchTheReferenceAndTheScalarKernel) {
  for (const char* knobs : {"", "vec=256"}) {
    for (const Case& c : cases()) {
      SCOPED_TRACE(fmt::format("{} ({})", c.name, knobs[0] ? knobs : "default width"));
      Graph g = case_graph(c);
      compiler::Options o;
      if (knobs[0]) o.knobs = compiler::parse_knobs(knobs, "test");
      auto simd = compiler::compile(g, Device::cpu(), o);
      compiler::Options so = o;
      so.vectorize = false;
      auto scalar = compiler::compile(g, Device::cpu(), so);
      int simd_reduces = 0;
      for (const std::string& k : simd->report().kernels)
        simd_reduces += k.find("[reduce, SIMD]") != std::string::npos;
      EXPECT_EQ(simd_reduces, 1) << simd->summary();
      for (uint64_t seed : {51u, 52u, 53u}) {
        TensorList in = case_inputs(c, g, seed);
        TensorList in64;
        for (const Tensor& t : in) in64.push_back(t.to(DType::Float64));
        TensorList wants = run(test::as_float64(g), in64), gots = simd->run(in);
        TensorList got_scalars = scalar->run(in);
        Tensor want = wants[0], got = gots[0], got_scalar = got_scalars[0];
        // float32: a sum of up to 42 terms of O(1) rounds at most ~42 * 2^-24 relative to the
        // largest term; bfloat16: the result's own rounding (2^-9), the inputs being exact.
        double tol = c.dtype == bf16 ? 1e-2 : 2e-5;
        if (c.store_prologue) {
          ASSERT_EQ(gots.size(), 2u);
          test::Comparison pc = test::compare(gots[1], wants[1], test::Tolerance::rel(tol, tol));
          EXPECT_TRUE(pc.ok()) << "stored prologue: " << pc.str();
          EXPECT_TRUE(test::close(gots[1], got_scalars[1], test::Tolerance::exact()))
              << "stored prologue differs from the scalar kernel";
        }
        test::Comparison cmp = test::compare(got, want, test::Tolerance::rel(tol, tol));
        if (c.nan) {
          // The reference propagates NaN through max; the comparison fails on a NaN on one side
          // only, so check the NaN positions directly and the rest elementwise.
          Tensor w = want.to(DType::Float64), h = got.to(DType::Float64);
          int nans = 0;
          for (int64_t i = 0; i < w.numel(); ++i) {
            double a = w.data<double>()[i], b = h.data<double>()[i];
            if (std::isnan(a) || std::isnan(b)) {
              EXPECT_TRUE(std::isnan(a) && std::isnan(b)) << "element " << i;
              ++nans;
            } else {
              EXPECT_NEAR(b, a, tol * (1 + std::fabs(a))) << "element " << i;
            }
          }
          EXPECT_EQ(nans, 1);
        } else {
          EXPECT_TRUE(cmp.ok()) << cmp.str() << "\n" << simd->summary();
        }
        EXPECT_TRUE(test::close(got, got_scalar, test::Tolerance::exact()) || c.nan)
            << "SIMD lanes differ from the scalar kernel\n" << simd->summary();
        if (c.nan) {
          EXPECT_EQ(std::memcmp(got.raw_data(), got_scalar.raw_data(), size_t(got.nbytes())), 0);
        }
      }
    }
  }
}

// The lanes need the innermost kept dim contiguous: a reduction of a transposed read (every
// dim strided) takes whichever kernel applies and still computes the reference's values.
TEST(InductorLaneReductions, TransposedReadComputesTheReferenceValues) {
  Graph g;
  g.name = "strided_kept";
  ValueId x = g.add_input("x", TensorType(f32, Shape{20, 9, 6}));
  ValueId xt = g.add_node1(OpId::Permute, {x}, {{"dims", Ints{2, 1, 0}}}, "t");  // [6, 9, 20]
  ValueId y = g.add_node1(OpId::Sum, {xt}, {{"dims", Ints{1}}, {"keepdim", false}}, "reduce");
  g.outputs = {y};
  auto compiled = compiler::compile(g, Device::cpu(), compiler::Options{});
  Generator gen(61);
  TensorList in = {Tensor::randn({20, 9, 6}, gen, f32)};
  Tensor want = run(test::as_float64(g), {in[0].to(DType::Float64)})[0];
  Tensor got = compiled->run(in)[0];
  test::Comparison cmp = test::compare(got, want, test::Tolerance::rel(2e-5, 2e-5));
  EXPECT_TRUE(cmp.ok()) << cmp.str() << "\n" << compiled->summary();
}

// Note [scalar layer_norm statistics]: ConvNeXt's layer_norm over the channels of a permuted
// NCHW value reads its normalized dim with a stride, so it has no SIMD lanes; its statistics are
// two passes in double. Values far from zero (mean 50, spread 1) check that the variance is taken
// around the mean, not from the raw sums.
TEST(InductorLaneReductions, StridedLayerNormMatchesTheReference) {
  Graph g;
  g.name = "strided_layer_norm";
  ValueId x = g.add_input("x", TensorType(f32, Shape{2, 24, 5, 7}));
  ValueId w = g.add_input("w", TensorType(f32, Shape{24}));
  ValueId b = g.add_input("b", TensorType(f32, Shape{24}));
  ValueId xp = g.add_node1(OpId::Permute, {x}, {{"dims", Ints{0, 2, 3, 1}}}, "to_nhwc");
  ValueId y = g.add_node1(OpId::LayerNorm, {xp, w, b},
                          {{"normalized_shape", Ints{24}}, {"eps", 1e-6}}, "norm");
  g.outputs = {y};
  auto compiled = compiler::compile(g, Device::cpu(), compiler::Options{});
  for (uint64_t seed : {81u, 82u, 83u}) {
    Generator gen(seed);
    Tensor xv = Tensor::randn({2, 24, 5, 7}, gen, f32);
    float* p = xv.data<float>();
    for (int64_t i = 0; i < xv.numel(); ++i) p[i] += 50.0f;
    TensorList in = {xv, Tensor::randn({24}, gen, f32), Tensor::randn({24}, gen, f32)};
    TensorList in64;
    for (const Tensor& t : in) in64.push_back(t.to(DType::Float64));
    Tensor want = run(test::as_float64(g), in64)[0];
    Tensor got = compiled->run(in)[0];
    // The inputs are exact; the normalized values are O(1) with float32 rounding of x - mean
    // (|x| ~ 50: 50 * 2^-24 ~ 3e-6 absolute) times |w| ~ 3.
    test::Comparison cmp = test::compare(got, want, test::Tolerance::rel(1e-4, 1e-4));
    EXPECT_TRUE(cmp.ok()) << cmp.str() << "\n" << compiled->summary();
  }
}
