"""bench/model_set.py and compare.py --set: the set's definitions, a few cheap models built, run
and exported, and the summary arithmetic. Fast (well under a minute on 2 cores): the whole set is
never exported here (bench/compare.py --set broad does that; docs/benchmarks.md).

Run by CTest as `bench.model_set` (tests/CMakeLists.txt) with the venv's Python, or directly:
~/.cache/kiln/venv/bin/python -m pytest -q tests/bench/test_model_set.py
"""
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import model_set  # noqa: E402

em = model_set.register()
import compare  # noqa: E402  (bench/compare.py: the summary functions)

# Issue #17's list: each family must have a member in the broad set.
REQUIRED = {
    "classification": ["resnet", "resnext", "wide_resnet", "mobilenet_v2", "mobilenet_v3",
                       "efficientnet", "regnet", "shufflenet", "squeezenet", "mnasnet",
                       "densenet", "googlenet", "inception", "convnext", "vit_", "swin",
                       "maxvit"],
    "segmentation": ["fcn", "deeplab"],
    "detection": ["ssdlite"],
    "transformer": ["bert_base", "distilbert", "gpt2"],
    "driving": ["pointpillars", "msda", "deform", "gru", "lstm", "bev_fusion"],
}
CHEAP = ["gru_trajectory", "lstm_trajectory", "bev_fusion", "deform_sampling", "msda_bev",
         "pillar_scatter", "squeezenet1_1"]


def test_broad_set_is_broad_and_well_formed():
    names = model_set.set_models("broad")
    assert len(names) >= 40
    assert len(set(names)) == len(names)
    for n in names:
        e = model_set.entry(n)
        assert e.group and e.note, n
        if e.zoo:
            assert n in em.MODELS, f"{n}: a zoo entry must name a zoo model"
        else:
            assert callable(e.build.fn) and callable(e.inputs.fn), n
            assert e.ins and e.outs and len(set(e.ins)) == len(e.ins), n
        assert em.input_names(n) and em.output_names(n), n
    groups = {}
    for n in names:
        groups.setdefault(model_set.entry(n).group, []).append(n)
    assert len(groups["classification"]) >= 20
    for group, families in REQUIRED.items():
        for f in families:
            assert any(f in n for n in groups.get(group, [])), f"no {f} model in group {group}"
    for s in model_set.SETS.values():
        assert all(n in model_set._BY_NAME for n in s)


def test_registration_is_idempotent_and_keeps_zoo_names():
    before = dict(em._REGISTERED)
    model_set.register(em)
    assert em._REGISTERED.keys() == before.keys()
    with pytest.raises(ValueError, match="zoo model"):
        em.register_model("resnet18", model_set.entry("bev_fusion").build, None, ["x"], ["y"],
                          model_set.__file__)
    # The stamp of a registered model covers its definition file and its settings.
    assert em.stamp("bev_fusion") != em.stamp("gru_trajectory")
    assert em.stamp("bev_fusion") != em.stamp()
    with pytest.raises(ValueError, match="unknown set"):
        model_set.set_models("nope")


@pytest.mark.parametrize("name", CHEAP)
def test_cheap_models_build_and_run_in_torch(name):
    import torch

    module, inputs = em.build_model(name)
    assert len(inputs) == len(em.input_names(name))
    with torch.no_grad():
        out = module(*inputs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    assert len(outs) == len(em.output_names(name))
    for o in outs:
        assert torch.isfinite(o).all(), name
    # Fixed seeds: the same weights and inputs twice.
    module2, inputs2 = em.build_model(name)
    for a, b in zip(inputs, inputs2):
        assert torch.equal(a, b)
    for (k, p), (_, q) in zip(module.state_dict().items(), module2.state_dict().items()):
        assert torch.equal(p, q), f"{name}: {k} differs between two builds"


def test_cheap_models_export_and_cache(tmp_path):
    out = str(tmp_path)
    for name in ("bev_fusion", "pillar_scatter"):
        path = em.export(name, out_dir=out)
        assert os.path.isfile(path) and em.is_current(name, out)
        info = em.stamp_info(name, out)
        assert info["exporter"] == "dynamo" and info["dynamic_batch"] is False
        scale = max(o["max_abs"] for o in info["outputs"].values())
        assert max(info["torch_vs_ort_max_abs_diff"].values()) <= 1e-4 * scale
        mtime = os.path.getmtime(path)
        assert em.export(name, out_dir=out) == path and os.path.getmtime(path) == mtime
    import onnx
    ops = {n.op_type for n in onnx.load(os.path.join(out, "pillar_scatter.onnx")).graph.node}
    assert "ScatterElements" in ops, ops


def test_a_failed_export_is_recorded_and_reported(tmp_path):
    import torch

    class Unexportable(torch.nn.Module):
        def forward(self, x):
            if torch.compiler.is_compiling() or torch.jit.is_tracing():
                raise RuntimeError("this model refuses to be traced")
            return x + 1

    em.register_model("test_unexportable", Unexportable,
                      lambda gen, batch: (torch.randn(batch, 4, generator=gen),), ["x"], ["y"],
                      __file__, dynamic_batch=False)
    try:
        with pytest.raises(RuntimeError, match="every exporter failed"):
            em.export("test_unexportable", out_dir=str(tmp_path))
        marker = tmp_path / "test_unexportable.failed.json"
        assert json.loads(marker.read_text())["stamp"] == em.stamp("test_unexportable")
        with pytest.raises(RuntimeError, match="recorded in"):
            em.export("test_unexportable", out_dir=str(tmp_path))
    finally:
        em._REGISTERED.pop("test_unexportable", None)


def _report(threads, models):
    """A compare.json-like report: models = {name: {system: p50 or (status, error)}}."""
    out = []
    for name, systems in models.items():
        recs = {}
        for s, v in systems.items():
            if isinstance(v, tuple):
                recs[s] = {"status": v[0], "error": v[1]}
            else:
                recs[s] = {"status": "ok", "first_call_s": 1.0,
                           "latency": {"p50_ms": v, "p99_ms": 1.5 * v}}
        out.append({"model": name, "group": "g", "systems": recs})
    return {"settings": {"set": "broad", "threads": threads,
                         "systems": ["kiln-compiled", "kiln-compiled-max-autotune", "ort"]},
            "models": out}


def test_summary_ratios_geomean_and_failures():
    rep = _report(2, {
        "a": {"kiln-compiled": 10.0, "kiln-compiled-max-autotune": 5.0, "ort": 20.0},
        "b": {"kiln-compiled": 10.0, "kiln-compiled-max-autotune": ("skipped", "not in list"),
              "ort": 5.0},
        "c": {"kiln-compiled": ("error", "kiln: unsupported op GridSample"), "ort": 1.0,
              "kiln-compiled-max-autotune": ("skipped", "")},
    })
    rows = {r["model"]: r for r in compare.set_rows(rep)}
    assert rows["a"]["ratio"] == 2.0 and rows["a"]["ma_ratio"] == 4.0
    assert rows["b"]["ratio"] == 0.5 and rows["b"]["ma_ratio"] is None
    assert rows["c"]["ratio"] is None
    assert rows["c"]["failures"] == [("kiln-compiled", "error", "kiln: unsupported op GridSample")]
    g, n = compare.geomean(r["ratio"] for r in rows.values())
    assert n == 2 and math.isclose(g, 1.0)
    md = compare.set_markdown(rep)
    assert "**1.00** over 2 of 3 models" in md
    assert "Max-autotune: **4.00** over the 1 models" in md
    assert "c: kiln-compiled error: kiln: unsupported op GridSample" in md
    assert "b 0.50" in md  # named among the models where Kiln is > 10% behind
    region = compare.set_docs_region([dict(rep, host={"cpu_model": "x", "cores": 2, "isa": [],
                                                      "mem_total_gib": 1, "os": "y",
                                                      "python": "3"},
                                           versions={}, date="d", command="c",
                                           load_avg_start=[0], load_avg_end=[0],
                                           settings=dict(rep["settings"], iters=9, seconds=None,
                                                         rounds=3, warmup=1, batch=1,
                                                         device="cpu"))])
    assert region.startswith("<!-- compare-set:broad:begin -->")
    assert region.rstrip().endswith("<!-- compare-set:broad:end -->")


def test_compare_rejects_unknown_sets_and_models_outside_the_set():
    py = sys.executable
    script = os.path.join(ROOT, "bench", "compare.py")
    r = subprocess.run([py, script, "--set", "nope", "--kiln", "/nonexistent/kiln"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown set 'nope'" in r.stderr
    r = subprocess.run([py, script, "--set", "smoke", "--models", "resnet50",
                        "--kiln", "/nonexistent/kiln"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "not in set 'smoke'" in r.stderr
