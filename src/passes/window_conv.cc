#include "passes/window_conv.h"

#include "passes/graph_rewrite.h"

namespace kiln {
namespace {

// Whether node n is a convolution with one window covering its input (see the header).
bool is_one_window_conv(const Graph& g, const Node& n) {
  if (!plain_conv2d(g, n)) return false;
  const TensorType& xt = g.type(n.inputs[0]);
  const TensorType& wt = g.type(n.inputs[1]);
  if (n.inputs.size() > 2 && n.inputs[2] != kNoValue && g.type(n.inputs[2]).dtype != xt.dtype)
    return false;
  const int64_t N = xt.shape[0].value(), C = xt.shape[1].value();
  const int64_t h = xt.shape[2].value(), w = xt.shape[3].value();
  return N > 0 && C > 0 && h > 0 && w > 0 && wt.shape[0].value() > 0 && wt.shape[1].value() == C &&
         wt.shape[2].value() == h && wt.shape[3].value() == w;
}

// The activations fuse-epilogues takes (passes/fuse_epilogues.h): elementwise over their one
// input, so act(reshape(y)) = reshape(act(y)).
bool is_activation(const Node& n) {
  switch (n.op) {
    case OpId::Relu: case OpId::Gelu: case OpId::Silu: case OpId::Sigmoid: case OpId::Tanh:
    case OpId::Clamp:
      return n.inputs.size() == 1 && n.outputs.size() == 1;
    default:
      return false;
  }
}

}  // namespace

int one_window_conv_to_linear(Graph& g) {
  int count = 0;
  for (const Node& n : g.nodes) count += is_one_window_conv(g, n);
  if (count == 0) return 0;
  // Each value's live uses (graph outputs count, as fuse-epilogues counts them), and a live
  // node using it.
  const std::vector<int> uses = live_use_counts(g);
  const std::vector<bool> live = live_nodes(g);
  std::vector<int32_t> user(g.values.size(), -1);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (live[i])
      for (ValueId v : g.nodes[i].inputs)
        if (v != kNoValue) user[size_t(v)] = int32_t(i);
  std::vector<bool> moved(g.nodes.size(), false);  // activations emitted before the reshape
  GraphBuilder b(g);
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    const Node& n = g.nodes[ni];
    if (moved[ni]) continue;
    if (!is_one_window_conv(g, n)) {
      b.copy_node(n);
      continue;
    }
    const TensorType& xt = g.type(n.inputs[0]);
    const TensorType& wt = g.type(n.inputs[1]);
    const int64_t N = xt.shape[0].value(), O = wt.shape[0].value();
    const int64_t K = xt.shape[1].value() * xt.shape[2].value() * xt.shape[3].value();
    const std::string& out = g.value(n.outputs[0]).name;
    ValueId x = b.add_node1(OpId::Reshape, {b.map(n.inputs[0])}, {{"shape", Ints{N, K}}}, n.name,
                            "", out + ".rows");
    ValueId w;
    const Value& wv = g.value(n.inputs[1]);
    if (has_data(wv)) {
      w = b.add_derived(wv, wv.data.contiguous().as_strided({O, K}, {K, 1}, 0).clone(), ".rows");
    } else {
      w = b.add_node1(OpId::Reshape, {b.map(n.inputs[1])}, {{"shape", Ints{O, K}}}, n.name, "",
                      out + ".weight");
    }
    std::vector<ValueId> in = {x, w};
    if (n.inputs.size() > 2 && n.inputs[2] != kNoValue) in.push_back(b.map(n.inputs[2]));
    ValueId y = b.add_node1(OpId::Linear, in, {}, n.name, "", out + ".linear");
    ValueId o = b.add_node1(OpId::Reshape, {y}, {{"shape", Ints{N, O, 1, 1}}}, n.name, out);
    b.set_map(n.outputs[0], o);  // for every use (dead ones too, which dce removes later)
    // An activation that is the convolution's one use runs on the linear's rows, before the
    // reshape, so that fuse-epilogues makes it the linear's epilogue as it was the convolution's.
    const size_t yv = size_t(n.outputs[0]);
    if (uses[yv] == 1 && user[yv] >= 0 && is_activation(g.nodes[size_t(user[yv])])) {
      const Node& act = g.nodes[size_t(user[yv])];
      const std::string& act_out = g.value(act.outputs[0]).name;
      ValueId a = b.add_node1(act.op, {y}, act.attrs, act.name, "", act_out + ".rows");
      ValueId ao = b.add_node1(OpId::Reshape, {a}, {{"shape", Ints{N, O, 1, 1}}}, act.name, act_out);
      b.set_map(act.outputs[0], ao);
      moved[size_t(user[yv])] = true;
    }
  }
  g = b.finish();
  return count;
}

namespace {

class OneWindowConvToLinearPass : public Pass {
 public:
  std::string_view name() const override { return "one-window-conv-to-linear"; }
  std::string_view description() const override {
    return "conv2d whose one window covers its whole input -> linear of the flattened input";
  }
  bool run(Graph& g) override { return one_window_conv_to_linear(g) > 0; }
};

}  // namespace

std::unique_ptr<Pass> make_one_window_conv_to_linear_pass() {
  return std::make_unique<OneWindowConvToLinearPass>();
}

}  // namespace kiln
