#include "bench/profiler.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "capture/compile.h"
#include "nn/compile.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "support/files.h"
#include "nn/models/zoo.h"
#include "bench/bench.h"
#include "kernels/cuda/cublaslt_gemm.h"
#include "kernels/onednn_node.h"
#include "passes/autocast.h"

namespace kiln {

namespace {
int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
// A small stable id per thread for trace "tid" fields.
int thread_index() {
  static std::atomic<int> next{1};
  thread_local int id = next++;
  return id;
}
std::string site_str(const char* file, uint32_t line) {
  std::string_view f = file ? file : "?";
  size_t slash = f.rfind('/');
  if (slash != std::string_view::npos) f = f.substr(slash + 1);
  return fmt::format("{}:{}", f, line);
}
}  // namespace

Profiler::Profiler() : origin_ns_(steady_ns()) {}
Profiler::~Profiler() {
  if (active_) stop();
}

int64_t Profiler::now_ns() const { return steady_ns() - origin_ns_; }

void Profiler::start() {
  if (active_) return;
  prev_ = set_op_observer(this);
  prev_timer_ = Executable::set_launch_timer(this);
  active_ = true;
}
void Profiler::stop() {
  if (!active_) return;
  set_op_observer(prev_);
  Executable::set_launch_timer(prev_timer_);
  active_ = false;
}

// Long enough for the host to enqueue a whole call of the models Kiln profiles (BERT-base: ~180
// launches, 2 ms); a longer call just lets the first kernels start before the last are queued.
constexpr int kHoldMicroseconds = 20000;

void Profiler::set_cuda_events(int index) {
  cuda_events_ = std::make_unique<CudaEventLog>(index);
  sync_cuda_device_ = -1;
}

// Reads the pending launches' device times (one synchronization) and adds each launch's place on
// the device's timeline: its start relative to the first pending launch's, after that launch's
// host start.
void Profiler::resolve_device_times() {
  if (pending_.empty()) return;
  cuda_events_->synchronize();
  const Pending& first = pending_.front();
  const int64_t base_ns = events_[first.index].start_ns;
  for (const Pending& p : pending_) {
    ProfileEvent& e = events_[p.index];
    const int64_t dev_ns = int64_t(cuda_events_->elapsed_ms(p.begin, p.end) * 1e6);
    e.self_ns = dev_ns;
    e.device_timed = true;
    ProfileEvent g;
    g.name = e.name;
    g.cat = "gpu";
    g.site = e.site;
    g.start_ns = base_ns + int64_t(cuda_events_->elapsed_ms(first.begin, p.begin) * 1e6);
    g.dur_ns = g.self_ns = dev_ns;
    g.tid = 0;  // the device's row
    events_.push_back(std::move(g));
  }
  pending_.clear();
  cuda_events_->clear();
}

void Profiler::begin_span(const std::string& name) {
  stack_.push_back({name, nullptr, 0, false, now_ns(), 0, {}});
}
void Profiler::end_span() {
  KILN_CHECK(!stack_.empty() && !stack_.back().is_op,
             "Profiler::end_span: no open span (found {})",
             stack_.empty() ? "nothing open" : "an open op");
  resolve_device_times();  // inside the span: its time includes waiting for the device
  close(false);
}

void Profiler::sync_device() {
  if (sync_cuda_device_ >= 0) cuda_synchronize(sync_cuda_device_);
}

void Profiler::op_begin(OpId op, const std::source_location& loc) {
  sync_device();
  // The name is looked up at begin so a throwing op still closes a labelled event.
  stack_.push_back({op_def(op).name, loc.file_name(), loc.line(), true, now_ns(), 0, {}});
}
void Profiler::op_end(OpId) {
  sync_device();
  if (!stack_.empty() && stack_.back().is_op) close(true);
}
void Profiler::launch_begin(const Executable::Launch& l, const Executable::RunContext& ctx) {
  sync_device();
  // The first launch of an iteration holds the stream while the host enqueues the rest
  // (CudaEventLog::hold), so the events time the kernels back to back.
  if (cuda_events_ && cuda_events_->size() == 0)
    cuda_events_->hold(ctx.stream, kHoldMicroseconds);
  int event = cuda_events_ ? cuda_events_->record(ctx.stream) : -1;
  stack_.push_back({l.name, nullptr, 0, true, now_ns(), 0, l.kind + ": " + l.nodes, event,
                    roofline_.floor_ms(l.flops, l.bytes, l.const_bytes, l.compute), l.flops,
                    l.bytes});
}
void Profiler::launch_end(const Executable::Launch&, const Executable::RunContext& ctx) {
  sync_device();
  if (stack_.empty() || !stack_.back().is_op) return;
  const int begin = stack_.back().event;
  close(true);
  if (begin >= 0) pending_.push_back({events_.size() - 1, begin, cuda_events_->record(ctx.stream)});
}

void Profiler::close(bool is_op) {
  int64_t end = now_ns();
  Open o = std::move(stack_.back());
  stack_.pop_back();
  int depth = 0;
  for (const Open& s : stack_) depth += s.is_op ? 1 : 0;
  ProfileEvent e;
  e.name = std::move(o.name);
  e.cat = is_op ? "op" : "span";
  if (is_op) e.site = o.file ? site_str(o.file, o.line) : o.site_text;
  e.start_ns = o.start_ns;
  e.dur_ns = end - o.start_ns;
  e.self_ns = e.dur_ns - o.child_ns;
  e.depth = depth;
  e.tid = thread_index();
  e.floor_ms = o.floor_ms;
  e.flops = o.flops;
  e.bytes = o.bytes;
  // Only ops subtract from an enclosing op's self time; spans are just markers.
  if (is_op && !stack_.empty() && stack_.back().is_op) stack_.back().child_ns += e.dur_ns;
  events_.push_back(std::move(e));
}

std::vector<OpStat> Profiler::aggregate(int64_t since_ns) const {
  struct Acc {
    int64_t calls = 0, self_ns = 0;
    std::map<std::string, int64_t> sites;
    double floor_ms = 0;
    bool floor_known = true;
    double flops = 0, bytes = 0;
  };
  std::map<std::string, Acc> by_name;
  int64_t total_ns = 0;
  for (const ProfileEvent& e : events_) {
    if (e.cat != "op" || e.start_ns < since_ns) continue;
    Acc& a = by_name[e.name];
    a.calls++;
    a.self_ns += e.self_ns;
    a.sites[e.site]++;
    total_ns += e.self_ns;
    if (e.floor_ms > 0) a.floor_ms += e.floor_ms;
    else a.floor_known = false;
    a.flops += e.flops;
    a.bytes += e.bytes;
  }
  std::vector<OpStat> out;
  for (auto& [name, a] : by_name) {
    OpStat s;
    s.name = name;
    s.calls = a.calls;
    s.total_ms = double(a.self_ns) / 1e6;
    s.mean_ms = s.total_ms / double(a.calls);
    s.share = total_ns > 0 ? 100.0 * double(a.self_ns) / double(total_ns) : 0.0;
    std::vector<std::pair<std::string, int64_t>> sites(a.sites.begin(), a.sites.end());
    std::stable_sort(sites.begin(), sites.end(),
                     [](const auto& x, const auto& y) { return x.second > y.second; });
    if (sites.size() > 3) sites.resize(3);
    s.top_sites = std::move(sites);
    if (a.floor_known && a.floor_ms > 0) {
      s.floor_ms = a.floor_ms / double(a.calls);
      s.ratio = s.mean_ms / s.floor_ms;
    }
    if ((a.flops > 0 || a.bytes > 0) && a.self_ns > 0) {
      s.gflops = a.flops / double(a.self_ns);  // FLOP per ns = GFLOP/s
      s.gbytes_per_s = a.bytes / double(a.self_ns);
    }
    out.push_back(std::move(s));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const OpStat& x, const OpStat& y) { return x.total_ms > y.total_ms; });
  return out;
}

std::string Profiler::chrome_trace() const {
  std::vector<const ProfileEvent*> sorted;
  for (const ProfileEvent& e : events_) sorted.push_back(&e);
  // By start; an enclosing event (longer) before the ones it contains when starts tie.
  std::stable_sort(sorted.begin(), sorted.end(), [](const ProfileEvent* a, const ProfileEvent* b) {
    return a->start_ns != b->start_ns ? a->start_ns < b->start_ns : a->dur_ns > b->dur_ns;
  });
  nlohmann::json events = nlohmann::json::array();
  int pid = int(getpid());
  for (const ProfileEvent* e : sorted) {
    nlohmann::json j = {{"name", e->name}, {"cat", e->cat},  {"ph", "X"},
                        {"ts", double(e->start_ns) / 1e3}, {"dur", double(e->dur_ns) / 1e3},
                        {"pid", pid},      {"tid", e->tid}};
    if (e->cat == "op") j["args"] = {{"site", e->site}, {"depth", e->depth}};
    if (e->cat == "op" && e->device_timed) j["args"]["device_us"] = double(e->self_ns) / 1e3;
    if (e->cat == "gpu") j["args"] = {{"nodes", e->site}};
    events.push_back(std::move(j));
  }
  // Row names: the device's row (tid 0) holds the launches at their device times.
  bool gpu = false;
  for (const ProfileEvent* e : sorted) gpu = gpu || e->cat == "gpu";
  if (gpu)
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0},
                      {"args", {{"name", "GPU (device time)"}}}});
  nlohmann::json doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  return doc.dump();
}

void Profiler::write_trace(const std::string& path) const {
  std::string text = chrome_trace();
  // Readers never see a partial file.
  AtomicFile f(path, "profile: cannot write trace file");
  f.write(text);
  f.commit();
}

double Roofline::floor_ms(double flops, double bytes, double const_bytes, DType compute) const {
  if (flops <= 0 && bytes <= 0) return -1;
  double rate = (compute == DType::BFloat16 || compute == DType::Float16) && low_flops_per_ms > 0
                    ? low_flops_per_ms
                    : flops_per_ms;
  if (rate <= 0 || bytes_per_ms <= 0) return -1;
  const double mem = mem_bytes_per_ms > 0 ? mem_bytes_per_ms : bytes_per_ms;
  const_bytes = std::clamp(const_bytes, 0.0, bytes);
  const double act = bytes - const_bytes;
  const double act_rate = cache_bytes > 0 && act > cache_bytes ? mem : bytes_per_ms;
  return std::max(flops / rate, act / act_rate + const_bytes / mem);
}

namespace {
// Note [Kernel work]: the memory's bandwidth, for weights: the best of a few copies of 64 MiB
// (twice the largest last-level caches of the machines we run on) into another 64 MiB, read +
// written. Setting the buffers up costs ~30-60 ms of page faults, once per process.
double measure_memory_bandwidth() {
  const size_t bytes = size_t(64) << 20;
  std::vector<char> from(bytes, 1), to(bytes, 0);
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const int64_t t0 = steady_ns();
    std::memcpy(to.data(), from.data(), bytes);
    best = std::min(best, double(steady_ns() - t0) / 1e6);
  }
  return best > 0 ? 2.0 * double(bytes) / best : 0;
}

// ProfileRun's roofline summary (Note [Kernel work]), over the launches that started at or after
// `since_ns`. A kernel is one launch of the executable: launches of one name (a zoo model's
// layers are named by their call site) are told apart by their floors.
void summarize_roofline(ProfileRun& run, const std::vector<ProfileEvent>& events, int64_t since_ns) {
  struct Acc {
    std::vector<double> ms;  // per call
  };
  std::map<std::tuple<std::string, std::string, double>, Acc> kernels;
  double total = 0;
  for (const ProfileEvent& e : events) {
    if (e.cat != "op" || e.start_ns < since_ns) continue;
    total += double(e.self_ns) / 1e6;
    if (e.floor_ms <= 0) continue;
    kernels[{e.name, e.site, e.floor_ms}].ms.push_back(double(e.self_ns) / 1e6);
  }
  // A kernel's time is the median of its calls: one call descheduled on a shared machine does
  // not make a kernel the worst.
  double shorts = 0, within2 = 0, within5 = 0, over5 = 0;
  for (auto& [key, a] : kernels) {
    const auto& [name, site, floor_ms] = key;
    double sum = 0;
    for (double m : a.ms) sum += m;
    std::sort(a.ms.begin(), a.ms.end());
    const double median = a.ms[a.ms.size() / 2], ratio = median / floor_ms;
    if (median < run.min_kernel_ms) {
      run.short_kernels++;
      shorts += sum;
      continue;
    }
    (ratio <= 2 ? within2 : ratio <= 5 ? within5 : over5) += sum;
    if (ratio > run.worst_ratio) {
      run.worst_ratio = ratio;
      run.worst_kernel = name;
      run.worst_ms = median;
      run.worst_floor_ms = floor_ms;
      run.worst_nodes = site;
    }
  }
  if (total > 0) {
    run.short_share = 100 * shorts / total;
    run.share_within_2x = 100 * within2 / total;
    run.share_2x_to_5x = 100 * within5 / total;
    run.share_over_5x = 100 * over5 / total;
  }
}

// Note [Kernel work] on a GPU: the device's rates, measured with events on the legacy stream:
// a bf16 and a float32 (no TF32) cuBLASLt GEMM of 8192^3 and 4096^3 (the best of 5 after 2
// warm-ups), and a 512 MiB device-to-device copy (read + written). A GPU's caches are small
// beside its memory's bandwidth, so every byte moves at the copy's rate (cache_bytes 0).
Roofline measure_cuda_roofline(int device) {
  Roofline r;
  CudaEventLog ev(device);
  auto best_ms = [&](auto&& f) {
    for (int i = 0; i < 2; ++i) f();
    double best = 1e30;
    for (int i = 0; i < 5; ++i) {
      ev.clear();
      const int a = ev.record(nullptr);
      f();
      const int b = ev.record(nullptr);
      ev.synchronize();
      best = std::min(best, ev.elapsed_ms(a, b));
    }
    return best;
  };
  {
    const size_t bytes = size_t(512) << 20;
    Tensor from = Tensor::empty({int64_t(bytes)}, DType::UInt8, Device::cuda(device));
    Tensor to = Tensor::empty({int64_t(bytes)}, DType::UInt8, Device::cuda(device));
    const double ms = best_ms([&] {
      cuda_memcpy(to.raw_data(), from.raw_data(), bytes, CopyKind::DeviceToDevice);
    });
    r.bytes_per_ms = r.mem_bytes_per_ms = 2.0 * double(bytes) / ms;
  }
  auto gemm_rate = [&](DType dt, int64_t n) {
    cuda::GemmDesc d;
    d.dtype = dt;
    d.m = d.n = d.k = n;
    d.device = device;
    std::unique_ptr<cuda::GemmPlan> plan = cuda::GemmPlan::create(d);
    Tensor a = Tensor::zeros({n, n}, dt, Device::cuda(device));
    Tensor b = Tensor::zeros({n, n}, dt, Device::cuda(device));
    Tensor c = Tensor::empty({n, n}, dt, Device::cuda(device));
    Tensor ws = Tensor::empty({int64_t(std::max<size_t>(plan->workspace_bytes(), 1))}, DType::UInt8,
                              Device::cuda(device));
    cuda::GemmArgs args;
    args.a = a.raw_data();
    args.b = b.raw_data();
    args.d = c.raw_data();
    args.workspace = ws.raw_data();
    args.workspace_bytes = plan->workspace_bytes();
    const double ms = best_ms([&] { plan->run(args); });
    return 2.0 * double(n) * double(n) * double(n) / ms;
  };
  r.low_flops_per_ms = gemm_rate(DType::BFloat16, 8192);
  r.flops_per_ms = gemm_rate(DType::Float32, 4096);
  return r;
}

// The size of the last-level cache as the kernel describes CPU 0's caches (sysfs); glibc's
// sysconf reads CPUID, which on the development VM says 320 MiB for a 32 MiB L3. 0: unknown.
double last_level_cache_bytes() {
  int best_level = 0;
  double best = 0;
  for (int i = 0; i < 8; ++i) {
    const std::string dir = fmt::format("/sys/devices/system/cpu/cpu0/cache/index{}/", i);
    std::ifstream lf(dir + "level"), sf(dir + "size");
    int level = 0;
    std::string size;
    if (!(lf >> level) || !(sf >> size) || size.empty()) continue;
    double bytes = std::atof(size.c_str());
    const char unit = size.back();
    bytes *= unit == 'K' ? 1024.0 : unit == 'M' ? 1048576.0 : unit == 'G' ? 1073741824.0 : 1.0;
    if (level > best_level) best_level = level, best = bytes;
  }
  return best;
}
}  // namespace

ProfileRun run_profile(const ProfileOptions& o, Profiler& prof) {
  if (o.target.empty()) fail("profile: a target (zoo model name or MODEL.onnx) is required");
  if (o.backend != "eager" && o.backend != "compiled")
    fail("profile: --backend expected eager or compiled, found '{}'", o.backend);
  if (o.mode != "default" && o.mode != "reduce-overhead" && o.mode != "max-autotune")
    fail("profile: --mode expected default, reduce-overhead or max-autotune, found '{}'", o.mode);
  const DType precision = parse_precision(o.dtype, "profile: --dtype");
  if (precision != DType::Float32 && o.backend != "compiled")
    fail("profile: --dtype {} applies to the compiled run (--backend compiled); --backend eager "
         "runs the model as written, in float32", dtype_name(precision));
  if (o.iters < 1) fail("profile: --iters expected >= 1, found {}", o.iters);
  if (o.warmup < 0) fail("profile: --warmup expected >= 0, found {}", o.warmup);
  if (o.batch < 1) fail("profile: --batch expected >= 1, found {}", o.batch);
  if (o.threads < 0) fail("profile: --threads expected >= 0, found {}", o.threads);
  if (o.threads > 0) omp_set_num_threads(o.threads);
  if (o.device != "cpu" && o.device != "cuda")
    fail("profile: --device expected cpu or cuda, found '{}'", o.device);
  const bool cuda = o.device == "cuda";
  if (cuda) {
    require_cuda_device(0, "profile: --device cuda");
    // Kernels run asynchronously. Compiled: each launch is bracketed by CUDA events on its
    // stream, read once per iteration, so its time is its device time and the launches run as
    // they would unprofiled. Eager: each op is bracketed by device synchronizations (its device
    // time plus one synchronization, ~8 us on an H200), as CUDA_LAUNCH_BLOCKING profiles are.
    if (o.backend == "compiled") prof.set_cuda_events(0);
    else prof.set_cuda_sync(0);
  }
  BenchTarget m = load_bench_target(o.target, o.batch, o.seed, cuda ? Device::cuda(0) : Device::cpu());

  ProfileRun run;
  run.model = m.name;
  run.iters = o.iters;
  CompiledFunction compiled;
  std::function<void()> call;
  prof.start();
  struct Stop {  // the observer must not outlive this call on error
    Profiler& p;
    ~Stop() { p.stop(); }
  } stop{prof};
  if (o.backend == "compiled") {
    CompileOptions copts;
    copts.backend = best_compile_backend();
    copts.mode = o.mode;
    copts.precision = precision;
    run.backend = "compiled(" + copts.backend + ")";
    prof.begin_span("capture/compile");
    compiled = m.compile(copts);
    compiled(m.inputs);  // capture is lazy: the first call traces and compiles
    prof.end_span();
    int64_t n = 0;
    for (const ExplainGraph& g : compiled.report().graphs) n += int64_t(g.ops.size());
    run.graph_ops = n;
    call = [&] { compiled(m.inputs); };
  } else {
    run.backend = "eager";
    call = [&] { m.eager(m.inputs); };
  }
  for (int i = 0; i < o.warmup; ++i) {
    prof.begin_span("warmup");
    call();
    prof.end_span();
  }
  // CUDA, compiled: the host-observed time of a call, measured with the profiler off (its
  // events and the stream hold change it), the median of `iters` calls.
  if (cuda && o.backend == "compiled") {
    prof.stop();
    std::vector<double> ms;
    for (int i = 0; i < std::max(o.iters, 5); ++i) {
      int64_t t0 = steady_ns();
      call();
      ms.push_back(double(steady_ns() - t0) / 1e6);
    }
    std::sort(ms.begin(), ms.end());
    run.call_ms = ms[ms.size() / 2];
    prof.start();
  }
  // Note [Kernel work]: the floors of the timed launches, from rates measured here, outside the
  // timed iterations: the CPU's each run (a few milliseconds; the memory's bandwidth once per
  // process), the GPU's once per process.
  if (cuda && o.backend == "compiled") {
    prof.stop();  // the measurement's copies and GEMMs are not the model's launches
    static const Roofline device_rates = measure_cuda_roofline(0);
    prof.set_roofline(device_rates);
    prof.start();
    run.min_kernel_ms = ProfileRun::kRooflineMinMsGpu;
  } else if (!cuda && o.backend == "compiled") {
    const kernels::CpuRoofline f32 = kernels::measure_cpu_roofline(false);
    const kernels::CpuRoofline low = kernels::measure_cpu_roofline(true);
    static const double mem = measure_memory_bandwidth();
    prof.set_roofline({f32.flops_per_ms, low.flops_per_ms, f32.bytes_per_ms, mem,
                       last_level_cache_bytes()});
  }
  run.roofline = prof.roofline();
  size_t first_timed = prof.events().size();
  int64_t since = INT64_MAX;
  for (int i = 0; i < o.iters; ++i) {
    prof.begin_span("iteration");
    call();
    prof.end_span();
    if (i == 0) since = prof.events().back().start_ns;
  }
  int64_t top = 0;
  for (size_t i = first_timed; i < prof.events().size(); ++i) {
    const ProfileEvent& e = prof.events()[i];
    if (e.cat == "op" && e.depth == 0) ++top;
  }
  run.ops_per_iteration = top / o.iters;
  run.table = prof.aggregate(since);
  summarize_roofline(run, prof.events(), since);
  if (cuda && o.backend == "compiled") {
    int64_t device_ns = 0;
    for (size_t i = first_timed; i < prof.events().size(); ++i) {
      const ProfileEvent& e = prof.events()[i];
      if (e.cat == "op" && e.device_timed) device_ns += e.self_ns;
    }
    run.device_ms = double(device_ns) / 1e6 / o.iters;
  }
  return run;
}

}  // namespace kiln
