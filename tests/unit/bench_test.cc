// kiln bench / kiln profile internals: run_bench's result fields, the op profiler's aggregation
// and Chrome trace, and option errors. No timing thresholds: only structural invariants.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "eager/api.h"
#include "runtime/bench.h"
#include "runtime/profiler.h"

using namespace kiln;
using nlohmann::json;

namespace {

// A counter that advances by one each time it is read: run_bench reads it once before and once
// after every timed call, so a correct per-call window gives exactly 1 "allocation" per call.
int64_t g_reads = 0;
int64_t counting_reads() { return ++g_reads; }

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

BenchOptions small(const std::string& model = "mlp") {
  BenchOptions o;
  o.target = model;
  o.iters = 5;
  o.warmup = 1;
  return o;
}

}  // namespace

TEST(Bench, MlpJsonHasEveryKeyWithSaneValues) {
  BenchOptions o = small();
  o.batch = 3;
  o.seed = 7;
  BenchResult r = run_bench(o);
  json j = json::parse(r.json());
  for (const char* k :
       {"model", "backend", "device", "mode", "batch", "threads", "kiln_version", "compile_s",
        "warm_compile_s", "first_call_s", "p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms",
        "stddev_ms", "throughput_per_s", "peak_rss_bytes", "peak_device_bytes", "arena_bytes",
        "steady_state_allocs_per_call", "host", "iters", "warmup"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["model"], "mlp");
  EXPECT_EQ(j["backend"], "compiled(" + best_compile_backend() + ")");
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["mode"], "default");
  EXPECT_EQ(j["batch"], 3);
  EXPECT_EQ(j["iters"], 5);
  EXPECT_GE(j["threads"].get<int>(), 1);
  EXPECT_FALSE(j["kiln_version"].get<std::string>().empty());
  double p50 = j["p50_ms"], p90 = j["p90_ms"], p99 = j["p99_ms"], mx = j["max_ms"];
  EXPECT_LE(p50, p90);
  EXPECT_LE(p90, p99);
  EXPECT_LE(p99, mx);
  EXPECT_GT(p50, 0);
  EXPECT_LE(j["mean_ms"].get<double>(), mx);
  EXPECT_GE(j["stddev_ms"].get<double>(), 0);
  EXPECT_GT(j["throughput_per_s"].get<double>(), 0);
  EXPECT_NEAR(j["throughput_per_s"].get<double>(), 3 * 1000.0 / j["mean_ms"].get<double>(), 1e-6);
  EXPECT_GE(j["compile_s"].get<double>(), 0);
  EXPECT_GE(j["warm_compile_s"].get<double>(), 0);
  // The warm compile finds the generated code in the (private) cache the cold one filled.
  EXPECT_EQ(j["warm_compile_cache_hit"], true);
  EXPECT_GT(j["first_call_s"].get<double>(), 0);
  EXPECT_GT(j["peak_rss_bytes"].get<int64_t>(), 0);
  EXPECT_TRUE(j["peak_device_bytes"].is_null());  // CPU
  EXPECT_GT(j["arena_bytes"].get<int64_t>(), 0);  // the CPU compiler plans an arena
  EXPECT_TRUE(j["steady_state_allocs_per_call"].is_null());  // no counter registered here
  EXPECT_FALSE(j["host"]["cpu_model"].get<std::string>().empty());
  EXPECT_GE(j["host"]["cores"].get<int>(), 1);
  EXPECT_TRUE(j["host"]["isa"].is_array());
}

TEST(Bench, EagerBackendHasNoCompileCost) {
  BenchOptions o = small();
  o.backend = "eager";
  o.mode = "max-autotune";
  json j = json::parse(run_bench(o).json());
  EXPECT_EQ(j["backend"], "eager");
  EXPECT_EQ(j["mode"], "max-autotune");
  EXPECT_TRUE(j["compile_s"].is_null());
  EXPECT_TRUE(j["warm_compile_s"].is_null());
  EXPECT_LE(j["p50_ms"].get<double>(), j["max_ms"].get<double>());
}

TEST(Bench, AllocCounterIsReadAroundEachTimedCall) {
  g_reads = 0;
  set_alloc_counter(&counting_reads);
  BenchOptions o = small();
  o.iters = 7;
  BenchResult r = run_bench(o);
  set_alloc_counter(nullptr);
  ASSERT_TRUE(r.steady_state_allocs_per_call.has_value());
  EXPECT_DOUBLE_EQ(*r.steady_state_allocs_per_call, 1.0);
  EXPECT_EQ(g_reads, 2 * 7);
}

TEST(Bench, SecondsModeRunsAtLeastOnceAndReportsProgress) {
  BenchOptions o = small();
  o.iters = 0;
  o.seconds = 0.02;
  o.warmup = 2;
  int64_t last_done = 0, calls = 0;
  bool total_unknown = true;
  o.progress = [&](int64_t done, int64_t total, double) {
    EXPECT_EQ(done, last_done + 1);
    last_done = done;
    total_unknown = total_unknown && total == -1;
    ++calls;
  };
  BenchResult r = run_bench(o);
  EXPECT_GE(r.iters, 1);
  EXPECT_EQ(calls, r.iters + 2);
  EXPECT_TRUE(total_unknown);
}

TEST(Bench, Percentile) {
  std::vector<double> v = {5, 1, 4, 2, 3};
  EXPECT_EQ(percentile(v, 0), 1);
  EXPECT_EQ(percentile(v, 50), 3);
  EXPECT_EQ(percentile(v, 90), 5);
  EXPECT_EQ(percentile(v, 100), 5);
  EXPECT_TRUE(std::isnan(percentile({}, 50)));
}

TEST(Bench, BadOptionsGiveClearErrors) {
  auto with = [](auto edit) {
    BenchOptions o = small();
    edit(o);
    return error_of([&] { run_bench(o); });
  };
  EXPECT_NE(with([](BenchOptions& o) { o.backend = "fast"; }).find("--backend expected eager or compiled, found 'fast'"), std::string::npos);
  EXPECT_NE(with([](BenchOptions& o) { o.mode = "turbo"; }).find("--mode"), std::string::npos);
  EXPECT_NE(with([](BenchOptions& o) { o.device = "tpu"; }).find("--device expected cpu or cuda"), std::string::npos);
  EXPECT_NE(with([](BenchOptions& o) { o.batch = 0; }).find("--batch expected >= 1, found 0"), std::string::npos);
  EXPECT_NE(with([](BenchOptions& o) { o.threads = -2; }).find("--threads"), std::string::npos);
  EXPECT_NE(with([](BenchOptions& o) { o.iters = -1; }).find("--iters"), std::string::npos);
  EXPECT_NE(with([](BenchOptions& o) { o.seconds = -1; }).find("--seconds"), std::string::npos);
  EXPECT_NE(with([](BenchOptions& o) { o.seconds = 1; }).find("not both"), std::string::npos);
  EXPECT_NE(with([](BenchOptions& o) { o.target = "nosuch"; }).find("nosuch"), std::string::npos);
  // ONNX targets are imported; a missing file is named.
  EXPECT_NE(with([](BenchOptions& o) { o.target = "m.onnx"; }).find("m.onnx: no such model file"), std::string::npos);
  EXPECT_NE(with([](BenchOptions& o) { o.target = ""; }).find("target"), std::string::npos);
  std::string cuda = with([](BenchOptions& o) { o.device = "cuda"; });
  EXPECT_NE(cuda.find("--device cuda"), std::string::npos) << cuda;
  if (cuda_device_count() == 0) {
    EXPECT_NE(cuda.find("no CUDA device"), std::string::npos) << cuda;
  }
}

TEST(Profiler, AggregatesSelfTimePerOp) {
  Generator g(11);
  Tensor x = Tensor::randn({4, 5}, g), y = Tensor::randn({4, 5}, g);
  Profiler p;
  p.start();
  Tensor a = relu(x);
  Tensor b = add(a, y);
  Tensor c = relu(b);
  p.stop();
  Tensor d = relu(c);  // after stop: not recorded
  auto table = p.aggregate();
  std::map<std::string, OpStat> by;
  double share = 0;
  for (auto& s : table) by[s.name] = s, share += s.share;
  ASSERT_EQ(by.size(), 2u);
  EXPECT_EQ(by["relu"].calls, 2);
  EXPECT_EQ(by["add"].calls, 1);
  EXPECT_NEAR(share, 100.0, 1e-6);
  for (size_t i = 1; i < table.size(); ++i) EXPECT_GE(table[i - 1].total_ms, table[i].total_ms);
  // The call sites are this file's lines.
  ASSERT_FALSE(by["relu"].top_sites.empty());
  EXPECT_NE(by["relu"].top_sites[0].first.find("bench_test.cc:"), std::string::npos);
  EXPECT_EQ(p.events().size(), 3u);
}

TEST(Profiler, ThrowingOpStillClosesItsEvent) {
  Generator g(12);
  Tensor x = Tensor::randn({4, 5}, g), y = Tensor::randn({3, 7}, g);
  Profiler p;
  p.start();
  EXPECT_THROW(add(x, y), Error);
  p.stop();
  ASSERT_EQ(p.events().size(), 1u);
  EXPECT_EQ(p.events()[0].name, "add");
  EXPECT_THROW(p.end_span(), Error);  // nothing open
}

namespace {
// Checks the trace-event format and returns the parsed events.
json check_trace(const std::string& text) {
  json doc = json::parse(text);
  EXPECT_TRUE(doc.contains("traceEvents"));
  json ev = doc["traceEvents"];
  std::map<int, double> last_ts;
  for (const json& e : ev) {
    EXPECT_EQ(e["ph"], "X");
    for (const char* k : {"name", "ts", "dur", "pid", "tid"}) EXPECT_TRUE(e.contains(k)) << k;
    EXPECT_GE(e["dur"].get<double>(), 0);
    int tid = e["tid"];
    double ts = e["ts"];
    if (last_ts.count(tid)) {
      EXPECT_GE(ts, last_ts[tid]);
    }
    last_ts[tid] = ts;
  }
  return ev;
}
}  // namespace

TEST(Profiler, CompiledMlpTraceHasOneEventPerOpLaunch) {
  Profiler p;
  ProfileOptions o;
  o.target = "mlp";
  o.iters = 4;
  o.warmup = 2;
  o.seed = 3;
  ProfileRun run = run_profile(o, p);
  EXPECT_GT(run.graph_ops, 0);
  // The eager backend interprets each graph node with one call_op.
  if (best_compile_backend() == "eager") {
    EXPECT_EQ(run.ops_per_iteration, run.graph_ops);
  }
  json ev = check_trace(p.chrome_trace());

  std::vector<std::pair<double, double>> iterations;
  int compile_spans = 0, warmups = 0;
  for (const json& e : ev) {
    if (e["name"] == "iteration") iterations.push_back({e["ts"], e["ts"].get<double>() + e["dur"].get<double>()});
    if (e["name"] == "capture/compile") ++compile_spans;
    if (e["name"] == "warmup") ++warmups;
  }
  EXPECT_EQ(compile_spans, 1);
  EXPECT_EQ(warmups, 2);
  ASSERT_EQ(iterations.size(), 4u);
  // Every iteration holds the same number of op launches; in total ops/iteration * iters.
  int64_t total = 0;
  for (auto [b, e] : iterations) {
    int64_t n = 0;
    for (const json& x : ev)
      if (x["cat"] == "op" && x["args"]["depth"] == 0 && x["ts"].get<double>() >= b &&
          x["ts"].get<double>() <= e)
        ++n;
    EXPECT_EQ(n, run.ops_per_iteration);
    total += n;
  }
  EXPECT_EQ(total, run.ops_per_iteration * 4);
  int64_t table_calls = 0;
  for (auto& s : run.table) table_calls += s.calls;
  EXPECT_GE(table_calls, total);  // the table also counts nested ops, if any
}

TEST(Profiler, EagerBackendAndAtomicTraceFile) {
  Profiler p;
  ProfileOptions o;
  o.target = "mlp";
  o.backend = "eager";
  o.iters = 2;
  ProfileRun run = run_profile(o, p);
  EXPECT_EQ(run.backend, "eager");
  EXPECT_EQ(run.graph_ops, -1);
  EXPECT_GT(run.ops_per_iteration, 0);
  ASSERT_FALSE(run.table.empty());
  // Eager ops are attributed to the model code (layers), not the interpreter.
  EXPECT_EQ(run.table[0].top_sites[0].first.find("interpreter.cc"), std::string::npos);

  auto dir = std::filesystem::temp_directory_path() / ("kiln_bench_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::string path = (dir / "trace.json").string();
  p.write_trace(path);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  json ev = check_trace(ss.str());
  EXPECT_EQ(ev.size(), p.events().size());
  for (auto& f : std::filesystem::directory_iterator(dir))  // no temporary left behind
    EXPECT_EQ(f.path().filename(), "trace.json");
  std::string err = error_of([&] { p.write_trace((dir / "no/such/dir/t.json").string()); });
  EXPECT_NE(err.find("cannot write trace file"), std::string::npos) << err;
  std::filesystem::remove_all(dir);
}

TEST(Profiler, BadOptionsGiveClearErrors) {
  Profiler p;
  ProfileOptions o;
  o.target = "mlp";
  o.iters = 0;
  EXPECT_NE(error_of([&] { run_profile(o, p); }).find("--iters expected >= 1, found 0"), std::string::npos);
  o.iters = 1;
  o.backend = "jit";
  EXPECT_NE(error_of([&] { run_profile(o, p); }).find("--backend expected eager or compiled"), std::string::npos);
  o.backend = "eager";
  o.target = "nosuch";
  EXPECT_NE(error_of([&] { run_profile(o, p); }).find("nosuch"), std::string::npos);
  // A failed run leaves no observer installed: later ops are not recorded.
  size_t n = p.events().size();
  Generator g(1);
  relu(Tensor::randn({3}, g));
  EXPECT_EQ(p.events().size(), n);
}
