#!/usr/bin/env python3
"""Load time and first call of PyTorch's deployment artefacts, beside `kiln bench M.kiln` (#14).

    peer_load.py --models resnet50,bert_base [--device cuda|cpu] [--dtype f32|bf16]
                 [--loads 3] [--work DIR] [--timeout 300] [--json FILE]

For each model (scripts/export_models.py's build_model: the same modules and inputs as
bench/compare.py) two artefacts are built once in this process:
  - torchscript: torch.jit.trace + torch.jit.freeze, saved with torch.jit.save (M.pt);
  - aoti: torch.export.export + torch._inductor.aoti_compile_and_package (M.pt2).
Each is then loaded `--loads` times, each time in a fresh Python process that has imported
torch already (its import is reported apart as import_s): load_s is torch.jit.load or
torch._inductor.aoti_load_package, first_call_s the first call with the synchronisation, and
p50_ms the median of 20 further calls. A load that fails or crashes (a negative return code is
the signal that killed it) is reported as such, never skipped. One JSON object per line.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CHILD = r"""
import sys, time, json
t0 = time.perf_counter()
import torch
import_s = time.perf_counter() - t0
kind, path, device, inputs_path = sys.argv[1:5]
inputs = torch.load(inputs_path)
inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
def sync():
    if device == "cuda":
        torch.cuda.synchronize()
t0 = time.perf_counter()
if kind == "torchscript":
    fn = torch.jit.load(path, map_location=device)
else:
    fn = torch._inductor.aoti_load_package(path)
sync()
load_s = time.perf_counter() - t0
with torch.inference_mode():
    t0 = time.perf_counter(); fn(*inputs); sync()
    first = time.perf_counter() - t0
    times = []
    for _ in range(20):
        t0 = time.perf_counter(); fn(*inputs); sync(); times.append(time.perf_counter() - t0)
times.sort()
print(json.dumps({"import_s": import_s, "load_s": load_s, "first_call_s": first,
                  "p50_ms": times[len(times) // 2] * 1e3}))
"""


def build(kind, model, module, inputs, path):
    import torch
    with torch.inference_mode():
        if kind == "torchscript":
            traced = torch.jit.trace(module, inputs, strict=False, check_trace=False)
            torch.jit.save(torch.jit.freeze(traced.eval()), path)
        else:
            ep = torch.export.export(module, inputs)
            torch._inductor.aoti_compile_and_package(ep, package_path=path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet50,bert_base")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--kinds", default="torchscript,aoti")
    ap.add_argument("--loads", type=int, default=3)
    ap.add_argument("--work", default="/tmp/kiln-peer-load")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    import torch
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import export_models  # noqa: E402
    os.makedirs(a.work, exist_ok=True)
    out = open(a.json, "a") if a.json else None

    def report(obj):
        line = json.dumps(obj)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    for model in a.models.split(","):
        module, inputs = export_models.build_model(model)
        module = module.eval().to(a.device)
        inputs = tuple(x.to(a.device) if isinstance(x, torch.Tensor) else x for x in inputs)
        if a.dtype == "bf16":
            module = module.to(torch.bfloat16)
            inputs = tuple(x.to(torch.bfloat16) if isinstance(x, torch.Tensor) and
                           x.is_floating_point() else x for x in inputs)
        inputs_path = os.path.join(a.work, f"{model}.{a.device}.{a.dtype}.inputs.pt")
        torch.save(tuple(x.cpu() if isinstance(x, torch.Tensor) else x for x in inputs),
                   inputs_path)
        for kind in a.kinds.split(","):
            ext = "pt" if kind == "torchscript" else "pt2"
            path = os.path.join(a.work, f"{model}.{a.device}.{a.dtype}.{ext}")
            base = {"model": model, "system": kind, "device": a.device, "dtype": a.dtype}
            t0 = time.perf_counter()
            try:
                build(kind, model, module, inputs, path)
            except Exception as e:  # reported, never skipped
                report({**base, "error": f"build: {type(e).__name__}: {str(e)[:300]}"})
                continue
            build_s = time.perf_counter() - t0
            for i in range(a.loads):
                try:
                    p = subprocess.run([sys.executable, "-c", CHILD, kind, path, a.device,
                                        inputs_path], capture_output=True, text=True,
                                       timeout=a.timeout)
                except subprocess.TimeoutExpired:
                    report({**base, "load": i, "error": f"timed out after {a.timeout} s"})
                    continue
                if p.returncode != 0:
                    why = (f"killed by signal {-p.returncode}" if p.returncode < 0
                           else f"exit {p.returncode}")
                    report({**base, "load": i, "error": f"{why}: {p.stderr.strip()[-300:]}"})
                    continue
                r = json.loads(p.stdout.strip().splitlines()[-1])
                report({**base, "load": i, "build_s": round(build_s, 2),
                        "bytes": os.path.getsize(path), **r})
    return 0


if __name__ == "__main__":
    sys.exit(main())
