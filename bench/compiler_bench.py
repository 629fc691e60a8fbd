#!/usr/bin/env python3
"""Kiln eager vs the CPU compiler ("inductor") on every zoo model, side by side.

For each model, `kiln bench --json` runs eager and compiled in alternating rounds (eager,
compiled, eager, compiled, ...) so that machine noise hits both alike; the table takes, per
backend, the median over rounds of each round's p50 / p99, and from the compiled rounds the
cold compile time (empty private code cache), the warm compile time (cache hit), heap
allocations per steady-state call and the planned arena. Prints a Markdown table.

  python3 bench/compiler_bench.py [--kiln build/kiln] [--models mlp,vfe,...] [--rounds 3]
                                  [--threads 2] [--mode default]
"""
import argparse
import json
import statistics
import subprocess
import sys

ITERS = {"mlp": 3000, "vfe": 200, "resnet18": 60, "resnet50": 40, "vit_b_16": 20, "bert_base": 20}


def bench(kiln, model, backend, threads, mode, iters):
    cmd = [kiln, "bench", model, "--backend", backend, "--threads", str(threads), "--mode", mode,
           "--iters", str(iters), "--warmup", "5", "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--models", default=",".join(ITERS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mode", default="default")
    a = ap.parse_args()
    rows = []
    for m in a.models.split(","):
        if m not in ITERS:
            sys.exit(f"unknown model '{m}' (known: {', '.join(ITERS)})")
        runs = {"eager": [], "compiled": []}
        for _ in range(a.rounds):
            for b in ("eager", "compiled"):
                runs[b].append(bench(a.kiln, m, b, a.threads, a.mode if b == "compiled" else "default", ITERS[m]))
        med = lambda b, k: statistics.median(r[k] for r in runs[b])
        c = runs["compiled"]
        rows.append((m, med("eager", "p50_ms"), med("eager", "p99_ms"), med("compiled", "p50_ms"),
                     med("compiled", "p99_ms"), statistics.median(r["compile_s"] for r in c),
                     statistics.median(r["warm_compile_s"] for r in c),
                     c[0]["steady_state_allocs_per_call"], c[0]["arena_bytes"],
                     med("eager", "steady_state_allocs_per_call"), c[0]["backend"]))
    print(f"| model | eager p50 ms | eager p99 ms | compiled p50 ms | compiled p99 ms | "
          f"speedup (p50) | compiled p99/p50 | cold compile s | warm compile s | allocs/call eager -> compiled | arena MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (m, ep50, ep99, cp50, cp99, cold, warm, calloc, arena, ealloc, backend) in rows:
        print(f"| {m} | {ep50:.4f} | {ep99:.4f} | {cp50:.4f} | {cp99:.4f} | {ep50 / cp50:.2f}x | "
              f"{cp99 / cp50:.2f} | {cold:.3f} | {warm:.3f} | {ealloc:.0f} -> {calloc:.0f} | "
              f"{(arena or 0) / 1e6:.2f} |")
    print(f"\n(backend {rows[0][-1]}, {a.rounds} alternating rounds, threads {a.threads}, mode {a.mode})")


if __name__ == "__main__":
    main()
