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


def _c_run():
    exe = os.environ.get("KILN_C_RUN")
    if not exe:
        pytest.fail("KILN_C_RUN (examples/c_run built as kiln_c_run) is not set; CTest sets it")
    return exe


def _roundtrip(model, args, tmp_path, name, **export_args):
    path = str(tmp_path / f"{name}.kiln")
    tol = export_args.pop("tol", 1e-4)
    kiln.export(model, args, path, **export_args)
    with open(path, "rb") as f:
        assert f.read(8) == kiln.aot.PACKAGE_MAGIC, "kiln.export on the CPU writes a .kiln package"
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")], "a temporary file was left"
    inputs = [a.numpy() for a in args]
    with torch.no_grad():
        ref = model(*args)
    ref = ref if isinstance(ref, torch.Tensor) else ref[0]
    np.save(tmp_path / "ref.npy", ref.numpy())
    for i, a in enumerate(inputs):
        np.save(tmp_path / f"in{i}.npy", a)
    # A fresh process: only kiln and numpy (no torch import) load and run the package.
    out = run_python(
        "import sys, numpy as np, kiln\n"
        f"f = kiln.load({path!r})\n"
        "assert f.compiled.backend == 'package', f.compiled.backend\n"
        f"ins = [np.load({str(tmp_path)!r} + f'/in{{i}}.npy') for i in range({len(inputs)})]\n"
        "y = f(*ins)\n"
        "y = y if isinstance(y, np.ndarray) else y[0]\n"
        f"ref = np.load({str(tmp_path)!r} + '/ref.npy')\n"
        "assert not np.isnan(y).any()\n"
        "d = float(np.abs(y - ref).max()); s = float(np.abs(ref).max())\n"
        f"assert s > 0 and d <= {tol} * s, (d, s)\n"
        "assert 'torch' not in sys.modules\n"
        "print('ok', d, s)\n")
    assert out.startswith("ok"), out
    # The C runtime (examples/c_run: libkiln_runtime alone) runs the same file.
    cmd = [_c_run(), path]
    for i, a in enumerate(inputs):
        a.tofile(tmp_path / f"in{i}.bin")
        cmd += ["-i", str(tmp_path / f"in{i}.bin")]
    r = subprocess.run(cmd + ["-o", str(tmp_path / "c_out")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    y = np.fromfile(tmp_path / "c_out0.bin", dtype=np.float32).reshape(ref.shape)
    assert not np.isnan(y).any()
    d, scale = float(np.abs(y - ref.numpy()).max()), float(ref.abs().max())
    assert scale > 0 and d <= tol * scale, (d, scale)
    # And here, with torch tensors.
    f = kiln.load(path)
    got = f(*args)
    got = got if isinstance(got, torch.Tensor) else got[0]
    if tol == 1e-4:
        assert_close(got, ref)
    else:
        assert not torch.isnan(got).any() and (got - ref).abs().max() <= tol * ref.abs().max()
    return path


def test_export_load_mlp(tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(10, 50), torch.nn.ReLU(), torch.nn.Linear(50, 1)).eval()
    _roundtrip(m, (torch.randn(4, 10),), tmp_path, "mlp")


def test_export_load_resnet18(tmp_path):
    torch.manual_seed(0)
    m = randomize_(torchvision.models.resnet18(weights=None).eval())
    _roundtrip(m, (torch.randn(1, 3, 64, 64),), tmp_path, "resnet18")


def test_export_bf16_package(tmp_path):
    torch.manual_seed(0)
    m = randomize_(torchvision.models.resnet18(weights=None).eval())
    path = _roundtrip(m, (torch.randn(1, 3, 64, 64),), tmp_path, "resnet18_bf16", dtype="bfloat16",
                      tol=5e-2)
    manifest = kiln.load(path).manifest
    assert manifest["mode"] == "default" and manifest["model"] == "ResNet"
    # Mixed precision: the convolutions' oneDNN descriptors are bf16, the signature float32.
    assert [i["dtype"] for i in manifest["inputs"]] == ["float32"]
    assert "bf16" in json.dumps(manifest["launches"])


def test_export_refuses_what_it_cannot_run(tmp_path):
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.cumsum(x, 0)

    with pytest.raises(kiln.UnsupportedError, match="aten.cumsum.default"):
        kiln.export(M(), (torch.randn(3),), str(tmp_path / "m.kiln"))
    assert not os.path.exists(tmp_path / "m.kiln")
    with pytest.raises(ValueError, match="dtype must be"):
        kiln.export(M(), (torch.randn(3),), str(tmp_path / "m.kiln"), dtype="int8")
    with pytest.raises(kiln.KilnError, match="neither a .kiln package nor"):
        kiln.load(str(tmp_path))
    assert os.listdir(tmp_path) == []


def _dynamic_roundtrip(model, args, dynamic_shapes, make_inputs, sizes, tmp_path, name):
    """kiln.export with dynamic_shapes writes a graph folder with symbolic input sizes (and says
    so); kiln.load compiles it once per set of sizes, here and in a fresh process without torch,
    and every size matches torch eager on fresh inputs."""
    path = str(tmp_path / f"{name}.kiln")
    with pytest.warns(kiln.aot.KilnExportWarning, match="symbolic"):
        kiln.export(model, args, path, dynamic_shapes=dynamic_shapes)
    assert os.path.isdir(path), "a dynamic export is a graph folder (packages are static: #14)"
    manifest = json.load(open(os.path.join(path, "manifest.json")))
    assert manifest["dynamic"] is True
    assert any(d == -1 for spec in manifest["inputs"] for d in spec["shape"]), manifest["inputs"]
    f = kiln.load(path)
    with torch.no_grad():
        for n in sizes:
            ins = make_inputs(n)
            assert_close(f(*ins), model(*ins), f"{name} size {n}")
    # Each size compiled once and kept: the summary lists one binding per size.
    assert f"{len(set(sizes))} size binding(s) compiled" in f.summary, f.summary
    # A fresh process, NumPy only: the folder compiles per size there too.
    for k, n in enumerate(sizes[:2]):
        ins = make_inputs(n)
        with torch.no_grad():
            np.save(tmp_path / f"{name}_ref{k}.npy", model(*ins).numpy())
        for i, a in enumerate(ins):
            np.save(tmp_path / f"{name}_in{k}_{i}.npy", a.numpy())
    out = run_python(
        "import sys, numpy as np, kiln\n"
        f"f = kiln.load({path!r})\n"
        f"for k in range(2):\n"
        f"    ins = [np.load({str(tmp_path)!r} + f'/{name}_in{{k}}_{{i}}.npy') for i in range({len(args)})]\n"
        f"    ref = np.load({str(tmp_path)!r} + f'/{name}_ref{{k}}.npy')\n"
        "    y = f(*ins)\n"
        "    assert y.shape == ref.shape and not np.isnan(y).any(), (y.shape, ref.shape)\n"
        "    d = float(np.abs(y - ref).max()); s = float(np.abs(ref).max())\n"
        "    assert s > 0 and d <= 1e-4 * s, (d, s)\n"
        "assert 'torch' not in sys.modules\n"
        "print('ok')\n")
    assert out.startswith("ok"), out
    return f


def test_export_dynamic_batch(tmp_path):
    from torch.export import Dim

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(10, 50), torch.nn.ReLU(), torch.nn.Linear(50, 3),
                              torch.nn.Softmax(-1)).eval()
    _dynamic_roundtrip(mlp, (torch.randn(4, 10),), {"input": {0: Dim("batch", min=1, max=256)}},
                       lambda n: (torch.randn(n, 10),), [1, 3, 17, 3], tmp_path, "mlp")
    net = randomize_(torchvision.models.resnet18(weights=None).eval())
    f = _dynamic_roundtrip(net, (torch.randn(2, 3, 64, 64),), {"x": {0: Dim("batch", min=1, max=64)}},
                           lambda n: (torch.randn(n, 3, 64, 64),), [1, 3], tmp_path, "resnet18")
    # A size the graph does not fit (the image must stay 64x64) names the input.
    with pytest.raises(kiln.InputError, match="input 0 \\('x'\\)"):
        f(torch.randn(1, 3, 32, 32))


def test_export_dynamic_batch_and_sequence_bert(tmp_path):
    from torch.export import Dim
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2,
                     intermediate_size=128, vocab_size=500)

    class Bert(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = BertModel(cfg).eval()

        def forward(self, ids, mask):
            return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state

    def make(n):  # batch n, sequence 5 + 2n, the last two tokens padding
        ids = torch.randint(0, 500, (n, 5 + 2 * n))
        mask = torch.ones(n, 5 + 2 * n, dtype=torch.long)
        mask[:, -2:] = 0
        return ids, mask

    batch, seq = Dim("batch", min=1, max=32), Dim("seq", min=2, max=64)
    f = _dynamic_roundtrip(Bert().eval(), make(2), {"ids": {0: batch, 1: seq}, "mask": {0: batch, 1: seq}},
                           make, [1, 3, 2], tmp_path, "bert")
    # ids and mask must agree on batch and sequence (one symbol each): named when they do not.
    ids, mask = make(2)
    with pytest.raises(kiln.KilnError, match="mask"):
        f(ids, mask[:, :-1])


def test_export_dynamic_arange_needs_a_bound(tmp_path):
    from torch.export import Dim

    class Positions(torch.nn.Module):
        def forward(self, x):
            return x + torch.arange(x.shape[1], dtype=x.dtype)

    with pytest.raises(kiln.UnsupportedError, match="Dim a max"):
        kiln.export(Positions(), (torch.randn(2, 8),), str(tmp_path / "p.kiln"),
                    dynamic_shapes={"x": {1: Dim("n")}})
    # With a bound: the range is a constant up to the bound, sliced to the length.
    _dynamic_roundtrip(Positions(), (torch.randn(2, 8),), {"x": {1: Dim("n", min=2, max=100)}},
                       lambda n: (torch.randn(2, n),), [5, 9], tmp_path, "positions")


def test_load_rejects_a_corrupt_package(tmp_path):
    m = torch.nn.Linear(3, 2).eval()
    path = str(tmp_path / "lin.kiln")
    kiln.export(m, (torch.randn(1, 3),), path)
    data = bytearray(open(path, "rb").read())
    bad = tmp_path / "bad.kiln"
    for where in (len(data) - 1, len(data) // 2, 20):  # kernels/weights bytes, the header
        flipped = bytearray(data)
        flipped[where] ^= 0x40
        bad.write_bytes(bytes(flipped))
        with pytest.raises(kiln.KilnError, match="bad.kiln"):
            kiln.load(str(bad))
    bad.write_bytes(bytes(data[: len(data) // 3]))  # truncated
    with pytest.raises(kiln.KilnError, match="bad.kiln"):
        kiln.load(str(bad))
    with pytest.raises(ValueError, match="backend= and mode="):
        kiln.load(path, mode="max-autotune")


def test_load_rejects_tampered_graph_folder(tmp_path):
    # The graph folder (what kiln.export writes for CUDA until CUDA packages exist), written here
    # for the CPU by the same writer: a declared weight type that disagrees with the file fails.
    b = kiln.GraphBuilder("g")
    x = b.add_input("x", "f32", [1, 3], "cpu")
    weight = torch.randn(2, 3)
    w = b.add_param("w", weight)
    [y] = b.add_node("linear", [x, w, -1], {}, "fc")
    b.set_outputs([y])
    path = str(tmp_path / "lin.kiln")
    kiln.aot.write_graph_folder(b, path, {"format": kiln.aot.FORMAT, "backend": "inductor"})
    f = kiln.load(path)
    xs = torch.randn(1, 3)
    assert_close(f(xs), xs @ weight.t())
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
