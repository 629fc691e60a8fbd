#!/usr/bin/env python3
"""Roofline table of a benchmark set: `kiln profile MODEL.onnx --json` per model.

Each model of bench/model_set.py's set (its exported .onnx: the sets' folder, or the zoo's for
zoo models) is profiled compiled on the CPU; the table gives, per model, the kernel furthest from
its floor (Note [Kernel work] in src/lower/cost.cc: the longer of its FLOPs at the CPU's measured
matmul rate and its bytes at the measured copy bandwidth), and how the profiled time splits into
kernels within 2x, 2-5x and over 5x their floor, and kernels too short to judge (under
`min_kernel_ms` per call). Writes OUT/roofline.md and OUT/<model>.json.

    python3 bench/roofline.py --kiln build/kiln --set broad --threads 1 --out /tmp/roof
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_set  # noqa: E402


def model_path(name, em):
    sets = model_set.set_out_dir(em)
    for folder in (sets, em.default_out_dir()):
        p = os.path.join(folder, name + ".onnx")
        if os.path.exists(p):
            return p
    return None


def profile(kiln, path, threads, iters, out_json, timeout):
    cmd = [kiln, "profile", path, "--threads", str(threads), "--iters", str(iters), "--warmup", "2",
           "--json", out_json]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    if r.returncode != 0:
        last = (r.stderr.strip() or r.stdout.strip()).splitlines()
        return None, last[0] if last else f"exit {r.returncode}"
    with open(out_json) as f:
        return json.load(f), None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--set", default="broad")
    ap.add_argument("--models", default="", help="comma-separated subset (default: the whole set)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per model")
    ap.add_argument("--out", default="roofline-out")
    a = ap.parse_args(argv)
    em = model_set.export_models()
    names = [n for n in a.models.split(",") if n] or model_set.set_models(a.set)
    os.makedirs(a.out, exist_ok=True)
    rows, rates = [], None
    for name in names:
        path = model_path(name, em)
        if not path:
            rows.append((name, None, "not exported (bench/model_set.py export " + name + ")"))
            print(f"{name:32s} not exported", flush=True)
            continue
        j, err = profile(a.kiln, path, a.threads, a.iters, os.path.join(a.out, name + ".json"),
                         a.timeout)
        rows.append((name, j, err))
        if j and "roofline" in j:
            r = j["roofline"]
            rates = rates or r
            print(f"{name:32s} worst {r['worst_ratio']:6.1f}x {r['worst_kernel']}", flush=True)
        else:
            print(f"{name:32s} {err or 'no floors'}", flush=True)
    lines = [f"Roofline of set `{a.set}`: `python3 bench/roofline.py --set {a.set} --threads "
             f"{a.threads} --iters {a.iters}`", ""]
    if rates:
        lines += [f"Rates measured by each profile (first model's): {rates['gflops']:.1f} GFLOP/s "
                  f"f32, {rates['gflops_low_precision']:.1f} bf16, {rates['gbytes_per_s']:.1f} GB/s; "
                  f"kernels under {rates['min_kernel_ms']} ms per call are not judged.", ""]
    lines += ["| model | ms per call | worst kernel | x floor | its ms (floor) | time within 2x | "
              "2-5x | over 5x | short kernels |", "|---|---|---|---|---|---|---|---|---|"]
    for name, j, err in rows:
        if not j or "roofline" not in j:
            lines.append(f"| {name} | {err or 'no floors'} | | | | | | | |")
            continue
        r = j["roofline"]
        per_call = sum(k["total_ms"] for k in j["kernels"]) / j["iters"]
        worst = (f"`{r['worst_kernel']}`", f"{r['worst_ratio']:.1f}",
                 f"{r['worst_ms']:.3f} ({r['worst_floor_ms']:.3f})") if r["worst_ratio"] > 0 else ("-", "-", "-")
        lines.append(f"| {name} | {per_call:.2f} | {worst[0]} | {worst[1]} | {worst[2]} | "
                     f"{r['share_within_2x']:.0f}% | {r['share_2x_to_5x']:.0f}% | "
                     f"{r['share_over_5x']:.0f}% | {r['short_kernels']} ({r['short_share']:.0f}%) |")
    with open(os.path.join(a.out, "roofline.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
