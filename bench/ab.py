#!/usr/bin/env python3
"""Kiln against Kiln: two builds (before and after a change) on the same models, side by side.

    python3 bench/ab.py --a OLD/kiln --b build/kiln [--models mlp,vfe,...] [--rounds 5]
        [--iters 200] [--threads 2] [--mode default] [--json out.json]

Each round runs `kiln bench MODEL --json --backend compiled` once for A and once for B, the order
alternating from round to round, so that machine noise lands on both alike. Per model it prints
the median over rounds of each build's p50 (and p99), the ratio B/A and the spread of the
per-round ratios; a ratio within the spread is noise. Nothing is asserted: this is a benchmark.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ZOO = ["mlp", "vfe", "branchy", "resnet18", "resnet50", "vit_b_16", "bert_base"]


def bench_once(kiln, model, args):
    cmd = [kiln, "bench", model, "--json", "--backend", "compiled", "--mode", args.mode,
           "--threads", str(args.threads), "--iters", str(args.iters)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-400:]}")
    j = json.loads(p.stdout)
    return float(j["p50_ms"]), float(j["p99_ms"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="the baseline kiln binary")
    ap.add_argument("--b", required=True, help="the kiln binary under test")
    ap.add_argument("--models", default=",".join(ZOO))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mode", default="default")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", default="", help="write every sample here")
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    results = {}
    for model in models:
        samples = {"a": [], "b": []}
        for r in range(args.rounds):
            order = ["a", "b"] if r % 2 == 0 else ["b", "a"]
            for which in order:
                samples[which].append(bench_once(getattr(args, which), model, args))
        pa = [s[0] for s in samples["a"]]
        pb = [s[0] for s in samples["b"]]
        ratios = [b / a for a, b in zip(pa, pb)]
        results[model] = {
            "a_p50_ms": statistics.median(pa), "b_p50_ms": statistics.median(pb),
            "a_p99_ms": statistics.median(s[1] for s in samples["a"]),
            "b_p99_ms": statistics.median(s[1] for s in samples["b"]),
            "ratio_b_over_a": statistics.median(ratios),
            "ratio_min": min(ratios), "ratio_max": max(ratios), "samples": samples,
        }
        r = results[model]
        print(f"{model:10s} A p50 {r['a_p50_ms']:9.4f} ms  B p50 {r['b_p50_ms']:9.4f} ms  "
              f"B/A {r['ratio_b_over_a']:.3f} (rounds {r['ratio_min']:.3f}..{r['ratio_max']:.3f})",
              flush=True)
    print("\n| model | A p50 ms | B p50 ms | B/A (median of rounds) | per-round B/A |")
    print("|---|---|---|---|---|")
    for model, r in results.items():
        print(f"| {model} | {r['a_p50_ms']:.4f} | {r['b_p50_ms']:.4f} | {r['ratio_b_over_a']:.3f} | "
              f"{r['ratio_min']:.3f}..{r['ratio_max']:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"a": args.a, "b": args.b, "threads": args.threads, "mode": args.mode,
                       "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
