// What the CPU target does with each op: one row per op of ops.def (compiler/target.h's
// OpSupport), checked at compile time. `kiln ops --json` reports it as each op's "cpu" entry.
#pragma once
#include "compiler/target.h"

namespace kiln::cpu {

const compiler::OpSupportTable& cpu_support();

}  // namespace kiln::cpu
