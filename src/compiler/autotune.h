// max-autotune for every target: candidates, interleaved timing rounds, the accuracy gate and
// the tuning store. See Note [autotuning] in autotune.cc.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "compiler/compile.h"
#include "compiler/target.h"
#include "runtime/executable.h"

namespace kiln::compiler {

// One compiled configuration.
struct Built {
  std::shared_ptr<Executable> exe;
  CompileReport report;
  std::vector<TunableLaunch> tunable;
};
using BuildFn = std::function<Built(const Knobs&)>;

// Runs the search for `graph` on `target`, building candidates with `build`; the result's
// report says what was chosen and why (CompileReport::autotune).
Built autotune(const Graph& graph, const Target& target, const Options& options,
               const BuildFn& build);

// Helpers for targets' own tuning of launch parameters, and for tests.
// Random inputs for `exe` (normal floats; small non-negative integers elsewhere).
TensorList random_inputs(const Executable& exe, uint64_t seed);
// max |a - b| / max |b| over all floating outputs (float64; NaN on one side counts as infinite).
double max_relative_error(const TensorList& a, const TensorList& b);
double median(std::vector<double> v);
// Median seconds per call of each executable over `rounds` rounds on `in`, interleaved: one call
// of every executable per round (after a warm-up round), so that a burst of load on the machine
// hits them all alike. `on_round(r)` runs before timed round r.
std::vector<double> time_interleaved(const std::vector<Executable*>& exes, const TensorList& in,
                                     int rounds, const std::function<void(int)>& on_round = {});

}  // namespace kiln::compiler
