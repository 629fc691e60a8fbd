// Eager CUDA calls of ops that have no hand-written CUDA kernel, through the CUDA target.
//
// Note [Compiled eager kernels on CUDA]
// The CUDA eager kernels of src/eager/cuda cover the common pointwise ops, casts, copies and
// reductions. Every other op (matmul, conv2d, gather, softmax, comparisons, where, pad, ...)
// runs eagerly on CUDA the way the compiler would run it in a graph: this file attaches
// OpDef::eager_cuda_compiled to every non-view op the CUDA target can take (its support table
// says generated or library, or the compiler pipeline decomposes it), and dispatch (Note
// [Dispatch] in ops/dispatch.cc) calls it when the op has no hand-written kernel for the call's
// dtype. The kernel builds a graph of the one node over the call's input types, compiles it
// for the CUDA target (NVRTC programs and cuBLASLt/cuDNN plans: the same code the compiled
// graphs run, so eager and compiled cannot drift apart) and runs it on the call's device
// tensors, writing the preallocated outputs in place.
//
// Compiled graphs are kept per call signature (op, canonical attributes, each input's dtype
// and sizes) in a process-wide table of at most kMaxEntries; the generated programs are also in
// the on-disk kernel cache, so a new process compiles only what it has not seen. A signature
// that does not compile is remembered with its error, so the NotSupported error naming the op
// is thrown again without compiling again. Bad values (an integer division by zero, an index out
// of range) fail the call with the reference's message (Note [Device status] in
// runtime/executable.h). The first call of a signature pays an NVRTC compile (tens of ms); later
// calls pay a table lookup and the graph's launches, and each waits for the device (the
// Executable synchronizes its stream). Eager mode is for graph breaks, fallback and
// interactive use; compiled graphs remain the fast path.
//
// Ordering: the executable runs on its own stream, which waits for work queued earlier on the
// legacy default stream (where the hand-written eager kernels launch) when it is given device
// tensors (Note [CUDA streams of contexts] in runtime/executable.cc), and the call returns after
// the device finished, so the outputs are ready for whatever runs next. Views are not compiled
// (a compiled graph would return a copy): view ops run their metadata kernel on every device
// (ops/shape.cc).
//
// Bound by compiled graphs: the compiler's bind phase (compiler/bind.cc) uses only
// OpDef::eager_cuda for a node it has no other kernel for, never this fallback, so a node the
// target cannot take still fails at compile time naming the node, and this kernel cannot call
// itself through a graph it compiled.
#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "compiler/compile.h"
#include "compiler/target.h"
#include "core/error.h"
#include "ir/graph.h"
#include "ops/dispatch.h"
#include "ops/kernel_path.h"
#include "ops/op.h"
#include "runtime/executable.h"
#include "targets/cuda/support.h"

namespace kiln::cuda {
namespace {

constexpr size_t kMaxEntries = 4096;

struct Entry {
  std::shared_ptr<compiler::CompiledExecutable> compiled;  // null when it did not compile
  ErrorKind error_kind = ErrorKind::Internal;
  std::string error;
};

struct Table {
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<const Entry>> entries;
};

Table& table() {
  static Table* t = new Table;  // never destroyed: calls may run during static destruction
  return *t;
}

// The call's signature: op, canonical attributes, each input's dtype and sizes.
std::string signature(const KernelContext& ctx) {
  std::string key = fmt::format("{}|{}", int(ctx.op.id), ctx.inputs[0].defined()
                                                             ? ctx.inputs[0].device().str()
                                                             : std::string("-"));
  for (const auto& [name, value] : ctx.attrs.items()) {
    key += '|';
    key += name;
    key += '=';
    key += attr_value_str(value);
  }
  for (const Tensor& t : ctx.inputs) {
    if (!t.defined()) {
      key += "|none";
      continue;
    }
    key += fmt::format("|{}[", dtype_name(t.dtype()));
    for (int64_t s : t.sizes()) key += fmt::format("{},", s);
    key += ']';
  }
  return key;
}

std::shared_ptr<const Entry> compile_entry(const KernelContext& ctx, Device device) {
  auto e = std::make_shared<Entry>();
  Graph g;
  g.name = fmt::format("eager_{}", ctx.op.name);
  std::vector<ValueId> ids;
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    const Tensor& t = ctx.inputs[i];
    if (!t.defined()) {
      ids.push_back(kNoValue);
      continue;
    }
    TensorType ty = t.type();
    ty.device = device;
    ids.push_back(g.add_input(fmt::format("in{}", i), ty));
  }
  try {
    std::vector<ValueId> outs = g.add_node(ctx.op.id, ids, ctx.attrs, ctx.op.name);
    for (ValueId o : outs) g.outputs.push_back(o);
    compiler::Options options;
    options.progress = false;
    e->compiled = compiler::compile(g, device, options);
  } catch (const Error& err) {
    e->error_kind = err.kind();
    e->error = err.message();
  }
  return e;
}

thread_local int t_depth = 0;

void run_compiled_eager(const KernelContext& ctx) {
  Device device = ctx.outputs.empty() || !ctx.outputs[0].defined() ? Device::cuda(0)
                                                                   : ctx.outputs[0].device();
  for (const Tensor& t : ctx.inputs)
    if (t.defined()) {
      device = t.device();
      break;
    }
  // A compiled graph never calls this kernel (see the Note), so nesting means a bug.
  if (t_depth > 0)
    fail_kind(ErrorKind::Internal, "internal error: op '{}' on CUDA: the compiled eager kernel "
              "was re-entered while compiling or running a graph", ctx.op.name);
  struct Depth {  // around the compile and the run only (a decomposition dispatches again)
    Depth() { ++t_depth; }
    ~Depth() { --t_depth; }
  };

  const std::string key = signature(ctx);
  Table& tab = table();
  std::shared_ptr<const Entry> entry;
  {
    std::lock_guard<std::mutex> lock(tab.mu);
    auto it = tab.entries.find(key);
    if (it != tab.entries.end()) entry = it->second;
  }
  if (!entry) {
    // Compiled outside the lock: two threads meeting on a new signature both compile it (the
    // kernel cache makes the second cheap) and one result is kept.
    {
      Depth depth;
      entry = compile_entry(ctx, device);
    }
    std::lock_guard<std::mutex> lock(tab.mu);
    if (tab.entries.size() >= kMaxEntries) tab.entries.clear();  // in-flight calls keep theirs
    tab.entries.emplace(key, entry);
  }
  if (!entry->compiled) {
    if (entry->error_kind == ErrorKind::NotSupported && ctx.op.decompose) {
      // The target cannot take these inputs as one node, but the op's decomposition may run
      // (each of its ops dispatched eagerly in turn).
      TensorList out = ctx.op.decompose(ctx.inputs, ctx.attrs);
      KILN_ASSERT(out.size() == ctx.outputs.size());
      for (size_t i = 0; i < out.size(); ++i) ctx.outputs[i] = std::move(out[i]);
      note_kernel_path("decomposition");
      return;
    }
    DType dt = ctx.outputs.empty() ? DType::Float32 : ctx.outputs[0].dtype();
    for (const Tensor& t : ctx.inputs)
      if (t.defined()) {
        dt = t.dtype();
        break;
      }
    fail_kind(entry->error_kind, "op '{}' on CUDA with {} inputs (eager, through the CUDA "
              "compiler): {}{}", ctx.op.name, dtype_name(dt), entry->error,
              entry->error_kind == ErrorKind::NotSupported
                  ? "; run the op on the CPU (tensor.to(kiln::Device::cpu()))"
                  : "");
  }
  Executable& exe = entry->compiled->executable();
  // The executable's inputs are the defined ones, in order.
  Tensor stack_inputs[16];
  std::vector<Tensor> heap_inputs;
  Tensor* in = stack_inputs;
  size_t n = 0;
  for (const Tensor& t : ctx.inputs) n += t.defined() ? 1 : 0;
  if (n > std::size(stack_inputs)) {
    heap_inputs.resize(n);
    in = heap_inputs.data();
  }
  size_t k = 0;
  for (const Tensor& t : ctx.inputs)
    if (t.defined()) in[k++] = t;
  {
    Depth depth;
    exe.run(in, n, ctx.outputs.data(), ctx.outputs.size());
  }
  note_kernel_path("eager_cuda_compiled");
}

void attach_compiled_eager_kernels() {
  // The support table rather than the registered target: this extension may run during static
  // initialization, before target.cc registers the target. The ops the compiler pipeline
  // decomposes on CUDA (CudaTarget::decompositions) have rows of their own here too.
  // Records through define_op only: all_ops() / op_def() would wait for the registry that is
  // being built right now (its call_once), on this thread.
  const compiler::OpSupportTable& support = cuda_support();
  for (int i = 0; i < kNumOps; ++i) {
    OpDef& op = define_op(OpId(i));
    if (op.is_view) continue;
    const compiler::OpSupport& s = support[size_t(i)];
    if (!s.generated && !s.library && !op.decompose) continue;
    op.eager_cuda_compiled = &run_compiled_eager;
  }
}

const bool g_registered =
    register_op_extension("cuda-eager-compiled", &attach_compiled_eager_kernels);

}  // namespace
}  // namespace kiln::cuda
