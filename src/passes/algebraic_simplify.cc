#include "passes/algebraic_simplify.h"

#include <cmath>
#include <numeric>
#include <optional>

#include "passes/graph_rewrite.h"

namespace kiln {

bool cast_is_exact(DType from, DType to) {
  if (from == to || from == DType::Bool) return true;
  switch (from) {
    case DType::Float16:
    case DType::BFloat16: return to == DType::Float32 || to == DType::Float64;
    case DType::Float32: return to == DType::Float64;
    case DType::Int8:
    case DType::UInt8:
      return to == DType::Int32 || to == DType::Int64 || is_floating(to);
    case DType::Int32: return to == DType::Int64 || to == DType::Float64;
    default: return false;
  }
}

namespace {

// What a rule makes of a node: nothing, an existing (new-graph) value, or one new node (with
// `pre`: a node made first, which the new node reads as its first input).
struct Rewrite {
  enum Kind { None, UseValue, NewNode } kind = None;
  ValueId value = kNoValue;
  OpId op{};
  std::vector<ValueId> inputs;
  Attrs attrs;
  struct Pre {
    OpId op{};
    std::vector<ValueId> inputs;
    Attrs attrs;
  };
  std::optional<Pre> pre;

  static Rewrite use(ValueId v) { return {UseValue, v, {}, {}, {}, {}}; }
  static Rewrite node(OpId op, std::vector<ValueId> inputs, Attrs attrs) {
    return {NewNode, kNoValue, op, std::move(inputs), std::move(attrs), {}};
  }
};

struct Match {
  const GraphBuilder& b;
  const Node& node;                 // the old node
  const std::vector<ValueId>& in;   // its inputs, as new-graph values
  const TensorType& out;            // its (single) output type

  const TensorType& type(size_t i) const { return b.dst().type(in[i]); }
  // The new-graph node producing input i, if it is `op`.
  const Node* input_from(size_t i, OpId op) const {
    const Node* p = b.producer_of(in[i]);
    return p && p->op == op ? p : nullptr;
  }
};

using RuleFn = Rewrite (*)(const Match&);
struct Rule {
  OpId op;
  const char* pattern;
  RuleFn apply;
};

// Cap on the elements of a const checked for "all ones/zeros".
constexpr int64_t kMaxScanElements = 1 << 20;

// Whether new-graph value v is a const whose every element equals `value`.
bool const_all(const GraphBuilder& b, ValueId v, double value) {
  if (v == kNoValue || b.dst().value(v).kind != ValueKind::Const) return false;
  Tensor t = b.data_of(v);
  if (!t.defined() || t.numel() > kMaxScanElements || t.dtype() == DType::Bool) return false;
  if (!t.device().is_cpu()) t = t.to(Device::cpu());
  t = t.contiguous();
  const char* p = static_cast<const char*>(t.raw_data());
  for (int64_t i = 0; i < t.numel(); ++i)
    if (load_f64(p + i * t.element_size(), t.dtype()) != value) return false;
  return true;
}

bool same_value_type(const TensorType& a, const TensorType& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.device == b.device;
}

// x if the node's output type is x's type (the op is then the identity on it).
Rewrite identity_of(const Match& m, size_t x) {
  return same_value_type(m.type(x), m.out) ? Rewrite::use(m.in[x]) : Rewrite();
}

// ---- arithmetic identities --------------------------------------------------------------------
template <int kValue>
Rewrite rhs_neutral(const Match& m) {
  return const_all(m.b, m.in[1], kValue) ? identity_of(m, 0) : Rewrite();
}
template <int kValue>
Rewrite lhs_neutral(const Match& m) {
  return const_all(m.b, m.in[0], kValue) ? identity_of(m, 1) : Rewrite();
}

Rewrite double_neg(const Match& m) {
  const Node* inner = m.input_from(0, OpId::Neg);
  return inner ? Rewrite::use(inner->inputs[0]) : Rewrite();
}

Rewrite double_not(const Match& m) {
  const Node* inner = m.input_from(0, OpId::Not);
  if (!inner || m.b.dst().type(inner->inputs[0]).dtype != DType::Bool) return Rewrite();
  return identity_of(Match{m.b, m.node, inner->inputs, m.out}, 0);
}

// ---- shape identities -------------------------------------------------------------------------
Rewrite same_shape_identity(const Match& m) { return identity_of(m, 0); }

Rewrite zero_pad(const Match& m) {
  for (int64_t p : m.node.attrs.get_ints("pads"))
    if (p != 0) return Rewrite();
  return identity_of(m, 0);
}

// Note [identity pools]: a pooling window of one element (1x1, stride 1, no padding; or an
// adaptive average pool to the input's own size) takes each element alone: max is that element
// (NaN included), average is element / 1. ONNX exports of AlexNet write its adaptive pool to
// 6x6 of a 6x6 map as a 1x1 AveragePool, which ran as a oneDNN pool and a reorder back to NCHW
// (0.034 ms at 2 threads, 39x its floor). The one difference: the reference's average starts
// its sum at +0, so an element -0 comes back +0 (equal as numbers).
Rewrite identity_pool(const Match& m) {
  if (m.node.op != OpId::AdaptiveAvgPool2d) {
    const Attrs& a = m.node.attrs;
    auto ones = [&](const char* name, bool empty_ok) {
      if (!a.has(name)) return empty_ok;
      const Ints& v = a.get_ints(name);
      if (v.empty()) return empty_ok;
      for (int64_t x : v)
        if (x != 1) return false;
      return true;
    };
    const bool unpadded = !a.has("padding") || all_equal(a.get_ints("padding"), 0);
    if (!ones("kernel_size", false) || !ones("stride", true) || !unpadded) return Rewrite();
  }
  return identity_of(m, 0);  // same shape and dtype (for adaptive: output size = input size)
}

// Note [subsampling pools]: a 1x1 window at stride (sh, sw) without padding takes x[i * sh,
// j * sw] alone, as slices with those steps do; every window starts inside the input, so
// ceil_mode keeps no extra one and there are ceil(H / sh) rows either way (checked against the
// node's type). FPN's LastLevelMaxPool (torchvision's detection backbones) is
// max_pool2d(kernel 1, stride 2): a oneDNN pool and reorder of 0.022 ms at one thread, 9.4x its
// floor; as strided views it is at most one copy. An average differs only in -0 -> +0, as in
// Note [identity pools].
Rewrite subsampling_pool(const Match& m) {
  const Attrs& a = m.node.attrs;
  const Ints& k = a.get_ints("kernel_size");
  const Ints stride = a.has("stride") ? a.get_ints("stride") : Ints{};
  const bool unpadded = !a.has("padding") || all_equal(a.get_ints("padding"), 0);
  if (k.size() != 2 || k[0] != 1 || k[1] != 1 || stride.size() != 2 || !unpadded) return Rewrite();
  const TensorType& x = m.type(0);
  if (x.rank() != 4 || !is_concrete(x.shape) || !is_concrete(m.out.shape)) return Rewrite();
  const int64_t h = x.shape[2].value(), w = x.shape[3].value();
  const int64_t sh = stride[0], sw = stride[1];
  if (sh < 1 || sw < 1 || (sh == 1 && sw == 1)) return Rewrite();
  if (m.out.shape[2].value() != (h + sh - 1) / sh || m.out.shape[3].value() != (w + sw - 1) / sw ||
      m.out.dtype != x.dtype)
    return Rewrite();
  auto slice = [](int64_t dim, int64_t step) {
    return Attrs{{"dim", dim}, {"start", int64_t(0)}, {"end", INT64_MAX}, {"step", step}};
  };
  if (sh == 1) return Rewrite::node(OpId::Slice, {m.in[0]}, slice(3, sw));
  if (sw == 1) return Rewrite::node(OpId::Slice, {m.in[0]}, slice(2, sh));
  Rewrite r = Rewrite::node(OpId::Slice, {}, slice(2, sh));
  r.pre = Rewrite::Pre{OpId::Slice, {m.in[0]}, slice(3, sw)};
  return r;
}

Rewrite single_concat(const Match& m) { return m.in.size() == 1 ? identity_of(m, 0) : Rewrite(); }

// The permutation a permute/transpose node applies (out dim i = in dim perm[i]); empty when the
// attributes are not plain axes.
std::vector<int> permutation_of(const Node& n, int rank) {
  std::vector<int> perm(static_cast<size_t>(rank));
  std::iota(perm.begin(), perm.end(), 0);
  auto axis = [&](int64_t a) { return int(a < 0 ? a + rank : a); };
  if (n.op == OpId::Transpose) {
    int a = axis(n.attrs.get_int("dim0")), c = axis(n.attrs.get_int("dim1"));
    if (a < 0 || a >= rank || c < 0 || c >= rank) return {};
    std::swap(perm[size_t(a)], perm[size_t(c)]);
  } else {
    const Ints& dims = n.attrs.get_ints("dims");
    if (int(dims.size()) != rank) return {};
    for (int i = 0; i < rank; ++i) perm[size_t(i)] = axis(dims[size_t(i)]);
  }
  return perm;
}

bool is_identity(const std::vector<int>& perm) {
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] != int(i)) return false;
  return true;
}

Rewrite identity_permutation(const Match& m) {
  std::vector<int> perm = permutation_of(m.node, m.type(0).rank());
  return !perm.empty() && is_identity(perm) ? identity_of(m, 0) : Rewrite();
}

// permute/transpose of permute/transpose: z = P_q(P_p(x)) has z dim i = x dim p[q[i]].
Rewrite compose_permutations(const Match& m) {
  const Node* inner = m.input_from(0, OpId::Permute);
  if (!inner) inner = m.input_from(0, OpId::Transpose);
  if (!inner) return Rewrite();
  int rank = m.out.rank();
  std::vector<int> p = permutation_of(*inner, rank), q = permutation_of(m.node, rank);
  if (p.empty() || q.empty()) return Rewrite();
  Ints composed;
  for (int i = 0; i < rank; ++i) composed.push_back(p[size_t(q[size_t(i)])]);
  ValueId x = inner->inputs[0];
  std::vector<int> c(composed.begin(), composed.end());
  if (is_identity(c)) return Rewrite::use(x);
  return Rewrite::node(OpId::Permute, {x}, {{"dims", composed}});
}

// reshape(reshape-like(x)) -> reshape(x): reshapes keep row-major element order, so only the
// last target shape matters (its -1, if any, resolves the same: the element count is equal).
// The whole run of reshape-likes is skipped, and a run that ends where it started is x itself.
bool reshape_like(OpId op) {
  return op == OpId::Reshape || op == OpId::Flatten || op == OpId::Squeeze ||
         op == OpId::Unsqueeze;
}
Rewrite reshape_of_reshape(const Match& m) {
  const Node* inner = m.b.producer_of(m.in[0]);
  if (!inner || !reshape_like(inner->op)) return Rewrite();
  ValueId x = inner->inputs[0];
  for (const Node* p = m.b.producer_of(x); p && reshape_like(p->op); p = m.b.producer_of(x))
    x = p->inputs[0];
  if (same_value_type(m.b.dst().type(x), m.out)) return Rewrite::use(x);
  return Rewrite::node(OpId::Reshape, {x}, {{"shape", m.node.attrs.get_ints("shape")}});
}

// ---- casts ------------------------------------------------------------------------------------
Rewrite cast_to_same(const Match& m) {
  return m.type(0).dtype == m.out.dtype ? identity_of(m, 0) : Rewrite();
}

Rewrite exact_cast_chain(const Match& m) {
  const Node* inner = m.input_from(0, OpId::Cast);
  if (!inner) return Rewrite();
  ValueId x = inner->inputs[0];
  DType from = m.b.dst().type(x).dtype, via = inner->attrs.get_dtype("dtype");
  if (!cast_is_exact(from, via)) return Rewrite();
  if (from == m.out.dtype) return Rewrite::use(x);
  return Rewrite::node(OpId::Cast, {x}, {{"dtype", m.out.dtype}});
}

// ---- composed activations -------------------------------------------------------------------
// The value of a scalar float param or const (one element) of the new graph.
std::optional<double> scalar_data(const GraphBuilder& b, ValueId v) {
  if (v == kNoValue) return std::nullopt;
  ValueKind k = b.dst().value(v).kind;
  if (k != ValueKind::Const && k != ValueKind::Param) return std::nullopt;
  Tensor t = b.data_of(v);
  if (!t.defined() || !t.has_storage() || t.numel() != 1 || !is_floating(t.dtype()))
    return std::nullopt;
  if (!t.device().is_cpu()) t = t.to(Device::cpu());
  t = t.contiguous();
  return load_f64(t.raw_data(), t.dtype());
}

// Whether v is a scalar within a float32 rounding (and a little) of `want`.
bool scalar_near(const GraphBuilder& b, ValueId v, double want) {
  std::optional<double> x = scalar_data(b, v);
  return x && std::fabs(*x - want) <= 1e-6 * std::fabs(want);
}

// gelu(x) with `approximate` when the mul m is x * 0.5 * t in any association of its three
// factors (one of its two inputs opened if that is a mul) and x_of(t) is that x.
template <typename XOf>
Rewrite half_x_times(const Match& m, XOf&& x_of, const char* approximate) {
  const GraphBuilder& b = m.b;
  for (int open = 0; open < 2; ++open) {
    const Node* inner = m.input_from(size_t(open), OpId::Mul);
    if (!inner || inner->inputs.size() != 2) continue;
    ValueId f[3] = {inner->inputs[0], inner->inputs[1], m.in[size_t(1 - open)]};
    for (int half = 0; half < 3; ++half) {
      if (!scalar_near(b, f[half], 0.5)) continue;
      ValueId a = f[(half + 1) % 3], c = f[(half + 2) % 3];
      for (int swap = 0; swap < 2; ++swap, std::swap(a, c)) {
        // a: x, c: the factor x_of opens.
        if (x_of(c) != a || !same_value_type(b.dst().type(a), m.out)) continue;
        return Rewrite::node(OpId::Gelu, {a}, {{"approximate", std::string(approximate)}});
      }
    }
  }
  return Rewrite();
}

// Note [erf GELU]: exporters write GELU (approximate="none") as its formula,
//   x * (0.5 * (1 + erf(x / sqrt(2))))   (torch.onnx: Div, Erf, Add, Mul, Mul)
// in any association of the three factors x, 0.5 and (1 + erf(...)), with x / sqrt(2) also as
// x * (1 / sqrt(2)). As one gelu node it fuses into a linear or convolution before it (a oneDNN
// post-op, fuse-epilogues) instead of a loop kernel over the whole activation. The rule matches
// at the outer mul: its factors, with one of its two inputs opened if that is a mul, must be
// exactly x, the scalar 0.5 and 1 + erf(u) with u = x / sqrt(2) for that same x. The factor
// nodes stay for their other uses (dce drops them otherwise). Unlike the identities above, the
// scalars may be params: ONNX exports hold them as initializers. A graph is compiled for its
// params' values (capture guards them), and replace-weights reruns the passes and checks that
// they make the package's constants, so a changed 0.5 cannot silently keep a gelu.
Rewrite erf_gelu(const Match& m) {
  const GraphBuilder& b = m.b;
  if (!is_floating(m.out.dtype)) return Rewrite();
  // x from u = x / sqrt(2) or x * (1 / sqrt(2)).
  auto x_of_scaled = [&](ValueId u) -> ValueId {
    const Node* n = b.producer_of(u);
    if (!n || n->inputs.size() != 2) return kNoValue;
    if (n->op == OpId::Div && scalar_near(b, n->inputs[1], std::sqrt(2.0))) return n->inputs[0];
    if (n->op == OpId::Mul) {
      if (scalar_near(b, n->inputs[1], std::sqrt(0.5))) return n->inputs[0];
      if (scalar_near(b, n->inputs[0], std::sqrt(0.5))) return n->inputs[1];
    }
    return kNoValue;
  };
  // x if t = 1 + erf(x / sqrt(2)) (either order of the add).
  auto x_of_one_plus_erf = [&](ValueId t) -> ValueId {
    const Node* add = b.producer_of(t);
    if (!add || add->op != OpId::Add || add->inputs.size() != 2) return kNoValue;
    for (int i = 0; i < 2; ++i) {
      if (!scalar_near(b, add->inputs[size_t(1 - i)], 1.0)) continue;
      const Node* erf = b.producer_of(add->inputs[size_t(i)]);
      if (erf && erf->op == OpId::Erf) return x_of_scaled(erf->inputs[0]);
    }
    return kNoValue;
  };
  return half_x_times(m, x_of_one_plus_erf, "none");
}

// Note [tanh GELU]: GPT-2's activation (HF's NewGELUActivation; torch's
// gelu(approximate="tanh")) exported as its formula,
//   x * (0.5 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))))
// with x^3 as pow(x, 3), in any association of the three outer factors (as Note [erf GELU]),
// either operand order of every add and mul. As one gelu node it fuses into the linear before
// it (oneDNN's gelu_tanh post-op): GPT-2's MLP activation was a loop kernel of eight ops with a
// vector pow, 1.1 ms of 116 (65x its roofline, `kiln profile`).
Rewrite tanh_gelu(const Match& m) {
  const GraphBuilder& b = m.b;
  if (!is_floating(m.out.dtype)) return Rewrite();
  // The operand of binary node n (op `op`) that is not the scalar `want` (either order).
  auto other_than_scalar = [&](const Node* n, OpId op, double want) -> ValueId {
    if (!n || n->op != op || n->inputs.size() != 2) return kNoValue;
    if (scalar_near(b, n->inputs[1], want)) return n->inputs[0];
    if (scalar_near(b, n->inputs[0], want)) return n->inputs[1];
    return kNoValue;
  };
  // x if v = x + 0.044715 * pow(x, 3) (either order of the add and the mul).
  auto x_of_cubic = [&](ValueId v) -> ValueId {
    const Node* add = b.producer_of(v);
    if (!add || add->op != OpId::Add || add->inputs.size() != 2) return kNoValue;
    for (int i = 0; i < 2; ++i) {
      ValueId x = add->inputs[size_t(i)];
      ValueId cube = other_than_scalar(b.producer_of(add->inputs[size_t(1 - i)]), OpId::Mul, 0.044715);
      const Node* pw = b.producer_of(cube);
      if (pw && pw->op == OpId::Pow && pw->inputs.size() == 2 && pw->inputs[0] == x &&
          scalar_near(b, pw->inputs[1], 3.0))
        return x;
    }
    return kNoValue;
  };
  // x if t = 1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)).
  auto x_of_one_plus_tanh = [&](ValueId t) -> ValueId {
    ValueId th = other_than_scalar(b.producer_of(t), OpId::Add, 1.0);
    const Node* tanh = b.producer_of(th);
    if (!tanh || tanh->op != OpId::Tanh || tanh->inputs.size() != 1) return kNoValue;
    ValueId v = other_than_scalar(b.producer_of(tanh->inputs[0]), OpId::Mul, std::sqrt(2.0 / M_PI));
    return x_of_cubic(v);
  };
  return half_x_times(m, x_of_one_plus_tanh, "tanh");
}

// x * sigmoid(x) (either order) -> silu(x): exporters write SiLU as its formula (torch.onnx:
// Sigmoid, Mul; EfficientNet's every activation). As one silu node it fuses into the
// convolution before it (oneDNN's swish post-op, fuse-epilogues), so that the convolution's
// blocked layout reaches the depthwise convolution after it instead of a loop kernel. The
// sigmoid stays for its other uses (dce drops it otherwise).
Rewrite sigmoid_silu(const Match& m) {
  const GraphBuilder& b = m.b;
  if (!is_floating(m.out.dtype)) return Rewrite();
  for (int i = 0; i < 2; ++i) {
    const Node* sig = m.input_from(size_t(i), OpId::Sigmoid);
    ValueId x = m.in[size_t(1 - i)];
    if (!sig || sig->inputs.size() != 1 || sig->inputs[0] != x) continue;
    if (!same_value_type(b.dst().type(x), m.out)) continue;  // no broadcast, no promotion
    return Rewrite::node(OpId::Silu, {x}, {});
  }
  return Rewrite();
}

// Note [Rule order]: for one op, rules are tried top to bottom and the first that applies wins.
const Rule kRules[] = {
    {OpId::Mul, "mul(x, 1) -> x", rhs_neutral<1>},
    {OpId::Mul, "mul(1, x) -> x", lhs_neutral<1>},
    {OpId::Mul, "x * 0.5 * (1 + erf(x / sqrt(2))) -> gelu(x)", erf_gelu},
    {OpId::Mul, "x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) -> gelu(x, tanh)", tanh_gelu},
    {OpId::Mul, "x * sigmoid(x) -> silu(x)", sigmoid_silu},
    {OpId::Div, "div(x, 1) -> x", rhs_neutral<1>},
    {OpId::Add, "add(x, 0) -> x", rhs_neutral<0>},
    {OpId::Add, "add(0, x) -> x", lhs_neutral<0>},
    {OpId::Sub, "sub(x, 0) -> x", rhs_neutral<0>},
    {OpId::Neg, "neg(neg(x)) -> x", double_neg},
    {OpId::Not, "not(not(x)) -> x", double_not},
    {OpId::Reshape, "reshape(x) -> x (same shape)", same_shape_identity},
    {OpId::Reshape, "reshape(reshape(x)) -> reshape(x)", reshape_of_reshape},
    {OpId::Flatten, "flatten(x) -> x (same shape)", same_shape_identity},
    {OpId::Squeeze, "squeeze(x) -> x (same shape)", same_shape_identity},
    {OpId::Unsqueeze, "unsqueeze(x) -> x (same shape)", same_shape_identity},
    {OpId::Expand, "expand(x) -> x (same shape)", same_shape_identity},
    {OpId::Slice, "slice(x) -> x (same shape)", same_shape_identity},
    {OpId::Pad, "pad(x) {pads=0} -> x", zero_pad},
    {OpId::Concat, "concat(x) -> x", single_concat},
    {OpId::MaxPool2d, "max_pool2d(x) {1x1, stride 1, no padding} -> x", identity_pool},
    {OpId::AvgPool2d, "avg_pool2d(x) {1x1, stride 1, no padding} -> x", identity_pool},
    {OpId::AdaptiveAvgPool2d, "adaptive_avg_pool2d(x) {output size = x's} -> x", identity_pool},
    {OpId::MaxPool2d, "max_pool2d(x) {1x1, stride > 1, no padding} -> strided slices", subsampling_pool},
    {OpId::AvgPool2d, "avg_pool2d(x) {1x1, stride > 1, no padding} -> strided slices", subsampling_pool},
    {OpId::Permute, "permute(x) {identity} -> x", identity_permutation},
    {OpId::Permute, "permute(permute(x)) -> permute(x)", compose_permutations},
    {OpId::Transpose, "transpose(x) {dim0 == dim1} -> x", identity_permutation},
    {OpId::Transpose, "transpose(transpose(x)) -> permute(x) or x", compose_permutations},
    {OpId::Cast, "cast(x) {dtype = x's} -> x", cast_to_same},
    {OpId::Cast, "cast(cast(x)) exact -> cast(x) or x", exact_cast_chain},
};

// Rules by op, in table order.
const std::vector<std::vector<const Rule*>>& rules_by_op() {
  static const auto* table = [] {
    auto* t = new std::vector<std::vector<const Rule*>>(size_t(kNumOps));
    for (const Rule& r : kRules) (*t)[size_t(r.op)].push_back(&r);
    return t;
  }();
  return *table;
}

}  // namespace

SimplifyResult simplify_algebra(Graph& g) {
  SimplifyResult result;
  const auto& by_op = rules_by_op();
  // Cheap scan first: no node with a rule, no rebuild.
  bool candidate = false;
  for (const Node& n : g.nodes) candidate = candidate || !by_op[size_t(n.op)].empty();
  if (!candidate) return result;

  std::vector<int> applied(std::size(kRules), 0);
  GraphBuilder b(g);
  for (const Node& n : g.nodes) {
    const auto& rules = by_op[size_t(n.op)];
    if (rules.empty() || n.outputs.size() != 1) {
      b.copy_node(n);
      continue;
    }
    std::vector<ValueId> in = b.map(n.inputs);
    Match m{b, n, in, g.type(n.outputs[0])};
    Rewrite rw;
    const Rule* used = nullptr;
    for (const Rule* r : rules) {
      rw = r->apply(m);
      if (rw.kind != Rewrite::None) {
        used = r;
        break;
      }
    }
    const std::string& old_name = g.value(n.outputs[0]).name;
    if (rw.kind == Rewrite::UseValue) {
      b.set_map(n.outputs[0], rw.value);
    } else if (rw.kind == Rewrite::NewNode) {
      if (rw.pre)
        rw.inputs.insert(rw.inputs.begin(), b.add_node1(rw.pre->op, rw.pre->inputs, rw.pre->attrs,
                                                        n.name, "", old_name + ".pre"));
      ValueId v = b.add_node1(rw.op, rw.inputs, rw.attrs, n.name, old_name);
      if (!same_value_type(b.dst().type(v), m.out))
        fail_kind(ErrorKind::Internal, "algebraic-simplify rule '{}' changed the type of %{} "
                  "from {} to {}", used->pattern, old_name, m.out.str(), b.dst().type(v).str());
      b.set_map(n.outputs[0], v);
    } else {
      b.copy_node(n);
      continue;
    }
    ++applied[size_t(used - kRules)];
    ++result.rewrites;
  }
  if (result.rewrites == 0) return result;
  for (size_t i = 0; i < std::size(kRules); ++i)
    if (applied[i]) result.by_rule.emplace_back(kRules[i].pattern, applied[i]);
  g = b.finish();
  return result;
}

namespace {

class AlgebraicSimplifyPass : public Pass {
 public:
  std::string_view name() const override { return "algebraic-simplify"; }
  std::string_view description() const override {
    return "x*1, x+0, identity reshapes/permutes/casts, reshape and transpose chains, "
           "exact cast chains, double negation, erf and tanh GELU formulas as gelu, "
           "x*sigmoid(x) as silu";
  }
  bool run(Graph& g) override { return simplify_algebra(g).rewrites > 0; }
};

}  // namespace

std::unique_ptr<Pass> make_algebraic_simplify_pass() {
  return std::make_unique<AlgebraicSimplifyPass>();
}

}  // namespace kiln
