#!/usr/bin/env python3
"""The ONNX backend test data of the PyPI `onnx` package, laid out for `kiln conformance --data`.

    python tests/onnx/pypi_testdata.py [--out DIR]

prints the suite directories, one per line:

  - simple, pytorch-converted, pytorch-operator: shipped in the wheel
    (<site-packages>/onnx/backend/test/data/...), used in place;
  - node: the wheel no longer ships the node tests' data, only the Python cases that make it
    (onnx.backend.test.case.node). They are written here as ONNX's own `backend-test-tools
    generate-data` writes them (model.onnx + test_data_set_0/input_K.pb, output_K.pb);
  - light: the wheel's light_*.onnx models (real CNN architectures with small weights) with
    their stored expected outputs, as case directories; the inputs are what ONNX's backend test
    runner feeds them (arange(n) / n, float32, symbolic dims 1).

Generated suites go to DIR (default $KILN_CACHE_DIR/onnx-testdata/onnx-<version>, else
~/.cache/kiln/...) once per machine: a stamp (onnx version + this script's hash) marks a complete
generation; a stale or partial one is rebuilt in a temporary folder and renamed into place.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import warnings


def _stamp(onnx_version: str) -> str:
    h = hashlib.sha256()
    with open(os.path.abspath(__file__), "rb") as f:
        h.update(f.read())
    h.update(onnx_version.encode())
    return h.hexdigest()[:16]


def _write_tensor(path: str, value, name: str) -> None:
    from onnx import TensorProto, numpy_helper

    proto = value if isinstance(value, TensorProto) else numpy_helper.from_array(value, name)
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())


def _write_value(path: str, value, vi) -> None:
    """A test input/output as the generator does: tensors, sequences, optionals, maps."""
    from onnx import numpy_helper

    t = vi.type
    if t.HasField("map_type"):
        proto = numpy_helper.from_dict(value, vi.name)
    elif t.HasField("sequence_type"):
        proto = numpy_helper.from_list(value, vi.name)
    elif t.HasField("optional_type"):
        proto = numpy_helper.from_optional(value, vi.name)
    else:
        _write_tensor(path, value, vi.name)
        return
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())


def _generate_node(root: str) -> int:
    import onnx.backend.test.case.node as node_cases

    # The case modules compute expected outputs with NumPy and print warnings; keep them quiet.
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        cases = node_cases.collect_testcases()
    for case in cases:
        d = os.path.join(root, "node", case.name)
        os.makedirs(d)
        with open(os.path.join(d, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        for i, (inputs, outputs) in enumerate(case.data_sets):
            ds = os.path.join(d, f"test_data_set_{i}")
            os.makedirs(ds)
            for j, v in enumerate(inputs):
                _write_value(os.path.join(ds, f"input_{j}.pb"), v, case.model.graph.input[j])
            for j, v in enumerate(outputs):
                _write_value(os.path.join(ds, f"output_{j}.pb"), v, case.model.graph.output[j])
    return len(cases)


def _generate_light(root: str, wheel_data: str) -> int:
    import numpy as np
    import onnx

    light = os.path.join(wheel_data, "light")
    n = 0
    for f in sorted(os.listdir(light)):
        if not (f.startswith("light_") and f.endswith(".onnx")):
            continue
        name = f[len("light_"):-len(".onnx")]
        expected = os.path.join(light, f"light_{name}_output_0.pb")
        if not os.path.isfile(expected):
            continue
        model = onnx.load(os.path.join(light, f))
        d = os.path.join(root, "light", f"test_{name}")
        ds = os.path.join(d, "test_data_set_0")
        os.makedirs(ds)
        shutil.copy(os.path.join(light, f), os.path.join(d, "model.onnx"))
        inits = {t.name for t in model.graph.initializer}
        k = 0
        for vi in model.graph.input:
            if vi.name in inits:
                continue
            shape = tuple(d.dim_value if d.HasField("dim_value") else 1
                          for d in vi.type.tensor_type.shape.dim)
            count = int(np.prod(shape))
            x = (np.arange(count).reshape(shape) / count).astype(np.float32)
            _write_tensor(os.path.join(ds, f"input_{k}.pb"), x, vi.name)
            k += 1
        shutil.copy(expected, os.path.join(ds, "output_0.pb"))
        n += 1
    return n


def suite_dirs(out: str | None = None) -> list[str]:
    """Generates (once) and returns the suite directories."""
    import onnx

    wheel_data = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
    cache = os.environ.get("KILN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                              "kiln")
    out = out or os.path.join(cache, "onnx-testdata", f"onnx-{onnx.__version__}")
    stamp_path = os.path.join(out, "stamp.json")
    want = _stamp(onnx.__version__)
    current = False
    try:
        with open(stamp_path) as f:
            current = json.load(f).get("stamp") == want
    except (OSError, ValueError):
        pass
    if not current:
        parent = os.path.dirname(os.path.abspath(out))
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".onnx-testdata.", dir=parent)
        try:
            counts = {"node": _generate_node(tmp), "light": _generate_light(tmp, wheel_data)}
            with open(os.path.join(tmp, "stamp.json"), "w") as f:
                json.dump({"stamp": want, "onnx": onnx.__version__, "cases": counts}, f)
            old = None
            if os.path.exists(out):
                old = out + f".old{os.getpid()}"
                os.replace(out, old)
            os.replace(tmp, out)
            if old:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    dirs = [os.path.join(out, "node")]
    dirs += [os.path.join(wheel_data, s) for s in ("simple", "pytorch-converted", "pytorch-operator")]
    dirs.append(os.path.join(out, "light"))
    return [d for d in dirs if os.path.isdir(d)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="where generated suites go")
    a = ap.parse_args(argv)
    for d in suite_dirs(a.out):
        print(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
