// The fixed text at the top of every generated CPU translation unit (see prelude.cc).
#pragma once
#include <string>

namespace kiln::cpu {
const std::string& cpu_prelude();
}
