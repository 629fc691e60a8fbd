// Reading a CompileReport in tests.
//
//   std::string line = test::kernel_line(compiled->report(), "concat:fire ");
#pragma once
#include <string>

#include "compiler/compile.h"
#include "core/error.h"

namespace kiln::test {

// The report's first kernel line that starts with `prefix` ("<op>:<node> "), "" if none.
inline std::string kernel_line(const compiler::CompileReport& r, const std::string& prefix) {
  for (const std::string& k : r.kernels)
    if (k.rfind(prefix, 0) == 0) return k;
  return "";
}

// The text of the kiln::Error compiling g with `options` raises, or "(compiled without an
// error)" when it compiles: a refusal test asserts the text names what it refused.
inline std::string compile_error(const Graph& g, Device device, const compiler::Options& options) {
  try {
    compiler::compile(g, device, options);
  } catch (const Error& e) {
    return e.what();
  }
  return "(compiled without an error)";
}

}  // namespace kiln::test
