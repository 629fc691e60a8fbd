#!/usr/bin/env python3
"""Writes the fuzz seed corpora for ONNX, .npy and safetensors (tests/fuzz/corpus/<name>/).

Run once by hand with the venv's Python (numpy, onnx); the outputs are checked in and small
(each under a few KB). The IR seeds are cases cut from tests/ir/*.kir. Every file is
deterministic, so rerunning this changes nothing unless the script changes.
"""
import json
import os
import struct
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(16)


def out(name, sub):
    d = os.path.join(ROOT, "corpus", sub)
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, name)


# ---- ONNX ---------------------------------------------------------------------------------------
F = TensorProto.FLOAT


def model(name, nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                          producer_name="kiln-fuzz-seeds")
    m.ir_version = 8
    with open(out(name + ".onnx", "onnx"), "wb") as f:
        f.write(m.SerializeToString())


def vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def init(name, a):
    return numpy_helper.from_array(np.asarray(a), name)


model("relu", [helper.make_node("Relu", ["x"], ["y"])], [vi("x", F, [2, 3])], [vi("y", F, [2, 3])])
model("conv_relu",
      [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
       helper.make_node("Relu", ["c"], ["y"])],
      [vi("x", F, [1, 2, 4, 4])], [vi("y", F, [1, 3, 4, 4])],
      [init("w", rng.standard_normal((3, 2, 3, 3)).astype(np.float32)),
       init("b", np.zeros(3, np.float32))])
model("gemm_softmax",
      [helper.make_node("Gemm", ["x", "w", "b"], ["g"], transB=1),
       helper.make_node("Softmax", ["g"], ["y"], axis=-1)],
      [vi("x", F, ["batch", 4])], [vi("y", F, ["batch", 3])],
      [init("w", rng.standard_normal((3, 4)).astype(np.float32)), init("b", np.ones(3, np.float32))])
model("reshape_transpose",
      [helper.make_node("Reshape", ["x", "shape"], ["r"]),
       helper.make_node("Transpose", ["r"], ["y"], perm=[1, 0])],
      [vi("x", F, [2, 3, 2])], [vi("y", F, [6, 2])], [init("shape", np.array([2, -1], np.int64))])
model("slice_concat",
      [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["s"]),
       helper.make_node("Concat", ["s", "x"], ["y"], axis=1)],
      [vi("x", F, [2, 4])], [vi("y", F, [2, 6])],
      [init("starts", np.array([1], np.int64)), init("ends", np.array([3], np.int64)),
       init("axes", np.array([1], np.int64))])
model("shape_constantofshape",
      [helper.make_node("Shape", ["x"], ["s"]),
       helper.make_node("ConstantOfShape", ["s"], ["z"],
                        value=helper.make_tensor("v", F, [1], [0.5])),
       helper.make_node("Add", ["x", "z"], ["y"])],
      [vi("x", F, [3, 2])], [vi("y", F, [3, 2])])
model("matmul_add_cast",
      [helper.make_node("MatMul", ["x", "w"], ["m"]),
       helper.make_node("Add", ["m", "b"], ["a"]),
       helper.make_node("Cast", ["a"], ["y"], to=TensorProto.FLOAT16)],
      [vi("x", F, [2, 3])], [vi("y", TensorProto.FLOAT16, [2, 2])],
      [init("w", rng.standard_normal((3, 2)).astype(np.float32)), init("b", np.ones(2, np.float32))])
model("reducesum_axes_input",
      [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
      [vi("x", F, [2, 3, 4])], [vi("y", F, [2, 4])], [init("axes", np.array([1], np.int64))], opset=13)
model("constant_gather_where",
      [helper.make_node("Constant", [], ["idx"], value=numpy_helper.from_array(np.array([0, 2], np.int64))),
       helper.make_node("Gather", ["x", "idx"], ["g"], axis=1),
       helper.make_node("Greater", ["g", "zero"], ["pos"]),
       helper.make_node("Where", ["pos", "g", "zero"], ["y"])],
      [vi("x", F, [2, 3])], [vi("y", F, [2, 2])], [init("zero", np.zeros(1, np.float32))])
model("pool_bn",
      [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["n"]),
       helper.make_node("MaxPool", ["n"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
       helper.make_node("GlobalAveragePool", ["p"], ["y"])],
      [vi("x", F, [1, 2, 4, 4])], [vi("y", F, [1, 2, 1, 1])],
      [init("s", np.ones(2, np.float32)), init("b", np.zeros(2, np.float32)),
       init("m", np.zeros(2, np.float32)), init("v", np.ones(2, np.float32))])
model("layernorm_int64",
      [helper.make_node("LayerNormalization", ["x", "s", "b"], ["n"], axis=-1),
       helper.make_node("ArgMax", ["n"], ["y"], axis=1, keepdims=0)],
      [vi("x", F, [2, 4])], [vi("y", TensorProto.INT64, [2])],
      [init("s", np.ones(4, np.float32)), init("b", np.zeros(4, np.float32))])

# ---- .npy ---------------------------------------------------------------------------------------
for name, a in [("f32_2x3", rng.standard_normal((2, 3)).astype(np.float32)),
                ("f64_scalar", np.array(3.5)),
                ("i64_1d", np.arange(5, dtype=np.int64)),
                ("f16_empty", np.zeros((0, 4), np.float16)),
                ("bool_2x2", np.array([[True, False], [False, True]])),
                ("u8_rank4", np.arange(16, dtype=np.uint8).reshape(2, 2, 2, 2))]:
    np.save(out(name + ".npy", "npy"), a)
# version 2.0 of the format (4-byte header length)
with open(out("i32_v2.npy", "npy"), "wb") as f:
    np.lib.format.write_array(f, np.arange(6, dtype=np.int32).reshape(3, 2), version=(2, 0))


# ---- safetensors (Note [Safetensors format] in src/nn/safetensors.h) -----------------------------
def safetensors(name, tensors, metadata=None):
    header, data = {}, b""
    for tname, dtype, a in tensors:
        raw = a.tobytes()
        header[tname] = {"dtype": dtype, "shape": list(a.shape),
                         "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(out(name + ".safetensors", "safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


safetensors("two_f32", [("fc.weight", "F32", rng.standard_normal((2, 3)).astype(np.float32)),
                        ("fc.bias", "F32", np.zeros(2, np.float32))], {"format": "pt"})
safetensors("mixed", [("a", "F16", np.ones((2, 2), np.float16)), ("b", "I64", np.arange(3, dtype=np.int64)),
                      ("c", "BOOL", np.array([True, False])), ("d", "U8", np.arange(4, dtype=np.uint8)),
                      ("e", "BF16", np.array([0x3f80, 0x4000], np.uint16)),
                      ("f", "F64", np.array(2.5)), ("g", "I32", np.zeros((0, 2), np.int32)),
                      ("h", "I8", np.array([-1, 1], np.int8))])
safetensors("empty", [])
print("seeds written under", os.path.join(ROOT, "corpus"))
