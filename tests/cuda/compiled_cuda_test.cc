// The CUDA target end to end: every zoo model's graph compiled for CUDA (generated kernels
// through NVRTC, cuBLASLt, cuDNN, direct kernels) against the CPU eager result on fresh random
// inputs (max |cuda - cpu| <= 1e-4 * max |cpu|, NaN fails), in default and reduce-overhead
// (CUDA-graph replay: bitwise equal to default), with host and device inputs; and bad values
// (integer division by zero, indices out of range) failing the call as on the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../support/compare.h"
#include "../support/captured_graphs.h"
#include "../support/graph_inputs.h"
#include "pick_rows.h"
#include "capture/compile.h"
#include "compiler/backend.h"
#include "compiler/compile.h"
#include "core/cuda_runtime.h"
#include "ir/graph.h"
#include "nn/compile.h"
#include "nn/models/zoo.h"
#include "ops/api.h"
#include "ops/op.h"
#include "runtime/launch_library.h"

using namespace kiln;

namespace {

// |a - b| <= tol * max(max |b|, 1e-30) everywhere (tests/support/compare.h: NaN on one side,
// or unmatched infinities, fail).
::testing::AssertionResult close_rel(const Tensor& got, const Tensor& want, double tol) {
  Tensor a = got.to(Device::cpu()), b = want.to(Device::cpu());
  return test::close(a, b, test::Tolerance::of_scale(std::max(test::max_abs(b), 1e-30), tol));
}

class CudaZoo : public testing::TestWithParam<std::string> {};

TEST_P(CudaZoo, CompiledMatchesCpuEagerAndGraphReplayIsBitwiseEqual) {
  const std::string name = GetParam();
  nn::ZooModel model = nn::make_zoo_model(name, /*batch=*/1, /*seed=*/5);
  TensorList inputs = model.inputs;
  // The CPU eager reference, and the graphs capture records for the same call (whole: the zoo
  // models have no graph breaks but branchy's).
  TensorList want = model.module->call(inputs);
  const std::vector<Graph> graphs = test::capture_graphs(model.module, inputs);
  ASSERT_FALSE(graphs.empty()) << name;

  // Each captured graph, compiled for CUDA; a whole-graph model has one and its outputs are the
  // call's (graphs of a model with breaks are checked against the interpreter instead).
  for (size_t gi = 0; gi < graphs.size(); ++gi) {
    const Graph& g = graphs[gi];
    // The call's inputs for a whole-graph model (BERT's graph takes the mask first), else fresh.
    TensorList gin = test::graph_test_inputs(g, inputs, graphs.size() == 1, 1000 + gi);
    Generator gg(5000 + gi);  // the second, fresh inputs below
    TensorList ref = find_backend("eager")(g, BackendOptions{})->run(gin);
    compiler::Options o;
    std::unique_ptr<compiler::CompiledExecutable> exe;
    try {
      exe = compiler::compile(g, Device::cuda(0), o);
    } catch (const std::exception& e) {
      FAIL() << name << " graph " << gi << ": compiling for CUDA failed: " << e.what();
    }
    std::printf("%s graph %zu: %s\n", name.c_str(), gi, exe->report().str().c_str());
    EXPECT_EQ(exe->report().eager_launches, 0) << exe->summary();
    // Host inputs, then device inputs: the same result.
    TensorList got = exe->run(gin);
    TensorList dev_in;
    for (const Tensor& t : gin) dev_in.push_back(t.to(Device::cuda(0)));
    TensorList got_dev = exe->run(dev_in);
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_EQ(got[i].device(), Device::cuda(0));
      if (!is_floating(ref[i].dtype())) continue;
      EXPECT_TRUE(test::usable_reference(ref[i])) << name << " graph " << gi << " output " << i;
      EXPECT_TRUE(close_rel(got[i], ref[i], 1e-4)) << name << " graph " << gi << " output " << i << "\n" << exe->summary();
      EXPECT_EQ(test::first_byte_difference(got[i], got_dev[i]), "") << name << ": host vs device inputs";
    }
    // Fresh inputs a second time (the compiled code is not specialized to the first values).
    TensorList gin2;
    for (const Tensor& t : gin)
      gin2.push_back(is_floating(t.dtype()) ? Tensor::randn(t.sizes(), gg, t.dtype()) : t);
    TensorList ref2 = find_backend("eager")(g, BackendOptions{})->run(gin2);
    TensorList got2 = exe->run(gin2);
    for (size_t i = 0; i < ref2.size(); ++i)
      if (is_floating(ref2[i].dtype())) {
        EXPECT_TRUE(close_rel(got2[i], ref2[i], 1e-4)) << name << " second inputs, output " << i;
      }
    // reduce-overhead: CUDA-graph replay, bitwise equal to default (same kernels, same order).
    compiler::Options ro;
    ro.mode = "reduce-overhead";
    auto rexe = compiler::compile(g, Device::cuda(0), ro);
    EXPECT_NE(rexe->report().mode_note.find("CUDA graph replay"), std::string::npos)
        << rexe->report().mode_note;
    std::vector<TensorList> kept;
    for (int call = 0; call < 3; ++call) {  // the first call captures, the next ones replay
      TensorList r = rexe->run(call == 1 ? dev_in : gin2);
      const TensorList& d = call == 1 ? got_dev : got2;
      for (size_t i = 0; i < r.size(); ++i)
        EXPECT_EQ(test::first_byte_difference(r[i], d[i]), "") << name << " reduce-overhead call " << call << " output " << i;
      kept.push_back(r);
    }
    // The outputs of a replay are the caller's: later replays (other inputs) never overwrite
    // them — the case where torch's CUDA-graph outputs fail with "accessing tensor output of
    // CUDAGraphs that has been overwritten by a subsequent run" (Note [Executable]).
    for (size_t i = 0; i < kept[1].size(); ++i)
      EXPECT_EQ(test::first_byte_difference(kept[1][i], got_dev[i]), "") << name << ": call 1's output " << i
                                                          << " changed after calls 2";
    // Caller-provided output buffers on the device (run_into): filled in place, same bits.
    TensorList into;
    for (const Tensor& t : got_dev) into.push_back(Tensor::empty(t.sizes(), t.dtype(), Device::cuda(0)));
    std::vector<const void*> where;
    for (const Tensor& t : into) where.push_back(t.raw_data());
    rexe->run_into(dev_in, into);
    for (size_t i = 0; i < into.size(); ++i) {
      EXPECT_EQ(into[i].raw_data(), where[i]) << name << ": run_into replaced output " << i;
      EXPECT_EQ(test::first_byte_difference(into[i], got_dev[i]), "") << name << " run_into output " << i;
    }
  }
  (void)want;
}

INSTANTIATE_TEST_SUITE_P(Zoo, CudaZoo,
                         testing::Values("mlp", "vfe", "branchy", "branchy_cond", "resnet18",
                                         "resnet50", "vit_b_16", "bert_base"),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

TEST(CudaCompile, KilnCompileOnCudaInputsUsesTheCudaTarget) {
  Generator g(3);
  auto fn = [](const TensorList& in) {
    return TensorList{softmax(relu(in[0] * 2.0 + in[1]), -1), sum(in[0], {1})};
  };
  CompileOptions co;
  co.strict = true;  // a CUDA compile failure must surface, not fall back to eager
  CompiledFunction f = compile(fn, co);
  Tensor a = Tensor::randn({37, 129}, g), b = Tensor::randn({37, 129}, g);
  TensorList cpu = fn({a, b});  // the CPU eager kernels (the GPU machine has no SLEEF to link CPU code)
  TensorList gpu = f({a.to(Device::cuda(0)), b.to(Device::cuda(0))});
  ASSERT_EQ(gpu.size(), 2u);
  EXPECT_TRUE(close_rel(gpu[0], cpu[0], 1e-5));
  EXPECT_TRUE(close_rel(gpu[1], cpu[1], 1e-5));
  ExplainReport r = f.report();
  bool saw_cuda = false;
  for (const ExplainGraph& eg : r.graphs) saw_cuda |= eg.backend_summary.find("cuBLASLt/cuDNN") != std::string::npos;
  EXPECT_TRUE(saw_cuda) << r.text();
  EXPECT_EQ(r.stats.fallbacks_compile_error, 0) << r.text();
}

// Note [Device status] (runtime/executable.h): bad values that the reference rejects fail the
// CUDA call with the reference's message naming the node, in default and reduce-overhead
// (the record is read back inside the CUDA graph), and the next call with good values is right
// again (the record was cleared).
std::string error_of_run(compiler::CompiledExecutable& exe, const TensorList& in, ErrorKind* kind) {
  try {
    exe.run(in);
  } catch (const Error& e) {
    *kind = e.kind();
    return e.what();
  }
  return "";
}

using test::ints_tensor;

// Note [Copies inside the graph] (runtime/executable.cc): in reduce-overhead, a call whose
// inputs and outputs are contiguous device buffers runs its copies inside the graph. The copies
// read the buffers' current contents (an input rewritten in place), follow buffers that move (new
// tensors, other run_into destinations), and every call is bitwise the default mode's; host,
// non-contiguous and overlapping buffers take the plain path, with the same results.
TEST(CudaGraphCopies, DeviceBuffersAreCopiedInsideTheGraphAndFollowedWhenTheyMove) {
  Graph g;
  ValueId a = g.add_input("a", TensorType{DType::Float32, to_shape(Dims{37, 129})});
  ValueId b = g.add_input("b", TensorType{DType::Float32, to_shape(Dims{37, 129})});
  ValueId s = g.add_node1(OpId::Add, {a, b}, {}, "sum");
  ValueId r = g.add_node1(OpId::Relu, {s}, {}, "relu");
  ValueId m = g.add_node1(OpId::Mul, {a, r}, {}, "prod");
  g.outputs = {r, m};
  compiler::Options d, ro;
  ro.mode = "reduce-overhead";
  auto dexe = compiler::compile(g, Device::cuda(0), d);
  auto rexe = compiler::compile(g, Device::cuda(0), ro);
  Executable& ex = rexe->executable();
  ASSERT_TRUE(ex.graph_mode());
  const Device gpu = Device::cuda(0);
  Generator gen(71);
  auto fresh = [&] { return Tensor::randn({37, 129}, gen).to(gpu); };
  // Each call against the default mode (bitwise) and the eager reference (float32 rounding).
  auto check = [&](const TensorList& in, const TensorList& got, const std::string& what) {
    TensorList want = dexe->run(in);
    TensorList ref = find_backend("eager")(g, BackendOptions{})->run(
        {in[0].to(Device::cpu()).contiguous(), in[1].to(Device::cpu()).contiguous()});
    ASSERT_EQ(got.size(), 2u) << what;
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(test::usable_reference(ref[i])) << what;
      EXPECT_TRUE(close_rel(got[i], ref[i], 1e-6)) << what << " output " << i;
      EXPECT_EQ(test::first_byte_difference(got[i].to(Device::cpu()), want[i].to(Device::cpu())), "")
          << what << " output " << i;
    }
  };
  // In process, graph mode is asked for after prepare(): the first call captures the graph and
  // builds the graph with copies (a loaded package builds both at prepare: CudaPackageZoo).
  EXPECT_EQ(ex.graphs_with_copies_built(), 0);
  TensorList in1 = {fresh(), fresh()};
  check(in1, rexe->run(in1), "first device call");
  EXPECT_EQ(ex.calls_with_copies_in_graph(), 1);
  EXPECT_EQ(ex.graphs_with_copies_built(), 1);
  // The same buffers rewritten in place: the graph's copies read what is there now.
  in1[0].copy_(Tensor::randn({37, 129}, gen));
  in1[1].copy_(Tensor::randn({37, 129}, gen));
  check(in1, rexe->run(in1), "inputs rewritten in place");
  // New input buffers, and new output buffers each call (run allocates them).
  TensorList in2 = {fresh(), fresh()};
  check(in2, rexe->run(in2), "inputs moved");
  EXPECT_EQ(ex.calls_with_copies_in_graph(), 3);
  // run_into: kept destinations, then others; the first ones keep their results.
  TensorList o1 = {Tensor::empty({37, 129}, DType::Float32, gpu), Tensor::empty({37, 129}, DType::Float32, gpu)};
  TensorList o2 = {Tensor::empty({37, 129}, DType::Float32, gpu), Tensor::empty({37, 129}, DType::Float32, gpu)};
  rexe->run_into(in1, o1);
  check(in1, o1, "run_into o1");
  rexe->run_into(in2, o2);
  check(in2, o2, "run_into o2");
  check(in1, o1, "o1 after o2 was written");
  rexe->run_into(in2, o1);
  check(in2, o1, "run_into o1 again");
  EXPECT_EQ(ex.calls_with_copies_in_graph(), 6);
  // Plain path: host inputs; a non-contiguous device input; outputs that overlap.
  TensorList host = {Tensor::randn({37, 129}, gen), Tensor::randn({37, 129}, gen)};
  check(host, rexe->run(host), "host inputs");
  Tensor wide = Tensor::randn({129, 37}, gen).to(gpu);
  TensorList strided = {transpose(wide, 0, 1), fresh()};
  ASSERT_FALSE(strided[0].is_contiguous());
  check(strided, rexe->run(strided), "a non-contiguous device input");
  EXPECT_EQ(ex.calls_with_copies_in_graph(), 6);
  TensorList same = {o2[0], o2[0]};  // both outputs into one buffer: the plain path's order
  rexe->run_into(in1, same);
  TensorList want = dexe->run(in1);
  EXPECT_EQ(test::first_byte_difference(o2[0].to(Device::cpu()), want[1].to(Device::cpu())), "");
  EXPECT_EQ(ex.calls_with_copies_in_graph(), 6);
  // And back: the graph's copies still follow.
  TensorList in3 = {fresh(), fresh()};
  check(in3, rexe->run(in3), "device inputs after the plain path");
  EXPECT_EQ(ex.calls_with_copies_in_graph(), 7);
}

// The input specs reordered after the graph with copies exists, as nn::compile_captured_graph
// does after its first call (a package exported from a CUDA module): the same caller buffers at
// the same positions now go to other staging buffers. The first version kept a node while the
// caller's buffer was the same, and copied each input into the other's place (BERT's two inputs
// in a package built from a CUDA module: all-zero and NaN outputs on the H100).
TEST(CudaGraphCopies, InputSpecsReorderedAfterTheFirstCallMoveTheCopies) {
  Graph g;
  ValueId a = g.add_input("a", TensorType{DType::Float32, to_shape(Dims{5, 33})});
  ValueId b = g.add_input("b", TensorType{DType::Float32, to_shape(Dims{5, 33})});
  g.outputs = {g.add_node1(OpId::Sub, {a, b}, {}, "diff")};
  compiler::Options ro;
  ro.mode = "reduce-overhead";
  auto rexe = compiler::compile(g, Device::cuda(0), ro);
  Executable& ex = rexe->executable();
  ASSERT_TRUE(ex.graph_mode());
  Generator gen(73);
  const Tensor x = Tensor::randn({5, 33}, gen), y = Tensor::randn({5, 33}, gen);
  const TensorList in = {x.to(Device::cuda(0)), y.to(Device::cuda(0))};
  auto eager = [&](const Tensor& av, const Tensor& bv) {
    return find_backend("eager")(g, BackendOptions{})->run({av, bv})[0];
  };
  Tensor first = rexe->run(in)[0].to(Device::cpu());
  EXPECT_TRUE(test::usable_reference(first));
  EXPECT_EQ(test::first_byte_difference(first, eager(x, y)), "");
  EXPECT_EQ(ex.calls_with_copies_in_graph(), 1);
  std::reverse(ex.inputs.begin(), ex.inputs.end());  // position 0 is now b, position 1 a
  Tensor second = rexe->run(in)[0].to(Device::cpu());  // b = x, a = y: y - x
  EXPECT_EQ(test::first_byte_difference(second, eager(y, x)), "") << "after the reorder";
  EXPECT_EQ(ex.calls_with_copies_in_graph(), 2);
}

// Note [Device status] through the graph's copies: a bad value in a device input fails the call
// naming the node, and the next call is right again.
TEST(CudaGraphCopies, DeviceStatusFailsTheCallAndClears) {
  Graph g;
  ValueId a = g.add_input("a", TensorType{DType::Int32, to_shape(Dims{3, 4})});
  ValueId b = g.add_input("b", TensorType{DType::Int32, to_shape(Dims{3, 4})});
  g.outputs = {g.add_node1(OpId::Div, {a, b}, {}, "ratio.div")};
  compiler::Options ro;
  ro.mode = "reduce-overhead";
  auto exe = compiler::compile(g, Device::cuda(0), ro);
  Generator gen(29);
  Tensor ta = Tensor::randint({3, 4}, gen, 0, 100, DType::Int32);
  Tensor tb = Tensor::randint({3, 4}, gen, 1, 4, DType::Int32);
  TensorList want = find_backend("eager")(g, BackendOptions{})->run({ta, tb});
  const TensorList good = {ta.to(Device::cuda(0)), tb.to(Device::cuda(0))};
  std::vector<int64_t> bv(12, 2);
  bv[11] = 0;
  const TensorList bad = {good[0], test::ints_tensor({3, 4}, bv, DType::Int32).to(Device::cuda(0))};
  for (int round = 0; round < 2; ++round) {
    TensorList got = exe->run(good);
    EXPECT_EQ(test::first_byte_difference(got[0].to(Device::cpu()), want[0]), "") << round;
    ErrorKind kind{};
    std::string msg = error_of_run(*exe, bad, &kind);
    EXPECT_EQ(kind, ErrorKind::InvalidArgument) << msg;
    EXPECT_NE(msg.find("ratio.div"), std::string::npos) << msg;
  }
  EXPECT_EQ(exe->executable().calls_with_copies_in_graph(), 4);
}


TEST(CudaDeviceStatus, IntegerDivisionAndPowerReportBadValuesNamingTheNode) {
  for (DType dt : {DType::Int32, DType::Int64, DType::UInt8}) {
    Graph g;
    ValueId a = g.add_input("a", TensorType{dt, to_shape(Dims{3, 4})});
    ValueId b = g.add_input("b", TensorType{dt, to_shape(Dims{3, 4})});
    ValueId q = g.add_node(OpId::Div, {a, b}, {}, "ratio.div")[0];
    ValueId p = g.add_node(OpId::Pow, {q, b}, {}, "ratio.pow")[0];
    g.outputs = {q, p};
    Generator gen(int(dt) + 17);
    Tensor ta = Tensor::randint({3, 4}, gen, 0, 100, dt);
    Tensor tb = Tensor::randint({3, 4}, gen, 1, 4, dt);  // nonzero, non-negative
    TensorList want = find_backend("eager")(g, BackendOptions{})->run({ta, tb});
    for (const char* mode : {"default", "reduce-overhead"}) {
      compiler::Options o;
      o.mode = mode;
      auto exe = compiler::compile(g, Device::cuda(0), o);
      EXPECT_EQ(exe->report().eager_launches, 0) << exe->summary();
      for (int round = 0; round < 2; ++round) {
        TensorList got = exe->run({ta, tb});
        for (size_t i = 0; i < want.size(); ++i)
          EXPECT_EQ(test::first_byte_difference(got[i].to(Device::cpu()), want[i]), "")
              << dtype_name(dt) << " " << mode << " output " << i;
        // A zero divisor in the last element: the call fails naming the node.
        std::vector<int64_t> bv(12, 2);
        bv[11] = 0;
        Tensor zb = ints_tensor({3, 4}, bv, dt);
        ErrorKind kind{};
        std::string msg = error_of_run(*exe, {ta, zb}, &kind);
        EXPECT_EQ(kind, ErrorKind::InvalidArgument) << msg;
        EXPECT_NE(msg.find("ratio.div"), std::string::npos) << msg;
        EXPECT_NE(msg.find("integer division by 0"), std::string::npos) << msg;
        if (dt == DType::UInt8) continue;  // no negative exponents in uint8
        // A negative exponent (and a nonzero divisor): pow fails, naming its node and the value.
        std::vector<int64_t> nv(12, 1);
        nv[5] = -3;
        msg = error_of_run(*exe, {ta, ints_tensor({3, 4}, nv, dt)}, &kind);
        EXPECT_EQ(kind, ErrorKind::InvalidArgument) << msg;
        EXPECT_NE(msg.find("ratio.pow"), std::string::npos) << msg;
        EXPECT_NE(msg.find("negative exponent -3"), std::string::npos) << msg;
      }
    }
  }
}

TEST(CudaDeviceStatus, OutOfRangeIndicesFailLikeTheCpu) {
  // The CPU's compiled index check names the node and the index with the same words
  // (lower::index_check); the GPU machine cannot link CPU kernels (no SLEEF there), so the
  // expected text is written out and the CPU eager kernel gives the error kind and the values.
  const test::PickRows c = test::pick_rows_case();
  const Graph& g = c.g;
  const Tensor &tx = c.x, &good = c.good, &bad = c.bad;
  const std::string& expected = c.expected;
  auto eager = find_backend("eager")(g, BackendOptions{});
  ErrorKind cpu_kind{};
  std::string cpu_msg;
  try {
    eager->run({tx, bad});
  } catch (const Error& e) {
    cpu_kind = e.kind();
    cpu_msg = e.what();
  }
  ASSERT_NE(cpu_msg, "");
  TensorList want = eager->run({tx, good});
  for (const char* mode : {"default", "reduce-overhead"}) {
    compiler::Options o;
    o.mode = mode;
    auto exe = compiler::compile(g, Device::cuda(0), o);
    for (int round = 0; round < 2; ++round) {
      TensorList got = exe->run({tx, good});
      EXPECT_EQ(test::first_byte_difference(got[0].to(Device::cpu()), want[0]), "") << mode;
      ErrorKind kind{};
      std::string msg = error_of_run(*exe, {tx, bad}, &kind);
      EXPECT_EQ(kind, cpu_kind) << msg << "\ncpu eager: " << cpu_msg;
      EXPECT_NE(msg.find(expected), std::string::npos) << msg;
    }
  }
}

// `g` compiled for CUDA under the knob `knob`=`value` in default and in reduce-overhead mode,
// each run on `in`: check(mode, exe, summary, output on the host) for each, and the
// reduce-overhead output (a CUDA-graph replay) bitwise the default one.
void check_both_modes(
    const Graph& g, const char* knob, const char* value, const TensorList& in, const std::string& label,
    const std::function<void(const char* mode, const compiler::CompiledExecutable& exe,
                             const std::string& summary, const Tensor& got)>& check) {
  SCOPED_TRACE(fmt::format("{} {}={}", label, knob, value));
  Tensor first;
  for (const char* mode : {"default", "reduce-overhead"}) {
    SCOPED_TRACE(mode);
    compiler::Options o;
    o.mode = mode;
    o.knobs.set(knob, value);
    auto exe = compiler::compile(g, Device::cuda(0), o);
    Tensor got = exe->run(in)[0].to(Device::cpu());
    check(mode, *exe, exe->summary(), got);
    if (!first.defined()) first = got;
    else EXPECT_EQ(test::first_byte_difference(got, first), "") << label << ": replay differs from the plain run";
  }
}

// scaled_dot_product_attention compiled for CUDA runs as one fused kernel — cuDNN's flash
// attention in float16 / bfloat16 without a mask or with one (guarded: Note [guarded attention
// masks] in passes/attention_mask_guard.h), else the flash-style direct kernel (Note
// [CUDA attention] in targets/cuda/target.cc) — at the sizes models use — ViT's 197 tokens, BERT's padding mask, causal 300, head
// sizes 128 and 256 (the latter reads K and V from global memory), broadcast batch dims in float64
// — against the float64 reference on fresh random inputs, per dtype's tolerance (the op harness's,
// times the op's tolerance scale); rows whose every key is masked, or whose mask holds a NaN or
// +inf, are NaN exactly where the reference's are (bool and float masks); the CUDA-graph replay is bitwise equal to the plain run; no score matrix (no
// softmax or matmul kernel) appears in the compiled graph. cuDNN's graph rounds the probabilities
// to the I/O dtype before the second product: within the same dtype tolerance.
TEST(CudaAttention, FlashKernelAtModelSizesMatchesTheReference) {
  struct Case {
    std::string name;
    Dims q, k, v;
    DType dt;
    int mask = 0;  // 0 none, 1 BERT-style float padding mask [B,1,1,S], 2 bool mask with dead
                   // rows, 3 float mask [B,1,L,S] with dead rows, a NaN and a +inf
    bool causal = false;
  };
  std::vector<Case> cases;
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16})
    cases.push_back({"vit", {1, 12, 197, 64}, {1, 12, 197, 64}, {1, 12, 197, 64}, dt});
  for (DType dt : {DType::Float32, DType::BFloat16})
    cases.push_back({"bert_padding", {2, 12, 128, 64}, {2, 12, 128, 64}, {2, 12, 128, 64}, dt, 1});
  for (DType dt : {DType::Float32, DType::Float16})
    cases.push_back({"causal", {1, 4, 300, 64}, {1, 4, 300, 64}, {1, 4, 300, 64}, dt, 0, true});
  for (DType dt : {DType::Float32, DType::BFloat16})
    cases.push_back({"dead_rows", {2, 2, 5, 16}, {2, 2, 70, 16}, {2, 2, 70, 8}, dt, 2});
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16})
    cases.push_back({"dead_rows_float", {2, 4, 24, 64}, {2, 4, 40, 64}, {2, 4, 40, 64}, dt, 3});
  cases.push_back({"head128", {1, 2, 100, 128}, {1, 2, 90, 128}, {1, 2, 90, 128}, DType::Float32});
  cases.push_back({"head256_global", {1, 2, 50, 256}, {1, 2, 77, 256}, {1, 2, 77, 256}, DType::Float32});
  cases.push_back({"broadcast_f64", {2, 3, 40, 32}, {3, 60, 32}, {1, 60, 16}, DType::Float64});
  const OpDef& op = op_def(OpId::ScaledDotProductAttention);
  Generator gen(2026);
  for (const Case& c : cases) {
    const std::string label = c.name + " " + dtype_name(c.dt);
    TensorList in = {Tensor::randn(c.q, gen).to(c.dt), Tensor::randn(c.k, gen).to(c.dt),
                     Tensor::randn(c.v, gen).to(c.dt)};
    const int64_t S = c.k[c.k.size() - 2], L = c.q[c.q.size() - 2];
    if (c.mask == 1) {  // batch 1 pads its last 40 keys
      Tensor m = Tensor::empty(Dims{c.q[0], 1, 1, S}, DType::Float32);
      for (int64_t b = 0; b < c.q[0]; ++b)
        for (int64_t j = 0; j < S; ++j)
          m.data<float>()[b * S + j] = b == 1 && j >= S - 40 ? -INFINITY : 0.0f;
      in.push_back(m.to(c.dt));
    } else if (c.mask == 2) {  // [B, 1, L, S]: row 3 of batch 0 attends nothing
      Tensor m = Tensor::empty(Dims{c.q[0], 1, L, S}, DType::Bool);
      for (int64_t x = 0; x < m.numel(); ++x) m.data<bool>()[x] = gen.uniform() < 0.5;
      for (int64_t b = 0; b < c.q[0]; ++b)
        for (int64_t i = 0; i < L; ++i) m.data<bool>()[(b * L + i) * S + (i * 7) % S] = true;
      for (int64_t j = 0; j < S; ++j) m.data<bool>()[3 * S + j] = false;
      in.push_back(m);
    } else if (c.mask == 3) {  // [B, 1, L, S]: batch 0's row 3 attends nothing; batch 1's row 5
                               // holds a NaN, its row 6 a +inf; a quarter of the rest -inf
      Tensor m = Tensor::empty(Dims{c.q[0], 1, L, S}, DType::Float32);
      float* p = m.data<float>();
      for (int64_t x = 0; x < m.numel(); ++x)
        p[x] = gen.uniform() < 0.25 ? -INFINITY : float(gen.uniform() * 4 - 2);
      for (int64_t i = 0; i < c.q[0] * L; ++i) p[i * S + (i * 7) % S] = 0.5f;  // one key each
      for (int64_t j = 0; j < S; ++j) p[3 * S + j] = -INFINITY;
      p[(L + 5) * S + 11] = NAN;
      p[(L + 6) * S + 2] = INFINITY;
      in.push_back(m.to(c.dt));
    }
    Graph g;
    std::vector<ValueId> ids;
    for (size_t i = 0; i < in.size(); ++i) ids.push_back(g.add_input(fmt::format("in{}", i), in[i].type()));
    g.outputs = g.add_node(OpId::ScaledDotProductAttention, ids, {{"is_causal", c.causal}}, "attn");
    // The float64 reference on the same (rounded) inputs.
    TensorList in64;
    for (const Tensor& t : in) in64.push_back(is_floating(t.dtype()) ? t.to(DType::Float64).contiguous() : t);
    std::vector<TensorType> types = {g.type(g.outputs[0])};
    types[0].dtype = DType::Float64;
    Dims out_dims;
    for (size_t d = 0; d < types[0].shape.size(); ++d) out_dims.push_back(types[0].shape[d].value());
    TensorList want = {Tensor::empty(out_dims, DType::Float64)};
    KernelContext ctx{op, std::span<const Tensor>(in64), std::span<Tensor>(want), g.nodes[0].attrs,
                      std::span<const TensorType>(types)};
    op.reference(ctx);
    const bool half = c.dt == DType::Float16 || c.dt == DType::BFloat16;
    // Half precision also under attention=direct (the tensor-core kernel where cuDNN would run)
    // and attention=simt (the SIMT kernel).
    std::vector<const char*> knobs = {"auto"};
    if (half) knobs.insert(knobs.end(), {"direct", "simt"});
    for (const char* attention : knobs) {
      const bool cudnn = half && std::string(attention) == "auto";
      const bool tensor_cores = half && !cudnn && std::string(attention) != "simt";
      check_both_modes(g, "attention", attention, in, label, [&](const char* mode, const compiler::CompiledExecutable& exe,
                                                         const std::string& summary, const Tensor& got) {
        EXPECT_EQ(exe.report().eager_launches, 0) << label << "\n" << summary;
        EXPECT_NE(summary.find(cudnn ? "cuDNN fused flash attention" : "flash kernel"), std::string::npos)
            << label << "\n" << summary;
        EXPECT_EQ(summary.find("tensor cores") != std::string::npos, tensor_cores) << label << "\n" << summary;
        EXPECT_EQ(summary.find("softmax"), std::string::npos) << label << "\n" << summary;
        EXPECT_TRUE(test::close(got.to(DType::Float64), want[0],
                                test::Tolerance::for_dtype(c.dt).scaled(op.tolerance_scale)))
            << label << " " << mode;
        if (c.mask == 2 || c.mask == 3) {
          const Tensor f = got.to(DType::Float32).contiguous();
          const int64_t ev = c.v.back(), H = c.q[1];
          for (int64_t e = 0; e < ev; ++e) EXPECT_TRUE(std::isnan(f.data<float>()[3 * ev + e])) << label << " dead row";
          if (c.mask == 3) {  // batch 1, head 0: rows 5 (a NaN) and 6 (a +inf) NaN, row 4 not
            const float* o = f.data<float>() + H * L * ev;
            for (int64_t e = 0; e < ev; ++e) {
              EXPECT_TRUE(std::isnan(o[5 * ev + e])) << label << " NaN row";
              EXPECT_TRUE(std::isnan(o[6 * ev + e])) << label << " +inf row";
              EXPECT_FALSE(std::isnan(o[4 * ev + e])) << label << " live row";
            }
          }
        }
      });
    }
  }
}

// Note [CUDA attention reads views]: a packed QKV projection split into q, k, v and seen as
// [B, H, S, D] feeds attention with no split kernel and no copies: cuDNN (bfloat16, float16)
// and the direct flash kernel (float32, float64) read the projection's output in place at row
// stride 3E. Batch 2, so the batch stride matters too. Against the float64 reference of the
// whole block on the same rounded inputs, in default and reduce-overhead (bitwise equal).
TEST(CudaAttention, PackedProjectionIsReadInPlace) {
  const int64_t B = 2, S = 197, E = 256, H = 4, D = E / H;
  Generator gen(77);
  for (DType dt : {DType::BFloat16, DType::Float16, DType::Float32, DType::Float64}) {
    const std::string label = dtype_name(dt);
    TensorList in = {Tensor::randn({B, S, E}, gen).to(dt),
                     (Tensor::randn({3 * E, E}, gen) * 0.06).to(dt),
                     (Tensor::randn({3 * E}, gen) * 0.1).to(dt)};
    Graph g;
    ValueId x = g.add_input("x", in[0].type()), w = g.add_input("w", in[1].type());
    ValueId b = g.add_input("b", in[2].type());
    ValueId qkv = g.add_node1(OpId::Linear, {x, w, b}, {}, "in_proj");
    std::vector<ValueId> parts = g.add_node(OpId::Split, {qkv}, {{"sizes", Ints{E, E, E}}, {"dim", int64_t(-1)}}, "split");
    std::vector<ValueId> heads;
    for (size_t i = 0; i < 3; ++i) {
      ValueId r = g.add_node1(OpId::Reshape, {parts[i]}, {{"shape", Ints{B, S, H, D}}}, fmt::format("heads{}", i));
      heads.push_back(g.add_node1(OpId::Transpose, {r}, {{"dim0", int64_t(1)}, {"dim1", int64_t(2)}}, fmt::format("t{}", i)));
    }
    ValueId o = g.add_node1(OpId::ScaledDotProductAttention, heads, {{"is_causal", false}}, "attn");
    g.outputs = {o};
    // The float64 reference: the CPU eager kernels on the float64 copies of the rounded inputs.
    TensorList in64;
    for (const Tensor& t : in) in64.push_back(t.to(DType::Float64));
    Tensor p64 = linear(in64[0], in64[1], in64[2]);
    TensorList pp = split(p64, {E, E, E}, -1);
    auto hd = [&](const Tensor& t) { return transpose(reshape(t, {B, S, H, D}), 1, 2).contiguous(); };
    Tensor want = scaled_dot_product_attention(hd(pp[0]), hd(pp[1]), hd(pp[2]));
    const bool half = dt == DType::Float16 || dt == DType::BFloat16;
    std::vector<const char*> knobs = {"auto"};
    if (half) knobs.push_back("direct");  // the tensor-core kernel reads the views
    for (const char* attention : knobs) {
      const bool cudnn = half && std::string(attention) == "auto";
      check_both_modes(g, "attention", attention, in, label, [&](const char* mode, const compiler::CompiledExecutable& exe,
                                                         const std::string& summary, const Tensor& got) {
        EXPECT_EQ(summary.find("split"), std::string::npos) << label << "\n" << summary;
        EXPECT_EQ(summary.find("copy"), std::string::npos) << label << "\n" << summary;
        EXPECT_EQ(summary.find("reshape"), std::string::npos) << label << "\n" << summary;
        EXPECT_EQ(exe.report().loop_kernels, 0) << label << "\n" << summary;
        EXPECT_NE(summary.find(cudnn ? "cuDNN fused flash attention" : half ? "flash kernel on tensor cores" : "flash kernel"),
                  std::string::npos)
            << label << "\n" << summary;
        // Two library steps (the projection, then attention) in dt: twice attention's tolerance.
        EXPECT_TRUE(test::close(got.to(DType::Float64), want,
                                test::Tolerance::for_dtype(dt).scaled(2 * op_def(OpId::ScaledDotProductAttention).tolerance_scale)))
            << label << " " << mode;
      });
    }
  }
}

// Note [CUDA small-channel convolutions]: a 3-channel 7x7 stride-2 stem with bias, a residual
// and relu (fused into one fused_conv2d by the passes), batch 2 with partial tiles, in the three
// library dtypes: the direct kernel (stem_conv=direct, the default) and cuDNN (stem_conv=cudnn)
// both against float64, in both modes, the replay bitwise equal to the plain run.
TEST(CudaSmallConv, StemRunsTheDirectKernelAndMatchesTheReference) {
  Generator gen(83);
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    TensorList in = {Tensor::randn({2, 3, 45, 50}, gen).to(dt), (Tensor::randn({24, 3, 7, 7}, gen) * 0.2).to(dt),
                     Tensor::randn({24}, gen).to(dt), Tensor::randn({2, 24, 23, 25}, gen).to(dt)};
    Graph g;
    ValueId x = g.add_input("x", in[0].type()), w = g.add_input("w", in[1].type());
    ValueId b = g.add_input("b", in[2].type()), r = g.add_input("r", in[3].type());
    ValueId y = g.add_node1(OpId::Conv2d, {x, w, b},
                            {{"stride", Ints{2, 2}}, {"padding", Ints{3, 3}}, {"dilation", Ints{1, 1}}, {"groups", int64_t(1)}},
                            "stem");
    y = g.add_node1(OpId::Add, {y, r}, {}, "plus");
    y = g.add_node1(OpId::Relu, {y}, {}, "act");
    g.outputs = {g.add_node1(OpId::Cast, {y}, {{"dtype", DType::Float32}}, "out")};
    TensorList in64;
    for (const Tensor& t : in) in64.push_back(t.to(DType::Float64));
    Tensor want = relu(add(conv2d(in64[0], in64[1], in64[2], {2, 2}, {3, 3}), in64[3]));
    for (const char* stem : {"direct", "cudnn"}) {
      const bool direct = std::string(stem) == "direct";
      check_both_modes(g, "stem_conv", stem, in, dtype_name(dt), [&](const char*, const compiler::CompiledExecutable& exe,
                                                                     const std::string& summary, const Tensor& got) {
        EXPECT_EQ(summary.find("small-channel direct kernel") != std::string::npos, direct) << summary;
        EXPECT_EQ(exe.report().library_launches, 1) << summary;  // the convolution, whole
        EXPECT_TRUE(test::close(got.to(DType::Float64), want,
                                test::Tolerance::for_dtype(dt).scaled(op_def(OpId::FusedConv2d).tolerance_scale)))
            << summary;
      });
    }
  }
}

// A float16 / bfloat16 linear of one input row (resnet50's classifier, BERT's pooler with its
// tanh) is a generated GEMV (CudaTarget::policy): one loop kernel with its bias, activation and
// the cast after it, no cuBLASLt call; under gemv=cublaslt it is cuBLASLt's GEMM again. Both
// against the float64 reference on fresh inputs, in default and reduce-overhead (bitwise equal).
TEST(CudaGemv, HalfPrecisionRowLinearsAreGeneratedAndMatchTheReference) {
  Generator gen(79);
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    for (bool tanh_after : {false, true}) {
      const std::string label = fmt::format("{}{}", dtype_name(dt), tanh_after ? " + tanh" : "");
      const int64_t K = tanh_after ? 768 : 2048, N = tanh_after ? 768 : 1000;
      TensorList in = {Tensor::randn({1, K}, gen).to(dt), (Tensor::randn({N, K}, gen) * 0.03).to(dt),
                       Tensor::randn({N}, gen).to(dt)};
      Graph g;
      ValueId x = g.add_input("x", in[0].type()), w = g.add_input("w", in[1].type());
      ValueId b = g.add_input("b", in[2].type());
      ValueId y = g.add_node1(OpId::Linear, {x, w, b}, {}, "fc");
      if (tanh_after) y = g.add_node1(OpId::Tanh, {y}, {}, "act");
      g.outputs = {g.add_node1(OpId::Cast, {y}, {{"dtype", DType::Float32}}, "out")};
      TensorList in64;
      for (const Tensor& t : in) in64.push_back(t.to(DType::Float64));
      Tensor want = linear(in64[0], in64[1], in64[2]);
      if (tanh_after) want = tanh(want);
      for (const char* gemv : {"generated", "cublaslt"}) {
        const bool generated = std::string(gemv) == "generated";
        check_both_modes(g, "gemv", gemv, in, label, [&](const char*, const compiler::CompiledExecutable& exe,
                                                         const std::string& summary, const Tensor& got) {
          EXPECT_EQ(summary.find("gemm") == std::string::npos, generated) << summary;
          // Generated: the GEMV with its bias, tanh and cast, one kernel; else cuBLASLt's GEMM
          // and a kernel for the rest.
          EXPECT_EQ(exe.report().loop_kernels, 1) << summary;
          EXPECT_EQ(exe.report().library_launches, generated ? 0 : 1) << summary;
          // Rounded to dt once (the linear's output), as cuBLASLt rounds it.
          EXPECT_TRUE(test::close(got.to(DType::Float64), want,
                                  test::Tolerance::for_dtype(dt).scaled(op_def(OpId::Linear).tolerance_scale)))
              << summary;
        });
      }
    }
  }
}

// Note [attention writes heads last]: attention whose output is transposed to [B, S, H, D] and
// reshaped for the output projection (BERT's and MultiheadAttention's pattern) writes [B, S, H,
// D] itself — cuDNN through its output strides (bfloat16 and float16 without a mask), the
// tensor-core and SIMT kernels through their output offsets — so no copy kernel runs between it
// and the projection. Against the float64 reference of the block, batch 2 (the batch stride
// matters), in default and reduce-overhead (bitwise equal).
TEST(CudaAttention, OutputWrittenHeadsLastFeedsTheProjection) {
  const int64_t B = 2, S = 77, E = 256, H = 4, D = E / H;
  Generator gen(78);
  for (DType dt : {DType::BFloat16, DType::Float16, DType::Float32}) {
    const std::string label = dtype_name(dt);
    TensorList in = {Tensor::randn({B, H, S, D}, gen).to(dt), Tensor::randn({B, H, S, D}, gen).to(dt),
                     Tensor::randn({B, H, S, D}, gen).to(dt), (Tensor::randn({E, E}, gen) * 0.06).to(dt)};
    Graph g;
    std::vector<ValueId> qkv;
    for (const char* name : {"q", "k", "v"}) qkv.push_back(g.add_input(name, in[qkv.size()].type()));
    ValueId w = g.add_input("w", in[3].type());
    ValueId o = g.add_node1(OpId::ScaledDotProductAttention, qkv, {{"is_causal", false}}, "attn");
    ValueId t = g.add_node1(OpId::Transpose, {o}, {{"dim0", int64_t(1)}, {"dim1", int64_t(2)}}, "heads");
    ValueId r = g.add_node1(OpId::Reshape, {t}, {{"shape", Ints{B, S, E}}}, "merge");
    g.outputs = {g.add_node1(OpId::Linear, {r, w}, {}, "out_proj")};
    TensorList in64;
    for (const Tensor& x : in) in64.push_back(x.to(DType::Float64));
    Tensor want = linear(reshape(transpose(scaled_dot_product_attention(in64[0], in64[1], in64[2]), 1, 2), {B, S, E}), in64[3], Tensor());
    const bool half = dt != DType::Float32;
    std::vector<const char*> knobs = {"auto"};
    if (half) knobs.insert(knobs.end(), {"direct", "simt"});
    for (const char* attention : knobs) {
      check_both_modes(g, "attention", attention, in, label, [&](const char* mode, const compiler::CompiledExecutable& exe,
                                                         const std::string& summary, const Tensor& got) {
        EXPECT_NE(summary.find("output written heads-last"), std::string::npos) << label << "\n" << summary;
        EXPECT_EQ(summary.find("reshape"), std::string::npos) << label << "\n" << summary;
        EXPECT_EQ(exe.report().loop_kernels, 0) << label << "\n" << summary;
        if (half && std::string(attention) == "auto") {
          EXPECT_NE(summary.find("cuDNN fused flash attention"), std::string::npos) << label << "\n" << summary;
        }
        // Two steps (attention, then the projection) in dt: twice attention's tolerance.
        EXPECT_TRUE(test::close(got.to(DType::Float64), want,
                                test::Tolerance::for_dtype(dt).scaled(2 * op_def(OpId::ScaledDotProductAttention).tolerance_scale)))
            << label << " " << mode;
      });
    }
  }
}

}  // namespace

// Note [CUDA programmatic launch]: on sm_90 and later every generated kernel is launched so that
// it may be scheduled before the kernel ahead of it has ended, and waits for it in its first
// statement. Launched so (pdl=on) or plainly (pdl=off, the default), every output is bitwise the same, in
// default mode and in CUDA-graph replays, over calls on fresh inputs: a kernel that read a
// buffer before the kernel writing it had ended would differ somewhere. The launch records say
// which kernels were launched programmatically: all generated ones on sm_90+, none below.
TEST(CudaProgrammaticLaunch, OutputsAreBitwiseThoseOfPlainLaunches) {
  const bool hopper = cuda_device_info(0).sm_major >= 9;
  struct Case {
    const char* model;
    DType precision;
  };
  for (const Case& c : {Case{"bert_base", DType::BFloat16}, Case{"vit_b_16", DType::BFloat16},
                        Case{"resnet18", DType::Float32}, Case{"vfe", DType::Float32},
                        Case{"mlp", DType::Float32}}) {
    SCOPED_TRACE(fmt::format("{} {}", c.model, dtype_name(c.precision)));
    nn::ZooModel model = nn::make_zoo_model(c.model, /*batch=*/1, /*seed=*/21);
    const std::vector<Graph> graphs = test::capture_graphs(model.module, model.inputs);
    ASSERT_EQ(graphs.size(), 1u);
    const Graph& g = graphs[0];
    auto build = [&](const char* mode, const char* pdl) {
      compiler::Options o;
      o.mode = mode;
      o.precision = c.precision;
      o.knobs = compiler::parse_knobs(pdl, "test");
      return compiler::compile(g, Device::cuda(0), o);
    };
    auto plain = build("default", "pdl=off");
    auto overlapped = build("default", "pdl=on");
    auto replayed = build("reduce-overhead", "pdl=on");
    // Which launches are programmatic, by their records.
    auto count = [](compiler::CompiledExecutable& exe, int* kernels) {
      int programmatic = 0;
      *kernels = 0;
      for (const Executable::Launch& l : exe.executable().launches) {
        if (!l.record) continue;
        const LaunchRecord r = l.record();
        const nlohmann::json p = nlohmann::json::parse(r.params);
        if (r.kind == "cuda_kernel") ++*kernels;
        programmatic += p.value("programmatic", false);
        EXPECT_TRUE(r.kind == "cuda_kernel" || !p.contains("programmatic")) << r.kind;
      }
      return programmatic;
    };
    int kernels = 0;
    EXPECT_EQ(count(*plain, &kernels), 0);
    EXPECT_GT(kernels, 0);
    EXPECT_EQ(count(*overlapped, &kernels), hopper ? kernels : 0) << overlapped->summary();
    EXPECT_EQ(count(*replayed, &kernels), hopper ? kernels : 0);
    for (int call = 0; call < 12; ++call) {
      TensorList in = test::graph_test_inputs(g, model.inputs, call == 0, 7100 + uint64_t(call));
      if (call % 2 == 1)
        for (Tensor& t : in) t = t.to(Device::cuda(0));
      TensorList want = plain->run(in);
      TensorList got = overlapped->run(in);
      TensorList again = replayed->run(in);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        if (is_floating(want[i].dtype())) {
          EXPECT_TRUE(test::usable_reference(want[i].to(Device::cpu()))) << "call " << call << " output " << i;
        }
        EXPECT_EQ(test::first_byte_difference(got[i], want[i]), "") << "call " << call << " output " << i;
        EXPECT_EQ(test::first_byte_difference(again[i], want[i]), "")
            << "reduce-overhead call " << call << " output " << i;
      }
    }
  }
}
