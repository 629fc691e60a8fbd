// `kiln package --replace-weights` (compiler/replace_weights.h, docs/package.md): the package
// compiled with weights A, given weights B, is byte for byte the package compiled with weights B
// (zoo models with batch norm, float32 and bfloat16), and the loaded result computes what the
// compile with B computes, bitwise, on fresh inputs. Every mismatch of the new weights is listed
// in one error; a corrupt weights file, a file that is not a package, a package without a
// source graph (format version 1) and a source graph that makes other constants are refused,
// naming the place; on every error the output file is neither created nor changed.
// ONNX models: tests/onnx/replace_weights_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../support/compare.h"
#include "../support/files.h"
#include "compiler/compile.h"
#include "compiler/package.h"
#include "compiler/replace_weights.h"
#include "core/error.h"
#include "ir/parser.h"
#include "kernels/onednn_node.h"
#include "nn/layers.h"
#include "ops/api.h"
#include "nn/models/zoo.h"
#include "nn/package.h"
#include "runtime/package.h"
#include "runtime/safetensors.h"

using namespace kiln;

namespace {

using test::read_bytes;
using test::write_bytes;

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("kiln-replace-weights") { EXPECT_FALSE(path.empty()); }
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Weights of the model's own scale, all of them new: every float tensor of the state scaled
// and shifted at random, batch norm statistics included (running_var positive), so that the
// folded weights differ from those of any other seed.
void randomize_state(nn::Module& m, uint64_t seed) {
  Generator gen(seed);
  NamedTensors fresh;
  for (auto& [name, t] : m.state_dict()) {
    if (t.dtype() != DType::Float32) {
      fresh.emplace_back(name, t);
      continue;
    }
    Tensor old = t.contiguous();
    Tensor n1 = Tensor::randn(t.sizes(), gen), n2 = Tensor::randn(t.sizes(), gen);
    Tensor r = Tensor::empty(t.sizes());
    const float* o = old.data<float>();
    const float *a = n1.data<float>(), *b = n2.data<float>();
    float* out = r.data<float>();
    bool var = ends_with(name, "running_var");
    for (int64_t i = 0; i < r.numel(); ++i)
      out[i] = var ? 0.5f + std::fabs(a[i]) : o[i] * (1.0f + 0.2f * a[i]) + 0.05f * b[i];
    fresh.emplace_back(name, r);
  }
  m.load_state_dict(fresh);
}

// Finite everywhere and not all zero: what a comparison needs to mean something (NaN matches
// NaN in test::close).
void expect_finite_nonzero(const Tensor& t, const std::string& what) {
  ASSERT_EQ(t.dtype(), DType::Float32) << what;
  Tensor c = t.contiguous();
  const float* p = c.data<float>();
  double max_abs = 0;
  for (int64_t i = 0; i < c.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(p[i])) << what << ": element " << i << " is " << p[i];
    max_abs = std::max(max_abs, double(std::fabs(p[i])));
  }
  EXPECT_GT(max_abs, 0.0) << what << ": all zero";
}

void expect_bitwise(const Tensor& got, const Tensor& want, const std::string& what) {
  expect_finite_nonzero(want, what);
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  test::Tolerance exact = test::Tolerance::exact();
  exact.signed_zeros = true;
  EXPECT_TRUE(test::close(got, want, exact)) << what;
}

// The first section whose bytes differ, for a readable failure.
std::string first_difference(const std::string& a, const std::string& b) {
  if (a == b) return "";
  std::vector<PackageSection> sa = parse_package_container(a, "a"), sb = parse_package_container(b, "b");
  if (sa.size() != sb.size()) return fmt::format("{} vs {} sections", sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i)
    if (sa[i].name != sb[i].name || sa[i].bytes != sb[i].bytes) return "section " + sa[i].name;
  return "the header or section table";
}

// What `kiln package --replace-weights` throws, or "" when it succeeds.
std::string replace_error(const std::string& pkg, const std::string& weights, const std::string& out) {
  try {
    compiler::replace_weights(pkg, weights, out);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A zoo model with its state randomized by `seed`, compiled into a package at `path`.
struct Compiled {
  nn::ZooModel model;
  std::shared_ptr<compiler::CompiledExecutable> exe;
  Graph source;
};
Compiled compile_zoo(const std::string& name, uint64_t seed, DType precision,
                     const std::string& path) {
  Compiled c{nn::make_zoo_model(name, 1, 7), nullptr, {}};
  randomize_state(*c.model.module, seed);
  compiler::Options o;
  o.precision = precision;
  c.exe = nn::export_package(c.model.module, c.model.inputs, o, name, path);
  return c;
}

}  // namespace

// ---- replace-weights of package(A) with B's weights == package(B) -----------------------------
struct ZooCase {
  std::string model;
  DType precision;
};

class PackageReplaceWeightsZoo : public testing::TestWithParam<ZooCase> {};

TEST_P(PackageReplaceWeightsZoo, GivesThePackageCompiledWithTheNewWeights) {
  const ZooCase& c = GetParam();
  TempDir dir;
  std::string a_path = dir.path + "/a.kiln", b_path = dir.path + "/b.kiln";
  std::string r_path = dir.path + "/replaced.kiln", w_path = dir.path + "/b.safetensors";
  Compiled a = compile_zoo(c.model, 1, c.precision, a_path);
  Compiled b = compile_zoo(c.model, 2, c.precision, b_path);
  // B's weights as a training run saves them: the module's state dict, by its names.
  b.model.module->save(w_path);

  compiler::ReplaceWeightsReport rep = compiler::replace_weights(a_path, w_path, r_path);
  std::printf("%s %s: %s\n", c.model.c_str(), dtype_name(c.precision), rep.str().c_str());
  EXPECT_GT(rep.parameters, 0);
  std::string replaced = read_bytes(r_path), want = read_bytes(b_path);
  EXPECT_NE(read_bytes(a_path), want) << "weights A and B gave the same package: nothing tested";
  EXPECT_TRUE(replaced == want) << "the replaced package differs from the one compiled with B "
                                << "in " << first_difference(replaced, want);

  LoadedPackage loaded = load_package(r_path);
  LoadedPackage old = load_package(a_path);
  for (uint64_t seed : {301u, 302u}) {
    TensorList in = nn::zoo_example_inputs(c.model, 1, seed);
    TensorList want_out = b.exe->run(in), got = loaded.exe->run(in), a_out = old.exe->run(in);
    ASSERT_EQ(got.size(), want_out.size());
    for (size_t i = 0; i < got.size(); ++i) {
      std::string what = fmt::format("{} {} output {} seed {}", c.model, dtype_name(c.precision), i, seed);
      expect_bitwise(got[i], want_out[i], what);
      // The old weights compute something else: the comparison above saw the new ones.
      EXPECT_FALSE(test::close(a_out[i], want_out[i], test::Tolerance::rel(1e-3, 1e-3))) << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Zoo, PackageReplaceWeightsZoo,
    testing::Values(ZooCase{"vfe", DType::Float32}, ZooCase{"vfe", DType::BFloat16},
                    ZooCase{"resnet18", DType::Float32}, ZooCase{"resnet18", DType::BFloat16}),
    [](const testing::TestParamInfo<ZooCase>& i) {
      return i.param.model + "_" + dtype_name(i.param.precision);
    });

// ---- CUDA packages: a cross-build (Options::arch) needs no GPU, so it is tested here ------------
// replace-weights of the sm_90 package built with weights A, given B's, is byte for byte the
// sm_90 package built with B: the CUDA target's pipeline (its decompositions, autocast) remade
// the weights; the manifest and the cubins are kept. (Running CUDA packages: tests/cuda.)
// bert_base and vit_b_16 (bfloat16) go through the CUDA target's own passes too: their merged
// q/k/v projections and ViT's patch weight as rows are params derived from the weights.
TEST(PackageReplaceWeights, CudaCrossBuiltPackageGivesThePackageBuiltWithTheNewWeights) {
  TempDir dir;
  const std::pair<const char*, DType> cases[] = {{"resnet18", DType::Float32},
                                                 {"resnet18", DType::BFloat16},
                                                 {"bert_base", DType::BFloat16},
                                                 {"vit_b_16", DType::BFloat16}};
  for (const auto& [model, precision] : cases) {
    std::string a_path = dir.path + "/a.kiln", b_path = dir.path + "/b.kiln";
    std::string r_path = dir.path + "/replaced.kiln", w_path = dir.path + "/b.safetensors";
    auto build = [&](uint64_t seed, const std::string& path) {
      nn::ZooModel m = nn::make_zoo_model(model, 1, 7);
      randomize_state(*m.module, seed);
      compiler::Options o;
      o.precision = precision;
      o.arch = "sm_90";
      nn::export_package(m.module, m.inputs, o, model, path);
      return m;
    };
    build(1, a_path);
    nn::ZooModel b = build(2, b_path);
    // The state dict only, as PyTorch saves one: BERT's non-persistent buffers (position and
    // token-type ids) are not in it, and the package holds their values itself.
    b.module->save(w_path);
    compiler::ReplaceWeightsReport rep = compiler::replace_weights(a_path, w_path, r_path);
    std::printf("%s sm_90 %s: %s\n", model, dtype_name(precision), rep.str().c_str());
    std::string replaced = read_bytes(r_path), want = read_bytes(b_path);
    EXPECT_NE(read_bytes(a_path), want) << "weights A and B gave the same package: nothing tested";
    EXPECT_TRUE(replaced == want) << model << " " << dtype_name(precision) << ": the replaced package differs "
                                  << "from the one built with B in " << first_difference(replaced, want);
  }
}

// ---- non-persistent buffers ----------------------------------------------------------------------
namespace {
// y = fc(x) + shift, with `shift` a non-persistent buffer (not in the state dict, as BERT's
// position ids).
class Shifted : public nn::UnaryModule {
 public:
  explicit Shifted(Generator& gen) : UnaryModule("Shifted") {
    fc = register_module("fc", std::make_shared<nn::Linear>(6, 4, true, gen));
    shift = register_buffer("shift", Tensor::randn({4}, gen), /*persistent=*/false);
  }
  Tensor forward(const Tensor& x) override { return add(fc->forward(x), shift); }
  std::shared_ptr<nn::Linear> fc;
  Tensor shift;
};
}  // namespace

// The package holds a non-persistent buffer's value itself: a state-dict file (without it)
// replaces the weights and keeps the buffer; a file that holds it replaces it too; one with
// another shape is refused naming it.
TEST(PackageReplaceWeights, NonPersistentBuffersNeedNotBeInTheWeightsFile) {
  TempDir dir;
  Generator gen(41);
  auto m = std::make_shared<Shifted>(gen);
  TensorList in = {Tensor::randn({3, 6}, gen)};
  const std::string pkg = dir.path + "/shifted.kiln";
  nn::export_package(m, in, {}, "shifted", pkg);
  ASSERT_EQ(m->state_dict().size(), 2u);  // fc.weight, fc.bias: no shift
  // New fc weights, the state dict only.
  auto b = std::make_shared<Shifted>(gen);
  b->shift.copy_(m->shift);
  const std::string w = dir.path + "/b.safetensors", out = dir.path + "/b.kiln";
  b->save(w);
  compiler::replace_weights(pkg, w, out);
  Tensor want = b->call(in)[0];
  LoadedPackage loaded = load_package(out);
  EXPECT_TRUE(test::close(loaded.exe->run(in)[0], want, test::Tolerance::rel(1e-5, 1e-6)));
  // The buffer given too: it is replaced.
  NamedTensors with_shift = b->state_dict();
  Tensor shift2 = Tensor::randn({4}, gen);
  with_shift.emplace_back("shift", shift2);
  const std::string w2 = dir.path + "/b2.safetensors", out2 = dir.path + "/b2.kiln";
  save_safetensors(w2, with_shift);
  compiler::replace_weights(pkg, w2, out2);
  b->shift.copy_(shift2);
  EXPECT_TRUE(test::close(load_package(out2).exe->run(in)[0], b->call(in)[0],
                          test::Tolerance::rel(1e-5, 1e-6)));
  // Of another shape: refused, naming it.
  NamedTensors bad = b->state_dict();
  bad.emplace_back("shift", Tensor::randn({5}, gen));
  const std::string w3 = dir.path + "/bad.safetensors";
  save_safetensors(w3, bad);
  std::string err = replace_error(pkg, w3, dir.path + "/bad.kiln");
  EXPECT_NE(err.find("wrong shape: shift: expected [4], found [5]"), std::string::npos) << err;
}

// ---- errors -------------------------------------------------------------------------------------
class PackageReplaceWeightsErrors : public testing::Test {
 protected:
  void SetUp() override {
    pkg = dir.path + "/mlp.kiln";
    out = dir.path + "/out.kiln";
    model = compile_zoo("mlp", 1, DType::Float32, pkg).model.module->state_dict();
  }
  // The error, and that `out` was not created.
  std::string error_of(const std::string& weights) {
    std::string e = replace_error(pkg, weights, out);
    EXPECT_FALSE(std::filesystem::exists(out)) << "an output was written on error: " << e;
    return e;
  }
  TempDir dir;
  std::string pkg, out;
  NamedTensors model;
};

TEST_F(PackageReplaceWeightsErrors, TheModelsOwnWeightsWork) {
  std::string w = dir.path + "/w.safetensors";
  save_safetensors(w, model);
  EXPECT_EQ(replace_error(pkg, w, out), "");
  EXPECT_EQ(read_bytes(out), read_bytes(pkg));  // the same weights: the same package
}

TEST_F(PackageReplaceWeightsErrors, EveryMismatchIsListedInOneError) {
  ASSERT_EQ(model.size(), 4u);  // 0.weight [50, 10], 0.bias [50], 2.weight [1, 50], 2.bias [1]
  NamedTensors bad;
  bad.emplace_back("0.weight", Tensor::empty({50, 11}));               // wrong shape
  bad.emplace_back("0.bias", Tensor::empty({50}, DType::Float64));     // wrong dtype
  bad.emplace_back("2.weight", Tensor::empty({1, 50}, DType::Float16));  // wrong dtype
  bad.emplace_back("extra.weight", Tensor::empty({3}));                // unexpected
  // "2.bias" missing
  std::string w = dir.path + "/bad.safetensors";
  save_safetensors(w, bad);
  std::string e = error_of(w);
  for (const char* part :
       {"bad.safetensors", "mlp.kiln", "1 missing, 1 unexpected, 2 of another dtype, 1 of another shape",
        "missing: 2.bias float32[1]", "unexpected: extra.weight float32[3]",
        "wrong dtype: 0.bias: expected float32, found float64",
        "wrong dtype: 2.weight: expected float32, found float16",
        "wrong shape: 0.weight: expected [50, 10], found [50, 11]"})
    EXPECT_NE(e.find(part), std::string::npos) << "no '" << part << "' in: " << e;
}

TEST_F(PackageReplaceWeightsErrors, ExistingOutputIsLeftAloneOnError) {
  NamedTensors bad(model.begin(), model.end() - 1);
  std::string w = dir.path + "/bad.safetensors";
  save_safetensors(w, bad);
  write_bytes(out, "an older package");
  EXPECT_NE(replace_error(pkg, w, out), "");
  EXPECT_EQ(read_bytes(out), "an older package");
  for (const auto& f : std::filesystem::directory_iterator(dir.path))
    EXPECT_EQ(f.path().string().find(".tmp"), std::string::npos) << "left behind: " << f.path();
}

TEST_F(PackageReplaceWeightsErrors, CorruptOrTruncatedWeightsFileNamesTheFile) {
  std::string good = dir.path + "/good.safetensors";
  save_safetensors(good, model);
  std::string bytes = read_bytes(good);
  for (size_t cut : {size_t(0), size_t(5), size_t(20), bytes.size() / 2, bytes.size() - 1}) {
    std::string w = dir.path + "/cut.safetensors";
    write_bytes(w, bytes.substr(0, cut));
    std::string e = error_of(w);
    EXPECT_NE(e.find("cut.safetensors"), std::string::npos) << "cut at " << cut << ": " << e;
  }
  std::string junk = bytes;
  junk[10] = '#';  // inside the JSON header
  std::string w = dir.path + "/junk.safetensors";
  write_bytes(w, junk);
  EXPECT_NE(error_of(w).find("junk.safetensors"), std::string::npos);
  EXPECT_NE(error_of(dir.path + "/absent.safetensors").find("absent.safetensors"), std::string::npos);
}

TEST_F(PackageReplaceWeightsErrors, InputThatIsNotAPackageIsRefused) {
  std::string w = dir.path + "/w.safetensors";
  save_safetensors(w, model);
  std::string text = dir.path + "/notes.kiln";
  write_bytes(text, "these are my notes, not a package, but long enough for a header......");
  std::string e = replace_error(text, w, out);
  EXPECT_NE(e.find("notes.kiln"), std::string::npos) << e;
  EXPECT_NE(e.find("not a Kiln package"), std::string::npos) << e;
  // A truncated package: its header says how long it is.
  std::string cut = dir.path + "/cut.kiln";
  write_bytes(cut, read_bytes(pkg).substr(0, 1000));
  e = replace_error(cut, w, out);
  EXPECT_NE(e.find("cut.kiln"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  // The weights file given as the package.
  e = replace_error(w, w, out);
  EXPECT_NE(e.find("w.safetensors"), std::string::npos) << e;
  EXPECT_FALSE(std::filesystem::exists(out));
}

// A version 1 package (no source section): it still loads, and its weights cannot be replaced.
TEST_F(PackageReplaceWeightsErrors, VersionOnePackageLoadsButHasNoSourceGraph) {
  std::vector<PackageSection> sections = parse_package_container(read_bytes(pkg), pkg);
  ASSERT_EQ(sections.back().name, "source");
  sections.pop_back();
  nlohmann::json m = nlohmann::json::parse(sections[0].bytes);
  m["format_version"] = 1;
  m.erase("precision");
  sections[0].bytes = m.dump(1);
  std::string v1 = package_container(sections);
  uint32_t one = 1;
  std::memcpy(&v1[8], &one, 4);  // the header's version (not covered by the table's hash)
  std::string v1_path = dir.path + "/v1.kiln";
  write_bytes(v1_path, v1);
  LoadedPackage loaded = load_package(v1_path);
  EXPECT_EQ(loaded.format_version, 1u);
  EXPECT_EQ(loaded.source_bytes, 0);
  std::string w = dir.path + "/w.safetensors";
  save_safetensors(w, model);
  std::string e = replace_error(v1_path, w, out);
  EXPECT_NE(e.find("v1.kiln"), std::string::npos) << e;
  EXPECT_NE(e.find("has no source graph (format version 1"), std::string::npos) << e;
  EXPECT_FALSE(std::filesystem::exists(out));
  // A version 1 header with a version 2 section is refused by the container.
  std::vector<PackageSection> with_source = parse_package_container(read_bytes(pkg), pkg);
  std::string bad = package_container(with_source);
  std::memcpy(&bad[8], &one, 4);
  EXPECT_THROW(load_package_bytes(bad, "bad.kiln"), Error);
}

// The check that guards the kept manifest and kernels: a source graph that makes other
// constants (here the bfloat16 compile's source put into the float32 package) is an internal
// error naming a constant, and nothing is written.
TEST_F(PackageReplaceWeightsErrors, SourceGraphMakingOtherConstantsIsAnInternalError) {
  std::string bf16 = dir.path + "/bf16.kiln";
  compile_zoo("mlp", 1, DType::BFloat16, bf16);
  std::vector<PackageSection> f32_sections = parse_package_container(read_bytes(pkg), pkg);
  std::vector<PackageSection> bf16_sections = parse_package_container(read_bytes(bf16), bf16);
  ASSERT_EQ(f32_sections.back().name, "source");
  ASSERT_NE(f32_sections.back().bytes, bf16_sections.back().bytes);
  f32_sections.back() = bf16_sections.back();
  std::string swapped = dir.path + "/swapped.kiln";
  write_bytes(swapped, package_container(f32_sections));
  std::string w = dir.path + "/w.safetensors";
  save_safetensors(w, model);
  try {
    compiler::replace_weights(swapped, w, out);
    FAIL() << "a source graph making other constants was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Internal) << e.what();
    EXPECT_NE(std::string(e.what()).find("constant '"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("swapped.kiln"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(out));
}

// Values folded from weights must not let the passes decide on those weights' values (Note
// [Folded weights stay params] in passes/constant_fold.h): in A the two folded transposes are
// equal (cse would merge two equal consts) and the folded scalar would be compiled into a loop
// kernel as a literal; B's weights differ in both. The replaced package is still B's.
TEST(PackageReplaceWeights, FoldedWeightsDoNotDependOnValues) {
  const char* text = R"(
graph @main(%x: f32[4, 8]) {
  param %w1: f32[8, 8]
  param %w2: f32[8, 8]
  param %s: f32[1]
  %t1 = transpose(%w1) {dim0=0, dim1=1}
  %t2 = transpose(%w2) {dim0=0, dim1=1}
  %a = matmul(%x, %t1)
  %b = matmul(%x, %t2)
  %s2 = mul(%s, %s)
  %c = add(%a, %b)
  %y = mul(%c, %s2)
  return %y
}
)";
  TempDir dir;
  Generator gen(5);
  Tensor w = Tensor::randn({8, 8}, gen);
  NamedTensors wa = {{"w1", w}, {"w2", w.clone()}, {"s", Tensor::full({1}, 0.5)}};
  NamedTensors wb = {{"w1", Tensor::randn({8, 8}, gen)}, {"w2", Tensor::randn({8, 8}, gen)},
                     {"s", Tensor::full({1}, 1.5)}};
  auto package = [&](const NamedTensors& weights, const std::string& path) {
    Graph g = parse_graph(text);
    for (const auto& [name, t] : weights) g.value(g.find_value(name)).data = t;
    std::shared_ptr<compiler::CompiledExecutable> c = compiler::compile(g, Device::cpu());
    compiler::write_package(g, *c, {}, {}, path);
    return c;
  };
  std::string a = dir.path + "/a.kiln", b = dir.path + "/b.kiln", r = dir.path + "/r.kiln";
  std::string wb_path = dir.path + "/b.safetensors";
  package(wa, a);
  auto cb = package(wb, b);
  save_safetensors(wb_path, wb);
  compiler::replace_weights(a, wb_path, r);
  EXPECT_TRUE(read_bytes(r) == read_bytes(b)) << first_difference(read_bytes(r), read_bytes(b));
  LoadedPackage loaded = load_package(r);
  TensorList in = {Tensor::randn({4, 8}, gen)};
  expect_bitwise(loaded.exe->run(in)[0], cb->run(in)[0], "replaced vs compiled with B");
}

// Note [measured Winograd]: a convolution takes Winograd only where it agrees with the direct
// convolution on the weights it was compiled with, so replacing the weights checks it again.
// Ordinary new weights pass (the replaced package is the one compiled with them, bitwise); new
// weights holding a NaN, on which Winograd and direct no longer agree, are refused naming the
// convolution, and nothing is written. (Without AVX-512 nothing takes Winograd and there is
// nothing to check: both replacements succeed.)
TEST(PackageReplaceWeights, WinogradConvolutionsAreCheckedOnTheNewWeights) {
  const char* text = R"(
graph @main(%x: f32[1, 32, 28, 28]) {
  param %w: f32[64, 32, 3, 3]
  param %b: f32[64]
  %c = conv2d(%x, %w, %b) {padding=[1, 1]} loc("body")
  %y = relu(%c)
  return %y
}
)";
  TempDir dir;
  Generator gen(9);
  auto weights = [&] {
    Tensor w = Tensor::randn({64, 32, 3, 3}, gen);
    for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] /= 17.0f;  // 1/sqrt(288)
    return NamedTensors{{"w", w}, {"b", Tensor::randn({64}, gen)}};
  };
  NamedTensors wa = weights(), wb = weights();
  auto package = [&](const NamedTensors& w, const std::string& path) {
    Graph g = parse_graph(text);
    for (const auto& [name, t] : w) g.value(g.find_value(name)).data = t;
    compiler::Options o;
    o.knobs.set("winograd", "checked");  // no timing decides (the default, spelled out)
    std::shared_ptr<compiler::CompiledExecutable> c = compiler::compile(g, Device::cpu(), o);
    compiler::write_package(g, *c, {}, {}, path);
    return c;
  };
  std::string a = dir.path + "/a.kiln", b = dir.path + "/b.kiln", r = dir.path + "/r.kiln";
  auto ca = package(wa, a);
  auto cb = package(wb, b);
  bool winograd = false;
  for (const std::string& k : ca->report().kernels) winograd = winograd || k.find("wino") != std::string::npos;
  EXPECT_EQ(winograd, kernels::native_conv_block() == 16) << ca->summary();

  std::string wb_path = dir.path + "/b.safetensors";
  save_safetensors(wb_path, wb);
  EXPECT_EQ(replace_error(a, wb_path, r), "");
  EXPECT_TRUE(read_bytes(r) == read_bytes(b)) << first_difference(read_bytes(r), read_bytes(b));
  TensorList in = {Tensor::randn({1, 32, 28, 28}, gen)};
  expect_bitwise(load_package(r).exe->run(in)[0], cb->run(in)[0], "replaced vs compiled with B");

  NamedTensors nan = weights();
  nan[0].second.data<float>()[100] = std::nanf("");
  std::string nan_path = dir.path + "/nan.safetensors", out = dir.path + "/nan.kiln";
  save_safetensors(nan_path, nan);
  std::string err = replace_error(a, nan_path, out);
  if (winograd) {
    EXPECT_NE(err.find("convolution 'body' computes with oneDNN's Winograd algorithm"),
              std::string::npos) << err;
    EXPECT_NE(err.find("(more than 1e-05). Compile the model with these weights"),
              std::string::npos) << err;
    EXPECT_FALSE(std::filesystem::exists(out)) << "an output was written on error";
  } else {
    EXPECT_EQ(err, "");
  }
}
