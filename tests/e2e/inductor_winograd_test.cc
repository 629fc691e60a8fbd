// Winograd convolutions in default-mode CPU compiles (Note [measured Winograd] in
// targets/cpu/onednn_lowering.cc): each 3x3 stride-1 f32 convolution is checked against
// oneDNN's Winograd kernels for agreement (and, under winograd=measured, timed against them).
// Through the compiler: a ResNet basic block behind a stem, compiled with the default
// winograd=checked (Winograd wherever it has a kernel and passes the accuracy check, no
// timing), winograd=off and winograd=measured, each checked against the float64 reference on
// fresh random inputs; the Winograd build must differ from the direct one (else it did not
// run), and its package must rebuild it bitwise. A bad knob value is an error naming the knob.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "../support/compare.h"
#include "../support/compile_report.h"
#include "../support/graph_inputs.h"
#include "compiler/compile.h"
#include "core/error.h"
#include "ir/graph.h"
#include "ir/interpreter.h"
#include "ops/kernel_util.h"
#include "runtime/package.h"
#include "targets/cpu/onednn_lowering.h"

using namespace kiln;

namespace {

using test::kernel_line;

// x [1,16,32,32] -> stem 3x3 16->64 (relu) -> conv 3x3 (relu) -> conv 3x3 + stem (relu)
// -> output 0, and a 1x1 64->8 head on it -> output 1.
Graph block_net() {
  Generator gen(77);
  Graph g;
  g.name = "winograd_block";
  auto param = [&](const std::string& name, Dims d) {
    double fan_in = d.size() == 4 ? double(d[1] * d[2] * d[3]) : 4.0;
    return g.add_param(name, sample_randn(gen, d, 1.0 / std::sqrt(fan_in)).to(DType::Float32));
  };
  auto conv = [&](ValueId x, int64_t cin, int64_t cout, int64_t k, const std::string& name,
                  ValueId residual) {
    std::vector<ValueId> in = {x, param(name + ".w", {cout, cin, k, k}),
                               param(name + ".b", {cout})};
    if (residual != kNoValue) in.push_back(residual);
    Attrs a{{"padding", Ints{k / 2, k / 2}}, {"activation", std::string("relu")},
            {"sum_scale", 1.0}};
    return g.add_node1(OpId::FusedConv2d, in, a, name);
  };
  ValueId x = g.add_input("x", TensorType(DType::Float32, Shape{1, 16, 32, 32}));
  ValueId stem = conv(x, 16, 64, 3, "stem", kNoValue);
  ValueId a = conv(stem, 64, 64, 3, "block_a", kNoValue);
  ValueId b = conv(a, 64, 64, 3, "block_b", stem);
  ValueId head = g.add_node1(OpId::Conv2d, {b, param("head.w", {8, 64, 1, 1})}, {}, "head");
  g.outputs = {b, head};
  return g;
}

std::unique_ptr<compiler::CompiledExecutable> compile_with(const Graph& g, const char* winograd) {
  compiler::Options o;
  if (winograd) o.knobs.set("winograd", winograd);
  return compiler::compile(g, Device::cpu(), o);
}

}  // namespace

TEST(InductorWinograd, WinogradConvolutionsMatchTheReferenceAndSurviveAPackage) {
  const Graph g = block_net();
  const bool avx512 = cpu::native_conv_block() == 16;  // oneDNN 2.6's Winograd kernels
  auto checked = compile_with(g, nullptr);  // the default: winograd=checked
  auto off = compile_with(g, "off");
  auto measured = compile_with(g, "measured");
  for (const char* name : {"fused_conv2d:stem ", "fused_conv2d:block_a ", "fused_conv2d:block_b "}) {
    SCOPED_TRACE(name);
    std::string line = kernel_line(checked->report(), name);
    if (avx512) {
      EXPECT_NE(line.find("wino"), std::string::npos) << line;
      EXPECT_NE(line.find("chose Winograd"), std::string::npos) << line;
      EXPECT_EQ(line.find(" vs direct "), std::string::npos) << "the default timed it: " << line;
      std::string m = kernel_line(measured->report(), name);
      EXPECT_NE(m.find(" vs direct "), std::string::npos) << m;
    } else {
      EXPECT_EQ(line.find("Winograd"), std::string::npos) << line;
    }
    std::string direct = kernel_line(off->report(), name);
    EXPECT_NE(direct.find("[oneDNN]"), std::string::npos) << direct;
    EXPECT_EQ(direct.find("wino"), std::string::npos) << direct;
    EXPECT_EQ(direct.find("Winograd"), std::string::npos) << direct;
  }
  EXPECT_EQ(kernel_line(checked->report(), "conv2d:head ").find("Winograd"), std::string::npos);
  for (const auto* c : {checked.get(), off.get(), measured.get()})
    EXPECT_EQ(c->report().eager_launches, 0) << c->summary();

  const std::string bytes = package_bytes(checked->executable(), PackageInfo{});
  LoadedPackage loaded = load_package_bytes(bytes, "winograd_block");
  for (uint64_t seed : {31u, 32u}) {
    SCOPED_TRACE(fmt::format("seed {}", seed));
    Generator gen(seed);
    TensorList in = {Tensor::randn({1, 16, 32, 32}, gen, DType::Float32)};
    TensorList want = run(test::as_float64(g), {in[0].to(DType::Float64)});
    TensorList got = checked->run(in), direct = off->run(in), chosen = measured->run(in);
    TensorList pkg = loaded.exe->run(in);
    ASSERT_EQ(got.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      SCOPED_TRACE(fmt::format("output {}", i));
      // Three layers of 576-term sums: direct f32 differs from float64 by ~1e-7 of the largest
      // output, Winograd by ~1e-6 (its transforms round too); 2e-5 leaves headroom and would
      // still catch a wrong tap or a lost residual (O(1)).
      for (const Tensor* t : {&got[i], &direct[i], &chosen[i]}) {
        test::Comparison c = test::compare(*t, want[i], test::Tolerance::rel(2e-5, 2e-5));
        EXPECT_TRUE(c.ok()) << c.str();
      }
      EXPECT_TRUE(test::close(pkg[i], got[i], test::Tolerance::exact())) << "packaged vs compiled";
      // Winograd rounds differently: bitwise equal to the direct build means it did not run.
      if (avx512)
        EXPECT_FALSE(test::close(got[i], direct[i], test::Tolerance::exact()))
            << "winograd=checked computed exactly what the direct convolutions compute";
    }
  }
}

// layouts=fixed stops layout measurements only: Winograd is still decided per convolution.
TEST(InductorWinograd, FixedLayoutsStillTakeWinograd) {
  const Graph g = block_net();
  compiler::Options o;
  o.knobs.set("layouts", "fixed");
  auto fixed = compiler::compile(g, Device::cpu(), o);
  for (const char* name : {"fused_conv2d:stem ", "fused_conv2d:block_a ", "fused_conv2d:block_b "}) {
    std::string line = kernel_line(fixed->report(), name);
    if (cpu::native_conv_block() == 16)
      EXPECT_NE(line.find("chose Winograd"), std::string::npos) << line;
    else
      EXPECT_EQ(line.find("Winograd"), std::string::npos) << line;
  }
}

TEST(InductorWinograd, BadLayoutsKnobIsAnErrorNamingTheKnob) {
  const Graph g = block_net();
  compiler::Options o;
  o.knobs.set("layouts", "sometimes");
  const std::string refused = test::compile_error(g, Device::cpu(), o);
  EXPECT_NE(refused.find("knob layouts expected measured | fixed, found 'sometimes'"), std::string::npos)
      << refused;
}

TEST(InductorWinograd, BadKnobValueIsAnErrorNamingTheKnob) {
  const Graph g = block_net();
  try {
    compile_with(g, "sometimes");
    FAIL() << "winograd=sometimes compiled";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("knob winograd expected checked | measured | off, found "
                                         "'sometimes'"),
              std::string::npos)
        << e.what();
  }
}
