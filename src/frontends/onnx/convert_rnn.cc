// ONNX RNN, GRU and LSTM, unrolled over the (import-time) sequence length into matmuls and
// pointwise ops: the input projection of every step is one matmul; each step adds the
// recurrent projection and applies the gates. sequence_lens masks finished sequences (their
// state stops changing, their outputs are zero); the reverse direction runs on each sequence
// reversed within its own length. Layouts 0 and 1 and bidirectional are supported.
#include "frontends/onnx/convert.h"

namespace kiln::onnx {
namespace {

enum class Cell { Rnn, Gru, Lstm };

struct Activation {
  std::string name;
  double alpha = 0, beta = 0;
};

// Activations with their alpha/beta (consumed in order by the functions that take them, as
// ONNX Runtime does).
std::vector<Activation> activations(NodeCtx& c, int per_dir, int dirs, std::vector<std::string> def) {
  std::vector<std::string> names = c.attr_strings("activations");
  std::vector<double> alphas = c.attr_floats("activation_alpha"), betas = c.attr_floats("activation_beta");
  if (names.empty())
    for (int d = 0; d < dirs; ++d) names.insert(names.end(), def.begin(), def.end());
  if (int(names.size()) != per_dir * dirs)
    c.fail("activations has {} entries, expected {} ({} per direction)", names.size(), per_dir * dirs, per_dir);
  std::vector<Activation> out;
  size_t ai = 0, bi = 0;
  for (std::string n : names) {
    for (char& ch : n) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    Activation a{n};
    auto take = [&](std::vector<double>& v, size_t& i, double def_v) { return i < v.size() ? v[i++] : def_v; };
    if (n == "leakyrelu") a.alpha = take(alphas, ai, 0.01);
    else if (n == "thresholdedrelu") a.alpha = take(alphas, ai, 1.0);
    else if (n == "elu") a.alpha = take(alphas, ai, 1.0);
    else if (n == "hardsigmoid") a.alpha = take(alphas, ai, 0.2), a.beta = take(betas, bi, 0.5);
    else if (n == "affine" || n == "scaledtanh") a.alpha = take(alphas, ai, 1.0), a.beta = take(betas, bi, 0.0);
    else if (n != "sigmoid" && n != "tanh" && n != "relu" && n != "softsign" && n != "softplus")
      c.not_supported("activation \"{}\"", n);
    out.push_back(a);
  }
  return out;
}

V activate(NodeCtx& c, const Activation& a, V x) {
  DType dt = c.dtype(x);
  auto s = [&](double v) { return c.scalar(v, dt); };
  const std::string& n = a.name;
  if (n == "sigmoid") return c.op1(OpId::Sigmoid, {x});
  if (n == "tanh") return c.op1(OpId::Tanh, {x});
  if (n == "relu") return c.op1(OpId::Relu, {x});
  if (n == "leakyrelu") return c.op1(OpId::Where, {c.op1(OpId::Lt, {x, s(0)}), c.mul(x, s(a.alpha)), x});
  if (n == "thresholdedrelu") return c.op1(OpId::Where, {c.op1(OpId::Gt, {x, s(a.alpha)}), x, s(0)});
  if (n == "elu")
    return c.op1(OpId::Where, {c.op1(OpId::Lt, {x, s(0)}),
                               c.mul(c.sub(c.op1(OpId::Exp, {x}), s(1)), s(a.alpha)), x});
  if (n == "hardsigmoid")
    return c.op1(OpId::Clamp, {c.add(c.mul(x, s(a.alpha)), s(a.beta))}, {{"min", 0.0}, {"max", 1.0}});
  if (n == "affine") return c.add(c.mul(x, s(a.alpha)), s(a.beta));
  if (n == "scaledtanh") return c.mul(c.op1(OpId::Tanh, {c.mul(x, s(a.beta))}), s(a.alpha));
  if (n == "softsign") return c.div(x, c.add(c.op1(OpId::Abs, {x}), s(1)));
  // softplus
  V t = c.op1(OpId::Exp, {c.op1(OpId::Neg, {c.op1(OpId::Abs, {x})})});
  return c.add(c.op1(OpId::Relu, {x}), c.op1(OpId::Log, {c.add(t, s(1))}));
}

template <Cell K>
void conv_rnn(NodeCtx& c) {
  V x = c.in(0), w = c.in(1), r = c.in(2), b = c.in_opt(3), lens = c.in_opt(4), h0 = c.in_opt(5);
  V c0 = K == Cell::Lstm ? c.in_opt(6) : kNone, peep = K == Cell::Lstm ? c.in_opt(7) : kNone;
  int gates = K == Cell::Rnn ? 1 : K == Cell::Gru ? 3 : 4;
  std::string direction = c.attr_string("direction", "forward");
  int dirs = direction == "bidirectional" ? 2 : 1;
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
    c.fail("direction must be forward, reverse or bidirectional, got \"{}\"", direction);
  int64_t hs = c.attr_int("hidden_size", 0);
  int64_t layout = c.attr_int("layout", 0);
  double clip = c.attr_float("clip", 0.0);
  bool lbr = K == Cell::Gru && c.attr_int("linear_before_reset", 0) != 0;
  if (K == Cell::Lstm && c.attr_int("input_forget", 0) != 0) c.not_supported("input_forget = 1");
  std::vector<Activation> acts =
      K == Cell::Rnn ? activations(c, 1, dirs, {"Tanh"})
      : K == Cell::Gru ? activations(c, 2, dirs, {"Sigmoid", "Tanh"})
                       : activations(c, 3, dirs, {"Sigmoid", "Tanh", "Tanh"});
  if (c.rank(x) != 3) c.fail("X must be 3-D, got rank {}", c.rank(x));
  if (layout == 1) x = c.permute(x, {1, 0, 2});  // -> [seq, batch, input]
  else if (layout != 0) c.fail("layout must be 0 or 1, got {}", layout);
  Dims xd = c.dims(x, "X"), wd = c.dims(w, "W");
  int64_t seq = xd[0], batch = xd[1], in = xd[2];
  if (hs <= 0) hs = wd[1] / gates;
  if (wd.size() != 3 || wd[0] != dirs || wd[1] != gates * hs || wd[2] != in)
    c.fail("W must be [{}, {}, {}], got {}", dirs, gates * hs, in, to_string(wd));
  DType dt = c.dtype(x);
  auto state0 = [&](V s) -> V {  // [dirs, batch, H] in layout 0
    if (s == kNone) return kNone;
    return layout == 1 ? c.permute(s, {1, 0, 2}) : s;
  };
  V h_init = state0(h0), c_init = state0(c0);
  V mask_lens = lens == kNone ? kNone : c.cast(lens, DType::Int64);
  auto pre = [&](V v) {  // cell clip on pre-activations
    return clip > 0 ? c.op1(OpId::Clamp, {v}, {{"min", -clip}, {"max", clip}}) : v;
  };
  auto gate = [&](V all, int g) { return c.slice(all, 1, g * hs, (g + 1) * hs); };

  // Per-batch reversal within each sequence's length: src[t, b] = t < len ? len-1-t : t.
  auto reverse_time = [&](V v) {
    if (mask_lens == kNone) {
      std::vector<int64_t> idx;
      for (int64_t t = seq - 1; t >= 0; --t) idx.push_back(t);
      return c.op1(OpId::IndexSelect, {v, c.constant(Tensor::from_vector(idx, Dims{seq}))}, {{"dim", int64_t(0)}});
    }
    Dims vd = c.dims(v, "sequence");
    V t = c.reshape(c.constant(Tensor::arange(seq)), Shape{seq, 1, 1});
    V l = c.reshape(mask_lens, Shape{1, batch, 1});
    V src = c.op1(OpId::Where, {c.op1(OpId::Lt, {t, l}), c.sub(c.sub(l, c.scalar(1, DType::Int64)), t), t});
    src = c.op1(OpId::Expand, {src}, {{"shape", Ints{vd[0], vd[1], vd[2]}}});
    return c.op1(OpId::Gather, {v, src}, {{"dim", int64_t(0)}});
  };

  std::vector<V> ys, hs_last, cs_last;
  for (int d = 0; d < dirs; ++d) {
    bool reverse = direction == "reverse" || d == 1;
    V wd_ = c.squeeze(c.slice(w, 0, d, d + 1), {0});  // [G*H, I]
    V rd_ = c.squeeze(c.slice(r, 0, d, d + 1), {0});  // [G*H, H]
    V wt = c.permute(wd_, {1, 0}), rt = c.permute(rd_, {1, 0});
    V xs = reverse ? reverse_time(x) : x;
    // Input projection of every step at once: [seq, batch, G*H].
    V xw = c.op1(OpId::Matmul, {xs, wt});
    V wb = kNone, rb = kNone;
    if (b != kNone) {
      V bd = c.squeeze(c.slice(b, 0, d, d + 1), {0});  // [2*G*H]
      wb = c.slice(bd, 0, 0, gates * hs);
      rb = c.slice(bd, 0, gates * hs, 2 * gates * hs);
      if (!(K == Cell::Gru && lbr)) {
        xw = c.add(xw, c.add(wb, rb));
        rb = kNone;
      } else {
        // linear_before_reset: Rbh goes inside the reset product; Rbz and Rbr add as usual.
        V rb_zr = c.op1(OpId::Concat, {c.slice(rb, 0, 0, 2 * hs), c.full(Shape{hs}, 0, dt)},
                        {{"dim", int64_t(0)}});
        xw = c.add(xw, c.add(wb, rb_zr));
      }
    }
    V h = h_init == kNone ? c.full(Shape{batch, hs}, 0, dt) : c.squeeze(c.slice(h_init, 0, d, d + 1), {0});
    V cell = kNone;
    if (K == Cell::Lstm)
      cell = c_init == kNone ? c.full(Shape{batch, hs}, 0, dt) : c.squeeze(c.slice(c_init, 0, d, d + 1), {0});
    V pi = kNone, po = kNone, pf = kNone;
    if (peep != kNone) {
      V pd = c.squeeze(c.slice(peep, 0, d, d + 1), {0});
      pi = c.slice(pd, 0, 0, hs), po = c.slice(pd, 0, hs, 2 * hs), pf = c.slice(pd, 0, 2 * hs, 3 * hs);
    }
    const Activation* a = &acts[size_t(d * (K == Cell::Rnn ? 1 : K == Cell::Gru ? 2 : 3))];
    std::vector<V> steps;
    for (int64_t t = 0; t < seq; ++t) {
      V xt = c.squeeze(c.slice(xw, 0, t, t + 1), {0});  // [batch, G*H]
      V hr = c.op1(OpId::Matmul, {h, rt});               // [batch, G*H]
      V h_new, c_new = kNone;
      if (K == Cell::Rnn) {
        h_new = activate(c, a[0], pre(c.add(xt, hr)));
      } else if (K == Cell::Gru) {
        V z = activate(c, a[0], pre(c.add(gate(xt, 0), gate(hr, 0))));
        V rr = activate(c, a[0], pre(c.add(gate(xt, 1), gate(hr, 1))));
        V hh;
        if (lbr) {
          V rec = gate(hr, 2);
          if (rb != kNone) rec = c.add(rec, c.slice(rb, 0, 2 * hs, 3 * hs));
          hh = activate(c, a[1], pre(c.add(gate(xt, 2), c.mul(rr, rec))));
        } else {
          V rh = c.slice(rd_, 0, 2 * hs, 3 * hs);  // [H, H]
          V rec = c.op1(OpId::Matmul, {c.mul(rr, h), c.permute(rh, {1, 0})});
          hh = activate(c, a[1], pre(c.add(gate(xt, 2), rec)));
        }
        V one = c.scalar(1, dt);
        h_new = c.add(c.mul(c.sub(one, z), hh), c.mul(z, h));
      } else {
        V gi = c.add(gate(xt, 0), gate(hr, 0)), go = c.add(gate(xt, 1), gate(hr, 1));
        V gf = c.add(gate(xt, 2), gate(hr, 2)), gc = c.add(gate(xt, 3), gate(hr, 3));
        if (pi != kNone) gi = c.add(gi, c.mul(pi, cell)), gf = c.add(gf, c.mul(pf, cell));
        V it = activate(c, a[0], pre(gi)), ft = activate(c, a[0], pre(gf));
        V ct = activate(c, a[1], pre(gc));
        c_new = c.add(c.mul(ft, cell), c.mul(it, ct));
        if (po != kNone) go = c.add(go, c.mul(po, c_new));
        V ot = activate(c, a[0], pre(go));
        h_new = c.mul(ot, activate(c, a[2], c_new));
      }
      V y_t = h_new;
      if (mask_lens != kNone) {  // finished sequences keep their state and output zeros
        V live = c.reshape(c.op1(OpId::Lt, {c.scalar(double(t), DType::Int64), mask_lens}), Shape{batch, 1});
        h_new = c.op1(OpId::Where, {live, h_new, h});
        if (c_new != kNone) c_new = c.op1(OpId::Where, {live, c_new, cell});
        y_t = c.op1(OpId::Where, {live, y_t, c.scalar(0, dt)});
      }
      h = h_new;
      if (K == Cell::Lstm) cell = c_new;
      steps.push_back(c.unsqueeze(y_t, {0}));
    }
    V y = steps.size() == 1 ? steps[0] : c.op1(OpId::Concat, steps, {{"dim", int64_t(0)}});  // [seq, batch, H]
    if (reverse) y = reverse_time(y);
    ys.push_back(c.unsqueeze(y, {1}));
    hs_last.push_back(c.unsqueeze(h, {0}));
    if (K == Cell::Lstm) cs_last.push_back(c.unsqueeze(cell, {0}));
  }
  auto cat = [&](std::vector<V>& v, int64_t dim) {
    return v.size() == 1 ? v[0] : c.op1(OpId::Concat, v, {{"dim", dim}});
  };
  V y = cat(ys, 1);       // [seq, dirs, batch, H]
  V yh = cat(hs_last, 0);  // [dirs, batch, H]
  if (layout == 1) {
    y = c.permute(y, {2, 0, 1, 3});
    yh = c.permute(yh, {1, 0, 2});
  }
  c.out(0, y);
  c.out(1, yh);
  if (K == Cell::Lstm) {
    V yc = cat(cs_last, 0);
    c.out(2, layout == 1 ? c.permute(yc, {1, 0, 2}) : yc);
  }
}

}  // namespace

void add_rnn_converters(std::vector<OnnxOpEntry>& t) {
  using enum OpId;
  std::vector<OpId> ops = {Permute, Squeeze, Slice, Matmul, Add, Mul, Sub, Expand, Cast, Reshape,
                           Where, Lt, Gt, IndexSelect, Gather, Concat, Unsqueeze, Clamp, Sigmoid,
                           Tanh, Relu, Exp, Abs, Neg, Log, Div};
  t.push_back({"RNN", conv_rnn<Cell::Rnn>, ops, "unrolled over the sequence"});
  t.push_back({"GRU", conv_rnn<Cell::Gru>, ops, "unrolled over the sequence"});
  t.push_back({"LSTM", conv_rnn<Cell::Lstm>, ops, "unrolled over the sequence"});
}

}  // namespace kiln::onnx
