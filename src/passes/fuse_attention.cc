#include "passes/fuse_attention.h"

#include <cmath>
#include <optional>

#include "passes/graph_rewrite.h"

namespace kiln {
namespace {

// The node producing v when it is a live node output of op `op` whose value has exactly one use.
const Node* sole(const Graph& g, const std::vector<int>& uses, ValueId v, OpId op) {
  const Node* n = producer_of(g, v);
  return n && n->op == op && uses[size_t(v)] == 1 ? n : nullptr;
}

// The value of a constant of one element, else nothing.
std::optional<double> scalar_const(const Graph& g, ValueId v) {
  const Tensor d = const_data_f64(g, v);
  if (!d.defined() || d.numel() != 1) return std::nullopt;
  return d.data<double>()[0];
}

struct Match {
  ValueId q = kNoValue, kt = kNoValue, v = kNoValue, mask = kNoValue;
  double scale = 1.0;
  // kt = x * a or x / a for a one-element value a (a weight too): k is then written as
  // transpose(x) * a, the scale applied after the transpose (pointwise ops commute with it), so
  // that the scaled k comes out contiguous in its features instead of needing a copy.
  const Node* kt_scale = nullptr;
  int kt_scalar_side = 1;  // which input of kt_scale is a
  // The scores scaled by a one-element weight b (s * b, s / b): q is scaled by it instead.
  const Node* q_scale = nullptr;
  int q_scalar_side = 1;
};

// A sole-use mul or div of some x by a one-element value a that keeps x's shape and dtype (a
// scale): the node, with *x and *side (a's input index) set; else nullptr. `constant`: a must be
// a constant (its value may go into the attention's scale); else a may be any value of x's
// dtype (a weight, which stays an op).
const Node* one_element_scale(const Graph& g, const std::vector<int>& uses, ValueId v,
                              bool constant, ValueId* x, int* side) {
  for (OpId op : {OpId::Mul, OpId::Div}) {
    const Node* n = sole(g, uses, v, op);
    if (!n || n->inputs.size() != 2) continue;
    const TensorType& out = g.type(n->outputs[0]);
    for (int s = 1; s >= 0; --s) {
      if (op == OpId::Div && s == 0) continue;  // a / x is no scale
      const ValueId a = n->inputs[size_t(s)], other = n->inputs[size_t(1 - s)];
      const TensorType& at = g.type(a);
      bool one = true;
      for (const SymInt& d : at.shape) one = one && d.is_concrete() && d.value() == 1;
      if (!one || g.type(other).shape != out.shape || g.type(other).dtype != out.dtype) continue;
      if (constant ? !scalar_const(g, a) : at.dtype != g.type(other).dtype) continue;
      *x = other;
      *side = s;
      return n;
    }
  }
  return nullptr;
}

// Whether the matmul node `pv` (index i) ends a chain the pass fuses (see the header).
std::optional<Match> match(const Graph& g, const std::vector<int>& uses, size_t i) {
  const Node& pv = g.nodes[i];
  if (pv.op != OpId::Matmul || pv.inputs.size() != 2) return std::nullopt;
  const DType dt = g.type(pv.outputs[0]).dtype;
  if (!is_floating(dt)) return std::nullopt;
  Match m;
  m.v = pv.inputs[1];
  const Node* sm = sole(g, uses, pv.inputs[0], OpId::Softmax);
  if (!sm) return std::nullopt;
  const int64_t rank = g.type(sm->inputs[0]).rank();
  const int64_t dim = sm->attrs.get_int("dim");
  if (rank < 2 || (dim != -1 && dim != rank - 1)) return std::nullopt;
  ValueId s = sm->inputs[0];
  // The mask: an add whose other operand is not the score chain.
  const Node* score_mm = nullptr;
  // The score product under x, through one constant scale (s * c, s / c) if there is one.
  auto unscaled = [&](ValueId x, double* factor) {
    ValueId y = kNoValue;
    int side = 1;
    const Node* n = one_element_scale(g, uses, x, /*constant=*/true, &y, &side);
    if (!n) return x;
    const double c = *scalar_const(g, n->inputs[size_t(side)]);
    *factor *= n->op == OpId::Mul ? c : 1.0 / c;
    return y;
  };
  // ... or through a scale by a one-element weight, which moves to q (m.q_scale).
  auto scores_from = [&](ValueId x, double* factor, Match* mt) {
    ValueId y = unscaled(x, factor);
    if (y == x) {
      ValueId z = kNoValue;
      int side = 1;
      if (const Node* n = one_element_scale(g, uses, x, /*constant=*/false, &z, &side)) {
        mt->q_scale = n;
        mt->q_scalar_side = side;
        y = z;
      }
    }
    return sole(g, uses, y, OpId::Matmul);
  };
  double factor = 1.0;
  if (const Node* add = sole(g, uses, s, OpId::Add); add && add->inputs.size() == 2) {
    for (int side = 0; side < 2 && !score_mm; ++side) {
      double f = 1.0;
      Match tried = m;
      const Node* mm = scores_from(add->inputs[size_t(side)], &f, &tried);
      const ValueId mask = add->inputs[size_t(1 - side)];
      if (!mm || g.type(mask).dtype != dt) continue;
      // The mask broadcasts to the scores: the sum has the scores' shape.
      if (g.type(add->outputs[0]).shape != g.type(mm->outputs[0]).shape) continue;
      score_mm = mm;
      factor = f;
      m = tried;
      m.mask = mask;
    }
  }
  if (!score_mm) score_mm = scores_from(s, &factor, &m);
  if (!score_mm || score_mm->inputs.size() != 2) return std::nullopt;
  // A scale on q (q * c before the product) scales the scores.
  m.q = unscaled(score_mm->inputs[0], &factor);
  m.kt = score_mm->inputs[1];
  {
    ValueId x = kNoValue;
    int side = 1;
    if (const Node* n = one_element_scale(g, uses, m.kt, /*constant=*/false, &x, &side)) {
      m.kt_scale = n;
      m.kt_scalar_side = side;
      m.kt = x;
    }
  }
  m.scale = factor;
  if (!(m.scale > 0) || !std::isfinite(m.scale)) return std::nullopt;
  for (ValueId x : {m.q, m.kt, m.v})
    if (g.type(x).dtype != dt || g.type(x).rank() < 2) return std::nullopt;
  return m;
}

}  // namespace

int fuse_attention(Graph& g) {
  const std::vector<int> uses = live_use_counts(g);
  std::vector<std::optional<Match>> at(g.nodes.size());
  int count = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    at[i] = match(g, uses, i);
    count += at[i].has_value();
  }
  if (count == 0) return 0;
  GraphBuilder b(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (!at[i]) {
      b.copy_node(n);
      continue;
    }
    // The chain's other nodes are copied as they come and left unused (dce removes them).
    const Match& m = *at[i];
    ValueId k = b.add_node1(OpId::Transpose, {b.map(m.kt)}, {{"dim0", int64_t(-2)}, {"dim1", int64_t(-1)}},
                            n.name, "", "attention.k");
    // x scaled as `sc` scales its operand: the same op, a on the same side.
    auto rescale = [&](ValueId x, const Node& sc, int side, const char* hint) {
      std::vector<ValueId> args(2, x);
      args[size_t(side)] = b.map(sc.inputs[size_t(side)]);
      return b.add_node1(sc.op, args, sc.attrs, sc.name, "", hint);
    };
    if (m.kt_scale) k = rescale(k, *m.kt_scale, m.kt_scalar_side, "attention.k");
    ValueId q = b.map(m.q);
    if (m.q_scale) q = rescale(q, *m.q_scale, m.q_scalar_side, "attention.q");
    std::vector<ValueId> in = {q, k, b.map(m.v)};
    if (m.mask != kNoValue) in.push_back(b.map(m.mask));
    b.set_map(n.outputs[0], b.add_node1(OpId::ScaledDotProductAttention, in,
                                        {{"is_causal", false}, {"scale", m.scale}}, n.name,
                                        g.value(n.outputs[0]).name));
  }
  g = b.finish();
  return count;
}

namespace {

class FuseAttentionPass : public Pass {
 public:
  std::string_view name() const override { return "fuse-attention"; }
  std::string_view description() const override {
    return "matmul(q, kT), a constant scale, an added mask, softmax over the keys and matmul with "
           "v -> scaled_dot_product_attention (one fused kernel on CUDA)";
  }
  bool run(Graph& g) override { return fuse_attention(g) > 0; }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_attention_pass() { return std::make_unique<FuseAttentionPass>(); }

}  // namespace kiln
