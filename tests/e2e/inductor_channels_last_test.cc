// Channels-last values between convolutions and loop kernels (Note [channels-last values] in
// targets/cpu/onednn_lowering.cc): in a MobileNet-v3 / EfficientNet block the depthwise
// convolution's output feeds squeeze-excite loop kernels (a mean over H and W, a scale) whose
// result feeds the next 1x1 convolution. Where this CPU's convolutions compute in nhwc, those
// values are stored NHWC: no reorder around the convolutions, and the loop kernels walk them in
// memory order (the scale a SIMD pointwise kernel along C, the mean a lane reduction along C,
// the hardswish stored by the mean's kernel). Checked against the float64 reference on fresh
// random inputs (float32, bfloat16; channel counts that are and are not multiples of the vector
// width), through a package (format version 7, bitwise; labelled version 6 it is refused), and
// with a value of the block that is also a graph output (graph outputs are NCHW: that group
// stays NCHW, with its reorders). And DenseNet's block: the runtime's concatenations copy
// channels-last parts into a channels-last result; and ConvNeXt's blocks, which read the
// channels-last values through permutations.
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
#include "kernels/onednn_node.h"
#include "ops/kernel_util.h"
#include "ops/onednn.h"
#include "runtime/package.h"

using namespace kiln;

namespace {

using test::kernel_line;

struct Block {
  Graph g;
  double k = 0;  // the longest accumulation, for the tolerance
  int64_t c_in = 0, hw = 0;
};

// x [1, c_in, hw, hw] -> expand 1x1 (silu) -> depthwise 3x3 (silu; or none, then a hardswish
// loop kernel) "dw" -> mean over H, W "pool" -> squeeze 1x1 (relu) -> excite 1x1 (sigmoid) ->
// dw * excite "scale" -> project 1x1 -> + x "residual" (output 0). `dw_is_output`: the
// depthwise value is output 1 too.
Block mbconv(DType dt, int64_t c_in, int64_t c_mid, bool hardswish, bool dw_is_output,
             Generator& gen) {
  Block b;
  b.c_in = c_in;
  b.hw = 14;
  Graph& g = b.g;
  g.name = "mbconv";
  auto param = [&](const std::string& name, Dims d) {
    double fan_in = double(d[1] * d[2] * d[3]);
    b.k = std::max(b.k, fan_in);
    return g.add_param(name, sample_randn(gen, d, 1.0 / std::sqrt(fan_in)).to(dt));
  };
  auto conv = [&](ValueId x, int64_t cin, int64_t cout, int64_t k, int64_t groups,
                  const std::string& name, const char* act) {
    ValueId w = param(name + ".w", {cout, cin / groups, k, k});
    ValueId bias = g.add_param(name + ".b", sample_randn(gen, {cout}, 0.5).to(dt));
    Attrs a{{"padding", Ints{k / 2, k / 2}}, {"groups", groups}};
    if (std::string(act) == "none") return g.add_node1(OpId::Conv2d, {x, w, bias}, a, name);
    a.set("activation", std::string(act));
    return g.add_node1(OpId::FusedConv2d, {x, w, bias}, a, name);
  };
  auto scalar = [&](double v, const std::string& name) {
    return g.add_const(Tensor::scalar(v, dt), name);
  };
  ValueId x = g.add_input("x", TensorType(dt, Shape{1, c_in, b.hw, b.hw}));
  ValueId e = conv(x, c_in, c_mid, 1, 1, "expand", "silu");
  ValueId d = conv(e, c_mid, c_mid, 3, c_mid, "dw", hardswish ? "none" : "silu");
  if (hardswish) {
    ValueId t = g.add_node1(OpId::Add, {d, scalar(3, "three")}, {}, "hs_shift");
    t = g.add_node1(OpId::Clamp, {t}, {{"min", 0.0}, {"max", 6.0}}, "hs_clamp");
    t = g.add_node1(OpId::Div, {t, scalar(6, "six")}, {}, "hs_gate");
    d = g.add_node1(OpId::Mul, {d, t}, {}, "hardswish");
  }
  ValueId p = g.add_node1(OpId::Mean, {d}, {{"dims", Ints{2, 3}}, {"keepdim", true}}, "pool");
  const int64_t c_sq = std::max<int64_t>(4, c_mid / 4);
  ValueId s = conv(p, c_mid, c_sq, 1, 1, "squeeze", "relu");
  s = conv(s, c_sq, c_mid, 1, 1, "excite", "sigmoid");
  ValueId scaled = g.add_node1(OpId::Mul, {d, s}, {}, "scale");
  ValueId y = conv(scaled, c_mid, c_in, 1, 1, "project", "none");
  y = g.add_node1(OpId::Add, {y, x}, {}, "residual");
  g.outputs = {y};
  if (dw_is_output) g.outputs.push_back(d);
  return b;
}

// DenseNet-like: stem conv f0 -> two layers, each norm (x * s + b, relu: loop kernels) of the
// concatenation so far -> 1x1 (relu) -> 3x3 "grow<i>"; the concatenations "cat<i>" are the
// runtime's copies (their results feed loop kernels); a final norm -> 1x1 "head" (output 0).
Block dense_block(DType dt, int64_t growth, Generator& gen) {
  Block b;
  b.c_in = 24;
  b.hw = 14;
  Graph& g = b.g;
  g.name = "dense_block";
  auto conv = [&](ValueId x, int64_t cin, int64_t cout, int64_t k, const std::string& name,
                  bool relu) {
    double fan_in = double(cin * k * k);
    b.k = std::max(b.k, fan_in);
    ValueId w = g.add_param(name + ".w", sample_randn(gen, {cout, cin, k, k}, 1.0 / std::sqrt(fan_in)).to(dt));
    ValueId bias = g.add_param(name + ".b", sample_randn(gen, {cout}, 0.5).to(dt));
    Attrs a{{"padding", Ints{k / 2, k / 2}}};
    if (!relu) return g.add_node1(OpId::Conv2d, {x, w, bias}, a, name);
    a.set("activation", std::string("relu"));
    return g.add_node1(OpId::FusedConv2d, {x, w, bias}, a, name);
  };
  auto norm = [&](ValueId x, int64_t c, const std::string& name) {
    ValueId sc = g.add_param(name + ".s", sample_randn(gen, {1, c, 1, 1}, 0.5).to(dt));
    ValueId sh = g.add_param(name + ".t", sample_randn(gen, {1, c, 1, 1}, 0.5).to(dt));
    ValueId y = g.add_node1(OpId::Mul, {x, sc}, {}, name + "_scale");
    y = g.add_node1(OpId::Add, {y, sh}, {}, name + "_shift");
    return g.add_node1(OpId::Relu, {y}, {}, name + "_relu");
  };
  ValueId x = g.add_input("x", TensorType(dt, Shape{1, b.c_in, b.hw, b.hw}));
  std::vector<ValueId> features = {conv(x, b.c_in, 32, 3, "stem", true)};
  int64_t c = 32;
  for (int i = 1; i <= 2; ++i) {
    ValueId cat = features.size() == 1
                      ? features[0]
                      : g.add_node1(OpId::Concat, features, {{"dim", int64_t(1)}}, fmt::format("cat{}", i - 1));
    ValueId h = conv(norm(cat, c, fmt::format("norm{}", i)), c, 48, 1, fmt::format("bottleneck{}", i), true);
    features.push_back(conv(h, 48, growth, 3, fmt::format("grow{}", i), false));
    c += growth;
  }
  ValueId cat = g.add_node1(OpId::Concat, features, {{"dim", int64_t(1)}}, "cat2");
  g.outputs = {conv(norm(cat, c, "norm3"), c, 20, 1, "head", false)};
  return b;
}

// A 1x1 stem, then two ConvNeXt blocks: depthwise 7x7 "dw<i>" -> permute to NHWC -> layer_norm over C ->
// linear (4C, gelu) -> linear (C) -> * gamma -> permute back -> + the block's input; then the
// mean over H and W.
Block convnext_blocks(int64_t c, Generator& gen) {
  Block b;
  b.c_in = c;
  b.hw = 12;
  Graph& g = b.g;
  g.name = "convnext_blocks";
  const DType dt = DType::Float32;
  auto param = [&](const std::string& name, Dims d, double scale) {
    return g.add_param(name, sample_randn(gen, d, scale).to(dt));
  };
  b.k = double(4 * c);
  ValueId x = g.add_input("x", TensorType(dt, Shape{1, c, b.hw, b.hw}));
  x = g.add_node1(OpId::Conv2d, {x, param("stem.w", {c, c, 1, 1}, 1.0 / std::sqrt(double(c))),
                                 param("stem.b", {c}, 0.5)}, {}, "stem");
  for (int i = 1; i <= 2; ++i) {
    const std::string p = fmt::format("block{}.", i);
    ValueId d = g.add_node1(OpId::Conv2d, {x, param(p + "dw.w", {c, 1, 7, 7}, 1.0 / 7), param(p + "dw.b", {c}, 0.5)},
                            {{"padding", Ints{3, 3}}, {"groups", c}}, fmt::format("dw{}", i));
    ValueId t = g.add_node1(OpId::Permute, {d}, {{"dims", Ints{0, 2, 3, 1}}}, p + "to_nhwc");
    t = g.add_node1(OpId::LayerNorm, {t, param(p + "ln.w", {c}, 1.0), param(p + "ln.b", {c}, 0.5)},
                    {{"normalized_shape", Ints{c}}, {"eps", 1e-6}}, p + "norm");
    t = g.add_node1(OpId::Linear, {t, param(p + "fc1.w", {4 * c, c}, 1.0 / std::sqrt(double(c))),
                                   param(p + "fc1.b", {4 * c}, 0.5)}, {}, p + "fc1");
    t = g.add_node1(OpId::Gelu, {t}, {{"approximate", std::string("none")}}, p + "gelu");
    t = g.add_node1(OpId::Linear, {t, param(p + "fc2.w", {c, 4 * c}, 0.5 / std::sqrt(double(c))),
                                   param(p + "fc2.b", {c}, 0.5)}, {}, p + "fc2");
    t = g.add_node1(OpId::Mul, {t, param(p + "gamma", {c}, 0.5)}, {}, p + "scale");
    t = g.add_node1(OpId::Permute, {t}, {{"dims", Ints{0, 3, 1, 2}}}, p + "to_nchw");
    x = g.add_node1(OpId::Add, {x, t}, {}, p + "residual");
  }
  // The head's global average pool (the residual stream itself must not be a graph output:
  // outputs are NCHW).
  g.outputs = {g.add_node1(OpId::Mean, {x}, {{"dims", Ints{2, 3}}, {"keepdim", false}}, "pool")};
  return b;
}

// The report line of the loop kernel that computes node `node`.
std::string loop_line(const compiler::CompileReport& r, const std::string& node) {
  for (const std::string& k : r.kernels)
    if (k.rfind("k", 0) == 0 && k.find("'" + node + "'") != std::string::npos) return k;
  return "";
}

void check_outputs(const Block& b, compiler::CompiledExecutable& compiled,
                   Executable* packaged, DType dt) {
  for (uint64_t seed : {11u, 12u}) {
    Generator gen(seed);
    TensorList in = {Tensor::randn({1, b.c_in, b.hw, b.hw}, gen, DType::Float32).to(dt)};
    TensorList want = run(test::as_float64(b.g), {in[0].to(DType::Float64)});
    TensorList got = compiled.run(in);
    ASSERT_EQ(got.size(), want.size());
    // Four chained convolutions (bfloat16: each layer's output rounded to 2^-9).
    double tol = dt == DType::BFloat16 ? 4e-2 : 1e-5 * std::sqrt(b.k) * 4;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(got[i].is_contiguous()) << "output " << i;
      test::Comparison c = test::compare(got[i], want[i], test::Tolerance::rel(tol, tol));
      EXPECT_TRUE(c.ok()) << "output " << i << " seed " << seed << ": " << c.str() << "\n"
                          << compiled.summary();
    }
    if (packaged) {
      TensorList pkg = packaged->run(in);
      ASSERT_EQ(pkg.size(), got.size());
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_TRUE(test::close(pkg[i], got[i], test::Tolerance::exact())) << "packaged output " << i;
    }
  }
}

// A package with a channels-last operand is format version 7: labelled version 6 (header and
// manifest edited alike, hashes recomputed), the loader refuses it, naming the launch, rather
// than a runtime of that version reading the operand as NCHW.
void expect_refused_as_version_6(const std::string& bytes) {
  uint32_t version = 0;
  parse_package_container(bytes, "mbconv", &version);
  ASSERT_EQ(version, kChannelsLastFormatVersion);
  std::string err = test::load_error_as_version(bytes, kOnednnConcatFormatVersion, "mbconv");
  EXPECT_NE(err.find("channels-last operand is unknown to format version 6"), std::string::npos)
      << err;
  EXPECT_NE(err.find("launch"), std::string::npos) << err;
}

}  // namespace

TEST(InductorChannelsLast, SqueezeExciteBlockRunsChannelsLastAndMatchesTheReference) {
  const bool nhwc = kernels::convolutions_prefer_nhwc(false);
  std::vector<DType> dtypes = {DType::Float32};
  if (onednn::supports_dtype(DType::BFloat16)) dtypes.push_back(DType::BFloat16);
  for (DType dt : dtypes)
    for (int64_t c_mid : {int64_t(48), int64_t(40), int64_t(37)})
      for (bool hardswish : {false, true}) {
        SCOPED_TRACE(fmt::format("{} c_mid {} {}", dtype_name(dt), c_mid,
                                 hardswish ? "hardswish" : "silu"));
        Generator wgen(401);
        Block b = mbconv(dt, 24, c_mid, hardswish, false, wgen);
        auto compiled = compiler::compile(b.g, Device::cpu(), compiler::Options{});
        const compiler::CompileReport& r = compiled->report();
        EXPECT_EQ(r.eager_launches, 0) << compiled->summary();
        const bool cl = dt == DType::BFloat16 ? kernels::convolutions_prefer_nhwc(true) : nhwc;
        if (cl) {
          // No transposing copy after the depthwise convolution nor before the project one
          // (whose result, a graph output, is NCHW).
          std::string dw = kernel_line(r, hardswish ? "conv2d:dw " : "fused_conv2d:dw ");
          EXPECT_NE(dw.find("[oneDNN]"), std::string::npos) << compiled->summary();
          EXPECT_EQ(dw.find("reorders"), std::string::npos) << dw;
          std::string project = kernel_line(r, "fused_conv2d:project ");
          EXPECT_NE(project.find("src nhwc"), std::string::npos) << compiled->summary();
          EXPECT_EQ(project.find("reorders: src"), std::string::npos) << project;
          // The loop kernels walk the NHWC values along C with SIMD lanes.
          EXPECT_NE(loop_line(r, "scale").find("[pointwise, SIMD]"), std::string::npos)
              << compiled->summary();
          EXPECT_NE(loop_line(r, "pool").find("[reduce, SIMD]"), std::string::npos)
              << compiled->summary();
        }
        // The version its operands need (with prepacked weights, the default, it is 8).
        PackageInfo plain_info;
        plain_info.prepack = false;
        const std::string plain = package_bytes(compiled->executable(), plain_info);
        uint32_t version = 0;
        parse_package_container(plain, "mbconv", &version);
        EXPECT_EQ(version, cl ? kChannelsLastFormatVersion : kCpuPackageFormatVersion);
        const std::string bytes = package_bytes(compiled->executable(), PackageInfo{});
        parse_package_container(bytes, "mbconv", &version);
        EXPECT_EQ(version, kPrepackedFormatVersion);
        LoadedPackage loaded = load_package_bytes(bytes, "mbconv");
        if (cl) expect_refused_as_version_6(plain);
        check_outputs(b, *compiled, loaded.exe.get(), dt);
      }
}

// A value of the block that is also a graph output must be NCHW (outputs are contiguous
// tensors): its group (the depthwise output, the hardswish, the scale) stays NCHW, and the
// convolutions around it reorder, as before channels-last values.
TEST(InductorChannelsLast, GroupWithAGraphOutputStaysNchw) {
  Generator wgen(402);
  Block b = mbconv(DType::Float32, 24, 40, true, true, wgen);
  auto compiled = compiler::compile(b.g, Device::cpu(), compiler::Options{});
  const compiler::CompileReport& r = compiled->report();
  EXPECT_EQ(r.eager_launches, 0) << compiled->summary();
  if (kernels::convolutions_prefer_nhwc(false)) {
    std::string dw = kernel_line(r, "conv2d:dw ");
    EXPECT_NE(dw.find("reorders: dst nhwc->nchw"), std::string::npos) << compiled->summary();
  }
  check_outputs(b, *compiled, nullptr, DType::Float32);
}


// DenseNet's concatenations of convolution outputs feed loop kernels (the norm before each
// bottleneck): they are the runtime's copies, and where convolutions compute in nhwc, every
// value of the block is channels-last: the convolutions write their outputs and read the
// normalized concatenations without a reorder, and the concat copies C_i channels per pixel
// (Note [channels-last concat] in compiler/bind.cc).
TEST(InductorChannelsLast, DenseBlockConcatenatesChannelsLastAndMatchesTheReference) {
  const bool nhwc = kernels::convolutions_prefer_nhwc(false);
  for (int64_t growth : {int64_t(16), int64_t(12)}) {
    SCOPED_TRACE(fmt::format("growth {}", growth));
    Generator wgen(404);
    Block b = dense_block(DType::Float32, growth, wgen);
    auto compiled = compiler::compile(b.g, Device::cpu(), compiler::Options{});
    const compiler::CompileReport& r = compiled->report();
    EXPECT_EQ(r.eager_launches, 0) << compiled->summary();
    for (const char* cat : {"concat:cat1 ", "concat:cat2 "})
      EXPECT_NE(kernel_line(r, cat).find("[runtime kernel concat]"), std::string::npos)
          << cat << "\n" << compiled->summary();
    if (nhwc) {
      // (The stem reads the NCHW graph input: its src reorder stays.)
      std::string stem = kernel_line(r, "fused_conv2d:stem ");
      EXPECT_EQ(stem.find("dst nhwc->"), std::string::npos) << stem;
      for (const char* name : {"conv2d:grow1 ", "conv2d:grow2 ",
                               "fused_conv2d:bottleneck1 ", "fused_conv2d:bottleneck2 "}) {
        std::string line = kernel_line(r, name);
        EXPECT_NE(line.find("[oneDNN]"), std::string::npos) << name << "\n" << compiled->summary();
        EXPECT_EQ(line.find("reorders"), std::string::npos) << line;
      }
      EXPECT_EQ(kernel_line(r, "conv2d:head ").find("reorders: src"), std::string::npos)
          << compiled->summary();
    }
    const std::string bytes = package_bytes(compiled->executable(), PackageInfo{});
    LoadedPackage loaded = load_package_bytes(bytes, "dense");
    check_outputs(b, *compiled, loaded.exe.get(), DType::Float32);
  }
}

// ConvNeXt permutes the depthwise convolution's output to NHWC for its layer_norm and the MLP's
// result back to NCHW for the residual add. A permutation only loop kernels read does not stop
// a value from being channels-last: the scheduler composes the strides, so the layer_norm reads
// contiguous rows, the residual add reads the MLP's rows in order, and the depthwise
// convolutions neither read nor write through a reorder.
TEST(InductorChannelsLast, ConvNextBlocksReadThroughPermutationsAndMatchTheReference) {
  for (int64_t c : {int64_t(32), int64_t(24)}) {
    SCOPED_TRACE(fmt::format("channels {}", c));
    Generator wgen(405);
    Block b = convnext_blocks(c, wgen);
    auto compiled = compiler::compile(b.g, Device::cpu(), compiler::Options{});
    const compiler::CompileReport& r = compiled->report();
    EXPECT_EQ(r.eager_launches, 0) << compiled->summary();
    if (kernels::convolutions_prefer_nhwc(false)) {
      for (const char* name : {"conv2d:dw1 ", "conv2d:dw2 "}) {
        std::string line = kernel_line(r, name);
        EXPECT_NE(line.find("[oneDNN]"), std::string::npos) << compiled->summary();
        EXPECT_EQ(line.find("reorders"), std::string::npos) << line;
      }
      for (const char* node : {"block1.norm", "block2.norm"})
        EXPECT_NE(loop_line(r, node).find("SIMD"), std::string::npos) << compiled->summary();
    }
    const std::string bytes = package_bytes(compiled->executable(), PackageInfo{});
    LoadedPackage loaded = load_package_bytes(bytes, "convnext");
    check_outputs(b, *compiled, loaded.exe.get(), DType::Float32);
  }
}
