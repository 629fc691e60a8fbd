// Split and concat of views inside compiled CPU graphs (Note [split as slices] in ops/shape.cc): the CPU target
// decomposes split into slices, which the loop kernels read in place, so a GRU cell's gates
// (one linear's output split three ways along the features, each piece into its own pointwise
// chain) cost no copy launch; a piece that is a graph output or a matmul operand is still
// materialized correctly. Checked against the float64 reference on fresh random inputs.
#include <gtest/gtest.h>

#include <string>

#include <fmt/format.h>

#include "../support/compare.h"
#include "../support/graph_inputs.h"
#include "compiler/compile.h"
#include "ir/graph.h"
#include "ir/interpreter.h"
#include "runtime/package.h"

using namespace kiln;

namespace {

const DType f32 = DType::Float32;

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
    TensorList want = run(test::as_float64(g), in64);
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

// Note [concat part geometry] (compiler/bind.cc): concat over views, as swin_t exports them —
// torch.roll as two slices concatenated (along H: contiguous blocks of the base; along W:
// strided rows), patch merging as four step-2 slices concatenated along the channels — plus a
// transposed part and an odd channel count (no widening). The runtime's byte copies must give
// exactly the reference's values, and a package of the graph the same bits.
TEST(InductorSplitViews, ConcatOfViewsMatchesTheReferenceAndPackages) {
  for (int64_t c : {int64_t(8), int64_t(5)}) {
    SCOPED_TRACE(fmt::format("{} channels", c));
    Graph g;
    g.name = "concat_views";
    // Computed values (views of graph inputs get copies first: compiler/insert_copies.h).
    ValueId x = g.add_node1(OpId::Neg, {g.add_input("x", TensorType(f32, Shape{1, 6, 8, c}))}, {}, "nx");
    ValueId t = g.add_node1(OpId::Neg, {g.add_input("t", TensorType(f32, Shape{1, 8, 6, c}))}, {}, "nt");
    auto slice = [&](ValueId v, int64_t dim, int64_t a, int64_t b, int64_t step, const char* name) {
      return g.add_node1(OpId::Slice, {v}, {{"dim", dim}, {"start", a}, {"end", b}, {"step", step}},
                         name);
    };
    auto cat = [&](std::vector<ValueId> parts, int64_t dim, const char* name) {
      return g.add_node1(OpId::Concat, parts, {{"dim", dim}}, name);
    };
    ValueId h = cat({slice(x, 1, 4, 6, 1, "h_tail"), slice(x, 1, 0, 4, 1, "h_head")}, 1, "roll_h");
    ValueId w = cat({slice(h, 2, 5, 8, 1, "w_tail"), slice(h, 2, 0, 5, 1, "w_head")}, 2, "roll_w");
    ValueId x0 = slice(slice(w, 1, 0, 6, 2, "r0"), 2, 0, 8, 2, "c0");
    ValueId x1 = slice(slice(w, 1, 1, 6, 2, "r1"), 2, 0, 8, 2, "c1");
    ValueId x2 = slice(slice(w, 1, 0, 6, 2, "r2"), 2, 1, 8, 2, "c2");
    ValueId x3 = slice(slice(w, 1, 1, 6, 2, "r3"), 2, 1, 8, 2, "c3");
    ValueId merged = cat({x0, x1, x2, x3}, 3, "merge");
    ValueId tt = g.add_node1(OpId::Transpose, {t}, {{"dim0", int64_t(1)}, {"dim1", int64_t(2)}}, "tt");
    ValueId mixed = cat({tt, w}, 3, "mixed");
    g.outputs = {w, merged, mixed};
    auto compiled = compiler::compile(g, Device::cpu(), compiler::Options{});
    EXPECT_EQ(compiled->report().eager_launches, 0) << compiled->summary();
    int concats = 0;
    for (const std::string& k : compiled->report().kernels)
      concats += k.find("[runtime kernel concat]") != std::string::npos;
    EXPECT_EQ(concats, 4) << compiled->summary();
    LoadedPackage loaded =
        load_package_bytes(package_bytes(compiled->executable(), PackageInfo{}), "concat_views");
    for (uint64_t seed : {91u, 92u}) {
      Generator gen(seed);
      TensorList in = {Tensor::randn({1, 6, 8, c}, gen, f32), Tensor::randn({1, 8, 6, c}, gen, f32)};
      TensorList in64 = {in[0].to(DType::Float64), in[1].to(DType::Float64)};
      TensorList want = run(test::as_float64(g), in64);
      TensorList got = compiled->run(in), pkg = loaded.exe->run(in);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_TRUE(test::close(got[i], want[i].to(f32), test::Tolerance::exact()))
            << "output " << i << " seed " << seed << "\n" << compiled->summary();
        EXPECT_TRUE(test::close(pkg[i], got[i], test::Tolerance::exact())) << "packaged output " << i;
      }
    }
  }
}
