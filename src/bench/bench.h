// Benchmarking a zoo model or an ONNX file: latency distribution, compile cost, memory and
// steady-state heap allocations, as one result (`kiln bench`, tools/cmd_bench.cc). See
// docs/cli.md for the exact definition of each field, and Note [Benchmarking on CUDA] in
// bench.cc for what runs on a CUDA device.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "capture/compile.h"
#include "core/device.h"
#include "ir/interpreter.h"
#include "runtime/executable.h"
#include "runtime/package.h"

namespace kiln {

struct BenchOptions {
  std::string target;                // zoo model name or .onnx path
  std::string backend = "compiled";  // eager | compiled
  std::string device;                // cpu | cuda; empty: a package's own device, else cpu
  std::string mode = "default";      // default | reduce-overhead | max-autotune
  // --dtype: float32 | bfloat16 | float16 (bf16, f16): the compiled run's precision
  // (CompileOptions::precision); anything but float32 with --backend eager is an error.
  std::string dtype = "float32";
  int64_t batch = 1;
  int threads = 0;     // 0: OpenMP's default
  int warmup = 3;
  int iters = 0;       // timed iterations; 0 with seconds == 0 means 50
  double seconds = 0;  // time-boxed: iterate until this much time has passed (at least once)
  uint64_t seed = 0;
  // The first compile's cache directory: "fresh" (a new, empty one: compile_s is a cold
  // compile) or "user" (KILN_CACHE_DIR, else ~/.cache/kiln, as a restarted process finds it:
  // compile_s is a warm-cache compile when the cache holds the model's kernels and plans).
  std::string compile_cache = "fresh";
  // Called after each warm-up/timed iteration with (done, total); total is -1 when time-boxed.
  std::function<void(int64_t done, int64_t total, double elapsed_s)> progress;
};

// What bench, profile and explain run: a zoo model or an ONNX file, with inputs.
struct BenchTarget {
  std::string name;
  TensorList inputs;  // on the target's device
  // The model's named tensors on the CPU path (a zoo module's state dict, an ONNX model's
  // initializers): what compiled graphs name their parameters after.
  NamedState state;
  // Parameters a weights file need not hold: a zoo module's non-persistent buffers (BERT's
  // position ids), which packages record with their values (compiler::write_package).
  NamedState fixed;
  std::function<TensorList(const TensorList&)> eager;  // op by op
  std::function<CompiledFunction(const CompileOptions&)> compile;
  // A zoo model's names for its inputs and outputs, in call order, with its inputs' first dim
  // named "batch" (empty for ONNX models: bench_package_info reads theirs from the file).
  std::vector<SignatureName> input_names, output_names;
  // An ONNX model with a data-dependent tail (Note [Data-dependent tails]): what runs after
  // the compiled graph, in words; empty when the model is one graph.
  std::string data_dependent_tail;
};
// `target` is a zoo model name or a path ending in .onnx. ONNX models get fresh random inputs of
// their declared shapes (a symbolic first dim becomes `batch`, other symbolic dims 1; integer
// inputs in [0, 10)); their eager form is the graph interpreter, their compiled form capture of
// that interpreter (which re-traces to a concrete graph) with the chosen backend.
//
// device cuda (Note [Benchmarking on CUDA]): an ONNX model whose every node can run on the CUDA
// eager kernels (cuda_eager_gap) gets its params, consts and inputs copied to the device (the
// inputs are the same values as on the CPU for the same seed) and its eager form interprets the
// graph there; outputs stay on the device. Its `compile` throws NotSupported (the CUDA compiler
// is not built yet). Otherwise, and for zoo models (modules cannot be moved to a device), this
// throws NotSupported naming the first node without a CUDA kernel, or saying why.
BenchTarget load_bench_target(const std::string& target, int64_t batch, uint64_t seed,
                              Device device = Device::cpu());

// What a package of `target`, loaded into `m` by load_bench_target, records besides the
// executable (Note [Package signature] in runtime/package.cc): the model by its file name, not its
// path (a package must not depend on where the model was read from), the batch, and the inputs'
// and outputs' names with their symbolic dims — a zoo model's from `m`, an ONNX model's names
// and dim_params read from the file here (only packages need them, so loading does not).
PackageInfo bench_package_info(const std::string& target, const BenchTarget& m, int64_t batch);

// A copy of g whose values all live on `device`: every type says so, params and consts carry
// device copies of their data.
Graph graph_on_device(const Graph& g, Device device);

// Why `g` cannot run on a CUDA device through the eager kernels, or "" when every node can: a
// node runs there when its op has a CUDA kernel, or a decomposition whose ops (recursively) all
// have one. Decompositions are checked by tracing them on type-only CUDA tensors of the node's
// input types (symbolic dims evaluated with `bindings`). The answer names the first node that
// cannot run, its op and, for a decomposition, the op inside it that has no kernel, then how
// many nodes cannot run and their ops: "node 'conv1' (op conv2d) has no CUDA kernel yet (CUDA
// kernels for it arrive with the CUDA backend); 3 of 7 nodes have none (conv2d, linear)".
std::string cuda_eager_gap(const Graph& g, const SymbolBindings& bindings = {});

struct HostInfo {
  std::string cpu_model;
  std::vector<std::string> isa;  // of avx2, avx512f, avx512_bf16, avx512_vnni, amx_tile
  int cores = 0;
};

struct BenchResult {
  std::string model, backend, device, mode, kiln_version;
  std::string dtype = "float32";  // the precision the model ran in (--dtype)
  int64_t batch = 0;
  int threads = 0;
  int64_t iters = 0, warmup = 0;
  std::optional<double> compile_s, warm_compile_s;
  std::optional<bool> warm_compile_cache_hit;
  std::string compile_cache;  // BenchOptions::compile_cache of a compiled run, else empty
  double first_call_s = 0;
  std::optional<double> load_s;  // a .kiln package: load_package's wall time
  // A CUDA package: making the process's CUDA context before the load (not in load_s).
  std::optional<double> cuda_context_s;
  std::vector<std::pair<std::string, double>> load_phases_s;  // ... and where it went (LoadedPackage)
  std::string cuda_code;  // a CUDA package: "cubin" or "ptx" (LoadedPackage::cuda_code); else ""
  double p50_ms = 0, p90_ms = 0, p99_ms = 0, max_ms = 0, min_ms = 0, mean_ms = 0, stddev_ms = 0;
  // Every timed call's latency in ms, in call order: the samples the statistics above come from.
  std::vector<double> samples_ms;
  // CUDA only: device time of a call (CUDA events around each of up to 1000 calls made after the
  // timed ones: Note [Device time in calls of its own] in bench.cc), nearest-rank percentiles.
  std::optional<double> device_p50_ms, device_p99_ms;
  double throughput_per_s = 0;
  int64_t peak_rss_bytes = 0;
  std::optional<int64_t> peak_device_bytes, arena_bytes;
  // CUDA only, the device memory in windows (Note [Device memory windows] in bench.cc):
  // allocated after the model's weights and inputs are on the device (a package: after its load),
  // allocated after the first call (what the compiled model keeps), and the peak of the warm-up
  // and timed calls alone (the window torch.cuda.max_memory_allocated covers for the peers).
  std::optional<int64_t> loaded_device_bytes, resident_device_bytes, steady_peak_device_bytes;
  // Compiled: kernel and library launches per call, summed over the compiled graphs.
  std::optional<int64_t> launches_per_call;
  // Involuntary context switches of the process's threads (getrusage ru_nivcsw) during the
  // timed calls, per call: how often the OS took a core away from the benchmark. With every
  // core busy (threads = cores), each one can stall a parallel region for a scheduler slice.
  double involuntary_switches_per_call = 0;
  // The process's CPU time (user + system, every thread) over the wall time of the timed calls:
  // how many cores the calls kept busy, spinning OpenMP threads included (1.0 for one thread
  // that never waits). More than `threads` means threads the caller did not ask for.
  double cpu_busy_cores = 0;
  // A CPU package: the OpenMP thread count its oneDNN nodes were rebuilt for at load, and how
  // many of its oneDNN nodes kept the count it was written for (LoadedPackage).
  std::optional<int> package_onednn_threads, package_nodes_at_written_threads;
  std::optional<double> steady_state_allocs_per_call;
  // Note [allocation sites]: one steady-state call's allocations per module ("kiln": Kiln's own
  // code); empty without a recorder.
  std::map<std::string, int64_t> steady_state_allocs_by_module;
  HostInfo host;

  // One JSON object with every field above (null for absent optionals).
  std::string json(int indent = -1) const;
};

// Checks the options, builds the model and measures it. Throws kiln::Error (naming the option,
// expected vs found) for bad options; NotSupported for --backend compiled --device cuda, for
// --device cuda without a device ("no CUDA device ...") and for a target that cannot run on the
// CUDA eager kernels (load_bench_target).
BenchResult run_bench(const BenchOptions& options);

// The heap-allocation counter run_bench reads around its timed loop. Libkiln does not replace
// operator new itself (that would tax every program linking it); the kiln binary registers a
// counter (tools/alloc_counter.cc). Without one, steady_state_allocs_per_call is null.
using AllocCounterFn = int64_t (*)();
void set_alloc_counter(AllocCounterFn fn);

// Note [allocation sites]: where a steady-state call's heap allocations come from. The kiln
// binary registers a recorder beside its counter (tools/alloc_counter.cc); run_bench makes one
// more call after the timed ones between begin() and end(), which returns the allocations of
// that call per module: "kiln" for Kiln's own code (the binary, the libkiln_* libraries and the
// generated kernels), else the file name of the library whose code asked (libdnnl.so.2 for
// oneDNN's execute(); C and C++ runtime and OpenMP frames are passed over to their caller).
// Without a recorder, steady_state_allocs_by_module is null.
struct AllocSiteRecorder {
  void (*begin)() = nullptr;
  std::map<std::string, int64_t> (*end)() = nullptr;
};
void set_alloc_site_recorder(AllocSiteRecorder recorder);

HostInfo host_info();

// The backend "compiled" means: "inductor" when registered, else "eager" (interpreted graphs).
std::string best_compile_backend();

// Fresh random inputs of an Executable's input specs (floats: standard normal; integers in
// [0, 10)), from Generator(seed): what `kiln bench` and `kiln run` feed a package.
TensorList package_inputs(const Executable& exe, uint64_t seed);
// Nearest-rank percentile of `samples` (p in [0, 100]); NaN when empty.
double percentile(std::vector<double> samples, double p);

}  // namespace kiln
