// ONNX reductions: ReduceSum/Mean/Max/Min/Prod directly, ReduceL1/L2/LogSum/LogSumExp/SumSquare
// composed; ArgMax/ArgMin (select_last_index through a reversed copy).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "frontends/onnx/convert.h"

namespace kiln::onnx {
namespace {

struct ReduceSpec {
  std::vector<int64_t> dims;  // normalized; empty = all
  bool keepdim = true;
  bool noop = false;  // empty axes with noop_with_empty_axes: the input unchanged
};

// Axes come from an attribute before opset 13 (ReduceSum) / 18 (the others), from an input after.
ReduceSpec reduce_spec(NodeCtx& c, V x, bool axes_input) {
  ReduceSpec s;
  s.keepdim = c.attr_int("keepdims", 1) != 0;
  std::vector<int64_t> axes;
  if (axes_input) {
    if (c.has_input(1)) axes = c.ints_input(1, "axes");
    bool noop_with_empty_axes = c.attr_int("noop_with_empty_axes", 0) != 0;
    s.noop = axes.empty() && noop_with_empty_axes;
  } else {
    axes = c.attr_ints("axes");
  }
  for (int64_t a : axes) {
    int64_t d = c.axis(a, c.rank(x), "axis");
    for (int64_t e : s.dims)
      if (e == d) c.fail("axis {} appears twice in axes", a);
    s.dims.push_back(d);
  }
  return s;
}

V reduce(NodeCtx& c, OpId op, V x, const ReduceSpec& s) {
  if (c.rank(x) == 0) return x;  // nothing to reduce over
  return c.op1(op, {x}, {{"dims", Ints(s.dims)}, {"keepdim", s.keepdim}});
}

enum class Kind { Sum, Mean, Max, Min, Prod, L1, L2, LogSum, LogSumExp, SumSquare };

// The identity of max (low) or min (!low) over an empty set, as a 0-d tensor of dtype d.
Tensor empty_set_identity(DType d, bool low) {
  Tensor t = Tensor::empty(Dims{}, d);
  char* p = static_cast<char*>(t.raw_data());
  switch (d) {
    case DType::Bool: store_i64(p, d, low ? 0 : 1); break;
    case DType::Int8: store_i64(p, d, low ? -128 : 127); break;
    case DType::UInt8: store_i64(p, d, low ? 0 : 255); break;
    case DType::Int32: store_i64(p, d, low ? INT32_MIN : INT32_MAX); break;
    case DType::Int64: store_i64(p, d, low ? INT64_MIN : INT64_MAX); break;
    default: store_f64(p, d, low ? -INFINITY : INFINITY);
  }
  return t;
}
template <Kind K>
void conv_reduce(NodeCtx& c) {
  V x = c.in(0);
  int64_t input_since = K == Kind::Sum ? 13 : 18;
  ReduceSpec s = reduce_spec(c, x, c.opset() >= input_since);
  if (s.noop) {
    c.out(0, x);
    return;
  }
  DType dt = c.dtype(x);
  if ((K == Kind::Max || K == Kind::Min || K == Kind::LogSumExp) && c.rank(x) > 0) {
    // Over an empty set (a reduced dim of size 0) ONNX defines the identity: -inf for max and
    // log-sum-exp, +inf for min (the type's extremes for integers, false/true for bool).
    Shape out;
    bool empty = false;
    for (int d = 0; d < c.rank(x); ++d) {
      bool reduced = s.dims.empty() ||
                     std::find(s.dims.begin(), s.dims.end(), int64_t(d)) != s.dims.end();
      SymInt size = c.shape(x)[size_t(d)];
      if (reduced && size == SymInt(0)) empty = true;
      if (!reduced) out.push_back(size);
      else if (s.keepdim) out.push_back(1);
    }
    if (empty) {
      Ints raw;
      for (SymInt d : out) raw.push_back(d.raw());
      V id = c.constant(empty_set_identity(dt, K != Kind::Min));
      c.out(0, c.op1(OpId::Expand, {id}, {{"shape", raw}}));
      return;
    }
  }
  V y = kNone;
  switch (K) {
    case Kind::Sum: y = reduce(c, OpId::Sum, x, s); break;
    case Kind::Mean: y = reduce(c, OpId::Mean, x, s); break;
    case Kind::Max: y = reduce(c, OpId::Max, x, s); break;
    case Kind::Min: y = reduce(c, OpId::Min, x, s); break;
    case Kind::Prod: y = reduce(c, OpId::Prod, x, s); break;
    case Kind::L1: y = reduce(c, OpId::Sum, c.op1(OpId::Abs, {x}), s); break;
    case Kind::SumSquare: y = reduce(c, OpId::Sum, c.mul(x, x), s); break;
    case Kind::L2: {
      V ss = reduce(c, OpId::Sum, c.mul(x, x), s);
      if (!is_floating(c.dtype(ss))) ss = c.cast(ss, DType::Float64);
      y = c.op1(OpId::Sqrt, {ss});
      break;
    }
    case Kind::LogSum: y = c.op1(OpId::Log, {reduce(c, OpId::Sum, x, s)}); break;
    case Kind::LogSumExp: {
      // log(sum(exp(x - m))) + m with m the max (kept for broadcasting), so exp cannot overflow.
      ReduceSpec keep = s;
      keep.keepdim = true;
      V m = reduce(c, OpId::Max, x, keep);
      V sum = reduce(c, OpId::Sum, c.op1(OpId::Exp, {c.sub(x, m)}), s);
      V mo = s.keepdim ? m : reduce(c, OpId::Max, x, s);
      y = c.add(c.op1(OpId::Log, {sum}), mo);
      break;
    }
  }
  // Kiln sums integers in int64; ONNX keeps the input's type.
  c.out(0, c.cast(y, dt));
}

// ArgMax/ArgMin: select_last_index runs on a copy reversed along the axis and maps the index
// back (n - 1 - i).
template <OpId K>
void conv_arg(NodeCtx& c) {
  V x = c.in(0);
  int r = c.rank(x);
  int64_t ax = c.axis(c.attr_int("axis", 0), r, "axis");
  bool keep = c.attr_int("keepdims", 1) != 0;
  bool last = c.attr_int("select_last_index", 0) != 0;
  if (r == 0) c.fail("input must have rank >= 1");
  if (!last) {
    c.out(0, c.op1(K, {x}, {{"dim", ax}, {"keepdim", keep}}));
    return;
  }
  int64_t n = c.dims(x, "input")[size_t(ax)];
  std::vector<int64_t> rev(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) rev[size_t(i)] = n - 1 - i;
  V idx = c.constant(Tensor::from_vector(rev, Dims{n}));
  V flipped = c.op1(OpId::IndexSelect, {x, idx}, {{"dim", ax}});
  V a = c.op1(K, {flipped}, {{"dim", ax}, {"keepdim", keep}});
  c.out(0, c.sub(c.scalar(double(n - 1), DType::Int64), a));
}

}  // namespace

void add_reduce_converters(std::vector<OnnxOpEntry>& t) {
  using enum OpId;
  t.push_back({"ReduceSum", conv_reduce<Kind::Sum>, {Sum, Cast}, ""});
  t.push_back({"ReduceMean", conv_reduce<Kind::Mean>, {Mean, Cast}, ""});
  t.push_back({"ReduceMax", conv_reduce<Kind::Max>, {Max, Cast, Expand}, ""});
  t.push_back({"ReduceMin", conv_reduce<Kind::Min>, {Min, Cast, Expand}, ""});
  t.push_back({"ReduceProd", conv_reduce<Kind::Prod>, {Prod, Cast}, ""});
  t.push_back({"ReduceL1", conv_reduce<Kind::L1>, {Sum, Abs, Cast}, "sum(|x|)"});
  t.push_back({"ReduceL2", conv_reduce<Kind::L2>, {Sum, Mul, Sqrt, Cast}, "sqrt(sum(x*x))"});
  t.push_back({"ReduceSumSquare", conv_reduce<Kind::SumSquare>, {Sum, Mul, Cast}, "sum(x*x)"});
  t.push_back({"ReduceLogSum", conv_reduce<Kind::LogSum>, {Sum, Log, Cast}, "log(sum(x))"});
  t.push_back({"ReduceLogSumExp", conv_reduce<Kind::LogSumExp>, {Max, Sum, Exp, Sub, Log, Add, Cast, Expand},
               "log(sum(exp(x - max))) + max"});
  t.push_back({"ArgMax", conv_arg<Argmax>, {Argmax, IndexSelect, Sub},
               "select_last_index through a reversed copy"});
  t.push_back({"ArgMin", conv_arg<Argmin>, {Argmin, IndexSelect, Sub},
               "select_last_index through a reversed copy"});
}

}  // namespace kiln::onnx
