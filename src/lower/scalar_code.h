// The scalar C form of loop-nest expressions (lower/loop_ir.h), shared by every target's kernel
// emitter: the same text compiles as host C++ (CPU target) and as CUDA C (CUDA target), over the
// names of ops/scalar_math.h (Note [Scalar math]). A target's emitter adds what is its own:
// the loop structure, vector forms, how an access becomes a pointer.
//
// Conventions of the emitted code: expression i is a local `v<i>` of compute_type(dtype);
// load i reads `L<i>[index]` (a typed pointer the emitter declares); store i writes `S<i>[index]`.
// Values compute in float for f32/bf16/f16 (rounded to bf16/f16 after every op that produces
// one, as the eager kernels store them), double for f64, i64 for integers, bool for bool.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lower/loop_ir.h"

namespace kiln::lower {

// How a dialect spells what differs between host C++ and CUDA C.
struct ScalarDialect {
  const char* nan = "std::numeric_limits<double>::quiet_NaN()";  // a double NaN literal
  // Per load, the text that replaces `L<i>[index]` where not empty (a vector path that staged
  // the element in a register array: "kL0[j_]"); null: every load reads its pointer.
  const std::vector<std::string>* load_text = nullptr;
};
inline constexpr ScalarDialect kHostDialect{};
inline constexpr ScalarDialect kCudaDialect{"__longlong_as_double(0x7ff8000000000000LL)"};

bool floating_compute(DType d);   // f32, bf16, f16 (computed in float)
const char* storage_type(DType d);  // the element type of a buffer: float, u16, int8_t, ...
const char* compute_type(DType d);  // float, double, i64, bool
// A double literal: "1.5", "INFINITY", "(-INFINITY)" or the dialect's NaN.
std::string literal(double v, const ScalarDialect& d);

// The index expression "i0 * 12 + i2" of a strided access over the iteration variables i<t>
// (dims with stride 0 are left out; "0" when nothing remains). `skip_inner` leaves out the last.
std::string index_expr(const std::vector<int64_t>& strides, bool skip_inner = false);

// Expression `e` of kernel `k` converted to the compute type of `to` ("v3", "(float)(v3)").
std::string convert_expr(const LoopKernel& k, int e, DType to);
// Load `li` as a value of its compute type: "L0[i0 * 4 + i1]", "kn_bf16_f32(L1[i1])", ...
std::string load_expr(const LoopKernel& k, int li, const ScalarDialect& d = kHostDialect);
// The right-hand side of `const compute_type v<e> = ...;` for a Load, Scalar or Op expression
// (Reduce and Norm expressions are the emitter's). Throws Internal naming the kernel for an op
// without loop code.
std::string scalar_expr(const LoopKernel& k, int e, const ScalarDialect& d);
// The value written by store `si` of expression value `v`: "kn_f32_bf16((float)v3)", "(float)v3".
std::string store_value(DType storage, const std::string& v);

// The expressions `root` depends on, itself included (true at their index; -1 args skipped).
std::vector<bool> expr_closure(const LoopKernel& k, int root);
// The trailing comment of expression `e`'s line: "  // add fc1" for an Op expression that
// comes from a node of `g`, "" otherwise.
std::string expr_comment(const Graph& g, const LoopKernel& k, int e);

}  // namespace kiln::lower
