"""kiln.export -> kiln.load (in a fresh process), kiln.compile_onnx, and the ATen table as
`kiln ops --json` reports it."""
import json
import os
import subprocess

import numpy as np
import pytest
import torch
import torchvision

import kiln
from conftest import assert_close, randomize_, run_python


def _roundtrip(model, args, tmp_path, name):
    path = str(tmp_path / f"{name}.kiln")
    kiln.export(model, args, path)
    files = sorted(os.listdir(path))
    assert files == ["graph.kir", "manifest.json", "weights.safetensors"], files
    manifest = json.load(open(os.path.join(path, "manifest.json")))
    assert manifest["format"] == kiln.aot.FORMAT and "issue #14" in manifest["note"]
    inputs = [a.numpy() for a in args]
    with torch.no_grad():
        ref = model(*args)
    ref = ref if isinstance(ref, torch.Tensor) else ref[0]
    np.save(tmp_path / "ref.npy", ref.numpy())
    for i, a in enumerate(inputs):
        np.save(tmp_path / f"in{i}.npy", a)
    # A fresh process: only kiln and numpy (no torch import) load and run the folder.
    out = run_python(
        "import sys, numpy as np, kiln\n"
        f"f = kiln.load({path!r})\n"
        f"ins = [np.load({str(tmp_path)!r} + f'/in{{i}}.npy') for i in range({len(inputs)})]\n"
        "y = f(*ins)\n"
        "y = y if isinstance(y, np.ndarray) else y[0]\n"
        f"ref = np.load({str(tmp_path)!r} + '/ref.npy')\n"
        "d = float(np.abs(y - ref).max()); s = float(np.abs(ref).max())\n"
        "assert s > 0 and d <= 1e-4 * s, (d, s)\n"
        "assert 'torch' not in sys.modules\n"
        "print('ok', d, s)\n")
    assert out.startswith("ok"), out
    # And here, with torch tensors.
    f = kiln.load(path)
    got = f(*args)
    assert_close(got if isinstance(got, torch.Tensor) else got[0], ref)


def test_export_load_mlp(tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(10, 50), torch.nn.ReLU(), torch.nn.Linear(50, 1)).eval()
    _roundtrip(m, (torch.randn(4, 10),), tmp_path, "mlp")


def test_export_load_resnet18(tmp_path):
    torch.manual_seed(0)
    m = randomize_(torchvision.models.resnet18(weights=None).eval())
    _roundtrip(m, (torch.randn(1, 3, 64, 64),), tmp_path, "resnet18")


def test_export_refuses_what_it_cannot_run(tmp_path):
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.cumsum(x, 0)

    with pytest.raises(kiln.UnsupportedError, match="aten.cumsum.default"):
        kiln.export(M(), (torch.randn(3),), str(tmp_path / "m.kiln"))
    assert not os.path.exists(tmp_path / "m.kiln")
    with pytest.raises(kiln.UnsupportedError, match="dynamic_shapes"):
        kiln.export(M(), (torch.randn(3),), str(tmp_path / "m.kiln"), dynamic_shapes={"x": {0: None}})
    with pytest.raises(kiln.KilnError, match="no manifest.json"):
        kiln.load(str(tmp_path))


def test_load_rejects_tampered_weights(tmp_path):
    m = torch.nn.Linear(3, 2).eval()
    path = str(tmp_path / "lin.kiln")
    kiln.export(m, (torch.randn(1, 3),), path)
    kir = os.path.join(path, "graph.kir")
    text = open(kir).read().replace("f32[2, 3]", "f32[3, 3]", 1)
    open(kir, "w").write(text)
    with pytest.raises(kiln.KilnError):
        kiln.load(path)


def test_compile_onnx(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1, name="fc"),
         helper.make_node("Relu", ["h"], ["y"], name="act")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    f = kiln.compile_onnx(path, input_shapes={"x": [5, 3]})
    x = rng.standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_allclose(f(x), np.maximum(x @ w.T + b, 0), rtol=1e-5, atol=1e-6)
    with pytest.raises(kiln.InputError, match=r"input 0 \('x'\)"):
        f(np.zeros((4, 3), np.float32))


def test_kiln_ops_reports_the_aten_table():
    cli = os.environ.get("KILN_CLI")
    if not cli:
        pytest.fail("KILN_CLI (the kiln binary) is not set; CTest sets it")
    ops = json.loads(subprocess.run([cli, "ops", "--json"], capture_output=True, text=True,
                                    check=True).stdout)["ops"]
    reported = {(o["name"], a) for o in ops for a in o["capabilities"]["aten"]}
    table = {(k, name) for name, e in kiln.aten_table.ATEN_TABLE.items() for k in e.emits}
    assert reported == table
    by_name = {o["name"]: o for o in ops}
    assert "aten.convolution.default" in by_name["conv2d"]["capabilities"]["aten"]
    assert "aten.addmm.default" in by_name["linear"]["capabilities"]["aten"]
    # Every Kiln op the table emits exists in the registry.
    assert {k for k, _ in table} <= set(by_name)
