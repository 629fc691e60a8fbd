#include "passes/patch_conv.h"

#include "passes/graph_rewrite.h"

namespace kiln {
namespace {

// Whether node n is a convolution whose windows tile its input (see the header).
bool is_patch_conv(const Graph& g, const Node& n) {
  if (!plain_conv2d(g, n)) return false;
  const TensorType& xt = g.type(n.inputs[0]);
  const TensorType& wt = g.type(n.inputs[1]);
  const int64_t kh = wt.shape[2].value(), kw = wt.shape[3].value();
  const Ints& stride = n.attrs.get_ints("stride");
  if (stride.size() != 2 || stride[0] != kh || stride[1] != kw || kh * kw <= 1) return false;
  const int64_t h = xt.shape[2].value(), w = xt.shape[3].value();
  return h > 0 && w > 0 && h % kh == 0 && w % kw == 0 && xt.shape[0].value() > 0 &&
         wt.shape[0].value() > 0;
}

}  // namespace

int patch_conv_to_linear(Graph& g) {
  int count = 0;
  for (const Node& n : g.nodes) count += is_patch_conv(g, n);
  if (count == 0) return 0;
  GraphBuilder b(g);
  for (const Node& n : g.nodes) {
    if (!is_patch_conv(g, n)) {
      b.copy_node(n);
      continue;
    }
    const TensorType& xt = g.type(n.inputs[0]);
    const TensorType& wt = g.type(n.inputs[1]);
    const int64_t N = xt.shape[0].value(), C = xt.shape[1].value();
    const int64_t kh = wt.shape[2].value(), kw = wt.shape[3].value(), O = wt.shape[0].value();
    const int64_t hp = xt.shape[2].value() / kh, wp = xt.shape[3].value() / kw;
    const std::string& out = g.value(n.outputs[0]).name;
    ValueId x = b.map(n.inputs[0]);
    ValueId x6 = b.add_node1(OpId::Reshape, {x}, {{"shape", Ints{N, C, hp, kh, wp, kw}}}, n.name,
                             "", out + ".windows");
    ValueId xp = b.add_node1(OpId::Permute, {x6}, {{"dims", Ints{0, 2, 4, 1, 3, 5}}}, n.name, "",
                             out + ".patches");
    ValueId p = b.add_node1(OpId::Reshape, {xp}, {{"shape", Ints{N * hp * wp, C * kh * kw}}},
                            n.name, "", out + ".rows");
    // The weight as [O, C * kh * kw]: a param (const) of its own when it has data, as
    // matmul-to-linear's W^T (so constant-fold casts it once, and replace-weights derives it
    // again from new weights); else a reshape view.
    ValueId w;
    const Value& wv = g.value(n.inputs[1]);
    if (has_data(wv)) {
      w = b.add_derived(wv, wv.data.contiguous().as_strided({O, C * kh * kw}, {C * kh * kw, 1}, 0).clone(),
                        ".rows");
    } else {
      w = b.add_node1(OpId::Reshape, {b.map(n.inputs[1])}, {{"shape", Ints{O, C * kh * kw}}},
                      n.name, "", out + ".weight");
    }
    std::vector<ValueId> lin_in = {p, w};
    if (n.inputs.size() > 2 && n.inputs[2] != kNoValue) lin_in.push_back(b.map(n.inputs[2]));
    ValueId y = b.add_node1(OpId::Linear, lin_in, {}, n.name, "", out + ".gemm");
    ValueId y4 = b.add_node1(OpId::Reshape, {y}, {{"shape", Ints{N, hp, wp, O}}}, n.name, "",
                             out + ".nhwc");
    ValueId o = b.add_node1(OpId::Permute, {y4}, {{"dims", Ints{0, 3, 1, 2}}}, n.name, out);
    b.set_map(n.outputs[0], o);
  }
  g = b.finish();
  return count;
}

namespace {

class PatchConvToLinearPass : public Pass {
 public:
  std::string_view name() const override { return "patch-conv-to-linear"; }
  std::string_view description() const override {
    return "conv2d whose windows tile the input (stride = kernel, no padding) -> patch rows + "
           "linear (one GEMM)";
  }
  bool run(Graph& g) override { return patch_conv_to_linear(g) > 0; }
};

}  // namespace

std::unique_ptr<Pass> make_patch_conv_to_linear_pass() {
  return std::make_unique<PatchConvToLinearPass>();
}

}  // namespace kiln
