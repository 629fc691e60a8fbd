// Attention: scaled_dot_product_attention.
//
// Note [SDPA semantics]
// out = softmax(q @ k^T * scale + bias) @ v over the last dim, with q [..., L, E], k [..., S, E],
// v [..., S, Ev]; batch dims broadcast (NumPy). scale defaults to 1/sqrt(E). The bias comes from
//   - mask (bool): true = attend, false = -inf; or mask (float, q's dtype): added to the scores;
//     either broadcastable to [..., L, S];
//   - is_causal: row i attends columns j <= i (top-left aligned lower triangle, as PyTorch; for
//     L != S the triangle is anchored at [0, 0], not at the bottom-right). Like PyTorch, an
//     explicit mask together with is_causal is an error.
// A row whose every score is -inf (all masked) has no defined softmax: like PyTorch's math path
// it comes out NaN. With S == 0 the output is 0 (an empty sum), as matmul over S gives.
// heads_last (default false) stores the output with its last batch dim moved after the sequence
// dim: [..., L, H, Ev] instead of [..., H, L, Ev] (H: the last batch dim; the output has one).
// It is the same numbers as transpose(out, -3, -2): models transpose attention's output so, and
// reshape it to [..., L, H * Ev] for the output projection; written heads-last, that reshape is a
// view (Note [attention writes heads last] in passes/attention_heads_last.h).
//
// The op is composite: `decompose` writes it with matmul/transpose/mul/where|add/softmax/matmul
// through the eager API, and eager CPU runs that decomposition (so eager performance is that of
// the matmul and softmax kernels; CUDA gets it through dispatch's decomposition fallback). The
// reference kernel computes the same thing directly in float64 and is the oracle.
#include <cmath>
#include <limits>

#include "ops/kernel_path.h"
#include "ops/api.h"
#include "ops/kernel_util.h"

namespace kiln {
namespace {

Shape batch_of(const TensorType& t) {
  Shape b;
  for (int d = 0; d + 2 < t.rank(); ++d) b.push_back(t.shape[d]);
  return b;
}

std::vector<TensorType> infer_sdpa(const InferContext& ctx) {
  const TensorType& q = ctx.in(0);
  const TensorType& k = ctx.in(1);
  const TensorType& v = ctx.in(2);
  if (!is_floating(q.dtype)) ctx.fail("q must be a floating dtype, got {}", dtype_name(q.dtype));
  if (k.dtype != q.dtype || v.dtype != q.dtype)
    ctx.fail("q, k and v must have one dtype, got {}, {}, {}", dtype_name(q.dtype),
             dtype_name(k.dtype), dtype_name(v.dtype));
  const char* names[3] = {"q", "k", "v"};
  const TensorType* qkv[3] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i)
    if (qkv[i]->rank() < 2)
      ctx.fail("{} must have rank >= 2 ([..., seq, features]), got shape {}", names[i],
               to_string(qkv[i]->shape));
  SymInt L = q.shape[q.rank() - 2], E = q.shape[q.rank() - 1];
  SymInt S = k.shape[k.rank() - 2], Ek = k.shape[k.rank() - 1];
  SymInt Sv = v.shape[v.rank() - 2], Ev = v.shape[v.rank() - 1];
  if (E != Ek)
    ctx.fail("q has {} features (shape {}) but k has {} (shape {}); the last dims must match",
             E.str(), to_string(q.shape), Ek.str(), to_string(k.shape));
  if (S != Sv)
    ctx.fail("k has {} keys (shape {}) but v has {} values (shape {}); dim -2 must match",
             S.str(), to_string(k.shape), Sv.str(), to_string(v.shape));
  Shape batch;
  try {
    batch = broadcast_shapes(broadcast_shapes(batch_of(q), batch_of(k)), batch_of(v));
  } catch (const Error& e) {
    ctx.fail("batch dims of q {}, k {} and v {} do not broadcast: {}", to_string(q.shape),
             to_string(k.shape), to_string(v.shape), e.message());
  }
  if (ctx.has_input(3)) {
    const TensorType& m = ctx.in(3);
    if (ctx.attrs.get_bool("is_causal"))
      ctx.fail("an explicit mask cannot be combined with is_causal = true (fold the causal "
               "pattern into the mask)");
    if (m.dtype != DType::Bool && m.dtype != q.dtype)
      ctx.fail("mask must be bool or q's dtype {}, got {}", dtype_name(q.dtype),
               dtype_name(m.dtype));
    Shape scores = batch;
    scores.push_back(L);
    scores.push_back(S);
    bool ok = m.rank() <= scores.rank();
    if (ok) {
      try {
        ok = broadcast_shapes(m.shape, scores) == scores;
      } catch (const Error&) {
        ok = false;
      }
    }
    if (!ok)
      ctx.fail("mask of shape {} does not broadcast to the scores' shape {}", to_string(m.shape),
               to_string(scores));
  }
  Shape out = batch;
  out.push_back(L);
  out.push_back(Ev);
  if (ctx.attrs.get_bool("heads_last")) {
    if (batch.rank() == 0)
      ctx.fail("heads_last needs a batch dim to move after the sequence dim, but q {}, k {} and "
               "v {} have none", to_string(q.shape), to_string(k.shape), to_string(v.shape));
    std::swap(out[out.rank() - 3], out[out.rank() - 2]);
  }
  return {TensorType(q.dtype, out, q.device)};
}

double sdpa_scale(const Attrs& attrs, int64_t E) {
  return attrs.has("scale") ? attrs.get_float("scale") : 1.0 / std::sqrt(double(E));
}

// ---- reference (float64) ---------------------------------------------------------------------
void ref_sdpa(const KernelContext& ctx) {
  const Tensor& q = ctx.inputs[0];
  const Tensor& k = ctx.inputs[1];
  const Tensor& v = ctx.inputs[2];
  Tensor mask = ctx.inputs.size() > 3 ? ctx.inputs[3] : Tensor();
  Tensor& out = ctx.outputs[0];
  const bool causal = ctx.attrs.get_bool("is_causal");
  const int r = out.dim(), nb = r - 2;
  const int64_t L = q.size(-2), E = q.size(-1), S = k.size(-2), Ev = v.size(-1);
  const double scale = sdpa_scale(ctx.attrs, E);
  // The output as [..., H, L, Ev] (heads_last: the stored [..., L, H, Ev] seen transposed).
  Dims osz = out.sizes(), os = out.strides();
  if (ctx.attrs.get_bool("heads_last")) {
    std::swap(osz[size_t(nb - 1)], osz[size_t(nb)]);
    std::swap(os[size_t(nb - 1)], os[size_t(nb)]);
  }
  Dims batch;
  for (int d = 0; d < nb; ++d) batch.push_back(osz[size_t(d)]);
  auto full = [&](int64_t a, int64_t b) {
    Dims s = batch;
    s.push_back(a);
    s.push_back(b);
    return s;
  };
  Dims qs = broadcast_strides(q, full(L, E)), ks = broadcast_strides(k, full(S, E));
  Dims vs = broadcast_strides(v, full(S, Ev));
  Dims ms = mask.defined() ? broadcast_strides(mask, full(L, S)) : Dims(size_t(r), int64_t(0));
  const char *qp = elem_ptr(q, 0), *kp = elem_ptr(k, 0), *vp = elem_ptr(v, 0);
  const char* mp = mask.defined() ? elem_ptr(mask, 0) : nullptr;
  char* op = elem_ptr(out, 0);
  const int64_t qe = q.element_size(), me = mask.defined() ? mask.element_size() : 0;
  const DType dt = q.dtype(), mdt = mask.defined() ? mask.dtype() : DType::Bool;
  const double neg_inf = -std::numeric_limits<double>::infinity();
  std::vector<double> scores(static_cast<size_t>(S)), acc(static_cast<size_t>(Ev));
  auto run_batch = [&](const int64_t* idx) {
    int64_t qb = 0, kb = 0, vb = 0, mb = 0, ob = 0;
    for (int d = 0; d < nb; ++d) {
      qb += idx[d] * qs[d];
      kb += idx[d] * ks[d];
      vb += idx[d] * vs[d];
      mb += idx[d] * ms[d];
      ob += idx[d] * os[d];
    }
    for (int64_t i = 0; i < L; ++i) {
      double max_score = neg_inf;
      for (int64_t j = 0; j < S; ++j) {
        double s = 0;
        for (int64_t e = 0; e < E; ++e)
          s += load_f64(qp + (qb + i * qs[nb] + e * qs[nb + 1]) * qe, dt) *
               load_f64(kp + (kb + j * ks[nb] + e * ks[nb + 1]) * qe, dt);
        s *= scale;
        if (causal && j > i) s = neg_inf;
        if (mp) {
          const char* m = mp + (mb + i * ms[nb] + j * ms[nb + 1]) * me;
          if (mdt == DType::Bool) {
            if (!*reinterpret_cast<const bool*>(m)) s = neg_inf;
          } else {
            s += load_f64(m, mdt);
          }
        }
        scores[size_t(j)] = s;
        max_score = std::max(max_score, s);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      if (S > 0 && max_score == neg_inf) {
        // Every key masked: no defined softmax; NaN like PyTorch (Note [SDPA semantics]).
        std::fill(acc.begin(), acc.end(), std::numeric_limits<double>::quiet_NaN());
      } else if (S > 0) {
        double denom = 0;
        for (int64_t j = 0; j < S; ++j) {
          double p = std::exp(scores[size_t(j)] - max_score);
          scores[size_t(j)] = p;
          denom += p;
        }
        for (int64_t j = 0; j < S; ++j) {
          double p = scores[size_t(j)] / denom;
          for (int64_t e = 0; e < Ev; ++e)
            acc[size_t(e)] += p * load_f64(vp + (vb + j * vs[nb] + e * vs[nb + 1]) * qe, dt);
        }
      }
      for (int64_t e = 0; e < Ev; ++e)
        store_f64(op + (ob + i * os[nb] + e * os[nb + 1]) * qe, dt, acc[size_t(e)]);
    }
  };
  for_each_index(batch, run_batch);
}

// ---- decomposition ---------------------------------------------------------------------------
// [L, S] bool: true where j <= i.
Tensor causal_allowed(int64_t L, int64_t S, Device device) {
  Tensor allowed = Tensor::empty(Dims{L, S}, DType::Bool);
  bool* p = allowed.data<bool>();
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < S; ++j) p[i * S + j] = j <= i;
  return device.is_cpu() ? allowed : allowed.to(device);
}

TensorList decompose_sdpa(std::span<const Tensor> in, const Attrs& attrs) {
  const Tensor& q = in[0];
  const Tensor& k = in[1];
  const Tensor& v = in[2];
  Tensor mask = in.size() > 3 ? in[3] : Tensor();
  const double scale = sdpa_scale(attrs, q.size(-1));
  Tensor scores = mul(matmul(q, transpose(k, -2, -1)), scale);
  Tensor neg_inf = scalar_like(-std::numeric_limits<double>::infinity(), scores);
  if (attrs.get_bool("is_causal"))
    scores = where(causal_allowed(q.size(-2), k.size(-2), q.device()), scores, neg_inf);
  if (mask.defined())
    scores = mask.dtype() == DType::Bool ? where(mask, scores, neg_inf) : add(scores, mask);
  Tensor out = matmul(softmax(scores, -1), v);
  if (attrs.get_bool("heads_last")) out = transpose(out, -3, -2);
  return {out};
}

// Eager runs the decomposition (see Note [SDPA semantics]) and stores it in the output.
void eager_sdpa(const KernelContext& ctx) {
  TensorList out = decompose_sdpa(ctx.inputs, ctx.attrs);
  ctx.outputs[0].copy_(out[0]);
  note_kernel_path("decomposition");
}

// ---- samples ---------------------------------------------------------------------------------
// A random bool mask with at least one true per row (a fully masked row is NaN, tested apart).
Tensor sample_bool_mask(Generator& g, const Dims& sizes) {
  Tensor m = Tensor::empty(sizes, DType::Bool);
  bool* p = m.data<bool>();
  int64_t S = sizes.back(), rows = m.numel() / S;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < S; ++j) p[r * S + j] = g.uniform() < 0.6;
    p[r * S + int64_t(g.next_u64() % uint64_t(S))] = true;
  }
  return m;
}
// A float mask: random biases with some -inf entries, never a whole row.
Tensor sample_float_mask(Generator& g, const Dims& sizes) {
  Tensor m = sample_randn(g, sizes);
  double* p = m.data<double>();
  int64_t S = sizes.back(), rows = m.numel() / S;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t keep = int64_t(g.next_u64() % uint64_t(S));
    for (int64_t j = 0; j < S; ++j)
      if (j != keep && g.uniform() < 0.25) p[r * S + j] = -std::numeric_limits<double>::infinity();
  }
  return m;
}

std::vector<OpSample> samples_sdpa(Generator& g) {
  Attrs causal{{"is_causal", true}};
  Attrs plain{{"is_causal", false}};
  return {
      {{sample_randn(g, {2, 3, 8}), sample_randn(g, {2, 5, 8}), sample_randn(g, {2, 5, 6})},
       plain, "L=3 != S=5, Ev != E"},
      {{sample_randn(g, {1, 2, 4, 8}), sample_randn(g, {1, 2, 4, 8}), sample_randn(g, {1, 2, 4, 8})},
       causal, "causal self-attention [1,2,4,8]"},
      {{sample_randn(g, {2, 3, 4}), sample_randn(g, {2, 5, 4}), sample_randn(g, {2, 5, 4})},
       causal, "causal L=3 < S=5 (top-left)"},
      {{sample_randn(g, {2, 6, 4}), sample_randn(g, {2, 3, 4}), sample_randn(g, {2, 3, 5})},
       causal, "causal L=6 > S=3"},
      {{sample_randn(g, {2, 3, 4}), sample_randn(g, {2, 5, 4}), sample_randn(g, {2, 5, 4}),
        sample_bool_mask(g, {3, 5})},
       plain, "bool mask [L,S] broadcast over batch"},
      {{sample_randn(g, {2, 2, 3, 4}), sample_randn(g, {2, 2, 6, 4}), sample_randn(g, {2, 2, 6, 3}),
        sample_bool_mask(g, {2, 1, 3, 6})},
       plain, "bool mask [2,1,L,S]"},
      {{sample_randn(g, {2, 4, 4}), sample_randn(g, {2, 5, 4}), sample_randn(g, {2, 5, 4}),
        sample_float_mask(g, {1, 4, 5})},
       plain, "float mask with -inf entries"},
      {{sample_randn(g, {3, 4}), sample_randn(g, {5, 4}), sample_randn(g, {5, 2})},
       {{"is_causal", false}, {"scale", 0.3}}, "2-D, explicit scale"},
      {{sample_randn(g, {2, 3, 3, 4}), sample_randn(g, {3, 5, 4}), sample_randn(g, {1, 5, 4})},
       plain, "broadcast batch dims"},
      {{sample_noncontiguous(g, {3, 4, 2}), sample_noncontiguous(g, {3, 5, 2}),
        sample_noncontiguous(g, {3, 5, 3})},
       plain, "non-contiguous q, k, v"},
      {{sample_randn(g, {2, 1, 8}), sample_randn(g, {2, 1, 8}), sample_randn(g, {2, 1, 8})},
       causal, "L = S = 1"},
      // Sizes past one tile of a flash-style kernel (the CUDA target's: 32 query rows, 64 keys).
      {{sample_randn(g, {2, 40, 16}), sample_randn(g, {2, 100, 16}), sample_randn(g, {2, 100, 8}),
        sample_bool_mask(g, {40, 100})},
       plain, "40 queries x 100 keys, bool mask"},
      {{sample_randn(g, {1, 2, 70, 8}), sample_randn(g, {1, 2, 70, 8}), sample_randn(g, {1, 2, 70, 40})},
       causal, "causal 70 x 70, Ev = 40"},
      // heads_last: [B, L, H, Ev] out, as the [B, S, H * D] reshape that follows wants it.
      {{sample_randn(g, {2, 3, 5, 8}), sample_randn(g, {2, 3, 7, 8}), sample_randn(g, {2, 3, 7, 4}),
        sample_float_mask(g, {2, 1, 1, 7})},
       {{"is_causal", false}, {"heads_last", true}}, "heads_last, float padding mask"},
      {{sample_randn(g, {2, 70, 16}), sample_randn(g, {2, 70, 16}), sample_randn(g, {2, 70, 16})},
       {{"is_causal", true}, {"heads_last", true}}, "heads_last, rank 3, causal 70 x 70"},
  };
}

}  // namespace

void register_attention_ops() {
  OpDef& d = define_op(OpId::ScaledDotProductAttention);
  d.doc = "softmax(q @ k^T * scale + mask) @ v; mask bool (true = attend) or float (added); "
          "is_causal: lower-triangular, top-left aligned; a fully masked row is NaN; heads_last: "
          "output [..., L, H, Ev] (the last batch dim after the sequence)";
  d.inputs = {{"q"}, {"k"}, {"v"}, {"mask", true}};
  d.attrs = {{"is_causal", AttrType::Bool, false}, {"scale", AttrType::Float, {}, true},
             {"heads_last", AttrType::Bool, false}};
  d.infer = infer_sdpa;
  d.reference = ref_sdpa;
  d.decompose = decompose_sdpa;
  d.eager_cpu = eager_sdpa;
  d.dtypes = float_dtypes();
  d.samples = samples_sdpa;
  d.tolerance_scale = 2.0;  // two chained reductions (over E, then S)
  d.onnx_ops = {"Attention"};
}

}  // namespace kiln
