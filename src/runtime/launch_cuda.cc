// CUDA launches from plain data. See launch_library.h.
//
// Note [CUDA launch records]
// The CUDA target makes its launches here, and a CUDA package's loader rebuilds them here from
// their records (Note [Launch records] in launch_library.cc), so a loaded package runs the same
// code over the same state as the compiled Executable:
//   cuda_kernel {"module", "kernel", "grid", "block", "shared", "args": [[slot, offset]...]
//           [, "programmatic": true]}:
//           kernel `kernel` of the executable's CUDA module `module` (a cubin NVRTC built; a
//           package's `kernels.cuda` section holds them), each argument a pointer into a slot.
//           Loop kernels take slot bases (their offsets are compiled in, and trusted as built,
//           like the CPU's shared object); direct kernels take their buffers, then the status
//           record (Note [Device status]). "programmatic" (present only when true): launched
//           so that it may start before the previous kernel ends (Note [CUDA programmatic
//           launch] in targets/cuda/target.cc); a runtime that ignores the key launches it
//           plainly, which computes the same.
//   cublaslt {"desc": GemmDesc, "algo": [8 x u64] | null, "algo_config" (format 5: what the
//           loader matches, Note [cuBLASLt algorithm identity]), "a", "b", "bias", "d", "workspace":
//           [slot, offset], "workspace_bytes"}: a cuBLASLt GEMM. The algorithm is cuBLASLt's
//           opaque cublasLtMatmulAlgo_t: the loader never hands recorded bytes to cuBLASLt. A
//           format-5 record's configuration is rebuilt from its text and checked by cuBLASLt
//           for this GEMM (Note [cuBLASLt plans from their configuration]); where that fails,
//           and for older records, the loader asks the heuristic for its choice (and then its
//           candidates) and takes the one with the same configuration (the same bytes for
//           older records), else refuses (another cuBLASLt or GPU would compute differently).
//           null (a cross-build made without a GPU): the heuristic's first choice within the
//           workspace.
//   cudnn_conv {"desc": ConvDesc, "engine": tag | null, "x", "w", "bias", "y", "residual",
//           "workspace", "workspace_bytes", "pre": [cuda_kernel params], "post": [...],
//           "w_krsc": bool}: a cuDNN graph plan between direct kernels (layout changes into and
//           out of the scratch region, the epilogue no engine fused); x, y and residual are
//           what cuDNN reads and writes; w_krsc: w holds KCRS, the plan reads a KRSC copy made
//           per context. The engine by cuDNN's tag (engine id and knobs), found among the plan's
//           candidates or refused as above; null: the first candidate whose workspace fits.
//           Format version 3's records (no residual, pre, post or w_krsc; a "bias_kernel" run
//           after the convolution) load as before.
//   cudnn_sdpa {"desc": SdpaDesc, "engine": tag, "q", "k", "v", "o", "workspace",
//           "workspace_bytes"[, "mask"]}: cuDNN's fused attention, the engine
//           found by its tag among the plan's candidates or refused as above. The descriptor's
//           q_stride / k_stride / v_stride ([B, H, S, D] element strides of views read in
//           place; all zero: contiguous) are new in format version 5; version-4 records have
//           none and read contiguous operands. o_stride (format version 9, present only when
//           not contiguous): the output written heads-last, [B, S, H, D] through its
//           [B, H, S, D] strides (Note [attention writes heads last]). "mask" (format
//           version 12, in the descriptor as [mask_batch, mask_heads] and as a buffer): an
//           additive mask, contiguous [mask_batch, mask_heads, Sq, Skv], guarded so that a row
//           masked whole reads NaN (Note [guarded attention masks] in
//           passes/attention_mask_guard.h).
// Buffers are checked against their slots' sizes (LaunchEnv::slot_bytes) from the descriptors,
// so an edited manifest cannot point a library call outside its memory.
#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "kernels/cuda/cublaslt_gemm.h"
#include "kernels/cuda/cuda_driver.h"
#include "kernels/cuda/cudnn_conv.h"
#include "kernels/cuda/cudnn_sdpa.h"
#include "kernels/cuda/graph_replay.h"
#include "kernels/json_numbers.h"
#include "runtime/launch_library.h"
#include "runtime/launch_records.h"

namespace kiln {

namespace {

using json = nlohmann::json;

using records::ref_from;
using records::ref_json;

char* ptr(char* const* slots, const MemRef& m) {
  return m.slot >= 0 ? slots[m.slot] + m.byte_offset : nullptr;
}

// Every buffer a CUDA launch names must be present (slot >= 0) and inside its slot.
void check_buffer(LaunchEnv& env, MemRef r, int64_t bytes, const std::string& where,
                  const char* what) {
  if (r.slot < 0) fail_kind(ErrorKind::ParseError, "{}: buffer '{}' has no slot", where, what);
  records::check_buffer(env, r, bytes, where, what);
}

// ---- plain kernels ------------------------------------------------------------------------------
struct KernelState {
  cuda::CudaKernel kernel;
  CudaKernelSpec spec;
};

void launch_kernel(const KernelState& k, const Executable::RunContext& c) {
  if (k.spec.grid == 0) return;
  void* argv[cuda::kMaxKernelPointerArgs];
  char* ptrs[cuda::kMaxKernelPointerArgs];
  const size_t n = k.spec.args.size();
  for (size_t i = 0; i < n; ++i) {
    ptrs[i] = ptr(c.slots, k.spec.args[i]);
    argv[i] = &ptrs[i];
  }
  cuda::LaunchConfig cfg;
  cfg.grid.x = k.spec.grid;
  cfg.block.x = k.spec.block;
  cfg.shared_bytes = k.spec.shared;
  cfg.stream = c.stream;
  cfg.programmatic = k.spec.programmatic;
  k.kernel.launch(cfg, argv);
}

void run_kernel(void* s, const Executable::RunContext& c) {
  launch_kernel(*static_cast<const KernelState*>(s), c);
}

// A kernel of a module that was built but not loaded (a cross-build).
void run_unloaded_kernel(void* s, const Executable::RunContext&) {
  fail_kind(ErrorKind::NotSupported, "cuda: kernel {} was compiled for a package only (a "
            "cross-build without a GPU): load the package on the GPU to run it",
            static_cast<const KernelState*>(s)->spec.kernel);
}

json kernel_json(const CudaKernelSpec& s) {
  json args = json::array();
  for (const MemRef& r : s.args) args.push_back(ref_json(r));
  json j = {{"module", s.module}, {"kernel", s.kernel}, {"grid", s.grid}, {"block", s.block},
            {"shared", s.shared}, {"args", args}};
  if (s.programmatic) j["programmatic"] = true;
  return j;
}

// ---- cuBLASLt -----------------------------------------------------------------------------------
struct GemmState {
  std::shared_ptr<const cuda::GemmPlan> plan;
  CublasltBuffers buf;
  std::string why;  // plan null: why it cannot run here
};

// Note [Library calls replayed as graphs] (kernels/cuda/graph_replay.cc): the libraries allocate
// on the host inside their enqueue calls (cublasLtMatmul for half-precision GEMMs,
// cudnnBackendExecute always), so each execution context replays its library calls as small
// CUDA graphs keyed on their pointers.
// One call of a plan (its launch's shared state, the call's arguments), enqueued on the stream
// GraphReplay gives: the context's, or the capture's.
template <typename State, typename Args>
struct PlanCall {
  const State* state;
  Args args;
};

template <typename Call>
void enqueue_plan(void* p, void* stream) {
  auto* call = static_cast<Call*>(p);
  call->args.stream = stream;
  call->state->plan->run(call->args);
}
using GemmCall = PlanCall<GemmState, cuda::GemmArgs>;

// A library launch's state in one execution context: the shared state and the call's replay.
template <typename State>
struct Replayed {
  explicit Replayed(const State* s) : state(s) {}
  const State* state;
  cuda::GraphReplay replay;
};

template <typename State>
Executable::LocalStateFn replayed_local(const State* s) {
  return [s](char* const*) -> std::shared_ptr<void> { return std::make_shared<Replayed<State>>(s); };
}

void run_gemm(void* s, const Executable::RunContext& c) {
  auto* local = static_cast<Replayed<GemmState>*>(s);
  const GemmState* g = local->state;
  if (!g->plan) [[unlikely]]
    fail_kind(ErrorKind::NotSupported, "{}", g->why);
  GemmCall call{g, {}};
  cuda::GemmArgs& a = call.args;
  a.a = ptr(c.slots, g->buf.a);
  a.b = ptr(c.slots, g->buf.b);
  a.d = ptr(c.slots, g->buf.d);
  a.bias = ptr(c.slots, g->buf.bias);
  a.workspace = g->buf.workspace_bytes ? ptr(c.slots, g->buf.workspace) : nullptr;
  a.workspace_bytes = size_t(g->buf.workspace_bytes);
  const void* key[] = {a.a, a.b, static_cast<const void*>(a.d), a.bias,
                       static_cast<const void*>(a.workspace)};
  local->replay.run(c.stream, key, 5, enqueue_plan<GemmCall>, &call);
}

json gemm_desc_json(const cuda::GemmDesc& d) {
  return {{"dtype", dtype_name(d.dtype)}, {"m", d.m}, {"n", d.n}, {"k", d.k},
          {"trans_a", d.trans_a}, {"trans_b", d.trans_b}, {"lda", d.lda}, {"ldb", d.ldb},
          {"ldc", d.ldc}, {"ldd", d.ldd}, {"batch", d.batch}, {"stride_a", d.stride_a},
          {"stride_b", d.stride_b}, {"stride_c", d.stride_c}, {"stride_d", d.stride_d},
          {"alpha", d.alpha}, {"beta", d.beta},
          {"epilogue", cuda::gemm_epilogue_name(d.epilogue)}, {"allow_tf32", d.allow_tf32},
          {"alignment_bytes", d.alignment_bytes}};
}

cuda::GemmDesc gemm_desc_from(const json& j) {
  cuda::GemmDesc d;
  d.dtype = records::dtype_from(j.at("dtype"), "desc");
  d.m = j.at("m").get<int64_t>();
  d.n = j.at("n").get<int64_t>();
  d.k = j.at("k").get<int64_t>();
  d.trans_a = j.at("trans_a").get<bool>();
  d.trans_b = j.at("trans_b").get<bool>();
  d.lda = j.at("lda").get<int64_t>();
  d.ldb = j.at("ldb").get<int64_t>();
  d.ldc = j.at("ldc").get<int64_t>();
  d.ldd = j.at("ldd").get<int64_t>();
  d.batch = j.at("batch").get<int64_t>();
  d.stride_a = j.at("stride_a").get<int64_t>();
  d.stride_b = j.at("stride_b").get<int64_t>();
  d.stride_c = j.at("stride_c").get<int64_t>();
  d.stride_d = j.at("stride_d").get<int64_t>();
  d.alpha = j.at("alpha").get<float>();
  d.beta = j.at("beta").get<float>();
  std::string ep = j.at("epilogue").get<std::string>();
  bool found = false;
  for (cuda::GemmEpilogue e : {cuda::GemmEpilogue::None, cuda::GemmEpilogue::Bias,
                               cuda::GemmEpilogue::Relu, cuda::GemmEpilogue::BiasRelu,
                               cuda::GemmEpilogue::Gelu, cuda::GemmEpilogue::BiasGelu})
    if (ep == cuda::gemm_epilogue_name(e)) {
      d.epilogue = e;
      found = true;
    }
  if (!found) throw std::out_of_range("unknown GEMM epilogue '" + ep + "'");
  d.allow_tf32 = j.at("allow_tf32").get<bool>();
  d.alignment_bytes = j.at("alignment_bytes").get<int>();
  constexpr int64_t kMax = int64_t(1) << 31;
  for (int64_t v : {d.m, d.n, d.k, d.batch})
    if (v < 1 || v > kMax) throw std::out_of_range("GEMM sizes must lie in [1, 2^31]");
  for (int64_t v : {d.lda, d.ldb, d.ldc, d.ldd})
    if (v < 0 || v > kMax) throw std::out_of_range("GEMM leading dimensions out of range");
  for (int64_t v : {d.stride_a, d.stride_b, d.stride_c, d.stride_d})
    if (v < -1 || v > (int64_t(1) << 40)) throw std::out_of_range("GEMM batch strides out of range");
  if (d.beta != 0.0f) throw std::out_of_range("GEMM records with beta != 0 are not written by Kiln");
  if (d.alignment_bytes < 1 || d.alignment_bytes > 256)
    throw std::out_of_range("GEMM alignment out of range");
  return d;
}

// a * b and a + b of the sizes a record implies, refused rather than overflowed (an edited record
// may hold any values in the ranges its parser accepts).
int64_t mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r))
    throw std::out_of_range("buffer sizes overflow");
  return r;
}
int64_t add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r))
    throw std::out_of_range("buffer sizes overflow");
  return r;
}
int64_t product(std::initializer_list<int64_t> factors) {
  int64_t r = 1;
  for (int64_t f : factors) r = mul(r, f);
  return r;
}

// Bytes spanned by a stored [rows, cols] matrix with row stride ld (0: cols) over a batch.
int64_t matrix_span(int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride,
                    DType t) {
  if (ld == 0) ld = cols;
  if (ld < cols) throw std::out_of_range("a leading dimension is smaller than its row");
  int64_t one = add(mul(rows - 1, ld), cols);
  if (stride == -1) stride = mul(rows, ld);
  return mul(add(mul(batch - 1, stride), one), dtype_size(t));
}

// Note [cuBLASLt bytes not recorded]
// A record with the algorithm's configuration (format 5 and later) writes its 8 opaque words as
// zeros: loaders match on the configuration (Note [cuBLASLt algorithm identity] in
// kernels/cuda/cublaslt_gemm.cc), and the bytes held 2 bytes of uninitialized memory from
// cuBLASLt (word 4 of resnet50 f32's classifier: 0001fc34XXXX0001, another XXXX in every
// process), so two compiles of one model wrote different packages (found on an H100, fortieth
// session). Every runtime that loads a format 5+ package matches on the configuration; the
// words stay (8 of them, not null) because null is what says "chosen at load" (a cross-build).
// An algorithm without a configuration text keeps its bytes, the only identity it has.
json algo_json(const cuda::GemmAlgo& a) {
  json v = json::array();
  for (uint64_t x : a.opaque) v.push_back(fmt::format("{:016x}", a.config.empty() ? x : 0));
  return v;
}

// ---- cuDNN convolutions -------------------------------------------------------------------------
struct ConvState {
  std::shared_ptr<const cuda::ConvPlan> plan;
  cuda::ConvDesc desc;
  CudnnConvBuffers buf;
  std::vector<KernelState> pre, post;
  bool w_krsc = false;
  bool w_stored_krsc = false;  // w holds KRSC already (Note [Filters stored KRSC at load])
  std::vector<int32_t> key_slots;  // every slot the call reads or writes, once
  std::string why;
  // w_krsc: the KRSC copies of the filters the contexts were made with, by source buffer.
  mutable std::mutex krsc_mu;
  mutable std::vector<std::pair<const void*, std::shared_ptr<char>>> krsc;

  const void* krsc_filter(const void* src) const;
};

// The filter as KRSC ([K][R][S][C]; dims [K, C, R, S] of the stored KCRS), copied once per
// source buffer: a context is made off the run path, and the weights of a loaded executable do
// not change (replacing them makes a new package, hence new launches).
const void* ConvState::krsc_filter(const void* src) const {
  const KrscFilter f = krsc_filter_of(desc);
  if (f.identity()) return src;
  std::lock_guard<std::mutex> lock(krsc_mu);
  for (const auto& [from, copy] : krsc)
    if (from == src) return copy.get();
  const size_t bytes = size_t(f.bytes());
  std::vector<char> kcrs(bytes), out(bytes);
  cuda_memcpy(kcrs.data(), src, bytes, CopyKind::DeviceToHost);
  f.permute(kcrs.data(), out.data());
  std::shared_ptr<char> copy = allocate_device_arena(int64_t(bytes), desc.device);
  cuda_memcpy(copy.get(), out.data(), bytes, CopyKind::HostToDevice);
  krsc.emplace_back(src, copy);
  return copy.get();
}

// One execution context's convolution: the shared state, its replay, the filter it reads.
struct ConvLocal {
  explicit ConvLocal(const ConvState* s) : state(s) {}
  const ConvState* state;
  cuda::GraphReplay replay;
  const void* w_krsc = nullptr;
};

// Replayed per context like the GEMMs above: the kernels before, the convolution and the
// kernels after, as one graph.
struct ConvCall {
  const ConvState* state;
  cuda::ConvArgs args;
  const Executable::RunContext* ctx;
};

void enqueue_conv(void* p, void* stream) {
  auto* call = static_cast<ConvCall*>(p);
  Executable::RunContext on = *call->ctx;
  on.stream = stream;
  for (const KernelState& k : call->state->pre) launch_kernel(k, on);
  call->args.stream = stream;
  call->state->plan->run(call->args);
  for (const KernelState& k : call->state->post) launch_kernel(k, on);
}

void run_conv(void* s, const Executable::RunContext& c) {
  auto* local = static_cast<ConvLocal*>(s);
  const ConvState* v = local->state;
  if (!v->plan) [[unlikely]]
    fail_kind(ErrorKind::NotSupported, "{}", v->why);
  ConvCall call{v, {}, &c};
  cuda::ConvArgs& a = call.args;
  const cuda::ConvDesc& d = v->plan->desc();
  a.x = ptr(c.slots, v->buf.x);
  a.w = local->w_krsc ? local->w_krsc : ptr(c.slots, v->buf.w);
  a.y = ptr(c.slots, v->buf.y);
  if (d.bias) a.bias = ptr(c.slots, v->buf.bias);
  if (d.residual) a.residual = ptr(c.slots, v->buf.residual);
  a.workspace = v->buf.workspace_bytes ? ptr(c.slots, v->buf.workspace) : nullptr;
  a.workspace_bytes = size_t(v->buf.workspace_bytes);
  // The key: the base of every slot the call (kernels included) reads or writes; offsets and the
  // context's own filter copy are fixed.
  const void* key[cuda::GraphReplay::kMaxKey];
  const int n = int(v->key_slots.size());
  if (n <= cuda::GraphReplay::kMaxKey)
    for (int i = 0; i < n; ++i) key[i] = c.slots[v->key_slots[size_t(i)]];
  local->replay.run(c.stream, key, n, enqueue_conv, &call);
}

json pair_json(const std::array<int64_t, 2>& p) { return json::array({p[0], p[1]}); }
std::array<int64_t, 2> pair_from(const json& j, int64_t lo) {
  auto v = j.get<std::vector<int64_t>>();
  if (v.size() != 2 || v[0] < lo || v[1] < lo || v[0] > 4096 || v[1] > 4096)
    throw std::out_of_range("a convolution pair is out of range");
  return {v[0], v[1]};
}

json conv_desc_json(const cuda::ConvDesc& d) {
  return {{"kind", d.kind == cuda::ConvKind::Forward ? "forward" : "transpose"},
          {"dtype", dtype_name(d.dtype)},
          {"layout", d.layout == cuda::ConvLayout::NCHW ? "nchw" : "nhwc"},
          {"n", d.n}, {"c_in", d.c_in}, {"h", d.h}, {"w", d.w}, {"c_out", d.c_out},
          {"kh", d.kh}, {"kw", d.kw}, {"groups", d.groups}, {"stride", pair_json(d.stride)},
          {"pad_pre", pair_json(d.pad_pre)}, {"pad_post", pair_json(d.pad_post)},
          {"dilation", pair_json(d.dilation)}, {"output_padding", pair_json(d.output_padding)},
          {"bias", d.bias}, {"residual", d.residual}, {"relu", d.relu},
          {"allow_tf32", d.allow_tf32}, {"alignment_bytes", d.alignment_bytes}};
}

cuda::ConvDesc conv_desc_from(const json& j) {
  cuda::ConvDesc d;
  std::string kind = j.at("kind").get<std::string>(), layout = j.at("layout").get<std::string>();
  if (kind != "forward" && kind != "transpose") throw std::out_of_range("unknown conv kind");
  if (layout != "nchw" && layout != "nhwc") throw std::out_of_range("unknown conv layout");
  d.kind = kind == "forward" ? cuda::ConvKind::Forward : cuda::ConvKind::Transpose;
  d.layout = layout == "nchw" ? cuda::ConvLayout::NCHW : cuda::ConvLayout::NHWC;
  d.dtype = records::dtype_from(j.at("dtype"), "desc");
  d.n = j.at("n").get<int64_t>();
  d.c_in = j.at("c_in").get<int64_t>();
  d.h = j.at("h").get<int64_t>();
  d.w = j.at("w").get<int64_t>();
  d.c_out = j.at("c_out").get<int64_t>();
  d.kh = j.at("kh").get<int64_t>();
  d.kw = j.at("kw").get<int64_t>();
  d.groups = j.at("groups").get<int64_t>();
  for (int64_t v : {d.n, d.c_in, d.h, d.w, d.c_out, d.kh, d.kw, d.groups})
    if (v < 1 || v > (int64_t(1) << 24)) throw std::out_of_range("convolution sizes out of range");
  d.stride = pair_from(j.at("stride"), 1);
  d.pad_pre = pair_from(j.at("pad_pre"), 0);
  d.pad_post = pair_from(j.at("pad_post"), 0);
  d.dilation = pair_from(j.at("dilation"), 1);
  d.output_padding = pair_from(j.at("output_padding"), 0);
  d.bias = j.at("bias").get<bool>();
  d.residual = j.at("residual").get<bool>();
  d.relu = j.at("relu").get<bool>();
  d.allow_tf32 = j.at("allow_tf32").get<bool>();
  d.alignment_bytes = j.at("alignment_bytes").get<int>();
  if (d.alignment_bytes < 1 || d.alignment_bytes > 256)
    throw std::out_of_range("convolution alignment out of range");
  return d;
}

// ---- cuDNN fused attention ----------------------------------------------------------------------
struct SdpaState {
  std::shared_ptr<const cuda::SdpaPlan> plan;
  CudnnSdpaBuffers buf;
};

using SdpaCall = PlanCall<SdpaState, cuda::SdpaArgs>;

void run_sdpa(void* s, const Executable::RunContext& c) {
  auto* local = static_cast<Replayed<SdpaState>*>(s);
  const SdpaState* v = local->state;
  SdpaCall call{v, {}};
  cuda::SdpaArgs& a = call.args;
  a.q = ptr(c.slots, v->buf.q);
  a.k = ptr(c.slots, v->buf.k);
  a.v = ptr(c.slots, v->buf.v);
  a.o = ptr(c.slots, v->buf.o);
  a.workspace = v->buf.workspace_bytes ? ptr(c.slots, v->buf.workspace) : nullptr;
  a.workspace_bytes = size_t(v->buf.workspace_bytes);
  a.mask = v->plan->desc().mask ? ptr(c.slots, v->buf.mask) : nullptr;
  const void* key[] = {a.q, a.k, a.v, static_cast<const void*>(a.o),
                       static_cast<const void*>(a.workspace), a.mask};
  local->replay.run(c.stream, key, 6, enqueue_plan<SdpaCall>, &call);
}

json sdpa_desc_json(const cuda::SdpaDesc& d) {
  json j = {{"dtype", dtype_name(d.dtype)}, {"batch", d.batch}, {"heads", d.heads},
            {"seq_q", d.seq_q}, {"seq_kv", d.seq_kv}, {"head_dim", d.head_dim},
            {"head_dim_v", d.head_dim_v ? d.head_dim_v : d.head_dim}, {"scale", d.scale},
            {"causal", d.causal}, {"alignment_bytes", d.alignment_bytes},
            {"q_stride", d.q_stride}, {"k_stride", d.k_stride}, {"v_stride", d.v_stride}};
  // Format 9 (kAttentionOutputFormatVersion): only where the output is not contiguous.
  if (d.o_stride != std::array<int64_t, 4>{}) j["o_stride"] = d.o_stride;
  // Format 12 (kAttentionMaskFormatVersion): only with a mask.
  if (d.mask) j["mask"] = {d.mask_batch, d.mask_heads};
  return j;
}

// A [B, H, S, D] stride record: absent (format 4) or all zero = contiguous; else the last is 1
// and the others non-negative (Note [CUDA attention reads views] in targets/cuda/target.cc).
std::array<int64_t, 4> sdpa_strides_from(const json& j, const char* key) {
  std::array<int64_t, 4> st{};
  if (!j.contains(key)) return st;
  st = j.at(key).get<std::array<int64_t, 4>>();
  if (st == std::array<int64_t, 4>{}) return st;
  if (st[3] != 1) throw std::out_of_range("attention feature stride must be 1");
  for (int64_t v : st)
    if (v < 0 || v > (int64_t(1) << 40)) throw std::out_of_range("attention strides out of range");
  return st;
}

cuda::SdpaDesc sdpa_desc_from(const json& j) {
  cuda::SdpaDesc d;
  d.dtype = records::dtype_from(j.at("dtype"), "desc");
  d.batch = j.at("batch").get<int64_t>();
  d.heads = j.at("heads").get<int64_t>();
  d.seq_q = j.at("seq_q").get<int64_t>();
  d.seq_kv = j.at("seq_kv").get<int64_t>();
  d.head_dim = j.at("head_dim").get<int64_t>();
  d.head_dim_v = j.at("head_dim_v").get<int64_t>();
  for (int64_t v : {d.batch, d.heads, d.seq_q, d.seq_kv, d.head_dim, d.head_dim_v})
    if (v < 1 || v > (int64_t(1) << 24)) throw std::out_of_range("attention sizes out of range");
  d.scale = j.at("scale").get<double>();
  if (!(d.scale > 0 && d.scale < 1e6)) throw std::out_of_range("attention scale out of range");
  d.causal = j.at("causal").get<bool>();
  d.alignment_bytes = j.at("alignment_bytes").get<int>();
  if (d.alignment_bytes < 1 || d.alignment_bytes > 256)
    throw std::out_of_range("attention alignment out of range");
  d.q_stride = sdpa_strides_from(j, "q_stride");
  d.k_stride = sdpa_strides_from(j, "k_stride");
  d.v_stride = sdpa_strides_from(j, "v_stride");
  d.o_stride = sdpa_strides_from(j, "o_stride");  // format 9
  if (j.contains("mask")) {  // format 12: [mask_batch, mask_heads]
    const auto mb = j.at("mask").get<std::array<int64_t, 2>>();
    if ((mb[0] != 1 && mb[0] != d.batch) || (mb[1] != 1 && mb[1] != d.heads))
      throw std::out_of_range("attention mask batch and heads must be 1 or the batch and heads");
    d.mask = true;
    d.mask_batch = mb[0];
    d.mask_heads = mb[1];
  }
  return d;
}

// ---- rebuilding ---------------------------------------------------------------------------------
void workspace_from(const json& p, MemRef* ref, int64_t* bytes) {
  *ref = ref_from(p.at("workspace"));
  *bytes = p.at("workspace_bytes").get<int64_t>();
  if (*bytes < 0 || *bytes > (int64_t(1) << 34)) throw std::out_of_range("workspace_bytes out of range");
}

// The record's kernel, checked (geometry, arguments inside their slots) without a GPU.
CudaKernelSpec parse_kernel(const json& p, LaunchEnv& env, const std::string& where) {
  CudaKernelSpec s;
  s.module = p.at("module").get<std::string>();
  s.kernel = p.at("kernel").get<std::string>();
  int64_t grid = p.at("grid").get<int64_t>(), block = p.at("block").get<int64_t>(),
          shared = p.at("shared").get<int64_t>();
  if (grid < 0 || grid > 0x7fffffff || block < 1 || block > 1024 || shared < 0 || shared > 48 * 1024)
    throw std::out_of_range("kernel geometry out of range (grid < 2^31, block 1..1024, shared "
                            "memory <= 48 KiB)");
  s.grid = unsigned(grid);
  s.block = unsigned(block);
  s.shared = unsigned(shared);
  if (auto it = p.find("programmatic"); it != p.end()) s.programmatic = it->get<bool>();
  for (const json& a : p.at("args")) {
    MemRef r = ref_from(a);
    check_buffer(env, r, 0, where, "kernel argument");
    s.args.push_back(r);
    if (s.args.size() > size_t(cuda::kMaxKernelPointerArgs))
      throw std::out_of_range("too many kernel arguments");
  }
  return s;
}

// The checked record's kernel in the package's loaded modules.
cuda::CudaKernel load_kernel(const CudaKernelSpec& s, LaunchEnv& env, const std::string& where) {
  if (!env.cuda_module)
    fail_kind(ErrorKind::ParseError, "{}: the package has no CUDA kernels section", where);
  std::shared_ptr<const cuda::CudaModule> m = env.cuda_module(s.module);
  if (!m)
    fail_kind(ErrorKind::ParseError, "{}: section 'kernels.cuda' has no module '{}'", where,
              s.module);
  if (!m->has_kernel(s.kernel))
    fail_kind(ErrorKind::ParseError, "{}: module '{}' of section 'kernels.cuda' has no kernel '{}'",
              where, s.module, s.kernel);
  return m->kernel(s.kernel);
}

Executable::Launch rebuild_cuda_kernel(const LaunchRecord& r, LaunchEnv& env,
                                       const std::string& where) {
  CudaKernelSpec spec = parse_kernel(kernels::parse_untrusted_json(r.params), env, where);
  cuda::CudaKernel k = load_kernel(spec, env, where);
  return make_cuda_kernel_launch(k, std::move(spec));
}

// A cublaslt record, checked without a GPU: the descriptor's ranges, every operand inside its
// slot, the recorded algorithm's form.
struct GemmRecord {
  cuda::GemmDesc desc;
  CublasltBuffers buf;
  bool has_algo = false;  // false: a cross-build's null
  uint64_t algo[8] = {};
  // The algorithm's configuration (Note [cuBLASLt algorithm identity] in cublaslt_gemm.cc);
  // empty in records before format version 5, which are matched by their bytes.
  std::string algo_config;
};

GemmRecord parse_cublaslt(const LaunchRecord& r, LaunchEnv& env, const std::string& where) {
  json p = kernels::parse_untrusted_json(r.params);
  GemmRecord g;
  cuda::GemmDesc& d = g.desc;
  d = gemm_desc_from(p.at("desc"));
  CublasltBuffers& b = g.buf;
  b.a = ref_from(p.at("a"));
  b.b = ref_from(p.at("b"));
  b.bias = ref_from(p.at("bias"));
  b.d = ref_from(p.at("d"));
  workspace_from(p, &b.workspace, &b.workspace_bytes);
  // Every operand inside its slot: A stored [M, K] (or [K, M]), B [K, N] (or [N, K]), D [M, N].
  check_buffer(env, b.a, matrix_span(d.trans_a ? d.k : d.m, d.trans_a ? d.m : d.k, d.lda,
                                     d.batch, d.stride_a, d.dtype), where, "A");
  check_buffer(env, b.b, matrix_span(d.trans_b ? d.n : d.k, d.trans_b ? d.k : d.n, d.ldb,
                                     d.batch, d.stride_b, d.dtype), where, "B");
  check_buffer(env, b.d, matrix_span(d.m, d.n, d.ldd, d.batch, d.stride_d, d.dtype), where, "D");
  if (cuda::gemm_epilogue_has_bias(d.epilogue))
    check_buffer(env, b.bias, mul(d.n, dtype_size(d.dtype)), where, "bias");
  else if (b.bias.slot >= 0)
    throw std::out_of_range("a bias buffer for an epilogue without a bias");
  if (b.workspace_bytes > 0) check_buffer(env, b.workspace, b.workspace_bytes, where, "workspace");
  const json& algo = p.at("algo");
  if (!algo.is_null()) {
    auto words = algo.get<std::vector<std::string>>();
    if (words.size() != 8) throw std::out_of_range("algo must be 8 hexadecimal words");
    for (size_t i = 0; i < 8; ++i) {
      const std::string& w = words[i];
      if (w.empty() || w.size() > 16 ||
          w.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
        throw std::out_of_range("algo must be 8 hexadecimal words of at most 16 digits");
      g.algo[i] = std::stoull(w, nullptr, 16);
    }
    g.has_algo = true;
    if (p.contains("algo_config")) {
      g.algo_config = p.at("algo_config").get<std::string>();
      if (g.algo_config.empty() || g.algo_config.size() > 256 ||
          g.algo_config.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789 -") != std::string::npos)
        throw std::out_of_range("algo_config must be the configuration's short text");
    }
  }
  return g;
}

// A library launch's slow part is its plan, built from its record alone: prebuild_plan runs
// `Parse` and `PlanFor` ahead of the launch loop on a worker thread (LaunchPrebuildFn), and a
// rebuild takes that plan, or builds it where there is none (prebuilt_or_new).
template <auto Parse, auto PlanFor>
std::shared_ptr<void> prebuild_plan(const LaunchRecord& r, const LaunchEnv& shared,
                                    const std::string& where) {
  LaunchEnv env = shared;  // the parsers take it mutable; a copy per thread
  return PlanFor(Parse(r, env, where), env, where);
}

template <auto PlanFor, class Record>
auto prebuilt_or_new(const Record& rec, const LaunchEnv& env, const std::string& where) {
  using Plan = typename decltype(PlanFor(rec, env, where))::element_type;
  std::shared_ptr<Plan> plan = std::static_pointer_cast<Plan>(env.prebuilt);
  return plan ? plan : PlanFor(rec, env, where);
}

// The record's GEMM plan with its algorithm set (a heuristic query, and more when the recorded
// algorithm is not the heuristic's first: most of a package's cuBLASLt rebuild time).
std::shared_ptr<cuda::GemmPlan> gemm_plan_for(const GemmRecord& g, const LaunchEnv& env,
                                              const std::string& where) {
  const cuda::GemmDesc& d = g.desc;
  const CublasltBuffers& b = g.buf;
  // A recorded configuration is rebuilt and checked, no heuristic asked (Note [cuBLASLt plans
  // from their configuration]); the search below runs only when that fails.
  const bool by_config = g.has_algo && !env.library_choices_at_load && !g.algo_config.empty();
  std::shared_ptr<cuda::GemmPlan> plan =
      by_config ? cuda::GemmPlan::create_with_config(d, g.algo_config)
                : cuda::GemmPlan::create(d);
  if (!g.has_algo || env.library_choices_at_load) {
    // A cross-build, or another architecture: the heuristic's first choice within the workspace
    std::vector<cuda::GemmAlgo> cs = plan->candidates(8);
    const cuda::GemmAlgo* pick = nullptr;
    for (const cuda::GemmAlgo& a : cs)
      if (int64_t(a.workspace_bytes) <= b.workspace_bytes) {
        pick = &a;
        break;
      }
    if (!pick)
      fail_kind(ErrorKind::NotSupported, "{}: cuBLASLt offers no algorithm for {} within the "
                "package's {} bytes of workspace", where, plan->describe(), b.workspace_bytes);
    plan->set_algo(*pick);
  } else {
    const uint64_t* want = g.algo;
    // The plan's own choice first (the heuristic asked for one algorithm, as at compile time:
    // asked for eight, cuBLASLt may rank others first), then the other candidates: a tuned
    // choice is among the first 8 at compile time (Note [CUDA library kernels timed]); the
    // search goes to 32 as a margin. Format 5 records match on the algorithm's configuration
    // (Note [cuBLASLt algorithm identity]: with byte matching, fresh processes sometimes did not
    // find the recorded algorithm), older ones on its bytes; the plan takes cuBLASLt's own
    // candidate either way.
    // The 32 candidates are asked for only when the plan's own choice is not the recorded one
    // (a heuristic query per GEMM: most of a package's cuBLASLt rebuild time when it is made).
    bool found = false;
    auto matches = [&](const cuda::GemmAlgo& a) {
      return g.algo_config.empty() ? std::memcmp(a.opaque, want, sizeof g.algo) == 0
                                   : a.config == g.algo_config;
    };
    // Last, a configuration the heuristic does not list (a timed split-K or tile variant: Note
    // [cuBLASLt split-K and tile variants]) is rebuilt from its text.
    std::vector<cuda::GemmAlgo> cs = {plan->algo()};
    if (!matches(cs[0])) {
      for (const cuda::GemmAlgo& a : plan->candidates(32)) cs.push_back(a);
      if (!g.algo_config.empty() && std::none_of(cs.begin(), cs.end(), matches))
        if (std::optional<cuda::GemmAlgo> a = plan->algo_from_config(g.algo_config))
          cs.push_back(*a);
    }
    for (const cuda::GemmAlgo& a : cs)
      if (matches(a)) {
        if (int64_t(a.workspace_bytes) > b.workspace_bytes)
          fail_kind(ErrorKind::ParseError, "{}: the recorded algorithm needs {} bytes of "
                    "workspace, the package reserves {}", where, a.workspace_bytes,
                    b.workspace_bytes);
        plan->set_algo(a);
        found = true;
        break;
      }
    if (!found)
      fail_kind(ErrorKind::Runtime,
                "{}: cuBLASLt on this machine does not offer the algorithm the package was built "
                "with ({}) for {} among its first {} candidates (another cuBLASLt version or "
                "GPU), so it would not compute the same results; rebuild the package here with "
                "`kiln compile ... --device cuda`",
                where, g.algo_config.empty() ? std::string("recorded by its bytes") : g.algo_config,
                plan->describe(), cs.size());
  }
  return plan;
}

Executable::Launch rebuild_cublaslt(const LaunchRecord& r, LaunchEnv& env,
                                    const std::string& where) {
  GemmRecord g = parse_cublaslt(r, env, where);
  return make_cublaslt_launch(g.desc, prebuilt_or_new<gemm_plan_for>(g, env, where), g.buf);
}

// What a cuBLASLt record's plan depends on: its descriptor, recorded algorithm and workspace
// (a plan serves every launch of them: GemmPlan::run sets the bias pointer under its lock).
std::string cublaslt_plan_key(const LaunchRecord& r) {
  json p = kernels::parse_untrusted_json(r.params);
  return p.at("desc").dump() + "|" + p.at("algo").dump() + "|" +
         (p.contains("algo_config") ? p.at("algo_config").dump() : std::string()) + "|" +
         p.at("workspace_bytes").dump();
}

// A cudnn_conv record, checked without a GPU: the descriptor (and the output shape it
// implies), every buffer inside its slot, the kernels' records. Records of format version 3
// have no "residual", "pre", "post" or "w_krsc" and may have a "bias_kernel" (a post kernel).
struct ConvRecord {
  cuda::ConvDesc desc;
  CudnnConvBuffers buf;
  std::optional<std::string> engine;  // null: a cross-build
  std::vector<CudaKernelSpec> pre, post;
  bool w_krsc = false;
};

ConvRecord parse_cudnn_conv(const LaunchRecord& r, LaunchEnv& env, const std::string& where) {
  json p = kernels::parse_untrusted_json(r.params);
  ConvRecord c;
  cuda::ConvDesc& d = c.desc;
  d = conv_desc_from(p.at("desc"));
  CudnnConvBuffers& b = c.buf;
  b.x = ref_from(p.at("x"));
  b.w = ref_from(p.at("w"));
  b.bias = ref_from(p.at("bias"));
  b.y = ref_from(p.at("y"));
  if (p.contains("residual")) b.residual = ref_from(p.at("residual"));
  workspace_from(p, &b.workspace, &b.workspace_bytes);
  std::array<int64_t, 4> y = cuda::conv_output_dims(d);  // InvalidArgument for impossible shapes
  const int64_t es = dtype_size(d.dtype);
  bool transposed = d.kind == cuda::ConvKind::Transpose;
  int64_t w_elems = transposed ? product({d.c_in, d.c_out / d.groups, d.kh, d.kw})
                               : product({d.c_out, d.c_in / d.groups, d.kh, d.kw});
  const int64_t y_bytes = product({y[0], y[1], y[2], y[3], es});
  check_buffer(env, b.x, product({d.n, d.c_in, d.h, d.w, es}), where, "x");
  check_buffer(env, b.w, mul(w_elems, es), where, "w");
  check_buffer(env, b.y, y_bytes, where, "y");
  if (b.workspace_bytes > 0) check_buffer(env, b.workspace, b.workspace_bytes, where, "workspace");
  if (d.bias || b.bias.slot >= 0) check_buffer(env, b.bias, mul(d.c_out, es), where, "bias");
  if (d.residual || b.residual.slot >= 0) check_buffer(env, b.residual, y_bytes, where, "residual");
  if (p.contains("w_krsc")) c.w_krsc = p.at("w_krsc").get<bool>();
  if (c.w_krsc && d.layout != cuda::ConvLayout::NHWC)
    throw std::out_of_range("a filter reordered to KRSC for a convolution that is not NHWC");
  auto kernels = [&](const char* key, std::vector<CudaKernelSpec>& out) {
    if (!p.contains(key)) return;
    const json& list = p.at(key);
    if (!list.is_array() || list.size() > 8) throw std::out_of_range("convolution kernel lists hold at most 8");
    for (const json& k : list) out.push_back(parse_kernel(k, env, where));
  };
  kernels("pre", c.pre);
  kernels("post", c.post);
  if (p.contains("bias_kernel") && !p.at("bias_kernel").is_null())
    c.post.insert(c.post.begin(), parse_kernel(p.at("bias_kernel"), env, where));
  const json& engine = p.at("engine");
  if (!engine.is_null()) c.engine = engine.get<std::string>();
  return c;
}

// A cuDNN plan's engine chosen at load (a cross-build, or a GPU of another architecture): the
// first whose workspace fits `workspace_bytes`. The plan comes with cuDNN's first choice
// finalized; the other candidates are finalized (seconds for a model: each runtime-fusion engine
// builds its kernels) only when it does not fit. False when none fits.
template <class Plan>
bool select_engine_at_load(Plan& plan, int64_t workspace_bytes) {
  if (int64_t(plan.workspace_bytes()) <= workspace_bytes) return true;
  for (const auto& e : plan.candidates())
    if (int64_t(e.workspace_bytes) <= workspace_bytes) {
      plan.select(e.index);
      plan.keep();  // the next load on this machine restores it
      return true;
    }
  return false;
}

// The record's cuDNN plan with its engine chosen (the slow part of a rebuild: finalizing a
// runtime-fusion engine builds its kernels).
std::shared_ptr<cuda::ConvPlan> conv_plan_for(const ConvRecord& rec, const LaunchEnv& env,
                                              const std::string& where) {
  const cuda::ConvDesc& d = rec.desc;
  const CudnnConvBuffers& b = rec.buf;
  std::shared_ptr<cuda::ConvPlan> plan = cuda::ConvPlan::create(d);
  if (!rec.engine || env.library_choices_at_load) {
    if (!select_engine_at_load(*plan, b.workspace_bytes))
      fail_kind(ErrorKind::NotSupported, "{}: cuDNN offers no engine for {} within the package's "
                "{} bytes of workspace", where, cuda::describe(d), b.workspace_bytes);
  } else {
    const std::string& tag = *rec.engine;
    if (!plan->select_tag(tag))
      fail_kind(ErrorKind::Runtime,
                "{}: cuDNN on this machine does not offer the engine the package was built with "
                "for {} ({}: another cuDNN version or GPU), so it would not compute the same "
                "results; rebuild the package here with `kiln compile ... --device cuda`",
                where, cuda::describe(d), tag);
    if (int64_t(plan->workspace_bytes()) > b.workspace_bytes)
      fail_kind(ErrorKind::ParseError, "{}: engine {} needs {} bytes of workspace, the package "
                "reserves {}", where, tag, plan->workspace_bytes(), b.workspace_bytes);
  }
  return plan;
}

// Note [cuDNN plans built beside each other]: a CUDA package's load builds its library plans
// (convolutions, attention, GEMMs) on several threads ahead of the launch loop, one per
// distinct record (prebuild_launches, prebuild_plan); cuDNN and cuBLASLt are thread-safe and
// the plans are used later from the loading thread, as plans built by one thread and run by
// another are at compile time.

// Note [Filters stored KRSC at load]
// A channels-last convolution reads its filter KRSC, while a package stores weights as the
// model has them (KCRS), and an in-process executable shares them with the graph: each context
// is made with a KRSC copy (ConvState::krsc_filter), ResNet-50's 57 MiB beside the 57 of its
// filters, made through the host at the load's end (0.08 s). A filter whose every reader is
// such a convolution, reading it whole, is stored KRSC by a package's load instead: permuted on
// the host as it goes from the mapped file to the device, with no copy beside it, and its
// convolutions read it as it is. The loader finds them in the records (filters_to_store_krsc);
// the package's bytes and records are unchanged, so older runtimes and replace-weights see the
// same file. 1x1 filters and one channel per group (depthwise) are the same bytes in both
// layouts: never copied, never permuted.
Executable::Launch rebuild_cudnn_conv(const LaunchRecord& r, LaunchEnv& env,
                                      const std::string& where) {
  ConvRecord rec = parse_cudnn_conv(r, env, where);
  const cuda::ConvDesc& d = rec.desc;
  const CudnnConvBuffers& b = rec.buf;
  std::shared_ptr<cuda::ConvPlan> plan = prebuilt_or_new<conv_plan_for>(rec, env, where);
  CudnnConvKernels k;
  std::vector<cuda::CudaKernel> loaded;
  loaded.reserve(rec.pre.size() + rec.post.size());
  for (const CudaKernelSpec& s : rec.pre) k.pre_loaded.push_back(&loaded.emplace_back(load_kernel(s, env, where)));
  for (const CudaKernelSpec& s : rec.post) k.post_loaded.push_back(&loaded.emplace_back(load_kernel(s, env, where)));
  k.pre = std::move(rec.pre);
  k.post = std::move(rec.post);
  bool stored = false;
  if (rec.w_krsc && b.w.byte_offset == 0) {
    auto it = env.krsc_slots.find(b.w.slot);
    stored = it != env.krsc_slots.end() && it->second == krsc_filter_of(d);
  }
  return make_cudnn_conv_launch(d, std::move(plan), b, k, rec.w_krsc, stored);
}

// A cudnn_sdpa record, checked without a GPU: the descriptor, every buffer inside its slot.
struct SdpaRecord {
  cuda::SdpaDesc desc;
  CudnnSdpaBuffers buf;
  std::string engine;
};

SdpaRecord parse_cudnn_sdpa(const LaunchRecord& r, LaunchEnv& env, const std::string& where) {
  json p = kernels::parse_untrusted_json(r.params);
  SdpaRecord rec;
  cuda::SdpaDesc& d = rec.desc;
  d = sdpa_desc_from(p.at("desc"));
  CudnnSdpaBuffers& b = rec.buf;
  b.q = ref_from(p.at("q"));
  b.k = ref_from(p.at("k"));
  b.v = ref_from(p.at("v"));
  b.o = ref_from(p.at("o"));
  workspace_from(p, &b.workspace, &b.workspace_bytes);
  const int64_t es = dtype_size(d.dtype), bh = mul(d.batch, d.heads);
  // Bytes a [B, H, S, D] operand spans: contiguous, or the last element's offset + 1 of a view.
  auto span = [&](const std::array<int64_t, 4>& st, int64_t s, int64_t dim) {
    if (st == std::array<int64_t, 4>{}) return product({bh, s, dim, es});
    int64_t last = 0;
    const int64_t sizes[4] = {d.batch, d.heads, s, dim};
    for (int i = 0; i < 4; ++i) last = add(last, mul(sizes[i] - 1, st[size_t(i)]));
    return mul(add(last, 1), es);
  };
  check_buffer(env, b.q, span(d.q_stride, d.seq_q, d.head_dim), where, "q");
  check_buffer(env, b.k, span(d.k_stride, d.seq_kv, d.head_dim), where, "k");
  check_buffer(env, b.v, span(d.v_stride, d.seq_kv, d.head_dim_v), where, "v");
  check_buffer(env, b.o, span(d.o_stride, d.seq_q, d.head_dim_v), where, "o");
  if (b.workspace_bytes > 0) check_buffer(env, b.workspace, b.workspace_bytes, where, "workspace");
  if (d.mask != p.contains("mask"))
    throw std::out_of_range("an attention mask buffer goes with a mask in the descriptor, and only then");
  if (d.mask) {
    b.mask = ref_from(p.at("mask"));
    check_buffer(env, b.mask, product({d.mask_batch, d.mask_heads, d.seq_q, d.seq_kv, es}), where,
                 "mask");
  }
  rec.engine = p.at("engine").get<std::string>();
  return rec;
}

// The record's attention plan with its engine chosen (finalizing the engine builds its kernels).
std::shared_ptr<cuda::SdpaPlan> sdpa_plan_for(const SdpaRecord& rec, const LaunchEnv& env,
                                              const std::string& where) {
  const cuda::SdpaDesc& d = rec.desc;
  const CudnnSdpaBuffers& b = rec.buf;
  std::string why;
  std::shared_ptr<cuda::SdpaPlan> plan = cuda::SdpaPlan::try_create(d, &why);
  if (!plan)
    fail_kind(ErrorKind::NotSupported, "{}: cuDNN on this machine has no fused attention engine "
              "for {} ({}); rebuild the package here with `kiln compile ... --device cuda`",
              where, cuda::describe(d), why);
  const std::string& tag = rec.engine;
  if (env.library_choices_at_load) {  // another architecture
    if (!select_engine_at_load(*plan, b.workspace_bytes))
      fail_kind(ErrorKind::NotSupported, "{}: cuDNN offers no attention engine for {} within the "
                "package's {} bytes of workspace", where, cuda::describe(d), b.workspace_bytes);
    return plan;
  }
  if (!plan->select_tag(tag))
    fail_kind(ErrorKind::Runtime,
              "{}: cuDNN on this machine does not offer the attention engine the package was "
              "built with for {} ({}: another cuDNN version or GPU), so it would not compute the "
              "same results; rebuild the package here with `kiln compile ... --device cuda`",
              where, cuda::describe(d), tag);
  if (int64_t(plan->workspace_bytes()) > b.workspace_bytes)
    fail_kind(ErrorKind::ParseError, "{}: engine {} needs {} bytes of workspace, the package "
              "reserves {}", where, tag, plan->workspace_bytes(), b.workspace_bytes);
  return plan;
}

Executable::Launch rebuild_cudnn_sdpa(const LaunchRecord& r, LaunchEnv& env,
                                      const std::string& where) {
  SdpaRecord rec = parse_cudnn_sdpa(r, env, where);
  return make_cudnn_sdpa_launch(prebuilt_or_new<sdpa_plan_for>(rec, env, where), rec.buf);
}

}  // namespace

std::string cudnn_desc_key(const cuda::ConvDesc& d) { return conv_desc_json(d).dump(); }
std::string cudnn_desc_key(const cuda::SdpaDesc& d) { return sdpa_desc_json(d).dump(); }

namespace {

// What a cuDNN record's plan depends on (LaunchPrebuildKeyFn): its descriptor, its recorded
// engine and its workspace (the engine chosen at load must fit it); never its buffers.
std::string cudnn_plan_key(const LaunchRecord& r) {
  json p = kernels::parse_untrusted_json(r.params);
  return p.at("desc").dump() + "|" + p.at("engine").dump() + "|" + p.at("workspace_bytes").dump();
}

const bool g_registered = [] {
  // Each with its parse-only check (validate_launch_record), which needs no GPU.
  register_launch_kind("cuda_kernel", Device::cuda(), rebuild_cuda_kernel,
                       [](const LaunchRecord& r, LaunchEnv& env, const std::string& where) {
                         parse_kernel(kernels::parse_untrusted_json(r.params), env, where);
                       });
  register_launch_kind("cublaslt", Device::cuda(), rebuild_cublaslt,
                       [](const LaunchRecord& r, LaunchEnv& env, const std::string& where) {
                         parse_cublaslt(r, env, where);
                       },
                       prebuild_plan<parse_cublaslt, gemm_plan_for>, cublaslt_plan_key);
  register_launch_kind("cudnn_conv", Device::cuda(), rebuild_cudnn_conv,
                       [](const LaunchRecord& r, LaunchEnv& env, const std::string& where) {
                         parse_cudnn_conv(r, env, where);
                       },
                       prebuild_plan<parse_cudnn_conv, conv_plan_for>, cudnn_plan_key);
  register_launch_kind("cudnn_sdpa", Device::cuda(), rebuild_cudnn_sdpa,
                       [](const LaunchRecord& r, LaunchEnv& env, const std::string& where) {
                         parse_cudnn_sdpa(r, env, where);
                       },
                       prebuild_plan<parse_cudnn_sdpa, sdpa_plan_for>, cudnn_plan_key);
  return true;
}();

}  // namespace

Executable::Launch make_cuda_kernel_launch(const cuda::CudaKernel& kernel, CudaKernelSpec spec) {
  if (spec.args.size() > size_t(cuda::kMaxKernelPointerArgs))
    fail_kind(ErrorKind::NotSupported, "cuda: kernel {} has {} pointer arguments (at most {})",
              spec.kernel, spec.args.size(), cuda::kMaxKernelPointerArgs);
  auto state = std::make_shared<KernelState>();
  state->kernel = kernel;
  state->spec = std::move(spec);
  Executable::Launch l;
  l.fn = kernel.valid() ? run_kernel : run_unloaded_kernel;
  l.state = state.get();
  l.name = state->spec.kernel;
  l.kind = "cuda";
  l.record = [state] { return LaunchRecord{"cuda_kernel", kernel_json(state->spec).dump()}; };
  l.owner = std::move(state);
  return l;
}

Executable::Launch make_cublaslt_launch(const cuda::GemmDesc& desc,
                                        std::shared_ptr<const cuda::GemmPlan> plan,
                                        CublasltBuffers buffers) {
  auto state = std::make_shared<GemmState>();
  state->plan = std::move(plan);
  state->buf = buffers;
  state->why = fmt::format("cuda: GEMM {}x{}x{} was compiled for a package only (a cross-build "
                           "without a GPU): load the package on the GPU to run it",
                           desc.m, desc.n, desc.k);
  Executable::Launch l;
  l.fn = run_gemm;
  l.state = nullptr;  // every context has its own (make_local): run_gemm takes a Replayed<GemmState>
  l.kind = "cublaslt";
  l.make_local = replayed_local(state.get());
  l.record = [state, desc] {
    const CublasltBuffers& b = state->buf;
    json p = {{"desc", gemm_desc_json(desc)},
              {"algo", state->plan ? algo_json(state->plan->algo()) : json(nullptr)},
              {"a", ref_json(b.a)}, {"b", ref_json(b.b)}, {"bias", ref_json(b.bias)},
              {"d", ref_json(b.d)}, {"workspace", ref_json(b.workspace)},
              {"workspace_bytes", b.workspace_bytes}};
    if (state->plan && !state->plan->algo().config.empty())
      p["algo_config"] = state->plan->algo().config;
    return LaunchRecord{"cublaslt", p.dump()};
  };
  l.owner = std::move(state);
  return l;
}

Executable::Launch make_cudnn_conv_launch(const cuda::ConvDesc& desc,
                                          std::shared_ptr<const cuda::ConvPlan> plan,
                                          CudnnConvBuffers buffers, const CudnnConvKernels& kernels,
                                          bool w_krsc, bool w_stored_krsc) {
  auto state = std::make_shared<ConvState>();
  state->plan = std::move(plan);
  state->desc = desc;
  state->buf = buffers;
  state->w_krsc = w_krsc;
  state->w_stored_krsc = w_krsc && w_stored_krsc;
  auto add = [&](const std::vector<CudaKernelSpec>& specs,
                 const std::vector<const cuda::CudaKernel*>& loaded, std::vector<KernelState>& out) {
    for (size_t i = 0; i < specs.size(); ++i) {
      KernelState k;
      if (i < loaded.size() && loaded[i]) k.kernel = *loaded[i];
      k.spec = specs[i];
      out.push_back(std::move(k));
    }
  };
  add(kernels.pre, kernels.pre_loaded, state->pre);
  add(kernels.post, kernels.post_loaded, state->post);
  std::vector<int32_t>& ks = state->key_slots;
  auto key = [&](const MemRef& r) {
    if (r.slot >= 0 && std::find(ks.begin(), ks.end(), r.slot) == ks.end()) ks.push_back(r.slot);
  };
  for (const MemRef& r : {buffers.x, buffers.w, buffers.bias, buffers.y, buffers.residual, buffers.workspace})
    key(r);
  for (const auto* list : {&state->pre, &state->post})
    for (const KernelState& k : *list)
      for (const MemRef& r : k.spec.args) key(r);
  state->why = fmt::format("cuda: {} was compiled for a package only (a cross-build without a "
                           "GPU): load the package on the GPU to run it", cuda::describe(desc));
  Executable::Launch l;
  l.fn = run_conv;
  l.state = nullptr;  // every context has its own (make_local): run_conv takes a ConvLocal
  l.kind = "cudnn";
  const ConvState* shared = state.get();
  l.make_local = [shared](char* const* slots) -> std::shared_ptr<void> {
    auto local = std::make_shared<ConvLocal>(shared);
    if (shared->w_krsc && !shared->w_stored_krsc && shared->plan)
      local->w_krsc = shared->krsc_filter(ptr(slots, shared->buf.w));
    return local;
  };
  l.record = [state] {
    const CudnnConvBuffers& b = state->buf;
    json pre = json::array(), post = json::array();
    for (const KernelState& k : state->pre) pre.push_back(kernel_json(k.spec));
    for (const KernelState& k : state->post) post.push_back(kernel_json(k.spec));
    json p = {{"desc", conv_desc_json(state->desc)},
              {"engine", state->plan ? json(state->plan->engine().tag) : json(nullptr)},
              {"x", ref_json(b.x)}, {"w", ref_json(b.w)}, {"bias", ref_json(b.bias)},
              {"y", ref_json(b.y)}, {"residual", ref_json(b.residual)},
              {"workspace", ref_json(b.workspace)}, {"workspace_bytes", b.workspace_bytes},
              {"pre", pre}, {"post", post}, {"w_krsc", state->w_krsc}};
    return LaunchRecord{"cudnn_conv", p.dump()};
  };
  l.owner = std::move(state);
  return l;
}

Executable::Launch make_cudnn_sdpa_launch(std::shared_ptr<const cuda::SdpaPlan> plan,
                                          CudnnSdpaBuffers buffers) {
  if (!plan) fail_kind(ErrorKind::Internal, "cuda: a cuDNN attention launch needs its plan");
  auto state = std::make_shared<SdpaState>();
  state->plan = std::move(plan);
  state->buf = buffers;
  Executable::Launch l;
  l.fn = run_sdpa;
  l.state = nullptr;  // every context has its own (make_local): run_sdpa takes a Replayed<SdpaState>
  l.kind = "cudnn";
  l.make_local = replayed_local(state.get());
  l.record = [state] {
    const CudnnSdpaBuffers& b = state->buf;
    json p = {{"desc", sdpa_desc_json(state->plan->desc())},
              {"engine", state->plan->engine().tag},
              {"q", ref_json(b.q)}, {"k", ref_json(b.k)}, {"v", ref_json(b.v)},
              {"o", ref_json(b.o)}, {"workspace", ref_json(b.workspace)},
              {"workspace_bytes", b.workspace_bytes}};
    if (state->plan->desc().mask) p["mask"] = ref_json(b.mask);  // format 12
    return LaunchRecord{"cudnn_sdpa", p.dump()};
  };
  l.owner = std::move(state);
  return l;
}

KrscFilter krsc_filter_of(const cuda::ConvDesc& d) {
  const bool t = d.kind == cuda::ConvKind::Transpose;
  return {t ? d.c_in : d.c_out, (t ? d.c_out : d.c_in) / d.groups, d.kh * d.kw,
          dtype_size(d.dtype)};
}

namespace {
// Each filter k's [C][RS] block transposed to [RS][C] (to_krsc) or back. Typed element moves (a
// memcpy call per 2-byte element was most of a ResNet-50 load).
template <bool to_krsc>
void move_filter(const KrscFilter& f, const void* from_v, void* to_v) {
  if (f.identity()) {
    std::memcpy(to_v, from_v, size_t(f.bytes()));
    return;
  }
  auto go = [&](auto tag) {
    using T = decltype(tag);
    const T* from = static_cast<const T*>(from_v);
    T* to = static_cast<T*>(to_v);
    const int64_t c = f.c, rs = f.rs;
    for (int64_t ki = 0; ki < f.k; ++ki) {
      const T* src = from + ki * c * rs;
      T* dst = to + ki * c * rs;
      for (int64_t ci = 0; ci < c; ++ci)
        for (int64_t p = 0; p < rs; ++p) {
          if constexpr (to_krsc) dst[p * c + ci] = src[ci * rs + p];
          else dst[ci * rs + p] = src[p * c + ci];
        }
    }
  };
  if (f.elem_bytes == 2) go(uint16_t{});
  else if (f.elem_bytes == 4) go(uint32_t{});
  else if (f.elem_bytes == 8) go(uint64_t{});
  else fail_kind(ErrorKind::Internal, "cuda: a {}-byte filter element", f.elem_bytes);
}
}  // namespace

void KrscFilter::permute(const void* from, void* to) const { move_filter<true>(*this, from, to); }
void KrscFilter::restore(const void* from, void* to) const { move_filter<false>(*this, from, to); }

std::map<int32_t, KrscFilter> filters_to_store_krsc(const std::vector<LaunchRecord>& records,
                                                    const std::vector<int64_t>& constant_slots,
                                                    const std::vector<int32_t>& output_slots) {
  auto is_constant = [&](int64_t slot) {
    return slot > 0 && size_t(slot) < constant_slots.size() && constant_slots[size_t(slot)] > 0;
  };
  std::map<int32_t, KrscFilter> found;
  std::vector<bool> other(constant_slots.size(), false);  // read some other way
  for (int32_t s : output_slots)
    if (is_constant(s)) other[size_t(s)] = true;
  // Every [slot, offset] pair in a record's parameters (descriptors aside: their pairs are
  // strides and paddings) is a reference; a pair that only looks like one keeps a filter KCRS.
  std::function<void(const json&)> walk = [&](const json& j) {
    if (j.is_array()) {
      if (j.size() == 2 && j[0].is_number_integer() && j[1].is_number_integer() &&
          is_constant(j[0].get<int64_t>()))
        other[size_t(j[0].get<int64_t>())] = true;
      for (const json& e : j) walk(e);
    } else if (j.is_object()) {
      for (const auto& [key, v] : j.items())
        if (key != "desc") walk(v);
    }
  };
  for (const LaunchRecord& r : records) {
    try {
      json p = kernels::parse_untrusted_json(r.params);
      if (r.kind == "cudnn_conv" && p.is_object() && p.value("w_krsc", false)) {
        const MemRef w = ref_from(p.at("w"));
        const cuda::ConvDesc d = conv_desc_from(p.at("desc"));
        const KrscFilter f = krsc_filter_of(d);
        const bool whole = w.byte_offset == 0 && is_constant(w.slot) &&
                           f.k > 0 && f.c > 0 && f.rs > 0 &&
                           constant_slots[size_t(w.slot)] == f.bytes();
        if (!whole) {
          if (is_constant(w.slot)) other[size_t(w.slot)] = true;
        } else if (auto it = found.find(w.slot); it == found.end()) {
          found[w.slot] = f;
        } else if (!(it->second == f)) {
          other[size_t(w.slot)] = true;
        }
        p.erase("w");
      }
      walk(p);
    } catch (const std::exception&) {
      // Malformed: rebuilding the launch reports it; nothing here depends on it.
    }
  }
  for (auto it = found.begin(); it != found.end();)
    it = other[size_t(it->first)] ? found.erase(it) : std::next(it);
  return found;
}

}  // namespace kiln
