// The ATen mapping of the op records: which core-ATen overloads ("aten.add.Tensor") the Python
// frontend lowers to each Kiln op. The one table is python/kiln/aten_table.py (the frontend
// itself is Python: python/kiln/lowering.py); the build turns its (Kiln op, ATen overload) pairs
// into aten_ops.inc (python/tools/gen_aten_ops.py), and this layer attaches them to the op
// records through a registry extension (register_op_extension, ops/op.h), the way the ONNX
// frontend fills OpDef::onnx_ops: `kiln ops --json` reports them as each op's "aten"
// capability. docs/python.md, "The ATen table".
#pragma once
#include <span>
#include <string_view>
#include <utility>

namespace kiln::aten {

// (Kiln op name, ATen overload) pairs, sorted, as generated from the ATen table.
std::span<const std::pair<std::string_view, std::string_view>> aten_op_pairs();

// Makes sure OpDef::aten_ops is filled from the table (the extension runs when the registry is
// built; this only forces that; idempotent, thread-safe).
void register_aten_mappings();

}  // namespace kiln::aten
