// autocast-bf16, autocast-f16: run a float32 graph in a low-precision float dtype, as torch's
// autocast does, with the signature unchanged. See Note [Autocast] in autocast.cc for the
// policy table (which op runs in which dtype, and why).
//
// Every op has one row in the policy table (kPolicy in autocast.cc; a missing or doubled row
// fails to compile):
//   low      matmul, linear, conv2d, conv_transpose2d, scaled_dot_product_attention,
//            fused_conv2d, fused_linear: every float32 input is taken in the low dtype;
//   float32  softmax, log_softmax, layer_norm, group_norm, batch_norm, sum, mean, var, prod,
//            scatter_add, exp, log, pow, reciprocal, rsqrt: every float32 input is taken in
//            float32 (the node computes exactly as before);
//   follow   everything else (pointwise ops, views, pooling, data movement, max/min/arg*):
//            low when some non-constant float32 input is already low, float32 when all of them
//            are float32 (a graph input, a float32 island's result), low when every float32
//            input is a constant; float32 also when a constant input has a nonzero finite value
//            the low dtype cannot hold (it would become 0 or inf);
//   as-is    cast: an explicit cast in the model is kept, reading its input as it now is.
// Only float32 values are rewritten: float64, float16, bfloat16, integer and bool values and the
// nodes that touch no float32 value are left as they are (a graph without float32 values is
// returned unchanged).
//
// Conversions: a float32 param or const with data that a node takes in the low dtype is
// converted now, into a new param (const) named `<name>.bf16` (`.f16`): weights are folded,
// never cast per call. A param declared without data (IR text) gets a cast node instead.
// Activations get one cast node per value and dtype, named `<value>.bf16` / `<value>.f32`,
// shared by every reader. A value that is the output of a cast from dtype D, where the cast is
// exact (bf16/f16 -> f32), is read in D as the cast's input: an exact pair low -> f32 -> low is
// never made (inexact pairs, f32 -> low -> f32, are kept: they change values). Graph outputs
// that were float32 are cast back to float32 and keep their names; graph inputs keep their
// float32 type and are cast where a low node reads them.
//
// Errors: a weight of a low node whose finite values overflow the low dtype (|w| > 65504 in
// float16) is NotSupported, naming the node and the weight.
//
// Expects: a valid graph; run after the inference passes (fold-conv-bn folds batch norm in
// float32 first; fuse-epilogues' fused ops are in the low list) and before the target's
// decompositions (a float32 group_norm then decomposes into float32 parts). Guarantees: every
// node in the low list reads no float32 value; every node in the float32 list reads no low value
// made from a float32 one; the graph's input and output types are unchanged. Replaced weights
// stay in the graph: run dce after (and algebraic-simplify and cse for casts the model itself
// had).
#pragma once
#include <cstdint>
#include <memory>
#include <string_view>

#include "passes/pass.h"

namespace kiln {

enum class AutocastPolicy : uint8_t { Low, Float32, Follow, AsIs };
AutocastPolicy autocast_policy(OpId op);
const char* autocast_policy_name(AutocastPolicy p);  // "low", "float32", "follow", "as-is"

struct AutocastResult {
  int low_nodes = 0;      // nodes that now compute in the low dtype
  int float32_nodes = 0;  // nodes that read float32 values and compute in float32
  int casts = 0;          // cast nodes added
  int weights_converted = 0;  // params / consts converted at compile time
  bool changed() const { return low_nodes + casts + weights_converted > 0; }
};
// `low` must be BFloat16 or Float16 (InvalidArgument otherwise).
AutocastResult autocast(Graph& g, DType low);

std::unique_ptr<Pass> make_autocast_pass(DType low);

// The precision option of the compiler, the CLI (--dtype) and the Python frontend: "float32",
// "bfloat16", "float16" or the short names "f32", "bf16", "f16". Anything else is an
// InvalidArgument naming `where` and the accepted names.
DType parse_precision(std::string_view text, std::string_view where);
// Throws InvalidArgument (naming `where`) unless `d` is float32, bfloat16 or float16.
void check_precision(DType d, std::string_view where);

}  // namespace kiln
