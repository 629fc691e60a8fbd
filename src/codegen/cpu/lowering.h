// The CPU compiler's entry in each op record (OpDef::cpu_lowering): how the compiler runs the op.
#pragma once

namespace kiln {

struct CpuLowering {
  // "loop": generated loop code (pointwise ops fuse; reductions and norms carry a pointwise
  // prologue and epilogue); "onednn": a oneDNN primitive created at compile time with fused
  // post-ops. Ops without an entry run their eager kernel inside compiled graphs.
  const char* kind;
  const char* how;  // one line for `kiln ops`
};

// Fills OpDef::cpu_lowering for the ops the compiler lowers; called once by the registry.
void register_cpu_lowerings();

}  // namespace kiln
