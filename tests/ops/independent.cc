#include "independent.h"

#include <cmath>
#include <limits>
#include <vector>

namespace kiln::harness {
namespace {

using LD = long double;
constexpr LD kNaN = std::numeric_limits<LD>::quiet_NaN();

Dims dims_of(const TensorType& t) {
  Dims d;
  for (const SymInt& s : t.shape) d.push_back(s.value());
  return d;
}

// Element `flat_out` (row-major over `out`) of t broadcast to `out` (numpy rules).
const char* broadcast_at(const Tensor& t, const Dims& out, const int64_t* idx) {
  int r = t.dim(), ro = int(out.size());
  int64_t off = 0;
  for (int d = 0; d < r; ++d) {
    int od = ro - r + d;
    int64_t i = t.size(d) == 1 ? 0 : idx[od];
    off += i * t.stride(d);
  }
  return static_cast<const char*>(t.raw_data()) + off * t.element_size();
}

LD load(const char* p, DType d) {
  if (is_floating(d)) return LD(load_f64(p, d));
  return LD(load_i64(p, d));
}

// v rounded to dtype d (what the reference does to an operand of another dtype).
LD round_to(LD v, DType d) {
  if (d == DType::Float64 || !is_floating(d)) return v;
  alignas(8) char buf[8];
  store_f64(buf, d, double(v));
  return LD(load_f64(buf, d));
}

Tensor make_output(const TensorType& t) {
  DType d = is_floating(t.dtype) ? DType::Float64 : t.dtype;
  return Tensor::empty(dims_of(t), d);
}

// Set when an integer result is beyond int64 (its wrap-around is not computed here): the
// evaluation then declines the sample.
thread_local bool t_out_of_range = false;

void store(Tensor& out, int64_t flat, LD v) {
  char* p = static_cast<char*>(out.raw_data()) + flat * out.element_size();
  if (is_floating(out.dtype())) {
    store_f64(p, out.dtype(), double(v));
  } else if (is_bool(out.dtype())) {
    store_i64(p, out.dtype(), v != 0);
  } else if (!(std::fabs(v) < 9.2e18L)) {
    t_out_of_range = true;
  } else {
    store_i64(p, out.dtype(), int64_t(v));  // narrower integer dtypes wrap (two's complement)
  }
}

// Kiln's semantics, stated again (Note [Scalar math]): max/min propagate NaN.
LD nan_max(LD a, LD b) { return std::isnan(a) || std::isnan(b) ? kNaN : (a > b ? a : b); }
LD nan_min(LD a, LD b) { return std::isnan(a) || std::isnan(b) ? kNaN : (a < b ? a : b); }

std::optional<LD> unary(OpId op, LD x, const Attrs& attrs, bool integer = false) {
  switch (op) {
    case OpId::Neg: return -x;
    case OpId::Abs: return std::fabs(x);
    case OpId::Exp: return std::exp(x);
    case OpId::Log: return std::log(x);
    case OpId::Sqrt: return std::sqrt(x);
    case OpId::Rsqrt: return 1 / std::sqrt(x);
    case OpId::Reciprocal: return 1 / x;
    case OpId::Sigmoid: return 1 / (1 + std::exp(-x));
    case OpId::Tanh: return std::tanh(x);
    case OpId::Relu: return std::isnan(x) ? x : (x > 0 ? x : LD(0));
    case OpId::Silu: return x / (1 + std::exp(-x));
    case OpId::Erf: return std::erf(x);
    case OpId::Sin: return std::sin(x);
    case OpId::Cos: return std::cos(x);
    case OpId::Floor: return std::floor(x);
    case OpId::Ceil: return std::ceil(x);
    case OpId::Round: {
      // Half to even, written out (not nearbyint, which the kernels use).
      LD f = std::floor(x), d = x - f;
      if (!std::isfinite(x)) return x;
      if (d > 0.5L) return f + 1;
      if (d < 0.5L) return f;
      return std::fmod(f, 2.0L) == 0 ? f : f + 1;
    }
    case OpId::Sign: return std::isnan(x) ? x : LD((x > 0) - (x < 0));
    case OpId::Not: return LD(x == 0);
    case OpId::Gelu: {
      if (attrs.get_string("approximate") == "tanh") {
        const LD c = std::sqrt(2 / 3.14159265358979323846264338327950288L);
        return 0.5L * x * (1 + std::tanh(c * (x + 0.044715L * x * x * x)));
      }
      return 0.5L * x * (1 + std::erf(x / std::sqrt(2.0L)));
    }
    case OpId::Clamp: {
      if (std::isnan(x)) return x;
      // An integer result is an integer: the bounds move to the interior (ceil of min, floor of
      // max).
      if (attrs.has("min")) {
        LD lo = attrs.get_float("min");
        if (integer) lo = std::ceil(lo);
        if (x < lo) x = lo;
      }
      if (attrs.has("max")) {
        LD hi = attrs.get_float("max");
        if (integer) hi = std::floor(hi);
        if (x > hi) x = hi;
      }
      return x;
    }
    default: return std::nullopt;
  }
}

std::optional<LD> binary(OpId op, LD a, LD b, bool integer = false) {
  switch (op) {
    case OpId::Add: return a + b;
    case OpId::Sub: return a - b;
    case OpId::Mul: return a * b;
    case OpId::Div: return integer ? std::trunc(a / b) : a / b;  // integers truncate toward 0
    case OpId::Pow: return std::pow(a, b);
    case OpId::Maximum: return nan_max(a, b);
    case OpId::Minimum: return nan_min(a, b);
    case OpId::Eq: return LD(a == b);
    case OpId::Ne: return LD(a != b);
    case OpId::Lt: return LD(a < b);
    case OpId::Le: return LD(a <= b);
    case OpId::Gt: return LD(a > b);
    case OpId::Ge: return LD(a >= b);
    case OpId::And: return LD(a != 0 && b != 0);
    case OpId::Or: return LD(a != 0 || b != 0);
    default: return std::nullopt;
  }
}

bool is_unary(OpId op) { return unary(op, 0.5L, Attrs{{"approximate", std::string("none")}}).has_value(); }
bool is_binary(OpId op) { return binary(op, 1, 1).has_value(); }
bool is_reduction(OpId op) {
  switch (op) {
    case OpId::Sum: case OpId::Mean: case OpId::Max: case OpId::Min: case OpId::Prod:
    case OpId::Var: case OpId::Argmax: case OpId::Argmin: return true;
    default: return false;
  }
}

// Pointwise ops over broadcast inputs; the operands are rounded to their promoted dtype first,
// as Kiln's type promotion does.
TensorList pointwise(const OpDef& op, const TensorList& in, const Attrs& attrs,
                     std::span<const TensorType> out_types) {
  Tensor out = make_output(out_types[0]);
  const Dims sizes = out.sizes();
  if (op.id == OpId::Cast) {
    // Floating targets round on store; from floating, integer targets truncate toward zero,
    // saturate, NaN -> 0; integer -> integer wraps; bool is x != 0 (NaN is true).
    DType to = out_types[0].dtype;
    int64_t flat = 0;
    for_each_index(sizes, [&](const int64_t* idx) {
      LD x = load(broadcast_at(in[0], sizes, idx), in[0].dtype());
      char* p = static_cast<char*>(out.raw_data()) + flat * out.element_size();
      if (is_floating(to)) store_f64(p, out.dtype(), double(round_to(x, to)));
      else if (is_bool(to)) store_i64(p, to, x != 0);
      else if (!is_floating(in[0].dtype())) store_i64(p, to, int64_t(x));  // int -> int wraps
      else if (std::isnan(x)) store_i64(p, to, 0);
      else {
        LD t = std::trunc(x);
        // The range of the target (exact in long double's 64-bit significand).
        LD lo = to == DType::UInt8  ? 0
                : to == DType::Int8  ? -128
                : to == DType::Int32 ? -2147483648.0L
                                     : -9223372036854775808.0L;
        LD hi = to == DType::UInt8  ? 255
                : to == DType::Int8  ? 127
                : to == DType::Int32 ? 2147483647.0L
                                     : 9223372036854775807.0L;
        store_i64(p, to, t <= lo ? int64_t(lo) : t >= hi ? int64_t(hi) : int64_t(t));
      }
      ++flat;
    });
    return {out};
  }
  if (op.id == OpId::Where) {
    int64_t flat = 0;
    DType od = out_types[0].dtype;
    for_each_index(sizes, [&](const int64_t* idx) {
      bool c = load(broadcast_at(in[0], sizes, idx), in[0].dtype()) != 0;
      const Tensor& src = c ? in[1] : in[2];
      store(out, flat++, round_to(load(broadcast_at(src, sizes, idx), src.dtype()), od));
    });
    return {out};
  }
  const bool two = in.size() >= 2;
  const DType cd = two ? promote_types(in[0].dtype(), in[1].dtype()) : in[0].dtype();
  int64_t flat = 0;
  for_each_index(sizes, [&](const int64_t* idx) {
    LD a = round_to(load(broadcast_at(in[0], sizes, idx), in[0].dtype()), cd);
    LD v;
    if (two) {
      LD b = round_to(load(broadcast_at(in[1], sizes, idx), in[1].dtype()), cd);
      v = *binary(op.id, a, b, !is_floating(cd));
    } else {
      v = *unary(op.id, a, attrs, !is_floating(cd));
    }
    store(out, flat++, v);
  });
  return {out};
}

// Reductions over `dims` (empty = all) or, for argmax/argmin, over `dim` (absent = flattened).
TensorList reduction(const OpDef& op, const Tensor& x, const Attrs& attrs,
                     std::span<const TensorType> out_types) {
  const int r = x.dim();
  std::vector<bool> reduced(static_cast<size_t>(r), false);
  const bool arg = op.id == OpId::Argmax || op.id == OpId::Argmin;
  bool flat_arg = false;
  if (arg) {
    flat_arg = !attrs.has("dim") || r == 0;
    if (!flat_arg) reduced[size_t(normalize_axis(attrs.get_int("dim"), r))] = true;
  } else {
    const Ints& dims = attrs.get_ints("dims");
    if (dims.empty()) reduced.assign(size_t(r), true);
    for (int64_t d : dims) reduced[size_t(normalize_axis(d, r))] = true;
  }
  if (flat_arg) reduced.assign(size_t(r), true);
  // Output index of an input index: the kept dims in order.
  Dims kept;
  for (int d = 0; d < r; ++d)
    if (!reduced[size_t(d)]) kept.push_back(x.size(d));
  const int64_t groups = numel(kept);
  std::vector<std::vector<LD>> members(static_cast<size_t>(groups));
  std::vector<std::vector<int64_t>> positions(static_cast<size_t>(groups));
  const char* base = static_cast<const char*>(x.raw_data());
  int64_t flat = 0;
  for_each_index(x.sizes(), [&](const int64_t* idx) {
    int64_t g = 0, pos = 0;
    for (int d = 0; d < r; ++d) {
      if (!reduced[size_t(d)]) g = g * x.size(d) + idx[d];
      else pos = pos * x.size(d) + idx[d];
    }
    int64_t off = 0;
    for (int d = 0; d < r; ++d) off += idx[d] * x.stride(d);
    members[size_t(g)].push_back(load(base + off * x.element_size(), x.dtype()));
    positions[size_t(g)].push_back(flat_arg ? flat : pos);
    ++flat;
  });
  Tensor out = make_output(out_types[0]);
  KILN_CHECK(out.numel() == groups, "independent {}: {} outputs for {} groups", op.name,
             out.numel(), groups);
  for (int64_t g = 0; g < groups; ++g) {
    const std::vector<LD>& v = members[size_t(g)];
    const LD n = LD(v.size());
    LD acc = 0;
    switch (op.id) {
      case OpId::Sum:
        for (LD e : v) acc += e;
        break;
      case OpId::Mean:
        for (LD e : v) acc += e;
        acc = v.empty() ? kNaN : acc / n;
        break;
      case OpId::Prod:
        acc = 1;
        for (LD e : v) acc *= e;
        break;
      case OpId::Var: {
        LD mean = 0;
        for (LD e : v) mean += e;
        mean /= n;
        for (LD e : v) acc += (e - mean) * (e - mean);
        LD divisor = std::max(n - LD(attrs.get_int("correction")), LD(0));
        acc /= divisor;
        break;
      }
      case OpId::Max:
      case OpId::Min:
        acc = v[0];
        for (LD e : v) acc = op.id == OpId::Max ? nan_max(acc, e) : nan_min(acc, e);
        break;
      case OpId::Argmax:
      case OpId::Argmin: {
        // The first NaN wins; otherwise the first of the extreme values.
        size_t best = 0;
        for (size_t k = 1; k < v.size() && !std::isnan(v[best]); ++k)
          if (std::isnan(v[k]) || (op.id == OpId::Argmax ? v[k] > v[best] : v[k] < v[best]))
            best = k;
        acc = LD(positions[size_t(g)][best]);
        break;
      }
      default: KILN_CHECK(false, "independent: {} is not a reduction", op.name);
    }
    store(out, g, acc);
  }
  return {out};
}

// Softmax / log_softmax along `dim`, with the max subtracted (a fully -inf row is NaN).
TensorList softmax(const OpDef& op, const Tensor& x, const Attrs& attrs,
                   std::span<const TensorType> out_types) {
  Tensor out = make_output(out_types[0]);
  if (x.numel() == 0) return {out};
  const int r = x.dim();
  const int axis = r == 0 ? 0 : normalize_axis(attrs.get_int("dim"), r);
  const int64_t len = r == 0 ? 1 : x.size(axis);
  const char* base = static_cast<const char*>(x.raw_data());
  auto at = [&](const int64_t* idx) {
    int64_t off = 0;
    for (int d = 0; d < r; ++d) off += idx[d] * x.stride(d);
    return load(base + off * x.element_size(), x.dtype());
  };
  Dims outer_sizes = x.sizes();
  if (r > 0) outer_sizes[size_t(axis)] = 1;
  const Dims out_strides = contiguous_strides(x.sizes());
  for_each_index(outer_sizes, [&](const int64_t* oidx) {
    int64_t idx[kMaxRank];
    std::copy(oidx, oidx + r, idx);
    std::vector<LD> row(static_cast<size_t>(len));
    for (int64_t k = 0; k < len; ++k) {
      if (r > 0) idx[axis] = k;
      row[size_t(k)] = at(idx);
    }
    LD m = -std::numeric_limits<LD>::infinity();
    for (LD e : row) m = nan_max(m, e);
    LD s = 0;
    for (LD e : row) s += std::exp(e - m);
    for (int64_t k = 0; k < len; ++k) {
      if (r > 0) idx[axis] = k;
      LD y = op.id == OpId::LogSoftmax ? row[size_t(k)] - m - std::log(s)
                                       : std::exp(row[size_t(k)] - m) / s;
      store(out, offset_of(idx, out_strides), y);
    }
  });
  return {out};
}

// matmul with numpy semantics (1-D operands promoted and the added dim removed, batch dims
// broadcast) and linear (x @ w^T + b).
TensorList matmul(const OpDef& op, const TensorList& in, std::span<const TensorType> out_types) {
  const bool linear = op.id == OpId::Linear;
  const Tensor& a0 = in[0];
  const Tensor& b0 = in[1];
  // Views as (batch..., m, k) and (batch..., k, n) through index functions.
  const int ra = a0.dim(), rb = b0.dim();
  Tensor out = make_output(out_types[0]);
  const Dims osz = out.sizes();
  const int ro = int(osz.size());
  const int64_t k_len = linear ? b0.size(1) : (ra == 1 ? a0.size(0) : a0.size(ra - 1));
  auto elem = [](const Tensor& t, const int64_t* idx) {
    int64_t off = 0;
    for (int d = 0; d < t.dim(); ++d) off += idx[d] * t.stride(d);
    return load(static_cast<const char*>(t.raw_data()) + off * t.element_size(), t.dtype());
  };
  int64_t flat = 0;
  for_each_index(osz, [&](const int64_t* oi) {
    LD acc = 0;
    for (int64_t k = 0; k < k_len; ++k) {
      int64_t ia[kMaxRank] = {0}, ib[kMaxRank] = {0};
      if (linear) {
        // x [..., k], w [n, k]; out [..., n].
        for (int d = 0; d < ra - 1; ++d) ia[d] = oi[d];
        ia[ra - 1] = k;
        ib[0] = ro > 0 ? oi[ro - 1] : 0;
        ib[1] = k;
      } else {
        // Output dims: batch..., [m if ra > 1], [n if rb > 1].
        int64_t m = ra > 1 ? oi[ro - (rb > 1 ? 2 : 1)] : 0;
        int64_t n = rb > 1 ? oi[ro - 1] : 0;
        int batch = ro - (ra > 1) - (rb > 1);
        if (ra == 1) {
          ia[0] = k;
        } else {
          for (int d = 0; d < ra - 2; ++d) {
            int od = batch - (ra - 2) + d;
            ia[d] = a0.size(d) == 1 ? 0 : oi[od];
          }
          ia[ra - 2] = m;
          ia[ra - 1] = k;
        }
        if (rb == 1) {
          ib[0] = k;
        } else {
          for (int d = 0; d < rb - 2; ++d) {
            int od = batch - (rb - 2) + d;
            ib[d] = b0.size(d) == 1 ? 0 : oi[od];
          }
          ib[rb - 2] = k;
          ib[rb - 1] = n;
        }
      }
      acc += elem(a0, ia) * elem(b0, ib);
    }
    if (linear && in.size() > 2 && in[2].defined()) {
      int64_t ibias[1] = {ro > 0 ? oi[ro - 1] : 0};
      acc += elem(in[2], ibias);
    }
    store(out, flat++, acc);
  });
  return {out};
}

}  // namespace

bool has_independent(OpId op) {
  return is_unary(op) || is_binary(op) || is_reduction(op) || op == OpId::Cast ||
         op == OpId::Where || op == OpId::Softmax || op == OpId::LogSoftmax ||
         op == OpId::Matmul || op == OpId::Linear;
}

std::optional<TensorList> independent(const OpDef& op, const TensorList& inputs,
                                      const Attrs& attrs, std::span<const TensorType> out_types) {
  if (!has_independent(op.id)) return std::nullopt;
  for (const Tensor& t : inputs)
    if (t.defined() && !t.device().is_cpu()) return std::nullopt;
  t_out_of_range = false;
  TensorList out;
  if (is_reduction(op.id)) out = reduction(op, inputs[0], attrs, out_types);
  else if (op.id == OpId::Softmax || op.id == OpId::LogSoftmax)
    out = softmax(op, inputs[0], attrs, out_types);
  else if (op.id == OpId::Matmul || op.id == OpId::Linear) out = matmul(op, inputs, out_types);
  else out = pointwise(op, inputs, attrs, out_types);
  if (t_out_of_range) return std::nullopt;
  return out;
}

}  // namespace kiln::harness
