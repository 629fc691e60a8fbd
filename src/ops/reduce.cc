// Reductions: sum mean max min prod var over a set of dims; argmax argmin over one dim or over
// the flattened tensor.
//
// Note [Reduction semantics]
//   - dims: any set of axes, negative allowed, empty = all; a repeated axis is an error. keepdim
//     keeps the reduced axes as size 1. A 0-d input accepts dims 0 / -1 and reduces nothing.
//   - dtypes (as PyTorch): sum and prod of integer or bool inputs give int64, floating inputs
//     keep their dtype; mean and var need a floating input; max and min keep the input dtype;
//     argmax and argmin give int64.
//   - Empty reductions: sum 0, prod 1, mean NaN (0/0), var NaN; max, min, argmax and argmin of
//     an empty set are errors (inference catches a concrete size-0 reduced dim, the kernels
//     catch symbolic ones).
//   - var = sum((x - mean)^2) / max(N - correction, 0). When N <= correction the divisor is 0
//     and the result is inf, or NaN when the sum is 0 (e.g. N == 1 with correction 1), as in
//     PyTorch. correction must be >= 0.
//   - max/min propagate NaN. argmax/argmin treat NaN as the largest/smallest value (the first
//     NaN wins) and return the first index among equal values, as PyTorch does.
//   - The reference accumulates floats in float64 and integers in int64 (wrapping).
// The eager kernel has a float32 fast path for contiguous inputs whose reduced axes form one
// run (ignoring size-1 axes): the input is viewed as [outer, reduced, inner] and accumulated in
// double, with OpenMP over output rows (or blocks of inner columns) when the input is large.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "ops/kernel_path.h"
#include "ops/kernel_util.h"

namespace kiln {
namespace {

bool is_arg_op(OpId id) { return id == OpId::Argmax || id == OpId::Argmin; }
// Ops whose result is undefined on an empty set.
bool needs_nonempty(OpId id) {
  return id == OpId::Max || id == OpId::Min || is_arg_op(id);
}

// Which input axes are reduced. Throws a plain kiln::Error (callers add the op and node).
struct ReducedAxes {
  bool reduced[kMaxRank] = {};
};

ReducedAxes parse_axes(OpId id, const Attrs& attrs, int rank) {
  ReducedAxes ax;
  auto all = [&] {
    for (int d = 0; d < rank; ++d) ax.reduced[d] = true;
  };
  if (is_arg_op(id)) {
    if (!attrs.has("dim")) {
      all();
      return ax;
    }
    int64_t raw = attrs.get_int("dim");
    KILN_CHECK(SymInt::from_raw(raw).is_concrete(), "attribute 'dim' must be a concrete integer");
    int d = normalize_axis(raw, rank, "attribute 'dim'");
    if (rank > 0) ax.reduced[d] = true;
    return ax;
  }
  const Ints& dims = attrs.get_ints("dims");
  if (dims.empty()) {
    all();
    return ax;
  }
  bool seen[kMaxRank] = {};
  for (int64_t raw : dims) {
    KILN_CHECK(SymInt::from_raw(raw).is_concrete(),
               "attribute 'dims' must hold concrete integers, got {}",
               SymInt::from_raw(raw).str());
    int d = normalize_axis(raw, rank, "reduction dim");
    KILN_CHECK(!seen[d], "attribute 'dims' {} names dim {} more than once",
               attr_value_str(dims), d);
    seen[d] = true;
    if (rank > 0) ax.reduced[d] = true;
  }
  return ax;
}

const char* what_of(OpId id) {
  switch (id) {
    case OpId::Max: return "the maximum";
    case OpId::Min: return "the minimum";
    case OpId::Argmax: return "the argmax";
    case OpId::Argmin: return "the argmin";
    default: return "the result";
  }
}

// ---- inference ----------------------------------------------------------------------------------
std::vector<TensorType> infer_reduce(const InferContext& ctx) {
  const TensorType& x = ctx.in(0);
  OpId id = ctx.op.id;
  if (!ctx.op.supports_dtype(x.dtype))
    ctx.fail("input 'x' has dtype {}; this op needs a floating input (cast it first)",
             dtype_name(x.dtype));
  if (id == OpId::Var && ctx.attrs.get_int("correction") < 0)
    ctx.fail("attribute 'correction' is {}; it must be >= 0", ctx.attrs.get_int("correction"));
  ReducedAxes ax;
  try {
    ax = parse_axes(id, ctx.attrs, x.rank());
  } catch (const Error& e) {
    ctx.fail("{}", e.message());
  }
  bool keepdim = ctx.attrs.get_bool("keepdim");
  Shape out;
  for (int d = 0; d < x.rank(); ++d) {
    if (!ax.reduced[d]) {
      out.push_back(x.shape[d]);
      continue;
    }
    if (needs_nonempty(id) && x.shape[d] == SymInt(0))
      ctx.fail("input 'x' {} has size 0 in reduced dim {}; {} of an empty set is undefined",
               x.str(), d, what_of(id));
    if (keepdim) out.push_back(SymInt(1));
  }
  DType od = x.dtype;
  if (is_arg_op(id)) od = DType::Int64;
  else if ((id == OpId::Sum || id == OpId::Prod) && !is_floating(x.dtype)) od = DType::Int64;
  return {TensorType(od, out, x.device)};
}

// ---- reference ----------------------------------------------------------------------------------
// The input is walked in row-major order; acc_strides map each element to its output's
// row-major index (0 along reduced axes), so outputs accumulate in a flat buffer.
struct Geometry {
  ReducedAxes axes;
  Dims acc_strides;
  int64_t out_numel = 1;
  int64_t group = 1;  // elements per output
};

Geometry geometry(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Geometry g;
  try {
    g.axes = parse_axes(ctx.op.id, ctx.attrs, x.dim());
  } catch (const Error& e) {
    fail("op '{}': {}", ctx.op.name, e.message());
  }
  g.acc_strides.resize(x.dim());
  for (int d = x.dim() - 1; d >= 0; --d) {
    if (g.axes.reduced[d]) {
      g.acc_strides[d] = 0;
      g.group *= x.sizes()[d];
    } else {
      g.acc_strides[d] = g.out_numel;
      g.out_numel *= x.sizes()[d];
    }
  }
  if (needs_nonempty(ctx.op.id) && g.group == 0)
    fail("op '{}': input 'x' {} reduces over an empty set; {} of an empty set is undefined",
         ctx.op.name, x.type().str(), what_of(ctx.op.id));
  return g;
}

// Writes value(i) to the i-th output element in row-major order (any output strides).
template <typename F>
void write_outputs(Tensor& out, F value) {
  Dims strides[1] = {out.strides()};
  for_each_broadcast(out.sizes(), strides,
                     [&](int64_t i, const int64_t* off) { value(i, elem_ptr(out, off[0])); });
}

// Folds every input element into acc[output index] with combine(acc&, value).
template <typename T, typename Load, typename Combine>
void fold(const Tensor& x, const Geometry& g, std::vector<T>& acc, Load load, Combine combine) {
  Dims strides[2] = {x.strides(), g.acc_strides};
  const char* xp = static_cast<const char*>(x.raw_data());
  int64_t xs = x.element_size();
  for_each_broadcast(x.sizes(), strides, [&](int64_t, const int64_t* off) {
    combine(acc[off[1]], load(xp + off[0] * xs));
  });
}

void ref_reduce_int(const KernelContext& ctx, const Geometry& g) {
  const Tensor& x = ctx.inputs[0];
  Tensor& out = ctx.outputs[0];
  DType xd = x.dtype(), od = out.dtype();
  auto load = [xd](const char* p) { return load_i64(p, xd); };
  std::vector<int64_t> acc;
  switch (ctx.op.id) {
    case OpId::Sum:
      acc.assign(g.out_numel, 0);
      fold(x, g, acc, load, [](int64_t& a, int64_t v) { a = int64_t(uint64_t(a) + uint64_t(v)); });
      break;
    case OpId::Prod:
      acc.assign(g.out_numel, 1);
      fold(x, g, acc, load, [](int64_t& a, int64_t v) { a = int64_t(uint64_t(a) * uint64_t(v)); });
      break;
    case OpId::Max:
      acc.assign(g.out_numel, std::numeric_limits<int64_t>::min());
      fold(x, g, acc, load, [](int64_t& a, int64_t v) { a = std::max(a, v); });
      break;
    case OpId::Min:
      acc.assign(g.out_numel, std::numeric_limits<int64_t>::max());
      fold(x, g, acc, load, [](int64_t& a, int64_t v) { a = std::min(a, v); });
      break;
    default: KILN_ASSERT(false && "integer reduction of a float-only op");
  }
  write_outputs(out, [&](int64_t i, char* p) { store_i64(p, od, acc[i]); });
}

void ref_reduce_float(const KernelContext& ctx, const Geometry& g) {
  const Tensor& x = ctx.inputs[0];
  Tensor& out = ctx.outputs[0];
  DType xd = x.dtype(), od = out.dtype();
  OpId id = ctx.op.id;
  auto load = [xd](const char* p) { return load_f64(p, xd); };
  auto add = [](double& a, double v) { a += v; };
  std::vector<double> acc;
  switch (id) {
    case OpId::Sum:
    case OpId::Mean:
    case OpId::Var:
      acc.assign(g.out_numel, 0.0);
      fold(x, g, acc, load, add);
      break;
    case OpId::Prod:
      acc.assign(g.out_numel, 1.0);
      fold(x, g, acc, load, [](double& a, double v) { a *= v; });
      break;
    case OpId::Max:
      acc.assign(g.out_numel, -INFINITY);
      fold(x, g, acc, load, [](double& a, double v) { if (v > a || v != v) a = v; });
      break;
    case OpId::Min:
      acc.assign(g.out_numel, INFINITY);
      fold(x, g, acc, load, [](double& a, double v) { if (v < a || v != v) a = v; });
      break;
    default: KILN_ASSERT(false && "not a reduction");
  }
  double n = double(g.group);
  if (id == OpId::Mean) {
    for (double& a : acc) a /= n;  // 0/0 = NaN for an empty set, as PyTorch
  } else if (id == OpId::Var) {
    // Two passes (mean, then squared deviations): exact enough to be the oracle.
    std::vector<double> mean = acc;
    for (double& m : mean) m /= n;
    std::vector<double> sq(g.out_numel, 0.0);
    Dims strides[2] = {x.strides(), g.acc_strides};
    const char* xp = static_cast<const char*>(x.raw_data());
    int64_t xs = x.element_size();
    for_each_broadcast(x.sizes(), strides, [&](int64_t, const int64_t* off) {
      double dev = load_f64(xp + off[0] * xs, xd) - mean[off[1]];
      sq[off[1]] += dev * dev;
    });
    double divisor = std::max(n - double(ctx.attrs.get_int("correction")), 0.0);
    for (int64_t i = 0; i < g.out_numel; ++i) acc[i] = sq[i] / divisor;
  }
  write_outputs(out, [&](int64_t i, char* p) { store_f64(p, od, acc[i]); });
}

void ref_reduce(const KernelContext& ctx) {
  Geometry g = geometry(ctx);
  if (is_floating(ctx.inputs[0].dtype()))
    ref_reduce_float(ctx, g);
  else
    ref_reduce_int(ctx, g);
}

// "v beats the current best b" for argmax/argmin: NaN beats everything and nothing beats NaN,
// strict comparison otherwise so that the first of equal values stays.
bool arg_beats(double v, double b, bool is_max) {
  if (b != b) return false;
  if (v != v) return true;
  return is_max ? v > b : v < b;
}

void ref_arg(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& out = ctx.outputs[0];
  Geometry g = geometry(ctx);
  bool is_max = ctx.op.id == OpId::Argmax;
  // The index is flat (row-major over x) without 'dim', else the coordinate along 'dim':
  // (flat / dim_stride) % dim_size, with dim_stride the row-major stride of 'dim'.
  int64_t dim_stride = 1, dim_size = 0;
  bool flat = !ctx.attrs.has("dim") || x.dim() == 0;
  if (!flat) {
    int d = normalize_axis(ctx.attrs.get_int("dim"), x.dim());
    dim_size = x.sizes()[d];
    for (int k = x.dim() - 1; k > d; --k) dim_stride *= x.sizes()[k];
  }
  std::vector<int64_t> best_index(g.out_numel, -1);
  std::vector<double> best_f(is_floating(x.dtype()) ? g.out_numel : 0);
  std::vector<int64_t> best_i(is_floating(x.dtype()) ? 0 : g.out_numel);
  Dims strides[2] = {x.strides(), g.acc_strides};
  const char* xp = static_cast<const char*>(x.raw_data());
  int64_t xs = x.element_size();
  DType xd = x.dtype();
  // Row-major order visits each output's candidates in increasing index order.
  for_each_broadcast(x.sizes(), strides, [&](int64_t i, const int64_t* off) {
    int64_t o = off[1];
    int64_t k = flat ? i : (i / dim_stride) % dim_size;
    const char* p = xp + off[0] * xs;
    if (is_floating(xd)) {
      double v = load_f64(p, xd);
      if (best_index[o] < 0 || arg_beats(v, best_f[o], is_max)) {
        best_f[o] = v;
        best_index[o] = k;
      }
    } else {
      int64_t v = load_i64(p, xd);
      if (best_index[o] < 0 || (is_max ? v > best_i[o] : v < best_i[o])) {
        best_i[o] = v;
        best_index[o] = k;
      }
    }
  });
  write_outputs(out, [&](int64_t i, char* p) { store_i64(p, DType::Int64, best_index[i]); });
}

// ---- eager float32 fast path --------------------------------------------------------------------
// x (contiguous) as [outer, reduced, inner]; false when the reduced axes are not one run once
// size-1 axes are ignored (e.g. dims {0, 2} of [2, 3, 4]).
bool split_outer_reduced_inner(const Tensor& x, const ReducedAxes& ax, int64_t* outer,
                               int64_t* reduced, int64_t* inner) {
  *outer = *reduced = *inner = 1;
  enum { kOuter, kReduced, kInner } state = kOuter;
  for (int d = 0; d < x.dim(); ++d) {
    int64_t s = x.sizes()[d];
    if (s == 1) continue;
    if (ax.reduced[d]) {
      if (state == kInner) return false;
      state = kReduced;
      *reduced *= s;
    } else {
      if (state == kReduced) state = kInner;
      (state == kOuter ? *outer : *inner) *= s;
    }
  }
  return true;
}

constexpr int64_t kParallelElems = 65536;
constexpr int64_t kColumnBlock = 256;  // inner columns per work item when inner > 1

// Reduces one contiguous row of r floats (r >= 1). Loops are `omp simd` so that g++ -O2
// vectorizes them (it does not vectorize reductions without leave to reassociate).
double row_sum(const float* __restrict p, int64_t r) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t k = 0; k < r; ++k) s += p[k];
  return s;
}
double row_prod(const float* __restrict p, int64_t r) {
  double s = 1.0;
#pragma omp simd reduction(* : s)
  for (int64_t k = 0; k < r; ++k) s *= p[k];
  return s;
}
double row_sq_dev(const float* __restrict p, int64_t r, double mean) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t k = 0; k < r; ++k) {
    double d = double(p[k]) - mean;
    s += d * d;
  }
  return s;
}
float row_max(const float* __restrict p, int64_t r, bool is_max) {
  float m = p[0];
  int nan = 0;
  if (is_max) {
#pragma omp simd reduction(max : m) reduction(| : nan)
    for (int64_t k = 0; k < r; ++k) {
      m = p[k] > m ? p[k] : m;
      nan |= p[k] != p[k];
    }
  } else {
#pragma omp simd reduction(min : m) reduction(| : nan)
    for (int64_t k = 0; k < r; ++k) {
      m = p[k] < m ? p[k] : m;
      nan |= p[k] != p[k];
    }
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}
int64_t row_arg(const float* p, int64_t r, bool is_max) {
  int64_t best = 0;
  float b = p[0];
  if (b != b) return 0;
  for (int64_t k = 1; k < r; ++k) {
    float v = p[k];
    if (v != v) return k;
    if (is_max ? v > b : v < b) {
      b = v;
      best = k;
    }
  }
  return best;
}

double var_divisor(int64_t r, int64_t correction) {
  return std::max(double(r) - double(correction), 0.0);
}

// inner == 1: every output reduces one contiguous row of `r` floats.
void fast_rows(OpId id, const float* x, void* out, int64_t rows, int64_t r, int64_t correction) {
  float* o = static_cast<float*>(out);
  int64_t* oi = static_cast<int64_t*>(out);
#pragma omp parallel for if (rows * r > kParallelElems)
  for (int64_t i = 0; i < rows; ++i) {
    const float* p = x + i * r;
    switch (id) {
      case OpId::Sum: o[i] = float(row_sum(p, r)); break;
      case OpId::Mean: o[i] = float(row_sum(p, r) / double(r)); break;
      case OpId::Prod: o[i] = float(row_prod(p, r)); break;
      case OpId::Var: {
        double mean = row_sum(p, r) / double(r);
        o[i] = float(row_sq_dev(p, r, mean) / var_divisor(r, correction));
        break;
      }
      case OpId::Max: o[i] = row_max(p, r, true); break;
      case OpId::Min: o[i] = row_max(p, r, false); break;
      case OpId::Argmax: oi[i] = row_arg(p, r, true); break;
      case OpId::Argmin: oi[i] = row_arg(p, r, false); break;
      default: break;
    }
  }
}

// inner > 1: each work item owns one outer index and a block of up to kColumnBlock inner
// columns, and walks the r reduced rows accumulating a vector of columns.
void fast_columns(OpId id, const float* x, void* out, int64_t outer, int64_t r, int64_t inner,
                  int64_t correction) {
  float* o = static_cast<float*>(out);
  int64_t* oi = static_cast<int64_t*>(out);
  int64_t blocks = (inner + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for if (outer * r * inner > kParallelElems)
  for (int64_t t = 0; t < outer * blocks; ++t) {
    int64_t ob = t / blocks, c0 = (t % blocks) * kColumnBlock;
    int64_t w = std::min(kColumnBlock, inner - c0);
    const float* base = x + ob * r * inner + c0;
    int64_t out0 = ob * inner + c0;
    double acc[kColumnBlock];
    switch (id) {
      case OpId::Sum:
      case OpId::Mean:
      case OpId::Var:
      case OpId::Prod: {
        bool prod = id == OpId::Prod;
        for (int64_t c = 0; c < w; ++c) acc[c] = prod ? 1.0 : 0.0;
        for (int64_t k = 0; k < r; ++k) {
          const float* __restrict row = base + k * inner;
          if (prod) {
#pragma omp simd
            for (int64_t c = 0; c < w; ++c) acc[c] *= row[c];
          } else {
#pragma omp simd
            for (int64_t c = 0; c < w; ++c) acc[c] += row[c];
          }
        }
        if (id == OpId::Sum || id == OpId::Prod) {
          for (int64_t c = 0; c < w; ++c) o[out0 + c] = float(acc[c]);
        } else if (id == OpId::Mean) {
          for (int64_t c = 0; c < w; ++c) o[out0 + c] = float(acc[c] / double(r));
        } else {
          double mean[kColumnBlock], sq[kColumnBlock] = {};
          for (int64_t c = 0; c < w; ++c) mean[c] = acc[c] / double(r);
          for (int64_t k = 0; k < r; ++k) {
            const float* __restrict row = base + k * inner;
#pragma omp simd
            for (int64_t c = 0; c < w; ++c) {
              double d = double(row[c]) - mean[c];
              sq[c] += d * d;
            }
          }
          double div = var_divisor(r, correction);
          for (int64_t c = 0; c < w; ++c) o[out0 + c] = float(sq[c] / div);
        }
        break;
      }
      case OpId::Max:
      case OpId::Min: {
        bool is_max = id == OpId::Max;
        float m[kColumnBlock];
        int nan[kColumnBlock] = {};
        for (int64_t c = 0; c < w; ++c) m[c] = base[c];
        for (int64_t k = 0; k < r; ++k) {
          const float* __restrict row = base + k * inner;
          if (is_max) {
#pragma omp simd
            for (int64_t c = 0; c < w; ++c) {
              m[c] = row[c] > m[c] ? row[c] : m[c];
              nan[c] |= row[c] != row[c];
            }
          } else {
#pragma omp simd
            for (int64_t c = 0; c < w; ++c) {
              m[c] = row[c] < m[c] ? row[c] : m[c];
              nan[c] |= row[c] != row[c];
            }
          }
        }
        for (int64_t c = 0; c < w; ++c)
          o[out0 + c] = nan[c] ? std::numeric_limits<float>::quiet_NaN() : m[c];
        break;
      }
      case OpId::Argmax:
      case OpId::Argmin: {
        bool is_max = id == OpId::Argmax;
        float b[kColumnBlock];
        int64_t bi[kColumnBlock] = {};
        for (int64_t c = 0; c < w; ++c) b[c] = base[c];
        for (int64_t k = 1; k < r; ++k) {
          const float* row = base + k * inner;
          for (int64_t c = 0; c < w; ++c)
            if (arg_beats(row[c], b[c], is_max)) {
              b[c] = row[c];
              bi[c] = k;
            }
        }
        for (int64_t c = 0; c < w; ++c) oi[out0 + c] = bi[c];
        break;
      }
      default: break;
    }
  }
}

void eager_reduce(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& out = ctx.outputs[0];
  if (x.dtype() != DType::Float32 || !x.is_contiguous() || x.numel() == 0 ||
      !out.is_contiguous())
    return note_kernel_path("reference"), is_arg_op(ctx.op.id) ? ref_arg(ctx) : ref_reduce(ctx);
  Geometry g = geometry(ctx);
  int64_t outer, r, inner;
  if (!split_outer_reduced_inner(x, g.axes, &outer, &r, &inner))
    return note_kernel_path("reference"), is_arg_op(ctx.op.id) ? ref_arg(ctx) : ref_reduce(ctx);
  note_kernel_path("f32");
  int64_t correction = ctx.op.id == OpId::Var ? ctx.attrs.get_int("correction") : 0;
  const float* xp = x.data<float>();
  if (inner == 1)
    fast_rows(ctx.op.id, xp, out.raw_data(), outer, r, correction);
  else
    fast_columns(ctx.op.id, xp, out.raw_data(), outer, r, inner, correction);
}

// ---- samples ------------------------------------------------------------------------------------
Attrs reduce_attrs(Ints dims, bool keepdim) { return {{"dims", std::move(dims)}, {"keepdim", keepdim}}; }

// Shapes and dims every dims-reduction is sampled on; make(g, sizes) draws the input.
template <typename F>
std::vector<OpSample> dims_samples(Generator& g, F make) {
  return {
      {{make(g, Dims{2, 3, 4})}, reduce_attrs({}, false), "all dims of [2,3,4]"},
      {{make(g, Dims{2, 3, 4})}, reduce_attrs({}, true), "all dims, keepdim"},
      {{make(g, Dims{2, 3, 4})}, reduce_attrs({1}, false), "dim 1 of [2,3,4]"},
      {{make(g, Dims{2, 3, 4})}, reduce_attrs({0, 2}, false), "non-adjacent dims {0,2}"},
      {{make(g, Dims{3, 2, 5})}, reduce_attrs({-1}, true), "dim -1, keepdim"},
      {{make(g, Dims{4, 5})}, reduce_attrs({-2}, false), "dim -2 of [4,5]"},
      {{make(g, Dims{2, 3, 4, 2})}, reduce_attrs({1, 2}, true), "dims {1,2} of [2,3,4,2], keepdim"},
      {{make(g, Dims{3, 1, 5})}, reduce_attrs({1}, false), "size-1 dim"},
      {{make(g, Dims{3, 1, 5})}, reduce_attrs({0, 2}, true), "{0,2} around a size-1 dim"},
      {{make(g, Dims{})}, reduce_attrs({}, false), "0-d input"},
      {{make(g, Dims{6, 40})}, reduce_attrs({1}, false), "long rows [6,40]"},
      {{make(g, Dims{0, 3})}, reduce_attrs({1}, false), "empty input, non-empty groups"},
  };
}

Tensor randn_t(Generator& g, const Dims& s) { return sample_randn(g, s); }

// A transposed view over its whole storage (see sample_noncontiguous).
Tensor noncontig(Generator& g, const Dims& s) { return sample_noncontiguous(g, s); }

// mean and var (whose empty reductions are NaN: tested in tests/ops, not here).
// Special values (NaN, +-inf: inf + -inf is NaN, -0, denormals) along rows (dim 1), columns
// (dim 0) and everything; and a NaN-free row next to NaN ones (rows are independent).
void add_special_samples(Generator& g, std::vector<OpSample>& v, bool large) {
  v.push_back({{sample_special(g, {4, 6}, large)}, reduce_attrs({1}, false), "special values, dim 1"});
  v.push_back({{sample_special(g, {6, 4}, large)}, reduce_attrs({0}, false), "special values, dim 0"});
  v.push_back({{sample_special(g, {3, 5}, large)}, reduce_attrs({}, false), "special values, all dims"});
  Tensor t = sample_randn(g, {3, 7});
  t.data<double>()[2] = std::numeric_limits<double>::quiet_NaN();
  t.data<double>()[20] = -std::numeric_limits<double>::infinity();
  v.push_back({{t}, reduce_attrs({1}, false), "one NaN row, one -inf row, one plain row"});
}

std::vector<OpSample> samples_mean(Generator& g) {
  auto v = dims_samples(g, randn_t);
  v.push_back({{noncontig(g, {4, 6})}, reduce_attrs({0}, false), "non-contiguous, dim 0"});
  v.push_back({{noncontig(g, {3, 4, 5})}, reduce_attrs({2}, true), "non-contiguous, dim 2"});
  add_special_samples(g, v, true);
  return v;
}

std::vector<OpSample> samples_sum(Generator& g) {
  auto v = samples_mean(g);
  v.push_back({{sample_randn(g, {0, 3})}, reduce_attrs({0}, false), "empty groups: 0"});
  return v;
}

std::vector<OpSample> samples_var(Generator& g) {
  auto v = samples_mean(g);
  auto with_corr = [](Ints dims, int64_t c) {
    Attrs a = reduce_attrs(std::move(dims), false);
    a.set("correction", c);
    return a;
  };
  v.push_back({{sample_randn(g, {3, 8})}, with_corr({1}, 0), "correction 0"});
  v.push_back({{sample_randn(g, {3, 8})}, with_corr({0}, 2), "correction 2"});
  return v;
}

// Inputs in (0.5, 1.5) keep products of the largest group (24 values) in range for f16.
std::vector<OpSample> samples_prod(Generator& g) {
  auto v = dims_samples(g, [](Generator& g, const Dims& s) {
    return sample_uniform(g, s, 0.5, 1.5);
  });
  // Integer-valued inputs in {-2, -1, 1, 2}: exact in every dtype and nonzero products for
  // the signed ones.
  Tensor t = sample_randn(g, {3, 4});
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = (p[i] < 0 ? -1.0 : 1.0) * (1 + (i % 2));
  v.push_back({{t}, reduce_attrs({1}, false), "small integers"});
  v.push_back({{sample_randn(g, {0, 3})}, reduce_attrs({0}, false), "empty groups: 1"});
  // 0 * inf is NaN; no values beyond float16's range (products of them overflow int64).
  add_special_samples(g, v, false);
  return v;
}

// Values floor(2x)/2 so that ties occur in every dtype (see binary.cc).
Tensor halves(Tensor t) {
  double* p = static_cast<double*>(t.impl()->storage->data());
  size_t n = t.impl()->storage->nbytes() / sizeof(double);
  for (size_t i = 0; i < n; ++i) p[i] = std::floor(2.0 * p[i]) / 2.0;
  return t;
}

std::vector<OpSample> samples_max_like(Generator& g) {
  // No size-0 reduced dims here: those are errors (tested in tests/ops).
  auto v = dims_samples(g, [](Generator& g, const Dims& s) { return halves(sample_randn(g, s, 2.0)); });
  v.push_back({{halves(noncontig(g, {4, 6}))}, reduce_attrs({0}, false), "non-contiguous, dim 0"});
  v.push_back({{halves(noncontig(g, {3, 4, 5}))}, reduce_attrs({1}, true), "non-contiguous, dim 1"});
  add_special_samples(g, v, true);  // NaN propagates; -inf / +inf are ordinary extremes
  return v;
}

Attrs arg_attrs(std::optional<int64_t> dim, bool keepdim) {
  Attrs a{{"keepdim", keepdim}};
  if (dim) a.set("dim", *dim);
  return a;
}

std::vector<OpSample> samples_arg(Generator& g) {
  auto h = [&](const Dims& s) { return halves(sample_randn(g, s, 1.5)); };
  return {
      {{h({4, 6})}, arg_attrs(1, false), "dim 1 with ties"},
      {{h({4, 6})}, arg_attrs(0, true), "dim 0, keepdim"},
      {{h({2, 3, 4})}, arg_attrs(-2, false), "dim -2"},
      {{h({2, 3, 4})}, arg_attrs(std::nullopt, false), "flattened"},
      {{h({2, 3, 4})}, arg_attrs(std::nullopt, true), "flattened, keepdim"},
      {{h({5, 1})}, arg_attrs(1, false), "size-1 dim"},
      {{h({})}, arg_attrs(std::nullopt, false), "0-d input"},
      {{h({0, 3})}, arg_attrs(1, false), "empty input, non-empty groups"},
      {{halves(noncontig(g, {5, 4}))}, arg_attrs(1, false), "non-contiguous, dim 1"},
      {{halves(noncontig(g, {3, 4, 5}))}, arg_attrs(0, false), "non-contiguous, dim 0"},
      {{h({3, 50})}, arg_attrs(1, false), "long rows"},
      // The first NaN wins; +-inf are ordinary extremes; ties (-0 == 0) go to the first.
      {{sample_special(g, {4, 6})}, arg_attrs(1, false), "special values, dim 1"},
      {{sample_special(g, {6, 4})}, arg_attrs(0, false), "special values, dim 0"},
      {{sample_special(g, {3, 5})}, arg_attrs(std::nullopt, false), "special values, flattened"},
  };
}

void define_reduce(OpId id, SampleFn samples, std::vector<DType> dtypes, const char* doc) {
  OpDef& d = define_op(id);
  d.doc = doc;
  d.inputs = {{"x"}};
  d.attrs = {{"dims", AttrType::Ints, Ints{}}, {"keepdim", AttrType::Bool, false}};
  d.infer = infer_reduce;
  d.reference = ref_reduce;
  d.eager_cpu = eager_reduce;
  d.dtypes = std::move(dtypes);
  d.samples = samples;
}

void define_arg(OpId id, const char* doc) {
  OpDef& d = define_op(id);
  d.doc = doc;
  d.inputs = {{"x"}};
  d.attrs = {{"dim", AttrType::Int, {}, true}, {"keepdim", AttrType::Bool, false}};
  d.infer = infer_reduce;
  d.reference = ref_arg;
  d.eager_cpu = eager_reduce;
  d.dtypes = all_dtypes();
  d.samples = samples_arg;
}

}  // namespace

void register_reduce_ops() {
  define_reduce(OpId::Sum, samples_sum, all_dtypes(),
                "sum over dims (empty = all); integer and bool inputs give int64");
  define_reduce(OpId::Mean, samples_mean, float_dtypes(),
                "mean over dims (empty = all); NaN for an empty set");
  define_reduce(OpId::Max, samples_max_like, all_dtypes(),
                "maximum over dims (empty = all); NaN propagates; error on an empty set");
  define_reduce(OpId::Min, samples_max_like, all_dtypes(),
                "minimum over dims (empty = all); NaN propagates; error on an empty set");
  define_reduce(OpId::Prod, samples_prod, all_dtypes(),
                "product over dims (empty = all); integer and bool inputs give int64");
  define_reduce(OpId::Var, samples_var, float_dtypes(),
                "variance over dims: sum((x - mean)^2) / max(N - correction, 0)");
  define_op(OpId::Var).attrs.push_back({"correction", AttrType::Int, int64_t{1}});
  define_arg(OpId::Argmax, "index of the maximum over 'dim' (none: the flattened tensor); "
             "int64; first index on ties; NaN counts as the maximum");
  define_arg(OpId::Argmin, "index of the minimum over 'dim' (none: the flattened tensor); "
             "int64; first index on ties; NaN counts as the minimum");
}

}  // namespace kiln
