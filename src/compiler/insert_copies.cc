#include "compiler/insert_copies.h"

#include <algorithm>

namespace kiln::compiler {

Dims normalized_strides(const lower::ViewGeometry& geo) {
  Dims st = geo.strides;
  int64_t extent = 1;
  for (size_t i = geo.sizes.size(); i-- > 0;) {
    if (geo.sizes[i] == 1) st[i] = extent;
    extent = std::max(extent, st[i] * geo.sizes[i]);
  }
  return st;
}

bool contiguous_geometry(const lower::ViewGeometry& geo) {
  return normalized_strides(geo) == contiguous_strides(geo.sizes);
}

CopiedGraph insert_copies(Graph& g, KernelChoice& choice, const Target& target) {
  CopiedGraph out;
  out.view_is_copy = lower::planned_view_copies(g);
  std::vector<Node> old = std::move(g.nodes);
  KernelChoice before = std::move(choice);
  choice = KernelChoice{};
  g.nodes.clear();
  auto push_choice = [&](bool lib, bool gemv, bool gen) {
    choice.library.push_back(lib);
    choice.gemv.push_back(gemv);
    choice.generated.push_back(gen);
  };
  for (size_t i = 0; i < old.size(); ++i) {
    Node n = std::move(old[i]);
    const OpDef& d = op_def(n.op);
    bool lib = before.library[i];
    // A small linear is a generated GEMV (a loop kernel): it reads what loop kernels read.
    bool eager = !lib && !d.is_view && !before.generated[i] && !before.gemv[i];
    size_t strided_before = out.strided_operands.size();
    if (lib || eager) {
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        ValueId v = n.inputs[k];
        if (v == kNoValue) continue;
        // Off the CPU, an eager kernel never reads a call's input tensor itself (it may be on
        // the host): it gets a device copy, made by a generated copy kernel.
        if (eager && !target.device().is_cpu() && g.value(v).kind == ValueKind::Input) {
          ValueId copy = g.add_node1(OpId::Copy, {v}, {}, n.name.empty() ? "" : n.name + ".copy");
          push_choice(false, false, target.generates(g, g.nodes.back()));
          n.inputs[k] = copy;
          continue;
        }
        if (g.value(v).kind != ValueKind::NodeOutput) continue;
        if (!op_def(g.nodes[size_t(g.value(v).producer)].op).is_view) continue;
        lower::ViewGeometry geo;
        bool ok = lower::resolve_view(g, v, out.view_is_copy, &geo);
        bool contiguous = ok && contiguous_geometry(geo);
        bool strided = lib && ok && !contiguous && target.library_reads_strided(g, n, int(k), geo);
        if (strided) {
          Dims st = normalized_strides(geo);
          out.strided_operands.push_back({-1, int(k), std::vector<int64_t>(st.begin(), st.end())});
        }
        bool needs = !ok || (lib && !contiguous && !strided) ||
                     (eager && g.value(geo.base).kind == ValueKind::Input);
        if (!needs) continue;
        ValueId copy = g.add_node1(OpId::Copy, {v}, {}, n.name.empty() ? "" : n.name + ".copy");
        push_choice(false, false, target.generates(g, g.nodes.back()));
        n.inputs[k] = copy;
      }
    }
    g.nodes.push_back(std::move(n));
    push_choice(lib, before.gemv[i], before.generated[i]);
    int32_t idx = int32_t(g.nodes.size()) - 1;
    if (lib) out.library_nodes.push_back(idx);
    for (size_t j = strided_before; j < out.strided_operands.size(); ++j)
      out.strided_operands[j].node = idx;
    for (size_t o = 0; o < g.nodes.back().outputs.size(); ++o) {
      Value& ov = g.value(g.nodes.back().outputs[o]);
      ov.producer = idx;
      ov.output_index = int32_t(o);
    }
  }
  out.view_is_copy.resize(g.values.size(), false);  // the copies' outputs
  return out;
}

}  // namespace kiln::compiler
