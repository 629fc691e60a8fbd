// grid-sample-channels-last: a grid_sample's source stored channels-last, so that the CPU's
// generated kernel reads each tap as whole vectors of channels (Note [grid_sample channels-last]
// in targets/cpu/emitter.cc).
//
//   y_k = grid_sample(x [N, C, H, W], grid_k)          for every grid_sample reading x
//     -> xc = copy(permute(x, [0, 2, 3, 1]))           [N, H, W, C], stored once
//        y_k = grid_sample(permute(xc, [0, 3, 1, 2]), grid_k)   x's dims, channels innermost
//
// Taken where every such grid_sample is float32 and 4-D with concrete shapes, C is a multiple of
// 16 (whole vectors at both of the CPU's widths), the source has more than one pixel, and the
// outputs of the grid_samples reading x hold at least as many elements as x: the copy is one
// pass over x (a tiled transpose), and each output then costs a quarter of the vector loads the
// gathering form issues. DCN-style blocks (deform_sampling: nine grid_samples of a [64, 64, 64]
// map) qualify; a single small sample of a large image does not.
//
// Expects: a valid graph. Guarantees: every grid_sample output is the same value, computed from
// the same elements (a permutation is exact); values and names outside the inserted copy and
// views are unchanged.
#pragma once
#include <memory>

#include "passes/pass.h"

namespace kiln {

std::unique_ptr<Pass> make_grid_sample_channels_last_pass();

// The number of grid_sample sources given a channels-last copy.
int grid_sample_channels_last(Graph& g);

}  // namespace kiln
