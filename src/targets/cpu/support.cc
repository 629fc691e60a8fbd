// The CPU target's support table (support.h). The loop bodies themselves live in the emitter
// (emitter.cc: expr_code, and the prelude's scalar and vector forms).
#include "targets/cpu/support.h"

namespace kiln::cpu {

namespace {
using compiler::OpSupport;
constexpr OpSupport kPointwise{true, false, true, "pointwise loop code (SIMD), fused with neighbouring pointwise ops"};
constexpr OpSupport kReduce{true, false, false, "reduction loop with fused pointwise prologue and epilogue"};
constexpr OpSupport kNorm{true, false, false, "two-pass norm kernel with fused prologue and epilogue"};
constexpr OpSupport kConv{false, true, false, "oneDNN primitive built at compile time; blocked layouts, post-ops"};
constexpr OpSupport kLinear{false, true, false, "oneDNN primitive with post-ops; small ones become a generated GEMV"};
constexpr OpSupport kPool{false, true, false, "oneDNN pooling primitive"};
constexpr OpSupport kGlobalPool{true, false, false, "global average pooling as a loop reduction; other sizes: eager kernel"};
constexpr OpSupport kView{false, false, false, "a view: folded into the strides of its readers"};
constexpr OpSupport kDecomposed{false, false, false, "decomposed by the compiler pipeline into ops that fuse"};
constexpr OpSupport kIndexed{true, false, false, "loop code reading the source at the index (scalar), fused with pointwise neighbours"};
constexpr OpSupport kScatter{true, false, false, "scatter loop kernel: parallel over the dims that cannot collide, in index order along dim"};
constexpr OpSupport kConcat{false, true, false, "oneDNN concat of convolution outputs along the channels (their layout kept); else a byte copy of each part"};
constexpr OpSupport kEager{false, false, false, "its eager kernel, bound inside the executable"};

constexpr compiler::OpSupportTable kCpu = compiler::make_support_table({
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
    {OpId::Argmax, kEager},
    {OpId::Argmin, kEager},
    {OpId::Softmax, kNorm},
    {OpId::LogSoftmax, kNorm},
    {OpId::LayerNorm, kNorm},
    {OpId::BatchNorm, kDecomposed},
    {OpId::GroupNorm, kDecomposed},
    {OpId::Matmul, kLinear},
    {OpId::Linear, kLinear},
    {OpId::Conv2d, kConv},
    {OpId::ConvTranspose2d, kConv},
    {OpId::MaxPool2d, kPool},
    {OpId::AvgPool2d, kPool},
    {OpId::AdaptiveAvgPool2d, kGlobalPool},
    {OpId::Reshape, kView},
    {OpId::Permute, kView},
    {OpId::Transpose, kView},
    {OpId::Expand, kView},
    {OpId::Squeeze, kView},
    {OpId::Unsqueeze, kView},
    {OpId::Flatten, kView},
    {OpId::Slice, kView},
    {OpId::Concat, kConcat},
    {OpId::Split, kEager},
    {OpId::Pad, kEager},
    {OpId::Copy, kPointwise},
    {OpId::Gather, kIndexed},
    {OpId::IndexSelect, kIndexed},
    {OpId::Embedding, kIndexed},
    {OpId::ScatterAdd, kScatter},
    {OpId::ScaledDotProductAttention, kDecomposed},
    {OpId::Upsample, kEager},
    {OpId::GridSample, kIndexed},
    {OpId::FusedConv2d, kConv},
    {OpId::FusedLinear, kLinear}});
}  // namespace

const compiler::OpSupportTable& cpu_support() { return kCpu; }

}  // namespace kiln::cpu
