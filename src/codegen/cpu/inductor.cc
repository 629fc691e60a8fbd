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
#include <cstdio>
#include <cstdlib>
#include <cstring>

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

bool contiguous_geometry(const lower::ViewGeometry& geo) {
  return geo.strides == contiguous_strides(geo.sizes);
}

// Inputs of oneDNN candidates that are non-contiguous views, and inputs of eager-kernel nodes
// that are views of graph inputs, get a copy node (oneDNN wants plain buffers; eager kernels
// are bound to tensors at compile time, and a graph input's memory is only known per call).
void insert_copies(Graph& g, const std::vector<bool>& extern_candidate) {
  std::vector<Node> old = std::move(g.nodes);
  g.nodes.clear();
  std::vector<bool> cand = extern_candidate;
  std::vector<bool> new_cand;
  for (size_t i = 0; i < old.size(); ++i) {
    Node n = std::move(old[i]);
    const OpDef& d = op_def(n.op);
    bool ext = cand[i];
    bool eager = !ext && !d.is_view && !lower::loop_supported(g, n);
    if (ext || eager) {
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        ValueId v = n.inputs[k];
        if (v == kNoValue || g.value(v).kind != ValueKind::NodeOutput) continue;
        if (!op_def(g.nodes[size_t(g.value(v).producer)].op).is_view) continue;
        lower::ViewGeometry geo;
        bool ok = lower::resolve_view(g, v, &geo);
        bool needs = !ok || (ext && !contiguous_geometry(geo)) ||
                     (eager && g.value(geo.base).kind == ValueKind::Input);
        if (!needs) continue;
        ValueId c = g.add_node1(OpId::Copy, {v}, {}, n.name.empty() ? "" : n.name + ".copy");
        new_cand.push_back(false);
        n.inputs[k] = c;
      }
    }
    g.nodes.push_back(std::move(n));
    new_cand.push_back(ext);
    int32_t idx = int32_t(g.nodes.size()) - 1;
    for (size_t o = 0; o < g.nodes.back().outputs.size(); ++o) {
      Value& ov = g.value(g.nodes.back().outputs[o]);
      ov.producer = idx;
      ov.output_index = int32_t(o);
    }
  }
}

// ---- launch states -------------------------------------------------------------------------------

struct LoopState {
  void (*fn)(char* const*);
};
void run_loop(void* s, char* const* b, const Tensor*) { static_cast<LoopState*>(s)->fn(b); }

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
  insert_copies(g, cand);
  std::vector<int32_t> ext_nodes;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    bool c = is_extern_op(n.op) && !lower::small_linear(g, n, opt.small_linear_macs);
    for (ValueId o : n.outputs) c = c && concrete_type(g.type(o));
    if (c) ext_nodes.push_back(int32_t(i));
  }
  lower::OnednnOptions oo;
  oo.allow_blocked = opt.allow_blocked;
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
  std::vector<bool> view_is_copy = lower::planned_view_copies(g);
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

  for (size_t si = 0; si < s.steps.size(); ++si) {
    const lower::Step& st = s.steps[si];
    Executable::Launch l;
    if (st.kind == StepKind::Loop) {
      const lower::LoopKernel& k = s.loops[size_t(st.loop)];
      auto state = std::make_shared<LoopState>();
      state->fn = reinterpret_cast<void (*)(char* const*)>(lib->symbol(unit.symbols[size_t(st.loop)].c_str()));
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
            KILN_ASSERT(contiguous_geometry(geo));
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
  return {exe, rep};
}

// Median seconds per call of `exe` on random inputs.
double time_executable(Executable& exe, int iters) {
  Generator gen(1234);
  TensorList in;
  for (const Executable::InputSpec& s : exe.inputs) {
    if (s.dtype == DType::Float32 || s.dtype == DType::BFloat16 || s.dtype == DType::Float64 ||
        s.dtype == DType::Float16)
      in.push_back(Tensor::randn(s.sizes, gen, s.dtype));
    else
      in.push_back(Tensor::randint(s.sizes, gen, 0, 2, s.dtype));
  }
  TensorList out;
  for (const Executable::OutputSpec& o : exe.outputs) out.push_back(Tensor::empty(o.sizes, o.dtype));
  for (int i = 0; i < 2; ++i) exe.run(in.data(), in.size(), out.data(), out.size());
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    auto a = std::chrono::steady_clock::now();
    exe.run(in.data(), in.size(), out.data(), out.size());
    t.push_back(seconds_since(a));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
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
  // max-autotune: candidates differ in the oneDNN layout policy and in whether small linears
  // are generated; a candidate that changes nothing for this graph is skipped.
  bool has_conv = false, has_linear = false;
  for (const Node& n : graph.nodes) {
    has_conv = has_conv || n.op == OpId::Conv2d || n.op == OpId::ConvTranspose2d || n.op == OpId::FusedConv2d;
    has_linear = has_linear || n.op == OpId::Linear || n.op == OpId::FusedLinear;
  }
  std::vector<InductorOptions> cands;
  std::vector<std::string> names;
  for (bool blocked : {true, false})
    for (int64_t small : {options.small_linear_macs, int64_t(0)}) {
      if (!blocked && !has_conv) continue;
      if (small == 0 && !has_linear) continue;
      InductorOptions o = options;
      o.mode = "default";
      o.allow_blocked = blocked;
      o.small_linear_macs = small;
      cands.push_back(o);
      names.push_back(fmt::format("layout={},gemv={}", blocked ? "blocked" : "plain", small ? "generated" : "onednn"));
    }
  std::string key = "inductor-autotune-v1\n" + toolchain().isa + "\n" +
                    std::to_string(omp_get_max_threads()) + "\n" + print_graph(graph);
  std::string choice;
  if (tuning_get(key, &choice)) {
    for (size_t i = 0; i < cands.size(); ++i)
      if (names[i] == choice) {
        Built b = build(graph, cands[i]);
        b.report.autotune = "cached choice " + choice;
        b.report.compile_s = seconds_since(t0);
        return std::make_unique<InductorGraph>(b.exe, b.report);
      }
  }
  bool bar = options.progress && isatty(2);
  std::vector<Built> built;
  std::vector<double> times;
  std::string log;
  for (size_t i = 0; i < cands.size(); ++i) {
    progress(bar, int(i), int(cands.size()), names[i]);
    built.push_back(build(graph, cands[i]));
    times.push_back(time_executable(*built.back().exe, 15));
    log += fmt::format("{}{} {:.3f} ms", log.empty() ? "" : ", ", names[i], times.back() * 1e3);
  }
  progress(bar, int(cands.size()), int(cands.size()), "done");
  size_t best = size_t(std::min_element(times.begin(), times.end()) - times.begin());
  tuning_put(key, names[best]);
  Built b = std::move(built[best]);
  b.report.autotune = fmt::format("chose {} ({})", names[best], log);
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
