// pointwise-deconv-to-conv: a transposed convolution with a 1x1 kernel and stride 1 is a
// convolution with the weight's per-group [in, out] blocks transposed.
//
//   y = conv_transpose2d(x [N, C, H, W], w [C, O/g, 1, 1], b)   stride 1, padding 0,
//                                                               output_padding 0, groups g
//     -> y = conv2d(x, w' [O, C/g, 1, 1], b)   w'[k * O/g + o, i] = w[k * C/g + i, o]
//
// Each output element is the same sum of products (over the group's input channels, in the same
// order) as the transposed convolution's. Libraries run a 1x1 convolution as a GEMM in the
// layout its neighbours computed in; their transposed convolutions are a separate, slower path:
// PointPillars' 1x1 64->128 deconvolution took oneDNN 1.25-1.9 ms at one thread (3.8-5.7x its
// roofline, behind reorders to and from NCHW). As a conv2d, a following batch_norm folds into
// it (fold-conv-bn) and its activation fuses (fuse-epilogues).
//
// A weight with data (param or const) becomes a param (const) of its own, named
// `<weight>.conv`, as matmul-to-linear makes W^T (replace-weights derives it again from new
// weights); any other weight is transposed through views.
//
// Expects: a valid graph. Guarantees: no conv_transpose2d of the form above with concrete
// weight shapes remains; the conv2d keeps the node's name, provenance and output value.
#pragma once
#include <memory>

#include "passes/pass.h"

namespace kiln {

std::unique_ptr<Pass> make_pointwise_deconv_to_conv_pass();

// The number of transposed convolutions rewritten.
int pointwise_deconv_to_conv(Graph& g);

}  // namespace kiln
