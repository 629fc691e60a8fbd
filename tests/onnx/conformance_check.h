// Shared by the conformance tests: every failed case must be a known failure failing for its
// documented reason, every known failure must still fail, and skips must come only from
// unmapped op types or value types Kiln cannot represent.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "../support/compare.h"
#include "frontends/onnx/conformance.h"

namespace kiln::test {

// The conformance runner's per-dtype rule (Note [Conformance]) on the tests' comparison helper
// (tests/support/compare.h): the same dtype, integers and bool exact, float64 within rtol
// min(rtol, 1e-7) and atol min(atol, 1e-12), the other floating dtypes within rtol / atol; the
// report names the worst element.
inline std::string compare_output(const Tensor& got, const Tensor& want, double rtol, double atol) {
  if (got.dtype() != want.dtype())
    return std::string("dtype ") + dtype_name(got.dtype()) + " (expected " +
           dtype_name(want.dtype()) + ")";
  const DType dt = want.dtype();
  Tolerance tol = !is_floating(dt)        ? Tolerance::exact()
                  : dt == DType::Float64 ? Tolerance::rel(std::min(rtol, 1e-7), std::min(atol, 1e-12))
                                         : Tolerance::rel(rtol, atol);
  Comparison c = compare(got, want, tol);
  if (c.ok()) return "";
  return c.problem.empty() ? "values differ: " + c.str() : c.str();
}

// Conformance options whose comparison is compare_output.
inline ConformanceOptions honest_conformance_options() {
  ConformanceOptions opts;
  opts.compare = compare_output;
  return opts;
}

// known: case ("suite/name") -> a substring its failure message must contain.
// unstable: cases whose expected data cannot be matched by any summation order but one (each
// with the reason it may fail): they may pass or fail, but a failure must be that one.
inline void expect_known_outcomes(const ConformanceReport& r,
                                  const std::map<std::string, std::string>& known,
                                  const std::map<std::string, std::string>& unstable = {}) {
  std::map<std::string, const ConformanceCase*> failed;
  for (const ConformanceCase& c : r.cases)
    if (c.status == CaseStatus::Failed) failed[c.suite + "/" + c.name] = &c;
  for (const auto& [name, c] : failed) {
    auto it = known.find(name);
    if (it == known.end()) it = unstable.find(name);
    if (it == unstable.end()) {
      ADD_FAILURE() << name << " failed: " << c->reason;
      continue;
    }
    EXPECT_NE(c->reason.find(it->second), std::string::npos)
        << name << " fails for another reason than the documented one ('" << it->second
        << "'): " << c->reason;
  }
  for (const auto& [name, why] : known)
    EXPECT_TRUE(failed.count(name)) << name << " no longer fails: remove it from the known failures";
  for (const ConformanceCase& c : r.cases) {
    if (c.status != CaseStatus::Skipped) continue;
    EXPECT_TRUE(!c.unmapped.empty() ||
                c.reason.find("types Kiln cannot represent") != std::string::npos)
        << c.suite << "/" << c.name << ": " << c.reason;
  }
}

}  // namespace kiln::test
