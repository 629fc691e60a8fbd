// One library call replayed as a small CUDA graph (Note [Library calls replayed as graphs] in
// graph_replay.cc). cuDNN's cudnnBackendExecute does ~20-35 host heap allocations per call,
// cublasLtMatmul 2 for half-precision GEMMs; a graph of the kernels they enqueued, launched with
// cudaGraphLaunch, does none. The graph bakes in every pointer the call used, so a replay is
// keyed on them:
//
//   cuda::GraphReplay replay;  // one per call site and execution context (not thread-safe)
//   const void* key[] = {x, w, y, workspace};
//   replay.run(stream, key, 4, [](void* ctx, void* s) { ...enqueue on s... }, &args);
//
// The first call with a key runs directly; the second in a row with the same key is captured
// and launched, later ones replay. A stream that is itself being captured (reduce-overhead's
// whole-executable graph) always runs directly, into the outer graph. No CUDA headers here.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kiln::cuda {

class GraphReplay {
 public:
  static constexpr int kMaxKey = 16;
  using EnqueueFn = void (*)(void* ctx, void* stream);

  // Replay is on unless KILN_GRAPH_REPLAY=0 (read once per process): the A/B switch for
  // benchmarks, and a way out should a library change its capture behaviour.
  static bool enabled_by_default();

  explicit GraphReplay(bool enabled = enabled_by_default()) : enabled_(enabled) {}
  ~GraphReplay();
  GraphReplay(const GraphReplay&) = delete;
  GraphReplay& operator=(const GraphReplay&) = delete;

  // Enqueues `enqueue(ctx, stream)`'s work on `stream` (a cudaStream_t, not the legacy
  // stream), directly or as the replay of its captured graph. `key`: every pointer the call
  // reads or writes (n <= kMaxKey; more: always direct). Throws kiln::Error (Runtime) naming
  // the CUDA call that failed; a failed capture turns replay off for this object and runs the
  // call directly (so a real error of the call surfaces as its own).
  void run(void* stream, const void* const* key, int n, EnqueueFn enqueue, void* ctx);

  // The stream the calling thread is capturing inside a CaptureScope (a library call's capture
  // in run(), or an executable's whole-graph capture), else nullptr; and a function to call
  // right after that capture ends (also when it fails), at most kMaxAtCaptureEnd per scope. A
  // library whose shared state (cuDNN's handle and its stream) must not be left pointing at a
  // capturing stream holds it until then.
  static void* capturing_stream();
  static constexpr int kMaxAtCaptureEnd = 4;
  static void at_capture_end(void (*fn)(void*), void* arg);

  // Open from just before cudaStreamBeginCapture(stream) to just after cudaStreamEndCapture;
  // the destructor runs what at_capture_end registered. Not nested: one per thread at a time.
  class CaptureScope {
   public:
    explicit CaptureScope(void* stream);
    ~CaptureScope();
    CaptureScope(const CaptureScope&) = delete;
    CaptureScope& operator=(const CaptureScope&) = delete;
  };

  struct Stats {
    int64_t direct = 0, captures = 0, replays = 0;
  };
  const Stats& stats() const { return stats_; }
  bool enabled() const { return enabled_; }

 private:
  void capture(const void* const* key, int n, EnqueueFn enqueue, void* ctx);

  bool enabled_;
  void* exec_ = nullptr;            // cudaGraphExec_t
  const void* captured_[kMaxKey] = {};
  int captured_n_ = -1;  // -1: no graph
  const void* last_[kMaxKey] = {};
  int last_n_ = -1;  // the previous call's key
  Stats stats_;
};

}  // namespace kiln::cuda
