// default: the compiler's default pass pipeline as one pass, so that
// `kiln opt FILE --passes=default` runs what kiln::compile runs.
//
// The passes and their order are the entries of pipeline.cc's table marked "in the default
// pipeline" (default_pipeline() in pass.h); this pass only runs them through run_passes, so each
// is verified after it runs and KILN_DUMP_IR writes its result (NN-<pass>.kir; an outer
// run_passes then also writes NN-default.kir).
//
// Expects: a valid graph. Guarantees: what the last pass of the pipeline guarantees (dce: no dead
// code), and those of the passes before it as far as later passes keep them.
#pragma once
#include <memory>

#include "passes/pass.h"

namespace kiln {

std::unique_ptr<Pass> make_default_pipeline_pass();

}  // namespace kiln
