#!/usr/bin/env python3
"""Eager vs compiled latency of every zoo model, side by side in one run.

Usage: python3 bench/zoo_latency.py [--kiln build/kiln] [--iters 20] [--threads 2] [models...]
Prints a Markdown table (the one in docs/benchmarks.md) and the raw JSON lines to stderr.
Each model runs in its own process; eager and compiled alternate inside that process
(`kiln run --backend both`), so their ratio is measured under the same conditions.
"""
import argparse
import json
import platform
import subprocess
import sys
import datetime

DEFAULT_MODELS = ["mlp", "vfe", "resnet18", "resnet50", "vit_b_16", "bert_base", "branchy"]


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("models", nargs="*", default=DEFAULT_MODELS)
    a = ap.parse_args()
    rows = []
    for m in a.models:
        cmd = [a.kiln, "run", m, "--json", "--iters", str(a.iters), "--threads", str(a.threads)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        j = json.loads(out)
        print(json.dumps(j), file=sys.stderr)
        diff = max(o.get("max_abs_diff_compiled_vs_eager", 0.0) for o in j["outputs"])
        rows.append((m, j["eager"], j["compiled"], diff))
    print(f"Measured {datetime.date.today()} on {cpu_model()}, {a.threads} threads, "
          f"{a.iters} iterations after 2 warm-up calls (`python3 bench/zoo_latency.py "
          f"--iters {a.iters} --threads {a.threads}`).\n")
    print("| model | eager p50 ms | eager p90 ms | compiled p50 ms | compiled p90 ms | "
          "compiled/eager p50 | first compiled call s | max abs diff |")
    print("|---|---|---|---|---|---|---|---|")
    for m, e, c, d in rows:
        print(f"| {m} | {e['p50_ms']:.3f} | {e['p90_ms']:.3f} | {c['p50_ms']:.3f} | "
              f"{c['p90_ms']:.3f} | {c['p50_ms'] / e['p50_ms']:.2f} | {c['first_call_s']:.3f} | {d:.1e} |")


if __name__ == "__main__":
    main()
