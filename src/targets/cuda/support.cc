// The CUDA target's support table (support.h): one row per op of ops.def.
#include "targets/cuda/support.h"

namespace kiln::cuda {

namespace {
using compiler::OpSupport;
constexpr OpSupport kPointwise{true, false, false, "CUDA C pointwise kernel (NVRTC), fused with neighbouring pointwise ops"};
constexpr OpSupport kReduce{true, false, false, "block-per-row reduction kernel with fused prologue and epilogue, warp shuffles, no atomics"};
constexpr OpSupport kNorm{true, false, false, "block-per-row norm kernel (float statistics) with fused prologue and epilogue"};
constexpr OpSupport kConv{false, true, false, "cuDNN graph (channels-last between half-precision convolutions, else NCHW), bias fused where an engine takes it; float64: a direct CUDA kernel"};
constexpr OpSupport kFusedConv{false, true, false, "cuDNN graph with bias, residual and relu fused where an engine takes them (else an epilogue kernel); other epilogues and float64: decomposed"};
constexpr OpSupport kGemm{false, true, false, "cuBLASLt (f32/f16/bf16; bias epilogue; batched with broadcast operands); float64, integers, partial batch broadcast, K = 0: a direct tiled CUDA GEMM kernel"};
constexpr OpSupport kPool{false, true, false, "direct CUDA kernel, sizes as literals"};
constexpr OpSupport kCopy{false, true, false, "direct CUDA copy kernel, sizes as literals"};
constexpr OpSupport kGather{false, true, false, "direct CUDA gather kernel (out-of-range ids give NaN)"};
constexpr OpSupport kAdaptivePool{true, true, false, "global average pooling as a reduction kernel; other sizes: a direct CUDA kernel"};
constexpr OpSupport kIndex{false, true, false, "direct CUDA kernel, sizes as literals (out-of-range indices give NaN / 0: Note [CUDA direct kernels])"};
constexpr OpSupport kScatter{false, true, false, "direct CUDA kernel, each output gathers its contributions in index order (deterministic, no atomics)"};
constexpr OpSupport kResample{false, true, false, "direct CUDA kernel, the reference's coordinate tables as literals"};
constexpr OpSupport kArg{false, true, false, "direct CUDA kernel, one thread per output (first index on ties, NaN wins)"};
constexpr OpSupport kAttention{false, true, false, "cuDNN fused flash attention (f16/bf16, no mask input); otherwise a flash-style direct CUDA kernel (online softmax in f32, any mask, broadcast batch dims); the score matrix is never stored"};
constexpr OpSupport kView{false, false, false, "a view: folded into the indexing of its readers"};
constexpr OpSupport kDecomposed{false, false, false, "decomposed by the compiler pipeline into ops this target runs"};

constexpr compiler::OpSupportTable kCuda = compiler::make_support_table({
    {OpId::Neg, kPointwise},
    {OpId::Abs, kPointwise},
    {OpId::Exp, kPointwise},
    {OpId::Log, kPointwise},
    {OpId::Sqrt, kPointwise},
    {OpId::Rsqrt, kPointwise},
    {OpId::Reciprocal, kPointwise},
    {OpId::Sigmoid, kPointwise},
    {OpId::Tanh, kPointwise},
    {OpId::Relu, kPointwise},
    {OpId::Gelu, kPointwise},
    {OpId::Silu, kPointwise},
    {OpId::Erf, kPointwise},
    {OpId::Sin, kPointwise},
    {OpId::Cos, kPointwise},
    {OpId::Floor, kPointwise},
    {OpId::Ceil, kPointwise},
    {OpId::Round, kPointwise},
    {OpId::Sign, kPointwise},
    {OpId::Not, kPointwise},
    {OpId::Clamp, kPointwise},
    {OpId::Cast, kPointwise},
    {OpId::Add, kPointwise},
    {OpId::Sub, kPointwise},
    {OpId::Mul, kPointwise},
    {OpId::Div, kPointwise},
    {OpId::Pow, kPointwise},
    {OpId::Maximum, kPointwise},
    {OpId::Minimum, kPointwise},
    {OpId::Eq, kPointwise},
    {OpId::Ne, kPointwise},
    {OpId::Lt, kPointwise},
    {OpId::Le, kPointwise},
    {OpId::Gt, kPointwise},
    {OpId::Ge, kPointwise},
    {OpId::And, kPointwise},
    {OpId::Or, kPointwise},
    {OpId::Where, kPointwise},
    {OpId::Sum, kReduce},
    {OpId::Mean, kReduce},
    {OpId::Max, kReduce},
    {OpId::Min, kReduce},
    {OpId::Prod, kReduce},
    {OpId::Var, kReduce},
    {OpId::Argmax, kArg},
    {OpId::Argmin, kArg},
    {OpId::Softmax, kNorm},
    {OpId::LogSoftmax, kNorm},
    {OpId::LayerNorm, kNorm},
    {OpId::BatchNorm, kDecomposed},
    {OpId::GroupNorm, kDecomposed},
    {OpId::Matmul, kGemm},
    {OpId::Linear, kGemm},
    {OpId::Conv2d, kConv},
    {OpId::ConvTranspose2d, kConv},
    {OpId::MaxPool2d, kPool},
    {OpId::AvgPool2d, kPool},
    {OpId::AdaptiveAvgPool2d, kAdaptivePool},
    {OpId::Reshape, kView},
    {OpId::Permute, kView},
    {OpId::Transpose, kView},
    {OpId::Expand, kView},
    {OpId::Squeeze, kView},
    {OpId::Unsqueeze, kView},
    {OpId::Flatten, kView},
    {OpId::Slice, kView},
    {OpId::Concat, kCopy},
    {OpId::Split, kCopy},
    {OpId::Pad, kCopy},
    {OpId::Copy, kPointwise},
    {OpId::Gather, kIndex},
    {OpId::IndexSelect, kGather},
    {OpId::Embedding, kGather},
    {OpId::ScatterAdd, kScatter},
    {OpId::ScaledDotProductAttention, kAttention},
    {OpId::Upsample, kResample},
    {OpId::GridSample, kResample},
    {OpId::FusedConv2d, kFusedConv},
    {OpId::FusedLinear, kDecomposed}});
}  // namespace

const compiler::OpSupportTable& cuda_support() { return kCuda; }

}  // namespace kiln::cuda
