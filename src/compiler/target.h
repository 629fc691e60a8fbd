// The Target interface: what the device-generic compiler (compiler/compile.h) asks of a device.
// See Note [Targets].
//
// Note [Targets]
// The driver runs the same phases for every device; a Target answers the device questions:
//   - what it does with each op: a table of OpSupport indexed by OpId (support()), built with
//     make_support_table so that a new op in ops.def fails to compile until every target has a
//     row for it, and per-node rules (generates: dtypes the emitter handles);
//   - which ops the passes decompose before scheduling (decompositions(): their parts fuse);
//   - its library kernels (oneDNN on the CPU; cuBLASLt and cuDNN on CUDA): lower_library builds
//     them for the nodes the driver chose, at compile time;
//   - its scheduling policy as data (policy(): which linears become generated GEMVs, ...);
//   - its code: build_loops emits source for the schedule's loop kernels, compiles it through
//     its toolchain and kernel cache, and returns one launch per loop kernel;
//   - memory: the arena and device-resident constants (allocate, place_constant);
//   - autotuning: the candidate configurations (Knobs) max-autotune times, and the key of the
//     machine its tuning records are valid for.
// Targets register themselves from their own layer (register_target); the driver finds one by
// device. None of these calls happens on the run path: an Executable is a flat launch list.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/device.h"
#include "ir/graph.h"
#include "runtime/executable.h"

namespace kiln::lower {
struct Schedule;
struct ViewGeometry;
}  // namespace kiln::lower

namespace kiln::compiler {

// ---- what a target does with each op -----------------------------------------------------------
struct OpSupport {
  bool generated = false;    // loop code, where Target::generates accepts the node
  bool library = false;      // a library kernel, where the library lowering takes the node
  bool vector_body = false;  // the emitter has a vector (SIMD) form of the op's loop body
  const char* how = "";      // one line for `kiln ops`: how the target runs it
};
using OpSupportTable = std::array<OpSupport, size_t(kNumOps)>;
using OpSupportRow = std::pair<OpId, OpSupport>;

// A table from one row per op, checked at compile time: every op of ops.def exactly once.
//   constexpr OpSupportTable kCpu = make_support_table({{OpId::Neg, kPointwise}, ...});
template <size_t N>
consteval OpSupportTable make_support_table(const OpSupportRow (&rows)[N]) {
  static_assert(N == size_t(kNumOps), "a target's support table needs one row per op of ops.def");
  OpSupportTable t{};
  std::array<bool, size_t(kNumOps)> seen{};
  for (const OpSupportRow& r : rows) {
    if (seen[size_t(r.first)]) throw "an op has two rows in a target's support table";
    seen[size_t(r.first)] = true;
    t[size_t(r.first)] = r.second;
  }
  return t;
}

// ---- configurations ---------------------------------------------------------------------------
// A target's compile-time choices as ordered name=value pairs ("conv=nChw16c,vec=256"): the
// form autotuning candidates, reports and tuning records use. Targets document their knobs.
struct Knobs {
  std::vector<std::pair<std::string, std::string>> items;
  const std::string* find(std::string_view name) const;
  std::string get(std::string_view name, std::string_view fallback) const;
  Knobs& set(std::string name, std::string value);  // replaces, or appends in order
  std::string str() const;                          // "conv=auto,gemv=generated"; "default" if none
};

// Scheduling policy as data: what the driver's phases read from a target.
struct SchedulePolicy {
  // linear / fused_linear with at most this many multiply-adds become a generated reduction
  // (GEMV) instead of a library call; 0: never.
  int64_t small_linear_macs = 0;
  // The same for a float16 / bfloat16 linear of one input row (lower::small_linear).
  int64_t small_half_gemv_macs = 0;
  // The same for a float32 linear of one input row (lower::small_linear's max_row_macs).
  int64_t row_linear_macs = 0;
  // lower::ScheduleOptions::grid_sums_channels_inner.
  bool grid_sums_channels_inner = false;
};

// ---- library kernels ----------------------------------------------------------------------------
// Where a materialized value lives at run time: b[slot] is a base pointer of the Executable's
// slot table (slot 0: the arena; then graph inputs, then constants), the value starts
// `byte_offset` bytes after it.
using MemRef = kiln::MemRef;  // runtime/executable.h

// A strided view a library kernel reads in place (a permuted matmul operand): `strides` in
// elements, one per dim of the operand's type.
struct StridedOperand {
  int32_t node = -1;
  int input = 0;
  std::vector<int64_t> strides;
};

// The library kernels of one compiled graph (built by Target::lower_library; one object per
// graph, kept alive by the Executable).
class LibraryKernels {
 public:
  virtual ~LibraryKernels() = default;
  // False for nodes the library has no implementation for: the driver runs them another way.
  virtual bool lowered(int32_t node) const = 0;
  // Storage bytes of a value kept in a library layout (blocked, padded), -1 for plain.
  virtual int64_t value_bytes(ValueId v) const = 0;
  // The element strides of a plain (unpadded, unblocked) value the library stores in another
  // order than row-major, which its loop kernels then read and write through those strides
  // too (the CPU's channels-last values: Note [channels-last values] in
  // targets/cpu/onednn_lowering.cc); empty for row-major. Only values that no view, graph
  // output, eager kernel or other library kernel reads may be given strides.
  virtual std::vector<int64_t> value_strides(ValueId) const { return {}; }
  // A weight that the library kernels read in a layout of their own, stored in that layout
  // instead of copied into it per execution context (CUDA: Note [Filters stored KRSC in
  // process] in targets/cuda/target.cc). Given the placed tensor (Target::place_constant),
  // returns the layout's name (Executable::ConstantSpec::layout) and sets *stored to the tensor
  // that takes its slot (the same sizes and dtype, its bytes in that layout); "" keeps the
  // constant as it is. assign_memory asks once per constant with a slot, before bind.
  virtual std::string store_constant(ValueId, const Tensor&, Tensor*) const { return ""; }
  // Bytes of scratch memory lowered node `node` uses while it runs (its workspace, scratchpad
  // or temporary layouts; 0 for none). The memory planner gives each its own buffer, live at
  // the node's step only (Note [Scratch per step] in lower/memory_planner.cc).
  virtual int64_t scratch_bytes(int32_t node) const = 0;
  // One line for explain: the kernel and its layouts.
  virtual std::string describe(int32_t node) const = 0;
  // Why the library did not lower `node` ("" when it did, or when it has no words for it):
  // part of the error when nothing else runs the node either.
  virtual std::string why_not(int32_t node) const { return ""; }
  // The launch of lowered node `node`: the memory of each input (activations, parameters and
  // constants alike; slot -1 for an absent optional input), of each output, and of its scratch
  // (scratch_bytes(node) bytes in the arena, so each execution context has its own). A target
  // that prepared a weight at lowering time (oneDNN's reordered weights) may ignore its MemRef.
  // Launches of different execution contexts run at the same time (Note [Execution contexts]
  // in runtime/executable.cc): state the launch changes while it runs must be per context
  // (Executable::Launch::make_local).
  // `status`: the execution context's status record (Note [Device status] in
  // runtime/executable.h; slot -1 where the target has none), for kernels that report bad
  // values; the checks they report are device_checks().
  virtual Executable::Launch bind(int32_t node, const std::vector<MemRef>& inputs,
                                  const std::vector<MemRef>& outputs, MemRef scratch,
                                  MemRef status) const = 0;
  virtual std::vector<Executable::DeviceCheck> device_checks() const { return {}; }
  // The device code modules the launches run kernels of (Executable::device_modules).
  virtual std::vector<Executable::DeviceModule> device_modules() const { return {}; }
};

// What the driver passes to the library lowering besides the nodes.
struct LibraryRequest {
  std::vector<StridedOperand> strided_operands;  // views read in place (library_reads_strided)
  std::vector<bool> generated;  // per node: runs as generated loop code (KernelChoice::generated)
};

// ---- loop kernels -----------------------------------------------------------------------------
// A launch with an integer parameter read on every call (a CPU loop kernel's thread count:
// 0 = all threads, 1 = the calling thread) that max-autotune may set per launch.
struct TunableLaunch {
  size_t launch = 0;      // index into Executable::launches (the driver fixes it up)
  int* value = nullptr;   // owned by the launch's state
  std::vector<int> choices;
  int default_value = 0;
};

// The result of Target::build_loops.
struct LoopBuild {
  std::vector<Executable::Launch> launches;  // one per Schedule::loops entry, in order
  std::vector<bool> vectorized;              // per loop kernel: has a vector main loop
  std::vector<TunableLaunch> tunable;        // per-launch runtime parameters (thread counts)
  std::shared_ptr<void> keep_alive;          // the loaded module
  std::string library_path;                  // its shared object (what a package carries)
  std::vector<Executable::DeviceModule> device_modules;  // its device code (what a package carries)
  std::vector<Executable::DeviceCheck> device_checks;  // what its kernels may report (status)
  bool cache_hit = false;                    // the module came from the kernel cache
  double build_s = 0;                        // the toolchain's wall time (0 on a hit)
};

struct Options;
struct CompileReport;

class Target {
 public:
  virtual ~Target() = default;
  virtual const char* name() const = 0;          // "cpu"
  virtual Device device() const = 0;
  virtual const char* library_name() const = 0;  // "oneDNN": reports and explain
  virtual const OpSupportTable& support() const = 0;

  // Work a compile of g needs whatever its passes make of it, begun before them on threads of
  // the target's own (CUDA: opening cuDNN and cuBLASLt, Note [CUDA libraries opened ahead] in
  // kernels/cuda/library_warm_up.h). The returned object waits for it when destroyed; nullptr
  // when there is nothing to begin.
  struct Background {
    virtual ~Background() = default;
  };
  virtual std::unique_ptr<Background> begin_compile(const Graph& g, const Options& options) const {
    return nullptr;
  }

  // Ops the compiler pipeline decomposes (passes/pipeline.h: compiler_pipeline).
  virtual std::vector<OpId> decompositions() const = 0;
  // Passes of the registry (passes/pipeline.cc) this target runs after the default pipeline,
  // before autocast (compiler_pipeline): rewrites into what its libraries run best.
  virtual std::vector<std::string> graph_passes() const { return {}; }
  // Passes of the registry this target runs after autocast, before the decompositions:
  // rewrites that depend on the dtypes its kernels read (CUDA: attention-mask-guard).
  virtual std::vector<std::string> precision_graph_passes() const { return {}; }
  // Nodes of those ops that this target still runs whole (its library fuses them: CUDA's
  // fused_conv2d with a relu epilogue is one cuDNN graph).
  virtual bool keeps_whole(const Graph& g, const Node& n) const { return false; }
  // Whether the library takes node n of g, an op whose support() row names the library: a
  // target may take an op only in some contexts (the CPU's oneDNN concat: Note [oneDNN concat]).
  virtual bool library_takes(const Graph& g, const Node& n) const { return true; }
  // Whether node n of g gets generated loop code (support() and the emitter's dtype rules).
  virtual bool generates(const Graph& g, const Node& n) const = 0;
  // Why node n cannot run on this target at all, in words for the error ("" when nothing
  // special is known): said when it is neither generated, nor a library kernel, nor has an
  // eager kernel for its dtype.
  virtual std::string unsupported_reason(const Graph& g, const Node& n) const { return ""; }
  virtual SchedulePolicy policy(const Knobs& knobs) const = 0;
  // Whether the library reads input k of node n in place as a strided view of this geometry.
  virtual bool library_reads_strided(const Graph& g, const Node& n, int k,
                                     const lower::ViewGeometry& geo) const = 0;
  // Library kernels for `nodes` (node indices of g), built now. Keeps no reference to g.
  virtual std::unique_ptr<LibraryKernels> lower_library(const Graph& g,
                                                        const std::vector<int32_t>& nodes,
                                                        LibraryRequest request,
                                                        const Knobs& knobs) const = 0;
  // Emits, compiles (through the kernel cache) and loads the schedule's loop kernels.
  // `status`: the status record (Note [Device status]; slot -1 where the target has none).
  virtual LoopBuild build_loops(const Graph& g, const lower::Schedule& s,
                                const std::vector<MemRef>& mem, MemRef status,
                                const Options& options, const Knobs& knobs) const = 0;

  // Memory: `bytes` of zeroed arena memory (64-byte aligned, owned by the result), and a
  // constant placed where kernels read it (contiguous, on the target's device).
  virtual std::shared_ptr<char> allocate(int64_t bytes) const = 0;
  virtual Tensor place_constant(const Tensor& t) const = 0;

  // max-autotune: whole-graph candidates (the first is the default configuration), and
  // code-generation variants of the chosen one given its report's kernel lines.
  struct Candidate {
    Knobs knobs;
    bool exact = true;  // computes what the default configuration computes (same algorithms)
  };
  // The candidates' names are Knobs::str() of their knobs; `note` may explain what was left
  // out ("convolution policies not tried ...").
  virtual std::vector<Candidate> autotune_candidates(const Graph& g, const Options& o,
                                                     std::string* note) const = 0;
  struct Variants {
    std::string current_label;         // how the log names the chosen candidate ("512-bit")
    std::vector<Candidate> variants;   // knobs added to the chosen candidate's (all inexact)
  };
  // Code-generation variants of the chosen candidate, given what its build produced.
  virtual Variants autotune_variants(const CompileReport& chosen) const = 0;
  // Per-launch runtime parameters of the chosen build (CPU: loop-kernel thread counts), timed
  // on `in` over `rounds`; returns the record to persist ("" for none) and appends to *log.
  virtual std::string tune_launches(Executable& exe, const std::vector<TunableLaunch>& tunable,
                                    const TensorList& in, int rounds, std::string* log) const = 0;
  // Applies a record of tune_launches; false when it does not fit `tunable`. Appends to *log.
  virtual bool apply_launch_record(const std::vector<TunableLaunch>& tunable,
                                   const std::string& record, std::string* log) const = 0;
  // What tuning records are valid for (CPU: "<isa>\n<threads>"): part of their key.
  virtual std::string tuning_context() const = 0;
  // Replacing a package's weights (compiler/replace_weights.cc) keeps its launches; a launch
  // whose kernel was chosen because of the old weights' values (CPU: a Winograd convolution,
  // Note [measured Winograd] in targets/cpu/onednn_lowering.cc) is checked again here against
  // the new ones. `launches`: the manifest's launch records ([{name, kind, nodes, params}]);
  // `weight`: a package constant by name, the new data. Throws kiln::Error naming the launch
  // and what to do where a check fails.
  virtual void check_replaced_weights(const std::string& launches,
                                      const std::function<Tensor(const std::string&)>& weight,
                                      const std::string& package) const {}
};

// Registers a target (from the target's own layer, at static initialization); the first one
// registered for a device type is the one the driver uses for it.
void register_target(const Target* target);
// The target for `device`; throws kiln::Error naming the device and the registered targets.
const Target& target_for(Device device);
std::vector<const Target*> registered_targets();

}  // namespace kiln::compiler
