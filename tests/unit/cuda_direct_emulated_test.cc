// The CUDA direct kernels' numbers without a GPU: the generated kernel source
// (targets/cuda/direct_kernels.h) compiled as host C++ under a small CUDA shim — blocks run one
// after another, a block's 256 threads one after another, or as 256 std::threads meeting at a
// std::barrier for kernels that call __syncthreads (the GEMM) — and compared with the op's
// float64 reference kernel on every sample in every dtype, with the op harness's tolerances.
// This checks the kernels' index arithmetic and semantics (pad modes, gather/scatter index
// rules, upsample tables, grid_sample, GEMM tiling and broadcasting, convolutions); it does not
// check the device's float rounding (no FMA here, as the program's --fmad=false) or anything
// about memory ordering on a GPU. The NVRTC compile of the same source is
// cuda_codegen_test.cc's; on the GPU the op harness runs the whole compiled path.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>

#include <fmt/format.h>

#include "ir/graph.h"
#include "ops/op.h"
#include "ops/scalar_math_text.h"
#include "targets/cuda/direct_kernels.h"

using namespace kiln;

namespace {

const char* const kShim = R"SHIM(// CUDA shim for host emulation of Kiln's direct kernels.
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <math.h>
struct kn_dim3 { unsigned x = 0, y = 0, z = 0; };
static thread_local kn_dim3 threadIdx, blockIdx;
static kn_dim3 blockDim{256, 1, 1}, gridDim{1, 1, 1};
static std::barrier<>* kn_bar = nullptr;
#define __global__
#define __device__
#define __shared__ static
#define __launch_bounds__(n)
static inline void __syncthreads() { kn_bar->arrive_and_wait(); }
static inline float __int_as_float(int v) { float f; std::memcpy(&f, &v, 4); return f; }
static inline double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, 8); return d; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
#include <thread>
#include <vector>
template <typename F>
static void kn_launch(int blocks, bool sync, F f) {
  gridDim.x = unsigned(blocks);
  for (int b = 0; b < blocks; ++b) {
    if (!sync) {
      blockIdx.x = unsigned(b);
      for (unsigned t = 0; t < 256; ++t) { threadIdx.x = t; f(); }
      continue;
    }
    std::barrier<> bar(256);
    kn_bar = &bar;
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < 256; ++t)
      ts.emplace_back([&, t, b] { threadIdx.x = t; blockIdx.x = unsigned(b); f(); });
    for (auto& th : ts) th.join();
  }
}
)SHIM";

struct Case {
  std::string label;
  Graph g;  // one node
  cuda::DirectKernel k;
  TensorList inputs;     // in the tested dtype, contiguous
  TensorList reference;  // the reference kernel's outputs (float64 for floating dtypes)
  double tol = 0;        // 0: exact
};

double tolerance(DType d, double scale) {
  switch (d) {
    case DType::Float64: return 1e-10 * scale;
    case DType::Float32: return 1e-5 * scale;
    case DType::Float16: return 1e-2 * scale;
    case DType::BFloat16: return 2e-2 * scale;
    default: return 0;
  }
}

TensorList run_reference(const OpDef& op, const Graph& g, const Node& n, const TensorList& in) {
  TensorList outs;
  std::vector<TensorType> types;
  for (ValueId o : n.outputs) {
    TensorType t = g.type(o);
    Dims d;
    for (size_t i = 0; i < t.shape.size(); ++i) d.push_back(t.shape[i].value());
    if (is_floating(t.dtype)) t.dtype = DType::Float64;
    outs.push_back(Tensor::empty(d, t.dtype));
    types.push_back(t);
  }
  KernelContext ctx{op, std::span<const Tensor>(in), std::span<Tensor>(outs), n.attrs,
                    std::span<const TensorType>(types)};
  op.reference(ctx);
  return outs;
}

std::vector<Case> make_cases(OpId id) {
  const OpDef& op = op_def(id);
  Generator gen(5);
  std::vector<OpSample> samples = op.samples(gen);
  std::vector<Case> cases;
  for (DType d : op.dtypes)
    for (size_t i = 0; i < samples.size(); ++i) {
      Case c;
      c.label = fmt::format("{} {} sample {} \"{}\"", op.name, dtype_name(d), i, samples[i].note);
      TensorList oracle_in;
      std::vector<ValueId> ids;
      bool ok = true;
      for (const Tensor& t : samples[i].inputs) {
        if (!t.defined()) {
          ids.push_back(kNoValue);
          c.inputs.push_back(Tensor());
          oracle_in.push_back(Tensor());
          continue;
        }
        Tensor x = t.contiguous();
        if (is_floating(x.dtype()) && !is_floating(d)) {
          // integer test dtypes: spread the normal samples over a few integers (wrapping
          // products included for int8/uint8)
          x = x.to(DType::Float64).contiguous();
          Tensor y = Tensor::empty(x.sizes(), DType::Float64);
          for (int64_t j = 0; j < x.numel(); ++j) y.data<double>()[j] = std::round(x.data<double>()[j] * 40);
          x = y;
        }
        if (is_floating(x.dtype())) x = x.to(d).contiguous();
        c.inputs.push_back(x);
        oracle_in.push_back(is_floating(x.dtype()) && op.supports_dtype(DType::Float64) ? x.to(DType::Float64) : x);
        ids.push_back(c.g.add_input("", x.type()));
      }
      try {
        c.g.add_node(id, ids, samples[i].attrs, c.label);
        c.reference = run_reference(op, c.g, c.g.nodes[0], oracle_in);
      } catch (const Error&) {
        ok = false;  // a sample this dtype does not take, or one the reference rejects
      }
      if (!ok) continue;
      c.k = cuda::plan_direct_kernel(c.g, c.g.nodes[0], int32_t(cases.size()), 3);
      c.tol = tolerance(d, op.tolerance_scale);
      cases.push_back(std::move(c));
    }
  return cases;
}

// Elementwise: NaN where the reference has NaN, else within tol (exact when tol is 0).
std::string compare(const Tensor& expected, const Tensor& actual, double tol) {
  Tensor e = expected.to(DType::Float64).contiguous(), a = actual.to(DType::Float64).contiguous();
  if (e.numel() != a.numel()) return "sizes differ";
  const double* ep = e.data<double>();
  const double* ap = a.data<double>();
  for (int64_t i = 0; i < e.numel(); ++i) {
    double x = ep[i], y = ap[i];
    if (std::isnan(x) || std::isnan(y)) {
      if (std::isnan(x) != std::isnan(y)) return fmt::format("element {}: expected {}, got {}", i, x, y);
      continue;
    }
    if (std::isinf(x) || std::isinf(y)) {
      if (x != y) return fmt::format("element {}: expected {}, got {}", i, x, y);
      continue;
    }
    if (std::fabs(x - y) > tol + tol * std::fabs(x))
      return fmt::format("element {}: expected {}, got {} (tolerance {})", i, x, y, tol);
  }
  return "";
}

class CudaDirectEmulated : public testing::TestWithParam<OpId> {};

TEST_P(CudaDirectEmulated, MatchesTheReferenceOnEverySample) {
  const OpDef& op = op_def(GetParam());
  std::vector<Case> cases = make_cases(GetParam());
  ASSERT_GT(cases.size(), 3u);
  // One host library of the op's kernels, each with a launcher taking its pointer arguments.
  std::string src = std::string(kShim) + scalar_math_text();
  for (const Case& c : cases) {
    src += c.k.source;
    size_t nargs = c.k.arg_inputs.size() + c.k.arg_outputs.size();
    std::string args;
    for (size_t i = 0; i < nargs; ++i) args += fmt::format("{}a[{}]", i ? ", " : "", i);
    bool sync = c.k.source.find("__syncthreads") != std::string::npos;
    src += fmt::format("extern \"C\" void {0}_launch(char** a, int blocks) {{ kn_launch(blocks, {1}, [&] {{ {0}({2}); }}); }}\n",
                       c.k.name, sync ? "true" : "false", args);
  }
  std::string dir = testing::TempDir() + "kiln_cuda_emulated_" + op.name + "_" + std::to_string(::getpid());
  std::string cc = dir + ".cc", so = dir + ".so";
  std::ofstream(cc) << src;
  std::string cmd = fmt::format("c++ -std=c++20 -O1 -ffp-contract=off -fPIC -shared -w -o {} {} -lpthread 2> {}.log", so, cc, dir);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "the shimmed kernels do not compile as C++: " << cmd;
  void* lib = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  int checked = 0;
  for (Case& c : cases) {
    auto launch = reinterpret_cast<void (*)(char**, int)>(dlsym(lib, (c.k.name + "_launch").c_str()));
    ASSERT_NE(launch, nullptr) << c.k.name;
    const Node& n = c.g.nodes[0];
    TensorList outs;
    for (ValueId o : n.outputs) {
      Dims d;
      for (size_t i = 0; i < c.g.type(o).shape.size(); ++i) d.push_back(c.g.type(o).shape[i].value());
      outs.push_back(Tensor::empty(d, c.g.type(o).dtype));
      // a poisoned output: every element the kernel must write but does not shows up
      std::memset(outs.back().raw_data(), 0x7f, size_t(outs.back().numel() * dtype_size(outs.back().dtype())));
    }
    std::vector<char*> argv;
    for (int i : c.k.arg_inputs) argv.push_back(static_cast<char*>(c.inputs[size_t(i)].raw_data()));
    for (int o : c.k.arg_outputs) argv.push_back(static_cast<char*>(outs[size_t(o)].raw_data()));
    if (c.k.blocks > 0) launch(argv.data(), int(c.k.blocks));
    for (size_t o = 0; o < outs.size(); ++o) {
      std::string diff = compare(c.reference[o], outs[o], c.tol);
      EXPECT_EQ(diff, "") << c.label << " (" << c.k.describe << ")";
    }
    ++checked;
  }
  dlclose(lib);
  std::remove(cc.c_str());
  std::remove(so.c_str());
  std::printf("%s: %d cases matched the reference\n", op.name, checked);
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaDirectEmulated,
                         testing::Values(OpId::Pad, OpId::Gather, OpId::ScatterAdd, OpId::Upsample,
                                         OpId::GridSample, OpId::AdaptiveAvgPool2d, OpId::Matmul,
                                         OpId::Linear, OpId::Conv2d, OpId::ConvTranspose2d,
                                         OpId::MaxPool2d, OpId::AvgPool2d, OpId::Embedding,
                                         OpId::IndexSelect),
                         [](const testing::TestParamInfo<OpId>& i) { return std::string(op_def(i.param).name); });

}  // namespace
