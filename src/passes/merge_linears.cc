#include "passes/merge_linears.h"

#include <map>

#include "ops/api.h"
#include "ops/dispatch.h"
#include "passes/graph_rewrite.h"

namespace kiln {
namespace {

// Data of a param or const with concrete dims, else undefined.
Tensor data_of(const Graph& g, ValueId v) {
  if (v == kNoValue) return {};
  const Value& val = g.value(v);
  if (val.kind != ValueKind::Param && val.kind != ValueKind::Const) return {};
  if (!val.data.defined() || !val.data.has_storage() || !is_concrete(val.type.shape)) return {};
  return val.data;
}

bool has_bias(const Node& n) { return n.inputs.size() > 2 && n.inputs[2] != kNoValue; }

// Whether linear node n can join a group (see the header), on its own.
bool mergeable(const Graph& g, const Node& n) {
  if (n.op != OpId::Linear || n.inputs.size() < 2 || n.outputs.size() != 1) return false;
  const TensorType& xt = g.type(n.inputs[0]);
  if (!is_floating(xt.dtype) || !is_concrete(xt.shape) || xt.rank() < 1) return false;
  Tensor w = data_of(g, n.inputs[1]);
  if (!w.defined() || w.dim() != 2 || w.dtype() != xt.dtype || w.size(0) % 8 != 0 ||
      w.size(0) == 0)
    return false;
  if (has_bias(n)) {
    Tensor b = data_of(g, n.inputs[2]);
    if (!b.defined() || b.dim() != 1 || b.dtype() != xt.dtype) return false;
  }
  return true;
}

// Whether b can join a group led by a.
bool compatible(const Graph& g, const Node& a, const Node& b) {
  const Value& wa = g.value(a.inputs[1]);
  const Value& wb = g.value(b.inputs[1]);
  if (wa.data.size(1) != wb.data.size(1) || has_bias(a) != has_bias(b)) return false;
  if ((wa.kind == ValueKind::Param) != (wb.kind == ValueKind::Param)) return false;
  if (has_bias(a) && (g.value(a.inputs[2]).kind == ValueKind::Param) !=
                         (g.value(b.inputs[2]).kind == ValueKind::Param))
    return false;
  return true;
}

}  // namespace

int merge_sibling_linears(Graph& g) {
  // Groups by input value, in node order; a node joins the first compatible group of its input.
  std::vector<std::vector<int32_t>> groups;
  std::map<ValueId, std::vector<size_t>> by_input;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (!mergeable(g, n)) continue;
    std::vector<size_t>& gs = by_input[n.inputs[0]];
    bool joined = false;
    for (size_t gi : gs)
      if (compatible(g, g.nodes[size_t(groups[gi][0])], n)) {
        groups[gi].push_back(int32_t(i));
        joined = true;
        break;
      }
    if (!joined) {
      gs.push_back(groups.size());
      groups.push_back({int32_t(i)});
    }
  }
  std::vector<int> lead(g.nodes.size(), -1);  // group index of the node that leads a group
  std::vector<bool> merged_away(g.nodes.size(), false);
  int count = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    if (groups[gi].size() < 2) continue;
    lead[size_t(groups[gi][0])] = int(gi);
    for (size_t j = 1; j < groups[gi].size(); ++j) merged_away[size_t(groups[gi][j])] = true;
    count += int(groups[gi].size()) - 1;
  }
  if (count == 0) return 0;

  GraphBuilder b(g);
  NoDispatchHook no_hook;  // the concats below run now (a backend may run inside capture)
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (merged_away[i]) continue;  // its output is mapped by its group's lead
    if (lead[i] < 0) {
      b.copy_node(n);
      continue;
    }
    const std::vector<int32_t>& grp = groups[size_t(lead[i])];
    TensorList ws, bs;
    Ints sizes;
    for (int32_t ni : grp) {
      const Node& m = g.nodes[size_t(ni)];
      ws.push_back(g.value(m.inputs[1]).data);
      sizes.push_back(ws.back().size(0));
      if (has_bias(m)) bs.push_back(g.value(m.inputs[2]).data);
    }
    const Value& w0 = g.value(n.inputs[1]);
    Tensor wcat = concat(ws, 0);  // a new contiguous tensor
    std::string wname = b.fresh_name(w0.name + ".merged");
    std::vector<ValueId> in = {b.map(n.inputs[0]),
                               w0.kind == ValueKind::Param ? b.add_param(wcat, wname)
                                                           : b.add_const(wcat, wname)};
    if (!bs.empty()) {
      const Value& b0 = g.value(n.inputs[2]);
      Tensor bcat = concat(bs, 0);
      std::string bname = b.fresh_name(b0.name + ".merged");
      in.push_back(b0.kind == ValueKind::Param ? b.add_param(bcat, bname) : b.add_const(bcat, bname));
    }
    const std::string& out0 = g.value(n.outputs[0]).name;
    ValueId y = b.add_node1(OpId::Linear, in, {}, n.name, "", out0 + ".merged");
    std::vector<std::string> names;
    for (int32_t ni : grp) names.push_back(g.value(g.nodes[size_t(ni)].outputs[0]).name);
    std::vector<ValueId> parts =
        b.add_node(OpId::Split, {y}, {{"sizes", sizes}, {"dim", int64_t(-1)}}, n.name, names);
    for (size_t j = 0; j < grp.size(); ++j) b.set_map(g.nodes[size_t(grp[j])].outputs[0], parts[j]);
  }
  g = b.finish();
  return count;
}

namespace {

class MergeSiblingLinearsPass : public Pass {
 public:
  std::string_view name() const override { return "merge-sibling-linears"; }
  std::string_view description() const override {
    return "linears of one input -> one linear over the concatenated weights, then split "
           "(one GEMM for BERT's q, k and v)";
  }
  bool run(Graph& g) override { return merge_sibling_linears(g) > 0; }
};

}  // namespace

std::unique_ptr<Pass> make_merge_sibling_linears_pass() {
  return std::make_unique<MergeSiblingLinearsPass>();
}

}  // namespace kiln
