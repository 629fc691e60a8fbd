// Note [CUDA TF32] (src/targets/cuda/target.cc): float32 graphs compiled with the knob tf32=on run
// their cuBLASLt GEMMs and cuDNN convolutions on TF32 tensor cores (the convolutions
// channels-last); without it float32 stays exact. Checked against the float64 oracle on fresh
// random inputs: exact float32 within float32 rounding, TF32 within float16-sized rounding and
// not bitwise the exact run (else TF32 did not run); a package keeps the choice bitwise, and the
// tuning store does not hand an exact convolution's timed engine to a TF32 one.
// Part of kiln_cuda_tests (exits 77 without a device).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "../support/captured_graphs.h"
#include "../support/compare.h"
#include "../support/files.h"
#include "../support/graph_inputs.h"
#include "compiler/backend.h"
#include "compiler/compile.h"
#include "ir/graph.h"
#include "nn/models/zoo.h"
#include "nn/package.h"
#include "runtime/package.h"

using namespace kiln;

namespace {

const Device kCuda = Device::cuda(0);

TensorList to(const TensorList& in, Device d) {
  TensorList out;
  for (const Tensor& t : in) out.push_back(t.to(d));
  return out;
}

compiler::Options with_knobs(const char* knobs, const std::string& mode = "default") {
  compiler::Options o;
  o.mode = mode;
  o.knobs = compiler::parse_knobs(knobs, "test");
  return o;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

// resnet18 (20 convolutions and the fc GEMM) and bert_base (72 GEMMs, the attention in float32:
// no TF32) in float32, exact and TF32, against float64.
TEST(CudaTf32, ResNetAndBertOnTensorCoresMatchFloat64) {
  // TF32 rounds a product's inputs to 11 significant bits and accumulates in float32: the
  // float16 autocast tests' 8 units of 2^-11 (tests/cuda/autocast_cuda_test.cc) bound it, as
  // float16 autocast rounds every stored value too, which TF32 does not.
  const double tf32_tol = 8.0 / 2048;
  for (const char* name : {"resnet18", "bert_base"}) {
    nn::ZooModel model = nn::make_zoo_model(name, 1, 21);
    std::vector<Graph> graphs = test::capture_graphs(model.module, model.inputs);
    ASSERT_EQ(graphs.size(), 1u) << name;
    const Graph& g = graphs[0];
    // Fresh inputs: resnet18's image from a seed the model was not built with; BERT keeps its
    // own token ids and mask (integers), in the graph's order.
    TensorList in = std::string(name) == "resnet18"
                        ? test::graph_test_inputs(g, model.inputs, false, 4242)
                        : test::graph_test_inputs(g, model.inputs, true, 0);
    TensorList in64;
    for (const Tensor& t : in) in64.push_back(is_floating(t.dtype()) ? t.to(DType::Float64) : t);
    TensorList ref = find_backend("eager")(test::as_float64(g), BackendOptions{})->run(in64);

    auto exact = compiler::compile(g, kCuda, {});
    auto tf32 = compiler::compile(g, kCuda, with_knobs("tf32=on"));
    const std::string exact_summary = exact->summary(), tf32_summary = tf32->summary();
    EXPECT_EQ(exact_summary.find("tf32"), std::string::npos) << name << "\n" << exact_summary;
    if (std::string(name) == "resnet18") {
      // Every convolution but the 3-channel stem computes channels-last on tensor cores; the
      // stem is the small-channel direct kernel (Note [CUDA small-channel convolutions]), in
      // float32 on the CUDA cores whatever the knob.
      EXPECT_EQ(count(tf32_summary, "conv2d f32 tf32 NHWC"), 19u) << tf32_summary;
      EXPECT_EQ(count(tf32_summary, "conv2d f32 tf32 NCHW"), 0u) << tf32_summary;
      EXPECT_EQ(count(tf32_summary, "small-channel direct kernel (float32, 3 input channels"), 1u)
          << tf32_summary;
    } else {
      EXPECT_GE(count(tf32_summary, "gemm f32 tf32"), 48u) << tf32_summary;
    }
    TensorList got_exact = exact->run(to(in, kCuda)), got_tf32 = tf32->run(to(in, kCuda));
    ASSERT_EQ(got_exact.size(), ref.size());
    ASSERT_EQ(got_tf32.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      const std::string what = fmt::format("{} output {}", name, i);
      ASSERT_TRUE(test::usable_reference(ref[i])) << what;
      Tensor e = got_exact[i].to(Device::cpu()), t = got_tf32[i].to(Device::cpu());
      const double scale = test::max_abs(ref[i]);
      test::Comparison ce = test::compare(e, ref[i], test::Tolerance::of_scale(scale, 1e-4));
      test::Comparison ct = test::compare(t, ref[i], test::Tolerance::of_scale(scale, tf32_tol));
      EXPECT_TRUE(ce.ok()) << what << " exact float32 vs float64: " << ce.str();
      EXPECT_TRUE(ct.ok()) << what << " TF32 vs float64: " << ct.str();
      EXPECT_NE(test::first_byte_difference(t, e), "") << what << ": TF32 bitwise the exact run";
      std::printf("%s: max|err|/max|ref| exact float32 %.3g, TF32 %.3g (tolerance %.3g)\n",
                  what.c_str(), std::fabs(ce.worst_diff) / scale, std::fabs(ct.worst_diff) / scale,
                  tf32_tol);
    }
  }
}

// The package records the choice (each library call's descriptor): loaded, it gives the compiled
// TF32 run bitwise, in default and reduce-overhead mode.
TEST(CudaTf32, PackageKeepsTf32Bitwise) {
  test::TempDir dir;
  for (const char* mode : {"default", "reduce-overhead"}) {
    nn::ZooModel model = nn::make_zoo_model("resnet18", 1, 5);
    model.module->to(kCuda);
    const std::string path = dir.path + "/resnet18-tf32-" + mode + ".kiln";
    auto compiled = nn::export_package(model.module, to(model.inputs, kCuda),
                                       with_knobs("tf32=on", mode), "resnet18", path);
    LoadedPackage loaded = load_package(path);
    for (uint64_t seed : {31u, 32u}) {
      TensorList in = to(nn::zoo_example_inputs("resnet18", 1, seed), kCuda);
      TensorList want = compiled->run(in), got = loaded.exe->run(in);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        Tensor w = want[i].to(Device::cpu());
        ASSERT_GT(test::max_abs(w), 0.0) << mode;
        EXPECT_EQ(test::first_byte_difference(got[i].to(Device::cpu()), w), "")
            << mode << " seed " << seed << " output " << i;
      }
    }
  }
}

// kernels=timed keys the tuning store by the call's description, which names TF32: an exact
// and a TF32 compile of the same graph time and keep their engines apart, and both stay within
// their own tolerance when the store is warm.
TEST(CudaTf32, TimedKernelsAreStoredApartFromExactOnes) {
  test::TempDir cache;
  test::ScopedEnv env("KILN_CACHE_DIR", cache.path);
  nn::ZooModel model = nn::make_zoo_model("resnet18", 1, 9);
  std::vector<Graph> graphs = test::capture_graphs(model.module, model.inputs);
  ASSERT_EQ(graphs.size(), 1u);
  const Graph& g = graphs[0];
  TensorList in = test::graph_test_inputs(g, model.inputs, false, 77);
  TensorList in64;
  for (const Tensor& t : in) in64.push_back(t.to(DType::Float64));
  TensorList ref = find_backend("eager")(test::as_float64(g), BackendOptions{})->run(in64);
  const double scale = test::max_abs(ref[0]);
  ASSERT_TRUE(test::usable_reference(ref[0]));
  for (int pass = 0; pass < 2; ++pass) {  // pass 1 reads the store pass 0 wrote
    for (const char* knobs : {"kernels=timed", "kernels=timed,tf32=on"}) {
      const bool tf32 = std::string(knobs).find("tf32") != std::string::npos;
      auto exe = compiler::compile(g, kCuda, with_knobs(knobs));
      const std::string s = exe->summary();
      EXPECT_EQ(s.find("tf32") != std::string::npos, tf32) << knobs << "\n" << s;
      Tensor got = exe->run(to(in, kCuda))[0].to(Device::cpu());
      const double tol = tf32 ? 8.0 / 2048 : 1e-4;
      EXPECT_TRUE(test::close(got, ref[0], test::Tolerance::of_scale(scale, tol)))
          << knobs << " pass " << pass;
    }
  }
}
