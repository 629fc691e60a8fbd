// kiln bench / kiln profile internals: run_bench's result fields, the op profiler's aggregation
// and Chrome trace, and option errors. No timing thresholds: only structural invariants.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../onnx/onnx_builder.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "ops/api.h"
#include "ir/graph.h"
#include "ir/parser.h"
#include "nn/compile.h"
#include "nn/models/zoo.h"
#include "bench/bench.h"
#include "bench/profiler.h"

using namespace kiln;
using nlohmann::json;

namespace {

// A counter that advances by one each time it is read: run_bench reads it once before and once
// after every timed call, so a correct per-call window gives exactly 1 "allocation" per call.
int64_t g_reads = 0;
int64_t counting_reads() { return ++g_reads; }
// A site recorder that counts its calls and reports a fixed attribution.
int g_site_begins = 0, g_site_ends = 0;
void begin_sites() { ++g_site_begins; }
std::map<std::string, int64_t> end_sites() {
  ++g_site_ends;
  return {{"kiln", 0}, {"libexample.so.1", 3}};
}

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
        "loaded_device_bytes", "resident_device_bytes", "steady_peak_device_bytes",
        "launches_per_call",
        "steady_state_allocs_per_call", "steady_state_allocs_by_module", "host", "iters", "warmup", "samples_ms", "device_p50_ms",
        "device_p99_ms", "involuntary_switches_per_call", "cpu_busy_cores",
        "package_onednn_threads", "package_nodes_at_written_threads", "compile_cache"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["model"], "mlp");
  EXPECT_EQ(j["compile_cache"], "fresh");
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
  EXPECT_TRUE(j["loaded_device_bytes"].is_null());
  EXPECT_TRUE(j["resident_device_bytes"].is_null());
  EXPECT_TRUE(j["steady_peak_device_bytes"].is_null());
  EXPECT_TRUE(j["device_p50_ms"].is_null());
  EXPECT_TRUE(j["device_p99_ms"].is_null());
  EXPECT_GT(j["arena_bytes"].get<int64_t>(), 0);  // the CPU compiler plans an arena
  // mlp: two linears (one with its relu fused) at least; far fewer than one per op would be
  EXPECT_GE(j["launches_per_call"].get<int64_t>(), 2);
  EXPECT_LE(j["launches_per_call"].get<int64_t>(), 4);
  EXPECT_TRUE(j["steady_state_allocs_per_call"].is_null());  // no counter registered here
  EXPECT_TRUE(j["steady_state_allocs_by_module"].is_null());  // nor a site recorder
  EXPECT_GE(j["involuntary_switches_per_call"].get<double>(), 0.0);
  // Some CPU time went into the timed calls, and no more than every core's wall time could give
  // (plus the clock's grain over a few milliseconds of calls).
  EXPECT_GT(j["cpu_busy_cores"].get<double>(), 0.0);
  EXPECT_LE(j["cpu_busy_cores"].get<double>(), double(j["host"]["cores"].get<int>()) + 1.0);
  EXPECT_TRUE(j["package_onednn_threads"].is_null());  // not a package
  EXPECT_TRUE(j["package_nodes_at_written_threads"].is_null());
  EXPECT_FALSE(j["host"]["cpu_model"].get<std::string>().empty());
  EXPECT_GE(j["host"]["cores"].get<int>(), 1);
  EXPECT_TRUE(j["host"]["isa"].is_array());
}

// --compile-cache: "fresh" leaves the user's cache directory alone (the cold compile fills a
// private one); "user" compiles into it, as a restarted process would, so the second such run
// finds its code there.
TEST(Bench, CompileCacheFreshOrUser) {
  char tmpl[] = "/tmp/kiln-bench-user-cache-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const char* old = std::getenv("KILN_CACHE_DIR");
  const std::string old_value = old ? old : "";
  setenv("KILN_CACHE_DIR", dir.c_str(), 1);
  auto files = [&] {
    size_t n = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
      n += e.is_regular_file();
    return n;
  };
  BenchOptions o = small();
  run_bench(o);
  EXPECT_EQ(files(), 0u) << "a fresh-cache bench wrote into the user's cache";
  o.compile_cache = "user";
  BenchResult first = run_bench(o);
  EXPECT_EQ(first.compile_cache, "user");
  EXPECT_GT(files(), 0u) << "a user-cache bench did not compile into the user's cache";
  const size_t after_first = files();
  BenchResult second = run_bench(o);
  EXPECT_EQ(files(), after_first) << "the second user-cache compile did not find its code";
  EXPECT_TRUE(second.compile_s.has_value());
  o.compile_cache = "warm";
  EXPECT_NE(error_of([&] { run_bench(o); }).find("--compile-cache expected fresh or user"),
            std::string::npos);
  if (old) setenv("KILN_CACHE_DIR", old_value.c_str(), 1);
  else unsetenv("KILN_CACHE_DIR");
  std::filesystem::remove_all(dir);
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

// Note [allocation sites]: the recorder brackets one call after the timed ones; its
// attribution is the result's and the JSON's.
TEST(Bench, AllocSiteRecorderBracketsOneCallAfterTheTimedOnes) {
  g_site_begins = g_site_ends = 0;
  set_alloc_site_recorder({&begin_sites, &end_sites});
  BenchOptions o = small();
  o.iters = 4;
  BenchResult r = run_bench(o);
  set_alloc_site_recorder({});
  EXPECT_EQ(g_site_begins, 1);
  EXPECT_EQ(g_site_ends, 1);
  const std::map<std::string, int64_t> want{{"kiln", 0}, {"libexample.so.1", 3}};
  EXPECT_EQ(r.steady_state_allocs_by_module, want);
  json j = json::parse(r.json());
  EXPECT_EQ(j["steady_state_allocs_by_module"]["libexample.so.1"], 3);
  EXPECT_EQ(j["steady_state_allocs_by_module"]["kiln"], 0);
  EXPECT_EQ(r.samples_ms.size(), 4u);  // the recorded call is not a timed one
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

namespace {
// samples_ms of a bench JSON: one per timed call, each positive and finite, and the reported
// statistics are exactly the nearest-rank percentiles / extremes / mean of those samples
// (recomputed here, not with kiln::percentile).
void check_samples(const json& j, int64_t expected_calls) {
  ASSERT_TRUE(j.contains("samples_ms"));
  ASSERT_TRUE(j["samples_ms"].is_array());
  std::vector<double> s = j["samples_ms"].get<std::vector<double>>();
  ASSERT_EQ(int64_t(s.size()), expected_calls);
  ASSERT_EQ(int64_t(s.size()), j["iters"].get<int64_t>());
  for (double x : s) {
    EXPECT_TRUE(std::isfinite(x)) << x;
    EXPECT_GT(x, 0);
  }
  std::vector<double> sorted = s;
  std::sort(sorted.begin(), sorted.end());
  auto nearest_rank = [&](double p) {
    size_t rank = size_t(std::ceil(p / 100.0 * double(sorted.size())));
    return sorted[rank == 0 ? 0 : rank - 1];
  };
  EXPECT_EQ(j["p50_ms"].get<double>(), nearest_rank(50));
  EXPECT_EQ(j["p90_ms"].get<double>(), nearest_rank(90));
  EXPECT_EQ(j["p99_ms"].get<double>(), nearest_rank(99));
  EXPECT_EQ(j["max_ms"].get<double>(), sorted.back());
  EXPECT_EQ(j["min_ms"].get<double>(), sorted.front());
  double sum = 0;
  for (double x : s) sum += x;
  EXPECT_NEAR(j["mean_ms"].get<double>(), sum / double(s.size()), 1e-9 * sum);
}
}  // namespace

TEST(Bench, SamplesAreEveryTimedCallAndGiveTheStatistics) {
  {
    SCOPED_TRACE("compiled, --iters 23");
    BenchOptions o = small();
    o.iters = 23;  // p99 of 23 calls is the maximum; p90 the 21st fastest
    o.seed = 5;
    check_samples(json::parse(run_bench(o).json()), 23);
  }
  {
    SCOPED_TRACE("eager, --iters 7");
    BenchOptions o = small();
    o.backend = "eager";
    o.iters = 7;
    check_samples(json::parse(run_bench(o).json()), 7);
  }
  {
    SCOPED_TRACE("eager, --seconds");
    BenchOptions o = small();
    o.backend = "eager";
    o.iters = 0;
    o.seconds = 0.01;
    BenchResult r = run_bench(o);
    EXPECT_EQ(int64_t(r.samples_ms.size()), r.iters);
    check_samples(json::parse(r.json()), r.iters);
  }
}

TEST(Bench, CudaOptionErrors) {
  BenchOptions o = small();
  o.device = "cuda";
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present; this checks the no-device answer";
  for (const char* backend : {"eager", "compiled"})
  for (const std::string& target : {std::string("mlp"), std::string("model.onnx")}) {
    o.backend = backend;
    o.target = target;
    try {
      run_bench(o);
      ADD_FAILURE() << target << " " << backend << ": --device cuda without a device did not throw";
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_EQ(e.kind(), ErrorKind::NotSupported) << m;
      EXPECT_EQ(m.rfind("bench: --device cuda: no CUDA device", 0), 0u) << m;
    }
  }
}

// cuda_eager_gap needs no GPU: it checks op records and traces decompositions on type-only
// tensors.
TEST(Bench, CudaEagerGapNamesTheFirstNodeWithoutACudaKernel) {
  Generator gen(31);
  {
    SCOPED_TRACE("pointwise + reductions + softmax (a decomposition over CUDA kernels)");
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::Float32, {4, 6}));
    ValueId b = g.add_param("b", Tensor::randn({6}, gen));
    ValueId y = g.add_node1(OpId::Add, {x, b}, {}, "add_0");
    y = g.add_node1(OpId::Tanh, {y}, {}, "tanh_1");
    y = g.add_node1(OpId::Softmax, {y}, {{"dim", int64_t(1)}}, "softmax_2");
    y = g.add_node1(OpId::Sum, {y}, {{"dims", Ints{1}}, {"keepdim", true}}, "sum_3");
    g.outputs = {y};
    EXPECT_EQ(cuda_eager_gap(g), "");
  }
  {
    // conv2d, linear and the other ops without a hand-written CUDA kernel run eagerly through
    // the CUDA target (Note [Compiled eager kernels on CUDA]).
    SCOPED_TRACE("conv2d and fused_linear nodes");
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::Float32, {1, 3, 8, 8}));
    ValueId w = g.add_param("w", Tensor::randn({4, 3, 3, 3}, gen));
    ValueId y = g.add_node1(OpId::Relu, {x}, {}, "relu_0");
    y = g.add_node1(OpId::Conv2d, {y, w}, {}, "node_Conv_3");
    y = g.add_node1(OpId::Flatten, {y}, {{"start_dim", int64_t(1)}}, "flat");
    ValueId fw = g.add_param("fw", Tensor::randn({3, 144}, gen));
    y = g.add_node1(OpId::FusedLinear, {y, fw}, {{"activation", std::string("relu")}}, "fc");
    g.outputs = {y};
    EXPECT_EQ(cuda_eager_gap(g), "");
  }
  {
    // Integer division runs through the compiled path, which reports a zero divisor through
    // the status record (Note [Device status]): nothing is missing on CUDA any more.
    SCOPED_TRACE("integer div");
    Graph g;
    ValueId a = g.add_input("a", TensorType(DType::Int32, {4}));
    ValueId b = g.add_input("b", TensorType(DType::Int32, {4}));
    ValueId y = g.add_node1(OpId::Add, {a, b}, {}, "add_0");
    y = g.add_node1(OpId::Div, {y, b}, {}, "idiv");
    y = g.add_node1(OpId::Pow, {y, b}, {}, "ipow");
    ValueId f = g.add_input("f", TensorType(DType::Float32, {4}));
    ValueId z = g.add_node1(OpId::Div, {f, f}, {}, "fdiv");
    g.outputs = {y, z};
    EXPECT_EQ(cuda_eager_gap(g), "");
  }
  {
    SCOPED_TRACE("symbolic dims");
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::Float32, {SymInt::symbol("n"), 6}));
    ValueId y = g.add_node1(OpId::Softmax, {x}, {{"dim", int64_t(1)}}, "sm");
    g.outputs = {y};
    EXPECT_EQ(cuda_eager_gap(g, {{"n", 3}}), "");
  }
  {
    SCOPED_TRACE("the zoo's mlp, captured (what kiln bench mlp --device cuda checks)");
    auto m = nn::make_zoo_model("mlp", 2, 0);
    ExplainReport rep = explain(compile(m.module), m.inputs);
    ASSERT_EQ(rep.graphs.size(), 1u);
    EXPECT_EQ(cuda_eager_gap(parse_graph(rep.graphs[0].ir)), "");
  }
}

// The same check on imported ONNX graphs: the ONNX node name is what the error names.
TEST(Bench, CudaEagerGapOnImportedOnnx) {
  Generator gen(32);
  onnx_test::TempDir dir;
  {
    onnx_test::ModelBuilder m(17);
    m.input("x", DType::Float32, {1, 3, 16, 16});
    m.initializer("w", Tensor::randn({8, 3, 3, 3}, gen));
    m.node("Relu", {"x"}, {"r"}, {}, "node_Relu_0");
    m.node("Conv", {"r", "w"}, {"c"}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}}, "node_Conv_3");
    m.node("Exp", {"c"}, {"y"}, {}, "node_Exp_4");
    m.output("y", DType::Float32);
    Graph g = import_onnx(dir.write("conv.onnx", m.bytes()));
    EXPECT_EQ(cuda_eager_gap(g), "");
  }
  {
    onnx_test::ModelBuilder m(17);
    m.input("a", DType::Int64, {4}).input("b", DType::Int64, {4});
    m.node("Div", {"a", "b"}, {"q"}, {}, "node_Div_7");
    m.output("q", DType::Int64);
    Graph g = import_onnx(dir.write("idiv.onnx", m.bytes()));
    EXPECT_EQ(cuda_eager_gap(g), "");  // integer division runs on CUDA (Note [Device status])
  }
  {
    // Pointwise ops, reductions and softmax (a decomposition), with a symbolic batch.
    onnx_test::ModelBuilder m(17);
    m.input("x", DType::Float32, {std::string("N"), 32});
    m.initializer("b", Tensor::randn({32}, gen));
    m.node("Add", {"x", "b"}, {"a"});
    m.node("Tanh", {"a"}, {"t"});
    m.node("Softmax", {"t"}, {"s"}, {{"axis", int64_t(1)}});
    m.node("ReduceMean", {"s"}, {"mu"}, {{"axes", std::vector<int64_t>{1}}});
    m.node("Sub", {"s", "mu"}, {"c"});
    m.node("Exp", {"c"}, {"y"});
    m.node("ReduceMax", {"x"}, {"z"}, {{"axes", std::vector<int64_t>{1}}, {"keepdims", int64_t(0)}});
    m.output("y", DType::Float32).output("z", DType::Float32);
    Graph g = import_onnx(dir.write("pointwise.onnx", m.bytes()));
    Tensor x = Tensor::randn({4, 32}, gen);
    EXPECT_EQ(cuda_eager_gap(g, bind_input_symbols(g, {x})), "");
  }
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
  std::string cuda = with([](BenchOptions& o) {
    o.device = "cuda";
    o.backend = "eager";
  });
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

  // Note [Kernel work]: a compiled CPU run has the machine's rates, and every launch a floor.
  if (best_compile_backend() != "eager") {
    EXPECT_GT(run.roofline.flops_per_ms, 0);
    EXPECT_GT(run.roofline.bytes_per_ms, 0);
    EXPECT_GT(run.roofline.mem_bytes_per_ms, 0);
    for (const OpStat& s : run.table) {
      EXPECT_GT(s.floor_ms, 0) << s.name;
      EXPECT_NEAR(s.ratio, s.mean_ms / s.floor_ms, 1e-9 * s.ratio) << s.name;
    }
    // The mlp's kernels are all shorter than a roofline judges; none is left out of the count.
    EXPECT_GT(run.short_kernels + (run.worst_ratio > 0 ? 1 : 0), 0);
    EXPECT_LE(run.share_within_2x + run.share_2x_to_5x + run.share_over_5x + run.short_share, 100.001);
  }
}

TEST(Profiler, RooflineFloorIsTheLongerOfArithmeticAndTraffic) {
  // 1 GFLOP/ms f32, 4 bf16; 100 MB/ms from the caches, 20 from memory
  Roofline r{1e6, 4e6, 1e5, 2e4};
  EXPECT_DOUBLE_EQ(r.floor_ms(2e6, 1e4, 0, DType::Float32), 2.0);   // compute-bound
  EXPECT_DOUBLE_EQ(r.floor_ms(2e6, 1e4, 0, DType::BFloat16), 0.5);  // at the bf16 rate
  EXPECT_DOUBLE_EQ(r.floor_ms(1e3, 5e5, 0, DType::Float32), 5.0);   // traffic-bound
  // 1e5 of the 5e5 bytes are weights, from memory: 4e5 / 1e5 + 1e5 / 2e4
  EXPECT_DOUBLE_EQ(r.floor_ms(1e3, 5e5, 1e5, DType::Float32), 9.0);
  EXPECT_EQ(r.floor_ms(0, 0, 0, DType::Float32), -1);                // work unknown
  EXPECT_EQ(Roofline{}.floor_ms(2e6, 1e4, 0, DType::Float32), -1);   // rates unknown
  Roofline no_low{1e6, 0, 1e5, 0};  // no bf16 rate: the f32 one; no memory rate: the caches'
  EXPECT_DOUBLE_EQ(no_low.floor_ms(2e6, 1e4, 0, DType::BFloat16), 2.0);
  EXPECT_DOUBLE_EQ(no_low.floor_ms(1e3, 5e5, 1e5, DType::Float32), 5.0);
  // Activations larger than the last-level cache come from memory too.
  Roofline small_cache{1e6, 4e6, 1e5, 2e4, 1e5};
  EXPECT_DOUBLE_EQ(small_cache.floor_ms(1e3, 5e5, 1e5, DType::Float32), 4e5 / 2e4 + 1e5 / 2e4);
  EXPECT_DOUBLE_EQ(small_cache.floor_ms(1e3, 1.5e5, 1e5, DType::Float32), 5e4 / 1e5 + 1e5 / 2e4);
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
