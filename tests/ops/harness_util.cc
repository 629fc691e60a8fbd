#include "harness_util.h"

#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

namespace kiln::harness {

Tolerance compare_tolerance(DType test_dtype, DType out, double scale) {
  if (!is_floating(out)) return Tolerance::exact();
  Tolerance t = Tolerance::for_dtype(out);
  if (is_floating(test_dtype)) {
    Tolerance u = Tolerance::for_dtype(test_dtype);
    if (u.rtol > t.rtol) t = u;
  }
  return t.scaled(scale);
}

namespace {

// A fresh tensor of dtype `d` with x's sizes, strides and offset (contiguous when x is).
Tensor empty_like_layout(const Tensor& x, DType d) {
  if (x.is_contiguous()) return Tensor::empty(x.sizes(), d);
  int64_t cap = int64_t(x.impl()->storage->nbytes()) / x.element_size();
  Tensor base = Tensor::empty(Dims{cap}, d);
  return base.as_strided(x.sizes(), x.strides(), x.offset());
}

// Calls f(src_element_ptr, dst_element_ptr) for every element (both tensors of one shape).
template <typename F>
void for_each_pair(const Tensor& src, const Tensor& dst, F&& f) {
  const char* s = static_cast<const char*>(src.raw_data());
  char* d = static_cast<char*>(dst.raw_data());
  int64_t ses = src.element_size(), des = dst.element_size();
  const Dims &ss = src.strides(), &ds = dst.strides();
  for_each_index(src.sizes(), [&](const int64_t* idx) {
    f(s + offset_of(idx, ss) * ses, d + offset_of(idx, ds) * des);
  });
}

}  // namespace

// Note [Integer cases]
// Samples hold floating inputs as float64 values of order 1 (randn, uniform ranges chosen for
// the op's domain). For an integer test dtype the harness maps each value v to an integer:
//   - a tensor whose values are all integers already (a 0/1 mask, a chosen exponent) keeps
//     them: the sample author picked those values on purpose;
//   - otherwise v -> round(4 * v) (half away from zero): randn becomes small integers of both
//     signs in about [-12, 12] with some zeros (|v| < 0.125); the sign of every value is kept,
//     so positive-domain samples (divisors, sizes) stay non-negative;
//   - uint8 takes the magnitude; every dtype saturates at its range (store_f64's rule).
// For bool, v -> (v > 0): half true for randn, a 0/1 mask maps to itself.
// Integers have no special values: NaN and +-inf map to 0 (the special-value samples, see
// docs/ops.md, then test zeros there; a saturated infinity would only test int64 overflow of
// the reference's accumulators); for bool NaN is false, +inf true, -inf false.
Tensor to_test_dtype(const Tensor& x, DType d) {
  if (!x.defined() || !is_floating(x.dtype())) return x;
  if (is_floating(d)) return convert_keep_layout(x, d);
  Tensor out = empty_like_layout(x, d);
  DType sd = x.dtype();
  if (is_bool(d)) {
    for_each_pair(x, out, [&](const char* s, char* o) {
      *reinterpret_cast<bool*>(o) = load_f64(s, sd) > 0.0;
    });
    return out;
  }
  bool integer_valued = true;
  for_each_index(x.sizes(), [&](const int64_t* idx) {
    double v = load_f64(static_cast<const char*>(x.raw_data()) +
                            offset_of(idx, x.strides()) * x.element_size(), sd);
    if (std::isfinite(v) && v != std::nearbyint(v)) integer_valued = false;
  });
  bool is_unsigned = info(d).kind == 'u';
  for_each_pair(x, out, [&](const char* s, char* o) {
    double v = load_f64(s, sd);
    if (!std::isfinite(v)) v = 0;
    if (!integer_valued) v = std::round(4.0 * v);
    if (is_unsigned) v = std::fabs(v);
    store_f64(o, d, v);  // saturates at the dtype's range
  });
  return out;
}

Tensor convert_keep_layout(const Tensor& x, DType d) {
  if (!x.defined()) return x;
  Tensor out = empty_like_layout(x, d);
  out.copy_(x);
  return out;
}

Tensor make_noncontiguous(const Tensor& x) {
  if (!x.defined() || x.numel() <= 1) return x;
  int r = x.dim();
  Dims reversed;
  for (int i = r - 1; i >= 0; --i) reversed.push_back(x.sizes()[i]);
  Tensor base = Tensor::empty(reversed, x.dtype());
  Dims strides;
  for (int i = 0; i < r; ++i) strides.push_back(base.strides()[r - 1 - i]);
  Tensor view = base.as_strided(x.sizes(), strides, 0);
  if (view.is_contiguous()) {
    // Only one non-unit dim: spread the elements two slots apart, starting at offset 1, and
    // poison the gaps so a kernel that ignores strides reads garbage, not plausible values.
    int64_t n = x.numel();
    Tensor buf = Tensor::empty(Dims{2 * n + 1}, x.dtype());
    if (is_floating(x.dtype())) {
      char* p = static_cast<char*>(buf.raw_data());
      for (int64_t i = 0; i < 2 * n + 1; ++i)
        store_f64(p + i * buf.element_size(), x.dtype(), std::numeric_limits<double>::quiet_NaN());
    } else {
      std::memset(buf.raw_data(), 0x5A, buf.nbytes());
    }
    Dims st = contiguous_strides(x.sizes());
    for (auto& s : st) s *= 2;
    view = buf.as_strided(x.sizes(), st, 1);
  }
  view.copy_(x);
  return view;
}

Tensor snapshot(const Tensor& x) { return x.defined() ? x.clone() : x; }
TensorList snapshot(const TensorList& xs) {
  TensorList out;
  for (const Tensor& t : xs) out.push_back(snapshot(t));
  return out;
}

std::string index_str(const int64_t* idx, int rank) {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(idx[i]);
  return s + "]";
}

std::string types_str(const TensorList& ts) {
  std::string s = "(";
  for (size_t i = 0; i < ts.size(); ++i) {
    if (i) s += ", ";
    s += ts[i].defined() ? ts[i].type().str() : "none";
  }
  return s + ")";
}

namespace {
std::string value_str(double v) { return fmt::format("{:.9g}", v); }
}  // namespace

std::string compare_values(const Tensor& expected, const Tensor& actual, const Tolerance& tol) {
  test::Comparison c = test::compare(actual, expected, tol);
  if (c.ok()) return "";
  if (!expected.defined() || !actual.defined()) return c.str();
  return fmt::format("{} (expected {}, actual {})", c.str(), expected.type().str(),
                     actual.type().str());
}

std::string compare_bitwise(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined())
    return a.defined() == b.defined() ? "" : "one tensor is undefined, the other is not";
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes())
    return fmt::format("type {} vs {}", a.type().str(), b.type().str());
  const int64_t es = a.element_size();
  const char* ap = static_cast<const char*>(a.raw_data());
  const char* bp = static_cast<const char*>(b.raw_data());
  int64_t mismatches = 0;
  int64_t first_idx[kMaxRank] = {0};
  std::string first;
  for_each_index(a.sizes(), [&](const int64_t* idx) {
    const char* x = ap + offset_of(idx, a.strides()) * es;
    const char* y = bp + offset_of(idx, b.strides()) * es;
    bool same = std::memcmp(x, y, size_t(es)) == 0;
    // bool storage: any nonzero byte is true; compare as values.
    if (is_bool(a.dtype())) same = (*x != 0) == (*y != 0);
    if (!same) {
      if (mismatches == 0) {
        std::copy(idx, idx + a.dim(), first_idx);
        first = fmt::format("{} vs {}", value_str(load_f64(x, a.dtype())),
                            value_str(load_f64(y, a.dtype())));
      }
      ++mismatches;
    }
  });
  if (mismatches == 0) return "";
  return fmt::format("{} of {} elements differ bitwise; first at {}: {}", mismatches, a.numel(),
                     index_str(first_idx, a.dim()), first);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not a kiln::Error: ") + e.what() + ">";
  }
  return "<no error>";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace kiln::harness
