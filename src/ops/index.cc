// Indexing ops: gather index_select embedding scatter_add.
//
// Index tensors are int64 or int32. Negative indices wrap (index + size, ONNX semantics) for
// every op here, embedding included. An index outside [-size, size) is a kiln::Error naming the
// op, the index value, its position and the valid range; kernels check every index before
// touching memory, so a bad index can never read or write out of bounds.
//
// Shape checks that only decide validity, not the output shape (gather's index dims <= x's),
// are made when both sizes are concrete; eager re-infers on concrete shapes before each kernel.
//
// gather, index_select and embedding only move elements, so one byte-copying kernel serves all
// dtypes and is both the reference and the eager kernel. scatter_add accumulates in float64
// (floats) or int64 (integers) and rounds once at the end.
#include <cstring>
#include <type_traits>

#include "ops/kernel_util.h"

namespace kiln {
namespace {

int checked_axis(const InferContext& ctx, int64_t axis, int rank) {
  if (axis < -rank || axis >= rank)
    ctx.fail("dim {} is out of range for an input of rank {} (valid: [{}, {}])", axis, rank,
             -rank, rank - 1);
  return int(axis < 0 ? axis + rank : axis);
}
int axis_index(int64_t axis, int rank) { return int(axis < 0 ? axis + rank : axis); }

bool is_index_dtype(DType d) { return d == DType::Int64 || d == DType::Int32; }

void check_index_dtype(const InferContext& ctx, size_t input, const char* name) {
  DType d = ctx.in(input).dtype;
  if (!is_index_dtype(d))
    ctx.fail("{} must be int64 or int32, got {}", name, dtype_name(d));
}

// Reads index element `offset` (elements) and wraps it into [0, size); throws when out of range.
struct IndexReader {
  const KernelContext& ctx;
  const Tensor& index;
  const char* base;
  int64_t es;
  DType dtype;
  IndexReader(const KernelContext& c, const Tensor& idx)
      : ctx(c), index(idx), base(static_cast<const char*>(idx.raw_data())),
        es(idx.element_size()), dtype(idx.dtype()) {}

  int64_t read(int64_t offset, int64_t size, const int64_t* pos, int pos_rank,
               const char* what) const {
    int64_t v = dtype == DType::Int64 ? *reinterpret_cast<const int64_t*>(base + offset * es)
                                      : *reinterpret_cast<const int32_t*>(base + offset * es);
    if (v < -size || v >= size) {
      Dims p(pos, pos + pos_rank);
      if (size == 0)
        fail("op '{}': index {} at position {} of the indices is out of range: {} is empty",
             ctx.op.name, v, to_string(p), what);
      fail("op '{}': index {} at position {} of the indices is out of range for {} of size {} "
           "(valid range [{}, {}])", ctx.op.name, v, to_string(p), what, size, -size, size - 1);
    }
    return v < 0 ? v + size : v;
  }
};

// Copies elements of src into dst (same sizes and dtype, any strides) as raw bytes.
void copy_elements(const Tensor& dst, const Tensor& src) {
  const int64_t es = dst.element_size();
  char* dp = static_cast<char*>(dst.raw_data());
  const char* sp = static_cast<const char*>(src.raw_data());
  if (dst.is_contiguous() && src.is_contiguous()) {
    std::memcpy(dp, sp, size_t(dst.numel() * es));
    return;
  }
  Dims strides[2] = {dst.strides(), src.strides()};
  for_each_broadcast(dst.sizes(), strides, [&](int64_t, const int64_t* off) {
    std::memcpy(dp + off[0] * es, sp + off[1] * es, size_t(es));
  });
}

TensorType logical(DType d, Shape s, Device dev) { return TensorType(d, s, dev); }

// ---- gather ----------------------------------------------------------------------------------
std::vector<TensorType> infer_gather(const InferContext& ctx) {
  const TensorType& x = ctx.in(0);
  const TensorType& index = ctx.in(1);
  check_index_dtype(ctx, 1, "index");
  int r = x.rank();
  if (r == 0) ctx.fail("x is a scalar; gather needs rank >= 1");
  int dim = checked_axis(ctx, ctx.attrs.get_int("dim"), r);
  if (index.rank() != r)
    ctx.fail("index has shape {} (rank {}) but x has shape {} (rank {}); the ranks must match",
             to_string(index.shape), index.rank(), to_string(x.shape), r);
  for (int d = 0; d < r; ++d) {
    if (d == dim) continue;
    SymInt i = index.shape[d], s = x.shape[d];
    if (i.is_concrete() && s.is_concrete() && i.value() > s.value())
      ctx.fail("index has shape {} but x has shape {}: index dim {} ({}) exceeds x's ({})",
               to_string(index.shape), to_string(x.shape), d, i.value(), s.value());
  }
  return {logical(x.dtype, index.shape, x.device)};
}

void kernel_gather(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const Tensor& index = ctx.inputs[1];
  Tensor& out = ctx.outputs[0];
  int r = x.dim();
  int dim = axis_index(ctx.attrs.get_int("dim"), r);
  IndexReader reader(ctx, index);
  const int64_t es = x.element_size(), size = x.sizes()[dim];
  const char* xp = static_cast<const char*>(x.raw_data());
  char* op = static_cast<char*>(out.raw_data());
  int64_t n = 0;
  std::string what = fmt::format("dim {} of x", dim);
  for_each_index(index.sizes(), [&](const int64_t* idx) {
    int64_t v = reader.read(offset_of(idx, index.strides()), size, idx, r, what.c_str());
    int64_t off = offset_of(idx, x.strides()) + (v - idx[dim]) * x.strides()[dim];
    std::memcpy(op + (n++) * es, xp + off * es, size_t(es));
  });
}

// ---- index_select ----------------------------------------------------------------------------
std::vector<TensorType> infer_index_select(const InferContext& ctx) {
  const TensorType& x = ctx.in(0);
  const TensorType& index = ctx.in(1);
  check_index_dtype(ctx, 1, "index");
  if (x.rank() == 0) ctx.fail("x is a scalar; index_select needs rank >= 1");
  int dim = checked_axis(ctx, ctx.attrs.get_int("dim"), x.rank());
  if (index.rank() > 1)
    ctx.fail("index must be 1-D (or a scalar), got shape {}", to_string(index.shape));
  Shape out = x.shape;
  out[dim] = index.rank() == 1 ? index.shape[0] : SymInt(1);
  return {logical(x.dtype, out, x.device)};
}

void kernel_index_select(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const Tensor& index = ctx.inputs[1];
  Tensor& out = ctx.outputs[0];
  int dim = axis_index(ctx.attrs.get_int("dim"), x.dim());
  IndexReader reader(ctx, index);
  const int64_t size = x.sizes()[dim], count = index.numel();
  const int64_t index_stride = index.dim() == 1 ? index.strides()[0] : 0;
  Dims slice_sizes = x.sizes();
  slice_sizes[dim] = 1;
  std::string what = fmt::format("dim {} of x", dim);
  // Check every index first: nothing is written when one is bad.
  std::vector<int64_t> rows(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k)
    rows[size_t(k)] = reader.read(k * index_stride, size, &k, index.dim(), what.c_str());
  if (x.is_contiguous() && out.is_contiguous() && x.dtype() == out.dtype()) {
    // Contiguous both sides: each selected slice is `inner` bytes, copied as they are.
    int64_t outer = 1, inner = int64_t(dtype_size(x.dtype()));
    for (int i = 0; i < dim; ++i) outer *= x.sizes()[i];
    for (int i = dim + 1; i < x.dim(); ++i) inner *= x.sizes()[i];
    const char* src = static_cast<const char*>(x.raw_data());
    char* dst = static_cast<char*>(out.raw_data());
    if (inner > 0)
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t k = 0; k < count; ++k)
          std::memcpy(dst + size_t((o * count + k) * inner),
                      src + size_t((o * size + rows[size_t(k)]) * inner), size_t(inner));
    return;
  }
  for (int64_t k = 0; k < count; ++k) {
    Tensor src = x.as_strided(slice_sizes, x.strides(),
                              x.offset() + rows[size_t(k)] * x.strides()[dim]);
    Tensor dst = out.as_strided(slice_sizes, out.strides(), out.offset() + k * out.strides()[dim]);
    copy_elements(dst, src);
  }
}

// ---- embedding -------------------------------------------------------------------------------
std::vector<TensorType> infer_embedding(const InferContext& ctx) {
  const TensorType& weight = ctx.in(0);
  const TensorType& indices = ctx.in(1);
  check_index_dtype(ctx, 1, "indices");
  if (weight.rank() != 2)
    ctx.fail("weight must be 2-D [num_embeddings, embedding_dim], got shape {}",
             to_string(weight.shape));
  if (indices.rank() + 1 > kMaxRank)
    ctx.fail("indices of rank {} give an output of rank {}, above Kiln's maximum {}",
             indices.rank(), indices.rank() + 1, kMaxRank);
  Shape out = indices.shape;
  out.push_back(weight.shape[1]);
  return {logical(weight.dtype, out, weight.device)};
}

void kernel_embedding(const KernelContext& ctx) {
  const Tensor& weight = ctx.inputs[0];
  const Tensor& indices = ctx.inputs[1];
  Tensor& out = ctx.outputs[0];
  IndexReader reader(ctx, indices);
  const int64_t num = weight.sizes()[0], width = weight.sizes()[1];
  int64_t n = 0;
  for_each_index(indices.sizes(), [&](const int64_t* idx) {
    int64_t v = reader.read(offset_of(idx, indices.strides()), num, idx, indices.dim(),
                            "the embedding table (dim 0 of weight)");
    Tensor src = weight.as_strided(Dims{width}, Dims{weight.strides()[1]},
                                   weight.offset() + v * weight.strides()[0]);
    Tensor dst = out.as_strided(Dims{width}, Dims{1}, out.offset() + (n++) * width);
    copy_elements(dst, src);
  });
}

// ---- scatter_add -----------------------------------------------------------------------------
std::vector<TensorType> infer_scatter_add(const InferContext& ctx) {
  const TensorType& x = ctx.in(0);
  const TensorType& index = ctx.in(1);
  const TensorType& src = ctx.in(2);
  check_index_dtype(ctx, 1, "index");
  if (is_bool(x.dtype)) ctx.fail("x is bool; scatter_add needs a numeric dtype");
  if (src.dtype != x.dtype)
    ctx.fail("src has dtype {} but x has {}; they must match", dtype_name(src.dtype),
             dtype_name(x.dtype));
  int r = x.rank();
  if (r == 0) ctx.fail("x is a scalar; scatter_add needs rank >= 1");
  int dim = checked_axis(ctx, ctx.attrs.get_int("dim"), r);
  if (index.rank() != r || src.rank() != r)
    ctx.fail("x {}, index {} and src {} must have the same rank", to_string(x.shape),
             to_string(index.shape), to_string(src.shape));
  for (int d = 0; d < r; ++d) {
    SymInt i = index.shape[d];
    if (!i.is_concrete()) continue;
    if (src.shape[d].is_concrete() && i.value() > src.shape[d].value())
      ctx.fail("index has shape {} but src has shape {}: index dim {} ({}) exceeds src's ({})",
               to_string(index.shape), to_string(src.shape), d, i.value(), src.shape[d].value());
    if (d != dim && x.shape[d].is_concrete() && i.value() > x.shape[d].value())
      ctx.fail("index has shape {} but x has shape {}: index dim {} ({}) exceeds x's ({})",
               to_string(index.shape), to_string(x.shape), d, i.value(), x.shape[d].value());
  }
  return {logical(x.dtype, x.shape, x.device)};
}

template <typename Acc>
void scatter_add_impl(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const Tensor& index = ctx.inputs[1];
  const Tensor& src = ctx.inputs[2];
  Tensor& out = ctx.outputs[0];
  int r = x.dim();
  int dim = axis_index(ctx.attrs.get_int("dim"), r);
  constexpr bool kFloat = std::is_same_v<Acc, double>;
  auto load = [](const char* p, DType d) -> Acc {
    if constexpr (kFloat) return load_f64(p, d); else return load_i64(p, d);
  };
  // The accumulator holds x in row-major order (out's layout).
  std::vector<Acc> acc(size_t(x.numel()));
  const char* xp = static_cast<const char*>(x.raw_data());
  const char* sp = static_cast<const char*>(src.raw_data());
  const int64_t es = x.element_size();
  DType dt = x.dtype();
  int64_t n = 0;
  for_each_index(x.sizes(), [&](const int64_t* idx) {
    acc[size_t(n++)] = load(xp + offset_of(idx, x.strides()) * es, dt);
  });
  Dims row_major = contiguous_strides(x.sizes());
  IndexReader reader(ctx, index);
  const int64_t size = x.sizes()[dim];
  std::string what = fmt::format("dim {} of x", dim);
  for_each_index(index.sizes(), [&](const int64_t* idx) {
    int64_t v = reader.read(offset_of(idx, index.strides()), size, idx, r, what.c_str());
    int64_t target = offset_of(idx, row_major) + (v - idx[dim]) * row_major[dim];
    acc[size_t(target)] += load(sp + offset_of(idx, src.strides()) * es, dt);
  });
  char* op = static_cast<char*>(out.raw_data());
  for (size_t i = 0; i < acc.size(); ++i) {
    if constexpr (kFloat) store_f64(op + int64_t(i) * es, dt, acc[i]);
    else store_i64(op + int64_t(i) * es, dt, acc[i]);
  }
}

void kernel_scatter_add(const KernelContext& ctx) {
  if (is_floating(ctx.inputs[0].dtype())) scatter_add_impl<double>(ctx);
  else scatter_add_impl<int64_t>(ctx);
}

// ---- samples ---------------------------------------------------------------------------------
Tensor sample_index(Generator& g, const Dims& sizes, int64_t lo, int64_t hi, DType d) {
  return Tensor::randint(sizes, g, lo, hi, d);
}
// An index tensor viewed transposed (non-contiguous).
Tensor sample_index_t(Generator& g, int64_t rows, int64_t cols, int64_t lo, int64_t hi, DType d) {
  Tensor base = Tensor::randint(Dims{cols, rows}, g, lo, hi, d);
  return base.as_strided(Dims{rows, cols}, Dims{1, rows}, 0);
}

std::vector<OpSample> samples_gather(Generator& g) {
  const DType i64 = DType::Int64, i32 = DType::Int32;
  return {
      {{sample_randn(g, {4, 5}), sample_index(g, {3, 5}, -4, 4, i64)}, {{"dim", int64_t(0)}},
       "dim 0, int64, negative indices"},
      {{sample_randn(g, {4, 5}), sample_index(g, {4, 7}, 0, 5, i32)}, {{"dim", int64_t(1)}},
       "dim 1, int32, index longer than x on dim"},
      {{sample_randn(g, {2, 3, 4}), sample_index(g, {2, 2, 6}, -4, 4, i64)},
       {{"dim", int64_t(-1)}}, "dim -1, index smaller on other dims"},
      {{sample_noncontiguous(g, {5, 3}), sample_index_t(g, 4, 3, -5, 5, i32)},
       {{"dim", int64_t(0)}}, "non-contiguous x and index"},
      {{sample_randn(g, {3, 4}), sample_index(g, {0, 4}, 0, 3, i64)}, {{"dim", int64_t(0)}},
       "empty index"},
      {{sample_randn(g, {1, 1}), sample_index(g, {1, 1}, -1, 1, i64)}, {{"dim", int64_t(1)}},
       "size-1 dims"},
  };
}

std::vector<OpSample> samples_index_select(Generator& g) {
  const DType i64 = DType::Int64, i32 = DType::Int32;
  return {
      {{sample_randn(g, {5, 3}), sample_index(g, {7}, -5, 5, i64)}, {{"dim", int64_t(0)}},
       "dim 0, int64, negative and repeated"},
      {{sample_randn(g, {2, 6, 3}), sample_index(g, {4}, 0, 6, i32)}, {{"dim", int64_t(-2)}},
       "dim -2, int32"},
      {{sample_noncontiguous(g, {4, 5}), sample_index(g, {3}, -5, 5, i64)},
       {{"dim", int64_t(1)}}, "non-contiguous x"},
      {{sample_randn(g, {4, 2}), sample_index(g, {}, -4, 4, i64)}, {{"dim", int64_t(0)}},
       "scalar index"},
      {{sample_randn(g, {4, 2}), sample_index(g, {0}, 0, 4, i32)}, {{"dim", int64_t(0)}},
       "empty index"},
  };
}

std::vector<OpSample> samples_embedding(Generator& g) {
  const DType i64 = DType::Int64, i32 = DType::Int32;
  return {
      {{sample_randn(g, {10, 4}), sample_index(g, {2, 3}, 0, 10, i64)}, {}, "[2,3] int64"},
      {{sample_randn(g, {6, 5}), sample_index(g, {7}, -6, 6, i32)}, {}, "int32, negative"},
      {{sample_noncontiguous(g, {8, 3}), sample_index(g, {4}, 0, 8, i64)}, {},
       "non-contiguous weight"},
      {{sample_randn(g, {3, 2}), sample_index(g, {}, 0, 3, i64)}, {}, "scalar index"},
      {{sample_randn(g, {3, 2}), sample_index_t(g, 2, 3, -3, 3, i32)}, {},
       "non-contiguous indices"},
      {{sample_randn(g, {3, 2}), sample_index(g, {2, 0}, 0, 3, i64)}, {}, "empty indices"},
  };
}

std::vector<OpSample> samples_scatter_add(Generator& g) {
  const DType i64 = DType::Int64, i32 = DType::Int32;
  return {
      {{sample_randn(g, {4, 3}), sample_index(g, {6, 3}, -4, 4, i64), sample_randn(g, {6, 3})},
       {{"dim", int64_t(0)}}, "dim 0, repeated and negative indices"},
      {{sample_randn(g, {3, 5}), sample_index(g, {2, 4}, 0, 5, i32), sample_randn(g, {3, 6})},
       {{"dim", int64_t(-1)}}, "dim -1, int32, src larger than index"},
      {{sample_noncontiguous(g, {4, 4}), sample_index_t(g, 3, 4, 0, 4, i64),
        sample_noncontiguous(g, {3, 4})},
       {{"dim", int64_t(0)}}, "non-contiguous x, index, src"},
      {{sample_randn(g, {2, 3, 4}), sample_index(g, {2, 3, 4}, 0, 3, i64),
        sample_randn(g, {2, 3, 4})},
       {{"dim", int64_t(1)}}, "3-D, dim 1"},
      {{sample_randn(g, {3, 2}), sample_index(g, {0, 2}, 0, 3, i64), sample_randn(g, {1, 2})},
       {{"dim", int64_t(0)}}, "empty index"},
      {{sample_randn(g, {5, 4}), sample_index(g, {40, 4}, -1, 0, i64), sample_randn(g, {40, 4})},
       {{"dim", int64_t(0)}}, "every index the same (-1): 40 terms into one row"},
      {{sample_randn(g, {3, 50}), sample_index(g, {3, 64}, -50, 50, i32), sample_randn(g, {3, 64})},
       {{"dim", int64_t(1)}}, "scatter along the last dim, int32, wrapped and repeated"},
  };
}

OpDef& define_index_op(OpId id, const char* doc, std::vector<InputSpec> inputs, InferFn infer,
                       KernelFn kernel, std::vector<DType> dtypes, SampleFn samples,
                       std::vector<std::string> onnx) {
  OpDef& d = define_op(id);
  d.doc = doc;
  d.inputs = std::move(inputs);
  d.infer = infer;
  d.reference = kernel;
  d.dtypes = std::move(dtypes);
  d.samples = samples;
  d.onnx_ops = std::move(onnx);
  return d;
}

}  // namespace

void register_index_ops() {
  define_index_op(OpId::Gather, "out[i][j] = x[index[i][j]][j] along dim (index same rank as x)",
                  {{"x"}, {"index"}}, infer_gather, kernel_gather, all_dtypes(), samples_gather,
                  {"GatherElements"})
      .attrs = {{"dim", AttrType::Int, {}}};
  define_index_op(OpId::IndexSelect, "the slices of x at the 1-D index along dim",
                  {{"x"}, {"index"}}, infer_index_select, kernel_index_select, all_dtypes(),
                  samples_index_select, {"Gather"})
      .attrs = {{"dim", AttrType::Int, {}}};
  define_index_op(OpId::Embedding, "rows of weight [num, dim] at indices -> indices.shape + [dim]",
                  {{"weight"}, {"indices"}}, infer_embedding, kernel_embedding, all_dtypes(),
                  samples_embedding, {});
  define_index_op(OpId::ScatterAdd, "out = x; out[index[i][j]][j] += src[i][j] along dim",
                  {{"x"}, {"index"}, {"src"}}, infer_scatter_add, kernel_scatter_add,
                  numeric_dtypes(), samples_scatter_add, {"ScatterElements"})
      .attrs = {{"dim", AttrType::Int, {}}};
}

}  // namespace kiln
