// The pass pipelines, in one place (pipeline.cc holds the table of passes in pipeline order).
//
//   - default_pipeline() (pass.h): the inference passes, as `kiln opt --passes=default` runs them;
//   - compiler_pipeline(ops): what the compiler runs before choosing kernels: the default
//     pipeline, then `decompose` of `ops` (the composite ops a target does not run whole, e.g.
//     batch_norm and group_norm into pointwise ops and reductions the loop code fuses), then
//     constant-fold, cse and dce to clean up what the decompositions made.
#pragma once
#include <memory>
#include <vector>

#include "passes/pass.h"

namespace kiln {

std::vector<std::unique_ptr<Pass>> compiler_pipeline(const std::vector<OpId>& decompose);

}  // namespace kiln
