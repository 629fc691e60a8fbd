// The ONNX op table: ONNX op type -> a converter that appends Kiln nodes for one ONNX node.
// One ONNX op may become several Kiln ops (Gemm -> permute/matmul/mul/add); ops that Kiln has no
// kernel for are composed from existing ones at import time (LeakyRelu = where(x < 0, a*x, x)).
// Each entry declares every Kiln op its converter may emit: the importer checks each emission
// against that list (an undeclared op is an internal error), and a registry extension
// (register_op_extension) copies the lists into OpDef::onnx_ops, so `kiln ops --json` reports
// the mapping.
#pragma once
#include <span>
#include <string_view>
#include <vector>

#include "ops/op.h"

namespace kiln::onnx {

class NodeCtx;
using ConvertFn = void (*)(NodeCtx&);

struct OnnxOpEntry {
  std::string_view op_type;   // default domain ("" / "ai.onnx")
  ConvertFn convert = nullptr;
  std::vector<OpId> kiln_ops;  // empty: always folded into a constant at import (Shape, Range)
  std::string_view note;      // what the mapping does not cover, or how it is composed
};

// Sorted by op_type.
std::span<const OnnxOpEntry> onnx_op_table();
const OnnxOpEntry* find_onnx_op(std::string_view op_type);

// Makes sure OpDef::onnx_ops is filled from the table (the extension runs when the registry is
// built; this only forces that; idempotent, thread-safe).
void register_onnx_mappings();

// Converter families (one per file), called once to build the table.
void add_elementwise_converters(std::vector<OnnxOpEntry>& table);
void add_nn_converters(std::vector<OnnxOpEntry>& table);
void add_shape_converters(std::vector<OnnxOpEntry>& table);
void add_reduce_converters(std::vector<OnnxOpEntry>& table);
void add_resample_converters(std::vector<OnnxOpEntry>& table);
void add_quant_converters(std::vector<OnnxOpEntry>& table);
void add_misc_converters(std::vector<OnnxOpEntry>& table);
void add_rnn_converters(std::vector<OnnxOpEntry>& table);
void add_attention_converters(std::vector<OnnxOpEntry>& table);
void add_dynamic_converters(std::vector<OnnxOpEntry>& table);

}  // namespace kiln::onnx
