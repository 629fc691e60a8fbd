// Note [Row-major GEMM on cuBLASLt]
// cuBLASLt is column-major. A row-major [r, c] matrix with row stride ld is, read column-major,
// a [c, r] matrix with leading dimension ld: its transpose, for free. So Kiln's
//   D[M,N] = op(A)[M,K] @ op(B)[K,N]        (row-major)
// is computed as cuBLASLt's
//   D^T[N,M] = op(B)^T[N,K] @ op(A)^T[K,M]  (column-major)
// with cuBLASLt's "A" = Kiln's B and cuBLASLt's "B" = Kiln's A, m' = N, n' = M, k' = K:
//   - Kiln B [K,N] (no trans) reads as [N,K] = op(B)^T: cuBLASLt op N, layout N x K, ld = ldb;
//     Kiln B stored [N,K] (trans_b) reads as [K,N]: op T, layout K x N, ld = ldb;
//   - Kiln A [M,K] reads as [K,M] = op(A)^T: op N, layout K x M, ld = lda;
//     Kiln A stored [K,M] (trans_a) reads as [M,K]: op T, layout M x K, ld = lda;
//   - C and D [M,N] read as N x M with ld = ldc / ldd.
// cuBLASLt's bias has one element per row of its D, i.e. per column n of Kiln's D: linear's bias.
//
// Precision. float32 computes with CUBLAS_COMPUTE_32F (no TF32: cuBLASLt down-converts only
// under CUBLAS_COMPUTE_32F_FAST_TF32, which allow_tf32 selects); float16/bfloat16 use
// CUBLAS_COMPUTE_32F as well (f32 accumulation), scale type f32, bias in the output dtype
// (cuBLASLt's default for these types).
//
// Loading. libcublasLt.so.13 is opened with dlopen on first use (dynamic_library.h), not linked:
// it is 540 MB, a binary that only runs CPU work must not need it to start, and the GPU
// machine's copy is used in place (scripts/cuda_tests.sh does not ship it). The table of
// functions is filled once per process.
//
// Threads. The matmul descriptor carries the bias pointer, which changes per call; run() sets
// it and enqueues the matmul under the plan's mutex (enqueueing only: the GEMM runs
// asynchronously on the caller's stream).
#include "kernels/cuda/cublaslt_gemm.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <iterator>
#include <mutex>
#include <tuple>

#include <fmt/format.h>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "kernels/cuda/dynamic_library.h"

namespace kiln::cuda {
namespace {

// ---- loading cuBLASLt ------------------------------------------------------------------------

struct LtApi {
  decltype(&::cublasLtGetVersion) get_version = nullptr;
  decltype(&::cublasLtGetStatusName) get_status_name = nullptr;
  decltype(&::cublasLtGetStatusString) get_status_string = nullptr;
  decltype(&::cublasLtCreate) create = nullptr;
  decltype(&::cublasLtMatmulDescCreate) matmul_desc_create = nullptr;
  decltype(&::cublasLtMatmulDescDestroy) matmul_desc_destroy = nullptr;
  decltype(&::cublasLtMatmulDescSetAttribute) matmul_desc_set = nullptr;
  decltype(&::cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&::cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&::cublasLtMatrixLayoutSetAttribute) layout_set = nullptr;
  decltype(&::cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&::cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) get_heuristic = nullptr;
  decltype(&::cublasLtMatmulAlgoConfigGetAttribute) algo_get = nullptr;
  decltype(&::cublasLtMatmulAlgoConfigSetAttribute) algo_set = nullptr;
  decltype(&::cublasLtMatmulAlgoCapGetAttribute) algo_cap = nullptr;
  decltype(&::cublasLtMatmulAlgoInit) algo_init = nullptr;
  decltype(&::cublasLtMatmulAlgoCheck) algo_check = nullptr;
  decltype(&::cublasLtMatmul) matmul = nullptr;
  size_t version = 0;
  std::string library;
  std::string unavailable;
};


LtApi load_cublaslt() {
  LtApi api;
  std::string tried;
  void* lib = open_cuda_library("libcublasLt.so.13", "KILN_CUBLASLT", &tried);
  if (!lib) {
    api.unavailable = fmt::format(
        "cuBLASLt (libcublasLt.so.13, CUDA 13) is needed for matmul/linear on CUDA and was not "
        "found; install the CUDA toolkit's cuBLAS, add its lib64 folder to LD_LIBRARY_PATH, or "
        "set KILN_CUBLASLT to the library's path. Tried:{}",
        tried);
    return api;
  }
  std::string missing;
  const bool ok = bind_symbol(lib, "cublasLtGetVersion", &api.get_version, &missing) &&
                  bind_symbol(lib, "cublasLtGetStatusName", &api.get_status_name, &missing) &&
                  bind_symbol(lib, "cublasLtGetStatusString", &api.get_status_string, &missing) &&
                  bind_symbol(lib, "cublasLtCreate", &api.create, &missing) &&
                  bind_symbol(lib, "cublasLtMatmulDescCreate", &api.matmul_desc_create, &missing) &&
                  bind_symbol(lib, "cublasLtMatmulDescDestroy", &api.matmul_desc_destroy, &missing) &&
                  bind_symbol(lib, "cublasLtMatmulDescSetAttribute", &api.matmul_desc_set, &missing) &&
                  bind_symbol(lib, "cublasLtMatrixLayoutCreate", &api.layout_create, &missing) &&
                  bind_symbol(lib, "cublasLtMatrixLayoutDestroy", &api.layout_destroy, &missing) &&
                  bind_symbol(lib, "cublasLtMatrixLayoutSetAttribute", &api.layout_set, &missing) &&
                  bind_symbol(lib, "cublasLtMatmulPreferenceCreate", &api.pref_create, &missing) &&
                  bind_symbol(lib, "cublasLtMatmulPreferenceDestroy", &api.pref_destroy, &missing) &&
                  bind_symbol(lib, "cublasLtMatmulPreferenceSetAttribute", &api.pref_set, &missing) &&
                  bind_symbol(lib, "cublasLtMatmulAlgoGetHeuristic", &api.get_heuristic, &missing) &&
                  bind_symbol(lib, "cublasLtMatmulAlgoConfigGetAttribute", &api.algo_get, &missing) &&
                  bind_symbol(lib, "cublasLtMatmulAlgoConfigSetAttribute", &api.algo_set, &missing) &&
                  bind_symbol(lib, "cublasLtMatmulAlgoCapGetAttribute", &api.algo_cap, &missing) &&
                  bind_symbol(lib, "cublasLtMatmulAlgoInit", &api.algo_init, &missing) &&
                  bind_symbol(lib, "cublasLtMatmulAlgoCheck", &api.algo_check, &missing) &&
                  bind_symbol(lib, "cublasLtMatmul", &api.matmul, &missing);
  if (!ok) {
    api.unavailable = fmt::format(
        "the cuBLASLt library found does not export {}: cuBLASLt from CUDA 13 is needed (set "
        "KILN_CUBLASLT to its path)",
        missing);
    return api;
  }
  api.version = api.get_version();
  api.library = library_path_of(reinterpret_cast<const void*>(api.matmul));
  return api;
}

const LtApi& lt() {
  static const LtApi api = load_cublaslt();
  return api;
}

std::string status_text(const LtApi& a, cublasStatus_t s) {
  return fmt::format("{} ({})", a.get_status_name(s), a.get_status_string(s));
}

// One handle per device for the process (cuBLASLt handles hold no stream state).
cublasLtHandle_t handle_for(const LtApi& a, int device, const std::string& what) {
  static std::mutex mu;
  static std::vector<cublasLtHandle_t>* handles = new std::vector<cublasLtHandle_t>();
  std::lock_guard<std::mutex> lock(mu);
  if (handles->size() <= size_t(device)) handles->resize(size_t(device) + 1, nullptr);
  cublasLtHandle_t& h = (*handles)[size_t(device)];
  if (!h) {
    check_cuda(cudaSetDevice(device), what.c_str());
    const cublasStatus_t s = a.create(&h);
    if (s != CUBLAS_STATUS_SUCCESS) {
      h = nullptr;
      fail_kind(ErrorKind::Runtime, "{}: cublasLtCreate failed: {}", what, status_text(a, s));
    }
  }
  return h;
}

cudaDataType_t data_type(DType d) {
  switch (d) {
    case DType::Float32: return CUDA_R_32F;
    case DType::Float16: return CUDA_R_16F;
    case DType::BFloat16: return CUDA_R_16BF;
    default: break;
  }
  KILN_ASSERT(false);
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::None: return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::Relu: return CUBLASLT_EPILOGUE_RELU;
    case GemmEpilogue::BiasRelu: return CUBLASLT_EPILOGUE_RELU_BIAS;
    case GemmEpilogue::Gelu: return CUBLASLT_EPILOGUE_GELU;
    case GemmEpilogue::BiasGelu: return CUBLASLT_EPILOGUE_GELU_BIAS;
  }
  KILN_ASSERT(false);
}

static_assert(sizeof(GemmAlgo::opaque) == sizeof(cublasLtMatmulAlgo_t),
              "GemmAlgo::opaque must hold a cublasLtMatmulAlgo_t");

// Note [cuBLASLt algorithm identity]
// An algorithm is what its configuration attributes say (algorithm id, tile, stages, split-K,
// reduction scheme, CTA swizzling, custom option, inner and cluster shapes), read through
// cublasLtMatmulAlgoConfigGetAttribute; the 64 opaque bytes need not be equal for the same
// configuration in two processes (a fresh process once did not find a package's recorded bytes
// among the heuristic's first 32 candidates for resnet18's float32 classifier). Packages record
// the configuration beside the bytes, and the loader matches on it.
// The configuration attributes that identify an algorithm, in the order and with the names of
// its text ("id66 tile80 stages35 splitk1 red0 swz0 custom2 inner0 cluster7"), and their sizes.
// The id is set by cublasLtMatmulAlgoInit, the others through the configuration attributes.
struct ConfigField {
  cublasLtMatmulAlgoConfigAttributes_t attr;
  const char* name;
  size_t bytes;
  bool is_signed;
};
constexpr ConfigField kConfigFields[] = {
    {CUBLASLT_ALGO_CONFIG_ID, "id", 4, true},
    {CUBLASLT_ALGO_CONFIG_TILE_ID, "tile", 4, false},
    {CUBLASLT_ALGO_CONFIG_STAGES_ID, "stages", 4, false},
    {CUBLASLT_ALGO_CONFIG_SPLITK_NUM, "splitk", 4, true},
    {CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, "red", 4, false},
    {CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, "swz", 4, false},
    {CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, "custom", 4, false},
    {CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, "inner", 2, false},
    {CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, "cluster", 2, false},
};

std::string algo_config(const LtApi& a, const cublasLtMatmulAlgo_t& algo) {
  std::string text;
  for (const ConfigField& f : kConfigFields) {
    uint64_t raw = 0;  // little-endian: the field's bytes are its low bytes
    size_t written = 0;
    long long v = -1;
    if (a.algo_get(&algo, f.attr, &raw, f.bytes, &written) == CUBLAS_STATUS_SUCCESS)
      v = f.is_signed && f.bytes == 4 ? static_cast<long long>(static_cast<int32_t>(raw))
                                      : static_cast<long long>(raw);
    text += fmt::format("{}{}{}", text.empty() ? "" : " ", f.name, v);
  }
  return text;
}

// An algorithm with what cuBLASLt says of it (the heuristic's or cublasLtMatmulAlgoCheck's).
GemmAlgo algo_of(const LtApi& a, const cublasLtMatmulHeuristicResult_t& r, int index) {
  GemmAlgo g;
  std::memcpy(g.opaque, &r.algo, sizeof g.opaque);
  g.config = algo_config(a, r.algo);
  g.workspace_bytes = r.workspaceSize;
  g.waves = r.wavesCount;
  g.index = index;
  return g;
}

}  // namespace

// ---- public helpers --------------------------------------------------------------------------

const char* gemm_epilogue_name(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::None: return "none";
    case GemmEpilogue::Bias: return "bias";
    case GemmEpilogue::Relu: return "relu";
    case GemmEpilogue::BiasRelu: return "bias_relu";
    case GemmEpilogue::Gelu: return "gelu";
    case GemmEpilogue::BiasGelu: return "bias_gelu";
  }
  return "?";
}

bool gemm_epilogue_has_bias(GemmEpilogue e) {
  return e == GemmEpilogue::Bias || e == GemmEpilogue::BiasRelu || e == GemmEpilogue::BiasGelu;
}

// Measured on the H200 (cuBLASLt 13.0, 2026-12-01, CublasLtGemm.NanBehaviourMatchesTheNanExactFlag):
// the RELU and BIAS+RELU epilogues keep a NaN of the product as NaN, like Kiln's relu. The test
// re-checks this on every GPU run, so a cuBLASLt that changes it fails loudly.
bool gemm_epilogue_nan_exact(GemmEpilogue) { return true; }

bool cublaslt_available(std::string* why) {
  const LtApi& a = lt();
  if (why) *why = a.unavailable;
  return a.unavailable.empty();
}

void cublaslt_warm_up(int device, DType dtype) {
  try {
    GemmDesc d;
    d.dtype = dtype;
    d.m = d.n = d.k = 64;
    d.device = device;
    (void)GemmPlan::create(d);
  } catch (const std::exception&) {
  }
}

// ---- the plan --------------------------------------------------------------------------------

struct GemmPlan::Impl {
  const LtApi* api = nullptr;
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;  // cuBLASLt's roles
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t type = CUDA_R_32F;
  mutable std::mutex mu;  // guards the bias pointer in `op` between set and enqueue
  ~Impl() {
    if (!api) return;
    for (cublasLtMatrixLayout_t l : {a, b, c, d})
      if (l) api->layout_destroy(l);
    if (op) api->matmul_desc_destroy(op);
  }
};

std::string GemmPlan::describe() const {
  const GemmDesc& g = desc_;
  // " tf32" keys the tuning store too (tune_gemm): a TF32 GEMM's algorithm is not an exact one's.
  return fmt::format("gemm {}{} {}x{}x{} ({}, {}) batch {} epilogue {}{}",
                     info(g.dtype).short_name, g.allow_tf32 ? " tf32" : "", g.m, g.n, g.k, g.trans_a ? "A^T" : "A",
                     g.trans_b ? "B^T" : "B", g.batch, gemm_epilogue_name(g.epilogue),
                     g.beta != 0 ? fmt::format(", beta {}", g.beta) : "");
}

std::unique_ptr<GemmPlan> GemmPlan::create(const GemmDesc& desc, size_t max_workspace_bytes) {
  std::unique_ptr<GemmPlan> plan = make(desc, max_workspace_bytes);
  plan->select_first();
  return plan;
}

// Note [cuBLASLt plans from their configuration]
// A package records each GEMM's algorithm by its configuration text (Note [cuBLASLt algorithm
// identity]). Its load used to ask the heuristic for the plan's first algorithm and match the
// text against it (then against 32 candidates); it now rebuilds the configuration directly
// (cublasLtMatmulAlgoInit + attributes) and has cuBLASLt check it for this GEMM and device
// (cublasLtMatmulAlgoCheck), as tuned split-K and tile variants always were. The heuristic is
// asked only when the check fails. The same configuration is the same kernel with the same
// parameters, so the results are the recorded algorithm's either way (CudaPackage tests compare
// loaded and compiled runs bit for bit).
std::unique_ptr<GemmPlan> GemmPlan::create_with_config(const GemmDesc& desc,
                                                       const std::string& config,
                                                       size_t max_workspace_bytes) {
  std::unique_ptr<GemmPlan> plan = make(desc, max_workspace_bytes);
  if (std::optional<GemmAlgo> a = plan->algo_from_config(config)) {
    a->index = 0;
    plan->algo_ = std::move(*a);
    return plan;
  }
  plan->select_first();
  return plan;
}

std::unique_ptr<GemmPlan> GemmPlan::make(const GemmDesc& desc_in, size_t max_workspace_bytes) {
  std::unique_ptr<GemmPlan> plan(new GemmPlan());
  GemmDesc& g = plan->desc_;
  g = desc_in;
  plan->max_workspace_bytes_ = max_workspace_bytes;
  const std::string what = plan->describe();

  // ---- validate (Kiln's row-major view) ----
  if (g.dtype != DType::Float32 && g.dtype != DType::Float16 && g.dtype != DType::BFloat16)
    fail_kind(ErrorKind::NotSupported,
              "{}: dtype {} is not supported by the cuBLASLt path (float32, float16, bfloat16); "
              "cast the operands or use the generated matmul",
              what, dtype_name(g.dtype));
  if (g.m <= 0 || g.n <= 0 || g.k <= 0)
    fail("{}: M, N and K must be positive (an empty product is a fill, not a GEMM)", what);
  if (g.batch <= 0) fail("{}: batch must be positive, got {}", what, g.batch);
  if (g.allow_tf32 && g.dtype != DType::Float32)
    fail("{}: allow_tf32 applies to float32 only", what);
  const int64_t elem = dtype_size(g.dtype);
  if (g.alignment_bytes < elem || (g.alignment_bytes & (g.alignment_bytes - 1)) != 0)
    fail("{}: alignment_bytes must be a power of two of at least the element size ({}), got {}",
         what, elem, g.alignment_bytes);
  const int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  if (g.lda == 0) g.lda = a_cols;
  if (g.ldb == 0) g.ldb = b_cols;
  if (g.ldc == 0) g.ldc = g.n;
  if (g.ldd == 0) g.ldd = g.n;
  auto check_ld = [&](const char* name, int64_t ld, int64_t cols) {
    if (ld < cols)
      fail("{}: {} row stride {} is smaller than its {} columns", what, name, ld, cols);
  };
  check_ld("A", g.lda, a_cols);
  check_ld("B", g.ldb, b_cols);
  check_ld("C", g.ldc, g.n);
  check_ld("D", g.ldd, g.n);
  if (g.stride_a < 0) g.stride_a = a_rows * g.lda;
  if (g.stride_b < 0) g.stride_b = b_rows * g.ldb;
  if (g.stride_c < 0) g.stride_c = g.m * g.ldc;
  if (g.stride_d < 0) g.stride_d = g.m * g.ldd;
  if (g.batch > 1 && g.stride_d < g.m * g.ldd)
    fail("{}: D's batch stride {} makes the batch's outputs overlap (at least {} needed)", what,
         g.stride_d, g.m * g.ldd);

  // ---- cuBLASLt ----
  require_cuda_device(g.device, what.c_str());
  const LtApi& a = lt();
  if (!a.unavailable.empty()) fail_kind(ErrorKind::NotSupported, "{}: {}", what, a.unavailable);
  plan->impl_ = std::make_unique<Impl>();
  Impl& im = *plan->impl_;
  im.api = &a;
  im.handle = handle_for(a, g.device, what);

  auto check = [&](cublasStatus_t s, const char* call) {
    if (s != CUBLAS_STATUS_SUCCESS)
      fail_kind(ErrorKind::Runtime, "{}: {} failed: {}", what, call, status_text(a, s));
  };
  const cudaDataType_t t = data_type(g.dtype);
  const cublasComputeType_t compute =
      g.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  check(a.matmul_desc_create(&im.op, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  im.compute = compute;
  im.type = t;
  const cublasOperation_t op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A = B
  const cublasOperation_t op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B = A
  check(a.matmul_desc_set(im.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a),
        "cublasLtMatmulDescSetAttribute(TRANSA)");
  check(a.matmul_desc_set(im.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b),
        "cublasLtMatmulDescSetAttribute(TRANSB)");
  const cublasLtEpilogue_t epi = lt_epilogue(g.epilogue);
  check(a.matmul_desc_set(im.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
        "cublasLtMatmulDescSetAttribute(EPILOGUE)");
  if (gemm_epilogue_has_bias(g.epilogue)) {
    // The heuristic reads the pointer's alignment: show it one aligned exactly as promised.
    const void* fake = reinterpret_cast<const void*>(uintptr_t(g.alignment_bytes));
    check(a.matmul_desc_set(im.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &fake, sizeof fake),
          "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
    const int64_t bias_batch_stride = 0;  // one bias for the whole batch
    check(a.matmul_desc_set(im.op, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &bias_batch_stride,
                            sizeof bias_batch_stride),
          "cublasLtMatmulDescSetAttribute(BIAS_BATCH_STRIDE)");
  }
  auto layout = [&](cublasLtMatrixLayout_t* l, int64_t rows, int64_t cols, int64_t ld,
                    int64_t stride, const char* name) {
    check(a.layout_create(l, t, uint64_t(rows), uint64_t(cols), ld),
          fmt::format("cublasLtMatrixLayoutCreate({})", name).c_str());
    if (g.batch > 1) {
      const int32_t count = int32_t(g.batch);
      check(a.layout_set(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
            "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
      check(a.layout_set(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
            "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
    }
  };
  // Note [Row-major GEMM on cuBLASLt]: column-major views of the row-major operands.
  layout(&im.a, b_cols, b_rows, g.ldb, g.stride_b, "B");
  layout(&im.b, a_cols, a_rows, g.lda, g.stride_a, "A");
  // Without a residual (beta = 0) cuBLASLt reads no C; D is passed for it, with D's layout.
  if (g.beta != 0)
    layout(&im.c, g.n, g.m, g.ldc, g.stride_c, "C");
  else
    layout(&im.c, g.n, g.m, g.ldd, g.stride_d, "C");
  layout(&im.d, g.n, g.m, g.ldd, g.stride_d, "D");
  return plan;
}

void GemmPlan::select_first() {
  const std::vector<GemmAlgo> found = candidates(1);
  if (found.empty())
    fail_kind(ErrorKind::NotSupported,
              "{}: cuBLASLt {} offers no algorithm for this GEMM within {} bytes of workspace "
              "and {}-byte alignment; run it as a generated matmul",
              describe(), impl_->api->version, max_workspace_bytes_, desc_.alignment_bytes);
  algo_ = found[0];
}

GemmPlan::~GemmPlan() = default;

std::vector<GemmAlgo> GemmPlan::candidates(int max_count) const {
  const Impl& im = *impl_;
  const LtApi& a = *im.api;
  const std::string what = describe();
  if (max_count <= 0) return {};
  cublasLtMatmulPreference_t pref = nullptr;
  cublasStatus_t s = a.pref_create(&pref);
  if (s != CUBLAS_STATUS_SUCCESS)
    fail_kind(ErrorKind::Runtime, "{}: cublasLtMatmulPreferenceCreate failed: {}", what,
              status_text(a, s));
  struct PrefGuard {
    const LtApi& a;
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { a.pref_destroy(p); }
  } guard{a, pref};
  const uint64_t ws = max_workspace_bytes_;
  const uint32_t align = uint32_t(desc_.alignment_bytes);
  for (auto [attr, value, size] :
       {std::tuple{CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<const void*>(&ws),
                   sizeof ws},
        std::tuple{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<const void*>(&align),
                   sizeof align},
        std::tuple{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<const void*>(&align),
                   sizeof align},
        std::tuple{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<const void*>(&align),
                   sizeof align},
        std::tuple{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<const void*>(&align),
                   sizeof align}}) {
    s = a.pref_set(pref, attr, value, size);
    if (s != CUBLAS_STATUS_SUCCESS)
      fail_kind(ErrorKind::Runtime, "{}: cublasLtMatmulPreferenceSetAttribute({}) failed: {}",
                what, int(attr), status_text(a, s));
  }
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(max_count));
  int returned = 0;
  {
    std::lock_guard<std::mutex> lock(im.mu);  // the op descriptor is read
    s = a.get_heuristic(im.handle, im.op, im.a, im.b, im.c, im.d, pref, max_count,
                        results.data(), &returned);
  }
  if (s == CUBLAS_STATUS_NOT_SUPPORTED) return {};
  if (s != CUBLAS_STATUS_SUCCESS)
    fail_kind(ErrorKind::Runtime, "{}: cublasLtMatmulAlgoGetHeuristic failed: {}", what,
              status_text(a, s));
  std::vector<GemmAlgo> out;
  for (int i = 0; i < returned; ++i) {
    if (results[size_t(i)].state != CUBLAS_STATUS_SUCCESS) continue;
    out.push_back(algo_of(a, results[size_t(i)], static_cast<int>(out.size())));
  }
  return out;
}

// Note [cuBLASLt split-K and tile variants]
// At batch 1 a transformer's GEMMs are short and wide (BERT: M = 128 rows against 768-3072
// columns), and cuBLASLt's heuristic offers at most 8 algorithms for them, all one kernel family
// with K unsplit but for the 3072-deep GEMM; timing those 8 moved nothing (docs/cuda.md,
// 2026-12-05). The autotuner (kernels=timed) therefore also times configurations the
// heuristic does not propose, derived from its first candidates: the same algorithm with each
// other tile it supports, and with K split 2 to 16 ways under each reduction scheme it supports
// (float32 partial sums first). Tiles fill at most half the list before the split-K
// variants are listed (a bfloat16 GEMM on the H100 supports over 40 tiles), then the rest of
// the room. cuBLASLt checks each (cublasLtMatmulAlgoCheck) for this GEMM,
// device and alignment, and says what workspace it needs; what it refuses, or what needs more
// workspace than the plan allows, is dropped. A variant is an algorithm like any other: its
// configuration text identifies it, and algo_from_config rebuilds it from that text
// (cublasLtMatmulAlgoInit, then each attribute) for the tuning store and for packages, since
// the heuristic would never list it.

std::optional<GemmAlgo> GemmPlan::check_algo(const void* lt_algo, int index) const {
  const Impl& im = *impl_;
  const LtApi& a = *im.api;
  cublasLtMatmulHeuristicResult_t r{};
  std::memcpy(&r.algo, lt_algo, sizeof r.algo);
  cublasStatus_t s;
  {
    std::lock_guard<std::mutex> lock(im.mu);  // the op descriptor is read
    s = a.algo_check(im.handle, im.op, im.a, im.b, im.c, im.d, &r.algo, &r);
  }
  if (s != CUBLAS_STATUS_SUCCESS || r.state != CUBLAS_STATUS_SUCCESS) return std::nullopt;
  if (r.workspaceSize > max_workspace_bytes_) return std::nullopt;
  return algo_of(a, r, index);
}

std::optional<GemmAlgo> GemmPlan::algo_from_config(const std::string& config) const {
  // "name<digits>" per field of kConfigFields, in order, one space apart; each in its range.
  uint64_t value[std::size(kConfigFields)];
  size_t at = 0;
  for (size_t i = 0; i < std::size(kConfigFields); ++i) {
    const ConfigField& f = kConfigFields[i];
    const size_t len = std::strlen(f.name);
    if (i > 0 && (at >= config.size() || config[at++] != ' ')) return std::nullopt;
    if (config.compare(at, len, f.name) != 0) return std::nullopt;
    at += len;
    const size_t digits = at;
    uint64_t v = 0;
    for (; at < config.size() && config[at] >= '0' && config[at] <= '9' && at - digits < 10; ++at)
      v = v * 10 + uint64_t(config[at] - '0');
    const uint64_t max = f.bytes == 2 ? 0xffff : f.is_signed ? 0x7fffffff : 0xffffffff;
    if (at == digits || v > max) return std::nullopt;
    value[i] = v;
  }
  if (at != config.size()) return std::nullopt;
  const Impl& im = *impl_;
  const LtApi& a = *im.api;
  cublasLtMatmulAlgo_t algo;
  if (a.algo_init(im.handle, im.compute, CUDA_R_32F, im.type, im.type, im.type, im.type,
                  int(value[0]), &algo) != CUBLAS_STATUS_SUCCESS)
    return std::nullopt;
  for (size_t i = 1; i < std::size(kConfigFields); ++i)  // the id is set by the init
    if (a.algo_set(&algo, kConfigFields[i].attr, &value[i], kConfigFields[i].bytes) !=
        CUBLAS_STATUS_SUCCESS)
      return std::nullopt;
  std::optional<GemmAlgo> g = check_algo(&algo, -1);
  // cuBLASLt may normalise what it was given; only the very configuration is the recorded one.
  if (g && g->config != config) return std::nullopt;
  return g;
}

std::vector<GemmAlgo> GemmPlan::variants(const std::vector<GemmAlgo>& base, int max_count) const {
  const Impl& im = *impl_;
  const LtApi& a = *im.api;
  std::vector<GemmAlgo> out;
  std::vector<std::string> seen;
  for (const GemmAlgo& b : base) seen.push_back(b.config);
  // A variant counts when cuBLASLt accepts it, it is new and the list has room.
  auto add = [&](const cublasLtMatmulAlgo_t& algo) {
    if (int(out.size()) >= max_count) return;
    std::optional<GemmAlgo> g = check_algo(&algo, int(base.size() + out.size()));
    if (!g) return;
    for (const std::string& c : seen)
      if (c == g->config) return;
    seen.push_back(g->config);
    out.push_back(std::move(*g));
  };
  auto with = [&](cublasLtMatmulAlgo_t algo, cublasLtMatmulAlgoConfigAttributes_t attr,
                  const auto& v) -> std::optional<cublasLtMatmulAlgo_t> {
    if (a.algo_set(&algo, attr, &v, sizeof v) != CUBLAS_STATUS_SUCCESS) return std::nullopt;
    return algo;
  };
  // Tiles: every other tile the heuristic's first algorithm supports, into half the list at
  // first (bfloat16 GEMMs on the H100 offer 40 and more: split-K was never reached), the rest
  // after the split-K variants where room is left.
  std::vector<cublasLtMatmulAlgo_t> tile_algos;
  if (!base.empty()) {
    cublasLtMatmulAlgo_t first;
    std::memcpy(&first, base[0].opaque, sizeof first);
    size_t bytes = 0;
    if (a.algo_cap(&first, CUBLASLT_ALGO_CAP_TILE_IDS, nullptr, 0, &bytes) == CUBLAS_STATUS_SUCCESS &&
        bytes >= sizeof(uint32_t) && bytes <= 4096) {
      std::vector<uint32_t> tiles(bytes / sizeof(uint32_t));
      size_t written = 0;
      if (a.algo_cap(&first, CUBLASLT_ALGO_CAP_TILE_IDS, tiles.data(), bytes, &written) ==
          CUBLAS_STATUS_SUCCESS)
        for (uint32_t t : tiles)
          if (auto v = with(first, CUBLASLT_ALGO_CONFIG_TILE_ID, t)) tile_algos.push_back(*v);
    }
  }
  size_t tiles_taken = 0;
  for (; tiles_taken < tile_algos.size() && int(out.size()) < max_count / 2; ++tiles_taken)
    add(tile_algos[tiles_taken]);
  // Split-K of the heuristic's first two algorithms, float32 partial sums first.
  constexpr int32_t kSplits[] = {2, 3, 4, 6, 8, 12, 16};
  constexpr uint32_t kSchemes[] = {CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE,
                                   CUBLASLT_REDUCTION_SCHEME_INPLACE,
                                   CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE};
  for (size_t i = 0; i < base.size() && i < 2; ++i) {
    cublasLtMatmulAlgo_t algo;
    std::memcpy(&algo, base[i].opaque, sizeof algo);
    int32_t splitk_ok = 0;
    uint32_t mask = 0;
    size_t w = 0;
    if (a.algo_cap(&algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk_ok, sizeof splitk_ok, &w) !=
            CUBLAS_STATUS_SUCCESS || !splitk_ok)
      continue;
    if (a.algo_cap(&algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &mask, sizeof mask, &w) !=
        CUBLAS_STATUS_SUCCESS)
      continue;
    for (int32_t k : kSplits) {
      if (desc_.k / k < 32) break;
      for (uint32_t scheme : kSchemes) {
        if (!(mask & scheme)) continue;
        auto v = with(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, k);
        if (v) v = with(*v, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, scheme);
        if (v) add(*v);
      }
    }
  }
  for (; tiles_taken < tile_algos.size(); ++tiles_taken) add(tile_algos[tiles_taken]);
  return out;
}

void GemmPlan::set_algo(const GemmAlgo& algo) {
  if (algo.workspace_bytes > max_workspace_bytes_)
    fail("{}: the algorithm needs {} bytes of workspace, more than the plan's limit {}",
         describe(), algo.workspace_bytes, max_workspace_bytes_);
  algo_ = algo;
}

void GemmPlan::run(const GemmArgs& args) const { run(args, algo_); }

void GemmPlan::run(const GemmArgs& args, const GemmAlgo& algo) const {
  const Impl& im = *impl_;
  const LtApi& a = *im.api;
  const GemmDesc& g = desc_;
  auto check_ptr = [&](const void* p, const char* name) {
    if (!p) fail("{}: the {} pointer is null", describe(), name);
    if (reinterpret_cast<uintptr_t>(p) % uintptr_t(g.alignment_bytes) != 0)
      fail("{}: the {} pointer {} is not {}-byte aligned as the plan was built for", describe(),
           name, p, g.alignment_bytes);
  };
  check_ptr(args.a, "A");
  check_ptr(args.b, "B");
  check_ptr(args.d, "D");
  if (g.beta != 0) {
    check_ptr(args.c, "C");
    if (args.c == args.d && (g.ldc != g.ldd || g.stride_c != g.stride_d))
      fail("{}: C is D (in place) but their row or batch strides differ", describe());
  }
  const bool has_bias = gemm_epilogue_has_bias(g.epilogue);
  if (has_bias) check_ptr(args.bias, "bias");
  if (args.workspace_bytes < algo.workspace_bytes)
    fail("{}: the algorithm needs {} bytes of workspace, {} given", describe(),
         algo.workspace_bytes, args.workspace_bytes);
  if (algo.workspace_bytes > 0 && !args.workspace)
    fail("{}: the workspace pointer is null ({} bytes needed)", describe(), algo.workspace_bytes);

  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != g.device)
    check_cuda(cudaSetDevice(g.device), describe().c_str());
  cublasLtMatmulAlgo_t lt_algo;
  std::memcpy(&lt_algo, algo.opaque, sizeof lt_algo);
  const float alpha = g.alpha, beta = g.beta;
  // C defaults to D when unused (beta = 0): cuBLASLt reads no C then, but wants a valid pointer.
  const void* c = g.beta != 0 ? args.c : args.d;
  cublasStatus_t s;
  {
    std::lock_guard<std::mutex> lock(im.mu);
    if (has_bias) {
      s = a.matmul_desc_set(im.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &args.bias,
                            sizeof args.bias);
      if (s != CUBLAS_STATUS_SUCCESS)
        fail_kind(ErrorKind::Runtime, "{}: setting the bias pointer failed: {}", describe(),
                  status_text(a, s));
    }
    // cuBLASLt's A is Kiln's B and vice versa (Note [Row-major GEMM on cuBLASLt]).
    s = a.matmul(im.handle, im.op, &alpha, args.b, im.a, args.a, im.b, &beta, c, im.c, args.d,
                 im.d, &lt_algo, args.workspace, args.workspace_bytes,
                 static_cast<cudaStream_t>(args.stream));
  }
  if (s != CUBLAS_STATUS_SUCCESS)
    fail_kind(ErrorKind::Runtime, "{} (cuBLASLt algorithm {}): cublasLtMatmul failed: {}",
              describe(), algo.index, status_text(a, s));
}

}  // namespace kiln::cuda
