#include "ops/api.h"

#include <climits>

#include "ops/dispatch.h"

namespace kiln {

using Loc = std::source_location;

static Tensor op1(OpId id, std::initializer_list<Tensor> in, const Attrs& a, const Loc& loc) {
  return call_op1(id, std::span<const Tensor>(in.begin(), in.size()), a, loc);
}

#define KILN_UNARY(fn, Id) \
  Tensor fn(const Tensor& x, const Loc& loc) { return op1(OpId::Id, {x}, {}, loc); }
KILN_UNARY(neg, Neg)
KILN_UNARY(abs, Abs)
KILN_UNARY(exp, Exp)
KILN_UNARY(log, Log)
KILN_UNARY(sqrt, Sqrt)
KILN_UNARY(rsqrt, Rsqrt)
KILN_UNARY(reciprocal, Reciprocal)
KILN_UNARY(sigmoid, Sigmoid)
KILN_UNARY(tanh, Tanh)
KILN_UNARY(relu, Relu)
KILN_UNARY(silu, Silu)
KILN_UNARY(erf, Erf)
KILN_UNARY(sin, Sin)
KILN_UNARY(cos, Cos)
KILN_UNARY(floor, Floor)
KILN_UNARY(ceil, Ceil)
KILN_UNARY(round, Round)
KILN_UNARY(sign, Sign)
KILN_UNARY(logical_not, Not)
KILN_UNARY(copy, Copy)
#undef KILN_UNARY

Tensor gelu(const Tensor& x, const std::string& approximate, const Loc& loc) {
  return op1(OpId::Gelu, {x}, {{"approximate", approximate}}, loc);
}
Tensor clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi, const Loc& loc) {
  Attrs a;
  if (lo) a.set("min", *lo);
  if (hi) a.set("max", *hi);
  return op1(OpId::Clamp, {x}, a, loc);
}
Tensor cast(const Tensor& x, DType dtype, const Loc& loc) {
  return op1(OpId::Cast, {x}, {{"dtype", dtype}}, loc);
}

#define KILN_BINARY(fn, Id) \
  Tensor fn(const Tensor& a, const Tensor& b, const Loc& loc) { return op1(OpId::Id, {a, b}, {}, loc); }
KILN_BINARY(add, Add)
KILN_BINARY(sub, Sub)
KILN_BINARY(mul, Mul)
KILN_BINARY(div, Div)
KILN_BINARY(pow, Pow)
KILN_BINARY(maximum, Maximum)
KILN_BINARY(minimum, Minimum)
KILN_BINARY(eq, Eq)
KILN_BINARY(ne, Ne)
KILN_BINARY(lt, Lt)
KILN_BINARY(le, Le)
KILN_BINARY(gt, Gt)
KILN_BINARY(ge, Ge)
KILN_BINARY(logical_and, And)
KILN_BINARY(logical_or, Or)
KILN_BINARY(matmul, Matmul)
#undef KILN_BINARY

Tensor where(const Tensor& c, const Tensor& a, const Tensor& b, const Loc& loc) {
  return op1(OpId::Where, {c, a, b}, {}, loc);
}

Tensor scalar_like(double value, const Tensor& like) {
  DType d = like.defined() ? like.dtype() : DType::Float32;
  Tensor s = Tensor::scalar(value, d);
  if (like.defined() && !like.device().is_cpu()) s = s.to(like.device());
  return s;
}
Tensor add(const Tensor& a, double b, const Loc& loc) { return add(a, scalar_like(b, a), loc); }
Tensor sub(const Tensor& a, double b, const Loc& loc) { return sub(a, scalar_like(b, a), loc); }
Tensor mul(const Tensor& a, double b, const Loc& loc) { return mul(a, scalar_like(b, a), loc); }
Tensor div(const Tensor& a, double b, const Loc& loc) { return div(a, scalar_like(b, a), loc); }
Tensor pow(const Tensor& a, double b, const Loc& loc) { return pow(a, scalar_like(b, a), loc); }

static Attrs reduce_attrs(std::vector<int64_t> dims, bool keepdim) {
  return {{"dims", Ints(std::move(dims))}, {"keepdim", keepdim}};
}
Tensor sum(const Tensor& x, std::vector<int64_t> d, bool k, const Loc& loc) {
  return op1(OpId::Sum, {x}, reduce_attrs(std::move(d), k), loc);
}
Tensor mean(const Tensor& x, std::vector<int64_t> d, bool k, const Loc& loc) {
  return op1(OpId::Mean, {x}, reduce_attrs(std::move(d), k), loc);
}
Tensor amax(const Tensor& x, std::vector<int64_t> d, bool k, const Loc& loc) {
  return op1(OpId::Max, {x}, reduce_attrs(std::move(d), k), loc);
}
Tensor amin(const Tensor& x, std::vector<int64_t> d, bool k, const Loc& loc) {
  return op1(OpId::Min, {x}, reduce_attrs(std::move(d), k), loc);
}
Tensor prod(const Tensor& x, std::vector<int64_t> d, bool k, const Loc& loc) {
  return op1(OpId::Prod, {x}, reduce_attrs(std::move(d), k), loc);
}
Tensor var(const Tensor& x, std::vector<int64_t> d, int64_t correction, bool k, const Loc& loc) {
  Attrs a = reduce_attrs(std::move(d), k);
  a.set("correction", correction);
  return op1(OpId::Var, {x}, a, loc);
}
static Attrs arg_attrs(std::optional<int64_t> dim, bool keepdim) {
  Attrs a{{"keepdim", keepdim}};
  if (dim) a.set("dim", *dim);
  return a;
}
Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool k, const Loc& loc) {
  return op1(OpId::Argmax, {x}, arg_attrs(dim, k), loc);
}
Tensor argmin(const Tensor& x, std::optional<int64_t> dim, bool k, const Loc& loc) {
  return op1(OpId::Argmin, {x}, arg_attrs(dim, k), loc);
}

Tensor softmax(const Tensor& x, int64_t dim, const Loc& loc) {
  return op1(OpId::Softmax, {x}, {{"dim", dim}}, loc);
}
Tensor log_softmax(const Tensor& x, int64_t dim, const Loc& loc) {
  return op1(OpId::LogSoftmax, {x}, {{"dim", dim}}, loc);
}
Tensor layer_norm(const Tensor& x, std::vector<int64_t> shape, const Tensor& w, const Tensor& b,
                  double eps, const Loc& loc) {
  return op1(OpId::LayerNorm, {x, w, b}, {{"normalized_shape", Ints(std::move(shape))}, {"eps", eps}},
             loc);
}
Tensor batch_norm(const Tensor& x, const Tensor& m, const Tensor& v, const Tensor& w,
                  const Tensor& b, double eps, const Loc& loc) {
  return op1(OpId::BatchNorm, {x, m, v, w, b}, {{"eps", eps}}, loc);
}
Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& w, const Tensor& b, double eps,
                  const Loc& loc) {
  return op1(OpId::GroupNorm, {x, w, b}, {{"num_groups", groups}, {"eps", eps}}, loc);
}
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, const Loc& loc) {
  return op1(OpId::Linear, {x, w, b}, {}, loc);
}

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, std::vector<int64_t> stride,
              std::vector<int64_t> padding, std::vector<int64_t> dilation, int64_t groups,
              const Loc& loc) {
  return op1(OpId::Conv2d, {x, w, b},
             {{"stride", Ints(stride)}, {"padding", Ints(padding)}, {"dilation", Ints(dilation)},
              {"groups", groups}},
             loc);
}
Tensor conv_transpose2d(const Tensor& x, const Tensor& w, const Tensor& b,
                        std::vector<int64_t> stride, std::vector<int64_t> padding,
                        std::vector<int64_t> output_padding, std::vector<int64_t> dilation,
                        int64_t groups, const Loc& loc) {
  return op1(OpId::ConvTranspose2d, {x, w, b},
             {{"stride", Ints(stride)}, {"padding", Ints(padding)},
              {"output_padding", Ints(output_padding)}, {"dilation", Ints(dilation)},
              {"groups", groups}},
             loc);
}
Tensor max_pool2d(const Tensor& x, std::vector<int64_t> k, std::vector<int64_t> s,
                  std::vector<int64_t> p, std::vector<int64_t> d, bool ceil_mode, const Loc& loc) {
  return op1(OpId::MaxPool2d, {x},
             {{"kernel_size", Ints(k)}, {"stride", Ints(s)}, {"padding", Ints(p)},
              {"dilation", Ints(d)}, {"ceil_mode", ceil_mode}},
             loc);
}
Tensor avg_pool2d(const Tensor& x, std::vector<int64_t> k, std::vector<int64_t> s,
                  std::vector<int64_t> p, bool ceil_mode, bool cip, const Loc& loc) {
  return op1(OpId::AvgPool2d, {x},
             {{"kernel_size", Ints(k)}, {"stride", Ints(s)}, {"padding", Ints(p)},
              {"ceil_mode", ceil_mode}, {"count_include_pad", cip}},
             loc);
}
Tensor adaptive_avg_pool2d(const Tensor& x, std::vector<int64_t> out, const Loc& loc) {
  return op1(OpId::AdaptiveAvgPool2d, {x}, {{"output_size", Ints(out)}}, loc);
}

Tensor reshape(const Tensor& x, std::vector<int64_t> shape, const Loc& loc) {
  return op1(OpId::Reshape, {x}, {{"shape", Ints(std::move(shape))}}, loc);
}
Tensor permute(const Tensor& x, std::vector<int64_t> dims, const Loc& loc) {
  return op1(OpId::Permute, {x}, {{"dims", Ints(std::move(dims))}}, loc);
}
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1, const Loc& loc) {
  return op1(OpId::Transpose, {x}, {{"dim0", d0}, {"dim1", d1}}, loc);
}
Tensor expand(const Tensor& x, std::vector<int64_t> shape, const Loc& loc) {
  return op1(OpId::Expand, {x}, {{"shape", Ints(std::move(shape))}}, loc);
}
Tensor squeeze(const Tensor& x, std::vector<int64_t> dims, const Loc& loc) {
  return op1(OpId::Squeeze, {x}, {{"dims", Ints(std::move(dims))}}, loc);
}
Tensor unsqueeze(const Tensor& x, int64_t dim, const Loc& loc) {
  return op1(OpId::Unsqueeze, {x}, {{"dims", Ints{dim}}}, loc);
}
Tensor unsqueeze(const Tensor& x, std::vector<int64_t> dims, const Loc& loc) {
  return op1(OpId::Unsqueeze, {x}, {{"dims", Ints(std::move(dims))}}, loc);
}
Tensor flatten(const Tensor& x, int64_t s, int64_t e, const Loc& loc) {
  return op1(OpId::Flatten, {x}, {{"start_dim", s}, {"end_dim", e}}, loc);
}
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step,
             const Loc& loc) {
  return op1(OpId::Slice, {x}, {{"dim", dim}, {"start", start}, {"end", end}, {"step", step}}, loc);
}
Tensor concat(const TensorList& xs, int64_t dim, const Loc& loc) {
  return call_op1(OpId::Concat, std::span<const Tensor>(xs), {{"dim", dim}}, loc);
}
TensorList split(const Tensor& x, std::vector<int64_t> sizes, int64_t dim, const Loc& loc) {
  Tensor in[1] = {x};
  return call_op(OpId::Split, in, {{"sizes", Ints(std::move(sizes))}, {"dim", dim}}, loc);
}
Tensor pad(const Tensor& x, std::vector<int64_t> pads, const std::string& mode, double value,
           const Loc& loc) {
  return op1(OpId::Pad, {x}, {{"pads", Ints(std::move(pads))}, {"mode", mode}, {"value", value}},
             loc);
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index, const Loc& loc) {
  return op1(OpId::Gather, {x, index}, {{"dim", dim}}, loc);
}
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index, const Loc& loc) {
  return op1(OpId::IndexSelect, {x, index}, {{"dim", dim}}, loc);
}
Tensor embedding(const Tensor& w, const Tensor& ids, const Loc& loc) {
  return op1(OpId::Embedding, {w, ids}, {}, loc);
}
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src,
                   const Loc& loc) {
  return op1(OpId::ScatterAdd, {x, index, src}, {{"dim", dim}}, loc);
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& mask, bool is_causal,
                                    std::optional<double> scale, const Loc& loc) {
  Attrs a{{"is_causal", is_causal}};
  if (scale) a.set("scale", *scale);
  return op1(OpId::ScaledDotProductAttention, {q, k, v, mask}, a, loc);
}

Tensor upsample(const Tensor& x, std::vector<int64_t> size, std::vector<double> scales,
                const std::string& mode, bool align_corners, const Loc& loc) {
  return op1(OpId::Upsample, {x},
             {{"size", Ints(std::move(size))}, {"scales", Floats(std::move(scales))},
              {"mode", mode}, {"align_corners", align_corners}},
             loc);
}
Tensor grid_sample(const Tensor& x, const Tensor& grid, bool align_corners, const Loc& loc) {
  return op1(OpId::GridSample, {x, grid}, {{"align_corners", align_corners}}, loc);
}

}  // namespace kiln
