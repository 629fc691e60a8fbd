// Executable: what a compiled graph is at run time — an arena, a table of base pointers and a
// flat list of launches. See Note [Executable] in executable.cc.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln {

class Executable {
 public:
  // One launch: a generated kernel, a oneDNN primitive or an eager kernel, bound at compile
  // time. `b` is the base-pointer table (slot 0 = arena), `inputs` the call's input tensors.
  using LaunchFn = void (*)(void* state, char* const* b, const Tensor* inputs);
  struct Launch {
    LaunchFn fn = nullptr;
    void* state = nullptr;
    std::string name;   // kernel name ("k3_add_relu", "conv2d:stem.conv1", ...)
    std::string kind;   // "loop" | the library ("onednn") | "eager"
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
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;

  // Sets up the arena (`arena`: at least arena_bytes, 64-byte aligned, zeroed; owned from now
  // on; see allocate_host_arena) and the slot table.
  void init(std::shared_ptr<char> arena, int64_t arena_bytes, int num_slots);
  char* arena() const { return arena_; }
  int64_t arena_bytes() const { return arena_bytes_; }
  void set_slot(int slot, char* base) { slots_[size_t(slot)] = base; }

  std::vector<Launch> launches;
  std::vector<InputSpec> inputs;
  std::vector<OutputSpec> outputs;
  std::vector<std::shared_ptr<void>> keep_alive;  // launch states, libraries, weights

  // Checks inputs (count, dtype, shape) and runs every launch, then copies the outputs into
  // `outputs` (defined tensors of the output shapes and dtypes, any strides; contiguous ones
  // take a memcpy). Allocates nothing when the inputs are contiguous.
  void run(const Tensor* inputs, size_t num_inputs, Tensor* outputs, size_t num_outputs);
  // Allocates fresh output tensors and runs.
  TensorList run(const TensorList& inputs);
  // Runs launch i alone over the slots as the last run() left them (`inputs`: that run's
  // inputs, for eager launches). For timing single kernels (autotuning): the kernel reads
  // whatever its buffers hold by then; the next run() recomputes everything.
  void run_launch(size_t i, const Tensor* inputs) {
    launches[i].fn(launches[i].state, slots_.data(), inputs);
  }

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
  std::shared_ptr<char> arena_owner_;
  char* arena_ = nullptr;
  int64_t arena_bytes_ = 0;
  std::vector<char*> slots_;
};

// Zeroed, 64-byte aligned host memory for an arena (at least 64 bytes); throws naming the size.
std::shared_ptr<char> allocate_host_arena(int64_t bytes);

}  // namespace kiln
