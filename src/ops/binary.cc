// Binary pointwise ops: add sub mul div pow maximum minimum, the comparisons eq ne lt le gt ge,
// logical and/or, and where(cond, a, b). NumPy broadcasting; dtype promotion by promote_types.
//
// Note [Binary op semantics]
// Both operands are converted to the compute dtype promote_types(a, b) and then combined, as in
// PyTorch. Arithmetic ops output the compute dtype; comparisons and and/or output bool; where
// outputs promote_types(a, b).
//   - Integer (and bool) compute dtypes: the reference works in int64 and wraps on overflow
//     (two's complement, as PyTorch does). div truncates toward zero (C semantics, not Python's
//     floor); a zero divisor is an error, never a crash. pow with a negative exponent is an
//     error (the result is not an integer).
//   - Floating compute dtypes: each operand is first rounded to the compute dtype (so that
//     eq(int32 2049, f16 2048) is true, as in PyTorch), the op runs in float64 and the result is
//     rounded once on store.
//   - maximum/minimum propagate NaN (torch.maximum, np.maximum).
//   - and/or treat any nonzero value (NaN included) as true.
// The eager kernel adds a float32 fast path for contiguous operands of the same shape, a scalar
// (numel 1) on either side, and a row [N] against [..., N]; everything else runs the reference.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ops/kernel_path.h"
#include "ops/kernel_util.h"

namespace kiln {
namespace {

enum class BinaryKind { Arith, Compare, Logical };

BinaryKind binary_kind(OpId id) {
  switch (id) {
    case OpId::Eq: case OpId::Ne: case OpId::Lt: case OpId::Le: case OpId::Gt: case OpId::Ge:
      return BinaryKind::Compare;
    case OpId::And: case OpId::Or: return BinaryKind::Logical;
    default: return BinaryKind::Arith;
  }
}

// Wrapping int64 arithmetic (signed overflow is undefined in C++; PyTorch wraps).
int64_t wrap_add(int64_t a, int64_t b) { return int64_t(uint64_t(a) + uint64_t(b)); }
int64_t wrap_sub(int64_t a, int64_t b) { return int64_t(uint64_t(a) - uint64_t(b)); }
int64_t wrap_mul(int64_t a, int64_t b) { return int64_t(uint64_t(a) * uint64_t(b)); }

int64_t int_div(int64_t a, int64_t b) {
  if (b == 0)
    fail("op 'div': integer division by zero (divide floating tensors to get inf/nan, or "
         "mask the zeros first)");
  if (b == -1) return wrap_sub(0, a);  // INT64_MIN / -1 overflows: wrap like the other ops
  return a / b;                        // C++ division truncates toward zero
}

int64_t int_pow(int64_t base, int64_t exp) {
  if (exp < 0)
    fail("op 'pow': integer base raised to the negative exponent {}; the result is not an "
         "integer (cast to a floating dtype first)", exp);
  uint64_t result = 1, b = uint64_t(base);
  for (uint64_t e = uint64_t(exp); e; e >>= 1) {
    if (e & 1) result *= b;
    b *= b;
  }
  return int64_t(result);
}

// One functor per op: f64 (reference, floating), i64 (reference, integer), f32 (eager fast
// path). Comparisons and logical ops return bool.
struct AddOp {
  static double f64(double a, double b) { return a + b; }
  static int64_t i64(int64_t a, int64_t b) { return wrap_add(a, b); }
  static float f32(float a, float b) { return a + b; }
};
struct SubOp {
  static double f64(double a, double b) { return a - b; }
  static int64_t i64(int64_t a, int64_t b) { return wrap_sub(a, b); }
  static float f32(float a, float b) { return a - b; }
};
struct MulOp {
  static double f64(double a, double b) { return a * b; }
  static int64_t i64(int64_t a, int64_t b) { return wrap_mul(a, b); }
  static float f32(float a, float b) { return a * b; }
};
struct DivOp {
  static double f64(double a, double b) { return a / b; }
  static int64_t i64(int64_t a, int64_t b) { return int_div(a, b); }
  static float f32(float a, float b) { return a / b; }
};
struct PowOp {
  static double f64(double a, double b) { return std::pow(a, b); }
  static int64_t i64(int64_t a, int64_t b) { return int_pow(a, b); }
  static float f32(float a, float b) { return std::pow(a, b); }
};
// (a > b || a != a) ? a : b returns a NaN from either side and compiles to compare + blend.
struct MaximumOp {
  static double f64(double a, double b) { return (a > b || a != a) ? a : b; }
  static int64_t i64(int64_t a, int64_t b) { return a > b ? a : b; }
  static float f32(float a, float b) { return (a > b || a != a) ? a : b; }
};
struct MinimumOp {
  static double f64(double a, double b) { return (a < b || a != a) ? a : b; }
  static int64_t i64(int64_t a, int64_t b) { return a < b ? a : b; }
  static float f32(float a, float b) { return (a < b || a != a) ? a : b; }
};
// Comparisons and logical ops: bool results.
#define KILN_BOOL_OP(Name, expr)                           \
  struct Name {                                            \
    static bool f64(double a, double b) { return expr; }   \
    static bool i64(int64_t a, int64_t b) { return expr; } \
    static bool f32(float a, float b) { return expr; }     \
  };
KILN_BOOL_OP(EqOp, a == b)
KILN_BOOL_OP(NeOp, a != b)
KILN_BOOL_OP(LtOp, a < b)
KILN_BOOL_OP(LeOp, a <= b)
KILN_BOOL_OP(GtOp, a > b)
KILN_BOOL_OP(GeOp, a >= b)
KILN_BOOL_OP(AndOp, a != 0 && b != 0)
KILN_BOOL_OP(OrOp, a != 0 || b != 0)
#undef KILN_BOOL_OP

// Calls f.template operator()<XxxOp>() for the op's functor.
template <typename F>
void visit_binary(OpId id, F&& f) {
  switch (id) {
    case OpId::Add: return f.template operator()<AddOp>();
    case OpId::Sub: return f.template operator()<SubOp>();
    case OpId::Mul: return f.template operator()<MulOp>();
    case OpId::Div: return f.template operator()<DivOp>();
    case OpId::Pow: return f.template operator()<PowOp>();
    case OpId::Maximum: return f.template operator()<MaximumOp>();
    case OpId::Minimum: return f.template operator()<MinimumOp>();
    case OpId::Eq: return f.template operator()<EqOp>();
    case OpId::Ne: return f.template operator()<NeOp>();
    case OpId::Lt: return f.template operator()<LtOp>();
    case OpId::Le: return f.template operator()<LeOp>();
    case OpId::Gt: return f.template operator()<GtOp>();
    case OpId::Ge: return f.template operator()<GeOp>();
    case OpId::And: return f.template operator()<AndOp>();
    case OpId::Or: return f.template operator()<OrOp>();
    default: KILN_ASSERT(false && "not a binary op");
  }
}

// Rounds v (a value of dtype `from`) to the floating dtype `to`, as a cast would.
double round_to(double v, DType from, DType to) {
  if (from == to) return v;
  switch (to) {
    case DType::Float32: return float(v);
    case DType::Float16: return float(Half(float(v)));
    case DType::BFloat16: return float(BFloat16(float(v)));
    default: return v;
  }
}

void store_result(void* p, DType d, double v) { store_f64(p, d, v); }
void store_result(void* p, DType d, int64_t v) { store_i64(p, d, v); }
void store_result(void* p, DType d, bool v) { store_i64(p, d, v ? 1 : 0); }

// ---- reference ----------------------------------------------------------------------------------
template <typename Op>
void ref_binary_impl(const KernelContext& ctx) {
  const Tensor& a = ctx.inputs[0];
  const Tensor& b = ctx.inputs[1];
  Tensor& out = ctx.outputs[0];
  const Dims& sizes = out.sizes();
  Dims strides[3] = {broadcast_strides(a, sizes), broadcast_strides(b, sizes), out.strides()};
  DType ad = a.dtype(), bd = b.dtype(), od = out.dtype();
  DType cd = promote_types(ad, bd);
  int64_t as = a.element_size(), bs = b.element_size(), os = out.element_size();
  const char* ap = static_cast<const char*>(a.raw_data());
  const char* bp = static_cast<const char*>(b.raw_data());
  char* op = static_cast<char*>(out.raw_data());
  if (is_floating(cd)) {
    for_each_broadcast(sizes, strides, [&](int64_t, const int64_t* off) {
      double x = round_to(load_f64(ap + off[0] * as, ad), ad, cd);
      double y = round_to(load_f64(bp + off[1] * bs, bd), bd, cd);
      store_result(op + off[2] * os, od, Op::f64(x, y));
    });
  } else {
    for_each_broadcast(sizes, strides, [&](int64_t, const int64_t* off) {
      int64_t x = load_i64(ap + off[0] * as, ad);
      int64_t y = load_i64(bp + off[1] * bs, bd);
      store_result(op + off[2] * os, od, Op::i64(x, y));
    });
  }
}

void ref_binary(const KernelContext& ctx) {
  visit_binary(ctx.op.id, [&]<typename Op>() { ref_binary_impl<Op>(ctx); });
}

void ref_where(const KernelContext& ctx) {
  const Tensor& c = ctx.inputs[0];
  const Tensor& a = ctx.inputs[1];
  const Tensor& b = ctx.inputs[2];
  Tensor& out = ctx.outputs[0];
  const Dims& sizes = out.sizes();
  Dims strides[4] = {broadcast_strides(c, sizes), broadcast_strides(a, sizes),
                     broadcast_strides(b, sizes), out.strides()};
  DType ad = a.dtype(), bd = b.dtype(), od = out.dtype();
  int64_t as = a.element_size(), bs = b.element_size(), os = out.element_size();
  const bool* cp = c.data<bool>();
  const char* ap = static_cast<const char*>(a.raw_data());
  const char* bp = static_cast<const char*>(b.raw_data());
  char* op = static_cast<char*>(out.raw_data());
  bool floating = is_floating(od);
  for_each_broadcast(sizes, strides, [&](int64_t, const int64_t* off) {
    const char* src = cp[off[0]] ? ap + off[1] * as : bp + off[2] * bs;
    DType sd = cp[off[0]] ? ad : bd;
    if (floating)
      store_f64(op + off[3] * os, od, load_f64(src, sd));
    else
      store_i64(op + off[3] * os, od, load_i64(src, sd));
  });
}

// ---- eager float32 fast path --------------------------------------------------------------------
enum class F32Layout {
  None,     // not covered: use the reference
  Same,     // a and b contiguous, same number of elements as out
  ScalarA,  // a has one element, b is laid out like out
  ScalarB,  // b has one element, a is laid out like out
  RowA,     // a is a row [N] repeated over b = [..., N]
  RowB,     // b is a row [N] repeated over a = [..., N]
};

// True when t's elements in row-major order are out's (broadcasting only prepended 1s).
bool laid_out_like(const Tensor& t, const Tensor& out) {
  return t.is_contiguous() && t.numel() == out.numel();
}

// True when t is a contiguous [1, ..., 1, N] row matching out's last dim.
bool is_row_of(const Tensor& t, const Tensor& out) {
  return t.is_contiguous() && t.dim() >= 1 && out.dim() >= 1 &&
         t.sizes().back() == out.sizes().back() && t.numel() == t.sizes().back();
}

F32Layout f32_layout(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (a.dtype() != DType::Float32 || b.dtype() != DType::Float32 || !out.is_contiguous())
    return F32Layout::None;
  bool a_full = laid_out_like(a, out), b_full = laid_out_like(b, out);
  if (a_full && b_full) return F32Layout::Same;
  if (a.numel() == 1 && b_full) return F32Layout::ScalarA;
  if (b.numel() == 1 && a_full) return F32Layout::ScalarB;
  if (a_full && is_row_of(b, out)) return F32Layout::RowB;
  if (b_full && is_row_of(a, out)) return F32Layout::RowA;
  return F32Layout::None;
}

// The loops are `omp simd` so that g++ -O2 (whose cost model does not vectorize loops of
// unknown trip count on its own) vectorizes them; threads only pay off on large tensors.
template <typename Op, typename T>
void run_f32(F32Layout layout, const float* __restrict a, const float* __restrict b,
             T* __restrict o, int64_t n) {
  switch (layout) {
    case F32Layout::Same:
#pragma omp parallel for simd if (n > 65536)
      for (int64_t i = 0; i < n; ++i) o[i] = Op::f32(a[i], b[i]);
      return;
    case F32Layout::ScalarA: {
      const float s = a[0];
#pragma omp parallel for simd if (n > 65536)
      for (int64_t i = 0; i < n; ++i) o[i] = Op::f32(s, b[i]);
      return;
    }
    case F32Layout::ScalarB: {
      const float s = b[0];
#pragma omp parallel for simd if (n > 65536)
      for (int64_t i = 0; i < n; ++i) o[i] = Op::f32(a[i], s);
      return;
    }
    default: return;
  }
}

// Row broadcast: `full` is [rows, row_len], `row` is [row_len]; row_is_a says which operand the
// row is (the ops are not commutative).
template <typename Op, typename T>
void run_f32_rows(const float* __restrict full, const float* __restrict row, T* __restrict o,
                  int64_t rows, int64_t row_len, bool row_is_a) {
#pragma omp parallel for if (rows * row_len > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict f = full + r * row_len;
    T* __restrict orow = o + r * row_len;
    if (row_is_a) {
#pragma omp simd
      for (int64_t j = 0; j < row_len; ++j) orow[j] = Op::f32(row[j], f[j]);
    } else {
#pragma omp simd
      for (int64_t j = 0; j < row_len; ++j) orow[j] = Op::f32(f[j], row[j]);
    }
  }
}

void eager_binary(const KernelContext& ctx) {
  const Tensor& a = ctx.inputs[0];
  const Tensor& b = ctx.inputs[1];
  Tensor& out = ctx.outputs[0];
  F32Layout layout = f32_layout(a, b, out);
  if (layout == F32Layout::None) return note_kernel_path("reference"), ref_binary(ctx);
  note_kernel_path("f32");
  int64_t n = out.numel();
  if (n == 0) return;
  visit_binary(ctx.op.id, [&]<typename Op>() {
    using T = decltype(Op::f32(0.0f, 0.0f));  // float, or bool for comparisons and and/or
    const float* ap = a.data<float>();
    const float* bp = b.data<float>();
    T* op = out.data<T>();
    if (layout == F32Layout::RowA || layout == F32Layout::RowB) {
      int64_t row_len = out.sizes().back();
      bool row_is_a = layout == F32Layout::RowA;
      run_f32_rows<Op, T>(row_is_a ? bp : ap, row_is_a ? ap : bp, op, n / row_len, row_len,
                          row_is_a);
    } else {
      run_f32<Op, T>(layout, ap, bp, op, n);
    }
  });
}

// ---- inference ----------------------------------------------------------------------------------
std::string dtype_list(const std::vector<DType>& ds) {
  std::string s;
  for (DType d : ds) s += (s.empty() ? "" : ", ") + std::string(info(d).short_name);
  return s;
}

Shape broadcast_or_fail(const InferContext& ctx, const TensorType& x, const char* xn,
                        const TensorType& y, const char* yn) {
  if (x.device != y.device)
    ctx.fail("input '{}' is on {} but input '{}' is on {}; move them to one device", xn,
             x.device.str(), yn, y.device.str());
  try {
    return broadcast_shapes(x.shape, y.shape);
  } catch (const Error& e) {
    ctx.fail("inputs '{}' and '{}' do not broadcast: {}", xn, yn, e.message());
  }
}

std::vector<TensorType> infer_binary(const InferContext& ctx) {
  const TensorType& a = ctx.in(0);
  const TensorType& b = ctx.in(1);
  Shape shape = broadcast_or_fail(ctx, a, "a", b, "b");
  DType cd = promote_types(a.dtype, b.dtype);
  if (!ctx.op.supports_dtype(cd))
    ctx.fail("inputs 'a' ({}) and 'b' ({}) promote to {}, which this op does not support "
             "(supported: {})", dtype_name(a.dtype), dtype_name(b.dtype), dtype_name(cd),
             dtype_list(ctx.op.dtypes));
  DType od = binary_kind(ctx.op.id) == BinaryKind::Arith ? cd : DType::Bool;
  return {TensorType(od, shape, a.device)};
}

std::vector<TensorType> infer_where(const InferContext& ctx) {
  const TensorType& c = ctx.in(0);
  const TensorType& a = ctx.in(1);
  const TensorType& b = ctx.in(2);
  if (c.dtype != DType::Bool)
    ctx.fail("input 'cond' has dtype {}; expected bool (make it with a comparison, e.g. "
             "ne(x, 0))", dtype_name(c.dtype));
  Shape ab = broadcast_or_fail(ctx, a, "a", b, "b");
  TensorType ab_type(a.dtype, ab, a.device);
  Shape shape = broadcast_or_fail(ctx, c, "cond", ab_type, "a/b");
  return {TensorType(promote_types(a.dtype, b.dtype), shape, a.device)};
}

// ---- samples ------------------------------------------------------------------------------------
// Replaces every value of t's storage by floor(2x)/2: a small set of values, exact in f16/bf16,
// so that comparisons see ties in every dtype. Works on views that cover their whole storage
// (the sample_* helpers' tensors).
Tensor halves(Tensor t) {
  double* p = static_cast<double*>(t.impl()->storage->data());
  size_t n = t.impl()->storage->nbytes() / sizeof(double);
  for (size_t i = 0; i < n; ++i) p[i] = std::floor(2.0 * p[i]) / 2.0;
  return t;
}

Tensor ints(Generator& g, const Dims& sizes, int64_t lo, int64_t hi) {
  return Tensor::randint(sizes, g, lo, hi, DType::Int32);
}
Tensor bools(Generator& g, const Dims& sizes) {
  return Tensor::randint(sizes, g, 0, 2, DType::Bool);
}

// Shapes every binary op is sampled on; `make_a`/`make_b` draw the operands (float64).
template <typename FA, typename FB>
std::vector<OpSample> shape_samples(Generator& g, FA make_a, FB make_b) {
  return {
      {{make_a(g, Dims{2, 3, 4}), make_b(g, Dims{2, 3, 4})}, {}, "same shape [2,3,4]"},
      {{make_a(g, Dims{3, 1}), make_b(g, Dims{4})}, {}, "broadcast [3,1] x [4]"},
      {{make_a(g, Dims{2, 1, 5}), make_b(g, Dims{3, 1})}, {}, "broadcast [2,1,5] x [3,1]"},
      {{make_a(g, Dims{5, 7}), make_b(g, Dims{7})}, {}, "row broadcast [5,7] x [7]"},
      {{make_a(g, Dims{1, 7}), make_b(g, Dims{5, 7})}, {}, "row broadcast [1,7] x [5,7]"},
      {{make_a(g, Dims{3, 4}), make_b(g, Dims{})}, {}, "scalar b"},
      {{make_a(g, Dims{}), make_b(g, Dims{3, 4})}, {}, "scalar a"},
      {{make_a(g, Dims{1, 1}), make_b(g, Dims{2, 3})}, {}, "numel-1 a [1,1] x [2,3]"},
      {{make_a(g, Dims{}), make_b(g, Dims{})}, {}, "both scalars"},
      {{make_a(g, Dims{0, 3}), make_b(g, Dims{3})}, {}, "size-0 [0,3] x [3]"},
      {{make_a(g, Dims{2, 0, 1}), make_b(g, Dims{4})}, {}, "size-0 [2,0,1] x [4]"},
  };
}

Tensor randn_t(Generator& g, const Dims& s) { return sample_randn(g, s); }
Tensor halves_t(Generator& g, const Dims& s) { return halves(sample_randn(g, s, 2.0)); }

std::vector<OpSample> samples_arith(Generator& g) {
  auto v = shape_samples(g, randn_t, randn_t);
  v.push_back({{sample_noncontiguous(g, {3, 5}), sample_randn(g, {3, 5})}, {},
               "non-contiguous a [3,5]"});
  v.push_back({{sample_randn(g, {4, 3}), sample_noncontiguous(g, {4, 3})}, {},
               "non-contiguous b [4,3]"});
  v.push_back({{sample_randn(g, {3, 4}), ints(g, {3, 4}, -3, 4)}, {}, "mixed: b int32"});
  v.push_back({{sample_randn(g, {2, 3}), bools(g, {2, 3})}, {}, "mixed: b bool"});
  // inf - inf, 0 * inf, NaN against numbers and infinities, -0 + 0, denormals, float16 overflow.
  v.push_back({{sample_special(g, {4, 6}), sample_special(g, {4, 6})}, {},
               "special values, same shape"});
  v.push_back({{sample_special(g, {3, 12}), sample_special(g, {12})}, {},
               "special values, row broadcast [3,12] x [12]"});
  return v;
}

// Denominators in [1, 4): positive, so nonzero after the op harness maps them to any integer
// dtype (uint8 included).
std::vector<OpSample> samples_div(Generator& g) {
  auto num = [](Generator& g, const Dims& s) { return sample_randn(g, s, 3.0); };
  auto den = [](Generator& g, const Dims& s) { return sample_uniform(g, s, 1.0, 4.0); };
  auto v = shape_samples(g, num, den);
  v.push_back({{sample_noncontiguous(g, {3, 5}), sample_uniform(g, {3, 5}, 1.0, 4.0)}, {},
               "non-contiguous numerator"});
  v.push_back({{sample_randn(g, {3, 4}, 3.0), ints(g, {3, 4}, 1, 5)}, {},
               "mixed: int32 denominators"});
  // Special numerators; denominators of both signs, some beyond float16's range (x / inf = 0
  // there) but never zero in any dtype (integer division by zero is an error).
  Tensor divisors = sample_uniform(g, {4, 6}, 1.0, 4.0);
  double* d = divisors.data<double>();
  for (int64_t i = 0; i < divisors.numel(); ++i)
    d[i] *= (i % 3 == 0 ? -1.0 : 1.0) * (i % 5 == 0 ? 1e5 : 1.0);
  v.push_back({{sample_special(g, {4, 6}), divisors}, {}, "special numerators"});
  return v;
}

// Bases in (0.5, 2). Exponents in (-0.12, 0.87): the op harness maps non-integer samples to
// round(4v) for integer dtypes, which gives exponents 0..3 there (integer pow rejects negative
// exponents), while floating dtypes see small negative and fractional exponents.
std::vector<OpSample> samples_pow(Generator& g) {
  auto base = [](Generator& g, const Dims& s) { return sample_uniform(g, s, 0.5, 2.0); };
  auto expo = [](Generator& g, const Dims& s) { return sample_uniform(g, s, -0.12, 0.87); };
  auto v = shape_samples(g, base, expo);
  v.push_back({{sample_uniform(g, {3, 4}, 0.5, 2.0), Tensor::randint({3, 4}, g, 0, 4, DType::Float64)},
               {}, "integer-valued exponents 0..3"});
  v.push_back({{sample_uniform(g, {3, 4}, 0.5, 2.0), ints(g, {3, 4}, 0, 4)}, {},
               "mixed: int32 exponents"});
  v.push_back({{sample_uniform(g, {6}, 0.5, 2.0), Tensor::scalar(2.0, DType::Float64)}, {},
               "square"});
  // Special bases with non-negative exponents (0, 1/2, 1, 2, NaN, +inf: pow(x, 0) = 1 even for
  // NaN, pow(1, NaN) = 1; NaN and inf become 0 in integer dtypes, Note [Integer cases]).
  Tensor ex = Tensor::empty({4, 6}, DType::Float64);
  const double kinds[] = {0.0, 0.5, 1.0, 2.0, std::numeric_limits<double>::quiet_NaN(),
                          std::numeric_limits<double>::infinity()};
  for (int64_t i = 0; i < 24; ++i) ex.data<double>()[i] = kinds[(i * 5 + i / 6) % 6];
  v.push_back({{sample_special(g, {4, 6}), ex}, {}, "special bases"});
  return v;
}

// Values from {.., -1, -0.5, 0, 0.5, ..}: ties occur and survive the conversion to every dtype
// (exact in f16/bf16; the harness's integer mapping is monotonic).
std::vector<OpSample> samples_compare(Generator& g) {
  auto v = shape_samples(g, halves_t, halves_t);
  v.push_back({{halves(sample_noncontiguous(g, {3, 5})), halves_t(g, {3, 5})}, {},
               "non-contiguous a [3,5]"});
  v.push_back({{halves_t(g, {3, 4}), ints(g, {3, 4}, -2, 3)}, {}, "mixed: b int32"});
  // NaN compares false (and != true), infinities order, -0 == 0.
  v.push_back({{sample_special(g, {4, 6}), sample_special(g, {4, 6})}, {}, "special values"});
  return v;
}

std::vector<OpSample> samples_logical(Generator& g) {
  auto v = samples_compare(g);
  v.push_back({{halves_t(g, {2, 5}), bools(g, {2, 5})}, {}, "mixed: b bool"});
  return v;
}

std::vector<OpSample> samples_where(Generator& g) {
  return {
      {{bools(g, {3, 4}), sample_randn(g, {3, 4}), sample_randn(g, {3, 4})}, {}, "same shape"},
      {{bools(g, {3, 1}), sample_randn(g, {3, 4}), sample_randn(g, {4})}, {},
       "broadcast cond [3,1], a [3,4], b [4]"},
      {{bools(g, {2, 1, 5}), sample_randn(g, {}), sample_randn(g, {3, 1})}, {},
       "broadcast cond [2,1,5], scalar a, b [3,1]"},
      {{bools(g, {}), sample_randn(g, {2, 3}), sample_randn(g, {2, 3})}, {}, "scalar cond"},
      {{bools(g, {4, 3}), sample_noncontiguous(g, {4, 3}), sample_randn(g, {4, 3})}, {},
       "non-contiguous a"},
      {{bools(g, {3, 4}), sample_randn(g, {3, 4}), ints(g, {3, 4}, -3, 4)}, {},
       "mixed: b int32"},
      {{bools(g, {0, 4}), sample_randn(g, {0, 4}), sample_randn(g, {4})}, {}, "size-0"},
      {{bools(g, {4, 6}), sample_special(g, {4, 6}), sample_special(g, {4, 6})}, {},
       "special values"},
  };
}

void define_binary(OpId id, SampleFn samples, std::vector<DType> dtypes, const char* doc) {
  OpDef& d = define_op(id);
  d.doc = doc;
  d.inputs = {{"a"}, {"b"}};
  d.infer = infer_binary;
  d.reference = ref_binary;
  d.eager_cpu = eager_binary;
  d.dtypes = std::move(dtypes);
  d.samples = samples;
}

}  // namespace

void register_binary_ops() {
  define_binary(OpId::Add, samples_arith, numeric_dtypes(), "a + b");
  define_binary(OpId::Sub, samples_arith, numeric_dtypes(), "a - b");
  define_binary(OpId::Mul, samples_arith, numeric_dtypes(), "a * b");
  define_binary(OpId::Div, samples_div, numeric_dtypes(),
                "a / b; integers truncate toward zero and a zero divisor is an error");
  define_binary(OpId::Pow, samples_pow, numeric_dtypes(),
                "a ** b; integer pow rejects negative exponents");
  define_binary(OpId::Maximum, samples_arith, numeric_dtypes(),
                "elementwise max; NaN propagates");
  define_binary(OpId::Minimum, samples_arith, numeric_dtypes(),
                "elementwise min; NaN propagates");
  define_binary(OpId::Eq, samples_compare, all_dtypes(), "a == b; output bool");
  define_binary(OpId::Ne, samples_compare, all_dtypes(), "a != b; output bool");
  define_binary(OpId::Lt, samples_compare, numeric_dtypes(), "a < b; output bool");
  define_binary(OpId::Le, samples_compare, numeric_dtypes(), "a <= b; output bool");
  define_binary(OpId::Gt, samples_compare, numeric_dtypes(), "a > b; output bool");
  define_binary(OpId::Ge, samples_compare, numeric_dtypes(), "a >= b; output bool");
  define_binary(OpId::And, samples_logical, all_dtypes(),
                "logical and (nonzero is true); output bool");
  define_binary(OpId::Or, samples_logical, all_dtypes(),
                "logical or (nonzero is true); output bool");

  OpDef& w = define_op(OpId::Where);
  w.doc = "cond ? a : b elementwise; cond must be bool; output promote_types(a, b); the three "
          "inputs broadcast together";
  w.inputs = {{"cond"}, {"a"}, {"b"}};
  w.infer = infer_where;
  w.reference = ref_where;
  w.dtypes = all_dtypes();  // the dtypes of a and b (cond is always bool)
  w.samples = samples_where;
}

}  // namespace kiln
