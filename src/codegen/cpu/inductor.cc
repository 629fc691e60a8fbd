// Note [The CPU compiler]
// compile_inductor turns a captured or imported graph into an Executable:
//   1. passes: the default pipeline (constant folding, conv+BN folding, CSE, epilogue fusion
//      into fused_conv2d / fused_linear, DCE), then batch_norm / group_norm decomposed into
//      pointwise ops and reductions that the loop code fuses;
//   2. extern choice: conv / deconv / linear / matmul / pooling become oneDNN primitives created
//      now, with fused post-ops and prepacked weights (lower/onednn_lowering); values between
//      convolutions may stay in oneDNN's blocked layouts. Views feeding a primitive that are not
//      contiguous get an explicit copy node first;
//   3. scheduling and fusion (lower/scheduler): pointwise chains, reductions with prologue and
//      epilogue, norms (two passes), small linears as generated GEMV reductions;
//   4. memory planning over the kernel schedule: one arena, buffers reused by liveness, fused
//      intermediates never stored;
//   5. code generation: one C++ translation unit (codegen/cpu/codegen), compiled and cached on
//      disk by content hash (codegen/cpu/toolchain);
//   6. the Executable: a flat list of launches over the arena.
// Anything the loop code or oneDNN cannot run runs its eager kernel, bound once to arena
// tensors. Modes: default and reduce-overhead build the same pre-bound launch list (on CPU there
// is no launch overhead left to remove); max-autotune compiles the candidate configurations,
// times them on random inputs, keeps the fastest and records the choice in the tuning store, so
// that a later compile of the same graph on the same machine reuses it without timing.
#include "codegen/cpu/inductor.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#include <fmt/format.h>

#include "capture/compile.h"
#include "codegen/cpu/codegen.h"
#include "codegen/cpu/toolchain.h"
#include "core/error.h"
#include "eager/dispatch.h"
#include "ir/printer.h"
#include "lower/memory_planner.h"
#include "lower/onednn_lowering.h"
#include "lower/scheduler.h"
#include "passes/decompose.h"
#include "passes/pass.h"
#include "runtime/executable.h"

namespace kiln::codegen {

using lower::Schedule;
using lower::StepKind;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool is_extern_op(OpId op) {
  switch (op) {
    case OpId::Conv2d: case OpId::FusedConv2d: case OpId::ConvTranspose2d: case OpId::Linear:
    case OpId::FusedLinear: case OpId::Matmul: case OpId::MaxPool2d: case OpId::AvgPool2d:
      return true;
    default: return false;
  }
}

bool concrete_type(const TensorType& t) {
  for (size_t i = 0; i < t.shape.size(); ++i)
    if (!t.shape[i].is_concrete()) return false;
  return true;
}

// Strides of size-1 dims never address anything: rewritten to the extent of the dims inside
// them (the contiguous value when those are contiguous), so that a transpose involving a
// size-1 dim counts as contiguous, and oneDNN sees batches that do not overlap (its brgemm
// matmul takes such strides; with a smaller one it falls back to its gemm kernel).
Dims normalized_strides(const lower::ViewGeometry& geo) {
  Dims st = geo.strides;
  int64_t extent = 1;
  for (size_t i = geo.sizes.size(); i-- > 0;) {
    if (geo.sizes[i] == 1) st[i] = extent;
    extent = std::max(extent, st[i] * geo.sizes[i]);
  }
  return st;
}

bool contiguous_geometry(const lower::ViewGeometry& geo) {
  return normalized_strides(geo) == contiguous_strides(geo.sizes);
}

// A matmul operand view oneDNN can read in place: rank >= 2, non-negative strides, and one of
// the two matrix dims contiguous (row- or column-major matrices, any batch strides). See Note
// [strided matmul operands] in lower/onednn_lowering.cc.
bool matmul_strided_operand(const lower::ViewGeometry& geo) {
  size_t r = geo.sizes.size();
  if (r < 2 || geo.strides.size() != r) return false;
  Dims st = normalized_strides(geo);
  for (int64_t x : st)
    if (x < 0) return false;
  return st[r - 1] == 1 || st[r - 2] == 1;
}

// What insert_copies leaves for the lowering and the scheduler.
struct CopiedGraph {
  std::vector<int32_t> extern_nodes;  // the oneDNN candidates, as node indices of the new graph
  std::vector<bool> view_is_copy;     // per value: the memory planner materializes this view
  std::vector<lower::StridedOperand> matmul_strides;  // view operands matmul reads in place
};

// Inputs of oneDNN candidates that are non-contiguous views (except matmul operands oneDNN
// reads with their strides), and inputs of eager-kernel nodes that are views of graph inputs,
// get a copy node (oneDNN wants plain buffers; eager kernels are bound to tensors at compile
// time, and a graph input's memory is only known per call). Views are resolved as the schedule
// will resolve them: views the memory planner materializes are their own base. That decision
// depends on a view's producers, not its consumers, so the copy nodes added here (which are not
// views) leave it unchanged for every other value.
CopiedGraph insert_copies(Graph& g, const std::vector<bool>& extern_candidate) {
  CopiedGraph out;
  out.view_is_copy = lower::planned_view_copies(g);
  std::vector<Node> old = std::move(g.nodes);
  g.nodes.clear();
  for (size_t i = 0; i < old.size(); ++i) {
    Node n = std::move(old[i]);
    const OpDef& d = op_def(n.op);
    bool ext = extern_candidate[i];
    bool eager = !ext && !d.is_view && !lower::loop_supported(g, n);
    size_t strided_before = out.matmul_strides.size();
    if (ext || eager) {
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        ValueId v = n.inputs[k];
        if (v == kNoValue || g.value(v).kind != ValueKind::NodeOutput) continue;
        if (!op_def(g.nodes[size_t(g.value(v).producer)].op).is_view) continue;
        lower::ViewGeometry geo;
        bool ok = lower::resolve_view(g, v, out.view_is_copy, &geo);
        bool contiguous = ok && contiguous_geometry(geo);
        bool strided = ext && n.op == OpId::Matmul && k < 2 && ok && !contiguous &&
                       matmul_strided_operand(geo);
        if (strided) {
          Dims st = normalized_strides(geo);
          out.matmul_strides.push_back({-1, int(k), std::vector<int64_t>(st.begin(), st.end())});
        }
        bool needs = !ok || (ext && !contiguous && !strided) ||
                     (eager && g.value(geo.base).kind == ValueKind::Input);
        if (!needs) continue;
        n.inputs[k] = g.add_node1(OpId::Copy, {v}, {}, n.name.empty() ? "" : n.name + ".copy");
      }
    }
    g.nodes.push_back(std::move(n));
    int32_t idx = int32_t(g.nodes.size()) - 1;
    if (ext) out.extern_nodes.push_back(idx);
    for (size_t j = strided_before; j < out.matmul_strides.size(); ++j) out.matmul_strides[j].node = idx;
    for (size_t o = 0; o < g.nodes.back().outputs.size(); ++o) {
      Value& ov = g.value(g.nodes.back().outputs[o]);
      ov.producer = idx;
      ov.output_index = int32_t(o);
    }
  }
  out.view_is_copy.resize(g.values.size(), false);  // the copies' outputs
  return out;
}

// ---- launch states -------------------------------------------------------------------------------

struct LoopState {
  void (*fn)(char* const*, int);
  int threads = 0;  // see Note [kernel threads] in codegen.cc
};
void run_loop(void* s, char* const* b, const Tensor*) {
  auto* l = static_cast<LoopState*>(s);
  l->fn(b, l->threads);
}

struct ExternState {
  const lower::OnednnLowering* lowering = nullptr;
  int32_t node = -1;
  int n_in = 0;
  MemRef in[4];
  MemRef out;
  char* scratch = nullptr;
};
void run_extern(void* s, char* const* b, const Tensor*) {
  auto* e = static_cast<ExternState*>(s);
  const void* ptrs[4] = {nullptr, nullptr, nullptr, nullptr};
  for (int i = 0; i < e->n_in; ++i)
    if (e->in[i].slot >= 0) ptrs[i] = b[e->in[i].slot] + e->in[i].byte_offset;
  e->lowering->run(e->node, ptrs, b[e->out.slot] + e->out.byte_offset, e->scratch);
}

struct FallbackState {
  const OpDef* def = nullptr;
  KernelFn fn = nullptr;
  Attrs attrs;
  TensorList inputs;
  TensorList outputs;
  std::vector<TensorType> out_types;
  std::vector<int> from_input;  // per input: graph input index, or -1
  // Per input taken from a graph input through a view: its geometry (sizes empty: direct).
  std::vector<lower::ViewGeometry> input_view;
  std::string where;
};
void run_fallback(void* s, char* const*, const Tensor* call_inputs) {
  auto* f = static_cast<FallbackState*>(s);
  for (size_t k = 0; k < f->from_input.size(); ++k) {
    if (f->from_input[k] < 0) continue;
    const lower::ViewGeometry& v = f->input_view[k];
    const Tensor& t = call_inputs[f->from_input[k]];
    // A view of a graph input is rebuilt per call (one small allocation; rare: copies are
    // inserted for the common cases).
    f->inputs[k] = v.sizes.empty() ? t : t.as_strided(v.sizes, v.strides, t.offset() + v.offset);
  }
  KernelContext ctx{*f->def, f->inputs, f->outputs, f->attrs, f->out_types};
  f->fn(ctx);
}

struct Built {
  std::shared_ptr<Executable> exe;
  InductorReport report;
  // Loop kernels whose thread count can be chosen: launch index and its state.
  std::vector<std::pair<size_t, LoopState*>> tunable;
  std::vector<int> tunable_default;  // their default thread counts (0 = all, 1)
};

Built build(const Graph& input, const InductorOptions& opt) {
  auto t0 = std::chrono::steady_clock::now();
  Graph g = input;
  std::vector<std::string> pipeline = default_pipeline();
  run_passes(g, pipeline);
  DecomposeOptions dopt;
  dopt.ops = {OpId::BatchNorm, OpId::GroupNorm, OpId::ScaledDotProductAttention};
  decompose_ops(g, dopt);
  std::vector<std::string> cleanup = {"constant-fold", "cse", "dce"};
  run_passes(g, cleanup);
  InductorReport rep;
  rep.passes_s = seconds_since(t0);

  for (ValueId v : g.inputs)
    if (!concrete_type(g.type(v)))
      throw_error(ErrorKind::NotSupported,
                  fmt::format("inductor: input '%{}' has symbolic shape {}: dynamic shapes are "
                              "not supported yet (compile with concrete shapes)",
                              g.value(v).name, g.type(v).str()));

  std::vector<bool> cand(g.nodes.size(), false);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    cand[i] = is_extern_op(n.op) && !lower::small_linear(g, n, opt.small_linear_macs);
    for (ValueId o : n.outputs) cand[i] = cand[i] && concrete_type(g.type(o));
  }
  CopiedGraph copied = insert_copies(g, cand);
  const std::vector<int32_t>& ext_nodes = copied.extern_nodes;
  const std::vector<bool>& view_is_copy = copied.view_is_copy;
  lower::OnednnOptions oo;
  oo.allow_blocked = opt.allow_blocked;
  oo.matmul_strides = std::move(copied.matmul_strides);
  oo.conv = opt.conv_policy;
  auto t1 = std::chrono::steady_clock::now();
  auto onednn = std::make_shared<lower::OnednnLowering>(g, ext_nodes, oo);
  rep.onednn_s = seconds_since(t1);
  t1 = std::chrono::steady_clock::now();
  lower::ScheduleOptions so;
  so.fuse = opt.fuse;
  so.small_linear_macs = opt.small_linear_macs;
  so.extern_nodes.assign(g.nodes.size(), false);
  for (int32_t i : ext_nodes) so.extern_nodes[size_t(i)] = onednn->lowered(i);

  // The planner decides which views are materialized; the schedule follows it.
  Schedule s = lower::schedule(g, view_is_copy, so);

  if (const char* d = std::getenv("KILN_DUMP_SCHEDULE"); d && *d && std::string(d) != "0") {
    std::string text = lower::schedule_str(g, s);
    for (const lower::LoopKernel& k : s.loops) text += lower::loop_kernel_str(g, k);
    std::fprintf(stderr, "[kiln] schedule of graph '%s':\n%s", g.name.c_str(), text.c_str());
  }
  PlanOptions po;
  po.node_step = s.node_step;
  po.unstored = s.unstored;
  po.in_place_nodes = lower::in_place_safe_nodes(g, s);
  po.bytes_override.assign(g.values.size(), -1);
  for (size_t v = 0; v < g.values.size(); ++v)
    if (onednn->blocked(ValueId(v))) po.bytes_override[v] = onednn->value_bytes(ValueId(v));
  MemoryPlan plan = plan_memory(g, po);
  verify_memory_plan(g, plan, po);
  for (size_t v = 0; v < g.values.size(); ++v)
    if ((plan.values[v].kind == PlanKind::Copy) != view_is_copy[v])
      throw_error(ErrorKind::Internal,
                  fmt::format("inductor: the memory plan changed its view decision for '%{}'",
                              g.values[v].name));

  // Slots: 0 arena, then graph inputs, then every param/const.
  auto exe = std::make_shared<Executable>();
  std::vector<MemRef> mem(g.values.size());
  int slot = 1;
  std::vector<std::pair<int, char*>> fixed;
  for (size_t i = 0; i < g.inputs.size(); ++i) mem[size_t(g.inputs[i])] = {slot++, 0};
  for (size_t v = 0; v < g.values.size(); ++v) {
    Value& val = g.values[v];
    if (val.kind != ValueKind::Param && val.kind != ValueKind::Const) continue;
    if (!val.data.defined())
      throw_error(ErrorKind::InvalidArgument,
                  fmt::format("inductor: parameter '%{}' has no data (IR text declares weights by "
                              "type only; load them before compiling)", val.name));
    Tensor d = val.data.is_contiguous() && val.data.device().is_cpu() ? val.data
                                                                     : val.data.to(Device::cpu()).contiguous();
    exe->keep_alive.push_back(std::make_shared<Tensor>(d));
    fixed.emplace_back(slot, static_cast<char*>(d.raw_data()));
    val.data = d;
    mem[v] = {slot++, 0};
  }
  for (size_t v = 0; v < g.values.size(); ++v) {
    const ValuePlan& p = plan.values[v];
    if (g.values[v].kind != ValueKind::NodeOutput) continue;
    if (p.buffer >= 0 && !s.virtual_view[v]) mem[v] = {0, p.offset};
  }
  // Virtual views: their base's memory (loop kernels add the view offset themselves).
  for (size_t v = 0; v < g.values.size(); ++v)
    if (s.virtual_view[v]) mem[v] = mem[size_t(s.views[v].base)];

  rep.schedule_s = seconds_since(t1);
  t1 = std::chrono::steady_clock::now();
  CpuCodegenOptions co;
  co.vectorize = opt.vectorize;
  co.vector_bits = opt.vector_bits;
  co.reduce_unroll = opt.reduce_unroll;
  co.inject_error_into = opt.inject_error_into;
  CpuUnit unit = generate_cpu(g, s, mem, g.name, co);
  std::shared_ptr<LoadedLibrary> lib;
  if (!s.loops.empty()) {
    lib = compile_cxx({unit.source, g.name.empty() ? "graph" : g.name, {}});
    exe->keep_alive.push_back(lib);
    rep.cxx_s = lib->compile_seconds();
    rep.cache_hit = lib->cache_hit();
  } else {
    rep.cache_hit = true;
  }

  rep.codegen_s = seconds_since(t1);
  t1 = std::chrono::steady_clock::now();
  exe->init(plan.arena_bytes, slot);
  for (auto& [sl, p] : fixed) exe->set_slot(sl, p);
  exe->keep_alive.push_back(onednn);
  std::shared_ptr<char> scratch;
  if (onednn->scratchpad_bytes() > 0) {
    size_t bytes = size_t((onednn->scratchpad_bytes() + 63) / 64 * 64);
    scratch = std::shared_ptr<char>(static_cast<char*>(std::aligned_alloc(64, bytes)), [](char* q) { std::free(q); });
    exe->keep_alive.push_back(scratch);
  }

  // A tensor over the memory of value v (arena values and views of them, params).
  auto tensor_of = [&](ValueId v) -> Tensor {
    const Value& val = g.value(v);
    if (val.kind == ValueKind::Param || val.kind == ValueKind::Const) return val.data;
    lower::ViewGeometry geo;
    if (s.virtual_view[size_t(v)]) {
      geo = s.views[size_t(v)];
    } else {
      geo.base = v;
      geo.sizes = Dims();
      for (size_t i = 0; i < val.type.shape.size(); ++i) geo.sizes.push_back(val.type.shape[i].value());
      geo.strides = contiguous_strides(geo.sizes);
    }
    const Value& base = g.value(geo.base);
    if (base.kind == ValueKind::Param || base.kind == ValueKind::Const)
      return base.data.as_strided(geo.sizes, geo.strides, geo.offset);
    const MemRef& m = mem[size_t(geo.base)];
    KILN_ASSERT(m.slot == 0);
    Dims bs;
    for (size_t i = 0; i < base.type.shape.size(); ++i) bs.push_back(base.type.shape[i].value());
    Tensor t = Tensor::from_blob(exe->arena() + m.byte_offset, bs, base.type.dtype);
    return t.as_strided(geo.sizes, geo.strides, geo.offset);
  };

  std::vector<std::pair<size_t, LoopState*>> tunable;
  std::vector<int> tunable_default;
  for (size_t si = 0; si < s.steps.size(); ++si) {
    const lower::Step& st = s.steps[si];
    Executable::Launch l;
    if (st.kind == StepKind::Loop) {
      const lower::LoopKernel& k = s.loops[size_t(st.loop)];
      auto state = std::make_shared<LoopState>();
      state->fn = reinterpret_cast<void (*)(char* const*, int)>(lib->symbol(unit.symbols[size_t(st.loop)].c_str()));
      int dt = unit.default_threads[size_t(st.loop)];
      state->threads = std::max(dt, 0);
      if (dt >= 0) {
        tunable.push_back({exe->launches.size(), state.get()});
        tunable_default.push_back(dt);
      }
      l.fn = run_loop;
      l.state = state.get();
      exe->keep_alive.push_back(state);
      l.name = k.name;
      l.kind = "loop";
      for (int32_t n : k.nodes)
        l.nodes += (l.nodes.empty() ? "" : ", ") + std::string(op_def(g.nodes[size_t(n)].op).name) +
                   " '" + g.nodes[size_t(n)].name + "'";
      rep.loop_kernels++;
      if (unit.vectorized[size_t(st.loop)]) rep.vectorized_kernels++;
      rep.kernels.push_back(fmt::format("{} [{}{}]: {}", k.name, lower::loop_kind_name(k.kind),
                                        unit.vectorized[size_t(st.loop)] ? ", SIMD" : "", l.nodes));
    } else {
      const Node& n = g.nodes[size_t(st.node)];
      l.nodes = std::string(op_def(n.op).name) + " '" + n.name + "'";
      if (st.kind == StepKind::Extern) {
        auto state = std::make_shared<ExternState>();
        state->lowering = onednn.get();
        state->node = st.node;
        state->n_in = int(std::min<size_t>(n.inputs.size(), 4));
        for (int k = 0; k < state->n_in; ++k) {
          ValueId v = n.inputs[size_t(k)];
          if (v == kNoValue) continue;
          const Value& val = g.value(v);
          if (val.kind == ValueKind::Param || val.kind == ValueKind::Const) continue;
          MemRef m = mem[size_t(v)];
          if (s.virtual_view[size_t(v)]) {
            const lower::ViewGeometry& geo = s.views[size_t(v)];
            // Non-contiguous: a matmul operand read with its strides (the lowering knows them).
            KILN_ASSERT(contiguous_geometry(geo) || (n.op == OpId::Matmul && k < 2));
            m.byte_offset += geo.offset * dtype_size(val.type.dtype);
          }
          state->in[k] = m;
        }
        state->out = mem[size_t(n.outputs[0])];
        state->scratch = scratch.get();
        l.fn = run_extern;
        l.state = state.get();
        exe->keep_alive.push_back(state);
        l.name = fmt::format("{}:{}", op_def(n.op).name, n.name);
        l.kind = "onednn";
        rep.onednn_launches++;
        rep.kernels.push_back(fmt::format("{} [oneDNN]: {}", l.name, onednn->describe(st.node)));
      } else {
        const OpDef& d = op_def(n.op);
        auto state = std::make_shared<FallbackState>();
        state->def = &d;
        state->fn = d.eager_cpu ? d.eager_cpu : d.reference;
        if (!state->fn)
          throw_error(ErrorKind::NotSupported,
                      fmt::format("inductor: op '{}' (node '{}') has no CPU kernel", d.name, n.name));
        state->attrs = n.attrs;
        size_t ni = std::max(n.inputs.size(), d.inputs.size());
        state->inputs.resize(ni);
        state->from_input.assign(ni, -1);
        state->input_view.resize(ni);
        for (size_t k = 0; k < n.inputs.size(); ++k) {
          ValueId v = n.inputs[k];
          if (v == kNoValue) continue;
          ValueId root = s.virtual_view[size_t(v)] ? s.views[size_t(v)].base : v;
          if (g.value(root).kind == ValueKind::Input) {
            state->from_input[k] = int(std::find(g.inputs.begin(), g.inputs.end(), root) - g.inputs.begin());
            if (root != v) state->input_view[k] = s.views[size_t(v)];
            continue;
          }
          state->inputs[k] = tensor_of(v);
        }
        for (ValueId o : n.outputs) {
          state->out_types.push_back(g.type(o));
          state->outputs.push_back(tensor_of(o));
        }
        state->where = n.name;
        l.fn = run_fallback;
        l.state = state.get();
        exe->keep_alive.push_back(state);
        l.name = fmt::format("{}:{}", d.name, n.name);
        l.kind = "eager";
        rep.eager_launches++;
        rep.kernels.push_back(fmt::format("{} [eager kernel]", l.name));
      }
    }
    exe->launches.push_back(std::move(l));
  }

  for (size_t i = 0; i < g.inputs.size(); ++i) {
    Executable::InputSpec in;
    const Value& v = g.value(g.inputs[i]);
    in.name = v.name;
    in.dtype = v.type.dtype;
    for (size_t d = 0; d < v.type.shape.size(); ++d) in.sizes.push_back(v.type.shape[d].value());
    in.slot = mem[size_t(g.inputs[i])].slot;
    exe->inputs.push_back(std::move(in));
  }
  for (ValueId o : g.outputs) {
    Executable::OutputSpec os;
    const Value& v = g.value(o);
    os.dtype = v.type.dtype;
    for (size_t d = 0; d < v.type.shape.size(); ++d) os.sizes.push_back(v.type.shape[d].value());
    MemRef m = mem[size_t(o)];
    if (s.virtual_view[size_t(o)]) {
      const lower::ViewGeometry& geo = s.views[size_t(o)];
      if (contiguous_geometry(geo)) {
        m.byte_offset += geo.offset * dtype_size(v.type.dtype);
      } else {  // a strided view of a buffer: copied out element by element
        os.strides = geo.strides;
        os.view_offset = geo.offset;
        const TensorType& bt = g.type(geo.base);
        for (size_t d = 0; d < bt.shape.size(); ++d) os.base_sizes.push_back(bt.shape[d].value());
      }
    }
    if (m.slot < 0)
      throw_error(ErrorKind::Internal, fmt::format("inductor: graph output '%{}' has no memory", v.name));
    os.slot = m.slot;
    os.byte_offset = m.byte_offset;
    exe->outputs.push_back(std::move(os));
  }

  rep.bind_s = seconds_since(t1);
  rep.nodes = int(g.nodes.size());
  rep.fused_nodes = s.fused_nodes;
  rep.arena_bytes = plan.arena_bytes;
  rep.naive_bytes = plan.naive_bytes;
  rep.compile_s = seconds_since(t0);
  return {exe, rep, std::move(tunable), std::move(tunable_default)};
}

// Random inputs for `exe` (normal floats; small non-negative integers elsewhere).
TensorList random_inputs(const Executable& exe, uint64_t seed) {
  Generator gen(seed);
  TensorList in;
  for (const Executable::InputSpec& s : exe.inputs) {
    if (is_floating(s.dtype))
      in.push_back(Tensor::randn(s.sizes, gen, s.dtype));
    else
      in.push_back(Tensor::randint(s.sizes, gen, 0, 2, s.dtype));
  }
  return in;
}

// max |a - b| / max |b| over all outputs (compared in float64).
double max_relative_error(const TensorList& a, const TensorList& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!is_floating(b[i].dtype())) continue;
    Tensor x = a[i].to(DType::Float64).contiguous(), y = b[i].to(DType::Float64).contiguous();
    const double* px = x.data<double>();
    const double* py = y.data<double>();
    for (int64_t k = 0; k < y.numel(); ++k) {
      double d = std::fabs(px[k] - py[k]);
      if (!(d <= diff)) diff = d;  // NaN sticks
      scale = std::max(scale, std::fabs(py[k]));
    }
  }
  return diff / std::max(scale, 1e-30);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds per call of each executable over `rounds` rounds on `in`, interleaved: one call
// of every executable per round (after a warm-up round), so that a burst of load on the machine
// hits them all alike. `on_round(r)` runs before timed round r.
std::vector<double> time_interleaved(const std::vector<Executable*>& exes, const TensorList& in,
                                     int rounds, const std::function<void(int)>& on_round = {}) {
  std::vector<TensorList> outs(exes.size());
  for (size_t j = 0; j < exes.size(); ++j)
    for (const Executable::OutputSpec& o : exes[j]->outputs) outs[j].push_back(Tensor::empty(o.sizes, o.dtype));
  std::vector<std::vector<double>> t(exes.size());
  for (int r = -1; r < rounds; ++r) {
    if (r >= 0 && on_round) on_round(r);
    for (size_t j = 0; j < exes.size(); ++j) {
      auto a = std::chrono::steady_clock::now();
      exes[j]->run(in.data(), in.size(), outs[j].data(), outs[j].size());
      if (r >= 0) t[j].push_back(seconds_since(a));
    }
  }
  std::vector<double> med;
  for (std::vector<double>& v : t) med.push_back(median(std::move(v)));
  return med;
}

// Chooses the thread count of every tunable loop kernel of `b` (1 or all of OpenMP's threads)
// by timing each kernel alone in both settings, alternating their order, after a full run of
// the graph on `in` before each round (so buffers hold realistic data); median of `rounds`. A
// setting replaces the default only when it is at least 5% faster. Returns the counts in launch
// order ("0" = all) and appends what changed to *log.
std::string tune_kernel_threads(Built& b, const TensorList& in, int rounds, std::string* log) {
  int maxt = omp_get_max_threads();
  size_t nk = b.tunable.size();
  if (maxt <= 1 || nk == 0) return "";
  Executable& exe = *b.exe;
  TensorList out;
  for (const Executable::OutputSpec& o : exe.outputs) out.push_back(Tensor::empty(o.sizes, o.dtype));
  std::vector<std::vector<double>> t1(nk), tn(nk);
  for (int r = 0; r < rounds; ++r) {
    exe.run(in.data(), in.size(), out.data(), out.size());
    for (size_t k = 0; k < nk; ++k) {
      auto [launch, state] = b.tunable[k];
      for (int pass = 0; pass < 2; ++pass) {
        bool one = (pass == 0) == (r % 2 == 0);
        state->threads = one ? 1 : 0;
        auto a = std::chrono::steady_clock::now();
        exe.run_launch(launch, in.data());
        (one ? t1 : tn)[k].push_back(seconds_since(a));
      }
    }
  }
  std::string counts, changed;
  int nchanged = 0;
  for (size_t k = 0; k < nk; ++k) {
    auto [launch, state] = b.tunable[k];
    double m1 = median(t1[k]), mn = median(tn[k]);
    bool dflt_all = b.tunable_default[k] == 0;
    double dflt = dflt_all ? mn : m1, other = dflt_all ? m1 : mn;
    bool use_all = other < 0.95 * dflt ? !dflt_all : dflt_all;
    state->threads = use_all ? 0 : 1;
    counts += (k ? "," : "") + std::to_string(state->threads);
    if (use_all != dflt_all) {
      ++nchanged;
      changed += fmt::format("{}{} {} ({:.1f} vs {:.1f} us)", changed.empty() ? "" : ", ",
                             exe.launches[launch].name, use_all ? "all threads" : "1 thread",
                             (use_all ? mn : m1) * 1e6, (use_all ? m1 : mn) * 1e6);
    }
  }
  *log += fmt::format("; kernel threads: {} of {} tunable loop kernels changed from the default{}{}",
                      nchanged, nk, changed.empty() ? "" : ": ", changed);
  return counts;
}

// Applies thread counts from tune_kernel_threads; false when they do not fit `b`.
bool apply_kernel_threads(Built& b, const std::string& counts) {
  std::vector<int> v;
  size_t at = 0;
  while (at < counts.size()) {
    size_t end = counts.find(',', at);
    if (end == std::string::npos) end = counts.size();
    std::string item = counts.substr(at, end - at);
    if (item != "0" && item != "1") return false;
    v.push_back(item == "1" ? 1 : 0);
    at = end + 1;
  }
  if (v.size() != b.tunable.size()) return false;
  for (size_t k = 0; k < v.size(); ++k) b.tunable[k].second->threads = v[k];
  return true;
}

void progress(bool on, int done, int total, const std::string& what) {
  if (!on) return;
  int width = 24, fill = total ? done * width / total : width;
  std::fprintf(stderr, "\r[kiln] autotuning [%s%s] %d/%d %s\033[K", std::string(size_t(fill), '#').c_str(),
               std::string(size_t(width - fill), '.').c_str(), done, total, what.c_str());
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

}  // namespace

std::string InductorReport::str() const {
  std::string s = fmt::format(
      "inductor: {} nodes -> {} loop kernels ({} SIMD, {} nodes fused), {} oneDNN, {} eager; "
      "arena {} bytes (naive {}); compile {:.3f} s (passes {:.3f}, oneDNN {:.3f}, schedule "
      "{:.3f}, codegen {:.3f}, C++ {:.3f}{}, bind {:.3f})",
      nodes, loop_kernels, vectorized_kernels, fused_nodes, onednn_launches, eager_launches,
      arena_bytes, naive_bytes, compile_s, passes_s, onednn_s, schedule_s, codegen_s, cxx_s,
      cache_hit ? ", cache hit" : "", bind_s);
  if (!autotune.empty()) s += "; autotune: " + autotune;
  return s;
}

InductorGraph::InductorGraph(std::shared_ptr<Executable> exe, InductorReport report)
    : exe_(std::move(exe)), report_(std::move(report)) {}

TensorList InductorGraph::run(const TensorList& inputs) { return exe_->run(inputs); }

void InductorGraph::run_into(const TensorList& inputs, TensorList& outputs) {
  bool reuse = outputs.size() == exe_->outputs.size();
  for (size_t i = 0; reuse && i < outputs.size(); ++i)
    reuse = outputs[i].defined() && outputs[i].dtype() == exe_->outputs[i].dtype &&
            outputs[i].sizes() == exe_->outputs[i].sizes && outputs[i].device().is_cpu();
  if (!reuse) {
    outputs.clear();
    for (const Executable::OutputSpec& o : exe_->outputs) outputs.push_back(Tensor::empty(o.sizes, o.dtype));
  }
  exe_->run(inputs.data(), inputs.size(), outputs.data(), outputs.size());
}

std::string InductorGraph::summary() const {
  std::string s = report_.str();
  for (const std::string& k : report_.kernels) s += "\n    " + k;
  return s;
}

// Note [autotuning]
// max-autotune builds whole-graph candidates and times each (median of 15 calls on one set of
// random inputs, after 2 warm-up calls):
//   conv=auto | nChw16c | nChw16c+winograd | plain   (graphs with convolutions; see Note
//       [convolution policy] in lower/onednn_lowering.cc; winograd only when some convolution is
//       3x3 f32)
//   gemv=generated | onednn                          (graphs with small linears)
// then code-generation variants of the fastest candidate's loop kernels (256-bit vectors on
// AVX-512, 4 accumulators per SIMD reduction: ",vec=256" / ",unroll=4" when one wins by 3%),
// and, inside the result, the thread count of every parallel loop kernel (see
// tune_kernel_threads). Candidates are whole graphs because layouts interact across neighbours.
// A candidate that rounds differently from the default compile (Winograd) is first run on the
// same inputs as the first candidate (the default configuration) and rejected when its outputs
// differ by more than `autotune_tolerance` relative to the largest reference output; the report
// lists every candidate with its time or rejection. The choice is persisted in the tuning store
// under the ISA, the thread count and the graph's text, so the next compile of the same graph on
// the same machine builds only the chosen candidate.
std::unique_ptr<InductorGraph> compile_inductor(const Graph& graph, const InductorOptions& options) {
  if (options.mode != "default" && options.mode != "reduce-overhead" &&
      options.mode != "max-autotune")
    fail("inductor: mode expected default | reduce-overhead | max-autotune, found '{}'",
         options.mode);
  auto t0 = std::chrono::steady_clock::now();
  if (options.mode != "max-autotune") {
    Built b = build(graph, options);
    return std::make_unique<InductorGraph>(b.exe, b.report);
  }
  // max-autotune: see Note [autotuning].
  bool has_conv = false, has_wino = false, has_small_linear = false;
  for (const Node& n : graph.nodes) {
    bool conv = n.op == OpId::Conv2d || n.op == OpId::ConvTranspose2d || n.op == OpId::FusedConv2d;
    has_conv = has_conv || conv;
    if (n.op == OpId::Conv2d || n.op == OpId::FusedConv2d) {
      const TensorType& w = graph.type(n.inputs[1]);
      has_wino = has_wino || (w.dtype == DType::Float32 && w.shape.size() == 4 &&
                              w.shape[2] == SymInt(3) && w.shape[3] == SymInt(3));
    }
    has_small_linear = has_small_linear || lower::small_linear(graph, n, options.small_linear_macs);
  }
  // Convolution policies matter only where convolutions are a real part of the work: ViT's
  // patch embedding is <1% of its multiply-adds, and three extra whole-graph candidates would
  // cost ~10 s of compile time there for nothing measurable. Skipped below 5% of the MACs of
  // convolutions + linears + matmuls (counted from the types; unknown with symbolic shapes).
  std::string conv_note;
  if (has_conv) {
    double conv_macs = 0, gemm_macs = 0;
    bool known = true;
    auto numel_of = [&](const TensorType& t) {
      double e = 1;
      for (const SymInt& d : t.shape) {
        if (d.is_symbolic()) known = false;
        else e *= double(d.value());
      }
      return e;
    };
    for (const Node& n : graph.nodes) {
      if (n.outputs.empty() || n.inputs.size() < 2) continue;
      const TensorType& out = graph.type(n.outputs[0]);
      const TensorType& w = graph.type(n.inputs[1]);
      if (n.op == OpId::Conv2d || n.op == OpId::FusedConv2d || n.op == OpId::ConvTranspose2d) {
        if (w.shape.size() != 4) continue;
        // conv: out numel x (C/g x kh x kw); deconv: in numel x (O/g x kh x kw), the same count.
        const TensorType& in = graph.type(n.inputs[0]);
        double per = numel_of(w) / (w.shape[0].is_symbolic() ? 1.0 : double(w.shape[0].value()));
        conv_macs += (n.op == OpId::ConvTranspose2d ? numel_of(in) : numel_of(out)) * per;
      } else if (n.op == OpId::Linear || n.op == OpId::FusedLinear || n.op == OpId::Matmul) {
        const TensorType& x = graph.type(n.inputs[0]);
        if (x.shape.empty() || x.shape.back().is_symbolic()) {
          known = false;
          continue;
        }
        gemm_macs += numel_of(out) * double(x.shape.back().value());
      }
    }
    if (known && conv_macs < 0.05 * (conv_macs + gemm_macs)) {
      has_conv = false;
      conv_note = fmt::format("; convolution policies not tried (convolutions are {:.1f}% of the "
                              "multiply-adds)", 100.0 * conv_macs / (conv_macs + gemm_macs));
    }
  }
  struct Candidate {
    InductorOptions o;
    std::string name;
    bool exact;  // computes what the default compile computes (same algorithms)
  };
  std::vector<Candidate> cands;
  const std::pair<const char*, lower::ConvPolicy> layouts[] = {
      {"auto", lower::ConvPolicy::Auto},
      {"nChw16c", lower::ConvPolicy::Blocked16},
      {"nChw16c+winograd", lower::ConvPolicy::Winograd},
      {"plain", lower::ConvPolicy::Auto}};
  for (size_t li = 0; li < 4; ++li) {
    if (li > 0 && !has_conv) continue;
    if (layouts[li].second == lower::ConvPolicy::Winograd && !has_wino) continue;
    for (int64_t small : {options.small_linear_macs, int64_t(0)}) {
      if (small == 0 && !has_small_linear) continue;
      Candidate c{options, "", layouts[li].second != lower::ConvPolicy::Winograd};
      c.o.mode = "default";
      c.o.allow_blocked = li != 3;
      c.o.conv_policy = layouts[li].second;
      c.o.small_linear_macs = small;
      // Names say only what varies for this graph.
      if (has_conv) c.name = fmt::format("conv={}", layouts[li].first);
      if (has_small_linear)
        c.name += fmt::format("{}gemv={}", has_conv ? "," : "", small ? "generated" : "onednn");
      if (c.name.empty()) c.name = "default";
      cands.push_back(std::move(c));
    }
  }
  std::string key = "inductor-autotune-v4\n" + toolchain().isa + "\n" +
                    std::to_string(omp_get_max_threads()) + "\n" + print_graph(graph);
  std::string record;  // "NAME" or "NAME\nTHREADS" (see tune_kernel_threads)
  if (tuning_get(key, &record)) {
    std::string choice = record.substr(0, record.find('\n'));
    std::string counts = record.find('\n') == std::string::npos ? "" : record.substr(record.find('\n') + 1);
    // Code-generation variant suffixes (see below): ",vec=256" and/or ",unroll=4".
    std::string base = choice;
    auto strip = [&](const char* suffix) {
      size_t n = std::strlen(suffix);
      bool has = base.size() > n && base.compare(base.size() - n, n, suffix) == 0;
      if (has) base.resize(base.size() - n);
      return has;
    };
    bool unroll4 = strip(",unroll=4");
    bool vec256 = strip(",vec=256");
    for (Candidate c : cands)
      if (c.name == base) {
        if (vec256) c.o.vector_bits = 256;
        if (unroll4) c.o.reduce_unroll = 4;
        Built b = build(graph, c.o);
        b.report.autotune = "cached choice " + choice;
        if (!counts.empty() && apply_kernel_threads(b, counts))
          b.report.autotune += fmt::format(
              "; cached kernel threads ({} loop kernels, {} on one thread)", b.tunable.size(),
              std::count_if(b.tunable.begin(), b.tunable.end(),
                            [](const auto& t) { return t.second->threads == 1; }));
        b.report.compile_s = seconds_since(t0);
        return std::make_unique<InductorGraph>(b.exe, b.report);
      }
  }
  bool bar = options.progress && isatty(2);
  const int rounds = 15;
  int steps = int(cands.size()) + rounds, step = 0;
  std::vector<Built> built;
  std::vector<std::string> notes(cands.size());
  std::vector<bool> rejected(cands.size(), false);
  TensorList in;
  TensorList reference;  // outputs of the first (exact) candidate on `in`
  for (size_t i = 0; i < cands.size(); ++i) {
    progress(bar, step++, steps, "building " + cands[i].name);
    built.push_back(build(graph, cands[i].o));
    Executable& exe = *built.back().exe;
    if (i == 0) in = random_inputs(exe, 1234);
    TensorList out = exe.run(in);
    if (i == 0) reference = out;
    double err = cands[i].exact ? 0 : max_relative_error(out, reference);
    if (err > options.autotune_tolerance) {
      rejected[i] = true;
      notes[i] = fmt::format(" rejected (relative error {:.1e} > {:.0e})", err, options.autotune_tolerance);
    } else if (!cands[i].exact) {
      notes[i] = fmt::format(" (relative error {:.1e})", err);
    }
  }
  // The candidates that were not rejected, timed together (a lone candidate is not timed).
  std::vector<double> times(cands.size(), std::numeric_limits<double>::infinity());
  if (cands.size() > 1) {
    std::vector<Executable*> timed;
    std::vector<size_t> which;
    for (size_t i = 0; i < cands.size(); ++i)
      if (!rejected[i]) {
        timed.push_back(built[i].exe.get());
        which.push_back(i);
      }
    std::vector<double> med = time_interleaved(timed, in, rounds, [&](int r) {
      progress(bar, step++, steps, fmt::format("timing round {}/{}", r + 1, rounds));
    });
    for (size_t j = 0; j < which.size(); ++j) times[which[j]] = med[j];
  }
  std::string log;
  for (size_t i = 0; i < cands.size(); ++i)
    log += fmt::format("{}{}{}{}", log.empty() ? "" : ", ", cands[i].name,
                       rejected[i]          ? ""
                       : cands.size() == 1 ? " the only candidate"
                                           : fmt::format(" {:.3f} ms", times[i] * 1e3),
                       notes[i]);
  progress(bar, int(cands.size()), int(cands.size()), "done");
  size_t best = cands.size() == 1 ? 0 : size_t(std::min_element(times.begin(), times.end()) - times.begin());
  Built b = std::move(built[best]);
  std::string name = cands[best].name;
  built.clear();  // the other candidates' arenas and primitives
  // Code-generation variants of the chosen candidate's loop kernels: vector width (on AVX-512,
  // 8-lane AVX2 vectors too: Zen 4 executes 512-bit operations as two 256-bit halves, and
  // memory-bound kernels may prefer the narrower loop) and, where there are SIMD reduce
  // kernels, 4 accumulators per reduction instead of 1. Each variant must agree with the
  // reference (lanes and accumulators combine in another order), then all are timed in
  // interleaved rounds; a variant replaces the current one only when at least 3% faster.
  std::string vec_log;
  {
    bool wide = b.report.vectorized_kernels > 0 && toolchain().isa.find("avx512") != std::string::npos;
    bool reduces = false;
    for (const std::string& k : b.report.kernels) reduces = reduces || k.find("[reduce, SIMD]") != std::string::npos;
    struct Variant {
      int bits, unroll;
      std::string suffix;
    };
    std::vector<Variant> variants;
    for (int bits : {0, 256})
      for (int unroll : {1, 4}) {
        if (bits == 0 && unroll == 1) continue;  // the current one
        if ((bits == 256 && !wide) || (unroll > 1 && !reduces)) continue;
        variants.push_back({bits, unroll, std::string(bits == 256 ? ",vec=256" : "") +
                                              (unroll > 1 ? ",unroll=4" : "")});
      }
    std::vector<Built> vb;
    std::vector<std::string> vnames = {"current"};
    std::vector<Executable*> exes = {b.exe.get()};
    for (const Variant& v : variants) {
      InductorOptions o = cands[best].o;
      o.vector_bits = v.bits;
      o.reduce_unroll = v.unroll;
      Built bv = build(graph, o);
      double err = max_relative_error(bv.exe->run(in), reference);
      if (err > options.autotune_tolerance) {
        vec_log += fmt::format("{}{} rejected (relative error {:.1e})", vec_log.empty() ? "; variants: " : ", ",
                               v.suffix.substr(1), err);
        continue;
      }
      vnames.push_back(v.suffix);
      vb.push_back(std::move(bv));
      exes.push_back(vb.back().exe.get());
    }
    if (exes.size() > 1) {
      std::vector<double> med = time_interleaved(exes, in, rounds);
      for (size_t j = 0; j < exes.size(); ++j) {
        vec_log += fmt::format("{}{} {:.3f} ms", vec_log.empty() ? "; variants: " : ", ",
                               j == 0 ? "512-bit" : vnames[j].substr(1), med[j] * 1e3);
      }
      size_t pick = 0;
      for (size_t j = 1; j < exes.size(); ++j)
        if (med[j] < 0.97 * med[0] && med[j] < med[pick]) pick = j;
      if (pick > 0) {
        b = std::move(vb[pick - 1]);
        name += vnames[pick];
      }
    }
  }
  std::string threads_log;
  std::string counts = tune_kernel_threads(b, in, rounds, &threads_log);
  tuning_put(key, counts.empty() ? name : name + "\n" + counts);
  b.report.autotune = fmt::format("chose {} ({}){}{}{}", name, log, conv_note, vec_log, threads_log);
  b.report.compile_s = seconds_since(t0);
  return std::make_unique<InductorGraph>(b.exe, b.report);
}

BackendFactory inductor_backend() {
  return [](const Graph& g, const CompileOptions& o) -> std::unique_ptr<CompiledGraph> {
    InductorOptions io;
    io.mode = o.mode;
    return compile_inductor(g, io);
  };
}

}  // namespace kiln::codegen
