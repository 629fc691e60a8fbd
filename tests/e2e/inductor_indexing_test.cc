// Indexing ops inside compiled CPU graphs (Note [Indexed loads] in lower/loop_ir.h): a small
// graph with grid_sample, gather, index_select, embedding and scatter_add, read through views
// (permuted and expanded inputs, so the generated kernels see non-contiguous strides), mixed
// with pointwise neighbours they fuse with, must compile with no eager launch and match the
// interpreter (the ops' eager kernels, node by node) on fresh random inputs: negative and
// repeated indices, duplicate scatter targets, grid coordinates far outside [-1, 1], infinite
// and NaN coordinates. A bad index must be a kiln::Error naming the node, never a read or write
// outside a buffer.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "../support/compare.h"
#include "../support/compile_report.h"
#include "../support/files.h"
#include "../support/graph_inputs.h"
#include "compiler/compile.h"
#include "core/error.h"
#include "ir/graph.h"
#include "ir/interpreter.h"
#include "runtime/package.h"

using namespace kiln;

namespace {

const DType f32 = DType::Float32, i64 = DType::Int64, i32 = DType::Int32;

// grid_sample of a permuted x, scaled and relu'd; gather along W of a permuted x with a
// computed index; index_select of a transposed view; embedding + residual; PointPillars-style
// scatter of per-pillar features into a flattened grid with an expanded index, then concat.
Graph indexing_graph() {
  Graph g;
  g.name = "indexing_block";
  ValueId x = g.add_input("x", TensorType(f32, Shape{2, 10, 12, 8}));  // permuted to [2,8,10,12]
  ValueId grid = g.add_input("grid", TensorType(f32, Shape{2, 5, 7, 2}));
  ValueId w = g.add_input("w", TensorType(f32, Shape{2, 8, 5, 7}));
  ValueId gidx = g.add_input("gidx", TensorType(i64, Shape{2, 8, 10, 6}));
  ValueId sel = g.add_input("sel", TensorType(i32, Shape{5}));
  ValueId table = g.add_input("table", TensorType(f32, Shape{9, 6}));
  ValueId ids = g.add_input("ids", TensorType(i64, Shape{3, 4}));
  ValueId feats = g.add_input("feats", TensorType(f32, Shape{20, 8}));  // [P, C], transposed
  ValueId pillar = g.add_input("pillar", TensorType(i64, Shape{1, 20}));
  ValueId bev = g.add_input("bev", TensorType(f32, Shape{8, 30}));

  ValueId xn = g.add_node1(OpId::Permute, {x}, {{"dims", Ints{0, 3, 1, 2}}}, "to_nchw");
  ValueId s = g.add_node1(OpId::GridSample, {xn, grid}, {{"align_corners", false}}, "sample");
  ValueId sw = g.add_node1(OpId::Mul, {s, w}, {}, "weigh");
  ValueId y0 = g.add_node1(OpId::Relu, {sw}, {}, "act");

  // gather along dim 3 (W = 12) with index (gidx - 3): negative values wrap.
  ValueId three = g.add_const(Tensor::scalar(3, i64), "three");
  ValueId gi = g.add_node1(OpId::Sub, {gidx, three}, {}, "shift");
  ValueId ga = g.add_node1(OpId::Gather, {xn, gi}, {{"dim", int64_t(3)}}, "pick");
  ValueId y1 = g.add_node1(OpId::Tanh, {ga}, {}, "squash");

  ValueId xt = g.add_node1(OpId::Transpose, {xn}, {{"dim0", int64_t(1)}, {"dim1", int64_t(2)}}, "swap");
  ValueId y2 = g.add_node1(OpId::IndexSelect, {xt, sel}, {{"dim", int64_t(1)}}, "rows");

  ValueId e = g.add_node1(OpId::Embedding, {table, ids}, {}, "embed");
  ValueId one = g.add_const(Tensor::scalar(1.0, f32), "one");
  ValueId y3 = g.add_node1(OpId::Add, {e, one}, {}, "plus_one");

  ValueId ft = g.add_node1(OpId::Transpose, {feats}, {{"dim0", int64_t(0)}, {"dim1", int64_t(1)}}, "ct");
  ValueId px = g.add_node1(OpId::Expand, {pillar}, {{"shape", Ints{8, 20}}}, "per_channel");
  ValueId sc = g.add_node1(OpId::ScatterAdd, {bev, px, ft}, {{"dim", int64_t(1)}}, "scatter");
  ValueId y4 = g.add_node1(OpId::Concat, {sc, bev}, {{"dim", int64_t(0)}}, "stack");
  g.outputs = {y0, y1, y2, y3, y4};
  return g;
}

TensorList indexing_inputs(uint64_t seed) {
  Generator gen(seed);
  Tensor grid = Tensor::rand({2, 5, 7, 2}, gen, -1.6, 1.6, f32);
  float* gp = grid.data<float>();
  gp[3] = 40.0f;  // far outside: every tap out of range
  gp[10] = -std::numeric_limits<float>::infinity();
  gp[17] = std::numeric_limits<float>::quiet_NaN();
  gp[30] = 1.0f;   // exactly on the border
  gp[31] = -1.0f;
  return {Tensor::randn({2, 10, 12, 8}, gen, f32),
          grid,
          Tensor::randn({2, 8, 5, 7}, gen, f32),
          Tensor::randint({2, 8, 10, 6}, gen, -9, 15, i64),  // minus 3: [-12, 12)
          Tensor::randint({5}, gen, -10, 10, i32),
          Tensor::randn({9, 6}, gen, f32),
          Tensor::randint({3, 4}, gen, -9, 9, i64),
          Tensor::randn({20, 8}, gen, f32),
          Tensor::randint({1, 20}, gen, -30, 30, i64),  // 20 pillars into 30 cells: duplicates
          Tensor::randn({8, 30}, gen, f32)};
}

}  // namespace

TEST(InductorIndexing, CompilesWithoutEagerLaunchesAndMatchesTheInterpreter) {
  Graph g = indexing_graph();
  auto compiled = compiler::compile(g, Device::cpu(), compiler::Options{});
  const compiler::CompileReport& r = compiled->report();
  EXPECT_EQ(r.eager_launches, 0) << compiled->summary();
  for (uint64_t seed : {21u, 22u, 23u}) {
    TensorList in = indexing_inputs(seed);
    TensorList want = run(g, in);
    TensorList got = compiled->run(in);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(test::close(got[i], want[i], test::Tolerance::rel(1e-5, 1e-5)))
          << "output " << i << " seed " << seed << "\n" << compiled->summary();
  }
  // Every launch has a record: the graph packages, and the loaded package computes the same
  // bits (its checked loop kernels rebuilt with their index checks).
  LoadedPackage loaded =
      load_package_bytes(package_bytes(compiled->executable(), PackageInfo{}), "indexing_block");
  TensorList in = indexing_inputs(24);
  TensorList want = compiled->run(in), got = loaded.exe->run(in);
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(test::close(got[i], want[i], test::Tolerance::exact())) << "packaged output " << i;
  in[6].data<int64_t>()[5] = 9;  // ids: out of range for the 9-row table
  try {
    loaded.exe->run(in);
    ADD_FAILURE() << "the loaded package read embedding row 9 of 9";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("embed"), std::string::npos) << e.what();
  }
}

// A grid_sample alone: x [2, 9, 11, channels] permuted to NCHW (so its channels are contiguous),
// sampled at a [2, 17, 31] grid.
static Graph permuted_grid_sample(const std::string& name, int64_t channels, bool align_corners) {
  Graph g;
  g.name = name;
  ValueId x = g.add_input("x", TensorType(f32, Shape{2, 9, 11, channels}));
  ValueId grid = g.add_input("grid", TensorType(f32, Shape{2, 17, 31, 2}));
  ValueId xn = g.add_node1(OpId::Permute, {x}, {{"dims", Ints{0, 3, 1, 2}}}, "to_nchw");
  g.outputs = {g.add_node1(OpId::GridSample, {xn, grid}, {{"align_corners", align_corners}}, "sample")};
  return g;
}

// Note [grid_sample tap tables]: a grid_sample alone in its kernel, its grid shared by every
// channel, computes each block of sampling points' taps once and reads them for every channel.
// 2 x 17 x 31 points (blocks of 256: two full and a partial one per batch), 5 channels of a
// permuted x, coordinates far outside, infinite, NaN and on the border, both align_corners:
// the kernel takes the tables (its source says so) and matches the interpreter. The same for
// samples weighted and summed over the sampling points (the Reduce form).
TEST(InductorIndexing, StandaloneGridSampleUsesTapTablesAndMatchesTheInterpreter) {
  const test::DumpDir dump_dir("kiln_grid_taps");
  const std::string& dump = dump_dir.path;
  // Compiles g (inputs x, grid and maybe w) and checks it against the interpreter on fresh
  // inputs of two seeds: normal values, the grid uniform in [-1.3, 1.3] but for `extremes`.
  auto check = [](const Graph& g, uint64_t seed0, std::vector<std::pair<size_t, float>> extremes) {
    // 16-lane vectors (this machine's AVX-512, where it has it), then 8-lane ones (AVX2's
    // kernels: their masked loads and gathers).
    for (const char* vec : {"512", "256"}) {
    compiler::Options options;
    options.knobs.set("vec", vec);
    auto compiled = compiler::compile(g, Device::cpu(), options);
    EXPECT_EQ(compiled->report().eager_launches, 0) << compiled->summary();
    for (uint64_t seed : {seed0, seed0 + 1}) {
      Generator gen(seed);
      TensorList in;
      for (ValueId v : g.inputs) {
        Dims d;
        for (const SymInt& e : g.type(v).shape) d.push_back(e.value());
        if (g.value(v).name != "grid") {
          in.push_back(Tensor::randn(d, gen, f32));
          continue;
        }
        in.push_back(Tensor::rand(d, gen, -1.3, 1.3, f32));
        for (auto [i, value] : extremes) in.back().data<float>()[i] = value;
      }
      TensorList want = run(g, in), got = compiled->run(in);
      EXPECT_TRUE(test::close(got[0], want[0], test::Tolerance::rel(1e-5, 1e-5)))
          << g.name << " seed " << seed << " vec " << vec << "\n" << compiled->summary();
    }
    }
  };
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (bool ac : {false, true}) {
    const Graph g = permuted_grid_sample(ac ? "grid_taps_ac" : "grid_taps", 5, ac);
    // far outside, infinite, NaN (in the second block), on the border
    check(g, 31, {{7, 25.0f}, {100, -inf}, {513, nan}, {1040, 1.0f}, {1041, -1.0f}});
  }
  // The Reduce form (multi-scale deformable attention): the samples weighted and summed over the
  // sampling points, one kernel whose tables hold a tile of queries' points: 19 queries of 4
  // points are a tile of 16 (64 rows, filled as whole vectors) and one of 3 (12 rows: the
  // fill's scalar tail), extremes in both. With 37 channels (contiguous in x) the kernel runs
  // SIMD lanes along them: two full vectors and a scalar tail of 5 (AVX-512), checked against
  // the same interpreter.
  for (auto [ac, channels] : {std::pair{false, 6}, std::pair{true, 6}, std::pair{false, 37}, std::pair{true, 37}}) {
    Graph g;
    g.name = fmt::format("grid_sum{}_c{}", ac ? "_ac" : "", channels);
    ValueId x = g.add_input("x", TensorType(f32, Shape{2, 9, 11, channels}));
    ValueId grid = g.add_input("grid", TensorType(f32, Shape{2, 19, 4, 2}));
    ValueId w = g.add_input("w", TensorType(f32, Shape{2, 1, 19, 4}));
    ValueId xn = g.add_node1(OpId::Permute, {x}, {{"dims", Ints{0, 3, 1, 2}}}, "to_nchw");
    ValueId sm = g.add_node1(OpId::GridSample, {xn, grid}, {{"align_corners", ac}}, "sample");
    ValueId wt = g.add_node1(OpId::Mul, {sm, w}, {}, "weigh");
    g.outputs = {g.add_node1(OpId::Sum, {wt}, {{"dims", Ints{-1}}, {"keepdim", false}}, "points")};
    check(g, 33, {{3, 25.0f}, {20, inf}, {41, nan}, {141, nan}, {150, -inf}, {300, -3.0f}});
  }
  int tabled = 0, reduced = 0, lanes = 0, gathers = 0;
  for (const auto& f : std::filesystem::directory_iterator(dump)) {
    std::ifstream in(f.path());
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.find("tap tables across dim") == std::string::npos) continue;
    ++tabled;
    if (text.find("// reduce over") != std::string::npos) ++reduced;
    if (text.find("SIMD lanes along dim 1") != std::string::npos) ++lanes;
    if (text.find("SIMD gathers along dim 2") != std::string::npos) ++gathers;
  }
  // Each graph at both widths (the width is in the source: a unit each).
  EXPECT_EQ(tabled, 12) << "dumped sources in " << dump;
  EXPECT_EQ(reduced, 8) << "dumped sources in " << dump;
  EXPECT_EQ(lanes, 8) << "dumped sources in " << dump;  // every Reduce form (C = 6: the tail only)
  EXPECT_EQ(gathers, 4) << "dumped sources in " << dump;  // every Pointwise form ([2, 5, 527])
}

// Note [grid_sample channels-last] (targets/cpu/emitter.cc): a grid_sample whose source is
// contiguous along the channels (32 of them: whole 16- and 8-lane runs) runs its points in tiles
// of KN_W points x KN_W channels through a transpose; 2 x 17 x 31 points in blocks of 256 leave
// a block of 15 (at 16 lanes all scalar, at 8 lanes one tile and 7 scalar). Coordinates far
// outside, infinite, NaN (in every block) and on the border, both align_corners, both widths:
// it matches the float64 interpreter, and gives the same bits as the scalar kernel
// (vectorize off). Then the pass that arranges such a source (passes/grid_sample_layout.h):
// two grid_samples of one NCHW input with 32 channels share one channels-last copy, run the
// tiles, and match the interpreter; a single small sample of the same input is left alone.
TEST(InductorIndexing, ChannelsLastGridSampleRunsTransposedTilesAndMatchesTheReference) {
  const test::DumpDir dump("kiln_grid_tiles");
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Fresh inputs of `seed`: x normal, grids uniform in [-1.3, 1.3] with the extremes.
  auto inputs = [&](const Graph& g, uint64_t seed) {
    TensorList in = test::graph_test_inputs(g, {}, false, seed);
    Generator gen(seed + 100);
    for (size_t i = 0; i < g.inputs.size(); ++i) {
      if (g.value(g.inputs[i]).name.rfind("grid", 0) != 0) continue;
      in[i] = Tensor::rand(in[i].sizes(), gen, -1.3, 1.3, f32);
      float* p = in[i].data<float>();
      const int64_t n = in[i].numel();
      for (auto [at, v] : {std::pair<int64_t, float>{7, 25.0f}, {100, -inf}, {513, nan},
                           {1040, 1.0f}, {1041, -1.0f}, {n - 4, nan}, {n - 9, inf}})
        if (at < n) p[at] = v;
    }
    return in;
  };
  auto check = [&](const Graph& g, int nonfinite_at_least) {
    for (uint64_t seed : {51u, 52u}) {
      TensorList in = inputs(g, seed);
      TensorList in64;
      for (const Tensor& t : in) in64.push_back(t.to(DType::Float64));
      const TensorList want = run(test::as_float64(g), in64);
      compiler::Options scalar_options;
      scalar_options.vectorize = false;
      const TensorList scalar = compiler::compile(g, Device::cpu(), scalar_options)->run(in);
      for (const char* vec : {"512", "256"}) {
        compiler::Options options;
        options.knobs.set("vec", vec);
        auto compiled = compiler::compile(g, Device::cpu(), options);
        EXPECT_EQ(compiled->report().eager_launches, 0) << compiled->summary();
        const TensorList got = compiled->run(in);
        for (size_t o = 0; o < got.size(); ++o) {
          int64_t nonfinite = 0;
          for (int64_t i = 0; i < want[o].numel(); ++i) nonfinite += !std::isfinite(want[o].data<double>()[i]);
          EXPECT_GE(nonfinite, nonfinite_at_least) << g.name << " output " << o << ": the oracle's NaNs";
          EXPECT_TRUE(test::close(got[o], want[o], test::Tolerance::rel(1e-5, 1e-5)))
              << g.name << " output " << o << " seed " << seed << " vec " << vec << "\n" << compiled->summary();
          EXPECT_TRUE(test::close(got[o], scalar[o], test::Tolerance::exact()))
              << g.name << " output " << o << " seed " << seed << " vec " << vec << ": not the scalar kernel's bits";
        }
      }
    }
  };
  const std::string marker = "in tiles transposed to dim";
  for (bool ac : {false, true}) {
    const Graph g = permuted_grid_sample(ac ? "grid_tiles_ac" : "grid_tiles", 32, ac);
    check(g, 2 * 32);  // two NaN coordinates: 32 channels each
  }
  EXPECT_EQ(dump.count(marker), 4) << "dumped sources in " << dump.path;

  // The pass: x NCHW [1, 32, 12, 10], two grid_samples of 9 x 13 points (7488 outputs >= 3840).
  Graph g;
  g.name = "grid_tiles_nchw";
  ValueId x = g.add_input("x", TensorType(f32, Shape{1, 32, 12, 10}));
  ValueId g1 = g.add_input("grid1", TensorType(f32, Shape{1, 9, 13, 2}));
  ValueId g2 = g.add_input("grid2", TensorType(f32, Shape{1, 9, 13, 2}));
  ValueId a = g.add_node1(OpId::GridSample, {x, g1}, {{"align_corners", true}}, "sample1");
  ValueId b = g.add_node1(OpId::GridSample, {x, g2}, {{"align_corners", false}}, "sample2");
  g.outputs = {a, b};
  const int before = dump.count(marker);
  check(g, 32);  // one NaN coordinate per grid
  // Each of the two grid_samples, at both widths.
  EXPECT_EQ(dump.count(marker) - before, 4) << "dumped sources in " << dump.path;
  // The compiler's passes made one copy, which both grid_samples read.
  auto copies = [](Graph graph) {
    compiler::run_compiler_passes(graph, compiler::target_for(Device::cpu()), f32);
    int n = 0;
    for (const Node& node : graph.nodes) n += node.op == OpId::Copy;
    return n;
  };
  EXPECT_EQ(copies(g), 1);
  // One small sample (3 x 4 points: 384 outputs < 3840 elements): no copy.
  Graph small;
  small.name = "grid_small";
  ValueId sx = small.add_input("x", TensorType(f32, Shape{1, 32, 12, 10}));
  ValueId sg = small.add_input("grid", TensorType(f32, Shape{1, 3, 4, 2}));
  small.outputs = {small.add_node1(OpId::GridSample, {sx, sg}, {{"align_corners", false}}, "sample")};
  EXPECT_EQ(copies(small), 0);
}

// Note [grid sums stored channels innermost] (lower/scheduler.cc) and Note [grid taps per point]
// (targets/cpu/emitter.cc): msda's chain of levels, each a grid_sample weighted and reduced over
// its 4 points, each level's running sum read by the next level's epilogue; three levels (the
// last a mean), 32 channels contiguous in x (whole 16- and 8-lane runs: the per-point form).
// The two inner sums are stored channels innermost, the last (the graph's output) row-major.
// Compiled with grid_sums=inner and =plain at both vector widths: each matches the float64
// interpreter, and the layouts give the same bits. The grids hold NaN, infinite and far-outside
// coordinates; the outputs they reach are NaN in the oracle and in every build.
TEST(InductorIndexing, GridSumChainsStoreChannelsInnermostAndMatchTheReference) {
  const test::DumpDir dump_dir("kiln_grid_chain");
  const std::string& dump = dump_dir.path;
  const int64_t C = 32, Q = 19;
  const std::pair<int64_t, int64_t> levels[] = {{9, 11}, {5, 7}, {3, 4}};
  Graph g;
  g.name = "grid_chain";
  ValueId acc = kNoValue;
  for (int l = 0; l < 3; ++l) {
    ValueId x = g.add_input(fmt::format("x{}", l), TensorType(f32, Shape{2, levels[l].first, levels[l].second, C}));
    ValueId grid = g.add_input(fmt::format("grid{}", l), TensorType(f32, Shape{2, Q, 4, 2}));
    ValueId w = g.add_input(fmt::format("w{}", l), TensorType(f32, Shape{2, 1, Q, 4}));
    ValueId xn = g.add_node1(OpId::Permute, {x}, {{"dims", Ints{0, 3, 1, 2}}}, fmt::format("nchw{}", l));
    ValueId sm = g.add_node1(OpId::GridSample, {xn, grid}, {{"align_corners", l == 1}}, fmt::format("sample{}", l));
    ValueId wt = g.add_node1(OpId::Mul, {sm, w}, {}, fmt::format("weigh{}", l));
    ValueId red = g.add_node1(l == 2 ? OpId::Mean : OpId::Sum, {wt}, {{"dims", Ints{-1}}, {"keepdim", false}},
                              fmt::format("level{}", l));
    acc = acc == kNoValue ? red : g.add_node1(OpId::Add, {red, acc}, {}, fmt::format("run{}", l));
  }
  g.outputs = {acc};
  // The layouts the scheduler chose ([2, 32, 19] sums: n, then the query, then the channel).
  const std::string sched = compiler::describe_schedule(g, compiler::target_for(Device::cpu()));
  EXPECT_NE(sched.find("-> %level0 strides [608, 1, 32, 0]"), std::string::npos) << sched;
  EXPECT_NE(sched.find("-> %run1 strides [608, 1, 32, 0]"), std::string::npos) << sched;
  EXPECT_NE(sched.find("-> %run2 strides [608, 19, 1, 0]"), std::string::npos) << sched;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (uint64_t seed : {41u, 42u}) {
    // Normal values; the grids uniform in [-1.3, 1.3], with the extremes.
    TensorList in = test::graph_test_inputs(g, {}, false, seed);
    Generator gen(seed + 100);
    for (size_t i = 0; i < g.inputs.size(); ++i) {
      const std::string& name = g.value(g.inputs[i]).name;
      if (name.rfind("grid", 0) != 0) continue;
      in[i] = Tensor::rand(in[i].sizes(), gen, -1.3, 1.3, f32);
      float* p = in[i].data<float>();
      if (name == "grid0") p[5] = 30.0f, p[40] = nan, p[151] = -inf;
      if (name == "grid1") p[77] = inf, p[200] = -1.0f, p[201] = 1.0f;
      if (name == "grid2") p[9] = nan;
    }
    TensorList in64;
    for (const Tensor& t : in) in64.push_back(t.to(DType::Float64));
    const Tensor want = run(test::as_float64(g), in64)[0];
    // The two NaN coordinates (grid0's point 0 of query 5, grid2's of query 1, both in sample
    // 0) make their 32 channels NaN; every other output is finite and they are not all zero.
    int64_t non_finite = 0, zeros = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      const double v = want.data<double>()[i];
      non_finite += !std::isfinite(v);
      zeros += v == 0.0;
    }
    ASSERT_EQ(non_finite, 2 * C) << "the oracle's outputs";
    ASSERT_LT(zeros, want.numel() / 10) << "the oracle's outputs";
    Tensor first;
    for (const char* vec : {"512", "256"})
      for (const char* sums : {"inner", "plain"}) {
        compiler::Options options;
        options.knobs.set("vec", vec);
        options.knobs.set("grid_sums", sums);
        auto compiled = compiler::compile(g, Device::cpu(), options);
        EXPECT_EQ(compiled->report().eager_launches, 0) << compiled->summary();
        Tensor got = compiled->run(in)[0];
        EXPECT_TRUE(test::close(got, want, test::Tolerance::rel(1e-5, 1e-5)))
            << "seed " << seed << " vec " << vec << " grid_sums " << sums << "\n" << compiled->summary();
        if (std::string(sums) == "inner") {
          first = got;
        } else {
          EXPECT_TRUE(test::close(got, first, test::Tolerance::exact()))
              << "seed " << seed << " vec " << vec << ": the layouts gave different bits";
        }
      }
  }
  // The per-point form ran: every level's kernel, at both widths, both layouts.
  int per_point = 0;
  for (const auto& f : std::filesystem::directory_iterator(dump)) {
    std::ifstream in(f.path());
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (size_t at = text.find("VF vacc_[32 / KN_W];"); at != std::string::npos;
         at = text.find("VF vacc_[32 / KN_W];", at + 1))
      ++per_point;
  }
  EXPECT_EQ(per_point, 12) << "dumped sources in " << dump;
  // Any other value of the knob is refused, naming it.
  compiler::Options bad;
  bad.knobs.set("grid_sums", "sideways");
  const std::string refused = test::compile_error(g, Device::cpu(), bad);
  EXPECT_NE(refused.find("knob grid_sums expected inner or plain, found 'sideways'"), std::string::npos)
      << refused;
}

// The index computed in the kernel that would read through it: index_select of a 1-d x has the
// index's shape, so the scheduler could fuse where(ids != ignore, ids, 0) into the index_select's
// kernel, whose index is a load from memory — read before that kernel stored it (ONNX
// NegativeLogLikelihoodLoss with ignore_index came out wrong, or failed on garbage indices).
// Also the same for embedding and for gather, whose index may be a register.
TEST(InductorIndexing, IndexComputedInTheSameLoopIsNotReadFromStaleMemory) {
  Graph g;
  g.name = "computed_index";
  ValueId w = g.add_input("w", TensorType(f32, Shape{5}));
  ValueId ids = g.add_input("ids", TensorType(i64, Shape{6}));
  ValueId table = g.add_input("table", TensorType(f32, Shape{5, 3}));
  ValueId x2 = g.add_input("x2", TensorType(f32, Shape{6, 5}));
  ValueId ignore = g.add_const(Tensor::scalar(int64_t(2), i64), "ignore");
  ValueId zero = g.add_const(Tensor::scalar(int64_t(0), i64), "zero");
  ValueId keep = g.add_node1(OpId::Ne, {ids, ignore}, {}, "keep");
  ValueId safe = g.add_node1(OpId::Where, {keep, ids, zero}, {}, "safe");
  ValueId picked = g.add_node1(OpId::IndexSelect, {w, safe}, {{"dim", int64_t(0)}}, "weight_of");
  ValueId y0 = g.add_node1(OpId::Neg, {picked}, {}, "neg");
  ValueId y1 = g.add_node1(OpId::Embedding, {table, safe}, {}, "rows");
  ValueId col = g.add_node1(OpId::Unsqueeze, {safe}, {{"dims", Ints{1}}}, "col");
  ValueId y2 = g.add_node1(OpId::Gather, {x2, col}, {{"dim", int64_t(1)}}, "pick");
  g.outputs = {y0, y1, y2};
  auto compiled = compiler::compile(g, Device::cpu(), compiler::Options{});
  for (uint64_t seed : {31u, 32u, 33u}) {
    Generator gen(seed);
    TensorList in = {Tensor::randn({5}, gen, f32), Tensor::randint({6}, gen, -5, 5, i64),
                     Tensor::randn({5, 3}, gen, f32), Tensor::randn({6, 5}, gen, f32)};
    in[1].data<int64_t>()[1] = 2;  // ignored: becomes 0
    TensorList want = run(g, in);
    TensorList got = compiled->run(in);
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(test::close(got[i], want[i], test::Tolerance::exact()))
          << "output " << i << " seed " << seed << "\n" << compiled->summary();
  }
}

// Each op alone with an index out of range: the interpreter and the compiled graph both raise
// a kiln::Error that names the node; the compiled kernel never touches memory outside its
// buffers (the tests run under ASan in the sanitized build).
TEST(InductorIndexing, BadIndexIsAnErrorNamingTheNode) {
  struct Case {
    OpId op;
    Attrs attrs;
    Dims x, index;
    int64_t bad;
  };
  const Case cases[] = {
      {OpId::Gather, {{"dim", int64_t(1)}}, {4, 6}, {4, 3}, 6},
      {OpId::Gather, {{"dim", int64_t(0)}}, {4, 6}, {2, 6}, -5},
      {OpId::IndexSelect, {{"dim", int64_t(0)}}, {4, 6}, {3}, 4},
      {OpId::Embedding, {}, {5, 3}, {2, 2}, -6},
      {OpId::ScatterAdd, {{"dim", int64_t(0)}}, {4, 6}, {3, 6}, 1000},
  };
  int n = 0;
  for (const Case& c : cases) {
    Graph g;
    g.name = fmt::format("bad_index_{}", n++);
    ValueId x = g.add_input("x", TensorType(f32, Shape(c.x.begin(), c.x.end())));
    ValueId idx = g.add_input("idx", TensorType(i64, Shape(c.index.begin(), c.index.end())));
    std::vector<ValueId> ins = {x, idx};
    if (c.op == OpId::ScatterAdd)
      ins.push_back(g.add_input("src", TensorType(f32, Shape(c.index.begin(), c.index.end()))));
    ValueId y = g.add_node1(c.op, ins, c.attrs, "the_node");
    g.outputs = {g.add_node1(OpId::Neg, {y}, {}, "after")};
    auto compiled = compiler::compile(g, Device::cpu(), compiler::Options{});
    EXPECT_EQ(compiled->report().eager_launches, 0) << compiled->summary();
    Generator gen(7);
    TensorList in = {Tensor::randn(c.x, gen, f32), Tensor::randint(c.index, gen, 0, 2, i64)};
    if (c.op == OpId::ScatterAdd) in.push_back(Tensor::randn(c.index, gen, f32));
    // Valid indices run; then one bad index in the middle.
    EXPECT_NO_THROW(compiled->run(in)) << g.name;
    in[1].data<int64_t>()[in[1].numel() / 2] = c.bad;
    for (int compiled_run = 0; compiled_run < 2; ++compiled_run) {
      try {
        if (compiled_run) compiled->run(in);
        else run(g, in);
        ADD_FAILURE() << g.name << ": no error for index " << c.bad << (compiled_run ? " (compiled)" : " (interpreter)");
      } catch (const Error& e) {
        std::string what = e.what();
        EXPECT_NE(what.find("the_node"), std::string::npos) << what;
        EXPECT_NE(what.find(std::to_string(c.bad)), std::string::npos) << what;
        EXPECT_NE(what.find("out of range"), std::string::npos) << what;
      }
    }
    // The executable still runs after the error.
    in[1].data<int64_t>()[in[1].numel() / 2] = 0;
    EXPECT_NO_THROW(compiled->run(in)) << g.name;
  }
}

// The words of a compiled index check (lower::index_check), which the CUDA target's kernels
// report too (tests/cuda/compiled_cuda_test.cc, CudaDeviceStatus.OutOfRangeIndicesFailLikeTheCpu,
// expects this exact text).
TEST(InductorIndexing, CompiledIndexCheckMessage) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(f32, Shape{5, 3}));
  ValueId idx = g.add_input("idx", TensorType(i64, Shape{4}));
  ValueId y = g.add_node1(OpId::IndexSelect, {x, idx}, {{"dim", int64_t(0)}}, "pick.rows");
  g.outputs = {g.add_node1(OpId::Relu, {y}, {}, "pick.relu")};
  auto compiled = compiler::compile(g, Device::cpu(), compiler::Options{});
  Generator gen(3);
  Tensor bad = Tensor::empty({4}, i64);
  const int64_t v[4] = {4, 1, 7, 2};
  std::copy(v, v + 4, bad.data<int64_t>());
  try {
    compiled->run({Tensor::randn({5, 3}, gen, f32), bad});
    ADD_FAILURE() << "no error for index 7";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("index_select 'pick.rows': index 7 is out of range for "
                                         "dim 0 of x of size 5 (valid range [-5, 4])"),
              std::string::npos)
        << e.what();
  }
}
