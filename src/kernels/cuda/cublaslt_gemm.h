// cuBLASLt GEMMs with fused epilogues, on Kiln's row-major tensors (Note [Row-major GEMM on
// cuBLASLt] in cublaslt_gemm.cc):
//
//   D[b] = act(alpha * op(A[b]) @ op(B[b]) + beta * C[b] + bias)      b < batch
//
// op(A) is [M, K] (A stored [M, K], or [K, M] with trans_a), op(B) is [K, N]; D and C are
// [M, N]; bias has N elements (one per output column, as linear's bias) and is shared by the
// batch. The residual enters through C with beta = 1.
//
//   cuda::GemmDesc d{.dtype = DType::BFloat16, .m = 64, .n = 768, .k = 3072,
//                    .epilogue = cuda::GemmEpilogue::BiasGelu};
//   auto plan = cuda::GemmPlan::create(d);             // top heuristic algorithm
//   plan->run({.a = x, .b = w, .d = y, .bias = b, .workspace = ws,
//              .workspace_bytes = plan->workspace_bytes(), .stream = s});
//
// cuBLASLt is loaded with dlopen on first use (libcublasLt.so.13), so binaries start and run
// CPU work where it is absent. No CUDA headers here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace kiln::cuda {

enum class GemmEpilogue : uint8_t { None, Bias, Relu, BiasRelu, Gelu, BiasGelu };
const char* gemm_epilogue_name(GemmEpilogue e);  // "bias_gelu"
bool gemm_epilogue_has_bias(GemmEpilogue e);

// Whether cuBLASLt's epilogue computes Kiln's op in its NaN behaviour (Kiln's relu propagates
// NaN: relu(NaN) = NaN). A max(x, 0) epilogue would map NaN to 0; the compiler fuses an epilogue
// only where this is true, else it runs the GEMM with Bias/None and a generated relu. Measured
// on cuBLASLt 13.0 (H200): every epilogue keeps NaN. tests/cuda/cuda_libs_test.cc checks the
// claim on every GPU run.
bool gemm_epilogue_nan_exact(GemmEpilogue e);
// cuBLASLt's GELU epilogue is the tanh approximation, 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))):
// it matches Kiln's gelu with approximate = "tanh", not the erf form.
inline constexpr bool kGemmGeluIsTanhApproximation = true;

struct GemmDesc {
  DType dtype = DType::Float32;  // A, B, C, D and bias: float32, float16 or bfloat16
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false;  // A stored [K, M]: op(A) = A^T
  bool trans_b = false;  // B stored [N, K]: op(B) = B^T
  // Row strides (elements between consecutive rows of the stored matrix); 0 = packed (the
  // stored matrix's column count). Columns are contiguous.
  int64_t lda = 0, ldb = 0, ldc = 0, ldd = 0;
  // Strided batch: `batch` products; batch strides in elements, -1 = packed (rows * ld). A and
  // B may have stride 0 (one matrix broadcast over the batch), so may C; D may not.
  int64_t batch = 1;
  int64_t stride_a = -1, stride_b = -1, stride_c = -1, stride_d = -1;
  float alpha = 1.0f;
  float beta = 0.0f;  // 1 with C = the residual; C may be D itself (in place)
  GemmEpilogue epilogue = GemmEpilogue::None;
  // float32 only: allow TF32 tensor cores (10-bit mantissa inputs). Off unless asked.
  bool allow_tf32 = false;
  // Alignment (bytes) the caller guarantees for A, B, C, D and bias pointers; algorithms
  // needing more are excluded, and run() checks it. At least the element size.
  int alignment_bytes = 16;
  int device = 0;
};

// One cuBLASLt algorithm for a plan, as the heuristic proposed it. `opaque` is the
// cublasLtMatmulAlgo_t bytes; `index` its rank in the heuristic's list (0 = best guess).
struct GemmAlgo {
  uint64_t opaque[8] = {};
  // Its configuration as text ("id.. tile.. stages.. ..."): what identifies it across processes
  // (Note [cuBLASLt algorithm identity] in cublaslt_gemm.cc); empty for one made from bytes.
  std::string config;
  size_t workspace_bytes = 0;  // what run() needs with this algorithm
  float waves = 0;             // cuBLASLt's device-utilization estimate
  int index = -1;
};

struct GemmArgs {
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;  // needed when beta != 0
  void* d = nullptr;
  const void* bias = nullptr;  // N elements of dtype, when the epilogue has a bias
  void* workspace = nullptr;   // caller-provided device memory
  size_t workspace_bytes = 0;  // its size: at least the algorithm's workspace_bytes
  void* stream = nullptr;      // cudaStream_t; nullptr = legacy default stream
};

class GemmPlan {
 public:
  // Validates `desc`, creates the cuBLASLt descriptors and asks the heuristic for algorithms
  // within `max_workspace_bytes`; selects the first. Throws InvalidArgument for bad shapes,
  // NotSupported when cuBLASLt (or a GPU) is missing or offers no algorithm, naming the GEMM.
  static std::unique_ptr<GemmPlan> create(const GemmDesc& desc,
                                          size_t max_workspace_bytes = size_t(32) << 20);
  // As create, with the algorithm of configuration text `config` (GemmAlgo::config) rebuilt and
  // checked (algo_from_config) instead of asking the heuristic: a package's load (Note [cuBLASLt
  // plans from their configuration] in cublaslt_gemm.cc). When cuBLASLt does not run that
  // configuration here, the heuristic's first algorithm is selected, as create does: the caller
  // compares algo().config with what it asked for.
  static std::unique_ptr<GemmPlan> create_with_config(
      const GemmDesc& desc, const std::string& config,
      size_t max_workspace_bytes = size_t(32) << 20);
  ~GemmPlan();
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;

  // Up to `max_count` candidates in heuristic order (for an autotuner to time); [0] is the
  // default choice.
  std::vector<GemmAlgo> candidates(int max_count = 8) const;
  // Configurations the heuristic does not list, derived from `base` (its candidates): other
  // tiles of the first, split-K of the first two; each checked by cuBLASLt for this GEMM and
  // within the workspace limit, none a repeat of `base`; at most `max_count` (Note [cuBLASLt
  // split-K and tile variants] in cublaslt_gemm.cc).
  std::vector<GemmAlgo> variants(const std::vector<GemmAlgo>& base, int max_count = 32) const;
  // The algorithm whose configuration text (GemmAlgo::config) is `config`, rebuilt and checked
  // for this GEMM; nullopt when the text is malformed or cuBLASLt does not run it here.
  std::optional<GemmAlgo> algo_from_config(const std::string& config) const;
  const GemmAlgo& algo() const { return algo_; }
  void set_algo(const GemmAlgo& algo);  // e.g. the autotuner's winner
  size_t workspace_bytes() const { return algo_.workspace_bytes; }
  const GemmDesc& desc() const { return desc_; }
  // "gemm bf16 64x768x3072 (A, B^T) batch 1 epilogue bias_gelu": for messages.
  std::string describe() const;

  // Enqueues the GEMM on args.stream. Throws kiln::Error naming the GEMM for a missing or
  // misaligned pointer, too small a workspace, or a cuBLASLt failure.
  void run(const GemmArgs& args) const;
  void run(const GemmArgs& args, const GemmAlgo& algo) const;  // with a candidate

 private:
  GemmPlan() = default;
  // Validates the descriptor and creates the cuBLASLt descriptors; no algorithm yet.
  static std::unique_ptr<GemmPlan> make(const GemmDesc& desc, size_t max_workspace_bytes);
  void select_first();  // the heuristic's first algorithm (NotSupported when there is none)
  // cublasLtMatmulAlgoCheck of a cublasLtMatmulAlgo_t: the algorithm as a GemmAlgo, or nullopt.
  std::optional<GemmAlgo> check_algo(const void* lt_algo, int index) const;
  struct Impl;
  GemmDesc desc_;
  GemmAlgo algo_;
  size_t max_workspace_bytes_ = 0;
  std::unique_ptr<Impl> impl_;
};

// True when cuBLASLt can be loaded (no GPU needed); `why` gets the reason when not.
bool cublaslt_available(std::string* why = nullptr);
// Opens cuBLASLt, makes device `device`'s handle and asks the heuristic once for a small GEMM of
// `dtype`: the first-use costs (Note [CUDA libraries opened ahead] in
// kernels/cuda/library_warm_up.h), paid ahead. Never throws: a failure is left to the real plans to report.
void cublaslt_warm_up(int device, DType dtype);

}  // namespace kiln::cuda
