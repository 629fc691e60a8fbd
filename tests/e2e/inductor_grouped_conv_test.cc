// Note [Kiln grouped convolution] (kernels/grouped_conv.cc): Kiln's own CPU kernel for grouped
// convolutions, as the implementation of a oneDNN node. Against float64 on fresh random
// inputs in the layouts the compiler gives its operands (NCHW from a graph input, NHWC between
// oneDNN convolutions), with every epilogue it takes, partial channel blocks, rows shorter than
// a vector, padded and unpadded filters, an in-place residual; NaN propagation; its place among
// the measured layouts; packages (bitwise, and refused when labelled older than version 10).
#include <gtest/gtest.h>

#include <cmath>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../support/compare.h"
#include "../support/compile_report.h"
#include "../support/graph_inputs.h"
#include "../support/package_edit.h"
#include "compiler/compile.h"
#include "core/error.h"
#include "ir/graph.h"
#include "ir/interpreter.h"
#include "kernels/grouped_conv.h"
#include "kernels/onednn_node.h"
#include "ops/kernel_util.h"
#include "runtime/package.h"
#include "targets/cpu/onednn_lowering.h"

namespace kiln {
namespace {

struct Spec {
  const char* name;
  int64_t batch, c, groups, o, h, w, k, pad;
  const char* act;          // relu | clamp | silu | none
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
    // EfficientNet's stem with its silu, rows long enough for whole vectors of the stride-2
    // staging (67 columns: vectors, then the rest element by element) and two images.
    {"stem_silu", 2, 3, 1, 24, 34, 67, 3, 1, "silu", false, false, 2},
    // 130 columns (even: the last phase column reaches the right pad), 32 output channels.
    {"stem_silu_even", 1, 3, 1, 32, 9, 130, 3, 1, "silu", false, false, 2},
    // ResNet's stem: 7x7, pad 3, stride 2, relu.
    {"stem_7x7", 1, 3, 1, 16, 21, 75, 7, 3, "relu", false, false, 2},
    // silu after a residual, grouped, NHWC between convolutions.
    {"silu_residual", 1, 32, 8, 32, 9, 40, 3, 1, "silu", true, true},
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
    EXPECT_EQ(version, std::string(s.act) == "silu" ? kKilnConvSiluFormatVersion
                                                     : kKilnGroupedConvFormatVersion);
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

// The kernel's vector widths this CPU runs: 4 (generic), 8 (AVX2), 16 (AVX-512).
std::vector<int64_t> cpu_vector_widths() {
  __builtin_cpu_init();
  std::vector<int64_t> widths = {4};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) widths.push_back(8);
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) widths.push_back(16);
  return widths;
}

// A NaN in the input on the channel-lanes path (Note [Grouped convolution on channel lanes])
// reaches exactly the outputs whose window holds it, in its group's channels, at every vector
// width and at both strides; padding is skipped, so the border outputs stay finite. The residual
// is the output's own buffer (read before the same thread writes it).
TEST(KilnGroupedConv, ChannelLanesKeepANaNInItsWindow) {
  for (int64_t stride : {1, 2})
    for (int64_t width : cpu_vector_widths()) {
      if (width < 8) continue;  // the lanes need AVX2 or AVX-512
      SCOPED_TRACE(fmt::format("stride {}, {} floats per vector", stride, width));
      const int64_t c = 32, h = 9, w = 19, cg = 4;
      kernels::GroupedConvShape s;
      s.n = 1, s.c = c, s.h = h, s.w = w, s.o = c, s.groups = c / cg, s.kh = s.kw = 3;
      s.pad_top = s.pad_left = 1, s.stride_h = s.stride_w = stride;
      s.oh = (h + 2 - 3) / stride + 1, s.ow = (w + 2 - 3) / stride + 1;
      s.x_nhwc = s.y_nhwc = true;
      kernels::GroupedConvEpilogue e;
      e.act = kernels::GroupedConvEpilogue::Act::Relu, e.residual = true, e.sum_scale = 0.5f;
      Generator gen(23);
      Tensor wt = Tensor::randn({c, cg, 3, 3}, gen, DType::Float32);
      Tensor b = Tensor::randn({c}, gen, DType::Float32);
      kernels::GroupedConv conv(s, e, wt.data<float>(), b.data<float>(), width);
      ASSERT_TRUE(conv.on_channel_lanes());
      EXPECT_EQ(conv.scratch_bytes(2), 0);
      Tensor x = Tensor::randn({h * w * c}, gen, DType::Float32);  // NHWC
      const int64_t ch = 13, r = 4, col = 10;  // group 3 (channels 12..15)
      x.data<float>()[(r * w + col) * c + ch] = std::numeric_limits<float>::quiet_NaN();
      Tensor y = Tensor::randn({s.oh * s.ow * c}, gen, DType::Float32);  // residual and output
      kernels::ScopedCpuThreads two(2);
      conv.run(x.data<float>(), y.data<float>(), y.data<float>(), nullptr);
      int nans = 0;
      for (int64_t i = 0; i < s.oh; ++i)
        for (int64_t j = 0; j < s.ow; ++j)
          for (int64_t oc = 0; oc < c; ++oc) {
            const int64_t di = r - (i * stride - 1), dj = col - (j * stride - 1);
            const bool in_window = oc / cg == ch / cg && di >= 0 && di < 3 && dj >= 0 && dj < 3;
            const float v = y.data<float>()[(i * s.ow + j) * c + oc];
            EXPECT_EQ(std::isnan(v), in_window) << i << "," << j << "," << oc << " = " << v;
            nans += std::isnan(v);
          }
      EXPECT_EQ(nans, stride == 1 ? 4 * 9 : 4 * 1);
    }
}

// The silu epilogue at float32's edges (Note [Kiln grouped convolution], exp_of): a 1x1
// convolution of one channel with weight 1 and bias 0 is silu(x) itself. NaN and -inf give NaN
// (as x / (1 + e^-x) does in float64), inf gives inf, the values past e^-x's range (x beyond
// +-88) give x and -0; the rest, random and around the range's edges, within float32's
// tolerance of float64. Every lane of a vector and the row's last partial run of columns.
TEST(KilnGroupedConv, SiluAtTheEdgesOfFloat32) {
  Graph g;
  g.name = "silu_edges";
  const int64_t w = 53;
  ValueId x = g.add_input("x", TensorType(DType::Float32, Shape{1, 1, 2, w}));
  ValueId y = g.add_node1(OpId::FusedConv2d,
                          {x, g.add_param("w", Tensor::ones({1, 1, 1, 1})),
                           g.add_param("b", Tensor::full({1}, 0.0))},
                          {{"activation", std::string("silu")}}, "stem");
  g.outputs = {y};
  compiler::Options o;
  o.knobs.set("grouped_conv", "kiln");
  auto compiled = compiler::compile(g, Device::cpu(), o);
  ASSERT_NE(test::kernel_line(compiled->report(), "fused_conv2d:stem ").find("kiln:grouped_direct"),
            std::string::npos) << compiled->summary();
  Generator gen(15);
  Tensor in = Tensor::randn({1, 1, 2, w}, gen, DType::Float32);
  const float inf = std::numeric_limits<float>::infinity();
  const float special[] = {std::numeric_limits<float>::quiet_NaN(), -inf, inf, -1000.0f, 1000.0f,
                           -89.0f, -88.7f, -88.0f, -87.4f, -87.3f, -20.0f, -1e-6f, 1e-30f,
                           20.0f, 87.3f, 88.0f, 88.7f, 89.0f, 3.4e38f, -3.4e38f, 1e-3f};
  float* v = in.data<float>();
  for (size_t i = 0; i < std::size(special); ++i) v[i * 5 % (2 * w)] = special[i];
  Tensor got = compiled->run({in})[0];
  Tensor want = run(test::as_float64(g), {in.to(DType::Float64)})[0];
  test::Comparison cmp = test::compare(got, want, test::Tolerance::rel(4e-6, 1e-30));
  EXPECT_TRUE(cmp.ok()) << cmp.str();
  const float* gv = got.contiguous().data<float>();
  EXPECT_TRUE(std::isnan(gv[0]));                                  // NaN
  EXPECT_TRUE(std::isnan(gv[5]));                                  // -inf
  EXPECT_EQ(gv[10], inf);                                          // inf
  EXPECT_TRUE(gv[15] == 0.0f && std::signbit(gv[15])) << gv[15];   // -1000: -0
  EXPECT_EQ(gv[20], 1000.0f);
  // The same through every vector width's path (AVX-512's exp and the portable one).
  kernels::GroupedConvShape s;
  s.n = 1, s.c = 1, s.h = 2, s.w = w, s.o = 1, s.oh = 2, s.ow = w, s.kh = s.kw = 1;
  kernels::GroupedConvEpilogue e;
  e.act = kernels::GroupedConvEpilogue::Act::Silu;
  const float one = 1.0f, zero = 0.0f;
  for (int64_t width : cpu_vector_widths()) {
    SCOPED_TRACE(fmt::format("{} floats per vector", width));
    kernels::GroupedConv conv(s, e, &one, &zero, width);
    Tensor y = Tensor::full({1, 1, 2, w}, std::nan(""), DType::Float32);
    std::vector<float> scratch(size_t(conv.scratch_bytes(1) / 4 + 16));
    void* aligned = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) / 64 * 64);
    kernels::ScopedCpuThreads one_thread(1);
    conv.run(in.data<float>(), nullptr, y.data<float>(), aligned);
    test::Comparison c = test::compare(y, want, test::Tolerance::rel(4e-6, 1e-30));
    EXPECT_TRUE(c.ok()) << c.str();
    EXPECT_TRUE(std::isnan(y.data<float>()[5])) << "silu(-inf)";
    EXPECT_EQ(y.data<float>()[10], inf);
  }
}

// Every vector width's path of the kernel (16: AVX-512, 8: AVX2, 4: generic; those this CPU
// runs), called directly, against a float64 loop: stems with each activation (silu's two exp
// forms: AVX-512's and the portable one), stride-2 rows staged whole vectors at a time and
// element by element, NHWC in and out, a grouped convolution with a residual; random inputs,
// one in 97 scaled by 400 so that silu's sums pass the ends of exp's range.
TEST(KilnGroupedConv, EveryVectorWidthMatchesFloat64) {
  using Act = kernels::GroupedConvEpilogue::Act;
  struct Case {
    const char* name;
    int64_t n, c, h, w, o, groups, k, pad, stride;
    Act act;
    bool residual, x_nhwc, y_nhwc;
  };
  const Case cases[] = {
      {"stem_silu", 2, 3, 23, 67, 24, 1, 3, 1, 2, Act::Silu, false, false, false},
      {"stem_silu_nhwc_out", 1, 3, 9, 130, 32, 1, 3, 1, 2, Act::Silu, false, false, true},
      {"stem_7x7_relu", 1, 3, 21, 75, 16, 1, 7, 3, 2, Act::Relu, false, false, false},
      {"stem_clamp_nhwc_in", 1, 4, 12, 41, 8, 1, 3, 1, 2, Act::Clamp, false, true, true},
      {"grouped_silu_residual", 1, 32, 9, 40, 32, 8, 3, 1, 1, Act::Silu, true, true, true},
      {"grouped_none", 2, 12, 10, 19, 18, 2, 5, 2, 2, Act::None, false, false, false},
      // Note [Grouped convolution on channel lanes]: NHWC, as many channels per group out as
      // in, 3x3. ResNeXt's 4 per group with rows of whole tiles and a partial one, and at
      // stride 2; 8 per group with a residual (and at stride 2, and 16 per group, which stay
      // on the bands); 2 per group unpadded with rows shorter than a tile; depthwise at stride
      // 2; two images.
      {"lanes_4_per_group", 1, 64, 11, 29, 64, 16, 3, 1, 1, Act::Relu, false, true, true},
      {"lanes_4_per_group_strided", 1, 32, 12, 27, 32, 8, 3, 1, 2, Act::Clamp, true, true, true},
      {"lanes_8_per_group", 2, 32, 13, 21, 32, 4, 3, 1, 1, Act::Silu, true, true, true},
      {"bands_8_per_group_strided", 1, 32, 13, 21, 32, 4, 3, 1, 2, Act::Silu, true, true, true},
      {"bands_16_per_group", 1, 32, 9, 17, 32, 2, 3, 1, 1, Act::Clamp, true, true, true},
      {"lanes_2_per_group_valid", 1, 16, 7, 9, 16, 8, 3, 0, 1, Act::Relu, false, true, true},
      {"lanes_depthwise_strided", 2, 48, 10, 23, 48, 48, 3, 1, 2, Act::None, false, true, true},
      // Note [Image stems on output-channel vectors]: not grouped, at most 4 input channels,
      // NHWC out, output channels a multiple of 8, so every block shape: with AVX-512 whole
      // vectors 1-4 and a half (8 | 16 | 24 | 32 | 40 | 48 | 56 | 64, and 104 = 64 + 40 in two
      // blocks); rows shorter than a tile, rows of several tiles and a partial one; strides 1
      // and 2, 3x3, 5x5 and 7x7, one to four input channels, NCHW and NHWC in, a residual.
      {"stem_path_16", 2, 3, 15, 26, 16, 1, 3, 1, 2, Act::Relu, false, false, true},
      {"stem_path_24_silu", 2, 3, 23, 67, 24, 1, 3, 1, 2, Act::Silu, false, false, true},
      {"stem_path_40_residual", 1, 2, 9, 29, 40, 1, 3, 1, 1, Act::Clamp, true, false, true},
      {"stem_path_48_nhwc_in", 1, 3, 6, 50, 48, 1, 3, 1, 2, Act::None, false, true, true},
      {"stem_path_56_one_channel", 1, 1, 8, 13, 56, 1, 3, 0, 1, Act::Silu, false, false, true},
      {"stem_path_64_7x7", 1, 3, 21, 75, 64, 1, 7, 3, 2, Act::Relu, false, false, true},
      {"stem_path_104_5x5", 1, 3, 10, 30, 104, 1, 5, 2, 2, Act::None, true, true, true},
  };
  const std::vector<int64_t> widths = cpu_vector_widths();
  for (const Case& cs : cases) {
    SCOPED_TRACE(cs.name);
    kernels::GroupedConvShape s;
    s.n = cs.n, s.c = cs.c, s.h = cs.h, s.w = cs.w, s.o = cs.o, s.groups = cs.groups;
    s.kh = s.kw = cs.k, s.pad_top = s.pad_left = cs.pad, s.stride_h = s.stride_w = cs.stride;
    s.oh = (cs.h + 2 * cs.pad - cs.k) / cs.stride + 1;
    s.ow = (cs.w + 2 * cs.pad - cs.k) / cs.stride + 1;
    s.x_nhwc = cs.x_nhwc, s.y_nhwc = cs.y_nhwc;
    kernels::GroupedConvEpilogue e;
    e.act = cs.act, e.lo = -0.25f, e.hi = 0.75f, e.sum_scale = 0.5f, e.residual = cs.residual;
    const int64_t cg = cs.c / cs.groups, og = cs.o / cs.groups, taps = cs.k * cs.k;
    Generator gen(17);
    Tensor w = Tensor::randn({cs.o, cg, cs.k, cs.k}, gen, DType::Float32);
    Tensor b = Tensor::randn({cs.o}, gen, DType::Float32);
    Tensor x = Tensor::randn({cs.n, cs.c, cs.h, cs.w}, gen, DType::Float32);  // logical NCHW
    Tensor res = Tensor::randn({cs.n, cs.o, s.oh, s.ow}, gen, DType::Float32);
    // Large enough values that silu meets the ends of exp's range: x and weights scaled so that
    // some sums pass +-88.
    float* xv = x.data<float>();
    for (int64_t i = 0; i < x.numel(); i += 97) xv[i] *= 400.0f;
    const float* wv = w.data<float>();
    // Reference, float64, logical NCHW.
    // Per output, the sum of its terms' magnitudes: float32's rounding of the sum is bounded by
    // a multiple of it (the tolerance below), whatever the cancellation.
    std::vector<double> want(size_t(cs.n * cs.o * s.oh * s.ow)), scales(want.size());
    for (int64_t ni = 0; ni < cs.n; ++ni)
      for (int64_t oc = 0; oc < cs.o; ++oc)
        for (int64_t i = 0; i < s.oh; ++i)
          for (int64_t j = 0; j < s.ow; ++j) {
            const int64_t g = oc / og;
            double acc = b.data<float>()[oc], mag = std::abs(acc);
            for (int64_t ic = 0; ic < cg; ++ic)
              for (int64_t ki = 0; ki < cs.k; ++ki)
                for (int64_t kj = 0; kj < cs.k; ++kj) {
                  const int64_t ih = i * cs.stride + ki - cs.pad, iw = j * cs.stride + kj - cs.pad;
                  if (ih < 0 || ih >= cs.h || iw < 0 || iw >= cs.w) continue;
                  const double t = double(wv[(oc * cg + ic) * taps + ki * cs.k + kj]) *
                                   double(xv[((ni * cs.c + g * cg + ic) * cs.h + ih) * cs.w + iw]);
                  acc += t;
                  mag += std::abs(t);
                }
            const size_t at = size_t(((ni * cs.o + oc) * s.oh + i) * s.ow + j);
            if (cs.residual) {
              acc += 0.5 * double(res.data<float>()[at]);
              mag += 0.5 * std::abs(double(res.data<float>()[at]));
            }
            scales[at] = mag;
            if (cs.act == Act::Silu) acc = acc / (1.0 + std::exp(-acc));
            if (cs.act == Act::Relu) acc = std::max(acc, 0.0);
            if (cs.act == Act::Clamp) acc = std::min(std::max(acc, -0.25), 0.75);
            want[at] = acc;
          }
    // Operands in the kernel's layouts: element (n, c, h, w) of an NCHW tensor at its NHWC place.
    auto nhwc_at = [](const Tensor& t, int64_t ni, int64_t c, int64_t hw) {
      const int64_t C = t.size(1), HW = t.size(2) * t.size(3);
      return (ni * HW + hw) * C + c;
    };
    auto in_layout = [&](const Tensor& t, bool nhwc) {
      if (!nhwc) return t.clone();
      Tensor out = Tensor::empty(t.sizes(), DType::Float32);
      const int64_t C = t.size(1), HW = t.size(2) * t.size(3);
      for (int64_t ni = 0; ni < t.size(0); ++ni)
        for (int64_t c = 0; c < C; ++c)
          for (int64_t hw = 0; hw < HW; ++hw)
            out.data<float>()[nhwc_at(t, ni, c, hw)] = t.data<float>()[(ni * C + c) * HW + hw];
      return out;
    };
    Tensor xk = in_layout(x, cs.x_nhwc), rk = in_layout(res, cs.y_nhwc);
    for (int64_t width : widths) {
      SCOPED_TRACE(fmt::format("{} floats per vector", width));
      kernels::GroupedConv conv(s, e, wv, b.data<float>(), width);
      EXPECT_STREQ(conv.isa(), width == 16 ? "avx512" : width == 8 ? "avx2" : "generic");
      Tensor yk = Tensor::full({cs.n, cs.o, s.oh, s.ow}, std::nan(""), DType::Float32);
      Tensor scratch = Tensor::empty({conv.scratch_bytes(2) + 64}, DType::UInt8);
      void* aligned = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(scratch.raw_data()) + 63) /
                                              64 * 64);
      // The channel-lanes path where its conditions hold (every case but the bands' above).
      const bool lanes = cs.x_nhwc && cs.y_nhwc && cg == og && cs.k == 3 && width >= 8 &&
                         cs.c % width == 0 &&
                         (cg == 1 || cg == 2 || cg == 4 || (cg == 8 && cs.stride == 1));
      EXPECT_EQ(conv.on_channel_lanes(), lanes);
      // The stem path where its conditions hold (with AVX-512, also AVX-512VL).
      const bool stem = cs.groups == 1 && cs.c <= 4 && cs.y_nhwc && cs.o % 8 == 0 &&
                        (width == 8 || (width == 16 && __builtin_cpu_supports("avx512vl")));
      EXPECT_EQ(conv.on_stem_path(), stem);
      {
        kernels::ScopedCpuThreads one(1);
        conv.run(xk.data<float>(), cs.residual ? rk.data<float>() : nullptr, yk.data<float>(),
                 aligned);
      }
      {
        // Each output is one thread's, summed in a fixed order: two threads give the same bits.
        Tensor y2 = Tensor::full(yk.sizes(), std::nan(""), DType::Float32);
        kernels::ScopedCpuThreads two(2);
        conv.run(xk.data<float>(), cs.residual ? rk.data<float>() : nullptr, y2.data<float>(),
                 aligned);
        EXPECT_TRUE(test::close(y2, yk, test::Tolerance::exact()));
      }
      Tensor y = yk.clone();
      if (cs.y_nhwc)
        for (int64_t ni = 0; ni < cs.n; ++ni)
          for (int64_t c = 0; c < cs.o; ++c)
            for (int64_t hw = 0; hw < s.oh * s.ow; ++hw)
              y.data<float>()[(ni * cs.o + c) * s.oh * s.ow + hw] =
                  yk.data<float>()[nhwc_at(yk, ni, c, hw)];
      Tensor ref = Tensor::from_vector(want, {cs.n, cs.o, s.oh, s.ow});
      // float32 sums: within (terms + 2) units of rounding of their magnitude (times 1.1, silu's
      // largest slope); silu's exp within a few ulp of the result.
      test::Tolerance tol = test::Tolerance::of_scales(scales, 1.1 * 6e-8 * double(cg * taps + 2));
      tol.rtol = 1e-6;
      test::Comparison cmp = test::compare(y, ref, tol);
      EXPECT_TRUE(cmp.ok()) << cmp.str();
    }
  }
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
  EXPECT_EQ(kernels::kiln_direct_conv_why_not(gelu), "its activation is not relu, clamp or silu");
  // A record whose output is smaller than its input and padding give (a hand-edited package):
  // refused, so that the kernel never stages input columns past its plane.
  kernels::OnednnNodeDesc cropped = d;
  cropped.output.dims = {1, 8, 2, 2};
  EXPECT_EQ(kernels::kiln_direct_conv_why_not(cropped), "output smaller than its input and padding give");
  kernels::OnednnNodeDesc bf16 = d;
  bf16.bf16 = true;
  EXPECT_EQ(kernels::kiln_direct_conv_why_not(bf16), "bfloat16");
}

// A package of the spec's graph with Kiln's kernel pinned, written as format version `written`,
// and the error its bytes give when labelled `older` (naming the launch).
struct LabelledPackage {
  Net net;
  std::unique_ptr<compiler::CompiledExecutable> compiled;
  std::string bytes, older_error;
};
LabelledPackage package_labelled_older(const Spec& s, uint64_t seed, uint32_t written,
                                       uint32_t older) {
  LabelledPackage p{make_net(s, seed), nullptr, "", ""};
  compiler::Options o;
  o.knobs.set("grouped_conv", "kiln");
  p.compiled = compiler::compile(p.net.g, Device::cpu(), o);
  p.bytes = package_bytes(p.compiled->executable(), PackageInfo{});
  uint32_t version = 0;
  parse_package_container(p.bytes, "g", &version);
  EXPECT_EQ(version, written) << s.name;
  p.older_error = test::load_error_as_version(p.bytes, older, "g");
  EXPECT_NE(p.older_error.find("launch"), std::string::npos) << p.older_error;
  return p;
}

// Format version 10 (kKilnGroupedConvFormatVersion): a package labelled 9 that holds the
// kernel's record is refused naming the launch.
TEST(Package, KilnGroupedConvolutionRoundTripsAndIsRefusedWhenLabelledOlder) {
  LabelledPackage p = package_labelled_older(kSpecs[1], 405, kKilnGroupedConvFormatVersion,
                                             kAttentionOutputFormatVersion);
  EXPECT_NE(p.older_error.find("Kiln's grouped convolution kernel (conv_layout kiln-direct) is "
                               "unknown to format version 9"), std::string::npos) << p.older_error;
  // Under grouped_conv=onednn the same graph packages as before (version 8: prepacked weights).
  compiler::Options plain;
  plain.knobs.set("grouped_conv", "onednn");
  auto c2 = compiler::compile(p.net.g, Device::cpu(), plain);
  uint32_t version = 0;
  parse_package_container(package_bytes(c2->executable(), PackageInfo{}), "g", &version);
  EXPECT_LT(version, kKilnGroupedConvFormatVersion);
}

// Format version 11 (kKilnConvSiluFormatVersion): the kernel with a silu epilogue; labelled 10,
// refused naming the launch and the epilogue. Without silu the kernel's packages stay 10.
TEST(Package, KilnConvolutionWithSiluIsRefusedWhenLabelledOlder) {
  const Spec& s = kSpecs[8];
  ASSERT_STREQ(s.name, "stem_silu");
  LabelledPackage p = package_labelled_older(s, 406, kKilnConvSiluFormatVersion,
                                             kKilnGroupedConvFormatVersion);
  EXPECT_NE(p.older_error.find("Kiln's grouped convolution kernel with a silu epilogue is unknown "
                               "to format version 10"), std::string::npos) << p.older_error;
  Generator gen(16);
  TensorList in = {Tensor::randn({s.batch, s.c, s.h, s.w}, gen, DType::Float32)};
  EXPECT_TRUE(test::close(load_package_bytes(p.bytes, "g").exe->run(in)[0],
                          p.compiled->run(in)[0], test::Tolerance::exact()));
}

}  // namespace
}  // namespace kiln
