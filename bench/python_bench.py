"""Python-frontend figures for docs/benchmarks.md ("Python frontend").

  PYTHONPATH=build/python ~/.cache/kiln/venv/bin/python bench/python_bench.py overhead
  PYTHONPATH=build/python ~/.cache/kiln/venv/bin/python bench/python_bench.py compile [MODEL...]

overhead: per-call cost of each layer over Kiln's C++ call, for mlp (batch 1) and resnet18
  (batch 1, 224x224), medians of interleaved rounds:
    cpp       CompiledGraph::run_into in C++ (bridge.cc), inputs and outputs bound once
    runner    kiln._kiln.Runner.__call__ from Python: guards, DLPack views, output tensors
    kiln      the KilnGraph callable aot_autograd calls (runner + the Python wrapper)
    compiled  the torch.compile'd module (Dynamo's guards + aot_autograd's wrapper + kiln)
    inductor  the same module through torch.compile's inductor, for scale
    eager     the module in torch eager, for scale
compile: the first call of torch.compile(model, backend=B) for B in kiln, inductor, each in a
  fresh process (imports excluded; Kiln's and inductor's on-disk caches warm, as on a
  developer's machine — run twice to see a cold cache), medians of 3 processes
  (KILN_BENCH_REPS=N for another count).
"""
import json
import os
import statistics
import subprocess
import sys
import time


def _model(name):
    import torch
    import torchvision

    torch.manual_seed(0)
    if name == "mlp":
        m = torch.nn.Sequential(torch.nn.Linear(10, 50), torch.nn.ReLU(), torch.nn.Linear(50, 1))
        return m.eval(), (torch.randn(1, 10),)
    if name == "bert":
        import transformers

        cfg = transformers.BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=256)
        ids = torch.randint(0, 1000, (1, 64))
        return transformers.BertModel(cfg).eval(), (ids, torch.ones_like(ids))
    return getattr(torchvision.models, name)(weights=None).eval(), (torch.randn(1, 3, 224, 224),)


def _median_us(fn, n):
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


def overhead(models=("mlp", "bert", "resnet18")):
    import torch

    import kiln
    from kiln import compiled as kc

    rows = []
    for name in models:
        kiln.reset()
        m, args = _model(name)
        captured = []
        orig = kc.KilnGraph.call

        def spy(self, a, orig=orig):
            captured.append((self, a))
            return orig(self, a)

        kc.KilnGraph.call = spy
        f = torch.compile(m, backend="kiln")
        fi = torch.compile(m, backend="inductor")
        with torch.no_grad():
            f(*args)
            fi(*args)
            kc.KilnGraph.call = orig
            kg, kargs = captured[0]
            outs = kg.runner(kargs)
            ins = [kargs[i] for i in range(len(kargs)) if i not in kg.static_indices]
            n = 2000 if name == "mlp" else 50
            res = {k: [] for k in ("cpp", "runner", "kiln", "compiled", "inductor", "eager")}
            for _ in range(5):  # interleaved rounds
                res["cpp"].append(kg.compiled.time_cpp_ns(ins, outs, n) / 1e3)
                res["runner"].append(_median_us(lambda: kg.runner(kargs), n))
                res["kiln"].append(_median_us(lambda: kg.call(kargs), n))
                res["compiled"].append(_median_us(lambda: f(*args), n))
                res["inductor"].append(_median_us(lambda: fi(*args), n))
                res["eager"].append(_median_us(lambda: m(*args), n))
        med = {k: statistics.median(v) for k, v in res.items()}
        rows.append((name, med, len(kg.frozen)))
        if name == "mlp":
            # The same tiny graph guarded by resnet18's 102 parameters and buffers: the
            # per-frozen-tensor guard cost, without resnet18's milliseconds of noise.
            r18 = _model("resnet18")[0]
            frozen = list(r18.parameters()) + list(r18.buffers())
            frozen = [t for t in frozen if t.dtype.is_floating_point]
            x = kargs[[i for i in range(len(kargs)) if i not in kg.static_indices][0]]
            params = [kargs[f.index] for f in kg.frozen]
            big_args = params + [x] + frozen
            np_ = len(params)
            runner = kiln._kiln.Runner(kg.compiled, [np_], [(i, t) for i, t in enumerate(params)] +
                                       [(np_ + 1 + i, t) for i, t in enumerate(frozen)])
            # kg.compiled's inputs are (x) with params frozen: reuse its graph as is.
            g = []
            c = []
            for _ in range(5):
                c.append(kg.compiled.time_cpp_ns([x], outs, 2000) / 1e3)
                g.append(_median_us(lambda: runner(big_args), 2000))
            rows.append((f"mlp+{len(frozen)}g", {"cpp": statistics.median(c), "runner": statistics.median(g),
                                                  "kiln": float("nan"), "compiled": float("nan"),
                                                  "inductor": float("nan"), "eager": float("nan")},
                         len(frozen) + np_))
    print(f"{'model':10} {'cpp us':>9} {'runner us':>10} {'kiln us':>9} {'compiled us':>12} "
          f"{'inductor us':>12} {'eager us':>9}  frozen  overhead (runner - cpp, kiln - cpp)")
    for name, r, nf in rows:
        print(f"{name:10} {r['cpp']:9.1f} {r['runner']:10.1f} {r['kiln']:9.1f} {r['compiled']:12.1f} "
              f"{r['inductor']:12.1f} {r['eager']:9.1f}  {nf:6d}  "
              f"{r['runner'] - r['cpp']:.1f} us, {r['kiln'] - r['cpp']:.1f} us")


_CHILD = r"""
import sys, time, json, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, {bench!r})
import torch
from python_bench import _model
m, args = _model({model!r})
backend = {backend!r}
if backend == "kiln":
    import kiln  # the import is excluded from the timing, like torch's
t = time.perf_counter()
with torch.no_grad():
    torch.compile(m, backend=backend)(*args)
print(json.dumps(time.perf_counter() - t))
"""


def compile_times(models=("mlp", "resnet18", "bert")):
    here = os.path.dirname(os.path.abspath(__file__))
    print(f"{'model':10} {'kiln s':>8} {'inductor s':>11}")
    for name in models:
        row = []
        for backend in ("kiln", "inductor"):
            ts = []
            for _ in range(int(os.environ.get("KILN_BENCH_REPS", "3"))):
                code = _CHILD.format(bench=here, model=name, backend=backend)
                r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
                if r.returncode:
                    raise SystemExit(f"{name}/{backend} failed:\n{r.stderr[-3000:]}")
                ts.append(json.loads(r.stdout.strip().splitlines()[-1]))
            row.append(statistics.median(ts))
        print(f"{name:10} {row[0]:8.2f} {row[1]:11.2f}", flush=True)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "overhead"
    rest = tuple(sys.argv[2:])
    if what == "overhead":
        overhead(*(rest and (rest,)))
    elif what == "compile":
        compile_times(*(rest and (rest,)))
    else:
        raise SystemExit(__doc__)
