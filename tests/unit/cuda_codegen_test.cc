// The CUDA target's emitter without a GPU: every zoo model's graph goes through the compiler's
// phases for the CUDA target up to code generation (library nodes scheduled as extern steps,
// memory planned), and the generated CUDA C program must compile with NVRTC for sm_90 — so a
// syntax or type error in generated code fails here, in CI, not on the GPU machine. The numbers
// are checked on the GPU (tests/cuda/compiled_cuda_test.cc).
#include <gtest/gtest.h>

#include <memory>

#include <fmt/format.h>

#include "capture/compile.h"
#include "compiler/backend.h"
#include "compiler/choose_kernels.h"
#include "compiler/insert_copies.h"
#include "compiler/target.h"
#include "lower/memory_planner.h"
#include "lower/scheduler.h"
#include "nn/compile.h"
#include "nn/models/zoo.h"
#include "ops/op.h"
#include "passes/pipeline.h"
#include "targets/cuda/emitter.h"
#include "targets/cuda/nvrtc.h"

using namespace kiln;

namespace {

std::vector<Graph>* g_graphs = nullptr;

std::vector<Graph> capture_graphs(const std::string& model) {
  static bool registered = false;
  if (!registered) {
    registered = true;
    register_backend("test-cuda-codegen-grabber", [](const Graph& g, const BackendOptions&) {
      if (g_graphs) g_graphs->push_back(g);
      return find_backend("eager")(g, BackendOptions{});
    });
  }
  nn::ZooModel m = nn::make_zoo_model(model, 1, 3);
  std::vector<Graph> out;
  g_graphs = &out;
  CompileOptions o;
  o.backend = "test-cuda-codegen-grabber";
  compile(m.module, o)(m.inputs);
  g_graphs = nullptr;
  return out;
}

// The compiler's phases for `target` up to emission, with the library nodes as extern steps
// and every value in slot 0 (inputs and constants in slots of their own).
cuda::CudaProgram emit(Graph g, const compiler::Target& target) {
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
  return cuda::generate_cuda(g, s, mem, g.name, 1024);
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

INSTANTIATE_TEST_SUITE_P(Zoo, CudaCodegen,
                         testing::Values("mlp", "vfe", "branchy", "resnet18", "vit_b_16", "bert_base"),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
