// The fixed text at the top of every generated CPU translation unit (see prelude.cc).
#pragma once

namespace kiln::codegen {
const char* cpu_prelude();
}
