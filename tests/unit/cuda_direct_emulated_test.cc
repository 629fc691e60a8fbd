// The CUDA direct kernels' numbers without a GPU: the generated kernel source
// (targets/cuda/direct_kernels.h) compiled as host C++ under a small CUDA shim — blocks run one
// after another, a block's 256 threads one after another, or as 256 std::threads meeting at a
// std::barrier for kernels that call __syncthreads (the GEMM) or shuffle within warps (attention)
// — and compared with the op's float64 reference kernel on every sample in every dtype, with the
// op harness's tolerances.
// This checks the kernels' index arithmetic and semantics (pad modes, gather/scatter index
// rules, upsample tables, grid_sample, GEMM tiling and broadcasting, convolutions); it does not
// check the device's float rounding (no FMA here, as the program's --fmad=false) or anything
// about memory ordering on a GPU. The NVRTC compile of the same source is
// cuda_codegen_test.cc's; on the GPU the op harness runs the whole compiled path.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <fstream>

#include <fmt/format.h>

#include "core/error.h"
#include "ir/graph.h"
#include "ops/op.h"
#include "ops/scalar_math_text.h"
#include "targets/cuda/direct_kernels.h"
#include "targets/cuda/emitter.h"

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
static inline void __syncwarp() { kn_bar->arrive_and_wait(); }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
static inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
// A warp shuffle over the block's 256 emulated threads: every thread calls it the same number
// of times (the kernels keep shuffles out of divergent code), so two block barriers order it.
template <typename T>
static inline T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  static T kn_lanes[256];
  kn_lanes[threadIdx.x] = v;
  kn_bar->arrive_and_wait();
  T r = kn_lanes[threadIdx.x ^ unsigned(lane_mask)];
  kn_bar->arrive_and_wait();
  return r;
}
static inline float __int_as_float(int v) { float f; std::memcpy(&f, &v, 4); return f; }
static inline double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, 8); return d; }
#define __noinline__
#define __forceinline__ inline
// mma.sync m16n8k16 (float32 accumulators) over the warp's 32 emulated threads, from the
// fragment layouts of the PTX ISA: A (16x16, row) register x of lane l holds row l/4 (+8 for
// x = 1, 3), columns 2 (l%4) and 2 (l%4) + 1 (+8 for x = 2, 3), the lower column in the low
// half; B (16x8, col) register x holds column l/4, rows 2 (l%4), 2 (l%4) + 1 (+8 for x = 1);
// D element x holds row l/4 (+8 for x = 2, 3), column 2 (l%4) + x%2. Each product is summed in
// double and added once, as the device's float32 accumulate of exact bf16/f16 products.
#define KN_HOST_EMULATION
struct uint4 { unsigned x, y, z, w; };
struct float4 { float x, y, z, w; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
static float kn_bf16_f32(unsigned short h);
static float kn_f16_f32(unsigned short h);
template <bool Bf16>
static inline void kn_mma_emulated(float* d, const unsigned* a, unsigned b0, unsigned b1) {
  static unsigned kn_a[256][4], kn_b[256][2];
  const unsigned t = threadIdx.x;
  for (int x = 0; x < 4; ++x) kn_a[t][x] = a[x];
  kn_b[t][0] = b0;
  kn_b[t][1] = b1;
  kn_bar->arrive_and_wait();
  const unsigned w0 = t & ~31u, lane = t & 31u;
  auto half = [](unsigned v, int k) {
    const unsigned short h = (unsigned short)((k & 1) ? v >> 16 : v & 0xffffu);
    return double(Bf16 ? kn_bf16_f32(h) : kn_f16_f32(h));
  };
  auto A = [&](int r, int k) {
    return half(kn_a[w0 + unsigned((r % 8) * 4 + (k % 8) / 2)][(r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k);
  };
  auto B = [&](int k, int n) { return half(kn_b[w0 + unsigned(n * 4 + (k % 8) / 2)][k >= 8 ? 1 : 0], k); };
  float out[4];
  for (int x = 0; x < 4; ++x) {
    const int r = int(lane / 4) + (x >= 2 ? 8 : 0), n = int(lane % 4) * 2 + (x & 1);
    double sum = 0;
    for (int k = 0; k < 16; ++k) sum += A(r, k) * B(k, n);
    out[x] = float(double(d[x]) + sum);
  }
  kn_bar->arrive_and_wait();
  for (int x = 0; x < 4; ++x) d[x] = out[x];
}
static unsigned short kn_f32_bf16(float f);
static unsigned short kn_f32_f16(float f);
static inline unsigned kn_pack_bf16x2(float lo, float hi) { return unsigned(kn_f32_bf16(lo)) | (unsigned(kn_f32_bf16(hi)) << 16); }
static inline unsigned kn_pack_f16x2(float lo, float hi) { return unsigned(kn_f32_f16(lo)) | (unsigned(kn_f32_f16(hi)) << 16); }
// The device's ex2.approx-based exponential: here the exact one.
static inline float kn_fast_exp(float x) { return std::exp(x); }
static inline void kn_mma_bf16(float* d, const unsigned* a, unsigned b0, unsigned b1) { kn_mma_emulated<true>(d, a, b0, b1); }
static inline void kn_mma_f16(float* d, const unsigned* a, unsigned b0, unsigned b1) { kn_mma_emulated<false>(d, a, b0, b1); }
static inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long cmp, unsigned long long v) {
  __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return cmp;  // the old value
}
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
#include <thread>
#include <vector>
template <typename F>
static void kn_launch(int blocks, int threads, bool sync, F f) {
  gridDim.x = unsigned(blocks);
  blockDim.x = unsigned(threads);
  for (int b = 0; b < blocks; ++b) {
    if (!sync) {
      blockIdx.x = unsigned(b);
      for (unsigned t = 0; t < unsigned(threads); ++t) { threadIdx.x = t; f(); }
      continue;
    }
    std::barrier<> bar(threads);
    kn_bar = &bar;
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < unsigned(threads); ++t)
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

// The kernels as one host library, each with a launcher `<name>_launch(char** args, blocks)`.
struct HostKernels {
  void* lib = nullptr;
  std::string cc, so;
  std::string error;
  HostKernels(const std::vector<const cuda::DirectKernel*>& ks, const std::string& name) {
    std::string src = std::string(kShim) + scalar_math_text() + cuda::cuda_status_prelude();
    for (const cuda::DirectKernel* k : ks) {
      src += k->source;
      size_t nargs = k->arg_inputs.size() + k->arg_outputs.size() + (k->reports ? 1 : 0);
      std::string args;
      for (size_t i = 0; i < nargs; ++i) args += fmt::format("{}a[{}]", i ? ", " : "", i);
      bool sync = k->source.find("__syncthreads") != std::string::npos ||
                  k->source.find("__shfl_xor_sync") != std::string::npos;
      src += fmt::format("extern \"C\" void {0}_launch(char** a, int blocks) {{ kn_launch(blocks, {1}, {2}, [&] {{ {0}({3}); }}); }}\n",
                         k->name, k->threads, sync ? "true" : "false", args);
    }
    std::string base = testing::TempDir() + "kiln_cuda_emulated_" + name + "_" + std::to_string(::getpid());
    cc = base + ".cc";
    so = base + ".so";
    std::ofstream(cc) << src;
    std::string cmd = fmt::format("c++ -std=c++20 -O1 -ffp-contract=off -fPIC -shared -w -o {} {} -lpthread 2> {}.log", so, cc, base);
    if (std::system(cmd.c_str()) != 0) {
      error = "the shimmed kernels do not compile as C++: " + cmd;
      return;
    }
    lib = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) error = dlerror();
  }
  ~HostKernels() {
    if (lib) dlclose(lib);
    std::remove(cc.c_str());
    std::remove(so.c_str());
  }
  // The status record of the last run (Note [Device status]): {code, value}, {0, 0} when the
  // kernel reported nothing.
  mutable long long status[2] = {0, 0};
  // Runs k over the node's inputs; returns its outputs (poisoned first, so that an element the
  // kernel does not write shows up).
  TensorList run(const cuda::DirectKernel& k, const Graph& g, const Node& n, const TensorList& inputs) const {
    auto launch = reinterpret_cast<void (*)(char**, int)>(dlsym(lib, (k.name + "_launch").c_str()));
    KILN_ASSERT(launch != nullptr);
    TensorList outs;
    for (ValueId o : n.outputs) {
      Dims d;
      for (size_t i = 0; i < g.type(o).shape.size(); ++i) d.push_back(g.type(o).shape[i].value());
      outs.push_back(Tensor::empty(d, g.type(o).dtype));
      std::memset(outs.back().raw_data(), 0x7f, size_t(outs.back().numel() * dtype_size(outs.back().dtype())));
    }
    std::vector<char*> argv;
    for (int i : k.arg_inputs) argv.push_back(static_cast<char*>(inputs[size_t(i)].raw_data()));
    for (int o : k.arg_outputs) argv.push_back(static_cast<char*>(outs[size_t(o)].raw_data()));
    status[0] = status[1] = 0;
    if (k.reports) argv.push_back(reinterpret_cast<char*>(status));
    if (k.blocks > 0) launch(argv.data(), int(k.blocks));
    return outs;
  }
};

class CudaDirectEmulated : public testing::TestWithParam<OpId> {};

TEST_P(CudaDirectEmulated, MatchesTheReferenceOnEverySample) {
  const OpDef& op = op_def(GetParam());
  std::vector<Case> cases = make_cases(GetParam());
  ASSERT_GT(cases.size(), 3u);
  std::vector<const cuda::DirectKernel*> ks;
  for (const Case& c : cases) ks.push_back(&c.k);
  HostKernels host(ks, op.name);
  ASSERT_EQ(host.error, "");
  int checked = 0;
  for (Case& c : cases) {
    TensorList outs = host.run(c.k, c.g, c.g.nodes[0], c.inputs);
    EXPECT_EQ(host.status[0], 0) << c.label << ": reported a bad value (" << host.status[1] << ")";
    for (size_t o = 0; o < outs.size(); ++o) {
      std::string diff = compare(c.reference[o], outs[o], c.tol);
      EXPECT_EQ(diff, "") << c.label << " (" << c.k.describe << ")";
    }
    ++checked;
  }
  std::printf("%s: %d cases matched the reference\n", op.name, checked);
}

// Out-of-range indices (the reference raises): the kernel reports the first one it meets
// through the status record — the node's code (index + 1) and the index as given — with the
// reference's message, and never touches memory out of bounds: gather writes NaN for that
// element (0 for integers), scatter_add skips it (Note [CUDA direct kernels]).
TEST(CudaDirectEmulatedIndices, OutOfRangeIndicesAreReportedNeverStrayAccesses) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::Float32, Shape{3, 2}));
  ValueId xi = g.add_input("xi", TensorType(DType::Int32, Shape{3, 2}));
  ValueId idx = g.add_input("idx", TensorType(DType::Int64, Shape{2, 2}));
  ValueId src = g.add_input("src", TensorType(DType::Float32, Shape{2, 2}));
  ValueId ids = g.add_input("ids", TensorType(DType::Int32, Shape{3}));
  g.add_node(OpId::Gather, {x, idx}, {{"dim", int64_t(0)}}, "gather_f32");
  g.add_node(OpId::Gather, {xi, idx}, {{"dim", int64_t(0)}}, "gather_i32");
  g.add_node(OpId::ScatterAdd, {x, idx, src}, {{"dim", int64_t(0)}}, "scatter_f32");
  g.add_node(OpId::Embedding, {x, ids}, {}, "embed");
  std::vector<cuda::DirectKernel> ks;
  for (size_t i = 0; i < g.nodes.size(); ++i) ks.push_back(cuda::plan_direct_kernel(g, g.nodes[i], int32_t(i), 2));
  for (const cuda::DirectKernel& k : ks) EXPECT_TRUE(k.reports) << k.name;
  EXPECT_EQ(ks[0].check_prefix, "gather 'gather_f32': index ");
  EXPECT_EQ(ks[0].check_suffix, " is out of range for dim 0 of x of size 3 (valid range [-3, 2])");
  EXPECT_EQ(ks[3].check_suffix,
            " is out of range for the embedding table (dim 0 of weight) of size 3 (valid range [-3, 2])");
  HostKernels host({&ks[0], &ks[1], &ks[2], &ks[3]}, "bad_index");
  ASSERT_EQ(host.error, "");
  Tensor tx = Tensor::empty(Dims{3, 2}, DType::Float32), ti = Tensor::empty(Dims{3, 2}, DType::Int32);
  for (int i = 0; i < 6; ++i) {
    tx.data<float>()[i] = float(i + 1);
    ti.data<int32_t>()[i] = i + 1;
  }
  // index [[0, 5], [-1, -4]]: column 1 holds 5 and -4, both out of range for size 3
  Tensor tidx = Tensor::empty(Dims{2, 2}, DType::Int64);
  int64_t iv[4] = {0, 5, -1, -4};
  std::memcpy(tidx.raw_data(), iv, sizeof iv);
  Tensor tsrc = Tensor::empty(Dims{2, 2}, DType::Float32);
  for (int i = 0; i < 4; ++i) tsrc.data<float>()[i] = 10.0f * float(i + 1);
  Tensor gf = host.run(ks[0], g, g.nodes[0], {tx, tidx})[0];
  EXPECT_EQ(host.status[0], 1);  // node 0
  EXPECT_EQ(host.status[1], 5);  // the first bad index met (blocks and threads run in order here)
  EXPECT_EQ(gf.data<float>()[0], 1.0f);                 // x[0][0]
  EXPECT_TRUE(std::isnan(gf.data<float>()[1]));         // index 5: nothing read
  EXPECT_EQ(gf.data<float>()[2], 5.0f);                 // x[-1 -> 2][0]
  EXPECT_TRUE(std::isnan(gf.data<float>()[3]));         // index -4
  Tensor gi = host.run(ks[1], g, g.nodes[1], {ti, tidx})[0];
  EXPECT_EQ(host.status[0], 2);
  EXPECT_EQ(gi.data<int32_t>()[0], 1);
  EXPECT_EQ(gi.data<int32_t>()[1], 0);
  EXPECT_EQ(gi.data<int32_t>()[2], 5);
  EXPECT_EQ(gi.data<int32_t>()[3], 0);
  Tensor sf = host.run(ks[2], g, g.nodes[2], {tx, tidx, tsrc})[0];
  EXPECT_EQ(host.status[0], 3);
  EXPECT_EQ(host.status[1], 5);
  // column 0 is right (x + src[0][0] at row 0, + src[1][0] at row 2); column 1's bad indices
  // were skipped
  EXPECT_EQ(sf.data<float>()[0], 11.0f);
  EXPECT_EQ(sf.data<float>()[2], 3.0f);
  EXPECT_EQ(sf.data<float>()[4], 35.0f);
  // embedding: ids {2, -3, 3}: -3 wraps to row 0, 3 is out of range
  Tensor tids = Tensor::empty(Dims{3}, DType::Int32);
  int32_t idv[3] = {2, -3, 3};
  std::memcpy(tids.raw_data(), idv, sizeof idv);
  Tensor ef = host.run(ks[3], g, g.nodes[3], {tx, tids})[0];
  EXPECT_EQ(host.status[0], 4);
  EXPECT_EQ(host.status[1], 3);
  EXPECT_EQ(ef.data<float>()[0], 5.0f);
  EXPECT_EQ(ef.data<float>()[2], 1.0f);
  EXPECT_TRUE(std::isnan(ef.data<float>()[4]));
  // Good indices report nothing.
  int64_t good[4] = {0, 2, -1, 1};
  std::memcpy(tidx.raw_data(), good, sizeof good);
  host.run(ks[0], g, g.nodes[0], {tx, tidx});
  EXPECT_EQ(host.status[0], 0);
}

// A concat of many pieces (above the comparison chain's 12: the binary search over the pieces'
// starts), with empty pieces among them, in several dims, and a split of the result into 8
// pieces (split's sizes are a shape: at most 8); exact against the reference.
TEST(CudaDirectEmulatedPieces, ManyPiecesConcatAndSplitMatchTheReference) {
  Generator gen(11);
  for (int64_t dim : {0, 1, 2}) {
    Graph g;
    std::vector<ValueId> ins;
    TensorList xs;
    Ints sizes;
    for (int i = 0; i < 40; ++i) {
      int64_t ext = i % 7 == 3 ? 0 : 1 + i % 4;  // some empty pieces
      sizes.push_back(ext);
      Dims d{3, 2, 5};
      d[size_t(dim)] = ext;
      xs.push_back(Tensor::randn(d, gen));
      ins.push_back(g.add_input(fmt::format("x{}", i), xs.back().type()));
    }
    g.add_node(OpId::Concat, ins, {{"dim", dim}}, "cat40");
    ValueId cat = g.nodes[0].outputs[0];
    Ints eight(8, 0);
    for (size_t i = 0; i < sizes.size(); ++i) eight[i % 8] += sizes[i];
    g.add_node(OpId::Split, {cat}, {{"sizes", eight}, {"dim", dim}}, "split8");
    cuda::DirectKernel kc = cuda::plan_direct_kernel(g, g.nodes[0], 0, 2);
    cuda::DirectKernel ks = cuda::plan_direct_kernel(g, g.nodes[1], 1, 2);
    EXPECT_NE(kc.source.find("_start["), std::string::npos) << "40 pieces take the binary search";
    HostKernels host({&kc, &ks}, fmt::format("pieces{}", dim));
    ASSERT_EQ(host.error, "");
    Tensor joined = host.run(kc, g, g.nodes[0], xs)[0];
    TensorList xs64;  // the reference computes in float64, as the op harness's oracle
    for (const Tensor& x : xs) xs64.push_back(x.to(DType::Float64));
    Tensor expected = run_reference(op_def(OpId::Concat), g, g.nodes[0], xs64)[0];
    EXPECT_EQ(compare(expected, joined, 0), "") << "concat along dim " << dim;
    TensorList parts = host.run(ks, g, g.nodes[1], {joined});
    TensorList want = run_reference(op_def(OpId::Split), g, g.nodes[1], {joined.to(DType::Float64)});
    ASSERT_EQ(parts.size(), want.size());
    for (size_t i = 0; i < parts.size(); ++i)
      EXPECT_EQ(compare(want[i], parts[i], 0), "") << "split piece " << i << " along dim " << dim;
  }
}

// The flash-style attention kernel (Note [CUDA flash attention]) where the op's samples do not
// reach: rows whose every key is masked (NaN, as the reference: a float mask of -inf and a bool
// mask of false), no keys at all (S = 0: zeros), and head sizes too large to stage in shared
// memory (K and V read from global memory).
TEST(CudaDirectEmulatedAttention, MaskedRowsNoKeysAndLargeHeadsMatchTheReference) {
  Generator gen(23);
  Graph g;
  TensorList ins;
  auto input = [&](const char* name, Tensor t) {
    ins.push_back(t);
    return g.add_input(name, t.type());
  };
  auto randn = [&](Dims d) { return Tensor::randn(d, gen); };
  const double inf = std::numeric_limits<double>::infinity();
  // 1: float mask [3, 70]: row 1 all -inf (70 keys: two key tiles), row 2 -inf in the first tile
  Tensor fmask = randn({3, 70});
  for (int j = 0; j < 70; ++j) {
    fmask.data<float>()[70 + j] = float(-inf);
    if (j < 64) fmask.data<float>()[140 + j] = float(-inf);
  }
  ValueId q1 = input("q1", randn({2, 3, 8})), k1 = input("k1", randn({2, 70, 8}));
  ValueId v1 = input("v1", randn({2, 70, 4})), m1 = input("m1", fmask);
  g.add_node(OpId::ScaledDotProductAttention, {q1, k1, v1, m1}, {{"is_causal", false}}, "float_masked_rows");
  // 2: bool mask [2, 3, 5] with row 0 of batch 1 all false
  Tensor bmask = Tensor::empty(Dims{2, 3, 5}, DType::Bool);
  for (int i = 0; i < 30; ++i) bmask.data<bool>()[i] = (i % 3) != 1;
  for (int j = 0; j < 5; ++j) bmask.data<bool>()[15 + j] = false;
  ValueId q2 = input("q2", randn({2, 3, 4})), k2 = input("k2", randn({2, 5, 4}));
  ValueId v2 = input("v2", randn({2, 5, 6})), m2 = input("m2", bmask);
  g.add_node(OpId::ScaledDotProductAttention, {q2, k2, v2, m2}, {{"is_causal", false}}, "bool_masked_row");
  // 3: no keys
  ValueId q3 = input("q3", randn({2, 3, 4})), k3 = input("k3", randn({2, 0, 4}));
  ValueId v3 = input("v3", randn({2, 0, 5}));
  g.add_node(OpId::ScaledDotProductAttention, {q3, k3, v3}, {{"is_causal", false}}, "no_keys");
  // 4: head size 300 (not staged), causal
  ValueId q4 = input("q4", randn({1, 5, 300})), k4 = input("k4", randn({1, 40, 300}));
  ValueId v4 = input("v4", randn({1, 40, 300}));
  g.add_node(OpId::ScaledDotProductAttention, {q4, k4, v4}, {{"is_causal", true}}, "large_heads");
  std::vector<cuda::DirectKernel> ks;
  for (size_t i = 0; i < g.nodes.size(); ++i) ks.push_back(cuda::plan_direct_kernel(g, g.nodes[i], int32_t(i), 3));
  EXPECT_NE(ks[0].describe.find("in shared memory"), std::string::npos) << ks[0].describe;
  EXPECT_NE(ks[3].describe.find("read from global memory"), std::string::npos) << ks[3].describe;
  HostKernels host({&ks[0], &ks[1], &ks[2], &ks[3]}, "attention");
  ASSERT_EQ(host.error, "");
  const OpDef& op = op_def(OpId::ScaledDotProductAttention);
  size_t at = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    TensorList in(ins.begin() + std::ptrdiff_t(at), ins.begin() + std::ptrdiff_t(at + n.inputs.size()));
    at += n.inputs.size();
    TensorList in64;
    for (const Tensor& t : in) in64.push_back(is_floating(t.dtype()) ? t.to(DType::Float64) : t);
    Tensor want = run_reference(op, g, n, in64)[0];
    Tensor got = host.run(ks[i], g, n, in)[0];
    EXPECT_EQ(compare(want, got, tolerance(DType::Float32, op.tolerance_scale)), "") << n.name;
    const float* o = got.data<float>();
    if (n.name == "float_masked_rows") {
      // [2, 3, 4]: row 1 of each batch NaN, rows 0 and 2 finite
      for (int b = 0; b < 2; ++b)
        for (int e = 0; e < 4; ++e) {
          EXPECT_TRUE(std::isnan(o[b * 12 + 4 + e])) << b << "," << e;
          EXPECT_TRUE(std::isfinite(o[b * 12 + e]) && std::isfinite(o[b * 12 + 8 + e])) << b << "," << e;
        }
    }
    if (n.name == "bool_masked_row") {
      for (int e = 0; e < 6; ++e) EXPECT_TRUE(std::isnan(o[18 + e])) << e;
    }
    if (n.name == "no_keys") {
      for (int64_t e = 0; e < got.numel(); ++e) EXPECT_EQ(o[e], 0.0f) << e;
    }
  }
}

// Note [CUDA attention reads views]: q, k and v as views of one packed [B, S, 3E] projection
// (row stride 3E, batch stride S * 3E, each at its own offset), read in place by the kernel
// planned with their strides; staged (head dim 16) and from global memory (head dim 320).
TEST(CudaDirectEmulatedAttention, PackedProjectionViewsMatchTheReference) {
  Generator gen(31);
  const OpDef& op = op_def(OpId::ScaledDotProductAttention);
  for (int64_t D : {16, 320}) {
    const int64_t B = 2, S = 45, H = 3, E = H * D;
    Tensor packed = Tensor::randn({B, S, 3 * E}, gen);
    const Dims st = {S * 3 * E, D, 3 * E, 1};
    TensorList views;
    Graph g;
    std::vector<ValueId> ids;
    for (int64_t i = 0; i < 3; ++i) {
      views.push_back(packed.as_strided({B, H, S, D}, st, i * E));
      ids.push_back(g.add_input(fmt::format("in{}", i), views.back().contiguous().type()));
    }
    g.add_node(OpId::ScaledDotProductAttention, ids, {{"is_causal", D == 16}}, "packed");
    cuda::DirectKernel k = cuda::plan_direct_kernel(g, g.nodes[0], 0, 3, {st, st, st});
    EXPECT_NE(k.describe.find(D == 16 ? "in shared memory" : "read from global memory"),
              std::string::npos) << k.describe;
    HostKernels host({&k}, fmt::format("attention_views_{}", D));
    ASSERT_EQ(host.error, "");
    TensorList in64;
    for (const Tensor& t : views) in64.push_back(t.to(DType::Float64).contiguous());
    Tensor want = run_reference(op, g, g.nodes[0], in64)[0];
    Tensor got = host.run(k, g, g.nodes[0], views)[0];
    EXPECT_EQ(compare(want, got, tolerance(DType::Float32, op.tolerance_scale)), "") << "head dim " << D;
    // The same kernel planned without the strides reads other elements: the strides matter.
    cuda::DirectKernel plain = cuda::plan_direct_kernel(g, g.nodes[0], 1, 3);
    HostKernels host_plain({&plain}, fmt::format("attention_plain_{}", D));
    ASSERT_EQ(host_plain.error, "");
    EXPECT_NE(compare(want, host_plain.run(plain, g, g.nodes[0], views)[0], tolerance(DType::Float32, op.tolerance_scale)), "");
  }
}

// A grid of fewer blocks than multiprocessors takes fewer rows per warp (max_blocks: 16 per
// multiprocessor, here 132 of them): 4 heads x 64 rows are 32 blocks of 8 rows, not 8 of 32;
// with a float padding mask and in bfloat16, against the reference.
TEST(CudaDirectEmulatedAttention, SmallGridsTakeOneRowPerWarp) {
  Generator gen(37);
  Graph g;
  TensorList in = {Tensor::randn({1, 4, 64, 64}, gen).to(DType::BFloat16),
                   Tensor::randn({1, 4, 64, 64}, gen).to(DType::BFloat16),
                   Tensor::randn({1, 4, 64, 64}, gen).to(DType::BFloat16),
                   Tensor::zeros({1, 1, 1, 64}, DType::Float32)};
  for (int j = 50; j < 64; ++j) in[3].data<float>()[j] = -1e30f;  // padded keys
  in[3] = in[3].to(DType::BFloat16);
  std::vector<ValueId> ids;
  for (size_t i = 0; i < in.size(); ++i) ids.push_back(g.add_input(fmt::format("in{}", i), in[i].type()));
  g.add_node(OpId::ScaledDotProductAttention, ids, {{"is_causal", false}}, "bert_like");
  cuda::DirectKernel k = cuda::plan_direct_kernel(g, g.nodes[0], 0, 132 * 16);
  EXPECT_NE(k.describe.find("8 query rows per block"), std::string::npos) << k.describe;
  EXPECT_EQ(k.blocks, 32) << k.describe;
  HostKernels host({&k}, "attention_small_grid");
  ASSERT_EQ(host.error, "");
  const OpDef& op = op_def(OpId::ScaledDotProductAttention);
  TensorList in64;
  for (const Tensor& t : in) in64.push_back(t.to(DType::Float64));
  Tensor want = run_reference(op, g, g.nodes[0], in64)[0];
  Tensor got = host.run(k, g, g.nodes[0], in)[0];
  EXPECT_EQ(compare(want, got, tolerance(DType::BFloat16, op.tolerance_scale)), "");
}

// Note [CUDA tensor-core attention]: float16 / bfloat16 attention planned for sm_90 runs
// mma.sync m16n8k16 (emulated here from the PTX fragment layouts): a BERT-style float padding
// mask with a batch item whose every key is padded (NaN rows), the same as a bool [B,1,1,S] mask
// (staged per key tile), a causal case whose rows and keys are not multiples of the tiles, a bool
// mask with a dead row, head dims 16 to 128 with EV != E,
// q/k/v views with an odd row stride (two-element reads that are not 4-byte aligned), a
// grid smaller than the tiles, and outputs written heads-last ([B, L, H, Ev]: padded, and causal
// over views) — each against the float64 reference with the dtype's tolerance,
// NaN exactly where the reference has NaN. Planned for sm_75 (or without a compute capability)
// the same nodes take the SIMT kernel.
TEST(CudaDirectEmulatedAttention, TensorCoreKernelMatchesTheReference) {
  struct Case {
    std::string name;
    DType dt;
    Dims q, k, v;
    int mask = 0;  // 1: float [B,1,1,S] padding (batch 1 fully padded); 2: bool [B,1,L,S], row 2
                   // dead; 3: bool [B,1,1,S] padding (batch 1 fully padded)
    bool causal = false;
    int64_t max_blocks = 3;
    int64_t odd_stride = 0;  // > 0: q, k, v are views of one [B, S, 3 H D + 1] tensor, H = this
    bool heads_last = false;  // the output stored [B, L, H, Ev] (Note [attention writes heads last])
  };
  std::vector<Case> cases = {
      {"bert_padding", DType::BFloat16, {2, 3, 40, 64}, {2, 3, 100, 64}, {2, 3, 100, 32}, 1},
      {"causal", DType::Float16, {1, 2, 70, 32}, {1, 2, 70, 32}, {1, 2, 70, 32}, 0, true},
      {"bool_dead_row", DType::BFloat16, {2, 1, 9, 16}, {2, 1, 70, 16}, {2, 1, 70, 8}, 2},
      {"bool_padding", DType::Float16, {2, 2, 20, 32}, {2, 2, 90, 32}, {2, 2, 90, 16}, 3},
      {"head128", DType::Float16, {1, 1, 20, 128}, {1, 1, 33, 128}, {1, 1, 33, 128}},
      {"odd_stride_views", DType::BFloat16, {2, 2, 45, 32}, {2, 2, 45, 32}, {2, 2, 45, 32}, 0, false, 3, 2},
      {"many_blocks", DType::BFloat16, {1, 4, 64, 64}, {1, 4, 64, 64}, {1, 4, 64, 64}, 0, false, 132 * 16},
      {"bert_heads_last", DType::BFloat16, {2, 3, 40, 64}, {2, 3, 100, 64}, {2, 3, 100, 32}, 1, false, 3, 0, true},
      {"causal_heads_last_views", DType::Float16, {2, 2, 45, 32}, {2, 2, 45, 32}, {2, 2, 45, 32}, 0, true, 3, 2, true},
  };
  const OpDef& op = op_def(OpId::ScaledDotProductAttention);
  Generator gen(91);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TensorList in, views;
    std::vector<Dims> strides;
    if (c.odd_stride) {
      const int64_t B = c.q[0], H = c.q[1], S = c.q[2], D = c.q[3], W = 3 * H * D + 1;
      Tensor packed = Tensor::randn({B, S, W}, gen).to(c.dt);
      const Dims st = {S * W, D, W, 1};
      for (int64_t i = 0; i < 3; ++i) views.push_back(packed.as_strided({B, H, S, D}, st, i * H * D + 1));
      strides = {st, st, st};
      in = views;
    } else {
      in = {Tensor::randn(c.q, gen).to(c.dt), Tensor::randn(c.k, gen).to(c.dt), Tensor::randn(c.v, gen).to(c.dt)};
    }
    const int64_t B = c.q[0], L = c.q[2], S = c.k[2];
    if (c.mask == 1) {
      Tensor m = Tensor::empty(Dims{B, 1, 1, S}, DType::Float32);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < S; ++j) m.data<float>()[b * S + j] = b == 1 || j >= S - 30 ? -INFINITY : 0.0f;
      in.push_back(m.to(c.dt));
    } else if (c.mask == 2) {
      Tensor m = Tensor::empty(Dims{B, 1, L, S}, DType::Bool);
      for (int64_t x = 0; x < m.numel(); ++x) m.data<bool>()[x] = gen.uniform() < 0.5;
      for (int64_t j = 0; j < S; ++j) m.data<bool>()[2 * S + j] = false;
      in.push_back(m);
    } else if (c.mask == 3) {
      Tensor m = Tensor::empty(Dims{B, 1, 1, S}, DType::Bool);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < S; ++j) m.data<bool>()[b * S + j] = b == 0 && j < S - 25;
      in.push_back(m);
    }
    Graph g;
    std::vector<ValueId> ids;
    for (size_t i = 0; i < in.size(); ++i)
      ids.push_back(g.add_input(fmt::format("in{}", i), in[i].contiguous().type()));
    g.add_node(OpId::ScaledDotProductAttention, ids, {{"is_causal", c.causal}, {"heads_last", c.heads_last}}, c.name);
    cuda::DirectKernel k = cuda::plan_direct_kernel(g, g.nodes[0], 0, c.max_blocks, strides, 90);
    EXPECT_EQ(k.describe.find("heads-last") != std::string::npos, c.heads_last) << k.describe;
    EXPECT_NE(k.describe.find("tensor cores"), std::string::npos) << k.describe;
    for (int cc : {0, 75}) {
      cuda::DirectKernel simt = cuda::plan_direct_kernel(g, g.nodes[0], 1, c.max_blocks, strides, cc);
      EXPECT_EQ(simt.describe.find("tensor cores"), std::string::npos) << cc << ": " << simt.describe;
    }
    HostKernels host({&k}, "attention_mma_" + c.name);
    ASSERT_EQ(host.error, "");
    TensorList in64;
    for (const Tensor& t : in) in64.push_back(is_floating(t.dtype()) ? t.to(DType::Float64).contiguous() : t);
    Tensor want = run_reference(op, g, g.nodes[0], in64)[0];
    Tensor got = host.run(k, g, g.nodes[0], in)[0];
    EXPECT_EQ(compare(want, got, tolerance(c.dt, op.tolerance_scale)), "") << k.describe;
    // The NaN rows are there (compare checks they are where the reference's are).
    const Tensor w = want.contiguous();
    int64_t nan_rows = 0;
    for (int64_t x = 0; x < w.numel(); x += c.v.back()) nan_rows += std::isnan(w.data<double>()[x]);
    const int64_t want_nan_rows = c.mask == 1 || c.mask == 3 ? c.q[1] * L : c.mask == 2 ? 1 : 0;
    EXPECT_EQ(nan_rows, want_nan_rows);
  }
}

// Note [CUDA small-channel convolutions]: conv2d and fused_conv2d with 1-4 input channels, in
// the three library dtypes: the vfe / ResNet stem (7x7 stride 2 pad 3, 2x2 tiles of 16x32
// pixels, the last row and column partial, borders zero-filled), output channels that are not a multiple of the 16 per block
// (a partial chunk), no bias, a residual at scale 1 and 0.5, relu and none, dilation, batch 2,
// asymmetric strides, and NaN and infinite inputs (which must reach the outputs as the
// reference's do). Each against the float64 reference with the dtype's tolerance.
TEST(CudaDirectEmulatedConv, SmallChannelConvolutionsMatchTheReference) {
  struct Conv {
    const char* name;
    Dims x, w;
    Ints stride, padding, dilation;
    bool bias, residual;
    const char* act;  // nullptr: conv2d; else fused_conv2d's activation
    double sum_scale;
    bool poison;      // NaN and inf in the input
  };
  const Conv convs[] = {
      {"stem", {1, 3, 37, 75}, {20, 3, 7, 7}, {2, 2}, {3, 3}, {1, 1}, true, false, "relu", 1.0, false},
      {"conv_plain", {2, 1, 19, 18}, {5, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, false, false, nullptr, 1.0, false},
      {"conv_bias_dilated", {1, 4, 21, 23}, {17, 4, 3, 3}, {1, 2}, {2, 2}, {2, 2}, true, false, nullptr, 1.0, false},
      {"residual_relu", {2, 2, 17, 16}, {16, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, true, true, "relu", 1.0, false},
      {"half_residual_none", {1, 3, 12, 33}, {8, 3, 5, 5}, {2, 3}, {2, 1}, {1, 1}, false, true, "none", 0.5, false},
      {"poisoned", {1, 3, 20, 20}, {6, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, true, false, "relu", 1.0, true},
  };
  Generator gen(41);
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    Graph g;
    std::vector<TensorList> node_inputs;
    for (const Conv& c : convs) {
      Tensor x = Tensor::randn(c.x, gen), w = Tensor::randn(c.w, gen);
      if (c.poison) {
        x.data<float>()[25] = std::numeric_limits<float>::quiet_NaN();
        x.data<float>()[400 + 77] = std::numeric_limits<float>::infinity();
      }
      TensorList in = {x.to(dt), w.to(dt)};
      std::vector<ValueId> ids = {g.add_input(std::string(c.name) + "_x", in[0].type()),
                                  g.add_input(std::string(c.name) + "_w", in[1].type())};
      const int64_t oc = c.w[0];
      const int64_t oh = (c.x[2] + 2 * c.padding[0] - c.dilation[0] * (c.w[2] - 1) - 1) / c.stride[0] + 1;
      const int64_t ow = (c.x[3] + 2 * c.padding[1] - c.dilation[1] * (c.w[3] - 1) - 1) / c.stride[1] + 1;
      {  // the bias slot, absent or not (the reference reads it by position)
        Tensor b = c.bias ? Tensor::randn({oc}, gen).to(dt) : Tensor();
        in.push_back(b);
        ids.push_back(c.bias ? g.add_input(std::string(c.name) + "_b", b.type()) : kNoValue);
      }
      if (c.residual) {
        Tensor r = Tensor::randn({c.x[0], oc, oh, ow}, gen).to(dt);
        in.push_back(r);
        ids.push_back(g.add_input(std::string(c.name) + "_r", r.type()));
      }
      Attrs a{{"stride", c.stride}, {"padding", c.padding}, {"dilation", c.dilation}, {"groups", int64_t(1)}};
      if (c.act) {
        a.set("activation", std::string(c.act));
        a.set("sum_scale", c.sum_scale);
      }
      g.add_node(c.act ? OpId::FusedConv2d : OpId::Conv2d, ids, a, c.name);
      node_inputs.push_back(in);
    }
    std::vector<cuda::DirectKernel> ks;
    std::vector<const cuda::DirectKernel*> kp;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      ASSERT_TRUE(cuda::small_channel_conv(g, g.nodes[i])) << g.nodes[i].name;
      ks.push_back(cuda::plan_direct_kernel(g, g.nodes[i], int32_t(i), 5));
    }
    for (const cuda::DirectKernel& k : ks) {
      EXPECT_NE(k.describe.find("small-channel direct kernel"), std::string::npos) << k.describe;
      kp.push_back(&k);
    }
    HostKernels host(kp, std::string("small_conv_") + dtype_name(dt));
    ASSERT_EQ(host.error, "");
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& n = g.nodes[i];
      const OpDef& op = op_def(n.op);
      TensorList in64;
      for (const Tensor& t : node_inputs[i]) in64.push_back(t.defined() ? t.to(DType::Float64) : t);
      Tensor want = run_reference(op, g, n, in64)[0];
      Tensor got = host.run(ks[i], g, n, node_inputs[i])[0];
      EXPECT_EQ(compare(want, got, tolerance(dt, op.tolerance_scale)), "") << n.name << " " << dtype_name(dt);
      if (std::string(n.name) == "poisoned") {  // the poison reached some outputs, not all
        Tensor w64 = want.contiguous();
        int64_t nonfinite = 0;
        for (int64_t e = 0; e < w64.numel(); ++e) nonfinite += !std::isfinite(w64.data<double>()[e]);
        EXPECT_GT(nonfinite, 0);
        EXPECT_LT(nonfinite, w64.numel());
      }
    }
  }
}

// Where the kernel does not apply, small_channel_conv says so and plan_direct_kernel keeps the
// one-thread-per-output kernel (conv2d) or refuses (fused_conv2d): 5 input channels, groups 2,
// a GELU epilogue, float64, a convolution over 2^28 multiply-adds.
TEST(CudaDirectEmulatedConv, SmallChannelKernelOnlyWhereItApplies) {
  auto node = [](Graph& g, Dims x, Dims w, DType dt, int64_t groups, const char* act, int64_t stride = 1) {
    ValueId xi = g.add_input("x" + std::to_string(g.nodes.size()), TensorType(dt, to_shape(x)));
    ValueId wi = g.add_input("w" + std::to_string(g.nodes.size()), TensorType(dt, to_shape(w)));
    const int64_t pad = stride == 2 ? 3 : 1;
    Attrs a{{"stride", Ints{stride, stride}}, {"padding", Ints{pad, pad}}, {"dilation", Ints{1, 1}}, {"groups", groups}};
    if (act) a.set("activation", std::string(act)), a.set("sum_scale", 1.0);
    g.add_node(act ? OpId::FusedConv2d : OpId::Conv2d, {xi, wi}, a, "c" + std::to_string(g.nodes.size()));
    return g.nodes.size() - 1;
  };
  Graph g;
  const size_t five = node(g, {1, 5, 8, 8}, {4, 5, 3, 3}, DType::Float32, 1, nullptr);
  const size_t grouped = node(g, {1, 4, 8, 8}, {4, 2, 3, 3}, DType::Float32, 2, nullptr);
  const size_t gelu = node(g, {1, 3, 8, 8}, {4, 3, 3, 3}, DType::Float32, 1, "gelu");
  const size_t f64 = node(g, {1, 3, 8, 8}, {4, 3, 3, 3}, DType::Float64, 1, nullptr);
  // ResNet-50's stem (7x7 stride 2): 118M multiply-adds at batch 1, 3.8G at batch 32.
  const size_t big = node(g, {32, 3, 224, 224}, {64, 3, 7, 7}, DType::BFloat16, 1, "relu", 2);
  const size_t small = node(g, {1, 3, 224, 224}, {64, 3, 7, 7}, DType::BFloat16, 1, "relu", 2);
  for (size_t i : {five, grouped, gelu, f64, big}) EXPECT_FALSE(cuda::small_channel_conv(g, g.nodes[i])) << i;
  EXPECT_TRUE(cuda::small_channel_conv(g, g.nodes[small]));
  EXPECT_EQ(cuda::plan_direct_kernel(g, g.nodes[five], int32_t(five), 5).describe.find("small-channel"), std::string::npos);
  EXPECT_NE(cuda::plan_direct_kernel(g, g.nodes[five], int32_t(five), 5).describe.find("conv2d direct kernel"), std::string::npos);
  EXPECT_THROW(cuda::plan_direct_kernel(g, g.nodes[gelu], int32_t(gelu), 5), Error);
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaDirectEmulated,
                         testing::Values(OpId::Pad, OpId::Gather, OpId::ScatterAdd, OpId::Upsample,
                                         OpId::GridSample, OpId::AdaptiveAvgPool2d, OpId::Matmul,
                                         OpId::Linear, OpId::Conv2d, OpId::ConvTranspose2d,
                                         OpId::MaxPool2d, OpId::AvgPool2d, OpId::Embedding,
                                         OpId::IndexSelect, OpId::Concat, OpId::Split,
                                         OpId::ScaledDotProductAttention),
                         [](const testing::TestParamInfo<OpId>& i) { return std::string(op_def(i.param).name); });

}  // namespace
