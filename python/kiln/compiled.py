"""A Kiln-compiled (sub)graph as a Python callable: freezing, guards, recompiles, fallback.

Note [Parameters]
Parameters and buffers (the graph inputs Dynamo marks static: nn.Parameter objects and module
buffers) are frozen into the Kiln graph when it is first called: Kiln views their memory (no
copy) and may fold them (batch norm into convolution, prepacked oneDNN weights). Every call then
checks, in C++ (Note [The call path] in python/src/module.cc), that each frozen argument is the
same tensor object with the same ``_version`` — torch's counter of in-place writes. When one
differs (``load_state_dict``, an optimizer step, ``p.mul_(2)`` under ``torch.no_grad()``, a new
``nn.Parameter`` assigned to the module), the graph is re-frozen with the current tensors and
recompiled; Kiln's code cache makes that a cache hit when only values changed. The recompile is
counted and its reason recorded (kiln.explain). Writes that bypass the version counter
(``p.data.copy_(...)``, writing through a NumPy view) are not seen: call ``kiln.reset()``.
"""
import time

import torch

from . import _kiln
from .lowering import build_graph

_TORCH_API = _kiln.use_torch_exchange_api(torch.Tensor)


def choose_backend(device, override=None):
    """The registered Kiln compile backend: "inductor", Kiln's device-generic compiler, on every
    device (the CPU target on the CPU, the CUDA target on CUDA: the compiler picks the target from
    the graph's device); `override` (the `backend` option) forces another, e.g. "eager"."""
    del device  # one compiler for every device (kept: callers state the device they compile for)
    return override or "inductor"


class KilnGraph:
    """One Kiln graph over an ATen FX (sub)graph. Called with the (sub)graph's arguments, it
    compiles on the first call (freezing the static arguments), then runs the compiled graph;
    on a guard failure it re-freezes and recompiles; if Kiln fails, the (sub)graph runs in torch
    from then on (reported once), unless `strict`."""

    def __init__(self, gm, static_indices, device, options, record, names=None, label="graph"):
        self.gm = gm
        self.static_indices = frozenset(static_indices)
        self.device = device
        self.options = options
        self.record = record  # kiln.report.GraphRecord (what explain shows)
        self.names = names
        self.label = label
        self.runner = None
        self.compiled = None
        self.frozen = []
        self.failed = None  # the error that sent this graph to torch
        self.compiles = 0
        self.calls = 0
        self._cuda = device.type == "cuda"
        self._threads = options.threads

    # -- compile
    def _compile(self, args):
        t0 = time.perf_counter()
        b, input_args, frozen = build_graph(
            self.gm, args, self.static_indices, self.device, self.names, graph_name=self.label)
        if self._threads:
            _kiln.set_num_threads(self._threads)
        backend = choose_backend(self.device, self.options.kiln_backend)
        self.compiled = _kiln.CompiledGraph.compile(b, backend, self.options.mode,
                                                    self.options.precision)
        self.runner = _kiln.Runner(self.compiled, input_args, [(f.index, f.tensor) for f in frozen])
        self.frozen = frozen
        self.compiles += 1
        self.record.on_compile(self, b, time.perf_counter() - t0)

    def _fallback(self, err):
        self.failed = err
        self.runner = None
        self.record.on_failure(self, err)
        if self.options.strict:
            raise err

    # -- call
    def __call__(self, *args):
        return self.call(list(args))

    def call(self, args):
        self.calls += 1
        if self.runner is None and self.failed is None:
            try:
                self._compile(args)
            except Exception as e:  # noqa: BLE001 — any compile failure: this graph runs in torch
                self._fallback(e)
        if self.failed is not None:
            return self.gm(*args)
        if self._threads:
            _kiln.set_num_threads(self._threads)
        if self._cuda:
            return self._call_cuda(args)
        try:
            out = self.runner(args)
            if out is None:
                self.record.on_recompile(self, self._guard_reason(args))
                self._compile(args)
                out = self.runner(args)
        except _kiln.KilnError as e:
            self._fallback(e)
            return self.gm(*args)
        return out

    def _call_cuda(self, args):
        # Kiln's CUDA kernels run on the legacy default stream; torch's current stream may be
        # another one: order the two around the call.
        cur = torch.cuda.current_stream()
        legacy = cur == torch.cuda.default_stream()
        if not legacy:
            cur.synchronize()
        try:
            out = self.runner(args)
            if out is None:
                self.record.on_recompile(self, self._guard_reason(args))
                self._compile(args)
                out = self.runner(args)
        except _kiln.KilnError as e:
            self._fallback(e)
            return self.gm(*args)
        if not legacy:
            torch.cuda.default_stream().synchronize()
        return out

    def _guard_reason(self, args):
        why = self.runner.guard_failure(args)
        for f in self.frozen:
            if why.startswith(f"argument {f.index} "):
                return f"parameter '{f.name}'" + why[len(f"argument {f.index}"):]
        return why
