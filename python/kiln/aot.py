"""Ahead of time: kiln.export / kiln.load / kiln.compile_onnx.

Note [Export format]
Deployment packages (``.kiln``: manifest, weights, compiled kernels, loaded by a C runtime) are
issue #14 and do not exist yet. Until they do, ``kiln.export`` writes what Kiln has today, a
*graph folder*:

    model.kiln/
      manifest.json          {"format": "kiln-graph-preview-1", inputs, outputs, mode, device, ...}
      graph.kir              the Kiln graph as IR text (docs/ir.md), weights declared by type
      weights.safetensors    every parameter, under its IR name (written by Kiln)

``kiln.load`` reads it back, parses the IR, binds the weights and compiles it with the Kiln
backend for its device (nothing from torch is needed: NumPy arrays work). The format is a
preview: the package format will replace it, and only ``write_graph_folder`` /
``read_graph_folder`` below know about files, so the package writer and reader slot in there.
"""
import json
import os
import shutil
import tempfile

from . import _kiln

FORMAT = "kiln-graph-preview-1"


class Loaded:
    """A compiled Kiln graph called with torch tensors or NumPy arrays (outputs of the same
    kind as the first input). Wrong dtypes, shapes or devices raise kiln.InputError naming the
    input."""

    def __init__(self, compiled, manifest=None):
        self.compiled = compiled
        self.manifest = manifest or {}
        self.inputs = compiled.input_specs()
        self.outputs = compiled.output_specs()
        self._runner = _kiln.Runner(compiled, list(range(len(self.inputs))), [])
        self._torch = False

    def __call__(self, *args):
        if len(args) != len(self.inputs):
            names = ", ".join(s["name"] for s in self.inputs)
            raise _kiln.InputError(f"expected {len(self.inputs)} inputs ({names}), got {len(args)}")
        framework = 1
        if args and type(args[0]).__module__.startswith("torch"):
            framework = 0
            if not self._torch:
                import torch

                _kiln.use_torch_exchange_api(torch.Tensor)
                self._torch = True
        out = self._runner(list(args), framework)
        return out[0] if len(out) == 1 else tuple(out)

    @property
    def summary(self):
        return self.compiled.summary

    def __repr__(self):
        ins = ", ".join(f"{s['name']}: {s['type']}" for s in self.inputs)
        return f"<kiln.Loaded ({ins}) [{self.compiled.backend}]>"


# ---- the files (the only place that knows the format: see Note [Export format]) --------------
def write_graph_folder(builder, path, manifest):
    parent = os.path.dirname(os.path.abspath(path)) or "."
    tmp = tempfile.mkdtemp(prefix=".kiln-export-", dir=parent)
    try:
        with open(os.path.join(tmp, "graph.kir"), "w") as f:
            f.write(builder.ir())
        builder.save_params(os.path.join(tmp, "weights.safetensors"))
        with open(os.path.join(tmp, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=2)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            raise FileExistsError(f"kiln.export: {path} exists and is not an exported graph folder")
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_graph_folder(path):
    mpath = os.path.join(path, "manifest.json")
    if not os.path.isfile(mpath):
        raise _kiln.KilnError(f"kiln.load: {path} is not an exported Kiln graph (no manifest.json)")
    with open(mpath) as f:
        manifest = json.load(f)
    if manifest.get("format") != FORMAT:
        raise _kiln.KilnError(f"kiln.load: {path}: format {manifest.get('format')!r}, this Kiln "
                              f"reads {FORMAT!r}")
    kir = os.path.join(path, "graph.kir")
    with open(kir) as f:
        text = f.read()
    builder = _kiln.GraphBuilder.load(text, kir, os.path.join(path, "weights.safetensors"))
    return builder, manifest


# ---- export / load -------------------------------------------------------------------------
def export(model, args, path, *, kwargs=None, device=None, mode="default", dynamic_shapes=None):
    """Exports ``model(*args, **kwargs)`` through torch.export to a Kiln graph folder at
    ``path`` (Note [Export format]; the .kiln package format comes with issue #14). Every op
    must be one Kiln takes: an exported graph runs without torch. Returns the path."""
    import torch

    from .compiled import choose_backend
    from .lowering import build_graph, decompositions, plan

    if dynamic_shapes is not None:
        raise _kiln.UnsupportedError(
            "kiln.export: dynamic_shapes is not supported yet: Kiln's compiler specializes shapes "
            "(symbolic shapes are wave 3); export once per input shape")
    if mode not in ("default", "reduce-overhead", "max-autotune"):
        raise ValueError(f"kiln.export: mode must be default, reduce-overhead or max-autotune, got {mode!r}")
    args = tuple(args)
    if device is None:
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    device = torch.device(device)
    with torch.no_grad():
        ep = torch.export.export(model, args, kwargs=kwargs)
        ep = ep.run_decompositions(decompositions())
    gm = ep.graph_module
    specs = ep.graph_signature.input_specs
    user = iter(a for a in torch.utils._pytree.tree_leaves((args, kwargs or {})))
    values, frozen, names = [], set(), []
    for i, s in enumerate(specs):
        kind = s.kind.name
        if kind == "USER_INPUT":
            values.append(next(user))
            names.append(s.arg.name)
        elif kind in ("PARAMETER", "BUFFER"):
            t = ep.state_dict[s.target] if s.target in ep.state_dict else ep.constants[s.target]
            values.append(t.to(device))
            frozen.add(i)
            names.append(s.target)
        elif kind == "CONSTANT_TENSOR":
            values.append(ep.constants[s.target].to(device))
            frozen.add(i)
            names.append(s.target)
        else:
            raise _kiln.UnsupportedError(f"kiln.export: graph input {s.arg.name} of kind {kind}")
    supported, fallbacks = plan(gm, device)
    if fallbacks:
        raise _kiln.UnsupportedError(
            "kiln.export: the graph has ops Kiln does not take (an exported graph runs without "
            "torch): " + "; ".join(f"{f.op} ('{f.node}'): {f.reason}" for f in fallbacks))
    builder, input_args, _, _ = build_graph(gm, values, frozen, device, names=names, graph_name="main")
    builder.verify()
    manifest = {
        "format": FORMAT,
        "note": "preview graph folder: IR text + safetensors; the .kiln package (issue #14) replaces it",
        "kiln_version": _kiln.version(),
        "torch_version": torch.__version__,
        "mode": mode,
        "device": str(device),
        "backend": choose_backend(device),
        "inputs": builder.input_specs(),
        "outputs": builder.output_specs(),
    }
    write_graph_folder(builder, path, manifest)
    return path


def load(path, *, backend=None, mode=None):
    """Loads what kiln.export wrote and compiles it; returns a :class:`Loaded` callable."""
    builder, manifest = read_graph_folder(path)
    compiled = _kiln.CompiledGraph.compile(builder, backend or manifest.get("backend", "inductor"),
                                           mode or manifest.get("mode", "default"))
    return Loaded(compiled, manifest)


def compile_onnx(path, *, input_shapes=None, backend="inductor", mode="default"):
    """Imports an ONNX model with Kiln's importer (``input_shapes``: name -> shape, to fix
    dynamic dims) and compiles it; returns a :class:`Loaded` callable."""
    builder = _kiln.GraphBuilder.import_onnx(os.fspath(path), dict(input_shapes or {}))
    return Loaded(_kiln.CompiledGraph.compile(builder, backend, mode), {"source": os.fspath(path)})
