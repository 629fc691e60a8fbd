// Parameter initialization. See Note [Fast init] in init.h.
#include "nn/init.h"

#include <cmath>

namespace kiln::nn {

Generator& default_generator() {
  thread_local Generator gen(0);
  return gen;
}
void manual_seed(uint64_t seed) { default_generator().seed(seed); }

namespace init {
namespace {

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// Uniform in [0, 1) for counter i of stream `seed` (53 random bits).
inline double unit(uint64_t seed, uint64_t i) {
  return double(mix64(seed + (i + 1) * 0x9e3779b97f4a7c15ull) >> 11) * (1.0 / 9007199254740992.0);
}

// Fills every element through write(p, n), which writes the float32 values of elements
// [0, n); floats go straight to memory, other dtypes through a float32 copy.
template <typename W>
void fill(const Tensor& t, const char* what, W write) {
  KILN_CHECK(t.defined() && t.has_storage(), "init::{}: the tensor has no data", what);
  KILN_CHECK(is_floating(t.dtype()), "init::{}: expected a floating tensor, found {}", what,
             dtype_name(t.dtype()));
  bool direct = t.dtype() == DType::Float32 && t.is_contiguous() && t.device().is_cpu();
  Tensor dst = direct ? t : Tensor::empty(t.sizes(), DType::Float32);
  write(dst.data<float>(), dst.numel());
  if (direct) {
    t.bump_version();
  } else {
    Tensor(t).copy_(dst);
  }
}

}  // namespace

void uniform_(const Tensor& t, double lo, double hi, Generator& gen) {
  uint64_t seed = gen.next_u64();
  fill(t, "uniform_", [=](float* p, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) p[i] = float(lo + (hi - lo) * unit(seed, uint64_t(i)));
  });
}

void normal_(const Tensor& t, double mean, double std, Generator& gen) {
  uint64_t seed = gen.next_u64();
  // Box-Muller over pairs: elements 2k and 2k+1 share (u1, u2) and take the cos / sin halves.
  fill(t, "normal_", [=](float* p, int64_t n) {
    int64_t pairs = (n + 1) / 2;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t k = 0; k < pairs; ++k) {
      double u1 = unit(seed, uint64_t(2 * k)), u2 = unit(seed, uint64_t(2 * k + 1));
      double r = std * std::sqrt(-2.0 * std::log(u1 > 1e-300 ? u1 : 1e-300));
      double s, c;
      ::sincos(2.0 * M_PI * u2, &s, &c);
      p[2 * k] = float(mean + r * c);
      if (2 * k + 1 < n) p[2 * k + 1] = float(mean + r * s);
    }
  });
}

int64_t fan_in(const Tensor& w) {
  KILN_CHECK(w.dim() >= 2, "init: fan_in needs a weight of rank >= 2, found {}",
             to_string(w.sizes()));
  return w.numel() / w.size(0);
}
int64_t fan_out(const Tensor& w) {
  KILN_CHECK(w.dim() >= 2, "init: fan_out needs a weight of rank >= 2, found {}",
             to_string(w.sizes()));
  return w.numel() / w.size(1);
}

void kaiming_uniform_(const Tensor& w, Generator& gen) {
  int64_t fi = fan_in(w);
  double bound = fi > 0 ? 1.0 / std::sqrt(double(fi)) : 0.0;
  uniform_(w, -bound, bound, gen);
}

void bias_uniform_(const Tensor& b, int64_t fan_in, Generator& gen) {
  double bound = fan_in > 0 ? 1.0 / std::sqrt(double(fan_in)) : 0.0;
  uniform_(b, -bound, bound, gen);
}

void xavier_uniform_(const Tensor& w, Generator& gen) {
  double a = std::sqrt(6.0 / double(fan_in(w) + fan_out(w)));
  uniform_(w, -a, a, gen);
}

}  // namespace init
}  // namespace kiln::nn
