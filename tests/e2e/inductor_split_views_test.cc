// Split inside compiled CPU graphs (Note [split as slices] in ops/shape.cc): the CPU target
// decomposes split into slices, which the loop kernels read in place, so a GRU cell's gates
// (one linear's output split three ways along the features, each piece into its own pointwise
// chain) cost no copy launch; a piece that is a graph output or a matmul operand is still
// materialized correctly. Checked against the float64 reference on fresh random inputs.
#include <gtest/gtest.h>

#include <string>

#include <fmt/format.h>

#include "../support/compare.h"
#include "compiler/compile.h"
#include "ir/graph.h"
#include "ir/interpreter.h"

using namespace kiln;

namespace {

const DType f32 = DType::Float32;

Graph as_float64(const Graph& g) {
  Graph h = g;
  for (Value& v : h.values) {
    if (!is_floating(v.type.dtype)) continue;
    v.type.dtype = DType::Float64;
    if (v.data.defined()) v.data = v.data.to(DType::Float64);
  }
  return h;
}

// h' = (1 - z) * n + z * h with [r, z, n] split from gi = x W_i^T and gh = h W_h^T (a GRU cell
// without biases), plus a piece of gh returned as it is and one fed to a matmul.
Graph gru_cell_graph(Generator& gen) {
  Graph g;
  g.name = "gru_cell";
  const int64_t B = 12, I = 20, H = 24;
  ValueId x = g.add_input("x", TensorType(f32, Shape{B, I}));
  ValueId h = g.add_input("h", TensorType(f32, Shape{B, H}));
  ValueId wi = g.add_param("w_i", Tensor::randn({3 * H, I}, gen, f32));
  ValueId wh = g.add_param("w_h", Tensor::randn({3 * H, H}, gen, f32));
  ValueId m = g.add_param("m", Tensor::randn({H, 5}, gen, f32));
  ValueId gi = g.add_node1(OpId::Linear, {x, wi}, {}, "gi");
  ValueId gh = g.add_node1(OpId::Linear, {h, wh}, {}, "gh");
  Attrs thirds{{"sizes", Ints{H, H, H}}, {"dim", int64_t(1)}};
  std::vector<ValueId> pi = g.add_node(OpId::Split, {gi}, thirds, "split_i");
  std::vector<ValueId> ph = g.add_node(OpId::Split, {gh}, thirds, "split_h");
  ValueId r = g.add_node1(OpId::Sigmoid, {g.add_node1(OpId::Add, {pi[0], ph[0]}, {}, "r_in")}, {}, "r");
  ValueId z = g.add_node1(OpId::Sigmoid, {g.add_node1(OpId::Add, {pi[1], ph[1]}, {}, "z_in")}, {}, "z");
  ValueId rn = g.add_node1(OpId::Mul, {r, ph[2]}, {}, "r_n");
  ValueId n = g.add_node1(OpId::Tanh, {g.add_node1(OpId::Add, {pi[2], rn}, {}, "n_in")}, {}, "n");
  ValueId one = g.add_const(Tensor::scalar(1.0, f32), "one");
  ValueId keep = g.add_node1(OpId::Sub, {one, z}, {}, "keep");
  ValueId hn = g.add_node1(OpId::Add, {g.add_node1(OpId::Mul, {keep, n}, {}, "new_part"),
                                       g.add_node1(OpId::Mul, {z, h}, {}, "old_part")},
                           {}, "h_next");
  ValueId proj = g.add_node1(OpId::Matmul, {pi[1], m}, {}, "proj");  // a piece into a matmul
  g.outputs = {hn, ph[2], proj};                                     // and one as an output
  return g;
}

}  // namespace

TEST(InductorSplitViews, GruGatesSplitWithoutCopyLaunchesAndMatchTheReference) {
  Generator wgen(71);
  Graph g = gru_cell_graph(wgen);
  auto compiled = compiler::compile(g, Device::cpu(), compiler::Options{});
  const compiler::CompileReport& r = compiled->report();
  EXPECT_EQ(r.eager_launches, 0) << compiled->summary();
  for (const std::string& k : r.kernels)
    EXPECT_EQ(k.rfind("split:", 0), std::string::npos) << "a split launch: " << k;
  for (uint64_t seed : {72u, 73u, 74u}) {
    Generator gen(seed);
    TensorList in = {Tensor::randn({12, 20}, gen, f32), Tensor::randn({12, 24}, gen, f32)};
    TensorList in64 = {in[0].to(DType::Float64), in[1].to(DType::Float64)};
    TensorList want = run(as_float64(g), in64);
    TensorList got = compiled->run(in);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      // Sums of 20-24 products of N(0,1) terms: float32 rounding ~1e-6 relative to their size.
      test::Comparison c = test::compare(got[i], want[i], test::Tolerance::rel(1e-4, 1e-4));
      EXPECT_TRUE(c.ok()) << "output " << i << " seed " << seed << ": " << c.str() << "\n"
                          << compiled->summary();
    }
  }
}
