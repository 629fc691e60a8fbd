#!/usr/bin/env python3
"""The exported models on CUDA (issue #12): each model of scripts/export_models.py exported on
the machine this runs on (the GPU machine has torch, torchvision and transformers), then

    kiln run MODEL.onnx --device cuda --backend both --input NAME=FILE.npy ... --output DIR

which compiles the model for CUDA and runs it there, runs the CPU eager interpreter on the same
inputs, and reports max|compiled - eager| per output. A model passes when every output is
within 1e-4 x max|CPU eager| of the CPU eager run (the issue's bound) and the CPU eager run is
within 1e-3 x max|ORT| of ONNX Runtime's outputs saved at export (the CPU path's own bound in
tests/onnx). NaN on one side only fails. Then the same model compiled in bfloat16 and float16
(`--dtype`, Kiln's autocast: matmul, convolution and attention in the low dtype with float32
accumulation, norms and softmax in float32) against the same CPU eager float32 run: within
LOW_BOUNDS x max|CPU eager|. The bounds: one rounding of the low dtype is 2^-9 (bf16) and 2^-12
(f16) relative; a model rounds every activation and weight once per layer and the errors of
independent roundings add up roughly as a random walk over the ~50-200 rounded steps of these
models, about 10-15 units at the output: 5e-2 for bf16 (~13 x 2^-8), 1e-2 for f16 (~20 x
2^-11). The measured values are reported whatever they are. And the model compiled in
reduce-overhead (a CUDA-graph replay) must write outputs bitwise equal to default's (the same
kernels in the same order), and so must the model's CUDA package (issue #14: `kiln compile
MODEL.onnx --device cuda --mode reduce-overhead -o M.kiln`, then `kiln run M.kiln`, its inputs
and outputs by the model's names). Prints one line per model and a JSON summary.
--package-only checks the package against the compiled run and nothing else.

    python3 scripts/cuda_onnx_models.py --kiln ./kiln --out /tmp/models [--json FILE]
                                        [--package-only] [names...]
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
sys.path.insert(0, HERE)
import export_models as em  # noqa: E402

import numpy as np  # noqa: E402

CUDA_BOUND = 1e-4  # x max|CPU eager|, per output
LOW_BOUNDS = {"bf16": 5e-2, "f16": 1e-2}  # x max|CPU eager| (module docstring)
ORT_BOUND = 1e-3   # x max|ORT|, per output (CPU eager vs ONNX Runtime)


def check_package(kiln, files, cmd, tmp, timeout, r):
    """The CUDA package of the model against the in-process compiled reduce-overhead run: the
    same kernels and library choices, so the outputs must be bitwise equal."""
    inputs = cmd[cmd.index("--json") + 1:cmd.index("--output")]
    outs = {}
    pkg = os.path.join(tmp, "model.kiln")
    steps = {
        "compiled": cmd[:cmd.index("--backend")] + ["--backend", "compiled", "--mode",
                                                     "reduce-overhead", "--json"] + inputs,
        "package": [kiln, "run", pkg, "--json"] + inputs,
    }
    t0 = time.perf_counter()
    p = subprocess.run([kiln, "compile", files["onnx"], "--device", "cuda", "--mode",
                        "reduce-overhead", "-o", pkg], capture_output=True, text=True,
                       timeout=timeout)
    r["package_compile_s"] = round(time.perf_counter() - t0, 2)
    if p.returncode != 0:
        r["package_bitwise"] = "compile failed: " + (p.stderr or p.stdout).strip()[-500:]
        return False
    for step, c in steps.items():
        d = os.path.join(tmp, "pkg-" + step)
        os.makedirs(d, exist_ok=True)
        p = subprocess.run(c + ["--output", d], capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            r["package_bitwise"] = f"{step} failed: " + (p.stderr or p.stdout).strip()[-500:]
            return False
        outs[step] = {f: open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d))}
    r["package_outputs"] = sorted(outs["package"])
    r["package_bitwise"] = bool(outs["compiled"]) and outs["compiled"] == outs["package"]
    return r["package_bitwise"] is True


def check(kiln: str, name: str, out_dir: str, timeout: int, package_only: bool = False) -> dict:
    r = {"model": name}
    t0 = time.perf_counter()
    try:
        em.export(name, out_dir)
    except Exception as e:  # noqa: BLE001 - reported, never dropped
        r.update(ok=False, error=f"export failed: {type(e).__name__}: {e}")
        return r
    r["export_s"] = round(time.perf_counter() - t0, 1)
    files = em.model_files(name, out_dir)
    cmd = [kiln, "run", files["onnx"], "--device", "cuda", "--backend", "both", "--json"]
    for i, path in files["inputs"].items():
        cmd += ["--input", f"{i}={path}"]
    with tempfile.TemporaryDirectory() as tmp:
        cmd += ["--output", tmp]
        if package_only:
            r["ok"] = check_package(kiln, files, cmd, tmp, timeout, r)
            return r
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            r.update(ok=False, error=f"kiln run timed out after {timeout} s")
            return r
        if p.returncode != 0:
            r.update(ok=False, error=(p.stderr or p.stdout).strip()[-2000:])
            return r
        j = json.loads(p.stdout)
        r["compiled_first_call_s"] = j.get("compiled_first_call_s")
        r["compiled_s"] = j.get("compiled_s")
        r["outputs"] = []
        ok = True
        for o, ort_path in zip(j["outputs"], files["ort"].values()):
            diff, scale = o["max_abs_diff_compiled_vs_eager"], o["max_abs_eager"]
            ort = np.load(ort_path).astype(np.float64)
            eager_path = os.path.join(tmp, "".join(c if c.isalnum() or c in "_-." else "_"
                                                   for c in o["name"]) + ".npy")
            eager = np.load(eager_path).astype(np.float64)
            nan_mismatch = bool((np.isnan(eager) != np.isnan(ort)).any()) if eager.shape == ort.shape else True
            ort_diff = float(np.nanmax(np.abs(eager - ort))) if eager.shape == ort.shape and eager.size else 0.0
            ort_scale = float(np.nanmax(np.abs(ort))) if ort.size else 0.0
            out_ok = (diff == diff and diff <= CUDA_BOUND * scale and not nan_mismatch
                      and ort_diff <= ORT_BOUND * ort_scale)
            ok &= out_ok
            r["outputs"].append({"name": o["name"], "max_abs_diff_cuda_vs_cpu": diff,
                                 "max_abs_cpu": scale, "rel": diff / scale if scale else diff,
                                 "max_abs_diff_cpu_vs_ort": ort_diff, "ok": out_ok})
        # reduce-overhead (CUDA-graph replay) against default: the same kernels in the same
        # order, so the outputs must be bitwise equal.
        r["reduce_overhead_bitwise"] = None
        outs = {}
        for mode in ("default", "reduce-overhead"):
            d = os.path.join(tmp, mode)
            os.makedirs(d, exist_ok=True)
            c = cmd[:cmd.index("--backend")] + ["--backend", "compiled", "--mode", mode] + \
                [a for a in cmd[cmd.index("--backend") + 2:cmd.index("--output")]] + ["--output", d]
            p = subprocess.run(c, capture_output=True, text=True, timeout=timeout)
            if p.returncode != 0:
                r["reduce_overhead_bitwise"] = f"{mode} failed: " + (p.stderr or p.stdout).strip()[-500:]
                break
            outs[mode] = {f: open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d))}
        if len(outs) == 2:
            r["reduce_overhead_bitwise"] = bool(outs["default"]) and outs["default"] == outs["reduce-overhead"]
        ok &= r["reduce_overhead_bitwise"] is True
        ok &= check_package(kiln, files, cmd, tmp, timeout, r)
        # The low-precision runs against the same CPU eager float32 run.
        r["low"] = {}
        for dt, bound in LOW_BOUNDS.items():
            try:
                p = subprocess.run(cmd[:cmd.index("--output")] + ["--dtype", dt], capture_output=True,
                                   text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                r["low"][dt] = {"ok": False, "error": f"timed out after {timeout} s"}
                ok = False
                continue
            if p.returncode != 0:
                r["low"][dt] = {"ok": False, "error": (p.stderr or p.stdout).strip()[-1000:]}
                ok = False
                continue
            jl = json.loads(p.stdout)
            worst = 0.0
            low_ok = True
            for o in jl["outputs"]:
                diff, scale = o["max_abs_diff_compiled_vs_eager"], o["max_abs_eager"]
                rel = diff / scale if scale else diff
                low_ok &= diff == diff and scale > 0 and rel <= bound
                worst = max(worst, rel if rel == rel else float("inf"))
            r["low"][dt] = {"ok": low_ok, "worst_rel": worst, "bound": bound,
                            "first_call_s": jl.get("compiled_first_call_s")}
            ok &= low_ok
        r["ok"] = ok
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln", default="./kiln")
    ap.add_argument("--out", default="/tmp/kiln-models")
    ap.add_argument("--json", default="")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--package-only", action="store_true")
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    names = a.names or list(em.MODELS)
    results = []
    for n in names:
        r = check(a.kiln, n, a.out, a.timeout, a.package_only)
        results.append(r)
        if a.package_only:
            print(f"{n}: {'ok' if r.get('ok') else 'FAILED'}  package bitwise = compiled "
                  f"reduce-overhead: {r.get('package_bitwise', r.get('error'))}  outputs "
                  f"{r.get('package_outputs')}  compile {r.get('package_compile_s')} s", flush=True)
        elif r.get("ok"):
            worst = max(o["rel"] for o in r["outputs"])
            low = "  ".join(f"{dt} {v['worst_rel']:.2e}" for dt, v in r["low"].items())
            low += "  reduce-overhead bitwise = default, package bitwise = compiled"
            print(f"{n}: ok  worst |cuda-cpu|/max|cpu| {worst:.2e}  ({low})  first call "
                  f"{r['compiled_first_call_s']:.2f} s  export {r['export_s']} s", flush=True)
        else:
            print(f"{n}: FAILED  {r.get('error') or r.get('outputs')}  low: {r.get('low')}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    passed = sum(1 for r in results if r.get("ok"))
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
