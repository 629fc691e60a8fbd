#include "passes/deconv_to_conv.h"

#include "passes/graph_rewrite.h"

namespace kiln {
namespace {

// Whether node n is a 1x1, stride-1, unpadded transposed convolution (see the header).
bool is_pointwise_deconv(const Graph& g, const Node& n) {
  if (n.op != OpId::ConvTranspose2d || n.inputs.size() < 2 || n.outputs.size() != 1) return false;
  const TensorType& wt = g.type(n.inputs[1]);
  if (wt.rank() != 4 || !is_concrete(wt.shape) || wt.shape[2].value() != 1 ||
      wt.shape[3].value() != 1)
    return false;
  const int64_t groups = n.attrs.get_int("groups");
  const int64_t C = wt.shape[0].value();
  return groups >= 1 && C % groups == 0 && all_equal(n.attrs.get_ints("stride"), 1) &&
         all_equal(n.attrs.get_ints("padding"), 0) && all_equal(n.attrs.get_ints("output_padding"), 0);
}

}  // namespace

int pointwise_deconv_to_conv(Graph& g) {
  int count = 0;
  for (const Node& n : g.nodes) count += is_pointwise_deconv(g, n);
  if (count == 0) return 0;
  GraphBuilder b(g);
  for (const Node& n : g.nodes) {
    if (!is_pointwise_deconv(g, n)) {
      b.copy_node(n);
      continue;
    }
    const TensorType& wt = g.type(n.inputs[1]);
    const int64_t groups = n.attrs.get_int("groups");
    const int64_t C = wt.shape[0].value(), Og = wt.shape[1].value(), Cg = C / groups;
    const int64_t O = Og * groups;
    const std::string& out = g.value(n.outputs[0]).name;
    // w' [O, C/g, 1, 1]: element (k * Og + o, i) of w' is element (k * Cg + i, o) of w.
    ValueId w;
    const Value& wv = g.value(n.inputs[1]);
    if (has_data(wv)) {
      w = b.add_derived(wv,
                        wv.data.contiguous()
                            .as_strided({groups, Og, Cg}, {Cg * Og, 1, Og}, 0)
                            .clone()
                            .as_strided({O, Cg, 1, 1}, {Cg, 1, 1, 1}, 0),
                        ".conv");
    } else {
      ValueId w3 = b.add_node1(OpId::Reshape, {b.map(n.inputs[1])}, {{"shape", Ints{groups, Cg, Og}}},
                               n.name, "", out + ".weight_groups");
      ValueId wp = b.add_node1(OpId::Permute, {w3}, {{"dims", Ints{0, 2, 1}}}, n.name, "",
                               out + ".weight_t");
      w = b.add_node1(OpId::Reshape, {wp}, {{"shape", Ints{O, Cg, 1, 1}}}, n.name, "",
                      out + ".weight");
    }
    std::vector<ValueId> in = {b.map(n.inputs[0]), w};
    if (n.inputs.size() > 2 && n.inputs[2] != kNoValue) in.push_back(b.map(n.inputs[2]));
    Attrs a;
    a.set("stride", Ints{1, 1});
    a.set("padding", Ints{0, 0});
    a.set("dilation", Ints{1, 1});
    a.set("groups", groups);
    ValueId y = b.add_node1(OpId::Conv2d, in, a, n.name, out);
    b.set_map(n.outputs[0], y);
  }
  g = b.finish();
  return count;
}

namespace {

class PointwiseDeconvToConvPass : public Pass {
 public:
  std::string_view name() const override { return "pointwise-deconv-to-conv"; }
  std::string_view description() const override {
    return "conv_transpose2d with a 1x1 kernel and stride 1 -> conv2d with the weight's group "
           "blocks transposed";
  }
  bool run(Graph& g) override { return pointwise_deconv_to_conv(g) > 0; }
};

}  // namespace

std::unique_ptr<Pass> make_pointwise_deconv_to_conv_pass() {
  return std::make_unique<PointwiseDeconvToConvPass>();
}

}  // namespace kiln
