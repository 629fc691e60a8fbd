// kiln profile TARGET: per-op timing table of a zoo model, optionally a Chrome trace
// (chrome://tracing, ui.perfetto.dev). The work is in src/runtime/profiler.cc (run_profile).
#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/profiler.h"
#include "support/files.h"
#include "tools/commands.h"

namespace kiln::cli {
namespace {

// --json: the run and its roofline summary as one object (bench/roofline.py reads it).
void write_json(const ProfileRun& run, const ProfileOptions& o, const std::string& path) {
  nlohmann::json kernels = nlohmann::json::array();
  for (const OpStat& s : run.table) {
    nlohmann::json k = {{"name", s.name}, {"calls", s.calls}, {"total_ms", s.total_ms},
                        {"mean_ms", s.mean_ms}, {"share", s.share}};
    if (s.ratio > 0) {
      k["floor_ms"] = s.floor_ms;
      k["ratio"] = s.ratio;
    }
    if (s.gflops >= 0) {
      k["gflops"] = s.gflops;
      k["gbytes_per_s"] = s.gbytes_per_s;
    }
    if (!s.top_sites.empty()) k["site"] = s.top_sites.front().first;
    kernels.push_back(std::move(k));
  }
  nlohmann::json j = {
      {"model", run.model}, {"backend", run.backend}, {"device", o.device}, {"mode", o.mode},
      {"dtype", o.dtype}, {"threads", o.threads}, {"iters", run.iters},
      {"ops_per_iteration", run.ops_per_iteration}, {"kernels", std::move(kernels)}};
  if (run.has_roofline()) {
    j["roofline"] = {{"gflops", run.roofline.flops_per_ms / 1e6},
                     {"gflops_low_precision", run.roofline.low_flops_per_ms / 1e6},
                     {"gbytes_per_s", run.roofline.bytes_per_ms / 1e6},
                     {"memory_gbytes_per_s", run.roofline.mem_bytes_per_ms / 1e6},
                     {"cache_bytes", run.roofline.cache_bytes},
                     {"min_kernel_ms", run.min_kernel_ms},
                     {"worst_ratio", run.worst_ratio},
                     {"worst_kernel", run.worst_kernel},
                     {"worst_nodes", run.worst_nodes},
                     {"worst_ms", run.worst_ms},
                     {"worst_floor_ms", run.worst_floor_ms},
                     {"share_within_2x", run.share_within_2x},
                     {"share_2x_to_5x", run.share_2x_to_5x},
                     {"share_over_5x", run.share_over_5x},
                     {"short_kernels", run.short_kernels},
                     {"short_share", run.short_share}};
  }
  AtomicFile f(path, "profile: cannot write the JSON file");
  f.write(j.dump(2) + "\n");
  f.commit();
}

void profile_command(const ProfileOptions& o, const std::string& trace, const std::string& json) {
  Profiler prof;
  ProfileRun run = run_profile(o, prof);
  if (!trace.empty()) prof.write_trace(trace);
  if (!json.empty()) write_json(run, o, json);
  std::printf("kiln profile: %s  backend %s  device %s  batch %lld  %d iters  %lld ops/iter",
              run.model.c_str(), run.backend.c_str(), o.device.c_str(), (long long)o.batch, run.iters,
              (long long)run.ops_per_iteration);
  if (run.graph_ops >= 0) std::printf(" (%lld in captured graphs)", (long long)run.graph_ops);
  std::printf("\n  times are self times (nested decomposition ops are counted separately)\n");
  if (o.device == "cuda" && o.backend == "compiled")
    std::printf("  CUDA: each launch's device time, from events recorded on its stream around it "
                "(read once per iteration)%s\n",
                o.mode == "reduce-overhead"
                    ? "; the profiled calls run the launches one by one, not the CUDA graph "
                      "(Note [Profiled graph-mode calls]), so their sum exceeds the graph's call"
                    : "");
  else if (o.device == "cuda")
    std::printf("  CUDA: every op is timed between device synchronizations (its device time plus "
                "one synchronization)\n");
  std::printf("\n");
  const bool floors = run.has_roofline();
  std::printf("  %-24s %8s %11s %11s %8s%s  %s\n", "op", "calls", "total ms", "mean ms", "share",
              floors ? "   floor ms  x floor  GFLOP/s     GB/s" : "", "top call sites (calls)");
  double total = 0;
  for (const OpStat& s : run.table) {
    std::string sites;
    for (auto& [site, n] : s.top_sites) sites += fmt::format("{}{} ({})", sites.empty() ? "" : ", ", site, n);
    std::string roof;
    if (floors)
      roof = s.ratio > 0 ? fmt::format(" {:10.5f} {:8.1f} {:8.1f} {:8.1f}", s.floor_ms, s.ratio,
                                       s.gflops, s.gbytes_per_s)
                         : fmt::format(" {:>10} {:>8} {:>8} {:>8}", "-", "-", "-", "-");
    std::printf("  %-24s %8lld %11.4f %11.5f %7.1f%%%s  %s\n", s.name.c_str(), (long long)s.calls,
                s.total_ms, s.mean_ms, s.share, roof.c_str(), sites.c_str());
    total += s.total_ms;
  }
  std::printf("  %-24s %8s %11.4f\n", "total", "", total);
  if (floors) {
    const Roofline& r = run.roofline;
    std::printf("\n  roofline (Note [Kernel work]): floor = max(flops / %.1f GFLOP/s (bf16/f16: %.1f), "
                "activation bytes / %.1f GB/s (past %.0f MiB of them: the memory's) + weight bytes / "
                "%.1f GB/s), rates measured here now\n",
                r.flops_per_ms / 1e6, r.low_flops_per_ms / 1e6, r.bytes_per_ms / 1e6,
                r.cache_bytes / 1048576.0, r.mem_bytes_per_ms / 1e6);
    if (run.worst_ratio > 0)
      std::printf("  worst kernel: %s at %.1fx its floor (%.4f ms per call, floor %.4f ms): %s\n",
                  run.worst_kernel.c_str(), run.worst_ratio, run.worst_ms, run.worst_floor_ms,
                  run.worst_nodes.c_str());
    std::printf("  time in kernels of >= %.3f ms per call: %.1f%% within 2x their floor, %.1f%% at "
                "2-5x, %.1f%% over 5x; %lld shorter kernels: %.1f%%\n",
                run.min_kernel_ms, run.share_within_2x, run.share_2x_to_5x,
                run.share_over_5x, (long long)run.short_kernels, run.short_share);
  }
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
  static std::string trace, json;
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
  cmd->add_option("--json", json, "Also write the table and the roofline summary here as JSON");
  cmd->callback([] { profile_command(o, trace, json); });
}

}  // namespace kiln::cli
