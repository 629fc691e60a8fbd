#!/usr/bin/env bash
# Writes the package loader's fuzz seeds (tests/fuzz/corpus/package/), in the two forms
# package_fuzz.cc reads: a byte 0 then a whole package (mlp: loop kernels, with a kernels.cpu
# section), and a byte 1 then [u32 manifest length][manifest][weights] (vfe: oneDNN launches).
#   make_package_seeds.sh BUILD_DIR
set -euo pipefail
KILN="$1/kiln"
OUT="$(dirname "$0")/corpus/package"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
"$KILN" compile mlp -o "$WORK/mlp.kiln" >/dev/null
"$KILN" compile vfe -o "$WORK/vfe.kiln" >/dev/null
# A small fire module (squeeze 1x1, abs, expand 1x1 and 3x3, concat, 1x1): a oneDNN concat node
# (format version 6), a channels-last abs between convolutions where they compute in nhwc and a
# nearest upsample (version 7). Needs the onnx package (the setup's venv has it).
PY="${KILN_PYTHON:-$HOME/.cache/kiln/venv/bin/python}"
"$PY" - "$WORK/fire.onnx" <<'PY'
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
rng = np.random.default_rng(7)
def w(name, *shape):
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
inits = [w("ws", 8, 16, 1, 1), w("w1", 8, 8, 1, 1), w("w3", 8, 8, 3, 3), w("wh", 4, 16, 1, 1)]
nodes = [helper.make_node("Conv", ["x", "ws"], ["s"]),
         helper.make_node("Abs", ["s"], ["sr"]),  # a loop kernel between convolutions
         helper.make_node("Conv", ["sr", "w1"], ["e1"]),
         helper.make_node("Conv", ["sr", "w3"], ["e3"], pads=[1, 1, 1, 1]),
         helper.make_node("Concat", ["e1", "e3"], ["c"], axis=1),
         helper.make_node("Conv", ["c", "wh"], ["h"]),
         helper.make_node("Resize", ["h", "", "up_scales"], ["y"], mode="nearest")]  # upsample launch
inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], dtype=np.float32), "up_scales"))
g = helper.make_graph(nodes, "fire", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 6, 6])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 12, 12])], inits)
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), sys.argv[1])
PY
"$KILN" compile "$WORK/fire.onnx" -o "$WORK/fire.kiln" >/dev/null
python3 - "$WORK" "$OUT" <<'PY'
import struct, sys
work, out = sys.argv[1], sys.argv[2]
def sections(path):
    b = open(path, "rb").read()
    n = struct.unpack_from("<I", b, 12)[0]
    res = {}
    for i in range(n):
        e = 64 + 80 * i
        name = b[e:e + 32].rstrip(b"\0").decode()
        off, size = struct.unpack_from("<QQ", b, e + 32)
        res[name] = b[off:off + size]
    return b, res
mlp, _ = sections(f"{work}/mlp.kiln")
open(f"{out}/mlp_whole.bin", "wb").write(b"\0" + mlp)
_, vfe = sections(f"{work}/vfe.kiln")
m = vfe["manifest"]
open(f"{out}/vfe_sections.bin", "wb").write(b"\1" + struct.pack("<I", len(m)) + m + vfe["weights"])
_, fire = sections(f"{work}/fire.kiln")
m = fire["manifest"]
version = struct.unpack_from("<I", open(f"{work}/fire.kiln", "rb").read(), 8)[0]
first = b"\7" if version == 7 else b"\3"  # package_fuzz.cc: bit 2 = version 7, bit 1 = 6
open(f"{out}/fire_concat_sections.bin", "wb").write(first + struct.pack("<I", len(m)) + m + fire["weights"])
PY
