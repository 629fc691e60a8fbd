// Eager dispatch: runs one op now. Every op call from the C++ API comes through call_op.
//
// Note [Dispatch]
// call_op(op, inputs, attrs):
//   1. if a DispatchHook is installed on this thread (capture), it may take the call;
//   2. attributes are canonicalized against the schema and types inferred (the validator);
//   3. the kernel is chosen: CUDA inputs -> eager_cuda where it lists the call's dtype, else
//      eager_cuda_compiled (the op compiled alone by the CUDA target, Note [Compiled eager
//      kernels on CUDA]); CPU -> eager_cpu, else reference; else the decomposition (which
//      calls back into call_op);
//   4. non-view ops get preallocated contiguous outputs of the inferred types.
#pragma once
#include <source_location>
#include <span>
#include <string>

#include "core/tensor.h"
#include "ops/op.h"

namespace kiln {

class DispatchHook {
 public:
  virtual ~DispatchHook() = default;
  // Returns true when the hook handled the call (and set `outputs`).
  virtual bool intercept(OpId op, std::span<const Tensor> inputs, const Attrs& attrs,
                         TensorList& outputs, const std::source_location& loc) = 0;
};

// Installs `hook` on this thread; returns the previous one.
DispatchHook* set_dispatch_hook(DispatchHook* hook);
DispatchHook* dispatch_hook();

// RAII: disables the hook on this thread for a scope (capture runs real kernels through it).
class NoDispatchHook {
 public:
  NoDispatchHook() : saved_(set_dispatch_hook(nullptr)) {}
  ~NoDispatchHook() { set_dispatch_hook(saved_); }

 private:
  DispatchHook* saved_;
};

// Op profiler (src/runtime/profiler.h): when one is installed on this thread, call_op reports
// each op it runs (after a DispatchHook declined it), nested decompositions included. Unlike a
// DispatchHook it stays active under NoDispatchHook, so ops run by compiled graphs are seen too.
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual void op_begin(OpId op, const std::source_location& loc) = 0;
  virtual void op_end(OpId op) = 0;  // also called when the op throws
};
// Installs `observer` on this thread; returns the previous one.
OpObserver* set_op_observer(OpObserver* observer);

TensorList call_op(OpId op, std::span<const Tensor> inputs, const Attrs& attrs = {},
                   const std::source_location& loc = std::source_location::current());
Tensor call_op1(OpId op, std::span<const Tensor> inputs, const Attrs& attrs = {},
                const std::source_location& loc = std::source_location::current());
inline Tensor call_op1(OpId op, std::initializer_list<Tensor> inputs, const Attrs& attrs = {},
                       const std::source_location& loc = std::source_location::current()) {
  return call_op1(op, std::span<const Tensor>(inputs.begin(), inputs.size()), attrs, loc);
}

// Infers output types for concrete inputs (validating them); `where` names the call site.
std::vector<TensorType> infer_types(const OpDef& def, std::span<const Tensor> inputs,
                                    const Attrs& canonical_attrs, std::string_view where);

// `inputs`, or a copy in `storage` extended with undefined tensors for the trailing optional
// inputs the caller left out (every kernel may then index inputs by schema position).
std::span<const Tensor> pad_optional_inputs(const OpDef& def, std::span<const Tensor> inputs,
                                            TensorList& storage);

// Runs a specific kernel with preallocated outputs (used by dispatch, the interpreter and tests).
TensorList run_kernel(const OpDef& def, KernelFn kernel, std::span<const Tensor> inputs,
                      const Attrs& canonical_attrs, std::span<const TensorType> out_types);

// Provenance for re-traced graphs: while the interpreter runs a named graph node (an ONNX node,
// a module path), capture names the node it records after it rather than after the
// interpreter's source line. Null when no named node is running on this thread.
const std::string* current_node_name();
class ScopedNodeName {
 public:
  explicit ScopedNodeName(const std::string* name);
  ~ScopedNodeName();
  ScopedNodeName(const ScopedNodeName&) = delete;
  ScopedNodeName& operator=(const ScopedNodeName&) = delete;

 private:
  const std::string* saved_;
};

// "file.cc:123 (function)" for error messages.
std::string location_str(const std::source_location& loc);

}  // namespace kiln
