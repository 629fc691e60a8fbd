// ONNX transformer ops composed from Kiln ops: Attention (opsets 23-25) and RotaryEmbedding
// (opset 23). See Note [ONNX attention].
//
// Note [ONNX attention]
// Attention follows ONNX's reference (and its function body, whose `_expanded` tests Kiln also
// passes) step by step:
//   - 3-D Q/K/V [B, S, heads * head] are split into heads ([B, heads, S, head]);
//   - past_key/past_value are concatenated in front of K/V (outputs present_key/value);
//   - an additive bias [.., q, kv] collects: the mask (bool -> 0 / -inf; float as is; a last
//     dim shorter than kv padded with -inf), the causal frontier j <= i + offset (offset = the
//     past length, or nonpad_kv_seqlen - q per batch for an external cache, else 0), the
//     sliding window (opset 25) and the padding of nonpad_kv_seqlen (opset 24);
//   - GQA/MQA repeat each K/V head q_heads / kv_heads times (interleaved: h0, h0, h1, h1, ...);
//   - scores = (Q * sqrt(scale)) @ (K * sqrt(scale))^T, softcap * tanh(scores / softcap),
//     + bias, softmax (in softmax_precision when given), rows whose bias is all -inf set to 0
//     (a fully masked query attends nothing and outputs 0, not NaN), @ V;
//   - the optional 4th output is the scores at the stage qk_matmul_output_mode names;
//   - 16-bit inputs compute in float32, rounded once at the end (present_key/value stay as
//     given).
// The masks are built from constant position grids and run-time tensors (nonpad_kv_seqlen is
// data), so nothing here needs values at import time.
#include <cmath>

#include "frontends/onnx/convert.h"

namespace kiln::onnx {
namespace {

// [B, S, heads * d] -> [B, heads, S, d].
V split_heads(NodeCtx& c, V x, int64_t heads, const char* what) {
  Shape s = c.shape(x);
  if (s[2].is_symbolic()) c.not_supported("{} has a symbolic hidden size {}", what, s[2].str());
  if (heads < 1 || s[2].value() % heads != 0)
    c.fail("{} hidden size {} does not split into {} heads", what, s[2].value(), heads);
  return c.permute(c.reshape(x, Shape{s[0], s[1], SymInt(heads), SymInt(s[2].value() / heads)}),
                   {0, 2, 1, 3});
}

// [B, kv, S, d] -> [B, kv * reps, S, d], each head repeated reps times in place.
V repeat_heads(NodeCtx& c, V x, int64_t reps) {
  if (reps == 1) return x;
  Shape s = c.shape(x);
  V u = c.unsqueeze(x, {2});
  Ints ex;
  for (SymInt d : Shape{s[0], s[1], SymInt(reps), s[2], s[3]}) ex.push_back(d.raw());
  return c.reshape(c.op1(OpId::Expand, {u}, {{"shape", ex}}), Shape{s[0], s[1] * SymInt(reps), s[2], s[3]});
}

// 0, 1, ..., n - 1 (int64) shaped as `shape`.
V iota(NodeCtx& c, int64_t n, const Shape& shape) {
  return c.reshape(c.constant(Tensor::arange(n)), shape);
}

// A [rows, cols] bool constant: allowed(i, j).
template <typename F>
V position_mask(NodeCtx& c, int64_t rows, int64_t cols, F allowed) {
  Tensor m = Tensor::empty(Dims{rows, cols}, DType::Bool);
  bool* p = m.data<bool>();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) p[i * cols + j] = allowed(i, j);
  return c.constant(m);
}

void conv_attention(NodeCtx& c) {
  V q = c.in(0), k = c.in(1), v = c.in(2), mask = c.in_opt(3), past_k = c.in_opt(4),
    past_v = c.in_opt(5);
  V nonpad = c.opset() >= 24 ? c.in_opt(6) : kNone;
  if (c.opset() < 24 && c.has_input(6)) c.fail("input 6 (nonpad_kv_seqlen) needs opset 24");
  bool causal = c.attr_int("is_causal", 0) != 0;
  std::optional<int64_t> q_heads_attr = c.attr_int_opt("q_num_heads"),
                         kv_heads_attr = c.attr_int_opt("kv_num_heads");
  int64_t mode = c.attr_int("qk_matmul_output_mode", 0);
  std::optional<double> scale_attr;
  if (c.has_attr("scale")) scale_attr = c.attr_float("scale", 0);
  double softcap = c.attr_float("softcap", 0);
  int64_t softmax_precision = c.attr_int("softmax_precision", 0);
  int64_t left = c.opset() >= 25 ? c.attr_int("left_window_size", -1) : -1;
  int64_t right = c.opset() >= 25 ? c.attr_int("right_window_size", -1) : -1;
  if (left < -1 || right < -1) c.fail("window sizes must be -1 or >= 0, got {} and {}", left, right);
  if (mode < 0 || mode > 3) c.fail("qk_matmul_output_mode must be 0..3, got {}", mode);
  if ((past_k == kNone) != (past_v == kNone)) c.fail("past_key and past_value go together");
  if (nonpad != kNone && past_k != kNone) c.fail("nonpad_kv_seqlen cannot be used with past_key");
  DType dt = c.dtype(q);
  if (!is_floating(dt)) c.fail("Q must be floating point, got {}", dtype_name(dt));

  int r = c.rank(q);
  if (r != c.rank(k) || r != c.rank(v) || (r != 3 && r != 4))
    c.fail("Q, K and V must all be 3-D or all 4-D, got ranks {}, {}, {}", r, c.rank(k), c.rank(v));
  if (r == 3) {
    if (!q_heads_attr || !kv_heads_attr) c.fail("3-D inputs need q_num_heads and kv_num_heads");
    q = split_heads(c, q, *q_heads_attr, "Q");
    k = split_heads(c, k, *kv_heads_attr, "K");
    v = split_heads(c, v, *kv_heads_attr, "V");
  } else if (c.opset() >= 25 && (q_heads_attr || kv_heads_attr)) {
    c.fail("q_num_heads and kv_num_heads must not be given for 4-D inputs");
  }
  Dims qd = c.dims(q, "Q");
  int64_t head = qd[3];
  double scale = scale_attr ? *scale_attr : 1.0 / std::sqrt(double(head));

  if (past_k != kNone) {
    k = c.op1(OpId::Concat, {past_k, k}, {{"dim", int64_t(2)}});
    v = c.op1(OpId::Concat, {past_v, v}, {{"dim", int64_t(2)}});
  }
  c.out(1, k);
  c.out(2, v);
  // 16-bit inputs are computed in float32 and rounded once at the end (the fused op's
  // precision; rounding every step in 16 bits is up to a few ulps off the exact result).
  DType out_dt = dt;
  if (dt == DType::Float16 || dt == DType::BFloat16) {
    dt = DType::Float32;
    q = c.cast(q, dt);
    k = c.cast(k, dt);
    v = c.cast(v, dt);
  }
  // sqrt(scale) rounded to Q's type, as the reference scales.
  V s = c.cast(c.scalar(std::sqrt(scale), out_dt), dt);
  Dims kd = c.dims(k, "K (with past)");
  int64_t qlen = qd[2], kvlen = kd[2], batch = qd[0];
  int64_t past_len = past_k != kNone ? c.dims(past_k, "past_key")[2] : 0;

  V ninf = c.scalar(-INFINITY, dt), zero = c.scalar(0, dt);
  auto to_bias = [&](V allowed) { return c.op1(OpId::Where, {allowed, zero, ninf}); };
  // The additive bias ([q, kv], or with leading dims from the mask / batch offsets).
  V bias = kNone;
  if (mask != kNone) {
    V m = c.dtype(mask) == DType::Bool ? to_bias(mask) : c.cast(mask, dt);
    SymInt last = c.shape(m)[size_t(c.rank(m) - 1)];
    if (last.is_symbolic()) c.not_supported("attn_mask with symbolic last dim {}", last.str());
    if (last.value() < kvlen) {  // padded to the total length with -inf
      std::vector<int64_t> pads = {0, kvlen - last.value()};
      m = c.op1(OpId::Pad, {m}, {{"pads", Ints(pads)}, {"mode", std::string("constant")},
                                 {"value", -INFINITY}});
    } else if (last.value() > kvlen) {
      c.fail("attn_mask's last dim {} exceeds the key length {}", last.value(), kvlen);
    }
    bias = m;
  }
  // Per-batch offsets (external cache) as [B, 1, 1] int64, else one scalar offset.
  V offsets = kNone;
  int64_t offset = past_len;
  if (nonpad != kNone) {
    offsets = c.reshape(c.sub(c.cast(nonpad, DType::Int64), c.scalar(double(qlen), DType::Int64)),
                        Shape{SymInt(batch), SymInt(1), SymInt(1)});
  }
  auto frontier = [&](auto allowed_scalar, auto allowed_tensor) {
    // allowed(i, j) for the scalar offset, or as a [B, 1, q, kv] tensor for per-batch ones.
    if (offsets == kNone) return to_bias(position_mask(c, qlen, kvlen, allowed_scalar));
    V i = iota(c, qlen, Shape{SymInt(qlen), SymInt(1)});
    V j = iota(c, kvlen, Shape{SymInt(1), SymInt(kvlen)});
    return c.unsqueeze(to_bias(allowed_tensor(c.add(i, offsets), j)), {1});
  };
  auto add_bias = [&](V b) { bias = bias == kNone ? b : c.add(bias, b); };
  if (causal)
    add_bias(frontier([&](int64_t i, int64_t j) { return j <= i + offset; },
                      [&](V pos, V j) { return c.op1(OpId::Le, {j, pos}); }));
  if (left >= 0 || right >= 0) {
    add_bias(frontier(
        [&](int64_t i, int64_t j) {
          int64_t diff = i + offset - j;
          return (left < 0 || diff <= left) && (right < 0 || -diff <= right);
        },
        [&](V pos, V j) {
          V diff = c.sub(pos, j);
          V ok = kNone;
          if (left >= 0) ok = c.op1(OpId::Le, {diff, c.scalar(double(left), DType::Int64)});
          if (right >= 0) {
            V r2 = c.op1(OpId::Ge, {diff, c.scalar(double(-right), DType::Int64)});
            ok = ok == kNone ? r2 : c.op1(OpId::And, {ok, r2});
          }
          return ok;
        }));
  }
  if (nonpad != kNone) {  // keys at or past nonpad_kv_seqlen[b] are padding
    V j = iota(c, kvlen, Shape{SymInt(1), SymInt(1), SymInt(1), SymInt(kvlen)});
    V len = c.reshape(c.cast(nonpad, DType::Int64), Shape{SymInt(batch), SymInt(1), SymInt(1), SymInt(1)});
    add_bias(to_bias(c.op1(OpId::Lt, {j, len})));
  }

  // GQA / MQA: repeat the K/V heads.
  int64_t qh = q_heads_attr && r == 3 ? *q_heads_attr : qd[1];
  int64_t kh = kd[1];
  if (qh != kh) {
    if (kh < 1 || qh % kh != 0) c.fail("{} query heads do not group over {} key/value heads", qh, kh);
    k = repeat_heads(c, k, qh / kh);
    v = repeat_heads(c, v, qh / kh);
  }

  V scores = c.op1(OpId::Matmul, {c.mul(q, s), c.permute(c.mul(k, s), {0, 1, 3, 2})});
  V qk_out = scores;  // mode 0
  if (softcap > 0) {
    V cap = c.scalar(softcap, dt);
    scores = c.mul(c.op1(OpId::Tanh, {c.div(scores, cap)}), cap);
    if (mode == 1) qk_out = scores;
  }
  if (bias != kNone) scores = c.add(scores, bias);
  if (mode == 2) qk_out = scores;
  V sm_in = scores;
  if (softmax_precision != 0) {
    DType sp = dt;
    if (!dtype_from_onnx(int32_t(softmax_precision), &sp) || !is_floating(sp))
      c.fail("softmax_precision {} is not a floating-point type", softmax_precision);
    sm_in = c.cast(scores, sp);
  }
  V probs = c.op1(OpId::Softmax, {sm_in}, {{"dim", int64_t(-1)}});
  if (bias != kNone) {  // fully masked rows attend nothing
    V row_max = c.op1(OpId::Max, {bias}, {{"dims", Ints{-1}}, {"keepdim", true}});
    V masked = c.op1(OpId::Eq, {row_max, ninf});
    probs = c.op1(OpId::Where, {masked, c.scalar(0, c.dtype(probs)), probs});
  }
  probs = c.cast(probs, dt);
  if (mode == 3) qk_out = probs;
  V y = c.op1(OpId::Matmul, {probs, v});
  if (r == 3) {
    Shape ys = c.shape(y);
    y = c.reshape(c.permute(y, {0, 2, 1, 3}), Shape{ys[0], ys[2], ys[1] * ys[3]});
  }
  c.out(0, c.cast(y, out_dt));
  if (c.wants_output(3)) c.out(3, c.cast(qk_out, out_dt));
}

// RotaryEmbedding (opset 23): x rotated pairwise by (cos, sin) per position, halves or
// interleaved pairs, on the first rotary_embedding_dim features of each head.
void conv_rotary_embedding(NodeCtx& c) {
  V x = c.in(0), cosv = c.in(1), sinv = c.in(2), pos = c.in_opt(3);
  bool interleaved = c.attr_int("interleaved", 0) != 0;
  int64_t rot = c.attr_int("rotary_embedding_dim", 0);
  int64_t heads = c.attr_int("num_heads", 0);
  int r = c.rank(x);
  Shape xs = c.shape(x);
  V h;  // [B, S, heads, head]
  if (r == 4) {
    h = c.permute(x, {0, 2, 1, 3});
  } else if (r == 3) {
    if (heads < 1) c.fail("3-D input needs num_heads");
    if (xs[2].is_symbolic() || xs[2].value() % heads != 0)
      c.fail("hidden size {} does not split into {} heads", xs[2].str(), heads);
    h = c.reshape(x, Shape{xs[0], xs[1], SymInt(heads), SymInt(xs[2].value() / heads)});
  } else {
    c.fail("input must be 3-D or 4-D, got rank {}", r);
  }
  Dims hd = c.dims(h, "input");
  int64_t head = hd[3];
  if (rot == 0) rot = head;
  if (rot < 2 || rot > head || rot % 2 != 0)
    c.fail("rotary_embedding_dim {} must be even and at most the head size {}", rot, head);
  if (pos != kNone) {  // caches indexed by position: [max_pos, rot/2] -> [B, S, rot/2]
    cosv = c.op1(OpId::Embedding, {cosv, c.cast(pos, DType::Int64)});
    sinv = c.op1(OpId::Embedding, {sinv, c.cast(pos, DType::Int64)});
  }
  if (c.shape(cosv)[size_t(c.rank(cosv) - 1)] != SymInt(rot / 2))
    c.fail("the cos/sin caches' last dim must be rotary_embedding_dim / 2 = {}", rot / 2);
  cosv = c.unsqueeze(cosv, {2});
  sinv = c.unsqueeze(sinv, {2});
  V xr = c.slice(h, 3, 0, rot);
  V x1, x2;
  if (interleaved) {
    x1 = c.slice(xr, 3, 0, rot, 2);
    x2 = c.slice(xr, 3, 1, rot, 2);
  } else {
    x1 = c.slice(xr, 3, 0, rot / 2);
    x2 = c.slice(xr, 3, rot / 2, rot);
  }
  V re = c.sub(c.mul(cosv, x1), c.mul(sinv, x2));
  V im = c.add(c.mul(sinv, x1), c.mul(cosv, x2));
  V rotated;
  if (interleaved) {  // [.., rot/2, 2] -> [.., rot]
    V pair = c.op1(OpId::Concat, {c.unsqueeze(re, {4}), c.unsqueeze(im, {4})}, {{"dim", int64_t(4)}});
    rotated = c.reshape(pair, Shape{SymInt(hd[0]), SymInt(hd[1]), SymInt(hd[2]), SymInt(rot)});
  } else {
    rotated = c.op1(OpId::Concat, {re, im}, {{"dim", int64_t(3)}});
  }
  V y = rot == head ? rotated
                    : c.op1(OpId::Concat, {rotated, c.slice(h, 3, rot, head)}, {{"dim", int64_t(3)}});
  c.out(0, r == 4 ? c.permute(y, {0, 2, 1, 3}) : c.reshape(y, xs));
}

}  // namespace

void add_attention_converters(std::vector<OnnxOpEntry>& t) {
  using enum OpId;
  t.push_back({"Attention", conv_attention,
               {Reshape, Permute, Unsqueeze, Expand, Concat, Where, Cast, Pad, Add, Sub, Le, Ge,
                Lt, And, Matmul, Mul, Div, Tanh, Softmax, Max, Eq},
               "matmul/softmax with an additive bias from masks, causal frontier, window and "
               "padding; GQA by repeating heads; see Note [ONNX attention]"});
  t.push_back({"RotaryEmbedding", conv_rotary_embedding,
               {Permute, Reshape, Embedding, Cast, Unsqueeze, Slice, Mul, Sub, Add, Concat},
               "halves or interleaved pairs rotated by cos/sin"});
}

}  // namespace kiln::onnx
