// The oneDNN extern-kernel lowering of the CPU compiler: convolution, deconvolution, pooling,
// linear and matmul nodes become oneDNN primitives built once at compile time. See Note [oneDNN
// lowering] and Note [layout choice] in onednn_lowering.cc.
//
// Expects: a Graph with concrete shapes whose weights (and biases) are Param/Const values with
// data (a node whose weight is an activation, or whose shapes are symbolic, is not lowered).
// Guarantees: every lowered node runs through run() with no heap allocation in Kiln's code
// (oneDNN's own execute() allocates a few small objects; see the Note), into the value layouts
// that blocked() / value_bytes() report. dnnl.hpp stays inside the .cc file.
#pragma once
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compiler/target.h"
#include "ir/graph.h"

namespace kiln::kernels {
class OnednnNode;
struct OnednnNodeDesc;
}  // namespace kiln::kernels

namespace kiln::cpu {

// How a linear / fused_linear node is computed: oneDNN inner_product (weights [out, in]) or
// matmul (x @ W^T with W^T prepacked). Auto picks per problem (see Note [linear choice]).
enum class LinearImpl : uint8_t { Auto, InnerProduct, Matmul };

// How convolutions pick their activation layout and algorithm (see Note [convolution policy]).
//   Auto:      dst format_tag::any and the direct algorithm: oneDNN's own preference (brgconv
//              on nhwc on AVX-512 CPUs).
//              Where OnednnOptions::winograd is set, 3x3 stride-1 f32 convolutions take
//              oneDNN's Winograd algorithm where it agrees with the direct one and is not
//              slower (Note [measured Winograd]).
//   Blocked:   blocked activations in the ISA's native block, nChw16c on AVX-512 and nChw8c
//              on AVX2 (the jit direct kernels; a 16c layout on AVX2 has only oneDNN's
//              reference kernels, minutes per ResNet call). Numerically direct.
//   Winograd:  as Blocked, and every 3x3 stride-1 undilated ungrouped f32 convolution uses
//              oneDNN's Winograd algorithm where it has an implementation (max-autotune's
//              whole-graph candidate, behind its accuracy check).
enum class ConvPolicy : uint8_t { Auto, Blocked, Winograd };

// The channel block of ConvPolicy::Blocked on this CPU: 16 with AVX-512, else 8.
int native_conv_block();
// Its layout name, "nChw16c" or "nChw8c" (the CPU target's knob value for the policy).
const char* native_conv_layout();

// Whether concat node n of g is one the oneDNN lowering takes (Note [oneDNN concat] in
// kernels/onednn_node.cc): along the channels of 4-D values, each produced by a convolution, a
// pooling or such a concat, so that the parts can stay in the layout they were computed in.
bool onednn_concat_candidate(const Graph& g, const Node& n);

// A matmul operand that is a strided view rather than a contiguous buffer (a permuted or
// transposed activation; input 0 = a or 1 = b): run() then gets the view's first element as
// that input's pointer. See Note [strided matmul operands].
using compiler::StridedOperand;

// Note [measured convolution layout] (onednn_lowering.cc): one timed candidate of a
// convolution whose layout is measured, and the pick among them, by index. candidates[0] is the
// default build when `timed_default` (a later candidate replaces it below kReplaceDefaultBelow
// of its time, or 0.9 when it runs in place; one with the default's description is the default
// timed again, and lends it the better time: candidates[0].ms is updated), else the first in
// order wins unless a later one is 10% faster.
inline constexpr double kReplaceDefaultBelow = 0.75;
struct TimedLayoutCandidate {
  double ms = 0;            // its best time
  bool in_place = false;    // one step (no reorder or copy), the output in the default's layout
  std::string description;  // its build's (two equal ones are one kernel)
};
size_t pick_measured_layout(std::vector<TimedLayoutCandidate>& candidates, bool timed_default);

struct OnednnOptions {
  bool allow_blocked = true;  // false: every activation stays plain NCHW (for autotuning/compare)
  LinearImpl linear = LinearImpl::Auto;
  ConvPolicy conv = ConvPolicy::Auto;
  std::vector<StridedOperand> matmul_strides;
  // A convolution whose one timed call takes more than this many times its roofline gets its
  // layout measured (Note [measured convolution layout] in onednn_lowering.cc); 0 measures every
  // convolution, infinity none but those on a reference kernel.
  double measure_above_roofline = 3.0;
  // False (knob layouts=fixed): no convolution's layout is measured, not even one on a reference
  // kernel; every convolution keeps the layout its policy gives (tests of a layout's own path,
  // bisecting a measured choice). Winograd (below) is decided as before.
  bool measure_layouts = true;
  // Kiln's grouped convolution kernel (Note [Kiln grouped convolution] in
  // kernels/grouped_conv.cc): one more candidate of a measured layout (Measured, knob
  // grouped_conv=measured), pinned wherever it takes the convolution (Kiln, grouped_conv=kiln:
  // tests of its path), or never tried (Onednn, grouped_conv=onednn).
  enum class GroupedConv : uint8_t { Measured, Kiln, Onednn } grouped_conv = GroupedConv::Measured;
  // ConvPolicy::Auto: 3x3 stride-1 f32 convolutions take oneDNN's Winograd algorithm where it
  // agrees with the direct convolution (Note [measured Winograd] in onednn_lowering.cc).
  // False: every convolution is direct.
  bool winograd = true;
  // Winograd is taken only where it differs from the direct convolution by at most
  // winograd_tolerance of the largest output on random activations, and, where
  // winograd_veto_above is finite (knob winograd=measured: kWinogradVetoAbove), not where its
  // timed call takes more than that many times the direct one's. Infinity (the default, knob
  // winograd=checked): no timing decides, so two compiles of a model give the same package.
  static constexpr double kWinogradVetoAbove = 1.2;
  double winograd_tolerance = 1e-5;
  double winograd_veto_above = HUGE_VAL;
  // Per node of the graph (empty: none): runs as generated loop code. Values those kernels
  // share with convolutions may then be stored channels-last (Note [channels-last values] in
  // onednn_lowering.cc).
  std::vector<bool> generated;
};

class OnednnLowering {
 public:
  // `extern_nodes`: node indices to run as oneDNN primitives, among conv2d, fused_conv2d,
  // conv_transpose2d, linear, fused_linear, matmul, max_pool2d and avg_pool2d (another op or an
  // index out of range is an InvalidArgument error). Primitives are created for the current
  // OpenMP thread count (omp_set_num_threads before constructing and before running). Keeps
  // no reference to `g`.
  OnednnLowering(const Graph& g, const std::vector<int32_t>& extern_nodes,
                 const OnednnOptions& options = {});
  ~OnednnLowering();
  OnednnLowering(const OnednnLowering&) = delete;
  OnednnLowering& operator=(const OnednnLowering&) = delete;

  // False for nodes not in extern_nodes and for those oneDNN has no implementation for (dtype,
  // non-constant weight, symbolic shape, a pooling divisor oneDNN cannot express): the caller
  // runs them another way. Their inputs and outputs are then plain.
  bool lowered(int32_t node) const;
  // Why a requested node was not lowered ("" when it was, or was not requested).
  std::string why_not_lowered(int32_t node) const;

  // Whether v is stored in a oneDNN blocked layout (e.g. nChw16c) rather than the plain
  // contiguous layout of its type. Only values between lowered conv/pool nodes can be.
  bool blocked(ValueId v) const;
  // Storage bytes of a blocked value (may exceed the plain size by channel padding); -1 for a
  // plain value (its size is the type's contiguous size).
  int64_t value_bytes(ValueId v) const;
  // Whether plain value v is stored channels-last (4-D, NHWC order in memory; Note
  // [channels-last values]): the loop kernels that read or write it use its strides.
  bool channels_last(ValueId v) const;
  // Bytes of the one scratch region run() needs (the max over lowered nodes: it is reused by
  // each node in turn). Reorder temporaries and oneDNN scratchpads live there.
  int64_t scratchpad_bytes() const;
  // Bytes of scratch lowered node `node` needs (0 for a node not lowered): what the compiler
  // plans for it (Note [Scratch per step] in lower/memory_planner.cc).
  int64_t scratchpad_bytes(int32_t node) const;

  // The per-call state of one lowered node: memory objects of its own for every buffer run()
  // binds (they hold the last pointers), and the steps' argument arrays over them. The
  // primitives, prepacked weights and constants stay shared: runs of one node on distinct
  // instances (and distinct buffers) may happen at the same time, from different threads.
  struct NodeInstance;
  std::shared_ptr<NodeInstance> instance(int32_t node) const;

  // Runs lowered node `node` on `inst` (from instance(node)). inputs[i]: data of the node's
  // input i where it is an activation (input 0; the residual, input 3, of fused_conv2d /
  // fused_linear; both inputs of matmul); entries for params, consts and absent inputs are
  // ignored and may be null. output: the node's output 0, in the layout blocked()/value_bytes()
  // give. scratch: scratchpad_bytes(node) bytes, 64-byte aligned, not used by another run at the
  // same time. The residual may share the output buffer where residual_may_alias_output(node).
  // One instance runs one call at a time; steps run on the calling thread's oneDNN stream.
  void run(int32_t node, NodeInstance& inst, const void* const* inputs, void* output,
           void* scratch) const;
  // The same on an instance of the lowering's own: not reentrant for one node (tests, and
  // callers that run one graph at a time).
  void run(int32_t node, const void* const* inputs, void* output, void* scratch) const;
  // Whether run() accepts the residual's buffer as the output buffer for this node (it has a
  // residual input in the output's layout). A planner that puts the output in place of a
  // residual dying here saves the copy of the residual into the output.
  bool residual_may_alias_output(int32_t node) const;

  // One line: "conv2d 7x7/2 jit:avx512_core src nchw -> dst nChw16c, post-ops: sum(1),relu".
  std::string describe(int32_t node) const;

  // A lowered node's kernel and its plain descriptor (what a package records to rebuild it:
  // Note [oneDNN node descriptors] in kernels/onednn_node.cc).
  std::shared_ptr<const kernels::OnednnNode> node(int32_t node) const;
  const kernels::OnednnNodeDesc& desc(int32_t node) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::cpu
