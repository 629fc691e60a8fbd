// cuDNN convolutions for the CUDA target: conv2d forward and conv_transpose2d (as cuDNN's
// backward-data convolution), with bias, residual add and relu fused into the cuDNN graph
// where an engine supports it (Note [cuDNN backend API] in cudnn_backend.cc):
//
//   y = relu?( conv(x, w) + bias? + residual? )
//
//   cuda::ConvDesc d{.dtype = DType::Float16, .layout = cuda::ConvLayout::NHWC, .n = 1,
//                    .c_in = 64, .h = 56, .w = 56, .c_out = 64, .kh = 3, .kw = 3,
//                    .pad_pre = {1, 1}, .pad_post = {1, 1}, .bias = true, .relu = true};
//   std::string why;
//   if (auto plan = cuda::ConvPlan::try_create(d, &why)) {
//     plan->run({.x = x, .w = w, .y = y, .bias = b, .workspace = ws,
//                .workspace_bytes = plan->workspace_bytes(), .stream = s});
//   } else { /* conv alone (epilogue = none) + a generated epilogue kernel; `why` says why */ }
//
// Shapes (logical dims; memory order set by `layout`):
//   forward:   x [n, c_in, h, w], w [c_out, c_in/groups, kh, kw], y [n, c_out, oh, ow]
//   transpose: x [n, c_in, h, w], w [c_in, c_out/groups, kh, kw] (PyTorch's ConvTranspose2d
//              weight), y [n, c_out, oh, ow]
//   bias [c_out]; residual like y.
// NCHW: x, y, residual are NCHW and w is KCRS; NHWC: x, y, residual are NHWC and w is KRSC
// (channels last, [k][r][s][c] in memory).
// No cuDNN or CUDA headers here; cuDNN is loaded with dlopen on first use.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace kiln::cuda {

enum class ConvLayout : uint8_t { NCHW, NHWC };
enum class ConvKind : uint8_t { Forward, Transpose };

struct ConvDesc {
  ConvKind kind = ConvKind::Forward;
  DType dtype = DType::Float32;  // x, w, y, bias, residual: float32, float16 or bfloat16
  ConvLayout layout = ConvLayout::NCHW;
  int64_t n = 1, c_in = 0, h = 0, w = 0;
  int64_t c_out = 0, kh = 1, kw = 1;
  int64_t groups = 1;
  std::array<int64_t, 2> stride = {1, 1};
  std::array<int64_t, 2> pad_pre = {0, 0};   // top, left
  std::array<int64_t, 2> pad_post = {0, 0};  // bottom, right (asymmetric padding)
  std::array<int64_t, 2> dilation = {1, 1};
  std::array<int64_t, 2> output_padding = {0, 0};  // transpose only: extra rows/cols at the end
  bool bias = false;
  bool residual = false;
  bool relu = false;
  bool allow_tf32 = false;  // float32 only: TF32 tensor-core engines allowed
  int alignment_bytes = 16;  // guaranteed for every pointer; run() checks it
  int device = 0;
};

// The output's logical dims [n, c_out, oh, ow]; throws InvalidArgument for impossible shapes.
std::array<int64_t, 4> conv_output_dims(const ConvDesc& d);
// "conv2d f16 NHWC 1x64x56x56 -> 64 k3x3 s1x1 p1,1/1,1 d1x1 g1 +bias+relu": for messages.
std::string describe(const ConvDesc& d);

struct ConvEngine {
  std::string tag;  // cuDNN engine and knob choices: stable for one cuDNN version and GPU
  size_t workspace_bytes = 0;
  bool tensor_cores = false;
  int index = -1;  // position in candidates()
};

struct ConvArgs {
  const void* x = nullptr;
  const void* w = nullptr;
  void* y = nullptr;
  const void* bias = nullptr;      // when desc.bias
  const void* residual = nullptr;  // when desc.residual (may be y itself)
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  void* stream = nullptr;  // cudaStream_t; nullptr = legacy default stream
};

class ConvPlan {
 public:
  // Builds the cuDNN graph and its execution plans. Null (and *why_not) when cuDNN has no engine
  // for it (e.g. a fused epilogue no engine offers); throws InvalidArgument for bad shapes and
  // NotSupported when cuDNN or the GPU is missing.
  static std::unique_ptr<ConvPlan> try_create(const ConvDesc& desc, std::string* why_not);
  // As try_create, but a graph without an engine is a NotSupported error naming the conv.
  static std::unique_ptr<ConvPlan> create(const ConvDesc& desc);
  // The plan of engine `tag` restored from serialize()'s bytes (Note [Serialized cuDNN plans]
  // in cudnn_backend.cc): no graph, heuristics or kernel compile, one candidate. Null with
  // *why_not when cuDNN refuses the bytes (another cuDNN or GPU); the caller builds instead.
  static std::unique_ptr<ConvPlan> try_restore(const ConvDesc& desc, const std::string& tag,
                                               const std::string& bytes, std::string* why_not);
  // The selected engine's plan as cuDNN serializes it; "" when it cannot (only runtime-fusion
  // engines serialize).
  std::string serialize() const;
  ~ConvPlan();
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;

  // Every engine configuration that builds, in heuristic order ([0] is the default choice).
  std::vector<ConvEngine> candidates() const;
  void select(int index);
  bool select_tag(const std::string& tag);  // false when this plan has no such candidate
  // Stores the selected engine's plan in the plan cache under its tag (Note [cuDNN plan cache]
  // in cudnn_backend.cc), so that a package pinning it restores it instead of building it.
  // select_tag does so for an engine it built; a choice made by select() (the autotuner's, a
  // workspace limit's) calls it. Nothing when the engine does not serialize or the cache is off.
  void keep() const;
  // Execution plans finalized so far (1 for a plan restored from the cache or bytes).
  size_t plans_finalized() const;
  const ConvEngine& engine() const { return selected_; }
  size_t workspace_bytes() const { return selected_.workspace_bytes; }
  const ConvDesc& desc() const { return desc_; }
  std::array<int64_t, 4> output_dims() const { return out_; }
  // Whether the fused relu propagates NaN like Kiln's relu (relu(NaN) = NaN). cuDNN documents
  // RELU_FWD only as max(x, 0); measured on the H200 (cuDNN 9.14, 2026-12-02) its half and
  // bfloat16 engines keep NaN. tests/cuda/cuda_libs_test.cc checks the claim on every
  // candidate engine of the GPU it runs on.
  static bool relu_nan_exact() { return true; }

  void run(const ConvArgs& args) const;

  struct Impl;

 private:
  ConvPlan() = default;
  // A plan restored from the cache (Note [cuDNN plan cache]) has one candidate; this builds its
  // graph, for the others.
  void ensure_built() const;
  ConvDesc desc_;
  std::array<int64_t, 4> out_{};
  mutable ConvEngine selected_;  // ensure_built re-indexes it
  std::unique_ptr<Impl> impl_;
};

// Whether cuDNN can run `desc` (with its fused epilogue) on this GPU; when false the caller runs
// the convolution with no epilogue and a separate epilogue kernel. `why_not` gets cuDNN's reason
// (or "no CUDA device ..." / "cuDNN 9 ... is needed": environments without cuDNN answer false
// rather than throw). Throws InvalidArgument for impossible shapes.
bool conv_fused_supported(const ConvDesc& desc, std::string* why_not = nullptr);

// Loads cuDNN and makes device `device`'s handle: the first-use costs, paid ahead (Note [CUDA
// libraries opened ahead] in kernels/cuda/library_warm_up.h). Never throws.
void cudnn_warm_up(int device);

}  // namespace kiln::cuda
