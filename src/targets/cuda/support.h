// What the CUDA target does with each op: one row per op of ops.def (compiler/target.h's
// OpSupport), checked at compile time. `kiln ops --json` reports it as each op's "cuda" entry.
#pragma once
#include "compiler/target.h"

namespace kiln::cuda {

const compiler::OpSupportTable& cuda_support();

}  // namespace kiln::cuda
