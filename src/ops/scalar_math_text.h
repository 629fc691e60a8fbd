// The text of ops/scalar_math.h, for code generators that put it at the top of generated
// sources (the CPU prelude, NVRTC programs). Built from the header by CMake
// (cmake/embed_text.cc.in), so the text and the header compiled into Kiln never differ.
#pragma once

namespace kiln {
const char* scalar_math_text();
}
