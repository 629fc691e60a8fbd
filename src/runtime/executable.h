// Executable: what a compiled graph is at run time — a flat list of launches, run over an
// execution context (an arena and a table of base pointers) of the call's own. See Note
// [Executable] and Note [Execution contexts] in executable.cc.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"

namespace kiln {

// Where a buffer lives at run time: the base pointer slots[slot] of the call's slot table (slot
// 0: the arena; then graph inputs, then constants) plus byte_offset. Slot -1: absent.
struct MemRef {
  int32_t slot = -1;
  int64_t byte_offset = 0;
};

// A launch described as data, from which the runtime rebuilds it without the compiler (a
// package's launch list; Note [Launch records] in runtime/launch_library.cc). kind: "loop" |
// "onednn"; params: one JSON object, as text.
struct LaunchRecord {
  std::string kind;
  std::string params;
  // Weights the launch holds in its kernel's own layout (a oneDNN node's prepacked weights:
  // Note [prepacked weights] in kernels/onednn_node.cc), which a package may store in place of
  // their plain data: the constant, the layout as text, the bytes (kept alive by `owner`).
  struct Prepacked {
    std::string constant, layout;
    const void* data = nullptr;
    size_t bytes = 0;
  };
  std::vector<Prepacked> prepacked = {};
  std::shared_ptr<const void> owner = {};
};

class Executable {
 public:
  // What a launch sees: the base-pointer table of the call's execution context (slot 0 = its
  // arena), the call's input tensors (for eager launches) and the context's stream (a
  // cudaStream_t on CUDA, null on the CPU).
  struct RunContext {
    char* const* slots = nullptr;
    const Tensor* inputs = nullptr;
    void* stream = nullptr;
  };
  // One launch: a generated kernel, a library kernel or an eager kernel, bound at compile time.
  using LaunchFn = void (*)(void* state, const RunContext& ctx);
  // A launch whose state changes while it runs (memory objects that hold the last pointers, an
  // eager kernel's tensors over the arena) gives every execution context a state of its own:
  // called once when a context is created (never on the run path) with that context's slot
  // table (arena and constants bound, input slots not yet), its result replaces `state` for
  // launches on that context. Null: `state` is read-only and shared by every context.
  using LocalStateFn = std::function<std::shared_ptr<void>(char* const* slots)>;
  struct Launch {
    LaunchFn fn = nullptr;
    void* state = nullptr;
    std::string name;   // kernel name ("k3_add_relu", "conv2d:stem.conv1", ...)
    std::string kind;   // "loop" | the library ("onednn", "cublaslt", "cudnn", ...) | "eager"
    std::string nodes;  // the graph nodes it computes, for profiles and explain
    std::shared_ptr<void> owner;  // keeps `state` alive
    LocalStateFn make_local;      // see LocalStateFn
    // The launch as data, as it is now (a tuned thread count included); null for launches that
    // cannot be rebuilt from data (eager kernels): such an Executable cannot be packaged.
    std::function<LaunchRecord()> record;
    // The least arithmetic and traffic it needs (Note [Kernel work] in lower/cost.cc), for a
    // profile's roofline; zero when unknown (a loaded package's launches). `compute`: the element
    // type its contraction runs in (the FLOP rate that applies).
    double flops = 0, bytes = 0;
    double const_bytes = 0;  // of bytes, the weights' (parameters and constants)
    DType compute = DType::Float32;
  };
  // A parameter or constant the launches read, by name: a slot of its own (loop and eager
  // kernels) or -1 (read only by library kernels, which name it in their records).
  struct ConstantSpec {
    std::string name;
    int32_t slot = -1;
    Tensor data;  // undefined for a slot -1 constant of a loaded CPU package (its nodes hold copies)
    // "": data is laid out as the model has it. "krsc": a [K, C, R, S] filter whose data is
    // [K][R][S][C] (CUDA channels-last convolutions: Note [Filters stored KRSC at load] in
    // runtime/launch_cuda.cc); a package written from it stores it KCRS again.
    std::string layout;
  };
  struct InputSpec {
    std::string name;
    DType dtype = DType::Float32;
    Dims sizes;
    int32_t slot = -1;
    int64_t bytes() const;  // numel(sizes) elements of dtype
    // CUDA: where the input is copied when it cannot be read in place (graph mode, a host
    // input): this byte offset in the context's arena (Note [Input staging in the arena] in
    // lower/memory_planner.cc), 256-byte aligned; -1: a staging block of its own.
    int64_t staging_offset = -1;
    // A package's: each dim's symbolic name in the source model ("" for a fixed dim; empty: none
    // named), for the error that a call of another shape gets (Note [Package signature]).
    std::vector<std::string> dim_names;
  };
  struct OutputSpec {
    std::string name;
    DType dtype = DType::Float32;
    Dims sizes;
    std::vector<std::string> dim_names;  // as InputSpec's
    int32_t slot = -1;
    int64_t byte_offset = 0;
    // Non-empty when the output is a strided view of a buffer (elements; byte_offset then points
    // at the buffer's start and view_offset is in elements): copied element by element.
    Dims strides;
    int64_t view_offset = 0;
    Dims base_sizes;
  };

  Executable();
  ~Executable();
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;

  // Sets the size of every execution context's arena (`arena_bytes`, zeroed, 64-byte aligned on
  // the host, 256 on a device) and of the slot table. Nothing is allocated until prepare() or
  // the first run.
  void init(int64_t arena_bytes, int num_slots, Device device = Device::cpu());
  int64_t arena_bytes() const { return arena_bytes_; }
  Device device() const { return device_; }
  // A slot every execution context starts with (a constant's data). Before prepare().
  void set_slot(int slot, char* base);
  // Launches, inputs and outputs are final: creates the first execution context now, so that a
  // failing arena allocation fails the compile rather than the first call. A CUDA executable in
  // graph mode (use_cuda_graph before this) also captures, instantiates and uploads that
  // context's CUDA graph here, so the first call replays it (Note [CUDA graph at prepare]).
  void prepare();

  std::vector<Launch> launches;
  std::vector<InputSpec> inputs;
  std::vector<OutputSpec> outputs;
  std::vector<std::shared_ptr<void>> keep_alive;  // libraries, weights, library kernels
  // What a package needs besides the launches' records: every constant by name, and the loop
  // kernels' shared object (its path; empty when there are no loop kernels).
  std::vector<ConstantSpec> constants;
  std::string kernel_library_path;
  // CUDA: the modules its kernels come from (cubins NVRTC built for `arch`), by name: what a
  // package's kernels.cuda section holds (Note [CUDA launch records] in launch_cuda.cc).
  struct DeviceModule {
    std::string name;
    std::string arch;  // "sm_90"
    std::shared_ptr<const std::string> image;
    // The PTX of the same program (NUL-terminated), for GPUs of newer architectures (Note [PTX
    // in CUDA packages] in runtime/package.cc); null or empty: none.
    std::shared_ptr<const std::string> ptx;
  };
  std::vector<DeviceModule> device_modules;
  int num_slots() const { return int(initial_slots_.size()); }

  // Checks inputs (count, dtype, shape; a CUDA executable takes host or device inputs) and
  // runs every launch, then copies the outputs into `outputs` (defined tensors of the output
  // shapes and dtypes, any strides, on the host or — CUDA — the device). On CUDA the call waits
  // for the device before it returns. Allocates nothing when the inputs are contiguous (after
  // the call's execution context exists). Safe to call from several threads at once: each call
  // runs on an execution context of its own (Note [Execution contexts]).
  void run(const Tensor* inputs, size_t num_inputs, Tensor* outputs, size_t num_outputs);
  // Allocates fresh output tensors (on the executable's device) and runs.
  TensorList run(const TensorList& inputs);
  // The same over raw host buffers (the C API): inputs[i] and outputs[i] contiguous in the
  // specs' dtypes and shapes; executables without eager launches (packages) only. CPU: no heap
  // allocation in steady state, strided-view outputs aside (copied through tensor views). CUDA:
  // the buffers are copied to the device and the outputs back (a few tensor handles per call).
  void run_buffers(const void* const* inputs, size_t num_inputs, void* const* outputs,
                   size_t num_outputs);
  // Runs launch i alone over the slots of the execution context the last run() released (the
  // one a run without concurrent calls uses); `inputs`: that run's inputs, for eager launches.
  // For timing single kernels (autotuning), with no other call in flight: the kernel reads
  // whatever its buffers hold by then; the next run() recomputes everything.
  void run_launch(size_t i, const Tensor* inputs);

  // At most this many execution contexts (default kDefaultMaxContexts); a call that finds them
  // all busy waits for one. Calls in flight are not affected.
  static constexpr int kDefaultMaxContexts = 8;
  void set_max_contexts(int n);
  int max_contexts() const;
  int num_contexts() const;  // created so far

  // Note [Device status]: a CUDA kernel cannot throw. A kernel that meets a value the op's
  // reference rejects (an index out of range, an integer division by zero, a negative integer
  // exponent) records the first such event of the call in its execution context's status record,
  // two int64 in device memory {code, value}, and computes on without touching memory outside
  // its buffers. The call copies the record back with its outputs (inside the CUDA graph in
  // reduce-overhead) and, when `code` is set, fails with the matching check's
  // prefix + value + suffix (ErrorKind::InvalidArgument, as the CPU's index checks), after
  // clearing the record for the next call. Codes are > 0 and unique per executable (the
  // compiler uses the node index + 1). Slot `slot` of every context's table points at its
  // record. Before prepare(); CUDA executables only.
  struct DeviceCheck {
    int64_t code = 0;
    std::string prefix, suffix;
  };
  void set_device_status(int slot, std::vector<DeviceCheck> checks);
  const std::vector<DeviceCheck>& device_checks() const { return device_checks_; }
  int device_status_slot() const { return status_slot_; }

  // CUDA, reduce-overhead: from the next run on, the launch list is captured into a CUDA graph
  // once per execution context and replayed (Note [Executable]). Inputs are then always copied
  // into the context's fixed staging buffers. Returns false (and says why in *why) when the
  // launches cannot be captured (an eager launch runs on the legacy default stream).
  bool use_cuda_graph(std::string* why);

  // A cross-build (compiler::Options::arch): launches and records for a package, but no device
  // to run on; every call fails with `why`. Instead of prepare().
  void set_not_runnable(std::string why) { not_runnable_ = std::move(why); }
  bool runnable() const { return not_runnable_.empty(); }
  bool graph_mode() const { return graph_requested_; }
  // CUDA, default mode: prepare() also captures the launch list once and discards the graph, so
  // that the driver loads every kernel module the launches use (CUDA loads them lazily, at a
  // kernel's first launch), which the first call paid for before (Note [CUDA modules warmed at
  // prepare]). Before prepare(); packages set it.
  void warm_cuda_modules_at_prepare() { warm_requested_ = true; }
  // Graph mode: how many calls so far ran with their input and output copies inside the graph
  // (Note [Copies inside the graph] in executable.cc), over every context. For tests.
  int64_t calls_with_copies_in_graph() const;
  // Contexts whose graph with copies is built (Note [Graph with copies at prepare]: the first
  // context's is built by prepare()). For tests.
  int64_t graphs_with_copies_built() const;

  // Per-launch timing for profiles: when set on this thread, each launch is bracketed by
  // launch_begin / launch_end (one branch per call when unset); `ctx` is the launch's (its
  // stream: where a profiler records device events).
  struct LaunchTimer {
    virtual ~LaunchTimer() = default;
    virtual void launch_begin(const Launch& l, const RunContext& ctx) = 0;
    virtual void launch_end(const Launch& l, const RunContext& ctx) = 0;
  };
  // Returns the previous timer.
  static LaunchTimer* set_launch_timer(LaunchTimer* t);

 private:
  struct Context;
  struct Pool;
  class Lease;
  std::unique_ptr<Context> make_context();
  Context& acquire();
  void release(Context& c);
  void run_cpu(Context& c, const Tensor* in, size_t num_inputs, Tensor* out, size_t num_outputs);
  void run_cuda(Context& c, const Tensor* in, size_t num_inputs, Tensor* out, size_t num_outputs);
  void run_launches(Context& c, const Tensor* args);
  void check_inputs(const Tensor* in, size_t num_inputs, size_t num_outputs) const;
  // Note [Device status]: queue the record's copy to the host on the context's stream; and,
  // after the stream finished with a code set, clear the record and throw.
  void copy_status_back(Context& c);
  // Captures the context's launches (and the status copy) into a new CUDA graph on its stream,
  // with the inputs' slots pointing at their staging buffers; on failure ends the capture,
  // destroys the graph and throws. The caller holds pool_->cuda_setup.
  // Returns the cudaGraph_t (as void*: this header names no CUDA type).
  void* capture_launches(Context& c, const Tensor* in);
  // Captures the context's launches into its CUDA graph and instantiates it (graph mode). Holds
  // pool_->cuda_setup.
  void capture_cuda_graph(Context& c, const Tensor* in);
  // Note [Copies inside the graph]: builds the context's graph with copies over its io_copies
  // (false where the driver refuses it, nothing kept); and at prepare, over placeholder copies
  // (Note [Graph with copies at prepare]).
  bool build_io_graph(Context& c);
  void prebuild_io_graph(Context& c);
  // Note [Copies inside the graph]: whether this call's inputs and outputs can be copied by the
  // context's graph (all on this device, contiguous, non-empty, outputs unstrided), and the
  // launch of that graph (built at prepare or the first such call; its copies repointed when
  // the caller's buffers change). False: the call takes the plain path.
  bool copies_fit_graph(const Tensor* in, size_t num_inputs, const Tensor* out,
                        size_t num_outputs) const;
  bool launch_graph_with_copies(Context& c, const Tensor* in, size_t num_inputs, Tensor* out,
                                size_t num_outputs);
  // Note [CUDA modules warmed at prepare]: captures the launches and destroys the graph.
  void warm_cuda_modules(Context& c);
  [[noreturn]] void fail_device_check(Context& c);

  int64_t arena_bytes_ = 0;
  std::vector<char*> initial_slots_;  // what every context's slot table starts as (slot 0 null)
  Device device_ = Device::cpu();
  bool graph_requested_ = false;
  bool warm_requested_ = false;    // warm_cuda_modules_at_prepare
  bool has_eager_launch_ = false;  // set by prepare()
  int status_slot_ = -1;           // Note [Device status]
  std::string not_runnable_;       // set_not_runnable
  std::vector<DeviceCheck> device_checks_;
  std::unique_ptr<Pool> pool_;
};

// Zeroed, 64-byte aligned host memory for an arena (at least 64 bytes); throws naming the size.
std::shared_ptr<char> allocate_host_arena(int64_t bytes);
// Zeroed device memory on CUDA device `index` (cudaMalloc: 256-byte aligned); throws naming the
// size and the free device memory when it does not fit.
std::shared_ptr<char> allocate_device_arena(int64_t bytes, int index);

}  // namespace kiln
