"""What the Kiln backend did: per Dynamo graph, its ATen graphs, partitions, fallbacks,
compiles and recompiles; ``kiln.explain(model, *args)`` adds Dynamo's graph breaks."""
import threading

_LOCK = threading.Lock()
GRAPHS = []  # GraphRecord, in compile order


class PartitionRecord:
    def __init__(self, label):
        self.label = label
        self.kiln_ops = []
        self.backend = ""
        self.summary = ""
        self.num_params = 0
        self.num_inputs = 0
        self.compiles = 0
        self.compile_s = 0.0
        self.cache_hit = False
        self.recompiles = []  # reasons
        self.failure = None
        self.ir = ""


class AtenGraphRecord:
    """One ATen graph of a Dynamo graph (one per shape specialization)."""

    def __init__(self, label, num_ops, fallbacks):
        self.label = label
        self.num_ops = num_ops
        self.fallbacks = fallbacks  # lowering.Fallback
        self.partitions = {}  # label -> PartitionRecord
        self.views_only = []

    # Called by KilnGraph (kiln/compiled.py).
    def _part(self, kg):
        p = self.partitions.get(kg.label)
        if p is None:
            p = self.partitions[kg.label] = PartitionRecord(kg.label)
        return p

    def on_compile(self, kg, builder, seconds):
        p = self._part(kg)
        p.kiln_ops = builder.node_ops()
        p.backend = kg.compiled.backend
        p.summary = kg.compiled.summary
        p.num_params = len(kg.frozen)
        p.num_inputs = len(builder.input_specs())
        p.compiles += 1
        p.compile_s += seconds
        p.cache_hit = kg.compiled.cache_hit
        p.ir = builder.ir()

    def on_recompile(self, kg, reason):
        self._part(kg).recompiles.append(reason)

    def on_failure(self, kg, err):
        from .lowering import warn_once

        self._part(kg).failure = str(err)
        warn_once(("failure", kg.label, str(err)), f"kiln: {kg.label} runs in torch: Kiln failed: {err}")


class GraphRecord:
    """One graph Dynamo handed to the backend."""

    def __init__(self, index, gm, opts):
        self.index = index
        self.num_fx_nodes = sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
        self.mode = opts.mode
        self.autograd = False
        self.symbolic = False
        self.specialization_overflow = 0
        self.aten = []

    def add_aten_graph(self, aten_gm, num_ops, fallbacks, label):
        r = AtenGraphRecord(label or "static shapes", num_ops, fallbacks)
        self.aten.append(r)
        return r


def new_graph(gm, opts):
    with _LOCK:
        r = GraphRecord(len(GRAPHS), gm, opts)
        GRAPHS.append(r)
        return r


def reset():
    import torch

    torch._dynamo.reset()
    with _LOCK:
        GRAPHS.clear()


class Explanation:
    """kiln.explain's result: ``str()`` is the report; the fields are for programs.

    graph_count, graph_break_count  Dynamo's
    breaks       [(reason, "file:line")] of every graph break
    graphs       [GraphRecord] the Kiln backend compiled
    fallbacks    [(op, node, reason)] every ATen op that ran in torch
    """

    def __init__(self, dynamo_explain, graphs, outputs):
        self.graph_count = dynamo_explain.graph_count
        self.graph_break_count = dynamo_explain.graph_break_count
        self.breaks = []
        for br in dynamo_explain.break_reasons:
            stack = getattr(br, "user_stack", None) or []
            where = f"{stack[-1].filename}:{stack[-1].lineno}" if stack else "?"
            self.breaks.append((str(br.reason).strip(), where))
        self.graphs = graphs
        self.outputs = outputs
        self.fallbacks = [(f.op, f.node, f.reason) for g in graphs for a in g.aten for f in a.fallbacks]

    def __str__(self):
        lines = [f"kiln.explain: {self.graph_count} graph(s), {self.graph_break_count} graph break(s)"]
        for i, (reason, where) in enumerate(self.breaks):
            lines.append(f"  graph break {i}: {reason.splitlines()[0]} (at {where})")
        for k, g in enumerate(self.graphs):
            lines.append(f"graph {k}: {g.num_fx_nodes} FX nodes, mode {g.mode}")
            if g.autograd:
                lines.append("  runs in torch: autograd needed (grad mode on, inputs require grad)")
            for a in g.aten:
                n_torch = len(a.fallbacks)
                lines.append(f"  ATen graph ({a.label}): {a.num_ops} ops, {n_torch} in torch, "
                             f"{len(a.partitions)} Kiln partition(s)")
                for p in a.partitions.values():
                    ops = ", ".join(sorted(set(p.kiln_ops)))
                    lines.append(f"    Kiln {p.label} [{p.backend}]: {len(p.kiln_ops)} Kiln nodes "
                                 f"({ops}); {p.num_inputs} inputs, {p.num_params} frozen parameters; "
                                 f"compiled {p.compiles}x in {p.compile_s:.3f} s")
                    for r in p.recompiles:
                        lines.append(f"      recompiled: {r}")
                    if p.failure:
                        lines.append(f"      FAILED, runs in torch: {p.failure}")
                for f in a.fallbacks:
                    lines.append(f"    torch: {f.op} ('{f.node}'): {f.reason}")
                for v in a.views_only:
                    lines.append(f"    torch: {', '.join(v)}: only views, cheaper in torch")
        return "\n".join(lines)

    __repr__ = __str__


def explain(model, *args, options=None, **kwargs):
    """Runs ``model(*args, **kwargs)`` under torch.no_grad() through Dynamo's explain (graph
    breaks) and through ``torch.compile(model, backend="kiln", options=options)`` (partitions,
    fallbacks, recompiles); returns an Explanation (print it)."""
    import torch

    from .dynamo import backend

    torch._dynamo.reset()
    with torch.no_grad():
        dyn = torch._dynamo.explain(model)(*args, **kwargs)
        torch._dynamo.reset()
        with _LOCK:
            start = len(GRAPHS)
        compiled = torch.compile(model, backend=backend, options=options)
        out = compiled(*args, **kwargs)
    with _LOCK:
        graphs = GRAPHS[start:]
    return Explanation(dyn, graphs, out)
