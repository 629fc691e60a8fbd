"""Ahead of time: kiln.export / kiln.load / kiln.compile_onnx.

Note [Export format]
``kiln.export(model, args, "model.kiln")`` writes a **.kiln deployment package** (docs/package.md:
one file with the manifest, the weights as Kiln's compiler folded and packed them, and the
generated kernels as a shared object), the same file ``kiln compile -o`` writes and that the C
runtime (``include/kiln/kiln_runtime.h``), ``kiln run`` and ``kiln bench`` load. The package holds
a compiled CPU executable. ``kiln.load`` loads it with the runtime alone: nothing is compiled,
torch is not imported (NumPy arrays in and out), and the loaded graph runs exactly the kernels
the package holds.

Packages for CUDA and packages with symbolic sizes do not exist yet (issue #14).
``kiln.export(..., device="cuda")`` and ``kiln.export(..., dynamic_shapes=...)`` (when torch.export
leaves a size symbolic) therefore write what exists and say so (a ``KilnExportWarning``): a
*graph folder*

    model.kiln/
      manifest.json          {"format": "kiln-graph-preview-1", inputs, outputs, mode, device, ...}
      graph.kir              the Kiln graph as IR text (docs/ir.md), weights declared by type
      weights.safetensors    every parameter, under its IR name (written by Kiln)

which ``kiln.load`` reads back, parses, binds and compiles for its device; a graph with symbolic
input sizes (Note [Symbolic sizes] in lowering.py: torch's symbols s0, s1, ... kept in the Kiln
graph) compiles once per set of input sizes, on the first call with them (Note [Symbolic graphs
from Python] in python/src/bridge.cc), and a call whose sizes break the graph's relations fails
naming the input. Only
``write_graph_folder`` / ``read_graph_folder`` and ``_is_package`` know about files.
"""
import json
import os
import shutil
import tempfile
import warnings

from . import _kiln

FORMAT = "kiln-graph-preview-1"
PACKAGE_MAGIC = b"KILNPKG\0"  # the first 8 bytes of a .kiln package (docs/package.md)


class KilnExportWarning(UserWarning):
    """kiln.export wrote something other than a .kiln package (a CUDA graph folder)."""


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


def _is_package(path):
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(len(PACKAGE_MAGIC)) == PACKAGE_MAGIC


def read_graph_folder(path):
    mpath = os.path.join(path, "manifest.json")
    if not os.path.isfile(mpath):
        raise _kiln.KilnError(f"kiln.load: {path} is neither a .kiln package nor an exported Kiln "
                              f"graph folder (no manifest.json): pass what kiln.export wrote")
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
_PRECISIONS = {None: "float32", "float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def export(model, args, path, *, kwargs=None, device=None, mode="default", dtype=None,
           dynamic_shapes=None, name=None):
    """Exports ``model(*args, **kwargs)`` through torch.export to ``path``: a .kiln package on the
    CPU, a graph folder on CUDA until CUDA packages exist (Note [Export format]). Every op must be
    one Kiln takes: an exported model runs without torch. ``mode``: Kiln's compile mode (a
    max-autotune package holds the tuned choices); ``dtype``: "bfloat16" / "float16" for mixed
    precision (Kiln's autocast; inputs and outputs stay float32). Returns the path."""
    import torch

    from .compiled import choose_backend
    from .lowering import build_graph, decompositions, plan

    if mode not in ("default", "reduce-overhead", "max-autotune"):
        raise ValueError(f"kiln.export: mode must be default, reduce-overhead or max-autotune, got {mode!r}")
    if dtype in (torch.float32, torch.bfloat16, torch.float16):
        dtype = str(dtype).replace("torch.", "")
    if dtype not in _PRECISIONS:
        raise ValueError(f"kiln.export: dtype must be float32, bfloat16 or float16, got {dtype!r}")
    precision = _PRECISIONS[dtype]
    args = tuple(args)
    if device is None:
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    with torch.no_grad():
        ep = torch.export.export(model, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes)
        ep = ep.run_decompositions(decompositions())
    gm = ep.graph_module
    specs = ep.graph_signature.input_specs
    user = iter(a for a in torch.utils._pytree.tree_leaves((args, kwargs or {})))
    values, frozen, names = [], set(), []
    for i, s in enumerate(specs):
        kind = s.kind.name
        if kind == "USER_INPUT":
            v = next(user)
            values.append(v.to(device) if isinstance(v, torch.Tensor) else v)
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
    builder, input_args, _ = build_graph(gm, values, frozen, device, names=names, graph_name="main")
    builder.verify()
    dynamic = builder.has_symbolic_shapes()
    if device.type == "cpu" and not dynamic:
        model_name = name or type(model).__name__
        _kiln.CompiledGraph.compile_package(builder, os.fspath(path), model_name, mode, precision)
        return path
    why = ("its input sizes are symbolic (dynamic_shapes) and packages hold one executable of "
           "static shapes so far (issue #14); kiln.load compiles the folder once per set of "
           "input sizes" if dynamic else
           f"packages hold CPU executables so far (issue #14); kiln.load compiles the folder "
           f"for {device}")
    warnings.warn(f"kiln.export: {path} is a graph folder (IR text + weights), not a .kiln "
                  f"package: {why}", KilnExportWarning, stacklevel=2)
    manifest = {
        "format": FORMAT,
        "note": "graph folder: IR text + safetensors; .kiln packages for CUDA and for symbolic "
                "sizes (issue #14) replace it",
        "kiln_version": _kiln.version(),
        "torch_version": torch.__version__,
        "mode": mode,
        "precision": precision,
        "device": str(device),
        "backend": choose_backend(device),
        "dynamic": dynamic,
        "inputs": builder.input_specs(),
        "outputs": builder.output_specs(),
    }
    write_graph_folder(builder, path, manifest)
    return path


def load(path, *, backend=None, mode=None):
    """Loads what kiln.export wrote: a .kiln package through the runtime alone (``backend`` and
    ``mode`` do not apply: the package holds compiled kernels), or a graph folder, which is
    compiled here. Returns a :class:`Loaded` callable."""
    path = os.fspath(path)
    if _is_package(path):
        if backend is not None or mode is not None:
            raise ValueError(f"kiln.load: {path} is a compiled .kiln package; backend= and mode= "
                             f"apply to graph folders only")
        compiled = _kiln.CompiledGraph.load_package(path)
        return Loaded(compiled, json.loads(compiled.manifest))
    builder, manifest = read_graph_folder(path)
    compiled = _kiln.CompiledGraph.compile(builder, backend or manifest.get("backend", "inductor"),
                                           mode or manifest.get("mode", "default"),
                                           manifest.get("precision", "float32"))
    return Loaded(compiled, manifest)


def compile_onnx(path, *, input_shapes=None, backend="inductor", mode="default", dtype=None):
    """Imports an ONNX model with Kiln's importer (``input_shapes``: name -> shape, to fix
    dynamic dims) and compiles it (``dtype``: "bfloat16" / "float16" mixed precision); returns a
    :class:`Loaded` callable."""
    if dtype not in _PRECISIONS:
        raise ValueError(f"kiln.compile_onnx: dtype must be float32, bfloat16 or float16, got {dtype!r}")
    builder = _kiln.GraphBuilder.import_onnx(os.fspath(path), dict(input_shapes or {}))
    compiled = _kiln.CompiledGraph.compile(builder, backend, mode, _PRECISIONS[dtype])
    return Loaded(compiled, {"source": os.fspath(path)})
