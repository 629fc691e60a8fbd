#include "ops/dispatch.h"

#include <algorithm>

#include "ops/kernel_path.h"

#include <fmt/format.h>

namespace kiln {

namespace {
thread_local DispatchHook* t_hook = nullptr;
thread_local OpObserver* t_observer = nullptr;
// Note [Kernel paths]: the note of the kernel now running, and the path of the last call.
thread_local const char* t_path_note = nullptr;
thread_local const char* t_last_path = "";

// Gives the kernel of one call a fresh note and restores the caller's (a kernel calling ops).
struct PathScope {
  const char* saved = t_path_note;
  PathScope() { t_path_note = nullptr; }
  ~PathScope() { t_path_note = saved; }
  void done(const char* fallback) { t_last_path = t_path_note ? t_path_note : fallback; }
};
}

void note_kernel_path(const char* path) { t_path_note = path; }
const char* last_kernel_path() { return t_last_path; }

OpObserver* set_op_observer(OpObserver* observer) {
  OpObserver* prev = t_observer;
  t_observer = observer;
  return prev;
}

DispatchHook* set_dispatch_hook(DispatchHook* hook) {
  DispatchHook* prev = t_hook;
  t_hook = hook;
  return prev;
}
DispatchHook* dispatch_hook() { return t_hook; }

std::string location_str(const std::source_location& loc) {
  std::string_view file = loc.file_name();
  size_t slash = file.rfind('/');
  if (slash != std::string_view::npos) file = file.substr(slash + 1);
  return fmt::format("{}:{}", file, loc.line());
}

std::vector<TensorType> infer_types(const OpDef& def, std::span<const Tensor> inputs,
                                    const Attrs& attrs, std::string_view where) {
  TensorType types[16];
  const TensorType* ptrs[16];
  std::vector<TensorType> big_types;
  std::vector<const TensorType*> big_ptrs;
  std::span<const TensorType* const> in_span;
  if (inputs.size() <= 16) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].defined()) {
        types[i] = inputs[i].type();
        ptrs[i] = &types[i];
      } else {
        ptrs[i] = nullptr;
      }
    }
    in_span = {ptrs, inputs.size()};
  } else {
    big_types.resize(inputs.size());
    big_ptrs.resize(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].defined()) {
        big_types[i] = inputs[i].type();
        big_ptrs[i] = &big_types[i];
      }
    }
    in_span = {big_ptrs.data(), big_ptrs.size()};
  }
  if (!def.infer)
    fail_kind(ErrorKind::NotSupported, "{}: op '{}' has no shape inference registered", where,
              def.name);
  InferContext ctx{def, where, in_span, attrs};
  return def.infer(ctx);
}

std::span<const Tensor> pad_optional_inputs(const OpDef& def, std::span<const Tensor> inputs,
                                            TensorList& storage) {
  // Kernels and decompositions read optional inputs by position (ctx.inputs[2] for a bias);
  // IR text and direct callers may leave trailing optional inputs out (`linear(%x, %w)`), so
  // those slots become undefined tensors.
  if (def.inputs.empty() || def.inputs.back().variadic || inputs.size() >= def.inputs.size())
    return inputs;
  storage.assign(inputs.begin(), inputs.end());
  storage.resize(def.inputs.size());
  return storage;
}

TensorList run_kernel(const OpDef& def, KernelFn kernel, std::span<const Tensor> inputs,
                      const Attrs& attrs, std::span<const TensorType> out_types) {
  TensorList padded;
  inputs = pad_optional_inputs(def, inputs, padded);
  TensorList outputs(out_types.size());
  for (size_t i = 0; i < out_types.size(); ++i)
    if (!is_concrete(out_types[i].shape))  // e.g. an unbound symbol from a symbolic graph
      fail("op '{}': output {} has the symbolic shape {}; bind its symbols to values before "
           "running a kernel", def.name, i, to_string(out_types[i].shape));
  if (!def.is_view) {
    for (size_t i = 0; i < out_types.size(); ++i)
      outputs[i] = Tensor::empty(to_dims(out_types[i].shape, "output shape"), out_types[i].dtype,
                                 out_types[i].device);
  }
  KernelContext ctx{def, inputs, outputs, attrs, out_types};
  kernel(ctx);
  for (size_t i = 0; i < outputs.size(); ++i)
    KILN_ASSERT(outputs[i].defined());
  return outputs;
}

namespace {
// The dtype a CUDA eager kernel's dtype list is judged by: the first defined input's, else
// the first output's (as compiler/bind.cc judges it).
DType primary_dtype(std::span<const Tensor> inputs, std::span<const TensorType> out_types) {
  for (const Tensor& t : inputs)
    if (t.defined()) return t.dtype();
  return out_types.empty() ? DType::Float32 : out_types[0].dtype;
}
bool lists_dtype(const std::vector<DType>& list, DType d) {
  return std::find(list.begin(), list.end(), d) != list.end();
}

TensorList run_op(OpId op, std::span<const Tensor> inputs, const Attrs& attrs,
                  const std::source_location& loc);
}

TensorList call_op(OpId op, std::span<const Tensor> inputs, const Attrs& attrs,
                   const std::source_location& loc) {
  if (t_hook) [[unlikely]] {
    TensorList out;
    if (t_hook->intercept(op, inputs, attrs, out, loc)) return out;
  }
  if (t_observer) [[unlikely]] {
    OpObserver* obs = t_observer;
    obs->op_begin(op, loc);
    struct End {  // op_end even when the op throws, so the profiler's spans stay balanced
      OpObserver* o;
      OpId op;
      ~End() { o->op_end(op); }
    } end{obs, op};
    return run_op(op, inputs, attrs, loc);
  }
  return run_op(op, inputs, attrs, loc);
}

namespace {
TensorList run_op(OpId op, std::span<const Tensor> inputs, const Attrs& attrs,
                  const std::source_location& loc) {
  const OpDef& def = op_def(op);
  // The call site, for error messages only: formatted into a stack buffer so that a successful
  // eager call does not pay a heap allocation for it.
  char where_buf[192];
  std::string_view file = loc.file_name();
  if (size_t slash = file.rfind('/'); slash != std::string_view::npos) file = file.substr(slash + 1);
  auto formatted = fmt::format_to_n(where_buf, sizeof(where_buf), "{}:{}", file, loc.line());
  std::string_view where(where_buf, std::min(formatted.size, sizeof(where_buf)));
  def.check_arity(inputs.size(), where);
  TensorList padded;
  inputs = pad_optional_inputs(def, inputs, padded);
  Attrs canonical = def.canonicalize(attrs, where);
  Device dev = Device::cpu();
  bool first = true;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined()) continue;
    if (!t.has_storage())
      fail("{}: op '{}' input {} is a fake tensor (no data) outside capture", where, def.name, i);
    if (first) {
      dev = t.device();
      first = false;
    } else if (t.device() != dev) {
      fail("{}: op '{}' input {} is on {} but input 0 is on {}; move them to one device",
           where, def.name, i, t.device().str(), dev.str());
    }
  }
  std::vector<TensorType> out_types = infer_types(def, inputs, canonical, where);
  KernelFn kernel = nullptr;
  if (dev.is_cuda()) {
    kernel = def.eager_cuda;
    if (def.eager_cuda_compiled && (!kernel || !lists_dtype(def.eager_cuda_dtypes,
                                                            primary_dtype(inputs, out_types))))
      kernel = def.eager_cuda_compiled;
    if (!kernel && !def.decompose)
      fail_kind(ErrorKind::NotSupported, "{}: op '{}' has no CUDA eager kernel; run it on "
                "the CPU (tensor.to(kiln::Device::cpu()))", where, def.name);
  } else {
    kernel = def.eager_cpu ? def.eager_cpu : def.reference;
  }
  PathScope path;
  if (!kernel) {
    if (!def.decompose)
      fail_kind(ErrorKind::NotSupported, "{}: op '{}' has no CPU kernel", where, def.name);
    TensorList out = def.decompose(inputs, canonical);
    KILN_ASSERT(out.size() == out_types.size());
    path.done("decomposition");
    return out;
  }
  TensorList out = run_kernel(def, kernel, inputs, canonical, out_types);
  path.done(kernel == def.reference ? "reference" : dev.is_cuda() ? "eager_cuda" : "eager_cpu");
  return out;
}
}  // namespace

Tensor call_op1(OpId op, std::span<const Tensor> inputs, const Attrs& attrs,
                const std::source_location& loc) {
  TensorList out = call_op(op, inputs, attrs, loc);
  KILN_ASSERT(out.size() == 1);
  return std::move(out[0]);
}

namespace {
thread_local const std::string* t_node_name = nullptr;
}  // namespace

const std::string* current_node_name() { return t_node_name; }
ScopedNodeName::ScopedNodeName(const std::string* name) : saved_(t_node_name) {
  t_node_name = name && !name->empty() ? name : nullptr;
}
ScopedNodeName::~ScopedNodeName() { t_node_name = saved_; }

}  // namespace kiln
