// Graph passes: the interface, the registry and the runner. See Note [Passes].
//
// Note [Passes]
// A pass rewrites a Graph in place and returns whether it changed anything (so that a driver
// can iterate to a fixed point and tests can assert "no change"). Each pass lives in its own
// file pair under src/passes/, whose header says what the pass does, what must run before it
// and what it guarantees after. pipeline.cc holds the one table of passes, in pipeline order;
// find_pass looks names up there and `kiln opt --passes=a,b` runs them on IR text.
//
// run_passes verifies the input graph and the graph after every pass, always: verification is
// one inference call per node, far cheaper than any pass that rewrites the graph, and a broken
// invariant caught at the pass that broke it is worth it. KILN_VERIFY=0 turns it off (for
// timing huge graphs). KILN_DUMP_IR=dir writes the IR before the first pass (00-input.kir) and
// after each pass (NN-name.kir), each file written atomically (temp file + rename); the dump
// happens before verification, so a pass that breaks the graph leaves its output to inspect.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace kiln {

class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string_view name() const = 0;
  virtual std::string_view description() const = 0;
  // Rewrites g in place; returns whether the graph changed.
  virtual bool run(Graph& g) = 0;
};

using PassFactory = std::unique_ptr<Pass> (*)();

struct PassEntry {
  const char* name;
  PassFactory make;
  bool in_default_pipeline;  // run by default_pipeline(), in table order
};

// Every pass, in pipeline order (the table is in pipeline.cc).
std::span<const PassEntry> registered_passes();
// Names of the passes the compiler runs by default, in order.
std::vector<std::string> default_pipeline();
// A new instance of the named pass; throws kiln::Error listing the available names.
std::unique_ptr<Pass> find_pass(std::string_view name);
// "a,b, c" -> {"a", "b", "c"} (empty entries dropped).
std::vector<std::string> split_pass_list(std::string_view list);

// Runs the named passes in order (see Note [Passes] for verification and KILN_DUMP_IR).
// Returns whether any pass changed the graph. Errors name the pass.
bool run_passes(Graph& g, std::span<const std::string> names);
// The same for pass objects (tests, drivers that configure their passes).
bool run_passes(Graph& g, std::span<Pass* const> passes);

// Checks the graph (ir/verifier.h) and changes nothing.
std::unique_ptr<Pass> make_verify_pass();

// KILN_TRACE_MEMORY=1 (memory_trace_enabled): run_passes and the compiler's phases print one
// stderr line each with the bytes of the weights the graph holds (distinct storages) and, where
// those weights live on a CUDA device, its allocator's bytes allocated now and peak.
bool memory_trace_enabled();
void trace_memory(std::string_view phase, const Graph& g);

}  // namespace kiln
