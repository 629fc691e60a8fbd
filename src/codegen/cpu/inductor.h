// "inductor": Kiln's CPU compiler as a capture backend. See Note [The CPU compiler] in
// inductor.cc.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "capture/backend.h"
#include "core/tensor.h"

namespace kiln {
class Graph;
struct CompileOptions;
class Executable;
}  // namespace kiln

namespace kiln::lower {
enum class ConvPolicy : uint8_t;  // lower/onednn_lowering.h
}

namespace kiln::codegen {

struct InductorOptions {
  std::string mode = "default";   // default | reduce-overhead | max-autotune
  bool allow_blocked = true;      // oneDNN blocked layouts between convolutions
  // Convolution layout/algorithm policy (lower::ConvPolicy: Auto, Blocked16, Winograd); default
  // modes keep Auto, max-autotune times the others. See Note [convolution policy].
  lower::ConvPolicy conv_policy{};
  bool fuse = true;               // fuse loop kernels
  bool vectorize = true;
  int vector_bits = 0;            // 0: widest SIMD of the ISA; 256: AVX2 width (CpuCodegenOptions)
  int reduce_unroll = 1;          // vector accumulators per reduction (CpuCodegenOptions)
  int64_t small_linear_macs = 1 << 15;
  bool progress = true;           // max-autotune: a progress bar on a terminal
  // max-autotune: a candidate that computes differently from the default compile (Winograd)
  // must agree with the default candidate's outputs within this relative error (max |diff| /
  // max |reference|); the tolerance Kiln's model tests use against ONNX Runtime.
  double autotune_tolerance = 1e-4;
  std::string inject_error_into;  // tests: see CpuCodegenOptions::inject_error_into
};

// What the compiler made of a graph (explain, bench, tests).
struct InductorReport {
  int nodes = 0;            // after the passes
  int loop_kernels = 0;
  int fused_nodes = 0;      // nodes sharing a loop kernel with another node
  int onednn_launches = 0;
  int eager_launches = 0;
  int vectorized_kernels = 0;
  int64_t arena_bytes = 0;
  int64_t naive_bytes = 0;  // every intermediate in its own buffer
  double compile_s = 0;     // the whole compile
  double cxx_s = 0;         // the C++ compiler (0 on a cache hit)
  // Phases of the compile: passes, oneDNN primitive creation, scheduling + planning, code
  // generation + cache lookup (+ the C++ compiler on a miss), binding the launches.
  double passes_s = 0, onednn_s = 0, schedule_s = 0, codegen_s = 0, bind_s = 0;
  bool cache_hit = false;
  std::string autotune;     // max-autotune: the choice and the timings
  std::vector<std::string> kernels;  // "k3_add_relu [loop, SIMD]: relu 'layer1.0.relu', ..."
  std::string str() const;
};

class InductorGraph : public CompiledGraph {
 public:
  InductorGraph(std::shared_ptr<Executable> exe, InductorReport report);
  TensorList run(const TensorList& inputs) override;
  std::string summary() const override;
  // Runs into preallocated outputs: no heap allocation in steady state.
  void run_into(const TensorList& inputs, TensorList& outputs) override;
  int64_t arena_bytes() const override { return report_.arena_bytes; }
  bool cache_hit() const override { return report_.cache_hit; }
  const InductorReport& report() const { return report_; }
  Executable& executable() { return *exe_; }

 private:
  std::shared_ptr<Executable> exe_;
  InductorReport report_;
};

// Compiles `graph` (not modified). Throws kiln::Error on failure (capture then falls back).
std::unique_ptr<InductorGraph> compile_inductor(const Graph& graph, const InductorOptions& options);

// The capture backend factory ("inductor").
BackendFactory inductor_backend();

}  // namespace kiln::codegen
