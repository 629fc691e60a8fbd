"""Core-ATen FX graphs -> Kiln graphs: conversion, support checks and partitioning.

Note [Lowering]
The Dynamo backend (kiln/dynamo.py) hands this module a functional core-ATen FX graph with
concrete shapes (aot_autograd with the decompositions of ``decompositions()``). Each
call_function node is looked up in the ATen table (kiln/aten_table.py). Whether Kiln takes a node
is decided by converting it alone into a scratch Kiln graph (``node_support``): the table entry
must exist, its converter must accept the arguments, every tensor must have a Kiln dtype and sit
on the graph's device, Kiln's inference must agree with torch's metadata on the output types,
and on CUDA every Kiln op emitted must have a CUDA kernel. A node that fails any of these keeps
running in torch, with the reason recorded (kiln.explain).

If every node is taken, the whole graph becomes one Kiln graph. Otherwise torch's
CapabilityBasedPartitioner groups the supported nodes into partitions (each a connected,
cycle-free subgraph), partitions that only move metadata (views, constants) are left to torch,
and each remaining partition becomes a submodule run by Kiln inside the FX graph torch runs.

The graph crosses into C++ through GraphBuilder (kiln._kiln, over kiln::Graph): one call per
input, parameter and node, with types inferred by Kiln's registry as each node is added, so a
converter bug surfaces at the node that caused it, named after the FX node.
"""
import operator
import warnings

import numpy as np
import torch

from . import _kiln
from .aten_table import ATEN_TABLE, Unsupported

TORCH_TO_KILN = {
    torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
    torch.int64: "i64", torch.int32: "i32", torch.int8: "i8", torch.uint8: "u8", torch.bool: "bool",
}
KILN_TO_TORCH = {v: k for k, v in TORCH_TO_KILN.items()}
KILN_TO_NUMPY = {"f32": np.float32, "f16": np.float16, "f64": np.float64, "i64": np.int64,
                 "i32": np.int32, "i8": np.int8, "u8": np.uint8, "bool": np.bool_}
# Kiln ops that only move metadata: a partition made of these alone is not worth a call.
VIEW_OPS = {"reshape", "permute", "transpose", "expand", "squeeze", "unsqueeze", "slice", "flatten"}

_REGISTRY = None


def registry():
    """Kiln's op registry by name (kiln._kiln.ops())."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = {o["name"]: o for o in _kiln.ops()}
    return _REGISTRY


_DECOMPOSITIONS = None


def decompositions():
    """The decomposition table for aot_autograd: core ATen's, except ops the ATen table takes
    whole (so a table entry is never decomposed away). Built once per process (~1 s)."""
    global _DECOMPOSITIONS
    if _DECOMPOSITIONS is None:
        from torch._decomp import core_aten_decompositions

        keep = set(ATEN_TABLE)
        _DECOMPOSITIONS = {op: fn for op, fn in core_aten_decompositions().items()
                           if str(op) not in keep}
    return _DECOMPOSITIONS


def aten_name(target):
    """'aten.add.Tensor' for an OpOverload; None for anything else."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return None


def kiln_dtype(torch_dtype, where):
    d = TORCH_TO_KILN.get(torch_dtype)
    if d is None:
        raise Unsupported(f"{where}: dtype {torch_dtype} has no Kiln equivalent")
    return d


class Sym(str):
    """A symbolic size while converting (Note [Symbolic sizes]): the expression in Kiln's syntax
    ("s0", "2*s0"). Shapes hold ints and Syms."""

    __slots__ = ()


# Note [Symbolic sizes]
# torch.export with dynamic_shapes gives FX graphs whose sizes are SymInts over symbols s0, s1,
# ...; Kiln graphs keep them symbolic (SymInt expressions under the same names). A size becomes
# an int when torch knows its value, else a Sym: its sympy expression printed in Kiln's syntax
# (_sym_text). Converters read shapes as usual; what they pass in attributes (reshape's target,
# slice bounds) may hold Syms, which the bridge parses into SymInts. Size arithmetic in the graph
# (aten.sym_size.int, operator.mul on sizes) is evaluated here into ints or Syms and emits no Kiln
# node. A converter that needs a size's value (split of a symbolic dim) refuses it by name.
def _sym_text(e):
    import sympy
    import torch.utils._sympy.functions as symfn

    FloorDiv = getattr(symfn, "FloorDiv", ())
    mods = tuple(getattr(symfn, n) for n in ("Mod", "PythonMod") if hasattr(symfn, n))

    if isinstance(e, sympy.Integer):
        return str(int(e))
    if isinstance(e, sympy.Symbol):
        return e.name
    if isinstance(e, sympy.Add):
        return "(" + " + ".join(_sym_text(a) for a in e.args) + ")"
    if isinstance(e, sympy.Mul):
        return "(" + "*".join(_sym_text(a) for a in e.args) + ")"
    if FloorDiv and isinstance(e, FloorDiv):
        return f"({_sym_text(e.args[0])}//{_sym_text(e.args[1])})"
    if mods and isinstance(e, mods):
        return f"({_sym_text(e.args[0])}%{_sym_text(e.args[1])})"
    if isinstance(e, (sympy.Max, sympy.Min)):
        f = "max" if isinstance(e, sympy.Max) else "min"
        out = _sym_text(e.args[0])
        for a in e.args[1:]:
            out = f"{f}({out}, {_sym_text(a)})"
        return out
    raise Unsupported(f"the symbolic size {e} ({type(e).__name__}) has no Kiln form")


def _size(s):
    """An int, or a Sym for a size torch does not know (Note [Symbolic sizes])."""
    if isinstance(s, int):
        return s
    if isinstance(s, torch.SymInt):
        e = s.node.expr
        if getattr(e, "is_number", False):
            return int(e)
        return Sym(_sym_text(e))
    if isinstance(s, Sym):
        return s
    return int(s)


def _same_size(a, b, torch_size=None):
    """Whether Kiln's size `a` is torch's size `b` (ints or Syms). Symbolic sizes are the same
    when their canonical forms are, or else when they agree on every sample of the symbols'
    ranges that torch knows (`torch_size`, b's SymInt): Kiln knows no ranges, so it may keep
    min(s27, 512) where torch, knowing s27 <= 128, has s27."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, int) or isinstance(b, int):
        return False
    if _kiln.symbolic_dim(a) == _kiln.symbolic_dim(b):
        return True
    if not isinstance(torch_size, torch.SymInt):
        return False
    node = torch_size.node
    ranges = {}
    for sym in node.expr.free_symbols:
        r = node.shape_env.var_to_range.get(sym)
        lo = int(r.lower) if r is not None and r.lower.is_finite else 2
        hi = int(r.upper) if r is not None and r.upper.is_finite else lo + 1000
        ranges[sym.name] = sorted({lo, min(lo + 1, hi), min(lo + 7, hi), hi})
    import itertools

    names = list(ranges)
    for values in itertools.product(*(ranges[n] for n in names)):
        binding = list(zip(names, values))
        try:
            if _kiln.evaluate_dim(a, binding) != _kiln.evaluate_dim(b, binding):
                return False
        except _kiln.KilnError:
            return False
    return True


def _size_op(op, a, b):
    """A size arithmetic node (operator.mul, ...) on ints and Syms."""
    if isinstance(a, int) and isinstance(b, int):
        return op(a, b)
    sym = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.floordiv: "//",
           operator.mod: "%"}.get(op)
    if sym is None:
        raise Unsupported(f"size arithmetic {getattr(op, '__name__', op)} on symbolic sizes")
    return Sym(f"({a}){sym}({b})")


_SIZE_OPS = (operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod)


def _is_size_node(node):
    """FX nodes that compute sizes or assert on them (no Kiln node: Note [Symbolic sizes])."""
    t = node.target
    return t in _SIZE_OPS or t in _META_TARGETS()


_META = None


def _META_TARGETS():
    global _META
    if _META is None:
        aten = torch.ops.aten
        names = ("sym_size.int", "_assert_scalar.default", "sym_constrain_range_for_size.default",
                 "sym_constrain_range.default", "_assert_tensor_metadata.default")
        found = []
        for n in names:
            pkt, ov = n.split(".")
            try:
                found.append(getattr(getattr(aten, pkt), ov))
            except AttributeError:
                pass
        _META = tuple(found)
    return _META


def _val(node):
    """The FakeTensor (or tuple of them) torch recorded for an FX node's output."""
    return node.meta.get("val", node.meta.get("example_value")) if hasattr(node, "meta") else None


class V:
    """A Kiln value while converting: its id in the builder, dtype (Kiln short name), shape,
    the node that produced it (for patterns like linear) and torch's metadata when it came
    from an FX node."""

    __slots__ = ("id", "dtype", "shape", "origin", "val")

    def __init__(self, id, dtype, shape, origin=None, val=None):
        self.id, self.dtype, self.shape, self.origin, self.val = id, dtype, tuple(shape), origin, val

    def __repr__(self):
        return f"V(%{self.id}: {self.dtype}{list(self.shape)})"


class ConvertContext:
    """What converters see (Note [The ATen table]). One per Kiln graph being built."""

    def __init__(self, builder, device):
        self.b = builder
        self.device = device  # torch.device
        self.kiln_device = "cpu" if device.type == "cpu" else f"cuda:{device.index or 0}"
        self.entry = None
        self.node = None
        self.emitted = []
        self._consts = {}

    # -- per node
    def begin(self, node, entry):
        self.node, self.entry = node, entry
        val = _val(node)
        first = val[0] if isinstance(val, (tuple, list)) and val else val
        self._out = first if isinstance(first, torch.Tensor) else None

    @property
    def out_dtype(self):
        if self._out is None:
            raise Unsupported("the node's output type is unknown")
        return self.kdtype(self._out.dtype)

    @property
    def out_shape(self):
        if self._out is None:
            raise Unsupported("the node's output shape is unknown")
        return tuple(_size(s) for s in self._out.shape)

    def kdtype(self, torch_dtype):
        return kiln_dtype(torch_dtype, self.where())

    def where(self):
        return f"{self.entry.name if self.entry else 'node'} '{self.node.name if self.node else ''}'"

    # -- building
    def _value(self, vid, origin=None):
        dims = [int(d) if d.lstrip("-").isdigit() else Sym(d) for d in self.b.dims(vid)]
        return V(vid, self.b.dtype(vid), dims, origin)

    def ops(self, kiln_op, inputs, **attrs):
        if self.entry is not None and kiln_op not in self.entry.emits:
            raise AssertionError(f"internal error: the ATen entry {self.entry.name} emitted "
                                 f"'{kiln_op}', which it does not declare")
        ids = [-1 if v is None else v.id for v in inputs]
        attrs = {k: (_kiln.SymDim(str(v)) if isinstance(v, Sym) else v)
                 for k, v in attrs.items() if v is not None}
        outs = self.b.add_node(kiln_op, ids, attrs, self.node.name if self.node else "")
        self.emitted.append(kiln_op)
        origin = (kiln_op, list(inputs), attrs)
        return [self._value(o, origin) for o in outs]

    def op(self, kiln_op, inputs, **attrs):
        outs = self.ops(kiln_op, inputs, **attrs)
        assert len(outs) == 1, f"{kiln_op} has {len(outs)} outputs"
        return outs[0]

    def cast(self, v, dtype):
        if v.dtype == dtype:
            return v
        return self.op("cast", [v], dtype=_kiln.DType(dtype))

    def operand(self, a, dtype):
        """A tensor cast to `dtype`, or a Python scalar as a 0-d constant of `dtype`."""
        if isinstance(a, V):
            return self.cast(a, dtype)
        return self.scalar(a, dtype)

    def dtype_attr(self, dtype):
        return _kiln.DType(dtype)

    def scalar(self, value, dtype):
        key = (repr(value), type(value).__name__, dtype)
        if key not in self._consts:
            arr = self._np_array(value, dtype, ())
            self._consts[key] = self._value(self.b.add_const(arr, "", self.kiln_device))
        return self._consts[key]

    def _np_array(self, value, dtype, shape):
        if dtype == "bf16":
            return torch.full(shape, value, dtype=torch.bfloat16)
        return np.full(shape, value, dtype=KILN_TO_NUMPY[dtype])

    def filled(self, value):
        shape, dt = self.out_shape, self.out_dtype
        if not shape:
            return self.scalar(value, dt)
        arr = self._np_array(value, dt, (1,) * len(shape))
        c = self._value(self.b.add_const(arr, "", self.kiln_device))
        return self.op("expand", [c], shape=list(shape))

    def arange(self, start, end, step):
        if end is None:
            start, end = 0, start
        if isinstance(start, str) or isinstance(end, str) or isinstance(step, str):
            return self._symbolic_arange(start, step)
        dt = self.out_dtype
        if dt == "bf16":
            arr = torch.arange(start, end, step, dtype=torch.bfloat16)
        else:
            arr = np.arange(start, end, step, dtype=KILN_TO_NUMPY[dt])
        return self._value(self.b.add_const(arr, "", self.kiln_device))

    def crop(self, x, dim, start, end):
        """x[start:end] along `dim` where a bound or the size is symbolic (Note [Symbolic
        sizes]): a constant pad with negative pads, whose pads are sizes (SymInt lists) where
        slice's bounds are plain ints. start <= end <= size is torch's to prove; a specialized
        graph that breaks it fails naming the node (a negative size)."""
        n = x.shape[dim]

        def sub(a, b):
            return a - b if isinstance(a, int) and isinstance(b, int) else Sym(f"({a}) - ({b})")

        k = len(x.shape) - dim
        pads = [sub(0, start)] + [0] * (k - 1) + [sub(end, n)] + [0] * (k - 1)
        return self.op("pad", [x], pads=pads, mode="constant", value=0.0)

    def _symbolic_arange(self, start, step):
        # A symbolic length (Note [Symbolic sizes]): the range up to the length's upper bound as
        # a constant, sliced to the length. The bound is torch's (the Dim's max).
        if isinstance(start, str) or isinstance(step, str):
            raise Unsupported("arange with a symbolic start or step")
        n = self._out.shape[0] if self._out is not None else None
        upper = None
        if isinstance(n, torch.SymInt):
            try:
                upper = n.node.shape_env.bound_sympy(n.node.expr).upper
            except Exception:  # noqa: BLE001 - no bound known: refused below
                upper = None
        try:  # torch's unbounded is int_oo, which int() refuses
            upper = int(upper) if upper is not None and upper.is_finite is True else None
        except (TypeError, ValueError, AttributeError, OverflowError):
            upper = None
        if upper is None or upper >= 2 ** 62:
            raise Unsupported(f"arange of the symbolic length {_size(n) if n is not None else '?'} "
                              "without an upper bound: give its torch.export.Dim a max")
        dt = self.out_dtype
        if dt == "bf16":
            arr = torch.arange(start, start + upper * step, step, dtype=torch.bfloat16)
        else:
            arr = np.arange(start, start + upper * step, step, dtype=KILN_TO_NUMPY[dt])
        full = self._value(self.b.add_const(arr, "", self.kiln_device))
        return self.crop(full, 0, 0, self.out_shape[0])

    def result_type(self, a, b):
        """torch's type promotion for a binary op's operands (tensors or Python scalars)."""
        ta = a.val if isinstance(a, V) and a.val is not None else (
            torch.empty((), dtype=KILN_TO_TORCH[a.dtype]) if isinstance(a, V) else a)
        tb = b.val if isinstance(b, V) and b.val is not None else (
            torch.empty((), dtype=KILN_TO_TORCH[b.dtype]) if isinstance(b, V) else b)
        if not isinstance(ta, torch.Tensor) and not isinstance(tb, torch.Tensor):
            raise Unsupported("a comparison of two Python scalars")
        return self.kdtype(torch.result_type(ta, tb))

    def transposed_source(self, v):
        """w when v = transpose(w) of a 2-d w (the FX pattern of nn.Linear: addmm(b, x, w.t()))."""
        o = v.origin
        if o and len(v.shape) == 2 and o[1] and o[1][0] is not None and len(o[1][0].shape) == 2:
            if o[0] == "transpose" or (o[0] == "permute" and list(o[2].get("dims", [])) == [1, 0]):
                return o[1][0]
        return None

    def same_device(self, device):
        return torch.device(device) == self.device or (
            torch.device(device).type == self.device.type == "cpu")


# ---- converting a graph --------------------------------------------------------------------------
def _map_args(args, env):
    if isinstance(args, torch.fx.Node):
        return env[args]
    if isinstance(args, (list, tuple)):
        return type(args)(_map_args(a, env) for a in args)
    if isinstance(args, dict):
        return {k: _map_args(v, env) for k, v in args.items()}
    if isinstance(args, torch.dtype) or isinstance(args, torch.device) or isinstance(
            args, torch.layout) or isinstance(args, torch.memory_format):
        return args
    return args


def convert_node(cx, node, env):
    """Appends the Kiln nodes for one FX call_function node; returns its value(s)."""
    if _is_size_node(node):  # Note [Symbolic sizes]
        args = _map_args(node.args, env)
        if node.target in _SIZE_OPS:
            return _size_op(node.target, *args)
        if node.target == torch.ops.aten.sym_size.int:
            x, dim = args
            return x.shape[dim]
        return None  # an assertion on sizes: Kiln checks sizes when inputs bind
    if node.target is operator.getitem:
        src, index = node.args
        produced = env[src]
        if not isinstance(produced, tuple) or produced[index] is None:
            raise Unsupported(f"output {index} of '{src.name}' is not computed by Kiln")
        return produced[index]
    name = aten_name(node.target)
    entry = ATEN_TABLE.get(name) if name else None
    if entry is None:
        raise Unsupported(f"{name or node.target} has no entry in Kiln's ATen table")
    cx.begin(node, entry)
    args = _map_args(node.args, env)
    kwargs = _map_args(node.kwargs, env)
    try:
        out = entry.convert(cx, *args, **kwargs)
    except _kiln.KilnError as e:
        raise Unsupported(f"Kiln rejects it: {e}") from None
    _check_types(cx, node, out)
    return out


def _check_types(cx, node, out):
    """Kiln's inferred output types must be torch's (dtype, shape)."""
    val = _val(node)
    outs = out if isinstance(out, tuple) else (out,)
    vals = val if isinstance(val, (tuple, list)) else (val,)
    for o, v in zip(outs, vals):
        if o is None or not isinstance(v, torch.Tensor):
            continue
        want_shape = tuple(_size(s) for s in v.shape)
        want_dtype = cx.kdtype(v.dtype)
        same = len(o.shape) == len(want_shape) and all(
            _same_size(a, b, t) for a, b, t in zip(o.shape, want_shape, v.shape))
        if not same or o.dtype != want_dtype:
            raise Unsupported(f"internal mismatch: Kiln computes {o.dtype}{list(o.shape)}, torch "
                              f"{want_dtype}{list(want_shape)} (a Kiln converter bug; please report)")


def _tensor_inputs(node):
    for a in node.all_input_nodes:
        yield a


def node_support(node, device):
    """None when Kiln takes this node on `device`, else the reason it stays in torch."""
    if node.op != "call_function":
        return "not an op call"
    if node.target is operator.getitem:
        return None  # follows its producer (see is_node_supported in partition())
    if _is_size_node(node):
        return None  # size arithmetic: no Kiln node (Note [Symbolic sizes])
    name = aten_name(node.target)
    if name is None or name not in ATEN_TABLE:
        return f"{name or node.target} has no entry in Kiln's ATen table"
    b = _kiln.GraphBuilder("probe")
    cx = ConvertContext(b, device)
    env = {}
    try:
        for a in _tensor_inputs(node):
            v = _val(a)
            if isinstance(v, torch.Tensor):
                if v.device != device and not (v.device.type == device.type == "cpu"):
                    return f"input '{a.name}' is on {v.device}, the graph runs on {device}"
                dt = kiln_dtype(v.dtype, f"input '{a.name}'")
                dims = [_size(s) for s in v.shape]
                vid = b.add_input(a.name, dt, dims, cx.kiln_device)
                env[a] = V(vid, dt, dims, None, v)
            elif isinstance(v, (int, torch.SymInt)):
                env[a] = _size(v)
            elif isinstance(v, (tuple, list)) and a.target is not operator.getitem:
                return f"input '{a.name}' is a tuple"
            else:
                return f"input '{a.name}' is not a tensor ({type(v).__name__})"
        out = _val(node)
        for o in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(o, torch.Tensor):
                kiln_dtype(o.dtype, "output")
        convert_node(cx, node, env)
    except Unsupported as e:
        return str(e)
    if device.type == "cuda":
        reg = registry()
        missing = sorted({op for op in cx.emitted if not reg[op]["cuda_kernel"]})
        if missing:
            return f"Kiln has no CUDA kernel for {', '.join(missing)} yet"
    return None


class Frozen:
    """A graph input frozen into the Kiln graph as a parameter (its real tensor)."""

    __slots__ = ("index", "name", "tensor")

    def __init__(self, index, name, tensor):
        self.index, self.name, self.tensor = index, name, tensor


def build_graph(gm, args, frozen_indices, device, names=None, graph_name="main"):
    """A GraphBuilder for `gm` (every node supported). Placeholders at `frozen_indices` become
    parameters with the data of `args[i]` (zero-copy views); the rest graph inputs.

    The graph keeps torch's dtypes: the `dtype` option is Kiln's autocast, applied by the
    compiler (CompiledGraph.compile's precision), not here.

    Returns (builder, input_args, frozen): input_args[i] is the argument index of Kiln input i;
    frozen lists Frozen records."""
    b = _kiln.GraphBuilder(graph_name)
    cx = ConvertContext(b, device)
    env = {}
    input_args, frozen = [], []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    taken = set()  # value names used by inputs and params
    io_ids = set()
    for i, ph in enumerate(placeholders):
        a = args[i]
        name = (names[i] if names and i < len(names) else None) or ph.name
        if not isinstance(a, torch.Tensor):
            env[ph] = a  # a Python scalar (a specialized SymInt): converters see the int
            continue
        dt = kiln_dtype(a.dtype, f"input '{name}'")
        meta = _val(ph)
        # The sizes torch traced with: symbolic where the graph was exported with dynamic shapes.
        dims = [_size(s) for s in meta.shape] if isinstance(meta, torch.Tensor) else list(a.shape)
        if i in frozen_indices:
            t = a.detach()
            pname = name
            k = 1
            while pname in taken:
                pname, k = f"{name}_{k}", k + 1
            taken.add(pname)
            vid = b.add_param(pname, t)
            frozen.append(Frozen(i, name, a))
        else:
            vid = b.add_input(name, dt, dims, cx.kiln_device)
            taken.add(b.value_name(vid))
            input_args.append(i)
        env[ph] = V(vid, dt, dims if i not in frozen_indices else a.shape, None, meta)
        io_ids.add(vid)
    for node in gm.graph.nodes:
        if node.op == "call_function":
            env[node] = convert_node(cx, node, env)
            if isinstance(env[node], V):
                env[node].val = _val(node)
        elif node.op == "output":
            outs = node.args[0]
            outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
            ids = []
            cx.node = node
            cx.entry = None
            for o in outs:
                v = env[o] if isinstance(o, torch.fx.Node) else None
                if not isinstance(v, V):
                    raise Unsupported(f"graph output {o} is not a tensor Kiln computes")
                # An output that is an input or parameter gets its own copy (never an alias).
                if v.id in io_ids:
                    v = cx.op("copy", [v])
                ids.append(v.id)
            b.set_outputs(ids)
            return b, input_args, frozen
    raise AssertionError("graph without output")


# ---- partitioning --------------------------------------------------------------------------------
class Fallback:
    """A node left to torch and why (for kiln.explain and the warning)."""

    __slots__ = ("node", "op", "reason")

    def __init__(self, node, op, reason):
        self.node, self.op, self.reason = node, op, reason

    def __repr__(self):
        return f"{self.op} ('{self.node}'): {self.reason}"


def plan(gm, device):
    """Support of every op node: (supported node set, [Fallback])."""
    supported, fallbacks = set(), []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            continue
        reason = node_support(node, device)
        if reason is None:
            supported.add(node)
        else:
            fallbacks.append(Fallback(node.name, aten_name(node.target) or str(node.target), reason))
    # getitem follows its producer, when Kiln computes that output.
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is operator.getitem:
            src, index = node.args
            if src in supported:
                if _getitem_computed(src, index, device):
                    supported.add(node)
                else:
                    fallbacks.append(Fallback(node.name, f"{aten_name(src.target)}[{index}]",
                                              f"output {index} of '{src.name}' is not computed by Kiln"))
    return supported, fallbacks


def _getitem_computed(src, index, device):
    b = _kiln.GraphBuilder("probe")
    cx = ConvertContext(b, device)
    env = {}
    for a in src.all_input_nodes:
        v = _val(a)
        dt = kiln_dtype(v.dtype, a.name)
        dims = [_size(s) for s in v.shape]  # never int(): it would specialize torch's symbol
        env[a] = V(b.add_input(a.name, dt, dims, cx.kiln_device), dt, dims, None, v)
    out = convert_node(cx, src, env)
    return isinstance(out, tuple) and index < len(out) and out[index] is not None


def partition(gm, supported):
    """Fuses the supported nodes of `gm` into submodules fused_0, fused_1, ... (in place);
    returns the names of the submodules that Kiln should run and the partitions left to torch
    because they only move metadata."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase

    class _Support(OperatorSupportBase):
        def is_node_supported(self, submodules, node):
            return node in supported

    partitioner = CapabilityBasedPartitioner(gm, _Support(), allows_single_node_partition=True)
    parts = partitioner.propose_partitions()
    kept, views_only = [], []
    for p in parts:
        nodes = list(p.nodes)
        if all(_is_view_node(n) for n in nodes):
            views_only.append(sorted(n.name for n in nodes))
        else:
            kept.append(p)
    fused = partitioner.fuse_partitions(kept)
    names = [n for n, _ in fused.named_children() if n.startswith("fused_")]
    return fused, names, views_only


def _is_view_node(n):
    if n.target is operator.getitem:
        return True
    entry = ATEN_TABLE.get(aten_name(n.target) or "")
    return entry is not None and all(op in VIEW_OPS for op in entry.emits)


def warn_once(key, message):
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(message, KilnFallbackWarning, stacklevel=3)


_WARNED = set()


class KilnFallbackWarning(UserWarning):
    """Part of a model runs in torch instead of Kiln (kiln.explain tells which and why)."""
