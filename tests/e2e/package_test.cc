// Deployment packages (runtime/package.h, docs/package.md): zoo models compiled, packaged,
// loaded and run give outputs bitwise equal to the in-process compiled run on fresh random
// inputs; the same model packaged twice gives the same bytes; a package runs in a separate
// process (the C example, linked against the runtime alone) with no compiler, no Python and no
// cache directory; corrupt packages (truncated, bit-flipped, reordered, a manifest edited and
// re-hashed to require a CPU feature this machine lacks) are refused with an error naming the
// section; a graph with an eager launch is refused by the writer, naming the node; the C API
// describes and runs a package from several threads at once.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../support/compare.h"
#include "../support/files.h"
#include "../support/c_run.h"
#include "../support/package_edit.h"
#include "compiler/compile.h"
#include "compiler/package.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "ir/graph.h"
#include "kernels/onednn_node.h"
#include "kiln/kiln_runtime.h"
#include "nn/models/branchy.h"
#include "nn/models/zoo.h"
#include "nn/package.h"
#include "ops/api.h"
#include "runtime/launch_library.h"
#include "runtime/package.h"
#include "runtime/safetensors.h"
#include "support/hash.h"
#include "support/host_isa.h"

using namespace kiln;

namespace {

std::string temp_dir() {
  const char* t = std::getenv("TMPDIR");
  std::string tmpl = std::string(t && *t ? t : "/tmp") + "/kiln-package-test-XXXXXX";
  char* d = mkdtemp(tmpl.data());
  EXPECT_NE(d, nullptr);
  return tmpl;
}

struct TempDir {
  std::string path = temp_dir();
  ~TempDir() { std::filesystem::remove_all(path); }
};

TensorList fresh_inputs(const TensorList& like, uint64_t seed) {
  Generator g(seed);
  TensorList out;
  for (const Tensor& t : like)
    out.push_back(is_floating(t.dtype()) ? Tensor::randn(t.sizes(), g, t.dtype())
                                         : Tensor::randint(t.sizes(), g, 0, 10, t.dtype()));
  return out;
}

// Bitwise: every byte equal (compare.h reports the worst element when not).
void expect_bitwise(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  test::Tolerance exact = test::Tolerance::exact();
  exact.signed_zeros = true;
  EXPECT_TRUE(test::close(got, want, exact)) << what;
  Tensor g = got.contiguous(), w = want.contiguous();
  EXPECT_EQ(std::memcmp(g.raw_data(), w.raw_data(), size_t(g.nbytes())), 0) << what;
}

double max_abs_value(const Tensor& t) { return test::max_abs(t); }

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The error message of loading `bytes`, or "" when it loads.
std::string load_error(std::string_view bytes) {
  try {
    load_package_bytes(bytes, "corrupt.kiln");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// One compiled zoo model and its package, shared by the tests of that model.
struct Packaged {
  nn::ZooModel model;
  std::shared_ptr<compiler::CompiledExecutable> compiled;
  std::string path;
};

Packaged package_zoo(const std::string& name, const std::string& dir,
                     const compiler::Options& options = {}) {
  Packaged p{nn::make_zoo_model(name, 1, 7), nullptr, dir + "/" + name + ".kiln"};
  p.compiled = nn::export_package(p.model.module, p.model.inputs, options, name, p.path);
  return p;
}

}  // namespace

// ---- every zoo model that is one graph: package == in-process compiled, bitwise --------------
class PackageZoo : public testing::TestWithParam<std::string> {};

TEST_P(PackageZoo, LoadedPackageMatchesCompiledRunBitwise) {
  TempDir dir;
  Packaged p = package_zoo(GetParam(), dir.path);
  LoadedPackage loaded = load_package(p.path);
  ASSERT_EQ(loaded.exe->inputs.size(), p.model.inputs.size());
  for (uint64_t seed : {101u, 202u}) {
    // Fresh inputs the model means (token ids in range, masks of 0/1), new for each seed.
    TensorList in = nn::zoo_example_inputs(GetParam(), 1, seed);
    bool fresh = false;
    for (size_t i = 0; i < in.size(); ++i) {
      ASSERT_GT(max_abs_value(in[i]), 0.0);
      fresh = fresh || !test::close(in[i], p.model.inputs[i], test::Tolerance::exact());
    }
    ASSERT_TRUE(fresh) << "the inputs of seed " << seed << " are the example inputs";
    TensorList want = p.compiled->run(in);
    TensorList got = loaded.exe->run(in);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_GT(max_abs_value(want[i]), 0.0) << "an all-zero output proves nothing";
      expect_bitwise(got[i], want[i], GetParam() + " output " + std::to_string(i) + " seed " +
                                          std::to_string(seed));
    }
  }
  std::printf("%s: package %lld bytes (weights %lld, kernels %lld)\n", GetParam().c_str(),
              (long long)loaded.file_bytes, (long long)loaded.weights_bytes,
              (long long)loaded.kernels_bytes);
}

INSTANTIATE_TEST_SUITE_P(Zoo, PackageZoo,
                         testing::Values("mlp", "vfe", "resnet18", "resnet50", "vit_b_16",
                                         "bert_base", "branchy_cond"),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

// oneDNN sizes per-thread parts of a primitive's scratchpad by the thread count at its creation
// (Note [oneDNN thread count] in kernels/onednn_node.cc). A package written under one count is
// loaded and run under others, and the compiled graph it came from is called with more threads
// than it was compiled for: both must give the 1-thread results. (Before the fix the load failed
// with "a buffer ... lies outside the slot", and the compiled call overran its scratch.)
TEST(Package, ThreadCountsAtWriteLoadAndCallMayDiffer) {
  TempDir dir;
  Packaged p;
  TensorList in = nn::zoo_example_inputs("resnet18", 1, 303);
  TensorList want;
  {
    kernels::ScopedCpuThreads one(1);
    p = package_zoo("resnet18", dir.path);
    want = p.compiled->run(in);
  }
  ASSERT_GT(max_abs_value(want[0]), 0.0);
  for (int threads : {2, 3, 8}) {
    kernels::ScopedCpuThreads many(threads);
    LoadedPackage loaded = load_package(p.path);
    EXPECT_EQ(loaded.threads, 1);
    TensorList got = loaded.exe->run(in);
    TensorList again = p.compiled->run(in);
    const std::string at = " with " + std::to_string(threads) + " threads";
    EXPECT_TRUE(test::close(got[0], want[0], test::Tolerance::of_max_ref(1e-5))) << "package" << at;
    EXPECT_TRUE(test::close(again[0], want[0], test::Tolerance::of_max_ref(1e-5))) << "compiled" << at;
  }
}

// The reverse: a package written for two threads, loaded by a caller that wants one. oneDNN's
// primitives fork the thread count they were created for whatever the caller's count is at the
// call, so the loader builds them for the loading thread's count where that gives the node as
// written (Note [oneDNN threads at load] in runtime/launch_library.cc). Before, this package ran
// every call on two cores (`kiln bench r50.kiln --threads 1`: CPU time 2.0x the wall time).
TEST(Package, LoadedForFewerThreadsThanWrittenRunsOnThem) {
  TempDir dir;
  Packaged p;
  TensorList in = nn::zoo_example_inputs("resnet18", 1, 304);
  TensorList want;
  {
    kernels::ScopedCpuThreads two(2);
    p = package_zoo("resnet18", dir.path);
  }
  kernels::ScopedCpuThreads one(1);
  want = p.compiled->run(in);  // the reference: the graph the package was written from
  ASSERT_GT(max_abs_value(want[0]), 0.0);
  LoadedPackage loaded = load_package(p.path);
  EXPECT_EQ(loaded.threads, 2);
  EXPECT_EQ(loaded.onednn_threads, 1);
  ASSERT_GT(loaded.onednn_nodes, 0);
  EXPECT_LT(loaded.onednn_nodes_at_written_threads, loaded.onednn_nodes);
  std::printf("resnet18 written for 2 threads, loaded for 1: %d of %d oneDNN nodes kept 2\n",
              loaded.onednn_nodes_at_written_threads, loaded.onednn_nodes);
  TensorList got = loaded.exe->run(in);
  EXPECT_TRUE(test::close(got[0], want[0], test::Tolerance::of_max_ref(1e-5)));
  // The calls keep one core busy: the process's CPU time (every thread) is within its wall time.
  auto cpu_s = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  };
  const double c0 = cpu_s();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 8; ++i) loaded.exe->run(in);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = cpu_s() - c0;
  EXPECT_LE(cpu, 1.2 * wall + 0.02) << "CPU " << cpu << " s over " << wall << " s of wall time";
}

// branchy's host code branches on a computed value: two graphs and a guard, which one package
// cannot hold. The compile says so rather than packaging half of the model, and names kiln::cond,
// the form that packages (zoo branchy_cond, in PackageZoo).
TEST(Package, GraphBreakIsRefused) {
  TempDir dir;
  nn::ZooModel m = nn::make_zoo_model("branchy", 1, 7);
  std::string path = dir.path + "/branchy.kiln";
  try {
    nn::export_package(m.module, m.inputs, {}, "branchy", path);
    FAIL() << "packaging branchy should fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("graph"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("kiln::cond"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

// branchy_cond holds its branch as kiln::cond: one graph, so it packages, and the package takes
// each branch as the eager model does (inputs scaled so that mean(relu(fc1(x))) lies on either
// side of the threshold; the eager forward reads it on the host).
TEST(Package, CondModelTakesEachBranchAsTheEagerModel) {
  TempDir dir;
  Packaged p = package_zoo("branchy_cond", dir.path);
  LoadedPackage loaded = load_package(p.path);
  auto eager = std::dynamic_pointer_cast<nn::UnaryModule>(p.model.module);
  ASSERT_TRUE(eager);
  auto* m = dynamic_cast<nn::models::BranchyCond*>(eager.get());
  ASSERT_TRUE(m);
  int taken[2] = {0, 0};
  for (uint64_t seed : {31u, 32u, 33u})
    for (double scale : {0.02, 8.0}) {
      Tensor x = nn::zoo_example_inputs("branchy_cond", 1, seed)[0] * scale;
      Tensor h = relu(m->fc1->forward(x));
      const bool above = mean(h).item() > nn::models::Branchy::kThreshold;
      ++taken[above ? 1 : 0];
      Tensor want = eager->forward(x);
      Tensor got = loaded.exe->run({x})[0];
      ASSERT_GT(max_abs_value(want), 0.0);
      EXPECT_TRUE(test::close(got, want, test::Tolerance::of_max_ref(1e-5)))
          << "scale " << scale << " seed " << seed << (above ? " (fc2 branch)" : " (affine branch)");
      expect_bitwise(got, p.compiled->run({x})[0], "package vs compiled");
    }
  EXPECT_GT(taken[0], 0) << "no input took the affine branch";
  EXPECT_GT(taken[1], 0) << "no input took the fc2 branch";
}

// Note [Constants read at run time] and [CPU package weights]: the constants only oneDNN nodes
// read (resnet18's convolution and fc weights, prepacked when the nodes are built) are recorded
// without a slot, and the loaded package keeps no view of them; those a loop kernel reads keep
// slots and are the loaded package's own copies, not views of the bytes it was loaded from.
TEST(Package, WeightsOnlyOneDnnNodesReadHaveNoSlotAndNoLoadedCopy) {
  TempDir dir;
  // resnet18: every weight is a oneDNN node's (convolutions, and the fc under gemv=onednn: by
  // default a one-row linear is a generated GEMV, Note [reduction rows]). vit_b_16: the layer
  // norms' weights, the class token, the position embedding and the head are read by loop
  // kernels.
  for (const char* name : {"resnet18", "vit_b_16"}) {
    compiler::Options options;
    if (std::string(name) == "resnet18") options.knobs.set("gemv", "onednn");
    Packaged p = package_zoo(name, dir.path, options);
    std::string bytes = read_bytes(p.path);
    std::vector<PackageSection> sections = parse_package_container(bytes, p.path);
    nlohmann::json m = nlohmann::json::parse(sections[0].bytes);
    int without_slot = 0, with_slot = 0, prepacked = 0;
    for (const auto& c : m.at("constants")) {
      (c.at("slot").get<int>() == -1 ? without_slot : with_slot)++;
      prepacked += c.value("prepacked", false);
    }
    // Note [prepacked weights]: every weight only a oneDNN node reads is held prepacked only.
    if (std::string(name) == "resnet18") {
      EXPECT_GE(without_slot, 21) << "20 convolution weights and the fc weight";
      EXPECT_GE(prepacked, 21) << "20 convolution weights and the fc weight";
    } else {
      EXPECT_GE(without_slot, 48) << "4 linear weights per layer, 12 layers";
      EXPECT_GE(with_slot, 26) << "2 layer norms per layer, the final one, tokens, embedding";
      EXPECT_GE(prepacked, 48) << "4 linear weights per layer, 12 layers";
    }
    // Loaded from bytes this test holds: a constant kept after the load must not point into them,
    // nor may a node's prepacked weights. (The loaded package lists no prepacked-only constant.)
    LoadedPackage loaded = load_package_bytes(bytes, p.path);
    ASSERT_EQ(loaded.exe->constants.size(), size_t(without_slot + with_slot - prepacked)) << name;
    int packed_views = 0;
    for (const Executable::Launch& l : loaded.exe->launches) {
      if (!l.record) continue;
      LaunchRecord r = l.record();
      for (const LaunchRecord::Prepacked& w : r.prepacked) {
        const char* at = static_cast<const char*>(w.data);
        EXPECT_TRUE(at + w.bytes <= bytes.data() || at >= bytes.data() + bytes.size())
            << name << " " << w.constant << ": prepacked weights point into the loaded bytes";
        ++packed_views;
      }
    }
    EXPECT_GE(packed_views, prepacked) << name;
    const char* begin = bytes.data();
    const char* end = begin + bytes.size();
    for (const Executable::ConstantSpec& c : loaded.exe->constants) {
      if (c.slot == -1) {
        EXPECT_FALSE(c.data.defined()) << name << " " << c.name;
      } else {
        ASSERT_TRUE(c.data.defined()) << name << " " << c.name;
        const char* at = static_cast<const char*>(c.data.raw_data());
        EXPECT_TRUE(at + c.data.nbytes() <= begin || at >= end)
            << name << " " << c.name << " points into the loaded bytes";
      }
    }
    TensorList in = nn::zoo_example_inputs(name, 1, 41);
    expect_bitwise(loaded.exe->run(in)[0], p.compiled->run(in)[0], std::string(name) + " package");
  }
}

// ---- determinism ----------------------------------------------------------------------------------
TEST(Package, SameModelTwiceGivesIdenticalBytes) {
  TempDir dir;
  for (const char* name : {"mlp", "resnet18"}) {
    Packaged a = package_zoo(name, dir.path);
    std::string first = read_bytes(a.path);
    Packaged b = package_zoo(name, dir.path);
    std::string second = read_bytes(b.path);
    ASSERT_FALSE(first.empty());
    EXPECT_EQ(first.size(), second.size()) << name;
    EXPECT_TRUE(first == second) << name << ": two packages of the same model differ";
  }
}

// Note [Packages record the choice, not the timings]: a max-autotune package compiled on a
// machine for the first time (its candidates timed) and again (the choice read from the tuning
// store, nothing timed) is the same bytes; its manifest names the configuration chosen and no
// timing.
TEST(Package, MaxAutotuneRecompileGivesIdenticalBytes) {
  TempDir dir;
  test::TempDir cache("kiln-autotune-cache");
  test::ScopedEnv env("KILN_CACHE_DIR", cache.path);
  nn::ZooModel m = nn::make_zoo_model("mlp", 1, 7);
  compiler::Options o;
  o.mode = "max-autotune";
  o.progress = false;
  std::string bytes[2], reports[2];
  for (int k = 0; k < 2; ++k) {
    const std::string path = dir.path + fmt::format("/mlp{}.kiln", k);
    auto exe = nn::export_package(m.module, m.inputs, o, "mlp", path);
    reports[k] = exe->report().autotune;
    bytes[k] = read_bytes(path);
  }
  EXPECT_EQ(reports[0].rfind("chose ", 0), 0u) << "the first compile did not time: " << reports[0];
  EXPECT_EQ(reports[1].rfind("cached choice ", 0), 0u) << "the second compile timed: " << reports[1];
  ASSERT_FALSE(bytes[0].empty());
  EXPECT_TRUE(bytes[0] == bytes[1]) << "the recompile wrote other bytes";
  const nlohmann::json manifest = nlohmann::json::parse(read_package_sections(dir.path + "/mlp0.kiln")[0].bytes);
  const std::string recorded = manifest["autotune"].get<std::string>();
  EXPECT_EQ(recorded, "chose " + reports[1].substr(std::string("cached choice ").size()))
      << recorded;
  EXPECT_EQ(recorded.find(" ms"), std::string::npos) << "a timing in the manifest: " << recorded;
}

// Two packages whose kernels share their names but not their code (mlp at batch 1 and at
// batch 3: the same kernel names, other loop bounds), loaded in one process and both kept:
// each runs its own kernels. (The kernels were dlopen'ed from /proc/self/fd/N with the memfd
// closed right after, so the second package's memfd took the same N, and dlopen, which matches
// loaded objects by name first, handed back the first package's library.)
TEST(Package, PackagesLoadedTogetherEachRunTheirOwnKernels) {
  TempDir dir;
  std::vector<LoadedPackage> loaded;
  std::vector<std::shared_ptr<compiler::CompiledExecutable>> compiled;
  std::vector<nn::ZooModel> models;
  for (int64_t batch : {1, 3, 2}) {
    models.push_back(nn::make_zoo_model("mlp", batch, 7));
    const std::string path = dir.path + "/mlp" + std::to_string(batch) + ".kiln";
    compiled.push_back(nn::export_package(models.back().module, models.back().inputs, {}, "mlp", path));
    loaded.push_back(load_package(path));
  }
  for (size_t k = 0; k < loaded.size(); ++k) {
    TensorList in = fresh_inputs(models[k].inputs, 40 + k);
    expect_bitwise(loaded[k].exe->run(in)[0], compiled[k]->run(in)[0],
                   "package " + std::to_string(k) + " of three loaded together");
  }
  // Unloading one and loading another keeps the rest right.
  loaded.erase(loaded.begin());
  loaded.push_back(load_package(dir.path + "/mlp1.kiln"));
  for (size_t k : {size_t(0), size_t(1)}) {
    TensorList in = fresh_inputs(models[k + 1].inputs, 50 + k);
    expect_bitwise(loaded[k].exe->run(in)[0], compiled[k + 1]->run(in)[0], "after a reload");
  }
  TensorList in = fresh_inputs(models[0].inputs, 60);
  expect_bitwise(loaded[2].exe->run(in)[0], compiled[0]->run(in)[0], "the reloaded package");
}

// Note [Inputs in a half dtype] (compiler/compile.cc): a package built with input_dtype takes
// its float32 inputs in that dtype and computes what the float32-input package computes on the
// input rounded to it, bitwise. Under autocast to the same dtype the input's conversion kernel
// is gone; without autocast the graph converts the input to float32 where it reads it.
TEST(Package, InputsTakenInAHalfDtypeComputeAsTheRoundedFloat32Input) {
  TempDir dir;
  struct Case {
    const char* model;
    DType precision, input;
  };
  for (const Case& c : {Case{"vfe", DType::BFloat16, DType::BFloat16},
                        Case{"mlp", DType::Float32, DType::Float16},
                        Case{"resnet18", DType::BFloat16, DType::BFloat16}}) {
    nn::ZooModel m = nn::make_zoo_model(c.model, 1, 7);
    compiler::Options plain;
    plain.precision = c.precision;
    compiler::Options half = plain;
    half.input_dtype = c.input;
    const std::string name = std::string(c.model) + " " + dtype_name(c.input) + " inputs";
    nn::export_package(m.module, m.inputs, plain, c.model, dir.path + "/f32in.kiln");
    auto ph = nn::export_package(m.module, m.inputs, half, c.model, dir.path + "/halfin.kiln");
    LoadedPackage f = load_package(dir.path + "/f32in.kiln");
    LoadedPackage h = load_package(dir.path + "/halfin.kiln");
    ASSERT_EQ(h.exe->inputs.size(), 1u) << name;
    EXPECT_EQ(h.exe->inputs[0].dtype, c.input) << name;
    EXPECT_EQ(f.exe->inputs[0].dtype, DType::Float32) << name;
    EXPECT_EQ(h.exe->outputs[0].dtype, f.exe->outputs[0].dtype) << name;
    // Under autocast to the input's dtype the conversion is gone (one kernel fewer); without
    // it the graph converts the input where it reads it (one kernel more).
    const int64_t more = c.precision == c.input ? -1 : 1;
    EXPECT_EQ(int64_t(h.exe->launches.size()), int64_t(f.exe->launches.size()) + more) << name;
    for (uint64_t seed : {5u, 6u}) {
      Tensor x = fresh_inputs(m.inputs, seed)[0];
      Tensor rounded = x.to(c.input);
      Tensor want = f.exe->run({rounded.to(DType::Float32)})[0];
      ASSERT_GT(max_abs_value(want), 0.0) << name;
      expect_bitwise(h.exe->run({rounded})[0], want, name + " seed " + std::to_string(seed));
      // The in-process compiled executable takes the same dtype.
      expect_bitwise(ph->run({rounded})[0], want, name + " in process");
      // A float32 input is refused by the guards, naming the dtype.
      try {
        h.exe->run({x});
        ADD_FAILURE() << name << ": a float32 input ran";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(dtype_name(c.input)), std::string::npos) << e.what();
      }
    }
  }
  compiler::Options bad;
  bad.input_dtype = DType::Int8;
  nn::ZooModel m = nn::make_zoo_model("mlp", 1, 7);
  try {
    nn::export_package(m.module, m.inputs, bad, "mlp", dir.path + "/bad.kiln");
    ADD_FAILURE() << "an int8 input dtype compiled";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input dtype expected bfloat16 or float16"), std::string::npos)
        << e.what();
  }
}

// Note [prepacked weights]: a CPU package holds its oneDNN nodes' weights in their primitives'
// layouts (Winograd's transform included), and loads to the same results, bitwise, as the
// package with plain weights (prepack=off) and the in-process compiled run.
TEST(Package, PrepackedWeightsRunAsThePlainPackageDoes) {
  TempDir dir;
  nn::ZooModel m = nn::make_zoo_model("resnet18", 1, 7);
  std::shared_ptr<compiler::CompiledExecutable> compiled[2];
  std::string paths[2] = {dir.path + "/packed.kiln", dir.path + "/plain.kiln"};
  for (int k = 0; k < 2; ++k) {
    compiler::Options o;
    // winograd=checked (the default, spelled out): the 3x3 convolutions' weights are Winograd
    // transforms. gemv=onednn: the classifier an inner product too (by default a one-row linear
    // is a generated GEMV, Note [reduction rows]), so that its prepacked weights are covered.
    o.knobs = compiler::parse_knobs(k == 0 ? "winograd=checked,gemv=onednn"
                                           : "winograd=checked,gemv=onednn,prepack=off", "test");
    compiled[k] = nn::export_package(m.module, m.inputs, o, "resnet18", paths[k]);
  }
  uint32_t version[2] = {0, 0};
  nlohmann::json manifest[2];
  std::set<std::string> entries[2];
  for (int k = 0; k < 2; ++k) {
    std::vector<PackageSection> sections = read_package_sections(paths[k], &version[k]);
    manifest[k] = nlohmann::json::parse(sections[0].bytes);
    SafetensorsContents w = parse_safetensors(
        {reinterpret_cast<const uint8_t*>(sections[1].bytes.data()), sections[1].bytes.size()}, "test");
    for (const auto& [name, t] : w.tensors) entries[k].insert(name);
  }
  EXPECT_EQ(version[0], kPrepackedFormatVersion);
  EXPECT_LT(version[1], kPrepackedFormatVersion);
  int packed = 0, wino = 0;
  for (const nlohmann::json& l : manifest[0]["launches"]) {
    if (!l["params"].contains("prepacked")) continue;
    for (const nlohmann::json& e : l["params"]["prepacked"]) {
      ++packed;
      wino += e["layout"].get<std::string>().find(" wino ") != std::string::npos;
      EXPECT_TRUE(entries[0].count(e["entry"].get<std::string>())) << e.dump();
    }
  }
  EXPECT_EQ(packed, 21) << "20 convolutions and the classifier";
  EXPECT_GE(wino, 8) << "resnet18's 3x3 stride-1 convolutions under winograd=checked";
  for (const nlohmann::json& c : manifest[0]["constants"])
    if (c.value("prepacked", false))
      EXPECT_FALSE(entries[0].count(c["name"].get<std::string>())) << c["name"] << " is also plain";
  for (const nlohmann::json& l : manifest[1]["launches"]) EXPECT_FALSE(l["params"].contains("prepacked"));
  for (const nlohmann::json& c : manifest[1]["constants"]) {
    EXPECT_FALSE(c.contains("prepacked"));
    EXPECT_TRUE(entries[1].count(c["name"].get<std::string>())) << c["name"];
  }
  // Labelled version 7 (header and manifest alike, re-hashed), it is refused naming the launch.
  std::string err = test::load_error_as_version(read_bytes(paths[0]), kUpsampleFormatVersion, "r18");
  EXPECT_NE(err.find("prepacked constant is unknown to format version 7"), std::string::npos) << err;
  // A launch's record is checked the same way (the prepacked-only constants' records dropped).
  {
    std::vector<PackageSection> sections = read_package_sections(paths[0], &version[0]);
    nlohmann::json m = nlohmann::json::parse(sections[0].bytes);
    nlohmann::json kept = nlohmann::json::array();
    for (const nlohmann::json& c : m["constants"])
      if (!c.value("prepacked", false)) kept.push_back(c);
    m["constants"] = kept;
    sections[0].bytes = m.dump(1);
    err = test::load_error_as_version(package_container(sections, kPrepackedFormatVersion),
                                      kUpsampleFormatVersion, "r18");
    EXPECT_NE(err.find("prepacked weights are unknown to format version 7"), std::string::npos) << err;
    EXPECT_NE(err.find("launch"), std::string::npos) << err;
  }
  LoadedPackage loaded[2] = {load_package(paths[0]), load_package(paths[1])};
  for (uint64_t seed : {31u, 32u}) {
    TensorList in = nn::zoo_example_inputs("resnet18", 1, seed);
    Tensor want = compiled[0]->run(in)[0];
    expect_bitwise(compiled[1]->run(in)[0], want, "the two compiles");
    expect_bitwise(loaded[0].exe->run(in)[0], want, "prepacked package");
    expect_bitwise(loaded[1].exe->run(in)[0], want, "plain package");
  }
  // The knob's values, and CUDA packages (no oneDNN weights), are checked.
  for (const char* knobs : {"prepack=maybe"}) {
    compiler::Options o;
    o.knobs = compiler::parse_knobs(knobs, "test");
    try {
      nn::export_package(m.module, m.inputs, o, "resnet18", dir.path + "/bad.kiln");
      ADD_FAILURE() << knobs << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("knob prepack expected on | off"), std::string::npos) << e.what();
    }
  }
  nn::ZooModel small = nn::make_zoo_model("mlp", 1, 7);
  compiler::Options o;
  o.arch = "sm_90";
  o.knobs = compiler::parse_knobs("prepack=on", "test");
  try {
    nn::export_package(small.module, small.inputs, o, "mlp", dir.path + "/cuda.kiln");
    ADD_FAILURE() << "prepack=on was accepted for a CUDA package";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("knob prepack is for CPU packages"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path + "/bad.kiln"));
  EXPECT_FALSE(std::filesystem::exists(dir.path + "/cuda.kiln"));
}

// ---- a separate process: the C example, runtime only, bare environment ------------------------
TEST(Package, RunsInSeparateProcessWithoutCompilerOrCache) {
  TempDir dir;
  Packaged p = package_zoo("resnet18", dir.path);
  TensorList in = fresh_inputs(p.model.inputs, 303);
  TensorList want = p.compiled->run(in);
  // Bare environment (test::run_c_example), with the thread count the package was built with.
  test::CRunResult r = test::run_c_example(
      KILN_C_RUN, p.path, in, want, dir.path,
      {"OMP_NUM_THREADS=" + std::to_string(load_package(p.path).threads)});
  ASSERT_EQ(r.status, 0) << "kiln_c_run failed: " << r.status;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(r.outputs[i].defined()) << "kiln_c_run wrote output " << i << " with another size";
    expect_bitwise(r.outputs[i], want[i], "resnet18 output " + std::to_string(i) + " from kiln_c_run");
  }
}

// ---- the C API from several threads ----------------------------------------------------------
TEST(Package, CApiDescribesAndRunsFromSeveralThreads) {
  TempDir dir;
  Packaged p = package_zoo("vfe", dir.path);
  kiln_model* m = kiln_model_open(p.path.c_str());
  ASSERT_NE(m, nullptr) << kiln_last_error();
  ASSERT_EQ(kiln_model_num_inputs(m), int(p.model.inputs.size()));
  kiln_tensor_info info;
  ASSERT_EQ(kiln_model_input(m, 0, &info), 0);
  EXPECT_EQ(int64_t(info.bytes), p.model.inputs[0].nbytes());
  EXPECT_EQ(kiln_model_input(m, 99, &info), -1);
  EXPECT_NE(std::string(kiln_last_error()).find("out of range"), std::string::npos);
  constexpr int kThreads = 4;
  std::vector<TensorList> ins, wants;
  for (int t = 0; t < kThreads; ++t) {
    ins.push_back(fresh_inputs(p.model.inputs, 400 + uint64_t(t)));
    wants.push_back(p.compiled->run(ins.back()));
  }
  std::vector<TensorList> gots(kThreads);
  std::vector<int> rcs(kThreads, -1);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      TensorList& got = gots[size_t(t)];
      for (const Tensor& w : wants[size_t(t)]) got.push_back(Tensor::empty(w.sizes(), w.dtype()));
      std::vector<const void*> in;
      std::vector<void*> out;
      for (const Tensor& x : ins[size_t(t)]) in.push_back(x.raw_data());
      for (Tensor& y : got) out.push_back(y.raw_data());
      int rc = 0;
      for (int rep = 0; rep < 20 && rc == 0; ++rep)
        rc = kiln_model_run(m, in.data(), in.size(), out.data(), out.size());
      rcs[size_t(t)] = rc;
    });
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(rcs[size_t(t)], 0);
    for (size_t i = 0; i < wants[size_t(t)].size(); ++i)
      expect_bitwise(gots[size_t(t)][i], wants[size_t(t)][i], "thread " + std::to_string(t));
  }
  EXPECT_EQ(kiln_model_run(m, nullptr, 0, nullptr, 0), -1);
  EXPECT_NE(std::string(kiln_last_error()).find("inputs"), std::string::npos);
  kiln_model_close(m);
  EXPECT_EQ(kiln_model_open((dir.path + "/missing.kiln").c_str()), nullptr);
  EXPECT_NE(std::string(kiln_last_error()).find("missing.kiln"), std::string::npos);
}

// ---- the corrupt-package corpus -----------------------------------------------------------------
class PackageCorrupt : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    // resnet18: all three sections, oneDNN and loop launches.
    Packaged p = package_zoo("resnet18", dir_->path);
    bytes_ = new std::string(read_bytes(p.path));
    sections_ = new std::vector<PackageSection>(
        parse_package_container(*bytes_, p.path, &version_));
  }
  static void TearDownTestSuite() {
    delete sections_;
    delete bytes_;
    delete dir_;
  }
  // The byte range of each section in the file, from the section table.
  static std::vector<std::pair<size_t, size_t>> ranges() {
    std::vector<std::pair<size_t, size_t>> r;
    uint32_t n;
    std::memcpy(&n, bytes_->data() + 12, 4);
    for (uint32_t i = 0; i < n; ++i) {
      uint64_t off, size;
      std::memcpy(&off, bytes_->data() + 64 + 80 * i + 32, 8);
      std::memcpy(&size, bytes_->data() + 64 + 80 * i + 40, 8);
      r.emplace_back(off, size);
    }
    return r;
  }
  static TempDir* dir_;
  static std::string* bytes_;
  static std::vector<PackageSection>* sections_;
  static uint32_t version_;  // the header's format version (edited containers keep it)
};
TempDir* PackageCorrupt::dir_ = nullptr;
uint32_t PackageCorrupt::version_ = 0;
std::string* PackageCorrupt::bytes_ = nullptr;
std::vector<PackageSection>* PackageCorrupt::sections_ = nullptr;

TEST_F(PackageCorrupt, IntactPackageLoads) {
  ASSERT_EQ(sections_->size(), 4u);
  std::vector<std::string> names;
  for (const PackageSection& s : *sections_) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"manifest", "weights", "kernels.cpu", "source"}));
  EXPECT_EQ(load_error(*bytes_), "");
}

TEST_F(PackageCorrupt, TruncationAtManyOffsetsIsAnError) {
  const std::string& b = *bytes_;
  std::vector<size_t> cuts = {0, 1, 7, 8, 12, 63, 64, 65, 143, 144, 300, b.size() - 1};
  for (auto [off, size] : ranges()) {
    cuts.push_back(off);
    cuts.push_back(off + size / 2);
    cuts.push_back(off + size - 1);
  }
  for (size_t k = 1; k < 64; ++k) cuts.push_back(b.size() * k / 64);
  for (size_t cut : cuts) {
    if (cut >= b.size()) continue;
    std::string err = load_error(std::string_view(b).substr(0, cut));
    EXPECT_FALSE(err.empty()) << "truncated at " << cut << " loads";
    EXPECT_TRUE(err.find("truncated") != std::string::npos || err.find("header") != std::string::npos)
        << "truncated at " << cut << ": " << err;
  }
}

TEST_F(PackageCorrupt, BitFlipsInEachSectionNameTheSection) {
  std::vector<std::pair<size_t, size_t>> r = ranges();
  for (size_t s = 0; s < sections_->size(); ++s) {
    auto [off, size] = r[s];
    const std::string& name = (*sections_)[s].name;
    for (size_t at : {off, off + size / 3, off + size / 2, off + size - 1}) {
      for (int bit : {0, 5}) {
        std::string b = *bytes_;
        b[at] = char(b[at] ^ (1 << bit));
        std::string err = load_error(b);
        EXPECT_NE(err.find("section '" + name + "'"), std::string::npos)
            << "flip at " << at << " bit " << bit << ": " << err;
        EXPECT_NE(err.find("SHA-256"), std::string::npos) << err;
      }
    }
  }
  // The header and the section table are protected too.
  for (size_t at : {size_t(3), size_t(9), size_t(20), size_t(30), size_t(70), size_t(64 + 80 + 35)}) {
    std::string b = *bytes_;
    b[at] = char(b[at] ^ 1);
    EXPECT_NE(load_error(b), "") << "flip at " << at;
  }
}

// Note [chunked weights hash]: from format version 8 the weights' entry in the section table is
// the SHA-256 of the SHA-256 digests of its 4 MiB chunks, in order; a flipped bit in any chunk
// (the first, one inside, the last, short one, on either side of a chunk boundary) is caught.
TEST_F(PackageCorrupt, WeightsHashIsOverTheirChunksDigests) {
  ASSERT_GE(version_, kPrepackedFormatVersion);
  ASSERT_EQ((*sections_)[1].name, "weights");
  const std::string& w = (*sections_)[1].bytes;
  constexpr size_t kChunk = size_t(4) << 20;
  ASSERT_GT(w.size(), 3 * kChunk) << "resnet18's weights span several chunks";
  std::string digests;
  for (size_t at = 0; at < w.size(); at += kChunk) {
    std::string hex = sha256_hex(std::string_view(w).substr(at, kChunk));
    for (size_t i = 0; i < 32; ++i) digests += char(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  const std::string root = sha256_hex(digests);
  std::string stored;
  for (size_t i = 0; i < 32; ++i) stored += fmt::format("{:02x}", uint8_t((*bytes_)[64 + 80 + 48 + i]));
  EXPECT_EQ(stored, root);
  EXPECT_NE(stored, sha256_hex(w)) << "not the plain SHA-256 of the section";
  auto [off, size] = ranges()[1];
  // Where the CPU has AVX-512, resnet18's 11 whole chunks are hashed as one group of sixteen
  // lanes (Note [SHA-256 of sixteen messages at once]): a flip in its last lane is caught too.
  ASSERT_GT(size, 11 * kChunk);
  for (size_t at : {off, off + kChunk - 1, off + kChunk, off + 2 * kChunk + 17,
                    off + 10 * kChunk + 12345, off + size - 1}) {
    std::string b = *bytes_;
    b[at] = char(b[at] ^ 0x10);
    std::string err = load_error(b);
    EXPECT_NE(err.find("section 'weights': SHA-256 mismatch"), std::string::npos)
        << "flip at " << at - off << ": " << err;
  }
}

TEST_F(PackageCorrupt, ReorderedSectionsAreRefused) {
  // Sections written in another order (a valid table, valid hashes).
  std::vector<PackageSection> swapped = *sections_;
  std::swap(swapped[0], swapped[1]);
  std::string err = load_error(package_container(swapped, version_));
  EXPECT_NE(err.find("out of order"), std::string::npos) << err;
  EXPECT_NE(err.find("manifest"), std::string::npos) << err;
  // The names of two table entries swapped (offsets and hashes kept) and the table re-hashed:
  // each section still matches its hash, so only the order check can catch it.
  std::string b = *bytes_;
  for (size_t k = 0; k < 32; ++k) std::swap(b[64 + 80 * 1 + k], b[64 + 80 * 2 + k]);
  std::string hex = sha256_hex(std::string_view(b).substr(64, 80 * sections_->size()));
  for (size_t i = 0; i < 32; ++i) b[24 + i] = char(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  err = load_error(b);
  EXPECT_NE(err.find("out of order"), std::string::npos) << err;
  // Without the re-hash, the table's own hash catches it.
  std::string c = *bytes_;
  for (size_t k = 0; k < 32; ++k) std::swap(c[64 + 80 * 1 + k], c[64 + 80 * 2 + k]);
  EXPECT_NE(load_error(c).find("section table"), std::string::npos);
}

TEST_F(PackageCorrupt, ManifestRequiringAMissingCpuFeatureIsRefusedByTheCheck) {
  // Edit the manifest to require a feature this CPU lacks, and re-hash properly: only the ISA
  // check can catch it.
  std::string host = host_isa();
  std::string lacking;
  for (const char* f : {"amx-tile", "avx512fp16", "avx5124fmaps", "avx512er", "xop", "fma4"})
    if (("+" + host + "+").find(std::string("+") + f + "+") == std::string::npos) {
      lacking = f;
      break;
    }
  ASSERT_FALSE(lacking.empty()) << "this CPU has every feature tried: " << host;
  std::vector<PackageSection> edited = *sections_;
  nlohmann::json m = nlohmann::json::parse(edited[0].bytes);
  m["target"]["isa"] = m["target"]["isa"].get<std::string>() + "+" + lacking;
  edited[0].bytes = m.dump(1);
  std::string err = load_error(package_container(edited, version_));
  EXPECT_NE(err.find("lacks (" + lacking + ")"), std::string::npos) << err;
  EXPECT_NE(err.find("kiln compile"), std::string::npos) << err;
  // Another base architecture is refused the same way.
  m["target"]["isa"] = "aarch64";
  edited[0].bytes = m.dump(1);
  EXPECT_NE(load_error(package_container(edited, version_)).find("lacks (aarch64)"), std::string::npos);
}

TEST_F(PackageCorrupt, HandEditedManifestIsAnErrorNamingTheManifest) {
  struct Edit {
    const char* what;
    std::function<void(nlohmann::json&)> apply;
    const char* expect = nullptr;  // a part of the error, where the reason is specific
  };
  std::vector<Edit> edits = {
      {"not JSON", nullptr},
      {"format version", [](nlohmann::json& m) { m["format_version"] = 1; }},  // header: 2
      {"format version", [](nlohmann::json& m) { m["format_version"] = 3; }},
      {"output past the arena",
       [](nlohmann::json& m) { m["outputs"][0]["byte_offset"] = m["arena_bytes"].get<int64_t>(); }},
      {"input slot out of range", [](nlohmann::json& m) { m["inputs"][0]["slot"] = 100000; }},
      {"unknown dtype", [](nlohmann::json& m) { m["inputs"][0]["dtype"] = "float128"; }},
      {"missing weight", [](nlohmann::json& m) { m["constants"][0]["name"] = "no.such.weight"; }},
      {"unknown launch kind", [](nlohmann::json& m) { m["launches"][0]["kind"] = "cuda"; }},
      {"missing kernel symbol",
       [](nlohmann::json& m) {
         for (auto& l : m["launches"])
           if (l["kind"] == "loop") l["params"]["symbol"] = "no_such_kernel";
       }},
      {"oneDNN buffer out of range",
       [](nlohmann::json& m) {
         for (auto& l : m["launches"])
           if (l["kind"] == "onednn") l["params"]["output"] = {0, int64_t(1) << 40};
       }},
      {"oneDNN implementation differs",
       [](nlohmann::json& m) {
         for (auto& l : m["launches"])
           if (l["kind"] == "onednn") l["params"]["expect"] = "something else";
       }},
      // Note [Scratch per step]: other values lie after a node's planned scratch.
      {"oneDNN scratch below the node's need",
       [](nlohmann::json& m) {
         for (auto& l : m["launches"])
           if (l["kind"] == "onednn" && l["params"].value("scratch_bytes", int64_t(0)) > 0)
             l["params"]["scratch_bytes"] = 0;
       },
       "bytes of scratch on this machine, the package planned 0"},
      // Note [Input staging in the arena]: only CUDA packages stage inputs.
      {"staging offset in a CPU package",
       [](nlohmann::json& m) { m["inputs"][0]["staging_offset"] = 0; },
       "staging_offset in a CPU package"},
      {"oneDNN scratch negative",
       [](nlohmann::json& m) {
         for (auto& l : m["launches"])
           if (l["kind"] == "onednn") l["params"]["scratch_bytes"] = -64;
       }},
      {"oneDNN weight shape",
       [](nlohmann::json& m) {
         for (auto& l : m["launches"])
           if (l["kind"] == "onednn") l["params"]["desc"]["inputs"][1]["dims"][0] = 7;
       }},
      // Note [prepacked weights]: the layout check, not the hash, must catch these.
      {"prepacked layout",
       [](nlohmann::json& m) {
         for (auto& l : m["launches"])
           if (l["params"].contains("prepacked"))
             l["params"]["prepacked"][0]["layout"] = "dt 3 dims 64,3,7,7 blocked abcd";
       },
       "are laid out as [dt 3 dims 64,3,7,7 blocked abcd], but oneDNN here computes with"},
      {"prepacked entry",
       [](nlohmann::json& m) {
         for (auto& l : m["launches"])
           if (l["params"].contains("prepacked")) l["params"]["prepacked"][0]["entry"] = "nope";
       },
       "prepacked entry 'nope' is not this launch's entry"},
      {"prepacked twice",
       [](nlohmann::json& m) {
         for (auto& l : m["launches"])
           if (l["params"].contains("prepacked"))
             l["params"]["prepacked"].push_back(l["params"]["prepacked"][0]);
       },
       "listed twice"},
      {"prepacked for another node's weights",
       [](nlohmann::json& m) {
         nlohmann::json* first = nullptr;
         for (auto& l : m["launches"])
           if (l["params"].contains("prepacked")) {
             if (!first) {
               first = &l;
             } else {
               std::swap((*first)["params"]["prepacked"][0]["entry"], l["params"]["prepacked"][0]["entry"]);
               break;
             }
           }
       },
       "is not this launch's entry for its constant"},
      {"prepacked constant no launch holds",
       [](nlohmann::json& m) {
         for (auto& c : m["constants"])
           if (c.value("prepacked", false)) {
             c["name"] = "no.such.weight";
             break;
           }
       },
       "marked prepacked, but no launch holds it prepacked"},
  };
  for (const Edit& e : edits) {
    std::vector<PackageSection> edited = *sections_;
    if (e.apply) {
      nlohmann::json m = nlohmann::json::parse(edited[0].bytes);
      e.apply(m);
      edited[0].bytes = m.dump(1);
    } else {
      edited[0].bytes = "{\"format_version\": 1,";
    }
    std::string err = load_error(package_container(edited, version_));
    EXPECT_FALSE(err.empty()) << e.what << " loads";
    EXPECT_TRUE(err.find("manifest") != std::string::npos || err.find("launch") != std::string::npos)
        << e.what << ": " << err;
    if (e.expect) {
      EXPECT_NE(err.find(e.expect), std::string::npos) << e.what << ": " << err;
    }
  }
}

// A package from before scratch was planned per node (no scratch_bytes in its oneDNN records:
// its scratch was one region at the arena's end) still loads and computes the same bits.
TEST_F(PackageCorrupt, OneDnnRecordsWithoutScratchBytesStillLoad) {
  std::vector<PackageSection> edited = *sections_;
  nlohmann::json m = nlohmann::json::parse(edited[0].bytes);
  int with_scratch = 0;
  for (auto& l : m["launches"])
    if (l["kind"] == "onednn") {
      ASSERT_TRUE(l["params"].contains("scratch_bytes"));
      with_scratch += l["params"]["scratch_bytes"].get<int64_t>() > 0;
      l["params"].erase("scratch_bytes");
    }
  EXPECT_GT(with_scratch, 0);
  edited[0].bytes = m.dump(1);
  LoadedPackage older = load_package_bytes(package_container(edited, version_), "older.kiln");
  LoadedPackage now = load_package_bytes(*bytes_, "now.kiln");
  Generator gen(61);
  TensorList in = {Tensor::randn({1, 3, 224, 224}, gen)};
  expect_bitwise(older.exe->run(in)[0], now.exe->run(in)[0], "records without scratch_bytes");
}

// Every device launch kind the runtime registers is refused in a CPU package (its buffers would be
// device pointers dereferenced on the host), naming the launch and the kind.
TEST_F(PackageCorrupt, ACudaLaunchInACpuPackageIsRefusedNamingTheKind) {
  for (const char* kind : {"cuda_kernel", "cublaslt", "cudnn_conv", "cudnn_sdpa"}) {
    ASSERT_TRUE(launch_kind_device(kind).has_value()) << kind << " is not registered";
    EXPECT_TRUE(launch_kind_device(kind)->is_cuda()) << kind;
    std::vector<PackageSection> edited = *sections_;
    nlohmann::json m = nlohmann::json::parse(edited[0].bytes);
    m["launches"][0]["kind"] = kind;
    edited[0].bytes = m.dump(1);
    std::string err = load_error(package_container(edited, version_));
    EXPECT_NE(err.find(std::string("a ") + kind + " launch in a cpu package"), std::string::npos)
        << err;
  }
  for (const char* kind : {"loop", "onednn", "gather_rows", "concat"})
    EXPECT_TRUE(launch_kind_device(kind).has_value() && launch_kind_device(kind)->is_cpu()) << kind;
}

// ---- CUDA launch records checked without a GPU ----------------------------------------------------
// validate_launch_record runs the parse-only half of each CUDA kind's rebuild (what the loader
// checks before it creates any cuBLASLt or cuDNN plan), so an edited CUDA package's records are
// checked, and fuzzed (tests/fuzz/launch_record_fuzz.cc), on machines without a GPU. Records as
// a cross-build (`kiln compile mlp|resnet18 --device cuda --arch sm_90`) writes them.
class CudaLaunchRecords : public testing::Test {
 protected:
  void SetUp() override {
    env_.slot_bytes = [](int32_t slot) -> int64_t {
      static const int64_t bytes[6] = {int64_t(1) << 26, int64_t(1) << 22, 4096, 256,
                                       int64_t(1) << 20, int64_t(1) << 24};
      return slot >= 0 && slot < 6 ? bytes[slot] : 0;
    };
    env_.num_slots = 6;
  }
  // The error of validating `params` as `kind` ("" when it validates).
  std::string error_of(const char* kind, const nlohmann::json& params) {
    try {
      EXPECT_TRUE(validate_launch_record({kind, params.dump()}, env_, "launch 7 ('x')")) << kind;
      return "";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::ParseError) << e.what();
      EXPECT_NE(std::string(e.what()).find("launch 7 ('x')"), std::string::npos) << e.what();
      return e.what();
    }
  }
  static nlohmann::json gemm() {
    return nlohmann::json::parse(R"({"a":[1,0],"algo":null,"b":[2,0],"bias":[3,0],"d":[0,0],
      "desc":{"alignment_bytes":16,"allow_tf32":false,"alpha":1.0,"batch":1,"beta":0.0,
      "dtype":"float32","epilogue":"bias","k":10,"lda":0,"ldb":0,"ldc":0,"ldd":0,"m":1,"n":50,
      "stride_a":-1,"stride_b":-1,"stride_c":-1,"stride_d":-1,"trans_a":false,"trans_b":true},
      "workspace":[0,512],"workspace_bytes":4096})");
  }
  static nlohmann::json conv() {
    return nlohmann::json::parse(R"({"bias":[5,0],"bias_kernel":{"args":[[5,0],[0,0]],"block":256,
      "grid":2112,"kernel":"kn_bias_0","module":"graph0_lib","shared":0},
      "desc":{"alignment_bytes":16,"allow_tf32":false,"bias":false,"c_in":3,"c_out":64,
      "dilation":[1,1],"dtype":"float32","groups":1,"h":224,"kh":7,"kind":"forward","kw":7,
      "layout":"nchw","n":1,"output_padding":[0,0],"pad_post":[3,3],"pad_pre":[3,3],"relu":false,
      "residual":false,"stride":[2,2],"w":224},"engine":null,"w":[4,0],"workspace":[0,4014080],
      "workspace_bytes":33554432,"x":[1,0],"y":[0,0]})");
  }
  // As this Kiln writes it (format version 4): a channels-last bfloat16 convolution with its
  // residual moved into the scratch region by a pre kernel and y moved out by a post kernel.
  static nlohmann::json conv_nhwc() {
    return nlohmann::json::parse(R"({"bias":[5,0],"residual":[0,2097152],"w_krsc":true,
      "pre":[{"args":[[1,0],[0,1048576]],"block":256,"grid":784,"kernel":"kn_conv_x_3",
      "module":"graph0_lib","shared":0}],
      "post":[{"args":[[0,4194304],[0,6291456]],"block":256,"grid":784,"kernel":"kn_conv_y_3",
      "module":"graph0_lib","shared":0}],
      "desc":{"alignment_bytes":16,"allow_tf32":false,"bias":true,"c_in":64,"c_out":64,
      "dilation":[1,1],"dtype":"bfloat16","groups":1,"h":56,"kh":3,"kind":"forward","kw":3,
      "layout":"nhwc","n":1,"output_padding":[0,0],"pad_post":[1,1],"pad_pre":[1,1],"relu":true,
      "residual":true,"stride":[1,1],"w":56},"engine":"eng0","w":[4,0],"workspace":[0,0],
      "workspace_bytes":1048576,"x":[0,1048576],"y":[0,4194304]})");
  }
  static nlohmann::json sdpa() {
    return nlohmann::json::parse(R"({"desc":{"dtype":"bfloat16","batch":1,"heads":12,"seq_q":197,
      "seq_kv":197,"head_dim":64,"head_dim_v":64,"scale":0.125,"causal":false,
      "alignment_bytes":16},"engine":"eng9_k3=64","q":[0,0],"k":[0,302592],"v":[0,605184],
      "o":[0,907776],"workspace":[0,1210368],"workspace_bytes":0})");
  }
  // As this Kiln writes it (format version 5): vit_b_16's attention reading q, k and v in place
  // from the packed QKV projection [197, 2304] (Note [CUDA attention reads views]).
  static nlohmann::json sdpa_views() {
    return nlohmann::json::parse(R"({"desc":{"dtype":"bfloat16","batch":1,"heads":12,"seq_q":197,
      "seq_kv":197,"head_dim":64,"head_dim_v":64,"scale":0.125,"causal":false,
      "alignment_bytes":16,"q_stride":[453888,64,2304,1],"k_stride":[453888,64,2304,1],
      "v_stride":[453888,64,2304,1]},"engine":"eng9_k3=64","q":[0,0],"k":[0,1536],
      "v":[0,3072],"o":[0,907776],"workspace":[0,1210368],"workspace_bytes":0})");
  }
  LaunchEnv env_;
};

TEST_F(CudaLaunchRecords, RecordsAsWrittenAreAccepted) {
  EXPECT_EQ(error_of("cublaslt", gemm()), "");
  nlohmann::json g = gemm();
  g["algo"] = nlohmann::json::array();
  for (int i = 0; i < 8; ++i) g["algo"].push_back(fmt::format("{:016x}", 0x1234u * unsigned(i)));
  EXPECT_EQ(error_of("cublaslt", g), "");  // format 4: matched by its bytes
  // Format 5: the configuration the loader matches (Note [cuBLASLt algorithm identity]).
  g["algo_config"] = "id66 tile18 stages35 splitk1 red0 swz0 custom0 inner1 cluster2";
  EXPECT_EQ(error_of("cublaslt", g), "");
  EXPECT_EQ(error_of("cudnn_conv", conv()), "");  // a version-3 record (its bias_kernel)
  EXPECT_EQ(error_of("cudnn_conv", conv_nhwc()), "");
  EXPECT_EQ(error_of("cudnn_sdpa", sdpa()), "");  // a version-4 record (no strides: contiguous)
  EXPECT_EQ(error_of("cudnn_sdpa", sdpa_views()), "");
  EXPECT_EQ(error_of("cuda_kernel", conv()["bias_kernel"]), "");
  // Host kinds have no parse-only check (their rebuild needs the kernels' shared object).
  EXPECT_FALSE(validate_launch_record({"loop", "{}"}, env_, "launch 0"));
}

TEST_F(CudaLaunchRecords, EditedRecordsAreRefusedNamingWhatIsWrong) {
  auto expect = [&](const char* kind, const nlohmann::json& p, const std::string& want) {
    std::string err = error_of(kind, p);
    EXPECT_NE(err.find(want), std::string::npos) << kind << ": want '" << want << "' in: " << err;
  };
  nlohmann::json g = gemm();
  g["d"] = {4, (1 << 20) - 64};  // D (200 bytes) past the end of slot 4
  expect("cublaslt", g, "buffer 'D' of 200 bytes at slot 4 offset 1048512 lies outside");
  g = gemm();
  g["desc"]["m"] = 2.2e79;  // nlohmann would cast it to int64: undefined (the fuzzer's finding)
  expect("cublaslt", g, "a number in the JSON is out of range");
  g = gemm();
  g["algo"] = std::vector<std::string>(8, "0x12");
  expect("cublaslt", g, "hexadecimal");
  g = gemm();
  g["algo"] = std::vector<std::string>(8, "12");
  g["algo_config"] = "id66\ntile18";
  expect("cublaslt", g, "malformed cublaslt launch");
  g["algo_config"] = "";
  expect("cublaslt", g, "malformed cublaslt launch");
  g = gemm();
  g["desc"]["m"] = int64_t(1) << 31;
  g["desc"]["batch"] = int64_t(1) << 31;
  g["desc"]["stride_d"] = int64_t(1) << 40;
  expect("cublaslt", g, "overflow");
  nlohmann::json c = conv();
  for (const char* k : {"n", "c_in", "h", "w"}) c["desc"][k] = int64_t(1) << 24;
  c["desc"]["c_out"] = int64_t(1) << 24;
  expect("cudnn_conv", c, "overflow");
  c = conv();
  c["bias_kernel"]["block"] = 0;
  expect("cudnn_conv", c, "kernel geometry out of range");
  c = conv();
  c["x"] = {3, 0};  // the input (602112 bytes) in a 256-byte slot
  expect("cudnn_conv", c, "buffer 'x'");
  c = conv_nhwc();
  c["residual"] = {3, 0};  // the residual (401408 bytes) in a 256-byte slot
  expect("cudnn_conv", c, "buffer 'residual'");
  c = conv_nhwc();
  c["desc"]["layout"] = "nchw";
  expect("cudnn_conv", c, "KRSC for a convolution that is not NHWC");
  c = conv_nhwc();
  for (int i = 0; i < 8; ++i) c["pre"].push_back(c["pre"][0]);
  expect("cudnn_conv", c, "at most 8");
  c = conv_nhwc();
  c["post"][0]["args"][1] = {9, 0};
  expect("cudnn_conv", c, "slot 9");
  nlohmann::json a = sdpa();
  a["desc"]["head_dim"] = int64_t(1) << 24;
  a["desc"]["seq_q"] = int64_t(1) << 24;
  a["desc"]["heads"] = int64_t(1) << 24;
  expect("cudnn_sdpa", a, "overflow");
  a = sdpa();
  a["o"] = {2, 0};
  expect("cudnn_sdpa", a, "buffer 'o'");
  a = sdpa();
  a.erase("engine");
  expect("cudnn_sdpa", a, "malformed cudnn_sdpa launch");
  // Strided views: the span is the last element's offset + 1, checked against the slot.
  a = sdpa_views();
  a["v"] = {4, (1 << 20) - 904704};  // v's view spans 904,704 bytes: fits exactly at the end
  EXPECT_EQ(error_of("cudnn_sdpa", a), "");
  a["v"] = {4, (1 << 20) - 904702};
  expect("cudnn_sdpa", a, "buffer 'v'");
  a = sdpa_views();
  a["desc"]["k_stride"] = {453888, 64, int64_t(1) << 30, 1};  // rows far past slot 0
  expect("cudnn_sdpa", a, "buffer 'k'");
  a = sdpa_views();
  a["desc"]["q_stride"] = {453888, 64, 2304, 2};  // the features must be contiguous
  expect("cudnn_sdpa", a, "malformed cudnn_sdpa launch");
  a = sdpa_views();
  a["desc"]["q_stride"] = {453888, -64, 2304, 1};
  expect("cudnn_sdpa", a, "malformed cudnn_sdpa launch");
  expect("cuda_kernel", nlohmann::json::parse(R"({"args":[[9,0]],"block":32,"grid":1,
      "kernel":"k","module":"m","shared":0})"),
         "buffer 'kernel argument' is in slot 9, but the slot table has 6 slots");
  try {
    validate_launch_record({"tensorrt_engine", "{}"}, env_, "launch 1");
    FAIL() << "an unknown kind validated";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown launch kind 'tensorrt_engine'"), std::string::npos) << e.what();
  }
}

// ---- a launch that cannot be serialized ---------------------------------------------------------
TEST(Package, EagerLaunchIsRefusedNamingTheNode) {
  // Integer division runs its eager kernel on the CPU (it raises on division by zero).
  Graph g;
  ValueId a = g.add_input("a", TensorType(DType::Int64, Shape{SymInt(4)}));
  ValueId b = g.add_input("b", TensorType(DType::Int64, Shape{SymInt(4)}));
  ValueId q = g.add_node1(OpId::Div, {a, b}, {}, "int_div");
  g.outputs.push_back(q);
  auto c = compiler::compile(g, Device::cpu());
  ASSERT_GT(c->report().eager_launches, 0);
  TempDir dir;
  std::string path = dir.path + "/div.kiln";
  try {
    compiler::write_package(g, *c, {}, {}, path);
    FAIL() << "a graph with an eager launch was packaged";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("int_div"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("eager"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

// ---- CUDA cross-builds (Note [CUDA cross-builds] in targets/cuda/target.cc) ---------------------
// Without a GPU (CI): a CUDA package for sm_90 is built from a host model. Its device code is
// NVRTC's cubins, its library calls are descriptors whose algorithm and engine the loader picks;
// it is deterministic, and loading it here fails with "no CUDA device" rather than crashing. (On
// the GPU machine, CudaPackage.CrossBuiltPackageRunsOnThisGpu loads and runs such packages.)
TEST(Package, CudaCrossBuildWithoutAGpu) {
  TempDir dir;
  nn::ZooModel m = nn::make_zoo_model("resnet18", 1, 7);
  compiler::Options o;
  o.arch = "sm_90";
  std::string path = dir.path + "/resnet18-sm90.kiln";
  auto compiled = nn::export_package(m.module, m.inputs, o, "resnet18", path);
  uint32_t version = 0;
  std::vector<PackageSection> sections = read_package_sections(path, &version);
  EXPECT_EQ(version, kCudaPackageFormatVersion);
  ASSERT_GE(sections.size(), 3u);
  EXPECT_EQ(sections[2].name, "kernels.cuda");
  nlohmann::json manifest = nlohmann::json::parse(sections[0].bytes);
  EXPECT_EQ(manifest["target"]["device"], "cuda");
  EXPECT_EQ(manifest["target"]["arch"], "sm_90");
  int convs = 0, gemms = 0, kernels = 0;
  for (const nlohmann::json& l : manifest["launches"]) {
    std::string kind = l["kind"];
    if (kind == "cudnn_conv") {
      ++convs;
      EXPECT_TRUE(l["params"]["engine"].is_null());
    } else if (kind == "cublaslt") {
      ++gemms;
      EXPECT_TRUE(l["params"]["algo"].is_null());
    } else {
      EXPECT_EQ(kind, "cuda_kernel");
      ++kernels;
    }
  }
  EXPECT_EQ(convs, 19);  // resnet18's convolutions but its stem (a direct kernel)
  EXPECT_EQ(gemms, 1);   // its classifier
  EXPECT_GT(kernels, 0);
  // Every cubin is an ELF image for the architecture asked, followed by the same program's PTX
  // for that architecture (Note [PTX in CUDA packages]): one NUL-terminated text.
  ASSERT_FALSE(manifest["cuda_modules"].empty());
  const std::string_view cuda_section = sections[2].bytes;
  for (const nlohmann::json& mod : manifest["cuda_modules"]) {
    EXPECT_EQ(mod["arch"], "sm_90");
    std::string_view image = cuda_section.substr(mod["offset"].get<size_t>(), 4);
    EXPECT_EQ(image, std::string_view("\x7f" "ELF", 4));
    ASSERT_TRUE(mod.contains("ptx_offset") && mod.contains("ptx_size")) << mod.dump();
    const size_t poff = mod["ptx_offset"].get<size_t>(), psize = mod["ptx_size"].get<size_t>();
    EXPECT_GE(poff, mod["offset"].get<size_t>() + mod["size"].get<size_t>());
    ASSERT_LE(poff + psize, cuda_section.size());
    std::string_view ptx = cuda_section.substr(poff, psize);
    EXPECT_EQ(ptx.find('\0'), psize - 1) << "PTX is one NUL-terminated text";
    EXPECT_NE(ptx.find(".target sm_90"), std::string_view::npos);
    EXPECT_NE(ptx.find(".entry "), std::string_view::npos) << "PTX without kernels";
  }
  EXPECT_NE(explain_package(path).find("PTX"), std::string::npos) << explain_package(path);
  // Deterministic, as CPU packages are.
  std::string again_path = dir.path + "/again.kiln";
  nn::export_package(m.module, m.inputs, o, "resnet18", again_path);
  EXPECT_TRUE(read_bytes(path) == read_bytes(again_path)) << "two cross-builds differ";
  // The compiled executable cannot run here; the package loads only on a GPU.
  try {
    compiled->run(m.inputs);
    ADD_FAILURE() << "a cross-built executable ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cross-built for sm_90"), std::string::npos) << e.what();
  }
  if (cuda_device_count() == 0) {
    std::string err = load_error(read_bytes(path));
    EXPECT_NE(err.find("no CUDA device"), std::string::npos) << err;
  }
  // What a cross-build refuses: another target, max-autotune, a malformed architecture.
  auto error_of = [&](compiler::Options opts, Device device) -> std::string {
    try {
      nn::ZooModel small = nn::make_zoo_model("mlp", 1, 7);
      Graph g;
      nn::compile_module_graph(small.module, small.inputs, opts, &g);
      compiler::compile(g, device, opts);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  compiler::Options autotune = o;
  autotune.mode = "max-autotune";
  EXPECT_NE(error_of(autotune, Device::cuda(0)).find("cannot: use default or reduce-overhead"),
            std::string::npos);
  compiler::Options bad = o;
  bad.arch = "sm_x";
  EXPECT_NE(error_of(bad, Device::cuda(0)).find("not a CUDA architecture"), std::string::npos);
  try {
    Graph g;
    nn::ZooModel small = nn::make_zoo_model("mlp", 1, 7);
    compiler::Options plain;
    nn::compile_module_graph(small.module, small.inputs, plain, &g);
    compiler::compile(g, Device::cpu(), o);
    ADD_FAILURE() << "arch on the CPU target was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the cpu target takes none"), std::string::npos) << e.what();
  }
}

// Note [CUDA TF32]: the knob tf32=on reaches every cuBLASLt and cuDNN call's descriptor, which is
// what a package (here a cross-build, made without a GPU) records and its loader plans with;
// without the knob no descriptor allows TF32. The CPU target refuses the knob.
namespace {
// Why compiling `g` for `device` under `knobs` fails (a CUDA compile is a cross-build for
// sm_90); "" when it compiles.
std::string knob_error(const Graph& g, Device device, const char* knobs) {
  compiler::Options o;
  if (device.is_cuda()) o.arch = "sm_90";
  o.knobs = compiler::parse_knobs(knobs, "test");
  try {
    compiler::compile(g, device, o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

namespace {
// A zoo model cross-built for sm_90 in `precision` under `knobs` (the CUDA pipeline runs without
// a GPU): its compile summary, the package's manifest and the count of each launch kind in it.
struct CrossBuilt {
  std::string summary;
  nlohmann::json manifest;
  std::map<std::string, int> launches;
  std::string cuda_kernels;  // the kernels.cuda section
};
CrossBuilt cross_build(const std::string& model, DType precision = DType::BFloat16, const char* knobs = "",
                       const char* arch = "sm_90") {
  TempDir dir;
  nn::ZooModel m = nn::make_zoo_model(model, 1, 7);
  compiler::Options o;
  o.arch = arch;
  o.precision = precision;
  o.knobs = compiler::parse_knobs(knobs, "test");
  const std::string path = dir.path + "/" + model + "-sm90.kiln";
  CrossBuilt c;
  c.summary = nn::export_package(m.module, m.inputs, o, model, path)->summary();
  const std::vector<PackageSection> sections = read_package_sections(path);
  c.manifest = nlohmann::json::parse(sections[0].bytes);
  for (const PackageSection& s : sections)
    if (s.name == "kernels.cuda") c.cuda_kernels = s.bytes;
  for (const nlohmann::json& l : c.manifest["launches"]) ++c.launches[l["kind"].get<std::string>()];
  return c;
}
}  // namespace

// Note [CUDA small-channel convolutions]: resnet18's 3-channel stem is a direct kernel of the
// package (an NVRTC cubin, no cuDNN record) with its bias and relu; the other 19 convolutions
// stay cuDNN's. Under the knob stem_conv=cudnn all 20 are cuDNN's.
TEST(Package, CudaCrossBuiltStemIsTheSmallChannelKernel) {
  for (const bool direct : {false, true}) {
    CrossBuilt c = cross_build("resnet18", DType::Float32, direct ? "" : "stem_conv=cudnn");
    int stems = 0;
    for (const nlohmann::json& l : c.manifest["launches"])
      stems += l["kind"] == "cuda_kernel" && l["params"]["kernel"].get<std::string>().rfind("kn_fused_conv2d_", 0) == 0;
    EXPECT_EQ(c.launches["cudnn_conv"], direct ? 19 : 20) << c.summary;
    EXPECT_EQ(stems, direct ? 1 : 0) << c.summary;
    EXPECT_EQ(c.summary.find("fused_conv2d small-channel direct kernel (float32, 3 input channels, 7x7 stride 2x2, bias, relu") !=
                  std::string::npos,
              direct) << c.summary;
  }
}

TEST(Package, CudaCrossBuildRecordsTf32InEveryLibraryCall) {
  for (const bool tf32 : {false, true}) {
    CrossBuilt c = cross_build("resnet18", DType::Float32, tf32 ? "tf32=on" : "");
    int library = 0;
    for (const nlohmann::json& l : c.manifest["launches"]) {
      const std::string kind = l["kind"];
      if (kind != "cudnn_conv" && kind != "cublaslt") continue;
      ++library;
      EXPECT_EQ(l["params"]["desc"]["allow_tf32"].get<bool>(), tf32) << kind << " tf32=" << tf32;
    }
    EXPECT_EQ(library, 20) << "resnet18's convolutions but the stem (a direct kernel, exact float32), and its classifier";
  }
  nn::ZooModel small = nn::make_zoo_model("mlp", 1, 7);
  Graph g;
  compiler::Options plain;
  nn::compile_module_graph(small.module, small.inputs, plain, &g);
  for (const char* knobs : {"tf32=on", "tf32=maybe"}) {
    const std::string err = knob_error(g, Device::cpu(), knobs);
    EXPECT_NE(err.find("cpu target: knob tf32 selects CUDA's TF32 tensor cores"), std::string::npos)
        << knobs << " on the CPU target: " << (err.empty() ? "accepted" : err);
  }
  const std::string err = knob_error(g, Device::cuda(0), "tf32=maybe");
  EXPECT_NE(err.find("cuda: knob tf32=maybe is not off or on"), std::string::npos)
      << (err.empty() ? "accepted" : err);
}

// Note [CUDA tensor-core attention] in a cross-build (no GPU needed): bfloat16 attention built
// for sm_90 takes the tensor-core kernel, for sm_75 (no bf16 mma.sync) or under attention=simt
// the SIMT kernel; the knob attention takes auto, direct or simt, another value is an error
// naming it.
TEST(CudaCrossBuild, AttentionTakesTheTensorCoresFromSm80) {
  Graph g;
  std::vector<ValueId> ids;
  for (const char* name : {"q", "k", "v"})
    ids.push_back(g.add_input(name, TensorType(DType::BFloat16, Shape{1, 2, 16, 64})));
  ids.push_back(g.add_input("mask", TensorType(DType::BFloat16, Shape{1, 1, 1, 16})));
  g.outputs = g.add_node(OpId::ScaledDotProductAttention, ids, {{"is_causal", false}}, "attn");
  struct Case {
    const char* arch;
    const char* knobs;
    bool tensor_cores;
  };
  for (const Case& c : {Case{"sm_90", "", true}, Case{"sm_80", "attention=direct", true},
                        Case{"sm_75", "", false}, Case{"sm_90", "attention=simt", false}}) {
    SCOPED_TRACE(fmt::format("{} {}", c.arch, c.knobs));
    compiler::Options o;
    o.arch = c.arch;
    o.knobs = compiler::parse_knobs(c.knobs, "test");
    const std::string summary = compiler::compile(g, Device::cuda(0), o)->summary();
    EXPECT_NE(summary.find("flash kernel"), std::string::npos) << summary;
    EXPECT_EQ(summary.find("flash kernel on tensor cores") != std::string::npos, c.tensor_cores) << summary;
  }
  const std::string err = knob_error(g, Device::cuda(0), "attention=fast");
  EXPECT_NE(err.find("cuda: knob attention=fast is not auto, direct or simt"), std::string::npos)
      << (err.empty() ? "accepted" : err);
}

// Note [CUDA programmatic launch] in a cross-build (no GPU needed): built for sm_90 with pdl=on,
// every generated kernel's record says "programmatic" and no library call's does; the default
// (off), or sm_80, leaves the key out. In the PTX of every kernel (loop, direct, convolution epilogue) nothing
// reads or writes memory before its griddepcontrol.wait, which is what makes an early start
// safe; sm_80's PTX has no grid dependency control at all. The knob takes on or off only.
TEST(CudaCrossBuild, GeneratedKernelsLaunchProgrammaticallyFromSm90) {
  struct Case {
    const char* model;
    const char* arch;
    const char* knobs;
    bool programmatic;
  };
  for (const Case& c : {Case{"resnet18", "sm_90", "pdl=on", true}, Case{"bert_base", "sm_90", "pdl=on", true},
                        Case{"resnet18", "sm_90", "", false}, Case{"resnet18", "sm_80", "pdl=on", false}}) {
    SCOPED_TRACE(fmt::format("{} {} {}", c.model, c.arch, c.knobs));
    CrossBuilt b = cross_build(c.model, DType::BFloat16, c.knobs, c.arch);
    int kernels = 0, programmatic = 0;
    for (const nlohmann::json& l : b.manifest["launches"]) {
      const nlohmann::json& p = l["params"];
      if (l["kind"] == "cuda_kernel") ++kernels;
      else EXPECT_FALSE(p.contains("programmatic")) << l.dump();
      programmatic += p.value("programmatic", false);
    }
    EXPECT_GT(kernels, 2) << b.summary;
    EXPECT_EQ(programmatic, c.programmatic ? kernels : 0) << b.summary;
    const bool hopper = std::string(c.arch) == "sm_90";
    int entries = 0;
    for (const nlohmann::json& mod : b.manifest["cuda_modules"]) {
      const std::string ptx = b.cuda_kernels.substr(mod["ptx_offset"].get<size_t>(), mod["ptx_size"].get<size_t>());
      if (!hopper) {
        EXPECT_EQ(ptx.find("griddepcontrol"), std::string::npos) << mod["name"];
        continue;
      }
      // Each .entry's instructions, line by line: the first memory access (a load other than
      // of a parameter, a store, an atomic, an asynchronous copy) comes after the wait.
      for (size_t at = ptx.find(".entry "); at != std::string::npos; at = ptx.find(".entry ", at + 1)) {
        ++entries;
        const size_t end = std::min(ptx.find(".entry ", at + 1), ptx.size());
        std::istringstream body(ptx.substr(at, end - at));
        std::string line, first_access;
        bool waited = false;
        while (std::getline(body, line) && first_access.empty()) {
          std::string op = line.substr(std::min(line.find_first_not_of(" \t"), line.size()));
          if (!op.empty() && op[0] == '@') op = op.substr(std::min(op.find(' ') + 1, op.size()));
          if (op.rfind("griddepcontrol.wait", 0) == 0) waited = true;
          const bool access = (op.rfind("ld.", 0) == 0 && op.rfind("ld.param", 0) != 0) ||
                              op.rfind("ldu.", 0) == 0 || op.rfind("st.", 0) == 0 ||
                              op.rfind("atom.", 0) == 0 || op.rfind("red.", 0) == 0 ||
                              op.rfind("cp.async", 0) == 0;
          if (access) first_access = op;
        }
        EXPECT_FALSE(first_access.empty()) << "no memory access found in:\n" << ptx.substr(at, 400);
        EXPECT_TRUE(waited) << "a kernel of module " << mod["name"] << " reaches '" << first_access
                            << "' before griddepcontrol.wait:\n" << ptx.substr(at, 400);
      }
    }
    if (hopper) EXPECT_GE(entries, kernels) << "every launched kernel is an entry of the modules";
  }
  nn::ZooModel m = nn::make_zoo_model("mlp", 1, 7);
  Graph g;
  nn::compile_module_graph(m.module, m.inputs, compiler::Options{}, &g);
  const std::string err = knob_error(g, Device::cuda(0), "pdl=maybe");
  EXPECT_NE(err.find("cuda: knob pdl=maybe is not on or off"), std::string::npos)
      << (err.empty() ? "accepted" : err);
}

// Note [Convolution plans prepared in parallel]: the knob plan_threads takes a thread count from
// 1 to 64 and names itself when it is anything else; a cross-build (which times nothing) takes a
// valid one.
TEST(Package, CudaKnobPlanThreadsIsAThreadCount) {
  nn::ZooModel m = nn::make_zoo_model("mlp", 1, 7);
  Graph g;
  compiler::Options plain;
  nn::compile_module_graph(m.module, m.inputs, plain, &g);
  for (const char* bad : {"plan_threads=0", "plan_threads=65", "plan_threads=four",
                          "plan_threads=4x", "plan_threads=-2"}) {
    const std::string err = knob_error(g, Device::cuda(0), bad);
    EXPECT_NE(err.find(fmt::format("cuda: knob {} is not a thread count (1-64)", bad)),
              std::string::npos)
        << (err.empty() ? "accepted " + std::string(bad) : err);
  }
  for (const char* good : {"plan_threads=1", "plan_threads=64"})
    EXPECT_EQ(knob_error(g, Device::cuda(0), good), "") << good;
}

// ResNet-50 in bfloat16: its classifier (one row, 2048 -> 1000) is a generated GEMV fused with
// the output cast (CudaTarget::policy), so the package has no cuBLASLt call and its load opens
// cuDNN only.
TEST(Package, CudaCrossBuiltResnetClassifierIsAGeneratedGemv) {
  CrossBuilt c = cross_build("resnet50");
  EXPECT_EQ(c.launches["cublaslt"], 0) << c.summary;
  EXPECT_EQ(c.launches["cudnn_conv"], 52) << c.summary;  // 53 convolutions, the stem a direct kernel
  EXPECT_NE(c.summary.find("[reduce]: linear 'layers.cc:53', cast"), std::string::npos) << c.summary;
}

// BERT: q, k and v are one GEMM (passes/merge_linears.h) whose slices attention reads in place,
// so each layer is 4 GEMMs; the package's weights hold the merged projection instead of the
// three. Attention writes [B, S, H, D] (Note [attention writes heads last]), so no copy kernel
// reshapes its output for the output projection. The pooler (one row) is a generated GEMV.
TEST(Package, CudaCrossBuiltBertProjectsQkvInOneGemm) {
  CrossBuilt c = cross_build("bert_base");
  EXPECT_NE(c.summary.find("gemm bfloat16 128x2304x768"), std::string::npos) << c.summary;
  EXPECT_EQ(c.summary.find("split"), std::string::npos) << c.summary;
  EXPECT_EQ(c.summary.find("reshape"), std::string::npos) << c.summary;
  size_t heads_last = 0;
  for (size_t at = c.summary.find("output written heads-last"); at != std::string::npos;
       at = c.summary.find("output written heads-last", at + 1))
    ++heads_last;
  EXPECT_EQ(heads_last, 12u) << c.summary;
  EXPECT_EQ(c.launches["cublaslt"], 12 * 4);  // 4 per layer
}

// ViT: its patch embedding is one GEMM (passes/patch_conv.h: no convolution left), and
// attention reads q, k and v in place from the packed projection (Note [CUDA attention reads
// views]: no split and no copies before it) and writes its output heads-last (Note [attention
// writes heads last]: no copy after it), so each encoder layer is 4 GEMMs, attention, 2
// layer-norm kernels and a GELU.
TEST(Package, CudaCrossBuiltVitHasNoPatchConvolutionAndNoSplit) {
  CrossBuilt c = cross_build("vit_b_16");
  EXPECT_EQ(c.summary.find("conv2d"), std::string::npos) << c.summary;
  EXPECT_EQ(c.summary.find("split"), std::string::npos) << c.summary;
  EXPECT_NE(c.summary.find("gemm bfloat16 196x768x768"), std::string::npos) << c.summary;
  EXPECT_EQ(c.launches["cudnn_conv"], 0);
  EXPECT_EQ(c.launches["cublaslt"], 1 + 12 * 4);  // patches, 4 per layer (the head: a GEMV)
  // 12 layers x (attention, 2 layer norms, GELU) + the patch gather and cast, the class-token
  // concat and the last layer norm, casts at the ends.
  int reshapes = 0;  // kernel lines of the summary with a reshape: the patch gather's only
  for (size_t at = 0, end; at < c.summary.size(); at = end + 1) {
    end = std::min(c.summary.find('\n', at), c.summary.size());
    reshapes += c.summary.substr(at, end - at).find("reshape") != std::string::npos;
  }
  EXPECT_EQ(reshapes, 1) << c.summary;
  EXPECT_LE(c.launches["cuda_kernel"], 12 * 4 + 8) << c.summary;
}

