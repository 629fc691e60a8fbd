// one-window-conv-to-linear: a convolution whose one window covers its whole input (SE blocks'
// 1x1 convolutions of a pooled [N, C, 1, 1] map, a classifier written as a convolution) is a
// linear of the flattened input.
//
//   y = conv2d(x [N, C, H, W], w [O, C, H, W], b)   groups 1, no padding, dilation 1, any stride
//     -> y = reshape(linear(reshape(x, [N, C * H * W]), w' [O, C * H * W], b), [N, O, 1, 1])
//
// x's rows and w's rows flatten in the same (c, i, j) order, so each output is the same sum of
// products as the convolution's. The convolution libraries spend most of such a call outside
// the arithmetic: oneDNN took 20 us for SSDlite's 24 -> 72 squeeze-excite convolution at one
// thread (38x its floor, the worst kernel of the broad set), while as a linear it is a
// generated reduction that fuses with its activation (Note [reduction rows]).
//
// A weight with data (param or const) becomes a param (const) of its own, named
// `<weight>.rows`, as patch-conv-to-linear's (replace-weights derives it again from new
// weights); any other weight is read through a reshape.
//
// Expects: a valid graph; run after fold-conv-bn (a batch norm after the convolution folds into
// it first) and before fuse-epilogues (which then fuses the activation into the linear).
// Guarantees: no conv2d of the form above with concrete shapes remains; the new nodes keep the
// convolution's name and provenance, y keeps its output value's name.
#pragma once
#include <memory>

#include "passes/pass.h"

namespace kiln {

std::unique_ptr<Pass> make_one_window_conv_to_linear_pass();

// The number of convolutions rewritten.
int one_window_conv_to_linear(Graph& g);

}  // namespace kiln
