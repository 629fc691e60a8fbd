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
//   Scatter:   scatter_add alone. `sizes` is the index's shape with the scattered dim moved last
//              (reduce_dims = 1: walked in order, never split between threads); the kept dims
//              are parallel. The kernel first copies x into the output (LoopKernel::scatter),
//              then adds src at the output position whose scattered coordinate is the index.
//              Two points with different kept coordinates write different output rows, so the
//              parallel loop has no races and every output element sums its terms in index
//              order: the result is deterministic and independent of the thread count.
// Indexed reads (Note [Indexed loads]): an Indexed expression reads a materialized value at a
// position that is partly computed: gather / index_select / embedding replace one source dim's
// coordinate by an index expression (negative indices wrap; an index out of range is reported
// through the kernel's IndexCheck and read as 0, so memory outside the source is never touched);
// grid_sample computes four taps from two coordinate expressions (bilinear, zeros padding).
// Its `load` is the source access with the indexed dims' strides left out; the source is never
// a register (it is read at other points than the one being computed), the index may be.
// Stores write an expression into a value's buffer, contiguously in that value's own shape
// (strides mapped onto the iteration space). A value is stored when something outside the
// kernel reads it or it is a graph output; otherwise it lives in registers only.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::lower {

enum class LoopKind : uint8_t { Pointwise, Reduce, Norm, Scatter };
const char* loop_kind_name(LoopKind k);

enum class Level : uint8_t { Full, Kept };

struct Access {
  ValueId value = kNoValue;  // the materialized value whose memory is read or written
  int64_t offset = 0;        // elements
  std::vector<int64_t> strides;  // one per iteration dim (elements; 0 = broadcast)
  DType dtype = DType::Float32;
};

struct LoopExpr {
  enum class Kind : uint8_t { Load, Scalar, Op, Reduce, Norm, Indexed } kind = Kind::Op;
  Level level = Level::Full;
  DType dtype = DType::Float32;  // the graph type of the value (storage dtype)
  OpId op{};                     // Op / Reduce / Norm
  const Attrs* attrs = nullptr;  // the node's attributes (Op / Reduce / Norm)
  std::vector<int> args;         // expression indices (Op: inputs; Norm: x, weight, bias)
  int load = -1;                 // Load: index into LoopKernel::loads
  double scalar = 0;             // Scalar: a constant folded in as a literal
  int32_t node = -1;             // graph node that defines it (-1 for loads/scalars)
  int64_t count = 1;             // Reduce/Norm: number of reduced elements
  // Indexed (op = the node's op): the source's indexed dims, their element strides and sizes
  // (gather-like: one, the index is args[0]; grid_sample: y then x, the coordinates are
  // args[0] = grid x, args[1] = grid y), and the kernel's check for bad indices (-1: none).
  int64_t src_stride[2] = {0, 0};
  int64_t src_size[2] = {0, 0};
  int check = -1;
};

// An index out of range inside a kernel: the kernel stops using it (reads element 0 instead)
// and reports which check failed and the value; the launch then throws
// `message_prefix + value + message_suffix` (a kiln::Error naming the node).
struct IndexCheck {
  int32_t node = -1;
  std::string message_prefix, message_suffix;
};
// The check of node `n` (index `node`) reading along `what` ("dim 1 of x") of size `size`:
// "<op> '<node>': index <value> is out of range for <what> of size <size> (valid range [..])".
IndexCheck index_check(int32_t node, const Node& n, const std::string& what, int64_t size);

// LoopKind::Scatter: out = x (copied over out's own shape first), then out[..] += src at the
// indexed positions.
struct LoopScatter {
  Access init;                   // x, strides over init_sizes (out's shape)
  std::vector<int64_t> init_sizes;
  int index = -1, src = -1;      // expressions (Full level, over the kernel's space)
  Access out;                    // strides per iteration dim; 0 on the scattered (last) dim
  int64_t dim_stride = 0;        // out's element stride on the scattered dim
  int64_t dim_size = 0;          // out's size there (valid indices: [-size, size))
  int check = -1;
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
  std::vector<IndexCheck> checks; // Note [Indexed loads]
  LoopScatter scatter;            // LoopKind::Scatter only

  int64_t numel() const;
  int kept_dims() const { return int(sizes.size()) - reduce_dims; }
};

// A readable dump: space, loads with strides, expressions, stores (for tests and explain).
std::string loop_kernel_str(const Graph& g, const LoopKernel& k);

}  // namespace kiln::lower
