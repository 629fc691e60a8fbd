#include "passes/dce.h"

#include "passes/graph_rewrite.h"

namespace kiln {

DceResult eliminate_dead_code(Graph& g) {
  std::vector<bool> live = live_nodes(g);
  std::vector<bool> used(g.values.size(), false);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (live[i])
      for (ValueId v : g.nodes[i].inputs)
        if (g.valid(v)) used[size_t(v)] = true;
  for (ValueId v : g.outputs)
    if (g.valid(v)) used[size_t(v)] = true;

  DceResult r;
  for (size_t i = 0; i < g.nodes.size(); ++i) r.nodes_removed += live[i] ? 0 : 1;
  for (size_t i = 0; i < g.values.size(); ++i) {
    ValueKind k = g.values[i].kind;
    if ((k == ValueKind::Param || k == ValueKind::Const) && !used[i]) ++r.params_removed;
  }
  if (r.nodes_removed == 0 && r.params_removed == 0) return r;

  GraphBuilder b(g, [&](ValueId v) { return used[size_t(v)]; });
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (live[i]) b.copy_node(g.nodes[i]);
  g = b.finish();
  return r;
}

namespace {

class DcePass : public Pass {
 public:
  std::string_view name() const override { return "dce"; }
  std::string_view description() const override {
    return "remove nodes whose results are unused, and unused params and consts";
  }
  bool run(Graph& g) override {
    DceResult r = eliminate_dead_code(g);
    return r.nodes_removed + r.params_removed > 0;
  }
};

}  // namespace

std::unique_ptr<Pass> make_dce_pass() { return std::make_unique<DcePass>(); }

}  // namespace kiln
