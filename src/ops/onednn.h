// oneDNN-backed eager CPU kernels: convolution, deconvolution, pooling and matmul.
//
// Note [oneDNN eager kernels]
// Each entry point builds (or finds in a bounded LRU cache) a oneDNN primitive for the exact
// problem: op, dims, strides, dtypes and parameters form the key, so a repeated eager call skips
// descriptor creation. Memory descriptors are made from Tensor sizes and strides. Where the
// primitive prefers a blocked layout (convolution with format_tag::any), the cache entry also
// holds the reorders between the user's NCHW/OIHW tensors and that layout; the reordered
// buffers and oneDNN's scratchpad are carved from one thread-local scratch buffer, so a steady
// call allocates no tensor-sized memory. Entry points return false when oneDNN has no implementation for the
// case (dtype, shape); the caller then runs the reference kernel. dnnl.hpp is included only in
// onednn.cc to keep this header light.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace kiln::onednn {

// Whether oneDNN can run `dtype` on this CPU: float32 always; bfloat16 where the CPU has at
// least AVX-512 (oneDNN emulates bf16 arithmetic there, natively with AVX512_BF16/AMX).
bool supports_dtype(DType dtype);
// oneDNN's view of the host ISA, e.g. "avx512_core" (for logs and benchmark reports).
const char* cpu_isa_name();

// 2-D convolution geometry. Dilation is PyTorch's (1 = dense); padding may be asymmetric.
struct Conv2dParams {
  int64_t stride[2] = {1, 1};
  int64_t pad_begin[2] = {0, 0};  // top, left
  int64_t pad_end[2] = {0, 0};    // bottom, right
  int64_t dilation[2] = {1, 1};
  int64_t groups = 1;
};

// y = conv2d(x, w) + bias. x [N,C,H,W], w [O,C/groups,kh,kw], bias [O] or undefined, y
// preallocated [N,O,OH,OW] contiguous. Any input strides.
bool conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
            Tensor& y);
// Transposed convolution. w [C, O/groups, kh, kw] (PyTorch layout). The caller folds
// output_padding into pad_end (pad_end = padding - output_padding, which may be negative).
bool conv_transpose2d(const Tensor& x, const Tensor& w, const Tensor& bias,
                      const Conv2dParams& p, Tensor& y);

enum class PoolKind { Max, AvgIncludePad, AvgExcludePad };
struct Pool2dParams {
  PoolKind kind = PoolKind::Max;
  int64_t kernel[2] = {1, 1};
  int64_t stride[2] = {1, 1};
  int64_t pad_begin[2] = {0, 0};
  int64_t pad_end[2] = {0, 0};  // may exceed pad_begin (ceil_mode)
  int64_t dilation[2] = {1, 1};
};
bool pool2d(const Tensor& x, const Pool2dParams& p, Tensor& y);

// y[..., M, N] = a[..., M, K] @ b[..., K, N] (+ bias[N]). a, b and y have the same rank (>= 2);
// each batch dim of a and b equals y's or is 1 (broadcast). a and b may have any strides; y is
// contiguous. bias is undefined or 1-D [N] (any stride).
bool matmul(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& y);

// How convolution picks memory layouts. Blocked: src/weights/dst in format_tag::any, oneDNN
// chooses (blocked, e.g. nChw16c) and Kiln reorders to and from NCHW/OIHW on each call.
// Plain: the primitive runs on NCHW/OIHW directly. Auto (the default): per problem, by the rule
// in Note [Conv layout choice] (onednn.cc).
enum class ConvLayout { Auto, Blocked, Plain };
void set_conv_layout(ConvLayout layout);
ConvLayout conv_layout();

struct PrimitiveCacheStats {
  int64_t hits = 0;
  int64_t misses = 0;     // primitives created
  int64_t entries = 0;    // now cached
  int64_t capacity = 0;
  int64_t evictions = 0;
};
PrimitiveCacheStats primitive_cache_stats();
void clear_primitive_cache();  // also resets the counters
// Implementation name oneDNN chose for the most recent primitive created on this thread
// (e.g. "jit:avx512_core"); for tests and benchmark notes.
const char* last_impl_name();

}  // namespace kiln::onednn
