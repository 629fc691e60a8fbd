#include "passes/grid_sample_layout.h"

#include <unordered_map>

#include "passes/graph_rewrite.h"

namespace kiln {
namespace {

constexpr int64_t kChannelMultiple = 16;

// Whether node n is a grid_sample the rewrite applies to, before the per-source count.
bool candidate(const Graph& g, const Node& n) {
  if (n.op != OpId::GridSample || n.inputs.size() < 2 || n.outputs.size() != 1) return false;
  const TensorType& xt = g.type(n.inputs[0]);
  const TensorType& yt = g.type(n.outputs[0]);
  if (xt.dtype != DType::Float32 || yt.dtype != DType::Float32 || xt.rank() != 4 ||
      !is_concrete(xt.shape) || !is_concrete(yt.shape) || !is_concrete(g.type(n.inputs[1]).shape))
    return false;
  const int64_t c = xt.shape[1].value(), h = xt.shape[2].value(), w = xt.shape[3].value();
  if (c <= 0 || c % kChannelMultiple != 0 || h * w <= 1) return false;
  // Already this pass's view (the pass runs twice: nothing more to do).
  const Node* p = producer_of(g, n.inputs[0]);
  const Node* q = p && p->op == OpId::Permute ? producer_of(g, p->inputs[0]) : nullptr;
  return !(q && q->op == OpId::Copy && p->attrs.get_ints("dims") == Ints{0, 3, 1, 2});
}

int64_t elements(const TensorType& t) { return numel(to_dims(t.shape)); }

}  // namespace

int grid_sample_channels_last(Graph& g) {
  // The sources worth a copy: their grid_samples' outputs at least as large as they are.
  std::unordered_map<ValueId, int64_t> sampled;  // source -> elements its grid_samples write
  for (const Node& n : g.nodes)
    if (candidate(g, n)) sampled[n.inputs[0]] += elements(g.type(n.outputs[0]));
  std::unordered_map<ValueId, ValueId> copied;  // old source -> new channels-last view
  for (const auto& [x, out] : sampled)
    if (out >= elements(g.type(x))) copied.emplace(x, kNoValue);
  if (copied.empty()) return 0;
  GraphBuilder b(g);
  for (const Node& n : g.nodes) {
    auto it = candidate(g, n) ? copied.find(n.inputs[0]) : copied.end();
    if (it == copied.end()) {
      b.copy_node(n);
      continue;
    }
    if (it->second == kNoValue) {  // the first grid_sample of this source makes the copy
      const std::string& name = g.value(it->first).name;
      ValueId nhwc = b.add_node1(OpId::Permute, {b.map(it->first)}, {{"dims", Ints{0, 2, 3, 1}}},
                                 n.name, "", name + ".nhwc_view");
      ValueId stored = b.add_node1(OpId::Copy, {nhwc}, {}, n.name, "", name + ".nhwc");
      it->second = b.add_node1(OpId::Permute, {stored}, {{"dims", Ints{0, 3, 1, 2}}}, n.name, "",
                               name + ".channels_last");
    }
    std::vector<ValueId> in = b.map(n.inputs);
    in[0] = it->second;
    std::vector<ValueId> outs = b.add_node(n.op, in, n.attrs, n.name, {g.value(n.outputs[0]).name});
    b.set_map(n.outputs[0], outs[0]);
  }
  g = b.finish();
  return int(copied.size());
}

namespace {

class GridSampleChannelsLastPass : public Pass {
 public:
  std::string_view name() const override { return "grid-sample-channels-last"; }
  std::string_view description() const override {
    return "a float32 grid_sample source with channels a multiple of 16, sampled at least its "
           "own size, copied channels-last once and read through a permuted view";
  }
  bool run(Graph& g) override { return grid_sample_channels_last(g) > 0; }
};

}  // namespace

std::unique_ptr<Pass> make_grid_sample_channels_last_pass() {
  return std::make_unique<GridSampleChannelsLastPass>();
}

}  // namespace kiln
