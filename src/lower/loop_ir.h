// The loop-nest IR of the CPU compiler: what a fused kernel computes, as index expressions over
// an iteration space. See Note [Loop-nest IR].
//
// Note [Loop-nest IR]
// A LoopKernel iterates over `sizes`: the first `sizes.size() - reduce_dims` dims are kept
// (parallel) dims, the trailing `reduce_dims` are reduced (Reduce) or normalized over (Norm).
// Every tensor access is affine: element `offset + sum_d idx[d] * strides[d]` of a materialized
// buffer (an arena value, a graph input, a parameter); broadcasting is a 0 stride and every view
// (permute, transpose, expand, slice, split, squeeze, unsqueeze, viewable reshape) is folded into
// the strides, so no view is ever copied to feed a fused kernel.
//
// The body is one SSA list of LoopExpr. Each expression lives at a level:
//   Full - evaluated for every point of the whole space (pointwise ops; a Reduce kernel's
//          prologue; a Norm kernel's input, its statistics' consumers and epilogue);
//   Kept - evaluated once per point of the kept dims (a Reduce kernel's result and epilogue).
// Kinds:
//   Pointwise: all expressions Full, no reduce dims.
//   Reduce:    Full prologue -> one Reduce expression (sum/mean/max/min/prod/var over the reduce
//              dims) -> Kept epilogue.
//   Norm:      Full prologue -> one Norm expression (softmax, log_softmax, layer_norm over the
//              reduce dims) -> Full epilogue. Code: pass 1 computes the statistics (online
//              max+sum, or shifted sum + sum of squares), pass 2 recomputes the prologue and
//              writes; at most two passes over the data.
// Stores write an expression into a value's buffer, contiguously in that value's own shape
// (strides mapped onto the iteration space). A value is stored when something outside the
// kernel reads it or it is a graph output; otherwise it lives in registers only.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::lower {

enum class LoopKind : uint8_t { Pointwise, Reduce, Norm };
const char* loop_kind_name(LoopKind k);

enum class Level : uint8_t { Full, Kept };

struct Access {
  ValueId value = kNoValue;  // the materialized value whose memory is read or written
  int64_t offset = 0;        // elements
  std::vector<int64_t> strides;  // one per iteration dim (elements; 0 = broadcast)
  DType dtype = DType::Float32;
};

struct LoopExpr {
  enum class Kind : uint8_t { Load, Scalar, Op, Reduce, Norm } kind = Kind::Op;
  Level level = Level::Full;
  DType dtype = DType::Float32;  // the graph type of the value (storage dtype)
  OpId op{};                     // Op / Reduce / Norm
  const Attrs* attrs = nullptr;  // the node's attributes (Op / Reduce / Norm)
  std::vector<int> args;         // expression indices (Op: inputs; Norm: x, weight, bias)
  int load = -1;                 // Load: index into LoopKernel::loads
  double scalar = 0;             // Scalar: a constant folded in as a literal
  int32_t node = -1;             // graph node that defines it (-1 for loads/scalars)
  int64_t count = 1;             // Reduce/Norm: number of reduced elements
};

struct LoopStore {
  int expr = -1;
  Access access;
};

struct LoopKernel {
  std::string name;  // "k3_add_relu"
  LoopKind kind = LoopKind::Pointwise;
  std::vector<int32_t> nodes;     // graph nodes fused here, in order
  std::vector<int64_t> sizes;     // iteration space: kept dims, then reduce dims
  int reduce_dims = 0;
  std::vector<Access> loads;
  std::vector<LoopExpr> exprs;    // SSA, in evaluation order
  std::vector<LoopStore> stores;
  int anchor = -1;                // the Reduce / Norm expression (-1 for Pointwise)

  int64_t numel() const;
  int kept_dims() const { return int(sizes.size()) - reduce_dims; }
};

// A readable dump: space, loads with strides, expressions, stores (for tests and explain).
std::string loop_kernel_str(const Graph& g, const LoopKernel& k);

}  // namespace kiln::lower
