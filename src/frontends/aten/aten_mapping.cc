// OpDef::aten_ops from the Python frontend's ATen table. See aten_mapping.h.
#include "frontends/aten/aten_mapping.h"

#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "ops/op.h"

namespace kiln::aten {

namespace {
constexpr std::pair<std::string_view, std::string_view> kPairs[] = {
#include "aten_ops.inc"
};

// The table is the one source of truth, so it replaces whatever a family file declared.
void attach_aten_mapping() {
  // By name through define_op: find_op would build the registry, which is being built now.
  std::unordered_map<std::string_view, OpId> by_name;
  for (int i = 0; i < kNumOps; ++i) by_name.emplace(define_op(OpId(i)).name, OpId(i));
  std::vector<std::vector<std::string>> mapping(static_cast<size_t>(kNumOps));
  for (const auto& [kiln_op, aten_op] : kPairs) {
    auto it = by_name.find(kiln_op);
    // The ATen table names an op that ops.def does not have (python/kiln/aten_table.py).
    KILN_CHECK(it != by_name.end(), "ATen table: '{}' (for {}) is not a Kiln op", kiln_op, aten_op);
    mapping[size_t(it->second)].emplace_back(aten_op);
  }
  for (int i = 0; i < kNumOps; ++i) define_op(OpId(i)).aten_ops = std::move(mapping[size_t(i)]);
}
const bool g_registered = register_op_extension("aten-mapping", &attach_aten_mapping);
}  // namespace

std::span<const std::pair<std::string_view, std::string_view>> aten_op_pairs() { return kPairs; }

void register_aten_mappings() {
  (void)g_registered;
  (void)op_def(OpId(0));  // the registry (and with it the extension) is built on first use
}

}  // namespace kiln::aten
