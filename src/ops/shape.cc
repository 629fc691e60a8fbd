// Shape and layout ops: reshape permute transpose expand squeeze unsqueeze flatten slice (views)
// and concat split pad copy (copies).
//
// Note [View ops]
// View ops (is_view) return a Tensor::as_strided over the input's storage: no data moves, and a
// write through the input is visible in the view. Their reference kernel is the view itself (a
// view is obviously correct when its sizes/strides/offset are). reshape and flatten are views
// when the input's strides allow it (see view_strides) and contiguous copies otherwise, like
// PyTorch's reshape. Inference describes outputs as logical (contiguous) types: strides are a
// property of eager tensors and of the compiler's layout decisions, not of the op's meaning.
//
// Copy ops (concat split pad copy) move elements as raw bytes (elements of one dtype need no
// arithmetic), so one kernel serves every dtype and is both the reference and the eager kernel.
//
// Inference works on symbolic shapes: sizes are SymInts, shape attributes hold SymInt raw values
// (Note [SymInt encoding]). An output shape is returned only when it holds for every value of
// the symbols: a size equality the shape depends on (reshape's element count, concat's other
// dims, split's sum) must be provable from the canonical SymInt forms, or inference throws.
// Conditions that do not change the shape (reflect padding smaller than a symbolic dim) are
// checked when concrete; eager re-infers on concrete shapes before every kernel runs.
#include <cstring>
#include <optional>

#include "ops/api.h"
#include "ops/dispatch.h"
#include "ops/kernel_util.h"

namespace kiln {
namespace {

// ---- helpers ---------------------------------------------------------------------------------

// Normalizes a possibly negative axis against `rank` (no scalar special case: a rank-0 tensor
// has no axes).
int checked_axis(const InferContext& ctx, const char* what, int64_t axis, int rank) {
  if (axis < -rank || axis >= rank)
    ctx.fail("{} {} is out of range for an input of rank {} (valid: [{}, {}])", what, axis, rank,
             -rank, rank - 1);
  return int(axis < 0 ? axis + rank : axis);
}
int axis_index(int64_t axis, int rank) { return int(axis < 0 ? axis + rank : axis); }

// Suffix for a size mismatch message when one side is symbolic (the sizes may still be equal
// for some values, but not for all).
std::string unproven(SymInt a, SymInt b) {
  return a.is_concrete() && b.is_concrete() ? "" : " (not provably equal for every value of the symbols)";
}

TensorType logical_type(const TensorType& in, Shape shape) {
  TensorType t(in.dtype, shape, in.device);
  return t;
}

Dims out_dims(const KernelContext& ctx, size_t i = 0) {
  return to_dims(ctx.out_types[i].shape, "output shape");
}

void set_view(const KernelContext& ctx, const Tensor& x, const Dims& sizes, const Dims& strides,
              int64_t offset_delta = 0) {
  ctx.outputs[0] = x.as_strided(sizes, strides, x.offset() + offset_delta);
}

// Copies elements of src into dst (same sizes and dtype, any strides) as raw bytes.
template <typename T>
void copy_run(char* d, const char* s, int64_t n, int64_t ds, int64_t ss) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(d + i * ds, s + i * ss, sizeof(T));
}

void copy_bytes(const Tensor& dst, const Tensor& src) {
  KILN_ASSERT(dst.sizes() == src.sizes() && dst.dtype() == src.dtype());
  if (dst.numel() == 0) return;
  KILN_CHECK(dst.device().is_cpu() && src.device().is_cpu(),
             "strided copy on {} is not supported by the CPU kernel", dst.device().str());
  // Coalesce: drop size-1 dims and merge neighbours that are contiguous in both tensors, so that
  // the inner loop runs over as many elements as possible.
  Dims sizes, dst_st, src_st;
  for (int d = 0; d < dst.dim(); ++d) {
    if (dst.sizes()[d] == 1) continue;
    sizes.push_back(dst.sizes()[d]);
    dst_st.push_back(dst.strides()[d]);
    src_st.push_back(src.strides()[d]);
  }
  if (sizes.empty()) {
    sizes.push_back(1);
    dst_st.push_back(1);
    src_st.push_back(1);
  }
  Dims cs, cd, css;
  cs.push_back(sizes.back());
  cd.push_back(dst_st.back());
  css.push_back(src_st.back());
  for (int d = int(sizes.size()) - 2; d >= 0; --d) {
    int64_t inner = cs[0];
    if (dst_st[d] == cd[0] * inner && src_st[d] == css[0] * inner) {
      cs[0] *= sizes[d];
    } else {
      cs.insert(0, sizes[d]);
      cd.insert(0, dst_st[d]);
      css.insert(0, src_st[d]);
    }
  }
  const int64_t es = dst.element_size();
  const int r = cs.rank();
  const int64_t inner_n = cs[r - 1], inner_ds = cd[r - 1] * es, inner_ss = css[r - 1] * es;
  Dims outer = cs;
  outer.back() = 1;
  Dims strides[2] = {cd, css};
  strides[0].back() = 0;
  strides[1].back() = 0;
  char* dp = static_cast<char*>(dst.raw_data());
  const char* sp = static_cast<const char*>(src.raw_data());
  const bool runs = cd[r - 1] == 1 && css[r - 1] == 1;
  for_each_broadcast(outer, strides, [&](int64_t, const int64_t* off) {
    char* d = dp + off[0] * es;
    const char* s = sp + off[1] * es;
    if (runs) {
      std::memcpy(d, s, size_t(inner_n * es));
      return;
    }
    switch (es) {
      case 1: return copy_run<uint8_t>(d, s, inner_n, inner_ds, inner_ss);
      case 2: return copy_run<uint16_t>(d, s, inner_n, inner_ds, inner_ss);
      case 4: return copy_run<uint32_t>(d, s, inner_n, inner_ds, inner_ss);
      default: return copy_run<uint64_t>(d, s, inner_n, inner_ds, inner_ss);
    }
  });
}

Tensor contiguous_copy(const Tensor& x) {
  Tensor out = Tensor::empty(x.sizes(), x.dtype(), x.device());
  copy_bytes(out, x);
  return out;
}

// Note [Reshape as a view]
// A reshape can reuse the input's storage when every group of input dims that is laid out
// uniformly in memory ("a chunk": neighbours with stride[d] == stride[d+1] * size[d+1]) is
// covered exactly by a run of consecutive output dims. Within a chunk the output dims get
// strides base * (product of the output dims to their right inside the chunk). Size-1 dims never
// matter. Returns nullopt when some output dim would straddle two chunks (e.g. flattening a
// transposed matrix), where a copy is needed.
// reshape/flatten kernel: a view when possible, a contiguous copy otherwise.
void kernel_reshape(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Dims new_sizes = out_dims(ctx);
  if (std::optional<Dims> st = view_strides(x.sizes(), x.strides(), new_sizes)) {
    set_view(ctx, x, new_sizes, *st);
    return;
  }
  Tensor c;
  if (x.device().is_cpu()) {
    c = contiguous_copy(x);
  } else {
    // Off the CPU the copy is the device's kernel for the copy op.
    const OpDef& copy = op_def(OpId::Copy);
    if (!copy.eager_cuda)
      fail_kind(ErrorKind::NotSupported,
                "op '{}': reshaping a {} tensor of shape {} with strides {} needs a copy, and "
                "op 'copy' has no kernel on {}", ctx.op.name, x.device().str(),
                to_string(x.sizes()), to_string(x.strides()), x.device().str());
    TensorType type(x.dtype(), to_shape(x.sizes()), x.device());
    c = run_kernel(copy, copy.eager_cuda, std::span<const Tensor>(&x, 1), Attrs{},
                   std::span<const TensorType>(&type, 1))[0];
  }
  ctx.outputs[0] = c.as_strided(new_sizes, contiguous_strides(new_sizes), 0);
}

// ---- reshape ---------------------------------------------------------------------------------
std::vector<TensorType> infer_reshape(const InferContext& ctx) {
  const TensorType& x = ctx.in(0);
  Shape target = ctx.attrs.get_shape("shape");
  int infer_at = -1;
  SymInt known = 1;
  for (size_t i = 0; i < target.size(); ++i) {
    SymInt s = target[i];
    if (s.is_concrete() && s.value() < 0) {
      if (s.value() != -1)
        ctx.fail("shape {} has a negative size {} at position {} (only -1 is allowed)",
                 to_string(target), s.value(), i);
      if (infer_at >= 0)
        ctx.fail("shape {} has more than one -1 (positions {} and {})", to_string(target),
                 infer_at, i);
      infer_at = int(i);
      continue;
    }
    known = known * s;
  }
  SymInt total = numel(x.shape);
  if (infer_at >= 0) {
    if (known == SymInt(0))
      ctx.fail("cannot infer the -1 in shape {} for input of shape {}: the other sizes multiply "
               "to 0", to_string(target), to_string(x.shape));
    // Symbolic dims that appear on both sides (a batch dim kept in place) cancel, so that the
    // -1 becomes a plain quotient: [batch, 3, 4] -> [batch, -1] gives 12, not (12*batch)//batch.
    Shape in_rest = x.shape;
    SymInt total_rest = 1, known_rest = 1;
    for (size_t i = 0; i < target.size(); ++i) {
      if (int(i) == infer_at) continue;
      bool cancelled = false;
      if (target[i].is_symbolic()) {
        for (size_t j = 0; j < in_rest.size() && !cancelled; ++j) {
          if (in_rest[j] == target[i]) {
            in_rest.erase(j);
            cancelled = true;
          }
        }
      }
      if (!cancelled) known_rest = known_rest * target[i];
    }
    total_rest = numel(in_rest);
    SymInt rem = mod(total_rest, known_rest);
    if (rem != SymInt(0))
      ctx.fail("input of shape {} ({} elements) cannot be reshaped to {}: {} is not {}divisible "
               "by {}", to_string(x.shape), total.str(), to_string(target), total_rest.str(),
               rem.is_concrete() ? "" : "provably ", known_rest.str());
    target[size_t(infer_at)] = floordiv(total_rest, known_rest);
  } else if (total != known) {
    ctx.fail("input of shape {} has {} elements but shape {} has {}{}", to_string(x.shape),
             total.str(), to_string(target), known.str(), unproven(total, known));
  }
  return {logical_type(x, target)};
}

// ---- permute / transpose ---------------------------------------------------------------------
std::vector<int> permutation(const Ints& dims, int rank) {
  std::vector<int> p;
  for (int64_t d : dims) p.push_back(axis_index(d, rank));
  return p;
}

std::vector<TensorType> infer_permute(const InferContext& ctx) {
  const TensorType& x = ctx.in(0);
  const Ints& dims = ctx.attrs.get_ints("dims");
  int r = x.rank();
  if (int(dims.size()) != r)
    ctx.fail("dims {} has {} entries but the input {} has rank {}",
             attr_value_str(dims), dims.size(), x.str(), r);
  bool seen[kMaxRank] = {};
  Shape out;
  for (int64_t d : dims) {
    int a = checked_axis(ctx, "permute dim", d, r);
    if (seen[a]) ctx.fail("dims {} is not a permutation: dim {} appears twice", attr_value_str(dims), a);
    seen[a] = true;
    out.push_back(x.shape[a]);
  }
  return {logical_type(x, out)};
}

void kernel_permute(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  std::vector<int> p = permutation(ctx.attrs.get_ints("dims"), x.dim());
  Dims sizes, strides;
  for (int a : p) {
    sizes.push_back(x.sizes()[a]);
    strides.push_back(x.strides()[a]);
  }
  set_view(ctx, x, sizes, strides);
}

std::vector<TensorType> infer_transpose(const InferContext& ctx) {
  const TensorType& x = ctx.in(0);
  int a = checked_axis(ctx, "dim0", ctx.attrs.get_int("dim0"), x.rank());
  int b = checked_axis(ctx, "dim1", ctx.attrs.get_int("dim1"), x.rank());
  Shape out = x.shape;
  std::swap(out[a], out[b]);
  return {logical_type(x, out)};
}

void kernel_transpose(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  int a = axis_index(ctx.attrs.get_int("dim0"), x.dim());
  int b = axis_index(ctx.attrs.get_int("dim1"), x.dim());
  Dims sizes = x.sizes(), strides = x.strides();
  std::swap(sizes[a], sizes[b]);
  std::swap(strides[a], strides[b]);
  set_view(ctx, x, sizes, strides);
}

// ---- expand ----------------------------------------------------------------------------------
std::vector<TensorType> infer_expand(const InferContext& ctx) {
  const TensorType& x = ctx.in(0);
  Shape target = ctx.attrs.get_shape("shape");
  int n = int(target.size()), r = x.rank();
  if (n < r)
    ctx.fail("shape {} has rank {}, less than the input {} (rank {})", to_string(target), n,
             x.str(), r);
  Shape out;
  for (int i = 0; i < n; ++i) {
    int j = i - (n - r);
    SymInt t = target[i];
    if (t.is_concrete() && t.value() < 0 && t.value() != -1)
      ctx.fail("shape {} has a negative size {} at position {}", to_string(target), t.value(), i);
    bool keep = t == SymInt(-1);
    if (j < 0) {
      if (keep)
        ctx.fail("shape {}: -1 is not allowed at position {}, a new leading dim",
                 to_string(target), i);
      out.push_back(t);
      continue;
    }
    SymInt s = x.shape[j];
    if (keep || t == s) {
      out.push_back(s);
    } else if (s == SymInt(1)) {
      out.push_back(t);
    } else {
      ctx.fail("cannot expand dim {} of size {} to {} (input {}, shape {}): only size-1 dims "
               "can be expanded", j, s.str(), t.str(), to_string(x.shape), to_string(target));
    }
  }
  return {logical_type(x, out)};
}

void kernel_expand(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Dims sizes = out_dims(ctx);
  int n = sizes.rank(), r = x.dim();
  Dims strides;
  for (int i = 0; i < n; ++i) {
    int j = i - (n - r);
    strides.push_back(j >= 0 && x.sizes()[j] == sizes[i] ? x.strides()[j] : 0);
  }
  set_view(ctx, x, sizes, strides);
}

// ---- squeeze / unsqueeze ---------------------------------------------------------------------
std::vector<TensorType> infer_squeeze(const InferContext& ctx) {
  const TensorType& x = ctx.in(0);
  const Ints& dims = ctx.attrs.get_ints("dims");
  int r = x.rank();
  bool drop[kMaxRank] = {};
  if (dims.empty()) {
    for (int d = 0; d < r; ++d) drop[d] = x.shape[d] == SymInt(1);
  } else {
    for (int64_t d : dims) {
      int a = checked_axis(ctx, "squeeze dim", d, r);
      if (x.shape[a] != SymInt(1))
        ctx.fail("cannot squeeze dim {} of size {} (input shape {}): only size-1 dims can be "
                 "squeezed", d, x.shape[a].str(), to_string(x.shape));
      drop[a] = true;
    }
  }
  Shape out;
  for (int d = 0; d < r; ++d)
    if (!drop[d]) out.push_back(x.shape[d]);
  return {logical_type(x, out)};
}

void kernel_squeeze(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const Ints& dims = ctx.attrs.get_ints("dims");
  int r = x.dim();
  bool drop[kMaxRank] = {};
  if (dims.empty()) {
    for (int d = 0; d < r; ++d) drop[d] = x.sizes()[d] == 1;
  } else {
    for (int64_t d : dims) drop[axis_index(d, r)] = true;
  }
  Dims sizes, strides;
  for (int d = 0; d < r; ++d) {
    if (drop[d]) continue;
    sizes.push_back(x.sizes()[d]);
    strides.push_back(x.strides()[d]);
  }
  set_view(ctx, x, sizes, strides);
}

// Which output positions unsqueeze inserts (normalized against the output rank).
void unsqueeze_positions(const InferContext* ctx, const Ints& dims, int out_rank, bool* insert) {
  for (int64_t d : dims) {
    if (d < -out_rank || d >= out_rank)
      ctx->fail("unsqueeze dim {} is out of range for an output of rank {} (valid: [{}, {}])", d,
                out_rank, -out_rank, out_rank - 1);
    int a = axis_index(d, out_rank);
    if (insert[a]) ctx->fail("dims {} names output position {} twice", attr_value_str(dims), a);
    insert[a] = true;
  }
}

std::vector<TensorType> infer_unsqueeze(const InferContext& ctx) {
  const TensorType& x = ctx.in(0);
  const Ints& dims = ctx.attrs.get_ints("dims");
  int out_rank = x.rank() + int(dims.size());
  if (out_rank > kMaxRank)
    ctx.fail("output rank {} exceeds Kiln's maximum rank {}", out_rank, kMaxRank);
  bool insert[kMaxRank] = {};
  unsqueeze_positions(&ctx, dims, out_rank, insert);
  Shape out;
  int j = 0;
  for (int i = 0; i < out_rank; ++i) out.push_back(insert[i] ? SymInt(1) : x.shape[j++]);
  return {logical_type(x, out)};
}

void kernel_unsqueeze(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const Ints& dims = ctx.attrs.get_ints("dims");
  int out_rank = x.dim() + int(dims.size());
  bool insert[kMaxRank] = {};
  for (int64_t d : dims) insert[axis_index(d, out_rank)] = true;
  Dims sizes, strides;
  sizes.resize(size_t(out_rank));
  strides.resize(size_t(out_rank));
  int j = x.dim() - 1;
  // Right to left so that an inserted dim can take the stride PyTorch gives it (the extent of
  // the dim to its right); any stride would do for a size-1 dim.
  for (int i = out_rank - 1; i >= 0; --i) {
    if (insert[i]) {
      sizes[i] = 1;
      strides[i] = i + 1 < out_rank ? sizes[i + 1] * strides[i + 1] : 1;
    } else {
      sizes[i] = x.sizes()[j];
      strides[i] = x.strides()[j];
      --j;
    }
  }
  set_view(ctx, x, sizes, strides);
}

// ---- flatten ---------------------------------------------------------------------------------
std::vector<TensorType> infer_flatten(const InferContext& ctx) {
  const TensorType& x = ctx.in(0);
  int r = x.rank();
  int64_t s_attr = ctx.attrs.get_int("start_dim"), e_attr = ctx.attrs.get_int("end_dim");
  if (r == 0) {
    // Like PyTorch, a scalar flattens to one element; only dims 0 and -1 name it.
    if (s_attr < -1 || s_attr > 0 || e_attr < -1 || e_attr > 0)
      ctx.fail("start_dim {} / end_dim {} out of range for a scalar (valid: 0 or -1)", s_attr,
               e_attr);
    return {logical_type(x, Shape{SymInt(1)})};
  }
  int s = checked_axis(ctx, "start_dim", s_attr, r);
  int e = checked_axis(ctx, "end_dim", e_attr, r);
  if (s > e)
    ctx.fail("start_dim {} comes after end_dim {} for an input of rank {}", s_attr, e_attr, r);
  Shape out;
  SymInt merged = 1;
  for (int d = 0; d < r; ++d) {
    if (d < s || d > e) {
      out.push_back(x.shape[d]);
    } else {
      merged = merged * x.shape[d];
      if (d == e) out.push_back(merged);
    }
  }
  return {logical_type(x, out)};
}

// ---- slice -----------------------------------------------------------------------------------
// Python's clamping of a slice bound against a dim of size n (n concrete here).
int64_t clamp_bound(int64_t v, int64_t n) {
  if (v < 0) v = v < -n ? 0 : v + n;
  return v > n ? n : v;
}
int64_t slice_length(int64_t start, int64_t end, int64_t step) {
  return end > start ? 1 + (end - start - 1) / step : 0;  // no overflow for a huge step
}

// The same clamping on a possibly symbolic size (dims are never negative).
SymInt clamp_bound_sym(int64_t v, SymInt n) {
  if (v == INT64_MAX) return n;
  if (v >= 0) return sym_min(SymInt(v), n);
  // Bounds below -2^61 behave like -inf; keep them inside SymInt's concrete range.
  if (v < -(int64_t(1) << 61)) return 0;
  return sym_max(n + SymInt(v), SymInt(0));
}

std::vector<TensorType> infer_slice(const InferContext& ctx) {
  const TensorType& x = ctx.in(0);
  int dim = checked_axis(ctx, "dim", ctx.attrs.get_int("dim"), x.rank());
  int64_t start = ctx.attrs.get_int("start"), end = ctx.attrs.get_int("end");
  int64_t step = ctx.attrs.get_int("step");
  if (step <= 0) ctx.fail("step must be positive, got {}", step);
  Shape out = x.shape;
  SymInt n = x.shape[dim];
  if (n.is_concrete()) {
    int64_t nc = n.value();
    out[dim] = slice_length(clamp_bound(start, nc), clamp_bound(end, nc), step);
  } else {
    SymInt s = clamp_bound_sym(start, n), e = clamp_bound_sym(end, n);
    out[dim] = sym_max(floordiv(e - s - SymInt(1), SymInt(step)) + SymInt(1), SymInt(0));
  }
  return {logical_type(x, out)};
}

void kernel_slice(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  int dim = axis_index(ctx.attrs.get_int("dim"), x.dim());
  int64_t n = x.sizes()[dim], step = ctx.attrs.get_int("step");
  int64_t start = clamp_bound(ctx.attrs.get_int("start"), n);
  int64_t end = clamp_bound(ctx.attrs.get_int("end"), n);
  Dims sizes = x.sizes(), strides = x.strides();
  sizes[dim] = slice_length(start, end, step);
  strides[dim] *= step;
  // An empty slice may start at n; its offset is never dereferenced, but keep it in bounds.
  int64_t offset = sizes[dim] == 0 ? 0 : start * x.strides()[dim];
  set_view(ctx, x, sizes, strides, offset);
}

// ---- concat ----------------------------------------------------------------------------------
std::vector<TensorType> infer_concat(const InferContext& ctx) {
  const TensorType& x0 = ctx.in(0);
  int r = x0.rank();
  if (r == 0) ctx.fail("input 0 is a scalar; concat needs tensors of rank >= 1");
  int dim = checked_axis(ctx, "dim", ctx.attrs.get_int("dim"), r);
  Shape out = x0.shape;
  for (size_t i = 1; i < ctx.num_inputs(); ++i) {
    const TensorType& xi = ctx.in(i);
    if (xi.dtype != x0.dtype)
      ctx.fail("input {} has dtype {} but input 0 has {}", i, dtype_name(xi.dtype),
               dtype_name(x0.dtype));
    if (xi.rank() != r)
      ctx.fail("input {} has shape {} (rank {}) but input 0 has shape {} (rank {})", i,
               to_string(xi.shape), xi.rank(), to_string(x0.shape), r);
    for (int d = 0; d < r; ++d) {
      if (d == dim) continue;
      if (xi.shape[d] != x0.shape[d])
        ctx.fail("input {} has shape {} but input 0 has shape {}: all dims except the concat dim "
                 "{} must match (dim {}: {} vs {}){}", i, to_string(xi.shape), to_string(x0.shape),
                 dim, d, xi.shape[d].str(), x0.shape[d].str(), unproven(xi.shape[d], x0.shape[d]));
    }
    out[dim] = out[dim] + xi.shape[dim];
  }
  return {logical_type(x0, out)};
}

void kernel_concat(const KernelContext& ctx) {
  Tensor& out = ctx.outputs[0];
  int dim = axis_index(ctx.attrs.get_int("dim"), out.dim());
  int64_t at = 0;
  for (const Tensor& x : ctx.inputs) {
    Tensor dst = out.as_strided(x.sizes(), out.strides(), out.offset() + at * out.strides()[dim]);
    copy_bytes(dst, x);
    at += x.sizes()[dim];
  }
}

// ---- split -----------------------------------------------------------------------------------
std::vector<TensorType> infer_split(const InferContext& ctx) {
  const TensorType& x = ctx.in(0);
  int dim = checked_axis(ctx, "dim", ctx.attrs.get_int("dim"), x.rank());
  Shape sizes = ctx.attrs.get_shape("sizes");
  if (sizes.empty()) ctx.fail("sizes is empty; split needs at least one output");
  SymInt total = 0;
  std::vector<TensorType> outs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i].is_concrete() && sizes[i].value() < 0)
      ctx.fail("sizes {} has a negative size {} at position {}", to_string(sizes),
               sizes[i].value(), i);
    total = total + sizes[i];
    Shape s = x.shape;
    s[dim] = sizes[i];
    outs.push_back(logical_type(x, s));
  }
  if (total != x.shape[dim])
    ctx.fail("sizes {} sum to {} but dim {} of the input {} has size {}{}", to_string(sizes),
             total.str(), dim, to_string(x.shape), x.shape[dim].str(),
             unproven(total, x.shape[dim]));
  return outs;
}

void kernel_split(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  int dim = axis_index(ctx.attrs.get_int("dim"), x.dim());
  int64_t at = 0;
  for (Tensor& out : ctx.outputs) {
    Tensor src = x.as_strided(out.sizes(), x.strides(), x.offset() + at * x.strides()[dim]);
    copy_bytes(out, src);
    at += out.sizes()[dim];
  }
}

// Note [split as slices]: the pieces are slices of x. A compiler that folds views into the
// loads of their readers (the CPU target decomposes split) then reads each piece where it lies
// instead of copying it out first: a GRU cell's gates, split from one linear's output, cost no
// copy. Where a piece must be materialized (a graph output, a library kernel's input) the
// compiler's view handling copies it.
TensorList decompose_split(std::span<const Tensor> in, const Attrs& attrs) {
  const Tensor& x = in[0];
  int dim = axis_index(attrs.get_int("dim"), x.dim());
  TensorList out;
  int64_t at = 0;
  for (const SymInt& s : attrs.get_shape("sizes")) {
    int64_t n = s.value();
    out.push_back(slice(x, dim, at, at + n));
    at += n;
  }
  return out;
}

// ---- pad -------------------------------------------------------------------------------------
enum class PadMode { Constant, Reflect, Replicate };

std::optional<PadMode> parse_pad_mode(const std::string& s) {
  if (s == "constant") return PadMode::Constant;
  if (s == "reflect") return PadMode::Reflect;
  if (s == "replicate") return PadMode::Replicate;
  return std::nullopt;
}

std::vector<TensorType> infer_pad(const InferContext& ctx) {
  const TensorType& x = ctx.in(0);
  Shape pads = ctx.attrs.get_shape("pads");
  const std::string& mode_name = ctx.attrs.get_string("mode");
  std::optional<PadMode> mode = parse_pad_mode(mode_name);
  if (!mode)
    ctx.fail("mode \"{}\" is not one of \"constant\", \"reflect\", \"replicate\"", mode_name);
  int r = x.rank();
  if (pads.size() % 2 != 0)
    ctx.fail("pads {} has an odd number of entries; expected [begins..., ends...]",
             to_string(pads));
  int n = int(pads.size()) / 2;
  if (n > r)
    ctx.fail("pads {} covers {} dims but the input {} has rank {}", to_string(pads), n, x.str(), r);
  Shape out = x.shape;
  for (int k = 0; k < n; ++k) {
    int d = r - n + k;
    SymInt b = pads[k], e = pads[n + k], size = x.shape[d];
    out[d] = size + b + e;
    if (out[d].is_concrete() && out[d].value() < 0)
      ctx.fail("pads {} crop dim {} of size {} to a negative size {}", to_string(pads), d,
               size.str(), out[d].value());
    for (SymInt p : {b, e}) {
      if (!p.is_concrete() || p.value() <= 0 || !size.is_concrete()) continue;
      if (*mode == PadMode::Reflect && p.value() >= size.value())
        ctx.fail("reflect padding {} of dim {} must be less than its size {} (input {})",
                 p.value(), d, size.value(), to_string(x.shape));
      if (*mode == PadMode::Replicate && size.value() == 0)
        ctx.fail("replicate padding of dim {} needs a non-empty dim (input {})", d,
                 to_string(x.shape));
    }
  }
  return {logical_type(x, out)};
}

void kernel_pad(const KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& out = ctx.outputs[0];
  PadMode mode = *parse_pad_mode(ctx.attrs.get_string("mode"));
  const Ints& pads = ctx.attrs.get_ints("pads");
  int r = x.dim(), n = int(pads.size()) / 2;
  if (out.numel() == 0) return;
  if (r == 0) return copy_bytes(out, x);
  // Per dim, the source index of each output index (-1: the constant value).
  std::vector<std::vector<int64_t>> src(static_cast<size_t>(r));
  for (int d = 0; d < r; ++d) {
    int k = d - (r - n);
    int64_t before = k >= 0 ? SymInt::from_raw(pads[size_t(k)]).value() : 0;
    int64_t size = x.sizes()[d];
    for (int64_t o = 0; o < out.sizes()[d]; ++o) {
      int64_t i = o - before;
      if (i < 0 || i >= size) {
        switch (mode) {
          case PadMode::Constant: i = -1; break;
          case PadMode::Reflect: i = i < 0 ? -i : 2 * (size - 1) - i; break;
          case PadMode::Replicate: i = i < 0 ? 0 : size - 1; break;
        }
      }
      src[size_t(d)].push_back(i);
    }
  }
  const int64_t es = x.element_size();
  alignas(8) char fill[8] = {};
  store_f64(fill, x.dtype(), ctx.attrs.get_float("value"));
  const char* xp = static_cast<const char*>(x.raw_data());
  char* op = static_cast<char*>(out.raw_data());
  Dims outer = out.sizes();
  int64_t inner_n = outer.back();
  outer.back() = 1;
  const std::vector<int64_t>& inner_src = src.back();
  const int64_t inner_stride = x.strides().back();
  int64_t row = 0;
  for_each_index(outer, [&](const int64_t* idx) {
    char* dst = op + row * inner_n * es;
    ++row;
    int64_t base = 0;
    bool constant_row = false;
    for (int d = 0; d + 1 < r; ++d) {
      int64_t i = src[size_t(d)][size_t(idx[d])];
      if (i < 0) constant_row = true;
      base += i * x.strides()[d];
    }
    for (int64_t o = 0; o < inner_n; ++o) {
      int64_t i = inner_src[size_t(o)];
      if (constant_row || i < 0)
        std::memcpy(dst + o * es, fill, size_t(es));
      else
        std::memcpy(dst + o * es, xp + (base + i * inner_stride) * es, size_t(es));
    }
  });
}

// ---- copy ------------------------------------------------------------------------------------
std::vector<TensorType> infer_copy(const InferContext& ctx) { return same_as_input(ctx); }
void kernel_copy(const KernelContext& ctx) { copy_bytes(ctx.outputs[0], ctx.inputs[0]); }

// ---- samples ---------------------------------------------------------------------------------
// A float64 tensor of `sizes` whose elements are spread through a larger buffer (every dim
// strided by a gap), for inputs that are neither contiguous nor a simple transpose.
Tensor sample_gapped(Generator& g, const Dims& sizes) {
  Dims big;
  for (int64_t s : sizes) big.push_back(2 * s + 1);
  Tensor base = sample_randn(g, big);
  Dims st;
  for (int64_t s : base.strides()) st.push_back(2 * s);
  return base.as_strided(sizes, st, 1);
}
// A stride-0 (expanded) float64 tensor: `sizes` with dim `d` broadcast.
Tensor sample_broadcast(Generator& g, const Dims& sizes, int d) {
  Dims one = sizes;
  one[d] = 1;
  Tensor base = sample_randn(g, one);
  Dims st = base.strides();
  st[d] = 0;
  return base.as_strided(sizes, st, 0);
}

Attrs shape_attr(const char* name, Ints v) { return {{name, AttrValue(std::move(v))}}; }

std::vector<OpSample> samples_reshape(Generator& g) {
  return {
      {{sample_randn(g, {2, 3, 4})}, shape_attr("shape", {4, 6}), "[2,3,4] -> [4,6]"},
      {{sample_randn(g, {2, 3, 4})}, shape_attr("shape", {-1, 4}), "-1 inferred"},
      {{sample_noncontiguous(g, {3, 4})}, shape_attr("shape", {12}), "transposed -> copy"},
      {{sample_noncontiguous(g, {3, 4})}, shape_attr("shape", {1, 3, 1, 4}),
       "transposed, viewable with size-1 dims"},
      {{sample_gapped(g, {2, 6})}, shape_attr("shape", {2, 2, 3}), "gapped strides, view split"},
      {{sample_gapped(g, {2, 6})}, shape_attr("shape", {4, 3}), "gapped strides -> copy"},
      {{sample_broadcast(g, {4, 3}, 0)}, shape_attr("shape", {2, 2, 3}), "stride-0 view"},
      {{sample_broadcast(g, {4, 3}, 0)}, shape_attr("shape", {-1}), "stride-0 -> copy"},
      {{sample_randn(g, {0, 3})}, shape_attr("shape", {3, -1, 1}), "size 0"},
      {{sample_randn(g, {})}, shape_attr("shape", {1, 1}), "scalar -> [1,1]"},
      {{sample_randn(g, {1, 1})}, shape_attr("shape", {}), "[1,1] -> scalar"},
  };
}

std::vector<OpSample> samples_permute(Generator& g) {
  return {
      {{sample_randn(g, {2, 3, 4})}, shape_attr("dims", {2, 0, 1}), "[2,0,1]"},
      {{sample_randn(g, {2, 3, 4})}, shape_attr("dims", {-1, -3, -2}), "negative dims"},
      {{sample_noncontiguous(g, {3, 5})}, shape_attr("dims", {1, 0}), "non-contiguous"},
      {{sample_randn(g, {0, 2, 3})}, shape_attr("dims", {1, 2, 0}), "size 0"},
      {{sample_randn(g, {})}, shape_attr("dims", {}), "scalar"},
  };
}

std::vector<OpSample> samples_transpose(Generator& g) {
  return {
      {{sample_randn(g, {2, 3, 4})}, {{"dim0", int64_t(0)}, {"dim1", int64_t(2)}}, "0<->2"},
      {{sample_randn(g, {2, 3, 4})}, {{"dim0", int64_t(-1)}, {"dim1", int64_t(-2)}}, "negative"},
      {{sample_randn(g, {3, 4})}, {{"dim0", int64_t(1)}, {"dim1", int64_t(1)}}, "same dim"},
      {{sample_gapped(g, {3, 4})}, {{"dim0", int64_t(0)}, {"dim1", int64_t(1)}}, "gapped"},
      {{sample_randn(g, {1, 0})}, {{"dim0", int64_t(0)}, {"dim1", int64_t(1)}}, "size 0"},
  };
}

std::vector<OpSample> samples_expand(Generator& g) {
  return {
      {{sample_randn(g, {3, 1})}, shape_attr("shape", {2, 3, 4}), "new leading dim"},
      {{sample_randn(g, {1})}, shape_attr("shape", {5}), "[1] -> [5]"},
      {{sample_randn(g, {3, 1})}, shape_attr("shape", {-1, 4}), "-1 keeps"},
      {{sample_randn(g, {2, 1, 3})}, shape_attr("shape", {2, 0, 3}), "to size 0"},
      {{sample_noncontiguous(g, {1, 4})}, shape_attr("shape", {3, 4}), "non-contiguous"},
      {{sample_randn(g, {})}, shape_attr("shape", {2, 2}), "scalar"},
  };
}

std::vector<OpSample> samples_squeeze(Generator& g) {
  return {
      {{sample_randn(g, {1, 3, 1, 2})}, shape_attr("dims", {}), "all size-1 dims"},
      {{sample_randn(g, {1, 3, 1, 2})}, shape_attr("dims", {2}), "dim 2"},
      {{sample_randn(g, {3, 1})}, shape_attr("dims", {-1}), "negative dim"},
      {{sample_noncontiguous(g, {4, 1, 3})}, shape_attr("dims", {1}), "non-contiguous"},
      {{sample_randn(g, {1, 0})}, shape_attr("dims", {0}), "size 0"},
      {{sample_randn(g, {1, 1})}, shape_attr("dims", {}), "to scalar"},
  };
}

std::vector<OpSample> samples_unsqueeze(Generator& g) {
  return {
      {{sample_randn(g, {3, 4})}, shape_attr("dims", {0}), "front"},
      {{sample_randn(g, {3, 4})}, shape_attr("dims", {-1}), "back"},
      {{sample_randn(g, {3, 4})}, shape_attr("dims", {0, 3}), "two dims"},
      {{sample_noncontiguous(g, {3, 4})}, shape_attr("dims", {1}), "non-contiguous"},
      {{sample_randn(g, {})}, shape_attr("dims", {0}), "scalar"},
      {{sample_randn(g, {0, 2})}, shape_attr("dims", {1}), "size 0"},
  };
}

Attrs flatten_attrs(int64_t s, int64_t e) { return {{"start_dim", s}, {"end_dim", e}}; }
std::vector<OpSample> samples_flatten(Generator& g) {
  return {
      {{sample_randn(g, {2, 3, 4})}, flatten_attrs(0, -1), "all dims"},
      {{sample_randn(g, {2, 3, 4, 2})}, flatten_attrs(1, 2), "middle dims"},
      {{sample_noncontiguous(g, {2, 3, 4})}, flatten_attrs(-2, -1), "non-contiguous -> copy"},
      {{sample_noncontiguous(g, {2, 3, 4})}, flatten_attrs(1, 1), "single dim"},
      {{sample_randn(g, {})}, flatten_attrs(0, -1), "scalar"},
      {{sample_randn(g, {2, 0, 3})}, flatten_attrs(1, 2), "size 0"},
  };
}

Attrs slice_attrs(int64_t dim, int64_t start, int64_t end, int64_t step = 1) {
  return {{"dim", dim}, {"start", start}, {"end", end}, {"step", step}};
}
std::vector<OpSample> samples_slice(Generator& g) {
  return {
      {{sample_randn(g, {6, 4})}, slice_attrs(0, 1, 5), "[1:5]"},
      {{sample_randn(g, {3, 10})}, slice_attrs(1, 1, INT64_MAX, 3), "[1::3]"},
      {{sample_randn(g, {3, 10})}, slice_attrs(-1, -4, -1), "[-4:-1]"},
      {{sample_randn(g, {7})}, slice_attrs(0, -100, 100, 2), "clamped bounds"},
      {{sample_randn(g, {5, 2})}, slice_attrs(0, 7, 9), "start past the end"},
      {{sample_randn(g, {5, 2})}, slice_attrs(0, 3, 1), "end before start"},
      {{sample_noncontiguous(g, {4, 6})}, slice_attrs(1, 1, 6, 2), "non-contiguous"},
      {{sample_randn(g, {0, 3})}, slice_attrs(1, 0, 2), "size 0"},
  };
}

std::vector<OpSample> samples_concat(Generator& g) {
  return {
      {{sample_randn(g, {2, 3}), sample_randn(g, {2, 1}), sample_randn(g, {2, 4})},
       {{"dim", int64_t(1)}}, "three inputs, dim 1"},
      {{sample_randn(g, {2, 3}), sample_randn(g, {4, 3})}, {{"dim", int64_t(-2)}}, "dim -2"},
      {{sample_noncontiguous(g, {3, 2}), sample_gapped(g, {3, 4})}, {{"dim", int64_t(1)}},
       "non-contiguous inputs"},
      {{sample_randn(g, {2, 0}), sample_randn(g, {2, 3})}, {{"dim", int64_t(1)}},
       "a size-0 input"},
      {{sample_randn(g, {5})}, {{"dim", int64_t(0)}}, "one input"},
      {{sample_randn(g, {1, 2, 2}), sample_randn(g, {1, 2, 2})}, {{"dim", int64_t(0)}},
       "size-1 dims"},
  };
}

Attrs split_attrs(Ints sizes, int64_t dim) { return {{"sizes", sizes}, {"dim", dim}}; }
std::vector<OpSample> samples_split(Generator& g) {
  return {
      {{sample_randn(g, {2, 6})}, split_attrs({1, 2, 3}, 1), "[1,2,3] on dim 1"},
      {{sample_randn(g, {4, 3})}, split_attrs({4}, 0), "one output"},
      {{sample_randn(g, {2, 5})}, split_attrs({0, 5, 0}, -1), "size-0 outputs, dim -1"},
      {{sample_noncontiguous(g, {5, 3})}, split_attrs({2, 3}, 0), "non-contiguous"},
  };
}

Attrs pad_attrs(Ints pads, const char* mode, double value = 0.0) {
  return {{"pads", pads}, {"mode", std::string(mode)}, {"value", value}};
}
std::vector<OpSample> samples_pad(Generator& g) {
  return {
      {{sample_randn(g, {2, 3, 4})}, pad_attrs({1, 2, 0, 3}, "constant"), "constant 0, 2 dims"},
      {{sample_randn(g, {2, 5})}, pad_attrs({2, 1}, "constant", 1.0), "constant 1, last dim"},
      {{sample_randn(g, {2, 3, 4})}, pad_attrs({2, 1, 1, 3}, "reflect"), "reflect"},
      {{sample_randn(g, {1, 2, 4, 5})}, pad_attrs({1, 4, 3, 2}, "replicate"), "replicate"},
      {{sample_randn(g, {3, 6})}, pad_attrs({-1, 2, 1, -2}, "constant"), "negative pads crop"},
      {{sample_randn(g, {3, 6})}, pad_attrs({-1, 2, 2, -3}, "reflect"), "reflect with crop"},
      {{sample_noncontiguous(g, {4, 3})}, pad_attrs({1, 0, 0, 2}, "replicate"),
       "non-contiguous"},
      {{sample_randn(g, {2, 0})}, pad_attrs({1, 1}, "constant"), "empty dim, constant"},
      {{sample_randn(g, {3})}, pad_attrs({0, 0}, "reflect"), "zero pads"},
  };
}

std::vector<OpSample> samples_copy(Generator& g) {
  return {
      {{sample_randn(g, {3, 4})}, {}, "contiguous"},
      {{sample_noncontiguous(g, {3, 4, 2})}, {}, "transposed"},
      {{sample_gapped(g, {3, 5})}, {}, "gapped"},
      {{sample_broadcast(g, {3, 4}, 1)}, {}, "stride 0"},
      {{sample_randn(g, {})}, {}, "scalar"},
      {{sample_randn(g, {0, 4})}, {}, "empty"},
  };
}

// ---- registration ----------------------------------------------------------------------------
OpDef& define_shape_op(OpId id, const char* doc, InferFn infer, KernelFn kernel, bool is_view,
                       SampleFn samples, std::vector<std::string> onnx) {
  OpDef& d = define_op(id);
  d.doc = doc;
  d.inputs = {{"x"}};
  d.infer = infer;
  d.reference = kernel;
  d.is_view = is_view;
  // Views only move metadata, so the same kernel is right on every device.
  if (is_view) {
    d.eager_cuda = kernel;
    d.eager_cuda_dtypes = all_dtypes();
  }
  d.dtypes = all_dtypes();
  d.samples = samples;
  d.onnx_ops = std::move(onnx);
  return d;
}

}  // namespace

std::optional<Dims> view_strides(const Dims& sizes, const Dims& strides, const Dims& new_sizes) {
  Dims out;
  out.resize(new_sizes.size());
  if (numel(sizes) == 0) return contiguous_strides(new_sizes);  // no element is ever read
  struct Chunk {
    int64_t numel;
    int64_t base_stride;
  };
  Chunk chunks[kMaxRank];
  int num_chunks = 0;  // chunks[0] is the innermost
  for (int d = int(sizes.size()) - 1; d >= 0; --d) {
    if (sizes[d] == 1) continue;
    if (num_chunks > 0) {
      Chunk& c = chunks[num_chunks - 1];
      if (strides[d] == c.base_stride * c.numel) {
        c.numel *= sizes[d];
        continue;
      }
    }
    chunks[num_chunks++] = {sizes[d], strides[d]};
  }
  int nd = int(new_sizes.size()) - 1;
  int64_t next_stride = 1;
  for (int c = 0; c < num_chunks; ++c) {
    int64_t acc = 1;
    while (acc < chunks[c].numel) {
      if (nd < 0) return std::nullopt;
      out[nd] = chunks[c].base_stride * acc;
      acc *= new_sizes[nd];
      --nd;
    }
    if (acc != chunks[c].numel) return std::nullopt;
    next_stride = chunks[c].base_stride * acc;
  }
  for (; nd >= 0; --nd) {
    if (new_sizes[nd] != 1) return std::nullopt;
    out[nd] = next_stride;  // any stride is valid for a size-1 dim
  }
  return out;
}


void register_shape_ops() {
  define_shape_op(OpId::Reshape, "view with a new shape (one -1 inferred); copies when the "
                  "strides do not allow a view", infer_reshape, kernel_reshape, true,
                  samples_reshape, {"Reshape"})
      .attrs = {{"shape", AttrType::Ints, {}}};
  define_shape_op(OpId::Permute, "reorder dims (a view)", infer_permute, kernel_permute, true,
                  samples_permute, {"Transpose"})
      .attrs = {{"dims", AttrType::Ints, {}}};
  define_shape_op(OpId::Transpose, "swap two dims (a view)", infer_transpose, kernel_transpose,
                  true, samples_transpose, {})
      .attrs = {{"dim0", AttrType::Int, {}}, {"dim1", AttrType::Int, {}}};
  define_shape_op(OpId::Expand, "broadcast size-1 dims to a shape with stride 0 (-1 keeps a "
                  "dim; new leading dims allowed)", infer_expand, kernel_expand, true,
                  samples_expand, {"Expand"})
      .attrs = {{"shape", AttrType::Ints, {}}};
  define_shape_op(OpId::Squeeze, "remove size-1 dims (dims empty: all of them)", infer_squeeze,
                  kernel_squeeze, true, samples_squeeze, {"Squeeze"})
      .attrs = {{"dims", AttrType::Ints, Ints{}}};
  define_shape_op(OpId::Unsqueeze, "insert size-1 dims at output positions dims", infer_unsqueeze,
                  kernel_unsqueeze, true, samples_unsqueeze, {"Unsqueeze"})
      .attrs = {{"dims", AttrType::Ints, {}}};
  define_shape_op(OpId::Flatten, "merge dims start_dim..end_dim into one (a view when possible)",
                  infer_flatten, kernel_reshape, true, samples_flatten, {})
      .attrs = {{"start_dim", AttrType::Int, int64_t(0)}, {"end_dim", AttrType::Int, int64_t(-1)}};
  define_shape_op(OpId::Slice, "x[start:end:step] along dim, bounds clamped like Python (a view)",
                  infer_slice, kernel_slice, true, samples_slice, {"Slice"})
      .attrs = {{"dim", AttrType::Int, {}},
                {"start", AttrType::Int, int64_t(0)},
                {"end", AttrType::Int, int64_t(INT64_MAX)},
                {"step", AttrType::Int, int64_t(1)}};

  OpDef& concat = define_shape_op(OpId::Concat, "join tensors along dim", infer_concat,
                                  kernel_concat, false, samples_concat, {"Concat"});
  concat.inputs = {{"inputs", false, true}};
  concat.attrs = {{"dim", AttrType::Int, {}}};

  OpDef& split = define_shape_op(OpId::Split, "cut x along dim into pieces of the given sizes",
                                 infer_split, kernel_split, false, samples_split, {"Split"});
  split.attrs = {{"sizes", AttrType::Ints, {}}, {"dim", AttrType::Int, int64_t(0)}};
  split.num_outputs = -1;
  split.decompose = decompose_split;

  define_shape_op(OpId::Pad, "pad the last n dims (ONNX order [begins..., ends...]; negative "
                  "pads crop); mode constant | reflect | replicate", infer_pad, kernel_pad, false,
                  samples_pad, {"Pad"})
      .attrs = {{"pads", AttrType::Ints, {}},
                {"mode", AttrType::String, std::string("constant")},
                {"value", AttrType::Float, 0.0}};
  define_shape_op(OpId::Copy, "a contiguous copy", infer_copy, kernel_copy, false, samples_copy,
                  {"Identity"});
}

}  // namespace kiln
