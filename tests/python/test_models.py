"""Real models through torch.compile(backend="kiln") against torch eager (f32 tolerance), on
fresh random inputs and on a second input set (replay of the compiled graph). The same cases run
on CUDA tensors in test_cuda.py (MODELS below)."""
import pytest
import torch
import torchvision

import kiln
from conftest import assert_close, randomize_


def check_model(model, make_inputs, device="cpu", options=None, tol=None):
    """Compiles `model` with the Kiln backend on `device` and compares two calls (compile, then
    replay) with torch eager; returns the backend's graph records."""
    model = randomize_(model.eval()).to(device)
    compiled = torch.compile(model, backend="kiln", options=options or {})
    with torch.no_grad():
        for k in range(2):  # the first call compiles, the second replays
            args = tuple(a.to(device) for a in make_inputs(k))
            got, ref = compiled(*args), model(*args)
            if tol is None:
                assert_close(got, ref, f"call {k}")
            else:
                _assert_within(got, ref, tol, f"call {k}")
    graphs = kiln.report.GRAPHS
    assert graphs, "the Kiln backend was not called"
    parts = [p for g in graphs for a in g.aten for p in a.partitions.values()]
    assert parts and all(p.failure is None for p in parts), [p.failure for p in parts]
    return graphs


def _assert_within(got, ref, tol, what):
    from conftest import flat_tensors

    for i, (g, r) in enumerate(zip(flat_tensors(got), flat_tensors(ref), strict=True)):
        assert g.dtype == r.dtype and g.shape == r.shape, f"{what} {i}"
        assert not torch.isnan(g).any(), f"{what} {i}: NaN in Kiln's output"
        scale = r.abs().max().item()
        assert scale > 0, f"{what} {i}: torch's output is all zeros"
        diff = (g - r).abs().max().item()
        assert diff <= tol * scale, f"{what} {i}: max|diff| {diff:.3g} > {tol} * {scale:.3g}"


def images(batch, size, seed=0):
    def make(k):
        g = torch.Generator().manual_seed(seed + k)
        return (torch.randn(batch, 3, size, size, generator=g),)
    return make


def whole(graphs):
    """Every ATen op ran in Kiln."""
    fallbacks = [f for g in graphs for a in g.aten for f in a.fallbacks]
    assert not fallbacks, fallbacks


def mlp():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(10, 50), torch.nn.ReLU(), torch.nn.Linear(50, 1))

    def make(k):
        return (torch.randn(3, 10, generator=torch.Generator().manual_seed(k)),)
    return m, make


def vfe():
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False),
        torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
        torch.nn.MaxPool2d(kernel_size=3, stride=2, padding=1))
    with torch.no_grad():  # non-trivial running statistics
        m[1].running_mean.uniform_(-0.5, 0.5)
        m[1].running_var.uniform_(0.5, 2.0)
    return m, images(2, 32)


def resnet18():
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None), images(1, 64)


def mobilenet_v3_small():
    torch.manual_seed(0)
    return torchvision.models.mobilenet_v3_small(weights=None), images(1, 96)


def convnext_tiny():
    torch.manual_seed(0)
    return torchvision.models.convnext_tiny(weights=None), images(1, 64)


def vit_b_16():
    torch.manual_seed(0)
    return torchvision.models.vit_b_16(weights=None, image_size=64), images(1, 64)


def bert():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=128,
                                  max_position_embeddings=64)
    m = transformers.BertModel(cfg)

    def make(k):
        g = torch.Generator().manual_seed(k)
        ids = torch.randint(0, 100, (2, 16), generator=g)
        mask = torch.ones(2, 16, dtype=torch.long)
        mask[1, 9 + k:] = 0  # padding in the second sequence
        return ids, mask
    return m, make


# Every case runs whole in Kiln: no ATen op falls back to torch.
MODELS = {f.__name__: f for f in (mlp, vfe, resnet18, mobilenet_v3_small, convnext_tiny, vit_b_16, bert)}


@pytest.mark.parametrize("name", list(MODELS))
def test_model(name):
    model, make = MODELS[name]()
    whole(check_model(model, make))
