// Reading a CompileReport in tests.
//
//   std::string line = test::kernel_line(compiled->report(), "concat:fire ");
#pragma once
#include <string>

#include "compiler/compile.h"

namespace kiln::test {

// The report's first kernel line that starts with `prefix` ("<op>:<node> "), "" if none.
inline std::string kernel_line(const compiler::CompileReport& r, const std::string& prefix) {
  for (const std::string& k : r.kernels)
    if (k.rfind(prefix, 0) == 0) return k;
  return "";
}

}  // namespace kiln::test
