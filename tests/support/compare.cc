#include "compare.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace kiln::test {

Tolerance Tolerance::for_dtype(DType d) {
  switch (d) {
    case DType::Float64: return rel(1e-10, 1e-10);
    case DType::Float32: return rel(1e-5, 1e-5);
    case DType::Float16: return rel(1e-2, 1e-2);
    case DType::BFloat16: return rel(2e-2, 2e-2);
    default: return exact();
  }
}

Tolerance Tolerance::scaled(double f) const {
  Tolerance t = *this;
  t.rtol *= f;
  t.atol *= f;
  t.scale_rtol *= f;
  return t;
}

std::string Tolerance::str() const {
  if (is_exact()) return signed_zeros ? "exact, signed zeros" : "exact";
  std::string s;
  auto part = [&](const std::string& p) { s += (s.empty() ? "" : " + ") + p; };
  if (atol != 0) part(fmt::format("atol {:g}", atol));
  if (rtol != 0) part(fmt::format("rtol {:g} * |ref_i|", rtol));
  if (scale_rtol != 0) {
    switch (scale) {
      case Scale::None: break;
      case Scale::MaxRef: part(fmt::format("{:g} * max|ref|", scale_rtol)); break;
      case Scale::Given: part(fmt::format("{:g} * scale {:g}", scale_rtol, given_scale)); break;
      case Scale::PerElement: part(fmt::format("{:g} * scale_i", scale_rtol)); break;
    }
  }
  if (signed_zeros) s += ", signed zeros";
  return s;
}

namespace {

std::string index_str(const std::vector<int64_t>& idx) {
  std::string s = "[";
  for (size_t i = 0; i < idx.size(); ++i) s += (i ? ", " : "") + std::to_string(idx[i]);
  return s + "]";
}

std::vector<int64_t> unravel(int64_t flat, const Dims& shape) {
  std::vector<int64_t> idx(shape.size());
  for (int d = int(shape.size()) - 1; d >= 0; --d) {
    int64_t n = shape[size_t(d)];
    idx[size_t(d)] = n > 0 ? flat % n : 0;
    flat = n > 0 ? flat / n : 0;
  }
  return idx;
}

// Rounds v to dtype d (does a finite reference value overflow got's narrower dtype?).
double round_to(DType d, double v) {
  alignas(8) char buf[8];
  store_f64(buf, d, v);
  return load_f64(buf, d);
}

// The element loop shared by every form. The caller runs a first pass for max|ref| (the
// MaxRef scale), then feeds every element in row-major order.
class Checker {
 public:
  Checker(const Tolerance& tol, DType got_dtype, double max_abs_ref)
      : tol_(tol), got_dtype_(got_dtype) {
    c_.max_abs_ref = max_abs_ref;
    c_.tolerance = tol.str();
    switch (tol.scale) {
      case Tolerance::Scale::None: scale_ = 0; break;
      case Tolerance::Scale::MaxRef: scale_ = max_abs_ref; break;
      case Tolerance::Scale::Given: scale_ = tol.given_scale; break;
      case Tolerance::Scale::PerElement: scale_ = 0; break;
    }
  }

  void floating(int64_t flat, double got, double ref) {
    double diff = 0, bound = 0;
    bool ok;
    const bool gn = std::isnan(got), rn = std::isnan(ref);
    if (gn || rn) {
      ok = gn && rn;
      c_.nan_got_only += gn && !rn;
      c_.nan_ref_only += rn && !gn;
      diff = ok ? 0 : std::numeric_limits<double>::infinity();
    } else if (std::isinf(got) || std::isinf(ref)) {
      // A float64 oracle value beyond got's range legitimately becomes +-inf there.
      ok = got == ref || (!tol_.is_exact() && std::isinf(got) && std::isfinite(ref) &&
                          is_floating(got_dtype_) && got_dtype_ != DType::Float64 &&
                          round_to(got_dtype_, ref) == got);
      c_.inf_mismatches += !ok;
      diff = ok ? 0 : std::numeric_limits<double>::infinity();
    } else {
      diff = std::fabs(got - ref);
      double s = scale_;
      if (tol_.scale == Tolerance::Scale::PerElement)
        s = size_t(flat) < tol_.element_scales.size() ? tol_.element_scales[size_t(flat)]
                                                        : std::numeric_limits<double>::quiet_NaN();
      bound = tol_.atol + tol_.rtol * std::fabs(ref) + (tol_.scale_rtol != 0 ? tol_.scale_rtol * s : 0);
      ok = diff <= bound;  // false for a NaN bound (a missing per-element scale)
      if (ok && tol_.signed_zeros && got == 0 && ref == 0 && std::signbit(got) != std::signbit(ref))
        ok = false, diff = 0, bound = 0;
    }
    record(flat, got, ref, diff, bound, ok);
  }

  void integer(int64_t flat, int64_t got, int64_t ref) {
    bool ok = got == ref;
    double diff = ok ? 0 : std::fabs(double(got) - double(ref));
    record(flat, double(got), double(ref), diff, 0, ok);
  }

  Comparison finish(int64_t numel, const Dims& shape) {
    c_.numel = numel;
    if (c_.worst_flat >= 0) c_.worst_index = unravel(c_.worst_flat, shape);
    if (c_.first_flat >= 0) c_.first_index = unravel(c_.first_flat, shape);
    return std::move(c_);
  }

 private:
  void record(int64_t flat, double got, double ref, double diff, double bound, bool ok) {
    double ratio;
    if (!ok) ratio = bound > 0 && std::isfinite(diff) && diff / bound > 1
                         ? diff / bound
                         : std::numeric_limits<double>::infinity();
    else ratio = bound > 0 ? diff / bound : 0;
    if (!ok) {
      if (c_.mismatches == 0) {
        c_.first_flat = flat;
        c_.first_got = got;
        c_.first_ref = ref;
      }
      ++c_.mismatches;
    }
    // Ties (several mismatches under a zero bound are all infinitely over it) go to the
    // larger difference, so worst_diff is the largest error there too.
    if (ratio > worst_ratio_ || c_.worst_flat < 0 ||
        (ratio == worst_ratio_ && diff > c_.worst_diff)) {
      worst_ratio_ = ratio;
      c_.worst_ratio = ratio;
      c_.worst_flat = flat;
      c_.worst_got = got;
      c_.worst_ref = ref;
      c_.worst_diff = diff;
      c_.worst_bound = bound;
    }
  }

  const Tolerance& tol_;
  DType got_dtype_;
  double scale_ = 0;
  double worst_ratio_ = -1;
  Comparison c_;
};

Comparison size_problem(std::string what) {
  Comparison c;
  c.problem = std::move(what);
  return c;
}

template <typename T>
Comparison compare_flat(std::span<const T> got, std::span<const T> ref, const Tolerance& tol,
                        const Dims& shape_in, DType got_dtype) {
  if (got.size() != ref.size())
    return size_problem(fmt::format("got {} elements, the reference {}", got.size(), ref.size()));
  Dims shape = shape_in.empty() && got.size() != 1 ? Dims{int64_t(got.size())} : shape_in;
  if (numel(shape) != int64_t(got.size()))
    return size_problem(fmt::format("shape {} has {} elements, the values {}", to_string(shape),
                                    numel(shape), got.size()));
  if (tol.scale == Tolerance::Scale::PerElement && tol.element_scales.size() != got.size())
    return size_problem(fmt::format("{} error scales for {} elements", tol.element_scales.size(),
                                    got.size()));
  double max_abs_ref = 0;
  for (T r : ref)
    if (std::isfinite(double(r))) max_abs_ref = std::max(max_abs_ref, std::fabs(double(r)));
  Checker check(tol, got_dtype, max_abs_ref);
  for (size_t i = 0; i < got.size(); ++i) check.floating(int64_t(i), double(got[i]), double(ref[i]));
  return check.finish(int64_t(got.size()), shape);
}

}  // namespace

Comparison compare(const Tensor& got, const Tensor& ref, const Tolerance& tol) {
  if (!got.defined() || !ref.defined())
    return size_problem(fmt::format("got a{} tensor, the reference a{} one",
                                    got.defined() ? " defined" : "n undefined",
                                    ref.defined() ? " defined" : "n undefined"));
  if (got.sizes() != ref.sizes())
    return size_problem(fmt::format("shape {}, the reference's {}", to_string(got.sizes()),
                                    to_string(ref.sizes())));
  if (tol.scale == Tolerance::Scale::PerElement &&
      int64_t(tol.element_scales.size()) != ref.numel())
    return size_problem(fmt::format("{} error scales for {} elements", tol.element_scales.size(),
                                    ref.numel()));
  const DType gd = got.dtype(), rd = ref.dtype();
  const bool integer = !is_floating(gd) && !is_floating(rd);
  const char* gp = static_cast<const char*>(got.raw_data());
  const char* rp = static_cast<const char*>(ref.raw_data());
  const int64_t ges = got.element_size(), res = ref.element_size();
  auto g_at = [&](const int64_t* idx) { return gp + offset_of(idx, got.strides()) * ges; };
  auto r_at = [&](const int64_t* idx) { return rp + offset_of(idx, ref.strides()) * res; };

  double max_abs_ref = 0;
  for_each_index(ref.sizes(), [&](const int64_t* idx) {
    double r = load_f64(r_at(idx), rd);
    if (std::isfinite(r)) max_abs_ref = std::max(max_abs_ref, std::fabs(r));
  });
  Checker check(tol, gd, max_abs_ref);
  int64_t flat = 0;
  for_each_index(ref.sizes(), [&](const int64_t* idx) {
    if (integer)
      check.integer(flat, load_i64(g_at(idx), gd), load_i64(r_at(idx), rd));  // exact past 2^53
    else
      check.floating(flat, load_f64(g_at(idx), gd), load_f64(r_at(idx), rd));
    ++flat;
  });
  return check.finish(ref.numel(), ref.sizes());
}

Comparison compare(std::span<const double> got, std::span<const double> ref,
                   const Tolerance& tol, const Dims& shape) {
  return compare_flat(got, ref, tol, shape, DType::Float64);
}

Comparison compare(std::span<const float> got, std::span<const float> ref, const Tolerance& tol,
                   const Dims& shape) {
  return compare_flat(got, ref, tol, shape, DType::Float32);
}

double max_abs(const Tensor& t) { return compare(t, t, Tolerance::exact()).max_abs_ref; }
double max_abs(std::span<const double> v) { return compare(v, v, Tolerance::exact()).max_abs_ref; }

std::string Comparison::str() const {
  if (!problem.empty()) return problem;
  if (numel == 0) return "no elements";
  auto v = [](double x) { return fmt::format("{}", x); };
  std::string worst;
  if (worst_flat >= 0) {
    worst = fmt::format("{} (flat {}): got {}, ref {}, |diff| {}", index_str(worst_index),
                        worst_flat, v(worst_got), v(worst_ref), v(worst_diff));
    if (std::isfinite(worst_diff)) worst += fmt::format(", bound {}", v(worst_bound));
  }
  if (ok())
    return fmt::format("all {} elements within {}; closest to the bound at {} ({:.3g} of it)",
                       numel, tolerance, worst, worst_ratio);
  std::string s = fmt::format("{} of {} elements differ beyond {}; worst at {}", mismatches,
                              numel, tolerance, worst);
  if (first_flat != worst_flat)
    s += fmt::format("; first at {} (flat {}): got {}, ref {}", index_str(first_index),
                     first_flat, v(first_got), v(first_ref));
  if (nan_got_only) s += fmt::format("; NaN in got only: {}", nan_got_only);
  if (nan_ref_only) s += fmt::format("; NaN in ref only: {}", nan_ref_only);
  if (inf_mismatches) s += fmt::format("; unmatched infinities: {}", inf_mismatches);
  s += fmt::format("; max|ref| {}", v(max_abs_ref));
  return s;
}

namespace {
::testing::AssertionResult verdict(const Comparison& c) {
  if (c.ok()) return ::testing::AssertionSuccess() << c.str();
  return ::testing::AssertionFailure() << c.str();
}
}  // namespace

::testing::AssertionResult close(const Tensor& got, const Tensor& ref, const Tolerance& tol) {
  return verdict(compare(got, ref, tol));
}
::testing::AssertionResult close(std::span<const double> got, std::span<const double> ref,
                                 const Tolerance& tol, const Dims& shape) {
  return verdict(compare(got, ref, tol, shape));
}
::testing::AssertionResult close(std::span<const float> got, std::span<const float> ref,
                                 const Tolerance& tol, const Dims& shape) {
  return verdict(compare(got, ref, tol, shape));
}
::testing::AssertionResult close(double got, double ref, const Tolerance& tol) {
  return verdict(compare(std::span<const double>(&got, 1), std::span<const double>(&ref, 1), tol,
                         Dims{}));
}


std::string first_byte_difference(const Tensor& a, const Tensor& b) {
  Tensor x = a.to(Device::cpu()).contiguous(), y = b.to(Device::cpu()).contiguous();
  if (x.nbytes() != y.nbytes()) return "sizes differ";
  const auto* p = static_cast<const unsigned char*>(x.raw_data());
  const auto* q = static_cast<const unsigned char*>(y.raw_data());
  for (size_t i = 0; i < size_t(x.nbytes()); ++i)
    if (p[i] != q[i]) return fmt::format("byte {} differs", i);
  return "";
}
}  // namespace kiln::test

namespace kiln::test {
::testing::AssertionResult usable_reference(const Tensor& t) {
  std::vector<double> v = t.to(Device::cpu()).to_vector<double>();
  int64_t bad = 0, nonzero = 0, first_bad = -1;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) {
      if (bad++ == 0) first_bad = int64_t(i);
    } else if (v[i] != 0) {
      ++nonzero;
    }
  }
  if (bad)
    return ::testing::AssertionFailure() << bad << " of " << v.size()
                                         << " elements are not finite (first at flat index "
                                         << first_bad << ": " << v[size_t(first_bad)] << ")";
  if (!v.empty() && nonzero == 0)
    return ::testing::AssertionFailure() << "all " << v.size() << " elements are zero";
  return ::testing::AssertionSuccess();
}

}  // namespace kiln::test
