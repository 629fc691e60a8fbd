"""Kiln from Python (docs/python.md).

- ``torch.compile(model, backend="kiln", options={...})`` — the Dynamo backend (registered
  through the ``torch_dynamo_backends`` entry point; also ``kiln.backend``);
- ``kiln.explain(model, *args)`` — what ran in Kiln, what fell back to torch and why;
- ``kiln.export(model, args, path)`` / ``kiln.load(path)`` — ahead-of-time graphs;
- ``kiln.compile_onnx(path)`` — an ONNX file through Kiln's importer, as a callable.

``import kiln`` loads only the C++ core: torch is imported by the functions that need it, and
no GPU is needed anywhere unless a CUDA device is asked for.
"""
from ._kiln import (  # noqa: F401
    CompiledGraph,
    GraphBuilder,
    InputError,
    KilnError,
    UnsupportedError,
    backends,
    cuda_status,
    num_threads,
    set_num_threads,
    version,
)

__version__ = version()


def backend(gm, example_inputs, **options):
    """The torch.compile backend: ``torch.compile(model, backend=kiln.backend)``."""
    from .dynamo import backend as _backend

    return _backend(gm, example_inputs, **options)


def explain(model, *args, **kwargs):
    """Compiles ``model`` with the Kiln backend, runs it on ``args`` and reports every graph,
    graph break, partition and fallback (see :class:`kiln.report.Explanation`)."""
    from .report import explain as _explain

    return _explain(model, *args, **kwargs)


def reset():
    """Forgets every compiled graph (torch._dynamo.reset() plus Kiln's records)."""
    from .report import reset as _reset

    _reset()


def export(model, args, path, **kwargs):
    """Exports ``model`` (torch.export) to a Kiln graph at ``path``; see :func:`kiln.aot.export`."""
    from .aot import export as _export

    return _export(model, args, path, **kwargs)


def load(path, **kwargs):
    """Loads what :func:`export` wrote; returns a callable on torch tensors or NumPy arrays."""
    from .aot import load as _load

    return _load(path, **kwargs)


def compile_onnx(path, **kwargs):
    """An ONNX model through Kiln's importer and compiler; returns a callable."""
    from .aot import compile_onnx as _compile_onnx

    return _compile_onnx(path, **kwargs)


_SUBMODULES = ("aot", "aten_table", "compiled", "dynamo", "lowering", "report")


def __getattr__(name):
    # kiln.aot, kiln.report, ... on first use: `import kiln` stays light (no torch import).
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")
