#include "passes/cse.h"

#include <algorithm>
#include <unordered_map>

#include "passes/graph_rewrite.h"

namespace kiln {
namespace {


// Consts larger than this are not compared (hashing them costs more than a duplicate is worth).
constexpr int64_t kMaxConstCompareElements = 1 << 16;

// Key of a const's contents: type + raw bytes (contiguous copy).
std::string const_key(const Value& v) {
  Tensor t = v.data;
  if (!t.device().is_cpu()) t = t.to(Device::cpu());
  t = t.contiguous();
  std::string key = v.type.str();
  key += '\n';
  key.append(static_cast<const char*>(t.raw_data()), t.nbytes());
  return key;
}

std::string node_key(const Node& n, std::vector<ValueId> inputs) {
  // linear(%x, %w, _) and linear(%x, %w) are the same computation.
  while (!inputs.empty() && inputs.back() == kNoValue) inputs.pop_back();
  if (op_has(n.op, trait::Commutative)) std::sort(inputs.begin(), inputs.end());
  std::string key = op_def(n.op).name;
  key += '(';
  for (ValueId v : inputs) key += std::to_string(v) + ',';
  key += "){";
  for (auto& [name, value] : n.attrs.items()) key += name + "=" + attr_value_str(value) + ";";
  key += '}';
  return key;
}

}  // namespace

CseResult eliminate_common_subexpressions(Graph& g) {
  CseResult r;
  // Consts: the first of each content wins. Old id -> old id of the representative.
  std::vector<ValueId> const_rep(g.values.size(), kNoValue);
  std::unordered_map<std::string, ValueId> consts;
  for (size_t i = 0; i < g.values.size(); ++i) {
    const Value& v = g.values[i];
    if (v.kind != ValueKind::Const || !v.data.defined() || !v.data.has_storage() ||
        v.data.numel() > kMaxConstCompareElements)
      continue;
    auto [it, inserted] = consts.emplace(const_key(v), ValueId(i));
    if (!inserted) {
      const_rep[i] = it->second;
      ++r.consts_merged;
    }
  }

  // Nodes: keyed on old ids with duplicates resolved, so the scan needs no rebuilt graph.
  std::vector<ValueId> rep(g.values.size());
  for (size_t i = 0; i < rep.size(); ++i) rep[i] = const_rep[i] == kNoValue ? ValueId(i) : const_rep[i];
  std::vector<bool> drop(g.nodes.size(), false);
  std::unordered_map<std::string, size_t> seen;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    std::vector<ValueId> ins;
    for (ValueId v : n.inputs) ins.push_back(v == kNoValue ? kNoValue : rep[size_t(v)]);
    auto [it, inserted] = seen.emplace(node_key(n, std::move(ins)), i);
    if (inserted) continue;
    const Node& first = g.nodes[it->second];
    for (size_t k = 0; k < n.outputs.size(); ++k) rep[size_t(n.outputs[k])] = first.outputs[k];
    drop[i] = true;
    ++r.nodes_merged;
  }
  if (r.nodes_merged == 0 && r.consts_merged == 0) return r;

  GraphBuilder b(g, [&](ValueId v) { return const_rep[size_t(v)] == kNoValue; });
  for (size_t i = 0; i < g.values.size(); ++i)
    if (const_rep[i] != kNoValue) b.set_map(ValueId(i), b.map(const_rep[i]));
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (!drop[i]) {
      b.copy_node(n);
      continue;
    }
    for (ValueId o : n.outputs) b.set_map(o, b.map(rep[size_t(o)]));
  }
  g = b.finish();
  return r;
}

namespace {

class CsePass : public Pass {
 public:
  std::string_view name() const override { return "cse"; }
  std::string_view description() const override {
    return "merge nodes with the same op, inputs and attributes, and equal consts";
  }
  bool run(Graph& g) override {
    CseResult r = eliminate_common_subexpressions(g);
    return r.nodes_merged + r.consts_merged > 0;
  }
};

}  // namespace

std::unique_ptr<Pass> make_cse_pass() { return std::make_unique<CsePass>(); }

}  // namespace kiln
