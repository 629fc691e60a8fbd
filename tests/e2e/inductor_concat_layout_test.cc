// Concat of convolution outputs in the convolutions' own layout (Note [oneDNN concat] in
// kernels/onednn_node.cc, Note [layout choice] in targets/cpu/onednn_lowering.cc): SqueezeNet's
// fire modules and Inception's blocks concatenate convolution (and pooling) outputs along the
// channels and feed the result to more convolutions. The CPU compiler runs such a concat as a
// oneDNN concat on the parts' layout (nhwc or nChw16c), with no reorder around it; a concat whose
// result feeds a loop kernel stays the runtime's plain copy, its parts plain. Checked against the
// float64 reference on fresh random inputs, f32 and bf16, under the default and the blocked
// convolution policy, with odd channel counts (nChw16c pads them), and through a package (format
// version 6), bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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
#include "ops/kernel_util.h"
#include "ops/onednn.h"
#include "runtime/package.h"
#include "targets/cpu/onednn_lowering.h"

using namespace kiln;

namespace {

using test::kernel_line;

// x -> squeeze 1x1 (relu) -> [expand 1x1 (relu), expand 3x3 (relu)] -> concat "fire" ->
//   [conv 3x3 "b0", max_pool 3x3/1 "b1" -> conv 1x1 "b1c", concat([expand1, expand3]) "nest"]
//   -> concat "block" (of b0, b1c and the nested concat) -> conv 1x1 "head" -> output 0;
// and a second, DenseNet-like path: concat "plain" of two convolutions whose result feeds a
// relu (a loop kernel) -> output 1.
struct Net {
  Graph g;
  double k = 0;  // the longest accumulation, for the tolerance
};

Net fire_net(DType dt, int64_t c_in, int64_t e1, int64_t e3, Generator& gen) {
  Net n;
  Graph& g = n.g;
  g.name = "fire_net";
  const int64_t sq = 16, hw = 12;
  auto param = [&](const std::string& name, Dims d) {
    double fan_in = double(d[1] * d[2] * d[3]);
    n.k = std::max(n.k, fan_in);
    return g.add_param(name, sample_randn(gen, d, 1.0 / std::sqrt(fan_in)).to(dt));
  };
  auto bias = [&](const std::string& name, int64_t c) {
    return g.add_param(name, sample_randn(gen, {c}, 0.5).to(dt));
  };
  auto conv = [&](ValueId x, int64_t cin, int64_t cout, int64_t k, const std::string& name,
                  bool relu) {
    ValueId w = param(name + ".w", {cout, cin, k, k}), b = bias(name + ".b", cout);
    Attrs a{{"padding", Ints{k / 2, k / 2}}};
    if (!relu) return g.add_node1(OpId::Conv2d, {x, w, b}, a, name);
    a.set("activation", std::string("relu"));
    return g.add_node1(OpId::FusedConv2d, {x, w, b}, a, name);
  };
  auto cat = [&](std::vector<ValueId> parts, const std::string& name) {
    return g.add_node1(OpId::Concat, parts, {{"dim", int64_t(1)}}, name);
  };
  ValueId x = g.add_input("x", TensorType(dt, Shape{1, c_in, hw, hw}));
  ValueId s = conv(x, c_in, sq, 1, "squeeze", true);
  ValueId x1 = conv(s, sq, e1, 1, "expand1", true);
  ValueId x3 = conv(s, sq, e3, 3, "expand3", true);
  ValueId fire = cat({x1, x3}, "fire");
  const int64_t cf = e1 + e3;
  ValueId b0 = conv(fire, cf, 24, 3, "b0", true);
  ValueId p = g.add_node1(OpId::MaxPool2d, {fire},
                          {{"kernel_size", Ints{3, 3}}, {"stride", Ints{1, 1}},
                           {"padding", Ints{1, 1}}}, "b1");
  ValueId b1 = conv(p, cf, 20, 1, "b1c", true);
  ValueId nest = cat({x3, x1}, "nest");  // not fire again (the passes would merge the two)
  ValueId block = cat({b0, b1, nest}, "block");
  ValueId head = conv(block, 24 + 20 + cf, 32, 1, "head", false);
  ValueId d1 = conv(s, sq, 12, 3, "dense1", false), d2 = conv(s, sq, 20, 1, "dense2", false);
  ValueId dense = g.add_node1(OpId::Relu, {cat({d1, d2}, "plain")}, {}, "dense_relu");
  g.outputs = {head, dense};
  return n;
}

}  // namespace

TEST(InductorConcatLayout, ConcatOfConvolutionsKeepsTheirLayoutAndMatchesTheReference) {
  std::vector<DType> dtypes = {DType::Float32};
  if (onednn::supports_dtype(DType::BFloat16)) dtypes.push_back(DType::BFloat16);
  struct Channels {
    int64_t c_in, e1, e3;
  };
  for (DType dt : dtypes)
    for (Channels ch : {Channels{32, 32, 32}, Channels{20, 24, 40}})
      for (const char* conv : {"auto", cpu::native_conv_layout()}) {
        SCOPED_TRACE(fmt::format("{} channels {}+{} conv={}", dtype_name(dt), ch.e1, ch.e3, conv));
        Generator wgen(314);
        Net net = fire_net(dt, ch.c_in, ch.e1, ch.e3, wgen);
        compiler::Options o;
        o.knobs.set("conv", conv);
        // The blocked policy as such: on a CPU with AMX, bf16 convolutions in nChw16c are far
        // from their roofline and the measurement would move them to nhwc (layouts=measured).
        if (std::string(conv) != "auto") o.knobs.set("layouts", "fixed");
        auto compiled = compiler::compile(net.g, Device::cpu(), o);
        const compiler::CompileReport& r = compiled->report();
        EXPECT_EQ(r.eager_launches, 0) << compiled->summary();
        // The concats that feed convolutions and pools run in oneDNN with no reorder; so do
        // their parts' producers and their consumers. Except where the parts are channel
        // blocked (nChw16c) and a part's channels are not a whole number of blocks: no blocked
        // result can hold such parts, oneDNN's concat writes NCHW, and the consumers reorder.
        const bool whole_blocks = std::string(conv) == "auto" ||
                                  (ch.e1 % cpu::native_conv_block() == 0 &&
                                   ch.e3 % cpu::native_conv_block() == 0);
        for (const char* name : {"concat:fire ", "concat:block ", "concat:nest "}) {
          std::string line = kernel_line(r, name);
          EXPECT_NE(line.find("[oneDNN]: concat dim 1"), std::string::npos) << name << ": " << line;
          if (whole_blocks) EXPECT_EQ(line.find("reorders"), std::string::npos) << line;
        }
        for (const char* name : {"fused_conv2d:expand1 ", "fused_conv2d:expand3 ",
                                 "fused_conv2d:b0 ", "max_pool2d:b1 ", "fused_conv2d:b1c "}) {
          std::string line = kernel_line(r, name);
          EXPECT_NE(line.find("[oneDNN]"), std::string::npos) << name << ": " << line;
          if (whole_blocks) EXPECT_EQ(line.find("reorders"), std::string::npos) << line;
        }
        // A concat whose result a loop kernel reads stays the runtime's plain copy.
        EXPECT_NE(kernel_line(r, "concat:plain ").find("[runtime kernel concat]"),
                  std::string::npos) << compiled->summary();

        // The version its concat needs; by default its weights are prepacked too (version 8).
        PackageInfo plain;
        plain.prepack = false;
        uint32_t version = 0;
        parse_package_container(package_bytes(compiled->executable(), plain), "fire", &version);
        EXPECT_EQ(version, kOnednnConcatFormatVersion);
        const std::string bytes = package_bytes(compiled->executable(), PackageInfo{});
        parse_package_container(bytes, "fire", &version);
        EXPECT_EQ(version, kPrepackedFormatVersion);
        LoadedPackage loaded = load_package_bytes(bytes, "fire");
        for (uint64_t seed : {1u, 2u}) {
          Generator gen(seed);
          TensorList in = {Tensor::randn({1, ch.c_in, 12, 12}, gen, DType::Float32).to(dt)};
          TensorList want = run(test::as_float64(net.g), {in[0].to(DType::Float64)});
          TensorList got = compiled->run(in), pkg = loaded.exe->run(in);
          ASSERT_EQ(got.size(), want.size());
          ASSERT_EQ(pkg.size(), want.size());
          // Three chained convolutions (bf16: each layer's output rounded to 2^-9).
          double tol = dt == DType::BFloat16 ? 3e-2 : 1e-5 * std::sqrt(net.k) * 3;
          for (size_t i = 0; i < got.size(); ++i) {
            test::Comparison c = test::compare(got[i], want[i], test::Tolerance::rel(tol, tol));
            EXPECT_TRUE(c.ok()) << "output " << i << " seed " << seed << ": " << c.str() << "\n"
                                << compiled->summary();
            EXPECT_TRUE(test::close(pkg[i], got[i], test::Tolerance::exact()))
                << "packaged output " << i;
          }
        }
      }
}

// A package that holds a oneDNN concat is format version 6: labelled as an older version (header
// and manifest edited alike, hashes recomputed), the loader refuses it, naming the launch, rather
// than a runtime of that version meeting a node it does not know.
TEST(InductorConcatLayout, ConcatPackageLabelledAnOlderVersionIsRefused) {
  Generator wgen(315);
  Net net = fire_net(DType::Float32, 32, 32, 32, wgen);
  auto compiled = compiler::compile(net.g, Device::cpu(), compiler::Options{});
  PackageInfo info;
  info.prepack = false;  // prepacked weights would make it version 8 (kPrepackedFormatVersion)
  const std::string bytes = package_bytes(compiled->executable(), info);
  uint32_t version = 0;
  parse_package_container(bytes, "fire", &version);
  ASSERT_EQ(version, kOnednnConcatFormatVersion);
  std::string err = test::load_error_as_version(bytes, kCpuPackageFormatVersion, "fire");
  EXPECT_NE(err.find("oneDNN concat node is unknown to format version 2"), std::string::npos) << err;
  EXPECT_NE(err.find("launch"), std::string::npos) << err;
}

// Note [blocked concat copies] and the mixed-layout concat (Note [measured Winograd]): two
// images, x -> [conv 3x3 "wide" 32->48 (relu), conv 1x1 "narrow" 32->32 (relu)] -> concat "join"
// -> conv 1x1 "head". Under conv=nChw16c every part is whole channel blocks, and the concat is
// Kiln's block copy, per image; under winograd=checked the 3x3 part is nChw16c (Winograd) and the
// 1x1 part nhwc, and the concat reorders the odd part first instead of running oneDNN's
// reference concat. Both against float64 on fresh random inputs and through a package, bitwise.
TEST(InductorConcatLayout, BlockedAndMixedLayoutConcatsMatchTheReference) {
  struct Case {
    const char* knob;
    const char* value;
    DType dtype;
    const char* want;  // in the concat's kernel line
  };
  const bool avx512 = cpu::native_conv_block() == 16;
  std::vector<Case> cases = {{"conv", cpu::native_conv_layout(), DType::Float32, "kiln block copy"}};
  if (onednn::supports_dtype(DType::BFloat16))
    cases.push_back({"conv", cpu::native_conv_layout(), DType::BFloat16, "kiln block copy"});
  if (avx512) cases.push_back({"winograd", "checked", DType::Float32, "reorders: src 1 nChw16c->nhwc"});
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("{}={} {}", c.knob, c.value, dtype_name(c.dtype)));
    Generator wgen(316);
    Graph g;
    g.name = "join";
    auto conv = [&](ValueId x, int64_t cin, int64_t cout, int64_t k, const std::string& name,
                    bool relu) {
      double fan_in = double(cin * k * k);
      ValueId w = g.add_param(name + ".w", sample_randn(wgen, {cout, cin, k, k},
                                                        1.0 / std::sqrt(fan_in)).to(c.dtype));
      ValueId b = g.add_param(name + ".b", sample_randn(wgen, {cout}, 0.5).to(c.dtype));
      Attrs a{{"padding", Ints{k / 2, k / 2}}};
      if (!relu) return g.add_node1(OpId::Conv2d, {x, w, b}, a, name);
      a.set("activation", std::string("relu"));
      return g.add_node1(OpId::FusedConv2d, {x, w, b}, a, name);
    };
    ValueId x = g.add_input("x", TensorType(c.dtype, Shape{2, 32, 28, 28}));
    ValueId wide = conv(x, 32, 48, 3, "wide", true), narrow = conv(x, 32, 32, 1, "narrow", true);
    ValueId join = g.add_node1(OpId::Concat, {narrow, wide}, {{"dim", int64_t(1)}}, "join");
    g.outputs = {conv(join, 80, 16, 1, "head", false)};
    compiler::Options o;
    o.knobs.set(c.knob, c.value);
    if (std::string(c.knob) == "conv") o.knobs.set("layouts", "fixed");  // as above
    auto compiled = compiler::compile(g, Device::cpu(), o);
    std::string line = kernel_line(compiled->report(), "concat:join ");
    EXPECT_NE(line.find("[oneDNN]: concat dim 1"), std::string::npos) << compiled->summary();
    EXPECT_NE(line.find(c.want), std::string::npos) << line;
    EXPECT_EQ(line.find(" ref:"), std::string::npos) << line;
    LoadedPackage loaded = load_package_bytes(package_bytes(compiled->executable(), PackageInfo{}),
                                              "join");
    for (uint64_t seed : {3u, 4u}) {
      Generator gen(seed);
      TensorList in = {Tensor::randn({2, 32, 28, 28}, gen, DType::Float32).to(c.dtype)};
      Tensor want = run(test::as_float64(g), {in[0].to(DType::Float64)})[0];
      Tensor got = compiled->run(in)[0], pkg = loaded.exe->run(in)[0];
      double tol = c.dtype == DType::BFloat16 ? 3e-2 : 1e-5 * std::sqrt(288.0) * 2;
      test::Comparison cmp = test::compare(got, want, test::Tolerance::rel(tol, tol));
      EXPECT_TRUE(cmp.ok()) << "seed " << seed << ": " << cmp.str() << "\n" << compiled->summary();
      EXPECT_TRUE(test::close(pkg, got, test::Tolerance::exact())) << "packaged vs compiled";
    }
  }
}
