// Note [Kiln grouped convolution] (kernels/grouped_conv.cc): Kiln's own CPU kernel for grouped
// convolutions, as the implementation of a oneDNN node. Against float64 on fresh random
// inputs in the layouts the compiler gives its operands (NCHW from a graph input, NHWC between
// oneDNN convolutions), with every epilogue it takes, partial channel blocks, rows shorter than
// a vector, padded and unpadded filters, an in-place residual; NaN propagation; its place among
// the measured layouts; packages (bitwise, and refused when labelled older than version 10).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "../support/compare.h"
#include "../support/compile_report.h"
#include "../support/graph_inputs.h"
#include "../support/package_edit.h"
#include "compiler/compile.h"
#include "core/error.h"
#include "ir/graph.h"
#include "ir/interpreter.h"
#include "kernels/onednn_node.h"
#include "ops/kernel_util.h"
#include "runtime/package.h"
#include "targets/cpu/onednn_lowering.h"

namespace kiln {
namespace {

struct Spec {
  const char* name;
  int64_t batch, c, groups, o, h, w, k, pad;
  const char* act;          // relu | clamp | none
  bool residual = false;    // + 0.5 * the producer's output (its shape must be y's)
  bool producer = false;    // x comes from a 1x1 convolution (NHWC between oneDNN convolutions)
  int64_t stride = 1;
};

struct Net {
  Graph g;
  int64_t fan_in = 1;
};

// [producer 1x1 conv ->] grouped fused conv "grouped" -> 1x1 conv "consumer" (when there is a
// producer: both neighbours are oneDNN convolutions), float32, weights N(0, 1/fan_in).
Net make_net(const Spec& s, uint64_t seed) {
  Generator gen(seed);
  Net n;
  Graph& g = n.g;
  g.name = s.name;
  auto param = [&](const std::string& name, Dims d, double scale) {
    return g.add_param(name, sample_randn(gen, d, scale).to(DType::Float32));
  };
  ValueId x = g.add_input("x", TensorType(DType::Float32, Shape{s.batch, s.c, s.h, s.w}));
  ValueId p = x;
  if (s.producer)
    p = g.add_node1(OpId::Conv2d, {x, param("w0", {s.c, s.c, 1, 1}, 1.0 / std::sqrt(double(s.c))),
                                   param("b0", {s.c}, 0.5)}, {}, "producer");
  const int64_t cg = s.c / s.groups;
  n.fan_in = cg * s.k * s.k;
  Attrs a{{"padding", Ints{s.pad, s.pad}}, {"groups", s.groups}, {"activation", std::string(s.act)},
          {"sum_scale", 0.5}, {"stride", Ints{s.stride, s.stride}}};
  if (std::string(s.act) == "clamp") {
    a.set("clamp_min", -0.25);
    a.set("clamp_max", 0.75);
  }
  std::vector<ValueId> in = {p, param("wg", {s.o, cg, s.k, s.k}, 1.0 / std::sqrt(double(n.fan_in))),
                             param("bg", {s.o}, 0.5)};
  if (s.residual) in.push_back(p);
  ValueId y = g.add_node1(OpId::FusedConv2d, in, a, "grouped");
  if (s.producer)
    y = g.add_node1(OpId::Conv2d, {y, param("w2", {8, s.o, 1, 1}, 1.0 / std::sqrt(double(s.o)))}, {},
                    "consumer");
  g.outputs = {y};
  return n;
}

const Spec kSpecs[] = {
    // ResNeXt's layer1 shape (4 channels per group), between oneDNN convolutions; 19 columns:
    // one vector and a last one that overlaps it.
    {"resnext", 1, 128, 32, 128, 20, 19, 3, 1, "relu", false, true},
    // 4 per group from a graph input (NCHW), rows shorter than a vector, residual and clamp,
    // two images.
    {"short_rows", 2, 32, 8, 32, 9, 7, 3, 1, "clamp", true, false},
    // 6 channels per group (a partial block of 4 output channels), a 5x5 filter.
    {"six_per_group", 1, 24, 4, 24, 11, 23, 5, 2, "none", false, true},
    // Depthwise, unpadded ("valid").
    {"depthwise_valid", 1, 16, 16, 16, 17, 17, 3, 0, "relu", false, false},
    // 2 channels in, 4 out per group, two images, NHWC.
    {"two_to_four", 2, 16, 8, 32, 12, 33, 3, 1, "relu", false, true},
    // Stride 2, NHWC (ResNeXt's first convolution of a stage), odd sizes.
    {"strided", 1, 64, 16, 64, 23, 37, 3, 1, "relu", false, true, 2},
    // An image stem: 3 channels, not grouped, stride 2 (EfficientNet's), from a graph input.
    {"stem", 2, 3, 1, 24, 33, 50, 3, 1, "clamp", false, false, 2},
    // Stride 2 in NCHW with a 5x5 filter and partial blocks.
    {"strided_5x5", 1, 12, 2, 18, 21, 19, 5, 2, "none", false, false, 2},
};

TEST(KilnGroupedConv, MatchesFloat64InEveryLayoutAndThroughAPackage) {
  for (const Spec& s : kSpecs) {
    SCOPED_TRACE(s.name);
    Net n = make_net(s, 401);
    compiler::Options o;
    o.knobs.set("grouped_conv", "kiln");
    auto compiled = compiler::compile(n.g, Device::cpu(), o);
    const std::string line = test::kernel_line(compiled->report(), "fused_conv2d:grouped ");
    ASSERT_NE(line.find("kiln:grouped_direct"), std::string::npos) << compiled->summary();
    EXPECT_NE(line.find("(knob grouped_conv=kiln)"), std::string::npos) << line;
    if (s.producer && kernels::convolutions_prefer_nhwc(false)) {
      // Between convolutions that compute in nhwc: read and written in place, no reorder.
      EXPECT_NE(line.find("src nhwc -> dst nhwc"), std::string::npos) << line;
      EXPECT_EQ(line.find("reorders"), std::string::npos) << line;
    }
    if (!s.producer) {
      EXPECT_NE(line.find("src nchw"), std::string::npos) << line;
    }
    const std::string bytes = package_bytes(compiled->executable(), PackageInfo{});
    uint32_t version = 0;
    parse_package_container(bytes, s.name, &version);
    EXPECT_EQ(version, kKilnGroupedConvFormatVersion);
    LoadedPackage loaded = load_package_bytes(bytes, s.name);
    for (uint64_t seed : {11u, 12u}) {
      Generator gen(seed);
      TensorList in = {Tensor::randn({s.batch, s.c, s.h, s.w}, gen, DType::Float32)};
      Tensor want = run(test::as_float64(n.g), {in[0].to(DType::Float64)})[0];
      Tensor got = compiled->run(in)[0];
      const double tol = 1e-5 * std::sqrt(double(n.fan_in)) * 2;
      test::Comparison cmp = test::compare(got, want, test::Tolerance::rel(tol, tol));
      EXPECT_TRUE(cmp.ok()) << "seed " << seed << ": " << cmp.str() << "\n" << compiled->summary();
      EXPECT_TRUE(test::close(loaded.exe->run(in)[0], got, test::Tolerance::exact()))
          << "packaged vs compiled, seed " << seed;
    }
  }
}

// The residual in the output's own buffer (the lowering says the node allows it): each element
// is read before the same thread writes it, and the last run of columns is not computed
// overlapping the one before (whose outputs would already have replaced the residual there).
TEST(KilnGroupedConv, ResidualInTheOutputBuffer) {
  for (int64_t w : {19, 7, 32}) {
    SCOPED_TRACE(w);
    Spec s{"in_place", 2, 32, 8, 32, 6, w, 3, 1, "relu", true, false};
    Net n = make_net(s, 402);
    cpu::OnednnOptions opts;
    opts.grouped_conv = cpu::OnednnOptions::GroupedConv::Kiln;
    cpu::OnednnLowering low(n.g, {0}, opts);
    ASSERT_TRUE(low.lowered(0)) << low.why_not_lowered(0);
    ASSERT_NE(low.describe(0).find("kiln:grouped_direct"), std::string::npos) << low.describe(0);
    ASSERT_TRUE(low.residual_may_alias_output(0));
    Generator gen(13);
    Tensor x = Tensor::randn({2, 32, 6, w}, gen, DType::Float32);
    Tensor out = x.clone();  // the residual (x itself), and the output buffer
    Tensor scratch = Tensor::empty({std::max<int64_t>(1, low.scratchpad_bytes())}, DType::UInt8);
    const void* ptrs[4] = {x.raw_data(), nullptr, nullptr, out.raw_data()};
    low.run(0, ptrs, out.raw_data(), scratch.raw_data());
    Tensor want = run(test::as_float64(n.g), {x.to(DType::Float64)})[0];
    const double tol = 1e-5 * std::sqrt(double(n.fan_in)) * 2;
    test::Comparison cmp = test::compare(out, want, test::Tolerance::rel(tol, tol));
    EXPECT_TRUE(cmp.ok()) << cmp.str();
  }
}

// A NaN in the input reaches exactly the outputs whose window holds it, through relu (which
// keeps NaN) and the bias; every other output stays finite.
TEST(KilnGroupedConv, NanReachesTheOutputsOfItsWindow) {
  Spec s{"nan", 1, 32, 8, 32, 10, 21, 3, 1, "relu", false, false};
  Net n = make_net(s, 403);
  compiler::Options o;
  o.knobs.set("grouped_conv", "kiln");
  auto compiled = compiler::compile(n.g, Device::cpu(), o);
  ASSERT_NE(test::kernel_line(compiled->report(), "fused_conv2d:grouped ").find("kiln:grouped_direct"),
            std::string::npos) << compiled->summary();
  Generator gen(14);
  Tensor x = Tensor::randn({1, 32, 10, 21}, gen, DType::Float32);
  const int64_t ch = 5, r = 4, c = 17;  // channel 5: group 1 (channels 4..7), outputs 4..7
  x.data<float>()[(ch * 10 + r) * 21 + c] = std::numeric_limits<float>::quiet_NaN();
  Tensor y = compiled->run({x})[0].contiguous();
  const float* v = y.data<float>();
  int nans = 0;
  for (int64_t oc = 0; oc < 32; ++oc)
    for (int64_t i = 0; i < 10; ++i)
      for (int64_t j = 0; j < 21; ++j) {
        const bool in_window = oc / 4 == ch / 4 && std::abs(i - r) <= 1 && std::abs(j - c) <= 1;
        const float e = v[(oc * 10 + i) * 21 + j];
        EXPECT_EQ(std::isnan(e), in_window) << oc << "," << i << "," << j << " = " << e;
        nans += std::isnan(e);
      }
  EXPECT_EQ(nans, 4 * 9);
}

// Note [measured convolution layout]: where a convolution's layout is measured, Kiln's kernel
// is one more timed candidate (grouped_conv=measured, the default) or not tried (onednn); the
// thresholds 0 (measure every convolution) make the test independent of the machine's speed.
TEST(KilnGroupedConv, IsACandidateOfTheMeasuredLayout) {
  Spec s = kSpecs[0];
  Net n = make_net(s, 404);
  for (auto mode : {cpu::OnednnOptions::GroupedConv::Measured, cpu::OnednnOptions::GroupedConv::Onednn}) {
    cpu::OnednnOptions opts;
    opts.measure_above_roofline = 0;
    opts.grouped_conv = mode;
    cpu::OnednnLowering low(n.g, {0, 1, 2}, opts);
    ASSERT_TRUE(low.lowered(1));
    const std::string d = low.describe(1);
    EXPECT_NE(d.find("layout measured"), std::string::npos) << d;
    EXPECT_EQ(d.find("kiln-direct kiln:grouped_direct") == std::string::npos,
              mode == cpu::OnednnOptions::GroupedConv::Onednn) << d;
  }
}

// A descriptor naming the kernel round-trips through JSON; another conv_layout is malformed.
TEST(KilnGroupedConv, DescriptorRoundTripsAndUnknownLayoutsAreRefused) {
  kernels::OnednnNodeDesc d;
  d.op = "fused_conv2d";
  d.node = "g";
  d.inputs = {{0, {1, 8, 5, 5}, "", false}, {-1, {8, 2, 3, 3}, "w", false}};
  d.output = {1, {1, 8, 5, 5}, "", false};
  d.groups = 4;
  d.activation = "relu";
  d.conv_layout = kernels::kKilnDirectLayout;
  EXPECT_EQ(kernels::kiln_direct_conv_why_not(d), "");
  const std::string j = d.to_json();
  EXPECT_EQ(kernels::OnednnNodeDesc::from_json(j, "test").conv_layout, "kiln-direct");
  std::string bad = j;
  bad.replace(bad.find("kiln-direct"), 11, "kiln-future");
  try {
    kernels::OnednnNodeDesc::from_json(bad, "test record");
    ADD_FAILURE() << "accepted " << bad;
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("test record: malformed oneDNN node descriptor: conv_layout kiln-future"),
              std::string::npos) << e.message();
  }
  // What the kernel does not take says why.
  kernels::OnednnNodeDesc strided = d;
  strided.stride[0] = 3;
  EXPECT_EQ(kernels::kiln_direct_conv_why_not(strided), "stride is not 1 or 2");
  kernels::OnednnNodeDesc dense = d;
  dense.groups = 1;
  dense.inputs[1].dims = {8, 8, 3, 3};
  EXPECT_EQ(kernels::kiln_direct_conv_why_not(dense), "not grouped, and more than 4 input channels");
  kernels::OnednnNodeDesc gelu = d;
  gelu.activation = "gelu";
  EXPECT_EQ(kernels::kiln_direct_conv_why_not(gelu), "its activation is not relu or clamp");
  // A record whose output is smaller than its input and padding give (a hand-edited package):
  // refused, so that the kernel never stages input columns past its plane.
  kernels::OnednnNodeDesc cropped = d;
  cropped.output.dims = {1, 8, 2, 2};
  EXPECT_EQ(kernels::kiln_direct_conv_why_not(cropped), "output smaller than its input and padding give");
  kernels::OnednnNodeDesc bf16 = d;
  bf16.bf16 = true;
  EXPECT_EQ(kernels::kiln_direct_conv_why_not(bf16), "bfloat16");
}

// Format version 10 (kKilnGroupedConvFormatVersion): a package labelled 9 that holds the
// kernel's record is refused naming the launch.
TEST(Package, KilnGroupedConvolutionRoundTripsAndIsRefusedWhenLabelledOlder) {
  Net n = make_net(kSpecs[1], 405);
  compiler::Options o;
  o.knobs.set("grouped_conv", "kiln");
  auto compiled = compiler::compile(n.g, Device::cpu(), o);
  const std::string bytes = package_bytes(compiled->executable(), PackageInfo{});
  uint32_t version = 0;
  parse_package_container(bytes, "g", &version);
  ASSERT_EQ(version, kKilnGroupedConvFormatVersion);
  std::string err = test::load_error_as_version(bytes, kAttentionOutputFormatVersion, "g");
  EXPECT_NE(err.find("Kiln's grouped convolution kernel (conv_layout kiln-direct) is unknown to "
                     "format version 9"), std::string::npos) << err;
  EXPECT_NE(err.find("launch"), std::string::npos) << err;
  // Under grouped_conv=onednn the same graph packages as before (version 8: prepacked weights).
  compiler::Options plain;
  plain.knobs.set("grouped_conv", "onednn");
  auto c2 = compiler::compile(n.g, Device::cpu(), plain);
  parse_package_container(package_bytes(c2->executable(), PackageInfo{}), "g", &version);
  EXPECT_LT(version, kKilnGroupedConvFormatVersion);
}

}  // namespace
}  // namespace kiln
