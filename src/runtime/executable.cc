// Note [Executable]
// A compiled graph runs as: bind the input pointers into the slot table, call each launch in
// order, copy the outputs out. Everything else — kernel addresses, arena offsets, library
// kernels with their prepacked weights, the eager kernels' prebuilt argument lists — was
// resolved at compile time, so a steady-state call does no heap allocation, no hash lookup and
// no dispatch beyond one indirect call per launch.
//
// Note [Execution contexts]
// What a call writes lives in an execution context, never in the Executable: the arena (every
// activation, and the library kernels' scratch at its end), the slot table, the per-context
// state of launches that have some (Launch::make_local: oneDNN's memory objects, which hold the
// pointers last bound; an eager kernel's tensors over the arena), and on CUDA the stream, the
// input staging buffers and the captured CUDA graph. What the Executable holds — the launch
// list, kernel code, prepacked weights, constants — is read-only once prepare() ran, and shared.
// A call takes a free context from a small pool, runs on it and gives it back, so calls from
// several threads run at the same time, each on its own memory. Contexts are created when a call
// finds none free (the first by prepare(), at compile time), up to max_contexts() (default 8;
// a call past that waits for one), and live as long as the executable. The pool is a
// mutex-guarded LIFO free list reserved to its bound: taking and returning a context is a short
// critical section that allocates nothing, and a caller without competition always gets the
// context it used last (the one run_launch and autotuning see). The launch loop itself reads
// the context's state array: one indirect call per launch, as before.
//
// CUDA. The arena lives on the device; every context has its own stream (Note [CUDA streams of
// contexts] below). Inputs already on the device are bound in place; host inputs are copied into
// the context's staging buffer for that input (one async copy each), which the memory plan
// places in the context's arena (Note [Input staging in the arena] in lower/memory_planner.cc).
// Launches enqueue on the context's stream; outputs are copied (asynchronously, on the stream)
// into the tensors the caller gives — on the device or the host — and the call waits for the
// stream before it returns, so the outputs are the caller's, complete, and nothing of a later
// call can overwrite them (the rule
// torch's CUDA-graph outputs lack). reduce-overhead (use_cuda_graph): a context's first run
// captures the launch list into a CUDA graph over that context's arena and staging buffers (fixed
// addresses), with every input copied into its staging buffer; later runs on the context copy the
// inputs in, replay its graph and copy the outputs out: one graph launch instead of one launch per
// kernel. Creating a context (cudaMalloc, cudaMemset on the legacy stream) and capturing a graph
// take one mutex of the executable, so that no context of it is set up while another is being
// captured.
//
// Note [CUDA streams of contexts]
// Eager CUDA kernels, Tensor::to and the allocator's zeroing use the legacy default stream. A
// blocking stream would order a call after that work by itself, but it also makes every
// legacy-stream operation of any thread wait for it — and while a context's stream is being
// captured into a CUDA graph, such an operation from another thread (a cudaMemcpy of a result)
// fails ("operation would make the legacy stream depend on a capturing blocking stream") and
// breaks the capture. So a context's stream is non-blocking, and the ordering is explicit: a
// call whose inputs or outputs include device tensors first makes its stream wait for an event
// recorded on the legacy stream (about two microseconds of host time), and again after making
// a non-contiguous device input contiguous (a gather queued on the legacy stream), unless the
// legacy stream has nothing pending (cudaStreamQuery: everything queued there so far has
// finished, so there is nothing to wait for; 0.4 us a call on an H200); a context's setup
// synchronizes the legacy stream once (the zeroing of its arena); every call waits for its own
// stream before it returns, so what the caller queues afterwards sees finished outputs. The
// exception is an executable with an eager launch (default mode only: such a launch cannot be
// captured), whose kernels run on the legacy stream between the context stream's: it keeps a
// blocking stream, which orders the two both ways. CudaConcurrentCalls.* (tests/cuda) calls
// compiled models from four threads in both modes against the single-thread results, bitwise.
#include "runtime/executable.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "core/allocator.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "kernels/cuda/graph_replay.h"

namespace kiln {

namespace {

// Note [Copies inside the graph]: KILN_GRAPH_COPIES=0 keeps every call on the plain path (a
// driver whose graph copies misbehave; a diagnosis), as KILN_GRAPH_REPLAY=0 does for library
// calls.
bool copies_in_graph_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_GRAPH_COPIES");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

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

// ---- execution contexts --------------------------------------------------------------------

struct Executable::Context {
  std::shared_ptr<char> arena;
  std::vector<char*> slots;
  std::vector<void*> states;                  // per launch: its own state or the shared one
  std::vector<std::shared_ptr<void>> locals;  // owners of the per-context states
  // CUDA: the stream, staging buffers for inputs (one per input, in one device block), and the
  // captured graph.
  void* stream = nullptr;
  std::shared_ptr<char> staging_owner;
  std::vector<char*> staging;
  void* graph = nullptr;       // cudaGraph_t
  void* graph_exec = nullptr;  // cudaGraphExec_t
  // Note [Copies inside the graph]: the graph with the call's copies around the launches'
  // (cudaGraph_t, cudaGraphExec_t), its copy nodes (cudaGraphNode_t: the inputs', then the
  // outputs') and what each copies now (destination, source, bytes).
  struct IoCopy {
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
    bool operator==(const IoCopy& o) const { return dst == o.dst && src == o.src && bytes == o.bytes; }
  };
  void* io_graph = nullptr;
  void* io_exec = nullptr;
  std::vector<cudaGraphNode_t> io_nodes;
  std::vector<IoCopy> io_copies;
  bool io_broken = false;  // building or updating it failed once: the plain path from then on
  int64_t io_calls = 0;
  // A non-blocking stream's wait on the legacy default stream (cudaEvent_t; null for a blocking
  // stream): Note [CUDA streams of contexts].
  void* legacy_ready = nullptr;
  // Note [Device status]: the record on the device, and its pinned host copy.
  std::shared_ptr<char> status_owner;
  int64_t* status_host = nullptr;

  ~Context() {
    if (legacy_ready) cudaEventDestroy(static_cast<cudaEvent_t>(legacy_ready));
    if (status_host) cudaFreeHost(status_host);
    if (io_exec) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(io_exec));
    if (io_graph) cudaGraphDestroy(static_cast<cudaGraph_t>(io_graph));
    if (graph_exec) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph_exec));
    if (graph) cudaGraphDestroy(static_cast<cudaGraph_t>(graph));
    if (stream) {
      cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
      cudaStreamDestroy(static_cast<cudaStream_t>(stream));
    }
  }
};

struct Executable::Pool {
  std::mutex mu;
  std::condition_variable freed;
  std::vector<std::unique_ptr<Context>> all;  // capacity >= max: creating one never moves them
  std::vector<Context*> free;                 // LIFO; capacity >= max: returning never allocates
  int creating = 0;                           // being made outside the lock
  int max = kDefaultMaxContexts;
  std::mutex cuda_setup;                      // CUDA: context creation and graph capture
};

// The context of one call: taken in the constructor, given back in the destructor (also when
// a launch throws).
class Executable::Lease {
 public:
  explicit Lease(Executable& e) : e_(e), c_(e.acquire()) {}
  ~Lease() { e_.release(c_); }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  Context& context() const { return c_; }

 private:
  Executable& e_;
  Context& c_;
};

Executable::Executable() : pool_(std::make_unique<Pool>()) {
  pool_->all.reserve(size_t(pool_->max));
  pool_->free.reserve(size_t(pool_->max));
}

// The pool (every context, with its stream and graph) goes first: members are destroyed in
// reverse order, and the contexts' local states point into the launches' shared state.
Executable::~Executable() = default;

void Executable::init(int64_t arena_bytes, int num_slots, Device device) {
  KILN_ASSERT(num_slots >= 1 && pool_->all.empty());
  arena_bytes_ = arena_bytes;
  initial_slots_.assign(size_t(num_slots), nullptr);
  device_ = device;
}

void Executable::set_slot(int slot, char* base) {
  KILN_ASSERT(slot > 0 && size_t(slot) < initial_slots_.size() && pool_->all.empty());
  initial_slots_[size_t(slot)] = base;
}

void Executable::set_device_status(int slot, std::vector<DeviceCheck> checks) {
  KILN_ASSERT(slot > 0 && size_t(slot) < initial_slots_.size() && pool_->all.empty() &&
              device_.is_cuda());
  for (const DeviceCheck& c : checks) KILN_ASSERT(c.code > 0);
  status_slot_ = slot;
  device_checks_ = std::move(checks);
}

void Executable::set_max_contexts(int n) {
  KILN_CHECK(n >= 1, "executable: max_contexts must be >= 1, got {}", n);
  {
    std::lock_guard<std::mutex> lock(pool_->mu);
    pool_->max = n;
    size_t cap = std::max(size_t(n), pool_->all.size());
    pool_->all.reserve(cap);
    pool_->free.reserve(cap);
  }
  pool_->freed.notify_all();
}

int Executable::max_contexts() const {
  std::lock_guard<std::mutex> lock(pool_->mu);
  return pool_->max;
}

int Executable::num_contexts() const {
  std::lock_guard<std::mutex> lock(pool_->mu);
  return int(pool_->all.size());
}

std::unique_ptr<Executable::Context> Executable::make_context() {
  // Every call needs a context, and only the first calls make one: the check costs nothing later.
  if (!not_runnable_.empty()) fail_kind(ErrorKind::NotSupported, "{}", not_runnable_);
  KILN_ASSERT(!initial_slots_.empty());
  auto c = std::make_unique<Context>();
  std::unique_lock<std::mutex> cuda_lock;
  if (device_.is_cuda()) {
    cuda_lock = std::unique_lock<std::mutex>(pool_->cuda_setup);
    c->arena = allocate_device_arena(arena_bytes_, device_.index);
    check(cudaSetDevice(device_.index), "cudaSetDevice");
    // Note [CUDA streams of contexts]: non-blocking unless a launch runs on the legacy stream
    // (has_eager_launch_ is set by prepare(), which makes the first context).
    cudaStream_t s = nullptr;
    const unsigned flags = has_eager_launch_ ? cudaStreamDefault : cudaStreamNonBlocking;
    check(cudaStreamCreateWithFlags(&s, flags), "cudaStreamCreateWithFlags");
    c->stream = s;
    if (!has_eager_launch_) {
      cudaEvent_t e = nullptr;
      check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      c->legacy_ready = e;
    }
    if (!inputs.empty()) {
      // Staging for inputs that may need it (host inputs, every input in graph mode): in the
      // arena where the plan placed it (Note [Input staging in the arena]), else one device
      // block for the rest, 256-byte aligned each.
      std::vector<int64_t> off(inputs.size(), -1);
      int64_t total = 0;
      for (size_t i = 0; i < inputs.size(); ++i) {
        if (inputs[i].staging_offset >= 0) continue;
        off[i] = total;
        total += (inputs[i].bytes() + 255) / 256 * 256;
      }
      if (total > 0) c->staging_owner = allocate_device_arena(total, device_.index);
      // By slot, not by position: the caller may reorder `inputs` after a context exists (a
      // package takes its inputs in call order, nn::compile_captured_graph), and each buffer
      // must stay the size of its own input.
      c->staging.assign(initial_slots_.size(), nullptr);
      for (size_t i = 0; i < inputs.size(); ++i)
        c->staging[size_t(inputs[i].slot)] = inputs[i].staging_offset >= 0
                                                 ? c->arena.get() + inputs[i].staging_offset
                                                 : c->staging_owner.get() + off[i];
    }
    if (status_slot_ >= 0) {
      c->status_owner = allocate_device_arena(2 * sizeof(int64_t), device_.index);  // zeroed
      void* host = nullptr;
      check(cudaMallocHost(&host, 2 * sizeof(int64_t)), "cudaMallocHost (the status record)");
      c->status_host = static_cast<int64_t*>(host);
      c->status_host[0] = c->status_host[1] = 0;
    }
    // The arena's and staging's zeroing ran on the legacy stream, which a non-blocking stream
    // does not wait for by itself.
    check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize (context setup)");
  } else {
    c->arena = allocate_host_arena(arena_bytes_);
  }
  c->slots = initial_slots_;
  c->slots[0] = c->arena.get();
  if (c->status_owner) c->slots[size_t(status_slot_)] = c->status_owner.get();
  c->states.resize(launches.size());
  for (size_t i = 0; i < launches.size(); ++i) {
    const Launch& l = launches[i];
    if (!l.make_local) {
      c->states[i] = l.state;
      continue;
    }
    std::shared_ptr<void> local = l.make_local(c->slots.data());
    KILN_ASSERT(local);
    c->states[i] = local.get();
    c->locals.push_back(std::move(local));
  }
  return c;
}

int64_t Executable::InputSpec::bytes() const { return int64_t(numel(sizes)) * dtype_size(dtype); }

void Executable::prepare() {
  for (const InputSpec& in : inputs) {  // Note [Input staging in the arena]
    if (in.staging_offset < 0) continue;
    const int64_t bytes = in.bytes();
    if (!device_.is_cuda() || in.staging_offset % 256 != 0 ||
        in.staging_offset > arena_bytes_ - bytes)
      fail_kind(ErrorKind::Internal,
                "executable: input '{}' is staged at arena offset {} ({} bytes), outside the "
                "{}-byte arena of this {} executable or not 256-byte aligned",
                in.name, in.staging_offset, bytes, arena_bytes_, device_.str());
  }
  has_eager_launch_ = false;
  for (const Launch& l : launches) has_eager_launch_ = has_eager_launch_ || l.kind == "eager";
  {
    std::lock_guard<std::mutex> lock(pool_->mu);
    if (!pool_->all.empty()) return;
  }
  std::unique_ptr<Context> c = make_context();
  if (device_.is_cuda() && (graph_requested_ || (warm_requested_ && !has_eager_launch_))) {
    check(cudaSetDevice(device_.index), "cudaSetDevice");
    if (graph_requested_) {  // Note [CUDA graph at prepare]
      capture_cuda_graph(*c, nullptr);
      prebuild_io_graph(*c);  // Note [Graph with copies at prepare]
      check(cudaStreamSynchronize(static_cast<cudaStream_t>(c->stream)), "cudaStreamSynchronize");
    } else {
      warm_cuda_modules(*c);
    }
  }
  std::lock_guard<std::mutex> lock(pool_->mu);
  if (!pool_->all.empty()) return;  // a call made one meanwhile
  pool_->free.push_back(c.get());
  pool_->all.push_back(std::move(c));
}

Executable::Context& Executable::acquire() {
  Pool& p = *pool_;
  std::unique_lock<std::mutex> lock(p.mu);
  while (p.free.empty()) {
    if (int(p.all.size()) + p.creating < p.max) {
      ++p.creating;
      lock.unlock();
      std::unique_ptr<Context> c;
      try {
        c = make_context();
      } catch (...) {
        lock.lock();
        --p.creating;
        lock.unlock();
        p.freed.notify_one();  // a waiter may create one instead
        throw;
      }
      lock.lock();
      --p.creating;
      Context& made = *c;
      p.all.push_back(std::move(c));
      return made;
    }
    p.freed.wait(lock);
  }
  Context* c = p.free.back();
  p.free.pop_back();
  return *c;
}

void Executable::release(Context& c) {
  {
    std::lock_guard<std::mutex> lock(pool_->mu);
    pool_->free.push_back(&c);
  }
  pool_->freed.notify_one();
}

// ---- running ----------------------------------------------------------------------------------

void Executable::check_inputs(const Tensor* in, size_t num_inputs, size_t num_outputs) const {
  if (num_inputs != inputs.size())
    fail("compiled graph: expected {} inputs, got {}", inputs.size(), num_inputs);
  if (num_outputs != outputs.size())
    fail("compiled graph: expected {} outputs, got {}", outputs.size(), num_outputs);
  for (size_t i = 0; i < num_inputs; ++i) {
    const InputSpec& s = inputs[i];
    const Tensor& t = in[i];
    bool device_ok = t.defined() && (t.device().is_cpu() || t.device() == device_);
    if (!t.defined() || t.dtype() != s.dtype || t.sizes() != s.sizes || !device_ok) {
      // A package's named dims: say which symbol differs and what the package is built for.
      std::string named;
      if (t.defined() && t.sizes().size() == s.sizes.size() && s.dim_names.size() == s.sizes.size())
        for (size_t d = 0; d < s.sizes.size(); ++d)
          if (!s.dim_names[d].empty() && t.sizes()[d] != s.sizes[d])
            named += fmt::format("; dim {} ('{}') is {}, and this package is specialized to {} = "
                                 "{}: compile the model for {} = {} (`kiln compile` with that "
                                 "shape{})", d, s.dim_names[d], t.sizes()[d], s.dim_names[d],
                                 s.sizes[d], s.dim_names[d], t.sizes()[d],
                                 d == 0 ? ", e.g. --batch" : "");
      fail("compiled graph: input {} ('{}') expected a {}{} tensor of shape {}, got {}{}", i,
           s.name, device_.is_cpu() ? "cpu " : fmt::format("cpu or {} ", device_.str()),
           dtype_name(s.dtype), to_string(s.sizes),
           t.defined() ? fmt::format("{} {} on {}", dtype_name(t.dtype()), to_string(t.sizes()),
                                     t.device().str())
                       : std::string("an undefined tensor"), named);
    }
  }
}

void Executable::run_launches(Context& c, const Tensor* args) {
  RunContext ctx{c.slots.data(), args, c.stream};
  void* const* states = c.states.data();
  const size_t n = launches.size();
  if (t_timer) {
    for (size_t i = 0; i < n; ++i) {
      const Launch& l = launches[i];
      t_timer->launch_begin(l, ctx);
      l.fn(states[i], ctx);
      t_timer->launch_end(l, ctx);
    }
  } else {
    for (size_t i = 0; i < n; ++i) launches[i].fn(states[i], ctx);
  }
}

void Executable::run_launch(size_t i, const Tensor* inputs) {
  KILN_ASSERT(i < launches.size());
  Lease lease(*this);
  Context& c = lease.context();
  RunContext ctx{c.slots.data(), inputs, c.stream};
  launches[i].fn(c.states[i], ctx);
}

void Executable::run(const Tensor* in, size_t num_inputs, Tensor* out, size_t num_outputs) {
  check_inputs(in, num_inputs, num_outputs);
  Lease lease(*this);
  if (device_.is_cuda())
    run_cuda(lease.context(), in, num_inputs, out, num_outputs);
  else
    run_cpu(lease.context(), in, num_inputs, out, num_outputs);
}

void Executable::run_cpu(Context& c, const Tensor* in, size_t num_inputs, Tensor* out,
                         size_t num_outputs) {
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
    c.slots[size_t(s.slot)] = static_cast<char*>(use->raw_data());
  }
  if (args != in)
    for (size_t i = 0; i < num_inputs; ++i) {
      Tensor* st = heap_staged ? heap_staged : staged;
      if (!st[i].defined()) st[i] = in[i];
    }
  run_launches(c, args);
  char* const* b = c.slots.data();
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

void Executable::run_buffers(const void* const* in, size_t num_inputs, void* const* out,
                             size_t num_outputs) {
  if (num_inputs != inputs.size() || num_outputs != outputs.size())
    fail("compiled graph: expected {} inputs and {} outputs, got {} and {}", inputs.size(),
         outputs.size(), num_inputs, num_outputs);
  if (!device_.is_cpu()) {
    // CUDA: the host buffers as tensors; run() copies them in (one async copy each) and the
    // outputs back. The tensor handles are this call's only allocations.
    std::vector<Tensor> in_t(num_inputs), out_t(num_outputs);
    for (size_t i = 0; i < num_inputs; ++i) {
      if (!in[i]) fail("compiled graph: input {} ('{}') is null", i, inputs[i].name);
      in_t[i] = Tensor::from_blob(const_cast<void*>(in[i]), inputs[i].sizes, inputs[i].dtype);
    }
    for (size_t i = 0; i < num_outputs; ++i) {
      if (!out[i]) fail("compiled graph: output {} is null", i);
      out_t[i] = Tensor::from_blob(out[i], outputs[i].sizes, outputs[i].dtype);
    }
    run(in_t.data(), num_inputs, out_t.data(), num_outputs);
    return;
  }
  if (has_eager_launch_)
    fail("compiled graph: it has eager launches, which need input tensors; use run()");
  Lease lease(*this);
  Context& c = lease.context();
  for (size_t i = 0; i < num_inputs; ++i) {
    if (!in[i]) fail("compiled graph: input {} ('{}') is null", i, inputs[i].name);
    c.slots[size_t(inputs[i].slot)] = static_cast<char*>(const_cast<void*>(in[i]));
  }
  run_launches(c, nullptr);
  char* const* b = c.slots.data();
  for (size_t i = 0; i < num_outputs; ++i) {
    const OutputSpec& o = outputs[i];
    if (!out[i]) fail("compiled graph: output {} is null", i);
    const char* src = b[o.slot] + o.byte_offset;
    if (o.strides.empty()) {
      int64_t n = dtype_size(o.dtype);
      for (int64_t d : o.sizes) n *= d;
      std::memcpy(out[i], src, size_t(n));
    } else {
      Tensor base = Tensor::from_blob(const_cast<char*>(src), o.base_sizes, o.dtype);
      Tensor dst = Tensor::from_blob(out[i], o.sizes, o.dtype);
      dst.copy_(base.as_strided(o.sizes, o.strides, o.view_offset));
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

void Executable::run_cuda(Context& c, const Tensor* in, size_t num_inputs, Tensor* out,
                          size_t num_outputs) {
  cudaStream_t s = static_cast<cudaStream_t>(c.stream);
  check(cudaSetDevice(device_.index), "cudaSetDevice");
  // The context's stream waits for the work queued so far on the legacy stream.
  auto wait_for_legacy_stream = [&] {
    // Nothing pending there (the usual case: the caller's tensors were written long before):
    // no event, no cross-stream wait for the graph's launch. Anything but cudaSuccess
    // (cudaErrorNotReady, or an error, which the event's record below reports) takes the wait.
    if (cudaStreamQuery(cudaStreamLegacy) == cudaSuccess) return;
    cudaEvent_t e = static_cast<cudaEvent_t>(c.legacy_ready);
    check(cudaEventRecord(e, cudaStreamLegacy), "cudaEventRecord (legacy stream)");
    check(cudaStreamWaitEvent(s, e, 0), "cudaStreamWaitEvent (legacy stream)");
  };
  if (c.legacy_ready) {
    // Note [CUDA streams of contexts]: device tensors of the caller may still be written (or,
    // for outputs, read) by work queued on the legacy stream; the call's work waits for it.
    bool on_device = false;
    for (size_t i = 0; i < num_inputs && !on_device; ++i) on_device = in[i].device() == device_;
    for (size_t i = 0; i < num_outputs && !on_device; ++i)
      on_device = out[i].defined() && out[i].device() == device_;
    if (on_device) wait_for_legacy_stream();
  }
  // Graph mode with every input and output a contiguous buffer on this device: one graph launch
  // holds the copies too (Note [Copies inside the graph]).
  // Note [Profiled graph-mode calls]: a call under a launch timer runs its launches one by one.
  const bool replay = graph_requested_ && !t_timer;
  if (replay && !c.io_broken && copies_in_graph_enabled() &&
      copies_fit_graph(in, num_inputs, out, num_outputs)) {
    if (!c.graph_exec) capture_cuda_graph(c, in);
    if (launch_graph_with_copies(c, in, num_inputs, out, num_outputs)) {
      ++c.io_calls;  // also a call whose device check fails below: it ran through this graph
      check(cudaStreamSynchronize(s), "cudaStreamSynchronize (the compiled graph's work)");
      if (c.status_host && c.status_host[0] != 0) fail_device_check(c);
      return;
    }
  }
  // Inputs: in place when on the device and contiguous (not in graph mode), else one async copy
  // into the input's staging buffer.
  for (size_t i = 0; i < num_inputs; ++i) {
    const InputSpec& sp = inputs[i];
    const Tensor& t = in[i];
    if (t.device() == device_ && t.is_contiguous() && !graph_requested_) {
      c.slots[size_t(sp.slot)] = static_cast<char*>(t.raw_data());
      continue;
    }
    Tensor src = t.is_contiguous() ? t : t.contiguous();
    // The gather into `src` was just queued on the legacy stream, after the wait above.
    if (c.legacy_ready && !same_tensor(src, t) && src.device() == device_) wait_for_legacy_stream();
    char* staging = c.staging[size_t(sp.slot)];
    check(cudaMemcpyAsync(staging, src.raw_data(), src.nbytes(),
                          src.device().is_cpu() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice, s),
          "cudaMemcpyAsync of an input");
    c.slots[size_t(sp.slot)] = staging;
    // A temporary (a non-contiguous input made contiguous) must live until its copy ran.
    if (!same_tensor(src, t)) check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }
  if (replay) {
    if (!c.graph_exec) capture_cuda_graph(c, in);
    check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(c.graph_exec), s), "cudaGraphLaunch");
  } else {
    run_launches(c, in);
    copy_status_back(c);
  }
  char* const* b = c.slots.data();
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
  if (c.status_host && c.status_host[0] != 0) fail_device_check(c);
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

// Note [Copies inside the graph]
// In graph mode a call used to be: an async copy per input into its staging buffer, the graph's
// launch, an async copy per output, the synchronisation: 2 + inputs + outputs stream operations,
// each a few microseconds of host time and a separate piece of device work (mlp f32 on the
// H200: 31 us a call, of which the graph itself is about 13). When every input and output is a
// contiguous buffer on the executable's device (what a GPU pipeline passes, and `kiln bench`),
// the copies are nodes of the graph instead: a second graph per context, built at the first
// such call from the call's own buffers (the first context's: at prepare, Note [Graph with
// copies at prepare]), holds a device-to-device copy node per input, the
// captured launches as a child graph after them, and a copy node per output after that, so the
// call is one graph launch and the synchronisation. A later call whose copies differ (a caller
// buffer moved; a destination moved because the input specs were reordered, which a package
// export does after its first call: the first version keyed nodes by the caller's buffer
// alone, and a package built from a CUDA module copied BERT's two inputs into each other's
// staging, found on the H100) repoints the nodes that changed
// (cudaGraphExecMemcpyNodeSetParams1D, no re-instantiation); one with the same copies
// (run_into with kept tensors) touches nothing. The copies are the plain path's,
// in the same order (inputs before the launches, outputs after), so the results are bitwise the
// same. Host buffers (a pageable host copy cannot be a graph node), non-contiguous or strided
// ones, empty ones, and outputs that overlap each other (the plain path copies them one after
// another, the graph's nodes would race) take the plain path, which stays as it was. Building
// or repointing that fails (a driver that refuses a node) turns the path off for the context,
// and the call runs the plain way.

bool Executable::copies_fit_graph(const Tensor* in, size_t num_inputs, const Tensor* out,
                                  size_t num_outputs) const {
  for (size_t i = 0; i < num_inputs; ++i) {
    const Tensor& t = in[i];
    if (t.device() != device_ || !t.is_contiguous() || t.nbytes() == 0) return false;
  }
  for (size_t i = 0; i < num_outputs; ++i) {
    const OutputSpec& o = outputs[i];
    const Tensor& t = out[i];
    // Anything the plain path would refuse goes there, for its message.
    if (!t.defined() || t.dtype() != o.dtype || t.sizes() != o.sizes || t.device() != device_ ||
        !o.strides.empty() || !t.is_contiguous() || t.nbytes() == 0)
      return false;
    const char* a = static_cast<const char*>(t.raw_data());
    for (size_t j = 0; j < i; ++j) {
      const char* b = static_cast<const char*>(out[j].raw_data());
      if (a < b + out[j].nbytes() && b < a + t.nbytes()) return false;
    }
  }
  return true;
}

// The graph with copies (Note [Copies inside the graph]) over c.io_copies (inputs', then
// outputs'), instantiated and uploaded. False, with nothing left behind, where the driver
// refuses a step.
bool Executable::build_io_graph(Context& c) {
  const std::vector<Context::IoCopy>& copies = c.io_copies;
  const size_t num_inputs = inputs.size(), n = copies.size();
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  auto fail = [&] {
    if (exec) cudaGraphExecDestroy(exec);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    c.io_nodes.clear();
    c.io_copies.clear();
    return false;
  };
  if (n != num_inputs + outputs.size() || cudaGraphCreate(&g, 0) != cudaSuccess) return fail();
  c.io_nodes.assign(n, nullptr);
  auto add_copy = [&](size_t k, const cudaGraphNode_t* after, size_t num_after) {
    const Context::IoCopy& cp = copies[k];
    return cudaGraphAddMemcpyNode1D(&c.io_nodes[k], g, after, num_after, cp.dst, cp.src,
                                    cp.bytes, cudaMemcpyDeviceToDevice) == cudaSuccess;
  };
  for (size_t k = 0; k < num_inputs; ++k)
    if (!add_copy(k, nullptr, 0)) return fail();
  // The launches after every input's copy, the outputs' copies after the launches.
  cudaGraphNode_t body = nullptr;
  if (cudaGraphAddChildGraphNode(&body, g, c.io_nodes.data(), num_inputs,
                                 static_cast<cudaGraph_t>(c.graph)) != cudaSuccess)
    return fail();
  for (size_t k = num_inputs; k < n; ++k)
    if (!add_copy(k, &body, 1)) return fail();
  {
    std::lock_guard<std::mutex> setup(pool_->cuda_setup);
    if (cudaGraphInstantiate(&exec, g, 0) != cudaSuccess) return fail();
  }
  if (cudaGraphUpload(exec, static_cast<cudaStream_t>(c.stream)) != cudaSuccess) return fail();
  c.io_graph = g;
  c.io_exec = exec;
  return true;
}

// Note [Graph with copies at prepare]
// Building the graph with copies at the first call cost that call the instantiation of a
// second graph as large as the model's (resnet50 bf16 on the H100: a first call of 0.84-1.0 ms
// against a p50 of 0.395 ms). prepare() builds it right after capturing the model's graph,
// over placeholder copies: each input's staging buffer onto itself, each output's arena bytes
// onto themselves (the sizes the call's must have). The first call then only repoints its
// copies, as any call whose buffers moved does. The placeholders never run: a call launches
// the graph only after setting every copy that differs from the call's own, and a copy that
// equals its placeholder is the identity. Outputs that no call can copy inside the graph
// (strided views) or empty buffers build nothing here; a driver that refuses the placeholders
// leaves the first call to build the graph as before.
void Executable::prebuild_io_graph(Context& c) {
  if (!copies_in_graph_enabled() || c.io_exec || !c.graph) return;
  std::vector<Context::IoCopy>& copies = c.io_copies;
  copies.clear();
  for (const InputSpec& sp : inputs) {
    const int64_t bytes = numel(sp.sizes) * int64_t(dtype_size(sp.dtype));
    if (bytes == 0) return copies.clear();
    char* at = c.staging[size_t(sp.slot)];
    copies.push_back({at, at, size_t(bytes)});
  }
  for (const OutputSpec& o : outputs) {
    const int64_t bytes = numel(o.sizes) * int64_t(dtype_size(o.dtype));
    if (!o.strides.empty() || bytes == 0) return copies.clear();
    char* at = c.slots[size_t(o.slot)] + o.byte_offset;
    copies.push_back({at, at, size_t(bytes)});
  }
  build_io_graph(c);
}

bool Executable::launch_graph_with_copies(Context& c, const Tensor* in, size_t num_inputs,
                                          Tensor* out, size_t num_outputs) {
  // Copy k: input k into its staging buffer, or output k - num_inputs out of the arena. All
  // three parts are compared with the node's at every call, not only the caller's buffer: the
  // input specs may be reordered after a context exists (nn::compile_captured_graph puts them
  // in call order after its first call), which moves a node's destination, and a freed and
  // reallocated caller buffer often comes back at the same address.
  using Copy = Context::IoCopy;
  auto copy = [&](size_t k) -> Copy {
    if (k < num_inputs)
      return {c.staging[size_t(inputs[k].slot)], in[k].raw_data(), in[k].nbytes()};
    const OutputSpec& o = outputs[k - num_inputs];
    Tensor& t = out[k - num_inputs];
    return {t.raw_data(), c.slots[size_t(o.slot)] + o.byte_offset, t.nbytes()};
  };
  auto give_up = [&] {
    cudaGetLastError();
    c.io_broken = true;
    return false;
  };
  const size_t n = num_inputs + num_outputs;
  if (!c.io_exec) {
    c.io_copies.resize(n);
    for (size_t k = 0; k < n; ++k) c.io_copies[k] = copy(k);
    if (!build_io_graph(c)) return give_up();
  } else {
    for (size_t k = 0; k < n; ++k) {
      const Copy cp = copy(k);
      if (cp == c.io_copies[k]) continue;
      if (cudaGraphExecMemcpyNodeSetParams1D(static_cast<cudaGraphExec_t>(c.io_exec),
                                             c.io_nodes[k], cp.dst,
                                             cp.src, cp.bytes, cudaMemcpyDeviceToDevice) != cudaSuccess)
        return give_up();
      c.io_copies[k] = cp;
    }
  }
  // A launch that fails is a real error of the call (the device's state), not a reason to fall
  // back: it throws.
  check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(c.io_exec), static_cast<cudaStream_t>(c.stream)),
        "cudaGraphLaunch (the graph with its copies)");
  return true;
}

int64_t Executable::graphs_with_copies_built() const {
  std::lock_guard<std::mutex> lock(pool_->mu);
  int64_t n = 0;
  for (const auto& c : pool_->all) n += c->io_exec != nullptr;
  return n;
}

int64_t Executable::calls_with_copies_in_graph() const {
  std::lock_guard<std::mutex> lock(pool_->mu);
  int64_t n = 0;
  for (const auto& c : pool_->all) n += c->io_calls;
  return n;
}

// Note [CUDA graph at prepare]: in graph mode every input goes through its staging buffer, so a
// context's graph does not depend on the call's inputs: prepare() captures the first context's
// graph (with the input slots pointing at staging), instantiates it and uploads it to the
// device, and the first call only copies its inputs in and replays it. Capturing runs nothing
// (no kernel executes on uninitialised inputs), but the capture makes the library plans record
// their launches and the driver load every kernel the graph launches, which the first call paid
// for before. Contexts made later for concurrent callers capture at their first call.

// Note [Profiled graph-mode calls]
// A profile times each launch with events recorded on its stream around it (Executable::
// LaunchTimer). Recorded during a stream capture, those events would become nodes of the graph,
// never complete as events of the stream, and the profiler's wait on them fails ("invalid
// argument"). So a capture runs with the thread's timer unset, and a graph-mode call made under a
// timer runs its launches one by one on the context's stream, as default mode does, instead of
// replaying the graph. Each launch's time then carries its two events and the device's
// front-end time for a launch outside a graph (a few microseconds), so the launches' sum exceeds
// the graph's call: bert_base bf16 on an H100, 0.951 ms of launches against a 0.654 ms call. The
// shares and each kernel's standing against its floor are what the profile is for; the
// host-observed time of a call (`call_ms`) is measured with no timer, through the graph.
// ProfileCuda.* (tests/cuda) profiles both modes.
void* Executable::capture_launches(Context& c, const Tensor* in) {
  cudaStream_t s = static_cast<cudaStream_t>(c.stream);
  struct NoTimer {  // restored on every exit, a throw included
    LaunchTimer* saved = set_launch_timer(nullptr);
    ~NoTimer() { set_launch_timer(saved); }
  } no_timer;
  // This context's graph, over its arena and staging buffers (Note [Execution contexts]).
  for (const InputSpec& sp : inputs) c.slots[size_t(sp.slot)] = c.staging[size_t(sp.slot)];
  cudaGraph_t graph = nullptr;
  // Library state held for the capture (cuDNN's shared handle) is released when the scope
  // closes, after the capture has ended (Note [Library calls replayed as graphs]).
  cuda::GraphReplay::CaptureScope scope(s);
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  try {
    run_launches(c, in);
    copy_status_back(c);
  } catch (...) {
    cudaStreamEndCapture(s, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    throw;
  }
  check(cudaStreamEndCapture(s, &graph), "cudaStreamEndCapture");
  return graph;
}

void Executable::capture_cuda_graph(Context& c, const Tensor* in) {
  cudaStream_t s = static_cast<cudaStream_t>(c.stream);
  std::lock_guard<std::mutex> setup(pool_->cuda_setup);
  cudaGraph_t graph = static_cast<cudaGraph_t>(capture_launches(c, in));
  c.graph = graph;
  cudaGraphExec_t exec = nullptr;
  check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  c.graph_exec = exec;
  check(cudaGraphUpload(exec, s), "cudaGraphUpload");
}

// Note [CUDA modules warmed at prepare]
// CUDA loads a kernel's module when the kernel is first launched (lazy loading, the default since
// CUDA 12), so a default-mode package's first call paid for loading every cuDNN and cuBLASLt
// kernel it uses: resnet50 f32 on the H200, first call 7.7-8.3 ms against a p50 of 2.09 ms.
// Loading all of the libraries' modules up front (CUDA_MODULE_LOADING=EAGER) costs 1.3-2 s of
// load. Instead, prepare() captures the launch list once, as graph mode does, and destroys the
// graph without instantiating it: nothing runs, but each launch resolves its kernels, which loads
// just their modules. The input slots point at the context's staging buffers meanwhile (a call
// binds its own). Best effort: a launch list that cannot be captured is left to load its modules
// at the first call, as before.
void Executable::warm_cuda_modules(Context& c) {
  std::lock_guard<std::mutex> setup(pool_->cuda_setup);
  try {
    cudaGraphDestroy(static_cast<cudaGraph_t>(capture_launches(c, nullptr)));
  } catch (const Error&) {
    // capture_launches cleaned up: the first call loads the modules instead
  }
}

void Executable::copy_status_back(Context& c) {
  if (!c.status_host) return;
  check(cudaMemcpyAsync(c.status_host, c.status_owner.get(), 2 * sizeof(int64_t),
                        cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(c.stream)),
        "cudaMemcpyAsync of the status record");
}

void Executable::fail_device_check(Context& c) {
  const int64_t code = c.status_host[0], value = c.status_host[1];
  // Cleared before the context serves another call (the lease gives it back as this throws).
  cudaStream_t s = static_cast<cudaStream_t>(c.stream);
  check(cudaMemsetAsync(c.status_owner.get(), 0, 2 * sizeof(int64_t), s), "cudaMemsetAsync");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  c.status_host[0] = c.status_host[1] = 0;
  for (const DeviceCheck& d : device_checks_)
    if (d.code == code) fail_kind(ErrorKind::InvalidArgument, "{}{}{}", d.prefix, value, d.suffix);
  fail_kind(ErrorKind::Internal, "compiled graph: a kernel reported check {} (value {}), which no "
            "check of this executable has", code, value);
}

TensorList Executable::run(const TensorList& in) {
  if (!not_runnable_.empty()) fail_kind(ErrorKind::NotSupported, "{}", not_runnable_);
  TensorList out;
  out.reserve(outputs.size());
  for (const OutputSpec& o : outputs) out.push_back(Tensor::empty(o.sizes, o.dtype, device_));
  run(in.data(), in.size(), out.data(), out.size());
  return out;
}

}  // namespace kiln
