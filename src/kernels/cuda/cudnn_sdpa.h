// Fused attention through cuDNN (flash attention, the score matrix never materialised):
//
//   o[b,h] = softmax(q[b,h] @ k[b,h]^T * scale + mask[b,h]) @ v[b,h]
//
// q [B, H, Sq, D], k [B, H, Skv, D], v [B, H, Skv, Dv], o [B, H, Sq, Dv], each with its own
// strides (the last dim contiguous); float16 or bfloat16 with float32 softmax. Options: causal
// (row i attends columns j <= i, top-left aligned as Kiln and PyTorch define it) or an additive
// mask of the I/O dtype, [B or 1, H or 1, Sq, Skv]. A boolean mask is converted by the caller
// (true -> 0, false -> -inf).
//
//   cuda::SdpaDesc d{.dtype = DType::BFloat16, .batch = 2, .heads = 12, .seq_q = 197,
//                    .seq_kv = 197, .head_dim = 64};
//   cuda::SdpaSupport s = cuda::sdpa_supported(d);
//   if (s.supported) { auto plan = cuda::SdpaPlan::create(d); plan->run({...}); }
//   else { /* generated kernels or the decomposition; s.reason says why */ }
//
// What cuDNN cannot take comes back as "not supported" with a reason, never as an error: float32
// (no fused engine), head dims that are not multiples of 8 or above 128 (256 on sm_90 with
// cuDNN 9.x when the engine takes it), GPUs before sm_80, masks of other shapes. No cuDNN or
// CUDA headers here.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace kiln::cuda {

struct SdpaDesc {
  DType dtype = DType::Float16;
  int64_t batch = 1, heads = 1, seq_q = 0, seq_kv = 0, head_dim = 0;
  int64_t head_dim_v = 0;  // 0: head_dim
  // Strides in elements, [B, H, S, D] order; all zero = contiguous [B, H, S, D]. The last
  // stride must be 1.
  std::array<int64_t, 4> q_stride = {}, k_stride = {}, v_stride = {}, o_stride = {};
  double scale = 0;  // 0: 1 / sqrt(head_dim)
  bool causal = false;
  bool mask = false;  // additive mask, contiguous [mask_batch, mask_heads, Sq, Skv]
  int64_t mask_batch = 1;  // 1 or batch
  int64_t mask_heads = 1;  // 1 or heads
  int alignment_bytes = 16;
  int device = 0;
};

struct SdpaSupport {
  bool supported = false;
  std::string reason;  // why not (empty when supported)
};

// Static checks, then cuDNN itself is asked (graph + engines) on the GPU. Never throws for an
// unsupported configuration or environment (no GPU, no cuDNN: supported = false with the
// reason); throws InvalidArgument for inconsistent shapes.
SdpaSupport sdpa_supported(const SdpaDesc& desc);
std::string describe(const SdpaDesc& d);

// Whether a row whose every score is masked (-inf) comes out NaN, as Kiln's reference (and
// PyTorch's math path) defines it. cuDNN's flash kernels guard the row maximum, so Kiln assumes
// they do not; the compiler uses the cuDNN path for explicit masks only where no row can be
// fully masked (causal masks never fully mask a row). Checked on the GPU by the tests.
bool sdpa_fully_masked_row_is_nan();

struct SdpaArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* mask = nullptr;  // when desc.mask
  void* o = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  void* stream = nullptr;  // cudaStream_t; nullptr = legacy default stream
};

struct SdpaEngine {
  std::string tag;
  size_t workspace_bytes = 0;
  int index = -1;
};

class SdpaPlan {
 public:
  // Null with *why_not when not supported (as sdpa_supported).
  static std::unique_ptr<SdpaPlan> try_create(const SdpaDesc& desc, std::string* why_not);
  static std::unique_ptr<SdpaPlan> create(const SdpaDesc& desc);  // NotSupported when null
  // As ConvPlan::try_restore / serialize (Note [Serialized cuDNN plans] in cudnn_backend.cc);
  // the bytes also say which form of the graph the plan is (with statistics or not).
  static std::unique_ptr<SdpaPlan> try_restore(const SdpaDesc& desc, const std::string& tag,
                                               const std::string& bytes, std::string* why_not);
  std::string serialize() const;
  ~SdpaPlan();
  SdpaPlan(const SdpaPlan&) = delete;
  SdpaPlan& operator=(const SdpaPlan&) = delete;

  std::vector<SdpaEngine> candidates() const;
  void select(int index);
  // Selects the candidate with this tag (false when none has it), finalizing that one alone
  // where it is not yet (cudnn::GraphPlans::find_tag).
  bool select_tag(const std::string& tag);
  // As ConvPlan::keep and ConvPlan::plans_finalized.
  void keep() const;
  size_t plans_finalized() const;
  const SdpaEngine& engine() const { return selected_; }
  size_t workspace_bytes() const { return selected_.workspace_bytes; }
  const SdpaDesc& desc() const { return desc_; }

  void run(const SdpaArgs& args) const;

  struct Impl;

 private:
  SdpaPlan() = default;
  // The plan's descriptor, scale and cache key; no graph and no plan yet.
  static std::unique_ptr<SdpaPlan> blank(const SdpaDesc& desc);
  // A plan restored from the cache (Note [cuDNN plan cache]) has one candidate; this builds its
  // graph, for the others.
  void ensure_built() const;
  SdpaDesc desc_;
  mutable SdpaEngine selected_;  // ensure_built re-indexes it
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::cuda
