// The ONNX frontend: an .onnx file in, a Kiln Graph out. See Note [ONNX import].
//
// Note [ONNX import]
// import_onnx reads a ModelProto (and external-data files next to it) and builds a Graph:
//   - initializers become params (with data), created only when a node reads them as a tensor;
//     shape-like inputs (Reshape's shape, Slice's starts, Pad's pads, ...) that are initializers
//     or constants are read at import time as attributes of the Kiln nodes;
//   - graph inputs that are not initializers become graph inputs; a dim_param becomes a
//     symbolic SymInt (kiln::run binds it from the actual input sizes);
//   - each ONNX node goes through the op table (op_table.h), which appends one or more Kiln
//     nodes; a node whose inputs are all known at import time (Shape, Size, ConstantOfShape,
//     Range, small arithmetic on constants) is folded into a constant;
//   - graph outputs keep their ONNX names.
// Every op type is checked against the table before anything is converted: one NotSupported
// error lists every unmapped op type with its node names. Malformed or hostile files get a
// kiln::Error naming the file and node: bad protobuf, dangling or duplicate value names, cycles,
// tensors whose declared size disagrees with their data, sizes beyond ImportOptions' limits,
// external-data paths that leave the model's directory.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace kiln {

struct ImportOptions {
  // Largest tensor the importer materializes (an initializer, a Constant, a folded constant,
  // ConstantOfShape's output). Bigger declared sizes are rejected before any allocation.
  int64_t max_tensor_bytes = int64_t(4) << 30;
  // Nodes whose inputs are all known are folded into constants when their outputs have at most
  // this many elements (shape arithmetic); larger ones stay nodes over constant inputs.
  int64_t max_fold_elements = 1 << 16;
  // Largest .onnx file read (protobuf itself cannot parse more than 2 GiB).
  int64_t max_model_bytes = (int64_t(2) << 30) - 1;
  // Graph inputs bound to values at import time: they become constants (and leave the graph's
  // inputs), specializing the model. Kiln needs shape-like arguments (Reshape's shape, Slice's
  // starts, Pad's pads, ...) at import time; a model that takes them as graph inputs imports
  // once they are bound. Each value must match the input's declared dtype and shape.
  std::vector<std::pair<std::string, Tensor>> constant_inputs;
  // Graph input shapes that replace the declared ones (to fix a batch size, or when a model
  // declares shapes its real inputs do not have).
  std::vector<std::pair<std::string, std::vector<int64_t>>> input_shapes;
  // When set and an import fails because a value computed from graph inputs is needed at
  // import time, the names of those graph inputs are appended here (so that a caller can bind
  // them through constant_inputs and import again).
  std::vector<std::string>* needed_constant_inputs = nullptr;
};

// Imports the model at `path`. External data is resolved relative to the model's directory.
Graph import_onnx(const std::string& path, const ImportOptions& options = {});
// Imports a serialized ModelProto held in memory; `model_dir` resolves external data ("" = no
// external data allowed); `source` names the model in errors.
Graph import_onnx_bytes(std::string_view bytes, const std::string& model_dir,
                        const std::string& source, const ImportOptions& options = {});

// Note [Data-dependent tails]
// Some models compute sizes from values: NonZero, NonMaxSuppression, an If on a computed
// condition, a TopK or Reshape whose k or shape is computed (detectors' post-processing). A
// static graph cannot hold them. import_onnx_split imports such a model in two parts, as
// torch.compile breaks a graph at a data-dependent op:
//   - the graph: every node whose converter has what it needs at import time (the backbone,
//     the heads, the box decoding), compiled like any model. Its outputs are the values the
//     second part reads (named as in the file);
//   - the tail: the node that first needed a value computed at run time (the converter's
//     data-dependent error), every node that reads what a tail node makes, in order. It
//     keeps the ONNX nodes; run_onnx_tail runs them with the call's values through the same
//     converters, in an import state where every operand is known, so each Kiln op they emit
//     runs at once on the eager kernels (NoDispatchHook) and nothing is recorded.
// A value the tail reads may also be known at import (a constant): the tail keeps it. Under
// capture (kiln::compile of a function that runs the graph, then the tail), run_onnx_tail's
// first act, reading its inputs' data, is a graph break: the graph runs compiled, the tail
// eagerly on every call (Note [Capture]). A model without such a node imports whole
// (tail null). import_onnx keeps refusing these models, naming the node.
struct OnnxTail;
struct OnnxSplitImport {
  Graph graph;
  std::shared_ptr<const OnnxTail> tail;  // null: the graph is the whole model
};
OnnxSplitImport import_onnx_split(const std::string& path, const ImportOptions& options = {});
OnnxSplitImport import_onnx_split_bytes(std::string_view bytes, const std::string& model_dir,
                                        const std::string& source,
                                        const ImportOptions& options = {});
// The tail over the graph's outputs (in order): the model's outputs, on the CPU.
TensorList run_onnx_tail(const OnnxTail& tail, const TensorList& graph_outputs);
// The whole model: `graph` through the interpreter (recorded under capture), then `tail`
// where there is one (null: the graph's outputs are the model's).
TensorList run_onnx_split(const Graph& graph, const OnnxTail* tail, const TensorList& inputs);
// "N of M ONNX nodes run op by op ..., from node 'X' (NonZero), ..." for reports.
std::string describe_onnx_tail(const OnnxTail& tail);
// The model's output names, in order (what run_onnx_tail returns).
const std::vector<std::string>& onnx_tail_outputs(const OnnxTail& tail);

// A serialized TensorProto file (the ONNX backend tests' input_N.pb / output_N.pb) as a Tensor.
// `name` receives the TensorProto's name when not null.
// ONNX 1.12's backend tests store bfloat16 data as uint16 bit patterns; with
// uint16_as_bfloat16 such a tensor is read as bfloat16 (Kiln has no uint16).
Tensor read_onnx_tensor_file(const std::string& path, std::string* name = nullptr,
                             const ImportOptions& options = {}, bool uint16_as_bfloat16 = false);

// What a model needs, without importing it (used by `kiln conformance` to tell unmapped cases
// from failures).
struct OnnxModelScan {
  int64_t opset = 0;  // default-domain opset
  std::vector<std::string> input_names;  // graph inputs that are not initializers, in order
  // Their declared dims, -1 where a dim is symbolic or not given (empty: no shape declared).
  std::vector<std::vector<int64_t>> input_dims;
  // Their dims' symbolic names (dim_param; "" for a fixed dim or one without a name).
  std::vector<std::vector<std::string>> input_dim_names;
  // The graph outputs, in order, and their dims' symbolic names ("" where fixed or unnamed).
  std::vector<std::string> output_names;
  std::vector<std::vector<std::string>> output_dim_names;
  // "OpType" (or "domain:OpType") -> node names, for every op type not in the op table.
  std::vector<std::pair<std::string, std::vector<std::string>>> unmapped_ops;
  // Every op type used, sorted, unique ("domain:OpType" outside the default domain).
  std::vector<std::string> op_types;
  // Values whose type Kiln cannot represent: "input 'x': string", "output 'y': sequence", ...
  std::vector<std::string> unsupported_types;
};
OnnxModelScan scan_onnx_model(const std::string& path, const ImportOptions& options = {});

}  // namespace kiln
