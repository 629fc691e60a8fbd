// The ONNX op table, assembled from the converter families. See op_table.h.
#include "frontends/onnx/op_table.h"

#include <algorithm>
#include <mutex>

namespace kiln::onnx {

namespace {

std::vector<OnnxOpEntry> build_table() {
  std::vector<OnnxOpEntry> t;
  add_elementwise_converters(t);
  add_nn_converters(t);
  add_shape_converters(t);
  add_reduce_converters(t);
  add_resample_converters(t);
  add_quant_converters(t);
  add_misc_converters(t);
  add_rnn_converters(t);
  add_attention_converters(t);
  add_dynamic_converters(t);
  std::sort(t.begin(), t.end(),
            [](const OnnxOpEntry& a, const OnnxOpEntry& b) { return a.op_type < b.op_type; });
  for (size_t i = 1; i < t.size(); ++i)
    KILN_ASSERT(t[i].op_type != t[i - 1].op_type);  // one entry per op type
  return t;
}

const std::vector<OnnxOpEntry>& table() {
  static const std::vector<OnnxOpEntry> t = build_table();
  return t;
}

}  // namespace

std::span<const OnnxOpEntry> onnx_op_table() { return table(); }

const OnnxOpEntry* find_onnx_op(std::string_view op_type) {
  const auto& t = table();
  auto it = std::lower_bound(t.begin(), t.end(), op_type,
                             [](const OnnxOpEntry& e, std::string_view s) { return e.op_type < s; });
  return it != t.end() && it->op_type == op_type ? &*it : nullptr;
}

namespace {
// The ONNX mapping is attached to the op records by the frontend, through a registry extension
// (the op layer does not know about ONNX). The table is the one source of truth, so it replaces
// whatever a family file declared.
void attach_onnx_mapping() {
  std::vector<std::vector<std::string>> mapping(static_cast<size_t>(kNumOps));
  for (const OnnxOpEntry& e : table())
    for (OpId id : e.kiln_ops) {
      auto& v = mapping[size_t(id)];
      if (std::find(v.begin(), v.end(), e.op_type) == v.end()) v.emplace_back(e.op_type);
    }
  for (int i = 0; i < kNumOps; ++i) define_op(OpId(i)).onnx_ops = std::move(mapping[size_t(i)]);
}
const bool g_registered = register_op_extension("onnx-mapping", &attach_onnx_mapping);
}  // namespace

void register_onnx_mappings() {
  (void)g_registered;
  (void)op_def(OpId(0));  // the registry (and with it the extension) is built on first use
}

}  // namespace kiln::onnx
