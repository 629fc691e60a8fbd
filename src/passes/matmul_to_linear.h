// matmul-to-linear: a matmul by a constant matrix becomes a linear layer.
//
//   y = matmul(x, W)      W a float param or const of rank 2 [K, N] with data, x of rank >= 1
//     -> linear(x, W^T)   W^T [N, K] (linear's weight layout), the same values transposed
//
// Exporters write nn.Linear over a [B, S, E] or [L, B, E] activation as MatMul + Add (torch.onnx
// uses Gemm only for 2-D inputs). As a linear, the bias add and the activation after it fuse into
// the oneDNN call (fuse-epilogues: fused_linear with a bias and a post-op) instead of a loop
// kernel over the whole output, and fold-conv-bn can fold a batch norm into it. W^T is computed
// once here, stored as a new param when W was a param (named `<W>.t`) and as a const otherwise;
// two matmuls by one W share one W^T. The rewritten node keeps the matmul's provenance and output
// name.
//
// Skipped: integer matmuls (linear is float here), W without data (IR text params), symbolic
// or empty W, a W of rank other than 2 (a batch of matrices).
//
// Expects: a valid graph; run after constant-fold (weight plumbing folded) and before
// fold-conv-bn and fuse-epilogues. Guarantees: no matmul whose second operand is a 2-D float
// param or const with data. W itself is left in place: run dce to drop it.
#pragma once
#include <memory>

#include "passes/pass.h"

namespace kiln {

std::unique_ptr<Pass> make_matmul_to_linear_pass();

// The number of matmuls rewritten.
int matmul_to_linear(Graph& g);

}  // namespace kiln
