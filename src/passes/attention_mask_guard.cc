#include "passes/attention_mask_guard.h"

#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "passes/graph_rewrite.h"

namespace kiln {
namespace {

// The producing node of v when it is a node output of op `op`, else nullptr.
const Node* made_by(const Graph& g, ValueId v, OpId op) {
  const Node* n = producer_of(g, v);
  return n && n->op == op ? n : nullptr;
}

// Whether v is a constant whose every element satisfies `pred`.
template <typename Pred>
bool const_all(const Graph& g, ValueId v, Pred pred) {
  const Tensor d = const_data_f64(g, v);
  if (!d.defined() || d.numel() == 0) return false;
  const double* p = d.data<double>();
  for (int64_t i = 0; i < d.numel(); ++i)
    if (!pred(p[i])) return false;
  return true;
}

// The guarded mask's shape for attention node n (concrete shapes, mask rank <= q's): the
// scores' [..., L, S], with the heads dim (the last batch dim) and the other batch dims kept at
// 1 where the mask does not vary over them. Empty when the mask does not fit that form.
Ints guarded_shape(const Graph& g, const Node& n) {
  const Dims qd = to_dims(g.type(n.inputs[0]).shape, "attention q");
  const Dims kd = to_dims(g.type(n.inputs[1]).shape, "attention k");
  const Dims md = to_dims(g.type(n.inputs[3]).shape, "attention mask");
  const Ints q(qd.begin(), qd.end()), k(kd.begin(), kd.end());
  const size_t r = q.size();
  if (md.size() > r) return {};
  Ints m(r - md.size(), 1);
  m.insert(m.end(), md.begin(), md.end());
  Ints out(r);
  out[r - 2] = q[r - 2];
  out[r - 1] = k[r - 2];
  if (r >= 3) out[r - 3] = m[r - 3] == 1 ? 1 : q[r - 3];
  bool batch_varies = false;
  for (size_t i = 0; i + 3 < r; ++i) batch_varies = batch_varies || m[i] != 1;
  for (size_t i = 0; i + 3 < r; ++i) out[i] = batch_varies ? q[i] : 1;
  return out;
}

// Whether attention node n is one the pass rewrites (see the header).
bool wants_guard(const Graph& g, const Node& n) {
  if (n.op != OpId::ScaledDotProductAttention || n.inputs.size() < 4 || n.inputs[3] == kNoValue)
    return false;
  const TensorType& q = g.type(n.inputs[0]);
  if (q.dtype != DType::Float16 && q.dtype != DType::BFloat16) return false;
  const DType md = g.type(n.inputs[3]).dtype;
  if (md != q.dtype && md != DType::Bool) return false;
  if (g.type(n.inputs[3]).rank() < 1) return false;  // a scalar mask: no rows to guard
  for (ValueId v : n.inputs)
    if (v != kNoValue && !is_concrete(g.type(v).shape)) return false;
  const Shape& qs = q.shape;
  const Shape& ks = g.type(n.inputs[1]).shape;
  const Shape& vs = g.type(n.inputs[2]).shape;
  if (qs.size() != ks.size() || qs.size() != vs.size()) return false;
  for (size_t i = 0; i + 2 < qs.size(); ++i)
    if (qs[i] != ks[i] || qs[i] != vs[i]) return false;
  if (guarded_attention_mask(g, n.inputs[3])) return false;
  return !guarded_shape(g, n).empty();
}

}  // namespace

bool guarded_attention_mask(const Graph& g, ValueId mask) {
  const Node* w = made_by(g, mask, OpId::Where);
  if (!w || w->inputs.size() != 3) return false;
  const ValueId x = w->inputs[2];
  if (!const_all(g, w->inputs[1], [](double d) { return std::isnan(d); })) return false;
  ValueId flags = w->inputs[0];
  if (const Node* e = made_by(g, flags, OpId::Expand)) flags = e->inputs[0];
  const Node* eq = made_by(g, flags, OpId::Eq);
  if (!eq || eq->inputs.size() != 2) return false;
  const Node* mx = made_by(g, eq->inputs[0], OpId::Max);
  ValueId inf = eq->inputs[1];
  if (!mx) {  // eq is commutative: the constant may come first
    mx = made_by(g, eq->inputs[1], OpId::Max);
    inf = eq->inputs[0];
  }
  if (!mx || mx->inputs.empty() || mx->inputs[0] != x) return false;
  if (!const_all(g, inf, [](double d) { return d == -std::numeric_limits<double>::infinity(); }))
    return false;
  // The maximum over the last dim alone, kept: one flag per row of x.
  const int64_t rank = g.type(x).rank();
  const Ints& dims = mx->attrs.get_ints("dims");
  if (rank < 1 || dims.size() != 1 || (dims[0] != -1 && dims[0] != rank - 1)) return false;
  return mx->attrs.get_bool("keepdim");
}

int attention_mask_guard(Graph& g) {
  std::vector<bool> rewrite(g.nodes.size(), false);
  int count = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (wants_guard(g, g.nodes[i])) {
      rewrite[i] = true;
      ++count;
    }
  if (count == 0) return 0;
  GraphBuilder b(g);
  std::map<std::pair<ValueId, Ints>, ValueId> guards;  // (new mask, shape) -> guarded mask
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (!rewrite[i]) {
      b.copy_node(n);
      continue;
    }
    const Ints shape = guarded_shape(g, n);
    std::vector<ValueId> in = b.map(n.inputs);
    const DType dt = b.dst().type(in[0]).dtype;
    auto [it, fresh] = guards.try_emplace({in[3], shape}, kNoValue);
    if (fresh) {
      ValueId m = in[3];
      const std::string base = b.dst().value(m).name + ".guard";
      // Scalars on the mask's device (binary ops take their operands from one device).
      const Device dev = b.dst().type(m).device;
      auto scalar = [&](double x, const std::string& name) {
        return b.add_const(Tensor::scalar(x, dt).to(dev), "", name);
      };
      if (b.dst().type(m).dtype == DType::Bool) {  // true attends, false is -inf (the reference's)
        ValueId zero = scalar(0.0, base + ".zero");
        ValueId ninf = scalar(-std::numeric_limits<double>::infinity(), base + ".neg_inf");
        m = b.add_node1(OpId::Where, {m, zero, ninf}, {}, n.name, "", base + ".additive");
      }
      ValueId neg_inf = scalar(-std::numeric_limits<double>::infinity(), base + ".neg_inf");
      ValueId nan = scalar(std::numeric_limits<double>::quiet_NaN(), base + ".nan");
      ValueId mx = b.add_node1(OpId::Max, {m}, {{"dims", Ints{-1}}, {"keepdim", true}}, n.name, "",
                               base + ".row_max");
      ValueId full = b.add_node1(OpId::Eq, {mx, neg_inf}, {}, n.name, "", base + ".whole_row");
      // The flags expanded to the guarded shape: where's output takes that shape, one kernel.
      const Dims fd = to_dims(b.dst().type(full).shape, "mask row flags");
      if (Ints(fd.begin(), fd.end()) != shape)
        full = b.add_node1(OpId::Expand, {full}, {{"shape", shape}}, n.name, "", base + ".whole_row");
      it->second = b.add_node1(OpId::Where, {full, nan, m}, {}, n.name, "", base);
    }
    in[3] = it->second;
    b.set_map(n.outputs[0], b.add_node1(n.op, in, n.attrs, n.name, g.value(n.outputs[0]).name));
  }
  g = b.finish();
  return count;
}

namespace {

class AttentionMaskGuardPass : public Pass {
 public:
  std::string_view name() const override { return "attention-mask-guard"; }
  std::string_view description() const override {
    return "an attention mask computed at run time reads NaN on rows it masks whole and is "
           "materialized [batch|1, heads|1, L, S] (what cuDNN's fused attention takes)";
  }
  bool run(Graph& g) override { return attention_mask_guard(g) > 0; }
};

}  // namespace

std::unique_ptr<Pass> make_attention_mask_guard_pass() {
  return std::make_unique<AttentionMaskGuardPass>();
}

}  // namespace kiln
