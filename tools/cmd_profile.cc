// kiln profile TARGET: per-op timing table of a zoo model, optionally a Chrome trace
// (chrome://tracing, ui.perfetto.dev). The work is in src/runtime/profiler.cc (run_profile).
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "bench/profiler.h"
#include "tools/commands.h"

namespace kiln::cli {
namespace {

void profile_command(const ProfileOptions& o, const std::string& trace) {
  Profiler prof;
  ProfileRun run = run_profile(o, prof);
  if (!trace.empty()) prof.write_trace(trace);
  std::printf("kiln profile: %s  backend %s  device %s  batch %lld  %d iters  %lld ops/iter",
              run.model.c_str(), run.backend.c_str(), o.device.c_str(), (long long)o.batch, run.iters,
              (long long)run.ops_per_iteration);
  if (run.graph_ops >= 0) std::printf(" (%lld in captured graphs)", (long long)run.graph_ops);
  std::printf("\n  times are self times (nested decomposition ops are counted separately)\n");
  if (o.device == "cuda" && o.backend == "compiled")
    std::printf("  CUDA: each launch's device time, from events recorded on its stream around it "
                "(read once per iteration); reduce-overhead replays one CUDA graph (one launch)\n");
  else if (o.device == "cuda")
    std::printf("  CUDA: every op is timed between device synchronizations (its device time plus "
                "one synchronization)\n");
  std::printf("\n");
  std::printf("  %-24s %8s %11s %11s %8s  %s\n", "op", "calls", "total ms", "mean ms", "share",
              "top call sites (calls)");
  double total = 0;
  for (const OpStat& s : run.table) {
    std::string sites;
    for (auto& [site, n] : s.top_sites) sites += fmt::format("{}{} ({})", sites.empty() ? "" : ", ", site, n);
    std::printf("  %-24s %8lld %11.4f %11.5f %7.1f%%  %s\n", s.name.c_str(), (long long)s.calls,
                s.total_ms, s.mean_ms, s.share, sites.c_str());
    total += s.total_ms;
  }
  std::printf("  %-24s %8s %11.4f\n", "total", "", total);
  if (run.device_ms >= 0) {
    std::printf("\n  per call: %.4f ms of the launches' device times; a call takes %.4f ms "
                "host-observed, unprofiled (median)\n",
                run.device_ms, run.call_ms);
    // Measured on the H200: the two events around a launch add about 1 us to its time.
    std::printf("  (each launch's device time includes about 1 us that its two events add: %.4f "
                "ms here for %lld launches)\n",
                0.001 * double(run.ops_per_iteration), (long long)run.ops_per_iteration);
  }
  if (!trace.empty()) std::printf("\ntrace: %s (%zu events)\n", trace.c_str(), prof.events().size());
}

}  // namespace

void add_profile_command(CLI::App& app) {
  static ProfileOptions o;
  static std::string trace;
  auto* cmd = app.add_subcommand("profile", "Per-op timing of a zoo model; --trace for Chrome");
  cmd->add_option("target", o.target, "Zoo model name (see `kiln models`) or MODEL.onnx")->required();
  cmd->add_option("--backend", o.backend, "eager | compiled (default compiled)");
  cmd->add_option("--mode", o.mode, "default | reduce-overhead | max-autotune (compile mode)");
  cmd->add_option("--iters", o.iters, "Profiled iterations (default 10)");
  cmd->add_option("--warmup", o.warmup, "Warm-up iterations (default 1)");
  cmd->add_option("--dtype", o.dtype, "float32 | bfloat16 | float16 (or f32, bf16, f16): the compiled run's precision (as bench's --dtype); default float32");
  cmd->add_option("--batch", o.batch, "Batch size (default 1)");
  cmd->add_option("--device", o.device, "cpu | cuda (default cpu; CUDA: each launch's device time from events on its stream)");
  cmd->add_option("--threads", o.threads, "Intra-op threads (default: all cores)");
  cmd->add_option("--seed", o.seed, "Seed for weights and inputs (default 0)");
  cmd->add_option("--trace", trace, "Write a Chrome trace-event JSON file here");
  cmd->callback([] { profile_command(o, trace); });
}

}  // namespace kiln::cli
