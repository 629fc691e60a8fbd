#include "passes/attention_heads_last.h"

#include <algorithm>

#include "passes/graph_rewrite.h"

namespace kiln {
namespace {

// Whether node t swaps dims r - 3 and r - 2 of its rank-r input and nothing else.
bool swaps_heads_and_rows(const Node& t, int64_t r) {
  auto norm = [&](int64_t d) { return d < 0 ? d + r : d; };
  if (t.op == OpId::Transpose) {
    int64_t a = norm(t.attrs.get_int("dim0")), b = norm(t.attrs.get_int("dim1"));
    return std::min(a, b) == r - 3 && std::max(a, b) == r - 2;
  }
  if (t.op == OpId::Permute) {
    const Ints& dims = t.attrs.get_ints("dims");
    if (int64_t(dims.size()) != r) return false;
    for (int64_t i = 0; i < r; ++i) {
      int64_t want = i == r - 3 ? r - 2 : i == r - 2 ? r - 3 : i;
      if (norm(dims[size_t(i)]) != want) return false;
    }
    return true;
  }
  return false;
}

}  // namespace

int attention_heads_last(Graph& g) {
  const std::vector<int> uses = g.use_counts();
  std::vector<bool> is_output(g.values.size(), false);
  for (ValueId o : g.outputs) is_output[size_t(o)] = true;
  // consumer[v]: the node index of v's one use, -1 when it has another number of uses.
  std::vector<int32_t> consumer(g.values.size(), -1);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (ValueId v : g.nodes[i].inputs)
      if (v != kNoValue && uses[size_t(v)] == 1) consumer[size_t(v)] = int32_t(i);
  std::vector<int32_t> transpose_of(g.nodes.size(), -1);  // attention node -> its transpose
  std::vector<bool> dropped(g.nodes.size(), false);
  int count = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.op != OpId::ScaledDotProductAttention || n.attrs.get_bool("heads_last")) continue;
    const ValueId o = n.outputs[0];
    const int64_t r = g.type(o).rank();
    if (r < 3 || is_output[size_t(o)] || consumer[size_t(o)] < 0) continue;
    const Node& t = g.nodes[size_t(consumer[size_t(o)])];
    if (t.inputs.empty() || t.inputs[0] != o || !swaps_heads_and_rows(t, r)) continue;
    transpose_of[i] = consumer[size_t(o)];
    dropped[size_t(consumer[size_t(o)])] = true;
    ++count;
  }
  if (count == 0) return 0;
  GraphBuilder b(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (dropped[i]) continue;  // its output was mapped to the attention's
    if (transpose_of[i] < 0) {
      b.copy_node(n);
      continue;
    }
    const Node& t = g.nodes[size_t(transpose_of[i])];
    Attrs a = n.attrs;
    a.set("heads_last", true);
    b.set_map(t.outputs[0], b.add_node1(n.op, b.map(n.inputs), a, n.name, g.value(t.outputs[0]).name));
  }
  g = b.finish();
  return count;
}

namespace {

class AttentionHeadsLastPass : public Pass {
 public:
  std::string_view name() const override { return "attention-heads-last"; }
  std::string_view description() const override {
    return "attention whose output is only transposed to [..., L, H, Ev] writes it so (no copy "
           "before the output projection)";
  }
  bool run(Graph& g) override { return attention_heads_last(g) > 0; }
};

}  // namespace

std::unique_ptr<Pass> make_attention_heads_last_pass() {
  return std::make_unique<AttentionHeadsLastPass>();
}

}  // namespace kiln
