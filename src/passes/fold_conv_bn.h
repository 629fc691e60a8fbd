// fold-conv-bn: fold inference batch norm into the convolution (or linear layer) before it.
//
//   y = batch_norm(conv2d(x, W, b), mean, var, gamma, beta, eps)      (conv output used only here)
//     -> conv2d(x, W', b')   with  s = gamma / sqrt(var + eps)           (gamma absent: 1)
//                                  W'[o, ...] = W[o, ...] * s[o]
//                                  b'[o] = (b[o] - mean[o]) * s[o] + beta[o]   (b, beta absent: 0)
//   y = batch_norm(linear(x, W, b), ...), linear output of rank 2 ([N, features], so batch norm's
//     channel dim 1 is the feature dim) -> linear(x, W', b') the same way.
//   y = batch_norm(reshape(linear(x, W, b)), ...), the reshape to rank 2 keeping the last dim (the
//     features) and used only there -> reshape(linear(x, W', b')) (BatchNorm1d over a flattened
//     [B, S, features] activation, Note [batch norm over a flattened linear]).
//
// W', b' are computed in float64 from the data of W, b, mean, var, gamma, beta (consts, or
// params: inference graphs freeze them) and stored in the conv's dtype, as new params when any
// source was a param (named `<W>.folded`, `<bias>.folded`) and as consts otherwise. The rewritten
// conv keeps the conv's provenance and output name; the batch norm's uses now read it.
//
// Skipped (left as is): a conv output with other uses, the conv's weight or any batch-norm
// input without data (IR text declares params by type only), symbolic channel counts.
//
// Expects: a valid graph; run after algebraic-simplify/constant-fold so that weight plumbing
// (casts, reshapes) is already folded. Guarantees: no batch_norm reads the sole use of a conv2d
// (or rank-2 linear) with foldable data. The old weights and statistics are left in place: run
// dce to drop them.
#pragma once
#include <memory>

#include "passes/pass.h"

namespace kiln {

std::unique_ptr<Pass> make_fold_conv_bn_pass();

struct FoldConvBnResult {
  int conv_folded = 0;
  int linear_folded = 0;
};
FoldConvBnResult fold_conv_bn(Graph& g);

}  // namespace kiln
