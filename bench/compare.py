#!/usr/bin/env python3
"""Kiln against its peers: latency distribution, first-call (compile) cost and peak memory of the
same models under Kiln, ONNX Runtime, PyTorch eager, torch.compile and TorchScript.

    python3 bench/compare.py [--models mlp,vfe,...] [--batch 1] [--threads 2]
        [--iters N | --seconds S] [--systems kiln-eager,kiln-compiled,ort,torch-eager,...]
        [--out DIR] [--update-docs] [--device cpu|cuda] [--kiln PATH]

Writes DIR/compare.json (everything, raw), DIR/compare.md (one table per model) and
DIR/compare.html (self-contained report with inline SVG plots); --update-docs rewrites the region
between `<!-- compare:begin -->` and `<!-- compare:end -->` in docs/benchmarks.md. See
bench/README.md for what each number means.

Note [How the comparison is run]

* One process per system. Every PyTorch/ORT system runs in its own worker process (this script
  with `--worker SYSTEM MODEL --serve`), so its peak RSS is its own and a crash or a hung
  torch.compile takes down only that system. Kiln runs as `kiln bench ... --json` subprocesses.
  The ORT worker never imports torch (its inputs come from an .npz written at export time), so
  its RSS is what an ORT user pays.
* Setup is sequential and timed alone: each worker builds its model and makes its first call
  (torch.compile compiles, TorchScript traces and freezes, ORT creates its session) before the
  next worker starts, so no two systems compete for the 2 cores while compiling.
* Rounds. The timed iterations are split into --rounds rounds; in each round every system in
  turn runs --warmup calls and then its share of timed calls, and the order rotates from round
  to round. Machine noise (other builds, thermal drift) therefore lands on every system alike,
  and the spread of the per-round medians shows how noisy the run was. Idle workers wait on a
  pipe read (no CPU). Kiln has no server mode, so each Kiln round is a fresh `kiln bench`
  process (model build, compile and warm-up happen outside its timed loop); its first round
  gives the cold compile cost.
* Same work everywhere: one thread count for all (torch.set_num_threads,
  ORT intra_op_num_threads, kiln --threads, and OMP_NUM_THREADS/MKL_NUM_THREADS in every
  subprocess's environment); zoo models come from scripts/export_models.py (build_model for the
  PyTorch peers, export() for the .onnx that ORT runs; Kiln runs its own zoo model of the same
  architecture), or an .onnx path is run by Kiln and ORT from the same file.
* Timeouts instead of hangs: a system's setup (and every round) gets --compile-budget seconds;
  past that its process group is killed and the system is recorded as "timeout". Errors are
  recorded with their text and shown in every table; nothing is dropped silently.
* Latencies: every timed call is timed alone (perf_counter around the call; on CUDA with a
  synchronize before the clock stops); percentiles are nearest-rank over all rounds' samples,
  as `kiln bench` computes them from the per-call `samples_ms` of its JSON. Only a kiln binary
  older than `samples_ms` forces the fallback: every system's distribution is then pooled from
  per-round summaries (see pool_summaries) and marked as such.
* --device cuda (Note [CUDA columns]): Kiln runs `kiln bench --device cuda`, the peers run on
  the GPU; whatever cannot run there is a row with its reason, never a missing row.

Note [CUDA columns]
The run goes ahead when any CUDA device is visible: to Kiln (`kiln device --json`) or to torch
(probed in a subprocess); only when neither sees one does the script exit with 2. Then:
* kiln-eager is `kiln bench TARGET --device cuda --backend eager` (the eager CUDA kernels; host
  time per call includes the device synchronization, and its JSON adds device_p50_ms /
  device_p99_ms from CUDA events). Kiln refuses, before running, a target with a node that has
  no CUDA kernel (every zoo model needs conv or linear) and --backend compiled on CUDA (the CUDA
  compiler is not built yet); those rows are `unsupported` with Kiln's error text.
* torch-eager / torch-compile / torchscript run the module on "cuda" (inputs moved there before
  timing, torch.cuda.synchronize() ends each call); a worker whose torch is missing or sees no
  GPU is an `unsupported` row saying which.
* ort uses the CUDAExecutionProvider with IOBinding: inputs copied to the device once, outputs
  left on the device, the run synchronized, so that its timing, like Kiln's and torch's, holds
  no host<->device copies. A build without the provider, or a session that fell back to the
  CPU, is an `unsupported` row.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import inspect
import json
import math
import os
import platform
import re
import selectors
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DOCS_BEGIN = "<!-- compare:begin -->"
DOCS_END = "<!-- compare:end -->"

# Every system this script knows. kind: kiln (kiln bench subprocess), torch, ort (workers).
SYSTEMS = {
    "kiln-eager": {"kind": "kiln", "backend": "eager", "mode": "default"},
    "kiln-compiled": {"kind": "kiln", "backend": "compiled", "mode": "default"},
    "kiln-compiled-reduce-overhead": {"kind": "kiln", "backend": "compiled",
                                      "mode": "reduce-overhead"},
    "kiln-compiled-max-autotune": {"kind": "kiln", "backend": "compiled", "mode": "max-autotune"},
    # CUDA: float32 with TF32 tensor cores in the GEMMs and convolutions (Note [CUDA TF32]); torch
    # runs its float32 convolutions in TF32 by default (torch.backends.cudnn.allow_tf32).
    "kiln-compiled-tf32": {"kind": "kiln", "backend": "compiled", "mode": "default",
                           "knobs": "tf32=on"},
    "kiln-compiled-reduce-overhead-tf32": {"kind": "kiln", "backend": "compiled",
                                           "mode": "reduce-overhead", "knobs": "tf32=on"},
    "kiln-compiled-max-autotune-tf32": {"kind": "kiln", "backend": "compiled",
                                        "mode": "max-autotune", "knobs": "tf32=on"},
    "ort": {"kind": "ort"},
    "torch-eager": {"kind": "torch", "how": "eager"},
    "torch-compile": {"kind": "torch", "how": "compile", "mode": "default"},
    "torch-compile-reduce-overhead": {"kind": "torch", "how": "compile",
                                      "mode": "reduce-overhead"},
    "torch-compile-max-autotune": {"kind": "torch", "how": "compile", "mode": "max-autotune"},
    "torchscript": {"kind": "torch", "how": "torchscript"},
    # torch.compile(model, backend="kiln") through the Python package (docs/python.md); the
    # package comes from --kiln-python (default: <dir of --kiln>/python) on PYTHONPATH.
    "kiln-torch-compile": {"kind": "torch", "how": "compile", "mode": "default",
                           "backend": "kiln"},
}
REFERENCE_SYSTEM = "kiln-compiled"  # the "p50 vs Kiln" column divides by this system's p50
DEFAULT_MODELS = ["mlp", "vfe", "resnet18", "resnet50", "vit_b_16", "bert_base"]
# torch.compile(mode="max-autotune") benchmarks kernel choices: on CUDA (Triton) that can take
# very long; on CPU without inductor freezing it compiles about as fast as the default mode.
# --max-autotune-models restricts it to some models where time is short.
DEFAULT_MAX_AUTOTUNE_MODELS = ["all"]
# With --set, unless --systems says otherwise (Note [Benchmark sets]).
DEFAULT_SET_SYSTEMS = ["kiln-compiled", "kiln-compiled-max-autotune", "ort", "torch-eager"]
SET_DOCS_BEGIN = "<!-- compare-set:{name}:begin -->"
SET_DOCS_END = "<!-- compare-set:{name}:end -->"


# ------------------------------------------------------------------------------------------
# Small helpers shared by the parent and the workers.

def percentile(samples, p):
    """Nearest rank, as kiln::percentile: the smallest sample with >= p% of samples <= it."""
    if not samples:
        return float("nan")
    s = sorted(samples)
    rank = math.ceil(p / 100.0 * len(s))
    return s[min(len(s) - 1, max(0, rank - 1))]


def summarize(samples):
    n = len(samples)
    mean = sum(samples) / n
    var = sum((x - mean) ** 2 for x in samples) / (n - 1) if n > 1 else 0.0
    s = sorted(samples)
    return {
        "n": n, "min_ms": s[0], "p25_ms": percentile(s, 25), "p50_ms": percentile(s, 50),
        "p75_ms": percentile(s, 75), "p90_ms": percentile(s, 90), "p99_ms": percentile(s, 99),
        "max_ms": s[-1], "mean_ms": mean, "stddev_ms": math.sqrt(var),
    }


def python_exe():
    return sys.executable


def rss_peak_bytes():
    import resource
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def thread_env(threads):
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[k] = str(threads)
    return env


def error_text(exc):
    return f"{type(exc).__name__}: {exc}".strip()


class Unsupported(RuntimeError):
    """A system that cannot run this model on this machine (not a failure of the system): the
    worker reports it with status "unsupported" and the text says why."""


def import_export_models(set_name=None):
    """scripts/export_models.py (MODELS, build_model, export). KILN_EXPORT_MODELS_DIR points
    elsewhere (a folder holding an export_models.py with the same API). With set_name, the
    models of bench/model_set.py are registered with it first."""
    d = os.environ.get("KILN_EXPORT_MODELS_DIR") or os.path.join(ROOT, "scripts")
    if d not in sys.path:
        sys.path.insert(0, d)
    import export_models  # noqa: E402
    if set_name:
        import_model_set().register(export_models)
    return export_models


def import_model_set():
    """bench/model_set.py (SETS, ENTRIES, register, set_out_dir)."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import model_set  # noqa: E402
    return model_set


# ------------------------------------------------------------------------------------------
# Worker side: one system on one model, in its own process.

class Proto:
    """The worker's reply channel: the original stdout, kept for JSON lines only. fd 1 then
    points at stderr, so prints from libraries cannot corrupt the protocol."""

    def __init__(self):
        self.f = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def send(self, obj):
        self.f.write(json.dumps(obj) + "\n")
        self.f.flush()


def _call_with_batch(build_model, name, batch):
    """build_model(name[, batch]): passes batch when the API takes it; else repeats the batch-1
    example inputs along dim 0."""
    params = inspect.signature(build_model).parameters
    if "batch" in params:
        return build_model(name, batch=batch), True
    return build_model(name), False


class TorchRunner:
    def __init__(self, system, model, args):
        import torch
        self.torch = torch
        spec = SYSTEMS[system]
        torch.set_num_threads(args.threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass  # already set in this process
        if model.endswith(".onnx"):
            raise RuntimeError("unsupported: the PyTorch peers need a zoo model name, not an .onnx "
                               "file (there is no ONNX -> PyTorch import)")
        em = import_export_models(args.set)
        rss_after_imports = rss_peak_bytes()
        (module, inputs), took_batch = _call_with_batch(em.build_model, model, args.batch)
        inputs = tuple(inputs)
        if args.batch > 1 and not took_batch:
            inputs = tuple(torch.cat([x] * args.batch, 0) if isinstance(x, torch.Tensor) else x
                           for x in inputs)
        module.eval()
        if args.dtype != "f32":
            low = {"bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
            module = module.to(low)
            inputs = tuple(x.to(low) if isinstance(x, torch.Tensor) and x.is_floating_point()
                           else x for x in inputs)
        self.cuda = args.device == "cuda"
        if self.cuda:
            if not torch.cuda.is_available():
                raise Unsupported(f"torch {torch.__version__} sees no CUDA device "
                                  "(torch.cuda.is_available() is False; built with CUDA "
                                  f"{torch.version.cuda})")
            module = module.to("cuda")
            inputs = tuple(x.to("cuda") if isinstance(x, torch.Tensor) else x for x in inputs)
        self.inputs = inputs
        self.config = {"torch_threads": torch.get_num_threads(),
                       "torch_interop_threads": torch.get_num_interop_threads(),
                       "grad": "inference_mode (torchscript: no_grad)",
                       "rss_after_imports_bytes": rss_after_imports}
        how = spec["how"]
        sync = torch.cuda.synchronize if self.cuda else (lambda: None)
        self.sync = sync
        t0 = time.perf_counter()
        if how == "eager":
            self.fn = module
            self.ctx = torch.inference_mode
            setup_s = 0.0
        elif how == "compile" and spec.get("backend") == "kiln":
            # The Kiln package registers the "kiln" backend through its entry point; importing
            # it here makes a missing package an error in setup, with its reason.
            import kiln  # noqa: F401
            self.fn = torch.compile(module, backend="kiln", dynamic=False,
                                    options={"mode": spec["mode"], "threads": args.threads})
            self.ctx = torch.inference_mode
            self.config.update({"torch_compile_backend": "kiln", "kiln_mode": spec["mode"],
                                "kiln_package": os.path.dirname(os.path.abspath(kiln.__file__)),
                                "kiln_cache_dir": os.environ.get("KILN_CACHE_DIR")})
            setup_s = time.perf_counter() - t0  # lazy: compiling happens in the first call
        elif how == "compile":
            mode = None if spec["mode"] == "default" else spec["mode"]
            self.fn = torch.compile(module, mode=mode, dynamic=False)
            self.ctx = torch.inference_mode
            self.config["torch_compile_mode"] = spec["mode"]
            self.config["inductor_cache_dir"] = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
            self.config["inductor_freezing"] = os.environ.get("TORCHINDUCTOR_FREEZING") == "1"
            setup_s = time.perf_counter() - t0  # lazy: compiling happens in the first call
        else:  # torchscript: trace + freeze, the documented inference path
            self.ctx = torch.no_grad
            with torch.no_grad():
                traced = torch.jit.trace(module, inputs, strict=False, check_trace=False)
                self.fn = torch.jit.freeze(traced.eval())
            setup_s = time.perf_counter() - t0
        with self.ctx():
            t1 = time.perf_counter()
            self.fn(*self.inputs)
            sync()
            t2 = time.perf_counter()
        self.setup = {"setup_s": setup_s, "first_run_s": t2 - t1, "first_call_s": t2 - t0}
        # Two windows (Note [Device memory windows] in src/bench/bench.cc, as kiln bench reports
        # them): load + compile + first call, then the warm-up and timed calls alone.
        self.setup_peak_device = None
        if self.cuda:
            self.setup_peak_device = int(torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()

    def peak_device_bytes(self):
        return int(self.torch.cuda.max_memory_allocated()) if self.cuda else None

    def call(self):
        self.fn(*self.inputs)
        self.sync()

    def context(self):
        return self.ctx()


class OrtRunner:
    def __init__(self, system, model, args):
        import numpy as np
        import onnxruntime as ort
        rss_after_imports = rss_peak_bytes()
        if args.dtype != "f32":
            raise Unsupported(f"ONNX Runtime runs the exported float32 model only (--dtype {args.dtype})")
        if not args.onnx:
            raise RuntimeError("no .onnx file for this model (export failed or was not run)")
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.cuda = args.device == "cuda"
        if self.cuda:
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise Unsupported("this onnxruntime build has no CUDAExecutionProvider "
                                  f"(onnxruntime {ort.__version__}; available: "
                                  f"{', '.join(ort.get_available_providers())})")
            providers = ["CUDAExecutionProvider"]
        else:
            providers = ["CPUExecutionProvider"]
        t0 = time.perf_counter()
        self.sess = ort.InferenceSession(args.onnx, so, providers=providers)
        setup_s = time.perf_counter() - t0
        if self.cuda and "CUDAExecutionProvider" not in self.sess.get_providers():
            # ORT falls back to the CPU (with a warning) when the provider's libraries fail to
            # load; timing that as a CUDA column would be wrong.
            raise Unsupported("onnxruntime's CUDAExecutionProvider did not load (the session "
                              f"runs on {', '.join(self.sess.get_providers())}); check the "
                              "CUDA/cuDNN libraries onnxruntime-gpu needs")
        metas = self.sess.get_inputs()
        if args.inputs:
            z = np.load(args.inputs)
            arrays = [z[f"arr_{i}"] for i in range(len(z.files))]
            if len(arrays) != len(metas):
                raise RuntimeError(
                    f"input mismatch: {args.onnx} has {len(metas)} inputs "
                    f"({', '.join(m.name for m in metas)}) but the model's example inputs are "
                    f"{len(arrays)}; re-export with every input kept")
        else:  # an .onnx target: random inputs of the declared shapes (symbolic dims: batch, 1)
            rng = np.random.default_rng(0)
            arrays = []
            for m in metas:
                shape = [d if isinstance(d, int) and d > 0 else (args.batch if i == 0 else 1)
                         for i, d in enumerate(m.shape)]
                if "int" in m.type:
                    arrays.append(rng.integers(0, 2, size=shape).astype(
                        np.int64 if "int64" in m.type else np.int32))
                else:
                    dt = np.float16 if "float16" in m.type else (
                        np.float64 if "double" in m.type else np.float32)
                    arrays.append(rng.standard_normal(shape).astype(dt))
        self.feeds = {m.name: a for m, a in zip(metas, arrays)}
        if self.cuda:
            # Inputs copied to the device once; outputs stay there (allocated by ORT per run).
            self.io = self.sess.io_binding()
            self.device_inputs = []
            for name, a in self.feeds.items():
                v = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a), "cuda", 0)
                self.device_inputs.append(v)  # kept alive for the binding
                self.io.bind_ortvalue_input(name, v)
            for o in self.sess.get_outputs():
                self.io.bind_output(o.name, "cuda", 0)
        t1 = time.perf_counter()
        self.call()
        t2 = time.perf_counter()
        self.setup = {"setup_s": setup_s, "first_run_s": t2 - t1, "first_call_s": t2 - t0}
        self.config = {"providers": self.sess.get_providers(), "intra_op_num_threads": args.threads,
                       "inter_op_num_threads": 1, "graph_optimization_level": "ORT_ENABLE_ALL",
                       "onnx": args.onnx, "rss_after_imports_bytes": rss_after_imports}

    def peak_device_bytes(self):
        return None

    def call(self):
        if self.cuda:
            self.sess.run_with_iobinding(self.io)
            self.io.synchronize_outputs()
        else:
            self.sess.run(None, self.feeds)

    def context(self):
        import contextlib
        return contextlib.nullcontext()


def run_calls(runner, warmup, iters=0, seconds=0.0):
    """warmup untimed calls, then `iters` timed calls (or calls until `seconds` passed, at least
    one). The garbage collector is off during the timed loop."""
    import gc
    samples = []
    with runner.context():
        for _ in range(warmup):
            runner.call()
        gc.collect()
        gc.disable()
        try:
            clock = time.perf_counter
            start = clock()
            i = 0
            while True:
                if seconds > 0:
                    if i > 0 and clock() - start >= seconds:
                        break
                elif i >= iters:
                    break
                t0 = clock()
                runner.call()
                samples.append((clock() - t0) * 1e3)
                i += 1
        finally:
            gc.enable()
    return samples


def worker_main(args):
    """`compare.py --worker SYSTEM MODEL`: set the system up, then either serve rounds (--serve:
    JSON commands on stdin, one JSON reply line each) or run --warmup/--iters once and print one
    JSON object."""
    proto = Proto()
    system, model = args.worker
    phase = "setup"
    try:
        spec = SYSTEMS[system]
        runner = (OrtRunner if spec["kind"] == "ort" else TorchRunner)(system, model, args)
        ready = {"event": "ready", "system": system, "model": model, **runner.setup,
                 "config": runner.config, "pid": os.getpid(), "peak_rss_bytes": rss_peak_bytes(),
                 "setup_peak_device_bytes": getattr(runner, "setup_peak_device", None)}
        if not args.serve:
            phase = "run"
            samples = run_calls(runner, args.warmup, args.iters or 50, args.seconds or 0.0)
            ready.update(event="result", samples_ms=samples, **summarize(samples),
                         peak_rss_bytes=rss_peak_bytes(),
                         peak_device_bytes=runner.peak_device_bytes())
            proto.send(ready)
            return 0
        proto.send(ready)
        phase = "rounds"
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["cmd"] == "quit":
                proto.send({"event": "bye", "peak_rss_bytes": rss_peak_bytes(),
                            "peak_device_bytes": runner.peak_device_bytes()})
                return 0
            samples = run_calls(runner, cmd.get("warmup", 0), cmd.get("iters", 0),
                                cmd.get("seconds", 0.0))
            proto.send({"event": "round", "samples_ms": samples, "peak_rss_bytes": rss_peak_bytes()})
        return 0
    except Exception as e:  # reported to the parent, which records it for this system
        status, text = "error", error_text(e)
        if isinstance(e, Unsupported):
            status, text = "unsupported", str(e)
        elif isinstance(e, ImportError) and phase == "setup" and args.device == "cuda":
            status = "unsupported"
            text = f"{getattr(e, 'name', None) or 'a package'} is not installed in " \
                   f"{python_exe()} ({text})"
        proto.send({"event": "error", "status": status, "phase": phase, "error": text,
                    "traceback": traceback.format_exc()})
        return 1


def export_main(args):
    """`compare.py --export MODEL --onnx-dir DIR`: export_models.export(MODEL) (into its cache,
    or --onnx-cache; an export whose stamp is current is reused) and DIR/MODEL.inputs.npz
    (build_model's example inputs at --batch, in call order) for the ORT worker. Prints one
    JSON line."""
    proto = Proto()
    try:
        import numpy as np
        import torch
        torch.set_num_threads(args.threads)
        em = import_export_models(args.set)
        name = args.export
        os.makedirs(args.onnx_dir, exist_ok=True)
        t0 = time.perf_counter()
        path = em.export(name, out_dir=args.onnx_cache)
        export_call_s = time.perf_counter() - t0
        info = {}
        if hasattr(em, "stamp_info"):
            try:
                full = em.stamp_info(name, args.onnx_cache)
                info = {k: full.get(k) for k in ("exporter", "dynamic_batch", "export_s", "opset",
                                                 "torch_vs_ort_max_abs_diff", "onnx_nodes")}
            except (OSError, ValueError):
                pass
        (_, inputs), took_batch = _call_with_batch(em.build_model, name, args.batch)
        arrays = []
        for x in inputs:
            a = x.detach().cpu().numpy()
            if args.batch > 1 and not took_batch:
                a = np.concatenate([a] * args.batch, 0)
            arrays.append(a)
        npz = os.path.join(args.onnx_dir, f"{name}.b{args.batch}.inputs.npz")
        np.savez(npz, *arrays)
        proto.send({"event": "exported", "onnx": os.path.abspath(str(path)), "inputs": npz,
                    "export_call_s": export_call_s, "export_info": info})
        return 0
    except Exception as e:
        # One line (the exporters' reasons joined): the parent shows it in the tables. Exit 0:
        # the JSON line is the answer (a non-zero exit would make the parent read stderr).
        text = " / ".join(l.strip() for l in error_text(e).splitlines() if l.strip())
        proto.send({"event": "error", "phase": "export", "error": text,
                    "traceback": traceback.format_exc()})
        return 0


# ------------------------------------------------------------------------------------------
# Parent side: subprocess management.

class Timeout(Exception):
    pass


class ChildError(Exception):
    def __init__(self, text, detail=""):
        super().__init__(text)
        self.detail = detail


class LineProcess:
    """A child in its own process group whose stdout carries JSON lines; stderr goes to a log
    file. readline() takes a deadline; kill() ends the whole group (torch.compile's compile
    workers included)."""

    def __init__(self, cmd, env, log_path, stdin=True):
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=self.log, env=env,
                                     start_new_session=True)
        self.buf = b""
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)

    def readline(self, timeout):
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout()
            if not self.sel.select(min(left, 1.0)):
                continue
            chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
            if not chunk:
                raise ChildError(f"process exited (status {self.proc.wait()}) without a reply",
                                 self.stderr_tail())
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def send(self, obj):
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        self.proc.stdin.flush()

    def stderr_tail(self, n=2000):
        try:
            self.log.flush()
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the group this script created
            except ProcessLookupError:
                pass
        self.wait()

    def wait(self, timeout=30):
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.sel.close()
        self.log.close()


def run_json_process(cmd, env, timeout, log_path):
    """Runs cmd (stdout: one JSON document) with a timeout; kills its group on timeout."""
    with open(log_path, "wb") as log:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env=env,
                             start_new_session=True)
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.communicate()
            raise Timeout()
    with open(log_path, "rb") as f:
        err = f.read().decode(errors="replace")
    if p.returncode != 0:
        lines = [l for l in err.strip().splitlines() if l.strip()]
        msg = next((l for l in reversed(lines) if "error" in l.lower()),
                   lines[-1] if lines else f"exit status {p.returncode}").strip()
        msg = re.sub(r"^kiln: error: ", "", msg)  # the table says "error:" already
        raise ChildError(msg, err[-2000:])
    try:
        return json.loads(out)
    except json.JSONDecodeError as e:
        raise ChildError(f"unparsable JSON from {cmd[0]}: {e}", out[-2000:].decode(errors="replace"))


# ------------------------------------------------------------------------------------------
# Parent side: one model, every system, in alternating rounds.

class SystemRun:
    """What the parent records for one (model, system)."""

    def __init__(self, name):
        self.name = name
        self.status = "ok"          # ok | error | timeout | skipped
        self.error = None
        self.error_detail = None
        self.samples = []           # every timed call, ms, in order
        self.round_summaries = []   # per round: n, p50, p90, p99, min, max, mean, stddev
        self.first_call_s = None
        self.setup = {}
        self.config = {}
        self.peak_rss_bytes = None
        self.peak_device_bytes = None        # CUDA: the warm-up and timed calls' peak
        self.setup_peak_device_bytes = None  # CUDA: the peak of load, compile and first call
        self.kiln_json = []         # every kiln bench JSON (one per round)
        self.latency_source = "samples"
        self.proc = None

    def fail(self, status, text, detail=None):
        self.status, self.error, self.error_detail = status, text, detail
        if self.proc is not None:
            self.proc.kill()
            self.proc = None

    @property
    def alive(self):
        return self.status == "ok"


def split_work(args):
    """Per-round work: (iters list) or (seconds per round)."""
    rounds = args.rounds
    if args.seconds:
        return rounds, [None] * rounds, args.seconds / rounds
    total = args.iters
    rounds = max(1, min(rounds, total))
    base, extra = divmod(total, rounds)
    return rounds, [base + (1 if r < extra else 0) for r in range(rounds)], 0.0


def kiln_cmd(args, spec, target, warmup, iters, seconds):
    cmd = [args.kiln, "bench", target, "--json", "--backend", spec["backend"], "--mode",
           spec["mode"], "--batch", str(args.batch), "--threads", str(args.threads),
           "--warmup", str(warmup), "--device", args.device]
    if args.dtype != "f32":
        cmd += ["--dtype", args.dtype]
    cmd += ["--seconds", f"{seconds:g}"] if seconds else ["--iters", str(iters)]
    return cmd


def kiln_first_call_s(j):
    """Compile + first call. kiln's compile_s is compile() + first_call_s - p50; adding the
    p50 back gives compile() + first call (compile() is lazy, so this is ~first_call_s)."""
    fc = j["first_call_s"]
    if j.get("compile_s") is not None:
        return max(fc, j["compile_s"] + j["p50_ms"] / 1e3)
    return fc


def kiln_round(sr, args, spec, target, warmup, iters, seconds, logdir, env):
    cmd = kiln_cmd(args, spec, target, warmup, iters, seconds)
    if spec.get("knobs"):  # every compile of the process (compiler::compile reads KILN_KNOBS)
        env = dict(env if env is not None else os.environ, KILN_KNOBS=spec["knobs"])
    log = os.path.join(logdir, f"{sr.name}.r{len(sr.kiln_json)}.log")
    try:
        j = run_json_process(cmd, env, args.compile_budget, log)
    except Timeout:
        sr.fail("timeout", f"kiln bench exceeded --compile-budget {args.compile_budget:g} s")
        return
    except ChildError as e:
        # On CUDA, Kiln refuses what it cannot run there yet (a node without a CUDA kernel, the
        # compiled backend): an unsupported row with Kiln's text, not a failure.
        unsupported = args.device == "cuda" and any(
            k in str(e) for k in ("has no CUDA kernel", "cannot run on CUDA", "not supported yet",
                                  "cannot be moved to a CUDA device"))
        sr.fail("unsupported" if unsupported else "error", str(e), e.detail)
        return
    except OSError as e:
        sr.fail("error", f"cannot run {args.kiln}: {e} (build Kiln or pass --kiln PATH)")
        return
    sr.kiln_json.append(j)
    # Every round is a fresh process, so each gives a cold first call: report their median
    # (one cold start is easily hit by a page-in or a busy moment).
    firsts = [kiln_first_call_s(x) for x in sr.kiln_json]
    sr.first_call_s = percentile(firsts, 50)
    sr.setup["first_call_s_per_round"] = firsts
    if len(sr.kiln_json) == 1:
        sr.setup.update({"compile_s_round1": j.get("compile_s"),
                         "first_call_s_round1": j["first_call_s"],
                         "warm_compile_s_round1": j.get("warm_compile_s")})
        sr.config = {"backend": j.get("backend"), "mode": j.get("mode"), "threads": j.get("threads"),
                     "command": shlex.join(cmd)}
    if isinstance(j.get("samples_ms"), list) and j["samples_ms"]:
        sr.samples.extend(float(x) for x in j["samples_ms"])
    else:
        sr.latency_source = "round-summaries"
    sr.round_summaries.append({k: j.get(k) for k in (
        "iters", "p50_ms", "p90_ms", "p99_ms", "min_ms", "max_ms", "mean_ms", "stddev_ms")})
    rss = j.get("peak_rss_bytes")
    if rss is not None:
        sr.peak_rss_bytes = max(sr.peak_rss_bytes or 0, int(rss))
    # Kiln's steady window is its timed calls' peak (older kiln binaries: the whole run's).
    steady = j.get("steady_peak_device_bytes", j.get("peak_device_bytes"))
    if steady is not None:
        sr.peak_device_bytes = max(sr.peak_device_bytes or 0, int(steady))
    if j.get("steady_peak_device_bytes") is not None and j.get("peak_device_bytes") is not None:
        sr.setup_peak_device_bytes = max(sr.setup_peak_device_bytes or 0, int(j["peak_device_bytes"]))


def start_worker(sr, args, model, onnx, logdir, env):
    cmd = [python_exe(), os.path.abspath(__file__), "--worker", sr.name, model, "--serve",
           "--threads", str(args.threads), "--batch", str(args.batch), "--device", args.device,
           "--dtype", args.dtype]
    if onnx:
        cmd += ["--onnx", onnx["onnx"]]
        if onnx.get("inputs"):
            cmd += ["--inputs", onnx["inputs"]]
    if args.set:
        cmd += ["--set", args.set]
    wenv = dict(env)
    if SYSTEMS[sr.name].get("backend") == "kiln":
        # The Kiln package of --kiln-python, and a fresh, empty Kiln kernel cache per model: the
        # first call is a cold compile, as torch-compile's is with its fresh inductor cache.
        wenv["PYTHONPATH"] = os.pathsep.join(
            [args.kiln_python] + [p for p in [env.get("PYTHONPATH")] if p])
        wenv["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"kiln-cache-{sr.name}-", dir=logdir)
    elif SYSTEMS[sr.name].get("how") == "compile":
        # A fresh inductor cache per (model, system): the first call is a cold compile.
        wenv["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"inductor-{sr.name}-",
                                                           dir=logdir)
        if args.torch_freezing:
            wenv["TORCHINDUCTOR_FREEZING"] = "1"
    try:
        sr.proc = LineProcess(cmd, wenv, os.path.join(logdir, f"{sr.name}.log"))
        msg = sr.proc.readline(args.compile_budget)
    except Timeout:
        sr.fail("timeout", f"setup + first call exceeded --compile-budget {args.compile_budget:g} s")
        return
    except ChildError as e:
        sr.fail("error", str(e), e.detail)
        return
    if msg.get("event") != "ready":
        sr.fail(msg.get("status", "error"), msg.get("error", "unexpected reply"),
                msg.get("traceback"))
        return
    sr.first_call_s = msg["first_call_s"]
    sr.setup = {k: msg[k] for k in ("setup_s", "first_run_s", "first_call_s")}
    sr.config = msg.get("config", {})
    sr.peak_rss_bytes = msg.get("peak_rss_bytes")
    sr.setup_peak_device_bytes = msg.get("setup_peak_device_bytes")


def worker_round(sr, args, warmup, iters, seconds):
    try:
        sr.proc.send({"cmd": "run", "warmup": warmup, "iters": iters or 0,
                      "seconds": seconds or 0.0})
        msg = sr.proc.readline(args.compile_budget)
    except Timeout:
        sr.fail("timeout", f"a round exceeded --compile-budget {args.compile_budget:g} s")
        return
    except (ChildError, BrokenPipeError) as e:
        sr.fail("error", str(e), getattr(e, "detail", None))
        return
    if msg.get("event") != "round":
        sr.fail("error", msg.get("error", "unexpected reply"), msg.get("traceback"))
        return
    s = msg["samples_ms"]
    sr.samples.extend(s)
    sr.round_summaries.append({"iters": len(s), **{k: v for k, v in summarize(s).items()
                                                   if k != "n"}})
    sr.peak_rss_bytes = max(sr.peak_rss_bytes or 0, msg.get("peak_rss_bytes") or 0)


def stop_worker(sr):
    if sr.proc is None:
        return
    try:
        sr.proc.send({"cmd": "quit"})
        msg = sr.proc.readline(60)
        if msg.get("event") == "bye":
            sr.peak_rss_bytes = max(sr.peak_rss_bytes or 0, msg.get("peak_rss_bytes") or 0)
            if msg.get("peak_device_bytes") is not None:
                sr.peak_device_bytes = msg["peak_device_bytes"]
        sr.proc.wait()
    except (Timeout, ChildError, BrokenPipeError, OSError):
        sr.proc.kill()
    sr.proc = None


def export_onnx(args, model, onnx_dir, logdir, env):
    """The .onnx ORT runs: the target itself, or export_models.export(model)."""
    if model.endswith(".onnx"):
        return {"onnx": os.path.abspath(model), "inputs": None}
    cmd = [python_exe(), os.path.abspath(__file__), "--export", model, "--onnx-dir", onnx_dir,
           "--threads", str(args.threads), "--batch", str(args.batch)]
    if args.onnx_cache:
        cmd += ["--onnx-cache", args.onnx_cache]
    if args.set:
        cmd += ["--set", args.set]
    log = os.path.join(logdir, "export.log")
    try:
        j = run_json_process(cmd, env, args.compile_budget, log)
    except Timeout:
        return {"error": f"ONNX export exceeded --compile-budget {args.compile_budget:g} s"}
    except ChildError as e:
        with open(log, "rb") as f:
            err = f.read().decode(errors="replace")
        return {"error": f"ONNX export failed: {e}", "detail": err[-2000:]}
    if j.get("event") != "exported":
        return {"error": f"ONNX export failed: {j.get('error')}", "detail": j.get("traceback")}
    return j


def pool_summaries(rounds):
    """Kiln without per-call samples: pooled statistics from per-round summaries. mean and
    stddev are exact (pooled sums of squares); min/max exact; the percentiles are the
    iteration-weighted median of the rounds' percentiles (an estimate)."""
    n = sum(r["iters"] for r in rounds)
    mean = sum(r["mean_ms"] * r["iters"] for r in rounds) / n
    ss = sum((r["iters"] - 1) * r["stddev_ms"] ** 2 + r["iters"] * (r["mean_ms"] - mean) ** 2
             for r in rounds)

    def wmedian(key):
        pts = sorted((r[key], r["iters"]) for r in rounds)
        acc = 0
        for v, w in pts:
            acc += w
            if acc >= n / 2:
                return v
        return pts[-1][0]

    return {"n": n, "min_ms": min(r["min_ms"] for r in rounds), "p25_ms": None,
            "p50_ms": wmedian("p50_ms"), "p75_ms": None, "p90_ms": wmedian("p90_ms"),
            "p99_ms": wmedian("p99_ms"), "max_ms": max(r["max_ms"] for r in rounds),
            "mean_ms": mean, "stddev_ms": math.sqrt(ss / (n - 1)) if n > 1 else 0.0}


def cpu_busy_s():
    """Machine-wide busy CPU seconds (/proc/stat: user nice system irq softirq steal)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return (v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)) / os.sysconf(
            "SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def own_cpu_s():
    """CPU seconds of this process and its finished children (workers, kiln bench runs)."""
    import resource
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def run_model(args, model, systems, outdir, log):
    """Every system on one model; returns the model's record. Also measures how much CPU other
    processes on the machine used meanwhile (other_load_cores: machine-wide busy time minus this
    script's own, over wall time), which says how noisy the numbers are."""
    busy0, own0, wall0 = cpu_busy_s(), own_cpu_s(), time.monotonic()
    result = run_model_systems(args, model, systems, outdir, log)
    busy1, own1, wall1 = cpu_busy_s(), own_cpu_s(), time.monotonic()
    result["wall_s"] = wall1 - wall0
    if busy0 is not None and busy1 is not None and wall1 > wall0:
        result["other_load_cores"] = max(0.0, (busy1 - busy0) - (own1 - own0)) / (wall1 - wall0)
    return result


def run_model_systems(args, model, systems, outdir, log):
    label = os.path.basename(model) if model.endswith(".onnx") else model
    logdir = os.path.join(outdir, "logs", re.sub(r"[^A-Za-z0-9_.-]", "_", label))
    os.makedirs(logdir, exist_ok=True)
    env = thread_env(args.threads)
    runs = {s: SystemRun(s) for s in systems}
    result = {"model": label, "target": model, "batch": args.batch, "onnx": None}

    for s in systems:
        if s in ("torch-compile-max-autotune", "kiln-compiled-max-autotune") and \
                label not in args.max_autotune_models:
            runs[s].fail("skipped", "model not in --max-autotune-models (left out to save "
                         "time)")
        if SYSTEMS[s].get("how") == "compile" and label not in args.compile_models:
            runs[s].fail("skipped", "model not in --compile-models (left out to save time)")
        if SYSTEMS[s]["kind"] == "torch" and model.endswith(".onnx"):
            runs[s].fail("unsupported", "the PyTorch peers need a zoo model name, not an .onnx "
                         "file (there is no ONNX -> PyTorch import)")
    if args.set:
        result["set"] = args.set
        e = import_model_set().entry(model)
        result.update(group=e.group, note=e.note)
    # The .onnx for ORT (exported once, before anything is timed); with --set Kiln runs it too
    # (Note [Benchmark sets]).
    onnx = None
    kiln_target = model
    if any((SYSTEMS[s]["kind"] == "ort" or (args.set and SYSTEMS[s]["kind"] == "kiln"))
           and runs[s].alive for s in systems):
        log(f"[{label}] exporting ONNX")
        onnx = export_onnx(args, model, os.path.join(outdir, "inputs"), logdir, env)
        result["onnx"] = onnx
        if "error" in onnx:
            for s in systems:
                if SYSTEMS[s]["kind"] == "ort" or (args.set and SYSTEMS[s]["kind"] == "kiln"):
                    runs[s].fail("error", onnx["error"], onnx.get("detail"))
        elif args.set:
            kiln_target = onnx["onnx"]
            result["kiln_target"] = kiln_target
    # Setup, one system at a time.
    for s in systems:
        sr = runs[s]
        if not sr.alive or SYSTEMS[s]["kind"] == "kiln":
            continue
        log(f"[{label}] setting up {s}")
        start_worker(sr, args, model, onnx if SYSTEMS[s]["kind"] == "ort" else None, logdir, env)
        if sr.alive:
            log(f"[{label}]   {s}: first call {sr.first_call_s:.3f} s")
        else:
            log(f"[{label}]   {s}: {sr.status}: {sr.error}")
    # Alternating rounds; the order rotates each round.
    n_rounds, iters_per_round, secs = split_work(args)
    order = list(systems)
    try:
        for r in range(n_rounds):
            rot = order[r % len(order):] + order[:r % len(order)]
            for s in rot:
                sr = runs[s]
                if not sr.alive:
                    continue
                time.sleep(args.settle_ms / 1e3)  # let the previous system's threads go idle
                if SYSTEMS[s]["kind"] == "kiln":
                    kiln_round(sr, args, SYSTEMS[s], kiln_target, args.warmup,
                               iters_per_round[r], secs, logdir, env)
                else:
                    worker_round(sr, args, args.warmup, iters_per_round[r], secs)
                if not sr.alive:
                    log(f"[{label}]   {s}: {sr.status}: {sr.error}")
            log(f"[{label}] round {r + 1}/{n_rounds} done")
    finally:
        for sr in runs.values():
            stop_worker(sr)

    result["systems"] = {}
    for s in systems:
        sr = runs[s]
        rec = {"system": s, "status": sr.status, "error": sr.error,
               "error_detail": sr.error_detail, "first_call_s": sr.first_call_s,
               "setup": sr.setup, "config": sr.config, "peak_rss_bytes": sr.peak_rss_bytes,
               "peak_device_bytes": sr.peak_device_bytes,
               "setup_peak_device_bytes": sr.setup_peak_device_bytes,
               "latency_source": sr.latency_source,
               "rounds": sr.round_summaries}
        if sr.status == "ok" and not sr.round_summaries:
            rec.update(status="error", error="no timed calls recorded")
        if rec["status"] == "ok":
            rec["samples_ms"] = ([round(x, 6) for x in sr.samples]
                                 if sr.latency_source == "samples" else None)
            rec["round_p50_ms"] = [x["p50_ms"] for x in sr.round_summaries]
        if sr.kiln_json:
            rec["kiln_bench"] = sr.kiln_json[0]  # the cold first round, every field as printed
            rec["kiln_bench_rounds"] = sr.kiln_json[1:]
        result["systems"][s] = rec
    finalize_latency(result)
    return result


def finalize_latency(model):
    """Sets every ok system's `latency` (the statistics the tables show) by ONE method for all
    systems of the model, so that the comparison is fair:
      all-calls     percentiles over every timed call, when every system has per-call samples
                    (the normal case: `kiln bench --json` has `samples_ms`);
      round-pooled  otherwise (a kiln binary older than `samples_ms`): pool_summaries of the
                    per-round summaries, for every system alike, because a median of round
                    p99s is lower than the p99 of all calls and must not be set against one.
    Both are kept: latency_all_calls (where samples exist) and latency_round_pooled."""
    ok = [r for r in model["systems"].values() if r["status"] == "ok"]
    for r in ok:
        r["latency_all_calls"] = summarize(r["samples_ms"]) if r.get("samples_ms") else None
        r["latency_round_pooled"] = pool_summaries(r["rounds"])
    method = "all-calls" if all(r["latency_all_calls"] for r in ok) else "round-pooled"
    for r in ok:
        r["latency"] = r["latency_all_calls"] if method == "all-calls" else r[
            "latency_round_pooled"]
        r["latency_method"] = method
    model["latency_method"] = method


# ------------------------------------------------------------------------------------------
# Host, versions and the reports.

def host_info():
    h = {"cpu_model": platform.processor() or "unknown", "cores": os.cpu_count(), "isa": [],
         "mem_total_gib": None, "os": platform.platform(), "kernel": platform.release(),
         "python": platform.python_version(), "hostname": platform.node()}
    try:
        flags, model = "", ""
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags") and not flags:
                    flags = " " + line.split(":", 1)[1].strip() + " "
        h["cpu_model"] = model or h["cpu_model"]
        h["isa"] = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile")
                    if f" {f} " in flags]
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    h["mem_total_gib"] = round(int(line.split()[1]) / 2**20, 1)
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    h["os"] = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return h


def versions(kiln_path):
    v = {}
    for p in ("torch", "torchvision", "transformers", "onnx", "onnxruntime", "onnxscript", "numpy"):
        try:
            v[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            v[p] = None
    try:
        out = subprocess.run(["g++", "--version"], capture_output=True, text=True, timeout=10)
        v["g++"] = out.stdout.splitlines()[0] if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        v["g++"] = None
    try:
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        v["kiln_git"] = rev + ("+dirty" if dirty else "") if rev else None
    except (OSError, subprocess.SubprocessError):
        v["kiln_git"] = None
    v["kiln_binary"] = os.path.abspath(kiln_path)
    try:  # kiln_git is the tree's HEAD now; the binary may have been built earlier
        v["kiln_binary_built"] = datetime.datetime.fromtimestamp(
            os.path.getmtime(kiln_path)).astimezone().isoformat(timespec="seconds")
    except OSError:
        v["kiln_binary_built"] = None
    return v


# One number format for the Markdown tables and the HTML report (4 significant digits, never
# scientific): report_html.py next to this script owns it.
from report_html import fmt_ms  # noqa: E402


def short_error(text, limit=110):
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    line = line.replace("|", "/")
    return line if len(line) <= limit else line[:limit - 1] + "…"


def table_rows(model_result):
    """Rows for one model: (system, cells...), with the reference ratio."""
    systems = model_result["systems"]
    ref = systems.get(REFERENCE_SYSTEM)
    ref_p50 = ref["latency"]["p50_ms"] if ref and ref["status"] == "ok" else None
    rows = []
    for name, rec in systems.items():
        if rec["status"] != "ok":
            what = rec["status"] if rec["status"] in ("timeout", "skipped", "unsupported") \
                else "error"
            rows.append({"system": name, "status": rec["status"],
                         "cells": [f"{what}: {short_error(rec['error'])}"] + ["—"] * 5})
            continue
        lat = rec["latency"]
        p50, p99 = lat["p50_ms"], lat["p99_ms"]
        mark = " †" if rec.get("latency_method") == "round-pooled" else ""
        rss = rec["peak_rss_bytes"]
        rows.append({"system": name, "status": "ok", "cells": [
            fmt_ms(p50) + mark, fmt_ms(p99) + mark, f"{p99 / p50:.2f}" if p50 else "—",
            fmt_ms(rec["first_call_s"]) if rec["first_call_s"] is not None else "—",
            f"{rss / 2**20:.0f}" if rss else "—",
            f"{p50 / ref_p50:.2f}" if ref_p50 else "—"]})
    return rows


POOLED_NOTE = (
    "† p50 and p99 of every system are the iteration-weighted medians of its per-round p50 and "
    "p99: this kiln binary's `kiln bench --json` has no per-call times (`samples_ms`; rebuild "
    "Kiln to get them), so the peers are summarized the same way for a fair comparison (a round "
    "of n calls has its p99 at its ceil(0.99 n)-th fastest call, its maximum when n < 100). "
    "compare.json also holds the percentiles over all calls of every system that has them.")

def cuda_notes(model_result):
    """On CUDA: each ok system's peak device memory, and Kiln's device time (CUDA events) beside
    its host-observed p50."""
    peaks, device = [], []
    for name, rec in model_result["systems"].items():
        if rec["status"] != "ok":
            continue
        if rec.get("peak_device_bytes") is not None:
            setup = rec.get("setup_peak_device_bytes")
            peaks.append(f"{name} {rec['peak_device_bytes'] / 2**20:.1f}" +
                         (f" ({setup / 2**20:.1f})" if setup is not None else ""))
        kb = [x for x in [rec.get("kiln_bench")] + (rec.get("kiln_bench_rounds") or []) if x]
        if kb and kb[0].get("device") == "cuda" and kb[0].get("device_p50_ms") is not None:
            dp50 = percentile([x["device_p50_ms"] for x in kb if x.get("device_p50_ms")], 50)
            device.append(f"{name} {fmt_ms(dp50)} ms")
    out = []
    if peaks:
        out.append("Peak device memory in MiB over the warm-up and timed calls, and in brackets "
                   "over load, compile and the first call (Kiln: its caching allocator's peak, "
                   "torch: max_memory_allocated): " + ", ".join(peaks) + ".")
    if device:
        out.append("Device time per call (CUDA events, median of the rounds' p50; the table's "
                   "p50 is host-observed including synchronization): " + ", ".join(device) + ".")
    return out


TABLE_HEADER = ["system", "p50 ms", "p99 ms", "p99/p50", "first call s", "peak RSS MB",
                f"p50 / {REFERENCE_SYSTEM} p50"]


def markdown_tables(report):
    out, pooled = [], False
    for m in report["models"]:
        out.append(f"### {m['model']} (batch {m['batch']})\n")
        out.append("| " + " | ".join(TABLE_HEADER) + " |")
        out.append("|" + "---|" * len(TABLE_HEADER))
        for row in table_rows(m):
            out.append(f"| {row['system']} | " + " | ".join(row["cells"]) + " |")
        pooled |= m.get("latency_method") == "round-pooled"
        notes = []
        if m.get("target", "").endswith(".onnx"):
            notes.append(f"Kiln and ORT run the same file, `{m['target']}`.")
        elif m.get("onnx") and m["onnx"].get("onnx"):
            notes.append(f"ORT runs `{os.path.basename(m['onnx']['onnx'])}` from "
                         "scripts/export_models.py.")
        if m.get("other_load_cores") is not None:
            notes.append(f"Other processes used {m['other_load_cores']:.2f} cores on average "
                         f"during this model's {m['wall_s']:.0f} s.")
        notes += cuda_notes(m)
        if notes:
            out.append("\n" + " ".join(notes))
        out.append("")
    if pooled:
        out.append(POOLED_NOTE + "\n")
    return "\n".join(out)


def gpu_line(report):
    """"GPU: NVIDIA H200 (sm_90, 139.8 GiB), CUDA runtime 13.0, driver 13.0" from `kiln device
    --json` (and torch's view), or None."""
    c = report.get("cuda")
    if not c:
        return None
    kd = c.get("kiln_device") or {}
    devs = ", ".join(f"{d.get('name')} ({d.get('sm')}, {d.get('memory_bytes', 0) / 2**30:.1f} GiB)"
                     for d in kd.get("devices", []) if d.get("name"))
    parts = [devs or kd.get("status") or "?"]
    if kd.get("runtime_version"):
        parts.append(f"CUDA runtime {kd['runtime_version']}, driver {kd.get('driver_version')}")
    if c.get("torch"):
        parts.append(f"torch sees: {c['torch']}")
    return "GPU: " + "; ".join(parts) + "."


def header_lines(report):
    h, v, a = report["host"], report["versions"], report["settings"]
    work = f"{a['seconds']:g} s" if a["seconds"] else f"{a['iters']} timed calls"
    gpu = gpu_line(report)
    return [
        f"Measured {report['date']} with `{report['command']}`.",
        f"Host: {h['cpu_model']}, {h['cores']} cores ({', '.join(h['isa']) or 'no AVX2'}), "
        f"{h['mem_total_gib']} GiB, {h['os']}; load average {report['load_avg_start'][0]:.2f} "
        f"at the start, {report['load_avg_end'][0]:.2f} at the end.",
        f"Versions: Kiln {report.get('kiln_version') or '?'} (tree {v.get('kiln_git')}, binary "
        f"built {v.get('kiln_binary_built') or '?'}), torch "
        f"{v.get('torch')}, torchvision {v.get('torchvision')}, transformers "
        f"{v.get('transformers')}, onnx {v.get('onnx')}, onnxruntime {v.get('onnxruntime')}, "
        f"{v.get('g++')}, Python {h['python']}.",
        f"Each system: {work} per model in {a['rounds']} alternating rounds, {a['warmup']} "
        f"warm-up calls per round, {a['threads']} threads, batch {a['batch']}, "
        f"{a.get('dtype', 'f32')}, device {a['device']}.",
    ] + ([gpu] if gpu else [])


def markdown_report(report):
    return "\n".join(["# Kiln against its peers", ""] + [l + "  " for l in header_lines(report)]
                     + ["", markdown_tables(report)])


def import_rss_mb(report, kind):
    """Median peak RSS right after the imports, over the systems of one kind (torch, ort)."""
    v = [r["config"]["rss_after_imports_bytes"] for m in report["models"]
         for n, r in m["systems"].items()
         if SYSTEMS.get(n, {}).get("kind") == kind and r.get("config", {}).get(
             "rss_after_imports_bytes")]
    return percentile(v, 50) / 2**20 if v else None


def docs_region(report):
    torch_mb, ort_mb = import_rss_mb(report, "torch"), import_rss_mb(report, "ort")
    imports = ""
    if torch_mb or ort_mb:
        imports = " (the imports alone: " + ", ".join(
            f"{k} {v:.0f} MB" for k, v in (("torch", torch_mb), ("onnxruntime", ort_mb)) if v) + ")"
    lines = [DOCS_BEGIN, "## Kiln against its peers", "",
             "Produced by `bench/compare.py` (bench/README.md gives the method and the exact "
             "meaning of each column). Each system runs in its own process; the systems take "
             "turns in alternating rounds. `first call s` includes compiling: torch.compile's "
             "first call (empty inductor cache), TorchScript trace + freeze + first call, ORT "
             "session creation + first run, Kiln `compile()` + first call (median over the "
             "rounds, each a fresh `kiln bench` process). Peak RSS is each system's own process"
             f"{imports}. The last column is p50 divided by kiln-compiled's p50 (> 1: slower "
             "than Kiln).", ""]
    lines += [l + "  " for l in header_lines(report)]
    if report.get("notes"):
        lines += [""] + [f"- {n}" for n in report["notes"]]
    lines += ["", markdown_tables(report).rstrip(), DOCS_END]
    return "\n".join(lines) + "\n"


def update_docs(report, path, region=None, begin=DOCS_BEGIN, end=DOCS_END):
    """Replaces the region between `begin` and `end` in `path` (appended when both are absent)
    with `region` (default: the zoo's, docs_region(report))."""
    text = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
    region = region if region is not None else docs_region(report)
    b, e = text.find(begin), text.find(end)
    if b >= 0 and e > b:
        new = text[:b] + region.rstrip("\n") + text[e + len(end):]
    elif b < 0 and e < 0:
        new = text.rstrip("\n") + "\n\n" + region
    else:
        raise SystemExit(f"compare.py: error: {path} has only one of the markers "
                         f"{begin} / {end}; fix the file by hand")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(new)
    os.replace(tmp, path)


def auto_notes(report):
    """Notes every reader needs: what Kiln's "compiled" was, skipped systems, a busy machine."""
    notes, backends, skipped = [], {}, {}
    for m in report["models"]:
        for name, rec in m["systems"].items():
            kb = rec.get("kiln_bench")
            if kb:
                report.setdefault("kiln_version", kb.get("kiln_version"))
                backends.setdefault(name, set()).add(kb.get("backend"))
            if rec["status"] == "skipped":
                skipped.setdefault(name, []).append(m["model"])
    compiled = {n: "/".join(sorted(map(str, b))) for n, b in backends.items()
                if n != "kiln-eager"}
    if compiled:
        if len(set(compiled.values())) == 1:
            notes.append(f"{', '.join(compiled)} ran Kiln backend `{next(iter(compiled.values()))}` "
                         "(`kiln bench`'s `backend` field).")
        else:
            notes.append("Kiln backends (`kiln bench`'s `backend` field): " +
                         ", ".join(f"{n} `{b}`" for n, b in compiled.items()) + ".")
    for name, models in skipped.items():
        notes.append(f"{name} was not run on {', '.join(models)} (see the table for why).")
    busy = [(m["model"], m["other_load_cores"]) for m in report["models"]
            if m.get("other_load_cores") is not None and m["other_load_cores"] > 0.2]
    if busy:
        notes.append("Other work shared the machine (average cores used by other processes: " +
                     ", ".join(f"{n} {c:.1f}" for n, c in busy) + f" of {report['host']['cores']}"
                     "): those numbers are noisy; the alternating rounds spread the noise over "
                     "every system, so compare systems within one model.")
    return notes


# ------------------------------------------------------------------------------------------
# Benchmark sets (--set): the summary over the set.
#
# Note [Benchmark sets]
# `--set NAME` runs the models of bench/model_set.py's set NAME. Each is exported once by
# scripts/export_models.py (registered by model_set.register; cached in the sets' folder,
# <cache>/models/sets, stamped like the zoo's exports) and **Kiln and ORT run the same .onnx
# file**: Kiln with `kiln bench FILE.onnx` (Kiln's own random inputs of the file's input types:
# N(0, 1) floats, integers in [0, 10)), ORT with the model's example inputs from the .npz;
# latency does not depend on the values for these models (token ids, pillar cells and sampling
# grids change which memory is read, not how much work is done). The PyTorch peers run the
# torch module. A model that fails to export is a row on every system that needs the .onnx,
# with the exporter's error. The summary (compare.md, compare.html, and the docs region
# `<!-- compare-set:NAME:begin/end -->` with --update-docs) gives per model ORT p50 / Kiln p50
# (default mode, and max-autotune where it ran), p99/p50, and the geometric mean of ORT p50 /
# Kiln p50 over the models where both ran. `--threads 2,1` runs everything once per thread count
# (OUT/threads-N/) and writes OUT/summary.md/.html with one summary table per count.

def geomean(values):
    v = [x for x in values if x is not None and x > 0 and math.isfinite(x)]
    return (math.exp(sum(math.log(x) for x in v) / len(v)), len(v)) if v else (None, 0)


def _ok(m, system):
    r = m["systems"].get(system)
    return r if r and r["status"] == "ok" else None


def set_rows(report):
    """Per model: the numbers of the summary table, and the failures."""
    rows = []
    for m in report["models"]:
        kiln, ort = _ok(m, "kiln-compiled"), _ok(m, "ort")
        ma, te = _ok(m, "kiln-compiled-max-autotune"), _ok(m, "torch-eager")
        p50 = lambda r: r["latency"]["p50_ms"] if r else None  # noqa: E731
        tail = lambda r: r["latency"]["p99_ms"] / r["latency"]["p50_ms"] if r else None  # noqa
        row = {"model": m["model"], "group": m.get("group", ""), "kiln_p50": p50(kiln),
               "ort_p50": p50(ort), "ma_p50": p50(ma), "torch_eager_p50": p50(te),
               "kiln_tail": tail(kiln), "ma_tail": tail(ma), "ort_tail": tail(ort),
               "failures": []}
        row["ratio"] = row["ort_p50"] / row["kiln_p50"] if kiln and ort else None
        row["ma_ratio"] = row["ort_p50"] / row["ma_p50"] if ma and ort else None
        for name, r in m["systems"].items():
            if r["status"] not in ("ok", "skipped"):
                err = r.get("error") or ""
                detail = r.get("error_detail") or ""
                if err.endswith(":") and err in detail:
                    # kiln's message continues on the next lines (e.g. the unsupported ops)
                    err = err + " " + detail.split(err, 1)[1]
                row["failures"].append((name, r["status"], err))
        for name in ("torch-compile", "kiln-torch-compile"):
            r = _ok(m, name)
            row[name] = (r["first_call_s"], p50(r)) if r else None
        rows.append(row)
    return rows


def _fmt_ratio(x):
    return f"{x:.2f}" if x is not None else "—"


def set_tables(report):
    """The summary as plain tables: [(title, header, rows of cells)], and text lines."""
    rows = set_rows(report)
    systems = report["settings"]["systems"]
    has_ma = "kiln-compiled-max-autotune" in systems
    has_te = "torch-eager" in systems
    head = ["model", "group", "ORT p50 ms", "Kiln p50 ms", "ORT/Kiln"]
    if has_ma:
        head += ["Kiln max-autotune p50 ms", "ORT/Kiln max-autotune"]
    head += ["Kiln p99/p50", "ORT p99/p50"]
    if has_te:
        head += ["torch eager p50 ms"]
    head += ["notes"]
    body = []
    for r in rows:
        notes = "; ".join(f"{n} {st}" for n, st, _ in r["failures"])
        cells = [r["model"], r["group"], fmt_ms(r["ort_p50"]), fmt_ms(r["kiln_p50"]),
                 _fmt_ratio(r["ratio"])]
        if has_ma:
            cells += [fmt_ms(r["ma_p50"]), _fmt_ratio(r["ma_ratio"])]
        cells += [_fmt_ratio(r["kiln_tail"]), _fmt_ratio(r["ort_tail"])]
        if has_te:
            cells += [fmt_ms(r["torch_eager_p50"])]
        cells += [notes or ""]
        body.append(cells)
    tables = [("summary", head, body)]
    if any(n in systems for n in ("torch-compile", "kiln-torch-compile")):
        chead = ["model", "torch.compile (inductor) first call s", "p50 ms",
                 'torch.compile(backend="kiln") first call s', "p50 ms"]
        cbody = []
        for r in rows:
            if r["torch-compile"] is None and r["kiln-torch-compile"] is None:
                continue
            cells = [r["model"]]
            for name in ("torch-compile", "kiln-torch-compile"):
                v = r[name]
                cells += [fmt_ms(v[0]), fmt_ms(v[1])] if v else ["—", "—"]
            cbody.append(cells)
        if cbody:
            tables.append(("torch.compile: first call (cold caches) and p50", chead, cbody))
    lines = []
    g, n = geomean(r["ratio"] for r in rows)
    both = [r for r in rows if r["ratio"] is not None]
    lines.append(f"Geometric mean of ORT p50 / Kiln p50 (default mode): **{_fmt_ratio(g)}** over "
                 f"{n} of {len(rows)} models (> 1: Kiln faster).")
    if has_ma:
        gm, nm = geomean(r["ma_ratio"] for r in rows)
        gd, _ = geomean(r["ratio"] for r in rows if r["ma_ratio"] is not None)
        lines.append(f"Max-autotune: **{_fmt_ratio(gm)}** over the {nm} models where it ran "
                     f"(default mode on the same {nm}: {_fmt_ratio(gd)}).")
    tails = sorted(r["kiln_tail"] for r in both if r["kiln_tail"] is not None)
    otails = sorted(r["ort_tail"] for r in both if r["ort_tail"] is not None)
    if tails:
        lines.append(f"Kiln p99/p50: median {percentile(tails, 50):.2f}, worst {tails[-1]:.2f}; "
                     f"ORT: median {percentile(otails, 50):.2f}, worst {otails[-1]:.2f}.")
    behind = sorted((r for r in both if r["ratio"] < 1 / 1.1), key=lambda r: r["ratio"])
    if behind:
        lines.append(f"Kiln more than 10% behind ORT on {len(behind)} models: " + ", ".join(
            f"{r['model']} {r['ratio']:.2f}" for r in behind) + ".")
    fails = [(r["model"], n_, st, err) for r in rows for n_, st, err in r["failures"]]
    if fails:
        lines.append("Failures:")
        # Every line of the error (an importer lists the unsupported ops on the next lines).
        lines += [f"- {m}: {n_} {st}: " + short_error(" ".join(
            l.strip() for l in (err or "").splitlines() if l.strip()), 400)
            for m, n_, st, err in fails]
    return tables, lines


def md_table(head, body):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |" for cells in body]
    return "\n".join(out)


def set_markdown(report, level="##"):
    a = report["settings"]
    tables, lines = set_tables(report)
    out = [f"{level} Set `{a['set']}`: {len(report['models'])} models, {a['threads']} "
           f"thread{'s' if a['threads'] != 1 else ''}", ""]
    for title, head, body in tables:
        if title != "summary":
            out += ["", f"{level}# {title}", ""]
        out.append(md_table(head, body))
    out += [""] + lines
    return "\n".join(out) + "\n"


def set_html(report):
    import report_html  # noqa: E402
    esc = report_html.esc
    a = report["settings"]
    tables, lines = set_tables(report)
    out = [f"<h2>Set {esc(a['set'])}: {len(report['models'])} models, {a['threads']} "
           f"thread{'s' if a['threads'] != 1 else ''}</h2>"]
    for title, head, body in tables:
        if title != "summary":
            out.append(f"<h3>{esc(title)}</h3>")
        out.append("<table>")
        out.append("<tr>" + "".join(('<th class="sys">' if i == 0 else "<th>") + esc(h) + "</th>"
                                    for i, h in enumerate(head)) + "</tr>")
        for cells in body:
            out.append("<tr>" + "".join(
                (f'<td class="sys"><a href="#{esc(c)}">{esc(c)}</a></td>' if i == 0 and title ==
                 "summary" else ('<td class="sys">' if i in (0, 1) else "<td>") + esc(c) + "</td>")
                for i, c in enumerate(cells)) + "</tr>")
        out.append("</table>")
    items = [l for l in lines if l.startswith("- ")]
    for l in lines:
        if not l.startswith("- "):
            out.append("<p>" + esc(l.replace("**", "")) + "</p>")
    if items:
        out.append("<ul>" + "".join(f"<li>{esc(l[2:])}</li>" for l in items) + "</ul>")
    return "\n".join(out)


def set_docs_region(reports):
    """The docs region of a set: the header of the first run, and each run's summary."""
    name = reports[0]["settings"]["set"]
    first = reports[0]
    lines = [SET_DOCS_BEGIN.format(name=name), f"## Broad model set: `compare.py --set {name}`",
             "", "Produced by `bench/compare.py --set` (Note [Benchmark sets] in compare.py; the "
             "models are bench/model_set.py's). Kiln and ONNX Runtime run the same exported "
             ".onnx; ORT/Kiln > 1 means Kiln is faster. Per-model tables (every system, first "
             "call, peak RSS) and latency plots are in the run's compare.md / compare.html.", ""]
    lines += [l + "  " for l in header_lines(first)]
    notes = list(dict.fromkeys(n for r in reports for n in r.get("notes", [])))
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    for r in reports:
        lines += ["", set_markdown(r, level="###").rstrip()]
    lines.append(SET_DOCS_END.format(name=name))
    return "\n".join(lines) + "\n"


def write_set_summary(reports, out, docs=None):
    """OUT/summary.md and summary.html: the summaries of several runs of one set (one per
    thread count), and the docs region."""
    import report_html  # noqa: E402
    md = "# Kiln against its peers: set summary\n\n" + "\n".join(
        l + "  " for l in header_lines(reports[0])) + "\n\n" + "\n".join(
        set_markdown(r) + f"\nPer-model tables: `{os.path.relpath(r['out'], out)}/compare.md`.\n"
        for r in reports)
    write_atomic(os.path.join(out, "summary.md"), md)
    body = "\n".join(set_html(r) + f'<p class="note">Per-model tables and plots: <a href="'
                     f'{report_html.esc(os.path.relpath(r["out"], out))}/compare.html">'
                     f'{report_html.esc(os.path.relpath(r["out"], out))}/compare.html</a></p>'
                     for r in reports)
    write_atomic(os.path.join(out, "summary.html"), report_html.render_page(
        "Kiln against its peers: set summary", reports[0], body))
    if docs:
        name = reports[0]["settings"]["set"]
        update_docs(reports[0], docs, set_docs_region(reports),
                    SET_DOCS_BEGIN.format(name=name), SET_DOCS_END.format(name=name))
    print(md)


def write_reports(report, out, docs=None):
    sys.path.insert(0, HERE)
    import report_html  # noqa: E402
    is_set = bool(report["settings"].get("set"))
    md = markdown_report(report)
    if is_set:
        md = md.replace("\n\n", "\n\n" + set_markdown(report) + "\n", 1)
    write_atomic(os.path.join(out, "compare.md"), md)
    write_atomic(os.path.join(out, "compare.html"),
                 report_html.render(report, REFERENCE_SYSTEM, POOLED_NOTE,
                                    set_html(report) if is_set else ""))
    if docs and is_set:
        name = report["settings"]["set"]
        update_docs(report, docs, set_docs_region([report]), SET_DOCS_BEGIN.format(name=name),
                    SET_DOCS_END.format(name=name))
    elif docs:
        update_docs(report, docs)
    return md


def render_only(a):
    """--render COMPARE_JSON[,COMPARE_JSON...]: the reports of earlier runs, written next to
    each file; several runs of one set also give the combined summary next to the first."""
    paths = [p for p in a.render.split(",") if p.strip()]
    reports = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
        for m in report["models"]:
            finalize_latency(m)  # the current rules, also for files written by older versions
        report["out"] = os.path.dirname(os.path.abspath(path))
        reports.append(report)
    docs = a.docs if a.update_docs else None
    if len(reports) > 1:
        if not all(r["settings"].get("set") for r in reports):
            raise SystemExit("compare.py: error: --render takes several compare.json files only "
                             "for runs of a set (--set)")
        for r in reports:
            write_reports(r, r["out"])
        write_set_summary(reports, os.path.dirname(reports[0]["out"]), docs)
        return 0
    md = write_reports(reports[0], reports[0]["out"], docs)
    print(md)
    return 0


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------
# Command line.

def kiln_zoo(kiln):
    try:
        out = subprocess.run([kiln, "models", "--json"], capture_output=True, text=True,
                             timeout=60)
        if out.returncode == 0:
            return [m["name"] for m in json.loads(out.stdout)]
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        pass
    return []


def cuda_probe(kiln):
    """Whether any CUDA device is visible, to Kiln (`kiln device --json`) or to torch (in a
    subprocess: the parent never initializes CUDA). Returns {available, why, kiln_device,
    torch}; `why` gives both answers when neither sees a device."""
    res = {"available": False, "kiln_device": None, "torch": None}
    whys = []
    try:
        out = subprocess.run([kiln, "device", "--json"], capture_output=True, text=True,
                             timeout=120)
        kd = json.loads(out.stdout) if out.returncode == 0 else None
        if kd is None:
            whys.append(f"`{kiln} device --json` exited with {out.returncode}")
        else:
            res["kiln_device"] = kd
            res["available"] |= bool(kd.get("cuda_available"))
            whys.append(f"kiln device: {kd.get('status')}")
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        whys.append(f"cannot run `{kiln} device`: {error_text(e)} (build Kiln or pass --kiln)")
    code = ("import json, torch; print(json.dumps({'version': torch.__version__, 'cuda': "
            "torch.version.cuda, 'available': torch.cuda.is_available(), 'devices': "
            "[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if "
            "torch.cuda.is_available() else []}))")
    try:
        out = subprocess.run([python_exe(), "-c", code], capture_output=True, text=True,
                             timeout=300)
        if out.returncode == 0:
            t = json.loads(out.stdout.strip().splitlines()[-1])
            res["available"] |= bool(t["available"])
            res["torch"] = (f"torch {t['version']} (CUDA {t['cuda']}): " +
                            (", ".join(t["devices"]) if t["available"]
                             else "torch.cuda.is_available() is False"))
        else:
            err = [l for l in out.stderr.strip().splitlines() if l.strip()]
            res["torch"] = f"torch not usable: {err[-1] if err else out.returncode}"
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, IndexError) as e:
        res["torch"] = f"torch probe failed: {error_text(e)}"
    whys.append(res["torch"])
    res["why"] = "; ".join(whys)
    return res


def export_model_names():
    try:
        return list(import_export_models().MODELS), None
    except Exception as e:  # reported when a model is unknown
        return [], error_text(e)


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="compare.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=None,
                    help="comma-separated zoo model names and/or .onnx paths "
                         f"(default {','.join(DEFAULT_MODELS)}; with --set: the set's models, "
                         "or a subset of them)")
    ap.add_argument("--set", default=None,
                    help="a benchmark set of bench/model_set.py (broad, smoke): its models, "
                         "exported to the sets' cache; Kiln and ORT run the same .onnx and a "
                         "summary table with geometric means is added (Note [Benchmark sets])")
    ap.add_argument("--systems", default=None,
                    help="comma-separated, of: " + ", ".join(SYSTEMS) + " (default: all but "
                         "the CPU's torch reduce-overhead; with --set: "
                         f"{','.join(DEFAULT_SET_SYSTEMS)})")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dtype", choices=["f32", "bf16", "f16"], default="f32",
                    help="precision of float32 models (default f32): Kiln compiles them with "
                         "`--dtype` (autocast: matmul/conv/attention low, norms and softmax in "
                         "float32); the PyTorch peers run the model converted with module.to() "
                         "and its floating inputs cast (ORT: f32 only)")
    ap.add_argument("--threads", default="2",
                    help="threads for every system (default 2); a comma-separated list (2,1) "
                         "runs everything once per count into OUT/threads-N and writes a "
                         "combined summary")
    work = ap.add_mutually_exclusive_group()
    work.add_argument("--iters", type=int, default=None,
                      help="timed calls per system and model, split over the rounds (default 100)")
    work.add_argument("--seconds", type=float, default=None,
                      help="timed seconds per system and model, split over the rounds")
    ap.add_argument("--rounds", type=int, default=10, help="alternating rounds (default 10)")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up calls per round (default 3)")
    ap.add_argument("--compile-budget", type=float, default=1800.0,
                    help="seconds allowed for one system's setup + first call (and for each "
                         "round); past it the system is recorded as timeout (default 1800)")
    ap.add_argument("--max-autotune-models", default=",".join(DEFAULT_MAX_AUTOTUNE_MODELS),
                    help="models on which torch-compile-max-autotune runs (default "
                         f"{','.join(DEFAULT_MAX_AUTOTUNE_MODELS)}; 'all' for every model)")
    ap.add_argument("--compile-models", default="all",
                    help="models on which torch-compile* and kiln-torch-compile run (default "
                         "all); elsewhere they are reported as skipped")
    ap.add_argument("--kiln-python", default=None,
                    help="folder holding the Kiln Python package for kiln-torch-compile "
                         "(default: <folder of --kiln>/python, as the build assembles it)")
    ap.add_argument("--torch-freezing", action="store_true",
                    help="torch.compile with inductor freezing (TORCHINDUCTOR_FREEZING=1: "
                         "constant-folded, oneDNN-prepacked weights; PyTorch's CPU inference "
                         "recipe). Default: off, torch.compile as it comes")
    ap.add_argument("--render", metavar="COMPARE_JSON",
                    help="write compare.md/.html (and with --update-docs the docs region) from "
                         "an earlier run's compare.json, without measuring; for a set, several "
                         "comma-separated compare.json files (one per thread count) give the "
                         "combined summary, written next to the first")
    ap.add_argument("--settle-ms", type=float, default=50.0,
                    help="pause before each system's turn (default 50 ms)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"),
                    help="the kiln binary (default build/kiln)")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "compare"),
                    help="output folder (default build/compare)")
    ap.add_argument("--onnx-cache", default=None,
                    help="where scripts/export_models.py keeps its .onnx exports (default: its "
                         "own, ~/.cache/kiln/models); a current export is reused")
    ap.add_argument("--update-docs", action="store_true",
                    help="rewrite the compare region of docs/benchmarks.md")
    ap.add_argument("--docs", default=os.path.join(ROOT, "docs", "benchmarks.md"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--note", action="append", default=[],
                    help="a line added to the report's notes (repeatable)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    # Internal modes.
    ap.add_argument("--worker", nargs=2, metavar=("SYSTEM", "MODEL"),
                    help="run one system on one model in this process and print JSON")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--onnx", help=argparse.SUPPRESS)
    ap.add_argument("--inputs", help=argparse.SUPPRESS)
    ap.add_argument("--export", metavar="MODEL", help=argparse.SUPPRESS)
    ap.add_argument("--onnx-dir", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.batch < 1:
        ap.error(f"--batch expected >= 1, found {a.batch}")
    try:
        a.threads_list = [int(t) for t in str(a.threads).split(",") if t.strip()]
    except ValueError:
        ap.error(f"--threads expected integers >= 1 (e.g. 2 or 2,1), found {a.threads}")
    if not a.threads_list or min(a.threads_list) < 1:
        ap.error(f"--threads expected integers >= 1 (e.g. 2 or 2,1), found {a.threads}")
    if len(a.threads_list) > 1 and (a.worker or a.export):
        ap.error("--worker/--export take one --threads value")
    a.threads = a.threads_list[0]
    if a.kiln_python is None:
        a.kiln_python = os.path.join(os.path.dirname(os.path.abspath(a.kiln)), "python")
    if a.iters is not None and a.iters < 1:
        ap.error(f"--iters expected >= 1, found {a.iters}")
    if a.seconds is not None and not (a.seconds > 0 and math.isfinite(a.seconds)):
        ap.error(f"--seconds expected a finite number > 0, found {a.seconds}")
    if a.rounds < 1 or a.warmup < 0 or a.compile_budget <= 0:
        ap.error("--rounds expected >= 1, --warmup >= 0, --compile-budget > 0")
    if a.worker and a.worker[0] not in SYSTEMS:
        ap.error(f"unknown system '{a.worker[0]}' (known: {', '.join(SYSTEMS)})")
    if a.worker and SYSTEMS[a.worker[0]]["kind"] == "kiln":
        ap.error("--worker runs the PyTorch/ORT systems; Kiln runs as `kiln bench`")
    if a.iters is None and a.seconds is None:
        a.iters = 100
    return ap, a


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap, a = parse_args(argv)
    if a.worker:
        return worker_main(a)
    if a.export:
        return export_main(a)
    if a.render:
        return render_only(a)

    if a.systems is None:
        a.systems = ",".join(DEFAULT_SET_SYSTEMS if a.set else SYSTEMS)
    systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    bad = [s for s in systems if s not in SYSTEMS]
    if bad or not systems:
        ap.error(f"unknown system '{bad[0] if bad else ''}' (known: {', '.join(SYSTEMS)})")
    systems = list(dict.fromkeys(systems))
    if a.systems == ",".join(SYSTEMS) and a.device != "cuda":
        # The default list on the CPU: reduce-overhead's CUDA graphs do not exist there, so
        # torch's reduce-overhead column would only repeat torch-compile (name it to run it).
        systems.remove("torch-compile-reduce-overhead")
    if a.set:
        try:
            set_list = import_model_set().set_models(a.set)
        except ValueError as e:
            ap.error(str(e))
        if a.models is None:
            a.models = ",".join(set_list)
        if a.onnx_cache is None:
            a.onnx_cache = import_model_set().set_out_dir(import_export_models())
    models = [m.strip() for m in (a.models or ",".join(DEFAULT_MODELS)).split(",") if m.strip()]
    if not models:
        ap.error("--models is empty")
    if a.set:
        outside = [m for m in models if m not in set_list]
        if outside:
            ap.error(f"model '{outside[0]}' is not in set '{a.set}' (its models: "
                     f"{', '.join(set_list)})")
    zoo = kiln_zoo(a.kiln)
    peers, peer_err = export_model_names()
    known = list(dict.fromkeys(zoo + peers + (set_list if a.set else [])))
    for m in models:
        if m.endswith(".onnx"):
            if not os.path.isfile(m):
                ap.error(f"no such ONNX file '{m}'")
        elif m not in known:
            why = ""
            if not zoo:
                why += f"; {a.kiln} is missing or failed (`kiln models`)"
            if peer_err:
                why += f"; scripts/export_models.py: {peer_err}"
            ap.error(f"unknown model '{m}' (known: {', '.join(known) or 'none'}{why})")
    a.max_autotune_models = (known + [os.path.basename(m) for m in models]
                             if a.max_autotune_models.strip() == "all"
                             else [x.strip() for x in a.max_autotune_models.split(",")])
    a.compile_models = (known + [os.path.basename(m) for m in models]
                        if a.compile_models.strip() == "all"
                        else [x.strip() for x in a.compile_models.split(",")])

    cuda = None
    if a.device == "cuda":
        cuda = cuda_probe(a.kiln)
        if not cuda["available"]:
            print(f"compare.py: error: --device cuda: no usable CUDA device ({cuda['why']}); run "
                  "on a machine with a GPU or use --device cpu", file=sys.stderr)
            return 2

    log = (lambda msg: None) if a.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    base_out = a.out
    reports = []
    for threads in a.threads_list:
        a.threads = threads
        a.out = base_out if len(a.threads_list) == 1 else os.path.join(base_out,
                                                                       f"threads-{threads}")
        if len(a.threads_list) > 1:
            log(f"=== {threads} thread(s): {a.out}")
        reports.append(measure(a, argv, models, systems, cuda, log))
    a.out = base_out
    docs = a.docs if a.update_docs else None
    if a.set and len(reports) > 1:
        write_set_summary(reports, base_out, docs)
        log(f"wrote {os.path.join(base_out, 'summary.md')}, summary.html")
    elif docs:
        # One run: its docs region (the set's own region for a set). Several runs of no set:
        # the first one's.
        write_reports(reports[0], reports[0]["out"], docs)
    if docs:
        log(f"updated {a.docs}")
    return 0


def measure(a, argv, models, systems, cuda, log):
    """Every model with every system at a.threads into a.out; returns the report (also written
    as compare.json/.md/.html there)."""
    os.makedirs(a.out, exist_ok=True)
    report = {
        "command": shlex.join(["python3", os.path.relpath(os.path.abspath(__file__), ROOT)] + argv),
        "argv": argv, "cwd": os.getcwd(), "out": a.out,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": host_info(), "versions": versions(a.kiln), "load_avg_start": os.getloadavg(),
        "settings": {"models": models, "systems": systems, "batch": a.batch, "dtype": a.dtype,
                     "threads": a.threads,
                     "iters": a.iters, "seconds": a.seconds, "rounds": a.rounds,
                     "warmup": a.warmup, "compile_budget_s": a.compile_budget,
                     "max_autotune_models": a.max_autotune_models,
                     "compile_models": a.compile_models, "device": a.device,
                     "kiln": a.kiln, "kiln_python": a.kiln_python, "settle_ms": a.settle_ms,
                     "torch_freezing": a.torch_freezing, "set": a.set},
        "notes": list(a.note), "models": [],
    }
    if cuda:
        report["cuda"] = cuda
    t0 = time.time()
    for m in models:
        report["models"].append(run_model(a, m, systems, a.out, log))
        # Partial results survive an interrupted run.
        write_atomic(os.path.join(a.out, "compare.json"), json.dumps(report, indent=1))
    report["load_avg_end"] = os.getloadavg()
    report["wall_s"] = time.time() - t0
    report["notes"] += auto_notes(report)

    write_atomic(os.path.join(a.out, "compare.json"), json.dumps(report, indent=1))
    md = write_reports(report, a.out)
    print(md)
    log(f"wrote {os.path.join(a.out, 'compare.json')}, compare.md, compare.html "
        f"({report['wall_s']:.0f} s)")
    return report


if __name__ == "__main__":
    sys.exit(main())
