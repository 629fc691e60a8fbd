// ONNX shape, layout and indexing ops. Shape-like inputs (Reshape's shape, Slice's starts, ...)
// are read at import time; Shape/Size/ConstantOfShape/Range/EyeLike become constants.
#include <algorithm>
#include <cstring>
#include <cmath>
#include <limits>

#include "frontends/onnx/convert.h"

namespace kiln::onnx {
namespace {

// Bytes of a tensor of `shape` and `dtype`, failing past the import limit (hostile sizes).
void check_size(NodeCtx& c, const Shape& shape, DType dtype, std::string_view what) {
  int64_t n = 1, limit = c.options().max_tensor_bytes / dtype_size(dtype);
  for (SymInt d : shape) {
    if (d.is_symbolic()) continue;
    if (d.value() < 0) c.fail("{} has a negative dim in {}", what, to_string(shape));
    if (d.value() != 0 && n > limit / d.value())
      c.fail("{} of shape {} exceeds the {}-byte tensor limit (ImportOptions::max_tensor_bytes)",
             what, to_string(shape), c.options().max_tensor_bytes);
    n *= d.value();
  }
}

void conv_constant(NodeCtx& c) {
  std::optional<Tensor> t = c.attr_tensor_opt("value");
  if (!t) {
    if (c.has_attr("value_float")) t = Tensor::scalar(c.attr_float("value_float", 0));
    else if (c.has_attr("value_int"))
      t = Tensor::full(Dims{}, double(c.attr_int("value_int", 0)), DType::Int64);
    else if (c.has_attr("value_floats")) {
      std::vector<float> v;
      for (double x : c.attr_floats("value_floats")) v.push_back(float(x));
      t = Tensor::from_vector(v, Dims{int64_t(v.size())});
    } else if (c.has_attr("value_ints")) {
      std::vector<int64_t> v = c.attr_ints("value_ints");
      t = Tensor::from_vector(v, Dims{int64_t(v.size())});
    } else if (c.has_attr("sparse_value")) {
      c.not_supported("sparse constants are not supported");
    } else if (c.has_attr("value_string") || c.has_attr("value_strings")) {
      c.not_supported("string constants are not supported (Kiln has no string type)");
    } else {
      c.fail("has no value attribute");
    }
  }
  c.out(0, c.constant(*t));
}

// ---- shape queries (folded) --------------------------------------------------------------------

void conv_shape(NodeCtx& c) {
  V x = c.in(0);
  int r = c.rank(x);
  int64_t start = c.attr_int("start", 0), end = c.attr_int("end", r);
  auto clampi = [&](int64_t v) { return std::clamp(v < 0 ? v + r : v, int64_t(0), int64_t(r)); };
  start = clampi(start);
  end = clampi(end);
  Shape d = c.shape(x);
  std::vector<SymInt> v;
  for (int64_t i = start; i < end; ++i) v.push_back(d[size_t(i)]);
  c.out(0, c.sym_value(v, false));  // symbolic dims stay symbolic: see Note [Symbolic shape values]
}

void conv_size(NodeCtx& c) { c.out(0, c.sym_value({numel(c.shape(c.in(0)))}, true)); }

void conv_constant_of_shape(NodeCtx& c) {
  std::vector<SymInt> dims = c.shape_input(0, "shape");
  Tensor value = Tensor::scalar(0.0f);
  if (auto t = c.attr_tensor_opt("value")) {
    if (t->numel() != 1) c.fail("value must hold one element, got {}", t->numel());
    value = *t;
  }
  if (dims.size() > size_t(kMaxRank)) c.not_supported("rank {} (at most {})", dims.size(), kMaxRank);
  Shape s(dims.begin(), dims.end());
  check_size(c, s, value.dtype(), "the output");
  c.out(0, c.full(s, value.to_vector<double>()[0], value.dtype()));
}

void conv_range(NodeCtx& c) {
  Tensor start = c.known_input(0, "start"), limit = c.known_input(1, "limit"),
         delta = c.known_input(2, "delta");
  for (const Tensor* t : {&start, &limit, &delta})
    if (t->numel() != 1) c.fail("start, limit and delta must be scalars");
  DType dt = start.dtype();
  double s = start.item(), l = limit.item(), d = delta.item();
  if (d == 0) c.fail("delta must be nonzero");
  double count = std::ceil((l - s) / d);
  if (!std::isfinite(count)) c.fail("the range [{}, {}) by {} is not finite", s, l, d);
  int64_t n = std::max<int64_t>(int64_t(std::max(count, 0.0)), 0);
  check_size(c, Shape{SymInt(n)}, dt, "the output");
  Tensor out = Tensor::empty(Dims{n}, dt);
  if (is_floating(dt)) {
    for (int64_t i = 0; i < n; ++i) store_f64(static_cast<char*>(out.raw_data()) + i * out.element_size(), dt, s + double(i) * d);
  } else {
    int64_t si = start.to_vector<int64_t>()[0], di = delta.to_vector<int64_t>()[0];
    for (int64_t i = 0; i < n; ++i) store_i64(static_cast<char*>(out.raw_data()) + i * out.element_size(), dt, si + i * di);
  }
  c.out(0, c.constant(out));
}

void conv_eye_like(NodeCtx& c) {
  V x = c.in(0);
  if (c.rank(x) != 2) c.fail("input must be 2-D, got rank {}", c.rank(x));
  Dims d = c.dims(x, "the input");
  DType dt = c.dtype(x);
  if (auto to = c.attr_int_opt("dtype"))
    if (!dtype_from_onnx(int32_t(*to), &dt))
      c.not_supported("dtype {} is not supported by Kiln", onnx_type_name(int32_t(*to)));
  int64_t k = c.attr_int("k", 0);
  check_size(c, to_shape(d), dt, "the output");
  Tensor out = Tensor::zeros(d, dt);
  for (int64_t i = 0; i < d[0]; ++i) {
    int64_t j = i + k;
    if (j >= 0 && j < d[1])
      store_f64(static_cast<char*>(out.raw_data()) + (i * d[1] + j) * out.element_size(), dt, 1);
  }
  c.out(0, c.constant(out));
}

// ---- layout ------------------------------------------------------------------------------------

void conv_reshape(NodeCtx& c) {
  V x = c.in(0);
  std::vector<SymInt> target;
  if (c.opset() < 5)
    for (int64_t v : c.attr_ints("shape")) target.push_back(SymInt(v));
  else
    target = c.shape_input(1, "shape");
  bool allowzero = c.attr_int("allowzero", 0) != 0;
  if (c.opset() < 5) c.ignore_attr("consumed_inputs");
  if (target.size() > size_t(kMaxRank)) c.not_supported("rank {} (at most {})", target.size(), kMaxRank);
  Shape given(target.begin(), target.end()), s;
  int minus = 0;
  for (size_t i = 0; i < target.size(); ++i) {
    SymInt v = target[i];
    if (v == SymInt(0) && !allowzero) {
      if (int(i) >= c.rank(x)) c.fail("shape {} copies dim {} (0), but the input has rank {}",
                                      to_string(given), i, c.rank(x));
      s.push_back(c.shape(x)[i]);
    } else if (v == SymInt(-1)) {
      ++minus;
      s.push_back(SymInt(-1));
    } else if (v.is_concrete() && v.value() < 0) {
      c.fail("shape {} has an invalid size {}", to_string(given), v.value());
    } else {
      s.push_back(v);
    }
  }
  if (minus > 1) c.fail("shape {} has more than one -1", to_string(given));
  c.out(0, c.reshape(x, s));
}

void conv_flatten(NodeCtx& c) {
  V x = c.in(0);
  int r = c.rank(x);
  int64_t a = c.attr_int("axis", 1);
  if (a < -r || a > r) c.fail("axis {} is out of range for rank {}", a, r);
  if (a < 0) a += r;
  if (a == 1 && r >= 2) {  // [N, rest...] -> [N, prod(rest)]: Kiln's flatten
    c.out(0, c.op1(OpId::Flatten, {x}, {{"start_dim", int64_t(1)}, {"end_dim", int64_t(-1)}}));
    return;
  }
  SymInt outer = 1, inner = 1;
  for (int i = 0; i < r; ++i) (i < a ? outer : inner) *= c.shape(x)[size_t(i)];
  c.out(0, c.reshape(x, Shape{outer, inner}));
}

void conv_transpose(NodeCtx& c) {
  V x = c.in(0);
  int r = c.rank(x);
  std::vector<int64_t> perm = c.attr_ints("perm");
  if (perm.empty())
    for (int i = r - 1; i >= 0; --i) perm.push_back(i);
  if (int(perm.size()) != r) c.fail("perm has {} entries for a rank-{} input", perm.size(), r);
  for (int64_t& p : perm) p = c.axis(p, r, "perm entry");
  c.out(0, c.permute(x, perm));
}

std::vector<int64_t> axes_of(NodeCtx& c, size_t input, int opset_input_since, bool* given) {
  if (c.opset() >= opset_input_since) {
    *given = c.has_input(input);
    return *given ? c.ints_input(input, "axes") : std::vector<int64_t>{};
  }
  *given = c.has_attr("axes");
  return c.attr_ints("axes");
}

void conv_squeeze(NodeCtx& c) {
  V x = c.in(0);
  bool given;
  std::vector<int64_t> axes = axes_of(c, 1, 13, &given);
  for (int64_t& a : axes) {
    a = c.axis(a, c.rank(x), "axis");
    if (c.shape(x)[size_t(a)] != SymInt(1))
      c.fail("cannot squeeze dim {} of size {} (input shape {})", a,
             c.shape(x)[size_t(a)].str(), to_string(c.shape(x)));
  }
  if (!given) {  // all size-1 dims; a symbolic dim might be 1 at run time: refuse to guess
    for (SymInt d : c.shape(x))
      if (d.is_symbolic())
        c.not_supported("squeeze without axes over symbolic shape {}", to_string(c.shape(x)));
  }
  c.out(0, c.squeeze(x, axes));
}

void conv_unsqueeze(NodeCtx& c) {
  V x = c.in(0);
  bool given;
  std::vector<int64_t> axes = axes_of(c, 1, 13, &given);
  if (!given) c.fail("axes are required");
  int out_rank = c.rank(x) + int(axes.size());
  for (int64_t& a : axes) a = c.axis(a, out_rank, "axis");
  std::sort(axes.begin(), axes.end());
  for (size_t i = 1; i < axes.size(); ++i)
    if (axes[i] == axes[i - 1]) c.fail("axis {} appears twice", axes[i]);
  c.out(0, c.unsqueeze(x, axes));
}

void conv_concat(NodeCtx& c) {
  std::vector<V> xs;
  for (size_t i = 0; i < c.num_inputs(); ++i)
    if (c.has_input(i)) xs.push_back(c.in(i));
  if (xs.empty()) c.fail("needs at least one input");
  int64_t a = c.attr_int("axis", c.opset() < 4 ? 1 : 0);
  if (c.opset() >= 4 && !c.has_attr("axis")) c.fail("attribute 'axis' is required");
  a = c.axis(a, c.rank(xs[0]), "axis");
  if (xs.size() == 1) {
    c.out(0, xs[0]);
    return;
  }
  c.out(0, c.op1(OpId::Concat, xs, {{"dim", a}}));
}

void conv_split(NodeCtx& c) {
  V x = c.in(0);
  int64_t a = c.axis(c.attr_int("axis", 0), c.rank(x), "axis");
  std::vector<int64_t> sizes;
  if (c.opset() < 13) {
    sizes = c.attr_ints("split");
    if (c.opset() < 2 && c.has_input(1)) sizes = c.ints_input(1, "split");
  } else if (c.has_input(1)) {
    sizes = c.ints_input(1, "split");
  }
  size_t n = c.num_outputs();
  // Opset 18: num_outputs parts of ceil(d / n), the last one smaller when d does not divide.
  std::optional<int64_t> num_outputs = c.opset() >= 18 ? c.attr_int_opt("num_outputs") : std::nullopt;
  if (num_outputs && !sizes.empty()) c.fail("takes either the 'split' input or num_outputs, not both");
  if (num_outputs && *num_outputs != int64_t(n))
    c.fail("num_outputs is {} but the node has {} outputs", *num_outputs, n);
  if (sizes.empty()) {
    SymInt d = c.shape(x)[size_t(a)];
    if (d.is_symbolic()) c.not_supported("equal split of symbolic dim {}", d.str());
    if (n == 0) c.fail("has no outputs");
    if (num_outputs) {
      int64_t chunk = (d.value() + int64_t(n) - 1) / int64_t(n);
      if (chunk * (int64_t(n) - 1) > d.value())
        c.fail("dim {} of size {} does not split into {} parts of {}", a, d.value(), n, chunk);
      sizes.assign(n, chunk);
      sizes.back() = d.value() - chunk * (int64_t(n) - 1);
    } else {
      if (d.value() % int64_t(n) != 0)
        c.fail("dim {} of size {} does not split into {} equal parts", a, d.value(), n);
      sizes.assign(n, d.value() / int64_t(n));
    }
  }
  if (sizes.size() != n)
    c.fail("split has {} sizes for {} outputs", sizes.size(), n);
  std::vector<V> outs = c.op(OpId::Split, {x}, {{"sizes", Ints(sizes)}, {"dim", a}});
  for (size_t i = 0; i < outs.size(); ++i) c.out(i, outs[i]);
}

// ONNX slice bounds: clamped like Python for positive steps; for negative steps start is
// clamped to [0, d-1] and end to [-1, d-1].
void conv_slice(NodeCtx& c) {
  V x = c.in(0);
  int r = c.rank(x);
  std::vector<int64_t> starts, ends, axes, steps;
  if (c.opset() < 10) {
    starts = c.attr_ints("starts");
    ends = c.attr_ints("ends");
    axes = c.attr_ints("axes");
  } else {
    starts = c.ints_input(1, "starts", /*saturate=*/true);  // INT64_MIN: "from the very end"
    ends = c.ints_input(2, "ends", /*saturate=*/true);
    if (c.has_input(3)) axes = c.ints_input(3, "axes");
    if (c.has_input(4)) steps = c.ints_input(4, "steps");
  }
  if (ends.size() != starts.size())
    c.fail("starts has {} entries, ends {}", starts.size(), ends.size());
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(int64_t(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (axes.size() != starts.size() || steps.size() != starts.size())
    c.fail("starts, ends, axes and steps must have the same length");
  std::vector<bool> seen(size_t(r), false);
  constexpr int64_t kBig = int64_t(1) << 60;  // beyond any dim; stays a concrete SymInt
  V y = x;
  for (size_t i = 0; i < starts.size(); ++i) {
    int64_t a = c.axis(axes[i], r, "axis");
    if (seen[size_t(a)]) c.fail("axis {} appears twice", axes[i]);
    seen[size_t(a)] = true;
    int64_t st = std::clamp(starts[i], -kBig, kBig), en = std::clamp(ends[i], -kBig, kBig);
    int64_t step = steps[i];
    if (step == 0) c.fail("step 0 on axis {}", a);
    if (step > 0) {
      y = c.slice(y, a, st, en, step);
      continue;
    }
    // Negative steps: the indices, gathered with index_select.
    int64_t d = c.dims(y, "the input (negative slice step)")[size_t(a)];
    if (st < 0) st += d;
    if (en < 0) en += d;
    st = std::clamp(st, int64_t(0), d - 1);
    en = std::clamp(en, int64_t(-1), d - 1);
    std::vector<int64_t> idx;
    for (int64_t k = st; k > en; k += step) idx.push_back(k);
    y = c.op1(OpId::IndexSelect, {y, c.constant(Tensor::from_vector(idx, Dims{int64_t(idx.size())}))},
              {{"dim", a}});
  }
  c.out(0, y);
}

// ---- indexing ----------------------------------------------------------------------------------

void conv_gather(NodeCtx& c) {
  V x = c.in(0), idx = c.in(1);
  int r = c.rank(x);
  if (r == 0) c.fail("data must have rank >= 1");
  int64_t a = c.axis(c.attr_int("axis", 0), r, "axis");
  if (!is_integral(c.dtype(idx))) c.fail("indices must be integers, got {}", dtype_name(c.dtype(idx)));
  int ri = c.rank(idx);
  // One index known at import time (torch's `qkv[1]`, `x[:, 0]`: an initializer or a constant)
  // is a slice: a view the compiler folds into its consumers' loads, where an index_select was a
  // copy kernel per use (Swin-V2's 24 of them, 0.3-1.2 ms each at one thread). Checked here as
  // ONNX requires: an index outside [-n, n) is an error naming the node.
  // (Data known itself, or shape arithmetic on symbolic dims, folds through the general path.)
  const Tensor* known = c.known(idx);
  const SymInt n = c.shape(x)[size_t(a)];
  if (known && known->numel() == 1 && !n.is_symbolic() && !c.known(x) && !c.sym_values(x)) {
    int64_t k = int64_t(known->item());
    if (k < -n.value() || k >= n.value())
      c.fail("index {} is out of range for axis {} of size {} (valid range [{}, {}))", k, a,
             n.value(), -n.value(), n.value());
    if (k < 0) k += n.value();
    V s = c.slice(x, a, k, k + 1);
    if (ri == 1) {
      c.out(0, s);
      return;
    }
    Shape out;
    for (int i = 0; i < a; ++i) out.push_back(c.shape(x)[size_t(i)]);
    for (SymInt d : c.shape(idx)) out.push_back(d);
    for (int i = int(a) + 1; i < r; ++i) out.push_back(c.shape(x)[size_t(i)]);
    c.out(0, ri == 0 ? c.squeeze(s, {a}) : c.reshape(s, out));
    return;
  }
  if (r == 2 && a == 0 && ri >= 1) {  // an embedding lookup (nn.Embedding exports this)
    c.out(0, c.op1(OpId::Embedding, {x, idx}));
    return;
  }
  if (ri == 1) {
    c.out(0, c.op1(OpId::IndexSelect, {x, idx}, {{"dim", a}}));
    return;
  }
  V flat = c.reshape(idx, Shape{SymInt(-1)});
  V y = c.op1(OpId::IndexSelect, {x, flat}, {{"dim", a}});
  Shape out;
  for (int i = 0; i < a; ++i) out.push_back(c.shape(x)[size_t(i)]);
  for (SymInt d : c.shape(idx)) out.push_back(d);
  for (int i = int(a) + 1; i < r; ++i) out.push_back(c.shape(x)[size_t(i)]);
  c.out(0, c.reshape(y, out));
}

void conv_gather_elements(NodeCtx& c) {
  V x = c.in(0), idx = c.in(1);
  int64_t a = c.axis(c.attr_int("axis", 0), c.rank(x), "axis");
  c.out(0, c.op1(OpId::Gather, {x, idx}, {{"dim", a}}));
}

// Linear row indices into x viewed as [batch..., prod(d_0..d_{k-1}), rest...] for GatherND /
// ScatterND: indices [..., k] -> [...] int64, negative entries wrapped per dim.
V linear_index(NodeCtx& c, V idx, const Dims& index_dims) {
  int ri = c.rank(idx);
  int64_t k = int64_t(index_dims.size());
  V lin = kNone;
  int64_t stride = 1;
  for (int64_t j = k - 1; j >= 0; --j) {
    V comp = c.squeeze(c.slice(idx, ri - 1, j, j + 1), {ri - 1});
    comp = c.cast(comp, DType::Int64);
    V d = c.scalar(double(index_dims[size_t(j)]), DType::Int64);
    V neg = c.op1(OpId::Lt, {comp, c.scalar(0, DType::Int64)});
    comp = c.op1(OpId::Where, {neg, c.add(comp, d), comp});
    V term = stride == 1 ? comp : c.mul(comp, c.scalar(double(stride), DType::Int64));
    lin = lin == kNone ? term : c.add(lin, term);
    stride *= index_dims[size_t(j)];
  }
  if (lin == kNone) {  // k = 0: every index selects the whole tensor
    Shape s = c.shape(idx);
    s.pop_back();
    lin = c.full(s, 0, DType::Int64);
  }
  return lin;
}

void conv_gather_nd(NodeCtx& c) {
  V x = c.in(0), idx = c.in(1);
  int64_t b = c.attr_int("batch_dims", 0);
  Dims xd = c.dims(x, "data"), id = c.dims(idx, "indices");
  int r = int(xd.size()), q = int(id.size());
  if (q < 1) c.fail("indices must have rank >= 1");
  int64_t k = id[size_t(q - 1)];
  if (b < 0 || b >= std::min(r, q)) c.fail("batch_dims {} is out of range", b);
  if (k < 0 || b + k > r) c.fail("index depth {} with batch_dims {} exceeds data rank {}", k, b, r);
  for (int64_t i = 0; i < b; ++i)
    if (xd[size_t(i)] != id[size_t(i)]) c.fail("batch dim {} differs: data {}, indices {}", i, xd[size_t(i)], id[size_t(i)]);
  Dims index_dims, rest;
  int64_t batch = 1, rows = 1, rest_n = 1;
  for (int64_t i = 0; i < b; ++i) batch *= xd[size_t(i)];
  for (int64_t i = b; i < b + k; ++i) index_dims.push_back(xd[size_t(i)]), rows *= xd[size_t(i)];
  for (int64_t i = b + k; i < r; ++i) rest.push_back(xd[size_t(i)]), rest_n *= xd[size_t(i)];
  if (c.known(idx) && c.known(x)) {
    // Known data and indices (folding, or a data-dependent tail at run time): the rows are
    // copied on the host, each index checked.
    const Tensor xt = c.known(x)->contiguous();
    const std::vector<int64_t> iv = c.known(idx)->to_vector<int64_t>();
    const int64_t m = k > 0 ? int64_t(iv.size()) / k : [&] {
      int64_t n = 1;
      for (int i = 0; i < q - 1; ++i) n *= id[size_t(i)];
      return n;
    }();
    const int64_t per_batch = m / std::max<int64_t>(batch, 1);
    const int64_t limit = c.options().max_tensor_bytes;
    const int64_t row_size = rest_n * int64_t(dtype_size(xt.dtype()));
    if (row_size > 0 && m > limit / row_size)
      c.fail("{} rows of {} bytes would exceed the {}-byte tensor limit "
             "(ImportOptions::max_tensor_bytes)", m, row_size, limit);
    Dims od;
    for (int i = 0; i < q - 1; ++i) od.push_back(id[size_t(i)]);
    for (int64_t d : rest) od.push_back(d);
    Tensor out = Tensor::empty(od, xt.dtype());
    const size_t row_bytes = size_t(rest_n) * size_t(dtype_size(xt.dtype()));
    const char* src = static_cast<const char*>(xt.raw_data());
    char* dst = static_cast<char*>(out.raw_data());
    for (int64_t e = 0; e < m; ++e) {
      int64_t row = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t v = iv[size_t(e * k + j)], n = index_dims[size_t(j)];
        if (v < -n || v >= n) c.fail("index {} is out of range for a dim of size {}", v, n);
        row = row * n + (v < 0 ? v + n : v);
      }
      row += (per_batch > 0 ? e / per_batch : 0) * rows;
      if (row_bytes) std::memcpy(dst + size_t(e) * row_bytes, src + size_t(row) * row_bytes, row_bytes);
    }
    c.out(0, c.constant(out));
    return;
  }
  V lin = linear_index(c, idx, index_dims);  // [batch..., m...]
  if (b > 0) {
    // Row offset of each batch element: lin + batch_index * rows.
    Dims bshape;
    for (int64_t i = 0; i < b; ++i) bshape.push_back(id[size_t(i)]);
    for (int i = int(b); i < q - 1; ++i) bshape.push_back(1);
    std::vector<int64_t> off(static_cast<size_t>(batch));
    for (int64_t i = 0; i < batch; ++i) off[size_t(i)] = i * rows;
    lin = c.add(lin, c.constant(Tensor::from_vector(off, bshape)));
  }
  V xf = c.reshape(x, Shape{SymInt(batch * rows), SymInt(rest_n)});
  V y = c.op1(OpId::IndexSelect, {xf, c.reshape(lin, Shape{SymInt(-1)})}, {{"dim", int64_t(0)}});
  Shape out;
  for (int i = 0; i < q - 1; ++i) out.push_back(id[size_t(i)]);
  for (int64_t d : rest) out.push_back(d);
  c.out(0, c.reshape(y, out));
}

// Product of the updates landing on each position (ScatterElements/ScatterND reduction "mul"),
// through sums: |prod| = exp(sum log|u|), sign from the parity of the negative count. In
// float64; integer results are rounded back.
V scatter_multiply(NodeCtx& c, V x, V index, V updates, int64_t dim) {
  DType dt = c.dtype(x);
  V u = c.cast(updates, DType::Float64);
  V zeros = c.full(c.shape(x), 0, DType::Float64);
  V logs = c.op1(OpId::Log, {c.op1(OpId::Abs, {u})});
  V sum_log = c.op1(OpId::ScatterAdd, {zeros, index, logs}, {{"dim", dim}});
  V negs = c.cast(c.op1(OpId::Lt, {u, c.scalar(0, DType::Float64)}), DType::Float64);
  V count = c.op1(OpId::ScatterAdd, {zeros, index, negs}, {{"dim", dim}});
  V half = c.op1(OpId::Floor, {c.mul(count, c.scalar(0.5, DType::Float64))});
  V odd = c.sub(count, c.mul(half, c.scalar(2, DType::Float64)));
  V sign = c.sub(c.scalar(1, DType::Float64), c.mul(odd, c.scalar(2, DType::Float64)));
  V prod = c.mul(c.op1(OpId::Exp, {sum_log}), sign);
  V y = c.mul(c.cast(x, DType::Float64), prod);
  if (!is_floating(dt)) y = c.op1(OpId::Round, {y});
  return c.cast(y, dt);
}

// Largest [positions x updates] match matrix scatter_extreme builds (elements).
constexpr int64_t kMaxScatterMatch = int64_t(1) << 24;

// Reduction "max"/"min" (opset 18): every position p of x takes max(x[p], updates landing on p)
// (min alike). Kiln has no scatter-max, so the updates' flat target positions are compared with
// every position: a [positions, updates] match matrix, reduced along the updates (exact, but
// quadratic: limited to kMaxScatterMatch elements).
V scatter_extreme(NodeCtx& c, V x, V index, V updates, int64_t dim, bool is_max) {
  Dims xd = c.dims(x, "data"), id = c.dims(index, "indices");
  int r = int(xd.size());
  int64_t nx = numel(xd), nu = numel(id);
  if (nx != 0 && nu > kMaxScatterMatch / nx)
    c.not_supported("reduction \"{}\" over {} positions and {} updates (the composition compares "
                    "them pairwise; at most {} pairs)", is_max ? "max" : "min", nx, nu,
                    kMaxScatterMatch);
  // Flat target of each update: its own coordinates, with index along dim (wrapped).
  Dims stride(size_t(r), 1);
  for (int d = r - 2; d >= 0; --d) stride[size_t(d)] = stride[size_t(d + 1)] * xd[size_t(d + 1)];
  std::vector<int64_t> base(static_cast<size_t>(nu));
  for (int64_t e = 0; e < nu; ++e) {
    int64_t rem = e, off = 0;
    for (int d = r - 1; d >= 0; --d) {
      int64_t coord = rem % id[size_t(d)];
      rem /= id[size_t(d)];
      if (d != dim) off += coord * stride[size_t(d)];
    }
    base[size_t(e)] = off;
  }
  V i64 = c.cast(index, DType::Int64);
  V size = c.scalar(double(xd[size_t(dim)]), DType::Int64);
  i64 = c.op1(OpId::Where, {c.op1(OpId::Lt, {i64, c.scalar(0, DType::Int64)}), c.add(i64, size), i64});
  V lin = c.add(c.mul(i64, c.scalar(double(stride[size_t(dim)]), DType::Int64)),
                c.constant(Tensor::from_vector(base, id)));
  lin = c.reshape(lin, Shape{SymInt(1), SymInt(nu)});
  V pos = c.reshape(c.constant(Tensor::arange(nx)), Shape{SymInt(nx), SymInt(1)});
  V match = c.op1(OpId::Eq, {lin, pos});  // [nx, nu]
  DType dt = c.dtype(x);
  double fill = is_floating(dt) ? (is_max ? -INFINITY : INFINITY)
                                : (is_max ? -std::ldexp(1.0, 62) : std::ldexp(1.0, 62));
  if (dt == DType::Bool) fill = is_max ? 0 : 1;
  V cand = c.op1(OpId::Where, {match, c.reshape(updates, Shape{SymInt(1), SymInt(nu)}),
                               c.scalar(fill, dt)});
  V best = c.op1(is_max ? OpId::Max : OpId::Min, {cand}, {{"dims", Ints{1}}, {"keepdim", false}});
  V hit = c.op1(OpId::Gt, {c.op1(OpId::Sum, {c.cast(match, DType::Int64)},
                                 {{"dims", Ints{1}}, {"keepdim", false}}),
                           c.scalar(0, DType::Int64)});
  V xf = c.reshape(x, Shape{SymInt(nx)});
  V merged = c.op1(is_max ? OpId::Maximum : OpId::Minimum, {xf, best});
  return c.reshape(c.op1(OpId::Where, {hit, merged, xf}), c.shape(x));
}

// out = x with updates written (none), added (add), multiplied (mul) or max/min-ed (opset 18) at
// index along dim.
V scatter(NodeCtx& c, V x, V index, V updates, int64_t dim, const std::string& reduction) {
  if (reduction == "add") return c.op1(OpId::ScatterAdd, {x, index, updates}, {{"dim", dim}});
  if ((reduction == "max" || reduction == "min") && c.opset() >= 18)
    return scatter_extreme(c, x, index, updates, dim, reduction == "max");
  V ones = c.full(c.shape(updates), 1, DType::Int64);
  V hits = c.op1(OpId::ScatterAdd, {c.full(c.shape(x), 0, DType::Int64), index, ones},
                 {{"dim", dim}});
  V hit = c.op1(OpId::Gt, {hits, c.scalar(0, DType::Int64)});
  if (reduction == "mul")
    return c.op1(OpId::Where, {hit, scatter_multiply(c, x, index, updates, dim), x});
  if (reduction != "none")
    c.not_supported("reduction \"{}\" is not supported (none, add, mul; max and min from opset "
                    "18)", reduction);
  // Duplicate indices with reduction "none" are undefined in ONNX; here they add up.
  V vals = c.op1(OpId::ScatterAdd, {c.full(c.shape(x), 0, c.dtype(x)), index, updates},
                 {{"dim", dim}});
  return c.op1(OpId::Where, {hit, vals, x});
}

void conv_scatter_elements(NodeCtx& c) {
  V x = c.in(0), idx = c.in(1), upd = c.in(2);
  int64_t a = c.axis(c.attr_int("axis", 0), c.rank(x), "axis");
  std::string reduction = c.attr_string("reduction", "none");
  if (c.shape(idx) != c.shape(upd))
    c.fail("indices {} and updates {} must have the same shape", to_string(c.shape(idx)),
           to_string(c.shape(upd)));
  c.out(0, scatter(c, x, idx, upd, a, reduction));
}

void conv_scatter_nd(NodeCtx& c) {
  V x = c.in(0), idx = c.in(1), upd = c.in(2);
  std::string reduction = c.attr_string("reduction", "none");
  Dims xd = c.dims(x, "data"), id = c.dims(idx, "indices");
  int r = int(xd.size()), q = int(id.size());
  if (q < 1) c.fail("indices must have rank >= 1");
  int64_t k = id[size_t(q - 1)];
  if (k < 1 || k > r) c.fail("index depth {} is out of range for data rank {}", k, r);
  Dims index_dims;
  int64_t rows = 1, rest_n = 1, m = 1;
  for (int64_t i = 0; i < k; ++i) index_dims.push_back(xd[size_t(i)]), rows *= xd[size_t(i)];
  for (int64_t i = k; i < r; ++i) rest_n *= xd[size_t(i)];
  for (int i = 0; i < q - 1; ++i) m *= id[size_t(i)];
  V lin = c.reshape(linear_index(c, idx, index_dims), Shape{SymInt(m), SymInt(1)});
  V index = c.op1(OpId::Expand, {lin}, {{"shape", Ints{m, rest_n}}});
  V xf = c.reshape(x, Shape{SymInt(rows), SymInt(rest_n)});
  V uf = c.reshape(upd, Shape{SymInt(m), SymInt(rest_n)});
  V y = scatter(c, xf, index, uf, 0, reduction);
  c.out(0, c.reshape(y, c.shape(x)));
}

// ---- broadcasting, tiling, padding -------------------------------------------------------------

void conv_expand(NodeCtx& c) {
  V x = c.in(0);
  std::vector<SymInt> t = c.shape_input(1, "shape");
  if (t.size() > size_t(kMaxRank)) c.not_supported("rank {} (at most {})", t.size(), kMaxRank);
  Shape target(t.begin(), t.end());
  Shape out = broadcast_shapes(c.shape(x), target);  // Expand broadcasts both ways
  check_size(c, out, c.dtype(x), "the output");
  Ints raw;
  for (SymInt d : out) raw.push_back(d.raw());
  c.out(0, c.op1(OpId::Expand, {x}, {{"shape", raw}}));
}

void conv_tile(NodeCtx& c) {
  V x = c.in(0);
  std::vector<int64_t> reps = c.ints_input(1, "repeats");
  int r = c.rank(x);
  if (int(reps.size()) != r) c.fail("repeats has {} entries for a rank-{} input", reps.size(), r);
  V y = x;
  for (int i = 0; i < r; ++i) {
    if (reps[size_t(i)] < 0) c.fail("repeats must be >= 0, got {}", reps[size_t(i)]);
    if (reps[size_t(i)] == 1) continue;
    // [.., d, ..] -> [.., 1, d, ..] -> [.., reps, d, ..] -> [.., reps*d, ..]
    Shape s = c.shape(y);
    V u = c.unsqueeze(y, {i});
    Shape e = c.shape(u);
    e[size_t(i)] = SymInt(reps[size_t(i)]);
    check_size(c, e, c.dtype(x), "the output");
    Ints raw;
    for (SymInt d : e) raw.push_back(d.raw());
    V ex = c.op1(OpId::Expand, {u}, {{"shape", raw}});
    s[size_t(i)] = s[size_t(i)] * SymInt(reps[size_t(i)]);
    y = c.reshape(ex, s);
  }
  c.out(0, y);
}

void conv_pad(NodeCtx& c) {
  V x = c.in(0);
  int r = c.rank(x);
  std::string mode = c.attr_string("mode", "constant");
  std::vector<int64_t> pads;
  double value = 0;
  if (c.opset() < 11) {
    pads = c.attr_ints(c.opset() < 2 ? "paddings" : "pads");
    value = c.attr_float("value", 0.0);
  } else {
    pads = c.ints_input(1, "pads");
    if (c.has_input(2)) {
      Tensor v = c.known_input(2, "constant_value");
      if (v.numel() != 1) c.fail("constant_value must be a scalar");
      value = v.to_vector<double>()[0];
    }
    // Opset 18: `axes` names the dims that pads covers ([begins..., ends...] over axes).
    if (c.opset() < 18 && c.has_input(3)) c.fail("input 3 (axes) needs opset 18, the model imports {}", c.opset());
    if (c.opset() >= 18 && c.has_input(3)) {
      std::vector<int64_t> axes = c.ints_input(3, "axes");
      if (pads.size() != 2 * axes.size())
        c.fail("pads has {} entries for {} axes (need {})", pads.size(), axes.size(), 2 * axes.size());
      std::vector<int64_t> full(size_t(2 * r), 0);
      std::vector<bool> seen(size_t(r), false);
      for (size_t k = 0; k < axes.size(); ++k) {
        int64_t a = c.axis(axes[k], r, "axis");
        if (seen[size_t(a)]) c.fail("axis {} appears twice in axes", axes[k]);
        seen[size_t(a)] = true;
        full[size_t(a)] = pads[k];
        full[size_t(a + r)] = pads[k + axes.size()];
      }
      pads = full;
    }
  }
  if (int(pads.size()) != 2 * r) c.fail("pads has {} entries for a rank-{} input (need {})", pads.size(), r, 2 * r);
  bool all_zero = std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; });
  if (all_zero) {
    c.out(0, x);
    return;
  }
  if (mode == "wrap" && c.opset() >= 19) {
    // Wrap-around (a torus): per padded dim, index_select of (i - begin) mod size.
    V y = x;
    for (int d = 0; d < r; ++d) {
      int64_t b = pads[size_t(d)], e = pads[size_t(d + r)];
      if (b == 0 && e == 0) continue;
      int64_t size = c.dims(x, "the input (wrap padding)")[size_t(d)];
      int64_t len = size + b + e;
      if (len < 0) c.fail("pads crop dim {} of size {} to a negative size", d, size);
      if (size == 0 && len > 0) c.fail("wrap padding of dim {} needs a non-empty dim", d);
      check_size(c, Shape{SymInt(len)}, DType::Int64, "the wrap indices");
      std::vector<int64_t> idx(static_cast<size_t>(len));
      for (int64_t i = 0; i < len; ++i) idx[size_t(i)] = (((i - b) % size) + size) % size;
      y = c.op1(OpId::IndexSelect, {y, c.constant(Tensor::from_vector(idx, Dims{len}))},
                {{"dim", int64_t(d)}});
    }
    c.out(0, y);
    return;
  }
  std::string kmode;
  if (mode == "constant") kmode = "constant";
  else if (mode == "reflect") kmode = "reflect";
  else if (mode == "edge") kmode = "replicate";
  else c.not_supported("mode \"{}\" is not supported (constant, reflect, edge; wrap from opset 19)", mode);
  c.out(0, c.op1(OpId::Pad, {x}, {{"pads", Ints(pads)}, {"mode", kmode}, {"value", value}}));
}

// ---- masks and one-hot -------------------------------------------------------------------------

void conv_trilu(NodeCtx& c) {
  V x = c.in(0);
  int r = c.rank(x);
  if (r < 2) c.fail("input must have rank >= 2, got {}", r);
  int64_t k = 0;
  if (c.has_input(1)) {
    Tensor kt = c.known_input(1, "k");
    if (kt.numel() != 1) c.fail("k must be a scalar");
    k = kt.to_vector<int64_t>()[0];
  }
  bool upper = c.attr_int("upper", 1) != 0;
  Dims d = c.dims(x, "the input");
  int64_t n = d[size_t(r - 2)], m = d[size_t(r - 1)];
  Tensor mask = Tensor::empty(Dims{n, m}, DType::Bool);
  bool* p = mask.data<bool>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) p[i * m + j] = upper ? j - i >= k : j - i <= k;
  c.out(0, c.op1(OpId::Where, {c.constant(mask), x, c.scalar(0, c.dtype(x))}));
}

void conv_one_hot(NodeCtx& c) {
  V idx = c.in(0), values = c.in(2);
  Tensor depth_t = c.known_input(1, "depth");
  if (depth_t.numel() != 1) c.fail("depth must be a scalar");
  int64_t depth = int64_t(depth_t.to_vector<double>()[0]);
  if (depth < 1) c.fail("depth must be >= 1, got {}", depth);
  if (numel(c.shape(values)) != SymInt(2)) c.fail("values must hold [off, on]");
  int r = c.rank(idx);
  int64_t a = c.attr_int("axis", -1);
  if (a < -(r + 1) || a > r) c.fail("axis {} is out of range for output rank {}", a, r + 1);
  if (a < 0) a += r + 1;
  V i64 = c.cast(idx, DType::Int64);  // float indices truncate, as the spec's cast does
  V d = c.scalar(double(depth), DType::Int64);
  V neg = c.op1(OpId::Lt, {i64, c.scalar(0, DType::Int64)});
  i64 = c.op1(OpId::Where, {neg, c.add(i64, d), i64});
  Dims rs(size_t(r + 1), 1);
  rs[size_t(a)] = depth;
  V range = c.constant(Tensor::arange(depth));
  range = c.reshape(range, to_shape(rs));
  V hot = c.op1(OpId::Eq, {c.unsqueeze(i64, {a}), range});
  V vf = c.reshape(values, Shape{SymInt(2)});
  V off = c.reshape(c.slice(vf, 0, 0, 1), Shape{});
  V on = c.reshape(c.slice(vf, 0, 1, 2), Shape{});
  c.out(0, c.op1(OpId::Where, {hot, on, off}));
}

// ---- depth/space rearrangements ----------------------------------------------------------------

void conv_depth_to_space(NodeCtx& c) {
  V x = c.in(0);
  if (c.rank(x) != 4) c.fail("input must be 4-D (NCHW), got rank {}", c.rank(x));
  int64_t b = c.attr_int("blocksize", 0);
  if (b < 1) c.fail("blocksize must be >= 1, got {}", b);
  std::string mode = c.attr_string("mode", "DCR");
  const Shape& s = c.shape(x);
  SymInt n = s[0], ch = s[1], h = s[2], w = s[3];
  if (ch.is_concrete() && ch.value() % (b * b) != 0)
    c.fail("channels {} are not divisible by blocksize^2 = {}", ch.value(), b * b);
  SymInt co = floordiv(ch, SymInt(b * b));
  V y;
  if (mode == "DCR") {
    y = c.reshape(x, Shape{n, b, b, co, h, w});
    y = c.permute(y, {0, 3, 4, 1, 5, 2});
  } else if (mode == "CRD") {
    y = c.reshape(x, Shape{n, co, b, b, h, w});
    y = c.permute(y, {0, 1, 4, 2, 5, 3});
  } else {
    c.fail("mode must be DCR or CRD, got \"{}\"", mode);
  }
  c.out(0, c.reshape(y, Shape{n, co, h * SymInt(b), w * SymInt(b)}));
}

void conv_space_to_depth(NodeCtx& c) {
  V x = c.in(0);
  if (c.rank(x) != 4) c.fail("input must be 4-D (NCHW), got rank {}", c.rank(x));
  int64_t b = c.attr_int("blocksize", 0);
  if (b < 1) c.fail("blocksize must be >= 1, got {}", b);
  const Shape& s = c.shape(x);
  for (int i = 2; i < 4; ++i)
    if (s[size_t(i)].is_concrete() && s[size_t(i)].value() % b != 0)
      c.fail("dim {} of size {} is not divisible by blocksize {}", i, s[size_t(i)].value(), b);
  // Opset 28 adds `mode`: DCR (the only order before) puts the block offset outermost in the
  // output channels, CRD the input channel.
  std::string mode = c.opset() >= 28 ? c.attr_string("mode", "DCR") : "DCR";
  if (mode != "DCR" && mode != "CRD") c.fail("mode must be DCR or CRD, got \"{}\"", mode);
  SymInt ho = floordiv(s[2], SymInt(b)), wo = floordiv(s[3], SymInt(b));
  V y = c.reshape(x, Shape{s[0], s[1], ho, b, wo, b});
  y = c.permute(y, mode == "DCR" ? std::vector<int64_t>{0, 3, 5, 1, 2, 4}
                                 : std::vector<int64_t>{0, 1, 3, 5, 2, 4});
  c.out(0, c.reshape(y, Shape{s[0], s[1] * SymInt(b * b), ho, wo}));
}

// CenterCropPad (opset 18): per axis, a centered crop (start rounded down) or a centered zero
// pad (the odd pixel on the right), as one pad op with negative (cropping) entries.
void conv_center_crop_pad(NodeCtx& c) {
  V x = c.in(0);
  int r = c.rank(x);
  std::vector<int64_t> shape = c.ints_input(1, "shape");
  std::vector<int64_t> axes = c.attr_ints("axes");
  if (axes.empty())
    for (int i = 0; i < r; ++i) axes.push_back(i);
  if (shape.size() != axes.size())
    c.fail("shape has {} entries for {} axes", shape.size(), axes.size());
  std::vector<int64_t> pads(size_t(2 * r), 0);
  std::vector<bool> seen(size_t(r), false);
  for (size_t k = 0; k < axes.size(); ++k) {
    int64_t a = c.axis(axes[k], r, "axis");
    if (seen[size_t(a)]) c.fail("axis {} appears twice in axes", axes[k]);
    seen[size_t(a)] = true;
    int64_t d = c.dims(x, "the input")[size_t(a)], t = shape[k];
    if (t < 0) c.fail("shape entry {} is negative", t);
    int64_t begin = d >= t ? -((d - t) / 2) : (t - d) / 2;
    pads[size_t(a)] = begin;
    pads[size_t(a + r)] = (t - d) - begin;
  }
  if (std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; })) {
    c.out(0, x);
    return;
  }
  c.out(0, c.op1(OpId::Pad, {x}, {{"pads", Ints(pads)}, {"mode", std::string("constant")},
                                  {"value", 0.0}}));
}

// The operands of CumSum / CumProd: x, the axis (a known scalar input), its length, and the
// exclusive / reverse attributes.
struct CumulativeArgs {
  V x;
  int64_t axis, n;
  bool exclusive, reverse;
};
CumulativeArgs cumulative_args(NodeCtx& c) {
  V x = c.in(0);
  Tensor at = c.known_input(1, "axis");
  if (at.numel() != 1) c.fail("axis must be a scalar");
  int64_t a = c.axis(at.to_vector<int64_t>()[0], c.rank(x), "axis");
  return {x, a, c.dims(x, "the input")[size_t(a)], c.attr_int("exclusive", 0) != 0,
          c.attr_int("reverse", 0) != 0};
}

// CumProd (opset 26) along an axis: a running product over slices, concatenated (exact; one
// multiplication per position, so long axes are refused).
void conv_cumprod(NodeCtx& c) {
  auto [x, a, n, exclusive, reverse] = cumulative_args(c);
  constexpr int64_t kMaxCumProd = 4096;
  if (n > kMaxCumProd)
    c.not_supported("CumProd over {} positions (composed as a running product of slices: at most "
                    "{})", n, kMaxCumProd);
  if (n == 0) {
    c.out(0, x);
    return;
  }
  std::vector<V> out(static_cast<size_t>(n));
  V run = kNone;
  for (int64_t s = 0; s < n; ++s) {
    int64_t i = reverse ? n - 1 - s : s;
    V xi = c.slice(x, a, i, i + 1);
    if (exclusive) {
      out[size_t(i)] = run == kNone ? c.full(c.shape(xi), 1, c.dtype(x)) : run;
      run = run == kNone ? xi : c.mul(run, xi);
    } else {
      run = run == kNone ? xi : c.mul(run, xi);
      out[size_t(i)] = run;
    }
  }
  c.out(0, n == 1 ? out[0] : c.op1(OpId::Concat, out, {{"dim", a}}));
}

// CumSum along an axis: a matmul with a triangular 0/1 matrix (exact for integers).
void conv_cumsum(NodeCtx& c) {
  auto [x, a, n, exclusive, reverse] = cumulative_args(c);
  Tensor tri = Tensor::zeros(Dims{n, n}, c.dtype(x));
  for (int64_t i = 0; i < n; ++i)  // row i = source element, column j = output element
    for (int64_t j = 0; j < n; ++j) {
      bool on = reverse ? (exclusive ? i > j : i >= j) : (exclusive ? i < j : i <= j);
      if (on) store_f64(static_cast<char*>(tri.raw_data()) + (i * n + j) * tri.element_size(), tri.dtype(), 1);
    }
  std::vector<int64_t> p = NodeCtx::perm_to_last(c.rank(x), a);
  V y = c.op1(OpId::Matmul, {c.permute(x, p), c.constant(tri)});
  c.out(0, c.permute(y, NodeCtx::inverse_perm(p)));
}

}  // namespace

void add_shape_converters(std::vector<OnnxOpEntry>& t) {
  using enum OpId;
  t.push_back({"Constant", conv_constant, {}, "a constant"});
  t.push_back({"Shape", conv_shape, {}, "folded to a constant (concrete shapes)"});
  t.push_back({"Size", conv_size, {}, "folded to a constant (concrete shapes)"});
  t.push_back({"ConstantOfShape", conv_constant_of_shape, {Expand},
               "shape known at import; expand of a scalar"});
  t.push_back({"Range", conv_range, {}, "folded: start/limit/delta known at import"});
  t.push_back({"EyeLike", conv_eye_like, {}, "a constant"});
  t.push_back({"Reshape", conv_reshape, {Reshape}, "0 copies a dim (unless allowzero), -1 infers"});
  t.push_back({"Flatten", conv_flatten, {Flatten, Reshape}, ""});
  t.push_back({"Transpose", conv_transpose, {Permute}, ""});
  t.push_back({"Squeeze", conv_squeeze, {Squeeze}, ""});
  t.push_back({"Unsqueeze", conv_unsqueeze, {Unsqueeze}, ""});
  t.push_back({"Concat", conv_concat, {Concat}, ""});
  t.push_back({"Split", conv_split, {Split}, ""});
  t.push_back({"Slice", conv_slice, {Slice, IndexSelect}, "negative steps via index_select"});
  t.push_back({"Gather", conv_gather, {Embedding, IndexSelect, Reshape, Slice, Squeeze},
               "one index known at import: a slice; embedding for 2-D data on axis 0; else "
               "index_select on flattened indices"});
  t.push_back({"GatherElements", conv_gather_elements, {Gather}, ""});
  std::vector<OpId> lin = {Slice, Squeeze, Cast, Lt, Where, Add, Mul, Expand};
  std::vector<OpId> gnd = lin;
  gnd.insert(gnd.end(), {Reshape, IndexSelect});
  t.push_back({"GatherND", conv_gather_nd, gnd, "linear row index + index_select"});
  std::vector<OpId> sc = {ScatterAdd, Expand, Gt, Where, Cast, Log, Abs, Lt, Floor, Mul, Sub, Exp,
                          Round, Add, Eq, Max, Min, Sum, Maximum, Minimum, Reshape};
  t.push_back({"ScatterElements", conv_scatter_elements, sc,
               "scatter_add of values and of hit counts; mul through log-sums; max/min through a "
               "position x update match matrix"});
  t.push_back({"Scatter", conv_scatter_elements, sc, "as ScatterElements"});
  std::vector<OpId> snd = sc;
  snd.insert(snd.end(), lin.begin(), lin.end());
  snd.push_back(Reshape);
  t.push_back({"ScatterND", conv_scatter_nd, snd, "scatter over linear row indices"});
  t.push_back({"Expand", conv_expand, {Expand}, "bidirectional broadcast"});
  t.push_back({"Tile", conv_tile, {Unsqueeze, Expand, Reshape}, "expand + reshape per dim"});
  t.push_back({"Pad", conv_pad, {Pad, IndexSelect},
               "constant, reflect, edge; wrap (opset 19) as index_select; axes (opset 18)"});
  t.push_back({"Trilu", conv_trilu, {Where}, "where with a constant mask"});
  t.push_back({"OneHot", conv_one_hot, {Cast, Lt, Where, Add, Reshape, Eq, Unsqueeze, Slice}, ""});
  t.push_back({"DepthToSpace", conv_depth_to_space, {Reshape, Permute}, ""});
  t.push_back({"SpaceToDepth", conv_space_to_depth, {Reshape, Permute}, ""});
  t.push_back({"CumSum", conv_cumsum, {Permute, Matmul}, "matmul with a triangular matrix"});
  t.push_back({"CumProd", conv_cumprod, {Slice, Mul, Expand, Concat},
               "running product of slices (axis length <= 4096)"});
  t.push_back({"CenterCropPad", conv_center_crop_pad, {Pad}, "one pad op (negative = crop)"});
}

}  // namespace kiln::onnx
