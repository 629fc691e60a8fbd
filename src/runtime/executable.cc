// Note [Executable]
// A compiled graph runs as: bind the input pointers into the slot table, call each launch in
// order, copy the outputs out. Everything else — kernel addresses, arena offsets, library
// kernels with their prepacked weights, the eager kernels' prebuilt argument lists — was
// resolved at compile time, so a steady-state call does no heap allocation, no hash lookup and
// no dispatch beyond one indirect call per launch. The arena is owned by the executable: calls
// on one executable must not overlap (capture serializes them).
//
// CUDA. The arena lives on the device; the executable has its own (blocking) stream, so its
// work is ordered with the legacy default stream that eager CUDA kernels use. Inputs already on
// the device are bound in place; host inputs are copied into a staging buffer of their own (one
// async copy each). Launches enqueue on the stream; outputs are copied (asynchronously, on the
// stream) into the tensors the caller gives — on the device or the host — and the call waits
// for the stream before it returns, so the outputs are the caller's, complete, and nothing of a
// later call can overwrite them (the rule torch's CUDA-graph outputs lack).
// reduce-overhead (use_cuda_graph): the first run captures the launch list into a CUDA graph,
// with every input copied into its staging buffer (fixed addresses); later runs copy the inputs
// in, replay the graph and copy the outputs out: one graph launch instead of one launch per
// kernel.
#include "runtime/executable.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "core/allocator.h"
#include "core/cuda_runtime.h"
#include "core/error.h"

namespace kiln {

namespace {
thread_local Executable::LaunchTimer* t_timer = nullptr;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw_error(ErrorKind::Runtime, fmt::format("executable: {} failed: {}", what, cudaGetErrorString(e)));
  }
}
}  // namespace

Executable::LaunchTimer* Executable::set_launch_timer(LaunchTimer* t) {
  LaunchTimer* prev = t_timer;
  t_timer = t;
  return prev;
}

std::shared_ptr<char> allocate_host_arena(int64_t arena_bytes) {
  size_t bytes = size_t((arena_bytes + 63) / 64 * 64);
  if (bytes == 0) bytes = 64;
  char* p = static_cast<char*>(std::aligned_alloc(64, bytes));
  if (!p)
    throw_error(ErrorKind::Runtime,
                fmt::format("executable: cannot allocate the {}-byte arena", arena_bytes));
  std::memset(p, 0, bytes);
  return std::shared_ptr<char>(p, [](char* q) { std::free(q); });
}

// Through the CUDA caching allocator (core/allocator.h), so that its statistics — what
// `kiln bench` reports as peak device memory — include arenas, weights and staging buffers.
std::shared_ptr<char> allocate_device_arena(int64_t arena_bytes, int index) {
  require_cuda_device(index, "allocate_device_arena");
  check(cudaSetDevice(index), "cudaSetDevice");
  size_t bytes = size_t((arena_bytes + 255) / 256 * 256);
  if (bytes == 0) bytes = 256;
  Allocator* a = cuda_allocator(index);
  void* p = nullptr;
  try {
    p = a->allocate(bytes);
  } catch (const Error& e) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    cudaGetLastError();
    throw_error(ErrorKind::Runtime,
                fmt::format("executable: out of device memory for the {}-byte arena on cuda:{} "
                            "({} bytes free of {}): {}",
                            arena_bytes, index, free_b, total_b, e.message()));
  }
  check(cudaMemset(p, 0, bytes), "cudaMemset of the arena");
  return std::shared_ptr<char>(static_cast<char*>(p), [a, bytes](char* q) { a->deallocate(q, bytes); });
}

Executable::~Executable() {
  if (graph_exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph_exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  if (stream_) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
}

void Executable::init(std::shared_ptr<char> arena, int64_t arena_bytes, int num_slots,
                      Device device) {
  KILN_ASSERT(arena);
  arena_bytes_ = arena_bytes;
  arena_owner_ = std::move(arena);
  arena_ = arena_owner_.get();
  slots_.assign(size_t(num_slots), nullptr);
  slots_[0] = arena_;
  device_ = device;
  if (device.is_cuda()) {
    check(cudaSetDevice(device.index), "cudaSetDevice");
    cudaStream_t s = nullptr;
    check(cudaStreamCreate(&s), "cudaStreamCreate");
    stream_ = s;
  }
}

void Executable::check_inputs(const Tensor* in, size_t num_inputs, size_t num_outputs) const {
  if (num_inputs != inputs.size())
    fail("compiled graph: expected {} inputs, got {}", inputs.size(), num_inputs);
  if (num_outputs != outputs.size())
    fail("compiled graph: expected {} outputs, got {}", outputs.size(), num_outputs);
  for (size_t i = 0; i < num_inputs; ++i) {
    const InputSpec& s = inputs[i];
    const Tensor& t = in[i];
    bool device_ok = t.defined() && (t.device().is_cpu() || t.device() == device_);
    if (!t.defined() || t.dtype() != s.dtype || t.sizes() != s.sizes || !device_ok)
      fail("compiled graph: input {} ('{}') expected a {}{} tensor of shape {}, got {}", i,
           s.name, device_.is_cpu() ? "cpu " : fmt::format("cpu or {} ", device_.str()),
           dtype_name(s.dtype), to_string(s.sizes),
           t.defined() ? fmt::format("{} {} on {}", dtype_name(t.dtype()), to_string(t.sizes()),
                                     t.device().str())
                       : std::string("an undefined tensor"));
  }
}

void Executable::run_launches(const Tensor* args) {
  RunContext ctx{slots_.data(), args, stream_};
  if (t_timer) {
    for (const Launch& l : launches) {
      t_timer->launch_begin(l);
      l.fn(l.state, ctx);
      t_timer->launch_end(l);
    }
  } else {
    for (const Launch& l : launches) l.fn(l.state, ctx);
  }
}

void Executable::run_launch(size_t i, const Tensor* inputs) {
  RunContext ctx{slots_.data(), inputs, stream_};
  launches[i].fn(launches[i].state, ctx);
}

void Executable::run(const Tensor* in, size_t num_inputs, Tensor* out, size_t num_outputs) {
  check_inputs(in, num_inputs, num_outputs);
  if (device_.is_cuda())
    run_cuda(in, num_inputs, out, num_outputs);
  else
    run_cpu(in, num_inputs, out, num_outputs);
}

void Executable::run_cpu(const Tensor* in, size_t num_inputs, Tensor* out, size_t num_outputs) {
  // Non-contiguous inputs are copied (kept alive for the call by this array's scope).
  Tensor staged[8];
  Tensor* heap_staged = nullptr;
  std::unique_ptr<Tensor[]> heap_owner;
  if (num_inputs > 8) {
    heap_owner.reset(new Tensor[num_inputs]);
    heap_staged = heap_owner.get();
  }
  const Tensor* args = in;
  for (size_t i = 0; i < num_inputs; ++i) {
    const InputSpec& s = inputs[i];
    const Tensor& t = in[i];
    const Tensor* use = &t;
    if (!t.is_contiguous()) {
      Tensor* st = heap_staged ? heap_staged : staged;
      st[i] = t.contiguous();
      use = &st[i];
      args = st;  // eager launches see the staged copies
    }
    slots_[size_t(s.slot)] = static_cast<char*>(use->raw_data());
  }
  if (args != in)
    for (size_t i = 0; i < num_inputs; ++i) {
      Tensor* st = heap_staged ? heap_staged : staged;
      if (!st[i].defined()) st[i] = in[i];
    }
  run_launches(args);
  char* const* b = slots_.data();
  for (size_t i = 0; i < num_outputs; ++i) {
    const OutputSpec& o = outputs[i];
    Tensor& t = out[i];
    if (!t.defined() || t.dtype() != o.dtype || t.sizes() != o.sizes || !t.device().is_cpu())
      fail("compiled graph: output {} expected a cpu {} tensor of shape {}", i, dtype_name(o.dtype),
           to_string(o.sizes));
    const char* src = b[o.slot] + o.byte_offset;
    if (!o.strides.empty()) {
      Tensor base = Tensor::from_blob(const_cast<char*>(src), o.base_sizes, o.dtype);
      t.copy_(base.as_strided(o.sizes, o.strides, o.view_offset));
    } else if (t.is_contiguous()) {
      std::memcpy(t.raw_data(), src, t.nbytes());
    } else {
      Tensor view = Tensor::from_blob(const_cast<char*>(src), o.sizes, o.dtype);
      t.copy_(view);
    }
  }
}

bool Executable::use_cuda_graph(std::string* why) {
  if (!device_.is_cuda()) {
    if (why) *why = "CUDA graphs are for CUDA executables";
    return false;
  }
  for (const Launch& l : launches)
    if (l.kind == "eager") {
      if (why)
        *why = fmt::format("launch '{}' runs an eager kernel on the legacy default stream, which "
                           "a stream capture cannot include", l.name);
      return false;
    }
  graph_requested_ = true;
  return true;
}

void Executable::run_cuda(const Tensor* in, size_t num_inputs, Tensor* out, size_t num_outputs) {
  cudaStream_t s = static_cast<cudaStream_t>(stream_);
  check(cudaSetDevice(device_.index), "cudaSetDevice");
  if (staging_.empty() && num_inputs > 0) {
    // One device block for all inputs that may need staging (host inputs, every input in graph
    // mode), 256-byte aligned each.
    std::vector<int64_t> off(num_inputs);
    int64_t total = 0;
    for (size_t i = 0; i < num_inputs; ++i) {
      off[i] = total;
      total += (int64_t(numel(inputs[i].sizes)) * dtype_size(inputs[i].dtype) + 255) / 256 * 256;
    }
    staging_owner_ = allocate_device_arena(total, device_.index);
    for (size_t i = 0; i < num_inputs; ++i) staging_.push_back(staging_owner_.get() + off[i]);
  }
  // Inputs: in place when on the device and contiguous (not in graph mode), else one async copy
  // into the input's staging buffer.
  for (size_t i = 0; i < num_inputs; ++i) {
    const InputSpec& sp = inputs[i];
    const Tensor& t = in[i];
    if (t.device() == device_ && t.is_contiguous() && !graph_requested_) {
      slots_[size_t(sp.slot)] = static_cast<char*>(t.raw_data());
      continue;
    }
    Tensor src = t.is_contiguous() ? t : t.contiguous();
    check(cudaMemcpyAsync(staging_[i], src.raw_data(), src.nbytes(),
                          src.device().is_cpu() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice, s),
          "cudaMemcpyAsync of an input");
    slots_[size_t(sp.slot)] = staging_[i];
    // A temporary (a non-contiguous input made contiguous) must live until its copy ran.
    if (!same_tensor(src, t)) check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }
  if (graph_requested_) {
    if (!graph_exec_) {
      cudaGraph_t graph = nullptr;
      check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      try {
        run_launches(in);
      } catch (...) {
        cudaStreamEndCapture(s, &graph);
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        throw;
      }
      check(cudaStreamEndCapture(s, &graph), "cudaStreamEndCapture");
      graph_ = graph;
      cudaGraphExec_t exec = nullptr;
      check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
      graph_exec_ = exec;
    }
    check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph_exec_), s), "cudaGraphLaunch");
  } else {
    run_launches(in);
  }
  char* const* b = slots_.data();
  bool strided_outputs = false;
  for (size_t i = 0; i < num_outputs; ++i) {
    const OutputSpec& o = outputs[i];
    Tensor& t = out[i];
    if (!t.defined() || t.dtype() != o.dtype || t.sizes() != o.sizes ||
        !(t.device().is_cpu() || t.device() == device_))
      fail("compiled graph: output {} expected a {} tensor of shape {} on the host or {}", i,
           dtype_name(o.dtype), to_string(o.sizes), device_.str());
    if (!o.strides.empty() || !t.is_contiguous()) {
      strided_outputs = true;
      continue;
    }
    const char* src = b[o.slot] + o.byte_offset;
    check(cudaMemcpyAsync(t.raw_data(), src, t.nbytes(),
                          t.device().is_cpu() ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice, s),
          "cudaMemcpyAsync of an output");
  }
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize (the compiled graph's work)");
  if (strided_outputs) {
    // Rare (an output that is a strided view of a buffer, or a strided destination): through
    // Tensor::copy_ on the device, which the stream's completion above orders after the work.
    for (size_t i = 0; i < num_outputs; ++i) {
      const OutputSpec& o = outputs[i];
      Tensor& t = out[i];
      if (o.strides.empty() && t.is_contiguous()) continue;
      char* src = b[o.slot] + o.byte_offset;
      Tensor view = o.strides.empty()
                        ? Tensor::from_blob(src, o.sizes, o.dtype, device_)
                        : Tensor::from_blob(src, o.base_sizes, o.dtype, device_)
                              .as_strided(o.sizes, o.strides, o.view_offset);
      t.copy_(view.device() == t.device() ? view : view.contiguous().to(t.device()));
    }
  }
}

TensorList Executable::run(const TensorList& in) {
  TensorList out;
  out.reserve(outputs.size());
  for (const OutputSpec& o : outputs) out.push_back(Tensor::empty(o.sizes, o.dtype, device_));
  run(in.data(), in.size(), out.data(), out.size());
  return out;
}

}  // namespace kiln
