// patch-conv-to-linear: a convolution whose windows tile its input (a patch embedding) becomes
// one GEMM.
//
//   y = conv2d(x [N, C, H, W], w [O, C, kh, kw], b)   stride (kh, kw), no padding, dilation 1,
//                                                     groups 1, kh * kw > 1, H % kh = W % kw = 0
//     -> p = reshape(permute(reshape(x, [N, C, H/kh, kh, W/kw, kw]), [0, 2, 4, 1, 3, 5]),
//                    [N * H/kh * W/kw, C * kh * kw])          the patches, one row each (a copy)
//        y = permute(reshape(linear(p, reshape(w, [O, C * kh * kw]), b),
//                            [N, H/kh, W/kw, O]), [0, 3, 1, 2])   a view of the GEMM's output
//
// Each output element is the same sum of products (over c, i, j) as the convolution's. ViT's
// patch embedding (16x16 windows at stride 16 over 3 channels) is the case: cuDNN runs it as a
// 3-channel NCHW convolution at ~89 us on an H200 at batch 1 where the GEMM [196, 768] x
// [768, 768] takes ~9 us; and the [N, O, h, w] view it leaves is exactly what ViT's
// flatten(2).transpose(1, 2) reads as a contiguous [N, h * w, O] (the memory planner makes that
// reshape a view), so the only copy left is the patch gather. The weight is read through a
// reshape view (no copy: packages and --replace-weights keep the model's own weight).
//
// Not in the default pipeline: a target runs it through Target::graph_passes (CUDA does; on the
// CPU oneDNN's convolution takes these shapes directly).
//
// Expects: a valid graph; run after fuse-epilogues (a conv2d with a bias input, or the plain
// conv2d) and before autocast. Guarantees: no conv2d of the form above with concrete shapes
// remains; the new nodes keep the convolution's provenance, y keeps its output name.
#pragma once
#include <memory>

#include "passes/pass.h"

namespace kiln {

std::unique_ptr<Pass> make_patch_conv_to_linear_pass();

// The number of convolutions rewritten.
int patch_conv_to_linear(Graph& g);

}  // namespace kiln
