"""torch.compile(model, backend="kiln"): the Dynamo backend. See Note [The Kiln backend].

Note [The Kiln backend]
Dynamo captures Python into FX graphs (its graph breaks, guards and recompiles are its own) and
calls ``backend(gm, example_inputs, options=..., mode=...)`` once per graph. Then:
  1. if autograd would be needed (grad mode on and an input requires grad), the graph runs in
     torch: Kiln compiles inference graphs (autodiff is wave 3); explain says so;
  2. aot_autograd lowers the graph to functional core ATen with ``lowering.decompositions()``
     (core ATen minus the ops the ATen table takes whole) and calls ``_compile_aten``;
  3. shapes: a graph with symbolic sizes (Dynamo's automatic dynamic shapes after a recompile)
     is specialized per concrete size tuple at call time (the sizes arrive as int arguments),
     each specialization traced again with concrete shapes and cached;
  4. the ATen graph is planned (lowering.plan): whole-graph Kiln when every node is supported,
     else partitioned, with each Kiln partition a KilnGraph (kiln/compiled.py) inside the FX
     graph that torch runs; fallbacks warn once and are listed by kiln.explain;
  5. parameters are frozen at the first call and guarded (Note [Parameters] in compiled.py).
"""
import os
import re

import torch

from . import report
from .compiled import KilnGraph
from .lowering import KilnFallbackWarning, decompositions, partition, plan, warn_once  # noqa: F401

_MODES = ("default", "reduce-overhead", "max-autotune")
_DTYPES = {"float32": "float32", "f32": "float32", torch.float32: "float32",
           "bfloat16": "bfloat16", "bf16": "bfloat16", torch.bfloat16: "bfloat16",
           "float16": "float16", "f16": "float16", torch.float16: "float16"}


class Options:
    """Backend options: ``torch.compile(m, backend="kiln", mode=..., options={...})``.

    device   "cpu" | "cuda[:N]" | None (the device of the graph's tensors)
    mode     "default" | "reduce-overhead" | "max-autotune" (Kiln's compile modes)
    dtype    "float32" | "bfloat16" | "float16": mixed precision as torch.autocast runs it (Kiln's
             autocast pass: matmul, conv, attention and the pointwise ops between them in this
             dtype; norms, softmax and reductions in float32); inputs and outputs keep their dtypes
    threads  Kiln's kernel threads (OpenMP), 0 = its default
    strict   Kiln failures raise instead of falling back to torch
    backend  a registered Kiln compile backend to force ("inductor", "eager")
    """

    KEYS = ("device", "mode", "dtype", "threads", "strict", "backend")

    def __init__(self, options=None, mode=None):
        options = dict(options or {})
        unknown = sorted(set(options) - set(self.KEYS))
        if unknown:
            raise ValueError(f"kiln backend: unknown option(s) {', '.join(unknown)} "
                             f"(known: {', '.join(self.KEYS)})")
        self.mode = options.get("mode", mode) or "default"
        if self.mode not in _MODES:
            raise ValueError(f"kiln backend: mode must be one of {', '.join(_MODES)}, got {self.mode!r}")
        dev = options.get("device")
        self.device = torch.device(dev) if dev is not None else None
        if self.device is not None and self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"kiln backend: device must be cpu or cuda, got {dev!r}")
        dt = options.get("dtype", "float32")
        if dt not in _DTYPES:
            raise ValueError(f"kiln backend: dtype must be float32, bfloat16 or float16, got {dt!r}")
        self.precision = _DTYPES[dt]
        self.threads = int(options.get("threads", 0) or 0)
        if self.threads < 0:
            raise ValueError(f"kiln backend: threads must be >= 0, got {self.threads}")
        self.strict = bool(options.get("strict", False))
        self.kiln_backend = options.get("backend")


def backend(gm, example_inputs, options=None, mode=None, **kwargs):
    """The Dynamo backend (the ``torch_dynamo_backends`` entry point "kiln")."""
    opts = Options(options, mode)
    record = report.new_graph(gm, opts)
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        record.autograd = True
        warn_once(("autograd",), "kiln: a graph needs autograd (grad mode is on and inputs require "
                  "grad); Kiln compiles inference graphs, so it runs in torch. Call the model "
                  "under torch.no_grad() or torch.inference_mode().")
        return gm.forward
    device = opts.device or next((t.device for t in tensors if t.device.type != "meta"), torch.device("cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    names = [_clean_name(n) for n in _placeholder_sources(gm)]

    def fw_compiler(aten_gm, fake_inputs):
        return _compile_aten(aten_gm, fake_inputs, device, opts, record, names)

    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(fw_compiler=fw_compiler, decompositions=decompositions())(gm, example_inputs)


def _placeholder_sources(gm):
    out = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        ga = n.meta.get("grapharg")
        src = getattr(ga, "source", None)
        out.append(src.name() if src is not None and hasattr(src, "name") and callable(src.name)
                   else (src.name if src is not None else n.name))
    return out


def _clean_name(source_name):
    """L['self']._modules['fc']._parameters['weight'] -> fc.weight; L['x'] -> x."""
    s = str(source_name)
    s = re.sub(r"\._(modules|parameters|buffers)\[['\"]([^'\"]+)['\"]\]", r".\2", s)
    s = re.sub(r"^L\[['\"]self['\"]\]\.?", "", s)
    s = re.sub(r"^L\[['\"]([^'\"]+)['\"]\]", r"\1", s)
    s = re.sub(r"[^A-Za-z0-9_.]", "_", s).strip("._")
    return s or "arg"


def _static_indices(args, meta_static):
    """Arguments Dynamo marks static (parameters, buffers): frozen into Kiln graphs."""
    out = set(meta_static)
    for i, a in enumerate(args):
        if isinstance(a, torch.nn.Parameter) or getattr(a, "_dynamo_static_input_type", None):
            out.add(i)
    return out


def _meta_static_indices():
    ctx = torch._guards.TracingContext.try_get()
    md = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    return set(getattr(md, "static_input_indices", None) or ())


def _is_symbolic(x):
    if isinstance(x, torch.SymInt):
        return True
    if isinstance(x, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in x.shape)
    return False


def _compile_aten(aten_gm, fake_inputs, device, opts, record, names):
    meta_static = _meta_static_indices()
    if len(names) != len(fake_inputs):
        names = None  # aot deduplicated inputs: name them by position
    if any(_is_symbolic(x) for x in fake_inputs):
        fn = _Specializing(aten_gm, fake_inputs, device, opts, record, names, meta_static)
    else:
        fn = _Concrete(aten_gm, device, opts, record, names, meta_static)
    call = fn.call_boxed

    def run(args):
        return call(args)

    run._boxed_call = True  # aot_autograd passes the argument list itself
    return run


class _Concrete:
    """An ATen graph with concrete shapes: planned now, compiled at the first call."""

    def __init__(self, aten_gm, device, opts, record, names, meta_static, label=None):
        self.record = record
        self.opts = opts
        self.device = device
        self.names = names
        self.meta_static = meta_static
        supported, fallbacks = plan(aten_gm, device)
        n_ops = sum(1 for n in aten_gm.graph.nodes if n.op == "call_function")
        self.entry = record.add_aten_graph(aten_gm, n_ops, fallbacks, label)
        if fallbacks:
            ops = sorted({f.op for f in fallbacks})
            warn_once(("fallback",) + tuple(ops),
                      f"kiln: {len(fallbacks)} of {n_ops} ATen ops run in torch, not Kiln: "
                      + "; ".join(sorted({f"{f.op}: {f.reason}" for f in fallbacks}))
                      + " (kiln.explain(model, *args) lists them)")
        if not fallbacks:
            self.whole = KilnGraph(aten_gm, (), device, opts, self.entry, names, label="graph")
            self.gm = None
        else:
            self.whole = None
            self.gm, sub_names, views_only = partition(aten_gm, supported)
            self.entry.views_only = views_only
            self.subs = []
            placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
            ph_index = {n: i for i, n in enumerate(placeholders)}
            for node in self.gm.graph.nodes:
                if node.op == "call_module" and node.target in sub_names:
                    sub = getattr(self.gm, node.target)
                    kg = KilnGraph(sub, (), device, opts, self.entry, None, label=node.target)
                    outer = [ph_index.get(a) for a in node.args]
                    sub_names_list = [names[j] if (names and j is not None) else a.name
                                      for j, a in zip(outer, node.args)]
                    kg.names = sub_names_list
                    self.subs.append((kg, outer))
                    setattr(self.gm, node.target, _KilnModule(kg, sub))
            self.gm.recompile()
        self.first = True

    def call_boxed(self, args):
        if self.first:
            static = _static_indices(args, self.meta_static)
            if self.whole is not None:
                self.whole.static_indices = frozenset(static)
            else:
                for kg, outer in self.subs:
                    kg.static_indices = frozenset(
                        i for i, j in enumerate(outer) if j is not None and j in static)
            self.first = False
        if self.whole is not None:
            return self.whole.call(args)
        out = self.gm(*args)
        return list(out) if isinstance(out, (tuple, list)) else [out]


class _KilnModule(torch.nn.Module):
    """A partition of an FX graph run by Kiln (replaces a fused_N submodule)."""

    def __init__(self, kg, original):
        super().__init__()
        self.kg = kg
        out = next(n for n in original.graph.nodes if n.op == "output").args[0]
        self.tuple_out = isinstance(out, (tuple, list))

    def forward(self, *args):
        out = self.kg.call(list(args))
        return tuple(out) if self.tuple_out else out[0]


class _Specializing:
    """An ATen graph with symbolic sizes: one concrete graph per size tuple (the int arguments
    carry every symbol's value, as Dynamo passes them), each traced again with concrete shapes."""

    MAX = int(os.environ.get("KILN_SPECIALIZATION_LIMIT", "8"))

    def __init__(self, aten_gm, fake_inputs, device, opts, record, names, meta_static):
        self.gm = aten_gm
        self.device, self.opts, self.record, self.names = device, opts, record, names
        self.meta_static = meta_static
        self.int_args = [i for i, x in enumerate(fake_inputs) if isinstance(x, (int, torch.SymInt))]
        self.sym_tensors = [i for i, x in enumerate(fake_inputs)
                            if isinstance(x, torch.Tensor) and _is_symbolic(x)]
        self.cache = {}
        record.symbolic = True

    def call_boxed(self, args):
        key = tuple(args[i] for i in self.int_args) + tuple(tuple(args[i].shape) for i in self.sym_tensors)
        fn = self.cache.get(key)
        if fn is None:
            if len(self.cache) >= self.MAX:
                self.record.specialization_overflow += 1
                warn_once(("spec-limit", id(self)), f"kiln: more than {self.MAX} shapes for one "
                          "graph; further shapes run in torch (KILN_SPECIALIZATION_LIMIT)")
                out = self.gm(*args)
                return list(out) if isinstance(out, (tuple, list)) else [out]
            from torch.fx.experimental.proxy_tensor import make_fx

            with torch.no_grad():
                concrete = make_fx(self.gm, tracing_mode="fake")(*args)
            label = "sizes " + ", ".join(str(k) for k in key)
            fn = _Concrete(concrete, self.device, self.opts, self.record, self.names,
                           self.meta_static, label=label)
            self.cache[key] = fn
        return fn.call_boxed(args)
