// `kiln package --replace-weights` on an ONNX model (compiler/replace_weights.h): a Conv +
// BatchNormalization + Relu + Gemm model written twice with different initializers (A, B) and
// compiled as `kiln compile model.onnx` compiles it; the package of A given B's initializers
// (by their ONNX names) is byte for byte the package of B, in float32 and bfloat16, and computes
// what the compile of B computes, bitwise, on fresh inputs. Zoo models and the errors:
// tests/e2e/replace_weights_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "../support/files.h"
#include "../support/compare.h"
#include "bench/bench.h"
#include "compiler/package.h"
#include "compiler/replace_weights.h"
#include "kiln/kiln_runtime.h"
#include "kiln/kiln_runtime.hpp"
#include "nn/package.h"
#include "onnx_builder.h"
#include "runtime/package.h"
#include "runtime/safetensors.h"

namespace kiln {
namespace {

using namespace onnx_test;

using test::read_bytes;

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("kiln-onnx-replace-weights") { EXPECT_FALSE(path.empty()); }
};

Tensor scaled_randn(const Dims& sizes, Generator& gen, float scale, float shift = 0) {
  Tensor t = Tensor::randn(sizes, gen);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = shift == 0 ? p[i] * scale : shift + std::fabs(p[i]) * scale;
  return t;
}

// The model's initializers for `seed`, by their ONNX names.
NamedTensors initializers(uint64_t seed) {
  Generator gen(seed);
  NamedTensors w;
  w.emplace_back("conv.w", scaled_randn({4, 3, 3, 3}, gen, 0.3f));
  w.emplace_back("conv.b", scaled_randn({4}, gen, 0.1f));
  w.emplace_back("bn.scale", scaled_randn({4}, gen, 0.2f, 0.8f));
  w.emplace_back("bn.bias", scaled_randn({4}, gen, 0.1f));
  w.emplace_back("bn.mean", scaled_randn({4}, gen, 0.1f));
  w.emplace_back("bn.var", scaled_randn({4}, gen, 0.5f, 0.5f));
  w.emplace_back("fc.w", scaled_randn({5, 256}, gen, 0.05f));
  w.emplace_back("fc.b", scaled_randn({5}, gen, 0.1f));
  return w;
}

std::string model_bytes(const NamedTensors& w) {
  ModelBuilder b;
  b.input("x", DType::Float32, {1, 3, 8, 8}).output("y", DType::Float32, {1, 5});
  for (const auto& [name, t] : w) b.initializer(name, t);
  b.node("Conv", {"x", "conv.w", "conv.b"}, {"c"}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}})
      .node("BatchNormalization", {"c", "bn.scale", "bn.bias", "bn.mean", "bn.var"}, {"n"})
      .node("Relu", {"n"}, {"r"})
      .node("Flatten", {"r"}, {"f"})
      .node("Gemm", {"f", "fc.w", "fc.b"}, {"y"}, {{"transB", int64_t(1)}});
  return b.bytes();
}

// `kiln compile DIR/model.onnx -o DIR/model.kiln` (tools/cmd_compile.cc), in process.
std::shared_ptr<compiler::CompiledExecutable> compile_onnx(const std::string& onnx_path,
                                                           DType precision,
                                                           const std::string& package_path) {
  BenchTarget m = load_bench_target(onnx_path, 1, 0);
  compiler::Options options;
  options.precision = precision;
  Graph source;
  auto c = nn::compile_captured_graph(m.compile, m.inputs, options, &source);
  PackageInfo info = bench_package_info(onnx_path, m, 1);
  compiler::write_package(source, *c, options, info, package_path, m.state);
  return c;
}

class OnnxPackageReplaceWeights : public testing::TestWithParam<DType> {};

TEST_P(OnnxPackageReplaceWeights, GivesThePackageCompiledWithTheNewInitializers) {
  DType precision = GetParam();
  TempDir dir;
  NamedTensors wa = initializers(1), wb = initializers(2);
  std::filesystem::create_directories(dir.path + "/a");
  std::filesystem::create_directories(dir.path + "/b");
  for (const auto& [sub, w] : {std::pair{"a", &wa}, std::pair{"b", &wb}}) {
    std::ofstream f(dir.path + "/" + sub + "/model.onnx", std::ios::binary);
    f << model_bytes(*w);
  }
  std::string a_pkg = dir.path + "/a/model.kiln", b_pkg = dir.path + "/b/model.kiln";
  auto a = compile_onnx(dir.path + "/a/model.onnx", precision, a_pkg);
  auto b = compile_onnx(dir.path + "/b/model.onnx", precision, b_pkg);
  ASSERT_GT(a->report().library_launches, 0);  // the conv (batch norm folded in) and the gemm

  std::string w_path = dir.path + "/b.safetensors", r_pkg = dir.path + "/replaced.kiln";
  save_safetensors(w_path, wb);
  compiler::ReplaceWeightsReport rep = compiler::replace_weights(a_pkg, w_path, r_pkg);
  EXPECT_EQ(rep.parameters, 8);
  std::string want = read_bytes(b_pkg);
  EXPECT_NE(read_bytes(a_pkg), want) << "A and B gave the same package: nothing tested";
  EXPECT_TRUE(read_bytes(r_pkg) == want) << "the replaced package differs from B's";

  LoadedPackage loaded = load_package(r_pkg), old = load_package(a_pkg);
  Generator gen(77);
  for (int round = 0; round < 2; ++round) {
    TensorList in = {Tensor::randn({1, 3, 8, 8}, gen)};
    TensorList want_out = b->run(in), got = loaded.exe->run(in), a_out = old.exe->run(in);
    ASSERT_EQ(got.size(), 1u);
    const Tensor& w = want_out[0];
    Tensor wc = w.contiguous();
    double max_abs = 0;
    for (int64_t i = 0; i < wc.numel(); ++i) {
      ASSERT_TRUE(std::isfinite(wc.data<float>()[i]));
      max_abs = std::max(max_abs, double(std::fabs(wc.data<float>()[i])));
    }
    ASSERT_GT(max_abs, 0.0) << "an all-zero output proves nothing";
    test::Tolerance exact = test::Tolerance::exact();
    exact.signed_zeros = true;
    EXPECT_TRUE(test::close(got[0], w, exact));
    EXPECT_FALSE(test::close(a_out[0], w, test::Tolerance::rel(1e-3, 1e-3)));
  }
}

// (Here, not in importer_test.cc: it runs kiln::load_bench_target, which the sanitized test
// binary does not link.)
// Note [bench specializes symbolic dims when the import needs them]: a Range up to the batch
// size (torch's dynamic-batch exports) does not import with the batch symbolic; `kiln bench`
// imports it again at the benchmark's shape. y[i, j] = x[i, j] + i for batch 3, eagerly and
// through the compiled path; the scan reports the declared dims.
TEST(OnnxBench, SpecializesSymbolicDimsTheImportNeeds) {
  ModelBuilder m;
  m.input("x", DType::Float32, {std::string("batch"), 4})
      .initializer("zero", Tensor::full(Dims{}, 0, DType::Int64))
      .initializer("one", Tensor::full(Dims{}, 1, DType::Int64))
      .initializer("axes", Tensor::from_vector<int64_t>({1}, {1}))
      .node("Shape", {"x"}, {"s"})
      .node("Gather", {"s", "zero"}, {"n"}, {{"axis", int64_t(0)}})
      .node("Range", {"zero", "n", "one"}, {"r"}, {}, "rows")
      .node("Cast", {"r"}, {"rf"}, {{"to", int64_t(pb::TensorProto::FLOAT)}})
      .node("Unsqueeze", {"rf", "axes"}, {"col"})
      .node("Add", {"x", "col"}, {"y"})
      .output("y", DType::Float32, {std::string("batch"), 4});
  expect_error([&] { m.import(); }, ErrorKind::NotSupported, {"rows", "symbolic dims"});
  TempDir dir;
  const std::string path = dir.path + "/range_batch.onnx";
  test::write_bytes(path, m.bytes());
  OnnxModelScan scan = scan_onnx_model(path);
  ASSERT_EQ(scan.input_dims.size(), 1u);
  EXPECT_EQ(scan.input_dims[0], (std::vector<int64_t>{-1, 4}));
  BenchTarget t = load_bench_target(path, 3, 11);
  ASSERT_EQ(t.inputs.size(), 1u);
  ASSERT_EQ(t.inputs[0].sizes(), (Dims{3, 4}));
  std::vector<double> want = values(t.inputs[0]);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j) want[size_t(i * 4 + j)] += double(i);
  expect_close(t.eager(t.inputs)[0], want, {3, 4}, 1e-6);
  CompileOptions o;
  o.backend = "inductor";
  expect_close(t.compile(o)(t.inputs)[0], want, {3, 4}, 1e-6);
}

// Note [Package signature]: a package of an ONNX model takes and names its inputs and outputs
// as the model does, records which dims were symbolic there (dim_params) and the value it is
// specialized to, and lists the checks made before each call; a call of another batch is refused
// naming the symbol; hand-edited signatures are refused by the loader.
TEST(OnnxPackageSignature, NamesDimsAndGuardsAsTheModelDeclaresThem) {
  Generator gen(31);
  ModelBuilder m;
  m.input("pixels", DType::Float32, {std::string("batch_size"), 6})
      .input("bias", DType::Float32, {5})
      .initializer("w", Tensor::randn({6, 5}, gen))
      .node("MatMul", {"pixels", "w"}, {"mm"})
      .node("Add", {"mm", "bias"}, {"scores"})
      .node("Relu", {"scores"}, {"act"})
      .output("scores", DType::Float32, {std::string("batch_size"), 5})
      .output("act", DType::Float32, {std::string("batch_size"), 5});
  TempDir dir;
  const std::string onnx = dir.path + "/sig.onnx", pkg = dir.path + "/sig.kiln";
  test::write_bytes(onnx, m.bytes());
  BenchTarget t = load_bench_target(onnx, 3, 5);  // as `kiln compile sig.onnx --batch 3`
  compiler::Options options;
  Graph source;
  auto c = nn::compile_captured_graph(t.compile, t.inputs, options, &source);
  PackageInfo info = bench_package_info(onnx, t, 3);  // names and dim_params from the file
  EXPECT_EQ(info.model, "sig.onnx");
  compiler::write_package(source, *c, options, info, pkg, t.state);

  uint32_t version = 0;
  std::vector<PackageSection> sections = read_package_sections(pkg, &version);
  nlohmann::json man = nlohmann::json::parse(sections[0].bytes);
  ASSERT_EQ(man["inputs"].size(), 2u);
  EXPECT_EQ(man["inputs"][0]["name"], "pixels");
  EXPECT_EQ(man["inputs"][0]["dim_names"], nlohmann::json::parse(R"(["batch_size", null])"));
  EXPECT_EQ(man["inputs"][1]["name"], "bias");
  EXPECT_FALSE(man["inputs"][1].contains("dim_names"));
  ASSERT_EQ(man["outputs"].size(), 2u);
  EXPECT_EQ(man["outputs"][0]["name"], "scores");
  EXPECT_EQ(man["outputs"][1]["name"], "act");
  EXPECT_EQ(man["outputs"][1]["dim_names"], nlohmann::json::parse(R"(["batch_size", null])"));
  EXPECT_EQ(man["symbols"], nlohmann::json::parse(R"({"batch_size": 3})"));
  EXPECT_EQ(man["guards"], nlohmann::json::parse(R"([
      {"check": "input_count", "value": 2},
      {"check": "dtype", "input": "pixels", "value": "float32"},
      {"check": "shape", "input": "pixels", "value": [3, 6]},
      {"check": "dtype", "input": "bias", "value": "float32"},
      {"check": "shape", "input": "bias", "value": [5]}])"));
  const std::string explained = explain_package(pkg);
  EXPECT_NE(explained.find("inputs pixels float32 [3,6] (specialized: batch_size=3)"),
            std::string::npos) << explained;

  // The loaded package computes what the model computes, by its names.
  LoadedPackage loaded = load_package(pkg);
  EXPECT_EQ(loaded.exe->inputs[0].name, "pixels");
  EXPECT_EQ(loaded.exe->inputs[0].dim_names, (std::vector<std::string>{"batch_size", ""}));
  EXPECT_EQ(loaded.exe->outputs[0].name, "scores");
  TensorList fresh = {Tensor::randn({3, 6}, gen), Tensor::randn({5}, gen)};
  TensorList want = t.eager(fresh), got = loaded.exe->run(fresh);
  ASSERT_EQ(got.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_GT(test::max_abs(want[i]), 0.0);
    EXPECT_TRUE(test::close(got[i], want[i], test::Tolerance::of_max_ref(1e-5))) << i;
  }
  // The C API names the symbolic dims too (NULL for fixed ones and out-of-range indices).
  kiln_model* cm = kiln_model_open(pkg.c_str());
  ASSERT_NE(cm, nullptr) << kiln_last_error();
  ASSERT_NE(kiln_model_input_dim_name(cm, 0, 0), nullptr);
  EXPECT_STREQ(kiln_model_input_dim_name(cm, 0, 0), "batch_size");
  EXPECT_EQ(kiln_model_input_dim_name(cm, 0, 1), nullptr);
  EXPECT_EQ(kiln_model_input_dim_name(cm, 1, 0), nullptr);
  EXPECT_EQ(kiln_model_input_dim_name(cm, 2, 0), nullptr);
  EXPECT_EQ(kiln_model_input_dim_name(cm, 0, 2), nullptr);
  ASSERT_NE(kiln_model_output_dim_name(cm, 1, 0), nullptr);
  EXPECT_STREQ(kiln_model_output_dim_name(cm, 1, 0), "batch_size");
  EXPECT_EQ(kiln_model_output_dim_name(cm, 1, -1), nullptr);
  kiln_model_close(cm);
  kiln::runtime::Model cpp(pkg);  // the C++ wrapper: "" for a fixed dim
  EXPECT_EQ(cpp.input_dim_name(0, 0), "batch_size");
  EXPECT_EQ(cpp.input_dim_name(0, 1), "");
  // Another batch: refused, naming the symbol and what the package is built for.
  try {
    loaded.exe->run({Tensor::randn({2, 6}, gen), fresh[1]});
    ADD_FAILURE() << "a call of batch 2 ran on a package specialized to batch 3";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("dim 0 ('batch_size') is 2"), std::string::npos) << what;
    EXPECT_NE(what.find("specialized to batch_size = 3"), std::string::npos) << what;
  }
  // Hand-edited signatures (re-hashed): refused by the loader's checks, naming the manifest.
  auto load_edited = [&](const std::function<void(nlohmann::json&)>& edit) -> std::string {
    std::vector<PackageSection> secs = sections;
    nlohmann::json e = man;
    edit(e);
    secs[0].bytes = e.dump();
    try {
      load_package_bytes(package_container(secs, version), "edited.kiln");
    } catch (const Error& err) {
      return err.what();
    }
    return "";
  };
  EXPECT_EQ(load_edited([](nlohmann::json&) {}), "");
  std::string err = load_edited([](nlohmann::json& e) { e["symbols"]["batch_size"] = 4; });
  EXPECT_NE(err.find("its symbol 'batch_size' is 4"), std::string::npos) << err;
  err = load_edited([](nlohmann::json& e) { e["inputs"][0]["dim_names"][1] = "width"; });
  EXPECT_NE(err.find("names 'width', which symbols lacks"), std::string::npos) << err;
  err = load_edited([](nlohmann::json& e) { e["inputs"][0]["dim_names"] = nlohmann::json::array({"batch_size"}); });
  EXPECT_NE(err.find("dim_names must name each dim"), std::string::npos) << err;
  err = load_edited([](nlohmann::json& e) { e["guards"][2]["value"] = nlohmann::json::array({4, 6}); });
  EXPECT_NE(err.find("manifest: guards"), std::string::npos) << err;
  // Packages before the signature (no symbols, dim names or guards) still load.
  EXPECT_EQ(load_edited([](nlohmann::json& e) {
              e.erase("symbols");
              e.erase("guards");
              for (nlohmann::json& io : e["inputs"]) io.erase("dim_names");
              for (nlohmann::json& io : e["outputs"]) io.erase("dim_names");
            }),
            "");
}

INSTANTIATE_TEST_SUITE_P(Precision, OnnxPackageReplaceWeights,
                         testing::Values(DType::Float32, DType::BFloat16),
                         [](const testing::TestParamInfo<DType>& i) { return dtype_name(i.param); });

}  // namespace
}  // namespace kiln
