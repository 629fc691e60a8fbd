// Per-op profiling: an OpObserver (eager/dispatch.h) that timestamps every op call_op runs on
// this thread, plus named spans ("capture/compile", "iteration"), aggregated into a table and
// written as Chrome trace-event JSON. Used by `kiln profile` (tools/cmd_profile.cc).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"
#include "ops/dispatch.h"
#include "runtime/executable.h"

namespace kiln {

struct ProfileEvent {
  std::string name;  // op name or span name
  std::string cat;   // "op" or "span"
  std::string site;  // call site ("layers.cc:88") for ops; empty for spans
  int64_t start_ns = 0;  // since the profiler was created
  int64_t dur_ns = 0;
  int64_t self_ns = 0;   // dur minus nested ops (decompositions calling back into call_op)
  int depth = 0;         // op nesting depth (0 = called by model/interpreter code)
  int tid = 0;
  // A launch timed on the device (Profiler::set_cuda_events): self_ns is its device time (dur_ns
  // stays the host's enqueue time); cat "gpu" events place it on the device's timeline.
  bool device_timed = false;
  // A launch whose work is known (Executable::Launch::flops/bytes) under a profiler with a
  // roofline (Profiler::set_roofline): the least time that work needs on this machine.
  double floor_ms = -1;
  double flops = 0, bytes = 0;  // launches: the work it does (Executable::Launch)
};

// What the machine sustains (Note [Kernel work] in lower/cost.cc): a matmul's FLOP rate per dtype
// class and a large copy's bandwidth, per millisecond. Zeros: unknown (no floors).
struct Roofline {
  double flops_per_ms = 0;      // float32 contractions (and everything else)
  double low_flops_per_ms = 0;  // bfloat16 / float16 contractions (0: use flops_per_ms)
  double bytes_per_ms = 0;      // the caches' (a copy that fits the last level)
  double mem_bytes_per_ms = 0;  // memory's (a copy past the last level); 0: bytes_per_ms
  // The last-level cache's size: a kernel whose activation bytes exceed it moves them at the
  // memory's bandwidth too (0: never).
  double cache_bytes = 0;
  // The least time of `flops` and `bytes`, of which `const_bytes` are weights (at the memory's
  // bandwidth), whose contraction runs in `compute`; -1 when unknown.
  double floor_ms(double flops, double bytes, double const_bytes, DType compute) const;
};

struct OpStat {
  std::string name;
  int64_t calls = 0;
  double total_ms = 0;  // self time: nested ops are counted under their own name
  double mean_ms = 0;
  double share = 0;     // of all op self time, in percent
  std::vector<std::pair<std::string, int64_t>> top_sites;  // up to 3 (site, calls), most first
  // Launches with a known floor (ProfileEvent::floor_ms): the floor per call and mean_ms over it
  // (how many times its roofline the kernel takes); -1 otherwise.
  double floor_ms = -1;
  double ratio = -1;
  // Launches with known work: what they achieved, over all their calls (GFLOP/s, GB/s); -1 else.
  double gflops = -1, gbytes_per_s = -1;
};

// Also times every launch of compiled graphs (Executable::LaunchTimer): a launch is an event
// named after its kernel ("k3_add_relu", "conv2d:layers.cc:88") whose site lists its graph nodes.
class Profiler : public OpObserver, public Executable::LaunchTimer {
 public:
  Profiler();
  ~Profiler() override;
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // CUDA: synchronize device `index` before every op and launch begins and ends, so each
  // event times that kernel on the device (-1: never, the default).
  void set_cuda_sync(int index) { sync_cuda_device_ = index; }
  // CUDA: time every launch with events recorded on its stream before and after it, read at
  // the end of each span (one synchronization per iteration): the launch's self time is its
  // device time. The first launch of each span holds the stream (CudaEventLog::hold) until the
  // host has enqueued the rest, so the kernels run back to back and the events time them, not
  // the host's submissions. Ops are not synchronized in this mode (host times).
  void set_cuda_events(int index);
  // Launches started from now on get a floor (ProfileEvent::floor_ms) from these rates.
  void set_roofline(const Roofline& r) { roofline_ = r; }
  const Roofline& roofline() const { return roofline_; }

  // Starts/stops observing ops on the calling thread.
  void start();
  void stop();
  // A named span on the calling thread (spans may nest; end closes the innermost).
  void begin_span(const std::string& name);
  void end_span();

  void op_begin(OpId op, const std::source_location& loc) override;
  void op_end(OpId op) override;
  void launch_begin(const Executable::Launch& l, const Executable::RunContext& ctx) override;
  void launch_end(const Executable::Launch& l, const Executable::RunContext& ctx) override;

  // Completed events, in completion order.
  const std::vector<ProfileEvent>& events() const { return events_; }
  // Ops that started at or after `since_ns`, aggregated by name, sorted by total self time
  // (largest first).
  std::vector<OpStat> aggregate(int64_t since_ns = 0) const;
  // {"traceEvents":[...], "displayTimeUnit":"ms"}: one "X" event per op and span, ts/dur in us,
  // sorted by start time.
  std::string chrome_trace() const;
  // Writes chrome_trace() to `path` atomically (a temporary file renamed over it).
  void write_trace(const std::string& path) const;

 private:
  void sync_device();
  void resolve_device_times();
  struct Open {
    std::string name;
    const char* file;
    uint32_t line;
    bool is_op;
    int64_t start_ns;
    int64_t child_ns;
    std::string site_text;  // launches: the graph nodes
    int event = -1;         // set_cuda_events: the event recorded before the launch
    double floor_ms = -1;   // launches: ProfileEvent::floor_ms
    double flops = 0, bytes = 0;
  };
  struct Pending {  // a launch whose device time is not read yet
    size_t index;   // into events_
    int begin, end;
  };
  int64_t now_ns() const;
  void close(bool is_op);
  int64_t origin_ns_;
  int sync_cuda_device_ = -1;
  Roofline roofline_;
  std::unique_ptr<CudaEventLog> cuda_events_;
  std::vector<Pending> pending_;
  std::vector<Open> stack_;
  std::vector<ProfileEvent> events_;
  OpObserver* prev_ = nullptr;
  Executable::LaunchTimer* prev_timer_ = nullptr;
  bool active_ = false;
};

struct ProfileOptions {
  std::string target;              // zoo model name
  std::string device = "cpu";      // cpu | cuda
  std::string backend = "compiled";  // eager | compiled
  std::string mode = "default";      // compile mode: default | reduce-overhead | max-autotune
  std::string dtype = "float32";     // the compiled run's precision, as bench's --dtype
  int64_t batch = 1;
  int iters = 10;
  int warmup = 1;
  int threads = 0;
  uint64_t seed = 0;
};

struct ProfileRun {
  std::string model, backend;  // backend as in bench: "eager" or "compiled(<name>)"
  int iters = 0;
  int64_t ops_per_iteration = 0;  // top-level (depth 0) op launches per timed iteration
  int64_t graph_ops = -1;         // ops in the captured graphs (compiled backend), else -1
  std::vector<OpStat> table;      // from the timed iterations only
  // CUDA, compiled: per timed iteration, the sum of the launches' device times, and the
  // host-observed time of a call measured with the profiler off (median; device_ms / call_ms:
  // how busy the call keeps the GPU, the rest being launches and synchronization).
  double device_ms = -1, call_ms = -1;
  // The roofline (Note [Kernel work]): the rates the floors come from, and over the kernels whose
  // median call takes at least min_kernel_ms (shorter ones are dominated by fixed costs a
  // roofline does not model: thread start-up, a launch), the one furthest from its floor.
  // Kernels under that: how many and their share of the profiled time.
  static constexpr double kRooflineMinMs = 0.02;     // CPU kernels
  static constexpr double kRooflineMinMsGpu = 0.002;  // CUDA launches (their device times)
  double min_kernel_ms = kRooflineMinMs;
  Roofline roofline;
  std::string worst_kernel, worst_nodes;
  double worst_ratio = -1, worst_ms = -1, worst_floor_ms = -1;  // worst_ms: its median call
  int64_t short_kernels = 0;
  double short_share = 0;  // percent
  // The profiled time in kernels within 2x, 2-5x and over 5x their floor (percent; kernels
  // with a floor and at least min_kernel_ms per call).
  double share_within_2x = 0, share_2x_to_5x = 0, share_over_5x = 0;
  // Whether any launch had a floor (worst_ratio is -1 when none was long enough to judge).
  bool has_roofline() const { return worst_ratio > 0 || short_kernels > 0; }
};

// Profiles `iters` iterations of a zoo model (after warm-up) with `profiler` observing. The
// profiler records a "capture/compile" span (compiled backend: compile + first call) and one
// "iteration" span per timed iteration. Throws kiln::Error for bad options.
ProfileRun run_profile(const ProfileOptions& options, Profiler& profiler);

}  // namespace kiln
