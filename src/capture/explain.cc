// ExplainReport rendering: JSON (for tools and tests) and text (for people).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "capture/compile.h"

namespace kiln {

std::string ExplainReport::json() const {
  nlohmann::json j;
  j["graphs"] = nlohmann::json::array();
  for (const ExplainGraph& g : graphs)
    j["graphs"].push_back({{"ops", g.ops},
                           {"num_ops", g.ops.size()},
                           {"inputs", g.num_inputs},
                           {"params", g.num_params},
                           {"outputs", g.num_outputs},
                           {"backend", g.backend_summary},
                           {"baked", g.baked},
                           {"ir", g.ir}});
  j["breaks"] = nlohmann::json::array();
  for (const ExplainBreak& b : breaks)
    j["breaks"].push_back({{"reason", b.reason}, {"location", b.location}});
  j["guards"] = guards;
  j["recompiles"] = recompiles;
  j["fallbacks"] = fallbacks;
  j["stats"] = {{"calls", stats.calls},
                {"compiled_calls", stats.compiled_calls},
                {"traces", stats.traces},
                {"graphs_compiled", stats.graphs_compiled},
                {"recompiles", stats.recompiles},
                {"graph_breaks", stats.graph_breaks},
                {"fallbacks_cache_limit", stats.fallbacks_cache_limit},
                {"fallbacks_compile_error", stats.fallbacks_compile_error},
                {"fallbacks_runtime_error", stats.fallbacks_runtime_error},
                {"entries", stats.entries},
                {"host_value_checks", stats.host_value_checks}};
  return j.dump(2);
}

std::string ExplainReport::text() const {
  std::string s;
  s += fmt::format("graphs: {}   breaks: {}   entries: {}   recompiles: {}   fallbacks: {}\n",
                   graphs.size(), breaks.size(), stats.entries, recompiles.size(),
                   fallbacks.size());
  for (size_t i = 0; i < graphs.size(); ++i) {
    const ExplainGraph& g = graphs[i];
    std::string ops;
    for (size_t k = 0; k < g.ops.size(); ++k) {
      if (k == 12) {
        ops += fmt::format(", ... ({} more)", g.ops.size() - k);
        break;
      }
      ops += (k ? ", " : "") + g.ops[k];
    }
    s += fmt::format("graph {}: {} ops, {} inputs, {} params, {} outputs [{}]\n  {}\n", i,
                     g.ops.size(), g.num_inputs, g.num_params, g.num_outputs, g.backend_summary,
                     ops);
    // Everything the graph froze from the host (the JSON form lists all of it).
    constexpr size_t kShown = 16;
    for (size_t k = 0; k < g.baked.size() && k < kShown; ++k) s += "  baked: " + g.baked[k] + "\n";
    if (g.baked.size() > kShown)
      s += fmt::format("  baked: ... ({} more; --json lists all)\n", g.baked.size() - kShown);
  }
  for (size_t i = 0; i < breaks.size(); ++i)
    s += fmt::format("break {}: at {}: {}\n", i, breaks[i].location, breaks[i].reason);
  if (!guards.empty()) s += "guards:\n";
  for (const std::string& g : guards) s += "  " + g + "\n";
  for (const std::string& r : recompiles) s += "recompile: " + r + "\n";
  for (const std::string& f : fallbacks) s += "fallback: " + f + "\n";
  return s;
}

}  // namespace kiln
