// max-autotune of the CPU compiler: the candidates it times (oneDNN layout policies, Winograd
// convolutions, generated vs oneDNN GEMV), the accuracy gate on candidates that round
// differently, the persisted choice, and the numerics of whatever it picks (vs eager on fresh
// inputs). Every test points KILN_CACHE_DIR at its own fresh directory so that the tuning store
// starts empty.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstring>
#include <string>

#include "compiler/backend.h"
#include "capture/compile.h"
#include "nn/compile.h"
#include "compiler/compile.h"
#include "ir/graph.h"
#include "ir/interpreter.h"
#include "nn/models/zoo.h"
#include "../support/compare.h"
#include "../support/graph_inputs.h"

using namespace kiln;

namespace {

class FreshCacheDir {
 public:
  FreshCacheDir() {
    char tmpl[] = "/tmp/kiln-autotune-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    const char* old = std::getenv("KILN_CACHE_DIR");
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv("KILN_CACHE_DIR", dir_.c_str(), 1);
  }
  ~FreshCacheDir() {
    if (had_) setenv("KILN_CACHE_DIR", old_.c_str(), 1);
    else unsetenv("KILN_CACHE_DIR");
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

 private:
  std::string dir_, old_;
  bool had_ = false;
};

// The options the test backend compiles with, and the report of its last compile.
compiler::Options g_options;
std::string g_last_autotune;

// Registers the test backend, compiling in max-autotune with `tolerance` (no progress bar).
void use_max_autotune_backend(double tolerance = 1e-4) {
  register_backend("inductor-autotune-test", [](const Graph& g, const BackendOptions&) {
    auto compiled = compiler::compile(g, Device::cpu(), g_options);
    g_last_autotune = compiled->report().autotune;
    return std::unique_ptr<CompiledGraph>(std::move(compiled));
  });
  g_options = compiler::Options{};
  g_options.mode = "max-autotune";
  g_options.progress = false;
  g_options.autotune_tolerance = tolerance;
}

// |got - want| <= rtol * max(1, max|want|) everywhere (tests/support/compare.h): the error of
// reordered float32 arithmetic follows the output's scale.
::testing::AssertionResult near_scale(const std::vector<double>& got,
                                      const std::vector<double>& want, double rtol) {
  double max_abs = test::max_abs(want);
  return test::close(got, want, test::Tolerance::of_scale(std::max(1.0, max_abs), rtol));
}

// Compiles resnet18 through the test backend and checks two fresh input sets against eager
// (2e-4 of the output scale, as the zoo tests). Returns the autotune report.
std::string compile_and_check(const nn::ZooModel& m) {
  CompileOptions o;
  o.backend = "inductor-autotune-test";
  o.strict = true;
  CompiledFunction f = compile(m.module, o);
  for (uint64_t seed : {11u, 12u}) {
    Generator gen(seed);
    TensorList in = {Tensor::randn(m.inputs[0].sizes(), gen, DType::Float32)};
    auto got = f(in)[0].to_vector<double>();
    auto want = m.module->call(in)[0].to_vector<double>();
    EXPECT_TRUE(near_scale(got, want, 2e-4)) << "seed " << seed << "; " << g_last_autotune;
  }
  return g_last_autotune;
}

// The blocked convolution layout of this CPU (the conv knob's value): nChw16c with AVX-512,
// nChw8c with AVX2.
std::string blocked_layout() { return __builtin_cpu_supports("avx512f") ? "nChw16c" : "nChw8c"; }

std::string chosen(const std::string& report) {
  // "chose NAME (...)" or "cached choice NAME"
  for (const char* p : {"chose ", "cached choice "}) {
    size_t at = report.find(p);
    if (at == std::string::npos) continue;
    at += std::strlen(p);
    return report.substr(at, report.find(' ', at) - at);
  }
  return "";
}

}  // namespace

// The candidates include Winograd for a network of 3x3 convolutions; every candidate is timed
// (or rejected, with its error); the choice is persisted and a second compile of the same
// graph reuses it without timing; the picked executable matches eager.
TEST(InductorAutotune, TimesCandidatesPersistsChoiceAndStaysAccurate) {
  FreshCacheDir cache;
  use_max_autotune_backend();
  // Every candidate must be timed here: no slowness cut-off, whose verdict depends on the load
  // of the machine (on CI, another test runs beside this one).
  g_options.autotune_slow_cutoff = 0;
  nn::ZooModel m = nn::make_zoo_model("resnet18", 1, 5);

  std::string first = compile_and_check(m);
  for (const std::string& cand : {std::string("conv=auto "), "conv=" + blocked_layout() + " ", std::string("conv=plain ")})
    EXPECT_NE(first.find(cand), std::string::npos) << cand << " not tried: " << first;
  if (__builtin_cpu_supports("avx512f")) {
    // oneDNN 2.6 has f32 Winograd on AVX-512: it is timed, and agrees with direct.
    EXPECT_NE(first.find("conv=nChw16c+winograd "), std::string::npos) << first;
    EXPECT_NE(first.find("(relative error "), std::string::npos) << first;
  }
  EXPECT_EQ(first.find("rejected"), std::string::npos) << first;
  std::string pick = chosen(first);
  ASSERT_FALSE(pick.empty()) << first;

  std::string second = compile_and_check(m);  // new CompiledFunction, same graph
  EXPECT_EQ(second.rfind("cached choice " + pick, 0), 0u) << second;
  EXPECT_EQ(second.find("chose"), std::string::npos) << second;  // nothing timed again
}

// A candidate whose outputs differ from the exact candidate by more than the tolerance is
// rejected and never chosen; with tolerance 0 that is Winograd, whose rounding differs. Without
// AVX-512, oneDNN 2.6 has no f32 Winograd: the candidate then computes exactly what direct does.
TEST(InductorAutotune, InexactCandidateOutsideToleranceIsRejected) {
  FreshCacheDir cache;
  use_max_autotune_backend(/*tolerance=*/0);
  nn::ZooModel m = nn::make_zoo_model("resnet18", 1, 6);
  std::string report = compile_and_check(m);
  if (__builtin_cpu_supports("avx512f")) {
    EXPECT_NE(report.find("conv=nChw16c+winograd rejected (relative error "),
              std::string::npos)
        << report;
    EXPECT_EQ(chosen(report).find("winograd"), std::string::npos) << report;
  } else {
    // No f32 Winograd without AVX-512: the candidate computes what direct does and is kept
    // even at tolerance 0 (code-generation variants after the choice may still be rejected).
    EXPECT_NE(report.find("conv=" + blocked_layout() + "+winograd "), std::string::npos) << report;
    std::string candidates = report.substr(0, report.find("; variants:"));
    EXPECT_EQ(candidates.find("rejected"), std::string::npos) << report;
  }
}

// A graph without convolutions has no layout candidates; its small linears give the GEMV
// choice (generated reduction vs oneDNN), both timed.
TEST(InductorAutotune, MlpTunesOnlyTheGemvChoice) {
  FreshCacheDir cache;
  use_max_autotune_backend();
  nn::ZooModel m = nn::make_zoo_model("mlp", 1, 7);
  compile_and_check(m);
  EXPECT_NE(g_last_autotune.find("gemv=generated "), std::string::npos) << g_last_autotune;
  EXPECT_NE(g_last_autotune.find("gemv=onednn "), std::string::npos) << g_last_autotune;
  EXPECT_EQ(g_last_autotune.find("conv="), std::string::npos) << g_last_autotune;
}

// Loop kernels big enough to fork get their thread count timed (1 vs all) after the candidate
// is chosen; the counts are persisted with the choice and applied by the next compile, and the
// results do not depend on them.
TEST(InductorAutotune, KernelThreadCountsAreTunedAndPersisted) {
  FreshCacheDir cache;
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::Float32, Shape{64, 1024}));
  ValueId y = g.add_input("y", TensorType(DType::Float32, Shape{64, 1024}));
  ValueId e = g.add_node1(OpId::Exp, {x}, {}, "exp");
  ValueId m = g.add_node1(OpId::Mul, {e, y}, {}, "mul");
  ValueId sm = g.add_node1(OpId::Softmax, {m}, {{"dim", int64_t(-1)}}, "softmax");
  ValueId t = g.add_node1(OpId::Transpose, {sm}, {{"dim0", int64_t(0)}, {"dim1", int64_t(1)}}, "t");
  ValueId r = g.add_node1(OpId::Relu, {t}, {}, "relu");
  g.outputs = {sm, r};
  compiler::Options o;
  o.mode = "max-autotune";
  o.progress = false;
  Generator gen(21);
  TensorList in = {Tensor::randn({64, 1024}, gen, DType::Float32),
                   Tensor::randn({64, 1024}, gen, DType::Float32)};
  TensorList want = run(g, in);
  for (int compile_no = 0; compile_no < 2; ++compile_no) {
    auto c = compiler::compile(g, Device::cpu(), o);
    const std::string& rep = c->report().autotune;
    if (compile_no == 0) {
      EXPECT_EQ(rep.rfind("chose default", 0), 0u) << rep;
      EXPECT_NE(rep.find("kernel threads: "), std::string::npos) << rep;
      EXPECT_NE(rep.find(" tunable loop kernels changed from the default"), std::string::npos) << rep;
      if (__builtin_cpu_supports("avx512f"))  // both vector widths timed
        EXPECT_NE(rep.find("; variants: 512-bit "), std::string::npos) << rep;
    } else {
      // On AVX-512 the choice may carry ",vec=256" (256-bit vectors won).
      EXPECT_TRUE(rep.rfind("cached choice default; cached kernel threads (", 0) == 0 ||
                  rep.rfind("cached choice default,vec=256; cached kernel threads (", 0) == 0)
          << rep;
    }
    TensorList got = c->run(in);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      auto a = got[i].to_vector<double>(), b = want[i].to_vector<double>();
      EXPECT_TRUE(test::close(a, b, test::Tolerance::rel(0, 1e-5)))
          << "output " << i << " (compile " << compile_no << ")";
    }
  }
}

// Convolution policies are not searched where convolutions are a sliver of the work (below 5%
// of the multiply-adds, e.g. ViT's patch embedding): the report says so, and the result is
// still the default compile's.
TEST(InductorAutotune, ConvolutionPoliciesSkippedWhereConvolutionsAreNegligible) {
  FreshCacheDir cache;
  Generator gen(31);
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::Float32, Shape{1, 3, 8, 8}));
  ValueId w = g.add_param("w", Tensor::randn({4, 3, 3, 3}, gen, DType::Float32));
  ValueId c = g.add_node1(OpId::Conv2d, {x, w}, {}, "conv");  // 144 outputs x 27 = 3.9K MACs
  ValueId f = g.add_node1(OpId::Flatten, {c}, {{"start_dim", int64_t(1)}}, "flat");
  ValueId lw = g.add_param("lw", Tensor::randn({2048, 144}, gen, DType::Float32));
  ValueId y = g.add_node1(OpId::Linear, {f, lw}, {}, "fc");  // 295K MACs
  g.outputs = {y};
  compiler::Options o;
  o.mode = "max-autotune";
  o.progress = false;
  auto compiled = compiler::compile(g, Device::cpu(), o);
  const std::string& rep = compiled->report().autotune;
  EXPECT_NE(rep.find("convolution policies not tried (convolutions are 1.3% of the multiply-adds)"),
            std::string::npos)
      << rep;
  EXPECT_EQ(rep.find("conv=" + blocked_layout()), std::string::npos) << rep;
  TensorList in = {Tensor::randn({1, 3, 8, 8}, gen, DType::Float32)};
  auto got = compiled->run(in)[0].to_vector<double>();
  auto want = run(g, in)[0].to_vector<double>();
  EXPECT_TRUE(near_scale(got, want, 2e-4));
}

namespace {

// Reductions of every kind over innermost, outer and several dims, with lengths that leave
// tails for 4 x 16 and 4 x 8 lanes, and a pointwise prologue and epilogue.
Graph reductions_graph() {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::Float32, Shape{6, 9, 301}));
  ValueId e = g.add_node1(OpId::Tanh, {x}, {}, "tanh");
  ValueId s = g.add_node1(OpId::Sum, {e}, {{"dims", Ints{-1}}, {"keepdim", false}}, "sum");
  ValueId m = g.add_node1(OpId::Mean, {x}, {{"dims", Ints{1, 2}}, {"keepdim", true}}, "mean");
  ValueId mx = g.add_node1(OpId::Max, {x}, {{"dims", Ints{-1}}, {"keepdim", false}}, "max");
  ValueId mn = g.add_node1(OpId::Min, {e}, {{"dims", Ints{0, 2}}, {"keepdim", false}}, "min");
  ValueId sc = g.add_node1(OpId::Mul, {e, e}, {}, "sq");
  ValueId p1 = g.add_node1(OpId::Add, {sc, g.add_const(Tensor::scalar(1.0, DType::Float32), "one")}, {}, "p1");
  ValueId pr = g.add_node1(OpId::Prod, {p1}, {{"dims", Ints{1}}, {"keepdim", false}}, "prod");
  ValueId r = g.add_node1(OpId::Relu, {s}, {}, "relu");
  g.outputs = {r, m, mx, mn, pr};
  return g;
}

}  // namespace

// unroll=4 (four vector accumulators per reduction) and 256-bit vectors compute every
// reduction kind as the eager kernels do, up to summation order.
TEST(InductorCodegenVariants, UnrolledReductionsMatchEager) {
  Graph g = reductions_graph();
  Generator gen(41);
  TensorList in = {Tensor::randn({6, 9, 301}, gen, DType::Float32)};
  TensorList want = run(g, in);
  for (int bits : {0, 256}) {
    compiler::Options o;
    o.knobs.set("unroll", "4");
    if (bits == 256) o.knobs.set("vec", "256");
    auto c = compiler::compile(g, Device::cpu(), o);
    int simd_reduces = 0;
    for (const std::string& k : c->report().kernels) simd_reduces += k.find("[reduce, SIMD]") != std::string::npos;
    EXPECT_GE(simd_reduces, 3) << c->summary();
    TensorList got = c->run(in);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      auto a = got[i].to_vector<double>(), b = want[i].to_vector<double>();
      EXPECT_TRUE(near_scale(a, b, 1e-5)) << "output " << i << " bits " << bits;
    }
  }
}

// max-autotune tries the code-generation variants of a graph with SIMD reductions (4
// accumulators; on AVX-512 also 256-bit vectors) and reports each one's time.
TEST(InductorAutotune, TimesCodegenVariantsOfReductions) {
  FreshCacheDir cache;
  compiler::Options o;
  o.mode = "max-autotune";
  o.progress = false;
  auto c = compiler::compile(reductions_graph(), Device::cpu(), o);
  const std::string& rep = c->report().autotune;
  EXPECT_NE(rep.find("; variants: 512-bit "), std::string::npos) << rep;
  EXPECT_NE(rep.find(", unroll=4 "), std::string::npos) << rep;
  if (__builtin_cpu_supports("avx512f")) {
    EXPECT_NE(rep.find(", vec=256 "), std::string::npos) << rep;
    EXPECT_NE(rep.find(", vec=256,unroll=4 "), std::string::npos) << rep;
  }
}

// Attention-style matmuls whose operands are permuted views (heads split out of [S, H*D], K
// transposed) read the views with their strides: no copy kernels, results as eager. Sequence
// lengths of BERT (128) and ViT (197).
TEST(InductorStridedMatmul, PermutedOperandsAreNotCopied) {
  for (int64_t seq : {128, 197}) {
    SCOPED_TRACE(seq);
    Graph g;
    const int64_t H = 4, D = 32;
    ValueId q = g.add_input("q", TensorType(DType::Float32, Shape{1, seq, H * D}));
    ValueId k = g.add_input("k", TensorType(DType::Float32, Shape{1, seq, H * D}));
    ValueId v = g.add_input("v", TensorType(DType::Float32, Shape{1, seq, H * D}));
    auto heads = [&](ValueId x, const char* name) {
      ValueId r = g.add_node1(OpId::Reshape, {x}, {{"shape", Ints{1, seq, H, D}}}, std::string(name) + ".r");
      return g.add_node1(OpId::Permute, {r}, {{"dims", Ints{0, 2, 1, 3}}}, std::string(name) + ".p");
    };
    ValueId qh = heads(q, "q"), kh = heads(k, "k"), vh = heads(v, "v");
    ValueId kt = g.add_node1(OpId::Transpose, {kh}, {{"dim0", int64_t(-2)}, {"dim1", int64_t(-1)}}, "kt");
    ValueId s = g.add_node1(OpId::Matmul, {qh, kt}, {}, "scores");
    ValueId p = g.add_node1(OpId::Softmax, {s}, {{"dim", int64_t(-1)}}, "softmax");
    ValueId o = g.add_node1(OpId::Matmul, {p, vh}, {}, "context");
    g.outputs = {o};
    compiler::Options opt;
    auto c = compiler::compile(g, Device::cpu(), opt);
    int strided = 0, copies = 0;
    for (const std::string& line : c->report().kernels) {
      strided += line.find("matmul") != std::string::npos &&
                 (line.find(" strided") != std::string::npos || line.find(" reordered") != std::string::npos);
      copies += line.find("copy") != std::string::npos;
    }
    EXPECT_EQ(copies, 0) << c->summary();
    EXPECT_EQ(strided, 2) << c->summary();
    Generator gen(51 + uint64_t(seq));
    TensorList in;
    for (int i = 0; i < 3; ++i) in.push_back(Tensor::randn({1, seq, H * D}, gen, DType::Float32));
    auto got = c->run(in)[0].to_vector<double>();
    auto want = run(g, in)[0].to_vector<double>();
    EXPECT_TRUE(near_scale(got, want, 1e-5)) << c->summary();
  }
}

// The candidates are chosen from every node's types, convolutions or not: a node whose second
// input is absent (a layer_norm with a bias and no weight) must not be read as a weight. A
// one-row linear of 1024 x 512 next to it is most of the multiply-adds, so the GEMV choice is a
// candidate (Note [reduction rows]); the compile matches the float64 reference.
TEST(InductorAutotune, AbsentSecondInputsAndOneRowLinearsChooseCandidates) {
  FreshCacheDir cache;
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::Float32, Shape{1, 1024}));
  ValueId b = g.add_input("b", TensorType(DType::Float32, Shape{1024}));
  ValueId w = g.add_input("w", TensorType(DType::Float32, Shape{512, 1024}));
  ValueId n = g.add_node(OpId::LayerNorm, {x, kNoValue, b}, {{"normalized_shape", Ints{1024}}}, "norm")[0];
  g.outputs = {g.add_node1(OpId::Linear, {n, w}, {}, "fc")};
  compiler::Options o;
  o.mode = "max-autotune";
  o.progress = false;
  auto c = compiler::compile(g, Device::cpu(), o);
  const std::string& rep = c->report().autotune;
  EXPECT_NE(rep.find("gemv=onednn"), std::string::npos) << rep;
  Generator gen(5);
  TensorList in = {Tensor::randn({1, 1024}, gen, DType::Float32), Tensor::randn({1024}, gen, DType::Float32),
                   Tensor::randn({512, 1024}, gen, DType::Float32)};
  TensorList in64;
  for (const Tensor& t : in) in64.push_back(t.to(DType::Float64));
  const Tensor want = run(test::as_float64(g), in64)[0], got = c->run(in)[0];
  EXPECT_TRUE(test::compare(got, want, test::Tolerance::rel(1e-5, 1e-5)).ok());
}
