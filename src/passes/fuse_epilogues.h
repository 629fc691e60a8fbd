// fuse-epilogues: recognize conv2d / linear followed by bias, residual and activation, and
// replace each such chain by one fused_conv2d / fused_linear node (Note [Fused epilogues] in
// src/ops/fused.cc), which the CPU backend maps to oneDNN post-ops.
//
// Anchors (kAnchors):       conv2d -> fused_conv2d,  linear -> fused_linear   (floating dtypes)
// Epilogue steps (kSteps), each optional, in this order, each reading the previous result y,
// which must have no other use (and not be a graph output):
//   add(y, b) | add(b, y), anchor without bias, b of shape [C] (linear: [C]; conv2d: [C], [C,1,1]
//       or [1,C,1,1]), y's dtype                    -> bias = b (reshaped to [C] if needed)
//   add(y, r) | add(r, y), r of exactly y's type    -> residual = r, sum_scale = 1
//   sub(y, r), r of exactly y's type                -> residual = r, sum_scale = -1
//   relu | gelu | gelu{approximate=tanh} | silu | sigmoid | tanh | clamp (y)
//                                                   -> activation (clamp: clamp_min/clamp_max)
// A chain of the anchor alone is left as it is. When both operands of an add are anchors
// (ResNet's downsample: conv + conv), the earlier anchor takes the add and the other output is
// its residual. The fused node sits where the chain's last node was (all its inputs are defined
// there), keeps the anchor's provenance (loc) and takes the last node's output name.
//
// Expects: a valid graph; run after fold-conv-bn (a batch norm between conv and relu blocks the
// chain) and cse; dead users (left by earlier passes) do not count as uses. Guarantees: no
// conv2d/linear whose sole use is a fusible epilogue step remains. The replaced nodes are
// removed (nothing is left for dce).
#pragma once
#include <memory>

#include "passes/pass.h"

namespace kiln {

std::unique_ptr<Pass> make_fuse_epilogues_pass();

struct FuseEpiloguesResult {
  int conv_fused = 0;    // fused_conv2d nodes made
  int linear_fused = 0;  // fused_linear nodes made
  int bias_adds = 0;     // epilogue nodes absorbed, by kind
  int residual_adds = 0;
  int activations = 0;
};
FuseEpiloguesResult fuse_epilogues(Graph& g);

}  // namespace kiln
