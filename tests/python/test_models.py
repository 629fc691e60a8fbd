"""Real models through torch.compile(backend="kiln") against torch eager (f32 tolerance), on
fresh random inputs and on a second input set (replay of the compiled graph)."""
import pytest
import torch
import torchvision

import kiln
from conftest import assert_close, randomize_


def _check(model, make_inputs):
    model = randomize_(model.eval())
    compiled = torch.compile(model, backend="kiln")
    with torch.no_grad():
        for k in range(2):  # the first call compiles, the second replays
            args = make_inputs(k)
            assert_close(compiled(*args), model(*args), f"call {k}")
    graphs = kiln.report.GRAPHS
    assert graphs, "the Kiln backend was not called"
    parts = [p for g in graphs for a in g.aten for p in a.partitions.values()]
    assert parts and all(p.failure is None for p in parts), [p.failure for p in parts]
    return graphs


def _images(batch, size, seed=0):
    def make(k):
        g = torch.Generator().manual_seed(seed + k)
        return (torch.randn(batch, 3, size, size, generator=g),)
    return make


def _whole(graphs):
    """Every ATen op ran in Kiln."""
    fallbacks = [f for g in graphs for a in g.aten for f in a.fallbacks]
    assert not fallbacks, fallbacks


def test_mlp():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(10, 50), torch.nn.ReLU(), torch.nn.Linear(50, 1))
    def make(k):
        return (torch.randn(3, 10, generator=torch.Generator().manual_seed(k)),)
    _whole(_check(m, make))


def test_vfe():
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False),
        torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
        torch.nn.MaxPool2d(kernel_size=3, stride=2, padding=1))
    with torch.no_grad():  # non-trivial running statistics
        m[1].running_mean.uniform_(-0.5, 0.5)
        m[1].running_var.uniform_(0.5, 2.0)
    _whole(_check(m, _images(2, 32)))


def test_resnet18():
    torch.manual_seed(0)
    _whole(_check(torchvision.models.resnet18(weights=None), _images(1, 64)))


def test_mobilenet_v3_small():
    torch.manual_seed(0)
    _whole(_check(torchvision.models.mobilenet_v3_small(weights=None), _images(1, 96)))


def test_convnext_tiny():
    torch.manual_seed(0)
    _check(torchvision.models.convnext_tiny(weights=None), _images(1, 64))


def test_vit_b_16():
    torch.manual_seed(0)
    _whole(_check(torchvision.models.vit_b_16(weights=None, image_size=64), _images(1, 64)))


def test_bert():
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

    _check(m, make)
