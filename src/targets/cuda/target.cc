// The CUDA target (compiler/target.h): loop kernels emitted as CUDA C and compiled by NVRTC for
// the device's architecture (cached as cubins), cuBLASLt GEMMs, cuDNN convolutions, direct
// kernels for what neither covers (targets/cuda/direct_kernels.h), a device arena and a stream
// per execution context (CUDA-graph replay in reduce-overhead). See Note [CUDA target].
//
// Note [CUDA target]
// Library kernels:
//   matmul (batched, B or A broadcast over the whole batch), linear (bias as the cuBLASLt BIAS
//   epilogue): cuBLASLt, f32 without TF32, f16/bf16 with f32 accumulation. What cuBLASLt does
//   not take goes to the direct GEMM kernel (gemm_needs_direct_kernel): float64 and integer
//   dtypes, batch dims that broadcast only partially ([2,1,M,K] x [3,K,N]: one strided batch
//   cannot express it; attention's decomposition makes such products), K = 0 (the output is the
//   bias or zeros) and empty outputs.
//   conv2d / conv_transpose2d (NCHW, groups, dilation, asymmetric padding; bias fused in the
//   cuDNN graph where an engine takes it, else a bias kernel after the convolution): cuDNN in
//   f32/f16/bf16; float64 runs the direct convolution kernels.
//   max_pool2d / avg_pool2d, adaptive_avg_pool2d (not global), concat, split, embedding /
//   index_select, gather, scatter_add, pad, upsample, grid_sample, argmax / argmin: direct
//   kernels with every size a literal (Note [CUDA direct kernels] in direct_kernels.cc; an
//   out-of-range index is reported through the status record and fails the call as the
//   reference does), generated per graph into one NVRTC program of their own (--fmad=false).
//   scaled_dot_product_attention: one flash-style direct kernel per node (Note [CUDA flash
//   attention] in direct_kernels.cc): the score matrix is never stored, every mask form and
//   dtype of the reference, a fully masked row NaN as the reference.
// fused_conv2d and fused_linear are decomposed by the compiler pipeline on this target: the
// convolution or GEMM runs in the library and the residual add and activation become generated
// pointwise code (the GPU-speed issue fuses them back into epilogues). Everything pointwise,
// reductions, softmax / log_softmax / layer_norm and global average pooling are generated
// (targets/cuda/emitter.cc); integer div / pow report a zero divisor or a negative exponent
// through the status record (Note [Device status] in runtime/executable.h). An op that is
// neither fails to compile on CUDA naming the node (capture then runs the graph eagerly).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>
#include <tuple>

#include <fmt/format.h>

#include "compiler/compile.h"
#include "compiler/insert_copies.h"
#include "compiler/target.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "lower/scheduler.h"
#include "support/tuning_store.h"
#include "runtime/launch_library.h"
#include "kernels/cuda/cublaslt_gemm.h"
#include "kernels/cuda/cuda_driver.h"
#include "kernels/cuda/cudnn_backend.h"
#include "kernels/cuda/cudnn_conv.h"
#include "kernels/cuda/cudnn_sdpa.h"
#include "kernels/cuda/library_warm_up.h"
#include "targets/cuda/direct_kernels.h"
#include "targets/cuda/emitter.h"
#include "targets/cuda/nvrtc.h"
#include "targets/cuda/support.h"
#include "passes/attention_mask_guard.h"
#include "passes/graph_rewrite.h"

namespace kiln::cuda {

namespace {

using compiler::Knobs;
using compiler::MemRef;

constexpr int kDevice = 0;
constexpr int64_t kSmallLinearMacs = int64_t(1) << 15;
constexpr int64_t kSmallHalfGemvMacs = int64_t(1) << 22;

// Whether linear `n` of a caller's graph is a generated half-precision GEMV in a float16 /
// bfloat16 compile (lower::small_linear's rule), its float32 operands converted as autocast
// converts them.
bool half_gemv_after_autocast(const Graph& g, const Node& n) {
  if ((n.op != OpId::Linear && n.op != OpId::FusedLinear) || n.inputs.size() < 2) return false;
  Graph probe;
  std::vector<ValueId> in;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (n.inputs[i] == kNoValue) {
      in.push_back(kNoValue);
      continue;
    }
    TensorType t = g.type(n.inputs[i]);
    if (t.dtype == DType::Float32) t.dtype = DType::BFloat16;
    else if (t.dtype != DType::BFloat16 && t.dtype != DType::Float16) return false;
    in.push_back(probe.add_input(fmt::format("in{}", i), t));
  }
  probe.add_node(n.op, in, n.attrs);
  return lower::small_linear(probe, probe.nodes[0], 0, kSmallHalfGemvMacs);
}

// Device buffers and scratch regions start at 256-byte boundaries.
constexpr int64_t round_up_256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

bool concrete(const TensorType& t) {
  for (size_t i = 0; i < t.shape.size(); ++i)
    if (!t.shape[i].is_concrete()) return false;
  return true;
}

int multiprocessors() {
  static int n = [] {
    CudaDeviceInfo i = cuda_device_info(kDevice);
    return i.error.empty() ? i.multiprocessors : 0;
  }();
  return n;
}

// Note [CUDA cross-builds]
// compiler::Options::arch = "sm_90" (the `arch` knob) compiles for a GPU that is not here:
//   - NVRTC builds the cubins for that architecture (it needs no GPU); nothing is loaded;
//   - grids are sized for the architecture's usual multiprocessor count (kSmCount: the
//     datacenter part of each generation; the `sms` knob overrides it), which changes only how
//     work is split, never what is computed per element;
//   - cuBLASLt and cuDNN cannot be asked without a device: GEMMs and convolutions are recorded as
//     descriptors with kCrossWorkspaceBytes of scratch each, and the loader picks the
//     heuristic's first algorithm / engine within it (Note [CUDA launch records]); a
//     convolution's bias always runs as its own kernel (whether an engine fuses it is the
//     device's to say);
//   - constants stay on the host and the Executable is marked not runnable: it is written as a
//     package (runtime/package.h), which the loader checks against the GPU it finds.
// A package built on the GPU itself pins its choices instead and is bitwise the compiled run; a
// cross-built one computes the same ops with possibly other library kernels (tests compare it
// within float32 rounding).
constexpr int64_t kCrossWorkspaceBytes = int64_t(32) << 20;

// Note [Default engines within the cross-build workspace]
// Default mode takes cuDNN's heuristic engine, except one that wants more than
// kCrossWorkspaceBytes of workspace: then the first candidate within it, the rule a cross-built
// package's loader applies (so the two builds agree). resnet50 bf16 at batch 32 on the H100
// (cuDNN 9.14): the stem's heuristic engine (eng10) wanted 73.5 MiB, which made the arena's
// peak (Note [Scratch per step]); the first candidate within 32 MiB is eng35, no workspace,
// which max-autotune's timing also picks. The package's p50 went 1.713 -> 1.689 ms and its
// device memory 217.3 -> 195.8 MiB (docs/benchmarks.md, thirty-fifth session).

struct SmCount {
  const char* arch;
  int sms;
};
constexpr SmCount kSmCount[] = {{"sm_70", 80},  {"sm_75", 40},  {"sm_80", 108}, {"sm_86", 84},
                                {"sm_87", 16},  {"sm_89", 128}, {"sm_90", 132}, {"sm_100", 148},
                                {"sm_120", 84}};

// Note [CUDA TF32]
// float32 is exact float32 by default: cuBLASLt computes with CUBLAS_COMPUTE_32F and cuDNN's
// engines with the TENSOR_CORE numerical note are rejected for float32. The knob tf32=on (as
// torch.backends.cudnn.allow_tf32 / torch.set_float32_matmul_precision("high"), or TensorRT's
// kTF32 flag) lets the library kernels of a float32 graph use TF32 tensor cores: the GEMMs
// (linear, matmul) compute with CUBLAS_COMPUTE_32F_FAST_TF32, the convolutions may take
// tensor-core engines and compute channels-last as half precision does (Note [CUDA
// convolution layouts]; channels per group a multiple of 4). TF32 rounds each product's
// inputs to a 10-bit mantissa (relative 2^-11, float16's precision) and accumulates in
// float32; storage stays float32, as do the generated kernels, the direct GEMM and GEMVs and
// attention. It is opt-in, never a max-autotune candidate: it changes the arithmetic, which a
// search for speed must not do behind the caller's back. The choice is recorded in each
// library call's descriptor (`allow_tf32`) and so in packages and cross-builds. The CPU target
// refuses the knob (no CPU kernel computes in TF32).

// Note [CUDA programmatic launch]
// Inside a CUDA graph each kernel costs about 1.2 us beyond its own work (measured on the H200):
// the next kernel's blocks are scheduled only once the previous kernel has drained. On sm_90
// and later a kernel launched with the programmatic-serialization attribute may be scheduled
// as soon as every block of the kernel before it has executed `griddepcontrol.launch_dependents`,
// and its `griddepcontrol.wait` then blocks until that kernel has finished and its writes are
// visible. Every kernel Kiln generates (loop kernels, direct kernels, the convolutions' layout
// and epilogue kernels) starts with KN_GRID_WAIT() (emitter.h's kGridWait): the wait, then
// the trigger. Nothing of a kernel touches memory before its wait, so the order of every
// read and write is the plain launch's:
//   - a programmatic kernel B after A runs its body only after A has ended (B's wait);
//   - C after B is scheduled only once all of B's blocks passed their wait, i.e. after A ended,
//     and runs its body after B ended: the chain is transitive;
//   - a library kernel (cuBLASLt, cuDNN) is launched plainly and so waits for whatever came
//     before; a generated kernel after one waits for it (a kernel that never triggers lets its
//     dependent start when it ends);
//   - in a CUDA graph the capture records the programmatic edge between two kernel nodes; an
//     edge from a copy or a library's child graph is a plain one.
// The wait and the trigger are no-ops for a kernel launched plainly, so the same cubin runs
// either way, and the outputs are bitwise the same (tested). What it saves is the scheduling
// gap between two generated kernels and part of it after a library kernel. The knob pdl=on
// asks for it; the default is off until a GPU run has measured it and run the suite with it
// (the forty-sixth session got no GPU). Launch records carry "programmatic" (launch_cuda.cc);
// below sm_90 the attribute is never set.

// What the build is for: the device here, or (the `arch` knob) a cross-build.
struct BuildFor {
  std::string arch;
  int sms = 0;
  bool cross = false;
  bool conv_nhwc = true;  // knob conv=auto|nchw: Note [CUDA convolution layouts]
  bool conv_fuse = true;  // knob conv_epilogue=fused|kernel (kernel: tests of the epilogue kernel)
  bool small_conv = true;  // knob stem_conv=direct|cudnn: Note [CUDA small-channel convolutions]
  // knob filters=stored|copied: Note [Filters stored KRSC in process] (copied: a KRSC copy per
  // execution context beside the KCRS constant, as before; for A/B runs of device memory)
  bool store_filters = true;
  bool timed = false;     // knob kernels=heuristic|timed: Note [CUDA library kernels timed]
  // knob plan_threads=N (1-64; default the host's cores, at most 16): the threads that build
  // the convolutions' cuDNN plans ahead of planning the nodes (Note [Convolution plans prepared
  // in parallel]); 1 builds them one at a time as plan_conv meets them.
  int plan_threads = 0;
  bool tf32 = false;      // knob tf32=off|on: Note [CUDA TF32]
  // knob attention=auto|direct|simt (Note [CUDA attention]): direct never asks cuDNN; simt
  // also keeps float16/bfloat16 off the tensor cores (Note [CUDA tensor-core attention]).
  std::string attention = "auto";
  bool pdl = false;  // knob pdl=off|on (Note [CUDA programmatic launch])
  // The architecture's compute capability (90 for sm_90).
  int sm() const { return std::stoi(arch.substr(3)); }
  // The compute capability the direct kernels are planned for.
  int compute_capability() const { return attention == "simt" ? 0 : sm(); }
  // Whether generated kernels are launched programmatically: asked for, and sm_90 or later.
  bool programmatic() const { return pdl && sm() >= 90; }
};

BuildFor build_for(const Knobs& knobs) {
  BuildFor b;
  const std::string conv = knobs.get("conv", "auto");
  if (conv != "auto" && conv != "nchw")
    fail("cuda: knob conv={} is not a convolution layout policy (auto or nchw)", conv);
  b.conv_nhwc = conv == "auto";
  const std::string epilogue = knobs.get("conv_epilogue", "fused");
  if (epilogue != "fused" && epilogue != "kernel")
    fail("cuda: knob conv_epilogue={} is not fused or kernel", epilogue);
  b.conv_fuse = epilogue == "fused";
  const std::string kernels = knobs.get("kernels", "heuristic");
  if (kernels != "heuristic" && kernels != "timed")
    fail("cuda: knob kernels={} is not heuristic or timed", kernels);
  b.timed = kernels == "timed";
  b.plan_threads = int(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
  if (const std::string* t = knobs.find("plan_threads")) {
    int v = -1;
    try {
      size_t used = 0;
      v = std::stoi(*t, &used);
      if (used != t->size()) v = -1;
    } catch (const std::exception&) {
    }
    if (v < 1 || v > 64) fail("cuda: knob plan_threads={} is not a thread count (1-64)", *t);
    b.plan_threads = v;
  }
  const std::string tf32 = knobs.get("tf32", "off");
  if (tf32 != "off" && tf32 != "on")
    fail("cuda: knob tf32={} is not off or on", tf32);
  b.tf32 = tf32 == "on";
  const std::string stem = knobs.get("stem_conv", "direct");
  if (stem != "direct" && stem != "cudnn")
    fail("cuda: knob stem_conv={} is not direct or cudnn", stem);
  b.small_conv = stem == "direct";
  const std::string filters = knobs.get("filters", "stored");
  if (filters != "stored" && filters != "copied")
    fail("cuda: knob filters={} is not stored or copied", filters);
  b.store_filters = filters == "stored";
  b.attention = knobs.get("attention", "auto");
  if (b.attention != "auto" && b.attention != "direct" && b.attention != "simt")
    fail("cuda: knob attention={} is not auto, direct or simt", b.attention);
  const std::string pdl = knobs.get("pdl", "off");
  if (pdl != "on" && pdl != "off") fail("cuda: knob pdl={} is not on or off", pdl);
  b.pdl = pdl == "on";
  const std::string* arch = knobs.find("arch");
  if (!arch) {
    b.arch = device_arch(kDevice);
    b.sms = std::max(multiprocessors(), 1);
    return b;
  }
  b.cross = true;
  if (b.timed) fail("cuda: kernels=timed needs the GPU: a cross-build (arch={}) cannot time", *arch);
  b.arch = *arch;
  if (b.arch.size() < 5 || b.arch.size() > 7 || b.arch.compare(0, 3, "sm_") != 0 ||
      b.arch.find_first_not_of("0123456789", 3) != std::string::npos)
    fail("cuda: arch '{}' is not a CUDA architecture (e.g. sm_90)", b.arch);
  b.sms = 0;
  for (const SmCount& s : kSmCount)
    if (b.arch == s.arch) b.sms = s.sms;
  if (const std::string* sms = knobs.find("sms")) {
    try {
      b.sms = std::stoi(*sms);
    } catch (const std::exception&) {
      b.sms = -1;
    }
    if (b.sms < 1 || b.sms > 1024) fail("cuda: knob sms={} is not a multiprocessor count", *sms);
  }
  if (b.sms == 0)
    fail("cuda: no multiprocessor count is known for {}: give it as the knob sms=N", b.arch);
  return b;
}


// ---- library kernels --------------------------------------------------------------------------

// Note [CUDA library kernels timed]
// With the knob kernels=timed (max-autotune's candidates on CUDA), each convolution's cuDNN
// engine configurations and each GEMM's cuBLASLt algorithms (the heuristic's first 8, and the
// tile and split-K variants of Note [cuBLASLt split-K and tile variants]) are timed at compile
// time on device buffers of the call's sizes (filled with a fixed non-zero byte pattern:
// engines do not depend on values), in interleaved rounds (each round times 3 back-to-back
// calls of every candidate with events on the legacy stream, held by a host function while the
// calls are enqueued so that the device runs them back to back, as a CUDA graph would; a
// candidate's time is its best round). The fastest replaces the heuristic's choice only when
// it is at least 3% faster, so noise does not flip choices. A candidate that fails to run is skipped. Choices
// are kept in the tuning store (support/tuning_store.h) keyed by the GPU, the driver, the
// library version and the call's descriptor, so a later compile of the same call on the same
// machine picks the same kernel without timing; a stored choice the library no longer offers
// is timed again (the key's "v2": stores written before the variants and the hold are not
// read). The choice is what the package records pin (engine tag, algorithm bytes).
// Different engines round differently (split-K, other tile orders): max-autotune's accuracy
// gate compares the whole graph with the default configuration's outputs.
class LibraryTimer {
 public:
  ~LibraryTimer() { release(); }
  void release() {
    if (buf_) cudaFree(buf_);
    buf_ = nullptr;
    size_ = 0;
  }
  // Device memory of at least `bytes`, 256-byte aligned, filled with the pattern. cudaMalloc
  // itself, not the caching allocator (allocate_device_arena): release() gives it back to the
  // driver after lowering instead of leaving it cached, and out of the peak statistics.
  char* buffer(size_t bytes) {
    if (bytes > size_) {
      if (buf_) cudaFree(buf_);
      buf_ = nullptr;
      size_ = 0;
      check_cuda(cudaMalloc(&buf_, bytes), "cudaMalloc (library kernel timing)");
      check_cuda(cudaMemset(buf_, 0x3C, bytes), "cudaMemset (library kernel timing)");
      size_ = bytes;
    }
    return static_cast<char*>(buf_);
  }
  // The index of the fastest of `n` candidates (0 unless another is at least 3% faster) and
  // the times (ms per call; infinity where the candidate failed).
  int fastest(int n, const std::function<void(int)>& run, std::vector<double>* ms) {
    if (!events_) events_ = std::make_unique<CudaEventLog>(kDevice);
    constexpr int kRounds = 5, kCalls = 3, kHoldMicroseconds = 300;
    ms->assign(size_t(n), std::numeric_limits<double>::infinity());
    std::vector<bool> ok(size_t(n), true);
    for (int i = 0; i < n; ++i) {  // warm-up, and which candidates run at all
      try {
        run(i);
      } catch (const Error&) {
        ok[size_t(i)] = false;
      }
    }
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (library kernel timing)");
    for (int r = 0; r < kRounds; ++r)
      for (int i = 0; i < n; ++i) {
        if (!ok[size_t(i)]) continue;
        events_->clear();
        // The stream waits while the host enqueues the calls, so that the events time them
        // back to back on the device, as a CUDA graph runs them: a library call's host side
        // (cuDNN's execute, ~10-20 us) would otherwise be what is timed for short kernels.
        events_->hold(nullptr, kHoldMicroseconds);
        int a = events_->record(nullptr);
        for (int c = 0; c < kCalls; ++c) run(i);
        int b = events_->record(nullptr);
        events_->synchronize();
        (*ms)[size_t(i)] = std::min((*ms)[size_t(i)], events_->elapsed_ms(a, b) / kCalls);
      }
    int best = 0;
    for (int i = 1; i < n; ++i)
      if ((*ms)[size_t(i)] < (*ms)[size_t(best)]) best = i;
    if (!ok[0] || (*ms)[size_t(best)] < 0.97 * (*ms)[0]) return best;
    return 0;
  }

 private:
  void* buf_ = nullptr;
  size_t size_ = 0;
  std::unique_ptr<CudaEventLog> events_;
};

std::string library_tuning_key(const std::string& what) {
  CudaDeviceInfo i = cuda_device_info(kDevice);
  return fmt::format("cuda library kernel v2\n{} sm_{}{}\n{}\ncudnn {}\n{}", i.name, i.sm_major,
                     i.sm_minor, cuda_driver_version(), cudnn::version(), what);
}

std::string conv_tuning_key(const ConvDesc& d) {
  return library_tuning_key("conv " + describe(d));
}

// Picks the convolution's engine (Note [CUDA library kernels timed]); returns a note for explain.
std::string tune_conv(ConvPlan& plan, LibraryTimer& timer) {
  const ConvDesc& d = plan.desc();
  const std::string key = conv_tuning_key(d);
  std::string stored;
  if (tuning_get(key, &stored) && plan.select_tag(stored)) return " (timed earlier: tuning store)";
  std::vector<ConvEngine> cands = plan.candidates();
  std::erase_if(cands, [](const ConvEngine& e) { return e.workspace_bytes > (size_t(256) << 20); });
  if (cands.size() < 2) return "";
  const std::array<int64_t, 4> y = plan.output_dims();
  const size_t es = size_t(dtype_size(d.dtype));
  auto up = [](size_t b) { return size_t(round_up_256(int64_t(b))); };
  const size_t xb = up(size_t(d.n * d.c_in * d.h * d.w) * es);
  const size_t wb = up(size_t(d.c_out * (d.c_in / d.groups) * d.kh * d.kw) * es);
  const size_t yb = up(size_t(y[0] * y[1] * y[2] * y[3]) * es), bb = up(size_t(d.c_out) * es);
  size_t ws = 0;
  for (const ConvEngine& e : cands) ws = std::max(ws, e.workspace_bytes);
  char* m = timer.buffer(xb + wb + 2 * yb + bb + up(ws));
  ConvArgs a;
  a.x = m;
  a.w = m + xb;
  a.y = m + xb + wb;
  a.residual = m + xb + wb + yb;
  a.bias = m + xb + wb + 2 * yb;
  a.workspace = m + xb + wb + 2 * yb + bb;
  a.workspace_bytes = ws;
  std::vector<double> ms;
  int best = timer.fastest(int(cands.size()), [&](int i) {
    plan.select(cands[size_t(i)].index);
    plan.run(a);
  }, &ms);
  plan.select(cands[size_t(best)].index);
  plan.keep();  // Note [One engine finalized by tag]: a package's load restores it
  tuning_put(key, plan.engine().tag);
  return fmt::format(" (timed {} engines: {:.1f} us, the heuristic's {:.1f} us)", cands.size(),
                     ms[size_t(best)] * 1e3, ms[0] * 1e3);
}

// Picks the GEMM's algorithm (Note [CUDA library kernels timed]); returns a note for explain.
std::string tune_gemm(GemmPlan& plan, LibraryTimer& timer) {
  const GemmDesc& d = plan.desc();
  const std::string key = library_tuning_key(fmt::format(
      "{} ld {} {} {} strides {} {} {} alpha {}", plan.describe(), d.lda, d.ldb, d.ldd,
      d.stride_a, d.stride_b, d.stride_d, d.alpha));
  // The store's form of an algorithm: its configuration (Note [cuBLASLt algorithm identity] in
  // kernels/cuda/cublaslt_gemm.cc), which algo_from_config rebuilds (the heuristic may not list
  // it: Note [cuBLASLt split-K and tile variants]).
  // The candidates are listed first, also when the store has the choice: the algorithm taken
  // is then the very one the timing compile took (the same bytes in a package), and
  // algo_from_config is the fallback.
  std::vector<GemmAlgo> cands = plan.candidates(8);
  const size_t heuristic = cands.size();
  for (GemmAlgo& v : plan.variants(cands, 40)) cands.push_back(std::move(v));
  std::string stored;
  if (tuning_get(key, &stored)) {
    for (const GemmAlgo& c : cands)
      if (c.config == stored) {
        plan.set_algo(c);
        return " (timed earlier: tuning store)";
      }
    if (std::optional<GemmAlgo> g = plan.algo_from_config(stored)) {
      plan.set_algo(*g);
      return " (timed earlier: tuning store)";
    }
  }
  if (cands.size() < 2) return "";
  const size_t es = size_t(dtype_size(d.dtype));
  auto up = [](size_t b) { return size_t(round_up_256(int64_t(b))); };
  auto span = [&](int64_t rows, int64_t cols, int64_t stride) {
    return size_t(std::max<int64_t>(stride, rows * cols) * std::max<int64_t>(d.batch, 1));
  };
  const size_t ab = up(span(d.m, d.k, d.stride_a) * es), bb = up(span(d.k, d.n, d.stride_b) * es);
  const size_t db = up(span(d.m, d.n, d.stride_d) * es), biasb = up(size_t(d.n) * es);
  size_t ws = 0;
  for (const GemmAlgo& c : cands) ws = std::max(ws, c.workspace_bytes);
  char* m = timer.buffer(ab + bb + db + biasb + up(ws));
  GemmArgs a;
  a.a = m;
  a.b = m + ab;
  a.d = m + ab + bb;
  a.bias = m + ab + bb + db;
  a.workspace = m + ab + bb + db + biasb;
  a.workspace_bytes = ws;
  std::vector<double> ms;
  int best = timer.fastest(int(cands.size()), [&](int i) { plan.run(a, cands[size_t(i)]); }, &ms);
  plan.set_algo(cands[size_t(best)]);
  tuning_put(key, cands[size_t(best)].config);
  return fmt::format(" (timed {} algorithms: {:.1f} us [{}], the heuristic's {:.1f} us [{}]; {} "
                     "of them tile or split-K variants)",
                     cands.size(), ms[size_t(best)] * 1e3, cands[size_t(best)].config, ms[0] * 1e3,
                     cands[0].config, cands.size() - heuristic);
}

// A direct kernel around a convolution; each argument a node input, a node output or an offset
// into the scratch region.
struct KernelArg {
  enum class Of : uint8_t { Input, Output, Scratch } of = Of::Input;
  int index = 0;
  int64_t offset = 0;
};
struct ConvKernel {
  std::string name;
  int64_t blocks = 0;
  int threads = 256;
  std::vector<KernelArg> args;
  CudaKernel kernel;
};

struct LibNode {
  enum class Kind { None, Gemm, Conv, Sdpa, Direct } kind = Kind::None;
  std::string why_not;
  std::string describe;
  // Bytes of scratch the node uses while it runs (Note [Scratch per step] in
  // lower/memory_planner.cc): a GEMM's or attention's workspace, a convolution's workspace and
  // the values it sees in its own layout.
  int64_t scratch = 0;
  // Gemm
  std::shared_ptr<GemmPlan> gemm;
  GemmDesc gemm_desc;  // a cross-build's GEMM: no plan, the descriptor only
  int gemm_a = 0, gemm_b = 1, gemm_bias = -1;  // input indices
  // Conv (Note [CUDA convolution layouts])
  std::shared_ptr<ConvPlan> conv;
  ConvDesc conv_desc;  // a cross-build's convolution: no plan, the descriptor only
  int conv_residual = -1;  // input index of the residual (fused_conv2d), -1: none
  // Where cuDNN reads x and the residual and writes y: the node's own buffer (-1) or this
  // offset into the scratch region (the value is stored in the other layout).
  int64_t conv_x_at = -1, conv_r_at = -1, conv_y_at = -1;
  int64_t conv_ws_bytes = 0;  // the workspace region at the start of the scratch region
  std::vector<ConvKernel> conv_pre, conv_post;
  ValueId conv_w = kNoValue;  // the filter (Note [Filters stored KRSC in process])
  // Sdpa: cuDNN's fused attention
  std::shared_ptr<SdpaPlan> sdpa;
  // Direct kernels (and the conv bias kernel): a kernel of the library program, with its
  // arguments as (input index | output index) lists.
  std::string kernel_name;
  int64_t blocks = 0;
  int threads = 256;
  std::vector<int> arg_inputs;   // node input indices, first
  std::vector<int> arg_outputs;  // then node output indices
  bool reports = false;          // then the status record (Note [Device status])
  Executable::DeviceCheck check;
  CudaKernel kernel;
};

class CudaLibraryKernels final : public compiler::LibraryKernels {
 public:
  CudaLibraryKernels(const Graph& g, const std::vector<int32_t>& nodes, BuildFor build,
                     const std::vector<compiler::StridedOperand>& strided)
      : build_(std::move(build)) {
    // Views read in place (Note [CUDA attention reads views]), by node and input.
    strides_.assign(g.nodes.size(), {});
    for (const compiler::StridedOperand& s : strided) {
      std::vector<Dims>& per = strides_[size_t(s.node)];
      if (per.size() <= size_t(s.input)) per.resize(size_t(s.input) + 1);
      per[size_t(s.input)] = Dims(s.strides.begin(), s.strides.end());
    }
    // Note [CUDA convolution layouts]: plan with the layouts chosen; a convolution that cuDNN
    // cannot run channels-last is planned again in NCHW, with every value next to it.
    std::vector<bool> excluded(g.nodes.size(), false);
    std::string source;
    for (;;) {
      choose_layouts(g, nodes, excluded);
      prepare_convs(g, nodes);
      nodes_.assign(g.nodes.size(), LibNode{});
      source.clear();
      int32_t failed = -1;
      for (int32_t i : nodes) {
        LibNode& ln = nodes_[size_t(i)];
        const Node& n = g.nodes[size_t(i)];
        try {
          plan(g, n, i, ln, source);
        } catch (const Error& e) {
          if (e.kind() != ErrorKind::NotSupported && e.kind() != ErrorKind::InvalidArgument) throw;
          ln = LibNode{};  // nothing of a half-made plan (a kernel name without its source) stays
          ln.kind = LibNode::Kind::None;
          ln.why_not = e.message();
          if (nhwc_conv_[size_t(i)]) failed = i;
        }
        if (failed >= 0) break;
        if (ln.gemm) ln.scratch = std::max(ln.scratch, int64_t(ln.gemm->workspace_bytes()));
        if (ln.sdpa) ln.scratch = std::max(ln.scratch, int64_t(ln.sdpa->workspace_bytes()));
        if (build_.cross && ln.kind == LibNode::Kind::Gemm)
          ln.scratch = std::max(ln.scratch, kCrossWorkspaceBytes);
      }
      if (failed < 0) break;
      excluded[size_t(failed)] = true;
    }
    choose_stored_filters(g);
    timer_.release();  // the timing buffers are not needed past lowering
    if (!source.empty()) {
      CudaCompileRequest req = direct_program(
          source, (g.name.empty() ? std::string("graph") : g.name) + "_lib", build_.arch);
      program_ = compile_cuda(req);
      program_name_ = req.program_name;
      arch_ = req.arch;
      if (!build_.cross) {  // a cross-build loads nothing (Note [CUDA cross-builds])
        module_ = CudaModule::load(program_->cubin, kDevice, req.program_name);
        for (LibNode& ln : nodes_) {
          if (!ln.kernel_name.empty()) ln.kernel = module_->kernel(ln.kernel_name);
          for (auto* list : {&ln.conv_pre, &ln.conv_post})
            for (ConvKernel& k : *list) k.kernel = module_->kernel(k.name);
        }
      }
    }
  }

  bool lowered(int32_t node) const override {
    return size_t(node) < nodes_.size() && nodes_[size_t(node)].kind != LibNode::Kind::None;
  }
  int64_t value_bytes(ValueId) const override { return -1; }
  std::string store_constant(ValueId v, const Tensor& placed, Tensor* stored) const override;
  int64_t scratch_bytes(int32_t node) const override {
    return lowered(node) ? round_up_256(nodes_[size_t(node)].scratch) : 0;
  }
  std::string describe(int32_t node) const override { return nodes_[size_t(node)].describe; }
  std::string why_not(int32_t node) const override {
    return size_t(node) < nodes_.size() ? nodes_[size_t(node)].why_not : "";
  }
  std::vector<Executable::DeviceCheck> device_checks() const override {
    std::vector<Executable::DeviceCheck> out;
    for (const LibNode& ln : nodes_)
      if (ln.reports) out.push_back(ln.check);
    return out;
  }
  Executable::Launch bind(int32_t node, const std::vector<MemRef>& inputs,
                          const std::vector<MemRef>& outputs, MemRef scratch,
                          MemRef status) const override {
    const LibNode& ln = nodes_[size_t(node)];
    if (ln.reports && status.slot < 0)
      fail_kind(ErrorKind::Internal, "cuda: node {} reports bad indices but has no status record", node);
    auto at = [](const std::vector<MemRef>& v, int i) { return i >= 0 && size_t(i) < v.size() ? v[size_t(i)] : MemRef{}; };
    // The direct kernel's (or the bias kernel's) arguments: inputs, outputs, then the status.
    CudaKernelSpec spec;
    if (!ln.kernel_name.empty()) {
      spec.module = program_name_;
      spec.kernel = ln.kernel_name;
      spec.grid = unsigned(ln.blocks);
      spec.block = unsigned(ln.threads);
      spec.programmatic = build_.programmatic();
      for (int i : ln.arg_inputs) spec.args.push_back(at(inputs, i));
      for (int o : ln.arg_outputs) spec.args.push_back(at(outputs, o));
      if (ln.reports) spec.args.push_back(status);
    }
    const int64_t ws = scratch_bytes(node);
    switch (ln.kind) {
      case LibNode::Kind::Gemm: {
        CublasltBuffers b{at(inputs, ln.gemm_a), at(inputs, ln.gemm_b), at(inputs, ln.gemm_bias),
                          at(outputs, 0), scratch, ws};
        return make_cublaslt_launch(ln.gemm ? ln.gemm->desc() : ln.gemm_desc, ln.gemm, b);
      }
      case LibNode::Kind::Conv: {
        const ConvDesc& d = ln.conv ? ln.conv->desc() : ln.conv_desc;
        auto scratch_at = [&](int64_t off) { return MemRef{scratch.slot, scratch.byte_offset + off}; };
        auto arg = [&](const KernelArg& k) {
          switch (k.of) {
            case KernelArg::Of::Input: return at(inputs, k.index);
            case KernelArg::Of::Output: return at(outputs, k.index);
            case KernelArg::Of::Scratch: return scratch_at(k.offset);
          }
          return MemRef{};
        };
        CudnnConvBuffers b;
        b.x = ln.conv_x_at >= 0 ? scratch_at(ln.conv_x_at) : at(inputs, 0);
        b.w = at(inputs, 1);
        b.bias = at(inputs, 2);  // slot -1 when the node has none
        b.y = ln.conv_y_at >= 0 ? scratch_at(ln.conv_y_at) : at(outputs, 0);
        if (ln.conv_residual >= 0)
          b.residual = ln.conv_r_at >= 0 ? scratch_at(ln.conv_r_at) : at(inputs, ln.conv_residual);
        b.workspace = scratch;
        b.workspace_bytes = ln.conv_ws_bytes;
        CudnnConvKernels k;
        for (auto [from, to, loaded] : {std::tuple{&ln.conv_pre, &k.pre, &k.pre_loaded},
                                        std::tuple{&ln.conv_post, &k.post, &k.post_loaded}})
          for (const ConvKernel& ck : *from) {
            CudaKernelSpec cs;
            cs.module = program_name_;
            cs.kernel = ck.name;
            cs.grid = unsigned(ck.blocks);
            cs.block = unsigned(ck.threads);
            for (const KernelArg& a : ck.args) cs.args.push_back(arg(a));
            to->push_back(std::move(cs));
            if (module_) loaded->push_back(&ck.kernel);
          }
        // Channels-last convolutions read their filter KRSC: stored so (Note [Filters stored
        // KRSC in process]) or as a copy each execution context is made with.
        const bool nhwc = d.layout == ConvLayout::NHWC;
        const bool stored = nhwc && ln.conv_w != kNoValue &&
                            size_t(ln.conv_w) < krsc_stored_.size() && krsc_stored_[size_t(ln.conv_w)];
        return make_cudnn_conv_launch(d, ln.conv, b, k, nhwc, stored);
      }
      case LibNode::Kind::Sdpa: {
        CudnnSdpaBuffers b{at(inputs, 0), at(inputs, 1), at(inputs, 2), at(outputs, 0), scratch, ws};
        if (ln.sdpa->desc().mask) b.mask = at(inputs, 3);
        return make_cudnn_sdpa_launch(ln.sdpa, b);
      }
      case LibNode::Kind::Direct: return make_cuda_kernel_launch(ln.kernel, std::move(spec));
      case LibNode::Kind::None: break;
    }
    fail_kind(ErrorKind::Internal, "cuda: node {} was not lowered to a library kernel", node);
  }
  std::vector<Executable::DeviceModule> device_modules() const override {
    if (!program_) return {};
    // The cubin as the kernel cache's entry holds it (an aliasing pointer: no copy).
    return {{program_name_, arch_, std::shared_ptr<const std::string>(program_, &program_->cubin),
             std::shared_ptr<const std::string>(program_, &program_->ptx)}};
  }

 private:
  void plan(const Graph& g, const Node& n, int32_t index, LibNode& ln, std::string& source);
  void plan_gemm(const Graph& g, const Node& n, LibNode& ln);
  void plan_conv(const Graph& g, const Node& n, int32_t index, LibNode& ln, std::string& source);
  void choose_layouts(const Graph& g, const std::vector<int32_t>& nodes,
                      const std::vector<bool>& excluded);
  void plan_direct(const Graph& g, const Node& n, int32_t index, LibNode& ln, std::string& source);
  std::string plan_sdpa(const Graph& g, const Node& n, int32_t index, LibNode& ln);
  std::string sdpa_mask(const Graph& g, const Node& n, int32_t index, SdpaDesc* d) const;
  void choose_stored_filters(const Graph& g);
  // A convolution node's descriptor and its cuDNN tries, as plan_conv plans it.
  struct ConvSetup {
    ConvDesc d;
    DType dt = DType::Float32;
    bool nhwc = false, bias = false, residual = false, relu = false;
    Dims x, y;
    // The most the engines fuse first (bias, residual and relu; then the bias alone; then
    // nothing); empty in a cross-build.
    std::vector<ConvDesc> tries;
  };
  ConvSetup conv_setup(const Graph& g, const Node& n, int32_t index) const;
  // Whether convolution node `n` goes to cuDNN (plan_conv) rather than a direct kernel: Note
  // [CUDA small-channel convolutions] keeps image stems direct (NCHW) unless the knob
  // stem_conv=cudnn asks for cuDNN, and float64 takes the direct convolution kernel.
  bool cudnn_conv(const Graph& g, const Node& n, int32_t index) const {
    if (build_.small_conv && !nhwc_conv_[size_t(index)] && small_channel_conv(g, n)) return false;
    return library_dtype(g.type(n.inputs[0]).dtype);
  }
  void prepare_convs(const Graph& g, const std::vector<int32_t>& nodes);

  std::vector<LibNode> nodes_;
  std::vector<std::vector<Dims>> strides_;  // by node, by input: element strides of a view read in place
  std::vector<bool> nhwc_conv_;   // by node: computes channels-last
  std::vector<bool> nhwc_value_;  // by value: stored channels-last
  // Note [Filters stored KRSC in process]: by value, the filter shape of a constant only
  // channels-last convolutions read (k == 0: none), and whether store_constant stored it KRSC.
  std::vector<KrscFilter> krsc_filter_;
  mutable std::vector<bool> krsc_stored_;
  std::shared_ptr<const CompiledCubin> program_;
  BuildFor build_;
  std::string program_name_, arch_;
  std::shared_ptr<CudaModule> module_;
  LibraryTimer timer_;  // kernels=timed
  // Note [One plan per descriptor]: building a cuDNN plan finalizes its engine, which for a
  // runtime-fusion engine compiles kernels (tens of ms each). The convolutions and attentions of
  // one descriptor (ResNet-50: 53 convolutions of 23; ViT-B/16: 12 attentions of one) share one
  // plan, tuned once under kernels=timed; each launch still has its own buffers and replay.
  // Failed tries are kept too (their reason), so a fused try that cuDNN refused is not retried.
  struct CachedPlan {
    std::string key;
    std::shared_ptr<ConvPlan> conv;
    std::shared_ptr<SdpaPlan> sdpa;
    std::string why, tuned;
    bool tried_tuning = false;
  };
  std::vector<CachedPlan> plans_;
  // The entry for `key`; the first time, `make` fills its plan (or its reason) and only then is
  // it kept (a `make` that throws leaves nothing behind).
  template <class Make>
  CachedPlan& cached_plan(std::string key, Make make) {
    if (!library_plans_shared()) key += " #" + std::to_string(plans_.size());  // never equal
    if (CachedPlan* c = find_plan(key)) return *c;
    CachedPlan c;
    c.key = std::move(key);
    make(c);
    plans_.push_back(std::move(c));
    return plans_.back();
  }
  CachedPlan* find_plan(const std::string& key) {
    for (CachedPlan& c : plans_)
      if (c.key == key) return &c;
    return nullptr;
  }
  static std::string conv_plan_key(const ConvDesc& d) { return "conv " + cudnn_desc_key(d); }
  CachedPlan& cached_conv(const ConvDesc& d) {
    return cached_plan(conv_plan_key(d),
                       [&](CachedPlan& c) { c.conv = ConvPlan::try_create(d, &c.why); });
  }
};

namespace {
// f(0) .. f(count - 1) on up to `max_threads` threads (the caller's among them); f catches its
// own errors.
template <class F>
void on_threads(size_t count, int max_threads, const F& f) {
  const size_t threads = std::min(count, size_t(std::max(max_threads, 1)));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < count;) f(i);
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}
}  // namespace

// Note [Convolution plans prepared in parallel]
// Building a convolution's cuDNN plan finalizes its first engine, and a runtime-fusion engine
// compiles its kernels then, on the CPU (40-700 ms each; more on a machine whose driver JIT
// cache is empty). max-autotune also finalizes every other candidate, to time them: resnet50
// f32 with TF32 took 42-46 s to compile in max-autotune on the H100's 16-core host with empty
// caches, nearly all of it on one thread, against #13's 30 s. So before the nodes are planned,
// the distinct convolutions' plans are built on several threads (cuDNN takes concurrent calls
// with one handle per device, as a package's load does: Note [cuDNN plans built beside each
// other]), in every build, and under kernels=timed their candidates are then finalized the same
// way. The tries follow plan_conv's order level by level: a node's second try (the bias alone)
// is built only where its first (bias, residual and relu) has no engine, and so on, so no plan
// is built that the serial order would not build. The entries go into plans_ as cached_plan
// would make them; plan_conv finds them and, under kernels=timed, times the engines one
// convolution at a time on the device as before, so the choices are made the same way; only
// the CPU work moved. A plan whose engine the tuning store holds is not expanded (tune_conv
// restores its engine by tag). An error here is not reported: the entry is left out, and
// plan_conv meets the same error where it reports it. The knob plan_threads=1 builds them one
// at a time, as plan_conv meets them.
//
// Measured (H100, 16 cores, each compile with an empty Kiln cache and an empty driver JIT
// cache, alternating; docs/benchmarks.md, fortieth session): resnet50 f32 TF32 max-autotune
// 42.2 / 46.1 s serial against 32.7 / 33.3 s with the candidates finalized on 16 threads (the
// first plans still built serially then), resnet50 bf16 37.2 against 20.4 s.
void CudaLibraryKernels::prepare_convs(const Graph& g, const std::vector<int32_t>& nodes) {
  if (build_.cross || !library_plans_shared() || build_.plan_threads <= 1) return;
  std::vector<std::vector<ConvDesc>> node_tries;  // plan_conv's nodes (plan()'s dispatch)
  for (int32_t i : nodes) {
    const Node& n = g.nodes[size_t(i)];
    if (n.op != OpId::Conv2d && n.op != OpId::ConvTranspose2d && n.op != OpId::FusedConv2d)
      continue;
    bool all_concrete = true;  // plan() refuses the rest
    for (ValueId o : n.outputs) all_concrete = all_concrete && concrete(g.type(o));
    if (!all_concrete || !cudnn_conv(g, n, i)) continue;
    try {
      node_tries.push_back(conv_setup(g, n, i).tries);
    } catch (const Error&) {
    }
  }
  // Level by level: each node's next try, where every earlier try is known to have no engine.
  size_t levels = 0;
  for (const auto& tries : node_tries) levels = std::max(levels, tries.size());
  for (size_t level = 0; level < levels; ++level) {
    std::vector<CachedPlan> made;
    std::vector<ConvDesc> descs;
    for (const auto& tries : node_tries) {
      if (level >= tries.size()) continue;
      bool earlier_failed = true;
      for (size_t t = 0; t < level && earlier_failed; ++t) {
        const CachedPlan* c = find_plan(conv_plan_key(tries[t]));
        earlier_failed = c && !c->conv;
      }
      if (!earlier_failed) continue;
      const std::string key = conv_plan_key(tries[level]);
      if (find_plan(key)) continue;
      bool dup = false;
      for (const CachedPlan& c : made) dup = dup || c.key == key;
      if (dup) continue;
      made.push_back(CachedPlan{key, nullptr, nullptr, "", "", false});
      descs.push_back(tries[level]);
    }
    std::vector<char> ok(made.size(), 0);
    on_threads(made.size(), build_.plan_threads, [&](size_t i) {
      try {
        made[i].conv = ConvPlan::try_create(descs[i], &made[i].why);
        ok[i] = 1;
      } catch (...) {
      }
    });
    for (size_t i = 0; i < made.size(); ++i)
      if (ok[i]) plans_.push_back(std::move(made[i]));
  }
  if (!build_.timed) return;
  // The plan each node will use (its first try that has one), expanded unless its engine is
  // stored.
  std::vector<std::shared_ptr<ConvPlan>> expand;
  for (const auto& tries : node_tries)
    for (const ConvDesc& d : tries) {
      const CachedPlan* c = find_plan(conv_plan_key(d));
      if (!c || !c->conv) continue;
      std::string stored;
      if (!c->tried_tuning && std::find(expand.begin(), expand.end(), c->conv) == expand.end() &&
          !tuning_get(conv_tuning_key(c->conv->desc()), &stored))
        expand.push_back(c->conv);
      break;
    }
  on_threads(expand.size(), build_.plan_threads, [&](size_t i) {
    try {
      (void)expand[i]->candidates();
    } catch (...) {
    }
  });
}

void CudaLibraryKernels::plan(const Graph& g, const Node& n, int32_t index, LibNode& ln,
                              std::string& source) {
  for (ValueId o : n.outputs)
    if (!concrete(g.type(o))) fail_kind(ErrorKind::NotSupported, "symbolic shapes");
  switch (n.op) {
    case OpId::Matmul: case OpId::Linear:
      // cuBLASLt where it takes the dtype and shape, else the direct GEMM kernel (float64,
      // integers, partially broadcast batch dims, K = 0, empty outputs).
      if (gemm_needs_direct_kernel(g, n).empty()) plan_gemm(g, n, ln);
      else plan_direct(g, n, index, ln, source);
      break;
    case OpId::Conv2d: case OpId::ConvTranspose2d: case OpId::FusedConv2d:
      if (cudnn_conv(g, n, index)) plan_conv(g, n, index, ln, source);
      else plan_direct(g, n, index, ln, source);
      break;
    case OpId::AdaptiveAvgPool2d:
      // Global pooling is a generated reduction (it fuses with its neighbours).
      if (const Ints& os = n.attrs.get_ints("output_size"); os.size() == 2 && os[0] == 1 && os[1] == 1)
        fail_kind(ErrorKind::NotSupported, "global average pooling is generated code");
      plan_direct(g, n, index, ln, source);
      break;
    case OpId::ScaledDotProductAttention: {
      // cuDNN's fused attention where it takes the node, else the flash-style direct kernel.
      std::string why = plan_sdpa(g, n, index, ln);
      if (!why.empty()) {
        plan_direct(g, n, index, ln, source);
        ln.describe += " [not cuDNN: " + why + "]";
      }
      break;
    }
    default: plan_direct(g, n, index, ln, source); break;
  }
}

// Note [CUDA attention]
// scaled_dot_product_attention runs as cuDNN's fused flash attention where all of these hold,
// else as the direct flash-style kernel (Note [CUDA flash attention] in direct_kernels.cc):
//   - float16 or bfloat16 (cuDNN has no fused float32 engine);
//   - no mask input (none, or is_causal): a fully masked row is NaN in Kiln's semantics, and
//     cuDNN's kernels guard the row maximum (sdpa_fully_masked_row_is_nan), so a mask that may
//     mask a whole row goes to the direct kernel, which follows the reference; a causal row
//     always attends its first key;
//   - q, k and v with the same batch dims (no broadcasting), read as [B, H, S, D] (the last
//     batch dim is H, the others multiply into B);
//   - compiled on the GPU (a cross-build has no cuDNN to ask: the direct kernel, which computes
//     the same function on every GPU);
//   - cuDNN offers an engine (head dims multiples of 8 and at most 256, sm_80 and later);
//   - the knob attention is auto (direct: the direct kernels only; simt: the SIMT kernel only,
//     for tests and for bisecting a tensor-core result).
// The direct kernel runs on the tensor cores in float16/bfloat16 where Note [CUDA tensor-core
// attention] allows (sm_80 and later, head dims multiples of 16 and 8 up to 128): BERT's
// padded attention, cross-builds. Returns "" when ln is planned as cuDNN attention, else why
// not.
//
// Note [CUDA attention reads views]
// Attention reads q, k and v in place where they are views whose feature dim is contiguous
// (CudaTarget::library_reads_strided; byte offset and every other stride multiples of 16, the
// alignment cuDNN is promised): the split of a packed QKV projection (a slice: Split decomposes
// into slices on this target) seen through the [B, S, H, D] -> [B, H, S, D] transpose is such a
// view, so MultiheadAttention's projection output feeds attention with no split kernel and no
// copies (vit_b_16: 48 launches a call fewer). cuDNN gets the strides as its tensors' strides
// ([B, H, S, D] order; batch dims before H must merge into one stride, else the direct kernel
// runs), the direct flash kernel uses them as its row and batch strides. The package records
// them (`q_stride`, `k_stride`, `v_stride`; format version 5).
// Note [guarded attention masks] (passes/attention_mask_guard.h): an explicit mask goes to cuDNN
// where no row it masks whole can come out as anything but NaN: the guard's output (a row masked
// whole reads NaN, whatever the inputs), or a constant with no such row. Its shape must be the
// scores' [..., L, S] with the heads dim 1 or H and the batch dims all 1 or all q's (one cuDNN
// tensor [B|1, H|1, L, S]), read contiguous. Fills d's mask fields; returns why not, else "".
std::string CudaLibraryKernels::sdpa_mask(const Graph& g, const Node& n, int32_t index,
                                          SdpaDesc* d) const {
  const ValueId mv = n.inputs[3];
  const TensorType& mt = g.type(mv);
  if (mt.dtype == DType::Bool) return "a boolean mask (cuDNN takes the additive form)";
  if (const Tensor t = const_data_f64(g, mv); t.defined()) {
    const int64_t cols = t.dim() ? t.size(t.dim() - 1) : 1;
    const double* p = t.data<double>();
    for (int64_t r = 0; cols > 0 && r < t.numel() / cols; ++r) {
      bool whole = true;
      for (int64_t j = 0; j < cols && whole; ++j) whole = p[r * cols + j] == -INFINITY;
      if (whole) return "a constant mask that masks a row whole (it must come out NaN)";
    }
  } else if (!guarded_attention_mask(g, mv)) {
    return "an explicit mask not guarded for rows masked whole (they must come out NaN; "
           "passes/attention_mask_guard.h)";
  }
  const Dims q = dims_of(g.type(n.inputs[0])), k = dims_of(g.type(n.inputs[1]));
  const Dims md = dims_of(mt);
  const size_t r = q.size();
  if (md.size() != r || md[r - 2] != q[r - 2] || md[r - 1] != k[r - 2])
    return "a mask that is not [..., L, S] of the scores' rank";
  const int64_t heads = r >= 3 ? q[r - 3] : 1, mh = r >= 3 ? md[r - 3] : 1;
  if (mh != 1 && mh != heads) return "a mask whose heads dim is neither 1 nor the heads";
  bool all_one = true, all_q = true;
  for (size_t i = 0; i + 3 < r; ++i) {
    all_one = all_one && md[i] == 1;
    all_q = all_q && md[i] == q[i];
  }
  if (!all_one && !all_q) return "a mask whose batch dims are neither all 1 nor q's";
  const std::vector<Dims>& per = strides_[size_t(index)];
  if (per.size() > 3 && !per[3].empty()) return "a mask read as a strided view";
  d->mask = true;
  d->mask_heads = mh;
  d->mask_batch = 1;
  if (!all_one)
    for (size_t i = 0; i + 3 < r; ++i) d->mask_batch *= md[i];
  return "";
}

std::string CudaLibraryKernels::plan_sdpa(const Graph& g, const Node& n, int32_t index, LibNode& ln) {
  if (build_.cross) return "a cross-build (no cuDNN to ask)";
  if (build_.attention != "auto") return "knob attention=" + build_.attention;
  DType dt = g.type(n.outputs[0]).dtype;
  if (dt != DType::Float16 && dt != DType::BFloat16)
    return fmt::format("{} (cuDNN fuses float16 and bfloat16)", dtype_name(dt));
  Dims q = dims_of(g.type(n.inputs[0])), k = dims_of(g.type(n.inputs[1]));
  Dims v = dims_of(g.type(n.inputs[2]));
  if (q.size() != k.size() || q.size() != v.size() ||
      !std::equal(q.begin(), q.end() - 2, k.begin()) || !std::equal(q.begin(), q.end() - 2, v.begin()))
    return "batch dims that broadcast";
  SdpaDesc d;
  if (n.inputs.size() > 3 && n.inputs[3] != kNoValue) {
    std::string why = sdpa_mask(g, n, index, &d);
    if (!why.empty()) return why;
  }
  d.dtype = dt;
  d.device = kDevice;
  const size_t r = q.size();
  d.heads = r >= 3 ? q[r - 3] : 1;
  d.batch = 1;
  for (size_t i = 0; i + 3 < r; ++i) d.batch *= q[i];
  d.seq_q = q[r - 2];
  d.head_dim = q[r - 1];
  d.seq_kv = k[r - 2];
  d.head_dim_v = v[r - 1];
  if (d.batch * d.heads * d.seq_q * d.seq_kv * d.head_dim * d.head_dim_v == 0) return "an empty tensor";
  d.scale = n.attrs.has("scale") ? n.attrs.get_float("scale") : 1.0 / std::sqrt(double(d.head_dim));
  if (!(d.scale > 0)) return "a scale that is not positive";
  d.causal = n.attrs.get_bool("is_causal");
  // Views read in place: their strides in [B, H, S, D] order.
  auto bhsd = [&](int input, const Dims& dims, std::array<int64_t, 4>* out) {
    const std::vector<Dims>& per = strides_[size_t(index)];
    if (size_t(input) >= per.size() || per[size_t(input)].empty()) return true;  // contiguous
    const Dims& st = per[size_t(input)];
    const size_t rank = dims.size();
    const int64_t s_st = st[rank - 2];
    const int64_t h_st = rank >= 3 ? st[rank - 3] : s_st * dims[rank - 2];
    int64_t b_st = rank >= 4 ? st[rank - 4] : rank == 3 ? h_st * dims[0] : s_st * dims[0];
    int64_t inner = -1, inner_size = 1;  // the batch dims (those > 1) as one stride
    for (size_t i = rank >= 3 ? rank - 3 : 0; i-- > 0;) {
      if (dims[i] == 1) continue;
      if (inner >= 0 && st[i] != inner * inner_size) return false;
      if (inner < 0) b_st = st[i];
      inner = st[i];
      inner_size = dims[i];
    }
    *out = {b_st, h_st, s_st, st[rank - 1]};
    return true;
  };
  if (!bhsd(0, q, &d.q_stride) || !bhsd(1, k, &d.k_stride) || !bhsd(2, v, &d.v_stride))
    return "a view whose batch dims do not merge into one stride";
  // Note [attention writes heads last]: the output stored [B, S, H, D], written through its
  // strides in [B, H, S, D] order.
  if (n.attrs.get_bool("heads_last"))
    d.o_stride = {d.seq_q * d.heads * d.head_dim_v, d.head_dim_v, d.heads * d.head_dim_v, 1};
  // One plan per descriptor (Note [One plan per descriptor]).
  const CachedPlan& cached = cached_plan("sdpa " + cudnn_desc_key(d), [&](CachedPlan& c) {
    try {
      c.sdpa = SdpaPlan::try_create(d, &c.why);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::NotSupported && e.kind() != ErrorKind::InvalidArgument) throw;
      c.why = e.message();
    }
  });
  if (!cached.sdpa) return cached.why;
  ln.sdpa = cached.sdpa;
  ln.kind = LibNode::Kind::Sdpa;
  ln.describe = ::kiln::cuda::describe(d) + " cuDNN fused flash attention, engine " +
                ln.sdpa->engine().tag + (n.attrs.get_bool("heads_last") ? ", output written heads-last" : "");
  return "";
}

void CudaLibraryKernels::plan_gemm(const Graph& g, const Node& n, LibNode& ln) {
  const TensorType& at = g.type(n.inputs[0]);
  const TensorType& bt = g.type(n.inputs[1]);
  DType dt = at.dtype;
  if (!library_dtype(dt) || bt.dtype != dt)
    fail_kind(ErrorKind::NotSupported, "cuBLASLt takes float32, float16 or bfloat16, not {}", dtype_name(dt));
  GemmDesc d;
  d.dtype = dt;
  d.device = kDevice;
  d.allow_tf32 = build_.tf32 && dt == DType::Float32;
  Dims a = dims_of(at), b = dims_of(bt), out = dims_of(g.type(n.outputs[0]));
  if (n.op == OpId::Linear) {
    int64_t k = a.back();
    d.k = k;
    d.n = b[0];
    d.m = numel(a) / std::max<int64_t>(k, 1);
    d.trans_b = true;  // weight [N, K]
    if (n.inputs.size() > 2 && n.inputs[2] != kNoValue) {
      d.epilogue = GemmEpilogue::Bias;
      ln.gemm_bias = 2;
      if (g.type(n.inputs[2]).dtype != dt) fail_kind(ErrorKind::NotSupported, "bias dtype");
    }
  } else {
    // 1-D operands are promoted: a [K] -> [1, K], b [K] -> [K, 1].
    if (a.size() == 1) a = Dims{1, a[0]};
    if (b.size() == 1) b = Dims{b[0], 1};
    d.m = a[a.size() - 2];
    d.k = a[a.size() - 1];
    d.n = b[b.size() - 1];
    int64_t ab = numel(a) / std::max<int64_t>(d.m * d.k, 1);
    int64_t bb = numel(b) / std::max<int64_t>(d.k * d.n, 1);
    int64_t ob = std::max(ab, bb);
    if (d.m * d.k == 0 || d.k * d.n == 0) ob = numel(out) / std::max<int64_t>(d.m * d.n, 1);
    // Only uniform batches: an operand either has the output's whole batch (then its batch dims
    // equal the output's) or is one matrix broadcast over it (stride 0).
    if ((ab != ob && ab != 1) || (bb != ob && bb != 1))
      fail_kind(ErrorKind::NotSupported, "batch dims that broadcast partially");
    d.batch = ob;
    d.stride_a = ab == 1 ? 0 : d.m * d.k;
    d.stride_b = bb == 1 ? 0 : d.k * d.n;
    d.stride_d = d.m * d.n;
  }
  if (d.m == 0 || d.n == 0) fail_kind(ErrorKind::NotSupported, "an empty output");
  if (d.k == 0) fail_kind(ErrorKind::NotSupported, "K = 0 (the output is the bias or zeros)");
  ln.kind = LibNode::Kind::Gemm;
  if (build_.cross) {  // Note [CUDA cross-builds]: the loader asks cuBLASLt
    ln.gemm_desc = d;
    ln.describe = fmt::format("gemm {} {}x{}x{} batch {}{} (cuBLASLt algorithm chosen at load)",
                              dtype_name(dt), d.m, d.n, d.k, d.batch,
                              d.epilogue == GemmEpilogue::Bias ? " epilogue bias" : "");
    return;
  }
  ln.gemm = GemmPlan::create(d);
  ln.describe = ln.gemm->describe();
  if (build_.timed) ln.describe += tune_gemm(*ln.gemm, timer_);
}

// Note [CUDA convolution layouts]
// cuDNN's tensor-core convolutions compute channels-last: given NCHW half-precision tensors,
// its engines transpose around the convolution, or run slower kernels. So, for float16 and
// bfloat16 (knob conv=auto, the default; conv=nchw keeps everything NCHW):
//   - a convolution computes NHWC (filter KRSC) when its channels per group are multiples of 8
//     (tensor-core tiles), its filter is a weight (a KRSC copy is made once per execution
//     context's weights: CudnnConvBuffers::w_krsc) and the build is on the GPU (a cross-build
//     cannot ask cuDNN: NCHW);
//   - a value is stored NHWC when its producer and all its readers are such convolutions (as x,
//     or as a fused_conv2d's residual) and it is not a graph output: between convolutions
//     nothing else sees it (no generated kernel, view or output reads it), so the rest of the
//     compiler keeps treating every value as plain NCHW;
//   - where a channels-last convolution meets an NCHW value (the first convolution after a
//     pool, the last before the head), a transpose kernel moves it through the scratch region
//     before (x, residual) or after (y) the convolution, in the same launch.
// fused_conv2d stays whole on this target where cuDNN can run its epilogue (Target::keeps_whole:
// relu or none, a residual at scale 1): the graph tried first is conv + bias + residual + relu,
// then conv + bias, then the bare convolution, and an epilogue kernel after the convolution
// does what the engine did not fuse (always so in a cross-build). If cuDNN cannot run a
// convolution channels-last at all, it and the values next to it are planned again in NCHW.
// ResNet-50 in bfloat16: all but the stem convolution compute NHWC, two values are transposed.
// The knob conv_epilogue=kernel skips the fused graphs (the epilogue kernel always runs), so that
// tests reach that path on a GPU whose engines fuse everything.
// `precision`: the compile's (autotune_candidates sees the graph before autocast: a float32
// convolution of a bfloat16 compile is computed in bfloat16). `tf32`: float32 convolutions run
// on tensor cores too (Note [CUDA TF32]), so they compute channels-last like half precision,
// with channels per group a multiple of 4 (16 bytes, as 8 half-precision channels are).
bool nhwc_candidate(const Graph& g, const Node& n, DType precision, bool tf32) {
  if (n.op != OpId::Conv2d && n.op != OpId::FusedConv2d) return false;
  const TensorType& xt = g.type(n.inputs[0]);
  const TensorType& wt = g.type(n.inputs[1]);
  const DType dt = xt.dtype == DType::Float32 ? precision : xt.dtype;
  const bool half = dt == DType::Float16 || dt == DType::BFloat16;
  if (!half && !(tf32 && dt == DType::Float32)) return false;
  if (xt.shape.size() != 4 || wt.shape.size() != 4 || !concrete(xt) || !concrete(wt)) return false;
  ValueKind wk = g.value(n.inputs[1]).kind;
  if (wk != ValueKind::Param && wk != ValueKind::Const) return false;
  const int64_t groups = n.attrs.get_int("groups");
  const int64_t c_in = xt.shape[1].value(), c_out = wt.shape[0].value();
  const int64_t lanes = 16 / dtype_size(dt);
  return groups > 0 && (c_in / groups) % lanes == 0 && (c_out / groups) % lanes == 0;
}

void CudaLibraryKernels::choose_layouts(const Graph& g, const std::vector<int32_t>& nodes,
                                        const std::vector<bool>& excluded) {
  nhwc_conv_.assign(g.nodes.size(), false);
  nhwc_value_.assign(g.values.size(), false);
  if (build_.cross || !build_.conv_nhwc) return;
  for (int32_t i : nodes)
    nhwc_conv_[size_t(i)] =
        !excluded[size_t(i)] && nhwc_candidate(g, g.nodes[size_t(i)], DType::Float32, build_.tf32);
  // Whether every use of each value is as x or residual of a channels-last convolution.
  std::vector<bool> used(g.values.size(), false), only_convs(g.values.size(), true);
  for (size_t j = 0; j < g.nodes.size(); ++j) {
    const Node& n = g.nodes[j];
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      ValueId v = n.inputs[k];
      if (v == kNoValue) continue;
      used[size_t(v)] = true;
      bool as_conv = nhwc_conv_[j] && (k == 0 || (k == 3 && n.op == OpId::FusedConv2d));
      if (!as_conv) only_convs[size_t(v)] = false;
    }
  }
  for (ValueId v : g.outputs) only_convs[size_t(v)] = false;
  for (int32_t i : nodes) {
    if (!nhwc_conv_[size_t(i)]) continue;
    ValueId y = g.nodes[size_t(i)].outputs[0];
    nhwc_value_[size_t(y)] = used[size_t(y)] && only_convs[size_t(y)];
  }
}

// Note [Filters stored KRSC in process]
// A channels-last convolution reads its filter KRSC. A package's load stores such filters KRSC
// (Note [Filters stored KRSC at load] in runtime/launch_cuda.cc); an in-process executable did not,
// and each execution context was made with a KRSC copy beside the KCRS constant (ResNet-50's 3x3
// filters: 21.6 MiB in bfloat16, 43.2 in float32, measured on an H100). Now the compile stores them
// KRSC too: choose_stored_filters picks the weights whose every reader is a channels-last cuDNN
// convolution reading them as its filter (no loop, eager or direct kernel, no graph output, not 1x1
// or depthwise, whose two layouts are the same bytes), and assign_memory puts store_constant's
// permuted tensor in the constant's slot (Executable::ConstantSpec::layout "krsc"). The graph's
// KCRS tensor goes with the compile's copy of the graph; where it is the caller's own (a float32
// compile that folds nothing), the caller keeps it, as before, and the permuted tensor takes the
// place of the per-context copy. The launch's record still says w_krsc (the filter as the model has
// it is KCRS): a package written from the executable permutes these constants back
// (runtime/package.cc), so its bytes do not change.
void CudaLibraryKernels::choose_stored_filters(const Graph& g) {
  krsc_filter_.assign(g.values.size(), KrscFilter{});
  krsc_stored_.assign(g.values.size(), false);
  if (!build_.store_filters) return;
  std::vector<bool> other_use(g.values.size(), false);
  for (ValueId o : g.outputs) other_use[size_t(o)] = true;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const LibNode* ln = i < nodes_.size() ? &nodes_[i] : nullptr;
    const bool nhwc_conv = ln && ln->kind == LibNode::Kind::Conv && ln->conv &&
                           ln->conv->desc().layout == ConvLayout::NHWC;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const ValueId v = n.inputs[k];
      if (v == kNoValue) continue;
      if (!(nhwc_conv && k == 1)) {
        other_use[size_t(v)] = true;
        continue;
      }
      const KrscFilter f = krsc_filter_of(ln->conv->desc());
      KrscFilter& seen = krsc_filter_[size_t(v)];
      if (seen.k != 0 && !(seen == f)) other_use[size_t(v)] = true;  // two readings: keep it
      seen = f;
    }
  }
  for (size_t v = 0; v < g.values.size(); ++v) {
    const Value& val = g.values[v];
    KrscFilter& f = krsc_filter_[v];
    const bool weight = val.kind == ValueKind::Param || val.kind == ValueKind::Const;
    if (f.k == 0) continue;
    if (!weight || other_use[v] || f.identity() || !val.data.defined() ||
        int64_t(val.data.nbytes()) != f.bytes())
      f = KrscFilter{};
  }
}

std::string CudaLibraryKernels::store_constant(ValueId v, const Tensor& placed,
                                               Tensor* stored) const {
  if (size_t(v) >= krsc_filter_.size() || krsc_filter_[size_t(v)].k == 0) return "";
  const KrscFilter& f = krsc_filter_[size_t(v)];
  if (!placed.device().is_cuda() || !placed.is_contiguous() || int64_t(placed.nbytes()) != f.bytes())
    return "";
  const size_t bytes = size_t(f.bytes());
  std::vector<char> kcrs(bytes), krsc(bytes);
  cuda_memcpy(kcrs.data(), placed.raw_data(), bytes, CopyKind::DeviceToHost);
  f.permute(kcrs.data(), krsc.data());
  Tensor t = Tensor::empty(placed.sizes(), placed.dtype(), placed.device());
  cuda_memcpy(t.raw_data(), krsc.data(), bytes, CopyKind::HostToDevice);
  *stored = std::move(t);
  krsc_stored_[size_t(v)] = true;
  return "krsc";
}

CudaLibraryKernels::ConvSetup CudaLibraryKernels::conv_setup(const Graph& g, const Node& n,
                                                              int32_t index) const {
  ConvSetup c;
  const TensorType& xt = g.type(n.inputs[0]);
  const TensorType& wt = g.type(n.inputs[1]);
  const DType dt = c.dt = xt.dtype;
  if (!library_dtype(dt) || wt.dtype != dt)
    fail_kind(ErrorKind::NotSupported, "cuDNN convolutions here take float32, float16 or bfloat16");
  const bool transposed = n.op == OpId::ConvTranspose2d;
  const bool fused = n.op == OpId::FusedConv2d;
  c.x = dims_of(xt);
  c.y = dims_of(g.type(n.outputs[0]));
  const Dims& x = c.x;
  const Dims w = dims_of(wt);
  const bool nhwc = c.nhwc = nhwc_conv_[size_t(index)];
  ConvDesc& d = c.d;
  d.kind = transposed ? ConvKind::Transpose : ConvKind::Forward;
  d.dtype = dt;
  d.allow_tf32 = build_.tf32 && dt == DType::Float32;
  d.layout = nhwc ? ConvLayout::NHWC : ConvLayout::NCHW;
  d.device = kDevice;
  d.n = x[0];
  d.c_in = x[1];
  d.h = x[2];
  d.w = x[3];
  d.groups = n.attrs.get_int("groups");
  d.c_out = transposed ? w[1] * d.groups : w[0];
  d.kh = w[2];
  d.kw = w[3];
  const Ints& s = n.attrs.get_ints("stride");
  const Ints& p = n.attrs.get_ints("padding");
  const Ints& dl = n.attrs.get_ints("dilation");
  for (int i = 0; i < 2; ++i) {
    d.stride[size_t(i)] = s[size_t(i)];
    d.dilation[size_t(i)] = dl[size_t(i)];
    d.pad_pre[size_t(i)] = p[size_t(i)];
    d.pad_post[size_t(i)] = p.size() == 4 ? p[size_t(i + 2)] : p[size_t(i)];
  }
  if (transposed) {
    const Ints& op = n.attrs.get_ints("output_padding");
    d.output_padding = {op[0], op[1]};
  }
  c.bias = n.inputs.size() > 2 && n.inputs[2] != kNoValue;
  c.residual = fused && n.inputs.size() > 3 && n.inputs[3] != kNoValue;
  if (fused) {
    const std::string& act = n.attrs.get_string("activation");
    if ((act != "none" && act != "relu") || (c.residual && n.attrs.get_float("sum_scale") != 1.0))
      fail_kind(ErrorKind::Internal, "cuda: fused_conv2d '{}' with an epilogue cuDNN cannot run "
                "was kept whole", n.name);
    c.relu = act == "relu";
  }
  if (!build_.cross) {
    // The most the engines fuse: bias, residual and relu; then the bias alone; then nothing.
    ConvDesc t = d;
    t.bias = c.bias;
    t.residual = c.residual;
    t.relu = c.relu;
    if ((c.residual || c.relu) && build_.conv_fuse) c.tries.push_back(t);
    t.residual = t.relu = false;
    if (c.bias && build_.conv_fuse) c.tries.push_back(t);
    c.tries.push_back(d);
  }
  return c;
}

void CudaLibraryKernels::plan_conv(const Graph& g, const Node& n, int32_t index, LibNode& ln,
                                   std::string& source) {
  const ConvSetup setup = conv_setup(g, n, index);
  const DType dt = setup.dt;
  const bool nhwc = setup.nhwc;
  const bool bias = setup.bias, residual = setup.residual, relu = setup.relu;
  const Dims& x = setup.x;
  const Dims& y = setup.y;
  ConvDesc d = setup.d;
  if (residual) ln.conv_residual = 3;
  if (build_.cross) {  // Note [CUDA cross-builds]: the loader asks cuDNN; the epilogue as a kernel
    std::array<int64_t, 4> od = conv_output_dims(d);
    if (od != std::array<int64_t, 4>{y[0], y[1], y[2], y[3]})
      fail_kind(ErrorKind::Internal, "cuDNN's output shape disagrees with Kiln's inference");
    ln.conv_desc = d;
  }
  std::string tuned;
  if (!build_.cross) {
    const std::vector<ConvDesc>& tries = setup.tries;
    CachedPlan* cached = nullptr;
    for (size_t i = 0; i + 1 < tries.size() && !ln.conv; ++i) {
      cached = &cached_conv(tries[i]);
      ln.conv = cached->conv;
    }
    if (!ln.conv) {
      cached = &cached_conv(tries.back());
      if (!cached->conv) cached->conv = ConvPlan::create(tries.back());  // throws, saying why
      ln.conv = cached->conv;
    }
    if (build_.timed) {
      if (!cached->tried_tuning) cached->tuned = tune_conv(*ln.conv, timer_);
      cached->tried_tuning = true;
      tuned = cached->tuned;
    } else if (ln.conv->workspace_bytes() > size_t(kCrossWorkspaceBytes)) {
      // Note [Default engines within the cross-build workspace]
      const size_t want = ln.conv->workspace_bytes();
      for (const ConvEngine& e : ln.conv->candidates())
        if (e.workspace_bytes <= size_t(kCrossWorkspaceBytes)) {
          ln.conv->select(e.index);
          ln.conv->keep();
          tuned = fmt::format(" (the heuristic's first engine wants {:.1f} MiB of workspace: the "
                              "first within {} MiB)", double(want) / (1 << 20),
                              kCrossWorkspaceBytes >> 20);
          break;
        }
    }
    d = ln.conv->desc();
    if (ln.conv->output_dims() != std::array<int64_t, 4>{y[0], y[1], y[2], y[3]})
      fail_kind(ErrorKind::Internal, "cuDNN's output shape disagrees with Kiln's inference");
  }
  ln.kind = LibNode::Kind::Conv;
  ln.conv_w = n.inputs[1];
  const bool bias_left = bias && !d.bias, residual_left = residual && !d.residual;
  const bool relu_left = relu && !d.relu;

  // The scratch region: the workspace, then the values this convolution sees in its own layout.
  auto up = round_up_256;
  ln.conv_ws_bytes = up(build_.cross ? kCrossWorkspaceBytes : int64_t(ln.conv->workspace_bytes()));
  int64_t end = ln.conv_ws_bytes;
  const int64_t es = dtype_size(dt);
  const bool x_moved = nhwc != nhwc_value_[size_t(n.inputs[0])];
  const bool r_moved = residual && nhwc != nhwc_value_[size_t(n.inputs[3])];
  const bool y_moved = nhwc != nhwc_value_[size_t(n.outputs[0])];
  if (x_moved) { ln.conv_x_at = end; end += up(numel(x) * es); }
  if (r_moved) { ln.conv_r_at = end; end += up(numel(y) * es); }
  if (y_moved) { ln.conv_y_at = end; end += up(numel(y) * es); }
  ln.scratch = end;

  using Of = KernelArg::Of;
  auto blocks_for = [&](int64_t total) {  // a grid-stride loop, at most 16 blocks per SM
    return std::max<int64_t>(1, std::min<int64_t>((total + 255) / 256, int64_t(build_.sms) * 16));
  };
  const char* storage = cuda_storage(dt);
  // A layout change of a [n, c, h, w] value: NCHW -> NHWC (to_nhwc) or back.
  auto transpose = [&](const std::string& name, const Dims& dims, bool to_nhwc, KernelArg from,
                       KernelArg to, const char* what) {
    const int64_t total = numel(dims), c = dims[1], h = dims[2], wd = dims[3];
    ConvKernel k;
    k.name = name;
    k.blocks = blocks_for(total);
    k.args = {from, to};
    // i walks the destination; the source index follows from its coordinates.
    std::string src_index;
    // NCHW -> NHWC: i = ((n*H*W) + hw)*C + ch; src = ((n*C + ch)*H*W + hw).
    if (to_nhwc)
      src_index = fmt::format("(i / {0}LL) * {0}LL + (i % {1}LL) * {2}LL + (i % {0}LL) / {1}LL",
                              h * wd * c, c, h * wd);
    else  // NHWC -> NCHW: i = ((n*C + ch)*H*W + hw); src = (n*H*W + hw)*C + ch.
      src_index = fmt::format("(i / {0}LL) * {0}LL + (i % {1}LL) * {2}LL + (i % {0}LL) / {1}LL",
                              c * h * wd, h * wd, c);
    source += fmt::format(
        "// kiln-kernel: {0}\n// {1} of {2} '{3}', {4}\nextern \"C\" __global__ void {0}(char* src_, char* dst_) {{\n{8}"
        "  const {5}* src = (const {5}*)src_; {5}* dst = ({5}*)dst_;\n"
        "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < {6}LL; i += (long long)gridDim.x * blockDim.x)\n"
        "    dst[i] = src[{7}];\n}}\n\n",
        k.name, what, op_def(n.op).name, n.name, to_nhwc ? "NCHW -> NHWC" : "NHWC -> NCHW",
        storage, total, src_index, kGridWait);
    return k;
  };
  if (x_moved)
    ln.conv_pre.push_back(transpose(fmt::format("kn_conv_x_{}", index), x, nhwc,
                                    {Of::Input, 0, 0}, {Of::Scratch, 0, ln.conv_x_at}, "x"));
  if (r_moved)
    ln.conv_pre.push_back(transpose(fmt::format("kn_conv_res_{}", index), y, nhwc,
                                    {Of::Input, 3, 0}, {Of::Scratch, 0, ln.conv_r_at}, "the residual"));
  if (bias_left || residual_left || relu_left) {
    // The epilogue no engine fused, on y as the convolution wrote it (its layout, d.layout).
    const int64_t total = numel(y), plane = y[2] * y[3], c = y[1];
    ConvKernel k;
    k.name = fmt::format("kn_conv_epilogue_{}", index);
    k.blocks = blocks_for(total);
    KernelArg yarg = y_moved ? KernelArg{Of::Scratch, 0, ln.conv_y_at} : KernelArg{Of::Output, 0, 0};
    KernelArg rarg = r_moved ? KernelArg{Of::Scratch, 0, ln.conv_r_at} : KernelArg{Of::Input, 3, 0};
    k.args = {yarg};
    std::string params = "char* y_", loads = fmt::format("  {0}* y = ({0}*)y_;\n", storage);
    std::string expr = to_float(dt, "y[i]");
    const std::string ch = nhwc ? fmt::format("i % {}LL", c) : fmt::format("(i / {}LL) % {}LL", plane, c);
    if (bias_left) {
      k.args.push_back({Of::Input, 2, 0});
      params += ", char* bias_";
      loads += fmt::format("  const {0}* bias = (const {0}*)bias_;\n", storage);
      expr += " + " + to_float(dt, "bias[" + ch + "]");
    }
    if (residual_left) {
      k.args.push_back(rarg);
      params += ", char* res_";
      loads += fmt::format("  const {0}* res = (const {0}*)res_;\n", storage);
    }
    // Rounded as the engines and the decomposition round: the sum with the bias in float, then
    // stored; the residual added to the stored value, then stored; relu on that.
    std::string body = fmt::format("    {} v = {};\n", storage, from_float(dt, expr));
    if (residual_left)
      body += fmt::format("    v = {};\n", from_float(dt, to_float(dt, "v") + " + " + to_float(dt, "res[i]")));
    if (relu_left)
      body += fmt::format("    {{ float f = {}; v = (f > 0.0f || f != f) ? v : {}; }}\n",
                          to_float(dt, "v"), from_float(dt, "0.0f"));
    source += fmt::format(
        "// kiln-kernel: {0}\n// the epilogue of {1} '{2}'\nextern \"C\" __global__ void {0}({3}) {{\n{7}{4}"
        "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < {5}LL; i += (long long)gridDim.x * blockDim.x) {{\n"
        "{6}    y[i] = v;\n  }}\n}}\n\n",
        k.name, op_def(n.op).name, n.name, params, loads, total, body, kGridWait);
    ln.conv_post.push_back(std::move(k));
  }
  if (y_moved)
    ln.conv_post.push_back(transpose(fmt::format("kn_conv_y_{}", index), y, !nhwc,
                                     {Of::Scratch, 0, ln.conv_y_at}, {Of::Output, 0, 0}, "y"));
  std::string left;
  if (bias_left) left += "+bias";
  if (residual_left) left += "+residual";
  if (relu_left) left += "+relu";
  ln.describe = ::kiln::cuda::describe(d) + " engine " +
                (ln.conv ? ln.conv->engine().tag : std::string("chosen at load")) +
                tuned + (left.empty() ? "" : " + epilogue kernel (" + left + ")") +
                (x_moved ? " [x NCHW->NHWC]" : "") + (r_moved ? " [residual NCHW->NHWC]" : "") +
                (y_moved ? " [y NHWC->NCHW]" : "");
}

void CudaLibraryKernels::plan_direct(const Graph& g, const Node& n, int32_t index, LibNode& ln,
                                     std::string& source) {
  DirectKernel k = plan_direct_kernel(g, n, index, int64_t(build_.sms) * 16, strides_[size_t(index)],
                                      build_.compute_capability());
  ln.kernel_name = k.name;
  ln.blocks = k.blocks;
  ln.threads = k.threads;
  ln.arg_inputs = k.arg_inputs;
  ln.arg_outputs = k.arg_outputs;
  ln.reports = k.reports;
  ln.check = {int64_t(index) + 1, k.check_prefix, k.check_suffix};
  ln.describe = k.describe;
  ln.kind = LibNode::Kind::Direct;
  source += k.source;
}

// ---- the target ---------------------------------------------------------------------------------

class CudaTarget final : public compiler::Target {
 public:
  const char* name() const override { return "cuda"; }
  Device device() const override { return Device::cuda(kDevice); }
  const char* library_name() const override { return "cuBLASLt/cuDNN"; }
  const compiler::OpSupportTable& support() const override { return cuda_support(); }

  std::vector<OpId> decompositions() const override {
    // Split becomes slices (Note [split as slices] in ops/shape.cc): views that loop kernels
    // and attention read in place (Note [CUDA attention reads views]).
    return {OpId::BatchNorm, OpId::GroupNorm, OpId::FusedConv2d, OpId::FusedLinear, OpId::Split};
  }

  // A convolution whose windows tile its input (ViT's patch embedding) as one GEMM
  // (passes/patch_conv.h): cuDNN's 3-channel NCHW kernel for it is ~10x the GEMM's time. Linears
  // of one input as one GEMM (passes/merge_linears.h): BERT's q, k, v. Attention written out as
  // matmul, scale, mask and softmax (ONNX exports) as one node (passes/fuse_attention.h).
  // Attention writes its output heads-last where the model transposes it so
  // (passes/attention_heads_last.h): no copy kernel before the output projection.
  std::vector<std::string> graph_passes() const override {
    return {"patch-conv-to-linear", "merge-sibling-linears", "fuse-attention", "attention-heads-last"};
  }
  // Attention masks computed at run time read NaN on the rows they mask whole, in the dtype
  // attention reads (passes/attention_mask_guard.h): cuDNN's fused attention takes them.
  std::vector<std::string> precision_graph_passes() const override {
    return {"attention-mask-guard"};
  }

  // Note [CUDA convolution layouts]: fused_conv2d with an epilogue cuDNN's graphs express.
  bool keeps_whole(const Graph& g, const Node& n) const override {
    if (n.op != OpId::FusedConv2d || !library_dtype(g.type(n.inputs[0]).dtype)) return false;
    const std::string& act = n.attrs.get_string("activation");
    if (act != "none" && act != "relu") return false;
    bool residual = n.inputs.size() > 3 && n.inputs[3] != kNoValue;
    return !residual || n.attrs.get_float("sum_scale") == 1.0;
  }

  bool generates(const Graph& g, const Node& n) const override {
    if (!cuda_support()[size_t(n.op)].generated || !lower::loop_expressible(g, n)) return false;
    DType od = g.type(n.outputs[0]).dtype;
    const OpDef& d = op_def(n.op);
    // Integer div / pow report a zero divisor or a negative exponent (Note [Device status]).
    if (d.has(trait::Pointwise)) return true;
    if (d.has(trait::RowNorm)) return is_floating(od);
    if (n.op == OpId::Sum || n.op == OpId::Prod || n.op == OpId::Max || n.op == OpId::Min)
      return true;  // integer and bool inputs accumulate in int64
    return is_floating(od);
  }


  // A float32 linear of at most kSmallLinearMacs multiply-adds is a generated block-per-row
  // reduction (one block per output row, warp shuffles), fused with its neighbours: a cuBLASLt
  // call for mlp's 10->50 layer costs more than the arithmetic (knob gemv=cublaslt: never). So
  // is a float16 / bfloat16 linear of one input row up to kSmallHalfGemvMacs (resnet50's and
  // ViT's classifier, BERT's pooler: a GEMV, whose bias and output cast then share its kernel).
  compiler::SchedulePolicy policy(const Knobs& knobs) const override {
    compiler::SchedulePolicy p;
    const bool never = knobs.get("gemv", "generated") == "cublaslt";
    p.small_linear_macs = never ? 0 : kSmallLinearMacs;
    p.small_half_gemv_macs = never ? 0 : kSmallHalfGemvMacs;
    return p;
  }

  // Note [CUDA attention reads views]: q, k, v of attention, feature dim contiguous, offset and
  // other strides 16-byte multiples (cuDNN's alignment), non-negative.
  bool library_reads_strided(const Graph& g, const Node& n, int k,
                             const lower::ViewGeometry& geo) const override {
    if (n.op != OpId::ScaledDotProductAttention || k > 2) return false;
    const size_t r = geo.sizes.size();
    if (r < 2 || geo.strides.size() != r || Dims(geo.sizes) != dims_of(g.type(n.inputs[size_t(k)])))
      return false;
    const DType dt = g.type(n.inputs[size_t(k)]).dtype;
    if (!is_floating(dt)) return false;
    const int64_t es = dtype_size(dt);
    Dims st = compiler::normalized_strides(geo);
    if (st[r - 1] != 1 || geo.offset < 0 || (geo.offset * es) % 16 != 0) return false;
    for (size_t i = 0; i + 1 < r; ++i)
      if (st[i] < 0 || (st[i] * es) % 16 != 0) return false;
    return true;
  }

  // Note [CUDA libraries opened ahead], for a compile: the libraries its input graph will
  // reach, judged before the passes. Convolutions of a library dtype open cuDNN, as does
  // half-precision attention, whole or as the softmax that a pass may fuse into it; linears and
  // matmuls open cuBLASLt with a first query in their dtype, except the float32 ones small
  // enough to be generated code (the schedule policy's small_linear_macs). Precision is the
  // compile's where the node is float32 (autocast converts it). Nothing for a cross-build, or
  // where there is no device.
  std::unique_ptr<Background> begin_compile(const Graph& g,
                                            const compiler::Options& o) const override {
    if (!o.arch.empty() || cuda_device_count() <= kDevice) return nullptr;
    bool dnn = false;
    std::vector<DType> gemm;
    for (const Node& n : g.nodes) {
      if (n.inputs.empty() || n.outputs.empty() || n.inputs[0] == kNoValue) continue;
      DType dt = g.type(n.inputs[0]).dtype;
      if (dt == DType::Float32) dt = o.precision;
      const bool half = dt == DType::Float16 || dt == DType::BFloat16;
      switch (n.op) {
        case OpId::Conv2d: case OpId::ConvTranspose2d: case OpId::FusedConv2d:
          dnn = dnn || library_dtype(dt);
          break;
        case OpId::ScaledDotProductAttention: case OpId::Softmax: dnn = dnn || half; break;
        case OpId::Linear: case OpId::Matmul: case OpId::FusedLinear: {
          if (!library_dtype(dt)) break;
          const TensorType& x = g.type(n.inputs[0]);
          const TensorType& y = g.type(n.outputs[0]);
          // Generated GEMVs (CudaTarget::policy) need no cuBLASLt.
          if (dt == DType::Float32 && concrete(x) && concrete(y) && x.rank() > 0 &&
              numel(dims_of(y)) * x.shape.back().value() <= kSmallLinearMacs)
            break;
          if (half && o.knobs.get("gemv", "generated") != "cublaslt" && half_gemv_after_autocast(g, n))
            break;
          if (std::find(gemm.begin(), gemm.end(), dt) == gemm.end()) gemm.push_back(dt);
          break;
        }
        default: break;
      }
    }
    if (!dnn && gemm.empty()) return nullptr;
    struct Warm final : Background {
      LibraryWarmUp libraries;
    };
    auto w = std::make_unique<Warm>();
    w->libraries.start(kDevice, dnn, std::move(gemm));
    return w;
  }

  std::unique_ptr<compiler::LibraryKernels> lower_library(const Graph& g,
                                                          const std::vector<int32_t>& nodes,
                                                          compiler::LibraryRequest request,
                                                          const Knobs& knobs) const override {
    BuildFor build = build_for(knobs);
    if (!build.cross) require_cuda_device(kDevice, "compiling for CUDA");
    return std::make_unique<CudaLibraryKernels>(g, nodes, std::move(build),
                                                request.strided_operands);
  }

  compiler::LoopBuild build_loops(const Graph& g, const lower::Schedule& s,
                                  const std::vector<MemRef>& mem, MemRef status,
                                  const compiler::Options& options, const Knobs& knobs) const override {
    CudaCodegenOptions co;
    co.inject_error_into = options.inject_error_into;
    co.status_slot = status.slot;
    co.vectorize = options.vectorize;
    BuildFor build = build_for(knobs);
    int64_t max_blocks = int64_t(build.sms) * 32;
    std::string name = g.name.empty() ? "graph" : g.name;
    CudaProgram prog = generate_cuda(g, s, mem, name, max_blocks, co);
    compiler::LoopBuild out;
    out.device_checks = std::move(prog.checks);
    if (s.loops.empty()) {
      out.cache_hit = true;
      return out;
    }
    CudaCompileRequest req;
    req.source = prog.source;
    req.program_name = name;
    req.arch = build.arch;
    std::shared_ptr<const CompiledCubin> cubin = compile_cuda(req);
    out.cache_hit = cubin->cache_hit;
    out.build_s = cubin->compile_seconds;
    std::shared_ptr<CudaModule> module;
    if (!build.cross) {  // a cross-build loads nothing (Note [CUDA cross-builds])
      module = CudaModule::load(cubin->cubin, kDevice, name);
      out.keep_alive = module;
    }
    out.device_modules.push_back({name, req.arch,
                                  std::shared_ptr<const std::string>(cubin, &cubin->cubin),
                                  std::shared_ptr<const std::string>(cubin, &cubin->ptx)});
    for (const CudaKernelInfo& k : prog.kernels) {
      CudaKernelSpec spec;
      spec.module = name;
      spec.kernel = k.name;
      spec.grid = unsigned(k.blocks);
      spec.block = unsigned(std::max(k.threads, 1));
      spec.programmatic = build.programmatic();
      for (int32_t slot : k.slots) spec.args.push_back(MemRef{slot, 0});
      Executable::Launch l =
          make_cuda_kernel_launch(module ? module->kernel(k.name) : CudaKernel{}, std::move(spec));
      l.kind = "loop";
      out.launches.push_back(std::move(l));
      out.vectorized.push_back(false);
    }
    return out;
  }

  std::shared_ptr<char> allocate(int64_t bytes) const override {
    return allocate_device_arena(bytes, kDevice);
  }
  Tensor place_constant(const Tensor& t) const override {
    Tensor c = t.contiguous();
    return c.device() == device() ? c : c.to(device());
  }

  // max-autotune on CUDA: the default configuration, then the library kernels timed
  // (Note [CUDA library kernels timed]), with each convolution layout policy where there are
  // half-precision convolutions (Note [CUDA convolution layouts]) and with the GEMV choice where
  // there are small linears. A cross-build has no GPU to time on: the default only.
  std::vector<Candidate> autotune_candidates(const Graph& g, const compiler::Options& o,
                                             std::string* note) const override {
    if (o.knobs.find("arch") || !o.arch.empty()) {
      *note = "; a cross-build cannot time library kernels: the default configuration";
      return {Candidate{}};
    }
    bool half_conv = false, small_linear = false, library = false;
    const bool tf32 = build_for(o.knobs).tf32;
    for (const Node& n : g.nodes) {
      half_conv = half_conv || nhwc_candidate(g, n, o.precision, tf32);
      // The graph is the caller's: its float32 nodes run in the compile's precision.
      const bool half = o.precision == DType::Float16 || o.precision == DType::BFloat16;
      small_linear = small_linear ||
                     (o.precision == DType::Float32 && lower::small_linear(g, n, kSmallLinearMacs)) ||
                     (half && half_gemv_after_autocast(g, n));
      library = library || n.op == OpId::Conv2d || n.op == OpId::FusedConv2d ||
                n.op == OpId::ConvTranspose2d || n.op == OpId::Linear || n.op == OpId::Matmul ||
                n.op == OpId::FusedLinear;
    }
    std::vector<Candidate> cands(1);  // the default
    for (const char* conv : {"auto", "nchw"}) {
      if (std::strcmp(conv, "nchw") == 0 && !half_conv) continue;
      for (const char* gemv : {"generated", "cublaslt"}) {
        if (std::strcmp(gemv, "cublaslt") == 0 && !small_linear) continue;
        Candidate c;
        c.exact = false;
        if (library) c.knobs.set("kernels", "timed");
        if (half_conv) c.knobs.set("conv", conv);
        if (small_linear) c.knobs.set("gemv", gemv);
        if (!c.knobs.items.empty()) cands.push_back(std::move(c));
      }
    }
    return cands;
  }
  Variants autotune_variants(const compiler::CompileReport&) const override { return {}; }
  std::string tune_launches(Executable&, const std::vector<compiler::TunableLaunch>&,
                            const TensorList&, int, std::string*) const override {
    return "";
  }
  bool apply_launch_record(const std::vector<compiler::TunableLaunch>&, const std::string&,
                           std::string*) const override {
    return false;
  }
  std::string tuning_context() const override {
    CudaDeviceInfo i = cuda_device_info(kDevice);
    return fmt::format("{} sm_{}{}\n{}", i.name, i.sm_major, i.sm_minor, cuda_driver_version());
  }
};

const CudaTarget g_cuda_target;
const bool g_registered = [] {
  compiler::register_target(&g_cuda_target);
  return true;
}();

}  // namespace

}  // namespace kiln::cuda
