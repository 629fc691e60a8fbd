"""The torch.compile backend: registration, options, graph breaks, partitions, recompiles,
frozen parameters, autograd, and the C++ call path's checks."""
import sys
import warnings

import numpy as np
import re

import pytest
import torch

import kiln
import kiln.report
from conftest import assert_close, run_python
from kiln.lowering import KilnFallbackWarning


class Branchy(torch.nn.Module):
    """Two graph breaks: a print, and a branch on a tensor's value (.item())."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)
        self.c = torch.nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        print("kiln-test: between two graphs")
        if x.sum().item() > 0:
            return self.b(h)
        return torch.sigmoid(self.c(h)) * 2


class WithCumsum(torch.nn.Module):
    """cumsum is not a Kiln op: the graph is partitioned around it."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.relu(torch.cumsum(self.a(x), dim=1)))


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3)).eval()


def test_entry_point_needs_no_import():
    out = run_python(
        "import sys, torch\n"
        "m = torch.nn.Linear(4, 2).eval()\n"
        "x = torch.randn(3, 4)\n"
        "with torch.no_grad():\n"
        "    y = torch.compile(m, backend='kiln')(x)\n"
        "    assert (y - m(x)).abs().max() <= 1e-5, (y, m(x))\n"
        "import kiln.report\n"
        "assert kiln.report.GRAPHS and kiln.report.GRAPHS[0].aten[0].partitions\n"
        "print('kiln' in torch._dynamo.list_backends(), 'kiln' in sys.modules)\n")
    assert out.split()[-2:] == ["True", "True"], out


_TORCH_COMPUTE = ("aten::addmm", "aten::mm", "aten::linear", "aten::relu", "aten::threshold",
                  "aten::clamp_min")


def _torch_compute_ops(fn):
    """The compute ops torch itself ran during fn() (its profiler sees every ATen op it
    dispatches; Kiln's compiled code is invisible to it)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sorted({e.key for e in prof.key_averages() if e.key in _TORCH_COMPUTE})


def test_kiln_backends_are_registered_and_run():
    """The extension loads Kiln's compiler and CPU target, which register themselves when their
    libraries load: `inductor` is there, and a compiled graph runs in it, not in torch."""
    names = kiln._kiln.backends()
    assert "inductor" in names and "eager" in names, names
    m = _mlp()
    x = torch.randn(4, 10)
    with torch.no_grad():
        ref = m(x)
        # The check sees torch's own compute (else "no ops" below would prove nothing).
        assert "aten::addmm" in _torch_compute_ops(lambda: m(x))
        f = torch.compile(m, backend="kiln", options={"strict": True})
        assert_close(f(x), ref)  # compiles
        out = []
        assert _torch_compute_ops(lambda: out.append(f(x))) == []
        assert_close(out[0], ref)
    (rec,) = kiln.report.GRAPHS
    (aten,) = rec.aten
    assert aten.fallbacks == [], aten.fallbacks
    (part,) = aten.partitions.values()
    assert part.backend == "inductor" and part.failure is None and part.compiles == 1
    assert part.kiln_ops and "linear" in part.kiln_ops, part.kiln_ops


def test_backend_usable_directly():
    m = _mlp()
    x = torch.randn(2, 10)
    with torch.no_grad():
        assert_close(torch.compile(m, backend=kiln.backend)(x), m(x))


def test_options():
    m = _mlp()
    x = torch.randn(4, 10)
    with torch.no_grad():
        for opts in ({"mode": "max-autotune"}, {"threads": 1}, {"backend": "eager"}):
            kiln.reset()
            assert_close(torch.compile(m, backend="kiln", options=opts)(x), m(x), str(opts))
        kiln.reset()
        y = torch.compile(m, backend="kiln", options={"dtype": "bfloat16"})(x)
        ref = m(x)
        assert y.dtype == torch.float32
        assert (y - ref).abs().max() <= 3e-2 * ref.abs().max()
        # Kiln's autocast: the graph keeps torch's float32 signature, the compiler runs the
        # linears in bfloat16 (and says so).
        part = [p for g in kiln.report.GRAPHS for a in g.aten for p in a.partitions.values()][0]
        assert "f32" in part.ir and "bf16" not in part.ir
        low = re.search(r"precision bfloat16 \((\d+) nodes in bfloat16", part.summary)
        assert low and int(low.group(1)) >= 2, part.summary  # both linears at least
    with pytest.raises(Exception, match="unknown option"):
        with torch.no_grad():
            torch.compile(_mlp(), backend="kiln", options={"modee": "x"})(x)
    kiln.reset()
    with pytest.raises(Exception, match="mode must be"):
        with torch.no_grad():
            torch.compile(_mlp(), backend="kiln", options={"mode": "fast"})(x)


def test_graph_breaks_are_correct_and_explained(capsys):
    torch.manual_seed(0)
    m = Branchy().eval()
    compiled = torch.compile(m, backend="kiln")
    x = torch.randn(3, 8).abs()  # sum > 0: first branch
    with torch.no_grad():
        assert_close(compiled(x), m(x), "branch b")
        assert_close(compiled(-x), m(-x), "branch c")
        assert_close(compiled(x * 0.5), m(x * 0.5), "branch b again")
    e = kiln.explain(m, x)
    text = str(e)
    assert e.graph_break_count >= 2, text
    reasons = " ".join(r for r, _ in e.breaks).lower()
    assert "print" in reasons, text
    assert "item" in reasons or "data-dependent" in reasons or "data dependent" in reasons, text
    assert all("test_backend.py" in where for _, where in e.breaks), text
    assert "graph break" in text and "Kiln graph" in text
    assert_close(e.outputs, m(x))


def test_partition_around_missing_op():
    torch.manual_seed(0)
    m = WithCumsum().eval()
    x = torch.randn(5, 8)
    compiled = torch.compile(m, backend="kiln")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            assert_close(compiled(x), m(x))
            assert_close(compiled(x + 1), m(x + 1), "replay")
    fallback_warnings = [w for w in caught if issubclass(w.category, KilnFallbackWarning)]
    assert len(fallback_warnings) == 1, [str(w.message) for w in caught]
    assert "aten.cumsum.default" in str(fallback_warnings[0].message)
    e = kiln.explain(m, x)
    ops = [op for op, _, _ in e.fallbacks]
    assert ops == ["aten.cumsum.default"], e.fallbacks
    assert "no entry in Kiln's ATen table" in e.fallbacks[0][2]
    parts = [p for g in e.graphs for a in g.aten for p in a.partitions.values()]
    assert len(parts) == 2 and all(p.failure is None for p in parts), str(e)
    assert "linear" in parts[0].kiln_ops + parts[1].kiln_ops
    assert "torch: aten.cumsum.default" in str(e)


def test_new_batch_size_recompiles():
    m = _mlp()
    compiled = torch.compile(m, backend="kiln")
    with torch.no_grad():
        for batch in (2, 5, 7, 5, 2):
            x = torch.randn(batch, 10)
            assert_close(compiled(x), m(x), f"batch {batch}")
    graphs = kiln.report.GRAPHS
    assert len(graphs) == 2, "Dynamo compiles the first shape, then a dynamic graph"
    assert graphs[1].symbolic
    labels = sorted(a.label for a in graphs[1].aten)
    assert labels == ["sizes 2, (2, 10)", "sizes 5, (5, 10)", "sizes 7, (7, 10)"], labels


def test_changed_parameters_recompile():
    m = _mlp()
    compiled = torch.compile(m, backend="kiln")
    x = torch.randn(4, 10)
    with torch.no_grad():
        assert_close(compiled(x), m(x), "before")
        m[0].weight.mul_(-2)  # in place: the version counter moves
        assert_close(compiled(x), m(x), "after an in-place update")
        m.load_state_dict({k: v + 0.5 for k, v in m.state_dict().items()})
        assert_close(compiled(x), m(x), "after load_state_dict")
        m[2].bias = torch.nn.Parameter(torch.full((3,), 7.0))  # a new Parameter object
        assert_close(compiled(x), m(x), "after assigning a new Parameter")
    parts = [p for g in kiln.report.GRAPHS for a in g.aten for p in a.partitions.values()]
    recompiles = [r for p in parts for r in p.recompiles]
    assert any("0.weight" in r and "modified in place" in r for r in recompiles), recompiles
    assert len(recompiles) >= 2, recompiles


def test_autograd_runs_in_torch():
    m = _mlp()
    x = torch.randn(2, 10)
    compiled = torch.compile(m, backend="kiln")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = compiled(x)
    assert y.requires_grad
    y.sum().backward()
    assert m[0].weight.grad is not None
    assert any("autograd" in str(w.message) for w in caught)
    assert kiln.report.GRAPHS[0].autograd


def test_input_errors_name_the_input(tmp_path):
    b = kiln.GraphBuilder("g")
    x = b.add_input("x", "f32", [2, 3])
    [y] = b.add_node("relu", [x], {}, "act")
    b.set_outputs([y])
    f = kiln.aot.Loaded(kiln.CompiledGraph.compile(b))
    ok = np.random.rand(2, 3).astype(np.float32)
    np.testing.assert_array_equal(f(ok), np.maximum(ok, 0))
    with pytest.raises(kiln.InputError, match=r"input 0 \('x'\): expected f32\[2, 3\] on cpu, got a float64"):
        f(ok.astype(np.float64))
    with pytest.raises(kiln.InputError, match=r"input 0 \('x'\): expected f32\[2, 3\].*shape \[3, 2\]"):
        f(np.zeros((3, 2), np.float32))
    with pytest.raises(kiln.InputError, match="negative strides"):
        f(np.zeros((2, 3), np.float32)[:, ::-1])
    with pytest.raises(kiln.InputError, match=r"input 0 \('x'\): expected a tensor or array"):
        f("not a tensor")
    with pytest.raises(kiln.InputError, match="expected 1 inputs"):
        f(ok, ok)
    t = torch.randn(3, 2).t()  # non-contiguous: read with its strides
    assert torch.equal(f(t), torch.relu(t))
    with pytest.raises(kiln.KilnError, match="Kiln has no op 'reul'"):
        b.add_node("reul", [x], {}, "typo")
    with pytest.raises(kiln.InputError, match="act2"):
        b.add_node("relu", [x, x], {}, "act2")


def test_params_are_views_not_copies():
    w = np.ones((2, 3), np.float32)
    b = kiln.GraphBuilder("g")
    x = b.add_input("x", "f32", [2, 3])
    p = b.add_param("w", w)
    [y] = b.add_node("add", [x, p], {}, "add")
    b.set_outputs([y])
    w[:] = 5.0  # written after add_param, before compiling: Kiln sees it (it holds a view)
    f = kiln.aot.Loaded(kiln.CompiledGraph.compile(b, "eager"))
    np.testing.assert_array_equal(f(np.zeros((2, 3), np.float32)), np.full((2, 3), 5.0, np.float32))


class Indexing(torch.nn.Module):
    """Advanced indexing with index tensors at adjacent dims, broadcast together (as BERT's
    padding mask does: padding_mask[batch_idx, kv_idx]), negative indices included, and
    as_strided views of a contiguous tensor (ConvNeXt's pooled keepdim view)."""

    def forward(self, x, i0, i1, j0, j1):
        a = x[i0, i1]                    # dims 0, 1 -> broadcast shape + x.shape[2:]
        b = x[:, i1.reshape(-1)[:3], :]  # one index tensor at dim 1
        c = x[1:, j0, j1]                # dims 1, 2 after a slice
        t = torch.as_strided(x.reshape(3, 20), (20, 3), (1, 20))  # a transpose
        u = torch.as_strided(x.sum(-1, keepdim=True), (3, 1, 4, 1), (4, 99, 1, 7))
        return a * 2, b + 1, c, t.exp(), u


def test_advanced_indexing_and_as_strided():
    m = Indexing()
    compiled = torch.compile(m, backend="kiln")
    with torch.no_grad():
        for k in range(2):
            g = torch.Generator().manual_seed(k)
            x = torch.randn(3, 4, 5, generator=g)
            i0 = torch.randint(-3, 3, (2, 1), generator=g)   # negative: counted from the end
            i1 = torch.randint(-4, 4, (1, 6), generator=g)
            j0 = torch.randint(-4, 4, (3, 1), generator=g, dtype=torch.int32)
            j1 = torch.randint(0, 5, (2,), generator=g)
            args = (x, i0, i1, j0, j1)
            assert_close(compiled(*args), m(*args), f"call {k}")
    fallbacks = [f for g in kiln.report.GRAPHS for a in g.aten for f in a.fallbacks]
    assert not fallbacks, fallbacks
    # An index out of range is torch's IndexError, never a wrong value: Kiln's kernel refuses it
    # and the graph runs in torch from then on.
    x = torch.randn(3, 4, 5)
    with torch.no_grad(), pytest.raises(IndexError):
        compiled(x, torch.tensor([[3]]), torch.zeros(1, 6, dtype=torch.long),
                 torch.zeros(3, 1, dtype=torch.int32), torch.zeros(2, dtype=torch.long))
