// kiln bench TARGET: latency distribution, compile cost, memory and allocations of a zoo model
// or an .onnx file, on the CPU or (eager, ONNX) on a CUDA device.
// The measuring lives in src/runtime/bench.cc (run_bench); this file parses options and prints.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "bench/bench.h"
#include "tools/commands.h"

namespace kiln::cli {
namespace {

std::string fmt_bytes(int64_t b) {
  if (b >= (int64_t(1) << 30)) return fmt::format("{:.2f} GiB", double(b) / double(1 << 30));
  if (b >= (int64_t(1) << 20)) return fmt::format("{:.1f} MiB", double(b) / double(1 << 20));
  return fmt::format("{:.1f} KiB", double(b) / 1024.0);
}

// A one-line progress bar on stderr, redrawn in place; only when stderr is a terminal.
void draw_progress(int64_t done, int64_t total, double elapsed_s, double seconds) {
  // Redraw at most every 50 ms (fast models run thousands of iterations a second) and at the end.
  static double last = -1;
  if (done != total && last >= 0 && elapsed_s - last < 0.05) return;
  last = elapsed_s;
  double frac = total > 0 ? double(done) / double(total)
                          : (seconds > 0 ? std::min(1.0, elapsed_s / seconds) : 0.0);
  int width = 30, filled = int(frac * width + 0.5);
  std::string bar(size_t(filled), '#');
  bar.append(size_t(width - filled), '.');
  std::fprintf(stderr, "\r  [%s] %3d%%  %lld calls  %.1fs", bar.c_str(), int(frac * 100 + 0.5),
               (long long)done, elapsed_s);
  std::fflush(stderr);
}

void bench_command(BenchOptions o, bool json) {
  bool tty = !json && isatty(STDERR_FILENO);
  if (tty) {
    double seconds = o.seconds;
    o.progress = [seconds](int64_t done, int64_t total, double el) {
      draw_progress(done, total, el, seconds);
    };
  }
  BenchResult r;
  try {
    r = run_bench(o);
  } catch (...) {
    if (tty) std::fprintf(stderr, "\n");
    throw;
  }
  if (tty) std::fprintf(stderr, "\r%60s\r", "");
  if (json) {
    std::printf("%s\n", r.json(2).c_str());
    return;
  }
  auto opt_s = [](const std::optional<double>& v) {
    return v ? fmt::format("{:.4f} s", *v) : std::string("n/a");
  };
  std::string isa;
  for (auto& f : r.host.isa) isa += (isa.empty() ? "" : " ") + f;
  std::printf("kiln %s bench: %s  backend %s  device %s  mode %s  dtype %s  batch %lld  "
              "threads %d\n",
              r.kiln_version.c_str(), r.model.c_str(), r.backend.c_str(), r.device.c_str(),
              r.mode.c_str(), r.dtype.c_str(), (long long)r.batch, r.threads);
  std::printf("host: %s (%d cores; %s)\n", r.host.cpu_model.c_str(), r.host.cores,
              isa.empty() ? "no avx2/avx512" : isa.c_str());
  std::printf("\n  latency over %lld iters (after %lld warm-up)\n", (long long)r.iters,
              (long long)r.warmup);
  std::printf("    %-10s %-10s %-10s %-10s %-10s %-10s %-10s\n", "p50 ms", "p90 ms", "p99 ms",
              "max ms", "min ms", "mean ms", "stddev ms");
  std::printf("    %-10.4f %-10.4f %-10.4f %-10.4f %-10.4f %-10.4f %-10.4f\n", r.p50_ms, r.p90_ms,
              r.p99_ms, r.max_ms, r.min_ms, r.mean_ms, r.stddev_ms);
  if (r.device_p50_ms && r.device_p99_ms)
    std::printf("    (host-observed, including device synchronization; device time from CUDA "
                "events: p50 %.4f ms, p99 %.4f ms)\n",
                *r.device_p50_ms, *r.device_p99_ms);
  std::printf("\n  %-30s %.1f /s\n", "throughput", r.throughput_per_s);
  if (r.load_s)
    std::printf("  %-30s %.4f s%s\n", "package load", *r.load_s,
                r.cuda_context_s
                    ? fmt::format("  (the CUDA context before it: {:.4f} s)", *r.cuda_context_s).c_str()
                    : "");
  std::printf("  %-30s %.4f s\n", "first call", r.first_call_s);
  std::printf("  %-30s %s\n",
              r.compile_cache == "user" ? "compile (user's cache)" : "compile (cold)",
              opt_s(r.compile_s).c_str());
  std::string warm = opt_s(r.warm_compile_s);
  if (r.warm_compile_cache_hit)
    warm += *r.warm_compile_cache_hit ? "  (cache hit)" : "  (cache miss)";
  std::printf("  %-30s %s\n", "compile (warm, same module)", warm.c_str());
  std::printf("  %-30s %s\n", "peak RSS", fmt_bytes(r.peak_rss_bytes).c_str());
  std::printf("  %-30s %s\n", "peak device memory",
              r.peak_device_bytes ? fmt_bytes(*r.peak_device_bytes).c_str() : "n/a (CPU)");
  if (r.steady_peak_device_bytes)
    std::printf("  %-30s %s loaded, %s after the first call, %s peak in the timed calls\n",
                "device memory windows", fmt_bytes(*r.loaded_device_bytes).c_str(),
                fmt_bytes(*r.resident_device_bytes).c_str(),
                fmt_bytes(*r.steady_peak_device_bytes).c_str());
  std::printf("  %-30s %s\n", "arena",
              r.arena_bytes ? fmt_bytes(*r.arena_bytes).c_str()
                            : "n/a (the backend plans no arena)");
  std::printf("  %-30s %s\n", "launches per call",
              r.launches_per_call ? std::to_string(*r.launches_per_call).c_str() : "n/a");
  std::printf("  %-30s %s\n", "heap allocations per call",
              r.steady_state_allocs_per_call
                  ? fmt::format("{:.1f}", *r.steady_state_allocs_per_call).c_str()
                  : "n/a");
}

}  // namespace

void add_bench_command(CLI::App& app) {
  static BenchOptions o;
  static bool json = false;
  auto* cmd = app.add_subcommand("bench",
                                 "Benchmark a zoo model or .onnx file: latency, compile cost, memory");
  cmd->add_option("target", o.target, "Zoo model name (see `kiln models`), MODEL.onnx or MODEL.kiln (a package: load_s, no compile)")->required();
  cmd->add_option("--backend", o.backend,
                  "eager | compiled (kiln::compile with the best backend; default compiled)");
  cmd->add_option("--device", o.device,
                  "cpu | cuda (default: a package's own device, else cpu)");
  cmd->add_option("--mode", o.mode, "default | reduce-overhead | max-autotune (compile mode)");
  cmd->add_option("--dtype", o.dtype,
                  "float32 | bfloat16 | float16 (or f32, bf16, f16): run a float32 model in this "
                  "precision, as torch's autocast does (docs/compiler.md); default float32");
  cmd->add_option("--batch", o.batch, "Batch size (default 1)");
  cmd->add_option("--threads", o.threads, "Intra-op threads (default: all cores)");
  cmd->add_option("--warmup", o.warmup, "Warm-up iterations (default 3)");
  auto* iters = cmd->add_option("--iters", o.iters, "Timed iterations (default 50)");
  cmd->add_option("--seconds", o.seconds, "Time-box the timed loop instead of --iters")
      ->excludes(iters);
  cmd->add_option("--seed", o.seed, "Seed for weights and inputs (default 0)");
  cmd->add_option("--compile-cache", o.compile_cache,
                  "fresh | user: the first compile starts from an empty cache (default: a cold "
                  "compile) or from the user's (KILN_CACHE_DIR or ~/.cache/kiln: a restarted "
                  "process's warm compile)");
  cmd->add_flag("--json", json, "Print exactly one JSON object");
  cmd->callback([iters] {
    // 0 is run_bench's "default" sentinel; an explicit --iters 0 is a mistake.
    if (iters->count() > 0 && o.iters < 1)
      fail("bench: --iters expected >= 1, found {}", o.iters);
    bench_command(o, json);
  });
}

}  // namespace kiln::cli
