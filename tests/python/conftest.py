"""Shared helpers of the Python tests (run by CTest through tests/CMakeLists.txt, or directly:
PYTHONPATH=build/python ~/.cache/kiln/venv/bin/python -m pytest tests/python)."""
import os
import subprocess
import sys

import pytest
import torch

# f32 tolerance of the model tests: max|kiln - torch| <= 1e-4 * max|torch|; NaN fails.
RTOL = 1e-4


def flat_tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict) or hasattr(x, "values") and not isinstance(x, (list, tuple)):
        return [t for v in x.values() for t in flat_tensors(v)]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in flat_tensors(v)]
    return []


def assert_close(got, ref, what="output"):
    got, ref = flat_tensors(got), flat_tensors(ref)
    assert len(got) == len(ref), f"{what}: {len(got)} tensors, torch gives {len(ref)}"
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g.shape == r.shape and g.dtype == r.dtype, f"{what} {i}: {g.dtype}{list(g.shape)} vs {r.dtype}{list(r.shape)}"
        if not r.dtype.is_floating_point:
            assert torch.equal(g, r), f"{what} {i}: integer values differ"
            continue
        assert not torch.isnan(g).any(), f"{what} {i}: NaN in Kiln's output"
        assert not torch.isnan(r).any(), f"{what} {i}: NaN in torch's output (bad test input)"
        scale = r.abs().max().item()
        assert scale > 0, f"{what} {i}: torch's output is all zeros (the test would prove nothing)"
        diff = (g - r).abs().max().item()
        assert diff <= RTOL * scale, f"{what} {i}: max|diff| {diff:.3g} > {RTOL} * max|ref| {scale:.3g}"


def randomize_(model, seed=0):
    """Deterministic random weights, including parameters a constructor zero-initializes (ViT's
    head), so that every output depends on every layer."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.numel() and float(p.abs().max()) == 0.0:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    import kiln

    kiln.reset()
    yield
    kiln.reset()


def run_python(code, timeout=600):
    """Runs `code` in a fresh Python process with this process's environment."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=timeout, env=dict(os.environ))
    assert r.returncode == 0, f"subprocess failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r.stdout
