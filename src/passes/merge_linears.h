// merge-sibling-linears: linear layers that read the same input become one linear whose output
// is split (horizontal fusion of GEMMs).
//
//   q = linear(x, Wq, bq); k = linear(x, Wk, bk); v = linear(x, Wv, bv)
//     -> qkv = linear(x, concat(Wq, Wk, Wv), concat(bq, bk, bv)); q, k, v = split(qkv, -1)
//
// BERT's self-attention projects one hidden state three times: at batch 1 each [128, 768] x
// [768, 768] GEMM is a few microseconds of launch and tile setup for a fraction of a
// microsecond of arithmetic, so one [128, 768] x [768, 2304] GEMM in their place saves two such
// calls per layer. Each output element is the same dot product as before. The split's pieces are
// slices of the merged output; on CUDA attention reads them in place (Note [CUDA attention reads
// views] in targets/cuda/target.cc), as it reads ViT's packed projection.
//
// Merged: plain linears (op linear) of one input value whose weights are float params or consts
// with data, of one dtype and input size, each with a bias of that kind or none of them with
// one, and whose output sizes are multiples of 8 (each piece starts 16-byte aligned in float16
// and bfloat16, as cuDNN requires). The merged weight and bias are params when every part was a
// param (named `<first weight>.merged`, `<first bias>.merged`), else consts; replace-weights
// derives them again from new weights by running the passes (as matmul-to-linear's W^T).
//
// Not in the default pipeline: a target runs it through Target::graph_passes (CUDA does).
// Expects: a valid graph, after fuse-epilogues. Guarantees: the merged linear takes the place of
// the first of its group; the split's outputs keep the original output names.
#pragma once
#include <memory>

#include "passes/pass.h"

namespace kiln {

std::unique_ptr<Pass> make_merge_sibling_linears_pass();

// The number of linears merged away (a group of three counts two).
int merge_sibling_linears(Graph& g);

}  // namespace kiln
