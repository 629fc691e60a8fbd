// The device-generic compiler: compile(graph, target, options) turns a graph into an
// Executable for one target. See Note [The compiler] in compile.cc, which reads top to bottom
// as the pipeline. Registered as the "inductor" backend (compiler/backend.h), the default of
// kiln::compile.
//
//   const compiler::Target& cpu = compiler::target_for(Device::cpu());
//   auto exe = compiler::compile(graph, cpu, {.mode = "max-autotune"});
//   TensorList y = exe->run({x});
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "compiler/backend.h"
#include "compiler/target.h"
#include "core/tensor.h"

namespace kiln {
class Executable;
class Pass;  // passes/pass.h
}

namespace kiln::compiler {

struct Options {
  std::string mode = "default";  // default | reduce-overhead | max-autotune
  // Target choices (the target's defaults where absent): max-autotune searches them; a fixed
  // configuration can be given here ("conv=nChw16c", "vec=256").
  Knobs knobs;
  // Float32 (the default): the graph computes in its own dtypes. BFloat16 or Float16: a float32
  // graph runs in that dtype as torch's autocast runs it (passes/autocast.h: matmul, conv,
  // attention and the pointwise ops between them low; norms, softmax, reductions in float32;
  // weights converted at compile time; inputs and outputs stay float32). Other dtypes are an
  // InvalidArgument. Values of other dtypes than float32 are left alone.
  DType precision = DType::Float32;
  // Unset (the default): the graph's inputs keep their dtypes. BFloat16 or Float16: every
  // float32 input of the graph is taken in this dtype instead, so the caller passes (and the
  // runtime copies and holds) half the bytes; the graph converts it to float32 where it read it,
  // a conversion that autocast's own cast to the same dtype then cancels (Note [Inputs in a
  // half dtype] in compile.cc). What TensorRT's input formats and torch's model.to(dtype) give.
  std::optional<DType> input_dtype;
  bool fuse = true;       // fuse loop kernels (false: one kernel per node)
  bool vectorize = true;  // vector main loops where the emitter has them
  bool progress = true;   // max-autotune: a progress bar on a terminal
  // max-autotune: a candidate that computes differently from the default configuration
  // (Winograd) must agree with the default candidate's outputs within this relative error
  // (max |diff| / max |reference|); the tolerance Kiln's model tests use against ONNX Runtime.
  double autotune_tolerance = 1e-4;
  // max-autotune: a candidate whose single timed call (confirmed by a second) is over this many
  // times the default's (+10 ms) is cut before the timing rounds, so that a pathological layout
  // costs a call, not the rounds. 0: no cut-off (tests that assert which candidates are timed:
  // the cut-off depends on how loaded the machine is).
  double autotune_slow_cutoff = 10;
  // Tests only: a kernel whose name contains this gets a compile error (checks that errors in
  // generated code name the kernel and that capture falls back to eager).
  std::string inject_error_into;
  // Cross-build (Note [CUDA cross-builds] in targets/cuda/target.cc): compile for a CUDA GPU of
  // this architecture ("sm_90") without using a device, so that a machine without a GPU (CI)
  // builds packages. Library choices that need the device (cuBLASLt algorithms, cuDNN engines)
  // are left to the package's loader; the Executable cannot run here and is written as a
  // package. Empty: compile for the device that is present. CUDA target, default and
  // reduce-overhead modes only.
  std::string arch;
};

// What the compiler made of a graph (explain, bench, tests).
struct CompileReport {
  std::string target;          // "cpu"
  std::string library;         // "oneDNN"
  std::string precision = "float32";  // Options::precision
  int low_nodes = 0;           // precision other than float32: nodes computing in it
  int casts = 0;               // cast nodes in the optimized graph
  int nodes = 0;               // after the passes
  int loop_kernels = 0;
  int fused_nodes = 0;         // nodes sharing a loop kernel with another node
  int library_launches = 0;
  int eager_launches = 0;
  int vectorized_kernels = 0;
  int64_t arena_bytes = 0;
  int64_t naive_bytes = 0;     // every intermediate in its own buffer
  double compile_s = 0;        // the whole compile
  double build_s = 0;          // the toolchain (0 on a cache hit)
  // Phases: passes, library kernels, scheduling + planning, code generation + cache lookup
  // (+ the toolchain on a miss), binding the launches.
  double passes_s = 0, library_s = 0, schedule_s = 0, codegen_s = 0, bind_s = 0;
  bool cache_hit = false;
  std::string autotune;        // max-autotune: the choice and the timings
  // max-autotune: the configuration chosen ("kernels=timed,conv=auto"), the same whether timed
  // now or read from the tuning store: what a package records (Note [Packages record the
  // choice, not the timings] in compiler/package.cc).
  std::string autotune_choice;
  std::string mode_note;       // reduce-overhead on CUDA: graph replay, or why not
  std::vector<std::string> kernels;  // "k3_add_relu [loop, SIMD]: relu 'layer1.0.relu', ..."
  std::string str() const;
};

class CompiledExecutable : public CompiledGraph {
 public:
  CompiledExecutable(std::shared_ptr<Executable> exe, CompileReport report);
  TensorList run(const TensorList& inputs) override;
  // Runs into preallocated outputs: no heap allocation in steady state.
  void run_into(const TensorList& inputs, TensorList& outputs) override;
  std::string summary() const override;
  int64_t arena_bytes() const override { return report_.arena_bytes; }
  int64_t launches() const override {
    return report_.loop_kernels + report_.library_launches + report_.eager_launches;
  }
  bool cache_hit() const override { return report_.cache_hit; }
  const CompileReport& report() const { return report_; }
  Executable& executable() { return *exe_; }

 private:
  std::shared_ptr<Executable> exe_;
  CompileReport report_;
};

// "conv=nChw16c,vec=256" as Knobs; throws naming `where` on a malformed list.
Knobs parse_knobs(std::string_view text, const char* where);

// Compiles `graph` (not modified) for `target`. Throws kiln::Error on failure, naming the node
// where one is to blame (capture then falls back to eager).
std::unique_ptr<CompiledExecutable> compile(const Graph& graph, const Target& target,
                                            const Options& options = {});
// The same for the target of `device`.
std::unique_ptr<CompiledExecutable> compile(const Graph& graph, Device device,
                                            const Options& options = {});

// The pass pipeline compile runs for `target` at `precision` (passes/pipeline.h,
// compiler_pipeline with the target's decompositions, keeps_whole and graph_passes).
std::vector<std::unique_ptr<Pass>> compiler_passes(const Target& target, DType precision);
// Phase 1 of compile (Note [The compiler]) alone: compiler_passes, in place. `kiln package
// --replace-weights` (compiler/replace_weights.h) runs exactly this on a package's source graph
// and records the passes' names.
void run_compiler_passes(Graph& g, const Target& target, DType precision);

// For `kiln opt --schedule` and IR-text tests: schedules `g` as the compiler would for
// `target` (library candidates as extern steps without building library kernels), plans memory
// over the schedule, and prints the steps, every loop kernel and the memory plan.
std::string describe_schedule(const Graph& g, const Target& target, bool fuse = true);

}  // namespace kiln::compiler
