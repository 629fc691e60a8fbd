#include "ops/kernel_util.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace kiln {

Dims broadcast_strides(const Tensor& t, const Dims& out) {
  Dims s;
  s.resize(out.size());
  size_t off = out.size() - t.sizes().size();
  for (size_t i = 0; i < out.size(); ++i) {
    if (i < off) {
      s[i] = 0;
    } else {
      int64_t sz = t.sizes()[i - off];
      s[i] = (sz == 1 && out[i] != 1) ? 0 : t.strides()[i - off];
    }
  }
  return s;
}

std::vector<double> read_f64(const Tensor& t0) {
  Tensor t = t0.device().is_cpu() ? t0 : t0.to(Device::cpu());
  std::vector<double> v(size_t(t.numel()));
  if (t.dtype() == DType::Float32 && t.is_contiguous()) {  // the common case (weights): no dispatch
    const float* f = static_cast<const float*>(t.raw_data());
    for (size_t i = 0; i < v.size(); ++i) v[i] = double(f[i]);
    return v;
  }
  Dims strides[1] = {t.strides()};
  const char* p = static_cast<const char*>(t.raw_data());
  int64_t es = t.element_size();
  DType d = t.dtype();
  for_each_broadcast(t.sizes(), strides, [&](int64_t i, const int64_t* off) {
    v[size_t(i)] = load_f64(p + off[0] * es, d);
  });
  return v;
}

void write_f64(Tensor& out, const std::vector<double>& v) {
  KILN_ASSERT(out.device().is_cpu() && out.is_contiguous() && int64_t(v.size()) == out.numel());
  if (out.dtype() == DType::Float32) {
    float* f = static_cast<float*>(out.raw_data());
    for (size_t i = 0; i < v.size(); ++i) f[i] = float(v[i]);
    return;
  }
  char* p = static_cast<char*>(out.raw_data());
  int64_t es = out.element_size();
  DType d = out.dtype();
  for (size_t i = 0; i < v.size(); ++i) store_f64(p + int64_t(i) * es, d, v[i]);
}

std::vector<TensorType> same_as_input(const InferContext& ctx) {
  TensorType t = ctx.in(0);
  t.strides = Shape();
  return {t};
}

std::vector<int> reduction_axes(const Attrs& attrs, int rank) {
  std::vector<int> axes;
  const Ints& dims = attrs.get_ints("dims");
  if (dims.empty()) {
    for (int i = 0; i < rank; ++i) axes.push_back(i);
    return axes;
  }
  for (int64_t d : dims) axes.push_back(normalize_axis(d, rank, "reduction dim"));
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  return axes;
}

std::vector<int> reduction_axes(const InferContext& ctx, int rank) {
  try {
    return reduction_axes(ctx.attrs, rank);
  } catch (const Error& e) {
    ctx.fail("{}", e.message());
  }
}

Tensor sample_randn(Generator& g, const Dims& sizes, double scale) {
  Tensor t = Tensor::randn(sizes, g, DType::Float64);
  if (scale != 1.0) {
    double* p = t.data<double>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] *= scale;
  }
  return t;
}

Tensor sample_special(Generator& g, const Dims& sizes, bool large, double scale) {
  Tensor t = sample_randn(g, sizes, scale);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> special = {std::numeric_limits<double>::quiet_NaN(), inf, -inf, -0.0, 0.0,
                                 1e-310, -1e-40, 3e-6, -inf, std::numeric_limits<double>::quiet_NaN()};
  if (large) special.insert(special.end(), {1e5, -7e4});
  const int64_t n = t.numel();
  KILN_CHECK(n >= int64_t(special.size()), "sample_special: {} elements for {} special values", n,
             special.size());
  // A random permutation's first positions receive the special values.
  std::vector<int64_t> pos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = i;
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(pos[size_t(i)], pos[size_t(g.next_u64() % uint64_t(i + 1))]);
  double* p = t.data<double>();
  for (size_t k = 0; k < special.size(); ++k) p[pos[k]] = special[k];
  return t;
}

Tensor sample_uniform(Generator& g, const Dims& sizes, double lo, double hi) {
  return Tensor::rand(sizes, g, lo, hi, DType::Float64);
}

Tensor sample_noncontiguous(Generator& g, const Dims& sizes) {
  // Allocate the reversed shape and view it transposed (all dims reversed).
  Dims rev;
  for (int i = int(sizes.size()) - 1; i >= 0; --i) rev.push_back(sizes[i]);
  Tensor base = Tensor::randn(rev, g, DType::Float64);
  Dims st;
  for (int i = int(sizes.size()) - 1; i >= 0; --i) st.push_back(base.strides()[i]);
  return base.as_strided(sizes, st, 0);
}

}  // namespace kiln
