// Shared by the fuzz harnesses (tests/fuzz/*_fuzz.cc). A harness returns normally for input
// that Kiln accepts or rejects with a kiln::Error; anything else (a sanitizer report, a crash,
// an exception of another type, a broken round trip) aborts and is a finding.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace kiln::fuzz {

// A property of accepted input did not hold: print what and abort (libFuzzer saves the input).
[[noreturn]] inline void finding(std::string_view what, std::string_view detail = {}) {
  std::fprintf(stderr, "FUZZ FINDING: %.*s\n%.*s\n", int(what.size()), what.data(),
               int(detail.size()), detail.data());
  std::abort();
}

}  // namespace kiln::fuzz
