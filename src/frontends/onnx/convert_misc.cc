// Less common ONNX ops composed from Kiln ops: TopK, Compress, ReverseSequence, MaxUnpool,
// BitShift, Det, Einsum, the window functions and MelWeightMatrix (constants), DFT and STFT
// (matmuls with cosine/sine matrices).
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "frontends/onnx/convert.h"

namespace kiln::onnx {
namespace {

Tensor f64_tensor(const std::vector<double>& v, const Dims& d) { return Tensor::from_vector(v, d); }

// ---- TopK --------------------------------------------------------------------------------------

// TopK of a known tensor (folding at import, or a data-dependent tail at run time): a partial
// sort of each row, the order the rounds below give (lowest index first on ties). Not for NaN
// (the rounds define where it goes) or integers beyond float64's exact range. False: not taken.
bool topk_known(NodeCtx& c, const Tensor& x, int64_t a, int64_t k, bool largest) {
  const DType dt = x.dtype();
  if (dt == DType::Int64 || dt == DType::Bool) return false;
  if (x.numel() > c.options().max_tensor_bytes / 8) return false;  // its float64 copy
  const Dims d = x.sizes();
  // float64 values (exact for every dtype taken); float32, the common case, widened directly.
  std::vector<double> widened;
  Tensor xd;
  const double* v = nullptr;
  if (dt == DType::Float32) {
    const Tensor xc = x.contiguous();
    const float* f = xc.data<float>();
    widened.assign(f, f + xc.numel());
    v = widened.data();
  } else {
    xd = x.to(DType::Float64).contiguous();
    v = xd.data<double>();
  }
  for (int64_t i = 0; i < x.numel(); ++i)
    if (std::isnan(v[i])) return false;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < a; ++i) outer *= d[size_t(i)];
  for (size_t i = size_t(a) + 1; i < d.size(); ++i) inner *= d[i];
  const int64_t n = d[size_t(a)];
  Dims od = d;
  od[size_t(a)] = k;
  std::vector<double> vals(size_t(outer * k * inner));
  std::vector<int64_t> idxs(vals.size());
  std::vector<int64_t> row(static_cast<size_t>(n), 0);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const double* base = v + o * n * inner + i;
      std::iota(row.begin(), row.end(), 0);
      // A strict total order (index breaks ties): the k first are one set, sorted after.
      auto before = [&](int64_t p, int64_t q) {
        const double x = base[p * inner], y = base[q * inner];
        return largest ? (x > y || (x == y && p < q)) : (x < y || (x == y && p < q));
      };
      if (k < n) std::nth_element(row.begin(), row.begin() + k, row.end(), before);
      std::sort(row.begin(), row.begin() + k, before);
      for (int64_t j = 0; j < k; ++j) {
        const size_t at = size_t((o * k + j) * inner + i);
        vals[at] = base[row[size_t(j)] * inner];
        idxs[at] = row[size_t(j)];
      }
    }
  c.out(0, c.constant(Tensor::from_vector(vals, od).to(dt)));
  c.out(1, c.constant(Tensor::from_vector(idxs, od)));
  return true;
}

// k rounds of arg-max: each takes the best remaining element (lowest index on ties, as ONNX
// requires) and masks it out.
void conv_topk(NodeCtx& c) {
  V x = c.in(0);
  int r = c.rank(x);
  int64_t a = c.axis(c.attr_int("axis", -1), r, "axis");
  bool largest = c.attr_int("largest", 1) != 0;
  c.attr_int("sorted", 1);  // the rounds produce sorted output, which every mode accepts
  int64_t k;
  if (c.opset() < 10) {
    k = c.attr_int("k", -1);
  } else {
    std::vector<int64_t> kv = c.ints_input(1, "K");
    if (kv.size() != 1) c.fail("K must hold one value, got {}", kv.size());
    k = kv[0];
  }
  int64_t n = c.dims(x, "input")[size_t(a)];
  if (k < 0 || k > n) c.fail("k = {} is out of range for axis size {}", k, n);
  DType dt = c.dtype(x);
  if (const Tensor* known = c.known(x); known && topk_known(c, *known, a, k, largest)) return;
  V work = c.cast(x, DType::Float64);
  if (!largest) work = c.op1(OpId::Neg, {work});
  Dims rs(static_cast<size_t>(r), 1);
  rs[size_t(a)] = n;
  V range = c.reshape(c.constant(Tensor::arange(n)), to_shape(rs));
  V masked = c.scalar(-INFINITY, DType::Float64);
  std::vector<V> vals, idxs;
  for (int64_t i = 0; i < k; ++i) {
    V idx = c.op1(OpId::Argmax, {work}, {{"dim", a}, {"keepdim", true}});
    idxs.push_back(idx);
    vals.push_back(c.op1(OpId::Gather, {x, idx}, {{"dim", a}}));
    if (i + 1 < k) work = c.op1(OpId::Where, {c.op1(OpId::Eq, {range, idx}), masked, work});
  }
  auto join = [&](std::vector<V>& v, DType d) {
    if (v.empty()) {
      Shape s = c.shape(x);
      s[size_t(a)] = 0;
      return c.full(s, 0, d);
    }
    return v.size() == 1 ? v[0] : c.op1(OpId::Concat, v, {{"dim", a}});
  };
  c.out(0, join(vals, dt));
  c.out(1, join(idxs, DType::Int64));
}

// ---- Compress, ReverseSequence, MaxUnpool ------------------------------------------------------

void conv_compress(NodeCtx& c) {
  V x = c.in(0);
  Tensor cond = c.known_input(1, "condition");
  if (cond.dim() != 1) c.fail("condition must be 1-D, got rank {}", cond.dim());
  std::vector<int64_t> keep;
  std::vector<double> cv = cond.to_vector<double>();
  std::optional<int64_t> axis = c.attr_int_opt("axis");
  V src = x;
  int64_t a = 0;
  if (axis) a = c.axis(*axis, c.rank(x), "axis");
  else src = c.reshape(x, Shape{SymInt(-1)});
  int64_t n = c.dims(src, "input")[size_t(a)];
  for (int64_t i = 0; i < int64_t(cv.size()) && i < n; ++i)
    if (cv[size_t(i)] != 0) keep.push_back(i);
  if (int64_t(cv.size()) > n) c.fail("condition has {} entries for an axis of size {}", cv.size(), n);
  c.out(0, c.op1(OpId::IndexSelect, {src, c.constant(Tensor::from_vector(keep, Dims{int64_t(keep.size())}))},
                 {{"dim", a}}));
}

void conv_reverse_sequence(NodeCtx& c) {
  V x = c.in(0), lens = c.in(1);
  int r = c.rank(x);
  if (r < 2) c.fail("input must have rank >= 2, got {}", r);
  int64_t ta = c.axis(c.attr_int("time_axis", 0), r, "time_axis");
  int64_t ba = c.axis(c.attr_int("batch_axis", 1), r, "batch_axis");
  if (ta == ba || ta > 1 || ba > 1) c.fail("time_axis and batch_axis must be 0 and 1 in some order");
  Dims d = c.dims(x, "input");
  // src[t, b] = t < len[b] ? len[b] - 1 - t : t, broadcast over the other dims.
  Dims ts(static_cast<size_t>(r), 1), bs(static_cast<size_t>(r), 1);
  ts[size_t(ta)] = d[size_t(ta)];
  bs[size_t(ba)] = d[size_t(ba)];
  V t = c.reshape(c.constant(Tensor::arange(d[size_t(ta)])), to_shape(ts));
  V l = c.reshape(c.cast(lens, DType::Int64), to_shape(bs));
  V rev = c.sub(c.sub(l, c.scalar(1, DType::Int64)), t);
  V idx = c.op1(OpId::Where, {c.op1(OpId::Lt, {t, l}), rev, t});
  Ints full;
  for (int64_t v : d) full.push_back(v);
  idx = c.op1(OpId::Expand, {idx}, {{"shape", full}});
  c.out(0, c.op1(OpId::Gather, {x, idx}, {{"dim", ta}}));
}

void conv_max_unpool(NodeCtx& c) {
  V x = c.in(0), idx = c.in(1);
  Dims xd = c.dims(x, "input 'X'");
  int n = int(xd.size()) - 2;
  if (n < 1) c.fail("input must have rank >= 3");
  std::vector<int64_t> k = c.attr_ints("kernel_shape");
  std::vector<int64_t> s = c.attr_ints("strides", std::vector<int64_t>(size_t(n), 1));
  std::vector<int64_t> pads = c.attr_ints("pads", std::vector<int64_t>(size_t(2 * n), 0));
  if (int(k.size()) != n || int(s.size()) != n || int(pads.size()) != 2 * n)
    c.fail("kernel_shape/strides/pads do not match {} spatial dims", n);
  Dims od;
  if (c.has_input(2)) {
    for (int64_t v : c.ints_input(2, "output_shape")) od.push_back(v);
    if (int(od.size()) != n + 2) c.fail("output_shape must have {} entries", n + 2);
  } else {
    od = {xd[0], xd[1]};
    for (int i = 0; i < n; ++i)
      od.push_back((xd[size_t(i + 2)] - 1) * s[size_t(i)] + k[size_t(i)] - pads[size_t(i)] - pads[size_t(i + n)]);
  }
  // Indices are flat positions (over N, C and the spatial dims) in the unpooled shape that
  // the pooling parameters imply; a larger output_shape extends it at the end of each dim.
  Dims dd = {xd[0], xd[1]};
  for (int i = 0; i < n; ++i)
    dd.push_back((xd[size_t(i + 2)] - 1) * s[size_t(i)] + k[size_t(i)] - pads[size_t(i)] - pads[size_t(i + n)]);
  for (const Dims* shape : {&od, &dd}) {
    int64_t total = 1;
    for (int64_t v : *shape) {
      if (v < 1) c.fail("output shape {} has an empty dim", to_string(*shape));
      if (total > c.options().max_tensor_bytes / dtype_size(c.dtype(x)) / v)
        c.fail("output {} exceeds the tensor size limit", to_string(*shape));
      total *= v;
    }
  }
  if (od[0] != dd[0] || od[1] != dd[1]) c.fail("output_shape {} changes N or C", to_string(od));
  V flat_x = c.reshape(x, Shape{SymInt(-1)});
  V flat_i = c.reshape(c.cast(idx, DType::Int64), Shape{SymInt(-1)});
  V zeros = c.full(Shape{SymInt(numel(dd))}, 0, c.dtype(x));
  V y = c.reshape(c.op1(OpId::ScatterAdd, {zeros, flat_i, flat_x}, {{"dim", int64_t(0)}}), to_shape(dd));
  std::vector<int64_t> grow(static_cast<size_t>(2 * n), 0);
  bool any = false;
  for (int i = 0; i < n; ++i) {
    grow[size_t(i + n)] = od[size_t(i + 2)] - dd[size_t(i + 2)];
    any |= grow[size_t(i + n)] != 0;
  }
  if (any) y = c.op1(OpId::Pad, {y}, {{"pads", Ints(grow)}, {"mode", std::string("constant")}, {"value", 0.0}});
  c.out(0, y);
}

// ---- BitShift -----------------------------------------------------------------------------------

// uint8 (opset 11) and, from opset 28, int8/int32/int64 in int64 arithmetic without overflow:
// right shifts are arithmetic (floor division by 2^y), left shifts keep the low bits (two's
// complement wrap), and a shift outside [0, bits) gives the sign fill (-1 for a negative x
// shifted right, else 0).
void conv_bitshift(NodeCtx& c) {
  V x = c.in(0), y = c.in(1);
  std::string dir = c.attr_string("direction", "");
  if (dir != "LEFT" && dir != "RIGHT") c.fail("direction must be LEFT or RIGHT, got \"{}\"", dir);
  DType dt = c.dtype(x);
  V xi = c.cast(x, DType::Int64), yi = c.cast(y, DType::Int64);
  auto i64 = [&](double v) { return c.scalar(v, DType::Int64); };
  auto pow2 = [&](V e) { return c.op1(OpId::Pow, {i64(2), e}); };
  if (dt == DType::UInt8) {
    // Shifts of 8 or more clear every bit; 2^min(y, 8) keeps the power exact.
    V p = pow2(c.op1(OpId::Clamp, {yi}, {{"min", 0.0}, {"max", 8.0}}));
    V r;
    if (dir == "LEFT") {
      V prod = c.mul(xi, p);
      r = c.sub(prod, c.mul(c.div(prod, i64(256)), i64(256)));
    } else {
      r = c.div(xi, p);
    }
    c.out(0, c.cast(r, DType::UInt8));
    return;
  }
  bool signed_ok = c.opset() >= 28 && (dt == DType::Int8 || dt == DType::Int32 || dt == DType::Int64);
  if (!signed_ok)
    c.not_supported("BitShift on {} (uint8; int8, int32 and int64 from opset 28)", dtype_name(dt));
  int64_t bits = 8 * dtype_size(dt);
  V valid = c.op1(OpId::And, {c.op1(OpId::Ge, {yi, i64(0)}), c.op1(OpId::Lt, {yi, i64(double(bits))})});
  V ys = c.op1(OpId::Clamp, {yi}, {{"min", 0.0}, {"max", double(bits - 1)}});
  V neg = c.op1(OpId::Lt, {xi, i64(0)});
  V r;
  if (dir == "RIGHT") {
    // floor(x / 2^y) for y <= 62; y = 63 (int64) is the sign fill, as an invalid shift.
    V p = pow2(c.op1(OpId::Clamp, {ys}, {{"min", 0.0}, {"max", 62.0}}));
    V q = c.div(xi, p);  // truncates toward zero
    V inexact = c.op1(OpId::Ne, {c.mul(q, p), xi});
    q = c.op1(OpId::Where, {c.op1(OpId::And, {neg, inexact}), c.sub(q, i64(1)), q});
    V ok = c.op1(OpId::And, {valid, c.op1(OpId::Lt, {yi, i64(63)})});
    V fill = c.op1(OpId::Where, {neg, i64(-1), i64(0)});
    r = c.op1(OpId::Where, {ok, q, fill});
  } else {
    // Keep x's low (bits - y) bits as a signed value v in [-h, h), h = 2^(bits - 1 - y), then
    // v * 2^y lies in the type's range. v from x = q*h + r: r plus h when q is odd, wrapped.
    V h = pow2(c.op1(OpId::Clamp, {c.sub(i64(double(bits - 1)), ys)}, {{"min", 0.0}, {"max", 62.0}}));
    V q = c.div(xi, h);
    V rem = c.sub(xi, c.mul(q, h));
    V odd = c.op1(OpId::Ne, {c.sub(q, c.mul(c.div(q, i64(2)), i64(2))), i64(0)});
    V v = c.add(rem, c.op1(OpId::Where, {odd, h, i64(0)}));
    v = c.op1(OpId::Where, {c.op1(OpId::Ge, {v, h}), c.sub(c.sub(v, h), h), v});
    // v * 2^y as (v * 2^(y-1)) * 2: 2^63 itself is not an int64.
    V p1 = pow2(c.op1(OpId::Clamp, {c.sub(ys, i64(1))}, {{"min", 0.0}, {"max", 62.0}}));
    V shifted = c.mul(c.mul(v, p1), i64(2));
    shifted = c.op1(OpId::Where, {c.op1(OpId::Eq, {ys, i64(0)}), xi, shifted});
    r = c.op1(OpId::Where, {valid, shifted, i64(0)});
  }
  c.out(0, c.cast(r, dt));
}

// ---- Det ---------------------------------------------------------------------------------------

// Leibniz expansion over the permutations (n <= 4: at most 24 products).
void conv_det(NodeCtx& c) {
  V x = c.in(0);
  int r = c.rank(x);
  if (r < 2) c.fail("input must have rank >= 2");
  Dims d = c.dims(x, "input");
  int64_t n = d[size_t(r - 1)];
  if (d[size_t(r - 2)] != n) c.fail("matrices must be square, got {}x{}", d[size_t(r - 2)], n);
  if (n < 1 || n > 4) c.not_supported("determinants of {}x{} matrices (up to 4x4 are supported)", n, n);
  V w = c.cast(x, DType::Float64);
  auto elem = [&](int64_t i, int64_t j) {
    V e = c.slice(c.slice(w, r - 2, i, i + 1), r - 1, j, j + 1);
    return c.squeeze(e, {r - 2, r - 1});
  };
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  V sum = kNone;
  do {
    int inversions = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = i + 1; j < n; ++j) inversions += perm[size_t(i)] > perm[size_t(j)];
    V term = elem(0, perm[0]);
    for (int64_t i = 1; i < n; ++i) term = c.mul(term, elem(i, perm[size_t(i)]));
    if (sum == kNone) sum = inversions % 2 ? c.op1(OpId::Neg, {term}) : term;
    else sum = inversions % 2 ? c.sub(sum, term) : c.add(sum, term);
  } while (std::next_permutation(perm.begin(), perm.end()));
  c.out(0, c.cast(sum, c.dtype(x)));
}

// ---- Einsum ------------------------------------------------------------------------------------

struct Term {
  V v;
  std::string labels;  // one char per dim; ellipsis dims get digits ('0' = the last of them)
};

// Sums away labels of t that `keep` does not contain, and reduces repeated labels to
// diagonals.
Term reduce_term(NodeCtx& c, Term t, const std::string& keep) {
  // Diagonals: a label at dims p < q.
  for (size_t p = 0; p < t.labels.size(); ++p)
    for (size_t q = p + 1; q < t.labels.size(); ++q) {
      if (t.labels[p] != t.labels[q]) continue;
      Dims d = c.dims(t.v, "operand");
      if (d[p] != d[q]) c.fail("label '{}' has sizes {} and {}", t.labels[p], d[p], d[q]);
      Dims ms(t.labels.size(), 1);
      ms[p] = ms[q] = d[p];
      Tensor eye = Tensor::zeros(Dims{d[p], d[p]}, c.dtype(t.v));
      for (int64_t i = 0; i < d[p]; ++i)
        store_f64(static_cast<char*>(eye.raw_data()) + (i * d[p] + i) * eye.element_size(), eye.dtype(), 1);
      V m = c.reshape(c.constant(eye), to_shape(ms));
      t.v = c.op1(OpId::Sum, {c.mul(t.v, m)}, {{"dims", Ints{int64_t(q)}}, {"keepdim", false}});
      t.labels.erase(q, 1);
      --q;
    }
  Ints sum_dims;
  std::string kept;
  for (size_t i = 0; i < t.labels.size(); ++i) {
    if (keep.find(t.labels[i]) == std::string::npos) sum_dims.push_back(int64_t(i));
    else kept += t.labels[i];
  }
  if (!sum_dims.empty()) {
    DType dt = c.dtype(t.v);
    t.v = c.cast(c.op1(OpId::Sum, {t.v}, {{"dims", sum_dims}, {"keepdim", false}}), dt);
    t.labels = kept;
  }
  return t;
}

// a and b contracted over their shared labels not in `keep`, as one batched matmul:
// [batch, a_free, contracted] @ [batch, contracted, b_free].
Term contract(NodeCtx& c, Term a, Term b, const std::string& keep) {
  std::string batch, af, bf, con;
  for (char l : a.labels) {
    bool in_b = b.labels.find(l) != std::string::npos, kept = keep.find(l) != std::string::npos;
    if (in_b && kept) batch += l;
    else if (in_b) con += l;
    else af += l;
  }
  for (char l : b.labels)
    if (a.labels.find(l) == std::string::npos) bf += l;
  Dims da = c.dims(a.v, "operand"), db = c.dims(b.v, "operand");
  auto size_of = [&](char l) {
    size_t ia = a.labels.find(l), ib = b.labels.find(l);
    int64_t sa = ia == std::string::npos ? 1 : da[ia], sb = ib == std::string::npos ? 1 : db[ib];
    if (sa != sb && sa != 1 && sb != 1) c.fail("label '{}' has sizes {} and {}", l, sa, sb);
    return std::max(sa, sb);
  };
  auto arrange = [&](Term t, const std::string& order, const Dims& dd) {
    std::vector<int64_t> perm;
    for (char l : order) perm.push_back(int64_t(t.labels.find(l)));
    V v = c.permute(t.v, perm);
    // Broadcast batch dims of size 1.
    Ints shape;
    bool expand = false;
    for (size_t i = 0; i < order.size(); ++i) {
      int64_t full = i < batch.size() ? size_of(order[i]) : dd[size_t(perm[i])];
      expand |= full != dd[size_t(perm[i])];
      shape.push_back(full);
    }
    if (expand) v = c.op1(OpId::Expand, {v}, {{"shape", shape}});
    return v;
  };
  int64_t nb = 1, m = 1, k = 1, n = 1;
  Shape out_shape;
  for (char l : batch) nb *= size_of(l), out_shape.push_back(size_of(l));
  for (char l : af) m *= size_of(l), out_shape.push_back(size_of(l));
  for (char l : con) k *= size_of(l);
  for (char l : bf) n *= size_of(l), out_shape.push_back(size_of(l));
  V av = c.reshape(arrange(a, batch + af + con, da), Shape{nb, m, k});
  V bv = c.reshape(arrange(b, batch + con + bf, db), Shape{nb, k, n});
  V y = c.op1(OpId::Matmul, {av, bv});
  return {c.reshape(y, out_shape), batch + af + bf};
}

void conv_einsum(NodeCtx& c) {
  std::string eq;
  for (char ch : c.attr_string("equation", "")) if (ch != ' ') eq += ch;
  size_t arrow = eq.find("->");
  std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> terms;
  for (size_t p = 0;;) {
    size_t q = lhs.find(',', p);
    terms.push_back(lhs.substr(p, q == std::string::npos ? std::string::npos : q - p));
    if (q == std::string::npos) break;
    p = q + 1;
  }
  if (terms.size() != c.num_inputs())
    c.fail("equation '{}' has {} operands, the node {}", eq, terms.size(), c.num_inputs());
  // Ellipsis dims get labels '0', '1', ... counted from the right, so they align across
  // operands of different ranks (explicit labels are letters).
  int max_ell = 0;
  std::vector<Term> ops;
  for (size_t i = 0; i < terms.size(); ++i) {
    V v = c.in(i);
    std::string t = terms[i], labels;
    size_t e = t.find("...");
    int explicit_dims = int(t.size()) - (e == std::string::npos ? 0 : 3);
    int ell = e == std::string::npos ? 0 : c.rank(v) - explicit_dims;
    if (ell < 0 || (e == std::string::npos && explicit_dims != c.rank(v)))
      c.fail("operand {} has rank {}, the equation term '{}' does not match", i, c.rank(v), t);
    max_ell = std::max(max_ell, ell);
    for (size_t p = 0; p < t.size(); ++p) {
      if (e != std::string::npos && p == e) {
        for (int j = ell; j > 0; --j) labels += char('0' + (j - 1));
        p += 2;
        continue;
      }
      if (!std::isalpha(static_cast<unsigned char>(t[p])))
        c.fail("equation label '{}' is not a letter", t[p]);
      labels += t[p];
    }
    ops.push_back({v, labels});
  }
  std::string ell_labels;
  if (max_ell > 10) c.not_supported("more than 10 ellipsis dims");
  for (int j = max_ell; j > 0; --j) ell_labels += char('0' + (j - 1));
  std::string out;
  if (arrow != std::string::npos) {
    std::string o = eq.substr(arrow + 2);
    size_t e = o.find("...");
    for (size_t p = 0; p < o.size(); ++p) {
      if (e != std::string::npos && p == e) {
        out += ell_labels;
        p += 2;
        continue;
      }
      out += o[p];
    }
  } else {  // implicit: ellipsis, then labels seen once, sorted
    std::map<char, int> count;
    for (auto& t : ops)
      for (char l : t.labels) count[l]++;
    out = ell_labels;
    for (auto& [l, n] : count)
      if (n == 1 && std::isalpha(static_cast<unsigned char>(l))) out += l;
  }
  // Fold operands left to right, keeping labels later operands or the output need.
  auto needed_after = [&](size_t i) {
    std::string keep = out;
    for (size_t j = i + 1; j < ops.size(); ++j) keep += ops[j].labels;
    return keep;
  };
  Term acc = reduce_term(c, ops[0], needed_after(0) + (ops.size() > 1 ? ops[1].labels : ""));
  for (size_t i = 1; i < ops.size(); ++i) {
    std::string keep = needed_after(i);
    Term b = reduce_term(c, ops[i], keep + acc.labels);
    acc = contract(c, reduce_term(c, acc, keep + b.labels), b, keep);
  }
  acc = reduce_term(c, acc, out);
  std::vector<int64_t> perm;
  for (char l : out) {
    size_t p = acc.labels.find(l);
    if (p == std::string::npos) c.fail("output label '{}' is not in any operand", l);
    perm.push_back(int64_t(p));
  }
  c.out(0, c.permute(acc.v, perm));
}

// ---- windows, mel matrix, DFT, STFT ------------------------------------------------------------

int64_t scalar_int(NodeCtx& c, size_t i, std::string_view what) {
  std::vector<int64_t> v = c.ints_input(i, what);
  if (v.size() != 1) c.fail("{} must be a scalar", what);
  return v[0];
}

DType output_datatype(NodeCtx& c) {
  DType d = DType::Float32;
  int64_t t = c.attr_int("output_datatype", 1);
  if (!dtype_from_onnx(int32_t(t), &d)) c.not_supported("output_datatype {}", onnx_type_name(int32_t(t)));
  return d;
}

template <int Kind>  // 0 Hann, 1 Hamming, 2 Blackman
void conv_window(NodeCtx& c) {
  int64_t n = scalar_int(c, 0, "size");
  if (n < 0 || n > (int64_t(1) << 28)) c.fail("size {} is out of range", n);
  bool periodic = c.attr_int("periodic", 1) != 0;
  DType dt = output_datatype(c);
  double den = double(periodic ? n : n - 1);
  std::vector<double> w(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double t = 2 * M_PI * double(i) / den;
    if (Kind == 0) w[size_t(i)] = 0.5 - 0.5 * std::cos(t);
    else if (Kind == 1) w[size_t(i)] = 25.0 / 46.0 - 21.0 / 46.0 * std::cos(t);
    else w[size_t(i)] = 0.42 - 0.5 * std::cos(t) + 0.08 * std::cos(2 * t);
  }
  c.out(0, c.constant(f64_tensor(w, Dims{n}).to(dt)));
}

void conv_mel_weight_matrix(NodeCtx& c) {
  int64_t bins = scalar_int(c, 0, "num_mel_bins"), dft = scalar_int(c, 1, "dft_length"),
          rate = scalar_int(c, 2, "sample_rate");
  double lo = c.known_input(3, "lower_edge_hertz").item(), hi = c.known_input(4, "upper_edge_hertz").item();
  if (bins < 1 || dft < 1 || rate < 1 || bins > 65536 || dft > (1 << 24))
    c.fail("num_mel_bins, dft_length and sample_rate must be positive and reasonable");
  DType dt = output_datatype(c);
  int64_t spec = dft / 2 + 1;
  auto mel = [](double hz) { return 2595 * std::log10(1 + hz / 700); };
  // (The reference divides the mel range by the number of points, bins + 2.)
  double lm = mel(lo), step = (mel(hi) - lm) / double(bins + 2);
  std::vector<int64_t> f(size_t(bins + 2));
  for (int64_t i = 0; i < bins + 2; ++i) {
    double hz = 700 * (std::pow(10.0, (double(i) * step + lm) / 2595) - 1);
    f[size_t(i)] = int64_t(std::floor(double(dft + 1) * hz / double(rate)));
  }
  std::vector<double> out(size_t(spec * bins), 0.0);
  auto at = [&](int64_t j, int64_t i) -> double& {
    if (j < 0 || j >= spec) c.fail("mel filter bin {} is out of range [0, {})", j, spec);
    return out[size_t(j * bins + i)];
  };
  for (int64_t i = 0; i < bins; ++i) {
    int64_t l = f[size_t(i)], m = f[size_t(i + 1)], h = f[size_t(i + 2)];
    if (m == l) at(m, i) = 1;
    else
      for (int64_t j = l; j <= m; ++j) at(j, i) = double(j - l) / double(m - l);
    if (h > m)
      for (int64_t j = m; j < h; ++j) at(j, i) = double(h - j) / double(h - m);
  }
  c.out(0, c.constant(f64_tensor(out, Dims{spec, bins}).to(dt)));
}

// DFT of (re, im) [..., N] (the transformed axis last) to K = (onesided ? N/2+1 : N) bins, in
// float64 (the reference transforms in float64 too; float32 matmuls would leave rounding noise
// above the test tolerance where the exact result is 0), rounded once to the input's dtype.
std::pair<V, V> dft_last(NodeCtx& c, V re, V im, int64_t n, bool onesided, bool inverse) {
  int64_t k = onesided ? n / 2 + 1 : n;
  std::vector<double> cs(size_t(n * k)), sn(size_t(n * k));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) {
      double t = 2 * M_PI * double((i * j) % n) / double(n);
      cs[size_t(i * k + j)] = std::cos(t);
      sn[size_t(i * k + j)] = std::sin(t);
    }
  DType dt = c.dtype(re);
  re = c.cast(re, DType::Float64);
  if (im != kNone) im = c.cast(im, DType::Float64);
  V C = c.constant(f64_tensor(cs, Dims{n, k})), S = c.constant(f64_tensor(sn, Dims{n, k}));
  auto mm = [&](V a, V b) { return c.op1(OpId::Matmul, {a, b}); };
  V yr, yi;
  if (!inverse) {  // e^{-i t}
    yr = im == kNone ? mm(re, C) : c.add(mm(re, C), mm(im, S));
    yi = im == kNone ? c.op1(OpId::Neg, {mm(re, S)}) : c.sub(mm(im, C), mm(re, S));
  } else {  // e^{+i t} / N
    yr = im == kNone ? mm(re, C) : c.sub(mm(re, C), mm(im, S));
    yi = im == kNone ? mm(re, S) : c.add(mm(im, C), mm(re, S));
    V inv_n = c.scalar(1.0 / double(n), DType::Float64);
    yr = c.mul(yr, inv_n);
    yi = c.mul(yi, inv_n);
  }
  return {c.cast(yr, dt), c.cast(yi, dt)};
}

// Inverse real DFT (onesided inverse): the K bins (re, im) [..., K] of a Hermitian spectrum to n
// real samples, x[t] = (1/n) sum_k w_k (re_k cos(2 pi k t / n) - im_k sin(2 pi k t / n)) with
// w_k = 2 for the bins that stand for a mirrored pair as well (1 <= k <= n - (n/2 + 1)), else 1,
// over the first min(K, n/2 + 1) bins (numpy's irfft: missing bins are zero, extra ones unused).
V irdft_last(NodeCtx& c, V re, V im, int64_t bins, int64_t n) {
  int64_t half = n / 2 + 1, kk = std::min(bins, half);
  std::vector<double> cr(size_t(kk * n)), ci(size_t(kk * n));
  for (int64_t k = 0; k < kk; ++k) {
    double w = (k >= 1 && k <= n - half) ? 2.0 : 1.0;
    for (int64_t t = 0; t < n; ++t) {
      double a = 2 * M_PI * double((k * t) % n) / double(n);
      cr[size_t(k * n + t)] = w * std::cos(a) / double(n);
      ci[size_t(k * n + t)] = -w * std::sin(a) / double(n);
    }
  }
  DType dt = c.dtype(re);
  int r = c.rank(re);
  V r64 = c.cast(c.slice(re, r - 1, 0, kk), DType::Float64);
  V i64 = c.cast(c.slice(im, r - 1, 0, kk), DType::Float64);
  V y = c.add(c.op1(OpId::Matmul, {r64, c.constant(f64_tensor(cr, Dims{kk, n}))}),
              c.op1(OpId::Matmul, {i64, c.constant(f64_tensor(ci, Dims{kk, n}))}));
  return c.cast(y, dt);
}

V stack_complex(NodeCtx& c, V re, V im) {
  int r = c.rank(re);
  return c.op1(OpId::Concat, {c.unsqueeze(re, {r}), c.unsqueeze(im, {r})}, {{"dim", int64_t(r)}});
}

// DFT: opset 17 takes `axis` as an attribute (default 1, counted over the signal dims); opset
// 20 as an optional scalar input (default -2, counted over the full rank, the complex dim
// excluded). onesided + inverse is the inverse real DFT (IRFFT), real output.
void conv_dft(NodeCtx& c) {
  V x = c.in(0);
  int r = c.rank(x);
  Dims d = c.dims(x, "input");
  if (r < 3 || (d[size_t(r - 1)] != 1 && d[size_t(r - 1)] != 2))
    c.fail("input must be [batch, ..., 1 or 2], got {}", to_string(d));
  bool complex = d[size_t(r - 1)] == 2;
  bool inverse = c.attr_int("inverse", 0) != 0, onesided = c.attr_int("onesided", 0) != 0;
  if (onesided && inverse && !complex) c.fail("the inverse real DFT (onesided, inverse) needs complex input");
  if (onesided && !inverse && complex) c.fail("onesided forward DFT needs real input");
  int64_t a;
  if (c.opset() >= 20) {
    a = c.has_input(2) ? scalar_int(c, 2, "axis") : -2;
    if (a < 0) a += r;
    if (a < 0 || a >= r - 1) c.fail("axis is out of range [-{}, -2] or [0, {}]", r, r - 2);
  } else {
    if (c.has_input(2)) c.fail("input 2 (axis) needs opset 20, the model imports {}", c.opset());
    a = c.attr_int("axis", 1);
    if (a < 0) a += r - 1;
    if (a < 1 || a >= r - 1) c.fail("axis {} is out of range for signal dims 1..{}", c.attr_int("axis", 1), r - 2);
  }
  V re = c.squeeze(c.slice(x, r - 1, 0, 1), {r - 1});
  V im = complex ? c.squeeze(c.slice(x, r - 1, 1, 2), {r - 1}) : kNone;
  int64_t n = d[size_t(a)];
  bool irfft = onesided && inverse;
  std::optional<int64_t> length;
  if (c.has_input(1)) {
    length = scalar_int(c, 1, "dft_length");
    if (*length < 1) c.fail("dft_length must be >= 1, got {}", *length);
  }
  std::vector<int64_t> perm = NodeCtx::perm_to_last(r - 1, a);
  std::vector<int64_t> back = NodeCtx::inverse_perm(perm);
  if (irfft) {
    // n real samples from the bins: dft_length, else 2 * (bins - 1).
    int64_t samples = length ? *length : 2 * (n - 1);
    if (samples < 1) c.fail("the inverse real DFT of {} bins has no samples", n);
    V y = irdft_last(c, c.permute(re, perm), c.permute(im, perm), n, samples);
    c.out(0, c.unsqueeze(c.permute(y, back), {r - 1}));
    return;
  }
  if (length) {  // dft_length: truncate or zero-pad the signal
    int64_t len = *length;
    for (V* p : {&re, &im}) {
      if (*p == kNone) continue;
      if (len < n) *p = c.slice(*p, a, 0, len);
      else if (len > n) {
        std::vector<int64_t> pads(size_t(2 * (r - 1)), 0);
        pads[size_t(a + r - 1)] = len - n;
        *p = c.op1(OpId::Pad, {*p}, {{"pads", Ints(pads)}, {"mode", std::string("constant")}, {"value", 0.0}});
      }
    }
    n = len;
  }
  re = c.permute(re, perm);
  if (im != kNone) im = c.permute(im, perm);
  auto [yr, yi] = dft_last(c, re, im, n, onesided, inverse);
  c.out(0, stack_complex(c, c.permute(yr, back), c.permute(yi, back)));
}

void conv_stft(NodeCtx& c) {
  V sig = c.in(0), win = c.in_opt(2);
  Dims d = c.dims(sig, "signal");
  if (d.size() != 3 || (d[2] != 1 && d[2] != 2)) c.fail("signal must be [batch, length, 1 or 2], got {}", to_string(d));
  if (d[2] == 2) c.not_supported("complex signals");
  bool onesided = c.attr_int("onesided", 1) != 0;
  int64_t step = scalar_int(c, 1, "frame_step");
  int64_t flen = win != kNone ? c.dims(win, "window")[0] : 0;
  if (c.has_input(3)) {
    int64_t fl = scalar_int(c, 3, "frame_length");
    if (win != kNone && fl != flen) c.fail("frame_length {} differs from the window length {}", fl, flen);
    flen = fl;
  }
  if (flen < 1 || step < 1 || flen > d[1]) c.fail("frame_length {} and frame_step {} do not fit length {}", flen, step, d[1]);
  int64_t frames = (d[1] - flen) / step + 1;
  std::vector<int64_t> idx;
  for (int64_t f = 0; f < frames; ++f)
    for (int64_t i = 0; i < flen; ++i) idx.push_back(f * step + i);
  V s = c.squeeze(sig, {2});  // [batch, length]
  V fr = c.op1(OpId::IndexSelect, {s, c.constant(Tensor::from_vector(idx, Dims{int64_t(idx.size())}))},
               {{"dim", int64_t(1)}});
  fr = c.reshape(fr, Shape{d[0], frames, flen});
  if (win != kNone) fr = c.mul(fr, c.cast(win, c.dtype(fr)));
  auto [yr, yi] = dft_last(c, fr, kNone, flen, onesided, false);
  c.out(0, stack_complex(c, yr, yi));
}

}  // namespace

void add_misc_converters(std::vector<OnnxOpEntry>& t) {
  using enum OpId;
  t.push_back({"TopK", conv_topk, {Cast, Neg, Reshape, Argmax, Gather, Eq, Where, Concat, Expand},
               "k rounds of argmax (k known at import)"});
  t.push_back({"Compress", conv_compress, {Reshape, IndexSelect}, "condition known at import"});
  t.push_back({"ReverseSequence", conv_reverse_sequence, {Reshape, Cast, Sub, Where, Lt, Expand, Gather}, ""});
  t.push_back({"MaxUnpool", conv_max_unpool, {Reshape, Cast, Expand, ScatterAdd, Pad}, "scatter into zeros"});
  t.push_back({"BitShift", conv_bitshift,
               {Cast, Pow, Clamp, Mul, Sub, Div, And, Ge, Lt, Ne, Where, Add, Eq},
               "uint8; int8/int32/int64 (opset 28) in overflow-free int64 arithmetic"});
  t.push_back({"Det", conv_det, {Cast, Slice, Squeeze, Mul, Add, Sub, Neg}, "Leibniz expansion, up to 4x4"});
  t.push_back({"Einsum", conv_einsum, {Mul, Reshape, Sum, Cast, Permute, Expand, Matmul},
               "diagonals, sums, then batched matmuls"});
  t.push_back({"HannWindow", conv_window<0>, {}, "a constant (size known at import)"});
  t.push_back({"HammingWindow", conv_window<1>, {}, "a constant (size known at import)"});
  t.push_back({"BlackmanWindow", conv_window<2>, {}, "a constant (size known at import)"});
  t.push_back({"MelWeightMatrix", conv_mel_weight_matrix, {}, "a constant"});
  std::vector<OpId> dft = {Slice, Squeeze, Pad, Permute, Matmul, Add, Sub, Neg, Mul, Unsqueeze,
                           Concat, Cast};
  t.push_back({"DFT", conv_dft, dft,
               "float64 matmuls with cosine/sine matrices; inverse real DFT (onesided inverse)"});
  dft.insert(dft.end(), {IndexSelect, Reshape});
  t.push_back({"STFT", conv_stft, dft, "framing by index_select, then DFT matmuls"});
}

}  // namespace kiln::onnx
