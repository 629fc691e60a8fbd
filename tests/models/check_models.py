#!/usr/bin/env python3
"""Runs exported reference models through `kiln run` and compares every output with ONNX Runtime's.

    check_models.py --kiln PATH [--backend eager|compiled|package]... [--models-dir DIR]
                    [--json FILE]
                    [--export-only] MODEL...

For each MODEL (scripts/export_models.py's names; "all" for every one) the model is exported
first when its cached export is missing or stale (export_models.export), then, per backend,
`kiln run MODEL.onnx --input NAME=MODEL.in.NAME.npy ... --backend B --output DIR --json` runs and
each output DIR/OUTPUT.npy is compared with MODEL.ort.OUTPUT.npy. Backend `package` compiles the
model into a deployment package (`kiln compile MODEL.onnx -o M.kiln`) and runs that (`kiln run
M.kiln ...`): the package takes and names its inputs and outputs as the ONNX model does.

The rule (the same everywhere Kiln compares with ONNX Runtime on these models, docs/onnx.md):
same shape and dtype, and

    max|kiln - ort| <= TOL * max|ort|        TOL = 1e-4 (float32 outputs)

i.e. the largest error relative to the output's largest magnitude (an output that is all zeros
fails: the models are built so that none is). Integer and bool outputs must be equal. NaNs
anywhere fail.

Exit status: 0 when every (model, backend) matched; 1 otherwise (each failure says what and
where); 2 when the environment is broken (no venv / packages: run scripts/setup.sh).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOL = 1e-4

try:
    import numpy as np

    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import export_models  # noqa: E402
except ImportError as e:  # the venv is missing or incomplete
    print(f"check_models: cannot import the Python side ({e}); run scripts/setup.sh and pass "
          f"its venv's python (KILN_PYTHON=~/.cache/kiln/venv/bin/python)", file=sys.stderr)
    sys.exit(2)


def compare(got: np.ndarray, ref: np.ndarray) -> tuple[bool, dict]:
    """(ok, numbers) by the rule in the module docstring."""
    info = {"shape": list(ref.shape), "dtype": str(ref.dtype)}
    if got.shape != ref.shape or got.dtype != ref.dtype:
        info["error"] = f"got {got.dtype}{list(got.shape)}, ONNX Runtime {ref.dtype}{list(ref.shape)}"
        return False, info
    if ref.dtype.kind not in "fc":
        bad = int(np.count_nonzero(got != ref))
        info["mismatches"] = bad
        return bad == 0, info
    g, r = got.astype(np.float64), ref.astype(np.float64)
    if np.isnan(g).any() or np.isnan(r).any():
        info["error"] = "NaN in the output"
        return False, info
    if not g.size:
        info["error"] = "empty output"
        return False, info
    diff = float(np.max(np.abs(g - r)))
    scale = float(np.max(np.abs(r)))
    if scale == 0:
        info["error"] = "ONNX Runtime's output is all zeros: nothing is tested"
        return False, info
    info.update({"max_abs_diff": diff, "max_abs_ref": scale, "rel_diff": diff / scale,
                 "tolerance": TOL * scale})
    return diff <= TOL * scale, info


def run_step(cmd: list, result: dict, seconds_key: str):
    """Runs cmd, timing it into result[seconds_key]; None (and result["error"]) when it fails."""
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    result[seconds_key] = round(time.perf_counter() - t0, 3)
    if p.returncode != 0:
        result["error"] = f"`{' '.join(cmd)}` exited with {p.returncode}: " + \
            (p.stderr.strip() or p.stdout.strip())[-2000:]
        return None
    return p


def check(kiln: str, name: str, backend: str, models_dir: str | None) -> dict:
    files = export_models.model_files(name, models_dir)
    result = {"model": name, "backend": backend, "ok": False, "outputs": {}}
    with tempfile.TemporaryDirectory(prefix=f"kiln_check_{name}_") as out:
        if backend == "package":
            # `kiln compile MODEL.onnx -o M.kiln`, then the package run by the runtime, its
            # inputs and outputs by the model's names (docs/package.md).
            pkg = os.path.join(out, name + ".kiln")
            if run_step([kiln, "compile", files["onnx"], "-o", pkg], result, "compile_s") is None:
                return result
            cmd = [kiln, "run", pkg, "--json"]
        else:
            cmd = [kiln, "run", files["onnx"], "--backend", backend, "--json"]
        for inp, path in files["inputs"].items():
            cmd += ["--input", f"{inp}={path}"]
        cmd += ["--output", out]
        p = run_step(cmd, result, "kiln_s")
        if p is None:
            return result
        try:
            report = json.loads(p.stdout)
        except ValueError:
            result["error"] = "kiln run --json printed no JSON: " + p.stdout[-500:]
            return result
        for k in ("backend", "compile_backend", "symbolic_inputs", "specialized_shapes",
                  "specialized_because", "import_s", "eager_s", "compiled_first_call_s",
                  "compiled_s", "nodes"):
            if k in report:
                result[k] = report[k]
        ok = True
        for o, ref_path in files["ort"].items():
            got_path = os.path.join(out, os.path.basename(ref_path).split(".ort.", 1)[1])
            if not os.path.isfile(got_path):
                result["outputs"][o] = {"error": f"kiln wrote no {os.path.basename(got_path)}"}
                ok = False
                continue
            good, info = compare(np.load(got_path), np.load(ref_path))
            result["outputs"][o] = info
            ok &= good
        result["ok"] = ok
    return result


def describe(r: dict) -> str:
    head = f"{r['model']:20s} {r['backend']:9s}"
    if "error" in r:
        return f"{head} FAILED: {r['error']}"
    parts = []
    for o, info in r["outputs"].items():
        if "error" in info:
            parts.append(f"{o}: {info['error']}")
        elif "rel_diff" in info:
            parts.append(f"{o}: max|diff| {info['max_abs_diff']:.3g} (max|ref| "
                         f"{info['max_abs_ref']:.3g}, rel {info['rel_diff']:.2e})")
        else:
            parts.append(f"{o}: {info['mismatches']} mismatches")
    shapes = "symbolic batch" if r.get("symbolic_inputs") else (
        "specialized shapes" if r.get("specialized_shapes") else "static shapes")
    backend = r.get("backend", r["backend"])
    return f"{head} {'ok    ' if r['ok'] else 'FAILED'} {'; '.join(parts)}  [{backend}, {shapes}, " \
           f"{r['kiln_s']:.1f} s]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help=f"models, or 'all' ({' '.join(export_models.MODELS)})")
    ap.add_argument("--kiln", help="the kiln binary")
    ap.add_argument("--backend", action="append", choices=["eager", "compiled", "package"],
                    help="repeatable (default: eager and compiled)")
    ap.add_argument("--models-dir", default=None, help="export cache (default: export_models')")
    ap.add_argument("--json", default=None, help="write every result to this file")
    ap.add_argument("--export-only", action="store_true", help="export (cached) and stop")
    a = ap.parse_args(argv)
    names = export_models.MODELS if a.models == ["all"] else a.models
    for n in names:
        if n not in export_models.MODELS:
            ap.error(f"unknown model '{n}' (available: {', '.join(export_models.MODELS)})")
    for n in names:
        t0 = time.perf_counter()
        fresh = not export_models.is_current(n, a.models_dir)
        export_models.export(n, a.models_dir)
        if fresh:
            print(f"exported {n} in {time.perf_counter() - t0:.1f} s", flush=True)
    if a.export_only:
        return 0
    if not a.kiln or not os.access(a.kiln, os.X_OK):
        ap.error(f"--kiln must name the kiln binary, got {a.kiln!r}")
    results, failed = [], 0
    for n in names:
        for b in a.backend or ["eager", "compiled"]:
            r = check(a.kiln, n, b, a.models_dir)
            results.append(r)
            failed += not r["ok"]
            print(describe(r), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
