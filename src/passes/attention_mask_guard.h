// attention-mask-guard: an additive attention mask computed at run time is rewritten so that a
// row it masks whole reads NaN, and materialized as [batch or 1, heads or 1, L, S]: the form
// that cuDNN's fused attention takes with Kiln's semantics (Note [guarded attention masks]).
//
// Note [guarded attention masks]
// Kiln (like PyTorch's math path) defines a row of attention whose every score is -inf as NaN
// (Note [SDPA semantics] in ops/attention.cc). cuDNN's flash kernels guard the row maximum and
// give such a row 0 (sdpa_fully_masked_row_is_nan() in kernels/cuda/cudnn_sdpa.h), so attention
// with an explicit mask ran on Kiln's direct kernel: BERT's padding mask, [B, 1, 1, S] of
// (1 - mask) * float32 lowest, which is -inf once cast to bfloat16, so an all-zero mask row
// masks its rows whole. The direct kernel took ~9 us a layer inside BERT-base's CUDA graph
// against cuDNN's ~5.
//
// A row of scores is all -inf exactly when its mask row is all -inf (q and k finite; attention
// without a mask makes the same assumption of cuDNN), and a NaN anywhere in a row's mask makes
// the row NaN in both. So the mask m becomes
//   g = where(expand(eq(max(m, dims=[-1], keepdim), -inf), shape), NaN, m)
// and g's NaN rows give NaN rows through cuDNN too (checked on the GPU:
// CudnnSdpa.ANaNMaskRowIsANaNRow). The result equals the reference on every mask: a row not
// masked whole keeps its numbers, one masked whole is NaN either way. `shape` is the scores'
// rows and heads (and the batch only where the mask has one), so where's output is the
// contiguous tensor cuDNN reads: BERT-base's [1, 1, 128, 128] bfloat16, 32 KB, made once a call
// by two small kernels (the row maximum with the mask's own arithmetic fused in, then the
// select) for all 12 layers.
//
// Rewritten: scaled_dot_product_attention in float16 or bfloat16 (the dtypes cuDNN fuses) with a
// mask of its dtype or a bool mask (made additive first: where(mask, 0, -inf), the reference's
// reading of it), q, k and v of one batch shape, concrete shapes. Masks that are
// already guarded are left alone (the pass is idempotent); one guard per distinct mask and shape.
// A mask that depends on no graph input folds into a constant afterwards (constant-fold): the
// CUDA target then checks the constant's rows itself.
//
// Not in the default pipeline: the CUDA target runs it after autocast (Target::
// precision_graph_passes), where the mask has the dtype attention reads. Expects: a valid graph.
// Guarantees: every rewritten attention's mask is a guarded_attention_mask.
#pragma once
#include <memory>

#include "passes/pass.h"

namespace kiln {

std::unique_ptr<Pass> make_attention_mask_guard_pass();

// The number of attention nodes whose mask was rewritten.
int attention_mask_guard(Graph& g);

// Whether value `mask` of g is the output of the guard above (where([expand](eq(max(x), -inf)),
// NaN, x), every constant checked): a mask whose rows masked whole read NaN, whatever values x
// takes at run time.
bool guarded_attention_mask(const Graph& g, ValueId mask);

}  // namespace kiln
