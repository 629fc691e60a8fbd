// Note [The compiler]
// compile(graph, target, options) turns a captured or imported graph into an Executable for one
// target, in phases (each in its own file pair; the header says what it expects and
// guarantees):
//   1. passes (passes/pipeline.h, compiler_pipeline): the default pipeline (constant folding,
//      conv+BN folding, CSE, epilogue fusion into fused_conv2d / fused_linear, DCE), then the
//      decompositions the target asks for (batch_norm, group_norm into pointwise ops and
//      reductions that the loop code fuses), then a cleanup;
//   2. choose kernels (choose_kernels.h): per node, a library kernel, a generated GEMV, loop
//      code, or the op's eager kernel — from the target's support table and policy;
//   3. insert copies (insert_copies.h): views a kernel cannot read get a copy node;
//   4. library kernels (Target::lower_library): built now, with fused epilogues and prepacked
//      weights (CPU: oneDNN primitives; values between convolutions may stay in blocked layouts);
//   5. schedule (lower/scheduler.h): fusion of pointwise chains, reductions with prologue and
//      epilogue, norms, small linears as GEMV reductions;
//   6. memory (assign_memory.h): one arena planned by liveness over the kernel steps, fused
//      intermediates never stored, constants placed for the target;
//   7. emit + build (Target::build_loops): one source unit for the loop kernels, compiled and
//      cached on disk by content hash through the target's toolchain;
//   8. bind (bind.h): the Executable, a flat list of launches over the arena.
// Modes: default and reduce-overhead build the same pre-bound launch list here (a target may
// capture it further, e.g. into a CUDA graph); max-autotune searches the target's
// configurations (autotune.h).
#include "compiler/compile.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "compiler/assign_memory.h"
#include "compiler/autotune.h"
#include "compiler/bind.h"
#include "compiler/choose_kernels.h"
#include "compiler/insert_copies.h"
#include "core/error.h"
#include "ir/verifier.h"
#include "lower/memory_planner.h"
#include "lower/scheduler.h"
#include "passes/autocast.h"
#include "passes/pipeline.h"
#include "runtime/executable.h"

namespace kiln::compiler {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool concrete_type(const TensorType& t) {
  for (size_t i = 0; i < t.shape.size(); ++i)
    if (!t.shape[i].is_concrete()) return false;
  return true;
}

// Phase 1 on a copy of the graph: the optimized graph, with concrete input shapes.
void prepare(Graph& g, const Target& target, DType precision) {
  run_compiler_passes(g, target, precision);
  for (ValueId v : g.inputs)
    if (!concrete_type(g.type(v)))
      throw_error(ErrorKind::NotSupported,
                  fmt::format("compiler: input '%{}' has symbolic shape {}: dynamic shapes are "
                              "not supported yet (compile with concrete shapes)",
                              g.value(v).name, g.type(v).str()));
}

// The target's knobs as given in Options, overridden by a candidate's.
Knobs merge_knobs(const Knobs& given, const Knobs& candidate) {
  Knobs k = given;
  for (const auto& [n, v] : candidate.items) k.set(n, v);
  return k;
}

lower::ScheduleOptions schedule_options(const KernelChoice& choice, const SchedulePolicy& policy,
                                        const Options& options) {
  lower::ScheduleOptions so;
  so.fuse = options.fuse;
  so.gemv_nodes = choice.gemv;
  so.generated_nodes = choice.generated;
  so.grid_sums_channels_inner = policy.grid_sums_channels_inner;
  return so;
}

// KILN_TRACE_MEMORY=1 (passes/pass.h): the compile's phases, after the passes' own lines.
void trace_phase(const char* phase, const Graph& g) {
  if (memory_trace_enabled()) trace_memory(std::string("compile: ") + phase, g);
}

Built build(const Graph& input, const Target& target, const Options& opt, const Knobs& knobs) {
  auto t0 = std::chrono::steady_clock::now();
  trace_phase("start", input);
  CompileReport rep;
  rep.target = target.name();
  rep.library = target.library_name();

  std::unique_ptr<Target::Background> background = target.begin_compile(input, opt);
  Graph g = input;
  prepare(g, target, opt.precision);                                      // 1. passes
  rep.passes_s = seconds_since(t0);
  trace_phase("passes", g);
  rep.precision = dtype_name(opt.precision);
  for (const Node& n : g.nodes) {
    rep.casts += n.op == OpId::Cast;
    rep.low_nodes += opt.precision != DType::Float32 && n.op != OpId::Cast &&
                     g.type(n.outputs[0]).dtype == opt.precision;
  }

  SchedulePolicy policy = target.policy(knobs);
  KernelChoice choice = choose_kernels(g, target, policy);                // 2. choose kernels
  CopiedGraph copied = insert_copies(g, choice, target);                  // 3. insert copies

  auto t1 = std::chrono::steady_clock::now();
  LibraryRequest request;
  request.strided_operands = std::move(copied.strided_operands);
  request.generated = choice.generated;
  std::shared_ptr<LibraryKernels> lib =                                   // 4. library kernels
      target.lower_library(g, copied.library_nodes, std::move(request), knobs);
  rep.library_s = seconds_since(t1);
  trace_phase("library", g);

  t1 = std::chrono::steady_clock::now();
  lower::ScheduleOptions so = schedule_options(choice, policy, opt);      // 5. schedule
  so.extern_nodes.assign(g.nodes.size(), false);
  for (int32_t i : copied.library_nodes) so.extern_nodes[size_t(i)] = lib->lowered(i);
  so.value_strides.resize(g.values.size());
  for (size_t v = 0; v < g.values.size(); ++v) so.value_strides[v] = lib->value_strides(ValueId(v));
  lower::Schedule s = lower::schedule(g, copied.view_is_copy, so);
  if (const char* d = std::getenv("KILN_DUMP_SCHEDULE"); d && *d && std::string(d) != "0") {
    std::string text = lower::schedule_str(g, s);
    for (const lower::LoopKernel& k : s.loops) text += lower::loop_kernel_str(g, k);
    std::fprintf(stderr, "[kiln] schedule of graph '%s':\n%s", g.name.c_str(), text.c_str());
  }
  MemoryAssignment mem = assign_memory(g, s, copied.view_is_copy, *lib, target,  // 6. memory
                                       /*place_constants=*/opt.arch.empty());
  rep.schedule_s = seconds_since(t1);
  trace_phase("memory", g);

  t1 = std::chrono::steady_clock::now();
  LoopBuild loops = target.build_loops(g, s, mem.mem, mem.status, opt, knobs);        // 7. emit + build
  rep.build_s = loops.build_s;
  rep.cache_hit = loops.cache_hit;
  rep.codegen_s = seconds_since(t1);

  t1 = std::chrono::steady_clock::now();
  BoundExecutable bound = bind_executable(g, s, mem, lib, std::move(loops), target,  // 8. bind
                                          opt.arch);
  rep.bind_s = seconds_since(t1);
  trace_phase("bind", g);

  rep.nodes = int(g.nodes.size());
  rep.fused_nodes = s.fused_nodes;
  rep.loop_kernels = bound.loop_kernels;
  rep.vectorized_kernels = bound.vectorized_kernels;
  rep.library_launches = bound.library_launches;
  rep.eager_launches = bound.eager_launches;
  rep.kernels = std::move(bound.kernels);
  rep.arena_bytes = mem.plan.arena_bytes;
  rep.naive_bytes = mem.plan.naive_bytes;
  rep.compile_s = seconds_since(t0);
  return {bound.exe, std::move(rep), std::move(bound.tunable)};
}

}  // namespace

std::vector<std::unique_ptr<Pass>> compiler_passes(const Target& target, DType precision) {
  return compiler_pipeline(
      target.decompositions(), precision,
      [&target](const Graph& g, const Node& n) { return target.keeps_whole(g, n); },
      target.graph_passes(), target.precision_graph_passes());
}

void run_compiler_passes(Graph& g, const Target& target, DType precision) {
  std::vector<std::unique_ptr<Pass>> pipeline = compiler_passes(target, precision);
  std::vector<Pass*> passes;
  for (auto& p : pipeline) passes.push_back(p.get());
  run_passes(g, std::span<Pass* const>(passes));
}

// ---- Knobs ----------------------------------------------------------------------------------

const std::string* Knobs::find(std::string_view name) const {
  for (const auto& [n, v] : items)
    if (n == name) return &v;
  return nullptr;
}

std::string Knobs::get(std::string_view name, std::string_view fallback) const {
  const std::string* v = find(name);
  return v ? *v : std::string(fallback);
}

Knobs& Knobs::set(std::string name, std::string value) {
  for (auto& [n, v] : items)
    if (n == name) {
      v = std::move(value);
      return *this;
    }
  items.emplace_back(std::move(name), std::move(value));
  return *this;
}

std::string Knobs::str() const {
  std::string s;
  for (const auto& [n, v] : items) s += (s.empty() ? "" : ",") + n + "=" + v;
  return s.empty() ? "default" : s;
}

// ---- reports and executables -------------------------------------------------------------------

std::string CompileReport::str() const {
  std::string s = fmt::format(
      "inductor: {} nodes -> {} loop kernels ({} SIMD, {} nodes fused), {} {}, {} eager; "
      "arena {} bytes (naive {}); compile {:.3f} s (passes {:.3f}, {} {:.3f}, schedule "
      "{:.3f}, codegen {:.3f}, C++ {:.3f}{}, bind {:.3f})",
      nodes, loop_kernels, vectorized_kernels, fused_nodes, library_launches, library,
      eager_launches, arena_bytes, naive_bytes, compile_s, passes_s, library, library_s,
      schedule_s, codegen_s, build_s, cache_hit ? ", cache hit" : "", bind_s);
  if (precision != "float32")
    s += fmt::format("; precision {} ({} nodes in {}, {} casts)", precision, low_nodes, precision,
                     casts);
  if (!autotune.empty()) s += "; autotune: " + autotune;
  if (!mode_note.empty()) s += "; " + mode_note;
  return s;
}

CompiledExecutable::CompiledExecutable(std::shared_ptr<Executable> exe, CompileReport report)
    : exe_(std::move(exe)), report_(std::move(report)) {}

TensorList CompiledExecutable::run(const TensorList& inputs) { return exe_->run(inputs); }

void CompiledExecutable::run_into(const TensorList& inputs, TensorList& outputs) {
  bool reuse = outputs.size() == exe_->outputs.size();
  for (size_t i = 0; reuse && i < outputs.size(); ++i)
    reuse = outputs[i].defined() && outputs[i].dtype() == exe_->outputs[i].dtype &&
            outputs[i].sizes() == exe_->outputs[i].sizes &&
            outputs[i].device() == exe_->device() && outputs[i].is_contiguous();
  if (!reuse) {
    outputs.clear();
    for (const Executable::OutputSpec& o : exe_->outputs)
      outputs.push_back(Tensor::empty(o.sizes, o.dtype, exe_->device()));
  }
  exe_->run(inputs.data(), inputs.size(), outputs.data(), outputs.size());
}

std::string CompiledExecutable::summary() const {
  std::string s = report_.str();
  for (const std::string& k : report_.kernels) s += "\n    " + k;
  return s;
}

// ---- the driver -------------------------------------------------------------------------------

Knobs parse_knobs(std::string_view text, const char* where) {
  Knobs k;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string_view::npos) end = text.size();
    std::string_view item = text.substr(at, end - at);
    size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size())
      fail("{}: expected name=value[,name=value...], found '{}'", where, std::string(text));
    k.set(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
    at = end + 1;
  }
  return k;
}

// Note [Inputs in a half dtype]
// Options::input_dtype: every float32 input x of the graph becomes an input of that dtype and
// the graph reads cast(x, float32) where it read x. Under autocast to the same dtype the first
// reader of such an input (ResNet's stem) had a cast to it inserted, and cast(cast(x, f32),
// bf16) of a bfloat16 x is x exactly (algebraic_simplify's exact cast chains): the conversion
// kernel disappears, and the caller's input, its copy into the arena and the input the graph
// holds are half the bytes. A model whose graph reads the input in float32 keeps one cast,
// where its first reader reads it. The results are those of the float32-input graph given the
// input rounded to the dtype (bitwise where the float32 graph would have rounded it anyway).
static void take_inputs_in(Graph& g, DType dt) {
  const size_t before = g.nodes.size();
  std::vector<ValueId> cast_of(g.values.size(), kNoValue);
  for (ValueId x : g.inputs) {
    if (g.type(x).dtype != DType::Float32) continue;
    g.value(x).type.dtype = dt;
    cast_of[size_t(x)] = g.add_node1(OpId::Cast, {x}, {{"dtype", DType::Float32}},
                                     g.value(x).name + " as " + dtype_name(dt));
  }
  if (g.nodes.size() == before) return;
  for (size_t i = 0; i < before; ++i)
    for (ValueId& in : g.nodes[i].inputs)
      if (in != kNoValue && size_t(in) < cast_of.size() && cast_of[size_t(in)] != kNoValue)
        in = cast_of[size_t(in)];
  for (ValueId& o : g.outputs)
    if (size_t(o) < cast_of.size() && cast_of[size_t(o)] != kNoValue) o = cast_of[size_t(o)];
  // The casts first: they read only inputs.
  std::rotate(g.nodes.begin(), g.nodes.begin() + std::ptrdiff_t(before), g.nodes.end());
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (ValueId o : g.nodes[i].outputs) g.values[size_t(o)].producer = int32_t(i);
}

std::unique_ptr<CompiledExecutable> compile(const Graph& given_graph, const Target& target,
                                            const Options& given) {
  Options options = given;
  if (options.input_dtype && *options.input_dtype != DType::BFloat16 &&
      *options.input_dtype != DType::Float16 && *options.input_dtype != DType::Float32)
    fail("compiler: input dtype expected bfloat16 or float16 (float32 keeps the graph's), found {}",
         dtype_name(*options.input_dtype));
  Graph retyped;
  const bool retype = options.input_dtype && *options.input_dtype != DType::Float32;
  if (retype) {
    retyped = given_graph;
    take_inputs_in(retyped, *options.input_dtype);
    verify(retyped);
  }
  const Graph& graph = retype ? retyped : given_graph;
  // KILN_KNOBS=conv=nChw16c,vec=256: a fixed configuration for every compile of the process
  // (experiments, bisecting a slow or wrong choice); explicit Options::knobs win.
  if (const char* env = std::getenv("KILN_KNOBS"); env && *env && options.knobs.items.empty())
    options.knobs = parse_knobs(env, "KILN_KNOBS");
  if (options.mode != "default" && options.mode != "reduce-overhead" &&
      options.mode != "max-autotune")
    fail("compiler: mode expected default | reduce-overhead | max-autotune, found '{}'",
         options.mode);
  check_precision(options.precision, "compiler");
  if (!options.arch.empty()) {
    // A cross-build: the CUDA target reads the architecture as its `arch` knob.
    if (!target.device().is_cuda())
      fail("compiler: arch '{}' is a CUDA architecture; the {} target takes none", options.arch,
           target.name());
    if (options.mode == "max-autotune")
      fail("compiler: max-autotune times candidates on the device; a cross-build (arch '{}') "
           "cannot: use default or reduce-overhead", options.arch);
    options.knobs.set("arch", options.arch);
  }
  Built b = options.mode == "max-autotune"
                ? autotune(graph, target, options,
                           [&](const Knobs& k) { return build(graph, target, options, merge_knobs(options.knobs, k)); })
                : build(graph, target, options, options.knobs);
  // reduce-overhead: where the device has launch overhead to remove, replay a CUDA graph of the
  // launch list (on the CPU the pre-bound launch list already is the reduced form). max-autotune
  // replays its winner the same way, as torch's max-autotune does: the search picks kernels, the
  // replay removes the launches' host cost (on the H200, resnet50 bf16 0.474 ms a call through
  // launches against 0.41 ms replayed).
  if ((options.mode == "reduce-overhead" || options.mode == "max-autotune") &&
      b.exe->device().is_cuda()) {
    std::string why;
    b.report.mode_note +=
        (b.report.mode_note.empty() ? "" : "; ") +
        (b.exe->use_cuda_graph(&why) ? options.mode + ": CUDA graph replay"
                                     : options.mode + ": no CUDA graph (" + why + "); launches as in default");
  }
  return std::make_unique<CompiledExecutable>(b.exe, std::move(b.report));
}

std::unique_ptr<CompiledExecutable> compile(const Graph& graph, Device device,
                                            const Options& options) {
  return compile(graph, target_for(device), options);
}

std::string describe_schedule(const Graph& g, const Target& target, bool fuse) {
  std::vector<bool> view_is_copy = lower::planned_view_copies(g);
  const SchedulePolicy policy = target.policy(Knobs{});
  KernelChoice choice = choose_kernels(g, target, policy);
  Options o;
  o.fuse = fuse;
  lower::ScheduleOptions so = schedule_options(choice, policy, o);
  // Every library candidate as an extern step, without asking the library.
  so.extern_nodes = choice.library;
  lower::Schedule s = lower::schedule(g, view_is_copy, so);
  PlanOptions po;
  po.node_step = s.node_step;
  po.unstored = s.unstored;
  po.in_place_nodes = lower::in_place_safe_nodes(g, s);
  MemoryPlan plan = plan_memory(g, po);
  verify_memory_plan(g, plan, po);
  std::string out = lower::schedule_str(g, s);
  for (const lower::LoopKernel& k : s.loops) out += lower::loop_kernel_str(g, k);
  out += memory_plan_str(g, plan);
  return out;
}

// ---- the "inductor" backend ---------------------------------------------------------------------

namespace {
// The compiler outranks the interpreter: kiln::compile uses it unless told otherwise.
const bool g_registered = [] {
  register_backend(
      "inductor",
      [](const Graph& g, const BackendOptions& o) -> std::unique_ptr<CompiledGraph> {
        Options co;
        co.mode = o.mode;
        co.precision = o.precision;
        Device d = Device::cpu();
        if (o.device) d = *o.device;
        else if (!g.inputs.empty()) d = g.type(g.inputs[0]).device;
        return compile(g, target_for(d), co);
      },
      /*priority=*/10);
  return true;
}();
}  // namespace

}  // namespace kiln::compiler
