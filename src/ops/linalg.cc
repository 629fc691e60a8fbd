// Linear algebra: matmul (NumPy semantics) and linear (x W^T + b).
//
// Both ops reduce to one batched product over views (see matmul_views): a [..., M, K] and
// b [..., K, N] of the output's rank, batch dims equal to the output's or 1. The reference
// accumulates in float64 (int64 for integer dtypes, which wrap on store like PyTorch). The eager
// kernel hands float32/bfloat16 to oneDNN's matmul (bias fused for linear) and everything else
// to the reference.
#include "ops/kernel_path.h"
#include "ops/onednn.h"
#include "ops/kernel_util.h"

namespace kiln {
namespace {

// Sizes that must agree are compared as SymInts: equal expressions or an error. Inference never
// returns a shape it cannot prove, so a symbolic size that is not provably equal fails too.
bool differ(SymInt a, SymInt b) { return a != b; }
const char* symbolic_note(SymInt a, SymInt b) {
  return a.is_symbolic() || b.is_symbolic() ? " (a symbolic size must be provably equal)" : "";
}

void check_dtypes(const InferContext& ctx, const char* a_name, const char* b_name) {
  const TensorType &a = ctx.in(0), &b = ctx.in(1);
  if (!ctx.op.supports_dtype(a.dtype))
    ctx.fail("input '{}' has dtype {}, which {} does not support", a_name, dtype_name(a.dtype),
             ctx.op.name);
  if (b.dtype != a.dtype)
    ctx.fail("input '{}' has dtype {} but '{}' has {}; cast one of them", b_name,
             dtype_name(b.dtype), a_name, dtype_name(a.dtype));
  if (b.device != a.device)
    ctx.fail("input '{}' is on {} but '{}' is on {}", b_name, b.device.str(), a_name,
             a.device.str());
}

// ---- inference --------------------------------------------------------------------------------
std::vector<TensorType> infer_matmul(const InferContext& ctx) {
  check_dtypes(ctx, "a", "b");
  const TensorType &a = ctx.in(0), &b = ctx.in(1);
  if (a.rank() == 0 || b.rank() == 0)
    ctx.fail("input '{}' is a scalar; matmul needs operands of rank >= 1 (a is {}, b is {})",
             a.rank() == 0 ? "a" : "b", to_string(a.shape), to_string(b.shape));
  // 1-D operands: a [K] acts as [1, K], b [K] as [K, 1]; the added dim is dropped again.
  Shape as = a.shape, bs = b.shape;
  if (as.size() == 1) as.insert(0, SymInt(1));
  if (bs.size() == 1) bs.push_back(SymInt(1));
  SymInt ka = as[as.size() - 1], kb = bs[bs.size() - 2];
  if (differ(ka, kb))
    ctx.fail("inner dimensions differ: 'a' {} has {} columns but 'b' {} has {} rows{}",
             to_string(a.shape), ka.str(), to_string(b.shape), kb.str(), symbolic_note(ka, kb));
  Shape abatch(std::span<const SymInt>(as.begin(), as.size() - 2));
  Shape bbatch(std::span<const SymInt>(bs.begin(), bs.size() - 2));
  Shape out;
  try {
    out = broadcast_shapes(abatch, bbatch);
  } catch (const Error& e) {
    ctx.fail("batch dims of 'a' {} and 'b' {} do not broadcast: {}", to_string(a.shape),
             to_string(b.shape), e.message());
  }
  if (a.rank() > 1) out.push_back(as[as.size() - 2]);
  if (b.rank() > 1) out.push_back(bs[bs.size() - 1]);
  return {TensorType(a.dtype, out, a.device)};
}

std::vector<TensorType> infer_linear(const InferContext& ctx) {
  check_dtypes(ctx, "x", "weight");
  const TensorType &x = ctx.in(0), &w = ctx.in(1);
  if (x.rank() == 0) ctx.fail("input 'x' is a scalar; expected [..., in_features]");
  if (w.rank() != 2)
    ctx.fail("input 'weight' {} has rank {}; expected [out_features, in_features]",
             to_string(w.shape), w.rank());
  SymInt in = x.shape[x.shape.size() - 1];
  if (differ(in, w.shape[1]))
    ctx.fail("input 'x' {} has {} features but 'weight' {} expects {}{}", to_string(x.shape),
             in.str(), to_string(w.shape), w.shape[1].str(), symbolic_note(in, w.shape[1]));
  if (ctx.has_input(2)) {
    const TensorType& b = ctx.in(2);
    if (b.dtype != x.dtype)
      ctx.fail("input 'bias' has dtype {} but 'x' has {}", dtype_name(b.dtype),
               dtype_name(x.dtype));
    if (b.rank() != 1 || differ(b.shape[0], w.shape[0]))
      ctx.fail("input 'bias' has shape {}; expected [{}] (out_features of 'weight' {})",
               to_string(b.shape), w.shape[0].str(), to_string(w.shape));
  }
  Shape out = x.shape;
  out[out.size() - 1] = w.shape[0];
  return {TensorType(x.dtype, out, x.device)};
}

// ---- views ------------------------------------------------------------------------------------
// a [..., M, K], b [..., K, N] and y [..., M, N] of equal rank; see the file comment.
struct MatmulViews {
  Tensor a, b, y;
};

// Prepends size-1 dims (stride 0) up to `rank`.
Tensor pad_rank(const Tensor& t, int rank) {
  Dims sizes, strides;
  for (int i = t.dim(); i < rank; ++i) {
    sizes.push_back(1);
    strides.push_back(0);
  }
  for (int i = 0; i < t.dim(); ++i) {
    sizes.push_back(t.sizes()[size_t(i)]);
    strides.push_back(t.strides()[size_t(i)]);
  }
  return t.as_strided(sizes, strides, t.offset());
}

Tensor view_as(const Tensor& t, const Dims& sizes) {
  return t.as_strided(sizes, contiguous_strides(sizes), t.offset());
}

MatmulViews matmul_views(const Tensor& a0, const Tensor& b0, const Tensor& y0) {
  Tensor a = a0, b = b0;
  if (a.dim() == 1) a = a.as_strided({1, a.size(0)}, {0, a.stride(0)}, a.offset());
  if (b.dim() == 1) b = b.as_strided({b.size(0), 1}, {b.stride(0), 0}, b.offset());
  int r = std::max(a.dim(), b.dim());
  a = pad_rank(a, r);
  b = pad_rank(b, r);
  Dims ys;
  for (int i = 0; i < r - 2; ++i)
    ys.push_back(std::max(a.sizes()[size_t(i)], b.sizes()[size_t(i)]));
  ys.push_back(a.sizes()[size_t(r - 2)]);
  ys.push_back(b.sizes()[size_t(r - 1)]);
  return {a, b, view_as(y0, ys)};
}

MatmulViews linear_views(const Tensor& x, const Tensor& w, const Tensor& y0) {
  int64_t in = x.sizes().back(), out = w.size(0);
  // W^T as a view: [in, out] with swapped strides.
  Tensor wt = w.as_strided({in, out}, {w.stride(1), w.stride(0)}, w.offset());
  if (x.dim() == 1) {
    Tensor a = x.as_strided({1, in}, {0, x.stride(0)}, x.offset());
    return {a, wt, view_as(y0, {1, out})};
  }
  if (x.is_contiguous()) {
    // One [rows, in] x [in, out] GEMM rather than a batch of small ones.
    int64_t rows = 1;
    for (int i = 0; i + 1 < x.dim(); ++i) rows *= x.sizes()[size_t(i)];
    return {view_as(x, {rows, in}), wt, view_as(y0, {rows, out})};
  }
  Dims ys = x.sizes();
  ys[ys.size() - 1] = out;
  return {x, pad_rank(wt, x.dim()), view_as(y0, ys)};
}

// ---- reference --------------------------------------------------------------------------------
void ref_matmul_views(const MatmulViews& v, const Tensor& bias) {
  const Tensor &a = v.a, &b = v.b, &y = v.y;
  int r = y.dim();
  int64_t m_size = y.sizes()[size_t(r - 2)], n_size = y.sizes()[size_t(r - 1)];
  int64_t k_size = a.sizes()[size_t(r - 1)];
  Dims batch, strides[3];
  for (int i = 0; i < r - 2; ++i) {
    batch.push_back(y.sizes()[size_t(i)]);
    strides[0].push_back(a.sizes()[size_t(i)] == 1 ? 0 : a.strides()[size_t(i)]);
    strides[1].push_back(b.sizes()[size_t(i)] == 1 ? 0 : b.strides()[size_t(i)]);
    strides[2].push_back(y.strides()[size_t(i)]);
  }
  int64_t am = a.strides()[size_t(r - 2)], ak = a.strides()[size_t(r - 1)];
  int64_t bk = b.strides()[size_t(r - 2)], bn = b.strides()[size_t(r - 1)];
  int64_t ym = y.strides()[size_t(r - 2)], yn = y.strides()[size_t(r - 1)];
  DType dt = y.dtype();
  int64_t es = y.element_size();
  const char* ap = static_cast<const char*>(a.raw_data());
  const char* bp = static_cast<const char*>(b.raw_data());
  char* yp = static_cast<char*>(y.raw_data());
  const char* biasp = bias.defined() ? static_cast<const char*>(bias.raw_data()) : nullptr;
  int64_t bias_stride = bias.defined() ? bias.stride(0) : 0;
  bool integer = !is_floating(dt);
  for_each_broadcast(batch, strides, [&](int64_t, const int64_t* off) {
    for (int64_t m = 0; m < m_size; ++m)
      for (int64_t n = 0; n < n_size; ++n) {
        const char* arow = ap + (off[0] + m * am) * es;
        const char* bcol = bp + (off[1] + n * bn) * es;
        char* dst = yp + (off[2] + m * ym + n * yn) * es;
        if (integer) {
          int64_t acc = biasp ? load_i64(biasp + n * bias_stride * es, dt) : 0;
          for (int64_t k = 0; k < k_size; ++k)
            acc += load_i64(arow + k * ak * es, dt) * load_i64(bcol + k * bk * es, dt);
          store_i64(dst, dt, acc);
        } else {
          double acc = biasp ? load_f64(biasp + n * bias_stride * es, dt) : 0.0;
          for (int64_t k = 0; k < k_size; ++k)
            acc += load_f64(arow + k * ak * es, dt) * load_f64(bcol + k * bk * es, dt);
          store_f64(dst, dt, acc);
        }
      }
  });
}

void ref_matmul(const KernelContext& ctx) {
  ref_matmul_views(matmul_views(ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]), Tensor());
}


void ref_linear(const KernelContext& ctx) {
  ref_matmul_views(linear_views(ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]), ctx.inputs[2]);
}

// ---- eager ------------------------------------------------------------------------------------
bool onednn_eligible(DType d) {
  return (d == DType::Float32 || d == DType::BFloat16) && onednn::supports_dtype(d);
}

void eager_matmul(const KernelContext& ctx) {
  if (!onednn_eligible(ctx.inputs[0].dtype())) return note_kernel_path("reference"), ref_matmul(ctx);
  MatmulViews v = matmul_views(ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]);
  if (onednn::matmul(v.a, v.b, Tensor(), v.y)) return note_kernel_path("onednn");
  note_kernel_path("reference");
  ref_matmul_views(v, Tensor());
}

void eager_linear(const KernelContext& ctx) {
  if (!onednn_eligible(ctx.inputs[0].dtype())) return note_kernel_path("reference"), ref_linear(ctx);
  MatmulViews v = linear_views(ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]);
  const Tensor& bias = ctx.inputs[2];
  if (onednn::matmul(v.a, v.b, bias, v.y)) return note_kernel_path("onednn");
  note_kernel_path("reference");
  ref_matmul_views(v, bias);
}

// ---- samples ----------------------------------------------------------------------------------
std::vector<OpSample> samples_matmul(Generator& g) {
  auto r = [&](Dims d) { return sample_randn(g, d); };
  return {
      {{r({3, 4}), r({4, 5})}, {}, "[3,4] x [4,5]"},
      {{r({4}), r({4, 3})}, {}, "1-D a: [4] x [4,3]"},
      {{r({3, 4}), r({4})}, {}, "1-D b: [3,4] x [4]"},
      {{r({5}), r({5})}, {}, "dot: [5] x [5]"},
      {{r({2, 3, 4}), r({4, 5})}, {}, "batched a, shared b"},
      {{r({4}), r({2, 4, 3})}, {}, "1-D a with batched b"},
      {{r({2, 1, 3, 4}), r({3, 4, 2})}, {}, "broadcast both: [2,1,3,4] x [3,4,2]"},
      {{r({2, 3, 2}), r({2, 2, 4})}, {}, "equal batches"},
      {{sample_noncontiguous(g, {3, 4}), sample_noncontiguous(g, {4, 5})}, {},
       "non-contiguous (transposed) operands"},
      {{sample_noncontiguous(g, {2, 3, 4}), r({4, 2})}, {}, "non-contiguous batched a"},
      {{r({0, 3}), r({3, 2})}, {}, "empty M"},
      {{r({2, 0}), r({0, 3})}, {}, "K = 0 gives zeros"},
  };
}

std::vector<OpSample> samples_linear(Generator& g) {
  auto r = [&](Dims d) { return sample_randn(g, d); };
  return {
      {{r({3, 4}), r({5, 4}), r({5})}, {}, "[3,4] -> 5 with bias"},
      {{r({2, 3, 4}), r({6, 4}), Tensor()}, {}, "[2,3,4] -> 6, no bias"},
      {{r({4}), r({3, 4}), r({3})}, {}, "1-D x"},
      {{sample_noncontiguous(g, {4, 3}), sample_noncontiguous(g, {2, 3}), r({2})}, {},
       "non-contiguous x and weight"},
      {{sample_noncontiguous(g, {2, 3, 5}), r({4, 5}), r({4})}, {}, "non-contiguous 3-D x"},
      {{r({1, 7}), r({1, 7}), r({1})}, {}, "single output feature"},
      {{r({2, 0}), r({3, 0}), r({3})}, {}, "in_features = 0 gives the bias"},
  };
}

}  // namespace

void register_linalg_ops() {
  OpDef& mm = define_op(OpId::Matmul);
  mm.doc = "matrix product with NumPy semantics: 1-D operands promoted (and the added dim "
           "removed), batch dims broadcast";
  mm.inputs = {{"a"}, {"b"}};
  mm.infer = infer_matmul;
  mm.reference = ref_matmul;
  mm.eager_cpu = eager_matmul;
  mm.dtypes = numeric_dtypes();
  mm.samples = samples_matmul;
  mm.onnx_ops = {"MatMul"};

  OpDef& lin = define_op(OpId::Linear);
  lin.doc = "y = x @ weight^T + bias; weight [out_features, in_features], bias [out_features]";
  lin.inputs = {{"x"}, {"weight"}, {"bias", true}};
  lin.infer = infer_linear;
  lin.reference = ref_linear;
  lin.eager_cpu = eager_linear;
  lin.dtypes = numeric_dtypes();
  lin.samples = samples_linear;
}

}  // namespace kiln
