#include "passes/fuse_epilogues.h"

#include "passes/graph_rewrite.h"

namespace kiln {
namespace {

struct Anchor {
  OpId op, fused;
};
const Anchor kAnchors[] = {
    {OpId::Conv2d, OpId::FusedConv2d},
    {OpId::Linear, OpId::FusedLinear},
};

// The chain being built: the anchor, its epilogue so far, and the value the next step reads.
struct Chain {
  const Anchor* anchor = nullptr;
  std::vector<size_t> nodes;  // old node indices: anchor first, tail last
  ValueId y = kNoValue;       // current result (old id)
  ValueId bias = kNoValue;    // old id; absorbed from an add when the anchor had none
  bool bias_needs_reshape = false;
  ValueId residual = kNoValue;
  double sum_scale = 1.0;
  std::string activation = "none";
  Attrs act_attrs;            // clamp_min / clamp_max
  // Note [activation through a view]: the reshape node between the epilogue so far and the
  // activation (-1: none); the fused node computes in the anchor's shape, this reshape follows.
  int view = -1;
  enum Stage { Open, AfterBias, AfterResidual, Done } stage = Open;
};

struct StepInput {
  const Graph& g;
  const Node& node;  // the candidate consumer of chain.y
  Chain& chain;
};

bool same_type(const TensorType& a, const TensorType& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.device == b.device;
}

// The operand of a binary node that is not chain.y (kNoValue if y is both or neither).
ValueId other_operand(const StepInput& s) {
  const Node& n = s.node;
  if (n.inputs[0] == s.chain.y && n.inputs[1] != s.chain.y) return n.inputs[1];
  if (n.inputs[1] == s.chain.y && n.inputs[0] != s.chain.y) return n.inputs[0];
  return kNoValue;
}

bool anchor_has_bias(const StepInput& s) {
  const Node& a = s.g.nodes[s.chain.nodes[0]];
  return (a.inputs.size() > 2 && a.inputs[2] != kNoValue) || s.chain.bias != kNoValue;
}

// add(y, b): b a per-output-channel vector.
bool step_bias(const StepInput& s) {
  if (s.chain.stage != Chain::Open || anchor_has_bias(s)) return false;
  ValueId b = other_operand(s);
  if (b == kNoValue) return false;
  const TensorType &bt = s.g.type(b), &yt = s.g.type(s.chain.y);
  if (bt.dtype != yt.dtype || bt.device != yt.device || yt.rank() < 1) return false;
  bool conv = s.chain.anchor->op == OpId::Conv2d;
  SymInt c = conv ? yt.shape[1] : yt.shape[size_t(yt.rank() - 1)];
  Shape want1{c};
  bool ok = bt.shape == want1;
  bool reshape = false;
  if (!ok && conv) {
    reshape = bt.shape == Shape{c, 1, 1} || bt.shape == Shape{1, c, 1, 1};
    ok = reshape;
  }
  if (!ok || !same_type(s.g.type(s.node.outputs[0]), yt)) return false;
  s.chain.bias = b;
  s.chain.bias_needs_reshape = reshape;
  s.chain.stage = Chain::AfterBias;
  return true;
}

// add(y, r) / sub(y, r): r of exactly y's type.
bool step_residual(const StepInput& s) {
  if (s.chain.stage == Chain::AfterResidual || s.chain.stage == Chain::Done) return false;
  ValueId r = other_operand(s);
  if (r == kNoValue || !same_type(s.g.type(r), s.g.type(s.chain.y))) return false;
  if (s.node.op == OpId::Sub && s.node.inputs[0] != s.chain.y) return false;  // r - y: not ours
  s.chain.residual = r;
  s.chain.sum_scale = s.node.op == OpId::Sub ? -1.0 : 1.0;
  s.chain.stage = Chain::AfterResidual;
  return true;
}

bool step_activation(const StepInput& s) {
  if (s.chain.stage == Chain::Done) return false;
  switch (s.node.op) {
    case OpId::Relu: s.chain.activation = "relu"; break;
    case OpId::Silu: s.chain.activation = "silu"; break;
    case OpId::Sigmoid: s.chain.activation = "sigmoid"; break;
    case OpId::Tanh: s.chain.activation = "tanh"; break;
    case OpId::Gelu:
      s.chain.activation = s.node.attrs.get_string("approximate") == "tanh" ? "gelu_tanh" : "gelu";
      break;
    case OpId::Clamp:
      if (!s.node.attrs.has("min") && !s.node.attrs.has("max")) return false;  // an identity
      s.chain.activation = "clamp";
      if (s.node.attrs.has("min")) s.chain.act_attrs.set("clamp_min", s.node.attrs.get_float("min"));
      if (s.node.attrs.has("max")) s.chain.act_attrs.set("clamp_max", s.node.attrs.get_float("max"));
      break;
    default: return false;
  }
  s.chain.stage = Chain::Done;
  return true;
}

struct Step {
  OpId op;
  const char* pattern;
  bool (*match)(const StepInput&);
};
// For one consumer op, steps are tried top to bottom (an add is a bias before a residual).
const Step kSteps[] = {
    {OpId::Add, "add(y, b[C]) -> bias", step_bias},
    {OpId::Add, "add(y, r) -> residual", step_residual},
    {OpId::Sub, "sub(y, r) -> residual, sum_scale=-1", step_residual},
    {OpId::Relu, "relu(y)", step_activation},
    {OpId::Gelu, "gelu(y)", step_activation},
    {OpId::Silu, "silu(y)", step_activation},
    {OpId::Sigmoid, "sigmoid(y)", step_activation},
    {OpId::Tanh, "tanh(y)", step_activation},
    {OpId::Clamp, "clamp(y)", step_activation},
};

const Anchor* anchor_of(OpId op) {
  for (const Anchor& a : kAnchors)
    if (a.op == op) return &a;
  return nullptr;
}

}  // namespace

// Note [activation through a view]
// A linear's epilogue may reach its activation through a reshape that regroups the rows and
// keeps the last dim: GPT-2's export computes its MLP's first linear as a [64, 3072] addmm,
// reshapes it to [1, 64, 3072] for the GELU and back for the next addmm. The activation applies
// to each element alone, so it may run before the reshape: the chain takes the reshape and the
// activation after it, the fused node computes in the linear's shape with the activation as its
// post-op, and the reshape (a view) follows it. Only an activation may follow the view, and it
// ends the chain. Node `c` is the consumer of chain.y that no step matched.
static void try_view_then_activation(const Graph& g, const std::vector<int>& sole_consumer,
                                     const std::vector<bool>& claimed, int c, Chain& chain) {
  const Node& view = g.nodes[size_t(c)];
  if (view.op != OpId::Reshape || chain.anchor->op != OpId::Linear || chain.stage == Chain::Done)
    return;
  const TensorType &y = g.type(chain.y), &r = g.type(view.outputs[0]);
  if (y.rank() < 1 || r.rank() < 1 || y.shape.back() != r.shape.back()) return;
  int a = sole_consumer[size_t(view.outputs[0])];
  if (a < 0 || claimed[size_t(a)]) return;
  Chain trial = chain;
  StepInput s{g, g.nodes[size_t(a)], trial};
  if (!step_activation(s)) return;
  chain = std::move(trial);
  chain.view = c;
  chain.nodes.push_back(size_t(c));
  chain.nodes.push_back(size_t(a));
  chain.y = g.nodes[size_t(a)].outputs[0];
}

FuseEpiloguesResult fuse_epilogues(Graph& g) {
  FuseEpiloguesResult result;
  std::vector<bool> live = live_nodes(g);
  std::vector<int> uses = live_use_counts(g);
  // The live consumer of each value, when it has exactly one use and that use is a node.
  std::vector<int> sole_consumer(g.values.size(), -1);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (!live[i]) continue;
    for (ValueId v : g.nodes[i].inputs)
      if (v != kNoValue && uses[size_t(v)] == 1) sole_consumer[size_t(v)] = int(i);
  }

  std::vector<bool> claimed(g.nodes.size(), false);
  std::vector<Chain> chains;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const Anchor* anchor = anchor_of(n.op);
    if (!anchor || !live[i] || claimed[i] || !is_floating(g.type(n.outputs[0]).dtype)) continue;
    Chain chain;
    chain.anchor = anchor;
    chain.nodes = {i};
    chain.y = n.outputs[0];
    for (;;) {
      int c = sole_consumer[size_t(chain.y)];
      if (c < 0 || claimed[size_t(c)]) break;
      StepInput s{g, g.nodes[size_t(c)], chain};
      bool matched = false;
      for (const Step& step : kSteps)
        if (step.op == s.node.op && step.match(s)) {
          matched = true;
          break;
        }
      if (!matched) {
        try_view_then_activation(g, sole_consumer, claimed, c, chain);  // ends the chain either way
        break;
      }
      chain.nodes.push_back(size_t(c));
      chain.y = s.node.outputs[0];
      if (chain.stage == Chain::Done) break;
    }
    if (chain.nodes.size() < 2) continue;
    for (size_t k : chain.nodes) claimed[k] = true;
    result.bias_adds += chain.bias != kNoValue;
    result.residual_adds += chain.residual != kNoValue;
    result.activations += chain.activation != "none";
    ++(anchor->op == OpId::Conv2d ? result.conv_fused : result.linear_fused);
    chains.push_back(std::move(chain));
  }
  if (chains.empty()) return result;

  std::vector<int> chain_of_tail(g.nodes.size(), -1);
  for (size_t c = 0; c < chains.size(); ++c) chain_of_tail[chains[c].nodes.back()] = int(c);

  GraphBuilder b(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (chain_of_tail[i] < 0) {
      if (claimed[i]) continue;  // inside a chain: emitted with its tail
      bool reads_dropped = false;
      for (ValueId v : n.inputs) reads_dropped = reads_dropped || (v != kNoValue && !b.is_mapped(v));
      if (reads_dropped && !live[i]) continue;  // dead code reading a fused intermediate
      b.copy_node(n);
      continue;
    }
    const Chain& chain = chains[size_t(chain_of_tail[i])];
    const Node& anchor = g.nodes[chain.nodes[0]];
    ValueId bias = anchor.inputs.size() > 2 ? b.map(anchor.inputs[2]) : kNoValue;
    if (chain.bias != kNoValue) {
      bias = b.map(chain.bias);
      if (chain.bias_needs_reshape) {
        SymInt c = g.type(anchor.outputs[0]).shape[1];
        bias = b.add_node1(OpId::Reshape, {bias}, {{"shape", Ints{c.raw()}}}, anchor.name, "",
                           g.value(chain.bias).name + ".flat");
      }
    }
    Attrs attrs = anchor.attrs;
    attrs.set("activation", chain.activation);
    for (auto& [k, v] : chain.act_attrs.items()) attrs.set(k, v);
    attrs.set("sum_scale", chain.sum_scale);
    std::vector<ValueId> inputs = {b.map(anchor.inputs[0]), b.map(anchor.inputs[1]), bias};
    if (chain.residual != kNoValue) inputs.push_back(b.map(chain.residual));
    while (inputs.size() > 2 && inputs.back() == kNoValue) inputs.pop_back();  // as conv2d prints
    ValueId tail_out = n.outputs[0];
    const std::string& tail_name = g.value(tail_out).name;
    // Note [activation through a view]: the tail's name goes to the reshape after the node.
    ValueId y = b.add_node1(chain.anchor->fused, inputs, attrs, anchor.name,
                            chain.view >= 0 ? "" : tail_name, tail_name);
    if (chain.view >= 0) {
      const Node& view = g.nodes[size_t(chain.view)];
      y = b.add_node1(OpId::Reshape, {y}, view.attrs, view.name, tail_name);
    }
    b.set_map(tail_out, y);
  }
  g = b.finish();
  return result;
}

namespace {

class FuseEpiloguesPass : public Pass {
 public:
  std::string_view name() const override { return "fuse-epilogues"; }
  std::string_view description() const override {
    return "fold bias, residual add and activation after conv2d/linear into fused_conv2d / "
           "fused_linear";
  }
  bool run(Graph& g) override {
    FuseEpiloguesResult r = fuse_epilogues(g);
    return r.conv_fused + r.linear_fused > 0;
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_epilogues_pass() { return std::make_unique<FuseEpiloguesPass>(); }

}  // namespace kiln
