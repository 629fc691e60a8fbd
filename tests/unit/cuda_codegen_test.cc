// The CUDA target's emitter without a GPU: every zoo model's graph goes through the compiler's
// phases for the CUDA target up to code generation (library nodes scheduled as extern steps,
// memory planned), and the generated CUDA C program must compile with NVRTC for sm_90 — so a
// syntax or type error in generated code fails here, in CI, not on the GPU machine. The numbers
// are checked on the GPU (tests/cuda/compiled_cuda_test.cc).
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <memory>

#include <fmt/format.h>

#include "capture/compile.h"
#include "compiler/backend.h"
#include "compiler/choose_kernels.h"
#include "compiler/insert_copies.h"
#include "compiler/target.h"
#include "ir/interpreter.h"
#include "lower/memory_planner.h"
#include "lower/scheduler.h"
#include "nn/compile.h"
#include "nn/models/zoo.h"
#include "ops/op.h"
#include "passes/pipeline.h"
#include "targets/cuda/direct_kernels.h"
#include "targets/cuda/emitter.h"
#include "targets/cuda/nvrtc.h"
#include "../support/captured_graphs.h"
#include "../support/compare.h"

using namespace kiln;

namespace {

std::vector<Graph> capture_graphs(const std::string& model) {
  nn::ZooModel m = nn::make_zoo_model(model, 1, 3);
  return test::capture_graphs(m.module, m.inputs);
}

struct Emitted {
  cuda::CudaProgram program;
  Graph graph;                        // after the compiler's passes
  std::vector<compiler::MemRef> mem;  // per value of `graph`
  int64_t arena_bytes = 0;
};

// The compiler's phases for `target` up to emission, with the library nodes as extern steps
// and every value in slot 0 (inputs and constants in slots of their own).
Emitted emit_all(Graph g, const compiler::Target& target, cuda::CudaCodegenOptions co = {}) {
  std::vector<std::unique_ptr<Pass>> pipeline = compiler_pipeline(target.decompositions());
  std::vector<Pass*> passes;
  for (auto& p : pipeline) passes.push_back(p.get());
  run_passes(g, std::span<Pass* const>(passes));
  compiler::KernelChoice choice = compiler::choose_kernels(g, target, target.policy({}));
  compiler::CopiedGraph copied = compiler::insert_copies(g, choice, target);
  lower::ScheduleOptions so;
  so.extern_nodes = choice.library;
  so.gemv_nodes = choice.gemv;
  so.generated_nodes = choice.generated;
  lower::Schedule s = lower::schedule(g, copied.view_is_copy, so);
  PlanOptions po;
  po.node_step = s.node_step;
  po.unstored = s.unstored;
  po.in_place_nodes = lower::in_place_safe_nodes(g, s);
  MemoryPlan plan = plan_memory(g, po);
  std::vector<compiler::MemRef> mem(g.values.size());
  int slot = 1;
  for (ValueId v : g.inputs) mem[size_t(v)] = {slot++, 0};
  for (size_t v = 0; v < g.values.size(); ++v) {
    const Value& val = g.values[v];
    if (val.kind == ValueKind::Param || val.kind == ValueKind::Const) mem[v] = {slot++, 0};
    if (val.kind == ValueKind::NodeOutput && plan.values[v].buffer >= 0 && !s.virtual_view[v])
      mem[v] = {0, plan.values[v].offset};
  }
  for (size_t v = 0; v < g.values.size(); ++v)
    if (s.virtual_view[v]) mem[v] = mem[size_t(s.views[v].base)];
  Emitted e;
  co.status_slot = slot;  // as compiler::assign_memory: the slot after the constants
  e.program = cuda::generate_cuda(g, s, mem, g.name, 1024, co);
  e.mem = std::move(mem);
  e.arena_bytes = plan.arena_bytes;
  e.graph = std::move(g);
  return e;
}

cuda::CudaProgram emit(Graph g, const compiler::Target& target) {
  return emit_all(std::move(g), target).program;
}

class CudaCodegen : public testing::TestWithParam<std::string> {};

TEST_P(CudaCodegen, ZooModelProgramsCompileWithNvrtc) {
  std::string why;
  ASSERT_TRUE(cuda::nvrtc_available(&why)) << why;  // CI has the CUDA toolkit: never skipped
  const compiler::Target& target = compiler::target_for(Device::cuda(0));
  std::vector<Graph> graphs = capture_graphs(GetParam());
  ASSERT_FALSE(graphs.empty());
  for (const Graph& g : graphs) {
    cuda::CudaProgram p = emit(g, target);
    if (p.kernels.empty()) continue;
    cuda::CudaCompileRequest req;
    req.source = p.source;
    req.program_name = GetParam() + "_" + g.name;
    req.arch = "sm_90";
    std::shared_ptr<const cuda::CompiledCubin> cubin;
    try {
      cubin = cuda::compile_cuda(req);
    } catch (const Error& e) {
      FAIL() << GetParam() << ": the generated program does not compile: " << e.what();
    }
    EXPECT_GT(cubin->cubin.size(), 1000u);
    for (const cuda::CudaKernelInfo& k : p.kernels) {
      EXPECT_NE(p.source.find("__global__ void __launch_bounds__(" + std::to_string(std::max(k.threads, 1)) +
                              ") " + k.name + "("),
                std::string::npos)
          << k.name;
      EXPECT_GE(k.threads, 1);
      EXPECT_FALSE(k.slots.empty()) << k.name;
    }
  }
}

// Every op in every dtype it lists (its first sample; all samples would take minutes of NVRTC
// here), as one graph: whatever the CUDA target generates (pointwise, reductions in every
// accumulator type, float64 norms) must compile with NVRTC.
TEST(CudaCodegenOps, EveryGeneratedOpAndDtypeCompilesWithNvrtc) {
  std::string why;
  ASSERT_TRUE(cuda::nvrtc_available(&why)) << why;
  const compiler::Target& target = compiler::target_for(Device::cuda(0));
  Graph g;
  g.name = "all_ops";
  int generated = 0;
  for (const OpDef& op : all_ops()) {
    if (!op.samples) continue;
    Generator gen(11);
    std::vector<OpSample> samples = op.samples(gen);
    if (samples.size() > 1) samples.resize(1);
    for (DType d : op.dtypes) {
      for (const OpSample& sm : samples) {
        std::vector<ValueId> ids;
        bool ok = true;
        for (const Tensor& t : sm.inputs) {
          if (!t.defined()) {
            ids.push_back(kNoValue);
            continue;
          }
          TensorType ty = t.contiguous().type();
          if (is_floating(ty.dtype)) ty.dtype = d;
          ids.push_back(g.add_input("", ty));
        }
        try {
          std::vector<ValueId> outs = g.add_node(op.id, ids, sm.attrs, fmt::format("{}_{}", op.name, dtype_name(d)));
          for (ValueId o : outs) g.outputs.push_back(o);
        } catch (const Error&) {
          ok = false;  // a sample that this dtype does not type-check for (e.g. an index input)
        }
        if (ok && target.generates(g, g.nodes.back())) ++generated;
      }
    }
  }
  ASSERT_GT(generated, 200);
  cuda::CudaProgram p = emit(g, target);
  ASSERT_FALSE(p.kernels.empty());
  cuda::CudaCompileRequest req;
  req.source = p.source;
  req.program_name = "all_ops";
  req.arch = "sm_90";
  try {
    cuda::compile_cuda(req);
  } catch (const Error& e) {
    FAIL() << "the generated program for every op does not compile: " << e.what();
  }
  std::printf("%d generated nodes in %zu kernels\n", generated, p.kernels.size());
}

// ---- direct kernels (targets/cuda/direct_kernels.h) ----------------------------------------------

// One graph node per (dtype, sample) of `op`, inputs contiguous as the compiler hands them to a
// library kernel; samples a dtype does not type-check for are skipped (counted in *skipped).
Graph sample_graph(const OpDef& op, size_t max_samples, int* nodes, int* skipped) {
  Graph g;
  g.name = std::string("direct_") + op.name;
  Generator gen(7);
  std::vector<OpSample> samples = op.samples(gen);
  if (samples.size() > max_samples) samples.resize(max_samples);
  for (DType d : op.dtypes)
    for (size_t i = 0; i < samples.size(); ++i) {
      std::vector<ValueId> ids;
      for (const Tensor& t : samples[i].inputs) {
        if (!t.defined()) {
          ids.push_back(kNoValue);
          continue;
        }
        TensorType ty = t.contiguous().type();
        if (is_floating(ty.dtype)) ty.dtype = d;  // index inputs keep their integer dtype
        ids.push_back(g.add_input("", ty));
      }
      try {
        for (ValueId o : g.add_node(op.id, ids, samples[i].attrs, fmt::format("{}_{}_{}", op.name, dtype_name(d), i)))
          g.outputs.push_back(o);
        ++*nodes;
      } catch (const Error&) {
        ++*skipped;
      }
    }
  return g;
}

// Every sample of every op the direct kernels serve, in every dtype the op takes: a kernel is
// planned (nothing is refused but what the table below expects) and the programs compile with
// NVRTC for sm_90 with the target's flags. The numbers are checked on the GPU by the op harness
// (tests/ops/op_harness_test.cc, compiled cases on CUDA).
TEST(CudaDirectKernels, EverySampleOfEveryDirectOpCompilesWithNvrtc) {
  std::string why;
  ASSERT_TRUE(cuda::nvrtc_available(&why)) << why;
  // The kernels of issue #12's gaps with every sample; the older direct kernels with their
  // first two (NVRTC takes about 0.1 s of CPU per kernel here).
  const std::vector<std::pair<OpId, size_t>> ops = {
      {OpId::Pad, 99}, {OpId::Gather, 99}, {OpId::ScatterAdd, 99}, {OpId::Upsample, 99},
      {OpId::GridSample, 99}, {OpId::AdaptiveAvgPool2d, 99}, {OpId::Matmul, 99},
      {OpId::Linear, 99}, {OpId::Conv2d, 99}, {OpId::ConvTranspose2d, 99},
      {OpId::MaxPool2d, 2}, {OpId::AvgPool2d, 2}, {OpId::Concat, 2}, {OpId::Split, 2},
      {OpId::Embedding, 2}, {OpId::IndexSelect, 2}, {OpId::Argmax, 2}, {OpId::Argmin, 2},
      {OpId::ScaledDotProductAttention, 99}};
  std::vector<cuda::CudaCompileRequest> reqs;
  int kernels = 0;
  for (auto [id, max_samples] : ops) {
    const OpDef& op = op_def(id);
    ASSERT_NE(op.samples, nullptr) << op.name;
    int nodes = 0, skipped = 0;
    Graph g = sample_graph(op, max_samples, &nodes, &skipped);
    EXPECT_GT(nodes, 0) << op.name;
    std::string source;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& n = g.nodes[i];
      cuda::DirectKernel k;
      try {
        k = cuda::plan_direct_kernel(g, n, int32_t(i), 64);
      } catch (const Error& e) {
        // argmax / argmin over an empty set is an error at compile time, as in the reference.
        bool empty_arg = (id == OpId::Argmax || id == OpId::Argmin) &&
                         std::string(e.what()).find("empty set") != std::string::npos;
        EXPECT_TRUE(empty_arg) << n.name << ": " << e.what();
        continue;
      }
      EXPECT_EQ(k.name, fmt::format("kn_{}_{}", op.name, i));
      EXPECT_FALSE(k.describe.empty()) << n.name;
      EXPECT_EQ(k.threads, 256);
      EXPECT_LE(k.blocks, 64) << n.name;
      int64_t out_elems = 0;
      for (ValueId o : n.outputs) out_elems += numel(g.type(o).shape).value();
      if (out_elems == 0) EXPECT_EQ(k.blocks, 0) << n.name << ": an empty output launches nothing";
      else EXPECT_GT(k.blocks, 0) << n.name;
      EXPECT_NE(k.source.find("__global__ void __launch_bounds__(256) " + k.name + "("), std::string::npos);
      for (int a : k.arg_inputs) EXPECT_TRUE(a >= 0 && size_t(a) < n.inputs.size() && n.inputs[size_t(a)] != kNoValue) << n.name;
      EXPECT_LE(k.arg_inputs.size() + k.arg_outputs.size(), 16u);
      source += k.source;
      ++kernels;
    }
    reqs.push_back(cuda::direct_program(source, g.name, "sm_90"));
  }
  std::vector<std::shared_ptr<const cuda::CompiledCubin>> cubins;
  try {
    cubins = cuda::compile_cuda_all(reqs);
  } catch (const Error& e) {
    FAIL() << "a direct-kernel program does not compile: " << e.what();
  }
  for (const auto& c : cubins) EXPECT_GT(c->cubin.size(), 1000u) << c->program_name;
  EXPECT_GT(kernels, 500);
  std::printf("%d direct kernels in %zu programs\n", kernels, reqs.size());
}

// Note [CUDA tensor-core attention]: the mma.sync kernels (float16 and bfloat16; float, bool
// and no masks; causal; head dims 16 to 128, EV != E; two attentions in one program, so the
// helpers' include guard matters) compile with NVRTC for sm_80 and sm_90, with launch bounds
// equal to the block size. Their numbers: CudaDirectEmulatedAttention.TensorCoreKernel... here,
// CudaAttention.* on the GPU.
TEST(CudaDirectKernels, TensorCoreAttentionCompilesWithNvrtc) {
  std::string why;
  ASSERT_TRUE(cuda::nvrtc_available(&why)) << why;
  Graph g;
  g.name = "attention_mma";
  struct Shape4 {
    DType dt;
    Dims q, k, v;
    int mask;  // 0 none, 1 float [B,1,1,S], 2 bool [B,1,L,S]
    bool causal;
  };
  const std::vector<Shape4> shapes = {
      {DType::BFloat16, {1, 12, 128, 64}, {1, 12, 128, 64}, {1, 12, 128, 64}, 1, false},
      {DType::Float16, {2, 4, 300, 128}, {2, 4, 300, 128}, {2, 4, 300, 128}, 0, true},
      {DType::BFloat16, {2, 1, 9, 16}, {2, 1, 70, 16}, {2, 1, 70, 8}, 2, false},
  };
  std::string source;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape4& c = shapes[i];
    std::vector<ValueId> ids = {g.add_input(fmt::format("q{}", i), TensorType(c.dt, to_shape(c.q))),
                                g.add_input(fmt::format("k{}", i), TensorType(c.dt, to_shape(c.k))),
                                g.add_input(fmt::format("v{}", i), TensorType(c.dt, to_shape(c.v)))};
    const int64_t B = c.q[0], L = c.q[2], S = c.k[2];
    if (c.mask == 1) ids.push_back(g.add_input(fmt::format("m{}", i), TensorType(c.dt, to_shape(Dims{B, 1, 1, S}))));
    if (c.mask == 2) ids.push_back(g.add_input(fmt::format("m{}", i), TensorType(DType::Bool, to_shape(Dims{B, 1, L, S}))));
    g.add_node(OpId::ScaledDotProductAttention, ids, {{"is_causal", c.causal}}, fmt::format("attn{}", i));
    cuda::DirectKernel k = cuda::plan_direct_kernel(g, g.nodes.back(), int32_t(i), 132 * 16, {}, 90);
    EXPECT_NE(k.describe.find("tensor cores"), std::string::npos) << k.describe;
    EXPECT_TRUE(k.threads == 64 || k.threads == 128) << k.threads;
    EXPECT_NE(k.source.find(fmt::format("__launch_bounds__({}) {}(", k.threads, k.name)), std::string::npos);
    source += k.source;
  }
  for (const char* arch : {"sm_80", "sm_90"}) {
    try {
      auto cubins = cuda::compile_cuda_all({cuda::direct_program(source, g.name, arch)});
      ASSERT_EQ(cubins.size(), 1u);
      EXPECT_GT(cubins[0]->cubin.size(), 1000u) << arch;
    } catch (const Error& e) {
      FAIL() << arch << ": the tensor-core attention program does not compile: " << e.what();
    }
  }
}

// What goes to cuBLASLt and what to the direct GEMM kernel.
TEST(CudaDirectKernels, GemmRoutesToTheDirectKernelExactlyWhereCublasLtCannot) {
  auto route = [](OpId op, DType d, Dims a, Dims b, bool bias = false) {
    Graph g;
    std::vector<ValueId> ids = {g.add_input("a", TensorType(d, to_shape(a))),
                                g.add_input("b", TensorType(d, to_shape(b)))};
    if (bias) ids.push_back(g.add_input("bias", TensorType(d, to_shape(Dims{b[0]}))));
    g.add_node(op, ids);
    return cuda::gemm_needs_direct_kernel(g, g.nodes.back());
  };
  const DType f32 = DType::Float32, f16 = DType::Float16;
  EXPECT_EQ(route(OpId::Matmul, f32, {3, 4}, {4, 5}), "");
  EXPECT_EQ(route(OpId::Matmul, f16, {2, 3, 4}, {4, 5}), "");          // b shared
  EXPECT_EQ(route(OpId::Matmul, f32, {2, 3, 2}, {2, 2, 4}), "");       // equal batches
  EXPECT_EQ(route(OpId::Matmul, f32, {4}, {2, 4, 3}), "");             // a shared
  EXPECT_EQ(route(OpId::Matmul, f32, {1, 3, 3, 4}, {1, 3, 4, 2}), ""); // size-1 dims in both
  EXPECT_EQ(route(OpId::Linear, DType::BFloat16, {2, 3, 4}, {6, 4}, true), "");
  EXPECT_NE(route(OpId::Matmul, DType::Float64, {3, 4}, {4, 5}), "");
  EXPECT_NE(route(OpId::Matmul, DType::Int32, {3, 4}, {4, 5}), "");
  EXPECT_NE(route(OpId::Linear, DType::Int8, {3, 4}, {5, 4}), "");
  EXPECT_EQ(route(OpId::Matmul, f32, {2, 1, 3, 4}, {3, 4, 2}), "batch dims that broadcast partially");
  EXPECT_EQ(route(OpId::Matmul, f16, {2, 1, 4, 5}, {1, 3, 5, 6}), "batch dims that broadcast partially");
  EXPECT_EQ(route(OpId::Matmul, f32, {3, 1, 4, 5}, {1, 3, 5, 6}), "batch dims that broadcast partially");
  EXPECT_EQ(route(OpId::Linear, f16, {2, 0}, {3, 0}, true), "K = 0 (the output is the bias or zeros)");
  EXPECT_EQ(route(OpId::Matmul, f32, {2, 0}, {0, 3}), "K = 0 (the output is the bias or zeros)");
  EXPECT_EQ(route(OpId::Matmul, f32, {0, 3}, {3, 2}), "an empty output");
}

// The support table routes the ops of issue #12's gaps to library (direct) kernels.
TEST(CudaDirectKernels, SupportTableTakesTheDirectOps) {
  const compiler::Target& target = compiler::target_for(Device::cuda(0));
  for (OpId id : {OpId::Pad, OpId::Gather, OpId::ScatterAdd, OpId::Upsample, OpId::GridSample,
                  OpId::AdaptiveAvgPool2d, OpId::Matmul, OpId::Linear, OpId::Conv2d,
                  OpId::ConvTranspose2d})
    EXPECT_TRUE(target.support()[size_t(id)].library) << op_def(id).name;
  // global pooling stays generated code (a reduction that fuses)
  EXPECT_TRUE(target.support()[size_t(OpId::AdaptiveAvgPool2d)].generated);
}

// ---- pointwise loop kernels run on the host (Note [CUDA vector accesses]) -------------------
// The generated CUDA program compiled as host C++ under a small shim (blocks and threads run one
// after another; pointwise kernels have no barriers or shuffles) and run over a host arena, so
// that the vector form's chunked loads and stores, its tail and its misaligned fallback are
// checked against the interpreter here, without a GPU. The device's own rounding is the op
// harness's on the GPU; these graphs use only correctly rounded ops (add, mul, relu, casts).
const char* const kLoopShim = R"SHIM(// host shim for Kiln's generated CUDA pointwise kernels
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#define __CUDACC_RTC__ 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(n)
#define __align__(n) alignas(n)
static inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long cmp, unsigned long long v) {
  unsigned long long old = *p;
  if (old == cmp) *p = v;
  return old;
}
#define __shared__ static
struct kn_dim3 { unsigned x = 0, y = 0, z = 0; };
static kn_dim3 threadIdx, blockIdx, blockDim{256, 1, 1}, gridDim{1, 1, 1};
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
static inline unsigned __float_as_uint(float f) { unsigned u; __builtin_memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; __builtin_memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int v) { float f; __builtin_memcpy(&f, &v, 4); return f; }
static inline double __longlong_as_double(long long v) { double d; __builtin_memcpy(&d, &v, 8); return d; }
static inline void __syncthreads() { abort(); }
template <typename T> static inline T __shfl_xor_sync(unsigned, T, int) { abort(); }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
)SHIM";

struct HostProgram {
  void* lib = nullptr;
  std::string base, error;
  HostProgram(const cuda::CudaProgram& p, const std::string& name) {
    // The prelude's fixed-width typedefs are NVRTC's (it has no <cstdint>); the host has its own.
    std::string program = p.source;
    for (const char* t : {"typedef long long int64_t;\n", "typedef int int32_t;\n",
                          "typedef signed char int8_t;\n", "typedef unsigned char uint8_t;\n",
                          "typedef unsigned short uint16_t;\n", "typedef unsigned int uint32_t;\n",
                          "typedef unsigned long long uint64_t;\n"}) {
      size_t at = program.find(t);
      if (at != std::string::npos) program.erase(at, std::string(t).size());
    }
    std::string src = std::string(kLoopShim) + program;
    for (const cuda::CudaKernelInfo& k : p.kernels) {
      std::string args;
      for (size_t i = 0; i < k.slots.size(); ++i) args += fmt::format("{}a[{}]", i ? ", " : "", i);
      src += fmt::format(
          "extern \"C\" void {0}_launch(char** a, int blocks, int threads) {{\n"
          "  gridDim.x = unsigned(blocks); blockDim.x = unsigned(threads);\n"
          "  for (int b = 0; b < blocks; ++b) for (int t = 0; t < threads; ++t) {{\n"
          "    blockIdx.x = unsigned(b); threadIdx.x = unsigned(t); {0}({1});\n  }}\n}}\n",
          k.name, args);
    }
    base = testing::TempDir() + "kiln_cuda_loops_" + name + "_" + std::to_string(::getpid());
    std::ofstream(base + ".cc") << src;
    std::string cmd = fmt::format("c++ -std=c++20 -O1 -ffp-contract=off -fPIC -shared -w -o {0}.so {0}.cc 2> {0}.log", base);
    if (std::system(cmd.c_str()) != 0) {
      std::ifstream log(base + ".log");
      error = "the program does not compile as host C++: " +
              std::string(std::istreambuf_iterator<char>(log), {}).substr(0, 3000);
      return;
    }
    lib = dlopen((base + ".so").c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) error = dlerror();
  }
  ~HostProgram() {
    if (lib) dlclose(lib);
    for (const char* ext : {".cc", ".so", ".log"}) std::remove((base + ext).c_str());
  }
  void launch(const cuda::CudaKernelInfo& k, char** args) const {
    auto fn = reinterpret_cast<void (*)(char**, int, int)>(dlsym(lib, (k.name + "_launch").c_str()));
    ASSERT_NE(fn, nullptr) << k.name;
    if (k.blocks > 0) fn(args, int(k.blocks), k.threads);
  }
};

// Runs every kernel of `e` over a host arena with the inputs placed `misalign` elements after a
// 64-byte boundary (their slots), returns the graph outputs read from the arena.
// `status` (when given): the status record the kernels report to (Note [Device status]), in
// the slot after the inputs (these graphs have no constants), zeroed first.
TensorList run_on_host(const Emitted& e, const HostProgram& hp, const TensorList& inputs, int misalign,
                       long long* status = nullptr) {
  std::vector<std::vector<char>> buffers;
  std::vector<char*> slots(2 + inputs.size(), nullptr);
  if (status) {
    status[0] = status[1] = 0;
    slots[1 + inputs.size()] = reinterpret_cast<char*>(status);
  }
  std::vector<char> arena(size_t(e.arena_bytes) + 128);
  char* arena_base = arena.data() + (64 - reinterpret_cast<uintptr_t>(arena.data()) % 64) % 64;
  slots[0] = arena_base;
  for (size_t i = 0; i < inputs.size(); ++i) {
    size_t bytes = size_t(inputs[i].numel()) * size_t(dtype_size(inputs[i].dtype()));
    buffers.emplace_back(bytes + 64 + 64);
    char* b = buffers.back().data();
    b += (64 - reinterpret_cast<uintptr_t>(b) % 64) % 64 + size_t(misalign) * size_t(dtype_size(inputs[i].dtype()));
    std::memcpy(b, inputs[i].contiguous().raw_data(), bytes);
    slots[1 + i] = b;
  }
  for (const cuda::CudaKernelInfo& k : e.program.kernels) {
    std::vector<char*> args;
    for (int32_t s : k.slots) args.push_back(slots[size_t(s)]);
    hp.launch(k, args.data());
  }
  TensorList outs;
  for (ValueId v : e.graph.outputs) {
    const TensorType& t = e.graph.type(v);
    Dims d;
    for (size_t i = 0; i < t.shape.size(); ++i) d.push_back(t.shape[i].value());
    Tensor o = Tensor::empty(d, t.dtype);
    const compiler::MemRef& m = e.mem[size_t(v)];
    std::memcpy(o.raw_data(), slots[size_t(m.slot)] + m.byte_offset, size_t(o.numel()) * size_t(dtype_size(t.dtype)));
    outs.push_back(o);
  }
  return outs;
}

TEST(CudaLoopKernelsOnHost, VectorAccessesMatchTheInterpreterAlignedAndNot) {
  const compiler::Target& target = compiler::target_for(Device::cuda(0));
  struct Case {
    std::string name;
    std::function<void(Graph&)> build;
    int vector_width;  // of the first kernel; 0: scalar form only
  };
  const DType f32 = DType::Float32, bf16 = DType::BFloat16;
  std::vector<Case> cases = {
      // 555 elements: 138 chunks of 4 and a tail of 3
      {"add_relu", [&](Graph& g) {
         ValueId x = g.add_input("x", TensorType(f32, Shape{3, 37, 5}));
         ValueId y = g.add_input("y", TensorType(f32, Shape{3, 37, 5}));
         ValueId s = g.add_node(OpId::Add, {x, y})[0];
         g.outputs.push_back(g.add_node(OpId::Relu, {s})[0]);
       }, 4},
      // a broadcast bias: x and the output chunked, the bias read by index
      {"bias", [&](Graph& g) {
         ValueId x = g.add_input("x", TensorType(f32, Shape{9, 33}));
         ValueId b = g.add_input("b", TensorType(f32, Shape{33}));
         g.outputs.push_back(g.add_node(OpId::Mul, {g.add_node(OpId::Add, {x, b})[0], x})[0]);
       }, 4},
      // bf16 in, f32 math, bf16 out: 8 elements of 2 bytes per chunk
      {"bf16", [&](Graph& g) {
         ValueId x = g.add_input("x", TensorType(bf16, Shape{4, 77}));
         ValueId y = g.add_input("y", TensorType(bf16, Shape{4, 77}));
         g.outputs.push_back(g.add_node(OpId::Relu, {g.add_node(OpId::Mul, {x, y})[0]})[0]);
       }, 8},
      // a transposed operand: read by index, the other input and the output chunked
      {"transposed", [&](Graph& g) {
         ValueId x = g.add_input("x", TensorType(f32, Shape{12, 10}));
         ValueId y = g.add_input("y", TensorType(f32, Shape{10, 12}));
         ValueId yt = g.add_node(OpId::Transpose, {y}, {{"dim0", int64_t(0)}, {"dim1", int64_t(1)}})[0];
         g.outputs.push_back(g.add_node(OpId::Sub, {x, yt})[0]);
       }, 4},
  };
  Generator gen(21);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Graph g;
    g.name = c.name;
    c.build(g);
    TensorList inputs;
    for (ValueId v : g.inputs) {
      const TensorType& t = g.type(v);
      Dims d;
      for (size_t i = 0; i < t.shape.size(); ++i) d.push_back(t.shape[i].value());
      inputs.push_back(Tensor::randn(d, gen, DType::Float32).to(t.dtype));
    }
    TensorList expected = run(g, inputs);
    Emitted e = emit_all(g, target);
    ASSERT_FALSE(e.program.kernels.empty());
    const std::string marker = fmt::format("vector form: {} elements per thread", c.vector_width);
    EXPECT_NE(e.program.source.find(marker), std::string::npos) << e.program.source;
    // Aligned inputs must take the vector form: every arena value the kernels touch sits on a
    // 16-byte boundary (the planner's alignment), as do the inputs run_on_host places.
    for (ValueId v = 0; v < ValueId(e.graph.values.size()); ++v)
      if (e.mem[size_t(v)].slot == 0) {
        EXPECT_EQ(e.mem[size_t(v)].byte_offset % 16, 0) << "value " << v;
      }
    HostProgram hp(e.program, c.name);
    ASSERT_EQ(hp.error, "");
    for (int misalign : {0, 1}) {  // 1: every input off its chunk alignment -> the scalar loop
      TensorList got = run_on_host(e, hp, inputs, misalign);
      ASSERT_EQ(got.size(), expected.size());
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_TRUE(test::close(got[i], expected[i], test::Tolerance::exact()))
            << "output " << i << ", inputs misaligned by " << misalign;
    }
    // The scalar form (vectorize off) computes the same bits.
    cuda::CudaCodegenOptions scalar;
    scalar.vectorize = false;
    Emitted es = emit_all(g, target, scalar);
    EXPECT_EQ(es.program.source.find("vector form"), std::string::npos);
    HostProgram hs(es.program, c.name + "_scalar");
    ASSERT_EQ(hs.error, "");
    TensorList got = run_on_host(es, hs, inputs, 0);
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(test::close(got[i], expected[i], test::Tolerance::exact())) << "scalar form, output " << i;
  }
}

// Integer div / pow (Note [Device status]): the values of the reference (truncating division,
// INT64_MIN / -1 wraps, non-negative exponents), and a zero divisor or a negative exponent
// reported through the status record with the node's code and the check's text, never a trap.
TEST(CudaLoopKernelsOnHost, IntegerDivAndPowMatchTheInterpreterAndReportBadValues) {
  const compiler::Target& target = compiler::target_for(Device::cuda(0));
  for (DType dt : {DType::Int32, DType::Int64, DType::Int8}) {
    SCOPED_TRACE(dtype_name(dt));
    Graph g;
    g.name = std::string("idiv_") + dtype_name(dt);
    ValueId a = g.add_input("a", TensorType(dt, Shape{7, 9}));
    ValueId b = g.add_input("b", TensorType(dt, Shape{9}));
    ValueId e = g.add_input("e", TensorType(dt, Shape{7, 9}));
    ValueId q = g.add_node(OpId::Div, {a, b}, {}, "q.div")[0];
    g.outputs.push_back(q);
    g.outputs.push_back(g.add_node(OpId::Pow, {q, e}, {}, "p.pow")[0]);
    Generator gen(int(dt) + 5);
    Tensor ta = Tensor::randint({7, 9}, gen, -100, 100, dt);
    Tensor tb = Tensor::randint({9}, gen, 1, 6, dt);
    if (dt == DType::Int64) {  // INT64_MIN / -1 wraps to INT64_MIN, as the reference
      ta.data<int64_t>()[0] = INT64_MIN;
      tb.data<int64_t>()[0] = -1;
    }
    Tensor te = Tensor::randint({7, 9}, gen, 0, 4, dt);
    TensorList expected = run(g, {ta, tb, te});
    Emitted em = emit_all(g, target);
    ASSERT_EQ(em.program.checks.size(), 2u);
    EXPECT_NE(em.program.source.find("kn_idiv("), std::string::npos);
    HostProgram hp(em.program, g.name);
    ASSERT_EQ(hp.error, "");
    long long st[2];
    TensorList got = run_on_host(em, hp, {ta, tb, te}, 0, st);
    EXPECT_EQ(st[0], 0) << "reported " << st[1];
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(test::close(got[i], expected[i], test::Tolerance::exact())) << "output " << i;
    // A zero divisor: code of node q.div (node 0), value 0, and the check's text.
    Tensor zb = tb.clone();
    std::memset(static_cast<char*>(zb.raw_data()) + 4 * dtype_size(dt), 0, size_t(dtype_size(dt)));
    run_on_host(em, hp, {ta, zb, te}, 0, st);
    EXPECT_EQ(st[0], 1);
    EXPECT_EQ(st[1], 0);
    const Executable::DeviceCheck* div_check = nullptr;
    for (const Executable::DeviceCheck& c : em.program.checks) if (c.code == st[0]) div_check = &c;
    ASSERT_NE(div_check, nullptr);
    EXPECT_EQ(div_check->prefix + "0" + div_check->suffix,
              "op 'div' at node 'q.div': integer division by 0 (divide floating tensors to get "
              "inf/nan, or mask the zeros first)");
    // A negative exponent: code of node p.pow (node 1), the exponent as the value.
    Tensor ne = te.clone();
    Tensor minus = Tensor::full({1}, -2, dt);
    std::memcpy(static_cast<char*>(ne.raw_data()) + 10 * dtype_size(dt), minus.raw_data(), size_t(dtype_size(dt)));
    run_on_host(em, hp, {ta, tb, ne}, 0, st);
    EXPECT_EQ(st[0], 2);
    EXPECT_EQ(st[1], -2);
  }
}

INSTANTIATE_TEST_SUITE_P(Zoo, CudaCodegen,
                         testing::Values("mlp", "vfe", "branchy", "resnet18", "vit_b_16", "bert_base"),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
