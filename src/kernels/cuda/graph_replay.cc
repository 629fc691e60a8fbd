// Note [Library calls replayed as graphs]
// A steady-state compiled call does no host heap allocation (issue #12), but the libraries'
// enqueue calls do, inside the library, on every call. Measured on the H200 (cuDNN 9.14, CUDA
// 13.0), per default-mode call: cudnnBackendExecute ~33 allocations per convolution and ~20 per
// fused attention (ResNet-50 in bfloat16: 1,748 per call); cublasLtMatmul 2 per bfloat16 GEMM
// (ViT-B/16: 98 per call; float32 GEMMs none). Kiln's own kernels allocate nothing. Reduce-
// overhead never sees this: its whole-executable graph replays the kernels the libraries
// enqueued, not the libraries' host code.
//
// Default mode gets the same by capturing each such call on its own: the kernels the call
// enqueues become a graph, instantiated once and launched with cudaGraphLaunch on the context's
// stream. A graph holds the pointers it was captured with, so the replay is keyed on every
// pointer of the call (its buffers and workspace). Inputs bound in place can change their
// pointer from call to call, so:
//   - a key seen for the first time runs directly (exactly the old path, no capture cost);
//   - the second call in a row with the same key captures it (cudaGraphExecUpdate of the
//     existing executable graph where the topology allows, else a new instantiation);
//   - while the key stays the captured one, calls replay.
// A caller that feeds a fresh device buffer every call therefore pays what it paid before, and
// nothing more, on the calls that read it; everyone else replays.
//
// The capture runs in thread-local capture mode on a non-blocking stream from a small
// process-wide pool: legacy-stream work of other threads neither joins the capture nor fails
// because of it (the lesson of Note [CUDA streams of contexts] in runtime/executable.cc). When
// the caller's own stream is being captured (reduce-overhead records the whole executable), the
// call runs directly into that outer capture. One GraphReplay serves one launch of one
// execution context, which a single thread holds at a time, so it needs no lock. The CUDA
// driver itself still allocates now and then (measured: once per 30-100 calls, on its own thread
// or inside cuGraphLaunch), never per call.
#include "kernels/cuda/graph_replay.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/error.h"

namespace kiln::cuda {

namespace {

bool same_key(const void* const* a, int na, const void* const* b, int nb) {
  return na == nb && std::equal(a, a + na, b);
}

// Capture streams, shared by every GraphReplay of the process: a capture starts and ends inside
// one run() on one thread, so a stream serves one capture at a time and goes back to the pool
// (as many streams as threads ever captured at once, per device; kept for the process's life).
struct CaptureStreams {
  std::mutex mu;
  std::vector<std::pair<int, cudaStream_t>> free;
};
CaptureStreams& capture_streams() {
  static auto* pool = new CaptureStreams;  // never destroyed: streams outlive static teardown
  return *pool;
}

class CaptureStream {
 public:
  CaptureStream() {
    check_cuda(cudaGetDevice(&device_), "cudaGetDevice");
    CaptureStreams& p = capture_streams();
    {
      std::lock_guard<std::mutex> lock(p.mu);
      for (size_t i = 0; i < p.free.size(); ++i)
        if (p.free[i].first == device_) {
          stream_ = p.free[i].second;
          p.free.erase(p.free.begin() + ptrdiff_t(i));
          return;
        }
    }
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  ~CaptureStream() {
    CaptureStreams& p = capture_streams();
    std::lock_guard<std::mutex> lock(p.mu);
    p.free.emplace_back(device_, stream_);
  }
  CaptureStream(const CaptureStream&) = delete;
  CaptureStream& operator=(const CaptureStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
};

// The capture in progress on this thread (Note [Library calls replayed as graphs]), and what to
// call when it ends.
struct CaptureState {
  void* stream = nullptr;
  void (*fns[GraphReplay::kMaxAtCaptureEnd])(void*) = {};
  void* args[GraphReplay::kMaxAtCaptureEnd] = {};
  int n = 0;
};
thread_local CaptureState t_capture;

}  // namespace

GraphReplay::CaptureScope::CaptureScope(void* stream) {
  KILN_ASSERT(!t_capture.stream && t_capture.n == 0);
  t_capture.stream = stream;
}

GraphReplay::CaptureScope::~CaptureScope() {
  CaptureState& c = t_capture;
  c.stream = nullptr;
  while (c.n > 0) {
    --c.n;
    c.fns[c.n](c.args[c.n]);
  }
}

void* GraphReplay::capturing_stream() { return t_capture.stream; }

void GraphReplay::at_capture_end(void (*fn)(void*), void* arg) {
  CaptureState& c = t_capture;
  KILN_ASSERT(c.stream && c.n < kMaxAtCaptureEnd);
  c.fns[c.n] = fn;
  c.args[c.n] = arg;
  ++c.n;
}

bool GraphReplay::enabled_by_default() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_GRAPH_REPLAY");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

GraphReplay::~GraphReplay() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
}

void GraphReplay::run(void* stream, const void* const* key, int n, EnqueueFn enqueue, void* ctx) {
  if (!enabled_ || !stream || n > kMaxKey) {
    ++stats_.direct;
    enqueue(ctx, stream);
    return;
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(s, &status), "cudaStreamIsCapturing");
  if (status != cudaStreamCaptureStatusNone) {  // part of the caller's own graph
    ++stats_.direct;
    enqueue(ctx, stream);
    return;
  }
  if (same_key(key, n, captured_, captured_n_)) {
    ++stats_.replays;
    check_cuda(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), s), "cudaGraphLaunch");
    return;
  }
  if (!same_key(key, n, last_, last_n_)) {  // a new key: direct, and remembered
    std::copy(key, key + n, last_);
    last_n_ = n;
    ++stats_.direct;
    enqueue(ctx, stream);
    return;
  }
  capture(key, n, enqueue, ctx);
  if (captured_n_ < 0) {  // the capture failed: replay is off for this call site
    ++stats_.direct;
    enqueue(ctx, stream);
    return;
  }
  ++stats_.captures;
  check_cuda(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), s), "cudaGraphLaunch");
}

void GraphReplay::capture(const void* const* key, int n, EnqueueFn enqueue, void* ctx) {
  auto give_up = [&] {
    cudaGetLastError();
    if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
    exec_ = nullptr;
    captured_n_ = -1;
    enabled_ = false;
  };
  CaptureStream stream;
  cudaStream_t cs = stream.get();
  check_cuda(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  bool enqueued = true;
  cudaGraph_t graph = nullptr;
  cudaError_t ended = cudaSuccess;
  {
    CaptureScope scope(cs);
    try {
      enqueue(ctx, cs);
    } catch (...) {
      enqueued = false;  // the direct run after give_up() reports it, if it is real
    }
    ended = cudaStreamEndCapture(cs, &graph);
  }  // the capture has ended: what the library holds until then is released
  if (!enqueued || ended != cudaSuccess || !graph) {
    if (graph) cudaGraphDestroy(graph);
    give_up();
    return;
  }
  bool ok = false;
  if (exec_) {
    cudaGraphExecUpdateResultInfo info{};
    ok = cudaGraphExecUpdate(static_cast<cudaGraphExec_t>(exec_), graph, &info) == cudaSuccess;
    if (!ok) {
      cudaGetLastError();
      cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
      exec_ = nullptr;
    }
  }
  if (!ok) {
    cudaGraphExec_t exec = nullptr;
    ok = cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    exec_ = exec;
  }
  cudaGraphDestroy(graph);  // an executable graph does not need its source
  if (!ok) {
    give_up();
    return;
  }
  std::copy(key, key + n, captured_);
  captured_n_ = n;
}

}  // namespace kiln::cuda
