// Upsampling inside compiled CPU graphs runs the runtime's upsample launch
// (runtime/launch_library.h: make_upsample_launch), not an eager kernel: FPN's nearest and the
// segmentation heads' bilinear upsampling. It shares its tap tables and plane loops with the
// eager kernels (core/resample.h), so the compiled result is bitwise the eager one; checked
// also against the float64 reference on fresh random inputs, for integer, fractional and
// size-given scales, align_corners, float16 nearest, bilinear in float32 (separable), bfloat16,
// float16 and float64 (in float64, as the reference), through a package (format version 7,
// bitwise; labelled version 6 it is refused).
#include <gtest/gtest.h>

#include <string>

#include <fmt/format.h>
#include "../support/compare.h"
#include "../support/graph_inputs.h"
#include "../support/package_edit.h"
#include "compiler/compile.h"
#include "core/error.h"
#include "ir/graph.h"
#include "ir/interpreter.h"
#include "runtime/package.h"

using namespace kiln;

namespace {

struct Case {
  std::string name;
  Dims x;
  std::string mode;
  Ints size;      // empty: from scales
  Floats scales;  // empty: from size
  bool align_corners = false;
  DType dtype = DType::Float32;
};

// relu(x) -> upsample -> + y: the upsample reads a loop kernel's output and feeds another.
Graph case_graph(const Case& c) {
  Graph g;
  g.name = "upsample";
  ValueId x = g.add_input("x", TensorType(c.dtype, Shape(c.x.begin(), c.x.end())));
  ValueId r = g.add_node1(OpId::Relu, {x}, {}, "act");
  Attrs a{{"mode", c.mode}, {"align_corners", c.align_corners}};
  if (!c.size.empty()) a.set("size", c.size);
  if (!c.scales.empty()) a.set("scales", c.scales);
  ValueId u = g.add_node1(OpId::Upsample, {r}, a, "up");
  ValueId y = g.add_input("y", g.type(u));
  g.outputs = {g.add_node1(OpId::Add, {u, y}, {}, "merge")};
  return g;
}

std::string launch_line(const compiler::CompileReport& r) {
  for (const std::string& k : r.kernels)
    if (k.rfind("upsample:up", 0) == 0) return k;
  return "";
}

}  // namespace

TEST(InductorUpsample, RuntimeUpsampleIsBitwiseTheEagerKernelAndMatchesTheReference) {
  const std::vector<Case> cases = {
      {"FPN nearest 2x", {1, 6, 13, 17}, "nearest", {}, {2.0, 2.0}},
      {"nearest to a size", {2, 3, 10, 7}, "nearest", {23, 16}, {}},
      {"nearest 1.5x float16", {1, 5, 8, 9}, "nearest", {}, {1.5, 1.5}, false, DType::Float16},
      {"bilinear 8x (deeplabv3's head)", {1, 4, 9, 11}, "bilinear", {}, {8.0, 8.0}},
      {"bilinear to a size", {1, 7, 12, 5}, "bilinear", {29, 13}, {}},
      {"bilinear align_corners", {2, 3, 6, 10}, "bilinear", {17, 31}, {}, true},
      {"bilinear 2.5x with size and scales", {1, 2, 6, 6}, "bilinear", {15, 15}, {2.5, 2.5}},
      {"bilinear 2x bfloat16", {1, 3, 6, 7}, "bilinear", {}, {2.0, 2.0}, false, DType::BFloat16},
      {"bilinear float16 align_corners", {1, 4, 5, 9}, "bilinear", {11, 20}, {}, true,
       DType::Float16},
      {"bilinear 3x float64", {2, 2, 4, 5}, "bilinear", {}, {3.0, 3.0}, false, DType::Float64},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Graph g = case_graph(c);
    auto compiled = compiler::compile(g, Device::cpu(), compiler::Options{});
    const compiler::CompileReport& r = compiled->report();
    EXPECT_EQ(r.eager_launches, 0) << compiled->summary();
    EXPECT_NE(launch_line(r).find("[runtime kernel upsample]"), std::string::npos)
        << compiled->summary();
    // The version its upsample needs (prepacked oneDNN weights, where it has any, make it 8).
    PackageInfo plain;
    plain.prepack = false;
    uint32_t version = 0;
    parse_package_container(package_bytes(compiled->executable(), plain), "up", &version);
    EXPECT_EQ(version, kUpsampleFormatVersion);
    const std::string bytes = package_bytes(compiled->executable(), PackageInfo{});
    LoadedPackage loaded = load_package_bytes(bytes, "up");
    for (uint64_t seed : {21u, 22u}) {
      Generator gen(seed);
      TensorList in;
      for (ValueId v : g.inputs) {
        Dims d;
        for (const SymInt& s : g.type(v).shape) d.push_back(s.value());
        in.push_back(Tensor::randn(d, gen, DType::Float32).to(c.dtype));
      }
      TensorList in64;
      for (const Tensor& t : in) in64.push_back(t.to(DType::Float64));
      Tensor want = run(test::as_float64(g), in64)[0];
      Tensor eager = run(g, in)[0];
      Tensor got = compiled->run(in)[0];
      Tensor pkg = loaded.exe->run(in)[0];
      // float32: four taps and a blend rounded (a few 2^-24); float16 / bfloat16: the inputs
      // and the sum rounded to 2^-11 / 2^-8; float64: the reference's own arithmetic.
      double tol = c.dtype == DType::Float16    ? 2e-3
                   : c.dtype == DType::BFloat16 ? 2e-2
                   : c.dtype == DType::Float64  ? 1e-12
                                                : 1e-6;
      test::Comparison cmp = test::compare(got, want, test::Tolerance::rel(tol, tol));
      EXPECT_TRUE(cmp.ok()) << "seed " << seed << ": " << cmp.str();
      EXPECT_TRUE(test::close(got, eager, test::Tolerance::exact())) << "compiled vs eager";
      EXPECT_TRUE(test::close(pkg, got, test::Tolerance::exact())) << "packaged vs compiled";
    }
    // Labelled version 6 (header and manifest alike, hashes recomputed), the package is refused
    // naming the launch: a version-6 runtime has no upsample launch.
    std::string err = test::load_error_as_version(bytes, kOnednnConcatFormatVersion, "up");
    EXPECT_NE(err.find("upsample launch is unknown to format version 6"), std::string::npos) << err;
  }
}

// The runtime upsample reads a view whose elements are one contiguous run of its base in place:
// SSDlite's transform resizes its normalized image unsqueezed, which ran the eager kernel. Here
// the sources are an unsqueezed loop kernel's output and a slice of one (an offset into it),
// each resized bilinearly; the launches are the runtime's, and the results are the eager kernel's bits and
// the float64 reference's values, also from a package.
TEST(InductorUpsample, RuntimeUpsampleReadsAContiguousViewInPlace) {
  Graph g;
  g.name = "upsample_views";
  ValueId x = g.add_input("x", TensorType(DType::Float32, Shape{3, 10, 12}));
  ValueId z = g.add_input("z", TensorType(DType::Float32, Shape{4, 2, 6, 7}));
  ValueId xn = g.add_node1(OpId::Neg, {x}, {}, "normalize");  // a loop kernel's output, as SSDlite's
  ValueId xu = g.add_node1(OpId::Unsqueeze, {xn}, {{"dims", Ints{0}}}, "batch");
  ValueId up = g.add_node1(OpId::Upsample, {xu}, {{"mode", std::string("bilinear")},
                           {"align_corners", false}, {"size", Ints{17, 23}}}, "up_input");
  ValueId zr = g.add_node1(OpId::Relu, {z}, {}, "act");
  ValueId zs = g.add_node1(OpId::Slice, {zr}, {{"dim", int64_t(0)}, {"start", int64_t(1)},
                           {"end", int64_t(3)}, {"step", int64_t(1)}}, "middle");
  ValueId uz = g.add_node1(OpId::Upsample, {zs}, {{"mode", std::string("bilinear")},
                           {"align_corners", true}, {"scales", Floats{2.0, 2.0}}}, "up_slice");
  g.outputs = {up, uz};
  auto compiled = compiler::compile(g, Device::cpu(), compiler::Options{});
  const compiler::CompileReport& r = compiled->report();
  EXPECT_EQ(r.eager_launches, 0) << compiled->summary();
  int runtime = 0;
  for (const std::string& k : r.kernels) runtime += k.find("[runtime kernel upsample]") != std::string::npos;
  EXPECT_EQ(runtime, 2) << compiled->summary();
  LoadedPackage loaded = load_package_bytes(package_bytes(compiled->executable(), PackageInfo{}), "views");
  for (uint64_t seed : {31u, 32u}) {
    TensorList in = test::graph_test_inputs(g, {}, false, seed);
    TensorList in64;
    for (const Tensor& t : in) in64.push_back(t.to(DType::Float64));
    const TensorList want = run(test::as_float64(g), in64), eager = run(g, in);
    const TensorList got = compiled->run(in), pkg = loaded.exe->run(in);
    for (size_t o = 0; o < got.size(); ++o) {
      test::Comparison cmp = test::compare(got[o], want[o], test::Tolerance::rel(1e-6, 1e-6));
      EXPECT_TRUE(cmp.ok()) << "output " << o << " seed " << seed << ": " << cmp.str();
      EXPECT_TRUE(test::close(got[o], eager[o], test::Tolerance::exact())) << "output " << o;
      EXPECT_TRUE(test::close(pkg[o], got[o], test::Tolerance::exact())) << "output " << o;
    }
  }
}
