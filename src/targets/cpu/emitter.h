// The CPU target's kernel emitter: one readable C++ translation unit per graph, one extern "C"
// function per fused loop kernel. See Note [CPU code generation] in emitter.cc.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "compiler/target.h"
#include "lower/scheduler.h"

namespace kiln::cpu {

using compiler::MemRef;

struct CpuCodegenOptions {
  // Kernels with fewer elements than this run on the calling thread by default (an OpenMP
  // parallel region costs microseconds; a batch-1 MLP must not pay it). Equal to min_parallel:
  // see Note [kernel threads] for why a mid-size kernel forks.
  int64_t parallel_threshold = 4096;
  // Kernels with at least this many elements take their thread count as an argument (see Note
  // [kernel threads] in codegen.cc): the default is all threads from parallel_threshold up and
  // one below it; max-autotune times the alternatives.
  int64_t min_parallel = 4096;
  bool vectorize = true;
  // SIMD width of the vector loops: 0 = the widest the ISA has (AVX-512: 16 floats), 256 = AVX2
  // vectors (8 floats) even where AVX-512 exists.
  int vector_bits = 0;
  // Independent vector accumulators in the SIMD loop of reduce kernels (1 or more): a sum over
  // one accumulator is bound by the add latency, several overlap (the reduction's "tile"); the
  // lanes are combined in another order, so results round differently.
  int reduce_unroll = 1;
  // Note [flattened lanes] (emitter.cc): pointwise kernels whose innermost dim is shorter than a
  // vector run their lanes across several innermost dims (knob `flat=off`: the scalar form).
  bool flatten_lanes = true;
  // Tests only: a kernel whose name contains this gets a compile error (checks that errors in
  // generated code name the kernel and that capture falls back to eager).
  std::string inject_error_into;
};

struct CpuUnit {
  std::string source;
  std::vector<std::string> symbols;  // per Schedule::loops entry: its function name
  std::vector<bool> vectorized;      // per loop kernel: has a SIMD main loop
  // Per loop kernel: the thread count to pass by default (0 = all of OpenMP's threads at call
  // time, 1 = the calling thread), or -1 where the kernel is always serial (too small to
  // parallelize: the argument is ignored).
  std::vector<int> default_threads;
};

// `mem` has one entry per graph value (slot -1 where the value is never read or written by a
// loop kernel). Every load/store access of every loop kernel must have a slot.
CpuUnit generate_cpu(const Graph& g, const lower::Schedule& s, const std::vector<MemRef>& mem,
                     const std::string& unit_name, const CpuCodegenOptions& options = {});

// Whether loop kernel k would get a SIMD main loop (all loads/stores f32 or bf16 with unit or
// zero inner stride, all operations available on vectors).
bool loop_vectorizable(const lower::LoopKernel& k);

// Whether reduce kernel k can run its SIMD lanes across its innermost kept dim instead (Note
// [lane reductions] in emitter.cc); used where loop_vectorizable(k) is false.
bool lane_reducible(const lower::LoopKernel& k);

}  // namespace kiln::cpu
