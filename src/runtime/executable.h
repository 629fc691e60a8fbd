// Executable: what a compiled graph is at run time — an arena, a table of base pointers and a
// flat list of launches. See Note [Executable] in executable.cc.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"

namespace kiln {

class Executable {
 public:
  // What a launch sees: the base-pointer table (slot 0 = arena), the call's input tensors (for
  // eager launches) and the executable's stream (a cudaStream_t on CUDA, null on the CPU).
  struct RunContext {
    char* const* slots = nullptr;
    const Tensor* inputs = nullptr;
    void* stream = nullptr;
  };
  // One launch: a generated kernel, a library kernel or an eager kernel, bound at compile time.
  using LaunchFn = void (*)(void* state, const RunContext& ctx);
  struct Launch {
    LaunchFn fn = nullptr;
    void* state = nullptr;
    std::string name;   // kernel name ("k3_add_relu", "conv2d:stem.conv1", ...)
    std::string kind;   // "loop" | the library ("onednn", "cublaslt", "cudnn", ...) | "eager"
    std::string nodes;  // the graph nodes it computes, for profiles and explain
    std::shared_ptr<void> owner;  // keeps `state` alive
  };
  struct InputSpec {
    std::string name;
    DType dtype = DType::Float32;
    Dims sizes;
    int32_t slot = -1;
  };
  struct OutputSpec {
    DType dtype = DType::Float32;
    Dims sizes;
    int32_t slot = -1;
    int64_t byte_offset = 0;
    // Non-empty when the output is a strided view of a buffer (elements; byte_offset then points
    // at the buffer's start and view_offset is in elements): copied element by element.
    Dims strides;
    int64_t view_offset = 0;
    Dims base_sizes;
  };

  Executable() = default;
  ~Executable();
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;

  // Sets up the arena (`arena`: at least arena_bytes, 64-byte aligned, zeroed, on `device`;
  // owned from now on) and the slot table. On CUDA the executable gets a stream of its own.
  void init(std::shared_ptr<char> arena, int64_t arena_bytes, int num_slots,
            Device device = Device::cpu());
  char* arena() const { return arena_; }
  int64_t arena_bytes() const { return arena_bytes_; }
  Device device() const { return device_; }
  void* stream() const { return stream_; }
  void set_slot(int slot, char* base) { slots_[size_t(slot)] = base; }

  std::vector<Launch> launches;
  std::vector<InputSpec> inputs;
  std::vector<OutputSpec> outputs;
  std::vector<std::shared_ptr<void>> keep_alive;  // libraries, weights, library kernels

  // Checks inputs (count, dtype, shape; a CUDA executable takes host or device inputs) and
  // runs every launch, then copies the outputs into `outputs` (defined tensors of the output
  // shapes and dtypes, any strides, on the host or — CUDA — the device). On CUDA the call waits
  // for the device before it returns. Allocates nothing when the inputs are contiguous.
  void run(const Tensor* inputs, size_t num_inputs, Tensor* outputs, size_t num_outputs);
  // Allocates fresh output tensors (on the executable's device) and runs.
  TensorList run(const TensorList& inputs);
  // Runs launch i alone over the slots as the last run() left them (`inputs`: that run's
  // inputs, for eager launches). For timing single kernels (autotuning): the kernel reads
  // whatever its buffers hold by then; the next run() recomputes everything.
  void run_launch(size_t i, const Tensor* inputs);

  // CUDA, reduce-overhead: from the next run on, the launch list is captured once into a CUDA
  // graph and replayed (Note [Executable]). Inputs are then always copied into fixed staging
  // buffers. Returns false (and says why in *why) when the launches cannot be captured (an eager
  // launch runs on the legacy default stream).
  bool use_cuda_graph(std::string* why);
  bool graph_mode() const { return graph_requested_; }

  // Per-launch timing for profiles: when set on this thread, each launch is bracketed by
  // launch_begin / launch_end (one branch per call when unset).
  struct LaunchTimer {
    virtual ~LaunchTimer() = default;
    virtual void launch_begin(const Launch& l) = 0;
    virtual void launch_end(const Launch& l) = 0;
  };
  // Returns the previous timer.
  static LaunchTimer* set_launch_timer(LaunchTimer* t);

 private:
  void run_cpu(const Tensor* in, size_t num_inputs, Tensor* out, size_t num_outputs);
  void run_cuda(const Tensor* in, size_t num_inputs, Tensor* out, size_t num_outputs);
  void run_launches(const Tensor* args);
  void check_inputs(const Tensor* in, size_t num_inputs, size_t num_outputs) const;

  std::shared_ptr<char> arena_owner_;
  char* arena_ = nullptr;
  int64_t arena_bytes_ = 0;
  std::vector<char*> slots_;
  Device device_ = Device::cpu();
  // CUDA: the executable's stream, staging buffers for inputs (one per input, in one device
  // block), and the captured graph.
  void* stream_ = nullptr;
  std::shared_ptr<char> staging_owner_;
  std::vector<char*> staging_;
  bool graph_requested_ = false;
  void* graph_ = nullptr;       // cudaGraph_t
  void* graph_exec_ = nullptr;  // cudaGraphExec_t
};

// Zeroed, 64-byte aligned host memory for an arena (at least 64 bytes); throws naming the size.
std::shared_ptr<char> allocate_host_arena(int64_t bytes);
// Zeroed device memory on CUDA device `index` (cudaMalloc: 256-byte aligned); throws naming the
// size and the free device memory when it does not fit.
std::shared_ptr<char> allocate_device_arena(int64_t bytes, int index);

}  // namespace kiln
