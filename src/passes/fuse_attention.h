// fuse-attention: attention written out as matmul, scale, mask and softmax (what ONNX exports
// and eager attention code give) becomes one scaled_dot_product_attention node.
//
// Note [attention fused from its parts]
// Models exported to ONNX carry attention as MatMul(q, kᵀ) -> Div or Mul by a constant -> Add of
// a mask -> Softmax over the keys -> MatMul with v: on CUDA four or five kernels a layer and the
// score matrix [..., L, S] written and read back (bert_base.onnx: 98 library launches and 101
// loop kernels a call, against the zoo model's one fused attention a layer). The pass matches
// that chain and writes
//   scaled_dot_product_attention(q, transpose(kᵀ, -2, -1), v, mask) {scale = c or 1/c}
// which is the same function (Note [SDPA semantics] in ops/attention.cc: softmax(q kᵀ scale +
// mask) v; a row whose every score is -inf is NaN in both), and on CUDA one fused kernel. k is a
// view of kᵀ, so attention reads it in place where the strides allow (Note [CUDA attention reads
// views]).
//
// Matched, over one dtype (float16, bfloat16, float32 or float64), each intermediate used once:
//   s = matmul(q', kt)            q and kt of rank >= 2 (matmul's batch dims broadcast, as
//                                 attention's do); q' = q, or q times / divided by a scalar
//                                 constant c (a scale applied to the scores)
//   s' = s, s * c, or s / c        c a positive scalar constant (numel 1)
//   s'' = s', or s' + mask        a float mask of the dtype, broadcast to s' (the sum has s'
//                                 shape)
//   p = softmax(s'', dim = -1)
//   o = matmul(p, v)              v of rank >= 2
// Scales multiply into one (1 when there is none); a non-positive or non-finite scale leaves the
// chain alone. A scale by a weight (a one-element param, which replace-weights may change) stays
// an op: on q as it was; on kT (torch's export scales q and kT by sqrt(scale) each) moved after
// k's transpose, kT * a -> transpose(kT) * a, so that k comes out of it contiguous; on the scores
// (a Div by an ONNX initializer, which the importer makes a weight) moved to q:
// (q kT) / b -> (q / b) kT. Masks applied with `where` (masked_fill) are not matched:
// `where(c, s, min)` is not `s + mask` for every s.
//
// Not in the default pipeline: the CUDA target runs it through Target::graph_passes (before
// attention-heads-last, which then applies to the fused node), where attention is one kernel.
// The CPU target decomposes attention again, so it would gain nothing there.
// Expects: a valid graph. Guarantees: no matched chain is left.
#pragma once
#include <memory>

#include "passes/pass.h"

namespace kiln {

std::unique_ptr<Pass> make_fuse_attention_pass();

// The number of attention chains fused.
int fuse_attention(Graph& g);

}  // namespace kiln
