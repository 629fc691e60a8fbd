// kiln conformance [--data DIR]... [--json | --markdown] [--filter SUBSTR] [--verbose]: runs the ONNX backend
// test cases through the ONNX importer and the eager backend. See Note [Conformance] in
// src/frontends/onnx/conformance.h and docs/onnx.md.
#include <algorithm>
#include <cstdio>
#include <map>

#include "frontends/onnx/conformance.h"
#include "capture/compile.h"
#include "core/cuda_runtime.h"
#include "ir/interpreter.h"
#include "bench/bench.h"
#include "tools/commands.h"

namespace kiln::cli {

void add_conformance_command(CLI::App& app) {
  static ConformanceOptions opts;
  static bool json = false, markdown = false, verbose = false, in_process = false;
  auto* cmd = app.add_subcommand(
      "conformance", "Run the ONNX backend tests (import + eager run + compare) and report");
  cmd->add_option("--data", opts.data_dirs,
                  "Test data: a case dir, a suite dir or a dir of suites (repeatable; default: "
                  "the libonnx-testdata suites node, simple, pytorch-converted, pytorch-operator)");
  cmd->add_option("--filter", opts.filter, "Only cases whose 'suite/name' contains SUBSTR");
  cmd->add_option("--rtol", opts.rtol, "Relative tolerance (default 1e-3, as ONNX's runner)");
  cmd->add_option("--atol", opts.atol, "Absolute tolerance (default 1e-7, as ONNX's runner)");
  cmd->add_option("--timeout", opts.case_timeout_s, "Seconds per case before it fails (default 120)");
  static std::string backend = "eager";
  static std::string device = "cpu";
  cmd->add_option("--device", device,
                  "cpu (default) | cuda: every case's graph and inputs are copied to the device, "
                  "run there (eager kernels or the CUDA compiler) and compared on the host; runs "
                  "in-process (a CUDA context does not survive fork)");
  cmd->add_option("--backend", backend,
                  "eager (the graph interpreter, default) | compiled (kiln::compile with the best "
                  "backend, strict: a compile failure fails the case)");
  cmd->add_flag("--json", json, "Print the full report as JSON (summary, per-op table, cases)");
  cmd->add_flag("--markdown", markdown, "Print the per-op table as Markdown (for docs/onnx.md)");
  cmd->add_flag("--verbose,-v", verbose, "List every case, not only failures");
  cmd->add_flag("--in-process", in_process,
                "Run cases in this process (faster; a crash ends the run) instead of one forked "
                "child per case");
  cmd->callback([] {
    if (backend != "eager" && backend != "compiled")
      fail("--backend expected eager or compiled, found '{}'", backend);
    if (device != "cpu" && device != "cuda")
      fail("--device expected cpu or cuda, found '{}'", device);
    const bool cuda = device == "cuda";
    if (cuda) require_cuda_device(0, "conformance: --device cuda");
    opts.isolate = !in_process && !cuda;
    opts.backend = backend == "eager" ? "eager" : "compiled(" + best_compile_backend() + ")";
    if (cuda) opts.backend += " on cuda:0";
    const bool compiled = backend == "compiled";
    if (compiled || cuda)
      opts.runner = [compiled, cuda](const Graph& cpu_graph, const TensorList& cpu_in) {
        const Device dev = cuda ? Device::cuda(0) : Device::cpu();
        Graph g = cuda ? graph_on_device(cpu_graph, dev) : cpu_graph;
        TensorList in;
        for (const Tensor& t : cpu_in) in.push_back(t.defined() && cuda ? t.to(dev) : t);
        TensorList out;
        if (compiled) {
          CompileOptions co;
          co.backend = best_compile_backend();
          co.strict = true;
          CompiledFunction f = compile([&g](const TensorList& x) { return run(g, x); }, co);
          out = f(in);
        } else {
          out = run(g, in);
        }
        for (Tensor& t : out)
          if (t.defined() && !t.device().is_cpu()) t = t.to(Device::cpu());
        return out;
      };
    ConformanceReport r = run_conformance(opts, [](const ConformanceCase& c) {
      if (json || markdown) return;
      if (c.status == CaseStatus::Failed || verbose)
        std::printf("%-8s %s/%s%s%s\n", case_status_name(c.status), c.suite.c_str(),
                    c.name.c_str(), c.reason.empty() ? "" : ": ", c.reason.c_str());
      std::fflush(stdout);
    });
    exit_code() = r.failed == 0 ? 0 : 1;
    if (json) {
      std::printf("%s\n", conformance_json(r, opts).c_str());
      return;
    }
    if (markdown) {
      std::printf("%s", conformance_markdown(r).c_str());
      return;
    }
    // Skips by unmapped op type, most frequent first.
    std::map<std::string, int> by_op;
    int type_skips = 0;
    for (const ConformanceCase& c : r.cases) {
      if (c.status != CaseStatus::Skipped) continue;
      for (const std::string& op : c.unmapped) ++by_op[op];
      if (c.unmapped.empty()) ++type_skips;
    }
    std::vector<std::pair<int, std::string>> sorted;
    for (auto& [op, n] : by_op) sorted.emplace_back(-n, op);
    std::sort(sorted.begin(), sorted.end());
    if (!sorted.empty()) {
      std::printf("skipped: unmapped op types (cases):");
      for (auto& [n, op] : sorted) std::printf(" %s (%d)", op.c_str(), -n);
      std::printf("\n");
    }
    if (type_skips)
      std::printf("skipped: %d cases whose only obstacle is a value type Kiln cannot represent "
                  "(string, sequence, optional, uint16/uint32/uint64/int16, ...)\n", type_skips);
    std::printf("%d passed, %d failed, %d skipped\n", r.passed, r.failed, r.skipped);
  });
}

}  // namespace kiln::cli
