// CUDA deployment packages (docs/package.md, Note [CUDA launch records] in
// runtime/launch_cuda.cc): zoo models compiled on the GPU, packaged, loaded and run give outputs
// bitwise equal to the in-process compiled run on fresh inputs, in default and reduce-overhead
// (CUDA graph) mode and under bf16 autocast; a package runs in a separate process (the C
// example, linked against the runtime alone) with no compiler or Python on PATH and no cache
// directory; the same model packaged twice gives the same bytes; the status record reports a bad
// index from a loaded package as from the compiled run; manifests edited and re-hashed (another
// architecture, a host launch, a cuBLASLt algorithm or cuDNN engine this machine does not offer)
// are refused by the loader's checks, not by the hash.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "../support/compare.h"
#include "../support/c_run.h"
#include "pick_rows.h"
#include "../support/files.h"
#include "../support/package_edit.h"
#include "../support/process.h"
#include "compiler/compile.h"
#include "compiler/package.h"
#include "compiler/replace_weights.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "ir/graph.h"
#include "nn/models/zoo.h"
#include "nn/package.h"
#include "runtime/package.h"

using namespace kiln;
using json = nlohmann::json;

namespace {

const Device kCuda = Device::cuda(0);

TensorList to_device(const TensorList& in) {
  TensorList out;
  for (const Tensor& t : in) out.push_back(t.to(kCuda));
  return out;
}

void expect_bitwise(const Tensor& got_any, const Tensor& want_any, const std::string& what) {
  Tensor got = got_any.to(Device::cpu()).contiguous(), want = want_any.to(Device::cpu()).contiguous();
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_GT(test::max_abs(want), 0.0) << what << ": an all-zero output proves nothing";
  EXPECT_EQ(test::first_byte_difference(got, want), "") << what;
}

struct Packaged {
  nn::ZooModel model;
  std::shared_ptr<compiler::CompiledExecutable> compiled;
  std::string path;
};

Packaged package_zoo(const std::string& name, const std::string& dir, const std::string& mode,
                     DType precision = DType::Float32) {
  Packaged p{nn::make_zoo_model(name, 1, 7), nullptr, dir + "/" + name + "-" + mode + ".kiln"};
  p.model.module->to(kCuda);
  compiler::Options o;
  o.mode = mode;
  o.precision = precision;
  p.compiled = nn::export_package(p.model.module, to_device(p.model.inputs), o, name, p.path);
  return p;
}

std::string load_error(std::string_view bytes) {
  try {
    load_package_bytes(bytes, "edited.kiln");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The launch records of `kind` in the package's manifest; *version gets its format version.
std::vector<json> launches_of_kind(const std::string& path, const std::string& kind,
                                   uint32_t* version) {
  const json m = json::parse(read_package_sections(path, version)[0].bytes);
  std::vector<json> out;
  for (const json& l : m["launches"])
    if (l["kind"] == kind) out.push_back(l);
  return out;
}

// The package with its manifest edited by `edit` and every hash recomputed, so that only the
// loader's semantic checks stand between the edit and a run.
std::string edited(const std::string& path, const std::function<void(json&)>& edit) {
  uint32_t version = 0;
  std::vector<PackageSection> sections = read_package_sections(path, &version);
  json m = json::parse(sections[0].bytes);
  edit(m);
  sections[0].bytes = m.dump(1);
  return package_container(sections, version);
}

}  // namespace

// ---- zoo models: package == in-process compiled, bitwise ---------------------------------------
struct ZooCase {
  std::string model, mode;
  DType precision = DType::Float32;
};

class CudaPackageZoo : public testing::TestWithParam<ZooCase> {};

TEST_P(CudaPackageZoo, LoadedPackageMatchesCompiledRunBitwise) {
  const ZooCase& c = GetParam();
  test::TempDir dir;
  Packaged p = package_zoo(c.model, dir.path, c.mode, c.precision);
  LoadedPackage loaded = load_package(p.path);
  EXPECT_EQ(loaded.device, "cuda");
  CudaDeviceInfo dev = cuda_device_info(0);
  EXPECT_EQ(loaded.arch, "sm_" + std::to_string(dev.sm_major) + std::to_string(dev.sm_minor));
  EXPECT_EQ(loaded.exe->device(), kCuda);
  EXPECT_EQ(loaded.exe->graph_mode(), c.mode == "reduce-overhead");
  // Note [Graph with copies at prepare]: a graph-mode package's load builds its graph with
  // copies over placeholders; the device calls below repoint them and must be bitwise right.
  // Outputs that are strided views, or empty buffers, never go through it (copies_fit_graph).
  bool graph = c.mode == "reduce-overhead";
  for (const Executable::OutputSpec& o : loaded.exe->outputs)
    graph = graph && o.strides.empty() && numel(o.sizes) > 0;
  for (const Executable::InputSpec& s : loaded.exe->inputs) graph = graph && numel(s.sizes) > 0;
  if (c.mode == "reduce-overhead" && (c.model == "resnet50" || c.model == "bert_base"))
    EXPECT_TRUE(graph) << c.model << ": its outputs are plain buffers";
  EXPECT_EQ(loaded.exe->graphs_with_copies_built(), graph ? 1 : 0);
  for (uint64_t seed : {101u, 202u}) {
    TensorList in = to_device(nn::zoo_example_inputs(c.model, 1, seed));
    TensorList want = p.compiled->run(in);
    TensorList got = loaded.exe->run(in);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      expect_bitwise(got[i], want[i], c.model + " " + c.mode + " output " + std::to_string(i) +
                                          " seed " + std::to_string(seed));
    // Host inputs are copied in by the package as by the compiled run.
    TensorList host_in;
    for (const Tensor& t : in) host_in.push_back(t.to(Device::cpu()));
    TensorList from_host = loaded.exe->run(host_in);
    for (size_t i = 0; i < want.size(); ++i)
      expect_bitwise(from_host[i], want[i], c.model + " from host inputs");
  }
  // Each seed's device call ran through the graph with copies, the host ones the plain way.
  EXPECT_EQ(loaded.exe->calls_with_copies_in_graph(), graph ? 2 : 0);
  std::printf("%s %s %s: package %lld bytes (weights %lld, cubins %lld), %zu launches\n",
              c.model.c_str(), c.mode.c_str(), dtype_name(c.precision),
              (long long)loaded.file_bytes, (long long)loaded.weights_bytes,
              (long long)loaded.kernels_bytes, loaded.exe->launches.size());
}

INSTANTIATE_TEST_SUITE_P(
    Zoo, CudaPackageZoo,
    testing::Values(ZooCase{"mlp", "default"}, ZooCase{"vfe", "default"},
                    ZooCase{"resnet18", "default"}, ZooCase{"resnet18", "reduce-overhead"},
                    ZooCase{"resnet50", "reduce-overhead"}, ZooCase{"vit_b_16", "default"},
                    ZooCase{"bert_base", "reduce-overhead"},
                    ZooCase{"resnet18", "default", DType::BFloat16},
                    ZooCase{"resnet50", "default", DType::BFloat16},
                    ZooCase{"bert_base", "default", DType::BFloat16},
                    ZooCase{"vit_b_16", "reduce-overhead", DType::BFloat16},
                    ZooCase{"branchy_cond", "reduce-overhead"}),
    [](const testing::TestParamInfo<ZooCase>& i) {
      std::string n = i.param.model + "_" + (i.param.mode == "default" ? "default" : "graph");
      if (i.param.precision != DType::Float32) n += std::string("_") + dtype_name(i.param.precision);
      return n;
    });

// ---- determinism ----------------------------------------------------------------------------------
TEST(CudaPackage, SameModelTwiceGivesIdenticalBytes) {
  test::TempDir dir;
  Packaged a = package_zoo("resnet18", dir.path, "default");
  std::string first = test::read_bytes(a.path);
  std::filesystem::rename(a.path, dir.path + "/first.kiln");
  Packaged b = package_zoo("resnet18", dir.path, "default");
  std::string second = test::read_bytes(b.path);
  ASSERT_FALSE(first.empty());
  EXPECT_TRUE(first == second) << "two CUDA packages of resnet18 differ";
}

// Note [cuBLASLt bytes not recorded]: two processes compile resnet18 in float32 (its classifier
// a cuBLASLt GEMM), each with its own empty cache, through the CLI: the packages are the same
// bytes. (cuBLASLt's opaque algorithm holds bytes of uninitialized memory that differ between
// processes; one process reuses the same memory, which is why the test above could not see it.)
TEST(CudaPackage, SameModelInTwoProcessesGivesIdenticalBytes) {
  const char* env_cli = std::getenv("KILN_CLI");
  const std::string cli = env_cli && *env_cli ? env_cli : KILN_CLI;
  ASSERT_TRUE(std::filesystem::exists(cli)) << cli << " (set KILN_CLI)";
  test::TempDir dir;
  std::vector<std::string> env = {"HOME=" + dir.path};
  if (const char* lib = std::getenv("LD_LIBRARY_PATH")) env.push_back(std::string("LD_LIBRARY_PATH=") + lib);
  std::string bytes[2];
  for (int k = 0; k < 2; ++k) {
    const std::string path = dir.path + fmt::format("/r18_{}.kiln", k);
    std::vector<std::string> e = env;
    e.push_back(fmt::format("KILN_CACHE_DIR={}/cache{}", dir.path, k));
    ASSERT_EQ(test::run_with_env({cli, "compile", "resnet18", "--device", "cuda", "-o", path}, e), 0)
        << cli << " compile resnet18 --device cuda failed";
    bytes[k] = test::read_bytes(path);
  }
  ASSERT_FALSE(bytes[0].empty());
  const nlohmann::json m = nlohmann::json::parse(read_package_sections(dir.path + "/r18_0.kiln")[0].bytes);
  int gemms = 0;
  for (const nlohmann::json& l : m["launches"]) gemms += l["kind"] == "cublaslt";
  EXPECT_GE(gemms, 1) << "resnet18 float32 has no cuBLASLt launch: the test checks nothing of it";
  EXPECT_TRUE(bytes[0] == bytes[1]) << "two processes wrote different packages of resnet18";
}

// ---- library kernels timed (Note [CUDA library kernels timed]) -------------------------------------
// kernels=timed picks each convolution's engine and each GEMM's algorithm by timing; the package
// pins those choices, so a loaded package computes bitwise what the compiled run did. The
// choices go to the tuning store: a second compile takes them from there without timing and
// builds the same package bytes (determinism across compiles). Outputs agree with the heuristic's
// choices within bfloat16 rounding.
TEST(CudaPackage, TimedLibraryKernelsArePinnedAndRememberedByTheTuningStore) {
  test::TempDir dir;
  // A tuning store of its own: the suite's shards run as processes side by side, and another
  // one timing resnet18's convolutions (CudaMaxAutotune.*) could store other choices between
  // this test's two compiles (it did once, in a run of the conv tests alone on 8 shards).
  test::TempDir cache("kiln-timed-store");
  test::ScopedEnv env("KILN_CACHE_DIR", cache.path);
  nn::ZooModel m = nn::make_zoo_model("resnet18", 1, 7);
  m.module->to(kCuda);
  TensorList in = to_device(m.inputs);
  compiler::Options o;
  o.precision = DType::BFloat16;
  o.knobs = compiler::parse_knobs("kernels=timed", "test");
  const std::string first_path = dir.path + "/first.kiln", second_path = dir.path + "/second.kiln";
  auto first = nn::export_package(m.module, in, o, "resnet18", first_path);
  const std::string s1 = first->summary();
  // "(timed N engines: ...)" where this compile timed, "(timed earlier: tuning store)" where an
  // earlier run on this machine did.
  auto timed_now = [](const std::string& s) {
    return s.find(" engines: ") != std::string::npos || s.find(" algorithms: ") != std::string::npos;
  };
  EXPECT_TRUE(timed_now(s1) || s1.find("timed earlier") != std::string::npos) << s1;
  auto second = nn::export_package(m.module, in, o, "resnet18", second_path);
  const std::string s2 = second->summary();
  EXPECT_FALSE(timed_now(s2)) << "timed again:\n" << s2;
  EXPECT_NE(s2.find("timed earlier: tuning store"), std::string::npos) << s2;
  EXPECT_TRUE(test::read_bytes(first_path) == test::read_bytes(second_path))
      << "the second compile chose other kernels";
  LoadedPackage loaded = load_package(first_path);
  TensorList want = first->run(in), got = loaded.exe->run(in);
  expect_bitwise(got[0], want[0], "timed resnet18, loaded package");
  compiler::Options h;
  h.precision = DType::BFloat16;
  auto heuristic = nn::export_package(m.module, in, h, "resnet18", dir.path + "/heuristic.kiln");
  Tensor a = want[0].to(Device::cpu()), b = heuristic->run(in)[0].to(Device::cpu());
  ASSERT_TRUE(test::usable_reference(b));
  EXPECT_TRUE(test::close(a, b, test::Tolerance::of_scale(test::max_abs(b), 8.0 / 256)));
}

// Note [Convolution plans prepared in parallel]: the convolutions' plans are built, and under
// kernels=timed their candidates finalized, on several threads before the nodes are planned.
// Timed, each convolution is offered the same engines as when its plans are built one at a time
// (plan_threads=1), in the same order; both compiles, each with an empty cache, time them and
// give packages that compute what the heuristic's choices do within bfloat16 rounding, loaded or
// in process. The default build prepared on threads writes the serial build's package.
TEST(CudaPackage, PlansPreparedOnThreadsAreTheSerialOnes) {
  test::TempDir dir;
  nn::ZooModel m = nn::make_zoo_model("resnet18", 1, 11);
  m.module->to(kCuda);
  TensorList in = to_device(m.inputs);
  // The per-convolution "(timed N engines" counts of a summary, in node order.
  auto engine_counts = [](const std::string& summary) {
    std::vector<int> out;
    const std::string mark = "(timed ";
    for (size_t at = summary.find(mark); at != std::string::npos; at = summary.find(mark, at + 1)) {
      const size_t num = at + mark.size(), end = summary.find(' ', num);
      if (end != std::string::npos && summary.compare(end, 9, " engines:") == 0)
        out.push_back(std::stoi(summary.substr(num, end - num)));
    }
    return out;
  };
  std::vector<int> counts[2];
  std::string paths[2];
  double seconds[2] = {0, 0};
  TensorList outs[2];
  const char* knobs[2] = {"kernels=timed,plan_threads=1", "kernels=timed,plan_threads=8"};
  for (int k = 0; k < 2; ++k) {
    test::TempDir cache("kiln-timed-cache");
    test::ScopedEnv env("KILN_CACHE_DIR", cache.path);
    compiler::Options o;
    o.precision = DType::BFloat16;
    o.knobs = compiler::parse_knobs(knobs[k], "test");
    paths[k] = dir.path + fmt::format("/timed{}.kiln", k);
    const auto t0 = std::chrono::steady_clock::now();
    auto exe = nn::export_package(m.module, in, o, "resnet18", paths[k]);
    seconds[k] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    counts[k] = engine_counts(exe->summary());
    outs[k] = exe->run(in);
    LoadedPackage loaded = load_package(paths[k]);
    expect_bitwise(loaded.exe->run(in)[0], outs[k][0], std::string(knobs[k]) + ", loaded");
  }
  std::printf("resnet18 bf16 kernels=timed: compile %.2f s with plan_threads=1, %.2f s with 8; "
              "%zu convolutions timed\n", seconds[0], seconds[1], counts[0].size());
  ASSERT_GE(counts[0].size(), 5u) << "the serial compile timed too few convolutions";
  EXPECT_EQ(counts[0], counts[1]) << "the convolutions were offered other engines";
  // The default build (the heuristic's engines) prepared on threads: the package holds what the
  // serial build's holds, section by section (the manifest but for the knobs given).
  std::vector<PackageSection> heuristic_sections[2];
  TensorList heuristic_outs[2];
  for (int k = 0; k < 2; ++k) {
    test::TempDir cache("kiln-default-cache");
    test::ScopedEnv env("KILN_CACHE_DIR", cache.path);
    compiler::Options h;
    h.precision = DType::BFloat16;
    h.knobs = compiler::parse_knobs(k == 0 ? "plan_threads=1" : "plan_threads=8", "test");
    const std::string path = dir.path + fmt::format("/heuristic{}.kiln", k);
    auto heuristic = nn::export_package(m.module, in, h, "resnet18", path);
    heuristic_outs[k] = heuristic->run(in);
    heuristic_sections[k] = read_package_sections(path);
  }
  ASSERT_EQ(heuristic_sections[0].size(), heuristic_sections[1].size());
  for (size_t i = 0; i < heuristic_sections[0].size(); ++i) {
    std::string a = heuristic_sections[0][i].bytes, b = heuristic_sections[1][i].bytes;
    if (i == 0) {
      nlohmann::json ma = nlohmann::json::parse(a), mb = nlohmann::json::parse(b);
      EXPECT_NE(ma["knobs"], mb["knobs"]);
      ma.erase("knobs");
      mb.erase("knobs");
      a = ma.dump();
      b = mb.dump();
    }
    EXPECT_TRUE(a == b) << "section " << i << " of the default build differs between plan_threads=1 and 8";
  }
  expect_bitwise(heuristic_outs[1][0], heuristic_outs[0][0], "default build, plan_threads=8 against 1");
  Tensor b = heuristic_outs[0][0].to(Device::cpu());
  ASSERT_TRUE(test::usable_reference(b));
  for (int k = 0; k < 2; ++k)
    EXPECT_TRUE(test::close(outs[k][0].to(Device::cpu()), b,
                            test::Tolerance::of_scale(test::max_abs(b), 8.0 / 256)))
        << knobs[k];
}

// ---- a separate process: the C example, runtime only, bare environment ------------------------
TEST(CudaPackage, RunsInSeparateProcessWithoutCompilerOrCache) {
  const char* c_run = std::getenv("KILN_C_RUN");
  std::string runner = c_run && *c_run ? c_run : KILN_C_RUN;
  ASSERT_TRUE(std::filesystem::exists(runner)) << runner << " (set KILN_C_RUN)";
  test::TempDir dir;
  Packaged p = package_zoo("resnet18", dir.path, "reduce-overhead");
  TensorList in = nn::zoo_example_inputs("resnet18", 1, 303);
  TensorList want = p.compiled->run(to_device(in));
  // Bare environment (test::run_c_example); the library path stays: the GPU machine finds the
  // staged libraries by it.
  std::vector<std::string> env;
  if (const char* lp = std::getenv("LD_LIBRARY_PATH")) env.push_back(std::string("LD_LIBRARY_PATH=") + lp);
  TensorList want_host;
  for (const Tensor& w : want) want_host.push_back(w.to(Device::cpu()));
  test::CRunResult r = test::run_c_example(runner, p.path, in, want_host, dir.path, env);
  ASSERT_EQ(r.status, 0) << "kiln_c_run failed: " << r.status;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(r.outputs[i].defined()) << "kiln_c_run wrote output " << i << " with another size";
    expect_bitwise(r.outputs[i], want[i], "resnet18 output " + std::to_string(i) + " from kiln_c_run");
  }
}

// ---- the status record travels with the package ------------------------------------------------
TEST(CudaPackage, OutOfRangeIndexFromALoadedPackageNamesTheNode) {
  const test::PickRows c = test::pick_rows_case();
  const Graph& g = c.g;
  const Tensor &tx = c.x, &good = c.good, &bad = c.bad;
  test::TempDir dir;
  for (const char* mode : {"default", "reduce-overhead"}) {
    compiler::Options o;
    o.mode = mode;
    auto compiled = compiler::compile(g, kCuda, o);
    std::string path = dir.path + "/pick-" + mode + ".kiln";
    PackageInfo info;
    info.model = "pick";
    compiler::write_package(g, *compiled, o, info, path);
    LoadedPackage loaded = load_package(path);
    ASSERT_GE(loaded.exe->device_status_slot(), 0) << mode;
    for (int round = 0; round < 2; ++round) {
      TensorList want = compiled->run({tx, good});
      TensorList got = loaded.exe->run({tx, good});
      expect_bitwise(got[0], want[0], std::string("pick ") + mode);
      std::string msg;
      try {
        loaded.exe->run({tx, bad});
      } catch (const Error& e) {
        msg = e.what();
        EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
      }
      EXPECT_NE(msg.find(c.expected), std::string::npos) << mode << ": " << msg;
    }
  }
}

// ---- checks at load: edited and re-hashed manifests --------------------------------------------
TEST(CudaPackage, EditedManifestsAreRefusedByTheLoadersChecks) {
  test::TempDir dir;
  Packaged p = package_zoo("resnet18", dir.path, "default");
  ASSERT_EQ(load_error(test::read_bytes(p.path)), "");  // the unedited package loads
  CudaDeviceInfo dev = cuda_device_info(0);
  // A newer architecture than this GPU's (a newer minor, a newer major): neither the cubins nor
  // the PTX run here (Note [PTX in CUDA packages]).
  for (const std::string& arch :
       {fmt::format("sm_{}{}", dev.sm_major, dev.sm_minor + 1),
        fmt::format("sm_{}0", dev.sm_major + 1)}) {
    std::string err = load_error(edited(p.path, [&](json& m) {
      m["target"]["arch"] = arch;
      for (json& mod : m["cuda_modules"]) mod["arch"] = arch;
    }));
    EXPECT_NE(err.find("built for " + arch), std::string::npos) << arch << ": " << err;
    EXPECT_NE(err.find("older architecture"), std::string::npos) << err;
    EXPECT_NE(err.find("Rebuild the package"), std::string::npos) << err;
  }
  // An older major (the GPU is newer than the cubins): the PTX is loaded. Without PTX (a package
  // of a Kiln before PTX) it is refused, saying how to rebuild.
  const std::string older = dev.sm_major >= 9 ? "sm_80" : "sm_70";
  auto as_older = [&](json& m) {
    m["target"]["arch"] = older;
    for (json& mod : m["cuda_modules"]) mod["arch"] = older;
  };
  EXPECT_EQ(load_error(edited(p.path, as_older)), "");
  std::string err = load_error(edited(p.path, [&](json& m) {
    as_older(m);
    for (json& mod : m["cuda_modules"]) {
      mod.erase("ptx_offset");
      mod.erase("ptx_size");
    }
  }));
  EXPECT_NE(err.find("carries no PTX"), std::string::npos) << err;
  EXPECT_NE(err.find("Rebuild the package"), std::string::npos) << err;
  // PTX outside the section, or not ending in its NUL.
  err = load_error(edited(p.path, [](json& m) {
    m["cuda_modules"][0]["ptx_offset"] = int64_t(1) << 40;
  }));
  EXPECT_NE(err.find("ptx_offset and ptx_size lie outside"), std::string::npos) << err;
  err = load_error(edited(p.path, [](json& m) {
    json& mod = m["cuda_modules"][0];
    mod["ptx_size"] = mod["ptx_size"].get<int64_t>() - 1;
  }));
  EXPECT_NE(err.find("not one NUL-terminated text"), std::string::npos) << err;
  {
    test::ScopedEnv code("KILN_PACKAGE_CUDA_CODE", "fatbin");
    err = load_error(test::read_bytes(p.path));
    EXPECT_NE(err.find("KILN_PACKAGE_CUDA_CODE='fatbin'"), std::string::npos) << err;
  }
  // A host launch kind in a CUDA package (its function would get device pointers).
  err = load_error(edited(p.path, [](json& m) { m["launches"][0]["kind"] = "loop"; }));
  EXPECT_NE(err.find("a loop launch in a cuda package"), std::string::npos) << err;
  // A cuBLASLt algorithm and a cuDNN engine this machine does not offer. A format-5 record is
  // matched by its configuration (Note [cuBLASLt algorithm identity]): an unknown one is refused,
  // and its opaque bytes are never used (edited bytes still load, as cuBLASLt's own bytes for
  // the configuration); a record without a configuration (format 4) is matched by its bytes.
  bool gemm = false, conv = false;
  err = load_error(edited(p.path, [&](json& m) {
    for (json& l : m["launches"])
      if (l["kind"] == "cublaslt" && !gemm) {
        EXPECT_TRUE(l["params"].contains("algo_config")) << l.dump();
        l["params"]["algo_config"] = "id9999 tile1 stages1 splitk1 red0 swz0 custom0 inner0 cluster0";
        gemm = true;
      }
  }));
  ASSERT_TRUE(gemm) << "resnet18 has a cuBLASLt launch (its classifier)";
  EXPECT_NE(err.find("does not offer the algorithm the package was built with (id9999"),
            std::string::npos) << err;
  err = load_error(edited(p.path, [&](json& m) {
    for (json& l : m["launches"])
      if (l["kind"] == "cublaslt") l["params"]["algo"][0] = "00000000deadbeef";
  }));
  EXPECT_EQ(err, "") << "the recorded bytes were used";
  err = load_error(edited(p.path, [&](json& m) {
    for (json& l : m["launches"])
      if (l["kind"] == "cublaslt") {
        l["params"].erase("algo_config");
        l["params"]["algo"][0] = "00000000deadbeef";
      }
  }));
  EXPECT_NE(err.find("does not offer the algorithm the package was built with (recorded by its bytes)"),
            std::string::npos) << err;
  err = load_error(edited(p.path, [&](json& m) {
    for (json& l : m["launches"])
      if (l["kind"] == "cudnn_conv" && !conv) {
        l["params"]["engine"] = "no-such-engine";
        conv = true;
      }
  }));
  ASSERT_TRUE(conv);
  EXPECT_NE(err.find("does not offer the engine"), std::string::npos) << err;
  // A kernel argument outside the arena, a module that is not there.
  err = load_error(edited(p.path, [](json& m) {
    for (json& l : m["launches"])
      if (l["kind"] == "cublaslt") l["params"]["d"][1] = int64_t(1) << 40;
  }));
  EXPECT_NE(err.find("lies outside"), std::string::npos) << err;
  err = load_error(edited(p.path, [](json& m) {
    for (json& l : m["launches"])
      if (l["kind"] == "cuda_kernel") l["params"]["module"] = "elsewhere";
  }));
  EXPECT_NE(err.find("no module 'elsewhere'"), std::string::npos) << err;
  // Note [Input staging in the arena]: the input's staging past the arena, or misaligned. A
  // record without it (a package before it) stages the input in a block of its own.
  err = load_error(edited(p.path, [](json& m) {
    EXPECT_TRUE(m["inputs"][0].contains("staging_offset")) << m["inputs"][0].dump();
    m["inputs"][0]["staging_offset"] = m["arena_bytes"].get<int64_t>();
  }));
  EXPECT_NE(err.find("staging_offset"), std::string::npos) << err;
  EXPECT_NE(err.find("outside the"), std::string::npos) << err;
  err = load_error(edited(p.path, [](json& m) { m["inputs"][0]["staging_offset"] = 64; }));
  EXPECT_NE(err.find("not 256-byte aligned"), std::string::npos) << err;
  EXPECT_EQ(load_error(edited(p.path, [](json& m) { m["inputs"][0].erase("staging_offset"); })), "");
}

// Note [Input staging in the arena]: a graph-mode package copies its input into the arena,
// where later values reuse the memory; a package without the offsets (before them) stages in
// a block of its own. Both compute the compiled run's bits, from device and host inputs, call
// after call (each call's copy lands where the previous call's values were).
TEST(CudaPackage, InputsStagedInTheArenaComputeAsInABlockOfTheirOwn) {
  test::TempDir dir;
  Packaged p = package_zoo("resnet18", dir.path, "reduce-overhead");
  LoadedPackage staged = load_package(p.path);
  ASSERT_EQ(staged.exe->inputs.size(), 1u);
  EXPECT_GE(staged.exe->inputs[0].staging_offset, 0);
  std::string bytes = edited(p.path, [](json& m) { m["inputs"][0].erase("staging_offset"); });
  LoadedPackage block = load_package_bytes(bytes, "without-staging-offsets.kiln");
  EXPECT_EQ(block.exe->inputs[0].staging_offset, -1);
  EXPECT_EQ(block.exe->arena_bytes(), staged.exe->arena_bytes());
  for (uint64_t seed : {11u, 12u, 13u}) {
    TensorList in = to_device(nn::zoo_example_inputs("resnet18", 1, seed));
    Tensor want = p.compiled->run(in)[0];
    expect_bitwise(staged.exe->run(in)[0], want, "staged in the arena, seed " + std::to_string(seed));
    expect_bitwise(block.exe->run(in)[0], want, "staging block, seed " + std::to_string(seed));
    expect_bitwise(staged.exe->run({in[0].to(Device::cpu())})[0], want, "staged, host input");
  }
}

// Note [Inputs in a half dtype] (compiler/compile.cc): a bfloat16 resnet18 package built to take
// bfloat16 inputs computes what the float32-input package computes on the rounded input,
// bitwise, in both modes, from device and host inputs; it has one launch fewer (the input's
// conversion) and stages half the bytes.
TEST(CudaPackage, InputsTakenInBFloat16ComputeAsTheRoundedFloat32Input) {
  test::TempDir dir;
  for (const char* mode : {"default", "reduce-overhead"}) {
    nn::ZooModel m = nn::make_zoo_model("resnet18", 2, 7);
    m.module->to(kCuda);
    compiler::Options plain;
    plain.mode = mode;
    plain.precision = DType::BFloat16;
    compiler::Options half = plain;
    half.input_dtype = DType::BFloat16;
    const std::string a = dir.path + "/f32in.kiln", b = dir.path + "/bf16in.kiln";
    nn::export_package(m.module, to_device(m.inputs), plain, "resnet18", a);
    nn::export_package(m.module, to_device(m.inputs), half, "resnet18", b);
    LoadedPackage f = load_package(a), h = load_package(b);
    EXPECT_EQ(h.exe->inputs[0].dtype, DType::BFloat16) << mode;
    EXPECT_EQ(h.exe->launches.size() + 1, f.exe->launches.size()) << mode;
    for (uint64_t seed : {31u, 32u}) {
      Tensor x = nn::zoo_example_inputs("resnet18", 2, seed)[0].to(DType::BFloat16);
      Tensor want = f.exe->run({x.to(DType::Float32).to(kCuda)})[0];
      expect_bitwise(h.exe->run({x.to(kCuda)})[0], want, std::string(mode) + " device input");
      expect_bitwise(h.exe->run({x})[0], want, std::string(mode) + " host input");
    }
  }
}

// cuDNN's fused attention in a package (vit_b_16 in bfloat16: Note [CUDA attention]): the record
// pins the engine; an engine this machine does not offer is refused, as are buffers outside the
// arena.
TEST(CudaPackage, CudnnAttentionEngineIsPinnedAndAnUnknownOneRefused) {
  test::TempDir dir;
  Packaged p = package_zoo("vit_b_16", dir.path, "default", DType::BFloat16);
  ASSERT_EQ(load_error(test::read_bytes(p.path)), "");
  uint32_t version = 0;
  const std::vector<json> sdpa = launches_of_kind(p.path, "cudnn_sdpa", &version);
  for (const json& l : sdpa) {
    EXPECT_FALSE(l["params"]["engine"].get<std::string>().empty());
    // q, k, v read in place from the packed projection [197, 2304] (Note [CUDA attention reads
    // views]): [B, H, S, D] strides, rows 2304 apart.
    EXPECT_EQ(l["params"]["desc"]["q_stride"], json({453888, 64, 2304, 1})) << l.dump();
    EXPECT_EQ(l["params"]["desc"]["v_stride"], json({453888, 64, 2304, 1})) << l.dump();
    // The output written heads-last, [1, 197, 12, 64] (Note [attention writes heads last]).
    EXPECT_EQ(l["params"]["desc"]["o_stride"], json({151296, 64, 768, 1})) << l.dump();
  }
  EXPECT_EQ(sdpa.size(), 12u) << "one fused attention per encoder layer";
  // Format version 9 holds the output strides; labelled 8 (re-hashed), the package is refused as
  // a version-8 runtime, which would ignore them, must refuse it.
  EXPECT_EQ(version, kAttentionOutputFormatVersion);
  std::string old = test::load_error_as_version(test::read_bytes(p.path), kAttentionOutputFormatVersion - 1, "vit");
  EXPECT_NE(old.find("o_stride) is unknown to format version 8"), std::string::npos) << old;
  bool edited_one = false;
  std::string err = load_error(edited(p.path, [&](json& mm) {
    for (json& l : mm["launches"])
      if (l["kind"] == "cudnn_sdpa" && !edited_one) {
        l["params"]["engine"] = "no-such-engine";
        edited_one = true;
      }
  }));
  ASSERT_TRUE(edited_one);
  EXPECT_NE(err.find("does not offer the attention engine"), std::string::npos) << err;
  err = load_error(edited(p.path, [](json& mm) {
    for (json& l : mm["launches"])
      if (l["kind"] == "cudnn_sdpa") l["params"]["o"][1] = int64_t(1) << 40;
  }));
  EXPECT_NE(err.find("lies outside"), std::string::npos) << err;
}

// Note [guarded attention masks]: BERT's padded attention in bfloat16 runs on cuDNN with its
// guarded mask, [1, 1, 128, 128] (mask_batch 1, mask_heads 1), as format version 12; labelled
// 11 (re-hashed) the package is refused, as a version-11 runtime would run the attention
// unmasked. The loaded package gives the in-process executable's bits, also for an all-zero
// attention mask, where every key of every row is -inf in bfloat16 and the reference's output
// is NaN throughout (the guard's case); a live mask gives finite outputs. Edited mask buffers are
// refused.
TEST(CudaPackage, MaskedCudnnAttentionIsVersion12AndRefusedWhenLabelledOlder) {
  test::TempDir dir;
  Packaged p = package_zoo("bert_base", dir.path, "default", DType::BFloat16);
  uint32_t version = 0;
  const std::vector<json> sdpa = launches_of_kind(p.path, "cudnn_sdpa", &version);
  for (const json& l : sdpa) {
    EXPECT_EQ(l["params"]["desc"]["mask"], json({1, 1})) << l.dump();
    EXPECT_TRUE(l["params"].contains("mask")) << l.dump();
  }
  EXPECT_EQ(sdpa.size(), 12u) << "one cuDNN attention per encoder layer";
  EXPECT_EQ(version, kAttentionMaskFormatVersion);
  std::string old = test::load_error_as_version(test::read_bytes(p.path),
                                                kAttentionMaskFormatVersion - 1, "bert");
  EXPECT_NE(old.find("an attention mask is unknown to format version 11"), std::string::npos) << old;
  std::string err = load_error(edited(p.path, [](json& mm) {
    for (json& l : mm["launches"])
      if (l["kind"] == "cudnn_sdpa") l["params"]["mask"][1] = int64_t(1) << 40;
  }));
  EXPECT_NE(err.find("lies outside"), std::string::npos) << err;
  err = load_error(edited(p.path, [](json& mm) {
    for (json& l : mm["launches"])
      if (l["kind"] == "cudnn_sdpa") l["params"].erase("mask");
  }));
  EXPECT_NE(err.find("an attention mask buffer goes with a mask"), std::string::npos) << err;
  LoadedPackage loaded = load_package(p.path);
  TensorList live = p.model.inputs;
  TensorList dead = live;
  dead[1] = Tensor::zeros(live[1].sizes(), live[1].dtype());
  for (const TensorList* in : {&live, &dead}) {
    const bool all_masked = in == &dead;
    TensorList want = p.compiled->run(to_device(*in)), got = loaded.exe->run(to_device(*in));
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      Tensor g = got[i].to(Device::cpu()).to(DType::Float64).contiguous();
      EXPECT_EQ(test::first_byte_difference(got[i].to(Device::cpu()), want[i].to(Device::cpu())), "")
          << "output " << i << (all_masked ? ", all-zero mask" : "");
      int64_t nans = 0;
      for (int64_t x = 0; x < g.numel(); ++x) nans += std::isnan(g.data<double>()[x]);
      EXPECT_EQ(nans, all_masked ? g.numel() : 0) << "output " << i << (all_masked ? ", all-zero mask" : "");
    }
  }
}

// ---- a cross-built package (Note [CUDA cross-builds]) on this GPU -----------------------------
// Built from the host model with --arch set to this GPU's architecture, as a machine without a
// GPU builds it; the loader picks cuBLASLt's and cuDNN's first choices. Not bitwise the package
// compiled here (other library kernels may be picked, the bias runs as its own kernel), so both
// are compared with the model's CPU eager run within float32 rounding, on fresh inputs.
TEST(CudaPackage, CrossBuiltPackageRunsOnThisGpu) {
  CudaDeviceInfo dev = cuda_device_info(0);
  const std::string arch = "sm_" + std::to_string(dev.sm_major) + std::to_string(dev.sm_minor);
  test::TempDir dir;
  for (const char* name : {"resnet18", "bert_base"}) {
    for (const char* mode : {"default", "reduce-overhead"}) {
      const std::string what = std::string(name) + " " + mode;
      TensorList cpu_in = nn::zoo_example_inputs(name, 1, 404);
      nn::ZooModel reference = nn::make_zoo_model(name, 1, 7);
      TensorList ref = reference.module->call(cpu_in);
      Packaged native = package_zoo(name, dir.path, mode);
      TensorList native_out = native.compiled->run(to_device(cpu_in));
      nn::ZooModel host = nn::make_zoo_model(name, 1, 7);
      compiler::Options o;
      o.mode = mode;
      o.arch = arch;
      std::string path = dir.path + "/" + name + "-" + mode + "-cross.kiln";
      nn::export_package(host.module, host.inputs, o, name, path);
      LoadedPackage loaded = load_package(path);
      EXPECT_EQ(loaded.arch, arch);
      TensorList got = loaded.exe->run(to_device(cpu_in));
      ASSERT_EQ(got.size(), ref.size());
      for (size_t i = 0; i < ref.size(); ++i) {
        ASSERT_GT(test::max_abs(ref[i]), 0.0) << what;
        Tensor g = got[i].to(Device::cpu()), n = native_out[i].to(Device::cpu());
        std::printf("%s output %zu: max|ref| %.4g, max|cross| %.4g, max|native| %.4g\n",
                    what.c_str(), i, test::max_abs(ref[i]), test::max_abs(g), test::max_abs(n));
        EXPECT_TRUE(test::close(g, ref[i], test::Tolerance::of_max_ref(1e-4)))
            << what << " output " << i << ": the cross-built package vs CPU eager";
        EXPECT_TRUE(test::close(n, ref[i], test::Tolerance::of_max_ref(1e-4)))
            << what << " output " << i << ": the package compiled here vs CPU eager";
      }
    }
  }
}

// ---- PTX: a package on a GPU newer than its cubins (Note [PTX in CUDA packages]) ----------------
// A cross-build for an older architecture of another major version (sm_80 on this sm_90 GPU:
// its cubins cannot run here) loads its PTX, which the driver compiles for this GPU; the
// library choices are made at load. Checked against the model's CPU eager run within float32
// rounding on fresh inputs. Then packages built here, loaded the same way
// (KILN_PACKAGE_CUDA_CODE=ptx: PTX, and cuBLASLt's and cuDNN's choices made at load, as on a GPU
// of another architecture), against their own cubin runs: vit_b_16 in bfloat16 takes cuDNN's
// attention through that path.
TEST(CudaPackage, PtxRunsOnAGpuNewerThanTheCubins) {
  CudaDeviceInfo dev = cuda_device_info(0);
  const std::string older = dev.sm_major >= 9 ? "sm_80" : "sm_70";
  test::TempDir dir;
  for (const char* name : {"resnet18", "bert_base"}) {
    const std::string what = std::string(name) + " built for " + older;
    TensorList cpu_in = nn::zoo_example_inputs(name, 1, 505);
    nn::ZooModel reference = nn::make_zoo_model(name, 1, 7);
    TensorList ref = reference.module->call(cpu_in);
    nn::ZooModel host = nn::make_zoo_model(name, 1, 7);
    compiler::Options o;
    o.mode = "reduce-overhead";
    o.arch = older;
    std::string path = dir.path + "/" + name + "-" + older + ".kiln";
    nn::export_package(host.module, host.inputs, o, name, path);
    LoadedPackage loaded = load_package(path);
    EXPECT_EQ(loaded.arch, older);
    EXPECT_EQ(loaded.cuda_code, "ptx") << what;
    TensorList got = loaded.exe->run(to_device(cpu_in));
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_GT(test::max_abs(ref[i]), 0.0) << what;
      EXPECT_TRUE(test::close(got[i].to(Device::cpu()), ref[i], test::Tolerance::of_max_ref(1e-4)))
          << what << " output " << i << " vs CPU eager";
    }
  }
  struct Case {
    const char* name;
    const char* mode;
    DType precision;
    double tol;
  };
  for (const Case& c : {Case{"resnet18", "default", DType::Float32, 1e-4},
                        Case{"bert_base", "reduce-overhead", DType::Float32, 1e-4},
                        Case{"vit_b_16", "reduce-overhead", DType::BFloat16, 3e-2}}) {
    const std::string what = std::string(c.name) + " " + c.mode + " " + dtype_name(c.precision);
    Packaged p = package_zoo(c.name, dir.path, c.mode, c.precision);
    LoadedPackage cubin = load_package(p.path);
    EXPECT_EQ(cubin.cuda_code, "cubin") << what;
    test::ScopedEnv code("KILN_PACKAGE_CUDA_CODE", "ptx");
    LoadedPackage ptx = load_package(p.path);
    EXPECT_EQ(ptx.cuda_code, "ptx") << what;
    for (uint64_t seed : {606u, 707u}) {
      TensorList in = to_device(nn::zoo_example_inputs(c.name, 1, seed));
      TensorList want = cubin.exe->run(in), got = ptx.exe->run(in);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        Tensor w = want[i].to(Device::cpu()).to(DType::Float32);
        Tensor g = got[i].to(Device::cpu()).to(DType::Float32);
        ASSERT_GT(test::max_abs(w), 0.0) << what;
        EXPECT_TRUE(test::close(g, w, test::Tolerance::of_max_ref(c.tol)))
            << what << " output " << i << ": PTX vs cubin";
      }
    }
  }
}

// ---- `kiln package --replace-weights` on a package built on this GPU ----------------------------
// The package of weights A given B's state dict is byte for byte the package built here with B
// (its library choices are the heuristic's for the same shapes, which the weights do not
// change), and its loaded run is bitwise the in-process compiled run of B on fresh inputs.
TEST(CudaPackage, ReplacedWeightsGiveThePackageBuiltWithThem) {
  test::TempDir dir;
  struct Case {
    const char* model;
    const char* mode;
    DType precision;
  };
  // resnet18 in bfloat16: its in-process build holds 16 filters KRSC (Note [Filters stored KRSC
  // in process]), which its package must hold as the replaced one does, KCRS.
  for (const Case& c : {Case{"resnet18", "default", DType::Float32},
                        Case{"resnet18", "reduce-overhead", DType::BFloat16},
                        Case{"bert_base", "reduce-overhead", DType::BFloat16}}) {
    const std::string what = std::string(c.model) + " " + c.mode + " " + dtype_name(c.precision);
    auto build = [&](uint64_t seed, const std::string& path) {
      Packaged p{nn::make_zoo_model(c.model, 1, seed), nullptr, path};
      p.model.module->to(kCuda);
      compiler::Options o;
      o.mode = c.mode;
      o.precision = c.precision;
      p.compiled = nn::export_package(p.model.module, to_device(p.model.inputs), o, c.model, path);
      return p;
    };
    const std::string a_path = dir.file("a.kiln"), b_path = dir.file("b.kiln");
    const std::string r_path = dir.file("replaced.kiln"), w_path = dir.file("b.safetensors");
    build(7, a_path);
    Packaged b = build(8, b_path);
    nn::make_zoo_model(c.model, 1, 8).module->save(w_path);  // the state dict, on the host
    compiler::ReplaceWeightsReport rep = compiler::replace_weights(a_path, w_path, r_path);
    std::printf("%s: %s\n", what.c_str(), rep.str().c_str());
    const std::string replaced = test::read_bytes(r_path), want = test::read_bytes(b_path);
    EXPECT_NE(test::read_bytes(a_path), want) << what << ": weights A and B gave one package";
    EXPECT_TRUE(replaced == want) << what << ": the replaced package differs from B's";
    LoadedPackage loaded = load_package(r_path);
    for (uint64_t seed : {808u, 909u}) {
      TensorList in = to_device(nn::zoo_example_inputs(c.model, 1, seed));
      TensorList want_out = b.compiled->run(in), got = loaded.exe->run(in);
      ASSERT_EQ(got.size(), want_out.size());
      for (size_t i = 0; i < got.size(); ++i)
        expect_bitwise(got[i], want_out[i], what + " output " + std::to_string(i));
    }
  }
}
