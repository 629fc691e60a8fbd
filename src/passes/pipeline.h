// The pass pipelines, in one place (pipeline.cc holds the table of passes in pipeline order).
//
//   - default_pipeline() (pass.h): the inference passes, as `kiln opt --passes=default` runs them;
//   - compiler_pipeline(ops): what the compiler runs before choosing kernels: the default
//     pipeline, then `decompose` of `ops` (the composite ops a target does not run whole, e.g.
//     batch_norm and group_norm into pointwise ops and reductions the loop code fuses), then
//     constant-fold, cse and dce to clean up what the decompositions made. With a `precision`
//     other than float32 (bfloat16, float16), autocast to it (passes/autocast.h) runs after the
//     default pipeline and before the decompositions: autocast_pipeline(precision). A target's
//     own passes (`target_passes`, names in the table: Target::graph_passes) run after the
//     default pipeline, before autocast; its `precision_passes` (Target::precision_graph_passes)
//     after autocast, before the decompositions;
//   - autocast_pipeline(precision): nothing for float32; else autocast to `precision`, then
//     algebraic-simplify, cse, dce (the eager backend runs this alone).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "passes/pass.h"

namespace kiln {

std::vector<std::unique_ptr<Pass>> autocast_pipeline(DType precision);
// `keep_node`: the nodes of `decompose`'s ops to keep whole (DecomposeOptions::keep_node).
std::vector<std::unique_ptr<Pass>> compiler_pipeline(
    const std::vector<OpId>& decompose, DType precision = DType::Float32,
    std::function<bool(const Graph&, const Node&)> keep_node = {},
    const std::vector<std::string>& target_passes = {},
    const std::vector<std::string>& precision_passes = {});

}  // namespace kiln
