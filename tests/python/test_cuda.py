"""CUDA tensors through the Kiln backend (GPU machine; docs/python.md, "CUDA"). Without a
usable CUDA device (torch's and Kiln's view both) the file exits 77, which CTest reports as
not run — never as passed."""
import numpy as np
import pytest
import torch

import kiln
from conftest import assert_close, randomize_
from test_models import MODELS, check_model, images, whole



@pytest.fixture(autouse=True, scope="module")
def _needs_cuda():
    # pytest.exit from a fixture (not at import) sets the exit code: 77 = CTest "not run".
    if not torch.cuda.is_available() or kiln.cuda_status() != "":
        pytest.exit(f"no CUDA device (torch: {torch.cuda.is_available()}, kiln: "
                    f"{kiln.cuda_status() or 'ok'})", returncode=77)


DEV = torch.device("cuda", 0)


@pytest.fixture(autouse=True, scope="module")
def _float32_reference():
    # torch's reference must compute in float32: its default lets cuDNN convolutions (and,
    # where enabled, matmuls) round inputs to TF32 (10-bit mantissa), ~1e-3 relative — ten
    # times the f32 tolerance. Kiln's CUDA kernels compute float32 in float32.
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


class Pointwise(torch.nn.Module):
    """Only ops with Kiln CUDA kernels: the whole graph runs in Kiln on the device."""

    def forward(self, x, y):
        z = torch.exp(x * 0.5) + torch.sigmoid(y) - x.abs()
        return z.sum(dim=1), torch.relu(z).mean()


def test_whole_graph_on_cuda():
    m = Pointwise()
    compiled = torch.compile(m, backend="kiln")
    with torch.no_grad():
        for k in range(2):
            x, y = torch.randn(8, 33, device=DEV), torch.randn(8, 33, device=DEV)
            out = compiled(x, y)
            assert all(o.device == DEV for o in out)
            assert_close(out, m(x, y), f"call {k}")
    parts = [p for g in kiln.report.GRAPHS for a in g.aten for p in a.partitions.values()]
    assert not [f for g in kiln.report.GRAPHS for a in g.aten for f in a.fallbacks]
    assert parts and all(p.failure is None for p in parts)


def test_partitioned_models_on_cuda():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(10, 50), torch.nn.ReLU(), torch.nn.Linear(50, 1))
    cnn = torch.nn.Sequential(  # a small ResNet-like stem + head (no torchvision needed there)
        torch.nn.Conv2d(3, 16, 3, padding=1, bias=False), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))
    for m, shape in ((mlp, (4, 10)), (cnn, (2, 3, 32, 32))):
        kiln.reset()
        m = randomize_(m.eval().to(DEV))
        compiled = torch.compile(m, backend="kiln")
        with torch.no_grad():
            for k in range(2):
                x = torch.randn(*shape, device=DEV)
                assert_close(compiled(x), m(x), f"{type(m).__name__} call {k}")
        e = kiln.explain(m, torch.randn(*shape, device=DEV))
        assert all(p.failure is None for g in e.graphs for a in g.aten for p in a.partitions.values()), str(e)


def test_side_stream():
    m = Pointwise()
    compiled = torch.compile(m, backend="kiln")
    s = torch.cuda.Stream()
    with torch.no_grad(), torch.cuda.stream(s):
        x, y = torch.randn(64, 1000, device=DEV), torch.randn(64, 1000, device=DEV)
        out = compiled(x, y)
        ref = m(x, y)
    torch.cuda.synchronize()
    assert_close(out, ref)


def test_cuda_inputs_checked():
    b = kiln.GraphBuilder("g")
    x = b.add_input("x", "f32", [4], "cuda:0")
    [y] = b.add_node("relu", [x], {}, "act")
    b.set_outputs([y])
    f = kiln.aot.Loaded(kiln.CompiledGraph.compile(b, "eager"))
    t = torch.randn(4, device=DEV)
    assert torch.equal(f(t), torch.relu(t))
    with pytest.raises(kiln.InputError, match=r"input 0 \('x'\): expected f32\[4\] @cuda:0.*on cpu"):
        f(torch.randn(4))
    with pytest.raises(kiln.InputError, match="on cpu"):
        f(t.cpu().numpy())  # a NumPy array cannot feed a CUDA graph


@pytest.mark.parametrize("name", list(MODELS))
def test_model_on_cuda(name):
    """test_models.py's cases on CUDA tensors: whole in Kiln, compiled by Kiln's compiler (the
    CUDA target), outputs on the device within the f32 tolerance of torch eager."""
    model, make = MODELS[name]()
    graphs = check_model(model, make, DEV)
    whole(graphs)
    parts = [p for g in graphs for a in g.aten for p in a.partitions.values()]
    assert all(p.backend == "inductor" for p in parts), [p.backend for p in parts]


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_modes_on_cuda(mode):
    from test_models import resnet18

    model, make = resnet18()
    whole(check_model(model, make, DEV, options={"mode": mode}))


def test_bf16_on_cuda():
    from test_models import resnet18

    model, make = resnet18()
    graphs = check_model(model, make, DEV, options={"dtype": "bfloat16"}, tol=5e-2)
    summaries = [p.summary for g in graphs for a in g.aten for p in a.partitions.values()]
    assert any("precision bfloat16" in s for s in summaries), summaries


def test_export_on_cuda_writes_a_graph_folder(tmp_path):
    torch.manual_seed(0)
    m = randomize_(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(),
                                       torch.nn.Flatten(), torch.nn.Linear(8 * 14 * 14, 5)).eval()).to(DEV)
    x = torch.randn(2, 3, 16, 16, device=DEV)
    path = str(tmp_path / "m.kiln")
    with pytest.warns(kiln.aot.KilnExportWarning, match="not a .kiln package"):
        kiln.export(m, (x,), path)
    f = kiln.load(path)
    with torch.no_grad():
        for k in range(2):
            x = torch.randn(2, 3, 16, 16, device=DEV)
            assert_close(f(x), m(x), f"call {k}")


def test_export_dynamic_batch_on_cuda(tmp_path):
    # kiln.export(dynamic_shapes=...) on CUDA: a graph folder with a symbolic batch, compiled by
    # the CUDA target once per batch size on the first call with it (docs/python.md, Export).
    from torch.export import Dim

    torch.manual_seed(0)
    m = randomize_(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(),
                                       torch.nn.Flatten(), torch.nn.Linear(8 * 14 * 14, 5)).eval()).to(DEV)
    path = str(tmp_path / "dyn.kiln")
    with pytest.warns(kiln.aot.KilnExportWarning, match="symbolic"):
        kiln.export(m, (torch.randn(2, 3, 16, 16, device=DEV),), path,
                    dynamic_shapes={"input": {0: Dim("batch", min=1, max=64)}})
    f = kiln.load(path)
    with torch.no_grad():
        for n in (1, 5, 1):
            x = torch.randn(n, 3, 16, 16, device=DEV)
            assert_close(f(x), m(x), f"batch {n}")
    assert "2 size binding(s) compiled" in f.summary, f.summary
