// The least work a kernel does: its arithmetic and the memory it must move. What a profile
// divides a kernel's measured time by (Note [Kernel work]).
#pragma once
#include "ir/graph.h"
#include "lower/loop_ir.h"

namespace kiln::lower {

// Note [Kernel work] in cost.cc. Zero flops and bytes: unknown.
struct Work {
  double flops = 0;  // a multiply-add counts 2
  double bytes = 0;  // read + written, each element once
  // Of `bytes`, the parameters' and constants' (the weights): read from memory on every call,
  // as a model's weights do not stay in the caches from one call to the next.
  double const_bytes = 0;
  // The contraction's element type (its FLOP rate); Float32 for anything else.
  DType compute = DType::Float32;
};

// A graph node run as one kernel (a library, runtime or eager kernel). Shapes concrete.
Work node_work(const Graph& g, const Node& n);
// A fused loop kernel, from its loads, stores and expressions.
Work loop_work(const Graph& g, const LoopKernel& k);

}  // namespace kiln::lower
