// The ONNX backend-test conformance runner behind `kiln conformance`. See Note [Conformance].
//
// Note [Conformance]
// A test case is a directory holding model.onnx and test_data_set_N/ folders of input_K.pb /
// output_K.pb TensorProtos (the layout of ONNX's backend tests: node, simple, pytorch-converted,
// pytorch-operator). Each case is imported and run on the eager backend (kiln::run, the
// interpreter) and every output compared with the expected one the way ONNX's backend test
// runner does by default — same dtype, same shape, |got - want| <= atol + rtol * |want| with
// rtol = 1e-3, atol = 1e-7, NaNs equal — except that integer and bool outputs must be exact
// and float64 ones within rtol 1e-7, atol 1e-12 (ONNX's runner holds every dtype to 1e-3).
// Kiln needs shape-like arguments (Reshape's shape, Slice's starts, Pad's pads, axes, ...) at
// import time. The node tests pass them as graph inputs; when an import reports that a graph
// input's value is needed at import time (ImportOptions::needed_constant_inputs), the runner
// binds that input to the data set's value (ImportOptions::constant_inputs) and imports again,
// once per data set: the model specialized to those values, as TensorRT does with shape
// tensors. Such cases list their specialized_inputs in the report.
// A case is SKIPPED only when it uses an op type that Kiln does not map, or a value type Kiln
// cannot represent (strings, sequences, optionals, maps, and element types outside Kiln's
// dtypes such as uint16 or complex64); the reason lists them. Everything else that does not
// pass is FAILED: import errors of mapped ops, wrong results, run-time errors, crashes.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln {

class Graph;

struct ConformanceOptions {
  // Directories to search: a case directory, a suite of cases, or a directory of suites.
  // Empty: default_conformance_dirs().
  std::vector<std::string> data_dirs;
  std::string filter;  // only cases whose suite/name contains this substring
  double rtol = 1e-3;
  double atol = 1e-7;
  // Run each case in a forked child so that a crash or hang fails only that case. The calling
  // process must not have started OpenMP threads (fork would leave the child's pool broken).
  bool isolate = false;
  double case_timeout_s = 120;  // isolate mode only
  // How a case's imported graph runs (null: the graph interpreter, i.e. eager). The CLI's
  // `--backend compiled` passes the CPU compiler through capture here.
  std::function<TensorList(const Graph& g, const TensorList& inputs)> runner;
  // How an output is compared with the expected one: "" when it matches, else what differs
  // (its message should say "values differ" for wrong values). Null: the built-in comparison
  // (the rules above, at rtol / atol). Kiln's tests pass their one comparison helper
  // (tests/onnx/conformance_check.h over tests/support/compare.h) with the same tolerances.
  std::function<std::string(const Tensor& got, const Tensor& want, double rtol, double atol)>
      compare;
  std::string backend = "eager";  // for reports
};

enum class CaseStatus { Passed, Failed, Skipped };
const char* case_status_name(CaseStatus s);

struct ConformanceCase {
  std::string suite;  // "node", "pytorch-converted", ... (the parent directory's name)
  std::string name;   // "test_abs"
  std::string dir;
  CaseStatus status = CaseStatus::Failed;
  std::string reason;  // why it failed or was skipped
  int64_t opset = 0;
  std::vector<std::string> op_types;  // ONNX op types the model uses
  std::vector<std::string> unmapped;  // op types Kiln does not map (skipped cases)
  std::vector<std::string> input_names;  // the model's graph inputs (not initializers)
  // Graph inputs bound to their test values at import time (see Note [Conformance]).
  std::vector<std::string> specialized_inputs;
  // Graph inputs whose test data has another shape than the model declares; the model is
  // imported with the data's shape (ImportOptions::input_shapes).
  std::vector<std::string> reshaped_inputs;
  int data_sets = 0;
  double seconds = 0;
};

struct ConformanceReport {
  std::vector<ConformanceCase> cases;
  int passed = 0, failed = 0, skipped = 0;
  std::vector<std::string> searched_dirs;
};

// The Debian libonnx-testdata suites that exist on this machine (node, simple,
// pytorch-converted, pytorch-operator).
std::vector<std::string> default_conformance_dirs();

// Finds the cases under `dirs` (sorted by suite, then name).
std::vector<ConformanceCase> discover_conformance_cases(const std::vector<std::string>& dirs,
                                                        const std::string& filter);

// Runs one case (fills status, reason, data_sets, seconds).
void run_conformance_case(ConformanceCase& c, const ConformanceOptions& options);

// Runs every case; `progress` (if set) is called after each one.
ConformanceReport run_conformance(const ConformanceOptions& options,
                                  const std::function<void(const ConformanceCase&)>& progress = {});

// The report as JSON: summary, options, per-op table (every ONNX op type seen or mapped, with
// its case counts and Kiln ops), and every case.
std::string conformance_json(const ConformanceReport& report, const ConformanceOptions& options);
// The per-op table as Markdown (docs/onnx.md embeds it): mapped op types with their Kiln ops and
// case counts, then the op types the suites use that Kiln does not map.
std::string conformance_markdown(const ConformanceReport& report);

}  // namespace kiln
